//! Provisioned capacity's rules (docs/rules.md#provisioned-capacity): a
//! pool with a provisioner grows by sets of new nodes, each for one queued
//! batch that only capacity blocks, all or nothing, and shrinks by the
//! nodes that held nothing for its `suspend_after`.
//!
//! A set is decided in the walk where preemption would be
//! ([`Scheduler::plan_provision`], tried first): the fewest new nodes of
//! one zone's pool that, with what is free there, hold the batch's whole
//! cluster. Its slots are node ids (`{zone}-{pool}-{n}`) the operator's
//! resume program starts agents under; its parts on the nodes that were
//! there, and its quota, are set aside for it, and so is each slot's
//! node as it registers: no other batch may use them. Once every slot
//! registered, the batch is allocated in its zone
//! ([`Scheduler::settle_sets`]); if a slot fails, a node leaves, or the
//! resume timeout passes first, every node of the set is suspended, the
//! pool backs off, and the batch stays queued at its place.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Duration, Utc};

use super::capacity::{Node, NodeId, Placement, needs, plan_zone};
use super::core::Scheduler;
use super::model::{BatchKey, Decision, NodeSet, PendingBatch, PoolDecl, SuspendCause, Suspension};
use super::provisions::{OpenSet, Pool, PoolKey, pool_key, slot_prefix};
use crate::spec::{Accelerator, PartRole};

/// The states a provisioned pool's node is counted in (metrics).
pub const PROVISIONED_STATES: [&str; 4] = ["provisioning", "in_use", "idle", "suspending"];

/// A set the walk may decide: its pool, its slots, and the cluster's plan
/// on the zone's nodes and the slots.
pub(super) type SetPlan = (PoolKey, Vec<NodeId>, Vec<Placement>);

impl Scheduler {
    /// The pools of `pools` that have a provisioner.
    pub(super) fn set_provisioned_pools(&mut self, pools: &[PoolDecl]) {
        let provisioned: BTreeMap<PoolKey, Pool> = pools
            .iter()
            .filter_map(|p| {
                let policy = p.provisioner.clone()?;
                let mut shape = p.node.clone();
                shape.is_virtual = false;
                Some((
                    pool_key(&p.region, &p.zone, &p.node.pool),
                    Pool {
                        shape,
                        max_nodes: p.max_nodes,
                        policy,
                    },
                ))
            })
            .collect();
        self.provisions.set_pools(provisioned);
    }

    /// The cheapest set of new nodes for `batch` in `region` at `now`: of
    /// each provisioned pool of a GPU type the cluster needs, not backing
    /// off, the fewest new nodes that with what is free in the pool's
    /// zone hold the whole cluster, within what the pool may still grow
    /// (its `max_nodes` less the nodes present and being created) and its
    /// resume rate. None when no pool can.
    pub(super) fn plan_provision(
        &self,
        batch: &PendingBatch,
        region: &str,
        now: DateTime<Utc>,
    ) -> Option<SetPlan> {
        let parts = needs(&batch.cluster);
        let mut best: Option<SetPlan> = None;
        for (key, pool) in self.provisions.pools_in(region) {
            let accelerator = pool.shape.accelerator;
            if self.provisions.backing_off(key, now).is_some()
                || !parts
                    .iter()
                    .any(|p| p.gpus > 0 && p.accelerator == Some(accelerator))
            {
                continue;
            }
            let mut room = pool.max_nodes.saturating_sub(self.nodes_of(key));
            if let Some(left) = self.provisions.rate_left(key, now) {
                room = room.min(left);
            }
            if room == 0 {
                continue;
            }
            let present = self.capacity.zone_nodes(region, &key.1);
            // Not enough GPUs of its type even with every new node: no
            // placement to try.
            let wanted: u32 = parts
                .iter()
                .filter(|p| p.accelerator == Some(accelerator))
                .map(|p| p.gpus)
                .sum();
            let free: u32 = present
                .iter()
                .filter(|n| n.spec.accelerator == accelerator)
                .map(|n| n.free_gpus())
                .sum();
            let new = room * pool.shape.gpu_addresses.len() as u32;
            if free + new < wanted {
                continue;
            }
            let names = self.free_slot_names(pool, room as usize);
            let slots: Vec<Node> = names
                .iter()
                .map(|id| {
                    let mut spec = pool.shape.clone();
                    spec.id = id.clone();
                    Node::new(spec)
                })
                .collect();
            // The fewest slots that hold it: more never hurt a best fit,
            // so the least is found by halving, below the number the plan
            // with every slot uses (a best fit fills what is there first,
            // so that is most often the least already).
            let plan_with = |k: usize| {
                let mut nodes = present.clone();
                nodes.extend(slots.iter().take(k));
                let plan = plan_zone(&nodes, &parts);
                plan.complete().then_some(plan.placements)
            };
            let Some(all) = plan_with(slots.len()) else {
                continue;
            };
            let most = slots
                .iter()
                .filter(|s| all.iter().any(|p| p.node == s.spec.id))
                .count()
                .max(1);
            let (mut low, mut high) = (1, most);
            while low < high {
                let mid = (low + high) / 2;
                if plan_with(mid).is_some() {
                    high = mid;
                } else {
                    low = mid + 1;
                }
            }
            // Identical empty nodes: as few as the full plan used hold it
            // too; should the heuristic disagree, the full plan stands.
            let (high, plan) = match plan_with(high) {
                Some(plan) => (high, plan),
                None => (slots.len(), all),
            };
            let used: Vec<NodeId> = names
                .iter()
                .take(high)
                .filter(|n| plan.iter().any(|p| &p.node == *n))
                .cloned()
                .collect();
            if used.is_empty() {
                continue;
            }
            if best.as_ref().is_none_or(|b| used.len() < b.1.len()) {
                best = Some((key.clone(), used, plan));
            }
        }
        best
    }

    /// Whether `pool` boots slower (its p90) than its operator's
    /// `preempt_if_boot_over`: preemption is tried before its new nodes.
    pub(super) fn boots_too_slowly(&self, pool: &PoolKey) -> bool {
        let bound = self
            .provisions
            .pools
            .get(pool)
            .and_then(|p| p.policy.preempt_if_boot_over);
        match (bound, self.provisions.boot_p90(pool)) {
            (Some(bound), Some(boot)) => boot.to_std().is_ok_and(|b| b > bound),
            _ => false,
        }
    }

    /// The nodes of `pool` there are and being created: registered ones
    /// (suspending too) and slots not registered yet.
    pub(super) fn nodes_of(&self, pool: &PoolKey) -> u32 {
        let present = self
            .capacity
            .zone_nodes_all(&pool.0, &pool.1)
            .filter(|n| n.spec.pool == pool.2)
            .count();
        let waiting: usize = self
            .provisions
            .sets()
            .filter(|o| o.is_of(pool))
            .map(|o| o.set.slots.len() - o.registered.len())
            .sum();
        // Machines being deleted that are not nodes here (lost, or slots
        // that never registered) may still be up.
        let going = self
            .provisions
            .suspending
            .iter()
            .filter(|(id, (p, _))| p == pool && !self.capacity.nodes.contains_key(*id))
            .count();
        (present + waiting + going) as u32
    }

    /// `n` ids of `pool` no node or slot has, lowest first.
    fn free_slot_names(&self, pool: &Pool, n: usize) -> Vec<NodeId> {
        let prefix = slot_prefix(&pool.shape);
        (0..)
            .map(|i| NodeId(format!("{prefix}{i}")))
            .filter(|id| {
                !self.capacity.nodes.contains_key(id)
                    && !self.provisions.is_slot(id)
                    && !self.provisions.suspending.contains_key(id)
            })
            .take(n)
            .collect()
    }

    /// Decides `plan`'s set for `batch` at `now`: its parts on present
    /// nodes and its quota are set aside for it.
    pub(super) fn provision(
        &mut self,
        batch: &PendingBatch,
        region: &str,
        plan: SetPlan,
        now: DateTime<Utc>,
        out: &mut Vec<Decision>,
    ) {
        let (pool, slots, placements) = plan;
        let Some(spec) = self.provisions.pools.get(&pool).map(|p| p.shape.clone()) else {
            return;
        };
        let timeout = self
            .provisions
            .pools
            .get(&pool)
            .map_or(std::time::Duration::ZERO, |p| p.policy.resume_timeout);
        let on_present: Vec<Placement> = placements
            .into_iter()
            .filter(|p| !slots.contains(&p.node))
            .collect();
        let banked = self.capacity.take_free(&on_present);
        let quota = batch.cluster.quota.clone();
        self.ledger.set_aside(&batch.project, region, &quota);
        let mut register_by = now + Duration::from_std(timeout).unwrap_or_default();
        if let Some(deadline) = batch.deadline {
            register_by = register_by.min(deadline);
        }
        let set = NodeSet {
            key: batch.key,
            batch_id: batch.batch_id.clone(),
            project: batch.project.clone(),
            region: region.to_string(),
            zone: pool.1.clone(),
            pool: pool.2.clone(),
            slots,
            shape: spec,
            decided_at: now,
            register_by,
            on_present,
        };
        self.provisions.resumed(&pool, set.slots.len() as u32, now);
        self.provisions.open(OpenSet {
            set: set.clone(),
            registered: BTreeSet::new(),
            banked,
            quota,
            failed: None,
        });
        self.dirty.insert(region.to_string());
        out.push(Decision::Provision(set));
    }

    /// A set read back from the store (a restart, a new leader): what it
    /// set aside is set aside again, and its slots that registered are
    /// bound to it.
    pub fn restore_set(&mut self, set: NodeSet, registered: &[NodeId]) {
        if self.provisions.is_provisioning(set.key) {
            return;
        }
        let banked = self.capacity.take_free(&set.on_present);
        let quota = self
            .queue
            .get(set.key)
            .map(|b| b.cluster.quota.clone())
            .unwrap_or_default();
        self.ledger.set_aside(&set.project, &set.region, &quota);
        self.dirty.insert(set.region.clone());
        self.provisions.open(OpenSet {
            set,
            registered: BTreeSet::new(),
            banked,
            quota,
            failed: None,
        });
        for node in registered {
            self.bind_slot(node);
        }
    }

    /// A registered node that is a slot of an open set: its whole node is
    /// set aside for the set's batch.
    pub(super) fn bind_slot(&mut self, id: &NodeId) {
        let Some(key) = self.provisions.slot_owner(id) else {
            return;
        };
        let Some(node) = self.capacity.nodes.get(id) else {
            return;
        };
        let whole = Placement {
            node: id.clone(),
            role: PartRole::Executor,
            gpus: node.spec.gpu_addresses.clone(),
            cores: node.spec.cores,
            memory_mb: node.spec.memory_mb,
            local_ssd_gb: node.spec.local_ssd_gb,
            accelerator: Some(node.spec.accelerator),
        };
        let region = node.spec.region.clone();
        let taken = self.capacity.take_free(std::slice::from_ref(&whole));
        let took = taken.iter().any(|p| !p.gpus.is_empty() || p.cores > 0);
        if let Some(open) = self.provisions.get_mut(key) {
            let new = open.registered.insert(id.clone());
            // A slot that registers again with a new shape was put back
            // whole: what was set aside of its old shape is moot.
            if new || took {
                open.banked.retain(|p| p.node != *id);
                open.banked.extend(taken);
            }
        }
        self.dirty.insert(region);
    }

    /// The sets of `region` whose every slot registered: each batch is
    /// allocated in its set's zone, on what was set aside for it and what
    /// is free there; a set whose nodes cannot hold it fails.
    pub(super) fn settle_sets(
        &mut self,
        region: &str,
        now: DateTime<Utc>,
        out: &mut Vec<Decision>,
    ) {
        for key in self.provisions.complete_in(region) {
            let Some(open) = self.provisions.take(key) else {
                continue;
            };
            self.give_back_set(&open);
            let pool = open.pool();
            let Some(batch) = self.queue.get(key).cloned() else {
                continue;
            };
            if self.held_or_short(region, &batch) {
                // Its nodes are there, and idle: suspended in time unless
                // the batch or another takes them.
                continue;
            }
            let nodes = self.capacity.zone_nodes(region, &open.set.zone);
            let plan = plan_zone(&nodes, &needs(&batch.cluster));
            if plan.complete() && self.capacity.take(&plan.placements) {
                let boot = now - open.set.decided_at;
                self.provisions.succeeded(&pool, boot);
                self.provisions
                    .completed
                    .push((pool.clone(), boot.to_std().unwrap_or_default()));
                let own = (region, &batch.cluster);
                let zone = open.set.zone.clone();
                out.push(self.grant(&batch, own, (zone, plan.placements), None, now));
            } else {
                let message = format!(
                    "the {} nodes that registered in {} cannot hold the batch's cluster (they offer less than the pool declares)",
                    open.set.slots.len(),
                    open.set.zone
                );
                out.push(self.fail_set(open, message, now));
            }
        }
    }

    /// The open sets of `region` whose batch fits now on nodes that are
    /// there (a cluster ended meanwhile) are given up: the batch is
    /// allocated by the walk at once, and their nodes are suspended.
    pub(super) fn give_up_needless_sets(&mut self, region: &str) {
        let open: Vec<BatchKey> = self
            .provisions
            .sets()
            .filter(|o| o.set.region == region && !o.complete())
            .map(|o| o.set.key)
            .collect();
        if open.is_empty() {
            return;
        }
        // The most GPUs of each type one zone has free: a batch that wants
        // more of a type fits nowhere, and no placement is tried for it.
        // A set given up gives its GPUs back: counted again after it.
        let mut most_free = self.most_free_gpus(region);
        for key in open {
            let fits = self.queue.get(key).is_some_and(|b| {
                let parts = needs(&b.cluster);
                let mut wanted: HashMap<Accelerator, u32> = HashMap::new();
                for p in &parts {
                    if let Some(a) = p.accelerator {
                        *wanted.entry(a).or_default() += p.gpus;
                    }
                }
                wanted
                    .iter()
                    .all(|(a, n)| most_free.get(a).copied().unwrap_or(0) >= *n)
                    && self.best_zone(region, &parts).is_some()
            });
            if fits {
                self.abandon_set(
                    key,
                    "capacity for the batch freed up on nodes that are there",
                );
                most_free = self.most_free_gpus(region);
            }
        }
    }

    /// The most GPUs of each type one zone of `region` has free.
    fn most_free_gpus(&self, region: &str) -> HashMap<Accelerator, u32> {
        let mut most_free: HashMap<Accelerator, u32> = HashMap::new();
        for zone in self.capacity.zones(region) {
            let mut free: HashMap<Accelerator, u32> = HashMap::new();
            for n in self.capacity.zone_nodes(region, zone) {
                *free.entry(n.spec.accelerator).or_default() += n.free_gpus();
            }
            for (accelerator, n) in free {
                let most = most_free.entry(accelerator).or_default();
                *most = (*most).max(n);
            }
        }
        most_free
    }

    /// Gives back what an open set set aside: its capacity and its quota.
    fn give_back_set(&mut self, open: &OpenSet) {
        self.capacity.give_back(&open.banked);
        self.ledger
            .release_aside(&open.set.project, &open.set.region, &open.quota);
        self.dirty.insert(open.set.region.clone());
    }

    /// Sets that failed or timed out at `now`: each is suspended whole,
    /// its pool backs off, its batch stays queued.
    pub(super) fn fail_due_sets(&mut self, now: DateTime<Utc>, out: &mut Vec<Decision>) {
        for key in self.provisions.due(now) {
            let Some(open) = self.provisions.take(key) else {
                continue;
            };
            self.give_back_set(&open);
            let message = match &open.failed {
                Some(why) => why.clone(),
                None => format!(
                    "{} of {} nodes registered within {}",
                    open.registered.len(),
                    open.set.slots.len(),
                    humantime::format_duration(
                        (open.set.register_by - open.set.decided_at)
                            .to_std()
                            .unwrap_or_default()
                    )
                ),
            };
            out.push(self.fail_set(open, message, now));
        }
    }

    /// `open`, taken out and given back, failed for `message`: its nodes
    /// are suspended, its pool backs off.
    fn fail_set(&mut self, open: OpenSet, message: String, now: DateTime<Utc>) -> Decision {
        let pool = open.pool();
        let until = self.provisions.back_off(&pool, now);
        for node in &open.set.slots {
            self.provisions
                .suspending
                .insert(node.clone(), (pool.clone(), "failed"));
        }
        self.refresh_unschedulable();
        let OpenSet { set, .. } = open;
        Decision::Suspend(Suspension {
            region: set.region,
            zone: set.zone,
            pool: set.pool,
            nodes: set.slots,
            cause: SuspendCause::Failed {
                key: set.key,
                batch_id: set.batch_id,
                backoff_until: until,
            },
            message,
        })
    }

    /// A set being created for `key` is given back (`why`: its batch left
    /// the queue, or it fits elsewhere now) and its nodes are suspended at
    /// the next pass.
    pub(super) fn abandon_set(&mut self, key: BatchKey, why: &str) {
        let Some(open) = self.provisions.take(key) else {
            return;
        };
        self.give_back_set(&open);
        for node in &open.set.slots {
            self.provisions
                .suspending
                .insert(node.clone(), (open.pool(), "abandoned"));
        }
        self.refresh_unschedulable();
        let set = open.set;
        self.provisions.abandoned.push(Suspension {
            message: format!(
                "{why} before the {} nodes of batch {} registered",
                set.slots.len(),
                set.batch_id
            ),
            region: set.region,
            zone: set.zone,
            pool: set.pool,
            nodes: set.slots,
            cause: SuspendCause::Abandoned {
                key: set.key,
                batch_id: set.batch_id,
            },
        });
    }

    /// The suspensions of sets abandoned since the last call, as decisions.
    pub(super) fn suspend_abandoned(&mut self, out: &mut Vec<Decision>) {
        out.extend(
            std::mem::take(&mut self.provisions.abandoned)
                .into_iter()
                .map(Decision::Suspend),
        );
    }

    /// A set decided but not written (its batch left meanwhile): nothing
    /// was asked of its program, so nothing is suspended.
    pub(super) fn withdraw_set(&mut self, key: BatchKey) {
        if let Some(open) = self.provisions.take(key) {
            self.give_back_set(&open);
        }
    }

    /// The resume program of `key`'s set failed (`why`): the set fails at
    /// the next pass.
    pub fn resume_failed(&mut self, key: BatchKey, why: String) {
        if let Some(open) = self.provisions.get_mut(key) {
            if open.failed.is_none() {
                open.failed = Some(why);
            }
        }
    }

    /// A registered node left (its lease lapsed): a set it was a slot of
    /// fails.
    pub(super) fn slot_lost(&mut self, id: &NodeId) {
        if let Some(key) = self.provisions.slot_owner(id) {
            self.resume_failed(key, format!("node {id} left before every node registered"));
        }
    }

    /// Node `id`, about to be removed because its lease expired at
    /// `expired_at`: where it is a provisioned pool's and neither a slot
    /// of a set being created (its set fails whole), being suspended
    /// already nor cordoned (a cordon means "do not suspend": an operator
    /// keeps the machine), it is suspended: its machine may still be up.
    pub(super) fn lost_machine(
        &mut self,
        id: &NodeId,
        epoch: u64,
        expired_at: DateTime<Utc>,
    ) -> Option<Suspension> {
        let spec = &self.capacity.nodes.get(id)?.spec;
        let pool = pool_key(&spec.region, &spec.zone, &spec.pool);
        if spec.is_virtual
            || !self.provisions.pools.contains_key(&pool)
            || self.provisions.slot_owner(id).is_some()
            || self.provisions.suspending.contains_key(id)
            || self.cordons.contains_key(id)
        {
            return None;
        }
        self.provisions
            .suspending
            .insert(id.clone(), (pool.clone(), "lost"));
        self.refresh_unschedulable();
        let (region, zone, pool) = pool;
        Some(Suspension {
            region,
            zone,
            pool,
            nodes: vec![id.clone()],
            cause: SuspendCause::Lost { epoch },
            message: format!(
                "its agent stopped heartbeating and its lease expired at {}",
                expired_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
        })
    }

    /// Idle nodes of provisioned pools at `now`: those that held nothing
    /// for their pool's `suspend_after`, are not cordoned, and whose GPU
    /// type no queued batch of the region waits for are suspended, down
    /// to the pool's `min_nodes`, the highest ids first. Looked at: the
    /// pools of the regions this pass scanned (where anything changed)
    /// and those with a node idle long enough by now.
    pub(super) fn scale_down(
        &mut self,
        now: DateTime<Utc>,
        scanned: &BTreeSet<String>,
        out: &mut Vec<Decision>,
    ) {
        self.provisions.last_pass = Some(now);
        if self.provisions.pools.is_empty() {
            return;
        }
        let due = self.provisions.idle_due(now);
        let waited = self.elastic.waited();
        // What scale-down reads of each pool (not the pool: its programs'
        // argv need no copy each pass).
        let pools: Vec<(PoolKey, Option<Accelerator>, u32, std::time::Duration)> = self
            .provisions
            .pools
            .iter()
            .filter(|(k, _)| scanned.contains(&k.0) || due.contains(*k))
            .map(|(k, p)| {
                let policy = &p.policy;
                (
                    k.clone(),
                    Some(p.shape.accelerator),
                    policy.min_nodes,
                    policy.suspend_after,
                )
            })
            .collect();
        for (key, accelerator, min_nodes, suspend_after) in pools {
            let nodes: Vec<(NodeId, bool)> = self
                .capacity
                .zone_nodes_all(&key.0, &key.1)
                .filter(|n| n.spec.pool == key.2 && !n.spec.is_virtual)
                .map(|n| (n.spec.id.clone(), holds_nothing(n)))
                .collect();
            let present: HashSet<NodeId> = nodes.iter().map(|(id, _)| id.clone()).collect();
            self.provisions.idle.end_missing(&key, &present, now);
            let mut due = Vec::new();
            let mut staying = 0u32;
            for (id, empty) in nodes {
                if self.provisions.suspending.contains_key(&id) {
                    continue;
                }
                staying += 1;
                if !empty || self.provisions.is_slot(&id) {
                    self.provisions.idle.end(&id, now);
                    continue;
                }
                let since = self.provisions.idle.mark(&id, &key, now);
                let after = Duration::from_std(suspend_after).unwrap_or_default();
                if since + after <= now && !self.cordons.contains_key(&id) {
                    due.push(id);
                }
            }
            let wanted = waited.contains(&(key.0.clone(), accelerator));
            if due.is_empty() || wanted {
                continue;
            }
            let spare = staying.saturating_sub(min_nodes) as usize;
            due.sort_by_key(|id| std::cmp::Reverse(natural(id)));
            due.truncate(spare);
            if due.is_empty() {
                continue;
            }
            for id in &due {
                self.provisions.idle.end(id, now);
                self.provisions
                    .suspending
                    .insert(id.clone(), (key.clone(), "idle"));
            }
            self.refresh_unschedulable();
            self.dirty.insert(key.0.clone());
            let message = format!(
                "held nothing for {}",
                humantime::format_duration(suspend_after)
            );
            out.push(Decision::Suspend(Suspension {
                region: key.0,
                zone: key.1,
                pool: key.2,
                nodes: due,
                cause: SuspendCause::Idle,
                message,
            }));
        }
    }

    /// The suspend program deleted `nodes`: they leave the capacity.
    pub fn nodes_suspended(&mut self, nodes: &[NodeId]) {
        for id in nodes {
            self.provisions.suspending.remove(id);
            self.provisions.idle.forget(id);
            self.leases.release(id);
            if let Some(n) = self.capacity.remove(id) {
                self.dirty.insert(n.spec.region);
            }
        }
        self.refresh_unschedulable();
    }

    /// The suspend program failed for `nodes`: they are nodes like any
    /// other again, idle from the next pass.
    pub fn suspend_failed(&mut self, nodes: &[NodeId]) {
        for id in nodes {
            if self.provisions.suspending.remove(id).is_some() {
                if let Some(n) = self.capacity.nodes.get(id) {
                    self.dirty.insert(n.spec.region.clone());
                }
            }
        }
        self.refresh_unschedulable();
    }

    /// What `key`'s set stands at, for why-pending and the history:
    /// "provisioning 4 nodes in us-central1-a: 3 of 4 registered, 2m10s
    /// of 10m".
    pub fn provisioning_line(&self, key: BatchKey, now: DateTime<Utc>) -> Option<String> {
        let open = self.provisions.get(key)?;
        let set = &open.set;
        let waited = (now - set.decided_at).to_std().unwrap_or_default();
        let of = (set.register_by - set.decided_at)
            .to_std()
            .unwrap_or_default();
        Some(format!(
            "provisioning {} nodes in {} (pool {}): {} of {} registered, {} of {}",
            set.slots.len(),
            set.zone,
            set.pool,
            open.registered.len(),
            set.slots.len(),
            humantime::format_duration(std::time::Duration::from_secs(waited.as_secs())),
            humantime::format_duration(std::time::Duration::from_secs(of.as_secs()))
        ))
    }

    /// What a provisioned pool's node is doing: "provisioning" (a slot
    /// whose set is not complete), "suspending", "idle" (held nothing
    /// since the pass that saw it empty); None for any other node.
    pub fn provisioned_state(&self, node: &NodeId) -> Option<&'static str> {
        if self.provisions.suspending.contains_key(node) {
            Some("suspending")
        } else if self.provisions.is_slot(node) {
            Some("provisioning")
        } else if self.provisions.idle.contains(node) {
            Some("idle")
        } else {
            None
        }
    }

    /// The nodes of every provisioned pool by state: `provisioning` (a
    /// slot of a set being created, registered or not), `in_use` (holds
    /// work), `idle`, `suspending` (registered or not); every state of
    /// every pool is there, at 0 when no node is in it.
    pub fn provisioned_nodes(&self) -> BTreeMap<((String, String, String), &'static str), u64> {
        let mut out = BTreeMap::new();
        for key in self.provisions.pools.keys() {
            for state in PROVISIONED_STATES {
                out.insert((key.clone(), state), 0);
            }
        }
        let mut seen: HashSet<&NodeId> = HashSet::new();
        for key in self.provisions.pools.keys() {
            for n in self.capacity.zone_nodes_all(&key.0, &key.1) {
                if n.spec.pool != key.2 || n.spec.is_virtual {
                    continue;
                }
                let state = self.provisioned_state(&n.spec.id).unwrap_or("in_use");
                *out.entry((key.clone(), state)).or_default() += 1;
                seen.insert(&n.spec.id);
            }
        }
        for open in self.provisions.sets() {
            for slot in &open.set.slots {
                if seen.insert(slot) {
                    *out.entry((open.pool(), "provisioning")).or_default() += 1;
                }
            }
        }
        for (id, (pool, _)) in &self.provisions.suspending {
            if seen.insert(id) {
                *out.entry((pool.clone(), "suspending")).or_default() += 1;
            }
        }
        out
    }

    /// Idle node-seconds per provisioned pool up to `now`, since this
    /// scheduler started.
    pub fn idle_node_seconds(&self, now: DateTime<Utc>) -> BTreeMap<(String, String, String), f64> {
        let mut out = self.provisions.idle.seconds(now);
        for key in self.provisions.pools.keys() {
            out.entry(key.clone()).or_default();
        }
        out
    }

    /// The sets completed since the last call: their (region, zone, pool)
    /// and boot time.
    pub fn take_completed_sets(&mut self) -> Vec<((String, String, String), std::time::Duration)> {
        std::mem::take(&mut self.provisions.completed)
    }

    /// Every set of new nodes being created.
    pub fn open_sets(&self) -> impl Iterator<Item = &NodeSet> {
        self.provisions.sets().map(|o| &o.set)
    }

    /// Every node being suspended: its id, its (region, zone, pool) and
    /// why ("idle", "failed", "abandoned", "lost", "adopted").
    pub fn suspending(&self) -> impl Iterator<Item = (&NodeId, &(String, String, String), &str)> {
        self.provisions
            .suspending
            .iter()
            .map(|(id, (pool, why))| (id, pool, *why))
    }

    /// Nodes the store says are being suspended (a restart, a new leader):
    /// they take no new work, and their suspend program is run again.
    pub fn restore_suspending(&mut self, nodes: Vec<(NodeId, String, String, String)>) {
        for (id, region, zone, pool) in nodes {
            self.provisions
                .suspending
                .insert(id, (pool_key(&region, &zone, &pool), "adopted"));
        }
        self.refresh_unschedulable();
    }

    /// The slots of `key`'s open set, if it has one.
    pub fn provisioning_slots(&self, key: BatchKey) -> Option<&[NodeId]> {
        self.provisions.get(key).map(|o| o.set.slots.as_slice())
    }

    /// When `batch` could start on new nodes: its set's decision plus its
    /// pool's boot time (the p90 of the sets it completed lately; its
    /// `resume_timeout` until one did), or, blocked by capacity alone
    /// (`by_capacity`), now plus the boot time of the pool a set would be
    /// created in now. None when neither.
    pub(super) fn provisioned_start(
        &self,
        batch: &PendingBatch,
        by_capacity: bool,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let boot = |pool: &PoolKey| {
            self.provisions.boot_p90(pool).or_else(|| {
                let p = self.provisions.pools.get(pool)?;
                Duration::from_std(p.policy.resume_timeout).ok()
            })
        };
        if let Some(open) = self.provisions.get(batch.key) {
            let at = open.set.decided_at + boot(&open.pool())?;
            return Some(at.max(now));
        }
        if !by_capacity || self.provisions.pools.is_empty() {
            return None;
        }
        let (pool, _, _) = self.plan_provision(batch, &batch.region, now)?;
        Some(now + boot(&pool)?)
    }

    /// A boot time the store kept for a pool (a restart, a new leader):
    /// remembered as if its set completed since this scheduler started.
    pub fn restore_boot(&mut self, pool: (String, String, String), boot: std::time::Duration) {
        let boot = Duration::from_std(boot).unwrap_or_default();
        self.provisions.remember_boot(&pool, boot);
    }

    /// The pool's boot time (p90 of its recent sets), if it has one.
    pub fn boot_time(&self, region: &str, zone: &str, pool: &str) -> Option<Duration> {
        self.provisions.boot_p90(&pool_key(region, zone, pool))
    }
}

/// Whether a node holds nothing: all of it is free.
fn holds_nothing(n: &Node) -> bool {
    n.gpu_free.iter().all(|f| *f)
        && n.free_cores == n.spec.cores
        && n.free_memory_mb == n.spec.memory_mb
        && n.free_ssd_gb == n.spec.local_ssd_gb
}

/// A node id's sort key with its trailing number as a number: slot 10
/// after slot 9.
fn natural(id: &NodeId) -> (String, u64) {
    let digits = id.0.len() - id.0.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stem, n) = id.0.split_at(id.0.len() - digits);
    (stem.to_string(), n.parse().unwrap_or(0))
}
