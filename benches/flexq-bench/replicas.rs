//! `flexq-bench replicas`: one server on SQLite and three replicas on
//! PostgreSQL, side by side in one run:
//!
//! - **release → allocation**: a batch holds the only (virtual) node, the
//!   next one waits for it; the holder is cancelled through one replica and
//!   the waiter submitted through another. The latency is from the commit
//!   that released the node to the allocation of the waiter, both as the
//!   database recorded them: on PostgreSQL it includes the `NOTIFY` to the
//!   leader, wherever the cancel came in.
//! - **durable creates/s**: closed-loop clients spread over the replicas,
//!   each create answered after its commit.
//!
//! The latency is measured first, on a small database; then the creates
//! fill it.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{Value, json};
use sqlx::{Connection, Executor};

use crate::submit::{self as bench, BenchOptions, Server};
use flexq::cli::CliError;

pub(crate) struct ReplicasOptions {
    /// Of the creates phase, per backend.
    pub duration: Duration,
    pub clients: usize,
    /// Release → allocation measurements per backend.
    pub rounds: usize,
    /// A PostgreSQL where the benchmark may create (and drops) a database.
    pub postgres: String,
    pub replicas: usize,
}

fn transport(e: impl std::fmt::Display) -> CliError {
    CliError::Transport(e.to_string())
}

/// One virtual L4 node (4 GPUs) in us-central1-a, nothing else: the
/// latency phase's node. Creates go to europe-west4, where they queue.
fn capacity_toml() -> String {
    let config = flexq::config::Config::load_without_env(None).unwrap_or_else(|_| {
        unreachable!("the embedded default config is checked by the test suite")
    });
    config.virtual_nodes_only("us-central1-a", "l4", 1)
}

/// The flex start example with 1 + 3 L4 GPUs: the whole node.
fn whole_node() -> Value {
    let mut b = bench::body();
    b["runtimeConfig"]["properties"]["spark.executor.instances"] = json!("3");
    b
}

struct Deployment {
    name: String,
    servers: Vec<Server>,
    endpoints: Vec<String>,
    url: String,
}

impl Deployment {
    async fn sqlite() -> Result<Deployment, CliError> {
        let (server, endpoint) = bench::start_server_with(&capacity_toml(), &[]).await?;
        let url = format!(
            "sqlite://{}?mode=rw",
            server.data_dir().join("flexq.db").display()
        );
        Ok(Deployment {
            name: "SQLite, 1 server".into(),
            servers: vec![server],
            endpoints: vec![endpoint],
            url,
        })
    }

    async fn postgres(url: &str, replicas: usize) -> Result<Deployment, CliError> {
        let mut servers = Vec::new();
        let mut endpoints = Vec::new();
        for i in 0..replicas {
            let id = format!("bench-{i}");
            let (s, e) = bench::start_server_with(
                &capacity_toml(),
                &[
                    ("FLEXQ_DATABASE__URL", url),
                    ("FLEXQ_DATABASE__REPLICA_ID", &id),
                ],
            )
            .await?;
            servers.push(s);
            endpoints.push(e);
        }
        Ok(Deployment {
            name: format!("PostgreSQL, {replicas} replicas"),
            servers,
            endpoints,
            url: url.to_string(),
        })
    }

    /// Waits until some replica runs the scheduler.
    async fn leader(&self, http: &reqwest::Client) -> Result<usize, CliError> {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            for (i, e) in self.endpoints.iter().enumerate() {
                let z = bench::get_json(http, &format!("{e}/readyz")).await?;
                if z["role"] == "leader" || z["role"] == "single" {
                    return Ok(i);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(CliError::Transport("no replica leads after 10s".into()))
    }
}

/// Submits `id` through `endpoint`; answers its operation's name.
async fn submit(http: &reqwest::Client, endpoint: &str, id: &str) -> Result<String, CliError> {
    let r = http
        .post(format!(
            "{endpoint}/v1/projects/lat/locations/us-central1/batches?batchId={id}"
        ))
        .json(&whole_node())
        .send()
        .await
        .map_err(transport)?;
    let status = r.status();
    let op: Value = r.json().await.map_err(transport)?;
    if !status.is_success() {
        return Err(CliError::Transport(format!("create {id}: {status} {op}")));
    }
    Ok(op["name"].as_str().unwrap_or_default().to_string())
}

async fn provisioned(http: &reqwest::Client, endpoint: &str, id: &str) -> Result<(), CliError> {
    let url = format!("{endpoint}/v1/projects/lat/locations/us-central1/batches/{id}");
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        let b = bench::get_json(http, &url).await?;
        if b["flexq"]["provisioningState"] == "PROVISIONED" {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Err(CliError::Transport(format!(
        "{id} was not allocated in 20s"
    )))
}

/// Release → allocation latencies, from the database's own records.
async fn release_to_allocation(d: &Deployment, rounds: usize) -> Result<Histogram<u64>, CliError> {
    sqlx::any::install_default_drivers();
    let db = sqlx::AnyPool::connect(&d.url).await.map_err(transport)?;
    let http = reqwest::Client::new();
    let leader = d.leader(&http).await?;
    let n = d.endpoints.len();
    // Submits and cancels go through the followers when there are any.
    let via = |k: usize| &d.endpoints[(leader + 1 + k % n.saturating_sub(1).max(1)) % n];
    let mut holder = (
        "lat-0000".to_string(),
        submit(&http, via(0), "lat-0000").await?,
    );
    provisioned(&http, via(0), &holder.0).await?;
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(transport)?;
    for i in 1..=rounds {
        let id = format!("lat-{i:04}");
        let op = submit(&http, via(i), &id).await?;
        // Let it reach the leader's queue before the node frees.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let cancel = http
            .post(format!("{}/v1/{}:cancel", via(i + 1), holder.1))
            .send()
            .await
            .map_err(transport)?;
        if !cancel.status().is_success() {
            return Err(CliError::Transport(format!("cancel: {}", cancel.status())));
        }
        provisioned(&http, via(i), &id).await?;
        let released: i64 = sqlx::query_scalar(
            "select max(a.released_at) from allocations a join batches b on b.seq = a.batch_seq \
             where b.batch_id = $1",
        )
        .bind(&holder.0)
        .fetch_one(&db)
        .await
        .map_err(transport)?;
        let allocated: i64 =
            sqlx::query_scalar("select allocate_time from batches where batch_id = $1")
                .bind(&id)
                .fetch_one(&db)
                .await
                .map_err(transport)?;
        let _ = h.record((allocated - released).max(1) as u64);
        holder = (id, op);
    }
    db.close().await;
    Ok(h)
}

/// Closed-loop creates over every replica at once.
async fn creates(d: &Deployment, opts: &ReplicasOptions) -> (f64, Histogram<u64>, u64) {
    let mut body = bench::body();
    body["labels"]["bench"] = json!("replicas");
    let load = bench::Load::rest_create("europe-west4", &body);
    let per = BenchOptions {
        clients: (opts.clients / d.endpoints.len()).max(1),
        duration: opts.duration,
        rate: None,
        endpoint: None,
        warmup: Duration::ZERO,
        protocol: bench::Protocol::Rest,
    };
    let started = Instant::now();
    let runs = d
        .endpoints
        .iter()
        .map(|e| bench::drive(e, &load, &per, opts.duration));
    let results = futures_util::future::join_all(runs).await;
    let elapsed = started.elapsed().as_secs_f64();
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    let (mut ok, mut errors) = (0, 0);
    for r in results {
        ok += r.ok;
        errors += r.errors;
        let _ = latency.add(r.latency);
    }
    (ok as f64 / elapsed, latency, errors)
}

struct Figures {
    name: String,
    creates_per_s: f64,
    create: Histogram<u64>,
    errors: u64,
    release: Histogram<u64>,
    peak_mib: f64,
}

async fn measure(d: Deployment, opts: &ReplicasOptions) -> Result<Figures, CliError> {
    eprintln!("{}: release → allocation, {} rounds", d.name, opts.rounds);
    let release = release_to_allocation(&d, opts.rounds).await?;
    eprintln!(
        "{}: creates for {} with {} clients",
        d.name,
        humantime::format_duration(opts.duration),
        opts.clients
    );
    let (creates_per_s, create, errors) = creates(&d, opts).await;
    let peak_mib = d
        .servers
        .iter()
        .filter_map(|s| bench::peak_rss_kib(s.child.id()))
        .max()
        .unwrap_or_default() as f64
        / 1024.0;
    Ok(Figures {
        name: d.name,
        creates_per_s,
        create,
        errors,
        release,
        peak_mib,
    })
}

/// A database of its own on the PostgreSQL at `admin`, dropped afterwards.
async fn with_database(admin: &str) -> Result<(String, String), CliError> {
    let name = format!("flexq_bench_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .map_err(|e| CliError::Transport(format!("PostgreSQL at {admin}: {e}")))?;
    conn.execute(format!("create database {name}").as_str())
        .await
        .map_err(transport)?;
    let base = admin.rsplit_once('/').map_or(admin, |(b, _)| b);
    Ok((format!("{base}/{name}"), name))
}

async fn drop_database(admin: &str, name: &str) {
    if let Ok(mut conn) = sqlx::PgConnection::connect(admin).await {
        let _ = conn
            .execute(format!("drop database if exists {name} with (force)").as_str())
            .await;
    }
}

pub(crate) async fn run(opts: ReplicasOptions) -> Result<(), CliError> {
    let load_before = bench::loadavg();
    let sqlite = measure(Deployment::sqlite().await?, &opts).await?;
    let (url, name) = with_database(&opts.postgres).await?;
    let postgres = match Deployment::postgres(&url, opts.replicas.max(1)).await {
        Ok(d) => measure(d, &opts).await,
        Err(e) => Err(e),
    };
    drop_database(&opts.postgres, &name).await;
    let postgres = postgres?;

    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "flexq-bench replicas — {} on {}",
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        bench::hostname()
    );
    println!(
        "  load average before: {load_before}, after: {}; the load generator shares the machine",
        bench::loadavg()
    );
    println!("  {:<36} {:>22} {:>22}", "", sqlite.name, postgres.name);
    let row = |label: &str, cell: &dyn Fn(&Figures) -> String| {
        println!(
            "  {label:<36} {:>22} {:>22}",
            cell(&sqlite),
            cell(&postgres)
        );
    };
    let pair = |h: &Histogram<u64>, a: f64, b: f64| format!("{:.2} / {:.2}", ms(h, a), ms(h, b));
    row("durable creates/s", &|f| format!("{:.0}", f.creates_per_s));
    row("create p50 / p99 ms", &|f| pair(&f.create, 0.5, 0.99));
    row("create errors", &|f| f.errors.to_string());
    row("release → allocation p50 / p95 ms", &|f| {
        pair(&f.release, 0.5, 0.95)
    });
    row("release → allocation max ms", &|f| {
        format!("{:.2}", f.release.max() as f64 / 1000.0)
    });
    row("largest server peak RSS MiB", &|f| {
        format!("{:.1}", f.peak_mib)
    });
    Ok(())
}
