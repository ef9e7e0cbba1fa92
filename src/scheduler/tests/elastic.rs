//! Elastic clusters: extras granted one at a time in the cluster's zone
//! from what the queue leaves, within quota and the region's share, and
//! given back newest first when Spark wants fewer.

use std::collections::HashMap;

use super::*;

/// An L4 driver and 2 executors, which Spark may grow by up to `extras`.
fn elastic(extras: u32) -> ClusterRequest {
    let mut c = cluster(2, ProvisioningMode::Queue, 3600, Some(3600));
    c.dynamic_allocation = true;
    c.max_extras = extras;
    c
}

/// Region `r` grows elastic clusters up to `share` of its GPUs.
fn growing(s: &mut Scheduler, share: f64) {
    s.set_elastic(HashMap::from([(
        "r".to_string(),
        ElasticPolicy { max_share: share },
    )]));
}

/// One 8-GPU node in zone `a` of region `r`, which grows elastic clusters
/// up to all its GPUs.
fn one_growing_node() -> Scheduler {
    let mut s = Scheduler::new(vec![pool("a", 8, 2)], rules(100));
    s.add_node(l4_node("n0", "a", 8));
    growing(&mut s, 1.0);
    s
}

fn granted(changes: &[ExtraChange]) -> Vec<(i64, String)> {
    changes
        .iter()
        .filter_map(|c| match c {
            ExtraChange::Granted { key, placement, .. } => Some((key.0, placement.node.0.clone())),
            _ => None,
        })
        .collect()
}

fn released(changes: &[ExtraChange]) -> usize {
    changes
        .iter()
        .filter(|c| matches!(c, ExtraChange::Released { .. }))
        .count()
}

fn gpus_used(s: &Scheduler) -> u64 {
    s.ledger_usage("p", "r", QuotaMetric::PreemptibleNvidiaL4Gpus)
}

#[test]
fn extras_are_granted_to_what_spark_wants_and_given_back_newest_first() {
    let mut s = one_growing_node();
    s.submit(batch(1, "p", elastic(4), t0()));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    assert_eq!(gpus_used(&s), 3, "the core gang: a driver and 2 executors");
    // Nothing wanted yet: nothing granted.
    assert!(s.grow(t0()).is_empty());
    // Spark wants 6 more: it gets its most, 4, one part each.
    assert!(s.set_wanted(BatchKey(1), 6, t0()).is_empty());
    let g = s.grow(t0());
    assert_eq!(granted(&g).len(), 4, "{g:?}");
    assert_eq!(gpus_used(&s), 7);
    let a = s.allocation(BatchKey(1)).expect("running");
    assert_eq!(a.extras().len(), 4);
    assert!(a.extras().iter().all(|p| p.role == PartRole::Executor));
    s.check_invariants().expect("invariants");
    // Spark wants 1: three go back, the newest first.
    let newest = a.extras()[1..].to_vec();
    let r = s.set_wanted(BatchKey(1), 1, t0() + Duration::seconds(60));
    assert_eq!(released(&r), 3);
    let given: Vec<Placement> = r
        .iter()
        .filter_map(|c| match c {
            ExtraChange::Released { placement, .. } => Some(placement.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(given, newest.into_iter().rev().collect::<Vec<_>>());
    assert_eq!(gpus_used(&s), 4);
    s.check_invariants().expect("invariants");
    // The cluster ends: the core and its extra go back whole.
    s.forget(BatchKey(1), t0() + Duration::seconds(120));
    assert_eq!(gpus_used(&s), 0);
    s.check_invariants().expect("invariants");
}

#[test]
fn no_extra_takes_capacity_of_a_type_a_queued_batch_waits_for() {
    let mut s = one_growing_node();
    s.submit(batch(1, "p", elastic(4), t0()));
    s.pass(t0());
    s.set_wanted(BatchKey(1), 4, t0());
    // A gang of 1 + 5 does not fit the 5 GPUs left: it waits for them.
    s.submit(batch(
        2,
        "q",
        cluster(5, ProvisioningMode::Queue, 3600, Some(3600)),
        t0(),
    ));
    assert!(allocated(&s.pass(t0())).is_empty());
    assert!(s.grow(t0()).is_empty(), "the queue waits for the L4s");
    // Once it leaves, the extras come.
    s.forget(BatchKey(2), t0());
    s.pass(t0());
    assert_eq!(granted(&s.grow(t0())).len(), 4);
    s.check_invariants().expect("invariants");
}

#[test]
fn extras_stay_in_their_clusters_zone_within_quota_and_the_regions_share() {
    let mut s = Scheduler::new(vec![pool("a", 4, 2), pool("b", 8, 2)], rules(100));
    s.add_node(l4_node("a0", "a", 4));
    s.add_node(l4_node("b0", "b", 8));
    growing(&mut s, 1.0);
    // 1 + 2 on zone a's node (best fit), one GPU left there.
    s.submit(batch(1, "p", elastic(4), t0()));
    s.pass(t0());
    assert_eq!(s.allocation(BatchKey(1)).expect("running").zone, "a");
    s.set_wanted(BatchKey(1), 4, t0());
    let g = granted(&s.grow(t0()));
    assert_eq!(
        g,
        vec![(1, "a0".to_string())],
        "zone b's 8 GPUs are not its zone's"
    );

    // A share: a quarter of 12 GPUs is 3 for extras, in all.
    let mut s = Scheduler::new(vec![pool("a", 4, 2), pool("b", 8, 2)], rules(100));
    s.add_node(l4_node("a0", "a", 4));
    s.add_node(l4_node("b0", "b", 8));
    growing(&mut s, 0.25);
    s.submit(batch(1, "p", elastic(8), t0()));
    s.submit(batch(2, "p", elastic(8), t0()));
    s.pass(t0());
    s.set_wanted(BatchKey(1), 8, t0());
    s.set_wanted(BatchKey(2), 8, t0());
    assert_eq!(granted(&s.grow(t0())).len(), 3);
    s.check_invariants().expect("invariants");

    // Quota: 5 GPUs, 3 in the core: 2 extras.
    let mut s = Scheduler::new(vec![pool("b", 8, 2)], rules(5));
    s.add_node(l4_node("b0", "b", 8));
    growing(&mut s, 1.0);
    s.submit(batch(1, "p", elastic(8), t0()));
    s.pass(t0());
    s.set_wanted(BatchKey(1), 8, t0());
    assert_eq!(granted(&s.grow(t0())).len(), 2);
    assert_eq!(gpus_used(&s), 5);

    // A region that does not grow grants none.
    s.set_elastic(HashMap::new());
    s.set_wanted(BatchKey(1), 1, t0());
    s.set_wanted(BatchKey(1), 8, t0());
    assert!(s.grow(t0()).is_empty());
    s.check_invariants().expect("invariants");
}

#[test]
fn a_fixed_size_cluster_never_grows() {
    let mut s = one_growing_node();
    s.submit(batch(
        1,
        "p",
        cluster(2, ProvisioningMode::Queue, 3600, Some(3600)),
        t0(),
    ));
    s.pass(t0());
    assert!(s.set_wanted(BatchKey(1), 4, t0()).is_empty());
    assert!(s.grow(t0()).is_empty());
}

#[test]
fn a_blocked_gang_takes_the_fewest_newest_extras_back_in_the_same_pass() {
    let mut s = one_growing_node();
    s.submit(batch(1, "p", elastic(4), t0()));
    s.pass(t0());
    s.set_wanted(BatchKey(1), 4, t0());
    assert_eq!(granted(&s.grow(t0())).len(), 4);
    let first = s.allocation(BatchKey(1)).expect("running").extras()[0].clone();
    // 1 + 3 needs 4 GPUs: 1 is free, so 3 extras go back, the newest.
    s.submit(batch(
        2,
        "q",
        cluster(3, ProvisioningMode::Queue, 3600, Some(3600)),
        t0(),
    ));
    let later = t0() + Duration::seconds(30);
    assert_eq!(allocated(&s.pass(later)), vec![2]);
    let changes = s.grow(later);
    let back: Vec<&str> = changes
        .iter()
        .filter_map(|c| match c {
            ExtraChange::Reclaimed { for_batch, .. } => Some(for_batch.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(back, vec!["b-2"; 3], "{changes:?}");
    assert!(granted(&changes).is_empty(), "nothing granted back at once");
    let a = s.allocation(BatchKey(1)).expect("running");
    assert_eq!(
        a.extras(),
        std::slice::from_ref(&first),
        "the oldest extra stays"
    );
    s.check_invariants().expect("invariants");
}

/// An agent's node (not virtual: its lease can lapse) of `gpus` L4s in
/// zone `a`.
fn agent_node(id: &str, gpus: u32) -> NodeSpec {
    NodeSpec {
        is_virtual: false,
        ..l4_node(id, "a", gpus)
    }
}

#[test]
fn a_lost_node_that_held_only_extras_takes_them_and_the_batch_goes_on() {
    let mut s = Scheduler::new(vec![pool("a", 8, 2)], rules(100));
    growing(&mut s, 1.0);
    let (short, long) = (t0() + Duration::seconds(30), t0() + Duration::seconds(600));
    // n0 holds the core gang whole (3 GPUs); the extras can only go to n1.
    assert!(s.register_node(agent_node("n0", 3), 1, long));
    assert!(s.register_node(agent_node("n1", 4), 1, short));
    s.submit(batch(1, "p", elastic(4), t0()));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    assert!(s.set_demand(BatchKey(1), 2), "it wants more than it holds");
    assert_eq!(granted(&s.grow(t0())).len(), 2);
    assert_eq!(gpus_used(&s), 5);
    // n1's lease lapses: its extras go, the batch does not fail.
    let later = short + Duration::seconds(1);
    let d = s.pass(later);
    let failed: Vec<&Vec<BatchKey>> = d
        .iter()
        .filter_map(|d| match d {
            Decision::LoseNode { failed, .. } => Some(failed),
            _ => None,
        })
        .collect();
    assert_eq!(failed, vec![&Vec::<BatchKey>::new()], "{d:?}");
    let lost = s.grow(later);
    assert_eq!(lost.len(), 2, "{lost:?}");
    assert!(lost.iter().all(|c| matches!(c, ExtraChange::Lost { .. })));
    let a = s.allocation(BatchKey(1)).expect("still running");
    assert!(a.extras().is_empty());
    assert_eq!(gpus_used(&s), 3);
    s.check_invariants().expect("invariants");
    // The core's node lapses: now the batch fails.
    let d = s.pass(long + Duration::seconds(1));
    assert!(
        d.iter().any(
            |d| matches!(d, Decision::LoseNode { failed, .. } if failed == &vec![BatchKey(1)])
        )
    );
    assert!(s.allocation(BatchKey(1)).is_none());
    s.check_invariants().expect("invariants");
}

#[test]
fn an_idle_extra_goes_back_by_name_and_demand_alone_gives_nothing_back() {
    let mut s = one_growing_node();
    s.submit(batch(1, "p", elastic(4), t0()));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    // Spark's target is the core's 2 executors and 3 more.
    assert_eq!(s.extras_for_target(BatchKey(1), 5), Some(3));
    assert_eq!(s.extras_for_target(BatchKey(1), 1), Some(0));
    assert_eq!(
        s.extras_for_target(BatchKey(1), 99),
        Some(4),
        "capped at its most"
    );
    s.set_demand(BatchKey(1), 3);
    assert_eq!(granted(&s.grow(t0())).len(), 3);
    let extras = s
        .allocation(BatchKey(1))
        .expect("running")
        .extras()
        .to_vec();
    // Spark wants fewer: on a server nothing goes back until a worker is idle.
    assert!(!s.set_demand(BatchKey(1), 0));
    assert_eq!(
        s.allocation(BatchKey(1)).expect("running").extras().len(),
        3
    );
    // The middle one is idle: that one goes back, the others stay in order.
    let at = t0() + Duration::seconds(90);
    let r = s.release_extra(BatchKey(1), &extras[1].node, &extras[1].gpus, at);
    assert!(
        matches!(&r, Some(ExtraChange::Released { placement, since, .. }) if placement == &extras[1] && *since == t0()),
        "{r:?}"
    );
    let left = s
        .allocation(BatchKey(1))
        .expect("running")
        .extras()
        .to_vec();
    assert_eq!(left, vec![extras[0].clone(), extras[2].clone()]);
    assert!(
        s.release_extra(BatchKey(1), &extras[1].node, &extras[1].gpus, at)
            .is_none()
    );
    assert_eq!(gpus_used(&s), 5);
    s.check_invariants().expect("invariants");
    // Another replica gave back the first: the core follows the store.
    let r = s.sync_extras(BatchKey(1), &left[1..], Some(1), at);
    assert_eq!(released(&r), 1);
    let view = s.elastic_view(BatchKey(1)).expect("elastic");
    assert_eq!(
        (view.core, view.extras, view.wanted, view.max),
        (2, 1, 1, 4)
    );
    assert_eq!(view.blocked_by, None);
    assert_eq!(gpus_used(&s), 4);
    s.check_invariants().expect("invariants");
}
