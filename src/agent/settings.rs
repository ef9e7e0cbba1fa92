//! The agent's own settings, read from its file: `config/agent.toml`
//! documents every key; any key can be overridden by `FLEXQ_AGENT_<KEY>`
//! (e.g. FLEXQ_AGENT_SERVER). (The server's `[agents]` section is
//! `config::AgentLeaseConfig`.)

use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

/// The agent's file, after defaults and `FLEXQ_AGENT_*` overrides.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentSettings {
    /// Base URL of the flexq server.
    pub server: String,
    /// A file holding this agent's bearer token (a principal with role
    /// agent and this node); empty: none (a server without principals).
    #[serde(default)]
    pub token_file: PathBuf,
    /// A PEM CA certificate that signed the server's (an https:// server
    /// with a private CA); empty: the system's roots.
    #[serde(default)]
    pub ca_file: PathBuf,
    /// This node's id (1 to 63 of [a-z0-9-]); default: the host name.
    #[serde(default)]
    pub node_id: String,
    pub region: String,
    pub zone: String,
    /// The node pool (of the server's config) this node belongs to.
    pub pool: String,
    /// What this node offers besides its GPUs.
    pub cores: u32,
    pub memory_mb: u64,
    pub local_ssd_gb: u64,
    /// A script printing `{"name":"gpu","addresses":[...]}` (Spark's
    /// format); empty: `nvidia-smi -L`.
    #[serde(default)]
    pub gpu_discovery_script: String,
    /// The address other nodes reach this one at (Spark master, driver).
    pub advertise_host: String,
    /// Where each batch's scripts, logs and Spark scratch go.
    pub work_dir: PathBuf,
    /// Spark's installation; empty: $SPARK_HOME, else the pyspark package
    /// of `python`.
    #[serde(default)]
    pub spark_home: String,
    /// The RAPIDS Accelerator jar. Where it is missing, batches run on
    /// plain Spark and say so.
    pub rapids_jar: PathBuf,
    /// The Python of PySpark drivers and workers.
    pub python: String,
    /// After SIGTERM, how long Spark processes get before SIGKILL.
    #[serde(with = "humantime_serde")]
    pub stop_grace: Duration,
    /// How long one assignment poll waits on the server.
    #[serde(with = "humantime_serde")]
    pub poll_wait: Duration,
    /// How long an elastic batch's extra executor's Spark worker may have
    /// no executor before the extra goes back
    /// (docs/rules.md#elastic-batches).
    #[serde(with = "humantime_serde")]
    pub extra_idle: Duration,
    /// How the GPUs' utilization is read (docs/rules.md#gpu-telemetry).
    pub gpu_telemetry: GpuTelemetrySource,
    /// The `nvidia-smi` program the `nvidia-smi` reader runs.
    pub nvidia_smi: String,
    /// The NVML library the NVML reader loads (a path, or a name the
    /// dynamic loader finds); empty: the system's (`libnvidia-ml.so.1`).
    #[serde(default)]
    pub nvml_library: String,
    /// How often the GPUs are read.
    #[serde(with = "humantime_serde")]
    pub gpu_sample_interval: Duration,
    /// How batches run: a per-batch Spark standalone cluster on the
    /// allocated nodes, or Spark Operator `SparkApplication`s.
    pub launcher: Launcher,
    /// The Kubernetes launcher's settings.
    pub kubernetes: KubernetesConfig,
}

/// Which GPU reader the agent uses.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum GpuTelemetrySource {
    /// NVML, else `nvidia-smi`, else none (said once).
    Auto,
    Nvml,
    NvidiaSmi,
    Off,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Launcher {
    Standalone,
    Kubernetes,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// The API server; in a pod, the in-cluster address.
    pub api_server: String,
    /// A bearer token file (a service account's); empty: none.
    pub token_file: PathBuf,
    /// The API server's CA certificate (PEM); empty or missing: the
    /// system's roots.
    pub ca_file: PathBuf,
    pub namespace: String,
    /// The Spark image (with the RAPIDS jar) for batches that do not set
    /// runtimeConfig.containerImage.
    pub image: String,
    pub service_account: String,
    /// The RAPIDS jar inside the image; empty: the image has none.
    pub rapids_jar: String,
    pub spark_version: String,
    /// How often an application's status is read.
    #[serde(with = "humantime_serde")]
    pub status_interval: Duration,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            api_server: "https://kubernetes.default.svc".into(),
            token_file: PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount/token"),
            ca_file: PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"),
            namespace: "spark-jobs".into(),
            image: "nvcr.io/nvidia/rapidsai/spark:latest".into(),
            service_account: "spark".into(),
            rapids_jar: "/opt/sparkRapidsPlugin/rapids-4-spark.jar".into(),
            spark_version: "3.5.1".into(),
            status_interval: Duration::from_secs(2),
        }
    }
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            server: "http://127.0.0.1:8080".into(),
            token_file: PathBuf::new(),
            ca_file: PathBuf::new(),
            node_id: String::new(),
            region: String::new(),
            zone: String::new(),
            pool: String::new(),
            cores: 0,
            memory_mb: 0,
            local_ssd_gb: 0,
            gpu_discovery_script: String::new(),
            advertise_host: "127.0.0.1".into(),
            work_dir: PathBuf::from("agent-work"),
            spark_home: String::new(),
            rapids_jar: PathBuf::from("/opt/rapids/rapids-4-spark.jar"),
            python: "python3".into(),
            stop_grace: Duration::from_secs(5),
            poll_wait: Duration::from_secs(20),
            extra_idle: Duration::from_secs(30),
            gpu_telemetry: GpuTelemetrySource::Auto,
            nvidia_smi: "nvidia-smi".into(),
            nvml_library: String::new(),
            gpu_sample_interval: Duration::from_secs(5),
            launcher: Launcher::Standalone,
            kubernetes: KubernetesConfig::default(),
        }
    }
}

impl AgentSettings {
    /// Defaults, then `file`, then FLEXQ_AGENT_* variables.
    pub fn load(file: Option<&Path>) -> Result<AgentSettings, String> {
        let mut figment = Figment::from(Serialized::defaults(AgentSettings::default()));
        if let Some(file) = file {
            figment = figment.merge(Toml::file_exact(file));
        }
        let mut config: AgentSettings = figment
            .merge(Env::prefixed("FLEXQ_AGENT_"))
            .extract()
            .map_err(|e| e.to_string())?;
        if config.node_id.is_empty() {
            config.node_id = std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_ascii_lowercase())
                .unwrap_or_default();
        }
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        let missing: Vec<&str> = [
            ("region", self.region.is_empty()),
            ("zone", self.zone.is_empty()),
            ("pool", self.pool.is_empty()),
            ("node_id", self.node_id.is_empty()),
        ]
        .into_iter()
        .filter_map(|(k, empty)| empty.then_some(k))
        .collect();
        if !missing.is_empty() {
            return Err(format!(
                "agent config: {} must be set (in the file or as FLEXQ_AGENT_<KEY>)",
                missing.join(", ")
            ));
        }
        for (key, v) in [
            ("cores", u64::from(self.cores)),
            ("memory_mb", self.memory_mb),
            ("local_ssd_gb", self.local_ssd_gb),
        ] {
            if v == 0 {
                return Err(format!("agent config: {key} must be at least 1"));
            }
        }
        if self.poll_wait < Duration::from_secs(1) {
            return Err("agent config: poll_wait must be at least 1s".into());
        }
        if self.gpu_sample_interval < Duration::from_millis(100)
            || self.gpu_sample_interval > Duration::from_secs(600)
        {
            return Err(format!(
                "agent config: gpu_sample_interval is {}; from 100ms to 10m is accepted",
                humantime::format_duration(self.gpu_sample_interval)
            ));
        }
        if !self.server.starts_with("http://") && !self.server.starts_with("https://") {
            return Err(format!(
                "agent config: server {:?} must be an http:// or https:// URL",
                self.server
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<AgentSettings, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, text).expect("write");
        AgentSettings::load(Some(&path))
    }

    const GOOD: &str = "node_id = \"n1\"\nregion = \"r\"\nzone = \"z\"\npool = \"l4\"\ncores = 8\nmemory_mb = 1024\nlocal_ssd_gb = 375\n";

    #[test]
    fn bad_agent_configs_name_the_key() {
        let c = load(GOOD).expect("good config");
        assert_eq!(c.launcher, Launcher::Standalone);
        assert_eq!(c.poll_wait, Duration::from_secs(20));
        let e = load(&GOOD.replace("region = \"r\"\n", "")).expect_err("no region");
        assert!(e.contains("region must be set"), "{e}");
        let e = load(&GOOD.replace("cores = 8", "cores = 0")).expect_err("no cores");
        assert!(e.contains("cores must be at least 1"), "{e}");
        let e = load(&format!("{GOOD}server = \"127.0.0.1:8080\"\n")).expect_err("url");
        assert!(e.contains("http://"), "{e}");
        let e = load(&format!("{GOOD}poll_wiat = \"5s\"\n")).expect_err("typo");
        assert!(e.contains("poll_wiat"), "{e}");
        let e = load(&format!("{GOOD}launcher = \"yarn\"\n")).expect_err("launcher");
        assert!(e.contains("yarn"), "{e}");
        let e = load(&format!("{GOOD}stop_grace = \"soon\"\n")).expect_err("duration");
        assert!(e.contains("stop_grace"), "{e}");
        assert_eq!(c.gpu_telemetry, GpuTelemetrySource::Auto);
        assert_eq!(c.nvml_library, "", "the system's NVML by default");
        let n = load(&format!(
            "{GOOD}nvml_library = \"/opt/nvidia/libnvidia-ml.so.1\"\n"
        ))
        .expect("nvml_library");
        assert_eq!(n.nvml_library, "/opt/nvidia/libnvidia-ml.so.1");
        let e = load(&format!("{GOOD}gpu_telemetry = \"dcgm\"\n")).expect_err("reader");
        assert!(e.contains("dcgm"), "{e}");
        let e = load(&format!("{GOOD}gpu_sample_interval = \"1h\"\n")).expect_err("interval");
        assert!(e.contains("gpu_sample_interval is 1h"), "{e}");
    }
}
