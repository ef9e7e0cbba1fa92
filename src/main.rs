//! The `flexq` command line: parses, then dispatches each subcommand to
//! its module of [`flexq::cli`], where its arguments and its run live.

// clap argument enums are built once per run; their size does not matter.
#![allow(clippy::large_enum_variant)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use flexq::cli::{batches, capacity, local, queues, simulate};

/// mimalloc: the create path allocates many small, short-lived objects
/// (JSON, maps, rows); glibc malloc showed up at ~15% of server CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "flexq",
    version,
    about = "A capacity-aware scheduler for GPU Spark batches (a flex start queue)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API server and the scheduler.
    Serve(local::ConfigArg),
    /// Run the executor agent of a GPU node: register it, heartbeat, and
    /// run the Spark work of the batches allocated to it.
    Agent(local::AgentArgs),
    /// Authentication helpers.
    Auth {
        #[command(subcommand)]
        action: local::AuthAction,
    },
    /// Create or upgrade the database schema, then exit.
    Migrate(local::ConfigArg),
    /// Show or check the effective configuration; show what a reload
    /// would change on a running server, or reload it.
    Config {
        #[command(subcommand)]
        action: local::ConfigAction,
    },
    /// Submit and manage batches.
    Batches(batches::BatchesArgs),
    /// Capacity per region, zone and GPU type.
    Regions(capacity::ListArgs),
    /// GPU nodes, virtual ones marked; cordon, drain and uncordon them
    /// (admins).
    Nodes(capacity::NodesArgs),
    /// A project's quotas in a region.
    Quotas(capacity::QuotasArgs),
    /// Hold and resume queues (admins): nothing in a held queue is
    /// allocated; deadlines keep counting.
    Queues(queues::QueuesArgs),
    /// GPU-hours, batches, waits and expiries per project and GPU type in
    /// a region over a window.
    Usage(capacity::UsageArgs),
    /// Replay a workload trace through the scheduler on virtual time and
    /// report waits, expiries and GPU shares per project (no server).
    Simulate(simulate::SimulateArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let done = match Cli::parse().command {
        Command::Serve(arg) => local::serve(arg).await,
        Command::Agent(args) => local::agent(args).await,
        Command::Auth { action } => Ok(local::auth(action)),
        Command::Migrate(arg) => local::migrate(arg).await,
        Command::Config { action } => local::config(action).await,
        Command::Batches(args) => batches::run(args).await.map_err(Into::into),
        Command::Regions(args) => capacity::run_regions(args)
            .await
            .map(ok)
            .map_err(Into::into),
        Command::Nodes(args) => capacity::run_nodes(args).await.map(ok).map_err(Into::into),
        Command::Quotas(args) => capacity::run_quotas(args).await.map(ok).map_err(Into::into),
        Command::Queues(args) => queues::run_queues(args).await.map(ok).map_err(Into::into),
        Command::Usage(args) => capacity::run_usage(args).await.map(ok).map_err(Into::into),
        Command::Simulate(args) => Ok(simulate::run(args)),
    };
    done.unwrap_or_else(|e: anyhow::Error| {
        eprintln!("{e}");
        ExitCode::FAILURE
    })
}

fn ok(_: ()) -> ExitCode {
    ExitCode::SUCCESS
}
