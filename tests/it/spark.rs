//! The whole life of GPU batches on real Spark: a real server, three real
//! `flexq agent` processes on loopback, each with a FAKE GPU discovery
//! script (two GPU addresses, no GPU behind them), and real PySpark jobs
//! (`pip install pyspark`; Java 17).
//!
//! One test runs the scenarios in turn, to keep the machine's two cores
//! for one Spark cluster at a time: each JVM start costs seconds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{AgentNode, TestServer, agent_config, assert_status, spawn_agent};

const ZONE: &str = "us-central1-a";
const BATCHES: &str = "/v1/projects/demo/locations/us-central1/batches";

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// A `flexq agent` child process.
struct Agent {
    node: String,
    child: Child,
    config: PathBuf,
    log: PathBuf,
}

impl Agent {
    fn start(server: &TestServer, dir: &Path, node: &str) -> Agent {
        Agent::start_in(server, dir, node, ZONE, "l4", 8, 65536)
    }

    /// An agent of pool `pool` in `zone` whose node has `cores` and
    /// `memory_mb` (declared: Spark's standalone worker takes them as
    /// given).
    fn start_in(
        server: &TestServer,
        dir: &Path,
        node: &str,
        zone: &str,
        pool: &str,
        cores: u32,
        memory_mb: u64,
    ) -> Agent {
        let work = dir.join(node);
        std::fs::create_dir_all(&work).expect("agent dir");
        // A FAKE GPU (`agent_config`): the discovery script names two
        // addresses; no GPU is behind them. Spark's resource scheduling is
        // real all the same.
        // A FAKE nvidia-smi for GPU telemetry: both fake GPUs at 42 %, or
        // at what the file `utilization` beside it says
        // (`Agent::set_utilization`).
        let smi = work.join("fake-nvidia-smi");
        std::fs::write(
            &smi,
            "#!/bin/sh\n# FAKE nvidia-smi for tests (no hardware): query mode only.\n\
             u=$(cat \"$(dirname \"$0\")/utilization\" 2>/dev/null || echo 42)\n\
             printf '0, %s, 1000\\n1, %s, 1500\\n' \"$u\" \"$u\"\n",
        )
        .expect("fake nvidia-smi");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let config = agent_config(
            server,
            &work,
            AgentNode {
                node,
                zone,
                pool,
                cores,
                memory_mb,
            },
            &format!(
                r#"advertise_host = "127.0.0.1"
rapids_jar = "{work}/no-rapids.jar"
stop_grace = "3s"
poll_wait = "20s"
gpu_telemetry = "nvidia-smi"
nvidia_smi = "{smi}"
gpu_sample_interval = "500ms"
"#,
                smi = smi.display(),
                work = work.join("work").display(),
            ),
        );
        let log = work.join("agent.log");
        Agent {
            node: node.to_string(),
            child: spawn_agent(&config, &log),
            config,
            log,
        }
    }

    /// What its FAKE GPUs report as their utilization from now on.
    fn set_utilization(&self, percent: u32) {
        let dir = self.config.parent().expect("agent dir");
        std::fs::write(dir.join("utilization"), percent.to_string()).expect("utilization");
    }

    /// Starts the agent again after a kill.
    fn restart(&mut self) {
        self.child = spawn_agent(&self.config, &self.log);
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "agent {} did not stop on SIGTERM",
                self.node
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.terminate_quietly();
    }
}

impl Agent {
    fn terminate_quietly(&mut self) -> Option<()> {
        if self.child.try_wait().ok()?.is_none() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            for _ in 0..100 {
                if self.child.try_wait().ok()?.is_some() {
                    return Some(());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
        }
        Some(())
    }
}

/// Processes whose environment carries FLEXQ_BATCH_UUID=uuid.
fn processes_of(uuid: &str) -> Vec<u32> {
    let needle = format!("FLEXQ_BATCH_UUID={uuid}");
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// Waits until no process of batch `uuid` is left.
async fn all_gone(uuid: &str, limit: Duration) {
    let started = Instant::now();
    loop {
        let left = processes_of(uuid);
        if left.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "processes of batch {uuid} remain after {limit:?}: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The executor indices of batch `uuid` whose Spark executor finished a
/// task, from the executors' own logs
/// (`…/{uuid}/executor-N/work/app-…/ID/stderr`) under `root`.
fn executors_that_finished_a_task(root: &Path, uuid: &str) -> std::collections::BTreeSet<u32> {
    let mut out = std::collections::BTreeSet::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = path.to_string_lossy().to_string();
            if !text.ends_with("/stderr") || !text.contains(uuid) {
                continue;
            }
            let Some(index) = text
                .split_once("/executor-")
                .and_then(|(_, rest)| rest.split('/').next())
                .and_then(|i| i.parse::<u32>().ok())
            else {
                continue;
            };
            let log = std::fs::read_to_string(&path).unwrap_or_default();
            if log.contains("Finished task") {
                out.insert(index);
            }
        }
    }
    out
}

fn gpu_batch(file: &str, args: &[&str], extra: &[(&str, &str)]) -> Value {
    let mut props = json!({
        "spark.dataproc.executor.resource.accelerator.type": "l4",
        "spark.dataproc.executor.compute.tier": "premium",
        "spark.dataproc.executor.disk.tier": "premium",
        // Small JVMs: the machine runs several at once.
        "spark.executor.memory": "1024m",
        "spark.driver.memory": "1024m",
        "spark.ui.enabled": "false",
    });
    for (k, v) in extra {
        props[*k] = json!(v);
    }
    json!({
        "pysparkBatch": {
            "mainPythonFileUri": examples().join(file).display().to_string(),
            "args": args,
        },
        "runtimeConfig": {"version": "3.0", "properties": props},
    })
}

async fn batch(s: &TestServer, id: &str) -> Value {
    let (st, b) = s.get(&format!("{BATCHES}/{id}")).await;
    assert_eq!(st, 200, "{b:#}");
    b
}

/// Polls batch `id` until `done` holds; panics with the batch and the
/// agents' logs after `limit`.
async fn until(
    s: &TestServer,
    id: &str,
    what: &str,
    limit: Duration,
    agents: &[Agent],
    done: impl Fn(&Value) -> bool,
) -> Value {
    let b = match crate::support::poll(limit, || batch(s, id), done).await {
        Ok(b) => return b,
        Err(b) => b,
    };
    let logs: Vec<String> = agents
        .iter()
        .map(|a| {
            let text = std::fs::read_to_string(&a.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            format!(
                "--- {} ---\n{}",
                a.node,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect();
    panic!(
        "batch {id} not {what} within {limit:?}: {b:#}\n{}",
        logs.join("\n")
    );
}

/// `marker` (sleeps.py's) says the `who`'s driver got SIGTERM before
/// batch `b` was allocated.
fn signalled_before_allocation(marker: &Path, who: &str, b: &Value) {
    let sigterm = std::fs::read_to_string(marker).unwrap_or_default();
    let signalled: f64 = sigterm
        .strip_prefix("sigterm ")
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("the {who}'s driver got no SIGTERM: {sigterm:?}"));
    let allocated = chrono::DateTime::parse_from_rfc3339(
        b["flexq"]["allocateTime"].as_str().expect("allocateTime"),
    )
    .expect("RFC 3339")
    .timestamp_millis() as f64
        / 1000.0;
    assert!(
        signalled < allocated,
        "SIGTERM to the {who} at {signalled}, {} allocated at {allocated}",
        b["name"]
    );
}

/// The node that runs batch `b`'s driver.
fn driver_of(b: &Value) -> String {
    b["flexq"]["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|p| p["role"] == "driver")
        .and_then(|p| p["node"].as_str())
        .expect("driver node")
        .to_string()
}

/// The agent of `node`.
fn agent_of<'a>(agents: &'a mut [Agent], node: &str) -> &'a mut Agent {
    agents.iter_mut().find(|a| a.node == node).expect("agent")
}

async fn output(s: &TestServer, id: &str) -> String {
    let (st, out) = s.get(&format!("{BATCHES}/{id}/output")).await;
    assert_eq!(st, 200, "{out:#}");
    out["data"].as_str().expect("data").to_string()
}

async fn node(s: &TestServer, id: &str) -> Option<Value> {
    let (_, nodes) = s.get("/v1/nodes").await;
    nodes["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["id"] == id)
        .cloned()
}

fn pyspark_available() -> bool {
    Command::new("python3")
        .args(["-c", "import pyspark"])
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_batches_run_on_real_spark_with_exactly_their_gpus() {
    assert!(
        pyspark_available(),
        "these tests run real Spark: pip install pyspark (.ci/run does)"
    );
    let s = TestServer::start_with(|c| {
        crate::support::no_virtual_nodes(c);
        c.agents.lease_duration = Duration::from_secs(3);
        // A batch may name A100-40s as its placement alternative.
        // Scenario 8: a loan of the A100s may be reclaimed after 1 s.
        c.alternatives = vec![flexq::config::AlternativesConfig {
            accelerator: Some("l4".into()),
            allow: vec!["a100-40".into()],
            reclaim: Some("after 1s".into()),
            ..Default::default()
        }];
        // Scenario 7: a batch of higher priority may preempt at once; a
        // victim's processes get 10 s to stop (the agents' own grace is
        // 3 s).
        c.regions
            .get_mut("us-central1")
            .expect("us-central1")
            .preemption = Some(flexq::config::PreemptionConfig {
            enabled: true,
            min_runtime: Duration::ZERO,
            grace: Duration::from_secs(10),
            ..Default::default()
        });
        // Scenario 9: a batch whose GPUs do nothing for 4 s is cancelled
        // (every other batch's fake GPUs are at 42 %).
        c.gpu_idle = flexq::gpu::IdlePolicy {
            action: flexq::gpu::IdleAction::Cancel,
            below_percent: 10.0,
            after: Duration::from_secs(4),
            warm_up: Duration::ZERO,
        };
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut agents: Vec<Agent> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| Agent::start(&s, dir.path(), n))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    for a in &agents {
        while node(&s, &a.node).await.is_none() {
            assert!(
                Instant::now() < deadline,
                "agent {} did not register",
                a.node
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // 1. A driver and two executors of one GPU each: every task sees
    //    exactly the GPU the scheduler allocated to its executor.
    let out_file = dir.path().join("gpus.json");
    let (st, body) = s
        .create(
            "batchId=gpu-addresses",
            &gpu_batch(
                "gpu_addresses.py",
                &[&out_file.display().to_string(), "8"],
                // One task per GPU at a time: both executors get tasks.
                &[("spark.task.resource.gpu.amount", "1")],
            ),
        )
        .await;
    assert_eq!(st, 200, "{body:#}");
    let b = until(
        &s,
        "gpu-addresses",
        "finished",
        Duration::from_secs(240),
        &agents,
        |b| b["state"] == "SUCCEEDED" || b["state"] == "FAILED",
    )
    .await;
    assert_eq!(
        b["state"],
        "SUCCEEDED",
        "{b:#}\n{}",
        output(&s, "gpu-addresses").await
    );
    let states: Vec<&str> = b["stateHistory"]
        .as_array()
        .expect("history")
        .iter()
        .map(|h| h["state"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        states,
        ["PENDING", "PENDING", "RUNNING", "SUCCEEDED"],
        "{b:#}"
    );
    // It asked for GPUs and ran without the RAPIDS jar: flagged, in its
    // runtimeInfo and its end's message.
    assert_eq!(
        b["runtimeInfo"]["cpuFallback"]["withoutRapids"], true,
        "{b:#}"
    );
    assert!(
        b["stateMessage"].as_str().is_some_and(
            |m| m.contains("ran without the RAPIDS Accelerator: all of it ran on the CPU")
        ),
        "{b:#}"
    );
    // The agents read their (fake) GPUs while it ran: 42 % each.
    let g = &b["runtimeInfo"]["gpuUtilization"];
    assert_eq!(g["meanPercent"], 42.0, "{b:#}");
    assert_eq!(g["peakMemoryMb"], 1500, "{b:#}");
    assert!(g["sampledGpuSeconds"].as_f64() > Some(0.0), "{b:#}");
    let rapids = b["runtimeInfo"]["rapidsAccelerator"]
        .as_str()
        .expect("rapids");
    assert!(
        rapids.contains("without the RAPIDS Accelerator"),
        "{rapids}"
    );
    let running = &b["stateHistory"][2]["stateMessage"];
    assert!(
        running
            .as_str()
            .is_some_and(|m| m.contains("without the RAPIDS Accelerator")),
        "the history says it ran without RAPIDS: {running}"
    );
    let parts = b["flexq"]["nodes"].as_array().expect("nodes");
    let allocated: BTreeMap<String, (String, Vec<String>)> = parts
        .iter()
        .filter(|p| p["role"] == "executor")
        .map(|p| {
            (
                p["index"].as_u64().expect("executor index").to_string(),
                (
                    p["node"].as_str().expect("node").to_string(),
                    serde_json::from_value(p["gpus"].clone()).expect("gpus"),
                ),
            )
        })
        .collect();
    assert_eq!(allocated.len(), 2, "{parts:#?}");
    let tasks: Vec<Value> =
        serde_json::from_slice(&std::fs::read(&out_file).expect("the job wrote its records"))
            .expect("records");
    assert_eq!(tasks.len(), 8);
    let mut seen = std::collections::BTreeSet::new();
    for t in &tasks {
        let index = t["executorIndex"].as_str().expect("FLEXQ_EXECUTOR_INDEX");
        let (node, gpus) = &allocated[index];
        let given: Vec<String> = serde_json::from_value(t["gpus"].clone()).expect("gpus");
        assert_eq!(&given, gpus, "task {t} on executor {index}");
        assert_eq!(t["node"].as_str(), Some(node.as_str()), "task {t}");
        seen.insert(index.to_string());
    }
    assert_eq!(seen.len(), 2, "both executors ran tasks: {tasks:?}");
    let text = output(&s, "gpu-addresses").await;
    assert!(text.contains("gpu_addresses: 8 tasks recorded"), "{text}");
    let uuid = b["uuid"].as_str().expect("uuid").to_string();
    all_gone(&uuid, Duration::from_secs(20)).await;
    for a in &agents {
        let n = node(&s, &a.node).await.expect("node");
        assert_eq!(n["freeGpus"], 2, "capacity back: {n}");
    }

    // 1b. Dynamic allocation on (minExecutors 2, maxExecutors 6): the
    //     core gang, a driver and 2 executors, starts on 2 of the 6 free
    //     GPUs. Spark's backlog raises its executor target, the driver's
    //     agent reports it, and extras are granted one executor at a time
    //     up to the region's cap on extras (half its 6 GPUs): each is a
    //     worker joining the batch's master, whose executor sees exactly
    //     its GPU, and tasks run there too. (On this machine an extra's
    //     executor registers some 20 s after the demand: 48 tasks of 2 s
    //     keep the core's 2 executors busy past that.)
    let dyn_file = dir.path().join("dynamic.json");
    let (st, op) = s
        .create(
            "batchId=dynamic",
            &gpu_batch(
                "gpu_addresses.py",
                &[&dyn_file.display().to_string(), "48", "2"],
                &[
                    ("spark.task.resource.gpu.amount", "1"),
                    ("spark.dynamicAllocation.enabled", "true"),
                    ("spark.dynamicAllocation.minExecutors", "2"),
                    ("spark.dynamicAllocation.maxExecutors", "6"),
                    ("spark.dynamicAllocation.schedulerBacklogTimeout", "1s"),
                ],
            ),
        )
        .await;
    assert_eq!(st, 200, "{op:#}");
    assert!(
        crate::support::warns(
            &op,
            "Spark may grow to spark.dynamicAllocation.maxExecutors = 6"
        ),
        "{op:#}"
    );
    // Every part it held, by executor index, read while it runs (an extra
    // leaves the page when it goes back; its index may be granted again,
    // elsewhere).
    let mut held: BTreeMap<String, Vec<(String, Vec<String>)>> = BTreeMap::new();
    let mut most_extras = 0;
    let mut reclaimer: Option<Instant> = None;
    let started = Instant::now();
    let b = loop {
        let b = batch(&s, "dynamic").await;
        for p in b["flexq"]["nodes"].as_array().into_iter().flatten() {
            if let Some(i) = p["index"].as_u64() {
                let gpus: Vec<String> = serde_json::from_value(p["gpus"].clone()).expect("gpus");
                let part = (p["node"].as_str().unwrap_or_default().to_string(), gpus);
                let seen = held.entry(i.to_string()).or_default();
                if !seen.contains(&part) {
                    seen.push(part);
                }
            }
        }
        let extras = b["flexq"]["elastic"]["extras"]["running"]
            .as_u64()
            .unwrap_or(0);
        most_extras = most_extras.max(extras);
        // 1c. In the middle of the stage (every extra held, and an extra's
        //     executor done with a task), a fixed gang of a driver and 2
        //     executors (12 cores, 2 GPUs) is queued: the core gang and the
        //     extras hold every core of the zone's 3 nodes of 8, so the
        //     extras are taken back in the pass that allocates it (their
        //     executors decommission within the agents' 3 s grace) and the
        //     gang starts.
        let uuid = b["uuid"].as_str().unwrap_or_default();
        if reclaimer.is_none()
            && extras == 3
            && executors_that_finished_a_task(dir.path(), uuid)
                .iter()
                .any(|i| *i >= 2)
        {
            let (st, op) = s
                .create(
                    "batchId=reclaimer",
                    &gpu_batch(
                        "gpu_addresses.py",
                        &[
                            &dir.path().join("reclaimer.json").display().to_string(),
                            "2",
                        ],
                        &[
                            ("spark.task.resource.gpu.amount", "1"),
                            ("spark.executor.instances", "2"),
                        ],
                    ),
                )
                .await;
            assert_eq!(st, 200, "{op:#}");
            reclaimer = Some(Instant::now());
        }
        if b["state"] == "SUCCEEDED" || b["state"] == "FAILED" {
            break b;
        }
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "dynamic did not finish: {b:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let text = output(&s, "dynamic").await;
    assert_eq!(b["state"], "SUCCEEDED", "{b:#}\n{text}");
    assert!(
        text.contains("dynamic allocation true, maxExecutors 6"),
        "{text}"
    );
    assert_eq!(most_extras, 3, "extras up to the region's cap: {b:#}");
    let granted = crate::support::state_messages(&b)
        .iter()
        .filter(|m| m.starts_with("Granted an extra executor on node"))
        .count();
    assert!(granted >= 3, "{:#?}", crate::support::state_messages(&b));
    let tasks: Vec<Value> =
        serde_json::from_slice(&std::fs::read(&dyn_file).expect("the job wrote its records"))
            .expect("records");
    // The same output as a run without the take-back: every task once.
    let mut ids: Vec<u64> = tasks.iter().filter_map(|t| t["task"].as_u64()).collect();
    ids.sort();
    assert_eq!(ids, (0..48).collect::<Vec<u64>>(), "{tasks:#?}");
    let mut ran_on = std::collections::BTreeSet::new();
    for t in &tasks {
        let index = t["executorIndex"].as_str().expect("FLEXQ_EXECUTOR_INDEX");
        let given: Vec<String> = serde_json::from_value(t["gpus"].clone()).expect("gpus");
        let part = (t["node"].as_str().unwrap_or_default().to_string(), given);
        assert!(
            held[index].contains(&part),
            "task {t} on executor {index}, which held {:?}",
            held[index]
        );
        ran_on.insert(index.parse::<u32>().expect("index"));
    }
    let extra_lines: Vec<String> = agents
        .iter()
        .flat_map(|a| {
            std::fs::read_to_string(&a.log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("extra") || l.contains("demand"))
                .map(|l| format!("{}: {l}", a.node))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        ran_on.iter().any(|i| *i >= 2),
        "tasks ran on an extra executor too: {ran_on:?}\n{}\n{text}",
        extra_lines.join("\n")
    );
    // The gang took extras back for itself, was allocated within the
    // agents' grace and a pass of its create, and ran.
    assert!(
        reclaimer.is_some(),
        "no extra ran an executor mid-stage: {b:#}\n{text}"
    );
    let took = crate::support::state_messages(&b)
        .iter()
        .filter(|m| {
            m.starts_with("Took back an extra executor") && m.contains("for batch reclaimer")
        })
        .count();
    assert!(
        (1..=3).contains(&took),
        "{:#?}\nthe gang: {:#}",
        crate::support::state_messages(&b),
        batch(&s, "reclaimer").await
    );
    let r = until(
        &s,
        "reclaimer",
        "ended",
        Duration::from_secs(240),
        &agents,
        |b| b["state"] == "SUCCEEDED" || b["state"] == "FAILED",
    )
    .await;
    assert_eq!(r["state"], "SUCCEEDED", "{r:#}");
    let time = |v: &Value| {
        chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap_or_default()).expect("a time")
    };
    let waited = time(&r["flexq"]["allocateTime"]) - time(&r["createTime"]);
    assert!(
        waited < chrono::Duration::seconds(5),
        "the gang waited {waited} for the extras: {r:#}"
    );
    all_gone(b["uuid"].as_str().expect("uuid"), Duration::from_secs(20)).await;
    all_gone(r["uuid"].as_str().expect("uuid"), Duration::from_secs(20)).await;

    // 2. A job that raises: FAILED with the exception; output readable.
    let (st, _) = s
        .create("batchId=raises", &gpu_batch("fails.py", &[], &[]))
        .await;
    assert_eq!(st, 200);
    let b = until(
        &s,
        "raises",
        "failed",
        Duration::from_secs(240),
        &agents,
        |b| b["state"] == "FAILED" || b["state"] == "SUCCEEDED",
    )
    .await;
    let message = b["stateMessage"].as_str().expect("message");
    assert!(
        message.contains("ValueError: bad row 17 in the input") && message.contains("exit status"),
        "{b:#}"
    );
    assert_ne!(b["runtimeInfo"]["driverExitCode"], 0);
    let text = output(&s, "raises").await;
    assert!(text.contains("fails: about to raise"), "{text}");
    assert!(text.contains("Traceback"), "{text}");

    // 3. Cancel of a running batch stops its whole process tree within
    //    seconds and frees its GPUs: a batch queued behind it starts.
    let (st, _) = s
        .http
        .patch(s.url("/v1/projects/demo/regions/us-central1/quotas"))
        .json(&json!({"metric": "PREEMPTIBLE_NVIDIA_L4_GPUS", "limit": 2}))
        .send()
        .await
        .map(|r| (r.status().as_u16(), ()))
        .expect("patch");
    assert_eq!(st, 200);
    for id in ["long-1", "long-2"] {
        let (st, _) = s
            .create(
                &format!("batchId={id}"),
                &gpu_batch("sleeps.py", &["600"], &[]),
            )
            .await;
        assert_eq!(st, 200);
    }
    let b1 = until(
        &s,
        "long-1",
        "running",
        Duration::from_secs(120),
        &agents,
        |b| b["state"] == "RUNNING",
    )
    .await;
    let uuid1 = b1["uuid"].as_str().expect("uuid").to_string();
    let started = Instant::now();
    while processes_of(&uuid1).len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "Spark processes of long-1"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        batch(&s, "long-2").await["flexq"]["provisioningState"],
        "QUEUED",
        "held back by the quota of 2 GPUs"
    );
    let cancelled_at = Instant::now();
    s.cancel(&b1).await;
    let b1 = until(
        &s,
        "long-1",
        "cancelled",
        Duration::from_secs(30),
        &agents,
        |b| b["state"] == "CANCELLED",
    )
    .await;
    let took = cancelled_at.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "cancel took {took:?}: {b1:#}"
    );
    // Every Spark process of the cancelled batch is gone within seconds.
    all_gone(&uuid1, Duration::from_secs(15)).await;
    let b2 = until(
        &s,
        "long-2",
        "running",
        Duration::from_secs(120),
        &agents,
        |b| b["state"] == "RUNNING",
    )
    .await;

    // 4. Killing the agent of long-2's driver: after its lease the batch
    //    fails saying the node was lost, the capacity returns, and a late
    //    report from the killed agent is refused.
    let driver_node = driver_of(&b2);
    let epoch = node(&s, &driver_node).await.expect("node")["epoch"]
        .as_str()
        .expect("epoch")
        .to_string();
    let uuid2 = b2["uuid"].as_str().expect("uuid").to_string();
    let victim = agent_of(&mut agents, &driver_node);
    victim.kill();
    let b2 = until(
        &s,
        "long-2",
        "failed",
        Duration::from_secs(30),
        &agents,
        |b| b["state"] == "FAILED",
    )
    .await;
    let message = b2["stateMessage"].as_str().expect("message");
    assert!(
        message.contains("lost") && message.contains(&driver_node),
        "{message}"
    );
    assert!(
        node(&s, &driver_node).await.is_none(),
        "the lost node left the capacity"
    );
    let late = json!({"epoch": epoch, "uuid": uuid2, "event": "FINISHED", "succeeded": true, "message": "late"});
    let (st, body) = s
        .post_json(&format!("/v1/nodes/{driver_node}:report"), &late)
        .await;
    assert_status(st, &body, 400, "FAILED_PRECONDITION");
    // The agent comes back: it stops what its killed predecessor left
    // running, registers with a new epoch, and the old epoch is fenced.
    let victim = agent_of(&mut agents, &driver_node);
    victim.restart();
    let back = Instant::now();
    let new_epoch = loop {
        if let Some(n) = node(&s, &driver_node).await {
            break n["epoch"].as_str().expect("epoch").to_string();
        }
        assert!(back.elapsed() < Duration::from_secs(30), "agent back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_ne!(new_epoch, epoch);
    let (st, body) = s
        .post_json(&format!("/v1/nodes/{driver_node}:report"), &late)
        .await;
    assert_status(st, &body, 409, "ABORTED");
    all_gone(&uuid2, Duration::from_secs(30)).await;

    // 5. A batch allowed one retry, whose driver's agent is SIGKILLed
    //    while it runs: after the lease it goes back to the queue, and its
    //    second attempt runs on the nodes left to the end.
    let mut retried = gpu_batch("sleeps.py", &["15"], &[]);
    retried["labels"] = json!({"flexq-infrastructure-retries": "1"});
    let (st, body) = s.create("batchId=retried", &retried).await;
    assert_eq!(st, 200, "{body:#}");
    let b = until(
        &s,
        "retried",
        "running",
        Duration::from_secs(120),
        &agents,
        |b| b["state"] == "RUNNING",
    )
    .await;
    let first_driver = driver_of(&b);
    let victim = agent_of(&mut agents, &first_driver);
    victim.kill();
    let b = until(
        &s,
        "retried",
        "requeued",
        Duration::from_secs(30),
        &agents,
        |b| b["flexq"]["attempt"] == 2,
    )
    .await;
    let requeued = b["stateHistory"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(|e| e["stateMessage"].as_str())
        .find(|m| m.starts_with("Requeued after an infrastructure failure"))
        .unwrap_or_default()
        .to_string();
    assert!(requeued.contains(&first_driver), "{b:#}");
    let b = until(
        &s,
        "retried",
        "succeeded on its second attempt",
        Duration::from_secs(240),
        &agents,
        |b| b["state"] == "SUCCEEDED",
    )
    .await;
    assert_eq!(b["flexq"]["attempt"], 2, "{b:#}");
    assert!(output(&s, "retried").await.contains("sleeps: done"));
    let victim = agent_of(&mut agents, &first_driver);
    victim.restart();

    // 6. Placement alternatives: with no L4 quota left, an L4 batch runs
    //    on its A100-40 alternative, and Spark gets the alternative's shape: 12-core
    //    executors of one GPU each (a GPU per 12 tasks), not 4-core L4
    //    ones.
    let a100 = Agent::start_in(
        &s,
        dir.path(),
        "node-d",
        "us-central1-c",
        "a100-40",
        36,
        262144,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while node(&s, &a100.node).await.is_none() {
        assert!(Instant::now() < deadline, "node-d did not register");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agents.push(a100);
    let quota = |limit: u64| {
        s.http
            .patch(s.url("/v1/projects/demo/regions/us-central1/quotas"))
            .json(&json!({"metric": "PREEMPTIBLE_NVIDIA_L4_GPUS", "limit": limit}))
            .send()
    };
    assert_eq!(quota(0).await.expect("patch quota").status(), 200);
    let (st, body) = s
        .create(
            "batchId=on-a100",
            &gpu_batch(
                "spark_conf.py",
                &[],
                &[("spark.flexq.alternatives", "a100-40 after 1s")],
            ),
        )
        .await;
    assert_eq!(st, 200, "{body:#}");
    let b = until(
        &s,
        "on-a100",
        "finished",
        Duration::from_secs(240),
        &agents,
        |b| b["state"] == "SUCCEEDED" || b["state"] == "FAILED",
    )
    .await;
    let out = output(&s, "on-a100").await;
    assert_eq!(b["state"], "SUCCEEDED", "{b:#}\n{out}");
    assert_eq!(b["flexq"]["placement"]["accelerator"], "a100-40", "{b:#}");
    for line in [
        "spark_conf: spark.executor.instances=2",
        "spark_conf: spark.executor.cores=12",
        "spark_conf: spark.executor.resource.gpu.amount=1",
        "spark_conf: spark.task.resource.gpu.amount=0.083333",
    ] {
        assert!(
            out.contains(line),
            "{line} not in the driver's output:\n{out}"
        );
    }
    assert_eq!(quota(24).await.expect("patch quota").status(), 200);

    // 7. Preemption: with the L4 nodes of us-central1-a cordoned, one node
    //    of 12 cores in us-central1-b holds one batch (a driver and two
    //    executors of 4 cores). An urgent batch (priority 10) preempts it:
    //    the victim's driver gets SIGTERM first (its handler writes the
    //    marker) and has stopped before the urgent batch is allocated;
    //    every process of the victim is gone within the grace (the agent
    //    starts a part on a GPU only once the part that held it is gone),
    //    and the victim runs again to the end afterwards.
    for n in ["node-a", "node-b", "node-c"] {
        let (st, body) = s.post(&format!("/v1/nodes/{n}:cordon")).await;
        assert_eq!(st, 200, "{body:#}");
    }
    let lone = Agent::start_in(&s, dir.path(), "node-e", "us-central1-b", "l4", 12, 65536);
    let deadline = Instant::now() + Duration::from_secs(30);
    while node(&s, &lone.node).await.is_none() {
        assert!(Instant::now() < deadline, "node-e did not register");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agents.push(lone);
    let marker = dir.path().join("victim-sigterm");
    let marker_arg = marker.display().to_string();
    let (st, body) = s
        .create(
            "batchId=victim",
            &gpu_batch("sleeps.py", &["20", &marker_arg], &[]),
        )
        .await;
    assert_eq!(st, 200, "{body:#}");
    let v = until(
        &s,
        "victim",
        "running",
        Duration::from_secs(120),
        &agents,
        |b| b["state"] == "RUNNING",
    )
    .await;
    let victim_uuid = v["uuid"].as_str().expect("uuid").to_string();
    // Its Python driver is past its SIGTERM handler's setup once it says
    // it sleeps.
    let deadline = Instant::now() + Duration::from_secs(90);
    while !output(&s, "victim").await.contains("sleeps: sleeping") {
        assert!(Instant::now() < deadline, "the victim never said it sleeps");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut urgent = gpu_batch("first_line.py", &[], &[]);
    urgent["labels"] = json!({"flexq-priority": "10"});
    let (st, body) = s.create("batchId=urgent", &urgent).await;
    assert_eq!(st, 200, "{body:#}");
    let u = until(
        &s,
        "urgent",
        "allocated",
        Duration::from_secs(60),
        &agents,
        |b| b["flexq"]["provisioningState"] != "QUEUED",
    )
    .await;
    signalled_before_allocation(&marker, "victim", &u);
    all_gone(&victim_uuid, Duration::from_secs(15)).await;
    let v = batch(&s, "victim").await;
    assert_eq!(v["flexq"]["preemptions"], 1, "{v:#}");
    let said: Vec<&str> = v["stateHistory"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(|h| h["stateMessage"].as_str())
        .collect();
    assert!(
        said.iter()
            .any(|m| m.starts_with("PREEMPTED by urgent (priority 10 > 0)")),
        "{said:#?}"
    );
    let u = until(
        &s,
        "urgent",
        "finished",
        Duration::from_secs(120),
        &agents,
        |b| b["state"] == "SUCCEEDED" || b["state"] == "FAILED",
    )
    .await;
    assert_eq!(u["state"], "SUCCEEDED", "{u:#}");
    let v = until(
        &s,
        "victim",
        "finished again",
        Duration::from_secs(180),
        &agents,
        |b| b["state"] == "SUCCEEDED" || b["state"] == "FAILED",
    )
    .await;
    assert_eq!(v["state"], "SUCCEEDED", "{v:#}");
    assert_eq!(v["flexq"]["attempt"], 2, "{v:#}");
    assert!(output(&s, "victim").await.contains("sleeps: done"));

    // 8. Loans and reclaim: with no L4 quota left, an L4 batch borrows
    //    the A100s of node-d. An A100 batch of their owners takes them
    //    back: the loan's driver gets SIGTERM (its handler writes the
    //    marker) before the owner is allocated, every process of it is
    //    gone within the grace, it goes back to the queue as RECLAIMED
    //    (not preempted), and, the L4 quota back, it runs again to the
    //    end on its own shape: L4s, on node-e.
    assert_eq!(quota(0).await.expect("patch quota").status(), 200);
    let marker = dir.path().join("borrower-sigterm");
    let marker_arg = marker.display().to_string();
    let (st, body) = s
        .create(
            "batchId=borrower",
            &gpu_batch(
                "sleeps.py",
                &["20", &marker_arg],
                &[("spark.flexq.alternatives", "a100-40 after 1s")],
            ),
        )
        .await;
    assert_eq!(st, 200, "{body:#}");
    let b = until(
        &s,
        "borrower",
        "running on its loan",
        Duration::from_secs(120),
        &agents,
        |b| b["state"] == "RUNNING",
    )
    .await;
    assert_eq!(b["flexq"]["placement"]["loan"], true, "{b:#}");
    assert_eq!(
        b["flexq"]["placement"]["lender"], "a100-40 in us-central1-c",
        "{b:#}"
    );
    let borrower_uuid = b["uuid"].as_str().expect("uuid").to_string();
    let deadline = Instant::now() + Duration::from_secs(90);
    while !output(&s, "borrower").await.contains("sleeps: sleeping") {
        assert!(
            Instant::now() < deadline,
            "the borrower never said it sleeps"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let owner = gpu_batch(
        "first_line.py",
        &[],
        &[(
            "spark.dataproc.executor.resource.accelerator.type",
            "a100-40",
        )],
    );
    let (st, body) = s.create("batchId=owner", &owner).await;
    assert_eq!(st, 200, "{body:#}");
    let o = until(
        &s,
        "owner",
        "allocated",
        Duration::from_secs(60),
        &agents,
        |b| b["flexq"]["provisioningState"] != "QUEUED",
    )
    .await;
    signalled_before_allocation(&marker, "borrower", &o);
    all_gone(&borrower_uuid, Duration::from_secs(15)).await;
    // Its L4 quota back (its next attempt's processes carry the same
    // uuid), the borrower's own placement fits node-e.
    assert_eq!(quota(24).await.expect("patch quota").status(), 200);
    let b = batch(&s, "borrower").await;
    assert_eq!(b["flexq"]["requeueReason"], "RECLAIMED", "{b:#}");
    assert!(
        b["flexq"].get("preemptions").is_none_or(|p| p == 0),
        "{b:#}"
    );
    let said: Vec<&str> = b["stateHistory"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(|h| h["stateMessage"].as_str())
        .collect();
    assert!(
        said.iter()
            .any(|m| m.starts_with("RECLAIMED by demo's batch owner after ")
                && m.contains("on loan (a100-40 in us-central1-c)")),
        "{said:#?}"
    );
    let o = until(
        &s,
        "owner",
        "finished",
        Duration::from_secs(120),
        &agents,
        |b| b["state"] == "SUCCEEDED" || b["state"] == "FAILED",
    )
    .await;
    assert_eq!(o["state"], "SUCCEEDED", "{o:#}");
    let b = until(
        &s,
        "borrower",
        "finished again",
        Duration::from_secs(180),
        &agents,
        |b| b["state"] == "SUCCEEDED" || b["state"] == "FAILED",
    )
    .await;
    assert_eq!(b["state"], "SUCCEEDED", "{b:#}");
    assert_eq!(b["flexq"]["attempt"], 2, "{b:#}");
    assert!(b["flexq"]["placement"]["loan"] != true, "{b:#}");
    assert!(
        b["flexq"]["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .all(|p| p["node"] == "node-e"),
        "{b:#}"
    );
    assert!(output(&s, "borrower").await.contains("sleeps: done"));

    // 9. The GPU idle policy: a batch whose (fake) GPUs read 0 % is
    //    cancelled with the typed reason IDLE_GPUS once the agents' points
    //    show 4 s of it, and every process of it is gone.
    for a in &agents {
        a.set_utilization(0);
    }
    let (st, body) = s
        .create("batchId=idler", &gpu_batch("sleeps.py", &["600"], &[]))
        .await;
    assert_eq!(st, 200, "{body:#}");
    let idler = until(
        &s,
        "idler",
        "running",
        Duration::from_secs(120),
        &agents,
        |b| b["state"] == "RUNNING",
    )
    .await;
    let idler_uuid = idler["uuid"].as_str().expect("uuid").to_string();
    let idler = until(
        &s,
        "idler",
        "cancelled",
        Duration::from_secs(60),
        &agents,
        |b| b["state"] == "CANCELLED" || b["state"] == "FAILED" || b["state"] == "SUCCEEDED",
    )
    .await;
    assert_eq!(idler["state"], "CANCELLED", "{idler:#}");
    assert_eq!(idler["flexq"]["endReason"], "IDLE_GPUS", "{idler:#}");
    let said: Vec<&str> = idler["stateHistory"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(|h| h["stateMessage"].as_str())
        .collect();
    assert!(
        said.iter().any(|m| m.starts_with(
            "Cancelled by the GPU idle policy: every GPU of it has been under 10% utilization"
        )),
        "{said:#?}"
    );
    assert_eq!(
        idler["runtimeInfo"]["gpuUtilization"]["meanPercent"], 0.0,
        "{idler:#}"
    );
    all_gone(&idler_uuid, Duration::from_secs(15)).await;

    // Agents stop cleanly on SIGTERM.
    for a in &mut agents {
        assert!(a.terminate().success(), "agent {} exit status", a.node);
    }
}
