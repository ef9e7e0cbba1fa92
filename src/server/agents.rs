//! The agent side of the API, over HTTP: node registration, heartbeats,
//! polls, reports and output uploads, and the driver's output for readers.
//! Each handler decodes, calls one engine use case ([`crate::engine`]),
//! encodes.

use axum::extract::State as AppState;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::App;
use super::extract::{ApiPath, ApiQuery, Format, JsonBody};
use crate::api::{BatchName, quote};
use crate::engine::Reason;
use crate::engine::{Error, OutputRead, parse_epoch};
use crate::protocol::RegisterNode;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Heartbeat {
    epoch: serde_json::Value,
}

/// `POST /v1/nodes:register`
#[utoipa::path(post, path = "/v1/nodes:register", tag = "agents",
    request_body = crate::protocol::RegisterNode,
    responses((status = 200, body = crate::protocol::Lease)))]
pub(super) async fn register(
    AppState(app): AppState<App>,
    axum::Extension(principal): axum::Extension<super::Principal>,
    format: Format,
    JsonBody(req): JsonBody<RegisterNode>,
) -> Result<Response, Error> {
    let lease = app.engine.register_node(&principal, req).await?;
    Ok(format.respond(StatusCode::OK, &lease))
}

/// `POST /v1/nodes/{node}:METHOD`: the calls of a node's agent, each
/// carrying the epoch its registration answered; and an admin's cordon,
/// drain and uncordon of the node (no body).
#[utoipa::path(post, path = "/v1/nodes/{node}", tag = "agents",
    description = "`{node}` is `NODE:heartbeat` ({epoch}), `NODE:poll` (Poll → Assignments), `NODE:report` (Report), `NODE:output` (OutputUpload) or `NODE:telemetry` (GpuTelemetry → {taken, refused}) for the node's agent; `NODE:cordon`, `NODE:drain` or `NODE:uncordon` (no body; admins) answer the node.",
    params(("node" = String, Path)),
    request_body(content = Object),
    responses((status = 200, description = "Lease, Assignments, {} or {nextOffset}")))]
pub(super) async fn node_method(
    AppState(app): AppState<App>,
    ApiPath(path): ApiPath<String>,
    axum::Extension(principal): axum::Extension<super::Principal>,
    format: Format,
    request: axum::extract::Request,
) -> Result<Response, Error> {
    let (node, method) = NodeMethod::parse(&path);
    let engine = &app.engine;
    // An admin's methods take no body.
    let admin = match method {
        Some(NodeMethod::Cordon) => Some(engine.cordon_node(&principal, node, false).await?),
        Some(NodeMethod::Drain) => Some(engine.cordon_node(&principal, node, true).await?),
        Some(NodeMethod::Uncordon) => Some(engine.uncordon_node(node).await?),
        _ => None,
    };
    if let Some(view) = admin {
        return Ok(format.respond(StatusCode::OK, &view));
    }
    let JsonBody(body) =
        <JsonBody<serde_json::Value> as axum::extract::FromRequest<()>>::from_request(request, &())
            .await?;
    let answer = match method {
        Some(NodeMethod::Heartbeat) => {
            let req: Heartbeat = parse(body)?;
            to_json(engine.heartbeat(node, parse_epoch(&req.epoch)?).await?)?
        }
        Some(NodeMethod::Poll) => to_json(engine.poll(node, parse(body)?).await?)?,
        Some(NodeMethod::Report) => {
            engine.report(node, parse(body)?).await?;
            serde_json::json!({})
        }
        Some(NodeMethod::Output) => {
            let next = engine.upload_output(node, parse(body)?).await?;
            serde_json::json!({"nextOffset": next.to_string()})
        }
        Some(NodeMethod::Telemetry) => to_json(engine.gpu_telemetry(node, parse(body)?).await?)?,
        Some(NodeMethod::Cordon | NodeMethod::Drain | NodeMethod::Uncordon) | None => {
            return Err(Error::new(
                Reason::NoSuchMethod,
                format!(
                    "no method POST on node {}; use {node}:heartbeat, :poll, :report, :output or :telemetry (agents), :cordon, :drain or :uncordon (admins)",
                    quote(&path)
                ),
            ));
        }
    };
    Ok(format.respond(StatusCode::OK, &answer))
}

/// The methods of `POST /v1/nodes/{node}`, read from the *decoded* path
/// parameter `NODE:METHOD`: the one reading both the access check
/// ([`super::auth::Rule::NodeMethod`]) and the handler go by, so what is
/// authorised is exactly what runs. Exact and case-sensitive, as every route is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NodeMethod {
    Heartbeat,
    Poll,
    Report,
    Output,
    Telemetry,
    Cordon,
    Drain,
    Uncordon,
}

impl NodeMethod {
    /// `NODE:METHOD` → the node and its method (`None` when there is no
    /// such method).
    pub(super) fn parse(param: &str) -> (&str, Option<NodeMethod>) {
        let (node, method) = param.split_once(':').unwrap_or((param, ""));
        let method = match method {
            "heartbeat" => NodeMethod::Heartbeat,
            "poll" => NodeMethod::Poll,
            "report" => NodeMethod::Report,
            "output" => NodeMethod::Output,
            "telemetry" => NodeMethod::Telemetry,
            "cordon" => NodeMethod::Cordon,
            "drain" => NodeMethod::Drain,
            "uncordon" => NodeMethod::Uncordon,
            _ => return (node, None),
        };
        (node, Some(method))
    }

    /// An admin's method (on the node's capacity), not its agent's.
    pub(super) fn is_admin(self) -> bool {
        matches!(
            self,
            NodeMethod::Cordon | NodeMethod::Drain | NodeMethod::Uncordon
        )
    }
}

fn to_json(value: impl serde::Serialize) -> Result<serde_json::Value, Error> {
    serde_json::to_value(value).map_err(Error::internal)
}

/// A method's body, with the field path of what is wrong.
fn parse<T: DeserializeOwned>(body: serde_json::Value) -> Result<T, Error> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let field = match e.path().to_string() {
            p if p == "." => "body".to_string(),
            p => p,
        };
        Error::invalid_field(&field, e.inner().to_string())
    })
}

/// Query of `GET .../batches/{batch}/output`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct OutputParams {
    #[serde(default)]
    offset: Option<String>,
    #[serde(default)]
    wait_for: Option<String>,
}

/// `GET /v1/projects/{p}/locations/{r}/batches/{b}/output`: the driver's
/// output from `offset`. With `waitFor`, waits for more output or the end
/// of the batch (how `flexq batches wait` streams it).
#[utoipa::path(get, path = "/v1/projects/{project}/locations/{region}/batches/{batch}/output", tag = "batches",
    params(("project" = String, Path), ("region" = String, Path), ("batch" = String, Path), ("offset" = Option<String>, Query), ("waitFor" = Option<String>, Query)),
    responses((status = 200, body = crate::protocol::BatchOutput)))]
pub(super) async fn read_output(
    AppState(app): AppState<App>,
    ApiPath((project, region, batch_id)): ApiPath<(String, String, String)>,
    ApiQuery(params): ApiQuery<OutputParams>,
    format: Format,
) -> Result<Response, Error> {
    let read = OutputRead {
        name: BatchName::new(&project, &region, &batch_id),
        offset: params.offset,
        wait_for: params.wait_for,
    };
    let output = app.engine.read_output(read).await?;
    Ok(format.respond(StatusCode::OK, &output))
}
