//! Translation between the gRPC messages and the engine's shapes. The
//! engine speaks the Dataproc resources in their REST form, which is their
//! proto3 JSON; so a resource crosses through that canonical JSON
//! (prost-reflect, over the descriptors of the served protos). Mapped by
//! hand, for a create's speed, are only the long-running Operation's
//! envelope and its metadata ([`encode_operation`],
//! [`operation_metadata`]) and the batch a client writes
//! (`super::batch_in`), each held equal to the JSON crossing by tests.
//! Errors become gRPC statuses carrying the same `google.rpc.Status`
//! details as over REST.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, SerializeOptions};
use serde::de::DeserializeOwned;
use tonic::Status;
use tonic_types::{ErrorDetails, StatusExt};

use googleapis_tonic_google_cloud_dataproc_v1::google::cloud::dataproc::v1 as dp;
use googleapis_tonic_google_longrunning::google::longrunning as lro;
use googleapis_tonic_google_rpc::google::rpc;

use crate::api::{
    BATCH_METADATA_TYPE_URL, BATCH_TYPE_URL, Code, FieldViolation, Operation, OperationMetadata,
    quote,
};
use crate::engine::Error;
use crate::engine::Reason;

pub(super) const BATCH: &str = "google.cloud.dataproc.v1.Batch";
#[cfg(test)]
const BATCH_METADATA: &str = "google.cloud.dataproc.v1.BatchOperationMetadata";

pub(crate) static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(super::DESCRIPTOR).expect("the descriptor set build.rs wrote")
});

fn descriptor(full_name: &str) -> Result<prost_reflect::MessageDescriptor, Error> {
    POOL.get_message_by_name(full_name)
        .ok_or_else(|| Error::internal(format!("no descriptor for {full_name}")))
}

/// A request message as one of the engine's shapes, through its proto3
/// JSON; `field` names the message in errors (`batch`). A field flexq does
/// not accept is refused with its path, as the REST body would be. The
/// JSON goes through bytes, not a `serde_json::Value`: a tree of maps costs
/// more to build than the text (see BENCHMARKS.md, gRPC).
pub(super) fn decode<M: prost::Message, T: DeserializeOwned>(
    full_name: &str,
    field: &str,
    message: &M,
) -> Result<T, Error> {
    let mut dynamic = DynamicMessage::new(descriptor(full_name)?);
    dynamic.transcode_from(message).map_err(Error::internal)?;
    let mut json = Vec::with_capacity(1024);
    dynamic
        .serialize_with_options(
            &mut serde_json::Serializer::new(&mut json),
            &SerializeOptions::new(),
        )
        .map_err(Error::internal)?;
    // Tracking the path costs a fifth of the deserialising: it is done
    // again, to name the field, only for a request that is refused.
    if let Ok(value) = serde_json::from_slice(&json) {
        return Ok(value);
    }
    let mut reader = serde_json::Deserializer::from_slice(&json);
    serde_path_to_error::deserialize(&mut reader).map_err(|err| {
        let path = err.path().to_string();
        let field = if path == "." {
            field.to_string()
        } else {
            format!("{field}.{path}")
        };
        let description = err.inner().to_string();
        Error::new(Reason::InvalidField, format!("{field}: {description}"))
            .with_meta("field", field.clone())
            .with_violations(vec![FieldViolation { field, description }])
    })
}

/// One of the engine's shapes as a response message, through its proto3
/// JSON. Keys the message does not have are left out: flexq's extensions
/// of the REST shape (a Batch's `flexq`, some `runtimeInfo` fields) and an
/// `Any`'s `@type`; a test (`the_rest_batch_and_the_proto_differ_only_where_said`)
/// keeps the list of what is left out exact.
pub(super) fn encode<T: serde::Serialize, M: prost::Message + Default>(
    full_name: &str,
    value: &T,
) -> Result<M, Error> {
    let json = serde_json::to_vec(value).map_err(Error::internal)?;
    let mut reader = serde_json::Deserializer::from_slice(&json);
    let dynamic = DynamicMessage::deserialize_with_options(
        descriptor(full_name)?,
        &mut reader,
        &DeserializeOptions::new().deny_unknown_fields(false),
    )
    .map_err(|e| Error::internal(format!("{full_name} from its REST shape: {e}")))?;
    reader.end().map_err(Error::internal)?;
    dynamic.transcode_to::<M>().map_err(Error::internal)
}

/// A batch's long-running operation. The envelope — name, done, the two
/// `Any`s, the error's code and message — is put together here, and so is
/// its `BatchOperationMetadata` ([`operation_metadata`]); the `Batch` of a
/// done one crosses through its proto3 JSON like every other resource.
/// (Transcoding the whole Operation as JSON made prost-reflect buffer each
/// `Any` to find its `@type`: a fifth of a gRPC create's conversion cost.)
pub(super) fn encode_operation(op: &Operation) -> Result<lro::Operation, Error> {
    use prost::Message;
    let metadata = operation_metadata(&op.metadata);
    let result = match (&op.error, &op.response) {
        (Some(e), _) => Some(lro::operation::Result::Error(rpc::Status {
            code: e.code,
            message: e.message.clone(),
            details: Vec::new(),
        })),
        (None, Some(batch)) => {
            let batch: dp::Batch = encode(BATCH, batch)?;
            Some(lro::operation::Result::Response(prost_types::Any {
                type_url: BATCH_TYPE_URL.to_string(),
                value: batch.encode_to_vec(),
            }))
        }
        (None, None) => None,
    };
    Ok(lro::Operation {
        name: op.name.clone(),
        metadata: Some(prost_types::Any {
            type_url: BATCH_METADATA_TYPE_URL.to_string(),
            value: metadata.encode_to_vec(),
        }),
        done: op.done,
        result,
    })
}

/// An operation's metadata as its message, field by field: every create,
/// cancel and get answers one, and its eight fields are flat, where the
/// proto3 JSON crossing cost a sixth of a gRPC create's server time. A
/// test (`operation_metadata_is_what_its_proto3_json_gives`) holds it equal
/// to that crossing, and fails when either side gains a field.
pub(super) fn operation_metadata(m: &OperationMetadata) -> dp::BatchOperationMetadata {
    use dp::batch_operation_metadata::BatchOperationType;
    let timestamp = |t: &chrono::DateTime<chrono::Utc>| {
        prost_types::Timestamp::from(std::time::SystemTime::from(*t))
    };
    dp::BatchOperationMetadata {
        batch: m.batch.clone(),
        batch_uuid: m.batch_uuid.clone(),
        create_time: Some(timestamp(&m.create_time)),
        done_time: m.done_time.as_ref().map(timestamp),
        operation_type: BatchOperationType::from_str_name(&m.operation_type)
            .unwrap_or(BatchOperationType::Unspecified) as i32,
        description: m.description.clone(),
        labels: m
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        warnings: m.warnings.clone(),
    }
}

/// The project and region of a parent `projects/P/{collection}/R`
/// ([`crate::api::parse_region_parent`]: either spelling of a region is
/// taken; `collection` is the one the error shows).
pub(super) fn parent(field: &str, text: &str, collection: &str) -> Result<(String, String), Error> {
    crate::api::parse_region_parent(text).ok_or_else(|| {
        Error::invalid_field(
            field,
            format!(
                "{} is not a parent; accepted: projects/PROJECT/{collection}/REGION",
                quote(text)
            ),
        )
    })
}

/// A resource name parsed by `parse`, or INVALID_ARGUMENT naming `field`
/// and the accepted `form`.
pub(super) fn name<T>(
    field: &str,
    text: &str,
    parse: impl FnOnce(&str) -> Option<T>,
    form: &str,
) -> Result<T, Error> {
    parse(text).ok_or_else(|| {
        Error::invalid_field(
            field,
            format!("{} is not a name; accepted: {form}", quote(text)),
        )
    })
}

/// An optional string field: proto3 sends the empty string for none.
pub(super) fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// A request's page size as the engine reads it (REST's text form); 0 is
/// none, as proto3 says.
pub(super) fn page_size(n: i32) -> Option<String> {
    (n != 0).then(|| n.to_string())
}

/// The gRPC code of an engine error.
pub(super) fn grpc_code(code: Code) -> tonic::Code {
    match code {
        Code::Cancelled => tonic::Code::Cancelled,
        Code::InvalidArgument => tonic::Code::InvalidArgument,
        Code::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        Code::NotFound => tonic::Code::NotFound,
        Code::AlreadyExists => tonic::Code::AlreadyExists,
        Code::PermissionDenied => tonic::Code::PermissionDenied,
        Code::ResourceExhausted => tonic::Code::ResourceExhausted,
        Code::FailedPrecondition => tonic::Code::FailedPrecondition,
        Code::Aborted => tonic::Code::Aborted,
        Code::OutOfRange => tonic::Code::OutOfRange,
        Code::Unimplemented => tonic::Code::Unimplemented,
        Code::Internal => tonic::Code::Internal,
        Code::Unavailable => tonic::Code::Unavailable,
        Code::Unauthenticated => tonic::Code::Unauthenticated,
    }
}

/// An engine error as a gRPC status: the code, the message and, in
/// `grpc-status-details-bin`, an ErrorInfo (reason, domain `flexq`,
/// metadata), the BadRequest field violations and, for a rate limit, a
/// RetryInfo. A server error's details stay in the server log
/// ([`Error::for_caller`]), as over REST.
pub(super) fn status(e: Error) -> Status {
    let e = e.for_caller();
    let code = grpc_code(e.code);
    let retry = e
        .metadata
        .get(crate::engine::RETRY_AFTER_SECONDS)
        .and_then(|s| s.parse::<u64>().ok());
    let metadata: HashMap<String, String> = e.metadata.into_iter().collect();
    let mut details = ErrorDetails::with_error_info(e.reason.name(), "flexq", metadata);
    for v in e.violations {
        details.add_bad_request_violation(v.field, v.description);
    }
    if let Some(secs) = retry {
        details.set_retry_info(Some(Duration::from_secs(secs)));
    }
    Status::with_error_details(code, e.message, details)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_parsed_or_refused_naming_the_field() {
        assert_eq!(
            parent("parent", "projects/p/locations/r", "locations").ok(),
            Some(("p".into(), "r".into()))
        );
        assert_eq!(
            parent("parent", "projects/p/regions/r", "locations").ok(),
            Some(("p".into(), "r".into())),
            "Airflow's spelling"
        );
        let e = parent("parent", "projects/p/zones/r", "locations").expect_err("not a region");
        assert_eq!(e.violations[0].field, "parent");
        assert!(
            e.message.contains("projects/PROJECT/locations/REGION"),
            "{}",
            e.message
        );
        let form = "projects/PROJECT/regions/REGION/operations/ID";
        let op = name(
            "name",
            "projects/p/regions/r/operations/o",
            crate::api::OperationName::parse,
            form,
        )
        .expect("an operation name");
        assert_eq!(
            (op.project, op.region, op.operation_id),
            ("p".into(), "r".into(), "o".into())
        );
        let e = name(
            "name",
            "projects/p/regions/r/operations/",
            crate::api::OperationName::parse,
            form,
        )
        .expect_err("no id");
        assert_eq!(e.violations[0].field, "name");
        assert!(e.message.contains(form), "{}", e.message);
    }

    #[test]
    fn a_batch_crosses_through_its_proto3_json_both_ways() {
        use googleapis_tonic_google_cloud_dataproc_v1::google::cloud::dataproc::v1 as dp;
        let json = serde_json::json!({
            "pysparkBatch": {"mainPythonFileUri": "file:///x.py", "args": ["1"]},
            "labels": {"team": "a"},
            "runtimeConfig": {"version": "3.0", "properties": {"spark.executor.instances": "2"}},
            "environmentConfig": {"executionConfig": {"ttl": "3600s"}},
            "state": "PENDING",
            "createTime": "2026-12-01T10:00:00Z"
        });
        let batch: dp::Batch = encode(BATCH, &json).expect("to prost");
        assert_eq!(batch.state, dp::batch::State::Pending as i32);
        assert_eq!(batch.labels.get("team").map(String::as_str), Some("a"));
        let ttl = batch
            .environment_config
            .as_ref()
            .and_then(|e| e.execution_config.as_ref())
            .and_then(|e| e.ttl)
            .expect("ttl");
        assert_eq!(ttl.seconds, 3600);
        let back: crate::api::Batch = decode(BATCH, "batch", &batch).expect("to the REST shape");
        assert_eq!(back.labels.get("team").map(String::as_str), Some("a"));
        assert_eq!(
            back.properties()
                .get("spark.executor.instances")
                .map(String::as_str),
            Some("2")
        );
        assert_eq!(
            back.pyspark_batch.map(|p| p.main_python_file_uri),
            Some("file:///x.py".to_string())
        );
    }

    /// The fields of a REST Batch that the Dataproc proto has not, so gRPC
    /// clients do not get them (what they say is in `stateMessage` too).
    const REST_ONLY: &[&str] = &[
        "flexq",
        "runtimeInfo.driverExitCode",
        "runtimeInfo.driverNode",
        "runtimeInfo.outputTruncated",
        "runtimeInfo.rapidsAccelerator",
    ];

    /// The keys of `json` that `message` has no field for, as paths.
    fn keys_not_in(
        message: &prost_reflect::MessageDescriptor,
        json: &serde_json::Value,
        prefix: &str,
        out: &mut Vec<String>,
    ) {
        let Some(object) = json.as_object() else {
            return;
        };
        for (key, value) in object {
            let path = format!("{prefix}{key}");
            let Some(field) = message.get_field_by_json_name(key) else {
                out.push(path);
                continue;
            };
            if let (prost_reflect::Kind::Message(inner), false) = (field.kind(), field.is_map()) {
                match value {
                    serde_json::Value::Array(items) => {
                        for item in items {
                            keys_not_in(&inner, item, &format!("{path}."), out);
                        }
                    }
                    _ => keys_not_in(&inner, value, &format!("{path}."), out),
                }
            }
        }
    }

    /// Every field of the REST Batch, set: only the ones [`REST_ONLY`]
    /// names are unknown to the Dataproc proto. A field added to one shape
    /// and not the other fails here instead of vanishing over gRPC.
    #[test]
    fn the_rest_batch_and_the_proto_differ_only_where_said() {
        let full = serde_json::json!({
            "name": "projects/p/locations/r/batches/b", "uuid": "u",
            "createTime": "2026-12-01T10:00:00Z",
            "pysparkBatch": {"mainPythonFileUri": "file:///x.py", "args": ["1"],
                "pythonFileUris": ["a"], "jarFileUris": ["b"], "fileUris": ["c"], "archiveUris": ["d"]},
            "runtimeInfo": {"endpoints": {"spark": "spark://h:7077"}, "outputUri": "o",
                "diagnosticOutputUri": "d", "rapidsAccelerator": "on", "driverNode": "n",
                "driverExitCode": 0, "outputTruncated": true,
                "approximateUsage": {"milliAcceleratorSeconds": "3000", "acceleratorType": "l4",
                    "shuffleStorageGbSeconds": "375"},
                "currentUsage": {"milliAccelerator": "3000", "acceleratorType": "l4",
                    "shuffleStorageGb": "375", "snapshotTime": "2026-12-01T10:00:00Z"}},
            "state": "SUCCEEDED", "stateMessage": "m", "stateTime": "2026-12-01T10:00:00Z",
            "creator": "c", "labels": {"k": "v"},
            "runtimeConfig": {"version": "3.0", "containerImage": "i", "properties": {"k": "v"}},
            "environmentConfig": {
                // The network is a oneof too: one of network and subnetwork.
                "executionConfig": {"serviceAccount": "s", "subnetworkUri": "s",
                    "networkTags": ["t"], "kmsKey": "k", "idleTtl": "60s", "ttl": "3600s",
                    "stagingBucket": "b"},
                "peripheralsConfig": {"metastoreService": "m",
                    "sparkHistoryServerConfig": {"dataprocCluster": "c"}}},
            "operation": "projects/p/regions/r/operations/o",
            "stateHistory": [{"state": "PENDING", "stateMessage": "m",
                "stateStartTime": "2026-12-01T10:00:00Z"}],
            "flexq": {"provisioningState": "RELEASED", "provisioningMode": "queue"}
        });
        // Through the REST type, so the sample is what the server writes.
        let batch: crate::api::Batch = serde_json::from_value(full).expect("a REST batch");
        let json = serde_json::to_value(&batch).expect("json");
        let mut unknown = Vec::new();
        keys_not_in(
            &descriptor(BATCH).expect("descriptor"),
            &json,
            "",
            &mut unknown,
        );
        unknown.sort();
        assert_eq!(unknown, REST_ONLY);
        // And the Spark and Spark SQL workloads.
        for workload in [
            // The driver is a class or a jar (a oneof; the rules take one).
            serde_json::json!({"sparkBatch": {"mainClass": "C", "args": ["a"],
                "jarFileUris": ["b"], "fileUris": ["c"], "archiveUris": ["d"]}}),
            serde_json::json!({"sparkBatch": {"mainJarFileUri": "j"}}),
            serde_json::json!({"sparkSqlBatch": {"queryFileUri": "q", "queryVariables": {"k": "v"},
                "jarFileUris": ["b"]}}),
        ] {
            let batch: crate::api::Batch = serde_json::from_value(workload).expect("a REST batch");
            let mut unknown = Vec::new();
            let json = serde_json::to_value(&batch).expect("json");
            keys_not_in(
                &descriptor(BATCH).expect("descriptor"),
                &json,
                "",
                &mut unknown,
            );
            assert!(unknown.is_empty(), "{unknown:?}");
            let _: dp::Batch = encode(BATCH, &batch).expect("the workload to its message");
        }
        let _: dp::Batch = encode(BATCH, &batch).expect("the whole batch to its message");
    }

    #[test]
    fn a_field_flexq_does_not_take_is_refused_with_its_path() {
        use googleapis_tonic_google_cloud_dataproc_v1::google::cloud::dataproc::v1 as dp;
        let batch = dp::Batch {
            batch_config: Some(dp::batch::BatchConfig::SparkRBatch(dp::SparkRBatch {
                main_r_file_uri: "file:///x.R".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let e = decode::<_, crate::api::Batch>(BATCH, "batch", &batch).expect_err("no SparkR");
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains("sparkRBatch"), "{}", e.message);
    }

    #[test]
    fn operation_metadata_is_what_its_proto3_json_gives() {
        let at = |s: &str| s.parse::<chrono::DateTime<chrono::Utc>>().expect("a time");
        let full = OperationMetadata {
            type_url: BATCH_METADATA_TYPE_URL.into(),
            batch: "projects/p/locations/r/batches/b".into(),
            batch_uuid: "u".into(),
            create_time: at("2026-12-01T10:00:00.123456789Z"),
            done_time: Some(at("2026-12-01T11:00:00Z")),
            operation_type: "BATCH".into(),
            description: "Batch".into(),
            labels: [("a".to_string(), "1".to_string()), ("b".into(), "2".into())].into(),
            warnings: vec!["w".into()],
        };
        let undone = OperationMetadata {
            done_time: None,
            labels: Default::default(),
            warnings: Vec::new(),
            ..full.clone()
        };
        for m in [full, undone] {
            let direct = operation_metadata(&m);
            let crossed: dp::BatchOperationMetadata =
                encode(BATCH_METADATA, &m).expect("through proto3 JSON");
            assert_eq!(direct, crossed, "{m:?}");
            assert_eq!(direct.operation_type, 1, "BATCH");
        }
        // Every field of the message is one this maps (a new one fails here).
        let fields: Vec<String> = descriptor(BATCH_METADATA)
            .expect("descriptor")
            .fields()
            .map(|f| f.name().to_string())
            .collect();
        assert_eq!(
            fields,
            [
                "batch",
                "batch_uuid",
                "create_time",
                "done_time",
                "operation_type",
                "description",
                "labels",
                "warnings"
            ]
        );
    }

    #[test]
    fn errors_carry_their_details() {
        let e = Error::invalid_field("batch_id", "too short");
        let s = status(e);
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        let details = s.get_error_details();
        assert_eq!(
            details.error_info().map(|i| i.reason.as_str()),
            Some("INVALID_FIELD")
        );
        let violations = details
            .bad_request()
            .map(|b| b.field_violations.clone())
            .unwrap_or_default();
        assert_eq!(violations[0].field, "batch_id");
        let internal = status(Error::internal("secret path /etc/x"));
        assert!(
            !internal.message().contains("secret"),
            "{}",
            internal.message()
        );
    }
}
