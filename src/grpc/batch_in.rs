//! A CreateBatch's batch as the engine's [`Batch`], field by field.
//!
//! Every create crosses this, and the proto3 JSON route of
//! [`super::convert::decode`] (typed message → dynamic message → JSON text
//! → the engine's Batch) was the largest single cost gRPC added to a create
//! (BENCHMARKS.md, gRPC). So the batch a client may write — its workload,
//! labels, runtime and environment config — is mapped here directly, and
//! anything else set in the message (a field flexq does not take, an
//! output-only one, a duration out of range) sends the whole batch down
//! the JSON route, which accepts or refuses it naming the field, exactly
//! as before. The two routes are held equal by a property test over
//! arbitrary batches (`batch_in::tests`), and a test lists every field of
//! every message read here in the vendored protos (`proto/`, the JSON
//! route's descriptors), so a field they gain fails it instead of being
//! dropped silently.

use googleapis_tonic_google_cloud_dataproc_v1::google::cloud::dataproc::v1 as dp;

use super::convert::{BATCH, decode, non_empty};
use crate::api::{
    Batch, EnvironmentConfig, ExecutionConfig, PeripheralsConfig, PySparkBatch, RuntimeConfig,
    SparkBatch, SparkHistoryServerConfig, SparkSqlBatch,
};
use crate::engine::Error;

/// A CreateBatch's batch as the engine reads it: directly when
/// [`user_batch`] takes it, else through its proto3 JSON, which names
/// what it refuses (as `batch.…`).
pub(super) fn request_batch(b: &dp::Batch) -> Result<Batch, Error> {
    match user_batch(b) {
        Some(direct) => Ok(direct),
        None => decode(BATCH, "batch", b),
    }
}

/// The batch, when it sets only fields mapped here; None when the JSON
/// route must judge it.
pub(super) fn user_batch(b: &dp::Batch) -> Option<Batch> {
    if sets_output_only(b) {
        return None;
    }
    let mut batch = Batch {
        labels: sorted(&b.labels),
        ..Batch::default()
    };
    set_workload(&mut batch, &b.batch_config)?;
    if let Some(r) = &b.runtime_config {
        batch.runtime_config = Some(runtime_config(r)?);
    }
    if let Some(e) = &b.environment_config {
        batch.environment_config = Some(environment_config(e)?);
    }
    Some(batch)
}

/// Whether the batch sets an output-only field: taken (and then ignored)
/// by the JSON route.
fn sets_output_only(b: &dp::Batch) -> bool {
    !b.name.is_empty()
        || !b.uuid.is_empty()
        || b.create_time.is_some()
        || b.runtime_info.is_some()
        || b.state != 0
        || !b.state_message.is_empty()
        || b.state_time.is_some()
        || !b.creator.is_empty()
        || !b.operation.is_empty()
        || !b.state_history.is_empty()
}

/// Sets the batch's workload from its batch config; None for a workload
/// not mapped here (SparkR).
fn set_workload(batch: &mut Batch, config: &Option<dp::batch::BatchConfig>) -> Option<()> {
    match config {
        None => {}
        Some(dp::batch::BatchConfig::PysparkBatch(p)) => {
            batch.pyspark_batch = Some(PySparkBatch {
                main_python_file_uri: p.main_python_file_uri.clone(),
                args: p.args.clone(),
                python_file_uris: p.python_file_uris.clone(),
                jar_file_uris: p.jar_file_uris.clone(),
                file_uris: p.file_uris.clone(),
                archive_uris: p.archive_uris.clone(),
            })
        }
        Some(dp::batch::BatchConfig::SparkBatch(s)) => {
            use dp::spark_batch::Driver;
            // A oneof member is present even when empty, as in its JSON.
            let (main_jar_file_uri, main_class) = match &s.driver {
                None => (None, None),
                Some(Driver::MainJarFileUri(jar)) => (Some(jar.clone()), None),
                Some(Driver::MainClass(class)) => (None, Some(class.clone())),
            };
            batch.spark_batch = Some(SparkBatch {
                main_jar_file_uri,
                main_class,
                args: s.args.clone(),
                jar_file_uris: s.jar_file_uris.clone(),
                file_uris: s.file_uris.clone(),
                archive_uris: s.archive_uris.clone(),
            })
        }
        Some(dp::batch::BatchConfig::SparkSqlBatch(q)) => {
            batch.spark_sql_batch = Some(SparkSqlBatch {
                query_file_uri: q.query_file_uri.clone(),
                query_variables: sorted(&q.query_variables),
                jar_file_uris: q.jar_file_uris.clone(),
            })
        }
        Some(dp::batch::BatchConfig::SparkRBatch(_)) => return None,
    }
    Some(())
}

/// The runtime config; None when it sets a field not mapped here.
fn runtime_config(r: &dp::RuntimeConfig) -> Option<RuntimeConfig> {
    if r.repository_config.is_some() || r.autotuning_config.is_some() || !r.cohort.is_empty() {
        return None;
    }
    Some(RuntimeConfig {
        version: non_empty(r.version.clone()),
        container_image: non_empty(r.container_image.clone()),
        properties: sorted(&r.properties),
    })
}

/// The environment config; None when its execution config sets a field
/// not mapped here or a duration the JSON route must judge.
fn environment_config(e: &dp::EnvironmentConfig) -> Option<EnvironmentConfig> {
    let execution_config = match &e.execution_config {
        None => None,
        Some(x) => Some(execution_config(x)?),
    };
    let peripherals_config = e.peripherals_config.as_ref().map(|p| PeripheralsConfig {
        metastore_service: non_empty(p.metastore_service.clone()),
        spark_history_server_config: p.spark_history_server_config.as_ref().map(|s| {
            SparkHistoryServerConfig {
                dataproc_cluster: non_empty(s.dataproc_cluster.clone()),
            }
        }),
    });
    Some(EnvironmentConfig {
        execution_config,
        peripherals_config,
    })
}

/// The execution config; None when it sets an authentication config or a
/// duration the JSON route must judge.
fn execution_config(x: &dp::ExecutionConfig) -> Option<ExecutionConfig> {
    if x.authentication_config.is_some() {
        return None;
    }
    use dp::execution_config::Network;
    let (network_uri, subnetwork_uri) = match &x.network {
        None => (None, None),
        Some(Network::NetworkUri(n)) => (Some(n.clone()), None),
        Some(Network::SubnetworkUri(n)) => (None, Some(n.clone())),
    };
    Some(ExecutionConfig {
        service_account: non_empty(x.service_account.clone()),
        network_uri,
        subnetwork_uri,
        network_tags: x.network_tags.clone(),
        kms_key: non_empty(x.kms_key.clone()),
        idle_ttl: duration(&x.idle_ttl)?,
        ttl: duration(&x.ttl)?,
        staging_bucket: non_empty(x.staging_bucket.clone()),
    })
}

fn sorted(
    map: &std::collections::HashMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The most seconds a `google.protobuf.Duration` holds (10,000 years).
const MAX_DURATION_SECONDS: i64 = 315_576_000_000;

/// A duration as its proto3 JSON text (`3600s`, `1.500s`): `Some(None)`
/// when unset, None when it is not a plain non-negative duration in range
/// (the JSON route judges those).
fn duration(d: &Option<prost_types::Duration>) -> Option<Option<String>> {
    match d {
        None => Some(None),
        Some(d)
            if (0..=MAX_DURATION_SECONDS).contains(&d.seconds)
                && (0..1_000_000_000).contains(&d.nanos) =>
        {
            Some(Some(d.to_string()))
        }
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn through_json(b: &dp::Batch) -> Result<Batch, crate::engine::Error> {
        decode(BATCH, "batch", b)
    }

    /// What a client usually sends: taken field by field, and equal to the
    /// JSON route's reading.
    #[test]
    fn a_usual_batch_is_mapped_directly_as_its_json_reads() {
        let batch = dp::Batch {
            batch_config: Some(dp::batch::BatchConfig::PysparkBatch(dp::PySparkBatch {
                main_python_file_uri: "file:///x.py".into(),
                args: vec!["1".into()],
                ..Default::default()
            })),
            labels: HashMap::from([("team".into(), "a".into())]),
            runtime_config: Some(dp::RuntimeConfig {
                version: "2.2".into(),
                properties: HashMap::from([
                    ("spark.executor.instances".into(), "2".into()),
                    (
                        "spark.dataproc.executor.resource.accelerator.type".into(),
                        "l4".into(),
                    ),
                ]),
                ..Default::default()
            }),
            environment_config: Some(dp::EnvironmentConfig {
                execution_config: Some(dp::ExecutionConfig {
                    ttl: Some(prost_types::Duration {
                        seconds: 3600,
                        nanos: 0,
                    }),
                    idle_ttl: Some(prost_types::Duration {
                        seconds: 1,
                        nanos: 500_000_000,
                    }),
                    network: Some(dp::execution_config::Network::SubnetworkUri("s".into())),
                    ..Default::default()
                }),
                peripherals_config: None,
            }),
            ..Default::default()
        };
        let direct = user_batch(&batch).expect("taken directly");
        assert_eq!(direct, through_json(&batch).expect("the JSON route"));
        let ttl = direct.environment_config.and_then(|e| e.execution_config);
        assert_eq!(
            ttl.map(|x| (x.ttl, x.idle_ttl)),
            Some((Some("3600s".into()), Some("1.500s".into())))
        );
    }

    #[test]
    fn what_flexq_does_not_take_goes_the_json_route_and_is_refused_there() {
        let refused = [
            dp::Batch {
                batch_config: Some(dp::batch::BatchConfig::SparkRBatch(Default::default())),
                ..Default::default()
            },
            dp::Batch {
                runtime_config: Some(dp::RuntimeConfig {
                    cohort: "c".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            dp::Batch {
                environment_config: Some(dp::EnvironmentConfig {
                    execution_config: Some(dp::ExecutionConfig {
                        authentication_config: Some(Default::default()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ];
        for b in refused {
            assert_eq!(user_batch(&b), None, "{b:?}");
            let e = through_json(&b).expect_err("refused");
            assert_eq!(e.code, crate::api::Code::InvalidArgument, "{b:?}");
        }
        let output_only = dp::Batch {
            state: dp::batch::State::Running as i32,
            ..Default::default()
        };
        assert_eq!(user_batch(&output_only), None);
    }

    /// Every field of every message read here, as the vendored protos
    /// have them: mapped, or sending the batch down the JSON route. A field
    /// they gain fails this until it is one or the other.
    #[test]
    fn every_field_of_the_messages_read_is_mapped_or_sent_the_json_way() {
        let pool = &*crate::grpc::convert::POOL;
        let expected: &[(&str, &[&str])] = &[
            (
                "Batch",
                &[
                    "name",
                    "uuid",
                    "create_time",
                    "pyspark_batch",
                    "spark_batch",
                    "spark_r_batch",
                    "spark_sql_batch",
                    "runtime_info",
                    "state",
                    "state_message",
                    "state_time",
                    "creator",
                    "labels",
                    "runtime_config",
                    "environment_config",
                    "operation",
                    "state_history",
                ],
            ),
            (
                "PySparkBatch",
                &[
                    "main_python_file_uri",
                    "args",
                    "python_file_uris",
                    "jar_file_uris",
                    "file_uris",
                    "archive_uris",
                ],
            ),
            (
                "SparkBatch",
                &[
                    "main_jar_file_uri",
                    "main_class",
                    "args",
                    "jar_file_uris",
                    "file_uris",
                    "archive_uris",
                ],
            ),
            (
                "SparkSqlBatch",
                &["query_file_uri", "query_variables", "jar_file_uris"],
            ),
            (
                "RuntimeConfig",
                &[
                    "version",
                    "container_image",
                    "properties",
                    "repository_config",
                    "autotuning_config",
                    "cohort",
                ],
            ),
            (
                "EnvironmentConfig",
                &["execution_config", "peripherals_config"],
            ),
            (
                "ExecutionConfig",
                &[
                    "service_account",
                    "network_uri",
                    "subnetwork_uri",
                    "network_tags",
                    "kms_key",
                    "idle_ttl",
                    "ttl",
                    "staging_bucket",
                    "authentication_config",
                ],
            ),
            (
                "PeripheralsConfig",
                &["metastore_service", "spark_history_server_config"],
            ),
            ("SparkHistoryServerConfig", &["dataproc_cluster"]),
        ];
        for (message, fields) in expected {
            let name = format!("google.cloud.dataproc.v1.{message}");
            let descriptor = pool.get_message_by_name(&name).expect("in the descriptors");
            let mut have: Vec<String> = descriptor.fields().map(|f| f.name().to_string()).collect();
            let mut want: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
            have.sort();
            want.sort();
            assert_eq!(have, want, "{message}");
        }
    }

    /// Empty, or a few characters JSON must escape among plain ones.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![Just(String::new()), r#"[a-z:/._ "\\é\n\t-]{1,8}"#]
    }

    fn texts() -> impl Strategy<Value = Vec<String>> {
        proptest::collection::vec(text(), 0..3)
    }

    fn map() -> impl Strategy<Value = HashMap<String, String>> {
        proptest::collection::hash_map(text(), text(), 0..3)
    }

    fn duration() -> impl Strategy<Value = Option<prost_types::Duration>> {
        proptest::option::of(
            (
                prop_oneof![
                    0..100_000i64,
                    Just(MAX_DURATION_SECONDS),
                    Just(-1),
                    Just(MAX_DURATION_SECONDS + 1)
                ],
                prop_oneof![
                    Just(0),
                    0..1_000_000_000i32,
                    Just(999_999_999),
                    Just(-1),
                    Just(1_000_000_000)
                ],
            )
                .prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
        )
    }

    fn workload() -> impl Strategy<Value = Option<dp::batch::BatchConfig>> {
        use dp::batch::BatchConfig as C;
        prop_oneof![
            Just(None),
            (text(), texts(), texts(), texts(), texts()).prop_map(
                |(main, args, py, jars, archives)| Some(C::PysparkBatch(dp::PySparkBatch {
                    main_python_file_uri: main,
                    args,
                    python_file_uris: py,
                    jar_file_uris: jars,
                    file_uris: vec![],
                    archive_uris: archives,
                }))
            ),
            (
                proptest::option::of((any::<bool>(), text())),
                texts(),
                texts()
            )
                .prop_map(|(driver, args, files)| {
                    use dp::spark_batch::Driver;
                    Some(C::SparkBatch(dp::SparkBatch {
                        args,
                        jar_file_uris: vec![],
                        file_uris: files,
                        archive_uris: vec![],
                        driver: driver.map(|(jar, t)| {
                            if jar {
                                Driver::MainJarFileUri(t)
                            } else {
                                Driver::MainClass(t)
                            }
                        }),
                    }))
                }),
            (text(), map(), texts()).prop_map(|(q, vars, jars)| Some(C::SparkSqlBatch(
                dp::SparkSqlBatch {
                    query_file_uri: q,
                    query_variables: vars,
                    jar_file_uris: jars,
                }
            ))),
            text().prop_map(|r| Some(C::SparkRBatch(dp::SparkRBatch {
                main_r_file_uri: r,
                ..Default::default()
            }))),
        ]
    }

    fn runtime() -> impl Strategy<Value = Option<dp::RuntimeConfig>> {
        proptest::option::of((text(), text(), map(), 0..3u8, text()).prop_map(
            |(version, image, properties, extra, cohort)| dp::RuntimeConfig {
                version,
                container_image: image,
                properties,
                repository_config: (extra == 1).then(Default::default),
                autotuning_config: (extra == 2).then(Default::default),
                cohort,
            },
        ))
    }

    fn environment() -> impl Strategy<Value = Option<dp::EnvironmentConfig>> {
        let execution = proptest::option::of(
            (
                (text(), texts(), text(), text()),
                (duration(), duration()),
                proptest::option::of((any::<bool>(), text())),
                any::<bool>(),
            )
                .prop_map(
                    |((account, tags, kms, bucket), (idle, ttl), network, auth)| {
                        use dp::execution_config::Network;
                        dp::ExecutionConfig {
                            service_account: account,
                            network_tags: tags,
                            kms_key: kms,
                            idle_ttl: idle,
                            ttl,
                            staging_bucket: bucket,
                            authentication_config: auth.then(Default::default),
                            network: network.map(|(whole, n)| {
                                if whole {
                                    Network::NetworkUri(n)
                                } else {
                                    Network::SubnetworkUri(n)
                                }
                            }),
                        }
                    },
                ),
        );
        let peripherals = proptest::option::of((text(), proptest::option::of(text())).prop_map(
            |(metastore, history)| dp::PeripheralsConfig {
                metastore_service: metastore,
                spark_history_server_config: history.map(|c| dp::SparkHistoryServerConfig {
                    dataproc_cluster: c,
                }),
            },
        ));
        proptest::option::of(
            (execution, peripherals).prop_map(|(execution, peripherals)| dp::EnvironmentConfig {
                execution_config: execution,
                peripherals_config: peripherals,
            }),
        )
    }

    /// A batch, and whether the generator set one of its output-only
    /// fields (each of the ten in turn).
    fn batch() -> impl Strategy<Value = (dp::Batch, bool)> {
        let time = prost_types::Timestamp {
            seconds: 1_796_000_000,
            nanos: 0,
        };
        (
            workload(),
            map(),
            runtime(),
            environment(),
            proptest::option::of(0..10u8),
        )
            .prop_map(move |(config, labels, runtime, environment, output)| {
                let mut b = dp::Batch {
                    batch_config: config,
                    labels,
                    runtime_config: runtime,
                    environment_config: environment,
                    ..Default::default()
                };
                match output {
                    None => {}
                    Some(0) => b.name = "projects/p/locations/r/batches/b".into(),
                    Some(1) => b.uuid = "u".into(),
                    Some(2) => b.create_time = Some(time),
                    Some(3) => b.runtime_info = Some(Default::default()),
                    Some(4) => b.state = dp::batch::State::Running as i32,
                    Some(5) => b.state_message = "m".into(),
                    Some(6) => b.state_time = Some(time),
                    Some(7) => b.creator = "c".into(),
                    Some(8) => b.operation = "o".into(),
                    Some(_) => {
                        b.state_history = vec![dp::batch::StateHistory {
                            state: dp::batch::State::Pending as i32,
                            state_message: String::new(),
                            state_start_time: Some(time),
                        }]
                    }
                }
                (b, output.is_some())
            })
    }

    /// Whether `batch()` made a batch with nothing but what a client may
    /// write, output-only fields apart (told from what the generator set,
    /// not by the code under test).
    fn plain(b: &dp::Batch) -> bool {
        let in_range = |d: &Option<prost_types::Duration>| {
            d.as_ref().is_none_or(|d| {
                (0..=315_576_000_000).contains(&d.seconds) && (0..1_000_000_000).contains(&d.nanos)
            })
        };
        let sparkr = matches!(b.batch_config, Some(dp::batch::BatchConfig::SparkRBatch(_)));
        let runtime = b.runtime_config.as_ref().is_none_or(|r| {
            r.autotuning_config.is_none() && r.repository_config.is_none() && r.cohort.is_empty()
        });
        let execution = b
            .environment_config
            .as_ref()
            .and_then(|e| e.execution_config.as_ref())
            .is_none_or(|x| {
                x.authentication_config.is_none() && in_range(&x.ttl) && in_range(&x.idle_ttl)
            });
        !sparkr && runtime && execution
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Taken directly, a batch is what the JSON route reads; a batch
        /// the JSON route refuses is never taken directly.
        #[test]
        fn the_direct_mapping_reads_what_the_json_route_reads((b, output_only) in batch()) {
            prop_assert_eq!(user_batch(&b).is_some(), plain(&b) && !output_only, "{:?}", b);
            match (user_batch(&b), through_json(&b)) {
                (Some(direct), Ok(json)) => prop_assert_eq!(direct, json),
                (Some(direct), Err(e)) => {
                    prop_assert!(false, "taken directly as {:?}, refused by the JSON route: {}", direct, e.message)
                }
                (None, _) => {}
            }
        }
    }
}
