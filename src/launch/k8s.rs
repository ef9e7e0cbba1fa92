//! The second launcher: Spark on Kubernetes through the Spark Operator. An
//! allocated batch becomes a `SparkApplication` (sparkoperator.k8s.io/v1beta2)
//! with the Spark configuration of docs/rules.md#running-on-spark, the allocated shape, and node
//! affinity that pins the driver and executors to the allocated nodes; the
//! application's status maps back to the batch's state.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::{Rapids, SparkJob, spark_conf};
use crate::api::State;
use crate::spec::Workload;

/// Where and how applications are created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct K8sTarget {
    pub namespace: String,
    /// The Spark image with the RAPIDS jar, used when the batch does not
    /// set `runtimeConfig.containerImage`.
    pub image: String,
    pub service_account: String,
    /// The RAPIDS jar's path inside the image; None: the image has none.
    pub rapids_jar: Option<String>,
    /// The Spark version of the runtime.
    pub spark_version: String,
}

/// One allocated part: its node and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartNode {
    pub node: String,
    pub driver: bool,
}

/// The application's Kubernetes name: from the batch's uuid, unique across
/// projects (batch ids are unique only within one project's region); the
/// batch's name is in its labels and annotations.
pub(crate) fn application_name(job: &SparkJob) -> String {
    format!("flexq-{}", job.uuid.to_ascii_lowercase())
}

fn pinned_to(nodes: &BTreeSet<&str>) -> Value {
    json!({
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{
                    "matchExpressions": [{
                        "key": "kubernetes.io/hostname",
                        "operator": "In",
                        "values": nodes.iter().collect::<Vec<_>>(),
                    }]
                }]
            }
        }
    })
}

/// The `SparkApplication` of an allocated batch.
pub(crate) fn spark_application(job: &SparkJob, parts: &[PartNode], target: &K8sTarget) -> Value {
    let conf = operator_conf(job, target);
    let image = job
        .spec
        .runtime_config
        .as_ref()
        .and_then(|r| r.container_image.clone())
        .unwrap_or_else(|| target.image.clone());
    let (driver, executor) = pod_sections(job, parts, target);
    let mut program = Program::of(job);
    if let Some(path) = &target.rapids_jar {
        program.jars.insert(0, format!("local://{path}"));
    }
    let mut app_spec = json!({
        "type": program.kind,
        "mode": "cluster",
        "image": image,
        "sparkVersion": target.spark_version,
        "sparkConf": conf,
        "restartPolicy": {"type": "Never"},
        "driver": driver,
        "executor": executor,
    });
    program.add_to(&mut app_spec);
    let project = job.batch.split('/').nth(1).unwrap_or_default();
    json!({
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {
            "name": application_name(job),
            "namespace": target.namespace,
            "labels": {
                "app.kubernetes.io/managed-by": "flexq",
                "flexq.io/project": project,
                "flexq.io/batch-id": job.batch.rsplit('/').next().unwrap_or_default(),
                "flexq.io/batch-uuid": job.uuid,
            },
            "annotations": {"flexq.io/batch": job.batch},
        },
        "spec": app_spec,
    })
}

/// The batch's Spark configuration for the image's RAPIDS jar, less the
/// keys the operator sets itself.
fn operator_conf(job: &SparkJob, target: &K8sTarget) -> BTreeMap<String, String> {
    let rapids = match &target.rapids_jar {
        Some(path) => Rapids::Jar(path.clone()),
        None => Rapids::Missing {
            reason: format!("the image {} has no RAPIDS jar configured", target.image),
        },
    };
    let mut conf = spark_conf(job, &rapids);
    // The operator sets these from the driver/executor sections.
    for key in [
        "spark.submit.deployMode",
        "spark.executor.instances",
        "spark.executor.cores",
        "spark.executor.memory",
        "spark.executor.memoryOverhead",
        "spark.driver.cores",
        "spark.driver.memory",
        "spark.cores.max",
    ] {
        conf.remove(key);
    }
    conf
}

/// The application's driver and executor sections: the allocated shape,
/// GPUs, and affinity that pins each role to its allocated nodes.
fn pod_sections(job: &SparkJob, parts: &[PartNode], target: &K8sTarget) -> (Value, Value) {
    let c = &job.cluster;
    let driver_nodes: BTreeSet<&str> = parts
        .iter()
        .filter(|p| p.driver)
        .map(|p| p.node.as_str())
        .collect();
    let executor_nodes: BTreeSet<&str> = parts
        .iter()
        .filter(|p| !p.driver)
        .map(|p| p.node.as_str())
        .collect();
    let gpu = |n: u32| (n > 0).then(|| json!({"name": "nvidia.com/gpu", "quantity": n}));
    let mut driver = json!({
        "cores": c.driver.cores,
        "memory": format!("{}m", c.driver.memory_mb),
        "memoryOverhead": format!("{}m", c.driver.memory_overhead_mb),
        "serviceAccount": target.service_account,
        "affinity": pinned_to(&driver_nodes),
        "labels": {"flexq.io/role": "driver"},
    });
    let mut executor = json!({
        "instances": c.executor_count,
        "cores": c.executor.cores,
        "memory": format!("{}m", c.executor.memory_mb),
        "memoryOverhead": format!("{}m", c.executor.memory_overhead_mb),
        "affinity": pinned_to(&executor_nodes),
        "labels": {"flexq.io/role": "executor"},
    });
    if let Some(g) = gpu(c.driver.gpus) {
        driver["gpu"] = g;
    }
    if let Some(g) = gpu(c.executor.gpus) {
        executor["gpu"] = g;
    }
    let env: Vec<Value> = super::driver_env(job)
        .into_iter()
        .map(|(name, value)| json!({"name": name, "value": value}))
        .collect();
    if !env.is_empty() {
        driver["env"] = Value::Array(env);
    }
    (driver, executor)
}

/// What the application runs: its type, main file or class, arguments and
/// dependencies, from the batch's workload.
struct Program {
    kind: &'static str,
    main_file: Option<String>,
    main_class: Option<String>,
    args: Vec<String>,
    jars: Vec<String>,
    py_files: Vec<String>,
    files: Vec<String>,
    archives: Vec<String>,
}

impl Program {
    /// The program of the batch's PySpark, Spark or Spark SQL workload.
    fn of(job: &SparkJob) -> Self {
        let spec = &job.spec;
        match job.cluster.workload {
            Workload::Pyspark => {
                let p = spec.pyspark_batch.clone().unwrap_or_default();
                Program {
                    kind: "Python",
                    main_file: Some(p.main_python_file_uri),
                    main_class: None,
                    args: p.args,
                    jars: p.jar_file_uris,
                    py_files: p.python_file_uris,
                    files: p.file_uris,
                    archives: p.archive_uris,
                }
            }
            Workload::Spark => {
                let s = spec.spark_batch.clone().unwrap_or_default();
                Program {
                    kind: "Scala",
                    main_file: s.main_jar_file_uri,
                    main_class: s.main_class,
                    args: s.args,
                    jars: s.jar_file_uris,
                    py_files: vec![],
                    files: s.file_uris,
                    archives: s.archive_uris,
                }
            }
            Workload::SparkSql => {
                let s = spec.spark_sql_batch.clone().unwrap_or_default();
                let mut args: Vec<String> = s
                    .query_variables
                    .iter()
                    .flat_map(|(k, v)| ["--hivevar".to_string(), format!("{k}={v}")])
                    .collect();
                args.extend(["-f".to_string(), s.query_file_uri]);
                Program {
                    kind: "Scala",
                    main_file: None,
                    main_class: Some(
                        "org.apache.spark.sql.hive.thriftserver.SparkSQLCLIDriver".into(),
                    ),
                    args,
                    jars: s.jar_file_uris,
                    py_files: vec![],
                    files: vec![],
                    archives: vec![],
                }
            }
        }
    }

    /// Sets the main file, main class, arguments and the non-empty
    /// dependency lists on the application's spec.
    fn add_to(self, app_spec: &mut Value) {
        if let Some(f) = self.main_file {
            app_spec["mainApplicationFile"] = json!(f);
        }
        if let Some(cls) = self.main_class {
            app_spec["mainClass"] = json!(cls);
        }
        if !self.args.is_empty() {
            app_spec["arguments"] = json!(self.args);
        }
        let mut deps = serde_json::Map::new();
        for (key, list) in [
            ("jars", self.jars),
            ("pyFiles", self.py_files),
            ("files", self.files),
            ("archives", self.archives),
        ] {
            if !list.is_empty() {
                deps.insert(key.into(), json!(list));
            }
        }
        if !deps.is_empty() {
            app_spec["deps"] = Value::Object(deps);
        }
    }
}

/// What a `SparkApplication`'s status means for its batch: the state, and
/// the operator's message for a failure. None while the application has
/// not started (the batch stays PENDING).
pub(crate) fn batch_state(status: &Value) -> Option<(State, String)> {
    let app = &status["applicationState"];
    let state = app["state"].as_str().unwrap_or("");
    let message = app["errorMessage"].as_str().unwrap_or("").to_string();
    match state {
        "RUNNING" | "SUCCEEDING" | "FAILING" => Some((State::Running, message)),
        "COMPLETED" => Some((State::Succeeded, message)),
        "FAILED" | "SUBMISSION_FAILED" => Some((
            State::Failed,
            if message.is_empty() {
                format!("the Spark application ended {state}")
            } else {
                message
            },
        )),
        // "", NEW, SUBMITTED, PENDING_RERUN, INVALIDATING, UNKNOWN.
        _ => None,
    }
}
