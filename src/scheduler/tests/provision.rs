//! Provisioned pools: a set of new nodes for the batch only capacity
//! blocks, the fewest that hold its whole cluster; its batch alone uses
//! them; it is allocated once every node registered, and stays queued
//! while the set fails whole (suspended, the pool backing off); idle nodes
//! are suspended down to the warm floor, never one that holds a part.

use super::*;

/// Zone `a` of region `r`: a pool of 4-GPU L4 nodes, at most `max`, that
/// a provisioner creates (10 min to register, suspended after 5 min idle,
/// `min` kept warm, backing off 1 min then 2, …).
fn provisioned(max: u32, min: u32) -> Scheduler {
    let mut decl = pool("a", 4, max);
    decl.provisioner = Some(ProvisionPolicy {
        resume_timeout: std::time::Duration::from_secs(600),
        suspend_after: std::time::Duration::from_secs(300),
        min_nodes: min,
        resume_rate: 100,
        backoff_base: std::time::Duration::from_secs(60),
        backoff_max: std::time::Duration::from_secs(3600),
        preempt_if_boot_over: None,
    });
    Scheduler::new(vec![decl], rules(100))
}

/// An agent's node registering as `id` in the pool, leased for a day.
fn register(s: &mut Scheduler, id: &str, at: DateTime<Utc>) {
    let mut spec = l4_node(id, "a", 4);
    spec.is_virtual = false;
    s.register_node(spec, 1, at + Duration::days(1));
}

fn sets(d: &[Decision]) -> Vec<&NodeSet> {
    d.iter()
        .filter_map(|d| match d {
            Decision::Provision(set) => Some(set),
            _ => None,
        })
        .collect()
}

fn suspended(d: &[Decision]) -> Vec<(&Suspension, Vec<String>)> {
    d.iter()
        .filter_map(|d| match d {
            Decision::Suspend(s) => Some((s, s.nodes.iter().map(|n| n.0.clone()).collect())),
            _ => None,
        })
        .collect()
}

fn ids(set: &NodeSet) -> Vec<&str> {
    set.slots.iter().map(|s| s.0.as_str()).collect()
}

#[test]
fn the_fewest_new_nodes_are_created_and_the_batch_is_allocated_once_all_registered() {
    let mut s = provisioned(8, 0);
    // A driver and 8 executors of one L4 each: 9 GPUs, 3 nodes of 4.
    s.submit(batch(
        1,
        "p",
        cluster(8, ProvisioningMode::Queue, 3600, None),
        t0(),
    ));
    let d = s.pass(t0());
    let set = sets(&d);
    assert_eq!(set.len(), 1, "{d:?}");
    assert_eq!(ids(set[0]), ["a-l4-0", "a-l4-1", "a-l4-2"]);
    assert_eq!(set[0].register_by, t0() + Duration::minutes(10));
    assert!(s.is_queued(BatchKey(1)));

    let t1 = t0() + Duration::seconds(30);
    register(&mut s, "a-l4-0", t1);
    register(&mut s, "a-l4-1", t1);
    // A small batch does not get the new nodes meanwhile: they are the
    // set's. It gets a node of its own.
    s.submit(batch(
        2,
        "p",
        cluster(0, ProvisioningMode::Queue, 3600, None),
        t1,
    ));
    let d = s.pass(t1);
    assert!(allocated(&d).is_empty(), "{d:?}");
    assert_eq!(ids(sets(&d)[0]), ["a-l4-3"]);
    assert_eq!(
        s.provisioning_line(BatchKey(1), t1).as_deref(),
        Some("provisioning 3 nodes in a (pool l4): 2 of 3 registered, 30s of 10m")
    );
    // No set of the pool completed yet: its start is estimated at the
    // resume timeout.
    let info = s.pending_info(BatchKey(1), t1).expect("queued");
    assert_eq!(
        info.estimated_start_time,
        Some(t0() + Duration::minutes(10))
    );
    assert!(
        info.reasons
            .iter()
            .any(|r| r.kind == NotAdmitted::Provisioning),
        "{info:?}"
    );

    let t2 = t1 + Duration::seconds(10);
    register(&mut s, "a-l4-2", t2);
    let d = s.pass(t2);
    assert_eq!(allocated(&d)[0], 1, "{d:?}");
    let Some(Decision::Allocate(a)) = d.first() else {
        panic!("{d:?}")
    };
    let mut nodes: Vec<&str> = a.placements.iter().map(|p| p.node.0.as_str()).collect();
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes, ["a-l4-0", "a-l4-1", "a-l4-2"]);
    assert_eq!(
        s.take_completed_sets()[0].1,
        std::time::Duration::from_secs(40)
    );
    // The first batch's 12th GPU is free: the small one takes it in the
    // same pass, and its own new node is given up.
    assert_eq!(allocated(&d), vec![1, 2], "{d:?}");
    let gone = suspended(&d);
    assert_eq!(gone[0].1, ["a-l4-3"]);
    assert!(matches!(
        gone[0].0.cause,
        SuspendCause::Abandoned {
            key: BatchKey(2),
            ..
        }
    ));
    // A set decided now is estimated to start after the pool's boot time:
    // 40 s, the one set it completed.
    s.submit(batch(
        3,
        "p",
        cluster(8, ProvisioningMode::Queue, 3600, None),
        t2,
    ));
    assert_eq!(sets(&s.pass(t2)).len(), 1);
    let info = s.pending_info(BatchKey(3), t2).expect("queued");
    assert_eq!(info.estimated_start_time, Some(t2 + Duration::seconds(40)));
}

#[test]
fn a_set_that_times_out_is_suspended_whole_and_its_batch_stays_queued_while_the_pool_backs_off() {
    let mut s = provisioned(8, 0);
    s.submit(batch(
        1,
        "p",
        cluster(8, ProvisioningMode::Queue, 7200, None),
        t0(),
    ));
    let d = s.pass(t0());
    assert_eq!(sets(&d).len(), 1);
    register(&mut s, "a-l4-0", t0() + Duration::seconds(5));
    register(&mut s, "a-l4-1", t0() + Duration::seconds(5));
    let at = t0() + Duration::minutes(10);
    let d = s.pass(at);
    let gone = suspended(&d);
    assert_eq!(gone.len(), 1, "{d:?}");
    assert_eq!(gone[0].1, ["a-l4-0", "a-l4-1", "a-l4-2"]);
    assert_eq!(gone[0].0.message, "2 of 3 nodes registered within 10m");
    assert!(matches!(
        gone[0].0.cause,
        SuspendCause::Failed { key: BatchKey(1), backoff_until, .. } if backoff_until == at + Duration::minutes(1)
    ));
    assert!(s.is_queued(BatchKey(1)), "the batch stays queued");
    assert_eq!(
        s.provisioned_state(&NodeId("a-l4-0".into())),
        Some("suspending")
    );
    // Backing off: not asked again within the minute.
    assert!(sets(&s.pass(at + Duration::seconds(30))).is_empty());
    s.nodes_suspended(&gone[0].0.nodes.clone());
    // Then again, from the lowest free ids; a second failure doubles the
    // backoff.
    let again = at + Duration::minutes(1);
    let d = s.pass(again);
    assert_eq!(ids(sets(&d)[0]), ["a-l4-0", "a-l4-1", "a-l4-2"], "{d:?}");
    s.resume_failed(BatchKey(1), "stock-out".into());
    let d = s.pass(again + Duration::seconds(1));
    let gone = suspended(&d);
    assert_eq!(gone[0].0.message, "stock-out");
    assert!(matches!(
        gone[0].0.cause,
        SuspendCause::Failed { backoff_until, .. } if backoff_until == again + Duration::seconds(1) + Duration::minutes(2)
    ));
    assert!(s.is_queued(BatchKey(1)));
}

#[test]
fn what_is_free_counts_and_is_set_aside_with_the_quota() {
    // At most 3 nodes; one was there already, free: the batch's 9 GPUs
    // need 2 more.
    let mut s = provisioned(3, 0);
    register(&mut s, "old", t0());
    s.ledger.set_rules(rules(12));
    s.submit(batch(
        1,
        "p",
        cluster(8, ProvisioningMode::Queue, 3600, None),
        t0(),
    ));
    let d = s.pass(t0());
    assert_eq!(ids(sets(&d)[0]), ["a-l4-0", "a-l4-1"], "{d:?}");
    // The old node's GPU in the plan is the set's: another project's batch
    // of 4 does not fit the 3 left; this project's is short of quota (9
    // of 12 set aside).
    s.submit(batch(
        2,
        "q",
        cluster(3, ProvisioningMode::Queue, 3600, None),
        t0(),
    ));
    s.submit(batch(
        3,
        "p",
        cluster(3, ProvisioningMode::Queue, 3600, None),
        t0(),
    ));
    let d = s.pass(t0() + Duration::seconds(1));
    assert!(allocated(&d).is_empty(), "{d:?}");
    let blockers = s.blockers(s.queue.get(BatchKey(3)).expect("queued"));
    assert!(
        blockers.iter().any(|b| matches!(b, Blocker::Quota(_))),
        "{blockers:?}"
    );
}

#[test]
fn a_batch_that_leaves_abandons_its_set_and_gives_back_what_was_set_aside() {
    let mut s = provisioned(8, 0);
    register(&mut s, "old", t0());
    s.submit(batch(
        1,
        "p",
        cluster(8, ProvisioningMode::Queue, 3600, None),
        t0(),
    ));
    assert_eq!(sets(&s.pass(t0())).len(), 1);
    register(&mut s, "a-l4-0", t0());
    s.forget(BatchKey(1), t0());
    let d = s.pass(t0() + Duration::seconds(1));
    let gone = suspended(&d);
    assert_eq!(gone[0].1, ["a-l4-0", "a-l4-1"]);
    assert!(matches!(
        gone[0].0.cause,
        SuspendCause::Abandoned {
            key: BatchKey(1),
            ..
        }
    ));
    // The old node is free again.
    s.submit(batch(
        2,
        "q",
        cluster(3, ProvisioningMode::Queue, 3600, None),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0() + Duration::seconds(2))), vec![2]);
}

#[test]
fn idle_nodes_are_suspended_down_to_the_warm_floor_never_one_that_holds_a_part_or_is_cordoned() {
    let mut s = provisioned(8, 1);
    for id in ["a-l4-0", "a-l4-1", "a-l4-2", "a-l4-3"] {
        register(&mut s, id, t0());
    }
    // One holds a part, one is cordoned.
    s.submit(batch(
        1,
        "p",
        cluster(0, ProvisioningMode::Queue, 3600, None),
        t0(),
    ));
    let d = s.pass(t0());
    let held = match d.first() {
        Some(Decision::Allocate(a)) => a.placements[0].node.clone(),
        other => panic!("{other:?}"),
    };
    let cordoned = ["a-l4-0", "a-l4-1", "a-l4-2", "a-l4-3"]
        .into_iter()
        .map(|n| NodeId(n.into()))
        .find(|n| *n != held)
        .expect("a node");
    s.set_cordons(vec![(
        cordoned.clone(),
        Cordon {
            since: t0(),
            by: "admin".into(),
            drain: false,
        },
    )]);
    // Not yet: 5 min idle.
    assert!(suspended(&s.pass(t0() + Duration::minutes(4))).is_empty());
    let d = s.pass(t0() + Duration::minutes(6));
    let gone = suspended(&d);
    assert_eq!(gone.len(), 1, "{d:?}");
    // 4 nodes, 1 warm: at most 3 go; of the idle, not the cordoned one.
    let mut expected: Vec<String> = ["a-l4-0", "a-l4-1", "a-l4-2", "a-l4-3"]
        .into_iter()
        .map(String::from)
        .filter(|n| *n != held.0 && *n != cordoned.0)
        .collect();
    expected.reverse();
    assert_eq!(gone[0].1, expected);
    assert_eq!(gone[0].0.cause, SuspendCause::Idle);
    s.nodes_suspended(&gone[0].0.nodes.clone());
    // The batch ends: its node idles from the next pass, and goes; the
    // cordoned one is the warm one left.
    s.forget(BatchKey(1), t0() + Duration::minutes(7));
    assert!(suspended(&s.pass(t0() + Duration::minutes(7))).is_empty());
    let d = s.pass(t0() + Duration::minutes(12));
    let gone = suspended(&d);
    assert_eq!(gone.len(), 1, "{d:?}");
    assert_eq!(
        gone[0].1,
        std::slice::from_ref(&held.0),
        "two left, one warm: the cordoned one stays"
    );
}

#[test]
fn nothing_idle_is_suspended_while_a_queued_batch_waits_for_its_gpus() {
    let mut s = provisioned(2, 0);
    register(&mut s, "a-l4-0", t0());
    register(&mut s, "a-l4-1", t0());
    // Needs 13 GPUs: more than the pool can ever hold now it is full.
    s.submit(batch(
        1,
        "p",
        cluster(12, ProvisioningMode::Queue, 7200, None),
        t0(),
    ));
    s.submit(batch(
        2,
        "p",
        cluster(8, ProvisioningMode::Queue, 7200, None),
        t0(),
    ));
    let _ = s.pass(t0());
    let d = s.pass(t0() + Duration::minutes(30));
    assert!(suspended(&d).is_empty(), "{d:?}");
}

/// A pool that boots slower (p90) than `preempt_if_boot_over`: a blocked
/// urgent batch preempts first; without the bound, new nodes come first.
#[test]
fn a_slow_pool_lets_preemption_go_first() {
    for (bound, preempts) in [(Some(10), true), (None, false), (Some(60), false)] {
        let mut decl = pool("a", 4, 8);
        decl.provisioner = Some(ProvisionPolicy {
            resume_timeout: std::time::Duration::from_secs(600),
            suspend_after: std::time::Duration::from_secs(300),
            min_nodes: 0,
            resume_rate: 100,
            backoff_base: std::time::Duration::from_secs(60),
            backoff_max: std::time::Duration::from_secs(3600),
            preempt_if_boot_over: bound.map(std::time::Duration::from_secs),
        });
        let mut s = Scheduler::new(vec![decl], rules(100));
        s.set_preemption(std::collections::HashMap::from([(
            "r".to_string(),
            PreemptionPolicy {
                by_priority: true,
                by_fair_share: false,
                fair_share_margin: 1.0,
                min_runtime: std::time::Duration::ZERO,
                max_preemptions: 3,
                grace: std::time::Duration::from_secs(60),
                allow_opt_out: false,
            },
        )]));
        // The pool booted once, in 40 s.
        s.provisions.succeeded(
            &super::super::provisions::pool_key("r", "a", "l4"),
            Duration::seconds(40),
        );
        register(&mut s, "old", t0());
        s.submit(batch(
            1,
            "p",
            cluster(3, ProvisioningMode::Queue, 3600, None),
            t0(),
        ));
        assert_eq!(allocated(&s.pass(t0())), vec![1]);
        let mut urgent = batch(
            2,
            "q",
            cluster(3, ProvisioningMode::Queue, 3600, None),
            t0(),
        );
        urgent.priority = 10;
        s.submit(urgent);
        let d = s.pass(t0() + Duration::seconds(1));
        let preempted = d.iter().any(|d| matches!(d, Decision::Preempt(_)));
        assert_eq!(preempted, preempts, "bound {bound:?}: {d:?}");
        assert_eq!(
            sets(&d).len(),
            usize::from(!preempts),
            "bound {bound:?}: {d:?}"
        );
    }
}

/// A provisioned pool's node whose lease expires is lost as any node is,
/// and suspended too (its machine may still be up); a lost node of a pool
/// without a provisioner is only lost.
#[test]
fn a_lost_node_of_a_provisioned_pool_is_suspended() {
    let mut s = provisioned(8, 0);
    s.submit(batch(
        1,
        "p",
        cluster(3, ProvisioningMode::Queue, 3600, None),
        t0(),
    ));
    let d = s.pass(t0());
    assert_eq!(ids(sets(&d)[0]), ["a-l4-0"]);
    let t1 = t0() + Duration::seconds(30);
    // Leased until a minute later only; it never heartbeats.
    let mut spec = l4_node("a-l4-0", "a", 4);
    spec.is_virtual = false;
    s.register_node(spec, 1, t1 + Duration::minutes(1));
    let d = s.pass(t1);
    assert_eq!(allocated(&d), vec![1], "{d:?}");

    let t2 = t1 + Duration::minutes(2);
    let d = s.pass(t2);
    assert!(
        d.iter().any(
            |d| matches!(d, Decision::LoseNode { failed, .. } if failed == &vec![BatchKey(1)])
        ),
        "{d:?}"
    );
    let gone = suspended(&d);
    assert_eq!(gone.len(), 1, "{d:?}");
    assert_eq!(gone[0].1, ["a-l4-0"]);
    assert_eq!(gone[0].0.cause, SuspendCause::Lost { epoch: 1 });
    assert!(
        gone[0].0.message.contains("lease expired"),
        "{:?}",
        gone[0].0
    );
    assert_eq!(
        s.provisioned_state(&NodeId("a-l4-0".into())),
        Some("suspending")
    );
    // Not suspended twice.
    let d = s.pass(t2 + Duration::seconds(1));
    assert!(suspended(&d).is_empty(), "{d:?}");
    s.nodes_suspended(&[NodeId("a-l4-0".into())]);
    assert_eq!(s.provisioned_state(&NodeId("a-l4-0".into())), None);

    // A cordoned node is lost, not suspended: the operator keeps it.
    let mut kept = provisioned(8, 0);
    let mut spec = l4_node("a-l4-5", "a", 4);
    spec.is_virtual = false;
    kept.register_node(spec, 1, t0() + Duration::minutes(1));
    kept.set_cordons(vec![(
        NodeId("a-l4-5".into()),
        Cordon {
            since: t0(),
            by: "admin".into(),
            drain: false,
        },
    )]);
    let d = kept.pass(t0() + Duration::minutes(2));
    assert!(
        d.iter().any(|d| matches!(d, Decision::LoseNode { .. })),
        "{d:?}"
    );
    assert!(suspended(&d).is_empty(), "{d:?}");

    // A pool without a provisioner: lost, nothing suspended.
    let mut plain = Scheduler::new(vec![pool("a", 4, 8)], rules(100));
    let mut spec = l4_node("n1", "a", 4);
    spec.is_virtual = false;
    plain.register_node(spec, 1, t0() + Duration::minutes(1));
    let d = plain.pass(t0() + Duration::minutes(2));
    assert!(
        d.iter().any(|d| matches!(d, Decision::LoseNode { .. })),
        "{d:?}"
    );
    assert!(suspended(&d).is_empty(), "{d:?}");
}

/// A lost node's suspension not written (the node registered again
/// meanwhile, on another replica): it is not being suspended, and the
/// core is rebuilt from the store as for the void loss.
#[test]
fn a_void_lost_node_suspension_keeps_the_node() {
    let mut s = provisioned(8, 0);
    let mut spec = l4_node("a-l4-0", "a", 4);
    spec.is_virtual = false;
    s.register_node(spec, 1, t0() + Duration::minutes(1));
    let d = s.pass(t0() + Duration::minutes(2));
    let gone = suspended(&d);
    assert_eq!(gone.len(), 1, "{d:?}");
    assert_eq!(gone[0].0.cause, SuspendCause::Lost { epoch: 1 });
    assert_eq!(
        s.provisioned_state(&NodeId("a-l4-0".into())),
        Some("suspending")
    );
    let settled = s.settle_commit(&d, &vec![false; d.len()], t0() + Duration::minutes(2));
    assert!(settled.rebuild);
    assert!(
        settled.void.iter().all(|(_, v)| *v == Void::NodeBack),
        "{:?}",
        settled.void
    );
    assert_eq!(settled.void.len(), d.len());
    assert_eq!(s.provisioned_state(&NodeId("a-l4-0".into())), None);
}
