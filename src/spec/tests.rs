//! One accepting and one rejecting case per rule of docs/rules.md#properties-and-shapes and
//! docs/rules.md#provisioning-and-timeouts, as a table.

use std::collections::BTreeMap;

use super::*;
use crate::api::{EnvironmentConfig, ExecutionConfig, PySparkBatch, RuntimeConfig, SparkBatch};

/// The policy of the embedded default config.
fn config() -> Policy {
    crate::config::Config::load_without_env(None)
        .expect("embedded config")
        .policy()
}

fn batch(version: &str, props: &[(&str, &str)]) -> Batch {
    Batch {
        pyspark_batch: Some(PySparkBatch {
            main_python_file_uri: "file:///jobs/etl.py".into(),
            ..Default::default()
        }),
        runtime_config: Some(RuntimeConfig {
            version: Some(version.into()),
            properties: props
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The flex start example of docs/rules.md#example, without the timeouts.
const FLEX: &[(&str, &str)] = &[
    ("spark.dataproc.driver.resource.accelerator.type", "l4"),
    ("spark.dataproc.executor.resource.accelerator.type", "l4"),
    ("spark.dataproc.executor.compute.tier", "premium"),
    ("spark.dataproc.executor.disk.tier", "premium"),
];

/// The flex start example plus (or overriding) `extra`.
fn flex(extra: &[(&str, &str)]) -> Batch {
    let mut props: BTreeMap<&str, &str> = FLEX.iter().copied().collect();
    props.extend(extra.iter().copied());
    batch("3.0", &props.into_iter().collect::<Vec<_>>())
}

fn flex_without(key: &str) -> Batch {
    let props: Vec<_> = FLEX.iter().copied().filter(|(k, _)| *k != key).collect();
    batch("3.0", &props)
}

fn check(b: &Batch) -> Result<ClusterRequest, Rejection> {
    validate(b, "demo", "us-central1", &config()).map(|r| r.cluster)
}

#[track_caller]
fn rejected(b: &Batch, field: &str, fragment: &str) -> Rejection {
    let r = check(b).expect_err("batch must be rejected");
    assert!(
        r.violations
            .iter()
            .any(|v| v.field == field && v.description.contains(fragment)),
        "expected {field} containing {fragment:?}, got {:#?}",
        r.violations
    );
    r
}

#[test]
fn both_published_examples_are_accepted_exactly_as_written() {
    let serverless = batch(
        "1.1",
        &[
            ("spark.dataproc.executor.compute.tier", "premium"),
            ("spark.dataproc.executor.disk.tier", "premium"),
            ("spark.dataproc.executor.resource.accelerator.type", "l4"),
            ("spark.executor.instances", "5"),
            ("spark.dataproc.driverEnv.LANG", "C.UTF-8"),
            ("spark.executorEnv.LANG", "C.UTF-8"),
            (
                "spark.shuffle.manager",
                "com.nvidia.spark.rapids.RapidsShuffleManager",
            ),
        ],
    );
    let c = check(&serverless).expect("serverless GPU example");
    assert_eq!(c.executor_count, 5);
    assert_eq!(c.mode, ProvisioningMode::Default);
    assert_eq!(c.driver.accelerator, None);
    assert_eq!(
        c.quota,
        vec![
            QuotaAmount {
                metric: QuotaMetric::NvidiaL4Gpus,
                amount: 5
            },
            QuotaAmount {
                metric: QuotaMetric::LocalSsdTotalGb,
                amount: 5 * 375
            },
        ]
    );

    let flex_start = flex(&[
        (
            "spark.dataproc.driver.provisioning.allocationTimeout",
            "1800s",
        ),
        (
            "spark.dataproc.executor.provisioning.allocationTimeout",
            "1800s",
        ),
    ]);
    let c = check(&flex_start).expect("flex start example");
    assert_eq!(
        c.mode,
        ProvisioningMode::Queue,
        "queue is the default on 3.0"
    );
    assert_eq!(c.allocation_timeout_s, 1800);
    assert_eq!(c.executor_count, 2);
    assert_eq!(c.total_gpus(), 3);
    assert_eq!(
        c.quota,
        vec![
            QuotaAmount {
                metric: QuotaMetric::PreemptibleNvidiaL4Gpus,
                amount: 3
            },
            QuotaAmount {
                metric: QuotaMetric::LocalSsdTotalGb,
                amount: 3 * 375
            },
        ]
    );
}

#[test]
fn accelerator_type_must_be_a_known_gpu() {
    assert!(
        check(&flex(&[
            (
                "spark.dataproc.executor.resource.accelerator.type",
                "a100-40"
            ),
            ("spark.executor.cores", "12")
        ]))
        .is_ok()
    );
    let r = rejected(
        &flex(&[("spark.dataproc.executor.resource.accelerator.type", "h100")]),
        "runtime_config.properties[spark.dataproc.executor.resource.accelerator.type]",
        "accepted: l4, a100-40, a100-80",
    );
    assert_eq!(r.code, Code::InvalidArgument);
}

#[test]
fn a_gpu_the_region_does_not_offer_is_a_failed_precondition() {
    let b = flex(&[
        (
            "spark.dataproc.executor.resource.accelerator.type",
            "a100-80",
        ),
        ("spark.executor.cores", "12"),
    ]);
    assert!(validate(&b, "demo", "us-central1", &config()).is_ok());
    let r = validate(&b, "demo", "asia-southeast1", &config()).expect_err("not offered");
    assert_eq!(r.code, Code::FailedPrecondition);
    assert!(
        r.violations[0]
            .description
            .contains("not offered in region asia-southeast1")
    );
}

#[test]
fn an_unknown_region_is_named() {
    let r = validate(&flex(&[]), "demo", "mars-north1", &config()).expect_err("unknown region");
    assert_eq!(r.violations[0].field, "parent");
    assert!(r.violations[0].description.contains("\"mars-north1\""));
}

#[test]
fn compute_and_disk_tiers_must_be_premium_for_gpu_executors() {
    for key in [
        "spark.dataproc.executor.compute.tier",
        "spark.dataproc.executor.disk.tier",
    ] {
        rejected(
            &flex(&[(key, "standard")]),
            &property_field(key),
            "must be \"premium\"",
        );
        rejected(&flex_without(key), &property_field(key), "found unset");
    }
}

#[test]
fn executor_instances_default_to_two_and_must_be_at_least_two() {
    assert_eq!(check(&flex(&[])).map(|c| c.executor_count), Ok(2));
    assert_eq!(
        check(&flex(&[("spark.executor.instances", " 8 ")])).map(|c| c.executor_count),
        Ok(8),
        "values are trimmed"
    );
    for bad in ["1", "0", "-2", "two", "2.5", "1001"] {
        rejected(
            &flex(&[("spark.executor.instances", bad)]),
            "runtime_config.properties[spark.executor.instances]",
            "from 2 to 1000",
        );
    }
}

/// Dynamic allocation (docs/rules.md#dynamic-allocation): on only where
/// the batch says so; the cluster is what Spark starts with, the largest of
/// spark.executor.instances, minExecutors and initialExecutors; each key
/// is checked against Dataproc's bounds, naming it.
#[test]
fn dynamic_allocation_sizes_the_cluster_as_spark_starts_it() {
    let on = |extra: &[(&str, &str)]| {
        let mut p = vec![(DYNAMIC_ALLOCATION, "true")];
        p.extend_from_slice(extra);
        flex(&p)
    };
    let size = |b: &Batch| check(b).map(|c| (c.executor_count, c.dynamic_allocation));
    assert_eq!(size(&flex(&[(INITIAL_EXECUTORS, "9")])), Ok((2, false)));
    assert_eq!(
        size(&flex(&[(DYNAMIC_ALLOCATION, "false")])),
        Ok((2, false))
    );
    assert_eq!(size(&on(&[])), Ok((2, true)));
    for (extra, want) in [
        (&[("spark.executor.instances", "3")][..], 3),
        (&[(MIN_EXECUTORS, "4")][..], 4),
        (&[(MIN_EXECUTORS, "3"), (INITIAL_EXECUTORS, " 5 ")][..], 5),
        (
            &[("spark.executor.instances", "7"), (INITIAL_EXECUTORS, "5")][..],
            7,
        ),
        (&[(INITIAL_EXECUTORS, "6"), (MAX_EXECUTORS_KEY, "6")][..], 6),
    ] {
        assert_eq!(size(&on(extra)), Ok((want, true)), "{extra:?}");
    }
    // Quota follows the size: as many GPUs as six fixed executors.
    let gpus = |b: &Batch| check(b).expect("valid").total_gpus();
    assert_eq!(
        gpus(&on(&[(INITIAL_EXECUTORS, "6")])),
        gpus(&flex(&[("spark.executor.instances", "6")]))
    );

    rejected(
        &flex(&[(DYNAMIC_ALLOCATION, "yes")]),
        &property_field(DYNAMIC_ALLOCATION),
        "\"yes\" is not a boolean; accepted: true or false",
    );
    for (key, bad, accepted) in [
        (MIN_EXECUTORS, "1", "from 2 to 1000"),
        (MIN_EXECUTORS, "2.5", "from 2 to 1000"),
        (INITIAL_EXECUTORS, "101", "from 2 to 100"),
        (MAX_EXECUTORS_KEY, "1001", "from 2 to 1000"),
        (MAX_EXECUTORS_KEY, "ten", "from 2 to 1000"),
    ] {
        rejected(&on(&[(key, bad)]), &property_field(key), accepted);
    }
    rejected(
        &on(&[(MIN_EXECUTORS, "4"), (INITIAL_EXECUTORS, "3")]),
        &property_field(INITIAL_EXECUTORS),
        "3 is below spark.dynamicAllocation.minExecutors 4",
    );
    rejected(
        &on(&[(INITIAL_EXECUTORS, "6"), (MAX_EXECUTORS_KEY, "5")]),
        &property_field(MAX_EXECUTORS_KEY),
        "5 is below the 6 executors Spark starts with",
    );
    rejected(
        &on(&[("spark.executor.instances", "8"), (MAX_EXECUTORS_KEY, "4")]),
        &property_field(MAX_EXECUTORS_KEY),
        "4 is below the 8 executors Spark starts with",
    );
}

#[test]
fn executor_cores_follow_the_gpu_type() {
    let c = check(&flex(&[("spark.executor.cores", "48")])).expect("l4 48 cores");
    assert_eq!(
        (c.executor.cores, c.executor.gpus, c.executor.local_ssd_gb),
        (48, 4, 1500)
    );
    rejected(
        &flex(&[("spark.executor.cores", "6")]),
        "runtime_config.properties[spark.executor.cores]",
        "accepted: 4, 8, 12, 16, 24, 48, 96",
    );
    rejected(
        &flex(&[
            (
                "spark.dataproc.executor.resource.accelerator.type",
                "a100-40",
            ),
            ("spark.executor.cores", "4"),
        ]),
        "runtime_config.properties[spark.executor.cores]",
        "accepted: 12",
    );
}

#[test]
fn gpus_per_executor_follow_the_shape() {
    for (cores, gpus) in [("4", 1), ("16", 1), ("24", 2), ("48", 4), ("96", 8)] {
        let c = check(&flex(&[("spark.executor.cores", cores)])).expect(cores);
        assert_eq!(c.executor.gpus, gpus, "{cores} cores");
    }
}

#[test]
fn l4_disk_size_is_fixed_by_the_core_count() {
    assert!(
        check(&flex(&[
            ("spark.executor.cores", "24"),
            ("spark.dataproc.executor.disk.size", "750g")
        ]))
        .is_ok()
    );
    rejected(
        &flex(&[("spark.dataproc.executor.disk.size", "750g")]),
        "runtime_config.properties[spark.dataproc.executor.disk.size]",
        "accepted: 375g",
    );
    rejected(
        &flex(&[("spark.dataproc.executor.disk.size", "big")]),
        "runtime_config.properties[spark.dataproc.executor.disk.size]",
        "\"big\"",
    );
}

#[test]
fn a100_disk_size_is_one_of_the_listed_sizes() {
    let a100 = |size: &str| {
        flex(&[
            (
                "spark.dataproc.executor.resource.accelerator.type",
                "a100-40",
            ),
            ("spark.executor.cores", "12"),
            ("spark.dataproc.executor.disk.size", size),
        ])
    };
    assert_eq!(
        check(&a100("9000g")).map(|c| c.executor.local_ssd_gb),
        Ok(9000)
    );
    rejected(
        &a100("500g"),
        "runtime_config.properties[spark.dataproc.executor.disk.size]",
        "375g, 750g, 1500g, 3000g, 6000g, 9000g",
    );
}

#[test]
fn memory_defaults_split_by_workload_kind() {
    let c = check(&flex(&[])).expect("defaults");
    assert_eq!(
        c.executor.memory_overhead_mb,
        13384 * 40 / 100,
        "PySpark: 40% overhead"
    );
    assert_eq!(c.executor.memory_mb + c.executor.memory_overhead_mb, 13384);
    let mut jar = flex(&[]);
    jar.pyspark_batch = None;
    jar.spark_batch = Some(SparkBatch {
        main_class: Some("org.example.Main".into()),
        ..Default::default()
    });
    let c = check(&jar).expect("jar batch");
    assert_eq!(c.executor.memory_overhead_mb, 13384 / 10, "others: 10%");
}

#[test]
fn setting_memory_gives_overhead_the_rest() {
    let c = check(&flex(&[("spark.executor.memory", "8g")])).expect("8g");
    assert_eq!(
        (c.executor.memory_mb, c.executor.memory_overhead_mb),
        (8192, 13384 - 8192)
    );
    let c = check(&flex(&[("spark.executor.memoryOverhead", "2048")])).expect("2048");
    assert_eq!(
        (c.executor.memory_mb, c.executor.memory_overhead_mb),
        (13384 - 2048, 2048)
    );
}

#[test]
fn memory_and_overhead_are_bounded_and_exclusive() {
    rejected(
        &flex(&[
            ("spark.executor.memory", "8g"),
            ("spark.executor.memoryOverhead", "2g"),
        ]),
        "runtime_config.properties[spark.executor.memoryOverhead]",
        "set at most one of spark.executor.memory and spark.executor.memoryOverhead",
    );
    rejected(
        &flex(&[("spark.executor.memory", "512m")]),
        "runtime_config.properties[spark.executor.memory]",
        "from 1024m to 12360m",
    );
    rejected(
        &flex(&[("spark.executor.memoryOverhead", "13g")]),
        "runtime_config.properties[spark.executor.memoryOverhead]",
        "maximum total is 13384m",
    );
    rejected(
        &flex(&[("spark.executor.memory", "lots")]),
        "runtime_config.properties[spark.executor.memory]",
        "4096m or 4g",
    );
}

#[test]
fn runtimes_before_2_2_need_lang() {
    let old = |lang: bool| {
        let mut props = vec![
            ("spark.dataproc.executor.resource.accelerator.type", "l4"),
            ("spark.dataproc.executor.compute.tier", "premium"),
            ("spark.dataproc.executor.disk.tier", "premium"),
        ];
        if lang {
            props.push(("spark.dataproc.driverEnv.LANG", "C.UTF-8"));
            props.push(("spark.executorEnv.LANG", "C.UTF-8"));
        }
        batch("1.2", &props)
    };
    assert!(check(&old(true)).is_ok());
    let r = rejected(
        &old(false),
        "runtime_config.properties[spark.executorEnv.LANG]",
        "spark.dataproc.driverEnv.LANG=C.UTF-8 and spark.executorEnv.LANG=C.UTF-8",
    );
    assert_eq!(r.violations.len(), 2, "one violation per missing property");
}

#[test]
fn the_runtime_must_be_in_the_catalog() {
    let r = rejected(
        &batch("9.9", &[]),
        "runtime_config.version",
        "supported versions: 1.1, 1.2, 2.2, 2.3, 3.0",
    );
    assert_eq!(r.code, Code::InvalidArgument);
    let mut b = flex(&[]);
    b.runtime_config.as_mut().expect("set").version = None;
    let c = check(&b).expect("default runtime");
    assert_eq!(c.runtime, RuntimeVersion::new(2, 2));
}

#[test]
fn a_shielded_vm_policy_blocks_gpu_batches() {
    let r = validate(&flex(&[]), "shielded-only", "us-central1", &config()).expect_err("policy");
    assert_eq!(r.code, Code::FailedPrecondition);
    assert!(
        r.violations[0]
            .description
            .contains("constraints/compute.requireShieldedVm")
    );
    assert!(
        validate(
            &batch("3.0", &[]),
            "shielded-only",
            "us-central1",
            &config()
        )
        .is_ok(),
        "CPU batches still run"
    );
}

#[test]
fn unknown_dataproc_properties_are_rejected_with_a_suggestion() {
    rejected(
        &flex(&[("spark.dataproc.executor.compute.teir", "premium")]),
        "runtime_config.properties[spark.dataproc.executor.compute.teir]",
        "did you mean \"spark.dataproc.executor.compute.tier\"",
    );
    let c = check(&flex(&[
        ("spark.sql.shuffle.partitions", "200"),
        ("spark.dataproc.driverEnv.FOO", "bar"),
    ]));
    assert!(c.is_ok(), "spark.* and driverEnv pass through: {c:?}");
}

#[test]
fn provisioning_mode_defaults_by_runtime_and_queue_needs_3_0() {
    assert_eq!(
        check(&flex(&[])).map(|c| c.mode),
        Ok(ProvisioningMode::Queue)
    );
    assert_eq!(
        check(&flex(&[
            ("spark.dataproc.driver.provisioning.mode", "default"),
            ("spark.dataproc.executor.provisioning.mode", "default"),
        ]))
        .map(|c| c.quota[0].metric),
        Ok(QuotaMetric::NvidiaL4Gpus),
        "default mode draws on-demand quota"
    );
    let mut b = flex(&[("spark.dataproc.executor.provisioning.mode", "queue")]);
    b.runtime_config.as_mut().expect("set").version = Some("2.2".into());
    rejected(
        &b,
        "runtime_config.properties[spark.dataproc.executor.provisioning.mode]",
        "needs runtime 3.0 or later",
    );
    rejected(
        &flex(&[("spark.dataproc.executor.provisioning.mode", "later")]),
        "runtime_config.properties[spark.dataproc.executor.provisioning.mode]",
        "accepted: queue, default",
    );
    rejected(
        &flex(&[
            ("spark.dataproc.driver.provisioning.mode", "queue"),
            ("spark.dataproc.executor.provisioning.mode", "default"),
        ]),
        "runtime_config.properties[spark.dataproc.executor.provisioning.mode]",
        "same provisioning mode",
    );
}

#[test]
fn allocation_timeout_is_the_smaller_of_the_two_and_defaults_to_3600s() {
    assert_eq!(check(&flex(&[])).map(|c| c.allocation_timeout_s), Ok(3600));
    assert_eq!(
        check(&flex(&[
            (
                "spark.dataproc.driver.provisioning.allocationTimeout",
                "600s"
            ),
            (
                "spark.dataproc.executor.provisioning.allocationTimeout",
                "7200s"
            ),
        ]))
        .map(|c| c.allocation_timeout_s),
        Ok(600)
    );
    for bad in ["3600", "3600.5s", "-1s", "0s", "7201s", "1e3s", "3600S"] {
        rejected(
            &flex(&[(
                "spark.dataproc.executor.provisioning.allocationTimeout",
                bad,
            )]),
            "runtime_config.properties[spark.dataproc.executor.provisioning.allocationTimeout]",
            &format!(
                "{bad:?} is not a valid allocation timeout: use whole seconds with the suffix \"s\", from \"1s\" to \"7200s\""
            ),
        );
    }
}

#[test]
fn the_operator_default_timeout_applies() {
    let mut config = config();
    config.default_allocation_timeout_s = 45 * 60;
    let c = validate(&flex(&[]), "demo", "us-central1", &config).expect("valid");
    assert_eq!(c.cluster.allocation_timeout_s, 2700);
}

#[test]
fn a_network_is_named_one_way() {
    let mut b = flex(&[]);
    b.environment_config = Some(EnvironmentConfig {
        execution_config: Some(ExecutionConfig {
            network_uri: Some("default".into()),
            subnetwork_uri: Some("sub".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    rejected(
        &b,
        "environment_config.execution_config.subnetwork_uri",
        "one of network_uri and subnetwork_uri",
    );
    if let Some(e) = b
        .environment_config
        .as_mut()
        .and_then(|e| e.execution_config.as_mut())
    {
        e.network_uri = None;
    }
    assert!(check(&b).is_ok());
}

#[test]
fn ttl_is_bounded_and_defaults_to_four_hours() {
    let with_ttl = |ttl: &str| {
        let mut b = flex(&[]);
        b.environment_config = Some(EnvironmentConfig {
            execution_config: Some(ExecutionConfig {
                ttl: Some(ttl.into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        b
    };
    assert_eq!(check(&flex(&[])).map(|c| c.ttl_s), Ok(Some(4 * 3600)));
    assert_eq!(check(&with_ttl("14400s")).map(|c| c.ttl_s), Ok(Some(14400)));
    rejected(
        &with_ttl("599s"),
        "environment_config.execution_config.ttl",
        "from \"600s\"",
    );
    rejected(
        &with_ttl("4h"),
        "environment_config.execution_config.ttl",
        "with the suffix s",
    );
}

#[test]
fn labels_follow_the_published_rules() {
    let mut b = flex(&[]);
    b.labels.insert("team".into(), "ml-infra".into());
    b.labels.insert("empty".into(), String::new());
    assert!(check(&b).is_ok());
    b.labels.insert("Bad".into(), "x".into());
    rejected(&b, "labels[Bad]", "label key \"Bad\" is invalid");
    let mut b = flex(&[]);
    b.labels.insert("k".into(), "a\u{0}b".into());
    rejected(&b, "labels[k]", "label value \"a\\0b\" is invalid");
    let mut b = flex(&[]);
    for i in 0..33 {
        b.labels.insert(format!("k{i}"), String::new());
    }
    rejected(&b, "labels", "at most 32");
}

#[test]
fn the_workload_is_required_and_unique() {
    let mut b = flex(&[]);
    b.pyspark_batch = None;
    rejected(&b, "batch_config", "is required");
    let mut b = flex(&[]);
    b.spark_batch = Some(SparkBatch {
        main_class: Some("a.B".into()),
        ..Default::default()
    });
    rejected(&b, "batch_config", "only one of");
    let mut b = flex(&[]);
    b.pyspark_batch = Some(PySparkBatch::default());
    rejected(&b, "pyspark_batch.main_python_file_uri", "is required");
}

#[test]
fn property_limits_are_enforced() {
    let big = "x".repeat(100_000);
    rejected(
        &flex(&[("spark.app.name", &big)]),
        "runtime_config.properties[spark.app.name]",
        "at most 16384",
    );
    let many: Vec<(String, String)> = (0..10_000)
        .map(|i| (format!("spark.k{i}"), "v".into()))
        .collect();
    let refs: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    rejected(
        &batch("3.0", &refs),
        "runtime_config.properties",
        "10000 properties given; at most 1000",
    );
}

#[test]
fn every_violation_is_reported_at_once() {
    let r = check(&flex(&[
        ("spark.executor.cores", "5"),
        ("spark.executor.instances", "1"),
        (
            "spark.dataproc.executor.provisioning.allocationTimeout",
            "0s",
        ),
        ("spark.dataproc.executor.disk.tier", "standard"),
    ]))
    .expect_err("four bad fields");
    assert_eq!(r.violations.len(), 4, "{:#?}", r.violations);
    assert!(r.message().starts_with("4 invalid fields"));
}

#[test]
fn an_a100_80_cluster_draws_its_own_metric() {
    let c = check(&flex(&[
        (
            "spark.dataproc.executor.resource.accelerator.type",
            "a100-80",
        ),
        ("spark.dataproc.driver.resource.accelerator.type", "a100-80"),
        ("spark.executor.cores", "12"),
        ("spark.driver.cores", "12"),
        ("spark.executor.instances", "4"),
        ("spark.dataproc.executor.disk.size", "750g"),
    ]))
    .expect("valid");
    assert_eq!(
        c.quota,
        vec![
            QuotaAmount {
                metric: QuotaMetric::PreemptibleNvidiaA100_80gbGpus,
                amount: 5
            },
            QuotaAmount {
                metric: QuotaMetric::LocalSsdTotalGb,
                amount: 375 + 4 * 750
            },
        ]
    );
}

#[test]
fn a_gpu_driver_follows_the_same_shape_rules() {
    let c = check(&flex(&[("spark.driver.cores", "24")])).expect("l4 driver with 24 cores");
    assert_eq!((c.driver.gpus, c.driver.local_ssd_gb), (2, 750));
    rejected(
        &flex(&[("spark.driver.cores", "5")]),
        "runtime_config.properties[spark.driver.cores]",
        "is not a core count for the driver on l4; accepted: 4, 8, 12, 16, 24, 48, 96",
    );
    rejected(
        &flex(&[("spark.dataproc.driver.disk.size", "750g")]),
        "runtime_config.properties[spark.dataproc.driver.disk.size]",
        "accepted: 375g",
    );
    rejected(
        &flex(&[
            ("spark.driver.memory", "8g"),
            ("spark.driver.memoryOverhead", "1g"),
        ]),
        "runtime_config.properties[spark.driver.memoryOverhead]",
        "set at most one of spark.driver.memory and spark.driver.memoryOverhead",
    );
}

#[test]
fn a_cpu_driver_takes_cpu_shapes() {
    let b = flex_without("spark.dataproc.driver.resource.accelerator.type");
    let c = check(&b).expect("CPU driver");
    assert_eq!(
        (c.driver.accelerator, c.driver.gpus, c.driver.local_ssd_gb),
        (None, 0, 0)
    );
    let mut props: Vec<(&str, &str)> = FLEX
        .iter()
        .copied()
        .filter(|(k, _)| *k != "spark.dataproc.driver.resource.accelerator.type")
        .collect();
    props.push(("spark.driver.cores", "12"));
    rejected(
        &batch("3.0", &props),
        "runtime_config.properties[spark.driver.cores]",
        "accepted: 4, 8, 16",
    );
}

#[test]
fn a_create_s_identifiers_are_checked_with_its_batch_in_one_answer() {
    let ids = Identifiers {
        batch_id: Some("Bad_Id"),
        request_id: Some("no spaces"),
    };
    let bad_cores = flex(&[("spark.executor.cores", "6")]);
    let r =
        validate_create(&bad_cores, ids, "demo", "us-central1", &config()).expect_err("refused");
    assert_eq!(r.code, Code::InvalidArgument);
    let fields: Vec<&str> = r.violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(fields[..2], ["batch_id", "request_id"], "{r:?}");
    assert!(fields.len() > 2, "the batch's own violation too: {r:?}");
    assert!(r.violations[0].description.contains("\"Bad_Id\""), "{r:?}");
    // Good identifiers and a good batch: the same cluster as validate's.
    let good = Identifiers {
        batch_id: Some("good-id-1"),
        request_id: Some("req_1-a"),
    };
    assert_eq!(
        validate_create(&flex(&[]), good, "demo", "us-central1", &config()),
        validate(&flex(&[]), "demo", "us-central1", &config())
    );
    // A bad id alone makes a valid batch INVALID_ARGUMENT.
    let only_id = Identifiers {
        batch_id: Some("x"),
        request_id: None,
    };
    let r = validate_create(&flex(&[]), only_id, "demo", "us-central1", &config())
        .expect_err("refused");
    assert_eq!(r.violations.len(), 1, "{r:?}");
}

#[test]
fn a_batch_may_declare_itself_not_preemptible_where_the_region_allows_it() {
    let key = "spark.flexq.preemptible";
    let field = format!("runtime_config.properties[{key}]");
    assert!(check(&flex(&[])).expect("valid").preemptible);
    assert!(check(&flex(&[(key, "true")])).expect("valid").preemptible);
    assert!(!check(&flex(&[(key, "false")])).expect("valid").preemptible);
    rejected(
        &flex(&[(key, "no")]),
        &field,
        "\"no\" is not a boolean; accepted: true or false",
    );
    // Where the region's preemption policy does not honour opt-outs.
    let mut strict = config();
    strict
        .preemption_opt_out
        .insert("us-central1".to_string(), false);
    let r =
        validate(&flex(&[(key, "false")]), "demo", "us-central1", &strict).expect_err("refused");
    assert!(
        r.violations
            .iter()
            .any(|v| v.field == field && v.description.contains("allow_opt_out is false")),
        "{r:?}"
    );
    // Elsewhere the same batch is accepted.
    assert!(
        !validate(&flex(&[(key, "false")]), "demo", "europe-west4", &strict)
            .expect("valid")
            .cluster
            .preemptible
    );
}
