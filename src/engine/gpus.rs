//! GPU telemetry from the agents (docs/rules.md#gpu-telemetry): a node's
//! agent uploads what the GPUs of its parts did ([`Engine::gpu_telemetry`],
//! fenced by the node's epoch like every call of an agent); each batch's
//! summary is kept with its run, and the metrics count utilization and
//! idle GPU-seconds per region and project.

use chrono::Utc;

use super::nodes::parse_epoch_str;
use super::{Engine, Error};
use crate::api::{BatchName, GpuChart, State, quote};
use crate::gpu::{IdlePolicy, IdleVerdict, MAX_POINTS, idle_verdict};
use crate::protocol::GpuTelemetry;
use crate::store::{GpuPointsTaken, StoreError};

/// Most batches one upload may name (a node holds few parts).
const MAX_BATCHES: usize = 256;

/// What an upload did.
#[derive(Debug, Clone, Default, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TelemetryTaken {
    /// Points taken (a retried upload's are taken once).
    pub taken: usize,
    /// The batches whose points were not taken, and why (the node holds
    /// no part of them now: they ended or moved).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
}

/// What an upload must be before anything of it is taken (pure; the
/// fuzz target `telemetry` runs it on any decoded body): an epoch, at most
/// `MAX_BATCHES` batches of at most `gpu::MAX_POINTS` points, each point's
/// fields in range. A malformed upload is refused whole, naming the field.
/// Answers the epoch, for the fencing check that follows.
pub fn check_telemetry(req: &GpuTelemetry) -> Result<u64, Error> {
    let epoch = parse_epoch_str(&req.epoch)?;
    if req.batches.len() > MAX_BATCHES {
        return Err(Error::invalid_field(
            "batches",
            format!(
                "{} batches; at most {MAX_BATCHES} are accepted",
                req.batches.len()
            ),
        ));
    }
    for (i, b) in req.batches.iter().enumerate() {
        if b.points.len() > MAX_POINTS {
            return Err(Error::invalid_field(
                &format!("batches[{i}].points"),
                format!(
                    "{} points; at most {MAX_POINTS} are accepted",
                    b.points.len()
                ),
            ));
        }
        for (j, p) in b.points.iter().enumerate() {
            p.check().map_err(|v| {
                Error::invalid_field(
                    &format!("batches[{i}].points[{j}].{}", v.field),
                    v.description,
                )
            })?;
        }
    }
    Ok(epoch)
}

impl Engine {
    /// Takes a node's GPU points. A malformed upload is refused whole,
    /// naming the field; a batch the node no longer holds is skipped and
    /// named in the answer.
    pub async fn gpu_telemetry(
        &self,
        node: &str,
        req: GpuTelemetry,
    ) -> Result<TelemetryTaken, Error> {
        let epoch = check_telemetry(&req)?;
        self.check_epoch_now(node, epoch).await?;
        let policy = self.config().gpu_idle.clone();
        let mut out = TelemetryTaken::default();
        for b in &req.batches {
            let added = self
                .shared
                .store
                .add_gpu_points(node, &b.uuid, &b.points, policy.below_percent)
                .await;
            match added {
                Ok(t) => {
                    crate::metrics::record_gpu_points(&t.region, &t.project, &t.taken);
                    out.taken += t.taken.len();
                    self.idle_policy(&policy, &t).await?;
                }
                Err(StoreError::FailedPrecondition(why)) => {
                    tracing::debug!(node, batch_uuid = %b.uuid, %why, "GPU points not taken");
                    out.refused.push(format!("{}: {why}", quote(&b.uuid)));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    /// A batch's GPU utilization over time, for its chart.
    pub async fn gpu_chart(&self, name: &BatchName) -> Result<GpuChart, Error> {
        let record = self.record(name).await?;
        Ok(self.shared.store.gpu_chart(record.seq).await?)
    }

    /// The GPU idle policy on a batch whose points were just taken: a
    /// warning in its history (once a run), or its cancel.
    async fn idle_policy(&self, policy: &IdlePolicy, t: &GpuPointsTaken) -> Result<(), Error> {
        let Some(started) = t.started.filter(|_| t.state == State::Running) else {
            return Ok(());
        };
        let now = Utc::now();
        let Some(verdict) = idle_verdict(policy, &t.usage, &t.gpu_nodes, started, now) else {
            return Ok(());
        };
        let applied = self.shared.store.gpu_idle(t.seq, &verdict, now).await?;
        if applied.outcome.steps.is_empty() {
            return Ok(());
        }
        self.record_lifecycle(&applied, None);
        match verdict {
            IdleVerdict::Warn(why) => {
                tracing::warn!(batch.id = %t.batch_id, batch.seq = t.seq, project = %t.project, %why, "GPU idle warning");
            }
            IdleVerdict::Cancel(why) => {
                tracing::warn!(batch.id = %t.batch_id, batch.seq = t.seq, project = %t.project, %why, "batch cancelled: its GPUs idle");
                // Its agents learn to stop it.
                self.work_changed();
            }
        }
        Ok(())
    }
}
