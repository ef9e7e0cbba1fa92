//! The scheduler's use of the store: reading back its state after a
//! restart, and committing its decisions — every node, the quota usage and
//! the batch's change of state of one decision in one transaction.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use sqlx::{AnyConnection, Row};

use super::sql::Sql;

use super::lifecycle::write_steps;
use super::rows::{
    append_history, decode_cluster, from_micros, micros, placement_of, still_queued,
};
use super::{Backend, Change, Provisioning, Store, StoreError};
use crate::api::{EndReason, RequeueReason, State};
use crate::scheduler::lifecycle;
use crate::scheduler::{Allocation, BatchKey, Decision, NodeId, PartRole, PendingBatch, Placement};
use crate::spec::Accelerator;

/// Queued batches read per statement (see [`Store::each_queued_batch`]).
const QUEUE_CHUNK: usize = 4096;

/// A queued batch as the database writes it in a chunk: seq, batch id,
/// project, region, priority, create time and deadline (unix µs), cluster,
/// preemptions.
#[derive(serde::Deserialize)]
struct QueuedRow(
    i64,
    String,
    String,
    String,
    i32,
    i64,
    Option<i64>,
    crate::spec::Request,
    u32,
);

/// Fences a lost node (new epoch) and fails every batch that held part
/// of it, releasing their clusters. Void (`false`) when the node is no
/// longer in registration `epoch`: it registered again meanwhile.
async fn lose_node(
    conn: &mut AnyConnection,
    node: &NodeId,
    epoch: Option<u64>,
    failed: &[BatchKey],
    message: &str,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let fenced = match epoch {
        Some(epoch) => sqlx::query(
            "update nodes set state = 1, epoch = epoch + 1 \
             where node_id = $1 and epoch = $2 and state = 0",
        )
        .bind(&node.0)
        .bind(epoch as i64),
        None => sqlx::query("update nodes set state = 1, epoch = epoch + 1 where node_id = $1")
            .bind(&node.0),
    }
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if epoch.is_some() && fenced == 0 {
        return Ok(false);
    }
    for key in failed {
        let state: Option<i64> = sqlx::query_scalar("select state from batches where seq = $1")
            .bind(key.0)
            .fetch_optional(&mut *conn)
            .await?;
        let state = state.and_then(State::from_number);
        let attempts = super::lifecycle::attempts(conn, key.0).await?;
        let outcome = lifecycle::node_lost(state, message, attempts);
        let from = state.unwrap_or(State::StateUnspecified);
        write_steps(conn, key.0, "", from, outcome, now).await?;
    }
    Ok(true)
}

impl Store {
    /// Every batch waiting in a queue with a seq in `seqs`, oldest first.
    pub async fn queued_batches(
        &self,
        seqs: impl std::ops::RangeBounds<i64>,
    ) -> Result<Vec<PendingBatch>, StoreError> {
        let mut out = Vec::new();
        self.each_queued_batch(seqs, |b| out.push(b)).await?;
        out.sort_by_key(|b| b.key);
        Ok(out)
    }

    /// Hands every batch waiting in a queue with a seq in `seqs` to `f`,
    /// in no set order; answers how many. Read in chunks of
    /// [`QUEUE_CHUNK`] batches, each chunk one row that the database builds
    /// as a JSON array: decoding rows one by one through the driver cost
    /// about 8 µs a row (the rows cross threads one at a time), most of a
    /// restart with 100k queued (BENCHMARKS.md, "Restart with 100k queued").
    pub async fn each_queued_batch(
        &self,
        seqs: impl std::ops::RangeBounds<i64>,
        mut f: impl FnMut(PendingBatch),
    ) -> Result<usize, StoreError> {
        use std::ops::Bound;
        let after = match seqs.start_bound() {
            Bound::Included(s) => s.saturating_sub(1),
            Bound::Excluded(s) => *s,
            Bound::Unbounded => i64::MIN,
        };
        let last = match seqs.end_bound() {
            Bound::Included(s) => *s,
            Bound::Excluded(s) => s.saturating_sub(1),
            Bound::Unbounded => i64::MAX,
        };
        let rows = "select seq, batch_id, project, region, priority, create_time, deadline, cluster, \
                    preemptions from batches where provisioning = 0 and state = 1 and seq > $1 and seq <= $2 \
                    order by seq limit $3";
        let query = match self.backend {
            Backend::Sqlite => format!(
                "select json_group_array(json_array(seq, batch_id, project, region, priority, \
                 create_time, deadline, json(cluster), preemptions)), max(seq), count(*) from ({rows})"
            ),
            Backend::Postgres => format!(
                "select coalesce(json_agg(json_build_array(seq, batch_id, project, region, \
                 priority, create_time, deadline, cluster::json, preemptions))::text, '[]'), max(seq), count(*) \
                 from ({rows}) q"
            ),
        };
        // The next chunk is read while this one is decoded.
        let fetch = |after: i64| {
            let (pool, query) = (self.pool.clone(), query.clone());
            tokio::spawn(async move {
                sqlx::query_as::<_, (String, Option<i64>, i64)>(&query)
                    .bind(after)
                    .bind(last)
                    .bind(QUEUE_CHUNK as i64)
                    .fetch_one(&pool)
                    .await
            })
        };
        let mut next = Some(fetch(after));
        let mut count = 0;
        while let Some(reading) = next.take() {
            let (chunk, max, n) = reading.await.map_err(|e| {
                StoreError::Unavailable(format!("reading the queue stopped: {e}"))
            })??;
            if let (Some(max), true) = (max, n as usize == QUEUE_CHUNK) {
                next = Some(fetch(max));
            }
            let chunk: Vec<QueuedRow> = serde_json::from_str(&chunk).map_err(|e| {
                StoreError::Unavailable(format!("queued batches cannot be read: {e}"))
            })?;
            count += chunk.len();
            for QueuedRow(
                seq,
                batch_id,
                project,
                region,
                priority,
                created,
                deadline,
                cluster,
                preemptions,
            ) in chunk
            {
                f(PendingBatch {
                    key: BatchKey(seq),
                    batch_id,
                    project,
                    region,
                    priority,
                    queued_at: from_micros(created),
                    deadline: deadline.map(from_micros),
                    cluster: cluster.cluster,
                    alternatives: cluster.alternatives,
                    preemptions,
                });
            }
        }
        Ok(count)
    }

    /// Victims of a preemption still stopping: (victim, preemptor).
    pub async fn stopping_victims(&self) -> Result<Vec<(BatchKey, BatchKey)>, StoreError> {
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "select seq, preempted_by from batches where preempted_by is not null \
             and provisioning = $1",
        )
        .bind(Provisioning::Provisioned as i64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(v, p)| (BatchKey(v), BatchKey(p)))
            .collect())
    }

    /// Every cluster holding capacity now.
    pub async fn active_allocations(&self) -> Result<Vec<Allocation>, StoreError> {
        let mut rows = sqlx::query(
            "select a.batch_seq, a.node_id, a.role, a.gpus, a.cores, a.memory_mb, a.local_ssd_gb, \
             a.allocated_at, a.accelerator, a.extra, b.batch_id, b.project, b.region, b.zone, b.cluster, \
             b.create_time, b.alternative, b.priority, b.preemptions, b.extras_wanted \
             from allocations a join batches b on b.seq = a.batch_seq \
             where a.released_at is null order by a.batch_seq, a.id",
        )
        .fetch(&self.pool);
        let mut out: BTreeMap<i64, Allocation> = BTreeMap::new();
        // The GPU types of a batch's driver and executors, for parts
        // stored before their type was (it is the held cluster's shape).
        let mut types: BTreeMap<i64, [Option<Accelerator>; 2]> = BTreeMap::new();
        while let Some(row) = rows.try_next().await? {
            let seq: i64 = row.try_get("batch_seq")?;
            let mut placement = placement_of(&row)?;
            let extra = row.try_get::<i64, _>("extra")? != 0;
            if let Some(a) = out.get_mut(&seq) {
                placement.accelerator = placement.accelerator.or_else(|| {
                    let [driver, executor] = types.get(&seq).copied().unwrap_or_default();
                    shape_type(&placement, driver, executor)
                });
                a.placements.push(placement);
                // Extras come after the core (rows in id order), each
                // granted at its row's time and drawing one executor's
                // quota.
                match a.elastic.as_mut() {
                    Some(g) if extra => {
                        g.granted.push(from_micros(row.try_get("allocated_at")?));
                        let more = g.quota.clone();
                        crate::spec::add_amounts(&mut a.quota, &more);
                    }
                    Some(g) => g.core = a.placements.len(),
                    None => {}
                }
                continue;
            }
            let stored = decode_cluster(row.try_get("cluster")?)?;
            let alternative = row
                .try_get::<Option<i64>, _>("alternative")?
                .and_then(|a| u32::try_from(a).ok())
                .unwrap_or(0);
            // On an alternative, the cluster, region and quota it holds are the
            // alternative's.
            let (cluster, alternative_region) = stored.on(alternative);
            let (driver, executor) = (cluster.driver.accelerator, cluster.executor.accelerator);
            types.insert(seq, [driver, executor]);
            placement.accelerator = placement
                .accelerator
                .or_else(|| shape_type(&placement, driver, executor));
            let home: String = row.try_get("region")?;
            let on_alternative = stored
                .alternatives
                .iter()
                .find(|a| a.index == alternative)
                .map(|a| {
                    crate::scheduler::OnAlternative::of(&home, &stored.cluster, a, String::new())
                });
            let region = alternative_region.map_or(home, str::to_string);
            let allocated_at = from_micros(row.try_get("allocated_at")?);
            out.insert(
                seq,
                Allocation {
                    key: BatchKey(seq),
                    batch_id: row.try_get("batch_id")?,
                    project: row.try_get("project")?,
                    region,
                    zone: row
                        .try_get::<Option<String>, _>("zone")?
                        .unwrap_or_default(),
                    placements: vec![placement],
                    quota: cluster.quota.clone(),
                    allocated_at,
                    expected_end: cluster.ends(allocated_at),
                    queued_at: from_micros(row.try_get("create_time")?),
                    accelerator: crate::scheduler::accelerator_label(cluster),
                    alternative: on_alternative,
                    priority: row.try_get::<i64, _>("priority")? as i32,
                    preemptible: stored.cluster.preemptible,
                    preemptions: u32::try_from(row.try_get::<i64, _>("preemptions")?).unwrap_or(0),
                    elastic: crate::scheduler::Growth::of(cluster, 1)
                        .map(|mut g| {
                            g.wanted = row
                                .try_get::<Option<i64>, _>("extras_wanted")
                                .ok()
                                .flatten()
                                .and_then(|w| u32::try_from(w).ok())
                                .unwrap_or(0)
                                .min(g.max);
                            g
                        })
                        .map(Box::new),
                },
            );
        }
        Ok(out.into_values().collect())
    }

    /// The parts of the batch's latest cluster (an earlier attempt's, given
    /// back after an infrastructure failure, are history): its core gang
    /// (active or not), then the extras it holds now.
    pub async fn placements(&self, seq: i64) -> Result<Vec<Placement>, StoreError> {
        let rows = sqlx::query(
            "select node_id, role, gpus, cores, memory_mb, local_ssd_gb, accelerator from allocations \
             where batch_seq = $1 and ((extra = 0 and allocated_at = \
               (select max(allocated_at) from allocations where batch_seq = $2 and extra = 0)) \
               or (extra = 1 and released_at is null)) \
             order by id",
        )
        .bind(seq)
        .bind(seq)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(placement_of).collect()
    }

    /// Commits a pass's decisions in one transaction. Each decision applies
    /// only if its batch is still queued (a cancel may have won the race);
    /// the answer says, per decision, whether it applied. With several
    /// replicas, `fence` is the leader's term: nothing is written unless
    /// that term still holds the lease.
    pub async fn commit_decisions(
        &self,
        decisions: &[Decision],
        now: DateTime<Utc>,
        fence: Option<i64>,
    ) -> Result<Vec<bool>, StoreError> {
        let (applied, _) = self.commit_pass(decisions, &[], now, fence).await?;
        Ok(applied)
    }

    /// Commits a pass's decisions and the changes to running clusters'
    /// extras that follow it (docs/rules.md#elastic-batches) in one
    /// transaction: an extra taken back and the allocation that uses its
    /// GPUs are written together. Answers, per decision and per change,
    /// whether it applied.
    pub async fn commit_pass(
        &self,
        decisions: &[Decision],
        extras: &[crate::scheduler::ExtraChange],
        now: DateTime<Utc>,
        fence: Option<i64>,
    ) -> Result<(Vec<bool>, Vec<bool>), StoreError> {
        let mut tx = self.begin_write().await?;
        Store::check_fence(&mut tx, fence).await?;
        let mut applied = vec![false; decisions.len()];
        let mut parts: Vec<(i64, &str, &Placement)> = Vec::new();
        // Expiries and rejections come in bursts (many deadlines at once):
        // they are written with a few multi-row statements, not two per
        // batch.
        let mut endings: Vec<(usize, i64, i64, &str, EndReason)> = Vec::new();
        // Allocations look for a set of new nodes of theirs only when
        // there is one.
        let sets_open = decisions.iter().any(|d| matches!(d, Decision::Allocate(_)))
            && super::provisioned::any_open(&mut tx).await?;
        for (i, d) in decisions.iter().enumerate() {
            match d {
                Decision::Provision(set) => {
                    applied[i] = super::provisioned::open_set(&mut tx, set, now).await?;
                }
                Decision::Suspend(s) => {
                    applied[i] = super::provisioned::suspend(&mut tx, s, now).await?;
                }
                Decision::Preempt(p) => applied[i] = preempt(&mut tx, p, now).await?,
                Decision::LoseNode {
                    node,
                    epoch,
                    failed,
                    message,
                    ..
                } => {
                    applied[i] = lose_node(&mut tx, node, *epoch, failed, message, now).await?;
                }
                Decision::Expire { key, message, .. } => {
                    endings.push((
                        i,
                        key.0,
                        Provisioning::Expired as i64,
                        message,
                        EndReason::Expired,
                    ));
                }
                Decision::Reject {
                    key,
                    message,
                    reason,
                    ..
                } => {
                    endings.push((i, key.0, Provisioning::Rejected as i64, message, *reason));
                }
                Decision::Allocate(a) => {
                    let done = allocate(&mut tx, a, now).await?;
                    applied[i] = done;
                    if done && sets_open {
                        super::provisioned::allocated(&mut tx, a.key.0, now).await?;
                    }
                    if done {
                        parts.extend(a.placements.iter().map(|p| (a.key.0, a.region.as_str(), p)));
                    }
                }
            }
        }
        self.write_endings(&mut tx, &endings, now, &mut applied)
            .await?;
        self.write_parts(&mut tx, &parts, now).await?;
        let extras = super::extras::write_extras(&mut tx, extras, now).await?;
        self.announce(&mut tx, &Change::Decided).await?;
        self.commit(tx).await?;
        Ok((applied, extras))
    }

    /// Fails the expired and rejected batches still queued, `endings` being
    /// (decision's index, seq, provisioning, message, end reason), with a
    /// few multi-row statements; marks in `applied` the decisions written.
    async fn write_endings(
        &self,
        conn: &mut AnyConnection,
        endings: &[(usize, i64, i64, &str, EndReason)],
        now: DateTime<Utc>,
        applied: &mut [bool],
    ) -> Result<(), StoreError> {
        for chunk in endings.chunks(1000) {
            let mut q = Sql::new(self.backend, "update batches set state = ");
            q.bind(State::Failed.number())
                .push(", state_time = ")
                .bind(micros(now))
                .push(
                    ", provisioning = v.column2, state_message = v.column3, end_reason = v.column4 from (",
                );
            q.values(chunk, |row, (_, seq, provisioning, message, reason)| {
                row.bind(*seq)
                    .bind(*provisioning)
                    .bind(*message)
                    .bind(reason.number());
            });
            q.push(
                ") as v where batches.seq = v.column1 and batches.state = 1 \
                 and batches.provisioning = 0 returning batches.seq",
            );
            let done: std::collections::HashSet<i64> = q
                .fetch_scalars::<i64, _>(&mut *conn)
                .await?
                .into_iter()
                .collect();
            let written: Vec<_> = chunk.iter().filter(|e| done.contains(&e.1)).collect();
            for e in &written {
                applied[e.0] = true;
            }
            if written.is_empty() {
                continue;
            }
            let mut h = Sql::new(
                self.backend,
                "insert into state_history (batch_seq, idx, state, message, start_time) \
                 select v.column1, (select coalesce(max(h.idx), -1) + 1 from state_history h \
                 where h.batch_seq = v.column1), ",
            );
            h.bind(State::Failed.number())
                .push(", v.column2, ")
                .bind(micros(now))
                .push(" from (");
            h.values(written, |row, (_, seq, _, message, _)| {
                row.bind(*seq).bind(*message);
            });
            h.push(") as v");
            h.execute(&mut *conn).await?;
        }
        Ok(())
    }

    /// Inserts the allocated parts, (seq, region, placement), with a few
    /// multi-row statements.
    async fn write_parts(
        &self,
        conn: &mut AnyConnection,
        parts: &[(i64, &str, &Placement)],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        for chunk in parts.chunks(2000) {
            let mut q = Sql::new(
                self.backend,
                "insert into allocations (batch_seq, node_id, role, gpus, cores, memory_mb, \
                 local_ssd_gb, allocated_at, region, accelerator) ",
            );
            q.values(chunk, |row, (seq, region, p)| {
                row.bind(*seq)
                    .bind(p.node.0.as_str())
                    .bind(p.role.name())
                    .bind(serde_json::to_string(&p.gpus).unwrap_or_else(|_| "[]".into()))
                    .bind(i64::from(p.cores))
                    .bind(p.memory_mb as i64)
                    .bind(p.local_ssd_gb as i64)
                    .bind(micros(now))
                    .bind(*region)
                    .bind(p.accelerator.map(|a| a.name()));
            });
            q.execute(&mut *conn).await?;
        }
        Ok(())
    }
}

/// Writes an allocation if its batch is still queued (false if not), and
/// says so in its history.
async fn allocate(
    conn: &mut AnyConnection,
    a: &Allocation,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let message = allocated_message(a);
    let done = sqlx::query(
        "update batches set provisioning = $1, zone = $2, allocate_time = $3, \
         state_message = $4, state_time = $5, alternative = $6 \
         where seq = $7 and state = 1 and provisioning = 0",
    )
    .bind(Provisioning::Provisioned as i64)
    .bind(&a.zone)
    .bind(micros(now))
    .bind(&message)
    .bind(micros(now))
    .bind(a.alternative.as_ref().map(|r| i64::from(r.index)))
    .bind(a.key.0)
    .execute(&mut *conn)
    .await?
    .rows_affected()
        == 1;
    if done {
        // Still PENDING to the public enum (the work has not
        // started); the allocation is in the history.
        append_history(conn, a.key.0, State::Pending, &message, now).await?;
    }
    Ok(done)
}

/// Writes a preemption, whole or not at all: the preemptor still queued
/// and every victim still holding its cluster and not already stopping,
/// else nothing (false). Each victim is marked stopping for the preemptor
/// (its agents stop it within the grace) and says so in its history, as
/// does the preemptor; a victim with no process to wait for (every part
/// on a virtual node) goes back to the queue at once.
async fn preempt(
    conn: &mut AnyConnection,
    p: &crate::scheduler::Preemption,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    if !still_queued(conn, p.preemptor.0).await? {
        return Ok(false);
    }
    let mut states = Vec::with_capacity(p.victims.len());
    for v in &p.victims {
        let state: Option<i64> = sqlx::query_scalar(
            "select state from batches where seq = $1 and provisioning = $2 \
             and preempted_by is null",
        )
        .bind(v.key.0)
        .bind(Provisioning::Provisioned as i64)
        .fetch_optional(&mut *conn)
        .await?;
        let Some(state) = state.and_then(State::from_number) else {
            return Ok(false);
        };
        states.push(state);
    }
    let grace = humantime::format_duration(p.grace).to_string();
    for (v, state) in p.victims.iter().zip(&states) {
        let reason = if v.cause.is_reclaim() {
            RequeueReason::Reclaimed
        } else {
            RequeueReason::Preempted
        };
        sqlx::query(
            "update batches set preempted_by = $1, stop_grace_s = $2, stop_reason = $3 where seq = $4",
        )
        .bind(p.preemptor.0)
        .bind(p.grace.as_secs() as i64)
        .bind(reason.number())
        .bind(v.key.0)
        .execute(&mut *conn)
        .await?;
        let message = match reason {
            RequeueReason::Reclaimed => format!(
                "RECLAIMED by {}'s batch {} {}: its processes get {grace} to stop, then it goes back to the queue at its place.",
                p.project, p.preemptor_id, v.cause
            ),
            _ => format!(
                "PREEMPTED by {} ({}): its processes get {grace} to stop, then it goes back to the queue at its place.",
                p.preemptor_id, v.cause
            ),
        };
        append_history(conn, v.key.0, *state, &message, now).await?;
        if v.at_once {
            let stopped = lifecycle::StoppedFor {
                by: &p.preemptor_id,
                reason,
            };
            let outcome = lifecycle::Outcome {
                steps: lifecycle::preempted(*state, stopped),
            };
            write_steps(conn, v.key.0, &v.batch_id, *state, outcome, now).await?;
        }
    }
    let names: Vec<&str> = p.victims.iter().map(|v| v.batch_id.as_str()).collect();
    let message = format!(
        "Preempting {} ({} GPUs) in {}: allocated once they have stopped.",
        names.join(", "),
        p.gpus(),
        p.zone
    );
    append_history(conn, p.preemptor.0, State::Pending, &message, now).await?;
    Ok(true)
}

/// A part's GPU type from its cluster's shape (for parts stored before
/// the type was): the driver's or the executors', when it holds GPUs.
fn shape_type(
    p: &Placement,
    driver: Option<Accelerator>,
    executor: Option<Accelerator>,
) -> Option<Accelerator> {
    if p.gpus.is_empty() {
        return None;
    }
    match p.role {
        PartRole::Driver => driver,
        PartRole::Executor => executor,
    }
}

/// "Allocated 1 driver and 8 executors (9 GPUs) on 3 nodes in us-central1-a."
fn allocated_message(a: &Allocation) -> String {
    let executors = a
        .placements
        .iter()
        .filter(|p| p.role == PartRole::Executor)
        .count();
    let gpus: usize = a.placements.iter().map(|p| p.gpus.len()).sum();
    let mut nodes: Vec<&str> = a.placements.iter().map(|p| p.node.0.as_str()).collect();
    nodes.sort();
    nodes.dedup();
    let alternative = match &a.alternative {
        None => String::new(),
        Some(r) => format!(
            " on alternative {}, {}{}, after {} min: {}",
            r.index,
            a.lender(),
            if r.loan.is_some() {
                " (on loan: its owners may take it back)"
            } else {
                ""
            },
            (a.allocated_at - a.queued_at).num_minutes(),
            r.note
        ),
    };
    format!(
        "Allocated{alternative}: the whole cluster (1 driver and {executors} executors, {gpus} GPUs) on {} node{} in {}; waiting for the agents to start it.",
        nodes.len(),
        if nodes.len() == 1 { "" } else { "s" },
        a.zone
    )
}
