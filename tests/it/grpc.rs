//! The gRPC front end and HTTP/2, with the clients users have: Google's
//! official Python client (`google-cloud-dataproc`) on its default
//! transport over TLS and in plaintext, curl with its defaults, a
//! browser (headless Chromium) over HTTPS, and raw
//! HTTP/2 frames for what no well-behaved client sends (malformed and
//! oversized messages, unknown methods, bad `grpc-timeout`).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use googleapis_tonic_google_cloud_dataproc_v1::google::cloud::dataproc::v1 as dp;
use googleapis_tonic_google_longrunning::google::longrunning as lro;
use http_body_util::BodyExt;
use hyper::body::Bytes;
use prost::Message;

use crate::support::{TestServer, no_virtual_nodes, sample, self_signed};

/// A submitter of `demo`, a submitter of `other`.
fn principals(c: &mut flexq::config::Config) {
    c.principals = [
        ("alice@example.com", "token-alice", "demo"),
        ("bob@example.com", "token-bob", "other"),
    ]
    .iter()
    .map(|(name, token, project)| flexq::config::PrincipalConfig {
        name: name.to_string(),
        role: serde_json::from_value(serde_json::json!("submitter")).expect("role"),
        projects: vec![project.to_string()],
        node: None,
        token_sha256: flexq::engine::token_hash(token),
    })
    .collect();
}

/// Runs tests/clients/dataproc_grpc.py (every step asserts) and fails
/// with its output unless it passed.
fn python_client(args: &[String], env: &[(&str, &Path)]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/dataproc_grpc.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .expect("python3 (scripts/test installs google-cloud-dataproc)");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("all steps passed"),
        "the official client failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_passes_on_grpc_over_tls() {
    let tls = self_signed();
    // A process of its own: the gRPC counters below are this client's.
    let (cert, key) = (tls.cert.clone(), tls.key.clone());
    let s = TestServer::start_process_with(|c| {
        no_virtual_nodes(c);
        c.server.tls_cert = Some(cert);
        c.server.tls_key = Some(key);
        principals(c);
    })
    .await;
    let endpoint = format!("127.0.0.1:{}", s.addr.port());
    // Only api_endpoint changed; the CA is trusted the way gRPC reads it.
    let args = [
        "--endpoint",
        &endpoint,
        "--token",
        "token-alice",
        "--other-token",
        "token-bob",
    ]
    .map(String::from);
    tokio::task::spawn_blocking(move || {
        python_client(&args, &[("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", &tls.cert)])
    })
    .await
    .expect("client");
    let metrics = s.scrape().await;
    // The script makes one call of each of these (CreateBatch: many).
    for (series, calls) in [
        (
            r#"flexq_grpc_requests_total{code="UNAUTHENTICATED",method="GetBatch"}"#,
            Some(1.0),
        ),
        (
            r#"flexq_grpc_requests_total{code="PERMISSION_DENIED",method="GetBatch"}"#,
            Some(1.0),
        ),
        (
            r#"flexq_grpc_requests_total{code="OK",method="CancelOperation"}"#,
            Some(1.0),
        ),
    ] {
        assert_eq!(sample(&metrics, series), calls, "{series} in\n{metrics}");
    }
    let created = r#"flexq_grpc_requests_total{code="OK",method="CreateBatch"}"#;
    assert!(
        sample(&metrics, created).is_some_and(|n| n >= 5.0),
        "{created} in\n{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_passes_on_plaintext_grpc() {
    let s = TestServer::start().await;
    let endpoint = format!("127.0.0.1:{}", s.addr.port());
    tokio::task::spawn_blocking(move || {
        python_client(&["--endpoint".into(), endpoint, "--plaintext".into()], &[])
    })
    .await
    .expect("client");
}

/// curl over HTTPS with its defaults negotiates HTTP/2 by ALPN; h2c with
/// prior knowledge in plaintext; HTTP/1.1 still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_gets_answers_over_h2_h2c_and_http1() {
    let tls = self_signed();
    let https = TestServer::start_https(&tls, |_| {}).await;
    let plain = TestServer::start().await;
    let batch = crate::support::flex_batch().to_string();
    let curl = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let out = Command::new("curl")
                .args(["-sS", "-w", "\n%{http_version} %{http_code}"])
                .args(&args)
                .output()
                .expect("curl");
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(
                out.status.success(),
                "curl {args:?}: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            );
            text
        })
    };
    let cacert = tls.cert.display().to_string();
    let h2 = format!("https://127.0.0.1:{}", https.addr.port());
    let h2c = format!("http://127.0.0.1:{}", plain.addr.port());
    for (args, want) in [
        (
            vec!["--cacert".into(), cacert.clone(), format!("{h2}/healthz")],
            "2 200",
        ),
        (
            vec![
                "--cacert".into(),
                cacert.clone(),
                "-H".into(),
                "content-type: application/json".into(),
                "-d".into(),
                batch.clone(),
                format!("{h2}/v1/projects/demo/locations/us-central1/batches?batchId=over-h2"),
            ],
            "2 200",
        ),
        (
            vec![
                "--cacert".into(),
                cacert,
                format!("{h2}/v1/projects/demo/locations/us-central1/batches/over-h2"),
            ],
            "2 200",
        ),
        (
            vec!["--http2-prior-knowledge".into(), format!("{h2c}/healthz")],
            "2 200",
        ),
        (
            vec![
                "--http2-prior-knowledge".into(),
                "-H".into(),
                "content-type: application/json".into(),
                "-d".into(),
                batch,
                format!("{h2c}/v1/projects/demo/locations/us-central1/batches?batchId=over-h2c"),
            ],
            "2 200",
        ),
        (
            vec![
                "--http1.1".into(),
                format!("{h2c}/v1/projects/demo/locations/us-central1/batches/over-h2c"),
            ],
            "1.1 200",
        ),
        (vec![format!("{h2c}/v1/runtimes")], "1.1 200"),
    ] {
        let text = curl(args.clone()).await.expect("curl");
        assert!(text.ends_with(want), "curl {args:?} answered {text}");
    }
}

/// A browser over HTTPS: Chromium (headless, Debian's package, which
/// scripts/test installs) negotiates HTTP/2 by ALPN and gets the answer;
/// its network log shows the protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_gets_answers_over_http2() {
    let tls = self_signed();
    let s = TestServer::start_https(&tls, |_| {}).await;
    let profile = tempfile::tempdir().expect("tempdir");
    let netlog = profile.path().join("netlog.json");
    let url = format!(
        "https://127.0.0.1:{}/v1/projects/demo/locations/us-central1/batches",
        s.addr.port()
    );
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        // The test's own CA is not in the browser's store.
        "--ignore-certificate-errors",
    ]
    .map(String::from)
    .into_iter()
    .chain([
        format!(
            "--user-data-dir={}",
            profile.path().join("profile").display()
        ),
        format!("--log-net-log={}", netlog.display()),
        "--dump-dom".into(),
        url,
    ])
    .collect::<Vec<_>>();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("chromium")
            .args(&args)
            .output()
            .expect("chromium (scripts/test installs Debian's package)")
    })
    .await
    .expect("chromium");
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(
        page.contains(r#"{"batches":[]"#),
        "the page: {page}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(&netlog).expect("the network log");
    assert!(
        log.contains(r#""negotiated_protocol":"h2""#),
        "the browser did not speak HTTP/2"
    );
}

/// What a unary gRPC call answered, read off the wire.
#[derive(Debug)]
pub(crate) struct Answer {
    pub code: i32,
    pub message: String,
    pub details: Option<googleapis_tonic_google_rpc::google::rpc::Status>,
    pub body: Bytes,
}

impl Answer {
    /// The response message (after the 5-byte gRPC frame header).
    pub(crate) fn message<M: Message + Default>(&self) -> M {
        assert_eq!(self.code, 0, "{self:?}");
        assert!(self.body.len() >= 5, "{self:?}");
        M::decode(&self.body[5..]).expect("response message")
    }
}

/// The gRPC frame of one message: not compressed, its length, its bytes.
pub(crate) fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend((message.len() as u32).to_be_bytes());
    out.extend(message);
    out
}

/// One unary gRPC call over h2c with exactly `body` as the request
/// stream: answers within 10 s or fails the test (never a hang).
pub(crate) async fn call_raw(
    addr: SocketAddr,
    path: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> Answer {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("h2 handshake");
    tokio::spawn(conn);
    let mut req = hyper::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(http_body_util::Full::new(Bytes::from(body)))
        .expect("request");
    let answer = async {
        let response = send.send_request(req).await.expect("response");
        let (parts, body) = response.into_parts();
        assert_eq!(parts.status, 200, "gRPC answers over HTTP 200: {parts:?}");
        let collected = body.collect().await.expect("body");
        let trailers = collected.trailers().cloned();
        (parts.headers, trailers, collected.to_bytes())
    };
    let (headers, trailers, body) = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("the server answered within 10 s");
    // A trailers-only answer carries its status in the headers; tonic
    // reads it as a client would (grpc-message percent-decoded, the
    // details' base64 undone).
    let status = trailers
        .filter(|t| t.contains_key("grpc-status"))
        .unwrap_or(headers);
    let status = tonic::Status::from_header_map(&status).expect("a grpc-status");
    let details = (!status.details().is_empty()).then(|| {
        googleapis_tonic_google_rpc::google::rpc::Status::decode(status.details())
            .expect("google.rpc.Status")
    });
    Answer {
        code: status.code() as i32,
        message: status.message().to_string(),
        details,
        body,
    }
}

pub(crate) const GET_BATCH: &str = "/google.cloud.dataproc.v1.BatchController/GetBatch";
pub(crate) const CREATE_BATCH: &str = "/google.cloud.dataproc.v1.BatchController/CreateBatch";

pub(crate) const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// A `grpc.health.v1.HealthCheckRequest` for `service`, framed.
fn health_check(service: &str) -> Vec<u8> {
    let mut message = vec![0x0a, service.len() as u8];
    message.extend(service.as_bytes());
    frame(if service.is_empty() { &[] } else { &message })
}

fn get_batch(name: &str) -> Vec<u8> {
    frame(
        &dp::GetBatchRequest {
            name: name.to_string(),
        }
        .encode_to_vec(),
    )
}

#[tokio::test]
async fn malformed_oversized_and_unknown_calls_get_a_status_never_a_crash_or_a_hang() {
    let s = TestServer::start_with(|c| {
        crate::support::no_virtual_nodes(c);
        c.server.max_body_bytes = 64 * 1024;
    })
    .await;
    let name = "projects/demo/locations/us-central1/batches/nope";

    // Not a protobuf message: INVALID_ARGUMENT, naming the message.
    let a = call_raw(s.addr, GET_BATCH, frame(&[0xff, 0xff, 0xff, 0xff]), &[]).await;
    assert_eq!(a.code, 3, "{a:?}");
    assert!(a.message.contains("not a valid GetBatchRequest"), "{a:?}");

    // A frame shorter than it says, then the end of the stream.
    let mut short = frame(&dp::GetBatchRequest { name: name.into() }.encode_to_vec());
    short.truncate(short.len() - 3);
    // tonic answers these three before flexq sees them: INTERNAL, as the
    // gRPC protocol says for a broken frame (docs/api.md says so).
    let a = call_raw(s.addr, GET_BATCH, short, &[]).await;
    assert_eq!((a.code, a.message.contains("EOF")), (13, true), "{a:?}");

    // No message at all.
    let a = call_raw(s.addr, GET_BATCH, vec![], &[]).await;
    assert_eq!((a.code, a.message.contains("Missing")), (13, true), "{a:?}");

    // A compressed flag without an encoding.
    let mut compressed = get_batch(name);
    compressed[0] = 1;
    let a = call_raw(s.addr, GET_BATCH, compressed, &[]).await;
    assert_eq!(
        (a.code, a.message.contains("compressed-flag")),
        (13, true),
        "{a:?}"
    );

    // Above server.max_body_bytes: refused before it is read,
    // RESOURCE_EXHAUSTED as gRPC servers answer it, the limit named.
    let big = dp::CreateBatchRequest {
        parent: "projects/demo/locations/us-central1".into(),
        batch: Some(dp::Batch {
            labels: [("big".to_string(), "x".repeat(100 * 1024))].into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let a = call_raw(s.addr, CREATE_BATCH, frame(&big.encode_to_vec()), &[]).await;
    assert_eq!(a.code, 8, "{a:?}");
    assert!(a.message.contains("65536"), "{a:?}");

    // Unknown methods and services: UNIMPLEMENTED.
    for path in [
        "/google.cloud.dataproc.v1.BatchController/PatchBatch",
        "/google.cloud.dataproc.v1.ClusterController/CreateCluster",
    ] {
        let a = call_raw(s.addr, path, get_batch(name), &[]).await;
        assert_eq!(a.code, 12, "{path}: {a:?}");
    }

    // A grpc-timeout that is not one: INVALID_ARGUMENT naming it.
    let a = call_raw(
        s.addr,
        GET_BATCH,
        get_batch(name),
        &[("grpc-timeout", "soon")],
    )
    .await;
    assert_eq!(a.code, 3, "{a:?}");
    assert!(a.message.contains("grpc-timeout"), "{a:?}");
    let violations = a.details.expect("details").details;
    assert!(
        violations
            .iter()
            .any(|d| d.type_url.ends_with("google.rpc.BadRequest")),
        "{violations:?}"
    );

    // The server is still well: health says SERVING (the server, and the
    // API service while the database answers), a real call works.
    for service in ["", "google.cloud.dataproc.v1.BatchController"] {
        let a = call_raw(s.addr, HEALTH_CHECK, health_check(service), &[]).await;
        assert_eq!(
            a.body.as_ref(),
            &frame(&[0x08, 0x01])[..],
            "{service} SERVING: {a:?}"
        );
    }
    let a = call_raw(s.addr, HEALTH_CHECK, health_check("nope"), &[]).await;
    assert_eq!(a.code, 5, "an unknown service: NOT_FOUND {a:?}");
    let a = call_raw(s.addr, GET_BATCH, get_batch(name), &[]).await;
    assert_eq!(a.code, 5, "{a:?}");
    let info = a.details.expect("details");
    assert_eq!(info.code, 5);
    assert!(
        info.details
            .iter()
            .any(|d| d.type_url.ends_with("google.rpc.ErrorInfo")),
        "{info:?}"
    );
}

/// WaitOperation answers the latest state before the call's deadline; a
/// grpc-timeout shorter than the work is DEADLINE_EXCEEDED or the state
/// at that time, never a call that outlives its deadline.
#[tokio::test]
async fn grpc_timeout_bounds_a_wait() {
    let s = TestServer::start().await;
    let a = call_raw(s.addr, CREATE_BATCH, create_request("waited"), &[]).await;
    let op: lro::Operation = a.message();
    let started = std::time::Instant::now();
    let wait = lro::WaitOperationRequest {
        name: op.name.clone(),
        timeout: Some(prost_types::Duration {
            seconds: 30,
            nanos: 0,
        }),
    };
    let a = call_raw(
        s.addr,
        "/google.longrunning.Operations/WaitOperation",
        frame(&wait.encode_to_vec()),
        &[("grpc-timeout", "1S")],
    )
    .await;
    let took = started.elapsed();
    let waited: lro::Operation = a.message();
    assert_eq!(waited.name, op.name);
    assert!(!waited.done, "a queued batch's operation is not done");
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(3),
        "{took:?}"
    );

    // Cancel wakes a waiter at once.
    crate::support::until_long_polls(&s, "operation", 0).await;
    let addr = s.addr;
    let name = op.name.clone();
    let waiter = tokio::spawn(async move {
        let wait = lro::WaitOperationRequest {
            name,
            timeout: None,
        };
        let started = std::time::Instant::now();
        let a = call_raw(
            addr,
            "/google.longrunning.Operations/WaitOperation",
            frame(&wait.encode_to_vec()),
            &[],
        )
        .await;
        (a.message::<lro::Operation>(), started.elapsed())
    });
    // Waiting (read, not done) before the cancel: what answers it is the
    // wake-up, not its first read.
    crate::support::until_long_polls(&s, "operation", 1).await;
    let cancel = lro::CancelOperationRequest {
        name: op.name.clone(),
    };
    let a = call_raw(
        s.addr,
        "/google.longrunning.Operations/CancelOperation",
        frame(&cancel.encode_to_vec()),
        &[],
    )
    .await;
    assert_eq!(a.code, 0, "{a:?}");
    let (done, took) = waiter.await.expect("waiter");
    assert!(done.done, "{done:?}");
    // Well before its 60 s default wait.
    assert!(took < Duration::from_secs(5), "{took:?}");
    crate::support::until_long_polls(&s, "operation", 0).await;
    match done.result {
        Some(lro::operation::Result::Error(e)) => assert_eq!(e.code, 1, "CANCELLED: {e:?}"),
        other => panic!("a cancelled batch's operation ends in an error: {other:?}"),
    }
}

/// Server reflection (what `grpcurl` uses): the served services are
/// listed, and the descriptor of BatchController can be fetched, so a
/// client without the protos can call it. No token is needed.
#[tokio::test]
async fn reflection_lists_and_describes_the_services() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, ServerReflectionResponse,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let s = TestServer::start_with(|c| {
        crate::support::no_virtual_nodes(c);
        principals(c);
    })
    .await;
    let ask = |request: MessageRequest| {
        frame(
            &ServerReflectionRequest {
                host: String::new(),
                message_request: Some(request),
            }
            .encode_to_vec(),
        )
    };
    let path = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
    let a = call_raw(
        s.addr,
        path,
        ask(MessageRequest::ListServices(String::new())),
        &[],
    )
    .await;
    let answer: ServerReflectionResponse = a.message();
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("not a service list: {answer:?}");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    for want in [
        "google.cloud.dataproc.v1.BatchController",
        "google.longrunning.Operations",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(&want), "{want} not in {names:?}");
    }

    let a = call_raw(
        s.addr,
        path,
        ask(MessageRequest::FileContainingSymbol(
            "google.cloud.dataproc.v1.BatchController".into(),
        )),
        &[],
    )
    .await;
    let answer: ServerReflectionResponse = a.message();
    let Some(MessageResponse::FileDescriptorResponse(files)) = answer.message_response else {
        panic!("no descriptors: {answer:?}");
    };
    let described: Vec<String> = files
        .file_descriptor_proto
        .iter()
        .map(|bytes| {
            prost_types::FileDescriptorProto::decode(bytes.as_slice())
                .expect("a FileDescriptorProto")
                .name
                .unwrap_or_default()
        })
        .collect();
    assert!(
        described
            .iter()
            .any(|n| n == "google/cloud/dataproc/v1/batches.proto"),
        "{described:?}"
    );
}

fn create_request(batch_id: &str) -> Vec<u8> {
    let properties = crate::support::flex_batch()["runtimeConfig"]["properties"]
        .as_object()
        .expect("properties")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().expect("string").to_string()))
        .collect();
    frame(
        &dp::CreateBatchRequest {
            parent: "projects/demo/locations/us-central1".into(),
            batch_id: batch_id.into(),
            batch: Some(dp::Batch {
                batch_config: Some(dp::batch::BatchConfig::PysparkBatch(dp::PySparkBatch {
                    main_python_file_uri: "file:///jobs/etl.py".into(),
                    ..Default::default()
                })),
                runtime_config: Some(dp::RuntimeConfig {
                    version: "3.0".into(),
                    properties,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec(),
    )
}

/// The per-project limits hold over gRPC as over REST: past the rate,
/// RESOURCE_EXHAUSTED naming the limit with a RetryInfo; past the queued
/// batches a project may have, RESOURCE_EXHAUSTED naming that limit.
#[tokio::test]
async fn the_per_project_limits_hold_over_grpc() {
    let s = TestServer::start_with(|c| {
        crate::support::no_virtual_nodes(c);
        c.limits.mutations_per_minute = 3;
    })
    .await;
    for i in 0..3 {
        let a = call_raw(
            s.addr,
            CREATE_BATCH,
            create_request(&format!("ok-{i}")),
            &[],
        )
        .await;
        assert_eq!(a.code, 0, "{a:?}");
    }
    let a = call_raw(s.addr, CREATE_BATCH, create_request("fourth"), &[]).await;
    assert_eq!(a.code, 8, "{a:?}");
    assert!(a.message.contains("mutations_per_minute"), "{a:?}");
    let details = a.details.expect("details");
    let type_urls: Vec<&str> = details
        .details
        .iter()
        .map(|d| d.type_url.as_str())
        .collect();
    assert!(
        type_urls
            .iter()
            .any(|t| t.ends_with("google.rpc.RetryInfo")),
        "{type_urls:?}"
    );
    // Reads have a budget of their own.
    let a = call_raw(
        s.addr,
        GET_BATCH,
        get_batch("projects/demo/locations/us-central1/batches/ok-0"),
        &[],
    )
    .await;
    assert_eq!(a.code, 0, "{a:?}");

    let s = TestServer::start_with(|c| {
        crate::support::no_virtual_nodes(c);
        c.limits.max_pending_per_project = 2;
    })
    .await;
    for i in 0..2 {
        let a = call_raw(
            s.addr,
            CREATE_BATCH,
            create_request(&format!("queued-{i}")),
            &[],
        )
        .await;
        assert_eq!(a.code, 0, "{a:?}");
    }
    let a = call_raw(s.addr, CREATE_BATCH, create_request("queued-2"), &[]).await;
    assert_eq!(a.code, 8, "{a:?}");
    assert!(a.message.contains("max_pending_per_project"), "{a:?}");
}

/// An operation goes with its batch: DeleteOperation is NOT_FOUND for
/// none, else UNIMPLEMENTED saying to delete the batch — a caller's
/// error, so its message is sent.
#[tokio::test]
async fn delete_operation_points_at_the_batch() {
    let s = TestServer::start().await;
    let delete = |name: String| frame(&lro::DeleteOperationRequest { name }.encode_to_vec());
    let path = "/google.longrunning.Operations/DeleteOperation";
    let a = call_raw(
        s.addr,
        path,
        delete("projects/demo/regions/us-central1/operations/nope".into()),
        &[],
    )
    .await;
    assert_eq!(a.code, 5, "{a:?}");
    let op: lro::Operation = call_raw(s.addr, CREATE_BATCH, create_request("kept"), &[])
        .await
        .message();
    let a = call_raw(s.addr, path, delete(op.name.clone()), &[]).await;
    assert_eq!(a.code, 12, "{a:?}");
    assert!(a.message.contains("DeleteBatch"), "{a:?}");
    let reason = a.details.expect("details");
    assert!(
        reason
            .details
            .iter()
            .any(|d| d.type_url.ends_with("google.rpc.ErrorInfo")),
        "{reason:?}"
    );
    // Nothing was deleted.
    let a = call_raw(
        s.addr,
        GET_BATCH,
        get_batch("projects/demo/locations/us-central1/batches/kept"),
        &[],
    )
    .await;
    assert_eq!(a.code, 0, "{a:?}");
}

/// A page of big batches stops early with a next-page token instead of
/// passing the 4 MiB a gRPC client accepts: Google's client lists them all
/// with the largest page size.
#[tokio::test]
async fn big_batches_come_in_pages_a_grpc_client_accepts() {
    let s = TestServer::start().await;
    // ~900 KB of properties each: five are more than 4 MiB.
    let mut body = crate::support::flex_batch();
    for i in 0..55 {
        body["runtimeConfig"]["properties"][format!("spark.flexq.test.padding{i}")] =
            serde_json::json!("x".repeat(16_000));
    }
    for i in 0..5 {
        let (st, b) = s.create(&format!("batchId=big-{i}"), &body).await;
        assert_eq!(st, 200, "{b}");
    }
    let (mut seen, mut token, mut pages) = (0, String::new(), 0);
    loop {
        let request = dp::ListBatchesRequest {
            parent: "projects/demo/locations/us-central1".into(),
            page_size: 1000,
            page_token: token.clone(),
            ..Default::default()
        };
        let a = call_raw(
            s.addr,
            "/google.cloud.dataproc.v1.BatchController/ListBatches",
            frame(&request.encode_to_vec()),
            &[],
        )
        .await;
        assert!(a.body.len() < 4 << 20, "a page of {} bytes", a.body.len());
        let page: dp::ListBatchesResponse = a.message();
        seen += page.batches.len();
        pages += 1;
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen, 5);
    assert!(pages >= 2, "{pages} pages");
}

/// A batch that ran: its agent (driven here through the agent protocol,
/// no Spark) reports it SUCCEEDED; over gRPC its operation is done with
/// the Batch in `response`, and the Batch carries its runtime info and
/// history — the whole REST shape crosses, but for flexq's own fields.
#[tokio::test]
async fn a_batch_that_succeeded_reads_back_over_grpc() {
    use serde_json::json;
    let s = TestServer::start_for_agents(Duration::from_secs(30)).await;
    let node = json!({
        "nodeId": "gpu-host-1", "region": "us-central1", "zone": "us-central1-b", "pool": "l4",
        "gpuAddresses": ["0", "1", "2", "3", "4", "5", "6", "7"],
        "cores": 96, "memoryMb": 393216, "localSsdGb": 3000
    });
    let (st, reg) = s.post_json("/v1/nodes:register", &node).await;
    assert_eq!(st, 200, "{reg}");
    let epoch = reg["epoch"].as_str().expect("epoch").to_string();
    let a = call_raw(s.addr, CREATE_BATCH, create_request("ran-once"), &[]).await;
    let op: lro::Operation = a.message();
    // The first poll answers at once; the allocation may come after it
    // (on PostgreSQL the pass is not part of the create): poll on from the
    // answered version until the assignment arrives.
    let (mut version, mut uuid) = (String::new(), None);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while uuid.is_none() {
        assert!(std::time::Instant::now() < deadline, "no assignment");
        let (_, poll) = s
            .post_json(
                "/v1/nodes/gpu-host-1:poll",
                &json!({"epoch": epoch, "version": version, "waitFor": "5s"}),
            )
            .await;
        version = poll["version"].as_str().unwrap_or_default().to_string();
        uuid = poll["assignments"][0]["uuid"].as_str().map(str::to_string);
    }
    let uuid = uuid.expect("an assignment");
    for event in [
        json!({"event": "MASTER_READY", "masterUrl": "spark://127.0.0.1:7077"}),
        json!({"event": "DRIVER_STARTED", "rapids": "enabled"}),
        json!({"event": "FINISHED", "succeeded": true, "message": "The driver finished successfully (exit status 0).", "exitCode": 0}),
    ] {
        let mut body = event;
        body["epoch"] = json!(epoch);
        body["uuid"] = json!(uuid);
        let (st, answer) = s.post_json("/v1/nodes/gpu-host-1:report", &body).await;
        assert_eq!(st, 200, "{answer}");
    }

    let get = lro::GetOperationRequest {
        name: op.name.clone(),
    };
    let done: lro::Operation = call_raw(
        s.addr,
        "/google.longrunning.Operations/GetOperation",
        frame(&get.encode_to_vec()),
        &[],
    )
    .await
    .message();
    assert!(done.done, "{done:?}");
    let Some(lro::operation::Result::Response(any)) = done.result else {
        panic!("a succeeded batch's operation has the Batch as response: {done:?}");
    };
    assert_eq!(
        any.type_url,
        "type.googleapis.com/google.cloud.dataproc.v1.Batch"
    );
    let batch = dp::Batch::decode(any.value.as_slice()).expect("a Batch");
    assert_eq!(batch.state, dp::batch::State::Succeeded as i32);

    let batch: dp::Batch = call_raw(
        s.addr,
        GET_BATCH,
        get_batch("projects/demo/locations/us-central1/batches/ran-once"),
        &[],
    )
    .await
    .message();
    assert_eq!(batch.state, dp::batch::State::Succeeded as i32);
    let info = batch.runtime_info.expect("runtime info");
    assert!(!info.endpoints.is_empty(), "{info:?}");
    assert!(!info.output_uri.is_empty(), "{info:?}");
    // The usage fields cross too: released, so no current usage.
    let used = info.approximate_usage.expect("approximate usage");
    assert_eq!(used.accelerator_type, "l4");
    assert!(used.milli_accelerator_seconds >= 0, "{used:?}");
    assert!(info.current_usage.is_none(), "{:?}", info.current_usage);
    let states: Vec<i32> = batch.state_history.iter().map(|h| h.state).collect();
    assert!(
        states.contains(&(dp::batch::State::Running as i32)),
        "{states:?}"
    );
    assert!(
        batch.state_message.contains("exit status 0"),
        "{}",
        batch.state_message
    );
}
