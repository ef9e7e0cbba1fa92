//! The full disk: a write refused because the database's disk is full
//! marks the store full (readiness and metrics say so), the next write
//! that succeeds clears it, and a readiness check tries a small write of
//! its own while it stays full ([`Store::probe_if_full`]).
//!
//! On PostgreSQL only a write that grows the database counts: a create, or
//! the probe, which makes a table of its own. A full disk there still
//! takes writes into pages the database already has (an update in place,
//! a lease renewal, WAL on another disk), so their success says nothing of
//! the space creates need.

use std::time::Duration;

use sqlx::{Any, Transaction};

use super::{Store, StoreError};

/// How long after a write found the disk full a readiness check tries a
/// write of its own ([`Store::probe_if_full`]).
const PROBE_AFTER: Duration = Duration::from_secs(5);

impl Store {
    /// Commits a write transaction, and keeps what it says of the disk: a
    /// commit refused for a full disk marks the store full (readiness and
    /// metrics say so), the next one that succeeds clears it. The
    /// connection of a failed commit is never reused inside its broken
    /// transaction (see the release check of [`connect`](super::open)).
    pub(crate) async fn commit(&self, tx: Transaction<'static, Any>) -> Result<(), StoreError> {
        let result = tx.commit().await.map_err(StoreError::from);
        self.note_write(&result, false);
        result
    }

    /// Notes what a write's outcome says of the disk; whether it `grew`
    /// the database (see the module's text).
    pub(crate) fn note_write<T>(&self, result: &Result<T, StoreError>, grew: bool) {
        let proves_space = grew || self.backend == super::Backend::Sqlite;
        let mut full = self.full.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Err(StoreError::Full(e)) => {
                let first = full.replace(std::time::Instant::now()).is_none();
                if first {
                    tracing::error!(error = %e, "the database's disk is full: writes are refused until space is freed");
                }
            }
            Ok(_) if proves_space && full.take().is_some() => {
                tracing::info!("the database accepts writes again");
            }
            _ => {}
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
            match self.backend {
                super::Backend::Sqlite => {
                    let mut tx = self.begin_write().await?;
                    sqlx::query("delete from store_probe")
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query("insert into store_probe (id, written) values (1, 'probe')")
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                }
                super::Backend::Postgres => {
                    // A table of its own, in the database's tablespace: its
                    // file is made and grown by a page, as a create's would
                    // be. Temporary, gone with the transaction; no lock.
                    let mut tx = self.pool.begin().await?;
                    sqlx::query(
                        "create temporary table flexq_space_probe (written text) on commit drop",
                    )
                    .execute(&mut *tx)
                    .await?;
                    sqlx::query("insert into flexq_space_probe values ('probe')")
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                }
            }
            Ok::<(), StoreError>(())
        }
        .await;
        self.note_write(&result, true);
    }
}
