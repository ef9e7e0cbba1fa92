//! Several replicas on one PostgreSQL: who leads, and how every core
//! learns what the others changed.
//!
//! - **Leadership.** The leader renews the leader lease every
//!   `database.leader_renew`, on its leadership session, where it holds the
//!   leader lock. Followers watch every [`WATCH_EVERY`] and take the lease
//!   when it lapsed or, at once, when the lock frees (the leader's session
//!   ended: it crashed). The one that holds it rebuilds its core from the
//!   database and decides; its commits carry its term, so once another
//!   replica took over they are refused (fencing). A leader that cannot
//!   renew for a whole lease, or whose session failed while it held the
//!   lock, stops deciding on its own.
//! - **Changes.** Every write transaction announces what it changed
//!   (`NOTIFY`, see [`crate::store::Change`]). Each replica listens and
//!   queues new batches, forgets ended ones, registers nodes, renews
//!   agents' leases and applies quota limits as they come. The leader's
//!   decisions reach a follower's core by a rebuild from the database, at
//!   most once per [`MIRROR_EVERY`] while decisions keep coming: its views
//!   (capacity, quotas, queue positions, metrics) lag by that much. After a
//!   gap in listening (a lost connection), the core is rebuilt.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::passes::rebuild;
use super::{DB_UNDER_LOCK, Engine, ReplicaRole};
use crate::scheduler::{BatchKey, NodeId};
use crate::store::{Change, Heard, LeaderSession, Takeover};

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
    tokio::spawn(lead(engine.clone(), shutdown.clone()));
    tokio::spawn(listen(engine.clone(), shutdown.clone()));
    tokio::spawn(refresh_mirror(engine, shutdown));
}

impl Engine {
    /// Asks a follower's core to be rebuilt from the database soon.
    pub(crate) fn refresh_mirror(&self) {
        self.shared.mirror.notify_one();
    }

    /// This replica now holds the lease in `term`: rebuild the core from
    /// the database and decide. Under the core's lock, which the handling
    /// of every announcement takes too: a create announced meanwhile was
    /// committed before its announcement, so it is either in what the
    /// rebuild reads or applied to the new core afterwards.
    /// `how` it was taken, or `None` for a leader's rebuild after a gap in
    /// its listening (no takeover).
    async fn take_lead(&self, term: i64, how: Option<Takeover>) {
        let started = Instant::now();
        let mut core = self.lock().await;
        let _taken = TakeoverEnds(self, term);
        // Checked and set as one step: a release between the two would
        // leave a replica leading in a term it no longer holds.
        if !self.lead_if_held(term) {
            // The lease was lost while this waited for the lock.
            return;
        }
        let shared = &self.shared;
        let fresh = tokio::time::timeout(
            DB_UNDER_LOCK,
            rebuild(&self.config(), &shared.store, Some(Some(term)), Some(&core)),
        )
        .await
        .unwrap_or_else(|_| {
            Err(crate::store::StoreError::Unavailable(
                "the rebuild did not answer".into(),
            ))
        });
        match fresh {
            Ok(fresh) => {
                *core = fresh;
                if let Some(how) = how {
                    crate::metrics::record_leader_change(how.name());
                }
                tracing::info!(
                    replica = %shared.replica_id, term, how = how.map(Takeover::name),
                    pending = core.pending_count(),
                    allocated = core.running_keys().len(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "leading: scheduler state rebuilt from the database"
                );
            }
            Err(e) => {
                // Decide on nothing half-read: let the lease go by and try
                // again.
                tracing::error!(error = %e, term, "cannot rebuild the scheduler state; not leading");
                self.set_role(ReplicaRole::Follower);
            }
        }
        drop(core);
        self.work_changed();
    }

    /// The database answers again after a fault `seen` (by the leadership
    /// session or the change stream) since `since`: the
    /// pooled connections opened before now may be ones the fault lost
    /// without a word, and are not used again
    /// ([`crate::store::Store::distrust_connections`]).
    fn database_back(&self, seen: &str, since: Instant) {
        self.shared.store.distrust_connections();
        crate::metrics::record_database_back(seen, since.elapsed());
        tracing::info!(
            replica = %self.shared.replica_id,
            seen,
            lost_ms = since.elapsed().as_millis() as u64,
            "the database answers again; connections opened before are not reused"
        );
    }

    /// The term the election loop holds, if any (terms start at 1).
    pub(crate) fn held_term(&self) -> Option<i64> {
        Some(self.shared.held_term.load(Ordering::SeqCst)).filter(|t| *t != 0)
    }

    pub(super) fn hold(&self, term: Option<i64>) {
        self.shared
            .held_term
            .store(term.unwrap_or(0), Ordering::SeqCst);
    }

    /// The election loop took the lease in `term`: its takeover (a rebuild
    /// under the core's lock) is under way until [`Self::take_lead`] ends.
    fn hold_taking(&self, term: i64) {
        self.shared.taking_term.store(term, Ordering::SeqCst);
        self.hold(Some(term));
    }

    /// Leads in `term` if the election loop still holds it, under the
    /// role's own lock: whoever gives the term up clears it before it
    /// reads the role ([`Self::release`]), so one of the two sees the
    /// other.
    fn lead_if_held(&self, term: i64) -> bool {
        let led = self.shared.role.send_if_modified(|role| {
            if self.held_term() != Some(term) {
                return false;
            }
            *role = ReplicaRole::Leader { term };
            true
        });
        if led {
            crate::metrics::set_role(&self.shared.replica_id, "leader", term);
            self.wake();
        }
        led
    }

    /// The role this replica announces (`/readyz`): leader from the
    /// moment the lease is held, as the database has it, through the
    /// takeover's rebuild (which waits for the core's lock, which a pass
    /// may hold a while) — and only while the term is still held and
    /// this replica did not step down in it.
    pub(crate) fn announced_role(&self) -> ReplicaRole {
        let role = self.role();
        let Some(term) = self.held_term() else {
            return match role {
                ReplicaRole::Single => ReplicaRole::Single,
                _ => ReplicaRole::Follower,
            };
        };
        let taking = self.shared.taking_term.load(Ordering::SeqCst) == term;
        if taking || role == (ReplicaRole::Leader { term }) {
            ReplicaRole::Leader { term }
        } else {
            ReplicaRole::Follower
        }
    }

    /// The lease is no longer held (lost or given up): stop deciding.
    /// Without waiting for the core's lock: a pass may hold it while its
    /// commit waits on a database that is gone, and that commit is fenced
    /// anyway.
    fn release(&self, why: &str) {
        self.hold(None);
        if self.role().decides() {
            tracing::warn!(replica = %self.shared.replica_id, reason = why, "no longer leading");
            self.set_role(ReplicaRole::Follower);
        }
        self.refresh_mirror();
    }

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

/// Ends the takeover of a term however [`Engine::take_lead`] returns.
struct TakeoverEnds<'a>(&'a Engine, i64);

impl Drop for TakeoverEnds<'_> {
    fn drop(&mut self) {
        let _ = self.0.shared.taking_term.compare_exchange(
            self.1,
            0,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }
}

/// How often a follower looks at the leader lock (and the lease): what a
/// failover after a crash waits at most, beside the new leader's rebuild.
const WATCH_EVERY: Duration = Duration::from_millis(25);

/// Takes or renews the leader lease, through this replica's leadership
/// session ([`LeaderSession`]): a leader renews every `leader_renew`; a
/// follower watches every [`WATCH_EVERY`] and claims the lease as soon as
/// the leader's session ended or its lease lapsed.
async fn lead(engine: Engine, shutdown: CancellationToken) {
    let config = engine.config();
    let db = &config.database;
    let (lease, every) = (db.leader_lease, db.leader_renew);
    // Every call on the session, its opening included, is bounded: a hung
    // session must not keep a leader from stepping down in time.
    let bound = lease / 2;
    let me = engine.shared.replica_id.clone();
    let store = engine.shared.store.clone();
    let mut session: Option<LeaderSession> = None;
    // The rebuild of a term just taken runs beside the renewals: a long
    // one (a deep queue) must not let the lease lapse.
    let mut taking: Option<tokio::task::JoinHandle<()>> = None;
    // Until when this replica may still count on its lease: from the
    // moment the renewal was sent, which is before the database stamped it.
    let mut valid_until = Instant::now();
    // The next renewal of a leader, or the next try after a failure.
    let mut next = Instant::now();
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Since when the leadership session has been failing: the database
    // was lost (a partition, a restart) until a session opens again.
    let mut lost_since: Option<Instant> = None;
    tracing::info!(replica = %me, lease_ms = lease.as_millis() as u64, "taking part in leader election");
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                if let Some(term) = engine.held_term() {
                    engine.release("shutting down");
                    let resigned = match session.as_mut() {
                        Some(s) => tokio::time::timeout(bound, s.resign(&me, term)).await,
                        None => tokio::time::timeout(bound, store.resign(&me, term)).await,
                    };
                    match resigned {
                        Ok(Ok(())) => tracing::info!(replica = %me, term, "leader lease given up"),
                        Ok(Err(e)) => tracing::warn!(error = %e, "cannot give the leader lease up; it lapses by itself"),
                        Err(_) => tracing::warn!("giving the leader lease up did not answer; it lapses by itself"),
                    }
                }
                if let Some(s) = session.take() {
                    s.close().await;
                }
                engine.shared.election_done.cancel();
                return;
            }
            _ = tick.tick() => {}
        }
        if Instant::now() < next {
            continue;
        }
        let held = engine.held_term();
        let s = match session.as_mut() {
            Some(s) => s,
            None => match tokio::time::timeout(bound, store.leader_session()).await {
                Ok(Ok(s)) => {
                    if let Some(since) = lost_since.take() {
                        engine.database_back("leadership", since);
                    }
                    session.insert(s)
                }
                failed => {
                    lost_since.get_or_insert_with(Instant::now);
                    let error = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "did not answer".into(),
                    };
                    tracing::warn!(error, "cannot open the leadership session");
                    next = Instant::now() + every;
                    if held.is_some() && Instant::now() >= valid_until {
                        engine.release("the leader lease could not be renewed in time");
                    }
                    continue;
                }
            },
        };
        if held.is_none() {
            match tokio::time::timeout(bound, s.watch()).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => continue,
                failed => {
                    if let Ok(Err(e)) = failed {
                        tracing::warn!(error = %e, "the leadership session failed; opening another");
                    } else {
                        tracing::warn!("the leadership session did not answer; opening another");
                    }
                    session = None;
                    lost_since.get_or_insert_with(Instant::now);
                    next = Instant::now() + every;
                    continue;
                }
            }
        }
        let sent = Instant::now();
        next = sent + every;
        let had_lock = s.locked();
        match tokio::time::timeout(bound, s.lead(&me, held, lease)).await {
            Ok(Ok(Some((term, how)))) => {
                valid_until = sent + lease;
                if held != Some(term) {
                    engine.hold_taking(term);
                    tracing::info!(replica = %me, term, how = how.name(), locked = s.locked(), "leader lease taken");
                    let taker = engine.clone();
                    taking = Some(tokio::spawn(async move {
                        taker.take_lead(term, Some(how)).await
                    }));
                } else if !engine.role().decides()
                    && taking.as_ref().is_none_or(|t| t.is_finished())
                {
                    // Stepped down (a refused commit, a failed rebuild),
                    // yet the lease is ours: give it up, and the lock, so
                    // another replica can lead.
                    engine.hold(None);
                    if !matches!(
                        tokio::time::timeout(bound, s.resign(&me, term)).await,
                        Ok(Ok(()))
                    ) {
                        session = None;
                    }
                }
            }
            Ok(Ok(None)) if held.is_some() => {
                engine.release("another replica holds the leader lease");
            }
            Ok(Ok(None)) => {}
            failed => {
                if let Ok(Err(e)) = failed {
                    tracing::warn!(error = %e, "cannot renew the leader lease");
                } else {
                    tracing::warn!(
                        waited_ms = bound.as_millis() as u64,
                        "the leader lease renewal did not answer"
                    );
                }
                // The session may be gone, and the lock with it.
                session = None;
                lost_since.get_or_insert_with(Instant::now);
                if held.is_some() {
                    if had_lock {
                        // A follower may take over as soon as it sees
                        // the lock free: stop deciding now, not when the
                        // lease runs out (the term fences us either way).
                        engine.release(
                            "the leadership session was lost, and the leader lock with it",
                        );
                    } else if Instant::now() >= valid_until {
                        engine.release("the leader lease could not be renewed in time");
                    }
                }
            }
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
