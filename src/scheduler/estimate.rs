//! Where a batch fits now and when it could start: the best zone for a
//! set of parts (the pass allocates there), and the start estimates the
//! views show (`estimate_in_order` behind the batches ahead of it,
//! `estimate_start` on running clusters' releases alone). Each replays
//! releases on a copy of the region's capacity; nothing here changes the
//! core.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::rc::Rc;

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
            if let Some(end) = self.gives_back_at(a) {
                releases.push(Reverse((end.max(now), held.len())));
                held.push(a.placements.clone());
            }
        }
        let mut waiting: Vec<&PendingBatch> = ahead
            .iter()
            .filter_map(|k| self.queue.get(*k))
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

    /// [`Self::estimate_in_order`] for every entry of `order` at once
    /// (the region's order from its head, or a prefix of it): entry `i`'s
    /// estimate is the one it gets with `order[..i]` ahead, exactly, at
    /// the cost of about one simulation instead of one per entry (a page
    /// of the queue's head asks for 50).
    ///
    /// Why one walk serves all: in the simulation for entry `i`, the
    /// entries after it do not exist, so its rounds are those of the
    /// simulation for `i − 1` until `i − 1` starts, where `i − 1` simply
    /// starts. Taking the entries in order, each is checked against the
    /// rounds kept so far (the state after the earlier entries' turns in
    /// that round); it starts in the first it fits, waits in those before
    /// (their replay gives it its turn), and the rounds after are dropped,
    /// to be replayed when needed; if it fits in none, it
    /// waits in every kept round and new rounds are played (the next
    /// releases, the waiting entries' turns in order) until it fits or no
    /// release is left. An entry held back, or whose project lacks the
    /// quota, is left out as the single estimate leaves it out of those
    /// ahead (its own answer is None here).
    pub(super) fn estimates_in_order(
        &self,
        region: &str,
        order: &[BatchKey],
        now: DateTime<Utc>,
    ) -> Vec<Option<DateTime<Utc>>> {
        let mut first = Round {
            at: now,
            sim: self.capacity.region(region),
            releases: BinaryHeap::new(),
            held: Vec::new(),
            waiting: Vec::new(),
            failed: HashSet::new(),
        };
        for a in self.running.values().filter(|a| a.region == region) {
            if let Some(end) = self.gives_back_at(a) {
                first
                    .releases
                    .push(Reverse((end.max(now), first.held.len())));
                first.held.push(Some(Rc::new(a.placements.clone())));
            }
        }
        let mut rounds = vec![first];
        let mut out = Vec::with_capacity(order.len());
        // Each entry's shape and parts, worked out once: `waiting` holds
        // indexes into this.
        let mut entries: Vec<Entry> = Vec::with_capacity(order.len());
        for key in order {
            let Some(b) = self.queue.get(*key).filter(|b| {
                self.hold_of(region, &b.project).is_none()
                    && self
                        .ledger
                        .shortfall(&b.project, region, &b.cluster.quota)
                        .is_none()
            }) else {
                out.push(None);
                continue;
            };
            let i = entries.len();
            entries.push(Entry {
                ttl_s: b.cluster.ttl_s,
                shape: shape_key(&b.cluster),
                parts: needs(&b.cluster),
            });
            let e = &entries[i];
            let kept = rounds.iter_mut().position(|r| r.try_start(region, e));
            if let Some(k) = kept {
                out.push(Some(rounds[k].at));
                rounds.truncate(k + 1);
                // It waited through the rounds before: if a later entry
                // starts in one of them, the rounds after are replayed, and
                // its turn with them.
                for r in &mut rounds[..k] {
                    r.waiting.push(i);
                }
                continue;
            }
            for r in &mut rounds {
                r.waiting.push(i);
            }
            // New rounds: the next releases, then the waiting entries'
            // turns in order; this entry is the last of them.
            let mut started = None;
            while let Some(mut next) = rounds.last().and_then(Round::next) {
                let fits = next.turns(region, &entries);
                rounds.push(next);
                if fits {
                    started = rounds.last().map(|r| r.at);
                    break;
                }
            }
            out.push(started);
        }
        out
    }

    /// When `parts` could start if running clusters end at their ttl (a
    /// loan once it may be reclaimed, [`Self::gives_back_at`]): replays
    /// their releases in time order on a copy of the region.
    pub(super) fn estimate_start(&self, region: &str, parts: &[PartNeed]) -> Option<DateTime<Utc>> {
        let mut ends: Vec<(DateTime<Utc>, &Allocation)> = self
            .running
            .values()
            .filter(|a| a.region == region)
            .filter_map(|a| Some((self.gives_back_at(a)?, a)))
            .collect();
        ends.sort_by_key(|(end, a)| (*end, a.key));
        let mut sim = self.capacity.region(region);
        for (end, a) in ends {
            sim.give_back(&a.placements);
            if sim
                .zones(region)
                .any(|z| plan_zone(&sim.zone_nodes(region, z), parts).complete())
            {
                return Some(end);
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

/// An entry of [`Scheduler::estimates_in_order`]'s walk: what a round
/// needs of its batch.
struct Entry {
    ttl_s: Option<u64>,
    shape: ShapeKey,
    parts: Vec<PartNeed>,
}

/// One round of [`Scheduler::estimates_in_order`]'s walk: the state of the
/// region's copy at `at`, after the turns of the entries taken so far.
#[derive(Clone)]
struct Round {
    at: DateTime<Utc>,
    sim: Capacity,
    /// When each held cluster is given back, by its index in `held`
    /// (shared between rounds; None once given back).
    releases: BinaryHeap<Reverse<(DateTime<Utc>, usize)>>,
    held: Vec<Option<Rc<Vec<Placement>>>>,
    /// The entries taken so far that have not started, in order (indexes
    /// into the walk's entries).
    waiting: Vec<usize>,
    /// Shapes that did not fit in this round: capacity only shrinks
    /// within a round, so they do not fit again in it.
    failed: HashSet<ShapeKey>,
}

impl Round {
    /// Starts entry `e` in this round if it fits: takes its placement
    /// and, with a ttl, its release.
    fn try_start(&mut self, region: &str, e: &Entry) -> bool {
        if self.failed.contains(&e.shape) {
            return false;
        }
        match best_zone_in(&self.sim, region, &e.parts) {
            Some((_, placements)) if self.sim.take(&placements) => {
                if let Some(ttl) = e.ttl_s {
                    self.releases.push(Reverse((
                        self.at + Duration::seconds(ttl as i64),
                        self.held.len(),
                    )));
                    self.held.push(Some(Rc::new(placements)));
                }
                true
            }
            _ => {
                self.failed.insert(e.shape);
                false
            }
        }
    }

    /// The round after this one: at the next release (and every one at
    /// the same time) given back; no turns taken yet. None when nothing
    /// is left to give back.
    fn next(&self) -> Option<Round> {
        let mut next = self.clone();
        let Reverse((at, first)) = next.releases.pop()?;
        next.at = at;
        next.failed.clear();
        let give = |next: &mut Round, i: usize| {
            if let Some(placements) = next.held[i].take() {
                next.sim.give_back(&placements);
            }
        };
        give(&mut next, first);
        while let Some(Reverse((t, i))) = next.releases.peek().copied() {
            if t > at {
                break;
            }
            next.releases.pop();
            give(&mut next, i);
        }
        Some(next)
    }

    /// The waiting entries' turns in order, the last one's included;
    /// answers whether the last one started.
    fn turns(&mut self, region: &str, entries: &[Entry]) -> bool {
        let waiting = std::mem::take(&mut self.waiting);
        let last = waiting.len().saturating_sub(1);
        let mut started_last = false;
        for (n, i) in waiting.into_iter().enumerate() {
            if !self.try_start(region, &entries[i]) {
                self.waiting.push(i);
            } else if n == last {
                started_last = true;
            }
        }
        started_last
    }
}
