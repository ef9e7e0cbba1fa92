//! Elastic batches' use cases (docs/rules.md#elastic-batches): what the
//! agents report of Spark's demand and of idle extras, and how a replica
//! follows another's writes. Grants and take-backs are the pass's
//! (`passes.rs`).

use chrono::Utc;

use super::nodes::check_epoch;
use super::{Engine, Error};
use crate::scheduler::{BatchKey, ExtraChange, NodeId};
use crate::store::StoreError;

/// The most executors a demand report may name (Spark's own bound on
/// `maxExecutors` is far above what a cluster holds; this refuses
/// nonsense).
const MOST_TARGET: u32 = 100_000;

impl Engine {
    /// The driver's node of elastic batch `uuid` reports that Spark
    /// targets `target` executors: extras beyond the core are wanted, and
    /// granted by the next pass as capacity allows.
    pub(super) async fn report_demand(
        &self,
        node: &str,
        epoch: u64,
        uuid: &str,
        target: u32,
    ) -> Result<(), Error> {
        if target > MOST_TARGET {
            return Err(Error::invalid_field(
                "targetExecutors",
                format!("{target} executors; at most {MOST_TARGET} are accepted"),
            ));
        }
        let (engine, node, uuid) = (self.clone(), node.to_string(), uuid.to_string());
        // Under the core's lock, in a task of its own (as any report): the
        // store and the core change together.
        tokio::spawn(async move {
            let mut core = engine.lock().await;
            check_epoch(&node, epoch, engine.current_epoch(&core, &node).await?)?;
            let seq = engine
                .bounded(engine.shared.store.driver_of(&node, &uuid))
                .await?;
            let key = BatchKey(seq);
            let Some(wanted) = core.extras_for_target(key, target) else {
                return Err(Error::from(StoreError::FailedPrecondition(format!(
                    "batch {uuid} is not a running elastic batch (spark.dynamicAllocation.enabled with room to grow): it takes no executor demand"
                ))));
            };
            engine
                .bounded(engine.shared.store.set_extras_wanted(&node, &uuid, wanted))
                .await?;
            let more = core.set_demand(key, wanted);
            crate::metrics::record_agent_report("EXECUTOR_DEMAND");
            tracing::debug!(batch.seq = seq, node, target, wanted, "executor demand reported");
            drop(core);
            if more {
                // Extras are granted after a pass.
                engine.wake();
            }
            Ok::<(), Error>(())
        })
        .await
        .map_err(Error::internal)?
    }

    /// The node of elastic batch `uuid`'s extra executor `index` reports
    /// its Spark worker idle: the extra goes back now.
    pub(super) async fn release_idle_extra(
        &self,
        node: &str,
        epoch: u64,
        uuid: &str,
        index: u32,
    ) -> Result<(), Error> {
        let (engine, node, uuid) = (self.clone(), node.to_string(), uuid.to_string());
        tokio::spawn(async move {
            let mut core = engine.lock().await;
            check_epoch(&node, epoch, engine.current_epoch(&core, &node).await?)?;
            let now = Utc::now();
            let extra = engine
                .bounded(
                    engine
                        .shared
                        .store
                        .release_idle_extra(&node, &uuid, index, now),
                )
                .await
                .map_err(|e| match e {
                    StoreError::NotFound => Error::not_found(
                        "extra executor",
                        &format!("{index} of batch {uuid} on node {node}"),
                    ),
                    other => other.into(),
                })?;
            crate::metrics::record_agent_report("EXTRA_IDLE");
            let key = BatchKey(extra.seq);
            let released =
                core.release_extra(key, &NodeId(node.clone()), &extra.placement.gpus, now);
            let region = core
                .allocation(key)
                .map(|a| (a.region.clone(), a.project.clone()));
            drop(core);
            if let (Some(change), Some((region, project))) = (&released, region) {
                log_extra(change, &region, &project, now);
            }
            // Its capacity may start a queued batch or another's extra.
            engine.wake();
            engine.work_changed();
            Ok::<(), Error>(())
        })
        .await
        .map_err(Error::internal)?
    }

    /// A replica changed batch `seq`'s extras or Spark's demand: this
    /// core follows the store. Read under the core's lock: every grant
    /// this core holds is then in what is read (a pass commits under the
    /// lock), so only what the store gave back goes.
    pub(super) async fn follow_extras(&self, seq: i64) -> Result<(), StoreError> {
        let mut core = self.lock().await;
        let (stored, wanted) = self.bounded(self.shared.store.extras_of(seq)).await?;
        let now = Utc::now();
        let key = BatchKey(seq);
        let changes = core.sync_extras(key, &stored, wanted, now);
        let owner = core
            .allocation(key)
            .map(|a| (a.region.clone(), a.project.clone()));
        drop(core);
        if let Some((region, project)) = owner {
            for c in &changes {
                log_extra(c, &region, &project, now);
            }
        }
        self.wake();
        self.work_changed();
        Ok(())
    }
}

/// Logs and counts a committed change to the extras of a batch of
/// `project` in `region`.
pub(super) fn log_extra(
    change: &ExtraChange,
    region: &str,
    project: &str,
    now: chrono::DateTime<Utc>,
) {
    let p = change.placement();
    tracing::info!(
        batch.id = %change.batch_id(),
        batch.seq = change.key().0,
        project,
        region,
        node = %p.node,
        gpus = p.gpus.len(),
        change = change.label(),
        "extra executor {}",
        change.label()
    );
    crate::metrics::record_extra(region, project, change, now);
}
