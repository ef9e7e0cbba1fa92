//! The answer of a validate-only create: what would happen to the batch
//! now, and to each of its placement alternatives. Nothing is stored.

use serde::{Deserialize, Serialize};

/// What a validate-only create answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValidateVerdict {
    /// ALLOCATE_NOW, WOULD_QUEUE, WOULD_FAIL or NEVER_FITS.
    pub verdict: String,
    /// Why, with numbers (none with ALLOCATE_NOW).
    pub reasons: Vec<String>,
    /// Where it would be allocated (ALLOCATE_NOW; null otherwise).
    pub zone: Option<String>,
    /// With WOULD_QUEUE: when it could start if it were queued now
    /// (RFC 3339, seconds); null otherwise, or when no estimate is given.
    pub estimated_start_time: Option<String>,
    /// The cluster the batch translates to.
    pub cluster: VerdictCluster,
    /// Where preemption is on, with WOULD_QUEUE: whom it would preempt,
    /// from when a cluster could give way, or why none can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<String>,
    /// Each of its alternatives, in order, then the operator's alternatives that
    /// do not apply to it (NOT_APPLICABLE, with why).
    pub alternatives: Vec<AlternativeVerdict>,
}

/// The cluster a request translates to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerdictCluster {
    /// "1 l4 driver + 7 executors of l4 (4 cores, 1 GPU, 375 GB local SSD)".
    pub shape: String,
    /// queue or default.
    pub provisioning_mode: String,
    /// The allocation timeout in force, as "3600s".
    pub allocation_timeout: String,
    /// GPUs of the whole cluster.
    pub gpus: u64,
    /// The quota the whole cluster needs, per metric.
    pub quota: Vec<VerdictQuota>,
}

/// How much of one quota metric a cluster needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VerdictQuota {
    /// The quota metric, e.g. PREEMPTIBLE_NVIDIA_L4_GPUS.
    pub metric: String,
    pub amount: u64,
}

/// What would happen to one placement alternative of a validate-only
/// create: the same fields as the batch's own verdict, for the alternative's
/// translated cluster, or NOT_APPLICABLE for an operator's alternative that does
/// not apply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AlternativeVerdict {
    /// The alternative as written: `a100-40 after 15m`, `region R after D`,
    /// `on-demand after D`.
    #[serde(rename = "rung")]
    pub written: String,
    /// ALLOCATE_NOW, WOULD_QUEUE, WOULD_FAIL, NEVER_FITS or NOT_APPLICABLE.
    pub verdict: String,
    pub reasons: Vec<String>,
    /// Its number in the batch's alternatives (absent: NOT_APPLICABLE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alternative: Option<u32>,
    /// Its delay, as "900s".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// The region it runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// When it could start, never before its delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_start_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<VerdictCluster>,
    /// It would run on capacity others own (another GPU type or region),
    /// which they may take back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub loan: bool,
    /// On a loan: when its owners may take it back, `after 10m` or `never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<String>,
}

/// What a create answers: the batch's Operation or, with
/// `validateOnly=true`, a ValidateVerdict (the OpenAPI document
/// describes the two as one of).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum CreateResponse {
    Operation(Box<super::Operation>),
    Verdict(Box<ValidateVerdict>),
}
