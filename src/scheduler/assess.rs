//! One queued batch in a pass's walk: what the pass makes of it
//! ([`Assessment`], judged without changing anything but the walk's
//! caches) and what is then done — allocated on its own placement or on a
//! alternative, rejected (default mode), held back by the reservation, or left to
//! wait, preempting or reserving.

use chrono::{DateTime, Duration, Utc};

use super::alternatives::ripe_at;
use super::capacity::{Placement, needs};
use super::core::Scheduler;
use super::model::{
    Allocation, BatchKey, Decision, OnAlternative, PendingBatch, ShapeKey, accelerator_label,
    shape_key, shape_text,
};
use super::walk::{Considered, Reservation, Walk, delays_holder, shape_accelerator};
use crate::api::EndReason;
use crate::spec::{Alternative, ClusterRequest, ProvisioningMode};

/// What a pass makes of one queued batch ([`Scheduler::assess`]), before
/// anything is done about it ([`Scheduler::apply`]).
#[derive(Debug)]
pub(super) enum Assessment {
    /// Gone, in a held queue, or waiting for its victims: nothing now.
    Wait,
    /// Default mode, which never waits: refused now, for `reason` (its
    /// quota, or a stock-out of `failed`, its shape).
    Reject {
        reason: EndReason,
        message: String,
        failed: Option<ShapeKey>,
    },
    /// Queue mode, short of quota for its own placement: only its alternatives
    /// may take it.
    TryAlternatives,
    /// Its own placement fits now, on `plan` (a zone and placements).
    Fits {
        shape: ShapeKey,
        plan: (String, Vec<Placement>),
    },
    /// It fits, but would delay the reservation's holder: it waits.
    /// `exhausted` when no batch of its shape could end before the holder
    /// starts.
    HeldBack { shape: ShapeKey, exhausted: bool },
    /// Queue mode, and no zone has room for its own placement now.
    Blocked { shape: ShapeKey },
}

impl Scheduler {
    /// One queued batch in a pass's walk: judged ([`Self::assess`]), then
    /// what the judgement says is done ([`Self::apply`]).
    pub(super) fn consider(
        &mut self,
        key: BatchKey,
        region: &str,
        now: DateTime<Utc>,
        walk: &mut Walk,
        out: &mut Vec<Decision>,
    ) -> Considered {
        let assessment = self.assess(key, region, now, walk);
        self.apply(key, region, assessment, now, walk, out)
    }

    /// What the pass makes of a queued batch in the walk at `now`,
    /// changing nothing but the walk's caches (plans found, the
    /// reservation's start).
    fn assess(
        &self,
        key: BatchKey,
        region: &str,
        now: DateTime<Utc>,
        walk: &mut Walk,
    ) -> Assessment {
        let Some(batch) = self.queue.get(key) else {
            return Assessment::Wait;
        };
        // A held queue's batches wait, reserving nothing; a preemptor
        // waits for its victims, on what is set aside for it.
        if self.hold_of(region, &batch.project).is_some()
            || self.claims.is_claiming(key)
            || self.provisions.is_provisioning(key)
        {
            return Assessment::Wait;
        }
        let default_mode = batch.cluster.mode == ProvisioningMode::Default;
        if let Some(short) = self
            .ledger
            .shortfall(&batch.project, region, &batch.cluster.quota)
        {
            if !default_mode {
                return Assessment::TryAlternatives;
            }
            return Assessment::Reject {
                reason: EndReason::Quota,
                message: format!(
                    "RESOURCE_EXHAUSTED: quota {} exceeded in {region}: limit {}, usage {}, asked {}",
                    short.metric, short.limit, short.usage, short.needed
                ),
                failed: None,
            };
        }
        let shape = shape_key(&batch.cluster);
        let plan = if walk.failed_shapes.contains(&shape) {
            None
        } else if let Some(plan) = walk.fitting.get(&shape) {
            Some(plan.clone())
        } else {
            self.best_zone(region, &needs(&batch.cluster))
        };
        let Some(plan) = plan else {
            if !default_mode {
                return Assessment::Blocked { shape };
            }
            return Assessment::Reject {
                reason: EndReason::StockOut,
                message: format!(
                    "RESOURCE_EXHAUSTED: ZONE_RESOURCE_POOL_EXHAUSTED: no zone of {region} has capacity for {} now; try queue mode (runtime 3.0+), another region or another GPU type",
                    shape_text(&batch.cluster)
                ),
                failed: Some(shape),
            };
        };
        walk.fitting.insert(shape, plan.clone());
        // Under a reservation its placements could serve, a batch that
        // fits may start only if its ttl ends before the holder's
        // estimated start.
        let delayed = (!default_mode)
            .then(|| {
                let placed = (batch.cluster.accelerator(), plan.1.as_slice());
                self.delayed_holder(walk, region, placed, batch.cluster.ends(now))
            })
            .flatten();
        if let Some(until) = delayed {
            let shortest = self
                .queue
                .shapes(region)
                .and_then(|m| m.get(&shape))
                .and_then(|st| st.ttls.keys().next().copied());
            let exhausted = match (until, shortest) {
                (Some(u), Some(t)) if t != u64::MAX => now + Duration::seconds(t as i64) > u,
                (Some(_), _) => true,
                (None, _) => false,
            };
            return Assessment::HeldBack { shape, exhausted };
        }
        Assessment::Fits { shape, plan }
    }

    /// Does what `assessment` of queued batch `key` says.
    fn apply(
        &mut self,
        key: BatchKey,
        region: &str,
        assessment: Assessment,
        now: DateTime<Utc>,
        walk: &mut Walk,
        out: &mut Vec<Decision>,
    ) -> Considered {
        match assessment {
            Assessment::Wait => Considered::Passed,
            Assessment::Reject {
                reason,
                message,
                failed,
            } => {
                if let Some(shape) = failed {
                    walk.shape_fails(shape);
                }
                let batch_id = self
                    .queue
                    .get(key)
                    .map(|b| b.batch_id.clone())
                    .unwrap_or_default();
                self.forget(key, now);
                out.push(Decision::Reject {
                    key,
                    batch_id,
                    message,
                    reason,
                });
                Considered::Passed
            }
            Assessment::TryAlternatives => self.try_alternatives(key, region, now, walk, out),
            Assessment::HeldBack { shape, exhausted } => {
                self.queue.set_held_back(key, true);
                walk.waiting.here(shape_accelerator(&shape));
                if exhausted {
                    walk.exhausted.insert(shape);
                }
                Considered::Passed
            }
            Assessment::Fits {
                shape,
                plan: (zone, placements),
            } => {
                self.queue.set_held_back(key, false);
                let Some(batch) = self.queue.get(key).cloned() else {
                    return Considered::Passed;
                };
                // Capacity changes now: plans made before no longer hold.
                walk.capacity_taken();
                if !self.capacity.take(&placements) {
                    walk.shape_fails(shape);
                    return Considered::Passed;
                }
                let own = (region, &batch.cluster);
                out.push(self.grant(&batch, own, (zone, placements), None, now));
                Considered::Allocated
            }
            Assessment::Blocked { shape } => {
                walk.shape_fails(shape);
                self.blocked(key, region, now, walk, out)
            }
        }
    }

    /// A queue-mode batch whose own placement no zone has room for now:
    /// its alternatives are tried; else, the first such batch of the walk may
    /// preempt, or is looked at again when a cluster could give way; and
    /// it reserves the capacity it waits for.
    fn blocked(
        &mut self,
        key: BatchKey,
        region: &str,
        now: DateTime<Utc>,
        walk: &mut Walk,
        out: &mut Vec<Decision>,
    ) -> Considered {
        // Elastic clusters' extras go back first for the first batch of
        // each GPU type that capacity blocks, where they alone make room
        // for it on its own placement.
        if let Some(batch) = self.queue.get(key).cloned() {
            let parts = needs(&batch.cluster);
            if !walk.blocked_types.contains(&batch.cluster.accelerator())
                && self.reclaim_extras(region, &parts, &batch.batch_id, now)
            {
                walk.capacity_taken();
                if let Some(plan) = self.best_zone(region, &parts) {
                    if self.capacity.take(&plan.1) {
                        let own = (region, &batch.cluster);
                        out.push(self.grant(&batch, own, plan, None, now));
                        return Considered::Allocated;
                    }
                }
            }
        }
        if self.try_alternatives(key, region, now, walk, out) == Considered::Allocated {
            return Considered::Allocated;
        }
        let Some(batch) = self.queue.get(key) else {
            return Considered::Passed;
        };
        // The batch the reservation of its GPU type would hold may have
        // new nodes created for it, before anything is preempted — after,
        // where the pool boots slower than its operator's bound.
        let accelerator = batch.cluster.accelerator();
        let mut slow = None;
        if !walk
            .reservations
            .iter()
            .any(|r| r.accelerator == accelerator)
        {
            if let Some(plan) = self.plan_provision(batch, region, now) {
                let batch = batch.clone();
                if self.boots_too_slowly(&plan.0) {
                    slow = Some((batch, plan));
                } else {
                    walk.capacity_taken();
                    self.provision(&batch, region, plan, now, out);
                    return Considered::Passed;
                }
            }
        }
        let Some(batch) = self.queue.get(key) else {
            return Considered::Passed;
        };
        // The first batch capacity blocks may preempt; the first of each
        // GPU type may reclaim loans of its own capacity (the loan was the
        // agreement, and what it frees serves no other type's holder).
        let first_blocked = walk.reservations.is_empty() && !walk.preempted;
        let first_of_type = walk.blocked_types.insert(batch.cluster.accelerator());
        if first_blocked || first_of_type {
            let planned = if first_blocked {
                self.plan_preemption(batch, now)
            } else {
                self.plan_reclaim(batch, now)
            };
            if let Some((preemption, plan)) = planned {
                walk.preempted |= first_blocked;
                walk.capacity_taken();
                self.preempt(preemption, plan, now, out);
                return Considered::Passed;
            }
            if let Some(at) = self.next_victim_matures(batch, now) {
                self.claims.retry_at(at, region);
            }
        }
        // Nothing to preempt: the slow pool's new nodes, then.
        if let Some((batch, plan)) = slow {
            walk.capacity_taken();
            self.provision(&batch, region, plan, now, out);
            return Considered::Passed;
        }
        // It holds its type's reservation when none of its type is held yet.
        let accelerator = batch.cluster.accelerator();
        if !walk
            .reservations
            .iter()
            .any(|r| r.accelerator == accelerator)
        {
            walk.reservations.push(Reservation {
                accelerator,
                needs: needs(&batch.cluster),
                until: None,
            });
        }
        Considered::Passed
    }

    /// A queued batch whose own placement cannot be allocated now tries
    /// the alternatives whose delay has passed, in their order, at its own place
    /// in the walk (an alternative never jumps the queue): the first whose quota
    /// and capacity take the whole cluster, in one zone, is allocated. A
    /// alternative in the batch's region also yields to the reservation of an
    /// earlier blocked batch; an alternative in another region only takes capacity
    /// that region's own queue leaves (its queue is empty).
    pub(super) fn try_alternatives(
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
        // Nothing to look at when the batch has no alternative, or when every
        // alternative ripe in the region fails in this pass: counted once (and
        // again after capacity is taken), so that a walk past many
        // batches whose alternatives all fail touches none of their alternatives.
        if batch.alternatives.is_empty() {
            return Considered::Passed;
        }
        if self.alternatives_open(region, walk) == 0 {
            return Considered::Passed;
        }
        let Some(batch) = self.queue.get(key) else {
            return Considered::Passed;
        };
        let chosen = self.choose_alternative(batch, region, now, walk);
        let Some((alternative, (zone, placements))) = chosen else {
            return Considered::Passed;
        };
        let Some(batch) = self.queue.get(key).cloned() else {
            return Considered::Passed;
        };
        walk.capacity_taken();
        if !self.capacity.take(&placements) {
            walk.alternative_fails(&alternative.region, shape_key(&alternative.cluster));
            return Considered::Passed;
        }
        let note = self.alternative_note(&batch);
        let on = OnAlternative::of(&batch.region, &batch.cluster, &alternative, note);
        let placed = (alternative.region.as_str(), &alternative.cluster);
        out.push(self.grant(&batch, placed, (zone, placements), Some(on), now));
        Considered::Allocated
    }

    /// The first of a queued batch's alternatives whose delay has passed
    /// that quota and capacity take now, in one zone, without delaying the
    /// reservation's holder; with its zone and placements. Those that fail
    /// for the rest of the pass are noted in `walk`.
    fn choose_alternative(
        &self,
        batch: &PendingBatch,
        region: &str,
        now: DateTime<Utc>,
        walk: &mut Walk,
    ) -> Option<(Alternative, (String, Vec<Placement>))> {
        let ends = batch.cluster.ends(now);
        for alternative in &batch.alternatives {
            if ripe_at(batch.queued_at, alternative) > now {
                continue;
            }
            let shape = shape_key(&alternative.cluster);
            if walk
                .alternative_failed
                .contains(&alternative.region, &shape)
            {
                continue;
            }
            if alternative.region != region && self.queue.has_queued(&alternative.region) {
                walk.alternative_fails(&alternative.region, shape);
                continue;
            }
            if self
                .ledger
                .shortfall(
                    &batch.project,
                    &alternative.region,
                    &alternative.cluster.quota,
                )
                .is_some()
            {
                continue;
            }
            let Some(plan) = self.best_zone(&alternative.region, &needs(&alternative.cluster))
            else {
                walk.alternative_fails(&alternative.region, shape);
                continue;
            };
            // A reservation holds back only what could serve its holder: an
            // alternative on GPUs of another type than every part the holder
            // needs does not delay it.
            if alternative.region == region
                && self
                    .delayed_holder(
                        walk,
                        region,
                        (alternative.cluster.accelerator(), &plan.1),
                        ends,
                    )
                    .is_some()
            {
                walk.alternative_fails(&alternative.region, shape);
                continue;
            }
            if alternative.is_loan() {
                let owners = self.owners_of(walk, &alternative.region, &plan.1);
                // The owners come first: a loan of capacity a queued batch
                // of its own GPU type fits waits for the end of the walk,
                // and so does every loan after it (they keep their order).
                if (owners.fits || !walk.deferred_loans.is_empty()) && !walk.owners_served {
                    if walk.deferred_loans.last() != Some(&batch.key) {
                        walk.deferred_loans.push(batch.key);
                    }
                    continue;
                }
                // A loan gives the capacity back before the owners waiting
                // for it could start (its ttl ends, or it may be reclaimed
                // by then), or it is not taken.
                let gives_back = self.loan_gives_back(batch, alternative, now);
                if delays_holder(owners.start, gives_back) {
                    walk.alternative_fails(&alternative.region, shape);
                    continue;
                }
            }
            return Some((alternative.clone(), plan));
        }
        None
    }

    /// Why a batch allocated on an alternative was not allocated on its
    /// own placement: what blocks it, or the reservation for earlier batches.
    fn alternative_note(&self, batch: &PendingBatch) -> String {
        let blockers = self.blockers(batch);
        if blockers.is_empty() {
            "its own placement was held for earlier batches".to_string()
        } else {
            blockers
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        }
    }

    /// Gives `batch` the cluster `placed` (a region and the cluster it
    /// holds there: its own, or an alternative's) on `plan` (its zone and
    /// placements, already taken from the capacity): it leaves the queue,
    /// its quota is charged and its GPUs count in the fair-share order.
    pub(super) fn grant(
        &mut self,
        batch: &PendingBatch,
        placed: (&str, &ClusterRequest),
        plan: (String, Vec<Placement>),
        alternative: Option<OnAlternative>,
        now: DateTime<Utc>,
    ) -> Decision {
        let (region, cluster) = placed;
        let (zone, placements) = plan;
        let placements_len = placements.len();
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
            alternative,
            elastic: super::model::Growth::of(cluster, placements_len).map(Box::new),
        };
        self.fair.hold(region, &batch.project, &alloc.placements);
        self.start_running(alloc.clone());
        Decision::Allocate(alloc)
    }
}
