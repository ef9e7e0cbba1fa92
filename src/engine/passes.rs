//! The scheduler loop: wakes on events or the next deadline (never a
//! fixed polling interval), runs a pass of the core, commits its decisions
//! in one transaction, and only then lets anyone see them; the core's
//! rebuild from the store.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Instant;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::{DB_UNDER_LOCK, Engine, ReplicaRole};
use crate::api::EndReason;
use crate::config::Config;
use crate::scheduler::{BatchKey, Decision, ExtraChange, Scheduler, SuspendCause, Void, lifecycle};
use crate::store::{Store, StoreError};

impl Engine {
    pub(super) async fn run(&self, shutdown: CancellationToken) {
        loop {
            let next = self.lock().await.next_deadline();
            let sleep = async {
                match next {
                    Some(deadline) => {
                        let wait = (deadline - Utc::now()).to_std().unwrap_or_default();
                        tokio::time::sleep(wait).await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => {
                    tracing::info!("scheduler stopped");
                    return;
                }
                _ = self.shared.wake.notified() => {}
                _ = sleep => {}
            }
            if self.role().decides() {
                self.pass_once().await;
            }
        }
    }

    /// One pass and its commit, under the core's lock. The pass's `now`
    /// (its decisions' time: allocation, expiry) is read under the lock,
    /// after every change the core holds: a release another replica
    /// committed, which this core applied while the pass waited for the
    /// lock, is then never stamped later than the allocation that reuses
    /// its GPUs, and no batch is allocated at a time before the moment
    /// its allocation was decided (its deadline is checked against the
    /// real time).
    pub async fn pass_once(&self) {
        let mut core = self.lock().await;
        let role = self.role();
        if !role.decides() {
            return;
        }
        if self.shared.stale.load(Ordering::SeqCst) {
            self.rebuild_after_void(&mut core, role.fence()).await;
            if self.shared.stale.load(Ordering::SeqCst) {
                drop(core);
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                self.wake();
                return;
            }
        }
        let now = Utc::now();
        let started = Instant::now();
        let decisions = core.pass(now);
        // What the queue left, running elastic clusters may grow into;
        // extras taken back in the pass are in it too, committed with the
        // allocations that use their GPUs.
        let extras = core.grow(now);
        let decide_time = started.elapsed();
        if decisions.is_empty() && extras.is_empty() {
            crate::metrics::record_pass(decide_time, 0);
            // What an earlier leader left to the provisioners' programs.
            self.start_programs(&core, role.fence());
            return;
        }
        let commit_started = Instant::now();
        // Bounded: the core's lock is held, and a connection can hang
        // without an error (a half-open socket); a dropped transaction is
        // rolled back.
        let commit = tokio::time::timeout(
            DB_UNDER_LOCK,
            self.shared
                .store
                .commit_pass(&decisions, &extras, now, role.fence()),
        )
        .await
        .unwrap_or_else(|_| Err(StoreError::Unavailable("the commit did not answer".into())));
        match commit {
            Ok((applied, extras_applied)) => {
                crate::metrics::record_commit(
                    "decisions",
                    commit_started.elapsed(),
                    decisions.len(),
                );
                // What each written or void decision means is the core's.
                let committed = core.settle_commit(&decisions, &applied, now);
                for cluster in &committed.released {
                    super::record_release(cluster, now);
                }
                if !committed.released.is_empty() {
                    // Their preemptor may be allocated now: another pass.
                    self.wake();
                }
                if extras
                    .iter()
                    .any(|c| matches!(c, ExtraChange::Reclaimed { .. }))
                {
                    // The batch they went back for counted as waiting in
                    // this pass's walk: the next one says what waits now.
                    self.wake();
                }
                let requeued = self.requeue(&mut core, &committed.requeued).await;
                let void: HashMap<usize, Void> = committed.void.iter().copied().collect();
                for (i, d) in decisions.iter().enumerate() {
                    match void.get(&i) {
                        None => log_decision(d, now, &requeued),
                        Some(why) => log_void(d, *why),
                    }
                }
                for (change, _) in extras.iter().zip(&extras_applied).filter(|(_, ok)| **ok) {
                    let owner = core.allocation(change.key());
                    let (region, project) = owner
                        .map(|a| (a.region.clone(), a.project.clone()))
                        .unwrap_or_default();
                    super::elastic::log_extra(change, &region, &project, now);
                }
                // A change not written (its batch ended or began stopping
                // meanwhile, its extra already gone): the core holds what
                // the store does not; start again from the store.
                if committed.rebuild || extras_applied.contains(&false) {
                    self.rebuild_after_void(&mut core, role.fence()).await;
                }
                crate::metrics::record_pass(started.elapsed(), decisions.len());
                for ((region, zone, pool), boot) in core.take_completed_sets() {
                    tracing::info!(zone = %zone, pool = %pool, boot_ms = boot.as_millis() as u64, "every node of a set registered: its batch is allocated");
                    let labels = (region.as_str(), zone.as_str(), pool.as_str());
                    crate::metrics::record_provisioning(labels, "allocated");
                    crate::metrics::record_boot(labels, boot);
                }
                self.start_programs(&core, role.fence());
                if !extras.is_empty()
                    || decisions.iter().any(|d| {
                        matches!(
                            d,
                            Decision::Allocate(_)
                                | Decision::LoseNode { .. }
                                | Decision::Preempt(_)
                        )
                    })
                {
                    self.work_changed();
                }
            }
            Err(StoreError::Fenced(why)) => {
                // Another replica took the lease: nothing of the pass was
                // written, and this core no longer decides.
                tracing::warn!(reason = %why, decisions = decisions.len(), "decisions refused: this replica no longer leads");
                crate::metrics::record_fenced();
                // The term is no longer this replica's: /readyz, which says
                // leader from the lease's taking on, must not say so.
                self.hold(None);
                self.set_role(ReplicaRole::Follower);
                drop(core);
                self.refresh_mirror();
            }
            Err(e) => {
                // Nothing of the pass is durable: start again from what is.
                tracing::error!(error = %e, decisions = decisions.len(), "cannot commit the scheduler's decisions; rebuilding from the store");
                self.rebuild_after_void(&mut core, role.fence()).await;
                drop(core);
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                self.wake();
            }
        }
    }

    /// Replaces the core by what the database holds, after a pass whose
    /// decisions were not all written. Until that succeeds no pass runs: a
    /// core holding allocations that were never committed would keep their
    /// capacity, and their batches, out of reach for good.
    /// Batches sent back to the queue (an infrastructure failure, a
    /// preemption) go into `core` again, read back from the store under
    /// the core's lock, bounded: the one way a requeued batch re-enters
    /// the core. What cannot be read now marks the core stale, rebuilt
    /// from the database before the next pass. Answers the keys queued
    /// again (a batch with no retry left is not).
    pub(super) async fn requeue(
        &self,
        core: &mut Scheduler,
        keys: &[BatchKey],
    ) -> HashSet<BatchKey> {
        let mut back = HashSet::new();
        for key in keys {
            match self
                .bounded(self.shared.store.queued_batches(key.0..=key.0))
                .await
            {
                Ok(batches) => {
                    for b in batches {
                        back.insert(b.key);
                        core.submit(b);
                    }
                }
                Err(e) => {
                    // The rebuild reads every queued batch: no need to try
                    // the rest now.
                    tracing::error!(batch.seq = key.0, error = %e, "cannot queue a requeued batch again; rebuilding");
                    self.shared.stale.store(true, Ordering::SeqCst);
                    break;
                }
            }
        }
        back
    }

    pub(super) async fn rebuild_after_void(&self, core: &mut Scheduler, fence: Option<i64>) {
        let fresh = tokio::time::timeout(
            DB_UNDER_LOCK,
            rebuild(&self.config(), &self.shared.store, Some(fence), Some(core)),
        )
        .await
        .unwrap_or_else(|_| Err(StoreError::Unavailable("the rebuild did not answer".into())));
        match fresh {
            Ok(fresh) => {
                *core = fresh;
                self.shared.stale.store(false, Ordering::SeqCst);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot rebuild the scheduler state; no pass until it can");
                self.shared.stale.store(true, Ordering::SeqCst);
            }
        }
    }
}

fn log_void(d: &Decision, why: Void) {
    match (why, d) {
        (Void::PreemptionWithdrawn, Decision::Preempt(p)) => {
            tracing::info!(batch.id = %p.preemptor_id, "preemption not carried out")
        }
        (Void::NodeBack, Decision::LoseNode { node, .. }) => {
            tracing::info!(node = %node, "decision void: the node registered again")
        }
        _ => tracing::info!(
            batch.seq = d.key().0,
            "decision void: the batch is no longer queued"
        ),
    }
}

fn log_decision(d: &Decision, now: DateTime<Utc>, requeued: &HashSet<BatchKey>) {
    match d {
        Decision::Allocate(a) => {
            let gpus = a.gpus();
            let waited = (a.allocated_at - a.queued_at).to_std().unwrap_or_default();
            tracing::info!(batch.id = %a.batch_id, batch.seq = a.key.0, project = %a.project, region = %a.region, zone = %a.zone, gpus, wait_ms = waited.as_millis() as u64, alternative = a.alternative_index(), "batch allocated");
            crate::metrics::record_admitted(&a.region, a.accelerator, waited);
            let asked = a.alternative.as_ref().map_or(a.accelerator, |r| r.asked);
            crate::metrics::record_alternative(a.alternative_index(), asked, a.accelerator);
        }
        Decision::Expire {
            key,
            batch_id,
            message,
            region,
            accelerator,
        } => {
            tracing::info!(batch.id = %batch_id, batch.seq = key.0, at = %now, message = %message, "batch expired");
            crate::metrics::record_expired(region, accelerator);
            crate::metrics::record_ended(EndReason::Expired);
        }
        Decision::Reject {
            key,
            batch_id,
            message,
            reason,
        } => {
            tracing::info!(batch.id = %batch_id, batch.seq = key.0, message = %message, "batch rejected (default mode, no room)");
            crate::metrics::record_rejected(reason.label(), true);
            crate::metrics::record_ended(*reason);
        }
        Decision::Preempt(p) => {
            let victims: Vec<&str> = p.victims.iter().map(|v| v.batch_id.as_str()).collect();
            tracing::info!(batch.id = %p.preemptor_id, batch.seq = p.preemptor.0, project = %p.project, region = %p.region, zone = %p.zone, victims = ?victims, gpus = p.gpus(), "batch preempts");
            for v in &p.victims {
                tracing::info!(batch.id = %v.batch_id, batch.seq = v.key.0, project = %v.project, by = %p.preemptor_id, cause = %v.cause, gpu_seconds = v.gpu_seconds, at_once = v.at_once, "batch preempted");
            }
            crate::metrics::record_preemption(p);
        }
        Decision::Provision(set) => {
            tracing::info!(batch.id = %set.batch_id, batch.seq = set.key.0, project = %set.project, region = %set.region, zone = %set.zone, pool = %set.pool, slots = ?set.slots, register_by = %set.register_by, "provisioning nodes for a batch");
            crate::metrics::record_provisioning((&set.region, &set.zone, &set.pool), "decided");
        }
        Decision::Suspend(s) => match &s.cause {
            SuspendCause::Idle => {
                tracing::info!(zone = %s.zone, pool = %s.pool, nodes = ?s.nodes, why = %s.message, "suspending idle nodes");
            }
            SuspendCause::Lost { .. } => {
                tracing::warn!(zone = %s.zone, pool = %s.pool, nodes = ?s.nodes, why = %s.message, "suspending a lost node: its machine may still be up");
            }
            SuspendCause::Failed {
                key,
                batch_id,
                backoff_until,
            } => {
                tracing::warn!(batch.id = %batch_id, batch.seq = key.0, zone = %s.zone, pool = %s.pool, nodes = ?s.nodes, why = %s.message, backoff_until = %backoff_until, "provisioning failed: the batch stays queued; suspending its nodes");
                crate::metrics::record_provisioning((&s.region, &s.zone, &s.pool), "failed");
            }
            SuspendCause::Abandoned { key, batch_id } => {
                tracing::info!(batch.id = %batch_id, batch.seq = key.0, zone = %s.zone, pool = %s.pool, nodes = ?s.nodes, "provisioning abandoned: the batch left the queue; suspending its nodes");
                crate::metrics::record_provisioning((&s.region, &s.zone, &s.pool), "abandoned");
            }
        },
        Decision::LoseNode {
            node,
            failed,
            failed_ids,
            released,
            ..
        } => {
            tracing::warn!(node = %node, batches = failed.len(), "node lost: lease expired");
            let mut back = 0;
            for (key, id) in failed.iter().zip(failed_ids) {
                if requeued.contains(key) {
                    back += 1;
                    tracing::warn!(batch.id = %id, batch.seq = key.0, node = %node, "batch requeued after an infrastructure failure: node lost");
                } else {
                    tracing::warn!(batch.id = %id, batch.seq = key.0, node = %node, "batch failed: node lost");
                    // (A batch already being cancelled ends CANCELLED; the
                    // core cannot tell it from the others here.)
                    crate::metrics::record_ended(EndReason::Infrastructure);
                }
            }
            crate::metrics::record_lease_lost(failed.len() - back, back);
            // A pass runs only on the replica that schedules.
            for cluster in released {
                super::record_release(cluster, now);
            }
        }
    }
}

/// The core as the store and config say it is. `decides` is `Some(fence)`
/// when this core decides (clusters whose nodes are gone are then failed
/// and released); a follower's mirror writes nothing.
pub(crate) async fn rebuild(
    config: &Config,
    store: &Store,
    decides: Option<Option<i64>>,
    old: Option<&Scheduler>,
) -> Result<Scheduler, StoreError> {
    let mut core = Scheduler::with_layout(config.layout());
    // Past usage orders the queues in fair share: the same order on every
    // replica and after every restart, because it is read from the store.
    if config.scheduling.order == crate::config::QueueOrder::FairShare {
        read_past_usage(&mut core, store).await?;
    }
    // Virtual nodes a reload retired may still hold clusters: they stay
    // until those end, as in the core this one replaces.
    if let Some(old) = old {
        core.keep_virtual_nodes(old.virtual_node_specs());
    }
    for (project, region, metric, limit) in store.quota_overrides().await? {
        core.set_quota_limit(&project, &region, metric, limit);
    }
    core.set_holds(super::queues::holds_of(store.queue_holds().await?));
    core.set_cordons(super::capacity::cordons_of(store.node_cordons().await?));
    // Agents keep heartbeating through a server restart; give every node a
    // full lease from now rather than failing them all at start.
    let lease = config.agents.lease_duration;
    let expires = Utc::now() + chrono::Duration::from_std(lease).unwrap_or_default();
    let mut registered = HashSet::new();
    for (spec, epoch) in store.active_nodes().await? {
        let id = spec.id.clone();
        registered.insert(id.0.clone());
        if !core.register_node(spec, epoch, expires) {
            tracing::warn!(node = %id, "the node registered a shape smaller than what it holds; keeping its old shape");
        }
    }
    let mut orphans = Vec::new();
    let mut orphaned = None;
    for alloc in store.active_allocations().await? {
        let (key, batch_id) = (alloc.key, alloc.batch_id.clone());
        if !core.restore_allocation(alloc) {
            tracing::warn!(batch.id = %batch_id, batch.seq = key.0, "an allocated cluster no longer fits its nodes (config changed?)");
            orphans.push((key, batch_id));
        }
    }
    if let (Some(lost), Some(fence)) = (lifecycle::orphaned(orphans), decides) {
        store
            .commit_decisions(std::slice::from_ref(&lost), Utc::now(), fence)
            .await?;
        let keys = match &lost {
            Decision::LoseNode { failed, .. } => failed.clone(),
            _ => Vec::new(),
        };
        // Read back with every queued batch below, then logged.
        orphaned = Some((lost, keys));
    }
    store
        .each_queued_batch(.., |batch| core.submit(batch))
        .await?;
    if let Some((lost, keys)) = orphaned {
        let requeued: HashSet<BatchKey> = keys.into_iter().filter(|k| core.is_queued(*k)).collect();
        log_decision(&lost, Utc::now(), &requeued);
    }
    // Preemptions under way: their victims keep stopping, their clusters
    // go to their preemptors.
    for (victim, preemptor) in store.stopping_victims().await? {
        core.restore_stopping(victim, preemptor);
    }
    // Sets of new nodes being created, and nodes being suspended
    // (docs/rules.md#provisioned-capacity): adopted as they are.
    for stored in store.open_sets().await? {
        let up: Vec<_> = stored
            .set
            .slots
            .iter()
            .filter(|s| registered.contains(&s.0))
            .cloned()
            .collect();
        core.restore_set(stored.set, &up);
    }
    core.restore_suspending(store.suspending_nodes().await?);
    crate::metrics::declare_provisioned_pools(config);
    // Each pool's boot time, as its last sets took (start estimates).
    for (pool, boot) in store.recent_boots().await? {
        core.restore_boot(pool, boot);
    }
    core.settle_layout();
    Ok(core)
}

/// Records in `core` the usage of the clusters that ended within its
/// memory (ten half-lives), read from the store.
pub(crate) async fn read_past_usage(core: &mut Scheduler, store: &Store) -> Result<(), StoreError> {
    let memory = chrono::Duration::from_std(core.usage_memory()).unwrap_or(chrono::Duration::MAX);
    let since = Utc::now()
        .checked_sub_signed(memory)
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    for part in store.released_since(since).await? {
        core.record_past_usage(
            &part.region,
            &part.project,
            (part.gpus, part.accelerator),
            part.allocated_at,
            part.released_at,
        );
    }
    Ok(())
}
