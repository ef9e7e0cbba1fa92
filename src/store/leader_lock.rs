//! The leadership session: a failover in milliseconds after a crash.
//!
//! A lease alone makes the replicas wait for a dead leader's lease to run
//! out (`database.leader_lease`, 2 s). But a crashed leader's database
//! session ends at once (the kernel closes its socket), and PostgreSQL
//! knows it: every replica keeps one session of its own, the
//! **leadership session**, on which the leader holds a session-level
//! advisory lock, the **leader lock**, and renews the lease, writing in
//! the lease row whether it held the lock (`locked`). A follower tries the
//! lock every [`WATCH`](crate::engine) tick, and only while the row says
//! its holder held it (or the lease lapsed): getting it proves the
//! holder's locked session ended, so the follower may take the lease
//! though it is live.
//!
//! The lock only decides *when* a follower may claim; what a partition
//! makes ambiguous is still decided by the lease and the term. A leader
//! whose process lives on after its session ended (cut off, its session
//! killed) is fenced by the term at its next commit or renewal, exactly as
//! when its lease lapsed. A leader cut off without a word keeps its
//! session (and the lock) on the server until `idle_session_timeout` (one
//! lease, PostgreSQL 14 and newer) or the TCP keepalives end it; its lease
//! lapses meanwhile and a follower takes over as before, without the lock.

use sqlx::any::Any;
use sqlx::{AnyConnection, Connection};

use super::{Backend, Store, StoreError};

/// The database's clock, in unix microseconds.
pub(super) const DB_NOW_US: &str = "(extract(epoch from clock_timestamp()) * 1000000)::bigint";

/// The session-level advisory lock of the leader: "flexq\0\0\2" in ASCII
/// (the write lock is "flexq\0\0\1").
const LEADER_LOCK: i64 = 0x666c_6578_7100_0002;

/// How a replica came to hold a term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// The lease had lapsed, was given up, or was never taken.
    Lapsed,
    /// The lease was live, but its holder's locked session had ended: the
    /// leader lock was free.
    Locked,
    /// This replica's own live lease, in a new term (it had lost track
    /// of its term, or stepped down and led again).
    Own,
}

impl Takeover {
    /// The label of `flexq_scheduler_leader_takeovers_total`.
    pub fn name(self) -> &'static str {
        match self {
            Takeover::Lapsed => "lapse",
            Takeover::Locked => "lock",
            Takeover::Own => "own",
        }
    }
}

/// Takes the lease for `me` when it is free or lapsed, or live while
/// `locked` (the caller holds the leader lock) and its holder said it held
/// the lock; renews it when `me` holds term `held`. Records `locked`.
/// Answers the term `me` holds after the call and how the lease stood
/// before, or `None` when another replica keeps it.
///
/// One statement: the lease row's lock never outlives it, so a replica cut
/// off in the middle of a renewal holds nothing another must wait for.
pub(super) async fn claim<'c>(
    db: impl sqlx::Executor<'c, Database = Any>,
    me: &str,
    held: Option<i64>,
    lease: std::time::Duration,
    locked: bool,
) -> Result<Option<(i64, Takeover)>, StoreError> {
    let row: Option<(i64, String)> = sqlx::query_as(&format!(
        "with before as (select expires_at < {DB_NOW_US} as lapsed, holder = $1 as mine \
         from leader_lease where id = 1), \
         taken as (update leader_lease set \
         term = case when holder = $1 and term = $2 then term else term + 1 end, \
         holder = $1, expires_at = {DB_NOW_US} + $3, locked = $4 \
         where id = 1 and (holder = $1 or expires_at < {DB_NOW_US} or ($4 and locked)) \
         returning term), \
         logged as (insert into leader_terms (term, holder, started_at) \
         select term, $1, {DB_NOW_US} from taken where term <> $2) \
         select taken.term, case when before.lapsed then 'lapse' \
         when before.mine then 'own' else 'lock' end from taken, before"
    ))
    .bind(me)
    .bind(held.unwrap_or(-1))
    .bind(lease.as_micros() as i64)
    .bind(locked)
    .fetch_optional(db)
    .await?;
    Ok(row.map(|(term, how)| {
        let how = match how.as_str() {
            "lapse" => Takeover::Lapsed,
            "own" => Takeover::Own,
            _ => Takeover::Locked,
        };
        (term, how)
    }))
}

/// A replica's leadership session (see the module's text). Any error on
/// it means the session may be gone, and the lock with it: the caller
/// drops it and opens another, never reuses it.
pub struct LeaderSession {
    conn: AnyConnection,
    /// Whether this session holds the leader lock.
    locked: bool,
}

impl Store {
    /// Opens this replica's leadership session (PostgreSQL).
    pub async fn leader_session(&self) -> Result<LeaderSession, StoreError> {
        if self.backend != Backend::Postgres {
            return Err(StoreError::Unavailable(
                "leader election needs PostgreSQL".into(),
            ));
        }
        let mut conn = AnyConnection::connect(&self.leadership_url).await?;
        // A session the server sees idle for a lease belongs to a replica
        // cut off without a word: ended, it frees the lock for the next
        // leader's renewals. (A live one speaks every renewal or watch.)
        // The setting is PostgreSQL 14's; on 13 the keepalives end it.
        sqlx::query(
            "select set_config('idle_session_timeout', $1, false) \
             where current_setting('server_version_num')::int >= 140000",
        )
        .bind(format!("{}ms", self.limits.lease.as_millis().max(1)))
        .execute(&mut conn)
        .await?;
        Ok(LeaderSession {
            conn,
            locked: false,
        })
    }
}

impl LeaderSession {
    /// Whether this session holds the leader lock.
    pub fn locked(&self) -> bool {
        self.locked
    }

    /// A follower's look at the lease: when the row says its holder held
    /// the leader lock, tries the lock. Answers whether a claim is worth
    /// making now: the lock was free (the holder's session ended) or the
    /// lease lapsed.
    pub async fn watch(&mut self) -> Result<bool, StoreError> {
        if self.locked {
            return Ok(true);
        }
        // The lock is only tried on a row the `where` kept: the select
        // list is computed for those alone.
        let row: Option<(bool, bool)> = sqlx::query_as(&format!(
            "select pg_try_advisory_lock($1), expires_at < {DB_NOW_US} \
             from leader_lease where id = 1 and (locked or expires_at < {DB_NOW_US})"
        ))
        .bind(LEADER_LOCK)
        .fetch_optional(&mut self.conn)
        .await?;
        let (got, lapsed) = row.unwrap_or((false, false));
        self.locked = got;
        Ok(got || lapsed)
    }

    /// Takes or renews the lease (see [`claim`]), trying the leader lock
    /// first when this session does not hold it. A session left without
    /// the lease lets the lock go: only a leader, or a replica in the
    /// middle of its claim, holds it.
    pub async fn lead(
        &mut self,
        me: &str,
        held: Option<i64>,
        lease: std::time::Duration,
    ) -> Result<Option<(i64, Takeover)>, StoreError> {
        if !self.locked {
            self.locked = sqlx::query_scalar("select pg_try_advisory_lock($1)")
                .bind(LEADER_LOCK)
                .fetch_one(&mut self.conn)
                .await?;
        }
        let taken = claim(&mut self.conn, me, held, lease, self.locked).await?;
        if taken.is_none() && self.locked {
            self.unlock().await?;
        }
        Ok(taken)
    }

    /// Gives the lease up (a clean stop, or a leader that stepped down)
    /// and the lock with it, so the next replica leads at once.
    pub async fn resign(&mut self, me: &str, term: i64) -> Result<(), StoreError> {
        resign_on(&mut self.conn, me, term).await?;
        self.unlock().await
    }

    async fn unlock(&mut self) -> Result<(), StoreError> {
        sqlx::query("select pg_advisory_unlock_all()")
            .execute(&mut self.conn)
            .await?;
        self.locked = false;
        Ok(())
    }

    /// The server settings `names` of this session, as the server reports
    /// them (see [`Store::session_settings`]).
    pub async fn session_settings(
        &mut self,
        names: &[&str],
    ) -> Result<Vec<(String, String)>, StoreError> {
        super::durability::read_settings(&mut self.conn, names).await
    }

    /// Ends the session (and frees the lock if held).
    pub async fn close(self) {
        let _ = self.conn.close().await;
    }
}

/// Gives `me`'s lease of `term` up: lapsed, and no longer locked.
pub(super) async fn resign_on<'c>(
    db: impl sqlx::Executor<'c, Database = sqlx::any::Any>,
    me: &str,
    term: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "update leader_lease set expires_at = 0, locked = false \
         where id = 1 and holder = $1 and term = $2",
    )
    .bind(me)
    .bind(term)
    .execute(db)
    .await?;
    Ok(())
}
