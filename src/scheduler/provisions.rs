//! What the core keeps of provisioned capacity
//! (docs/rules.md#provisioned-capacity) between passes ([`Provisions`]):
//! the pools a provisioner grows and shrinks, the sets of nodes being
//! created for a batch (each slot's node id, which have registered, what
//! is set aside for the batch meanwhile), each pool's backoff after a
//! failed set and the nodes it was asked for in the last minute, when
//! each node of such a pool last held nothing, and the nodes being
//! suspended. The rules that change it are `provision.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use chrono::{DateTime, Duration, Utc};

use super::capacity::{NodeId, NodeSpec, Placement};
use super::model::{BatchKey, NodeSet, ProvisionPolicy, Suspension};
use crate::spec::QuotaAmount;

/// (region, zone, pool).
pub(super) type PoolKey = (String, String, String);

/// The pool of a node or a set.
pub(super) fn pool_key(region: &str, zone: &str, pool: &str) -> PoolKey {
    (region.to_string(), zone.to_string(), pool.to_string())
}

/// A pool with a provisioner, as the layout declares it.
#[derive(Debug, Clone)]
pub(super) struct Pool {
    /// The pool's declared node: what a new node offers.
    pub(super) shape: NodeSpec,
    pub(super) max_nodes: u32,
    pub(super) policy: ProvisionPolicy,
}

/// A set of nodes being created for one queued batch.
#[derive(Debug, Clone)]
pub(super) struct OpenSet {
    pub(super) set: NodeSet,
    /// The slots whose agent registered.
    pub(super) registered: BTreeSet<NodeId>,
    /// What is set aside for the batch: its parts on the nodes that were
    /// there, and each registered slot's whole node.
    pub(super) banked: Vec<Placement>,
    /// The batch's quota, set aside in the ledger.
    pub(super) quota: Vec<QuotaAmount>,
    /// Why the set failed before its timeout (its program failed, a node
    /// left): failed at the next pass.
    pub(super) failed: Option<String>,
}

impl OpenSet {
    pub(super) fn complete(&self) -> bool {
        self.failed.is_none() && self.registered.len() == self.set.slots.len()
    }

    pub(super) fn pool(&self) -> PoolKey {
        pool_key(&self.set.region, &self.set.zone, &self.set.pool)
    }

    /// Whether the set is of `pool` (without building its key).
    pub(super) fn is_of(&self, pool: &PoolKey) -> bool {
        self.set.pool == pool.2 && self.set.zone == pool.1 && self.set.region == pool.0
    }
}

/// How many boot times each pool remembers (for its p90).
const BOOT_MEMORY: usize = 64;

#[derive(Debug, Default)]
pub(super) struct Provisions {
    pub(super) pools: BTreeMap<PoolKey, Pool>,
    sets: BTreeMap<BatchKey, OpenSet>,
    /// Each waiting or registered slot's set.
    slots: HashMap<NodeId, BatchKey>,
    /// Per pool after a failed set: until when it is not asked again, and
    /// how many sets failed in a row.
    backoff: HashMap<PoolKey, (DateTime<Utc>, u32)>,
    /// Per pool: the nodes asked for, when (the last minute's count is
    /// its resume rate's).
    resumed: HashMap<PoolKey, VecDeque<(DateTime<Utc>, u32)>>,
    /// Per pool: how long its last sets took, decision to last
    /// registration.
    boots: HashMap<PoolKey, VecDeque<Duration>>,
    /// The nodes of provisioned pools that hold nothing.
    pub(super) idle: IdleNodes,
    /// Nodes told to suspend, with their pool and why ("idle", "failed",
    /// "abandoned", "lost"): they take no new work. Registered or not: a slot of
    /// a failed set is suspended too, in case its node is coming up.
    pub(super) suspending: BTreeMap<NodeId, (PoolKey, &'static str)>,
    /// Sets whose batch left the queue: suspended at the next pass.
    pub(super) abandoned: Vec<Suspension>,
    /// When the last pass ran: a deadline at or before it was looked at
    /// (a backoff over, a node kept idle at the floor) and wakes nothing.
    pub(super) last_pass: Option<DateTime<Utc>>,
    /// Sets completed since the engine last asked: their pool and boot.
    pub(super) completed: Vec<(PoolKey, std::time::Duration)>,
}

impl Provisions {
    /// The pools a provisioner manages, as the layout now declares them.
    pub(super) fn set_pools(&mut self, pools: BTreeMap<PoolKey, Pool>) {
        self.idle.keep_pools(&pools);
        self.pools = pools;
    }

    /// The provisioned pools of `region`, in zone and pool order.
    pub(super) fn pools_in<'a>(
        &'a self,
        region: &'a str,
    ) -> impl Iterator<Item = (&'a PoolKey, &'a Pool)> + 'a {
        self.pools.iter().filter(move |(k, _)| k.0 == region)
    }

    pub(super) fn open(&mut self, open: OpenSet) {
        for slot in &open.set.slots {
            self.slots.insert(slot.clone(), open.set.key);
        }
        self.sets.insert(open.set.key, open);
    }

    pub(super) fn get(&self, key: BatchKey) -> Option<&OpenSet> {
        self.sets.get(&key)
    }

    pub(super) fn get_mut(&mut self, key: BatchKey) -> Option<&mut OpenSet> {
        self.sets.get_mut(&key)
    }

    pub(super) fn is_provisioning(&self, key: BatchKey) -> bool {
        self.sets.contains_key(&key)
    }

    /// The set a slot belongs to.
    pub(super) fn slot_owner(&self, node: &NodeId) -> Option<BatchKey> {
        self.slots.get(node).copied()
    }

    /// Whether `node` is a slot of an open set (waiting or registered).
    pub(super) fn is_slot(&self, node: &NodeId) -> bool {
        self.slots.contains_key(node)
    }

    /// Takes a set out, with its slots.
    pub(super) fn take(&mut self, key: BatchKey) -> Option<OpenSet> {
        let open = self.sets.remove(&key)?;
        for slot in &open.set.slots {
            self.slots.remove(slot);
        }
        Some(open)
    }

    /// The sets of `region` whose every slot registered.
    pub(super) fn complete_in(&self, region: &str) -> Vec<BatchKey> {
        self.sets
            .values()
            .filter(|o| o.set.region == region && o.complete())
            .map(|o| o.set.key)
            .collect()
    }

    /// The sets that failed, or whose slots did not all register by their
    /// time.
    pub(super) fn due(&self, now: DateTime<Utc>) -> Vec<BatchKey> {
        self.sets
            .values()
            .filter(|o| o.failed.is_some() || (!o.complete() && o.set.register_by <= now))
            .map(|o| o.set.key)
            .collect()
    }

    /// Every open set, by batch.
    pub(super) fn sets(&self) -> impl Iterator<Item = &OpenSet> {
        self.sets.values()
    }

    /// Until when `pool` is not asked again, if it backs off at `now`.
    pub(super) fn backing_off(&self, pool: &PoolKey, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.backoff
            .get(pool)
            .map(|(until, _)| *until)
            .filter(|until| *until > now)
    }

    /// A set of `pool` failed at `now`: it backs off, twice as long as the
    /// last time, within its policy. Answers until when.
    pub(super) fn back_off(&mut self, pool: &PoolKey, now: DateTime<Utc>) -> DateTime<Utc> {
        let (base, max) = self.pools.get(pool).map_or(
            (std::time::Duration::ZERO, std::time::Duration::ZERO),
            |p| (p.policy.backoff_base, p.policy.backoff_max),
        );
        let failures = self.backoff.get(pool).map_or(0, |(_, n)| *n) + 1;
        let wait = base
            .checked_mul(1u32 << (failures - 1).min(20))
            .unwrap_or(max)
            .min(max);
        let until = now + Duration::from_std(wait).unwrap_or_default();
        self.backoff.insert(pool.clone(), (until, failures));
        until
    }

    /// A set of `pool` completed, `boot` after its decision: the backoff
    /// starts over, and the boot time is remembered.
    pub(super) fn succeeded(&mut self, pool: &PoolKey, boot: Duration) {
        self.backoff.remove(pool);
        self.remember_boot(pool, boot);
    }

    /// One more of `pool`'s boot times (its last [`BOOT_MEMORY`] count).
    pub(super) fn remember_boot(&mut self, pool: &PoolKey, boot: Duration) {
        let boots = self.boots.entry(pool.clone()).or_default();
        boots.push_back(boot);
        if boots.len() > BOOT_MEMORY {
            boots.pop_front();
        }
    }

    /// The pool's boot time, the p90 of the sets it completed lately.
    pub(super) fn boot_p90(&self, pool: &PoolKey) -> Option<Duration> {
        let boots = self.boots.get(pool)?;
        let mut all: Vec<Duration> = boots.iter().copied().collect();
        all.sort();
        let i = ((all.len() as f64 * 0.9).ceil() as usize).clamp(1, all.len()) - 1;
        all.get(i).copied()
    }

    /// How many nodes `pool` may still be asked for at `now` under its
    /// resume rate: None when none was asked in the last minute (a set of
    /// any size may go then).
    pub(super) fn rate_left(&self, pool: &PoolKey, now: DateTime<Utc>) -> Option<u32> {
        let rate = self.pools.get(pool).map_or(0, |p| p.policy.resume_rate);
        let minute_ago = now - Duration::minutes(1);
        let asked: u32 = self
            .resumed
            .get(pool)
            .into_iter()
            .flatten()
            .filter(|(at, _)| *at > minute_ago)
            .map(|(_, n)| n)
            .sum();
        (asked > 0).then(|| rate.saturating_sub(asked))
    }

    /// `n` nodes of `pool` were asked for at `now`.
    pub(super) fn resumed(&mut self, pool: &PoolKey, n: u32, now: DateTime<Utc>) {
        let recent = self.resumed.entry(pool.clone()).or_default();
        while recent
            .front()
            .is_some_and(|(at, _)| *at <= now - Duration::minutes(1))
        {
            recent.pop_front();
        }
        recent.push_back((now, n));
    }

    /// The pools with a node idle for their `suspend_after` by `now`.
    pub(super) fn idle_due(&self, now: DateTime<Utc>) -> HashSet<&PoolKey> {
        self.idle
            .since
            .values()
            .filter(|(since, pool)| {
                self.pools.get(pool).is_some_and(|p| {
                    *since + Duration::from_std(p.policy.suspend_after).unwrap_or_default() <= now
                })
            })
            .map(|(_, pool)| pool)
            .collect()
    }

    /// The earliest time something here is due after the last pass: a
    /// set's timeout, a backoff's end, a node idle long enough.
    pub(super) fn next_deadline(&self) -> Option<DateTime<Utc>> {
        let sets = self.sets.values().map(|o| o.set.register_by);
        let backoffs = self.backoff.values().map(|(until, _)| *until);
        let idle = self.idle.since.values().filter_map(|(since, pool)| {
            let after = self.pools.get(pool)?.policy.suspend_after;
            Some(*since + Duration::from_std(after).unwrap_or_default())
        });
        sets.chain(backoffs)
            .chain(idle)
            .filter(|t| self.last_pass.is_none_or(|last| *t > last))
            .min()
    }
}

/// The nodes of provisioned pools that hold nothing: since when (the pass
/// that first saw each empty), and the idle node-seconds each pool has
/// had, until they took work again or were told to suspend.
#[derive(Debug, Default)]
pub(super) struct IdleNodes {
    since: HashMap<NodeId, (DateTime<Utc>, PoolKey)>,
    counted: BTreeMap<PoolKey, f64>,
}

impl IdleNodes {
    /// Node `id` of `pool` holds nothing at `now`: since when it has.
    pub(super) fn mark(
        &mut self,
        id: &NodeId,
        pool: &PoolKey,
        now: DateTime<Utc>,
    ) -> DateTime<Utc> {
        self.since
            .entry(id.clone())
            .or_insert_with(|| (now, pool.clone()))
            .0
    }

    /// Node `id` took work at `now`, or was told to suspend: its idle
    /// time is counted.
    pub(super) fn end(&mut self, id: &NodeId, now: DateTime<Utc>) {
        if let Some((since, pool)) = self.since.remove(id) {
            *self.counted.entry(pool).or_default() += seconds_between(since, now);
        }
    }

    /// The idle nodes of `pool` not among `present` (lost, or gone) at
    /// `now`: their idle time is counted, and they are idle no more.
    pub(super) fn end_missing(
        &mut self,
        pool: &PoolKey,
        present: &HashSet<NodeId>,
        now: DateTime<Utc>,
    ) {
        let gone: Vec<NodeId> = self
            .since
            .iter()
            .filter(|(id, (_, p))| p == pool && !present.contains(*id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.end(&id, now);
        }
    }

    /// Only `pools` stay (a reload removed the others' provisioners):
    /// the idle nodes and idle time of the rest are forgotten.
    pub(super) fn keep_pools(&mut self, pools: &BTreeMap<PoolKey, Pool>) {
        self.since.retain(|_, (_, pool)| pools.contains_key(pool));
        self.counted.retain(|pool, _| pools.contains_key(pool));
    }

    /// Node `id` is gone (its idle time, if any, was counted already).
    pub(super) fn forget(&mut self, id: &NodeId) {
        self.since.remove(id);
    }

    pub(super) fn contains(&self, id: &NodeId) -> bool {
        self.since.contains_key(id)
    }

    /// Idle node-seconds per pool up to `now`: those counted, and those of
    /// the nodes idle now.
    pub(super) fn seconds(&self, now: DateTime<Utc>) -> BTreeMap<PoolKey, f64> {
        let mut total = self.counted.clone();
        for (since, pool) in self.since.values() {
            *total.entry(pool.clone()).or_default() += seconds_between(*since, now);
        }
        total
    }
}

fn seconds_between(since: DateTime<Utc>, now: DateTime<Utc>) -> f64 {
    (now - since).num_milliseconds().max(0) as f64 / 1000.0
}

/// The ids of a pool's slots: `{zone}-{pool}-{n}`, n from 0 below its
/// max_nodes.
pub(super) fn slot_prefix(shape: &NodeSpec) -> String {
    format!("{}-{}-", shape.zone, shape.pool)
}
