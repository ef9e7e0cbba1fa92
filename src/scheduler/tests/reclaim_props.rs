//! Reclaim's property test: random sequences of L4 batches that may
//! borrow A100-40s after a delay, A100 batches of their own (the owners),
//! ends and time that passes, each followed by a pass as the runner does;
//! reclaimed loans stop when their grace is over and go back to the queue
//! at their place, as the engine sends them. The world: region `r`, one L4
//! node of 4 GPUs (zone z1) and one A100-40 node of 8 in each of z2 and
//! z3; no preemption policy, quota for everything, one project, so the
//! order is the batches' age. Checked against the harness's own record of
//! what runs where, never the core's indexes:
//!
//! - every victim is a whole cluster on a loan that has run its minimum
//!   (10 minutes, the default), not already stopping, in the zone the
//!   decision names, reclaimed (never preempted: there is no policy) for
//!   a queued batch whose own placement is on A100s;
//! - as few victims as needed: the owner does not fit the zone with any
//!   one of them left running (the record's free GPUs);
//! - an owner that only loans keep from its GPUs — first of the queued
//!   owners, some zone has room for it once the loans there are gone —
//!   is allocated within the loans' minimum run, plus the grace, plus a
//!   pass, of the moment that became true: a loan never delays it longer,
//!   and no new loan takes what it waits for;
//! - a reclaimed batch goes back to the queue at its place (its queue
//!   time kept);
//! - no GPU is held twice, counting what is set aside (the core's
//!   `check_invariants`, and the record's GPU count per node).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;

use super::alternatives::{a100_gang, a100_node, with_a100_alternative};
use super::*;

/// A loan's minimum run (the default rule) and a reclaimed loan's grace
/// (the default, where preemption is off).
const MIN_RUN_S: i64 = 600;
const GRACE_S: i64 = 60;

#[derive(Debug, Clone)]
enum Op {
    /// An L4 batch of a driver and `executors` executors (one GPU each)
    /// that may take A100-40s after `after_s`.
    Borrower {
        executors: u32,
        after_s: u64,
    },
    /// An A100-40 batch of its own: a driver and `executors` executors.
    Owner {
        executors: u32,
    },
    /// A running batch ends.
    Finish(usize),
    Advance(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u32..=3, prop::sample::select(vec![0u64, 60, 300, 900]))
            .prop_map(|(executors, after_s)| Op::Borrower { executors, after_s }),
        2 => (0u32..=7).prop_map(|executors| Op::Owner { executors }),
        2 => any::<usize>().prop_map(Op::Finish),
        4 => (1i64..900).prop_map(Op::Advance),
    ]
}

/// What the harness knows of a running cluster.
#[derive(Debug, Clone)]
struct Running {
    zone: String,
    gpus: u64,
    allocated_at: DateTime<Utc>,
    loan: bool,
}

struct Harness {
    s: Scheduler,
    now: DateTime<Utc>,
    next_key: i64,
    /// Every batch as submitted, by key.
    submitted: HashMap<BatchKey, PendingBatch>,
    queued: BTreeSet<BatchKey>,
    running: BTreeMap<BatchKey, Running>,
    /// Victims stopping, and when their grace ends.
    stopping: BTreeMap<BatchKey, DateTime<Utc>>,
    /// The owner at the head of the queued owners, and since when only
    /// loans keep it from its GPUs.
    blocked_by_loans: Option<(BatchKey, DateTime<Utc>)>,
    reclaims: u32,
}

impl Harness {
    fn new() -> Harness {
        let mut s = alternatives::two_types();
        s.add_node(a100_node("a100-2", "z3"));
        Harness {
            s,
            now: t0(),
            next_key: 1,
            submitted: HashMap::new(),
            queued: BTreeSet::new(),
            running: BTreeMap::new(),
            stopping: BTreeMap::new(),
            blocked_by_loans: None,
            reclaims: 0,
        }
    }

    fn submit(&mut self, request: Request) {
        let key = self.next_key;
        self.next_key += 1;
        let b = batch(key, "p", request, self.now);
        self.submitted.insert(b.key, b.clone());
        self.queued.insert(b.key);
        self.s.submit(b);
    }

    /// Free GPUs of `zone` by the record (each A100 zone has 8).
    fn free_in(&self, zone: &str) -> u64 {
        8 - self
            .running
            .values()
            .filter(|r| r.zone == zone)
            .map(|r| r.gpus)
            .sum::<u64>()
    }

    /// GPUs of `zone` held by loans not stopping yet.
    fn lent_in(&self, zone: &str) -> u64 {
        self.running
            .iter()
            .filter(|(k, r)| r.zone == zone && r.loan && !self.stopping.contains_key(k))
            .map(|(_, r)| r.gpus)
            .sum()
    }

    /// The GPUs a queued owner needs (None: not an owner).
    fn owner_needs(&self, key: BatchKey) -> Option<u64> {
        let b = self.submitted.get(&key)?;
        (b.cluster.accelerator() == Some(Accelerator::A100_40)).then(|| b.cluster.total_gpus())
    }

    fn check_reclaim(&mut self, p: &Preemption) -> Result<(), TestCaseError> {
        let need = self.owner_needs(p.preemptor);
        prop_assert!(
            need.is_some(),
            "batch {} reclaims, but owns no A100s",
            p.preemptor.0
        );
        prop_assert!(
            self.queued.contains(&p.preemptor),
            "preemptor {} not queued",
            p.preemptor.0
        );
        prop_assert!(!p.victims.is_empty());
        for v in &p.victims {
            prop_assert!(v.cause.is_reclaim(), "no policy, yet {:?}", v.cause);
            let run = self.running.get(&v.key);
            prop_assert!(run.is_some(), "victim {} is not running", v.key.0);
            let run = run.expect("running");
            prop_assert!(run.loan, "victim {} is not on a loan", v.key.0);
            prop_assert_eq!(&run.zone, &p.zone, "victims of one zone");
            prop_assert!(
                !self.stopping.contains_key(&v.key),
                "victim {} twice",
                v.key.0
            );
            prop_assert!(
                (self.now - run.allocated_at).num_seconds() >= MIN_RUN_S,
                "victim {} reclaimed after {}s on loan",
                v.key.0,
                (self.now - run.allocated_at).num_seconds()
            );
        }
        // As few as needed, where no other reclaim sets this zone's GPUs
        // aside: one victim fewer and the owner no longer fits.
        let need = need.expect("an owner");
        let others = self
            .stopping
            .keys()
            .any(|k| self.running.get(k).is_some_and(|r| r.zone == p.zone));
        if !others {
            let freed: u64 = p.victims.iter().map(|v| v.gpus).sum();
            let free = self.free_in(&p.zone);
            prop_assert!(free + freed >= need, "the owner fits once they are gone");
            for v in &p.victims {
                prop_assert!(
                    free + freed - v.gpus < need,
                    "victim {} could be spared: {free} free + {freed} freed, {need} needed",
                    v.key.0
                );
            }
        }
        let grace = self.now + Duration::seconds(GRACE_S);
        for v in &p.victims {
            self.stopping.insert(v.key, grace);
        }
        self.reclaims += 1;
        Ok(())
    }

    fn pass(&mut self) -> Result<(), TestCaseError> {
        let now = self.now;
        for d in self.s.pass(now) {
            match &d {
                Decision::Allocate(a) => {
                    prop_assert!(self.queued.remove(&a.key), "batch {} not queued", a.key.0);
                    self.running.insert(
                        a.key,
                        Running {
                            zone: a.zone.clone(),
                            gpus: a.gpus(),
                            allocated_at: now,
                            loan: a.loan().is_some(),
                        },
                    );
                    if self.blocked_by_loans.is_some_and(|(k, _)| k == a.key) {
                        self.blocked_by_loans = None;
                    }
                }
                Decision::Expire { key, .. } => {
                    self.queued.remove(key);
                    if self.blocked_by_loans.is_some_and(|(k, _)| k == *key) {
                        self.blocked_by_loans = None;
                    }
                }
                Decision::Preempt(p) => self.check_reclaim(p)?,
                other => prop_assert!(false, "unexpected decision {other:?}"),
            }
        }
        self.s.check_invariants().map_err(TestCaseError::fail)?;
        for zone in ["z2", "z3"] {
            let held: u64 = self
                .running
                .values()
                .filter(|r| r.zone == zone)
                .map(|r| r.gpus)
                .sum();
            prop_assert!(held <= 8, "{zone}: {held} GPUs held of 8");
        }
        self.check_owner_waits()
    }

    /// The first queued owner that only loans keep from its GPUs is
    /// allocated within their minimum run, the grace and a pass.
    fn check_owner_waits(&mut self) -> Result<(), TestCaseError> {
        let head = self
            .queued
            .iter()
            .copied()
            .find(|k| self.owner_needs(*k).is_some());
        let only_loans = head.filter(|k| {
            let need = self.owner_needs(*k).unwrap_or(u64::MAX);
            ["z2", "z3"]
                .iter()
                .any(|z| self.free_in(z) + self.lent_in(z) >= need)
                && !self.s.is_claiming(*k)
                && self.stopping.is_empty()
        });
        match (only_loans, self.blocked_by_loans) {
            (Some(k), Some((since_key, since))) if k == since_key => {
                let bound = since + Duration::seconds(MIN_RUN_S + GRACE_S + 1);
                prop_assert!(
                    self.now <= bound,
                    "owner {} blocked only by loans since {since}, still queued at {}",
                    k.0,
                    self.now
                );
            }
            (Some(k), _) => self.blocked_by_loans = Some((k, self.now)),
            (None, _) => {}
        }
        Ok(())
    }

    /// Victims whose grace is over by `now` stop: their clusters leave,
    /// and their batches go back to the queue at their place.
    fn stop_victims(&mut self) {
        let due: Vec<BatchKey> = self
            .stopping
            .iter()
            .filter(|(_, at)| **at <= self.now)
            .map(|(k, _)| *k)
            .collect();
        for key in due {
            self.stopping.remove(&key);
            self.running.remove(&key);
            self.s.forget(key, self.now);
            if let Some(b) = self.submitted.get(&key) {
                let mut again = b.clone();
                again.deadline = again.cluster.deadline(self.now);
                self.queued.insert(key);
                self.s.submit(again);
            }
        }
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Borrower { executors, after_s } => {
                let c = cluster(executors, ProvisioningMode::Queue, 3600, None);
                self.submit(with_a100_alternative(c, after_s));
            }
            Op::Owner { executors } => self.submit(a100_gang(executors).into()),
            Op::Finish(i) => {
                let ended: Vec<BatchKey> = self
                    .running
                    .keys()
                    .filter(|k| !self.stopping.contains_key(k))
                    .copied()
                    .collect();
                if !ended.is_empty() {
                    let key = ended[i % ended.len()];
                    self.running.remove(&key);
                    self.s.forget(key, self.now);
                }
            }
            Op::Advance(secs) => {
                let target = self.now + Duration::seconds(secs);
                // A pass at each stop and at each instant the core asks
                // for, as the runner's loop does.
                loop {
                    let stop = self.stopping.values().min().copied();
                    let next = [stop, self.s.next_deadline()]
                        .into_iter()
                        .flatten()
                        .filter(|t| *t > self.now && *t <= target)
                        .min();
                    let Some(t) = next else { break };
                    self.now = t;
                    self.stop_victims();
                    self.pass()?;
                }
                self.now = target;
                self.stop_victims();
            }
        }
        self.pass()
    }
}

fn run(ops: Vec<Op>) -> Result<u32, TestCaseError> {
    let mut h = Harness::new();
    for op in ops {
        h.apply(op)?;
    }
    Ok(h.reclaims)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn loans_are_reclaimed_whole_after_their_minimum_run_and_owners_are_not_kept_waiting(
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        run(ops)?;
    }
}

/// The checks above see something: over a fixed seed, loans are reclaimed.
#[test]
fn a_fixed_seed_run_reclaims_loans() {
    let mut runner = fixed_seed_runner(64);
    let total = std::cell::Cell::new(0u32);
    runner
        .run(&proptest::collection::vec(op(), 1..80), |ops| {
            total.set(total.get() + run(ops)?);
            Ok(())
        })
        .expect("the property holds on the fixed seed");
    assert!(total.get() > 0, "no loan was reclaimed in 64 runs");
}
