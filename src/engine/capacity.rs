//! What operators and admins look at and change: capacity per region and
//! node, quotas, the metrics snapshot, readiness.

use chrono::Utc;

use super::Principal;
use super::{Engine, Error, ReplicaRole};
use crate::api::{Code, quote};
use crate::scheduler::{CapacityRow, Cordon, Hold, NodeId, NodeSpec, QuotaView, Snapshot};
use crate::spec::QuotaMetric;
use crate::store::{Backend, NodeCordon, QueueHold};

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
    /// running parts left.
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

/// A queue (a project's in a region, or with project `-` the region's)
/// as admins see it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueView {
    pub project: String,
    pub region: String,
    pub held: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_since: Option<chrono::DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// The hold is the whole region's.
    pub region_wide: bool,
    pub queued_batches: usize,
}

/// A queued batch as a page of its region's queue shows it.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueEntry {
    /// `projects/P/locations/R/batches/ID`.
    pub name: String,
    pub project: String,
    /// 1-based, in the whole region's order (docs/api.md, "The capacity
    /// queue").
    pub queue_position: usize,
    pub priority: i32,
    /// "1 l4 driver + 7 executors of l4 (4 cores, 1 GPU, 375 GB local SSD)".
    pub shape: String,
    /// GPUs of the whole cluster.
    pub gpus: u64,
    /// The GPU type (`cpu` without one).
    pub accelerator: String,
    /// When it joined the queue (its create, or its requeue).
    pub queue_time: chrono::DateTime<Utc>,
    /// Past it the batch fails (none in default mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocation_deadline: Option<chrono::DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimated_start_time: Option<chrono::DateTime<Utc>>,
    pub not_admitted_reasons: Vec<String>,
}

/// A page of a region's queue, in its order.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueEntries {
    pub entries: Vec<QueueEntry>,
    /// Empty on the last page.
    pub next_page_token: String,
    /// Batches queued in the scope (the project's, or with `-` the
    /// region's).
    pub total_size: usize,
}

/// A project's quotas, in an admin's view of every project's.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectQuotas {
    pub project: String,
    pub quotas: Vec<QuotaView>,
}

/// Queue pages: 50 entries unless asked, never more than 100.
const QUEUE_PAGE_SIZE: u32 = 50;
/// Entries near the head each replay the queue ahead for their estimate
/// (about 0.5 ms at 100k queued) under the core's lock: a page stays small.
const MAX_QUEUE_PAGE_SIZE: u32 = 100;

/// What a node's cordon, retirement and running parts make of it.
fn node_state(cordon: Option<&Cordon>, retired: bool, running_parts: usize) -> &'static str {
    match cordon {
        None if retired && running_parts > 0 => "RETIRING",
        None if retired => "RETIRED",
        None => "SCHEDULABLE",
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

/// The store's holds as the core takes them.
pub(super) fn holds_of(holds: Vec<QueueHold>) -> Vec<(String, Option<String>, Hold)> {
    holds
        .into_iter()
        .map(|h| {
            (
                h.region,
                h.project,
                Hold {
                    since: h.held_at,
                    by: h.held_by,
                },
            )
        })
        .collect()
}

/// Whether this replica can serve, and what it does.
#[derive(Debug, Clone)]
pub struct Readiness {
    pub replica: String,
    pub role: ReplicaRole,
    pub database: Backend,
    /// With several replicas: who holds the leader lease, if it is live.
    pub leader: Option<String>,
    /// The config generation in force and the last reload.
    pub config: super::ConfigStatus,
    /// The database's disk is full: writes are refused, reads go on.
    pub store_full: bool,
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
                        state: node_state(cordon.as_ref(), core.is_retired(&id), running_parts),
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

    fn check_region(&self, region: &str) -> Result<(), Error> {
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

    /// Holds a queue: `project` `-` holds the whole region. Queued batches
    /// stay queued in their order and keep their deadlines; creates are
    /// still accepted; nothing in it is allocated until it is resumed.
    /// Holding a held queue keeps the first hold. Answers the queue.
    pub async fn hold_queue(
        &self,
        principal: &Principal,
        project: &str,
        region: &str,
    ) -> Result<QueueView, Error> {
        self.change_hold(project, region, Some(principal.name.as_str()))
            .await
    }

    /// Resumes a held queue (a project's, or with `-` the region's; a
    /// project under a region-wide hold stays held). Resuming a queue that
    /// is not held changes nothing. Answers the queue.
    pub async fn resume_queue(&self, project: &str, region: &str) -> Result<QueueView, Error> {
        self.change_hold(project, region, None).await
    }

    async fn change_hold(
        &self,
        project: &str,
        region: &str,
        by: Option<&str>,
    ) -> Result<QueueView, Error> {
        self.check_region(region)?;
        let scope = (project != "-").then_some(project);
        let now = Utc::now();
        self.shared
            .store
            .set_queue_hold(region, scope, by.map(|b| (b, now)))
            .await?;
        {
            // What the database holds now, this change and any other
            // admin's since.
            let holds = holds_of(self.bounded(self.shared.store.queue_holds()).await?);
            self.lock().await.set_holds(holds);
        }
        self.wake();
        match by {
            Some(by) => tracing::info!(project, region, by, "queue held"),
            None => tracing::info!(project, region, "queue resumed"),
        }
        self.queue(project, region).await
    }

    /// A queue's state: held or not (and by whom, since when, whether the
    /// whole region is), and how many batches wait in it.
    pub async fn queue(&self, project: &str, region: &str) -> Result<QueueView, Error> {
        self.check_region(region)?;
        let core = self.lock().await;
        let (hold, region_wide) = match project {
            "-" => (
                core.holds()
                    .into_iter()
                    .find(|(r, p, _)| r == region && p.is_none())
                    .map(|(_, _, h)| h),
                true,
            ),
            p => match core.hold_of(region, p) {
                Some((h, wide)) => (Some(h.clone()), wide),
                None => (None, false),
            },
        };
        Ok(QueueView {
            project: project.to_string(),
            region: region.to_string(),
            held: hold.is_some(),
            held_since: hold.as_ref().map(|h| h.since),
            held_by: hold.map(|h| h.by),
            region_wide,
            queued_batches: match project {
                "-" => core.queued_in(region, None),
                p => core.queued_in(region, Some(p)),
            },
        })
    }

    /// A page of a region's queue in its order (project `-`: every
    /// project's batches; a project: its own, with their places in the
    /// region's order). `page_size`: 1 to 100 (more is lowered to 100;
    /// absent or 0: 50). The token is the place the next page starts at:
    /// the queue moves while one pages, so a page shows the order as it
    /// is when it is read.
    pub async fn queue_entries(
        &self,
        project: &str,
        region: &str,
        page_size: Option<&str>,
        page_token: Option<&str>,
    ) -> Result<QueueEntries, Error> {
        self.check_region(region)?;
        let take =
            super::batches::page_size_of(page_size, QUEUE_PAGE_SIZE, MAX_QUEUE_PAGE_SIZE)? as usize;
        // Bound to the queue it pages (a list's token has another fingerprint).
        let fingerprint = "\0queue";
        let skip = match page_token {
            None | Some("") => 0,
            Some(token) => {
                let at = super::batches::decode_token(token, project, region, fingerprint)?;
                usize::try_from(at).map_err(|_| {
                    Error::invalid_field(
                        "page_token",
                        format!("{} is not a page token of this queue", quote(token)),
                    )
                })?
            }
        };
        let scope = (project != "-").then_some(project);
        let now = Utc::now();
        let core = self.lock().await;
        let (total_size, page) = core.queue_page(region, scope, skip, take, now);
        let next = skip + take;
        let next_page_token = if next < total_size {
            super::batches::encode_token(next as i64, project, region, fingerprint)
        } else {
            String::new()
        };
        let entries = page
            .into_iter()
            .map(|(b, info)| QueueEntry {
                name: crate::api::BatchName::new(&b.project, &b.region, &b.batch_id).to_string(),
                project: b.project.clone(),
                queue_position: info.queue_position,
                priority: b.priority,
                shape: crate::scheduler::shape_text(&b.cluster),
                gpus: b.cluster.total_gpus(),
                accelerator: crate::scheduler::accelerator_label(&b.cluster).to_string(),
                queue_time: b.queued_at,
                allocation_deadline: b.deadline,
                estimated_start_time: info.estimated_start_time,
                not_admitted_reasons: info.reasons,
            })
            .collect();
        Ok(QueueEntries {
            entries,
            next_page_token,
            total_size,
        })
    }

    /// Every held queue.
    pub async fn held_queues(&self) -> Vec<QueueView> {
        let core = self.lock().await;
        core.holds()
            .into_iter()
            .map(|(region, project, h)| QueueView {
                queued_batches: core.queued_in(&region, project.as_deref()),
                region_wide: project.is_none(),
                project: project.unwrap_or_else(|| "-".into()),
                region,
                held: true,
                held_since: Some(h.since),
                held_by: Some(h.by),
            })
            .collect()
    }

    /// The gauges of the scheduler now, for a metrics scrape.
    pub async fn snapshot(&self) -> Snapshot {
        self.lock().await.snapshot(Utc::now())
    }

    /// Long polls waiting now, by kind (`flexq_long_polls{kind}`).
    pub fn long_polls(&self) -> Vec<(&'static str, usize)> {
        self.shared.long_polls.now()
    }

    /// Whether the last write found the database's disk full.
    pub fn store_full(&self) -> bool {
        self.shared.store.is_full()
    }

    /// Ready when the database answers: this replica, its role and, with
    /// several replicas, who leads; and whether the disk is full (then
    /// a small write is tried first, to see space come back).
    pub async fn readiness(&self) -> Result<Readiness, Error> {
        let mut ready = Readiness {
            replica: self.replica_id().to_string(),
            role: self.role(),
            database: self.shared.store.backend(),
            leader: None,
            config: self.config_status(),
            store_full: false,
        };
        // Space may have come back with no write since to see it.
        self.shared.store.probe_if_full().await;
        ready.store_full = self.shared.store.is_full();
        let checked = if self.replicated() {
            self.shared.store.lease_holder().await.map(|lease| {
                if lease.live && !lease.holder.is_empty() {
                    ready.leader = Some(lease.holder);
                }
            })
        } else {
            self.shared.store.ping().await
        };
        match checked {
            Ok(()) => Ok(ready),
            Err(e) => {
                tracing::warn!(error = %e, "not ready");
                Err(Error::new(
                    Code::Unavailable,
                    "NOT_READY",
                    "the database is not reachable",
                ))
            }
        }
    }
}
