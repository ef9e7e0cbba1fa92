//! `flexq bench agent`: what flexq adds between the allocation of a batch
//! and its driver's first line of output reaching the API, with Spark's
//! own start times taken out, and the agent's memory.
//!
//! One in-process server, one real `flexq agent` child (FAKE GPU discovery
//! script: two addresses, no GPU), real Spark. Per run, from the agent's
//! JSON log and the server:
//!
//! ```text
//! allocated ─▶ assignment ─▶ master spawned ══ Spark ══▶ master ready ─▶
//! reported ─▶ spark-submit spawned ══ Spark (JVM start) ══▶ first output ─▶
//! uploaded ─▶ visible through GET .../output
//! ```
//!
//! flexq's overhead = (visible − allocated) − (master ready − master
//! spawned) − (first output − spark-submit spawned).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::CliError;
use crate::config::Config;
use crate::server::App;

fn err(e: impl std::fmt::Display) -> CliError {
    CliError::Transport(e.to_string())
}

pub struct AgentBenchOptions {
    pub runs: usize,
}

/// Timestamps of one batch's phases in the agent's log.
fn phases(log: &str, uuid: &str) -> HashMap<String, DateTime<Utc>> {
    let mut out = HashMap::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        // Flattened events: fields beside timestamp and level.
        let fields = &v;
        if fields["batch_uuid"].as_str() != Some(uuid) {
            continue;
        }
        let (Some(message), Some(ts)) = (fields["message"].as_str(), v["timestamp"].as_str())
        else {
            continue;
        };
        if let Ok(t) = ts.parse::<DateTime<Utc>>() {
            out.entry(message.to_string()).or_insert(t);
        }
    }
    out
}

fn rss_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn ms(d: chrono::Duration) -> f64 {
    d.num_microseconds().unwrap_or_default() as f64 / 1000.0
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn write_agent_files(dir: &Path, server: &str) -> Result<std::path::PathBuf, CliError> {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("fake-gpus.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n# FAKE GPUs for the benchmark: two addresses, no hardware.\necho '{\"name\":\"gpu\",\"addresses\":[\"0\",\"1\"]}'\n",
    )
    .map_err(err)?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).map_err(err)?;
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "server = \"{server}\"\nnode_id = \"bench-node\"\nregion = \"us-central1\"\nzone = \"us-central1-a\"\npool = \"l4\"\ncores = 16\nmemory_mb = 65536\nlocal_ssd_gb = 1500\ngpu_discovery_script = \"{}\"\nwork_dir = \"{}\"\nrapids_jar = \"{}\"\n",
            script.display(),
            dir.join("work").display(),
            dir.join("no-rapids.jar").display()
        ),
    )
    .map_err(err)?;
    Ok(config)
}

pub async fn run(opts: AgentBenchOptions) -> Result<(), CliError> {
    let dir = tempfile::tempdir().map_err(err)?;
    let mut config = Config::load_without_env(None).map_err(err)?;
    config.database.data_dir = dir.path().join("data");
    config.log.filter = "warn".into();
    for region in config.regions.values_mut() {
        for zone in region.zones.values_mut() {
            for pool in zone.node_pools.values_mut() {
                pool.virtual_nodes = 0;
            }
        }
    }
    let shutdown = CancellationToken::new();
    let app = App::open(config, shutdown.clone()).await.map_err(err)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(err)?;
    let base = format!("http://{}", listener.local_addr().map_err(err)?);
    tokio::spawn(crate::server::run(listener, app, shutdown.clone()));

    let agent_config = write_agent_files(dir.path(), &base)?;
    let log_path = dir.path().join("agent.log");
    let log = std::fs::File::create(&log_path).map_err(err)?;
    let mut agent = Command::new(std::env::current_exe().map_err(err)?)
        .args(["agent", "--json-logs", "--config"])
        .arg(&agent_config)
        .stdout(Stdio::from(log.try_clone().map_err(err)?))
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| err(format!("cannot start flexq agent: {e}")))?;
    let pid = agent.id();
    let http = reqwest::Client::new();
    let registered = Instant::now();
    loop {
        let nodes: Value = http
            .get(format!("{base}/v1/nodes"))
            .send()
            .await
            .map_err(err)?
            .json()
            .await
            .map_err(err)?;
        if nodes["nodes"].as_array().is_some_and(|n| !n.is_empty()) {
            break;
        }
        if registered.elapsed() > Duration::from_secs(30) {
            let _ = agent.kill();
            return Err(err(
                "the agent did not register within 30s (is pyspark installed?)",
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let idle_rss = rss_kib(pid, "VmRSS:").unwrap_or_default();
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/first_line.py");
    let batches = format!("{base}/v1/projects/bench/locations/us-central1/batches");
    println!(
        "flexq bench agent: {} runs, one agent (FAKE GPU script), real Spark; machine load {}",
        opts.runs,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "{:>3} {:>10} {:>12} {:>12} {:>12} {:>12}",
        "run", "e2e_ms", "spark_master", "spark_driver", "flexq_ms", "alloc→assign"
    );
    let (mut overheads, mut e2es, mut peak_rss) = (Vec::new(), Vec::new(), idle_rss);
    for run in 0..opts.runs {
        let body = json!({
            "pysparkBatch": {"mainPythonFileUri": job.display().to_string()},
            "runtimeConfig": {"version": "3.0", "properties": {
                "spark.dataproc.executor.resource.accelerator.type": "l4",
                "spark.dataproc.executor.compute.tier": "premium",
                "spark.dataproc.executor.disk.tier": "premium",
                "spark.executor.memory": "1024m",
                "spark.driver.memory": "1024m",
                "spark.ui.enabled": "false",
            }},
        });
        let id = format!("first-line-{run}");
        let created = http
            .post(format!("{batches}?batchId={id}"))
            .json(&body)
            .send()
            .await
            .map_err(err)?;
        if !created.status().is_success() {
            return Err(err(format!(
                "create: {}",
                created.text().await.unwrap_or_default()
            )));
        }
        // The first output, as a user following the batch sees it.
        let visible = loop {
            let out: Value = http
                .get(format!("{batches}/{id}/output?waitFor=20s"))
                .send()
                .await
                .map_err(err)?
                .json()
                .await
                .map_err(err)?;
            if let Some(rss) = rss_kib(pid, "VmRSS:") {
                peak_rss = peak_rss.max(rss);
            }
            if out["data"].as_str().is_some_and(|d| !d.is_empty()) {
                break Utc::now();
            }
            if out["error"].is_object() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let batch = loop {
            let b: Value = http
                .get(format!("{batches}/{id}"))
                .send()
                .await
                .map_err(err)?
                .json()
                .await
                .map_err(err)?;
            if let Some(rss) = rss_kib(pid, "VmRSS:") {
                peak_rss = peak_rss.max(rss);
            }
            if matches!(
                b["state"].as_str(),
                Some("SUCCEEDED" | "FAILED" | "CANCELLED")
            ) {
                break b;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if batch["state"] != "SUCCEEDED" {
            return Err(err(format!(
                "batch {id} ended {}: {}",
                batch["state"], batch["stateMessage"]
            )));
        }
        let allocated: DateTime<Utc> = batch["flexq"]["allocateTime"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| err("no allocateTime"))?;
        let uuid = batch["uuid"].as_str().unwrap_or_default();
        let text = std::fs::read_to_string(&log_path).map_err(err)?;
        let p = phases(&text, uuid);
        let at = |k: &str| {
            p.get(k)
                .copied()
                .ok_or_else(|| err(format!("the agent's log has no {k:?} for batch {id}")))
        };
        let (assigned, m0, m1, d0, d1) = (
            at("assignment received")?,
            at("spark master spawned")?,
            at("spark master started")?,
            at("driver started")?,
            at("driver first output")?,
        );
        let e2e = visible - allocated;
        let spark = (m1 - m0) + (d1 - d0);
        let overhead = e2e - spark;
        println!(
            "{run:>3} {:>10.0} {:>12.0} {:>12.0} {:>12.1} {:>12.1}",
            ms(e2e),
            ms(m1 - m0),
            ms(d1 - d0),
            ms(overhead),
            ms(assigned - allocated)
        );
        overheads.push(ms(overhead));
        e2es.push(ms(e2e));
    }
    let hwm = rss_kib(pid, "VmHWM:").unwrap_or_default();
    println!(
        "median: flexq overhead {:.1} ms (target < 500 ms) of {:.0} ms from allocation to the first line visible",
        median(&mut overheads),
        median(&mut e2es)
    );
    println!(
        "agent memory: {:.1} MiB idle, {:.1} MiB peak sampled, {:.1} MiB high-water mark (target < 30 MiB)",
        idle_rss as f64 / 1024.0,
        peak_rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = agent.wait();
    shutdown.cancel();
    Ok(())
}
