//! Preemption's property test: random sequences of submits (priorities,
//! projects, sizes, GPU types, opt-outs), ends, cancels, victims that stop
//! one at a time, holds, cordons and time that passes, under random
//! policies, each followed by a pass as the runner does. The world has two
//! zones, two GPU types (zone `b` has an A100 node beside its L4 one) and
//! a project whose quota binds. Checked against the harness's own record
//! of what runs where (each cluster's nodes and GPUs), never the core's
//! indexes:
//!
//! - every victim was running, old enough, not protected by
//!   `max_preemptions`, not opted out where that is honoured, and given a
//!   cause the policy allows (a strictly higher priority, or a fair-share
//!   gap beyond the margin); no held queue preempts;
//! - as few victims as needed: where no other preemption is under way, no
//!   victim could be spared so that the preemptor still fits whole on one
//!   node of the zone (the record's free GPUs, cores, memory and SSD);
//! - a preemptor is allocated only once every victim is gone, victims
//!   leaving one at a time, and then at once, in the zone the decision
//!   named;
//! - no GPU is ever given to two clusters by the record, every allocation
//!   is whole, of its GPU type, off cordoned nodes and within quota (and
//!   the core's own `check_invariants` agrees);
//! - right after a fair-share preemption is settled, the victim's project
//!   cannot preempt the preemptor's back by fair share, where nothing but
//!   the preemption changed what the two projects run meanwhile (no
//!   priority preemption decided, no other cluster of theirs ended or
//!   started: docs/rules.md#preemption says why); and fair share never
//!   stops a cluster of higher priority than the preemptor's.
//!
//! Lost nodes and placement alternatives are not in this world; their
//! meeting with preemption is in the unit tests (`preempt.rs`).

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
        a100: bool,
    },
    Advance(i64),
    /// A running cluster (the n-th, modulo) ends on its own.
    End(usize),
    /// A queued batch (the n-th, modulo) is cancelled.
    Cancel(usize),
    /// One victim still stopping (the n-th, modulo) is gone, and queued
    /// again.
    VictimGone(usize),
    /// A node (the n-th, modulo) is cordoned, or its cordon lifted.
    Cordon(usize, bool),
    /// A project's queue is held, or released.
    Hold(usize, bool),
}

const PROJECTS: [&str; 3] = ["p0", "p1", "p2"];
/// `p1`'s preemptible L4 quota binds: fewer GPUs than the world has.
const P1_L4_LIMIT: u64 = 7;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (
            0..3usize,
            0..8u32,
            prop_oneof![Just(-1), Just(0), Just(1), Just(3), Just(10)],
            proptest::bool::weighted(0.8),
            proptest::bool::weighted(0.2),
        )
            .prop_map(|(project, executors, priority, preemptible, a100)| Op::Submit {
                project,
                executors: if a100 { executors % 4 } else { executors },
                priority,
                preemptible,
                a100,
            }),
        3 => (1..40i64).prop_map(Op::Advance),
        2 => any::<usize>().prop_map(Op::End),
        1 => any::<usize>().prop_map(Op::Cancel),
        3 => any::<usize>().prop_map(Op::VictimGone),
        1 => (any::<usize>(), proptest::bool::weighted(0.4)).prop_map(|(n, on)| Op::Cordon(n, on)),
        1 => (0..3usize, proptest::bool::weighted(0.4)).prop_map(|(p, on)| Op::Hold(p, on)),
    ]
}

/// An A100 (40 GB) node of `gpus` GPUs in zone `zone` of region `r`.
fn a100_node(id: &str, zone: &str, gpus: u32) -> NodeSpec {
    NodeSpec {
        pool: "a100".into(),
        accelerator: Accelerator::A100_40,
        cores: 12 * gpus,
        memory_mb: 85_000 * u64::from(gpus),
        ..l4_node(id, zone, gpus)
    }
}

/// `executors` + 1 parts of one A100 each, on preemptible A100 quota.
fn a100_cluster(executors: u32) -> ClusterRequest {
    let mut c = cluster(executors, ProvisioningMode::Queue, 3600, Some(14_400));
    let part = NodeShape {
        accelerator: Some(Accelerator::A100_40),
        cores: 12,
        gpus: 1,
        memory_mb: 60_000,
        memory_overhead_mb: 6_000,
        local_ssd_gb: 375,
    };
    c.driver = part;
    c.executor = part;
    c.quota[0].metric = QuotaMetric::PreemptibleNvidiaA100Gpus;
    c
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

/// What the harness knows of a running cluster: where it runs, exactly.
#[derive(Debug, Clone)]
struct Run {
    batch: PendingBatch,
    zone: String,
    placements: Vec<Placement>,
    allocated_at: DateTime<Utc>,
}

/// What the harness knows of a preemption under way.
struct Claimed {
    zone: String,
    /// Its victims not gone yet.
    waiting: BTreeSet<BatchKey>,
    /// The projects it preempted by fair share.
    fair: Vec<String>,
    /// A priority preemption was decided while its victims stopped.
    disturbed: bool,
    /// The GPUs of its victims gone so far: set aside for it alone.
    banked: BTreeSet<(NodeId, String)>,
    /// The other clusters its project and its fair-share victims'
    /// projects ran when it was decided: the standing it was judged on.
    bystanders: BTreeSet<BatchKey>,
}

struct Harness {
    s: Scheduler,
    policy: PreemptionPolicy,
    now: DateTime<Utc>,
    next: i64,
    queued: BTreeMap<BatchKey, PendingBatch>,
    running: BTreeMap<BatchKey, Run>,
    claims: HashMap<BatchKey, Claimed>,
    stopping: BTreeSet<BatchKey>,
    nodes: Vec<NodeSpec>,
    cordoned: BTreeSet<NodeId>,
    held: BTreeSet<String>,
}

/// Puts `item` in `set` when `on`, takes it out otherwise.
fn toggle<T: Ord>(set: &mut BTreeSet<T>, item: T, on: bool) {
    if on {
        set.insert(item);
    } else {
        set.remove(&item);
    }
}

impl Harness {
    fn new(policy: PreemptionPolicy) -> Harness {
        let a100_pool = PoolDecl {
            node: a100_node("b/a100", "b", 4),
            ..pool("b", 4, 1)
        };
        let mut rules = rules(1000);
        rules.push(QuotaRule {
            project: "*".into(),
            region: "*".into(),
            metric: QuotaMetric::PreemptibleNvidiaA100Gpus,
            limit: 1000,
        });
        let mut s = Scheduler::new(vec![pool("a", 4, 2), pool("b", 4, 1), a100_pool], rules);
        s.set_quota_limit("p1", "r", QuotaMetric::PreemptibleNvidiaL4Gpus, P1_L4_LIMIT);
        let nodes = vec![
            l4_node("a0", "a", 4),
            l4_node("a1", "a", 4),
            l4_node("b0", "b", 4),
            a100_node("b1", "b", 4),
        ];
        for n in &nodes {
            s.add_node(n.clone());
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
            nodes,
            cordoned: BTreeSet::new(),
            held: BTreeSet::new(),
        }
    }

    /// Whether a node of `zone` is cordoned (a cordon there since a
    /// preemption was decided may void its plan).
    fn cordoned_in(&self, zone: &str) -> bool {
        self.nodes
            .iter()
            .any(|n| n.zone == zone && self.cordoned.contains(&n.id))
    }

    /// What of each uncordoned node of `zone` is free by the record (GPUs,
    /// cores, memory, SSD), with the clusters of `gone` given back.
    fn free_in(&self, zone: &str, gone: &[BatchKey]) -> Vec<(&NodeSpec, [u64; 4])> {
        self.nodes
            .iter()
            .filter(|n| n.zone == zone && !self.cordoned.contains(&n.id))
            .map(|n| {
                let mut free = [
                    n.gpu_addresses.len() as u64,
                    u64::from(n.cores),
                    n.memory_mb,
                    n.local_ssd_gb,
                ];
                let held = self
                    .running
                    .iter()
                    .filter(|(k, _)| !gone.contains(k))
                    .flat_map(|(_, r)| &r.placements)
                    .filter(|p| p.node == n.id);
                for p in held {
                    free[0] -= p.gpus.len() as u64;
                    free[1] -= u64::from(p.cores);
                    free[2] -= p.memory_mb;
                    free[3] -= p.local_ssd_gb;
                }
                (n, free)
            })
            .collect()
    }

    /// Whether `c` fits whole on one node of `zone` by the record, once
    /// the clusters of `gone` are given back. Where one node takes every
    /// part, any placement that puts each part where it fits completes,
    /// so the core's search must find it.
    fn fits_on_one_node(&self, zone: &str, c: &ClusterRequest, gone: &[BatchKey]) -> bool {
        let parts = || {
            std::iter::once(&c.driver)
                .chain(std::iter::repeat_n(&c.executor, c.executor_count as usize))
        };
        self.free_in(zone, gone).into_iter().any(|(n, free)| {
            parts().all(|s| s.accelerator.is_none_or(|a| a == n.accelerator))
                && [
                    parts().map(|s| u64::from(s.gpus)).sum::<u64>(),
                    parts().map(|s| u64::from(s.cores)).sum(),
                    parts().map(|s| s.memory_mb + s.memory_overhead_mb).sum(),
                    parts().map(|s| s.local_ssd_gb).sum(),
                ]
                .iter()
                .zip(free)
                .all(|(need, free)| *need <= free)
        })
    }

    /// An allocation by the record: every part on an uncordoned node of its
    /// GPU type in the zone named, on GPUs no other cluster holds, and
    /// `p1`'s binding quota not exceeded.
    fn check_placements(&self, a: &Allocation, b: &PendingBatch) -> Result<(), TestCaseError> {
        let mut taken: HashMap<(&NodeId, &String), BatchKey> = HashMap::new();
        for (k, r) in &self.running {
            for p in &r.placements {
                for g in &p.gpus {
                    taken.insert((&p.node, g), *k);
                }
            }
        }
        for p in &a.placements {
            let node = self.nodes.iter().find(|n| n.id == p.node);
            prop_assert!(node.is_some(), "unknown node {}", p.node);
            let node = node.expect("known");
            prop_assert_eq!(&node.zone, &a.zone, "a part outside the zone named");
            prop_assert!(
                !self.cordoned.contains(&p.node),
                "a part on cordoned {}",
                p.node
            );
            let shape = match p.role {
                PartRole::Driver => &b.cluster.driver,
                PartRole::Executor => &b.cluster.executor,
            };
            prop_assert!(shape.accelerator.is_none_or(|t| t == node.accelerator));
            prop_assert_eq!(p.gpus.len() as u32, shape.gpus);
            for g in &p.gpus {
                prop_assert!(node.gpu_addresses.contains(g));
                if let Some(other) = taken.insert((&p.node, g), a.key) {
                    prop_assert!(
                        false,
                        "GPU {} of {} given to {} while {} holds it",
                        g,
                        p.node,
                        a.key.0,
                        other.0
                    );
                }
            }
        }
        if b.project == "p1" {
            let l4 = |c: &ClusterRequest| {
                c.quota
                    .iter()
                    .filter(|q| q.metric == QuotaMetric::PreemptibleNvidiaL4Gpus)
                    .map(|q| q.amount)
                    .sum::<u64>()
            };
            let used: u64 = self
                .running
                .values()
                .filter(|r| r.batch.project == "p1")
                .map(|r| l4(&r.batch.cluster))
                .sum();
            prop_assert!(used + l4(&b.cluster) <= P1_L4_LIMIT, "p1 over its L4 quota");
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Submit {
                project,
                executors,
                priority,
                preemptible,
                a100,
            } => {
                let c = if *a100 {
                    a100_cluster(*executors)
                } else {
                    cluster(*executors, ProvisioningMode::Queue, 3600, Some(14_400))
                };
                let mut b = batch(self.next, PROJECTS[*project], c, self.now);
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
            Op::VictimGone(n) => {
                if let Some(&key) = self.stopping.iter().nth(n % self.stopping.len().max(1)) {
                    self.stopping.remove(&key);
                    let run = self.running.remove(&key).expect("a stopping victim runs");
                    prop_assert!(self.s.forget(key, self.now).is_some());
                    for c in self.claims.values_mut() {
                        if c.waiting.remove(&key) {
                            c.banked.extend(
                                run.placements.iter().flat_map(|p| {
                                    p.gpus.iter().map(|g| (p.node.clone(), g.clone()))
                                }),
                            );
                        }
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
            Op::Cordon(n, on) => {
                let id = self.nodes[n % self.nodes.len()].id.clone();
                toggle(&mut self.cordoned, id, *on);
                let cordon = Cordon {
                    since: self.now,
                    by: "admin".into(),
                    drain: false,
                };
                let cordons = self.cordoned.iter().map(|id| (id.clone(), cordon.clone()));
                self.s.set_cordons(cordons.collect());
            }
            Op::Hold(p, on) => {
                let project = PROJECTS[*p].to_string();
                toggle(&mut self.held, project, *on);
                let hold = Hold {
                    since: self.now,
                    by: "admin".into(),
                };
                let holds = self
                    .held
                    .iter()
                    .map(|p| ("r".to_string(), Some(p.clone()), hold.clone()));
                self.s.set_holds(holds.collect());
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
            .filter(|(k, c)| c.waiting.is_empty() && self.queued.contains_key(k))
            .filter(|(k, _)| !self.held.contains(&self.queued[k].project))
            .filter(|(_, c)| {
                // A cordon since the decision may void its plan.
                !self.cordoned_in(&c.zone)
            })
            .map(|(k, _)| *k)
            .collect();
        let decisions = self.s.pass(now);
        let mut settled = Vec::new();
        for d in &decisions {
            match d {
                Decision::Provision(_) | Decision::Suspend(_) => {
                    prop_assert!(false, "no pool has a provisioner: {d:?}");
                }
                Decision::Allocate(a) => {
                    let b = self.queued.remove(&a.key);
                    prop_assert!(b.is_some(), "{} allocated but not queued", a.key.0);
                    let b = b.expect("queued");
                    prop_assert_eq!(
                        a.placements.len() as u32,
                        b.cluster.executor_count + 1,
                        "a whole cluster"
                    );
                    prop_assert!(
                        !self.held.contains(&b.project),
                        "{} of held {} allocated",
                        a.key.0,
                        b.project
                    );
                    self.check_placements(a, &b)?;
                    // What a victim gave back is its preemptor's alone,
                    // unless its queue was held since (a held queue
                    // reserves nothing) or a cordon voided its plan.
                    for (k, c) in &self.claims {
                        let held = self
                            .queued
                            .get(k)
                            .is_none_or(|p| self.held.contains(&p.project));
                        let voided = self.cordoned_in(&c.zone);
                        if held || voided {
                            continue;
                        }
                        let theirs = a
                            .placements
                            .iter()
                            .flat_map(|p| p.gpus.iter().map(|g| (p.node.clone(), g.clone())));
                        for gpu in theirs {
                            prop_assert!(
                                *k == a.key || !c.banked.contains(&gpu),
                                "GPU {:?} set aside for {} given to {}",
                                gpu,
                                k.0,
                                a.key.0
                            );
                        }
                    }
                    if let Some(c) = self.claims.remove(&a.key) {
                        prop_assert!(
                            c.waiting.is_empty(),
                            "preemptor {} allocated while {:?} still run",
                            a.key.0,
                            c.waiting
                        );
                        // In the zone the preemption named, unless a cordon
                        // there since voided its plan.
                        let voided = self.cordoned_in(&c.zone);
                        prop_assert!(
                            a.zone == c.zone || voided,
                            "preemptor {} allocated in {}, its preemption named {}",
                            a.key.0,
                            a.zone,
                            c.zone
                        );
                        let victims: Vec<BatchKey> = Vec::new();
                        let now_running = self.bystanders(&b.project, &c.fair, &victims);
                        if !c.disturbed && now_running == c.bystanders {
                            settled.push((b.project.clone(), c.fair));
                        }
                    }
                    self.running.insert(
                        a.key,
                        Run {
                            batch: b,
                            zone: a.zone.clone(),
                            placements: a.placements.clone(),
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
        // A claim whose victims are all gone is over, allocated or not (a
        // held queue, a cordon since): its preemptor may preempt again.
        self.claims.retain(|_, c| !c.waiting.is_empty());
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
        // A claim whose victims are all gone is over, allocated or not: a
        // cordon since may have voided its plan, and with nowhere else to
        // go its preemptor may preempt again in the very pass that ended
        // it (the record's claims are pruned only after the pass).
        if self
            .claims
            .get(&p.preemptor)
            .is_some_and(|c| c.waiting.is_empty())
        {
            self.claims.remove(&p.preemptor);
        }
        prop_assert!(!self.claims.contains_key(&p.preemptor), "preempting twice");
        prop_assert!(!p.victims.is_empty());
        prop_assert!(
            !self.held.contains(&preemptor.project),
            "held {} preempts",
            preemptor.project
        );
        // As few victims as needed, by the record: none of them could be
        // spared with the preemptor still fitting whole on one node. Only
        // where no other preemption is under way (what its plan sets aside
        // is the core's to know).
        if self.claims.is_empty() {
            let all: Vec<BatchKey> = p.victims.iter().map(|v| v.key).collect();
            for v in &p.victims {
                let spared: Vec<BatchKey> = all.iter().copied().filter(|k| *k != v.key).collect();
                prop_assert!(
                    !self.fits_on_one_node(&p.zone, &preemptor.cluster, &spared),
                    "victim {} was not needed: {} fits in {} without it",
                    v.key.0,
                    p.preemptor.0,
                    p.zone
                );
            }
        }
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
                    prop_assert!(
                        run.batch.priority <= preemptor.priority,
                        "fair share stops {} of priority {} for priority {}",
                        v.key.0,
                        run.batch.priority,
                        preemptor.priority
                    );
                    prop_assert!(preemptor_share * self.policy.fair_share_margin < *victim_share);
                    prop_assert!(*victim != preemptor.project);
                    fair.push(victim.clone());
                }
                // No batch of this harness has an alternative: none is on loan.
                Cause::Reclaim { .. } => {
                    prop_assert!(
                        false,
                        "victim {} reclaimed, but no batch is on loan",
                        v.key.0
                    );
                }
            }
        }
        for v in &p.victims {
            self.stopping.insert(v.key);
        }
        // A priority preemption decided while others' victims stop changes
        // the standings their fair-share decisions were judged on: "not
        // back" is a guarantee of a fair-share decision on its own
        // (docs/rules.md#preemption).
        if p.victims
            .iter()
            .any(|v| matches!(v.cause, Cause::Priority { .. }))
        {
            for c in self.claims.values_mut() {
                c.disturbed = true;
            }
        }
        let victims: Vec<BatchKey> = p.victims.iter().map(|v| v.key).collect();
        self.claims.insert(
            p.preemptor,
            Claimed {
                zone: p.zone.clone(),
                waiting: p.victims.iter().map(|v| v.key).collect(),
                bystanders: self.bystanders(&preemptor.project, &fair, &victims),
                fair,
                disturbed: false,
                banked: BTreeSet::new(),
            },
        );
        Ok(())
    }

    /// The running clusters of `project` and of the projects in `fair`,
    /// but `victims`.
    fn bystanders(
        &self,
        project: &str,
        fair: &[String],
        victims: &[BatchKey],
    ) -> BTreeSet<BatchKey> {
        self.running
            .iter()
            .filter(|(k, r)| {
                !victims.contains(k)
                    && (r.batch.project == project || fair.contains(&r.batch.project))
            })
            .map(|(k, _)| *k)
            .collect()
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
