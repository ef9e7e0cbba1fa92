//! A run of faults, one after another, each healed before the next: the
//! database restarts, then the leader is cut off (at a random moment,
//! holding the write lock, right after a scheduler commit checked its
//! term, inside a group commit of creates). Three replicas on real
//! PostgreSQL, each behind its own proxy (`crate::proxy`), under creating
//! clients and, on every replica, a probe that creates and cancels.
//!
//! What each fault must not leave behind for the next (DESIGN: a
//! partition heals cleanly):
//! - after every heal, every replica answers `/readyz` within the lease
//!   plus one renewal, exactly one of them as the leader, and the one that
//!   was cut off as a follower, without a restart;
//! - a replica that holds the lease says so on `/readyz` within a second
//!   of taking it (the database's lease row is the witness);
//! - a healthy replica's creates never take over 3 s, its cancels never
//!   over 6 s, and none fails, through the whole run;
//! - at the end every replica's core agrees with the database (its change
//!   stream and mirror work again), and the allocation history is sound.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::proxy::FreezingProxy;
use crate::replicas::{Replica, audit, config_file, gpu_batch, leader};
use crate::support::{fresh_postgres_database, metrics_text};

/// The default config's preemptible L4 quota of a project, which this
/// test leaves as it is.
const L4_QUOTA: i64 = 24;
/// The default lease and renewal (L + R).
const LEASE_AND_RENEWAL: Duration = Duration::from_millis(2250);
/// What a loaded 2-core machine adds: process scheduling, polling.
const SLACK: Duration = Duration::from_millis(1250);
/// How long a group commit of creates may wait on the database (2L + R).
const WRITE_BOUND: Duration = Duration::from_millis(4250);
/// How long a partition lasts: well past the lease.
const CUT: Duration = Duration::from_secs(6);
/// How long the restarted database refuses connections.
const DOWN: Duration = Duration::from_secs(1);
/// The bounds on a healthy replica's calls.
const CREATE_BOUND: Duration = Duration::from_secs(3);
const CANCEL_BOUND: Duration = Duration::from_secs(6);

/// One call of a probe: which replica, what, when it began, how long it
/// took, and its status (0: no answer).
#[derive(Clone)]
struct Call {
    replica: usize,
    what: &'static str,
    began: Instant,
    took: Duration,
    status: u16,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "r{} {} took {:?} ({}), began {:?} into the run",
            self.replica,
            self.what,
            self.took,
            self.status,
            self.began
                .saturating_duration_since(*START.get().expect("started"))
        )
    }
}

/// When the run began: calls and faults are told relative to it.
static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// `t` relative to the run's start.
fn at(t: Instant) -> Duration {
    t.saturating_duration_since(*START.get().expect("started"))
}

/// When replica `replica` was out of service by a fault: calls begun on it
/// in `[from, until)` are not a healthy replica's.
#[derive(Debug, Clone, Copy)]
struct Excused {
    replica: Option<usize>,
    from: Instant,
    until: Instant,
}

struct Run {
    _database: crate::support::PgDatabase,
    url: String,
    /// The replicas' logs (`r0.log`, ...).
    dir: tempfile::TempDir,
    proxies: Vec<FreezingProxy>,
    replicas: Vec<Replica>,
}

impl Drop for Run {
    /// On a failure, what each replica warned of: what the run left
    /// behind is in there.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for r in &self.replicas {
            let log = std::fs::read_to_string(self.dir.path().join(format!("{}.log", r.name)))
                .unwrap_or_default();
            let warned: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .filter(|l| !l.contains("http.status="))
                .collect();
            eprintln!(
                "--- {}'s last warnings:\n{}",
                r.name,
                warned[warned.len().saturating_sub(40)..].join("\n")
            );
        }
    }
}

impl Run {
    async fn start() -> Run {
        let dir = tempfile::tempdir().expect("tempdir");
        let database = fresh_postgres_database().await;
        let url = database.url.clone();
        let config = config_file(dir.path());
        let mut proxies = Vec::new();
        let mut replicas = Vec::new();
        for i in 0..3 {
            let proxy = FreezingProxy::start(&url).await;
            let name = format!("r{i}");
            let r = Replica::start(
                &name,
                &format!("{}&application_name={name}", proxy.url),
                &config,
                dir.path(),
            )
            .await;
            if i == 0 {
                crate::replicas::leads_within(&r, Duration::from_secs(10)).await;
            }
            proxies.push(proxy);
            replicas.push(r);
        }
        Run {
            _database: database,
            url,
            dir,
            proxies,
            replicas,
        }
    }

    /// The lease row: holder and term, when live.
    async fn lease(&self, db: &sqlx::PgPool) -> Option<(String, i64)> {
        sqlx::query_as(
            "select holder, term from leader_lease where id = 1 \
             and expires_at >= (extract(epoch from clock_timestamp()) * 1000000)::bigint",
        )
        .fetch_optional(db)
        .await
        .ok()
        .flatten()
    }

    /// Cancels one allocated batch through `endpoint`.
    async fn cancel_one_allocated(&self, db: &sqlx::PgPool, endpoint: &str) {
        let op: String = sqlx::query_scalar(
            "select operation_id from batches where provisioning = 1 and state = 1 \
             order by seq limit 1",
        )
        .fetch_one(db)
        .await
        .expect("an allocated batch");
        let status = reqwest::Client::new()
            .post(format!(
                "{endpoint}/v1/projects/demo/regions/us-central1/operations/{op}:cancel"
            ))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0);
        assert_eq!(status, 200, "the cancel of {op}");
    }

    /// Until every replica answers `/readyz`, exactly one as the leader
    /// (the one PostgreSQL's lease names) and the others as its
    /// followers; answers how long it took and the leader. Fails after
    /// `within`, saying what each answered.
    async fn all_ready(
        &self,
        db: &sqlx::PgPool,
        within: Duration,
        after: &str,
    ) -> (Duration, usize) {
        let t = Instant::now();
        loop {
            let mut answers = Vec::new();
            for r in &self.replicas {
                answers.push(r.readyz().await);
            }
            let leaders: Vec<usize> = (0..answers.len())
                .filter(|i| answers[*i].as_ref().is_some_and(|z| z["role"] == "leader"))
                .collect();
            let lease = self.lease(db).await;
            if let ([l], Some((holder, term))) = (leaders.as_slice(), &lease) {
                let name = &self.replicas[*l].name;
                let agreed = answers.iter().enumerate().all(|(i, z)| {
                    z.as_ref().is_some_and(|z| {
                        if i == *l {
                            z["term"] == *term
                        } else {
                            z["role"] == "follower" && z["leader"] == name.as_str()
                        }
                    })
                });
                if agreed && holder == name {
                    return (t.elapsed(), *l);
                }
            }
            assert!(
                t.elapsed() < within,
                "after {after}, not every replica is ready with one leader within {within:?}: \
                 lease {lease:?}, /readyz {answers:?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// Creates and cancels through replica `i` until `stop`, recording each
/// call.
async fn probe(i: usize, endpoint: String, calls: Arc<Mutex<Vec<Call>>>, stop: CancellationToken) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let mut n = 0;
    while !stop.is_cancelled() {
        n += 1;
        let began = Instant::now();
        let created = http
            .post(format!(
                "{endpoint}/v1/projects/demo/locations/us-central1/batches?batchId=probe-{i}-{n}"
            ))
            .json(&gpu_batch(2, "600s"))
            .send()
            .await;
        let (status, body) = match created {
            Ok(r) => (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or_default(),
            ),
            Err(_) => (0, Value::Null),
        };
        if status != 200 && n < 3 {
            eprintln!("probe {i}: create answered {status}: {body}");
        }
        calls.lock().expect("calls").push(Call {
            replica: i,
            what: "create",
            began,
            took: began.elapsed(),
            status,
        });
        if let Some(op) = body["name"].as_str().filter(|_| status == 200) {
            let began = Instant::now();
            let status = http
                .post(format!("{endpoint}/v1/{op}:cancel"))
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0);
            calls.lock().expect("calls").push(Call {
                replica: i,
                what: "cancel",
                began,
                took: began.elapsed(),
                status,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates through the replicas in turn until `stop`: the load.
async fn load(k: usize, endpoints: Vec<String>, stop: CancellationToken) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let mut n = 0usize;
    while !stop.is_cancelled() {
        n += 1;
        let endpoint = &endpoints[(k + n) % endpoints.len()];
        let _ = http
            .post(format!(
                "{endpoint}/v1/projects/demo/locations/us-central1/batches?batchId=load-{k}-{n}"
            ))
            .json(&gpu_batch(2, "600s"))
            .send()
            .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How a cut heals.
#[derive(Debug, Clone, Copy)]
enum Heal {
    /// What was held goes through: the link only paused.
    Resume,
    /// What was open is lost for good (`FreezingProxy::heal_losing_open`).
    Lose,
}

/// The moments the leader is cut off at (a statement it sends, or None:
/// at once), and how each cut heals.
const CUTS: [(&str, Option<&str>, Heal); 4] = [
    ("a random moment", None, Heal::Lose),
    (
        "holding the write lock",
        Some("pg_advisory_xact_lock"),
        Heal::Resume,
    ),
    (
        "right after a scheduler commit checked its term",
        Some("for share"),
        Heal::Lose,
    ),
    (
        "inside a group commit of creates",
        Some("insert into batches"),
        Heal::Lose,
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_restarts_and_partitions_heals_cleanly_after_each() {
    let run = Run::start().await;
    START.get_or_init(Instant::now);
    let db = sqlx::PgPool::connect(&run.url).await.expect("db");
    let calls = Arc::new(Mutex::new(Vec::<Call>::new()));
    let stop = CancellationToken::new();
    let endpoints: Vec<String> = run.replicas.iter().map(|r| r.endpoint.clone()).collect();
    let mut tasks = Vec::new();
    for (i, e) in endpoints.iter().enumerate() {
        tasks.push(tokio::spawn(probe(
            i,
            e.clone(),
            calls.clone(),
            stop.clone(),
        )));
    }
    for k in 0..6 {
        tasks.push(tokio::spawn(load(k, endpoints.clone(), stop.clone())));
    }
    let mut excused = Vec::<Excused>::new();
    // How often each replica lost its database: the restart, then its cuts.
    let mut lost = [1usize; 3];
    // Who held the lease, and since when, as the database had it: the
    // holder must say so on /readyz within a second of that.
    let mut recovered = Vec::new();
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 1. The database restarts: every session of every replica ends.
    let restarted = Instant::now();
    for p in &run.proxies {
        p.restart(DOWN);
    }
    sqlx::query(
        "select pg_terminate_backend(pid) from pg_stat_activity \
         where datname = current_database() and pid <> pg_backend_pid()",
    )
    .execute(&db)
    .await
    .expect("terminate the sessions");
    tokio::time::sleep(DOWN).await;
    let healed = Instant::now();
    excused.push(Excused {
        replica: None,
        from: restarted,
        until: healed + LEASE_AND_RENEWAL + SLACK,
    });
    let (took, _) = run
        .all_ready(&db, LEASE_AND_RENEWAL + SLACK, "the database restarted")
        .await;
    recovered.push(("the database restarted".to_string(), took));
    eprintln!(
        "{:?}: the database restarted: all ready after {took:?}",
        at(healed)
    );

    // 2–5. The leader is cut off, each time at another moment.
    for (what, trigger, heal) in CUTS {
        let cut_off = leader(&run.replicas)
            .await
            .expect("a leader before the cut");
        let (old_holder, old_term) = run.lease(&db).await.expect("a live lease");
        assert_eq!(old_holder, run.replicas[cut_off].name);
        let proxy = &run.proxies[cut_off];
        lost[cut_off] += 1;
        let cut = match trigger {
            None => {
                // A random moment: anywhere in a renewal period.
                let jitter = u64::from(uuid::Uuid::new_v4().as_u128() as u16) % 250;
                tokio::time::sleep(Duration::from_millis(jitter)).await;
                proxy.freeze();
                Instant::now()
            }
            Some(sql) => {
                proxy.freeze_after(sql);
                // A cancel of a running cluster, through another replica,
                // gives the leader a decision to commit: the freed GPUs go
                // to the queue.
                let other = &run.replicas[(cut_off + 1) % run.replicas.len()];
                run.cancel_one_allocated(&db, &other.endpoint).await;
                proxy.frozen_within(Duration::from_secs(20)).await
            }
        };
        eprintln!(
            "{:?}: cut off {what}: {}",
            at(cut),
            run.replicas[cut_off].name
        );
        // Another replica takes the lease, and says so on /readyz within
        // a second of the database recording it.
        let (taker, taken) = loop {
            if let Some((holder, term)) = run.lease(&db).await {
                if term > old_term {
                    break (holder, Instant::now());
                }
            }
            assert!(
                cut.elapsed() < CUT,
                "cut off {what}: nobody took the lease during the cut"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let taker = run
            .replicas
            .iter()
            .position(|r| r.name == taker)
            .expect("a replica of the run");
        assert_ne!(
            taker, cut_off,
            "cut off {what}: the lease stayed with the cut-off replica"
        );
        loop {
            let z = run.replicas[taker].readyz().await;
            if z.as_ref().is_some_and(|z| z["role"] == "leader") {
                break;
            }
            assert!(
                taken.elapsed() < Duration::from_secs(1) + Duration::from_millis(250),
                "cut off {what}: {} holds the lease but /readyz says {z:?} a second later",
                run.replicas[taker].name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(CUT.saturating_sub(cut.elapsed())).await;
        match heal {
            Heal::Resume => proxy.thaw(),
            Heal::Lose => proxy.heal_losing_open(),
        }
        let healed = Instant::now();
        excused.push(Excused {
            replica: Some(cut_off),
            from: cut,
            until: healed + LEASE_AND_RENEWAL + SLACK,
        });
        let after = format!("a cut {what} healed");
        let (took, now_leads) = run.all_ready(&db, LEASE_AND_RENEWAL + SLACK, &after).await;
        assert_ne!(
            now_leads, cut_off,
            "{after}: the cut-off replica leads again"
        );
        // The cut-off replica's pools work again: a create and its cancel
        // through it go through.
        let ex = &run.replicas[cut_off];
        let t = Instant::now();
        let id = format!("after-{cut_off}-{}", recovered.len());
        loop {
            if ex.create(&id, &gpu_batch(2, "600s")).await == 200 {
                break;
            }
            // A group commit that went out into the cut waits at most
            // its bound (twice the lease and a renewal), then the next
            // goes through.
            assert!(
                t.elapsed() < WRITE_BOUND + LEASE_AND_RENEWAL,
                "{after}: {} cannot create for {:?}",
                ex.name,
                t.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let served = t.elapsed();
        eprintln!(
            "{:?}: {after}: all ready after {took:?}; {} created again after {served:?}",
            at(healed),
            ex.name
        );
        recovered.push((after, took));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    for t in tasks {
        t.await.expect("a client task");
    }
    eprintln!("recovered: {recovered:?}");

    // A healthy replica's calls never stalled.
    let calls = calls.lock().expect("calls").clone();
    let healthy = |c: &Call| {
        !excused.iter().any(|e| {
            // In flight at any moment of the fault.
            e.replica.is_none_or(|r| r == c.replica)
                && c.began < e.until
                && c.began + c.took > e.from
        })
    };
    let stalled: Vec<&Call> = calls
        .iter()
        .filter(|c| healthy(c))
        .filter(|c| match c.what {
            "create" => c.took > CREATE_BOUND,
            _ => c.took > CANCEL_BOUND,
        })
        .collect();
    let counted = calls.iter().filter(|c| healthy(c)).count();
    eprintln!(
        "{} probe calls, {counted} on healthy replicas; statuses {:?}",
        calls.len(),
        calls
            .iter()
            .map(|c| c.status)
            .collect::<std::collections::BTreeSet<_>>()
    );
    let failed: Vec<&Call> = calls
        .iter()
        .filter(|c| healthy(c) && c.status != 200)
        .collect();
    assert!(
        counted > 20,
        "too few calls on healthy replicas to judge: {counted}"
    );
    assert!(
        failed.is_empty(),
        "a healthy replica's calls failed: {failed:#?}"
    );
    assert!(
        stalled.is_empty(),
        "a healthy replica's calls stalled: {stalled:#?}"
    );

    // Every replica's core agrees with the database: its change stream
    // and its mirror work again after the run.
    let queued: i64 =
        sqlx::query_scalar("select count(*) from batches where provisioning = 0 and state = 1")
            .fetch_one(&db)
            .await
            .expect("queued");
    for r in &run.replicas {
        let t = Instant::now();
        loop {
            let pending = match metrics_text(&r.metrics).await {
                Some(text) => text
                    .lines()
                    .filter(|l| l.starts_with("flexq_pending_batches{"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>(),
                None => -1.0,
            };
            if pending == queued as f64 {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{}'s core counts {pending} queued, the database {queued}",
                r.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Each time a replica had its database back is in its metrics.
    for (r, times) in run.replicas.iter().zip(lost) {
        let text = metrics_text(&r.metrics).await.expect("metrics");
        let back = crate::metrics::value(
            &text,
            "flexq_database_lost_seconds_count",
            &[("seen", "leadership")],
        )
        .unwrap_or(0.0);
        assert!(
            back >= times as f64,
            "{} lost its database {times} times, its metrics say it came back {back} times",
            r.name
        );
    }
    audit(&run.url, L4_QUOTA)
        .await
        .expect("the allocation history is sound");
    db.close().await;
}
