//! The config as the pure layers see it: the rules' [`Policy`], the core's
//! declared pools and virtual nodes. The pure layers never import the
//! config; it converts into their types here, once per load.

use super::{Config, PoolConfig, QueueOrder};
use std::collections::HashMap;

use crate::scheduler::{
    FairSharePolicy, Layout, NodeId, NodeSpec, Order, PoolDecl, PreemptionPolicy, ProvisionPolicy,
};
use crate::spec::Policy;

impl Config {
    /// What the batch rules read: served regions and their GPU types,
    /// runtimes, defaults and limits.
    pub fn policy(&self) -> Policy {
        Policy {
            regions: self
                .regions
                .iter()
                .map(|(name, r)| (name.clone(), r.accelerators()))
                .collect(),
            runtimes: self.runtimes.keys().cloned().collect(),
            default_runtime: self.batches.default_runtime.clone(),
            default_ttl_s: self.batches.default_ttl.as_secs(),
            default_allocation_timeout_s: self.provisioning.default_allocation_timeout.as_secs(),
            max_allocation_timeout_s: self.provisioning.max_allocation_timeout.as_secs(),
            max_properties: self.batches.max_properties,
            max_property_key_bytes: self.batches.max_property_key_bytes,
            max_property_value_bytes: self.batches.max_property_value_bytes,
            shielded_vm_projects: self
                .projects
                .iter()
                .filter(|(_, p)| p.require_shielded_vm)
                .map(|(name, _)| name.clone())
                .collect(),
            default_infrastructure_retries: self.provisioning.infrastructure_retries,
            // Checked at load (`check.rs`): none fails here.
            alternative_rules: self
                .alternatives
                .iter()
                .filter_map(|l| l.rule().ok())
                .collect(),
            preemption_opt_out: self
                .preemption()
                .into_iter()
                .map(|(region, p)| (region, p.allow_opt_out))
                .collect(),
        }
    }

    /// How the core orders its queues: fair share or strict, the usage
    /// half-life, the projects' weights, the GPU types' weights.
    pub fn fair_share(&self) -> FairSharePolicy {
        FairSharePolicy {
            order: match self.scheduling.order {
                QueueOrder::FairShare => Order::FairShare,
                QueueOrder::Strict => Order::Strict,
            },
            half_life: self.scheduling.usage_half_life,
            weights: self
                .projects
                .iter()
                .filter_map(|(name, p)| Some((name.clone(), p.weight?)))
                .collect(),
            gpu_weights: self
                .scheduling
                .gpu_weights
                .iter()
                .filter_map(|(name, w)| Some((crate::spec::Accelerator::parse(name)?, *w)))
                .collect(),
        }
    }

    /// What the core is shaped by: pools, virtual nodes, quota rules and
    /// queue order.
    pub fn layout(&self) -> Layout {
        Layout {
            pools: self.pool_decls(),
            virtual_nodes: self.virtual_nodes(),
            rules: self.quotas.clone(),
            fair: self.fair_share(),
            preemption: self.preemption(),
            elastic: self.elastic(),
            alternatives: self
                .alternatives
                .iter()
                .filter_map(|l| l.rule().ok())
                .collect(),
        }
    }

    /// The regions where elastic batches may grow, and how far.
    pub fn elastic(&self) -> HashMap<String, crate::scheduler::ElasticPolicy> {
        self.regions
            .iter()
            .filter(|(_, r)| r.elastic.enabled)
            .map(|(name, r)| {
                let policy = crate::scheduler::ElasticPolicy {
                    max_share: r.elastic.max_share,
                };
                (name.clone(), policy)
            })
            .collect()
    }

    /// The regions where preemption is on, and how.
    pub fn preemption(&self) -> HashMap<String, PreemptionPolicy> {
        self.regions
            .iter()
            .filter_map(|(name, r)| {
                let p = r.preemption.as_ref().filter(|p| p.enabled)?;
                Some((
                    name.clone(),
                    PreemptionPolicy {
                        by_priority: p.by_priority,
                        by_fair_share: p.by_fair_share,
                        fair_share_margin: p.fair_share_margin,
                        min_runtime: p.min_runtime,
                        max_preemptions: p.max_preemptions,
                        grace: p.grace,
                        allow_opt_out: p.allow_opt_out,
                    },
                ))
            })
            .collect()
    }

    /// Every configured pool: (region, zone, pool name, pool).
    fn each_pool(&self) -> impl Iterator<Item = (&String, &String, &String, &PoolConfig)> {
        self.regions.iter().flat_map(|(region, r)| {
            r.zones.iter().flat_map(move |(zone, z)| {
                z.node_pools
                    .iter()
                    .map(move |(name, p)| (region, zone, name, p))
            })
        })
    }

    /// The declared pools, as the core sees them.
    pub fn pool_decls(&self) -> Vec<PoolDecl> {
        self.each_pool()
            .map(|(region, zone, name, p)| PoolDecl {
                region: region.clone(),
                zone: zone.clone(),
                max_nodes: p.max_nodes,
                node: pool_node(format!("{zone}/{name}"), region, zone, name, p, false),
                provisioner: p.provisioner.as_ref().map(|v| ProvisionPolicy {
                    resume_timeout: v.resume_timeout,
                    suspend_after: v.suspend_after,
                    min_nodes: v.min_nodes,
                    resume_rate: v.resume_rate,
                    backoff_base: v.backoff.base,
                    backoff_max: v.backoff.max,
                    preempt_if_boot_over: v.preempt_if_boot_over,
                }),
            })
            .collect()
    }

    /// The operator's virtual nodes: `virtual/{zone}/{pool}/{n}`.
    pub fn virtual_nodes(&self) -> Vec<NodeSpec> {
        self.each_pool()
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
}

/// A node of a configured pool.
fn pool_node(
    id: String,
    region: &str,
    zone: &str,
    name: &str,
    p: &PoolConfig,
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

impl super::AlternativesConfig {
    /// The pure layer's alternatives, or which key of this entry is wrong and
    /// why.
    pub(crate) fn rule(
        &self,
    ) -> Result<crate::spec::alternatives::AlternativesRule, (&'static str, String)> {
        crate::spec::alternatives::rule_from_config(
            self.region.as_deref(),
            self.project.as_deref(),
            self.accelerator.as_deref(),
            &self.alternatives,
            &self.allow,
            self.reclaim.as_deref(),
        )
    }
}
