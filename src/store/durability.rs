//! Whether a commit the store answers is on disk: the settings a session
//! runs with, read back from the database rather than trusted from the
//! code that set them. A process crash (SIGKILL) cannot tell these apart,
//! since the kernel still holds what the process wrote; a power loss can.
//! Any other setting of a session (the bounds `open.rs` sets from the
//! lease) is read back the same way ([`Store::session_settings`]).

use sqlx::AnyConnection;

use super::{Backend, Store, StoreError};

/// The settings that decide whether a committed write survives a power
/// loss, as one session of the store reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durability {
    /// Each setting with its value, as the database names them
    /// (SQLite: `synchronous`, `journal_mode`; PostgreSQL:
    /// `synchronous_commit`, `fsync`).
    pub settings: Vec<(&'static str, String)>,
    /// Why a commit may not be on disk when it is answered; empty when
    /// every setting is a durable one.
    pub weaknesses: Vec<String>,
}

impl Durability {
    /// Judges the settings read from a session of `backend`.
    pub fn judge(backend: Backend, settings: Vec<(&'static str, String)>) -> Durability {
        let weaknesses = settings
            .iter()
            .filter_map(|(name, value)| {
                let durable = match (backend, *name) {
                    // 2 FULL, 3 EXTRA: the WAL is synced at each commit.
                    // 1 NORMAL syncs only at checkpoints in WAL mode.
                    (Backend::Sqlite, "synchronous") => matches!(value.as_str(), "2" | "3"),
                    (Backend::Sqlite, "journal_mode") => value.eq_ignore_ascii_case("wal"),
                    // `local`, `on` and the remote levels flush the local
                    // WAL before a commit returns; `off` does not.
                    (Backend::Postgres, "synchronous_commit") => value != "off",
                    (Backend::Postgres, "fsync") => value == "on",
                    _ => true,
                };
                (!durable).then(|| format!("{name} = {value}"))
            })
            .collect();
        Durability {
            settings,
            weaknesses,
        }
    }

    pub fn is_durable(&self) -> bool {
        self.weaknesses.is_empty()
    }
}

impl Store {
    /// The durability settings of one of the store's own sessions.
    pub async fn durability(&self) -> Result<Durability, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let settings = read(&mut conn, self.backend()).await?;
        Ok(Durability::judge(self.backend(), settings))
    }

    /// The server settings `names` of one session of the store's pool
    /// (PostgreSQL), as the server reports them: what the session runs
    /// with, whatever its URL asked. See [`read_settings`].
    pub async fn session_settings(
        &self,
        names: &[&str],
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        read_settings(&mut conn, names).await
    }

    /// The same, of one session of the pool that reads the lease (opened
    /// with the leadership's bounds).
    pub async fn lease_session_settings(
        &self,
        names: &[&str],
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut conn = self.lease_pool.acquire().await?;
        read_settings(&mut conn, names).await
    }
}

/// Each of `names` with its value on the session `conn` (PostgreSQL's
/// `pg_settings.setting`: in the setting's own unit, milliseconds for
/// the timeouts, seconds for the keepalives), in the order asked.
pub(super) async fn read_settings(
    conn: &mut AnyConnection,
    names: &[&str],
) -> Result<Vec<(String, String)>, StoreError> {
    let mut out = Vec::new();
    for name in names {
        let value: String = sqlx::query_scalar("select setting from pg_settings where name = $1")
            .bind(*name)
            .fetch_one(&mut *conn)
            .await?;
        out.push((name.to_string(), value));
    }
    Ok(out)
}

async fn read(
    conn: &mut AnyConnection,
    backend: Backend,
) -> Result<Vec<(&'static str, String)>, StoreError> {
    let queries: &[(&'static str, &str)] = match backend {
        Backend::Sqlite => &[
            // (an integer, cast: the Any driver reads it as text alike)
            (
                "synchronous",
                "select cast(synchronous as text) from pragma_synchronous",
            ),
            (
                "journal_mode",
                "select journal_mode from pragma_journal_mode",
            ),
        ],
        Backend::Postgres => &[
            (
                "synchronous_commit",
                "select current_setting('synchronous_commit')",
            ),
            ("fsync", "select current_setting('fsync')"),
        ],
    };
    let mut out = Vec::new();
    for (name, query) in queries {
        let value: String = sqlx::query_scalar(query).fetch_one(&mut *conn).await?;
        out.push((*name, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(backend: Backend, settings: &[(&'static str, &str)]) -> Vec<String> {
        let settings = settings.iter().map(|(n, v)| (*n, v.to_string())).collect();
        Durability::judge(backend, settings).weaknesses
    }

    #[test]
    fn only_settings_that_sync_each_commit_are_durable() {
        let sqlite = |sync: &str, journal: &str| {
            judge(
                Backend::Sqlite,
                &[("synchronous", sync), ("journal_mode", journal)],
            )
        };
        assert!(sqlite("2", "wal").is_empty());
        assert!(sqlite("3", "wal").is_empty());
        assert_eq!(sqlite("1", "wal"), ["synchronous = 1"]);
        assert_eq!(sqlite("0", "wal"), ["synchronous = 0"]);
        assert_eq!(sqlite("2", "memory"), ["journal_mode = memory"]);
        let pg = |commit: &str, fsync: &str| {
            judge(
                Backend::Postgres,
                &[("synchronous_commit", commit), ("fsync", fsync)],
            )
        };
        for commit in ["on", "local", "remote_write", "remote_apply"] {
            assert!(pg(commit, "on").is_empty(), "{commit}");
        }
        assert_eq!(pg("off", "on"), ["synchronous_commit = off"]);
        assert_eq!(pg("on", "off"), ["fsync = off"]);
    }
}
