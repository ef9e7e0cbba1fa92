//! Prometheus metrics, all declared in this folder. Names follow Prometheus
//! conventions (`flexq_` prefix, base units, `_total` for counters); labels
//! are of bounded cardinality: region, zone, accelerator, project, metric,
//! reason — never a batch id.
//!
//! Two kinds: counters and histograms of events, recorded where the event
//! happens; and gauges derived from the scheduler's state, computed from a
//! [`Snapshot`](crate::scheduler::Snapshot) at scrape time so nothing has
//! to keep them up to date.
//!
//! `registry.rs` declares the event metrics; this file records events;
//! `scrape.rs` computes the gauges and renders the exposition.

mod registry;
mod scrape;

use std::time::Duration;

use crate::api::{EndReason, State};
use crate::config::Config;
use registry::{METRICS, OFFERED};

pub use registry::{PENDING_REASONS, REJECT_REASONS};
pub use scrape::render;

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

/// A whole cluster allocated on `alternative` (0: its own placement), of the GPU
/// type `asked`, on `given`.
pub fn record_alternative(alternative: u32, asked: &str, given: &str) {
    // Bounded: alternatives are at most spec::alternatives::MAX_ALTERNATIVES.
    METRICS
        .alternatives
        .with_label_values(&[&alternative.to_string(), asked, given])
        .inc();
}

/// A preemption was decided: each victim counted by its project and cause,
/// with the GPU-seconds of work it loses; a loan reclaimed is counted as a
/// reclaim, not a preemption.
pub fn record_preemption(p: &crate::scheduler::Preemption) {
    for v in &p.victims {
        if v.cause.is_reclaim() {
            METRICS
                .reclaims
                .with_label_values(&[&p.region, &v.project])
                .inc();
            METRICS
                .reclaimed_gpu_seconds
                .with_label_values(&[&p.region, &v.project])
                .inc_by(v.gpu_seconds);
            continue;
        }
        METRICS
            .preemptions
            .with_label_values(&[&p.region, &v.project, v.cause.label()])
            .inc();
        METRICS
            .preempted_gpu_seconds
            .with_label_values(&[&p.region, &v.project])
            .inc_by(v.gpu_seconds);
    }
}

/// A provisioned pool: (region, zone, pool).
pub type PoolLabels<'a> = (&'a str, &'a str, &'a str);

/// A set of new nodes of `pool` reached `outcome` (decided, started,
/// allocated, failed, abandoned).
pub fn record_provisioning(pool: PoolLabels<'_>, outcome: &str) {
    METRICS
        .provisioning
        .with_label_values(&[pool.0, pool.1, pool.2, outcome])
        .inc();
}

/// The outcomes a set of new nodes is counted under.
const SET_OUTCOMES: [&str; 5] = ["decided", "started", "allocated", "failed", "abandoned"];

/// Every outcome of each provisioned pool of `config`, at 0 until counted:
/// an alert's `increase` sees a pool's first failure.
pub fn declare_provisioned_pools(config: &crate::config::Config) {
    for (region, r) in &config.regions {
        for (zone, z) in &r.zones {
            for (pool, p) in &z.node_pools {
                if p.provisioner.is_some() {
                    for outcome in SET_OUTCOMES {
                        METRICS.provisioning.with_label_values(&[
                            region.as_str(),
                            zone.as_str(),
                            pool.as_str(),
                            outcome,
                        ]);
                    }
                }
            }
        }
    }
}

/// A set of new nodes of `pool` completed `boot` after its decision.
pub fn record_boot(pool: PoolLabels<'_>, boot: std::time::Duration) {
    METRICS
        .boot_seconds
        .with_label_values(&[pool.0, pool.1, pool.2])
        .observe(boot.as_secs_f64());
}

/// `n` nodes of `pool` were handed to the suspend program for `reason`;
/// `deleted`: it succeeded.
pub fn record_suspension(pool: PoolLabels<'_>, reason: &str, deleted: bool, n: usize) {
    let outcome = if deleted { "ok" } else { "failed" };
    METRICS
        .suspensions
        .with_label_values(&[pool.0, pool.1, pool.2, reason, outcome])
        .inc_by(n as u64);
}

/// A change to an elastic batch's extras of `project` in `region`,
/// committed at `now`: counted by what happened; an extra going back adds
/// the GPU-seconds it held.
pub fn record_extra(
    region: &str,
    project: &str,
    change: &crate::scheduler::ExtraChange,
    now: chrono::DateTime<chrono::Utc>,
) {
    METRICS
        .extra_changes
        .with_label_values(&[region, project, change.label()])
        .inc();
    if let Some(since) = change.since() {
        let seconds = (now - since).num_milliseconds().max(0) as f64 / 1000.0;
        METRICS
            .extra_gpu_seconds
            .with_label_values(&[region, project])
            .inc_by(seconds * change.placement().gpus.len() as f64);
    }
}

/// GPU points of a batch of `project` in `region`, as taken from its agents.
pub fn record_gpu_points(region: &str, project: &str, points: &[crate::gpu::GpuPoint]) {
    let labels = [region, project];
    for p in points {
        let gpu_seconds = p.gpu_seconds();
        METRICS
            .gpu_utilization
            .with_label_values(&labels)
            .observe(p.utilization_percent);
        METRICS
            .gpu_sampled_seconds
            .with_label_values(&labels)
            .inc_by(gpu_seconds);
        if p.idle() {
            METRICS
                .gpu_idle_seconds
                .with_label_values(&labels)
                .inc_by(gpu_seconds);
        }
    }
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

/// This replica has its database again after `lost` without it, as
/// `seen` by its leadership session or its change stream.
pub fn record_database_back(seen: &str, lost: Duration) {
    METRICS
        .database_lost
        .with_label_values(&[seen])
        .observe(lost.as_secs_f64());
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
