//! The policy simulator: replays a workload trace through the scheduler
//! core ([`crate::scheduler`]) on virtual time — no database, no HTTP, no
//! sleeping — and reports what each project would see: waits, expiries,
//! GPU-hours against its weight, and each zone's GPU utilisation.
//!
//! Capacity is every declared node up (each pool at its `max_nodes`, at
//! least its `virtual_nodes`); quotas and the queue order are the config's.
//! A batch runs for its trace `run_s`, cut at its ttl. Batches submitted at
//! the same instant go in trace order, or in an order shuffled by `seed`.
//! Where the config turns preemption on, a victim stops at the end of its
//! grace, goes back to the queue at its place (its work lost) and runs
//! again from the start once allocated.

mod report;
pub(crate) mod trace;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use chrono::{DateTime, Duration, TimeZone, Utc};
use rand::SeedableRng;
use rand::seq::SliceRandom;

use crate::config::Config;
use crate::scheduler::{BatchKey, Decision, NodeId, PendingBatch, Scheduler};
use crate::spec;

pub use report::{ProjectStats, Report, ZoneStats, compare_table};
pub use trace::{Record, TraceBatch, TraceError, read};

/// Where virtual time starts (any fixed instant: reports depend only on
/// differences).
fn epoch() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 5, 0, 0, 0)
        .single()
        .unwrap_or_default()
}

fn at(seconds: f64) -> DateTime<Utc> {
    epoch() + Duration::milliseconds((seconds * 1000.0).round() as i64)
}

fn seconds(t: DateTime<Utc>) -> f64 {
    (t - epoch()).num_milliseconds() as f64 / 1000.0
}

/// A trace batch refused before the simulation (the API would refuse its
/// create): its line and why.
#[derive(Debug, thiserror::Error)]
#[error("trace line {line}: the batch is refused by the rules: {message}")]
pub struct Refused {
    pub line: usize,
    pub message: String,
}

/// Replays `trace` under `config`. Deterministic: the same trace, config
/// and seed give the same report.
pub fn run(config: &Config, trace: &[TraceBatch], seed: u64) -> Result<Report, Refused> {
    let policy = config.policy();
    let mut core = Scheduler::new(config.pool_decls(), config.quotas.clone());
    core.set_fair_share(config.fair_share());
    core.set_preemption(config.preemption());
    for node in declared_nodes(config) {
        core.add_node(node);
    }
    let mut report = Report::new(config);
    // The zones of the regions the trace uses.
    let regions: std::collections::BTreeSet<&str> =
        trace.iter().map(|b| b.region.as_str()).collect();
    for ((region, zone), gpus) in zone_gpus(config) {
        if regions.contains(region.as_str()) {
            report.zone(&zone).gpus = gpus;
        }
    }

    // Submissions in time order; equal times in trace order, or shuffled.
    let mut order: Vec<usize> = (0..trace.len()).collect();
    order.sort_by(|a, b| trace[*a].submit_s.total_cmp(&trace[*b].submit_s));
    if seed != 0 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        for group in order.chunk_by_mut(|a, b| trace[*a].submit_s == trace[*b].submit_s) {
            group.shuffle(&mut rng);
        }
    }

    // Each queued batch's project and run time; each submitted batch as
    // submitted (a preempted one is queued again from it).
    let mut queued: HashMap<BatchKey, (String, f64)> = HashMap::new();
    let mut submitted: HashMap<BatchKey, (PendingBatch, f64)> = HashMap::new();
    // Clusters' ends by (time, batch, its allocation's number): a
    // preempted batch's first end no longer applies once it runs again.
    let mut ends: BinaryHeap<Reverse<(DateTime<Utc>, BatchKey, u32)>> = BinaryHeap::new();
    let mut runs: HashMap<BatchKey, u32> = HashMap::new();
    // Preempted clusters stop when their grace ends.
    let mut stops: BinaryHeap<Reverse<(DateTime<Utc>, BatchKey)>> = BinaryHeap::new();
    let mut next = 0;
    let mut last = epoch();
    loop {
        let submit = order.get(next).map(|i| at(trace[*i].submit_s));
        let end = ends.peek().map(|Reverse((t, _, _))| *t);
        let stop = stops.peek().map(|Reverse((t, _))| *t);
        let Some(now) = [submit, end, stop, core.next_deadline()]
            .into_iter()
            .flatten()
            .min()
        else {
            break;
        };
        last = last.max(now);
        while let Some(Reverse((t, key, run))) = ends.peek().copied() {
            if t > now {
                break;
            }
            ends.pop();
            if runs.get(&key) != Some(&run) {
                continue;
            }
            if let Some(a) = core.forget(key, t) {
                report.ended(&a, t);
            }
        }
        while let Some(Reverse((t, key))) = stops.peek().copied() {
            if t > now {
                break;
            }
            stops.pop();
            // Gone (its work lost), and queued again at its place.
            let Some(a) = core.forget(key, t) else {
                continue;
            };
            report.ended(&a, t);
            report.preempted(&a, t);
            runs.remove(&key);
            if let Some((batch, run_s)) = submitted.get_mut(&key) {
                batch.preemptions += 1;
                batch.deadline = batch.cluster.deadline(t);
                queued.insert(key, (batch.project.clone(), *run_s));
                core.submit(batch.clone());
            }
        }
        while let Some(&i) = order.get(next) {
            let tb = &trace[i];
            if at(tb.submit_s) > now {
                break;
            }
            next += 1;
            // The server's create rules, placement alternatives included.
            let ids = spec::Identifiers::default();
            let request = spec::validate_create(&tb.batch, ids, &tb.project, &tb.region, &policy)
                .map_err(|r| Refused {
                line: tb.line,
                message: r.message(),
            })?;
            let stats = report.project(&tb.project);
            stats.submitted += 1;
            if core
                .never_fits_anywhere(&tb.project, &tb.region, &request)
                .is_some()
            {
                stats.refused += 1;
                continue;
            }
            let key = BatchKey(tb.line as i64);
            let spec::Request {
                cluster,
                alternatives,
            } = request;
            let deadline = cluster.deadline(now);
            let priority = spec::priority(&tb.batch.labels);
            let ttl = cluster.ttl_s.map_or(f64::INFINITY, |t| t as f64);
            let run_s = tb.run_s.min(ttl);
            queued.insert(key, (tb.project.clone(), run_s));
            let batch = PendingBatch {
                key,
                batch_id: format!("line-{}", tb.line),
                project: tb.project.clone(),
                region: tb.region.clone(),
                priority,
                queued_at: now,
                deadline,
                cluster,
                alternatives,
                preemptions: 0,
            };
            if config
                .regions
                .get(&tb.region)
                .is_some_and(|r| r.preemption.is_some())
            {
                submitted.insert(key, (batch.clone(), run_s));
            }
            core.submit(batch);
        }
        for d in core.pass(now) {
            match d {
                Decision::Allocate(a) => {
                    let ran = queued.remove(&a.key).map_or(0.0, |q| q.1);
                    let end = now + Duration::milliseconds((ran * 1000.0).round() as i64);
                    let run = runs.entry(a.key).or_default();
                    *run += 1;
                    ends.push(Reverse((end, a.key, *run)));
                    report.allocated(&a);
                }
                Decision::Preempt(p) => {
                    let grace = Duration::from_std(p.grace).unwrap_or_default();
                    for v in &p.victims {
                        stops.push(Reverse((now + grace, v.key)));
                    }
                }
                Decision::Expire { key, .. } => {
                    if let Some((project, _)) = queued.remove(&key) {
                        report.project(&project).expired += 1;
                    }
                }
                Decision::Reject { key, .. } => {
                    if let Some((project, _)) = queued.remove(&key) {
                        report.project(&project).rejected += 1;
                    }
                }
                // No agents here: virtual nodes hold no lease.
                Decision::LoseNode { .. } => {}
            }
        }
    }
    let first = trace
        .iter()
        .map(|b| b.submit_s)
        .min_by(f64::total_cmp)
        .unwrap_or(0.0);
    // Zones of other regions that batches reached on a region alternative count
    // from their first allocation; their GPUs are known now.
    for ((_, zone), gpus) in zone_gpus(config) {
        if let Some(z) = report.zones.get_mut(&zone) {
            z.gpus = gpus;
        }
    }
    report.finish(first, seconds(last), &core);
    Ok(report)
}

/// Every declared node, up: each pool at `max_nodes` (at least its
/// virtual nodes).
fn declared_nodes(config: &Config) -> Vec<crate::scheduler::NodeSpec> {
    let mut nodes = Vec::new();
    for decl in config.pool_decls() {
        let count = config
            .regions
            .get(&decl.region)
            .and_then(|r| r.zones.get(&decl.zone))
            .and_then(|z| z.node_pools.get(&decl.node.pool))
            .map_or(decl.max_nodes, |p| p.max_nodes.max(p.virtual_nodes));
        for i in 0..count {
            let mut spec = decl.node.clone();
            spec.id = NodeId(format!("sim/{}/{}/{i}", decl.zone, decl.node.pool));
            spec.is_virtual = true;
            nodes.push(spec);
        }
    }
    nodes
}

/// GPUs per (region, zone), every declared node up.
fn zone_gpus(config: &Config) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for n in declared_nodes(config) {
        *out.entry((n.region.clone(), n.zone.clone())).or_default() += n.gpu_addresses.len() as u64;
    }
    out
}

#[cfg(test)]
mod tests;
