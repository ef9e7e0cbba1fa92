//! Held queues and cordoned nodes.

use super::*;

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
            info.reasons[0].kind == crate::scheduler::NotAdmitted::Held
                && info.reasons[0].message.contains("held by an admin (admin)"),
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
