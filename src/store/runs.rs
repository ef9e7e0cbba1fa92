//! Running work: what each node's agent must run (its parts of allocated
//! batches), what agents report back (master ready, driver started,
//! finished, a part failed), and the driver's output.
//!
//! A report that ends a batch changes its state and releases its cluster
//! in one transaction, like every other decision.

use chrono::{DateTime, Utc};
use sqlx::{AnyConnection, Row};

use super::rows::transition;
use super::schedule::release;
use super::{BatchRecord, Change, RunInfo, Store, StoreError};
use crate::api::State;
use crate::scheduler::Role;

/// One part of an allocated batch on a node: what its agent runs.
#[derive(Debug, Clone)]
pub struct NodePart {
    pub batch: BatchRecord,
    pub role: Role,
    /// Executors are numbered 0.. within their batch, in allocation order;
    /// 0 for the driver.
    pub index: u32,
    pub gpus: Vec<String>,
    pub cores: u32,
    pub memory_mb: u64,
    pub local_ssd_gb: u64,
}

/// What an agent reports about a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    /// The driver's node started the batch's Spark master.
    MasterReady { url: String },
    /// The driver process started: the batch is RUNNING.
    DriverStarted { rapids: String },
    /// The driver ended: SUCCEEDED or FAILED (CANCELLED when the batch was
    /// being cancelled).
    Finished {
        succeeded: bool,
        message: String,
        exit_code: Option<i32>,
    },
    /// A part could not run (a worker died, a start failed): the whole
    /// batch fails, a partial cluster must not go on.
    PartFailed { message: String },
}

impl AgentEvent {
    /// The event's name on the wire and in metrics.
    pub fn name(&self) -> &'static str {
        match self {
            AgentEvent::MasterReady { .. } => "MASTER_READY",
            AgentEvent::DriverStarted { .. } => "DRIVER_STARTED",
            AgentEvent::Finished { .. } => "FINISHED",
            AgentEvent::PartFailed { .. } => "PART_FAILED",
        }
    }
}

/// What a report did.
#[derive(Debug, Clone, PartialEq)]
pub enum ReportOutcome {
    Recorded,
    /// The batch ended and its cluster was released: the scheduler must
    /// forget it.
    Ended {
        seq: i64,
        state: State,
    },
}

/// A slice of a batch's driver output.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputChunk {
    pub data: Vec<u8>,
    pub next_offset: u64,
    /// Bytes stored in all.
    pub total: u64,
}

async fn run_info(conn: &mut AnyConnection, seq: i64) -> Result<RunInfo, StoreError> {
    let json: Option<String> = sqlx::query_scalar("select run_info from batches where seq = $1")
        .bind(seq)
        .fetch_one(&mut *conn)
        .await?;
    Ok(json
        .and_then(|j| serde_json::from_str(&j).ok())
        .unwrap_or_default())
}

async fn set_run_info(conn: &mut AnyConnection, seq: i64, run: &RunInfo) -> Result<(), StoreError> {
    let json = serde_json::to_string(run)
        .map_err(|e| StoreError::Unavailable(format!("cannot encode run info: {e}")))?;
    sqlx::query("update batches set run_info = $1 where seq = $2")
        .bind(json)
        .bind(seq)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Ends a batch: state, run info, release of its cluster. Answers how long
/// its driver ran, if it started.
async fn end(
    conn: &mut AnyConnection,
    seq: i64,
    to: State,
    message: &str,
    exit_code: Option<i32>,
    now: DateTime<Utc>,
) -> Result<Option<std::time::Duration>, StoreError> {
    let mut run = run_info(conn, seq).await?;
    run.exit_code = exit_code.or(run.exit_code);
    run.end_time = Some(now);
    set_run_info(conn, seq, &run).await?;
    transition(conn, seq, to, message, now).await?;
    release(conn, seq, now).await?;
    Ok(run.start_time.and_then(|t| (now - t).to_std().ok()))
}

impl Store {
    /// Every part of a batch that `node` holds now, with its batch.
    pub async fn node_parts(&self, node: &str) -> Result<Vec<NodePart>, StoreError> {
        let rows = sqlx::query(
            "select a.batch_seq, a.role, a.gpus, a.cores, a.memory_mb, a.local_ssd_gb, \
               (select count(*) from allocations e where e.batch_seq = a.batch_seq \
                  and e.role = 'executor' and e.id < a.id) as idx \
             from allocations a where a.node_id = $1 and a.released_at is null order by a.id",
        )
        .bind(node)
        .fetch_all(&self.pool)
        .await?;
        let mut parts = Vec::with_capacity(rows.len());
        // A node often holds several parts of one batch: read each once.
        let mut batches: std::collections::HashMap<i64, BatchRecord> = Default::default();
        for row in rows {
            let seq: i64 = row.try_get("batch_seq")?;
            let batch = match batches.get(&seq) {
                Some(b) => b.clone(),
                None => {
                    let b = self.get_by_seq(seq).await?;
                    batches.insert(seq, b.clone());
                    b
                }
            };
            let role = match row.try_get::<&str, _>("role")? {
                "driver" => Role::Driver,
                _ => Role::Executor,
            };
            let gpus: &str = row.try_get("gpus")?;
            parts.push(NodePart {
                batch,
                role,
                index: if role == Role::Driver {
                    0
                } else {
                    row.try_get::<i64, _>("idx")?.max(0) as u32
                },
                gpus: serde_json::from_str(gpus).map_err(|e| {
                    StoreError::Unavailable(format!("stored allocation cannot be read: {e}"))
                })?,
                cores: row.try_get::<i64, _>("cores")?.max(0) as u32,
                memory_mb: row.try_get::<i64, _>("memory_mb")?.max(0) as u64,
                local_ssd_gb: row.try_get::<i64, _>("local_ssd_gb")?.max(0) as u64,
            });
        }
        Ok(parts)
    }

    /// Applies an agent's report about batch `uuid` from `node`, which must
    /// hold a part of it (the driver's part for driver events).
    pub async fn report(
        &self,
        node: &str,
        uuid: &str,
        event: &AgentEvent,
        now: DateTime<Utc>,
    ) -> Result<ReportOutcome, StoreError> {
        let mut tx = self.begin_write().await?;
        let (seq, state, batch_id): (i64, i64, String) =
            sqlx::query_as("select seq, state, batch_id from batches where uuid = $1")
                .bind(uuid)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or(StoreError::NotFound)?;
        let state = State::from_number(state).unwrap_or(State::StateUnspecified);
        let roles: Vec<String> = sqlx::query_scalar(
            "select role from allocations where batch_seq = $1 and node_id = $2 and released_at is null",
        )
        .bind(seq)
        .bind(node)
        .fetch_all(&mut *tx)
        .await?;
        if roles.is_empty() {
            return Err(StoreError::FailedPrecondition(format!(
                "node {node} holds no part of batch {batch_id} (it is {state}; its cluster was released)"
            )));
        }
        let is_driver = roles.iter().any(|r| r == "driver");
        let needs_driver = !matches!(event, AgentEvent::PartFailed { .. });
        let mut ran = None;
        let mut started_after = None;
        if needs_driver && !is_driver {
            return Err(StoreError::FailedPrecondition(format!(
                "node {node} does not run the driver of batch {batch_id}"
            )));
        }
        let outcome = match event {
            AgentEvent::MasterReady { url } => {
                sqlx::query("update batches set master_url = $1 where seq = $2")
                    .bind(url)
                    .bind(seq)
                    .execute(&mut *tx)
                    .await?;
                ReportOutcome::Recorded
            }
            AgentEvent::DriverStarted { rapids } => {
                let mut run = run_info(&mut tx, seq).await?;
                run.driver_node = Some(node.to_string());
                run.rapids = Some(rapids.clone());
                run.start_time.get_or_insert(now);
                set_run_info(&mut tx, seq, &run).await?;
                if state == State::Pending {
                    let allocated: Option<i64> =
                        sqlx::query_scalar("select allocate_time from batches where seq = $1")
                            .bind(seq)
                            .fetch_one(&mut *tx)
                            .await?;
                    started_after =
                        allocated.and_then(|t| (now - super::rows::from_micros(t)).to_std().ok());
                    transition(
                        &mut tx,
                        seq,
                        State::Running,
                        &format!(
                            "The driver started on node {node}. RAPIDS Accelerator: {rapids}."
                        ),
                        now,
                    )
                    .await?;
                }
                ReportOutcome::Recorded
            }
            AgentEvent::Finished {
                succeeded,
                message,
                exit_code,
            } => {
                let to = match (state, succeeded) {
                    (State::Cancelling, _) => State::Cancelled,
                    (_, true) => State::Succeeded,
                    (_, false) => State::Failed,
                };
                let message = if to == State::Cancelled {
                    "Cancelled: the Spark processes were stopped and the cluster was released."
                        .to_string()
                } else {
                    message.clone()
                };
                ran = end(&mut tx, seq, to, &message, *exit_code, now).await?;
                ReportOutcome::Ended { seq, state: to }
            }
            AgentEvent::PartFailed { message } => {
                let to = if state == State::Cancelling {
                    State::Cancelled
                } else {
                    State::Failed
                };
                ran = end(&mut tx, seq, to, message, None, now).await?;
                ReportOutcome::Ended { seq, state: to }
            }
        };
        let change = match outcome {
            ReportOutcome::Ended { seq, .. } => Change::Ended { seq },
            ReportOutcome::Recorded => Change::Work,
        };
        self.announce(&mut tx, &change).await?;
        tx.commit().await?;
        crate::metrics::record_agent_report(event.name());
        if let Some(after) = started_after {
            crate::metrics::record_started(after);
        }
        if let ReportOutcome::Ended { state, .. } = &outcome {
            tracing::info!(batch.id = %batch_id, batch.seq = seq, to = %state, node, "batch state changed");
            crate::metrics::record_transition(*state);
            if let Some(ran) = ran {
                crate::metrics::record_run(*state, ran);
            }
        } else if matches!(event, AgentEvent::DriverStarted { .. }) && state == State::Pending {
            tracing::info!(batch.id = %batch_id, batch.seq = seq, to = %State::Running, node, "batch state changed");
            crate::metrics::record_transition(State::Running);
        }
        Ok(outcome)
    }

    /// Appends driver output of batch `uuid` at `offset`, from the node
    /// that runs its driver. A retried chunk already stored is accepted
    /// again; past `max_bytes` output is dropped and the run says so.
    /// Returns the offset the next chunk starts at.
    pub async fn append_output(
        &self,
        node: &str,
        uuid: &str,
        offset: u64,
        data: &[u8],
        max_bytes: u64,
    ) -> Result<u64, StoreError> {
        let mut tx = self.begin_write().await?;
        let seq: i64 = sqlx::query_scalar(
            "select b.seq from batches b join allocations a on a.batch_seq = b.seq \
             where b.uuid = $1 and a.node_id = $2 and a.role = 'driver' and a.released_at is null",
        )
        .bind(uuid)
        .bind(node)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| {
            StoreError::FailedPrecondition(format!(
                "node {node} does not run the driver of batch {uuid} now"
            ))
        })?;
        // The run keeps the stored size: no scan of the chunks per upload.
        let mut run = run_info(&mut tx, seq).await?;
        let stored = run.output_bytes;
        let end = offset + data.len() as u64;
        if run.output_truncated {
            return Ok(end);
        }
        if offset > stored {
            return Err(StoreError::FailedPrecondition(format!(
                "output offset {offset} leaves a gap: {stored} bytes are stored"
            )));
        }
        if end <= stored {
            return Ok(stored);
        }
        // Only the part not yet stored (a retry may overlap).
        let new = &data[(stored - offset) as usize..];
        let room = max_bytes.saturating_sub(stored) as usize;
        let keep = &new[..new.len().min(room)];
        if !keep.is_empty() {
            sqlx::query(
                "insert into batch_output (batch_seq, byte_offset, data) values ($1, $2, $3)",
            )
            .bind(seq)
            .bind(stored as i64)
            .bind(keep)
            .execute(&mut *tx)
            .await?;
        }
        run.output_bytes = stored + keep.len() as u64;
        if keep.len() < new.len() {
            run.output_truncated = true;
        }
        set_run_info(&mut tx, seq, &run).await?;
        self.announce(&mut tx, &Change::Output { seq }).await?;
        tx.commit().await?;
        Ok(end)
    }

    /// Up to `max` bytes of a batch's driver output from `offset`.
    pub async fn read_output(
        &self,
        seq: i64,
        offset: u64,
        max: usize,
    ) -> Result<OutputChunk, StoreError> {
        let rows = sqlx::query(
            "select byte_offset, data from batch_output \
             where batch_seq = $1 and byte_offset + length(data) > $2 and byte_offset < $3 \
             order by byte_offset",
        )
        .bind(seq)
        .bind(offset as i64)
        .bind((offset + max as u64) as i64)
        .fetch_all(&self.pool)
        .await?;
        let total: i64 = sqlx::query_scalar(
            "select coalesce(max(byte_offset + length(data)), 0) from batch_output where batch_seq = $1",
        )
        .bind(seq)
        .fetch_one(&self.pool)
        .await?;
        let mut data = Vec::new();
        for row in rows {
            let start: i64 = row.try_get("byte_offset")?;
            let chunk: &[u8] = row.try_get("data")?;
            let skip = (offset as i64 - start).max(0) as usize;
            let room = max - data.len();
            let piece = &chunk[skip.min(chunk.len())..];
            data.extend_from_slice(&piece[..piece.len().min(room)]);
            if data.len() == max {
                break;
            }
        }
        Ok(OutputChunk {
            next_offset: offset + data.len() as u64,
            data,
            total: total.max(0) as u64,
        })
    }
}
