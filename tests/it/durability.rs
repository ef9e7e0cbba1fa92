//! Nothing accepted is lost when the process crashes: SIGKILL of a real
//! `flexq serve` right after (and during) a burst of creates. A SIGKILL
//! leaves what the process wrote to the kernel, so these tests would pass
//! with commits that are never synced; that commits reach the disk is
//! the store's settings, checked on its own sessions by the last test.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::Mutex;

use crate::support::{ServerProcess, database_url, flex_batch, open_engine};

/// Every batch id stored, with how often it appears.
async fn stored_ids(endpoint: &str) -> HashMap<String, usize> {
    let http = reqwest::Client::new();
    let mut out: HashMap<String, usize> = HashMap::new();
    let mut token = String::new();
    loop {
        let page: Value = http
            .get(format!(
                "{endpoint}/v1/projects/demo/locations/us-central1/batches?pageSize=1000&pageToken={token}"
            ))
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("json");
        for b in page["batches"].as_array().cloned().unwrap_or_default() {
            let id = b["name"]
                .as_str()
                .expect("name")
                .rsplit('/')
                .next()
                .expect("id")
                .to_string();
            *out.entry(id).or_default() += 1;
        }
        match page["nextPageToken"].as_str() {
            Some(t) if !t.is_empty() => token = t.to_string(),
            _ => return out,
        }
    }
}

/// Fires `n` creates from `clients` concurrent clients, each until its
/// first create that gets no answer; returns the ids acknowledged with
/// 200.
async fn burst(endpoint: &str, prefix: &str, n: usize, clients: usize) -> HashSet<String> {
    let acked = Arc::new(Mutex::new(HashSet::new()));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (acked, next) = (acked.clone(), next.clone());
        let url = format!("{endpoint}/v1/projects/demo/locations/us-central1/batches");
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let id = format!("{prefix}-{i:06}");
                let sent = http
                    .post(format!("{url}?batchId={id}"))
                    .json(&flex_batch())
                    .send()
                    .await;
                match sent {
                    Ok(answer) if answer.status().is_success() => {
                        acked.lock().await.insert(id);
                    }
                    Ok(_) => {}
                    // The server is gone (killed): this client stops, since
                    // its port may soon be another test's server's, which
                    // would take the creates that follow.
                    Err(_) => return,
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    Arc::try_unwrap(acked).expect("tasks done").into_inner()
}

#[tokio::test]
async fn every_acknowledged_batch_survives_sigkill_exactly_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = ServerProcess::start(dir.path()).await;
    let acked = burst(&server.endpoint, "burst", 2000, 32).await;
    assert_eq!(acked.len(), 2000, "the burst was accepted");
    server.kill9();

    let server = ServerProcess::start(dir.path()).await;
    let stored = stored_ids(&server.endpoint).await;
    assert!(stored.values().all(|&n| n == 1), "no batch stored twice");
    let stored: HashSet<String> = stored.into_keys().collect();
    assert_eq!(
        stored, acked,
        "exactly the acknowledged batches, nothing else"
    );
}

#[tokio::test]
async fn a_kill_during_a_burst_loses_nothing_acknowledged_and_invents_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = ServerProcess::start(dir.path()).await;
    let endpoint = server.endpoint.clone();
    let sender = tokio::spawn(async move { burst(&endpoint, "mid", 100_000, 32).await });
    // Let a few thousand commit, then kill while creates are in flight.
    let http = reqwest::Client::new();
    loop {
        let text = http
            .get(format!("{}/metrics", server.metrics_endpoint))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        let pending = text
            .lines()
            .find(|l| l.starts_with("flexq_batch_transitions_total{state=\"PENDING\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        if pending >= 3000.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    server.kill9();
    let acked = sender.await.expect("sender");
    // The metric counts commits a moment before their answers arrive, so
    // some of the 3000 may be unacknowledged: only require a real burst
    // that the kill interrupted.
    assert!(
        !acked.is_empty() && acked.len() < 100_000,
        "the kill came mid-burst: {} acknowledged",
        acked.len()
    );

    let server = ServerProcess::start(dir.path()).await;
    let stored = stored_ids(&server.endpoint).await;
    assert!(stored.values().all(|&n| n == 1), "no batch stored twice");
    let stored: HashSet<String> = stored.into_keys().collect();
    let missing: Vec<_> = acked.difference(&stored).take(5).collect();
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
    assert!(
        stored.iter().all(|id| id.starts_with("mid-")
            && id["mid-".len()..]
                .parse::<usize>()
                .is_ok_and(|i| i < 100_000)),
        "only batches that were sent"
    );
}

/// The settings that make a commit durable, read back from the sessions
/// of a store opened as the server opens it (SQLite: `synchronous` FULL
/// and WAL; PostgreSQL: `synchronous_commit` not off, `fsync` on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_syncs_each_commit_on_every_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = flexq::config::Config::load_without_env(None).expect("config");
    config.database.data_dir = dir.path().join("data");
    config.database.url = database_url(dir.path()).await;
    let (engine, shutdown) = open_engine(&config).await;
    // As many at once as the pool holds: each reads its own session.
    let sessions = config.database.max_connections.max(2) as usize;
    let all =
        futures_util::future::join_all((0..sessions).map(|_| engine.store().durability())).await;
    for d in all {
        let d = d.expect("read the settings");
        assert!(d.is_durable(), "{d:?}");
        let sync = d
            .settings
            .iter()
            .find(|(name, _)| *name == "synchronous" || *name == "synchronous_commit")
            .map(|(_, value)| value.as_str());
        assert!(matches!(sync, Some("2" | "on")), "{d:?}");
    }
    shutdown.cancel();
}

/// A batch's cluster and its placement alternatives are stored as one
/// JSON object and read back whole, by every reader; a stored cluster
/// that cannot be read is an error that says so, never a default (a
/// reader that defaulted would, for one, give a batch no retries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_cluster_reads_back_whole_and_a_corrupt_one_is_an_error() {
    use flexq::spec::alternatives::{Alternative, Target};
    use flexq::store::{NewBatch, Store, StoreOptions};

    let dir = tempfile::tempdir().expect("tempdir");
    let url = match database_url(dir.path()).await {
        Some(url) => url,
        None => format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("flexq.db").display()
        ),
    };
    let store = Store::open(&StoreOptions {
        url: url.clone(),
        max_connections: 2,
        group_commit_max: 8,
        limits: Default::default(),
        observe_group: None,
    })
    .await
    .expect("store");
    let config = flexq::config::Config::load_without_env(None).expect("config");
    let batch: flexq::api::Batch =
        serde_json::from_value(crate::replicas::gpu_batch(3, "3600s")).expect("batch");
    let mut cluster = flexq::spec::validate(&batch, "demo", "us-central1", &config.policy())
        .expect("valid")
        .cluster;
    cluster.infrastructure_retries = 2;
    let mut elsewhere = cluster.clone();
    elsewhere.executor_count = 1;
    let alternatives = vec![Alternative {
        index: 1,
        after_s: 900,
        target: Target::Region("europe-west4".into()),
        region: "europe-west4".into(),
        cluster: elsewhere,
    }];
    let name = flexq::api::BatchName::new("demo", "us-central1", "stored-whole");
    store
        .create(NewBatch {
            name: name.clone(),
            uuid: uuid::Uuid::now_v7(),
            operation_id: uuid::Uuid::now_v7(),
            request_id: None,
            creator: "test".into(),
            spec: batch,
            cluster: cluster.clone(),
            alternatives: alternatives.clone(),
            priority: 0,
            state_message: "Queued.".into(),
        })
        .await
        .expect("created");

    // Read back whole: the batch, and the queue a restart rebuilds.
    let stored = store.get(&name).await.expect("read back");
    assert_eq!(stored.cluster, cluster);
    assert_eq!(stored.alternatives, alternatives);
    let queued = store.queued_batches(..).await.expect("queued");
    let [q] = queued.as_slice() else {
        panic!("one queued batch: {queued:?}");
    };
    assert_eq!((&q.cluster, &q.alternatives), (&cluster, &alternatives));

    // Corrupt it behind the store's back: each reader says so.
    sqlx::any::install_default_drivers();
    let db = sqlx::AnyPool::connect(&url).await.expect("raw connection");
    sqlx::query("update batches set cluster = $1")
        .bind(r#"{"executor_count": "many"}"#)
        .execute(&db)
        .await
        .expect("corrupt the row");
    db.close().await;
    let e = store.get(&name).await.expect_err("a corrupt cluster");
    assert!(
        e.to_string().contains("stored cluster cannot be read"),
        "{e}"
    );
    let e = store.queued_batches(..).await.expect_err("a corrupt queue");
    assert!(
        e.to_string().contains("queued batches cannot be read"),
        "{e}"
    );
}
