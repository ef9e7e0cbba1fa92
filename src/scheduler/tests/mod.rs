//! The core against its invariants: unit cases for each rule, by topic
//! ([`allocation`], [`estimate`], [`holds`], [`preempt`], [`reload`], [`alternatives`],
//! [`elastic`], [`views`]), on the
//! fixtures here, and property tests over random event sequences in
//! [`props`].

mod allocation;
mod alternatives;
mod elastic;
mod elastic_props;
mod estimate;
mod holds;
mod preempt;
mod preempt_props;
mod props;
mod provision;
mod provision_props;
mod reclaim_props;
mod reload;
mod views;

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, TimeZone, Utc};

use super::*;
use crate::spec::{
    Accelerator, ClusterRequest, NodeShape, ProvisioningMode, QuotaAmount, QuotaMetric, Request,
    RuntimeVersion, Workload,
};

/// A property runner on a fixed seed, for the tests that check a
/// generator still produces what its property's checks look at.
fn fixed_seed_runner(cases: u32) -> proptest::test_runner::TestRunner {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    TestRunner::new_with_rng(
        Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    )
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0)
        .single()
        .expect("valid time")
}

fn l4_node(id: &str, zone: &str, gpus: u32) -> NodeSpec {
    NodeSpec {
        id: NodeId(id.into()),
        region: "r".into(),
        zone: zone.into(),
        pool: "l4".into(),
        accelerator: Accelerator::L4,
        gpu_addresses: (0..gpus).map(|i| i.to_string()).collect(),
        cores: 12 * gpus,
        memory_mb: 53536 * u64::from(gpus),
        local_ssd_gb: 375 * u64::from(gpus),
        is_virtual: true,
    }
}

fn l4_part() -> NodeShape {
    NodeShape {
        accelerator: Some(Accelerator::L4),
        cores: 4,
        gpus: 1,
        memory_mb: 8031,
        memory_overhead_mb: 5353,
        local_ssd_gb: 375,
    }
}

/// An L4 driver and `executors` L4 executors.
fn cluster(
    executors: u32,
    mode: ProvisioningMode,
    timeout_s: u64,
    ttl_s: Option<u64>,
) -> ClusterRequest {
    let gpus = u64::from(executors) + 1;
    let metric = if mode == ProvisioningMode::Queue {
        QuotaMetric::PreemptibleNvidiaL4Gpus
    } else {
        QuotaMetric::NvidiaL4Gpus
    };
    ClusterRequest {
        workload: Workload::Pyspark,
        runtime: RuntimeVersion::new(3, 0),
        driver: l4_part(),
        executor: l4_part(),
        executor_count: executors,
        mode,
        allocation_timeout_s: timeout_s,
        ttl_s,
        infrastructure_retries: 0,
        quota: vec![
            QuotaAmount {
                metric,
                amount: gpus,
            },
            QuotaAmount {
                metric: QuotaMetric::LocalSsdTotalGb,
                amount: 375 * gpus,
            },
        ],
        preemptible: true,
        dynamic_allocation: false,
        max_extras: 0,
    }
}

fn rules(limit: u64) -> Vec<QuotaRule> {
    [
        QuotaMetric::PreemptibleNvidiaL4Gpus,
        QuotaMetric::NvidiaL4Gpus,
    ]
    .into_iter()
    .map(|metric| QuotaRule {
        project: "*".into(),
        region: "*".into(),
        metric,
        limit,
    })
    .chain([QuotaRule {
        project: "*".into(),
        region: "*".into(),
        metric: QuotaMetric::LocalSsdTotalGb,
        limit: 1_000_000,
    }])
    .collect()
}

fn pool(zone: &str, gpus: u32, max: u32) -> PoolDecl {
    PoolDecl {
        region: "r".into(),
        zone: zone.into(),
        node: l4_node(&format!("{zone}/l4"), zone, gpus),
        max_nodes: max,
        provisioner: None,
    }
}

/// A queued batch of `request`: a cluster, or a cluster with its
/// alternatives.
fn batch(key: i64, project: &str, request: impl Into<Request>, at: DateTime<Utc>) -> PendingBatch {
    let Request {
        cluster: c,
        alternatives,
    } = request.into();
    PendingBatch {
        key: BatchKey(key),
        batch_id: format!("b-{key}"),
        project: project.into(),
        region: "r".into(),
        priority: 0,
        queued_at: at,
        deadline: (c.mode == ProvisioningMode::Queue)
            .then(|| at + Duration::seconds(c.allocation_timeout_s as i64)),
        cluster: c,
        alternatives,
        preemptions: 0,
    }
}

/// The snapshot's queued-batch series, the plain way: each pending batch
/// on its own, its reason from the ledger's shortfall.
#[allow(clippy::type_complexity)]
fn pending_counted_one_by_one(
    s: &Scheduler,
    now: DateTime<Utc>,
) -> (
    BTreeMap<(String, String, &'static str), u64>,
    BTreeMap<String, f64>,
) {
    let mut pending = BTreeMap::new();
    let mut fraction: BTreeMap<String, f64> = BTreeMap::new();
    for b in s.queue.batches() {
        let reason = if s
            .ledger
            .shortfall(&b.project, &b.region, &b.cluster.quota)
            .is_some()
        {
            "quota"
        } else if s.queue.held_back().contains(&b.key) {
            "reservation"
        } else {
            "capacity"
        };
        let accelerator = accelerator_label(&b.cluster).to_string();
        *pending
            .entry((b.region.clone(), accelerator, reason))
            .or_default() += 1;
        if let Some(deadline) = b.deadline {
            let total = (deadline - b.queued_at).num_milliseconds().max(1) as f64;
            let waited = (now - b.queued_at).num_milliseconds().max(0) as f64;
            let f = fraction.entry(b.region.clone()).or_default();
            *f = f.max(waited / total);
        }
    }
    (pending, fraction)
}

fn allocated(d: &[Decision]) -> Vec<i64> {
    d.iter()
        .filter_map(|d| match d {
            Decision::Allocate(a) => Some(a.key.0),
            _ => None,
        })
        .collect()
}
