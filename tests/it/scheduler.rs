//! The capacity queue through the HTTP API, with virtual nodes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use flexq::config::{Config, PoolConfig, ZoneConfig};
use flexq::scheduler::QuotaRule;
use flexq::spec::{Accelerator, QuotaMetric};
use serde_json::{Value, json};

use crate::support::{
    self, ServerProcess, TestServer, assert_status, flex_with, virtual_l4_config,
};

/// us-central1 with one zone of `nodes` virtual L4 nodes of `gpus` GPUs
/// (declared capacity `max_nodes`), and a quota of `quota` GPUs per pool.
pub(crate) fn world(config: &mut Config, nodes: u32, gpus: u32, max_nodes: u32, quota: u64) {
    let pool = PoolConfig {
        accelerator: Accelerator::L4,
        gpus_per_node: gpus,
        cores: 12 * gpus,
        memory_mb: 53536 * u64::from(gpus),
        local_ssd_gb: 375 * u64::from(gpus),
        max_nodes,
        virtual_nodes: nodes,
        provisioner: None,
    };
    let region = config.regions.get_mut("us-central1").expect("region");
    region.zones = BTreeMap::from([(
        "us-central1-a".to_string(),
        ZoneConfig {
            node_pools: BTreeMap::from([("l4".to_string(), pool)]),
        },
    )]);
    config.quotas = [
        QuotaMetric::PreemptibleNvidiaL4Gpus,
        QuotaMetric::NvidiaL4Gpus,
    ]
    .into_iter()
    .map(|metric| QuotaRule {
        project: "*".into(),
        region: "*".into(),
        metric,
        limit: quota,
    })
    .chain([QuotaRule {
        project: "*".into(),
        region: "*".into(),
        metric: QuotaMetric::LocalSsdTotalGb,
        limit: 100_000,
    }])
    .collect();
}

/// A flex start batch: an L4 driver and `executors` L4 executors.
pub(crate) fn gpu_batch(executors: u32, timeout: &str) -> Value {
    let mut b = flex_with("spark.executor.instances", &executors.to_string());
    b["runtimeConfig"]["properties"]["spark.dataproc.driver.provisioning.allocationTimeout"] =
        json!(timeout);
    b["runtimeConfig"]["properties"]["spark.dataproc.executor.provisioning.allocationTimeout"] =
        json!(timeout);
    b
}

/// The same in default (on-demand) mode: runtime 2.2.
pub(crate) fn on_demand_batch(executors: u32) -> Value {
    let mut b = gpu_batch(executors, "3600s");
    b["runtimeConfig"]["version"] = json!("2.2");
    let props = b["runtimeConfig"]["properties"]
        .as_object_mut()
        .expect("props");
    props.remove("spark.dataproc.driver.provisioning.allocationTimeout");
    props.remove("spark.dataproc.executor.provisioning.allocationTimeout");
    b
}

async fn batch(s: &TestServer, id: &str) -> Value {
    let (st, b) = s
        .get(&format!(
            "/v1/projects/demo/locations/us-central1/batches/{id}"
        ))
        .await;
    assert_eq!(st, 200, "{b:#}");
    b
}

/// Polls a batch until `pred` holds (with a deadline, no fixed sleeps).
async fn until(s: &TestServer, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let path = format!("/v1/projects/demo/locations/us-central1/batches/{id}");
    support::until(s, &path, what, pred).await
}

fn provisioning(b: &Value) -> &str {
    b["flexq"]["provisioningState"].as_str().unwrap_or_default()
}

async fn gpu_usage(s: &TestServer) -> (u64, u64) {
    let (_, q) = s.get("/v1/projects/demo/regions/us-central1/quotas").await;
    let usage = q["quotas"]
        .as_array()
        .expect("quotas")
        .iter()
        .find(|m| m["metric"] == "PREEMPTIBLE_NVIDIA_L4_GPUS")
        .map(|m| m["usage"].as_u64().expect("usage"))
        .expect("metric listed");
    let (_, r) = s.get("/v1/regions").await;
    let allocated = r["capacity"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| row["allocatedGpus"].as_u64().expect("allocated"))
        .sum();
    (usage, allocated)
}

async fn cancel(s: &TestServer, id: &str) {
    s.cancel(&batch(s, id).await).await;
}

#[tokio::test]
async fn a_1_plus_8_cluster_waits_and_is_allocated_whole_when_the_last_gpu_frees() {
    let s = TestServer::start_with(|c| world(c, 3, 3, 4, 24)).await;
    // A small batch takes 3 of the 9 GPUs.
    assert_eq!(
        s.create("batchId=small-one", &gpu_batch(2, "3600s"))
            .await
            .0,
        200
    );
    until(&s, "small-one", "provisioned", |b| {
        provisioning(b) == "PROVISIONED"
    })
    .await;
    // 1 + 8 needs 9: it waits, holding nothing.
    assert_eq!(
        s.create("batchId=big-one", &gpu_batch(8, "3600s")).await.0,
        200
    );
    let b = until(&s, "big-one", "explained", |b| {
        !b["flexq"]["notAdmittedReasons"]
            .as_array()
            .is_none_or(Vec::is_empty)
    })
    .await;
    assert_eq!(b["state"], "PENDING");
    assert_eq!(b["flexq"]["provisioningState"], "QUEUED");
    assert_eq!(b["flexq"]["queuePosition"], 1);
    assert!(b["flexq"]["allocationDeadline"].is_string());
    let reason = b["flexq"]["notAdmittedReasons"][0]
        .as_str()
        .expect("reason");
    assert!(reason.contains("has room for 6"), "{reason}");
    // The same reason, typed, at the same place.
    assert_eq!(b["flexq"]["notAdmitted"][0]["reason"], "CAPACITY", "{b}");
    assert_eq!(b["flexq"]["notAdmitted"][0]["message"], reason, "{b}");
    assert_eq!(
        gpu_usage(&s).await,
        (3, 3),
        "quota and nodes agree; nothing partial"
    );

    cancel(&s, "small-one").await;
    let b = until(&s, "big-one", "provisioned", |b| {
        provisioning(b) == "PROVISIONED"
    })
    .await;
    let nodes = b["flexq"]["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 9, "driver and every executor at once");
    assert!(
        nodes.iter().all(|n| n["isVirtual"] == true),
        "virtual nodes are marked"
    );
    let gpus: usize = nodes
        .iter()
        .map(|n| n["gpus"].as_array().expect("gpus").len())
        .sum();
    assert_eq!(gpus, 9);
    assert_eq!(b["flexq"]["zone"], "us-central1-a");
    assert_eq!(gpu_usage(&s).await, (9, 9));
    let history: Vec<&str> = b["stateHistory"]
        .as_array()
        .expect("history")
        .iter()
        .map(|h| h["stateMessage"].as_str().unwrap_or_default())
        .collect();
    assert!(
        history
            .iter()
            .any(|m| m
                .starts_with("Allocated: the whole cluster (1 driver and 8 executors, 9 GPUs)")),
        "{history:?}"
    );

    // Cancelling an allocated batch gives every GPU back.
    cancel(&s, "big-one").await;
    assert_eq!(batch(&s, "big-one").await["state"], "CANCELLED");
    assert_eq!(gpu_usage(&s).await, (0, 0));
}

#[tokio::test]
async fn a_batch_expires_at_its_deadline_saying_what_was_missing() {
    let s = TestServer::start_with(|c| world(c, 1, 4, 4, 24)).await;
    let started = Instant::now();
    assert_eq!(
        s.create("batchId=impatient", &gpu_batch(5, "2s")).await.0,
        200
    );
    let b = until(&s, "impatient", "failed", |b| b["state"] == "FAILED").await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(4),
        "expired after {waited:?}"
    );
    let msg = b["stateMessage"].as_str().expect("message");
    assert!(msg.starts_with("Batch could not be allocated within its allocation timeout of 2s (waited 2s): needs all 6 parts of 1 l4 driver + 5 executors of l4 (4 cores, 1 GPU, 375 GB local SSD) in one zone; the best zone, us-central1-a, has room for 4"), "{msg}");
    assert_eq!(b["flexq"]["provisioningState"], "EXPIRED");
    let (_, op) = s
        .get(&format!("/v1/{}", b["operation"].as_str().expect("op")))
        .await;
    assert_eq!(op["done"], true);
    assert_eq!(op["error"]["code"], 4, "DEADLINE_EXCEEDED");
}

#[tokio::test]
async fn an_expiry_for_want_of_quota_names_the_metric_and_numbers() {
    let s = TestServer::start_with(|c| world(c, 4, 4, 4, 12)).await;
    assert_eq!(
        s.create("batchId=holder", &gpu_batch(2, "3600s")).await.0,
        200
    );
    until(&s, "holder", "provisioned", |b| {
        provisioning(b) == "PROVISIONED"
    })
    .await;
    assert_eq!(
        s.create("batchId=wants-ten", &gpu_batch(9, "1s")).await.0,
        200
    );
    let b = until(&s, "wants-ten", "failed", |b| b["state"] == "FAILED").await;
    let msg = b["stateMessage"].as_str().expect("message");
    assert!(msg.contains("timeout of 1s"), "{msg}");
    assert!(
        msg.contains("needs 10 PREEMPTIBLE_NVIDIA_L4_GPUS, project has 9 free of 12"),
        "{msg}"
    );
}

#[tokio::test]
async fn default_mode_fails_at_once_on_a_stock_out_or_missing_quota() {
    let s = TestServer::start_with(|c| world(c, 1, 4, 4, 4)).await;
    assert_eq!(
        s.create("batchId=on-demand-1", &on_demand_batch(2)).await.0,
        200
    );
    let b = until(&s, "on-demand-1", "provisioned", |b| {
        provisioning(b) == "PROVISIONED"
    })
    .await;
    assert_eq!(b["flexq"]["provisioningMode"], "default");

    // Quota: 3 of 4 used, 2 more asked.
    assert_eq!(
        s.create("batchId=on-demand-2", &on_demand_batch(2)).await.0,
        200,
        "create itself succeeds"
    );
    let b = until(&s, "on-demand-2", "failed", |b| b["state"] == "FAILED").await;
    assert_eq!(
        b["stateMessage"],
        "RESOURCE_EXHAUSTED: quota NVIDIA_L4_GPUS exceeded in us-central1: limit 4, usage 3, asked 3"
    );

    // Stock-out: quota raised, but the node has 1 GPU left.
    let resp = s
        .http
        .patch(s.url("/v1/projects/demo/regions/us-central1/quotas"))
        .json(&json!({"metric": "NVIDIA_L4_GPUS", "limit": "100"}))
        .send()
        .await
        .expect("patch");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        s.create("batchId=on-demand-3", &on_demand_batch(2)).await.0,
        200
    );
    let b = until(&s, "on-demand-3", "failed", |b| b["state"] == "FAILED").await;
    let msg = b["stateMessage"].as_str().expect("message");
    assert!(msg.starts_with("RESOURCE_EXHAUSTED: ZONE_RESOURCE_POOL_EXHAUSTED: no zone of us-central1 has capacity for 1 l4 driver + 2 executors"), "{msg}");
    let (_, op) = s
        .get(&format!("/v1/{}", b["operation"].as_str().expect("op")))
        .await;
    assert_eq!(op["error"]["code"], 8, "RESOURCE_EXHAUSTED");
}

/// The count of batches ended for each reason (`flexq_batches_ended_total`),
/// by its label.
pub(crate) fn ended_by_reason(text: &str) -> BTreeMap<&'static str, f64> {
    flexq::api::EndReason::ALL
        .into_iter()
        .map(|r| {
            let n =
                crate::metrics::value(text, "flexq_batches_ended_total", &[("reason", r.label())])
                    .unwrap_or_else(|| {
                        panic!("no flexq_batches_ended_total{{reason={:?}}}", r.label())
                    });
            (r.label(), n)
        })
        .collect()
}

/// The operation's code follows the batch's typed end reason, for each
/// way a batch ends without succeeding, and each ending is counted once
/// under its reason; and the migration that added the reason derives the
/// same one from what older rows hold.
#[tokio::test]
async fn each_ending_has_a_typed_reason_and_its_code_follows_it() {
    // A process of its own: the ended counter (labelled by reason alone)
    // moves for this test's batches only, so each count is exact.
    let s = TestServer::start_process_with(|c| world(c, 1, 4, 4, 24)).await;
    let before = ended_by_reason(&s.scrape().await);
    let quota = |limit: &'static str| {
        s.http
            .patch(s.url("/v1/projects/demo/regions/us-central1/quotas"))
            .json(&json!({"metric": "NVIDIA_L4_GPUS", "limit": limit}))
            .send()
    };
    assert_eq!(quota("4").await.expect("patch").status(), 200);
    assert_eq!(s.create("batchId=held", &on_demand_batch(2)).await.0, 200);
    until(&s, "held", "provisioned", |b| {
        provisioning(b) == "PROVISIONED"
    })
    .await;
    assert_eq!(s.create("batchId=quota", &on_demand_batch(2)).await.0, 200);
    assert_eq!(
        s.create("batchId=expired", &gpu_batch(5, "1s")).await.0,
        200
    );
    assert_eq!(
        s.create("batchId=cancelled", &gpu_batch(5, "3600s"))
            .await
            .0,
        200
    );
    cancel(&s, "cancelled").await;
    until(&s, "quota", "failed", |b| b["state"] == "FAILED").await;
    assert_eq!(quota("100").await.expect("patch").status(), 200);
    assert_eq!(
        s.create("batchId=stock-out", &on_demand_batch(2)).await.0,
        200
    );
    // (batch id, typed reason, the operation's google.rpc.Code)
    let expected = [
        ("quota", "QUOTA", 8),
        ("expired", "EXPIRED", 4),
        ("cancelled", "CANCELLED", 1),
        ("stock-out", "STOCK_OUT", 8),
    ];
    for (id, reason, code) in expected {
        let b = until(&s, id, "ended", |b| {
            b["state"] == "FAILED" || b["state"] == "CANCELLED"
        })
        .await;
        assert_eq!(b["flexq"]["endReason"], reason, "{id}: {b:#}");
        let (_, op) = s
            .get(&format!("/v1/{}", b["operation"].as_str().expect("op")))
            .await;
        assert_eq!(op["error"]["code"], code, "{id}: {op:#}");
    }
    let held = batch(&s, "held").await;
    assert!(held["flexq"].get("endReason").is_none(), "{held:#}");
    // Each of the four counted once under its reason, nothing else. (A
    // scrape waits for the core's lock, which a pass holds until it has
    // counted what it decided; a cancel counts before it answers.)
    let after = ended_by_reason(&s.scrape().await);
    let counted: BTreeMap<&str, f64> = after
        .iter()
        .map(|(reason, n)| (*reason, n - before[reason]))
        .filter(|(_, n)| *n != 0.0)
        .collect();
    assert_eq!(
        counted,
        BTreeMap::from([
            ("cancelled", 1.0),
            ("expired", 1.0),
            ("quota", 1.0),
            ("stockout", 1.0),
        ]),
        "batches ended by reason"
    );

    // The migration's derivation, run again on these rows with their
    // reasons cleared, gives each the reason flexq wrote.
    let url = support::server_database_url(&s).await;
    // (Both backends' files hold the same SQL today; each is run where
    // it is the one migrations run.)
    #[allow(clippy::if_same_then_else)]
    let migration = if url.starts_with("sqlite:") {
        include_str!("../../migrations/sqlite/0012_end_reason.sql")
    } else {
        include_str!("../../migrations/postgres/0013_end_reason.sql")
    };
    let derive = &migration[migration
        .find("update batches set end_reason")
        .expect("the derivation")..];
    sqlx::any::install_default_drivers();
    let mut db = <sqlx::AnyConnection as sqlx::Connection>::connect(&url)
        .await
        .expect("connect");
    sqlx::query("update batches set end_reason = null")
        .execute(&mut db)
        .await
        .expect("clear");
    sqlx::query(derive).execute(&mut db).await.expect("derive");
    <sqlx::AnyConnection as sqlx::Connection>::close(db)
        .await
        .expect("close");
    for (id, reason, code) in expected {
        let b = batch(&s, id).await;
        assert_eq!(b["flexq"]["endReason"], reason, "derived for {id}");
        let (_, op) = s
            .get(&format!("/v1/{}", b["operation"].as_str().expect("op")))
            .await;
        assert_eq!(op["error"]["code"], code, "derived for {id}");
    }
}

#[tokio::test]
async fn requests_that_can_never_fit_are_rejected_at_submit() {
    let s = TestServer::start_with(|c| world(c, 1, 4, 2, 16)).await;
    let (st, err) = s.create("batchId=over-quota", &gpu_batch(16, "60s")).await;
    assert_status(st, &err, 429, "RESOURCE_EXHAUSTED");
    let msg = err["error"]["message"].as_str().expect("message");
    assert!(msg.contains("needs 17 PREEMPTIBLE_NVIDIA_L4_GPUS, above the project's quota limit of 16 in us-central1 by 1"), "{msg}");
    // 9 GPUs: the zone declares at most 2 nodes of 4.
    let (st, err) = s
        .create("batchId=over-capacity", &gpu_batch(8, "60s"))
        .await;
    assert_status(st, &err, 429, "RESOURCE_EXHAUSTED");
    assert!(
        err["error"]["message"]
            .as_str()
            .expect("message")
            .contains("holds 8 (short by 1)"),
        "{err:#}"
    );
    assert!(s.list_all("").await.is_empty(), "nothing stored");
}

#[tokio::test]
async fn concurrent_submits_racing_for_the_last_gpus_exactly_the_right_number_win() {
    let s = TestServer::start_with(|c| world(c, 3, 3, 3, 100)).await;
    // 9 GPUs; each batch takes 3 (driver + 2 executors), on demand.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..20 {
        let http = s.http.clone();
        let url = format!("{}?batchId=racer-{i:02}", s.batches());
        set.spawn(async move {
            let r = http
                .post(url)
                .json(&on_demand_batch(2))
                .send()
                .await
                .expect("create");
            assert_eq!(r.status(), 200);
        });
    }
    while set.join_next().await.is_some() {}
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let all = s.list_all("").await;
        let decided = all
            .iter()
            .filter(|b| b["flexq"]["provisioningState"] != "QUEUED")
            .count();
        if decided == 20 {
            let won = all
                .iter()
                .filter(|b| b["flexq"]["provisioningState"] == "PROVISIONED")
                .count();
            let lost = all.iter().filter(|b| b["state"] == "FAILED").count();
            assert_eq!((won, lost), (3, 17));
            break;
        }
        assert!(Instant::now() < deadline, "not all decided");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gpu_usage(&s).await.1, 9);
}

#[tokio::test]
async fn validate_only_gives_the_verdict_and_stores_nothing() {
    let s = TestServer::start_with(|c| world(c, 1, 4, 4, 24)).await;
    let (st, v) = s.create("validateOnly=true", &gpu_batch(2, "60s")).await;
    assert_eq!(st, 200, "{v:#}");
    assert_eq!(v["verdict"], "ALLOCATE_NOW");
    assert_eq!(v["zone"], "us-central1-a");
    let (_, v) = s.create("validateOnly=true", &gpu_batch(8, "60s")).await;
    assert_eq!(v["verdict"], "WOULD_QUEUE");
    assert!(
        v["reasons"][0]
            .as_str()
            .expect("reason")
            .contains("has room for 4"),
        "{v:#}"
    );
    let (_, v) = s.create("validateOnly=true", &gpu_batch(30, "60s")).await;
    assert_eq!(v["verdict"], "NEVER_FITS");
    let (_, v) = s.create("validateOnly=true", &on_demand_batch(8)).await;
    assert_eq!(v["verdict"], "WOULD_FAIL");
    assert!(
        v["reasons"][0]
            .as_str()
            .expect("reason")
            .contains("stock-out"),
        "{v:#}"
    );
    let (st, err) = s.create("validateOnly=maybe", &gpu_batch(2, "60s")).await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    // A batch with violations is refused for all of them first, whatever
    // validateOnly says.
    let (st, err) = s
        .create("validateOnly=maybe", &gpu_batch(2, "not-a-duration"))
        .await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    assert_eq!(
        err["error"]["details"][0]["reason"], "INVALID_BATCH",
        "{err:#}"
    );
    assert!(s.list_all("").await.is_empty());
}

#[tokio::test]
async fn quotas_and_capacity_are_visible_and_limits_can_change() {
    let s = TestServer::start_with(|c| world(c, 2, 4, 4, 24)).await;
    let (st, q) = s.get("/v1/projects/demo/regions/us-central1/quotas").await;
    assert_eq!(st, 200);
    assert!(q["quotas"].as_array().expect("list").iter().any(|m| m == &json!({"metric": "PREEMPTIBLE_NVIDIA_L4_GPUS", "limit": 24, "usage": 0})), "{q:#}");
    let (_, r) = s.get("/v1/regions").await;
    assert_eq!(r["capacity"][0]["totalGpus"], 8);
    assert_eq!(r["capacity"][0]["virtualNodes"], 2);
    let (_, n) = s.get("/v1/nodes").await;
    assert_eq!(n["nodes"].as_array().expect("nodes").len(), 2);
    assert_eq!(n["nodes"][0]["virtual"], true);

    // A queued batch waits for quota; raising the limit admits it.
    let resp = s
        .http
        .patch(s.url("/v1/projects/demo/regions/us-central1/quotas"))
        .json(&json!({"metric": "PREEMPTIBLE_NVIDIA_L4_GPUS", "limit": 5}))
        .send()
        .await
        .expect("patch");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        s.create("batchId=quota-holder", &gpu_batch(2, "3600s"))
            .await
            .0,
        200
    );
    until(&s, "quota-holder", "provisioned", |b| {
        provisioning(b) == "PROVISIONED"
    })
    .await;
    assert_eq!(
        s.create("batchId=quota-wait", &gpu_batch(2, "3600s"))
            .await
            .0,
        200
    );
    let b = until(&s, "quota-wait", "explained", |b| {
        !b["flexq"]["notAdmittedReasons"]
            .as_array()
            .is_none_or(Vec::is_empty)
    })
    .await;
    assert_eq!(b["flexq"]["provisioningState"], "QUEUED");
    assert_eq!(
        b["flexq"]["notAdmittedReasons"][0],
        "needs 3 PREEMPTIBLE_NVIDIA_L4_GPUS, project has 2 free of 5"
    );
    let resp = s
        .http
        .patch(s.url("/v1/projects/demo/regions/us-central1/quotas"))
        .json(&json!({"metric": "PREEMPTIBLE_NVIDIA_L4_GPUS", "limit": 6}))
        .send()
        .await
        .expect("patch");
    assert_eq!(resp.status(), 200);
    until(&s, "quota-wait", "provisioned", |b| {
        provisioning(b) == "PROVISIONED"
    })
    .await;

    for (body, field) in [
        (json!({"metric": "H100_GPUS", "limit": 1}), "metric"),
        (json!({"metric": "NVIDIA_L4_GPUS", "limit": -1}), "limit"),
        (
            json!({"metric": "NVIDIA_L4_GPUS", "limit": "lots"}),
            "limit",
        ),
    ] {
        let resp = s
            .http
            .patch(s.url("/v1/projects/demo/regions/us-central1/quotas"))
            .json(&body)
            .send()
            .await
            .expect("patch");
        let st = resp.status().as_u16();
        let err: Value = resp.json().await.expect("json");
        assert_status(st, &err, 400, "INVALID_ARGUMENT");
        assert_eq!(
            err["error"]["details"][1]["fieldViolations"][0]["field"],
            field
        );
    }
    let (st, err) = s.get("/v1/projects/demo/regions/mars-1/quotas").await;
    assert_status(st, &err, 404, "NOT_FOUND");
}

#[tokio::test]
async fn a_deadline_that_passes_while_flexq_is_down_fails_the_batch_never_allocates_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("small.toml");
    virtual_l4_config(&config, 1);
    let mut server = ServerProcess::start_with(dir.path(), Some(&config)).await;
    // 1 + 5 GPUs; one virtual node has 4: it waits, 2s at most.
    assert_eq!(server.create("outage", &gpu_batch(5, "2s")).await, 200);
    assert_eq!(server.create("survivor", &gpu_batch(5, "3600s")).await, 200);
    server.kill9();
    tokio::time::sleep(Duration::from_millis(2500)).await;

    // Back with room for both: the expired one must still fail.
    virtual_l4_config(&config, 4);
    let server = ServerProcess::start_with(dir.path(), Some(&config)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (a, b) = (server.batch("outage").await, server.batch("survivor").await);
        if a["state"] == "FAILED" && b["flexq"]["provisioningState"] == "PROVISIONED" {
            assert_eq!(a["flexq"]["provisioningState"], "EXPIRED");
            assert!(
                a["stateMessage"]
                    .as_str()
                    .expect("msg")
                    .contains("allocation timeout of 2s"),
                "{a:#}"
            );
            break;
        }
        assert_ne!(
            a["flexq"]["provisioningState"], "PROVISIONED",
            "allocated after its deadline"
        );
        assert!(Instant::now() < deadline, "{a:#} {b:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_cluster_whose_nodes_left_the_config_fails_at_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("nodes.toml");
    virtual_l4_config(&config, 2);
    let mut server = ServerProcess::start_with(dir.path(), Some(&config)).await;
    assert_eq!(server.create("orphan", &gpu_batch(2, "3600s")).await, 200);
    let t = Instant::now();
    while server.batch("orphan").await["flexq"]["provisioningState"] != "PROVISIONED" {
        assert!(t.elapsed() < Duration::from_secs(20), "never provisioned");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill9();
    virtual_l4_config(&config, 0);
    let server = ServerProcess::start_with(dir.path(), Some(&config)).await;
    // At once on SQLite; on PostgreSQL once the killed server's leader
    // lease has lapsed and the new one leads.
    let t = Instant::now();
    let b = loop {
        let b = server.batch("orphan").await;
        if b["state"] != "PENDING" || t.elapsed() > Duration::from_secs(10) {
            break b;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(b["state"], "FAILED", "{b:#}");
    assert!(
        b["stateMessage"]
            .as_str()
            .expect("msg")
            .contains("no longer declared in the configuration"),
        "{b:#}"
    );
    let q = server
        .get("/v1/projects/demo/regions/us-central1/quotas")
        .await;
    assert!(
        q["quotas"]
            .as_array()
            .expect("quotas")
            .iter()
            .all(|m| m["usage"] == 0),
        "{q:#}"
    );
}
