//! flexq's benchmarks, outside the product binary:
//!
//! ```sh
//! cargo bench --features bench-hooks --bench flexq-bench -- submit --duration 60s --clients 64 [--protocol rest|rest-h2c|grpc|all]
//! cargo bench --features bench-hooks --bench flexq-bench -- schedule --pending 100000
//! cargo bench --features bench-hooks --bench flexq-bench -- schedule --pending 100000 --only alternatives --rounds 3
//! cargo bench --features bench-hooks --bench flexq-bench -- fairshare --pending 100000 --batches 100000
//! cargo bench --features bench-hooks --bench flexq-bench -- replicas
//! cargo bench --features bench-hooks --bench flexq-bench -- agent --runs 10
//! cargo bench --features bench-hooks --bench flexq-bench -- telemetry --nodes 200 --clients 16
//! ```
//!
//! They start `flexq serve` (and `flexq agent`) from the `flexq` binary
//! cargo built beside them, or serve in-process, and report; they never
//! gate. Measurement-only crates (hdrhistogram, a raw hyper client) are
//! dev-dependencies. BENCHMARKS.md has the figures and how they were
//! taken.

// clap argument enums are built once per run; their size does not matter.
#![allow(clippy::large_enum_variant)]

mod agent;
mod fairshare;
mod replicas;
mod schedule;
mod submit;
mod telemetry;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "flexq-bench", about = "flexq's benchmarks")]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
    /// Passed by `cargo bench`; ignored.
    #[arg(long = "bench", hide = true, global = true)]
    _cargo_bench: bool,
}

#[derive(Subcommand)]
enum Bench {
    /// Durable creates over loopback: REST and gRPC side by side.
    Submit {
        /// Concurrent closed-loop clients.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        duration: Duration,
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        warmup: Duration,
        /// Open loop: send this many creates per second on a timetable.
        #[arg(long)]
        rate: Option<u64>,
        /// Use a running server instead of starting one.
        #[arg(long)]
        endpoint: Option<String>,
        /// The front end to drive; `all` takes turns of REST over HTTP/1.1,
        /// REST over h2c and gRPC against one server and prints the ratios.
        #[arg(long, value_enum, default_value_t = submit::Protocol::All)]
        protocol: submit::Protocol,
    },
    /// The agent on real Spark: flexq's overhead from allocation to the
    /// driver's first line of output (Spark's own start excluded), and the
    /// agent's memory. Needs pyspark and Java.
    Agent {
        #[arg(long, default_value_t = 10)]
        runs: usize,
    },
    /// Three replicas on PostgreSQL beside one server on SQLite: durable
    /// creates/s and capacity-release → allocation latency.
    Replicas {
        #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
        duration: Duration,
        #[arg(long, default_value_t = 48)]
        clients: usize,
        #[arg(long, default_value_t = 200)]
        rounds: usize,
        #[arg(long, default_value_t = 3)]
        replicas: usize,
        /// Where the benchmark may create (and then drops) a database.
        #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
        postgres: String,
    },
    /// Fair-share order beside strict: the core's pass after a release, and
    /// the simulator's speed on a simulated week.
    Fairshare {
        #[arg(long, default_value_t = 100_000)]
        pending: usize,
        #[arg(long, default_value_t = 300)]
        releases: usize,
        /// Projects the queued batches are spread over.
        #[arg(long, default_value_t = 20)]
        projects: usize,
        /// Turns per order.
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        /// Batches in the simulated week.
        #[arg(long, default_value_t = 100_000)]
        batches: usize,
    },
    /// GPU telemetry uploads beside heartbeats, in turns, against one
    /// server on SQLite (the agents played by the benchmark).
    Telemetry {
        #[arg(long, default_value_t = 200)]
        nodes: usize,
        #[arg(long, default_value_t = 16)]
        clients: usize,
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        duration: Duration,
        #[arg(long, default_value_t = 2)]
        rounds: usize,
    },
    /// The scheduler at scale: pass time, memory, flood, end to end,
    /// expiry lateness, restart.
    Schedule {
        /// Queue depths to measure the core at (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
        pending: Vec<usize>,
        /// Releases measured per depth.
        #[arg(long, default_value_t = 500)]
        releases: usize,
        /// Only these parts: core, flood, end-to-end, expiry, restart,
        /// alternatives, preemption, elastic (comma-separated; all when
        /// absent).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Turns of each setting in the `alternatives` part (off, ripe,
        /// unripe), the `preemption` part (off, young, ripe) and the
        /// `elastic` part (none, elastic).
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        /// Only this setting of the `alternatives`, `preemption` and `elastic` parts (no
        /// ratios then): to profile one, e.g. under `perf record`.
        #[arg(long)]
        setting: Option<String>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Cli::parse().bench {
        Bench::Submit {
            clients,
            duration,
            warmup,
            rate,
            endpoint,
            protocol,
        } => {
            submit::submit(submit::BenchOptions {
                clients,
                duration,
                rate,
                endpoint,
                warmup,
                protocol,
            })
            .await
        }
        Bench::Replicas {
            duration,
            clients,
            rounds,
            replicas,
            postgres,
        } => {
            replicas::run(replicas::ReplicasOptions {
                duration,
                clients,
                rounds,
                postgres,
                replicas,
            })
            .await
        }
        Bench::Agent { runs } => agent::run(agent::AgentBenchOptions { runs }).await,
        Bench::Telemetry {
            nodes,
            clients,
            duration,
            rounds,
        } => {
            telemetry::run(telemetry::TelemetryOptions {
                nodes,
                clients,
                duration,
                rounds,
            })
            .await
        }
        Bench::Fairshare {
            pending,
            releases,
            projects,
            rounds,
            batches,
        } => {
            fairshare::run(fairshare::FairShareOptions {
                pending,
                releases,
                projects,
                rounds,
                batches,
            })
            .await
        }
        Bench::Schedule {
            pending,
            releases,
            only,
            rounds,
            setting,
        } => {
            schedule::run(schedule::ScheduleOptions {
                pending,
                releases,
                only,
                rounds,
                setting,
            })
            .await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
