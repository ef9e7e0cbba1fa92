//! A replica cut off from PostgreSQL in the middle of a write, as a real
//! partition looks: a proxy of the test's own between the leader and the
//! database stops forwarding, both ways, at a chosen moment, and closes
//! nothing. The cut-off session's locks must not stall the healthy
//! replicas for longer than the lease plus one renewal (L + R), another
//! replica must lead within that, and the cut-off one must write nothing
//! once fenced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;

use crate::replicas::{
    Replica, audit, config_file, gpu_batch, leader, leads_by_metrics, leads_within,
};
use crate::support::fresh_postgres_database;

/// The default config's lease and renewal (L + R): the bound on a stall.
const LEASE_AND_RENEWAL: Duration = Duration::from_millis(2250);
/// What a loaded 2-core machine adds to it: process scheduling, polling.
const SLACK: Duration = Duration::from_millis(1250);
/// The default config's preemptible L4 quota of a project, which these
/// tests leave as it is.
const L4_QUOTA: i64 = 24;
/// How long a cut lasts: far longer than the bound, so a stall that lasts
/// the whole cut is told from one that ends in time.
const CUT: Duration = Duration::from_secs(7);

/// A TCP proxy to PostgreSQL that can freeze: then it forwards nothing
/// either way and closes nothing. `freeze_after(text)` freezes the moment
/// a client has sent the execution of a statement whose SQL contains
/// `text` (forwarded first, so the server runs it).
struct FreezingProxy {
    url: String,
    frozen: watch::Sender<bool>,
    trigger: Arc<Mutex<Option<String>>>,
}

impl FreezingProxy {
    async fn start(db_url: &str) -> FreezingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (frozen, _) = watch::channel(false);
        let trigger = Arc::new(Mutex::new(None::<String>));
        let (f, t) = (frozen.clone(), trigger.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (f, t) = (f.clone(), t.clone());
                tokio::spawn(async move {
                    // A connection opened while frozen hangs, as in a
                    // partition.
                    let _ = f.subscribe().wait_for(|x| !*x).await;
                    let Ok(up) = tokio::net::TcpStream::connect("127.0.0.1:5432").await else {
                        return;
                    };
                    let ((cr, cw), (ur, uw)) = (client.into_split(), up.into_split());
                    tokio::spawn(pump(ur, cw, f.clone(), None));
                    pump(cr, uw, f, Some(t)).await;
                });
            }
        });
        let url = db_url.replacen("127.0.0.1:5432", &format!("127.0.0.1:{port}"), 1);
        assert_ne!(
            url, db_url,
            "the test PostgreSQL is expected on 127.0.0.1:5432"
        );
        // In clear, so that the proxy can see which statement runs.
        let url = format!("{url}?sslmode=disable");
        FreezingProxy {
            url,
            frozen,
            trigger,
        }
    }

    fn freeze_after(&self, sql: &str) {
        *self.trigger.lock().expect("trigger") = Some(sql.into());
    }

    fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// Waits until frozen; answers when.
    async fn frozen_within(&self, within: Duration) -> Instant {
        let t = Instant::now();
        while !*self.frozen.borrow() {
            assert!(t.elapsed() < within, "the proxy never froze");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Instant::now()
    }
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    frozen: watch::Sender<bool>,
    trigger: Option<Arc<Mutex<Option<String>>>>,
) {
    let mut thawed = frozen.subscribe();
    let mut seen = Frontend::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if thawed.wait_for(|x| !*x).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Froze meanwhile: hold the bytes until thawed.
        if thawed.wait_for(|x| !*x).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if let Some(t) = &trigger {
            let needle = t.lock().expect("trigger").clone();
            if seen.feed(&buf[..n], needle.as_deref()) {
                *t.lock().expect("trigger") = None;
                frozen.send_replace(true);
            }
        }
    }
}

/// Just enough of PostgreSQL's frontend protocol to see which statement a
/// Bind or Query runs: sqlx parses a statement once per connection under
/// a name, then binds it by name.
#[derive(Default)]
struct Frontend {
    started: bool,
    pending: Vec<u8>,
    names: HashMap<String, String>,
}

impl Frontend {
    /// Reads `bytes`; true when they executed a statement containing
    /// `needle`.
    fn feed(&mut self, bytes: &[u8], needle: Option<&str>) -> bool {
        fn cstr(b: &[u8]) -> (String, usize) {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            (
                String::from_utf8_lossy(&b[..end]).into_owned(),
                (end + 1).min(b.len()),
            )
        }
        self.pending.extend_from_slice(bytes);
        let mut hit = false;
        loop {
            let head = if self.started { 5 } else { 4 };
            if self.pending.len() < head {
                return hit;
            }
            let len =
                u32::from_be_bytes(self.pending[head - 4..head].try_into().expect("four bytes"))
                    as usize;
            let total = len + head - 4;
            if self.pending.len() < total {
                return hit;
            }
            let msg: Vec<u8> = self.pending.drain(..total).collect();
            if !self.started {
                self.started = true;
                continue;
            }
            let body = &msg[5..];
            let has = |sql: &str| needle.is_some_and(|n| sql.contains(n));
            match msg[0] {
                b'P' => {
                    let (name, k) = cstr(body);
                    let (sql, _) = cstr(&body[k..]);
                    self.names.insert(name, sql);
                }
                b'B' => {
                    let (_, k) = cstr(body);
                    let (statement, _) = cstr(&body[k..]);
                    hit |= self.names.get(&statement).is_some_and(|s| has(s));
                }
                b'Q' => hit |= has(&cstr(body).0),
                _ => {}
            }
        }
    }
}

struct Cluster {
    _dir: tempfile::TempDir,
    _database: crate::support::PgDatabase,
    url: String,
    proxy: FreezingProxy,
    /// r0 (through the proxy, the leader), r1, r2.
    r0: Replica,
    others: [Replica; 2],
    http: reqwest::Client,
}

impl Cluster {
    async fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let database = fresh_postgres_database().await;
        let url = database.url.clone();
        let config = config_file(dir.path());
        let proxy = FreezingProxy::start(&url).await;
        let r0 = Replica::start("r0", &proxy.url, &config, dir.path()).await;
        leads_within(&r0, Duration::from_secs(10)).await;
        let others = [
            Replica::start("r1", &url, &config, dir.path()).await,
            Replica::start("r2", &url, &config, dir.path()).await,
        ];
        Cluster {
            _dir: dir,
            _database: database,
            url,
            proxy,
            r0,
            others,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(20))
                .build()
                .expect("client"),
        }
    }

    async fn create(&self, endpoint: &str, query: &str, body: &Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!(
                "{endpoint}/v1/projects/demo/locations/us-central1/batches?{query}"
            ))
            .json(body)
            .send()
            .await
            .expect("create");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn cancel(&self, endpoint: &str, operation: &str) -> u16 {
        self.http
            .post(format!(
                "{endpoint}/v1/projects/demo/regions/us-central1/operations/{operation}:cancel"
            ))
            .send()
            .await
            .expect("cancel")
            .status()
            .as_u16()
    }

    async fn allocated(&self) -> Vec<String> {
        let db = sqlx::PgPool::connect(&self.url).await.expect("db");
        let ops = sqlx::query_scalar(
            "select operation_id from batches where provisioning = 1 and state = 1 order by seq",
        )
        .fetch_all(&db)
        .await
        .expect("allocated");
        db.close().await;
        ops
    }
}

/// The leader is cut off the moment it has run `trigger` inside a
/// scheduler commit (holding the write lock, or just after checking its
/// term, holding the lease row): a cancel on another replica and the
/// takeover each come within L + R, never after the whole cut; once the
/// cut heals the old leader is a follower and nothing was overcommitted.
async fn cut_off_holding(trigger: &str) {
    let c = Cluster::start().await;
    let (r1, r2) = (&c.others[0].endpoint, &c.others[1].endpoint);
    // Four whole-node batches fill the four nodes; a fifth waits.
    for i in 0..5 {
        let (st, b) = c
            .create(r1, &format!("batchId=fill-{i}"), &gpu_batch(3, "600s"))
            .await;
        assert_eq!(st, 200, "{b}");
    }
    let t = Instant::now();
    while c.allocated().await.len() < 4 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the four never allocated"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let allocated = c.allocated().await;

    // A cancel frees a node: the leader's next commit gives it to the
    // fifth, and is cut off at `trigger`.
    c.proxy.freeze_after(trigger);
    assert_eq!(c.cancel(r2, &allocated[0]).await, 200);
    let cut = c.proxy.frozen_within(Duration::from_secs(10)).await;

    // Healthy replicas go on: a cancel waits at most for the cut-off
    // session's locks to end, a create does not wait at all.
    let cancelled = c.cancel(r2, &allocated[1]).await;
    let cancel_took = cut.elapsed();
    assert_eq!(cancelled, 200);
    let started = Instant::now();
    let (st, b) = c
        .create(r1, "batchId=during-cut", &gpu_batch(2, "600s"))
        .await;
    let create_took = started.elapsed();
    assert_eq!(st, 200, "{b}");
    let took = loop {
        if leader(&c.others).await.is_some() {
            break cut.elapsed();
        }
        assert!(cut.elapsed() < CUT, "no other replica leads during the cut");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!(
        "cut off at {trigger:?}: a cancel answered after {cancel_took:?}, a create took {create_took:?}, another replica leads after {took:?}"
    );
    assert!(
        cancel_took < LEASE_AND_RENEWAL + SLACK,
        "a cancel stalled {cancel_took:?} behind the cut-off leader"
    );
    assert!(
        create_took < SLACK,
        "a create stalled {create_took:?} behind the cut-off leader"
    );
    assert!(
        took < LEASE_AND_RENEWAL + SLACK,
        "another replica led only after {took:?}"
    );

    // The new leader decides: the freed nodes go to the queue.
    let t = Instant::now();
    while c.allocated().await.len() < 4 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the new leader never allocated"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The cut heals: the old leader is a follower, and wrote nothing once
    // fenced (the audit: no GPU twice, every cluster whole).
    tokio::time::sleep(CUT.saturating_sub(cut.elapsed())).await;
    c.proxy.thaw();
    let t = Instant::now();
    while leads_by_metrics(&c.r0.metrics).await != Some(false) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "r0 still leads after the cut"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    audit(&c.url, L4_QUOTA)
        .await
        .expect("the allocation history is sound");
    assert!(leader(&c.others).await.is_some(), "r1 or r2 still leads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_holding_the_write_lock_stalls_nobody_past_the_lease() {
    cut_off_holding("pg_advisory_xact_lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_after_checking_its_term_stalls_nobody_past_the_lease() {
    cut_off_holding("for share").await;
}

/// A client whose create was cut off with its replica retries it on
/// another (same requestId), as the docs advise: the retry waits apart
/// for the cut-off transaction to end and answers the one batch; the
/// creates sent beside it are not held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_retried_elsewhere_holds_up_no_other_create() {
    let c = Cluster::start().await;
    let r1 = c.others[0].endpoint.clone();
    let body = gpu_batch(2, "600s");
    let query = "batchId=retried&requestId=5f0e6b0c-1b7e-4c55-9a42-3c1f0b6d2a11";

    c.proxy.freeze_after("insert into batches");
    let first = {
        let (http, r0, body) = (c.http.clone(), c.r0.endpoint.clone(), body.clone());
        tokio::spawn(async move {
            http.post(format!(
                "{r0}/v1/projects/demo/locations/us-central1/batches?{query}"
            ))
            .json(&body)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map(|r| r.status().as_u16())
        })
    };
    let cut = c.proxy.frozen_within(Duration::from_secs(10)).await;

    // The retry, then ten others right behind it.
    let retry = {
        let (http, r1, body) = (c.http.clone(), r1.clone(), body.clone());
        tokio::spawn(async move {
            loop {
                let r = http
                    .post(format!(
                        "{r1}/v1/projects/demo/locations/us-central1/batches?{query}"
                    ))
                    .json(&body)
                    .send()
                    .await
                    .expect("retry");
                let status = r.status().as_u16();
                let answer: Value = r.json().await.unwrap_or(Value::Null);
                // A client retries what did not answer in time, as on a 503.
                if status < 500 || cut.elapsed() > CUT {
                    return (status, answer, cut.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut others = Vec::new();
    for i in 0..10 {
        let (http, r1, body) = (c.http.clone(), r1.clone(), body.clone());
        others.push(tokio::spawn(async move {
            let started = Instant::now();
            let r = http
                .post(format!(
                    "{r1}/v1/projects/demo/locations/us-central1/batches?batchId=beside-{i}"
                ))
                .json(&body)
                .send()
                .await
                .expect("create");
            (r.status().as_u16(), started.elapsed())
        }));
    }
    let mut slowest = Duration::ZERO;
    for o in others {
        let (status, took) = o.await.expect("create task");
        assert_eq!(status, 200);
        slowest = slowest.max(took);
    }
    let (status, answer, retry_took) = retry.await.expect("retry task");
    eprintln!(
        "the creates beside the retry took at most {slowest:?}; the retry answered after {retry_took:?}"
    );
    assert_eq!(status, 200, "{answer}");
    assert!(
        slowest < SLACK,
        "a create beside the retried one stalled {slowest:?}"
    );
    assert!(
        retry_took < LEASE_AND_RENEWAL + SLACK,
        "the retried create answered after {retry_took:?}"
    );

    // The cut heals: one batch for the requestId, whatever the first
    // replica answers.
    tokio::time::sleep(CUT.saturating_sub(cut.elapsed())).await;
    c.proxy.thaw();
    let _ = first.await;
    let db = sqlx::PgPool::connect(&c.url).await.expect("db");
    let n: i64 = sqlx::query_scalar("select count(*) from batches where batch_id = 'retried'")
        .fetch_one(&db)
        .await
        .expect("count");
    assert_eq!(n, 1, "one batch for one requestId");
    db.close().await;
}
