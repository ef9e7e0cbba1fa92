//! Where a batch fits now and when it could start: the best zone for a
//! set of parts (the pass allocates there), and the start estimates the
//! views show (`estimate_in_order` behind the batches ahead of it,
//! `estimate_start` on running clusters' releases alone). Each replays
//! releases on a copy of the region's capacity; nothing here changes the
//! core.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use chrono::{DateTime, Duration, Utc};

use super::capacity::{Capacity, PartNeed, Placement, needs, plan_zone};
use super::core::Scheduler;
use super::model::{Allocation, BatchKey, PendingBatch, ShapeKey, shape_key};

impl Scheduler {
    /// The zone that fits every part with the least fragmentation left.
    pub(super) fn best_zone(
        &self,
        region: &str,
        parts: &[PartNeed],
    ) -> Option<(String, Vec<Placement>)> {
        best_zone_in(&self.capacity, region, parts)
    }

    /// When `batch` could start if the batches ahead of it (`ahead`, in
    /// the region's order) go first: running clusters end at their ttl;
    /// each batch ahead starts, in order, as soon as it fits (one whose
    /// project is short of quota now is left out) and runs to its ttl;
    /// `batch` starts at the first release after which it fits. None when
    /// it would wait on something without a ttl. An estimate: the order is
    /// taken as of now, and backfill is assumed wherever a batch fits.
    pub(super) fn estimate_in_order(
        &self,
        batch: &PendingBatch,
        ahead: &[BatchKey],
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let region = batch.region.as_str();
        let mut sim = self.capacity.region(region);
        let mut releases: BinaryHeap<Reverse<(DateTime<Utc>, usize)>> = BinaryHeap::new();
        let mut held: Vec<Vec<Placement>> = Vec::new();
        for a in self.running.values().filter(|a| a.region == region) {
            if let Some(end) = a.expected_end {
                releases.push(Reverse((end.max(now), held.len())));
                held.push(a.placements.clone());
            }
        }
        let mut waiting: Vec<&PendingBatch> = ahead
            .iter()
            .filter_map(|k| self.pending.get(k).map(Box::as_ref))
            .filter(|b| {
                self.hold_of(region, &b.project).is_none()
                    && self
                        .ledger
                        .shortfall(&b.project, region, &b.cluster.quota)
                        .is_none()
            })
            .collect();
        let mine = needs(&batch.cluster);
        let mut at = now;
        loop {
            // Whatever fits now starts, in order; a shape that did not fit
            // is not tried again until the next release.
            let mut failed: HashSet<ShapeKey> = HashSet::new();
            waiting.retain(|b| {
                let shape = shape_key(&b.cluster);
                if failed.contains(&shape) {
                    return true;
                }
                match best_zone_in(&sim, region, &needs(&b.cluster)) {
                    Some((_, placements)) if sim.take(&placements) => {
                        if let Some(ttl) = b.cluster.ttl_s {
                            releases
                                .push(Reverse((at + Duration::seconds(ttl as i64), held.len())));
                            held.push(placements);
                        }
                        false
                    }
                    _ => {
                        failed.insert(shape);
                        true
                    }
                }
            });
            if best_zone_in(&sim, region, &mine).is_some() {
                return Some(at);
            }
            let Reverse((next, first)) = releases.pop()?;
            at = next;
            sim.give_back(&held[first]);
            while let Some(Reverse((t, i))) = releases.peek().copied() {
                if t > at {
                    break;
                }
                releases.pop();
                sim.give_back(&held[i]);
            }
        }
    }

    /// When `parts` could start if running clusters end at their ttl:
    /// replays their releases in time order on a copy of the region.
    pub(super) fn estimate_start(&self, region: &str, parts: &[PartNeed]) -> Option<DateTime<Utc>> {
        let mut ends: Vec<&Allocation> = self
            .running
            .values()
            .filter(|a| a.region == region && a.expected_end.is_some())
            .collect();
        ends.sort_by_key(|a| (a.expected_end, a.key));
        let mut sim = self.capacity.region(region);
        for a in ends {
            sim.give_back(&a.placements);
            if sim
                .zones(region)
                .any(|z| plan_zone(&sim.zone_nodes(region, z), parts).complete())
            {
                return a.expected_end;
            }
        }
        None
    }
}

/// The zone of `region` in `capacity` that fits every part with the least
/// fragmentation left, and its placements.
fn best_zone_in(
    capacity: &Capacity,
    region: &str,
    parts: &[PartNeed],
) -> Option<(String, Vec<Placement>)> {
    capacity
        .zones(region)
        .filter_map(|z| {
            let plan = plan_zone(&capacity.zone_nodes(region, z), parts);
            plan.complete()
                .then(|| (plan.crumbs, z.to_string(), plan.placements))
        })
        .min_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)))
        .map(|(_, z, p)| (z, p))
}
