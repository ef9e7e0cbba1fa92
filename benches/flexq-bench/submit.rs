//! `submit`: durable creates over loopback, REST and gRPC side by side.
//!
//! Starts its own `flexq serve` (a child process on a temporary SQLite
//! database, `synchronous=FULL`) unless `--endpoint` is given, drives
//! creates with many concurrent clients, and reports accepted creates per
//! second, latency percentiles, the server's peak memory, and the disk's
//! fsync time as the baseline that durable figures depend on. With
//! `--rate` the load is open loop (requests sent on a timetable, latency
//! measured from the scheduled send time, so queueing delay is not hidden).
//!
//! `--protocol all` (the default) measures REST (JSON over HTTP/1.1), the
//! same over HTTP/2 (h2c) and gRPC (`CreateBatch` over h2c) against one
//! server, in turns — A B C, then C B A — so a drift of the machine or of
//! the growing database falls on each alike, and prints the ratios, with
//! the CPU each create cost the server and the load generator. HTTP/1.1
//! clients hold a connection each; HTTP/2 clients share one connection
//! per 64 calls in flight, as a gRPC channel multiplexes its calls.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;

use tokio_util::sync::CancellationToken;

use flexq::cli::CliError;

/// Which front end a run drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Protocol {
    Rest,
    /// REST over HTTP/2 in plaintext (h2c).
    RestH2c,
    Grpc,
    /// REST over HTTP/1.1, REST over h2c and gRPC, in turns.
    All,
}

/// What every request of a run is.
#[derive(Debug, Clone)]
pub(crate) enum Load {
    /// A POST of a JSON body over HTTP/1.1, or over HTTP/2 in plaintext
    /// (h2c) to tell HTTP/2's own cost from gRPC's.
    Rest {
        path: String,
        body: Bytes,
        http2: bool,
    },
    /// A unary gRPC call over HTTP/2 in plaintext (h2c): the framed message.
    Grpc { path: String, frame: Bytes },
}

impl Load {
    /// Creates of [`body`] in `region` of project `bench`, over REST.
    pub(crate) fn rest_create(region: &str, body: &serde_json::Value) -> Load {
        Load::Rest {
            path: format!("/v1/projects/bench/locations/{region}/batches"),
            body: Bytes::from(serde_json::to_vec(body).unwrap_or_default()),
            http2: false,
        }
    }

    /// The same over h2c.
    fn over_http2(self) -> Load {
        match self {
            Load::Rest { path, body, .. } => Load::Rest {
                path,
                body,
                http2: true,
            },
            grpc => grpc,
        }
    }

    /// The same creates as `CreateBatch` calls: the REST body turned into
    /// the message by the server's own transcoding descriptors would be
    /// circular, so the message is built field by field here.
    fn grpc_create(region: &str) -> Load {
        use googleapis_tonic_google_cloud_dataproc_v1::google::cloud::dataproc::v1 as dp;
        let json = body();
        let properties = json["runtimeConfig"]["properties"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let request = dp::CreateBatchRequest {
            parent: format!("projects/bench/locations/{region}"),
            batch: Some(dp::Batch {
                batch_config: Some(dp::batch::BatchConfig::PysparkBatch(dp::PySparkBatch {
                    main_python_file_uri: "file:///jobs/etl.py".into(),
                    ..Default::default()
                })),
                runtime_config: Some(dp::RuntimeConfig {
                    version: "3.0".into(),
                    properties,
                    ..Default::default()
                }),
                labels: [("bench".to_string(), "submit".to_string())].into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let message = request.encode_to_vec();
        let mut frame = Vec::with_capacity(message.len() + 5);
        frame.push(0);
        frame.extend((message.len() as u32).to_be_bytes());
        frame.extend(message);
        Load::Grpc {
            path: "/google.cloud.dataproc.v1.BatchController/CreateBatch".into(),
            frame: Bytes::from(frame),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Load::Rest { http2: false, .. } => "REST (JSON, HTTP/1.1)",
            Load::Rest { http2: true, .. } => "REST (JSON, h2c)",
            Load::Grpc { .. } => "gRPC (CreateBatch, h2c)",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct BenchOptions {
    pub clients: usize,
    pub duration: Duration,
    pub rate: Option<u64>,
    pub endpoint: Option<String>,
    pub warmup: Duration,
    pub protocol: Protocol,
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

/// CPU time (user + system) a process has used so far, from
/// `/proc/PID/stat` (clock ticks of 10 ms: read over seconds, not less).
fn cpu_time(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Runs the benchmark and prints its report.
pub(crate) async fn submit(opts: BenchOptions) -> Result<(), CliError> {
    let (server, endpoint) = match &opts.endpoint {
        Some(e) => (None, e.clone()),
        None => {
            let (s, e) = start_server().await?;
            (Some(s), e)
        }
    };
    let fsync = fsync_baseline(&std::env::temp_dir());
    let loads = match opts.protocol {
        Protocol::Rest => vec![Load::rest_create("us-central1", &body())],
        Protocol::RestH2c => vec![Load::rest_create("us-central1", &body()).over_http2()],
        Protocol::Grpc => vec![Load::grpc_create("us-central1")],
        Protocol::All => vec![
            Load::rest_create("us-central1", &body()),
            Load::rest_create("us-central1", &body()).over_http2(),
            Load::grpc_create("us-central1"),
        ],
    };

    if !opts.warmup.is_zero() {
        eprintln!("warming up for {}", humantime::format_duration(opts.warmup));
        for load in &loads {
            let _ = drive(&endpoint, load, &opts, opts.warmup / loads.len() as u32).await;
        }
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
    // Each load gets the same share of the time, early and late.
    let halves = if loads.len() > 1 { 2 } else { 1 };
    let slice = opts.duration / (halves * loads.len()) as u32;
    let server_pid = server.as_ref().map(|s| s.child.id().to_string());
    let cpu = |pid: Option<&str>| pid.and_then(cpu_time).unwrap_or_default();
    let mut totals: Vec<Totals> = loads.iter().map(|_| Totals::default()).collect();
    let load_before = loadavg();
    for half in 0..halves {
        // A B, then B A: a drift that is linear in time (the database
        // grows) falls equally on both.
        let mut order: Vec<usize> = (0..loads.len()).collect();
        if half % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let started = Instant::now();
            let (server_cpu, own_cpu) = (cpu(server_pid.as_deref()), cpu(Some("self")));
            let r = drive(&endpoint, &loads[i], &opts, slice).await;
            let total = &mut totals[i];
            total.ok += r.ok;
            total.errors += r.errors;
            let _ = total.latency.add(r.latency);
            total.elapsed += started.elapsed();
            total.server_cpu += cpu(server_pid.as_deref()).saturating_sub(server_cpu);
            total.generator_cpu += cpu(Some("self")).saturating_sub(own_cpu);
        }
    }
    let peak = server.as_ref().and_then(|s| peak_rss_kib(s.child.id()));

    println!(
        "flexq-bench submit — {} on {}",
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        hostname()
    );
    println!(
        "  load generator shares the machine with the server; load average before: {load_before}"
    );
    println!(
        "  fsync (4 KiB write + fdatasync) median: {:.0} µs",
        fsync.as_secs_f64() * 1e6
    );
    let mut rates = Vec::new();
    for (load, t) in loads.iter().zip(&totals) {
        let h = &t.latency;
        let q = |p: f64| Duration::from_micros(h.value_at_quantile(p)).as_secs_f64() * 1000.0;
        let rate = t.ok as f64 / t.elapsed.as_secs_f64();
        rates.push(rate);
        let per_create = |d: Duration| d.as_secs_f64() * 1e6 / t.ok.max(1) as f64;
        println!("  {}:", load.name());
        println!(
            "    accepted creates: {} in {:.1}s = {rate:.0}/s (durable: acknowledged after commit)",
            t.ok,
            t.elapsed.as_secs_f64(),
        );
        println!("    errors: {}", t.errors);
        println!(
            "    latency ms: p50 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}",
            q(0.5),
            q(0.99),
            q(0.999),
            h.max() as f64 / 1000.0
        );
        if server_pid.is_some() {
            println!(
                "    CPU per create: server {:.0} µs, load generator {:.0} µs",
                per_create(t.server_cpu),
                per_create(t.generator_cpu)
            );
        }
    }
    if let [rest, rest_h2, grpc] = rates[..] {
        println!(
            "  creates per second, gRPC / REST: {:.2}; gRPC / REST over h2c: {:.2}",
            grpc / rest,
            grpc / rest_h2
        );
    }
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
}

fn new_histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// Calls in flight per HTTP/2 connection (a gRPC channel's connection
/// carries all its calls; grpcio's default limit is 100 streams).
const CALLS_PER_CONNECTION: usize = 64;

/// What one protocol's slices of a run add up to.
struct Totals {
    ok: u64,
    errors: u64,
    latency: Histogram<u64>,
    elapsed: Duration,
    server_cpu: Duration,
    generator_cpu: Duration,
}

impl Default for Totals {
    fn default() -> Totals {
        Totals {
            ok: 0,
            errors: 0,
            latency: new_histogram(),
            elapsed: Duration::ZERO,
            server_cpu: Duration::ZERO,
            generator_cpu: Duration::ZERO,
        }
    }
}

/// A client's own connection.
enum Conn {
    Http1(http1::SendRequest<Full<Bytes>>),
    Http2(http2::SendRequest<Full<Bytes>>),
}

/// One connection per client (HTTP/1.1 for REST, HTTP/2 for gRPC), no
/// pool to contend on: the load generator shares the two cores with the
/// server, so it must be lean.
async fn connect(authority: &str, load: &Load) -> Option<Conn> {
    let stream = tokio::net::TcpStream::connect(authority).await.ok()?;
    let _ = stream.set_nodelay(true);
    match load {
        Load::Rest { http2: false, .. } => {
            let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.ok()?;
            tokio::spawn(conn);
            Some(Conn::Http1(sender))
        }
        Load::Rest { http2: true, .. } | Load::Grpc { .. } => {
            let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .ok()?;
            tokio::spawn(conn);
            Some(Conn::Http2(sender))
        }
    }
}

/// Sends one request: `Ok(accepted)`, or `Err` when the connection broke.
async fn send(conn: &mut Conn, authority: &str, load: &Load) -> Result<bool, ()> {
    match (conn, load) {
        (Conn::Http1(s), Load::Rest { path, body, .. }) => {
            let req = Request::post(path.as_str())
                .header("host", authority)
                .header("content-type", "application/json")
                .body(Full::new(body.clone()))
                .expect("valid request");
            let resp = s.send_request(req).await.map_err(|_| ())?;
            let status = resp.status();
            Ok(resp.into_body().collect().await.is_ok() && status.is_success())
        }
        (Conn::Http2(s), Load::Rest { path, body, .. }) => {
            let req = Request::post(format!("http://{authority}{path}"))
                .header("content-type", "application/json")
                .body(Full::new(body.clone()))
                .expect("valid request");
            let resp = s.send_request(req).await.map_err(|_| ())?;
            let status = resp.status();
            Ok(resp.into_body().collect().await.is_ok() && status.is_success())
        }
        (Conn::Http2(s), Load::Grpc { path, frame }) => {
            let req = Request::post(format!("http://{authority}{path}"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(Full::new(frame.clone()))
                .expect("valid request");
            let resp = s.send_request(req).await.map_err(|_| ())?;
            let Ok(body) = resp.into_body().collect().await else {
                return Ok(false);
            };
            Ok(body
                .trailers()
                .and_then(|t| t.get("grpc-status"))
                .is_some_and(|v| v == "0"))
        }
        _ => Err(()),
    }
}

/// Sends `load` to `endpoint` for `duration`, closed or open loop.
pub(crate) async fn drive(
    endpoint: &str,
    load: &Load,
    opts: &BenchOptions,
    duration: Duration,
) -> DriveResult {
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
    // gRPC clients multiplex their calls over a channel's connection;
    // HTTP/1.1 clients need a connection per call in flight.
    let mut channels = Vec::new();
    if matches!(load, Load::Grpc { .. } | Load::Rest { http2: true, .. }) {
        let n = clients.div_ceil(CALLS_PER_CONNECTION);
        for _ in 0..n {
            if let Some(Conn::Http2(s)) = connect(&authority, load).await {
                channels.push(s);
            }
        }
    }
    let mut tasks = Vec::new();
    for c in 0..clients {
        let authority = authority.clone();
        let load = load.clone();
        let shared =
            (!channels.is_empty()).then(|| Conn::Http2(channels[c % channels.len()].clone()));
        tasks.push(tokio::spawn(async move {
            let mut hist = new_histogram();
            let (mut ok, mut errors) = (0u64, 0u64);
            let mut sender = match shared {
                Some(conn) => Some(conn),
                None => connect(&authority, &load).await,
            };
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
                    sender = connect(&authority, &load).await;
                    continue;
                };
                let good = match send(s, &authority, &load).await {
                    Ok(good) => good,
                    Err(()) => {
                        sender = connect(&authority, &load).await;
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
    let app =
        flexq::server::App::open(config, flexq::engine::ConfigSource::Given, shutdown.clone())
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
