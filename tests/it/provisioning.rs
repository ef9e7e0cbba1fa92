//! Provisioned pools on a real provisioner (docs/rules.md#provisioned-capacity):
//! `examples/provisioner/fake-cloud.py` is the pool's resume program, which
//! starts real `flexq agent` processes on loopback with FAKE GPUs, one per
//! slot, and its suspend program, which stops them by pid; its fault flags
//! make it fail slots, boot slowly, hang or print garbage. Checked: a set
//! is all or nothing (no node of a failed set left running, the batch
//! still queued at its place), a batch is allocated once every node
//! registered, and idle nodes go back within `suspend_after` plus a pass,
//! never while they hold a part.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{TestServer, flex_with, flexq_bin, no_virtual_nodes, poll, provisioned};

const BATCHES: &str = "/v1/projects/demo/locations/us-central1/batches";
const ZONE: &str = "us-central1-b";

/// The fake cloud's script.
pub(crate) fn fake_cloud() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/provisioner/fake-cloud.py")
}

/// Makes `us-central1-b`'s L4 pool the only capacity: at most 8 nodes of
/// 2 GPUs, which the fake cloud creates (with `faults`) under `state` for
/// the server named in `state/server`; `resume_timeout` to register,
/// suspended after 2 s idle, leases of 3 s.
pub(crate) fn provisioned_pool(
    c: &mut flexq::config::Config,
    state: &Path,
    faults: &[&str],
    resume_timeout: Duration,
) {
    let cloud = fake_cloud().display().to_string();
    let mut resume = vec![
        "python3".to_string(),
        cloud.clone(),
        "resume".into(),
        "--flexq".into(),
        flexq_bin().display().to_string(),
        "--server".into(),
        format!("@{}", state.join("server").display()),
        "--state".into(),
        state.display().to_string(),
    ];
    resume.extend(faults.iter().map(|f| f.to_string()));
    let suspend = vec![
        "python3".to_string(),
        cloud,
        "suspend".into(),
        "--state".into(),
        state.display().to_string(),
    ];
    std::fs::create_dir_all(state).expect("state dir");
    no_virtual_nodes(c);
    c.agents.lease_duration = Duration::from_secs(3);
    let pool = c
        .regions
        .get_mut("us-central1")
        .and_then(|r| r.zones.get_mut(ZONE))
        .and_then(|z| z.node_pools.get_mut("l4"))
        .expect("the us-central1-b L4 pool");
    pool.gpus_per_node = 2;
    pool.cores = 24;
    pool.memory_mb = 98304;
    pool.local_ssd_gb = 750;
    pool.max_nodes = 8;
    pool.provisioner = Some(flexq::config::ProvisionerConfig {
        resume_program: resume,
        suspend_program: suspend,
        resume_timeout,
        suspend_timeout: Duration::from_secs(10),
        suspend_after: Duration::from_secs(2),
        min_nodes: 0,
        resume_rate: 100,
        backoff: flexq::config::BackoffConfig {
            base: Duration::from_secs(600),
            max: Duration::from_secs(600),
        },
        preempt_if_boot_over: None,
    });
}

/// A server (a process of its own: the tests read exact changes of its
/// metrics) on [`provisioned_pool`].
async fn server(state: &Path, faults: &[&str], resume_timeout: Duration) -> TestServer {
    let s = TestServer::start_process_with(|c| provisioned_pool(c, state, faults, resume_timeout))
        .await;
    std::fs::write(state.join("server"), format!("http://{}", s.addr)).expect("server file");
    s
}

/// A batch of `gpus` L4 GPUs: a driver and `gpus - 1` executors of one.
pub(crate) fn gang(gpus: u32) -> Value {
    flex_with("spark.executor.instances", &(gpus - 1).to_string())
}

/// The manifests the fake cloud was given for `command` (resumed or
/// suspended), in order.
pub(crate) fn manifests(state: &Path, command: &str) -> Vec<Value> {
    std::fs::read_to_string(state.join(format!("{command}.jsonl")))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a manifest"))
        .collect()
}

/// The pids of the agents the fake cloud started and has not stopped.
fn running_pids(state: &Path) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(state).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(slot) = name.strip_suffix(".pid") {
            if let Some(pid) = std::fs::read_to_string(entry.path())
                .ok()
                .and_then(|p| p.trim().parse().ok())
            {
                out.push((slot.to_string(), pid));
            }
        }
    }
    out.sort();
    out
}

/// Stops, when dropped, every agent the fake cloud under its directory
/// still runs: a test that fails midway leaves no agent behind.
pub(crate) struct Agents(pub(crate) PathBuf);

impl Drop for Agents {
    fn drop(&mut self) {
        // Each agent's session: its Spark processes have process groups
        // of their own.
        for (_, pid) in running_pids(&self.0) {
            let _ = std::process::Command::new("pkill")
                .args(["-9", "-s", &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// Whether a process (or its session) is alive.
fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

async fn batch(s: &TestServer, id: &str) -> Value {
    s.get(&format!("{BATCHES}/{id}")).await.1
}

fn history(b: &Value) -> String {
    b["stateHistory"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| h["stateMessage"].as_str().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A set whose program fails some slots, or whose nodes never register
/// in time, is suspended whole: within the resume timeout plus the
/// suspend timeout no node of it runs, none is registered, and the
/// batch is PENDING at its place, its history saying why.
async fn all_or_nothing(faults: &[&str], says: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("cloud");
    let resume_timeout = Duration::from_secs(6);
    let _agents = Agents(state.clone());
    let s = server(&state, faults, resume_timeout).await;
    let (st, body) = s.create("batchId=gang", &gang(16)).await;
    assert_eq!(st, 200, "{body:#}");
    let (st, _) = s.create("batchId=behind", &gang(3)).await;
    assert_eq!(st, 200);
    let started = Instant::now();
    // The program is asked for the 8 nodes the 16 GPUs need, once.
    let asked = poll(
        Duration::from_secs(10),
        || async { manifests(&state, "resumed") },
        |m| !m.is_empty(),
    )
    .await
    .expect("the resume program ran");
    assert_eq!(asked[0]["batch"], "gang");
    let slots: Vec<String> = asked[0]["slots"]
        .as_array()
        .expect("slots")
        .iter()
        .map(|v| v.as_str().expect("slot").to_string())
        .collect();
    assert_eq!(slots.len(), 8, "{asked:#?}");
    assert_eq!(asked[0]["shape"]["gpus"], 2);
    if faults.contains(&"--boot-delay") {
        // While the nodes boot, why-pending says how far the set is.
        let b = batch(&s, "gang").await;
        let reasons = b["flexq"]["notAdmitted"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            reasons.iter().any(|r| r["reason"] == "PROVISIONING"
                && r["message"].as_str().unwrap_or_default().starts_with(
                    "provisioning 8 nodes in us-central1-b (pool l4): 0 of 8 registered, "
                )),
            "{b:#}"
        );
    }
    // Every node of the set is suspended, and stopped.
    let suspended = poll(
        resume_timeout + Duration::from_secs(10),
        || async { manifests(&state, "suspended") },
        |m| !m.is_empty(),
    )
    .await
    .expect("the set was suspended");
    let mut gone: Vec<String> = suspended[0]["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|v| v.as_str().expect("node").to_string())
        .collect();
    gone.sort();
    let mut all = slots.clone();
    all.sort();
    assert_eq!(gone, all, "every slot is suspended, registered or not");
    assert_eq!(suspended[0]["reason"], "failed");
    let left = poll(
        Duration::from_secs(10),
        || async { running_pids(&state) },
        |p| p.is_empty(),
    )
    .await;
    assert!(left.is_ok(), "nodes left running: {left:?}");
    assert!(
        started.elapsed() < resume_timeout + Duration::from_secs(10) + Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    let nodes = poll(
        Duration::from_secs(5),
        || async { s.get("/v1/nodes").await.1 },
        |n| n["nodes"].as_array().is_none_or(Vec::is_empty),
    )
    .await;
    assert!(nodes.is_ok(), "still registered: {nodes:?}");
    // The batch waits at its place, saying what happened.
    let b = batch(&s, "gang").await;
    assert_eq!(b["state"], "PENDING", "{b:#}");
    assert_eq!(b["flexq"]["queuePosition"], 1, "{b:#}");
    let h = history(&b);
    assert!(
        h.contains("Provisioning 8 nodes in us-central1-b (pool l4) for this batch"),
        "{h}"
    );
    assert!(
        h.contains("Provisioning 8 nodes in us-central1-b (pool l4) failed")
            && h.contains(says)
            && h.contains("The batch stays queued at its place"),
        "{h}"
    );
    // The pool backs off: not asked again for either batch.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(manifests(&state, "resumed").len(), 1);
    assert_eq!(batch(&s, "behind").await["state"], "PENDING");
    let metrics = s.scrape().await;
    assert!(
        metrics.contains(
            "flexq_provisioning_sets_total{outcome=\"failed\",pool=\"l4\",region=\"us-central1\",zone=\"us-central1-b\"} 1"
        ),
        "{metrics}"
    );
    dir
}

#[tokio::test]
async fn one_of_eight_slots_failing_suspends_the_whole_set_and_the_batch_stays_queued() {
    all_or_nothing(
        &["--fail", "1"],
        "stock-out: us-central1-b-l4-7 could not be created",
    )
    .await;
}

#[tokio::test]
async fn a_slow_boot_past_the_resume_timeout_suspends_the_whole_set() {
    all_or_nothing(&["--boot-delay", "30"], "0 of 8 nodes registered within 6s").await;
}

#[tokio::test]
async fn a_program_that_prints_garbage_and_starts_nothing_times_out() {
    all_or_nothing(&["--garbage"], "0 of 8 nodes registered within 6s").await;
}

#[tokio::test]
async fn a_hanging_program_is_killed_and_its_set_suspended() {
    let dir = all_or_nothing(&["--hang"], "within").await;
    // Its resume program was killed at the timeout.
    let state = dir.path().join("cloud");
    let left = poll(
        Duration::from_secs(5),
        || async { programs_of(&state) },
        Vec::is_empty,
    )
    .await;
    assert!(left.is_ok(), "still running: {left:?}");
}

/// The fake cloud's programs running for `state`, by pid.
fn programs_of(state: &Path) -> Vec<i32> {
    let mark = state.display().to_string();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| alive(*pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("fake-cloud.py") && c.contains(&mark)
            })
        })
        .collect()
}

/// Every node registers: the batch is allocated on them at once; once it
/// ends, they are idle, and suspended within `suspend_after` and a pass,
/// never while they hold its parts; the pool is then empty.
#[tokio::test]
async fn a_gang_gets_new_nodes_and_they_go_back_once_idle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("cloud");
    let _agents = Agents(state.clone());
    let s = server(&state, &[], Duration::from_secs(60)).await;
    let (st, _) = s.create("batchId=two-nodes", &gang(4)).await;
    assert_eq!(st, 200);
    let b = poll(
        Duration::from_secs(30),
        || async { batch(&s, "two-nodes").await },
        provisioned,
    )
    .await
    .expect("allocated on its new nodes");
    let mut nodes: Vec<&str> = b["flexq"]["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["node"].as_str())
        .collect();
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes, ["us-central1-b-l4-0", "us-central1-b-l4-1"], "{b:#}");
    let h = history(&b);
    assert!(h.contains("Provisioning 2 nodes in us-central1-b"), "{h}");
    let pool = [
        ("region", "us-central1"),
        ("zone", "us-central1-b"),
        ("pool", "l4"),
    ];
    let in_state = |text: &str, state: &str| {
        let mut labels = pool.to_vec();
        labels.push(("state", state));
        crate::metrics::value(text, "flexq_provisioned_nodes", &labels)
    };
    let text = s.scrape().await;
    assert_eq!(in_state(&text, "in_use"), Some(2.0), "{text}");
    assert_eq!(in_state(&text, "provisioning"), Some(0.0), "{text}");
    // Held: not suspended, however long past suspend_after.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let b = batch(&s, "two-nodes").await;
    if !["SUCCEEDED", "FAILED", "CANCELLED"].contains(&b["state"].as_str().unwrap_or_default()) {
        assert!(
            manifests(&state, "suspended").is_empty(),
            "suspended while held: {b:#}"
        );
        s.cancel(&b).await;
    }
    let ended = poll(
        Duration::from_secs(30),
        || async { batch(&s, "two-nodes").await },
        |b| ["SUCCEEDED", "FAILED", "CANCELLED"].contains(&b["state"].as_str().unwrap_or_default()),
    )
    .await
    .expect("the batch ended");
    let ended_at = Instant::now();
    // Idle, then suspended: `nodes list` shows both.
    let seen = poll(
        Duration::from_secs(10),
        || async { s.get("/v1/nodes").await.1 },
        |n| {
            n["nodes"]
                .as_array()
                .is_some_and(|all| all.iter().any(|n| n["state"] == "IDLE"))
        },
    )
    .await;
    assert!(seen.is_ok(), "no node shown IDLE: {seen:?}");
    let suspended = poll(
        Duration::from_secs(15),
        || async { manifests(&state, "suspended") },
        |m| !m.is_empty(),
    )
    .await
    .unwrap_or_else(|_| panic!("never suspended after {ended:#}"));
    // suspend_after (2 s), the pass that notices the idle nodes, and the
    // report of the batch's end that the poll above waited for.
    assert!(
        ended_at.elapsed() < Duration::from_secs(5),
        "suspended {:?} after the batch ended",
        ended_at.elapsed()
    );
    let mut gone: Vec<&str> = suspended
        .iter()
        .flat_map(|m| m["nodes"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    gone.sort();
    assert_eq!(gone, ["us-central1-b-l4-0", "us-central1-b-l4-1"]);
    assert_eq!(suspended[0]["reason"], "idle");
    let nodes = poll(
        Duration::from_secs(10),
        || async { s.get("/v1/nodes").await.1 },
        |n| n["nodes"].as_array().is_none_or(Vec::is_empty),
    )
    .await;
    assert!(nodes.is_ok(), "the pool is not empty: {nodes:?}");
    assert!(
        running_pids(&state).is_empty(),
        "{:?}",
        running_pids(&state)
    );
    let metrics = s.scrape().await;
    for series in [
        "flexq_provisioning_sets_total{outcome=\"allocated\",pool=\"l4\",region=\"us-central1\",zone=\"us-central1-b\"} 1",
        "flexq_nodes_suspended_total{outcome=\"ok\",pool=\"l4\",reason=\"idle\",region=\"us-central1\",zone=\"us-central1-b\"} 2",
    ] {
        assert!(metrics.contains(series), "{series}: {metrics}");
    }
    // Both nodes idle from the pass after the end to their suspension:
    // suspend_after (2 s) each, and at most a pass and the report more.
    let idle = crate::metrics::value(&metrics, "flexq_provisioned_idle_node_seconds_total", &pool)
        .expect("idle node-seconds");
    assert!((3.9..12.0).contains(&idle), "idle node-seconds {idle}");
    for state in ["in_use", "idle", "suspending", "provisioning"] {
        assert_eq!(in_state(&metrics, state), Some(0.0), "{state}: {metrics}");
    }
    // The pool's boot time is kept: after a SIGKILL and a restart, a new
    // set's start is estimated at its decision plus that boot (seconds
    // here), not plus resume_timeout (60 s) as for a pool never seen.
    let mut s = s;
    s.restart_process().await;
    std::fs::write(state.join("server"), format!("http://{}", s.addr)).expect("server file");
    let (st, _) = s.create("batchId=after-restart", &gang(4)).await;
    assert_eq!(st, 200);
    let b = poll(
        Duration::from_secs(10),
        || async { batch(&s, "after-restart").await },
        |b| b["flexq"]["estimatedStartTime"].is_string(),
    )
    .await
    .expect("a start estimate");
    let time = |v: &Value| {
        chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap_or_default()).expect("a time")
    };
    let estimate = time(&b["flexq"]["estimatedStartTime"]) - time(&b["createTime"]);
    assert!(
        estimate < chrono::Duration::seconds(20),
        "estimated {estimate} after its create: {b:#}"
    );
    s.cancel(&b).await;
}

/// The fake cloud stops each agent 4 s after it starts
/// (`--exit-after-register`): the nodes register and the batch is
/// allocated on them, then their leases (3 s) expire. Each is lost as any
/// node is, and its machine is suspended too (reason `lost`), so the
/// cloud deletes what it left of it; nothing the cloud started is left.
#[tokio::test]
async fn agents_that_exit_after_registering_are_lost_and_their_machines_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("cloud");
    let _agents = Agents(state.clone());
    let s = server(
        &state,
        &["--exit-after-register", "4"],
        Duration::from_secs(60),
    )
    .await;
    // A job that runs for a minute: its cluster holds the nodes (they are
    // not idle) when their agents go.
    let job = dir.path().join("sleeps.py");
    std::fs::write(&job, "import time\ntime.sleep(60)\n").expect("job");
    let mut b = gang(4);
    b["pysparkBatch"]["mainPythonFileUri"] = format!("file://{}", job.display()).into();
    let (st, _) = s.create("batchId=short-lived", &b).await;
    assert_eq!(st, 200);
    let lost_nodes = |m: &Vec<Value>| {
        let mut nodes: Vec<String> = m
            .iter()
            .filter(|m| m["reason"] == "lost")
            .flat_map(|m| m["nodes"].as_array().cloned().unwrap_or_default())
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes
    };
    let suspended = poll(
        Duration::from_secs(30),
        || async { manifests(&state, "suspended") },
        |m| lost_nodes(m).len() >= 2,
    )
    .await
    .unwrap_or_else(|m| panic!("no lost node suspended: {m:#?}"));
    assert_eq!(
        lost_nodes(&suspended)[..2],
        ["us-central1-b-l4-0", "us-central1-b-l4-1"]
    );
    let b = batch(&s, "short-lived").await;
    let h = history(&b);
    assert!(h.contains("was lost"), "{h}");
    if !["SUCCEEDED", "FAILED", "CANCELLED"].contains(&b["state"].as_str().unwrap_or_default()) {
        s.cancel(&b).await;
    }
    // Every agent's session the cloud started is gone: the lost ones by
    // their suspension, any later set's by its own.
    let left = poll(
        Duration::from_secs(30),
        || async { running_pids(&state) },
        Vec::is_empty,
    )
    .await;
    assert!(left.is_ok(), "left running: {left:?}");
    // Nor anything they started: the killed agents' Spark processes went
    // with their machines.
    let path = dir.path().display().to_string();
    let stray = poll(
        Duration::from_secs(15),
        || async {
            let out = std::process::Command::new("pgrep")
                .args(["-f", &path])
                .output()
                .expect("pgrep");
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        },
        String::is_empty,
    )
    .await;
    assert!(
        stray.is_ok(),
        "processes of the deleted machines left: {stray:?}"
    );
    // Counted once each suspend program has ended (the cloud removes its
    // pid files just before it exits).
    let lost = |text: &String| {
        crate::metrics::value(
            text,
            "flexq_nodes_suspended_total",
            &[("reason", "lost"), ("outcome", "ok"), ("pool", "l4")],
        )
        .unwrap_or(0.0)
    };
    let metrics = poll(
        Duration::from_secs(10),
        || async { s.scrape().await },
        |m| lost(m) >= 2.0,
    )
    .await;
    assert!(metrics.is_ok(), "{metrics:?}");
}
