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
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use tokio_util::sync::CancellationToken;

use flexq::cli::CliError;

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub clients: usize,
    pub duration: Duration,
    pub rate: Option<u64>,
    pub endpoint: Option<String>,
    pub warmup: Duration,
}

/// The flex start example of docs/rules.md#example: what a real submitter sends.
pub(crate) fn body() -> serde_json::Value {
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

/// A `flexq serve` child process and its temporary directory.
pub(crate) struct Server {
    pub(crate) child: Child,
    dir: tempfile::TempDir,
}

impl Server {
    /// Its data directory (the SQLite database is in it).
    pub(crate) fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn free_port() -> Result<u16, CliError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| CliError::Transport(format!("no free port: {e}")))
}

async fn start_server() -> Result<(Server, String), CliError> {
    start_server_with("", &[]).await
}

/// Starts `flexq serve` on a temporary directory (its SQLite database
/// unless `env` names another), with `extra` appended to its config, and
/// waits until it is ready.
pub(crate) async fn start_server_with(
    extra: &str,
    env: &[(&str, &str)],
) -> Result<(Server, String), CliError> {
    let dir = tempfile::tempdir().map_err(|e| CliError::Transport(e.to_string()))?;
    let port = free_port()?;
    let metrics_port = free_port()?;
    let config = dir.path().join("flexq.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nbind = \"127.0.0.1:{port}\"\nmetrics_bind = \"127.0.0.1:{metrics_port}\"\n[database]\ndata_dir = \"{}\"\n[log]\nformat = \"text\"\nfilter = \"warn\"\n# A throughput benchmark of one project: far above the per-project quotas.\n[limits]\nmutations_per_minute = 100000000\nreads_per_minute = 100000000\nmax_pending_per_project = 100000000\n{extra}",
            dir.path().join("data").display()
        ),
    )
    .map_err(|e| CliError::Transport(e.to_string()))?;
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_flexq"));
    let child = Command::new(exe)
        .args(["serve", "--config"])
        .arg(&config)
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| CliError::Transport(format!("cannot start flexq serve: {e}")))?;
    let server = Server { child, dir };
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

pub(crate) fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

pub(crate) fn loadavg() -> String {
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
    let path = "/v1/projects/bench/locations/us-central1/batches";
    let body = Bytes::from(serde_json::to_vec(&body()).unwrap_or_default());

    if !opts.warmup.is_zero() {
        eprintln!("warming up for {}", humantime::format_duration(opts.warmup));
        let _ = drive(&endpoint, path, &body, &opts, opts.warmup).await;
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
    let result = drive(&endpoint, path, &body, &opts, opts.duration).await;
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

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "this machine".into())
}

pub(crate) struct DriveResult {
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    pub(crate) latency: Histogram<u64>,
    load_before: String,
}

fn new_histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// One HTTP/1.1 connection per client, no pool to contend on: the load
/// generator shares the two cores with the server, so it must be lean.
async fn connect(authority: &str) -> Option<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(authority).await.ok()?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    Some(sender)
}

/// Sends creates to `endpoint` for `duration`, closed or open loop.
pub(crate) async fn drive(
    endpoint: &str,
    path: &str,
    body: &Bytes,
    opts: &BenchOptions,
    duration: Duration,
) -> DriveResult {
    let load_before = loadavg();
    let authority = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let clients = opts.clients.max(1);
    // Open loop: each connection sends on its own timetable, its share of
    // the rate; latency counts from the scheduled time (wrk2's method).
    let interval = opts
        .rate
        .map(|r| Duration::from_secs_f64(clients as f64 / r.max(1) as f64));
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let authority = authority.clone();
        let path = path.to_string();
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let mut hist = new_histogram();
            let (mut ok, mut errors) = (0u64, 0u64);
            let mut sender = connect(&authority).await;
            let mut next =
                start + interval.map_or(Duration::ZERO, |i| i.mul_f64(c as f64 / clients as f64));
            while Instant::now() < end {
                let scheduled = match interval {
                    Some(i) => {
                        tokio::time::sleep_until(next.into()).await;
                        let s = next;
                        next += i;
                        s
                    }
                    None => Instant::now(),
                };
                let Some(s) = sender.as_mut() else {
                    errors += 1;
                    sender = connect(&authority).await;
                    continue;
                };
                let req = Request::post(path.as_str())
                    .header("host", authority.as_str())
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))
                    .expect("valid request");
                let good = match s.send_request(req).await {
                    Ok(resp) => {
                        let status = resp.status();
                        resp.into_body().collect().await.is_ok() && status.is_success()
                    }
                    Err(_) => {
                        sender = connect(&authority).await;
                        false
                    }
                };
                if good {
                    ok += 1;
                } else {
                    errors += 1;
                }
                let _ = hist.record(scheduled.elapsed().as_micros().max(1) as u64);
            }
            (ok, errors, hist)
        }));
    }
    let mut result = DriveResult {
        ok: 0,
        errors: 0,
        latency: new_histogram(),
        load_before,
    };
    for t in tasks {
        if let Ok((ok, errors, hist)) = t.await {
            result.ok += ok;
            result.errors += errors;
            let _ = result.latency.add(hist);
        }
    }
    result
}

/// A server in this process on a free loopback port, for benchmarks that
/// read its state directly: the app, its address, and what stops it.
pub(crate) async fn serve_in_process(
    config: flexq::config::Config,
) -> Result<(flexq::server::App, std::net::SocketAddr, CancellationToken), CliError> {
    let transport = |e: &dyn std::fmt::Display| CliError::Transport(e.to_string());
    let shutdown = CancellationToken::new();
    let app = flexq::server::App::open(config, shutdown.clone())
        .await
        .map_err(|e| transport(&e))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| transport(&e))?;
    let addr = listener.local_addr().map_err(|e| transport(&e))?;
    tokio::spawn(flexq::server::run(listener, app.clone(), shutdown.clone()));
    Ok((app, addr, shutdown))
}

/// GET `url` as JSON (whatever the status: benchmarks read errors too).
pub(crate) async fn get_json(
    http: &reqwest::Client,
    url: &str,
) -> Result<serde_json::Value, CliError> {
    let transport = |e: reqwest::Error| CliError::Transport(e.to_string());
    http.get(url)
        .send()
        .await
        .map_err(transport)?
        .json()
        .await
        .map_err(transport)
}
