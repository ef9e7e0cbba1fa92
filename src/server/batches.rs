//! The Batches and Operations resources of `spec/api.md`.

use axum::extract::State as AppState;
use axum::http::StatusCode;
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Utc;
use serde::Deserialize;
use uuid::Uuid;

use super::App;
use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery, Format, JsonBody};
use crate::api::{AllocatedPart, FlexqInfo};
use crate::api::{
    BATCH_METADATA_TYPE_URL, BATCH_TYPE_URL, Batch, BatchName, Code, FieldViolation,
    ListBatchesResponse, Operation, OperationError, OperationMetadata, OperationName, State,
    check_batch_id, check_request_id,
};
use crate::scheduler::{BatchKey, PendingBatch, Verdict, shape_text};
use crate::spec;
use crate::store::{BatchRecord, Created, Filter, NewBatch, Provisioning};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct CreateParams {
    batch_id: Option<String>,
    request_id: Option<String>,
    validate_only: Option<String>,
    #[serde(rename = "$alt")]
    _alt: Option<String>,
    #[serde(rename = "$fields", alias = "fields")]
    _fields: Option<String>,
    #[serde(rename = "$prettyPrint", alias = "prettyPrint")]
    _pretty: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ListParams {
    page_size: Option<String>,
    page_token: Option<String>,
    filter: Option<String>,
    order_by: Option<String>,
    #[serde(rename = "$alt")]
    _alt: Option<String>,
    #[serde(rename = "$fields", alias = "fields")]
    _fields: Option<String>,
    #[serde(rename = "$prettyPrint", alias = "prettyPrint")]
    _pretty: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PlainParams {
    #[serde(rename = "$alt")]
    _alt: Option<String>,
    #[serde(rename = "$fields", alias = "fields")]
    _fields: Option<String>,
    #[serde(rename = "$prettyPrint", alias = "prettyPrint")]
    _pretty: Option<String>,
}

const DEFAULT_PAGE_SIZE: u32 = 20;
const MAX_PAGE_SIZE: u32 = 1000;

/// `POST /v1/projects/{project}/locations/{region}/batches`
#[utoipa::path(post, path = "/v1/projects/{project}/locations/{region}/batches", tag = "batches",
    params(("project" = String, Path), ("region" = String, Path), ("batchId" = Option<String>, Query), ("requestId" = Option<String>, Query), ("validateOnly" = Option<bool>, Query)),
    request_body = crate::api::Batch,
    responses((status = 200, description = "The batch's Operation (or, with validateOnly, a verdict)", body = crate::api::Operation), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorBody)))]
pub(super) async fn create(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    ApiQuery(params): ApiQuery<CreateParams>,
    format: Format,
    axum::Extension(principal): axum::Extension<super::Principal>,
    JsonBody(batch): JsonBody<Batch>,
) -> Result<Response, ApiError> {
    let mut id_violations = Vec::new();
    if let Some(id) = &params.batch_id {
        if let Err(e) = check_batch_id(id) {
            id_violations.push(FieldViolation {
                field: "batch_id".into(),
                description: e,
            });
        }
    }
    if let Some(id) = &params.request_id {
        if let Err(e) = check_request_id(id) {
            id_violations.push(FieldViolation {
                field: "request_id".into(),
                description: e,
            });
        }
    }
    let cluster = match spec::validate(&batch, &project, &region, &app.config) {
        Ok(cluster) if id_violations.is_empty() => cluster,
        Ok(_) => {
            return Err(spec::Rejection {
                code: Code::InvalidArgument,
                violations: id_violations,
            }
            .into());
        }
        Err(mut rejection) => {
            if !id_violations.is_empty() {
                rejection.code = Code::InvalidArgument;
                id_violations.append(&mut rejection.violations);
                rejection.violations = id_violations;
            }
            return Err(rejection.into());
        }
    };

    // Version 7 uuids grow with time: new rows land at the right edge of
    // every index instead of dirtying a random page each, which keeps group
    // commits small (see BENCHMARKS.md).
    let validate_only = match params.validate_only.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::invalid_field(
                "validate_only",
                format!(
                    "{} is not a boolean; accepted: true, false",
                    crate::api::quote(other)
                ),
            ));
        }
    };
    {
        let core = app.scheduler.lock().await;
        if validate_only {
            let verdict = core.verdict(&project, &region, &cluster);
            return Ok(format.respond(StatusCode::OK, &verdict_json(&verdict, &cluster)));
        }
        let queued = core.pending_of(&project);
        let max = app.config.limits.max_pending_per_project;
        if queued as u64 >= max {
            return Err(ApiError::new(
                Code::ResourceExhausted,
                "TOO_MANY_PENDING",
                format!(
                    "project {project} has {queued} batches queued; limits.max_pending_per_project is {max}: wait for some to start or cancel some"
                ),
            )
            .with_meta("limit", "limits.max_pending_per_project"));
        }
        if let Some(reason) = core.never_fits(&project, &region, &cluster) {
            return Err(ApiError::new(
                Code::ResourceExhausted,
                "NEVER_FITS",
                format!("the batch can never be allocated: {reason}"),
            )
            .with_meta("reason", reason));
        }
    }

    let uuid = Uuid::now_v7();
    let batch_id = params
        .batch_id
        .unwrap_or_else(|| Uuid::now_v7().to_string());
    let state_message = match cluster.mode {
        spec::ProvisioningMode::Queue => format!(
            "Queued: waiting up to {}s for quota and capacity for the whole cluster ({} GPUs).",
            cluster.allocation_timeout_s,
            cluster.total_gpus()
        ),
        spec::ProvisioningMode::Default => "Queued for allocation.".to_string(),
    };
    let priority = batch
        .labels
        .get(PRIORITY_LABEL)
        .and_then(|p| p.parse::<i32>().ok())
        .unwrap_or(0);
    let new = NewBatch {
        name: BatchName::new(&project, &region, &batch_id),
        uuid,
        operation_id: Uuid::now_v7(),
        request_id: params.request_id,
        creator: principal.name.clone(),
        spec: batch.into_user_spec(),
        cluster,
        priority,
        state_message,
    };
    let created = app.store.create(new).await.map_err(|e| match e {
        crate::store::StoreError::AlreadyExists(m) => {
            ApiError::new(Code::AlreadyExists, "ALREADY_EXISTS", m).with_meta(
                "batch",
                BatchName::new(&project, &region, &batch_id).to_string(),
            )
        }
        other => other.into(),
    })?;
    match &created {
        Created::Replayed(r) => {
            tracing::info!(batch.id = %r.name.batch_id, request_id = r.request_id.as_deref().unwrap_or(""), "create replayed by requestId");
        }
        Created::New(r) => {
            app.scheduler
                .submitted(PendingBatch {
                    key: BatchKey(r.seq),
                    batch_id: r.name.batch_id.clone(),
                    project: r.name.project.clone(),
                    region: r.name.region.clone(),
                    priority: r.priority,
                    queued_at: r.create_time,
                    deadline: r.deadline,
                    cluster: r.cluster.clone(),
                })
                .await;
        }
    }
    Ok(format.respond(StatusCode::OK, &operation(created.record())))
}

/// `GET /v1/projects/{project}/locations/{region}/batches/{batch}`
#[utoipa::path(get, path = "/v1/projects/{project}/locations/{region}/batches/{batch}", tag = "batches",
    params(("project" = String, Path), ("region" = String, Path), ("batch" = String, Path)),
    responses((status = 200, body = crate::api::Batch), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorBody)))]
pub(super) async fn get(
    AppState(app): AppState<App>,
    ApiPath((project, region, batch_id)): ApiPath<(String, String, String)>,
    ApiQuery(_): ApiQuery<PlainParams>,
    format: Format,
) -> Result<Response, ApiError> {
    let name = BatchName::new(&project, &region, &batch_id);
    let record = app
        .store
        .get(&name)
        .await
        .map_err(|e| not_found_as(e, "batch", &name.to_string()))?;
    let mut batch = to_batch(&record);
    if let Some(info) = batch.flexq.as_mut() {
        describe_provisioning(&app, &record, info).await?;
    }
    Ok(format.respond(StatusCode::OK, &batch))
}

/// The costly part of the extension, for a single batch: queue position,
/// reasons and estimate while queued; the nodes once provisioned.
async fn describe_provisioning(
    app: &App,
    record: &BatchRecord,
    info: &mut FlexqInfo,
) -> Result<(), ApiError> {
    match record.provisioning {
        Provisioning::Queued if record.state == State::Pending => {
            if let Some(p) = app
                .scheduler
                .lock()
                .await
                .pending_info(BatchKey(record.seq))
            {
                info.queue_position = Some(p.queue_position);
                info.not_admitted_reasons = p.reasons;
                info.estimated_start_time = p.estimated_start_time;
            }
        }
        Provisioning::Provisioned | Provisioning::Released => {
            let placements = app.store.placements(record.seq).await?;
            let core = app.scheduler.lock().await;
            let mut executors = 0..;
            info.nodes = placements
                .into_iter()
                .map(|p| AllocatedPart {
                    index: (p.role == crate::scheduler::Role::Executor)
                        .then(|| executors.next().unwrap_or_default()),
                    is_virtual: core.is_virtual(&p.node),
                    node: p.node.0,
                    role: p.role.name().into(),
                    gpus: p.gpus,
                    cores: p.cores,
                    memory_mb: p.memory_mb,
                    local_ssd_gb: p.local_ssd_gb,
                })
                .collect();
        }
        _ => {}
    }
    Ok(())
}

/// `GET /v1/projects/{project}/locations/{region}/batches`
#[utoipa::path(get, path = "/v1/projects/{project}/locations/{region}/batches", tag = "batches",
    params(("project" = String, Path), ("region" = String, Path), ("pageSize" = Option<u32>, Query), ("pageToken" = Option<String>, Query), ("filter" = Option<String>, Query), ("orderBy" = Option<String>, Query)),
    responses((status = 200, body = crate::api::ListBatchesResponse), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorBody)))]
pub(super) async fn list(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    ApiQuery(params): ApiQuery<ListParams>,
    format: Format,
) -> Result<Response, ApiError> {
    let page_size = match params.page_size.as_deref().map(str::trim) {
        None | Some("") | Some("0") => DEFAULT_PAGE_SIZE,
        Some(raw) => match raw.parse::<i64>() {
            // AIP-158: a page size above the maximum is coerced to it.
            Ok(n) if n > 0 => n.min(i64::from(MAX_PAGE_SIZE)) as u32,
            _ => {
                return Err(ApiError::invalid_field(
                    "page_size",
                    format!(
                        "{} is not a page size; accepted: 1 to {MAX_PAGE_SIZE} (0 or absent: {DEFAULT_PAGE_SIZE})",
                        crate::api::quote(raw)
                    ),
                ));
            }
        },
    };
    if let Some(order) = params.order_by.as_deref() {
        let normal = order
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_ascii_lowercase();
        if !normal.is_empty() && normal != "create_time desc" {
            return Err(ApiError::invalid_field(
                "order_by",
                format!(
                    "{} is not supported; accepted: \"create_time desc\" (the default)",
                    crate::api::quote(order)
                ),
            ));
        }
    }
    let filter_text = params.filter.unwrap_or_default();
    let filter = Filter::parse(&filter_text).map_err(|e| ApiError::invalid_field("filter", e))?;
    let before = match params.page_token.as_deref() {
        None | Some("") => None,
        Some(token) => Some(decode_token(token, &project, &region, &filter_text)?),
    };
    let page = app
        .store
        .list(&project, &region, &filter, page_size, before)
        .await?;
    let response = ListBatchesResponse {
        batches: page.batches.iter().map(to_batch).collect(),
        next_page_token: page
            .next_before_seq
            .map(|seq| encode_token(seq, &project, &region, &filter_text))
            .unwrap_or_default(),
        unreachable: Vec::new(),
    };
    Ok(format.respond(StatusCode::OK, &response))
}

/// `DELETE /v1/projects/{project}/locations/{region}/batches/{batch}`
#[utoipa::path(delete, path = "/v1/projects/{project}/locations/{region}/batches/{batch}", tag = "batches",
    params(("project" = String, Path), ("region" = String, Path), ("batch" = String, Path)),
    responses((status = 200, description = "Deleted (terminal batches only)"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorBody)))]
pub(super) async fn delete(
    AppState(app): AppState<App>,
    ApiPath((project, region, batch_id)): ApiPath<(String, String, String)>,
    ApiQuery(_): ApiQuery<PlainParams>,
    format: Format,
) -> Result<Response, ApiError> {
    let name = BatchName::new(&project, &region, &batch_id);
    app.store
        .delete(&name)
        .await
        .map_err(|e| not_found_as(e, "batch", &name.to_string()))?;
    tracing::info!(batch.id = %batch_id, project = %project, region = %region, "batch deleted");
    Ok(format.respond(StatusCode::OK, &serde_json::json!({})))
}

/// `GET /v1/projects/{project}/regions/{region}/operations/{operation}`
#[utoipa::path(get, path = "/v1/projects/{project}/regions/{region}/operations/{operation}", tag = "operations",
    params(("project" = String, Path), ("region" = String, Path), ("operation" = String, Path)),
    responses((status = 200, body = crate::api::Operation), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorBody)))]
pub(super) async fn get_operation(
    AppState(app): AppState<App>,
    ApiPath((project, region, operation_id)): ApiPath<(String, String, String)>,
    ApiQuery(_): ApiQuery<PlainParams>,
    format: Format,
) -> Result<Response, ApiError> {
    let record = app
        .store
        .get_by_operation(&project, &region, &operation_id)
        .await
        .map_err(|e| not_found_as(e, "operation", &op_name(&project, &region, &operation_id)))?;
    Ok(format.respond(StatusCode::OK, &operation(&record)))
}

/// `POST /v1/projects/{project}/regions/{region}/operations/{operation}:cancel`
#[utoipa::path(post, path = "/v1/projects/{project}/regions/{region}/operations/{operation}", tag = "operations",
    description = "`{operation}` is `ID:cancel`: cancels the batch of the operation.",
    params(("project" = String, Path), ("region" = String, Path), ("operation" = String, Path)),
    responses((status = 200, description = "Cancellation requested"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorBody)))]
pub(super) async fn post_operation(
    AppState(app): AppState<App>,
    ApiPath((project, region, operation)): ApiPath<(String, String, String)>,
    ApiQuery(_): ApiQuery<PlainParams>,
    format: Format,
) -> Result<Response, ApiError> {
    let Some(operation_id) = operation.strip_suffix(":cancel") else {
        return Err(ApiError::new(
            Code::NotFound,
            "NO_SUCH_METHOD",
            format!(
                "no method POST on operation {}; use {operation}:cancel",
                crate::api::quote(&operation)
            ),
        ));
    };
    // In a task of its own: a dropped request must not stop between the
    // commit and the release of the capacity in memory.
    let (app2, p, r, op) = (
        app.clone(),
        project.clone(),
        region.clone(),
        operation_id.to_string(),
    );
    let cancelled = tokio::spawn(async move {
        let record = app2.store.cancel(&p, &r, &op, Utc::now()).await?;
        tracing::info!(batch.id = %record.name.batch_id, state = %record.state, "batch cancel requested");
        if record.state.is_terminal() {
            app2.scheduler.forget(BatchKey(record.seq)).await;
        }
        // The agents of its nodes stop the work (or drop a cluster that
        // was released before it started).
        app2.scheduler.work_changed();
        Ok::<_, crate::store::StoreError>(record)
    });
    cancelled
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| not_found_as(e, "operation", &op_name(&project, &region, operation_id)))?;
    Ok(format.respond(StatusCode::OK, &serde_json::json!({})))
}

fn op_name(project: &str, region: &str, id: &str) -> String {
    OperationName {
        project: project.into(),
        region: region.into(),
        operation_id: id.into(),
    }
    .to_string()
}

fn not_found_as(e: crate::store::StoreError, what: &str, name: &str) -> ApiError {
    match e {
        crate::store::StoreError::NotFound => ApiError::not_found(what, name),
        other => other.into(),
    }
}

/// The wire Batch of a stored record.
pub fn to_batch(r: &BatchRecord) -> Batch {
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
            zone: r.zone.clone(),
            allocate_time: r.allocate_time,
            ..FlexqInfo::default()
        }),
        ..r.spec.clone()
    }
}

/// Where the run can be seen, once an agent started it.
fn runtime_info(r: &BatchRecord) -> Option<crate::api::RuntimeInfo> {
    if r.master_url.is_none() && r.run.start_time.is_none() {
        return None;
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
    })
}

/// The label that sets a batch's queue priority (higher goes first).
pub const PRIORITY_LABEL: &str = "flexq-priority";

fn verdict_json(v: &Verdict, cluster: &spec::ClusterRequest) -> serde_json::Value {
    let (verdict, reasons, zone) = match v {
        Verdict::AllocateNow { zone } => ("ALLOCATE_NOW", vec![], Some(zone.clone())),
        Verdict::WouldQueue { reasons } => ("WOULD_QUEUE", reasons.clone(), None),
        Verdict::WouldFail { reason, stock_out } => (
            "WOULD_FAIL",
            vec![format!(
                "RESOURCE_EXHAUSTED ({}): {reason}",
                if *stock_out { "stock-out" } else { "quota" }
            )],
            None,
        ),
        Verdict::NeverFits { reason } => ("NEVER_FITS", vec![reason.clone()], None),
    };
    serde_json::json!({
        "verdict": verdict,
        "reasons": reasons,
        "zone": zone,
        "cluster": {
            "shape": shape_text(cluster),
            "provisioningMode": cluster.mode.name(),
            "allocationTimeout": format!("{}s", cluster.allocation_timeout_s),
            "gpus": cluster.total_gpus(),
            "quota": cluster.quota.iter().map(|q| serde_json::json!({"metric": q.metric, "amount": q.amount})).collect::<Vec<_>>(),
        },
    })
}

/// The Operation of a stored batch: done once the batch is terminal.
pub fn operation(r: &BatchRecord) -> Operation {
    let done = r.state.is_terminal();
    let (error, response) = match r.state {
        State::Succeeded => {
            let mut v = serde_json::to_value(to_batch(r)).unwrap_or_default();
            if let Some(map) = v.as_object_mut() {
                map.insert("@type".into(), BATCH_TYPE_URL.into());
            }
            (None, Some(v))
        }
        State::Cancelled => (
            Some(OperationError {
                code: Code::Cancelled.grpc_number(),
                message: r.state_message.clone(),
            }),
            None,
        ),
        State::Failed => {
            let code = if r.state_message.starts_with("RESOURCE_EXHAUSTED") {
                Code::ResourceExhausted
            } else if r.state_message.contains("allocation timeout") {
                Code::DeadlineExceeded
            } else {
                Code::FailedPrecondition
            };
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
            warnings: Vec::new(),
        },
        done,
        error,
        response,
    }
}

/// Page tokens are opaque to clients: a version, the keyset position and a
/// fingerprint of the query they continue, so a token cannot be replayed
/// against another filter or collection.
fn encode_token(before_seq: i64, project: &str, region: &str, filter: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!(
        "v1:{before_seq}:{:016x}",
        fingerprint(project, region, filter)
    ))
}

fn decode_token(token: &str, project: &str, region: &str, filter: &str) -> Result<i64, ApiError> {
    let invalid = || {
        ApiError::invalid_field(
            "page_token",
            format!(
                "{} is not a page token of this list (same parent and filter); start again without a token",
                crate::api::quote(token)
            ),
        )
    };
    let raw = URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
    let raw = String::from_utf8(raw).map_err(|_| invalid())?;
    let mut parts = raw.split(':');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("v1"), Some(seq), Some(fp), None)
            if fp == format!("{:016x}", fingerprint(project, region, filter)) =>
        {
            seq.parse().map_err(|_| invalid())
        }
        _ => Err(invalid()),
    }
}

/// FNV-1a over the query: stable across processes and versions (unlike
/// `DefaultHasher`), so a token minted by one replica works on another.
fn fingerprint(project: &str, region: &str, filter: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in project
        .bytes()
        .chain([0])
        .chain(region.bytes())
        .chain([0])
        .chain(filter.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}
