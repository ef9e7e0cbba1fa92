//! The process-wide registry of event metrics: each counter and histogram
//! declared once, with its help text and labels, and the series that
//! exist from the start (at zero) so rates have something to work on.

use std::collections::BTreeSet;
use std::sync::{LazyLock, Mutex};

use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    Registry,
};

use crate::api::{EndReason, State};
use crate::scheduler::NotAdmitted;

/// Wait before allocation: up to the longest allocation timeout (2 h) and
/// beyond.
const WAIT_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 2700.0, 3600.0, 5400.0,
    7200.0, 10240.0,
];

/// Why a batch was refused or failed at once.
pub const REJECT_REASONS: &[&str] = &["invalid", "never_fit", "quota", "stockout"];
/// Why a queued batch is not admitted yet.
pub const PENDING_REASONS: &[&str] = &[
    NotAdmitted::Quota.label(),
    NotAdmitted::Capacity.label(),
    NotAdmitted::Reservation.label(),
];

pub(super) struct Metrics {
    pub(super) registry: Registry,
    pub(super) transitions: IntCounterVec,
    pub(super) ended: IntCounterVec,
    pub(super) gpu_seconds: prometheus::CounterVec,
    pub(super) admitted: IntCounterVec,
    pub(super) alternatives: IntCounterVec,
    pub(super) preemptions: IntCounterVec,
    pub(super) preempted_gpu_seconds: prometheus::CounterVec,
    pub(super) reclaims: IntCounterVec,
    pub(super) reclaimed_gpu_seconds: prometheus::CounterVec,
    pub(super) extra_changes: IntCounterVec,
    pub(super) provisioning: IntCounterVec,
    pub(super) boot_seconds: HistogramVec,
    pub(super) suspensions: IntCounterVec,
    pub(super) extra_gpu_seconds: prometheus::CounterVec,
    pub(super) gpu_utilization: HistogramVec,
    pub(super) gpu_sampled_seconds: prometheus::CounterVec,
    pub(super) gpu_idle_seconds: prometheus::CounterVec,
    pub(super) expired: IntCounterVec,
    pub(super) rejected: IntCounterVec,
    pub(super) wait_seconds: HistogramVec,
    pub(super) leases_lost: IntCounter,
    pub(super) requeues: IntCounter,
    pub(super) pass_seconds: HistogramVec,
    pub(super) decisions: IntCounterVec,
    pub(super) last_pass: Gauge,
    pub(super) last_wake: Gauge,
    pub(super) commit_seconds: HistogramVec,
    pub(super) commit_batches: HistogramVec,
    pub(super) http_requests: IntCounterVec,
    pub(super) http_seconds: HistogramVec,
    pub(super) grpc_requests: IntCounterVec,
    pub(super) grpc_seconds: HistogramVec,
    pub(super) agent_reports: IntCounterVec,
    pub(super) start_seconds: Histogram,
    pub(super) run_seconds: HistogramVec,
    pub(super) leader: IntGaugeVec,
    pub(super) leader_term: prometheus::IntGauge,
    pub(super) leader_changes: IntCounterVec,
    pub(super) database_lost: HistogramVec,
    pub(super) fenced: IntCounter,
    pub(super) config_generation: prometheus::IntGauge,
    pub(super) config_reloads: IntCounterVec,
    pub(super) config_last_reload_ok: prometheus::IntGauge,
    pub(super) config_file_differs: prometheus::IntGauge,
    pub(super) store_full_refusals: IntCounter,
    pub(super) watchers: prometheus::IntGauge,
    pub(super) watch_events: IntCounterVec,
    pub(super) watchers_dropped: IntCounterVec,
    pub(super) connections: IntGaugeVec,
    pub(super) connections_limit: IntGaugeVec,
    pub(super) connections_refused: IntCounterVec,
    pub(super) connections_timed_out: IntCounterVec,
    pub(super) accept_errors: IntCounterVec,
    pub(super) grpc_message_timeouts: IntCounter,
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

pub(super) static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
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
        database_lost: histogram_vec(
            "flexq_database_lost_seconds",
            "How long this replica was without its database (PostgreSQL), by what saw it: leadership (its leadership session failed, until one opens again) or listening (its change stream); observed as it comes back, when the pooled connections from before stop being used.",
            exponential(0.25, 10),
            &["seen"],
        ),
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
            "Batches that ended without succeeding, by their typed reason (the batch's flexq.endReason): expired, stockout, quota, infrastructure, work_failed, cancelled, idle_gpus.",
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
        alternatives: counter_vec(
            "flexq_alternative_allocations_total",
            "Whole clusters allocated, by the rung they took (0: the batch's own placement; 1 and up: its placement alternatives) and by the GPU type asked and given.",
            &["rung", "asked", "given"],
        ),
        preemptions: counter_vec(
            "flexq_preemptions_total",
            "Clusters preempted, by region, the victim's project and the cause (priority or fair-share).",
            &["region", "project", "cause"],
        ),
        preempted_gpu_seconds: prometheus::CounterVec::new(
            Opts::new(
                "flexq_preempted_gpu_seconds_total",
                "GPU-seconds of work lost to preemption (GPUs × seconds each preempted cluster had run), by region and the victim's project.",
            ),
            &["region", "project"],
        )
        .expect("valid metric"),
        provisioning: counter_vec(
            "flexq_provisioning_sets_total",
            "Sets of new nodes of provisioned pools, by region, zone, pool and outcome: decided, started (its resume program ran), allocated (every node registered and the batch got them), failed (a node's program failed or the resume timeout passed) or abandoned (the batch left the queue first).",
            &["region", "zone", "pool", "outcome"],
        ),
        boot_seconds: histogram_vec(
            "flexq_provisioning_boot_seconds",
            "Time from a set's decision to the pass that allocated its batch on it (right after its last node's registration), of the sets that completed, by region, zone and pool.",
            WAIT_BUCKETS.to_vec(),
            &["region", "zone", "pool"],
        ),
        suspensions: counter_vec(
            "flexq_nodes_suspended_total",
            "Nodes of provisioned pools handed to their suspend program, by region, zone, pool, why (idle, failed, abandoned, lost, adopted) and how the program ended (ok, failed).",
            &["region", "zone", "pool", "reason", "outcome"],
        ),
        extra_changes: counter_vec(
            "flexq_extra_changes_total",
            "Changes to elastic batches' extra executors, by region, project and what happened: granted, released (Spark no longer used it), reclaimed (taken back for a queued batch) or lost (with its node).",
            &["region", "project", "change"],
        ),
        extra_gpu_seconds: prometheus::CounterVec::new(
            Opts::new(
                "flexq_extra_gpu_seconds_total",
                "GPU-seconds held by elastic batches' extra executors, counted as each goes back, by region and project.",
            ),
            &["region", "project"],
        )
        .expect("valid metric"),
        reclaims: counter_vec(
            "flexq_reclaims_total",
            "Clusters on loan whose owners took the capacity back, by region and the borrower's project.",
            &["region", "project"],
        ),
        reclaimed_gpu_seconds: prometheus::CounterVec::new(
            Opts::new(
                "flexq_reclaimed_gpu_seconds_total",
                "GPU-seconds of work lost to reclaim (GPUs × seconds each reclaimed loan had run), by region and the borrower's project.",
            ),
            &["region", "project"],
        )
        .expect("valid metric"),
        gpu_utilization: histogram_vec(
            "flexq_gpu_utilization_percent",
            "GPU utilization of batches' parts (the mean over a part's GPUs, one observation per agent sample), by region and project.",
            vec![5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 100.0],
            &["region", "project"],
        ),
        gpu_sampled_seconds: prometheus::CounterVec::new(
            Opts::new(
                "flexq_gpu_sampled_seconds_total",
                "GPU-seconds of batches' GPUs sampled by their agents, by region and project.",
            ),
            &["region", "project"],
        )
        .expect("valid metric"),
        gpu_idle_seconds: prometheus::CounterVec::new(
            Opts::new(
                "flexq_gpu_idle_seconds_total",
                "GPU-seconds of batches' GPUs held idle (every GPU of a part under 5 % utilization), by region and project.",
            ),
            &["region", "project"],
        )
        .expect("valid metric"),
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
    for seen in ["leadership", "listening"] {
        m.database_lost.with_label_values(&[seen]);
    }
    let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
        Box::new(m.leader.clone()),
        Box::new(m.leader_term.clone()),
        Box::new(m.leader_changes.clone()),
        Box::new(m.database_lost.clone()),
        Box::new(m.fenced.clone()),
        Box::new(m.config_generation.clone()),
        Box::new(m.config_reloads.clone()),
        Box::new(m.config_last_reload_ok.clone()),
        Box::new(m.config_file_differs.clone()),
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
        Box::new(m.alternatives.clone()),
        Box::new(m.preemptions.clone()),
        Box::new(m.preempted_gpu_seconds.clone()),
        Box::new(m.reclaims.clone()),
        Box::new(m.extra_changes.clone()),
        Box::new(m.provisioning.clone()),
        Box::new(m.boot_seconds.clone()),
        Box::new(m.suspensions.clone()),
        Box::new(m.extra_gpu_seconds.clone()),
        Box::new(m.reclaimed_gpu_seconds.clone()),
        Box::new(m.gpu_utilization.clone()),
        Box::new(m.gpu_sampled_seconds.clone()),
        Box::new(m.gpu_idle_seconds.clone()),
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
pub(super) static OFFERED: LazyLock<Mutex<BTreeSet<(String, String)>>> =
    LazyLock::new(|| Mutex::new(BTreeSet::new()));

pub(super) fn offered() -> Vec<(String, String)> {
    OFFERED
        .lock()
        .map(|o| o.iter().cloned().collect())
        .unwrap_or_default()
}
