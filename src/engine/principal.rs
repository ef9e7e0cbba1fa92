//! Who calls a use case.

use crate::config::PrincipalRole;

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

    /// Whether this caller may act for `node` on the agent endpoints.
    pub fn may_act_for_node(&self, node: &str) -> bool {
        self.anonymous || (self.role == PrincipalRole::Agent && self.node.as_deref() == Some(node))
    }
}
