//! A region's capacity queue: its state and holds, and a page of it in
//! its order with each batch's place and estimated start.

use chrono::Utc;

use super::Principal;
use super::{Engine, Error};
use crate::api::quote;
use crate::scheduler::Hold;
use crate::store::QueueHold;

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
    /// The same reasons, each with its kind.
    pub not_admitted: Vec<crate::api::NotAdmittedReason>,
    /// Its placement alternatives, in order, as the batch's
    /// `flexq.alternatives` names them (`a100-40 after 15m`); absent
    /// without any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<String>,
    /// How many times it was preempted (absent: never); a preempted batch
    /// waits again at its place.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preemptions: Option<u32>,
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

/// Queue pages: 50 entries unless asked, never more than 100.
const QUEUE_PAGE_SIZE: u32 = 50;
/// Entries near the head each replay the queue ahead for their estimate
/// (about 0.5 ms at 100k queued) under the core's lock: a page stays small.
const MAX_QUEUE_PAGE_SIZE: u32 = 100;

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

impl Engine {
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
            super::paging::page_size_of(page_size, QUEUE_PAGE_SIZE, MAX_QUEUE_PAGE_SIZE)? as usize;
        // Bound to the queue it pages (a list's token has another fingerprint).
        let fingerprint = "\0queue";
        let skip = match page_token {
            None | Some("") => 0,
            Some(token) => {
                let at = super::paging::decode_token(token, project, region, fingerprint)?;
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
            super::paging::encode_token(next as i64, project, region, fingerprint)
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
                not_admitted: super::present::not_admitted(&info.reasons),
                not_admitted_reasons: crate::scheduler::messages(&info.reasons),
                alternatives: super::present::written(&b.alternatives),
                preemptions: (b.preemptions > 0).then_some(b.preemptions),
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
}
