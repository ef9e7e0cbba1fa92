//! Hold and resume: a held queue allocates nothing but keeps its order and
//! its deadlines, accepts creates, says why with who and since when, keeps
//! its hold across a SIGKILL and restart, and allocates in order once
//! resumed. A region's hold covers every project; bad input is named.

use std::time::Duration;

use serde_json::Value;

use crate::support::{ServerProcess, flex_batch, flex_with, virtual_l4_config};

const REGION: &str = "us-central1";

async fn call(s: &ServerProcess, method: reqwest::Method, path: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .request(method, format!("{}{path}", s.endpoint))
        .send()
        .await
        .expect("call");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn hold(s: &ServerProcess, project: &str, verb: &str) -> Value {
    let (status, body) = call(
        s,
        reqwest::Method::POST,
        &format!("/v1/projects/{project}/regions/{REGION}/queue:{verb}"),
    )
    .await;
    assert_eq!(status, 200, "{body:#}");
    body
}

async fn create(s: &ServerProcess, project: &str, id: &str, body: &Value) {
    let r = reqwest::Client::new()
        .post(format!(
            "{}/v1/projects/{project}/locations/{REGION}/batches?batchId={id}",
            s.endpoint
        ))
        .json(body)
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
}

fn provisioning(b: &Value) -> &str {
    b["flexq"]["provisioningState"].as_str().unwrap_or_default()
}

fn first_reason(b: &Value) -> String {
    b["flexq"]["notAdmittedReasons"][0]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_queue_keeps_order_and_deadlines_and_resumes_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    // One virtual node of 4 L4 GPUs: one 3-GPU batch at a time.
    let config = dir.path().join("one-node.toml");
    virtual_l4_config(&config, 1);
    let mut s = ServerProcess::start_with(dir.path(), Some(&config)).await;

    let held = hold(&s, "demo", "hold").await;
    assert_eq!(held["held"], true, "{held:#}");
    assert_eq!(held["heldBy"], "anonymous");
    assert_eq!(held["regionWide"], false);

    // Creates are accepted; nothing is allocated though the node is free.
    create(&s, "demo", "first", &flex_batch()).await;
    create(&s, "demo", "second", &flex_batch()).await;
    let first = s
        .until("demo", "first", |b| !first_reason(b).is_empty())
        .await;
    assert_eq!(provisioning(&first), "QUEUED");
    assert!(
        first_reason(&first)
            .starts_with("this project's queue is held by an admin (anonymous) since"),
        "{first:#}"
    );
    assert!(first["flexq"]["estimatedStartTime"].is_null(), "{first:#}");
    assert_eq!(first["flexq"]["queuePosition"], 1);
    let deadline = first["flexq"]["allocationDeadline"].clone();
    // The deadline keeps counting: a batch of 2 s expires while held.
    create(
        &s,
        "demo",
        "impatient",
        &flex_with(
            "spark.dataproc.executor.provisioning.allocationTimeout",
            "2s",
        ),
    )
    .await;
    s.until("demo", "impatient", |b| b["state"] == "FAILED")
        .await;
    // Another project's queue is not held.
    create(&s, "light", "elsewhere", &flex_batch()).await;
    s.until("light", "elsewhere", |b| provisioning(b) == "PROVISIONED")
        .await;
    let op = s.batch_of("light", "elsewhere").await["operation"]
        .as_str()
        .expect("operation")
        .to_string();
    let (status, _) = call(&s, reqwest::Method::POST, &format!("/v1/{op}:cancel")).await;
    assert_eq!(status, 200);

    // The region's hold covers every project; resuming the project's own
    // hold leaves it held by the region's.
    let region = hold(&s, "-", "hold").await;
    assert_eq!(region["regionWide"], true, "{region:#}");
    hold(&s, "demo", "resume").await;
    let (_, queues) = call(&s, reqwest::Method::GET, "/v1/queues").await;
    let list = queues["queues"].as_array().expect("queues");
    assert_eq!(list.len(), 1, "{queues:#}");
    assert_eq!(list[0]["project"], "-");
    assert_eq!(list[0]["queuedBatches"], 2);
    let first = s.batch_of("demo", "first").await;
    assert!(
        first_reason(&first).starts_with("the region's queue is held"),
        "{first:#}"
    );
    let metrics = reqwest::get(format!("{}/metrics", s.metrics_endpoint))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains(r#"flexq_queue_held{project="-",region="us-central1"} 1"#),
        "{metrics}"
    );

    // A SIGKILL and restart keep the hold, the order and the deadlines.
    s.kill9();
    let s = ServerProcess::start_with(dir.path(), Some(&config)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first = s.batch_of("demo", "first").await;
    assert_eq!(provisioning(&first), "QUEUED", "{first:#}");
    assert_eq!(first["flexq"]["allocationDeadline"], deadline);
    assert!(
        first_reason(&first).contains("held by an admin"),
        "{first:#}"
    );

    // Resumed: the older batch goes first, the other waits behind it.
    let resumed = hold(&s, "-", "resume").await;
    assert_eq!(resumed["held"], false, "{resumed:#}");
    s.until("demo", "first", |b| provisioning(b) == "PROVISIONED")
        .await;
    let second = s.batch_of("demo", "second").await;
    assert_eq!(provisioning(&second), "QUEUED", "{second:#}");
    assert_eq!(second["flexq"]["queuePosition"], 1);
    assert!(!first_reason(&second).contains("held"), "{second:#}");
    let (_, queues) = call(&s, reqwest::Method::GET, "/v1/queues").await;
    assert_eq!(queues["queues"], Value::Array(vec![]), "{queues:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_names_what_is_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = ServerProcess::start(dir.path()).await;
    let (status, body) = call(
        &s,
        reqwest::Method::POST,
        "/v1/projects/demo/regions/mars-north1/queue:hold",
    )
    .await;
    assert_eq!(status, 404, "{body:#}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("mars-north1")),
        "{body:#}"
    );
    let (status, body) = call(
        &s,
        reqwest::Method::GET,
        "/v1/projects/demo/regions/us-central1/queue:pause",
    )
    .await;
    assert!(status == 404 || status == 405, "{status} {body:#}");
    // A queue that is not held resumes to what it is: not held.
    let (status, body) = call(
        &s,
        reqwest::Method::POST,
        "/v1/projects/demo/regions/us-central1/queue:resume",
    )
    .await;
    assert_eq!(
        (status, &body["held"]),
        (200, &Value::Bool(false)),
        "{body:#}"
    );
}
