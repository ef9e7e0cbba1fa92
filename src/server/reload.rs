//! The config's reload over HTTP (admins). The handler decodes, calls the
//! engine's reload, encodes.

use axum::extract::State as AppState;
use axum::http::StatusCode;
use axum::response::Response;

use super::App;
use super::extract::{ApiQuery, Format};
use crate::engine::Error;

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ReloadParams {
    validate_only: Option<String>,
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
