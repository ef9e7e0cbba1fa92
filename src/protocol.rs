//! The agent protocol: what a node's agent and the server say to each
//! other (`/v1/nodes/...`). int64 values travel as strings (proto3 JSON).

use serde::{Deserialize, Serialize};

use crate::launch::SparkJob;

/// `POST /v1/nodes:register`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterNode {
    pub node_id: String,
    pub region: String,
    pub zone: String,
    pub pool: String,
    pub gpu_addresses: Vec<String>,
    pub cores: u32,
    pub memory_mb: u64,
    pub local_ssd_gb: u64,
    /// Batch uuids whose work this agent still runs (after a restart).
    /// Work the node had started and that is not listed fails.
    #[serde(default)]
    pub running: Vec<String>,
}

/// The lease a registration or heartbeat answers.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub node_id: String,
    pub epoch: String,
    pub lease_duration: String,
    pub heartbeat_interval: String,
    pub lease_expire_time: chrono::DateTime<chrono::Utc>,
}

/// `POST /v1/nodes/{node}:poll`: answers when the node's assignments
/// differ from `version`, or after `waitFor`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Poll {
    pub epoch: String,
    #[serde(default)]
    pub version: String,
    /// A duration like "20s".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Assignments {
    pub version: String,
    pub assignments: Vec<Assignment>,
}

/// What an agent must do for one part of one batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Action {
    /// Start it, or keep it running.
    Run,
    /// The batch is being cancelled: stop it and report.
    Stop,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Assignment {
    pub batch: String,
    pub uuid: String,
    /// "driver" or "executor".
    pub role: String,
    /// The executor's number in its batch (0 for the driver).
    pub index: u32,
    pub gpus: Vec<String>,
    pub cores: u32,
    pub memory_mb: u64,
    pub local_ssd_gb: u64,
    pub action: Action,
    /// The batch's Spark master, once its driver's node started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_url: Option<String>,
    /// Which attempt of the batch this part belongs to (a batch requeued
    /// after an infrastructure failure runs again as attempt 2, 3…): a
    /// part of an earlier attempt is torn down, never reused.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// The longest the batch may run, in seconds (its ttl).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// With `Stop` for a preempted batch: how long its processes have to
    /// stop after SIGTERM before SIGKILL (else the agent's `stop_grace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_grace_seconds: Option<u64>,
    /// The driver's part carries what to launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub job: Option<SparkJob>,
    /// An elastic batch's extra executor (granted beyond its core gang):
    /// its worker is given back when idle, and its going away is not a
    /// failure (docs/rules.md#elastic-batches).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub extra: bool,
    /// The driver's part also lists every part of the cluster (where the
    /// Kubernetes launcher pins the pods).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster: Vec<ClusterPart>,
}

/// One part of a batch's cluster: its node and role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPart {
    pub node: String,
    pub role: String,
}

fn first_attempt() -> u32 {
    1
}

impl Assignment {
    /// One part of one batch on a node.
    pub fn key(&self) -> (String, String, u32, u32) {
        (
            self.uuid.clone(),
            self.role.clone(),
            self.index,
            self.attempt,
        )
    }

    pub fn is_driver(&self) -> bool {
        self.role == "driver"
    }
}

/// `POST /v1/nodes/{node}:report`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub epoch: String,
    pub uuid: String,
    #[serde(flatten)]
    pub event: ReportEvent,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(
    tag = "event",
    rename_all = "SCREAMING_SNAKE_CASE",
    rename_all_fields = "camelCase"
)]
pub enum ReportEvent {
    MasterReady {
        master_url: String,
    },
    DriverStarted {
        rapids: String,
    },
    Finished {
        succeeded: bool,
        message: String,
        #[serde(default)]
        exit_code: Option<i32>,
    },
    PartFailed {
        message: String,
        /// The failure is the infrastructure's, not the batch's code (the
        /// agent stopped): the batch may go back to the queue.
        #[serde(default)]
        infrastructure: bool,
    },
    /// From the driver's node, before the end: what ran on the CPU
    /// instead of the GPUs (docs/rules.md#gpu-telemetry). Changes no state.
    CpuFallback {
        fallback: crate::api::CpuFallback,
    },
    /// From the driver's node of an elastic batch: how many executors
    /// Spark targets now, its core's and extras together (the
    /// `numberTargetExecutors` of its ExecutorAllocationManager;
    /// docs/rules.md#elastic-batches). flexq grants extras up to it.
    ExecutorDemand {
        target_executors: u32,
    },
    /// From the node of an elastic batch's extra executor `index`: its
    /// Spark worker has had no executor for the agent's `extra_idle`, so
    /// the extra goes back.
    ExtraIdle {
        index: u32,
    },
}

/// `POST /v1/nodes/{node}:telemetry`: what the GPUs of the node's parts
/// did, per batch, since the last upload (docs/rules.md#gpu-telemetry).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuTelemetry {
    pub epoch: String,
    pub batches: Vec<BatchGpuPoints>,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BatchGpuPoints {
    pub uuid: String,
    /// At most `gpu::MAX_POINTS`, oldest first.
    pub points: Vec<crate::gpu::GpuPoint>,
}

/// `POST /v1/nodes/{node}:output`: driver output from `offset` on.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutputUpload {
    pub epoch: String,
    pub uuid: String,
    pub offset: String,
    pub data: String,
}

/// `GET .../batches/{batch}/output`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchOutput {
    pub data: String,
    pub next_offset: String,
    pub total_bytes: String,
    /// The batch ended and everything stored was read.
    pub done: bool,
    #[serde(default)]
    pub truncated: bool,
}
