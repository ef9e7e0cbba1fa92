//! Capacity: the regions, the nodes with what is free on each (admins list,
//! cordon and drain them), and quota limits and use (a project reads its
//! own; admins read every project's and change limits).

use chrono::Utc;

use super::Principal;
use super::{Engine, Error};
use crate::api::quote;
use crate::scheduler::{CapacityRow, Cordon, NodeId, NodeSpec, QuotaView};
use crate::spec::QuotaMetric;
use crate::store::NodeCordon;

/// A node as the capacity view shows it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub id: String,
    pub region: String,
    pub zone: String,
    pub pool: String,
    pub accelerator: crate::spec::Accelerator,
    #[serde(rename = "virtual")]
    pub is_virtual: bool,
    pub gpus: usize,
    pub free_gpus: u32,
    pub cores: u32,
    pub free_cores: u32,
    pub memory_mb: u64,
    pub free_memory_mb: u64,
    pub local_ssd_gb: u64,
    pub free_local_ssd_gb: u64,
    /// The fencing token of the agent holding it (none for virtual
    /// nodes); an int64, so a string in proto3 JSON.
    pub epoch: Option<String>,
    /// `SCHEDULABLE`, `CORDONED`, `DRAINING` (cordoned, running parts
    /// left) or `DRAINED` (cordoned for a drain, nothing left on it);
    /// `RETIRING` or `RETIRED` when a config reload no longer declares it
    /// (its pool gone or shrunk): it takes no new work, with or without
    /// running parts left. A provisioned pool's node
    /// (docs/rules.md#provisioned-capacity) may also be `PROVISIONING`
    /// (registered for a set not complete yet: its batch's alone), `IDLE`
    /// (holding nothing since a pass saw it: suspended after the pool's
    /// `suspend_after`) or `SUSPENDING` (its suspend program runs).
    pub state: &'static str,
    /// Parts of running clusters on it.
    pub running_parts: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cordoned_since: Option<chrono::DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cordoned_by: Option<String>,
}

/// An admin's change of a quota limit, as the client sent it.
#[derive(Debug, Clone)]
pub struct QuotaChange {
    pub project: String,
    pub region: String,
    pub metric: String,
    /// A whole number, or one as a string (int64 in proto3 JSON).
    pub limit: serde_json::Value,
}

/// A project's quotas, in an admin's view of every project's.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectQuotas {
    pub project: String,
    pub quotas: Vec<QuotaView>,
}

/// What a node's cordon, retirement and running parts make of it.
fn node_state(
    cordon: Option<&Cordon>,
    retired: bool,
    running_parts: usize,
    provisioned: Option<&'static str>,
) -> &'static str {
    match cordon {
        None if retired && running_parts > 0 => "RETIRING",
        None if retired => "RETIRED",
        None => match provisioned {
            Some("provisioning") => "PROVISIONING",
            Some("suspending") => "SUSPENDING",
            Some("idle") => "IDLE",
            _ => "SCHEDULABLE",
        },
        Some(c) if !c.drain => "CORDONED",
        Some(_) if running_parts > 0 => "DRAINING",
        Some(_) => "DRAINED",
    }
}

/// The store's cordons as the core takes them.
pub(super) fn cordons_of(cordons: Vec<NodeCordon>) -> Vec<(NodeId, Cordon)> {
    cordons
        .into_iter()
        .map(|c| {
            (
                NodeId(c.node),
                Cordon {
                    since: c.since,
                    by: c.by,
                    drain: c.drain,
                },
            )
        })
        .collect()
}

impl Engine {
    /// GPUs and local SSD total / allocated / free per region, zone and
    /// GPU type.
    pub async fn capacity(&self) -> Vec<CapacityRow> {
        self.lock().await.capacity_rows()
    }

    /// Every node, virtual ones marked, with what is free.
    pub async fn nodes(&self) -> Vec<NodeView> {
        let core = self.lock().await;
        core.nodes()
            .into_iter()
            .map(
                |(spec, free_gpus, free_cores, free_memory_mb, free_ssd_gb)| {
                    let NodeSpec {
                        id,
                        region,
                        zone,
                        pool,
                        accelerator,
                        gpu_addresses,
                        cores,
                        memory_mb,
                        local_ssd_gb,
                        is_virtual,
                    } = spec.clone();
                    let cordon = core.cordon_of(&id).cloned();
                    let running_parts = core.parts_on(&id);
                    NodeView {
                        state: node_state(
                            cordon.as_ref(),
                            core.is_retired(&id),
                            running_parts,
                            core.provisioned_state(&id),
                        ),
                        running_parts,
                        cordoned_since: cordon.as_ref().map(|c| c.since),
                        cordoned_by: cordon.map(|c| c.by),
                        epoch: core.node_epoch(&id).map(|e| e.to_string()),
                        id: id.0,
                        region,
                        zone,
                        pool,
                        accelerator,
                        is_virtual,
                        gpus: gpu_addresses.len(),
                        free_gpus,
                        cores,
                        free_cores,
                        memory_mb,
                        free_memory_mb,
                        local_ssd_gb,
                        free_local_ssd_gb: free_ssd_gb,
                    }
                },
            )
            .collect()
    }

    /// Cordons a node (`drain`: and shows it drained once its running
    /// parts end): it takes no new allocation; what runs on it goes on;
    /// never-fit checks still count it. Answers the node.
    pub async fn cordon_node(
        &self,
        principal: &Principal,
        node: &str,
        drain: bool,
    ) -> Result<NodeView, Error> {
        self.change_cordon(node, Some((principal.name.as_str(), drain)))
            .await
    }

    /// Puts a cordoned node back into service. Answers the node.
    pub async fn uncordon_node(&self, node: &str) -> Result<NodeView, Error> {
        self.change_cordon(node, None).await
    }

    async fn change_cordon(
        &self,
        node: &str,
        cordon: Option<(&str, bool)>,
    ) -> Result<NodeView, Error> {
        let id = NodeId(node.to_string());
        if !self.lock().await.has_node(&id) {
            return Err(Error::not_found("node", node));
        }
        let now = Utc::now();
        self.shared
            .store
            .set_node_cordon(node, cordon.map(|(by, drain)| (by, now, drain)))
            .await?;
        {
            let cordons = cordons_of(self.bounded(self.shared.store.node_cordons()).await?);
            self.lock().await.set_cordons(cordons);
        }
        self.wake();
        match cordon {
            Some((by, true)) => tracing::info!(node, by, "node draining"),
            Some((by, false)) => tracing::info!(node, by, "node cordoned"),
            None => tracing::info!(node, "node uncordoned"),
        }
        self.nodes()
            .await
            .into_iter()
            .find(|n| n.id == node)
            .ok_or_else(|| Error::not_found("node", node))
    }

    /// The regions the config serves, by name.
    pub fn regions(&self) -> Vec<String> {
        self.config().regions.keys().cloned().collect()
    }

    pub(super) fn check_region(&self, region: &str) -> Result<(), Error> {
        if self.config().regions.contains_key(region) {
            Ok(())
        } else {
            Err(Error::not_found("region", region))
        }
    }

    /// A project's quota limits and usage in a region.
    pub async fn quotas(&self, project: &str, region: &str) -> Result<Vec<QuotaView>, Error> {
        self.check_region(region)?;
        Ok(self.lock().await.quotas(project, region))
    }

    /// Every project's quotas in a region: those with quota in use, a
    /// limit of their own, or queued batches.
    pub async fn every_projects_quotas(&self, region: &str) -> Result<Vec<ProjectQuotas>, Error> {
        self.check_region(region)?;
        let core = self.lock().await;
        Ok(core
            .quota_projects(region)
            .into_iter()
            .map(|project| ProjectQuotas {
                quotas: core.quotas(&project, region),
                project,
            })
            .collect())
    }

    /// Changes a project's quota limit. A lowered limit never revokes
    /// running work; it only blocks new admissions. Answers the project's
    /// quotas after the change.
    pub async fn set_quota(&self, change: QuotaChange) -> Result<Vec<QuotaView>, Error> {
        let QuotaChange {
            project,
            region,
            metric,
            limit,
        } = change;
        self.check_region(&region)?;
        if project == "-" {
            return Err(Error::invalid_field(
                "project",
                "\"-\" stands for every project, and a limit is set for one; accepted: a project id",
            ));
        }
        let metric_given = metric;
        let metric = QuotaMetric::parse(&metric_given).ok_or_else(|| {
            Error::invalid_field(
                "metric",
                format!(
                    "{} is not a quota metric; accepted: {}",
                    quote(&metric_given),
                    QuotaMetric::ALL.map(|m| m.name()).join(", ")
                ),
            )
        })?;
        // int64 travels as a string in proto3 JSON; accept both forms.
        let limit_value = match &limit {
            serde_json::Value::Number(n) => n.as_u64(),
            serde_json::Value::String(s) => s.parse::<u64>().ok(),
            _ => None,
        }
        .filter(|l| *l <= 1_000_000_000)
        .ok_or_else(|| {
            Error::invalid_field(
                "limit",
                format!("{limit} is not a limit; accepted: a whole number from 0 to 1000000000"),
            )
        })?;
        let limit = limit_value;
        self.shared
            .store
            .set_quota_override(&project, &region, metric, limit, Utc::now())
            .await?;
        let quotas = {
            let mut core = self.lock().await;
            if self.replicated() {
                // What the database holds now: this change, and any another
                // admin committed since on another replica (never this
                // one's value over a newer one).
                for (p, r, m, l) in self.bounded(self.shared.store.quota_overrides()).await? {
                    core.set_quota_limit(&p, &r, m, l);
                }
            } else {
                core.set_quota_limit(&project, &region, metric, limit);
            }
            core.quotas(&project, &region)
        };
        self.wake();
        tracing::info!(project = %project, region = %region, metric = %metric, limit, "quota limit changed");
        Ok(quotas)
    }
}
