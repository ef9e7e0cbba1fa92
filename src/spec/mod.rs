//! The Flex Start rules (docs/rules.md#properties-and-shapes,
//! docs/rules.md#provisioning-and-timeouts) as a pure function: a submitted
//! [`Batch`] becomes a validated [`ClusterRequest`] or a [`Rejection`]
//! listing *every* field violation at once, so a user fixes a batch in one
//! round trip instead of one error at a time.
//!
//! No I/O and no clock here: the operator's policy is an argument and the deadline is
//! computed by the caller from the queue time and
//! [`ClusterRequest::allocation_timeout_s`].
//!
//! Here: the rules and the [`Rejection`] they build. What a valid batch
//! becomes is `request.rs`; node offers `node.rs`, Spark properties
//! `properties.rs`, GPU types and quota metrics `shape.rs`, units
//! `units.rs`.

pub mod alternatives;
mod labels;
mod node;
mod properties;
mod request;
mod shape;
mod target;
mod units;

use std::collections::{BTreeMap, BTreeSet};

use crate::api::{Batch, Code, FieldViolation, check_batch_id, check_request_id, quote};

use labels::check_labels;
pub use labels::{LABEL_KEY_RULE, is_label_key};
pub use node::{NodeOffer, NodeSize, check_node};
pub use properties::{DATAPROC_PROPERTIES, property_field};
pub use request::{
    Alternative, ClusterRequest, NodeShape, PRIORITY_LABEL, ProvisioningMode, QuotaAmount, Request,
    RuntimeVersion, Workload, placed, priority,
};
pub use shape::{Accelerator, PartRole, QuotaMetric};
pub use units::{parse_allocation_timeout, parse_memory_mb, parse_proto_duration, parse_size_gb};

/// Why a batch was refused: every violation, and the status of the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// INVALID_ARGUMENT when any violation is a malformed value;
    /// FAILED_PRECONDITION when all are about the environment (a GPU type
    /// the region does not offer, an organisation policy).
    pub code: Code,
    pub violations: Vec<FieldViolation>,
}

impl Rejection {
    /// A one-line summary naming the fields.
    pub fn message(&self) -> String {
        match self.violations.as_slice() {
            [one] => format!("{}: {}", one.field, one.description),
            many => format!(
                "{} invalid fields: {}",
                many.len(),
                many.iter()
                    .map(|v| format!("{}: {}", v.field, v.description))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        }
    }
}

/// Collects violations while the rules run, so all are reported together.
#[derive(Default)]
struct Violations {
    list: Vec<(Code, FieldViolation)>,
}

impl Violations {
    fn invalid(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.push(Code::InvalidArgument, field, description);
    }

    fn precondition(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.push(Code::FailedPrecondition, field, description);
    }

    fn push(&mut self, code: Code, field: impl Into<String>, description: impl Into<String>) {
        self.list.push((
            code,
            FieldViolation {
                field: field.into(),
                description: description.into(),
            },
        ));
    }

    fn into_rejection(self) -> Option<Rejection> {
        if self.list.is_empty() {
            return None;
        }
        let code = if self.list.iter().any(|(c, _)| *c == Code::InvalidArgument) {
            Code::InvalidArgument
        } else {
            Code::FailedPrecondition
        };
        Some(Rejection {
            code,
            violations: self.list.into_iter().map(|(_, v)| v).collect(),
        })
    }
}

/// What the operator decides and the rules read: the served regions and
/// their GPU types, the runtimes, defaults and limits. The rules never see
/// the config itself; `Config::policy` converts it into this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Every served region and the GPU types its node pools offer.
    pub regions: BTreeMap<String, Vec<Accelerator>>,
    /// Supported runtime versions, in order.
    pub runtimes: Vec<String>,
    pub default_runtime: String,
    pub default_ttl_s: u64,
    pub default_allocation_timeout_s: u64,
    pub max_allocation_timeout_s: u64,
    pub max_properties: usize,
    pub max_property_key_bytes: usize,
    pub max_property_value_bytes: usize,
    /// Projects under the organisation policy
    /// `constraints/compute.requireShieldedVm` (no GPU batches).
    pub shielded_vm_projects: BTreeSet<String>,
    /// Requeues after infrastructure failures of a batch without the label.
    pub default_infrastructure_retries: u32,
    /// The operator's `[[alternatives]]` entries ([`alternatives`]).
    pub alternative_rules: Vec<alternatives::AlternativesRule>,
    /// The regions where preemption is on, and whether a batch may opt
    /// out there ([`PREEMPTIBLE_PROPERTY`]).
    pub preemption_opt_out: BTreeMap<String, bool>,
}

/// What a create names beside its batch: the id it asks for and the
/// requestId that makes a retry safe.
#[derive(Debug, Clone, Copy, Default)]
pub struct Identifiers<'a> {
    pub batch_id: Option<&'a str>,
    pub request_id: Option<&'a str>,
}

/// Checks a batch against every rule and builds its cluster request.
pub fn validate(
    batch: &Batch,
    project: &str,
    region: &str,
    policy: &Policy,
) -> Result<Request, Rejection> {
    validate_create(batch, Identifiers::default(), project, region, policy)
}

/// [`validate`] for a create: its batch id and requestId are checked with
/// the batch, their violations reported with the batch's, in one answer.
/// The cluster request carries the batch's placement alternatives
/// ([`alternatives::resolve`]), each a whole batch checked by these rules.
pub fn validate_create(
    batch: &Batch,
    ids: Identifiers<'_>,
    project: &str,
    region: &str,
    policy: &Policy,
) -> Result<Request, Rejection> {
    let cluster = check_create(batch, ids, project, region, policy)?;
    let (alternatives, _) = alternatives::resolve(batch, &cluster, project, region, policy)?;
    Ok(Request {
        cluster,
        alternatives,
    })
}

/// Every rule but the alternatives: what an alternative's batch is checked by.
fn check_create(
    batch: &Batch,
    ids: Identifiers<'_>,
    project: &str,
    region: &str,
    policy: &Policy,
) -> Result<ClusterRequest, Rejection> {
    let mut v = Violations::default();
    check_identifiers(ids, &mut v);
    let offered_here = check_parent(project, region, policy, &mut v);

    let workload = check_workload(batch, &mut v);
    check_labels(batch, &mut v);

    let runtime = runtime_version(batch, policy, &mut v);
    let props = properties::Properties::check(batch.properties(), policy, &mut v);

    let executor_accel = props.accelerator(PartRole::Executor, &mut v);
    let driver_accel = props.accelerator(PartRole::Driver, &mut v);
    check_offered(executor_accel, driver_accel, offered_here, region, &mut v);
    let uses_gpus = executor_accel.is_some() || driver_accel.is_some();

    if uses_gpus {
        check_gpu_project(executor_accel, project, policy, &mut v);
        if let Some(rt) = runtime {
            props.check_lang(rt, &mut v);
        }
    }

    let pyspark = workload == Some(Workload::Pyspark);
    let executor = props.node_shape(PartRole::Executor, executor_accel, pyspark, &mut v);
    let driver = props.node_shape(PartRole::Driver, driver_accel, pyspark, &mut v);
    let (executor_count, dynamic_allocation, max_extras) = props.executor_count(&mut v);
    let mode = props.provisioning_mode(uses_gpus, runtime, &mut v);
    let allocation_timeout_s = props.allocation_timeout(policy, &mut v);
    let ttl_s = check_ttl(batch, runtime, policy, &mut v);
    let infrastructure_retries = infrastructure_retries(batch, policy, &mut v);
    let preemptible = props.preemptible(region, policy, &mut v);

    if let Some(rejection) = v.into_rejection() {
        return Err(rejection);
    }
    // Every Option below is Some when no violation was recorded; the
    // fallbacks are unreachable but keep this function panic-free.
    let (Some(workload), Some(runtime), Some(mode)) = (workload, runtime, mode) else {
        return Err(Rejection {
            code: Code::InvalidArgument,
            violations: vec![FieldViolation {
                field: "batch".into(),
                description: "the batch could not be validated".into(),
            }],
        });
    };
    let quota = quota_amounts(&driver, &executor, executor_count, mode);
    Ok(ClusterRequest {
        workload,
        runtime,
        driver,
        executor,
        executor_count,
        mode,
        allocation_timeout_s,
        ttl_s,
        quota,
        infrastructure_retries,
        preemptible,
        dynamic_allocation,
        max_extras,
    })
}

/// The batch id and requestId a create names, when it names them.
fn check_identifiers(ids: Identifiers<'_>, v: &mut Violations) {
    if let Some(Err(e)) = ids.batch_id.map(check_batch_id) {
        v.invalid("batch_id", e);
    }
    if let Some(Err(e)) = ids.request_id.map(check_request_id) {
        v.invalid("request_id", e);
    }
}

/// The parent: a served region and a well-formed project id. Answers the
/// GPU types the region offers, when it is served.
fn check_parent<'p>(
    project: &str,
    region: &str,
    policy: &'p Policy,
    v: &mut Violations,
) -> Option<&'p Vec<Accelerator>> {
    let offered_here = policy.regions.get(region);
    if offered_here.is_none() {
        v.invalid("parent", not_served(region, policy.regions.keys()));
    }
    if !is_resource_id(project) {
        v.invalid(
            "parent",
            format!(
                "project {} is invalid: use lowercase letters, digits and '-'",
                quote(project)
            ),
        );
    }
    offered_here
}

/// The executors' and the driver's GPU types, each where the region
/// offers it (when the region is served).
fn check_offered(
    executor_accel: Option<Accelerator>,
    driver_accel: Option<Accelerator>,
    offered_here: Option<&Vec<Accelerator>>,
    region: &str,
    v: &mut Violations,
) {
    for (role, accel) in [
        (PartRole::Executor, executor_accel),
        (PartRole::Driver, driver_accel),
    ] {
        if let (Some(accel), Some(offered)) = (accel, offered_here) {
            if !offered.contains(&accel) {
                v.precondition(
                    property_field(role.accelerator_key()),
                    format!(
                        "GPU type {accel} is not offered in region {region}; it offers: {}",
                        offered
                            .iter()
                            .map(|a| a.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
            }
        }
    }
}

/// A GPU batch's project: not under the organisation policy that GPU
/// nodes cannot satisfy. The violation names the executors' GPU property
/// when they ask for GPUs, else the driver's.
fn check_gpu_project(
    executor_accel: Option<Accelerator>,
    project: &str,
    policy: &Policy,
    v: &mut Violations,
) {
    if policy.shielded_vm_projects.contains(project) {
        let key = if executor_accel.is_some() {
            PartRole::Executor.accelerator_key()
        } else {
            PartRole::Driver.accelerator_key()
        };
        v.precondition(
            property_field(key),
            format!(
                "project {project} is under the organisation policy constraints/compute.requireShieldedVm, which GPU nodes cannot satisfy; accelerator batches cannot run in this project"
            ),
        );
    }
}

/// Spark's dynamic allocation (docs/rules.md#dynamic-allocation): on only
/// where a batch says `true`; its bounds are those of Dataproc's
/// serverless Spark.
pub const DYNAMIC_ALLOCATION: &str = "spark.dynamicAllocation.enabled";
pub const MIN_EXECUTORS: &str = "spark.dynamicAllocation.minExecutors";
pub const INITIAL_EXECUTORS: &str = "spark.dynamicAllocation.initialExecutors";
pub const MAX_EXECUTORS_KEY: &str = "spark.dynamicAllocation.maxExecutors";
/// The property by which a batch declares its cluster not preemptible.
pub const PREEMPTIBLE_PROPERTY: &str = "spark.flexq.preemptible";

/// The label that sets a batch's requeues after infrastructure failures.
pub const RETRIES_LABEL: &str = "flexq-infrastructure-retries";

/// The most requeues a batch may ask for.
pub const MAX_INFRASTRUCTURE_RETRIES: u32 = 5;

fn infrastructure_retries(batch: &Batch, policy: &Policy, v: &mut Violations) -> u32 {
    let Some(value) = batch.labels.get(RETRIES_LABEL) else {
        return policy.default_infrastructure_retries;
    };
    match value.parse::<u32>() {
        Ok(n) if n <= MAX_INFRASTRUCTURE_RETRIES => n,
        _ => {
            v.invalid(
                format!("labels[{RETRIES_LABEL}]"),
                format!(
                    "{} is not a number of retries; accepted: a whole number from 0 to {MAX_INFRASTRUCTURE_RETRIES}",
                    quote(value)
                ),
            );
            0
        }
    }
}

/// Lowercase letters, digits and dashes, starting with a letter or digit,
/// at most 63 characters: the form of project and region ids.
pub fn is_resource_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn check_workload(batch: &Batch, v: &mut Violations) -> Option<Workload> {
    let kinds = [
        batch.pyspark_batch.as_ref().map(|_| Workload::Pyspark),
        batch.spark_batch.as_ref().map(|_| Workload::Spark),
        batch.spark_sql_batch.as_ref().map(|_| Workload::SparkSql),
    ];
    let set: Vec<Workload> = kinds.into_iter().flatten().collect();
    let workload = match set.as_slice() {
        [one] => *one,
        [] => {
            v.invalid(
                "batch_config",
                "one of pyspark_batch, spark_batch or spark_sql_batch is required",
            );
            return None;
        }
        _ => {
            v.invalid(
                "batch_config",
                "only one of pyspark_batch, spark_batch or spark_sql_batch may be set",
            );
            return None;
        }
    };
    let mut uris: Vec<(String, &String)> = Vec::new();
    if let Some(p) = &batch.pyspark_batch {
        if p.main_python_file_uri.trim().is_empty() {
            v.invalid(
                "pyspark_batch.main_python_file_uri",
                "the main Python file is required (e.g. file:///jobs/etl.py)",
            );
        }
        uris.push((
            "pyspark_batch.main_python_file_uri".into(),
            &p.main_python_file_uri,
        ));
        push_uris(
            &mut uris,
            "pyspark_batch.python_file_uris",
            &p.python_file_uris,
        );
        push_uris(&mut uris, "pyspark_batch.jar_file_uris", &p.jar_file_uris);
        push_uris(&mut uris, "pyspark_batch.file_uris", &p.file_uris);
        push_uris(&mut uris, "pyspark_batch.archive_uris", &p.archive_uris);
    }
    if let Some(s) = &batch.spark_batch {
        match (&s.main_jar_file_uri, &s.main_class) {
            (Some(jar), None) => uris.push(("spark_batch.main_jar_file_uri".into(), jar)),
            (None, Some(class)) if !class.trim().is_empty() => {}
            (Some(_), Some(_)) => v.invalid(
                "spark_batch",
                "set only one of main_jar_file_uri and main_class",
            ),
            _ => v.invalid(
                "spark_batch",
                "one of main_jar_file_uri or main_class is required",
            ),
        }
        push_uris(&mut uris, "spark_batch.jar_file_uris", &s.jar_file_uris);
        push_uris(&mut uris, "spark_batch.file_uris", &s.file_uris);
        push_uris(&mut uris, "spark_batch.archive_uris", &s.archive_uris);
    }
    if let Some(s) = &batch.spark_sql_batch {
        if s.query_file_uri.trim().is_empty() {
            v.invalid(
                "spark_sql_batch.query_file_uri",
                "the query file is required (e.g. file:///jobs/report.sql)",
            );
        }
        uris.push(("spark_sql_batch.query_file_uri".into(), &s.query_file_uri));
        push_uris(&mut uris, "spark_sql_batch.jar_file_uris", &s.jar_file_uris);
    }
    for (field, uri) in uris {
        if uri.len() > 2048 || uri.chars().any(char::is_control) {
            v.invalid(
                field,
                format!(
                    "{} is not a usable URI: at most 2048 characters, no control characters",
                    quote(uri)
                ),
            );
        }
    }
    Some(workload)
}

fn push_uris<'a>(out: &mut Vec<(String, &'a String)>, field: &str, list: &'a [String]) {
    out.extend(
        list.iter()
            .enumerate()
            .map(|(i, u)| (format!("{field}[{i}]"), u)),
    );
}

/// Why `region` is refused: it is not among `served`, which the message
/// lists.
pub fn not_served<'a>(region: &str, served: impl IntoIterator<Item = &'a String>) -> String {
    let served: Vec<&str> = served.into_iter().map(String::as_str).collect();
    format!(
        "region {} is not served by flexq; served regions: {}",
        quote(region),
        served.join(", ")
    )
}

fn runtime_version(batch: &Batch, policy: &Policy, v: &mut Violations) -> Option<RuntimeVersion> {
    let given = batch
        .runtime_config
        .as_ref()
        .and_then(|r| r.version.as_deref())
        .map(str::trim);
    let version = given.unwrap_or(&policy.default_runtime);
    if policy.runtimes.iter().any(|r| r == version) {
        version.parse().ok()
    } else {
        v.invalid(
            "runtime_config.version",
            format!(
                "runtime version {} is not supported; supported versions: {}",
                quote(version),
                policy.runtimes.join(", ")
            ),
        );
        None
    }
}

fn check_ttl(
    batch: &Batch,
    runtime: Option<RuntimeVersion>,
    policy: &Policy,
    v: &mut Violations,
) -> Option<u64> {
    const MIN_S: f64 = 600.0;
    const MAX_S: f64 = 14.0 * 86400.0;
    let exec = batch
        .environment_config
        .as_ref()
        .and_then(|e| e.execution_config.as_ref());
    // Dataproc's ExecutionConfig names the network one way: a network or
    // a subnetwork (a oneof), never both.
    if let Some(e) = exec.filter(|e| e.network_uri.is_some() && e.subnetwork_uri.is_some()) {
        v.invalid(
            "environment_config.execution_config.subnetwork_uri",
            format!(
                "{} is set with network_uri {}; accepted: one of network_uri and subnetwork_uri",
                quote(e.subnetwork_uri.as_deref().unwrap_or_default()),
                quote(e.network_uri.as_deref().unwrap_or_default())
            ),
        );
    }
    if let Some(idle) = exec.and_then(|e| e.idle_ttl.as_deref()) {
        if let Err(form) = parse_proto_duration(idle) {
            v.invalid(
                "environment_config.execution_config.idle_ttl",
                format!("{} is not {form}", quote(idle)),
            );
        }
    }
    match exec.and_then(|e| e.ttl.as_deref()) {
        Some(ttl) => match parse_proto_duration(ttl) {
            Ok(secs) if (MIN_S..=MAX_S).contains(&secs) => Some(secs.ceil() as u64),
            Ok(_) => {
                v.invalid(
                    "environment_config.execution_config.ttl",
                    format!(
                        "ttl {} is out of range: from \"600s\" (10 minutes) to \"1209600s\" (14 days)",
                        quote(ttl)
                    ),
                );
                None
            }
            Err(form) => {
                v.invalid(
                    "environment_config.execution_config.ttl",
                    format!("ttl {} is not {form}", quote(ttl)),
                );
                None
            }
        },
        None if runtime.is_some_and(|r| r >= RuntimeVersion::new(2, 1)) => {
            Some(policy.default_ttl_s)
        }
        None => None,
    }
}

/// Quota of the whole cluster: GPUs per metric (driver and executors of the
/// same type add up) and local SSD of every GPU node.
pub(crate) fn quota_amounts(
    driver: &NodeShape,
    executor: &NodeShape,
    executors: u32,
    mode: ProvisioningMode,
) -> Vec<QuotaAmount> {
    let mut amounts: Vec<QuotaAmount> = Vec::new();
    add_quota(&mut amounts, driver, 1, mode);
    add_quota(&mut amounts, executor, u64::from(executors), mode);
    amounts.sort_by_key(|a| a.metric);
    amounts
}

/// Adds what `count` parts of shape `node` draw from quota to `amounts`.
pub(crate) fn add_quota(
    amounts: &mut Vec<QuotaAmount>,
    node: &NodeShape,
    count: u64,
    mode: ProvisioningMode,
) {
    let preemptible = mode == ProvisioningMode::Queue;
    let mut add = |metric: QuotaMetric, amount: u64| {
        if amount == 0 {
            return;
        }
        match amounts.iter_mut().find(|a| a.metric == metric) {
            Some(a) => a.amount += amount,
            None => amounts.push(QuotaAmount { metric, amount }),
        }
    };
    if let Some(accel) = node.accelerator {
        add(
            accel.quota_metric(preemptible),
            u64::from(node.gpus) * count,
        );
        add(QuotaMetric::LocalSsdTotalGb, node.local_ssd_gb * count);
    }
}

#[cfg(test)]
mod tests;

/// `amounts` += `more`, metric by metric.
pub fn add_amounts(amounts: &mut Vec<QuotaAmount>, more: &[QuotaAmount]) {
    for m in more {
        match amounts.iter_mut().find(|a| a.metric == m.metric) {
            Some(a) => a.amount += m.amount,
            None => amounts.push(*m),
        }
    }
    amounts.sort_by_key(|a| a.metric);
}

/// `amounts` -= `less`, metric by metric (a metric at 0 leaves).
pub fn subtract_amounts(amounts: &mut Vec<QuotaAmount>, less: &[QuotaAmount]) {
    for l in less {
        if let Some(a) = amounts.iter_mut().find(|a| a.metric == l.metric) {
            a.amount = a.amount.saturating_sub(l.amount);
        }
    }
    amounts.retain(|a| a.amount > 0);
}
