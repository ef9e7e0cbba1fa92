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
use flexq::spec::{ClusterRequest, Request};
use serde_json::{Value, json};
use sqlx::Row;

use crate::support::{flex_with, flexq_bin, fresh_postgres_database, metrics_text};

mod announcements;
mod cut_off;
mod elastic;
mod failover;
mod followers;
mod heal;
mod manifest;
mod preemption;
mod provisioning;
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

    pub(crate) fn kill9(&mut self) {
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
/// never over `quota`; every cluster whole on the alternative it was allocated
/// on (one driver and exactly the executors that alternative's cluster asks,
/// each with that alternative's GPUs, GPU type and region, per attempt: an
/// attempt's parts are allocated in one transaction, at one instant);
/// every attempt's cluster allocated before that attempt's own deadline;
/// and no part still held by a batch that ended. Returns the number of
/// clusters ever allocated.
pub(crate) async fn audit(url: &str, quota: i64) -> Result<usize, String> {
    let db = sqlx::PgPool::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let batches = allocated_batches(&db).await?;
    let rows = sqlx::query(
        "select a.batch_seq, a.node_id, a.role, a.gpus, a.cores, a.memory_mb, a.local_ssd_gb, \
         a.allocated_at, a.released_at, a.region, a.accelerator, b.project, b.state \
         from allocations a join batches b on b.seq = a.batch_seq order by a.id",
    )
    .fetch_all(&db)
    .await
    .map_err(|e| e.to_string())?;
    // (time, +1 start / -1 end, what): ends sort before starts at the same
    // microsecond (half-open intervals).
    let mut events: Vec<(i64, i64, String, [i64; 4])> = Vec::new();
    // (batch, allocated at) → the parts of that attempt's cluster.
    let mut clusters: BTreeMap<(i64, i64), Vec<Part>> = BTreeMap::new();
    for r in &rows {
        let seq: i64 = r.get("batch_seq");
        let node: String = r.get("node_id");
        let gpus: Vec<String> = serde_json::from_str(r.get::<&str, _>("gpus")).expect("gpus");
        let start: i64 = r.get("allocated_at");
        let released: Option<i64> = r.get("released_at");
        let end = released.unwrap_or(i64::MAX);
        let role: String = r.get("role");
        if role != "driver" && role != "executor" {
            return Err(format!("batch {seq}: a part with role {role:?}"));
        }
        // An end gives the cluster back in the same transaction
        // (lifecycle's Release step): a part left held is capacity the
        // scheduler never sees free again, which no overlap shows.
        let state: i64 = r.get("state");
        if released.is_none() && ENDED.contains(&state) {
            return Err(format!(
                "batch {seq} ended (state {state}) but its {role} part on {node}, allocated at {start}, was never released"
            ));
        }
        clusters.entry((seq, start)).or_default().push(Part {
            role,
            gpus: gpus.len(),
            region: r.get("region"),
            accelerator: r.get("accelerator"),
        });
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
    // A batch's clusters in time order are its attempts' in order: only a
    // held cluster is requeued, and the requeue gives it back.
    let mut attempts: HashMap<i64, usize> = HashMap::new();
    for ((seq, at), parts) in &clusters {
        let b = batches
            .get(seq)
            .ok_or_else(|| format!("batch {seq}: allocated, but not read"))?;
        let attempt = attempts.entry(*seq).or_default();
        *attempt += 1;
        let attempt = *attempt;
        let Some(&queued) = b.queued.get(attempt - 1) else {
            return Err(format!(
                "batch {seq}: {attempt} clusters allocated in {} attempts",
                b.queued.len()
            ));
        };
        // The deadline of this attempt, not only the latest's: a requeue
        // overwrites the stored one.
        if let Some(deadline) = attempt_deadline(&b.request.cluster, queued) {
            if *at >= deadline {
                return Err(format!(
                    "batch {seq}, attempt {attempt} (queued at {queued}): allocated at {at}, at or after its deadline {deadline}"
                ));
            }
        }
        // The alternative the cluster is on: the latest attempt's is stored with
        // the batch; a requeue clears it, so an earlier attempt's must be
        // one alternative the parts are whole on. An alternative reshapes the cluster
        // (another GPU type: other executors), so its own shape is not
        // what an alternative's allocation is counted against.
        let latest = attempt == b.queued.len() && b.allocate_time == Some(*at);
        let alternatives: Vec<u32> = if latest {
            vec![b.alternative]
        } else {
            (0..=b.request.alternatives.len() as u32).collect()
        };
        if !alternatives
            .iter()
            .any(|&alternative| whole_on(b, alternative, parts))
        {
            let count = |role: &str| parts.iter().filter(|p| p.role == role).count();
            let asked: Vec<u32> = alternatives
                .iter()
                .map(|&alternative| b.request.on(alternative).0.executor_count)
                .collect();
            return Err(format!(
                "batch {seq}, attempt {attempt}, allocated at {at}: {} drivers and {} executors ({parts:?}), {asked:?} executors asked on rungs {alternatives:?}",
                count("driver"),
                count("executor"),
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
    Ok(clusters.len())
}

/// The states a batch ends in: CANCELLED, SUCCEEDED, FAILED.
const ENDED: [i64; 3] = [4, 5, 6];

/// One stored part of a cluster, as the audit checks it against an alternative.
#[derive(Debug)]
struct Part {
    role: String,
    gpus: usize,
    /// Where it was held (null on rows older than the column).
    region: Option<String>,
    /// Its GPUs' type (null without GPUs, or on older rows).
    accelerator: Option<String>,
}

/// What the audit reads of a batch that was ever allocated.
struct Audited {
    region: String,
    /// Its stored cluster and alternatives.
    request: Request,
    /// When each attempt was queued (unix µs): at create, then at each
    /// requeue.
    queued: Vec<i64>,
    /// When its latest attempt was allocated, if it was.
    allocate_time: Option<i64>,
    /// The alternative its latest attempt's cluster is on (0: its own).
    alternative: u32,
}

/// The batches ever allocated, with when each of their attempts was
/// queued: at create, then at each requeue, whose history entry
/// ("Requeued after ...") and fresh deadline are written at one instant
/// (the store's `requeue`). The stored deadline is the latest attempt's
/// alone; an earlier attempt's is had again from when it was queued, by
/// the store's own rule, after checking that rule gives the stored one.
async fn allocated_batches(db: &sqlx::PgPool) -> Result<HashMap<i64, Audited>, String> {
    let requeues = sqlx::query(
        "select batch_seq, start_time from state_history \
         where state = 1 and message like 'Requeued after%' order by batch_seq, idx",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    let mut requeued: HashMap<i64, Vec<i64>> = HashMap::new();
    for r in &requeues {
        requeued
            .entry(r.get::<i64, _>("batch_seq"))
            .or_default()
            .push(r.get::<i64, _>("start_time"));
    }
    let rows = sqlx::query(
        "select seq, region, cluster, create_time, deadline, attempt, allocate_time, alternative \
         from batches where seq in (select batch_seq from allocations)",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    let mut batches = HashMap::new();
    for r in &rows {
        let seq: i64 = r.get("seq");
        let request: Request = serde_json::from_str(r.get::<&str, _>("cluster"))
            .map_err(|e| format!("batch {seq}: its stored cluster request does not read: {e}"))?;
        let mut queued = vec![r.get::<i64, _>("create_time")];
        queued.extend(requeued.remove(&seq).unwrap_or_default());
        // (`attempt` and `alternative` are integer columns, not bigint.)
        let attempt: i32 = r.get("attempt");
        if queued.len() != usize::try_from(attempt).unwrap_or(0) {
            return Err(format!(
                "batch {seq}: attempt {attempt}, but {} requeues in its history",
                queued.len() - 1
            ));
        }
        let stored: Option<i64> = r.get("deadline");
        let latest = queued[queued.len() - 1];
        if attempt_deadline(&request.cluster, latest) != stored {
            return Err(format!(
                "batch {seq}: its stored deadline {stored:?} is not that of its attempt {attempt}, queued at {latest}: {:?}",
                attempt_deadline(&request.cluster, latest)
            ));
        }
        batches.insert(
            seq,
            Audited {
                region: r.get("region"),
                request,
                queued,
                allocate_time: r.get("allocate_time"),
                alternative: r
                    .get::<Option<i32>, _>("alternative")
                    .and_then(|a| u32::try_from(a).ok())
                    .unwrap_or(0),
            },
        );
    }
    Ok(batches)
}

/// The allocation deadline (unix µs) of an attempt queued at `queued`
/// (unix µs), by the rule the store sets it with; none in default mode.
fn attempt_deadline(cluster: &ClusterRequest, queued: i64) -> Option<i64> {
    let queued = chrono::DateTime::from_timestamp_micros(queued)?;
    cluster.deadline(queued).map(|d| d.timestamp_micros())
}

/// Whether `parts` are a whole cluster of `b` on `alternative`: one driver and
/// exactly the executors the alternative's cluster asks, each part with that
/// cluster's GPU count for its role, of its GPU type, in the alternative's
/// region (where the row records them).
fn whole_on(b: &Audited, alternative: u32, parts: &[Part]) -> bool {
    let (cluster, region) = b.request.on(alternative);
    let region = region.unwrap_or(b.region.as_str());
    let count = |role: &str| parts.iter().filter(|p| p.role == role).count();
    count("driver") == 1
        && count("executor") == cluster.executor_count as usize
        && parts.iter().all(|p| {
            let shape = if p.role == "driver" {
                &cluster.driver
            } else {
                &cluster.executor
            };
            p.gpus == shape.gpus as usize
                && p.region.as_deref().is_none_or(|r| r == region)
                && (p.gpus == 0
                    || p.accelerator
                        .as_deref()
                        .is_none_or(|a| shape.accelerator.is_some_and(|s| s.name() == a)))
        })
}

/// `flexq_scheduler_leader` of a replica, from its metrics listener (which
/// answers without the database).
pub(crate) async fn leads_by_metrics(metrics: &str) -> Option<bool> {
    let text = metrics_text(metrics).await?;
    let line = text
        .lines()
        .find(|l| l.starts_with("flexq_scheduler_leader{"))?;
    Some(line.ends_with(" 1"))
}
