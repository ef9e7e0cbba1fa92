//! What the usage report reads: the parts of clusters held in a region
//! over a window (from the `allocations` rows, which keep each part's
//! allocation and release time), and the batches created in it.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::rows::{decode_cluster, from_micros, micros};
use super::{Provisioning, Store, StoreError};
use crate::spec::{Accelerator, ClusterRequest};

/// One part of a cluster that was held in the window.
#[derive(Debug, Clone, PartialEq)]
pub struct UsedPart {
    pub project: String,
    /// The part's GPU type; None for a CPU part.
    pub accelerator: Option<Accelerator>,
    pub gpus: u64,
    pub local_ssd_gb: u64,
    pub allocated_at: DateTime<Utc>,
    /// None while still held.
    pub released_at: Option<DateTime<Utc>>,
    /// Given back because its batch was preempted: what it held is work
    /// lost.
    pub preempted: bool,
    /// Given back because its loan was reclaimed: work lost to reclaim.
    pub reclaimed: bool,
    /// An extra executor of an elastic batch, granted beyond its core gang.
    pub extra: bool,
}

/// A batch created in the window.
#[derive(Debug, Clone, PartialEq)]
pub struct CreatedBatch {
    pub project: String,
    pub cluster: ClusterRequest,
    pub create_time: DateTime<Utc>,
    pub allocate_time: Option<DateTime<Utc>>,
    pub provisioning: Provisioning,
}

/// The GPU type of a stored part: recorded with it, or, for a part stored
/// before the type was, read from its batch's cluster (`cluster`,
/// `alternative` and `role` in `row`) as held on its alternative. None for a
/// part without GPUs.
fn part_type(row: &sqlx::any::AnyRow, no_gpus: bool) -> Result<Option<Accelerator>, StoreError> {
    if no_gpus {
        return Ok(None);
    }
    if let Some(name) = row.try_get::<Option<String>, _>("accelerator")? {
        return Ok(Accelerator::parse(&name));
    }
    let Some(cluster) = row.try_get::<Option<String>, _>("cluster")? else {
        return Ok(None);
    };
    let stored = decode_cluster(&cluster)?;
    let alternative = row
        .try_get::<Option<i64>, _>("alternative")?
        .and_then(|a| u32::try_from(a).ok())
        .unwrap_or(0);
    let (held, _) = stored.on(alternative);
    let role: String = row.try_get("role")?;
    Ok(if role == "driver" {
        held.driver.accelerator
    } else {
        held.executor.accelerator
    })
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("stored GPU list cannot be read: {e}"))
}

impl Store {
    /// The parts held in `region` (of `project`, or of every project) at
    /// some time in [`start`, `end`), and the batches created in it.
    pub async fn usage(
        &self,
        region: &str,
        project: Option<&str>,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> Result<(Vec<UsedPart>, Vec<CreatedBatch>), StoreError> {
        let project = project.unwrap_or_default();
        let rows = sqlx::query(
            "select b.project, b.cluster, b.alternative, a.role, a.gpus, a.local_ssd_gb, a.accelerator, \
             a.allocated_at, a.released_at, a.preempted, a.extra \
             from allocations a join batches b on b.seq = a.batch_seq \
             where coalesce(a.region, b.region) = $1 and ($2 = '' or b.project = $3) \
             and a.allocated_at < $4 and (a.released_at is null or a.released_at > $5)",
        )
        .bind(region)
        .bind(project)
        .bind(project)
        .bind(micros(end))
        .bind(micros(start))
        .fetch_all(&self.pool)
        .await?;
        let mut held = Vec::with_capacity(rows.len());
        for row in rows {
            let gpus: Vec<String> = serde_json::from_str(row.try_get("gpus")?).map_err(corrupt)?;
            let lost: i64 = row.try_get("preempted")?;
            held.push(UsedPart {
                project: row.try_get("project")?,
                accelerator: part_type(&row, gpus.is_empty())?,
                gpus: gpus.len() as u64,
                local_ssd_gb: row.try_get::<i64, _>("local_ssd_gb")?.max(0) as u64,
                allocated_at: from_micros(row.try_get("allocated_at")?),
                released_at: row
                    .try_get::<Option<i64>, _>("released_at")?
                    .map(from_micros),
                preempted: lost == super::lifecycle::LOST_TO_PREEMPTION,
                reclaimed: lost == super::lifecycle::LOST_TO_RECLAIM,
                extra: row.try_get::<i64, _>("extra")? != 0,
            });
        }
        let rows = sqlx::query(
            "select project, cluster, create_time, allocate_time, provisioning from batches \
             where region = $1 and ($2 = '' or project = $3) and create_time >= $4 and create_time < $5",
        )
        .bind(region)
        .bind(project)
        .bind(project)
        .bind(micros(start))
        .bind(micros(end))
        .fetch_all(&self.pool)
        .await?;
        let mut created = Vec::with_capacity(rows.len());
        for row in rows {
            created.push(CreatedBatch {
                project: row.try_get("project")?,
                cluster: decode_cluster(row.try_get("cluster")?)?.cluster,
                create_time: from_micros(row.try_get("create_time")?),
                allocate_time: row
                    .try_get::<Option<i64>, _>("allocate_time")?
                    .map(from_micros),
                provisioning: Provisioning::from_number(row.try_get("provisioning")?),
            });
        }
        Ok((held, created))
    }

    /// The parts given back after `since`, in every region: what the
    /// fair-share order remembers of past usage when a core is built.
    pub async fn released_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<ReleasedPart>, StoreError> {
        let rows = sqlx::query(
            "select coalesce(a.region, b.region) as region, b.project, a.role, a.gpus, a.accelerator, \
             a.allocated_at, a.released_at, \
             case when a.accelerator is null then b.cluster end as cluster, \
             case when a.accelerator is null then b.alternative end as alternative \
             from allocations a join batches b on b.seq = a.batch_seq \
             where a.released_at is not null and a.released_at > $1",
        )
        .bind(micros(since))
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let gpus: Vec<String> = serde_json::from_str(row.try_get("gpus")?).map_err(corrupt)?;
            if gpus.is_empty() {
                continue;
            }
            out.push(ReleasedPart {
                region: row.try_get("region")?,
                project: row.try_get("project")?,
                accelerator: part_type(&row, false)?,
                gpus: gpus.len() as u64,
                allocated_at: from_micros(row.try_get("allocated_at")?),
                released_at: from_micros(row.try_get("released_at")?),
            });
        }
        Ok(out)
    }
}

/// A part of a cluster that was given back.
#[derive(Debug, Clone, PartialEq)]
pub struct ReleasedPart {
    /// Where it was held (a region alternative's region, not the batch's own).
    pub region: String,
    pub project: String,
    /// The type of its GPUs.
    pub accelerator: Option<Accelerator>,
    pub gpus: u64,
    pub allocated_at: DateTime<Utc>,
    pub released_at: DateTime<Utc>,
}
