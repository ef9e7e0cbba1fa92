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
