//! What a pass keeps while it walks one region's queue ([`Walk`]): the
//! shapes and alternative options found not to fit, the plans found to fit, and
//! the reservation of the first batch capacity blocks, with what the
//! reservation holds back.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use rustc_hash::{FxHashMap, FxHashSet};

use super::capacity::{PartNeed, Placement};
use super::core::Scheduler;
use super::model::ShapeKey;

/// What a pass keeps while it walks one region's queue.
#[derive(Default)]
pub(super) struct Walk {
    /// The first batch blocked by capacity reserves it: later batches may
    /// start only if their ttl ends before its estimated start.
    pub(super) reservation: Option<Reservation>,
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
    /// The GPU types of the batches capacity blocked in this walk: the
    /// first of each type may reclaim loans of its own capacity.
    pub(super) blocked_types: HashSet<Option<crate::spec::Accelerator>>,
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
        if self.alternative_failed.insert(region, shape) {
            self.alternatives_open = None;
        }
    }

    /// `shape` cannot be allocated in this pass.
    pub(super) fn shape_fails(&mut self, shape: ShapeKey) {
        self.failed_shapes.insert(shape);
        self.exhausted.insert(shape);
    }

    /// Capacity was taken: plans and fits found before no longer hold.
    pub(super) fn capacity_taken(&mut self) {
        self.fitting.clear();
        self.alternative_fits.clear();
        self.alternatives_open = None;
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Considered {
    Allocated,
    Passed,
}

/// The first batch of a pass blocked by capacity: what it needs and, once
/// computed, when it could start (None inside: never, as things stand).
pub(super) struct Reservation {
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

    /// Whether `placements` take capacity the reservation's holder could
    /// use: unless every part it needs has a GPU type and no placement is
    /// on a node of one of those types.
    pub(super) fn could_serve(
        &self,
        reservation: Option<&Reservation>,
        placements: &[Placement],
    ) -> bool {
        let Some(r) = reservation else {
            return false;
        };
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
