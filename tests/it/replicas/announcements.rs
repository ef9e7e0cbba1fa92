//! An announcement a replica cannot read — from a version that announced
//! otherwise, during a rolling upgrade — makes it read the database, so
//! what it announced is not missed.

use std::time::Duration;

use super::{Replica, config_file, gpu_batch, leads_within};
use crate::support::{fresh_postgres_database, poll};

/// A queued batch written behind the leader's back (as a replica of
/// another version would write it) and announced in a form this version
/// cannot read is allocated once capacity frees: the unreadable
/// announcement made the leader read the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announcement_the_leader_cannot_read_makes_it_read_the_database() {
    let dir = tempfile::tempdir().expect("tempdir");
    let database = fresh_postgres_database().await;
    let url = database.url.clone();
    let config = config_file(dir.path());
    let r0 = Replica::start("r0", &url, &config, dir.path()).await;
    leads_within(&r0, Duration::from_secs(10)).await;
    let db = sqlx::PgPool::connect(&url).await.expect("db");
    let count = |sql: &'static str| {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&db)
                .await
                .expect("count")
        }
    };
    // Four whole-node batches fill the four nodes; a fifth waits.
    for i in 0..5 {
        assert_eq!(
            r0.create(&format!("batch-{i}"), &gpu_batch(3, "600s"))
                .await,
            200
        );
    }
    let provisioned = "select count(*) from batches where provisioning = 1";
    poll(Duration::from_secs(20), || count(provisioned), |n| *n == 4)
        .await
        .expect("four allocated");

    // The waiting batch copied under another id, queued, straight into
    // the database; its announcement in the text form of before.
    let columns: Vec<String> = sqlx::query_scalar(
        "select column_name::text from information_schema.columns \
         where table_name = 'batches' and column_name not in \
         ('seq', 'batch_id', 'uuid', 'operation_id', 'request_id') \
         and is_generated = 'NEVER' order by ordinal_position",
    )
    .fetch_all(&db)
    .await
    .expect("columns");
    let columns = columns.join(", ");
    sqlx::query(&format!(
        "insert into batches (batch_id, uuid, operation_id, {columns}) \
         select 'sneaked', 'sneaked-uuid', 'sneaked-operation', {columns} \
         from batches where provisioning = 0 and state = 1"
    ))
    .execute(&db)
    .await
    .expect("a copy of the waiting batch");
    sqlx::query("select pg_notify('flexq', 'created 1000 1000')")
        .execute(&db)
        .await
        .expect("notify");

    // Two nodes free: the waiting batch and the sneaked one both fit.
    let running: Vec<String> = sqlx::query_scalar(
        "select operation_id from batches where provisioning = 1 order by seq limit 2",
    )
    .fetch_all(&db)
    .await
    .expect("running");
    let http = reqwest::Client::new();
    for op in running {
        let r = http
            .post(format!(
                "{}/v1/projects/demo/regions/us-central1/operations/{op}:cancel",
                r0.endpoint
            ))
            .send()
            .await
            .expect("cancel");
        assert_eq!(r.status(), 200);
    }
    let sneaked = "select count(*) from batches where batch_id = 'sneaked' and provisioning = 1";
    poll(Duration::from_secs(10), || count(sneaked), |n| *n == 1)
        .await
        .expect("the sneaked batch, announced unreadably, was never allocated");
}
