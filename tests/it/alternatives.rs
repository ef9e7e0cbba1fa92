//! Placement alternatives through the API: an L4 batch falls back to A100s
//! once its alternative's delay passes, and the batch, its history, validate-only
//! and the metrics say so; a batch that opted out never moves.

use std::collections::BTreeMap;

use flexq::config::{AlternativesConfig, Config, PoolConfig, ZoneConfig};
use flexq::spec::Accelerator;
use serde_json::{Value, json};

use crate::scheduler::{gpu_batch, world};
use crate::support::{TestServer, provisioned, until};

/// us-central1: one virtual L4 node of 4 GPUs in us-central1-a, one
/// virtual A100-40 node of 8 in us-central1-c; L4 batches may take A100s
/// after 1s.
pub(crate) fn l4_and_a100(c: &mut Config) {
    world(c, 1, 4, 1, 100);
    let region = c.regions.get_mut("us-central1").expect("region");
    region.zones.insert(
        "us-central1-c".into(),
        ZoneConfig {
            node_pools: BTreeMap::from([(
                "a100-40".to_string(),
                PoolConfig {
                    accelerator: Accelerator::A100_40,
                    gpus_per_node: 8,
                    cores: 96,
                    memory_mb: 696_320,
                    local_ssd_gb: 6000,
                    max_nodes: 1,
                    virtual_nodes: 1,
                    provisioner: None,
                },
            )]),
        },
    );
    c.quotas.push(flexq::scheduler::QuotaRule {
        project: "*".into(),
        region: "*".into(),
        metric: flexq::spec::QuotaMetric::PreemptibleNvidiaA100Gpus,
        limit: 100,
    });
    c.alternatives = vec![AlternativesConfig {
        accelerator: Some("l4".into()),
        alternatives: vec!["a100-40 after 1s".into()],
        ..AlternativesConfig::default()
    }];
}

const BATCHES: &str = "/v1/projects/demo/locations/us-central1/batches";

#[tokio::test]
async fn an_l4_batch_falls_back_to_a100s_after_its_delay_and_says_so() {
    // A process of its own: the alternative counter (labelled by alternative and GPU
    // types, not by batch or project) moves for this test's batches only,
    // so its counts are exact.
    let s = TestServer::start_process_with(l4_and_a100).await;
    // Fills the L4 node: a driver and 3 executors.
    let (status, _) = s.create("batchId=fill", &gpu_batch(3, "3600s")).await;
    assert_eq!(status, 200);
    until(&s, &format!("{BATCHES}/fill"), "provisioned", provisioned).await;

    // What would happen: queued on L4, and on its alternative it fits now.
    let (status, v) = s
        .create("batchId=probe&validateOnly=true", &gpu_batch(2, "3600s"))
        .await;
    assert_eq!(status, 200, "{v:#}");
    let alternative = &v["alternatives"][0];
    assert_eq!(alternative["rung"], "a100-40 after 1s", "{v:#}");
    assert_eq!(alternative["verdict"], "ALLOCATE_NOW", "{v:#}");
    // Another GPU type is a loan, reclaimed after the default 10 minutes.
    assert_eq!(alternative["loan"], true, "{v:#}");
    assert_eq!(alternative["reclaim"], "after 10m", "{v:#}");
    assert!(
        alternative["cluster"]["shape"]
            .as_str()
            .is_some_and(|s| s.contains("a100-40 (12 cores, 1 GPU")),
        "{v:#}"
    );
    assert_eq!(
        alternative["cluster"]["quota"][0]["metric"], "PREEMPTIBLE_NVIDIA_A100_GPUS",
        "{v:#}"
    );
    // When each could start if queued now: on L4 only once the filling
    // batch's ttl ends (hours away); on its alternative once its 1 s delay passes.
    let start = |x: &Value| {
        let t = x["estimatedStartTime"]
            .as_str()
            .unwrap_or_else(|| panic!("no estimate: {v:#}"));
        chrono::DateTime::parse_from_rfc3339(t)
            .expect("RFC 3339")
            .with_timezone(&chrono::Utc)
            - chrono::Utc::now()
    };
    assert_eq!(v["verdict"], "WOULD_QUEUE", "{v:#}");
    assert!(start(&v) > chrono::Duration::hours(1), "{v:#}");
    let alternative_in = start(alternative);
    assert!(
        alternative_in > chrono::Duration::seconds(-5)
            && alternative_in <= chrono::Duration::seconds(2),
        "{v:#}"
    );

    let (status, _) = s.create("batchId=moves", &gpu_batch(2, "3600s")).await;
    assert_eq!(status, 200);
    let mut stays = gpu_batch(2, "3600s");
    stays["runtimeConfig"]["properties"]["spark.flexq.alternatives"] = json!("none");
    let (status, _) = s.create("batchId=stays", &stays).await;
    assert_eq!(status, 200);

    let b = until(&s, &format!("{BATCHES}/moves"), "provisioned", provisioned).await;
    let placement = &b["flexq"]["placement"];
    assert_eq!(placement["alternative"], 1, "{b:#}");
    assert_eq!(placement["accelerator"], "a100-40", "{b:#}");
    assert_eq!(placement["executorCores"], 12, "{b:#}");
    assert_eq!(b["flexq"]["zone"], "us-central1-c", "{b:#}");
    assert_eq!(b["flexq"]["alternatives"][0], "a100-40 after 1s", "{b:#}");
    let history: Vec<&str> = b["stateHistory"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(|h| h["stateMessage"].as_str())
        .chain(b["stateMessage"].as_str())
        .collect();
    assert!(
        history
            .iter()
            .any(|m| m.starts_with("Allocated on alternative 1, a100-40 in us-central1-c")),
        "{history:#?}"
    );
    // Its operation's metadata and the metrics agree: the filling batch
    // counted once on its own placement, this one once on its alternative.
    let text = s.scrape().await;
    let allocations = |alternative: &str, given: &str| {
        crate::metrics::value(
            &text,
            "flexq_alternative_allocations_total",
            &[("rung", alternative), ("asked", "l4"), ("given", given)],
        )
    };
    assert_eq!(allocations("0", "l4"), Some(1.0), "{text}");
    assert_eq!(allocations("1", "a100-40"), Some(1.0), "{text}");

    // The batch that opted out is still waiting for L4, and says why.
    let (_, b) = s.get(&format!("{BATCHES}/stays")).await;
    assert_eq!(b["flexq"]["provisioningState"], "QUEUED", "{b:#}");
    assert!(b["flexq"].get("alternatives").is_none(), "{b:#}");
}

#[tokio::test]
async fn a_region_alternative_runs_the_batch_in_another_region_of_the_server() {
    let s = TestServer::start_with(|c| {
        world(c, 1, 4, 1, 100);
        // europe-west4-a: one virtual L4 node of 4 GPUs.
        let eu = c.regions.get_mut("europe-west4").expect("europe-west4");
        for zone in eu.zones.values_mut() {
            for pool in zone.node_pools.values_mut() {
                pool.virtual_nodes = 0;
            }
        }
        let pool = eu
            .zones
            .get_mut("europe-west4-a")
            .and_then(|z| z.node_pools.get_mut("l4"))
            .expect("europe-west4-a l4 pool");
        pool.virtual_nodes = 1;
        c.alternatives = vec![AlternativesConfig {
            region: Some("us-central1".into()),
            accelerator: Some("l4".into()),
            alternatives: vec!["region europe-west4 after 1s".into()],
            ..AlternativesConfig::default()
        }];
    })
    .await;
    let (status, _) = s.create("batchId=fill", &gpu_batch(3, "3600s")).await;
    assert_eq!(status, 200);
    until(&s, &format!("{BATCHES}/fill"), "provisioned", provisioned).await;
    let (status, _) = s.create("batchId=abroad", &gpu_batch(2, "3600s")).await;
    assert_eq!(status, 200);
    let b = until(&s, &format!("{BATCHES}/abroad"), "provisioned", provisioned).await;
    assert_eq!(b["flexq"]["placement"]["region"], "europe-west4", "{b:#}");
    assert_eq!(b["flexq"]["zone"], "europe-west4-a", "{b:#}");
    // Still the us-central1 batch it was created as.
    assert!(
        b["name"]
            .as_str()
            .is_some_and(|n| n.contains("/locations/us-central1/")),
        "{b:#}"
    );
}

#[tokio::test]
async fn a_reload_changes_the_alternative_rules_of_batches_created_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("flexq.toml");
    // One virtual L4 node (4 GPUs) in us-central1-a, one virtual A100-40
    // node (8 GPUs) in us-central1-c.
    let world = "[regions.us-central1.zones.us-central1-a.node_pools.l4]\nvirtual_nodes = 1\n\
                 [regions.us-central1.zones.us-central1-c.node_pools.a100-40]\nvirtual_nodes = 1\n";
    std::fs::write(&file, world).expect("config");
    let s = crate::support::ServerProcess::start_with(dir.path(), Some(&file)).await;
    assert_eq!(s.create("fill", &gpu_batch(3, "3600s")).await, 200);
    s.until("demo", "fill", provisioned).await;
    assert_eq!(s.create("before", &gpu_batch(2, "3600s")).await, 200);

    let rule = "[[alternatives]]\naccelerator = \"l4\"\nrungs = [\"a100-40 after 1s\"]\n";
    std::fs::write(&file, format!("{world}{rule}")).expect("config");
    let (status, body) = s.post("/v1/config:reload").await;
    assert_eq!(status, 200, "{body:#}");
    assert_eq!(s.create("after", &gpu_batch(2, "3600s")).await, 200);
    let after = s.until("demo", "after", provisioned).await;
    assert_eq!(
        after["flexq"]["placement"]["accelerator"], "a100-40",
        "{after:#}"
    );
    // A batch's alternatives is fixed at its create: the one queued before the
    // reload has none, and still waits for L4.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let before = s.batch("before").await;
    assert_eq!(before["flexq"]["provisioningState"], "QUEUED", "{before:#}");
    assert!(before["flexq"].get("alternatives").is_none(), "{before:#}");
}

/// The GPUs a provisioned batch's cluster holds, from its `flexq.nodes`.
fn gpus_held(b: &Value) -> f64 {
    b["flexq"]["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|p| p["gpus"].as_array().map_or(0, Vec::len))
        .sum::<usize>() as f64
}

#[tokio::test]
async fn a_batch_on_an_alternative_is_charged_what_it_holds_weighted_and_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("flexq.toml");
    // One virtual L4 node (4 GPUs) in us-central1-a, one virtual A100-40
    // node (8 GPUs) in us-central1-c; an A100-40 GPU counts 3.
    let config = "[scheduling]\ngpu_weights = { \"a100-40\" = 3 }\n\
                  [regions.us-central1.zones.us-central1-a.node_pools.l4]\nvirtual_nodes = 1\n\
                  [regions.us-central1.zones.us-central1-c.node_pools.a100-40]\nvirtual_nodes = 1\n\
                  [[alternatives]]\naccelerator = \"l4\"\nrungs = [\"a100-40 after 1s\"]\n";
    std::fs::write(&file, config).expect("config");
    let mut s = crate::support::ServerProcess::start_with(dir.path(), Some(&file)).await;
    assert_eq!(s.create("fill", &gpu_batch(3, "3600s")).await, 200);
    let fill = s.until("demo", "fill", provisioned).await;
    assert_eq!(s.create("moves", &gpu_batch(2, "3600s")).await, 200);
    let moves = s.until("demo", "moves", provisioned).await;
    assert_eq!(
        moves["flexq"]["placement"]["accelerator"], "a100-40",
        "{moves:#}"
    );
    // Fair share charges the L4s at 1 and the alternative's A100s at 3.
    let expected = gpus_held(&fill) + 3.0 * gpus_held(&moves);
    let labels = [("region", "us-central1"), ("project", "demo")];
    let usage = |text: &str| crate::metrics::value(text, "flexq_fair_share_usage_gpus", &labels);
    assert_eq!(usage(&s.scrape().await), Some(expected));

    // The usage report counts the alternative's GPUs as A100-40s, weighted.
    let report = s.get("/v1/projects/demo/regions/us-central1/usage").await;
    let a100 = report["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["acceleratorType"] == "a100-40")
        .unwrap_or_else(|| panic!("no a100-40 row: {report:#}"))
        .clone();
    let hours = a100["gpuHours"].as_f64().expect("gpuHours");
    let weighted = a100["weightedGpuHours"].as_f64().expect("weightedGpuHours");
    assert!(
        hours > 0.0 && (weighted - 3.0 * hours).abs() < 1e-9,
        "{a100:#}"
    );

    // After a restart the held clusters are read back with their GPU
    // types: the same charge.
    s.kill9();
    let s = crate::support::ServerProcess::start_with(dir.path(), Some(&file)).await;
    assert_eq!(usage(&s.scrape().await), Some(expected), "after a restart");
}
