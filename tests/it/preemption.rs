//! Preemption through the API (SQLite, and PostgreSQL in the suite's
//! second run): an urgent batch stops the right victim, the victim goes
//! back to the queue at its place and runs again, and the batch, its
//! history and the metrics say so. The clusters here are on virtual nodes
//! (no process to wait for: a victim is gone at once); the agent's part,
//! stopping real processes within the grace, is `spark.rs`'s.

use flexq::config::{Config, PreemptionConfig};
use serde_json::{Value, json};

use crate::scheduler::{gpu_batch, on_demand_batch, world};
use crate::support::{TestServer, provisioned, state_messages, until};

const BATCHES: &str = "/v1/projects/demo/locations/us-central1/batches";

/// us-central1: two virtual L4 nodes of 4 GPUs in us-central1-a;
/// preemption on by priority, with no minimum runtime; a batch preempted
/// once is never a victim again.
pub(crate) fn preempting(c: &mut Config) {
    world(c, 2, 4, 2, 100);
    c.regions.get_mut("us-central1").expect("region").preemption = Some(PreemptionConfig {
        enabled: true,
        min_runtime: std::time::Duration::ZERO,
        max_preemptions: 1,
        ..PreemptionConfig::default()
    });
}

/// Creates a batch of 3 GPUs (a driver and two executors) under each of
/// `ids` among `batches` (one project's batches in us-central1), each
/// waited on until it is provisioned before the next is created.
async fn provision_clusters(s: &TestServer, batches: &str, ids: &[&str]) {
    for id in ids {
        let (status, body) = s
            .post_json(&format!("{batches}?batchId={id}"), &gpu_batch(2, "3600s"))
            .await;
        assert_eq!(status, 200, "{body:#}");
        until(s, &format!("{batches}/{id}"), "provisioned", provisioned).await;
    }
}

/// Creates `urgent` as the batch `urgent` among `batches`, waits until it
/// is provisioned, and checks that its history tells of the preemption it
/// made, in a message starting with `preempting`; returns the batch.
async fn provision_preemptor(
    s: &TestServer,
    batches: &str,
    urgent: &Value,
    preempting: &str,
) -> Value {
    let (status, body) = s
        .post_json(&format!("{batches}?batchId=urgent"), urgent)
        .await;
    assert_eq!(status, 200, "{body:#}");
    let u = until(s, &format!("{batches}/urgent"), "provisioned", provisioned).await;
    assert!(
        state_messages(&u).iter().any(|m| m.starts_with(preempting)),
        "{:#?}",
        state_messages(&u)
    );
    u
}

/// Cancels the preemptor `u` and waits until its victim, at `victim`, is
/// provisioned again (`what` names what is waited for); returns the
/// victim.
async fn cancel_until_reprovisioned(s: &TestServer, u: &Value, victim: &str, what: &str) -> Value {
    s.cancel(u).await;
    until(s, victim, what, provisioned).await
}

/// The project of the test that counts a preemption: the counter is the
/// test process's, and its series of this project is this test's alone.
const URGENT_PROJECT: &str = "preempts-the-latest";

#[tokio::test]
async fn an_urgent_batch_preempts_the_latest_lower_one_which_requeues_and_runs_again() {
    let s = TestServer::start_with(preempting).await;
    let batches = format!("/v1/projects/{URGENT_PROJECT}/locations/us-central1/batches");
    let preemptions = |text: &str| {
        crate::metrics::value(
            text,
            "flexq_preemptions_total",
            &[
                ("region", "us-central1"),
                ("project", URGENT_PROJECT),
                ("cause", "priority"),
            ],
        )
        .unwrap_or(0.0)
    };
    let before = preemptions(&s.scrape().await);
    // Two clusters of 3 GPUs (a driver and two executors) leave 2 of the
    // 8 GPUs free.
    provision_clusters(&s, &batches, &["first", "second"]).await;
    // 3 GPUs more at priority 10: one victim is enough. Validate-only
    // says whom it would preempt.
    let mut urgent = gpu_batch(2, "3600s");
    urgent["labels"] = json!({"flexq-priority": "10"});
    let (status, v) = s
        .post_json(
            &format!("{batches}?batchId=urgent&validateOnly=true"),
            &urgent,
        )
        .await;
    assert_eq!(status, 200, "{v:#}");
    assert_eq!(v["verdict"], "WOULD_QUEUE", "{v:#}");
    assert!(
        v["preemption"]
            .as_str()
            .is_some_and(|p| p
                .starts_with("would preempt second (priority 10 > 0) (3 GPUs) in us-central1-a")),
        "{v:#}"
    );
    let u = provision_preemptor(
        &s,
        &batches,
        &urgent,
        "Preempting second (3 GPUs) in us-central1-a",
    )
    .await;

    // The victim is the one started last, back in the queue at its place.
    let (_, v) = s.get(&format!("{batches}/second")).await;
    assert_eq!(v["state"], "PENDING", "{v:#}");
    assert_eq!(v["flexq"]["provisioningState"], "QUEUED", "{v:#}");
    assert_eq!(v["flexq"]["preemptions"], 1, "{v:#}");
    assert_eq!(v["flexq"]["attempt"], 2, "{v:#}");
    assert_eq!(v["flexq"]["requeueReason"], "PREEMPTED", "{v:#}");
    // Its operation says so too, typed reason first.
    let (_, op) = s
        .get(&format!("/v1/{}", v["operation"].as_str().expect("op")))
        .await;
    assert!(
        op["metadata"]["warnings"][0]
            .as_str()
            .is_some_and(|w| w.starts_with("PREEMPTED: ")),
        "{op:#}"
    );
    let said = state_messages(&v);
    assert!(
        said.iter()
            .any(|m| m.starts_with("PREEMPTED by urgent (priority 10 > 0)")),
        "{said:#?}"
    );
    assert!(
        said.iter()
            .any(|m| m.starts_with("Requeued after preemption by urgent")),
        "{said:#?}"
    );
    let (_, first) = s.get(&format!("{batches}/first")).await;
    assert!(provisioned(&first), "the other cluster runs on: {first:#}");

    // One victim, counted once under its project and cause.
    assert_eq!(
        preemptions(&s.scrape().await) - before,
        1.0,
        "flexq_preemptions_total of {URGENT_PROJECT}"
    );

    // The usage report counts the victim's held time as work lost.
    let (_, usage) = s
        .get(&format!(
            "/v1/projects/{URGENT_PROJECT}/regions/us-central1/usage"
        ))
        .await;
    let lost = usage["total"]["lostGpuHours"]
        .as_f64()
        .expect("lostGpuHours");
    let held = usage["total"]["gpuHours"].as_f64().expect("gpuHours");
    assert!(lost > 0.0 && lost < held, "{usage:#}");

    // Once the urgent batch is done, the victim gets its GPUs back.
    let v =
        cancel_until_reprovisioned(&s, &u, &format!("{batches}/second"), "provisioned again").await;
    assert_eq!(v["flexq"]["preemptions"], 1, "{v:#}");
    // Preempted max_preemptions (1) times: protected, and counted so.
    let text = s.scrape().await;
    let protected = crate::metrics::value(
        &text,
        "flexq_preemption_protected_clusters",
        &[("region", "us-central1")],
    );
    assert_eq!(protected, Some(1.0));
    // Its second run counted no second preemption.
    assert_eq!(preemptions(&text) - before, 1.0, "after the second run");
}

#[tokio::test]
async fn a_cluster_younger_than_min_runtime_is_left_alone_and_a_bad_opt_out_is_refused() {
    let s = TestServer::start_with(|c| {
        preempting(c);
        if let Some(p) = c
            .regions
            .get_mut("us-central1")
            .and_then(|r| r.preemption.as_mut())
        {
            p.min_runtime = std::time::Duration::from_secs(3600);
        }
    })
    .await;
    let (status, _) = s.create("batchId=holder", &gpu_batch(7, "3600s")).await;
    assert_eq!(status, 200);
    until(&s, &format!("{BATCHES}/holder"), "provisioned", provisioned).await;
    let mut urgent = gpu_batch(2, "3600s");
    urgent["labels"] = json!({"flexq-priority": "10"});
    let (status, _) = s.create("batchId=urgent", &urgent).await;
    assert_eq!(status, 200);
    // A pass has weighed the urgent batch once a default-mode batch created
    // after it has failed for want of room: only a pass ends a batch so,
    // and a pass walks a region's whole queue while a default-mode batch
    // is in it (the urgent one first, by priority). Its commit is seen
    // whole: a preemption it decided would show now.
    let (status, _) = s.create("batchId=probe", &on_demand_batch(2)).await;
    assert_eq!(status, 200);
    let probe = until(&s, &format!("{BATCHES}/probe"), "failed", |b| {
        b["state"] == "FAILED"
    })
    .await;
    assert_eq!(probe["flexq"]["endReason"], "STOCK_OUT", "{probe:#}");
    // The holder has run less than its hour of min_runtime: nothing moves.
    let (_, h) = s.get(&format!("{BATCHES}/holder")).await;
    assert!(provisioned(&h), "{h:#}");
    assert!(h["flexq"].get("preemptions").is_none(), "{h:#}");
    let (_, u) = s.get(&format!("{BATCHES}/urgent")).await;
    assert_eq!(u["flexq"]["provisioningState"], "QUEUED", "{u:#}");
    // Why it waits says when a cluster could give way.
    assert!(
        u["flexq"]["notAdmittedReasons"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|r| r.starts_with(
                "no cluster can give way yet: the first that could reaches min_runtime (1h) at"
            )),
        "{u:#}"
    );

    // A value of spark.flexq.preemptible other than true or false is
    // refused, naming the property.
    let mut bad = gpu_batch(2, "3600s");
    bad["runtimeConfig"]["properties"]["spark.flexq.preemptible"] = json!("maybe");
    let (status, body) = s.create("batchId=bad", &bad).await;
    assert_eq!(status, 400, "{body:#}");
    assert!(
        body.to_string()
            .contains("runtime_config.properties[spark.flexq.preemptible]"),
        "{body:#}"
    );
}

/// A preemptor cancelled while its victim stops: the victim stops anyway
/// and goes back to the queue at its place, and the GPUs set aside go
/// back to the queue, never to the cancelled batch. The node is
/// registered through the agent protocol and this test acts as its agent,
/// so the victim's driver stops only when the test says so.
#[tokio::test]
async fn a_preemptor_cancelled_while_its_victim_stops_leaves_the_gpus_to_the_queue() {
    let s = TestServer::start_with(|c| {
        crate::support::no_virtual_nodes(c);
        c.agents.lease_duration = std::time::Duration::from_secs(60);
        c.regions.get_mut("us-central1").expect("region").preemption = Some(PreemptionConfig {
            enabled: true,
            min_runtime: std::time::Duration::ZERO,
            max_preemptions: 1,
            ..PreemptionConfig::default()
        });
    })
    .await;
    // One node of 8 L4 GPUs: the victim takes 5.
    let node = "gpu-host-1";
    let epoch = crate::agents::register(&s, node).await;
    let (status, body) = s.create("batchId=victim", &gpu_batch(4, "3600s")).await;
    assert_eq!(status, 200, "{body:#}");
    let v = until(&s, &format!("{BATCHES}/victim"), "provisioned", provisioned).await;
    let uuid = v["uuid"].as_str().expect("uuid").to_string();
    let report = |event: Value| {
        let mut body = event;
        body["epoch"] = json!(epoch);
        body["uuid"] = json!(uuid);
        body
    };
    let (status, body) = s
        .post_json(
            &format!("/v1/nodes/{node}:report"),
            &report(json!({"event": "DRIVER_STARTED", "rapids": "enabled"})),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");

    // 5 GPUs more at priority 10: the 3 free ones are set aside for it,
    // and the victim's 5 once it is gone.
    let mut urgent = gpu_batch(4, "3600s");
    urgent["labels"] = json!({"flexq-priority": "10"});
    let (status, body) = s.create("batchId=urgent", &urgent).await;
    assert_eq!(status, 200, "{body:#}");
    let v = until(&s, &format!("{BATCHES}/victim"), "preempting", |b| {
        b["flexq"]["preempting"] == true
    })
    .await;
    assert_eq!(
        v["state"], "RUNNING",
        "it runs until its driver stops: {v:#}"
    );
    // Its agent is told to stop it, with the grace to do it in.
    let (_, answer) = crate::agents::poll(&s, node, &epoch, "", "1s").await;
    let parts = answer["assignments"].as_array().expect("assignments");
    assert!(
        parts
            .iter()
            .all(|a| a["uuid"] == uuid.as_str() && a["action"] == "STOP"),
        "only the victim, stopping: {answer:#}"
    );
    assert!(
        parts
            .iter()
            .all(|a| a["stopGraceSeconds"].as_u64() > Some(0)),
        "{answer:#}"
    );
    let (_, u) = s.get(&format!("{BATCHES}/urgent")).await;
    assert_eq!(u["flexq"]["provisioningState"], "QUEUED", "{u:#}");

    // The preemptor is cancelled before the victim is gone.
    s.cancel(&u).await;
    let (_, u) = s.get(&format!("{BATCHES}/urgent")).await;
    assert_eq!(u["state"], "CANCELLED", "{u:#}");
    // What was set aside for it is free again: a batch of 3 GPUs runs on
    // it while the victim still stops.
    let (status, body) = s.create("batchId=third", &gpu_batch(2, "3600s")).await;
    assert_eq!(status, 200, "{body:#}");
    let third = until(&s, &format!("{BATCHES}/third"), "provisioned", provisioned).await;
    let (_, v) = s.get(&format!("{BATCHES}/victim")).await;
    assert_eq!(v["flexq"]["preempting"], true, "{v:#}");

    // The victim's driver ends on its SIGTERM: it goes back to the queue
    // and, the node being free, gets its GPUs again.
    let (status, body) = s
        .post_json(
            &format!("/v1/nodes/{node}:report"),
            &report(json!({
                "event": "FINISHED", "succeeded": false, "exitCode": 143,
                "message": "The driver exited with status 143 (SIGTERM)"
            })),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    let v = until(&s, &format!("{BATCHES}/victim"), "provisioned again", |b| {
        provisioned(b) && b["flexq"]["attempt"] == 2
    })
    .await;
    assert_eq!(v["flexq"]["requeueReason"], "PREEMPTED", "{v:#}");
    assert_eq!(v["flexq"]["preempting"], Value::Null, "{v:#}");
    let (_, answer) = crate::agents::poll(&s, node, &epoch, "", "1s").await;
    let parts = answer["assignments"].as_array().expect("assignments");
    assert_eq!(parts.len(), 8, "{answer:#}");
    assert!(
        parts
            .iter()
            .all(|a| a["action"] == "RUN"
                && (a["uuid"] == uuid.as_str() || a["uuid"] == third["uuid"])),
        "the victim runs again beside the third batch, nothing of the cancelled one: {answer:#}"
    );
    let (_, nodes) = s.get("/v1/nodes").await;
    assert_eq!(nodes["nodes"][0]["freeGpus"], 0, "{nodes:#}");
    let (_, u) = s.get(&format!("{BATCHES}/urgent")).await;
    assert_eq!(u["state"], "CANCELLED", "{u:#}");
    assert!(u["flexq"].get("allocateTime").is_none(), "{u:#}");
}

/// The names of the demo project's queued batches in us-central1, in the
/// region's order, each with its queue time.
async fn queue(s: &TestServer) -> Vec<(String, Value)> {
    let (status, page) = s
        .get("/v1/projects/demo/regions/us-central1/queue/entries")
        .await;
    assert_eq!(status, 200, "{page:#}");
    page["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            let name = e["name"].as_str().expect("name");
            let id = name.rsplit('/').next().unwrap_or_default().to_string();
            (id, e["queueTime"].clone())
        })
        .collect()
}

fn time(t: &Value) -> chrono::DateTime<chrono::FixedOffset> {
    t.as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .unwrap_or_else(|| panic!("a time: {t}"))
}

/// The victim goes back to the queue at its place: its queue time is its
/// create time, not the time of its requeue, so a batch of the same
/// project and shape created after it (and waiting since) stays behind
/// it, and the GPUs that free go to the victim first.
#[tokio::test]
async fn a_preempted_batch_goes_back_ahead_of_batches_created_after_it() {
    let s = TestServer::start_with(preempting).await;
    // Two clusters of 3 GPUs leave 2 of the 8 free; the victim is the one
    // started last.
    provision_clusters(&s, BATCHES, &["older", "victim"]).await;
    // The same shape, created after the victim: it waits, first in the
    // queue (at the same priority it preempts no one).
    let (status, body) = s.create("batchId=competitor", &gpu_batch(2, "3600s")).await;
    assert_eq!(status, 200, "{body:#}");
    let queued = |b: &Value| b["flexq"]["queuePosition"].is_number();
    let c = until(&s, &format!("{BATCHES}/competitor"), "queued", queued).await;
    assert_eq!(c["flexq"]["queuePosition"], 1, "{c:#}");

    // 3 GPUs at priority 10: the victim gives way.
    let mut urgent = gpu_batch(2, "3600s");
    urgent["labels"] = json!({"flexq-priority": "10"});
    let u = provision_preemptor(&s, BATCHES, &urgent, "Preempting victim (3 GPUs)").await;

    // Requeued after the competitor was created, it is still ahead of it:
    // in a get, and in the queue's page, with its create time as its
    // queue time.
    let v = until(&s, &format!("{BATCHES}/victim"), "queued again", |b| {
        b["flexq"]["attempt"] == 2 && queued(b)
    })
    .await;
    assert_eq!(v["flexq"]["requeueReason"], "PREEMPTED", "{v:#}");
    assert_eq!(v["flexq"]["queuePosition"], 1, "{v:#}");
    let (_, c) = s.get(&format!("{BATCHES}/competitor")).await;
    assert_eq!(c["flexq"]["queuePosition"], 2, "{c:#}");
    let order = queue(&s).await;
    let names: Vec<&str> = order.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(names, ["victim", "competitor"], "{order:#?}");
    assert_eq!(
        time(&order[0].1),
        time(&v["createTime"]),
        "{order:#?} {v:#}"
    );
    assert!(
        time(&order[0].1) < time(&c["createTime"]),
        "{order:#?} {c:#}"
    );

    // Room for one cluster of 3 again: the victim gets it, the competitor
    // waits on, now first.
    let v = cancel_until_reprovisioned(
        &s,
        &u,
        &format!("{BATCHES}/victim"),
        "provisioned again (ahead of the competitor)",
    )
    .await;
    assert_eq!(v["flexq"]["attempt"], 2, "{v:#}");
    let (_, c) = s.get(&format!("{BATCHES}/competitor")).await;
    assert_eq!(c["flexq"]["provisioningState"], "QUEUED", "{c:#}");
    assert_eq!(c["flexq"]["queuePosition"], 1, "{c:#}");
}
