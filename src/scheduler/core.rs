//! The scheduler core's state: pure and deterministic. It holds the
//! region queues, the quota ledger and the capacity map, takes events and
//! `now`, and returns decisions. No clock, no I/O: the runner persists each
//! decision before anyone sees it. Here: the [`Scheduler`], which composes
//! the types that own their state — the [`Queue`] (`queue.rs`, with its
//! alternatives, `alternatives.rs`), preemption's [`Claims`] (`claims.rs`), the
//! capacity, the quota ledger, the fair-share usage, the leases — its
//! fair-share settings and what it answers of its own state (nodes,
//! deadlines, queued counts). The events that change it (nodes, leases,
//! submits, forgets, quota) are `events.rs`; the pass that walks each
//! region's queue `pass.rs`, judging each batch in `assess.rs` with the
//! walk's state of `walk.rs`. What it takes and returns is `model.rs`;
//! holds and cordons are `holds.rs`, where a batch fits and when it could
//! start `estimate.rs`, what it shows `pending.rs`, `views.rs` and
//! `snapshot.rs`.
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::capacity::{Capacity, Node, NodeId};
use super::claims::Claims;
use super::fairshare::{FairShare, FairSharePolicy, share_key};
use super::lease::NodeLeases;
use super::model::{Allocation, BatchKey, Cordon, PoolDecl, PreemptionPolicy, RegionHolds};
use super::queue::Queue;
use super::quota::{Ledger, QuotaRule};
use crate::spec::Accelerator;

#[derive(Debug, Default)]
pub struct Scheduler {
    pub(super) capacity: Capacity,
    pub(super) declared: HashMap<String, BTreeMap<String, Vec<Node>>>,
    pub(super) ledger: Ledger,
    /// The queued batches and their indexes.
    pub(super) queue: Queue,
    /// Usage per region and project, and the policy that orders by it.
    pub(super) fair: FairShare,
    /// Queues an admin held, per region.
    pub(super) holds: HashMap<String, RegionHolds>,
    /// Nodes an admin cordoned or is draining.
    pub(super) cordons: HashMap<NodeId, Cordon>,
    /// What the config declares of nodes, once a layout is set
    /// (`layout.rs`): they and the retired nodes it implies.
    pub(super) layout: Option<super::declared::Declared>,
    pub(super) retired: HashSet<NodeId>,
    pub(super) running: HashMap<BatchKey, Allocation>,
    /// The running clusters on loans, by the region whose capacity they
    /// hold: what reclaim looks at. Kept with `running` by
    /// [`Scheduler::start_running`] and [`Scheduler::stop_running`].
    pub(super) loans: HashMap<String, BTreeSet<BatchKey>>,
    pub(super) leases: NodeLeases,
    /// Regions whose queue, capacity or quota changed since the last pass:
    /// only they can admit anything new, so only they are scanned.
    pub(super) dirty: BTreeSet<String>,
    /// The regions where preemption is on, and how (`preempt.rs`).
    pub(super) preemption: HashMap<String, PreemptionPolicy>,
    /// The operator's placement alternatives, for when a loan may be
    /// reclaimed (`preempt.rs`).
    pub(super) reclaim: Vec<crate::spec::alternatives::AlternativesRule>,
    /// Who preempts whom, and when a region is looked at again.
    pub(super) claims: Claims,
    /// Elastic clusters' extras: where they may grow, and what the queue
    /// waits for (`elastic.rs`).
    pub(super) elastic: super::growth::Elastic,
    /// Provisioned pools: the sets of nodes being created, backoffs, idle
    /// and suspending nodes (`provision.rs`).
    pub(super) provisions: super::provisions::Provisions,
}

impl Scheduler {
    pub fn new(pools: Vec<PoolDecl>, rules: Vec<QuotaRule>) -> Scheduler {
        let mut core = Scheduler {
            declared: super::declared::declared_of(&pools),
            ledger: Ledger::new(rules),
            ..Scheduler::default()
        };
        core.set_provisioned_pools(&pools);
        core
    }

    /// Sets how queues are ordered (fair share or strict, half-life,
    /// weights). Usage recorded so far stays.
    pub fn set_fair_share(&mut self, policy: FairSharePolicy) {
        self.dirty.extend(self.queue.region_names().cloned());
        let reweigh = self.fair.policy().gpu_weights != policy.gpu_weights;
        self.fair.set_policy(policy);
        if reweigh {
            // What running clusters hold counts under the new weights (the
            // past is read again by the caller: `clear_past_usage`).
            self.fair.clear_held();
            for a in self.running.values() {
                self.fair.hold(&a.region, &a.project, &a.placements);
            }
        }
    }

    /// Where preemption is on, and how: the regions of `policies` (a
    /// region left out never preempts again; what is stopping goes on).
    pub fn set_preemption(&mut self, policies: HashMap<String, PreemptionPolicy>) {
        if self.preemption != policies {
            self.dirty.extend(self.queue.region_names().cloned());
            self.preemption = policies;
        }
    }

    /// `alloc` holds its capacity from now on.
    pub(super) fn start_running(&mut self, alloc: Allocation) {
        if alloc.loan().is_some() {
            self.loans
                .entry(alloc.region.clone())
                .or_default()
                .insert(alloc.key);
        }
        if let Some(growth) = &alloc.elastic {
            self.elastic
                .track(&alloc.region, alloc.key, growth.need.accelerator);
        }
        self.running.insert(alloc.key, alloc);
    }

    /// `key`'s cluster no longer holds its capacity; answers it.
    pub(super) fn stop_running(&mut self, key: BatchKey) -> Option<Allocation> {
        let a = self.running.remove(&key)?;
        if a.loan().is_some() {
            if let Some(keys) = self.loans.get_mut(&a.region) {
                keys.remove(&key);
                if keys.is_empty() {
                    self.loans.remove(&a.region);
                }
            }
        }
        if let Some(growth) = &a.elastic {
            self.elastic
                .untrack(&a.region, key, growth.need.accelerator);
        }
        Some(a)
    }

    /// The running loans of capacity in `region`.
    pub(super) fn loans_in<'a>(&'a self, region: &str) -> impl Iterator<Item = &'a Allocation> {
        self.loans
            .get(region)
            .into_iter()
            .flatten()
            .filter_map(|k| self.running.get(k))
    }

    /// When loans may be reclaimed: the operator's placement alternatives,
    /// each with its `reclaim` rule (docs/rules.md#loans-and-reclaim).
    pub fn set_reclaim(&mut self, rules: Vec<crate::spec::alternatives::AlternativesRule>) {
        if self.reclaim != rules {
            self.dirty.extend(self.queue.region_names().cloned());
            self.reclaim = rules;
        }
    }

    /// Forgets the recorded usage of ended clusters, before it is read
    /// again from the store under a new half-life.
    pub fn clear_past_usage(&mut self) {
        self.fair.clear_history();
        self.dirty.extend(self.queue.region_names().cloned());
    }

    /// A part of a cluster that ended before this core was built (its
    /// GPUs and their type): its usage counts in the fair-share order
    /// (decayed from `to`), at the type's weight.
    pub fn record_past_usage(
        &mut self,
        region: &str,
        project: &str,
        gpus: (u64, Option<Accelerator>),
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) {
        let (count, accelerator) = gpus;
        let charge = count as f64 * self.fair.policy().gpu_weight(accelerator);
        self.fair.record_past(region, project, charge, from, to);
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

    /// The earliest deadline still ahead.
    pub fn next_deadline(&self) -> Option<DateTime<Utc>> {
        [
            self.queue.first_deadline().map(|(d, _)| d),
            self.leases.next_expiry(),
            self.queue.alternatives().next_ripe(),
            self.claims.next_retry(),
            self.provisions.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
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
        self.queue.of_project(project)
    }

    /// Whether `key` is queued.
    pub fn is_queued(&self, key: BatchKey) -> bool {
        self.queue.contains(key)
    }

    pub fn pending_count(&self) -> usize {
        self.queue.len()
    }

    pub fn allocation(&self, key: BatchKey) -> Option<&Allocation> {
        self.running.get(&key)
    }
}
