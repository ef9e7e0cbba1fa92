//! Agent leases: each registered node holds a lease its agent renews by
//! heartbeat. A lapsed lease loses the node; the epoch (fencing token)
//! changes at every registration, so a late report from an agent that
//! was replaced is recognised and refused.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};

use super::capacity::NodeId;

/// Why a heartbeat was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeLeaseError {
    #[error("node {0} is not registered (or its lease lapsed): register again")]
    Unknown(NodeId),
    #[error("node {node} has epoch {current}; epoch {given} is stale (fenced): register again")]
    Stale {
        node: NodeId,
        given: u64,
        current: u64,
    },
}

#[derive(Debug, Default)]
pub(crate) struct NodeLeases {
    by_node: HashMap<NodeId, (u64, DateTime<Utc>)>,
    expiries: BTreeSet<(DateTime<Utc>, NodeId)>,
}

impl NodeLeases {
    /// Grants (or re-grants) a lease.
    pub(super) fn grant(&mut self, node: NodeId, epoch: u64, expires: DateTime<Utc>) {
        if let Some((_, old)) = self.by_node.insert(node.clone(), (epoch, expires)) {
            self.expiries.remove(&(old, node.clone()));
        }
        self.expiries.insert((expires, node));
    }

    /// Renews a lease for the holder of `epoch`.
    pub(super) fn renew(
        &mut self,
        node: &NodeId,
        epoch: u64,
        expires: DateTime<Utc>,
    ) -> Result<(), NodeLeaseError> {
        let Some(&(current, old)) = self.by_node.get(node) else {
            return Err(NodeLeaseError::Unknown(node.clone()));
        };
        if current != epoch {
            return Err(NodeLeaseError::Stale {
                node: node.clone(),
                given: epoch,
                current,
            });
        }
        self.grant(node.clone(), epoch, expires.max(old));
        Ok(())
    }

    /// Drops `node`'s lease: the node left on purpose (suspended).
    pub(super) fn release(&mut self, node: &NodeId) {
        if let Some((_, expires)) = self.by_node.remove(node) {
            self.expiries.remove(&(expires, node.clone()));
        }
    }

    pub(super) fn epoch(&self, node: &NodeId) -> Option<u64> {
        self.by_node.get(node).map(|(e, _)| *e)
    }

    /// Nodes holding a lease now.
    pub(super) fn active(&self) -> usize {
        self.by_node.len()
    }

    pub(super) fn next_expiry(&self) -> Option<DateTime<Utc>> {
        self.expiries.first().map(|(t, _)| *t)
    }

    /// Removes and returns every lease lapsed at `now`, with its epoch.
    pub(super) fn lapsed(&mut self, now: DateTime<Utc>) -> Vec<(NodeId, u64, DateTime<Utc>)> {
        let mut out = Vec::new();
        while let Some((t, node)) = self.expiries.first().cloned() {
            if t > now {
                break;
            }
            self.expiries.remove(&(t, node.clone()));
            let epoch = self.by_node.remove(&node).map_or(0, |(e, _)| e);
            out.push((node, epoch, t));
        }
        out
    }
}
