//! The agents' use cases: node registration, heartbeats (leases), the
//! long poll for assignments and reports. The driver's output is
//! `output.rs`.
//!
//! A node joins the capacity when its agent registers it and stays while
//! the agent heartbeats within the lease. Registration answers a new epoch
//! (the fencing token); every later call of the agent carries it, and a
//! call with an older epoch is refused, so an agent that was replaced or
//! lost its lease cannot act for the node any more.

use chrono::{DateTime, Utc};

use super::Reason;
use super::long_poll::Kind;
use super::{Engine, Error, Principal};
use crate::api::{State, quote};
use crate::launch::SparkJob;
use crate::protocol::{
    Action, Assignment, Assignments, ClusterPart, Lease, Poll, RegisterNode, Report, ReportEvent,
};
use crate::scheduler::lifecycle::{self, AgentEvent, HeldPart};
use crate::scheduler::{BatchKey, NodeId, NodeLeaseError, NodeSpec, PartRole};
use crate::store::{Applied, Change, StoreError};

/// What registration answers: the node's lease.
pub type NodeRegistration = Lease;

impl Engine {
    /// Registers (or re-registers) an agent's node into its declared pool;
    /// work the node had started that the agent no longer runs fails
    /// ([`lifecycle::lost_on_restart`]).
    pub async fn register_node(
        &self,
        principal: &Principal,
        req: RegisterNode,
    ) -> Result<NodeRegistration, Error> {
        let config = self.config();
        let pool = declared_pool(&config, &req)?;
        check_offer(principal, &req, pool)?;
        let spec = NodeSpec {
            id: NodeId(req.node_id.clone()),
            region: req.region,
            zone: req.zone,
            pool: req.pool,
            accelerator: pool.accelerator,
            gpu_addresses: req.gpu_addresses,
            cores: req.cores,
            memory_mb: req.memory_mb,
            local_ssd_gb: req.local_ssd_gb,
            is_virtual: false,
        };
        let now = Utc::now();
        let expires =
            now + chrono::Duration::from_std(config.agents.lease_duration).unwrap_or_default();
        // Under the core's lock: a registration and a lease-expiry decision
        // never interleave.
        let mut core = self.lock().await;
        check_pool_room(&core, &spec, pool)?;
        let epoch = self
            .bounded(self.shared.store.register_node(&spec, now))
            .await?;
        tracing::info!(node = %spec.id, zone = %spec.zone, pool = %spec.pool, gpus = spec.gpu_addresses.len(), epoch, "node registered");
        let node = spec.id.0.clone();
        if !core.register_node(spec, epoch, expires) {
            tracing::warn!(
                node,
                "the node registered a shape smaller than what it holds; keeping its old shape"
            );
        }
        // An agent that restarted: the work its node had started and that it
        // no longer runs is lost with the old agent's processes.
        let parts = self.bounded(self.shared.store.node_parts(&node)).await?;
        let lost = self
            .fail_lost_work(&mut core, &node, &parts, &req.running, now)
            .await;
        drop(core);
        self.wake();
        self.work_changed();
        lost?;
        Ok(self.lease_answer(&node, epoch, expires))
    }

    /// Reports the node's parts that its restarted agent no longer runs
    /// (`running` lists what it does) as lost, and applies what that did
    /// to the core; stops at the first report the store refuses.
    async fn fail_lost_work(
        &self,
        core: &mut crate::scheduler::Scheduler,
        node: &str,
        parts: &[crate::store::NodePart],
        running: &[String],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let held: Vec<HeldPart<'_>> = parts
            .iter()
            .map(|p| HeldPart {
                uuid: &p.batch.uuid,
                state: p.batch.state,
                role: p.role,
                master_started: p.batch.master_url.is_some(),
            })
            .collect();
        for (uuid, event) in lifecycle::lost_on_restart(node, &held, running) {
            let applied = self
                .bounded(self.shared.store.report(node, &uuid, &event, now))
                .await?;
            crate::metrics::record_agent_report(event.name());
            self.record_lifecycle(&applied, Some(node));
            if applied.outcome.ended().is_some() {
                // At once: a later failure must not leave an ended
                // batch's capacity held in memory.
                self.count_released(core.forget(BatchKey(applied.seq), now).as_ref(), now);
                tracing::warn!(batch.id = %applied.batch_id, node, "batch failed: its agent restarted without it");
            } else if applied.requeued() {
                self.requeued(core, &applied, now).await;
                tracing::warn!(batch.id = %applied.batch_id, node, "batch requeued after an infrastructure failure: its agent restarted without it");
            }
        }
        Ok(())
    }

    fn lease_answer(&self, node: &str, epoch: u64, expires: DateTime<Utc>) -> Lease {
        let lease = self.config().agents.lease_duration;
        Lease {
            node_id: node.to_string(),
            // int64 travels as a string in proto3 JSON.
            epoch: epoch.to_string(),
            lease_duration: format!("{}s", lease.as_secs()),
            heartbeat_interval: format!("{}s", (lease.as_secs() / 3).max(1)),
            lease_expire_time: expires,
        }
    }

    /// The node's current epoch, from `core` (the caller holds its lock) or,
    /// with several replicas, from the database: this replica's core may not
    /// have heard of a registration on another one yet, and a zombie agent's
    /// old epoch must be refused wherever it calls.
    pub(super) async fn current_epoch(
        &self,
        core: &crate::scheduler::Scheduler,
        node: &str,
    ) -> Result<Option<u64>, Error> {
        if self.replicated() {
            Ok(self
                .bounded(self.shared.store.active_node(node))
                .await?
                .map(|(_, epoch)| epoch))
        } else {
            Ok(core.node_epoch(&NodeId(node.to_string())))
        }
    }

    /// [`check_epoch`] for a call that does not otherwise need the core.
    pub(super) async fn check_epoch_now(&self, node: &str, epoch: u64) -> Result<(), Error> {
        let current = self.current_epoch(&*self.lock().await, node).await?;
        check_epoch(node, epoch, current)
    }

    /// Renews a node's lease.
    pub async fn heartbeat(&self, node: &str, epoch: u64) -> Result<Lease, Error> {
        let expires = Utc::now()
            + chrono::Duration::from_std(self.config().agents.lease_duration).unwrap_or_default();
        if self.replicated() {
            // Checked against the database; the announcement renews the lease
            // in every replica's core, the leader's (and this one's) included.
            self.check_epoch_now(node, epoch).await?;
            self.shared
                .store
                .announce_now(&Change::Heartbeat {
                    epoch,
                    node: node.to_string(),
                })
                .await?;
        } else {
            self.lock()
                .await
                .heartbeat(&NodeId(node.to_string()), epoch, expires)
                .map_err(|e| lease_error(node, e))?;
        }
        Ok(self.lease_answer(node, epoch, expires))
    }

    /// The node's assignments now, and their version (a digest: equal
    /// versions, equal assignments).
    async fn assignments(&self, node: &str) -> Result<Assignments, Error> {
        let mut out = Vec::new();
        for part in self.shared.store.node_parts(node).await? {
            let b = part.batch;
            let action = match b.state {
                // Preempted: its processes stop within the grace.
                State::Pending | State::Running if b.preempted_by.is_some() => Action::Stop,
                State::Pending | State::Running => Action::Run,
                State::Cancelling => Action::Stop,
                // Ended: its cluster is being released.
                _ => continue,
            };
            let cluster = if part.role == PartRole::Driver {
                self.shared
                    .store
                    .placements(b.seq)
                    .await?
                    .into_iter()
                    .map(|p| ClusterPart {
                        node: p.node.0,
                        role: p.role.name().to_string(),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let job = (part.role == PartRole::Driver).then(|| {
                // On an alternative, Spark gets the alternative's batch and shape.
                let (spec, cluster) = crate::spec::alternatives::as_placed(
                    &b.spec,
                    &b.cluster,
                    &b.alternatives,
                    b.alternative,
                );
                SparkJob {
                    batch: b.name.to_string(),
                    uuid: b.uuid.clone(),
                    spec,
                    cluster,
                }
            });
            out.push(Assignment {
                batch: b.name.to_string(),
                uuid: b.uuid,
                role: part.role.name().to_string(),
                index: part.index,
                gpus: part.gpus,
                cores: part.cores,
                memory_mb: part.memory_mb,
                local_ssd_gb: part.local_ssd_gb,
                action,
                master_url: b.master_url,
                attempt: b.attempt,
                ttl_seconds: b.cluster.ttl_s,
                stop_grace_seconds: b.stop_grace_s,
                extra: part.extra,
                job,
                cluster,
            });
        }
        let digest = serde_json::to_vec(&out).map_err(Error::internal)?;
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&digest, &mut hasher);
        let version = format!("{:016x}", std::hash::Hasher::finish(&hasher));
        Ok(Assignments {
            version,
            assignments: out,
        })
    }

    /// Long poll: answers at once when the node's assignments differ from the
    /// version the agent has, else when they change, else after `waitFor`.
    pub async fn poll(&self, node: &str, req: Poll) -> Result<Assignments, Error> {
        let epoch = parse_epoch_str(&req.epoch)?;
        let longest = self
            .config()
            .server
            .request_timeout
            .saturating_sub(std::time::Duration::from_secs(5))
            .max(std::time::Duration::from_secs(1));
        let wait = match &req.wait_for {
            None => longest,
            Some(text) => wait_for(text)?.min(longest),
        };
        let deadline = tokio::time::Instant::now() + wait;
        let mut changes = self.watch_work();
        let mut waiting = None;
        loop {
            changes.borrow_and_update();
            self.check_epoch_now(node, epoch).await?;
            let now = self.assignments(node).await?;
            if now.version != req.version || tokio::time::Instant::now() >= deadline {
                return Ok(now);
            }
            waiting.get_or_insert_with(|| self.shared.long_polls.waiting(Kind::Assignments));
            tokio::select! {
                r = changes.changed() => if r.is_err() { return Ok(now) },
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// An agent's report about a batch ([`lifecycle::report`]).
    pub async fn report(&self, node: &str, req: Report) -> Result<(), Error> {
        let epoch = parse_epoch_str(&req.epoch)?;
        let event = match req.event {
            ReportEvent::MasterReady { master_url } => {
                if !master_url.starts_with("spark://") {
                    return Err(Error::invalid_field(
                        "masterUrl",
                        format!("{} is not a spark:// URL", quote(&master_url)),
                    ));
                }
                AgentEvent::MasterReady { url: master_url }
            }
            ReportEvent::DriverStarted { rapids } => AgentEvent::DriverStarted { rapids },
            ReportEvent::Finished {
                succeeded,
                message,
                exit_code,
            } => AgentEvent::Finished {
                succeeded,
                message,
                exit_code,
            },
            ReportEvent::PartFailed {
                message,
                infrastructure,
            } => AgentEvent::PartFailed {
                message,
                infrastructure,
            },
            ReportEvent::ExecutorDemand { target_executors } => {
                return self
                    .report_demand(node, epoch, &req.uuid, target_executors)
                    .await;
            }
            ReportEvent::ExtraIdle { index } => {
                return self.release_idle_extra(node, epoch, &req.uuid, index).await;
            }
            // No decision: recorded with the run.
            ReportEvent::CpuFallback { fallback } => {
                if fallback.reasons.len() > crate::launch::fallback::MAX_REASONS {
                    return Err(Error::invalid_field(
                        "fallback.reasons",
                        format!(
                            "{} reasons; at most {} are accepted",
                            fallback.reasons.len(),
                            crate::launch::fallback::MAX_REASONS
                        ),
                    ));
                }
                self.check_epoch_now(node, epoch).await?;
                self.shared
                    .store
                    .set_cpu_fallback(node, &req.uuid, &fallback)
                    .await?;
                tracing::info!(node, batch_uuid = %req.uuid, operators = fallback.operators, without_rapids = fallback.without_rapids, "CPU fallback reported");
                return Ok(());
            }
        };
        // Under the core's lock: a report and a lost-lease decision never
        // interleave, so a fenced agent cannot end a batch after its node was
        // lost.
        //
        // In a task of its own: a request timeout (or a client hanging up)
        // drops the handler's future, and must not drop it between the commit
        // and the release of the capacity in memory.
        let (engine, node, uuid) = (self.clone(), node.to_string(), req.uuid.clone());
        let applied = tokio::spawn(async move {
            let mut core = engine.lock().await;
            check_epoch(&node, epoch, engine.current_epoch(&core, &node).await?)?;
            // The report's time, in the store and in what is counted.
            let now = Utc::now();
            let applied = engine
                .bounded(engine.shared.store.report(&node, &uuid, &event, now))
                .await
                .map_err(|e| match e {
                    StoreError::NotFound => Error::not_found("batch with uuid", &uuid),
                    other => other.into(),
                })?;
            crate::metrics::record_agent_report(event.name());
            engine.record_lifecycle(&applied, Some(&node));
            if applied.outcome.ended().is_some() {
                engine.count_released(core.forget(BatchKey(applied.seq), now).as_ref(), now);
                drop(core);
                engine.wake();
            } else if applied.requeued() {
                engine.requeued(&mut core, &applied, now).await;
                if applied.gave_way() {
                    tracing::info!(batch.id = %applied.batch_id, node, "batch requeued after preemption or reclaim: its processes stopped");
                } else {
                    tracing::warn!(batch.id = %applied.batch_id, node, "batch requeued after an infrastructure failure");
                }
                drop(core);
                engine.wake();
            }
            engine.work_changed();
            Ok::<(), Error>(())
        });
        applied.await.map_err(Error::internal)?
    }

    /// Logs and counts what a committed lifecycle decision did.
    /// A batch an infrastructure failure sent back to the queue: its old
    /// cluster leaves the core at once and, on a single process, the batch
    /// is queued again (with replicas the leader hears `Requeued`).
    async fn requeued(
        &self,
        core: &mut crate::scheduler::Scheduler,
        applied: &Applied,
        at: DateTime<Utc>,
    ) {
        if !applied.gave_way() {
            crate::metrics::record_requeue();
        }
        let key = BatchKey(applied.seq);
        self.count_released(core.forget(key, at).as_ref(), at);
        if !self.replicated() {
            self.requeue(core, &[key]).await;
        }
    }

    pub(super) fn record_lifecycle(&self, applied: &Applied, node: Option<&str>) {
        for to in applied.outcome.states() {
            match node {
                Some(node) => {
                    tracing::info!(batch.id = %applied.batch_id, batch.seq = applied.seq, to = %to, node, "batch state changed")
                }
                None => {
                    tracing::info!(batch.id = %applied.batch_id, batch.seq = applied.seq, to = %to, "batch state changed")
                }
            }
            crate::metrics::record_transition(to);
        }
        if let Some(reason) = applied.outcome.end_reason() {
            crate::metrics::record_ended(reason);
        }
        if let Some(after) = applied.started_after {
            crate::metrics::record_started(after);
        }
        if let (Some(state), Some(ran)) = (applied.outcome.ended(), applied.ran) {
            crate::metrics::record_run(state, ran);
        }
    }
}

/// The declared pool a registering node names.
fn declared_pool<'c>(
    config: &'c crate::config::Config,
    req: &RegisterNode,
) -> Result<&'c crate::config::PoolConfig, Error> {
    config
        .regions
        .get(&req.region)
        .and_then(|r| r.zones.get(&req.zone))
        .and_then(|z| z.node_pools.get(&req.pool))
        .ok_or_else(|| {
            Error::new(
                Reason::UnknownPool,
                format!(
                    "no node pool {} in zone {} of region {} is declared in the config",
                    quote(&req.pool),
                    quote(&req.zone),
                    quote(&req.region)
                ),
            )
        })
}

/// Checks that the principal may act for the registering node and that the
/// node offers its pool's shape, with its GPUs visible.
fn check_offer(
    principal: &Principal,
    req: &RegisterNode,
    pool: &crate::config::PoolConfig,
) -> Result<(), Error> {
    if !principal.may_act_for_node(&req.node_id) {
        return Err(Error::new(
            Reason::PermissionDenied,
            format!(
                "{} acts for node {}, not {}",
                principal.name,
                principal.node.as_deref().unwrap_or("(none)"),
                quote(&req.node_id)
            ),
        ));
    }
    crate::spec::check_node(
        &crate::spec::NodeOffer {
            node_id: &req.node_id,
            gpu_addresses: &req.gpu_addresses,
            cores: req.cores,
            memory_mb: req.memory_mb,
            local_ssd_gb: req.local_ssd_gb,
        },
        &crate::spec::NodeSize {
            gpus: pool.gpus_per_node,
            cores: pool.cores,
            memory_mb: pool.memory_mb,
            local_ssd_gb: pool.local_ssd_gb,
        },
    )?;
    if req.gpu_addresses.is_empty() {
        return Err(Error::new(
            Reason::NoGpusVisible,
            format!(
                "node {} reports no GPUs; a node whose GPUs cannot be seen is not offered",
                req.node_id
            ),
        ));
    }
    Ok(())
}

/// Checks that the node's pool has room for it: a node already known
/// always comes back (a reload that shrank its pool retired it: it stays
/// unschedulable).
fn check_pool_room(
    core: &crate::scheduler::Scheduler,
    spec: &NodeSpec,
    pool: &crate::config::PoolConfig,
) -> Result<(), Error> {
    let known = core.is_node_of_pool(&spec.id, &spec.zone, &spec.pool);
    let registered =
        (core.nodes_in_pool(&spec.zone, &spec.pool) as u32).saturating_sub(u32::from(known));
    if !known && registered + pool.virtual_nodes >= pool.max_nodes {
        return Err(Error::new(
            Reason::PoolFull,
            format!(
                "pool {} of {} is full: its declared capacity is {} nodes ({} virtual)",
                spec.pool, spec.zone, pool.max_nodes, pool.virtual_nodes
            ),
        ));
    }
    Ok(())
}

/// A `waitFor` duration ("20s", proto3 JSON).
pub(crate) fn wait_for(text: &str) -> Result<std::time::Duration, Error> {
    crate::spec::parse_proto_duration(text)
        .map(std::time::Duration::from_secs_f64)
        .map_err(|e| Error::invalid_field("waitFor", format!("{}: {e}", quote(text))))
}

/// An epoch in JSON: an int64 as a string (proto3 JSON) or, from lenient
/// clients, a number.
pub fn parse_epoch(value: &serde_json::Value) -> Result<u64, Error> {
    match value {
        serde_json::Value::String(s) => parse_epoch_str(s),
        serde_json::Value::Number(n) => n.as_u64().ok_or_else(|| bad_epoch(value)),
        _ => Err(bad_epoch(value)),
    }
}

pub fn parse_epoch_str(text: &str) -> Result<u64, Error> {
    text.parse::<u64>()
        .map_err(|_| bad_epoch(&serde_json::Value::String(text.to_string())))
}

fn bad_epoch(value: &dyn std::fmt::Display) -> Error {
    Error::invalid_field(
        "epoch",
        format!("{value} is not an epoch; send the one registration answered"),
    )
}

fn lease_error(node: &str, e: NodeLeaseError) -> Error {
    match e {
        NodeLeaseError::Unknown(_) => {
            Error::new(Reason::LeaseLost, e.to_string()).with_meta("node", node)
        }
        NodeLeaseError::Stale { .. } => {
            tracing::warn!(node, "late report from a fenced agent refused");
            Error::new(Reason::Fenced, e.to_string()).with_meta("node", node)
        }
    }
}

/// Refuses a call whose epoch is not the node's current one.
pub(super) fn check_epoch(node: &str, epoch: u64, current: Option<u64>) -> Result<(), Error> {
    let id = NodeId(node.to_string());
    match current {
        None => Err(lease_error(node, NodeLeaseError::Unknown(id))),
        Some(current) if current != epoch => Err(lease_error(
            node,
            NodeLeaseError::Stale {
                node: id,
                given: epoch,
                current,
            },
        )),
        Some(_) => Ok(()),
    }
}
