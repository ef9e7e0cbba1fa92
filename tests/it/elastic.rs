//! Elastic batches through the API (docs/rules.md#elastic-batches), on a
//! real `flexq` process (SQLite, and PostgreSQL in the suite's second
//! run). The test is a FAKE agent (these machines have no GPUs): it
//! speaks the agent protocol as the real one does — registers a node,
//! polls its assignments, reports Spark's executor demand from the
//! driver's node and an idle extra's worker from its node.

use serde_json::{Value, json};

use crate::scheduler::gpu_batch;
use crate::support::{ServerProcess, provisioned, state_messages};

/// Capacity only from agents (us-central1-b declares 4 nodes of 8 L4s),
/// with a lease that outlasts the test and a restart.
pub(crate) fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("flexq.toml");
    crate::support::virtual_l4_config(&path, 0);
    let mut text = std::fs::read_to_string(&path).expect("config");
    text.push_str("[agents]\nlease_duration = \"300s\"\n");
    std::fs::write(&path, text).expect("config");
    path
}

async fn post(endpoint: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{endpoint}{path}"))
        .json(body)
        .send()
        .await
        .expect("post");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Registers an 8-GPU L4 node in us-central1-b; answers its epoch.
pub(crate) async fn register(endpoint: &str, id: &str) -> String {
    let node = json!({
        "nodeId": id, "region": "us-central1", "zone": "us-central1-b", "pool": "l4",
        "gpuAddresses": (0..8).map(|i| i.to_string()).collect::<Vec<_>>(),
        "cores": 96, "memoryMb": 393216, "localSsdGb": 3000
    });
    let (st, reg) = post(endpoint, "/v1/nodes:register", &node).await;
    assert_eq!(st, 200, "{reg:#}");
    reg["epoch"].as_str().expect("epoch").to_string()
}

/// The node's assignments now.
pub(crate) async fn assignments(endpoint: &str, node: &str, epoch: &str) -> Vec<Value> {
    let (st, a) = post(
        endpoint,
        &format!("/v1/nodes/{node}:poll"),
        &json!({"epoch": epoch, "version": "", "waitFor": "1s"}),
    )
    .await;
    assert_eq!(st, 200, "{a:#}");
    a["assignments"].as_array().expect("assignments").clone()
}

/// The executor indices among `parts` of batch `uuid`, sorted.
pub(crate) fn executors(parts: &[Value], uuid: &str) -> Vec<u64> {
    let mut out: Vec<u64> = parts
        .iter()
        .filter(|a| a["uuid"] == uuid && a["role"] == "executor")
        .map(|a| a["index"].as_u64().expect("index"))
        .collect();
    out.sort();
    out
}

/// A report about batch `uuid` from `node`.
pub(crate) async fn report(
    endpoint: &str,
    node: &str,
    epoch: &str,
    uuid: &str,
    event: Value,
) -> (u16, Value) {
    let mut body = event;
    body["epoch"] = json!(epoch);
    body["uuid"] = json!(uuid);
    post(endpoint, &format!("/v1/nodes/{node}:report"), &body).await
}

/// An L4 batch with Spark's dynamic allocation on: a core of 2 executors
/// (one GPU each) and at most `max` executors.
pub(crate) fn elastic_batch(max: u32) -> Value {
    let mut b = gpu_batch(2, "3600s");
    let props = &mut b["runtimeConfig"]["properties"];
    props["spark.dynamicAllocation.enabled"] = json!("true");
    props["spark.dynamicAllocation.minExecutors"] = json!("2");
    props["spark.dynamicAllocation.maxExecutors"] = json!(max.to_string());
    b
}

pub(crate) fn extras_running(b: &Value) -> u64 {
    b["flexq"]["elastic"]["extras"]["running"]
        .as_u64()
        .unwrap_or(u64::MAX)
}

pub(crate) fn count(messages: &[String], text: &str) -> usize {
    messages.iter().filter(|m| m.contains(text)).count()
}

#[tokio::test]
async fn spark_demand_grows_an_elastic_batch_idle_extras_go_back_and_a_queued_gang_takes_them_first()
 {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = config(dir.path());
    let mut s = ServerProcess::start_with(dir.path(), Some(&file)).await;
    let epoch = register(&s.endpoint, "gpu-host-1").await;

    // The core gang (a driver and 2 executors, 3 GPUs) is allocated whole.
    assert_eq!(s.create("grow", &elastic_batch(8)).await, 200);
    let b = s.until("demo", "grow", provisioned).await;
    assert_eq!(b["flexq"]["elastic"]["core"], 2, "{b:#}");
    assert_eq!(b["flexq"]["elastic"]["extras"]["max"], 6, "{b:#}");
    assert_eq!(extras_running(&b), 0, "{b:#}");
    let uuid = b["uuid"].as_str().expect("uuid").to_string();
    let parts = assignments(&s.endpoint, "gpu-host-1", &epoch).await;
    assert_eq!(parts.len(), 3, "{parts:#?}");
    assert_eq!(executors(&parts, &uuid), vec![0, 1]);

    // Bad reports are refused by name, and change nothing.
    let (st, e) = report(
        &s.endpoint,
        "gpu-host-1",
        &epoch,
        &uuid,
        json!({"event": "EXECUTOR_DEMAND", "targetExecutors": 1_000_000}),
    )
    .await;
    assert_eq!(st, 400, "{e:#}");
    assert!(e.to_string().contains("targetExecutors"), "{e:#}");
    let (st, e) = report(
        &s.endpoint,
        "gpu-host-1",
        &epoch,
        "no-such-uuid",
        json!({"event": "EXECUTOR_DEMAND", "targetExecutors": 4}),
    )
    .await;
    assert_eq!(st, 400, "{e:#}");
    assert!(e.to_string().contains("does not run the driver"), "{e:#}");

    // Spark targets 8 executors: 6 extras wanted; the region lets extras
    // hold half its 8 GPUs, so 4 are granted, each one executor part on
    // the gang's node, and it says what holds the rest back.
    let (st, e) = report(
        &s.endpoint,
        "gpu-host-1",
        &epoch,
        &uuid,
        json!({"event": "EXECUTOR_DEMAND", "targetExecutors": 8}),
    )
    .await;
    assert_eq!(st, 200, "{e:#}");
    // (Read until the history has them: the page reads the store, then
    // the scheduler's view.)
    let granted = |b: &Value| {
        count(
            &state_messages(b),
            "Granted an extra executor on node gpu-host-1 (1 GPU)",
        )
    };
    let b = s.until("demo", "grow", |b| granted(b) >= 4).await;
    assert_eq!((granted(&b), extras_running(&b)), (4, 4), "{b:#}");
    let extras = &b["flexq"]["elastic"]["extras"];
    assert_eq!(
        (extras["wanted"].as_u64(), extras["blockedBy"].as_str()),
        (Some(6), Some("REGION_SHARE")),
        "{b:#}"
    );
    assert_eq!(
        b["flexq"]["nodes"].as_array().map(Vec::len),
        Some(7),
        "the core's parts, then the extras: {b:#}"
    );
    let parts = assignments(&s.endpoint, "gpu-host-1", &epoch).await;
    assert_eq!(
        executors(&parts, &uuid),
        vec![0, 1, 2, 3, 4, 5],
        "{parts:#?}"
    );
    let text = s.scrape().await;
    let who = [
        ("region", "us-central1"),
        ("project", "demo"),
        ("accelerator", "l4"),
    ];
    assert_eq!(
        crate::metrics::value(&text, "flexq_extras_held", &who),
        Some(4.0)
    );
    assert_eq!(
        crate::metrics::value(
            &text,
            "flexq_extra_changes_total",
            &[
                ("region", "us-central1"),
                ("project", "demo"),
                ("change", "granted")
            ]
        ),
        Some(4.0)
    );

    // Extra 3's worker is idle: that one goes back (not the newest), once.
    let (st, e) = report(
        &s.endpoint,
        "gpu-host-1",
        &epoch,
        &uuid,
        json!({"event": "EXTRA_IDLE", "index": 3}),
    )
    .await;
    assert_eq!(st, 200, "{e:#}");
    let (st, e) = report(
        &s.endpoint,
        "gpu-host-1",
        &epoch,
        &uuid,
        json!({"event": "EXTRA_IDLE", "index": 3}),
    )
    .await;
    assert_eq!(st, 404, "{e:#}");
    let (st, e) = report(
        &s.endpoint,
        "gpu-host-1",
        &epoch,
        &uuid,
        json!({"event": "EXTRA_IDLE", "index": 0}),
    )
    .await;
    assert_eq!(st, 404, "a core executor is not an extra: {e:#}");
    let b = s
        .until("demo", "grow", |b| {
            count(
                &state_messages(b),
                "Gave back an extra executor on node gpu-host-1",
            ) > 0
        })
        .await;
    assert_eq!(
        count(
            &state_messages(&b),
            "Gave back an extra executor on node gpu-host-1"
        ),
        1
    );
    assert_eq!(extras_running(&b), 3, "{b:#}");
    let parts = assignments(&s.endpoint, "gpu-host-1", &epoch).await;
    assert_eq!(executors(&parts, &uuid), vec![0, 1, 2, 4, 5], "{parts:#?}");

    // A restart reads the extras back as extras, not as a bigger core.
    s.kill9();
    let s = ServerProcess::start_with(dir.path(), Some(&file)).await;
    let b = s.batch("grow").await;
    assert_eq!(b["flexq"]["elastic"]["core"], 2, "{b:#}");
    assert_eq!(extras_running(&b), 3, "{b:#}");

    // A fixed gang of 4 GPUs finds 2 free: the 2 newest extras go back in
    // the pass that allocates it; the oldest stays.
    assert_eq!(s.create("gang", &gpu_batch(3, "3600s")).await, 200);
    s.until("demo", "gang", provisioned).await;
    let took = |b: &Value| {
        count(
            &state_messages(b),
            "Took back an extra executor on node gpu-host-1 (1 GPU) for batch gang",
        )
    };
    let b = s.until("demo", "grow", |b| took(b) >= 2).await;
    assert_eq!(
        (took(&b), extras_running(&b)),
        (2, 1),
        "{:#?}",
        state_messages(&b)
    );
    assert_eq!(
        b["flexq"]["elastic"]["extras"]["blockedBy"], "CAPACITY",
        "{b:#}"
    );
    let parts = assignments(&s.endpoint, "gpu-host-1", &epoch).await;
    assert_eq!(executors(&parts, &uuid), vec![0, 1, 2], "{parts:#?}");
    let gpus: usize = parts
        .iter()
        .map(|a| a["gpus"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(gpus, 8, "every GPU held once: {parts:#?}");
    let text = s.scrape().await;
    assert_eq!(
        crate::metrics::value(
            &text,
            "flexq_extra_changes_total",
            &[
                ("region", "us-central1"),
                ("project", "demo"),
                ("change", "reclaimed")
            ]
        ),
        Some(2.0)
    );

    // The usage report counts the extras' GPU-hours apart from the core's,
    // and the batch's executors over time end at the core and one extra.
    let usage = reqwest::get(format!(
        "{}/v1/projects/demo/regions/us-central1/usage",
        s.endpoint
    ))
    .await
    .expect("usage")
    .json::<Value>()
    .await
    .expect("json");
    let total = &usage["total"];
    let (all, extra) = (
        total["gpuHours"].as_f64().unwrap_or_default(),
        total["extraGpuHours"].as_f64().unwrap_or_default(),
    );
    assert!(extra > 0.0 && extra < all, "{usage:#}");
    let chart = reqwest::get(format!(
        "{}/v1/projects/demo/locations/us-central1/batches/grow/executors",
        s.endpoint
    ))
    .await
    .expect("executors")
    .json::<Value>()
    .await
    .expect("json");
    let points = chart["points"].as_array().expect("points");
    let last = points.last().expect("a point");
    assert_eq!(
        (&last["executors"], &last["extras"]),
        (&json!(3), &json!(1)),
        "{chart:#}"
    );
    let most = points.iter().filter_map(|p| p["extras"].as_u64()).max();
    assert_eq!(most, Some(4), "{chart:#}");
}
