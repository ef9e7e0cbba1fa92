//! The usage report: who used which GPUs in a region over a time window,
//! and how long their batches waited.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// `GET /v1/projects/{project}/regions/{region}/usage`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    pub region: String,
    pub start_time: DateTime<Utc>,
    pub end_time: DateTime<Utc>,
    /// One row per project and accelerator type, by project then type.
    pub rows: Vec<UsageRow>,
    /// The sum of the rows (its `project` and `acceleratorType` are `*`).
    pub total: UsageRow,
}

/// One project's use of one accelerator type in the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageRow {
    pub project: String,
    /// flexq's GPU name (`l4`, ...), or `cpu`.
    pub accelerator_type: String,
    /// GPUs × 1000 × seconds held inside the window (int64 as a string,
    /// exact); `gpuHours` is the same in hours.
    pub milli_accelerator_seconds: String,
    pub gpu_hours: f64,
    /// `gpuHours` × the GPU type's weight (`scheduling.gpu_weights`,
    /// default 1): what the fair-share order charges the project.
    pub weighted_gpu_hours: f64,
    /// Of `gpuHours`, those held by clusters that were then preempted:
    /// work lost, counted to the victim's project.
    pub lost_gpu_hours: f64,
    /// Of `gpuHours`, those held by loans their owners then reclaimed:
    /// work lost to reclaim, counted to the borrower's project
    /// (docs/rules.md#loans-and-reclaim).
    pub reclaimed_gpu_hours: f64,
    /// Of `gpuHours`, those held by elastic batches' extra executors,
    /// granted beyond their core gang (docs/rules.md#elastic-batches); the
    /// rest were held by core gangs.
    pub extra_gpu_hours: f64,
    /// Local SSD GB × hours held inside the window.
    pub local_ssd_gb_hours: f64,
    /// Batches created in the window.
    pub batches: u64,
    /// Of those, how many were allocated, and how many expired in the
    /// queue.
    pub allocated: u64,
    pub expired: u64,
    /// `expired` ÷ (allocated + expired), in percent; 0 when neither.
    pub expired_percent: f64,
    /// Seconds from create to allocation of the allocated ones: the median
    /// and the 95th percentile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_p50_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_p95_seconds: Option<f64>,
}
