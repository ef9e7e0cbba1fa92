//! This replica's health: readiness (the database answers; role, leader,
//! config generation, a full disk) and the gauges a metrics scrape reads.

use chrono::Utc;

use super::Reason;
use super::{Engine, Error, ReplicaRole};
use crate::scheduler::Snapshot;
use crate::store::Backend;

/// Whether this replica can serve, and what it does.
#[derive(Debug, Clone)]
pub struct Readiness {
    pub replica: String,
    pub role: ReplicaRole,
    pub database: Backend,
    /// With several replicas: who holds the leader lease, if it is live.
    pub leader: Option<String>,
    /// The config generation in force and the last reload.
    pub config: super::ConfigStatus,
    /// The database's disk is full: writes are refused, reads go on.
    pub store_full: bool,
}

impl Engine {
    /// The gauges of the scheduler now, for a metrics scrape.
    pub async fn snapshot(&self) -> Snapshot {
        self.lock().await.snapshot(Utc::now())
    }

    /// Long polls waiting now, by kind (`flexq_long_polls{kind}`).
    pub fn long_polls(&self) -> Vec<(&'static str, usize)> {
        self.shared.long_polls.now()
    }

    /// Whether the last write found the database's disk full.
    pub fn store_full(&self) -> bool {
        self.shared.store.is_full()
    }

    /// Ready when the database answers: this replica, its role and, with
    /// several replicas, who leads; and whether the disk is full (then
    /// a small write is tried first, to see space come back).
    pub async fn readiness(&self) -> Result<Readiness, Error> {
        let mut ready = Readiness {
            replica: self.replica_id().to_string(),
            role: self.announced_role(),
            database: self.shared.store.backend(),
            leader: None,
            config: self.config_status(),
            store_full: false,
        };
        // Space may have come back with no write since to see it.
        self.shared.store.probe_if_full().await;
        ready.store_full = self.shared.store.is_full();
        let checked = if self.replicated() {
            self.shared.store.lease_holder().await.map(|lease| {
                if lease.live && !lease.holder.is_empty() {
                    ready.leader = Some(lease.holder);
                }
            })
        } else {
            self.shared.store.ping().await
        };
        match checked {
            Ok(()) => Ok(ready),
            Err(e) => {
                tracing::warn!(error = %e, "not ready");
                Err(Error::new(
                    Reason::NotReady,
                    "the database is not reachable",
                ))
            }
        }
    }
}
