//! flexq: a capacity-aware scheduler daemon for GPU Spark batches — a
//! "flex start" queue.
//!
//! Map of the crate, bottom layer first; each module imports only the ones
//! above it in this list (docs/architecture.md, checked by
//! `tests/it/architecture.rs`):
//!
//! - [`api`]: wire types (Batch, Operation, State, `google.rpc.Status`),
//!   shared by server, CLI and tests; [`stats`]: percentiles.
//! - [`gpu`]: GPU telemetry's rules: an agent's readings, the point it
//!   sends per part, a batch's summary (pure).
//! - [`spec`]: the batch rules (docs/rules.md) as a pure function from a
//!   Batch and the operator's [`spec::Policy`] to a validated cluster
//!   request or every field violation.
//! - [`scheduler`]: the pure core: queues, quota ledger, capacity,
//!   placement, leases, views, and the batch lifecycle as decisions.
//! - [`launch`]: how an allocated batch becomes Spark work
//!   (docs/rules.md#running-on-spark): its Spark configuration,
//!   spark-submit line, GPU discovery script, failure summary, and the
//!   Spark Operator `SparkApplication`.
//! - [`protocol`]: the agent protocol's wire types.
//! - [`config`], [`telemetry`], [`metrics`]: operator configuration (and
//!   its conversion into the pure layers' types), logs, Prometheus metrics.
//! - [`store`]: durable state through sqlx on SQLite (the embedded
//!   default) or PostgreSQL (several replicas); one transaction per
//!   decision; the change stream between replicas. [`simulate`]: the
//!   policy simulator, a trace through the pure core on virtual time.
//! - [`engine`]: every use case, once: create, get, list, cancel, delete,
//!   node registration, heartbeats, polls, reports, output, quotas,
//!   capacity; the scheduler loop; single, leader or follower.
//! - [`grpc`]: the gRPC front end (tonic; Dataproc's BatchController and
//!   Operations services) over the engine, on the API port.
//! - [`server`]: the axum REST API (Dataproc Batches v1 compatible) over
//!   the engine, health endpoints and graceful shutdown; it mounts
//!   [`grpc`]'s routes and the web console.
//! - [`agent`]: the executor agent on each GPU node (`flexq agent`).
//! - [`cli`]: the client commands (`flexq batches …`, admin commands,
//!   `serve`, `agent`, `migrate`, `simulate`).

pub mod agent;
pub mod api;
pub mod cli;
pub mod config;
pub mod engine;
pub mod gpu;
pub(crate) mod grpc;
pub mod launch;
pub mod metrics;
pub mod protocol;
pub mod scheduler;
pub mod server;
pub mod simulate;
pub mod spec;
pub(crate) mod stats;
pub mod store;
pub(crate) mod telemetry;
