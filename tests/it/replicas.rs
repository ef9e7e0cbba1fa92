//! Several `flexq serve` replicas on one real PostgreSQL. This file holds
//! what the replica tests share: the test pool's shape, a replica process
//! (`Replica`), a leader with a follower (`leader_and_follower`), who
//! leads (`leader`, `leads_within`, `leads_by_metrics`), the config
//! (`config_file`) and the audit of the whole allocation history
//! (`audit`); the tests are in `replicas/`, by topic.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flexq::config::Config;
use flexq::spec::ClusterRequest;
use serde_json::{Value, json};
use sqlx::Row;

use crate::support::{flex_with, flexq_bin, fresh_postgres_database};

mod cut_off;
mod failover;
mod followers;
mod manifest;
mod preemption;
mod reload;
mod two_stores;
mod under_load;

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
