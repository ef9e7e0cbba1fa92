//! What a pass keeps while it walks one region's queue ([`Walk`]): the
//! shapes and alternative options found not to fit, the plans found to fit, and
//! the reservation of the first batch capacity blocks, with what the
//! reservation holds back.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use rustc_hash::{FxHashMap, FxHashSet};

use super::capacity::{PartNeed, Placement};
use super::core::Scheduler;
use super::growth::Waiting;
use super::model::{BatchKey, ShapeKey};

/// What a pass keeps while it walks one region's queue.
#[derive(Default)]
pub(super) struct Walk {
    /// The first batch blocked by capacity of each GPU type reserves what
    /// it waits for: later batches whose placements could serve it may
    /// start only if their ttl ends before its estimated start
    /// ([`Scheduler::delayed_holder`]). In the walk's order: the first is
    /// the first batch blocked at all.
    pub(super) reservations: Vec<Reservation>,
    /// Shapes that did not fit in this pass: free capacity only shrinks
    /// during a pass, so they cannot fit later in it either.
    pub(super) failed_shapes: HashSet<ShapeKey>,
    /// Shapes nothing more can be admitted of in this pass: failed, or
    /// held back with even their shortest ttl ending after the reservation.
    pub(super) exhausted: HashSet<ShapeKey>,
    /// Shapes that fit but were held back by the reservation, with their
    /// plan: valid until the next allocation takes capacity.
    pub(super) fitting: HashMap<ShapeKey, (String, Vec<Placement>)>,
    /// Alternatives (their region and shape) that cannot be allocated in this
    /// pass. Marked through [`Walk::alternative_fails`].
    pub(super) alternative_failed: AlternativeSet,
    /// How many of the alternative options ripe in the region have not failed,
    /// once counted: None until then, and again after an alternative fails or
    /// capacity is taken. At Some(0) no batch of the walk need look at its
    /// alternatives.
    pub(super) alternatives_open: Option<usize>,
    /// Alternatives found to fit the free capacity once every own shape was
    /// exhausted: valid until the next allocation takes capacity.
    pub(super) alternative_fits: AlternativeSet,
    /// A preemption was decided in this walk (one a region a pass).
    pub(super) preempted: bool,
    /// Batches whose loan was put off because a queued batch of the
    /// capacity's own GPU type fits it: tried again once the walk is over
    /// (`grant_deferred_loans`).
    pub(super) deferred_loans: Vec<BatchKey>,
    /// The walk is over: deferred loans take what the owners left.
    pub(super) owners_served: bool,
    /// Per GPU type a loan would take: what its owners (the queued
    /// batches whose own placement is of that type) make of the capacity
    /// now; valid until capacity is taken.
    pub(super) owners: FxHashMap<crate::spec::Accelerator, Owners>,
    /// The GPU types of the batches capacity blocked in this walk: the
    /// first of each type may reclaim loans of its own capacity, and
    /// holds its type's reservation.
    pub(super) blocked_types: HashSet<Option<crate::spec::Accelerator>>,
    /// What the walk left waiting for capacity: the GPU types of the
    /// region's own shapes that failed or were held back, and (region,
    /// type) of the alternatives that failed. No extra is granted on it.
    pub(super) waiting: Waiting,
}

/// A set of alternative options (a region and a shape), looked up without
/// allocating and with a fast hash: the walk asks it for every alternative of
/// every batch whose own shape failed.
#[derive(Default)]
pub(super) struct AlternativeSet(FxHashMap<String, FxHashSet<ShapeKey>>);

impl AlternativeSet {
    pub(super) fn contains(&self, region: &str, shape: &ShapeKey) -> bool {
        self.0.get(region).is_some_and(|s| s.contains(shape))
    }

    /// Adds an option; false when it was there already.
    pub(super) fn insert(&mut self, region: &str, shape: ShapeKey) -> bool {
        match self.0.get_mut(region) {
            Some(s) => s.insert(shape),
            None => {
                self.0
                    .insert(region.to_string(), FxHashSet::from_iter([shape]));
                true
            }
        }
    }

    pub(super) fn clear(&mut self) {
        self.0.values_mut().for_each(FxHashSet::clear);
    }
}

impl Walk {
    /// The alternative option (`region`, `shape`) cannot be allocated in this
    /// pass.
    pub(super) fn alternative_fails(&mut self, region: &str, shape: ShapeKey) {
        self.waiting.elsewhere(region, shape_accelerator(&shape));
        if self.alternative_failed.insert(region, shape) {
            self.alternatives_open = None;
        }
    }

    /// `shape` cannot be allocated in this pass.
    pub(super) fn shape_fails(&mut self, shape: ShapeKey) {
        self.waiting.here(shape_accelerator(&shape));
        self.failed_shapes.insert(shape);
        self.exhausted.insert(shape);
    }

    /// Capacity was taken: plans and fits found before no longer hold.
    pub(super) fn capacity_taken(&mut self) {
        self.fitting.clear();
        self.owners.clear();
        self.alternative_fits.clear();
        self.alternatives_open = None;
    }
}

/// The GPU type of a cluster of `shape`: its executors', else its
/// driver's.
pub(super) fn shape_accelerator(shape: &ShapeKey) -> Option<crate::spec::Accelerator> {
    shape.1.accelerator.or(shape.0.accelerator)
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Considered {
    Allocated,
    Passed,
}

/// What the owners of some capacity (the queued batches whose own
/// placement is on its GPU type) make of it: whether one fits it now, and
/// when the first of those that do not could start (None: none could, as
/// things stand).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Owners {
    pub(super) fits: bool,
    pub(super) start: Option<DateTime<Utc>>,
}

/// The first batch of a pass blocked by capacity, of its GPU type: what
/// it needs and, once computed, when it could start (None inside: never,
/// as things stand).
pub(super) struct Reservation {
    /// The holder's GPU type (its own cluster's).
    pub(super) accelerator: Option<crate::spec::Accelerator>,
    pub(super) needs: Vec<PartNeed>,
    pub(super) until: Option<Option<DateTime<Utc>>>,
}

impl Scheduler {
    /// When the reservation's holder could start (None: never, as things
    /// stand). The estimate is costly and rarely needed: computed once, on
    /// first need.
    pub(super) fn holder_start(&self, r: &mut Reservation, region: &str) -> Option<DateTime<Utc>> {
        *r.until
            .get_or_insert_with(|| self.estimate_start(region, &r.needs))
    }

    /// The reservation a cluster of GPU type `kind` on `placements` that
    /// ends at `ends` would delay, if any: one whose holder those
    /// placements could serve (a holder of the same type always) and that
    /// could start before the cluster ends. Answers the holder's estimated
    /// start (None inside: never).
    pub(super) fn delayed_holder(
        &self,
        walk: &mut Walk,
        region: &str,
        (kind, placements): (Option<crate::spec::Accelerator>, &[Placement]),
        ends: Option<DateTime<Utc>>,
    ) -> Option<Option<DateTime<Utc>>> {
        for r in &mut walk.reservations {
            if r.accelerator != kind && !self.could_serve(r, placements) {
                continue;
            }
            let until = self.holder_start(r, region);
            if delays_holder(until, ends) {
                return Some(until);
            }
        }
        None
    }

    /// What the owners of the capacity `placements` take in `region` (the
    /// queued batches whose own placement is on those GPU types) make of
    /// it now: whether one fits, and the earliest estimated start of those
    /// that do not.
    pub(super) fn owners_of(
        &self,
        walk: &mut Walk,
        region: &str,
        placements: &[Placement],
    ) -> Owners {
        // The GPUs lent: a part without GPUs (a CPU driver) on a GPU node
        // borrows no GPU type.
        let mut lent: Vec<crate::spec::Accelerator> = placements
            .iter()
            .filter(|p| !p.gpus.is_empty())
            .filter_map(|p| self.capacity.nodes.get(&p.node))
            .map(|n| n.spec.accelerator)
            .collect();
        lent.sort();
        lent.dedup();
        let mut all = Owners::default();
        for a in lent {
            let owners = match walk.owners.get(&a) {
                Some(o) => *o,
                None => {
                    let o = self.owners_of_type(region, a);
                    walk.owners.insert(a, o);
                    o
                }
            };
            all.fits |= owners.fits;
            all.start = [all.start, owners.start].into_iter().flatten().min();
        }
        all
    }

    fn owners_of_type(&self, region: &str, a: crate::spec::Accelerator) -> Owners {
        let mut owners = Owners::default();
        let Some(shapes) = self.queue.shapes(region) else {
            return owners;
        };
        for shape in shapes.keys() {
            let owned = shape.1.accelerator == Some(a)
                || (shape.1.accelerator.is_none() && shape.0.accelerator == Some(a));
            if !owned {
                continue;
            }
            let parts = needs_of(shape);
            if self.best_zone(region, &parts).is_some() {
                owners.fits = true;
            } else if let Some(start) = self.estimate_start(region, &parts) {
                owners.start = Some(owners.start.map_or(start, |s| s.min(start)));
            }
        }
        owners
    }

    /// Whether `placements` take capacity the reservation's holder could
    /// use: unless every part it needs has a GPU type and no placement is
    /// on a node of one of those types.
    pub(super) fn could_serve(&self, r: &Reservation, placements: &[Placement]) -> bool {
        if r.needs.iter().any(|n| n.accelerator.is_none()) {
            return true;
        }
        placements.iter().any(|p| {
            self.capacity.nodes.get(&p.node).is_none_or(|node| {
                r.needs
                    .iter()
                    .any(|n| n.accelerator == Some(node.spec.accelerator))
            })
        })
    }
}

/// The parts of a cluster of shape `key`, as [`needs`] gives them.
pub(super) fn needs_of(key: &ShapeKey) -> Vec<PartNeed> {
    let (driver, executor, count) = key;
    super::capacity::parts_of(*driver, *executor, *count)
}

/// Whether a cluster that ends at `ends` (None: no ttl) would delay a
/// holder that could start at `until` (None: never, so nothing delays it).
pub(super) fn delays_holder(until: Option<DateTime<Utc>>, ends: Option<DateTime<Utc>>) -> bool {
    match (until, ends) {
        (Some(u), Some(e)) => e > u,
        (Some(_), None) => true,
        (None, _) => false,
    }
}
