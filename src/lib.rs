//! flexq: a capacity-aware scheduler daemon for GPU Spark batches — a
//! "flex start" queue.
//!
//! Map of the crate:
//!
//! - [`api`]: wire types (Batch, Operation, State, `google.rpc.Status`),
//!   shared by server, CLI and tests.
//! - [`spec`]: the Flex Start rules as a pure function from a Batch to a
//!   validated cluster request or every field violation.
//! - [`store`]: durable state on SQLite through sqlx; creates are group
//!   committed.
//! - [`scheduler`]: the capacity-aware queue: a pure core (queues, quota
//!   ledger, capacity, placement, deadlines) and the loop that commits its
//!   decisions.
//! - [`server`]: the axum REST API (Dataproc Batches v1 compatible),
//!   health endpoints and graceful shutdown.
//! - [`launch`]: how an allocated batch becomes Spark work (spec §4): its
//!   Spark configuration, spark-submit line, GPU discovery script, failure
//!   summary, and the Spark Operator `SparkApplication`.
//! - [`agent`]: the executor agent on each GPU node (`flexq agent`).
//! - [`cli`]: the client commands (`flexq batches …`) and the benchmark.
//! - [`config`], [`telemetry`], [`metrics`]: operator configuration, logs,
//!   Prometheus metrics.

pub mod agent;
pub mod api;
pub mod cli;
pub mod config;
pub mod launch;
pub mod metrics;
pub mod scheduler;
pub mod server;
pub mod spec;
pub mod store;
pub mod telemetry;
