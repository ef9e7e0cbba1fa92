//! The harness's own record of the world the core schedules, and the
//! invariants checked against it. Nothing here reads the core: what the
//! harness submitted, which allocations and endings the core announced,
//! the deadlines, leases, holds, cordons and quota limits the harness set.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};
use proptest::prelude::*;

use super::generate::POOL_MAX;
use crate::api::EndReason;
use crate::scheduler::*;
use crate::spec::alternatives::Alternative;
use crate::spec::{ClusterRequest, ProvisioningMode, QuotaAmount, QuotaMetric};

/// How a batch left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    Expired,
    Rejected,
    Cancelled,
    Finished,
    /// A lost node or an infrastructure failure took its cluster; it goes
    /// back to the queue if it has retries left.
    Lost,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum State {
    Queued,
    /// Allocated: where (its own region, or its alternative's), on which alternative (0
    /// its own placement) and the quota it draws there.
    Running {
        placements: Vec<Placement>,
        region: String,
        alternative: u32,
        quota: Vec<QuotaAmount>,
    },
    Ended(End),
}

struct Tracked {
    /// As last submitted: a requeue gives it a fresh deadline.
    batch: PendingBatch,
    state: State,
    retries_left: u32,
}

type HoldKey = (String, Option<String>);

/// GPUs, cores, memory (MB) and local SSD (GB) of a node, or of what
/// parts ask.
type Room = (u32, u32, u64, u64);

pub(super) struct Model {
    batches: BTreeMap<BatchKey, Tracked>,
    /// Nodes that are there: declared virtual ones, virtual ones a reload
    /// dropped (they may still hold clusters), agents' nodes not lost.
    nodes: BTreeMap<NodeId, NodeSpec>,
    /// Every virtual node drawn at the start, and which the config
    /// declares now.
    all_virtual: Vec<NodeSpec>,
    declared: BTreeSet<NodeId>,
    leases: BTreeMap<NodeId, (u64, DateTime<Utc>)>,
    lost: BTreeSet<NodeId>,
    holds: BTreeSet<HoldKey>,
    cordons: BTreeSet<NodeId>,
    rules: Vec<QuotaRule>,
    overrides: HashMap<(String, String, QuotaMetric), u64>,
    strict: bool,
}

impl Model {
    pub(super) fn new(rules: Vec<QuotaRule>, strict: bool) -> Model {
        Model {
            batches: BTreeMap::new(),
            nodes: BTreeMap::new(),
            all_virtual: Vec::new(),
            declared: BTreeSet::new(),
            leases: BTreeMap::new(),
            lost: BTreeSet::new(),
            holds: BTreeSet::new(),
            cordons: BTreeSet::new(),
            rules,
            overrides: HashMap::new(),
            strict,
        }
    }

    // ---- what the harness did ------------------------------------------

    pub(super) fn declare_virtual(&mut self, spec: NodeSpec) {
        self.declared.insert(spec.id.clone());
        self.nodes.insert(spec.id.clone(), spec.clone());
        self.all_virtual.push(spec);
    }

    /// Declares (or drops) the `i`th virtual node drawn, when its pool
    /// has room for it.
    pub(super) fn toggle_virtual(&mut self, i: usize, declared: bool) {
        let Some(spec) = super::pick(&self.all_virtual, i) else {
            return;
        };
        if !declared {
            self.declared.remove(&spec.id);
        } else if !self.declared.contains(&spec.id) && self.pool_room(&spec) {
            self.declared.insert(spec.id.clone());
            self.nodes.insert(spec.id.clone(), spec);
        }
    }

    /// Whether `spec`'s pool has a slot left: declared virtual nodes and
    /// agents' nodes together stay within `POOL_MAX`, so no reload ever
    /// retires an agent's node.
    pub(super) fn pool_room(&self, spec: &NodeSpec) -> bool {
        let same_pool = |n: &NodeSpec| n.zone == spec.zone && n.pool == spec.pool;
        let virtual_nodes = self
            .all_virtual
            .iter()
            .filter(|n| same_pool(n) && self.declared.contains(&n.id))
            .count();
        let agents = self
            .nodes
            .values()
            .filter(|n| !n.is_virtual && same_pool(n))
            .count();
        virtual_nodes + agents < POOL_MAX as usize
    }

    pub(super) fn layout(&self, pools: Vec<PoolDecl>, fair: FairSharePolicy) -> Layout {
        Layout {
            pools,
            virtual_nodes: self
                .all_virtual
                .iter()
                .filter(|n| self.declared.contains(&n.id))
                .cloned()
                .collect(),
            rules: self.rules.clone(),
            fair,
            preemption: Default::default(),
            elastic: Default::default(),
            // No cluster is ever stopped for another in this world: loans
            // run to their end (reclaim has its own harness,
            // `reclaim_props.rs`).
            alternatives: vec![
                crate::spec::alternatives::rule_from_config(
                    None,
                    None,
                    None,
                    &[],
                    &[],
                    Some("never"),
                )
                .expect("a rule"),
            ],
        }
    }

    pub(super) fn set_rules(&mut self, rules: Vec<QuotaRule>, strict: bool) {
        self.rules = rules;
        self.strict = strict;
    }

    pub(super) fn set_limit(
        &mut self,
        project: String,
        region: String,
        metric: QuotaMetric,
        limit: u64,
    ) {
        self.overrides.insert((project, region, metric), limit);
    }

    pub(super) fn submit(&mut self, batch: PendingBatch) {
        let retries_left = batch.cluster.infrastructure_retries;
        self.batches.insert(
            batch.key,
            Tracked {
                batch,
                state: State::Queued,
                retries_left,
            },
        );
    }

    pub(super) fn run(&mut self, a: &Allocation) {
        if let Some(t) = self.batches.get_mut(&a.key) {
            t.state = State::Running {
                placements: a.placements.clone(),
                region: a.region.clone(),
                alternative: a.alternative_index(),
                quota: a.quota.clone(),
            };
        }
    }

    pub(super) fn end(&mut self, key: BatchKey, end: End) {
        if let Some(t) = self.batches.get_mut(&key) {
            t.state = State::Ended(end);
        }
    }

    /// Queues a batch that lost its cluster again, as the store does: its
    /// queue time (and so its place) kept, a fresh deadline from `now`.
    /// None when it has no retries left.
    pub(super) fn requeue(&mut self, key: BatchKey, now: DateTime<Utc>) -> Option<PendingBatch> {
        let t = self.batches.get_mut(&key)?;
        if t.retries_left == 0 {
            return None;
        }
        t.retries_left -= 1;
        t.batch.deadline = t.batch.cluster.deadline(now);
        t.state = State::Queued;
        Some(t.batch.clone())
    }

    /// An agent's registration; `taken`: whether the core took its new
    /// shape (it keeps the old one when the new is too small for what the
    /// node holds).
    pub(super) fn register(
        &mut self,
        spec: NodeSpec,
        taken: bool,
        epoch: u64,
        expires: DateTime<Utc>,
    ) {
        let id = spec.id.clone();
        if taken || !self.nodes.contains_key(&id) {
            self.nodes.insert(id.clone(), spec);
        }
        self.lost.remove(&id);
        self.leases.insert(id, (epoch, expires));
    }

    pub(super) fn renew(&mut self, node: &NodeId, expires: DateTime<Utc>) {
        if let Some((_, e)) = self.leases.get_mut(node) {
            *e = (*e).max(expires);
        }
    }

    pub(super) fn lose(&mut self, node: &NodeId) {
        self.nodes.remove(node);
        self.leases.remove(node);
        self.lost.insert(node.clone());
    }

    pub(super) fn set_hold(&mut self, hold: HoldKey, on: bool) {
        if on {
            self.holds.insert(hold);
        } else {
            self.holds.remove(&hold);
        }
    }

    pub(super) fn set_cordon(&mut self, node: NodeId, on: bool) {
        if on {
            self.cordons.insert(node);
        } else {
            self.cordons.remove(&node);
        }
    }

    // ---- what the harness reads ----------------------------------------

    pub(super) fn holds(&self) -> impl Iterator<Item = HoldKey> + '_ {
        self.holds.iter().cloned()
    }

    pub(super) fn cordons(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.cordons.iter().cloned()
    }

    pub(super) fn state(&self, key: BatchKey) -> Option<&State> {
        self.batches.get(&key).map(|t| &t.state)
    }

    fn keys_where(&self, f: impl Fn(&State) -> bool) -> Vec<BatchKey> {
        self.batches
            .iter()
            .filter(|(_, t)| f(&t.state))
            .map(|(k, _)| *k)
            .collect()
    }

    /// Batches queued or running.
    pub(super) fn live(&self) -> Vec<BatchKey> {
        self.keys_where(|s| matches!(s, State::Queued | State::Running { .. }))
    }

    /// Every batch submitted, as last queued.
    pub(super) fn submitted(&self) -> Vec<PendingBatch> {
        self.batches.values().map(|t| t.batch.clone()).collect()
    }

    pub(super) fn running(&self) -> Vec<BatchKey> {
        self.keys_where(|s| matches!(s, State::Running { .. }))
    }

    pub(super) fn node_ids(&self) -> Vec<NodeId> {
        self.nodes.keys().cloned().collect()
    }

    pub(super) fn is_present(&self, node: &NodeId) -> bool {
        self.nodes.contains_key(node)
    }

    pub(super) fn leased(&self) -> Vec<(NodeId, u64)> {
        self.leases
            .iter()
            .map(|(n, (e, _))| (n.clone(), *e))
            .collect()
    }

    /// The deadline of a queued batch.
    pub(super) fn queued_deadline(&self, key: BatchKey) -> Option<DateTime<Utc>> {
        let t = self.batches.get(&key)?;
        (t.state == State::Queued)
            .then_some(t.batch.deadline)
            .flatten()
    }

    pub(super) fn runs_on(&self, key: BatchKey, node: &NodeId) -> bool {
        matches!(
            self.state(key),
            Some(State::Running { placements, .. }) if placements.iter().any(|p| &p.node == node)
        )
    }

    /// The first deadline, lease expiry or alternative delay's end after `now`
    /// (the runner wakes at each).
    pub(super) fn next_event_after(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let queued = || self.batches.values().filter(|t| t.state == State::Queued);
        let deadlines = queued().filter_map(|t| t.batch.deadline);
        let ripe = queued().flat_map(|t| t.batch.alternatives.iter().map(|r| ripe_at(&t.batch, r)));
        let expiries = self.leases.values().map(|(_, e)| *e);
        deadlines
            .chain(ripe)
            .chain(expiries)
            .filter(|t| *t > now)
            .min()
    }

    /// What the clusters running now draw of each metric, by project and
    /// region: where each was allocated, its own quota or its alternative's.
    pub(super) fn usages(&self) -> BTreeMap<(String, String, QuotaMetric), u64> {
        let mut out = BTreeMap::new();
        for t in self.batches.values() {
            if let State::Running { region, quota, .. } = &t.state {
                for q in quota {
                    *out.entry((t.batch.project.clone(), region.clone(), q.metric))
                        .or_default() += q.amount;
                }
            }
        }
        out
    }

    fn held(&self, b: &PendingBatch) -> bool {
        self.holds.contains(&(b.region.clone(), None))
            || self
                .holds
                .contains(&(b.region.clone(), Some(b.project.clone())))
    }

    /// The limit as the ledger defines it: an admin's override, else the
    /// most specific rule (exact project over `*`, then exact region).
    fn limit(&self, project: &str, region: &str, metric: QuotaMetric) -> u64 {
        if let Some(l) = self
            .overrides
            .get(&(project.to_string(), region.to_string(), metric))
        {
            return *l;
        }
        self.rules
            .iter()
            .filter(|r| {
                r.metric == metric
                    && (r.project == project || r.project == "*")
                    && (r.region == region || r.region == "*")
            })
            .max_by_key(|r| (r.project != "*", r.region != "*"))
            .map_or(0, |r| r.limit)
    }

    /// What the clusters running now draw of a metric in a region: each
    /// where it was allocated, its own quota or its alternative's.
    fn usage(&self, project: &str, region: &str, metric: QuotaMetric) -> u64 {
        self.batches
            .values()
            .filter(|t| t.batch.project == project)
            .filter_map(|t| match &t.state {
                State::Running {
                    region: r, quota, ..
                } if r == region => Some(quota),
                _ => None,
            })
            .flatten()
            .filter(|q| q.metric == metric)
            .map(|q| q.amount)
            .sum()
    }

    /// The first metric a batch's quota does not fit in now.
    fn quota_short(&self, b: &PendingBatch) -> Option<QuotaMetric> {
        self.quota_short_in(&b.project, &b.region, &b.cluster.quota)
    }

    /// The first metric of `quota` that does not fit in `region` now.
    fn quota_short_in(
        &self,
        project: &str,
        region: &str,
        quota: &[QuotaAmount],
    ) -> Option<QuotaMetric> {
        quota
            .iter()
            .find(|q| {
                self.usage(project, region, q.metric) + q.amount
                    > self.limit(project, region, q.metric)
            })
            .map(|q| q.metric)
    }

    fn queued(&self, key: BatchKey) -> Result<&PendingBatch, TestCaseError> {
        match self.batches.get(&key) {
            Some(t) if t.state == State::Queued => Ok(&t.batch),
            Some(t) => Err(TestCaseError::fail(format!(
                "batch {} decided on while {:?}",
                key.0, t.state
            ))),
            None => Err(TestCaseError::fail(format!(
                "batch {} was never submitted",
                key.0
            ))),
        }
    }

    // ---- the invariants ------------------------------------------------

    /// An allocation is of a queued, unheld batch before its deadline,
    /// within its project's quota; its cluster is whole (one driver, every
    /// executor, each part the resources of its shape) on nodes that are
    /// there, schedulable and of the part's GPU type, all in one zone of
    /// the batch's region: the zone the allocation names.
    ///
    /// On an alternative, all of that holds of the alternative's cluster in the alternative's
    /// region, with the alternative's quota, and only once the alternative's delay has
    /// passed: never part of a cluster, never two alternatives' parts.
    pub(super) fn check_allocation(
        &self,
        a: &Allocation,
        now: DateTime<Utc>,
    ) -> Result<(), TestCaseError> {
        let b = self.queued(a.key)?;
        let k = a.key.0;
        prop_assert_eq!(a.allocated_at, now);
        prop_assert_eq!(a.queued_at, b.queued_at, "batch {}: its queue time", k);
        let (region, c) = match &a.alternative {
            None => (&b.region, &b.cluster),
            Some(on) => {
                let alternative = b
                    .alternatives
                    .iter()
                    .find(|r| r.index == on.index)
                    .ok_or_else(|| {
                        TestCaseError::fail(format!(
                            "batch {k} allocated on rung {}, which it does not have",
                            on.index
                        ))
                    })?;
                prop_assert!(
                    now >= ripe_at(b, alternative),
                    "batch {} allocated on rung {} at {}, before its delay of {}s (queued at {})",
                    k,
                    on.index,
                    now,
                    alternative.after_s,
                    b.queued_at
                );
                prop_assert_eq!(on.asked, accelerator_label(&b.cluster));
                (&alternative.region, &alternative.cluster)
            }
        };
        prop_assert_eq!(
            &a.region,
            region,
            "batch {} allocated in another region than its rung {}'s",
            k,
            a.alternative_index()
        );
        prop_assert_eq!(a.accelerator, accelerator_label(c));
        prop_assert_eq!(&a.project, &b.project);
        if let Some(d) = b.deadline {
            prop_assert!(
                now < d,
                "batch {} allocated at {}, its deadline is {}",
                k,
                now,
                d
            );
        }
        prop_assert!(
            !self.held(b),
            "batch {} allocated while its queue is held",
            k
        );
        prop_assert_eq!(
            &a.quota,
            &c.quota,
            "batch {}: the quota of rung {}",
            k,
            a.alternative_index()
        );
        let short = self.quota_short_in(&b.project, region, &c.quota);
        prop_assert!(
            short.is_none(),
            "batch {} allocated on rung {} beyond its {:?} quota in {}",
            k,
            a.alternative_index(),
            short,
            region
        );
        let count = |role| a.placements.iter().filter(|p| p.role == role).count();
        prop_assert_eq!(
            count(PartRole::Driver),
            1,
            "batch {}: a cluster without one driver",
            k
        );
        prop_assert_eq!(
            count(PartRole::Executor),
            c.executor_count as usize,
            "batch {}: a partial cluster",
            k
        );
        let mut zones = BTreeSet::new();
        for p in &a.placements {
            let shape = match p.role {
                PartRole::Driver => &c.driver,
                PartRole::Executor => &c.executor,
            };
            prop_assert_eq!(
                (p.gpus.len(), p.cores, p.memory_mb, p.local_ssd_gb),
                (
                    shape.gpus as usize,
                    shape.cores,
                    shape.memory_mb + shape.memory_overhead_mb,
                    shape.local_ssd_gb
                ),
                "batch {}: a part unlike its shape",
                k
            );
            let node = self.nodes.get(&p.node).ok_or_else(|| {
                TestCaseError::fail(format!(
                    "batch {k} placed on node {}, which is not there",
                    p.node
                ))
            })?;
            zones.insert(node.zone.as_str());
            prop_assert_eq!(&node.region, region, "batch {} placed in another region", k);
            if let Some(want) = shape.accelerator {
                prop_assert_eq!(
                    node.accelerator,
                    want,
                    "batch {}: its {} on node {} of another GPU type",
                    k,
                    p.role.name(),
                    p.node
                );
            }
            prop_assert!(
                !self.cordons.contains(&p.node),
                "batch {} given cordoned node {}",
                k,
                p.node
            );
            prop_assert!(
                !node.is_virtual || self.declared.contains(&p.node),
                "batch {} given virtual node {}, which the config dropped",
                k,
                p.node
            );
            prop_assert!(
                p.gpus.iter().all(|g| node.gpu_addresses.contains(g)),
                "batch {} given GPUs {:?} node {} does not have",
                k,
                p.gpus,
                p.node
            );
        }
        prop_assert!(
            zones.len() == 1 && zones.contains(a.zone.as_str()),
            "batch {}'s cluster is in zones {:?}, its allocation names {}",
            k,
            zones,
            a.zone
        );
        Ok(())
    }

    /// A rejection is of a queued default-mode batch whose queue is not
    /// held; a quota rejection when its quota does not fit, a stock-out
    /// only when it does (quota is checked first).
    pub(super) fn check_reject(
        &self,
        key: BatchKey,
        reason: EndReason,
    ) -> Result<(), TestCaseError> {
        let b = self.queued(key)?;
        prop_assert_eq!(
            b.cluster.mode,
            ProvisioningMode::Default,
            "batch {} is queue mode",
            key.0
        );
        prop_assert!(
            !self.held(b),
            "batch {} rejected while its queue is held",
            key.0
        );
        let short = self.quota_short(b);
        match reason {
            EndReason::Quota => prop_assert!(short.is_some(), "batch {}: quota fits", key.0),
            _ => prop_assert!(
                short.is_none(),
                "batch {}: {:?}, quota short",
                key.0,
                reason
            ),
        }
        // Liveness: a stock-out only where the model cannot place it.
        if reason == EndReason::StockOut {
            prop_assert!(
                !self.fits_on_one_node(&b.region, &b.cluster),
                "batch {} rejected as a stock-out, but its whole cluster fits on one node of {}",
                key.0,
                b.region
            );
        }
        Ok(())
    }

    /// A node is lost only once the lease of its current registration
    /// lapsed.
    pub(super) fn check_lost(
        &self,
        node: &NodeId,
        epoch: Option<u64>,
        now: DateTime<Utc>,
    ) -> Result<(), TestCaseError> {
        let lease = self.leases.get(node);
        prop_assert!(
            lease.is_some_and(|(e, expires)| Some(*e) == epoch && *expires <= now),
            "node {} lost at {} (epoch {:?}); its lease: {:?}",
            node,
            now,
            epoch,
            lease
        );
        Ok(())
    }

    /// After every pass: no node holds more than it has; no cluster is
    /// left on a node that was lost; every batch whose deadline passed
    /// expired; every lease that lapsed lost its node; default mode never
    /// waits unless its queue is held.
    pub(super) fn check_after_pass(&self, now: DateTime<Utc>) -> Result<(), TestCaseError> {
        let mut used: BTreeMap<&NodeId, (u32, u64, u64, HashSet<&String>)> = BTreeMap::new();
        for (key, t) in &self.batches {
            match &t.state {
                State::Running { placements, .. } => {
                    for p in placements {
                        prop_assert!(
                            self.nodes.contains_key(&p.node),
                            "batch {} still holds part of node {}, which was lost",
                            key.0,
                            p.node
                        );
                        let u = used.entry(&p.node).or_default();
                        u.0 += p.cores;
                        u.1 += p.memory_mb;
                        u.2 += p.local_ssd_gb;
                        for g in &p.gpus {
                            prop_assert!(u.3.insert(g), "GPU {} of {} given twice", g, p.node);
                        }
                    }
                }
                State::Queued => {
                    if let Some(d) = t.batch.deadline {
                        prop_assert!(
                            d > now,
                            "batch {} still queued at {}, past its deadline {}",
                            key.0,
                            now,
                            d
                        );
                    }
                    prop_assert!(
                        t.batch.cluster.mode == ProvisioningMode::Queue || self.held(&t.batch),
                        "default-mode batch {} left waiting",
                        key.0
                    );
                }
                State::Ended(_) => {}
            }
        }
        for (id, (cores, memory, ssd, _)) in used {
            let n = &self.nodes[id];
            prop_assert!(
                cores <= n.cores,
                "node {} overcommitted: {} of {} cores",
                id,
                cores,
                n.cores
            );
            prop_assert!(
                memory <= n.memory_mb,
                "node {} overcommitted: {} of {} MB of memory",
                id,
                memory,
                n.memory_mb
            );
            prop_assert!(
                ssd <= n.local_ssd_gb,
                "node {} overcommitted: {} of {} GB of local SSD",
                id,
                ssd,
                n.local_ssd_gb
            );
        }
        for (id, (_, expires)) in &self.leases {
            prop_assert!(
                *expires > now,
                "node {}'s lease lapsed at {} but it is not lost",
                id,
                expires
            );
        }
        Ok(())
    }

    /// Order: a batch allocated in a pass never overtakes one ahead of it
    /// that is still queued and that would have fitted where it did — the
    /// same shape in the same region, a ttl no longer, its queue not held,
    /// its quota free there — on its own placement or on an alternative whose
    /// delay has passed in its region. Ahead means higher priority, then
    /// older: across the region in strict order, within its project in
    /// fair-share order. (A default-mode batch may pass a queued one that
    /// a reservation holds back.) The shape compared is the one allocated:
    /// the batch's own, or its alternative's. An alternative in another region takes only
    /// what that region's queue leaves: nothing is queued there after.
    pub(super) fn check_order(
        &self,
        allocated: &[BatchKey],
        now: DateTime<Utc>,
    ) -> Result<(), TestCaseError> {
        let rank = |b: &PendingBatch| (Reverse(b.priority), b.key);
        for key in allocated {
            let t = &self.batches[key];
            let a = &t.batch;
            if a.cluster.mode != ProvisioningMode::Queue {
                continue;
            }
            let State::Running {
                region: given_region,
                alternative,
                ..
            } = &t.state
            else {
                continue;
            };
            let given = match alternative_of(a, *alternative) {
                Some(r) => &r.cluster,
                None => &a.cluster,
            };
            if given_region != &a.region {
                let queued_there = self
                    .batches
                    .values()
                    .find(|t| t.state == State::Queued && &t.batch.region == given_region);
                prop_assert!(
                    queued_there.is_none(),
                    "at {} batch {} took rung {} in {} while batch {} is queued there",
                    now,
                    a.key.0,
                    alternative,
                    given_region,
                    queued_there.map_or(0, |t| t.batch.key.0)
                );
            }
            let same_shape = |c: &ClusterRequest| {
                c.driver == given.driver
                    && c.executor == given.executor
                    && c.executor_count == given.executor_count
            };
            for t in self.batches.values() {
                let b = &t.batch;
                let ahead = t.state == State::Queued
                    && b.region == a.region
                    && (self.strict || b.project == a.project)
                    && rank(b) < rank(a)
                    && b.cluster.ttl_s <= a.cluster.ttl_s
                    && !self.held(b);
                if !ahead {
                    continue;
                }
                // Its own placement, then its alternatives in its region whose
                // delay has passed.
                let options = std::iter::once((0, &b.region, &b.cluster)).chain(
                    b.alternatives
                        .iter()
                        .filter(|r| r.region == b.region && ripe_at(b, r) <= now)
                        .map(|r| (r.index, &r.region, &r.cluster)),
                );
                for (index, region, c) in options {
                    let overtaken = region == given_region
                        && same_shape(c)
                        && self.quota_short_in(&b.project, region, &c.quota).is_none();
                    prop_assert!(
                        !overtaken,
                        "at {} batch {} (priority {}, rung {}) went before batch {} (priority {}) ahead of it, which fits the same shape on its rung {} ({} order)",
                        now,
                        a.key.0,
                        a.priority,
                        alternative,
                        b.key.0,
                        b.priority,
                        index,
                        if self.strict { "strict" } else { "fair-share" }
                    );
                }
            }
        }
        Ok(())
    }

    // ---- liveness --------------------------------------------------------

    /// What of each node a new part may take now, by the model's own
    /// record: nodes that are there, not cordoned and not virtual ones the
    /// config dropped, less what the clusters running on them hold
    /// (GPUs, cores, memory, SSD).
    fn free_nodes(&self) -> Vec<(&NodeSpec, Room)> {
        let mut used: HashMap<&NodeId, Room> = HashMap::new();
        for t in self.batches.values() {
            if let State::Running { placements, .. } = &t.state {
                for p in placements {
                    let u = used.entry(&p.node).or_default();
                    u.0 += p.gpus.len() as u32;
                    u.1 += p.cores;
                    u.2 += p.memory_mb;
                    u.3 += p.local_ssd_gb;
                }
            }
        }
        self.nodes
            .values()
            .filter(|n| !self.cordons.contains(&n.id))
            .filter(|n| !n.is_virtual || self.declared.contains(&n.id))
            .map(|n| {
                let u = used.get(&n.id).copied().unwrap_or_default();
                let free = (
                    (n.gpu_addresses.len() as u32).saturating_sub(u.0),
                    n.cores.saturating_sub(u.1),
                    n.memory_mb.saturating_sub(u.2),
                    n.local_ssd_gb.saturating_sub(u.3),
                );
                (n, free)
            })
            .collect()
    }

    /// Whether the whole of `c` fits on one node of `region` now. The
    /// model needs no packing of its own: where one node can take every
    /// part, any placement that puts each part on some node where it fits
    /// completes (what the other parts took elsewhere only leaves that
    /// node more room), so the core must find one. A sufficient condition,
    /// not a necessary one: clusters that need several nodes are not
    /// judged.
    pub(super) fn fits_on_one_node(&self, region: &str, c: &ClusterRequest) -> bool {
        self.free_nodes()
            .into_iter()
            .any(|(n, free)| n.region == region && takes_whole(n, free, c))
    }

    /// Whether a create of `c` by `project` in `region` could ever start:
    /// a node there, empty, takes the whole cluster, and no quota limit is
    /// below what it asks. Sufficient, so the create must not refuse it as
    /// one that never fits.
    pub(super) fn could_ever_fit(&self, project: &str, region: &str, c: &ClusterRequest) -> bool {
        let empty = |n: &NodeSpec| {
            let gpus = n.gpu_addresses.len() as u32;
            (gpus, n.cores, n.memory_mb, n.local_ssd_gb)
        };
        c.quota
            .iter()
            .all(|q| q.amount <= self.limit(project, region, q.metric))
            && self
                .nodes
                .values()
                .any(|n| n.region == region && takes_whole(n, empty(n), c))
    }

    /// Whether queued `b` can start now by the model: on its own placement,
    /// or on an alternative in its region whose delay has passed, its quota free
    /// there and the cluster fitting on one node. An alternative in another region
    /// is left out: it takes only what that region's queue leaves, which
    /// depends on the order the regions are walked in.
    fn can_start(&self, b: &PendingBatch, now: DateTime<Utc>) -> bool {
        let own = std::iter::once((&b.region, &b.cluster));
        // A loan waits while batches of the GPU type it borrows are queued:
        // the owners come first (docs/rules.md#loans-and-reclaim).
        let alternatives = b
            .alternatives
            .iter()
            .filter(|r| r.region == b.region && ripe_at(b, r) <= now)
            .filter(|r| !r.is_loan() || !self.owners_queued(b, &r.region, r.cluster.accelerator()))
            .map(|r| (&r.region, &r.cluster));
        own.chain(alternatives).any(|(region, c)| {
            self.quota_short_in(&b.project, region, &c.quota).is_none()
                && self.fits_on_one_node(region, c)
        })
    }

    /// Whether a batch other than `b` whose own placement is on GPU type
    /// `lent` is queued in `region`.
    fn owners_queued(
        &self,
        b: &PendingBatch,
        region: &str,
        lent: Option<crate::spec::Accelerator>,
    ) -> bool {
        self.batches.values().any(|t| {
            t.state == State::Queued
                && t.batch.key != b.key
                && t.batch.region == region
                && t.batch.cluster.accelerator() == lent
        })
    }

    /// Liveness, after every pass: the batch a region's order puts first
    /// (of those not held) waits only when the model says it cannot start.
    /// Nothing is ahead of it and no reservation precedes it, so a core
    /// that leaks capacity, lets batches expire, or never takes a ripe alternative
    /// is caught here. In strict order the head is the model's own (higher
    /// priority, then older); in fair-share order the model does not know
    /// which project comes first, so it asks only when every project's
    /// first batch could start: the head is then one of them. Answers in
    /// how many regions it judged a queue.
    pub(super) fn check_heads(&self, now: DateTime<Utc>) -> Result<u32, TestCaseError> {
        let rank = |b: &PendingBatch| (Reverse(b.priority), b.key);
        let mut checked = 0;
        for region in super::generate::REGIONS {
            let mut heads: BTreeMap<&str, &PendingBatch> = BTreeMap::new();
            for t in self.batches.values() {
                let b = &t.batch;
                if t.state != State::Queued || b.region != region || self.held(b) {
                    continue;
                }
                let group = if self.strict { "" } else { b.project.as_str() };
                let head = heads.entry(group).or_insert(b);
                if rank(b) < rank(head) {
                    *head = b;
                }
            }
            if heads.is_empty() {
                continue;
            }
            checked += 1;
            if !heads.values().all(|b| self.can_start(b, now)) {
                continue;
            }
            let keys: Vec<i64> = heads.values().map(|b| b.key.0).collect();
            prop_assert!(
                false,
                "at {} in {} ({} order) the first of the queue {:?} can start (quota free, the whole cluster fits on one node) but waits",
                now,
                region,
                if self.strict { "strict" } else { "fair-share" },
                keys
            );
        }
        Ok(checked)
    }
}

/// Whether node `n`, with `free` of it (GPUs, cores, memory, SSD), takes
/// every part of `c`: each of its GPU type (or a CPU part), and all
/// together within what is free.
fn takes_whole(n: &NodeSpec, free: Room, c: &ClusterRequest) -> bool {
    let parts = std::iter::once(&c.driver)
        .chain(std::iter::repeat_n(&c.executor, c.executor_count as usize));
    let mut need = (0u32, 0u32, 0u64, 0u64);
    for s in parts {
        if s.accelerator.is_some_and(|a| a != n.accelerator) {
            return false;
        }
        need.0 += s.gpus;
        need.1 += s.cores;
        need.2 += s.memory_mb + s.memory_overhead_mb;
        need.3 += s.local_ssd_gb;
    }
    need.0 <= free.0 && need.1 <= free.1 && need.2 <= free.2 && need.3 <= free.3
}

/// When `alternative` of `b` may be tried: its queue time plus the alternative's delay.
pub(super) fn ripe_at(b: &PendingBatch, alternative: &Alternative) -> DateTime<Utc> {
    b.queued_at + chrono::Duration::seconds(alternative.after_s as i64)
}

/// The alternative `index` of `b` (0: its own placement, None).
fn alternative_of(b: &PendingBatch, index: u32) -> Option<&Alternative> {
    (index > 0)
        .then(|| b.alternatives.iter().find(|r| r.index == index))
        .flatten()
}
