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
pub mod filter;
mod generations;
pub mod leader;
mod leader_lock;
mod lifecycle;
mod rows;
mod runs;
mod schedule;
mod sql;
mod usage;
mod writer;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::any::{Any, AnyPoolOptions};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AnyPool, Transaction};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::api::{Batch, BatchName, State, StateHistory};
use crate::spec::ClusterRequest;

pub use durability::Durability;
pub use events::{Cursor, EventKind, EventRow, EventScope};
pub use filter::Filter;
pub use generations::ConfigGeneration;
pub use leader::{Change, ChangeStream, Heard, LeaseHolder};
pub use leader_lock::{LeaderSession, Takeover};
pub use lifecycle::Applied;
use rows::{BATCH_COLUMNS, read_batches};
pub use runs::{NodePart, OutputChunk};
pub use schedule::{NodeCordon, QueueHold};
use sql::Sql;
pub use usage::{CreatedBatch, HeldPart, ReleasedPart};

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

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn of_url(url: &str) -> Result<Backend, StoreError> {
        if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else {
            Err(StoreError::Unavailable(format!(
                "database.url {:?}: expected sqlite:PATH or postgres://HOST/DATABASE",
                crate::config::redact_url(url)
            )))
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// How long after a write found the disk full a readiness check tries a
/// write of its own ([`Store::probe_if_full`]).
const PROBE_AFTER: Duration = Duration::from_secs(5);

/// The advisory lock every PostgreSQL write transaction takes first (the
/// counterpart of SQLite's database write lock). "flexq\0\0\1" in ASCII.
const PG_WRITE_LOCK: i64 = 0x666c_6578_7100_0001;

/// Connection settings the store needs.
#[derive(Clone)]
pub struct StoreOptions {
    pub url: String,
    pub max_connections: u32,
    pub group_commit_max: usize,
    /// The leader lease, from which every PostgreSQL session's bounds
    /// follow ([`SessionLimits`]).
    pub limits: SessionLimits,
    /// Told the time and size of every group commit of creates (the
    /// engine counts them; the store keeps no metrics).
    pub observe_group: Option<GroupObserver>,
}

/// Bounds on every PostgreSQL session flexq opens, set from the leader
/// lease (`database.leader_lease` L, `database.leader_renew` R) so that
/// they agree with it: a replica cut off from the database in the middle
/// of a transaction loses it, and the locks it held, within L of its last
/// statement (`idle_in_transaction_session_timeout`), so another replica
/// can take the lease within L + R and the healthy replicas' writes wait
/// no longer than that (`lock_timeout`). TCP keepalives find a dead peer
/// in a real partition. Sent as startup options; an operator's own
/// `options[...]` in the URL come after and win.
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    pub lease: Duration,
    pub renew: Duration,
}

impl Default for SessionLimits {
    /// The default config's lease (2 s) and renewal (250 ms).
    fn default() -> Self {
        SessionLimits {
            lease: Duration::from_secs(2),
            renew: Duration::from_millis(250),
        }
    }
}

/// What a session is for: its bounds differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Session {
    /// The pool of every use case, and the listening connection.
    Pool,
    /// Leadership's own connections (the leadership session, and a pool
    /// for reading the lease): a lease statement never waits past one
    /// renewal, nor runs past the client's own timeout (L/2).
    Leadership,
    /// Migrations, which wait for another replica's (sqlx's advisory lock).
    Migration,
}

/// The longest a pool statement may run: what the engine waits for a
/// database call under its lock (`DB_UNDER_LOCK`).
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

impl SessionLimits {
    /// The server settings of a session, in milliseconds (seconds for the
    /// keepalives).
    pub(crate) fn settings(&self, session: Session) -> Vec<(&'static str, u128)> {
        let (l, r) = (self.lease.as_millis().max(2), self.renew.as_millis().max(1));
        let (lock, statement) = match session {
            Session::Pool => (l + r, STATEMENT_TIMEOUT.as_millis()),
            Session::Leadership => (r, l / 2),
            Session::Migration => (600_000, 600_000),
        };
        vec![
            ("idle_in_transaction_session_timeout", l),
            ("lock_timeout", lock),
            ("statement_timeout", statement),
            ("tcp_keepalives_idle", l.div_ceil(1000)),
            ("tcp_keepalives_interval", 1),
            ("tcp_keepalives_count", 3),
            ("tcp_user_timeout", 2 * l),
        ]
    }

    /// `url` with the settings of `session` as startup options, before
    /// the URL's own (which win).
    pub(crate) fn url(&self, url: &str, session: Session) -> String {
        let ours: Vec<String> = self
            .settings(session)
            .iter()
            .map(|(k, v)| format!("options[{k}]={v}"))
            .collect();
        match url.split_once('?') {
            Some((base, theirs)) => format!("{base}?{}&{theirs}", ours.join("&")),
            None => format!("{url}?{}", ours.join("&")),
        }
    }
}

/// See [`StoreOptions::observe_group`].
pub type GroupObserver = std::sync::Arc<dyn Fn(Duration, usize) + Send + Sync>;

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
}

impl Store {
    /// Opens (creating if needed) the database, runs the migrations and
    /// starts the group-commit writer.
    pub async fn open(options: &StoreOptions) -> Result<Store, StoreError> {
        let (pool, backend) = connect(options, Session::Pool).await?;
        match backend {
            Backend::Sqlite => migrate(&pool, backend).await?,
            Backend::Postgres => migrate_with(options).await?,
        }
        let lease_pool = match backend {
            Backend::Sqlite => pool.clone(),
            Backend::Postgres => {
                let lease = StoreOptions {
                    max_connections: 2,
                    ..options.clone()
                };
                connect(&lease, Session::Leadership).await?.0
            }
        };
        let (tx, rx) = mpsc::channel(options.group_commit_max.max(1) * 4);
        let store = Store {
            pool,
            lease_pool,
            backend,
            creates: tx,
            observe_group: options.observe_group.clone(),
            url: options.limits.url(&options.url, Session::Pool).into(),
            leadership_url: options.limits.url(&options.url, Session::Leadership).into(),
            limits: options.limits,
            full: Default::default(),
        };
        tokio::spawn(writer::run(
            store.clone(),
            rx,
            options.group_commit_max.max(1),
        ));
        Ok(store)
    }

    pub fn backend(&self) -> Backend {
        self.backend
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
        sqlx::query("delete from batch_output where batch_seq = $1")
            .bind(seq)
            .execute(&mut *tx)
            .await?;
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

    /// Commits a write transaction, and keeps what it says of the disk: a
    /// commit refused for a full disk marks the store full (readiness and
    /// metrics say so), the next one that succeeds clears it. The
    /// connection of a failed commit is never reused inside its broken
    /// transaction (see [`connect`]'s release check).
    pub(crate) async fn commit(&self, tx: Transaction<'static, Any>) -> Result<(), StoreError> {
        let result = tx.commit().await.map_err(StoreError::from);
        self.note_write(&result);
        result
    }

    /// Notes what a write's outcome says of the disk.
    pub(crate) fn note_write<T>(&self, result: &Result<T, StoreError>) {
        let mut full = self.full.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Err(StoreError::Full(e)) => {
                if full.replace(std::time::Instant::now()).is_none() {
                    tracing::error!(error = %e, "the database's disk is full: writes are refused until space is freed");
                }
            }
            Ok(_) => {
                if full.take().is_some() {
                    tracing::info!("the database accepts writes again");
                }
            }
            Err(_) => {}
        }
    }

    /// Whether the last write found the database's disk full.
    pub fn is_full(&self) -> bool {
        self.full
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// When no write has tried the disk for [`PROBE_AFTER`] since it was
    /// found full, tries a small one, so that readiness and the metric
    /// see space come back without waiting for a client's write.
    pub async fn probe_if_full(&self) {
        let due = self
            .full
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at.elapsed() >= PROBE_AFTER);
        if !due {
            return;
        }
        let result = async {
            let mut tx = self.begin_write().await?;
            sqlx::query("delete from store_probe")
                .execute(&mut *tx)
                .await?;
            sqlx::query("insert into store_probe (id, written) values (1, 'probe')")
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        }
        .await;
        self.note_write(&result);
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

async fn connect(
    options: &StoreOptions,
    session: Session,
) -> Result<(AnyPool, Backend), StoreError> {
    sqlx::any::install_default_drivers();
    let backend = Backend::of_url(&options.url)?;
    let url = match backend {
        Backend::Sqlite => options.url.clone(),
        Backend::Postgres => options.limits.url(&options.url, session),
    };
    let pool = AnyPoolOptions::new()
        .max_connections(options.max_connections.max(2))
        // A connection comes back inside a transaction when its commit
        // failed and the database had already ended the transaction (a
        // full disk: SQLite rolls back, the ROLLBACK then fails, and the
        // driver still counts it open). Reused, every later write would
        // fail ("begin_with at non-zero transaction depth"): closed
        // instead. A rollback queued by a dropped transaction is let
        // through first (the ping waits for it).
        .after_release(|conn, _| {
            Box::pin(async move {
                use sqlx::Connection;
                if !conn.is_in_transaction() {
                    return Ok(true);
                }
                conn.ping().await?;
                if conn.is_in_transaction() {
                    tracing::warn!("a database connection came back inside a transaction: closed");
                    return Ok(false);
                }
                Ok(true)
            })
        });
    let pool = match backend {
        Backend::Sqlite => {
            let file = SqliteConnectOptions::from_str(&options.url).map_err(|e| {
                StoreError::Unavailable(format!("database URL {}: {e}", options.url))
            })?;
            if let Some(dir) = file.get_filename().parent() {
                if !dir.as_os_str().is_empty() && !Path::new(dir).exists() {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
                    })?;
                }
            }
            pool.after_connect(|conn, _| {
                Box::pin(async move {
                    // WAL; FULL: a commit is on disk before the create is
                    // answered; writers wait for the lock, not fail.
                    sqlx::Executor::execute(
                        conn,
                        "pragma journal_mode = wal; pragma synchronous = full; \
                         pragma busy_timeout = 10000; pragma foreign_keys = on;",
                    )
                    .await?;
                    Ok(())
                })
            })
        }
        // A replica that lost its database must notice within the leader
        // lease, not after the kernel's TCP timeouts.
        Backend::Postgres => pool.acquire_timeout(Duration::from_secs(5)),
    };
    pool.connect(&url)
        .await
        .map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot open {}: {e}",
                crate::config::redact_url(&options.url)
            ))
        })
        .map(|pool| (pool, backend))
}

/// `select` of every batch column, with a `where` clause.
fn select_batches(condition: &str) -> String {
    format!("select {BATCH_COLUMNS} from batches where {condition}")
}

/// Applies the embedded migrations (idempotent).
pub async fn migrate(pool: &AnyPool, backend: Backend) -> Result<(), StoreError> {
    match backend {
        Backend::Sqlite => sqlx::migrate!("./migrations/sqlite").run(pool).await,
        Backend::Postgres => sqlx::migrate!("./migrations/postgres").run(pool).await,
    }
    .map_err(|e| StoreError::Unavailable(format!("migration failed: {e}")))
}

/// Opens the database and applies migrations, for `flexq migrate`.
pub async fn migrate_only(options: &StoreOptions) -> Result<(), StoreError> {
    migrate_with(options).await
}

/// Applies the migrations on a pool of their own, closed after: on
/// PostgreSQL with the bounds of a migration (it may wait for another
/// replica's), not those of the pool.
async fn migrate_with(options: &StoreOptions) -> Result<(), StoreError> {
    let once = StoreOptions {
        max_connections: 1,
        ..options.clone()
    };
    let (pool, backend) = connect(&once, Session::Migration).await?;
    let result = migrate(&pool, backend).await;
    pool.close().await;
    result
}

#[cfg(test)]
mod session_tests {
    use super::*;

    #[test]
    fn session_bounds_follow_the_lease_and_the_urls_own_options_win() {
        let limits = SessionLimits {
            lease: Duration::from_secs(2),
            renew: Duration::from_millis(250),
        };
        let get = |s: Session, k: &str| {
            limits
                .settings(s)
                .into_iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v)
        };
        assert_eq!(
            get(Session::Pool, "idle_in_transaction_session_timeout"),
            Some(2000)
        );
        assert_eq!(get(Session::Pool, "lock_timeout"), Some(2250));
        assert_eq!(get(Session::Leadership, "lock_timeout"), Some(250));
        assert_eq!(get(Session::Leadership, "statement_timeout"), Some(1000));
        assert_eq!(get(Session::Pool, "tcp_keepalives_idle"), Some(2));
        let url = limits.url(
            "postgres://h/db?sslmode=disable&options[lock_timeout]=9",
            Session::Pool,
        );
        let opts = sqlx::postgres::PgConnectOptions::from_str(&url).expect("a URL sqlx reads");
        let options = opts.get_options().expect("options").to_string();
        // Ours first, the operator's after: PostgreSQL takes the last.
        let ours = options.find("lock_timeout=2250").expect("ours");
        let theirs = options.find("lock_timeout=9").expect("theirs");
        assert!(ours < theirs, "{options}");
        assert!(url.contains("sslmode=disable"), "{url}");
    }
}
