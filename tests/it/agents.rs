//! Node registration, heartbeats and leases through the HTTP API.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{TestServer, assert_status, flex_with, no_virtual_nodes, sample};

fn node(id: &str, gpus: u32) -> Value {
    json!({
        "nodeId": id, "region": "us-central1", "zone": "us-central1-b", "pool": "l4",
        "gpuAddresses": (0..gpus).map(|i| i.to_string()).collect::<Vec<_>>(),
        "cores": 96, "memoryMb": 393216, "localSsdGb": 3000
    })
}

async fn post(s: &TestServer, path: &str, body: &Value) -> (u16, Value) {
    s.post_json(path, body).await
}

/// A server whose only capacity is what agents register (us-central1-b
/// declares 4 nodes of 8 L4s), with a 1s lease.
async fn server() -> TestServer {
    server_with_lease(Duration::from_secs(1)).await
}

/// The same with a lease of `lease`, in a process of its own: the tests
/// read exact changes of its metrics.
async fn server_with_lease(lease: Duration) -> TestServer {
    TestServer::start_process_with(|c| {
        no_virtual_nodes(c);
        c.agents.lease_duration = lease;
    })
    .await
}

#[tokio::test]
async fn a_registered_node_is_capacity_and_its_lost_lease_fails_its_batches() {
    let s = server().await;
    let (st, reg) = post(&s, "/v1/nodes:register", &node("gpu-host-1", 8)).await;
    assert_eq!(st, 200, "{reg:#}");
    let epoch = reg["epoch"]
        .as_str()
        .expect("epoch as int64 string")
        .to_string();
    assert_eq!(reg["leaseDuration"], "1s");
    let (_, nodes) = s.get("/v1/nodes").await;
    let n = &nodes["nodes"].as_array().expect("nodes")[0];
    assert_eq!(
        (
            n["id"].as_str(),
            n["virtual"].as_bool(),
            n["freeGpus"].as_u64()
        ),
        (Some("gpu-host-1"), Some(false), Some(8))
    );

    // A batch lands on it while the agent heartbeats.
    let (st, _) = s
        .create(
            "batchId=on-agent",
            &flex_with("spark.executor.instances", "4"),
        )
        .await;
    assert_eq!(st, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    let gpus_held = loop {
        let (st, hb) = post(
            &s,
            "/v1/nodes/gpu-host-1:heartbeat",
            &json!({"epoch": epoch}),
        )
        .await;
        assert_eq!(st, 200, "{hb:#}");
        let (_, b) = s
            .get("/v1/projects/demo/locations/us-central1/batches/on-agent")
            .await;
        if b["flexq"]["provisioningState"] == "PROVISIONED" {
            assert!(
                b["flexq"]["nodes"]
                    .as_array()
                    .expect("nodes")
                    .iter()
                    .all(|p| p["node"] == "gpu-host-1" && p["isVirtual"] == false)
            );
            break b["flexq"]["nodes"]
                .as_array()
                .expect("nodes")
                .iter()
                .map(|p| p["gpus"].as_array().expect("gpus").len())
                .sum::<usize>();
        }
        assert!(Instant::now() < deadline, "{b:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Heartbeats keep it across several lease lengths.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            post(
                &s,
                "/v1/nodes/gpu-host-1:heartbeat",
                &json!({"epoch": epoch})
            )
            .await
            .0,
            200
        );
    }

    // The agent goes silent: after the lease, the batch fails saying why
    // and the node's capacity leaves.
    let silent = Instant::now();
    let b = loop {
        let (_, b) = s
            .get("/v1/projects/demo/locations/us-central1/batches/on-agent")
            .await;
        if b["state"] == "FAILED" {
            break b;
        }
        assert!(silent.elapsed() < Duration::from_secs(10), "{b:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        silent.elapsed() < Duration::from_secs(3),
        "lost within about a lease: {:?}",
        silent.elapsed()
    );
    let msg = b["stateMessage"].as_str().expect("message");
    assert!(
        msg.starts_with(
            "Node gpu-host-1 was lost: its agent stopped heartbeating and its lease expired at"
        ),
        "{msg}"
    );
    let (_, nodes) = s.get("/v1/nodes").await;
    assert!(nodes["nodes"].as_array().expect("nodes").is_empty());
    let (_, q) = s.get("/v1/projects/demo/regions/us-central1/quotas").await;
    assert!(
        q["quotas"]
            .as_array()
            .expect("q")
            .iter()
            .all(|m| m["usage"] == 0),
        "quota given back: {q:#}"
    );
    // The lost cluster's GPU-seconds are counted at its release (the core
    // gave it back inside the pass that found the node lost).
    // This server's only cluster: its GPUs times the time it held them.
    let metrics = s.scrape().await;
    let counted: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("flexq_project_gpu_seconds_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let time = |field: &str| {
        chrono::DateTime::parse_from_rfc3339(b[field].as_str().expect(field)).expect("a timestamp")
    };
    let allocated =
        chrono::DateTime::parse_from_rfc3339(b["flexq"]["allocateTime"].as_str().expect("at"))
            .expect("a timestamp");
    let held = (time("stateTime") - allocated).as_seconds_f64();
    let expected = gpus_held as f64 * held;
    assert!(
        gpus_held > 0 && (counted - expected).abs() <= 0.01 * expected + 0.1,
        "{counted} GPU-seconds counted, {gpus_held} GPUs held {held} s:\n{metrics}"
    );

    // A late report from the lost agent is refused.
    let (st, err) = post(
        &s,
        "/v1/nodes/gpu-host-1:heartbeat",
        &json!({"epoch": epoch}),
    )
    .await;
    assert_status(st, &err, 400, "FAILED_PRECONDITION");

    // It registers again: a new epoch; the old one is fenced.
    let (_, again) = post(&s, "/v1/nodes:register", &node("gpu-host-1", 8)).await;
    let new_epoch = again["epoch"].as_str().expect("epoch");
    assert_ne!(new_epoch, epoch);
    let (st, err) = post(
        &s,
        "/v1/nodes/gpu-host-1:heartbeat",
        &json!({"epoch": epoch}),
    )
    .await;
    assert_status(st, &err, 409, "ABORTED");
    assert_eq!(
        post(
            &s,
            "/v1/nodes/gpu-host-1:heartbeat",
            &json!({"epoch": new_epoch})
        )
        .await
        .0,
        200
    );
}

#[tokio::test]
async fn bad_registrations_are_refused_by_name() {
    let s = server().await;
    let mut unknown = node("gpu-x", 8);
    unknown["pool"] = json!("h100");
    let (st, err) = post(&s, "/v1/nodes:register", &unknown).await;
    assert_status(st, &err, 400, "FAILED_PRECONDITION");

    let (st, err) = post(&s, "/v1/nodes:register", &node("gpu-blind", 0)).await;
    assert_status(st, &err, 400, "FAILED_PRECONDITION");
    assert!(
        err["error"]["message"]
            .as_str()
            .expect("m")
            .contains("cannot be seen is not offered")
    );

    let (st, err) = post(&s, "/v1/nodes:register", &node("gpu-big", 9)).await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    let mut dup = node("gpu-dup", 2);
    dup["gpuAddresses"] = json!(["0", "0"]);
    let (st, err) = post(&s, "/v1/nodes:register", &dup).await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    let (st, err) = post(&s, "/v1/nodes:register", &node("Bad Name", 8)).await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");

    for i in 0..4 {
        assert_eq!(
            post(&s, "/v1/nodes:register", &node(&format!("gpu-{i}"), 8))
                .await
                .0,
            200
        );
    }
    let (st, err) = post(&s, "/v1/nodes:register", &node("gpu-5", 8)).await;
    assert_status(st, &err, 429, "RESOURCE_EXHAUSTED");
    assert_eq!(
        post(&s, "/v1/nodes:register", &node("gpu-0", 8)).await.0,
        200,
        "re-registration is not a new node"
    );

    let (st, err) = post(&s, "/v1/nodes/gpu-0:heartbeat", &json!({"epoch": "soon"})).await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    let (st, err) = post(&s, "/v1/nodes/nobody:heartbeat", &json!({"epoch": 1})).await;
    assert_status(st, &err, 400, "FAILED_PRECONDITION");
    let (st, err) = post(&s, "/v1/nodes/gpu-0:explode", &json!({"epoch": 1})).await;
    assert_status(st, &err, 404, "NOT_FOUND");
}

/// Registers `id` with 8 GPUs and returns its epoch.
pub(crate) async fn register(s: &TestServer, id: &str) -> String {
    let (st, reg) = post(s, "/v1/nodes:register", &node(id, 8)).await;
    assert_eq!(st, 200, "{reg:#}");
    reg["epoch"].as_str().expect("epoch").to_string()
}

pub(crate) async fn poll(
    s: &TestServer,
    id: &str,
    epoch: &str,
    version: &str,
    wait: &str,
) -> (u16, Value) {
    post(
        s,
        &format!("/v1/nodes/{id}:poll"),
        &json!({"epoch": epoch, "version": version, "waitFor": wait}),
    )
    .await
}

#[tokio::test]
async fn the_agent_protocol_long_polls_reports_and_streams_output() {
    let s = server_with_lease(Duration::from_secs(30)).await;
    let epoch = register(&s, "gpu-host-1").await;

    // Nothing to do: the first poll answers at once (no version yet), the
    // next waits for its waitFor.
    let (st, first) = poll(&s, "gpu-host-1", &epoch, "", "5s").await;
    assert_eq!(st, 200, "{first:#}");
    assert_eq!(first["assignments"], json!([]));
    let version = first["version"].as_str().expect("version").to_string();
    let started = Instant::now();
    let (_, same) = poll(&s, "gpu-host-1", &epoch, &version, "1s").await;
    assert_eq!(same["version"], version.as_str());
    assert!(started.elapsed() >= Duration::from_millis(900), "it waited");

    // A poll waiting when a batch is allocated answers at once with it.
    let waiting = {
        let (s2, e2, v2) = (s.url(""), epoch.clone(), version.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let started = Instant::now();
            let r = http
                .post(format!("{s2}/v1/nodes/gpu-host-1:poll"))
                .json(&json!({"epoch": e2, "version": v2, "waitFor": "20s"}))
                .send()
                .await
                .expect("poll");
            (started.elapsed(), r.json::<Value>().await.expect("json"))
        })
    };
    // Waiting (read, nothing new) before the allocation is made: what
    // answers it is the wake-up, not its first read.
    crate::support::until_long_polls(&s, "assignments", 1).await;
    let (st, _) = s
        .create(
            "batchId=run-me",
            &flex_with("spark.executor.instances", "4"),
        )
        .await;
    assert_eq!(st, 200);
    let (took, answer) = waiting.await.expect("poll task");
    assert!(
        took < Duration::from_secs(5),
        "long poll woke on the allocation: {took:?}"
    );
    crate::support::until_long_polls(&s, "assignments", 0).await;
    let parts = answer["assignments"].as_array().expect("assignments");
    assert_eq!(parts.len(), 5, "{answer:#}");
    let driver = parts
        .iter()
        .find(|a| a["role"] == "driver")
        .expect("driver");
    assert_eq!(driver["action"], "RUN");
    assert_eq!(
        driver["job"]["batch"],
        "projects/demo/locations/us-central1/batches/run-me"
    );
    let mut indexes: Vec<u64> = parts
        .iter()
        .filter(|a| a["role"] == "executor")
        .map(|a| a["index"].as_u64().expect("index"))
        .collect();
    indexes.sort();
    assert_eq!(indexes, [0, 1, 2, 3]);
    let uuid = driver["uuid"].as_str().expect("uuid").to_string();
    let report = |event: Value| {
        let mut body = event;
        body["epoch"] = json!(epoch);
        body["uuid"] = json!(uuid);
        body
    };

    // Bad reports are refused by name.
    let (st, err) = post(
        &s,
        "/v1/nodes/gpu-host-1:report",
        &report(json!({"event": "MASTER_READY", "masterUrl": "http://x"})),
    )
    .await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    assert!(
        err["error"]["message"]
            .as_str()
            .expect("m")
            .contains("masterUrl")
    );
    let (st, err) = post(
        &s,
        "/v1/nodes/gpu-host-1:report",
        &report(json!({"event": "EXPLODED"})),
    )
    .await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    let other = register(&s, "gpu-host-2").await;
    let mut foreign = report(json!({"event": "DRIVER_STARTED", "rapids": "enabled"}));
    foreign["epoch"] = json!(other);
    let (st, err) = post(&s, "/v1/nodes/gpu-host-2:report", &foreign).await;
    assert_status(st, &err, 400, "FAILED_PRECONDITION");
    assert!(
        err["error"]["message"]
            .as_str()
            .expect("m")
            .contains("holds no part"),
        "an agent acts only for its own node's parts: {err:#}"
    );

    // The driver's agent: master, start, output, end.
    let (st, _) = post(
        &s,
        "/v1/nodes/gpu-host-1:report",
        &report(json!({"event": "MASTER_READY", "masterUrl": "spark://127.0.0.1:7077"})),
    )
    .await;
    assert_eq!(st, 200);
    let (_, again) = poll(
        &s,
        "gpu-host-1",
        &epoch,
        answer["version"].as_str().expect("v"),
        "5s",
    )
    .await;
    assert!(
        again["assignments"]
            .as_array()
            .expect("a")
            .iter()
            .all(|a| a["masterUrl"] == "spark://127.0.0.1:7077"),
        "executors learn the master: {again:#}"
    );
    let (st, _) = post(
        &s,
        "/v1/nodes/gpu-host-1:report",
        &report(json!({"event": "DRIVER_STARTED", "rapids": "enabled (/opt/rapids.jar)"})),
    )
    .await;
    assert_eq!(st, 200);
    let (_, b) = s
        .get("/v1/projects/demo/locations/us-central1/batches/run-me")
        .await;
    assert_eq!(b["state"], "RUNNING");
    let out = |offset: u64, data: &str| json!({"epoch": epoch, "uuid": uuid, "offset": offset.to_string(), "data": data});
    assert_eq!(
        post(&s, "/v1/nodes/gpu-host-1:output", &out(0, "line 1\n"))
            .await
            .0,
        200
    );
    // A retried chunk is accepted once; a gap is refused.
    assert_eq!(
        post(&s, "/v1/nodes/gpu-host-1:output", &out(0, "line 1\n"))
            .await
            .0,
        200
    );
    let (st, err) = post(&s, "/v1/nodes/gpu-host-1:output", &out(99, "x")).await;
    assert_status(st, &err, 400, "FAILED_PRECONDITION");
    // A reader long-polling from the end wakes on the next chunk.
    let reader = {
        let url = s.url(
            "/v1/projects/demo/locations/us-central1/batches/run-me/output?offset=7&waitFor=20s",
        );
        tokio::spawn(async move {
            let started = Instant::now();
            let r = reqwest::get(url).await.expect("read");
            (started.elapsed(), r.json::<Value>().await.expect("json"))
        })
    };
    crate::support::until_long_polls(&s, "output", 1).await;
    assert_eq!(
        post(&s, "/v1/nodes/gpu-host-1:output", &out(7, "line 2 ✓\n"))
            .await
            .0,
        200
    );
    let (took, chunk) = reader.await.expect("reader");
    assert!(
        took < Duration::from_secs(5),
        "the reader woke on the chunk, not its waitFor (20s): {took:?}"
    );
    crate::support::until_long_polls(&s, "output", 0).await;
    assert_eq!(chunk["data"], "line 2 ✓\n");
    assert_eq!(chunk["done"], false);
    let (st, _) = post(
        &s,
        "/v1/nodes/gpu-host-1:report",
        &report(json!({"event": "FINISHED", "succeeded": false, "message": "The driver failed (exit status 1): ValueError: x", "exitCode": 1})),
    )
    .await;
    assert_eq!(st, 200);
    let (_, b) = s
        .get("/v1/projects/demo/locations/us-central1/batches/run-me")
        .await;
    assert_eq!(b["state"], "FAILED");
    assert_eq!(
        b["stateMessage"],
        "The driver failed (exit status 1): ValueError: x"
    );
    assert_eq!(b["runtimeInfo"]["driverExitCode"], 1);
    assert_eq!(
        b["runtimeInfo"]["endpoints"]["Spark master"],
        "spark://127.0.0.1:7077"
    );
    let (_, all) = s
        .get("/v1/projects/demo/locations/us-central1/batches/run-me/output")
        .await;
    assert_eq!(all["data"], "line 1\nline 2 ✓\n");
    assert_eq!(all["done"], true);
    // Its cluster was released: the node is free and has nothing to do.
    let (_, nodes) = s.get("/v1/nodes").await;
    assert_eq!(nodes["nodes"][0]["freeGpus"], 8, "{nodes:#}");
    let (_, after) = poll(&s, "gpu-host-1", &epoch, "", "1s").await;
    assert_eq!(after["assignments"], json!([]));
    // The run is in the metrics: once each (this server ran nothing else).
    let text = s.scrape().await;
    for series in [
        "flexq_agent_reports_total{event=\"FINISHED\"}",
        "flexq_batch_start_seconds_count",
        "flexq_batch_run_seconds_count{state=\"FAILED\"}",
        "flexq_batches_ended_total{reason=\"work_failed\"}",
    ] {
        assert_eq!(sample(&text, series), Some(1.0), "{series}");
    }
    // A report after the end is refused.
    let (st, _) = post(
        &s,
        "/v1/nodes/gpu-host-1:report",
        &report(json!({"event": "FINISHED", "succeeded": true, "message": "again"})),
    )
    .await;
    assert_eq!(st, 400);
}

#[tokio::test]
async fn an_agent_that_restarts_without_its_work_fails_the_batch_it_ran() {
    let s = server_with_lease(Duration::from_secs(30)).await;
    let epoch = register(&s, "gpu-host-1").await;
    let (st, _) = s
        .create(
            "batchId=was-running",
            &flex_with("spark.executor.instances", "2"),
        )
        .await;
    assert_eq!(st, 200);
    let (_, answer) = poll(&s, "gpu-host-1", &epoch, "", "5s").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut answer = answer;
    while answer["assignments"]
        .as_array()
        .is_none_or(|a| a.is_empty())
    {
        assert!(Instant::now() < deadline, "allocated");
        let v = answer["version"].as_str().unwrap_or_default().to_string();
        answer = poll(&s, "gpu-host-1", &epoch, &v, "2s").await.1;
    }
    let uuid = answer["assignments"][0]["uuid"]
        .as_str()
        .expect("uuid")
        .to_string();
    let (st, _) = post(
        &s,
        "/v1/nodes/gpu-host-1:report",
        &json!({"epoch": epoch, "uuid": uuid, "event": "DRIVER_STARTED", "rapids": "enabled"}),
    )
    .await;
    let (_, b) = s
        .get("/v1/projects/demo/locations/us-central1/batches/was-running")
        .await;
    assert_eq!(st, 200, "{b:#}");
    // The agent restarts and says it runs nothing.
    let new_epoch = register(&s, "gpu-host-1").await;
    let (_, b) = s
        .get("/v1/projects/demo/locations/us-central1/batches/was-running")
        .await;
    assert_eq!(b["state"], "FAILED", "{b:#}");
    assert!(
        b["stateMessage"].as_str().expect("m").contains("restarted"),
        "{b:#}"
    );
    let (_, after) = poll(&s, "gpu-host-1", &new_epoch, "", "1s").await;
    assert_eq!(after["assignments"], json!([]));
    let (st, err) = poll(&s, "gpu-host-1", &epoch, "", "1s").await;
    assert_status(st, &err, 409, "ABORTED");
}
