//! The usage report: its totals are the sum over the batches' own usage
//! and the GPU-seconds counter agrees, it survives a restart (it is read
//! from the stored allocations), and bad windows are refused by name.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::{ServerProcess, flex_batch, flexq_bin};

fn millis(v: &Value) -> u64 {
    v.as_str()
        .unwrap_or_else(|| panic!("an int64 string: {v}"))
        .parse()
        .expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_report_sums_the_batches_and_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = ServerProcess::start(dir.path()).await;
    let http = reqwest::Client::new();
    // The default config's two virtual L4 nodes hold both at once.
    for id in ["used-one", "used-two"] {
        assert_eq!(server.create(id, &flex_batch()).await, 200);
    }
    for id in ["used-one", "used-two"] {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while server.batch(id).await["flexq"]["provisioningState"] != "PROVISIONED" {
            assert!(std::time::Instant::now() < deadline, "{id} not allocated");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut used = 0;
    for id in ["used-one", "used-two"] {
        let operation = server.batch(id).await["operation"]
            .as_str()
            .expect("operation")
            .to_string();
        let r = http
            .post(format!("{}/v1/{operation}:cancel", server.endpoint))
            .send()
            .await
            .expect("cancel");
        assert_eq!(r.status(), 200);
        let b = server.batch(id).await;
        assert_eq!(b["state"], "CANCELLED", "{b:#}");
        used += millis(&b["runtimeInfo"]["approximateUsage"]["milliAcceleratorSeconds"]);
    }
    assert!(used >= 2 * 3 * 300, "{used}");

    let report = |server: &ServerProcess, project: &'static str| {
        let url = format!(
            "{}/v1/projects/{project}/regions/us-central1/usage",
            server.endpoint
        );
        async move {
            reqwest::get(url)
                .await
                .expect("usage")
                .json::<Value>()
                .await
                .expect("json")
        }
    };
    let r = report(&server, "demo").await;
    let rows = r["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{r:#}");
    assert_eq!(rows[0]["project"], "demo");
    assert_eq!(rows[0]["acceleratorType"], "l4");
    assert_eq!(millis(&rows[0]["milliAcceleratorSeconds"]), used, "{r:#}");
    assert_eq!(rows[0]["batches"], 2);
    assert_eq!(rows[0]["allocated"], 2);
    assert_eq!(rows[0]["expired"], 0);
    assert!(rows[0]["waitP95Seconds"].as_f64().is_some(), "{r:#}");
    assert_eq!(millis(&r["total"]["milliAcceleratorSeconds"]), used);
    // Every project (an admin: here the anonymous one on loopback).
    let every = report(&server, "-").await;
    assert_eq!(millis(&every["total"]["milliAcceleratorSeconds"]), used);

    // The counter of GPU-seconds, counted at each release.
    let metrics = reqwest::get(format!("{}/metrics", server.metrics_endpoint))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    let counted: f64 = metrics
        .lines()
        .find(|l| {
            l.starts_with("flexq_project_gpu_seconds_total{")
                && l.contains(r#"project="demo""#)
                && l.contains(r#"accelerator="l4""#)
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no GPU-seconds of demo in\n{metrics}"));
    let reported = used as f64 / 1000.0;
    assert!(
        (counted - reported).abs() <= 0.05 * reported + 0.1,
        "counted {counted} GPU-seconds, the batches say {reported}"
    );

    // From the stored allocations: the same after a SIGKILL.
    server.kill9();
    let server = ServerProcess::start(dir.path()).await;
    let after = report(&server, "demo").await;
    assert_eq!(after["rows"], r["rows"], "{after:#}");

    // Bad windows are named.
    for (query, field) in [
        ("startTime=yesterday", "startTime"),
        ("endTime=2026-13-01T00:00:00Z", "endTime"),
        (
            "startTime=2026-12-02T00:00:00Z&endTime=2026-12-01T00:00:00Z",
            "startTime",
        ),
        ("since=1", "since"),
    ] {
        let resp = reqwest::get(format!(
            "{}/v1/projects/demo/regions/us-central1/usage?{query}",
            server.endpoint
        ))
        .await
        .expect("usage");
        assert_eq!(resp.status(), 400, "{query}");
        let body: Value = resp.json().await.expect("json");
        assert!(body.to_string().contains(field), "{query}: {body}");
    }

    // The table of `flexq usage`.
    let out = Command::new(flexq_bin())
        .args(["usage", "--endpoint", &server.endpoint, "--project", "demo"])
        .args(["--region", "us-central1"])
        .output()
        .expect("flexq usage");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table.contains("GPU-HOURS") && table.contains("demo") && table.contains("l4"),
        "{table}"
    );
}
