//! The scheduler's model: what the core takes and returns. A batch's key,
//! a queued batch, an allocation, a decision, a declared pool, an admin's
//! hold or cordon, and what a cluster asks for as a shape (its key, its
//! metric label, its text). Types and pure functions of them; the
//! [`Scheduler`](super::Scheduler) that acts on them is `core.rs` (its
//! state), `events.rs` and `pass.rs`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

use super::capacity::{NodeId, NodeSpec, PartNeed, Placement};
use super::preempt::Preemption;
use crate::api::EndReason;
use crate::spec::{ClusterRequest, PartRole, QuotaAmount};

/// A batch's key: its store sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BatchKey(pub i64);

/// A batch waiting for its cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingBatch {
    pub key: BatchKey,
    /// The batch id, for logs (`batch.id`).
    pub batch_id: String,
    pub project: String,
    pub region: String,
    pub priority: i32,
    pub queued_at: DateTime<Utc>,
    /// Queue mode: queue time + allocation timeout. None: default mode.
    pub deadline: Option<DateTime<Utc>>,
    pub cluster: ClusterRequest,
    /// How many times it was preempted (a victim no more once the
    /// region's `max_preemptions`).
    pub preemptions: u32,
}

/// A cluster holding capacity and quota.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    pub key: BatchKey,
    pub batch_id: String,
    pub project: String,
    pub region: String,
    pub zone: String,
    pub placements: Vec<Placement>,
    pub quota: Vec<QuotaAmount>,
    pub allocated_at: DateTime<Utc>,
    /// allocated_at + ttl, when the batch has a ttl.
    pub expected_end: Option<DateTime<Utc>>,
    /// When the batch was queued (its wait is allocated_at − queued_at).
    pub queued_at: DateTime<Utc>,
    /// The GPU type, for metric labels ("cpu" without one).
    pub accelerator: &'static str,
    /// On a placement alternative: which, and why; None on its own
    /// placement.
    pub rung: Option<OnRung>,
    /// What preemption looks at: the batch's `flexq-priority`, whether it
    /// may be preempted (`spark.flexq.preemptible`) and how many times it
    /// was.
    pub priority: i32,
    pub preemptible: bool,
    pub preemptions: u32,
}

/// A cluster allocated on a placement alternative ("rung").
#[derive(Debug, Clone, PartialEq)]
pub struct OnRung {
    /// 1 and up: its place in `ClusterRequest::alternatives`.
    pub index: u32,
    /// The GPU type the batch asked for ("cpu" without one).
    pub asked: &'static str,
    /// Why its own placement did not serve, for its history.
    pub note: String,
}

impl Allocation {
    /// The rung it holds: 0 its own placement.
    pub fn rung_index(&self) -> u32 {
        self.rung.as_ref().map_or(0, |r| r.index)
    }
}

impl Allocation {
    /// GPUs of the whole cluster.
    pub fn gpus(&self) -> u64 {
        self.placements.iter().map(|p| p.gpus.len() as u64).sum()
    }

    /// GPU-seconds held from the allocation until `until`.
    pub fn gpu_seconds(&self, until: DateTime<Utc>) -> f64 {
        let held = (until - self.allocated_at).num_milliseconds().max(0) as f64 / 1000.0;
        self.gpus() as f64 * held
    }
}

/// What the scheduler decided; the runner commits it.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Every node of the cluster, at once.
    Allocate(Allocation),
    /// The deadline passed first.
    Expire {
        key: BatchKey,
        batch_id: String,
        message: String,
        region: String,
        accelerator: &'static str,
    },
    /// Default mode: no capacity or quota right now.
    Reject {
        key: BatchKey,
        batch_id: String,
        message: String,
        /// [`EndReason::Quota`] or [`EndReason::StockOut`].
        reason: EndReason,
    },
    /// A node's lease lapsed: it leaves the capacity, and every batch that
    /// held part of it fails (a partial cluster must not go on).
    LoseNode {
        node: NodeId,
        /// The registration that lapsed; `None` for a node the config no
        /// longer declares. A registration since (on another replica)
        /// makes the decision void.
        epoch: Option<u64>,
        failed: Vec<BatchKey>,
        /// The ids of `failed`, for logs.
        failed_ids: Vec<String>,
        message: String,
        /// The clusters given back, for usage counts.
        released: Vec<Allocation>,
    },
    /// Running clusters stop so that a batch blocked by capacity starts:
    /// once every victim is gone, an `Allocate` of the preemptor follows.
    Preempt(Preemption),
}

impl Decision {
    pub fn key(&self) -> BatchKey {
        match self {
            Decision::Allocate(a) => a.key,
            Decision::Expire { key, .. } | Decision::Reject { key, .. } => *key,
            Decision::Preempt(p) => p.preemptor,
            // Not about one batch; never void.
            Decision::LoseNode { .. } => BatchKey(0),
        }
    }
}

/// The declared (not registered) capacity of a zone pool: what the region
/// could offer if every node were up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolDecl {
    pub region: String,
    pub zone: String,
    pub node: NodeSpec,
    pub max_nodes: u32,
}

/// A queue an admin held: nothing in it is allocated until it is resumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub since: DateTime<Utc>,
    /// The admin who held it.
    pub by: String,
}

/// A node an admin cordoned: it takes no new work. Draining is the same,
/// and the node shows drained once its running parts have ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cordon {
    pub since: DateTime<Utc>,
    pub by: String,
    pub drain: bool,
}

/// The holds of one region: all of it, or some projects' queues.
#[derive(Debug, Clone, Default)]
pub(super) struct RegionHolds {
    pub all: Option<Hold>,
    pub projects: HashMap<String, Hold>,
}

/// What a cluster needs, as a small key (see [`shape_key`]).
pub(super) type ShapeKey = (PartNeed, PartNeed, u32);

/// The GPU type of a cluster for metric labels: the executors', else the
/// driver's, else "cpu".
pub fn accelerator_label(c: &ClusterRequest) -> &'static str {
    c.executor
        .accelerator
        .or(c.driver.accelerator)
        .map_or("cpu", |a| a.name())
}

/// What a cluster needs, as a small key: two clusters with equal keys fit
/// or fail alike.
pub(super) fn shape_key(c: &ClusterRequest) -> ShapeKey {
    (
        PartNeed::of(PartRole::Driver, &c.driver),
        PartNeed::of(PartRole::Executor, &c.executor),
        c.executor_count,
    )
}

/// "1 driver + 8 executors of l4 (4 cores, 1 GPU, 375 GB local SSD)".
pub fn shape_text(c: &ClusterRequest) -> String {
    let exec = match c.executor.accelerator {
        Some(a) => format!(
            "{} ({} cores, {} GPU{}, {} GB local SSD)",
            a,
            c.executor.cores,
            c.executor.gpus,
            if c.executor.gpus == 1 { "" } else { "s" },
            c.executor.local_ssd_gb
        ),
        None => format!("CPU ({} cores)", c.executor.cores),
    };
    let driver = match c.driver.accelerator {
        Some(a) => format!("{a} driver"),
        None => "CPU driver".to_string(),
    };
    format!("1 {driver} + {} executors of {exec}", c.executor_count)
}
