//! A region's capacity queue over HTTP: its state, a page of it in its
//! order, holds and resumes. Each handler decodes, calls one engine use
//! case, encodes.

use axum::extract::State as AppState;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use super::App;
use super::extract::{ApiPath, ApiQuery, Format};
use crate::engine::Error;

/// `GET /v1/projects/{project}/regions/{region}/queue`: whether the queue
/// is held (by whom, since when, the region's hold or the project's) and
/// how many batches wait in it; project `-`: the region's queue.
#[utoipa::path(get, path = "/v1/projects/{project}/regions/{region}/queue", tag = "queues",
    params(("project" = String, Path, description = "A project, or - for the region's queue (admins)"), ("region" = String, Path)),
    responses((status = 200, description = "The queue: held, heldSince, heldBy, regionWide, queuedBatches")))]
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
}

/// `GET /v1/projects/{project}/regions/{region}/queue/entries`: a page of
/// the queue in its order, each batch with its position, shape, wait,
/// deadline, estimated start and why it waits (project `-`: the region's
/// queue, admins).
#[utoipa::path(get, path = "/v1/projects/{project}/regions/{region}/queue/entries", tag = "queues",
    params(("project" = String, Path, description = "A project, or - for the region's whole queue (admins)"), ("region" = String, Path),
        ("pageSize" = Option<i32>, Query, description = "1 to 100; 0 or absent: 50; more is lowered to 100"),
        ("pageToken" = Option<String>, Query, description = "nextPageToken of the page before")),
    responses((status = 200, body = crate::engine::QueueEntries)))]
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
    responses((status = 200, description = "The queue, held")))]
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
    responses((status = 200, description = "The queue after the resume")))]
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
    responses((status = 200, description = "Every held queue")))]
pub(super) async fn held_queues(AppState(app): AppState<App>, format: Format) -> Response {
    let queues = app.engine.held_queues().await;
    format.respond(StatusCode::OK, &serde_json::json!({ "queues": queues }))
}
