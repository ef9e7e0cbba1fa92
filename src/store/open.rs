//! Opening the store: which database a URL names ([`Backend`], `sql.rs`),
//! the connection settings ([`StoreOptions`]) and the bounds of every
//! PostgreSQL session ([`SessionLimits`]), the pools (`connect`) and the
//! embedded migrations, and [`Store::open`], which puts them together and
//! starts the group-commit writer.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;
use sqlx::sqlite::SqliteConnectOptions;
use tokio::sync::mpsc;

use super::sql::Backend;
use super::{Store, StoreError, writer};

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
    /// How long a write on a pool session may take, seen from the
    /// client: the server's `lock_timeout` (L + R) ends a live session's
    /// wait first, and a lease more is room for the rest of it. What
    /// outlasts this waits on a connection lost without a word.
    pub(crate) fn write_bound(&self) -> Duration {
        self.lease * 2 + self.renew
    }

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

impl Store {
    /// Opens (creating if needed) the database, runs the migrations and
    /// starts the group-commit writer.
    pub async fn open(options: &StoreOptions) -> Result<Store, StoreError> {
        let suspect = Suspect::default();
        let (pool, backend) = connect(options, Session::Pool, &suspect).await?;
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
                connect(&lease, Session::Leadership, &suspect).await?.0
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
            suspect,
        };
        tokio::spawn(writer::run(
            store.clone(),
            rx,
            options.group_commit_max.max(1),
        ));
        Ok(store)
    }
}

/// The instant before which every pooled connection is suspect: opened
/// before this replica last saw the database come back after a fault
/// (a partition, a restart). Such a connection may be one that the fault
/// lost without a word (a proxy or NAT that forgot it, its bytes held for
/// good): used, it would hang its caller with no error. So it is never
/// handed out again, nor taken back: closed, and a fresh one opened
/// ([`Store::distrust_connections`]).
#[derive(Clone, Default)]
pub(super) struct Suspect(std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>);

impl Suspect {
    pub(super) fn mark(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
    }

    /// Whether a connection `age` old was opened before the mark.
    fn is_suspect(&self, age: Duration) -> bool {
        let mark = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        mark.is_some_and(|mark| {
            std::time::Instant::now()
                .checked_sub(age)
                .is_none_or(|born| born < mark)
        })
    }
}

async fn connect(
    options: &StoreOptions,
    session: Session,
    suspect: &Suspect,
) -> Result<(AnyPool, Backend), StoreError> {
    sqlx::any::install_default_drivers();
    let backend = Backend::of_url(&options.url)?;
    let url = match backend {
        Backend::Sqlite => options.url.clone(),
        Backend::Postgres => options.limits.url(&options.url, session),
    };
    // A connection's check never waits longer than this: one lost in a
    // partition never answers.
    let bound = (options.limits.lease / 2).max(Duration::from_millis(100));
    let released = suspect.clone();
    let pool = AnyPoolOptions::new()
        .max_connections(options.max_connections.max(2))
        // A connection comes back inside a transaction when its commit
        // failed and the database had already ended the transaction (a
        // full disk: SQLite rolls back, the ROLLBACK then fails, and the
        // driver still counts it open). Reused, every later write would
        // fail ("begin_with at non-zero transaction depth"): closed
        // instead. A rollback queued by a dropped transaction is let
        // through first (the ping waits for it, bounded). A suspect
        // connection is closed, not taken back.
        .after_release(move |conn, meta| {
            let suspect = released.is_suspect(meta.age);
            Box::pin(async move {
                use sqlx::Connection;
                if suspect {
                    return Ok(false);
                }
                if !conn.is_in_transaction() {
                    return Ok(true);
                }
                if !matches!(tokio::time::timeout(bound, conn.ping()).await, Ok(Ok(()))) {
                    return Ok(false);
                }
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
        Backend::Postgres => {
            // The check before a pooled connection is handed out, bounded:
            // sqlx's own ping is bounded only by the acquire's timeout. A
            // suspect connection is not even tried.
            let suspect = suspect.clone();
            pool.acquire_timeout(Duration::from_secs(5))
                .test_before_acquire(false)
                .before_acquire(move |conn, meta| {
                    let suspect = suspect.is_suspect(meta.age);
                    Box::pin(async move {
                        use sqlx::Connection;
                        Ok(!suspect
                            && matches!(tokio::time::timeout(bound, conn.ping()).await, Ok(Ok(()))))
                    })
                })
        }
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
    let (pool, backend) = connect(&once, Session::Migration, &Suspect::default()).await?;
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
