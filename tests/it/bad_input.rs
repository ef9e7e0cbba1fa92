//! Hostile and malformed input: every case gets a 4xx `google.rpc.Status`
//! naming the field, never a 5xx, a hang or a stored batch.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{TestServer, assert_status, flex_batch, flex_with};

/// Sends a raw body; returns status and the parsed error.
async fn raw(
    s: &TestServer,
    query: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (u16, Value) {
    let mut req = s.http.post(format!("{}?{query}", s.batches())).body(body);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let resp = tokio::time::timeout(Duration::from_secs(20), req.send())
        .await
        .expect("no hang")
        .expect("answered");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not a JSON Status: {text}"));
    (status, value)
}

#[track_caller]
fn mentions(body: &Value, fragment: &str) {
    let text = body.to_string();
    assert!(text.contains(fragment), "expected {fragment:?} in {body:#}");
}

#[tokio::test]
async fn malformed_bodies_get_a_status_that_says_what_is_wrong() {
    let s = TestServer::start().await;
    let json = Some("application/json");
    let cases: Vec<(&str, Option<&str>, Vec<u8>, &str)> = vec![
        ("empty body", json, vec![], "empty"),
        ("whitespace body", json, b"  \n".to_vec(), "empty"),
        (
            "truncated JSON",
            json,
            br#"{"pysparkBatch": {"mainPython"#.to_vec(),
            "EOF",
        ),
        (
            "not an object",
            json,
            b"[1,2]".to_vec(),
            "must be a JSON object",
        ),
        ("wrong type", json, br#"{"labels": 7}"#.to_vec(), "labels"),
        (
            "wrong nested type",
            json,
            br#"{"runtimeConfig": {"properties": {"a": 1}}}"#.to_vec(),
            "runtimeConfig.properties.a",
        ),
        (
            "unknown top-level field",
            json,
            br#"{"pysparkBatch": {"mainPythonFileUri": "x"}, "colour": "blue"}"#.to_vec(),
            "colour",
        ),
        (
            "unknown nested field",
            json,
            br#"{"pysparkBatch": {"mainPythonFileUri": "x", "argz": []}}"#.to_vec(),
            "pysparkBatch.argz",
        ),
        (
            "invalid UTF-8",
            json,
            b"{\"labels\": {\"a\": \"\xff\"}}".to_vec(),
            "body",
        ),
        (
            "wrong content type",
            Some("text/plain"),
            br#"{}"#.to_vec(),
            "Content-Type",
        ),
        ("no content type", None, br#"{}"#.to_vec(), "Content-Type"),
        (
            "form content type",
            Some("application/x-www-form-urlencoded"),
            b"a=b".to_vec(),
            "Content-Type",
        ),
        (
            "huge number",
            json,
            br#"{"labels": {"a": 1e999}}"#.to_vec(),
            "labels",
        ),
    ];
    for (what, ct, body, fragment) in cases {
        let (st, err) = raw(&s, "", ct, body).await;
        assert_status(st, &err, 400, "INVALID_ARGUMENT");
        mentions(&err, fragment);
        let _ = what;
    }
    assert!(s.list_all("").await.is_empty(), "nothing was stored");
}

#[tokio::test]
async fn a_ten_megabyte_body_is_refused_without_reading_it_all() {
    let s = TestServer::start().await;
    let mut body = flex_batch();
    body["labels"] = json!({"big": "x".repeat(10 * 1024 * 1024)});
    let (st, err) = raw(
        &s,
        "",
        Some("application/json"),
        serde_json::to_vec(&body).expect("encode"),
    )
    .await;
    assert_status(st, &err, 413, "RESOURCE_EXHAUSTED");
    mentions(&err, "max_body_bytes");
}

/// The same body sent chunked (no length given): read until the limit,
/// then refused the same way.
#[tokio::test]
async fn a_chunked_body_over_the_limit_is_413_too() {
    let s = TestServer::start().await;
    let mut body = flex_batch();
    body["labels"] = json!({"big": "x".repeat(10 * 1024 * 1024)});
    let bytes = serde_json::to_vec(&body).expect("encode");
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        bytes.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    let r = s
        .http
        .post(s.url("/v1/projects/demo/locations/us-central1/batches"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .expect("send");
    let st = r.status().as_u16();
    let err: serde_json::Value = r.json().await.expect("json");
    assert_status(st, &err, 413, "RESOURCE_EXHAUSTED");
    mentions(&err, "max_body_bytes");
    assert!(s.list_all("").await.is_empty(), "nothing was stored");
}

#[tokio::test]
async fn oversized_properties_are_refused_by_name() {
    let s = TestServer::start().await;
    let (st, err) = s
        .create("", &flex_with("spark.app.name", &"v".repeat(100_000)))
        .await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    mentions(&err, "runtime_config.properties[spark.app.name]");

    let mut body = flex_batch();
    let props = body["runtimeConfig"]["properties"]
        .as_object_mut()
        .expect("properties");
    for i in 0..10_000 {
        props.insert(format!("spark.custom.k{i}"), json!("v"));
    }
    let (st, err) = s.create("", &body).await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    mentions(&err, "at most 1000");
    assert!(s.list_all("").await.is_empty());
}

#[tokio::test]
async fn ids_and_labels_with_unicode_or_control_characters_are_refused() {
    let s = TestServer::start().await;
    for id in [
        "bätch-1",
        "ab%0Acd",
        "UPPER-CASE",
        "a",
        "x%00yz",
        "-lead",
        &"z".repeat(64),
    ] {
        let (st, err) = s.create(&format!("batchId={id}"), &flex_batch()).await;
        assert_status(st, &err, 400, "INVALID_ARGUMENT");
        mentions(&err, "batch_id");
    }
    for id in ["has%20space", &"r".repeat(41), "emoji-%F0%9F%98%80"] {
        let (st, err) = s.create(&format!("requestId={id}"), &flex_batch()).await;
        assert_status(st, &err, 400, "INVALID_ARGUMENT");
        mentions(&err, "request_id");
    }
    for (k, v) in [
        ("Team", "x"),
        ("team", "ÜBER"),
        ("t\u{7}", "x"),
        ("team", "a\nb"),
        ("", "x"),
    ] {
        let mut body = flex_batch();
        body["labels"] = json!({ k: v });
        let (st, err) = s.create("", &body).await;
        assert_status(st, &err, 400, "INVALID_ARGUMENT");
        mentions(&err, "labels[");
    }
    assert!(s.list_all("").await.is_empty());
}

#[tokio::test]
async fn every_malformed_allocation_timeout_is_refused_with_the_accepted_form() {
    let s = TestServer::start().await;
    for bad in [
        "3600",
        "3600.5s",
        "-1s",
        "0s",
        "7201s",
        "1e3s",
        "3600S",
        "",
        "1h",
        "99999999999999999999s",
    ] {
        let (st, err) = s
            .create(
                "",
                &flex_with(
                    "spark.dataproc.executor.provisioning.allocationTimeout",
                    bad,
                ),
            )
            .await;
        assert_status(st, &err, 400, "INVALID_ARGUMENT");
        mentions(
            &err,
            "runtime_config.properties[spark.dataproc.executor.provisioning.allocationTimeout]",
        );
        mentions(&err, "from \\\"1s\\\" to \\\"7200s\\\"");
    }
    assert!(s.list_all("").await.is_empty());
}

#[tokio::test]
async fn negative_and_huge_numbers_in_properties_are_refused() {
    let s = TestServer::start().await;
    for (key, bad) in [
        ("spark.executor.instances", "-1"),
        ("spark.executor.instances", "99999999999999999999"),
        ("spark.executor.cores", "-4"),
        ("spark.executor.memory", "-1g"),
        ("spark.executor.memory", "99999999999999999999g"),
        ("spark.dataproc.executor.disk.size", "-375g"),
    ] {
        let (st, err) = s.create("", &flex_with(key, bad)).await;
        assert_status(st, &err, 400, "INVALID_ARGUMENT");
        mentions(&err, &format!("runtime_config.properties[{key}]"));
    }
}

#[tokio::test]
async fn all_violations_come_back_in_one_answer() {
    let s = TestServer::start().await;
    let mut body = flex_with("spark.executor.cores", "7");
    body["runtimeConfig"]["properties"]["spark.executor.instances"] = json!("1");
    body["labels"] = json!({"Bad": "x"});
    let (st, err) = s.create("batchId=X", &body).await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    let fields: Vec<&str> = err["error"]["details"][1]["fieldViolations"]
        .as_array()
        .expect("violations")
        .iter()
        .map(|v| v["field"].as_str().expect("field"))
        .collect();
    for f in [
        "batch_id",
        "runtime_config.properties[spark.executor.cores]",
        "runtime_config.properties[spark.executor.instances]",
        "labels[Bad]",
    ] {
        assert!(fields.contains(&f), "{f} missing from {fields:?}");
    }
}

#[tokio::test]
async fn unknown_query_parameters_are_refused() {
    let s = TestServer::start().await;
    let (st, err) = s.create("batchID=typo-1234", &flex_batch()).await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    mentions(&err, "batchID");
    assert!(s.list_all("").await.is_empty());
}

/// The system parameters are accepted on every route, those with
/// parameters of their own and those without, with or without their `$`
/// where Google's APIs take both; any other name is still refused by name.
#[tokio::test]
async fn system_parameters_are_accepted_everywhere_and_nothing_else() {
    let s = TestServer::start().await;
    let (st, op) = s.create("batchId=sys-1&$fields=name", &flex_batch()).await;
    assert_eq!(st, 200, "{op}");
    let system = "%24alt=json&%24fields=name&fields=name&%24prettyPrint=true&prettyPrint=false";
    for path in [
        "/v1/projects/demo/locations/us-central1/batches",
        "/v1/projects/demo/locations/us-central1/batches/sys-1",
        "/v1/projects/demo/locations/us-central1/batches/sys-1/output",
        "/v1/projects/demo/regions/us-central1/usage",
        "/v1/projects/demo/regions/us-central1/queue/entries",
        "/v1/projects/demo/regions/us-central1/queue",
        "/v1/regions",
    ] {
        let (st, body) = s.get(&format!("{path}?{system}")).await;
        assert_eq!(st, 200, "{path}: {body}");
        let (st, body) = s.get(&format!("{path}?%24alt=json&%24foo=1")).await;
        if path.ends_with("/queue") || path == "/v1/regions" {
            // Routes that read no query at all: as before, nothing there
            // is read, so nothing is refused.
            assert_eq!(st, 200, "{path}: {body}");
        } else {
            assert_status(st, &body, 400, "INVALID_ARGUMENT");
            mentions(&body, "$foo");
        }
    }
}

#[tokio::test]
async fn environment_errors_are_failed_preconditions() {
    let s = TestServer::start().await;
    let url = s.url("/v1/projects/demo/locations/asia-southeast1/batches");
    let body = flex_with(
        "spark.dataproc.executor.resource.accelerator.type",
        "a100-40",
    );
    let mut body = body;
    body["runtimeConfig"]["properties"]["spark.executor.cores"] = json!("12");
    let resp = s.http.post(url).json(&body).send().await.expect("create");
    let st = resp.status().as_u16();
    let err: Value = resp.json().await.expect("json");
    assert_status(st, &err, 400, "FAILED_PRECONDITION");
    mentions(&err, "not offered in region asia-southeast1");

    let url = s.url("/v1/projects/shielded-only/locations/us-central1/batches");
    let resp = s
        .http
        .post(url)
        .json(&flex_batch())
        .send()
        .await
        .expect("create");
    let st = resp.status().as_u16();
    let err: Value = resp.json().await.expect("json");
    assert_status(st, &err, 400, "FAILED_PRECONDITION");
    mentions(&err, "constraints/compute.requireShieldedVm");
}
