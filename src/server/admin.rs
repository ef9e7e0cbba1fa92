//! Capacity and quota: what operators and admins look at and change.

use axum::extract::State as AppState;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde::Deserialize;

use super::App;
use super::error::ApiError;
use super::extract::{ApiPath, Format, JsonBody};
use crate::api::quote;
use crate::spec::QuotaMetric;

/// `GET /v1/regions`: GPUs and local SSD per region, zone and GPU type.
#[utoipa::path(get, path = "/v1/regions", tag = "capacity",
    responses((status = 200, description = "GPUs and local SSD total / allocated / free per region, zone and GPU type"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorBody)))]
pub(super) async fn regions(AppState(app): AppState<App>, format: Format) -> Response {
    let rows = app.scheduler.lock().await.capacity_rows();
    format.respond(StatusCode::OK, &serde_json::json!({ "capacity": rows }))
}

/// `GET /v1/nodes`: every node, virtual ones marked, with what is free.
#[utoipa::path(get, path = "/v1/nodes", tag = "capacity",
    responses((status = 200, description = "Every node, virtual ones marked, with what is free"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorBody)))]
pub(super) async fn nodes(AppState(app): AppState<App>, format: Format) -> Response {
    let core = app.scheduler.lock().await;
    let nodes: Vec<_> = core
        .nodes()
        .into_iter()
        .map(
            |(spec, free_gpus, free_cores, free_memory_mb, free_ssd_gb)| {
                serde_json::json!({
                    "id": spec.id,
                    "region": spec.region,
                    "zone": spec.zone,
                    "pool": spec.pool,
                    "accelerator": spec.accelerator,
                    "virtual": spec.is_virtual,
                    "gpus": spec.gpu_addresses.len(),
                    "freeGpus": free_gpus,
                    "cores": spec.cores,
                    "freeCores": free_cores,
                    "memoryMb": spec.memory_mb,
                    "freeMemoryMb": free_memory_mb,
                    "localSsdGb": spec.local_ssd_gb,
                    "freeLocalSsdGb": free_ssd_gb,
                    // The fencing token of the agent holding it (none for
                    // virtual nodes).
                    "epoch": core.node_epoch(&spec.id).map(|e| e.to_string()),
                })
            },
        )
        .collect();
    format.respond(StatusCode::OK, &serde_json::json!({ "nodes": nodes }))
}

fn check_region(app: &App, region: &str) -> Result<(), ApiError> {
    if app.config.regions.contains_key(region) {
        Ok(())
    } else {
        Err(ApiError::not_found("region", region))
    }
}

/// `GET /v1/projects/{project}/regions/{region}/quotas`, shaped like
/// Compute Engine's region quotas.
#[utoipa::path(get, path = "/v1/projects/{project}/regions/{region}/quotas", tag = "quotas",
    params(("project" = String, Path), ("region" = String, Path)),
    responses((status = 200, description = "The project's quota limits and usage in the region"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorBody)))]
pub(super) async fn get_quotas(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    format: Format,
) -> Result<Response, ApiError> {
    check_region(&app, &region)?;
    let quotas = app.scheduler.lock().await.quotas(&project, &region);
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
    responses((status = 200, description = "The project's quotas after the change"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorBody)))]
pub(super) async fn patch_quota(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    format: Format,
    JsonBody(patch): JsonBody<QuotaPatch>,
) -> Result<Response, ApiError> {
    check_region(&app, &region)?;
    let metric = QuotaMetric::parse(&patch.metric).ok_or_else(|| {
        ApiError::invalid_field(
            "metric",
            format!(
                "{} is not a quota metric; accepted: {}",
                quote(&patch.metric),
                QuotaMetric::ALL.map(|m| m.name()).join(", ")
            ),
        )
    })?;
    // int64 travels as a string in proto3 JSON; accept both forms.
    let limit = match &patch.limit {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.parse::<u64>().ok(),
        _ => None,
    }
    .filter(|l| *l <= 1_000_000_000)
    .ok_or_else(|| {
        ApiError::invalid_field(
            "limit",
            format!(
                "{} is not a limit; accepted: a whole number from 0 to 1000000000",
                patch.limit
            ),
        )
    })?;
    app.store
        .set_quota_override(&project, &region, metric, limit, Utc::now())
        .await?;
    let quotas = {
        let mut core = app.scheduler.lock().await;
        if app.scheduler.replicated() {
            // What the database holds now: this change, and any another
            // admin committed since on another replica (never this one's
            // value over a newer one).
            for (p, r, m, l) in app.store.quota_overrides().await? {
                core.set_quota_limit(&p, &r, m, l);
            }
        } else {
            core.set_quota_limit(&project, &region, metric, limit);
        }
        core.quotas(&project, &region)
    };
    app.scheduler.wake();
    tracing::info!(project = %project, region = %region, metric = %metric, limit, "quota limit changed");
    Ok(format.respond(
        StatusCode::OK,
        &serde_json::json!({ "project": project, "region": region, "quotas": quotas }),
    ))
}
