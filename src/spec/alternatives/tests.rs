//! The alternatives rules, the translation table and the reshaping of
//! docs/rules.md#placement-alternatives, and every bad alternative's error.

use super::*;
use crate::api::{PySparkBatch, RuntimeConfig};
use crate::spec::{QuotaMetric, Request, validate_create};
use proptest::strategy::Strategy as _;

/// The embedded default's policy with `alternatives`.
fn policy(alternative_rules: &[(&[&str], &[&str])]) -> Policy {
    let mut p = crate::config::Config::load_without_env(None)
        .expect("embedded config")
        .policy();
    p.alternative_rules = alternative_rules
        .iter()
        .map(|(alternatives, allow)| {
            let alternatives: Vec<String> = alternatives.iter().map(|r| r.to_string()).collect();
            let allow: Vec<String> = allow.iter().map(|r| r.to_string()).collect();
            rule_from_config(None, None, Some("l4"), &alternatives, &allow, None).expect("ladder")
        })
        .collect();
    p
}

/// The flex start example of docs/rules.md#example plus `extra`.
fn flex(extra: &[(&str, &str)]) -> Batch {
    let mut props: BTreeMap<String, String> = [
        ("spark.dataproc.driver.resource.accelerator.type", "l4"),
        ("spark.dataproc.executor.resource.accelerator.type", "l4"),
        ("spark.dataproc.executor.compute.tier", "premium"),
        ("spark.dataproc.executor.disk.tier", "premium"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    props.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Batch {
        pyspark_batch: Some(PySparkBatch {
            main_python_file_uri: "file:///jobs/etl.py".into(),
            ..Default::default()
        }),
        runtime_config: Some(RuntimeConfig {
            version: Some("3.0".into()),
            properties: props,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn create(b: &Batch, p: &Policy) -> Result<Request, Rejection> {
    validate_create(b, Default::default(), "demo", "us-central1", p)
}

#[test]
fn every_pair_of_gpu_types_translates_to_a_shape_the_target_allows() {
    let table = translation_table();
    // Every source shape to every other type.
    let shapes: usize = Accelerator::ALL
        .iter()
        .map(|a| a.allowed_cores().len())
        .sum();
    assert_eq!(table.len(), shapes * (Accelerator::ALL.len() - 1));
    for ((from, cores, to), (to_cores, to_gpus)) in &table {
        let gpus = from.gpus_for_cores(*cores).expect("a source shape");
        assert_eq!(
            to.gpus_for_cores(*to_cores),
            Some(*to_gpus),
            "{from} {cores} cores → {to}: ({to_cores}, {to_gpus}) is not a shape of {to}"
        );
        // Never more GPUs per node than asked, unless the target has
        // no shape that small.
        let smallest = to
            .allowed_cores()
            .iter()
            .filter_map(|c| to.gpus_for_cores(*c))
            .min()
            .expect("shapes");
        assert!(*to_gpus <= gpus.max(smallest), "{from} {cores} → {to}");
    }
    // The rows docs/rules.md spells out.
    use Accelerator::*;
    assert_eq!(table[&(L4, 4, A100_40)], (12, 1));
    assert_eq!(table[&(L4, 24, A100_40)], (12, 1));
    assert_eq!(table[&(L4, 96, A100_80)], (12, 1));
    assert_eq!(table[&(A100_40, 12, L4)], (12, 1));
    assert_eq!(table[&(A100_80, 12, A100_40)], (12, 1));
}

#[test]
fn an_l4_batch_on_an_a100_alternative_is_a_whole_valid_a100_batch() {
    let p = policy(&[(&["a100-40 after 15m"], &[])]);
    let c = create(&flex(&[("spark.executor.instances", "4")]), &p).expect("valid");
    let [alternative] = c.alternatives.as_slice() else {
        panic!("one rung: {:?}", c.alternatives);
    };
    assert_eq!((alternative.index, alternative.after_s), (1, 900));
    assert_eq!(alternative.region, "us-central1");
    let r = &alternative.cluster;
    assert_eq!(r.executor.accelerator, Some(Accelerator::A100_40));
    assert_eq!((r.executor.cores, r.executor.gpus), (12, 1));
    assert_eq!(r.executor_count, 4, "the cluster keeps its 4 executor GPUs");
    assert_eq!(r.driver.accelerator, Some(Accelerator::A100_40));
    assert!(r.executor.memory_mb + r.executor.memory_overhead_mb <= 78040);
    assert!(
        r.quota
            .iter()
            .any(|q| q.metric == QuotaMetric::PreemptibleNvidiaA100Gpus && q.amount == 5),
        "{:?}",
        r.quota
    );
    // The alternative is what a user asking for A100s directly gets.
    let direct = create(
        &flex(&[
            ("spark.executor.instances", "4"),
            (
                "spark.dataproc.executor.resource.accelerator.type",
                "a100-40",
            ),
            ("spark.dataproc.driver.resource.accelerator.type", "a100-40"),
            ("spark.executor.cores", "12"),
            ("spark.driver.cores", "12"),
        ]),
        &policy(&[]),
    )
    .expect("direct a100");
    assert_eq!(r, &direct.cluster);
    // And Spark gets the reshaped batch.
    let (spec, cluster) = as_placed(
        &flex(&[("spark.executor.instances", "4")]),
        &c.cluster,
        &c.alternatives,
        1,
    );
    assert_eq!(&cluster, r);
    assert_eq!(spec.properties()["spark.executor.cores"], "12");
    assert_eq!(
        spec.properties()["spark.dataproc.executor.resource.accelerator.type"],
        "a100-40"
    );
}

#[test]
fn two_gpu_l4_executors_become_twice_as_many_one_gpu_a100_executors() {
    let p = policy(&[(&["a100-40 after 15m"], &[])]);
    let c = create(
        &flex(&[
            ("spark.executor.cores", "24"),
            ("spark.executor.instances", "3"),
            ("spark.executor.memory", "90g"),
            ("spark.task.resource.gpu.amount", "0.5"),
        ]),
        &p,
    )
    .expect("valid");
    let r = &c.alternatives[0].cluster;
    assert_eq!(
        (r.executor.cores, r.executor.gpus, r.executor_count),
        (12, 1, 6)
    );
    let (spec, _) = as_placed(
        &flex(&[("spark.task.resource.gpu.amount", "0.5")]),
        &c.cluster,
        &c.alternatives,
        1,
    );
    assert!(
        !spec
            .properties()
            .contains_key("spark.task.resource.gpu.amount"),
        "the rung's shape sets the task's GPU amount"
    );
}

/// With dynamic allocation, an alternative of more, smaller executors raises the
/// batch's maxExecutors to them: the reshaped batch is valid and Spark
/// may start the whole alternative (planted: the raise left out, the create
/// was refused).
#[test]
fn an_alternative_of_more_executors_raises_a_dynamic_batchs_max_executors() {
    let p = policy(&[(&["a100-40 after 15m"], &[])]);
    let b = flex(&[
        ("spark.executor.cores", "24"),
        ("spark.executor.instances", "3"),
        ("spark.dynamicAllocation.enabled", "true"),
        ("spark.dynamicAllocation.initialExecutors", "3"),
        ("spark.dynamicAllocation.maxExecutors", "3"),
    ]);
    let c = create(&b, &p).expect("valid");
    let r = &c.alternatives[0].cluster;
    assert_eq!(
        (r.executor.gpus, r.executor_count, r.dynamic_allocation),
        (1, 6, true)
    );
    let (spec, placed) = as_placed(&b, &c.cluster, &c.alternatives, 1);
    assert_eq!(
        spec.properties()["spark.dynamicAllocation.maxExecutors"],
        "6"
    );
    assert_eq!(
        spec.properties()["spark.dynamicAllocation.initialExecutors"],
        "3"
    );
    assert_eq!(&placed, r);
}

#[test]
fn on_demand_draws_the_standard_quota() {
    let p = policy(&[(&["on-demand after 20m"], &[])]);
    let c = create(&flex(&[]), &p).expect("valid");
    let r = &c.alternatives[0].cluster;
    assert_eq!(r.mode, ProvisioningMode::Default);
    assert!(
        r.quota
            .iter()
            .any(|q| q.metric == QuotaMetric::NvidiaL4Gpus)
    );
    assert_eq!(r.allocation_timeout_s, c.cluster.allocation_timeout_s);
}

#[test]
fn a_batch_opts_out_or_names_its_own_alternatives_within_what_is_allowed() {
    let p = policy(&[(
        &["a100-40 after 15m"],
        &["on-demand", "region europe-west4"],
    )]);
    let none = create(&flex(&[(ALTERNATIVES_PROPERTY, "none")]), &p).expect("valid");
    assert!(none.alternatives.is_empty());
    let own = create(
        &flex(&[(
            ALTERNATIVES_PROPERTY,
            "region europe-west4 after 5m, on-demand after 10m",
        )]),
        &p,
    )
    .expect("valid");
    let targets: Vec<String> = own
        .alternatives
        .iter()
        .map(|r| r.target.to_string())
        .collect();
    assert_eq!(targets, ["region europe-west4", "on-demand"]);
    assert_eq!(own.alternatives[0].region, "europe-west4");
    // Without an operator's alternatives, nothing to opt into.
    let e = create(
        &flex(&[(ALTERNATIVES_PROPERTY, "a100-40 after 5m")]),
        &policy(&[]),
    )
    .expect_err("not allowed");
    assert!(
        e.message().contains("does not allow a100-40"),
        "{}",
        e.message()
    );
}

#[test]
fn a_bad_alternatives_names_the_field_the_value_and_what_is_accepted() {
    let p = policy(&[(
        &["a100-40 after 15m"],
        &["a100-80", "on-demand", "region europe-west4"],
    )]);
    let field = property_field(ALTERNATIVES_PROPERTY);
    let cases = [
        (
            "h100 after 5m",
            "GPU type \"h100\" is not supported; accepted: l4, a100-40, a100-80",
        ),
        ("region mars-1 after 5m", "region \"mars-1\" is not served"),
        ("l4 after 5m", "l4 is the batch's own GPU type"),
        (
            "region us-central1 after 5m",
            "us-central1 is the batch's own region",
        ),
        ("a100-40 after 5m, a100-40 after 9m", "named twice"),
        (
            "a100-40 after 2h",
            "not within the batch's allocation timeout of 3600s",
        ),
        ("a100-40 soon", "is not of the form"),
        ("a100-40 after 5parsecs", "is not a duration"),
        (
            "a100-40 after 1m, a100-80 after 2m, on-demand after 3m, region europe-west4 after 4m, a100-40 after 5m",
            "at most 4 are accepted",
        ),
    ];
    for (value, fragment) in cases {
        let e = create(&flex(&[(ALTERNATIVES_PROPERTY, value)]), &p).expect_err(value);
        let [v] = e.violations.as_slice() else {
            panic!("{value}: one violation: {e:?}");
        };
        assert_eq!(v.field, field, "{value}");
        assert!(
            v.description.contains(fragment),
            "{value}: {:?} lacks {fragment:?}",
            v.description
        );
    }
}

/// The alternatives an operator may list, for the property below.
const ALTERNATIVE_CHOICES: [&str; 6] = [
    "a100-40 after 15m",
    "a100-80 after 10m",
    "l4 after 5m",
    "on-demand after 20m",
    "region europe-west4 after 30m",
    "region us-central1 after 25m",
];

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

    /// Every alternative a create gives is the batch a user asking for it
    /// directly gets: `validate` of the reshaped batch in the alternative's
    /// region is exactly the alternative's cluster (less its own alternatives).
    #[test]
    fn every_alternative_is_what_validating_its_reshaped_batch_gives(
        rule in proptest::sample::subsequence(ALTERNATIVE_CHOICES.to_vec(), 0..=4).prop_shuffle(),
        own_type in proptest::sample::select(Accelerator::ALL.to_vec()),
        size in 0usize..8,
        instances in 2u32..9,
        memory_g in proptest::option::of(4u32..60),
        driver_like in proptest::bool::weighted(0.7),
        region in proptest::sample::select(vec!["us-central1", "europe-west4", "asia-southeast1"]),
        dynamic in proptest::option::of((2u32..6, 0u32..3, proptest::option::of(2u32..12))),
    ) {
        use proptest::prelude::*;
        let p = {
            let mut p = policy(&[]);
            let alternatives: Vec<String> = rule.iter().map(|r| r.to_string()).collect();
            p.alternative_rules = vec![rule_from_config(None, None, None, &alternatives, &[], None).expect("ladder")];
            p
        };
        let allowed = own_type.allowed_cores();
        let cores = allowed[size % allowed.len()].to_string();
        let instances = instances.to_string();
        let memory = memory_g.map(|g| format!("{g}g"));
        let mut extra = vec![
            ("spark.dataproc.executor.resource.accelerator.type", own_type.name()),
            ("spark.executor.cores", cores.as_str()),
            ("spark.executor.instances", instances.as_str()),
        ];
        if driver_like {
            extra.push(("spark.dataproc.driver.resource.accelerator.type", own_type.name()));
            if own_type != Accelerator::L4 {
                extra.push(("spark.driver.cores", "12"));
            }
        }
        if let Some(m) = memory.as_deref() {
            extra.push(("spark.executor.memory", m));
        }
        // Dynamic allocation: minExecutors, initialExecutors (not below
        // it) and maybe maxExecutors, which the alternative's gang must fit.
        let dynamic = dynamic.map(|(min, more, max)| {
            (min.to_string(), (min + more).to_string(), max.map(|m| m.to_string()))
        });
        if let Some((min, initial, max)) = &dynamic {
            extra.push(("spark.dynamicAllocation.enabled", "true"));
            extra.push(("spark.dynamicAllocation.minExecutors", min.as_str()));
            extra.push(("spark.dynamicAllocation.initialExecutors", initial.as_str()));
            if let Some(max) = max {
                extra.push(("spark.dynamicAllocation.maxExecutors", max.as_str()));
            }
        }
        let b = flex(&extra);
        let Ok(own) = validate_create(&b, Default::default(), "demo", region, &p) else {
            // Not a valid batch here (a GPU type the region lacks, too
            // much memory): nothing to check.
            return Ok(());
        };
        for alternative in &own.alternatives {
            let reshaped = reshape(&b, &own.cluster, &alternative.target);
            let direct = crate::spec::validate(&reshaped, "demo", &alternative.region, &p);
            prop_assert!(direct.is_ok(), "rung {} ({}): {:?}", alternative.index, alternative.target, direct);
            let direct = direct.expect("valid").cluster;
            prop_assert_eq!(&direct, &alternative.cluster, "rung {} ({})", alternative.index, alternative.target);
            // The alternative's gang holds the own executors' GPUs, rounded up to
            // whole executors, never more (dynamic allocation's bounds
            // included: they follow the alternative's executors).
            let held = |c: &ClusterRequest| u64::from(c.executor_count) * u64::from(c.executor.gpus);
            if alternative.cluster.executor.gpus > 0 {
                prop_assert!(
                    held(&alternative.cluster) < held(&own.cluster) + u64::from(alternative.cluster.executor.gpus),
                    "rung {} ({}): {} executors of {} GPUs for {} GPUs",
                    alternative.index, alternative.target, alternative.cluster.executor_count,
                    alternative.cluster.executor.gpus, held(&own.cluster)
                );
            }
            // And what the core is given is what Spark is given.
            let (_, placed) = as_placed(&b, &own.cluster, &own.alternatives, alternative.index);
            prop_assert_eq!(&placed, &alternative.cluster);
        }
    }
}

#[test]
fn an_operator_alternative_that_does_not_apply_is_skipped_not_an_error() {
    // asia-southeast1 offers only L4: the A100 alternative cannot apply there.
    let p = policy(&[(&["a100-40 after 15m"], &[])]);
    let b = flex(&[]);
    let own =
        validate_create(&b, Default::default(), "demo", "asia-southeast1", &p).expect("valid");
    assert!(own.alternatives.is_empty());
    let (_, skipped) = resolve(&b, &own.cluster, "demo", "asia-southeast1", &p).expect("resolves");
    assert_eq!(skipped.len(), 1);
    assert!(skipped[0].why.contains("not offered"), "{}", skipped[0].why);
}
