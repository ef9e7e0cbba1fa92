//! Preemption through the API (SQLite, and PostgreSQL in the suite's
//! second run): an urgent batch stops the right victim, the victim goes
//! back to the queue at its place and runs again, and the batch, its
//! history and the metrics say so. The clusters here are on virtual nodes
//! (no process to wait for: a victim is gone at once); the agent's part,
//! stopping real processes within the grace, is `spark.rs`'s.

use flexq::config::{Config, PreemptionConfig};
use serde_json::{Value, json};

use crate::scheduler::{gpu_batch, world};
use crate::support::{TestServer, until};

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

fn provisioned(b: &Value) -> bool {
    b["flexq"]["provisioningState"] == "PROVISIONED"
}

fn history(b: &Value) -> Vec<String> {
    b["stateHistory"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h["stateMessage"].as_str())
        .chain(b["stateMessage"].as_str())
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn an_urgent_batch_preempts_the_latest_lower_one_which_requeues_and_runs_again() {
    let s = TestServer::start_with(preempting).await;
    // Two clusters of 3 GPUs (a driver and two executors) leave 2 of the
    // 8 GPUs free.
    for id in ["first", "second"] {
        let (status, body) = s
            .create(&format!("batchId={id}"), &gpu_batch(2, "3600s"))
            .await;
        assert_eq!(status, 200, "{body:#}");
        until(&s, &format!("{BATCHES}/{id}"), "provisioned", provisioned).await;
    }
    // 3 GPUs more at priority 10: one victim is enough. Validate-only
    // says whom it would preempt.
    let mut urgent = gpu_batch(2, "3600s");
    urgent["labels"] = json!({"flexq-priority": "10"});
    let (status, v) = s.create("batchId=urgent&validateOnly=true", &urgent).await;
    assert_eq!(status, 200, "{v:#}");
    assert_eq!(v["verdict"], "WOULD_QUEUE", "{v:#}");
    assert!(
        v["preemption"]
            .as_str()
            .is_some_and(|p| p
                .starts_with("would preempt second (priority 10 > 0) (3 GPUs) in us-central1-a")),
        "{v:#}"
    );
    let (status, body) = s.create("batchId=urgent", &urgent).await;
    assert_eq!(status, 200, "{body:#}");
    let u = until(&s, &format!("{BATCHES}/urgent"), "provisioned", provisioned).await;
    assert!(
        history(&u)
            .iter()
            .any(|m| m.starts_with("Preempting second (3 GPUs) in us-central1-a")),
        "{:#?}",
        history(&u)
    );

    // The victim is the one started last, back in the queue at its place.
    let (_, v) = s.get(&format!("{BATCHES}/second")).await;
    assert_eq!(v["state"], "PENDING", "{v:#}");
    assert_eq!(v["flexq"]["provisioningState"], "QUEUED", "{v:#}");
    assert_eq!(v["flexq"]["preemptions"], 1, "{v:#}");
    assert_eq!(v["flexq"]["attempt"], 2, "{v:#}");
    let said = history(&v);
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
    let (_, first) = s.get(&format!("{BATCHES}/first")).await;
    assert!(provisioned(&first), "the other cluster runs on: {first:#}");

    let text = s.scrape().await;
    let n = crate::metrics::value(
        &text,
        "flexq_preemptions_total",
        &[
            ("region", "us-central1"),
            ("project", "demo"),
            ("cause", "priority"),
        ],
    );
    // (The registry is the test process's: other tests count too.)
    assert!(n.is_some_and(|n| n >= 1.0), "flexq_preemptions_total {n:?}");

    // The usage report counts the victim's held time as work lost.
    let (_, usage) = s.get("/v1/projects/demo/regions/us-central1/usage").await;
    let lost = usage["total"]["lostGpuHours"]
        .as_f64()
        .expect("lostGpuHours");
    let held = usage["total"]["gpuHours"].as_f64().expect("gpuHours");
    assert!(lost > 0.0 && lost < held, "{usage:#}");

    // Once the urgent batch is done, the victim gets its GPUs back.
    let (status, body) = s
        .post(&format!(
            "/v1/{}:cancel",
            u["operation"].as_str().expect("op")
        ))
        .await;
    assert_eq!(status, 200, "{body:#}");
    let v = until(
        &s,
        &format!("{BATCHES}/second"),
        "provisioned again",
        provisioned,
    )
    .await;
    assert_eq!(v["flexq"]["preemptions"], 1, "{v:#}");
    // Preempted max_preemptions (1) times: protected, and counted so.
    let protected = crate::metrics::value(
        &s.scrape().await,
        "flexq_preemption_protected_clusters",
        &[("region", "us-central1")],
    );
    assert_eq!(protected, Some(1.0));
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
    // The holder has run less than its hour of min_runtime: nothing moves.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
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
