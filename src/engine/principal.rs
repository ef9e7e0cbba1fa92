//! Who calls a use case, and what they may do. Every front end hands the
//! engine the caller's `Authorization` value ([`Engine::identify`]) and
//! what the request touches ([`Access`], [`Engine::authorize`]); the
//! rules live here once. A token's SHA-256 is compared, in constant time,
//! with each configured principal's; tokens are never logged.
//!
//! Without configured principals every caller is an anonymous admin; the
//! config then refuses any non-loopback `server.bind`.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::Reason;
use super::{Engine, Error};
use crate::config::{PrincipalConfig, PrincipalRole};

/// The caller of a use case, as a front end authenticated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub role: PrincipalRole,
    pub projects: Vec<String>,
    pub node: Option<String>,
    /// No principals are configured (loopback only).
    pub anonymous: bool,
}

impl Principal {
    /// The caller when no principals are configured (loopback only).
    pub fn anonymous() -> Principal {
        Principal {
            name: "anonymous".into(),
            role: PrincipalRole::Admin,
            projects: Vec::new(),
            node: None,
            anonymous: true,
        }
    }

    /// A caller without a token, on what needs none, when principals are
    /// configured: it may do nothing else.
    pub fn nobody() -> Principal {
        Principal {
            name: "unauthenticated".into(),
            role: PrincipalRole::Submitter,
            projects: Vec::new(),
            node: None,
            anonymous: false,
        }
    }

    /// Whether this caller may act for `node` on the agent endpoints.
    pub fn may_act_for_node(&self, node: &str) -> bool {
        self.anonymous || (self.role == PrincipalRole::Agent && self.node.as_deref() == Some(node))
    }
}

/// What a request needs of its caller.
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
    /// The agent endpoints; with the node when the request names it.
    Agent(Option<String>),
}

impl Engine {
    /// The caller of a request, from its `Authorization` value
    /// (`Bearer TOKEN`); anonymous when no principals are configured.
    fn identify(&self, authorization: Option<&str>) -> Result<Principal, Error> {
        let config = self.config();
        let principals = &config.principals;
        if principals.is_empty() {
            return Ok(Principal::anonymous());
        }
        let unauthenticated = |why: &str| Err(Error::new(Reason::Unauthenticated, why));
        let Some(token) = authorization
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
        else {
            return unauthenticated("a bearer token is required (Authorization: Bearer TOKEN)");
        };
        match authenticate(principals, token) {
            Some(p) => Ok(Principal {
                name: p.name.clone(),
                role: p.role,
                projects: p.projects.clone(),
                node: p.node.clone(),
                anonymous: false,
            }),
            None => unauthenticated("the bearer token is not valid"),
        }
    }

    /// Admits one request, the same for every front end: who the caller
    /// is (from its `Authorization` value), whether it may have `need`,
    /// and, for a project's region, its rate (a read for
    /// [`Access::ReadProject`], a change for [`Access::WriteProject`]).
    /// What needs nobody (health) is admitted without a token.
    pub fn admit(
        &self,
        authorization: Option<&str>,
        need: &Access,
        region: Option<&str>,
    ) -> Result<Principal, Error> {
        if *need == Access::Nobody && !self.config().principals.is_empty() {
            return Ok(Principal::nobody());
        }
        let principal = self.identify(authorization)?;
        self.authorize(&principal, need)?;
        if let (Access::ReadProject(project) | Access::WriteProject(project), Some(region)) =
            (need, region)
        {
            let read = matches!(need, Access::ReadProject(_));
            self.rate_limit(project, region, read)?;
        }
        Ok(principal)
    }

    /// Whether `p` may do what `need` says; the error says what is missing.
    fn authorize(&self, p: &Principal, need: &Access) -> Result<(), Error> {
        let result = authorize(p, need);
        if let Err(e) = &result {
            tracing::info!(principal = %p.name, why = %e.message, "request refused: permission denied");
        }
        result
    }
}

/// The rule of [`Engine::authorize`].
fn authorize(p: &Principal, need: &Access) -> Result<(), Error> {
    let denied = |why: String| {
        Err(Error::new(Reason::PermissionDenied, why).with_meta("principal", p.name.clone()))
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
fn authenticate<'a>(principals: &'a [PrincipalConfig], token: &str) -> Option<&'a PrincipalConfig> {
    let hash = token_hash(token);
    let mut found = None;
    for p in principals {
        if bool::from(hash.as_bytes().ct_eq(p.token_sha256.as_bytes())) && found.is_none() {
            found = Some(p);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Code;

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
    fn submitters_reach_only_their_projects() {
        let alice = Principal {
            name: "alice".into(),
            role: PrincipalRole::Submitter,
            projects: vec!["demo".into()],
            node: None,
            anonymous: false,
        };
        assert!(authorize(&alice, &Access::WriteProject("demo".into())).is_ok());
        let e = authorize(&alice, &Access::ReadProject("other".into())).expect_err("other");
        assert_eq!(e.code, Code::PermissionDenied);
        assert!(e.message.contains("\"other\""), "{}", e.message);
        assert!(authorize(&alice, &Access::Admin).is_err());
        assert!(authorize(&alice, &Access::Agent(None)).is_err());
    }
}
