//! The Batches and Operations resources of docs/api.md: each handler
//! decodes, calls one engine use case, encodes.

use axum::extract::State as AppState;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use super::App;
use super::extract::{ApiPath, ApiQuery, Format, JsonBody};
use crate::api::{Batch, BatchName, OperationName};
use crate::engine::Reason;
use crate::engine::{CreateAnswer, CreateRequest, Error, ListRequest};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct CreateParams {
    batch_id: Option<String>,
    request_id: Option<String>,
    validate_only: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ListParams {
    page_size: Option<String>,
    page_token: Option<String>,
    filter: Option<String>,
    order_by: Option<String>,
}

/// The query of a route with no parameters of its own: only the system
/// parameters, which [`ApiQuery`] sets aside; anything else is refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PlainParams {}

/// `POST /v1/projects/{project}/locations/{region}/batches`
#[utoipa::path(post, path = "/v1/projects/{project}/locations/{region}/batches", tag = "batches",
    params(("project" = String, Path), ("region" = String, Path), ("batchId" = Option<String>, Query), ("requestId" = Option<String>, Query), ("validateOnly" = Option<bool>, Query)),
    request_body = crate::api::Batch,
    responses((status = 200, description = "The batch's Operation, or with validateOnly=true a ValidateVerdict (nothing stored)", body = crate::api::CreateResponse)))]
pub(super) async fn create(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    ApiQuery(params): ApiQuery<CreateParams>,
    format: Format,
    axum::Extension(principal): axum::Extension<super::Principal>,
    JsonBody(batch): JsonBody<Batch>,
) -> Result<Response, Error> {
    let request = CreateRequest {
        project,
        region,
        batch,
        batch_id: params.batch_id,
        request_id: params.request_id,
        validate_only: params.validate_only,
    };
    Ok(match app.engine.create(&principal, request).await? {
        CreateAnswer::Operation(op) => format.respond(StatusCode::OK, &op),
        CreateAnswer::Verdict(verdict) => format.respond(StatusCode::OK, &verdict),
    })
}

/// `GET /v1/projects/{project}/locations/{region}/batches/{batch}`
#[utoipa::path(get, path = "/v1/projects/{project}/locations/{region}/batches/{batch}", tag = "batches",
    params(("project" = String, Path), ("region" = String, Path), ("batch" = String, Path)),
    responses((status = 200, body = crate::api::Batch)))]
pub(super) async fn get(
    AppState(app): AppState<App>,
    ApiPath((project, region, batch_id)): ApiPath<(String, String, String)>,
    ApiQuery(_): ApiQuery<PlainParams>,
    format: Format,
) -> Result<Response, Error> {
    let name = BatchName::new(&project, &region, &batch_id);
    let batch = app.engine.get(&name).await?;
    Ok(format.respond(StatusCode::OK, &batch))
}

/// `GET /v1/projects/{project}/locations/{region}/batches/{batch}/gpuUtilization`:
/// the batch's GPU utilization over time, for a chart (a flexq extension).
#[utoipa::path(get, path = "/v1/projects/{project}/locations/{region}/batches/{batch}/gpuUtilization", tag = "batches",
    params(("project" = String, Path), ("region" = String, Path), ("batch" = String, Path)),
    responses((status = 200, body = crate::api::GpuChart)))]
pub(super) async fn gpu_chart(
    AppState(app): AppState<App>,
    ApiPath((project, region, batch_id)): ApiPath<(String, String, String)>,
    ApiQuery(_): ApiQuery<PlainParams>,
    format: Format,
) -> Result<Response, Error> {
    let name = BatchName::new(&project, &region, &batch_id);
    let chart = app.engine.gpu_chart(&name).await?;
    Ok(format.respond(StatusCode::OK, &chart))
}

/// `GET /v1/projects/{project}/locations/{region}/batches/{batch}/executors`:
/// the batch's executors over time, core and extras, for a chart (a flexq
/// extension).
#[utoipa::path(get, path = "/v1/projects/{project}/locations/{region}/batches/{batch}/executors", tag = "batches",
    params(("project" = String, Path), ("region" = String, Path), ("batch" = String, Path)),
    responses((status = 200, body = crate::api::ExecutorChart)))]
pub(super) async fn executor_chart(
    AppState(app): AppState<App>,
    ApiPath((project, region, batch_id)): ApiPath<(String, String, String)>,
    ApiQuery(_): ApiQuery<PlainParams>,
    format: Format,
) -> Result<Response, Error> {
    let name = BatchName::new(&project, &region, &batch_id);
    let chart = app.engine.executor_chart(&name).await?;
    Ok(format.respond(StatusCode::OK, &chart))
}

/// `GET /v1/projects/{project}/locations/{region}/batches`
#[utoipa::path(get, path = "/v1/projects/{project}/locations/{region}/batches", tag = "batches",
    params(("project" = String, Path), ("region" = String, Path), ("pageSize" = Option<u32>, Query), ("pageToken" = Option<String>, Query), ("filter" = Option<String>, Query), ("orderBy" = Option<String>, Query)),
    responses((status = 200, body = crate::api::ListBatchesResponse)))]
pub(super) async fn list(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    ApiQuery(params): ApiQuery<ListParams>,
    format: Format,
) -> Result<Response, Error> {
    let request = ListRequest {
        project,
        region,
        page_size: params.page_size,
        page_token: params.page_token,
        filter: params.filter,
        order_by: params.order_by,
    };
    let page = app.engine.list(request).await?;
    Ok(format.respond(StatusCode::OK, &page))
}

/// `DELETE /v1/projects/{project}/locations/{region}/batches/{batch}`
#[utoipa::path(delete, path = "/v1/projects/{project}/locations/{region}/batches/{batch}", tag = "batches",
    params(("project" = String, Path), ("region" = String, Path), ("batch" = String, Path)),
    responses((status = 200, description = "Deleted (terminal batches only)")))]
pub(super) async fn delete(
    AppState(app): AppState<App>,
    ApiPath((project, region, batch_id)): ApiPath<(String, String, String)>,
    ApiQuery(_): ApiQuery<PlainParams>,
    format: Format,
) -> Result<Response, Error> {
    let name = BatchName::new(&project, &region, &batch_id);
    app.engine.delete(&name).await?;
    Ok(format.respond(StatusCode::OK, &serde_json::json!({})))
}

/// `GET /v1/projects/{project}/regions/{region}/operations/{operation}`
#[utoipa::path(get, path = "/v1/projects/{project}/regions/{region}/operations/{operation}", tag = "operations",
    params(("project" = String, Path), ("region" = String, Path), ("operation" = String, Path)),
    responses((status = 200, body = crate::api::Operation)))]
pub(super) async fn get_operation(
    AppState(app): AppState<App>,
    ApiPath((project, region, operation_id)): ApiPath<(String, String, String)>,
    ApiQuery(_): ApiQuery<PlainParams>,
    format: Format,
) -> Result<Response, Error> {
    let name = OperationName {
        project,
        region,
        operation_id,
    };
    let operation = app.engine.get_operation(&name).await?;
    Ok(format.respond(StatusCode::OK, &operation))
}

/// `POST /v1/projects/{project}/regions/{region}/operations/{operation}:cancel`
#[utoipa::path(post, path = "/v1/projects/{project}/regions/{region}/operations/{operation}", tag = "operations",
    description = "`{operation}` is `ID:cancel`: cancels the batch of the operation.",
    params(("project" = String, Path), ("region" = String, Path), ("operation" = String, Path)),
    responses((status = 200, description = "Cancellation requested")))]
pub(super) async fn post_operation(
    AppState(app): AppState<App>,
    ApiPath((project, region, operation)): ApiPath<(String, String, String)>,
    ApiQuery(_): ApiQuery<PlainParams>,
    format: Format,
) -> Result<Response, Error> {
    let Some(operation_id) = operation.strip_suffix(":cancel") else {
        return Err(Error::new(
            Reason::NoSuchMethod,
            format!(
                "no method POST on operation {}; use {operation}:cancel",
                crate::api::quote(&operation)
            ),
        ));
    };
    let name = OperationName {
        project,
        region,
        operation_id: operation_id.to_string(),
    };
    app.engine.cancel(&name).await?;
    Ok(format.respond(StatusCode::OK, &serde_json::json!({})))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct WatchParams {
    batch_id: Option<String>,
    last_event_id: Option<String>,
}

/// `GET /v1/projects/{project}/locations/{region}/batches:watch`: the
/// event stream, as Server-Sent Events (project `-`: every project, for
/// admins).
#[utoipa::path(get, path = "/v1/projects/{project}/locations/{region}/batches:watch", tag = "batches",
    params(("project" = String, Path, description = "A project, or - for every project (admins)"), ("region" = String, Path), ("batchId" = Option<String>, Query, description = "Only this batch"), ("lastEventId" = Option<String>, Query, description = "Resume after this event (the Last-Event-ID header wins)")),
    responses((status = 200, description = "text/event-stream: ready, batch, deleted and position events", content_type = "text/event-stream")))]
pub(super) async fn watch(
    AppState(app): AppState<App>,
    ApiPath((project, region)): ApiPath<(String, String)>,
    ApiQuery(params): ApiQuery<WatchParams>,
    headers: axum::http::HeaderMap,
) -> Result<Response, Error> {
    use crate::engine::WatchEvent;
    use axum::response::IntoResponse;
    use axum::response::sse::{Event, KeepAlive, Sse};
    let header = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| {
                    Error::invalid_field("Last-Event-ID", "is not text: an event id of this flexq")
                })?
                .to_string(),
        ),
    };
    let watch = app
        .engine
        .watch(crate::engine::WatchRequest {
            project,
            region,
            batch_id: params.batch_id,
            last_event_id: header.or(params.last_event_id),
        })
        .await?;
    let events = futures_util::stream::unfold(watch.events, |mut rx| async move {
        let event = rx.recv().await?;
        let sse = match event {
            WatchEvent::Ready { cursor } => Event::default()
                .event("ready")
                .id(cursor.to_string())
                .json_data(serde_json::json!({ "cursor": cursor.to_string() })),
            WatchEvent::Batch {
                cursor,
                changes,
                batch,
            } => Event::default()
                .event("batch")
                .id(cursor.to_string())
                .json_data(serde_json::json!({ "changes": changes, "batch": batch })),
            WatchEvent::Deleted { cursor, name, at } => Event::default()
                .event("deleted")
                .id(cursor.to_string())
                .json_data(serde_json::json!({ "name": name, "deleteTime": at })),
            WatchEvent::Position {
                name,
                queue_position,
                estimated_start_time,
            } => Event::default()
                .event("position")
                .json_data(serde_json::json!({
                    "name": name,
                    "queuePosition": queue_position,
                    "estimatedStartTime": estimated_start_time,
                })),
        };
        Some((sse, rx))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}
