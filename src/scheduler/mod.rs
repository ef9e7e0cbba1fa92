//! The Flex Start scheduler: the capacity-aware queue.
//!
//! [`core`] decides (pure: queue, quota ledger, capacity, placement,
//! deadlines; time is an argument). [`runner`] drives it: it wakes on
//! events or the next deadline, runs a pass, and commits the pass's
//! decisions to the store in one transaction before anyone can see them.

mod capacity;
mod core;
mod lease;
mod quota;
mod replica;
mod runner;
mod snapshot;
mod views;

pub use capacity::{NodeId, NodeSpec, Placement, Role};
pub use core::{
    Allocation, BatchKey, Decision, PendingBatch, PoolDecl, Scheduler, accelerator_label,
    shape_text,
};
pub use lease::LeaseError;
pub use quota::{QuotaRule, QuotaView, Shortfall};
pub use runner::{Role as SchedulerRole, SchedulerService};
pub use snapshot::Snapshot;
pub use views::{Blocker, CapacityRow, PendingInfo, Verdict};

use crate::config::Config;

/// A node of a configured pool.
fn pool_node(
    id: String,
    region: &str,
    zone: &str,
    name: &str,
    p: &crate::config::PoolConfig,
    is_virtual: bool,
) -> NodeSpec {
    NodeSpec {
        id: NodeId(id),
        region: region.to_string(),
        zone: zone.to_string(),
        pool: name.to_string(),
        accelerator: p.accelerator,
        gpu_addresses: (0..p.gpus_per_node).map(|i| i.to_string()).collect(),
        cores: p.cores,
        memory_mb: p.memory_mb,
        local_ssd_gb: p.local_ssd_gb,
        is_virtual,
    }
}

/// Every configured pool: (region, zone, pool name, pool).
fn config_pools(
    config: &Config,
) -> impl Iterator<Item = (&String, &String, &String, &crate::config::PoolConfig)> {
    config.regions.iter().flat_map(|(region, r)| {
        r.zones.iter().flat_map(move |(zone, z)| {
            z.node_pools
                .iter()
                .map(move |(name, p)| (region, zone, name, p))
        })
    })
}

/// The declared pools of the config, as the core sees them.
pub fn pools(config: &Config) -> Vec<PoolDecl> {
    config_pools(config)
        .map(|(region, zone, name, p)| PoolDecl {
            region: region.clone(),
            zone: zone.clone(),
            max_nodes: p.max_nodes,
            node: pool_node(format!("{zone}/{name}"), region, zone, name, p, false),
        })
        .collect()
}

/// The operator's virtual nodes: `virtual/{zone}/{pool}/{n}`.
pub fn virtual_nodes(config: &Config) -> Vec<NodeSpec> {
    config_pools(config)
        .flat_map(|(region, zone, name, p)| {
            (0..p.virtual_nodes).map(move |i| {
                pool_node(
                    format!("virtual/{zone}/{name}/{i}"),
                    region,
                    zone,
                    name,
                    p,
                    true,
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
