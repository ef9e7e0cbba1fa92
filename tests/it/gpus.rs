//! GPU telemetry through the agent protocol (docs/rules.md#gpu-telemetry):
//! this test acts as a node's agent and uploads what its GPUs did; the
//! batch, the metrics and the refusals say what was taken. (The agent's
//! own sampling, on a fake `nvidia-smi`, is in `spark.rs`.)

use flexq::config::Config;
use flexq::gpu::{IdleAction, IdlePolicy};
use serde_json::{Value, json};

use crate::support::{TestServer, assert_status, flex_with, no_virtual_nodes, until};

const BATCHES: &str = "/v1/projects/demo/locations/us-central1/batches";

fn point(t: &str, utilization: f64, max: f64, memory: u64) -> Value {
    json!({
        "time": t, "seconds": 5.0, "gpus": 5,
        "utilizationPercent": utilization, "maxUtilizationPercent": max,
        "maxMemoryUsedMb": memory
    })
}

/// The project of the test that sums GPU points: the GPU counters are the
/// test process's, and their series of this project are this test's alone.
const SAMPLED_PROJECT: &str = "gpu-points-sum-up";

#[tokio::test]
async fn an_agents_gpu_points_sum_up_in_the_batch_and_bad_ones_are_refused() {
    let s = TestServer::start_with(|c| {
        no_virtual_nodes(c);
        c.agents.lease_duration = std::time::Duration::from_secs(60);
    })
    .await;
    let batches = format!("/v1/projects/{SAMPLED_PROJECT}/locations/us-central1/batches");
    let epoch = crate::agents::register(&s, "gpu-host-1").await;
    // 1 driver + 4 executors: 5 GPUs, all on the one node.
    let (status, body) = s
        .post_json(
            &format!("{batches}?batchId=sampled"),
            &flex_with("spark.executor.instances", "4"),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    let b = until(&s, &format!("{batches}/sampled"), "provisioned", |b| {
        b["flexq"]["provisioningState"] == "PROVISIONED"
    })
    .await;
    let uuid = b["uuid"].as_str().expect("uuid").to_string();

    // Two busy points and an idle one (each 5 GPUs × 5 s).
    let upload =
        |points: Vec<Value>| json!({"epoch": epoch, "batches": [{"uuid": uuid, "points": points}]});
    let points = vec![
        point("2026-12-03T10:00:05Z", 80.0, 90.0, 20_000),
        point("2026-12-03T10:00:10Z", 80.0, 95.0, 21_000),
        point("2026-12-03T10:00:15Z", 1.0, 2.0, 21_000),
    ];
    let (status, answer) = s
        .post_json("/v1/nodes/gpu-host-1:telemetry", &upload(points.clone()))
        .await;
    assert_eq!(status, 200, "{answer:#}");
    assert_eq!(answer["taken"], 3, "{answer:#}");
    let (_, b) = s.get(&format!("{batches}/sampled")).await;
    let g = &b["runtimeInfo"]["gpuUtilization"];
    // (80 × 50 + 1 × 25) ÷ 75 GPU-seconds.
    assert_eq!(g["meanPercent"], 53.7, "{b:#}");
    assert_eq!(g["p95Percent"], 85.0, "{b:#}");
    assert_eq!(g["peakMemoryMb"], 21_000, "{b:#}");
    // 25 idle GPU-seconds over the cluster's 5 GPUs.
    assert_eq!(g["idleSeconds"], 5.0, "{b:#}");
    assert_eq!(g["sampledGpuSeconds"], 75.0, "{b:#}");

    // A retried upload is taken once.
    let (status, answer) = s
        .post_json("/v1/nodes/gpu-host-1:telemetry", &upload(points))
        .await;
    assert_eq!(
        (status, answer["taken"].as_u64()),
        (200, Some(0)),
        "{answer:#}"
    );
    let (_, again) = s.get(&format!("{batches}/sampled")).await;
    assert_eq!(again["runtimeInfo"]["gpuUtilization"], *g);

    // Over time, for the batch page's chart: 10 s slots from 10:00:00; the
    // retried points are not in it twice.
    let (status, chart) = s.get(&format!("{batches}/sampled/gpuUtilization")).await;
    assert_eq!(status, 200, "{chart:#}");
    assert_eq!(
        chart,
        json!({"stepSeconds": 10, "points": [
            {"time": "2026-12-03T10:00:00Z", "meanPercent": 80.0, "maxPercent": 90.0, "peakMemoryMb": 20_000},
            // (80 × 25 + 1 × 25) ÷ 50 GPU-seconds.
            {"time": "2026-12-03T10:00:10Z", "meanPercent": 40.5, "maxPercent": 95.0, "peakMemoryMb": 21_000}
        ]}),
    );
    let (status, err) = s.get(&format!("{batches}/nobody/gpuUtilization")).await;
    assert_status(status, &err, 404, "NOT_FOUND");

    // The metrics took each point once (the retry added nothing): 75
    // GPU-seconds sampled, 25 of them idle.
    let text = s.scrape().await;
    let labels = [("region", "us-central1"), ("project", SAMPLED_PROJECT)];
    assert_eq!(
        crate::metrics::value(&text, "flexq_gpu_sampled_seconds_total", &labels),
        Some(75.0),
        "{text}"
    );
    assert_eq!(
        crate::metrics::value(&text, "flexq_gpu_idle_seconds_total", &labels),
        Some(25.0),
        "{text}"
    );
    assert_eq!(
        crate::metrics::value(&text, "flexq_gpu_utilization_percent_count", &labels),
        Some(3.0),
        "{text}"
    );

    // Another node holds no part of it: its points are not taken.
    let other = crate::agents::register(&s, "gpu-host-2").await;
    let mut foreign = upload(vec![point("2026-12-03T10:00:20Z", 50.0, 50.0, 1)]);
    foreign["epoch"] = json!(other);
    let (status, answer) = s
        .post_json("/v1/nodes/gpu-host-2:telemetry", &foreign)
        .await;
    assert_eq!(status, 200, "{answer:#}");
    assert_eq!(answer["taken"], 0, "{answer:#}");
    assert!(
        answer["refused"][0]
            .as_str()
            .is_some_and(|r| r.contains("holds no part of batch")),
        "{answer:#}"
    );

    // Bad input is refused whole, naming the field and the value.
    let (status, err) = s
        .post_json(
            "/v1/nodes/gpu-host-1:telemetry",
            &upload(vec![point("2026-12-03T10:00:25Z", 150.0, 150.0, 1)]),
        )
        .await;
    assert_status(status, &err, 400, "INVALID_ARGUMENT");
    let message = err["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("batches[0].points[0].utilizationPercent") && message.contains("150"),
        "{err:#}"
    );
    let mut unknown = upload(vec![]);
    unknown["batches"][0]["temperature"] = json!(80);
    let (status, err) = s
        .post_json("/v1/nodes/gpu-host-1:telemetry", &unknown)
        .await;
    assert_status(status, &err, 400, "INVALID_ARGUMENT");
    let too_many: Vec<Value> = (0..65)
        .map(|i| point(&format!("2026-12-03T11:{:02}:00Z", i % 60), 50.0, 50.0, 1))
        .collect();
    let (status, err) = s
        .post_json("/v1/nodes/gpu-host-1:telemetry", &upload(too_many))
        .await;
    assert_status(status, &err, 400, "INVALID_ARGUMENT");
    // A stale epoch is refused as every agent call's.
    let mut stale = upload(vec![]);
    let wrong = epoch.parse::<u64>().expect("epoch") + 1000;
    stale["epoch"] = json!(wrong.to_string());
    let (status, _) = s.post_json("/v1/nodes/gpu-host-1:telemetry", &stale).await;
    assert!(status == 400 || status == 409, "{status}");
}

/// A GPU idle policy of `action` after 2 s, no warm-up; capacity only
/// from agents, whose lease is a minute.
fn idle_policy(action: IdleAction) -> impl FnOnce(&mut Config) {
    move |c| {
        no_virtual_nodes(c);
        c.agents.lease_duration = std::time::Duration::from_secs(60);
        c.gpu_idle = IdlePolicy {
            action,
            below_percent: 10.0,
            after: std::time::Duration::from_secs(2),
            warm_up: std::time::Duration::ZERO,
        };
    }
}

/// A server whose GPU idle policy is `action` after 2 s, no warm-up; one
/// agent's node (this test) runs a 5-GPU batch `id`, its driver started.
/// Answers the server, the node's epoch and the batch's uuid.
async fn idle_case(action: IdleAction, id: &str) -> (TestServer, String, String) {
    idle_batch(TestServer::start_with(idle_policy(action)).await, id).await
}

/// On `s`, one agent's node (this test) runs a 5-GPU batch `id`, its
/// driver started. Answers the server, the node's epoch and the batch's
/// uuid.
async fn idle_batch(s: TestServer, id: &str) -> (TestServer, String, String) {
    let epoch = crate::agents::register(&s, "gpu-host-1").await;
    let (status, body) = s
        .create(
            &format!("batchId={id}"),
            &flex_with("spark.executor.instances", "4"),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    let b = until(&s, &format!("{BATCHES}/{id}"), "provisioned", |b| {
        b["flexq"]["provisioningState"] == "PROVISIONED"
    })
    .await;
    let uuid = b["uuid"].as_str().expect("uuid").to_string();
    let (status, body) = s
        .post_json(
            "/v1/nodes/gpu-host-1:report",
            &json!({"epoch": epoch, "uuid": uuid, "event": "DRIVER_STARTED", "rapids": "enabled"}),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    (s, epoch, uuid)
}

/// Idle points (8 %, under the policy's 10 %) from 1 s after `from`, one a
/// second, up to `seconds`: uploaded once that much time has passed.
async fn idle_for(
    s: &TestServer,
    epoch: &str,
    uuid: &str,
    from: chrono::DateTime<chrono::Utc>,
    seconds: i64,
) {
    let points = points_at(from, 1..=seconds, 8.0).await;
    upload_from(s, "gpu-host-1", epoch, uuid, &points).await;
}

/// Points of 5 GPUs at `percent`, one a second, at `from` + each of
/// `seconds`; answered once the last of them is past.
async fn points_at(
    from: chrono::DateTime<chrono::Utc>,
    seconds: std::ops::RangeInclusive<i64>,
    percent: f64,
) -> Vec<Value> {
    while chrono::Utc::now() < from + chrono::Duration::seconds(*seconds.end()) {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    seconds
        .map(|k| {
            let t = (from + chrono::Duration::seconds(k)).to_rfc3339();
            json!({"time": t, "seconds": 1.0, "gpus": 5, "utilizationPercent": percent,
                   "maxUtilizationPercent": percent, "maxMemoryUsedMb": 100})
        })
        .collect()
}

async fn upload_from(s: &TestServer, node: &str, epoch: &str, uuid: &str, points: &[Value]) {
    let (status, answer) = s
        .post_json(
            &format!("/v1/nodes/{node}:telemetry"),
            &json!({"epoch": epoch, "batches": [{"uuid": uuid, "points": points}]}),
        )
        .await;
    assert_eq!(status, 200, "{answer:#}");
}

/// How many entries of the batch's history (the current state's
/// included) start with `prefix`.
fn said(b: &Value, prefix: &str) -> usize {
    b["stateHistory"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h["stateMessage"].as_str())
        .filter(|m| m.starts_with(prefix))
        .count()
}

#[tokio::test]
async fn a_batch_whose_gpus_idle_is_warned_once() {
    let (s, epoch, uuid) = idle_case(IdleAction::Warn, "idler").await;
    let from = chrono::Utc::now();
    // One second idle: under the policy's 2 s, nothing said.
    idle_for(&s, &epoch, &uuid, from, 1).await;
    let (_, before) = s.get(&format!("{BATCHES}/idler")).await;
    assert_eq!(said(&before, "GPU idle warning"), 0, "{before:#}");
    idle_for(&s, &epoch, &uuid, from + chrono::Duration::seconds(1), 2).await;
    let (_, b) = s.get(&format!("{BATCHES}/idler")).await;
    assert_eq!(b["state"], "RUNNING", "{b:#}");
    // A warning is no transition: the batch is RUNNING since it started
    // (that it counts as none in the metrics is the core's unit test).
    assert_eq!(b["stateTime"], before["stateTime"], "{b:#}");
    assert_eq!(
        said(
            &b,
            "GPU idle warning: every GPU of it has been under 10% utilization for"
        ),
        1,
        "{b:#}"
    );
    // More idle time: no second warning.
    idle_for(&s, &epoch, &uuid, from + chrono::Duration::seconds(3), 1).await;
    let (_, b) = s.get(&format!("{BATCHES}/idler")).await;
    assert_eq!(said(&b, "GPU idle warning"), 1, "{b:#}");
}

#[tokio::test]
async fn a_batch_whose_gpus_idle_is_cancelled_with_a_typed_reason_when_the_policy_says_so() {
    // A process of its own: the ended counter (labelled by reason alone)
    // moves for this batch only, so its count is exact.
    let s = TestServer::start_process_with(idle_policy(IdleAction::Cancel)).await;
    let (s, epoch, uuid) = idle_batch(s, "idle-cancel").await;
    let before = crate::scheduler::ended_by_reason(&s.scrape().await);
    idle_for(&s, &epoch, &uuid, chrono::Utc::now(), 3).await;
    let (_, b) = s.get(&format!("{BATCHES}/idle-cancel")).await;
    assert_eq!(b["state"], "CANCELLING", "{b:#}");
    assert_eq!(
        said(&b, "Cancelled by the GPU idle policy: every GPU of it"),
        1,
        "{b:#}"
    );
    // Its agent is told to stop it, and says it stopped.
    let (_, answer) = crate::agents::poll(&s, "gpu-host-1", &epoch, "", "1s").await;
    let parts = answer["assignments"].as_array().expect("assignments");
    assert!(
        !parts.is_empty() && parts.iter().all(|a| a["action"] == "STOP"),
        "{answer:#}"
    );
    let (status, body) = s
        .post_json(
            "/v1/nodes/gpu-host-1:report",
            &json!({"epoch": epoch, "uuid": uuid, "event": "FINISHED", "succeeded": false,
                    "message": "stopped", "exitCode": 143}),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    let (_, b) = s.get(&format!("{BATCHES}/idle-cancel")).await;
    assert_eq!(b["state"], "CANCELLED", "{b:#}");
    assert_eq!(b["flexq"]["endReason"], "IDLE_GPUS", "{b:#}");
    let (_, op) = s
        .get(&format!("/v1/{}", b["operation"].as_str().expect("op")))
        .await;
    assert_eq!(op["error"]["code"], 1, "{op:#}");
    // Counted once, under its own reason (not also as a user's cancel).
    let after = crate::scheduler::ended_by_reason(&s.scrape().await);
    let counted: Vec<(&str, f64)> = after
        .iter()
        .map(|(reason, n)| (*reason, n - before[reason]))
        .filter(|(_, n)| *n != 0.0)
        .collect();
    assert_eq!(counted, [("idle_gpus", 1.0)], "batches ended by reason");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_uploads_judged_at_the_same_time_write_one_warning() {
    let (s, epoch, uuid) = idle_case(IdleAction::Warn, "racers").await;
    let points = points_at(chrono::Utc::now(), 1..=3, 8.0).await;
    // The same upload 8 times at once (an agent's retry racing the one it
    // retries): each judges the batch idle before any warning is stored.
    let uploads = (0..32).map(|_| upload_from(&s, "gpu-host-1", &epoch, &uuid, &points));
    futures_util::future::join_all(uploads).await;
    let (_, b) = s.get(&format!("{BATCHES}/racers")).await;
    assert_eq!(said(&b, "GPU idle warning"), 1, "{b:#}");
}

#[tokio::test]
async fn an_idle_node_cannot_declare_a_batch_idle_before_a_busy_nodes_lagging_points_arrive() {
    let s = TestServer::start_with(|c| {
        no_virtual_nodes(c);
        c.agents.lease_duration = std::time::Duration::from_secs(60);
        c.gpu_idle = IdlePolicy {
            action: IdleAction::Warn,
            below_percent: 10.0,
            after: std::time::Duration::from_secs(2),
            warm_up: std::time::Duration::ZERO,
        };
    })
    .await;
    let mut nodes = Vec::new();
    for node in ["gpu-host-1", "gpu-host-2"] {
        nodes.push((node, crate::agents::register(&s, node).await));
    }
    // A driver and 8 executors of one GPU each: 9 GPUs, more than one
    // node's 8, so both nodes hold GPUs of it.
    let (status, body) = s
        .create(
            "batchId=spread",
            &flex_with("spark.executor.instances", "8"),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    let b = until(&s, &format!("{BATCHES}/spread"), "provisioned", |b| {
        b["flexq"]["provisioningState"] == "PROVISIONED"
    })
    .await;
    let uuid = b["uuid"].as_str().expect("uuid").to_string();
    let mut driver = None;
    for (node, epoch) in &nodes {
        let (_, answer) = crate::agents::poll(&s, node, epoch, "", "1s").await;
        let parts = answer["assignments"].as_array().expect("assignments");
        assert!(!parts.is_empty(), "{node} holds a part: {answer:#}");
        if parts.iter().any(|a| a["role"] == "driver") {
            driver = Some((*node, epoch.clone()));
        }
    }
    let (driver, driver_epoch) = driver.expect("a node runs the driver");
    let (status, body) = s
        .post_json(
            &format!("/v1/nodes/{driver}:report"),
            &json!({"epoch": driver_epoch, "uuid": uuid, "event": "DRIVER_STARTED", "rapids": "enabled"}),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    let (busy, busy_epoch) = &nodes[0];
    let (idle, idle_epoch) = &nodes[1];
    let from = chrono::Utc::now();
    // The busy node has sent its first second; the idle one, 3 s.
    let first = points_at(from, 1..=1, 90.0).await;
    upload_from(&s, busy, busy_epoch, &uuid, &first).await;
    let idle_points = points_at(from, 1..=3, 1.0).await;
    upload_from(&s, idle, idle_epoch, &uuid, &idle_points).await;
    let (_, b) = s.get(&format!("{BATCHES}/spread")).await;
    assert_eq!(said(&b, "GPU idle warning"), 0, "{b:#}");
    // The busy node's lagging points arrive, idle too: now 2 s are known
    // idle on both.
    let rest = points_at(from, 2..=3, 1.0).await;
    upload_from(&s, busy, busy_epoch, &uuid, &rest).await;
    let (_, b) = s.get(&format!("{BATCHES}/spread")).await;
    assert_eq!(said(&b, "GPU idle warning"), 1, "{b:#}");
}

/// The driver's agent says what ran on the CPU: the batch shows it; a
/// node that does not run the driver, or too many reasons, is refused.
#[tokio::test]
async fn a_reported_cpu_fallback_is_shown_with_the_run() {
    let (s, epoch, uuid) = idle_case(IdleAction::Off, "fell-back").await;
    let fallback = json!({"operators": 3, "reasons": [
        "<SortExec>: not all expressions can be replaced",
        "<Concat>: input expression AttributeReference c2#4 (StringType(UNICODE) is not supported)"
    ]});
    let (status, body) = s
        .post_json(
            "/v1/nodes/gpu-host-1:report",
            &json!({"epoch": epoch, "uuid": uuid, "event": "CPU_FALLBACK", "fallback": fallback}),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    let (_, b) = s.get(&format!("{BATCHES}/fell-back")).await;
    assert_eq!(b["runtimeInfo"]["cpuFallback"], fallback, "{b:#}");
    assert_eq!(
        b["state"], "RUNNING",
        "a report that changes no state: {b:#}"
    );
    let six: Vec<String> = (0..6).map(|i| format!("<Op{i}>: why")).collect();
    let (status, err) = s
        .post_json(
            "/v1/nodes/gpu-host-1:report",
            &json!({"epoch": epoch, "uuid": uuid, "event": "CPU_FALLBACK",
                    "fallback": {"operators": 6, "reasons": six}}),
        )
        .await;
    assert_status(status, &err, 400, "INVALID_ARGUMENT");
    assert!(err.to_string().contains("fallback.reasons"), "{err:#}");
    let other = crate::agents::register(&s, "gpu-host-2").await;
    let (status, err) = s
        .post_json(
            "/v1/nodes/gpu-host-2:report",
            &json!({"epoch": other, "uuid": uuid, "event": "CPU_FALLBACK",
                    "fallback": {"operators": 1}}),
        )
        .await;
    assert_status(status, &err, 400, "FAILED_PRECONDITION");
}

/// A real `flexq agent` on a node where GPU telemetry has nothing to read:
/// NVML loaded from a library that is not there (`nvml_library`, so this
/// holds on a machine with an NVIDIA driver too) and an `nvidia-smi` that
/// is not there. It says so once, registers and serves as before,
/// and uploads nothing.
#[tokio::test]
async fn an_agent_without_nvml_or_nvidia_smi_says_so_once_and_runs_on() {
    let s = TestServer::start_with(|c| {
        no_virtual_nodes(c);
        c.agents.lease_duration = std::time::Duration::from_secs(3);
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    // A FAKE Spark home: this test runs no batch, and the agent only
    // checks that one is there.
    let spark = dir.path().join("fake-spark");
    std::fs::create_dir_all(spark.join("bin")).expect("fake spark");
    std::fs::write(
        spark.join("bin/spark-class"),
        "#!/bin/sh\n# FAKE Spark for tests\nexit 1\n",
    )
    .expect("spark-class");
    let config = crate::support::agent_config(
        &s,
        dir.path(),
        crate::support::AgentNode {
            node: "no-telemetry",
            zone: "us-central1-a",
            pool: "l4",
            cores: 8,
            memory_mb: 65536,
        },
        &format!(
            r#"advertise_host = "127.0.0.1"
gpu_telemetry = "auto"
nvidia_smi = "{missing}"
nvml_library = "{no_nvml}"
gpu_sample_interval = "100ms"
spark_home = "{spark}"
"#,
            missing = dir.path().join("no-such-nvidia-smi").display(),
            no_nvml = dir.path().join("no-such-libnvidia-ml.so.1").display(),
            spark = spark.display(),
        ),
    );
    let log = dir.path().join("agent.log");
    let mut agent = crate::support::spawn_agent(&config, &log);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (_, nodes) = s.get("/v1/nodes").await;
        let up = nodes["nodes"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| n["id"] == "no-telemetry"));
        if up {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent did not register: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Many sampling intervals and a few heartbeats later: still once, and
    // still serving (its lease of 3 s kept).
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = agent.kill();
    let _ = agent.wait();
    assert_eq!(
        text.matches("no GPU telemetry on this node").count(),
        1,
        "{text}"
    );
    assert!(
        text.contains("no-such-nvidia-smi"),
        "it names what it tried: {text}"
    );
    assert!(
        text.contains("no-such-libnvidia-ml.so.1"),
        "it names the NVML it tried: {text}"
    );
    // Its log is a file, not a terminal: plain text, no colour codes.
    assert!(!text.contains('\u{1b}'), "{text}");
    let (_, nodes) = s.get("/v1/nodes").await;
    let node = nodes["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["id"] == "no-telemetry").cloned())
        .expect("the node");
    assert_eq!(node["state"], "SCHEDULABLE", "{node:#}");
}
