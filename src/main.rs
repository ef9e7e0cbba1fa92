//! The `flexq` command line. Parsing only; the work is in the library.

// clap argument enums are built once per run; their size does not matter.
#![allow(clippy::large_enum_variant)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// mimalloc: the create path allocates many small, short-lived objects
/// (JSON, maps, rows); glibc malloc showed up at ~15% of server CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use flexq::cli::batches::{self, SubmitOptions, Workload};
use flexq::cli::bench::{self, BenchOptions};
use flexq::cli::{Client, OutputFormat, Target};
use flexq::config::Config;

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
    /// Run the API server (and, later, the scheduler).
    Serve(ConfigArg),
    /// Run the executor agent of a GPU node: register it, heartbeat, and
    /// run the Spark work of the batches allocated to it.
    Agent {
        /// The agent's TOML file (see config/agent.toml); any key can be
        /// overridden by FLEXQ_AGENT_<KEY>.
        #[arg(long, env = "FLEXQ_AGENT_CONFIG")]
        config: Option<PathBuf>,
        /// Log lines as JSON.
        #[arg(long)]
        json_logs: bool,
    },
    /// Authentication helpers.
    Auth {
        #[command(subcommand)]
        action: AuthAction,
    },
    /// Create or upgrade the database schema, then exit.
    Migrate(ConfigArg),
    /// Show or check the effective configuration.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
    /// Submit and manage batches.
    Batches {
        #[command(flatten)]
        target: TargetArgs,
        #[command(subcommand)]
        action: BatchesAction,
    },
    /// Capacity per region, zone and GPU type.
    Regions {
        #[command(flatten)]
        target: TargetArgs,
        #[command(subcommand)]
        action: ListAction,
    },
    /// GPU nodes, virtual ones marked.
    Nodes {
        #[command(flatten)]
        target: TargetArgs,
        #[command(subcommand)]
        action: ListAction,
    },
    /// A project's quotas in a region.
    Quotas {
        #[command(flatten)]
        target: TargetArgs,
        #[command(subcommand)]
        action: QuotasAction,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        action: BenchAction,
    },
}

#[derive(Args)]
struct ConfigArg {
    /// A TOML file layered over the embedded default.
    #[arg(long, env = "FLEXQ_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
enum AuthAction {
    /// Print a new random token and the principal entry (with its SHA-256)
    /// to put in the server's config. The token is shown only here.
    NewToken {
        /// The principal's name (recorded as `creator`).
        #[arg(long)]
        name: String,
        /// submitter, admin or agent.
        #[arg(long, default_value = "submitter")]
        role: String,
    },
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Print the effective configuration (secrets redacted).
    Print(ConfigArg),
    /// Check the configuration; exit non-zero naming the bad key.
    Check(ConfigArg),
}

#[derive(Args)]
struct TargetArgs {
    /// The flexq server.
    #[arg(
        long,
        global = true,
        env = "FLEXQ_ENDPOINT",
        default_value = "http://127.0.0.1:8080"
    )]
    endpoint: String,
    /// The project the batches belong to.
    #[arg(long, global = true, env = "FLEXQ_PROJECT")]
    project: Option<String>,
    /// The region (location) of the batches.
    #[arg(long, global = true, env = "FLEXQ_REGION")]
    region: Option<String>,
    /// The bearer token (better from the environment than the command line).
    #[arg(long, global = true, env = "FLEXQ_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A PEM CA certificate that signed the server's (HTTPS endpoints).
    #[arg(long, global = true, env = "FLEXQ_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// Output format.
    #[arg(long, global = true, value_enum, default_value = "table")]
    format: OutputFormat,
}

#[derive(Subcommand)]
enum ListAction {
    /// List them.
    List,
}

#[derive(Subcommand)]
enum QuotasAction {
    /// List limit and usage of every metric.
    List,
    /// Set one limit (admin). A lowered limit never revokes running work.
    Set {
        /// e.g. PREEMPTIBLE_NVIDIA_L4_GPUS
        metric: String,
        limit: u64,
    },
}

#[derive(Subcommand)]
enum BatchesAction {
    /// Submit a batch; follows it until it ends unless --async.
    Submit {
        #[command(subcommand)]
        kind: SubmitKind,
    },
    /// List batches, newest first.
    List {
        /// AIP-160 filter, e.g. 'state = RUNNING AND create_time < "2026-01-01T00:00:00Z"'.
        #[arg(long)]
        filter: Option<String>,
        #[arg(long)]
        page_size: Option<u32>,
        /// Stop after this many batches.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Show one batch (YAML unless --format json).
    Describe { batch: String },
    /// Cancel a batch.
    Cancel { batch: String },
    /// Delete a finished batch.
    Delete { batch: String },
    /// Follow a batch until it ends; exit non-zero unless it SUCCEEDED.
    Wait { batch: String },
}

#[derive(Subcommand)]
enum SubmitKind {
    /// A PySpark batch.
    Pyspark {
        /// The main Python file: a local path or a URI.
        file: String,
        /// Extra Python files (comma-separated).
        #[arg(long, value_delimiter = ',')]
        py_files: Vec<String>,
        #[command(flatten)]
        opts: SubmitArgs,
    },
    /// A Spark (JVM) batch.
    Spark {
        /// The main class.
        #[arg(long, required_unless_present = "jar", conflicts_with = "jar")]
        class: Option<String>,
        /// The main jar.
        #[arg(long)]
        jar: Option<String>,
        #[command(flatten)]
        opts: SubmitArgs,
    },
    /// A Spark SQL batch.
    SparkSql {
        /// The query file: a local path or a URI.
        file: String,
        #[command(flatten)]
        opts: SubmitArgs,
    },
}

#[derive(Args)]
struct SubmitArgs {
    /// The batch id (generated when absent).
    #[arg(long = "batch")]
    batch_id: Option<String>,
    /// Idempotency key: a retried submit with it returns the first batch.
    #[arg(long)]
    request_id: Option<String>,
    /// Runtime version, e.g. 3.0.
    #[arg(long)]
    version: Option<String>,
    /// Spark properties: k=v,k=v (or ^#^k=a,b#k2=v).
    #[arg(long)]
    properties: Option<String>,
    /// Labels: k=v,k=v.
    #[arg(long)]
    labels: Option<String>,
    /// Maximum run time, e.g. 4h.
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// Extra jars (comma-separated).
    #[arg(long, value_delimiter = ',')]
    jars: Vec<String>,
    /// Extra files (comma-separated).
    #[arg(long, value_delimiter = ',')]
    files: Vec<String>,
    /// Return once the batch is submitted.
    #[arg(long = "async")]
    run_async: bool,
    /// Arguments for the job, after --.
    #[arg(last = true)]
    args: Vec<String>,
}

#[derive(Subcommand)]
enum BenchAction {
    /// Durable creates over loopback HTTP.
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
    /// The scheduler at scale: pass time, memory, flood, end to end,
    /// expiry lateness, restart.
    Schedule {
        /// Queue depths to measure the core at (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
        pending: Vec<usize>,
        /// Releases measured per depth.
        #[arg(long, default_value_t = 500)]
        releases: usize,
    },
}

fn load_config(arg: &ConfigArg) -> Result<Config, ExitCode> {
    Config::load(arg.config.as_deref()).map_err(|e| {
        eprintln!("flexq: invalid configuration: {e}");
        ExitCode::from(2)
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match cli.command {
        Command::Serve(arg) => {
            let config = match load_config(&arg) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            flexq::telemetry::init(config.log.format, &config.log.filter);
            flexq::server::serve(config).await?;
        }
        Command::Agent { config, json_logs } => {
            let config = match flexq::agent::AgentConfig::load(config.as_deref()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("flexq agent: {e}");
                    return Ok(ExitCode::from(2));
                }
            };
            let format = if json_logs {
                flexq::config::LogFormat::Json
            } else {
                flexq::config::LogFormat::Text
            };
            flexq::telemetry::init(format, "info");
            let shutdown = tokio_util::sync::CancellationToken::new();
            flexq::server::cancel_on_signals(shutdown.clone());
            flexq::agent::run(config, shutdown).await?;
        }
        Command::Auth {
            action: AuthAction::NewToken { name, role },
        } => {
            let token = format!(
                "flexq_{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            );
            eprintln!("token (give it to {name}; it is not stored anywhere): ");
            println!("{token}");
            eprintln!(
                "\n# in the server's config:\n[[principals]]\nname = {name:?}\nrole = {role:?}\n{}token_sha256 = {:?}",
                match role.as_str() {
                    "submitter" => "projects = [\"PROJECT\"]\n",
                    "agent" => "node = \"NODE-ID\"\n",
                    _ => "",
                },
                flexq::server::auth::token_hash(&token)
            );
        }
        Command::Migrate(arg) => {
            let config = match load_config(&arg) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            flexq::store::migrate_only(&flexq::store::StoreOptions {
                url: config.database_url(),
                max_connections: 2,
                group_commit_max: 1,
                observe_group: None,
            })
            .await?;
            eprintln!("database at {} is up to date", config.database_url());
        }
        Command::Config { action } => match action {
            ConfigAction::Print(arg) => match load_config(&arg) {
                Ok(c) => print!("{}", c.to_toml()),
                Err(code) => return Ok(code),
            },
            ConfigAction::Check(arg) => match load_config(&arg) {
                Ok(_) => eprintln!("configuration is valid"),
                Err(code) => return Ok(code),
            },
        },
        Command::Batches { target, action } => return batches_command(target, action).await,
        Command::Regions {
            target,
            action: ListAction::List,
        } => {
            let format = target.format;
            flexq::cli::admin::regions(&admin_client(target)?, format).await?;
        }
        Command::Nodes {
            target,
            action: ListAction::List,
        } => {
            let format = target.format;
            flexq::cli::admin::nodes(&admin_client(target)?, format).await?;
        }
        Command::Quotas { target, action } => {
            let format = target.format;
            let client = project_client(target)?;
            match action {
                QuotasAction::List => flexq::cli::admin::quotas(&client, format).await?,
                QuotasAction::Set { metric, limit } => {
                    flexq::cli::admin::set_quota(&client, &metric, limit, format).await?
                }
            }
        }
        Command::Bench { action } => match action {
            BenchAction::Submit {
                clients,
                duration,
                warmup,
                rate,
                endpoint,
            } => {
                bench::submit(BenchOptions {
                    clients,
                    duration,
                    rate,
                    endpoint,
                    warmup,
                })
                .await?;
            }
            BenchAction::Replicas {
                duration,
                clients,
                rounds,
                replicas,
                postgres,
            } => {
                flexq::cli::bench_replicas::run(flexq::cli::bench_replicas::ReplicasOptions {
                    duration,
                    clients,
                    rounds,
                    postgres,
                    replicas,
                })
                .await?;
            }
            BenchAction::Agent { runs } => {
                flexq::cli::bench_agent::run(flexq::cli::bench_agent::AgentBenchOptions { runs })
                    .await?;
            }
            BenchAction::Schedule { pending, releases } => {
                flexq::cli::bench_schedule::run(flexq::cli::bench_schedule::ScheduleOptions {
                    pending,
                    releases,
                })
                .await?;
            }
        },
    }
    Ok(ExitCode::SUCCESS)
}

/// A client for commands that need no project or region.
fn admin_client(target: TargetArgs) -> Result<Client, Box<dyn std::error::Error>> {
    Ok(Client::new(Target {
        endpoint: target.endpoint,
        project: target.project.unwrap_or_default(),
        region: target.region.unwrap_or_default(),
        token: target.token,
        ca_cert: target.ca_cert,
    })?)
}

/// A client for commands about one project's region: both must be given.
fn project_client(target: TargetArgs) -> Result<Client, Box<dyn std::error::Error>> {
    let project = target
        .project
        .ok_or("ERROR: (flexq) no project: pass --project or set FLEXQ_PROJECT")?;
    let region = target
        .region
        .ok_or("ERROR: (flexq) no region: pass --region or set FLEXQ_REGION")?;
    Ok(Client::new(Target {
        endpoint: target.endpoint,
        project,
        region,
        token: target.token,
        ca_cert: target.ca_cert,
    })?)
}

async fn batches_command(
    target: TargetArgs,
    action: BatchesAction,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let format = target.format;
    let client = project_client(target)?;
    let ok = match action {
        BatchesAction::Submit { kind } => {
            let (workload, args) = match kind {
                SubmitKind::Pyspark {
                    file,
                    py_files,
                    opts,
                } => (Workload::Pyspark { file, py_files }, opts),
                SubmitKind::Spark { class, jar, opts } => (Workload::Spark { class, jar }, opts),
                SubmitKind::SparkSql { file, opts } => (Workload::SparkSql { file }, opts),
            };
            let opts = SubmitOptions {
                batch_id: args.batch_id,
                request_id: args.request_id,
                version: args.version,
                properties: args.properties,
                labels: args.labels,
                ttl: args.ttl,
                jars: args.jars,
                files: args.files,
                run_async: args.run_async,
                args: args.args,
            };
            batches::submit(&client, workload, opts).await?
        }
        BatchesAction::List {
            filter,
            page_size,
            limit,
        } => {
            batches::list(&client, filter.as_deref(), page_size, limit, format).await?;
            true
        }
        BatchesAction::Describe { batch } => {
            batches::describe(&client, &batch, format).await?;
            true
        }
        BatchesAction::Cancel { batch } => {
            batches::cancel(&client, &batch).await?;
            true
        }
        BatchesAction::Delete { batch } => {
            batches::delete(&client, &batch).await?;
            true
        }
        BatchesAction::Wait { batch } => batches::wait(&client, &batch).await?,
    };
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
