//! Prometheus metrics, all declared here. Names follow Prometheus
//! conventions (`flexq_` prefix, base units, `_total` for counters); labels
//! are of bounded cardinality: region, zone, accelerator, project, metric,
//! reason — never a batch id.
//!
//! Two kinds: counters and histograms of events, recorded where the event
//! happens; and gauges derived from the scheduler's state, computed from a
//! [`Snapshot`] at scrape time so nothing has to keep them up to date.

use std::collections::BTreeSet;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::api::{EndReason, State};
use crate::config::Config;
use crate::scheduler::Snapshot;

/// Wait before allocation: up to the longest allocation timeout (2 h) and
/// beyond.
const WAIT_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 2700.0, 3600.0, 5400.0,
    7200.0, 10240.0,
];

/// Why a batch was refused or failed at once.
pub const REJECT_REASONS: &[&str] = &["invalid", "never_fit", "quota", "stockout"];
/// Why a queued batch is not admitted yet.
pub const PENDING_REASONS: &[&str] = &["quota", "capacity", "reservation"];

struct Metrics {
    registry: Registry,
    transitions: IntCounterVec,
    ended: IntCounterVec,
    gpu_seconds: prometheus::CounterVec,
    admitted: IntCounterVec,
    expired: IntCounterVec,
    rejected: IntCounterVec,
    wait_seconds: HistogramVec,
    leases_lost: IntCounter,
    requeues: IntCounter,
    pass_seconds: HistogramVec,
    decisions: IntCounterVec,
    last_pass: Gauge,
    last_wake: Gauge,
    commit_seconds: HistogramVec,
    commit_batches: HistogramVec,
    http_requests: IntCounterVec,
    http_seconds: HistogramVec,
    grpc_requests: IntCounterVec,
    grpc_seconds: HistogramVec,
    agent_reports: IntCounterVec,
    start_seconds: Histogram,
    run_seconds: HistogramVec,
    leader: IntGaugeVec,
    leader_term: prometheus::IntGauge,
    leader_changes: IntCounterVec,
    fenced: IntCounter,
    config_generation: prometheus::IntGauge,
    config_reloads: IntCounterVec,
    config_last_reload_ok: prometheus::IntGauge,
    config_file_differs: prometheus::IntGauge,
    store_full: prometheus::IntGauge,
    store_full_refusals: IntCounter,
    watchers: prometheus::IntGauge,
    watch_events: IntCounterVec,
    watchers_dropped: IntCounterVec,
    connections: IntGaugeVec,
    connections_limit: IntGaugeVec,
    connections_refused: IntCounterVec,
    connections_timed_out: IntCounterVec,
    accept_errors: IntCounterVec,
    grpc_message_timeouts: IntCounter,
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
}

fn histogram_vec(name: &str, help: &str, buckets: Vec<f64>, labels: &[&str]) -> HistogramVec {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .expect("valid metric")
}

fn exponential(start: f64, count: usize) -> Vec<f64> {
    prometheus::exponential_buckets(start, 2.0, count).expect("valid buckets")
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let m = Metrics {
        registry: Registry::new(),
        leader: IntGaugeVec::new(
            Opts::new(
                "flexq_scheduler_leader",
                "1 when this replica runs the scheduler (the leader, or the only process on SQLite), 0 on a follower; the replica and role are labels.",
            ),
            &["replica", "role"],
        )
        .expect("valid metric"),
        leader_term: prometheus::IntGauge::new(
            "flexq_scheduler_leader_term",
            "The leader-lease term this replica holds (0 when it does not lead or on SQLite).",
        )
        .expect("valid metric"),
        leader_changes: IntCounterVec::new(
            Opts::new(
                "flexq_scheduler_leader_takeovers_total",
                "Times this replica took the leader lease and rebuilt the scheduler from the database; how: lapse (the lease had lapsed or was given up), lock (the holder's session had ended: the leader lock was free), own (this replica's own live lease, in a new term).",
            ),
            &["how"],
        )
        .expect("valid metric"),
        config_generation: prometheus::IntGauge::new(
            "flexq_config_generation",
            "The generation of the config in force on this replica (every replica applies the latest).",
        )
        .expect("valid metric"),
        config_reloads: counter_vec(
            "flexq_config_reloads_total",
            "Config reloads on this replica (SIGHUP or POST /v1/config:reload), by result: ok, invalid (the file was refused and the config in force stayed), failed.",
            &["result"],
        ),
        config_last_reload_ok: prometheus::IntGauge::new(
            "flexq_config_last_reload_successful",
            "1 when the last config reload on this replica put its config in force (or none was tried), 0 when it was refused.",
        )
        .expect("valid metric"),
        config_file_differs: prometheus::IntGauge::new(
            "flexq_config_file_differs",
            "1 when this replica's own config file differs from the generation in force (another replica loaded a different one).",
        )
        .expect("valid metric"),
        store_full: prometheus::IntGauge::new(
            "flexq_store_full",
            "1 while this replica's last write found the database's disk full (writes are refused with RESOURCE_EXHAUSTED STORE_FULL; reads go on); 0 once a write succeeds again.",
        )
        .expect("valid metric"),
        store_full_refusals: IntCounter::new(
            "flexq_store_full_refusals_total",
            "Writes refused because the database's disk was full.",
        )
        .expect("valid metric"),
        watchers: prometheus::IntGauge::new(
            "flexq_watchers",
            "Event-stream watchers (GET .../batches:watch) this replica serves now.",
        )
        .expect("valid metric"),
        watch_events: counter_vec(
            "flexq_watch_events_total",
            "Events sent to watchers, by kind: batch, deleted, position.",
            &["kind"],
        ),
        watchers_dropped: counter_vec(
            "flexq_watchers_dropped_total",
            "Watches ended by the server, by reason: stalled (the watcher stopped reading for limits.watch_stall), refused (over limits.max_watchers).",
            &["reason"],
        ),
        connections: IntGaugeVec::new(
            Opts::new(
                "flexq_connections",
                "Connections open now, by listener (api, metrics); on api, those over the cap included.",
            ),
            &["listener"],
        )
        .expect("valid metric"),
        connections_limit: IntGaugeVec::new(
            Opts::new(
                "flexq_connections_limit",
                "Most connections a listener serves at once: on api, server.max_connections lowered to the descriptor limit less server.reserved_fds.",
            ),
            &["listener"],
        )
        .expect("valid metric"),
        connections_refused: counter_vec(
            "flexq_connections_refused_total",
            "Connections over a listener's cap, by what became of them: overflow (served only /healthz and /readyz; other requests 503 TOO_MANY_CONNECTIONS), closed (no room even for that: closed unanswered).",
            &["listener", "reason"],
        ),
        connections_timed_out: counter_vec(
            "flexq_connections_timed_out_total",
            "Connections closed by a timeout, by which: handshake (TLS), header (a request head not read within server.header_read_timeout, or no first request), idle (no request in flight for server.idle_timeout, or an HTTP/1.1 connection that served requests waiting server.header_read_timeout for its next).",
            &["listener", "timeout"],
        ),
        accept_errors: counter_vec(
            "flexq_connections_accept_errors_total",
            "Failed accepts (out of descriptors, for one): the connection waits in the backlog and is accepted again shortly.",
            &["listener"],
        ),
        grpc_message_timeouts: IntCounter::new(
            "flexq_grpc_message_timeouts_total",
            "gRPC calls answered DEADLINE_EXCEEDED because a request message (or the end of the request stream) did not arrive within server.grpc_message_timeout.",
        )
        .expect("valid metric"),
        fenced: IntCounter::new(
            "flexq_scheduler_fenced_commits_total",
            "Scheduler commits refused because another replica had taken the leader lease.",
        )
        .expect("valid metric"),
        transitions: counter_vec(
            "flexq_batch_transitions_total",
            "Batch state transitions, by the state entered.",
            &["state"],
        ),
        ended: counter_vec(
            "flexq_batches_ended_total",
            "Batches that ended without succeeding, by their typed reason (the batch's flexq.endReason): expired, stockout, quota, infrastructure, work_failed, cancelled.",
            &["reason"],
        ),
        gpu_seconds: prometheus::CounterVec::new(
            Opts::new(
                "flexq_project_gpu_seconds_total",
                "GPU-seconds held by a project's clusters in a region, counted when each cluster is given back (GPUs × seconds from allocation to release).",
            ),
            &["project", "region", "accelerator"],
        )
        .expect("valid metric"),
        admitted: counter_vec(
            "flexq_batches_admitted_total",
            "Whole clusters allocated.",
            &["region", "accelerator"],
        ),
        expired: counter_vec(
            "flexq_batches_expired_total",
            "Queued batches failed because their allocation timeout passed.",
            &["region", "accelerator"],
        ),
        rejected: counter_vec(
            "flexq_batches_rejected_total",
            "Batches refused at submit (invalid, never_fit) or failed at once in default mode (quota, stockout).",
            &["reason"],
        ),
        wait_seconds: histogram_vec(
            "flexq_batch_wait_seconds",
            "Time from submit to the allocation of the whole cluster.",
            WAIT_BUCKETS.to_vec(),
            &["region", "accelerator"],
        ),
        requeues: IntCounter::new(
            "flexq_batch_requeues_total",
            "Batches sent back to the queue after an infrastructure failure (a lost node, an agent that stopped or restarted without them).",
        )
        .expect("valid metric"),
        leases_lost: IntCounter::new(
            "flexq_agent_leases_lost_total",
            "Nodes lost because their agent stopped heartbeating.",
        )
        .expect("valid metric"),
        pass_seconds: histogram_vec(
            "flexq_scheduler_pass_seconds",
            "Time of one scheduler pass, its commit included.",
            exponential(0.00005, 16),
            &["outcome"],
        ),
        decisions: counter_vec(
            "flexq_scheduler_decisions_total",
            "Scheduler decisions committed, by kind.",
            &["decision"],
        ),
        last_pass: Gauge::new(
            "flexq_scheduler_last_pass_timestamp_seconds",
            "Unix time of the scheduler's last pass.",
        )
        .expect("valid metric"),
        last_wake: Gauge::new(
            "flexq_scheduler_last_wake_timestamp_seconds",
            "Unix time of the last event that asked the scheduler for a pass.",
        )
        .expect("valid metric"),
        commit_seconds: histogram_vec(
            "flexq_store_commit_seconds",
            "Time to commit one transaction of creates or of scheduler decisions, fsync included.",
            exponential(0.0001, 16),
            &["kind"],
        ),
        commit_batches: histogram_vec(
            "flexq_store_commit_batches",
            "Creates committed per transaction (group commit size).",
            exponential(1.0, 12),
            &["kind"],
        ),
        http_requests: counter_vec(
            "flexq_http_requests_total",
            "HTTP requests, by route template and status code.",
            &["method", "route", "code"],
        ),
        http_seconds: histogram_vec(
            "flexq_http_request_duration_seconds",
            "HTTP request latency.",
            exponential(0.0005, 14),
            &["method", "route"],
        ),
        grpc_requests: counter_vec(
            "flexq_grpc_requests_total",
            "gRPC calls, by method and status code.",
            &["method", "code"],
        ),
        grpc_seconds: histogram_vec(
            "flexq_grpc_request_duration_seconds",
            "gRPC call latency.",
            exponential(0.0005, 14),
            &["method"],
        ),
        agent_reports: counter_vec(
            "flexq_agent_reports_total",
            "Reports accepted from executor agents, by event.",
            &["event"],
        ),
        start_seconds: Histogram::with_opts(
            HistogramOpts::new(
                "flexq_batch_start_seconds",
                "Time from the allocation of a batch's cluster to its driver running (Spark master start included).",
            )
            .buckets(exponential(0.25, 12)),
        )
        .expect("valid metric"),
        run_seconds: histogram_vec(
            "flexq_batch_run_seconds",
            "Run time of batches, from the driver's start to the end, by how they ended.",
            WAIT_BUCKETS.to_vec(),
            &["state"],
        ),
    };
    let build = IntGaugeVec::new(
        Opts::new("flexq_build_info", "Build information; the value is 1."),
        &["version"],
    )
    .expect("valid metric");
    build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
    // Every way a lease is taken shows from the start, at 0: a dashboard's
    // sum has data before the first failover.
    for how in ["lapse", "lock", "own"] {
        m.leader_changes.with_label_values(&[how]);
    }
    let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
        Box::new(m.leader.clone()),
        Box::new(m.leader_term.clone()),
        Box::new(m.leader_changes.clone()),
        Box::new(m.fenced.clone()),
        Box::new(m.config_generation.clone()),
        Box::new(m.config_reloads.clone()),
        Box::new(m.config_last_reload_ok.clone()),
        Box::new(m.config_file_differs.clone()),
        Box::new(m.store_full.clone()),
        Box::new(m.store_full_refusals.clone()),
        Box::new(m.watchers.clone()),
        Box::new(m.watch_events.clone()),
        Box::new(m.watchers_dropped.clone()),
        Box::new(m.connections.clone()),
        Box::new(m.connections_limit.clone()),
        Box::new(m.connections_refused.clone()),
        Box::new(m.connections_timed_out.clone()),
        Box::new(m.accept_errors.clone()),
        Box::new(m.grpc_message_timeouts.clone()),
        Box::new(m.transitions.clone()),
        Box::new(m.ended.clone()),
        Box::new(m.gpu_seconds.clone()),
        Box::new(m.admitted.clone()),
        Box::new(m.expired.clone()),
        Box::new(m.rejected.clone()),
        Box::new(m.wait_seconds.clone()),
        Box::new(m.leases_lost.clone()),
        Box::new(m.requeues.clone()),
        Box::new(m.pass_seconds.clone()),
        Box::new(m.decisions.clone()),
        Box::new(m.last_pass.clone()),
        Box::new(m.last_wake.clone()),
        Box::new(m.commit_seconds.clone()),
        Box::new(m.commit_batches.clone()),
        Box::new(m.http_requests.clone()),
        Box::new(m.http_seconds.clone()),
        Box::new(m.grpc_requests.clone()),
        Box::new(m.grpc_seconds.clone()),
        Box::new(m.agent_reports.clone()),
        Box::new(m.start_seconds.clone()),
        Box::new(m.run_seconds.clone()),
        Box::new(build),
    ];
    for c in collectors {
        m.registry.register(c).expect("metric registered once");
    }
    m.config_last_reload_ok.set(1);
    for reason in ["stalled", "refused"] {
        m.watchers_dropped.with_label_values(&[reason]);
    }
    for listener in ["api", "metrics"] {
        m.connections.with_label_values(&[listener]);
        m.accept_errors.with_label_values(&[listener]);
        for reason in ["overflow", "closed"] {
            m.connections_refused.with_label_values(&[listener, reason]);
        }
        for timeout in ["handshake", "header", "idle"] {
            m.connections_timed_out
                .with_label_values(&[listener, timeout]);
        }
    }
    for result in ["ok", "invalid", "failed"] {
        m.config_reloads.with_label_values(&[result]);
    }
    for reason in REJECT_REASONS {
        m.rejected.with_label_values(&[reason]);
    }
    for state in State::ALL {
        m.transitions.with_label_values(&[state.name()]);
    }
    for reason in EndReason::ALL {
        m.ended.with_label_values(&[reason.label()]);
    }
    for e in ["MASTER_READY", "DRIVER_STARTED", "FINISHED", "PART_FAILED"] {
        m.agent_reports.with_label_values(&[e]);
    }
    for state in [State::Succeeded, State::Failed, State::Cancelled] {
        m.run_seconds.with_label_values(&[state.name()]);
    }
    for d in ["allocate", "expire", "reject", "lose_node"] {
        m.decisions.with_label_values(&[d]);
    }
    m
});

/// The (region, accelerator) pairs the config offers: their series exist
/// from the start, at zero, so rates and ratios have something to work on.
/// (A set, not a single value: tests open several servers per process.)
static OFFERED: LazyLock<Mutex<BTreeSet<(String, String)>>> =
    LazyLock::new(|| Mutex::new(BTreeSet::new()));

fn offered() -> Vec<(String, String)> {
    OFFERED
        .lock()
        .map(|o| o.iter().cloned().collect())
        .unwrap_or_default()
}

/// Creates the zero series of every offered (region, accelerator).
pub fn init(config: &Config) {
    let offered: Vec<(String, String)> = config
        .regions
        .iter()
        .flat_map(|(r, rc)| {
            rc.accelerators()
                .into_iter()
                .map(move |a| (r.clone(), a.name().to_string()))
        })
        .collect();
    for (r, a) in &offered {
        METRICS.admitted.with_label_values(&[r, a]);
        METRICS.expired.with_label_values(&[r, a]);
        METRICS.wait_seconds.with_label_values(&[r, a]);
    }
    if let Ok(mut set) = OFFERED.lock() {
        set.extend(offered);
    }
}

/// An agent's report was accepted.
pub fn record_agent_report(event: &str) {
    METRICS.agent_reports.with_label_values(&[event]).inc();
}

/// A batch's driver started `after` its cluster was allocated.
pub fn record_started(after: Duration) {
    METRICS.start_seconds.observe(after.as_secs_f64());
}

/// A batch that ran for `ran` ended in `state`.
pub fn record_run(state: State, ran: Duration) {
    METRICS
        .run_seconds
        .with_label_values(&[state.name()])
        .observe(ran.as_secs_f64());
}

/// A cluster of `project` in `region` gave back its GPUs after holding
/// them `gpu_seconds` (GPUs × seconds), counted where the release was
/// decided (not in a replica's mirror of it).
pub fn record_gpu_seconds(project: &str, region: &str, accelerator: &str, gpu_seconds: f64) {
    METRICS
        .gpu_seconds
        .with_label_values(&[project, region, accelerator])
        .inc_by(gpu_seconds.max(0.0));
}

/// A batch entered `state`.
pub fn record_transition(state: State) {
    METRICS.transitions.with_label_values(&[state.name()]).inc();
}

/// A whole cluster allocated after `waited`.
pub fn record_admitted(region: &str, accelerator: &str, waited: Duration) {
    METRICS
        .admitted
        .with_label_values(&[region, accelerator])
        .inc();
    METRICS.decisions.with_label_values(&["allocate"]).inc();
    METRICS
        .wait_seconds
        .with_label_values(&[region, accelerator])
        .observe(waited.as_secs_f64());
}

/// A batch ended without succeeding, for `reason`.
pub fn record_ended(reason: EndReason) {
    METRICS.ended.with_label_values(&[reason.label()]).inc();
}

/// A queued batch expired.
pub fn record_expired(region: &str, accelerator: &str) {
    METRICS
        .expired
        .with_label_values(&[region, accelerator])
        .inc();
    METRICS.decisions.with_label_values(&["expire"]).inc();
    record_transition(State::Failed);
}

/// A batch refused at submit or failed at once; `reason` is one of
/// [`REJECT_REASONS`].
pub fn record_rejected(reason: &str, by_scheduler: bool) {
    METRICS.rejected.with_label_values(&[reason]).inc();
    if by_scheduler {
        METRICS.decisions.with_label_values(&["reject"]).inc();
        record_transition(State::Failed);
    }
}

/// A node's lease lapsed, failing `failed` batches and sending
/// `requeued` back to the queue.
pub fn record_lease_lost(failed: usize, requeued: usize) {
    METRICS.leases_lost.inc();
    METRICS.decisions.with_label_values(&["lose_node"]).inc();
    for _ in 0..failed {
        record_transition(State::Failed);
    }
    for _ in 0..requeued {
        record_requeue();
    }
}

/// A batch went back to the queue after an infrastructure failure.
pub fn record_requeue() {
    METRICS.requeues.inc();
}

/// Watchers served now.
pub fn set_watchers(n: usize) {
    METRICS.watchers.set(n as i64);
}

/// A connection opened on `listener`; the gauge goes down when the guard
/// answered is dropped.
pub fn connection_opened(listener: &'static str) -> OpenConnection {
    METRICS.connections.with_label_values(&[listener]).inc();
    OpenConnection(listener)
}

/// Counts one open connection while it lives.
pub struct OpenConnection(&'static str);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        METRICS.connections.with_label_values(&[self.0]).dec();
    }
}

/// The most connections `listener` serves at once.
pub fn set_connection_limit(listener: &str, limit: usize) {
    METRICS
        .connections_limit
        .with_label_values(&[listener])
        .set(i64::try_from(limit).unwrap_or(i64::MAX));
}

/// A connection over `listener`'s cap: `overflow` or `closed`.
pub fn record_connection_refused(listener: &str, reason: &str) {
    METRICS
        .connections_refused
        .with_label_values(&[listener, reason])
        .inc();
}

/// A connection closed by `timeout`: `handshake`, `header` or `idle`.
pub fn record_connection_timeout(listener: &str, timeout: &str) {
    METRICS
        .connections_timed_out
        .with_label_values(&[listener, timeout])
        .inc();
}

/// An accept on `listener` failed.
pub fn record_accept_error(listener: &str) {
    METRICS.accept_errors.with_label_values(&[listener]).inc();
}

/// A gRPC request message did not arrive in time.
pub fn record_grpc_message_timeout() {
    METRICS.grpc_message_timeouts.inc();
}

/// An event sent to a watcher.
pub fn record_watch_event(kind: &str) {
    METRICS.watch_events.with_label_values(&[kind]).inc();
}

/// A watch the server ended (`stalled`) or refused (`refused`).
pub fn record_watcher_dropped(reason: &str) {
    METRICS.watchers_dropped.with_label_values(&[reason]).inc();
}

/// The config generation in force on this replica.
pub fn set_config_generation(generation: i64) {
    METRICS.config_generation.set(generation);
}

/// A reload ended: `ok`, `invalid` or `failed`.
pub fn record_config_reload(result: &str) {
    METRICS.config_reloads.with_label_values(&[result]).inc();
    METRICS.config_last_reload_ok.set(i64::from(result == "ok"));
}

/// Whether this replica's own config file differs from the one in force.
pub fn set_config_file_differs(differs: bool) {
    METRICS.config_file_differs.set(i64::from(differs));
}

/// Whether the database's disk is full, as this replica's writes last
/// found it.
pub fn set_store_full(full: bool) {
    METRICS.store_full.set(i64::from(full));
}

/// A write refused because the database's disk was full.
pub fn record_store_full_refusal() {
    METRICS.store_full_refusals.inc();
}

/// This replica's scheduling role (one series: the old one is removed).
pub fn set_role(replica: &str, role: &str, term: i64) {
    METRICS.leader.reset();
    METRICS
        .leader
        .with_label_values(&[replica, role])
        .set(i64::from(role != "follower"));
    METRICS.leader_term.set(term);
}

/// This replica took the leader lease; `how` it was taken: `lapse`,
/// `lock` or `own`.
pub fn record_leader_change(how: &str) {
    METRICS.leader_changes.with_label_values(&[how]).inc();
}

/// A commit refused by fencing.
pub fn record_fenced() {
    METRICS.fenced.inc();
}

/// One scheduler pass with `decisions` decisions.
pub fn record_pass(elapsed: Duration, decisions: usize) {
    let outcome = if decisions == 0 { "idle" } else { "decided" };
    METRICS
        .pass_seconds
        .with_label_values(&[outcome])
        .observe(elapsed.as_secs_f64());
    METRICS.last_pass.set(unix_now());
}

/// Something asked the scheduler for a pass.
pub fn record_wake() {
    METRICS.last_wake.set(unix_now());
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// One transaction committed: `kind` is "create" or "decisions".
pub fn record_commit(kind: &str, elapsed: Duration, items: usize) {
    METRICS
        .commit_seconds
        .with_label_values(&[kind])
        .observe(elapsed.as_secs_f64());
    if kind == "create" {
        METRICS
            .commit_batches
            .with_label_values(&[kind])
            .observe(items as f64);
    }
}

/// One HTTP request answered.
pub fn record_http(method: &str, route: &str, code: u16, elapsed: Duration) {
    METRICS
        .http_requests
        .with_label_values(&[method, route, &code.to_string()])
        .inc();
    METRICS
        .http_seconds
        .with_label_values(&[method, route])
        .observe(elapsed.as_secs_f64());
}

/// One gRPC call: `method` is the RPC's name (`CreateBatch`), `code` the
/// status code's name (`OK`, `NOT_FOUND`).
pub fn record_grpc(method: &str, code: &str, elapsed: Duration) {
    METRICS
        .grpc_requests
        .with_label_values(&[method, code])
        .inc();
    METRICS
        .grpc_seconds
        .with_label_values(&[method])
        .observe(elapsed.as_secs_f64());
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("registered once per scrape");
    g
}

/// The gauges of a scheduler snapshot, in a registry of their own.
fn state_registry(s: &Snapshot) -> Registry {
    let r = Registry::new();
    let pending = gauge_vec(
        &r,
        "flexq_pending_batches",
        "Batches waiting for their cluster, by region, accelerator and why they are not admitted.",
        &["region", "accelerator", "reason"],
    );
    let offered = offered();
    for (region, accelerator) in &offered {
        for reason in PENDING_REASONS {
            pending
                .with_label_values(&[region.as_str(), accelerator.as_str(), reason])
                .set(0.0);
        }
    }
    for ((region, accelerator, reason), n) in &s.pending {
        pending
            .with_label_values(&[region.as_str(), accelerator.as_str(), reason])
            .set(*n as f64);
    }
    let ratio = gauge_vec(
        &r,
        "flexq_pending_wait_timeout_ratio",
        "Per region, the largest share of its allocation timeout a queued batch has waited (1 = at its deadline).",
        &["region"],
    );
    for (region, _) in &offered {
        ratio.with_label_values(&[region]).set(0.0);
    }
    for (region, f) in &s.wait_fraction {
        ratio.with_label_values(&[region]).set(*f);
    }
    let limit = gauge_vec(
        &r,
        "flexq_quota_limit",
        "Quota limit.",
        &["project", "region", "metric"],
    );
    let usage = gauge_vec(
        &r,
        "flexq_quota_usage",
        "Quota in use by allocated clusters.",
        &["project", "region", "metric"],
    );
    for ((project, region, metric), (l, u)) in &s.quotas {
        limit
            .with_label_values(&[project, region, metric.name()])
            .set(*l as f64);
        usage
            .with_label_values(&[project, region, metric.name()])
            .set(*u as f64);
    }
    let held = gauge_vec(
        &r,
        "flexq_queue_held",
        "1 for each queue an admin held: a project's in a region, or the whole region's (project \"-\").",
        &["region", "project"],
    );
    for (region, project) in &s.held {
        held.with_label_values(&[region, project]).set(1.0);
    }
    let fair_usage = gauge_vec(
        &r,
        "flexq_fair_share_usage_gpus",
        "A project's usage in the fair-share order: GPUs held now plus past usage decayed with scheduling.usage_half_life.",
        &["region", "project"],
    );
    let fair_share = gauge_vec(
        &r,
        "flexq_fair_share_ratio",
        "A project's usage ÷ its weight: in each region, the lowest goes first.",
        &["region", "project"],
    );
    for ((region, project), (usage, weight)) in &s.fair_share {
        fair_usage.with_label_values(&[region, project]).set(*usage);
        fair_share
            .with_label_values(&[region, project])
            .set(usage / weight.max(f64::MIN_POSITIVE));
    }
    let gpus = gauge_vec(
        &r,
        "flexq_capacity_gpus",
        "GPUs of the nodes: allocated, free, or free on a cordoned node (not offered).",
        &["region", "zone", "accelerator", "state"],
    );
    let ssd = gauge_vec(
        &r,
        "flexq_capacity_local_ssd_bytes",
        "Local SSD of the nodes, allocated or free.",
        &["region", "zone", "accelerator", "state"],
    );
    let nodes = gauge_vec(
        &r,
        "flexq_capacity_nodes",
        "Nodes, registered by agents or virtual (declared for simulation).",
        &["region", "zone", "accelerator", "kind"],
    );
    for row in &s.capacity {
        let l = [
            row.region.as_str(),
            row.zone.as_str(),
            row.accelerator.as_str(),
        ];
        gpus.with_label_values(&[l[0], l[1], l[2], "allocated"])
            .set(row.allocated_gpus as f64);
        gpus.with_label_values(&[l[0], l[1], l[2], "free"])
            .set(row.free_gpus as f64);
        gpus.with_label_values(&[l[0], l[1], l[2], "cordoned"])
            .set(row.cordoned_gpus as f64);
        let gb = 1e9;
        ssd.with_label_values(&[l[0], l[1], l[2], "allocated"])
            .set((row.total_local_ssd_gb - row.free_local_ssd_gb) as f64 * gb);
        ssd.with_label_values(&[l[0], l[1], l[2], "free"])
            .set(row.free_local_ssd_gb as f64 * gb);
        nodes
            .with_label_values(&[l[0], l[1], l[2], "agent"])
            .set((row.nodes - row.virtual_nodes) as f64);
        nodes
            .with_label_values(&[l[0], l[1], l[2], "virtual"])
            .set(row.virtual_nodes as f64);
    }
    let agents = gauge_vec(
        &r,
        "flexq_agent_nodes",
        "Nodes whose agent holds a lease.",
        &["state"],
    );
    agents
        .with_label_values(&["active"])
        .set(s.agent_nodes as f64);
    r
}

/// Long polls waiting now, by kind: one server's own (a process may run
/// several, the tests do), so in a registry of its own made at scrape time.
fn long_poll_registry(long_polls: &[(&str, usize)]) -> Registry {
    let r = Registry::new();
    let g = gauge_vec(
        &r,
        "flexq_long_polls",
        "Long polls waiting now, by kind: assignments (an agent's poll), output (a reader of a batch's output with waitFor), operation (gRPC WaitOperation).",
        &["kind"],
    );
    for (kind, n) in long_polls {
        g.with_label_values(&[kind]).set(*n as f64);
    }
    r
}

/// The text exposition: every event metric, the gauges of `snapshot`, and
/// the long polls waiting now.
pub fn render(snapshot: Option<&Snapshot>, long_polls: &[(&str, usize)]) -> String {
    let mut families = METRICS.registry.gather();
    if let Some(s) = snapshot {
        families.extend(state_registry(s).gather());
    }
    families.extend(long_poll_registry(long_polls).gather());
    families.sort_by(|a, b| a.name().cmp(b.name()));
    let mut buf = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&families, &mut buf) {
        tracing::error!(error = %e, "cannot encode metrics");
    }
    String::from_utf8(buf).unwrap_or_default()
}
