//! What a valid batch becomes: the [`ClusterRequest`] the scheduler
//! allocates as one unit, and its parts (runtime version, provisioning
//! mode, workload, node shapes, quota amounts), with the priority a
//! batch's labels give it. The rules that build it are `mod.rs`.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::shape::{Accelerator, QuotaMetric};

/// A runtime version, `MAJOR.MINOR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RuntimeVersion {
    pub major: u32,
    pub minor: u32,
}

impl RuntimeVersion {
    pub const fn new(major: u32, minor: u32) -> RuntimeVersion {
        RuntimeVersion { major, minor }
    }
}

impl Ord for RuntimeVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor).cmp(&(other.major, other.minor))
    }
}

impl PartialOrd for RuntimeVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl FromStr for RuntimeVersion {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        let (major, minor) = s.split_once('.').ok_or(())?;
        let digits =
            |p: &str| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit());
        if !digits(major) || !digits(minor) {
            return Err(());
        }
        Ok(RuntimeVersion::new(
            major.parse().map_err(|_| ())?,
            minor.parse().map_err(|_| ())?,
        ))
    }
}

impl fmt::Display for RuntimeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// `queue` (flex start: wait for capacity) or `default` (on demand: now or
/// fail).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProvisioningMode {
    Queue,
    Default,
}

impl ProvisioningMode {
    pub fn name(self) -> &'static str {
        match self {
            ProvisioningMode::Queue => "queue",
            ProvisioningMode::Default => "default",
        }
    }
}

/// The kind of Spark workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    Pyspark,
    Spark,
    SparkSql,
}

/// The resources one node of the cluster needs (the driver, or each
/// executor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeShape {
    /// None: a CPU node.
    pub accelerator: Option<Accelerator>,
    pub cores: u32,
    pub gpus: u32,
    pub memory_mb: u64,
    pub memory_overhead_mb: u64,
    pub local_ssd_gb: u64,
}

/// How much of one quota metric the whole cluster needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QuotaAmount {
    pub metric: QuotaMetric,
    pub amount: u64,
}

/// The label that sets a batch's queue priority: a whole number, higher
/// goes first; absent or not a number, 0 (docs/rules.md).
pub const PRIORITY_LABEL: &str = "flexq-priority";

/// A batch's queue priority, from its labels ([`PRIORITY_LABEL`]).
pub fn priority(labels: &BTreeMap<String, String>) -> i32 {
    labels
        .get(PRIORITY_LABEL)
        .and_then(|p| p.parse::<i32>().ok())
        .unwrap_or(0)
}

/// A batch turned into what the scheduler allocates as one unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRequest {
    pub workload: Workload,
    pub runtime: RuntimeVersion,
    pub driver: NodeShape,
    pub executor: NodeShape,
    pub executor_count: u32,
    pub mode: ProvisioningMode,
    /// The smaller of the driver's and the executors' timeouts
    /// (docs/rules.md#provisioning-and-timeouts).
    pub allocation_timeout_s: u64,
    /// Maximum run time; None on 1.x runtimes without an explicit ttl.
    pub ttl_s: Option<u64>,
    /// Every quota metric the cluster draws from, with its amount.
    pub quota: Vec<QuotaAmount>,
    /// How many times the batch goes back to the queue after a failure of
    /// the infrastructure, not of its own code
    /// (docs/rules.md#requeue-after-an-infrastructure-failure).
    #[serde(default)]
    pub infrastructure_retries: u32,
    /// Whether its running cluster may be preempted (property
    /// `spark.flexq.preemptible`; docs/rules.md#preemption).
    #[serde(default = "preemptible_by_default", skip_serializing_if = "is_true")]
    pub preemptible: bool,
    /// Spark's dynamic allocation is on (`spark.dynamicAllocation.enabled`):
    /// `executor_count` is what Spark starts with, and Spark is capped at
    /// it (docs/rules.md#dynamic-allocation).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dynamic_allocation: bool,
    /// With dynamic allocation on: how many executors Spark may add beyond
    /// `executor_count` (`spark.dynamicAllocation.maxExecutors`, 1000 when
    /// unset, less the core), each granted alone while GPUs are free
    /// (docs/rules.md#elastic-batches).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_extras: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn preemptible_by_default() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

impl ClusterRequest {
    /// What a batch with Spark's dynamic allocation on is told (its
    /// operation's warnings, its history): Spark is capped at the cluster
    /// allocated, naming the keys (docs/rules.md#dynamic-allocation).
    pub fn dynamic_allocation_note(&self) -> Option<String> {
        if self.dynamic_allocation && self.max_extras > 0 {
            return Some(format!(
                "spark.dynamicAllocation.enabled: the cluster allocated whole is its core gang of {n} executors (the largest of spark.executor.instances, spark.dynamicAllocation.minExecutors and spark.dynamicAllocation.initialExecutors); beyond it Spark may grow to spark.dynamicAllocation.maxExecutors = {most}, one extra executor at a time while GPUs are free, given back when Spark no longer uses it or a queued batch needs it (on the Kubernetes launcher Spark stays capped at the core)",
                n = self.executor_count,
                most = self.executor_count.saturating_add(self.max_extras)
            ));
        }
        self.dynamic_allocation.then(|| {
            format!(
                "spark.dynamicAllocation.enabled: Spark runs with at most the {n} executors allocated with the whole cluster (spark.dynamicAllocation.maxExecutors is set to {n}, the largest of spark.executor.instances, spark.dynamicAllocation.minExecutors and spark.dynamicAllocation.initialExecutors); flexq grants no executor beyond it",
                n = self.executor_count
            )
        })
    }

    /// What one more executor (an elastic batch's extra) draws from
    /// quota.
    pub fn extra_quota(&self) -> Vec<QuotaAmount> {
        let mut amounts = Vec::new();
        super::add_quota(&mut amounts, &self.executor, 1, self.mode);
        amounts
    }

    /// Its allocation deadline when queued at `queued_at` (at create, or
    /// again at a requeue): in queue mode, `queued_at` plus its allocation
    /// timeout; none in default mode, which never waits
    /// (docs/rules.md#provisioning-and-timeouts). The server's store and
    /// the simulator both take it from here.
    pub fn deadline(
        &self,
        queued_at: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        (self.mode == ProvisioningMode::Queue)
            .then(|| queued_at + chrono::Duration::seconds(self.allocation_timeout_s as i64))
    }

    /// When a cluster of this request allocated at `start` ends: its ttl
    /// after (None: no ttl).
    pub fn ends(
        &self,
        start: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        self.ttl_s
            .map(|t| start + chrono::Duration::seconds(t as i64))
    }

    /// The cluster's GPU type: the executors', else the driver's (None:
    /// it uses no GPU).
    pub fn accelerator(&self) -> Option<Accelerator> {
        self.executor.accelerator.or(self.driver.accelerator)
    }

    /// Whether any node of the cluster has a GPU.
    pub fn uses_gpus(&self) -> bool {
        self.driver.accelerator.is_some() || self.executor.accelerator.is_some()
    }

    /// GPUs of the whole cluster.
    pub fn total_gpus(&self) -> u64 {
        u64::from(self.driver.gpus) + u64::from(self.executor.gpus) * u64::from(self.executor_count)
    }

    /// The cluster's GPUs by type, in a stable order (the executors' type
    /// first).
    pub fn gpus_by_type(&self) -> Vec<(Accelerator, u64)> {
        let mut by_type: Vec<(Accelerator, u64)> = Vec::new();
        let parts = [
            (&self.executor, u64::from(self.executor_count)),
            (&self.driver, 1),
        ];
        for (shape, count) in parts {
            let Some(accelerator) = shape.accelerator else {
                continue;
            };
            let gpus = u64::from(shape.gpus) * count;
            match by_type.iter_mut().find(|(a, _)| *a == accelerator) {
                Some((_, n)) => *n += gpus,
                None => by_type.push((accelerator, gpus)),
            }
        }
        by_type.retain(|(_, n)| *n > 0);
        by_type
    }

    /// Local SSD of the whole cluster, in GB.
    pub fn local_ssd_gb(&self) -> u64 {
        self.driver.local_ssd_gb + self.executor.local_ssd_gb * u64::from(self.executor_count)
    }
}

/// One resolved placement alternative of a batch: where it runs and the
/// cluster it is there, checked by the same rules as a create. Its
/// cluster is a shape without alternatives of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alternative {
    /// 1 for the first alternative (0 is the batch's own placement).
    pub index: u32,
    pub after_s: u64,
    pub target: super::target::Target,
    /// The region the alternative runs in.
    pub region: String,
    pub cluster: ClusterRequest,
}

impl Alternative {
    /// Whether a cluster on this alternative runs on capacity that others
    /// own (docs/rules.md#loans-and-reclaim): another GPU type, or another
    /// region's quota and capacity. On-demand quota is the batch's own
    /// project's, on its own GPU type: not a loan.
    pub fn is_loan(&self) -> bool {
        matches!(
            self.target,
            super::target::Target::Accelerator(_) | super::target::Target::Region(_)
        )
    }
}

/// What a batch asks for: its own cluster and where else it may run once
/// it has waited (its placement alternatives, in order, fixed at create;
/// docs/rules.md#placement-alternatives). Stored as one JSON object: the
/// cluster's fields, and `alternatives` beside them when there are any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    #[serde(flatten)]
    pub cluster: ClusterRequest,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<Alternative>,
}

/// A cluster without alternatives: it runs only on its own placement.
impl From<ClusterRequest> for Request {
    fn from(cluster: ClusterRequest) -> Request {
        Request {
            cluster,
            alternatives: Vec::new(),
        }
    }
}

impl Request {
    /// The cluster it holds on placement `index` (0: its own; 1 and up:
    /// its alternatives) and that placement's region (None: its own).
    pub fn on(&self, index: u32) -> (&ClusterRequest, Option<&str>) {
        placed(&self.cluster, &self.alternatives, index)
    }
}

/// The cluster a batch of cluster `own` and `alternatives` holds on
/// placement `index` (0: its own; 1 and up: its alternatives), and that
/// placement's region (None: its own).
pub fn placed<'a>(
    own: &'a ClusterRequest,
    alternatives: &'a [Alternative],
    index: u32,
) -> (&'a ClusterRequest, Option<&'a str>) {
    match index
        .checked_sub(1)
        .and_then(|i| alternatives.get(i as usize))
    {
        Some(a) => (&a.cluster, Some(a.region.as_str())),
        None => (own, None),
    }
}
