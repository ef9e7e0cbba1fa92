//! Requeue after an infrastructure failure, through the agent protocol
//! (the server cannot tell this test from an agent): a batch whose node is
//! lost goes back to the queue while it has retries, keeps its place, and
//! its second attempt runs to the end; every attempt is in its state
//! history. A failure of the batch's own code, a cancel, or a batch without
//! retries is never requeued. (A fake agent: no GPU, no Spark here.)

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{TestServer, assert_status, flex_with, no_virtual_nodes, provisioned, sample};

fn node(id: &str) -> Value {
    json!({
        "nodeId": id, "region": "us-central1", "zone": "us-central1-b", "pool": "l4",
        "gpuAddresses": (0..8).map(|i| i.to_string()).collect::<Vec<_>>(),
        "cores": 96, "memoryMb": 393216, "localSsdGb": 3000
    })
}

/// A batch of 3 GPUs with `retries` requeues (no label when None).
fn batch(retries: Option<&str>) -> Value {
    let mut b = flex_with("spark.executor.instances", "2");
    if let Some(r) = retries {
        b["labels"] = json!({"flexq-infrastructure-retries": r});
    }
    b
}

const BATCHES: &str = "/v1/projects/demo/locations/us-central1/batches";

async fn register(s: &TestServer, id: &str) -> String {
    let (st, reg) = s.post_json("/v1/nodes:register", &node(id)).await;
    assert_eq!(st, 200, "{reg:#}");
    reg["epoch"].as_str().expect("epoch").to_string()
}

/// Heartbeats `id` until batch `batch` satisfies `done`.
async fn heartbeat_until(
    s: &TestServer,
    id: &str,
    epoch: &str,
    batch: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let t = Instant::now();
    loop {
        let (st, hb) = s
            .post_json(
                &format!("/v1/nodes/{id}:heartbeat"),
                &json!({"epoch": epoch}),
            )
            .await;
        assert_eq!(st, 200, "{hb:#}");
        let (_, b) = s.get(&format!("{BATCHES}/{batch}")).await;
        if done(&b) {
            return b;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "{b:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits, without heartbeats, until batch `batch` satisfies `done`.
async fn until(s: &TestServer, batch: &str, done: impl Fn(&Value) -> bool) -> Value {
    let path = format!("{BATCHES}/{batch}");
    crate::support::poll(
        Duration::from_secs(15),
        || async { s.get(&path).await.1 },
        done,
    )
    .await
    .unwrap_or_else(|b| panic!("{b:#}"))
}

async fn report(s: &TestServer, node: &str, epoch: &str, uuid: &str, event: Value) {
    let mut body = event;
    body["epoch"] = json!(epoch);
    body["uuid"] = json!(uuid);
    let (st, r) = s
        .post_json(&format!("/v1/nodes/{node}:report"), &body)
        .await;
    assert_eq!(st, 200, "{r:#}");
}

/// The driver started on `node`.
async fn started(s: &TestServer, node: &str, epoch: &str, uuid: &str) {
    let event = json!({"event": "DRIVER_STARTED", "rapids": "enabled"});
    report(s, node, epoch, uuid, event).await;
}

/// The driver ended on `node`, well or not.
async fn finished(s: &TestServer, node: &str, epoch: &str, uuid: &str, succeeded: bool) {
    let event = json!({"event": "FINISHED", "succeeded": succeeded, "message": "done", "exitCode": i32::from(!succeeded)});
    report(s, node, epoch, uuid, event).await;
}

/// Creates batch `id` (with `retries`) and heartbeats `node` until it is
/// allocated; answers the batch and its uuid.
async fn allocated(
    s: &TestServer,
    node: &str,
    epoch: &str,
    id: &str,
    retries: Option<&str>,
) -> (Value, String) {
    let (st, body) = s.create(&format!("batchId={id}"), &batch(retries)).await;
    assert_eq!(st, 200, "{body:#}");
    let b = heartbeat_until(s, node, epoch, id, provisioned).await;
    let uuid = b["uuid"].as_str().expect("uuid").to_string();
    (b, uuid)
}

fn history(b: &Value) -> Vec<String> {
    b["stateHistory"]
        .as_array()
        .map(|h| {
            h.iter()
                .map(|e| e["state"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_lost_node_requeues_the_batch_and_its_second_attempt_runs() {
    // A process of its own: its requeue counter is this test's.
    let s = TestServer::start_process_with(|c| {
        no_virtual_nodes(c);
        c.agents.lease_duration = Duration::from_secs(1);
    })
    .await;
    let epoch = register(&s, "gpu-a").await;
    let (b, uuid) = allocated(&s, "gpu-a", &epoch, "retried", Some("1")).await;
    let deadline = b["flexq"]["allocationDeadline"].clone();
    started(&s, "gpu-a", &epoch, &uuid).await;

    // The agent goes silent: the batch goes back to the queue, waiting.
    let b = until(&s, "retried", |b| {
        b["state"] == "PENDING" && b["flexq"]["provisioningState"] == "QUEUED"
    })
    .await;
    let message = b["stateMessage"].as_str().expect("message");
    assert!(
        message.starts_with(
            "Requeued after an infrastructure failure (attempt 2 of 2 next): Node gpu-a was lost"
        ),
        "{message}"
    );
    // Created, allocated, running, requeued.
    assert_eq!(
        history(&b),
        ["PENDING", "PENDING", "RUNNING", "PENDING"],
        "{b:#}"
    );
    assert_ne!(
        b["flexq"]["allocationDeadline"], deadline,
        "a fresh deadline"
    );
    assert_eq!(b["flexq"]["attempt"], 2, "{b:#}");
    assert_eq!(b["flexq"]["requeueReason"], "INFRASTRUCTURE", "{b:#}");
    assert!(
        b["flexq"]["nodes"].as_array().is_none_or(|n| n.is_empty()),
        "{b:#}"
    );
    assert_eq!(
        sample(&s.scrape().await, "flexq_batch_requeues_total"),
        Some(1.0),
        "this server's one requeue"
    );

    // A node comes (back): the second attempt is allocated and runs.
    let epoch = register(&s, "gpu-b").await;
    let b = heartbeat_until(&s, "gpu-b", &epoch, "retried", provisioned).await;
    assert!(
        b["flexq"]["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .all(|p| p["node"] == "gpu-b"),
        "{b:#}"
    );
    started(&s, "gpu-b", &epoch, &uuid).await;
    finished(&s, "gpu-b", &epoch, &uuid, true).await;
    let b = until(&s, "retried", |b| b["state"] == "SUCCEEDED").await;
    assert_eq!(
        history(&b),
        [
            "PENDING",
            "PENDING",
            "RUNNING",
            "PENDING",
            "PENDING",
            "RUNNING",
            "SUCCEEDED"
        ],
        "{b:#}"
    );
}

#[tokio::test]
async fn without_retries_or_for_its_own_failure_a_batch_is_not_requeued() {
    let s = TestServer::start_for_agents(Duration::from_secs(1)).await;
    let epoch = register(&s, "gpu-a").await;
    // No label, the default of 0: a lost node fails it, as before.
    let (st, _) = s.create("batchId=no-retries", &batch(None)).await;
    assert_eq!(st, 200);
    heartbeat_until(&s, "gpu-a", &epoch, "no-retries", provisioned).await;
    // Its own code failing is never requeued, retries or not.
    let (_, uuid) = allocated(&s, "gpu-a", &epoch, "own-failure", Some("3")).await;
    started(&s, "gpu-a", &epoch, &uuid).await;
    finished(&s, "gpu-a", &epoch, &uuid, false).await;
    let b = until(&s, "own-failure", |b| b["state"] == "FAILED").await;
    // Created, allocated, running, failed: no requeue.
    assert_eq!(history(&b), ["PENDING", "PENDING", "RUNNING", "FAILED"]);
    // An executor part failing of itself: not requeued either.
    let (_, uuid) = allocated(&s, "gpu-a", &epoch, "part-failure", Some("3")).await;
    report(
        &s,
        "gpu-a",
        &epoch,
        &uuid,
        json!({"event": "PART_FAILED", "message": "executor exited"}),
    )
    .await;
    assert_eq!(
        until(&s, "part-failure", |b| b["state"] == "FAILED").await["state"],
        "FAILED"
    );
    // The agent stopping (an infrastructure failure it reports) requeues
    // a batch with retries.
    let (_, uuid) = allocated(&s, "gpu-a", &epoch, "agent-stopped", Some("1")).await;
    report(
        &s,
        "gpu-a",
        &epoch,
        &uuid,
        json!({"event": "PART_FAILED", "message": "the agent was stopped", "infrastructure": true}),
    )
    .await;
    // (It was PENDING already, allocated but not started: wait for the
    // requeue itself, in its history — the second attempt may already be
    // allocated again on the same node, and lost with it: this test stops
    // heartbeating.)
    let b = until(&s, "agent-stopped", |b| {
        b["stateHistory"].as_array().is_some_and(|h| {
            h.iter().any(|e| {
                e["stateMessage"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("Requeued after an infrastructure failure"))
            })
        })
    })
    .await;
    assert_eq!(b["flexq"]["attempt"], 2, "{b:#}");
    // The node is lost: no-retries fails.
    let b = until(&s, "no-retries", |b| b["state"] == "FAILED").await;
    assert!(
        b["stateMessage"]
            .as_str()
            .is_some_and(|m| m.starts_with("Node gpu-a was lost")),
        "{b:#}"
    );

    // A label that makes no sense is named with what is accepted.
    let (st, body) = s.create("batchId=bad-label", &batch(Some("many"))).await;
    assert_status(st, &body, 400, "INVALID_ARGUMENT");
    let text = body.to_string();
    assert!(
        text.contains("labels[flexq-infrastructure-retries]") && text.contains("0 to 5"),
        "{body:#}"
    );
}

#[tokio::test]
async fn an_agent_back_without_its_work_gets_the_batch_again_and_runs_it() {
    // A long lease: only the agent's restart is the failure here.
    let s = TestServer::start_for_agents(Duration::from_secs(30)).await;
    let epoch = register(&s, "gpu-a").await;
    let (_, uuid) = allocated(&s, "gpu-a", &epoch, "came-back", Some("2")).await;
    started(&s, "gpu-a", &epoch, &uuid).await;

    // The agent restarts and runs nothing: the batch goes back to the
    // queue and, the node being free, is allocated to it again at once.
    let (st, reg) = s
        .post_json("/v1/nodes:register", &{
            let mut n = node("gpu-a");
            n["running"] = json!([]);
            n
        })
        .await;
    assert_eq!(st, 200, "{reg:#}");
    let epoch = reg["epoch"].as_str().expect("epoch").to_string();
    let b = heartbeat_until(&s, "gpu-a", &epoch, "came-back", provisioned).await;
    let requeued: Vec<&str> = b["stateHistory"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(|e| e["stateMessage"].as_str())
        .filter(|m| m.starts_with("Requeued after an infrastructure failure (attempt 2 of 3 next)"))
        .collect();
    assert_eq!(requeued.len(), 1, "{b:#}");
    assert!(requeued[0].contains("restarted"), "{b:#}");

    // The new agent polls: the batch is assigned again, and it runs.
    let (st, answer) = s
        .post_json(
            "/v1/nodes/gpu-a:poll",
            &json!({"epoch": epoch, "version": "", "waitFor": "2s"}),
        )
        .await;
    assert_eq!(st, 200, "{answer:#}");
    assert!(
        answer["assignments"]
            .as_array()
            .expect("assignments")
            .iter()
            .any(|a| a["uuid"] == uuid.as_str()),
        "{answer:#}"
    );
    started(&s, "gpu-a", &epoch, &uuid).await;
    finished(&s, "gpu-a", &epoch, &uuid, true).await;
    until(&s, "came-back", |b| b["state"] == "SUCCEEDED").await;
}

#[tokio::test]
async fn a_batch_requeued_after_a_lost_node_goes_back_ahead_of_batches_created_after_it() {
    // A lease of 2s: the node lives through the creates below, and is
    // lost soon once this test stops heartbeating.
    let s = TestServer::start_for_agents(Duration::from_secs(2)).await;
    let epoch = register(&s, "gpu-a").await;
    // 8 GPUs: a batch without retries and the victim take 6 of them.
    allocated(&s, "gpu-a", &epoch, "filler", None).await;
    let (_, uuid) = allocated(&s, "gpu-a", &epoch, "victim", Some("1")).await;
    started(&s, "gpu-a", &epoch, &uuid).await;
    // The same project and shape, created after the victim: it waits for
    // 3 GPUs, first in the queue.
    let (st, body) = s.create("batchId=competitor", &batch(Some("1"))).await;
    assert_eq!(st, 200, "{body:#}");
    let queued = |b: &Value| b["flexq"]["queuePosition"].is_number();
    let c = heartbeat_until(&s, "gpu-a", &epoch, "competitor", queued).await;
    assert_eq!(c["flexq"]["provisioningState"], "QUEUED", "{c:#}");
    assert_eq!(c["flexq"]["queuePosition"], 1, "{c:#}");

    // The agent goes silent: the victim goes back to the queue after the
    // competitor was created, and still ahead of it (its queue time is its
    // create time), in a get and in the queue's page.
    let v = until(&s, "victim", |b| b["flexq"]["attempt"] == 2 && queued(b)).await;
    assert_eq!(v["flexq"]["requeueReason"], "INFRASTRUCTURE", "{v:#}");
    assert_eq!(v["flexq"]["queuePosition"], 1, "{v:#}");
    let (_, c) = s.get(&format!("{BATCHES}/competitor")).await;
    assert_eq!(c["flexq"]["queuePosition"], 2, "{c:#}");
    let (st, page) = s
        .get("/v1/projects/demo/regions/us-central1/queue/entries")
        .await;
    assert_eq!(st, 200, "{page:#}");
    let entries = page["entries"].as_array().expect("entries");
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().expect("name"))
        .map(|n| n.rsplit('/').next().unwrap_or_default())
        .collect();
    assert_eq!(names, ["victim", "competitor"], "{page:#}");
    let time = |t: &Value| {
        t.as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .unwrap_or_else(|| panic!("a time: {t}"))
    };
    assert_eq!(
        time(&entries[0]["queueTime"]),
        time(&v["createTime"]),
        "{page:#}"
    );
    assert!(
        time(&entries[0]["queueTime"]) < time(&c["createTime"]),
        "{page:#}"
    );

    // A node with room for one cluster of 3 GPUs: the victim gets it, the
    // competitor waits on, now first.
    let (st, reg) = s
        .post_json("/v1/nodes:register", &{
            let mut n = node("gpu-b");
            n["gpuAddresses"] = json!(["0", "1", "2", "3"]);
            n
        })
        .await;
    assert_eq!(st, 200, "{reg:#}");
    let epoch = reg["epoch"].as_str().expect("epoch").to_string();
    let v = heartbeat_until(&s, "gpu-b", &epoch, "victim", provisioned).await;
    assert_eq!(v["flexq"]["attempt"], 2, "{v:#}");
    let (_, c) = s.get(&format!("{BATCHES}/competitor")).await;
    assert_eq!(c["flexq"]["provisioningState"], "QUEUED", "{c:#}");
    assert_eq!(c["flexq"]["queuePosition"], 1, "{c:#}");
}
