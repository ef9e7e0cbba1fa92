//! The event stream (`GET .../batches:watch`, Server-Sent Events) as a
//! client reads it off the wire: a reconnect with `Last-Event-ID` loses
//! nothing; bad ids are named; watchers beyond the limit are refused; a
//! watcher that stops reading is dropped, not buffered for.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::support::{ServerProcess, TestServer, flex_batch, flex_with};

/// One server-sent event.
#[derive(Debug, Clone)]
pub(crate) struct SseEvent {
    pub event: String,
    pub id: Option<String>,
    pub data: Value,
}

/// A watch as a client reads it.
pub(crate) struct Sse {
    resp: reqwest::Response,
    text: String,
}

impl Sse {
    /// Opens `url`; with `last` as `Last-Event-ID`. Panics unless 200.
    pub(crate) async fn open(url: &str, last: Option<&str>) -> Sse {
        match Self::try_open(url, last).await {
            (_, Ok(sse)) => sse,
            (status, Err(body)) => panic!("watch {url}: {status} {body}"),
        }
    }

    /// The status, and the stream or the error's body.
    pub(crate) async fn try_open(url: &str, last: Option<&str>) -> (u16, Result<Sse, Value>) {
        let mut req = reqwest::Client::new().get(url);
        if let Some(last) = last {
            req = req.header("last-event-id", last);
        }
        let resp = req.send().await.expect("watch");
        let status = resp.status().as_u16();
        if status != 200 {
            return (status, Err(resp.json().await.unwrap_or(Value::Null)));
        }
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap_or_default()
                .starts_with("text/event-stream")
        );
        (
            status,
            Ok(Sse {
                resp,
                text: String::new(),
            }),
        )
    }

    /// The next event (keep-alive comments skipped), or None after `wait`.
    pub(crate) async fn next(&mut self, wait: Duration) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            while let Some(end) = self.text.find("\n\n") {
                let block: String = self.text.drain(..end + 2).collect();
                let (mut event, mut id, mut data) = (String::new(), None, String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        event = v.to_string();
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.to_string());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                if !event.is_empty() {
                    let data = serde_json::from_str(&data).expect("event data is JSON");
                    return Some(SseEvent { event, id, data });
                }
            }
            match tokio::time::timeout_at(deadline, self.resp.chunk()).await {
                Ok(Ok(Some(bytes))) => self.text.push_str(&String::from_utf8_lossy(&bytes)),
                _ => return None,
            }
        }
    }
}

fn watch_url(s: &TestServer, query: &str) -> String {
    s.url(&format!(
        "/v1/projects/demo/locations/us-central1/batches:watch{query}"
    ))
}

/// Reads events until `done` says every expectation is met; returns the
/// batches' last states seen and the last id. Fails after 10 s.
async fn read_until(
    sse: &mut Sse,
    seen: &mut BTreeMap<String, String>,
    last: &mut Option<String>,
    done: impl Fn(&BTreeMap<String, String>) -> bool,
) {
    let t = Instant::now();
    while !done(seen) {
        assert!(t.elapsed() < Duration::from_secs(10), "seen only {seen:?}");
        let Some(e) = sse.next(Duration::from_secs(10)).await else {
            panic!("the stream ended; seen {seen:?}");
        };
        if let Some(id) = &e.id {
            *last = Some(id.clone());
        }
        if e.event == "batch" {
            let b = &e.data["batch"];
            let id = b["name"]
                .as_str()
                .unwrap_or_default()
                .rsplit('/')
                .next()
                .unwrap_or_default();
            seen.insert(
                id.to_string(),
                b["state"].as_str().unwrap_or_default().to_string(),
            );
        }
    }
}

async fn cancel(s: &TestServer, id: &str) {
    let (_, b) = s
        .get(&format!(
            "/v1/projects/demo/locations/us-central1/batches/{id}"
        ))
        .await;
    let op = b["operation"].as_str().expect("op").to_string();
    assert_eq!(s.post(&format!("/v1/{op}:cancel")).await.0, 200);
}

#[tokio::test]
async fn a_reconnect_with_the_last_event_id_loses_nothing() {
    let s = TestServer::start().await;
    let mut sse = Sse::open(&watch_url(&s, ""), None).await;
    let ready = sse.next(Duration::from_secs(5)).await.expect("ready");
    assert_eq!(ready.event, "ready", "{ready:?}");
    let mut last = ready.id.clone();
    let mut seen = BTreeMap::new();
    for id in ["w-one", "w-two"] {
        assert_eq!(
            s.create(&format!("batchId={id}"), &flex_batch()).await.0,
            200
        );
    }
    read_until(&mut sse, &mut seen, &mut last, |s| s.len() == 2).await;
    assert!(seen.values().all(|st| st == "PENDING"), "{seen:?}");
    // The watcher goes away; meanwhile a batch is created, one cancelled,
    // and another project's batch created (not this watch's).
    drop(sse);
    assert_eq!(s.create("batchId=w-three", &flex_batch()).await.0, 200);
    cancel(&s, "w-one").await;
    let other = s.url("/v1/projects/other/locations/us-central1/batches?batchId=w-other");
    let r = s
        .http
        .post(other)
        .json(&flex_batch())
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), 200);
    // Back, from the last id it saw: everything after it, nothing else.
    let mut sse = Sse::open(&watch_url(&s, ""), last.as_deref()).await;
    let mut after = BTreeMap::new();
    read_until(&mut sse, &mut after, &mut last, |s| {
        s.get("w-three").is_some() && s.get("w-one").is_some_and(|st| st == "CANCELLED")
    })
    .await;
    assert!(!after.contains_key("w-other"), "{after:?}");
    // Nothing further is pending for this watch: w-two did not change (a
    // queued batch's position may move).
    while let Some(more) = sse.next(Duration::from_millis(600)).await {
        assert_eq!(more.event, "position", "{more:?}");
    }
    assert!(!after.contains_key("w-two"), "{after:?}");
    // The same id by query parameter (for clients that cannot set headers).
    let mut again = Sse::open(
        &watch_url(
            &s,
            &format!("?lastEventId={}", last.as_deref().unwrap_or_default()),
        ),
        None,
    )
    .await;
    cancel(&s, "w-two").await;
    let mut seen = BTreeMap::new();
    read_until(&mut again, &mut seen, &mut last, |s| {
        s.get("w-two").is_some_and(|st| st == "CANCELLED")
    })
    .await;
}

#[tokio::test]
async fn one_batch_or_every_project_and_the_ids_that_are_not_ours() {
    let s = TestServer::start().await;
    assert_eq!(s.create("batchId=only-me", &flex_batch()).await.0, 200);
    assert_eq!(s.create("batchId=not-me", &flex_batch()).await.0, 200);
    let mut one = Sse::open(&watch_url(&s, "?batchId=only-me"), None).await;
    let mut all = Sse::open(
        &s.url("/v1/projects/-/locations/us-central1/batches:watch"),
        None,
    )
    .await;
    assert_eq!(
        one.next(Duration::from_secs(5)).await.expect("ready").event,
        "ready"
    );
    assert_eq!(
        all.next(Duration::from_secs(5)).await.expect("ready").event,
        "ready"
    );
    cancel(&s, "not-me").await;
    cancel(&s, "only-me").await;
    let mut seen = BTreeMap::new();
    let mut last = None;
    read_until(&mut one, &mut seen, &mut last, |s| {
        s.contains_key("only-me")
    })
    .await;
    assert!(!seen.contains_key("not-me"), "{seen:?}");
    let mut seen = BTreeMap::new();
    read_until(&mut all, &mut seen, &mut last, |s| s.len() == 2).await;
    // Deleted batches are events too.
    assert_eq!(
        s.delete("/v1/projects/demo/locations/us-central1/batches/only-me")
            .await
            .0,
        200
    );
    let deleted = one.next(Duration::from_secs(5)).await.expect("deleted");
    assert_eq!(deleted.event, "deleted", "{deleted:?}");
    assert_eq!(
        deleted.data["name"],
        "projects/demo/locations/us-central1/batches/only-me"
    );
    // Bad input, each named.
    for (query, header, names) in [
        ("", Some("99-99"), "Last-Event-ID"),
        ("", Some("0-999999"), "Last-Event-ID"),
        ("", Some("not-an-id"), "Last-Event-ID"),
        ("?lastEventId=-1", None, "Last-Event-ID"),
        ("?batchId=nobody", None, "nobody"),
        ("?limit=3", None, "limit"),
    ] {
        let (status, body) = match Sse::try_open(&watch_url(&s, query), header).await {
            (status, Err(body)) => (status, body),
            (status, Ok(_)) => panic!("{query} {header:?}: accepted ({status})"),
        };
        assert!(
            [400, 404].contains(&status) && body.to_string().contains(names),
            "{query} {header:?}: {status} {body}"
        );
    }
    let r = s
        .http
        .get(s.url("/v1/projects/demo/locations/nowhere-1/batches:watch"))
        .send()
        .await
        .expect("watch");
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap_or_default().contains("nowhere-1"));
}

#[tokio::test]
async fn watchers_beyond_the_limit_are_refused_and_one_that_stops_reading_is_dropped() {
    // A server process of its own: its metrics are its own.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("flexq.toml");
    crate::support::virtual_l4_config(&file, 0);
    let mut text = std::fs::read_to_string(&file).expect("config");
    text.push_str("[limits]\nmax_watchers = 2\nwatch_stall = \"1s\"\n");
    std::fs::write(&file, text).expect("config");
    let s = ServerProcess::start_with(dir.path(), Some(&file)).await;
    let url = format!(
        "{}/v1/projects/demo/locations/us-central1/batches:watch",
        s.endpoint
    );
    let addr = s.endpoint.trim_start_matches("http://").to_string();
    // The first watcher reads everything it is sent, and passes on the
    // id of each batch it hears of.
    let mut first = Sse::open(&url, None).await;
    let (heard, mut heard_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let reader = tokio::spawn(async move {
        while let Some(e) = first.next(Duration::from_secs(30)).await {
            if let Some(name) = e.data["batch"]["name"].as_str() {
                let id = name.rsplit('/').next().unwrap_or_default().to_string();
                if heard.send(id).is_err() {
                    return;
                }
            }
        }
    });
    // Until the reader has heard of `id`: the ids it heard of until then.
    // Fails after 20 s.
    let heard_of = async |rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, id: &str| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut ids = std::collections::BTreeSet::new();
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(got)) if got == id => return ids,
                Ok(Some(got)) => {
                    ids.insert(got);
                }
                Ok(None) => panic!("the reading watcher's stream ended before {id}"),
                Err(_) => panic!("the reading watcher did not hear of {id} within 20 s"),
            }
        }
    };
    // The second watcher sends its request and never reads a byte.
    let mut stalled = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    stalled
        .write_all(
            format!(
                "GET /v1/projects/demo/locations/us-central1/batches:watch HTTP/1.1\r\nhost: {addr}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .expect("request");
    let t = Instant::now();
    while !s.scrape().await.contains("flexq_watchers 2") {
        assert!(t.elapsed() < Duration::from_secs(5), "{}", s.scrape().await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = Sse::try_open(&url, None).await;
    assert_eq!(status, 429);
    let body = body.err().unwrap_or_default();
    assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED", "{body}");
    assert!(body.to_string().contains("limits.max_watchers"), "{body}");
    // Big events, many: more than the socket and the watch's channel hold.
    let label = "x".repeat(16_000);
    for i in 0..800 {
        let mut b = flex_with("spark.executor.instances", "2");
        b["runtimeConfig"]["properties"]["spark.flexq.padding"] = json!(label);
        assert_eq!(s.create(&format!("big-{i}"), &b).await, 200);
    }
    // The one that reads heard of every batch, to the last...
    let heard = heard_of(&mut heard_rx, "big-799").await;
    let missed: Vec<String> = (0..799)
        .map(|i| format!("big-{i}"))
        .filter(|id| !heard.contains(id))
        .collect();
    assert!(missed.is_empty(), "the reading watcher missed {missed:?}");
    // ... the stalled watcher is dropped ...
    let t = Instant::now();
    loop {
        let text = s.scrape().await;
        if text.contains("flexq_watchers 1")
            && text.contains("flexq_watchers_dropped_total{reason=\"stalled\"} 1")
        {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ... and the one that reads is not: it hears of what happens after.
    assert_eq!(s.create("after-the-drop", &flex_batch()).await, 200);
    heard_of(&mut heard_rx, "after-the-drop").await;
    assert!(
        s.scrape()
            .await
            .contains("flexq_watchers_dropped_total{reason=\"stalled\"} 1"),
        "only the stalled watcher was dropped"
    );
    reader.abort();
    drop(stalled);
    // Room again.
    let t = Instant::now();
    loop {
        let (status, sse) = Sse::try_open(&url, None).await;
        if sse.is_ok() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
