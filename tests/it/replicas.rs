//! Several `flexq serve` replicas on one real PostgreSQL: failover under
//! load with the leader killed again and again, and the fencing of a
//! leader that was paused while another took over.
//!
//! Both audit the allocation history in the database (every part ever
//! allocated, with when it was released), not just the end state.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flexq::config::Config;
use flexq::scheduler::{Decision, Scheduler};
use flexq::spec::ClusterRequest;
use flexq::store::{NewBatch, Store, StoreError, StoreOptions};
use rand::Rng;
use serde_json::{Value, json};
use sqlx::Row;

use crate::support::{flex_with, flexq_bin, fresh_postgres_database};

mod failover;

/// The node shape of the test pool (the default config's us-central1-a L4).
const GPUS_PER_NODE: usize = 4;
const CORES: i64 = 48;
const MEMORY_MB: i64 = 196_608;
const SSD_GB: i64 = 1500;
/// The test's preemptible L4 quota of project demo, below the capacity so
/// that the quota pool, not only the nodes, is contended.
const QUOTA: i64 = 10;

/// A batch of 1 + `executors` L4 GPUs that waits at most `timeout`.
pub(crate) fn gpu_batch(executors: u32, timeout: &str) -> Value {
    let mut b = flex_with("spark.executor.instances", &executors.to_string());
    for part in ["driver", "executor"] {
        b["runtimeConfig"]["properties"]
            [format!("spark.dataproc.{part}.provisioning.allocationTimeout")] = json!(timeout);
    }
    b
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// One `flexq serve` replica process.
pub(crate) struct Replica {
    pub(crate) name: String,
    child: Child,
    pub(crate) endpoint: String,
    /// Its metrics listener (answers without the database).
    pub(crate) metrics: String,
}

impl Replica {
    pub(crate) async fn start(name: &str, url: &str, config: &Path, logs: &Path) -> Replica {
        let (port, metrics_port) = (free_port(), free_port());
        let log = std::fs::File::create(logs.join(format!("{name}.log"))).expect("log");
        let child = Command::new(flexq_bin())
            .args(["serve", "--config"])
            .arg(config)
            .env("FLEXQ_DATABASE__URL", url)
            .env("FLEXQ_DATABASE__REPLICA_ID", name)
            .env("FLEXQ_SERVER__BIND", format!("127.0.0.1:{port}"))
            .env(
                "FLEXQ_SERVER__METRICS_BIND",
                format!("127.0.0.1:{metrics_port}"),
            )
            .env("FLEXQ_LIMITS__MUTATIONS_PER_MINUTE", "1000000")
            .env("FLEXQ_LIMITS__READS_PER_MINUTE", "1000000")
            .env("FLEXQ_LOG__FILTER", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn flexq serve");
        let replica = Replica {
            name: name.to_string(),
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            metrics: format!("http://127.0.0.1:{metrics_port}"),
        };
        // Ready when it answers as itself: a port taken meanwhile by
        // another test's server answers with another replica id.
        let t = Instant::now();
        while replica.readyz().await.is_none_or(|z| z["replica"] != name) {
            assert!(t.elapsed() < Duration::from_secs(30), "{name} never ready");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        replica
    }

    /// Creates batch `id` of demo in us-central1 through this replica;
    /// answers the HTTP status.
    pub(crate) async fn create(&self, id: &str, body: &Value) -> u16 {
        reqwest::Client::new()
            .post(format!(
                "{}/v1/projects/demo/locations/us-central1/batches?batchId={id}",
                self.endpoint
            ))
            .json(body)
            .send()
            .await
            .expect("create")
            .status()
            .as_u16()
    }

    pub(crate) async fn readyz(&self) -> Option<Value> {
        let r = reqwest::Client::new()
            .get(format!("{}/readyz", self.endpoint))
            .timeout(Duration::from_millis(500))
            .send()
            .await
            .ok()?;
        r.status().is_success().then_some(())?;
        r.json().await.ok()
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Waits until `r` says it leads; fails after `within`.
pub(crate) async fn leads_within(r: &Replica, within: Duration) {
    let t = Instant::now();
    while leader(std::slice::from_ref(r)).await.is_none() {
        assert!(t.elapsed() < within, "{} never leads", r.name);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two replicas on a fresh database, with `config`: `r0` leading, then
/// `r1` following. The database and the directory live as long as
/// `guards`: bind it to a name (`guards: _guards`), since `..` or `_`
/// would drop them at once.
pub(crate) struct Pair {
    pub(crate) leader: Replica,
    pub(crate) follower: Replica,
    pub(crate) guards: (crate::support::PgDatabase, tempfile::TempDir),
}

pub(crate) async fn leader_and_follower(config: impl FnOnce(&Path) -> PathBuf) -> Pair {
    let dir = tempfile::tempdir().expect("tempdir");
    let database = fresh_postgres_database().await;
    let url = database.url.clone();
    let config = config(dir.path());
    let leader = Replica::start("r0", &url, &config, dir.path()).await;
    leads_within(&leader, Duration::from_secs(10)).await;
    let follower = Replica::start("r1", &url, &config, dir.path()).await;
    Pair {
        leader,
        follower,
        guards: (database, dir),
    }
}

/// The replica among `replicas` that says it leads, if one does.
pub(crate) async fn leader(replicas: &[Replica]) -> Option<usize> {
    for (i, r) in replicas.iter().enumerate() {
        if r.readyz().await.is_some_and(|z| z["role"] == "leader") {
            return Some(i);
        }
    }
    None
}

/// Four virtual L4 nodes (16 GPUs) in us-central1-a and nothing else.
pub(crate) fn config_file(dir: &Path) -> PathBuf {
    let path = dir.join("replicas.toml");
    let config = Config::load_without_env(None).expect("default config");
    std::fs::write(&path, config.virtual_nodes_only("us-central1-a", "l4", 4)).expect("config");
    path
}

/// Checks the whole allocation history: no GPU given twice at once, no
/// node's cores, memory or local SSD over its size, a project's GPUs
/// never over `quota`, every cluster whole (one driver and exactly the
/// executors its stored request asks, per attempt: an attempt's parts are
/// allocated in one transaction, at one instant), and none allocated
/// after its deadline. Returns the number of clusters ever allocated.
pub(crate) async fn audit(url: &str, quota: i64) -> Result<usize, String> {
    let db = sqlx::PgPool::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let rows = sqlx::query(
        "select a.batch_seq, a.node_id, a.role, a.gpus, a.cores, a.memory_mb, a.local_ssd_gb, \
         a.allocated_at, a.released_at, b.project, b.deadline, b.allocate_time, b.cluster \
         from allocations a join batches b on b.seq = a.batch_seq order by a.id",
    )
    .fetch_all(&db)
    .await
    .map_err(|e| e.to_string())?;
    // (time, +1 start / -1 end, what): ends sort before starts at the same
    // microsecond (half-open intervals).
    let mut events: Vec<(i64, i64, String, [i64; 4])> = Vec::new();
    // (batch, allocated at) → (drivers, executors, executors asked)
    let mut parts: BTreeMap<(i64, i64), (usize, usize, u32)> = BTreeMap::new();
    for r in &rows {
        let seq: i64 = r.get("batch_seq");
        let node: String = r.get("node_id");
        let gpus: Vec<String> = serde_json::from_str(r.get::<&str, _>("gpus")).expect("gpus");
        let start: i64 = r.get("allocated_at");
        let end: i64 = r.get::<Option<i64>, _>("released_at").unwrap_or(i64::MAX);
        if let (Some(deadline), Some(at)) = (
            r.get::<Option<i64>, _>("deadline"),
            r.get::<Option<i64>, _>("allocate_time"),
        ) {
            if at >= deadline {
                return Err(format!(
                    "batch {seq} allocated at {at}, at or after its deadline {deadline}"
                ));
            }
        }
        let cluster: ClusterRequest = serde_json::from_str(r.get::<&str, _>("cluster"))
            .map_err(|e| format!("batch {seq}: its stored cluster request does not read: {e}"))?;
        let p = parts
            .entry((seq, start))
            .or_insert((0, 0, cluster.executor_count));
        match r.get::<&str, _>("role") {
            "driver" => p.0 += 1,
            "executor" => p.1 += 1,
            role => return Err(format!("batch {seq}: a part with role {role:?}")),
        }
        let amounts = [
            gpus.len() as i64,
            r.get("cores"),
            r.get("memory_mb"),
            r.get("local_ssd_gb"),
        ];
        for gpu in &gpus {
            events.push((start, 1, format!("gpu {node}/{gpu}"), [1, 0, 0, 0]));
            events.push((end, -1, format!("gpu {node}/{gpu}"), [1, 0, 0, 0]));
        }
        events.push((start, 1, format!("node {node}"), amounts));
        events.push((end, -1, format!("node {node}"), amounts));
        let project: String = r.get("project");
        let pool = format!("quota {project}");
        events.push((start, 1, pool.clone(), [gpus.len() as i64, 0, 0, 0]));
        events.push((end, -1, pool, [gpus.len() as i64, 0, 0, 0]));
    }
    for ((seq, at), (drivers, executors, wanted)) in &parts {
        if *drivers != 1 || *executors != *wanted as usize {
            return Err(format!(
                "batch {seq}, allocated at {at}: {drivers} drivers and {executors} executors, {wanted} executors asked"
            ));
        }
    }
    events.sort_by_key(|e| (e.0, e.1));
    let mut held: HashMap<String, [i64; 4]> = HashMap::new();
    for (t, sign, what, amounts) in events {
        let h = held.entry(what.clone()).or_default();
        for (total, a) in h.iter_mut().zip(amounts) {
            *total += sign * a;
        }
        let limits: [i64; 4] = if what.starts_with("gpu ") {
            [1, 0, 0, 0]
        } else if what.starts_with("node ") {
            [GPUS_PER_NODE as i64, CORES, MEMORY_MB, SSD_GB]
        } else {
            [quota, i64::MAX, i64::MAX, i64::MAX]
        };
        if h.iter().zip(limits).any(|(used, limit)| *used > limit) {
            return Err(format!(
                "overcommitted at {t}: {what} holds {h:?}, limits {limits:?}"
            ));
        }
    }
    db.close().await;
    Ok(parts.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_again_and_again_loses_nothing_and_overcommits_nothing() {
    let mut dir = tempfile::tempdir().expect("tempdir");
    if std::env::var_os("FLEXQ_TEST_KEEP_FAILED").is_some() {
        // For a failure's post-mortem: the replicas' logs stay.
        dir.disable_cleanup(true);
        eprintln!("replica logs in {}", dir.path().display());
    }
    let database = fresh_postgres_database().await;
    let url = database.url.clone();
    let config = config_file(dir.path());
    let mut replicas = Vec::new();
    for i in 0..3 {
        replicas.push(Replica::start(&format!("r{i}"), &url, &config, dir.path()).await);
    }
    let t = Instant::now();
    while leader(&replicas).await.is_none() {
        assert!(t.elapsed() < Duration::from_secs(10), "no replica leads");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let quota = http
        .patch(format!(
            "{}/v1/projects/demo/regions/us-central1/quotas",
            replicas[1].endpoint
        ))
        .json(&json!({"metric": "PREEMPTIBLE_NVIDIA_L4_GPUS", "limit": QUOTA}))
        .send()
        .await
        .expect("patch quota");
    assert_eq!(quota.status(), 200);

    // Submits through random replicas, each retried with its requestId on
    // another replica until one answers; cancels of random batches through
    // random replicas give capacity back (churn).
    let endpoints = Arc::new(Mutex::new(
        replicas
            .iter()
            .map(|r| r.endpoint.clone())
            .collect::<Vec<_>>(),
    ));
    let acked = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let sent = Arc::new(Mutex::new(HashSet::<String>::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let pick = |endpoints: &Arc<Mutex<Vec<String>>>| {
        let e = endpoints.lock().expect("endpoints");
        e[rand::rng().random_range(0..e.len())].clone()
    };
    let submitter = {
        let (http, endpoints, acked, sent, stop) = (
            http.clone(),
            endpoints.clone(),
            acked.clone(),
            sent.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.is_cancelled() {
                n += 1;
                let id = format!("load-{n:05}");
                let request_id = uuid::Uuid::new_v4().to_string();
                let (executors, timeout) = {
                    let mut rng = rand::rng();
                    (
                        rng.random_range(2..=4),
                        ["3s", "5s", "20s"][rng.random_range(0..3)],
                    )
                };
                let body = gpu_batch(executors, timeout);
                sent.lock().expect("sent").insert(id.clone());
                for _ in 0..20 {
                    let r = http
                        .post(format!(
                            "{}/v1/projects/demo/locations/us-central1/batches?batchId={id}&requestId={request_id}",
                            pick(&endpoints)
                        ))
                        .json(&body)
                        .send()
                        .await;
                    if let Ok(r) = r {
                        if r.status() == 200 {
                            let op: Value = r.json().await.expect("operation");
                            let name = op["name"].as_str().expect("operation name").to_string();
                            acked.lock().expect("acked").push((id.clone(), name));
                            break;
                        }
                        let status = r.status();
                        if !status.is_server_error() {
                            panic!(
                                "create {id}: {status} {}",
                                r.text().await.unwrap_or_default()
                            );
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        })
    };
    // Users cancel allocated batches (virtual nodes never finish work):
    // capacity comes back and the queue moves.
    let churn = {
        let (http, endpoints, stop) = (http.clone(), endpoints.clone(), stop.clone());
        let db = sqlx::PgPool::connect(&url).await.expect("db");
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let held: Vec<String> = sqlx::query_scalar(
                    "select operation_id from batches where provisioning = 1 and state = 1",
                )
                .fetch_all(&db)
                .await
                .unwrap_or_default();
                if held.is_empty() {
                    continue;
                }
                let op = &held[rand::rng().random_range(0..held.len())];
                let _ = http
                    .post(format!(
                        "{}/v1/projects/demo/regions/us-central1/operations/{op}:cancel",
                        pick(&endpoints)
                    ))
                    .send()
                    .await;
            }
        })
    };

    let mut failovers = Vec::new();
    let mut last_kill = Instant::now();
    for round in 0..3 {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let old = leader(&replicas).await.expect("a leader before the kill");
        let name = replicas[old].name.clone();
        replicas[old].kill9();
        last_kill = Instant::now();
        let killed = Instant::now();
        let took = loop {
            let others: Vec<&Replica> = replicas
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != old)
                .map(|(_, r)| r)
                .collect();
            let mut led = false;
            for r in others {
                led |= r.readyz().await.is_some_and(|z| z["role"] == "leader");
            }
            if led {
                break killed.elapsed();
            }
            assert!(
                killed.elapsed() < Duration::from_secs(10),
                "round {round}: no replica took over"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        failovers.push(took);
        // Back as a new replica, so three serve again.
        let fresh = Replica::start(&format!("{name}-{round}"), &url, &config, dir.path()).await;
        endpoints.lock().expect("endpoints")[old] = fresh.endpoint.clone();
        replicas[old] = fresh;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.cancel();
    submitter.await.expect("submitter");
    churn.await.expect("churn");
    eprintln!("failovers: {failovers:?}");
    for (i, took) in failovers.iter().enumerate() {
        assert!(*took < Duration::from_secs(3), "failover {i} took {took:?}");
    }

    // Every acknowledged batch exactly once, and nothing that was not sent.
    let db = sqlx::PgPool::connect(&url).await.expect("db");
    let stored: Vec<(String, i64)> =
        sqlx::query_as("select batch_id, count(*) from batches group by batch_id")
            .fetch_all(&db)
            .await
            .expect("ids");
    let stored: HashMap<String, i64> = stored.into_iter().collect();
    let acked = acked.lock().expect("acked").clone();
    assert!(
        acked.len() > 50,
        "too little load: {} acknowledged",
        acked.len()
    );
    for (id, _) in &acked {
        assert_eq!(stored.get(id), Some(&1), "acknowledged batch {id}");
    }
    let sent = sent.lock().expect("sent").clone();
    for id in stored.keys() {
        assert!(sent.contains(id), "stored but never sent: {id}");
    }
    // The scheduler went on after the last failover: allocations and
    // expiries after it, and no queued batch left past its deadline.
    let since_kill = last_kill.elapsed().as_micros() as i64;
    let after: i64 = sqlx::query_scalar(
        "select count(*) from batches where allocate_time > (extract(epoch from now()) * 1000000)::bigint - $1",
    )
    .bind(since_kill)
    .fetch_one(&db)
    .await
    .expect("after");
    assert!(after > 0, "nothing allocated after the last failover");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let overdue: i64 = sqlx::query_scalar(
        "select count(*) from batches where state = 1 and provisioning = 0 \
         and deadline < (extract(epoch from now()) * 1000000)::bigint - 1000000",
    )
    .fetch_one(&db)
    .await
    .expect("overdue");
    assert_eq!(overdue, 0, "queued batches left past their deadline");
    let expired: i64 = sqlx::query_scalar("select count(*) from batches where provisioning = 2")
        .fetch_one(&db)
        .await
        .expect("expired");
    assert!(expired > 0, "no batch expired: the load did not contend");
    let terms: i64 = sqlx::query_scalar("select count(*) from leader_terms")
        .fetch_one(&db)
        .await
        .expect("terms");
    assert!(terms >= 4, "{terms} terms for 3 failovers");
    let clusters = audit(&url, QUOTA).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(clusters > 10, "only {clusters} clusters allocated");

    // Negative control: one executor's row gone, the audit sees a cluster
    // that is not whole.
    sqlx::query(
        "delete from allocations where id = \
         (select min(id) from allocations where role = 'executor')",
    )
    .execute(&db)
    .await
    .expect("delete a part");
    let e = audit(&url, QUOTA)
        .await
        .expect_err("a cluster short of an executor must be seen");
    assert!(e.contains("executors asked"), "{e}");
}

/// A whole-node batch of project demo, as the API would store it.
fn new_batch(config: &Config, id: &str, request_id: Option<&str>) -> NewBatch {
    let batch: flexq::api::Batch = serde_json::from_value(gpu_batch(3, "3600s")).expect("batch");
    let cluster =
        flexq::spec::validate(&batch, "demo", "us-central1", &config.policy()).expect("valid");
    NewBatch {
        name: flexq::api::BatchName {
            project: "demo".into(),
            region: "us-central1".into(),
            batch_id: id.into(),
        },
        uuid: uuid::Uuid::now_v7(),
        operation_id: uuid::Uuid::now_v7(),
        request_id: request_id.map(str::to_string),
        creator: "test".into(),
        spec: batch,
        cluster,
        priority: 0,
        state_message: "Queued.".into(),
    }
}

/// Creates on PostgreSQL do not take the write lock: the same batch id or
/// requestId sent to two replicas at the same instant must still give one
/// batch (the others answered ALREADY_EXISTS, or the same batch again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_create_through_two_replicas_at_once_gives_one_batch() {
    let database = fresh_postgres_database().await;
    let url = database.url.clone();
    let config = Config::load_without_env(None).expect("config");
    let options = StoreOptions {
        url: url.clone(),
        max_connections: 8,
        group_commit_max: 64,
        limits: Default::default(),
        observe_group: None,
    };
    let stores = [
        Store::open(&options).await.expect("a"),
        Store::open(&options).await.expect("b"),
    ];
    for round in 0..50 {
        let id = format!("race-{round:02}");
        let request = format!("req-{round}");
        let with_request = (0..8)
            .map(|i| stores[i % 2].create(new_batch(&config, &format!("{id}-r"), Some(&request))));
        let without = (0..8).map(|i| stores[i % 2].create(new_batch(&config, &id, None)));
        let (replayed, plain) = tokio::join!(
            futures_util::future::join_all(with_request),
            futures_util::future::join_all(without)
        );
        let uuids: HashSet<String> = replayed
            .into_iter()
            .map(|r| {
                r.expect("a requestId retry is answered")
                    .record()
                    .uuid
                    .clone()
            })
            .collect();
        assert_eq!(uuids.len(), 1, "round {round}: one batch per requestId");
        let created = plain.iter().filter(|r| r.is_ok()).count();
        assert_eq!(created, 1, "round {round}: {plain:?}");
        assert!(
            plain
                .iter()
                .filter_map(|r| r.as_ref().err())
                .all(|e| matches!(e, StoreError::AlreadyExists(_))),
            "round {round}: {plain:?}"
        );
    }
    let db = sqlx::PgPool::connect(&url).await.expect("db");
    let n: i64 = sqlx::query_scalar("select count(*) from batches")
        .fetch_one(&db)
        .await
        .expect("count");
    assert_eq!(n, 100);
}

/// Two stores on one database, as two replicas: `a` led in term 1, was
/// paused past its lease, and `b` took over. Each decides from its own
/// view: `a` still sees batch X waiting, `b` sees Y; both want the whole
/// node. Committed at the same time, only the current term's decision is
/// written — and without the fence, the stale one would double-allocate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_cannot_commit_after_another_took_over() {
    let database = fresh_postgres_database().await;
    let url = database.url.clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::load_without_env(Some(&config_file(dir.path()))).expect("config");
    // One node of 4 GPUs.
    config
        .regions
        .get_mut("us-central1")
        .and_then(|r| r.zones.get_mut("us-central1-a"))
        .and_then(|z| z.node_pools.get_mut("l4"))
        .expect("pool")
        .virtual_nodes = 1;
    config.database.url = Some(url.clone());
    let options = StoreOptions {
        url: url.clone(),
        max_connections: 4,
        group_commit_max: 16,
        limits: Default::default(),
        observe_group: None,
    };
    let (a, b) = (
        Store::open(&options).await.expect("a"),
        Store::open(&options).await.expect("b"),
    );
    for id in ["whole-x", "whole-y"] {
        a.create(new_batch(&config, id, None))
            .await
            .expect("create");
    }
    let queued = a.queued_batches(..).await.expect("queued");
    assert_eq!(queued.len(), 2);
    let core = |batch: flexq::scheduler::PendingBatch| {
        let mut core = Scheduler::new(config.pool_decls(), config.quotas.clone());
        for node in config.virtual_nodes() {
            core.add_node(node);
        }
        core.submit(batch);
        core
    };
    let (mut core_a, mut core_b) = (core(queued[0].clone()), core(queued[1].clone()));

    let short = Duration::from_millis(300);
    let term_a = a
        .lead("a", None, short)
        .await
        .expect("lead")
        .expect("a leads");
    assert_eq!(
        b.lead("b", None, short).await.expect("lead"),
        None,
        "a's lease is live"
    );
    tokio::time::sleep(Duration::from_millis(400)).await; // a is paused
    let term_b = b
        .lead("b", None, Duration::from_secs(30))
        .await
        .expect("lead")
        .expect("b takes over");
    assert!(term_b > term_a);

    let now = chrono::Utc::now();
    let (da, db) = (core_a.pass(now), core_b.pass(now));
    let allocates = |d: &[Decision]| {
        d.iter()
            .filter(|d| matches!(d, Decision::Allocate(_)))
            .count()
    };
    assert_eq!(
        (allocates(&da), allocates(&db)),
        (1, 1),
        "both want the node"
    );
    let (ra, rb) = tokio::join!(
        a.commit_decisions(&da, now, Some(term_a)),
        b.commit_decisions(&db, now, Some(term_b)),
    );
    assert!(
        matches!(ra, Err(StoreError::Fenced(_))),
        "the stale leader committed: {ra:?}"
    );
    assert_eq!(rb.expect("the leader commits"), vec![true]);
    assert_eq!(audit(&url, QUOTA).await, Ok(1));

    // The same stale commit without its fence: the audit sees the node
    // given twice (what fencing prevents, and proof the audit can fail).
    a.commit_decisions(&da, now, None).await.expect("unfenced");
    let e = audit(&url, QUOTA)
        .await
        .expect_err("double allocation must be seen");
    assert!(e.contains("overcommitted"), "{e}");
}

/// A TCP proxy to PostgreSQL that the test can cut, as a network partition
/// (or a database failover) looks to the replica behind it: while cut,
/// every connection it carried is closed and new ones are dropped.
struct Proxy {
    url: String,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Proxy {
    async fn start(db_url: &str) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (cut, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if *watch.borrow() {
                    continue; // dropped: refused
                }
                let mut watch = watch.clone();
                tokio::spawn(async move {
                    let Ok(mut upstream) = tokio::net::TcpStream::connect("127.0.0.1:5432").await
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                        _ = watch.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        let url = db_url.replacen("127.0.0.1:5432", &format!("127.0.0.1:{port}"), 1);
        assert_ne!(
            url, db_url,
            "the test PostgreSQL is expected on 127.0.0.1:5432"
        );
        Proxy { url, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

/// `flexq_scheduler_leader` of a replica, from its metrics listener (which
/// answers without the database).
pub(crate) async fn leads_by_metrics(metrics: &str) -> Option<bool> {
    let text = reqwest::Client::new()
        .get(format!("{metrics}/metrics"))
        .timeout(Duration::from_secs(1))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let line = text
        .lines()
        .find(|l| l.starts_with("flexq_scheduler_leader{"))?;
    Some(line.ends_with(" 1"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_database_is_replaced_and_comes_back_as_a_follower() {
    let dir = tempfile::tempdir().expect("tempdir");
    let database = fresh_postgres_database().await;
    let url = database.url.clone();
    let config = config_file(dir.path());
    let proxy = Proxy::start(&url).await;
    let r0 = Replica::start("r0", &proxy.url, &config, dir.path()).await;
    leads_within(&r0, Duration::from_secs(10)).await;
    let others = [
        Replica::start("r1", &url, &config, dir.path()).await,
        Replica::start("r2", &url, &config, dir.path()).await,
    ];
    let http = reqwest::Client::new();
    let create = |endpoint: &str, id: &str| {
        http.post(format!(
            "{endpoint}/v1/projects/demo/locations/us-central1/batches?batchId={id}"
        ))
        .json(&gpu_batch(3, "600s"))
        .send()
    };
    // Four whole-node batches fill the four nodes; a fifth waits.
    for i in 0..5 {
        let r = create(&r0.endpoint, &format!("before-{i}"))
            .await
            .expect("create");
        assert_eq!(r.status(), 200);
    }

    proxy.set_cut(true);
    let cut = Instant::now();
    let (took, stepped_down) = {
        let (mut took, mut stepped_down) = (None, None);
        while took.is_none() || stepped_down.is_none() {
            if took.is_none() && leader(&others).await.is_some() {
                took = Some(cut.elapsed());
            }
            if stepped_down.is_none() && leads_by_metrics(&r0.metrics).await == Some(false) {
                stepped_down = Some(cut.elapsed());
            }
            assert!(
                cut.elapsed() < Duration::from_secs(10),
                "after the cut: taken over {took:?}, stepped down {stepped_down:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (took.expect("took"), stepped_down.expect("stepped down"))
    };
    eprintln!(
        "cut off: another leads after {took:?}, the old leader stepped down after {stepped_down:?}"
    );
    assert!(took < Duration::from_secs(3), "failover took {took:?}");

    // The new leader decides: cancel an allocated batch through a follower
    // and the waiting one gets its node.
    let db = sqlx::PgPool::connect(&url).await.expect("db");
    let held: String = sqlx::query_scalar(
        "select operation_id from batches where provisioning = 1 order by seq limit 1",
    )
    .fetch_one(&db)
    .await
    .expect("an allocated batch");
    let cancel = http
        .post(format!(
            "{}/v1/projects/demo/regions/us-central1/operations/{held}:cancel",
            others[1].endpoint
        ))
        .send()
        .await
        .expect("cancel");
    assert_eq!(cancel.status(), 200);
    let t = Instant::now();
    loop {
        let queued: i64 =
            sqlx::query_scalar("select count(*) from batches where provisioning = 0 and state = 1")
                .fetch_one(&db)
                .await
                .expect("queued");
        if queued == 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the waiting batch was not allocated"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Back on the network, the old leader follows.
    proxy.set_cut(false);
    let t = Instant::now();
    loop {
        if let Some(z) = r0.readyz().await {
            assert_eq!(z["role"], "follower", "{z}");
            assert_ne!(z["leader"], "r0", "{z}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "r0 never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = create(&r0.endpoint, "after").await.expect("create");
    assert_eq!(r.status(), 200, "the old leader takes submits again");

    // A clean stop (SIGTERM) gives the lease up: no wait for it to lapse.
    let mut all = vec![r0];
    all.extend(others);
    let old = leader(&all).await.expect("a leader");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(all[old].child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let stopped = Instant::now();
    let old = all.remove(old);
    while leader(&all).await.is_none() {
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "no replica leads after the leader stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let handover = stopped.elapsed();
    eprintln!("handover after SIGTERM: {handover:?}");
    drop(old);
    assert!(
        handover < Duration::from_millis(1500),
        "a clean stop handed over in {handover:?}, as slow as a lapse"
    );
    // The default config's preemptible L4 quota: 24 per project.
    assert_eq!(audit(&url, 24).await.map(|n| n >= 5), Ok(true));
}

/// The Kubernetes manifest runs three replicas whose configuration flexq
/// accepts, probes them over gRPC health, reads the database URL from a
/// Secret and names each replica after its pod; the bad lease setting of
/// a config is refused by name.
#[test]
fn the_kubernetes_manifest_runs_three_replicas_with_a_valid_config() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/flexq.yaml");
    let text = std::fs::read_to_string(&path).expect("manifest");
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("yaml document"))
        .collect();
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k)
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let deployment = kind("Deployment");
    assert_eq!(deployment["spec"]["replicas"], 3);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    // gRPC probes on the API port, the readiness one on the API service
    // (which follows /readyz; tests/it/grpc.rs checks the answers).
    let port = &container["ports"][0]["containerPort"];
    assert_eq!(port, 8080);
    assert_eq!(&container["readinessProbe"]["grpc"]["port"], port);
    assert_eq!(
        container["readinessProbe"]["grpc"]["service"],
        "google.cloud.dataproc.v1.BatchController"
    );
    assert_eq!(&container["livenessProbe"]["grpc"]["port"], port);
    let env: Vec<&str> = container["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(env.contains(&"FLEXQ_DATABASE__URL") && env.contains(&"FLEXQ_DATABASE__REPLICA_ID"));
    assert_eq!(kind("PodDisruptionBudget")["spec"]["minAvailable"], 2);

    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("flexq.toml");
    std::fs::write(
        &config,
        kind("ConfigMap")["data"]["flexq.toml"]
            .as_str()
            .expect("flexq.toml"),
    )
    .expect("write");
    let check = |lease: Option<&str>| {
        let mut cmd = Command::new(flexq_bin());
        cmd.args(["config", "check", "--config"]).arg(&config).env(
            "FLEXQ_DATABASE__URL",
            "postgres://flexq@db.example:5432/flexq",
        );
        if let Some(lease) = lease {
            cmd.env("FLEXQ_DATABASE__LEADER_LEASE", lease);
        }
        cmd.output().expect("flexq config check")
    };
    let ok = check(None);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let bad = check(Some("500ms"));
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("database.leader_renew"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// The GPU-seconds counter over two replicas: a cancel served by the
/// follower releases the cluster; the leader, whose core sees every
/// release, counts it once, the follower not at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_counted_once_across_replicas() {
    let Pair {
        leader: r0,
        follower: r1,
        guards: _guards,
    } = leader_and_follower(config_file).await;
    let http = reqwest::Client::new();
    let batch = format!(
        "{}/v1/projects/demo/locations/us-central1/batches/counted-once",
        r1.endpoint
    );
    assert_eq!(r1.create("counted-once", &gpu_batch(2, "600s")).await, 200);
    let get = || async {
        http.get(&batch)
            .send()
            .await
            .expect("get")
            .json::<Value>()
            .await
            .expect("json")
    };
    let t = Instant::now();
    while get().await["flexq"]["provisioningState"] != "PROVISIONED" {
        assert!(t.elapsed() < Duration::from_secs(20), "never allocated");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let operation = get().await["operation"]
        .as_str()
        .expect("operation")
        .to_string();
    let r = http
        .post(format!("{}/v1/{operation}:cancel", r1.endpoint))
        .send()
        .await
        .expect("cancel");
    assert_eq!(r.status(), 200);
    let ended = get().await;
    assert_eq!(ended["state"], "CANCELLED", "{ended:#}");
    let used: f64 = ended["runtimeInfo"]["approximateUsage"]["milliAcceleratorSeconds"]
        .as_str()
        .expect("usage")
        .parse::<f64>()
        .expect("number")
        / 1000.0;
    let counted = |metrics: String| {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("flexq_project_gpu_seconds_total{") && l.contains(r#"project="demo""#)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let scrape = |r: &Replica| {
        let url = format!("{}/metrics", r.metrics);
        async move {
            reqwest::get(url)
                .await
                .expect("scrape")
                .text()
                .await
                .expect("text")
        }
    };
    // The leader hears the follower's release within its change stream.
    let t = Instant::now();
    let mut on_leader = 0.0;
    while on_leader == 0.0 && t.elapsed() < Duration::from_secs(10) {
        on_leader = counted(scrape(&r0).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let on_follower = counted(scrape(&r1).await);
    assert_eq!(on_follower, 0.0, "a follower counts nothing");
    assert!(
        (on_leader - used).abs() <= 0.1 * used + 0.2,
        "the leader counted {on_leader} GPU-seconds, the batch says {used}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fair_share_order_is_the_same_after_a_failover() {
    let Pair {
        leader: mut r0,
        follower: r1,
        guards: _guards,
    } = leader_and_follower(crate::fairshare::config).await;
    crate::fairshare::heavy_then_light(&r0.endpoint).await;
    // The leader dies; r1 takes over and rebuilds its core, usage
    // included, from the database.
    r0.kill9();
    leads_within(&r1, Duration::from_secs(20)).await;
    crate::fairshare::light_goes_first(&r1.endpoint).await;
    crate::fairshare::light_gets_the_node(&r1.endpoint).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_on_one_replica_puts_one_config_generation_in_force_on_every_replica() {
    let dir = tempfile::tempdir().expect("tempdir");
    let database = fresh_postgres_database().await;
    let url = database.url.clone();
    let base = std::fs::read_to_string(config_file(dir.path())).expect("config");
    let (f0, f1) = (dir.path().join("r0.toml"), dir.path().join("r1.toml"));
    std::fs::write(&f0, &base).expect("r0.toml");
    std::fs::write(&f1, &base).expect("r1.toml");
    let r0 = Replica::start("r0", &url, &f0, dir.path()).await;
    let r1 = Replica::start("r1", &url, &f1, dir.path()).await;
    let config = |r: &Replica| {
        let endpoint = r.endpoint.clone();
        async move {
            let z: Value = reqwest::get(format!("{endpoint}/readyz"))
                .await
                .expect("readyz")
                .json()
                .await
                .expect("json");
            z["config"].clone()
        }
    };
    let first = config(&r0).await;
    assert_eq!(config(&r1).await["generation"], first["generation"]);
    // r1's file changes and r1 reloads it: r0 applies the same generation,
    // and says its own file differs.
    let changed = format!("{base}[provisioning]\ndefault_allocation_timeout = \"20m\"\n");
    std::fs::write(&f1, &changed).expect("r1.toml");
    let http = reqwest::Client::new();
    let reload = |r: &Replica| {
        let (http, endpoint) = (http.clone(), r.endpoint.clone());
        async move {
            let resp = http
                .post(format!("{endpoint}/v1/config:reload"))
                .send()
                .await
                .expect("reload");
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.expect("json");
            assert_eq!(status, 200, "{body:#}");
            body
        }
    };
    let answer = reload(&r1).await;
    let generation = answer["generation"].as_i64().expect("generation");
    assert!(
        Some(generation) > first["generation"].as_i64(),
        "{answer:#}"
    );
    let t = Instant::now();
    let on_r0 = loop {
        let c = config(&r0).await;
        if c["generation"] == generation {
            break c;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "r0 never applied it: {c:#}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(on_r0["digest"], config(&r1).await["digest"]);
    assert!(
        on_r0["fileDiffers"]
            .as_str()
            .is_some_and(|w| w.contains("differs") && w.contains("r1")),
        "{on_r0:#}"
    );
    let metrics = reqwest::get(format!("{}/metrics", r0.metrics))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    assert!(metrics.contains("flexq_config_file_differs 1"), "{metrics}");
    assert!(metrics.contains(&format!("flexq_config_generation {generation}")));
    // A create through r0 gets the new default.
    assert_eq!(
        r0.create("after-reload", &crate::reload::default_timeout_batch())
            .await,
        200
    );
    let b: Value = reqwest::get(format!(
        "{}/v1/projects/demo/locations/us-central1/batches/after-reload",
        r0.endpoint
    ))
    .await
    .expect("get")
    .json()
    .await
    .expect("json");
    assert_eq!(crate::reload::timeout_of(&b), 20 * 60);
    // r0's file made the same and reloaded: no new generation, and r0 no
    // longer says its file differs.
    std::fs::write(&f0, &changed).expect("r0.toml");
    let again = reload(&r0).await;
    assert_eq!(again["generation"], generation, "{again:#}");
    assert!(config(&r0).await.get("fileDiffers").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_follower_goes_on_across_a_leader_failover() {
    use crate::watch::Sse;
    let Pair {
        leader: mut r0,
        follower: r1,
        guards: _guards,
    } = leader_and_follower(config_file).await;
    let batches = format!(
        "{}/v1/projects/demo/locations/us-central1/batches",
        r1.endpoint
    );
    let mut sse = Sse::open(&format!("{batches}:watch"), None).await;
    assert_eq!(
        sse.next(Duration::from_secs(5)).await.expect("ready").event,
        "ready"
    );
    let http = reqwest::Client::new();
    let create = |id: &'static str| {
        let (http, batches) = (http.clone(), batches.clone());
        async move {
            let r = http
                .post(format!("{batches}?batchId={id}"))
                .json(&gpu_batch(2, "600s"))
                .send()
                .await
                .expect("create");
            assert_eq!(r.status(), 200, "{id}");
        }
    };
    // Until the watch shows batch `id` with `provisioning` (and `state`).
    async fn until(sse: &mut Sse, id: &str, provisioning: &str, state: &str) {
        let t = Instant::now();
        loop {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "{id} never {provisioning}/{state}"
            );
            let Some(e) = sse.next(Duration::from_secs(20)).await else {
                panic!("the watch ended waiting for {id}");
            };
            let b = &e.data["batch"];
            if e.event == "batch"
                && b["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(&format!("/{id}")))
                && b["flexq"]["provisioningState"] == provisioning
                && b["state"] == state
            {
                return;
            }
        }
    }
    create("before-failover").await;
    until(&mut sse, "before-failover", "PROVISIONED", "PENDING").await;
    // The leader dies; r1 takes over. The same stream goes on.
    r0.kill9();
    leads_within(&r1, Duration::from_secs(20)).await;
    create("after-failover").await;
    until(&mut sse, "after-failover", "PROVISIONED", "PENDING").await;
    let b: Value = http
        .get(format!("{batches}/before-failover"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let op = b["operation"].as_str().expect("op");
    let r = http
        .post(format!("{}/v1/{op}:cancel", r1.endpoint))
        .send()
        .await
        .expect("cancel");
    assert_eq!(r.status(), 200);
    until(&mut sse, "before-failover", "RELEASED", "CANCELLED").await;
}

/// A hold and a cordon made through a follower reach the leader, which
/// alone allocates: it says why the batch waits, shows the nodes
/// cordoned, and allocates only once both are lifted, again through the
/// follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_and_a_cordon_made_on_a_follower_reach_the_leader() {
    let Pair {
        leader,
        follower,
        guards: _guards,
    } = leader_and_follower(config_file).await;
    let http = reqwest::Client::new();
    let post = |replica: &Replica, path: &str| {
        let request = http.post(format!("{}{path}", replica.endpoint));
        async move {
            let r = request.send().await.expect("post");
            let status = r.status();
            let body: Value = r.json().await.unwrap_or_default();
            assert!(status.is_success(), "{status}: {body:#}");
        }
    };
    let get = |replica: &Replica, path: &str| {
        let request = http.get(format!("{}{path}", replica.endpoint));
        async move {
            request
                .send()
                .await
                .expect("get")
                .json::<Value>()
                .await
                .expect("json")
        }
    };
    let batch = "/v1/projects/demo/locations/us-central1/batches/behind-a-hold";
    let until = |what: &'static str, done: fn(&Value) -> bool, path: &'static str| {
        let leader = &leader;
        async move {
            let t = Instant::now();
            loop {
                let v = get(leader, path).await;
                if done(&v) {
                    return v;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(15),
                    "the leader never {what}: {v:#}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };

    post(
        &follower,
        "/v1/projects/demo/regions/us-central1/queue:hold",
    )
    .await;
    assert_eq!(
        follower
            .create("behind-a-hold", &gpu_batch(2, "600s"))
            .await,
        200
    );
    until(
        "said the batch waits on the hold",
        |b| {
            b["flexq"]["notAdmittedReasons"]
                .as_array()
                .is_some_and(|r| {
                    r.iter()
                        .any(|r| r.as_str().is_some_and(|r| r.contains("held by an admin")))
                })
        },
        batch,
    )
    .await;

    let nodes = get(&leader, "/v1/nodes").await;
    let ids: Vec<String> = nodes["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["id"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(ids.len(), 4, "{nodes:#}");
    for id in &ids {
        post(
            &follower,
            &format!("/v1/nodes/{}:cordon", id.replace('/', "%2F")),
        )
        .await;
    }
    until(
        "showed every node cordoned",
        |n| {
            n["nodes"]
                .as_array()
                .is_some_and(|n| n.iter().all(|n| n["state"] == "CORDONED"))
        },
        "/v1/nodes",
    )
    .await;
    // The hold lifted, every node still cordoned: nothing may be placed.
    post(
        &follower,
        "/v1/projects/demo/regions/us-central1/queue:resume",
    )
    .await;
    until(
        "saw the hold lifted",
        |b| {
            b["flexq"]["notAdmittedReasons"].as_array().is_none_or(|r| {
                !r.iter()
                    .any(|r| r.as_str().is_some_and(|r| r.contains("held by an admin")))
            })
        },
        batch,
    )
    .await;
    let b = get(&leader, batch).await;
    assert_eq!(
        b["flexq"]["provisioningState"], "QUEUED",
        "placed on a cordoned node: {b:#}"
    );
    for id in &ids {
        post(
            &follower,
            &format!("/v1/nodes/{}:uncordon", id.replace('/', "%2F")),
        )
        .await;
    }
    until(
        "allocated the batch",
        |b| b["flexq"]["provisioningState"] == "PROVISIONED",
        batch,
    )
    .await;
}
