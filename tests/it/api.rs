//! The REST API of docs/api.md through real HTTP.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::support::{ServerProcess, TestServer, assert_status, flex_batch, sample};

fn batch_id_of(op: &Value) -> String {
    op["metadata"]["batch"]
        .as_str()
        .and_then(|b| b.rsplit('/').next())
        .expect("operation names its batch")
        .to_string()
}

#[tokio::test]
async fn create_returns_an_operation_and_the_batch_is_pending_with_history() {
    let s = TestServer::start().await;
    let (status, op) = s.create("batchId=etl-0001", &flex_batch()).await;
    assert_eq!(status, 200, "{op:#}");
    assert_eq!(op["done"], false);
    assert!(
        op["name"]
            .as_str()
            .expect("name")
            .starts_with("projects/demo/regions/us-central1/operations/")
    );
    assert_eq!(
        op["metadata"]["@type"],
        "type.googleapis.com/google.cloud.dataproc.v1.BatchOperationMetadata"
    );
    assert_eq!(
        op["metadata"]["batch"],
        "projects/demo/locations/us-central1/batches/etl-0001"
    );
    assert_eq!(op["metadata"]["operationType"], "BATCH");

    let (status, b) = s
        .get("/v1/projects/demo/locations/us-central1/batches/etl-0001")
        .await;
    assert_eq!(status, 200);
    assert_eq!(b["state"], "PENDING");
    assert_eq!(b["operation"], op["name"]);
    assert_eq!(b["uuid"], op["metadata"]["batchUuid"]);
    assert_eq!(b["createTime"], op["metadata"]["createTime"]);
    assert!(
        b["stateMessage"]
            .as_str()
            .expect("message")
            .contains("Queued"),
        "{b:#}"
    );
    assert_eq!(b["stateHistory"].as_array().expect("history").len(), 1);
    assert_eq!(b["stateHistory"][0]["state"], "PENDING");
    assert_eq!(
        b["runtimeConfig"],
        flex_batch()["runtimeConfig"],
        "the user's batch is kept as sent"
    );

    let (status, got) = s
        .get(&format!("/v1/{}", op["name"].as_str().expect("name")))
        .await;
    assert_eq!(status, 200);
    assert_eq!(got["name"], op["name"]);
}

#[tokio::test]
async fn a_generated_batch_id_follows_the_published_pattern() {
    let s = TestServer::start().await;
    let (status, op) = s.create("", &flex_batch()).await;
    assert_eq!(status, 200, "{op:#}");
    let id = batch_id_of(&op);
    assert!(flexq::api::check_batch_id(&id).is_ok(), "{id}");
}

#[tokio::test]
async fn output_only_fields_sent_by_a_client_are_ignored() {
    let s = TestServer::start().await;
    let mut body = flex_batch();
    body["state"] = json!("SUCCEEDED");
    body["name"] = json!("projects/x/locations/y/batches/forged");
    body["stateHistory"] = json!([]);
    let (status, op) = s.create("batchId=honest", &body).await;
    assert_eq!(status, 200, "{op:#}");
    let (_, b) = s
        .get("/v1/projects/demo/locations/us-central1/batches/honest")
        .await;
    assert_eq!(b["state"], "PENDING");
    assert_eq!(
        b["name"],
        "projects/demo/locations/us-central1/batches/honest"
    );
}

#[tokio::test]
async fn a_taken_batch_id_is_already_exists_and_only_one_concurrent_create_wins() {
    let s = TestServer::start().await;
    let attempts = 24;
    let results = futures_join(&s, attempts, |_| {
        ("batchId=contended".to_string(), flex_batch())
    })
    .await;
    let ok = results.iter().filter(|(st, _)| *st == 200).count();
    assert_eq!(ok, 1, "exactly one create of an id wins: {results:?}");
    for (st, body) in results.iter().filter(|(st, _)| *st != 200) {
        assert_status(*st, body, 409, "ALREADY_EXISTS");
    }
    assert_eq!(s.list_all("").await.len(), 1);
}

#[tokio::test]
async fn a_replayed_request_id_returns_the_first_operation_even_concurrently() {
    let s = TestServer::start().await;
    let results = futures_join(&s, 16, |i| {
        (format!("requestId=req-42&batchId=b-{i:04}"), flex_batch())
    })
    .await;
    let names: HashSet<&str> = results
        .iter()
        .map(|(st, op)| {
            assert_eq!(*st, 200, "{op:#}");
            op["name"].as_str().expect("operation name")
        })
        .collect();
    assert_eq!(names.len(), 1, "every replay answers the first operation");
    assert_eq!(s.list_all("").await.len(), 1, "one batch, not sixteen");

    // Later, after the first commit: still the same operation.
    let (st, again) = s.create("requestId=req-42", &flex_batch()).await;
    assert_eq!(st, 200);
    assert_eq!(again["name"].as_str(), names.into_iter().next());
}

/// Sends `n` creates at once; `make(i)` gives the query and body.
async fn futures_join(
    s: &TestServer,
    n: usize,
    make: impl Fn(usize) -> (String, Value),
) -> Vec<(u16, Value)> {
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let (query, body) = make(i);
        let http = s.http.clone();
        let url = format!("{}?{query}", s.batches());
        set.spawn(async move {
            let r = http.post(url).json(&body).send().await.expect("create");
            (r.status().as_u16(), r.json::<Value>().await.expect("json"))
        });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        out.push(r.expect("task"));
    }
    out
}

#[tokio::test]
async fn list_pages_are_newest_first_and_stable_while_batches_arrive() {
    let s = TestServer::start().await;
    for i in 0..45 {
        let (st, _) = s
            .create(&format!("batchId=page-{i:04}"), &flex_batch())
            .await;
        assert_eq!(st, 200);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let (st, page) = s
            .get(&format!(
                "/v1/projects/demo/locations/us-central1/batches?pageSize=20&pageToken={token}"
            ))
            .await;
        assert_eq!(st, 200, "{page:#}");
        pages += 1;
        for b in page["batches"].as_array().expect("batches") {
            seen.push(
                b["name"]
                    .as_str()
                    .expect("name")
                    .rsplit('/')
                    .next()
                    .expect("id")
                    .to_string(),
            );
        }
        assert_eq!(page["unreachable"], json!([]));
        // New batches arrive between pages: they must not shift the pages.
        let (st, _) = s
            .create(&format!("batchId=late-{pages:04}"), &flex_batch())
            .await;
        assert_eq!(st, 200);
        match page["nextPageToken"].as_str() {
            Some(t) if !t.is_empty() => token = t.to_string(),
            _ => break,
        }
    }
    let expected: Vec<String> = (0..45).rev().map(|i| format!("page-{i:04}")).collect();
    assert_eq!(
        seen, expected,
        "every batch once, newest first, no late arrival mixed in"
    );
    assert_eq!(pages, 3);
}

#[tokio::test]
async fn list_filters_by_state_id_and_time() {
    let s = TestServer::start().await;
    for id in ["keep-one", "keep-two", "gone-one"] {
        assert_eq!(
            s.create(&format!("batchId={id}"), &flex_batch()).await.0,
            200
        );
    }
    let (_, b) = s
        .get("/v1/projects/demo/locations/us-central1/batches/gone-one")
        .await;
    let op = b["operation"].as_str().expect("op").to_string();
    assert_eq!(s.post(&format!("/v1/{op}:cancel")).await.0, 200);

    let pending = s.list_all("filter=state%20%3D%20PENDING").await;
    assert_eq!(pending.len(), 2);
    let cancelled = s
        .list_all("filter=state%20%3D%20CANCELLED%20AND%20batch_id%20%3D%20gone-one")
        .await;
    assert_eq!(cancelled.len(), 1);
    let future = s
        .list_all("filter=create_time%20%3E%20%222999-01-01T00:00:00Z%22")
        .await;
    assert!(future.is_empty());
    let past = s
        .list_all("filter=create_time%20%3C%20%222999-01-01T00:00:00Z%22")
        .await;
    assert_eq!(past.len(), 3);

    let (st, body) = s
        .get("/v1/projects/demo/locations/us-central1/batches?filter=state%20%3D%20DONE")
        .await;
    assert_status(st, &body, 400, "INVALID_ARGUMENT");
    assert_eq!(
        body["error"]["details"][1]["fieldViolations"][0]["field"],
        "filter"
    );
}

#[tokio::test]
async fn list_parameters_are_checked() {
    let s = TestServer::start().await;
    for i in 0..3 {
        s.create(&format!("batchId=lp-{i:04}"), &flex_batch()).await;
    }
    let base = "/v1/projects/demo/locations/us-central1/batches";
    let (st, page) = s.get(&format!("{base}?pageSize=5000")).await;
    assert_eq!(st, 200, "a page size above 1000 is coerced: {page:#}");
    let (st, body) = s.get(&format!("{base}?pageSize=-1")).await;
    assert_status(st, &body, 400, "INVALID_ARGUMENT");
    let (st, body) = s.get(&format!("{base}?orderBy=create_time%20asc")).await;
    assert_status(st, &body, 400, "INVALID_ARGUMENT");
    let (st, _) = s.get(&format!("{base}?orderBy=create_time%20desc")).await;
    assert_eq!(st, 200);
    let (st, body) = s.get(&format!("{base}?pageToken=garbage")).await;
    assert_status(st, &body, 400, "INVALID_ARGUMENT");
    let (st, body) = s.get(&format!("{base}?pagesize=2")).await;
    assert_status(st, &body, 400, "INVALID_ARGUMENT");

    // A token is bound to its filter.
    let (_, page) = s.get(&format!("{base}?pageSize=1")).await;
    let token = page["nextPageToken"]
        .as_str()
        .expect("more pages")
        .to_string();
    let (st, body) = s
        .get(&format!(
            "{base}?pageSize=1&pageToken={token}&filter=state%20%3D%20PENDING"
        ))
        .await;
    assert_status(st, &body, 400, "INVALID_ARGUMENT");
}

#[tokio::test]
async fn cancel_of_a_pending_batch_ends_it_and_finishes_its_operation() {
    let s = TestServer::start().await;
    let (_, op) = s.create("batchId=to-cancel", &flex_batch()).await;
    let op_name = op["name"].as_str().expect("name");
    let (st, body) = s.post(&format!("/v1/{op_name}:cancel")).await;
    assert_eq!(st, 200, "{body:#}");
    assert_eq!(body, json!({}));

    let (_, b) = s
        .get("/v1/projects/demo/locations/us-central1/batches/to-cancel")
        .await;
    assert_eq!(b["state"], "CANCELLED");
    let mut states: Vec<&str> = b["stateHistory"]
        .as_array()
        .expect("history")
        .iter()
        .map(|h| h["state"].as_str().expect("state"))
        .collect();
    // The default config's virtual nodes may have allocated it first (a
    // second PENDING entry, "Allocated: ...").
    states.dedup();
    assert_eq!(states, ["PENDING", "CANCELLING", "CANCELLED"]);

    let (_, op) = s.get(&format!("/v1/{op_name}")).await;
    assert_eq!(op["done"], true);
    assert_eq!(op["error"]["code"], 1, "CANCELLED");
    assert!(op["metadata"]["doneTime"].is_string());

    let (st, body) = s.post(&format!("/v1/{op_name}:cancel")).await;
    assert_status(st, &body, 400, "FAILED_PRECONDITION");
    let (st, body) = s
        .post("/v1/projects/demo/regions/us-central1/operations/nope:cancel")
        .await;
    assert_status(st, &body, 404, "NOT_FOUND");
}

#[tokio::test]
async fn only_terminal_batches_can_be_deleted() {
    let s = TestServer::start().await;
    let (_, op) = s.create("batchId=to-delete", &flex_batch()).await;
    let path = "/v1/projects/demo/locations/us-central1/batches/to-delete";
    let (st, body) = s.delete(path).await;
    assert_status(st, &body, 400, "FAILED_PRECONDITION");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("PENDING")
    );
    s.post(&format!(
        "/v1/{}:cancel",
        op["name"].as_str().expect("name")
    ))
    .await;
    let (st, body) = s.delete(path).await;
    assert_eq!((st, body), (200, json!({})));
    let (st, body) = s.get(path).await;
    assert_status(st, &body, 404, "NOT_FOUND");
    let (st, body) = s.delete(path).await;
    assert_status(st, &body, 404, "NOT_FOUND");
}

#[tokio::test]
async fn official_clients_get_enums_as_numbers() {
    let s = TestServer::start().await;
    let (_, op) = s
        .create(
            "batchId=ints&%24alt=json%3Benum-encoding%3Dint",
            &flex_batch(),
        )
        .await;
    assert_eq!(op["metadata"]["operationType"], 1);
    let (_, b) = s
        .get("/v1/projects/demo/locations/us-central1/batches/ints?$alt=json;enum-encoding=int")
        .await;
    assert_eq!(b["state"], 1);
    assert_eq!(b["stateHistory"][0]["state"], 1);
    let (_, list) = s
        .get("/v1/projects/demo/locations/us-central1/batches?%24alt=json%3Benum-encoding%3Dint")
        .await;
    assert_eq!(list["batches"][0]["state"], 1);
    let (_, b) = s
        .get("/v1/projects/demo/locations/us-central1/batches/ints")
        .await;
    assert_eq!(b["state"], "PENDING", "names by default");
}

#[tokio::test]
async fn health_readiness_runtimes_and_unknown_routes() {
    let s = TestServer::start().await;
    assert_eq!(s.get("/healthz").await.0, 200);
    assert_eq!(s.get("/readyz").await.0, 200);
    let (_, rt) = s.get("/v1/runtimes").await;
    let versions: Vec<&str> = rt["runtimes"]
        .as_array()
        .expect("runtimes")
        .iter()
        .map(|r| r["version"].as_str().expect("version"))
        .collect();
    assert!(versions.contains(&"3.0"), "{rt:#}");
    assert!(
        rt["runtimes"][0]["xgboostVersion"].is_string(),
        "1.x carries XGBoost"
    );
    let (st, body) = s.get("/v2/whatever").await;
    assert_status(st, &body, 404, "NOT_FOUND");
    let resp = s.http.put(s.url("/healthz")).send().await.expect("put");
    let st = resp.status().as_u16();
    let body: Value = resp.json().await.expect("json");
    assert_status(st, &body, 404, "NOT_FOUND");
}

#[tokio::test]
async fn every_state_change_is_counted_in_metrics() {
    // A server process of its own: its counters move for this test's
    // batch alone, so the deltas are exact.
    let dir = tempfile::tempdir().expect("tempdir");
    let s = ServerProcess::start(dir.path()).await;
    let series = [
        "flexq_batch_transitions_total{state=\"PENDING\"}",
        "flexq_batch_transitions_total{state=\"CANCELLING\"}",
        "flexq_batch_transitions_total{state=\"CANCELLED\"}",
        "flexq_batches_ended_total{reason=\"cancelled\"}",
        "flexq_batch_transitions_total{state=\"FAILED\"}",
    ];
    let read = |text: String| {
        series.map(|name| sample(&text, name).unwrap_or_else(|| panic!("{name} missing:\n{text}")))
    };
    let before = read(s.scrape().await);
    assert_eq!(s.create("metric-1", &flex_batch()).await, 200);
    let b = s.batch("metric-1").await;
    let (st, _) = s
        .post(&format!(
            "/v1/{}:cancel",
            b["operation"].as_str().expect("op")
        ))
        .await;
    assert_eq!(st, 200);
    s.until("demo", "metric-1", |b| b["state"] == "CANCELLED")
        .await;
    let after = read(s.scrape().await);
    let deltas: Vec<f64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    assert_eq!(deltas, [1.0, 1.0, 1.0, 1.0, 0.0], "{series:?}");
}

/// The OpenAPI document is generated from the code: every route the server
/// serves is in it, with its methods, and the wire types' schemas use the
/// wire's field names.
#[tokio::test]
async fn the_openapi_document_describes_every_route() {
    let s = TestServer::start().await;
    let (st, doc) = s.get("/openapi.json").await;
    assert_eq!(st, 200);
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{doc}"
    );
    let routes = [
        ("get", "/v1/projects/{project}/locations/{region}/batches"),
        ("post", "/v1/projects/{project}/locations/{region}/batches"),
        (
            "get",
            "/v1/projects/{project}/locations/{region}/batches/{batch}",
        ),
        (
            "delete",
            "/v1/projects/{project}/locations/{region}/batches/{batch}",
        ),
        (
            "get",
            "/v1/projects/{project}/locations/{region}/batches/{batch}/output",
        ),
        (
            "get",
            "/v1/projects/{project}/locations/{region}/batches/{batch}/gpuUtilization",
        ),
        (
            "get",
            "/v1/projects/{project}/locations/{region}/batches/{batch}/executors",
        ),
        (
            "get",
            "/v1/projects/{project}/regions/{region}/operations/{operation}",
        ),
        (
            "post",
            "/v1/projects/{project}/regions/{region}/operations/{operation}",
        ),
        ("get", "/v1/projects/{project}/regions/{region}/quotas"),
        ("patch", "/v1/projects/{project}/regions/{region}/quotas"),
        ("get", "/v1/projects/{project}/regions/{region}/usage"),
        ("get", "/v1/projects/{project}/regions/{region}/queue"),
        (
            "get",
            "/v1/projects/{project}/regions/{region}/queue/entries",
        ),
        ("post", "/v1/projects/{project}/regions/{region}/queue:hold"),
        (
            "post",
            "/v1/projects/{project}/regions/{region}/queue:resume",
        ),
        ("get", "/v1/queues"),
        (
            "get",
            "/v1/projects/{project}/locations/{region}/batches:watch",
        ),
        ("post", "/v1/config:reload"),
        ("get", "/v1/runtimes"),
        ("get", "/v1/regions"),
        ("get", "/v1/principal"),
        ("get", "/v1/nodes"),
        ("post", "/v1/nodes:register"),
        ("post", "/v1/nodes/{node}"),
        ("get", "/healthz"),
        ("get", "/readyz"),
    ];
    let paths = doc["paths"].as_object().expect("paths");
    for (method, path) in routes {
        assert!(
            paths.get(path).is_some_and(|p| p.get(method).is_some()),
            "{method} {path} missing"
        );
    }
    let documented: usize = paths
        .values()
        .map(|p| p.as_object().map_or(0, |m| m.len()))
        .sum();
    assert_eq!(
        documented,
        routes.len(),
        "the document has routes the server does not: {paths:#?}"
    );
    // Every documented route is served (not the unknown-route fallback).
    for (method, path) in routes {
        let concrete = path
            .replace("{project}", "demo")
            .replace("{region}", "us-central1")
            .replace("{batch}", "nope")
            .replace("{operation}", "nope")
            .replace("{node}", "n1:heartbeat");
        let r = s
            .http
            .request(
                method.to_uppercase().parse().expect("method"),
                s.url(&concrete),
            )
            .send()
            .await
            .expect("request");
        let stream = r
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        if stream {
            // The event stream is served: it does not end, so it is not
            // read to its end here.
            continue;
        }
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        assert_ne!(
            body["error"]["details"][0]["reason"], "UNKNOWN_ROUTE",
            "{method} {concrete}"
        );
        assert_ne!(
            body["error"]["details"][0]["reason"], "METHOD_NOT_ALLOWED",
            "{method} {concrete}"
        );
    }
    let batch = &doc["components"]["schemas"]["Batch"]["properties"];
    for field in ["pysparkBatch", "runtimeConfig", "stateHistory", "flexq"] {
        assert!(batch.get(field).is_some(), "Batch.{field}: {batch:#}");
    }
    // A create answers its Operation or, validate-only, a verdict: the
    // document says both, and what a verdict holds.
    let create = &doc["paths"]["/v1/projects/{project}/locations/{region}/batches"]["post"]["responses"]
        ["200"]["content"]["application/json"]["schema"];
    let answers = create["$ref"]
        .as_str()
        .and_then(|r| r.rsplit('/').next())
        .map(|name| &doc["components"]["schemas"][name]["oneOf"])
        .and_then(Value::as_array)
        .map(|one_of| one_of.iter().map(ToString::to_string).collect::<Vec<_>>())
        .unwrap_or_default();
    assert!(
        answers.iter().any(|a| a.contains("Operation"))
            && answers.iter().any(|a| a.contains("ValidateVerdict")),
        "create's 200: {create:#} → {answers:?}"
    );
    let verdict = &doc["components"]["schemas"]["ValidateVerdict"]["properties"];
    for field in [
        "verdict",
        "reasons",
        "estimatedStartTime",
        "cluster",
        "alternatives",
    ] {
        assert!(
            verdict.get(field).is_some(),
            "ValidateVerdict.{field}: {verdict:#}"
        );
    }
}

/// A batch's usage in the Dataproc API's fields: while it holds its
/// cluster, `currentUsage` (GPUs × 1000, local SSD) and a growing
/// `approximateUsage`; once released, `approximateUsage` alone, GPUs ×
/// 1000 × the seconds from allocation to release, fixed from then on.
#[tokio::test]
async fn usage_is_reported_while_held_and_after_release() {
    // The default config's virtual L4 nodes take the batch at once.
    let s = TestServer::start_with(|_| {}).await;
    let (st, op) = s.create("batchId=used-gpus", &flex_batch()).await;
    assert_eq!(st, 200, "{op}");
    let path = "/v1/projects/demo/locations/us-central1/batches/used-gpus";
    let held = crate::support::until(&s, path, "allocated", |b| {
        b["flexq"]["provisioningState"] == "PROVISIONED"
    })
    .await;
    let current = &held["runtimeInfo"]["currentUsage"];
    // A driver and two executors of one L4 each; 375 GB of local SSD each.
    assert_eq!(current["milliAccelerator"], "3000", "{held:#}");
    assert_eq!(current["acceleratorType"], "l4");
    assert_eq!(current["shuffleStorageGb"], "1125");
    let millis = |b: &Value| -> u64 {
        b["runtimeInfo"]["approximateUsage"]["milliAcceleratorSeconds"]
            .as_str()
            .expect("an int64 string")
            .parse()
            .expect("a number")
    };
    let first = millis(&held);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let (_, later) = s.get(path).await;
    assert!(
        millis(&later) >= first + 3 * 500,
        "{first} then {}",
        millis(&later)
    );

    let name = op["name"].as_str().expect("operation name");
    let (st, _) = s.post(&format!("/v1/{name}:cancel")).await;
    assert_eq!(st, 200);
    let (_, ended) = s.get(path).await;
    assert_eq!(ended["state"], "CANCELLED", "{ended:#}");
    assert!(ended["runtimeInfo"]["currentUsage"].is_null(), "{ended:#}");
    let time = |v: &Value| {
        chrono::DateTime::parse_from_rfc3339(v.as_str().expect("a time")).expect("rfc3339")
    };
    let held_ms = (time(&ended["stateTime"]) - time(&ended["flexq"]["allocateTime"]))
        .num_milliseconds() as u64;
    assert_eq!(millis(&ended), 3 * held_ms, "{ended:#}");
    assert_eq!(
        ended["runtimeInfo"]["approximateUsage"]["shuffleStorageGbSeconds"],
        (1125 * held_ms / 1000).to_string()
    );
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (_, again) = s.get(path).await;
    assert_eq!(millis(&again), millis(&ended), "usage stops at the release");
}
