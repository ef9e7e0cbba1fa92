//! What a follower serves and what the leader it forwards to, or becomes,
//! does with it: a release counted once, the fair share order after a
//! failover, a watch that goes on across one, a hold and a cordon made on
//! a follower.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Pair, Replica, config_file, gpu_batch, leader_and_follower, leads_within};

/// The GPU-seconds counter over two replicas: a cancel served by the
/// follower releases the cluster; the leader, whose core sees every
/// release, counts it once, the follower not at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_counted_once_across_replicas() {
    let Pair {
        leader: r0,
        follower: r1,
        guards: _guards,
    } = leader_and_follower(config_file).await;
    let http = reqwest::Client::new();
    let batch = format!(
        "{}/v1/projects/demo/locations/us-central1/batches/counted-once",
        r1.endpoint
    );
    assert_eq!(r1.create("counted-once", &gpu_batch(2, "600s")).await, 200);
    let get = || async {
        http.get(&batch)
            .send()
            .await
            .expect("get")
            .json::<Value>()
            .await
            .expect("json")
    };
    let t = Instant::now();
    while get().await["flexq"]["provisioningState"] != "PROVISIONED" {
        assert!(t.elapsed() < Duration::from_secs(20), "never allocated");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let operation = get().await["operation"]
        .as_str()
        .expect("operation")
        .to_string();
    let r = http
        .post(format!("{}/v1/{operation}:cancel", r1.endpoint))
        .send()
        .await
        .expect("cancel");
    assert_eq!(r.status(), 200);
    let ended = get().await;
    assert_eq!(ended["state"], "CANCELLED", "{ended:#}");
    let used: f64 = ended["runtimeInfo"]["approximateUsage"]["milliAcceleratorSeconds"]
        .as_str()
        .expect("usage")
        .parse::<f64>()
        .expect("number")
        / 1000.0;
    let counted = |metrics: String| {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("flexq_project_gpu_seconds_total{") && l.contains(r#"project="demo""#)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let scrape = |r: &Replica| {
        let url = format!("{}/metrics", r.metrics);
        async move {
            reqwest::get(url)
                .await
                .expect("scrape")
                .text()
                .await
                .expect("text")
        }
    };
    // The leader hears the follower's release within its change stream.
    let t = Instant::now();
    let mut on_leader = 0.0;
    while on_leader == 0.0 && t.elapsed() < Duration::from_secs(10) {
        on_leader = counted(scrape(&r0).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let on_follower = counted(scrape(&r1).await);
    assert_eq!(on_follower, 0.0, "a follower counts nothing");
    assert!(
        (on_leader - used).abs() <= 0.1 * used + 0.2,
        "the leader counted {on_leader} GPU-seconds, the batch says {used}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fair_share_order_is_the_same_after_a_failover() {
    let Pair {
        leader: mut r0,
        follower: r1,
        guards: _guards,
    } = leader_and_follower(crate::fairshare::config).await;
    crate::fairshare::heavy_then_light(&r0.endpoint).await;
    // The leader dies; r1 takes over and rebuilds its core, usage
    // included, from the database.
    r0.kill9();
    leads_within(&r1, Duration::from_secs(20)).await;
    crate::fairshare::light_goes_first(&r1.endpoint).await;
    crate::fairshare::light_gets_the_node(&r1.endpoint).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_follower_goes_on_across_a_leader_failover() {
    use crate::watch::Sse;
    let Pair {
        leader: mut r0,
        follower: r1,
        guards: _guards,
    } = leader_and_follower(config_file).await;
    let batches = format!(
        "{}/v1/projects/demo/locations/us-central1/batches",
        r1.endpoint
    );
    let mut sse = Sse::open(&format!("{batches}:watch"), None).await;
    assert_eq!(
        sse.next(Duration::from_secs(5)).await.expect("ready").event,
        "ready"
    );
    let http = reqwest::Client::new();
    let create = |id: &'static str| {
        let (http, batches) = (http.clone(), batches.clone());
        async move {
            let r = http
                .post(format!("{batches}?batchId={id}"))
                .json(&gpu_batch(2, "600s"))
                .send()
                .await
                .expect("create");
            assert_eq!(r.status(), 200, "{id}");
        }
    };
    // Until the watch shows batch `id` with `provisioning` (and `state`).
    async fn until(sse: &mut Sse, id: &str, provisioning: &str, state: &str) {
        let t = Instant::now();
        loop {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "{id} never {provisioning}/{state}"
            );
            let Some(e) = sse.next(Duration::from_secs(20)).await else {
                panic!("the watch ended waiting for {id}");
            };
            let b = &e.data["batch"];
            if e.event == "batch"
                && b["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(&format!("/{id}")))
                && b["flexq"]["provisioningState"] == provisioning
                && b["state"] == state
            {
                return;
            }
        }
    }
    create("before-failover").await;
    until(&mut sse, "before-failover", "PROVISIONED", "PENDING").await;
    // The leader dies; r1 takes over. The same stream goes on.
    r0.kill9();
    leads_within(&r1, Duration::from_secs(20)).await;
    create("after-failover").await;
    until(&mut sse, "after-failover", "PROVISIONED", "PENDING").await;
    let b: Value = http
        .get(format!("{batches}/before-failover"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let op = b["operation"].as_str().expect("op");
    let r = http
        .post(format!("{}/v1/{op}:cancel", r1.endpoint))
        .send()
        .await
        .expect("cancel");
    assert_eq!(r.status(), 200);
    until(&mut sse, "before-failover", "RELEASED", "CANCELLED").await;
}

/// A hold and a cordon made through a follower reach the leader, which
/// alone allocates: it says why the batch waits, shows the nodes
/// cordoned, and allocates only once both are lifted, again through the
/// follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_and_a_cordon_made_on_a_follower_reach_the_leader() {
    let Pair {
        leader,
        follower,
        guards: _guards,
    } = leader_and_follower(config_file).await;
    let http = reqwest::Client::new();
    let post = |replica: &Replica, path: &str| {
        let request = http.post(format!("{}{path}", replica.endpoint));
        async move {
            let r = request.send().await.expect("post");
            let status = r.status();
            let body: Value = r.json().await.unwrap_or_default();
            assert!(status.is_success(), "{status}: {body:#}");
        }
    };
    let get = |replica: &Replica, path: &str| {
        let request = http.get(format!("{}{path}", replica.endpoint));
        async move {
            request
                .send()
                .await
                .expect("get")
                .json::<Value>()
                .await
                .expect("json")
        }
    };
    let batch = "/v1/projects/demo/locations/us-central1/batches/behind-a-hold";
    let until = |what: &'static str, done: fn(&Value) -> bool, path: &'static str| {
        let leader = &leader;
        async move {
            let t = Instant::now();
            loop {
                let v = get(leader, path).await;
                if done(&v) {
                    return v;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(15),
                    "the leader never {what}: {v:#}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };

    post(
        &follower,
        "/v1/projects/demo/regions/us-central1/queue:hold",
    )
    .await;
    assert_eq!(
        follower
            .create("behind-a-hold", &gpu_batch(2, "600s"))
            .await,
        200
    );
    until(
        "said the batch waits on the hold",
        |b| {
            b["flexq"]["notAdmittedReasons"]
                .as_array()
                .is_some_and(|r| {
                    r.iter()
                        .any(|r| r.as_str().is_some_and(|r| r.contains("held by an admin")))
                })
        },
        batch,
    )
    .await;

    let nodes = get(&leader, "/v1/nodes").await;
    let ids: Vec<String> = nodes["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["id"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(ids.len(), 4, "{nodes:#}");
    for id in &ids {
        post(
            &follower,
            &format!("/v1/nodes/{}:cordon", id.replace('/', "%2F")),
        )
        .await;
    }
    until(
        "showed every node cordoned",
        |n| {
            n["nodes"]
                .as_array()
                .is_some_and(|n| n.iter().all(|n| n["state"] == "CORDONED"))
        },
        "/v1/nodes",
    )
    .await;
    // The hold lifted, every node still cordoned: nothing may be placed.
    post(
        &follower,
        "/v1/projects/demo/regions/us-central1/queue:resume",
    )
    .await;
    until(
        "saw the hold lifted",
        |b| {
            b["flexq"]["notAdmittedReasons"].as_array().is_none_or(|r| {
                !r.iter()
                    .any(|r| r.as_str().is_some_and(|r| r.contains("held by an admin")))
            })
        },
        batch,
    )
    .await;
    let b = get(&leader, batch).await;
    assert_eq!(
        b["flexq"]["provisioningState"], "QUEUED",
        "placed on a cordoned node: {b:#}"
    );
    for id in &ids {
        post(
            &follower,
            &format!("/v1/nodes/{}:uncordon", id.replace('/', "%2F")),
        )
        .await;
    }
    until(
        "allocated the batch",
        |b| b["flexq"]["provisioningState"] == "PROVISIONED",
        batch,
    )
    .await;
}
