//! Loans and reclaim through the API, on a real `flexq` process (SQLite,
//! and PostgreSQL in the suite's second run): an L4 batch that runs on
//! A100s lent by their owners is reclaimed by an A100 batch once its
//! ladder allows it, goes back to the queue at its place and runs again;
//! with `reclaim = "never"` it is left alone, and a reload changes the
//! rule for the loan already running. The clusters are on virtual nodes
//! (no process to wait for: a reclaimed loan is gone at once).

use serde_json::{Value, json};

use crate::scheduler::gpu_batch;
use crate::support::{ServerProcess, provisioned, state_messages};

/// One virtual L4 node (4 GPUs) in us-central1-a, one virtual A100-40
/// node (8 GPUs) in us-central1-c.
const WORLD: &str = "[regions.us-central1.zones.us-central1-a.node_pools.l4]\nvirtual_nodes = 1\n\
                     [regions.us-central1.zones.us-central1-c.node_pools.a100-40]\nvirtual_nodes = 1\n";

/// L4 batches may run on A100-40s after 1 s; loans reclaimed per `reclaim`.
fn ladder(reclaim: &str) -> String {
    format!(
        "{WORLD}[[alternatives]]\naccelerator = \"l4\"\nrungs = [\"a100-40 after 1s\"]\nreclaim = \"{reclaim}\"\n"
    )
}

/// A batch of its own on A100-40s: a driver and `executors` executors,
/// one GPU each.
fn a100_batch(executors: u32) -> Value {
    let mut b = gpu_batch(executors, "3600s");
    let props = &mut b["runtimeConfig"]["properties"];
    props["spark.dataproc.driver.resource.accelerator.type"] = json!("a100-40");
    props["spark.dataproc.executor.resource.accelerator.type"] = json!("a100-40");
    props["spark.executor.cores"] = json!("12");
    props["spark.driver.cores"] = json!("12");
    b
}

#[tokio::test]
async fn an_owner_takes_its_a100s_back_from_a_loan_once_the_ladder_allows_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("flexq.toml");
    std::fs::write(&file, ladder("never")).expect("config");
    let s = ServerProcess::start_with(dir.path(), Some(&file)).await;
    // The L4 node is full; the next L4 batch borrows A100s after 1 s.
    assert_eq!(s.create("fill", &gpu_batch(3, "3600s")).await, 200);
    s.until("demo", "fill", provisioned).await;
    // validate-only says the rung would be a loan, and never reclaimed.
    let r = reqwest::Client::new()
        .post(format!(
            "{}/v1/projects/demo/locations/us-central1/batches?batchId=probe&validateOnly=true",
            s.endpoint
        ))
        .json(&gpu_batch(2, "3600s"))
        .send()
        .await
        .expect("validate-only create");
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.expect("a verdict");
    assert_eq!(v["alternatives"][0]["loan"], true, "{v:#}");
    assert_eq!(v["alternatives"][0]["reclaim"], "never", "{v:#}");
    assert_eq!(s.create("borrower", &gpu_batch(2, "3600s")).await, 200);
    let b = s.until("demo", "borrower", provisioned).await;
    let placement = &b["flexq"]["placement"];
    assert_eq!(placement["loan"], true, "{b:#}");
    assert_eq!(placement["lender"], "a100-40 in us-central1-c", "{b:#}");
    assert!(
        state_messages(&b)
            .iter()
            .any(|m| m.contains("(on loan: its owners may take it back)")),
        "{:#?}",
        state_messages(&b)
    );
    let loans = [
        ("region", "us-central1"),
        ("zone", "us-central1-c"),
        ("accelerator", "a100-40"),
    ];
    let text = s.scrape().await;
    assert_eq!(
        crate::metrics::value(&text, "flexq_loans_held", &loans),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        crate::metrics::value(&text, "flexq_loan_gpus", &loans),
        Some(3.0),
        "{text}"
    );

    // An A100 batch of all 8 GPUs: its own capacity is on loan, and the
    // ladder says never.
    let status = s.create("owner", &a100_batch(7)).await;
    assert_eq!(status, 200, "{:#}", s.batch("owner").await);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let owner = s.batch("owner").await;
    assert_eq!(owner["flexq"]["provisioningState"], "QUEUED", "{owner:#}");
    assert!(provisioned(&s.batch("borrower").await));

    // A reload allows reclaim after 1 s: it applies to the loan already
    // running, which has run longer than that.
    std::fs::write(&file, ladder("after 1s")).expect("config");
    let (status, body) = s.post("/v1/config:reload").await;
    assert_eq!(status, 200, "{body:#}");
    let owner = s.until("demo", "owner", provisioned).await;
    assert_eq!(owner["flexq"]["zone"], "us-central1-c", "{owner:#}");

    // The borrower went back to the queue at its place: reclaimed, not
    // preempted.
    let b = s
        .until("demo", "borrower", |b| {
            b["flexq"]["provisioningState"] == "QUEUED"
        })
        .await;
    assert_eq!(b["flexq"]["requeueReason"], "RECLAIMED", "{b:#}");
    assert!(
        b["flexq"].get("preemptions").is_none_or(|p| p == 0),
        "{b:#}"
    );
    let said = state_messages(&b);
    assert!(
        said.iter()
            .any(|m| m.starts_with("RECLAIMED by demo's batch owner after ")
                && m.contains("on loan (a100-40 in us-central1-c)")),
        "{said:#?}"
    );
    assert!(
        said.iter()
            .any(|m| m.starts_with("Requeued after its loan was reclaimed by owner")),
        "{said:#?}"
    );
    // The usage report counts the loan's GPU-hours as lost to reclaim,
    // not to preemption.
    let report = s.get("/v1/projects/demo/regions/us-central1/usage").await;
    let a100 = report["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["acceleratorType"] == "a100-40")
        .unwrap_or_else(|| panic!("no a100-40 row: {report:#}"));
    let reclaimed = a100["reclaimedGpuHours"]
        .as_f64()
        .expect("reclaimedGpuHours");
    assert!(reclaimed > 0.0, "{a100:#}");
    assert_eq!(a100["lostGpuHours"], 0.0, "{a100:#}");
    let text = s.scrape().await;
    let demo = [("region", "us-central1"), ("project", "demo")];
    assert_eq!(
        crate::metrics::value(&text, "flexq_reclaims_total", &demo),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        crate::metrics::value(&text, "flexq_loans_held", &loans),
        None,
        "{text}"
    );
}
