//! Operator configuration: typed serde structs layered as built-in file
//! (`config/flexq.toml`, compiled in) → `--config PATH` → `FLEXQ_*`
//! environment variables.
//!
//! Every key is checked at load time; a bad value stops start-up with a
//! message naming the key, because a scheduler that silently falls back to a
//! default timeout or drops a region is worse than one that refuses to start.
//!
//! Here: the sections' types and loading them. The checks are `check.rs`,
//! what a reload may change `live.rs`, the conversion into the pure layers'
//! types `convert.rs`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::{Deserialize, Serialize};

mod check;
mod convert;
mod live;
#[cfg(test)]
mod tests;

pub use live::{KeyChange, RESTART_ONLY};

use crate::spec::Accelerator;

/// The embedded default configuration.
pub const DEFAULT_TOML: &str = include_str!("../../config/flexq.toml");

/// The hard ceiling of any allocation timeout (docs/rules.md#provisioning-and-timeouts).
pub const ALLOCATION_TIMEOUT_CEILING: Duration = Duration::from_secs(7200);

/// Top-level sections; only `FLEXQ_<SECTION>__…` variables are config, so
/// the CLI's own variables (`FLEXQ_PROJECT`, `FLEXQ_ENDPOINT`) never clash.
const SECTIONS: &[&str] = &[
    "server",
    "database",
    "provisioning",
    "batches",
    "log",
    "agents",
    "limits",
    "scheduling",
    "runtimes",
    "regions",
    "projects",
    "quotas",
    "alternatives",
];

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub database: DatabaseConfig,
    pub provisioning: ProvisioningConfig,
    pub batches: BatchesConfig,
    pub log: LogConfig,
    pub agents: AgentLeaseConfig,
    pub limits: LimitsConfig,
    /// How each region's queue is ordered. Absent: fair share, 24h.
    #[serde(default)]
    pub scheduling: SchedulingConfig,
    pub runtimes: BTreeMap<String, RuntimeEntry>,
    pub regions: BTreeMap<String, RegionConfig>,
    #[serde(default)]
    pub projects: BTreeMap<String, ProjectConfig>,
    /// Quota limits; `*` matches any project or region, the most specific
    /// rule wins. Admins override them at run time.
    #[serde(default)]
    pub quotas: Vec<crate::scheduler::QuotaRule>,
    /// Who may call the API. Without principals flexq serves only on
    /// loopback, to anyone there, as an admin.
    #[serde(default)]
    pub principals: Vec<PrincipalConfig>,
    /// Placement alternatives (docs/rules.md#placement-alternatives): where
    /// else a queued batch may run after a delay. The most specific entry
    /// that matches a batch applies. Live on reload, for batches created
    /// after it.
    #[serde(default)]
    pub alternatives: Vec<AlternativesConfig>,
    /// What to do with a batch whose GPUs idle (docs/rules.md#gpu-telemetry).
    /// Live on reload.
    #[serde(default)]
    pub gpu_idle: crate::gpu::IdlePolicy,
}

/// One `[[alternatives]]` entry: which batches (each filter absent: any),
/// their default alternatives (`"a100-40 after 15m"`, `"region europe-west4
/// after 30m"`, `"on-demand after 20m"`), and the further targets a batch
/// may name in its own alternatives (`"a100-80"`, `"region europe-west4"`,
/// `"on-demand"`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AlternativesConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<String>,
    /// Its default alternatives, as written (the key keeps the name
    /// operators know one of them by, a rung).
    #[serde(default, rename = "rungs")]
    pub alternatives: Vec<String>,
    #[serde(default)]
    pub allow: Vec<String>,
    /// When the owners of capacity a batch borrows through these
    /// alternatives may take it back (docs/rules.md#loans-and-reclaim):
    /// `"after 10m"` (the loan's minimum run; the default) or `"never"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<String>,
}

/// A principal: a bearer token (stored as its SHA-256) and what it may do.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PrincipalConfig {
    /// Recorded as `creator` on the batches it creates.
    pub name: String,
    pub role: PrincipalRole,
    /// Submitters: the projects they reach.
    #[serde(default)]
    pub projects: Vec<String>,
    /// Agents: the node they act for.
    #[serde(default)]
    pub node: Option<String>,
    /// Lowercase hex SHA-256 of the token (`flexq auth new-token` makes
    /// both). The token itself is never stored.
    pub token_sha256: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PrincipalRole {
    /// Submits and manages batches of its projects; reads their quotas.
    Submitter,
    /// Everything but the agent endpoints.
    Admin,
    /// The agent endpoints, for its node only.
    Agent,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub bind: SocketAddr,
    /// Where Prometheus scrapes `/metrics` (a listener of its own, so the
    /// API's exposure and the metrics' can differ).
    pub metrics_bind: SocketAddr,
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    pub max_body_bytes: usize,
    /// PEM certificate chain and private key: with both, the API listener
    /// serves HTTPS only.
    #[serde(default)]
    pub tls_cert: Option<std::path::PathBuf>,
    #[serde(default)]
    pub tls_key: Option<std::path::PathBuf>,
    /// A request's head (and a TLS handshake, and a connection's first
    /// request) must arrive within this. On HTTP/1.1 hyper's timer also
    /// runs while a kept-alive connection waits for its next request.
    #[serde(default = "default_header_read_timeout", with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    #[serde(default = "default_idle_timeout", with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Each gRPC request message, and the end of the request stream, must
    /// arrive within this of the call's start or of the message before.
    #[serde(default = "default_grpc_message_timeout", with = "humantime_serde")]
    pub grpc_message_timeout: Duration,
    /// Most connections served at once on the API listener; lowered to the
    /// descriptor limit less `reserved_fds`. Beyond, a connection is
    /// answered only on `/healthz` and `/readyz`.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// File descriptors kept out of the API's connections: for the
    /// database, the metrics listener and the connections over the cap.
    #[serde(default = "default_reserved_fds")]
    pub reserved_fds: u64,
}

fn default_header_read_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}

fn default_grpc_message_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_max_connections() -> usize {
    4096
}

fn default_reserved_fds() -> u64 {
    128
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    pub data_dir: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    pub max_connections: u32,
    pub group_commit_max: usize,
    #[serde(with = "humantime_serde")]
    pub leader_lease: Duration,
    #[serde(with = "humantime_serde")]
    pub leader_renew: Duration,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvisioningConfig {
    #[serde(with = "humantime_serde")]
    pub default_allocation_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub max_allocation_timeout: Duration,
    /// How many times a batch goes back to the queue after a failure of the
    /// infrastructure (its node lost, its agent restarted without it); 0
    /// (the default) fails it, as the managed service does. A batch sets
    /// its own with the label `flexq-infrastructure-retries`.
    #[serde(default)]
    pub infrastructure_retries: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchesConfig {
    pub default_runtime: String,
    #[serde(with = "humantime_serde")]
    pub default_ttl: Duration,
    pub max_properties: usize,
    pub max_property_key_bytes: usize,
    pub max_property_value_bytes: usize,
}

/// Per-project limits, so no project can crowd out the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Creates, deletes and cancels per minute, per project and region.
    pub mutations_per_minute: u32,
    /// Gets and lists (output reads included) per minute, per project and
    /// region.
    pub reads_per_minute: u32,
    /// Batches of one project waiting in the queue at once (all regions).
    pub max_pending_per_project: u64,
    /// Event-stream watchers (`...batches:watch`) served at once by this
    /// replica; beyond, a watch is refused RESOURCE_EXHAUSTED.
    #[serde(default = "default_max_watchers")]
    pub max_watchers: usize,
    /// A watcher that has not read what it was sent for this long is
    /// dropped (its events are not buffered without bound).
    #[serde(default = "default_watch_stall", with = "humantime_serde")]
    pub watch_stall: Duration,
}

fn default_max_watchers() -> usize {
    1000
}

fn default_watch_stall() -> Duration {
    Duration::from_secs(30)
}

/// How each region's queue is ordered (docs/rules.md#fair-share-order).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulingConfig {
    pub order: QueueOrder,
    /// How fast past GPU usage is forgotten: usage counts half after one
    /// half-life, a quarter after two.
    #[serde(with = "humantime_serde")]
    pub usage_half_life: Duration,
    /// What one GPU-hour of each type counts in the fair-share usage and
    /// the usage report's weighted hours, by flexq's GPU name (`l4`,
    /// `a100-40`, `a100-80`); a type not named counts 1.
    #[serde(default)]
    pub gpu_weights: BTreeMap<String, f64>,
}

impl Default for SchedulingConfig {
    fn default() -> SchedulingConfig {
        SchedulingConfig {
            order: QueueOrder::FairShare,
            usage_half_life: Duration::from_secs(24 * 3600),
            gpu_weights: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum QueueOrder {
    /// The project with the lowest decayed usage ÷ weight first; within a
    /// project, priority then age.
    FairShare,
    /// Priority then age across projects.
    Strict,
}

/// The longest usage half-life accepted: beyond a year usage would never
/// be forgotten in practice.
pub const MAX_USAGE_HALF_LIFE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The largest fair-share weight accepted (and 1/it the smallest).
pub const MAX_WEIGHT: f64 = 1e6;

/// The server's `[agents]` section: how long a node's agent lease lasts
/// without a heartbeat, and how much of a batch's driver output is kept.
/// (The agent's own file is `agent::AgentSettings`.)
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentLeaseConfig {
    /// A node whose agent has not heartbeated for this long is lost: its
    /// capacity returns and its batches fail.
    #[serde(with = "humantime_serde")]
    pub lease_duration: Duration,
    /// Driver output kept per batch; beyond it output is dropped and the
    /// batch's runtimeInfo says so.
    pub max_output_bytes: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    pub filter: String,
}

/// What a runtime version carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeEntry {
    pub spark: String,
    pub rapids: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xgboost: Option<String>,
}

/// A region: its zones, each with node pools.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionConfig {
    pub zones: BTreeMap<String, ZoneConfig>,
    /// Whether and how a blocked batch may stop running clusters
    /// (docs/rules.md#preemption). Absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<PreemptionConfig>,
    /// Whether and how far elastic batches grow beyond their core gang
    /// (docs/rules.md#elastic-batches).
    #[serde(default)]
    pub elastic: ElasticConfig,
}

/// `[regions.NAME.elastic]`: extras for batches with Spark's dynamic
/// allocation on, live on reload.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ElasticConfig {
    /// Whether extras are granted in the region (those held stay until
    /// Spark wants fewer or their batch ends).
    pub enabled: bool,
    /// The most of the region's GPUs extras may hold at once, 0 to 1.
    pub max_share: f64,
}

impl Default for ElasticConfig {
    fn default() -> ElasticConfig {
        ElasticConfig {
            enabled: true,
            max_share: 0.5,
        }
    }
}

/// `[regions.NAME.preemption]`: every key has its default, and the region
/// preempts only once `enabled` is true.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PreemptionConfig {
    pub enabled: bool,
    /// A batch of strictly higher `flexq-priority` may preempt.
    pub by_priority: bool,
    /// A project under its fair share may reclaim from one over it.
    pub by_fair_share: bool,
    /// How far over: the preemptor's usage ÷ weight times this must be
    /// below the victim's.
    pub fair_share_margin: f64,
    /// A cluster that has run less than this is never a victim.
    #[serde(with = "humantime_serde")]
    pub min_runtime: Duration,
    /// After this many preemptions a batch is never a victim again.
    pub max_preemptions: u32,
    /// How long a victim has to stop cleanly before it is killed.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    /// Whether a batch may declare itself not preemptible
    /// (`spark.flexq.preemptible=false`).
    pub allow_opt_out: bool,
}

impl Default for PreemptionConfig {
    fn default() -> PreemptionConfig {
        PreemptionConfig {
            enabled: false,
            by_priority: true,
            by_fair_share: false,
            fair_share_margin: 2.0,
            min_runtime: Duration::from_secs(15 * 60),
            max_preemptions: 2,
            grace: Duration::from_secs(60),
            allow_opt_out: true,
        }
    }
}

impl RegionConfig {
    /// The GPU types the region offers: those of its node pools.
    pub fn accelerators(&self) -> Vec<Accelerator> {
        let mut out: Vec<Accelerator> = self
            .zones
            .values()
            .flat_map(|z| z.node_pools.values().map(|p| p.accelerator))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneConfig {
    pub node_pools: BTreeMap<String, PoolConfig>,
}

/// A pool of identical GPU nodes in a zone: the declared capacity agents
/// register into.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub accelerator: Accelerator,
    pub gpus_per_node: u32,
    pub cores: u32,
    pub memory_mb: u64,
    pub local_ssd_gb: u64,
    /// The declared capacity: at most this many nodes.
    pub max_nodes: u32,
    /// Nodes the operator declares without agents, for simulation and
    /// benchmarks. Shown as virtual everywhere.
    #[serde(default)]
    pub virtual_nodes: u32,
    /// The programs that create and delete this pool's nodes, and when
    /// flexq runs them (docs/rules.md#provisioned-capacity). None: the
    /// pool is the nodes that registered, as an operator keeps them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioner: Option<ProvisionerConfig>,
}

/// A pool's provisioner (docs/rules.md#provisioned-capacity): flexq decides
/// when nodes are created and deleted, the operator's programs do it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvisionerConfig {
    /// The argv run to create nodes; it reads a JSON manifest on stdin
    /// (the batch, the slots' node ids, the shape, the latest
    /// registration time) and starts an agent per slot, with the slot's
    /// id as its `node_id`.
    pub resume_program: Vec<String>,
    /// The argv run to delete nodes; it reads a JSON manifest on stdin
    /// (the node ids and why).
    pub suspend_program: Vec<String>,
    /// How long every slot of a set has to register, from the decision.
    #[serde(default = "default_resume_timeout", with = "humantime_serde")]
    pub resume_timeout: Duration,
    /// How long the suspend program has to finish.
    #[serde(default = "default_suspend_timeout", with = "humantime_serde")]
    pub suspend_timeout: Duration,
    /// How long a node holds nothing before it is suspended.
    #[serde(default = "default_suspend_after", with = "humantime_serde")]
    pub suspend_after: Duration,
    /// Nodes never suspended below this count: a warm floor.
    #[serde(default)]
    pub min_nodes: u32,
    /// At most this many nodes asked of the resume program per minute
    /// (a set larger than the rate goes alone once a minute passed with
    /// none).
    #[serde(default = "default_resume_rate")]
    pub resume_rate: u32,
    /// After a set fails (a stock-out, a slot that never registered), the
    /// pool is not asked again for `base`, doubling on each failure in a
    /// row up to `max`.
    #[serde(default)]
    pub backoff: BackoffConfig,
    /// Where the pool's boot time (the p90 of its recent sets) is above
    /// this, preemption is tried before new nodes; none: new nodes first.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde"
    )]
    pub preempt_if_boot_over: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackoffConfig {
    #[serde(default = "default_backoff_base", with = "humantime_serde")]
    pub base: Duration,
    #[serde(default = "default_backoff_max", with = "humantime_serde")]
    pub max: Duration,
}

impl Default for BackoffConfig {
    fn default() -> BackoffConfig {
        BackoffConfig {
            base: default_backoff_base(),
            max: default_backoff_max(),
        }
    }
}

fn default_resume_timeout() -> Duration {
    Duration::from_secs(600)
}

fn default_suspend_timeout() -> Duration {
    Duration::from_secs(120)
}

fn default_suspend_after() -> Duration {
    Duration::from_secs(600)
}

fn default_resume_rate() -> u32 {
    300
}

fn default_backoff_base() -> Duration {
    Duration::from_secs(60)
}

fn default_backoff_max() -> Duration {
    Duration::from_secs(1800)
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectConfig {
    /// Organisation policy `constraints/compute.requireShieldedVm`.
    #[serde(default)]
    pub require_shielded_vm: bool,
    /// Fair-share weight: a project of weight 2 gets twice the GPU-hours
    /// of one of weight 1 when both wait. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
}

/// A configuration that cannot be used; the message names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Parse(#[from] Box<figment::Error>),
    #[error("config key `{key}`: {message}")]
    Invalid { key: String, message: String },
    /// Several keys are invalid: every one, in the order checked.
    #[error("{} errors: {}", .0.len(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Several(Vec<ConfigError>),
    /// Not a key's fault: the config could not be read at all.
    #[error("{0}")]
    Unreadable(String),
}

impl ConfigError {
    /// What the checks found: nothing, one error, or several.
    pub(super) fn all(mut errors: Vec<ConfigError>) -> Result<(), ConfigError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(ConfigError::Several(errors)),
        }
    }

    /// The keys the error names, in order (none when the config could not
    /// be read at all).
    pub fn keys(&self) -> Vec<&str> {
        match self {
            ConfigError::Invalid { key, .. } => vec![key.as_str()],
            ConfigError::Several(all) => all.iter().flat_map(ConfigError::keys).collect(),
            ConfigError::Parse(_) | ConfigError::Unreadable(_) => Vec::new(),
        }
    }

    /// A config that cannot be read at all (`what` says which).
    pub fn unreadable(what: &str, e: impl std::fmt::Display) -> ConfigError {
        ConfigError::Unreadable(format!("{what} cannot be read: {e}"))
    }
}

impl Config {
    /// Loads the embedded default, then `file` if given, then `FLEXQ_*`
    /// variables from the process environment.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        Self::load_with_env(file, Env::prefixed("FLEXQ_"))
    }

    /// Loads the embedded default and `file` only, ignoring the environment
    /// (tests and benchmarks that must not be steered by the caller's shell).
    pub fn load_without_env(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(file) = file {
            figment = figment.merge(Toml::file_exact(file));
        }
        Self::extract(figment)
    }

    /// The embedded default with `toml` layered over it, no environment
    /// (tests and the simulator's examples).
    pub fn with_overlay(toml: &str) -> Result<Config, ConfigError> {
        Self::extract(Figment::from(Toml::string(DEFAULT_TOML)).merge(Toml::string(toml)))
    }

    fn load_with_env(file: Option<&Path>, env: Env) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(file) = file {
            figment = figment.merge(Toml::file_exact(file));
        }
        let env = env
            .filter(|key| {
                let section = key.as_str().split("__").next().unwrap_or_default();
                SECTIONS.iter().any(|s| s.eq_ignore_ascii_case(section))
            })
            .split("__");
        Self::extract(figment.merge(env))
    }

    fn extract(figment: Figment) -> Result<Config, ConfigError> {
        let config: Config = figment.extract().map_err(Box::new)?;
        config.check()?;
        Ok(config)
    }

    /// A config layer giving `zone`'s `pool` `n` virtual nodes and every
    /// other pool none: a known capacity, for benchmarks and tests.
    pub fn virtual_nodes_only(&self, zone: &str, pool: &str, n: u32) -> String {
        let mut text = String::new();
        for (region, r) in &self.regions {
            for (z, zc) in &r.zones {
                for p in zc.node_pools.keys() {
                    let count = if z == zone && p == pool { n } else { 0 };
                    text.push_str(&format!(
                        "[regions.{region}.zones.{z}.node_pools.{p}]\nvirtual_nodes = {count}\n"
                    ));
                }
            }
        }
        text
    }

    /// The database URL in effect: the configured one, or the SQLite file
    /// under the data directory.
    pub fn database_url(&self) -> String {
        match &self.database.url {
            Some(url) => url.clone(),
            None => format!(
                "sqlite://{}?mode=rwc",
                self.database.data_dir.join("flexq.db").display()
            ),
        }
    }

    /// The effective configuration as TOML, with secrets redacted.
    pub fn to_toml(&self) -> String {
        let mut shown = self.clone();
        if let Some(url) = &shown.database.url {
            shown.database.url = Some(redact_url(url));
        }
        toml::to_string_pretty(&shown).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

/// Hides a password in `scheme://user:password@host/...`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:REDACTED@{host}")
        }
        _ => url.to_string(),
    }
}
