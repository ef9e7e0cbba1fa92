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

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};

use super::capacity::{PartNeed, Placement, plan_zone};
use super::core::Scheduler;
use super::model::{Allocation, BatchKey, ElasticPolicy, ExtraChange};
use crate::spec::QuotaAmount;

impl Scheduler {
    /// Where elastic clusters may grow, and how far: the regions of
    /// `policies` (a region left out grants no extra; those held stay
    /// until Spark wants fewer or the cluster ends).
    pub fn set_elastic(&mut self, policies: HashMap<String, ElasticPolicy>) {
        self.elastic.policies = policies;
    }

    /// Spark of running cluster `key` wants `wanted` executors beyond its
    /// core at `now` (capped at its most): extras beyond that go back,
    /// newest first; more are granted by [`Scheduler::grow`].
    pub fn set_wanted(
        &mut self,
        key: BatchKey,
        wanted: u32,
        now: DateTime<Utc>,
    ) -> Vec<ExtraChange> {
        let mut out = Vec::new();
        let Some(growth) = self.running.get_mut(&key).and_then(|a| a.elastic.as_mut()) else {
            return out;
        };
        growth.wanted = wanted.min(growth.max);
        let keep = growth.wanted as usize;
        while self
            .running
            .get(&key)
            .is_some_and(|a| a.extras().len() > keep)
        {
            let Some((batch_id, placement, since)) = self.release_newest(key, now) else {
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

    /// Gives back `key`'s newest extra at `now`: its capacity, quota and
    /// share.
    fn release_newest(
        &mut self,
        key: BatchKey,
        now: DateTime<Utc>,
    ) -> Option<(String, Placement, DateTime<Utc>)> {
        let a = self.running.get_mut(&key)?;
        let growth = a.elastic.as_mut()?;
        if a.placements.len() <= growth.core {
            return None;
        }
        let quota = growth.quota.clone();
        let since = growth.granted.pop().unwrap_or(a.allocated_at);
        let placement = a.placements.pop()?;
        subtract(&mut a.quota, &quota);
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
        let Some(keys) = self.elastic.running.get(region) else {
            return false;
        };
        let zones: Vec<String> = self.capacity.zones(region).map(str::to_string).collect();
        let mut best: Option<Vec<BatchKey>> = None;
        for zone in zones {
            // The zone's extras, newest first (each cluster's from its end).
            let mut extras: Vec<(DateTime<Utc>, usize, BatchKey, &Placement)> = Vec::new();
            for a in keys.iter().filter_map(|k| self.running.get(k)) {
                if a.zone != zone || self.claims.stopping_for(a.key).is_some() {
                    continue;
                }
                let granted = a.elastic.iter().flat_map(|g| g.granted.iter());
                for (i, (p, at)) in a.extras().iter().zip(granted).enumerate() {
                    extras.push((*at, i, a.key, p));
                }
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
            if let Some((batch_id, placement, since)) = self.release_newest(key, now) {
                self.elastic.reclaimed.push(ExtraChange::Reclaimed {
                    key,
                    batch_id,
                    placement,
                    since,
                    for_batch: for_batch.to_string(),
                });
            }
        }
        true
    }

    /// After a pass: grants extras to the running elastic clusters that
    /// want more, one at a time in the fair-share order (then the oldest
    /// allocation first), each on a node of its cluster's zone, from what
    /// the queue left: never on capacity of a GPU type and region a queued
    /// batch waits for, within the project's quota and the region's share.
    pub fn grow(&mut self, now: DateTime<Utc>) -> Vec<ExtraChange> {
        let mut out = std::mem::take(&mut self.elastic.reclaimed);
        let regions: Vec<String> = self
            .elastic
            .running
            .keys()
            .filter(|r| self.elastic.policies.contains_key(*r))
            .cloned()
            .collect();
        for region in regions {
            self.grow_region(&region, now, &mut out);
        }
        out
    }

    fn grow_region(&mut self, region: &str, now: DateTime<Utc>, out: &mut Vec<ExtraChange>) {
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
        // Clusters that want more and may still get it in this round.
        let mut open: BTreeSet<BatchKey> = self
            .elastic
            .running
            .get(region)
            .into_iter()
            .flatten()
            .copied()
            // A cluster stopping for a preemptor or its owners grows no more.
            .filter(|k| self.claims.stopping_for(*k).is_none())
            .filter(|k| {
                self.running.get(k).is_some_and(|a| {
                    a.elastic
                        .as_ref()
                        .is_some_and(|g| (a.extras().len() as u32) < g.wanted)
                })
            })
            .collect();
        while !open.is_empty() {
            let Some(key) = open
                .iter()
                .filter_map(|k| self.running.get(k))
                .min_by_key(|a| {
                    (
                        self.fair_key(region, &a.project, now),
                        a.allocated_at,
                        a.key,
                    )
                })
                .map(|a| a.key)
            else {
                break;
            };
            match self.grant_extra(key, most, held, now) {
                Some(placement) => {
                    held += placement.gpus.len() as u64;
                    let a = self.running.get(&key);
                    let more = a.is_some_and(|a| {
                        a.elastic
                            .as_ref()
                            .is_some_and(|g| (a.extras().len() as u32) < g.wanted)
                    });
                    if !more {
                        open.remove(&key);
                    }
                    out.push(ExtraChange::Granted {
                        key,
                        batch_id: a.map(|a| a.batch_id.clone()).unwrap_or_default(),
                        placement,
                    });
                }
                None => {
                    open.remove(&key);
                }
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
        if held + u64::from(need.gpus) > most
            || self.elastic.is_waited_for(&a.region, need.accelerator)
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
        let a = self.running.get_mut(&key)?;
        let growth = a.elastic.as_mut()?;
        growth.granted.push(now);
        let quota = growth.quota.clone();
        add(&mut a.quota, &quota);
        a.placements.push(placement.clone());
        let (region, project) = (a.region.clone(), a.project.clone());
        self.ledger.charge(&project, &region, &quota);
        self.fair
            .hold(&region, &project, std::slice::from_ref(&placement));
        Some(placement)
    }

    /// GPUs the extras of `region` hold.
    pub fn extra_gpus(&self, region: &str) -> u64 {
        self.elastic
            .running
            .get(region)
            .into_iter()
            .flatten()
            .filter_map(|k| self.running.get(k))
            .flat_map(Allocation::extras)
            .map(|p| p.gpus.len() as u64)
            .sum()
    }
}

/// `amounts` += `more`, metric by metric.
fn add(amounts: &mut Vec<QuotaAmount>, more: &[QuotaAmount]) {
    for m in more {
        match amounts.iter_mut().find(|a| a.metric == m.metric) {
            Some(a) => a.amount += m.amount,
            None => amounts.push(*m),
        }
    }
    amounts.sort_by_key(|a| a.metric);
}

/// `amounts` -= `less`, metric by metric (a metric at 0 leaves).
fn subtract(amounts: &mut Vec<QuotaAmount>, less: &[QuotaAmount]) {
    for l in less {
        if let Some(a) = amounts.iter_mut().find(|a| a.metric == l.metric) {
            a.amount = a.amount.saturating_sub(l.amount);
        }
    }
    amounts.retain(|a| a.amount > 0);
}
