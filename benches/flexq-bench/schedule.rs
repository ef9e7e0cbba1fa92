//! `flexq-bench schedule`: the scheduler at scale, on virtual nodes.
//!
//! 50 regions × 3 zones, queues of mixed shapes, measured four ways:
//! 1. the core alone: one admission pass after a release, and memory per
//!    pending batch;
//! 2. a flood: 1,000 nodes arrive at once under a deep queue, whole
//!    clusters committed per second (real SQLite, group-committed);
//! 3. end to end: a capacity release through the HTTP API until the next
//!    batch's allocation is visible through the API;
//! 4. expiry lateness with many deadlines, and the time from SIGKILL with
//!    a deep queue to a restarted server answering and scheduling again;
//! 5. placement alternatives (`--only alternatives`): the core's pass after a
//!    release with every queued batch carrying an A100-40 alternative, its delay
//!    passed (the A100s full, so every alternative fails) or not, in turns with
//!    no alternatives, and the ratios;
//! 6. preemption (`--only preemption`): the core's pass after a release
//!    with a tenth of the queue urgent (priority 5), with preemption off,
//!    on with no cluster old enough to be a victim, and on with victims
//!    preempted, in turns, and the ratios;
//! 7. elastic batches (`--only elastic`): the pass (and the extras'
//!    grants after it) after a release, with 10,000 running clusters fixed
//!    or elastic (each wanting 3 extras) under the deep queue, in turns,
//!    and the ratio;
//! 8. provisioned pools (`--only provisioned`): the pass after a release,
//!    with a pool of 4 empty nodes in every zone without a provisioner
//!    or with one (its sets of new nodes open), in turns, and the ratio.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use tokio_util::sync::CancellationToken;

use flexq::api::{Batch, BatchName, PySparkBatch, RuntimeConfig};
use flexq::cli::CliError;
use flexq::config::{AlternativesConfig, Config, PoolConfig, ZoneConfig};
use flexq::scheduler::{BatchKey, PendingBatch, QuotaRule, Scheduler};
use flexq::spec::{Accelerator, Policy, QuotaMetric, Request};
use flexq::store::{NewBatch, Store, StoreOptions};

const REGIONS: usize = 50;
/// A timeout value that asks `shaped_batch` for the uniform shape.
const UNIFORM: u64 = u64::MAX;
const ZONES: [&str; 3] = ["a", "b", "c"];

#[derive(Debug, Clone)]
pub(crate) struct ScheduleOptions {
    pub pending: Vec<usize>,
    pub releases: usize,
    /// Only these parts (core, flood, end-to-end, expiry, restart,
    /// alternatives, preemption, elastic, provisioned); all when empty.
    pub only: Vec<String>,
    /// Turns of each setting in the `alternatives` and `preemption` parts.
    pub rounds: usize,
    /// Only this setting of those parts.
    pub setting: Option<String>,
}

pub(crate) fn err(e: impl std::fmt::Display) -> CliError {
    CliError::Transport(e.to_string())
}

/// 50 regions × 3 zones of L4 pools, `virtual_nodes` per zone; unlimited
/// quota.
pub(crate) fn bench_config(
    virtual_nodes: u32,
    data_dir: &std::path::Path,
) -> Result<Config, CliError> {
    let mut c = Config::load_without_env(None).map_err(err)?;
    c.database.data_dir = data_dir.to_path_buf();
    c.limits.mutations_per_minute = u32::MAX;
    c.limits.reads_per_minute = u32::MAX;
    c.limits.max_pending_per_project = u64::MAX;
    c.regions.clear();
    for r in 0..REGIONS {
        let region = format!("bench-r{r:02}");
        let mut zones = BTreeMap::new();
        for z in ZONES {
            let pool = PoolConfig {
                accelerator: Accelerator::L4,
                gpus_per_node: 8,
                cores: 96,
                memory_mb: 393216,
                local_ssd_gb: 3000,
                max_nodes: 64,
                virtual_nodes,
                provisioner: None,
            };
            zones.insert(
                format!("{region}-{z}"),
                ZoneConfig {
                    node_pools: BTreeMap::from([("l4".to_string(), pool)]),
                },
            );
        }
        c.regions.insert(
            region,
            flexq::config::RegionConfig {
                zones,
                preemption: None,
                elastic: Default::default(),
            },
        );
    }
    c.quotas = QuotaMetric::ALL
        .into_iter()
        .map(|metric| QuotaRule {
            project: "*".into(),
            region: "*".into(),
            metric,
            limit: 1 << 40,
        })
        .collect();
    Ok(c)
}

/// A deterministic mix of shapes: 2–12 executors of 4 or 24 cores (or,
/// for a uniform queue, always 3 executors of 4 cores: 4 GPUs).
pub(crate) fn shaped_batch(i: usize, timeout_s: u64) -> Batch {
    let uniform = timeout_s == UNIFORM;
    let executors = if uniform { 3 } else { 2 + (i * 7919) % 11 };
    let cores = if i % 5 == 0 && !uniform { "24" } else { "4" };
    let timeout_s = timeout_s.min(7200);
    let ttl = 3600 + (i * 104729) % 10800;
    let props = [
        (
            "spark.dataproc.driver.resource.accelerator.type",
            "l4".to_string(),
        ),
        (
            "spark.dataproc.executor.resource.accelerator.type",
            "l4".to_string(),
        ),
        (
            "spark.dataproc.executor.compute.tier",
            "premium".to_string(),
        ),
        ("spark.dataproc.executor.disk.tier", "premium".to_string()),
        ("spark.executor.instances", executors.to_string()),
        ("spark.executor.cores", cores.to_string()),
        (
            "spark.dataproc.executor.provisioning.allocationTimeout",
            format!("{timeout_s}s"),
        ),
    ];
    Batch {
        pyspark_batch: Some(PySparkBatch {
            main_python_file_uri: "file:///jobs/etl.py".into(),
            ..Default::default()
        }),
        runtime_config: Some(RuntimeConfig {
            version: Some("3.0".into()),
            properties: props
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..Default::default()
        }),
        environment_config: Some(flexq::api::EnvironmentConfig {
            execution_config: Some(flexq::api::ExecutionConfig {
                ttl: Some(format!("{ttl}s")),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn region_of(i: usize) -> String {
    format!("bench-r{:02}", i % REGIONS)
}

pub(crate) fn cluster_of(policy: &Policy, i: usize, timeout_s: u64) -> Result<Request, CliError> {
    flexq::spec::validate(&shaped_batch(i, timeout_s), "bench", &region_of(i), policy)
        .map_err(|r| err(r.message()))
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

pub(crate) fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// Runs every part and prints the report.
pub(crate) async fn run(opts: ScheduleOptions) -> Result<(), CliError> {
    println!(
        "flexq-bench schedule — {} ({} regions × {} zones, L4 nodes of 8 GPUs)",
        Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        REGIONS,
        ZONES.len()
    );
    let part = |name: &str| opts.only.is_empty() || opts.only.iter().any(|o| o == name);
    let deepest = *opts.pending.last().unwrap_or(&10_000);
    if part("core") {
        for &n in &opts.pending {
            core_pass(n, opts.releases)?;
            queue_pages(n)?;
        }
    }
    if part("flood") {
        flood(20_000).await?;
    }
    if part("end-to-end") {
        end_to_end(deepest, 100).await?;
    }
    if part("expiry") {
        expiry(deepest).await?;
    }
    if part("restart") {
        restart(deepest).await?;
    }
    if part("alternatives") {
        for &n in &opts.pending {
            alternatives_passes(n, &opts)?;
        }
    }
    if part("preemption") {
        for &n in &opts.pending {
            preemption_passes(n, &opts)?;
        }
    }
    if part("provisioned") {
        for &n in &opts.pending {
            provisioned_passes(n, &opts)?;
        }
    }
    if part("elastic") {
        for &n in &opts.pending {
            elastic_passes(n, &opts)?;
        }
    }
    Ok(())
}

/// The alternatives settings the `alternatives` part takes turns with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AlternativesCase {
    /// No alternatives: the baseline.
    Off,
    /// Every batch has an A100-40 alternative whose delay has passed: each pass
    /// tries the alternatives (the A100s are full, so they fail).
    Ripe,
    /// Every batch has an A100-40 alternative whose delay has not passed.
    Unripe,
}

impl AlternativesCase {
    fn name(self) -> &'static str {
        match self {
            AlternativesCase::Off => "off",
            AlternativesCase::Ripe => "ripe",
            AlternativesCase::Unripe => "unripe",
        }
    }
}

/// Part 5: the pass after a release with alternatives off and on, in turns
/// (off ripe unripe, then unripe ripe off, …: the same releases for each,
/// so drift on the machine hits all alike). Every zone also has one
/// A100-40 node of 8 GPUs, taken by an 8-GPU A100 batch of higher
/// priority in the first pass and never released, in every setting.
fn alternatives_passes(n: usize, opts: &ScheduleOptions) -> Result<(), CliError> {
    let settings: Vec<AlternativesCase> = [
        AlternativesCase::Off,
        AlternativesCase::Ripe,
        AlternativesCase::Unripe,
    ]
    .into_iter()
    .filter(|s| opts.setting.as_deref().is_none_or(|only| only == s.name()))
    .collect();
    let names: Vec<&str> = settings.iter().map(|s| s.name()).collect();
    let releases = opts.releases;
    in_turns(
        &format!("[alternatives] pass after one release, {n} pending, {releases} releases"),
        &names,
        opts.rounds,
        |i, h| alternatives_turn(n, releases, settings[i], h),
    )
}

/// Runs `turn(setting, histogram)` for each setting, `rounds` times, in
/// turns (forwards, then backwards: drift on the machine hits all alike),
/// and prints each setting's pass times and its ratio to the first. A
/// turn answers its admissions and a digest of its decisions (the same
/// digest for two builds: the same decisions).
fn in_turns(
    title: &str,
    settings: &[&str],
    rounds: usize,
    mut turn: impl FnMut(usize, &mut Histogram<u64>) -> Result<(usize, u64), CliError>,
) -> Result<(), CliError> {
    let mut hs: Vec<Histogram<u64>> = settings.iter().map(|_| histogram()).collect();
    let mut admitted = vec![(0usize, 0u64); settings.len()];
    for round in 0..rounds.max(1) {
        let mut order: Vec<usize> = (0..settings.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let (count, digest) = turn(i, &mut hs[i])?;
            admitted[i].0 += count;
            admitted[i].1 = admitted[i].1.wrapping_add(digest);
        }
    }
    println!("\n{title} × {} rounds per setting", rounds.max(1));
    for (i, s) in settings.iter().enumerate() {
        println!(
            "  {:<7} p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms  ({} passes, {} decisions, digest {:016x})",
            s,
            ms(&hs[i], 0.5),
            ms(&hs[i], 0.99),
            hs[i].max() as f64 / 1000.0,
            hs[i].len(),
            admitted[i].0,
            admitted[i].1
        );
    }
    for (i, s) in settings.iter().enumerate().skip(1) {
        println!(
            "  {} ÷ {}: p50 {:.2}  p99 {:.2}",
            s,
            settings[0],
            ms(&hs[i], 0.5) / ms(&hs[0], 0.5).max(1e-9),
            ms(&hs[i], 0.99) / ms(&hs[0], 0.99).max(1e-9)
        );
    }
    Ok(())
}

/// A digest of one pass's decisions (which batch, where, on which alternative,
/// whom it preempts), folded into `digest`.
fn fold_digest(digest: u64, pass: usize, decisions: &[flexq::scheduler::Decision]) -> u64 {
    decisions.iter().fold(digest, |digest, decision| {
        let text = match decision {
            flexq::scheduler::Decision::Allocate(a) => {
                format!("{pass} {} {} {}", a.key.0, a.zone, a.alternative_index())
            }
            flexq::scheduler::Decision::Preempt(p) => format!(
                "{pass} {} preempts {:?} in {}",
                p.preemptor.0,
                p.victims.iter().map(|v| v.key.0).collect::<Vec<_>>(),
                p.zone
            ),
            other => format!("{pass} {:?}", other.key()),
        };
        digest.wrapping_mul(0x100_0000_01b3).wrapping_add(
            text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            }),
        )
    })
}

/// One core of `n` queued batches under `setting`, then `releases`
/// release-and-pass steps. Answers the admissions and a digest of them
/// (which batch, where, on which alternative, in which pass), to compare builds.
fn alternatives_turn(
    n: usize,
    releases: usize,
    setting: AlternativesCase,
    h: &mut Histogram<u64>,
) -> Result<(usize, u64), CliError> {
    let dir = tempfile::tempdir().map_err(err)?;
    let mut config = bench_config(7, dir.path())?;
    for region in config.regions.values_mut() {
        for zone in region.zones.values_mut() {
            zone.node_pools.insert(
                "a100-40".to_string(),
                PoolConfig {
                    accelerator: Accelerator::A100_40,
                    gpus_per_node: 8,
                    cores: 96,
                    memory_mb: 696320,
                    local_ssd_gb: 6000,
                    max_nodes: 1,
                    virtual_nodes: 1,
                    provisioner: None,
                },
            );
        }
    }
    let delay = match setting {
        AlternativesCase::Off => None,
        AlternativesCase::Ripe => Some("0s"),
        AlternativesCase::Unripe => Some("30m"),
    };
    config.alternatives = delay
        .map(|d| AlternativesConfig {
            accelerator: Some("l4".into()),
            alternatives: vec![format!("a100-40 after {d}")],
            ..Default::default()
        })
        .into_iter()
        .collect();
    let policy = config.policy();
    let clusters: Vec<Request> = (0..n)
        .map(|i| cluster_of(&policy, i, 7200))
        .collect::<Result<_, _>>()?;
    if setting != AlternativesCase::Off {
        if let Some(i) = clusters.iter().position(|c| c.alternatives.len() != 1) {
            let batch = shaped_batch(i, 7200);
            let why = flexq::spec::alternatives::resolve(
                &batch,
                &clusters[i].cluster,
                "bench",
                &region_of(i),
                &policy,
            )
            .map(|(_, skipped)| format!("{skipped:?}"))
            .unwrap_or_else(|e| e.message());
            return Err(err(format!("batch {i} has no A100-40 rung: {why}")));
        }
    }
    let now = Utc::now();
    let mut core = queued_core(&config, clusters, |_| "bench".into(), now);
    // The A100s, taken first and kept: every alternative finds them full.
    let mut filler = shaped_batch(0, 7200);
    if let Some(rc) = filler.runtime_config.as_mut() {
        for part in ["driver", "executor"] {
            rc.properties.insert(
                format!("spark.dataproc.{part}.resource.accelerator.type"),
                "a100-40".into(),
            );
            rc.properties
                .insert(format!("spark.{part}.cores"), "12".into());
        }
        rc.properties
            .insert("spark.executor.instances".into(), "7".into());
    }
    let mut key = n as i64;
    for r in 0..REGIONS {
        let region = region_of(r);
        let filler = flexq::spec::validate(&filler, "bench", &region, &policy)
            .map_err(|e| err(e.message()))?;
        for _ in ZONES {
            key += 1;
            core.submit(PendingBatch {
                key: BatchKey(key),
                batch_id: format!("a100-{key}"),
                project: "bench".into(),
                region: region.clone(),
                priority: 10,
                queued_at: now,
                deadline: Some(now + chrono::Duration::seconds(7200)),
                cluster: filler.cluster.clone(),
                alternatives: filler.alternatives.clone(),
                preemptions: 0,
            });
        }
    }
    let first = core.pass(now);
    let fillers = first.iter().filter(|d| d.key().0 > n as i64).count();
    if fillers != REGIONS * ZONES.len() {
        return Err(err(format!(
            "{fillers} of {} A100 nodes taken in the first pass",
            REGIONS * ZONES.len()
        )));
    }
    let mut later = now;
    let mut admitted = 0;
    let mut digest = 0u64;
    for k in 0..releases {
        let running: Vec<BatchKey> = core
            .running_keys()
            .into_iter()
            .filter(|k| k.0 <= n as i64)
            .collect();
        let Some(key) = running.get((k * 31) % running.len().max(1)).copied() else {
            break;
        };
        later += chrono::Duration::seconds(1);
        core.forget(key, later);
        let t = Instant::now();
        let d = core.pass(later);
        let _ = h.record(t.elapsed().as_micros().max(1) as u64);
        admitted += d.len();
        digest = fold_digest(digest, k, &d);
    }
    Ok((admitted, digest))
}

/// A core of `config`'s virtual nodes and order with `clusters` queued
/// at `now` (batch `i` of project `project(i)`, in region `region_of(i)`).
pub(crate) fn queued_core(
    config: &Config,
    clusters: Vec<Request>,
    project: impl Fn(usize) -> String,
    now: DateTime<Utc>,
) -> Scheduler {
    let mut core = Scheduler::new(config.pool_decls(), config.quotas.clone());
    core.set_fair_share(config.fair_share());
    for node in config.virtual_nodes() {
        core.add_node(node);
    }
    for (i, request) in clusters.into_iter().enumerate() {
        core.submit(PendingBatch {
            key: BatchKey(i as i64 + 1),
            batch_id: format!("b-{i:07}"),
            project: project(i),
            region: region_of(i),
            priority: 0,
            queued_at: now,
            deadline: Some(now + chrono::Duration::seconds(7200)),
            cluster: request.cluster,
            alternatives: request.alternatives,
            preemptions: 0,
        });
    }
    core
}

/// A page of a queue of `n` batches in one region, of ten projects in
/// fair-share order, as the console reads it: 50 entries, each with its
/// position, reasons and estimated start, from the head, the middle and
/// the end; the region's, and one project's.
fn queue_pages(n: usize) -> Result<(), CliError> {
    let dir = tempfile::tempdir().map_err(err)?;
    let config = bench_config(7, dir.path())?;
    let policy = config.policy();
    let now = Utc::now();
    let region = region_of(0);
    let mut core = Scheduler::new(config.pool_decls(), config.quotas.clone());
    core.set_fair_share(config.fair_share());
    for node in config.virtual_nodes() {
        core.add_node(node);
    }
    for i in 0..n {
        let request = cluster_of(&policy, i, 7200)?;
        core.submit(PendingBatch {
            key: BatchKey(i as i64 + 1),
            batch_id: format!("b-{i:07}"),
            project: format!("p{}", i % 10),
            region: region.clone(),
            priority: 0,
            queued_at: now,
            deadline: Some(now + chrono::Duration::seconds(7200)),
            cluster: request.cluster,
            alternatives: request.alternatives,
            preemptions: 0,
        });
    }
    core.pass(now);
    let mut lines = Vec::new();
    for scope in [None, Some("p3")] {
        let depth = core.queued_in(&region, scope);
        let mut pages = Vec::new();
        for skip in [0, 450.min(depth / 3), depth / 2, depth.saturating_sub(50)] {
            let mut h = histogram();
            for _ in 0..10 {
                let t = Instant::now();
                let (_, page) = core.queue_page(&region, scope, skip, 50, now);
                std::hint::black_box(page.len());
                let _ = h.record(t.elapsed().as_micros().max(1) as u64);
            }
            pages.push(format!(
                "from {skip}: p50 {:.1} ms, max {:.1}",
                ms(&h, 0.5),
                h.max() as f64 / 1000.0
            ));
        }
        lines.push(format!(
            "  {} ({depth} queued): {}",
            scope.map_or("the region's".to_string(), |p| format!("project {p}'s")),
            pages.join("; ")
        ));
    }
    println!("\n[queue page] {n} queued in {region}, 50 entries a page");
    println!("{}", lines.join("\n"));
    Ok(())
}

/// Part 1: the core alone.
fn core_pass(n: usize, releases: usize) -> Result<(), CliError> {
    let dir = tempfile::tempdir().map_err(err)?;
    // 7 virtual nodes per zone: 1,050 nodes.
    let config = bench_config(7, dir.path())?;
    let policy = config.policy();
    let clusters: Vec<Request> = (0..n)
        .map(|i| cluster_of(&policy, i, 7200))
        .collect::<Result<_, _>>()?;
    let now = Utc::now();
    let before = rss_kib();
    let mut core = queued_core(&config, clusters, |_| "bench".into(), now);
    let after = rss_kib();
    let t = Instant::now();
    let first = core.pass(now);
    let first_pass = t.elapsed();
    let mut h = histogram();
    let mut admitted = 0;
    let nodes = core.nodes().len();
    for k in 0..releases {
        if !release(&mut core, k, now) {
            break;
        }
        let t = Instant::now();
        let d = core.pass(now);
        let _ = h.record(t.elapsed().as_micros().max(1) as u64);
        admitted += d.len();
    }
    // A Prometheus scrape: snapshot of the state plus encoding.
    let mut scrape = histogram();
    let mut bytes = 0;
    for _ in 0..20 {
        let t = Instant::now();
        let text = flexq::metrics::render(Some(&core.snapshot(now)), &[], None);
        let _ = scrape.record(t.elapsed().as_micros().max(1) as u64);
        bytes = text.len();
    }
    println!("\n[core] {n} pending, {nodes} nodes");

    println!(
        "  /metrics scrape (snapshot + encoding, {} KiB): p50 {:.1} ms  max {:.1} ms",
        bytes / 1024,
        ms(&scrape, 0.5),
        scrape.max() as f64 / 1000.0
    );
    println!(
        "  memory per pending batch: {:.0} B (RSS +{} KiB for {n})",
        (after.saturating_sub(before) * 1024) as f64 / n as f64,
        after.saturating_sub(before)
    );
    println!(
        "  first pass (everything dirty): {:.1} ms, {} clusters allocated",
        first_pass.as_secs_f64() * 1000.0,
        first.len()
    );
    println!(
        "  pass after one release: p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms ({releases} releases, {admitted} admissions)",
        ms(&h, 0.5),
        ms(&h, 0.99),
        h.max() as f64 / 1000.0
    );
    Ok(())
}

async fn open_store(dir: &std::path::Path) -> Result<Store, CliError> {
    Store::open(&StoreOptions {
        url: format!("sqlite://{}?mode=rwc", dir.join("flexq.db").display()),
        max_connections: 8,
        group_commit_max: 1024,
        limits: Default::default(),
        observe_group: None,
    })
    .await
    .map_err(err)
}

/// Stores `n` batches through the group-committing writer.
async fn fill(store: &Store, config: &Config, n: usize, timeout_s: u64) -> Result<(), CliError> {
    fill_range(store, config, "b", 0, n, timeout_s).await
}

/// Starts a scheduler on `store`; cancel the token to stop it.
async fn start_scheduler(
    config: &Config,
    store: &Store,
) -> Result<(flexq::engine::Engine, CancellationToken), CliError> {
    let shutdown = CancellationToken::new();
    let engine = flexq::engine::Engine::start(
        config.clone().into(),
        flexq::engine::ConfigSource::Given,
        store.clone(),
        shutdown.clone(),
    )
    .await
    .map_err(err)?;
    Ok((engine, shutdown))
}

/// Part 2: 1,000 nodes arrive at once under a deep queue.
async fn flood(n: usize) -> Result<(), CliError> {
    let dir = tempfile::tempdir().map_err(err)?;
    let config = bench_config(0, dir.path())?;
    let store = open_store(dir.path()).await?;
    fill(&store, &config, n, 7200).await?;
    let (engine, shutdown) = start_scheduler(&config, &store).await?;
    // Let the first (empty) pass go by.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let far = Utc::now() + chrono::Duration::hours(1);
    let t = Instant::now();
    let mut nodes = Vec::new();
    {
        let mut i = 0;
        for r in 0..REGIONS {
            for z in ZONES {
                for k in 0..7 {
                    if i == 1000 {
                        break;
                    }
                    i += 1;
                    nodes.push(flexq::scheduler::NodeSpec {
                        id: flexq::scheduler::NodeId(format!("flood-{r}-{z}-{k}")),
                        region: format!("bench-r{r:02}"),
                        zone: format!("bench-r{r:02}-{z}"),
                        pool: "l4".into(),
                        accelerator: Accelerator::L4,
                        gpu_addresses: (0..8).map(|g| g.to_string()).collect(),
                        cores: 96,
                        memory_mb: 393216,
                        local_ssd_gb: 3000,
                        is_virtual: true,
                    });
                }
            }
        }
    }
    engine.add_nodes_for_bench(nodes, far).await;
    // The runner holds the lock across pass and commit: once we get it
    // back after the wake, the allocations are durable.
    let mut allocated = 0;
    while t.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let now = engine.running_keys().await.len();
        if now == allocated && now > 0 {
            break;
        }
        allocated = now;
    }
    let elapsed = t.elapsed().saturating_sub(Duration::from_millis(5));
    let stored: i64 = {
        let page = store.count_by_state().await.map_err(err)?;
        page.iter().map(|(_, c)| c).sum()
    };
    println!("\n[flood] 1,000 nodes (8,000 GPUs) arrive under a queue of {n} ({stored} stored)");
    println!(
        "  {allocated} whole clusters allocated and committed in {:.0} ms = {:.0} allocations/s",
        elapsed.as_secs_f64() * 1000.0,
        allocated as f64 / elapsed.as_secs_f64()
    );
    shutdown.cancel();
    Ok(())
}

/// Part 3: release → next allocation visible through the HTTP API. The
/// queue is uniform (every cluster 4 GPUs), so the batch a release admits
/// is the oldest queued one of its region, known in advance.
async fn end_to_end(n: usize, samples: usize) -> Result<(), CliError> {
    let dir = tempfile::tempdir().map_err(err)?;
    let config = bench_config(2, dir.path())?;
    {
        let store = open_store(dir.path()).await?;
        fill(&store, &config, n, UNIFORM).await?;
        store.close().await;
    }
    let (app, addr, shutdown) = crate::submit::serve_in_process(config).await?;
    let http = reqwest::Client::new();
    // Wait for the first pass to fill the capacity.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut h = histogram();
    for s in 0..samples {
        let running = app.engine.running_keys().await;
        let Some(key) = running.get((s * 17) % running.len().max(1)).copied() else {
            break;
        };
        let victim = app.engine.store().get_by_seq(key.0).await.map_err(err)?;
        let region = victim.name.region.clone();
        let Some(next) = app
            .engine
            .store()
            .oldest_queued("bench", &region)
            .await
            .map_err(err)?
        else {
            continue;
        };
        let next_url = format!(
            "http://{addr}/v1/projects/bench/locations/{region}/batches/{}",
            next.name.batch_id
        );
        let cancel = format!(
            "http://{addr}/v1/projects/bench/regions/{region}/operations/{}:cancel",
            victim.operation_id
        );
        let t = Instant::now();
        http.post(&cancel).send().await.map_err(err)?;
        while t.elapsed() < Duration::from_secs(2) {
            let b = crate::submit::get_json(&http, &next_url).await?;
            if b["flexq"]["provisioningState"] == "PROVISIONED" {
                let _ = h.record(t.elapsed().as_micros().max(1) as u64);
                break;
            }
        }
    }
    println!(
        "\n[end to end] {n} queued; cancel of a running cluster → the next one's allocation visible through the API"
    );
    println!(
        "  p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms ({} samples; each includes the cancel's own commit and HTTP round trips)",
        ms(&h, 0.5),
        ms(&h, 0.99),
        h.max() as f64 / 1000.0,
        h.len()
    );
    shutdown.cancel();
    Ok(())
}

/// Part 4a: expiry lateness with many deadlines.
async fn expiry(n: usize) -> Result<(), CliError> {
    let dir = tempfile::tempdir().map_err(err)?;
    let config = bench_config(0, dir.path())?;
    let store = open_store(dir.path()).await?;
    // Timeouts of 10–19 s: every deadline is still ahead when the scheduler
    // starts after the fill (a deadline that passed before it started would
    // measure the fill, not the scheduler).
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for part in 0..10u64 {
        let store = store.clone();
        let config = config.clone();
        let count = n / 10;
        set.spawn(async move {
            fill_range(
                &store,
                &config,
                "e",
                part as usize * count,
                count,
                10 + part,
            )
            .await
        });
    }
    while let Some(r) = set.join_next().await {
        r.map_err(err)??;
    }
    let filled = started.elapsed();
    if filled >= Duration::from_secs(10) {
        eprintln!(
            "warning: the fill took {filled:?}; the first deadlines passed before the scheduler started"
        );
    }
    let (_engine, shutdown) = start_scheduler(&config, &store).await?;
    let waited = Instant::now();
    while waited.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if store.expiry_lateness_us().await.map_err(err)?.len() >= n {
            break;
        }
    }
    let lateness = store.expiry_lateness_us().await.map_err(err)?;
    let mut h = histogram();
    for l in &lateness {
        let _ = h.record((*l).max(1) as u64);
    }
    println!(
        "\n[expiry] {n} deadlines over ~10 s, a tenth of them within each second (stored in {:.1} s; every deadline still ahead when the scheduler started); expired {}",
        filled.as_secs_f64(),
        lateness.len()
    );
    println!(
        "  lateness after the deadline: p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
        ms(&h, 0.5),
        ms(&h, 0.99),
        h.max() as f64 / 1000.0
    );
    shutdown.cancel();
    Ok(())
}

/// Stores batches `from..from + count` (ids `{prefix}-{i}`) from 32
/// concurrent writers, so the group commit has company.
async fn fill_range(
    store: &Store,
    config: &Config,
    prefix: &str,
    from: usize,
    count: usize,
    timeout_s: u64,
) -> Result<(), CliError> {
    const WRITERS: usize = 32;
    let policy = config.policy();
    let mut set = tokio::task::JoinSet::new();
    for c in 0..WRITERS {
        let store = store.clone();
        let prefix = prefix.to_string();
        let items: Vec<(usize, Request)> = (from + c * count / WRITERS
            ..from + (c + 1) * count / WRITERS)
            .map(|i| Ok((i, cluster_of(&policy, i, timeout_s)?)))
            .collect::<Result<_, CliError>>()?;
        set.spawn(async move {
            for (i, request) in items {
                store
                    .create(NewBatch {
                        name: BatchName::new("bench", &region_of(i), &format!("{prefix}-{i:07}")),
                        uuid: uuid::Uuid::now_v7(),
                        operation_id: uuid::Uuid::now_v7(),
                        request_id: None,
                        creator: "bench".into(),
                        spec: shaped_batch(i, timeout_s),
                        cluster: request.cluster,
                        alternatives: request.alternatives,
                        priority: 0,
                        state_message: "Queued.".into(),
                    })
                    .await
                    .map_err(err)?;
            }
            Ok::<(), CliError>(())
        });
    }
    while let Some(r) = set.join_next().await {
        r.map_err(err)??;
    }
    Ok(())
}

/// Part 4b: SIGKILL with a deep queue, then back in service.
async fn restart(n: usize) -> Result<(), CliError> {
    let dir = tempfile::tempdir().map_err(err)?;
    let config = bench_config(0, dir.path())?;
    {
        let store = open_store(dir.path()).await?;
        fill(&store, &config, n, 7200).await?;
        store.close().await;
    }
    // The server process needs the same regions: write them as a file.
    let file = dir.path().join("bench.toml");
    let mut regions = toml::map::Map::new();
    for (name, r) in &config.regions {
        regions.insert(name.clone(), toml::Value::try_from(r).map_err(err)?);
    }
    let mut doc = toml::map::Map::new();
    doc.insert("regions".into(), toml::Value::Table(regions));
    doc.insert(
        "quotas".into(),
        toml::Value::try_from(&config.quotas).map_err(err)?,
    );
    std::fs::write(
        &file,
        toml::to_string(&toml::Value::Table(doc)).map_err(err)?,
    )
    .map_err(err)?;

    let start = |port: u16| {
        Command::new(env!("CARGO_BIN_EXE_flexq"))
            .args(["serve", "--config"])
            .arg(&file)
            .env("FLEXQ_SERVER__BIND", format!("127.0.0.1:{port}"))
            .env("FLEXQ_DATABASE__DATA_DIR", dir.path())
            .env("FLEXQ_LOG__FILTER", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(err)
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(err)?
        .port();
    let http = reqwest::Client::new();
    let ready = |t: Instant| {
        let http = http.clone();
        async move {
            while t.elapsed() < Duration::from_secs(120) {
                if http
                    .get(format!("http://127.0.0.1:{port}/readyz"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
                {
                    return Some(t.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            None
        }
    };
    let mut child = start(port)?;
    let cold = ready(Instant::now()).await;
    child.kill().map_err(err)?;
    let _ = child.wait();
    let t = Instant::now();
    let mut child = start(port)?;
    let back = ready(t).await;
    // Scheduling again: a new batch that fits is allocated.
    let body = serde_json::json!({
        "pysparkBatch": {"mainPythonFileUri": "file:///jobs/etl.py"},
        "runtimeConfig": {"version": "3.0", "properties": {
            "spark.dataproc.driver.resource.accelerator.type": "l4",
            "spark.dataproc.executor.resource.accelerator.type": "l4",
            "spark.dataproc.executor.compute.tier": "premium",
            "spark.dataproc.executor.disk.tier": "premium"}}});
    let url = format!(
        "http://127.0.0.1:{port}/v1/projects/probe/locations/bench-r00/batches?validateOnly=true"
    );
    let verdict: serde_json::Value = http
        .post(&url)
        .json(&body)
        .send()
        .await
        .map_err(err)?
        .json()
        .await
        .map_err(err)?;
    let scheduling = t.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    println!("\n[restart] {n} queued batches");
    println!(
        "  first start to ready: {:.0} ms",
        cold.unwrap_or_default().as_secs_f64() * 1000.0
    );
    println!(
        "  SIGKILL → restarted and ready: {:.0} ms; scheduler answering (validate-only verdict {}): {:.0} ms",
        back.unwrap_or_default().as_secs_f64() * 1000.0,
        verdict["verdict"],
        scheduling.as_secs_f64() * 1000.0
    );
    Ok(())
}

/// The preemption settings the `preemption` part takes turns with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Preempting {
    /// No policy: the baseline.
    Off,
    /// On by priority and fair share, with a minimum runtime of an hour:
    /// each region's first blocked batch looks for victims and finds none
    /// old enough (the cost of looking).
    Young,
    /// On, with no minimum runtime: victims are found and preempted.
    Ripe,
}

impl Preempting {
    const ALL: [Preempting; 3] = [Preempting::Off, Preempting::Young, Preempting::Ripe];

    fn name(self) -> &'static str {
        match self {
            Preempting::Off => "off",
            Preempting::Young => "young",
            Preempting::Ripe => "ripe",
        }
    }
}

/// Part 6: the pass after a release with preemption off and on, in
/// turns. `n` batches of priority 0 are queued and the first pass
/// allocates what fits; then `n / 10` more of priority 5 arrive, so every
/// region's first blocked batch could preempt a running cluster.
fn preemption_passes(n: usize, opts: &ScheduleOptions) -> Result<(), CliError> {
    let settings: Vec<Preempting> = Preempting::ALL
        .into_iter()
        .filter(|s| opts.setting.as_deref().is_none_or(|only| only == s.name()))
        .collect();
    let names: Vec<&str> = settings.iter().map(|s| s.name()).collect();
    let releases = opts.releases;
    in_turns(
        &format!(
            "[preemption] pass after one release, {n} + {} urgent pending, {releases} releases",
            n / 10
        ),
        &names,
        opts.rounds,
        |i, h| preemption_turn(n, releases, settings[i], h),
    )
}

fn preemption_turn(
    n: usize,
    releases: usize,
    setting: Preempting,
    h: &mut Histogram<u64>,
) -> Result<(usize, u64), CliError> {
    let dir = tempfile::tempdir().map_err(err)?;
    let mut config = bench_config(7, dir.path())?;
    let min_runtime = match setting {
        Preempting::Off => None,
        Preempting::Young => Some(Duration::from_secs(3600)),
        Preempting::Ripe => Some(Duration::ZERO),
    };
    for region in config.regions.values_mut() {
        region.preemption = min_runtime.map(|min_runtime| flexq::config::PreemptionConfig {
            enabled: true,
            by_priority: true,
            by_fair_share: true,
            min_runtime,
            ..Default::default()
        });
    }
    let policy = config.policy();
    let clusters: Vec<Request> = (0..n)
        .map(|i| cluster_of(&policy, i, 7200))
        .collect::<Result<_, _>>()?;
    let now = Utc::now();
    let mut core = queued_core(&config, clusters, |i| format!("team-{}", i % 10), now);
    core.set_preemption(config.preemption());
    core.pass(now);
    let urgent = n / 10;
    let mut queued = Vec::with_capacity(urgent);
    for u in 0..urgent {
        let i = n + u;
        let request = cluster_of(&policy, i, 7200)?;
        queued.push(PendingBatch {
            key: BatchKey(i as i64 + 1),
            batch_id: format!("u-{i:07}"),
            project: format!("team-{}", i % 10),
            region: region_of(i),
            priority: 5,
            queued_at: now,
            deadline: Some(now + chrono::Duration::seconds(7200)),
            cluster: request.cluster,
            alternatives: request.alternatives,
            preemptions: 0,
        });
    }
    // Kept to requeue a victim as the engine does: its batch as queued.
    let mut pending: BTreeMap<BatchKey, PendingBatch> = BTreeMap::new();
    for b in &queued {
        pending.insert(b.key, b.clone());
        core.submit(b.clone());
    }
    let mut later = now;
    let mut decided = 0;
    let mut digest = 0u64;
    for k in 0..releases {
        later += chrono::Duration::seconds(1);
        if !release(&mut core, k, later) {
            break;
        }
        let t = Instant::now();
        let d = core.pass(later);
        let _ = h.record(t.elapsed().as_micros().max(1) as u64);
        decided += d.len();
        digest = fold_digest(digest, k, &d);
        // Victims on virtual nodes are gone at once: forgotten and
        // requeued (as the engine does), then their preemptor's pass.
        let mut banked = false;
        for decision in &d {
            if let flexq::scheduler::Decision::Preempt(p) = decision {
                for v in &p.victims {
                    core.forget(v.key, later);
                    banked = true;
                    let again = pending.get(&v.key).cloned().unwrap_or_else(|| {
                        let request = cluster_of(&policy, (v.key.0 - 1) as usize, 7200)
                            .unwrap_or_else(|_| queued[0].cluster.clone().into());
                        PendingBatch {
                            key: v.key,
                            batch_id: v.batch_id.clone(),
                            project: v.project.clone(),
                            region: p.region.clone(),
                            priority: 0,
                            queued_at: now,
                            deadline: Some(later + chrono::Duration::seconds(7200)),
                            cluster: request.cluster,
                            alternatives: request.alternatives,
                            preemptions: 0,
                        }
                    });
                    core.submit(PendingBatch {
                        preemptions: again.preemptions + 1,
                        ..again
                    });
                }
            }
        }
        if banked {
            let d = core.pass(later);
            decided += d.len();
            digest = fold_digest(digest, k, &d);
        }
    }
    Ok((decided, digest))
}

/// Release `k` of a bench's run: one running cluster (the same for the
/// same state and `k`) ends at `at`. False when none runs.
pub(crate) fn release(core: &mut Scheduler, k: usize, at: DateTime<Utc>) -> bool {
    let running = core.running_keys();
    let Some(key) = running.get((k * 31) % running.len().max(1)).copied() else {
        return false;
    };
    core.forget(key, at);
    true
}

/// Part 8: the pass after a release with 10,000 running clusters under a
/// deep queue, where every zone also declares a pool of 4 nodes that
/// starts empty: without a provisioner (`off`) or with one (`on`: the
/// batches capacity blocks get sets of new nodes, which never register
/// here, so their sets stay open and every pass looks at them and at the
/// pools), in turns.
fn provisioned_passes(n: usize, opts: &ScheduleOptions) -> Result<(), CliError> {
    let settings: Vec<&str> = ["off", "on"]
        .into_iter()
        .filter(|s| opts.setting.as_deref().is_none_or(|only| only == *s))
        .collect();
    let releases = opts.releases;
    in_turns(
        &format!(
            "[provisioned] pass after one release, {n} pending, {ELASTIC_RUNNING} running, {releases} releases"
        ),
        &settings,
        opts.rounds,
        |i, h| provisioned_turn(n, releases, settings[i] == "on", h),
    )
}

fn provisioned_turn(
    n: usize,
    releases: usize,
    provisioner: bool,
    h: &mut Histogram<u64>,
) -> Result<(usize, u64), CliError> {
    let dir = tempfile::tempdir().map_err(err)?;
    let mut config = bench_config(34, dir.path())?;
    for region in config.regions.values_mut() {
        for zone in region.zones.values_mut() {
            let mut pool = zone.node_pools["l4"].clone();
            pool.max_nodes = 4;
            pool.virtual_nodes = 0;
            pool.provisioner = provisioner.then(|| flexq::config::ProvisionerConfig {
                resume_program: vec!["true".into()],
                suspend_program: vec!["true".into()],
                resume_timeout: std::time::Duration::from_secs(3600),
                suspend_timeout: std::time::Duration::from_secs(60),
                suspend_after: std::time::Duration::from_secs(600),
                min_nodes: 0,
                resume_rate: 300,
                backoff: flexq::config::BackoffConfig::default(),
                preempt_if_boot_over: None,
            });
            zone.node_pools.insert("l4-new".into(), pool);
        }
    }
    let now = Utc::now();
    let mut core = running_under_deep_queue(&config, n, now, |i| shaped_batch(i, UNIFORM))?;
    let first = core.pass(now);
    let sets = first
        .iter()
        .filter(|d| matches!(d, flexq::scheduler::Decision::Provision(_)))
        .count();
    if provisioner && sets == 0 {
        return Err(err("no set of new nodes was decided"));
    }
    Ok(passes_after_releases(&mut core, now, releases, h, |_, _| 0))
}

/// A core whose first [`ELASTIC_RUNNING`] batches (`running(i)`, queued
/// first, so the first pass allocates them) run under a deep queue of `n`.
fn running_under_deep_queue(
    config: &Config,
    n: usize,
    now: DateTime<Utc>,
    running: impl Fn(usize) -> Batch,
) -> Result<Scheduler, CliError> {
    let policy = config.policy();
    let mut clusters: Vec<Request> = Vec::with_capacity(ELASTIC_RUNNING + n);
    for i in 0..ELASTIC_RUNNING {
        clusters.push(
            flexq::spec::validate(&running(i), "bench", &region_of(i), &policy)
                .map_err(|r| err(r.message()))?,
        );
    }
    for i in 0..n {
        clusters.push(cluster_of(&policy, ELASTIC_RUNNING + i, 7200)?);
    }
    Ok(queued_core(
        config,
        clusters,
        |i| format!("team-{}", i % 10),
        now,
    ))
}

/// `releases` times: one running cluster ends a second later, and the
/// pass after it (with `after`'s work, as the engine runs them together)
/// is timed into `h`. Answers the decisions made and their digest.
fn passes_after_releases(
    core: &mut Scheduler,
    now: DateTime<Utc>,
    releases: usize,
    h: &mut Histogram<u64>,
    mut after: impl FnMut(&mut Scheduler, DateTime<Utc>) -> usize,
) -> (usize, u64) {
    let mut later = now;
    let mut decided = 0;
    let mut digest = 0u64;
    for k in 0..releases {
        later += chrono::Duration::seconds(1);
        if !release(core, k, later) {
            break;
        }
        let t = Instant::now();
        let d = core.pass(later);
        let more = after(core, later);
        let _ = h.record(t.elapsed().as_micros().max(1) as u64);
        decided += d.len() + more;
        digest = fold_digest(digest, k, &d);
    }
    (decided, digest)
}

/// Running clusters in the `elastic` part (each of 4 GPUs: 40,000 GPUs of
/// the 40,800 that 34 nodes a zone give).
const ELASTIC_RUNNING: usize = 10_000;

/// Part 7: the pass after a release, and the grants of extras after it (as
/// the engine runs them together), with 10,000 running clusters fixed
/// (`none`) or elastic (`elastic`: dynamic allocation on, each wanting 3
/// extras, which the deep queue holds back), in turns.
fn elastic_passes(n: usize, opts: &ScheduleOptions) -> Result<(), CliError> {
    let settings: Vec<&str> = ["none", "elastic"]
        .into_iter()
        .filter(|s| opts.setting.as_deref().is_none_or(|only| only == *s))
        .collect();
    let releases = opts.releases;
    in_turns(
        &format!(
            "[elastic] pass and grants after one release, {n} pending, {ELASTIC_RUNNING} running, {releases} releases"
        ),
        &settings,
        opts.rounds,
        |i, h| elastic_turn(n, releases, settings[i] == "elastic", h),
    )
}

fn elastic_turn(
    n: usize,
    releases: usize,
    elastic: bool,
    h: &mut Histogram<u64>,
) -> Result<(usize, u64), CliError> {
    let dir = tempfile::tempdir().map_err(err)?;
    let config = bench_config(34, dir.path())?;
    let now = Utc::now();
    let mut core = running_under_deep_queue(&config, n, now, |i| {
        let mut batch = shaped_batch(i, UNIFORM);
        if elastic {
            let props = &mut batch
                .runtime_config
                .as_mut()
                .expect("a runtime config")
                .properties;
            for (k, v) in [
                ("spark.dynamicAllocation.enabled", "true"),
                ("spark.dynamicAllocation.minExecutors", "3"),
                ("spark.dynamicAllocation.maxExecutors", "6"),
            ] {
                props.insert(k.to_string(), v.to_string());
            }
        }
        batch
    })?;
    core.set_elastic(config.elastic());
    core.pass(now);
    core.grow(now);
    let running = core.running_keys();
    let mut wanting = 0;
    for key in &running {
        if core.set_demand(*key, 3) {
            wanting += 1;
        }
    }
    if elastic && wanting < ELASTIC_RUNNING * 9 / 10 {
        return Err(err(format!(
            "only {wanting} of {ELASTIC_RUNNING} running clusters are elastic"
        )));
    }
    Ok(passes_after_releases(
        &mut core,
        now,
        releases,
        h,
        |core, later| core.grow(later).len(),
    ))
}
