//! The checks serde cannot express: relations between keys and ranges,
//! run on every config loaded or reloaded ([`Config::check`]), each error
//! naming the key. A bad value stops start-up, or refuses a reload, rather
//! than fall back to a default.

use std::time::Duration;

use super::{
    ALLOCATION_TIMEOUT_CEILING, Config, ConfigError, MAX_USAGE_HALF_LIFE, MAX_WEIGHT, PrincipalRole,
};
use crate::spec::RuntimeVersion;

impl Config {
    /// The checks serde cannot express: relations between keys and ranges.
    /// The checks serde cannot express: relations between keys and ranges.
    /// Every error is found, not only the first: one answer names them all.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        let mut errors = Vec::new();
        self.check_server_tls_and_limits(&mut errors);
        self.check_alternatives(&mut errors);
        self.check_principals(&mut errors);
        self.check_scheduling(&mut errors);
        self.check_gpu_idle(&mut errors);
        self.check_provisioning(&mut errors);
        self.check_regions(&mut errors);
        self.check_server_and_database(&mut errors);
        ConfigError::all(errors)
    }

    /// The TLS pair and the rate limits.
    fn check_server_tls_and_limits(&self, errors: &mut Vec<ConfigError>) {
        match (&self.server.tls_cert, &self.server.tls_key) {
            (Some(_), None) => {
                errors.push(invalid("server.tls_key", "is needed with server.tls_cert"));
            }
            (None, Some(_)) => {
                errors.push(invalid("server.tls_cert", "is needed with server.tls_key"));
            }
            (Some(cert), Some(key)) => {
                for (k, path) in [("server.tls_cert", cert), ("server.tls_key", key)] {
                    if !path.is_file() {
                        errors.push(invalid(
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
                errors.push(invalid(key, "must be at least 1"));
            }
        }
        let stall = self.limits.watch_stall;
        if stall < Duration::from_secs(1) || stall > Duration::from_secs(3600) {
            errors.push(invalid(
                "limits.watch_stall",
                format!(
                    "{} is out of range: from 1s to 1h",
                    humantime::format_duration(stall)
                ),
            ));
        }
    }

    /// Each principal, and that tokens guard any non-loopback bind.
    fn check_principals(&self, errors: &mut Vec<ConfigError>) {
        for (i, p) in self.principals.iter().enumerate() {
            let key = |k: &str| format!("principals[{i}].{k}");
            if p.token_sha256.len() != 64
                || !p
                    .token_sha256
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                errors.push(invalid(
                    key("token_sha256"),
                    "must be 64 lowercase hex digits (the SHA-256 of the token; flexq auth new-token prints one)",
                ));
            }
            if p.name.trim().is_empty() {
                errors.push(invalid(key("name"), "must not be empty"));
            }
            match p.role {
                PrincipalRole::Submitter if p.projects.is_empty() => {
                    errors.push(invalid(
                        key("projects"),
                        "a submitter needs at least one project",
                    ));
                }
                PrincipalRole::Agent if p.node.is_none() => {
                    errors.push(invalid(key("node"), "an agent needs the node it acts for"));
                }
                _ => {}
            }
            // In a path, "-" stands for every project (admins); "*" is a
            // quota rule's wildcard. Neither is a project to give.
            if let Some(wild) = p.projects.iter().find(|q| *q == "-" || *q == "*") {
                errors.push(invalid(
                    key("projects"),
                    format!(
                        "{} is not a project id (\"-\" means every project, for admins); accepted: project ids, or role = \"admin\" for every project",
                        crate::api::quote(wild)
                    ),
                ));
            }
        }
        if self.principals.is_empty() && !self.server.bind.ip().is_loopback() {
            errors.push(invalid(
                "server.bind",
                format!(
                    "{} is not a loopback address and no principals are configured: without tokens flexq serves only on loopback",
                    self.server.bind
                ),
            ));
        }
    }

    /// The fair-share half-life and weights.
    fn check_scheduling(&self, errors: &mut Vec<ConfigError>) {
        let half_life = self.scheduling.usage_half_life;
        if half_life < Duration::from_secs(1) || half_life > MAX_USAGE_HALF_LIFE {
            errors.push(invalid(
                "scheduling.usage_half_life",
                format!(
                    "{} is out of range: a duration from 1s to 365d, like \"24h\" or \"7d\"",
                    humantime::format_duration(half_life)
                ),
            ));
        }
        for (name, &w) in &self.scheduling.gpu_weights {
            let key = format!("scheduling.gpu_weights.{name}");
            if crate::spec::Accelerator::parse(name).is_none() {
                errors.push(invalid(
                    &key,
                    format!(
                        "{name} is not a GPU type; accepted: {}",
                        crate::spec::Accelerator::accepted_names()
                    ),
                ));
            }
            if !w.is_finite() || !(1.0 / MAX_WEIGHT..=MAX_WEIGHT).contains(&w) {
                errors.push(invalid(
                    key,
                    format!("{w} is not a weight: a number from 0.000001 to 1000000, like 1 or 3"),
                ));
            }
        }
        for (project, pc) in &self.projects {
            if let Some(w) = pc.weight {
                if !w.is_finite() || !(1.0 / MAX_WEIGHT..=MAX_WEIGHT).contains(&w) {
                    errors.push(invalid(
                        format!("projects.{project}.weight"),
                        format!(
                            "{w} is not a weight: a number from 0.000001 to 1000000, like 1 or 2.5"
                        ),
                    ));
                }
            }
        }
    }

    /// When idle GPUs warn or cancel.
    fn check_gpu_idle(&self, errors: &mut Vec<ConfigError>) {
        let idle = &self.gpu_idle;
        if !(idle.below_percent > 0.0 && idle.below_percent <= 100.0) {
            errors.push(invalid(
                "gpu_idle.below_percent",
                format!(
                    "{} is not a utilization: above 0 and at most 100 (percent) is accepted",
                    idle.below_percent
                ),
            ));
        }
        const WEEK: Duration = Duration::from_secs(7 * 86400);
        for (key, d, least) in [
            ("gpu_idle.after", idle.after, Duration::from_secs(1)),
            ("gpu_idle.warm_up", idle.warm_up, Duration::ZERO),
        ] {
            if d < least || d > WEEK {
                errors.push(invalid(
                    key,
                    format!(
                        "{} is outside what is accepted: from {} to 7d",
                        humantime::format_duration(d),
                        humantime::format_duration(least)
                    ),
                ));
            }
        }
    }

    /// Timeouts, retries, runtimes, ttl and agent leases.
    fn check_provisioning(&self, errors: &mut Vec<ConfigError>) {
        let p = &self.provisioning;
        if p.infrastructure_retries > crate::spec::MAX_INFRASTRUCTURE_RETRIES {
            errors.push(invalid(
                "provisioning.infrastructure_retries",
                format!(
                    "{} is above the most accepted, {}",
                    p.infrastructure_retries,
                    crate::spec::MAX_INFRASTRUCTURE_RETRIES
                ),
            ));
        }
        if p.max_allocation_timeout > ALLOCATION_TIMEOUT_CEILING {
            errors.push(invalid(
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
                errors.push(invalid(
                    key,
                    format!(
                        "{} must be whole seconds, at least 1s",
                        humantime::format_duration(d)
                    ),
                ));
            }
        }
        if p.default_allocation_timeout > p.max_allocation_timeout {
            errors.push(invalid(
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
                errors.push(invalid(
                    format!("runtimes.\"{version}\""),
                    "a runtime version is MAJOR.MINOR, e.g. \"2.2\"",
                ));
            }
        }
        if !self.runtimes.contains_key(&self.batches.default_runtime) {
            errors.push(invalid(
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
            errors.push(invalid(
                "batches.default_ttl",
                "must be between 10m and 14days",
            ));
        }
        let lease = self.agents.lease_duration;
        if lease < Duration::from_secs(1) || lease > Duration::from_secs(3600) {
            errors.push(invalid(
                "agents.lease_duration",
                "must be between 1s and 1h",
            ));
        }
    }

    /// Regions, zones and node pools.
    fn check_regions(&self, errors: &mut Vec<ConfigError>) {
        if self.regions.is_empty() {
            errors.push(invalid("regions", "at least one region must be configured"));
        }
        for (name, region) in &self.regions {
            if !crate::spec::is_resource_id(name) {
                errors.push(invalid(
                    format!("regions.{name}"),
                    "a region name is lowercase letters, digits and dashes",
                ));
            }
            if region.zones.is_empty() {
                errors.push(invalid(
                    format!("regions.{name}.zones"),
                    "declare at least one zone",
                ));
            }
            if let Some(p) = &region.preemption {
                check_preemption(&format!("regions.{name}.preemption"), p, errors);
            }
            let share = region.elastic.max_share;
            if !share.is_finite() || !(0.0..=1.0).contains(&share) {
                errors.push(invalid(
                    format!("regions.{name}.elastic.max_share"),
                    format!("{share} is out of range: a share of the region's GPUs from 0 to 1, like 0.5"),
                ));
            }
            for (zone, z) in &region.zones {
                if !crate::spec::is_resource_id(zone) {
                    errors.push(invalid(
                        format!("regions.{name}.zones.{zone}"),
                        "a zone name is lowercase letters, digits and dashes",
                    ));
                }
                for (pool_name, pool) in &z.node_pools {
                    let key = format!("regions.{name}.zones.{zone}.node_pools.{pool_name}");
                    if pool.gpus_per_node == 0 || pool.gpus_per_node > 16 {
                        errors.push(invalid(format!("{key}.gpus_per_node"), "must be 1 to 16"));
                    }
                    if pool.cores == 0 || pool.memory_mb == 0 {
                        errors.push(invalid(&key, "cores and memory_mb must be positive"));
                    }
                    if let Some(prov) = &pool.provisioner {
                        check_provisioner(&format!("{key}.provisioner"), pool, prov, errors);
                    }
                    if pool.virtual_nodes > pool.max_nodes {
                        errors.push(invalid(
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
    }

    /// The server's timeouts and caps, and the database's.
    fn check_server_and_database(&self, errors: &mut Vec<ConfigError>) {
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
                errors.push(invalid(
                    key,
                    format!(
                        "{} is out of range: from 10ms to 1h",
                        humantime::format_duration(d)
                    ),
                ));
            }
        }
        if self.server.max_connections == 0 {
            errors.push(invalid("server.max_connections", "must be at least 1"));
        }
        if self.server.reserved_fds < 64 {
            errors.push(invalid(
                "server.reserved_fds",
                "must be at least 64 (the database, the metrics listener and the connections over server.max_connections need them)",
            ));
        }
        if self.server.max_body_bytes < 1024 {
            errors.push(invalid("server.max_body_bytes", "must be at least 1024"));
        }
        if self.database.group_commit_max == 0 {
            errors.push(invalid("database.group_commit_max", "must be at least 1"));
        }
        if self.database.leader_renew.is_zero()
            || self
                .database
                .leader_renew
                .checked_mul(3)
                .is_none_or(|thrice| thrice > self.database.leader_lease)
        {
            errors.push(invalid(
                "database.leader_renew",
                format!(
                    "{} with leader_lease {}: must be more than 0 and at most a third of the lease, so that a late renewal or two do not lose it",
                    humantime::format_duration(self.database.leader_renew),
                    humantime::format_duration(self.database.leader_lease)
                ),
            ));
        }
        if self.database.max_connections < 2 {
            errors.push(invalid(
                "database.max_connections",
                "must be at least 2 (one writer, one reader)",
            ));
        }
    }
}

/// A config error naming `key`.
impl Config {
    /// Each alternatives parses, names served regions (its filter and its region
    /// alternatives) and keeps its delays within the longest allocation timeout.
    fn check_alternatives(&self, errors: &mut Vec<ConfigError>) {
        use crate::spec::alternatives::Target;
        let max = self.provisioning.max_allocation_timeout.as_secs();
        for (i, entry) in self.alternatives.iter().enumerate() {
            let key = |k: &str| format!("alternatives[{i}].{k}");
            let rule = match entry.rule() {
                Ok(rule) => rule,
                Err((k, e)) => {
                    errors.push(invalid(key(k), e));
                    continue;
                }
            };
            let served = |r: &str| self.regions.contains_key(r);
            let not_served = |r: &str| crate::spec::not_served(r, self.regions.keys());
            if let Some(r) = rule.region.as_deref().filter(|r| !served(r)) {
                errors.push(invalid(key("region"), not_served(r)));
            }
            let targets = rule
                .alternatives
                .iter()
                .map(|r| &r.target)
                .chain(rule.allow.iter());
            for target in targets {
                if let Target::Region(r) = target {
                    if !served(r) {
                        errors.push(invalid(
                            key("rungs"),
                            format!("{target}: {}", not_served(r)),
                        ));
                    }
                }
            }
            let mut seen = Vec::new();
            for alternative in &rule.alternatives {
                if alternative.after_s >= max {
                    errors.push(invalid(
                        key("rungs"),
                        format!(
                            "{alternative}: the delay is not within provisioning.max_allocation_timeout ({max}s), so the rung would never be tried"
                        ),
                    ));
                }
                if seen.contains(&&alternative.target) {
                    errors.push(invalid(
                        key("rungs"),
                        format!(
                            "{} is named twice; each target may appear once",
                            alternative.target
                        ),
                    ));
                }
                seen.push(&alternative.target);
            }
        }
    }
}

/// A pool's provisioner: both programs given and runnable, durations in
/// range, the warm floor within the pool.
fn check_provisioner(
    key: &str,
    pool: &super::PoolConfig,
    p: &super::ProvisionerConfig,
    errors: &mut Vec<ConfigError>,
) {
    for (k, argv) in [
        ("resume_program", &p.resume_program),
        ("suspend_program", &p.suspend_program),
    ] {
        match argv.first() {
            None => errors.push(invalid(
                format!("{key}.{k}"),
                "is empty: give the program and its arguments, like [\"/opt/flexq/resume.sh\"]",
            )),
            Some(program) => {
                if let Err(why) = runnable(program) {
                    errors.push(invalid(format!("{key}.{k}"), format!("{program}: {why}")));
                }
            }
        }
    }
    for (k, d, least) in [
        ("resume_timeout", p.resume_timeout, Duration::from_secs(1)),
        ("suspend_timeout", p.suspend_timeout, Duration::from_secs(1)),
        ("suspend_after", p.suspend_after, Duration::ZERO),
        ("backoff.base", p.backoff.base, Duration::ZERO),
        ("backoff.max", p.backoff.max, p.backoff.base),
    ] {
        if d < least || d > Duration::from_secs(7 * 24 * 3600) {
            errors.push(invalid(
                format!("{key}.{k}"),
                format!(
                    "{} is out of range: from {} to 7d",
                    humantime::format_duration(d),
                    humantime::format_duration(least)
                ),
            ));
        }
    }
    if p.min_nodes > pool.max_nodes {
        errors.push(invalid(
            format!("{key}.min_nodes"),
            format!("{} is above max_nodes ({})", p.min_nodes, pool.max_nodes),
        ));
    }
    if p.resume_rate == 0 {
        errors.push(invalid(
            format!("{key}.resume_rate"),
            "must be at least 1 node a minute",
        ));
    }
    if pool.virtual_nodes > 0 {
        errors.push(invalid(
            key.to_string(),
            "a pool with a provisioner has no virtual nodes: set virtual_nodes = 0",
        ));
    }
}

/// Whether `program` names a file that can be run: a path to an
/// executable file, or a name found on `PATH`.
fn runnable(program: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::path::Path::new(program);
    let found = if path.components().count() > 1 {
        Some(path.to_path_buf())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
    };
    let Some(found) = found else {
        return Err("not found on PATH".into());
    };
    match std::fs::metadata(&found) {
        Err(e) => Err(format!("cannot be read: {e}")),
        Ok(m) if !m.is_file() => Err("is not a file".into()),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Err("is not executable".into()),
        Ok(_) => Ok(()),
    }
}

pub(super) fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// The longest `min_runtime` and `grace` of a preemption policy.
const MAX_PREEMPTION_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// A region's preemption policy: its ranges, and a way to preempt when on.
fn check_preemption(key: &str, p: &super::PreemptionConfig, errors: &mut Vec<ConfigError>) {
    if p.enabled && !p.by_priority && !p.by_fair_share {
        errors.push(invalid(
            format!("{key}.enabled"),
            "true with neither by_priority nor by_fair_share: nothing could preempt; turn one on or set enabled = false",
        ));
    }
    let m = p.fair_share_margin;
    if !m.is_finite() || !(1.0..=100.0).contains(&m) {
        errors.push(invalid(
            format!("{key}.fair_share_margin"),
            format!("{m} is out of range: a number from 1 to 100, like 2"),
        ));
    }
    if !(1..=100).contains(&p.max_preemptions) {
        errors.push(invalid(
            format!("{key}.max_preemptions"),
            format!("{} is out of range: from 1 to 100", p.max_preemptions),
        ));
    }
    for (name, d) in [("min_runtime", p.min_runtime), ("grace", p.grace)] {
        if d > MAX_PREEMPTION_DURATION {
            errors.push(invalid(
                format!("{key}.{name}"),
                format!(
                    "{} is out of range: from 0s to 7d, like \"15m\"",
                    humantime::format_duration(d)
                ),
            ));
        }
    }
}
