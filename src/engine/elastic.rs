//! Elastic batches' use cases (docs/rules.md#elastic-batches): what the
//! agents report of Spark's demand and of idle extras, and how a replica
//! follows another's writes. Grants and take-backs are the pass's
//! (`passes.rs`).

use chrono::{DateTime, Utc};

use super::nodes::check_epoch;
use super::{Engine, Error};
use crate::api::{BatchName, ExecutorChart, ExecutorPoint};
use crate::scheduler::{BatchKey, ExtraChange, NodeId};
use crate::store::{ExecutorSpan, StoreError};

/// The most executors a demand report may name (Spark's own bound on
/// `maxExecutors` is far above what a cluster holds; this refuses
/// nonsense).
const MOST_TARGET: u32 = 100_000;

/// The most points an executor chart answers (the latest).
const MOST_CHART_POINTS: usize = 1000;

impl Engine {
    /// Batch `name`'s executors over time, for its chart.
    pub async fn executor_chart(&self, name: &BatchName) -> Result<ExecutorChart, Error> {
        let record = self.record(name).await?;
        let spans = self.shared.store.executor_spans(record.seq).await?;
        Ok(executor_chart(&spans, MOST_CHART_POINTS))
    }

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

/// The executors held over time by parts `spans`: a point at each time
/// the count changes (parts allocated or given back at the same instant
/// make one change), the latest `most` of them.
pub(super) fn executor_chart(spans: &[ExecutorSpan], most: usize) -> ExecutorChart {
    // (when, executors added, extras added); a release sorts before an
    // allocation at the same instant, and both fold into one point.
    let mut steps: Vec<(DateTime<Utc>, i64, i64)> = Vec::with_capacity(spans.len() * 2);
    for s in spans {
        let extra = i64::from(s.extra);
        steps.push((s.allocated_at, 1, extra));
        if let Some(end) = s.released_at {
            steps.push((end, -1, -extra));
        }
    }
    steps.sort_by_key(|&(at, n, _)| (at, n));
    let (mut executors, mut extras) = (0i64, 0i64);
    let mut points: Vec<ExecutorPoint> = Vec::new();
    for (at, n, e) in steps {
        executors += n;
        extras += e;
        let point = ExecutorPoint {
            time: at,
            executors: u32::try_from(executors.max(0)).unwrap_or(u32::MAX),
            extras: u32::try_from(extras.max(0)).unwrap_or(u32::MAX),
        };
        match points.last_mut() {
            Some(last) if last.time == at => *last = point,
            _ => points.push(point),
        }
    }
    // A change undone at the same instant is no change.
    points.dedup_by(|b, a| (a.executors, a.extras) == (b.executors, b.extras));
    let skip = points.len().saturating_sub(most);
    ExecutorChart {
        points: points.split_off(skip),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("a time")
    }

    fn span(from: i64, to: Option<i64>, extra: bool) -> ExecutorSpan {
        ExecutorSpan {
            allocated_at: at(from),
            released_at: to.map(at),
            extra,
        }
    }

    fn counts(chart: &ExecutorChart) -> Vec<(i64, u32, u32)> {
        chart
            .points
            .iter()
            .map(|p| (p.time.timestamp() - 1_800_000_000, p.executors, p.extras))
            .collect()
    }

    #[test]
    fn the_chart_steps_at_each_grant_and_release_and_folds_one_instant() {
        let spans = [
            // The core: 2 executors from 0 to 100.
            span(0, Some(100), false),
            span(0, Some(100), false),
            // Extras: one from 10 to 40, one from 20 on, given back with
            // the cluster at 100; one given back at 40 as another came.
            span(10, Some(40), true),
            span(20, Some(100), true),
            span(40, Some(100), true),
        ];
        let chart = executor_chart(&spans, 1000);
        assert_eq!(
            counts(&chart),
            [(0, 2, 0), (10, 3, 1), (20, 4, 2), (100, 0, 0)],
            "the swap at 40 is no change"
        );
        // Only the latest points when there are more.
        assert_eq!(
            counts(&executor_chart(&spans, 2)),
            [(20, 4, 2), (100, 0, 0)]
        );
        // Still held: the last point is the count now.
        let held = [span(0, None, false), span(5, None, true)];
        assert_eq!(counts(&executor_chart(&held, 1000)), [(0, 1, 0), (5, 2, 1)]);
        assert!(executor_chart(&[], 1000).points.is_empty());
    }
}
