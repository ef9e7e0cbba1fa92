//! Who may call which REST route. What a route needs is its [`Rule`],
//! said where the route is registered (`super::routes`), which fills the
//! [`Rules`] table as it goes; one middleware ([`enforce`]) applies it
//! before any handler runs. Who the caller is, whether they may and the
//! project's rate are the engine's ([`Engine::admit`]), the same for every
//! front end.
//!
//! [`Engine::admit`]: crate::engine::Engine::admit

use std::collections::HashMap;
use std::sync::Arc;

use axum::RequestExt;
use axum::extract::{MatchedPath, RawPathParams, Request, State as AppState};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::App;
use super::agents::NodeMethod;
use crate::engine::{Access, Error};

/// What a route needs, read from the route template the router matched
/// and its *percent-decoded* parameters — what the handlers read — never
/// from the raw path, whose text an attacker chooses
/// (`/v1/nodes/N:uncordo%6E` is the route `/v1/nodes/{node}` with `node` =
/// `N:uncordon`, an admin's method).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// No token: the health checks, the console's files (what the console
    /// shows comes from the API, with the caller's token) and the
    /// document.
    Nobody,
    /// Any principal.
    Anyone,
    Admin,
    /// An agent, for the node its request names (`:register`).
    Agent,
    /// `/v1/nodes/{node}`, `NODE:METHOD`: an admin's method (cordon, drain,
    /// uncordon) needs an admin, any other the node's own agent.
    NodeMethod,
    /// `{project}`'s readers for GET and HEAD, its writers otherwise.
    Project,
    /// `{project}`'s readers for GET and HEAD, admins otherwise (a
    /// project's quota limits are the admins' to set).
    ProjectAdminWrites,
}

impl Rule {
    /// What a call of `method` with the route's decoded `params` needs.
    pub(crate) fn need(self, method: &Method, params: &[(&str, &str)]) -> Access {
        let param = |name: &str| {
            params
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
                .unwrap_or_default()
        };
        let read = method == Method::GET || method == Method::HEAD;
        match self {
            Rule::Nobody => Access::Nobody,
            Rule::Anyone => Access::Anyone,
            Rule::Admin => Access::Admin,
            Rule::Agent => Access::Agent(None),
            Rule::NodeMethod => {
                let node = param("node");
                match NodeMethod::parse(&node) {
                    (_, Some(m)) if m.is_admin() => Access::Admin,
                    (node, _) => Access::Agent(Some(node.to_string())),
                }
            }
            Rule::Project if read => Access::ReadProject(param("project")),
            Rule::Project => Access::WriteProject(param("project")),
            Rule::ProjectAdminWrites if read => Access::ReadProject(param("project")),
            Rule::ProjectAdminWrites => Access::Admin,
        }
    }
}

/// The table: each route template's [`Rule`], as the routes were
/// registered.
#[derive(Debug, Default)]
pub(crate) struct Rules(HashMap<String, Rule>);

impl Rules {
    /// Records `route`'s rule. A route has one rule, whatever its methods:
    /// a second, different one is a mistake in the routes' declaration,
    /// found when the router is built (and by its tests), never served.
    pub(super) fn insert(&mut self, route: &str, rule: Rule) {
        if let Some(before) = self.0.insert(route.to_string(), rule) {
            assert_eq!(
                before, rule,
                "{route} is registered with two access rules: {before:?} and {rule:?}"
            );
        }
    }

    /// `route`'s rule, if it has one.
    pub(crate) fn get(&self, route: &str) -> Option<Rule> {
        self.0.get(route).copied()
    }

    /// What a call needs: nothing when no route matched (the answer is a
    /// 404); an admin for a route without a rule, which the routes'
    /// declaration makes impossible, so that a slip fails closed.
    pub(crate) fn need(
        &self,
        method: &Method,
        route: Option<&str>,
        params: &[(&str, &str)],
    ) -> Access {
        let Some(route) = route else {
            return Access::Nobody;
        };
        match self.get(route) {
            Some(rule) => rule.need(method, params),
            None => {
                tracing::error!(route, "a route without an access rule: admins only");
                Access::Admin
            }
        }
    }
}

/// The middleware's state: the app, and the table of the router it
/// guards.
#[derive(Clone)]
pub(super) struct Guard {
    pub(super) app: App,
    pub(super) rules: Arc<Rules>,
}

/// The middleware: authenticates the caller, applies the route's rule
/// ([`Rules::need`]) and the project's rate limit, and hands the principal
/// to handlers as a request extension.
pub(super) async fn enforce(
    AppState(Guard { app, rules }): AppState<Guard>,
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
    let need = rules.need(req.method(), route.as_deref(), &params);
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
    responses((status = 200, description = "The caller: name, role (submitter, admin, agent), projects, anonymous")))]
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

    /// The table the routes' declaration fills, against what each route
    /// must need, written out here rather than read from the declaration.
    #[test]
    fn the_route_table() {
        let rules = super::super::routes::declare().rules;
        let need = |method: &Method, route: &str, params: &[(&str, &str)]| {
            assert!(rules.get(route).is_some(), "{route} has no rule");
            rules.need(method, Some(route), params)
        };
        let route = "/v1/projects/{project}/locations/{region}/batches";
        let params = [("project", "demo"), ("region", "r")];
        assert_eq!(
            need(&Method::GET, route, &params),
            Access::ReadProject("demo".into())
        );
        assert_eq!(
            need(&Method::HEAD, route, &params),
            Access::ReadProject("demo".into())
        );
        assert_eq!(
            need(&Method::POST, route, &params),
            Access::WriteProject("demo".into())
        );
        let node = |param| need(&Method::POST, "/v1/nodes/{node}", &[("node", param)]);
        assert_eq!(node("gpu-1:poll"), Access::Agent(Some("gpu-1".into())));
        assert_eq!(node("gpu-1:uncordon"), Access::Admin);
        assert_eq!(node("gpu-1:drain"), Access::Admin);
        // Not a method: the agent's own node, which answers 404.
        assert_eq!(node("gpu-1:Uncordon"), Access::Agent(Some("gpu-1".into())));
        assert_eq!(
            need(&Method::POST, "/v1/nodes:register", &[]),
            Access::Agent(None)
        );
        let quotas = "/v1/projects/{project}/regions/{region}/quotas";
        assert_eq!(
            need(&Method::GET, quotas, &params),
            Access::ReadProject("demo".into())
        );
        assert_eq!(need(&Method::PATCH, quotas, &params), Access::Admin);
        for admins in [
            "/v1/projects/{project}/regions/{region}/queue:hold",
            "/v1/projects/{project}/regions/{region}/queue:resume",
        ] {
            assert_eq!(need(&Method::POST, admins, &params), Access::Admin);
        }
        for admins in ["/v1/nodes", "/v1/queues"] {
            assert_eq!(need(&Method::GET, admins, &[]), Access::Admin);
        }
        assert_eq!(need(&Method::POST, "/v1/config:reload", &[]), Access::Admin);
        for anyone in ["/v1/runtimes", "/v1/regions", "/v1/principal"] {
            assert_eq!(need(&Method::GET, anyone, &[]), Access::Anyone);
        }
        for nobody in [
            "/healthz",
            "/readyz",
            "/openapi.json",
            "/console",
            "/console/",
            "/console/{file}",
        ] {
            assert_eq!(need(&Method::GET, nobody, &[]), Access::Nobody);
        }
        // No route matched: a 404 follows, for anybody.
        assert_eq!(rules.need(&Method::GET, None, &[]), Access::Nobody);
        // A route the table does not know fails closed.
        assert_eq!(
            rules.need(&Method::GET, Some("/v1/unruled"), &[]),
            Access::Admin
        );
    }
}
