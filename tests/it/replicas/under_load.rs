//! Failover under load: three replicas, submits and cancels through
//! random replicas, the leader killed again and again; then the audit of
//! the allocation history (every part ever allocated, with when it was
//! released), not just the end state.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{Value, json};

use super::{QUOTA, Replica, audit, config_file, gpu_batch, leader};
use crate::support::fresh_postgres_database;

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
