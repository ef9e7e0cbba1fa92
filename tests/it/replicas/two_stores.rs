//! Two stores on one database, as two replicas without their processes:
//! the same create through both at once gives one batch, and a paused
//! leader's decisions are fenced once another took over (the audit sees
//! the double allocation the fence prevents).

use std::collections::HashSet;
use std::time::Duration;

use flexq::config::Config;
use flexq::scheduler::{Decision, Scheduler};
use flexq::store::{NewBatch, Store, StoreError, StoreOptions};

use super::{QUOTA, audit, config_file, gpu_batch};
use crate::support::fresh_postgres_database;

/// A whole-node batch of project demo, as the API would store it.
fn new_batch(config: &Config, id: &str, request_id: Option<&str>) -> NewBatch {
    let batch: flexq::api::Batch = serde_json::from_value(gpu_batch(3, "3600s")).expect("batch");
    let flexq::spec::Request {
        cluster,
        alternatives,
    } = flexq::spec::validate(&batch, "demo", "us-central1", &config.policy()).expect("valid");
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
        alternatives,
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
