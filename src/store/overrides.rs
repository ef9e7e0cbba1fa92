//! What admins set, each announced to the other replicas: quota overrides,
//! queue holds (a region's or a project's queue) and node cordons.

use chrono::{DateTime, Utc};

use super::rows::{from_micros, micros};
use super::{Change, Store, StoreError};
use crate::spec::QuotaMetric;

impl Store {
    /// Admin quota overrides: (project, region, metric, limit).
    pub async fn quota_overrides(
        &self,
    ) -> Result<Vec<(String, String, QuotaMetric, u64)>, StoreError> {
        let rows: Vec<(String, String, String, i64)> =
            sqlx::query_as("select project, region, metric, quota_limit from quota_overrides")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(p, r, m, l)| Some((p, r, QuotaMetric::parse(&m)?, l.max(0) as u64)))
            .collect())
    }

    pub async fn set_quota_override(
        &self,
        project: &str,
        region: &str,
        metric: QuotaMetric,
        limit: u64,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "insert into quota_overrides (project, region, metric, quota_limit, updated_at) \
             values ($1, $2, $3, $4, $5) on conflict (project, region, metric) \
             do update set quota_limit = excluded.quota_limit, updated_at = excluded.updated_at",
        )
        .bind(project)
        .bind(region)
        .bind(metric.name())
        .bind(limit as i64)
        .bind(micros(now))
        .execute(&mut *tx)
        .await?;
        self.announce(&mut tx, &Change::Quota).await?;
        self.commit(tx).await?;
        Ok(())
    }
}

/// A queue an admin held: a region's (`project` None) or a project's in
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueHold {
    pub region: String,
    pub project: Option<String>,
    pub held_at: DateTime<Utc>,
    pub held_by: String,
}

impl Store {
    /// Every queue held now.
    pub async fn queue_holds(&self) -> Result<Vec<QueueHold>, StoreError> {
        let rows: Vec<(String, String, i64, String)> = sqlx::query_as(
            "select region, project, held_at, held_by from queue_holds order by region, project",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(region, project, at, by)| QueueHold {
                region,
                project: (!project.is_empty()).then_some(project),
                held_at: from_micros(at),
                held_by: by,
            })
            .collect())
    }

    /// Holds a queue (kept as it was when already held: the first hold's
    /// time and admin stand), or resumes it (`hold` None).
    pub async fn set_queue_hold(
        &self,
        region: &str,
        project: Option<&str>,
        hold: Option<(&str, DateTime<Utc>)>,
    ) -> Result<(), StoreError> {
        let project = project.unwrap_or_default();
        let mut tx = self.begin_write().await?;
        match hold {
            Some((by, at)) => {
                sqlx::query(
                    "insert into queue_holds (region, project, held_at, held_by) \
                     values ($1, $2, $3, $4) on conflict (region, project) do nothing",
                )
                .bind(region)
                .bind(project)
                .bind(micros(at))
                .bind(by)
                .execute(&mut *tx)
                .await?;
            }
            None => {
                sqlx::query("delete from queue_holds where region = $1 and project = $2")
                    .bind(region)
                    .bind(project)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        self.announce(&mut tx, &Change::Hold).await?;
        self.commit(tx).await?;
        Ok(())
    }
}

/// A node an admin cordoned (and, with `drain`, is draining).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCordon {
    pub node: String,
    pub since: DateTime<Utc>,
    pub by: String,
    pub drain: bool,
}

impl Store {
    pub async fn node_cordons(&self) -> Result<Vec<NodeCordon>, StoreError> {
        let rows: Vec<(String, i64, String, i64)> = sqlx::query_as(
            "select node_id, cordoned_at, cordoned_by, drain from node_cordons order by node_id",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(node, at, by, drain)| NodeCordon {
                node,
                since: from_micros(at),
                by,
                drain: drain != 0,
            })
            .collect())
    }

    /// Cordons a node (or marks it draining; a node already cordoned keeps
    /// its first time and admin), or uncordons it (`cordon` None).
    pub async fn set_node_cordon(
        &self,
        node: &str,
        cordon: Option<(&str, DateTime<Utc>, bool)>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        match cordon {
            Some((by, at, drain)) => {
                sqlx::query(
                    "insert into node_cordons (node_id, cordoned_at, cordoned_by, drain) \
                     values ($1, $2, $3, $4) on conflict (node_id) do update set drain = excluded.drain",
                )
                .bind(node)
                .bind(micros(at))
                .bind(by)
                .bind(i64::from(drain))
                .execute(&mut *tx)
                .await?;
            }
            None => {
                sqlx::query("delete from node_cordons where node_id = $1")
                    .bind(node)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        self.announce(&mut tx, &Change::Cordon).await?;
        self.commit(tx).await?;
        Ok(())
    }
}
