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

pub use report::{FleetStats, ProjectStats, SimReport, ZoneStats, compare_table};
pub use trace::{Demand, Record, TraceBatch, TraceError, read};

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

fn seconds_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_milliseconds().max(0) as f64 / 1000.0
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
pub fn run(config: &Config, trace: &[TraceBatch], seed: u64) -> Result<SimReport, Refused> {
    run_with(config, trace, seed, &CloudModel::default())
}

/// What the simulator assumes of the cloud behind provisioned pools
/// (docs/rules.md#provisioned-capacity): each new node registers after a
/// boot time drawn uniformly from `boot_min` to `boot_max`, and a whole
/// set fails (a stock-out) with probability `stockout`, known after half
/// the shortest boot. The suspend program takes `suspend` to delete.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CloudModel {
    pub boot_min: std::time::Duration,
    pub boot_max: std::time::Duration,
    pub stockout: f64,
    pub suspend: std::time::Duration,
}

impl Default for CloudModel {
    fn default() -> CloudModel {
        CloudModel {
            boot_min: std::time::Duration::from_secs(180),
            boot_max: std::time::Duration::from_secs(180),
            stockout: 0.0,
            suspend: std::time::Duration::from_secs(30),
        }
    }
}

/// Replays `trace` under `config`, provisioned pools on `cloud`.
/// Deterministic: the same trace, config, seed and cloud give the same
/// report.
pub fn run_with(
    config: &Config,
    trace: &[TraceBatch],
    seed: u64,
    cloud: &CloudModel,
) -> Result<SimReport, Refused> {
    let mut sim = Sim::new(config, trace, cloud, seed);
    let order = submission_order(trace, seed);
    let mut next = 0;
    let mut last = epoch();
    loop {
        let submit = order.get(next).map(|i| at(trace[*i].submit_s));
        let Some(now) = sim.next_instant(submit) else {
            break;
        };
        last = last.max(now);
        sim.account(now);
        sim.cloud_events(now);
        sim.end_peaks(now);
        sim.end_clusters(now);
        sim.stop_preempted(now);
        while let Some(&i) = order.get(next) {
            let tb = &trace[i];
            if at(tb.submit_s) > now {
                break;
            }
            next += 1;
            sim.submit(tb, now)?;
        }
        sim.pass(now);
        sim.grow(now);
    }
    Ok(sim.finish(last))
}

/// Submissions in time order; equal times in trace order, or shuffled.
fn submission_order(trace: &[TraceBatch], seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..trace.len()).collect();
    order.sort_by(|a, b| trace[*a].submit_s.total_cmp(&trace[*b].submit_s));
    if seed != 0 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        for group in order.chunk_by_mut(|a, b| trace[*a].submit_s == trace[*b].submit_s) {
            group.shuffle(&mut rng);
        }
    }
    order
}

/// A simulation under way: the scheduler core on virtual time, the
/// report it fills, and the batches and clusters in flight.
struct Sim<'a> {
    config: &'a Config,
    trace: &'a [TraceBatch],
    policy: spec::Policy,
    core: Scheduler,
    report: SimReport,
    /// Each queued batch's project and run time.
    queued: HashMap<BatchKey, (String, f64)>,
    /// Each submitted batch as submitted (a preempted one is queued again
    /// from it).
    submitted: HashMap<BatchKey, (PendingBatch, f64)>,
    /// Clusters' ends by (time, batch, its allocation's number): a
    /// preempted batch's first end no longer applies once it runs again.
    ends: BinaryHeap<Reverse<(DateTime<Utc>, BatchKey, u32)>>,
    runs: HashMap<BatchKey, u32>,
    /// Preempted clusters stop when their grace ends.
    stops: BinaryHeap<Reverse<(DateTime<Utc>, BatchKey)>>,
    /// Of those stopping, the loans their owners reclaim.
    reclaimed: std::collections::HashSet<BatchKey>,
    /// What Spark of each batch wants over its run.
    demands: HashMap<BatchKey, trace::Demand>,
    /// The ends of running clusters' peaks, by (time, batch, allocation).
    peaks: BinaryHeap<Reverse<(DateTime<Utc>, BatchKey, u32)>>,
    /// Clusters past their peak: since when, and how many of their GPUs
    /// Spark no longer wants.
    idle: HashMap<BatchKey, (DateTime<Utc>, u64)>,
    /// The cloud behind provisioned pools, its draws and what it does
    /// next: (when, order, event).
    cloud: CloudModel,
    rng: rand_chacha::ChaCha8Rng,
    cloud_events: BinaryHeap<Reverse<(DateTime<Utc>, u64)>>,
    cloud_queue: HashMap<u64, CloudEvent>,
    cloud_seq: u64,
    /// Each booting slot's set: a boot whose set is gone registers nothing.
    booting: HashMap<NodeId, BatchKey>,
    /// The regions the trace uses, and when nodes were last counted.
    regions: std::collections::BTreeSet<String>,
    counted_at: Option<DateTime<Utc>>,
}

/// What the simulated cloud does to a provisioned pool.
enum CloudEvent {
    /// A slot of `key`'s set registers.
    Register(crate::scheduler::NodeSpec, BatchKey),
    /// `key`'s set fails: a stock-out.
    StockOut(BatchKey),
    /// The suspend program deleted these nodes.
    Deleted(Vec<NodeId>),
}

impl<'a> Sim<'a> {
    /// Sets up the core with every declared node up, and the report with
    /// the zones of the regions the trace uses.
    fn new(config: &'a Config, trace: &'a [TraceBatch], cloud: &CloudModel, seed: u64) -> Self {
        let policy = config.policy();
        let mut core = Scheduler::new(config.pool_decls(), config.quotas.clone());
        core.set_fair_share(config.fair_share());
        core.set_preemption(config.preemption());
        core.set_reclaim(policy.alternative_rules.clone());
        core.set_elastic(config.elastic());
        // Provisioned pools start empty: their nodes are created on demand.
        for node in declared_nodes(config, false) {
            core.add_node(node);
        }
        let mut report = SimReport::new(config);
        if trace.iter().any(|b| b.demand != trace::Demand::default()) {
            report.elastic = Some(report::ElasticStats::default());
        }
        // The zones of the regions the trace uses.
        let regions: std::collections::BTreeSet<&str> =
            trace.iter().map(|b| b.region.as_str()).collect();
        for ((region, zone), gpus) in zone_gpus(config) {
            if regions.contains(region.as_str()) {
                report.zone(&zone).gpus = gpus;
            }
        }
        Sim {
            config,
            trace,
            policy,
            core,
            report,
            queued: HashMap::new(),
            submitted: HashMap::new(),
            ends: BinaryHeap::new(),
            runs: HashMap::new(),
            stops: BinaryHeap::new(),
            reclaimed: std::collections::HashSet::new(),
            demands: HashMap::new(),
            peaks: BinaryHeap::new(),
            idle: HashMap::new(),
            cloud: *cloud,
            rng: rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_c10d),
            cloud_events: BinaryHeap::new(),
            cloud_queue: HashMap::new(),
            cloud_seq: 0,
            booting: HashMap::new(),
            regions: trace.iter().map(|b| b.region.clone()).collect(),
            counted_at: None,
        }
    }

    /// Counts the node-hours of the trace's regions from the last count to
    /// `now`: every node there, and those that held nothing.
    fn account(&mut self, now: DateTime<Utc>) {
        let since = self.counted_at.replace(now);
        let Some(since) = since else { return };
        let hours = seconds_between(since, now) / 3600.0;
        if hours <= 0.0 {
            return;
        }
        for (spec, gpus, cores, memory, ssd) in self.core.nodes() {
            if !self.regions.contains(&spec.region) {
                continue;
            }
            let idle = gpus as usize == spec.gpu_addresses.len()
                && cores == spec.cores
                && memory == spec.memory_mb
                && ssd == spec.local_ssd_gb;
            self.report.fleet.node_hours += hours;
            if idle {
                self.report.fleet.idle_node_hours += hours;
            }
        }
    }

    fn at(&mut self, when: DateTime<Utc>, event: CloudEvent) {
        self.cloud_seq += 1;
        self.cloud_queue.insert(self.cloud_seq, event);
        self.cloud_events.push(Reverse((when, self.cloud_seq)));
    }

    /// What the cloud does by `now`: nodes register, sets fail, nodes
    /// are deleted.
    fn cloud_events(&mut self, now: DateTime<Utc>) {
        while let Some(Reverse((t, seq))) = self.cloud_events.peek().copied() {
            if t > now {
                break;
            }
            self.cloud_events.pop();
            match self.cloud_queue.remove(&seq) {
                // A boot whose set is gone registers nothing; one whose set
                // is open joins as a node does (no agent here, so no
                // lease), bound to its set.
                Some(CloudEvent::Register(spec, key))
                    if self.booting.get(&spec.id) == Some(&key) =>
                {
                    self.booting.remove(&spec.id);
                    self.core.add_node(spec);
                }
                Some(CloudEvent::Register(..)) => {}
                Some(CloudEvent::StockOut(key)) => {
                    self.core.resume_failed(key, "stock-out (simulated)".into());
                }
                Some(CloudEvent::Deleted(nodes)) => {
                    for n in &nodes {
                        self.booting.remove(n);
                    }
                    self.core.nodes_suspended(&nodes);
                }
                None => {}
            }
        }
    }

    /// A set decided at `now`: a stock-out, or each node's boot.
    fn provision(&mut self, set: &crate::scheduler::NodeSet, now: DateTime<Utc>) {
        use rand::Rng;
        self.report.fleet.sets += 1;
        let (min, max) = (
            self.cloud.boot_min,
            self.cloud.boot_max.max(self.cloud.boot_min),
        );
        if self.cloud.stockout > 0.0 && self.rng.random::<f64>() < self.cloud.stockout {
            let known = Duration::from_std(min / 2).unwrap_or_default();
            self.at(now + known, CloudEvent::StockOut(set.key));
            return;
        }
        for slot in &set.slots {
            let boot = if max > min {
                min + (max - min).mul_f64(self.rng.random::<f64>())
            } else {
                min
            };
            let mut spec = set.shape.clone();
            spec.id = slot.clone();
            spec.is_virtual = false;
            self.booting.insert(slot.clone(), set.key);
            let when = now + Duration::from_std(boot).unwrap_or_default();
            self.at(when, CloudEvent::Register(spec, set.key));
        }
    }

    /// The next instant anything happens: a submission, a cluster's end, a
    /// preempted cluster's stop or a core deadline; none once all is done.
    fn next_instant(&self, submit: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
        let end = self.ends.peek().map(|Reverse((t, _, _))| *t);
        let stop = self.stops.peek().map(|Reverse((t, _))| *t);
        let peak = self.peaks.peek().map(|Reverse((t, _, _))| *t);
        let cloud = self.cloud_events.peek().map(|Reverse((t, _))| *t);
        [submit, end, stop, peak, cloud, self.core.next_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Ends the clusters whose run time is over by `now`.
    fn end_clusters(&mut self, now: DateTime<Utc>) {
        while let Some(Reverse((t, key, run))) = self.ends.peek().copied() {
            if t > now {
                break;
            }
            self.ends.pop();
            if self.runs.get(&key) != Some(&run) {
                continue;
            }
            if let Some(a) = self.core.forget(key, t) {
                self.cluster_ended(&a, t);
            }
        }
    }

    /// The clusters whose peak is over by `now`: Spark wants its
    /// after-peak executors; an elastic cluster gives extras back, and
    /// what Spark no longer wants of the rest is held idle from now.
    fn end_peaks(&mut self, now: DateTime<Utc>) {
        while let Some(Reverse((t, key, run))) = self.peaks.peek().copied() {
            if t > now {
                break;
            }
            self.peaks.pop();
            if self.runs.get(&key) != Some(&run) {
                continue;
            }
            let Some(a) = self.core.allocation(key) else {
                continue;
            };
            let core = &a.placements[..a.placements.len() - a.extras().len()];
            let executors: Vec<&crate::scheduler::Placement> = core
                .iter()
                .filter(|p| p.role == crate::scheduler::PartRole::Executor)
                .collect();
            let per_executor = executors.first().map_or(0, |p| p.gpus.len() as u64);
            // After its peak Spark wants `after_peak` executors (default:
            // its core's).
            let after = self
                .demands
                .get(&key)
                .and_then(|d| d.after_peak)
                .unwrap_or(executors.len() as u32);
            let unwanted = (executors.len() as u64).saturating_sub(u64::from(after));
            let extras_wanted = after.saturating_sub(executors.len() as u32);
            if unwanted > 0 {
                self.idle.insert(key, (t, unwanted * per_executor));
            }
            for change in self.core.set_wanted(key, extras_wanted, t) {
                self.extra_change(change, t);
            }
        }
    }

    /// A cluster ended at `at` (its run, or its grace after a preemption).
    fn cluster_ended(&mut self, a: &crate::scheduler::Allocation, at: DateTime<Utc>) {
        self.report.ended(a, at);
        let idle = self.idle.remove(&a.key);
        if let Some(stats) = self.report.elastic.as_mut() {
            let extras = a.elastic.iter().flat_map(|g| g.granted.iter());
            stats.extra_gpu_hours += a
                .extras()
                .iter()
                .zip(extras)
                .map(|(p, since)| p.gpus.len() as f64 * seconds_between(*since, at))
                .sum::<f64>()
                / 3600.0;
            if let Some((since, gpus)) = idle {
                stats.idle_gpu_hours += gpus as f64 * seconds_between(since, at) / 3600.0;
            }
        }
    }

    /// After a pass: the extras the core grants elastic clusters.
    fn grow(&mut self, now: DateTime<Utc>) {
        for change in self.core.grow(now) {
            self.extra_change(change, now);
        }
    }

    fn extra_change(&mut self, change: crate::scheduler::ExtraChange, now: DateTime<Utc>) {
        use crate::scheduler::ExtraChange;
        let Some(stats) = self.report.elastic.as_mut() else {
            return;
        };
        stats.extras_reclaimed += u64::from(matches!(change, ExtraChange::Reclaimed { .. }));
        match change {
            ExtraChange::Granted { .. } => stats.extras_granted += 1,
            ExtraChange::Reclaimed {
                key,
                placement,
                since,
                ..
            }
            | ExtraChange::Released {
                key,
                placement,
                since,
                ..
            }
            | ExtraChange::Lost {
                key,
                placement,
                since,
                ..
            } => {
                let hours = placement.gpus.len() as f64 * seconds_between(since, now) / 3600.0;
                stats.extra_gpu_hours += hours;
                if let Some(a) = self.core.allocation(key) {
                    let (project, zone) = (a.project.clone(), a.zone.clone());
                    self.report.project(&project).gpu_hours += hours;
                    self.report.zone(&zone).gpu_hours += hours;
                }
            }
        }
    }

    /// Stops the preempted clusters whose grace is over by `now`, and
    /// queues their batches again.
    fn stop_preempted(&mut self, now: DateTime<Utc>) {
        while let Some(Reverse((t, key))) = self.stops.peek().copied() {
            if t > now {
                break;
            }
            self.stops.pop();
            // Gone (its work lost), and queued again at its place.
            let Some(a) = self.core.forget(key, t) else {
                continue;
            };
            self.cluster_ended(&a, t);
            let reclaimed = self.reclaimed.remove(&key);
            if reclaimed {
                self.report.reclaimed(&a, t);
            } else {
                self.report.preempted(&a, t);
            }
            self.runs.remove(&key);
            if let Some((batch, run_s)) = self.submitted.get_mut(&key) {
                // A loan taken back is not a preemption.
                batch.preemptions += u32::from(!reclaimed);
                batch.deadline = batch.cluster.deadline(t);
                self.queued.insert(key, (batch.project.clone(), *run_s));
                self.core.submit(batch.clone());
            }
        }
    }

    /// Submits one trace batch at `now` under the server's create rules;
    /// one that never fits anywhere counts as refused.
    fn submit(&mut self, tb: &TraceBatch, now: DateTime<Utc>) -> Result<(), Refused> {
        // The server's create rules, placement alternatives included.
        let ids = spec::Identifiers::default();
        let request = spec::validate_create(&tb.batch, ids, &tb.project, &tb.region, &self.policy)
            .map_err(|r| Refused {
                line: tb.line,
                message: r.message(),
            })?;
        let stats = self.report.project(&tb.project);
        stats.submitted += 1;
        if self
            .core
            .never_fits_anywhere(&tb.project, &tb.region, &request)
            .is_some()
        {
            stats.refused += 1;
            return Ok(());
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
        self.queued.insert(key, (tb.project.clone(), run_s));
        self.demands.insert(key, tb.demand);
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
        // A batch that may be stopped is queued again from its submission:
        // where preemption is on, or where it may run on a loan.
        let may_stop = self
            .config
            .regions
            .get(&tb.region)
            .is_some_and(|r| r.preemption.is_some())
            || batch.alternatives.iter().any(spec::Alternative::is_loan);
        if may_stop {
            self.submitted.insert(key, (batch.clone(), run_s));
        }
        self.core.submit(batch);
        Ok(())
    }

    /// Runs a scheduling pass at `now` and plays out its decisions.
    fn pass(&mut self, now: DateTime<Utc>) {
        for d in self.core.pass(now) {
            match d {
                Decision::Provision(set) => self.provision(&set, now),
                Decision::Suspend(s) => {
                    if matches!(s.cause, crate::scheduler::SuspendCause::Failed { .. }) {
                        self.report.fleet.sets_failed += 1;
                    }
                    for n in &s.nodes {
                        self.booting.remove(n);
                    }
                    let took = Duration::from_std(self.cloud.suspend).unwrap_or_default();
                    self.at(now + took, CloudEvent::Deleted(s.nodes));
                }
                Decision::Allocate(a) => {
                    let ran = self.queued.remove(&a.key).map_or(0.0, |q| q.1);
                    let end = now + Duration::milliseconds((ran * 1000.0).round() as i64);
                    let run = self.runs.entry(a.key).or_default();
                    *run += 1;
                    self.ends.push(Reverse((end, a.key, *run)));
                    let run = *run;
                    if let Some(d) = self.demands.get(&a.key).copied() {
                        if d.peak_share < 1.0 {
                            let peak = (ran * d.peak_share * 1000.0).round() as i64;
                            self.peaks.push(Reverse((
                                now + Duration::milliseconds(peak),
                                a.key,
                                run,
                            )));
                        }
                    }
                    if let Some(g) = &a.elastic {
                        // Spark wants all it may have from its start.
                        self.core.set_wanted(a.key, g.max, now);
                        let stats = self.report.elastic.get_or_insert_with(Default::default);
                        stats.clusters += 1;
                    }
                    self.report.allocated(&a);
                }
                Decision::Preempt(p) => {
                    let grace = Duration::from_std(p.grace).unwrap_or_default();
                    for v in &p.victims {
                        self.stops.push(Reverse((now + grace, v.key)));
                        if v.cause.is_reclaim() {
                            self.reclaimed.insert(v.key);
                        }
                    }
                }
                Decision::Expire { key, .. } => {
                    if let Some((project, _)) = self.queued.remove(&key) {
                        self.report.project(&project).expired += 1;
                    }
                }
                Decision::Reject { key, .. } => {
                    if let Some((project, _)) = self.queued.remove(&key) {
                        self.report.project(&project).rejected += 1;
                    }
                }
                // No agents here: virtual nodes hold no lease.
                Decision::LoseNode { .. } => {}
            }
        }
    }

    /// Completes the report with the trace's span up to `last`.
    fn finish(mut self, last: DateTime<Utc>) -> SimReport {
        let first = self
            .trace
            .iter()
            .map(|b| b.submit_s)
            .min_by(f64::total_cmp)
            .unwrap_or(0.0);
        // Zones of other regions that batches reached on a region alternative count
        // from their first allocation; their GPUs are known now.
        for ((_, zone), gpus) in zone_gpus(self.config) {
            if let Some(z) = self.report.zones.get_mut(&zone) {
                z.gpus = gpus;
            }
        }
        self.account(last);
        self.report.finish(first, seconds(last), &self.core);
        self.report
    }
}

/// Every declared node, up: each pool at `max_nodes` (at least its
/// virtual nodes); a provisioned pool's only `with_provisioned` (they
/// start empty, and are its declared capacity).
fn declared_nodes(config: &Config, with_provisioned: bool) -> Vec<crate::scheduler::NodeSpec> {
    let mut nodes = Vec::new();
    for decl in config.pool_decls() {
        if decl.provisioner.is_some() && !with_provisioned {
            continue;
        }
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
    for n in declared_nodes(config, true) {
        *out.entry((n.region.clone(), n.zone.clone())).or_default() += n.gpu_addresses.len() as u64;
    }
    out
}

#[cfg(test)]
mod tests;
