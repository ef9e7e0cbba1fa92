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

use super::App;
use super::error::ApiError;
use super::extract::{ApiPath, Format, JsonBody};
use crate::api::{Code, quote};
use crate::scheduler::{LeaseError, NodeId, NodeSpec};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RegisterNode {
    node_id: String,
    region: String,
    zone: String,
    pool: String,
    gpu_addresses: Vec<String>,
    cores: u32,
    memory_mb: u64,
    local_ssd_gb: u64,
}

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
pub(super) async fn register(
    AppState(app): AppState<App>,
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
    let known = core.node_epoch(&spec.id).is_some();
    let registered = core.nodes_in_pool(&spec.zone, &spec.pool) as u32 - u32::from(known);
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
    drop(core);
    app.scheduler.wake();
    Ok(format.respond(StatusCode::OK, &lease_answer(&app, &node, epoch, expires)))
}

/// `POST /v1/nodes/{node}:heartbeat`
pub(super) async fn node_method(
    AppState(app): AppState<App>,
    ApiPath(node): ApiPath<String>,
    format: Format,
    JsonBody(req): JsonBody<Heartbeat>,
) -> Result<Response, ApiError> {
    let Some(node) = node.strip_suffix(":heartbeat") else {
        return Err(ApiError::new(
            Code::NotFound,
            "NO_SUCH_METHOD",
            format!(
                "no method POST on node {}; use {node}:heartbeat",
                quote(&node)
            ),
        ));
    };
    let epoch = match &req.epoch {
        serde_json::Value::String(s) => s.parse::<u64>().ok(),
        serde_json::Value::Number(n) => n.as_u64(),
        _ => None,
    }
    .ok_or_else(|| {
        ApiError::invalid_field(
            "epoch",
            format!(
                "{} is not an epoch; send the one registration answered",
                req.epoch
            ),
        )
    })?;
    let expires = Utc::now()
        + chrono::Duration::from_std(app.config.agents.lease_duration).unwrap_or_default();
    let result = app
        .scheduler
        .lock()
        .await
        .heartbeat(&NodeId(node.to_string()), epoch, expires);
    match result {
        Ok(()) => Ok(format.respond(StatusCode::OK, &lease_answer(&app, node, epoch, expires))),
        Err(e @ LeaseError::Unknown(_)) => {
            Err(
                ApiError::new(Code::FailedPrecondition, "LEASE_LOST", e.to_string())
                    .with_meta("node", node),
            )
        }
        Err(e @ LeaseError::Stale { .. }) => {
            tracing::warn!(node, epoch, "late report from a fenced agent refused");
            Err(ApiError::new(Code::Aborted, "FENCED", e.to_string()).with_meta("node", node))
        }
    }
}
