//! Elastic clusters (docs/rules.md#elastic-batches): a batch with Spark's
//! dynamic allocation on is allocated its core gang whole, as any batch;
//! beyond it, Spark may want more executors. Each *extra* is one executor
//! part of the placed cluster's shape, in the cluster's zone, granted
//! alone after the queue had its pass and only from capacity the queue
//! does not need: no queued batch was left waiting for capacity of its GPU
//! type in its region. Extras are charged like any part (quota, the
//! fair-share order) and given back, newest first, when Spark wants fewer.
//! Per region, the operator bounds them by a share of the region's GPUs,
//! or turns them off. The types are `model.rs`'s (`Growth`,
//! `ElasticPolicy`, `ExtraChange`); what the core keeps of them,
//! `growth.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::capacity::{NodeId, PartNeed, Placement, plan_zone};
use super::core::Scheduler;
use super::model::{Allocation, BatchKey, ElasticPolicy, ElasticView, ExtraChange};
use crate::spec::PartRole;

impl Scheduler {
    /// Where elastic clusters may grow, and how far: the regions of
    /// `policies` (a region left out grants no extra; those held stay
    /// until Spark wants fewer or the cluster ends).
    pub fn set_elastic(&mut self, policies: HashMap<String, ElasticPolicy>) {
        self.elastic.policies = policies;
    }

    /// Spark of running cluster `key` wants `wanted` executors beyond its
    /// core at `now` (capped at its most): extras beyond that go back,
    /// newest first; more are granted by [`Scheduler::grow`]. (What the
    /// simulator replays: Spark gives back executors it no longer needs.)
    pub fn set_wanted(
        &mut self,
        key: BatchKey,
        wanted: u32,
        now: DateTime<Utc>,
    ) -> Vec<ExtraChange> {
        let mut out = Vec::new();
        self.set_demand(key, wanted);
        let keep = self.running.get(&key).and_then(|a| a.elastic.as_ref());
        let keep = keep.map_or(0, |g| g.wanted as usize);
        while let Some(last) = self
            .running
            .get(&key)
            .map(|a| a.extras().len())
            .filter(|n| *n > keep)
        {
            let Some((batch_id, placement, since)) = self.release_at(key, last - 1, now) else {
                break;
            };
            out.push(ExtraChange::Released {
                key,
                batch_id,
                placement,
                since,
            });
        }
        out
    }

    /// Spark of running cluster `key` wants `wanted` executors beyond its
    /// core (capped at its most). Nothing goes back here: on a server,
    /// Spark stops the executors it no longer needs, and each idle extra
    /// is given back by [`Scheduler::release_extra`]. Answers whether it
    /// now wants more than it holds (a pass may grant them).
    pub fn set_demand(&mut self, key: BatchKey, wanted: u32) -> bool {
        let Some(a) = self.running.get_mut(&key) else {
            return false;
        };
        let held = a.extras().len() as u32;
        let Some(growth) = a.elastic.as_mut() else {
            return false;
        };
        growth.wanted = wanted.min(growth.max);
        growth.wanted > held
    }

    /// How many extras the Spark of running elastic cluster `key` wants
    /// when it targets `executors` executors in all (its core's and the
    /// extras, capped at its most). None where `key` is not a running
    /// elastic cluster.
    pub fn extras_for_target(&self, key: BatchKey, executors: u32) -> Option<u32> {
        let a = self.running.get(&key)?;
        let growth = a.elastic.as_ref()?;
        let core = a
            .core_parts()
            .iter()
            .filter(|p| p.role == PartRole::Executor)
            .count() as u32;
        Some(executors.saturating_sub(core).min(growth.max))
    }

    /// What a running elastic cluster's page shows: None where `key` is
    /// not one.
    pub fn elastic_view(&self, key: BatchKey) -> Option<ElasticView> {
        let a = self.running.get(&key)?;
        let growth = a.elastic.as_ref()?;
        let extras = a.extras().len() as u32;
        let core = a
            .core_parts()
            .iter()
            .filter(|p| p.role == PartRole::Executor)
            .count() as u32;
        let blocked_by = (growth.wanted > extras).then(|| self.why_not_grown(a));
        Some(ElasticView {
            core,
            extras,
            wanted: growth.wanted,
            max: growth.max,
            blocked_by,
        })
    }

    /// Why a cluster that wants more extras holds no more: the first of
    /// the rules of [`Scheduler::grow`] that stops it.
    fn why_not_grown(&self, a: &Allocation) -> &'static str {
        let Some(growth) = a.elastic.as_ref() else {
            return "NOT_ELASTIC";
        };
        let Some(policy) = self.elastic.policies.get(&a.region) else {
            return "EXTRAS_OFF";
        };
        if self.claims.stopping_for(a.key).is_some() {
            return "STOPPING";
        }
        if self
            .ledger
            .shortfall(&a.project, &a.region, &growth.quota)
            .is_some()
        {
            return "QUOTA";
        }
        if self
            .elastic
            .is_waited_for(&a.region, growth.need.accelerator)
        {
            return "QUEUED_BATCHES";
        }
        let total: u64 = self
            .capacity
            .zones(&a.region)
            .flat_map(|z| self.capacity.zone_nodes(&a.region, z))
            .map(|n| n.spec.gpu_addresses.len() as u64)
            .sum();
        let most = (policy.max_share.clamp(0.0, 1.0) * total as f64).floor() as u64;
        if self.extra_gpus(&a.region) + u64::from(growth.need.gpus) > most {
            return "REGION_SHARE";
        }
        "CAPACITY"
    }

    /// Brings running cluster `key`'s extras in step with the store's
    /// (`stored`, in grant order) and Spark's demand, after another
    /// replica wrote them: each extra the core holds and the store no
    /// longer does goes back at `now`. Answers those.
    pub fn sync_extras(
        &mut self,
        key: BatchKey,
        stored: &[Placement],
        wanted: Option<u32>,
        now: DateTime<Utc>,
    ) -> Vec<ExtraChange> {
        if let Some(wanted) = wanted {
            self.set_demand(key, wanted);
        }
        let mut out = Vec::new();
        let mut left: Vec<&Placement> = stored.iter().collect();
        let held: Vec<Placement> = self
            .running
            .get(&key)
            .map(|a| a.extras().to_vec())
            .unwrap_or_default();
        let mut gone = Vec::new();
        for (i, p) in held.iter().enumerate() {
            match left
                .iter()
                .position(|s| s.node == p.node && s.gpus == p.gpus)
            {
                Some(at) => {
                    left.remove(at);
                }
                None => gone.push(i),
            }
        }
        for at in gone.into_iter().rev() {
            if let Some((batch_id, placement, since)) = self.release_at(key, at, now) {
                out.push(ExtraChange::Released {
                    key,
                    batch_id,
                    placement,
                    since,
                });
            }
        }
        out
    }

    /// Running cluster `key`'s extra on `node` holding `gpus` had no
    /// executor for a while: it goes back at `now`, and Spark is taken to
    /// want no more than it then holds (until its driver reports again,
    /// which keeps an unused worker from being granted again at once).
    /// None where `key` holds no such extra.
    pub fn release_extra(
        &mut self,
        key: BatchKey,
        node: &NodeId,
        gpus: &[String],
        now: DateTime<Utc>,
    ) -> Option<ExtraChange> {
        let a = self.running.get(&key)?;
        let at = a
            .extras()
            .iter()
            .rposition(|p| &p.node == node && p.gpus == gpus)?;
        let (batch_id, placement, since) = self.release_at(key, at, now)?;
        if let Some(a) = self.running.get_mut(&key) {
            let held = a.extras().len() as u32;
            if let Some(growth) = a.elastic.as_mut() {
                growth.wanted = growth.wanted.min(held);
            }
        }
        Some(ExtraChange::Released {
            key,
            batch_id,
            placement,
            since,
        })
    }

    /// Node `node` is lost at `now`: the extras on it of clusters whose
    /// core it does not hold go (answered by the next
    /// [`Scheduler::grow`]), and those clusters go on.
    pub(super) fn lose_extras_on(&mut self, node: &NodeId, now: DateTime<Utc>) {
        let keys: Vec<BatchKey> = self
            .running
            .values()
            .filter(|a| a.extras().iter().any(|p| &p.node == node))
            .filter(|a| !a.core_parts().iter().any(|p| &p.node == node))
            .map(|a| a.key)
            .collect();
        for key in keys {
            while let Some(at) = self
                .running
                .get(&key)
                .and_then(|a| a.extras().iter().rposition(|p| &p.node == node))
            {
                let Some((batch_id, placement, since)) = self.release_at(key, at, now) else {
                    break;
                };
                self.elastic.changes.push(ExtraChange::Lost {
                    key,
                    batch_id,
                    placement,
                    since,
                });
            }
        }
    }

    /// Gives back `key`'s extra number `at` (from 0, in grant order) at
    /// `now`: its capacity, quota and share.
    fn release_at(
        &mut self,
        key: BatchKey,
        at: usize,
        now: DateTime<Utc>,
    ) -> Option<(String, Placement, DateTime<Utc>)> {
        let a = self.running.get_mut(&key)?;
        let growth = a.elastic.as_mut()?;
        let index = growth.core + at;
        if index >= a.placements.len() {
            return None;
        }
        let quota = growth.quota.clone();
        let since = if at < growth.granted.len() {
            growth.granted.remove(at)
        } else {
            a.allocated_at
        };
        let placement = a.placements.remove(index);
        crate::spec::subtract_amounts(&mut a.quota, &quota);
        let (region, project, batch_id) = (a.region.clone(), a.project.clone(), a.batch_id.clone());
        self.capacity.give_back(std::slice::from_ref(&placement));
        self.ledger.refund(&project, &region, &quota);
        self.fair.release(
            &region,
            &project,
            std::slice::from_ref(&placement),
            since,
            now,
        );
        self.dirty.insert(region);
        Some((batch_id, placement, since))
    }

    /// A cluster that ends at `now` leaves the fair-share order's held
    /// GPUs: its core held since its allocation, each extra since its
    /// grant.
    pub(super) fn release_share(&mut self, a: &Allocation, now: DateTime<Utc>) {
        let core = a.elastic.as_ref().map_or(a.placements.len(), |g| g.core);
        let (gang, extras) = a.placements.split_at(core.min(a.placements.len()));
        self.fair
            .release(&a.region, &a.project, gang, a.allocated_at, now);
        let granted = a.elastic.iter().flat_map(|g| g.granted.iter());
        for (p, since) in extras.iter().zip(granted) {
            self.fair
                .release(&a.region, &a.project, std::slice::from_ref(p), *since, now);
        }
    }

    /// For a queued batch of `parts` blocked by capacity in `region`: the
    /// fewest extras of one zone, newest first, whose going back lets it
    /// fit there go back now (answered by the next [`Scheduler::grow`]).
    /// False, and nothing changed, where no zone's extras are enough.
    pub(super) fn reclaim_extras(
        &mut self,
        region: &str,
        parts: &[PartNeed],
        for_batch: &str,
        now: DateTime<Utc>,
    ) -> bool {
        if !self.elastic.running.contains_key(region) {
            return false;
        }
        let zones: Vec<String> = self.capacity.zones(region).map(str::to_string).collect();
        let mut best: Option<Vec<BatchKey>> = None;
        for zone in zones {
            // The zone's extras, newest first (each cluster's from its end).
            let mut extras: Vec<(DateTime<Utc>, usize, BatchKey, &Placement)> = Vec::new();
            for a in self.elastic_in(region) {
                if a.zone != zone || self.claims.stopping_for(a.key).is_some() {
                    continue;
                }
                let granted = a.elastic.iter().flat_map(|g| g.granted.iter());
                for (i, (p, at)) in a.extras().iter().zip(granted).enumerate() {
                    extras.push((*at, i, a.key, p));
                }
            }
            if extras.is_empty() {
                // (Nothing to take back here: no copy of the zone made.)
                continue;
            }
            extras.sort_by_key(|e| std::cmp::Reverse((e.0, e.1, e.2)));
            let mut scratch = self.capacity.zone(region, &zone);
            let mut taken = Vec::new();
            for (_, _, key, p) in extras {
                scratch.give_back(std::slice::from_ref(p));
                taken.push(key);
                if best.as_ref().is_some_and(|b| taken.len() >= b.len()) {
                    break;
                }
                if plan_zone(&scratch.zone_nodes(region, &zone), parts).complete() {
                    best = Some(std::mem::take(&mut taken));
                    break;
                }
            }
        }
        let Some(taken) = best else {
            return false;
        };
        for key in taken {
            self.take_back_newest(key, for_batch, now);
        }
        true
    }

    /// The newest extra of `key` goes back now for `for_batch` (answered
    /// by the next [`Scheduler::grow`]); false where it holds none.
    fn take_back_newest(&mut self, key: BatchKey, for_batch: &str, now: DateTime<Utc>) -> bool {
        let Some(newest) = self
            .running
            .get(&key)
            .and_then(|a| a.extras().len().checked_sub(1))
        else {
            return false;
        };
        let Some((batch_id, placement, since)) = self.release_at(key, newest, now) else {
            return false;
        };
        self.elastic.changes.push(ExtraChange::Reclaimed {
            key,
            batch_id,
            placement,
            since,
            for_batch: for_batch.to_string(),
        });
        true
    }

    /// Whether `a`'s extras go back before any core part of its zone is
    /// preempted or reclaimed for a batch of `priority`: it is elastic,
    /// of no higher priority, and not stopping already.
    pub(super) fn yields_extras(&self, a: &Allocation, priority: i32) -> bool {
        a.elastic.is_some() && a.priority <= priority && self.claims.stopping_for(a.key).is_none()
    }

    /// What victim `a` gives back beyond the zone's extras in a preemption
    /// for a batch of `priority`: its core where its extras yield (they
    /// are counted already), else all of it.
    pub(super) fn victim_parts<'x>(&self, a: &'x Allocation, priority: i32) -> &'x [Placement] {
        if self.yields_extras(a, priority) {
            a.core_parts()
        } else {
            &a.placements
        }
    }

    /// The extras of `zone` that go back before any core part there is
    /// preempted or reclaimed for a batch of `priority`
    /// ([`Scheduler::yields_extras`]).
    pub(super) fn zone_extras(&self, region: &str, zone: &str, priority: i32) -> Vec<&Placement> {
        self.elastic_in(region)
            .filter(|a| a.zone == zone && self.yields_extras(a, priority))
            .flat_map(Allocation::extras)
            .collect()
    }

    /// A preemption or reclaim for `for_batch` (of `priority`) in `zone`
    /// is carried out: every extra of the zone that yields to it, but
    /// the victims' (which go with their clusters), goes back now
    /// (answered by the next [`Scheduler::grow`]).
    pub(super) fn take_back_zone_extras(
        &mut self,
        (region, zone): (&str, &str),
        priority: i32,
        victims: &[BatchKey],
        for_batch: &str,
        now: DateTime<Utc>,
    ) {
        let keys: Vec<BatchKey> = self
            .elastic_in(region)
            .filter(|a| !victims.contains(&a.key))
            .filter(|a| a.zone == zone && self.yields_extras(a, priority))
            .map(|a| a.key)
            .collect();
        for key in keys {
            while self.take_back_newest(key, for_batch, now) {}
        }
    }

    /// After a pass: grants extras to the running elastic clusters that
    /// want more, one at a time in the fair-share order (then the oldest
    /// allocation first), each on a node of its cluster's zone, from what
    /// the queue left: never on capacity of a GPU type and region a queued
    /// batch waits for, within the project's quota and the region's share.
    pub fn grow(&mut self, now: DateTime<Utc>) -> Vec<ExtraChange> {
        let mut out = std::mem::take(&mut self.elastic.changes);
        let waited = self.elastic.waited();
        let regions: Vec<String> = self
            .elastic
            .running
            .keys()
            .filter(|r| self.elastic.policies.contains_key(*r))
            .filter(|r| !self.elastic.all_waited(r, &waited))
            .cloned()
            .collect();
        for region in regions {
            self.grow_region(&region, &waited, now, &mut out);
        }
        out
    }

    fn grow_region(
        &mut self,
        region: &str,
        waited: &HashSet<(String, Option<crate::spec::Accelerator>)>,
        now: DateTime<Utc>,
        out: &mut Vec<ExtraChange>,
    ) {
        let Some(policy) = self.elastic.policies.get(region).copied() else {
            return;
        };
        let total: u64 = self
            .capacity
            .zones(region)
            .flat_map(|z| self.capacity.zone_nodes(region, z))
            .map(|n| n.spec.gpu_addresses.len() as u64)
            .sum();
        let most = (policy.max_share.clamp(0.0, 1.0) * total as f64).floor() as u64;
        let mut held = self.extra_gpus(region);
        let wants_more = |a: &Allocation| {
            a.elastic
                .as_ref()
                .is_some_and(|g| (a.extras().len() as u32) < g.wanted)
        };
        // Clusters that want more and may still get it in this round (not
        // of a GPU type a queued batch waits for here), by project, each
        // project's oldest allocation first: the next is the first of the
        // project lowest in the fair-share order (its key changes with each
        // grant), so a grant costs the projects, not the clusters.
        let mut open: BTreeMap<String, BTreeSet<(DateTime<Utc>, BatchKey)>> = BTreeMap::new();
        for key in self.elastic.running.get(region).into_iter().flatten() {
            // A cluster stopping for a preemptor or its owners grows no more.
            if self.claims.stopping_for(*key).is_some() {
                continue;
            }
            let Some(a) = self.running.get(key).filter(|a| wants_more(a)) else {
                continue;
            };
            let need = a.elastic.as_ref().map(|g| g.need.accelerator);
            if need.is_some_and(|n| waited.contains(&(region.to_string(), n))) {
                continue;
            }
            open.entry(a.project.clone())
                .or_default()
                .insert((a.allocated_at, a.key));
        }
        while let Some((project, first)) = open
            .iter()
            .filter_map(|(p, clusters)| Some((p, *clusters.first()?)))
            .min_by_key(|(p, (at, key))| (self.fair_key(region, p, now), *at, *key))
            .map(|(p, first)| (p.clone(), first))
        {
            let (_, key) = first;
            let granted = self.grant_extra(key, most, held, now);
            let a = self.running.get(&key);
            let again = granted.is_some() && a.is_some_and(&wants_more);
            if !again && let Some(clusters) = open.get_mut(&project) {
                clusters.remove(&first);
                if clusters.is_empty() {
                    open.remove(&project);
                }
            }
            if let Some(placement) = granted {
                held += placement.gpus.len() as u64;
                out.push(ExtraChange::Granted {
                    key,
                    batch_id: a.map(|a| a.batch_id.clone()).unwrap_or_default(),
                    placement,
                });
            }
        }
    }

    /// One extra for `key`, when everything allows it: answers its part.
    fn grant_extra(
        &mut self,
        key: BatchKey,
        most: u64,
        held: u64,
        now: DateTime<Utc>,
    ) -> Option<Placement> {
        let a = self.running.get(&key)?;
        let growth = a.elastic.as_ref()?;
        let need = growth.need;
        // (What a queued batch waits for was left out of the round.)
        if held + u64::from(need.gpus) > most
            || self
                .ledger
                .shortfall(&a.project, &a.region, &growth.quota)
                .is_some()
        {
            return None;
        }
        let nodes = self.capacity.zone_nodes(&a.region, &a.zone);
        let plan = plan_zone(&nodes, std::slice::from_ref(&need));
        if !plan.complete() {
            return None;
        }
        let placement = plan.placements.into_iter().next()?;
        if !self.capacity.take(std::slice::from_ref(&placement)) {
            return None;
        }
        // Held now: a provisioned pool's node is idle no more.
        self.provisions.idle.end(&placement.node, now);
        let a = self.running.get_mut(&key)?;
        let growth = a.elastic.as_mut()?;
        growth.granted.push(now);
        let quota = growth.quota.clone();
        crate::spec::add_amounts(&mut a.quota, &quota);
        a.placements.push(placement.clone());
        let (region, project) = (a.region.clone(), a.project.clone());
        self.ledger.charge(&project, &region, &quota);
        self.fair
            .hold(&region, &project, std::slice::from_ref(&placement));
        Some(placement)
    }

    /// GPUs the extras of `region` hold.
    pub fn extra_gpus(&self, region: &str) -> u64 {
        self.elastic_in(region)
            .flat_map(Allocation::extras)
            .map(|p| p.gpus.len() as u64)
            .sum()
    }

    /// The running elastic clusters of `region`.
    fn elastic_in<'a>(&'a self, region: &str) -> impl Iterator<Item = &'a Allocation> + 'a {
        self.elastic
            .running
            .get(region)
            .into_iter()
            .flatten()
            .filter_map(|k| self.running.get(k))
    }
}
