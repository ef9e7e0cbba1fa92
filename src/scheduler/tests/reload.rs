//! A config reload in place: virtual nodes dropped or reshaped, pools
//! shrunk and grown, quota rules and weights changed.

use super::*;

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
        preemption: Default::default(),
        elastic: Default::default(),
        alternatives: Vec::new(),
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
