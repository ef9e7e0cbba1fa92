//! Hostile load while normal work goes on: random and malformed bodies on
//! every write route, oversized bodies, and slow clients holding
//! connections with half-sent requests. The normal submits must keep
//! succeeding, nothing hostile may get a 5xx, and every acknowledged batch
//! must be stored exactly once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::metrics::value;
use crate::support::{TestServer, flex_batch, no_virtual_nodes};

/// Random request bodies: arbitrary bytes, JSON of the wrong shape, deep
/// nesting, near-valid batches with random property values.
fn hostile_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..2048),
        "[\\[\\{\":,a-z0-9 \\}\\]]{0,512}".prop_map(String::into_bytes),
        (1usize..5000)
            .prop_map(|depth| format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes()),
        (".{0,64}", ".{0,256}").prop_map(|(k, v)| {
            let mut b = flex_batch();
            b["runtimeConfig"]["properties"][k] = Value::String(v);
            serde_json::to_vec(&b).unwrap_or_default()
        }),
        any::<i64>().prop_map(|n| format!("{{\"pysparkBatch\": {n}}}").into_bytes()),
    ]
}

const PATHS: &[&str] = &[
    "/v1/projects/demo/locations/us-central1/batches",
    "/v1/projects/demo/locations/us-central1/batches?batchId=%00%ff",
    "/v1/projects/demo/locations/us-central1/batches?validateOnly=true",
    "/v1/projects/demo/regions/us-central1/operations/x:cancel",
    "/v1/projects/demo/regions/us-central1/quotas",
    "/v1/nodes:register",
    "/v1/nodes/n1:report",
    "/v1/nodes/n1:output",
    "/v1/nodes/n1:poll",
];

/// Connections that send half a request head, a byte at a time: well
/// under `server.max_connections`, so the server must hold them all.
const SLOW_CLIENTS: usize = 200;

/// The server's own `flexq_connections{listener="api"}` and the API
/// connections it refused over its cap (overflow or closed), from its
/// metrics listener.
async fn api_connections(http: &reqwest::Client, metrics: SocketAddr) -> (f64, f64) {
    let text = http
        .get(format!("http://{metrics}/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    let open = value(&text, "flexq_connections", &[("listener", "api")]).unwrap_or(0.0);
    let refused = ["overflow", "closed"]
        .into_iter()
        .map(|reason| {
            value(
                &text,
                "flexq_connections_refused_total",
                &[("listener", "api"), ("reason", reason)],
            )
            .unwrap_or(0.0)
        })
        .sum::<f64>();
    (open, refused)
}

/// Polls the server's API connections until `until`: once they reach
/// [`SLOW_CLIENTS`] (the slow clients all held; the other clients' add to
/// it), the fewest read from then on, else `None`; and the connections
/// refused over the cap by the end.
async fn held_connections(
    http: &reqwest::Client,
    metrics: SocketAddr,
    until: Instant,
) -> (Option<f64>, f64) {
    let mut fewest: Option<f64> = None;
    loop {
        let (open, refused) = api_connections(http, metrics).await;
        if fewest.is_some() || open >= SLOW_CLIENTS as f64 {
            fewest = Some(fewest.map_or(open, |f| f.min(open)));
        }
        if Instant::now() >= until {
            return (fewest, refused);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn normal_submits_survive_hostile_input_and_slow_clients() {
    // A process of its own: its connection gauge counts this test's
    // connections alone, not those of the other tests of this binary.
    let s = TestServer::start_process_with(no_virtual_nodes).await;
    let stop = Instant::now() + Duration::from_secs(6);

    // Slow clients: connections that send half a request, a byte at a time
    // (their heads take longer than the test: they end at `stop`).
    let mut slow = Vec::new();
    for i in 0..SLOW_CLIENTS {
        let addr = s.addr;
        slow.push(tokio::spawn(async move {
            let mut conn = tokio::net::TcpStream::connect(addr)
                .await
                .expect("a loopback connect");
            let head = format!(
                "POST /v1/projects/demo/locations/us-central1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\nX-Slow-{i}: "
            );
            for b in head.bytes() {
                if Instant::now() > stop || conn.write_all(&[b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    // Whether the server holds them, from its own gauge: a loopback
    // connect succeeds while the backlog has room, accepted or not, and a
    // write to a closed connection ends the client quietly, so the clients
    // cannot tell. Up to a second before `stop`, when they start to go.
    let holding = {
        let (http, metrics) = (s.http.clone(), s.metrics_addr);
        let until = stop - Duration::from_secs(1);
        tokio::spawn(async move { held_connections(&http, metrics, until).await })
    };

    // Hostile bodies, as fast as one client sends them.
    let hostile = {
        let (http, base) = (s.http.clone(), s.url(""));
        tokio::spawn(async move {
            let mut runner = TestRunner::deterministic();
            let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
            let mut five_hundreds = Vec::new();
            // A handler that panics drops its connection: the client sees
            // a transport error, never a status. Each one is kept.
            let mut dropped = Vec::new();
            let mut i = 0;
            while Instant::now() < stop {
                let body = hostile_body()
                    .new_tree(&mut runner)
                    .expect("strategy")
                    .current();
                let path = PATHS[i % PATHS.len()];
                i += 1;
                let content_type = if i % 7 == 0 {
                    "text/plain"
                } else {
                    "application/json"
                };
                let req = http
                    .post(format!("{base}{path}"))
                    .header("content-type", content_type)
                    .body(body.clone());
                let r = match req.send().await {
                    Ok(r) => r,
                    Err(e) => {
                        dropped.push(format!(
                            "{path}: {e:?} on {:?}",
                            String::from_utf8_lossy(&body)
                        ));
                        continue;
                    }
                };
                let st = r.status().as_u16();
                *statuses.entry(st).or_default() += 1;
                if st >= 500 {
                    five_hundreds.push(format!("{path} {st} {:?}", String::from_utf8_lossy(&body)));
                }
            }
            // One body over the limit.
            let big = vec![b'{'; 2 * 1024 * 1024];
            let oversized = http
                .post(format!("{base}{}", PATHS[0]))
                .header("content-type", "application/json")
                .body(big)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .map_err(|e| format!("{e:?}"));
            (statuses, five_hundreds, dropped, oversized)
        })
    };

    // Normal work: submits with request ids, and each is acknowledged.
    let mut acknowledged = Vec::new();
    let mut n = 0;
    while Instant::now() < stop {
        let id = format!("normal-{n:05}");
        let started = Instant::now();
        let (st, op) = s
            .create(&format!("batchId={id}&requestId=req-{n}"), &flex_batch())
            .await;
        assert_eq!(st, 200, "a normal submit failed under hostile load: {op}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a normal submit took {:?}",
            started.elapsed()
        );
        acknowledged.push(id);
        n += 1;
    }
    let (statuses, five_hundreds, dropped, oversized) = hostile.await.expect("hostile task");
    for t in slow {
        t.await.expect("slow client");
    }
    let (fewest, refused) = holding.await.expect("connection gauge");
    let fewest = fewest.unwrap_or_else(|| {
        panic!(
            "the server never held all {SLOW_CLIENTS} slow clients at once ({refused} connections refused over its cap)"
        )
    });
    assert!(
        fewest >= SLOW_CLIENTS as f64,
        "the server let slow clients go: {fewest} API connections at the fewest while {SLOW_CLIENTS} sent their heads"
    );
    assert_eq!(refused, 0.0, "API connections refused over the cap");
    assert!(
        dropped.is_empty(),
        "connections dropped without an answer: {dropped:#?}"
    );
    assert_eq!(oversized, Ok(413), "a body over server.max_body_bytes");
    eprintln!(
        "hostile statuses: {statuses:?}; normal submits acknowledged: {}",
        acknowledged.len()
    );
    assert!(
        five_hundreds.is_empty(),
        "5xx on hostile input: {five_hundreds:#?}"
    );
    let sent: usize = statuses.values().sum();
    assert!(
        sent > 100,
        "the hostile client sent {sent} requests: {statuses:?}"
    );
    assert!(statuses.contains_key(&400), "{statuses:?}");
    assert!(
        acknowledged.len() > 20,
        "only {} normal submits",
        acknowledged.len()
    );

    // Every acknowledged batch is there, once.
    let stored = s.list_all("").await;
    let mut ids: Vec<&str> = stored
        .iter()
        .filter_map(|b| b["name"].as_str())
        .filter_map(|n| n.rsplit('/').next())
        .filter(|id| id.starts_with("normal-"))
        .collect();
    ids.sort();
    let before = ids.len();
    ids.dedup();
    assert_eq!(before, ids.len(), "a batch stored twice");
    assert_eq!(
        ids,
        acknowledged.iter().map(String::as_str).collect::<Vec<_>>()
    );
    // The server still answers promptly.
    let ready = s.http.get(s.url("/readyz")).send().await.expect("readyz");
    assert_eq!(ready.status(), 200);
}
