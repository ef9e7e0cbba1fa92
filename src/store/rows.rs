//! Row decoding and the statements several store calls share. Row shapes
//! stay in here; callers see [`BatchRecord`]s.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::sql::Sql;

use super::{BatchRecord, Provisioning, RunInfo, StoreError};
use crate::api::{BatchName, State, StateHistory};
use crate::scheduler::{NodeId, PartRole, Placement};
use crate::spec::{Accelerator, Alternative, ClusterRequest, Request};

pub(super) const BATCH_COLUMNS: &str = "seq, project, region, batch_id, uuid, operation_id, request_id, \
     create_time, state, state_message, state_time, creator, spec, cluster, deadline, provisioning, \
     priority, zone, allocate_time, master_url, run_info, attempt, end_reason, alternative, \
     preempted_by, stop_grace_s, preemptions, requeue_reason";

pub(super) fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

pub(super) fn from_micros(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or_default()
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("stored {what} cannot be read: {e}"))
}

/// The cluster a batch was stored with, and its placement alternatives:
/// every reader goes through here, and one that cannot be read is an
/// error, never a default.
pub(super) fn decode_cluster(text: &str) -> Result<Request, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt("cluster", e))
}

/// What [`decode_cluster`] reads back: a [`Request`]'s JSON, written from
/// the batch's two fields without copying them.
pub(super) fn encode_cluster(
    cluster: &ClusterRequest,
    alternatives: &[Alternative],
) -> serde_json::Result<String> {
    #[derive(serde::Serialize)]
    struct Stored<'a> {
        #[serde(flatten)]
        cluster: &'a ClusterRequest,
        #[serde(skip_serializing_if = "<[_]>::is_empty")]
        alternatives: &'a [Alternative],
    }
    serde_json::to_string(&Stored {
        cluster,
        alternatives,
    })
}

fn decode(row: &AnyRow) -> Result<BatchRecord, StoreError> {
    let state: i64 = row.try_get("state")?;
    let spec: &str = row.try_get("spec")?;
    let Request {
        cluster,
        alternatives,
    } = decode_cluster(row.try_get("cluster")?)?;
    Ok(BatchRecord {
        seq: row.try_get("seq")?,
        name: BatchName {
            project: row.try_get("project")?,
            region: row.try_get("region")?,
            batch_id: row.try_get("batch_id")?,
        },
        uuid: row.try_get("uuid")?,
        operation_id: row.try_get("operation_id")?,
        request_id: row.try_get("request_id")?,
        create_time: from_micros(row.try_get("create_time")?),
        state: State::from_number(state).ok_or_else(|| corrupt("state", state))?,
        state_message: row.try_get("state_message")?,
        state_time: from_micros(row.try_get("state_time")?),
        creator: row.try_get("creator")?,
        spec: serde_json::from_str(spec).map_err(|e| corrupt("batch", e))?,
        cluster,
        alternatives,
        deadline: row.try_get::<Option<i64>, _>("deadline")?.map(from_micros),
        provisioning: Provisioning::from_number(row.try_get("provisioning")?),
        priority: row.try_get("priority")?,
        zone: row.try_get("zone")?,
        allocate_time: row
            .try_get::<Option<i64>, _>("allocate_time")?
            .map(from_micros),
        master_url: row.try_get("master_url")?,
        attempt: u32::try_from(row.try_get::<i64, _>("attempt")?).unwrap_or(1),
        end_reason: row
            .try_get::<Option<i64>, _>("end_reason")?
            .and_then(crate::api::EndReason::from_number),
        alternative: row
            .try_get::<Option<i64>, _>("alternative")?
            .and_then(|a| u32::try_from(a).ok())
            .unwrap_or(0),
        preempted_by: row.try_get("preempted_by")?,
        stop_grace_s: row
            .try_get::<Option<i64>, _>("stop_grace_s")?
            .and_then(|s| u64::try_from(s).ok()),
        preemptions: u32::try_from(row.try_get::<i64, _>("preemptions")?).unwrap_or(0),
        requeue_reason: row
            .try_get::<Option<i64>, _>("requeue_reason")?
            .and_then(crate::api::RequeueReason::from_number),
        run: match row.try_get::<Option<&str>, _>("run_info")? {
            Some(json) => serde_json::from_str(json).map_err(|e| corrupt("run", e))?,
            None => RunInfo::default(),
        },
        history: Vec::new(),
    })
}

/// Decodes batch rows and attaches their state history (one extra query
/// for the whole set).
pub(super) async fn read_batches<'e, E>(
    executor: E,
    backend: super::Backend,
    rows: Vec<AnyRow>,
) -> Result<Vec<BatchRecord>, StoreError>
where
    E: sqlx::Executor<'e, Database = sqlx::Any>,
{
    let mut batches = rows.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
    if batches.is_empty() {
        return Ok(batches);
    }
    let mut q = Sql::new(
        backend,
        "select batch_seq, state, message, start_time from state_history where batch_seq in (",
    );
    q.list(batches.iter().map(|b| b.seq))
        .push(") order by batch_seq, idx");
    let history = q.fetch_all(executor).await?;
    let mut by_seq: HashMap<i64, Vec<StateHistory>> = HashMap::new();
    for row in history {
        let state: i64 = row.try_get("state")?;
        by_seq
            .entry(row.try_get("batch_seq")?)
            .or_default()
            .push(StateHistory {
                state: State::from_number(state).ok_or_else(|| corrupt("state", state))?,
                state_message: row.try_get("message")?,
                state_start_time: from_micros(row.try_get("start_time")?),
            });
    }
    for b in &mut batches {
        b.history = by_seq.remove(&b.seq).unwrap_or_default();
    }
    Ok(batches)
}

/// Moves a batch to `to` and appends the transition to its history, inside
/// the caller's transaction.
pub(super) async fn transition(
    conn: &mut AnyConnection,
    seq: i64,
    to: State,
    message: &str,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "update batches set state = $1, state_message = $2, state_time = $3 where seq = $4",
    )
    .bind(to.number())
    .bind(message)
    .bind(micros(now))
    .bind(seq)
    .execute(&mut *conn)
    .await?;
    append_history(conn, seq, to, message, now).await
}

/// Whether batch `seq` is still queued: PENDING and not allocated (a
/// cancel, an expiry or an allocation may have won the race).
pub(super) async fn still_queued(conn: &mut AnyConnection, seq: i64) -> Result<bool, StoreError> {
    let queued: Option<i64> = sqlx::query_scalar(
        "select seq from batches where seq = $1 and state = $2 and provisioning = $3",
    )
    .bind(seq)
    .bind(State::Pending.number())
    .bind(Provisioning::Queued as i64)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(queued.is_some())
}

/// Appends one entry to a batch's history.
pub(super) async fn append_history(
    conn: &mut AnyConnection,
    seq: i64,
    state: State,
    message: &str,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "insert into state_history (batch_seq, idx, state, message, start_time) \
         select $1, coalesce(max(idx), -1) + 1, $2, $3, $4 from state_history where batch_seq = $5",
    )
    .bind(seq)
    .bind(state.number())
    .bind(message)
    .bind(micros(now))
    .bind(seq)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The run batch `seq` keeps beside its state (none yet: the default).
pub(super) async fn run_info(conn: &mut AnyConnection, seq: i64) -> Result<RunInfo, StoreError> {
    let json: Option<String> = sqlx::query_scalar("select run_info from batches where seq = $1")
        .bind(seq)
        .fetch_one(&mut *conn)
        .await?;
    Ok(json
        .and_then(|j| serde_json::from_str(&j).ok())
        .unwrap_or_default())
}

/// Replaces the run batch `seq` keeps.
pub(super) async fn set_run_info(
    conn: &mut AnyConnection,
    seq: i64,
    run: &RunInfo,
) -> Result<(), StoreError> {
    let json = serde_json::to_string(run)
        .map_err(|e| StoreError::Unavailable(format!("cannot encode run info: {e}")))?;
    sqlx::query("update batches set run_info = $1 where seq = $2")
        .bind(json)
        .bind(seq)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// A part of a cluster as an `allocations` row stores it.
pub(super) fn placement_of(row: &AnyRow) -> Result<Placement, StoreError> {
    let gpus: String = row.try_get("gpus")?;
    let role: String = row.try_get("role")?;
    Ok(Placement {
        node: NodeId(row.try_get("node_id")?),
        role: if role == "driver" {
            PartRole::Driver
        } else {
            PartRole::Executor
        },
        gpus: serde_json::from_str(&gpus).unwrap_or_default(),
        cores: row.try_get::<i64, _>("cores")? as u32,
        memory_mb: row.try_get::<i64, _>("memory_mb")? as u64,
        local_ssd_gb: row.try_get::<i64, _>("local_ssd_gb")? as u64,
        accelerator: row
            .try_get::<Option<String>, _>("accelerator")?
            .as_deref()
            .and_then(Accelerator::parse),
    })
}
