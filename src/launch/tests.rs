//! The Spark configuration of docs/rules.md#running-on-spark, the spark-submit line, failure
//! summaries, and the Kubernetes manifests against golden files
//! (`src/launch/golden/`; `FLEXQ_UPDATE_GOLDEN=1` rewrites them, and the
//! diff is then reviewed like code).

use std::path::PathBuf;

use super::k8s::{K8sTarget, PartNode, batch_state, spark_application};
use super::*;
use crate::api::{PySparkBatch, RuntimeConfig, SparkBatch, State};
use crate::config::Config;

fn job(batch: Batch) -> SparkJob {
    let config = Config::load_without_env(None).expect("embedded config");
    let cluster = crate::spec::validate(&batch, "demo", "us-central1", &config.policy())
        .unwrap_or_else(|r| panic!("invalid test batch: {r:?}"))
        .cluster;
    SparkJob {
        batch: "projects/demo/locations/us-central1/batches/nightly-etl".into(),
        uuid: "0190b6d2-7c1e-7000-8000-000000000001".into(),
        spec: batch,
        cluster,
    }
}

fn props(p: &[(&str, &str)]) -> Option<RuntimeConfig> {
    Some(RuntimeConfig {
        version: Some("2.2".into()),
        properties: p
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    })
}

const FLEX_L4: &[(&str, &str)] = &[
    ("spark.dataproc.executor.resource.accelerator.type", "l4"),
    ("spark.dataproc.executor.compute.tier", "premium"),
    ("spark.dataproc.executor.disk.tier", "premium"),
    ("spark.dataproc.driverEnv.LANG", "C.UTF-8"),
];

fn pyspark(extra: &[(&str, &str)]) -> SparkJob {
    let mut p: Vec<(&str, &str)> = FLEX_L4.to_vec();
    p.extend_from_slice(extra);
    job(Batch {
        pyspark_batch: Some(PySparkBatch {
            main_python_file_uri: "file:///jobs/etl.py".into(),
            args: vec!["--day".into(), "2026-11-29".into()],
            python_file_uris: vec!["file:///jobs/lib.zip".into()],
            ..Default::default()
        }),
        runtime_config: props(&p),
        ..Default::default()
    })
}

#[test]
fn spark_conf_has_the_gpu_defaults_of_spec_4() {
    let rapids = Rapids::Jar("/opt/rapids/rapids-4-spark.jar".into());
    let conf = spark_conf(&pyspark(&[]), &rapids);
    for (k, v) in [
        ("spark.plugins", RAPIDS_PLUGIN),
        ("spark.rapids.sql.enabled", "true"),
        ("spark.rapids.sql.explain", "NOT_ON_GPU"),
        ("spark.executor.resource.gpu.amount", "1"),
        ("spark.task.resource.gpu.amount", "0.25"),
        ("spark.executor.resource.gpu.vendor", "nvidia.com"),
        ("spark.executor.instances", "2"),
        ("spark.executor.cores", "4"),
        ("spark.cores.max", "8"),
    ] {
        assert_eq!(conf.get(k).map(String::as_str), Some(v), "{k}");
    }
    assert!(
        !conf.contains_key("spark.shuffle.manager"),
        "unset by default"
    );
    assert!(
        conf.keys().all(|k| !k.starts_with("spark.dataproc.")),
        "flexq's own keys are not Spark's: {conf:?}"
    );
}

#[test]
fn user_properties_win_and_the_shuffle_manager_passes_through() {
    let job = pyspark(&[
        ("spark.rapids.sql.enabled", "false"),
        (
            "spark.shuffle.manager",
            "com.nvidia.spark.rapids.RapidsShuffleManager",
        ),
        ("spark.rapids.shims-provider-override", "spark350"),
        ("spark.task.resource.gpu.amount", "0.5"),
        ("spark.rapids.sql.explain", "ALL"),
    ]);
    let conf = spark_conf(&job, &Rapids::Jar("/r.jar".into()));
    assert_eq!(conf["spark.rapids.sql.enabled"], "false");
    assert_eq!(
        conf["spark.rapids.sql.explain"], "ALL",
        "the batch's own explain wins"
    );
    assert_eq!(
        conf["spark.shuffle.manager"],
        "com.nvidia.spark.rapids.RapidsShuffleManager"
    );
    assert_eq!(conf["spark.rapids.shims-provider-override"], "spark350");
    assert_eq!(conf["spark.task.resource.gpu.amount"], "0.5");
}

/// With dynamic allocation on, Spark is capped at the executors allocated
/// whatever the batch says, on both launchers; shuffle tracking is on
/// unless the batch says otherwise. Off, the keys pass untouched.
#[test]
fn dynamic_allocation_is_capped_at_the_allocated_executors_on_both_launchers() {
    let job = pyspark(&[
        ("spark.dynamicAllocation.enabled", "true"),
        ("spark.dynamicAllocation.initialExecutors", "3"),
        ("spark.dynamicAllocation.maxExecutors", "1000"),
    ]);
    assert_eq!(job.cluster.executor_count, 3);
    let conf = spark_conf(&job, &Rapids::Jar("/r.jar".into()));
    assert_eq!(conf["spark.dynamicAllocation.maxExecutors"], "3");
    assert_eq!(conf["spark.dynamicAllocation.initialExecutors"], "3");
    assert_eq!(
        conf["spark.dynamicAllocation.shuffleTracking.enabled"],
        "true"
    );
    let app = spark_application(&job, &parts(), &target(true));
    assert_eq!(
        app["spec"]["sparkConf"]["spark.dynamicAllocation.maxExecutors"],
        "3"
    );
    assert_eq!(app["spec"]["executor"]["instances"], 3);

    let own = pyspark(&[
        ("spark.dynamicAllocation.enabled", "true"),
        ("spark.dynamicAllocation.shuffleTracking.enabled", "false"),
        ("spark.shuffle.service.enabled", "true"),
    ]);
    let conf = spark_conf(&own, &Rapids::Jar("/r.jar".into()));
    assert_eq!(
        conf["spark.dynamicAllocation.shuffleTracking.enabled"],
        "false"
    );
    assert_eq!(conf["spark.dynamicAllocation.maxExecutors"], "2");

    let off = pyspark(&[("spark.dynamicAllocation.maxExecutors", "1000")]);
    let conf = spark_conf(&off, &Rapids::Jar("/r.jar".into()));
    assert_eq!(conf["spark.dynamicAllocation.maxExecutors"], "1000");
    assert!(!conf.contains_key("spark.dynamicAllocation.shuffleTracking.enabled"));
}

#[test]
fn without_the_rapids_jar_the_plugin_is_not_configured() {
    let conf = spark_conf(
        &pyspark(&[]),
        &Rapids::Missing {
            reason: "no jar at /opt/rapids.jar".into(),
        },
    );
    assert!(!conf.contains_key("spark.plugins"), "{conf:?}");
    assert_eq!(conf["spark.executor.resource.gpu.amount"], "1");
}

#[test]
fn task_gpu_amount_divides_the_executors_gpus_by_its_cores() {
    // l4 with 24 cores: 2 GPUs per executor → 2/24 per task.
    let conf = spark_conf(
        &pyspark(&[
            ("spark.executor.cores", "24"),
            ("spark.dataproc.executor.disk.size", "750g"),
        ]),
        &Rapids::Jar("/r.jar".into()),
    );
    assert_eq!(conf["spark.executor.resource.gpu.amount"], "2");
    assert_eq!(conf["spark.task.resource.gpu.amount"], "0.083333");
}

#[test]
fn submit_args_for_pyspark_and_spark() {
    let job = pyspark(&[]);
    let conf = spark_conf(&job, &Rapids::Jar("/r.jar".into()));
    let args = submit_args(&job, "spark://10.0.0.5:7077", &conf, &["/r.jar".into()]);
    assert_eq!(&args[..2], ["--master", "spark://10.0.0.5:7077"]);
    let tail = &args[args.len() - 7..];
    assert_eq!(
        tail,
        [
            "--jars",
            "/r.jar",
            "--py-files",
            "/jobs/lib.zip",
            "/jobs/etl.py",
            "--day",
            "2026-11-29"
        ]
    );

    let spark = job_spark();
    let conf = spark_conf(&spark, &Rapids::Jar("/r.jar".into()));
    let args = submit_args(&spark, "spark://m:7077", &conf, &["/r.jar".into()]);
    let tail = &args[args.len() - 6..];
    assert_eq!(
        tail,
        [
            "--class",
            "org.example.Etl",
            "--jars",
            "/r.jar",
            "/jobs/etl.jar",
            "full"
        ]
    );
}

fn job_spark() -> SparkJob {
    job(Batch {
        spark_batch: Some(SparkBatch {
            main_class: Some("org.example.Etl".into()),
            jar_file_uris: vec!["file:///jobs/etl.jar".into()],
            args: vec!["full".into()],
            ..Default::default()
        }),
        runtime_config: props(FLEX_L4),
        ..Default::default()
    })
}

#[test]
fn discovery_script_lists_exactly_the_given_gpus() {
    let s = discovery_script(&["1".into(), "3".into()]);
    assert!(s.starts_with("#!/bin/sh\n"));
    assert!(
        s.contains(r#"echo '{"addresses":["1","3"],"name":"gpu"}'"#),
        "{s}"
    );
}

#[test]
fn failure_summaries_name_the_cause() {
    let python = "26/11/29 INFO SparkContext: Running Spark\n\
        Traceback (most recent call last):\n  File \"/jobs/etl.py\", line 9, in <module>\n    \
        raise ValueError(\"bad row 17\")\nValueError: bad row 17\n\
        26/11/29 INFO ShutdownHookManager: Shutdown hook called\n";
    assert_eq!(failure_summary(python), "ValueError: bad row 17");

    let missing = "Traceback (most recent call last):\n  File \"x.py\", line 2\n\
        pyspark.errors.exceptions.captured.AnalysisException: [PATH_NOT_FOUND] Path does not exist: file:/data/in.parquet.\n";
    assert_eq!(
        failure_summary(missing),
        "missing file: pyspark.errors.exceptions.captured.AnalysisException: [PATH_NOT_FOUND] Path does not exist: file:/data/in.parquet."
    );

    let oom = "26/11/29 WARN TaskSetManager: Lost task 0.0\n\
        com.nvidia.spark.rapids.jni.GpuRetryOOM: GPU OutOfMemory: could not allocate 2147483648 bytes\n\
        \tat com.nvidia.spark.rapids.RmmRapidsRetryIterator\n\
        Exception in thread \"main\" org.apache.spark.SparkException: Job aborted due to stage failure\n";
    assert_eq!(
        failure_summary(oom),
        "GPU out of memory: org.apache.spark.SparkException: Job aborted due to stage failure"
    );

    let python_missing =
        "python3: can't open file '/jobs/nope.py': [Errno 2] No such file or directory\n";
    assert!(failure_summary(python_missing).starts_with("missing file: python3: can't open file"));

    let other = "26/11/29 INFO a: b\nsomething odd happened\n\tat x.y\n26/11/29 INFO c: d\n";
    assert_eq!(failure_summary(other), "something odd happened");
}

fn target(rapids: bool) -> K8sTarget {
    K8sTarget {
        namespace: "spark-jobs".into(),
        image: "registry.example/spark-rapids:3.5.1-24.06".into(),
        service_account: "spark".into(),
        rapids_jar: rapids.then(|| "/opt/sparkRapidsPlugin/rapids-4-spark.jar".into()),
        spark_version: "3.5.1".into(),
    }
}

fn parts() -> Vec<PartNode> {
    vec![
        PartNode {
            node: "gpu-node-a".into(),
            driver: false,
        },
        PartNode {
            node: "gpu-node-b".into(),
            driver: false,
        },
        PartNode {
            node: "gpu-node-b".into(),
            driver: true,
        },
    ]
}

/// Compares `value` with the golden file `name`, or rewrites it when
/// FLEXQ_UPDATE_GOLDEN is set.
fn golden(name: &str, value: &serde_json::Value) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/launch/golden")
        .join(name);
    let text = serde_json::to_string_pretty(value).expect("json") + "\n";
    if std::env::var_os("FLEXQ_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).expect("write golden");
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (FLEXQ_UPDATE_GOLDEN=1 creates it)", path.display()));
    assert_eq!(
        text,
        want,
        "{} differs; review and rerun with FLEXQ_UPDATE_GOLDEN=1",
        path.display()
    );
}

#[test]
fn spark_application_golden_pyspark() {
    golden(
        "pyspark-l4.json",
        &spark_application(&pyspark(&[]), &parts(), &target(true)),
    );
}

#[test]
fn spark_application_golden_spark_without_rapids() {
    golden(
        "spark-no-rapids.json",
        &spark_application(&job_spark(), &parts(), &target(false)),
    );
}

#[test]
fn spark_application_status_maps_to_batch_states() {
    use serde_json::json;
    let st =
        |s: &str| json!({"applicationState": {"state": s, "errorMessage": "driver pod failed"}});
    assert_eq!(batch_state(&json!({})), None);
    assert_eq!(batch_state(&st("SUBMITTED")), None);
    assert_eq!(
        batch_state(&st("RUNNING")).map(|s| s.0),
        Some(State::Running)
    );
    assert_eq!(
        batch_state(&st("COMPLETED")).map(|s| s.0),
        Some(State::Succeeded)
    );
    assert_eq!(
        batch_state(&st("FAILED")),
        Some((State::Failed, "driver pod failed".into()))
    );
    assert_eq!(
        batch_state(&st("SUBMISSION_FAILED")).map(|s| s.0),
        Some(State::Failed)
    );
}
