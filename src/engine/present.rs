//! A stored batch as the wire shows it: the Dataproc [`Batch`] (with its
//! runtime info and flexq's extension), its [`Operation`], and a
//! validate-only create's verdict. Every front end encodes these; nothing
//! here reads the store.

use chrono::Utc;

use crate::api::{
    AlternativeVerdict, BATCH_METADATA_TYPE_URL, BATCH_TYPE_URL, Batch, Code, EndReason, FlexqInfo,
    Operation, OperationError, OperationMetadata, OperationName, RequeueReason, State,
    ValidateVerdict, VerdictCluster, VerdictQuota,
};
use crate::scheduler::{Verdict, messages, shape_text};
use crate::spec;
use crate::store::BatchRecord;

fn op_name(project: &str, region: &str, id: &str) -> String {
    OperationName {
        project: project.into(),
        region: region.into(),
        operation_id: id.into(),
    }
    .to_string()
}

/// The wire Batch of a stored record.
pub(super) fn to_batch(r: &BatchRecord) -> Batch {
    Batch {
        name: Some(r.name.to_string()),
        uuid: Some(r.uuid.clone()),
        create_time: Some(r.create_time),
        state: Some(r.state),
        state_message: Some(r.state_message.clone()),
        state_time: Some(r.state_time),
        creator: Some(r.creator.clone()),
        operation: Some(op_name(&r.name.project, &r.name.region, &r.operation_id)),
        state_history: r.history.clone(),
        runtime_info: runtime_info(r),
        flexq: Some(FlexqInfo {
            provisioning_state: r.provisioning.name().into(),
            provisioning_mode: r.cluster.mode.name().into(),
            allocation_deadline: r.deadline,
            end_reason: r.end_reason.map(|e| e.name().to_string()),
            alternatives: written(&r.alternatives),
            placement: placement(r),
            attempt: (r.attempt > 1).then_some(r.attempt),
            requeue_reason: r.requeue_reason.map(|q| q.name().to_string()),
            preemptions: (r.preemptions > 0).then_some(r.preemptions),
            preempting: r.preempted_by.is_some(),
            zone: r.zone.clone(),
            allocate_time: r.allocate_time,
            ..FlexqInfo::default()
        }),
        ..r.spec.clone()
    }
}

/// A batch's placement alternatives, in order, as written
/// (`a100-40 after 15m`): what `flexq.alternatives` and a queue entry show.
pub(super) fn written(alternatives: &[spec::Alternative]) -> Vec<String> {
    alternatives
        .iter()
        .map(|a| {
            spec::alternatives::AlternativeSpec {
                target: a.target.clone(),
                after_s: a.after_s,
            }
            .to_string()
        })
        .collect()
}

/// The placement of a batch allocated on one of its alternatives.
fn placement(r: &BatchRecord) -> Option<crate::api::PlacementInfo> {
    let alternative = r.alternatives.get(r.alternative.checked_sub(1)? as usize)?;
    let c = &alternative.cluster;
    let accelerator = crate::scheduler::accelerator_label(c);
    let loan = alternative.is_loan();
    Some(crate::api::PlacementInfo {
        alternative: alternative.index,
        region: alternative.region.clone(),
        accelerator: accelerator.to_string(),
        shape: shape_text(c),
        executor_cores: c.executor.cores,
        executor_count: c.executor_count,
        loan,
        lender: loan.then(|| {
            crate::scheduler::lender(
                accelerator,
                r.zone.as_deref().unwrap_or(&alternative.region),
            )
        }),
    })
}

/// Where the run can be seen once an agent started it, and what the
/// cluster used once it was allocated.
fn runtime_info(r: &BatchRecord) -> Option<crate::api::RuntimeInfo> {
    let (approximate_usage, current_usage) = super::usage::of_batch(r, Utc::now());
    let gpu_utilization = r
        .run
        .gpu
        .as_ref()
        .and_then(|g| g.view(r.cluster.total_gpus()));
    if r.master_url.is_none() && r.run.start_time.is_none() {
        return approximate_usage.map(|approximate| crate::api::RuntimeInfo {
            approximate_usage: Some(approximate),
            current_usage,
            gpu_utilization,
            cpu_fallback: r.run.cpu_fallback.clone(),
            ..Default::default()
        });
    }
    let mut endpoints = std::collections::BTreeMap::new();
    if let Some(url) = &r.master_url {
        endpoints.insert("Spark master".to_string(), url.clone());
    }
    Some(crate::api::RuntimeInfo {
        endpoints,
        output_uri: Some(format!("/v1/{}/output", r.name)),
        diagnostic_output_uri: None,
        rapids_accelerator: r.run.rapids.clone(),
        driver_node: r.run.driver_node.clone(),
        driver_exit_code: r.run.exit_code,
        output_truncated: r.run.output_truncated,
        approximate_usage,
        current_usage,
        gpu_utilization,
        cpu_fallback: r.run.cpu_fallback.clone(),
    })
}

/// The typed side of a queued batch's reasons (`flexq.notAdmitted`).
pub(super) fn not_admitted(
    reasons: &[crate::scheduler::Reason],
) -> Vec<crate::api::NotAdmittedReason> {
    reasons
        .iter()
        .map(|r| crate::api::NotAdmittedReason {
            reason: r.kind.name().to_string(),
            message: r.message.clone(),
        })
        .collect()
}

/// The cluster a request translates to, as a verdict shows it.
fn verdict_cluster(cluster: &spec::ClusterRequest) -> VerdictCluster {
    VerdictCluster {
        shape: shape_text(cluster),
        provisioning_mode: cluster.mode.name().to_string(),
        allocation_timeout: format!("{}s", cluster.allocation_timeout_s),
        gpus: cluster.total_gpus(),
        quota: cluster
            .quota
            .iter()
            .map(|q| VerdictQuota {
                metric: q.metric.name().to_string(),
                amount: q.amount,
            })
            .collect(),
    }
}

/// A verdict's name, reasons and zone.
fn verdict_parts(v: &Verdict) -> (&'static str, Vec<String>, Option<String>) {
    match v {
        Verdict::AllocateNow { zone } => ("ALLOCATE_NOW", vec![], Some(zone.clone())),
        Verdict::WouldQueue { reasons } => ("WOULD_QUEUE", messages(reasons), None),
        Verdict::WouldFail { reason, cause } => (
            "WOULD_FAIL",
            vec![format!(
                "RESOURCE_EXHAUSTED ({}): {reason}",
                if *cause == crate::api::EndReason::Quota {
                    "quota"
                } else {
                    "stock-out"
                }
            )],
            None,
        ),
        Verdict::NeverFits { reason } => ("NEVER_FITS", vec![reason.clone()], None),
    }
}

fn seconds(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A validate-only create's answer: `v` for its own placement, `start`
/// when it could start if queued now (shown while it would queue),
/// `preemption` what preemption would do for it, and its alternatives.
pub(super) fn validate_verdict(
    v: &Verdict,
    cluster: &spec::ClusterRequest,
    start: Option<chrono::DateTime<chrono::Utc>>,
    preemption: Option<String>,
    alternatives: Vec<AlternativeVerdict>,
) -> ValidateVerdict {
    let (verdict, reasons, zone) = verdict_parts(v);
    let queued = matches!(v, Verdict::WouldQueue { .. });
    ValidateVerdict {
        verdict: verdict.to_string(),
        reasons,
        zone,
        estimated_start_time: start.filter(|_| queued).map(seconds),
        cluster: verdict_cluster(cluster),
        preemption: preemption.filter(|_| queued),
        alternatives,
    }
}

/// A validate-only create's alternatives: each alternative with its translated
/// shape, its quota, what would happen to it now, when it could start
/// (not before its delay, whether or not it fits now) and, on a loan,
/// when it may be reclaimed (`reclaim`); then the operator's alternatives
/// that do not apply to the batch, and why.
pub(super) fn alternative_verdicts(
    alternatives: &[(
        &spec::alternatives::Alternative,
        Verdict,
        Option<chrono::DateTime<chrono::Utc>>,
    )],
    skipped: &[spec::alternatives::Skipped],
    reclaim: spec::alternatives::Reclaim,
) -> Vec<AlternativeVerdict> {
    let mut out: Vec<AlternativeVerdict> = alternatives
        .iter()
        .map(|(r, v, start)| {
            let (verdict, reasons, zone) = verdict_parts(v);
            AlternativeVerdict {
                written: spec::alternatives::AlternativeSpec {
                    target: r.target.clone(),
                    after_s: r.after_s,
                }
                .to_string(),
                verdict: verdict.to_string(),
                reasons,
                alternative: Some(r.index),
                after: Some(format!("{}s", r.after_s)),
                region: Some(r.region.clone()),
                zone,
                estimated_start_time: start.map(seconds),
                cluster: Some(verdict_cluster(&r.cluster)),
                loan: r.is_loan(),
                reclaim: r.is_loan().then(|| reclaim.to_string()),
            }
        })
        .collect();
    out.extend(skipped.iter().map(|s| AlternativeVerdict {
        written: s.alternative.to_string(),
        verdict: "NOT_APPLICABLE".into(),
        reasons: vec![s.why.clone()],
        ..AlternativeVerdict::default()
    }));
    out
}

/// What its operation's metadata warns of a batch that went back to the
/// queue: the typed reason first (`PREEMPTED: …`), so a client that only
/// sees the operation can tell why its batch waits again.
fn requeue_warning(r: &BatchRecord) -> Option<String> {
    let reason = r.requeue_reason?;
    let why = match reason {
        RequeueReason::Preempted => format!(
            "its cluster was preempted for another batch ({} time{}) and it went back to the queue at its place",
            r.preemptions,
            if r.preemptions == 1 { "" } else { "s" }
        ),
        RequeueReason::Reclaimed => {
            "it ran on a loan of others' capacity, which they took back, and it went back to the queue at its place".to_string()
        }
        RequeueReason::Infrastructure => {
            "an infrastructure failure under its cluster sent it back to the queue".to_string()
        }
    };
    Some(format!(
        "{}: {why}; attempt {} is the one that counts.",
        reason.name(),
        r.attempt
    ))
}

/// The Operation of a stored batch: done once the batch is terminal.
pub(super) fn operation(r: &BatchRecord) -> Operation {
    let done = r.state.is_terminal();
    let (error, response) = match r.state {
        State::Succeeded => {
            let mut v = serde_json::to_value(to_batch(r)).unwrap_or_default();
            if let Some(map) = v.as_object_mut() {
                map.insert("@type".into(), BATCH_TYPE_URL.into());
            }
            (None, Some(v))
        }
        // The code is the typed reason's, never read out of the message.
        State::Cancelled | State::Failed => {
            let code =
                r.end_reason
                    .map(EndReason::code)
                    .unwrap_or(if r.state == State::Cancelled {
                        Code::Cancelled
                    } else {
                        Code::FailedPrecondition
                    });
            (
                Some(OperationError {
                    code: code.grpc_number(),
                    message: r.state_message.clone(),
                }),
                None,
            )
        }
        _ => (None, None),
    };
    Operation {
        name: op_name(&r.name.project, &r.name.region, &r.operation_id),
        metadata: OperationMetadata {
            type_url: BATCH_METADATA_TYPE_URL.into(),
            batch: r.name.to_string(),
            batch_uuid: r.uuid.clone(),
            create_time: r.create_time,
            done_time: done.then_some(r.state_time),
            operation_type: "BATCH".into(),
            description: format!("Batch {}", r.name.batch_id),
            labels: r.spec.labels.clone(),
            warnings: requeue_warning(r)
                .into_iter()
                .chain(r.cluster.dynamic_allocation_note())
                .collect(),
        },
        done,
        error,
        response,
    }
}
