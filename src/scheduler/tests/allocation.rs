//! Allocation: whole clusters at once, in one zone, in queue order
//! (priority, no starvation by small batches), expiry and default mode,
//! never-fit requests, quota limits, GPU addresses, and when a pass may
//! stop its scan early.

use super::*;

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
        info.reasons[0].kind == crate::scheduler::NotAdmitted::Capacity
            && info.reasons[0].message.contains("has room for 6"),
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

/// `Capacity::take` refuses a placement that no longer fits on any one
/// of a node's resources, whatever the others say: each is checked on its
/// own (cargo-mutants: `&&` → `||` between memory and SSD was missed).
#[test]
fn take_refuses_a_part_short_of_any_one_resource() {
    let mut s = Scheduler::new(vec![], rules(100));
    s.add_node(l4_node("n", "a", 1));
    let spec = l4_node("n", "a", 1);
    let part = |cores: u32, memory_mb: u64, local_ssd_gb: u64| Placement {
        node: NodeId("n".into()),
        role: PartRole::Executor,
        gpus: vec![],
        cores,
        memory_mb,
        local_ssd_gb,
        accelerator: None,
    };
    for (short, p) in [
        ("cores", part(spec.cores + 1, 1, 1)),
        ("memory", part(1, spec.memory_mb + 1, 1)),
        ("local SSD", part(1, 1, spec.local_ssd_gb + 1)),
    ] {
        assert!(
            !s.capacity.take(std::slice::from_ref(&p)),
            "taken though short of {short}: {p:?}"
        );
        let node = &s.capacity.nodes[&NodeId("n".into())];
        assert_eq!(
            (node.free_cores, node.free_memory_mb, node.free_ssd_gb),
            (spec.cores, spec.memory_mb, spec.local_ssd_gb),
            "a refused take takes nothing ({short})"
        );
    }
    assert!(
        s.capacity
            .take(&[part(spec.cores, spec.memory_mb, spec.local_ssd_gb)]),
        "the whole node fits exactly"
    );
}

/// A part without GPUs carries no GPU type, even in a GPU cluster whose
/// shape names one (cargo-mutants: `gpus > 0` → `>= 0` was missed).
#[test]
fn a_part_without_gpus_is_not_labelled_with_the_clusters_gpu_type() {
    let mut s = Scheduler::new(vec![], rules(100));
    s.add_node(l4_node("n", "a", 4));
    let mut c = cluster(1, ProvisioningMode::Queue, 3600, None);
    c.driver.gpus = 0;
    s.submit(batch(1, "p", c, t0()));
    let d = s.pass(t0());
    let [Decision::Allocate(a)] = d.as_slice() else {
        panic!("one allocation: {d:?}");
    };
    let label = |role: PartRole| {
        a.placements
            .iter()
            .find(|p| p.role == role)
            .map(|p| (p.gpus.len(), p.accelerator))
    };
    assert_eq!(label(PartRole::Driver), Some((0, None)));
    assert_eq!(label(PartRole::Executor), Some((1, Some(Accelerator::L4))));
}
