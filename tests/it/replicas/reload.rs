//! A config reload on one replica: one config generation in force on
//! every replica, and each says whether its own file differs.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Replica, config_file};
use crate::support::fresh_postgres_database;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_on_one_replica_puts_one_config_generation_in_force_on_every_replica() {
    let dir = tempfile::tempdir().expect("tempdir");
    let database = fresh_postgres_database().await;
    let url = database.url.clone();
    let base = std::fs::read_to_string(config_file(dir.path())).expect("config");
    let (f0, f1) = (dir.path().join("r0.toml"), dir.path().join("r1.toml"));
    std::fs::write(&f0, &base).expect("r0.toml");
    std::fs::write(&f1, &base).expect("r1.toml");
    let r0 = Replica::start("r0", &url, &f0, dir.path()).await;
    let r1 = Replica::start("r1", &url, &f1, dir.path()).await;
    let config = |r: &Replica| {
        let endpoint = r.endpoint.clone();
        async move {
            let z: Value = reqwest::get(format!("{endpoint}/readyz"))
                .await
                .expect("readyz")
                .json()
                .await
                .expect("json");
            z["config"].clone()
        }
    };
    let first = config(&r0).await;
    assert_eq!(config(&r1).await["generation"], first["generation"]);
    // r1's file changes and r1 reloads it: r0 applies the same generation,
    // and says its own file differs.
    let changed = format!("{base}[provisioning]\ndefault_allocation_timeout = \"20m\"\n");
    std::fs::write(&f1, &changed).expect("r1.toml");
    let http = reqwest::Client::new();
    let reload = |r: &Replica| {
        let (http, endpoint) = (http.clone(), r.endpoint.clone());
        async move {
            let resp = http
                .post(format!("{endpoint}/v1/config:reload"))
                .send()
                .await
                .expect("reload");
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.expect("json");
            assert_eq!(status, 200, "{body:#}");
            body
        }
    };
    let answer = reload(&r1).await;
    let generation = answer["generation"].as_i64().expect("generation");
    assert!(
        Some(generation) > first["generation"].as_i64(),
        "{answer:#}"
    );
    let t = Instant::now();
    let on_r0 = loop {
        let c = config(&r0).await;
        if c["generation"] == generation {
            break c;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "r0 never applied it: {c:#}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(on_r0["digest"], config(&r1).await["digest"]);
    assert!(
        on_r0["fileDiffers"]
            .as_str()
            .is_some_and(|w| w.contains("differs") && w.contains("r1")),
        "{on_r0:#}"
    );
    let metrics = reqwest::get(format!("{}/metrics", r0.metrics))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    assert!(metrics.contains("flexq_config_file_differs 1"), "{metrics}");
    assert!(metrics.contains(&format!("flexq_config_generation {generation}")));
    // A create through r0 gets the new default.
    assert_eq!(
        r0.create("after-reload", &crate::reload::default_timeout_batch())
            .await,
        200
    );
    let b: Value = reqwest::get(format!(
        "{}/v1/projects/demo/locations/us-central1/batches/after-reload",
        r0.endpoint
    ))
    .await
    .expect("get")
    .json()
    .await
    .expect("json");
    assert_eq!(crate::reload::timeout_of(&b), 20 * 60);
    // r0's file made the same and reloaded: no new generation, and r0 no
    // longer says its file differs.
    std::fs::write(&f0, &changed).expect("r0.toml");
    let again = reload(&r0).await;
    assert_eq!(again["generation"], generation, "{again:#}");
    assert!(config(&r0).await.get("fileDiffers").is_none());
}
