//! The scheduler loop: sleeps until an event or the next deadline (never a
//! fixed polling interval), runs a pass, commits its decisions, and only
//! then lets anyone see them.
//!
//! The core sits behind an async mutex held across pass *and* commit:
//! readers of the scheduler (quota and capacity views, queue positions)
//! never see a decision that is not yet durable, and never half of one.
//!
//! On SQLite flexq is one process and always decides. On PostgreSQL every
//! replica keeps a core, but only the holder of the leader lease
//! ([`super::replica`]) runs passes; the others keep theirs as a mirror of
//! the database for their views.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Instant;

use chrono::{DateTime, Utc};
use tokio::sync::{Mutex, MutexGuard, Notify, watch};
use tokio_util::sync::CancellationToken;

use super::core::{BatchKey, Decision, PendingBatch, Scheduler};
use crate::config::Config;
use crate::store::{Backend, Store, StoreError};

/// The longest a database call made under the core's lock may take.
pub(super) const DB_UNDER_LOCK: std::time::Duration = std::time::Duration::from_secs(30);

/// What this process does about scheduling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// The only process (SQLite): it always decides.
    Single,
    /// Holds the leader lease in `term`: it decides, fenced by the term.
    Leader { term: i64 },
    /// Another replica leads; this one serves the API.
    Follower,
}

impl Role {
    pub fn name(&self) -> &'static str {
        match self {
            Role::Single => "single",
            Role::Leader { .. } => "leader",
            Role::Follower => "follower",
        }
    }

    pub fn decides(&self) -> bool {
        !matches!(self, Role::Follower)
    }

    /// The fencing term of its commits.
    fn fence(&self) -> Option<i64> {
        match self {
            Role::Leader { term } => Some(*term),
            _ => None,
        }
    }
}

pub(super) struct Shared {
    core: Mutex<Scheduler>,
    wake: Notify,
    /// Bumped whenever what some node must run may have changed (an
    /// allocation, a release, a cancel, a report): agents' long polls wait
    /// on it.
    changes: watch::Sender<u64>,
    /// Bumped when driver output is stored (readers of the output wait on
    /// it; agents' polls do not).
    output: watch::Sender<u64>,
    pub(super) store: Store,
    pub(super) config: Arc<Config>,
    /// Taken under the core's lock, given up without it.
    role: watch::Sender<Role>,
    /// This replica's name in the leader lease.
    pub(super) replica_id: String,
    /// Asks a follower's core to be rebuilt from the database.
    pub(super) mirror: Notify,
    /// The core holds decisions the database does not: rebuild it before
    /// the next pass.
    pub(super) stale: AtomicBool,
    /// The term the leader election loop holds (0: none). A rebuild for a
    /// term that is no longer held does not make this replica lead.
    pub(super) held_term: AtomicI64,
    /// Fired when this replica no longer takes part in leader election
    /// (at once on SQLite): after shutdown, its lease is given up.
    pub(super) election_done: CancellationToken,
}

/// A handle on the running scheduler; cheap to clone.
#[derive(Clone)]
pub struct SchedulerService {
    pub(super) shared: Arc<Shared>,
}

impl SchedulerService {
    /// Rebuilds the scheduler from the config and the store, and starts
    /// its loop. Deadlines keep counting from the original queue times:
    /// batches whose deadline passed while flexq was down are failed by
    /// the first pass, before any admission.
    pub async fn start(
        config: Arc<Config>,
        store: Store,
        shutdown: CancellationToken,
    ) -> Result<SchedulerService, StoreError> {
        let replicated = store.backend() == Backend::Postgres;
        let role = if replicated {
            Role::Follower
        } else {
            Role::Single
        };
        let started = Instant::now();
        let core = rebuild(&config, &store, role.decides().then_some(None)).await?;
        tracing::info!(
            pending = core.pending_count(),
            allocated = core.running_keys().len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "scheduler state rebuilt from the store"
        );
        let replica_id = config
            .database
            .replica_id
            .clone()
            .unwrap_or_else(super::replica::default_replica_id);
        crate::metrics::set_role(&replica_id, role.name(), 0);
        let service = SchedulerService {
            shared: Arc::new(Shared {
                core: Mutex::new(core),
                wake: Notify::new(),
                changes: watch::channel(0).0,
                output: watch::channel(0).0,
                store,
                config,
                role: watch::channel(role).0,
                replica_id,
                mirror: Notify::new(),
                election_done: CancellationToken::new(),
                stale: AtomicBool::new(false),
                held_term: AtomicI64::new(0),
            }),
        };
        if replicated {
            super::replica::start(service.clone(), shutdown.clone());
        } else {
            service.shared.election_done.cancel();
        }
        let runner = service.clone();
        tokio::spawn(async move { runner.run(shutdown).await });
        service.wake();
        Ok(service)
    }

    /// Waits until, after shutdown, this replica has left leader election
    /// (having given its lease up if it led).
    pub async fn election_done(&self) {
        self.shared.election_done.cancelled().await;
    }

    /// What this process does about scheduling now.
    pub fn role(&self) -> Role {
        self.shared.role.borrow().clone()
    }

    /// Waits on changes of [`Self::role`].
    pub fn watch_role(&self) -> watch::Receiver<Role> {
        self.shared.role.subscribe()
    }

    pub fn replica_id(&self) -> &str {
        &self.shared.replica_id
    }

    /// Whether the database is shared by several replicas (PostgreSQL):
    /// changes then reach every core through the database's
    /// announcements, not through calls in this process.
    pub fn replicated(&self) -> bool {
        self.shared.store.backend() == Backend::Postgres
    }

    /// Changes the role. Taking the lead happens under the core's lock
    /// (see [`super::replica`]); stepping down need not.
    pub(super) fn set_role(&self, role: Role) {
        let term = role.fence().unwrap_or(0);
        crate::metrics::set_role(&self.shared.replica_id, role.name(), term);
        self.shared.role.send_replace(role);
        self.wake();
    }

    /// Asks for a pass soon. Wake-ups coalesce: many events, one pass.
    pub fn wake(&self) {
        crate::metrics::record_wake();
        self.shared.wake.notify_one();
    }

    /// Says that some node's work may have changed.
    pub fn work_changed(&self) {
        self.shared.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Waits on [`Self::work_changed`].
    pub fn watch_work(&self) -> watch::Receiver<u64> {
        self.shared.changes.subscribe()
    }

    /// Says that some batch's driver output grew.
    pub fn output_written(&self) {
        self.shared.output.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Waits on [`Self::output_written`].
    pub fn watch_output(&self) -> watch::Receiver<u64> {
        self.shared.output.subscribe()
    }

    /// Locks the core (for views and event application).
    pub async fn lock(&self) -> MutexGuard<'_, Scheduler> {
        self.shared.core.lock().await
    }

    /// A batch was stored: queue it and wake the loop. With several
    /// replicas the create's announcement queues it in the leader.
    pub async fn submitted(&self, batch: PendingBatch) {
        if !self.replicated() {
            self.lock().await.submit(batch);
        }
        self.wake();
    }

    /// A batch left the queue or gave back its cluster.
    pub async fn forget(&self, key: BatchKey) {
        self.lock().await.forget(key);
        self.wake();
    }

    async fn run(&self, shutdown: CancellationToken) {
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
                self.pass_once(Utc::now()).await;
            }
        }
    }

    /// One pass and its commit, under the core's lock.
    pub async fn pass_once(&self, now: DateTime<Utc>) {
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
        let started = Instant::now();
        let decisions = core.pass(now);
        let decide_time = started.elapsed();
        if decisions.is_empty() {
            crate::metrics::record_pass(decide_time, 0);
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
                .commit_decisions(&decisions, now, role.fence()),
        )
        .await
        .unwrap_or_else(|_| Err(StoreError::Unavailable("the commit did not answer".into())));
        match commit {
            Ok(applied) => {
                crate::metrics::record_commit(
                    "decisions",
                    commit_started.elapsed(),
                    decisions.len(),
                );
                let mut stale_core = false;
                for (d, ok) in decisions.iter().zip(applied) {
                    if ok {
                        log_decision(d, now);
                    } else if let Decision::LoseNode { node, .. } = d {
                        // The node registered again (on another replica)
                        // before this commit: it is not lost, and the
                        // clusters this pass dropped from memory still hold
                        // their capacity.
                        tracing::info!(node = %node, "decision void: the node registered again");
                        stale_core = true;
                    } else {
                        // The batch left the queue meanwhile (cancelled):
                        // the decision is void, give back what it took.
                        tracing::info!(
                            batch.seq = d.key().0,
                            "decision void: the batch is no longer queued"
                        );
                        core.forget(d.key());
                    }
                }
                if stale_core {
                    self.rebuild_after_void(&mut core, role.fence()).await;
                }
                crate::metrics::record_pass(started.elapsed(), decisions.len());
                if decisions
                    .iter()
                    .any(|d| matches!(d, Decision::Allocate(_) | Decision::LoseNode { .. }))
                {
                    self.work_changed();
                }
            }
            Err(StoreError::Fenced(why)) => {
                // Another replica took the lease: nothing of the pass was
                // written, and this core no longer decides.
                tracing::warn!(reason = %why, decisions = decisions.len(), "decisions refused: this replica no longer leads");
                crate::metrics::record_fenced();
                self.set_role(Role::Follower);
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
    async fn rebuild_after_void(&self, core: &mut Scheduler, fence: Option<i64>) {
        let fresh = tokio::time::timeout(
            DB_UNDER_LOCK,
            rebuild(&self.shared.config, &self.shared.store, Some(fence)),
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

fn log_decision(d: &Decision, now: DateTime<Utc>) {
    match d {
        Decision::Allocate(a) => {
            let gpus: usize = a.placements.iter().map(|p| p.gpus.len()).sum();
            let waited = (a.allocated_at - a.queued_at).to_std().unwrap_or_default();
            tracing::info!(batch.id = %a.batch_id, batch.seq = a.key.0, project = %a.project, region = %a.region, zone = %a.zone, gpus, wait_ms = waited.as_millis() as u64, "batch allocated");
            crate::metrics::record_admitted(&a.region, a.accelerator, waited);
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
        }
        Decision::Reject {
            key,
            batch_id,
            message,
            reason,
        } => {
            tracing::info!(batch.id = %batch_id, batch.seq = key.0, message = %message, "batch rejected (default mode, no room)");
            crate::metrics::record_rejected(reason, true);
        }
        Decision::LoseNode {
            node,
            failed,
            failed_ids,
            ..
        } => {
            tracing::warn!(node = %node, failed = failed.len(), "node lost: lease expired");
            for id in failed_ids {
                tracing::warn!(batch.id = %id, node = %node, "batch failed: node lost");
            }
            crate::metrics::record_lease_lost(failed.len());
        }
    }
}

/// The core as the store and config say it is. `decides` is `Some(fence)`
/// when this core decides (clusters whose nodes are gone are then failed
/// and released); a follower's mirror writes nothing.
pub(super) async fn rebuild(
    config: &Config,
    store: &Store,
    decides: Option<Option<i64>>,
) -> Result<Scheduler, StoreError> {
    let mut core = Scheduler::new(super::pools(config), config.quotas.clone());
    for node in super::virtual_nodes(config) {
        core.add_node(node);
    }
    for (project, region, metric, limit) in store.quota_overrides().await? {
        core.set_quota_limit(&project, &region, metric, limit);
    }
    // Agents keep heartbeating through a server restart; give every node a
    // full lease from now rather than failing them all at start.
    let lease = config.agents.lease_duration;
    let expires = Utc::now() + chrono::Duration::from_std(lease).unwrap_or_default();
    for (spec, epoch) in store.active_nodes().await? {
        core.register_node(spec, epoch, expires);
    }
    let mut orphans = Vec::new();
    for alloc in store.active_allocations().await? {
        let (key, batch_id) = (alloc.key, alloc.batch_id.clone());
        if !core.restore_allocation(alloc) {
            tracing::warn!(batch.id = %batch_id, batch.seq = key.0, "an allocated cluster no longer fits its nodes (config changed?)");
            orphans.push((key, batch_id));
        }
    }
    if let (false, Some(fence)) = (orphans.is_empty(), decides) {
        // Its nodes are gone from the config (virtual nodes removed, a
        // pool shrunk): fail the batch and release what the store holds,
        // like a lost node, rather than keep it provisioned forever.
        let (failed, failed_ids) = orphans.into_iter().unzip();
        let lost = Decision::LoseNode {
            node: super::NodeId("(configuration)".into()),
            epoch: None,
            failed,
            failed_ids,
            message: "The nodes of this batch's cluster are no longer declared in the configuration; the batch failed and its cluster was released.".into(),
        };
        store
            .commit_decisions(std::slice::from_ref(&lost), Utc::now(), fence)
            .await?;
        log_decision(&lost, Utc::now());
    }
    for batch in store.queued_batches(..).await? {
        core.submit(batch);
    }
    Ok(core)
}
