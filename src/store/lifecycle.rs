//! Lifecycle decisions committed: a cancel and an agent's report each read
//! the batch inside a write transaction, ask the core's pure rules
//! ([`crate::scheduler::lifecycle`]) what follows, and write every step of
//! the answer in that same transaction.

use chrono::{DateTime, Utc};
use sqlx::AnyConnection;

use super::rows::decode_cluster;
use super::rows::{append_history, from_micros, micros, run_info, set_run_info, transition};
use super::{Change, Provisioning, Store, StoreError};
use crate::api::{EndReason, RequeueReason, State};
use crate::scheduler::lifecycle::{self, AgentEvent, Attempts, Holding, Outcome, Step};

/// A committed lifecycle decision, for the engine to log and count.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub seq: i64,
    pub batch_id: String,
    pub outcome: Outcome,
    /// The batch's state after the decision.
    pub state: State,
    /// How long after its allocation the driver started (when this
    /// decision made the batch RUNNING).
    pub started_after: Option<std::time::Duration>,
    /// How long the driver ran (when this decision ended a started run).
    pub ran: Option<std::time::Duration>,
}

impl Applied {
    /// The decision sent the batch back to the queue.
    pub fn requeued(&self) -> bool {
        self.outcome.requeued().is_some()
    }

    /// It went back to the queue because it gave way to another batch:
    /// preempted, or its loan reclaimed.
    pub fn gave_way(&self) -> bool {
        matches!(
            self.outcome.requeued(),
            Some(RequeueReason::Preempted | RequeueReason::Reclaimed)
        )
    }
}

/// Which attempt of batch `seq` runs, and the requeues it may have.
pub(super) async fn attempts(conn: &mut AnyConnection, seq: i64) -> Result<Attempts, StoreError> {
    let row: Option<(i64, String)> =
        sqlx::query_as("select attempt, cluster from batches where seq = $1")
            .bind(seq)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(match row {
        Some((attempt, cluster)) => Attempts {
            attempt: u32::try_from(attempt).unwrap_or(1),
            retries: decode_cluster(&cluster)?.cluster.infrastructure_retries,
        },
        None => Attempts {
            attempt: 1,
            retries: 0,
        },
    })
}

/// Sends batch `seq` back to the queue for its next attempt: queued as at
/// create (its queue time is its create time), a fresh allocation
/// deadline, no cluster, no run, no output of the failed attempt.
async fn requeue(
    conn: &mut AnyConnection,
    seq: i64,
    reason: RequeueReason,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let cluster: String = sqlx::query_scalar("select cluster from batches where seq = $1")
        .bind(seq)
        .fetch_one(&mut *conn)
        .await?;
    let cluster = decode_cluster(&cluster)?.cluster;
    let deadline = cluster.deadline(now).map(micros);
    sqlx::query(
        "update batches set provisioning = $1, deadline = $2, attempt = attempt + 1, \
         allocate_time = null, zone = null, alternative = null, master_url = null, \
         run_info = null, end_reason = null, preempted_by = null, stop_grace_s = null, \
         stop_reason = null, extras_wanted = null, requeue_reason = $3 where seq = $4",
    )
    .bind(Provisioning::Queued as i64)
    .bind(deadline)
    .bind(reason.number())
    .bind(seq)
    .execute(&mut *conn)
    .await?;
    super::runs::forget_run(conn, seq).await
}

/// Marks every active part of a batch's cluster released.
async fn release(conn: &mut AnyConnection, seq: i64, now: DateTime<Utc>) -> Result<(), StoreError> {
    sqlx::query(
        "update allocations set released_at = $1 where batch_seq = $2 and released_at is null",
    )
    .bind(micros(now))
    .bind(seq)
    .execute(&mut *conn)
    .await?;
    sqlx::query("update batches set provisioning = $1 where seq = $2")
        .bind(Provisioning::Released as i64)
        .bind(seq)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Writes the steps of one decision about batch `seq`, in order.
pub(super) async fn write_steps(
    conn: &mut AnyConnection,
    seq: i64,
    batch_id: &str,
    from: State,
    outcome: Outcome,
    now: DateTime<Utc>,
) -> Result<Applied, StoreError> {
    let mut applied = Applied {
        seq,
        batch_id: batch_id.to_string(),
        outcome: Outcome::default(),
        state: outcome.states().last().unwrap_or(from),
        started_after: None,
        ran: None,
    };
    let mut ended_for = None;
    let mut current = from;
    for step in &outcome.steps {
        match step {
            Step::To(to, message) => {
                current = *to;
                if *to == State::Running {
                    applied.started_after = started_after(conn, seq, now).await?;
                }
                transition(conn, seq, *to, message, now).await?;
            }
            // Not a transition: the state and the time it was entered stay.
            Step::Note(message) => write_note(conn, seq, current, message, now).await?,
            Step::Release => release(conn, seq, now).await?,
            Step::MasterUrl(url) => {
                sqlx::query("update batches set master_url = $1 where seq = $2")
                    .bind(url)
                    .bind(seq)
                    .execute(&mut *conn)
                    .await?;
            }
            Step::DriverStarted { node, rapids } => {
                driver_started(conn, seq, node, rapids, now).await?;
            }
            Step::Requeue(reason) => requeue(conn, seq, *reason, now).await?,
            Step::Preempted => mark_preempted(conn, seq, now).await?,
            Step::Reclaimed => mark_lost(conn, seq, LOST_TO_RECLAIM, now).await?,
            // A reason a policy gave before the end (`Because`) is kept.
            Step::Ended(reason) => ended_for = keep_end_reason(conn, seq, *reason).await?,
            Step::Because(reason) => {
                sqlx::query("update batches set end_reason = $1 where seq = $2")
                    .bind(reason.number())
                    .bind(seq)
                    .execute(&mut *conn)
                    .await?;
            }
            Step::IdleWarned => {
                let mut run = run_info(conn, seq).await?;
                run.gpu.get_or_insert_default().warned = true;
                set_run_info(conn, seq, &run).await?;
            }
            Step::RunEnded { exit_code } => {
                applied.ran = run_ended(conn, seq, *exit_code, now).await?;
            }
        }
    }
    applied.outcome = with_end_reason(outcome, ended_for);
    Ok(applied)
}

/// How long batch `seq` waited between its allocation and `now`, when it
/// starts running.
async fn started_after(
    conn: &mut AnyConnection,
    seq: i64,
    now: DateTime<Utc>,
) -> Result<Option<std::time::Duration>, StoreError> {
    let allocated: Option<i64> =
        sqlx::query_scalar("select allocate_time from batches where seq = $1")
            .bind(seq)
            .fetch_one(&mut *conn)
            .await?;
    Ok(allocated.and_then(|t| (now - from_micros(t)).to_std().ok()))
}

/// Sets batch `seq`'s state message and adds it to its history, in its
/// `current` state.
async fn write_note(
    conn: &mut AnyConnection,
    seq: i64,
    current: State,
    message: &str,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query("update batches set state_message = $1 where seq = $2")
        .bind(message)
        .bind(seq)
        .execute(&mut *conn)
        .await?;
    append_history(conn, seq, current, message, now).await?;
    Ok(())
}

/// Records in batch `seq`'s run where its driver started and with what
/// RAPIDS, and when it started, if not already known.
async fn driver_started(
    conn: &mut AnyConnection,
    seq: i64,
    node: &str,
    rapids: &str,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let mut run = run_info(conn, seq).await?;
    run.driver_node = Some(node.to_string());
    run.rapids = Some(rapids.to_string());
    run.start_time.get_or_insert(now);
    set_run_info(conn, seq, &run).await
}

/// What `allocations.preempted` says of a part given back: 1 the work it
/// held was lost to a preemption, 2 to a reclaim (0: not lost).
pub(super) const LOST_TO_PREEMPTION: i64 = 1;
pub(super) const LOST_TO_RECLAIM: i64 = 2;

/// Counts a preemption of batch `seq`.
async fn mark_preempted(
    conn: &mut AnyConnection,
    seq: i64,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query("update batches set preemptions = preemptions + 1 where seq = $1")
        .bind(seq)
        .execute(&mut *conn)
        .await?;
    mark_lost(conn, seq, LOST_TO_PREEMPTION, now).await
}

/// The parts of batch `seq` given back in this decision (at `now`) held
/// work lost, to `cause`.
async fn mark_lost(
    conn: &mut AnyConnection,
    seq: i64,
    cause: i64,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query("update allocations set preempted = $1 where batch_seq = $2 and released_at = $3")
        .bind(cause)
        .bind(seq)
        .bind(micros(now))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Sets batch `seq`'s end reason unless it already has one; answers the
/// reason it keeps.
async fn keep_end_reason(
    conn: &mut AnyConnection,
    seq: i64,
    reason: EndReason,
) -> Result<Option<EndReason>, StoreError> {
    let kept: Option<i64> = sqlx::query_scalar(
        "update batches set end_reason = coalesce(end_reason, $1) where seq = $2 \
         returning end_reason",
    )
    .bind(reason.number())
    .bind(seq)
    .fetch_one(&mut *conn)
    .await?;
    Ok(kept.and_then(EndReason::from_number))
}

/// Records the end of batch `seq`'s run and its exit code, if it has one;
/// answers how long the run took.
async fn run_ended(
    conn: &mut AnyConnection,
    seq: i64,
    exit_code: Option<i32>,
    now: DateTime<Utc>,
) -> Result<Option<std::time::Duration>, StoreError> {
    let mut run = run_info(conn, seq).await?;
    run.exit_code = exit_code.or(run.exit_code);
    run.end_time = Some(now);
    set_run_info(conn, seq, &run).await?;
    Ok(run.start_time.and_then(|t| (now - t).to_std().ok()))
}

/// The outcome, saying the reason the batch really ended for (`kept`).
fn with_end_reason(mut outcome: Outcome, kept: Option<EndReason>) -> Outcome {
    if let Some(kept) = kept {
        for step in &mut outcome.steps {
            if let Step::Ended(reason) = step {
                *reason = kept;
            }
        }
    }
    outcome
}

impl Store {
    /// Applies the GPU idle policy's verdict on batch `seq`
    /// ([`lifecycle::gpu_idle`]): a warning in its history, or its cancel.
    pub async fn gpu_idle(
        &self,
        seq: i64,
        verdict: &crate::gpu::IdleVerdict,
        now: DateTime<Utc>,
    ) -> Result<Applied, StoreError> {
        let mut tx = self.begin_write().await?;
        let (state, batch_id): (i64, String) =
            sqlx::query_as("select state, batch_id from batches where seq = $1")
                .bind(seq)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or(StoreError::NotFound)?;
        let state = State::from_number(state).unwrap_or(State::StateUnspecified);
        // Read in this write transaction, not taken from the upload's
        // snapshot: another upload may have warned since.
        let warned = run_info(&mut tx, seq).await?.gpu.is_some_and(|g| g.warned);
        let outcome = lifecycle::gpu_idle(state, warned, verdict);
        let applied = write_steps(&mut tx, seq, &batch_id, state, outcome, now).await?;
        if !applied.outcome.steps.is_empty() {
            self.announce(&mut tx, &Change::Work).await?;
        }
        self.commit(tx).await?;
        Ok(applied)
    }

    /// Cancels the batch of an operation ([`lifecycle::cancel`]).
    pub async fn cancel(
        &self,
        project: &str,
        region: &str,
        operation_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Applied, StoreError> {
        let mut tx = self.begin_write().await?;
        let row: Option<(i64, i64, i64, String)> = sqlx::query_as(
            "select seq, state, provisioning, batch_id from batches \
             where project = $1 and region = $2 and operation_id = $3",
        )
        .bind(project)
        .bind(region)
        .bind(operation_id)
        .fetch_optional(&mut *tx)
        .await?;
        let (seq, state, provisioning, batch_id) = row.ok_or(StoreError::NotFound)?;
        let state = State::from_number(state).unwrap_or(State::StateUnspecified);
        let held = Provisioning::from_number(provisioning) == Provisioning::Provisioned;
        let outcome = lifecycle::cancel(state, held)
            .map_err(|refused| StoreError::FailedPrecondition(refused.0))?;
        let applied = write_steps(&mut tx, seq, &batch_id, state, outcome, now).await?;
        let change = if applied.outcome.ended().is_some() {
            Change::Ended { seq }
        } else {
            Change::Work
        };
        self.announce(&mut tx, &change).await?;
        self.commit(tx).await?;
        Ok(applied)
    }

    /// Applies an agent's report about batch `uuid` from `node`
    /// ([`lifecycle::report`]).
    pub async fn report(
        &self,
        node: &str,
        uuid: &str,
        event: &AgentEvent,
        now: DateTime<Utc>,
    ) -> Result<Applied, StoreError> {
        let mut tx = self.begin_write().await?;
        let (seq, state, batch_id, preempted_by, preemptor, stop_reason): (
            i64,
            i64,
            String,
            Option<i64>,
            Option<String>,
            Option<i64>,
        ) = sqlx::query_as(
            "select b.seq, b.state, b.batch_id, b.preempted_by, p.batch_id, b.stop_reason from batches b \
             left join batches p on p.seq = b.preempted_by where b.uuid = $1",
        )
        .bind(uuid)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        // Being preempted: by this batch (or by one deleted since).
        let preempted_by =
            preempted_by.map(|_| preemptor.unwrap_or_else(|| "a batch deleted since".to_string()));
        // Stopping for it since before the reason was stored: preempted.
        let reason = stop_reason
            .and_then(RequeueReason::from_number)
            .unwrap_or(RequeueReason::Preempted);
        let state = State::from_number(state).unwrap_or(State::StateUnspecified);
        let roles: Vec<String> = sqlx::query_scalar(
            "select role from allocations where batch_seq = $1 and node_id = $2 and released_at is null",
        )
        .bind(seq)
        .bind(node)
        .fetch_all(&mut *tx)
        .await?;
        let holding = if roles.iter().any(|r| r == "driver") {
            Holding::Driver
        } else if roles.is_empty() {
            Holding::Nothing
        } else {
            Holding::Executors
        };
        let attempts = attempts(&mut tx, seq).await?;
        let outcome = lifecycle::report(
            state,
            node,
            &batch_id,
            holding,
            event,
            attempts,
            preempted_by
                .as_deref()
                .map(|by| lifecycle::StoppedFor { by, reason }),
        )
        .map_err(|refused| StoreError::FailedPrecondition(refused.0))?;
        let applied = write_steps(&mut tx, seq, &batch_id, state, outcome, now).await?;
        let change = if applied.outcome.ended().is_some() {
            Change::Ended { seq }
        } else if applied.requeued() {
            Change::Requeued { seq }
        } else {
            Change::Work
        };
        self.announce(&mut tx, &change).await?;
        self.commit(tx).await?;
        Ok(applied)
    }
}
