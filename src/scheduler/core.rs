//! The scheduler core: pure and deterministic. It holds the region queues,
//! the quota ledger and the capacity map, takes events and `now`, and
//! returns decisions. No clock, no I/O: the runner persists each decision
//! before anyone sees it. Here: the [`Scheduler`]'s state, the events that
//! change it (nodes, leases, submits, forgets, quota) and the pass that
//! walks each region's queue. What it takes and returns is `model.rs`;
//! holds and cordons are `holds.rs`, where a batch fits and when it could
//! start `estimate.rs`, what it shows `views.rs` and `snapshot.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Bound;

use chrono::{DateTime, Duration, Utc};

use super::capacity::{Capacity, Node, NodeId, NodeSpec, PartNeed, Placement, needs, plan_zone};
use super::fairshare::{FairShare, FairSharePolicy, Order, share_key};
use super::lease::{LeaseError, Leases};
use super::model::{
    Allocation, BatchKey, Cordon, Decision, PendingBatch, PoolDecl, RegionHolds, ShapeKey,
    accelerator_label, shape_key, shape_text,
};
use super::quota::{Ledger, QuotaRule};
use super::views::Blocker;
use crate::api::EndReason;
use crate::spec::{ClusterRequest, ProvisioningMode};

/// Queue order within a project, and across projects in strict order:
/// higher priority first, then older first.
pub(super) type QueueKey = (std::cmp::Reverse<i32>, BatchKey);

#[derive(Debug, Default)]
pub struct Scheduler {
    pub(super) capacity: Capacity,
    pub(super) declared: HashMap<String, BTreeMap<String, Vec<Node>>>,
    pub(super) ledger: Ledger,
    /// Boxed: growing a map of a million entries moves only pointers, not
    /// the batches (a rehash of inline entries stalled creates for 0.6 s).
    pub(super) pending: HashMap<BatchKey, Box<PendingBatch>>,
    /// Queued batches per project (for the per-project limit).
    pub(super) pending_by_project: HashMap<String, usize>,
    pub(super) queues: BTreeMap<String, BTreeSet<QueueKey>>,
    /// The same batches per region and project, for fair-share order.
    pub(super) project_queues: HashMap<String, HashMap<String, BTreeSet<QueueKey>>>,
    /// Usage per region and project, and the policy that orders by it.
    pub(super) fair: FairShare,
    /// Queues an admin held, per region.
    pub(super) holds: HashMap<String, RegionHolds>,
    /// Nodes an admin cordoned or is draining.
    pub(super) cordons: HashMap<NodeId, Cordon>,
    /// What the config declares of nodes, once a layout is set
    /// (`layout.rs`): they and the retired nodes it implies.
    pub(super) layout: Option<super::layout::Declared>,
    pub(super) retired: HashSet<NodeId>,
    deadlines: BTreeSet<(DateTime<Utc>, BatchKey)>,
    pub(super) running: HashMap<BatchKey, Allocation>,
    pub(super) leases: Leases,
    /// Queued batches held back last time only by the reservation of an
    /// earlier batch (for the metrics' not-admitted reason).
    pub(super) held_back: HashSet<BatchKey>,
    /// Regions whose queue, capacity or quota changed since the last pass:
    /// only they can admit anything new, so only they are scanned.
    pub(super) dirty: BTreeSet<String>,
    /// Per region: how many queued batches of each shape, and of default
    /// mode. A pass stops scanning a region once every shape present has
    /// failed and no default-mode batch awaits its verdict.
    shapes: HashMap<String, HashMap<ShapeKey, ShapeStats>>,
    defaults: HashMap<String, usize>,
    /// The queued batches counted as a scrape reports them
    /// (`snapshot.rs`), kept as they come and go.
    pub(super) tally: super::snapshot::QueuedTally,
}

/// Queued batches of one shape in a region: how many, and how many of each
/// ttl (the shortest bounds whether any of them could backfill).
#[derive(Debug, Default)]
struct ShapeStats {
    count: usize,
    ttls: BTreeMap<u64, usize>,
}

fn ttl_key(c: &ClusterRequest) -> u64 {
    c.ttl_s.unwrap_or(u64::MAX)
}

/// What a pass keeps while it walks one region's queue.
#[derive(Default)]
struct Walk {
    /// The first batch blocked by capacity reserves it: later batches may
    /// start only if their ttl ends before its estimated start.
    reservation: Option<Reservation>,
    /// Shapes that did not fit in this pass: free capacity only shrinks
    /// during a pass, so they cannot fit later in it either.
    failed_shapes: HashSet<ShapeKey>,
    /// Shapes nothing more can be admitted of in this pass: failed, or
    /// held back with even their shortest ttl ending after the reservation.
    exhausted: HashSet<ShapeKey>,
    /// Shapes that fit but were held back by the reservation, with their
    /// plan: valid until the next allocation takes capacity.
    fitting: HashMap<ShapeKey, (String, Vec<Placement>)>,
}

#[derive(Debug, PartialEq, Eq)]
enum Considered {
    Allocated,
    Passed,
}

/// The first batch of a pass blocked by capacity: what it needs and, once
/// computed, when it could start (None inside: never, as things stand).
struct Reservation {
    needs: Vec<PartNeed>,
    until: Option<Option<DateTime<Utc>>>,
}

impl Scheduler {
    pub fn new(pools: Vec<PoolDecl>, rules: Vec<QuotaRule>) -> Scheduler {
        Scheduler {
            declared: super::layout::declared_of(&pools),
            ledger: Ledger::new(rules),
            ..Scheduler::default()
        }
    }

    /// Sets how queues are ordered (fair share or strict, half-life,
    /// weights). Usage recorded so far stays.
    pub fn set_fair_share(&mut self, policy: FairSharePolicy) {
        self.dirty.extend(self.queues.keys().cloned());
        self.fair.set_policy(policy);
    }

    /// Forgets the recorded usage of ended clusters, before it is read
    /// again from the store under a new half-life.
    pub fn clear_past_usage(&mut self) {
        self.fair.clear_history();
        self.dirty.extend(self.queues.keys().cloned());
    }

    /// A cluster that ended before this core was built: its usage counts
    /// in the fair-share order (decayed from `to`).
    pub fn record_past_usage(
        &mut self,
        region: &str,
        project: &str,
        gpus: u64,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) {
        self.fair.record_past(region, project, gpus, from, to);
    }

    /// A project's place in a region's fair-share order at `now` (lower
    /// first; ties go by project name).
    pub(super) fn fair_key(&self, region: &str, project: &str, now: DateTime<Utc>) -> u64 {
        share_key(self.fair.standing(region, project, now).share)
    }

    /// How far back ended clusters still count in the fair-share order.
    pub fn usage_memory(&self) -> std::time::Duration {
        self.fair.memory()
    }

    /// Whether a node is known: registered by an agent, or virtual.
    pub fn has_node(&self, node: &NodeId) -> bool {
        self.capacity.nodes.contains_key(node)
    }

    /// Parts of running clusters on `node`.
    pub fn parts_on(&self, node: &NodeId) -> usize {
        self.running
            .values()
            .flat_map(|a| &a.placements)
            .filter(|p| &p.node == node)
            .count()
    }

    // ---- events ------------------------------------------------------

    pub fn add_node(&mut self, spec: NodeSpec) {
        self.dirty.insert(spec.region.clone());
        if !self.capacity.nodes.contains_key(&spec.id) {
            self.capacity.insert(Node::new(spec));
        }
    }

    /// Removes a node; returns the batches holding part of it (the caller
    /// fails them: a partial cluster must not keep running).
    pub fn remove_node(&mut self, id: &NodeId) -> Vec<BatchKey> {
        if let Some(n) = self.capacity.remove(id) {
            self.dirty.insert(n.spec.region);
        }
        let mut hit: Vec<BatchKey> = self
            .running
            .values()
            .filter(|a| a.placements.iter().any(|p| &p.node == id))
            .map(|a| a.key)
            .collect();
        hit.sort();
        hit
    }

    pub fn submit(&mut self, batch: PendingBatch) {
        if self.pending.contains_key(&batch.key) || self.running.contains_key(&batch.key) {
            return;
        }
        self.dirty.insert(batch.region.clone());
        let stats = self
            .shapes
            .entry(batch.region.clone())
            .or_default()
            .entry(shape_key(&batch.cluster))
            .or_default();
        stats.count += 1;
        *stats.ttls.entry(ttl_key(&batch.cluster)).or_default() += 1;
        if batch.cluster.mode == ProvisioningMode::Default {
            *self.defaults.entry(batch.region.clone()).or_default() += 1;
        }
        self.queues
            .entry(batch.region.clone())
            .or_default()
            .insert((std::cmp::Reverse(batch.priority), batch.key));
        self.project_queues
            .entry(batch.region.clone())
            .or_default()
            .entry(batch.project.clone())
            .or_default()
            .insert((std::cmp::Reverse(batch.priority), batch.key));
        if let Some(d) = batch.deadline {
            self.deadlines.insert((d, batch.key));
        }
        *self
            .pending_by_project
            .entry(batch.project.clone())
            .or_default() += 1;
        self.tally.add(&batch);
        self.pending.insert(batch.key, Box::new(batch));
    }

    /// Restores a cluster that holds capacity (after a restart). False when
    /// its nodes cannot hold it (the caller fails the batch).
    pub fn restore_allocation(&mut self, alloc: Allocation) -> bool {
        if self.running.contains_key(&alloc.key) || !self.capacity.take(&alloc.placements) {
            return false;
        }
        self.ledger
            .charge(&alloc.project, &alloc.region, &alloc.quota);
        self.fair.hold(&alloc.region, &alloc.project, alloc.gpus());
        self.running.insert(alloc.key, alloc);
        true
    }

    /// A batch left the queue or ended at `now`: drop it and give back what
    /// it held. Idempotent. Answers the cluster it gave back, if it held
    /// one.
    pub fn forget(&mut self, key: BatchKey, now: DateTime<Utc>) -> Option<Allocation> {
        self.held_back.remove(&key);
        if let Some(b) = self.pending.remove(&key) {
            self.tally.remove(&b);
            self.dirty.insert(b.region.clone());
            if let Some(n) = self.pending_by_project.get_mut(&b.project) {
                *n -= 1;
                if *n == 0 {
                    self.pending_by_project.remove(&b.project);
                }
            }
            if let Some(m) = self.shapes.get_mut(&b.region) {
                let shape = shape_key(&b.cluster);
                if let Some(stats) = m.get_mut(&shape) {
                    stats.count -= 1;
                    let ttl = ttl_key(&b.cluster);
                    if let Some(n) = stats.ttls.get_mut(&ttl) {
                        *n -= 1;
                        if *n == 0 {
                            stats.ttls.remove(&ttl);
                        }
                    }
                    if stats.count == 0 {
                        m.remove(&shape);
                    }
                }
            }
            if b.cluster.mode == ProvisioningMode::Default {
                if let Some(n) = self.defaults.get_mut(&b.region) {
                    *n = n.saturating_sub(1);
                }
            }
            if let Some(q) = self.queues.get_mut(&b.region) {
                q.remove(&(std::cmp::Reverse(b.priority), key));
            }
            if let Some(projects) = self.project_queues.get_mut(&b.region) {
                if let Some(q) = projects.get_mut(&b.project) {
                    q.remove(&(std::cmp::Reverse(b.priority), key));
                    if q.is_empty() {
                        projects.remove(&b.project);
                    }
                }
            }
            if let Some(d) = b.deadline {
                self.deadlines.remove(&(d, key));
            }
        }
        let a = self.running.remove(&key)?;
        self.dirty.insert(a.region.clone());
        self.capacity.give_back(&a.placements);
        if a.placements.iter().any(|p| self.retired.contains(&p.node)) {
            // A retired node may now be empty: a virtual one leaves.
            self.settle();
        }
        self.ledger.refund(&a.project, &a.region, &a.quota);
        self.fair
            .release(&a.region, &a.project, a.gpus(), a.allocated_at, now);
        Some(a)
    }

    pub fn set_quota_limit(
        &mut self,
        project: &str,
        region: &str,
        metric: crate::spec::QuotaMetric,
        limit: u64,
    ) {
        self.ledger.set_limit(project, region, metric, limit);
        self.dirty.insert(region.to_string());
    }

    // ---- the pass ----------------------------------------------------

    /// The earliest deadline still ahead.
    pub fn next_deadline(&self) -> Option<DateTime<Utc>> {
        let batch = self.deadlines.first().map(|(d, _)| *d);
        match (batch, self.leases.next_expiry()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// An agent registered its node (again): it joins the capacity with a
    /// fresh lease. A node already known keeps what it holds; its shape is
    /// updated when what it holds still fits the new one. Answers `false`
    /// when the new shape is smaller than what the node holds, and the old
    /// shape was kept.
    pub fn register_node(&mut self, spec: NodeSpec, epoch: u64, expires: DateTime<Utc>) -> bool {
        let id = spec.id.clone();
        let changed = self.capacity.nodes.get(&id).is_some_and(|n| n.spec != spec);
        let mut taken = true;
        if changed {
            let held: Vec<_> = self
                .running
                .values()
                .flat_map(|a| a.placements.iter().filter(|p| p.node == id).cloned())
                .collect();
            self.dirty.insert(spec.region.clone());
            if let Some(old) = self.capacity.insert(Node::new(spec)) {
                if !self.capacity.take(&held) {
                    self.capacity.insert(old);
                    taken = false;
                }
            }
        } else {
            self.add_node(spec);
        }
        self.leases.grant(id, epoch, expires);
        taken
    }

    /// An agent's heartbeat: renews the lease of the current epoch only.
    pub fn heartbeat(
        &mut self,
        node: &NodeId,
        epoch: u64,
        expires: DateTime<Utc>,
    ) -> Result<(), LeaseError> {
        self.leases.renew(node, epoch, expires)
    }

    /// The current epoch of a registered node.
    pub fn node_epoch(&self, node: &NodeId) -> Option<u64> {
        self.leases.epoch(node)
    }

    /// Whether `node` is a registered node of this zone's pool.
    pub fn is_node_of_pool(&self, node: &NodeId, zone: &str, pool: &str) -> bool {
        self.capacity
            .nodes
            .get(node)
            .is_some_and(|n| !n.spec.is_virtual && n.spec.zone == zone && n.spec.pool == pool)
    }

    /// Registered nodes in a pool (for its max_nodes).
    pub fn nodes_in_pool(&self, zone: &str, pool: &str) -> usize {
        self.capacity
            .nodes
            .values()
            .filter(|n| !n.spec.is_virtual && n.spec.zone == zone && n.spec.pool == pool)
            .count()
    }

    /// Queued batches of `project`.
    pub fn pending_of(&self, project: &str) -> usize {
        self.pending_by_project.get(project).copied().unwrap_or(0)
    }

    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    pub fn allocation(&self, key: BatchKey) -> Option<&Allocation> {
        self.running.get(&key)
    }

    /// Expires what is due, then admits what fits, region by region, and
    /// applies every decision to its own state.
    pub fn pass(&mut self, now: DateTime<Utc>) -> Vec<Decision> {
        let mut decisions = Vec::new();
        // Lost nodes first: their capacity must not be handed out again,
        // and the clusters that used them fail whole.
        for (node, epoch, expired_at) in self.leases.lapsed(now) {
            let failed = self.remove_node(&node);
            let failed_ids = failed
                .iter()
                .filter_map(|k| self.running.get(k).map(|a| a.batch_id.clone()))
                .collect();
            let released = failed
                .iter()
                .filter_map(|key| self.forget(*key, now))
                .collect();
            let message = format!(
                "Node {node} was lost: its agent stopped heartbeating and its lease expired at {}; the batch's cluster was released.",
                expired_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            );
            decisions.push(Decision::LoseNode {
                node,
                epoch: Some(epoch),
                failed,
                failed_ids,
                message,
                released,
            });
        }
        // Expiry next: a batch past its deadline is never allocated. What
        // was missing is the same for batches of one project, region and shape.
        let mut missing: HashMap<(String, String, ShapeKey), String> = HashMap::new();
        while let Some(&(deadline, key)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            let message = self.expiry_message(key, now, &mut missing);
            let (batch_id, region, accelerator) = self
                .pending
                .get(&key)
                .map(|b| {
                    (
                        b.batch_id.clone(),
                        b.region.clone(),
                        accelerator_label(&b.cluster),
                    )
                })
                .unwrap_or_default();
            self.forget(key, now);
            decisions.push(Decision::Expire {
                key,
                batch_id,
                message,
                region,
                accelerator,
            });
        }
        self.fair.prune(now);
        let regions = std::mem::take(&mut self.dirty);
        for region in regions {
            self.admit_region(&region, now, &mut decisions);
        }
        decisions
    }

    fn admit_region(&mut self, region: &str, now: DateTime<Utc>, out: &mut Vec<Decision>) {
        if self.holds.get(region).is_some_and(|h| h.all.is_some()) {
            return;
        }
        match self.fair.order() {
            Order::Strict => self.admit_strict(region, now, out),
            Order::FairShare => self.admit_fair(region, now, out),
        }
    }

    /// Strict order: the region's queue by priority, then age.
    fn admit_strict(&mut self, region: &str, now: DateTime<Utc>, out: &mut Vec<Decision>) {
        // The queue is walked in chunks from a cursor rather than copied
        // whole: a pass usually stops after a few entries, and the queue
        // may hold a million.
        const CHUNK: usize = 256;
        let mut cursor: Option<QueueKey> = None;
        let mut buffer = Vec::new().into_iter();
        let mut walk = Walk::default();
        loop {
            let queued = match buffer.next() {
                Some(k) => k,
                None => {
                    let Some(queue) = self.queues.get(region) else {
                        break;
                    };
                    let chunk: Vec<QueueKey> = match cursor {
                        None => queue.iter().take(CHUNK).copied().collect(),
                        Some(c) => queue
                            .range((Bound::Excluded(c), Bound::Unbounded))
                            .take(CHUNK)
                            .copied()
                            .collect(),
                    };
                    buffer = chunk.into_iter();
                    match buffer.next() {
                        Some(k) => k,
                        None => break,
                    }
                }
            };
            cursor = Some(queued);
            if self.nothing_more(region, &walk) {
                break;
            }
            self.consider(queued.1, region, now, &mut walk, out);
        }
    }

    /// Fair-share order: the project with the lowest usage ÷ weight first,
    /// its batches by priority, then age. An allocation raises its
    /// project's usage at once, so the order is taken again after each.
    fn admit_fair(&mut self, region: &str, now: DateTime<Utc>, out: &mut Vec<Decision>) {
        let Some(projects) = self.project_queues.get(region) else {
            return;
        };
        let mut order: BTreeSet<(u64, String)> = projects
            .keys()
            .filter(|p| self.hold_of(region, p).is_none())
            .map(|p| (self.fair_key(region, p, now), p.clone()))
            .collect();
        // Where each project's walk stands: its batches before it were
        // considered in this pass.
        let mut cursors: HashMap<String, QueueKey> = HashMap::new();
        let mut walk = Walk::default();
        while let Some((share, project)) = order.first().cloned() {
            let next = self
                .project_queues
                .get(region)
                .and_then(|m| m.get(&project))
                .and_then(|q| match cursors.get(&project) {
                    None => q.first().copied(),
                    Some(c) => q
                        .range((Bound::Excluded(*c), Bound::Unbounded))
                        .next()
                        .copied(),
                });
            let Some(queued) = next else {
                order.pop_first();
                continue;
            };
            cursors.insert(project.clone(), queued);
            if self.nothing_more(region, &walk) {
                break;
            }
            if self.consider(queued.1, region, now, &mut walk, out) == Considered::Allocated {
                order.remove(&(share, project.clone()));
                order.insert((self.fair_key(region, &project, now), project));
            }
        }
    }

    /// Whether nothing more can be admitted in this pass: every shape still
    /// queued in the region either does not fit or cannot end before the
    /// reservation, and no default-mode batch awaits its verdict.
    fn nothing_more(&self, region: &str, walk: &Walk) -> bool {
        let distinct = self.shapes.get(region).map_or(0, HashMap::len);
        let defaults = self.defaults.get(region).copied().unwrap_or(0);
        if defaults > 0 || walk.exhausted.len() < distinct {
            return false;
        }
        // Counted against the shapes still queued: a rejected batch may
        // have been a shape's last.
        let present = self.shapes.get(region).map_or(0, |m| {
            walk.exhausted.iter().filter(|s| m.contains_key(*s)).count()
        });
        present >= distinct
    }

    /// One queued batch in a pass's walk: allocated, rejected (default
    /// mode), held back by the reservation, or left to wait.
    fn consider(
        &mut self,
        key: BatchKey,
        region: &str,
        now: DateTime<Utc>,
        walk: &mut Walk,
        out: &mut Vec<Decision>,
    ) -> Considered {
        let Some(batch) = self.pending.get(&key) else {
            return Considered::Passed;
        };
        // A held queue's batches wait, reserving nothing.
        if self.hold_of(region, &batch.project).is_some() {
            return Considered::Passed;
        }
        let default_mode = batch.cluster.mode == ProvisioningMode::Default;
        if let Some(short) = self
            .ledger
            .shortfall(&batch.project, region, &batch.cluster.quota)
        {
            if default_mode {
                let message = format!(
                    "RESOURCE_EXHAUSTED: quota {} exceeded in {region}: limit {}, usage {}, asked {}",
                    short.metric, short.limit, short.usage, short.needed
                );
                let batch_id = batch.batch_id.clone();
                self.forget(key, now);
                out.push(Decision::Reject {
                    key,
                    batch_id,
                    message,
                    reason: EndReason::Quota,
                });
            }
            return Considered::Passed;
        }
        let shape = shape_key(&batch.cluster);
        let ends = batch
            .cluster
            .ttl_s
            .map(|t| now + Duration::seconds(t as i64));
        let plan = if walk.failed_shapes.contains(&shape) {
            None
        } else if let Some(plan) = walk.fitting.get(&shape) {
            Some(plan.clone())
        } else {
            self.best_zone(region, &needs(&batch.cluster))
        };
        match plan {
            Some((zone, placements)) => {
                walk.fitting
                    .insert(shape, (zone.clone(), placements.clone()));
                // Under a reservation, a batch that fits may start only
                // if its ttl ends before the holder's estimated start.
                // The estimate is costly and rarely needed: computed
                // once, on first need.
                if let Some(r) = walk.reservation.as_mut() {
                    if !default_mode {
                        let until = *r
                            .until
                            .get_or_insert_with(|| self.estimate_start(region, &r.needs));
                        let delays_holder = match (until, ends) {
                            (Some(u), Some(e)) => e > u,
                            (Some(_), None) => true,
                            (None, _) => false,
                        };
                        if delays_holder {
                            self.held_back.insert(key);
                            let shortest = self
                                .shapes
                                .get(region)
                                .and_then(|m| m.get(&shape))
                                .and_then(|st| st.ttls.keys().next().copied());
                            let none_can = match (until, shortest) {
                                (Some(u), Some(t)) if t != u64::MAX => {
                                    now + Duration::seconds(t as i64) > u
                                }
                                (Some(_), _) => true,
                                (None, _) => false,
                            };
                            if none_can {
                                walk.exhausted.insert(shape);
                            }
                            return Considered::Passed;
                        }
                    }
                }
                self.held_back.remove(&key);
                let batch = self.pending.get(&key).cloned();
                let Some(batch) = batch else {
                    return Considered::Passed;
                };
                // Capacity changes now: plans made before no longer hold.
                walk.fitting.clear();
                if !self.capacity.take(&placements) {
                    walk.failed_shapes.insert(shape);
                    walk.exhausted.insert(shape);
                    return Considered::Passed;
                }
                self.forget(key, now);
                self.ledger
                    .charge(&batch.project, region, &batch.cluster.quota);
                let alloc = Allocation {
                    key,
                    batch_id: batch.batch_id.clone(),
                    project: batch.project.clone(),
                    region: region.to_string(),
                    zone,
                    placements,
                    quota: batch.cluster.quota.clone(),
                    allocated_at: now,
                    expected_end: batch
                        .cluster
                        .ttl_s
                        .map(|t| now + Duration::seconds(t as i64)),
                    queued_at: batch.queued_at,
                    accelerator: accelerator_label(&batch.cluster),
                };
                self.fair.hold(region, &batch.project, alloc.gpus());
                self.running.insert(key, alloc.clone());
                out.push(Decision::Allocate(alloc));
                return Considered::Allocated;
            }
            None => {
                walk.failed_shapes.insert(shape);
                walk.exhausted.insert(shape);
                if default_mode {
                    let message = format!(
                        "RESOURCE_EXHAUSTED: ZONE_RESOURCE_POOL_EXHAUSTED: no zone of {region} has capacity for {} now; try queue mode (runtime 3.0+), another region or another GPU type",
                        shape_text(&batch.cluster)
                    );
                    let batch_id = batch.batch_id.clone();
                    self.forget(key, now);
                    out.push(Decision::Reject {
                        key,
                        batch_id,
                        message,
                        reason: EndReason::StockOut,
                    });
                } else if walk.reservation.is_none() {
                    walk.reservation = Some(Reservation {
                        needs: needs(&batch.cluster),
                        until: None,
                    });
                }
            }
        }
        Considered::Passed
    }

    /// What stands in the way of a batch now.
    pub(super) fn blockers(&self, batch: &PendingBatch) -> Vec<Blocker> {
        let mut out = Vec::new();
        if let Some(s) = self
            .ledger
            .shortfall(&batch.project, &batch.region, &batch.cluster.quota)
        {
            out.push(Blocker::Quota(s));
        }
        let parts = needs(&batch.cluster);
        let best = self
            .capacity
            .zones(&batch.region)
            .map(|z| {
                (
                    plan_zone(&self.capacity.zone_nodes(&batch.region, z), &parts),
                    z,
                )
            })
            .max_by_key(|(p, z)| (p.placed, std::cmp::Reverse(*z)));
        match best {
            Some((plan, _)) if plan.complete() => {}
            Some((plan, zone)) => out.push(Blocker::Capacity {
                total: plan.total,
                placed: plan.placed,
                best_zone: Some(zone.to_string()),
                shape: shape_text(&batch.cluster),
            }),
            None => out.push(Blocker::Capacity {
                total: parts.len(),
                placed: 0,
                best_zone: None,
                shape: shape_text(&batch.cluster),
            }),
        }
        out
    }

    fn expiry_message(
        &self,
        key: BatchKey,
        now: DateTime<Utc>,
        cache: &mut HashMap<(String, String, ShapeKey), String>,
    ) -> String {
        let Some(batch) = self.pending.get(&key) else {
            return "allocation timeout passed".into();
        };
        let cache_key = (
            batch.project.clone(),
            batch.region.clone(),
            shape_key(&batch.cluster),
        );
        let missing = cache
            .entry(cache_key)
            .or_insert_with(|| {
                let reasons = self.blockers(batch);
                if reasons.is_empty() {
                    "capacity was reserved for earlier batches of the queue".to_string()
                } else {
                    reasons
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                }
            })
            .clone();
        let waited = (now - batch.queued_at).num_seconds();
        format!(
            "Batch could not be allocated within its allocation timeout of {}s (waited {waited}s): {missing}.",
            batch.cluster.allocation_timeout_s
        )
    }
}
