//! Who may call which REST route. What a route needs is one table
//! ([`need`]), applied in one middleware before any handler runs, so the
//! policy can be read (and tested) in one place; who the caller is and
//! whether they may is the engine's ([`Engine::identify`],
//! [`Engine::authorize`]), the same for every front end.
//!
//! [`Engine::identify`]: crate::engine::Engine::identify
//! [`Engine::authorize`]: crate::engine::Engine::authorize

use axum::extract::{MatchedPath, Request, State as AppState};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::App;
use crate::config::PrincipalRole;
pub use crate::engine::{Access, Principal, token_hash};

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
        "/v1/runtimes" | "/v1/regions" => Access::Anyone,
        "/v1/nodes" => Access::Admin,
        "/v1/nodes:register" => Access::Agent(None),
        "/v1/nodes/{node}" => Access::Agent(
            segments
                .get(3)
                .map(|n| n.split(':').next().unwrap_or_default().to_string()),
        ),
        "/v1/projects/{project}/regions/{region}/quotas" if !read => Access::Admin,
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
    let principal = if need == Access::Nobody && !app.config.principals.is_empty() {
        Principal {
            name: "unauthenticated".into(),
            role: PrincipalRole::Submitter,
            projects: Vec::new(),
            node: None,
            anonymous: false,
        }
    } else {
        let authorization = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match app.engine.identify(authorization) {
            Ok(p) => p,
            Err(e) => return e.into_response(),
        }
    };
    if let Err(e) = app.engine.authorize(&principal, &need) {
        return e.into_response();
    }
    if matches!(need, Access::ReadProject(_) | Access::WriteProject(_)) {
        // `/v1/projects/{p}/locations|regions/{r}/...`
        let segments: Vec<&str> = req.uri().path().split('/').collect();
        if let (Some(project), Some(region)) = (segments.get(3), segments.get(5)) {
            let read = req.method() == Method::GET || req.method() == Method::HEAD;
            if let Err(e) = app.engine.rate_limit(project, region, read) {
                return e.into_response();
            }
        }
    }
    req.extensions_mut().insert(principal);
    next.run(req).await
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
