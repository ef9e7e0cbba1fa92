//! Running work: what each node's agent must run (its parts of allocated
//! batches), the driver's output, and what the parts' GPUs did. What agents report back is a
//! lifecycle decision ([`super::lifecycle`]).

use sqlx::Row;

use super::rows::{run_info, set_run_info};
use super::{BatchRecord, Change, Store, StoreError};
use crate::scheduler::PartRole;

/// One part of an allocated batch on a node: what its agent runs.
#[derive(Debug, Clone)]
pub struct NodePart {
    pub batch: BatchRecord,
    pub role: PartRole,
    /// Executors are numbered 0.. within their batch, in allocation order;
    /// 0 for the driver.
    pub index: u32,
    /// An elastic batch's extra executor (docs/rules.md#elastic-batches).
    pub extra: bool,
    pub gpus: Vec<String>,
    pub cores: u32,
    pub memory_mb: u64,
    pub local_ssd_gb: u64,
}

/// A slice of a batch's driver output.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputChunk {
    pub data: Vec<u8>,
    pub next_offset: u64,
    /// Bytes stored in all.
    pub total: u64,
}

/// Points a node's agent sent for one batch, as taken.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuPointsTaken {
    pub seq: i64,
    pub batch_id: String,
    pub project: String,
    pub region: String,
    /// The points new to the batch (a retried upload's are taken once).
    pub taken: Vec<crate::gpu::GpuPoint>,
    /// The batch's summary with them, its state, and when its driver
    /// started (for the idle policy).
    pub usage: crate::gpu::GpuUsage,
    pub state: crate::api::State,
    pub started: Option<chrono::DateTime<chrono::Utc>>,
    /// The nodes holding GPUs of the batch now: the idle policy counts
    /// only the time every one of them has reported.
    pub gpu_nodes: Vec<String>,
}

/// Deletes what batch `seq`'s run stored beside it: its driver's output
/// and its GPU chart (a requeue starts them afresh; a delete removes the
/// batch).
pub(super) async fn forget_run(conn: &mut sqlx::AnyConnection, seq: i64) -> Result<(), StoreError> {
    for sql in [
        "delete from batch_output where batch_seq = $1",
        "delete from gpu_series where batch_seq = $1",
    ] {
        sqlx::query(sql).bind(seq).execute(&mut *conn).await?;
    }
    Ok(())
}

/// The batch `uuid` whose driver `node` runs now: only that node's agent
/// may upload its output or say what of it ran on the CPU.
pub(super) async fn driver_seq(
    conn: &mut sqlx::AnyConnection,
    node: &str,
    uuid: &str,
) -> Result<i64, StoreError> {
    sqlx::query_scalar(
        "select b.seq from batches b join allocations a on a.batch_seq = b.seq \
         where b.uuid = $1 and a.node_id = $2 and a.role = 'driver' and a.released_at is null",
    )
    .bind(uuid)
    .bind(node)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| {
        StoreError::FailedPrecondition(format!(
            "node {node} does not run the driver of batch {uuid} now"
        ))
    })
}

impl Store {
    /// Records what of batch `uuid` ran on the CPU, as the agent of the
    /// node that runs its driver reports.
    pub async fn set_cpu_fallback(
        &self,
        node: &str,
        uuid: &str,
        fallback: &crate::api::CpuFallback,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let seq = driver_seq(&mut tx, node, uuid).await?;
        let mut run = run_info(&mut tx, seq).await?;
        run.cpu_fallback = Some(fallback.clone());
        set_run_info(&mut tx, seq, &run).await?;
        self.commit(tx).await?;
        Ok(())
    }

    /// Adds `node`'s GPU points for batch `uuid` to its run's summary, in
    /// one transaction. Only a node that holds a part of the batch now
    /// may. `busy_from`: the idle policy's threshold (percent).
    pub async fn add_gpu_points(
        &self,
        node: &str,
        uuid: &str,
        points: &[crate::gpu::GpuPoint],
        busy_from: f64,
    ) -> Result<GpuPointsTaken, StoreError> {
        let mut tx = self.begin_write().await?;
        let row: Option<(i64, String, String, String, i64)> = sqlx::query_as(
            "select b.seq, b.batch_id, b.project, b.region, b.state from batches b \
             join allocations a on a.batch_seq = b.seq \
             where b.uuid = $1 and a.node_id = $2 and a.released_at is null limit 1",
        )
        .bind(uuid)
        .bind(node)
        .fetch_optional(&mut *tx)
        .await?;
        let (seq, batch_id, project, region, state) = row.ok_or_else(|| {
            StoreError::FailedPrecondition(format!("node {node} holds no part of batch {uuid} now"))
        })?;
        let mut run = run_info(&mut tx, seq).await?;
        let usage = run.gpu.get_or_insert_default();
        let taken: Vec<_> = points
            .iter()
            .filter(|p| usage.add_from(node, p, busy_from))
            .cloned()
            .collect();
        let usage = usage.clone();
        if !taken.is_empty() {
            set_run_info(&mut tx, seq, &run).await?;
            let mut series = gpu_series(&mut tx, seq).await?;
            for p in &taken {
                series.add(p);
            }
            let json = serde_json::to_string(&series)
                .map_err(|e| StoreError::Unavailable(format!("cannot encode a GPU series: {e}")))?;
            sqlx::query(
                "insert into gpu_series (batch_seq, series) values ($1, $2) \
                 on conflict (batch_seq) do update set series = excluded.series",
            )
            .bind(seq)
            .bind(json)
            .execute(&mut *tx)
            .await?;
        }
        // A part without GPUs (a CPU driver's) never sends points: it
        // must not hold the idle policy back.
        let gpu_nodes: Vec<String> = sqlx::query_scalar(
            "select distinct node_id from allocations \
             where batch_seq = $1 and released_at is null and gpus <> '[]'",
        )
        .bind(seq)
        .fetch_all(&mut *tx)
        .await?;
        self.commit(tx).await?;
        Ok(GpuPointsTaken {
            seq,
            batch_id,
            project,
            region,
            taken,
            usage,
            state: crate::api::State::from_number(state)
                .unwrap_or(crate::api::State::StateUnspecified),
            started: run.start_time,
            gpu_nodes,
        })
    }

    /// Every part of a batch that `node` holds now, with its batch.
    pub async fn node_parts(&self, node: &str) -> Result<Vec<NodePart>, StoreError> {
        let rows = sqlx::query(
            "select a.batch_seq, a.role, a.gpus, a.cores, a.memory_mb, a.local_ssd_gb, a.extra, \
               (select count(*) from allocations e where e.batch_seq = a.batch_seq \
                  and e.role = 'executor' and e.id < a.id) as idx \
             from allocations a where a.node_id = $1 and a.released_at is null order by a.id",
        )
        .bind(node)
        .fetch_all(&self.pool)
        .await?;
        let mut parts = Vec::with_capacity(rows.len());
        // A node often holds several parts of one batch: read each once.
        let mut batches: std::collections::HashMap<i64, BatchRecord> = Default::default();
        for row in rows {
            let seq: i64 = row.try_get("batch_seq")?;
            let batch = match batches.get(&seq) {
                Some(b) => b.clone(),
                None => {
                    let b = self.get_by_seq(seq).await?;
                    batches.insert(seq, b.clone());
                    b
                }
            };
            let role = match row.try_get::<&str, _>("role")? {
                "driver" => PartRole::Driver,
                _ => PartRole::Executor,
            };
            let gpus: &str = row.try_get("gpus")?;
            parts.push(NodePart {
                batch,
                role,
                index: if role == PartRole::Driver {
                    0
                } else {
                    row.try_get::<i64, _>("idx")?.max(0) as u32
                },
                extra: row.try_get::<i64, _>("extra")? != 0,
                gpus: serde_json::from_str(gpus).map_err(|e| {
                    StoreError::Unavailable(format!("stored allocation cannot be read: {e}"))
                })?,
                cores: row.try_get::<i64, _>("cores")?.max(0) as u32,
                memory_mb: row.try_get::<i64, _>("memory_mb")?.max(0) as u64,
                local_ssd_gb: row.try_get::<i64, _>("local_ssd_gb")?.max(0) as u64,
            });
        }
        Ok(parts)
    }

    /// Appends driver output of batch `uuid` at `offset`, from the node
    /// that runs its driver. A retried chunk already stored is accepted
    /// again; past `max_bytes` output is dropped and the run says so.
    /// Returns the offset the next chunk starts at.
    pub async fn append_output(
        &self,
        node: &str,
        uuid: &str,
        offset: u64,
        data: &[u8],
        max_bytes: u64,
    ) -> Result<u64, StoreError> {
        let mut tx = self.begin_write().await?;
        let seq = driver_seq(&mut tx, node, uuid).await?;
        // The run keeps the stored size: no scan of the chunks per upload.
        let mut run = run_info(&mut tx, seq).await?;
        let stored = run.output_bytes;
        let end = offset + data.len() as u64;
        if run.output_truncated {
            return Ok(end);
        }
        if offset > stored {
            return Err(StoreError::FailedPrecondition(format!(
                "output offset {offset} leaves a gap: {stored} bytes are stored"
            )));
        }
        if end <= stored {
            return Ok(stored);
        }
        // Only the part not yet stored (a retry may overlap).
        let new = &data[(stored - offset) as usize..];
        let room = max_bytes.saturating_sub(stored) as usize;
        let keep = &new[..new.len().min(room)];
        if !keep.is_empty() {
            sqlx::query(
                "insert into batch_output (batch_seq, byte_offset, data) values ($1, $2, $3)",
            )
            .bind(seq)
            .bind(stored as i64)
            .bind(keep)
            .execute(&mut *tx)
            .await?;
        }
        run.output_bytes = stored + keep.len() as u64;
        if keep.len() < new.len() {
            run.output_truncated = true;
        }
        set_run_info(&mut tx, seq, &run).await?;
        self.announce(&mut tx, &Change::Output { seq }).await?;
        self.commit(tx).await?;
        Ok(end)
    }

    /// Batch `seq`'s GPU utilization over time, for its chart (empty
    /// before its run's first point).
    pub async fn gpu_chart(&self, seq: i64) -> Result<crate::api::GpuChart, StoreError> {
        let mut conn = self.pool.acquire().await?;
        Ok(gpu_series(&mut conn, seq).await?.chart())
    }

    /// Up to `max` bytes of a batch's driver output from `offset`.
    pub async fn read_output(
        &self,
        seq: i64,
        offset: u64,
        max: usize,
    ) -> Result<OutputChunk, StoreError> {
        let rows = sqlx::query(
            "select byte_offset, data from batch_output \
             where batch_seq = $1 and byte_offset + length(data) > $2 and byte_offset < $3 \
             order by byte_offset",
        )
        .bind(seq)
        .bind(offset as i64)
        .bind((offset + max as u64) as i64)
        .fetch_all(&self.pool)
        .await?;
        let total: i64 = sqlx::query_scalar(
            "select coalesce(max(byte_offset + length(data)), 0) from batch_output where batch_seq = $1",
        )
        .bind(seq)
        .fetch_one(&self.pool)
        .await?;
        let mut data = Vec::new();
        for row in rows {
            let start: i64 = row.try_get("byte_offset")?;
            let chunk: &[u8] = row.try_get("data")?;
            let skip = (offset as i64 - start).max(0) as usize;
            let room = max - data.len();
            let piece = &chunk[skip.min(chunk.len())..];
            data.extend_from_slice(&piece[..piece.len().min(room)]);
            if data.len() == max {
                break;
            }
        }
        Ok(OutputChunk {
            next_offset: offset + data.len() as u64,
            data,
            total: total.max(0) as u64,
        })
    }
}

/// Batch `seq`'s stored GPU series (empty when it has none, or one this
/// build cannot read: the chart then starts afresh).
async fn gpu_series(
    conn: &mut sqlx::AnyConnection,
    seq: i64,
) -> Result<crate::gpu::GpuSeries, StoreError> {
    let json: Option<String> =
        sqlx::query_scalar("select series from gpu_series where batch_seq = $1")
            .bind(seq)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(json
        .and_then(|j| serde_json::from_str(&j).ok())
        .unwrap_or_default())
}
