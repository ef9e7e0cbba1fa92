//! Provisioned capacity in the store (docs/rules.md#provisioned-capacity):
//! a set of new nodes is a `node_sets` row and a `node_slots` row per slot,
//! written with the pass that decided it, with a line in its batch's
//! history; its resume program is marked started (once) before it runs; an
//! allocation of its batch removes it; a suspension marks its nodes as
//! being suspended (they may not register), and the suspend program's end
//! removes them.

use chrono::{DateTime, Utc};
use sqlx::AnyConnection;

use super::rows::{append_history, from_micros, micros, still_queued};
use super::{Store, StoreError};
use crate::api::State;
use crate::scheduler::{NodeId, NodeSet, SuspendCause, Suspension};

/// Writes a set decided for a batch still queued; false (void) when it
/// left the queue meanwhile.
pub(super) async fn open_set(
    conn: &mut AnyConnection,
    set: &NodeSet,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    if !still_queued(conn, set.key.0).await? {
        return Ok(false);
    }
    let spec = serde_json::to_string(set)
        .map_err(|e| StoreError::Unavailable(format!("cannot encode a node set: {e}")))?;
    sqlx::query(
        "insert into node_sets (seq, region, zone, pool, spec, decided_at) values ($1, $2, $3, $4, $5, $6)",
    )
    .bind(set.key.0)
    .bind(&set.region)
    .bind(&set.zone)
    .bind(&set.pool)
    .bind(spec)
    .bind(micros(set.decided_at))
    .execute(&mut *conn)
    .await?;
    for slot in &set.slots {
        sqlx::query(
            "insert into node_slots (node_id, seq, state, region, zone, pool) values ($1, $2, 0, $3, $4, $5) \
             on conflict (node_id) do update set seq = excluded.seq, state = 0, \
             region = excluded.region, zone = excluded.zone, pool = excluded.pool",
        )
        .bind(&slot.0)
        .bind(set.key.0)
        .bind(&set.region)
        .bind(&set.zone)
        .bind(&set.pool)
        .execute(&mut *conn)
        .await?;
    }
    let message = format!(
        "Provisioning {} nodes in {} (pool {}) for this batch: {}; each must register by {}.",
        set.slots.len(),
        set.zone,
        set.pool,
        set.slots
            .iter()
            .map(|s| s.0.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        set.register_by
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    append_history(conn, set.key.0, State::Pending, &message, now).await?;
    Ok(true)
}

/// Marks nodes as being suspended; a failed or abandoned set's row goes,
/// and a failed set's batch, still queued, says so in its history. Always
/// written: nodes the program was asked for must be deleted.
pub(super) async fn suspend(
    conn: &mut AnyConnection,
    s: &Suspension,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let seq = match &s.cause {
        SuspendCause::Failed { key, .. } | SuspendCause::Abandoned { key, .. } => Some(key.0),
        SuspendCause::Idle => None,
        SuspendCause::Lost { epoch } => {
            // Only with the node's loss, written before it in this
            // transaction (its state lost, its epoch moved on); not if it
            // registered again meanwhile.
            let Some(node) = s.nodes.first() else {
                return Ok(false);
            };
            let lost: Option<i64> = sqlx::query_scalar(
                "select epoch from nodes where node_id = $1 and state = 1 and epoch = $2",
            )
            .bind(&node.0)
            .bind(*epoch as i64 + 1)
            .fetch_optional(&mut *conn)
            .await?;
            if lost.is_none() {
                return Ok(false);
            }
            None
        }
    };
    if let Some(seq) = seq {
        sqlx::query("delete from node_sets where seq = $1")
            .bind(seq)
            .execute(&mut *conn)
            .await?;
    }
    for node in &s.nodes {
        sqlx::query(
            "insert into node_slots (node_id, seq, state, region, zone, pool) values ($1, null, 2, $2, $3, $4) \
             on conflict (node_id) do update set seq = null, state = 2",
        )
        .bind(&node.0)
        .bind(&s.region)
        .bind(&s.zone)
        .bind(&s.pool)
        .execute(&mut *conn)
        .await?;
    }
    if let SuspendCause::Failed {
        key, backoff_until, ..
    } = &s.cause
    {
        if still_queued(conn, key.0).await? {
            let message = format!(
                "Provisioning {} nodes in {} (pool {}) failed: {}. The batch stays queued at its place; its nodes are suspended, and the pool is not asked again before {}.",
                s.nodes.len(),
                s.zone,
                s.pool,
                s.message,
                backoff_until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            );
            append_history(conn, key.0, State::Pending, &message, now).await?;
        }
    }
    Ok(true)
}

/// How many boot times each pool keeps (the core's p90 reads as many).
const BOOTS_KEPT: i64 = 64;

/// An allocation of `seq` at `now`: a set being created for it is
/// complete, and its pool's boot time (decision to allocation) is kept.
pub(super) async fn allocated(
    conn: &mut AnyConnection,
    seq: i64,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let set: Option<(String, String, String, i64)> =
        sqlx::query_as("select region, zone, pool, decided_at from node_sets where seq = $1")
            .bind(seq)
            .fetch_optional(&mut *conn)
            .await?;
    if let Some((region, zone, pool, decided_at)) = set {
        let boot_ms = (micros(now) - decided_at).max(0) / 1000;
        sqlx::query(
            "insert into pool_boots (region, zone, pool, completed_at, boot_ms) values ($1, $2, $3, $4, $5)",
        )
        .bind(&region)
        .bind(&zone)
        .bind(&pool)
        .bind(micros(now))
        .bind(boot_ms)
        .execute(&mut *conn)
        .await?;
        // Older than the pool's last BOOTS_KEPT: pruned.
        sqlx::query(
            "delete from pool_boots where region = $1 and zone = $2 and pool = $3 and completed_at < \
             (select min(completed_at) from (select completed_at from pool_boots \
              where region = $4 and zone = $5 and pool = $6 order by completed_at desc limit $7) as kept)",
        )
        .bind(&region)
        .bind(&zone)
        .bind(&pool)
        .bind(&region)
        .bind(&zone)
        .bind(&pool)
        .bind(BOOTS_KEPT)
        .execute(&mut *conn)
        .await?;
        sqlx::query("delete from node_slots where seq = $1 and state = 0")
            .bind(seq)
            .execute(&mut *conn)
            .await?;
        sqlx::query("delete from node_sets where seq = $1")
            .bind(seq)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Whether any set is open (a pass's allocations look for theirs only
/// then).
pub(super) async fn any_open(conn: &mut AnyConnection) -> Result<bool, StoreError> {
    let n: i64 = sqlx::query_scalar("select count(*) from node_sets")
        .fetch_one(&mut *conn)
        .await?;
    Ok(n > 0)
}

/// A set read back: as decided, and whether its resume program was
/// started.
#[derive(Debug, Clone)]
pub struct StoredSet {
    pub set: NodeSet,
    pub resumed_at: Option<DateTime<Utc>>,
}

impl Store {
    /// Every open set, by batch.
    pub async fn open_sets(&self) -> Result<Vec<StoredSet>, StoreError> {
        let rows: Vec<(String, Option<i64>)> =
            sqlx::query_as("select spec, resumed_at from node_sets order by seq")
                .fetch_all(&self.pool)
                .await?;
        rows.into_iter()
            .map(|(spec, resumed)| {
                let set = serde_json::from_str(&spec).map_err(|e| {
                    StoreError::Unavailable(format!("a stored node set cannot be read: {e}"))
                })?;
                Ok(StoredSet {
                    set,
                    resumed_at: resumed.map(from_micros),
                })
            })
            .collect()
    }

    /// The boot times each provisioned pool's sets took lately (at most
    /// its last 64), oldest first: ((region, zone, pool), boot).
    #[allow(clippy::type_complexity)]
    pub async fn recent_boots(
        &self,
    ) -> Result<Vec<((String, String, String), std::time::Duration)>, StoreError> {
        let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
            "select region, zone, pool, boot_ms from pool_boots order by completed_at",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(r, z, p, ms)| {
                (
                    (r, z, p),
                    std::time::Duration::from_millis(ms.max(0) as u64),
                )
            })
            .collect())
    }

    /// Nodes being suspended (their program may not have ended), with
    /// their region, zone and pool.
    pub async fn suspending_nodes(
        &self,
    ) -> Result<Vec<(NodeId, String, String, String)>, StoreError> {
        let rows: Vec<(String, String, String, String)> = sqlx::query_as(
            "select node_id, region, zone, pool from node_slots where state = 2 order by node_id",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, r, z, p)| (NodeId(id), r, z, p))
            .collect())
    }

    /// Marks `seq`'s set's resume program started at `now`, by the leader
    /// of term `fence`: true when this call marked it (the caller starts
    /// it), false when it was started already or the set is gone. A
    /// program is never started twice for one set, whoever leads.
    pub async fn mark_resumed(
        &self,
        seq: i64,
        now: DateTime<Utc>,
        fence: Option<i64>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin_write().await?;
        Store::check_fence(&mut tx, fence).await?;
        let marked = sqlx::query(
            "update node_sets set resumed_at = $1 where seq = $2 and resumed_at is null",
        )
        .bind(micros(now))
        .bind(seq)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        self.commit(tx).await?;
        Ok(marked == 1)
    }

    /// The suspend program ended for `nodes`: deleted (`true`), they are
    /// no longer registered; or it failed (`false`), and they may register
    /// again.
    pub async fn suspend_ended(
        &self,
        nodes: &[NodeId],
        deleted: bool,
        fence: Option<i64>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        Store::check_fence(&mut tx, fence).await?;
        for node in nodes {
            sqlx::query("delete from node_slots where node_id = $1 and state = 2")
                .bind(&node.0)
                .execute(&mut *tx)
                .await?;
            if deleted {
                sqlx::query(
                    "update nodes set state = 2, epoch = epoch + 1 where node_id = $1 and state = 0",
                )
                .bind(&node.0)
                .execute(&mut *tx)
                .await?;
            }
        }
        self.commit(tx).await?;
        Ok(())
    }
}
