//! Elastic batches across replicas (docs/rules.md#elastic-batches), on
//! PostgreSQL. The agent is a FAKE (these machines have no GPUs): it
//! speaks the agent protocol as the real one does, to a follower.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Pair, Replica, leader_and_follower, leads_within};
use crate::elastic::{
    assignments, count, elastic_batch, executors, extras_running, register, report,
};
use crate::support::{provisioned, state_messages};

/// Batch `id` as `r` answers it, once `pred` holds; fails after 20 s.
async fn until(r: &Replica, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let url = format!(
        "{}/v1/projects/demo/locations/us-central1/batches/{id}",
        r.endpoint
    );
    let t = Instant::now();
    loop {
        let b: Value = match reqwest::get(&url).await {
            Ok(answer) => answer.json().await.unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        if pred(&b) {
            return b;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{id} on {}: {b:#}",
            r.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Spark's demand reported to a follower is granted by the leader; the
/// leader SIGKILLed, the next one reads the extras back as extras (not a
/// bigger core), gives back the idle one by name, and takes the newest
/// back for a queued gang in the pass that allocates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extras_granted_by_one_leader_are_kept_given_back_and_taken_back_by_the_next() {
    let Pair {
        leader: mut r0,
        follower: r1,
        guards: _guards,
    } = leader_and_follower(crate::elastic::config).await;
    let epoch = register(&r1.endpoint, "gpu-host-1").await;
    assert_eq!(r1.create("grow", &elastic_batch(8)).await, 200);
    // Until the follower's own view holds the cluster (the leader's
    // decisions reach it within a second; a driver's agent reports demand
    // only once Spark runs, tens of seconds later).
    let b = until(&r1, "grow", |b| {
        provisioned(b) && b["flexq"]["elastic"]["core"] == 2
    })
    .await;
    let uuid = b["uuid"].as_str().expect("uuid").to_string();

    // Spark targets 8 executors (6 extras): the region's share lets 4 be
    // held; the follower shows what the leader granted.
    let (st, e) = report(
        &r1.endpoint,
        "gpu-host-1",
        &epoch,
        &uuid,
        json!({"event": "EXECUTOR_DEMAND", "targetExecutors": 8}),
    )
    .await;
    assert_eq!(st, 200, "{e:#}");
    let b = until(&r1, "grow", |b| extras_running(b) == 4).await;
    assert_eq!(b["flexq"]["elastic"]["extras"]["wanted"], 6, "{b:#}");

    r0.kill9();
    leads_within(&r1, Duration::from_secs(10)).await;
    let b = until(&r1, "grow", |b| b["flexq"]["elastic"]["core"] == 2).await;
    assert_eq!(
        extras_running(&b),
        4,
        "the extras read back as extras: {b:#}"
    );
    let parts = assignments(&r1.endpoint, "gpu-host-1", &epoch).await;
    assert_eq!(
        executors(&parts, &uuid),
        vec![0, 1, 2, 3, 4, 5],
        "{parts:#?}"
    );

    // The new leader gives back the idle extra it names, once.
    let (st, e) = report(
        &r1.endpoint,
        "gpu-host-1",
        &epoch,
        &uuid,
        json!({"event": "EXTRA_IDLE", "index": 3}),
    )
    .await;
    assert_eq!(st, 200, "{e:#}");
    let b = until(&r1, "grow", |b| extras_running(b) == 3).await;
    assert_eq!(
        count(
            &state_messages(&b),
            "Gave back an extra executor on node gpu-host-1"
        ),
        1,
        "{:#?}",
        state_messages(&b)
    );

    // A fixed gang of 4 GPUs finds 2 free: the 2 newest extras go back in
    // the pass that allocates it.
    assert_eq!(
        r1.create("gang", &crate::scheduler::gpu_batch(3, "600s"))
            .await,
        200
    );
    until(&r1, "gang", provisioned).await;
    let took = |b: &Value| {
        count(
            &state_messages(b),
            "Took back an extra executor on node gpu-host-1 (1 GPU) for batch gang",
        )
    };
    let b = until(&r1, "grow", |b| took(b) >= 2).await;
    assert_eq!((took(&b), extras_running(&b)), (2, 1), "{b:#}");
    let parts = assignments(&r1.endpoint, "gpu-host-1", &epoch).await;
    assert_eq!(executors(&parts, &uuid), vec![0, 1, 2], "{parts:#?}");
    let mut gpus: Vec<String> = parts
        .iter()
        .flat_map(|a| a["gpus"].as_array().cloned().unwrap_or_default())
        .filter_map(|g| g.as_str().map(str::to_string))
        .collect();
    gpus.sort();
    let held = gpus.len();
    gpus.dedup();
    assert_eq!(
        (held, gpus.len()),
        (8, 8),
        "every GPU held once: {parts:#?}"
    );
}
