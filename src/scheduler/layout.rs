//! The core's shape as the config declares it — pools, virtual nodes,
//! quota rules, queue order — set when a core is built and changed in
//! place by a config reload ([`Scheduler::reconfigure`]), so that nothing
//! queued or running is disturbed.
//!
//! A node the config no longer declares is *retired*: its pool is gone,
//! or its pool now has fewer slots than nodes (`max_nodes`, less the
//! pool's virtual nodes, for agents' nodes), or it is a virtual node the
//! config dropped or reshaped. A retired node takes no new work and keeps
//! what it holds until it ends; a retired virtual node then leaves (and
//! its reshaped successor joins), an agent's node stays registered and
//! unschedulable until the config makes room for it again. Of a pool's
//! agent nodes, those holding work and those already schedulable keep the
//! slots first.

use std::collections::{HashMap, HashSet};

use super::capacity::{Node, NodeId, NodeSpec};
use super::core::Scheduler;
use super::declared::{Declared, declared_of};
use super::fairshare::FairSharePolicy;
use super::model::{PoolDecl, PreemptionPolicy};
use super::quota::QuotaRule;
use crate::spec::alternatives::AlternativesRule;

/// (region, zone, pool).
type PoolKey<'a> = (&'a str, &'a str, &'a str);

/// What the config declares of the core.
#[derive(Debug, Clone)]
pub struct Layout {
    pub pools: Vec<PoolDecl>,
    pub virtual_nodes: Vec<NodeSpec>,
    pub rules: Vec<QuotaRule>,
    pub fair: FairSharePolicy,
    /// The regions where preemption is on, and how.
    pub preemption: HashMap<String, PreemptionPolicy>,
    /// The regions where elastic clusters may grow, and how far.
    pub elastic: HashMap<String, super::model::ElasticPolicy>,
    /// The operator's placement alternatives: when a loan taken through
    /// each may be reclaimed (docs/rules.md#loans-and-reclaim).
    pub alternatives: Vec<AlternativesRule>,
}

/// What settling the nodes against the layout changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// Virtual nodes that joined.
    pub added: Vec<NodeId>,
    /// Virtual nodes that left (the config dropped or reshaped them and
    /// they held nothing).
    pub removed: Vec<NodeId>,
    /// Nodes that take no new work from now on.
    pub retired: Vec<NodeId>,
    /// Retired nodes the config makes room for again.
    pub restored: Vec<NodeId>,
}

impl Settled {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.retired.is_empty()
            && self.restored.is_empty()
    }
}

impl Scheduler {
    /// A core shaped by `layout`, with its virtual nodes.
    pub fn with_layout(layout: Layout) -> Scheduler {
        let mut core = Scheduler::default();
        core.reconfigure(layout);
        core
    }

    /// Applies a new layout in place: declared capacity, quota rules,
    /// queue order and weights, virtual nodes. Queued batches, running
    /// clusters, leases, holds, cordons, admins' quota overrides and usage
    /// stay. Every region is looked at again.
    pub fn reconfigure(&mut self, layout: Layout) -> Settled {
        self.declared = declared_of(&layout.pools);
        self.set_provisioned_pools(&layout.pools);
        self.ledger.set_rules(layout.rules);
        self.set_fair_share(layout.fair);
        self.set_preemption(layout.preemption);
        self.set_elastic(layout.elastic);
        self.set_reclaim(layout.alternatives);
        self.layout = Some(Declared {
            slots: layout
                .pools
                .iter()
                .map(|p| {
                    (
                        (p.region.clone(), p.zone.clone(), p.node.pool.clone()),
                        p.max_nodes,
                    )
                })
                .collect(),
            virtual_nodes: layout
                .virtual_nodes
                .into_iter()
                .map(|s| (s.id.clone(), s))
                .collect(),
        });
        let settled = self.settle_layout();
        let regions: Vec<String> = self
            .queue
            .region_names()
            .cloned()
            .chain(self.capacity.nodes.values().map(|n| n.spec.region.clone()))
            .collect();
        self.dirty.extend(regions);
        settled
    }

    /// Adds virtual nodes the layout may no longer declare, so that the
    /// clusters a rebuild restores onto them find them ([`Self::settle`]
    /// retires them afterwards).
    pub fn keep_virtual_nodes(&mut self, specs: Vec<NodeSpec>) {
        for spec in specs {
            if spec.is_virtual && !self.capacity.nodes.contains_key(&spec.id) {
                self.dirty.insert(spec.region.clone());
                self.capacity.insert(Node::new(spec));
            }
        }
    }

    /// Every virtual node there is now (to carry over to a rebuilt core).
    pub fn virtual_node_specs(&self) -> Vec<NodeSpec> {
        self.capacity
            .nodes
            .values()
            .filter(|n| n.spec.is_virtual)
            .map(|n| n.spec.clone())
            .collect()
    }

    /// Whether the config retired `node` (it takes no new work).
    pub fn is_retired(&self, node: &NodeId) -> bool {
        self.retired.contains(node)
    }

    /// Settles the nodes against the layout: retired virtual nodes that
    /// hold nothing leave, declared ones join, and the retired set is
    /// recomputed. Nothing without a layout.
    pub fn settle_layout(&mut self) -> Settled {
        let Some(layout) = self.layout.take() else {
            return Settled::default();
        };
        let mut out = Settled::default();
        let busy: HashSet<NodeId> = self
            .running
            .values()
            .flat_map(|a| a.placements.iter().map(|p| p.node.clone()))
            .collect();
        let declared_as_is = |n: &Node| layout.virtual_nodes.get(&n.spec.id) == Some(&n.spec);
        let leaving: Vec<NodeId> = self
            .capacity
            .nodes
            .values()
            .filter(|n| n.spec.is_virtual && !declared_as_is(n) && !busy.contains(&n.spec.id))
            .map(|n| n.spec.id.clone())
            .collect();
        for id in leaving {
            if let Some(n) = self.capacity.remove(&id) {
                self.dirty.insert(n.spec.region);
            }
            out.removed.push(id);
        }
        for (id, spec) in &layout.virtual_nodes {
            if !self.capacity.nodes.contains_key(id) {
                self.dirty.insert(spec.region.clone());
                self.capacity.insert(Node::new(spec.clone()));
                out.added.push(id.clone());
            }
        }
        let mut retired: HashSet<NodeId> = self
            .capacity
            .nodes
            .values()
            .filter(|n| n.spec.is_virtual && !declared_as_is(n))
            .map(|n| n.spec.id.clone())
            .collect();
        // Agents' nodes, per pool: the slots left by the pool's virtual
        // nodes go to busy nodes, then schedulable ones, then by id.
        let mut virtual_per_pool: HashMap<PoolKey, u32> = HashMap::new();
        for s in layout.virtual_nodes.values() {
            *virtual_per_pool
                .entry((&s.region, &s.zone, &s.pool))
                .or_default() += 1;
        }
        // (idle, retired, id): sorted, busy and schedulable nodes first.
        let mut per_pool: HashMap<PoolKey, Vec<(bool, bool, &NodeId)>> = HashMap::new();
        for n in self.capacity.nodes.values().filter(|n| !n.spec.is_virtual) {
            let s = &n.spec;
            per_pool
                .entry((&s.region, &s.zone, &s.pool))
                .or_default()
                .push((!busy.contains(&s.id), self.retired.contains(&s.id), &s.id));
        }
        for ((region, zone, pool), mut nodes) in per_pool {
            let key = (region.to_string(), zone.to_string(), pool.to_string());
            let max = layout.slots.get(&key).copied().unwrap_or(0);
            let slots = max.saturating_sub(
                virtual_per_pool
                    .get(&(region, zone, pool))
                    .copied()
                    .unwrap_or(0),
            ) as usize;
            nodes.sort();
            retired.extend(nodes.into_iter().skip(slots).map(|(_, _, id)| id.clone()));
        }
        for id in retired.difference(&self.retired) {
            out.retired.push(id.clone());
        }
        for id in self.retired.difference(&retired) {
            if self.capacity.nodes.contains_key(id) {
                out.restored.push(id.clone());
            }
        }
        for id in out.retired.iter().chain(&out.restored) {
            if let Some(n) = self.capacity.nodes.get(id) {
                self.dirty.insert(n.spec.region.clone());
            }
        }
        out.retired.sort();
        out.restored.sort();
        self.retired = retired;
        self.layout = Some(layout);
        self.refresh_unschedulable();
        out
    }

    /// Tells placement which nodes take no new work: cordoned or retired.
    pub(super) fn refresh_unschedulable(&mut self) {
        let ids = self
            .cordons
            .keys()
            .chain(&self.retired)
            .chain(self.provisions.suspending.keys())
            .cloned()
            .collect();
        self.capacity.set_unschedulable(ids);
    }
}
