//! Several replicas on one PostgreSQL: the leader lease and the change
//! notifications.
//!
//! One row (`leader_lease`) says which replica runs the scheduler until
//! when, on the database's clock. The holder renews it; any replica takes
//! it once it lapsed, or before when the holder's session ended (the
//! leader lock, see [`super::leader_lock`]), and every change of holder
//! bumps the **term**. The
//! scheduler's commits check the term under the write lock
//! ([`Store::commit_decisions`]), so a replica that lost the lease (paused,
//! cut off from the database) can no longer commit once another took over.
//!
//! Every write transaction announces what it changed on the `flexq`
//! channel (`NOTIFY`, delivered at commit and in commit order): this is
//! how a create accepted by any replica reaches the leader at once, and
//! how followers learn the leader's decisions.

use std::time::Duration;

use sqlx::AnyConnection;

use super::leader_lock::{DB_NOW_US, resign_on};
use super::{Backend, Store, StoreError};

/// The `LISTEN`/`NOTIFY` channel of the change announcements.
pub(crate) const CHANNEL: &str = "flexq";

/// What a committed transaction changed, as announced to every replica.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    /// Batches were created, with seqs in this range.
    Created { first_seq: i64, last_seq: i64 },
    /// A batch left the queue or gave back its cluster.
    Ended { seq: i64 },
    /// A batch gave back its cluster and went back to the queue (an
    /// infrastructure failure).
    Requeued { seq: i64 },
    /// A node registered (again).
    Node { id: String },
    /// An admin changed a quota limit.
    Quota,
    /// An admin held or resumed a queue.
    Hold,
    /// An admin cordoned, drained or uncordoned a node.
    Cordon,
    /// A replica put a new config generation in force.
    Config { generation: i64 },
    /// The leader committed scheduler decisions.
    Decided,
    /// An agent changed a running elastic batch: what Spark wants, or an
    /// extra given back (the leader's core follows the store).
    Extras { seq: i64 },
    /// What some node must run changed otherwise (a cancel of a running
    /// batch, a Spark master came up).
    Work,
    /// A batch's driver output grew.
    Output { seq: i64 },
    /// An agent renewed its node's lease (not a write: sent alone).
    Heartbeat { epoch: u64, node: String },
    /// A replica checking that its listening connection still hears.
    Ping { n: u64, replica: String },
}

impl Change {
    /// The payload announced: JSON, `{"kind": "created", "first_seq": …}`.
    pub fn payload(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a payload written by [`Change::payload`]; None for one this
    /// version cannot read (a newer replica's, say).
    pub fn parse(payload: &str) -> Option<Change> {
        serde_json::from_str(payload).ok()
    }
}

/// Who holds the leader lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderLease {
    pub holder: String,
    pub term: i64,
    /// Whether the lease has not lapsed (on the database's clock).
    pub live: bool,
}

impl Store {
    /// Announces `change` inside the transaction `conn` (delivered at its
    /// commit). Nothing on SQLite: one process, no one to tell.
    pub(super) async fn announce(
        &self,
        conn: &mut AnyConnection,
        change: &Change,
    ) -> Result<(), StoreError> {
        if self.backend == Backend::Postgres {
            sqlx::query("select 1 from pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(change.payload())
                .execute(conn)
                .await?;
        }
        Ok(())
    }

    /// Announces `change` on its own (a heartbeat, which writes nothing).
    pub async fn announce_now(&self, change: &Change) -> Result<(), StoreError> {
        if self.backend == Backend::Postgres {
            let mut conn = self.pool.acquire().await?;
            self.announce(&mut conn, change).await?;
        }
        Ok(())
    }

    /// Takes the leader lease for `me` when it is free or lapsed, or renews
    /// it when `me` holds term `held`, without the leader lock (a replica
    /// leads through its [`LeaderSession`](super::LeaderSession); this is
    /// the lease alone). Answers the term `me` holds after the call, or
    /// `None` when another replica's lease is live. A holder that lost
    /// track of its term (a renewal whose answer timed out) takes a new one
    /// rather than wait for its own lease to lapse.
    pub async fn lead(
        &self,
        me: &str,
        held: Option<i64>,
        lease: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let taken = super::leader_lock::claim(&self.lease_pool, me, held, lease, false).await?;
        Ok(taken.map(|(term, _)| term))
    }

    /// Gives the lease up at once (a clean shutdown), so another replica
    /// need not wait for it to lapse.
    pub async fn resign(&self, me: &str, term: i64) -> Result<(), StoreError> {
        resign_on(&self.lease_pool, me, term).await
    }

    /// The lease as it stands.
    pub async fn lease_holder(&self) -> Result<LeaderLease, StoreError> {
        let (holder, term, live): (String, i64, bool) = sqlx::query_as(&format!(
            "select holder, term, expires_at >= {DB_NOW_US} from leader_lease where id = 1"
        ))
        .fetch_one(&self.lease_pool)
        .await?;
        Ok(LeaderLease { holder, term, live })
    }

    /// Fails unless term `fence` still holds the lease: inside a write
    /// transaction, before a scheduler decision is written.
    pub(super) async fn check_fence(
        conn: &mut AnyConnection,
        fence: Option<i64>,
    ) -> Result<(), StoreError> {
        let Some(term) = fence else {
            return Ok(());
        };
        let current: i64 =
            sqlx::query_scalar("select term from leader_lease where id = 1 for share")
                .fetch_one(conn)
                .await?;
        if current != term {
            return Err(StoreError::Fenced(format!(
                "term {term} is over (the lease is in term {current}): another replica leads"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which variant a change is. Exhaustive on purpose: a new variant
    /// does not compile here until the round trip below covers it.
    fn variant(c: &Change) -> usize {
        match c {
            Change::Created { .. } => 0,
            Change::Ended { .. } => 1,
            Change::Requeued { .. } => 2,
            Change::Node { .. } => 3,
            Change::Quota => 4,
            Change::Hold => 5,
            Change::Cordon => 6,
            Change::Config { .. } => 7,
            Change::Decided => 8,
            Change::Work => 9,
            Change::Output { .. } => 10,
            Change::Heartbeat { .. } => 11,
            Change::Ping { .. } => 12,
            Change::Extras { .. } => 13,
        }
    }

    #[test]
    fn changes_read_back_what_they_write() {
        let all = [
            Change::Created {
                first_seq: 40,
                last_seq: 42,
            },
            Change::Ended { seq: 7 },
            Change::Requeued { seq: 8 },
            Change::Node {
                id: "gpu node 1".into(),
            },
            Change::Quota,
            Change::Hold,
            Change::Cordon,
            Change::Config { generation: 12 },
            Change::Decided,
            Change::Work,
            Change::Output { seq: 3 },
            Change::Heartbeat {
                epoch: 9,
                node: "n 1".into(),
            },
            Change::Ping {
                n: 4,
                replica: "flexq-0".into(),
            },
            Change::Extras { seq: 5 },
        ];
        let covered: std::collections::BTreeSet<usize> = all.iter().map(variant).collect();
        assert_eq!(covered, (0..=13).collect(), "every variant once");
        for c in all {
            assert_eq!(Change::parse(&c.payload()), Some(c.clone()), "{c:?}");
        }
        assert_eq!(
            Change::parse(r#"{"kind":"created","first_seq":1,"last_seq":2}"#),
            Some(Change::Created {
                first_seq: 1,
                last_seq: 2
            })
        );
        assert_eq!(Change::parse(r#"{"kind":"created","first_seq":"x"}"#), None);
        assert_eq!(Change::parse(r#"{"kind":"nonsense"}"#), None);
        assert_eq!(Change::parse("created 1 2"), None, "the old text form");
    }
}

/// What the change stream hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    Change(Change),
    /// A payload this version cannot read (a newer replica's, say).
    Unknown(String),
}

/// The announcements of every replica, as a stream. It ends when the
/// listening connection is lost: whatever was announced meanwhile is
/// missed, so the caller reads the database again (and listens anew).
pub type ChangeStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Heard, StoreError>> + Send>>;

impl Store {
    /// Listens to the announcements on a connection of its own
    /// (PostgreSQL). Changes committed before this call are not heard.
    pub async fn listen(&self) -> Result<ChangeStream, StoreError> {
        let mut listener = sqlx::postgres::PgListener::connect(&self.url).await?;
        listener.listen(CHANNEL).await?;
        let stream = futures_util::stream::unfold(Some(listener), |listener| async move {
            let mut listener = listener?;
            match listener.try_recv().await {
                Ok(Some(n)) => {
                    let heard = match Change::parse(n.payload()) {
                        Some(change) => Heard::Change(change),
                        None => Heard::Unknown(n.payload().to_string()),
                    };
                    Some((Ok(heard), Some(listener)))
                }
                // The connection was lost (`try_recv` does not reconnect
                // behind our back, so the gap is seen).
                Ok(None) => None,
                Err(e) => Some((Err(StoreError::from(e)), None)),
            }
        });
        Ok(Box::pin(stream))
    }
}
