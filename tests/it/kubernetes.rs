//! The Kubernetes launcher: real `flexq agent` processes in kubernetes mode
//! against a FAKE Kubernetes API server (these machines have no cluster).
//! The fake keeps applied SparkApplications and lets the test move their
//! status the way the Spark Operator would; the manifests themselves are
//! checked field by field here and against golden files in
//! `src/launch/tests.rs`.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use serde_json::{Value, json};

use crate::support::{AgentNode, TestServer, agent_config, spawn_agent};

const APPS: &str = "/apis/sparkoperator.k8s.io/v1beta2/namespaces/{ns}/sparkapplications/{name}";
const TOKEN: &str = "test-service-account-token";

#[derive(Default)]
struct FakeKube {
    apps: HashMap<String, Value>,
    deleted: Vec<String>,
    content_types: Vec<String>,
}

type Shared = Arc<Mutex<FakeKube>>;

fn authorized(headers: &HeaderMap) -> bool {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {TOKEN}"))
}

fn not_found() -> (StatusCode, axum::Json<Value>) {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({"kind": "Status", "message": "not found", "code": 404})),
    )
}

async fn apply(
    State(k): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, axum::Json<Value>) {
    if !authorized(&headers) {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"message": "Unauthorized"})),
        );
    }
    let mut app: Value = serde_json::from_slice(&body).unwrap_or_default();
    if app["metadata"]["name"] != name.as_str() || app["metadata"]["namespace"] != ns.as_str() {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"message": "name or namespace mismatch"})),
        );
    }
    let mut k = k.lock().expect("lock");
    k.content_types.push(
        headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
    );
    app["status"] = json!({"applicationState": {"state": "SUBMITTED"}});
    k.apps.insert(name, app.clone());
    (StatusCode::OK, axum::Json(app))
}

async fn read(
    State(k): State<Shared>,
    UrlPath((_ns, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> (StatusCode, axum::Json<Value>) {
    if !authorized(&headers) {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"message": "Unauthorized"})),
        );
    }
    match k.lock().expect("lock").apps.get(&name) {
        Some(app) => (StatusCode::OK, axum::Json(app.clone())),
        None => not_found(),
    }
}

async fn delete(
    State(k): State<Shared>,
    UrlPath((_ns, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> (StatusCode, axum::Json<Value>) {
    if !authorized(&headers) {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"message": "Unauthorized"})),
        );
    }
    let mut k = k.lock().expect("lock");
    match k.apps.remove(&name) {
        Some(_) => {
            k.deleted.push(name);
            (
                StatusCode::OK,
                axum::Json(json!({"kind": "Status", "status": "Success"})),
            )
        }
        None => not_found(),
    }
}

async fn fake_kube() -> (String, Shared) {
    let shared: Shared = Arc::default();
    let app = Router::new()
        .route(APPS, get(read).patch(apply).delete(delete))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, shared)
}

struct KubeAgent(Child);

impl Drop for KubeAgent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_agent(s: &TestServer, kube: &str, dir: &Path, node: &str) -> KubeAgent {
    let work = dir.join(node);
    std::fs::create_dir_all(&work).expect("dir");
    let token = work.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token");
    let config = agent_config(
        s,
        &work,
        AgentNode {
            node,
            zone: "us-central1-a",
            pool: "l4",
            cores: 8,
            memory_mb: 65536,
        },
        &format!(
            r#"launcher = "kubernetes"

[kubernetes]
api_server = "{kube}"
token_file = "{token}"
ca_file = "{work}/no-ca.pem"
namespace = "spark-jobs"
image = "registry.example/spark-rapids:3.5.1"
service_account = "spark"
rapids_jar = "/opt/sparkRapidsPlugin/rapids-4-spark.jar"
spark_version = "3.5.1"
status_interval = "100ms"
"#,
            work = work.join("work").display(),
            token = token.display(),
        ),
    );
    KubeAgent(spawn_agent(&config, &work.join("agent.log")))
}

fn batch() -> Value {
    json!({
        "pysparkBatch": {"mainPythonFileUri": "local:///opt/jobs/etl.py"},
        "runtimeConfig": {"version": "3.0", "properties": {
            "spark.dataproc.executor.resource.accelerator.type": "l4",
            "spark.dataproc.executor.compute.tier": "premium",
            "spark.dataproc.executor.disk.tier": "premium",
        }},
    })
}

async fn until(s: &TestServer, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let path = format!("/v1/projects/demo/locations/us-central1/batches/{id}");
    crate::support::until(s, &path, what, done).await
}

async fn applied(k: &Shared, name: &str) -> Value {
    let read = || async { k.lock().expect("lock").apps.get(name).cloned() };
    crate::support::poll(Duration::from_secs(20), read, Option::is_some)
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("{name} was not applied"))
}

/// Creates batch `id`; answers its application's name (from its uuid).
async fn create(s: &TestServer, id: &str) -> String {
    let (st, op) = s.create(&format!("batchId={id}"), &batch()).await;
    assert_eq!(st, 200, "{op:#}");
    format!(
        "flexq-{}",
        op["metadata"]["batchUuid"].as_str().expect("uuid")
    )
}

fn set_state(k: &Shared, name: &str, state: &str, message: &str) {
    let mut k = k.lock().expect("lock");
    let app = k.apps.get_mut(name).expect("app");
    app["status"] = json!({"applicationState": {"state": state, "errorMessage": message}});
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_run_as_spark_applications_pinned_to_their_nodes() {
    let s = TestServer::start_for_agents(Duration::from_secs(15)).await;
    let (kube, k) = fake_kube().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut agents: Vec<(&str, KubeAgent)> = ["node-a", "node-b"]
        .into_iter()
        .map(|n| (n, start_agent(&s, &kube, dir.path(), n)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, nodes) = s.get("/v1/nodes").await;
        if nodes["nodes"].as_array().is_some_and(|n| n.len() == 2) {
            break;
        }
        assert!(Instant::now() < deadline, "agents registered: {nodes:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Applied, pinned to the allocated nodes, then RUNNING and SUCCEEDED as
    // the operator reports.
    let on_k8s = create(&s, "on-k8s").await;
    let app = applied(&k, &on_k8s).await;
    let b = until(&s, "on-k8s", "provisioned", |b| {
        b["flexq"]["nodes"].is_array()
    })
    .await;
    let nodes_of = |role: &str| {
        let mut v: Vec<String> = b["flexq"]["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .filter(|p| p["role"] == role)
            .map(|p| p["node"].as_str().expect("node").to_string())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let pinned = |part: &str| -> Vec<String> {
        serde_json::from_value(
            app["spec"][part]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
                .clone(),
        )
        .expect("affinity values")
    };
    assert_eq!(pinned("driver"), nodes_of("driver"), "{app:#}");
    assert_eq!(pinned("executor"), nodes_of("executor"), "{app:#}");
    assert_eq!(app["spec"]["executor"]["instances"], 2);
    assert_eq!(
        app["spec"]["executor"]["gpu"],
        json!({"name": "nvidia.com/gpu", "quantity": 1})
    );
    assert_eq!(
        app["spec"]["sparkConf"]["spark.plugins"],
        "com.nvidia.spark.SQLPlugin"
    );
    assert_eq!(
        app["spec"]["sparkConf"]["spark.executor.resource.gpu.amount"],
        "1"
    );
    assert_eq!(app["spec"]["image"], "registry.example/spark-rapids:3.5.1");
    assert_eq!(app["metadata"]["labels"]["flexq.io/batch-uuid"], b["uuid"]);
    assert_eq!(app["metadata"]["labels"]["flexq.io/batch-id"], "on-k8s");
    assert_eq!(
        k.lock().expect("lock").content_types,
        ["application/apply-patch+yaml"],
        "server-side apply"
    );
    assert_eq!(
        until(&s, "on-k8s", "pending", |b| b["state"].is_string()).await["state"],
        "PENDING",
        "SUBMITTED is not running yet"
    );
    set_state(&k, &on_k8s, "RUNNING", "");
    let b = until(&s, "on-k8s", "running", |b| b["state"] == "RUNNING").await;
    assert!(
        b["runtimeInfo"]["rapidsAccelerator"]
            .as_str()
            .is_some_and(|r| r.starts_with("enabled")),
        "{b:#}"
    );
    set_state(&k, &on_k8s, "COMPLETED", "");
    until(&s, "on-k8s", "succeeded", |b| b["state"] == "SUCCEEDED").await;

    // Dynamic allocation on, as Dataproc's serverless clients send it: the
    // application starts with the executors allocated and can never ask
    // for one more (Spark would create executor pods itself, up to
    // maxExecutors, with the same affinity and GPU request: on GPUs the
    // ledger counts as free). The operator's own dynamicAllocation
    // stanza, which would override the conf, is not set.
    let mut elastic = batch();
    for (key, value) in [
        ("spark.dynamicAllocation.enabled", "true"),
        ("spark.dynamicAllocation.minExecutors", "2"),
        ("spark.dynamicAllocation.initialExecutors", "2"),
        ("spark.dynamicAllocation.maxExecutors", "1000"),
    ] {
        elastic["runtimeConfig"]["properties"][key] = json!(value);
    }
    let (st, op) = s.create("batchId=k8s-elastic", &elastic).await;
    assert_eq!(st, 200, "{op:#}");
    assert!(
        crate::support::warns(&op, "spark.dynamicAllocation.maxExecutors"),
        "the create warns of the cap: {op:#}"
    );
    let elastic_app = format!(
        "flexq-{}",
        op["metadata"]["batchUuid"].as_str().expect("uuid")
    );
    let app = applied(&k, &elastic_app).await;
    let b = until(&s, "k8s-elastic", "provisioned", |b| {
        b["flexq"]["nodes"].is_array()
    })
    .await;
    let allocated = b["flexq"]["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|p| p["role"] == "executor")
        .count();
    assert_eq!(allocated, 2, "{b:#}");
    assert_eq!(app["spec"]["executor"]["instances"], allocated, "{app:#}");
    let conf = &app["spec"]["sparkConf"];
    let most = |key: &str| -> usize {
        conf[key]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} in {conf:#}"))
    };
    assert_eq!(
        most("spark.dynamicAllocation.maxExecutors"),
        allocated,
        "{conf:#}"
    );
    assert!(most("spark.dynamicAllocation.initialExecutors") <= allocated);
    assert!(most("spark.dynamicAllocation.minExecutors") <= allocated);
    assert!(app["spec"]["dynamicAllocation"].is_null(), "{app:#}");
    set_state(&k, &elastic_app, "COMPLETED", "");
    until(&s, "k8s-elastic", "succeeded", |b| {
        b["state"] == "SUCCEEDED"
    })
    .await;

    // A failed application fails the batch with the operator's message.
    let k8s_fails = create(&s, "k8s-fails").await;
    applied(&k, &k8s_fails).await;
    set_state(
        &k,
        &k8s_fails,
        "FAILED",
        "driver container failed with ExitCode: 1, Reason: OOMKilled",
    );
    let b = until(&s, "k8s-fails", "failed", |b| b["state"] == "FAILED").await;
    assert!(
        b["stateMessage"]
            .as_str()
            .is_some_and(|m| m.contains("OOMKilled")),
        "{b:#}"
    );

    // Cancel deletes the application.
    let k8s_cancel = create(&s, "k8s-cancel").await;
    applied(&k, &k8s_cancel).await;
    set_state(&k, &k8s_cancel, "RUNNING", "");
    let b = until(&s, "k8s-cancel", "running", |b| b["state"] == "RUNNING").await;
    s.cancel(&b).await;
    until(&s, "k8s-cancel", "cancelled", |b| b["state"] == "CANCELLED").await;

    // An agent stopped (SIGTERM) while its batch runs stops the work and
    // fails the batch at once, saying so, rather than leave it to the lease.
    let k8s_agent_stops = create(&s, "k8s-agent-stops").await;
    applied(&k, &k8s_agent_stops).await;
    set_state(&k, &k8s_agent_stops, "RUNNING", "");
    let b = until(&s, "k8s-agent-stops", "running", |b| {
        b["state"] == "RUNNING"
    })
    .await;
    let driver = b["runtimeInfo"]["driverNode"]
        .as_str()
        .expect("driver node")
        .to_string();
    let (_, agent) = agents
        .iter_mut()
        .find(|(n, _)| *n == driver)
        .expect("agent");
    let _ = Command::new("kill")
        .args(["-TERM", &agent.0.id().to_string()])
        .status();
    let status = agent.0.wait().expect("agent exits");
    assert!(status.success(), "{status}");
    let b = until(&s, "k8s-agent-stops", "failed", |b| b["state"] == "FAILED").await;
    assert!(
        b["stateMessage"]
            .as_str()
            .is_some_and(|m| m.contains("was stopped")),
        "{b:#}"
    );
    let k = k.lock().expect("lock");
    assert!(k.deleted.contains(&k8s_cancel), "{:?}", k.deleted);
    assert!(
        k.apps.is_empty(),
        "every ended application deleted: {:?}",
        k.apps.keys()
    );
}
