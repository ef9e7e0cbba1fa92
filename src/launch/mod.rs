//! How an allocated batch becomes Spark work
//! (docs/rules.md#running-on-spark), independent of
//! where it runs: the Spark configuration of a batch, the `spark-submit`
//! command line of its driver, the discovery script that shows a Spark
//! worker exactly the GPUs it was given, and what a failed driver's output
//! says went wrong. The agent's standalone launcher ([`crate::agent`]) and
//! the Kubernetes launcher ([`k8s`]) both build on this.

pub mod fallback;
pub(crate) mod k8s;
mod summary;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use summary::failure_summary;

use crate::api::Batch;
use crate::spec::{ClusterRequest, NodeShape, Workload};

/// The RAPIDS Accelerator's SQL plugin class.
pub const RAPIDS_PLUGIN: &str = "com.nvidia.spark.SQLPlugin";

/// What an agent needs to launch one batch: the user's workload and the
/// shape the scheduler allocated for it. Travels in the driver's
/// assignment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SparkJob {
    /// `projects/P/locations/R/batches/B`.
    pub batch: String,
    pub uuid: String,
    pub spec: Batch,
    pub cluster: ClusterRequest,
}

/// Whether the RAPIDS Accelerator can be used where the driver runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rapids {
    /// The jar is installed at this path.
    Jar(String),
    /// It is not: the batch runs on plain Spark, and says so.
    Missing { reason: String },
}

impl Rapids {
    /// What the batch's history and `runtimeInfo` say about it.
    pub fn describe(&self) -> String {
        match self {
            Rapids::Jar(path) => format!("enabled ({path})"),
            Rapids::Missing { reason } => format!(
                "not available: {reason}; the batch ran on Spark without the RAPIDS Accelerator"
            ),
        }
    }
}

fn mb(v: u64) -> String {
    format!("{v}m")
}

/// GPUs per task: the executor's GPUs shared by its cores (docs/rules.md#running-on-spark).
fn task_gpu_amount(executor: &NodeShape) -> String {
    let v = f64::from(executor.gpus) / f64::from(executor.cores.max(1));
    // Spark takes a decimal; keep it short and exact for the usual shapes.
    let s = format!("{v:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The Spark configuration of a batch: flexq's defaults of docs/rules.md#running-on-spark and the
/// allocated shape, then every `spark.*` property of the user on top (user
/// properties win). `spark.dataproc.*` keys are flexq's, not Spark's, and
/// are not passed on.
pub fn spark_conf(job: &SparkJob, rapids: &Rapids) -> BTreeMap<String, String> {
    let c = &job.cluster;
    let mut conf = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        conf.insert(k.to_string(), v);
    };
    set("spark.app.name", job.batch.clone());
    set("spark.submit.deployMode", "client".into());
    set("spark.executor.instances", c.executor_count.to_string());
    set("spark.executor.cores", c.executor.cores.to_string());
    // Standalone hands out executors until this many cores are used.
    set(
        "spark.cores.max",
        (u64::from(c.executor.cores) * u64::from(c.executor_count)).to_string(),
    );
    set("spark.executor.memory", mb(c.executor.memory_mb));
    set(
        "spark.executor.memoryOverhead",
        mb(c.executor.memory_overhead_mb),
    );
    // The whole cluster was allocated at once: start the job once every
    // executor is there, not on the first one.
    set("spark.scheduler.minRegisteredResourcesRatio", "1.0".into());
    set("spark.driver.cores", c.driver.cores.to_string());
    set("spark.driver.memory", mb(c.driver.memory_mb));
    if c.executor.gpus > 0 {
        set(
            "spark.executor.resource.gpu.amount",
            c.executor.gpus.to_string(),
        );
        set(
            "spark.task.resource.gpu.amount",
            task_gpu_amount(&c.executor),
        );
        set("spark.executor.resource.gpu.vendor", "nvidia.com".into());
        if let Rapids::Jar(_) = rapids {
            set("spark.plugins", RAPIDS_PLUGIN.into());
            set("spark.rapids.sql.enabled", "true".into());
            // What could not run on the GPU goes to the driver's log, where
            // the agent counts it (unless the batch sets it otherwise).
            set(fallback::EXPLAIN_KEY, fallback::EXPLAIN_VALUE.into());
        }
    }
    if c.driver.gpus > 0 {
        set(
            "spark.driver.resource.gpu.amount",
            c.driver.gpus.to_string(),
        );
        set("spark.driver.resource.gpu.vendor", "nvidia.com".into());
    }
    if c.dynamic_allocation {
        // Without an external shuffle service, Spark gives executors back
        // only when it tracks their shuffle files (the batch may say
        // otherwise).
        conf.insert(
            "spark.dynamicAllocation.shuffleTracking.enabled".into(),
            "true".into(),
        );
    }
    for (k, v) in job.spec.properties() {
        if k.starts_with("spark.") && !k.starts_with("spark.dataproc.") {
            conf.insert(k.clone(), v.clone());
        }
    }
    if c.dynamic_allocation {
        // Never beyond what was allocated: an executor Spark asks for past
        // the cluster would land on GPUs the ledger counts as free
        // (docs/rules.md#dynamic-allocation). Over the batch's own value.
        conf.insert(
            crate::spec::MAX_EXECUTORS_KEY.into(),
            c.executor_count.to_string(),
        );
    }
    conf
}

/// The file of Spark's executor target in the driver's CSV metrics
/// directory, after its namespace (the application id by default):
/// rows `unix-seconds,executors`. Spark 4's ExecutorAllocationManager
/// gauge `numberTargetExecutors`, which the standalone launcher reads to
/// report an elastic batch's demand.
pub const TARGET_EXECUTORS_CSV: &str =
    ".driver.ExecutorAllocationManager.executors.numberTargetExecutors.csv";

/// On the standalone launcher, an elastic batch
/// (docs/rules.md#elastic-batches) is not capped at its core gang:
/// `spark.dynamicAllocation.maxExecutors` is the core plus its most
/// extras (its own value), `spark.cores.max` follows, and the job starts
/// once the core's executors registered (not every one it may have).
/// Spark writes its metrics as CSV into `metrics_dir` every second (the
/// agent reads its executor target there), and decommissions executors
/// gracefully, migrating their shuffle and cached blocks (unless the
/// batch says otherwise). Nothing changes for a batch that cannot grow.
/// An executor beyond the extras granted has no worker to run on: the
/// batch's master has only the workers flexq started.
pub fn grow_beyond_core(
    conf: &mut BTreeMap<String, String>,
    c: &ClusterRequest,
    metrics_dir: &str,
) {
    if !c.dynamic_allocation || c.max_extras == 0 {
        return;
    }
    let most = c.executor_count.saturating_add(c.max_extras);
    conf.insert(crate::spec::MAX_EXECUTORS_KEY.into(), most.to_string());
    conf.insert(
        "spark.cores.max".into(),
        (u64::from(c.executor.cores) * u64::from(most)).to_string(),
    );
    let ratio = f64::from(c.executor_count) / f64::from(most.max(1));
    conf.insert(
        "spark.scheduler.minRegisteredResourcesRatio".into(),
        format!("{ratio:.4}"),
    );
    for key in [
        "spark.decommission.enabled",
        "spark.storage.decommission.enabled",
        "spark.storage.decommission.shuffleBlocks.enabled",
        "spark.storage.decommission.rddBlocks.enabled",
    ] {
        conf.entry(key.into()).or_insert_with(|| "true".into());
    }
    let sink = "spark.metrics.conf.driver.sink.csv";
    conf.insert(
        format!("{sink}.class"),
        "org.apache.spark.metrics.sink.CsvSink".into(),
    );
    conf.insert(format!("{sink}.period"), "1".into());
    conf.insert(format!("{sink}.unit"), "seconds".into());
    conf.insert(format!("{sink}.directory"), metrics_dir.into());
}

/// Environment variables the user asked for on the driver
/// (`spark.dataproc.driverEnv.NAME`).
pub fn driver_env(job: &SparkJob) -> Vec<(String, String)> {
    job.spec
        .properties()
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix("spark.dataproc.driverEnv.")
                .map(|name| (name.to_string(), v.clone()))
        })
        .collect()
}

/// A `file://` URI or a plain path as a local path; other schemes as given
/// (Spark fetches what it can, and says so when it cannot).
fn local(uri: &str) -> String {
    uri.strip_prefix("file://").unwrap_or(uri).to_string()
}

fn joined(uris: &[String]) -> Option<String> {
    (!uris.is_empty()).then(|| uris.iter().map(|u| local(u)).collect::<Vec<_>>().join(","))
}

/// The arguments of `spark-submit` (after the program name) for the driver
/// of `job` against `master`, with `conf` and the jars the node adds.
pub fn submit_args(
    job: &SparkJob,
    master: &str,
    conf: &BTreeMap<String, String>,
    extra_jars: &[String],
) -> Vec<String> {
    let mut args = vec!["--master".to_string(), master.to_string()];
    for (k, v) in conf {
        args.push("--conf".into());
        args.push(format!("{k}={v}"));
    }
    let spec = &job.spec;
    let mut jars: Vec<String> = extra_jars.to_vec();
    let push_list = |args: &mut Vec<String>, flag: &str, uris: &[String]| {
        if let Some(list) = joined(uris) {
            args.push(flag.into());
            args.push(list);
        }
    };
    match job.cluster.workload {
        Workload::Pyspark => {
            let p = spec.pyspark_batch.clone().unwrap_or_default();
            jars.extend(p.jar_file_uris.iter().map(|u| local(u)));
            push_list(&mut args, "--jars", &jars);
            push_list(&mut args, "--py-files", &p.python_file_uris);
            push_list(&mut args, "--files", &p.file_uris);
            push_list(&mut args, "--archives", &p.archive_uris);
            args.push(local(&p.main_python_file_uri));
            args.extend(p.args);
        }
        Workload::Spark => {
            let s = spec.spark_batch.clone().unwrap_or_default();
            let mut user_jars: Vec<String> = s.jar_file_uris.iter().map(|u| local(u)).collect();
            push_list(&mut args, "--files", &s.file_uris);
            push_list(&mut args, "--archives", &s.archive_uris);
            // The application jar: the main jar, else the first of the
            // user's jars (which holds the main class); the rest, and the
            // node's own, go to --jars.
            let app = match &s.main_jar_file_uri {
                Some(j) => Some(local(j)),
                None if !user_jars.is_empty() => Some(user_jars.remove(0)),
                None => None,
            };
            if let Some(class) = &s.main_class {
                args.push("--class".into());
                args.push(class.clone());
            }
            jars.extend(user_jars);
            push_list(&mut args, "--jars", &jars);
            args.push(app.unwrap_or_else(|| "spark-internal".into()));
            args.extend(s.args);
        }
        Workload::SparkSql => {
            let s = spec.spark_sql_batch.clone().unwrap_or_default();
            jars.extend(s.jar_file_uris.iter().map(|u| local(u)));
            push_list(&mut args, "--jars", &jars);
            args.push("--class".into());
            args.push("org.apache.spark.sql.hive.thriftserver.SparkSQLCLIDriver".into());
            args.push("spark-internal".into());
            for (k, v) in &s.query_variables {
                args.push("--hivevar".into());
                args.push(format!("{k}={v}"));
            }
            args.push("-f".into());
            args.push(local(&s.query_file_uri));
        }
    }
    args
}

/// The discovery script of a Spark worker (or driver): prints exactly the
/// given GPU addresses in Spark's resource format, so Spark never hands out
/// a GPU the scheduler did not allocate.
pub fn discovery_script(gpus: &[String]) -> String {
    let resource = serde_json::json!({"name": "gpu", "addresses": gpus});
    format!(
        "#!/bin/sh\n# Generated by flexq: the GPUs allocated to this part of the batch.\necho '{resource}'\n"
    )
}

#[cfg(test)]
mod tests;
