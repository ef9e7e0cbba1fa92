//! Elastic batches' extras in the store (docs/rules.md#elastic-batches):
//! an extra is one `allocations` row with `extra = 1`, inserted at its
//! grant and released when it goes back; each change is in the batch's
//! history in the same transaction. What Spark wants is `extras_wanted`.

use chrono::{DateTime, Utc};
use sqlx::{AnyConnection, Row};

use super::leader::Change;
use super::rows::{append_history, micros};
use super::{Provisioning, Store, StoreError};
use crate::api::State;
use crate::scheduler::{ExtraChange, Placement};

/// A stored extra: its batch, and its part as the core holds it.
#[derive(Debug, Clone)]
pub struct StoredExtra {
    pub seq: i64,
    pub batch_id: String,
    pub placement: Placement,
}

/// Writes each change if it still applies (a grant to a batch still
/// holding its cluster and not stopping; a release of an extra still
/// held), with its history line; answers, per change, whether it was
/// written.
pub(super) async fn write_extras(
    conn: &mut AnyConnection,
    changes: &[ExtraChange],
    now: DateTime<Utc>,
) -> Result<Vec<bool>, StoreError> {
    let mut applied = Vec::with_capacity(changes.len());
    for change in changes {
        let seq = change.key().0;
        let state: Option<i64> = sqlx::query_scalar(
            "select state from batches where seq = $1 and provisioning = $2 \
             and preempted_by is null",
        )
        .bind(seq)
        .bind(Provisioning::Provisioned as i64)
        .fetch_optional(&mut *conn)
        .await?;
        let Some(state) = state.and_then(State::from_number) else {
            applied.push(false);
            continue;
        };
        let p = change.placement();
        let gpus = serde_json::to_string(&p.gpus).unwrap_or_else(|_| "[]".into());
        let done = match change {
            ExtraChange::Granted { .. } => {
                sqlx::query(
                    "insert into allocations (batch_seq, node_id, role, gpus, cores, memory_mb, \
                     local_ssd_gb, allocated_at, region, accelerator, extra) \
                     select $1, $2, $3, $4, $5, $6, $7, $8, \
                     (select max(region) from allocations where batch_seq = $9 and released_at is null), $10, 1",
                )
                .bind(seq)
                .bind(p.node.0.as_str())
                .bind(p.role.name())
                .bind(&gpus)
                .bind(i64::from(p.cores))
                .bind(p.memory_mb as i64)
                .bind(p.local_ssd_gb as i64)
                .bind(micros(now))
                .bind(seq)
                .bind(p.accelerator.map(|a| a.name()))
                .execute(&mut *conn)
                .await?;
                true
            }
            _ => {
                sqlx::query(
                    "update allocations set released_at = $1 where id = \
                     (select max(id) from allocations where batch_seq = $2 and extra = 1 \
                     and released_at is null and node_id = $3 and gpus = $4)",
                )
                .bind(micros(now))
                .bind(seq)
                .bind(p.node.0.as_str())
                .bind(&gpus)
                .execute(&mut *conn)
                .await?
                .rows_affected()
                    == 1
            }
        };
        if done {
            append_history(conn, seq, state, &message(change), now).await?;
        }
        applied.push(done);
    }
    Ok(applied)
}

/// The history line of a change to a batch's extras.
fn message(change: &ExtraChange) -> String {
    let p = change.placement();
    let part = format!(
        "extra executor on node {} ({} GPU{})",
        p.node,
        p.gpus.len(),
        if p.gpus.len() == 1 { "" } else { "s" }
    );
    match change {
        ExtraChange::Granted { .. } => {
            format!("Granted an {part}: Spark wanted more executors than its core gang.")
        }
        ExtraChange::Released { .. } => {
            format!("Gave back an {part}: Spark no longer used it.")
        }
        ExtraChange::Reclaimed { for_batch, .. } => format!(
            "Took back an {part} for batch {for_batch}, queued for this capacity; Spark reruns its tasks on the rest."
        ),
        ExtraChange::Lost { .. } => format!(
            "Lost an {part} with its node; the batch goes on, and Spark reruns its tasks on the rest."
        ),
    }
}

impl Store {
    /// The seq of batch `uuid` whose driver runs on `node` now
    /// (`FailedPrecondition` where none does).
    pub async fn driver_of(&self, node: &str, uuid: &str) -> Result<i64, StoreError> {
        let mut conn = self.pool.acquire().await?;
        super::runs::driver_seq(&mut conn, node, uuid).await
    }

    /// Records Spark's demand of batch `uuid` as its driver's node `node`
    /// reports it: `wanted` executors beyond its core. Answers the
    /// batch's seq. Announced, for the replica that decides.
    pub async fn set_extras_wanted(
        &self,
        node: &str,
        uuid: &str,
        wanted: u32,
    ) -> Result<i64, StoreError> {
        let mut tx = self.begin_write().await?;
        let seq = super::runs::driver_seq(&mut tx, node, uuid).await?;
        sqlx::query("update batches set extras_wanted = $1 where seq = $2")
            .bind(i64::from(wanted))
            .bind(seq)
            .execute(&mut *tx)
            .await?;
        self.announce(&mut tx, &Change::Extras { seq }).await?;
        self.commit(tx).await?;
        Ok(seq)
    }

    /// Releases the extra executor `index` of batch `uuid` on `node` at
    /// `now` (its worker had no executor for a while), with its history
    /// line. Answers it; `NotFound` where `node` holds no such extra now.
    pub async fn release_idle_extra(
        &self,
        node: &str,
        uuid: &str,
        index: u32,
        now: DateTime<Utc>,
    ) -> Result<StoredExtra, StoreError> {
        let mut tx = self.begin_write().await?;
        let row = sqlx::query(
            "select a.batch_seq, b.batch_id, a.node_id, a.role, a.gpus, a.cores, a.memory_mb, \
             a.local_ssd_gb, a.accelerator from allocations a join batches b on b.seq = a.batch_seq \
             where b.uuid = $1 and a.node_id = $2 and a.extra = 1 and a.released_at is null \
             and (select count(*) from allocations e where e.batch_seq = a.batch_seq \
                  and e.role = 'executor' and e.id < a.id) = $3",
        )
        .bind(uuid)
        .bind(node)
        .bind(i64::from(index))
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        let extra = StoredExtra {
            seq: row.try_get("batch_seq")?,
            batch_id: row.try_get("batch_id")?,
            placement: super::rows::placement_of(&row)?,
        };
        let change = ExtraChange::Released {
            key: crate::scheduler::BatchKey(extra.seq),
            batch_id: extra.batch_id.clone(),
            placement: extra.placement.clone(),
            since: now,
        };
        let applied = write_extras(&mut tx, std::slice::from_ref(&change), now).await?;
        if applied != [true] {
            return Err(StoreError::NotFound);
        }
        // Spark is taken to want no more than it holds until its driver
        // reports again (as the core does).
        sqlx::query(
            "update batches set extras_wanted = (select count(*) from allocations \
             where batch_seq = $1 and extra = 1 and released_at is null) \
             where seq = $2 and extras_wanted is not null and extras_wanted > \
             (select count(*) from allocations where batch_seq = $3 and extra = 1 and released_at is null)",
        )
        .bind(extra.seq)
        .bind(extra.seq)
        .bind(extra.seq)
        .execute(&mut *tx)
        .await?;
        self.announce(&mut tx, &Change::Extras { seq: extra.seq })
            .await?;
        self.commit(tx).await?;
        Ok(extra)
    }

    /// Batch `seq`'s extras held now, in grant order, and what Spark
    /// wants (for a replica that heard [`Change::Extras`]).
    pub async fn extras_of(&self, seq: i64) -> Result<(Vec<Placement>, Option<u32>), StoreError> {
        let rows = sqlx::query(
            "select node_id, role, gpus, cores, memory_mb, local_ssd_gb, accelerator from allocations \
             where batch_seq = $1 and extra = 1 and released_at is null order by id",
        )
        .bind(seq)
        .fetch_all(&self.pool)
        .await?;
        let extras = rows
            .iter()
            .map(super::rows::placement_of)
            .collect::<Result<_, _>>()?;
        let wanted: Option<Option<i64>> =
            sqlx::query_scalar("select extras_wanted from batches where seq = $1")
                .bind(seq)
                .fetch_optional(&self.pool)
                .await?;
        Ok((extras, wanted.flatten().and_then(|w| u32::try_from(w).ok())))
    }

    /// Batch `seq`'s executor parts, every attempt's: when each was
    /// allocated and given back (None while held), and whether it is an
    /// extra, oldest first.
    pub async fn executor_spans(&self, seq: i64) -> Result<Vec<ExecutorSpan>, StoreError> {
        let rows = sqlx::query(
            "select allocated_at, released_at, extra from allocations \
             where batch_seq = $1 and role = 'executor' order by id",
        )
        .bind(seq)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ExecutorSpan {
                    allocated_at: super::rows::from_micros(row.try_get("allocated_at")?),
                    released_at: row
                        .try_get::<Option<i64>, _>("released_at")?
                        .map(super::rows::from_micros),
                    extra: row.try_get::<i64, _>("extra")? != 0,
                })
            })
            .collect()
    }
}

/// One executor part of a batch, from its allocation to its release.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutorSpan {
    pub allocated_at: DateTime<Utc>,
    pub released_at: Option<DateTime<Utc>>,
    pub extra: bool,
}
