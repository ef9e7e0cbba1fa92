//! Who may call which REST route. What a route needs is one table
//! ([`need`]), applied in one middleware before any handler runs, so the
//! policy can be read (and tested) in one place; who the caller is,
//! whether they may and the project's rate are the engine's
//! ([`Engine::admit`]), the same for every front end.
//!
//! [`Engine::admit`]: crate::engine::Engine::admit

use axum::RequestExt;
use axum::extract::{MatchedPath, RawPathParams, Request, State as AppState};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::App;
use super::agents::NodeMethod;
use crate::engine::{Access, Error};

/// The table: what each route and method needs, from the route template
/// the router matched and its *percent-decoded* parameters — what the
/// handlers read — never from the raw path, whose text an attacker
/// chooses (`/v1/nodes/N:uncordo%6E` is the route `/v1/nodes/{node}` with
/// `node` = `N:uncordon`, an admin's method).
pub fn need(method: &Method, route: Option<&str>, params: &[(&str, &str)]) -> Access {
    let param = |name: &str| {
        params
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.to_string())
    };
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
        "/v1/nodes/{node}" => {
            let node = param("node").unwrap_or_default();
            match NodeMethod::parse(&node) {
                (_, Some(m)) if m.is_admin() => Access::Admin,
                (node, _) => Access::Agent(Some(node.to_string())),
            }
        }
        "/v1/projects/{project}/regions/{region}/quotas" if !read => Access::Admin,
        "/v1/projects/{project}/regions/{region}/queue:hold"
        | "/v1/projects/{project}/regions/{region}/queue:resume" => Access::Admin,
        r if r.starts_with("/v1/projects/{project}/") => {
            let project = param("project").unwrap_or_default();
            if read {
                Access::ReadProject(project)
            } else {
                Access::WriteProject(project)
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
    // A parameter that is not UTF-8 once decoded cannot name anything:
    // refused here, before any handler.
    let params: Vec<(String, String)> = match req.extract_parts::<RawPathParams>().await {
        Ok(params) => params
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        // No route matched: no parameters (the answer is 404).
        Err(_) if route.is_none() => Vec::new(),
        Err(e) => {
            return Error::invalid_field(
                "path",
                format!("the path's parameters are not UTF-8 once percent-decoded ({e})"),
            )
            .into_response();
        }
    };
    let params: Vec<(&str, &str)> = params
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let need = need(req.method(), route.as_deref(), &params);
    // `/v1/projects/{p}/locations|regions/{r}/...`: the rate's region.
    let region = params
        .iter()
        .find(|(n, _)| *n == "region")
        .map(|(_, r)| r.to_string());
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let principal = match app.engine.admit(authorization, &need, region.as_deref()) {
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
        let route = "/v1/projects/{project}/locations/{region}/batches";
        let params = [("project", "demo"), ("region", "r")];
        assert_eq!(
            need(&Method::GET, Some(route), &params),
            Access::ReadProject("demo".into())
        );
        assert_eq!(
            need(&Method::POST, Some(route), &params),
            Access::WriteProject("demo".into())
        );
        let node = |param| need(&Method::POST, Some("/v1/nodes/{node}"), &[("node", param)]);
        assert_eq!(node("gpu-1:poll"), Access::Agent(Some("gpu-1".into())));
        assert_eq!(node("gpu-1:uncordon"), Access::Admin);
        assert_eq!(node("gpu-1:drain"), Access::Admin);
        // Not a method: the agent's own node, which answers 404.
        assert_eq!(node("gpu-1:Uncordon"), Access::Agent(Some("gpu-1".into())));
        assert_eq!(need(&Method::GET, None, &[]), Access::Nobody);
    }
}
