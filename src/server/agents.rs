//! The agent side of the API: node registration and heartbeats (leases).
//!
//! A node joins the capacity when its agent registers it and stays while
//! the agent heartbeats within the lease. Registration answers a new epoch
//! (the fencing token); every later call of the agent carries it, and a
//! call with an older epoch is refused, so an agent that was replaced or
//! lost its lease cannot act for the node any more.

use axum::extract::State as AppState;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::api::agent::{
    Action, Assignment, Assignments, BatchOutput, ClusterPart, OutputUpload, Poll, RegisterNode,
    Report, ReportEvent,
};
use crate::launch::SparkJob;
use crate::scheduler::{BatchKey, Role};
use crate::store::{AgentEvent, Change, ReportOutcome, StoreError};

use super::App;
use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery, Format, JsonBody};
use crate::api::{Code, State, quote};
use crate::scheduler::{LeaseError, NodeId, NodeSpec};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Heartbeat {
    epoch: serde_json::Value,
}

fn lease_answer(app: &App, node: &str, epoch: u64, expires: DateTime<Utc>) -> serde_json::Value {
    let lease = app.config.agents.lease_duration;
    serde_json::json!({
        "nodeId": node,
        // int64 travels as a string in proto3 JSON.
        "epoch": epoch.to_string(),
        "leaseDuration": format!("{}s", lease.as_secs()),
        "heartbeatInterval": format!("{}s", (lease.as_secs() / 3).max(1)),
        "leaseExpireTime": expires,
    })
}

/// `POST /v1/nodes:register`
#[utoipa::path(post, path = "/v1/nodes:register", tag = "agents",
    request_body = crate::api::agent::RegisterNode,
    responses((status = 200, body = crate::api::agent::Lease), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorBody)))]
pub(super) async fn register(
    AppState(app): AppState<App>,
    axum::Extension(principal): axum::Extension<super::Principal>,
    format: Format,
    JsonBody(req): JsonBody<RegisterNode>,
) -> Result<Response, ApiError> {
    let pool = app
        .config
        .regions
        .get(&req.region)
        .and_then(|r| r.zones.get(&req.zone))
        .and_then(|z| z.node_pools.get(&req.pool))
        .ok_or_else(|| {
            ApiError::new(
                Code::FailedPrecondition,
                "UNKNOWN_POOL",
                format!(
                    "no node pool {} in zone {} of region {} is declared in the config",
                    quote(&req.pool),
                    quote(&req.zone),
                    quote(&req.region)
                ),
            )
        })?;
    if !principal.may_act_for_node(&req.node_id) {
        return Err(ApiError::new(
            Code::PermissionDenied,
            "PERMISSION_DENIED",
            format!(
                "{} acts for node {}, not {}",
                principal.name,
                principal.node.as_deref().unwrap_or("(none)"),
                quote(&req.node_id)
            ),
        ));
    }
    let mut violations = Vec::new();
    if !crate::spec::is_resource_id(&req.node_id) {
        violations.push((
            "node_id",
            format!(
                "{} is invalid: 1 to 63 lowercase letters, digits and '-'",
                quote(&req.node_id)
            ),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for a in &req.gpu_addresses {
        let ok = !a.is_empty()
            && a.len() <= 32
            && a.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b':' || b == b'.');
        if !ok || !seen.insert(a) {
            violations.push((
                "gpu_addresses",
                format!("{} is not a usable, unique GPU address", quote(a)),
            ));
        }
    }
    if req.gpu_addresses.len() > pool.gpus_per_node as usize {
        violations.push((
            "gpu_addresses",
            format!(
                "{} GPUs; the pool's nodes have {}",
                req.gpu_addresses.len(),
                pool.gpus_per_node
            ),
        ));
    }
    for (field, given, declared) in [
        ("cores", u64::from(req.cores), u64::from(pool.cores)),
        ("memory_mb", req.memory_mb, pool.memory_mb),
        ("local_ssd_gb", req.local_ssd_gb, pool.local_ssd_gb),
    ] {
        if given == 0 || given > declared {
            violations.push((
                field,
                format!("{given} is out of range: from 1 to the pool's {declared}"),
            ));
        }
    }
    if !violations.is_empty() {
        let violations: Vec<_> = violations
            .into_iter()
            .map(|(f, d)| crate::api::FieldViolation {
                field: f.into(),
                description: d,
            })
            .collect();
        return Err(crate::spec::Rejection {
            code: Code::InvalidArgument,
            violations,
        }
        .into());
    }
    if req.gpu_addresses.is_empty() {
        return Err(ApiError::new(
            Code::FailedPrecondition,
            "NO_GPUS_VISIBLE",
            format!(
                "node {} reports no GPUs; a node whose GPUs cannot be seen is not offered",
                req.node_id
            ),
        ));
    }
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
        now + chrono::Duration::from_std(app.config.agents.lease_duration).unwrap_or_default();
    // Under the core's lock: a registration and a lease-expiry decision
    // never interleave.
    let mut core = app.scheduler.lock().await;
    let known = core.is_node_of_pool(&spec.id, &spec.zone, &spec.pool);
    let registered =
        (core.nodes_in_pool(&spec.zone, &spec.pool) as u32).saturating_sub(u32::from(known));
    if registered + pool.virtual_nodes >= pool.max_nodes {
        return Err(ApiError::new(
            Code::ResourceExhausted,
            "POOL_FULL",
            format!(
                "pool {} of {} is full: its declared capacity is {} nodes ({} virtual)",
                spec.pool, spec.zone, pool.max_nodes, pool.virtual_nodes
            ),
        ));
    }
    let epoch = app.store.register_node(&spec, now).await?;
    tracing::info!(node = %spec.id, zone = %spec.zone, pool = %spec.pool, gpus = spec.gpu_addresses.len(), epoch, "node registered");
    let node = spec.id.0.clone();
    core.register_node(spec, epoch, expires);
    // An agent that restarted: the work its node had started and that it
    // no longer runs is lost with the old agent's processes.
    let mut ended = Vec::new();
    for part in app.store.node_parts(&node).await? {
        let b = &part.batch;
        let started = matches!(b.state, State::Running | State::Cancelling)
            || (part.role == Role::Driver && b.master_url.is_some());
        if started && !req.running.contains(&b.uuid) && !ended.contains(&b.seq) {
            let message = format!(
                "The agent of node {node} restarted and no longer runs this batch's {} (its Spark processes were lost); the batch failed and its cluster was released.",
                part.role.name()
            );
            let outcome = app
                .store
                .report(&node, &b.uuid, &AgentEvent::PartFailed { message }, now)
                .await;
            match outcome {
                Ok(ReportOutcome::Ended { seq, .. }) => {
                    // At once: a later failure must not leave an ended
                    // batch's capacity held in memory.
                    core.forget(BatchKey(seq));
                    tracing::warn!(batch.id = %b.name.batch_id, node, "batch failed: its agent restarted without it");
                    ended.push(seq);
                }
                Ok(ReportOutcome::Recorded) => {}
                Err(e) => {
                    drop(core);
                    app.scheduler.wake();
                    app.scheduler.work_changed();
                    return Err(e.into());
                }
            }
        }
    }
    drop(core);
    app.scheduler.wake();
    app.scheduler.work_changed();
    Ok(format.respond(StatusCode::OK, &lease_answer(&app, &node, epoch, expires)))
}

/// `POST /v1/nodes/{node}:METHOD`: the calls of a node's agent, each
/// carrying the epoch its registration answered.
#[utoipa::path(post, path = "/v1/nodes/{node}", tag = "agents",
    description = "`{node}` is `NODE:heartbeat` ({epoch}), `NODE:poll` (Poll → Assignments), `NODE:report` (Report) or `NODE:output` (OutputUpload).",
    params(("node" = String, Path)),
    request_body(content = Object),
    responses((status = 200, description = "Lease, Assignments, {} or {nextOffset}"), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorBody)))]
pub(super) async fn node_method(
    AppState(app): AppState<App>,
    ApiPath(path): ApiPath<String>,
    format: Format,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    let (node, method) = path.split_once(':').unwrap_or((&path, ""));
    let answer = match method {
        "heartbeat" => heartbeat(&app, node, parse(body)?).await?,
        "poll" => poll(&app, node, parse(body)?).await?,
        "report" => report(&app, node, parse(body)?).await?,
        "output" => output(&app, node, parse(body)?).await?,
        _ => {
            return Err(ApiError::new(
                Code::NotFound,
                "NO_SUCH_METHOD",
                format!(
                    "no method POST on node {}; use {node}:heartbeat, :poll, :report or :output",
                    quote(&path)
                ),
            ));
        }
    };
    Ok(format.respond(StatusCode::OK, &answer))
}

/// A method's body, with the field path of what is wrong.
fn parse<T: DeserializeOwned>(body: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let field = match e.path().to_string() {
            p if p == "." => "body".to_string(),
            p => p,
        };
        ApiError::invalid_field(&field, e.inner().to_string())
    })
}

/// The epoch of a heartbeat: an int64 as a string (proto3 JSON) or, from
/// lenient clients, a number.
fn parse_epoch(value: &serde_json::Value) -> Result<u64, ApiError> {
    match value {
        serde_json::Value::String(s) => parse_epoch_str(s),
        serde_json::Value::Number(n) => n.as_u64().ok_or_else(|| bad_epoch(value)),
        _ => Err(bad_epoch(value)),
    }
}

fn parse_epoch_str(text: &str) -> Result<u64, ApiError> {
    text.parse::<u64>()
        .map_err(|_| bad_epoch(&serde_json::Value::String(text.to_string())))
}

fn bad_epoch(value: &dyn std::fmt::Display) -> ApiError {
    ApiError::invalid_field(
        "epoch",
        format!("{value} is not an epoch; send the one registration answered"),
    )
}

fn lease_error(node: &str, e: LeaseError) -> ApiError {
    match e {
        LeaseError::Unknown(_) => {
            ApiError::new(Code::FailedPrecondition, "LEASE_LOST", e.to_string())
                .with_meta("node", node)
        }
        LeaseError::Stale { .. } => {
            tracing::warn!(node, "late report from a fenced agent refused");
            ApiError::new(Code::Aborted, "FENCED", e.to_string()).with_meta("node", node)
        }
    }
}

/// Refuses a call whose epoch is not the node's current one.
fn check_epoch(node: &str, epoch: u64, current: Option<u64>) -> Result<(), ApiError> {
    let id = NodeId(node.to_string());
    match current {
        None => Err(lease_error(node, LeaseError::Unknown(id))),
        Some(current) if current != epoch => Err(lease_error(
            node,
            LeaseError::Stale {
                node: id,
                given: epoch,
                current,
            },
        )),
        Some(_) => Ok(()),
    }
}

/// The node's current epoch, from `core` (the caller holds its lock) or,
/// with several replicas, from the database: this replica's core may not
/// have heard of a registration on another one yet, and a zombie agent's
/// old epoch must be refused wherever it calls.
async fn current_epoch(
    app: &App,
    core: &crate::scheduler::Scheduler,
    node: &str,
) -> Result<Option<u64>, ApiError> {
    if app.scheduler.replicated() {
        Ok(app.store.active_node(node).await?.map(|(_, epoch)| epoch))
    } else {
        Ok(core.node_epoch(&NodeId(node.to_string())))
    }
}

/// [`check_epoch`] for a call that does not otherwise need the core.
async fn check_epoch_now(app: &App, node: &str, epoch: u64) -> Result<(), ApiError> {
    let current = current_epoch(app, &*app.scheduler.lock().await, node).await?;
    check_epoch(node, epoch, current)
}

async fn heartbeat(app: &App, node: &str, req: Heartbeat) -> Result<serde_json::Value, ApiError> {
    let epoch = parse_epoch(&req.epoch)?;
    let expires = Utc::now()
        + chrono::Duration::from_std(app.config.agents.lease_duration).unwrap_or_default();
    if app.scheduler.replicated() {
        // Checked against the database; the announcement renews the lease
        // in every replica's core, the leader's (and this one's) included.
        check_epoch_now(app, node, epoch).await?;
        app.store
            .announce_now(&Change::Heartbeat {
                epoch,
                node: node.to_string(),
            })
            .await?;
    } else {
        app.scheduler
            .lock()
            .await
            .heartbeat(&NodeId(node.to_string()), epoch, expires)
            .map_err(|e| lease_error(node, e))?;
    }
    Ok(lease_answer(app, node, epoch, expires))
}

/// The node's assignments now, and their version (a digest: equal
/// versions, equal assignments).
async fn assignments(app: &App, node: &str) -> Result<Assignments, ApiError> {
    let mut out = Vec::new();
    for part in app.store.node_parts(node).await? {
        let b = part.batch;
        let action = match b.state {
            State::Pending | State::Running => Action::Run,
            State::Cancelling => Action::Stop,
            // Ended: its cluster is being released.
            _ => continue,
        };
        let cluster = if part.role == Role::Driver {
            app.store
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
        let job = (part.role == Role::Driver).then(|| SparkJob {
            batch: b.name.to_string(),
            uuid: b.uuid.clone(),
            spec: b.spec.clone(),
            cluster: b.cluster.clone(),
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
            ttl_seconds: b.cluster.ttl_s,
            job,
            cluster,
        });
    }
    let digest = serde_json::to_vec(&out).map_err(ApiError::internal)?;
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
async fn poll(app: &App, node: &str, req: Poll) -> Result<serde_json::Value, ApiError> {
    let epoch = parse_epoch_str(&req.epoch)?;
    let longest = app
        .config
        .server
        .request_timeout
        .saturating_sub(std::time::Duration::from_secs(5))
        .max(std::time::Duration::from_secs(1));
    let wait = match &req.wait_for {
        None => longest,
        Some(text) => wait_for(text)?.min(longest),
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut changes = app.scheduler.watch_work();
    loop {
        changes.borrow_and_update();
        check_epoch_now(app, node, epoch).await?;
        let now = assignments(app, node).await?;
        if now.version != req.version || tokio::time::Instant::now() >= deadline {
            return serde_json::to_value(now).map_err(ApiError::internal);
        }
        tokio::select! {
            r = changes.changed() => if r.is_err() { return serde_json::to_value(now).map_err(ApiError::internal) },
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

async fn report(app: &App, node: &str, req: Report) -> Result<serde_json::Value, ApiError> {
    let epoch = parse_epoch_str(&req.epoch)?;
    let event = match req.event {
        ReportEvent::MasterReady { master_url } => {
            if !master_url.starts_with("spark://") {
                return Err(ApiError::invalid_field(
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
        ReportEvent::PartFailed { message } => AgentEvent::PartFailed { message },
    };
    // Under the core's lock: a report and a lost-lease decision never
    // interleave, so a fenced agent cannot end a batch after its node was
    // lost.
    //
    // In a task of its own: a request timeout (or a client hanging up)
    // drops the handler's future, and must not drop it between the commit
    // and the release of the capacity in memory.
    let (app2, node2, uuid) = (app.clone(), node.to_string(), req.uuid.clone());
    let applied = tokio::spawn(async move {
        let mut core = app2.scheduler.lock().await;
        check_epoch(&node2, epoch, current_epoch(&app2, &core, &node2).await?)?;
        let outcome = app2
            .store
            .report(&node2, &uuid, &event, Utc::now())
            .await
            .map_err(|e| match e {
                StoreError::NotFound => ApiError::not_found("batch with uuid", &uuid),
                other => other.into(),
            })?;
        if let ReportOutcome::Ended { seq, .. } = outcome {
            core.forget(BatchKey(seq));
            drop(core);
            app2.scheduler.wake();
        }
        app2.scheduler.work_changed();
        Ok::<(), ApiError>(())
    });
    applied.await.map_err(ApiError::internal)??;
    Ok(serde_json::json!({}))
}

async fn output(app: &App, node: &str, req: OutputUpload) -> Result<serde_json::Value, ApiError> {
    let epoch = parse_epoch_str(&req.epoch)?;
    let offset: u64 = req
        .offset
        .parse()
        .ok()
        .filter(|o| *o <= i64::MAX as u64 / 2)
        .ok_or_else(|| {
            ApiError::invalid_field(
                "offset",
                format!("{} is not a byte offset", quote(&req.offset)),
            )
        })?;
    check_epoch_now(app, node, epoch).await?;
    let next = app
        .store
        .append_output(
            node,
            &req.uuid,
            offset,
            req.data.as_bytes(),
            app.config.agents.max_output_bytes,
        )
        .await?;
    app.scheduler.output_written();
    Ok(serde_json::json!({"nextOffset": next.to_string()}))
}

/// Query of `GET .../batches/{batch}/output`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct OutputParams {
    #[serde(default)]
    offset: Option<String>,
    #[serde(default)]
    wait_for: Option<String>,
    #[serde(rename = "$alt")]
    _alt: Option<String>,
}

/// Most output bytes one read returns.
const OUTPUT_READ_MAX: usize = 1 << 20;

/// `GET /v1/projects/{p}/locations/{r}/batches/{b}/output`: the driver's
/// output from `offset`. With `waitFor`, waits for more output or the end
/// of the batch (how `flexq batches wait` streams it).
#[utoipa::path(get, path = "/v1/projects/{project}/locations/{region}/batches/{batch}/output", tag = "batches",
    params(("project" = String, Path), ("region" = String, Path), ("batch" = String, Path), ("offset" = Option<String>, Query), ("waitFor" = Option<String>, Query)),
    responses((status = 200, body = crate::api::agent::BatchOutput), (status = "4XX", description = "google.rpc.Status error", body = super::openapi::ErrorBody)))]
pub(super) async fn read_output(
    AppState(app): AppState<App>,
    ApiPath((project, region, batch_id)): ApiPath<(String, String, String)>,
    ApiQuery(params): ApiQuery<OutputParams>,
    format: Format,
) -> Result<Response, ApiError> {
    let offset: u64 = match &params.offset {
        None => 0,
        Some(o) => o
            .parse()
            .ok()
            .filter(|o| *o <= i64::MAX as u64 / 2)
            .ok_or_else(|| {
                ApiError::invalid_field("offset", format!("{} is not a byte offset", quote(o)))
            })?,
    };
    let wait = match &params.wait_for {
        None => std::time::Duration::ZERO,
        Some(text) => wait_for(text)?.min(
            app.config
                .server
                .request_timeout
                .saturating_sub(std::time::Duration::from_secs(5)),
        ),
    };
    let name = crate::api::BatchName::new(&project, &region, &batch_id);
    let deadline = tokio::time::Instant::now() + wait;
    // New output, or the batch's end (a work change).
    let mut changes = app.scheduler.watch_work();
    let mut written = app.scheduler.watch_output();
    loop {
        changes.borrow_and_update();
        written.borrow_and_update();
        let record = app.store.get(&name).await.map_err(|e| match e {
            StoreError::NotFound => ApiError::not_found("batch", &name.to_string()),
            other => other.into(),
        })?;
        let chunk = app
            .store
            .read_output(record.seq, offset, OUTPUT_READ_MAX)
            .await?;
        let done = record.state.is_terminal() && chunk.next_offset >= chunk.total;
        if !chunk.data.is_empty() || done || tokio::time::Instant::now() >= deadline {
            let answer = BatchOutput {
                data: String::from_utf8_lossy(&chunk.data).into_owned(),
                next_offset: chunk.next_offset.to_string(),
                total_bytes: chunk.total.to_string(),
                done,
                truncated: record.run.output_truncated,
            };
            return Ok(format.respond(StatusCode::OK, &answer));
        }
        tokio::select! {
            _ = changes.changed() => {}
            _ = written.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// A `waitFor` duration ("20s", proto3 JSON).
fn wait_for(text: &str) -> Result<std::time::Duration, ApiError> {
    crate::spec::parse_proto_duration(text)
        .map(std::time::Duration::from_secs_f64)
        .map_err(|e| ApiError::invalid_field("waitFor", format!("{}: {e}", quote(text))))
}
