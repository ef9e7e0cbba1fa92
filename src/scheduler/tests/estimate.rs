//! The estimated start of a queued batch, in strict and fair-share order,
//! and when there is none.

use super::*;

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
    let reasons = info(2).reasons;
    assert!(
        reasons
            .iter()
            .any(|r| r.kind == crate::scheduler::NotAdmitted::FairShare),
        "{reasons:?}"
    );
    let why = crate::scheduler::messages(&reasons).join(" | ");
    assert!(
        why.contains("behind 1 batch of 1 project in fair-share order")
            && why.contains("light 0.00; yours 3.00"),
        "{why}"
    );
}

/// A queued batch whose estimated start is past its allocation deadline
/// says it will likely expire, and by how much; one whose estimate is in
/// time, or that has no deadline, does not.
#[test]
fn a_batch_estimated_to_start_after_its_deadline_says_it_will_likely_expire() {
    let mut s = Scheduler::new(vec![pool("a", 4, 1)], rules(100));
    s.add_node(l4_node("n0", "a", 4));
    s.submit(batch(
        1,
        "p",
        cluster(3, ProvisioningMode::Queue, 7200, Some(3600)),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0())), vec![1]);
    // 2 may wait 30 min and would start when 1 ends, in an hour; 3 may
    // wait two hours and would start a minute after 2.
    s.submit(batch(
        2,
        "p",
        cluster(2, ProvisioningMode::Queue, 1800, Some(60)),
        t0(),
    ));
    s.submit(batch(
        3,
        "p",
        cluster(2, ProvisioningMode::Queue, 7200, Some(60)),
        t0(),
    ));
    assert!(allocated(&s.pass(t0())).is_empty());
    let why = |k| {
        crate::scheduler::messages(&s.pending_info(BatchKey(k), t0()).expect("queued").reasons)
            .join(" | ")
    };
    assert!(
        why(2).contains(
            "likely to expire: its estimated start 2026-11-29T13:00:00Z is 30m after its allocation deadline 2026-11-29T12:30:00Z"
        ),
        "{}",
        why(2)
    );
    assert!(!why(3).contains("likely to expire"), "{}", why(3));
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

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// A page of the queue estimates its batches in one walk
    /// (`estimates_in_order`); each estimate must be exactly the one the
    /// batch gets on its own (`pending_info`, one simulation behind the
    /// batches ahead): any order, shapes of 1 to 4 GPUs with and without
    /// a ttl, clusters running to their ttl or without one, a held
    /// project, a project short of quota.
    #[test]
    fn a_page_estimates_each_batch_as_it_is_estimated_alone(
        fair in proptest::bool::ANY,
        running in proptest::collection::vec((0u32..3, proptest::option::of(1u64..8)), 0..6),
        queued in proptest::collection::vec(
            (0usize..4, 0u32..3, proptest::option::of(1u64..8), -1i32..2),
            1..40,
        ),
        held in proptest::bool::ANY,
        skip in 0usize..10,
    ) {
        let mut rules = rules(100);
        // Project p3 has room for nothing.
        rules.push(QuotaRule {
            project: "p3".into(),
            region: "*".into(),
            metric: QuotaMetric::PreemptibleNvidiaL4Gpus,
            limit: 0,
        });
        let mut s = Scheduler::new(vec![pool("a", 4, 3), pool("b", 4, 3)], rules);
        s.set_fair_share(FairSharePolicy {
            order: if fair { Order::FairShare } else { Order::Strict },
            ..FairSharePolicy::default()
        });
        for (i, zone) in ["a", "a", "b"].into_iter().enumerate() {
            s.add_node(l4_node(&format!("n{i}"), zone, 4));
        }
        let mut key = 0;
        for (executors, ttl_h) in &running {
            key += 1;
            let c = cluster(*executors, ProvisioningMode::Queue, 7200, ttl_h.map(|h| h * 1800));
            s.submit(batch(key, &format!("p{}", key % 3), c, t0()));
            s.pass(t0());
        }
        for (project, executors, ttl_h, priority) in &queued {
            key += 1;
            let c = cluster(*executors, ProvisioningMode::Queue, 7200, ttl_h.map(|h| h * 1800));
            let mut b = batch(key, &format!("p{project}"), c, t0());
            b.priority = *priority;
            s.submit(b);
        }
        if held {
            s.set_holds(vec![(
                "r".into(),
                Some("p1".into()),
                Hold { since: t0(), by: "admin".into() },
            )]);
        }
        let now = t0() + Duration::seconds(60);
        for scope in [None, Some("p0")] {
        let (_, page) = s.queue_page("r", scope, skip, 50, now);
        for (b, info) in page {
            let alone = s.pending_info(b.key, now).expect("queued");
            proptest::prop_assert_eq!(
                info.estimated_start_time,
                alone.estimated_start_time,
                "batch {} at {}",
                b.key.0,
                info.queue_position
            );
            proptest::prop_assert_eq!(info.reasons, alone.reasons);
        }
        }
    }
}
