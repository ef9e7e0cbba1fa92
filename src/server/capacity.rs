//! Capacity and quota over HTTP: what operators and admins look at and
//! change. Each handler decodes, calls one engine use case, encodes.

use axum::extract::State as AppState;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use super::App;
use super::extract::{ApiPath, ApiQuery, Format, JsonBody};
use crate::engine::{Error, QuotaChange};

/// `GET /v1/regions`: the configured regions, and GPUs and local SSD per
/// region, zone and GPU type (a region without nodes has no rows).
#[utoipa::path(get, path = "/v1/regions", tag = "capacity",
    responses((status = 200, description = "regions: the configured regions; capacity: GPUs and local SSD total / allocated / free per region, zone and GPU type"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorSchema)))]
pub(super) async fn regions(AppState(app): AppState<App>, format: Format) -> Response {
    let rows = app.engine.capacity().await;
    let regions = app.engine.regions();
    format.respond(
        StatusCode::OK,
        &serde_json::json!({ "regions": regions, "capacity": rows }),
    )
}

/// `GET /v1/nodes`: every node, virtual ones marked, with what is free.
#[utoipa::path(get, path = "/v1/nodes", tag = "capacity",
    responses((status = 200, description = "Every node, virtual ones marked, with what is free"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorSchema)))]
pub(super) async fn nodes(AppState(app): AppState<App>, format: Format) -> Response {
    let nodes = app.engine.nodes().await;
    format.respond(StatusCode::OK, &serde_json::json!({ "nodes": nodes }))
}

/// `GET /v1/projects/{project}/regions/{region}/quotas`, shaped like
/// Compute Engine's region quotas; project `-` (admins): every project
/// with quota in use, a limit of its own or queued batches, as
/// `{"projects": [{"project", "quotas"}]}`.
#[utoipa::path(get, path = "/v1/projects/{project}/regions/{region}/quotas", tag = "quotas",
    params(("project" = String, Path, description = "A project, or - for every project's (admins)"), ("region" = String, Path)),
    responses((status = 200, description = "The project's quota limits and usage in the region"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorSchema)))]
pub(super) async fn get_quotas(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    format: Format,
) -> Result<Response, Error> {
    if project == "-" {
        let projects = app.engine.every_projects_quotas(&region).await?;
        return Ok(format.respond(
            StatusCode::OK,
            &serde_json::json!({ "project": project, "region": region, "projects": projects }),
        ));
    }
    let quotas = app.engine.quotas(&project, &region).await?;
    Ok(format.respond(
        StatusCode::OK,
        &serde_json::json!({ "project": project, "region": region, "quotas": quotas }),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct QuotaPatch {
    metric: String,
    limit: serde_json::Value,
}

/// `PATCH /v1/projects/{project}/regions/{region}/quotas` with
/// `{"metric": "...", "limit": N}`. A lowered limit never revokes running
/// work; it only blocks new admissions.
#[utoipa::path(patch, path = "/v1/projects/{project}/regions/{region}/quotas", tag = "quotas",
    params(("project" = String, Path), ("region" = String, Path)),
    request_body(content = Object, description = "{\"metric\": \"NVIDIA_L4_GPUS\", \"limit\": 8}"),
    responses((status = 200, description = "The project's quotas after the change"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorSchema)))]
pub(super) async fn patch_quota(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    format: Format,
    JsonBody(patch): JsonBody<QuotaPatch>,
) -> Result<Response, Error> {
    let change = QuotaChange {
        project: project.clone(),
        region: region.clone(),
        metric: patch.metric,
        limit: patch.limit,
    };
    let quotas = app.engine.set_quota(change).await?;
    Ok(format.respond(
        StatusCode::OK,
        &serde_json::json!({ "project": project, "region": region, "quotas": quotas }),
    ))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct UsageParams {
    start_time: Option<String>,
    end_time: Option<String>,
    #[serde(rename = "$alt")]
    _alt: Option<String>,
    #[serde(rename = "$fields", alias = "fields")]
    _fields: Option<String>,
    #[serde(rename = "$prettyPrint", alias = "prettyPrint")]
    _pretty: Option<String>,
}

/// `GET /v1/projects/{project}/regions/{region}/usage?startTime=&endTime=`:
/// GPU-hours, local-SSD GB-hours, batches, waits and expiries per project
/// and accelerator type (project `-`: every project, for admins).
#[utoipa::path(get, path = "/v1/projects/{project}/regions/{region}/usage", tag = "usage",
    params(("project" = String, Path, description = "A project, or - for every project (admins)"), ("region" = String, Path),
        ("startTime" = Option<String>, Query, description = "RFC 3339; default endTime minus 7 days"),
        ("endTime" = Option<String>, Query, description = "RFC 3339; default now")),
    responses((status = 200, body = crate::api::UsageReport), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorSchema)))]
pub(super) async fn usage(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    ApiQuery(params): ApiQuery<UsageParams>,
    format: Format,
) -> Result<Response, Error> {
    let report = app
        .engine
        .usage_report(
            &project,
            &region,
            params.start_time.as_deref(),
            params.end_time.as_deref(),
        )
        .await?;
    Ok(format.respond(StatusCode::OK, &report))
}

/// `GET /v1/projects/{project}/regions/{region}/queue`: whether the queue
/// is held (by whom, since when, the region's hold or the project's) and
/// how many batches wait in it; project `-`: the region's queue.
#[utoipa::path(get, path = "/v1/projects/{project}/regions/{region}/queue", tag = "queues",
    params(("project" = String, Path, description = "A project, or - for the region's queue (admins)"), ("region" = String, Path)),
    responses((status = 200, description = "The queue: held, heldSince, heldBy, regionWide, queuedBatches"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorSchema)))]
pub(super) async fn get_queue(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    format: Format,
) -> Result<Response, Error> {
    let queue = app.engine.queue(&project, &region).await?;
    Ok(format.respond(StatusCode::OK, &queue))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct QueuePageParams {
    page_size: Option<String>,
    page_token: Option<String>,
    #[serde(rename = "$alt")]
    _alt: Option<String>,
    #[serde(rename = "$fields", alias = "fields")]
    _fields: Option<String>,
    #[serde(rename = "$prettyPrint", alias = "prettyPrint")]
    _pretty: Option<String>,
}

/// `GET /v1/projects/{project}/regions/{region}/queue/entries`: a page of
/// the queue in its order, each batch with its position, shape, wait,
/// deadline, estimated start and why it waits (project `-`: the region's
/// queue, admins).
#[utoipa::path(get, path = "/v1/projects/{project}/regions/{region}/queue/entries", tag = "queues",
    params(("project" = String, Path, description = "A project, or - for the region's whole queue (admins)"), ("region" = String, Path),
        ("pageSize" = Option<i32>, Query, description = "1 to 100; 0 or absent: 50; more is lowered to 100"),
        ("pageToken" = Option<String>, Query, description = "nextPageToken of the page before")),
    responses((status = 200, body = crate::engine::QueueEntries), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorSchema)))]
pub(super) async fn queue_entries(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    ApiQuery(params): ApiQuery<QueuePageParams>,
    format: Format,
) -> Result<Response, Error> {
    let page = app
        .engine
        .queue_entries(
            &project,
            &region,
            params.page_size.as_deref(),
            params.page_token.as_deref(),
        )
        .await?;
    Ok(format.respond(StatusCode::OK, &page))
}

/// `POST /v1/projects/{project}/regions/{region}/queue:hold` (admins):
/// nothing in the queue is allocated until it is resumed; queued batches
/// keep their order and deadlines, and creates are still accepted. Project
/// `-` holds every project's queue of the region.
#[utoipa::path(post, path = "/v1/projects/{project}/regions/{region}/queue:hold", tag = "queues",
    params(("project" = String, Path, description = "A project, or - for every project of the region"), ("region" = String, Path)),
    responses((status = 200, description = "The queue, held"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorSchema)))]
pub(super) async fn hold_queue(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    axum::Extension(principal): axum::Extension<super::Principal>,
    format: Format,
) -> Result<Response, Error> {
    let queue = app.engine.hold_queue(&principal, &project, &region).await?;
    Ok(format.respond(StatusCode::OK, &queue))
}

/// `POST /v1/projects/{project}/regions/{region}/queue:resume` (admins).
#[utoipa::path(post, path = "/v1/projects/{project}/regions/{region}/queue:resume", tag = "queues",
    params(("project" = String, Path, description = "A project, or - for the region's own hold"), ("region" = String, Path)),
    responses((status = 200, description = "The queue after the resume"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorSchema)))]
pub(super) async fn resume_queue(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    format: Format,
) -> Result<Response, Error> {
    let queue = app.engine.resume_queue(&project, &region).await?;
    Ok(format.respond(StatusCode::OK, &queue))
}

/// `GET /v1/queues` (admins): every held queue.
#[utoipa::path(get, path = "/v1/queues", tag = "queues",
    responses((status = 200, description = "Every held queue"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorSchema)))]
pub(super) async fn held_queues(AppState(app): AppState<App>, format: Format) -> Response {
    let queues = app.engine.held_queues().await;
    format.respond(StatusCode::OK, &serde_json::json!({ "queues": queues }))
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ReloadParams {
    validate_only: Option<String>,
    #[serde(rename = "$alt")]
    _alt: Option<String>,
    #[serde(rename = "$fields", alias = "fields")]
    _fields: Option<String>,
    #[serde(rename = "$prettyPrint", alias = "prettyPrint")]
    _pretty: Option<String>,
}

/// `POST /v1/config:reload` (admins): reads the config again and puts it
/// in force, or with `validateOnly=true` says what that would change.
#[utoipa::path(post, path = "/v1/config:reload", tag = "config",
    params(("validateOnly" = Option<bool>, Query, description = "Only check the file and say what a reload would change")),
    responses((status = 200, description = "What the reload changed: live keys, restart-only keys left for the next start, nodes retired"), (status = "4XX", description = "google.rpc.Status error: the file is invalid (the key is named), or a reload is already running", body = super::openapi::ErrorSchema)))]
pub(super) async fn reload_config(
    AppState(app): AppState<App>,
    ApiQuery(params): ApiQuery<ReloadParams>,
    axum::Extension(principal): axum::Extension<super::Principal>,
    format: Format,
) -> Result<Response, Error> {
    let answer = app
        .engine
        .reload_config(params.validate_only.as_deref(), &principal.name)
        .await?;
    Ok(format.respond(StatusCode::OK, &answer))
}
