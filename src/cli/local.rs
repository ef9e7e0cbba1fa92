//! The commands that run here rather than call a server: `serve`, `agent`,
//! `migrate`, `config print|check` and `auth new-token` (and `config
//! diff|reload`, which ask the server).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::config::{Config, LogFormat};

/// A config file option.
#[derive(Debug, Args)]
pub struct ConfigArg {
    /// A TOML file layered over the embedded default.
    #[arg(long, env = "FLEXQ_CONFIG")]
    pub config: Option<PathBuf>,
}

impl ConfigArg {
    /// The effective config, or exit code 2 after saying which key is bad.
    fn load(&self) -> Result<Config, ExitCode> {
        Config::load(self.config.as_deref()).map_err(|e| {
            eprintln!("flexq: invalid configuration: {e}");
            ExitCode::from(2)
        })
    }
}

/// `flexq serve`: the API server and the scheduler, until SIGINT/SIGTERM.
pub async fn serve(arg: ConfigArg) -> anyhow::Result<ExitCode> {
    let config = match arg.load() {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    crate::telemetry::init(config.log.format, &config.log.filter);
    let source = crate::engine::ConfigSource::Layers {
        file: arg.config.clone(),
        env: true,
    };
    crate::server::serve(config, source).await?;
    Ok(ExitCode::SUCCESS)
}

/// `flexq migrate`: create or upgrade the database schema, then exit.
pub async fn migrate(arg: ConfigArg) -> anyhow::Result<ExitCode> {
    let config = match arg.load() {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    crate::store::migrate_only(&crate::store::StoreOptions {
        url: config.database_url(),
        max_connections: 2,
        group_commit_max: 1,
        limits: crate::store::SessionLimits {
            lease: config.database.leader_lease,
            renew: config.database.leader_renew,
        },
        observe_group: None,
    })
    .await?;
    eprintln!("database at {} is up to date", config.database_url());
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Print the effective configuration (secrets redacted).
    Print(ConfigArg),
    /// Check the configuration; exit non-zero naming the bad key.
    Check(ConfigArg),
    /// What `flexq config reload` would change on a running server: the
    /// server reads its config file again and compares (admins).
    Diff(super::reload::ConfigRemoteArgs),
    /// Have a running server read its config file again and put it in
    /// force, as SIGHUP does (admins).
    Reload(super::reload::ConfigRemoteArgs),
}

/// `flexq config print|check|diff|reload`.
pub async fn config(action: ConfigAction) -> anyhow::Result<ExitCode> {
    match action {
        ConfigAction::Diff(args) => {
            super::reload::run_config(args, false).await?;
            return Ok(ExitCode::SUCCESS);
        }
        ConfigAction::Reload(args) => {
            super::reload::run_config(args, true).await?;
            return Ok(ExitCode::SUCCESS);
        }
        ConfigAction::Print(arg) => match arg.load() {
            Ok(c) => print!("{}", c.to_toml()),
            Err(code) => return Ok(code),
        },
        ConfigAction::Check(arg) => match arg.load() {
            Ok(_) => eprintln!("configuration is valid"),
            Err(code) => return Ok(code),
        },
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The agent's TOML file (see config/agent.toml); any key can be
    /// overridden by FLEXQ_AGENT_<KEY>.
    #[arg(long, env = "FLEXQ_AGENT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log lines as JSON.
    #[arg(long)]
    pub json_logs: bool,
    /// Only check GPU discovery and telemetry: list this node's GPUs as the
    /// agent does (`nvidia-smi -L`), read them N times, a second apart,
    /// through NVML and through `nvidia-smi`, print what each saw, and exit
    /// (0 when discovery found GPUs and one reader could read them). No
    /// server, no config needed.
    #[arg(long, value_name = "N")]
    pub gpu_check: Option<u32>,
    /// With --gpu-check: the `nvidia-smi` to run.
    #[arg(long, default_value = "nvidia-smi")]
    pub nvidia_smi: String,
    /// With --gpu-check: the NVML library to load (a path); empty: the
    /// system's.
    #[arg(long, default_value = "")]
    pub nvml_library: String,
}

/// `flexq agent`: register this GPU node, heartbeat, and run the Spark
/// work of the batches allocated to it, until SIGINT/SIGTERM.
pub async fn agent(args: AgentArgs) -> anyhow::Result<ExitCode> {
    if let Some(n) = args.gpu_check {
        // Discovery first, as the agent registers: the GPUs a node offers.
        let found = match crate::agent::discovery::discover(&args.nvidia_smi, "").await {
            Ok(gpus) => {
                println!("discovery: {} -L found GPUs {gpus:?}", args.nvidia_smi);
                true
            }
            Err(why) => {
                println!("discovery: {why}");
                false
            }
        };
        let smi = args.nvidia_smi.clone();
        let nvml = args.nvml_library.clone();
        let ok =
            tokio::task::spawn_blocking(move || crate::agent::gpus::check(n, &smi, &nvml)).await?;
        return Ok(if ok && found {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let config = match crate::agent::AgentSettings::load(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("flexq agent: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let format = if args.json_logs {
        LogFormat::Json
    } else {
        LogFormat::Text
    };
    crate::telemetry::init(format, "info");
    let shutdown = tokio_util::sync::CancellationToken::new();
    crate::server::cancel_on_signals(shutdown.clone());
    crate::agent::run(config, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Subcommand)]
pub enum AuthAction {
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

/// `flexq auth new-token`.
pub fn auth(action: AuthAction) -> ExitCode {
    let AuthAction::NewToken { name, role } = action;
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
        crate::engine::token_hash(&token)
    );
    ExitCode::SUCCESS
}
