//! Capacity over HTTP: the regions, the nodes, quota limits and use, and
//! the usage report. Each handler decodes, calls one engine use case,
//! encodes.

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
    responses((status = 200, description = "regions: the configured regions; capacity: GPUs and local SSD total / allocated / free per region, zone and GPU type")))]
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
    responses((status = 200, description = "Every node, virtual ones marked, with what is free")))]
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
    responses((status = 200, description = "The project's quota limits and usage in the region")))]
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
    responses((status = 200, description = "The project's quotas after the change")))]
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
}

/// `GET /v1/projects/{project}/regions/{region}/usage?startTime=&endTime=`:
/// GPU-hours, local-SSD GB-hours, batches, waits and expiries per project
/// and accelerator type (project `-`: every project, for admins).
#[utoipa::path(get, path = "/v1/projects/{project}/regions/{region}/usage", tag = "usage",
    params(("project" = String, Path, description = "A project, or - for every project (admins)"), ("region" = String, Path),
        ("startTime" = Option<String>, Query, description = "RFC 3339; default endTime minus 7 days"),
        ("endTime" = Option<String>, Query, description = "RFC 3339; default now")),
    responses((status = 200, body = crate::api::UsageReport)))]
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
