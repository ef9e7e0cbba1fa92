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
mod runner;
mod snapshot;

pub use capacity::{NodeId, NodeSpec, Placement, Role};
pub use core::{
    Allocation, BatchKey, Blocker, CapacityRow, Decision, PendingBatch, PendingInfo, PoolDecl,
    Scheduler, Verdict, accelerator_label, shape_text,
};
pub use lease::LeaseError;
pub use quota::{QuotaRule, QuotaView, Shortfall};
pub use runner::SchedulerService;
pub use snapshot::Snapshot;

use crate::config::Config;

/// The declared pools of the config, as the core sees them.
pub fn pools(config: &Config) -> Vec<PoolDecl> {
    let mut out = Vec::new();
    for (region, r) in &config.regions {
        for (zone, z) in &r.zones {
            for (name, p) in &z.node_pools {
                out.push(PoolDecl {
                    region: region.clone(),
                    zone: zone.clone(),
                    max_nodes: p.max_nodes,
                    node: NodeSpec {
                        id: NodeId(format!("{zone}/{name}")),
                        region: region.clone(),
                        zone: zone.clone(),
                        pool: name.clone(),
                        accelerator: p.accelerator,
                        gpu_addresses: (0..p.gpus_per_node).map(|i| i.to_string()).collect(),
                        cores: p.cores,
                        memory_mb: p.memory_mb,
                        local_ssd_gb: p.local_ssd_gb,
                        is_virtual: false,
                    },
                });
            }
        }
    }
    out
}

/// The operator's virtual nodes: `virtual/{zone}/{pool}/{n}`.
pub fn virtual_nodes(config: &Config) -> Vec<NodeSpec> {
    let mut out = Vec::new();
    for (region, r) in &config.regions {
        for (zone, z) in &r.zones {
            for (name, p) in &z.node_pools {
                for i in 0..p.virtual_nodes {
                    out.push(NodeSpec {
                        id: NodeId(format!("virtual/{zone}/{name}/{i}")),
                        region: region.clone(),
                        zone: zone.clone(),
                        pool: name.clone(),
                        accelerator: p.accelerator,
                        gpu_addresses: (0..p.gpus_per_node).map(|i| i.to_string()).collect(),
                        cores: p.cores,
                        memory_mb: p.memory_mb,
                        local_ssd_gb: p.local_ssd_gb,
                        is_virtual: true,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
