//! What a connection may hold of the server, tried with raw sockets: a
//! request head that never ends, a silent connection, an idle kept-alive
//! one (HTTP/1.1 and HTTP/2), an HTTP/2 preface and nothing more, a gRPC
//! message that never ends; connections over `server.max_connections`;
//! a flood of the API port that the probes on the metrics listener never
//! see; and a server under a low descriptor limit, flooded with idle
//! connections, that still answers its health checks and `/metrics`.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::grpc::{GET_BATCH, HEALTH_CHECK, call_raw, frame};
use crate::metrics::value;
use crate::support::{ServerProcess, TestServer, no_virtual_nodes};

/// How long a test waits for the server to close a connection before
/// calling it open: well above every timeout the tests set.
const PATIENCE: Duration = Duration::from_secs(5);

/// A server whose header and idle timeouts are `header` and `idle`.
async fn server(header: Duration, idle: Duration) -> TestServer {
    TestServer::start_with(move |c| {
        no_virtual_nodes(c);
        c.server.header_read_timeout = header;
        c.server.idle_timeout = idle;
    })
    .await
}

/// Reads until the server closes the connection (end of stream or reset);
/// the time that took, or `None` when it is still open after `within`.
async fn closed_within(
    conn: &mut (impl tokio::io::AsyncRead + Unpin),
    within: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    let closing = async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, closing)
        .await
        .ok()
        .map(|()| started.elapsed())
}

/// One HTTP/1.1 request on a kept-alive connection; its status and body.
async fn request(conn: &mut TcpStream, path: &str) -> (u16, Vec<u8>) {
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = conn.read(&mut buf).await.expect("read");
        assert!(
            n > 0,
            "closed mid-response: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend(&buf[..n]);
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("a content-length");
        if got.len() >= end + 4 + length {
            let status = head[9..12].parse().expect("status");
            return (status, got[end + 4..end + 4 + length].to_vec());
        }
    }
}

/// One request on a connection of its own (`Connection: close`): the
/// whole answer as text, or `None` when the server closed it unanswered.
async fn one_shot(addr: std::net::SocketAddr, path: &str) -> Option<String> {
    let mut conn = TcpStream::connect(addr).await.ok()?;
    conn.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, conn.read_to_end(&mut answer))
        .await
        .ok()?
        .ok()?;
    (!answer.is_empty()).then(|| String::from_utf8_lossy(&answer).into_owned())
}

/// Writes `head` a byte every 100 ms, as a slowloris does, until the
/// server closes the connection; how long it stayed open.
async fn slowloris(conn: TcpStream, head: &'static [u8]) -> Option<Duration> {
    let (mut read, mut write) = conn.into_split();
    let trickle = tokio::spawn(async move {
        for b in head.iter().cycle() {
            if write.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let closed = closed_within(&mut read, PATIENCE).await;
    trickle.abort();
    closed
}

const HEAD: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_sent_a_byte_at_a_time_is_closed_within_the_header_timeout() {
    // The idle timeout is far off: only the head's timer can close these.
    let s = server(Duration::from_millis(600), Duration::from_secs(60)).await;

    // On a new connection.
    let conn = TcpStream::connect(s.addr).await.expect("connect");
    let open = slowloris(conn, HEAD).await.expect("closed");
    assert!(open >= Duration::from_millis(500), "closed after {open:?}");
    assert!(open < Duration::from_secs(2), "closed after {open:?}");

    // On a connection kept alive after a request: the head of the next one.
    let mut conn = TcpStream::connect(s.addr).await.expect("connect");
    let (status, _) = request(&mut conn, "/healthz").await;
    assert_eq!(status, 200);
    let open = slowloris(conn, HEAD)
        .await
        .expect("the next head's slowloris is closed too");
    assert!(open >= Duration::from_millis(500), "closed after {open:?}");
    assert!(open < Duration::from_secs(2), "closed after {open:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_within_the_header_timeout() {
    let s = server(Duration::from_millis(600), Duration::from_secs(60)).await;
    let mut conn = TcpStream::connect(s.addr).await.expect("connect");
    let open = closed_within(&mut conn, PATIENCE)
        .await
        .expect("a silent connection is closed");
    assert!(open >= Duration::from_millis(500), "closed after {open:?}");
    assert!(open < Duration::from_secs(2), "closed after {open:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() {
    // The head's timer is far off: only the idle timeout can close it.
    let s = server(Duration::from_secs(60), Duration::from_millis(600)).await;
    let mut conn = TcpStream::connect(s.addr).await.expect("connect");
    for _ in 0..3 {
        // Requests closer together than the idle timeout keep it open.
        let (status, _) = request(&mut conn, "/healthz").await;
        assert_eq!(status, 200);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let open = closed_within(&mut conn, PATIENCE)
        .await
        .expect("an idle connection is closed");
    assert!(open >= Duration::from_millis(200), "closed after {open:?}");
    assert!(open < Duration::from_secs(2), "closed after {open:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_is_closed_after_its_preface_alone_or_when_idle() {
    let s = server(Duration::from_millis(600), Duration::from_millis(600)).await;

    // The client's preface and nothing more: not even its SETTINGS.
    let mut conn = TcpStream::connect(s.addr).await.expect("connect");
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("preface");
    let open = closed_within(&mut conn, PATIENCE)
        .await
        .expect("a preface alone is closed");
    assert!(open < Duration::from_secs(2), "closed after {open:?}");

    // A request, then nothing: HTTP/2 has no timer of its own for that.
    let tcp = TcpStream::connect(s.addr).await.expect("connect");
    let (mut send, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("h2 handshake");
    let connection = tokio::spawn(connection);
    let response = send
        .send_request(
            hyper::Request::get(format!("http://{}/healthz", s.addr))
                .body(http_body_util::Empty::<Bytes>::new())
                .expect("request"),
        )
        .await
        .expect("response");
    assert_eq!(response.status(), 200);
    let started = Instant::now();
    let _ = tokio::time::timeout(PATIENCE, connection)
        .await
        .expect("an idle HTTP/2 connection is closed")
        .expect("connection task");
    assert!(started.elapsed() >= Duration::from_millis(500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_whose_message_never_finishes_is_deadline_exceeded() {
    let s = TestServer::start_with(|c| {
        no_virtual_nodes(c);
        c.server.grpc_message_timeout = Duration::from_millis(500);
    })
    .await;
    // A call whose message comes whole is served as ever.
    let answer = call_raw(s.addr, HEALTH_CHECK, frame(&[]), &[]).await;
    assert_eq!(answer.code, 0, "{}", answer.message);

    // Its prefix promises 100 bytes; 10 come, then nothing, the stream
    // left open.
    let tcp = TcpStream::connect(s.addr).await.expect("connect");
    let (mut send, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("h2 handshake");
    tokio::spawn(connection);
    let mut partial = vec![0u8, 0, 0, 0, 100];
    partial.extend([0x0a; 5]);
    let body = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(Frame::data(
        Bytes::from(partial),
    ))])
    .chain(futures_util::stream::pending());
    let request = hyper::Request::post(format!("http://{}{GET_BATCH}", s.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(StreamBody::new(body))
        .expect("request");
    let started = Instant::now();
    let response = tokio::time::timeout(PATIENCE, send.send_request(request))
        .await
        .expect("answered, not held")
        .expect("response");
    let (parts, body) = response.into_parts();
    let trailers = tokio::time::timeout(PATIENCE, body.collect())
        .await
        .expect("the answer ends")
        .map(|b| b.trailers().cloned())
        .ok()
        .flatten();
    let status = trailers
        .filter(|t| t.contains_key("grpc-status"))
        .unwrap_or(parts.headers);
    let status = tonic::Status::from_header_map(&status).expect("a grpc-status");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("server.grpc_message_timeout"),
        "{status:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_cap_health_checks_answer_and_the_rest_is_refused() {
    let s = TestServer::start_with(|c| {
        no_virtual_nodes(c);
        c.server.max_connections = 2;
        c.server.header_read_timeout = Duration::from_secs(60);
        c.server.idle_timeout = Duration::from_secs(60);
    })
    .await;
    let refused = |text: &str| {
        value(
            text,
            "flexq_connections_refused_total",
            &[("listener", "api"), ("reason", "overflow")],
        )
        .unwrap_or(0.0)
    };
    let before = refused(&s.scrape().await);
    // Two connections served, kept alive: the cap.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut conn = TcpStream::connect(s.addr).await.expect("connect");
        assert_eq!(request(&mut conn, "/v1/regions").await.0, 200);
        held.push(conn);
    }

    for path in ["/healthz", "/readyz"] {
        let answer = one_shot(s.addr, path).await.expect("answered");
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
    }
    let answer = one_shot(s.addr, "/v1/regions").await.expect("answered");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_lowercase().contains("\r\nretry-after: 1\r\n"),
        "{answer}"
    );
    let body: Value =
        serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap_or_default()).expect("json");
    crate::support::assert_status(503, &body, 503, "UNAVAILABLE");
    let info = body["error"]["details"]
        .as_array()
        .and_then(|d| d.iter().find(|x| x["reason"].is_string()))
        .cloned()
        .unwrap_or_default();
    assert_eq!(info["reason"], "TOO_MANY_CONNECTIONS", "{body:#}");
    // gRPC hears UNAVAILABLE.
    let answer = call_raw(s.addr, HEALTH_CHECK, frame(&[]), &[]).await;
    assert_eq!(
        answer.code,
        tonic::Code::Unavailable as i32,
        "{}",
        answer.message
    );
    let reason = answer
        .details
        .as_ref()
        .and_then(|d| {
            d.details
                .iter()
                .find(|any| any.type_url.ends_with("google.rpc.ErrorInfo"))
        })
        .map(|any| {
            <googleapis_tonic_google_rpc::google::rpc::ErrorInfo as prost::Message>::decode(
                any.value.as_slice(),
            )
            .expect("ErrorInfo")
            .reason
        });
    assert_eq!(reason.as_deref(), Some("TOO_MANY_CONNECTIONS"));
    // Only the over-cap servers of this test move it.
    assert_eq!(refused(&s.scrape().await) - before, 4.0);

    // A place freed is served again.
    drop(held.pop());
    let deadline = Instant::now() + PATIENCE;
    loop {
        let answer = one_shot(s.addr, "/v1/regions").await.unwrap_or_default();
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "never served again: {answer}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A flood of the API port past its cap and past the overflow's places
/// (slow heads, each holding a place as long as it may, opened without
/// end) closes probes there unanswered; the probes on the metrics
/// listener, where deploy/kubernetes/flexq.yaml points them, answer every
/// time within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_the_api_port_leaves_the_probes_on_the_metrics_listener_answering() {
    let s = TestServer::start_with(|c| {
        no_virtual_nodes(c);
        c.server.max_connections = 4;
        c.server.header_read_timeout = Duration::from_secs(60);
        c.server.idle_timeout = Duration::from_secs(60);
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut conn = TcpStream::connect(s.addr).await.expect("connect");
        assert_eq!(request(&mut conn, "/v1/regions").await.0, 200);
        held.push(conn);
    }
    let addr = s.addr;
    let flood = tokio::spawn(async move {
        loop {
            for _ in 0..32 {
                if let Ok(conn) = TcpStream::connect(addr).await {
                    tokio::spawn(slowloris(conn, HEAD));
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let probe = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let (mut api_missed, mut metrics_missed) = (0, Vec::new());
    for round in 0..20 {
        let api = probe.get(format!("http://{}/healthz", s.addr)).send().await;
        if !api.is_ok_and(|r| r.status() == 200) {
            api_missed += 1;
        }
        for path in ["/healthz", "/readyz"] {
            let started = Instant::now();
            let answer = probe
                .get(format!("http://{}{path}", s.metrics_addr))
                .send()
                .await;
            if !answer.as_ref().is_ok_and(|r| r.status() == 200) {
                metrics_missed.push(format!(
                    "round {round} {path} after {:?}: {answer:?}",
                    started.elapsed()
                ));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    flood.abort();
    drop(held);
    // The flood is real: the API port's own probe went unanswered.
    assert!(
        api_missed > 0,
        "every probe on the flooded API port was answered: no flood"
    );
    assert!(
        metrics_missed.is_empty(),
        "probes on the metrics listener missed ({api_missed} of 20 missed on the API port): {metrics_missed:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_low_descriptor_limit_a_flood_of_idle_connections_leaves_health_and_metrics_answering()
 {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("flexq.toml");
    // Idle connections are kept a minute: only the cap can bound them.
    std::fs::write(
        &config,
        "[server]\nheader_read_timeout = \"60s\"\nidle_timeout = \"60s\"\n",
    )
    .expect("config");
    let fds = 256;
    let server = ServerProcess::start_limited(dir.path(), Some(&config), Some(fds)).await;
    let port: u16 = server
        .endpoint
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));

    // More idle connections than the process has descriptors (a server
    // that stops accepting leaves the rest in the backlog, or unconnected).
    let connects =
        (0..400).map(|_| tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(addr)));
    let idle: Vec<TcpStream> = futures_util::future::join_all(connects)
        .await
        .into_iter()
        .filter_map(|c| c.ok()?.ok())
        .collect();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    // Health checks answer (over the cap, once a place of the overflow
    // frees: within a second); the rest is refused; metrics answer.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let healthz = http
            .get(format!("{}/healthz", server.endpoint))
            .send()
            .await;
        if healthz.as_ref().is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/healthz does not answer: {healthz:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let regions = http
        .get(format!("{}/v1/regions", server.endpoint))
        .send()
        .await
        .expect("answered");
    assert_eq!(regions.status(), 503);
    let metrics = http
        .get(format!("{}/metrics", server.metrics_endpoint))
        .send()
        .await
        .expect("/metrics answers");
    assert_eq!(metrics.status(), 200);
    // The server's own counters (a process of its own): it holds its cap,
    // the descriptor limit less server.reserved_fds, and closed the rest.
    let text = metrics.text().await.expect("text");
    let open = value(&text, "flexq_connections", &[("listener", "api")]);
    assert!(open.is_some_and(|n| n >= 128.0), "{text}");
    assert_eq!(
        value(&text, "flexq_connections_limit", &[("listener", "api")]),
        Some(fds as f64 - 128.0),
        "{text}"
    );
    let closed = value(
        &text,
        "flexq_connections_refused_total",
        &[("listener", "api"), ("reason", "closed")],
    )
    .unwrap_or(0.0);
    assert!(closed > 0.0, "{text}");
    assert_eq!(
        value(
            &text,
            "flexq_connections_accept_errors_total",
            &[("listener", "api")]
        ),
        Some(0.0),
        "{text}"
    );
    drop(idle);
}
