//! The full disk: a write refused because the database's disk is full
//! marks the store full (readiness and metrics say so), the next write
//! that succeeds clears it, and a readiness check tries a small write of
//! its own while it stays full ([`Store::probe_if_full`]).

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
}
