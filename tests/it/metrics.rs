//! `/metrics` after a scripted scenario: values, not just names.

use std::collections::BTreeMap;

use flexq::config::{AlternativesConfig, PoolConfig, PreemptionConfig, RegionConfig, ZoneConfig};
use flexq::spec::Accelerator;
use serde_json::{Value, json};

use crate::support::{self, TestServer, flex_with};

/// This file's region. Counters are process-wide and tests run in
/// parallel: every test that runs the scenario gives it a region of its own.
const REGION: &str = "mtest-east1";

/// A server with `region` (one zone, `{region}-a`): one virtual node of 4
/// L4 GPUs.
pub(crate) async fn server(region: &str) -> TestServer {
    server_tuned(region, None, |_| {}).await
}

/// The same with `preemption` as the region's policy, and a zone `{region}-b` of one virtual A100-40 node (8 GPUs)
/// that project `loaner`'s L4 batches may borrow after 1 s, reclaimed
/// after 1 s on loan: the world of [`loan_scenario`]. And a zone
/// `{region}-c` whose A100-80 pool a provisioner scales, its programs
/// working in `cloud`: the world of [`provisioning_scenario`].
pub(crate) async fn server_lending(
    region: &str,
    preemption: Option<PreemptionConfig>,
    cloud: &std::path::Path,
) -> TestServer {
    let name = region.to_string();
    let cloud = cloud.to_path_buf();
    server_tuned(region, preemption, move |c| {
        provisioned_zone(c, &name, &cloud);
        let a100 = PoolConfig {
            accelerator: Accelerator::A100_40,
            gpus_per_node: 8,
            cores: 96,
            memory_mb: 696320,
            local_ssd_gb: 6000,
            max_nodes: 1,
            virtual_nodes: 1,
            provisioner: None,
        };
        let zones = &mut c.regions.get_mut(&name).expect("the region").zones;
        zones.insert(
            format!("{name}-b"),
            ZoneConfig {
                node_pools: BTreeMap::from([("a100-40".to_string(), a100)]),
            },
        );
        c.alternatives.push(AlternativesConfig {
            region: Some(name),
            project: Some("loaner".to_string()),
            accelerator: Some("l4".to_string()),
            alternatives: vec!["a100-40 after 1s".to_string()],
            allow: Vec::new(),
            reclaim: Some("after 1s".to_string()),
        });
    })
    .await
}

/// Zone `{region}-c`: an A100-80 pool of at most one node (8 GPUs) that
/// starts empty, whose resume program (a shell line; a FAKE cloud that
/// creates nothing) keeps each manifest in `cloud` and fails its first
/// run, as a stock-out would; the pool backs off 1 s.
fn provisioned_zone(c: &mut flexq::config::Config, region: &str, cloud: &std::path::Path) {
    let dir = cloud.display().to_string();
    let resume = format!(
        "cat > \"{dir}/manifest.json\"; [ -e \"{dir}/stocked-out\" ] || {{ touch \"{dir}/stocked-out\"; echo ZONE_RESOURCE_POOL_EXHAUSTED >&2; exit 1; }}"
    );
    let pool = PoolConfig {
        accelerator: Accelerator::A100_80,
        gpus_per_node: 8,
        cores: 96,
        memory_mb: 1_392_640,
        local_ssd_gb: 6000,
        max_nodes: 1,
        virtual_nodes: 0,
        provisioner: Some(flexq::config::ProvisionerConfig {
            resume_program: vec!["sh".into(), "-c".into(), resume],
            suspend_program: vec!["true".into()],
            resume_timeout: std::time::Duration::from_secs(60),
            suspend_timeout: std::time::Duration::from_secs(10),
            suspend_after: std::time::Duration::from_secs(3600),
            min_nodes: 0,
            resume_rate: 100,
            backoff: flexq::config::BackoffConfig {
                base: std::time::Duration::from_secs(1),
                max: std::time::Duration::from_secs(1),
            },
            preempt_if_boot_over: None,
        }),
    };
    let zones = &mut c.regions.get_mut(region).expect("the region").zones;
    zones.insert(
        format!("{region}-c"),
        ZoneConfig {
            node_pools: BTreeMap::from([("a100-80".to_string(), pool)]),
        },
    );
}

/// In [`server_lending`]'s world: demo's batch of 8 A100-80 GPUs gets a
/// set of one new node; its resume program fails (a stock-out), the pool
/// backs off, the next set's program succeeds and this test registers its
/// slot as the node's agent would, and the batch is allocated on it. A
/// failed set, an allocated one and a boot time are counted, and the node
/// is in use when Prometheus scrapes.
pub(crate) async fn provisioning_scenario(s: &TestServer, region: &str, cloud: &std::path::Path) {
    let mut big = batch(7, "3600s");
    let props = &mut big["runtimeConfig"]["properties"];
    for part in ["driver", "executor"] {
        props[format!("spark.dataproc.{part}.resource.accelerator.type")] = json!("a100-80");
        props[format!("spark.{part}.cores")] = json!("12");
    }
    create(s, region, "m-provisioned", &big).await;
    let manifest = cloud.join("manifest.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let slot = loop {
        // The manifest the second (successful) run kept.
        let read = std::fs::read(&manifest)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        if cloud.join("stocked-out").exists() {
            let history = state_of(s, region, "m-provisioned").await;
            let failed = support::state_messages(&history)
                .iter()
                .any(|m| m.contains(") failed: "));
            let slot = read.and_then(|m| m["slots"][0].as_str().map(str::to_string));
            if let (true, Some(slot)) = (failed, slot) {
                let again = support::state_messages(&history)
                    .iter()
                    .filter(|m| {
                        m.starts_with("Provisioning 1 nodes") && m.contains("for this batch")
                    })
                    .count();
                if again >= 2 {
                    break slot;
                }
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no second set after the stock-out: {:#}",
            state_of(s, region, "m-provisioned").await
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let (status, reg) = s
        .post_json(
            "/v1/nodes:register",
            &json!({
                "nodeId": slot, "region": region, "zone": format!("{region}-c"), "pool": "a100-80",
                "gpuAddresses": ["0", "1", "2", "3", "4", "5", "6", "7"],
                "cores": 96, "memoryMb": 1_392_640, "localSsdGb": 6000
            }),
        )
        .await;
    assert_eq!(status, 200, "{reg:#}");
    until(s, region, "m-provisioned", |b| {
        b["flexq"]["provisioningState"] == "PROVISIONED"
    })
    .await;
}

/// A server with `region` as [`server`] has it, `preemption` its policy,
/// then `tune` applied.
async fn server_tuned(
    region: &str,
    preemption: Option<PreemptionConfig>,
    tune: impl FnOnce(&mut flexq::config::Config),
) -> TestServer {
    let region = region.to_string();
    TestServer::start_with(|c| {
        let pool = PoolConfig {
            accelerator: Accelerator::L4,
            gpus_per_node: 4,
            cores: 48,
            memory_mb: 214144,
            local_ssd_gb: 1500,
            max_nodes: 4,
            virtual_nodes: 1,
            provisioner: None,
        };
        c.regions.insert(
            region.clone(),
            RegionConfig {
                zones: BTreeMap::from([(
                    format!("{region}-a"),
                    ZoneConfig {
                        node_pools: BTreeMap::from([("l4".to_string(), pool)]),
                    },
                )]),
                preemption,
                elastic: Default::default(),
            },
        );
        tune(c);
    })
    .await
}

/// The value of the series `name` whose labels include `labels`.
pub(crate) fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

pub(crate) fn batch(executors: u32, timeout: &str) -> Value {
    let mut b = flex_with("spark.executor.instances", &executors.to_string());
    b["runtimeConfig"]["properties"]["spark.dataproc.executor.provisioning.allocationTimeout"] =
        json!(timeout);
    b
}

pub(crate) async fn create(s: &TestServer, region: &str, id: &str, body: &Value) -> Value {
    let r = s
        .http
        .post(s.url(&format!(
            "/v1/projects/demo/locations/{region}/batches?batchId={id}"
        )))
        .json(body)
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), 200);
    r.json().await.expect("json")
}

async fn state_of(s: &TestServer, region: &str, id: &str) -> Value {
    s.get(&format!(
        "/v1/projects/demo/locations/{region}/batches/{id}"
    ))
    .await
    .1
}

async fn until(s: &TestServer, region: &str, id: &str, pred: impl Fn(&Value) -> bool) {
    let path = format!("/v1/projects/demo/locations/{region}/batches/{id}");
    support::until(s, &path, "as expected", pred).await;
}

/// Queue, allocate, expire, cancel in `region` — then every metric says so.
pub(crate) async fn scenario(s: &TestServer, region: &str) {
    create(s, region, "m-small", &batch(2, "3600s")).await;
    until(s, region, "m-small", |b| {
        b["flexq"]["provisioningState"] == "PROVISIONED"
    })
    .await;
    create(s, region, "m-waits", &batch(3, "3600s")).await;
    until(s, region, "m-waits", |b| {
        b["flexq"]["notAdmittedReasons"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
    })
    .await;
    create(s, region, "m-expires", &batch(4, "1s")).await;
    until(s, region, "m-expires", |b| b["state"] == "FAILED").await;
    let op = state_of(s, region, "m-small").await["operation"]
        .as_str()
        .expect("op")
        .to_string();
    assert_eq!(s.post(&format!("/v1/{op}:cancel")).await.0, 200);
    // 1 + 3 executors fit the freed node.
    until(s, region, "m-waits", |b| {
        b["flexq"]["provisioningState"] == "PROVISIONED"
    })
    .await;
    create(s, region, "m-queued", &batch(2, "3600s")).await;
    until(s, region, "m-queued", |b| {
        b["flexq"]["notAdmittedReasons"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
    })
    .await;
}

#[tokio::test]
async fn a_scrape_after_a_scenario_has_the_right_values() {
    let s = server(REGION).await;
    scenario(&s, REGION).await;
    let text = s.scrape().await;
    let r = [("region", REGION)];
    let l4 = [("region", REGION), ("accelerator", "l4")];
    assert_eq!(
        value(&text, "flexq_batches_admitted_total", &l4),
        Some(2.0),
        "{text}"
    );
    assert_eq!(value(&text, "flexq_batches_expired_total", &l4), Some(1.0));
    assert_eq!(
        value(&text, "flexq_batch_wait_seconds_count", &l4),
        Some(2.0)
    );
    assert_eq!(
        value(
            &text,
            "flexq_pending_batches",
            &[
                ("region", REGION),
                ("accelerator", "l4"),
                ("reason", "capacity")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            "flexq_pending_batches",
            &[
                ("region", REGION),
                ("accelerator", "l4"),
                ("reason", "quota")
            ]
        ),
        Some(0.0)
    );
    assert_eq!(
        value(
            &text,
            "flexq_capacity_gpus",
            &[("zone", "mtest-east1-a"), ("state", "allocated")]
        ),
        Some(4.0)
    );
    assert_eq!(
        value(
            &text,
            "flexq_capacity_gpus",
            &[("zone", "mtest-east1-a"), ("state", "free")]
        ),
        Some(0.0)
    );
    assert_eq!(
        value(
            &text,
            "flexq_capacity_nodes",
            &[("zone", "mtest-east1-a"), ("kind", "virtual")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            "flexq_capacity_local_ssd_bytes",
            &[("zone", "mtest-east1-a"), ("state", "allocated")]
        ),
        Some(4.0 * 375e9)
    );
    let quota = [
        ("project", "demo"),
        ("region", REGION),
        ("metric", "PREEMPTIBLE_NVIDIA_L4_GPUS"),
    ];
    assert_eq!(value(&text, "flexq_quota_usage", &quota), Some(4.0));
    assert_eq!(value(&text, "flexq_quota_limit", &quota), Some(24.0));
    // demo holds m-waits' 4 GPUs, and held m-small's 3 for a second or
    // two (a 24h half-life: that counts a tiny bit more).
    let fair = [("region", REGION), ("project", "demo")];
    let held = value(&text, "flexq_fair_share_usage_gpus", &fair).expect("fair-share usage");
    assert!((4.0..4.01).contains(&held), "{held}");
    assert_eq!(value(&text, "flexq_fair_share_ratio", &fair), Some(held));
    let ratio = value(&text, "flexq_pending_wait_timeout_ratio", &r).expect("ratio");
    assert!(ratio > 0.0 && ratio < 0.01, "{ratio}");
    assert_eq!(
        value(&text, "flexq_agent_nodes", &[("state", "active")]),
        Some(0.0)
    );
    assert!(
        value(&text, "flexq_scheduler_last_pass_timestamp_seconds", &[]).is_some_and(|t| t > 1.7e9)
    );
    assert!(value(&text, "flexq_build_info", &[]).is_some());
    assert!(
        value(
            &text,
            "flexq_http_requests_total",
            &[
                ("method", "POST"),
                ("route", "/v1/projects/{project}/locations/{region}/batches"),
                ("code", "200")
            ]
        )
        .is_some_and(|n| n >= 4.0)
    );
    for name in [
        "flexq_store_commit_seconds_count",
        "flexq_scheduler_pass_seconds_count",
    ] {
        assert!(value(&text, name, &[]).is_some_and(|n| n >= 1.0), "{name}");
    }
    assert!(
        !text.contains("m-small") && !text.contains("batch_id"),
        "no per-batch labels"
    );
}

/// After [`scenario`], in a region whose preemption is on by priority at
/// once: a priority-10 batch preempts the cluster that fills the node.
pub(crate) async fn preemption_scenario(s: &TestServer, region: &str) {
    let mut urgent = batch(2, "3600s");
    urgent["labels"] = json!({"flexq-priority": "10"});
    create(s, region, "m-urgent", &urgent).await;
    until(s, region, "m-urgent", |b| {
        b["flexq"]["provisioningState"] == "PROVISIONED"
    })
    .await;
    until(s, region, "m-waits", |b| b["flexq"]["preemptions"] == 1).await;
}

/// Preemption on by priority, at once (no minimum runtime).
pub(crate) fn preempting() -> Option<PreemptionConfig> {
    Some(PreemptionConfig {
        enabled: true,
        min_runtime: std::time::Duration::ZERO,
        ..PreemptionConfig::default()
    })
}

/// After [`scenario`] (and, or not, [`preemption_scenario`]): an agent's
/// node joins `region`, a queued batch lands on it, and the agent (this
/// test) uploads what its GPUs did — a busy point and an idle one.
pub(crate) async fn gpu_scenario(s: &TestServer, region: &str) {
    let node = format!("{region}-gpu-1");
    let (status, reg) = s
        .post_json(
            "/v1/nodes:register",
            &json!({
                "nodeId": node, "region": region, "zone": format!("{region}-a"), "pool": "l4",
                "gpuAddresses": ["0", "1", "2", "3"],
                "cores": 48, "memoryMb": 214144, "localSsdGb": 1500
            }),
        )
        .await;
    assert_eq!(status, 200, "{reg:#}");
    let epoch = reg["epoch"].as_str().expect("epoch").to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let part = loop {
        let (_, answer) = s
            .post_json(
                &format!("/v1/nodes/{node}:poll"),
                &json!({"epoch": epoch, "version": "", "waitFor": "1s"}),
            )
            .await;
        if let Some(a) = answer["assignments"].as_array().and_then(|a| a.first()) {
            break a.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no batch landed on {node}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let point = |time: &str, utilization: f64| {
        json!({"time": time, "seconds": 30.0, "gpus": 1,
               "utilizationPercent": utilization, "maxUtilizationPercent": utilization,
               "maxMemoryUsedMb": 1000})
    };
    let (status, answer) = s
        .post_json(
            &format!("/v1/nodes/{node}:telemetry"),
            &json!({"epoch": epoch, "batches": [{"uuid": part["uuid"], "points": [
                point("2026-12-03T10:00:30Z", 90.0),
                point("2026-12-03T10:01:00Z", 0.0),
            ]}]}),
        )
        .await;
    assert_eq!(
        (status, answer["taken"].as_u64()),
        (200, Some(2)),
        "{answer:#}"
    );
}

/// In [`server_lending`]'s world, after [`scenario`] (the L4s are busy):
/// `loaner`'s L4 batch, too large for the L4s, borrows the A100s; demo's
/// A100 batch of all 8 GPUs reclaims them; once it is cancelled the
/// borrower takes its loan again, so a loan is held when Prometheus scrapes
/// and a reclaim has been counted.
pub(crate) async fn loan_scenario(s: &TestServer, region: &str) {
    let loaner = |id: &str| format!("/v1/projects/loaner/locations/{region}/batches/{id}");
    // 1 + 5 one-GPU parts: more than the L4 nodes ever have free.
    let (status, body) = s
        .post_json(
            &format!("/v1/projects/loaner/locations/{region}/batches?batchId=l-borrower"),
            &batch(5, "3600s"),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    let on_loan = |b: &Value| {
        b["flexq"]["provisioningState"] == "PROVISIONED" && b["flexq"]["placement"]["loan"] == true
    };
    support::until(s, &loaner("l-borrower"), "on a loan", on_loan).await;
    let mut owner = batch(7, "3600s");
    let props = &mut owner["runtimeConfig"]["properties"];
    for part in ["driver", "executor"] {
        props[format!("spark.dataproc.{part}.resource.accelerator.type")] = json!("a100-40");
        props[format!("spark.{part}.cores")] = json!("12");
    }
    create(s, region, "m-owner", &owner).await;
    until(s, region, "m-owner", |b| {
        b["flexq"]["provisioningState"] == "PROVISIONED"
    })
    .await;
    support::until(s, &loaner("l-borrower"), "reclaimed", |b| {
        b["flexq"]["requeueReason"] == "RECLAIMED"
    })
    .await;
    let op = state_of(s, region, "m-owner").await["operation"]
        .as_str()
        .expect("op")
        .to_string();
    assert_eq!(s.post(&format!("/v1/{op}:cancel")).await.0, 200);
    support::until(s, &loaner("l-borrower"), "on its loan again", on_loan).await;
}
