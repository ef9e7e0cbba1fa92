//! Operator configuration: typed serde structs layered as built-in file
//! (`config/flexq.toml`, compiled in) → `--config PATH` → `FLEXQ_*`
//! environment variables.
//!
//! Every key is checked at load time; a bad value stops start-up with a
//! message naming the key, because a scheduler that silently falls back to a
//! default timeout or drops a region is worse than one that refuses to start.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::{Deserialize, Serialize};

mod convert;

use crate::spec::{Accelerator, RuntimeVersion};

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
}

impl Default for SchedulingConfig {
    fn default() -> SchedulingConfig {
        SchedulingConfig {
            order: QueueOrder::FairShare,
            usage_half_life: Duration::from_secs(24 * 3600),
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
    /// Not a key's fault: the config could not be read at all.
    #[error("{0}")]
    Unreadable(String),
}

impl ConfigError {
    /// A config that cannot be read at all (`what` says which).
    pub fn unreadable(what: &str, e: impl std::fmt::Display) -> ConfigError {
        ConfigError::Unreadable(format!("{what} cannot be read: {e}"))
    }
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
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

    /// The checks serde cannot express: relations between keys and ranges.
    fn check(&self) -> Result<(), ConfigError> {
        match (&self.server.tls_cert, &self.server.tls_key) {
            (Some(_), None) => {
                return Err(invalid("server.tls_key", "is needed with server.tls_cert"));
            }
            (None, Some(_)) => {
                return Err(invalid("server.tls_cert", "is needed with server.tls_key"));
            }
            (Some(cert), Some(key)) => {
                for (k, path) in [("server.tls_cert", cert), ("server.tls_key", key)] {
                    if !path.is_file() {
                        return Err(invalid(
                            k,
                            format!("{} is not a readable file", path.display()),
                        ));
                    }
                }
            }
            (None, None) => {}
        }
        for (key, v) in [
            (
                "limits.mutations_per_minute",
                self.limits.mutations_per_minute,
            ),
            ("limits.reads_per_minute", self.limits.reads_per_minute),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        let stall = self.limits.watch_stall;
        if stall < Duration::from_secs(1) || stall > Duration::from_secs(3600) {
            return Err(invalid(
                "limits.watch_stall",
                format!(
                    "{} is out of range: from 1s to 1h",
                    humantime::format_duration(stall)
                ),
            ));
        }
        for (i, p) in self.principals.iter().enumerate() {
            let key = |k: &str| format!("principals[{i}].{k}");
            if p.token_sha256.len() != 64
                || !p
                    .token_sha256
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return Err(invalid(
                    key("token_sha256"),
                    "must be 64 lowercase hex digits (the SHA-256 of the token; flexq auth new-token prints one)",
                ));
            }
            if p.name.trim().is_empty() {
                return Err(invalid(key("name"), "must not be empty"));
            }
            match p.role {
                PrincipalRole::Submitter if p.projects.is_empty() => {
                    return Err(invalid(
                        key("projects"),
                        "a submitter needs at least one project",
                    ));
                }
                PrincipalRole::Agent if p.node.is_none() => {
                    return Err(invalid(key("node"), "an agent needs the node it acts for"));
                }
                _ => {}
            }
            // In a path, "-" stands for every project (admins); "*" is a
            // quota rule's wildcard. Neither is a project to give.
            if let Some(wild) = p.projects.iter().find(|q| *q == "-" || *q == "*") {
                return Err(invalid(
                    key("projects"),
                    format!(
                        "{} is not a project id (\"-\" means every project, for admins); accepted: project ids, or role = \"admin\" for every project",
                        crate::api::quote(wild)
                    ),
                ));
            }
        }
        if self.principals.is_empty() && !self.server.bind.ip().is_loopback() {
            return Err(invalid(
                "server.bind",
                format!(
                    "{} is not a loopback address and no principals are configured: without tokens flexq serves only on loopback",
                    self.server.bind
                ),
            ));
        }
        let half_life = self.scheduling.usage_half_life;
        if half_life < Duration::from_secs(1) || half_life > MAX_USAGE_HALF_LIFE {
            return Err(invalid(
                "scheduling.usage_half_life",
                format!(
                    "{} is out of range: a duration from 1s to 365d, like \"24h\" or \"7d\"",
                    humantime::format_duration(half_life)
                ),
            ));
        }
        for (project, pc) in &self.projects {
            if let Some(w) = pc.weight {
                if !w.is_finite() || !(1.0 / MAX_WEIGHT..=MAX_WEIGHT).contains(&w) {
                    return Err(invalid(
                        format!("projects.{project}.weight"),
                        format!(
                            "{w} is not a weight: a number from 0.000001 to 1000000, like 1 or 2.5"
                        ),
                    ));
                }
            }
        }
        let p = &self.provisioning;
        if p.infrastructure_retries > crate::spec::MAX_INFRASTRUCTURE_RETRIES {
            return Err(invalid(
                "provisioning.infrastructure_retries",
                format!(
                    "{} is above the most accepted, {}",
                    p.infrastructure_retries,
                    crate::spec::MAX_INFRASTRUCTURE_RETRIES
                ),
            ));
        }
        if p.max_allocation_timeout > ALLOCATION_TIMEOUT_CEILING {
            return Err(invalid(
                "provisioning.max_allocation_timeout",
                format!(
                    "{} is above the ceiling of 2h (7200s)",
                    humantime::format_duration(p.max_allocation_timeout)
                ),
            ));
        }
        for (key, d) in [
            (
                "provisioning.max_allocation_timeout",
                p.max_allocation_timeout,
            ),
            (
                "provisioning.default_allocation_timeout",
                p.default_allocation_timeout,
            ),
        ] {
            if d.as_secs() < 1 || d.subsec_nanos() != 0 {
                return Err(invalid(
                    key,
                    format!(
                        "{} must be whole seconds, at least 1s",
                        humantime::format_duration(d)
                    ),
                ));
            }
        }
        if p.default_allocation_timeout > p.max_allocation_timeout {
            return Err(invalid(
                "provisioning.default_allocation_timeout",
                format!(
                    "{} is above provisioning.max_allocation_timeout ({}); the default is capped at the maximum, never above 2h (7200s)",
                    humantime::format_duration(p.default_allocation_timeout),
                    humantime::format_duration(p.max_allocation_timeout)
                ),
            ));
        }
        for version in self.runtimes.keys() {
            if version.parse::<RuntimeVersion>().is_err() {
                return Err(invalid(
                    format!("runtimes.\"{version}\""),
                    "a runtime version is MAJOR.MINOR, e.g. \"2.2\"",
                ));
            }
        }
        if !self.runtimes.contains_key(&self.batches.default_runtime) {
            return Err(invalid(
                "batches.default_runtime",
                format!(
                    "\"{}\" is not in [runtimes]; configured: {}",
                    self.batches.default_runtime,
                    self.runtimes.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        let ttl = self.batches.default_ttl;
        if ttl < Duration::from_secs(600) || ttl > Duration::from_secs(14 * 86400) {
            return Err(invalid(
                "batches.default_ttl",
                "must be between 10m and 14days",
            ));
        }
        let lease = self.agents.lease_duration;
        if lease < Duration::from_secs(1) || lease > Duration::from_secs(3600) {
            return Err(invalid(
                "agents.lease_duration",
                "must be between 1s and 1h",
            ));
        }
        if self.regions.is_empty() {
            return Err(invalid("regions", "at least one region must be configured"));
        }
        for (name, region) in &self.regions {
            if !crate::spec::is_resource_id(name) {
                return Err(invalid(
                    format!("regions.{name}"),
                    "a region name is lowercase letters, digits and dashes",
                ));
            }
            if region.zones.is_empty() {
                return Err(invalid(
                    format!("regions.{name}.zones"),
                    "declare at least one zone",
                ));
            }
            for (zone, z) in &region.zones {
                if !crate::spec::is_resource_id(zone) {
                    return Err(invalid(
                        format!("regions.{name}.zones.{zone}"),
                        "a zone name is lowercase letters, digits and dashes",
                    ));
                }
                for (pool_name, pool) in &z.node_pools {
                    let key = format!("regions.{name}.zones.{zone}.node_pools.{pool_name}");
                    if pool.gpus_per_node == 0 || pool.gpus_per_node > 16 {
                        return Err(invalid(format!("{key}.gpus_per_node"), "must be 1 to 16"));
                    }
                    if pool.cores == 0 || pool.memory_mb == 0 {
                        return Err(invalid(key, "cores and memory_mb must be positive"));
                    }
                    if pool.virtual_nodes > pool.max_nodes {
                        return Err(invalid(
                            format!("{key}.virtual_nodes"),
                            format!(
                                "{} is above max_nodes ({})",
                                pool.virtual_nodes, pool.max_nodes
                            ),
                        ));
                    }
                }
            }
        }
        for (key, d) in [
            (
                "server.header_read_timeout",
                self.server.header_read_timeout,
            ),
            ("server.idle_timeout", self.server.idle_timeout),
            (
                "server.grpc_message_timeout",
                self.server.grpc_message_timeout,
            ),
        ] {
            if d < Duration::from_millis(10) || d > Duration::from_secs(3600) {
                return Err(invalid(
                    key,
                    format!(
                        "{} is out of range: from 10ms to 1h",
                        humantime::format_duration(d)
                    ),
                ));
            }
        }
        if self.server.max_connections == 0 {
            return Err(invalid("server.max_connections", "must be at least 1"));
        }
        if self.server.reserved_fds < 64 {
            return Err(invalid(
                "server.reserved_fds",
                "must be at least 64 (the database, the metrics listener and the connections over server.max_connections need them)",
            ));
        }
        if self.server.max_body_bytes < 1024 {
            return Err(invalid("server.max_body_bytes", "must be at least 1024"));
        }
        if self.database.group_commit_max == 0 {
            return Err(invalid("database.group_commit_max", "must be at least 1"));
        }
        if self.database.leader_renew.is_zero()
            || self.database.leader_renew * 3 > self.database.leader_lease
        {
            return Err(invalid(
                "database.leader_renew",
                format!(
                    "{} with leader_lease {}: must be more than 0 and at most a third of the lease, so that a late renewal or two do not lose it",
                    humantime::format_duration(self.database.leader_renew),
                    humantime::format_duration(self.database.leader_lease)
                ),
            ));
        }
        if self.database.max_connections < 2 {
            return Err(invalid(
                "database.max_connections",
                "must be at least 2 (one writer, one reader)",
            ));
        }
        Ok(())
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

/// Sections a reload cannot change: they are read at start only (the
/// listeners, the database, logging). Every other section is live.
pub const RESTART_ONLY: &[&str] = &["server", "database", "log"];

/// One key a reload changes: its dotted name and its values before and
/// after (as JSON text; none where the key is absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyChange {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

impl Config {
    /// The live sections (all but [`RESTART_ONLY`]) as JSON: what every
    /// replica applies, and what the config's digest is of.
    pub fn live_value(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            for section in RESTART_ONLY {
                map.remove(*section);
            }
        }
        value
    }

    /// The SHA-256 of [`Config::live_value`], in hex (keys sorted, so equal
    /// configs have equal digests).
    pub fn digest(&self) -> String {
        use sha2::Digest;
        let text = self.live_value().to_string();
        sha2::Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// `live` (another config's [`Config::live_value`]) with this config's
    /// restart-only sections, checked as a whole.
    pub fn with_live(&self, live: &serde_json::Value) -> Result<Config, ConfigError> {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let (Some(map), Some(sections)) = (value.as_object_mut(), live.as_object()) {
            map.retain(|k, _| RESTART_ONLY.contains(&k.as_str()));
            for (k, v) in sections {
                if !RESTART_ONLY.contains(&k.as_str()) {
                    map.insert(k.clone(), v.clone());
                }
            }
        }
        let config: Config = serde_path_to_error::deserialize(value)
            .map_err(|e| invalid(e.path().to_string(), e.inner().to_string()))?;
        config.check()?;
        Ok(config)
    }

    /// What replacing `self` by `next` changes, key by key in name order:
    /// the live keys, then the restart-only ones (which a reload leaves as
    /// they are until the next start).
    pub fn changes(&self, next: &Config) -> (Vec<KeyChange>, Vec<KeyChange>) {
        let (mut old, mut new) = (BTreeMap::new(), BTreeMap::new());
        flatten(
            "",
            &serde_json::to_value(self).unwrap_or_default(),
            &mut old,
        );
        flatten(
            "",
            &serde_json::to_value(next).unwrap_or_default(),
            &mut new,
        );
        let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
        let (mut live, mut restart) = (Vec::new(), Vec::new());
        for key in keys {
            let (from, to) = (old.get(key), new.get(key));
            if from == to {
                continue;
            }
            let secret = key == "database.url";
            let show = |v: Option<&String>| {
                v.map(|v| {
                    if secret {
                        "\"(redacted)\"".to_string()
                    } else {
                        v.clone()
                    }
                })
            };
            let change = KeyChange {
                key: key.clone(),
                from: show(from),
                to: show(to),
            };
            let section = key.split(['.', '[']).next().unwrap_or_default();
            if RESTART_ONLY.contains(&section) {
                restart.push(change);
            } else {
                live.push(change);
            }
        }
        (live, restart)
    }
}

/// Leaves of a JSON value as dotted keys (`regions.r.zones.z…`, arrays as
/// `quotas[0].limit`), each with its value as JSON text.
fn flatten(prefix: &str, value: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match value {
        serde_json::Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        serde_json::Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), v, out);
            }
        }
        leaf => {
            out.insert(prefix.to_string(), leaf.to_string());
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use figment::Jail;

    #[test]
    fn embedded_default_is_valid() {
        let config = Config::load_without_env(None).expect("default config loads");
        assert_eq!(
            config.provisioning.default_allocation_timeout,
            Duration::from_secs(3600)
        );
        assert!(config.database_url().ends_with("data/flexq.db?mode=rwc"));
    }

    #[test]
    fn environment_overrides_a_key_with_humantime() {
        Jail::expect_with(|jail| {
            jail.set_env("FLEXQ_PROVISIONING__DEFAULT_ALLOCATION_TIMEOUT", "45m");
            jail.set_env("FLEXQ_PROJECT", "not-a-config-key");
            let config = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(
                config.provisioning.default_allocation_timeout,
                Duration::from_secs(45 * 60)
            );
            Ok(())
        });
    }

    #[test]
    fn default_timeout_above_the_ceiling_names_the_key() {
        Jail::expect_with(|jail| {
            jail.set_env("FLEXQ_PROVISIONING__DEFAULT_ALLOCATION_TIMEOUT", "3h");
            let err = Config::load(None).expect_err("3h is above 2h").to_string();
            assert!(
                err.contains("provisioning.default_allocation_timeout"),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn maximum_above_two_hours_is_refused() {
        Jail::expect_with(|jail| {
            jail.set_env("FLEXQ_PROVISIONING__MAX_ALLOCATION_TIMEOUT", "7201s");
            let err = Config::load(None).expect_err("above 7200s").to_string();
            assert!(err.contains("provisioning.max_allocation_timeout"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn a_malformed_value_names_the_key() {
        Jail::expect_with(|jail| {
            jail.set_env("FLEXQ_SERVER__BIND", "not-an-address");
            let err = Config::load(None).expect_err("bad bind").to_string();
            assert!(err.to_lowercase().contains("server.bind"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn an_unknown_key_in_a_file_is_refused() {
        Jail::expect_with(|jail| {
            jail.create_file("bad.toml", "[server]\nbindd = \"127.0.0.1:1\"\n")?;
            let err = Config::load_without_env(Some(Path::new("bad.toml")))
                .expect_err("unknown key")
                .to_string();
            assert!(err.contains("bindd"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn an_unknown_gpu_type_in_a_region_is_refused() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "bad.toml",
                "[regions.us-east1.zones.us-east1-b.node_pools.p]\naccelerator = \"h100\"\ngpus_per_node = 8\ncores = 96\nmemory_mb = 1\nlocal_ssd_gb = 1\nmax_nodes = 1\n",
            )?;
            let err = Config::load_without_env(Some(Path::new("bad.toml")))
                .expect_err("unknown gpu")
                .to_string();
            assert!(
                err.contains("regions.us-east1.zones.us-east1-b.node_pools.p.accelerator"),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn fair_share_keys_that_make_no_sense_are_named() {
        for (toml, key, says) in [
            (
                "[projects.team-a]\nweight = 0\n",
                "projects.team-a.weight",
                "0.000001 to 1000000",
            ),
            (
                "[projects.team-a]\nweight = -2\n",
                "projects.team-a.weight",
                "-2 is not a weight",
            ),
            (
                "[projects.team-a]\nweight = inf\n",
                "projects.team-a.weight",
                "inf is not a weight",
            ),
            (
                "[projects.team-a]\nweight = \"heavy\"\n",
                "projects.team-a.weight",
                "heavy",
            ),
            (
                "[scheduling]\nusage_half_life = \"0s\"\n",
                "scheduling.usage_half_life",
                "1s to 365d",
            ),
            (
                "[scheduling]\nusage_half_life = \"400days\"\n",
                "scheduling.usage_half_life",
                "1s to 365d",
            ),
            (
                "[scheduling]\nusage_half_life = \"soon\"\n",
                "usage_half_life",
                "soon",
            ),
            (
                "[scheduling]\norder = \"fifo\"\n",
                "scheduling.order",
                "fair-share",
            ),
        ] {
            let err = Config::with_overlay(toml).expect_err(toml).to_string();
            assert!(err.contains(key) && err.contains(says), "{toml}: {err}");
        }
        let c = Config::with_overlay(
            "[scheduling]\norder = \"strict\"\nusage_half_life = \"7d\"\n[projects.a]\nweight = 2.5\n",
        )
        .expect("valid");
        let policy = c.fair_share();
        assert_eq!(policy.order, crate::scheduler::Order::Strict);
        assert_eq!(policy.half_life, Duration::from_secs(7 * 86400));
        assert_eq!(policy.weight("a"), 2.5);
        assert_eq!(policy.weight("b"), 1.0);
    }

    #[test]
    fn a_reload_keeps_restart_only_sections_and_names_every_changed_key() {
        let in_force = Config::with_overlay(
            "[server]\nrequest_timeout = \"30s\"\n[database]\nurl = \"postgres://u:secret@db/x\"\n",
        )
        .expect("valid");
        let file = Config::with_overlay(
            "[server]\nrequest_timeout = \"40s\"\n[provisioning]\ndefault_allocation_timeout = \"30m\"\n[projects.team-a]\nweight = 2\n[[quotas]]\nproject = \"*\"\nregion = \"*\"\nmetric = \"PREEMPTIBLE_NVIDIA_L4_GPUS\"\nlimit = 3\n",
        )
        .expect("valid");
        let next = in_force.with_live(&file.live_value()).expect("applies");
        assert_eq!(next.server.request_timeout, Duration::from_secs(30));
        assert_eq!(next.database.url, in_force.database.url);
        assert_eq!(
            next.provisioning.default_allocation_timeout,
            Duration::from_secs(1800)
        );
        assert_eq!(
            next.digest(),
            file.digest(),
            "the digest is of live keys only"
        );
        assert_ne!(next.digest(), in_force.digest());
        let (live, _) = in_force.changes(&next);
        let keys: Vec<&str> = live.iter().map(|c| c.key.as_str()).collect();
        assert!(
            keys.contains(&"provisioning.default_allocation_timeout"),
            "{keys:?}"
        );
        assert!(keys.contains(&"projects.team-a.weight"), "{keys:?}");
        assert!(keys.iter().any(|k| k.starts_with("quotas[")), "{keys:?}");
        let timeout = live
            .iter()
            .find(|c| c.key == "provisioning.default_allocation_timeout")
            .expect("changed");
        assert_eq!(
            (timeout.from.as_deref(), timeout.to.as_deref()),
            (Some("\"1h\""), Some("\"30m\""))
        );
        let (_, restart) = in_force.changes(&file);
        let keys: Vec<&str> = restart.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(keys, vec!["database.url", "server.request_timeout"]);
        assert!(
            restart.iter().all(|c| !format!("{c:?}").contains("secret")),
            "{restart:?}"
        );
        // A stored generation that breaks a rule is refused naming the key.
        let mut live = file.live_value();
        live["provisioning"]["default_allocation_timeout"] = "5h".into();
        let e = in_force.with_live(&live).expect_err("above the ceiling");
        assert!(
            e.to_string()
                .contains("provisioning.default_allocation_timeout"),
            "{e}"
        );
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://flexq:s3cret@db:5432/flexq"),
            "postgres://flexq:REDACTED@db:5432/flexq"
        );
        assert_eq!(redact_url("sqlite://data/x.db"), "sqlite://data/x.db");
    }
}

#[cfg(test)]
mod principal_tests {
    use super::*;

    #[test]
    fn principals_are_checked_and_no_tokens_means_loopback_only() {
        let mut c = Config::load_without_env(None).expect("default");
        c.server.bind = "0.0.0.0:8080".parse().expect("addr");
        let e = c.check().expect_err("open bind without tokens");
        assert!(e.to_string().contains("server.bind"), "{e}");
        c.principals.push(PrincipalConfig {
            name: "a".into(),
            role: PrincipalRole::Submitter,
            projects: vec![],
            node: None,
            token_sha256: "0".repeat(64),
        });
        let e = c.check().expect_err("submitter without projects");
        assert!(e.to_string().contains("principals[0].projects"), "{e}");
        c.principals[0].projects.push("demo".into());
        c.principals[0].token_sha256 = "not-a-hash".into();
        let e = c.check().expect_err("bad hash");
        assert!(e.to_string().contains("principals[0].token_sha256"), "{e}");
        c.principals[0].token_sha256 = "a".repeat(64);
        c.check().expect("valid with a principal on 0.0.0.0");
        for wild in ["-", "*"] {
            c.principals[0].projects = vec!["demo".into(), wild.into()];
            let e = c.check().expect_err("every project is not a submitter's");
            let text = e.to_string();
            assert!(
                text.contains("principals[0].projects") && text.contains(&format!("\"{wild}\"")),
                "{text}"
            );
        }
    }
}
