//! Preemption, and the reclaim of a loan, across a leader failover: the
//! leader decides it and dies while the victim's processes stop; the
//! replica that takes over finishes it from the store (the victim back in
//! the queue at its place, PREEMPTED or RECLAIMED, the preemptor
//! allocated) and no GPU is ever held twice. The
//! node is registered through the agent protocol and this test is its
//! agent, so the victim stops only when the test says so.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flexq::config::Config;
use serde_json::{Value, json};

use super::{CORES, MEMORY_MB, Pair, SSD_GB, audit, gpu_batch, leader_and_follower, leads_within};
use crate::support::{provisioned, state_messages};

const BATCHES: &str = "/v1/projects/demo/locations/us-central1/batches";
const NODE: &str = "gpu-host-1";

/// No virtual node: the test's agent registers the only one. Preemption
/// on in us-central1 by priority, at once. The default quotas.
fn agents_only(dir: &Path) -> PathBuf {
    let path = dir.join("preemption.toml");
    let config = Config::load_without_env(None).expect("default config");
    let text = format!(
        "{}[regions.us-central1.preemption]\nenabled = true\nmin_runtime = \"0s\"\n\
         [agents]\nlease_duration = \"60s\"\n",
        config.virtual_nodes_only("us-central1-a", "l4", 0)
    );
    std::fs::write(&path, text).expect("config");
    path
}

async fn post(endpoint: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{endpoint}{path}"))
        .json(body)
        .send()
        .await
        .expect("post");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn get(endpoint: &str, path: &str) -> Value {
    reqwest::get(format!("{endpoint}{path}"))
        .await
        .expect("get")
        .json()
        .await
        .expect("json")
}

async fn until(endpoint: &str, id: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let path = format!("{BATCHES}/{id}");
    crate::support::poll(Duration::from_secs(20), || get(endpoint, &path), ok)
        .await
        .unwrap_or_else(|b| panic!("{id} never {what}: {b:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preemption_the_leader_began_is_finished_by_the_next_one() {
    let Pair {
        leader: mut r0,
        follower: r1,
        guards: _guards,
    } = leader_and_follower(agents_only).await;
    let (status, reg) = post(
        &r0.endpoint,
        "/v1/nodes:register",
        &json!({
            "nodeId": NODE, "region": "us-central1", "zone": "us-central1-a", "pool": "l4",
            "gpuAddresses": ["0", "1", "2", "3"],
            "cores": CORES, "memoryMb": MEMORY_MB, "localSsdGb": SSD_GB
        }),
    )
    .await;
    assert_eq!(status, 200, "{reg:#}");
    let epoch = reg["epoch"].as_str().expect("epoch").to_string();

    // The victim takes 3 of the node's 4 GPUs and runs.
    let (status, body) = post(
        &r0.endpoint,
        &format!("{BATCHES}?batchId=victim"),
        &gpu_batch(2, "600s"),
    )
    .await;
    assert_eq!(status, 200, "{body:#}");
    let v = until(&r0.endpoint, "victim", "provisioned", provisioned).await;
    let victim = v["uuid"].as_str().expect("uuid").to_string();
    let report = |uuid: &str, event: Value| {
        let mut body = event;
        body["epoch"] = json!(epoch);
        body["uuid"] = json!(uuid);
        body
    };
    let report_path = format!("/v1/nodes/{NODE}:report");
    let (status, body) = post(
        &r0.endpoint,
        &report_path,
        &report(
            &victim,
            json!({"event": "DRIVER_STARTED", "rapids": "enabled"}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body:#}");

    // An urgent batch of 3 GPUs, created on the follower: the leader
    // decides to preempt the victim, which stops.
    let mut urgent = gpu_batch(2, "600s");
    urgent["labels"] = json!({"flexq-priority": "10"});
    assert_eq!(r1.create("urgent", &urgent).await, 200);
    until(&r1.endpoint, "victim", "preempting", |b| {
        b["flexq"]["preempting"] == true
    })
    .await;

    // The leader dies before the victim's processes are gone.
    r0.kill9();
    leads_within(&r1, Duration::from_secs(10)).await;
    let u = get(&r1.endpoint, &format!("{BATCHES}/urgent")).await;
    assert_eq!(u["flexq"]["provisioningState"], "QUEUED", "{u:#}");
    // The new leader knows what the urgent batch waits for: the victim it
    // preempts (restored from the store), not a preemption to decide.
    assert!(
        u["flexq"]["notAdmittedReasons"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|r| r.starts_with("preempting victim")),
        "{u:#}"
    );
    let v = get(&r1.endpoint, &format!("{BATCHES}/victim")).await;
    assert_eq!(v["flexq"]["preempting"], true, "still stopping: {v:#}");

    // The victim's driver ends on its SIGTERM; the new leader gives the
    // preemptor the node and sends the victim back to the queue.
    let (status, body) = post(
        &r1.endpoint,
        &report_path,
        &report(
            &victim,
            json!({"event": "FINISHED", "succeeded": false, "exitCode": 143,
                   "message": "The driver exited with status 143 (SIGTERM)"}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body:#}");
    until(&r1.endpoint, "urgent", "provisioned", provisioned).await;
    let v = get(&r1.endpoint, &format!("{BATCHES}/victim")).await;
    assert_eq!(v["state"], "PENDING", "{v:#}");
    assert_eq!(v["flexq"]["requeueReason"], "PREEMPTED", "{v:#}");
    assert_eq!(v["flexq"]["preemptions"], 1, "{v:#}");
    // One preemption, decided once: the new leader took it over from
    // the store, it did not decide it again.
    let said = |b: &Value, prefix: &str| {
        state_messages(b)
            .iter()
            .filter(|m| m.starts_with(prefix))
            .count()
    };
    assert_eq!(said(&v, "PREEMPTED by urgent"), 1, "{v:#}");
    let u = get(&r1.endpoint, &format!("{BATCHES}/urgent")).await;
    assert_eq!(said(&u, "Preempting victim"), 1, "{u:#}");
    let (status, answer) = post(
        &r1.endpoint,
        &format!("/v1/nodes/{NODE}:poll"),
        &json!({"epoch": epoch, "version": "", "waitFor": "1s"}),
    )
    .await;
    assert_eq!(status, 200, "{answer:#}");
    let urgent_uuid = get(&r1.endpoint, &format!("{BATCHES}/urgent")).await["uuid"].clone();
    let parts = answer["assignments"].as_array().expect("assignments");
    assert!(
        parts.len() == 3
            && parts
                .iter()
                .all(|a| a["uuid"] == urgent_uuid && a["action"] == "RUN"),
        "only the preemptor runs on the node: {answer:#}"
    );

    // The urgent batch runs and ends: the victim runs again, on the new
    // leader.
    let urgent_uuid = urgent_uuid.as_str().expect("uuid");
    for event in [
        json!({"event": "DRIVER_STARTED", "rapids": "enabled"}),
        json!({"event": "FINISHED", "succeeded": true, "message": "done"}),
    ] {
        let (status, body) = post(&r1.endpoint, &report_path, &report(urgent_uuid, event)).await;
        assert_eq!(status, 200, "{body:#}");
    }
    until(&r1.endpoint, "victim", "provisioned again", provisioned).await;
    let quota = Config::load_without_env(None)
        .expect("default config")
        .quotas
        .iter()
        .find(|q| q.metric == flexq::spec::QuotaMetric::PreemptibleNvidiaL4Gpus)
        .map(|q| q.limit as i64)
        .expect("a preemptible L4 quota");
    let clusters = audit(&_guards.0.url, quota)
        .await
        .unwrap_or_else(|e| panic!("the allocation history: {e}"));
    assert_eq!(clusters, 3, "victim, urgent, victim again");
}

/// No virtual node: the test's agent registers an L4 node in
/// us-central1-a and an A100-40 node in us-central1-c. L4 batches may
/// borrow A100-40s at once, and their owners reclaim them at once.
fn loans_at_once(dir: &Path) -> PathBuf {
    let path = dir.join("loans.toml");
    let config = Config::load_without_env(None).expect("default config");
    let text = format!(
        "{}[[alternatives]]\naccelerator = \"l4\"\nrungs = [\"a100-40 after 0s\"]\nreclaim = \"after 0s\"\n\
         [agents]\nlease_duration = \"60s\"\n",
        config.virtual_nodes_only("us-central1-a", "l4", 0)
    );
    std::fs::write(&path, text).expect("config");
    path
}

/// Registers `node` with `gpus` GPUs of `pool` in `zone`; answers its epoch.
async fn register(endpoint: &str, node: &str, zone: &str, pool: &str, shape: [i64; 4]) -> String {
    let [gpus, cores, memory_mb, ssd_gb] = shape;
    let (status, reg) = post(
        endpoint,
        "/v1/nodes:register",
        &json!({
            "nodeId": node, "region": "us-central1", "zone": zone, "pool": pool,
            "gpuAddresses": (0..gpus).map(|i| i.to_string()).collect::<Vec<_>>(),
            "cores": cores, "memoryMb": memory_mb, "localSsdGb": ssd_gb
        }),
    )
    .await;
    assert_eq!(status, 200, "{reg:#}");
    reg["epoch"].as_str().expect("epoch").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_the_leader_began_is_finished_by_the_next_one() {
    let Pair {
        leader: mut r0,
        follower: r1,
        guards: _guards,
    } = leader_and_follower(loans_at_once).await;
    register(
        &r0.endpoint,
        NODE,
        "us-central1-a",
        "l4",
        [4, CORES, MEMORY_MB, SSD_GB],
    )
    .await;
    let a100 = "a100-host-1";
    let a100_epoch = register(
        &r0.endpoint,
        a100,
        "us-central1-c",
        "a100-40",
        [8, 96, 696_320, 6000],
    )
    .await;

    // The L4 node is full; the borrower runs on 3 of the A100s, on loan.
    let (status, body) = post(
        &r0.endpoint,
        &format!("{BATCHES}?batchId=fill"),
        &gpu_batch(3, "600s"),
    )
    .await;
    assert_eq!(status, 200, "{body:#}");
    until(&r0.endpoint, "fill", "provisioned", provisioned).await;
    let (status, body) = post(
        &r0.endpoint,
        &format!("{BATCHES}?batchId=borrower"),
        &gpu_batch(2, "600s"),
    )
    .await;
    assert_eq!(status, 200, "{body:#}");
    let b = until(&r0.endpoint, "borrower", "provisioned", provisioned).await;
    assert_eq!(b["flexq"]["placement"]["loan"], true, "{b:#}");
    let borrower = b["uuid"].as_str().expect("uuid").to_string();
    let report_path = format!("/v1/nodes/{a100}:report");
    let report = |event: Value| {
        let mut body = event;
        body["epoch"] = json!(a100_epoch);
        body["uuid"] = json!(borrower);
        body
    };
    let (status, body) = post(
        &r0.endpoint,
        &report_path,
        &report(json!({"event": "DRIVER_STARTED", "rapids": "enabled"})),
    )
    .await;
    assert_eq!(status, 200, "{body:#}");

    // The A100s' own batch of all 8 GPUs, created on the follower: the
    // leader reclaims the loan, whose processes stop.
    let mut owner = gpu_batch(7, "600s");
    let props = &mut owner["runtimeConfig"]["properties"];
    props["spark.dataproc.driver.resource.accelerator.type"] = json!("a100-40");
    props["spark.dataproc.executor.resource.accelerator.type"] = json!("a100-40");
    props["spark.executor.cores"] = json!("12");
    props["spark.driver.cores"] = json!("12");
    assert_eq!(r1.create("owner", &owner).await, 200);
    until(&r1.endpoint, "borrower", "stopping", |b| {
        b["flexq"]["preempting"] == true
    })
    .await;

    // The leader dies before the loan's processes are gone; the next one
    // finishes the reclaim from the store.
    r0.kill9();
    leads_within(&r1, Duration::from_secs(10)).await;
    let o = get(&r1.endpoint, &format!("{BATCHES}/owner")).await;
    assert_eq!(o["flexq"]["provisioningState"], "QUEUED", "{o:#}");
    let (status, body) = post(
        &r1.endpoint,
        &report_path,
        &report(
            json!({"event": "FINISHED", "succeeded": false, "exitCode": 143,
                       "message": "The driver exited with status 143 (SIGTERM)"}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body:#}");
    let o = until(&r1.endpoint, "owner", "provisioned", provisioned).await;
    assert_eq!(o["flexq"]["zone"], "us-central1-c", "{o:#}");
    let b = get(&r1.endpoint, &format!("{BATCHES}/borrower")).await;
    assert_eq!(b["state"], "PENDING", "{b:#}");
    assert_eq!(b["flexq"]["requeueReason"], "RECLAIMED", "{b:#}");
    // Reclaimed once, by the leader that died: the next did not decide it
    // again.
    let reclaimed = state_messages(&b)
        .iter()
        .filter(|m| m.starts_with("RECLAIMED by demo's batch owner"))
        .count();
    assert_eq!(reclaimed, 1, "{b:#}");
}
