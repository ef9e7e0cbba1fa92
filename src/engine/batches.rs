//! The Batches and Operations use cases: create (with validate-only, the
//! per-project queue limit and never-fit), get, list, cancel, delete, and
//! the operation of a batch. Each answers the Dataproc resource (a
//! [`Batch`], an [`Operation`]) that every front end encodes: how a record
//! becomes one is `present.rs`, how a list is paged `paging.rs`.

use chrono::Utc;
use uuid::Uuid;

use super::Reason;
use super::present::{operation, to_batch, validate_verdict};
use super::{Engine, Error, Principal};
use crate::api::ValidateVerdict;
use crate::api::{
    AllocatedPart, Batch, BatchName, FlexqInfo, ListBatchesResponse, Operation, OperationName,
    State, quote,
};
use crate::scheduler::{BatchKey, PartRole, PendingBatch};
use crate::spec;
use crate::store::{BatchRecord, NewBatch, Provisioning, StoreError};

/// A create as a front end decoded it.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub project: String,
    pub region: String,
    pub batch: Batch,
    pub batch_id: Option<String>,
    pub request_id: Option<String>,
    /// Only say what would happen: allocated now, queued, failed, never.
    /// As the client sent it ("true", "false" or absent); a batch with
    /// violations is refused for them before this is read.
    pub validate_only: Option<String>,
}

/// What a create answers.
#[derive(Debug, Clone)]
pub enum CreateAnswer {
    /// The batch's operation (a new batch, or the one a repeated
    /// `requestId` created).
    Operation(Box<Operation>),
    /// With `validate_only`: the verdict, nothing stored.
    Verdict(Box<ValidateVerdict>),
}

/// A list as a front end decoded it; every field as the client sent it.
#[derive(Debug, Clone, Default)]
pub struct ListRequest {
    pub project: String,
    pub region: String,
    pub page_size: Option<String>,
    pub page_token: Option<String>,
    pub filter: Option<String>,
    pub order_by: Option<String>,
}

impl Engine {
    /// Creates a batch: validates it (every violation at once), refuses it
    /// when its project has too many queued or it can never fit, stores it
    /// durably and queues it. A repeated `requestId` answers the first
    /// create's batch.
    pub async fn create(
        &self,
        principal: &Principal,
        req: CreateRequest,
    ) -> Result<CreateAnswer, Error> {
        let CreateRequest {
            project,
            region,
            batch,
            batch_id,
            request_id,
            validate_only,
        } = req;
        let ids = spec::Identifiers {
            batch_id: batch_id.as_deref(),
            request_id: request_id.as_deref(),
        };
        let request = spec::validate_create(&batch, ids, &project, &region, &self.live().policy)?;
        let validate_only = parse_validate_only(validate_only.as_deref())?;
        if let Some(verdict) = self
            .admit_create(&batch, &request, &project, &region, validate_only)
            .await?
        {
            return Ok(CreateAnswer::Verdict(Box::new(verdict)));
        }
        let new = new_batch(
            principal, project, region, batch, batch_id, request_id, request,
        );
        let name = new.name.clone();
        // In a task of its own: a caller that goes away (a timeout, a
        // hang-up) must not stop between the commit and the queueing of
        // the batch, its log line and its count.
        let engine = self.clone();
        let task = tokio::spawn(async move { engine.store_and_queue(new).await });
        let created = task.await.map_err(Error::internal)?.map_err(|e| match e {
            StoreError::AlreadyExists(m) => {
                Error::new(Reason::AlreadyExists, m).with_meta("batch", name.to_string())
            }
            other => other.into(),
        })?;
        Ok(CreateAnswer::Operation(Box::new(operation(
            created.record(),
        ))))
    }

    /// Under the core's lock: with `validate_only`, the verdict to answer;
    /// otherwise refuses the batch when its project has too many queued or
    /// it can never fit anywhere, and answers `None` when it may be stored.
    async fn admit_create(
        &self,
        batch: &Batch,
        request: &spec::Request,
        project: &str,
        region: &str,
        validate_only: bool,
    ) -> Result<Option<ValidateVerdict>, Error> {
        let core = self.lock().await;
        if validate_only {
            return Ok(Some(
                self.validate_only(&core, batch, request, project, region),
            ));
        }
        let queued = core.pending_of(project);
        let max = self.config().limits.max_pending_per_project;
        if queued as u64 >= max {
            return Err(Error::new(Reason::TooManyPending,
                format!(
                    "project {project} has {queued} batches queued; limits.max_pending_per_project is {max}: wait for some to start or cancel some"
                ),
            )
            .with_meta("limit", "limits.max_pending_per_project"));
        }
        if let Some(reason) = core.never_fits_anywhere(project, region, request) {
            return Err(Error::new(
                Reason::NeverFits,
                format!("the batch can never be allocated: {reason}"),
            )
            .with_meta("reason", reason));
        }
        Ok(None)
    }

    /// Stores `new` durably and, when it is new rather than replayed by its
    /// `requestId`, logs it, counts it and queues it. Runs in a task of its
    /// own (see [`Engine::create`]).
    async fn store_and_queue(&self, new: NewBatch) -> Result<crate::store::Created, StoreError> {
        let created = self.shared.store.create(new).await?;
        match &created {
            crate::store::Created::Replayed(r) => {
                tracing::info!(batch.id = %r.name.batch_id, request_id = r.request_id.as_deref().unwrap_or(""), "create replayed by requestId");
            }
            crate::store::Created::New(r) => {
                tracing::info!(
                    batch.id = %r.name.batch_id, batch.uuid = %r.uuid, project = %r.name.project,
                    region = %r.name.region, state = "PENDING", "batch created"
                );
                crate::metrics::record_transition(State::Pending);
                self.submitted(PendingBatch {
                    key: BatchKey(r.seq),
                    batch_id: r.name.batch_id.clone(),
                    project: r.name.project.clone(),
                    region: r.name.region.clone(),
                    priority: r.priority,
                    queued_at: r.create_time,
                    deadline: r.deadline,
                    cluster: r.cluster.clone(),
                    alternatives: r.alternatives.clone(),
                    preemptions: 0,
                })
                .await;
            }
        }
        Ok(created)
    }

    /// What a validate-only create answers, under the core's lock: what
    /// would happen to `cluster` now and when it could start if queued,
    /// and the same for each of its alternatives; then the operator's alternatives that
    /// do not apply to it.
    fn validate_only(
        &self,
        core: &crate::scheduler::Scheduler,
        batch: &crate::api::Batch,
        request: &spec::Request,
        project: &str,
        region: &str,
    ) -> ValidateVerdict {
        let cluster = &request.cluster;
        let verdict = core.verdict(project, region, cluster);
        // When it could start if queued now, on its own placement
        // and on each alternative.
        let now = chrono::Utc::now();
        let probe = crate::scheduler::PendingBatch {
            key: crate::scheduler::BatchKey(i64::MAX),
            batch_id: String::new(),
            project: project.to_string(),
            region: region.to_string(),
            priority: spec::priority(&batch.labels),
            queued_at: now,
            deadline: cluster.deadline(now),
            cluster: cluster.clone(),
            alternatives: request.alternatives.clone(),
            preemptions: 0,
        };
        let (own_start, alternative_starts) = core.probe_starts(&probe, now);
        let alternatives: Vec<_> = request
            .alternatives
            .iter()
            .zip(alternative_starts)
            .map(|(r, start)| (r, core.verdict(project, &r.region, &r.cluster), start))
            .collect();
        // The operator's alternatives that do not apply, and why.
        let policy = &self.live().policy;
        let skipped = spec::alternatives::resolve(batch, cluster, project, region, policy)
            .map(|(_, s)| s)
            .unwrap_or_default();
        let preemption = matches!(verdict, crate::scheduler::Verdict::WouldQueue { .. })
            .then(|| core.preemption_reason(&probe, now))
            .flatten();
        let reclaim = core.reclaim_rule(project, region, cluster.accelerator());
        validate_verdict(
            &verdict,
            cluster,
            own_start,
            preemption,
            super::present::alternative_verdicts(&alternatives, &skipped, reclaim),
        )
    }

    /// A batch, with where it is in provisioning: its queue position,
    /// reasons and estimate while queued; its nodes once provisioned.
    pub async fn get(&self, name: &BatchName) -> Result<Batch, Error> {
        let record = self.record(name).await?;
        let mut batch = to_batch(&record);
        if let Some(info) = batch.flexq.as_mut() {
            self.describe_provisioning(&record, info).await?;
        }
        Ok(batch)
    }

    /// The costly part of the extension, for a single batch: queue position,
    /// reasons and estimate while queued; the nodes once provisioned.
    async fn describe_provisioning(
        &self,
        record: &BatchRecord,
        info: &mut FlexqInfo,
    ) -> Result<(), Error> {
        match record.provisioning {
            Provisioning::Queued if record.state == State::Pending => {
                if let Some(p) = self
                    .lock()
                    .await
                    .pending_info(BatchKey(record.seq), chrono::Utc::now())
                {
                    info.queue_position = Some(p.queue_position);
                    info.not_admitted = super::present::not_admitted(&p.reasons);
                    info.not_admitted_reasons = crate::scheduler::messages(&p.reasons);
                    info.estimated_start_time = p.estimated_start_time;
                }
            }
            Provisioning::Provisioned | Provisioning::Released => {
                let placements = self.shared.store.placements(record.seq).await?;
                let core = self.lock().await;
                info.elastic =
                    core.elastic_view(BatchKey(record.seq))
                        .map(|v| crate::api::ElasticInfo {
                            core: v.core,
                            extras: crate::api::ExtrasInfo {
                                running: v.extras,
                                wanted: v.wanted,
                                max: v.max,
                                blocked_by: v.blocked_by.map(str::to_string),
                            },
                        });
                let mut executors = 0..;
                info.nodes = placements
                    .into_iter()
                    .map(|p| AllocatedPart {
                        index: (p.role == PartRole::Executor)
                            .then(|| executors.next().unwrap_or_default()),
                        is_virtual: core.is_virtual(&p.node),
                        node: p.node.0,
                        role: p.role.name().into(),
                        gpus: p.gpus,
                        cores: p.cores,
                        memory_mb: p.memory_mb,
                        local_ssd_gb: p.local_ssd_gb,
                    })
                    .collect();
            }
            _ => {}
        }
        Ok(())
    }

    /// A page of a region's batches, newest first.
    pub async fn list(&self, req: ListRequest) -> Result<ListBatchesResponse, Error> {
        let (records, next_page_token) = self.page(req).await?;
        Ok(ListBatchesResponse {
            batches: records.iter().map(to_batch).collect(),
            next_page_token,
            unreachable: Vec::new(),
        })
    }

    /// A page of a region's operations, newest first: the operations of
    /// the batches [`Self::list`] would answer (same page size, filter over
    /// the batches' fields, and tokens).
    pub async fn list_operations(
        &self,
        req: ListRequest,
    ) -> Result<(Vec<Operation>, String), Error> {
        let (records, next) = self.page(req).await?;
        Ok((records.iter().map(operation).collect(), next))
    }

    /// The operation of a batch once it is done, or as it is at `until` or
    /// when the server shuts down. Wakes on every change of some batch's
    /// work, and at least every second (a deadline's expiry announces
    /// nothing).
    pub async fn wait_operation(
        &self,
        name: &OperationName,
        until: tokio::time::Instant,
    ) -> Result<Operation, Error> {
        // Any batch's change wakes the waiter; it reads its own again at
        // most every REREAD, so many waiters under a busy queue cost a
        // bounded number of reads.
        const REREAD: std::time::Duration = std::time::Duration::from_millis(250);
        let mut changes = self.watch_work();
        let shutdown = &self.shared.shutdown;
        let mut waiting = None;
        loop {
            let read_at = tokio::time::Instant::now();
            let op = self.get_operation(name).await?;
            if op.done || read_at >= until || shutdown.is_cancelled() {
                return Ok(op);
            }
            waiting.get_or_insert_with(|| {
                self.shared
                    .long_polls
                    .waiting(super::long_poll::Kind::Operation)
            });
            let tick = (read_at + std::time::Duration::from_secs(1)).min(until);
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep_until(tick) => {}
                _ = shutdown.cancelled() => {}
            }
            let next = (read_at + REREAD).min(until);
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = shutdown.cancelled() => {}
            }
        }
    }

    /// An operation is the view of its batch and goes with it: deleting one
    /// is NOT_FOUND when there is none, else UNIMPLEMENTED saying to delete
    /// the batch (the google.longrunning DeleteOperation of gRPC).
    pub async fn delete_operation(&self, name: &OperationName) -> Result<(), Error> {
        self.get_operation(name).await?;
        Err(Error::new(
            Reason::OperationIsTheBatch,
            format!(
                "{name} is the operation of a batch and goes with it: delete the batch (DeleteBatch) once it ended"
            ),
        ))
    }

    /// Batch `name`'s stored record; NOT_FOUND naming it where there is
    /// none.
    pub(super) async fn record(&self, name: &BatchName) -> Result<BatchRecord, Error> {
        self.shared
            .store
            .get(name)
            .await
            .map_err(|e| not_found_as(e, "batch", &name.to_string()))
    }

    /// Deletes a batch that ended.
    pub async fn delete(&self, name: &BatchName) -> Result<(), Error> {
        self.shared
            .store
            .delete(name)
            .await
            .map_err(|e| not_found_as(e, "batch", &name.to_string()))?;
        tracing::info!(batch.id = %name.batch_id, project = %name.project, region = %name.region, "batch deleted");
        Ok(())
    }

    /// The operation of a batch.
    pub async fn get_operation(&self, name: &OperationName) -> Result<Operation, Error> {
        let record = self
            .shared
            .store
            .get_by_operation(&name.project, &name.region, &name.operation_id)
            .await
            .map_err(|e| not_found_as(e, "operation", &name.to_string()))?;
        Ok(operation(&record))
    }

    /// Cancels the batch of an operation
    /// ([`crate::scheduler::lifecycle::cancel`]). Runs to its end in a
    /// task of its own: a caller that goes away (a timeout, a hang-up)
    /// must not stop it between the commit and the release of the capacity
    /// in memory.
    pub async fn cancel(&self, name: &OperationName) -> Result<(), Error> {
        let engine = self.clone();
        let name = name.clone();
        let task = tokio::spawn(async move {
            let now = Utc::now();
            let applied = engine
                .shared
                .store
                .cancel(&name.project, &name.region, &name.operation_id, now)
                .await
                .map_err(|e| not_found_as(e, "operation", &name.to_string()))?;
            engine.record_lifecycle(&applied, None);
            tracing::info!(batch.id = %applied.batch_id, state = %applied.state, "batch cancel requested");
            if applied.outcome.ended().is_some() {
                engine.forget(BatchKey(applied.seq), now).await;
            }
            // The agents of its nodes stop the work (or drop a cluster that
            // was released before it started).
            engine.work_changed();
            Ok::<_, Error>(())
        });
        task.await.map_err(Error::internal)?
    }
}

pub(super) fn not_found_as(e: StoreError, what: &str, name: &str) -> Error {
    match e {
        StoreError::NotFound => Error::not_found(what, name),
        other => other.into(),
    }
}

/// A request's `validateOnly`: absent is false.
pub(super) fn parse_validate_only(text: Option<&str>) -> Result<bool, Error> {
    match text {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(Error::invalid_field(
            "validate_only",
            format!("{} is not a boolean; accepted: true, false", quote(other)),
        )),
    }
}

/// The row a create stores for a validated batch: its ids (a generated
/// batch id when the client gave none), its first state message and its
/// priority.
fn new_batch(
    principal: &Principal,
    project: String,
    region: String,
    batch: Batch,
    batch_id: Option<String>,
    request_id: Option<String>,
    request: spec::Request,
) -> NewBatch {
    // Version 7 uuids grow with time: new rows land at the right edge
    // of every index instead of dirtying a random page each, which
    // keeps group commits small (see BENCHMARKS.md).
    let uuid = Uuid::now_v7();
    let spec::Request {
        cluster,
        alternatives,
    } = request;
    let batch_id = batch_id.unwrap_or_else(|| Uuid::now_v7().to_string());
    let mut state_message = match cluster.mode {
        spec::ProvisioningMode::Queue => format!(
            "Queued: waiting up to {}s for quota and capacity for the whole cluster ({} GPUs).",
            cluster.allocation_timeout_s,
            cluster.total_gpus()
        ),
        spec::ProvisioningMode::Default => "Queued for allocation.".to_string(),
    };
    if let Some(note) = cluster.dynamic_allocation_note() {
        state_message = format!("{state_message} {note}.");
    }
    let priority = spec::priority(&batch.labels);
    let name = BatchName::new(&project, &region, &batch_id);
    NewBatch {
        name,
        uuid,
        operation_id: Uuid::now_v7(),
        request_id,
        creator: principal.name.clone(),
        spec: batch.into_user_spec(),
        cluster,
        alternatives,
        priority,
        state_message,
    }
}
