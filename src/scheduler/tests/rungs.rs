//! Placement alternatives in the core: a rung is tried only once its delay
//! has passed, at its batch's place in the queue, and takes the whole
//! reshaped cluster in one zone or nothing.

use super::*;
use crate::spec::alternatives::{Rung, Target};

fn a100_node(id: &str, zone: &str) -> NodeSpec {
    NodeSpec {
        id: NodeId(id.into()),
        region: "r".into(),
        zone: zone.into(),
        pool: "a100-40".into(),
        accelerator: Accelerator::A100_40,
        gpu_addresses: (0..8).map(|i| i.to_string()).collect(),
        cores: 96,
        memory_mb: 696_320,
        local_ssd_gb: 6000,
        is_virtual: true,
    }
}

fn a100_part() -> NodeShape {
    NodeShape {
        accelerator: Some(Accelerator::A100_40),
        cores: 12,
        gpus: 1,
        memory_mb: 70236,
        memory_overhead_mb: 7804,
        local_ssd_gb: 375,
    }
}

/// `c` with one rung: the same cluster on A100-40s, after `after_s`.
fn with_a100_rung(mut c: ClusterRequest, after_s: u64) -> ClusterRequest {
    let gpus = u64::from(c.executor_count) + 1;
    let mut rung = c.clone();
    rung.driver = a100_part();
    rung.executor = a100_part();
    rung.quota = vec![
        QuotaAmount {
            metric: QuotaMetric::PreemptibleNvidiaA100Gpus,
            amount: gpus,
        },
        QuotaAmount {
            metric: QuotaMetric::LocalSsdTotalGb,
            amount: 375 * gpus,
        },
    ];
    c.alternatives = vec![Rung {
        index: 1,
        after_s,
        target: Target::Accelerator(Accelerator::A100_40),
        region: "r".into(),
        cluster: rung,
    }];
    c
}

/// An A100-40 driver and `executors` A100-40 executors, asked directly.
fn a100_gang(executors: u32) -> ClusterRequest {
    let c = with_a100_rung(cluster(executors, ProvisioningMode::Queue, 3600, None), 0);
    c.alternatives[0].cluster.clone()
}

/// One L4 node of 4 GPUs in z1 and one A100-40 node of 8 in z2, quota
/// for both.
fn two_types() -> Scheduler {
    let mut rules = rules(100);
    rules.push(QuotaRule {
        project: "*".into(),
        region: "*".into(),
        metric: QuotaMetric::PreemptibleNvidiaA100Gpus,
        limit: 100,
    });
    let mut s = Scheduler::new(vec![], rules);
    s.add_node(l4_node("l4-1", "z1", 4));
    s.add_node(a100_node("a100-1", "z2"));
    s
}

#[test]
fn a_rung_is_tried_once_its_delay_has_passed_and_takes_the_whole_reshaped_cluster() {
    let mut s = two_types();
    let full = cluster(3, ProvisioningMode::Queue, 3600, None);
    s.submit(batch(1, "p", full, t0()));
    assert_eq!(allocated(&s.pass(t0())), vec![1], "the L4 node is full now");
    let waiting = with_a100_rung(cluster(2, ProvisioningMode::Queue, 3600, None), 900);
    s.submit(batch(2, "p", waiting, t0()));
    let ripe = t0() + Duration::seconds(900);
    assert!(
        s.next_deadline().is_some_and(|d| d <= ripe),
        "the scheduler wakes when the rung may be tried: {:?}",
        s.next_deadline()
    );
    for at in [t0(), t0() + Duration::seconds(899)] {
        assert!(
            allocated(&s.pass(at)).is_empty(),
            "not before its delay ({at})"
        );
        let info = s.pending_info(BatchKey(2), at).expect("queued");
        assert!(
            info.reasons
                .iter()
                .any(|r| r.starts_with("alternative 1 (a100-40 after 15m): tried from")),
            "{:?}",
            info.reasons
        );
    }
    let d = s.pass(ripe);
    let [Decision::Allocate(a)] = d.as_slice() else {
        panic!("one allocation on the rung: {d:?}");
    };
    assert_eq!(a.key, BatchKey(2));
    assert_eq!(a.rung_index(), 1);
    assert_eq!(a.zone, "z2");
    assert_eq!(a.accelerator, "a100-40");
    assert_eq!(a.rung.as_ref().map(|r| r.asked), Some("l4"));
    assert_eq!(a.placements.len(), 3, "driver and both executors, at once");
    assert!(
        a.placements
            .iter()
            .all(|p| p.node == NodeId("a100-1".into()))
    );
    assert_eq!(a.gpus(), 3);
    assert!(
        a.quota
            .iter()
            .any(|q| q.metric == QuotaMetric::PreemptibleNvidiaA100Gpus),
        "the rung's quota is charged: {:?}",
        a.quota
    );
    assert!(s.check_invariants().is_ok());
    // Given back whole: the A100 node is free again.
    s.forget(BatchKey(2), ripe + Duration::seconds(60));
    assert!(s.check_invariants().is_ok());
}

#[test]
fn without_a_rung_a_batch_waits_for_its_own_placement() {
    let mut s = two_types();
    s.submit(batch(
        1,
        "p",
        cluster(3, ProvisioningMode::Queue, 3600, None),
        t0(),
    ));
    s.pass(t0());
    s.submit(batch(
        2,
        "p",
        cluster(2, ProvisioningMode::Queue, 3600, None),
        t0(),
    ));
    for minutes in [0, 15, 59] {
        let at = t0() + Duration::minutes(minutes);
        assert!(allocated(&s.pass(at)).is_empty(), "{minutes} min");
    }
}

#[test]
fn a_rung_does_not_jump_an_earlier_batch_that_wants_the_same_gpus() {
    let mut s = two_types();
    s.submit(batch(
        1,
        "p",
        cluster(3, ProvisioningMode::Queue, 3600, None),
        t0(),
    ));
    s.pass(t0());
    // Batch 2 waits for L4 with an A100 rung; batch 3, queued after it,
    // asks for 8 A100s directly. When the rung ripens, batch 2 comes
    // first in the queue and takes its 3 A100 GPUs; batch 3 no longer
    // fits whole and waits.
    s.submit(batch(
        2,
        "p",
        with_a100_rung(cluster(2, ProvisioningMode::Queue, 3600, None), 600),
        t0(),
    ));
    s.submit(batch(3, "p", a100_gang(7), t0() + Duration::seconds(1)));
    let d = s.pass(t0() + Duration::seconds(1));
    assert_eq!(allocated(&d), vec![3], "before the rung ripens, 3 fits");
    s.forget(BatchKey(3), t0() + Duration::seconds(2));
    s.submit(batch(4, "p", a100_gang(7), t0() + Duration::seconds(3)));
    let d = s.pass(t0() + Duration::seconds(600));
    assert_eq!(
        allocated(&d),
        vec![2],
        "the rung of the earlier batch goes first; 4 does not fit beside it"
    );
}

#[test]
fn a_reservation_for_l4_does_not_hold_back_a_rung_on_a100s() {
    let mut s = two_types();
    // The L4 node is held for two hours: batch 2's start is estimated.
    s.submit(batch(
        1,
        "p",
        cluster(3, ProvisioningMode::Queue, 3600, Some(7200)),
        t0(),
    ));
    s.pass(t0());
    // Batch 2 waits for L4 without a rung and reserves it; batch 3,
    // behind it with no ttl (it would outlast any reservation), may take
    // A100s once its rung ripens: they are nothing batch 2 could use.
    s.submit(batch(
        2,
        "p",
        cluster(2, ProvisioningMode::Queue, 3600, None),
        t0(),
    ));
    s.submit(batch(
        3,
        "p",
        with_a100_rung(cluster(2, ProvisioningMode::Queue, 3600, None), 60),
        t0(),
    ));
    assert!(allocated(&s.pass(t0())).is_empty());
    assert_eq!(allocated(&s.pass(t0() + Duration::seconds(60))), vec![3]);
}
