//! Several replicas on one PostgreSQL: how every core learns what the
//! others changed (who leads is `election.rs`).
//!
//! - **Changes.** Every write transaction announces what it changed
//!   (`NOTIFY`, see [`crate::store::Change`]). Each replica listens and
//!   queues new batches, forgets ended ones, registers nodes, renews
//!   agents' leases and applies quota limits as they come. The leader's
//!   decisions reach a follower's core by a rebuild from the database, at
//!   most once per [`MIRROR_EVERY`] while decisions keep coming: its views
//!   (capacity, quotas, queue positions, metrics) lag by that much. After a
//!   gap in listening (a lost connection), the core is rebuilt.

use std::time::{Duration, Instant};

use chrono::Utc;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::passes::rebuild;
use super::{DB_UNDER_LOCK, Engine, ReplicaRole};
use crate::scheduler::{BatchKey, NodeId};
use crate::store::{Change, Heard};

/// How often at most a follower rebuilds its core from the database.
pub(super) const MIRROR_EVERY: Duration = Duration::from_secs(1);

/// How long the listening connection may stay silent (its own pings, one a
/// second, included) before it is replaced.
const LISTEN_SILENCE: Duration = Duration::from_secs(3);

/// The host name, the process id and a random suffix: unique across
/// restarts, readable in `/readyz`.
pub(crate) fn default_replica_id() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "flexq".into());
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..6];
    format!("{host}-{}-{suffix}", std::process::id())
}

/// Starts the leadership loop, the change listener and the mirror refresh.
pub(crate) fn start(engine: Engine, shutdown: CancellationToken) {
    tokio::spawn(super::election::lead(engine.clone(), shutdown.clone()));
    tokio::spawn(listen(engine.clone(), shutdown.clone()));
    tokio::spawn(refresh_mirror(engine, shutdown));
}

impl Engine {
    /// Applies one announced change to this replica's core. What cannot be
    /// read now is not dropped: the core is rebuilt from the database.
    async fn apply(&self, change: Change) {
        if let Err(e) = self.try_apply(change).await {
            tracing::warn!(error = %e, "cannot apply an announced change; rebuilding");
            self.resync().await;
        }
    }

    async fn try_apply(&self, change: Change) -> Result<(), crate::store::StoreError> {
        let store = &self.shared.store;
        let lease =
            chrono::Duration::from_std(self.config().agents.lease_duration).unwrap_or_default();
        match change {
            Change::Created {
                first_seq,
                last_seq,
            } => {
                // The range may hold other transactions' batches too (seqs
                // interleave): submitting one twice is harmless.
                let mut core = self.lock().await;
                for b in self
                    .bounded(store.queued_batches(first_seq..=last_seq))
                    .await?
                {
                    core.submit(b);
                }
                drop(core);
                self.wake();
            }
            Change::Ended { seq } => {
                let now = Utc::now();
                let released = self.lock().await.forget(BatchKey(seq), now);
                self.count_released(released.as_ref(), now);
                self.wake();
                self.work_changed();
            }
            Change::Requeued { seq } => {
                // Its old cluster given back, the batch is queued again.
                let back = self.bounded(store.queued_batches(seq..=seq)).await?;
                let mut core = self.lock().await;
                let now = Utc::now();
                let released = core.forget(BatchKey(seq), now);
                self.count_released(released.as_ref(), now);
                for b in back {
                    core.submit(b);
                }
                drop(core);
                self.wake();
                self.work_changed();
            }
            Change::Node { id } => {
                if let Some((spec, epoch)) = store.active_node(&id).await? {
                    if !self
                        .lock()
                        .await
                        .register_node(spec, epoch, Utc::now() + lease)
                    {
                        tracing::warn!(node = %id, "the node registered a shape smaller than what it holds; keeping its old shape");
                    }
                }
                self.wake();
                self.work_changed();
            }
            Change::Quota => {
                let limits = store.quota_overrides().await?;
                let mut core = self.lock().await;
                for (project, region, metric, limit) in limits {
                    core.set_quota_limit(&project, &region, metric, limit);
                }
                drop(core);
                self.wake();
            }
            Change::Cordon => {
                let cordons = super::capacity::cordons_of(store.node_cordons().await?);
                self.lock().await.set_cordons(cordons);
                self.wake();
            }
            Change::Config { .. } => self.adopt_config().await?,
            Change::Hold => {
                let holds = super::queues::holds_of(store.queue_holds().await?);
                self.lock().await.set_holds(holds);
                self.wake();
            }
            Change::Decided => {
                if !self.role().decides() {
                    self.refresh_mirror();
                }
                self.work_changed();
            }
            Change::Extras { seq } => self.follow_extras(seq).await?,
            Change::Work => self.work_changed(),
            Change::Output { .. } => self.output_written(),
            Change::Heartbeat { epoch, node } => {
                // A refused renewal is the agent's to hear from the replica
                // it called; here it only keeps the lease in step.
                let _ = self
                    .lock()
                    .await
                    .heartbeat(&NodeId(node), epoch, Utc::now() + lease);
            }
            Change::Ping { .. } => {}
        }
        Ok(())
    }

    /// After a gap in the announcements: rebuild the core from the
    /// database (a leader's as a leader, fenced by its term).
    async fn resync(&self) {
        if let Err(e) = self.adopt_config().await {
            tracing::warn!(error = %e, "cannot read the config generation in force");
        }
        match self.role() {
            ReplicaRole::Leader { term } => self.take_lead(term, None).await,
            _ => self.refresh_mirror(),
        }
    }
}

/// Listens to the announcements; rebuilds after every gap. A connection
/// can die without a word (a proxy or NAT dropping it): this replica
/// announces a ping every second and, hearing nothing for
/// [`LISTEN_SILENCE`], listens anew and rebuilds.
async fn listen(engine: Engine, shutdown: CancellationToken) {
    let store = engine.shared.store.clone();
    let me = engine.shared.replica_id.clone();
    let mut pings: u64 = 0;
    // Since when listening has failed, after it once worked.
    let mut lost_since: Option<Instant> = None;
    loop {
        // Bounded: a connection opened into a partition may never answer.
        let mut changes = tokio::select! {
            _ = shutdown.cancelled() => return,
            l = tokio::time::timeout(LISTEN_SILENCE, store.listen()) => match l {
                Ok(Ok(l)) => l,
                failed => {
                    match failed {
                        Ok(Err(e)) => tracing::warn!(error = %e, "cannot listen for changes; retrying"),
                        _ => tracing::warn!("listening for changes did not answer; retrying"),
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
            },
        };
        if let Some(since) = lost_since.take() {
            engine.database_back("listening", since);
        }
        // Whatever was committed before this LISTEN (at start: before the
        // first rebuild may have read) is read again.
        tracing::info!("listening for changes");
        engine.resync().await;
        let mut heard = Instant::now();
        let mut ping = tokio::time::interval(Duration::from_secs(1));
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Announcements this version could not read: what they announced
        // is read from the database instead, at most once a second.
        let mut unread = Unread::default();
        loop {
            unread.resync_if_due(&engine).await;
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ping.tick() => {
                    if heard.elapsed() > LISTEN_SILENCE {
                        tracing::warn!(silent_ms = heard.elapsed().as_millis() as u64, "the connection that listens for changes went silent");
                        lost_since.get_or_insert_with(Instant::now);
                        break;
                    }
                    pings += 1;
                    let ping = Change::Ping { n: pings, replica: me.clone() };
                    // Bounded: a hung connection must not stop the loop
                    // that is to notice it.
                    match tokio::time::timeout(Duration::from_secs(1), store.announce_now(&ping)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::debug!(error = %e, "cannot announce a ping"),
                        Err(_) => tracing::debug!("announcing a ping did not answer"),
                    }
                    continue;
                }
                n = changes.next() => n,
            };
            match next {
                Some(Ok(announced)) => {
                    match announced {
                        Heard::Change(change) => engine.apply(change).await,
                        Heard::Unknown(payload) => {
                            tracing::warn!(
                                payload,
                                "unknown change announced; reading the database instead"
                            );
                            unread.heard();
                        }
                    }
                    // Heard, and done with it: time spent applying is not
                    // silence.
                    heard = Instant::now();
                }
                None => {
                    tracing::warn!("lost the connection that listens for changes");
                    lost_since.get_or_insert_with(Instant::now);
                    break;
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "listening for changes failed");
                    lost_since.get_or_insert_with(Instant::now);
                    break;
                }
            }
        }
    }
}

/// Announcements the change stream could not read (a replica of another
/// version, during a rolling upgrade): each may have been a create, so the
/// core is read again from the database, at most once a second.
#[derive(Default)]
struct Unread {
    pending: bool,
    last: Option<Instant>,
}

impl Unread {
    fn heard(&mut self) {
        self.pending = true;
    }

    async fn resync_if_due(&mut self, engine: &Engine) {
        if self.pending
            && self
                .last
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            self.pending = false;
            self.last = Some(Instant::now());
            engine.resync().await;
        }
    }
}

/// Rebuilds a follower's core when asked, at most every [`MIRROR_EVERY`].
async fn refresh_mirror(engine: Engine, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = engine.shared.mirror.notified() => {}
        }
        {
            let mut core = engine.lock().await;
            if engine.role().decides() {
                continue;
            }
            let shared = &engine.shared;
            let config = engine.config();
            let fresh = tokio::time::timeout(
                DB_UNDER_LOCK,
                rebuild(&config, &shared.store, None, Some(&core)),
            )
            .await;
            match fresh {
                Ok(Ok(fresh)) => *core = fresh,
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot refresh the scheduler mirror"),
                Err(_) => tracing::warn!("the scheduler mirror's refresh did not answer"),
            }
        }
        tokio::time::sleep(MIRROR_EVERY).await;
    }
}
