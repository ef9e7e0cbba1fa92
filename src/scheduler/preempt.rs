//! Preemption (docs/rules.md#preemption): the first batch of a region's
//! order that capacity blocks may stop whole running clusters of lower
//! priority, or of a project far over its fair share, when it then fits
//! at once. The decision, its victims and the capacity set aside for it
//! (its claim) are one [`Decision::Preempt`]; the victims stop (the
//! engine tells their agents), each one's cluster is banked for the
//! preemptor as it goes, and once every victim is gone the preemptor is
//! allocated on what was set aside. Never two clusters on a GPU.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, Utc};

use super::capacity::{Placement, needs, plan_zone};
use super::core::Scheduler;
use super::model::{
    Allocation, BatchKey, Cause, Claim, Decision, PendingBatch, Preemption, PreemptionPolicy,
    Victim,
};
use crate::spec::Accelerator;
use crate::spec::alternatives::{Reclaim, rule_matching};

/// When `victim` has run `min_runtime`.
fn matures(policy: &PreemptionPolicy, victim: &Allocation) -> DateTime<Utc> {
    later(victim.allocated_at, policy.min_runtime)
}

/// `at` + `d`, or the end of time where that overflows.
fn later(at: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    Duration::from_std(d)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// One zone's answer: the victims (by their index in the candidates),
/// the preemptor's placements, and the work lost.
struct ZonePick {
    zone: String,
    victims: Vec<usize>,
    plan: Vec<Placement>,
    lost: f64,
}

impl Scheduler {
    /// The policy of `region`, where preemption is on.
    pub(super) fn preemption_in(&self, region: &str) -> Option<&PreemptionPolicy> {
        self.preemption.get(region)
    }

    /// Why `victim` may give way to `batch` at `now` under `policy`, if it
    /// may: old enough, not protected, not opted out, and of strictly
    /// lower priority or, at no higher priority, of a project far enough
    /// over its fair share.
    fn victim_cause(
        &self,
        policy: &PreemptionPolicy,
        batch: &PendingBatch,
        victim: &Allocation,
        now: DateTime<Utc>,
    ) -> Option<Cause> {
        (now >= matures(policy, victim))
            .then(|| self.cause_but_age(policy, batch, victim, now))
            .flatten()
    }

    /// [`Self::victim_cause`] whatever the victim's age.
    fn cause_but_age(
        &self,
        policy: &PreemptionPolicy,
        batch: &PendingBatch,
        victim: &Allocation,
        now: DateTime<Utc>,
    ) -> Option<Cause> {
        if self.claims.stopping_for(victim.key).is_some()
            || victim.preemptions >= policy.max_preemptions
            || (!victim.preemptible && policy.allow_opt_out)
        {
            return None;
        }
        if policy.by_priority && batch.priority > victim.priority {
            return Some(Cause::Priority {
                preemptor: batch.priority,
                victim: victim.priority,
            });
        }
        // Fair share decides among batches of no higher priority than the
        // preemptor's: it never undoes what a priority preemption won for
        // an urgent batch (docs/rules.md#preemption).
        if policy.by_fair_share
            && victim.project != batch.project
            && victim.priority <= batch.priority
        {
            let mine = self.fair.standing(&batch.region, &batch.project, now).share;
            let theirs = self
                .fair
                .standing(&victim.region, &victim.project, now)
                .share;
            if mine * policy.fair_share_margin < theirs {
                return Some(Cause::FairShare {
                    preemptor: batch.project.clone(),
                    preemptor_share: mine,
                    victim: victim.project.clone(),
                    victim_share: theirs,
                });
            }
        }
        None
    }

    /// When the first cluster of `batch`'s region that could give way to it
    /// but for its age reaches `min_runtime`, or the first loan there may
    /// be reclaimed, after `now`: the region is looked at again then.
    pub(super) fn next_victim_matures(
        &self,
        batch: &PendingBatch,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let loan = self.next_loan_matures(batch, now);
        let preempted = self.next_preemptible_matures(batch, now);
        loan.into_iter().chain(preempted).min()
    }

    /// When the first loan of `batch`'s region may be reclaimed, after `now`.
    fn next_loan_matures(&self, batch: &PendingBatch, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.loans_in(&batch.region)
            .filter(|a| self.claims.stopping_for(a.key).is_none())
            .filter_map(|a| self.reclaimable_from(a))
            .filter(|at| *at > now)
            .min()
    }

    /// When the first cluster of `batch`'s region that could be preempted
    /// for it but for its age reaches `min_runtime`, after `now`.
    fn next_preemptible_matures(
        &self,
        batch: &PendingBatch,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let policy = self.preemption_in(&batch.region)?;
        self.running
            .values()
            .filter(|a| a.region == batch.region)
            .map(|a| (a, matures(policy, a)))
            .filter(|(_, at)| *at > now)
            .filter(|(a, _)| self.cause_but_age(policy, batch, a, now).is_some())
            .map(|(_, at)| at)
            .min()
    }

    /// The preemption that lets `batch` (queue mode, blocked by capacity,
    /// its quota free) start now, if one does: loans of its own capacity
    /// are reclaimed first, wherever preemption is on or off (the loan was
    /// the agreement: [`Self::plan_reclaim`]); only where they do not make
    /// room, and preemption is on, may the batch also preempt, loans still
    /// first among the victims.
    pub(super) fn plan_preemption(
        &self,
        batch: &PendingBatch,
        now: DateTime<Utc>,
    ) -> Option<(Preemption, Vec<Placement>)> {
        if !self.may_preempt(batch) {
            return None;
        }
        let loans = self.reclaim_candidates(batch, now);
        if let Some(plan) = self.plan_among(batch, &loans, self.reclaim_grace(&batch.region), now) {
            return Some(plan);
        }
        let policy = self.preemption_in(&batch.region)?;
        let reclaimed: std::collections::HashSet<BatchKey> =
            loans.iter().map(|(a, _)| a.key).collect();
        let mut candidates = loans;
        candidates.extend(
            self.preemption_candidates(policy, batch, now)
                .into_iter()
                .filter(|(a, _)| !reclaimed.contains(&a.key)),
        );
        self.plan_among(batch, &candidates, policy.grace, now)
    }

    /// The reclaim of loans on its own capacity that lets `batch` start
    /// now, if one does, preemption aside.
    pub(super) fn plan_reclaim(
        &self,
        batch: &PendingBatch,
        now: DateTime<Utc>,
    ) -> Option<(Preemption, Vec<Placement>)> {
        if !self.may_preempt(batch) {
            return None;
        }
        let loans = self.reclaim_candidates(batch, now);
        self.plan_among(batch, &loans, self.reclaim_grace(&batch.region), now)
    }

    /// Whether `batch` may stop others at all: queue mode, not waiting
    /// for victims already, and its quota free.
    fn may_preempt(&self, batch: &PendingBatch) -> bool {
        batch.deadline.is_some()
            && !self.claims.is_claiming(batch.key)
            && self
                .ledger
                .shortfall(&batch.project, &batch.region, &batch.cluster.quota)
                .is_none()
    }

    /// How long a reclaimed loan has to stop: the region's preemption
    /// grace, or the default one where preemption is off.
    fn reclaim_grace(&self, region: &str) -> std::time::Duration {
        self.preemption_in(region)
            .map_or(PreemptionPolicy::default().grace, |p| p.grace)
    }

    /// When the owners may take back a loan of a batch of `project` whose
    /// own placement is GPU type `asked` in region `home`: the operator's
    /// rule for it, live (the default where no entry matches now).
    pub fn reclaim_rule(&self, project: &str, home: &str, asked: Option<Accelerator>) -> Reclaim {
        rule_matching(&self.reclaim, project, home, asked)
            .map(|r| r.reclaim)
            .unwrap_or_default()
    }

    /// When loan `a` may be reclaimed under the operator's rule for its
    /// batch's own placement; None: never, or `a` is no loan.
    pub(super) fn reclaimable_from(&self, a: &Allocation) -> Option<DateTime<Utc>> {
        let loan = a.loan()?;
        match self.reclaim_rule(&a.project, &loan.home, loan.asked) {
            Reclaim::Never => None,
            Reclaim::After(d) => Some(later(a.allocated_at, d)),
        }
    }

    /// When a loan `batch` would take on `alternative` at `now` gives its
    /// capacity back at the latest: at the end of its ttl or once it may
    /// be reclaimed and its grace is over, whichever is first (None:
    /// neither).
    pub(super) fn loan_gives_back(
        &self,
        batch: &PendingBatch,
        alternative: &crate::spec::Alternative,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let rule = self.reclaim_rule(&batch.project, &batch.region, batch.cluster.accelerator());
        let reclaimed = match rule {
            Reclaim::Never => None,
            Reclaim::After(d) => Some(later(now, d + self.reclaim_grace(&alternative.region))),
        };
        alternative
            .cluster
            .ends(now)
            .into_iter()
            .chain(reclaimed)
            .min()
    }

    /// When running cluster `a` is expected to give its capacity back: at
    /// the end of its ttl or, on a loan, once it may be reclaimed and its
    /// grace is over, whichever is first (None: neither).
    pub(super) fn gives_back_at(&self, a: &Allocation) -> Option<DateTime<Utc>> {
        let Some(reclaimable) = self.reclaimable_from(a) else {
            return a.expected_end;
        };
        let reclaimed = later(reclaimable, self.reclaim_grace(&a.region));
        a.expected_end.into_iter().chain([reclaimed]).min()
    }

    /// The loans of `batch`'s region it may reclaim at `now` (run their
    /// minimum, not stopping already), the most recently started first
    /// (the least work lost); by key for a stable order.
    fn reclaim_candidates(
        &self,
        batch: &PendingBatch,
        now: DateTime<Utc>,
    ) -> Vec<(&Allocation, Cause)> {
        let mut loans: Vec<(&Allocation, Cause)> = self
            .loans_in(&batch.region)
            .filter(|a| self.claims.stopping_for(a.key).is_none())
            .filter(|a| self.reclaimable_from(a).is_some_and(|at| at <= now))
            .map(|a| {
                let cause = Cause::Reclaim {
                    lender: a.lender(),
                    on_loan: (now - a.allocated_at).to_std().unwrap_or_default(),
                };
                (a, cause)
            })
            .collect();
        loans.sort_by_key(|(a, _)| (std::cmp::Reverse(a.allocated_at), a.key));
        loans
    }

    /// The pick among `candidates` (in the order they are taken) that
    /// lets `batch` start now: in the zone where the fewest GPU-seconds of
    /// work are lost, the fewest whole clusters, and only if the batch
    /// then fits entirely. Fair-share victims are taken only if the
    /// preemptor's share stays at most theirs afterwards, so two projects
    /// never take turns preempting each other.
    fn plan_among(
        &self,
        batch: &PendingBatch,
        candidates: &[(&Allocation, Cause)],
        grace: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Option<(Preemption, Vec<Placement>)> {
        if candidates.is_empty() {
            return None;
        }
        let region = batch.region.as_str();
        let parts = needs(&batch.cluster);
        let mut best: Option<ZonePick> = None;
        let zones: BTreeSet<&str> = candidates.iter().map(|(a, _)| a.zone.as_str()).collect();
        for zone in zones {
            let Some(pick) = self.pick_in_zone(batch, zone, candidates, &parts, now) else {
                continue;
            };
            let better = best
                .as_ref()
                .is_none_or(|b| (pick.lost, pick.victims.len()) < (b.lost, b.victims.len()));
            if better {
                best = Some(pick);
            }
        }
        let pick = best?;
        let victims = self.victims_of(&pick, candidates, now);
        Some((
            Preemption {
                preemptor: batch.key,
                preemptor_id: batch.batch_id.clone(),
                project: batch.project.clone(),
                region: region.to_string(),
                zone: pick.zone,
                victims,
                grace,
            },
            pick.plan,
        ))
    }

    /// The running clusters of `batch`'s region that could give way to it,
    /// with why: lowest priority first, then the most recently started (the
    /// least work lost); by key for a stable order.
    fn preemption_candidates(
        &self,
        policy: &PreemptionPolicy,
        batch: &PendingBatch,
        now: DateTime<Utc>,
    ) -> Vec<(&Allocation, Cause)> {
        let region = batch.region.as_str();
        let mut candidates: Vec<(&Allocation, Cause)> = self
            .running
            .values()
            .filter(|a| a.region == region)
            .filter_map(|a| Some((a, self.victim_cause(policy, batch, a, now)?)))
            .collect();
        candidates.sort_by(|(a, _), (b, _)| {
            (a.priority, std::cmp::Reverse(a.allocated_at), a.key).cmp(&(
                b.priority,
                std::cmp::Reverse(b.allocated_at),
                b.key,
            ))
        });
        candidates
    }

    /// The fewest candidates of `zone` whose clusters, given back, let the
    /// batch's `parts` fit entirely, with its placements and the work lost;
    /// none if it does not fit, fits without stopping anything, or the
    /// victims' fair share would not hold.
    fn pick_in_zone(
        &self,
        batch: &PendingBatch,
        zone: &str,
        candidates: &[(&Allocation, Cause)],
        parts: &[super::capacity::PartNeed],
        now: DateTime<Utc>,
    ) -> Option<ZonePick> {
        let region = batch.region.as_str();
        let in_zone: Vec<usize> = (0..candidates.len())
            .filter(|&i| candidates[i].0.zone == zone)
            .collect();
        let plan_on = |sim: &super::capacity::Capacity| {
            let plan = plan_zone(&sim.zone_nodes(region, zone), parts);
            plan.complete().then_some(plan.placements)
        };
        // The zone's extras go back before any core part
        // (docs/rules.md#elastic-batches): counted free here, taken back
        // when the preemption is carried out.
        let extras = self.zone_extras(region, zone, batch.priority);
        let with_extras_back = || {
            let mut sim = self.capacity.zone(region, zone);
            for p in &extras {
                sim.give_back(std::slice::from_ref(*p));
            }
            sim
        };
        let victim_parts = |a| self.victim_parts(a, batch.priority);
        // Victims are whole clusters of this zone: a copy of the zone
        // is all a plan needs.
        let fits = |victims: &[usize]| {
            let mut sim = with_extras_back();
            for &i in victims {
                sim.give_back(victim_parts(candidates[i].0));
            }
            plan_on(&sim)
        };
        // Victims in order until the batch fits (on one copy of the
        // zone, each victim's cluster given back in turn)...
        let mut sim = with_extras_back();
        let mut chosen = Vec::new();
        let mut plan = None;
        for &i in &in_zone {
            chosen.push(i);
            sim.give_back(victim_parts(candidates[i].0));
            plan = plan_on(&sim);
            if plan.is_some() {
                break;
            }
        }
        let mut plan = plan?;
        // ...then none that is not needed, the last taken first.
        for j in (0..chosen.len()).rev() {
            let mut fewer = chosen.clone();
            fewer.remove(j);
            if let Some(p) = fits(&fewer) {
                chosen = fewer;
                plan = p;
            }
        }
        // The batch fits here as things are: nothing to stop.
        if chosen.is_empty() {
            return None;
        }
        if !self.fair_share_holds(batch, &chosen, candidates, now) {
            return None;
        }
        let lost: f64 = chosen
            .iter()
            .map(|&i| candidates[i].0.gpu_seconds(now))
            .sum();
        Some(ZonePick {
            zone: zone.to_string(),
            victims: chosen,
            plan,
            lost,
        })
    }

    /// The victims of the chosen zone's pick, each with the work it loses
    /// and whether it stops at once (every part on a virtual node).
    fn victims_of(
        &self,
        pick: &ZonePick,
        candidates: &[(&Allocation, Cause)],
        now: DateTime<Utc>,
    ) -> Vec<Victim> {
        pick.victims
            .iter()
            .map(|&i| {
                let (a, cause) = &candidates[i];
                Victim {
                    key: a.key,
                    batch_id: a.batch_id.clone(),
                    project: a.project.clone(),
                    gpus: a.gpus(),
                    gpu_seconds: a.gpu_seconds(now),
                    cause: cause.clone(),
                    at_once: a.placements.iter().all(|p| {
                        self.capacity
                            .nodes
                            .get(&p.node)
                            .is_some_and(|n| n.spec.is_virtual)
                    }),
                }
            })
            .collect()
    }

    /// Whether, after `chosen` give way to `batch`, the preemptor's share
    /// stays at most each fair-share victim's project's: otherwise that
    /// project could preempt back.
    fn fair_share_holds(
        &self,
        batch: &PendingBatch,
        chosen: &[usize],
        candidates: &[(&Allocation, Cause)],
        now: DateTime<Utc>,
    ) -> bool {
        let policy = self.fair.policy();
        let region = batch.region.as_str();
        let gained = needs(&batch.cluster)
            .iter()
            .map(|n| f64::from(n.gpus) * policy.gpu_weight(n.accelerator))
            .sum::<f64>();
        chosen.iter().all(|&i| {
            let (victim, cause) = &candidates[i];
            if !matches!(cause, Cause::FairShare { .. }) {
                return true;
            }
            let given: f64 = chosen
                .iter()
                .map(|&j| candidates[j].0)
                .filter(|a| a.project == victim.project)
                .map(|a| policy.charge(&a.placements))
                .sum();
            let mine = self.fair.standing(region, &batch.project, now);
            let theirs = self.fair.standing(region, &victim.project, now);
            let mine_after = (mine.usage + gained) / mine.weight;
            let theirs_after = (theirs.usage - given).max(0.0) / theirs.weight;
            mine_after <= theirs_after
        })
    }

    /// Commits `p` in the core: its victims are stopping, and the capacity
    /// its plan finds free now is set aside for the preemptor (its claim).
    pub(super) fn preempt(
        &mut self,
        p: Preemption,
        plan: Vec<Placement>,
        now: DateTime<Utc>,
        out: &mut Vec<Decision>,
    ) {
        // The zone's extras go back first, at once: their capacity is
        // banked with what is free.
        let priority = self.queue.get(p.preemptor).map_or(i32::MAX, |b| b.priority);
        let victims: Vec<BatchKey> = p.victims.iter().map(|v| v.key).collect();
        self.take_back_zone_extras(
            (&p.region, &p.zone),
            priority,
            &victims,
            &p.preemptor_id,
            now,
        );
        let banked = self.capacity.take_free(&plan);
        let quota = self
            .queue
            .get(p.preemptor)
            .map(|b| b.cluster.quota.clone())
            .unwrap_or_default();
        self.ledger.set_aside(&p.project, &p.region, &quota);
        self.claims.open(
            p.preemptor,
            Claim {
                region: p.region.clone(),
                project: p.project.clone(),
                quota,
                plan,
                waiting: p.victims.iter().map(|v| v.key).collect(),
                banked,
            },
        );
        out.push(Decision::Preempt(p));
    }

    /// A stopping victim's cluster is gone: banked for its preemptor
    /// (true), or, when the preemptor no longer waits, not (false: the
    /// caller gives it back).
    pub(super) fn bank_victim(&mut self, victim: &Allocation) -> bool {
        let Some(region) = self.claims.bank(victim) else {
            return false;
        };
        self.dirty.insert(region);
        true
    }

    /// A preemptor left the queue: what was set aside for it returns. Its
    /// victims stop anyway (they were told to): they stay out of other
    /// preemptions, and their clusters go back to the queue as they go.
    pub(super) fn drop_claim(&mut self, preemptor: BatchKey) {
        if let Some(claim) = self.claims.take(preemptor) {
            self.give_back_claim(&claim);
            self.dirty.insert(claim.region);
        }
    }

    /// What `claim` set aside (capacity and quota) goes back.
    fn give_back_claim(&mut self, claim: &Claim) {
        self.capacity.give_back(&claim.banked);
        self.ledger
            .release_aside(&claim.project, &claim.region, &claim.quota);
    }

    /// The preemptors of `region` whose victims are all gone: their
    /// claims, taken out, with what they set aside given back (the pass
    /// allocates each on its plan).
    pub(super) fn ready_claims(&mut self, region: &str) -> Vec<(BatchKey, Claim)> {
        let mut ready = Vec::new();
        for key in self.claims.ready_in(region) {
            if let Some(claim) = self.claims.take(key) {
                self.give_back_claim(&claim);
                ready.push((key, claim));
            }
        }
        ready
    }

    /// A preemption that was not carried out (its commit did not apply):
    /// the preemptor waits in the queue as before, what was set aside for
    /// it returns, and its victims are no longer stopping.
    pub fn withdraw_preemption(&mut self, preemptor: BatchKey) {
        if let Some(claim) = self.claims.withdraw(preemptor) {
            self.give_back_claim(&claim);
            self.dirty.insert(claim.region);
        }
    }

    /// After a restart: `victim` was stopping for `preemptor` when the
    /// core was built. It stays out of other preemptions, and, while the
    /// preemptor is queued, its cluster is set aside for it as it goes
    /// (the claim has no plan then: the preemptor takes the best zone once
    /// every victim is gone).
    pub fn restore_stopping(&mut self, victim: BatchKey, preemptor: BatchKey) {
        if !self.running.contains_key(&victim) || self.claims.restore_stopping(victim, preemptor) {
            return;
        }
        let Some(b) = self.queue.get(preemptor) else {
            return;
        };
        let claim = Claim {
            region: b.region.clone(),
            project: b.project.clone(),
            quota: b.cluster.quota.clone(),
            plan: Vec::new(),
            waiting: BTreeSet::from([victim]),
            banked: Vec::new(),
        };
        self.ledger
            .set_aside(&claim.project, &claim.region, &claim.quota);
        self.claims.open(preemptor, claim);
    }

    /// What preemption (and the reclaim of loans) does for a queued
    /// `batch` that capacity blocks, in words (why-pending and
    /// validate-only): whom it preempts or reclaims from, whom it would
    /// once it comes first among the blocked, from when a cluster could
    /// give way, or why none can. None where preemption is off and no loan
    /// could give way, or the batch never waits (default mode).
    pub fn preemption_reason(&self, batch: &PendingBatch, now: DateTime<Utc>) -> Option<String> {
        let policy = self.preemption_in(&batch.region);
        if let Some(claim) = self.claims.get(batch.key) {
            let names: Vec<&str> = claim
                .waiting
                .iter()
                .filter_map(|k| self.running.get(k).map(|a| a.batch_id.as_str()))
                .collect();
            return Some(if names.is_empty() {
                "preempting: its victims have stopped; it is allocated at the next pass".into()
            } else {
                format!(
                    "preempting {}: allocated once they have stopped",
                    names.join(", ")
                )
            });
        }
        batch.deadline?;
        // Where preemption is off, this plans the reclaim of loans alone.
        if let Some((p, _)) = self.plan_preemption(batch, now) {
            let names: Vec<String> = p
                .victims
                .iter()
                .map(|v| format!("{} ({})", v.batch_id, v.cause))
                .collect();
            let verb = if p.victims.iter().all(|v| v.cause.is_reclaim()) {
                "would reclaim the loans of"
            } else {
                "would preempt"
            };
            return Some(format!(
                "{verb} {} ({} GPUs) in {} once it comes first among the batches capacity blocks",
                names.join(", "),
                p.gpus(),
                p.zone
            ));
        }
        let loan = self.next_loan_matures(batch, now);
        let preemptible = self.next_preemptible_matures(batch, now);
        match (loan, preemptible, policy) {
            (Some(l), p, _) if p.is_none_or(|p| l <= p) => {
                return Some(format!(
                    "no loan of its capacity may be reclaimed yet: the first reaches its minimum run at {}",
                    l.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ));
            }
            (_, Some(at), Some(policy)) => {
                return Some(format!(
                    "no cluster can give way yet: the first that could reaches min_runtime ({}) at {}",
                    humantime::format_duration(policy.min_runtime),
                    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ));
            }
            _ => {}
        }
        policy?;
        Some(
            "nothing can be preempted for it: no cluster of lower priority, or of a project far enough over its fair share, that is not protected would make room for it in one zone"
                .into(),
        )
    }

    /// Whether `key` waits for its victims to stop.
    pub fn is_claiming(&self, key: BatchKey) -> bool {
        self.claims.is_claiming(key)
    }

    /// The preemptor `key` (a victim) is stopping for, if any.
    pub fn stopping_for(&self, key: BatchKey) -> Option<BatchKey> {
        self.claims.stopping_for(key)
    }
}
