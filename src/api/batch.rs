//! The Batch resource and its Operation, as they travel on the wire
//! (proto3 JSON of `google.cloud.dataproc.v1`).
//!
//! One struct serves both directions. Fields a client may set are checked
//! by `deny_unknown_fields` so a typo is an error, not a silently dropped
//! setting; output-only fields are accepted on input (proto3 JSON parsers
//! do) and replaced by the server.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::State;

/// A Spark batch workload.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Batch {
    // Output only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_time: Option<DateTime<Utc>>,

    // The workload: exactly one of these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pyspark_batch: Option<PySparkBatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spark_batch: Option<SparkBatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spark_sql_batch: Option<SparkSqlBatch>,

    // Output only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_info: Option<RuntimeInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_time: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creator: Option<String>,

    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_config: Option<RuntimeConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_config: Option<EnvironmentConfig>,

    // Output only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_history: Vec<StateHistory>,

    /// Output only, flexq's extension (other clients ignore it): where the
    /// batch is in the capacity queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flexq: Option<FlexqInfo>,
}

/// What of a batch ran on the CPU instead of its GPUs
/// (docs/rules.md#gpu-telemetry).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CpuFallback {
    /// Distinct lines the RAPIDS Accelerator wrote for operators and
    /// expressions that could not run on the GPU (a plan logged again
    /// counts once).
    #[serde(default)]
    pub operators: u64,
    /// The first distinct ones (at most 5), `<Operator>: why`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// It asked for GPUs and ran without the RAPIDS Accelerator: all of it
    /// ran on the CPU.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub without_rapids: bool,
}

/// How busy a batch's GPUs were, weighted by GPU-seconds
/// (docs/rules.md#gpu-telemetry).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuUtilization {
    /// Mean utilization, percent.
    pub mean_percent: f64,
    /// 95th percentile of utilization, percent (to 5 %).
    pub p95_percent: f64,
    /// The fullest GPU's memory in use at its peak, MiB.
    pub peak_memory_mb: u64,
    /// GPU-seconds in which every GPU of a part was idle, divided by the
    /// cluster's GPUs: the seconds the whole cluster sat idle when its
    /// parts idle together.
    pub idle_seconds: f64,
    /// GPU-seconds sampled.
    pub sampled_gpu_seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sample_time: Option<DateTime<Utc>>,
}

/// A batch's GPU utilization over time, for a chart
/// (`GET .../batches/{batch}/gpuUtilization`; docs/rules.md#gpu-telemetry):
/// at most 120 slots of `stepSeconds` each, the step doubling as the run
/// grows longer, so that a run of any length is shown whole.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuChart {
    /// The width of each slot, seconds (10, then 20, 40…).
    pub step_seconds: u64,
    /// The slots with points in them, oldest first.
    pub points: Vec<GpuChartPoint>,
}

/// What a batch's GPUs did in one slot of its chart.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuChartPoint {
    /// Where the slot begins.
    pub time: DateTime<Utc>,
    /// Mean utilization in the slot, percent, weighted by GPU-seconds.
    pub mean_percent: f64,
    /// The busiest GPU's utilization in the slot, percent.
    pub max_percent: f64,
    /// The fullest GPU's memory in use in the slot, MiB.
    pub peak_memory_mb: u64,
}

/// The placement a batch was allocated with on one of its alternatives.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementInfo {
    /// 1 and up: its place in `alternatives`.
    pub alternative: u32,
    pub region: String,
    /// The GPU type it runs on.
    pub accelerator: String,
    /// "1 l4 driver + 8 executors of a100-40 (12 cores, 1 GPU, …)".
    pub shape: String,
    pub executor_cores: u32,
    pub executor_count: u32,
    /// It runs on capacity others own — another GPU type, or another
    /// region — which they may take back (docs/rules.md#loans-and-reclaim).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub loan: bool,
    /// Whose capacity a loan is: "a100-40 in europe-west4-b".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lender: Option<String>,
}

/// flexq's view of a batch's provisioning.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlexqInfo {
    /// QUEUED, PROVISIONED, EXPIRED, REJECTED or RELEASED.
    pub provisioning_state: String,
    /// queue or default.
    pub provisioning_mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_deadline: Option<DateTime<Utc>>,
    /// Why it ended without succeeding, once it has: EXPIRED, STOCK_OUT,
    /// QUOTA, INFRASTRUCTURE, WORK_FAILED, CANCELLED or IDLE_GPUS. Its operation's
    /// error code follows from it, never from the message's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
    /// Its placement alternatives, in order, as `GPU_TYPE after DELAY`,
    /// `region REGION after DELAY` or `on-demand after DELAY`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<String>,
    /// Once allocated on one of its alternatives: which, and the placement
    /// it runs with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementInfo>,
    /// Which attempt runs, once an infrastructure failure requeued the
    /// batch (2, 3…); absent for the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// Why it last went back to the queue, once it did: PREEMPTED or
    /// INFRASTRUCTURE. Its operation's metadata warns of it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue_reason: Option<String>,
    /// How many times its cluster was preempted (docs/rules.md#preemption),
    /// once it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptions: Option<u32>,
    /// True while its cluster stops because it was preempted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preempting: bool,
    /// 1-based position in its region's queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<usize>,
    /// Why it is not admitted yet, with numbers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_admitted_reasons: Vec<String>,
    /// The same reasons, each with its kind, for scripts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_admitted: Vec<NotAdmittedReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_start_time: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocate_time: Option<DateTime<Utc>>,
    /// The cluster's parts, node by node, once provisioned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<AllocatedPart>,
    /// While an elastic batch (Spark's dynamic allocation on) holds its
    /// cluster: its core gang and its extras.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<ElasticInfo>,
}

/// A running elastic batch: executors of its core gang, and its extras
/// (docs/rules.md#elastic-batches).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElasticInfo {
    /// Executors allocated whole with the cluster.
    pub core: u32,
    pub extras: ExtrasInfo,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtrasInfo {
    /// Extra executors held now.
    pub running: u32,
    /// Extras Spark wants (its target less the core, as its driver's agent
    /// last reported).
    pub wanted: u32,
    /// The most it may hold (`spark.dynamicAllocation.maxExecutors` less
    /// the core).
    pub max: u32,
    /// Where it wants more than it holds, what stops it:
    /// QUEUED_BATCHES (queued batches wait for that capacity),
    /// REGION_SHARE (the region's cap on extras), QUOTA, CAPACITY,
    /// STOPPING (preempted or reclaimed) or EXTRAS_OFF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
}

/// A batch's executors over time (`GET .../batches/{batch}/executors`;
/// docs/rules.md#elastic-batches): one point at each change, each holding
/// until the next; the last is now's. From its stored parts, every
/// attempt's, so a requeue shows as a fall to none and a new start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorChart {
    /// The changes, oldest first (at most the last 1000).
    pub points: Vec<ExecutorPoint>,
}

/// The executors a batch held from `time` on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorPoint {
    pub time: DateTime<Utc>,
    /// Executors held, core and extras together.
    pub executors: u32,
    /// Of those, extras (granted beyond the core gang).
    pub extras: u32,
}

/// One reason a queued batch is not admitted: its kind and its message
/// (the message is also in `notAdmittedReasons`, at the same place).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NotAdmittedReason {
    /// QUOTA, CAPACITY, RESERVATION, HELD, FAIR_SHARE, QUEUED_AHEAD,
    /// PREEMPTION, ALTERNATIVE, PROVISIONING or LIKELY_TO_EXPIRE.
    pub reason: String,
    pub message: String,
}

/// One part of an allocated cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedPart {
    pub node: String,
    pub role: String,
    /// An executor's number in its batch (what its agent exports to the
    /// executor as FLEXQ_EXECUTOR_INDEX).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    pub gpus: Vec<String>,
    pub cores: u32,
    pub memory_mb: u64,
    pub local_ssd_gb: u64,
    #[serde(default)]
    pub is_virtual: bool,
}

impl Batch {
    /// The workload kind as the CLI shows it (`JOB_TYPE`).
    pub fn job_type(&self) -> &'static str {
        if self.pyspark_batch.is_some() {
            "pyspark"
        } else if self.spark_batch.is_some() {
            "spark"
        } else if self.spark_sql_batch.is_some() {
            "spark-sql"
        } else {
            "unknown"
        }
    }

    /// The user's part of the batch: every output-only field cleared.
    pub fn into_user_spec(self) -> Batch {
        Batch {
            name: None,
            uuid: None,
            create_time: None,
            runtime_info: None,
            state: None,
            state_message: None,
            state_time: None,
            creator: None,
            operation: None,
            state_history: Vec::new(),
            flexq: None,
            ..self
        }
    }

    /// The runtime properties, or an empty map.
    pub fn properties(&self) -> &BTreeMap<String, String> {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        self.runtime_config
            .as_ref()
            .map(|r| &r.properties)
            .unwrap_or(&EMPTY)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PySparkBatch {
    #[serde(default)]
    pub main_python_file_uri: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub python_file_uris: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jar_file_uris: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub file_uris: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub archive_uris: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SparkBatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_jar_file_uri: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_class: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jar_file_uris: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub file_uris: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub archive_uris: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SparkSqlBatch {
    #[serde(default)]
    pub query_file_uri: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub query_variables: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jar_file_uris: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuntimeConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_image: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvironmentConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_config: Option<ExecutionConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peripherals_config: Option<PeripheralsConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecutionConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_uri: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnetwork_uri: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ttl: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging_bucket: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeripheralsConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metastore_service: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spark_history_server_config: Option<SparkHistoryServerConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SparkHistoryServerConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataproc_cluster: Option<String>,
}

/// Output only: where the running work can be seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeInfo {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub endpoints: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_uri: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic_output_uri: Option<String>,
    /// flexq: whether the batch ran with the RAPIDS Accelerator, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rapids_accelerator: Option<String>,
    /// flexq: the node that ran the driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_node: Option<String>,
    /// flexq: the driver's exit status, once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_exit_code: Option<i32>,
    /// flexq: driver output beyond `agents.max_output_bytes` was dropped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_truncated: bool,
    /// What the batch's cluster has used from its allocation until now,
    /// or until it was released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approximate_usage: Option<UsageMetrics>,
    /// What the cluster holds now, while it holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_usage: Option<UsageSnapshot>,
    /// flexq: how busy its GPUs were, from its agents' samples (absent
    /// until the first sample, and where agents cannot read their GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_utilization: Option<GpuUtilization>,
    /// flexq: what ran on the CPU instead of the GPUs, once its driver's
    /// agent reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_fallback: Option<CpuFallback>,
}

/// `google.cloud.dataproc.v1.UsageMetrics`: resources used over time.
/// int64 values travel as decimal strings (proto3 JSON). flexq fills the
/// accelerator and local-SSD fields (local SSD is where a GPU batch's
/// shuffle lives); DCUs are not counted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageMetrics {
    /// GPUs × 1000 × seconds held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milli_accelerator_seconds: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_type: Option<String>,
    /// Local SSD GB × seconds held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle_storage_gb_seconds: Option<String>,
}

/// `google.cloud.dataproc.v1.UsageSnapshot`: what is held at one time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageSnapshot {
    /// GPUs × 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milli_accelerator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_type: Option<String>,
    /// Local SSD GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle_storage_gb: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_time: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StateHistory {
    pub state: State,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state_message: String,
    pub state_start_time: DateTime<Utc>,
}

/// `google.longrunning.Operation` for a batch.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    pub name: String,
    pub metadata: OperationMetadata,
    pub done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<OperationError>,
    /// The Batch with its `@type`, once the batch succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub response: Option<serde_json::Value>,
}

/// `google.rpc.Status` inside an Operation: the gRPC code number.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OperationError {
    pub code: i32,
    pub message: String,
}

/// `google.cloud.dataproc.v1.BatchOperationMetadata`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationMetadata {
    #[serde(rename = "@type")]
    pub type_url: String,
    pub batch: String,
    pub batch_uuid: String,
    pub create_time: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_time: Option<DateTime<Utc>>,
    pub operation_type: String,
    pub description: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub warnings: Vec<String>,
}

pub const BATCH_TYPE_URL: &str = "type.googleapis.com/google.cloud.dataproc.v1.Batch";
pub const BATCH_METADATA_TYPE_URL: &str =
    "type.googleapis.com/google.cloud.dataproc.v1.BatchOperationMetadata";

/// `{"batches": [...], "nextPageToken": "...", "unreachable": []}`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListBatchesResponse {
    #[serde(default)]
    pub batches: Vec<Batch>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub next_page_token: String,
    #[serde(default)]
    pub unreachable: Vec<String>,
}
