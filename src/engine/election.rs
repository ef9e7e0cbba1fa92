//! Who leads (several replicas on one PostgreSQL). The leader renews the
//! leader lease every `database.leader_renew`, on its leadership session,
//! where it holds the leader lock. Followers watch every [`WATCH_EVERY`]
//! and take the lease when it lapsed or, at once, when the lock frees (the
//! leader's session ended: it crashed). The one that holds it rebuilds its
//! core from the database and decides; its commits carry its term, so once
//! another replica took over they are refused (fencing). A leader that
//! cannot renew for a whole lease, or whose session failed while it held
//! the lock, stops deciding on its own. What `/readyz` says of the role is
//! [`Engine::announced_role`].

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::passes::rebuild;
use super::{DB_UNDER_LOCK, Engine, ReplicaRole};
use crate::store::{LeaderSession, Takeover};

impl Engine {
    /// This replica now holds the lease in `term`: rebuild the core from
    /// the database and decide. Under the core's lock, which the handling
    /// of every announcement takes too: a create announced meanwhile was
    /// committed before its announcement, so it is either in what the
    /// rebuild reads or applied to the new core afterwards.
    /// `how` it was taken, or `None` for a leader's rebuild after a gap in
    /// its listening (no takeover).
    pub(super) async fn take_lead(&self, term: i64, how: Option<Takeover>) {
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
    pub(super) fn database_back(&self, seen: &str, since: Instant) {
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
pub(super) async fn lead(engine: Engine, shutdown: CancellationToken) {
    let mut election = Election::new(engine);
    let mut session: Option<LeaderSession> = None;
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tracing::info!(replica = %election.me, lease_ms = election.lease.as_millis() as u64, "taking part in leader election");
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                election.shut_down(session).await;
                return;
            }
            _ = tick.tick() => {}
        }
        if Instant::now() < election.next {
            continue;
        }
        election.round(&mut session).await;
    }
}

/// The election loop's state beside its leadership session.
struct Election {
    engine: Engine,
    me: String,
    store: crate::store::Store,
    lease: Duration,
    every: Duration,
    /// Every call on the session, its opening included, is bounded: a hung
    /// session must not keep a leader from stepping down in time.
    bound: Duration,
    /// The rebuild of a term just taken runs beside the renewals: a long
    /// one (a deep queue) must not let the lease lapse.
    taking: Option<tokio::task::JoinHandle<()>>,
    /// Until when this replica may still count on its lease: from the
    /// moment the renewal was sent, which is before the database stamped it.
    valid_until: Instant,
    /// The next renewal of a leader, or the next try after a failure.
    next: Instant,
    /// Since when the leadership session has been failing: the database
    /// was lost (a partition, a restart) until a session opens again.
    lost_since: Option<Instant>,
}

impl Election {
    /// The state of an election loop that starts now, from the config's
    /// lease and renewal period.
    fn new(engine: Engine) -> Self {
        let config = engine.config();
        let db = &config.database;
        let (lease, every) = (db.leader_lease, db.leader_renew);
        let bound = lease / 2;
        let me = engine.shared.replica_id.clone();
        let store = engine.shared.store.clone();
        Election {
            engine,
            me,
            store,
            lease,
            every,
            bound,
            taking: None,
            valid_until: Instant::now(),
            next: Instant::now(),
            lost_since: None,
        }
    }

    /// On shutdown: gives the lease up if held, closes the session, and
    /// says the election is done.
    async fn shut_down(&self, mut session: Option<LeaderSession>) {
        let (engine, me, bound) = (&self.engine, &self.me, self.bound);
        if let Some(term) = engine.held_term() {
            engine.release("shutting down");
            let resigned = match session.as_mut() {
                Some(s) => tokio::time::timeout(bound, s.resign(me, term)).await,
                None => tokio::time::timeout(bound, self.store.resign(me, term)).await,
            };
            match resigned {
                Ok(Ok(())) => tracing::info!(replica = %me, term, "leader lease given up"),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot give the leader lease up; it lapses by itself")
                }
                Err(_) => {
                    tracing::warn!("giving the leader lease up did not answer; it lapses by itself")
                }
            }
        }
        if let Some(s) = session.take() {
            s.close().await;
        }
        engine.shared.election_done.cancel();
    }

    /// One round of the election: opens a session if there is none, lets
    /// a follower watch for a free lock or a lapsed lease, then takes or
    /// renews the lease.
    async fn round(&mut self, session: &mut Option<LeaderSession>) {
        let held = self.engine.held_term();
        let s = match session.as_mut() {
            Some(s) => s,
            None => match self.open_session(held).await {
                Some(s) => session.insert(s),
                None => return,
            },
        };
        if held.is_none() {
            match tokio::time::timeout(self.bound, s.watch()).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => return,
                failed => {
                    if let Ok(Err(e)) = failed {
                        tracing::warn!(error = %e, "the leadership session failed; opening another");
                    } else {
                        tracing::warn!("the leadership session did not answer; opening another");
                    }
                    *session = None;
                    self.lost_since.get_or_insert_with(Instant::now);
                    self.next = Instant::now() + self.every;
                    return;
                }
            }
        }
        let sent = Instant::now();
        self.next = sent + self.every;
        let had_lock = s.locked();
        match tokio::time::timeout(self.bound, s.lead(&self.me, held, self.lease)).await {
            Ok(Ok(Some((term, how)))) => {
                self.valid_until = sent + self.lease;
                if !self.lease_held(s, held, term, how).await {
                    *session = None;
                }
            }
            Ok(Ok(None)) if held.is_some() => {
                self.engine
                    .release("another replica holds the leader lease");
            }
            Ok(Ok(None)) => {}
            failed => {
                self.renewal_failed(session, failed.ok().and_then(Result::err), held, had_lock)
            }
        }
    }

    /// Opens the leadership session; on failure counts the database as
    /// lost, tries again after a renewal period, and stops leading once the
    /// lease can no longer be counted on.
    async fn open_session(&mut self, held: Option<i64>) -> Option<LeaderSession> {
        match tokio::time::timeout(self.bound, self.store.leader_session()).await {
            Ok(Ok(s)) => {
                if let Some(since) = self.lost_since.take() {
                    self.engine.database_back("leadership", since);
                }
                Some(s)
            }
            failed => {
                self.lost_since.get_or_insert_with(Instant::now);
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "did not answer".into(),
                };
                tracing::warn!(error, "cannot open the leadership session");
                self.next = Instant::now() + self.every;
                if held.is_some() && Instant::now() >= self.valid_until {
                    self.engine
                        .release("the leader lease could not be renewed in time");
                }
                None
            }
        }
    }

    /// The lease is ours in `term`: a term newly taken starts its takeover;
    /// one held after stepping down is given up. Answers whether the session
    /// is still good.
    async fn lease_held(
        &mut self,
        s: &mut LeaderSession,
        held: Option<i64>,
        term: i64,
        how: Takeover,
    ) -> bool {
        if held != Some(term) {
            self.engine.hold_taking(term);
            tracing::info!(replica = %self.me, term, how = how.name(), locked = s.locked(), "leader lease taken");
            let taker = self.engine.clone();
            self.taking = Some(tokio::spawn(async move {
                taker.take_lead(term, Some(how)).await
            }));
        } else if !self.engine.role().decides()
            && self.taking.as_ref().is_none_or(|t| t.is_finished())
        {
            // Stepped down (a refused commit, a failed rebuild),
            // yet the lease is ours: give it up, and the lock, so
            // another replica can lead.
            self.engine.hold(None);
            if !matches!(
                tokio::time::timeout(self.bound, s.resign(&self.me, term)).await,
                Ok(Ok(()))
            ) {
                return false;
            }
        }
        true
    }

    /// The lease could not be renewed (`error`, or no answer): the session
    /// is dropped, and a leader stops deciding once a follower may have
    /// taken over.
    fn renewal_failed(
        &mut self,
        session: &mut Option<LeaderSession>,
        error: Option<crate::store::StoreError>,
        held: Option<i64>,
        had_lock: bool,
    ) {
        if let Some(e) = error {
            tracing::warn!(error = %e, "cannot renew the leader lease");
        } else {
            tracing::warn!(
                waited_ms = self.bound.as_millis() as u64,
                "the leader lease renewal did not answer"
            );
        }
        // The session may be gone, and the lock with it.
        *session = None;
        self.lost_since.get_or_insert_with(Instant::now);
        if held.is_some() {
            if had_lock {
                // A follower may take over as soon as it sees
                // the lock free: stop deciding now, not when the
                // lease runs out (the term fences us either way).
                self.engine
                    .release("the leadership session was lost, and the leader lock with it");
            } else if Instant::now() >= self.valid_until {
                self.engine
                    .release("the leader lease could not be renewed in time");
            }
        }
    }
}
