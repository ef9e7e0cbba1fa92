//! The rules for a node an agent registers: its id, its GPU addresses and
//! its size against what its pool declares. Pure, like the batch rules, so
//! the engine and any tool check a node the same way.

use super::{Rejection, Violations, is_resource_id};
use crate::api::quote;

/// What an agent says its node has.
#[derive(Debug, Clone, Copy)]
pub struct NodeOffer<'a> {
    pub node_id: &'a str,
    pub gpu_addresses: &'a [String],
    pub cores: u32,
    pub memory_mb: u64,
    pub local_ssd_gb: u64,
}

/// What the node's pool declares each of its nodes has.
#[derive(Debug, Clone, Copy)]
pub struct NodeSize {
    pub gpus: u32,
    pub cores: u32,
    pub memory_mb: u64,
    pub local_ssd_gb: u64,
}

/// Checks a node's registration against its pool: a resource id, GPU
/// addresses that are usable and unique, no more GPUs than the pool's
/// nodes have, and cores, memory and local SSD from 1 to the pool's.
/// Every violation is reported at once (INVALID_ARGUMENT).
pub fn check_node(offer: &NodeOffer<'_>, size: &NodeSize) -> Result<(), Rejection> {
    let mut v = Violations::default();
    if !is_resource_id(offer.node_id) {
        v.invalid(
            "node_id",
            format!(
                "{} is invalid: 1 to 63 lowercase letters, digits and '-'",
                quote(offer.node_id)
            ),
        );
    }
    let mut seen = std::collections::HashSet::new();
    for a in offer.gpu_addresses {
        let usable = !a.is_empty()
            && a.len() <= 32
            && a.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b':' || b == b'.');
        if !usable || !seen.insert(a) {
            v.invalid(
                "gpu_addresses",
                format!("{} is not a usable, unique GPU address", quote(a)),
            );
        }
    }
    if offer.gpu_addresses.len() > size.gpus as usize {
        v.invalid(
            "gpu_addresses",
            format!(
                "{} GPUs; the pool's nodes have {}",
                offer.gpu_addresses.len(),
                size.gpus
            ),
        );
    }
    for (field, given, declared) in [
        ("cores", u64::from(offer.cores), u64::from(size.cores)),
        ("memory_mb", offer.memory_mb, size.memory_mb),
        ("local_ssd_gb", offer.local_ssd_gb, size.local_ssd_gb),
    ] {
        if given == 0 || given > declared {
            v.invalid(
                field,
                format!("{given} is out of range: from 1 to the pool's {declared}"),
            );
        }
    }
    v.into_rejection().map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: NodeSize = NodeSize {
        gpus: 4,
        cores: 48,
        memory_mb: 196_608,
        local_ssd_gb: 1500,
    };

    fn fields(r: Result<(), Rejection>) -> Vec<String> {
        r.err()
            .map(|r| r.violations.into_iter().map(|v| v.field).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_node_is_checked_against_its_pool_reporting_every_violation() {
        let gpus: Vec<String> = ["0", "1"].map(String::from).to_vec();
        let offer = NodeOffer {
            node_id: "gpu-host-1",
            gpu_addresses: &gpus,
            cores: 48,
            memory_mb: 196_608,
            local_ssd_gb: 1500,
        };
        assert_eq!(check_node(&offer, &SIZE), Ok(()));
        let bad: Vec<String> = ["0", "0", "a b", "1", "2"].map(String::from).to_vec();
        let r = check_node(
            &NodeOffer {
                node_id: "Host_1",
                gpu_addresses: &bad,
                cores: 0,
                memory_mb: 196_609,
                ..offer
            },
            &SIZE,
        );
        assert_eq!(
            fields(r),
            [
                "node_id",
                "gpu_addresses",
                "gpu_addresses",
                "gpu_addresses",
                "cores",
                "memory_mb"
            ]
        );
    }
}
