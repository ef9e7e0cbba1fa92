//! What a scrape computes: the gauges of a scheduler [`Snapshot`] and the
//! scraped server's own (long polls waiting now, a full store), each in a
//! registry made for the scrape, and the text exposition of those beside
//! the event metrics.

use prometheus::{CounterVec, Encoder, GaugeVec, IntGauge, Opts, Registry, TextEncoder};

use super::registry::{METRICS, PENDING_REASONS, offered};
use crate::scheduler::Snapshot;

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
    pending_gauges(&r, s);
    quota_gauges(&r, s);
    queue_order_gauges(&r, s);
    capacity_gauges(&r, s);
    provisioned_gauges(&r, s);
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

/// The pending batches by region, accelerator and reason, and each
/// region's longest wait against its allocation timeout; every offered
/// region (and accelerator) has its series, at 0 when nothing waits.
fn pending_gauges(r: &Registry, s: &Snapshot) {
    let pending = gauge_vec(
        r,
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
        r,
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
}

/// Each project's quota limit and usage, by region and metric.
fn quota_gauges(r: &Registry, s: &Snapshot) {
    let limit = gauge_vec(
        r,
        "flexq_quota_limit",
        "Quota limit.",
        &["project", "region", "metric"],
    );
    let usage = gauge_vec(
        r,
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
}

/// What orders and guards the queues: the queues an admin held, the
/// fair-share usage and ratio of each project, and the clusters
/// preemption no longer touches.
fn queue_order_gauges(r: &Registry, s: &Snapshot) {
    let held = gauge_vec(
        r,
        "flexq_queue_held",
        "1 for each queue an admin held: a project's in a region, or the whole region's (project \"-\").",
        &["region", "project"],
    );
    for (region, project) in &s.held {
        held.with_label_values(&[region, project]).set(1.0);
    }
    let fair_usage = gauge_vec(
        r,
        "flexq_fair_share_usage_gpus",
        "A project's usage in the fair-share order: GPUs held now plus past usage decayed with scheduling.usage_half_life, each GPU at its type's weight (scheduling.gpu_weights).",
        &["region", "project"],
    );
    let fair_share = gauge_vec(
        r,
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
    let protected = gauge_vec(
        r,
        "flexq_preemption_protected_clusters",
        "Per region where preemption is on: running clusters of batches preempted max_preemptions times, which are never victims again.",
        &["region"],
    );
    for (region, n) in &s.preemption_protected {
        protected.with_label_values(&[region]).set(*n as f64);
    }
    let loans = gauge_vec(
        r,
        "flexq_loans_held",
        "Clusters running on a loan of others' capacity (a placement alternative on another GPU type or in another region), by whose capacity: region, zone and the GPU type lent.",
        &["region", "zone", "accelerator"],
    );
    let loan_gpus = gauge_vec(
        r,
        "flexq_loan_gpus",
        "GPUs held on loan, by whose capacity: region, zone and the GPU type lent.",
        &["region", "zone", "accelerator"],
    );
    for ((region, zone, accelerator), (clusters, gpus)) in &s.loans {
        let labels = [region.as_str(), zone.as_str(), accelerator];
        loans.with_label_values(&labels).set(*clusters as f64);
        loan_gpus.with_label_values(&labels).set(*gpus as f64);
    }
    let extras = gauge_vec(
        r,
        "flexq_extras_held",
        "Extra executors elastic batches hold beyond their core gang (docs/rules.md#elastic-batches), by region, project and GPU type.",
        &["region", "project", "accelerator"],
    );
    let extra_gpus = gauge_vec(
        r,
        "flexq_extra_gpus",
        "GPUs held by elastic batches' extra executors, by region, project and GPU type.",
        &["region", "project", "accelerator"],
    );
    for ((region, project, accelerator), (n, gpus)) in &s.extras {
        let labels = [region.as_str(), project.as_str(), accelerator];
        extras.with_label_values(&labels).set(*n as f64);
        extra_gpus.with_label_values(&labels).set(*gpus as f64);
    }
}

/// The nodes' GPUs, local SSD and count, by region, zone and accelerator.
fn capacity_gauges(r: &Registry, s: &Snapshot) {
    let gpus = gauge_vec(
        r,
        "flexq_capacity_gpus",
        "GPUs of the nodes: allocated, free, or free on a cordoned node (not offered).",
        &["region", "zone", "accelerator", "state"],
    );
    let ssd = gauge_vec(
        r,
        "flexq_capacity_local_ssd_bytes",
        "Local SSD of the nodes, allocated or free.",
        &["region", "zone", "accelerator", "state"],
    );
    let nodes = gauge_vec(
        r,
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
}

/// The nodes of provisioned pools by state, and their idle node-seconds
/// (docs/rules.md#provisioned-capacity).
fn provisioned_gauges(r: &Registry, s: &Snapshot) {
    let nodes = gauge_vec(
        r,
        "flexq_provisioned_nodes",
        "Nodes of the pools a provisioner scales, by state: provisioning (created for a queued batch, registered or not), in_use (holds work), idle (holds nothing; suspended after suspend_after down to min_nodes), suspending.",
        &["region", "zone", "pool", "state"],
    );
    for ((pool, state), n) in &s.provisioned_nodes {
        nodes
            .with_label_values(&[pool.0.as_str(), pool.1.as_str(), pool.2.as_str(), state])
            .set(*n as f64);
    }
    let idle = CounterVec::new(
        Opts::new(
            "flexq_provisioned_idle_node_seconds_total",
            "Seconds the nodes of the pools a provisioner scales held nothing, from the pass that saw each empty until it took work or was told to suspend, since this scheduler started.",
        ),
        &["region", "zone", "pool"],
    )
    .expect("valid metric");
    r.register(Box::new(idle.clone()))
        .expect("registered once per scrape");
    for (pool, seconds) in &s.idle_node_seconds {
        idle.with_label_values(&[pool.0.as_str(), pool.1.as_str(), pool.2.as_str()])
            .inc_by(*seconds);
    }
}

/// One server's own gauges, in a registry made at scrape time: a process
/// may run several servers (the tests do), and a process-wide gauge set at
/// scrape time would show whichever server set it last. The long polls
/// waiting now, by kind; and, when the server has a store, whether its
/// last write found the database's disk full.
fn server_registry(long_polls: &[(&str, usize)], store_full: Option<bool>) -> Registry {
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
    if let Some(full) = store_full {
        let g = IntGauge::new(
            "flexq_store_full",
            "1 while this replica's last write found the database's disk full (writes are refused with RESOURCE_EXHAUSTED STORE_FULL; reads go on); 0 once a write succeeds again.",
        )
        .expect("valid metric");
        r.register(Box::new(g.clone()))
            .expect("registered once per scrape");
        g.set(i64::from(full));
    }
    r
}

/// The text exposition: every event metric, the gauges of `snapshot`, and
/// the scraped server's own: the long polls waiting now and, given one,
/// whether its store is full (`None`: no store, no series).
pub fn render(
    snapshot: Option<&Snapshot>,
    long_polls: &[(&str, usize)],
    store_full: Option<bool>,
) -> String {
    let mut families = METRICS.registry.gather();
    if let Some(s) = snapshot {
        families.extend(state_registry(s).gather());
    }
    families.extend(server_registry(long_polls, store_full).gather());
    families.sort_by(|a, b| a.name().cmp(b.name()));
    let mut buf = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&families, &mut buf) {
        tracing::error!(error = %e, "cannot encode metrics");
    }
    String::from_utf8(buf).unwrap_or_default()
}
