//! Who may do what: every route × every role × own and other project,
//! against a real server with configured principals. The expectations are
//! written out here, independently of the server's own policy table.

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{TestServer, flex_batch};

/// (name, role, projects, node, token)
type Row = (
    &'static str,
    &'static str,
    &'static [&'static str],
    Option<&'static str>,
    &'static str,
);

const PRINCIPALS: &[Row] = &[
    (
        "alice@example.com",
        "submitter",
        &["demo"],
        None,
        "token-alice",
    ),
    (
        "bob@example.com",
        "submitter",
        &["other"],
        None,
        "token-bob",
    ),
    ("root@example.com", "admin", &[], None, "token-root"),
    ("agent-gpu-1", "agent", &[], Some("gpu-1"), "token-agent"),
];

async fn server() -> TestServer {
    TestServer::start_with(|c| {
        crate::support::no_virtual_nodes(c);
        // The spelling test registers gpu-1 once and then walks every
        // route for minutes on a loaded machine: its lease must outlast
        // the walk (it lapsed once, on PostgreSQL, and the node was gone).
        c.agents.lease_duration = std::time::Duration::from_secs(3600);
        c.principals = PRINCIPALS
            .iter()
            .map(
                |(name, role, projects, node, token)| flexq::config::PrincipalConfig {
                    name: name.to_string(),
                    role: serde_json::from_value(json!(role)).expect("role"),
                    projects: projects.iter().map(|p| p.to_string()).collect(),
                    node: node.map(str::to_string),
                    token_sha256: flexq::engine::token_hash(token),
                },
            )
            .collect();
    })
    .await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Health,
    Catalog,
    ProjectRead,
    ProjectWrite,
    AdminOnly,
    /// Agent endpoint for node gpu-1 or gpu-2.
    Agent(&'static str),
}

/// (method, path with {P} for the project, body, kind)
fn routes() -> Vec<(Method, &'static str, Option<Value>, Kind)> {
    let node = |id: &str| {
        json!({"nodeId": id, "region": "us-central1", "zone": "us-central1-b", "pool": "l4",
               "gpuAddresses": ["0"], "cores": 8, "memoryMb": 1024, "localSsdGb": 375})
    };
    vec![
        (Method::GET, "/healthz", None, Kind::Health),
        (Method::GET, "/readyz", None, Kind::Health),
        (Method::GET, "/v1/runtimes", None, Kind::Catalog),
        (Method::GET, "/v1/regions", None, Kind::Catalog),
        (Method::GET, "/v1/principal", None, Kind::Catalog),
        (Method::GET, "/console/", None, Kind::Health),
        (Method::GET, "/console/app.js", None, Kind::Health),
        (
            Method::GET,
            "/v1/projects/{P}/regions/us-central1/queue/entries",
            None,
            Kind::ProjectRead,
        ),
        (
            Method::GET,
            "/v1/projects/{P}/locations/us-central1/batches",
            None,
            Kind::ProjectRead,
        ),
        (
            Method::POST,
            "/v1/projects/{P}/locations/us-central1/batches",
            Some(flex_batch()),
            Kind::ProjectWrite,
        ),
        (
            Method::GET,
            "/v1/projects/{P}/locations/us-central1/batches/nope",
            None,
            Kind::ProjectRead,
        ),
        (
            Method::GET,
            "/v1/projects/{P}/locations/us-central1/batches/nope/output",
            None,
            Kind::ProjectRead,
        ),
        (
            Method::GET,
            "/v1/projects/{P}/locations/us-central1/batches/nope/gpuUtilization",
            None,
            Kind::ProjectRead,
        ),
        (
            Method::GET,
            "/v1/projects/{P}/locations/us-central1/batches/nope/executors",
            None,
            Kind::ProjectRead,
        ),
        (
            Method::DELETE,
            "/v1/projects/{P}/locations/us-central1/batches/nope",
            None,
            Kind::ProjectWrite,
        ),
        (
            Method::GET,
            "/v1/projects/{P}/locations/us-central1/batches:watch",
            None,
            Kind::ProjectRead,
        ),
        (
            Method::GET,
            "/v1/projects/{P}/regions/us-central1/operations/nope",
            None,
            Kind::ProjectRead,
        ),
        (
            Method::POST,
            "/v1/projects/{P}/regions/us-central1/operations/nope:cancel",
            None,
            Kind::ProjectWrite,
        ),
        (
            Method::GET,
            "/v1/projects/{P}/regions/us-central1/quotas",
            None,
            Kind::ProjectRead,
        ),
        (
            Method::GET,
            "/v1/projects/{P}/regions/us-central1/usage",
            None,
            Kind::ProjectRead,
        ),
        (
            Method::PATCH,
            "/v1/projects/{P}/regions/us-central1/quotas",
            Some(json!({"metric": "NVIDIA_L4_GPUS", "limit": 8})),
            Kind::AdminOnly,
        ),
        (
            Method::GET,
            "/v1/projects/{P}/regions/us-central1/queue",
            None,
            Kind::ProjectRead,
        ),
        (
            Method::POST,
            "/v1/projects/{P}/regions/us-central1/queue:hold",
            None,
            Kind::AdminOnly,
        ),
        (
            Method::POST,
            "/v1/projects/{P}/regions/us-central1/queue:resume",
            None,
            Kind::AdminOnly,
        ),
        (Method::GET, "/v1/queues", None, Kind::AdminOnly),
        (Method::POST, "/v1/config:reload", None, Kind::AdminOnly),
        (
            Method::POST,
            "/v1/nodes/virtual%2Fus-central1-a%2Fl4%2F0:cordon",
            None,
            Kind::AdminOnly,
        ),
        (
            Method::POST,
            "/v1/nodes/virtual%2Fus-central1-a%2Fl4%2F0:uncordon",
            None,
            Kind::AdminOnly,
        ),
        (Method::GET, "/v1/nodes", None, Kind::AdminOnly),
        // An agent's own node: its capacity is still the admins'.
        (
            Method::POST,
            "/v1/nodes/gpu-1:cordon",
            None,
            Kind::AdminOnly,
        ),
        (Method::POST, "/v1/nodes/gpu-1:drain", None, Kind::AdminOnly),
        (
            Method::POST,
            "/v1/nodes/gpu-1:uncordon",
            None,
            Kind::AdminOnly,
        ),
        (
            Method::POST,
            "/v1/nodes:register",
            Some(node("gpu-1")),
            Kind::Agent("gpu-1"),
        ),
        (
            Method::POST,
            "/v1/nodes:register",
            Some(node("gpu-2")),
            Kind::Agent("gpu-2"),
        ),
        (
            Method::POST,
            "/v1/nodes/gpu-1:heartbeat",
            Some(json!({"epoch": "1"})),
            Kind::Agent("gpu-1"),
        ),
        (
            Method::POST,
            "/v1/nodes/gpu-2:poll",
            Some(json!({"epoch": "1", "waitFor": "0s"})),
            Kind::Agent("gpu-2"),
        ),
        (
            Method::POST,
            "/v1/nodes/gpu-2:report",
            Some(json!({"epoch": "1", "uuid": "u", "event": "PART_FAILED", "message": "m"})),
            Kind::Agent("gpu-2"),
        ),
    ]
}

/// What the caller should get: true = allowed (any answer but 401/403).
fn allowed(kind: Kind, principal: &str, project: &str) -> bool {
    let p = PRINCIPALS
        .iter()
        .find(|p| p.0 == principal)
        .expect("principal");
    match (kind, p.1) {
        (Kind::Health | Kind::Catalog, _) => true,
        (Kind::Agent(node), "agent") => p.3 == Some(node),
        (Kind::Agent(_), _) => false,
        (_, "agent") => false,
        (_, "admin") => true,
        (Kind::AdminOnly, _) => false,
        (Kind::ProjectRead | Kind::ProjectWrite, _) => p.2.contains(&project),
    }
}

async fn call(
    s: &TestServer,
    method: &Method,
    path: &str,
    body: &Option<Value>,
    token: Option<&str>,
) -> (u16, Value) {
    let mut req = s.http.request(method.clone(), s.url(path));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(b);
    }
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    // The event stream (batches:watch) does not end: its status is the
    // answer, its body is not read.
    let stream = r
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if stream {
        return (status, Value::Null);
    }
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Whether `path` is an instance of the route `template`
/// (`/v1/nodes/{node}`): segment by segment, a `{name}` stands for any
/// one segment, anything else for itself.
fn instance_of(path: &str, template: &str) -> bool {
    let (path, template): (Vec<&str>, Vec<&str>) =
        (path.split('/').collect(), template.split('/').collect());
    path.len() == template.len()
        && path
            .iter()
            .zip(&template)
            .all(|(p, t)| (t.starts_with('{') && t.ends_with('}') && !p.is_empty()) || p == t)
}

/// The matrix above is written by hand, so a new route could be served
/// without a row: every operation of the served document has one (its
/// method, a path of its template), and the matrix's expectations stay
/// its own.
#[tokio::test]
async fn the_matrix_has_every_route_of_the_document() {
    let s = server().await;
    let (st, doc) = call(&s, &Method::GET, "/openapi.json", &None, None).await;
    assert_eq!(st, 200, "{doc}");
    let rows = routes();
    let mut missing = Vec::new();
    let mut operations = 0;
    for (template, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("a path item").keys() {
            operations += 1;
            let method: Method = method.to_uppercase().parse().expect("a method");
            let covered = rows.iter().any(|(m, path, _, _)| {
                *m == method && instance_of(&path.replace("{P}", "demo"), template)
            });
            if !covered {
                missing.push(format!("{method} {template}"));
            }
        }
    }
    assert!(operations > 20, "{operations}");
    assert!(
        missing.is_empty(),
        "routes of the document without a row in the authorization matrix: {missing:?}"
    );
}

#[tokio::test]
async fn every_route_every_role_own_and_other_project() {
    let s = server().await;
    let mut failures = Vec::new();
    let mut checked = 0;
    for (method, template, body, kind) in routes() {
        // "-": every project's, which only admins may read.
        for project in ["demo", "other", "-"] {
            let path = template.replace("{P}", project);
            if project != "demo" && !template.contains("{P}") {
                continue;
            }
            // No token, and a wrong one.
            for token in [None, Some("not-a-token")] {
                let (st, b) = call(&s, &method, &path, &body, token).await;
                let want = if kind == Kind::Health {
                    st != 401
                } else {
                    st == 401 && b["error"]["status"] == "UNAUTHENTICATED"
                };
                checked += 1;
                if !want {
                    failures.push(format!("{method} {path} token={token:?}: {st} {b}"));
                }
            }
            for (name, _, _, _, token) in PRINCIPALS {
                let (st, b) = call(&s, &method, &path, &body, Some(token)).await;
                let expect = allowed(kind, name, project);
                let ok = if expect {
                    st != 401 && st != 403 && st < 500
                } else {
                    st == 403 && b["error"]["status"] == "PERMISSION_DENIED"
                };
                checked += 1;
                if !ok {
                    failures.push(format!(
                        "{method} {path} as {name}: {st} (expected {}) {b}",
                        if expect { "allowed" } else { "403" }
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 150, "{checked}");
}

/// The ways one path can be spelt that a check reading the raw text would
/// take for another: each letter after the version percent-encoded in
/// turn (`:uncordo%6E`), a doubled slash, a trailing slash, mixed case.
fn spellings(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let start = "/v1/".len().min(path.len());
    for (i, c) in path.char_indices().skip(start) {
        if c.is_ascii_alphanumeric() {
            out.push(format!("{}%{:02X}{}", &path[..i], c as u32, &path[i + 1..]));
            // Lower-case hex digits too: both decode.
            out.push(format!("{}%{:02x}{}", &path[..i], c as u32, &path[i + 1..]));
        }
    }
    for (i, _) in path.match_indices('/') {
        out.push(format!("{}/{}", &path[..i], &path[i..]));
    }
    out.push(format!("{path}/"));
    out.push(path.to_uppercase());
    if let Some((head, method)) = path.rsplit_once(':') {
        let mut m = method.chars();
        if let Some(first) = m.next() {
            out.push(format!(
                "{head}:{}{}",
                first.to_ascii_uppercase(),
                m.as_str()
            ));
        }
    }
    out.push(path.replace(':', "%3A"));
    out.sort();
    out.dedup();
    out.retain(|p| p != path);
    out
}

/// Issue 23's bypass and its kin: every route, spelt every way of
/// [`spellings`], for each caller. A spelling may be refused (401, 403)
/// or be no route (404) or bad (400), and where the route's own spelling
/// is allowed it may also be served; it is never served where the route's
/// own spelling is refused, and never a server error.
#[tokio::test]
async fn no_spelling_of_a_route_gets_past_its_check() {
    let s = server().await;
    // gpu-1 registered, so that a cordon, drain or uncordon its agent got
    // past the check would answer 200 (not 404) and change it.
    let register = routes()
        .into_iter()
        .find(|r| r.3 == Kind::Agent("gpu-1") && r.1 == "/v1/nodes:register")
        .expect("the register row");
    let (st, b) = call(
        &s,
        &register.0,
        register.1,
        &register.2,
        Some("token-agent"),
    )
    .await;
    assert_eq!(st, 200, "{b}");
    let mut failures = Vec::new();
    let mut checked = 0;
    for (method, template, body, kind) in routes() {
        for project in ["demo", "other"] {
            if project != "demo" && !template.contains("{P}") {
                continue;
            }
            let canonical = template.replace("{P}", project);
            for path in spellings(&canonical) {
                for (name, _, _, _, token) in PRINCIPALS {
                    // Admins may do everything: nothing to get past.
                    if *name == "root@example.com" {
                        continue;
                    }
                    let (st, b) = call(&s, &method, &path, &body, Some(token)).await;
                    checked += 1;
                    let refused = matches!(st, 400 | 401 | 403 | 404 | 405);
                    let ok = if allowed(kind, name, project) {
                        st < 500
                    } else {
                        refused
                    };
                    if !ok {
                        failures.push(format!(
                            "{method} {path} as {name}: {st} (its route {canonical} is {}) {b}",
                            if allowed(kind, name, project) {
                                "allowed"
                            } else {
                                "refused"
                            }
                        ));
                    }
                }
            }
        }
    }
    // The node is as it was: no spelling cordoned or drained it.
    let (st, nodes) = call(&s, &Method::GET, "/v1/nodes", &None, Some("token-root")).await;
    assert_eq!(st, 200, "{nodes}");
    let gpu1 = nodes["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["id"] == "gpu-1")
        .cloned()
        .expect("gpu-1 is registered");
    if gpu1["state"] != "SCHEDULABLE" {
        failures.push(format!("gpu-1 was changed: {gpu1}"));
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 2000, "{checked}");
}

/// The gRPC rows of the matrix: every RPC of BatchController and
/// Operations, for project `{P}`, with what it needs.
fn rpcs(project: &str) -> Vec<(String, Vec<u8>, Kind)> {
    use googleapis_tonic_google_cloud_dataproc_v1::google::cloud::dataproc::v1 as dp;
    use googleapis_tonic_google_longrunning::google::longrunning as lro;
    use prost::Message;
    let parent = format!("projects/{project}/locations/us-central1");
    let batch = format!("{parent}/batches/nope");
    let op = format!("projects/{project}/regions/us-central1/operations/nope");
    let dataproc = "/google.cloud.dataproc.v1.BatchController";
    let lro = "/google.longrunning.Operations";
    let rows: Vec<(&'static str, Vec<u8>, Kind)> = vec![
        (
            "CreateBatch",
            dp::CreateBatchRequest {
                parent: parent.clone(),
                ..Default::default()
            }
            .encode_to_vec(),
            Kind::ProjectWrite,
        ),
        (
            "GetBatch",
            dp::GetBatchRequest {
                name: batch.clone(),
            }
            .encode_to_vec(),
            Kind::ProjectRead,
        ),
        (
            "ListBatches",
            dp::ListBatchesRequest {
                parent,
                ..Default::default()
            }
            .encode_to_vec(),
            Kind::ProjectRead,
        ),
        (
            "DeleteBatch",
            dp::DeleteBatchRequest { name: batch }.encode_to_vec(),
            Kind::ProjectWrite,
        ),
        (
            "GetOperation",
            lro::GetOperationRequest { name: op.clone() }.encode_to_vec(),
            Kind::ProjectRead,
        ),
        (
            "ListOperations",
            lro::ListOperationsRequest {
                name: format!("projects/{project}/regions/us-central1/operations"),
                ..Default::default()
            }
            .encode_to_vec(),
            Kind::ProjectRead,
        ),
        (
            "CancelOperation",
            lro::CancelOperationRequest { name: op.clone() }.encode_to_vec(),
            Kind::ProjectWrite,
        ),
        (
            "DeleteOperation",
            lro::DeleteOperationRequest { name: op.clone() }.encode_to_vec(),
            Kind::ProjectWrite,
        ),
        (
            "WaitOperation",
            lro::WaitOperationRequest {
                name: op,
                timeout: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 0,
                }),
            }
            .encode_to_vec(),
            Kind::ProjectRead,
        ),
    ];
    rows.into_iter()
        .map(|(method, body, kind)| {
            let service = if method.ends_with("Batch") || method == "ListBatches" {
                dataproc
            } else {
                lro
            };
            (
                format!("{service}/{method}"),
                crate::grpc::frame(&body),
                kind,
            )
        })
        .collect()
}

/// What an allowed call answers: it reached its use case, which finds no
/// batch or operation `nope`, refuses a create without a batch, or lists.
fn answer_when_allowed(path: &str) -> i32 {
    match path.rsplit('/').next() {
        Some("CreateBatch") => 3,
        Some("ListBatches" | "ListOperations") => 0,
        _ => 5,
    }
}

#[tokio::test]
async fn every_rpc_every_role_own_and_other_project() {
    let s = server().await;
    let mut failures = Vec::new();
    let mut checked = 0;
    for project in ["demo", "other"] {
        for (path, body, kind) in rpcs(project) {
            for token in [None, Some("not-a-token")] {
                let header = token.map(|t| format!("Bearer {t}"));
                let headers: Vec<(&str, &str)> = header
                    .iter()
                    .map(|h| ("authorization", h.as_str()))
                    .collect();
                let a = crate::grpc::call_raw(s.addr, &path, body.clone(), &headers).await;
                checked += 1;
                if a.code != 16 {
                    failures.push(format!("{path} {project} token={token:?}: {a:?}"));
                }
            }
            for (name, _, _, _, token) in PRINCIPALS {
                let header = format!("Bearer {token}");
                let a = crate::grpc::call_raw(
                    s.addr,
                    &path,
                    body.clone(),
                    &[("authorization", &header)],
                )
                .await;
                let expect = allowed(kind, name, project);
                let ok = if expect {
                    a.code == answer_when_allowed(&path)
                } else {
                    a.code == 7
                };
                checked += 1;
                if !ok {
                    failures.push(format!(
                        "{path} {project} as {name}: {} {} (expected {})",
                        a.code,
                        a.message,
                        if expect {
                            "allowed"
                        } else {
                            "PERMISSION_DENIED"
                        }
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(checked, 2 * 9 * (2 + PRINCIPALS.len()));
}

/// gRPC decides from the method the router matched and the names in the
/// message, never from the path's text: any other spelling of a method's
/// path is no method (UNIMPLEMENTED) even for an admin, and a name whose
/// project is percent-encoded names that literal project, which nobody
/// but an admin may touch.
#[tokio::test]
async fn no_spelling_of_an_rpc_gets_past_its_check() {
    let s = server().await;
    let mut failures = Vec::new();
    let mut checked = 0;
    for (path, body, _) in rpcs("demo") {
        for spelt in spellings(&path) {
            let a = crate::grpc::call_raw(
                s.addr,
                &spelt,
                body.clone(),
                &[("authorization", "Bearer token-root")],
            )
            .await;
            checked += 1;
            if a.code != 12 {
                failures.push(format!("{spelt}: {a:?} (expected UNIMPLEMENTED)"));
            }
        }
    }
    // `%64emo` is not `demo` in a message: alice (demo) may not use it.
    for (path, body, _) in rpcs("%64emo") {
        let a = crate::grpc::call_raw(
            s.addr,
            &path,
            body,
            &[("authorization", "Bearer token-alice")],
        )
        .await;
        checked += 1;
        if a.code != 7 && a.code != 3 {
            failures.push(format!("{path} as alice with project %64emo: {a:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 500, "{checked}");
}

#[tokio::test]
async fn creator_is_the_principal_and_lists_never_leak() {
    let s = server().await;
    let (st, op) = call(
        &s,
        &Method::POST,
        "/v1/projects/demo/locations/us-central1/batches?batchId=alices",
        &Some(flex_batch()),
        Some("token-alice"),
    )
    .await;
    assert_eq!(st, 200, "{op}");
    let (_, b) = call(
        &s,
        &Method::GET,
        "/v1/projects/demo/locations/us-central1/batches/alices",
        &None,
        Some("token-root"),
    )
    .await;
    assert_eq!(b["creator"], "alice@example.com");
    let (st, list) = call(
        &s,
        &Method::GET,
        "/v1/projects/demo/locations/us-central1/batches",
        &None,
        Some("token-bob"),
    )
    .await;
    assert_eq!(st, 403, "{list}");
    assert!(!list.to_string().contains("alices"), "{list}");
    let (_, own) = call(
        &s,
        &Method::GET,
        "/v1/projects/other/locations/us-central1/batches",
        &None,
        Some("token-bob"),
    )
    .await;
    assert_eq!(
        own["batches"],
        json!([]),
        "bob sees only his project: {own}"
    );
    // Errors never echo a token.
    let (_, e) = call(
        &s,
        &Method::GET,
        "/v1/runtimes",
        &None,
        Some("secret-looking-token"),
    )
    .await;
    assert!(!e.to_string().contains("secret-looking-token"), "{e}");
}

/// The per-project limits: rate per project and region, queued batches per
/// project; each refusal names its limit.
#[tokio::test]
async fn per_project_limits_are_enforced_and_named() {
    let s = TestServer::start_with(|c| {
        crate::support::no_virtual_nodes(c);
        c.limits.mutations_per_minute = 5;
        c.limits.reads_per_minute = 8;
        c.limits.max_pending_per_project = 1_000;
    })
    .await;
    for i in 0..5 {
        let (st, b) = s.create(&format!("batchId=ok-{i}"), &flex_batch()).await;
        assert_eq!(st, 200, "{b}");
    }
    let r = s
        .http
        .post(format!("{}?batchId=sixth", s.batches()))
        .json(&flex_batch())
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), 429);
    let retry: u64 = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=60).contains(&retry), "{retry}");
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("limits.mutations_per_minute") && message.contains("demo"),
        "{message}"
    );
    // Nothing was stored for the refused call; reads have their own budget
    // and other projects theirs.
    let (st, got) = s
        .get("/v1/projects/demo/locations/us-central1/batches/sixth")
        .await;
    assert_eq!(st, 404, "{got}");
    let (st, body) = call(
        &s,
        &Method::POST,
        "/v1/projects/other/locations/us-central1/batches?batchId=other-1",
        &Some(flex_batch()),
        None,
    )
    .await;
    assert_eq!(
        st, 200,
        "another project is not limited by demo's calls: {body}"
    );
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(
            s.get("/v1/projects/demo/locations/us-central1/batches")
                .await
                .0,
        );
    }
    // One read (the 404 above) was already counted.
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        7,
        "{statuses:?}"
    );
    assert_eq!(statuses.last(), Some(&429));

    // Queued batches per project.
    let s = TestServer::start_with(|c| {
        crate::support::no_virtual_nodes(c);
        c.limits.max_pending_per_project = 3;
    })
    .await;
    for i in 0..3 {
        assert_eq!(
            s.create(&format!("batchId=queued-{i}"), &flex_batch())
                .await
                .0,
            200
        );
    }
    // On PostgreSQL the scheduler queues a create when it hears of it on
    // the change stream (the count is the scheduler's view): wait until it
    // has all three.
    crate::support::until(
        &s,
        "/v1/projects/demo/locations/us-central1/batches/queued-2",
        "queued in the scheduler",
        |b| b["flexq"]["queuePosition"].is_number(),
    )
    .await;
    let (st, body) = s.create("batchId=queued-3", &flex_batch()).await;
    assert_eq!(st, 429, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("limits.max_pending_per_project")),
        "{body}"
    );
    // Cancelling one makes room.
    let (_, b) = s
        .get("/v1/projects/demo/locations/us-central1/batches/queued-0")
        .await;
    s.cancel(&b).await;
    assert_eq!(s.create("batchId=queued-3", &flex_batch()).await.0, 200);
}
