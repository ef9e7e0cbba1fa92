//! Placement alternatives in the core: an alternative is tried only once its delay
//! has passed, at its batch's place in the queue, and takes the whole
//! reshaped cluster in one zone or nothing.

use super::*;
use crate::spec::alternatives::{Alternative, Target};

pub(super) fn a100_node(id: &str, zone: &str) -> NodeSpec {
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

/// `c` with one alternative: the same cluster on A100-40s, after `after_s`.
pub(super) fn with_a100_alternative(c: ClusterRequest, after_s: u64) -> Request {
    let gpus = u64::from(c.executor_count) + 1;
    let mut alternative = c.clone();
    alternative.driver = a100_part();
    alternative.executor = a100_part();
    alternative.quota = vec![
        QuotaAmount {
            metric: QuotaMetric::PreemptibleNvidiaA100Gpus,
            amount: gpus,
        },
        QuotaAmount {
            metric: QuotaMetric::LocalSsdTotalGb,
            amount: 375 * gpus,
        },
    ];
    Request {
        cluster: c,
        alternatives: vec![Alternative {
            index: 1,
            after_s,
            target: Target::Accelerator(Accelerator::A100_40),
            region: "r".into(),
            cluster: alternative,
        }],
    }
}

/// An A100-40 driver and `executors` A100-40 executors, asked directly.
pub(super) fn a100_gang(executors: u32) -> ClusterRequest {
    let c = with_a100_alternative(cluster(executors, ProvisioningMode::Queue, 3600, None), 0);
    c.alternatives[0].cluster.clone()
}

/// One L4 node of 4 GPUs in z1 and one A100-40 node of 8 in z2, quota
/// for both.
pub(super) fn two_types() -> Scheduler {
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

/// `two_types` with batch 1 (p) running on the whole L4 node.
fn l4_node_full() -> Scheduler {
    let mut s = two_types();
    s.submit(batch(1, "p", l4_gang(), t0()));
    assert_eq!(allocated(&s.pass(t0())), vec![1], "the L4 node is full now");
    s
}

/// A driver and two executors on L4: the whole of `two_types`'s L4 node.
fn l4_gang() -> ClusterRequest {
    cluster(3, ProvisioningMode::Queue, 3600, None)
}

#[test]
fn an_alternative_is_tried_once_its_delay_has_passed_and_takes_the_whole_reshaped_cluster() {
    let mut s = l4_node_full();
    let waiting = with_a100_alternative(cluster(2, ProvisioningMode::Queue, 3600, None), 900);
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
                .any(|r| r.kind == crate::scheduler::NotAdmitted::Alternative
                    && r.message
                        .starts_with("alternative 1 (a100-40 after 15m): tried from")),
            "{:?}",
            info.reasons
        );
    }
    // At the very instant it ripens, the alternative is no longer "tried from"
    // (cargo-mutants: `>` → `>=` in `alternative_reasons` was missed).
    let info = s.pending_info(BatchKey(2), ripe).expect("queued");
    assert!(
        !info
            .reasons
            .iter()
            .any(|r| r.message.contains("tried from")),
        "{:?}",
        info.reasons
    );
    let d = s.pass(ripe);
    let [Decision::Allocate(a)] = d.as_slice() else {
        panic!("one allocation on the rung: {d:?}");
    };
    assert_eq!(a.key, BatchKey(2));
    assert_eq!(a.alternative_index(), 1);
    assert_eq!(a.zone, "z2");
    assert_eq!(a.accelerator, "a100-40");
    assert_eq!(a.alternative.as_ref().map(|r| r.asked), Some("l4"));
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
fn without_an_alternative_a_batch_waits_for_its_own_placement() {
    let mut s = l4_node_full();
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
fn the_owners_of_the_gpus_go_before_an_earlier_batchs_loan_on_them() {
    let mut s = l4_node_full();
    // Batch 2 waits for L4 with an A100 alternative; batch 3, queued after it,
    // asks for 8 A100s directly.
    s.submit(batch(
        2,
        "p",
        with_a100_alternative(cluster(2, ProvisioningMode::Queue, 3600, None), 600),
        t0(),
    ));
    s.submit(batch(3, "p", a100_gang(7), t0() + Duration::seconds(1)));
    let d = s.pass(t0() + Duration::seconds(1));
    assert_eq!(allocated(&d), vec![3], "before the rung ripens, 3 fits");
    s.forget(BatchKey(3), t0() + Duration::seconds(2));
    // When the alternative ripens, batch 2 comes first in the queue, but
    // the A100s' own batch 4 fits them: it takes them, and the loan waits.
    s.submit(batch(4, "p", a100_gang(7), t0() + Duration::seconds(3)));
    let d = s.pass(t0() + Duration::seconds(600));
    assert_eq!(allocated(&d), vec![4], "the owner goes first: {d:?}");
    assert!(s.check_invariants().is_ok());
}

#[test]
fn a_loan_put_off_for_an_owner_that_cannot_start_is_granted_in_the_same_pass() {
    let mut s = l4_node_full();
    // Project q has no A100 quota: its A100 batch fits the capacity but
    // cannot start, so the loan the walk put off for it goes through.
    s.set_quota_limit("q", "r", QuotaMetric::PreemptibleNvidiaA100Gpus, 0);
    s.submit(batch(
        2,
        "p",
        with_a100_alternative(cluster(2, ProvisioningMode::Queue, 3600, None), 600),
        t0(),
    ));
    s.submit(batch(3, "q", a100_gang(7), t0() + Duration::seconds(1)));
    let d = s.pass(t0() + Duration::seconds(600));
    assert_eq!(allocated(&d), vec![2], "{d:?}");
    let loan = s.running.get(&BatchKey(2)).expect("running");
    assert!(loan.loan().is_some());
    assert!(s.check_invariants().is_ok());
}

#[test]
fn a_reservation_for_l4_does_not_hold_back_an_alternative_on_a100s() {
    let mut s = two_types();
    // The L4 node is held for two hours: batch 2's start is estimated.
    s.submit(batch(
        1,
        "p",
        cluster(3, ProvisioningMode::Queue, 3600, Some(7200)),
        t0(),
    ));
    s.pass(t0());
    // Batch 2 waits for L4 without an alternative and reserves it; batch 3,
    // behind it with no ttl (it would outlast any reservation), may take
    // A100s once its alternative ripens: they are nothing batch 2 could use.
    s.submit(batch(
        2,
        "p",
        cluster(2, ProvisioningMode::Queue, 3600, None),
        t0(),
    ));
    s.submit(batch(
        3,
        "p",
        with_a100_alternative(cluster(2, ProvisioningMode::Queue, 3600, None), 60),
        t0(),
    ));
    assert!(allocated(&s.pass(t0())).is_empty());
    assert_eq!(allocated(&s.pass(t0() + Duration::seconds(60))), vec![3]);
}

// ---- preemption meets placement alternatives ---------------------------

/// `two_types` with preemption on (default policy: by priority, 15 min of
/// min_runtime) in region `r`.
fn two_types_preempting() -> Scheduler {
    let mut s = two_types();
    s.set_preemption(std::collections::HashMap::from([(
        "r".to_string(),
        PreemptionPolicy::default(),
    )]));
    s
}

fn preempted(d: &[Decision]) -> Vec<(i64, Vec<i64>)> {
    d.iter()
        .filter_map(|d| match d {
            Decision::Preempt(p) => {
                Some((p.preemptor.0, p.victims.iter().map(|v| v.key.0).collect()))
            }
            _ => None,
        })
        .collect()
}

fn usage(s: &Scheduler, region: &str, metric: QuotaMetric) -> u64 {
    s.ledger_usage("p", region, metric)
}

#[test]
fn a_cluster_running_on_an_alternative_is_a_victim_like_any_and_gives_back_the_alternatives_quota()
{
    let mut s = two_types_preempting();
    // The L4 node is full; batch 2 asked for L4 and runs on its A100 alternative,
    // on all 8 A100s.
    s.submit(batch(1, "p", l4_gang(), t0()));
    s.submit(batch(
        2,
        "p",
        with_a100_alternative(cluster(7, ProvisioningMode::Queue, 3600, None), 0),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0())), vec![1, 2]);
    assert_eq!(usage(&s, "r", QuotaMetric::PreemptibleNvidiaA100Gpus), 8);
    // An urgent A100 batch, past min_runtime: the alternative's cluster stops.
    let at = t0() + Duration::minutes(20);
    let mut urgent = batch(3, "p", a100_gang(3), at);
    urgent.priority = 10;
    s.submit(urgent);
    let d = s.pass(at);
    assert_eq!(preempted(&d), vec![(3, vec![2])], "{d:?}");
    assert!(allocated(&d).is_empty());
    assert!(s.check_invariants().is_ok());
    // Gone: the A100 quota it drew on its alternative comes back there, none of
    // the L4 quota it asked for was ever charged, and the preemptor gets
    // the A100s it was set aside.
    s.forget(BatchKey(2), at + Duration::seconds(30));
    assert_eq!(usage(&s, "r", QuotaMetric::PreemptibleNvidiaA100Gpus), 0);
    assert_eq!(usage(&s, "r", QuotaMetric::PreemptibleNvidiaL4Gpus), 4);
    let d = s.pass(at + Duration::seconds(30));
    assert_eq!(allocated(&d), vec![3]);
    assert_eq!(usage(&s, "r", QuotaMetric::PreemptibleNvidiaA100Gpus), 4);
    assert!(s.check_invariants().is_ok());
}

#[test]
fn a_preemptor_whose_alternative_ripens_while_its_victims_stop_keeps_to_one_placement() {
    let mut s = two_types_preempting();
    // L4 node full with batch 1; the A100 node full with batch 2 (asked
    // directly), which ends later.
    s.submit(batch(1, "p", l4_gang(), t0()));
    s.submit(batch(2, "p", a100_gang(7), t0()));
    assert_eq!(allocated(&s.pass(t0())), vec![1, 2]);
    // Batch 3, urgent, wants L4 (its A100 alternative after 30 min): it stops 1.
    let at = t0() + Duration::minutes(20);
    let mut urgent = batch(3, "p", with_a100_alternative(l4_gang(), 1800), at);
    urgent.priority = 10;
    s.submit(urgent);
    assert_eq!(preempted(&s.pass(at)), vec![(3, vec![1])]);
    // While 1 stops, the A100s free and 3's alternative ripens: it waits on what
    // is set aside for it, and takes no second placement.
    let ripe = at + Duration::minutes(30);
    s.forget(BatchKey(2), ripe);
    let d = s.pass(ripe);
    assert!(allocated(&d).is_empty(), "{d:?}");
    assert!(s.is_claiming(BatchKey(3)));
    assert!(s.check_invariants().is_ok());
    // Once 1 is gone, 3 runs on its own placement, the L4s, once.
    s.forget(BatchKey(1), ripe + Duration::seconds(10));
    let d = s.pass(ripe + Duration::seconds(10));
    let [Decision::Allocate(a)] = d.as_slice() else {
        panic!("one allocation: {d:?}");
    };
    assert_eq!(
        (a.key, a.alternative_index(), a.zone.as_str()),
        (BatchKey(3), 0, "z1")
    );
    assert!(s.check_invariants().is_ok());
}

#[test]
fn victims_are_chosen_by_the_region_their_cluster_runs_in_and_give_quota_back_there() {
    let mut s = two_types_preempting();
    s.set_quota_limit("p", "home", QuotaMetric::PreemptibleNvidiaL4Gpus, 100);
    // Batch 1 belongs to region `home`, which has no capacity; its region
    // alternative runs it in `r`, on the whole L4 node.
    let own = l4_gang();
    let c = Request {
        cluster: own.clone(),
        alternatives: vec![Alternative {
            index: 1,
            after_s: 0,
            target: Target::Region("r".into()),
            region: "r".into(),
            cluster: own,
        }],
    };
    let mut b = batch(1, "p", c, t0());
    b.region = "home".into();
    s.submit(b);
    let d = s.pass(t0());
    let [Decision::Allocate(a)] = d.as_slice() else {
        panic!("allocated on its region rung: {d:?}");
    };
    assert_eq!(a.region, "r");
    assert_eq!(usage(&s, "r", QuotaMetric::PreemptibleNvidiaL4Gpus), 4);
    assert_eq!(usage(&s, "home", QuotaMetric::PreemptibleNvidiaL4Gpus), 0);
    // An urgent L4 batch of `r` stops it: it runs in `r`.
    let at = t0() + Duration::minutes(20);
    let mut urgent = batch(2, "q", l4_gang(), at);
    urgent.priority = 10;
    s.submit(urgent);
    assert_eq!(preempted(&s.pass(at)), vec![(2, vec![1])]);
    s.forget(BatchKey(1), at + Duration::seconds(5));
    assert_eq!(usage(&s, "r", QuotaMetric::PreemptibleNvidiaL4Gpus), 0);
    assert_eq!(usage(&s, "home", QuotaMetric::PreemptibleNvidiaL4Gpus), 0);
    assert_eq!(allocated(&s.pass(at + Duration::seconds(5))), vec![2]);
    assert!(s.check_invariants().is_ok());
}

/// A ripe alternative counts its batch's region as a home of the alternative's region,
/// and its option in the batch's region, once per batch: each batch that
/// leaves takes its count with it, and the last leaves nothing behind
/// (cargo-mutants: `-=` → `/=` in `drop_alternatives` was missed; a count that
/// never falls widens every later pass's walk).
#[test]
fn batches_that_leave_take_their_ripe_alternatives_counts_with_them() {
    let mut s = l4_node_full();
    for key in [2, 3] {
        let mut c = with_a100_alternative(cluster(2, ProvisioningMode::Queue, 3600, None), 0);
        c.alternatives[0].region = "elsewhere".into();
        s.submit(batch(key, "p", c, t0()));
    }
    assert!(
        allocated(&s.pass(t0())).is_empty(),
        "nothing fits: {:?}",
        s.capacity.nodes.keys()
    );
    let homes = |s: &Scheduler| {
        s.queue
            .alternatives()
            .homes_of("elsewhere")
            .and_then(|h| h.get("r"))
            .copied()
    };
    let options = |s: &Scheduler| {
        s.queue
            .alternatives()
            .options("r")
            .map(|o| o.values().sum::<usize>())
    };
    assert_eq!(
        (homes(&s), options(&s)),
        (Some(2), Some(2)),
        "both rungs ripe"
    );
    s.forget(BatchKey(2), t0());
    assert_eq!((homes(&s), options(&s)), (Some(1), Some(1)));
    s.forget(BatchKey(3), t0());
    assert_eq!((homes(&s), options(&s)), (None, None));
    assert!(s.queue.alternatives().none_ripe());
}

/// The victims of the reclaims in `d`, by preemptor, each with its cause
/// label.
fn reclaimed(d: &[Decision]) -> Vec<(i64, Vec<(i64, &'static str)>)> {
    d.iter()
        .filter_map(|d| match d {
            Decision::Preempt(p) => Some((
                p.preemptor.0,
                p.victims
                    .iter()
                    .map(|v| (v.key.0, v.cause.label()))
                    .collect(),
            )),
            _ => None,
        })
        .collect()
}

/// `l4_node_full` with batch 2 (L4, an A100 alternative after 10m) on
/// loan on 3 of the A100 node's 8 GPUs from t0 + 10m.
fn a100s_on_loan() -> Scheduler {
    let mut s = l4_node_full();
    s.submit(batch(
        2,
        "p",
        with_a100_alternative(cluster(2, ProvisioningMode::Queue, 7200, None), 600),
        t0(),
    ));
    let ripe = t0() + Duration::minutes(10);
    let d = s.pass(ripe);
    assert_eq!(allocated(&d), vec![2], "the alternative takes A100s: {d:?}");
    let loan = s.running.get(&BatchKey(2)).expect("running");
    assert!(
        loan.loan().is_some(),
        "another GPU type is a loan: {loan:?}"
    );
    assert_eq!(loan.lender(), "a100-40 in z2");
    s
}

#[test]
fn an_owner_blocked_by_a_loan_takes_it_back_after_its_minimum_run_where_preemption_is_off() {
    let mut s = a100s_on_loan();
    // An A100 gang of all 8 GPUs, its own placement: blocked by the loan.
    let at = t0() + Duration::minutes(11);
    s.submit(batch(3, "q", a100_gang(7), at));
    let d = s.pass(at);
    assert!(d.is_empty(), "the loan has run 1 of its 10 minutes: {d:?}");
    // The region is looked at again when the loan has run its minimum.
    let matured = t0() + Duration::minutes(20);
    assert_eq!(s.next_deadline(), Some(matured));
    let d = s.pass(matured);
    assert_eq!(reclaimed(&d), vec![(3, vec![(2, "reclaim")])], "{d:?}");
    assert!(s.is_claiming(BatchKey(3)));
    assert!(s.check_invariants().is_ok());
    // The loan is gone: the owner is allocated on what was set aside.
    s.forget(BatchKey(2), matured + Duration::seconds(30));
    let d = s.pass(matured + Duration::seconds(30));
    assert_eq!(allocated(&d), vec![3]);
    assert!(s.check_invariants().is_ok());
}

#[test]
fn a_loan_whose_ladder_says_never_runs_to_its_end() {
    let mut s = a100s_on_loan();
    let rule = crate::spec::alternatives::rule_from_config(
        None,
        None,
        Some("l4"),
        &["a100-40 after 10m".to_string()],
        &[],
        Some("never"),
    )
    .expect("a rule");
    s.set_reclaim(vec![rule.clone()]);
    let at = t0() + Duration::minutes(11);
    s.submit(batch(3, "q", a100_gang(7), at));
    // Its deadline is 71 min after t0.
    for minutes in [20, 45, 69] {
        let d = s.pass(t0() + Duration::minutes(minutes));
        assert!(reclaimed(&d).is_empty(), "{minutes} min: {d:?}");
    }
    // A reload that gives the rule back applies to the loan already running.
    let mut after = rule;
    after.reclaim = crate::spec::alternatives::Reclaim::After(std::time::Duration::from_secs(600));
    s.set_reclaim(vec![after]);
    let d = s.pass(t0() + Duration::minutes(70));
    assert_eq!(reclaimed(&d), vec![(3, vec![(2, "reclaim")])], "{d:?}");
}

#[test]
fn a_loan_is_taken_back_before_an_owners_own_cluster_is_preempted() {
    let mut s = two_types_preempting();
    s.submit(batch(1, "p", l4_gang(), t0()));
    // Batch 4, an A100 batch of its own, of low priority, on 4 A100s.
    s.submit(batch(4, "q", a100_gang(3), t0()));
    assert_eq!(allocated(&s.pass(t0())), vec![1, 4]);
    // Batch 2 borrows 3 of the 4 A100s left.
    s.submit(batch(
        2,
        "p",
        with_a100_alternative(cluster(2, ProvisioningMode::Queue, 7200, None), 60),
        t0(),
    ));
    assert_eq!(allocated(&s.pass(t0() + Duration::minutes(1))), vec![2]);
    // An urgent A100 batch needs 4 GPUs: the loan alone makes room, though
    // batch 4 is of lower priority and the older.
    let at = t0() + Duration::minutes(30);
    let mut urgent = batch(3, "q", a100_gang(3), at);
    urgent.priority = 10;
    s.submit(urgent);
    let d = s.pass(at);
    assert_eq!(reclaimed(&d), vec![(3, vec![(2, "reclaim")])], "{d:?}");
    assert!(s.check_invariants().is_ok());
}

#[test]
fn an_alternative_on_on_demand_quota_is_no_loan() {
    let own = cluster(2, ProvisioningMode::Queue, 3600, None);
    let mut r = with_a100_alternative(own.clone(), 0);
    assert!(r.alternatives[0].is_loan());
    r.alternatives[0].target = Target::OnDemand;
    assert!(!r.alternatives[0].is_loan());
    r.alternatives[0].target = Target::Region("elsewhere".into());
    assert!(r.alternatives[0].is_loan());
}
