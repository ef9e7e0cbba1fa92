//! The pass: what the scheduler core decides at `now`. It fails the
//! clusters of nodes whose lease lapsed, expires batches past their
//! deadline (saying what was missing), then walks each dirty region's queue
//! in strict or fair-share order, allocating what fits, rejecting what
//! default mode cannot wait for, and holding back what would delay the
//! first batch blocked by capacity (its reservation).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::Bound;

use chrono::{DateTime, Duration, Utc};
use rustc_hash::{FxHashMap, FxHashSet};

use super::capacity::{PartNeed, Placement, needs};
use super::core::Scheduler;
use super::fairshare::Order;
use super::model::{
    Allocation, BatchKey, Decision, OnRung, PendingBatch, ShapeKey, accelerator_label, shape_key,
    shape_text,
};
use super::queue::QueueKey;
use super::rungs::ripe_at;
use crate::api::EndReason;
use crate::spec::{ClusterRequest, ProvisioningMode};

/// What a pass keeps while it walks one region's queue.
#[derive(Default)]
struct Walk {
    /// The first batch blocked by capacity reserves it: later batches may
    /// start only if their ttl ends before its estimated start.
    reservation: Option<Reservation>,
    /// Shapes that did not fit in this pass: free capacity only shrinks
    /// during a pass, so they cannot fit later in it either.
    failed_shapes: HashSet<ShapeKey>,
    /// Shapes nothing more can be admitted of in this pass: failed, or
    /// held back with even their shortest ttl ending after the reservation.
    exhausted: HashSet<ShapeKey>,
    /// Shapes that fit but were held back by the reservation, with their
    /// plan: valid until the next allocation takes capacity.
    fitting: HashMap<ShapeKey, (String, Vec<Placement>)>,
    /// Rungs (their region and shape) that cannot be allocated in this
    /// pass. Marked through [`Walk::rung_fails`].
    rung_failed: RungSet,
    /// How many of the rung options ripe in the region have not failed,
    /// once counted: None until then, and again after a rung fails or
    /// capacity is taken. At Some(0) no batch of the walk need look at its
    /// rungs.
    rungs_open: Option<usize>,
    /// Rungs found to fit the free capacity once every own shape was
    /// exhausted: valid until the next allocation takes capacity.
    rung_fits: RungSet,
    /// A preemption was decided in this walk (one a region a pass).
    preempted: bool,
}

/// A set of rung options (a region and a shape), looked up without
/// allocating and with a fast hash: the walk asks it for every rung of
/// every batch whose own shape failed.
#[derive(Default)]
struct RungSet(FxHashMap<String, FxHashSet<ShapeKey>>);

impl RungSet {
    fn contains(&self, region: &str, shape: &ShapeKey) -> bool {
        self.0.get(region).is_some_and(|s| s.contains(shape))
    }

    /// Adds an option; false when it was there already.
    fn insert(&mut self, region: &str, shape: ShapeKey) -> bool {
        match self.0.get_mut(region) {
            Some(s) => s.insert(shape),
            None => {
                self.0
                    .insert(region.to_string(), FxHashSet::from_iter([shape]));
                true
            }
        }
    }

    fn clear(&mut self) {
        self.0.values_mut().for_each(FxHashSet::clear);
    }
}

impl Walk {
    /// The rung option (`region`, `shape`) cannot be allocated in this
    /// pass.
    fn rung_fails(&mut self, region: &str, shape: ShapeKey) {
        if self.rung_failed.insert(region, shape) {
            self.rungs_open = None;
        }
    }

    /// Capacity was taken: plans and fits found before no longer hold.
    fn capacity_taken(&mut self) {
        self.fitting.clear();
        self.rung_fits.clear();
        self.rungs_open = None;
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Considered {
    Allocated,
    Passed,
}

/// The first batch of a pass blocked by capacity: what it needs and, once
/// computed, when it could start (None inside: never, as things stand).
struct Reservation {
    needs: Vec<PartNeed>,
    until: Option<Option<DateTime<Utc>>>,
}

impl Scheduler {
    /// Expires what is due, then admits what fits, region by region, and
    /// applies every decision to its own state.
    pub fn pass(&mut self, now: DateTime<Utc>) -> Vec<Decision> {
        let mut decisions = Vec::new();
        // Lost nodes first: their capacity must not be handed out again,
        // and the clusters that used them fail whole.
        for (node, epoch, expired_at) in self.leases.lapsed(now) {
            let failed = self.remove_node(&node);
            let failed_ids = failed
                .iter()
                .filter_map(|k| self.running.get(k).map(|a| a.batch_id.clone()))
                .collect();
            let released = failed
                .iter()
                .filter_map(|key| self.forget(*key, now))
                .collect();
            let message = format!(
                "Node {node} was lost: its agent stopped heartbeating and its lease expired at {}; the batch's cluster was released.",
                expired_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            );
            decisions.push(Decision::LoseNode {
                node,
                epoch: Some(epoch),
                failed,
                failed_ids,
                message,
                released,
            });
        }
        // Expiry next: a batch past its deadline is never allocated. What
        // was missing is the same for batches of one project, region and shape.
        let mut missing: HashMap<(String, String, ShapeKey), String> = HashMap::new();
        while let Some((deadline, key)) = self.queue.first_deadline() {
            if deadline > now {
                break;
            }
            let message = self.expiry_message(key, now, &mut missing);
            let (batch_id, region, accelerator) = self
                .queue
                .get(key)
                .map(|b| {
                    (
                        b.batch_id.clone(),
                        b.region.clone(),
                        accelerator_label(&b.cluster),
                    )
                })
                .unwrap_or_default();
            self.forget(key, now);
            decisions.push(Decision::Expire {
                key,
                batch_id,
                message,
                region,
                accelerator,
            });
        }
        self.fair.prune(now);
        let ripe = self.queue.ripen(now);
        self.dirty.extend(ripe);
        let due = self.claims.due_retries(now);
        self.dirty.extend(due);
        let regions = self.regions_to_scan();
        for region in regions {
            self.admit_region(&region, now, &mut decisions);
        }
        decisions
    }

    fn admit_region(&mut self, region: &str, now: DateTime<Utc>, out: &mut Vec<Decision>) {
        self.settle_claims(region, now, out);
        if self.holds.get(region).is_some_and(|h| h.all.is_some()) {
            return;
        }
        match self.fair.order() {
            Order::Strict => self.admit_strict(region, now, out),
            Order::FairShare => self.admit_fair(region, now, out),
        }
    }

    /// The preemptors of `region` whose victims are all gone are allocated
    /// on their plans, from what was set aside for them (a preemption
    /// decided goes through even if a queue was held since); a claim
    /// rebuilt after a restart has no plan and takes the best zone now.
    /// One whose plan no longer fits (a node left) or whose project no
    /// longer has the quota waits in the queue as any other; what was set
    /// aside returns to the capacity.
    fn settle_claims(&mut self, region: &str, now: DateTime<Utc>, out: &mut Vec<Decision>) {
        for (key, claim) in self.ready_claims(region) {
            let Some(batch) = self.queue.get(key).cloned() else {
                continue;
            };
            // A queue held while the victims stopped waits like any held
            // queue, reserving nothing: what was set aside goes back.
            if self.hold_of(region, &batch.project).is_some()
                || self
                    .ledger
                    .shortfall(&batch.project, region, &batch.cluster.quota)
                    .is_some()
            {
                continue;
            }
            // A node cordoned (or retired) since the plan was made takes no
            // new work: the preemptor is placed again on what is there.
            let planned = claim
                .plan
                .iter()
                .all(|p| !self.capacity.is_unschedulable(&p.node))
                .then(|| claim.plan.first())
                .flatten()
                .and_then(|p| self.capacity.nodes.get(&p.node))
                .map(|n| (n.spec.zone.clone(), claim.plan.clone()));
            let plan = match planned {
                Some(plan) if self.capacity.take(&plan.1) => Some(plan),
                _ => match self.best_zone(region, &needs(&batch.cluster)) {
                    Some(plan) if self.capacity.take(&plan.1) => Some(plan),
                    _ => None,
                },
            };
            if let Some(plan) = plan {
                let own = (region, &batch.cluster);
                out.push(self.grant(&batch, own, plan, None, now));
            }
        }
    }

    /// Strict order: the region's queue by priority, then age.
    fn admit_strict(&mut self, region: &str, now: DateTime<Utc>, out: &mut Vec<Decision>) {
        // The queue is walked in chunks from a cursor rather than copied
        // whole: a pass usually stops after a few entries, and the queue
        // may hold a million.
        const CHUNK: usize = 256;
        let mut cursor: Option<QueueKey> = None;
        let mut buffer = Vec::new().into_iter();
        let mut walk = Walk::default();
        loop {
            let queued = match buffer.next() {
                Some(k) => k,
                None => {
                    let Some(queue) = self.queue.region(region) else {
                        break;
                    };
                    let chunk: Vec<QueueKey> = match cursor {
                        None => queue.iter().take(CHUNK).copied().collect(),
                        Some(c) => queue
                            .range((Bound::Excluded(c), Bound::Unbounded))
                            .take(CHUNK)
                            .copied()
                            .collect(),
                    };
                    buffer = chunk.into_iter();
                    match buffer.next() {
                        Some(k) => k,
                        None => break,
                    }
                }
            };
            cursor = Some(queued);
            if self.nothing_more(region, &mut walk) {
                break;
            }
            self.consider(queued.1, region, now, &mut walk, out);
        }
    }

    /// Fair-share order: the project with the lowest usage ÷ weight first,
    /// its batches by priority, then age. An allocation raises its
    /// project's usage at once, so the order is taken again after each.
    fn admit_fair(&mut self, region: &str, now: DateTime<Utc>, out: &mut Vec<Decision>) {
        let Some(projects) = self.queue.projects_in(region) else {
            return;
        };
        let mut order: BTreeSet<(u64, String)> = projects
            .keys()
            .filter(|p| self.hold_of(region, p).is_none())
            .map(|p| (self.fair_key(region, p, now), p.clone()))
            .collect();
        // Where each project's walk stands: its batches before it were
        // considered in this pass.
        let mut cursors: HashMap<String, QueueKey> = HashMap::new();
        let mut walk = Walk::default();
        while let Some((share, project)) = order.first().cloned() {
            let next = self.queue.project_queue(region, &project).and_then(|q| {
                match cursors.get(&project) {
                    None => q.first().copied(),
                    Some(c) => q
                        .range((Bound::Excluded(*c), Bound::Unbounded))
                        .next()
                        .copied(),
                }
            });
            let Some(queued) = next else {
                order.pop_first();
                continue;
            };
            cursors.insert(project.clone(), queued);
            if self.nothing_more(region, &mut walk) {
                break;
            }
            if self.consider(queued.1, region, now, &mut walk, out) == Considered::Allocated {
                order.remove(&(share, project.clone()));
                order.insert((self.fair_key(region, &project, now), project));
            }
        }
    }

    /// Whether nothing more can be admitted in this pass: every shape still
    /// queued in the region either does not fit or cannot end before the
    /// reservation, and no default-mode batch awaits its verdict.
    fn nothing_more(&self, region: &str, walk: &mut Walk) -> bool {
        let distinct = self.queue.shapes(region).map_or(0, HashMap::len);
        let defaults = self.queue.defaults(region);
        if defaults > 0 || walk.exhausted.len() < distinct {
            return false;
        }
        // A batch whose own shape failed may still fit on a rung, unless
        // every rung ripe in the region fails.
        if self.rungs_open(region, walk) > 0 {
            return false;
        }
        // Counted against the shapes still queued: a rejected batch may
        // have been a shape's last.
        let present = self.queue.shapes(region).map_or(0, |m| {
            walk.exhausted.iter().filter(|s| m.contains_key(*s)).count()
        });
        present >= distinct
    }

    /// How many rung options ripe in `region` may still be allocated in
    /// this pass (counted once, then again only after a rung fails or
    /// capacity is taken). Each option not decided yet is checked against
    /// the free capacity: one whose whole cluster no zone of its region
    /// has room for now (capacity only shrinks during a pass), or in
    /// another region whose queue is not empty, fails for every batch, as
    /// `try_rungs` would find; it is marked so here, once, rather than
    /// waiting for a batch of its shape to come by in the walk.
    fn rungs_open(&self, region: &str, walk: &mut Walk) -> usize {
        if let Some(open) = walk.rungs_open {
            return open;
        }
        let Some(options) = self.queue.rungs().options(region) else {
            walk.rungs_open = Some(0);
            return 0;
        };
        for (rung_region, shape) in options.keys() {
            if walk.rung_failed.contains(rung_region, shape)
                || walk.rung_fits.contains(rung_region, shape)
            {
                continue;
            }
            let blocked = rung_region != region && self.queue.has_queued(rung_region);
            if blocked || self.best_zone(rung_region, &needs_of(shape)).is_none() {
                walk.rung_failed.insert(rung_region, *shape);
            } else {
                walk.rung_fits.insert(rung_region, *shape);
            }
        }
        let open = options
            .keys()
            .filter(|(r, shape)| !walk.rung_failed.contains(r, shape))
            .count();
        walk.rungs_open = Some(open);
        open
    }

    /// One queued batch in a pass's walk: allocated, rejected (default
    /// mode), held back by the reservation, or left to wait.
    fn consider(
        &mut self,
        key: BatchKey,
        region: &str,
        now: DateTime<Utc>,
        walk: &mut Walk,
        out: &mut Vec<Decision>,
    ) -> Considered {
        let Some(batch) = self.queue.get(key) else {
            return Considered::Passed;
        };
        // A held queue's batches wait, reserving nothing; a preemptor
        // waits for its victims, on what is set aside for it.
        if self.hold_of(region, &batch.project).is_some() || self.claims.is_claiming(key) {
            return Considered::Passed;
        }
        let default_mode = batch.cluster.mode == ProvisioningMode::Default;
        if let Some(short) = self
            .ledger
            .shortfall(&batch.project, region, &batch.cluster.quota)
        {
            if default_mode {
                let message = format!(
                    "RESOURCE_EXHAUSTED: quota {} exceeded in {region}: limit {}, usage {}, asked {}",
                    short.metric, short.limit, short.usage, short.needed
                );
                let batch_id = batch.batch_id.clone();
                self.forget(key, now);
                out.push(Decision::Reject {
                    key,
                    batch_id,
                    message,
                    reason: EndReason::Quota,
                });
                return Considered::Passed;
            }
            return self.try_rungs(key, region, now, walk, out);
        }
        let shape = shape_key(&batch.cluster);
        let ends = batch.cluster.ends(now);
        let plan = if walk.failed_shapes.contains(&shape) {
            None
        } else if let Some(plan) = walk.fitting.get(&shape) {
            Some(plan.clone())
        } else {
            self.best_zone(region, &needs(&batch.cluster))
        };
        match plan {
            Some((zone, placements)) => {
                walk.fitting
                    .insert(shape, (zone.clone(), placements.clone()));
                // Under a reservation, a batch that fits may start only
                // if its ttl ends before the holder's estimated start.
                if let Some(r) = walk.reservation.as_mut() {
                    if !default_mode {
                        let until = self.holder_start(r, region);
                        if delays_holder(until, ends) {
                            self.queue.set_held_back(key, true);
                            let shortest = self
                                .queue
                                .shapes(region)
                                .and_then(|m| m.get(&shape))
                                .and_then(|st| st.ttls.keys().next().copied());
                            let none_can = match (until, shortest) {
                                (Some(u), Some(t)) if t != u64::MAX => {
                                    now + Duration::seconds(t as i64) > u
                                }
                                (Some(_), _) => true,
                                (None, _) => false,
                            };
                            if none_can {
                                walk.exhausted.insert(shape);
                            }
                            return Considered::Passed;
                        }
                    }
                }
                self.queue.set_held_back(key, false);
                let batch = self.queue.get(key).cloned();
                let Some(batch) = batch else {
                    return Considered::Passed;
                };
                // Capacity changes now: plans made before no longer hold.
                walk.capacity_taken();
                if !self.capacity.take(&placements) {
                    walk.failed_shapes.insert(shape);
                    walk.exhausted.insert(shape);
                    return Considered::Passed;
                }
                let own = (region, &batch.cluster);
                out.push(self.grant(&batch, own, (zone, placements), None, now));
                return Considered::Allocated;
            }
            None => {
                walk.failed_shapes.insert(shape);
                walk.exhausted.insert(shape);
                if default_mode {
                    let message = format!(
                        "RESOURCE_EXHAUSTED: ZONE_RESOURCE_POOL_EXHAUSTED: no zone of {region} has capacity for {} now; try queue mode (runtime 3.0+), another region or another GPU type",
                        shape_text(&batch.cluster)
                    );
                    let batch_id = batch.batch_id.clone();
                    self.forget(key, now);
                    out.push(Decision::Reject {
                        key,
                        batch_id,
                        message,
                        reason: EndReason::StockOut,
                    });
                } else {
                    if self.try_rungs(key, region, now, walk, out) == Considered::Allocated {
                        return Considered::Allocated;
                    }
                    if walk.reservation.is_none() && !walk.preempted {
                        // The first batch capacity blocks may preempt.
                        let planned = self
                            .queue
                            .get(key)
                            .and_then(|b| self.plan_preemption(b, now));
                        if let Some((preemption, plan)) = planned {
                            walk.preempted = true;
                            walk.capacity_taken();
                            self.preempt(preemption, plan, out);
                            return Considered::Passed;
                        }
                        let matures = self
                            .queue
                            .get(key)
                            .and_then(|b| self.next_victim_matures(b, now));
                        if let Some(at) = matures {
                            self.claims.retry_at(at, region);
                        }
                    }
                    if walk.reservation.is_none() {
                        walk.reservation = self.queue.get(key).map(|b| Reservation {
                            needs: needs(&b.cluster),
                            until: None,
                        });
                    }
                }
            }
        }
        Considered::Passed
    }

    /// A queued batch whose own placement cannot be allocated now tries
    /// the rungs whose delay has passed, in their order, at its own place
    /// in the walk (a rung never jumps the queue): the first whose quota
    /// and capacity take the whole cluster, in one zone, is allocated. A
    /// rung in the batch's region also yields to the reservation of an
    /// earlier blocked batch; a rung in another region only takes capacity
    /// that region's own queue leaves (its queue is empty).
    fn try_rungs(
        &mut self,
        key: BatchKey,
        region: &str,
        now: DateTime<Utc>,
        walk: &mut Walk,
        out: &mut Vec<Decision>,
    ) -> Considered {
        let Some(batch) = self.queue.get(key) else {
            return Considered::Passed;
        };
        // Nothing to look at when the batch has no rung, or when every
        // rung ripe in the region fails in this pass: counted once (and
        // again after capacity is taken), so that a walk past many
        // batches whose rungs all fail touches none of their rungs.
        if batch.cluster.alternatives.is_empty() {
            return Considered::Passed;
        }
        if self.rungs_open(region, walk) == 0 {
            return Considered::Passed;
        }
        let Some(batch) = self.queue.get(key) else {
            return Considered::Passed;
        };
        let ends = batch.cluster.ends(now);
        let mut chosen = None;
        for rung in &batch.cluster.alternatives {
            if ripe_at(batch.queued_at, rung) > now {
                continue;
            }
            let shape = shape_key(&rung.cluster);
            if walk.rung_failed.contains(&rung.region, &shape) {
                continue;
            }
            if rung.region != region && self.queue.has_queued(&rung.region) {
                walk.rung_fails(&rung.region, shape);
                continue;
            }
            if self
                .ledger
                .shortfall(&batch.project, &rung.region, &rung.cluster.quota)
                .is_some()
            {
                continue;
            }
            let Some(plan) = self.best_zone(&rung.region, &needs(&rung.cluster)) else {
                walk.rung_fails(&rung.region, shape);
                continue;
            };
            // The reservation holds back only what could serve its
            // holder: a rung on GPUs of another type than every part the
            // holder needs does not delay it.
            if rung.region == region && self.could_serve(walk.reservation.as_ref(), &plan.1) {
                if let Some(r) = walk.reservation.as_mut() {
                    if delays_holder(self.holder_start(r, region), ends) {
                        walk.rung_fails(&rung.region, shape);
                        continue;
                    }
                }
            }
            chosen = Some((rung.clone(), plan));
            break;
        }
        let Some((rung, (zone, placements))) = chosen else {
            return Considered::Passed;
        };
        let Some(batch) = self.queue.get(key).cloned() else {
            return Considered::Passed;
        };
        walk.capacity_taken();
        if !self.capacity.take(&placements) {
            walk.rung_fails(&rung.region, shape_key(&rung.cluster));
            return Considered::Passed;
        }
        let blockers = self.blockers(&batch);
        let note = if blockers.is_empty() {
            "its own placement was held for earlier batches".to_string()
        } else {
            blockers
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        };
        let on = OnRung {
            index: rung.index,
            asked: accelerator_label(&batch.cluster),
            note,
        };
        let placed = (rung.region.as_str(), &rung.cluster);
        out.push(self.grant(&batch, placed, (zone, placements), Some(on), now));
        Considered::Allocated
    }

    /// Gives `batch` the cluster `placed` (a region and the cluster it
    /// holds there: its own, or a rung's) on `plan` (its zone and
    /// placements, already taken from the capacity): it leaves the queue,
    /// its quota is charged and its GPUs count in the fair-share order.
    fn grant(
        &mut self,
        batch: &PendingBatch,
        placed: (&str, &ClusterRequest),
        plan: (String, Vec<Placement>),
        rung: Option<OnRung>,
        now: DateTime<Utc>,
    ) -> Decision {
        let (region, cluster) = placed;
        let (zone, placements) = plan;
        self.forget(batch.key, now);
        self.ledger.charge(&batch.project, region, &cluster.quota);
        let alloc = Allocation {
            priority: batch.priority,
            preemptible: batch.cluster.preemptible,
            preemptions: batch.preemptions,
            key: batch.key,
            batch_id: batch.batch_id.clone(),
            project: batch.project.clone(),
            region: region.to_string(),
            zone,
            placements,
            quota: cluster.quota.clone(),
            allocated_at: now,
            expected_end: cluster.ends(now),
            queued_at: batch.queued_at,
            accelerator: accelerator_label(cluster),
            rung,
        };
        self.fair.hold(region, &batch.project, &alloc.placements);
        self.running.insert(batch.key, alloc.clone());
        Decision::Allocate(alloc)
    }

    /// When the reservation's holder could start (None: never, as things
    /// stand). The estimate is costly and rarely needed: computed once, on
    /// first need.
    fn holder_start(&self, r: &mut Reservation, region: &str) -> Option<DateTime<Utc>> {
        *r.until
            .get_or_insert_with(|| self.estimate_start(region, &r.needs))
    }

    /// Whether `placements` take capacity the reservation's holder could
    /// use: unless every part it needs has a GPU type and no placement is
    /// on a node of one of those types.
    fn could_serve(&self, reservation: Option<&Reservation>, placements: &[Placement]) -> bool {
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

    fn expiry_message(
        &self,
        key: BatchKey,
        now: DateTime<Utc>,
        cache: &mut HashMap<(String, String, ShapeKey), String>,
    ) -> String {
        let Some(batch) = self.queue.get(key) else {
            return "allocation timeout passed".into();
        };
        let cache_key = (
            batch.project.clone(),
            batch.region.clone(),
            shape_key(&batch.cluster),
        );
        let missing = cache
            .entry(cache_key)
            .or_insert_with(|| {
                let reasons = self.blockers(batch);
                if reasons.is_empty() {
                    "capacity was reserved for earlier batches of the queue".to_string()
                } else {
                    reasons
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                }
            })
            .clone();
        let waited = (now - batch.queued_at).num_seconds();
        format!(
            "Batch could not be allocated within its allocation timeout of {}s (waited {waited}s): {missing}.",
            batch.cluster.allocation_timeout_s
        )
    }
}

/// The parts of a cluster of shape `key`, as [`needs`] gives them.
fn needs_of(key: &ShapeKey) -> Vec<PartNeed> {
    let (driver, executor, count) = key;
    super::capacity::parts_of(*driver, *executor, *count)
}

/// Whether a cluster that ends at `ends` (None: no ttl) would delay a
/// holder that could start at `until` (None: never, so nothing delays it).
fn delays_holder(until: Option<DateTime<Utc>>, ends: Option<DateTime<Utc>>) -> bool {
    match (until, ends) {
        (Some(u), Some(e)) => e > u,
        (Some(_), None) => true,
        (None, _) => false,
    }
}
