//! Who may do what. Every request but health checks carries a bearer
//! token; its SHA-256 is compared, in constant time, with each configured
//! principal's. What a route needs is one table ([`need`]), applied in one
//! middleware before any handler runs, so the policy can be read (and
//! tested) in one place. Tokens are never logged.
//!
//! Without configured principals every caller is an anonymous admin; the
//! config then refuses any non-loopback `server.bind`.

use axum::extract::{MatchedPath, Request, State as AppState};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::App;
use crate::api::Code;
use crate::config::{PrincipalConfig, PrincipalRole};
use crate::engine::Error;
pub use crate::engine::Principal;

/// What a route needs of its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Health checks and unknown routes (which answer 404).
    Nobody,
    /// Any authenticated caller: the runtime catalog, region capacity.
    Anyone,
    /// Reading a project's batches, operations, output, quotas.
    ReadProject(String),
    /// Creating, cancelling, deleting a project's batches.
    WriteProject(String),
    /// Changing quotas and capacity, reading every node.
    Admin,
    /// The agent endpoints; with the node when the path names it.
    Agent(Option<String>),
}

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

/// Whether `p` may do what `need` says; the error says what is missing.
pub fn authorize(p: &Principal, need: &Access) -> Result<(), Error> {
    let denied = |why: String| {
        Err(Error::new(Code::PermissionDenied, "PERMISSION_DENIED", why)
            .with_meta("principal", p.name.clone()))
    };
    match need {
        Access::Nobody | Access::Anyone => Ok(()),
        // Without principals (loopback only) the anonymous caller runs the
        // agents too.
        Access::Agent(_) if p.anonymous => Ok(()),
        Access::Agent(_) if p.role != PrincipalRole::Agent => denied(format!(
            "{} is not an agent: only agents use the agent endpoints",
            p.name
        )),
        Access::Agent(Some(node)) if !p.may_act_for_node(node) => denied(format!(
            "{} acts for node {}, not {node}",
            p.name,
            p.node.as_deref().unwrap_or("(none)")
        )),
        Access::Agent(_) => Ok(()),
        _ if p.role == PrincipalRole::Agent => denied(format!(
            "{} is an agent: agents use only the agent endpoints",
            p.name
        )),
        _ if p.role == PrincipalRole::Admin => Ok(()),
        Access::Admin => denied(format!(
            "{} is a submitter: only admins change quotas and capacity or list nodes",
            p.name
        )),
        Access::ReadProject(project) | Access::WriteProject(project) => {
            if p.projects.iter().any(|q| q == project) {
                Ok(())
            } else {
                denied(format!(
                    "{} may not access project {}",
                    p.name,
                    crate::api::quote(project)
                ))
            }
        }
    }
}

/// Lowercase hex SHA-256 of a token.
pub fn token_hash(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The principal a token belongs to: compared with every configured hash
/// in constant time (no early exit on a match either).
pub fn authenticate<'a>(
    principals: &'a [PrincipalConfig],
    token: &str,
) -> Option<&'a PrincipalConfig> {
    let hash = token_hash(token);
    let mut found = None;
    for p in principals {
        if bool::from(hash.as_bytes().ct_eq(p.token_sha256.as_bytes())) && found.is_none() {
            found = Some(p);
        }
    }
    found
}

fn unauthenticated(message: &str) -> Response {
    Error::new(Code::Unauthenticated, "UNAUTHENTICATED", message).into_response()
}

/// The middleware: authenticates the caller, applies [`need`], and hands
/// the principal to handlers as a request extension.
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
    let principal = if app.config.principals.is_empty() {
        Principal::anonymous()
    } else if need == Access::Nobody {
        Principal {
            name: "unauthenticated".into(),
            role: PrincipalRole::Submitter,
            projects: Vec::new(),
            node: None,
            anonymous: false,
        }
    } else {
        let token = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let Some(token) = token else {
            return unauthenticated("a bearer token is required (Authorization: Bearer TOKEN)");
        };
        match authenticate(&app.config.principals, token) {
            Some(p) => Principal {
                name: p.name.clone(),
                role: p.role,
                projects: p.projects.clone(),
                node: p.node.clone(),
                anonymous: false,
            },
            None => return unauthenticated("the bearer token is not valid"),
        }
    };
    if let Err(e) = authorize(&principal, &need) {
        tracing::info!(principal = %principal.name, http.method = %req.method(), http.path = %req.uri().path(), "request refused: permission denied");
        return e.into_response();
    }
    if matches!(need, Access::ReadProject(_) | Access::WriteProject(_)) {
        if let Err(refused) = app.limits.check(req.method(), req.uri().path()) {
            return refused;
        }
    }
    req.extensions_mut().insert(principal);
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(name: &str, token: &str) -> PrincipalConfig {
        PrincipalConfig {
            name: name.into(),
            role: PrincipalRole::Admin,
            projects: vec![],
            node: None,
            token_sha256: token_hash(token),
        }
    }

    #[test]
    fn tokens_are_matched_by_hash() {
        let ps = vec![principal("a", "token-a"), principal("b", "token-b")];
        assert_eq!(
            authenticate(&ps, "token-b").map(|p| p.name.as_str()),
            Some("b")
        );
        assert!(authenticate(&ps, "token-c").is_none());
        assert!(authenticate(&ps, "").is_none());
        assert_eq!(
            token_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

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
