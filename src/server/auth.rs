//! Who may call which REST route. What a route needs is one table
//! ([`need`]), applied in one middleware before any handler runs, so the
//! policy can be read (and tested) in one place; who the caller is,
//! whether they may and the project's rate are the engine's
//! ([`Engine::admit`]), the same for every front end.
//!
//! [`Engine::admit`]: crate::engine::Engine::admit

use axum::extract::{MatchedPath, Request, State as AppState};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::App;
use crate::engine::Access;

/// The table: what each route and method needs.
pub fn need(method: &Method, route: Option<&str>, path: &str) -> Access {
    let segments: Vec<&str> = path.split('/').collect();
    let project = || segments.get(3).map(|p| p.to_string()).unwrap_or_default();
    let Some(route) = route else {
        return Access::Nobody;
    };
    let read = method == Method::GET || method == Method::HEAD;
    match route {
        "/healthz" | "/readyz" | "/openapi.json" => Access::Nobody,
        // The console's files; what it shows comes from the API, with the
        // caller's token.
        "/console" | "/console/" | "/console/{file}" => Access::Nobody,
        "/v1/runtimes" | "/v1/regions" | "/v1/principal" => Access::Anyone,
        "/v1/nodes" => Access::Admin,
        "/v1/nodes:register" => Access::Agent(None),
        "/v1/nodes/{node}"
            if path.ends_with(":cordon")
                || path.ends_with(":drain")
                || path.ends_with(":uncordon") =>
        {
            Access::Admin
        }
        "/v1/nodes/{node}" => Access::Agent(
            segments
                .get(3)
                .map(|n| n.split(':').next().unwrap_or_default().to_string()),
        ),
        "/v1/projects/{project}/regions/{region}/quotas" if !read => Access::Admin,
        "/v1/projects/{project}/regions/{region}/queue:hold"
        | "/v1/projects/{project}/regions/{region}/queue:resume" => Access::Admin,
        r if r.starts_with("/v1/projects/{project}/") => {
            if read {
                Access::ReadProject(project())
            } else {
                Access::WriteProject(project())
            }
        }
        _ => Access::Admin,
    }
}

/// The middleware: authenticates the caller, applies [`need`] and the
/// project's rate limit, and hands the principal to handlers as a request
/// extension.
pub(super) async fn enforce(
    AppState(app): AppState<App>,
    mut req: Request,
    next: Next,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string());
    let need = need(req.method(), route.as_deref(), req.uri().path());
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    // `/v1/projects/{p}/locations|regions/{r}/...`: the rate's region.
    let region = req.uri().path().split('/').nth(5);
    let principal = match app.engine.admit(authorization, &need, region) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    req.extensions_mut().insert(principal);
    next.run(req).await
}

/// `GET /v1/principal`: who the caller is — name, role, projects, and
/// whether it is the anonymous admin of a server without principals —
/// so a client (the console) can show what it may do.
#[utoipa::path(get, path = "/v1/principal", tag = "auth",
    responses((status = 200, description = "The caller: name, role (submitter, admin, agent), projects, anonymous"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorSchema)))]
pub(super) async fn principal(
    axum::Extension(p): axum::Extension<crate::engine::Principal>,
    format: super::extract::Format,
) -> Response {
    format.respond(
        axum::http::StatusCode::OK,
        &serde_json::json!({
            "name": p.name,
            "role": p.role,
            "projects": p.projects,
            "anonymous": p.anonymous,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_table() {
        let p = "/v1/projects/demo/locations/r/batches";
        let route = "/v1/projects/{project}/locations/{region}/batches";
        assert_eq!(
            need(&Method::GET, Some(route), p),
            Access::ReadProject("demo".into())
        );
        assert_eq!(
            need(&Method::POST, Some(route), p),
            Access::WriteProject("demo".into())
        );
        assert_eq!(
            need(
                &Method::POST,
                Some("/v1/nodes/{node}"),
                "/v1/nodes/gpu-1:poll"
            ),
            Access::Agent(Some("gpu-1".into()))
        );
        assert_eq!(need(&Method::GET, None, "/nowhere"), Access::Nobody);
    }
}
