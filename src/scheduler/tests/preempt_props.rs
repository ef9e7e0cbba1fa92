//! Preemption's property test: random sequences of submits (priorities,
//! projects, sizes, opt-outs), ends, cancels, victims that stop and time
//! that passes, under random policies, each followed by a pass as the
//! runner does. Checked against the harness's own record of what runs:
//!
//! - every victim was running, old enough, not protected by
//!   `max_preemptions`, not opted out where that is honoured, and given a
//!   cause the policy allows (a strictly higher priority, or a fair-share
//!   gap beyond the margin);
//! - a preemptor is allocated only once every victim is gone, and then at
//!   once, in the zone the decision named (nothing here takes capacity or
//!   quota away meanwhile, so its plan must hold);
//! - no GPU is ever held twice, counting what is set aside for preemptors
//!   (`check_invariants`), and every allocation is whole;
//! - right after a fair-share preemption is settled, the victim's project
//!   cannot preempt the preemptor's back.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone)]
enum Op {
    Submit {
        project: usize,
        executors: u32,
        priority: i32,
        preemptible: bool,
    },
    Advance(i64),
    /// A running cluster (the n-th, modulo) ends on its own.
    End(usize),
    /// A queued batch (the n-th, modulo) is cancelled.
    Cancel(usize),
    /// Every victim still stopping is gone, and queued again.
    VictimsGone,
}

const PROJECTS: [&str; 3] = ["p0", "p1", "p2"];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 0..8u32, prop_oneof![Just(-1), Just(0), Just(1), Just(3), Just(10)], proptest::bool::weighted(0.8))
            .prop_map(|(project, executors, priority, preemptible)| Op::Submit {
                project,
                executors,
                priority,
                preemptible,
            }),
        3 => (1..40i64).prop_map(Op::Advance),
        2 => any::<usize>().prop_map(Op::End),
        1 => any::<usize>().prop_map(Op::Cancel),
        2 => Just(Op::VictimsGone),
    ]
}

fn policy() -> impl Strategy<Value = PreemptionPolicy> {
    (
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(1.0), Just(1.5), Just(3.0)],
        0..30u64,
        1..4u32,
        any::<bool>(),
    )
        .prop_map(|(prio, fair, margin, min, max, opt)| PreemptionPolicy {
            by_priority: prio || !fair,
            by_fair_share: fair,
            fair_share_margin: margin,
            min_runtime: std::time::Duration::from_secs(min * 60),
            max_preemptions: max,
            grace: std::time::Duration::from_secs(60),
            allow_opt_out: opt,
        })
}

/// What the harness knows of a running cluster.
#[derive(Debug, Clone)]
struct Run {
    batch: PendingBatch,
    zone: String,
    allocated_at: DateTime<Utc>,
}

struct Harness {
    s: Scheduler,
    policy: PreemptionPolicy,
    now: DateTime<Utc>,
    next: i64,
    queued: BTreeMap<BatchKey, PendingBatch>,
    running: BTreeMap<BatchKey, Run>,
    /// Preemptor → (its zone, the victims not gone yet, the fair-share
    /// projects it preempted).
    claims: HashMap<BatchKey, (String, BTreeSet<BatchKey>, Vec<String>)>,
    stopping: BTreeSet<BatchKey>,
}

impl Harness {
    fn new(policy: PreemptionPolicy) -> Harness {
        let mut s = Scheduler::new(vec![pool("a", 4, 2), pool("b", 4, 2)], rules(1000));
        for zone in ["a", "b"] {
            for i in 0..2 {
                s.add_node(l4_node(&format!("{zone}{i}"), zone, 4));
            }
        }
        s.set_preemption(HashMap::from([("r".to_string(), policy.clone())]));
        Harness {
            s,
            policy,
            now: t0(),
            next: 1,
            queued: BTreeMap::new(),
            running: BTreeMap::new(),
            claims: HashMap::new(),
            stopping: BTreeSet::new(),
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Submit {
                project,
                executors,
                priority,
                preemptible,
            } => {
                let mut b = batch(
                    self.next,
                    PROJECTS[*project],
                    cluster(*executors, ProvisioningMode::Queue, 3600, Some(14_400)),
                    self.now,
                );
                b.priority = *priority;
                b.cluster.preemptible = *preemptible;
                self.next += 1;
                self.queued.insert(b.key, b.clone());
                self.s.submit(b);
            }
            Op::Advance(m) => self.now += Duration::minutes(*m),
            Op::End(n) => {
                let ending: Vec<BatchKey> = self
                    .running
                    .keys()
                    .filter(|k| !self.stopping.contains(k))
                    .copied()
                    .collect();
                if !ending.is_empty() {
                    let key = ending[n % ending.len()];
                    self.running.remove(&key);
                    prop_assert!(self.s.forget(key, self.now).is_some());
                }
            }
            Op::Cancel(n) => {
                if !self.queued.is_empty() {
                    let key = *self.queued.keys().nth(n % self.queued.len()).expect("n");
                    self.queued.remove(&key);
                    self.claims.remove(&key);
                    self.s.forget(key, self.now);
                }
            }
            Op::VictimsGone => {
                for key in std::mem::take(&mut self.stopping) {
                    let run = self.running.remove(&key).expect("a stopping victim runs");
                    prop_assert!(self.s.forget(key, self.now).is_some());
                    for (_, waiting, _) in self.claims.values_mut() {
                        waiting.remove(&key);
                    }
                    // Back in the queue at its place, its preemption
                    // counted, a fresh deadline.
                    let mut b = run.batch;
                    b.preemptions += 1;
                    b.deadline = b.cluster.deadline(self.now);
                    self.queued.insert(b.key, b.clone());
                    self.s.submit(b);
                }
            }
        }
        self.pass()
    }

    fn pass(&mut self) -> Result<(), TestCaseError> {
        let now = self.now;
        // Preemptors whose victims are all gone: allocated in this pass.
        let due: BTreeSet<BatchKey> = self
            .claims
            .iter()
            .filter(|(k, (_, waiting, _))| waiting.is_empty() && self.queued.contains_key(k))
            .map(|(k, _)| *k)
            .collect();
        let decisions = self.s.pass(now);
        let mut settled = Vec::new();
        for d in &decisions {
            match d {
                Decision::Allocate(a) => {
                    let b = self.queued.remove(&a.key);
                    prop_assert!(b.is_some(), "{} allocated but not queued", a.key.0);
                    let b = b.expect("queued");
                    prop_assert_eq!(
                        a.placements.len() as u32,
                        b.cluster.executor_count + 1,
                        "a whole cluster"
                    );
                    if let Some((zone, waiting, fair)) = self.claims.remove(&a.key) {
                        prop_assert!(
                            waiting.is_empty(),
                            "preemptor {} allocated while {waiting:?} still run",
                            a.key.0
                        );
                        prop_assert_eq!(&a.zone, &zone, "the zone the preemption named");
                        settled.push((b.project.clone(), fair));
                    }
                    self.running.insert(
                        a.key,
                        Run {
                            batch: b,
                            zone: a.zone.clone(),
                            allocated_at: now,
                        },
                    );
                }
                Decision::Expire { key, .. } => {
                    prop_assert!(self.queued.remove(key).is_some());
                    self.claims.remove(key);
                }
                Decision::Reject { .. } | Decision::LoseNode { .. } => {
                    prop_assert!(false, "no default mode, no agents: {d:?}");
                }
                Decision::Preempt(p) => self.check_preemption(p)?,
            }
        }
        for key in due {
            prop_assert!(
                !self.queued.contains_key(&key),
                "preemptor {} was not allocated once its victims were gone",
                key.0
            );
        }
        self.s.check_invariants().map_err(TestCaseError::fail)?;
        for (preemptor_project, fair) in settled {
            self.not_back(&preemptor_project, &fair)?;
        }
        Ok(())
    }

    fn check_preemption(&mut self, p: &Preemption) -> Result<(), TestCaseError> {
        let Some(preemptor) = self.queued.get(&p.preemptor).cloned() else {
            return Err(TestCaseError::fail(format!(
                "preemptor {} is not queued",
                p.preemptor.0
            )));
        };
        prop_assert!(!self.claims.contains_key(&p.preemptor), "preempting twice");
        prop_assert!(!p.victims.is_empty());
        let min = Duration::from_std(self.policy.min_runtime).expect("minutes");
        let mut fair = Vec::new();
        for v in &p.victims {
            let run = self.running.get(&v.key);
            prop_assert!(run.is_some(), "victim {} is not running", v.key.0);
            let run = run.expect("running");
            prop_assert!(!self.stopping.contains(&v.key), "victim {} twice", v.key.0);
            prop_assert_eq!(&run.zone, &p.zone, "victims of one zone");
            prop_assert!(
                self.now - run.allocated_at >= min,
                "victim {} ran {} min < min_runtime",
                v.key.0,
                (self.now - run.allocated_at).num_minutes()
            );
            prop_assert!(run.batch.preemptions < self.policy.max_preemptions);
            prop_assert!(run.batch.cluster.preemptible || !self.policy.allow_opt_out);
            match &v.cause {
                Cause::Priority {
                    preemptor: a,
                    victim: b,
                } => {
                    prop_assert!(self.policy.by_priority);
                    prop_assert!(a > b && *a == preemptor.priority && *b == run.batch.priority);
                }
                Cause::FairShare {
                    preemptor_share,
                    victim_share,
                    victim,
                    ..
                } => {
                    prop_assert!(self.policy.by_fair_share);
                    prop_assert!(preemptor_share * self.policy.fair_share_margin < *victim_share);
                    prop_assert!(*victim != preemptor.project);
                    fair.push(victim.clone());
                }
            }
        }
        for v in &p.victims {
            self.stopping.insert(v.key);
        }
        self.claims.insert(
            p.preemptor,
            (
                p.zone.clone(),
                p.victims.iter().map(|v| v.key).collect(),
                fair,
            ),
        );
        Ok(())
    }

    /// Right after `preemptor_project` took GPUs by fair share from the
    /// projects `fair`, none of their queued batches could preempt its
    /// clusters back by fair share.
    fn not_back(&self, preemptor_project: &str, fair: &[String]) -> Result<(), TestCaseError> {
        for b in self.queued.values().filter(|b| fair.contains(&b.project)) {
            if let Some((p, _)) = self.s.plan_preemption(b, self.now) {
                for v in &p.victims {
                    prop_assert!(
                        !(v.project == preemptor_project
                            && matches!(v.cause, Cause::FairShare { .. })),
                        "{} would preempt {} back: {}",
                        b.project,
                        preemptor_project,
                        v.cause
                    );
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn preemption_stops_whole_old_enough_clusters_for_a_preemptor_that_then_fits(
        policy in policy(),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut h = Harness::new(policy);
        for op in &ops {
            h.apply(op)?;
        }
    }
}
