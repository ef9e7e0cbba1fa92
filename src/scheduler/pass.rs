//! The pass: what the scheduler core decides at `now`. It fails the
//! clusters of nodes whose lease lapsed, expires batches past their
//! deadline (saying what was missing), then walks each dirty region's queue
//! in strict or fair-share order, allocating what fits, rejecting what
//! default mode cannot wait for, and holding back what would delay the
//! first batch blocked by capacity (its reservation). What the walk makes
//! of each batch, and does about it, is `assess.rs`; what it keeps while
//! it walks a region, `walk.rs`.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use chrono::{DateTime, Utc};

use super::capacity::needs;
use super::core::Scheduler;
use super::fairshare::Order;
use super::model::{BatchKey, Decision, PendingBatch, ShapeKey, accelerator_label, shape_key};
use super::queue::QueueKey;
use super::walk::{Considered, Walk, needs_of};

impl Scheduler {
    /// Expires what is due, then admits what fits, region by region, and
    /// applies every decision to its own state.
    pub fn pass(&mut self, now: DateTime<Utc>) -> Vec<Decision> {
        let mut decisions = Vec::new();
        // Lost nodes first: their capacity must not be handed out again,
        // and the clusters that used them fail whole.
        for (node, epoch, expired_at) in self.leases.lapsed(now) {
            // An elastic cluster that held only extras there goes on.
            self.lose_extras_on(&node, now);
            let lost_machine = self.lost_machine(&node, epoch, expired_at);
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
            // A provisioned pool's machine is deleted.
            decisions.extend(lost_machine.map(Decision::Suspend));
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
        // Sets of new nodes that failed or timed out are suspended whole,
        // and so are those whose batch left the queue.
        self.fail_due_sets(now, &mut decisions);
        self.suspend_abandoned(&mut decisions);
        self.fair.prune(now);
        let ripe = self.queue.ripen(now);
        self.dirty.extend(ripe);
        let due = self.claims.due_retries(now);
        self.dirty.extend(due);
        let regions = self.regions_to_scan();
        for region in &regions {
            self.admit_region(region, now, &mut decisions);
        }
        self.scale_down(now, &regions, &mut decisions);
        decisions
    }

    fn admit_region(&mut self, region: &str, now: DateTime<Utc>, out: &mut Vec<Decision>) {
        self.settle_sets(region, now, out);
        self.give_up_needless_sets(region);
        self.suspend_abandoned(out);
        self.settle_claims(region, now, out);
        let mut walk = Walk::default();
        // A held queue's batches wait, reserving nothing.
        if self.holds.get(region).is_none_or(|h| h.all.is_none()) {
            match self.fair.order() {
                Order::Strict => self.admit_strict(region, now, &mut walk, out),
                Order::FairShare => self.admit_fair(region, now, &mut walk, out),
            }
            self.grant_deferred_loans(region, now, &mut walk, out);
        }
        self.elastic
            .waiting
            .insert(region.to_string(), walk.waiting);
    }

    /// The owners first: loans deferred in the walk because a queued
    /// batch of the capacity's own GPU type fitted it are tried again, in
    /// the walk's order, on what the owners left.
    fn grant_deferred_loans(
        &mut self,
        region: &str,
        now: DateTime<Utc>,
        walk: &mut Walk,
        out: &mut Vec<Decision>,
    ) {
        if walk.deferred_loans.is_empty() {
            return;
        }
        walk.owners_served = true;
        walk.alternatives_open = None;
        for key in std::mem::take(&mut walk.deferred_loans) {
            self.try_alternatives(key, region, now, walk, out);
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
            if self.held_or_short(region, &batch) {
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

    /// Whether `batch` may not start now on what was set aside for it:
    /// its queue is held, or its project lacks the quota.
    pub(super) fn held_or_short(&self, region: &str, batch: &PendingBatch) -> bool {
        self.hold_of(region, &batch.project).is_some()
            || self
                .ledger
                .shortfall(&batch.project, region, &batch.cluster.quota)
                .is_some()
    }

    /// Strict order: the region's queue by priority, then age.
    fn admit_strict(
        &mut self,
        region: &str,
        now: DateTime<Utc>,
        walk: &mut Walk,
        out: &mut Vec<Decision>,
    ) {
        // The queue is walked in chunks from a cursor rather than copied
        // whole: a pass usually stops after a few entries, and the queue
        // may hold a million.
        const CHUNK: usize = 256;
        let mut cursor: Option<QueueKey> = None;
        let mut buffer = Vec::new().into_iter();
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
            if self.nothing_more(region, walk) {
                break;
            }
            self.consider(queued.1, region, now, walk, out);
        }
    }

    /// Fair-share order: the project with the lowest usage ÷ weight first,
    /// its batches by priority, then age. An allocation raises its
    /// project's usage at once, so the order is taken again after each.
    fn admit_fair(
        &mut self,
        region: &str,
        now: DateTime<Utc>,
        walk: &mut Walk,
        out: &mut Vec<Decision>,
    ) {
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
            if self.nothing_more(region, walk) {
                break;
            }
            if self.consider(queued.1, region, now, walk, out) == Considered::Allocated {
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
        // A batch whose own shape failed may still fit on an alternative, unless
        // every alternative ripe in the region fails.
        if self.alternatives_open(region, walk) > 0 {
            return false;
        }
        // Counted against the shapes still queued: a rejected batch may
        // have been a shape's last.
        let present = self.queue.shapes(region).map_or(0, |m| {
            walk.exhausted.iter().filter(|s| m.contains_key(*s)).count()
        });
        present >= distinct
    }

    /// How many alternative options ripe in `region` may still be allocated in
    /// this pass (counted once, then again only after an alternative fails or
    /// capacity is taken). Each option not decided yet is checked against
    /// the free capacity: one whose whole cluster no zone of its region
    /// has room for now (capacity only shrinks during a pass), or in
    /// another region whose queue is not empty, fails for every batch, as
    /// `try_alternatives` would find; it is marked so here, once, rather than
    /// waiting for a batch of its shape to come by in the walk.
    pub(super) fn alternatives_open(&self, region: &str, walk: &mut Walk) -> usize {
        if let Some(open) = walk.alternatives_open {
            return open;
        }
        let Some(options) = self.queue.alternatives().options(region) else {
            walk.alternatives_open = Some(0);
            return 0;
        };
        for (alternative_region, shape) in options.keys() {
            if walk.alternative_failed.contains(alternative_region, shape)
                || walk.alternative_fits.contains(alternative_region, shape)
            {
                continue;
            }
            let blocked = alternative_region != region && self.queue.has_queued(alternative_region);
            if blocked
                || self
                    .best_zone(alternative_region, &needs_of(shape))
                    .is_none()
            {
                walk.alternative_failed.insert(alternative_region, *shape);
            } else {
                walk.alternative_fits.insert(alternative_region, *shape);
            }
        }
        let open = options
            .keys()
            .filter(|(r, shape)| !walk.alternative_failed.contains(r, shape))
            .count();
        walk.alternatives_open = Some(open);
        open
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

    /// The regions a pass scans: those that changed, and those whose
    /// batches may try an alternative in a region that changed.
    pub(super) fn regions_to_scan(&mut self) -> std::collections::BTreeSet<String> {
        let mut regions = std::mem::take(&mut self.dirty);
        let homes: Vec<String> = regions
            .iter()
            .filter_map(|r| self.queue.alternatives().homes_of(r))
            .flat_map(|homes| homes.keys())
            .filter(|home| !regions.contains(*home))
            .cloned()
            .collect();
        regions.extend(homes);
        regions
    }
}
