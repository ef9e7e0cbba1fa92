//! The core against its invariants: unit cases for each rule here, and
//! property tests over random event sequences in [`props`].

mod props;

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, TimeZone, Utc};

use super::*;
use crate::spec::{
    Accelerator, ClusterRequest, NodeShape, ProvisioningMode, QuotaAmount, QuotaMetric,
    RuntimeVersion, Workload,
};

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
        alternatives: Vec::new(),
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
    }
}

fn batch(key: i64, project: &str, c: ClusterRequest, at: DateTime<Utc>) -> PendingBatch {
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
    for b in s.pending.values() {
        let reason = if s
            .ledger
            .shortfall(&b.project, &b.region, &b.cluster.quota)
            .is_some()
        {
            "quota"
        } else if s.held_back.contains(&b.key) {
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

#[test]
fn a_whole_cluster_waits_and_is_allocated_at_once_when_the_last_gpu_frees() {
    let mut s = Scheduler::new(vec![pool("a", 3, 4)], rules(100));
    for i in 0..3 {
        s.add_node(l4_node(&format!("n{i}"), "a", 3));
    }
    s.submit(batch(
        1,
        "p",
        cluster(2, ProvisioningMode::Queue, 3600, Some(3600)),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    // 1 + 8 needs 9 GPUs; 6 are free.
    s.submit(batch(
        2,
        "p",
        cluster(8, ProvisioningMode::Queue, 3600, Some(3600)),
        t0(),
    ));
    assert!(s.pass(t0()).is_empty(), "no partial cluster");
    assert_eq!(
        s.ledger_usage("p", "r", QuotaMetric::PreemptibleNvidiaL4Gpus),
        3
    );
    let info = s.pending_info(BatchKey(2), t0()).expect("queued");
    assert_eq!(info.queue_position, 1);
    assert!(
        info.reasons[0].contains("has room for 6"),
        "{:?}",
        info.reasons
    );
    assert_eq!(
        info.estimated_start_time,
        Some(t0() + Duration::seconds(3600))
    );

    s.forget(BatchKey(1), t0());
    let d = s.pass(t0() + Duration::seconds(5));
    assert_eq!(allocated(&d), vec![2]);
    let Decision::Allocate(a) = &d[0] else {
        unreachable!()
    };
    assert_eq!(a.placements.len(), 9);
    assert_eq!(a.placements.iter().map(|p| p.gpus.len()).sum::<usize>(), 9);
    assert_eq!(
        s.ledger_usage("p", "r", QuotaMetric::PreemptibleNvidiaL4Gpus),
        9
    );
    s.check_invariants().expect("invariants");
}

#[test]
fn a_cluster_is_never_split_across_zones() {
    let mut s = Scheduler::new(vec![pool("a", 4, 4), pool("b", 4, 4)], rules(100));
    s.add_node(l4_node("a0", "a", 4));
    s.add_node(l4_node("b0", "b", 4));
    // 6 GPUs: 8 free in the region, but at most 4 in a zone.
    s.submit(batch(
        1,
        "p",
        cluster(5, ProvisioningMode::Queue, 60, None),
        t0(),
    ));
    assert!(s.pass(t0()).is_empty());
    s.add_node(l4_node("b1", "b", 4));
    let d = s.pass(t0());
    let Some(Decision::Allocate(a)) = d.first() else {
        panic!("allocated: {d:?}")
    };
    assert_eq!(a.zone, "b");
    assert!(a.placements.iter().all(|p| p.node.0.starts_with('b')));
}

#[test]
fn placement_prefers_the_zone_left_least_fragmented() {
    let mut s = Scheduler::new(vec![pool("a", 4, 4), pool("b", 4, 4)], rules(100));
    s.add_node(l4_node("a0", "a", 4));
    s.add_node(l4_node("b0", "b", 4));
    s.submit(batch(
        1,
        "p",
        cluster(0, ProvisioningMode::Queue, 60, None),
        t0(),
    ));
    // One GPU on b first, so b is already broken into.
    s.pass(t0());
    s.submit(batch(
        2,
        "p",
        cluster(2, ProvisioningMode::Queue, 60, None),
        t0(),
    ));
    let d = s.pass(t0());
    let Some(Decision::Allocate(a)) = d.first() else {
        panic!("{d:?}")
    };
    // Zone a would be left with 1 crumb, the other with 0: the fuller one wins.
    let first_zone = s.allocation(BatchKey(1)).expect("held").zone.clone();
    assert_eq!(
        a.zone, first_zone,
        "the 3-GPU cluster fills the zone already in use"
    );
}

#[test]
fn expiry_comes_first_and_names_what_was_missing() {
    let mut s = Scheduler::new(vec![pool("a", 4, 8)], rules(12));
    s.add_node(l4_node("n0", "a", 4));
    s.submit(batch(
        1,
        "p",
        cluster(8, ProvisioningMode::Queue, 30, None),
        t0(),
    ));
    assert!(s.pass(t0()).is_empty());
    assert_eq!(s.next_deadline(), Some(t0() + Duration::seconds(30)));
    // Capacity arrives exactly at the deadline: too late.
    s.add_node(l4_node("n1", "a", 4));
    s.add_node(l4_node("n2", "a", 4));
    let d = s.pass(t0() + Duration::seconds(30));
    assert_eq!(d.len(), 1);
    let Decision::Expire { message, .. } = &d[0] else {
        panic!("{d:?}")
    };
    assert!(
        message.contains("allocation timeout of 30s (waited 30s)"),
        "{message}"
    );
    assert!(
        s.allocation(BatchKey(1)).is_none(),
        "never allocated after its deadline"
    );

    s.submit(batch(
        2,
        "p",
        cluster(8, ProvisioningMode::Queue, 30, None),
        t0(),
    ));
    s.submit(batch(
        3,
        "q",
        cluster(8, ProvisioningMode::Queue, 30, None),
        t0(),
    ));
    s.remove_node(&NodeId("n1".into()));
    s.remove_node(&NodeId("n2".into()));
    s.set_quota_limit("q", "r", QuotaMetric::PreemptibleNvidiaL4Gpus, 4);
    let d = s.pass(t0() + Duration::seconds(31));
    let msgs: BTreeMap<i64, &str> = d
        .iter()
        .filter_map(|d| match d {
            Decision::Expire { key, message, .. } => Some((key.0, message.as_str())),
            _ => None,
        })
        .collect();
    assert!(
        msgs[&2].contains("needs all 9 parts of 1 l4 driver + 8 executors of l4"),
        "{}",
        msgs[&2]
    );
    assert!(
        msgs[&3].contains("needs 9 PREEMPTIBLE_NVIDIA_L4_GPUS, project has 4 free of 4"),
        "{}",
        msgs[&3]
    );
}

#[test]
fn default_mode_allocates_now_or_fails_telling_stock_out_from_quota() {
    let mut s = Scheduler::new(vec![pool("a", 4, 8)], rules(4));
    s.add_node(l4_node("n0", "a", 4));
    s.submit(batch(
        1,
        "p",
        cluster(1, ProvisioningMode::Default, 0, None),
        t0(),
    ));
    s.submit(batch(
        2,
        "p",
        cluster(1, ProvisioningMode::Default, 0, None),
        t0(),
    ));
    s.submit(batch(
        3,
        "p",
        cluster(1, ProvisioningMode::Default, 0, None),
        t0(),
    ));
    let d = s.pass(t0());
    assert_eq!(allocated(&d), vec![1, 2]);
    let Some(Decision::Reject { message, .. }) = d.iter().find(|d| d.key() == BatchKey(3)) else {
        panic!("{d:?}")
    };
    assert!(
        message.starts_with(
            "RESOURCE_EXHAUSTED: quota NVIDIA_L4_GPUS exceeded in r: limit 4, usage 4, asked 2"
        ),
        "{message}"
    );

    s.set_quota_limit("p", "r", QuotaMetric::NvidiaL4Gpus, 100);
    s.submit(batch(
        4,
        "p",
        cluster(1, ProvisioningMode::Default, 0, None),
        t0(),
    ));
    let d = s.pass(t0());
    let Some(Decision::Reject { message, .. }) = d.first() else {
        panic!("{d:?}")
    };
    assert!(
        message.contains("ZONE_RESOURCE_POOL_EXHAUSTED"),
        "{message}"
    );
    assert_eq!(s.pending_count(), 0, "default mode never waits");
}

#[test]
fn never_fit_requests_are_told_apart_from_waits() {
    let s = Scheduler::new(vec![pool("a", 4, 2), pool("b", 4, 1)], rules(16));
    let too_big_for_quota = cluster(16, ProvisioningMode::Queue, 60, None);
    let reason = s.never_fits("p", "r", &too_big_for_quota).expect("17 > 16");
    assert!(
        reason.contains("above the project's quota limit of 16 in r by 1"),
        "{reason}"
    );
    // 9 GPUs fit neither zone's declared capacity (8 and 4).
    let too_big_for_zone = cluster(8, ProvisioningMode::Queue, 60, None);
    let reason = s
        .never_fits("p", "r", &too_big_for_zone)
        .expect("no zone holds 9");
    assert!(reason.contains("holds 8 (short by 1)"), "{reason}");
    assert!(
        s.never_fits("p", "r", &cluster(7, ProvisioningMode::Queue, 60, None))
            .is_none()
    );
}

#[test]
fn the_head_of_the_queue_is_not_starved_by_small_batches() {
    let mut s = Scheduler::new(vec![pool("a", 4, 4)], rules(100));
    s.add_node(l4_node("n0", "a", 4));
    s.add_node(l4_node("n1", "a", 4));
    // Two small ones run for an hour.
    s.submit(batch(
        1,
        "p",
        cluster(1, ProvisioningMode::Queue, 7200, Some(3600)),
        t0(),
    ));
    s.submit(batch(
        2,
        "p",
        cluster(1, ProvisioningMode::Queue, 7200, Some(3600)),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0())).len(), 2);
    // The big one needs all 8 GPUs; it is the head.
    s.submit(batch(
        3,
        "p",
        cluster(7, ProvisioningMode::Queue, 7200, Some(3600)),
        t0(),
    ));
    // A stream of small ones that would each hold capacity past the big
    // one's reservation (in an hour).
    for k in 4..10 {
        s.submit(batch(
            k,
            "p",
            cluster(1, ProvisioningMode::Queue, 7200, Some(7200)),
            t0(),
        ));
        assert!(
            s.pass(t0()).is_empty(),
            "a long small batch must not jump the head"
        );
    }
    // A short one that ends before the reservation may backfill.
    s.submit(batch(
        20,
        "p",
        cluster(1, ProvisioningMode::Queue, 7200, Some(600)),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0())), vec![20]);
    s.forget(BatchKey(20), t0());
    s.forget(BatchKey(1), t0());
    s.forget(BatchKey(2), t0());
    assert_eq!(
        allocated(&s.pass(t0() + Duration::seconds(3600)))[0],
        3,
        "the head goes first"
    );
}

#[test]
fn higher_priority_goes_first() {
    let mut s = Scheduler::new(vec![pool("a", 4, 4)], rules(100));
    s.add_node(l4_node("n0", "a", 4));
    let mut low = batch(1, "p", cluster(3, ProvisioningMode::Queue, 60, None), t0());
    low.priority = 0;
    let mut high = batch(2, "p", cluster(3, ProvisioningMode::Queue, 60, None), t0());
    high.priority = 10;
    s.submit(low);
    s.submit(high);
    assert_eq!(allocated(&s.pass(t0())), vec![2]);
}

#[test]
fn a_lowered_limit_keeps_running_work_and_blocks_new_admissions() {
    let mut s = Scheduler::new(vec![pool("a", 4, 4)], rules(8));
    s.add_node(l4_node("n0", "a", 4));
    s.add_node(l4_node("n1", "a", 4));
    s.submit(batch(
        1,
        "p",
        cluster(3, ProvisioningMode::Queue, 60, None),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    s.set_quota_limit("p", "r", QuotaMetric::PreemptibleNvidiaL4Gpus, 2);
    assert!(s.allocation(BatchKey(1)).is_some(), "not revoked");
    s.submit(batch(
        2,
        "p",
        cluster(0, ProvisioningMode::Queue, 60, None),
        t0(),
    ));
    assert!(s.pass(t0()).is_empty());
}

#[test]
fn gpu_addresses_are_given_exactly_once() {
    let mut s = Scheduler::new(vec![pool("a", 4, 4)], rules(100));
    s.add_node(l4_node("n0", "a", 4));
    for k in 0..4 {
        s.submit(batch(
            k,
            "p",
            cluster(0, ProvisioningMode::Queue, 60, None),
            t0(),
        ));
    }
    let d = s.pass(t0());
    let mut gpus: Vec<String> = d
        .iter()
        .filter_map(|d| match d {
            Decision::Allocate(a) => Some(a.placements[0].gpus[0].clone()),
            _ => None,
        })
        .collect();
    gpus.sort();
    assert_eq!(gpus, ["0", "1", "2", "3"]);
}

#[test]
fn a_pass_that_stops_early_still_answers_default_mode_batches() {
    let mut s = Scheduler::new(vec![pool("a", 4, 8)], rules(100));
    s.add_node(l4_node("n0", "a", 4));
    // Many queued batches of one shape that cannot fit, then a default-mode
    // one that cannot fit either: it must fail in this pass, not linger.
    for k in 1..50 {
        s.submit(batch(
            k,
            "p",
            cluster(6, ProvisioningMode::Queue, 600, None),
            t0(),
        ));
    }
    s.submit(batch(
        50,
        "p",
        cluster(6, ProvisioningMode::Default, 0, None),
        t0(),
    ));
    s.submit(batch(
        51,
        "p",
        cluster(1, ProvisioningMode::Queue, 600, None),
        t0(),
    ));
    let d = s.pass(t0());
    assert!(
        d.iter()
            .any(|d| matches!(d, Decision::Reject { key, .. } if key.0 == 50)),
        "{d:?}"
    );
    assert_eq!(
        allocated(&d),
        vec![51],
        "a different shape further back is still tried"
    );
}

#[test]
fn a_rejected_last_batch_of_a_shape_does_not_end_the_scan() {
    let mut s = Scheduler::new(vec![pool("a", 4, 8)], rules(100));
    s.add_node(l4_node("n0", "a", 4));
    // One default-mode batch that cannot fit (its shape's only batch), then
    // a queued one of another shape that fits.
    s.submit(batch(
        1,
        "p",
        cluster(6, ProvisioningMode::Default, 0, None),
        t0(),
    ));
    s.submit(batch(
        2,
        "p",
        cluster(1, ProvisioningMode::Queue, 600, None),
        t0(),
    ));
    let d = s.pass(t0());
    assert!(
        d.iter()
            .any(|d| matches!(d, Decision::Reject { key, .. } if key.0 == 1)),
        "{d:?}"
    );
    assert_eq!(allocated(&d), vec![2]);
}

#[test]
fn long_batches_held_back_by_a_reservation_end_the_scan_but_short_ones_still_backfill() {
    let mut s = Scheduler::new(vec![pool("a", 4, 4)], rules(100));
    s.add_node(l4_node("n0", "a", 4));
    s.add_node(l4_node("n1", "a", 4));
    s.submit(batch(
        1,
        "p",
        cluster(1, ProvisioningMode::Queue, 7200, Some(3600)),
        t0(),
    ));
    s.submit(batch(
        2,
        "p",
        cluster(1, ProvisioningMode::Queue, 7200, Some(3600)),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0())).len(), 2);
    s.submit(batch(
        3,
        "p",
        cluster(7, ProvisioningMode::Queue, 7200, Some(3600)),
        t0(),
    ));
    // Many long ones of one shape, then a short one of the same shape far
    // behind them: the scan must reach it.
    for k in 4..200 {
        s.submit(batch(
            k,
            "p",
            cluster(1, ProvisioningMode::Queue, 7200, Some(7200)),
            t0(),
        ));
    }
    s.submit(batch(
        500,
        "p",
        cluster(1, ProvisioningMode::Queue, 7200, Some(600)),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0())), vec![500]);
}

#[test]
fn a_node_registering_again_with_another_shape_keeps_what_it_holds() {
    let mut s = Scheduler::new(vec![pool("a", 8, 4)], rules(100));
    let lease = t0() + Duration::seconds(60);
    let mut spec = l4_node("agent0", "a", 4);
    spec.is_virtual = false;
    s.register_node(spec.clone(), 1, lease);
    s.submit(batch(
        1,
        "p",
        cluster(2, ProvisioningMode::Queue, 3600, Some(3600)),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    // More GPUs: taken, and what batch 1 holds is still held.
    let mut bigger = l4_node("agent0", "a", 8);
    bigger.is_virtual = false;
    s.register_node(bigger, 2, lease);
    s.check_invariants().expect("invariants");
    let free: u32 = s.nodes().iter().map(|n| n.1).sum();
    assert_eq!(free, 8 - 3, "8 GPUs, batch 1's 3 still held");
    // A shape too small for what it holds is not taken.
    let mut tiny = l4_node("agent0", "a", 1);
    tiny.is_virtual = false;
    s.register_node(tiny, 3, lease);
    s.check_invariants().expect("invariants");
    assert_eq!(s.nodes()[0].0.gpu_addresses.len(), 8);
}

/// One node of 4 GPUs: batch 1 (3 GPUs, ttl 1h) of `running` holds it;
/// batch 2 of `second` (ttl 30 min) and batch 3 of `third` (ttl 10 min)
/// wait, in that age order.
fn two_behind_one(order: Order, second: &str, third: &str) -> Scheduler {
    let mut s = Scheduler::new(vec![pool("a", 4, 1)], rules(100));
    s.set_fair_share(FairSharePolicy {
        order,
        ..FairSharePolicy::default()
    });
    s.add_node(l4_node("n0", "a", 4));
    let c = |ttl| cluster(2, ProvisioningMode::Queue, 7200, Some(ttl));
    s.submit(batch(1, "heavy", c(3600), t0()));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    s.submit(batch(2, second, c(1800), t0()));
    s.submit(batch(3, third, c(600), t0()));
    assert!(allocated(&s.pass(t0())).is_empty());
    s
}

#[test]
fn the_estimated_start_counts_the_batches_ahead_in_strict_order() {
    let s = two_behind_one(Order::Strict, "heavy", "light");
    let eta = |k| {
        s.pending_info(BatchKey(k), t0())
            .expect("queued")
            .estimated_start_time
    };
    // 2 starts when 1 ends; 3 only when 2 ends after it (not when 1 ends,
    // as an estimate blind to the queue would say).
    assert_eq!(eta(2), Some(t0() + Duration::seconds(3600)));
    assert_eq!(eta(3), Some(t0() + Duration::seconds(3600 + 1800)));
}

#[test]
fn the_estimated_start_follows_the_fair_share_order() {
    // heavy holds the node, so light's younger batch goes first.
    let s = two_behind_one(Order::FairShare, "heavy", "light");
    let info = |k| s.pending_info(BatchKey(k), t0()).expect("queued");
    assert_eq!(info(3).queue_position, 1);
    assert_eq!(info(2).queue_position, 2);
    assert_eq!(
        info(3).estimated_start_time,
        Some(t0() + Duration::seconds(3600))
    );
    assert_eq!(
        info(2).estimated_start_time,
        Some(t0() + Duration::seconds(3600 + 600))
    );
    let why = info(2).reasons.join(" | ");
    assert!(
        why.contains("behind 1 batch of 1 project in fair-share order")
            && why.contains("light 0.00; yours 3.00"),
        "{why}"
    );
}

#[test]
fn no_estimate_behind_a_cluster_without_a_ttl_or_too_deep_a_queue() {
    let mut s = Scheduler::new(vec![pool("a", 4, 1)], rules(100_000));
    s.add_node(l4_node("n0", "a", 4));
    s.submit(batch(
        1,
        "p",
        cluster(2, ProvisioningMode::Queue, 7200, None),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    for k in 2..(ESTIMATE_DEPTH as i64 + 5) {
        s.submit(batch(
            k,
            "p",
            cluster(2, ProvisioningMode::Queue, 7200, Some(60)),
            t0(),
        ));
    }
    s.pass(t0());
    // Batch 1 never ends: nothing behind it has an estimate.
    assert_eq!(
        s.pending_info(BatchKey(2), t0())
            .expect("queued")
            .estimated_start_time,
        None
    );
    s.forget(BatchKey(1), t0());
    assert_eq!(allocated(&s.pass(t0())), vec![2]);
    // Batch k waits for batch 2 (running, a minute) and the k − 3 queued
    // before it, a minute each: it starts after k − 2 minutes. The last
    // with an estimate has ESTIMATE_DEPTH batches queued ahead.
    let last_in_reach = ESTIMATE_DEPTH as i64 + 3;
    assert_eq!(
        s.pending_info(BatchKey(last_in_reach), t0())
            .expect("queued")
            .estimated_start_time,
        Some(t0() + Duration::seconds(60 * (last_in_reach - 2)))
    );
    // One more ahead than ESTIMATE_DEPTH: none.
    let too_deep = BatchKey(last_in_reach + 1);
    assert_eq!(
        s.pending_info(too_deep, t0())
            .expect("queued")
            .estimated_start_time,
        None
    );
}

#[test]
fn a_held_queue_allocates_nothing_but_still_expires_in_both_orders() {
    for order in [Order::Strict, Order::FairShare] {
        let mut s = Scheduler::new(vec![pool("a", 4, 1)], rules(100));
        s.set_fair_share(FairSharePolicy {
            order,
            ..FairSharePolicy::default()
        });
        s.add_node(l4_node("n0", "a", 4));
        let hold = Hold {
            since: t0(),
            by: "admin".into(),
        };
        s.set_holds(vec![("r".into(), Some("held".into()), hold.clone())]);
        let c = |timeout| cluster(2, ProvisioningMode::Queue, timeout, Some(600));
        s.submit(batch(1, "held", c(60), t0()));
        s.submit(batch(2, "held", c(7200), t0()));
        s.submit(batch(3, "free", c(7200), t0()));
        // The older batches are held: the free project's goes, and the
        // held ones reserve nothing.
        assert_eq!(allocated(&s.pass(t0())), vec![3], "{order:?}");
        let info = s.pending_info(BatchKey(2), t0()).expect("queued");
        assert!(
            info.reasons[0].contains("held by an admin (admin)"),
            "{info:?}"
        );
        assert_eq!(info.estimated_start_time, None);
        s.forget(BatchKey(3), t0());
        // Held: the deadline still passes; the node stays free.
        let d = s.pass(t0() + Duration::seconds(61));
        assert!(allocated(&d).is_empty(), "{order:?}: {d:?}");
        assert!(
            d.iter()
                .any(|d| matches!(d, Decision::Expire { key, .. } if *key == BatchKey(1))),
            "{d:?}"
        );
        // A region-wide hold holds every project.
        s.set_holds(vec![("r".into(), None, hold.clone())]);
        s.submit(batch(4, "free", c(7200), t0()));
        assert!(allocated(&s.pass(t0() + Duration::seconds(62))).is_empty());
        // Resumed: in order. Strict: the oldest first. Fair share: neither
        // project has used anything (batch 3 ended as it started), and a
        // tie goes by name, "free" before "held".
        s.set_holds(vec![]);
        let first = if order == Order::Strict { 2 } else { 4 };
        assert_eq!(
            allocated(&s.pass(t0() + Duration::seconds(63))),
            vec![first],
            "{order:?}"
        );
        s.check_invariants().expect("invariants");
    }
}

#[test]
fn a_cordoned_node_takes_nothing_new_but_keeps_what_it_holds() {
    let mut s = Scheduler::new(vec![pool("a", 4, 2)], rules(100));
    s.add_node(l4_node("n0", "a", 4));
    s.add_node(l4_node("n1", "a", 4));
    let c = || cluster(2, ProvisioningMode::Queue, 7200, Some(600));
    s.submit(batch(1, "p", c(), t0()));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    let on = s.allocation(BatchKey(1)).expect("running").placements[0]
        .node
        .clone();
    let other = NodeId(if on.0 == "n0" { "n1" } else { "n0" }.into());
    let cordon = Cordon {
        since: t0(),
        by: "admin".into(),
        drain: true,
    };
    s.set_cordons(vec![(on.clone(), cordon.clone()), (other.clone(), cordon)]);
    assert_eq!(s.parts_on(&on), 3);
    s.submit(batch(2, "p", c(), t0()));
    assert!(allocated(&s.pass(t0())).is_empty());
    // Never-fit still counts declared capacity; nothing estimated to start
    // on cordoned nodes.
    assert!(s.never_fits("p", "r", &c()).is_none());
    assert_eq!(
        s.pending_info(BatchKey(2), t0())
            .expect("queued")
            .estimated_start_time,
        None
    );
    let row = &s.capacity_rows()[0];
    assert_eq!(
        (row.free_gpus, row.cordoned_gpus, row.allocated_gpus),
        (0, 5, 3)
    );
    // The running cluster ends: its node is empty, and still cordoned.
    s.forget(BatchKey(1), t0());
    assert_eq!(s.parts_on(&on), 0);
    assert!(allocated(&s.pass(t0())).is_empty());
    // Uncordoned: the waiting batch goes there.
    s.set_cordons(vec![(
        on.clone(),
        Cordon {
            since: t0(),
            by: "admin".into(),
            drain: false,
        },
    )]);
    let d = s.pass(t0());
    assert_eq!(allocated(&d), vec![2]);
    let Decision::Allocate(a) = &d[0] else {
        unreachable!()
    };
    assert!(a.placements.iter().all(|p| p.node == other), "{a:?}");
    s.check_invariants().expect("invariants");
}

/// A layout of zone `a`'s L4 pool (4 GPUs a node) with `max` nodes of
/// which `virtual_nodes` are virtual (`virtual/a/l4/{i}`), and `weights`.
fn layout(max: u32, virtual_nodes: u32, quota: u64, weights: &[(&str, f64)]) -> Layout {
    Layout {
        pools: vec![pool("a", 4, max)],
        virtual_nodes: (0..virtual_nodes)
            .map(|i| l4_node(&format!("virtual/a/l4/{i}"), "a", 4))
            .collect(),
        rules: rules(quota),
        fair: FairSharePolicy {
            weights: weights.iter().map(|(p, w)| (p.to_string(), *w)).collect(),
            ..FairSharePolicy::default()
        },
    }
}

fn agent_node(id: &str) -> NodeSpec {
    NodeSpec {
        is_virtual: false,
        ..l4_node(id, "a", 4)
    }
}

#[test]
fn a_reload_that_drops_a_busy_virtual_node_lets_its_cluster_finish_and_then_removes_it() {
    let mut s = Scheduler::with_layout(layout(2, 2, 100, &[]));
    let c = || cluster(3, ProvisioningMode::Queue, 7200, Some(600));
    s.submit(batch(1, "p", c(), t0()));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    let busy = s.allocation(BatchKey(1)).expect("running").placements[0]
        .node
        .clone();
    assert_eq!(busy.0, "virtual/a/l4/0");
    // The config now declares one virtual node fewer: the idle one leaves
    // at once, the busy one is retired and keeps its cluster.
    let settled = s.reconfigure(layout(2, 1, 100, &[]));
    assert_eq!(settled.removed, vec![NodeId("virtual/a/l4/1".into())]);
    assert!(settled.retired.is_empty(), "{settled:?}");
    assert!(s.has_node(&busy) && !s.is_retired(&busy));
    // ... as declared (virtual/a/l4/0 is still declared): now drop both.
    let settled = s.reconfigure(layout(2, 0, 100, &[]));
    assert_eq!(settled.retired, vec![busy.clone()]);
    assert!(s.allocation(BatchKey(1)).is_some(), "the cluster runs on");
    assert_eq!(s.parts_on(&busy), 4);
    s.submit(batch(
        2,
        "p",
        cluster(0, ProvisioningMode::Queue, 7200, None),
        t0(),
    ));
    assert!(
        allocated(&s.pass(t0())).is_empty(),
        "nothing new on a retired node"
    );
    let row = &s.capacity_rows()[0];
    assert_eq!(
        (row.free_gpus, row.cordoned_gpus, row.allocated_gpus),
        (0, 0, 4)
    );
    // Its cluster ends: the node leaves with it.
    s.forget(BatchKey(1), t0());
    assert!(!s.has_node(&busy));
    assert!(s.capacity_rows().is_empty());
    s.check_invariants().expect("invariants");
    // Declared again: it joins, and the waiting batch starts there.
    let settled = s.reconfigure(layout(2, 1, 100, &[]));
    assert_eq!(settled.added, vec![busy]);
    assert_eq!(allocated(&s.pass(t0())), vec![2]);
    s.check_invariants().expect("invariants");
}

#[test]
fn a_reshaped_virtual_node_is_replaced_once_its_cluster_ends() {
    let mut s = Scheduler::with_layout(layout(2, 1, 100, &[]));
    s.submit(batch(
        1,
        "p",
        cluster(1, ProvisioningMode::Queue, 7200, None),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    let mut bigger = layout(2, 1, 100, &[]);
    bigger.virtual_nodes[0] = l4_node("virtual/a/l4/0", "a", 8);
    let settled = s.reconfigure(bigger);
    assert_eq!(settled.retired, vec![NodeId("virtual/a/l4/0".into())]);
    s.forget(BatchKey(1), t0());
    let row = &s.capacity_rows()[0];
    assert_eq!((row.total_gpus, row.free_gpus), (8, 8), "{row:?}");
    assert!(!s.is_retired(&NodeId("virtual/a/l4/0".into())));
}

#[test]
fn a_shrunk_pool_retires_idle_agent_nodes_first_and_restores_them_when_it_grows() {
    let mut s = Scheduler::with_layout(layout(3, 0, 100, &[]));
    let lease = t0() + Duration::hours(1);
    for id in ["n0", "n1", "n2"] {
        assert!(s.register_node(agent_node(id), 1, lease));
    }
    s.submit(batch(
        1,
        "p",
        cluster(0, ProvisioningMode::Queue, 7200, None),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    let busy = s.allocation(BatchKey(1)).expect("running").placements[0]
        .node
        .clone();
    // One slot left: the busy node keeps it, whatever its name.
    let settled = s.reconfigure(layout(1, 0, 100, &[]));
    let mut idle: Vec<NodeId> = ["n0", "n1", "n2"]
        .iter()
        .map(|n| NodeId(n.to_string()))
        .filter(|n| *n != busy)
        .collect();
    idle.sort();
    assert_eq!(settled.retired, idle);
    // Agents' nodes stay registered, unschedulable.
    assert!(idle.iter().all(|n| s.has_node(n) && s.is_retired(n)));
    s.submit(batch(
        2,
        "p",
        cluster(0, ProvisioningMode::Queue, 7200, None),
        t0(),
    ));
    // The busy node has 3 GPUs free: batch 2 fits there, nowhere else.
    let d = s.pass(t0());
    assert_eq!(allocated(&d), vec![2]);
    let Decision::Allocate(a) = &d[0] else {
        unreachable!()
    };
    assert!(a.placements.iter().all(|p| p.node == busy), "{a:?}");
    // The pool is removed from the config: every node of it retires.
    let mut gone = layout(1, 0, 100, &[]);
    gone.pools.clear();
    let settled = s.reconfigure(gone);
    assert_eq!(settled.retired, vec![busy.clone()]);
    // Back to three: all restored.
    let settled = s.reconfigure(layout(3, 0, 100, &[]));
    let mut all = idle.clone();
    all.push(busy);
    all.sort();
    assert_eq!(settled.restored, all);
    s.check_invariants().expect("invariants");
}

#[test]
fn a_reload_changes_quota_rules_and_weights_in_place_keeping_queue_and_usage() {
    let mut s = Scheduler::with_layout(layout(1, 1, 1, &[]));
    let one = || cluster(0, ProvisioningMode::Queue, 7200, None);
    s.submit(batch(1, "heavy", one(), t0()));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    // Quota 1 GPU each: both wait on quota, heavy's older batch first.
    s.submit(batch(2, "heavy", one(), t0() + Duration::seconds(1)));
    s.submit(batch(3, "alpha", one(), t0() + Duration::seconds(2)));
    s.submit(batch(4, "alpha", one(), t0() + Duration::seconds(3)));
    assert_eq!(allocated(&s.pass(t0())), vec![3], "alpha has quota left");
    // A reload raises the quota to 2 and weighs heavy 10: heavy (1 GPU ÷
    // 10) now goes before alpha (1 GPU ÷ 1), though both hold one (and
    // equal shares would go by name, alpha first).
    s.reconfigure(layout(1, 1, 2, &[("heavy", 10.0)]));
    assert_eq!(s.pending_count(), 2, "the queue stays");
    assert_eq!(allocated(&s.pass(t0())), vec![2, 4]);
    s.check_invariants().expect("invariants");
}

#[test]
fn a_queue_page_gives_each_batch_the_place_and_reasons_a_get_gives_it() {
    for order in [Order::Strict, Order::FairShare] {
        let mut s = Scheduler::new(vec![pool("a", 4, 1)], rules(100));
        s.set_fair_share(FairSharePolicy {
            order,
            ..FairSharePolicy::default()
        });
        s.add_node(l4_node("n0", "a", 4));
        // "heavy" holds the node, so it comes last in fair share.
        s.submit(batch(
            1,
            "heavy",
            cluster(2, ProvisioningMode::Queue, 7200, Some(3600)),
            t0(),
        ));
        assert_eq!(allocated(&s.pass(t0())), vec![1]);
        let projects = ["heavy", "light", "other"];
        for key in 2..40 {
            let mut b = batch(
                key,
                projects[key as usize % 3],
                cluster(2, ProvisioningMode::Queue, 7200, Some(600)),
                t0() + Duration::seconds(key),
            );
            b.priority = (key % 4 == 0) as i32;
            s.submit(b);
        }
        s.pass(t0());
        let now = t0() + Duration::seconds(60);
        for scope in [None, Some("heavy"), Some("light")] {
            let total = s.queued_in("r", scope);
            let mut walked = Vec::new();
            for page in 0.. {
                let (n, entries) = s.queue_page("r", scope, page * 7, 7, now);
                assert_eq!(n, total);
                if entries.is_empty() {
                    break;
                }
                for (b, info) in entries {
                    if let Some(p) = scope {
                        assert_eq!(b.project, p);
                    }
                    assert_eq!(
                        Some(info),
                        s.pending_info(b.key, now),
                        "{order:?} {scope:?} batch {}",
                        b.key.0
                    );
                    walked.push(b.key);
                }
            }
            assert_eq!(walked.len(), total, "{order:?} {scope:?}");
            let positions: Vec<usize> = walked
                .iter()
                .map(|k| s.pending_info(*k, now).expect("queued").queue_position)
                .collect();
            assert!(
                positions.windows(2).all(|w| w[0] < w[1]),
                "{order:?} {scope:?}: {positions:?}"
            );
            if scope.is_none() {
                assert_eq!(positions, (1..=total).collect::<Vec<_>>());
            }
        }
    }
}

#[test]
fn the_scrape_tally_follows_batches_across_regions_gpu_types_and_requeues() {
    let mut s = Scheduler::new(vec![pool("a", 4, 1)], rules(100));
    s.add_node(l4_node("n0", "a", 4));
    let check = |s: &Scheduler, now: DateTime<Utc>| {
        let snapshot = s.snapshot(now);
        let (pending, fraction) = pending_counted_one_by_one(s, now);
        assert_eq!(snapshot.pending, pending);
        assert_eq!(snapshot.wait_fraction, fraction);
    };
    // An A100 cluster: no rule gives A100 quota, so it waits on quota.
    let a100 = |executors: u32, timeout_s: u64| {
        let mut c = cluster(executors, ProvisioningMode::Queue, timeout_s, Some(600));
        for part in [&mut c.driver, &mut c.executor] {
            part.accelerator = Some(Accelerator::A100_40);
        }
        c.quota[0].metric = QuotaMetric::PreemptibleNvidiaA100Gpus;
        c
    };
    let in_region = |mut b: PendingBatch, region: &str| {
        b.region = region.into();
        b
    };
    let mut key = 0;
    let mut next = || {
        key += 1;
        key
    };
    // Region r: one L4 cluster runs, others wait on capacity with two
    // timeouts; an A100 one waits on quota. Region s: no nodes at all.
    for (project, executors, timeout) in [
        ("p", 2, 3600),
        ("p", 3, 3600),
        ("q", 2, 1800),
        ("q", 3, 600),
    ] {
        s.submit(batch(
            next(),
            project,
            cluster(executors, ProvisioningMode::Queue, timeout, Some(600)),
            t0(),
        ));
    }
    s.submit(batch(next(), "q", a100(1, 3600), t0()));
    s.submit(in_region(
        batch(
            next(),
            "p",
            cluster(1, ProvisioningMode::Queue, 3600, Some(600)),
            t0(),
        ),
        "s",
    ));
    s.submit(in_region(batch(next(), "p", a100(1, 900), t0()), "s"));
    let running = allocated(&s.pass(t0()));
    assert_eq!(running.len(), 1, "one cluster fits the node");
    let later = t0() + Duration::seconds(300);
    check(&s, later);
    let snapshot = s.snapshot(later);
    assert!(
        snapshot
            .pending
            .keys()
            .any(|(r, a, why)| r == "r" && a == "a100-40" && *why == "quota")
    );
    assert!(snapshot.pending.keys().any(|(r, _, _)| r == "s"));

    // A requeue: the running cluster ends and its batch queues again, later.
    let back = BatchKey(running[0]);
    let mut again = batch(
        running[0],
        "p",
        cluster(2, ProvisioningMode::Queue, 3600, Some(600)),
        later,
    );
    again.key = back;
    s.forget(back, later);
    check(&s, later);
    s.submit(again);
    s.pass(later);
    check(&s, later + Duration::seconds(10));
    // Every queued batch leaves: nothing is left counted.
    let keys: Vec<BatchKey> = s.pending.keys().copied().collect();
    for k in keys {
        s.forget(k, later);
        check(&s, later);
    }
    let snapshot = s.snapshot(later);
    assert!(snapshot.pending.is_empty() && snapshot.wait_fraction.is_empty());
    assert!(s.tally.is_empty());
}
