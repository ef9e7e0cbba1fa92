//! What the core shows: queue pages with each batch's place and reasons,
//! and the scrape tally.

use super::*;

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
    let keys: Vec<BatchKey> = s.queue.batches().map(|b| b.key).collect();
    for k in keys {
        s.forget(k, later);
        check(&s, later);
    }
    let snapshot = s.snapshot(later);
    assert!(snapshot.pending.is_empty() && snapshot.wait_fraction.is_empty());
    assert!(s.queue.tally().is_empty());
}

/// Agents' nodes: the scrape counts those holding a lease, and a node is
/// of a pool only where it registered, never a virtual one (the engine
/// asks before counting a registration against the pool's max_nodes).
/// Found missed by cargo-mutants (BENCHMARKS.md, Testing).
#[test]
fn the_scrape_counts_agents_and_a_node_is_of_the_pool_it_registered_in() {
    let mut s = Scheduler::new(vec![pool("a", 4, 2), pool("b", 4, 2)], rules(100));
    s.add_node(l4_node("virtual", "a", 4));
    let agent = |id: &str, zone: &str| NodeSpec {
        is_virtual: false,
        ..l4_node(id, zone, 4)
    };
    let later = t0() + Duration::seconds(60);
    assert!(s.register_node(agent("g1", "a"), 1, later));
    assert!(s.register_node(agent("g2", "b"), 1, later));
    assert_eq!(s.snapshot(t0()).agent_nodes, 2);
    let id = |n: &str| NodeId(n.into());
    assert!(s.is_node_of_pool(&id("g1"), "a", "l4"));
    assert!(s.is_node_of_pool(&id("g2"), "b", "l4"));
    assert!(!s.is_node_of_pool(&id("g1"), "b", "l4"), "another zone");
    assert!(!s.is_node_of_pool(&id("g1"), "a", "a100"), "another pool");
    assert!(!s.is_node_of_pool(&id("virtual"), "a", "l4"), "virtual");
    assert!(!s.is_node_of_pool(&id("gone"), "a", "l4"));
}
