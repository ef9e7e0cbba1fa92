//! Durable state: batches, their operations, request ids and state history,
//! through sqlx on SQLite (WAL, `synchronous=FULL`; the embedded default)
//! or PostgreSQL (several replicas on one database), chosen by the URL.
//! Both run the same statements through sqlx's `Any` driver; the schema of
//! each lives in its own migrations folder.
//!
//! The store is a narrow set of use-case methods in domain types. Creates
//! go through one writer task that commits many of them per transaction
//! (group commit, see [`writer`]): one fsync then answers every waiter, so
//! durability does not cost throughput. Other writes are rare and use their
//! own write transactions ([`Store::begin_write`]), which take the database's
//! write lock up front: `BEGIN IMMEDIATE` on SQLite, a transaction-scoped
//! advisory lock on PostgreSQL. Writers are serialized on both, so every
//! read-then-write transaction sees what all earlier ones committed, with
//! any number of replicas. Creates on PostgreSQL are the exception (see
//! [`Store::begin_create`]): the unique indexes order them.

mod durability;
mod events;
mod extras;
pub(crate) mod filter;
mod full;
mod generations;
pub(crate) mod leader;
mod leader_lock;
mod lifecycle;
mod nodes;
mod open;
mod overrides;
mod provisioned;
mod rows;
mod runs;
mod schedule;
mod sql;
mod usage;
mod writer;

use chrono::{DateTime, Utc};
use sqlx::any::Any;
use sqlx::{AnyPool, Transaction};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::api::{Batch, BatchName, State, StateHistory};
use crate::spec::{Alternative, ClusterRequest};

pub use durability::Durability;
pub use events::{Cursor, EventKind, EventRow, EventScope};
pub use extras::{ExecutorSpan, StoredExtra};
pub use filter::Filter;
pub use generations::ConfigGeneration;
pub use leader::{Change, ChangeStream, Heard, LeaderLease};
pub use leader_lock::{LeaderSession, Takeover};
pub use lifecycle::Applied;
pub use open::{GroupObserver, SessionLimits, StoreOptions, migrate, migrate_only};
pub use overrides::{NodeCordon, QueueHold};
use rows::{BATCH_COLUMNS, read_batches};
pub use runs::{GpuPointsTaken, NodePart, OutputChunk};
pub use sql::Backend;
use sql::Sql;
pub use usage::{CreatedBatch, ReleasedPart, UsedPart};

/// Why a store call failed, in terms the API layer can answer with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// A unique index refused a row (a concurrent create of the same batch
    /// id or requestId on another replica won).
    #[error("conflict: {0}")]
    Conflict(String),
    /// A scheduler decision of a replica that no longer leads (fencing).
    #[error("fenced: {0}")]
    Fenced(String),
    /// The database's disk is full (SQLite's SQLITE_FULL, PostgreSQL's
    /// 53100): nothing more can be written until space is freed.
    #[error("the database's disk is full: {0}")]
    Full(String),
    /// The database failed; the detail is logged, not sent to clients.
    #[error("database unavailable: {0}")]
    Unavailable(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::RowNotFound => StoreError::NotFound,
            // A unique index refused a row, or two replicas' creates
            // deadlocked on one (PostgreSQL's 40P01): decided again, they
            // see each other.
            sqlx::Error::Database(d)
                if d.is_unique_violation() || d.code().as_deref() == Some("40P01") =>
            {
                StoreError::Conflict(d.to_string())
            }
            // SQLite's SQLITE_FULL (13, also as the low byte of an extended
            // code), PostgreSQL's disk_full (53100).
            sqlx::Error::Database(d)
                if d.code().is_some_and(|c| {
                    c == "53100" || c.parse::<i32>().is_ok_and(|n| n & 0xff == 13)
                }) =>
            {
                StoreError::Full(d.to_string())
            }
            other => StoreError::Unavailable(other.to_string()),
        }
    }
}

/// A batch about to be created.
#[derive(Debug, Clone)]
pub struct NewBatch {
    pub name: BatchName,
    pub uuid: Uuid,
    pub operation_id: Uuid,
    pub request_id: Option<String>,
    pub creator: String,
    /// The user's batch, output-only fields removed.
    pub spec: Batch,
    pub cluster: ClusterRequest,
    /// Where else it may run once it has waited, in order.
    pub alternatives: Vec<Alternative>,
    pub priority: i32,
    pub state_message: String,
}

/// Where a batch is in provisioning (flexq's own, beside the public state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provisioning {
    /// Waiting in its region's queue.
    Queued = 0,
    /// Holds its whole cluster.
    Provisioned = 1,
    /// The allocation timeout passed first.
    Expired = 2,
    /// Default mode without room: failed at once.
    Rejected = 3,
    /// Held a cluster and gave it back.
    Released = 4,
}

impl Provisioning {
    pub fn from_number(n: i64) -> Provisioning {
        match n {
            1 => Provisioning::Provisioned,
            2 => Provisioning::Expired,
            3 => Provisioning::Rejected,
            4 => Provisioning::Released,
            _ => Provisioning::Queued,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Provisioning::Queued => "QUEUED",
            Provisioning::Provisioned => "PROVISIONED",
            Provisioning::Expired => "EXPIRED",
            Provisioning::Rejected => "REJECTED",
            Provisioning::Released => "RELEASED",
        }
    }
}

/// A stored batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRecord {
    pub seq: i64,
    pub name: BatchName,
    pub uuid: String,
    pub operation_id: String,
    pub request_id: Option<String>,
    pub create_time: DateTime<Utc>,
    pub state: State,
    pub state_message: String,
    pub state_time: DateTime<Utc>,
    pub creator: String,
    pub spec: Batch,
    pub cluster: ClusterRequest,
    /// Where else it may run once it has waited, in order.
    pub alternatives: Vec<Alternative>,
    pub deadline: Option<DateTime<Utc>>,
    pub provisioning: Provisioning,
    pub priority: i32,
    pub zone: Option<String>,
    pub allocate_time: Option<DateTime<Utc>>,
    /// The per-batch Spark master, once started.
    pub master_url: Option<String>,
    /// Which attempt runs: 1, and one more after each requeue.
    pub attempt: u32,
    /// Why it ended without succeeding (FAILED or CANCELLED).
    pub end_reason: Option<crate::api::EndReason>,
    /// The alternative its cluster was allocated on: 0 its own placement, 1 and
    /// up its placement alternatives (`alternatives`).
    pub alternative: u32,
    /// While its cluster stops because it was preempted: the batch it
    /// gives way to (its seq), and how long its processes have to stop.
    pub preempted_by: Option<i64>,
    pub stop_grace_s: Option<u64>,
    /// How many times it was preempted.
    pub preemptions: u32,
    /// Why it last went back to the queue, once it did.
    pub requeue_reason: Option<crate::api::RequeueReason>,
    /// What the agents reported about the run.
    pub run: RunInfo,
    pub history: Vec<StateHistory>,
}

/// A batch's run as its agents reported it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_node: Option<String>,
    /// Whether the RAPIDS Accelerator was used, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rapids: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<DateTime<Utc>>,
    /// Driver output bytes stored.
    #[serde(default)]
    pub output_bytes: u64,
    /// Output past the stored limit that was dropped.
    #[serde(default)]
    pub output_truncated: bool,
    /// Its GPUs' usage, from the agents' samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<crate::gpu::GpuUsage>,
    /// What ran on the CPU instead of its GPUs, as its driver's agent
    /// reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_fallback: Option<crate::api::CpuFallback>,
}

/// What a create did.
#[derive(Debug, Clone)]
pub enum Created {
    /// A new batch.
    New(BatchRecord),
    /// The `requestId` was seen before: the first create's batch.
    Replayed(BatchRecord),
}

impl Created {
    pub fn record(&self) -> &BatchRecord {
        match self {
            Created::New(r) | Created::Replayed(r) => r,
        }
    }
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct Page {
    pub batches: Vec<BatchRecord>,
    /// The `seq` to continue below, if there are more.
    pub next_before_seq: Option<i64>,
}

/// The advisory lock every PostgreSQL write transaction takes first (the
/// counterpart of SQLite's database write lock). "flexq\0\0\1" in ASCII.
const PG_WRITE_LOCK: i64 = 0x666c_6578_7100_0001;

/// The handle every part of flexq uses; cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    /// Leadership's own connections (PostgreSQL): a busy pool or writers
    /// queued on the write lock must not make the leader miss a renewal.
    lease_pool: AnyPool,
    backend: Backend,
    creates: mpsc::Sender<writer::CreateCmd>,
    observe_group: Option<GroupObserver>,
    /// The database URL, for connections of their own (listening).
    url: std::sync::Arc<str>,
    /// The URL of the leadership session ([`LeaderSession`]), with the
    /// bounds of leadership.
    leadership_url: std::sync::Arc<str>,
    limits: SessionLimits,
    /// When a write last found the disk full, while no write has
    /// succeeded since ([`Store::commit`]).
    full: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    /// Connections opened before this replica last saw the database come
    /// back are not used again.
    suspect: open::Suspect,
}

impl Store {
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The database came back after a fault this replica saw (its
    /// leadership session or its listening connection failed, then opened
    /// again): every pooled connection opened before now is closed
    /// instead of used, as each is next taken or given back. A
    /// connection the fault lost silently would otherwise hang whoever
    /// took it next, with no error, for as long as its caller waits.
    pub fn distrust_connections(&self) {
        self.suspect.mark();
    }

    /// Begins the transaction of a group of creates. On PostgreSQL it does
    /// not take the write lock: a create reads nothing another writer
    /// changes, and the unique indexes (batch id, request id) decide a race
    /// between replicas (the loser's group is retried one by one and finds
    /// the winner's batch). Replicas then commit creates in parallel.
    pub(crate) async fn begin_create(&self) -> Result<Transaction<'static, Any>, StoreError> {
        match self.backend {
            Backend::Sqlite => self.begin_write().await,
            Backend::Postgres => Ok(self.pool.begin().await?),
        }
    }

    /// Begins a write transaction holding the database's write lock.
    pub(crate) async fn begin_write(&self) -> Result<Transaction<'static, Any>, StoreError> {
        match self.backend {
            Backend::Sqlite => Ok(self.pool.begin_with("begin immediate").await?),
            Backend::Postgres => {
                let mut tx = self.pool.begin().await?;
                sqlx::query("select 1 from pg_advisory_xact_lock($1)")
                    .bind(PG_WRITE_LOCK)
                    .execute(&mut *tx)
                    .await?;
                Ok(tx)
            }
        }
    }

    /// Creates a batch, durably. Answers after the commit.
    pub async fn create(&self, batch: NewBatch) -> Result<Created, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.creates
            .send(writer::CreateCmd { batch, reply })
            .await
            .map_err(|_| StoreError::Unavailable("the writer has stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the writer has stopped".into()))?
    }

    /// Runs a query over [`BATCH_COLUMNS`] that matches at most one batch.
    async fn one<'q>(
        &self,
        query: sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>,
    ) -> Result<Option<BatchRecord>, StoreError> {
        let rows = query.fetch_all(&self.pool).await?;
        Ok(read_batches(&self.pool, self.backend, rows).await?.pop())
    }

    pub async fn get(&self, name: &BatchName) -> Result<BatchRecord, StoreError> {
        let sql = select_batches("project = $1 and region = $2 and batch_id = $3");
        self.one(
            sqlx::query(&sql)
                .bind(&name.project)
                .bind(&name.region)
                .bind(&name.batch_id),
        )
        .await?
        .ok_or(StoreError::NotFound)
    }

    pub async fn get_by_operation(
        &self,
        project: &str,
        region: &str,
        operation_id: &str,
    ) -> Result<BatchRecord, StoreError> {
        let sql = select_batches("project = $1 and region = $2 and operation_id = $3");
        self.one(
            sqlx::query(&sql)
                .bind(project)
                .bind(region)
                .bind(operation_id),
        )
        .await?
        .ok_or(StoreError::NotFound)
    }

    /// A batch by its sequence number.
    pub async fn get_by_seq(&self, seq: i64) -> Result<BatchRecord, StoreError> {
        let sql = select_batches("seq = $1");
        self.one(sqlx::query(&sql).bind(seq))
            .await?
            .ok_or(StoreError::NotFound)
    }

    /// The oldest batch still waiting in a project's region queue.
    pub async fn oldest_queued(
        &self,
        project: &str,
        region: &str,
    ) -> Result<Option<BatchRecord>, StoreError> {
        let sql = select_batches(
            "project = $1 and region = $2 and provisioning = 0 and state = 1 order by seq limit 1",
        );
        self.one(sqlx::query(&sql).bind(project).bind(region)).await
    }

    /// For every expired batch: how long after its deadline it was failed,
    /// in microseconds.
    pub async fn expiry_lateness_us(&self) -> Result<Vec<i64>, StoreError> {
        Ok(sqlx::query_scalar(
            "select state_time - deadline from batches where provisioning = 2 order by seq",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Newest first, `page_size` at most, below `before_seq` when
    /// continuing.
    pub async fn list(
        &self,
        project: &str,
        region: &str,
        filter: &Filter,
        page_size: u32,
        before_seq: Option<i64>,
    ) -> Result<Page, StoreError> {
        let mut q = Sql::new(
            self.backend,
            format!("select {BATCH_COLUMNS} from batches where project = "),
        );
        q.bind(project).push(" and region = ").bind(region);
        if let Some(seq) = before_seq {
            q.push(" and seq < ").bind(seq);
        }
        if !filter.is_empty() {
            q.push(" and (");
            filter.push_sql(&mut q, self.backend);
            q.push(")");
        }
        q.push(" order by seq desc limit ")
            .bind(i64::from(page_size) + 1);
        let rows = q.fetch_all(&self.pool).await?;
        let mut batches = read_batches(&self.pool, self.backend, rows).await?;
        let next_before_seq = if batches.len() > page_size as usize {
            batches.truncate(page_size as usize);
            batches.last().map(|b| b.seq)
        } else {
            None
        };
        Ok(Page {
            batches,
            next_before_seq,
        })
    }

    /// Deletes a batch in a terminal state.
    pub async fn delete(&self, name: &BatchName) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let row: Option<(i64, i64)> = sqlx::query_as(
            "select seq, state from batches where project = $1 and region = $2 and batch_id = $3",
        )
        .bind(&name.project)
        .bind(&name.region)
        .bind(&name.batch_id)
        .fetch_optional(&mut *tx)
        .await?;
        let (seq, state) = row.ok_or(StoreError::NotFound)?;
        let state = State::from_number(state).unwrap_or(State::StateUnspecified);
        if !state.is_terminal() {
            return Err(StoreError::FailedPrecondition(format!(
                "the batch is {state}; only SUCCEEDED, CANCELLED or FAILED batches can be deleted (cancel it first)"
            )));
        }
        runs::forget_run(&mut tx, seq).await?;
        sqlx::query("delete from state_history where batch_seq = $1")
            .bind(seq)
            .execute(&mut *tx)
            .await?;
        sqlx::query("delete from batches where seq = $1")
            .bind(seq)
            .execute(&mut *tx)
            .await?;
        self.commit(tx).await?;
        Ok(())
    }

    /// Counts batches per state (for readiness and metrics).
    pub async fn count_by_state(&self) -> Result<Vec<(State, i64)>, StoreError> {
        let rows: Vec<(i64, i64)> =
            sqlx::query_as("select state, count(*) from batches group by state")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(s, n)| State::from_number(s).map(|s| (s, n)))
            .collect())
    }

    /// A trivial query, for `/readyz`.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("select 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Closes the pools after the writer has drained.
    pub async fn close(&self) {
        self.pool.close().await;
        self.lease_pool.close().await;
    }
}

/// `select` of every batch column, with a `where` clause.
fn select_batches(condition: &str) -> String {
    format!("select {BATCH_COLUMNS} from batches where {condition}")
}
