//! `flexq bench submit`: durable creates over loopback HTTP.
//!
//! Starts its own `flexq serve` (a child process on a temporary SQLite
//! database, `synchronous=FULL`) unless `--endpoint` is given, drives
//! creates with many concurrent clients, and reports accepted creates per
//! second, latency percentiles, the server's peak memory, and the disk's
//! fsync time as the baseline that durable figures depend on. With
//! `--rate` the load is open loop (requests sent on a timetable, latency
//! measured from the scheduled send time, so queueing delay is not hidden).

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio::sync::Mutex;

use super::CliError;

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub clients: usize,
    pub duration: Duration,
    pub rate: Option<u64>,
    pub endpoint: Option<String>,
    pub warmup: Duration,
}

/// The flex start example of spec §6: what a real submitter sends.
fn body() -> serde_json::Value {
    serde_json::json!({
        "pysparkBatch": {"mainPythonFileUri": "file:///jobs/etl.py"},
        "runtimeConfig": {"version": "3.0", "properties": {
            "spark.dataproc.driver.resource.accelerator.type": "l4",
            "spark.dataproc.driver.provisioning.allocationTimeout": "1800s",
            "spark.dataproc.executor.resource.accelerator.type": "l4",
            "spark.dataproc.executor.provisioning.allocationTimeout": "1800s",
            "spark.dataproc.executor.compute.tier": "premium",
            "spark.dataproc.executor.disk.tier": "premium"
        }},
        "labels": {"bench": "submit"}
    })
}

struct Server {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16, CliError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| CliError::Transport(format!("no free port: {e}")))
}

async fn start_server() -> Result<(Server, String), CliError> {
    let dir = tempfile::tempdir().map_err(|e| CliError::Transport(e.to_string()))?;
    let port = free_port()?;
    let config = dir.path().join("flexq.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nbind = \"127.0.0.1:{port}\"\n[database]\ndata_dir = \"{}\"\n[log]\nformat = \"text\"\nfilter = \"warn\"\n",
            dir.path().join("data").display()
        ),
    )
    .map_err(|e| CliError::Transport(e.to_string()))?;
    let exe = std::env::current_exe().map_err(|e| CliError::Transport(e.to_string()))?;
    let child = Command::new(exe)
        .args(["serve", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| CliError::Transport(format!("cannot start flexq serve: {e}")))?;
    let server = Server { child, _dir: dir };
    let endpoint = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if client
            .get(format!("{endpoint}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok((server, endpoint));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(CliError::Transport(
        "flexq serve did not become ready in 30s".into(),
    ))
}

/// Median time of one 4 KiB write + fdatasync on the disk under `dir`.
fn fsync_baseline(dir: &Path) -> Duration {
    let path = dir.join("fsync-probe");
    let Ok(mut f) = std::fs::File::create(&path) else {
        return Duration::ZERO;
    };
    let block = [0u8; 4096];
    let mut times: Vec<Duration> = (0..200)
        .filter_map(|_| {
            let t = Instant::now();
            f.write_all(&block).ok()?;
            f.sync_data().ok()?;
            Some(t.elapsed())
        })
        .collect();
    let _ = std::fs::remove_file(&path);
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Runs the benchmark and prints its report.
pub async fn submit(opts: BenchOptions) -> Result<(), CliError> {
    let (server, endpoint) = match &opts.endpoint {
        Some(e) => (None, e.clone()),
        None => {
            let (s, e) = start_server().await?;
            (Some(s), e)
        }
    };
    let fsync = fsync_baseline(&std::env::temp_dir());
    let url = format!("{endpoint}/v1/projects/bench/locations/us-central1/batches");
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(opts.clients.max(1) * 2)
        .build()
        .map_err(|e| CliError::Transport(e.to_string()))?;
    let body = Arc::new(serde_json::to_vec(&body()).unwrap_or_default());

    if !opts.warmup.is_zero() {
        eprintln!("warming up for {}", humantime::format_duration(opts.warmup));
        let _ = drive(&client, &url, &body, &opts, opts.warmup).await;
    }
    eprintln!(
        "measuring {} of creates with {} ({})",
        humantime::format_duration(opts.duration),
        match opts.rate {
            Some(r) => format!("an open-loop rate of {r}/s"),
            None => format!("{} closed-loop clients", opts.clients),
        },
        endpoint
    );
    let started = Instant::now();
    let result = drive(&client, &url, &body, &opts, opts.duration).await;
    let elapsed = started.elapsed();
    let peak = server.as_ref().and_then(|s| peak_rss_kib(s.child.id()));

    let h = result.latency;
    let q = |p: f64| Duration::from_micros(h.value_at_quantile(p)).as_secs_f64() * 1000.0;
    println!(
        "flexq bench submit — {} on {}",
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        hostname()
    );
    println!(
        "  load generator shares the machine with the server; load average before: {}",
        result.load_before
    );
    println!(
        "  fsync (4 KiB write + fdatasync) median: {:.0} µs",
        fsync.as_secs_f64() * 1e6
    );
    println!(
        "  accepted creates: {} in {:.1}s = {:.0}/s (durable: acknowledged after commit)",
        result.ok,
        elapsed.as_secs_f64(),
        result.ok as f64 / elapsed.as_secs_f64()
    );
    println!("  errors: {}", result.errors);
    println!(
        "  latency ms: p50 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}",
        q(0.5),
        q(0.99),
        q(0.999),
        h.max() as f64 / 1000.0
    );
    if let Some(kib) = peak {
        println!("  server peak RSS: {:.1} MiB", kib as f64 / 1024.0);
    }
    println!("  load average after: {}", loadavg());
    drop(server);
    Ok(())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "this machine".into())
}

struct DriveResult {
    ok: u64,
    errors: u64,
    latency: Histogram<u64>,
    load_before: String,
}

async fn drive(
    client: &reqwest::Client,
    url: &str,
    body: &Arc<Vec<u8>>,
    opts: &BenchOptions,
    duration: Duration,
) -> DriveResult {
    let load_before = loadavg();
    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let hist = Arc::new(Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds"),
    ));
    let end = Instant::now() + duration;
    let send = {
        let client = client.clone();
        let url = url.to_string();
        let body = body.clone();
        let ok = ok.clone();
        let errors = errors.clone();
        move |scheduled: Instant| {
            let client = client.clone();
            let url = url.clone();
            let body = body.clone();
            let ok = ok.clone();
            let errors = errors.clone();
            async move {
                let r = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.as_ref().clone())
                    .send()
                    .await;
                let good = match r {
                    Ok(resp) => resp.status().is_success() && resp.bytes().await.is_ok(),
                    Err(_) => false,
                };
                if good {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                scheduled.elapsed()
            }
        }
    };
    let mut tasks = Vec::new();
    match opts.rate {
        None => {
            for _ in 0..opts.clients.max(1) {
                let send = send.clone();
                let hist = hist.clone();
                tasks.push(tokio::spawn(async move {
                    let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
                        .expect("valid histogram bounds");
                    while Instant::now() < end {
                        let latency = send(Instant::now()).await;
                        let _ = local.record(latency.as_micros().max(1) as u64);
                    }
                    let _ = hist.lock().await.add(local);
                }));
            }
        }
        Some(rate) => {
            let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
            let mut next = Instant::now();
            while next < end {
                tokio::time::sleep_until(next.into()).await;
                let send = send.clone();
                let hist = hist.clone();
                let scheduled = next;
                tasks.push(tokio::spawn(async move {
                    let latency = send(scheduled).await;
                    let _ = hist.lock().await.record(latency.as_micros().max(1) as u64);
                }));
                next += interval;
            }
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    let latency = Arc::try_unwrap(hist)
        .map(Mutex::into_inner)
        .unwrap_or_else(|_| Histogram::new(3).expect("valid histogram"));
    DriveResult {
        ok: ok.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        latency,
        load_before,
    }
}
