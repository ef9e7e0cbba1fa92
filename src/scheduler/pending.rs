//! Why a batch waits and when it may start, without deciding anything:
//! what stands in its way (quota, capacity; an expiry's message names it
//! too), its place in the region's order (strict or fair share) and the
//! start estimate for the first [`ESTIMATE_DEPTH`], the verdict of a
//! validate-only create, why each placement alternative has not taken it,
//! and the never-fit check. The reasons' types are `reasons.rs`; queue
//! pages, quota and capacity views are `views.rs`.

use chrono::{DateTime, Utc};

use super::alternatives::ripe_at;
use super::capacity::{needs, plan_zone};
use super::core::Scheduler;
use super::fairshare::{Order, share_key};
use super::model::{BatchKey, PendingBatch, shape_text};
use super::queue::QueueKey;
use super::reasons::{Blocker, NotAdmitted, PendingInfo, Reason, Verdict, messages};
use crate::spec::alternatives::AlternativeSpec;
use crate::spec::{ClusterRequest, ProvisioningMode};

/// A project ahead of a batch's own in fair-share order.
struct ProjectAhead<'a> {
    project: &'a str,
    /// Its usage ÷ weight.
    share: f64,
    /// Its queued batches in the region.
    queued: usize,
}

/// The queued batches of the projects ahead of a batch's own.
fn queued_in_all(before: &[ProjectAhead<'_>]) -> usize {
    before.iter().map(|p| p.queued).sum()
}

/// Where a batch stands, when the caller knows it from its own walk.
#[derive(Debug, Clone, Copy)]
pub(super) enum Place {
    Unknown,
    /// Its 1-based position in the region's order.
    Region(usize),
    /// Its 1-based place among its own project's queued batches (fair
    /// share: the projects before its own come first).
    InProject(usize),
}

/// The most batches ahead of one for which an estimated start is given:
/// deeper in the queue the estimate would cost too much and say little.
pub const ESTIMATE_DEPTH: usize = 500;

impl Scheduler {
    /// What stands in the way of a batch now.
    pub(super) fn blockers(&self, batch: &PendingBatch) -> Vec<Blocker> {
        let mut out = Vec::new();
        if let Some(s) = self
            .ledger
            .shortfall(&batch.project, &batch.region, &batch.cluster.quota)
        {
            out.push(Blocker::Quota(s));
        }
        let parts = needs(&batch.cluster);
        let best = self
            .capacity
            .zones(&batch.region)
            .map(|z| {
                (
                    plan_zone(&self.capacity.zone_nodes(&batch.region, z), &parts),
                    z,
                )
            })
            .max_by_key(|(p, z)| (p.placed, std::cmp::Reverse(*z)));
        match best {
            Some((plan, _)) if plan.complete() => {}
            Some((plan, zone)) => out.push(Blocker::Capacity {
                total: plan.total,
                placed: plan.placed,
                closest_zone: Some(zone.to_string()),
                shape: shape_text(&batch.cluster),
            }),
            None => out.push(Blocker::Capacity {
                total: parts.len(),
                placed: 0,
                closest_zone: None,
                shape: shape_text(&batch.cluster),
            }),
        }
        out
    }

    /// Queue position (1-based) in the region's order, reasons and an
    /// estimated start, as of `now`.
    pub fn pending_info(&self, key: BatchKey, now: DateTime<Utc>) -> Option<PendingInfo> {
        self.pending_info_at(key, Place::Unknown, None, now)
    }

    /// [`Self::pending_info`], told the batch's place when the caller
    /// walked the queue to it, so that it is not searched for again.
    /// `own`, when the caller estimated the batch's start on its own
    /// placement already (a page of the queue estimates its batches in
    /// one walk, [`Scheduler::estimates_in_order`]).
    pub(super) fn pending_info_at(
        &self,
        key: BatchKey,
        place: Place,
        own: Option<Option<DateTime<Utc>>>,
        now: DateTime<Utc>,
    ) -> Option<PendingInfo> {
        let batch = self.queue.get(key)?;
        // Fair share: the projects ahead of the batch's own, lowest first.
        let before = match self.fair.order() {
            Order::Strict => None,
            Order::FairShare => Some(self.projects_before(batch, now)?),
        };
        let position = match (&before, place) {
            (_, Place::Region(position)) => position,
            (None, _) => {
                let queue = self.queue.region(&batch.region)?;
                queue
                    .iter()
                    .position(|(_, k)| *k == key)
                    .map_or(0, |p| p + 1)
            }
            (Some(before), Place::InProject(within)) => queued_in_all(before) + within,
            (Some(before), Place::Unknown) => {
                let within = self
                    .queue
                    .project_queue(&batch.region, &batch.project)?
                    .iter()
                    .position(|(_, k)| *k == key)
                    .map_or(0, |p| p + 1);
                queued_in_all(before) + within
            }
        };
        let behind = before
            .as_deref()
            .and_then(|before| self.behind_projects(batch, before, now));
        let mut reasons: Vec<Blocker> = self
            .hold_of(&batch.region, &batch.project)
            .map(|(h, region_wide)| Blocker::Held {
                since: h.since,
                by: h.by.clone(),
                region_wide,
            })
            .into_iter()
            .collect();
        reasons.extend(self.blockers(batch));
        reasons.extend(behind);
        let estimated_start_time = if reasons.iter().any(|r| matches!(r, Blocker::Held { .. })) {
            None
        } else {
            let short = reasons.iter().any(|r| matches!(r, Blocker::Quota(_)));
            self.earliest_start(batch, before.as_deref(), short, own, now)
        };
        // Blocked by capacity alone: what preemption does for it.
        let by_capacity = !reasons.is_empty()
            && !reasons
                .iter()
                .any(|r| matches!(r, Blocker::Quota(_) | Blocker::Held { .. }));
        // New nodes for it: being created, or which a pool could create.
        let estimated_start_time = match self.provisioned_start(batch, by_capacity, now) {
            Some(t) => Some(estimated_start_time.map_or(t, |e| e.min(t))),
            None => estimated_start_time,
        };
        let mut reasons: Vec<Reason> = reasons.iter().map(Blocker::reason).collect();
        reasons.extend(
            self.provisioning_line(key, now)
                .map(|m| Reason::new(NotAdmitted::Provisioning, m)),
        );
        if by_capacity || self.is_claiming(key) {
            reasons.extend(
                self.preemption_reason(batch, now)
                    .map(|m| Reason::new(NotAdmitted::Preemption, m)),
            );
        }
        reasons.extend(
            self.alternative_reasons(batch, now)
                .into_iter()
                .map(|m| Reason::new(NotAdmitted::Alternative, m)),
        );
        if let Some(why) = likely_to_expire(estimated_start_time, batch.deadline) {
            reasons.push(Reason::new(NotAdmitted::LikelyToExpire, why));
        }
        Some(PendingInfo {
            queue_position: position,
            reasons,
            estimated_start_time,
        })
    }

    /// When `batch` could start, on its own placement (unless `short` of
    /// quota for it) or on one of its alternatives, whichever is first; `before`
    /// as for [`Self::ahead`].
    fn earliest_start(
        &self,
        batch: &PendingBatch,
        before: Option<&[ProjectAhead<'_>]>,
        short: bool,
        own: Option<Option<DateTime<Utc>>>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let (own, alternatives) = self.starts(batch, before, short, own, now);
        own.into_iter()
            .chain(alternatives.into_iter().flatten())
            .min()
    }

    /// When `batch` could start on its own placement (unless `short` of
    /// quota for it) and on each of its alternatives; `before` as for
    /// [`Self::ahead`].
    fn starts(
        &self,
        batch: &PendingBatch,
        before: Option<&[ProjectAhead<'_>]>,
        short: bool,
        known: Option<Option<DateTime<Utc>>>,
        now: DateTime<Utc>,
    ) -> (Option<DateTime<Utc>>, Vec<Option<DateTime<Utc>>>) {
        // The batches ahead, unless already estimated and without alternatives.
        let ahead = if known.is_some() && batch.alternatives.is_empty() {
            None
        } else {
            self.ahead(batch, before)
        };
        let own = match known {
            _ if short => None,
            Some(own) => own,
            None => ahead
                .as_deref()
                .and_then(|ahead| self.estimate_in_order(batch, ahead, now)),
        };
        let alternatives = batch
            .alternatives
            .iter()
            .map(|alternative| self.alternative_start(batch, alternative, ahead.as_deref(), now))
            .collect();
        (own, alternatives)
    }

    /// When `batch` could start on `alternative`, not before the alternative's delay: in
    /// its own region, behind what its own placement waits on (`ahead`;
    /// the alternative is tried at the batch's place); in another, behind that
    /// region's whole queue (a region alternative takes only what that queue
    /// leaves). None when its project lacks the alternative's quota, when more
    /// than [`ESTIMATE_DEPTH`] batches are ahead, or when it would wait on
    /// something without a ttl.
    pub(super) fn alternative_start(
        &self,
        batch: &PendingBatch,
        alternative: &crate::spec::alternatives::Alternative,
        ahead: Option<&[BatchKey]>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        if self
            .ledger
            .shortfall(
                &batch.project,
                &alternative.region,
                &alternative.cluster.quota,
            )
            .is_some()
        {
            return None;
        }
        let from = ripe_at(batch.queued_at, alternative).max(now);
        let elsewhere: Vec<BatchKey>;
        let ahead = if alternative.region == batch.region {
            ahead?
        } else {
            elsewhere = self
                .queue
                .region(&alternative.region)
                .into_iter()
                .flatten()
                .map(|(_, k)| *k)
                .take(ESTIMATE_DEPTH + 1)
                .collect();
            if elsewhere.len() > ESTIMATE_DEPTH {
                return None;
            }
            &elsewhere
        };
        let probe = PendingBatch {
            region: alternative.region.clone(),
            cluster: alternative.cluster.clone(),
            ..batch.clone()
        };
        self.estimate_in_order(&probe, ahead, from)
    }

    /// When a batch not queued yet (a validate-only create's `probe`)
    /// could start if it were queued now, on its own placement and on
    /// each of its alternatives.
    pub fn probe_starts(
        &self,
        probe: &PendingBatch,
        now: DateTime<Utc>,
    ) -> (Option<DateTime<Utc>>, Vec<Option<DateTime<Utc>>>) {
        let before = match self.fair.order() {
            Order::Strict => None,
            Order::FairShare => Some(self.projects_before(probe, now).unwrap_or_default()),
        };
        let short = self
            .ledger
            .shortfall(&probe.project, &probe.region, &probe.cluster.quota)
            .is_some();
        self.starts(probe, before.as_deref(), short, None, now)
    }

    /// The batches ahead of `batch` in its region's order, first first:
    /// strict order, or the queues of the projects `before` it (fair
    /// share) then its own project's. None when more than
    /// [`ESTIMATE_DEPTH`] are (no estimate).
    fn ahead(
        &self,
        batch: &PendingBatch,
        before: Option<&[ProjectAhead<'_>]>,
    ) -> Option<Vec<BatchKey>> {
        let mut out = Vec::new();
        let mut push = |k: BatchKey| {
            out.push(k);
            out.len() <= ESTIMATE_DEPTH
        };
        let own = (std::cmp::Reverse(batch.priority), batch.key);
        // A batch not queued (a validate-only probe) may be the first of
        // its region or of its project there.
        let keys: Box<dyn Iterator<Item = &QueueKey>> = match before {
            None => Box::new(
                self.queue
                    .region(&batch.region)
                    .into_iter()
                    .flat_map(move |q| q.range(..own)),
            ),
            Some(before) => {
                let projects = self.queue.projects_in(&batch.region);
                Box::new(
                    before
                        .iter()
                        .filter_map(move |p| projects?.get(p.project))
                        .flat_map(|q| q.iter())
                        .chain(
                            projects
                                .and_then(|p| p.get(&batch.project))
                                .into_iter()
                                .flat_map(move |q| q.range(..own)),
                        ),
                )
            }
        };
        for (_, k) in keys {
            if !push(*k) {
                return None;
            }
        }
        Some(out)
    }

    /// The projects with queued batches in `batch`'s region that come
    /// before its own in fair-share order at `now`, lowest usage ÷ weight
    /// first (the order `admit_fair` walks).
    fn projects_before<'a>(
        &'a self,
        batch: &PendingBatch,
        now: DateTime<Utc>,
    ) -> Option<Vec<ProjectAhead<'a>>> {
        let projects = self.queue.projects_in(&batch.region)?;
        let mine = (
            self.fair_key(&batch.region, &batch.project, now),
            batch.project.as_str(),
        );
        let mut before: Vec<ProjectAhead<'a>> = projects
            .iter()
            .map(|(p, q)| ProjectAhead {
                project: p.as_str(),
                share: self.fair.standing(&batch.region, p, now).share,
                queued: q.len(),
            })
            .filter(|p| (share_key(p.share), p.project) < mine)
            .collect();
        before.sort_unstable_by(|a, b| {
            (share_key(a.share), a.project).cmp(&(share_key(b.share), b.project))
        });
        Some(before)
    }

    /// Why a batch waits on the projects `before` its own in fair-share
    /// order, when any are.
    fn behind_projects(
        &self,
        batch: &PendingBatch,
        before: &[ProjectAhead<'_>],
        now: DateTime<Utc>,
    ) -> Option<Blocker> {
        (!before.is_empty()).then(|| Blocker::FairShare {
            batches: queued_in_all(before),
            projects: before.len(),
            ahead: before
                .iter()
                .take(3)
                .map(|p| (p.project.to_string(), p.share))
                .collect(),
            yours: self.fair.standing(&batch.region, &batch.project, now).share,
        })
    }

    /// Whether a request could ever fit: the quota limit and the region's
    /// declared capacity (every pool at its maximum node count, all free).
    pub fn never_fits(
        &self,
        project: &str,
        region: &str,
        cluster: &ClusterRequest,
    ) -> Option<String> {
        if let Some(s) = self.ledger.never_fits(project, region, &cluster.quota) {
            return Some(format!(
                "the request needs {} {}, above the project's quota limit of {} in {region} by {}",
                s.needed,
                s.metric,
                s.limit,
                s.needed - s.limit
            ));
        }
        let parts = needs(cluster);
        let mut best = 0;
        for nodes in self
            .declared
            .get(region)
            .into_iter()
            .flat_map(|z| z.values())
        {
            let plan = plan_zone(&nodes.iter().collect::<Vec<_>>(), &parts);
            if plan.complete() {
                return None;
            }
            best = best.max(plan.placed);
        }
        Some(format!(
            "the request needs all {} parts of {} in one zone, but the largest declared capacity of a zone of {region} holds {best} (short by {})",
            parts.len(),
            shape_text(cluster),
            parts.len() - best
        ))
    }

    /// What would happen to this request now (validate-only create).
    pub fn verdict(&self, project: &str, region: &str, cluster: &ClusterRequest) -> Verdict {
        if let Some(reason) = self.never_fits(project, region, cluster) {
            return Verdict::NeverFits { reason };
        }
        let probe = PendingBatch {
            key: BatchKey(i64::MAX),
            batch_id: String::new(),
            project: project.into(),
            region: region.into(),
            priority: 0,
            queued_at: DateTime::<Utc>::MIN_UTC,
            deadline: None,
            cluster: cluster.clone(),
            alternatives: Vec::new(),
            preemptions: 0,
        };
        let blockers = self.blockers(&probe);
        let queued_ahead = self.queue.has_queued(region);
        if blockers.is_empty() && !queued_ahead {
            let zone = self
                .best_zone(region, &needs(cluster))
                .map(|(z, _)| z)
                .unwrap_or_default();
            return Verdict::AllocateNow { zone };
        }
        let mut reasons: Vec<Reason> = blockers.iter().map(Blocker::reason).collect();
        if blockers.is_empty() {
            reasons.push(Reason::new(
                NotAdmitted::QueuedAhead,
                "earlier batches of the region's queue go first",
            ));
        }
        if cluster.mode == ProvisioningMode::Default {
            let quota = blockers.iter().any(|b| b.kind() == NotAdmitted::Quota);
            return Verdict::WouldFail {
                reason: messages(&reasons).join("; "),
                cause: if quota {
                    crate::api::EndReason::Quota
                } else {
                    crate::api::EndReason::StockOut
                },
            };
        }
        Verdict::WouldQueue { reasons }
    }
}

impl Scheduler {
    /// Why each placement alternative of a queued batch has not taken it,
    /// with numbers: not tried yet (and from when), or what stands in its
    /// way in its region.
    pub(super) fn alternative_reasons(
        &self,
        batch: &PendingBatch,
        now: DateTime<Utc>,
    ) -> Vec<String> {
        batch.alternatives
            .iter()
            .map(|alternative| {
                let name = format!(
                    "alternative {} ({})",
                    alternative.index,
                    AlternativeSpec {
                        target: alternative.target.clone(),
                        after_s: alternative.after_s,
                    }
                );
                let from = ripe_at(batch.queued_at, alternative);
                if from > now {
                    return format!(
                        "{name}: tried from {}",
                        from.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    );
                }
                if alternative.region != batch.region && self.queue.has_queued(&alternative.region) {
                    return format!(
                        "{name}: {} has batches of its own queued, and an alternative only takes what its queue leaves",
                        alternative.region
                    );
                }
                let probe = PendingBatch {
                    region: alternative.region.clone(),
                    cluster: alternative.cluster.clone(),
                    ..batch.clone()
                };
                let blockers = self.blockers(&probe);
                if blockers.is_empty() {
                    format!("{name}: fits now; tried at its place in the queue")
                } else {
                    let why: Vec<String> = blockers.iter().map(ToString::to_string).collect();
                    format!("{name}: {}", why.join("; "))
                }
            })
            .collect()
    }

    /// Why a batch can never be allocated, neither on its own placement
    /// nor on any of its alternatives (the reason of its own); None when
    /// one of them can.
    pub fn never_fits_anywhere(
        &self,
        project: &str,
        region: &str,
        request: &crate::spec::Request,
    ) -> Option<String> {
        let own = self.never_fits(project, region, &request.cluster)?;
        request
            .alternatives
            .iter()
            .all(|r| self.never_fits(project, &r.region, &r.cluster).is_some())
            .then_some(own)
    }
}

/// Said of a queued batch whose estimated start lies after its allocation
/// deadline: unless capacity frees sooner than estimated, it fails then.
fn likely_to_expire(
    estimated_start: Option<DateTime<Utc>>,
    deadline: Option<DateTime<Utc>>,
) -> Option<String> {
    let (start, deadline) = (estimated_start?, deadline?);
    let late = (start - deadline).to_std().ok().filter(|d| !d.is_zero())?;
    let seconds = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    Some(format!(
        "likely to expire: its estimated start {} is {} after its allocation deadline {} \
         (allocationTimeout); it fails then unless capacity frees sooner than estimated",
        seconds(start),
        humantime::format_duration(std::time::Duration::from_secs(late.as_secs())),
        seconds(deadline)
    ))
}
