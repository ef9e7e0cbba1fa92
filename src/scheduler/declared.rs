//! What the config declares of the core's nodes, below the core and its
//! layout (`layout.rs`): every pool at its maximum node count (what
//! never-fit checks compare with), and the pools' slots and virtual nodes
//! a layout declares, kept to settle retired nodes later.

use std::collections::{BTreeMap, HashMap};

use super::capacity::{Node, NodeId, NodeSpec};
use super::model::PoolDecl;

/// The nodes a layout declares, kept to settle retired nodes later.
#[derive(Debug, Clone, Default)]
pub(crate) struct Declared {
    /// (region, zone, pool) → max_nodes.
    pub(super) slots: HashMap<(String, String, String), u32>,
    pub(super) virtual_nodes: BTreeMap<NodeId, NodeSpec>,
}

/// Every pool at its maximum node count, all free: what never-fit checks
/// compare with.
pub(crate) fn declared_of(pools: &[PoolDecl]) -> HashMap<String, BTreeMap<String, Vec<Node>>> {
    let mut declared: HashMap<String, BTreeMap<String, Vec<Node>>> = HashMap::new();
    for p in pools {
        let zone = declared
            .entry(p.region.clone())
            .or_default()
            .entry(p.zone.clone())
            .or_default();
        zone.extend((0..p.max_nodes).map(|i| {
            let mut spec = p.node.clone();
            spec.id = NodeId(format!("{}#{i}", spec.id));
            Node::new(spec)
        }));
    }
    declared
}
