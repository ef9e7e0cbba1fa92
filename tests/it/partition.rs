//! A replica cut off from PostgreSQL in the middle of a write, as a real
//! partition looks: a proxy of the test's own between the leader and the
//! database stops forwarding, both ways, at a chosen moment, and closes
//! nothing. The cut-off session's locks must not stall the healthy
//! replicas for longer than the lease plus one renewal (L + R), another
//! replica must lead within that, the cut-off one must step down during
//! the cut and write nothing once fenced, and after the heal the new
//! leader must hold the leader lock, so that its own crash is again seen
//! at once.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::proxy::FreezingProxy;
use crate::replicas::{
    Replica, audit, config_file, gpu_batch, leader, leads_by_metrics, leads_within,
};
use crate::support::{fresh_postgres_database, metrics_text, open_engine};

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
/// How soon after a SIGKILL another replica must lead when the killed
/// leader held the leader lock: half the default lease. A failover that
/// waits for the lease instead takes 1.75 to 2 s (the lease less the time
/// since the last renewal), so this tells the two apart; failover.rs
/// measures tens of milliseconds (a median bound of 300 ms over several
/// kills), and one kill on a loaded machine gets more room.
const BLINK: Duration = Duration::from_secs(1);
/// The leader lock's key (src/store/leader_lock.rs: "flexq\0\0\2").
const LEADER_LOCK: i64 = 0x666c_6578_7100_0002;

struct Cluster {
    /// The replicas' logs (`r0.log`, ...).
    dir: tempfile::TempDir,
    _database: crate::support::PgDatabase,
    url: String,
    proxy: FreezingProxy,
    /// r0 (through the proxy, the leader), r1, r2.
    r0: Replica,
    others: [Replica; 2],
    http: reqwest::Client,
}

/// The leader lease and the leader lock as PostgreSQL has them.
#[derive(Debug)]
struct Leadership {
    holder: String,
    term: i64,
    /// The lease has not lapsed, on the database's clock.
    live: bool,
    /// The lease row says its holder held the leader lock.
    locked: bool,
    /// The replicas whose sessions the server granted the leader lock, by
    /// their sessions' application name (the replica's name).
    lock_holders: Vec<String>,
}

impl Cluster {
    async fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let database = fresh_postgres_database().await;
        let url = database.url.clone();
        let config = config_file(dir.path());
        let proxy = FreezingProxy::start(&url).await;
        // Each replica names its sessions after itself, so that the
        // server's own tables say which replica holds a lock.
        let r0 = Replica::start(
            "r0",
            &format!("{}&application_name=r0", proxy.url),
            &config,
            dir.path(),
        )
        .await;
        leads_within(&r0, Duration::from_secs(10)).await;
        let others = [
            Replica::start(
                "r1",
                &format!("{url}?application_name=r1"),
                &config,
                dir.path(),
            )
            .await,
            Replica::start(
                "r2",
                &format!("{url}?application_name=r2"),
                &config,
                dir.path(),
            )
            .await,
        ];
        Cluster {
            dir,
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

    /// Who holds the leader lease and the leader lock, read from
    /// PostgreSQL rather than from what the replicas say.
    async fn leadership(&self) -> Leadership {
        let db = sqlx::PgPool::connect(&self.url).await.expect("db");
        let (holder, term, live, locked): (String, i64, bool, bool) = sqlx::query_as(
            "select holder, term, \
             expires_at >= (extract(epoch from clock_timestamp()) * 1000000)::bigint, locked \
             from leader_lease where id = 1",
        )
        .fetch_one(&db)
        .await
        .expect("the lease");
        // pg_locks shows a bigint advisory key split in two: its high half
        // as classid, its low half as objid (objsubid 1).
        let lock_holders: Vec<String> = sqlx::query_scalar(
            "select a.application_name from pg_locks l join pg_stat_activity a on a.pid = l.pid \
             where l.locktype = 'advisory' and l.granted and l.objsubid = 1 \
             and l.database = (select oid from pg_database where datname = current_database()) \
             and ((l.classid::bigint << 32) | l.objid::bigint) = $1 order by 1",
        )
        .bind(LEADER_LOCK)
        .fetch_all(&db)
        .await
        .expect("the leader lock");
        db.close().await;
        Leadership {
            holder,
            term,
            live,
            locked,
            lock_holders,
        }
    }

    /// Until the lease is live and held by `name`, which holds the leader
    /// lock, the row saying so, and no other replica holds it; fails
    /// after `within`.
    async fn leader_lock_held_by(&self, name: &str, within: Duration) -> Leadership {
        let t = Instant::now();
        loop {
            let l = self.leadership().await;
            if l.live && l.holder == name && l.locked && l.lock_holders == [name] {
                return l;
            }
            assert!(
                t.elapsed() < within,
                "{name} does not hold the lease and the leader lock alone: {l:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How long replica `name`'s log is now, in bytes: where what it logs
    /// next begins.
    fn log_len(&self, name: &str) -> usize {
        std::fs::metadata(self.dir.path().join(format!("{name}.log")))
            .map(|m| m.len() as usize)
            .unwrap_or(0)
    }

    /// Replica `name`'s log, from byte `from` on.
    fn log(&self, name: &str, from: usize) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(format!("{name}.log")))
            .unwrap_or_default();
        text.get(from..).unwrap_or_default().to_string()
    }

    /// Until a line of replica `name`'s log past byte `from` is one that
    /// `says`; answers the line. Looks at least once; fails after
    /// `within`, saying `what` never happened.
    async fn logged(
        &self,
        name: &str,
        from: usize,
        within: Duration,
        what: &str,
        says: impl Fn(&str) -> bool,
    ) -> String {
        let t = Instant::now();
        loop {
            let text = self.log(name, from);
            if let Some(line) = text.lines().find(|&l| says(l)) {
                return line.to_string();
            }
            assert!(t.elapsed() < within, "{what}; {name}'s log:\n{text}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Lets the cut that began at `cut` last its whole `CUT`, heals it,
    /// and waits until r0 says on its metrics listener that it no longer
    /// leads; fails after 10 s.
    async fn heal(&self, cut: Instant) {
        tokio::time::sleep(CUT.saturating_sub(cut.elapsed())).await;
        self.proxy.thaw();
        let t = Instant::now();
        while leads_by_metrics(&self.r0.metrics).await != Some(false) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "r0 still leads after the cut"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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
/// takeover each come within L + R, never after the whole cut; the
/// cut-off leader steps down during the cut, fenced by the loss of its
/// leader lock, and is not ready; once the cut heals the old leader is a
/// follower, its cut-off commit came to nothing, nothing was
/// overcommitted, and PostgreSQL has the new leader holding the lease, in
/// a later term, and the leader lock, alone.
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

    // Before the cut r0 leads in its term and holds the leader lock: what
    // the heal must find passed on.
    let r0_term =
        c.r0.readyz()
            .await
            .and_then(|z| z["term"].as_i64())
            .expect("r0 says it leads, in a term");
    let before = c.leader_lock_held_by("r0", Duration::from_secs(5)).await;
    assert_eq!(before.term, r0_term, "r0's term is not the lease's");
    // What r0 logs from the cut on.
    let r0_log = c.log_len("r0");

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

    // Still during the cut (nothing thawed yet), r0 has stepped down on
    // its own: its renewal did not answer on the session that held the
    // leader lock, so another replica may hold the lock already (its
    // fence: it decides nothing more), well before its lease would have
    // told it. Its metrics wait behind the pass its cut-off commit holds,
    // and its /readyz on the database: its log says it.
    let stepped_down = c
        .logged(
            "r0",
            r0_log,
            (LEASE_AND_RENEWAL + SLACK).saturating_sub(cut.elapsed()),
            "r0 did not step down within L + R of the cut",
            |l| l.contains("no longer leading"),
        )
        .await;
    assert!(
        stepped_down.contains("the leadership session was lost"),
        "r0 stepped down, but not for the loss of its leader lock: {stepped_down}"
    );
    // A replica that cannot reach the database is out of service.
    assert!(
        c.r0.readyz().await.is_none(),
        "r0 says it is ready while cut off"
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
    c.heal(cut).await;
    // The pass whose commit was cut off has come back, failed (the server
    // ended its transaction) or refused: whatever r0 would still write is
    // written by now, so the audit sees it.
    c.logged(
        "r0",
        r0_log,
        Duration::from_secs(10),
        "r0's cut-off commit never came back",
        |l| l.contains("cannot commit the scheduler") || l.contains("decisions refused"),
    )
    .await;
    audit(&c.url, L4_QUOTA)
        .await
        .expect("the allocation history is sound");

    // Who leads after the heal, as PostgreSQL has it: the replica that
    // took over, in a later term, holding the leader lock alone (r0's
    // ended with its cut-off session, and it took none back). r0 is
    // ready again and follows it.
    let new = leader(&c.others).await.expect("r1 or r2 still leads");
    let name = c.others[new].name.as_str();
    let after = c.leader_lock_held_by(name, LEASE_AND_RENEWAL + SLACK).await;
    assert!(
        after.term > r0_term,
        "the lease is still in r0's term {r0_term}: {after:?}"
    );
    let t = Instant::now();
    loop {
        let z = c.r0.readyz().await;
        if z.as_ref()
            .is_some_and(|z| z["role"] == "follower" && z["leader"] == name)
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "r0 does not follow {name} after the heal: {z:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_holding_the_write_lock_stalls_nobody_past_the_lease() {
    cut_off_holding("pg_advisory_xact_lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_after_checking_its_term_stalls_nobody_past_the_lease() {
    cut_off_holding("for share").await;
}

/// `flexq_scheduler_leader_takeovers_total{how}` of replica `r`, from its
/// metrics listener; None when it does not answer.
async fn takeovers(r: &Replica, how: &str) -> Option<f64> {
    let text = metrics_text(&r.metrics).await?;
    crate::metrics::value(
        &text,
        "flexq_scheduler_leader_takeovers_total",
        &[("how", how)],
    )
}

/// A leader that took over during a cut holds the leader lock once the
/// cut heals, as a leader elected in calm does: SIGKILL it, and another
/// replica leads within a blink, through the lock, not once its lease
/// lapsed (what a leader that never got the lock would cost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_elected_during_a_cut_is_replaced_in_a_blink_once_the_cut_heals() {
    let mut c = Cluster::start().await;
    // r0 is cut off right after sending a renewal: the server renews its
    // lease, then hears nothing more from it. Its leadership session,
    // and the leader lock with it, lives on the server until the
    // session's idle timeout (one lease).
    c.proxy.freeze_after("update leader_lease");
    let cut = c.proxy.frozen_within(Duration::from_secs(10)).await;
    let first = loop {
        if let Some(i) = leader(&c.others).await {
            break i;
        }
        assert!(
            cut.elapsed() < LEASE_AND_RENEWAL + SLACK,
            "no other replica leads within L + R of the cut"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let name = c.others[first].name.clone();

    // The cut heals: r0 follows, and the new leader holds the lease and
    // the leader lock, alone, as PostgreSQL has it.
    c.heal(cut).await;
    let held = c
        .leader_lock_held_by(&name, LEASE_AND_RENEWAL + SLACK)
        .await;

    // SIGKILL: its session ends with it, and the lock.
    let killed = Instant::now();
    c.others[first].kill9();
    let survivors = [&c.r0, &c.others[1 - first]];
    let (next, took) = 'led: loop {
        for r in survivors {
            if r.readyz().await.is_some_and(|z| z["role"] == "leader") {
                break 'led (r, killed.elapsed());
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "no replica took over from {name}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    eprintln!(
        "{name}, leader since a cut, killed after the heal: {} leads after {took:?}",
        next.name
    );
    assert!(
        took < BLINK,
        "{} led {took:?} after {name} was killed: the lease, not the lock",
        next.name
    );
    // Through the lock (the killed leader's session had ended), in a new
    // term, which PostgreSQL has it holding with the lock.
    let t = Instant::now();
    while takeovers(next, "lock").await.unwrap_or(0.0) < 1.0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{} took over, but not through the leader lock",
            next.name
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = c
        .leader_lock_held_by(&next.name, LEASE_AND_RENEWAL + SLACK)
        .await;
    assert!(after.term > held.term, "{after:?} after {held:?}");
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
    // The others go once the retry waits on the cut-off create's lock
    // (its session shows waiting on an advisory lock), not before.
    {
        let db = sqlx::PgPool::connect(&c.url).await.expect("db");
        let t = Instant::now();
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "select count(*) from pg_stat_activity where datname = current_database() \
                 and wait_event_type = 'Lock' and wait_event = 'advisory'",
            )
            .fetch_one(&db)
            .await
            .expect("waiting sessions");
            if waiting > 0 {
                break;
            }
            assert!(
                t.elapsed() < LEASE_AND_RENEWAL + SLACK,
                "the retry never waited on the cut-off create's lock"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        db.close().await;
    }
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

/// The bounds that keep a cut within L + R, read back from PostgreSQL on
/// the sessions a replica opens (its store opened as the server opens
/// it), not trusted from the URL that asked for them: a frozen
/// transaction ends L after its last statement, a peer that stopped
/// acknowledging is given up after 2L, a lock is waited for at most
/// L + R on the pool and R on the leadership's sessions, and the
/// leadership session, idle for L, ends (freeing the leader lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_session_a_replica_opens_is_bounded_by_the_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    let database = fresh_postgres_database().await;
    let mut config = flexq::config::Config::load_without_env(None).expect("config");
    config.database.data_dir = dir.path().join("data");
    config.database.url = Some(database.url.clone());
    let (lease, renew) = (config.database.leader_lease, config.database.leader_renew);
    assert_eq!(
        lease + renew,
        LEASE_AND_RENEWAL,
        "the default config's lease and renewal"
    );
    let (engine, shutdown) = open_engine(&config).await;
    let store = engine.store();
    let names = [
        "idle_in_transaction_session_timeout",
        "lock_timeout",
        "tcp_user_timeout",
    ];
    // In milliseconds, as PostgreSQL reports them.
    let bounds = |lock: Duration| {
        [(names[0], lease), (names[1], lock), (names[2], 2 * lease)]
            .map(|(name, d)| (name.to_string(), d.as_millis().to_string()))
            .to_vec()
    };
    // As many at once as each pool holds: each reads its own session.
    let pool = config.database.max_connections.max(2) as usize;
    let all =
        futures_util::future::join_all((0..pool).map(|_| store.session_settings(&names))).await;
    for s in all {
        let s = s.expect("read a pool session's settings");
        assert_eq!(s, bounds(lease + renew), "a pool session");
    }
    let all =
        futures_util::future::join_all((0..2).map(|_| store.lease_session_settings(&names))).await;
    for s in all {
        let s = s.expect("read a lease session's settings");
        assert_eq!(s, bounds(renew), "a session that reads the lease");
    }
    let mut leadership = store.leader_session().await.expect("a leadership session");
    let s = leadership
        .session_settings(&names)
        .await
        .expect("read the leadership session's settings");
    assert_eq!(s, bounds(renew), "the leadership session");
    let s = leadership
        .session_settings(&["server_version_num", "idle_session_timeout"])
        .await
        .expect("read the leadership session's idle timeout");
    // The setting is PostgreSQL 14's (on 13 the keepalives end the session).
    if s[0].1.parse::<i64>().expect("a version number") >= 140_000 {
        assert_eq!(s[1].1, lease.as_millis().to_string(), "{s:?}");
    }
    leadership.close().await;
    shutdown.cancel();
}
