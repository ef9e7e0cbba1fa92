//! The property test: random sequences of what the engine does to the core
//! (submits, cancels, ends, requeues, agents registering and going silent,
//! holds, cordons, quota changes, config reloads, time passing), each
//! followed by a pass, as the runner does.
//!
//! Every decision is checked against the harness's own record of the world
//! ([`model::Model`]: what it submitted, which allocations it was told of,
//! its own deadlines, leases, holds and cordons), never against the core's
//! indexes: a core that forgot a batch, a deadline or a node would agree
//! with itself.
//!
//! The world is small enough for every resource to run out: two regions of
//! two zones, each zone with pools of two GPU types, nodes whose cores,
//! memory and local SSD per GPU vary on both sides of what parts ask, and
//! quota limits low enough to bind.
//!
//! Some queue-mode batches carry placement alternatives (alternatives): another
//! GPU type in their region (reshaped as a create does), on-demand quota,
//! or the other region, each with a delay within the allocation timeout.
//! An allocation on an alternative is checked against the alternative: its delay passed,
//! the whole alternative cluster in the alternative's region, the alternative's quota charged
//! there (the core's ledger against the model's), never a jump of a batch
//! ahead that fits the same shape on its own placement or its own alternative.

mod generate;
mod model;

use chrono::{DateTime, Duration, Utc};
use proptest::prelude::*;

use super::{pending_counted_one_by_one, t0};
use crate::scheduler::*;
use crate::spec::{QuotaMetric, Request};
use generate::{Op, PROJECTS, REGIONS, Setup, node_spec, op, policy, pools, setup};
use model::{End, Model};

/// Runs the core the way the runner does: a pass after every event, and a
/// pass at each deadline and lease expiry the harness itself recorded
/// while time advances.
struct Harness {
    s: Scheduler,
    now: DateTime<Utc>,
    next_key: i64,
    next_epoch: u64,
    m: Model,
    tally: Tally,
}

/// What a run exercised: a harness whose checks never see an allocation,
/// an alternative taken or a queue judged would pass whatever the core does.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    allocations: u32,
    on_alternatives: u32,
    /// Regions whose queue head the liveness check judged.
    heads_judged: u32,
    stock_outs: u32,
}

impl Harness {
    fn new(setup: &Setup) -> Harness {
        let mut m = Model::new(setup.limits.rules(), setup.strict);
        for (i, (zone, pool, g)) in setup.virtual_nodes.iter().enumerate() {
            let spec = node_spec(format!("virtual/{zone}/{pool}/{i}"), *zone, *pool, *g, true);
            if m.pool_room(&spec) {
                m.declare_virtual(spec);
            }
        }
        let s = Scheduler::with_layout(m.layout(pools(), policy(setup.strict, [0; 3])));
        Harness {
            s,
            now: t0(),
            next_key: 1,
            next_epoch: 1,
            m,
            tally: Tally::default(),
        }
    }

    /// A pass, each decision checked against the model and then applied
    /// to it; batches a lost node failed go back to the queue afterwards
    /// (as the runner submits them after the commit).
    fn pass(&mut self) -> Result<(), TestCaseError> {
        let now = self.now;
        let decisions = self.s.pass(now);
        let mut allocated = Vec::new();
        let mut requeue = Vec::new();
        for d in &decisions {
            match d {
                Decision::Allocate(a) => {
                    // One allocation a batch, whole, on one alternative or its
                    // own placement.
                    prop_assert!(
                        !allocated.contains(&a.key),
                        "batch {} allocated twice in one pass",
                        a.key.0
                    );
                    self.m.check_allocation(a, now)?;
                    self.m.run(a);
                    self.tally.allocations += 1;
                    self.tally.on_alternatives += u32::from(a.alternative.is_some());
                    allocated.push(a.key);
                }
                Decision::Expire { key, .. } => {
                    let deadline = self.m.queued_deadline(*key);
                    prop_assert!(
                        deadline.is_some_and(|d| d <= now && now - d < Duration::seconds(1)),
                        "batch {} expired at {now}, its deadline is {deadline:?}",
                        key.0
                    );
                    self.m.end(*key, End::Expired);
                }
                Decision::Reject { key, reason, .. } => {
                    self.m.check_reject(*key, *reason)?;
                    self.tally.stock_outs += u32::from(*reason == crate::api::EndReason::StockOut);
                    self.m.end(*key, End::Rejected);
                }
                Decision::LoseNode {
                    node,
                    epoch,
                    failed,
                    ..
                } => {
                    self.m.check_lost(node, *epoch, now)?;
                    self.m.lose(node);
                    for key in failed {
                        prop_assert!(
                            self.m.runs_on(*key, node),
                            "batch {} failed with lost node {node} it did not hold",
                            key.0
                        );
                        self.m.end(*key, End::Lost);
                        requeue.push(*key);
                    }
                }
                // This world has no preemption policy, nor provisioners.
                Decision::Preempt(p) => {
                    prop_assert!(false, "preemption without a policy: {p:?}");
                }
                Decision::Provision(_) | Decision::Suspend(_) => {
                    prop_assert!(false, "no pool has a provisioner: {d:?}");
                }
            }
        }
        self.m.check_after_pass(now)?;
        self.m.check_order(&allocated, now)?;
        // Liveness, before the batches a lost node failed are queued again
        // (they get their pass after this one).
        self.tally.heads_judged += self.m.check_heads(now)?;
        for key in requeue {
            self.infra_failure(key);
        }
        self.s.check_invariants().map_err(TestCaseError::fail)?;
        // The core's ledger draws what the model's allocations draw: an alternative
        // its own quota, in its own region.
        let usages = self.m.usages();
        for p in 0..PROJECTS {
            for region in REGIONS {
                for metric in QuotaMetric::ALL {
                    let project = format!("p{p}");
                    let model = usages
                        .get(&(project.clone(), region.to_string(), metric))
                        .copied()
                        .unwrap_or(0);
                    prop_assert_eq!(
                        self.s.ledger_usage(&project, region, metric),
                        model,
                        "{}/{}/{}: the ledger's usage",
                        project,
                        region,
                        metric
                    );
                }
            }
        }
        // The scrape's queue series, kept cheap by walking queue by queue,
        // are what counting batch by batch gives.
        let snapshot = self.s.snapshot(now);
        let (pending, fraction) = pending_counted_one_by_one(&self.s, now);
        prop_assert_eq!(snapshot.pending, pending);
        prop_assert_eq!(snapshot.wait_fraction, fraction);
        Ok(())
    }

    /// A running batch failed through no fault of its own: queued again
    /// for its next attempt (a fresh deadline from now, its place in the
    /// queue kept) while it has retries, else failed.
    fn infra_failure(&mut self, key: BatchKey) {
        self.s.forget(key, self.now);
        match self.m.requeue(key, self.now) {
            Some(b) => self.s.submit(b),
            None => self.m.end(key, End::Failed),
        }
    }

    fn submit(
        &mut self,
        region: &str,
        project: String,
        priority: i32,
        request: Request,
    ) -> Result<(), TestCaseError> {
        // The create refuses what could never fit, on its own placement
        // and on every alternative; never what the model sees could fit.
        if let Some(why) = self.s.never_fits_anywhere(&project, region, &request) {
            prop_assert!(
                !self.m.could_ever_fit(&project, region, &request.cluster),
                "a create refused as never fitting ({why:?}), but a node of {region} takes it whole within {project}'s quota"
            );
            return Ok(());
        }
        let key = BatchKey(self.next_key);
        self.next_key += 1;
        let Request {
            cluster,
            alternatives,
        } = request;
        let b = PendingBatch {
            key,
            batch_id: format!("b-{}", key.0),
            project,
            region: region.into(),
            priority,
            queued_at: self.now,
            deadline: cluster.deadline(self.now),
            cluster,
            alternatives,
            preemptions: 0,
        };
        self.m.submit(b.clone());
        self.s.submit(b);
        Ok(())
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Submit(sub) => {
                let project = format!("p{}", sub.project);
                self.submit(REGIONS[sub.region], project, sub.priority, sub.request())?;
            }
            Op::SubmitLike {
                like,
                project,
                priority,
            } => {
                if let Some(b) = pick(&self.m.submitted(), like) {
                    let request = Request {
                        cluster: b.cluster,
                        alternatives: b.alternatives,
                    };
                    self.submit(&b.region, format!("p{project}"), priority, request)?;
                }
            }
            Op::Cancel(i) => {
                if let Some(key) = pick(&self.m.live(), i) {
                    self.s.forget(key, self.now);
                    self.m.end(key, End::Cancelled);
                }
            }
            Op::Finish(i) => {
                if let Some(key) = pick(&self.m.running(), i) {
                    self.s.forget(key, self.now);
                    self.m.end(key, End::Finished);
                }
            }
            Op::InfraFailure(i) => {
                if let Some(key) = pick(&self.m.running(), i) {
                    self.infra_failure(key);
                }
            }
            Op::Register {
                zone,
                pool,
                n,
                node,
                lease_s,
            } => {
                let spec = node_spec(format!("agent/{zone}/{pool}/{n}"), zone, pool, node, false);
                // The engine refuses a new node in a full pool; a known one
                // always comes back.
                if self.m.is_present(&spec.id) || self.m.pool_room(&spec) {
                    let epoch = self.next_epoch;
                    self.next_epoch += 1;
                    let expires = self.now + Duration::seconds(lease_s as i64);
                    let taken = self.s.register_node(spec.clone(), epoch, expires);
                    self.m.register(spec, taken, epoch, expires);
                }
            }
            Op::Heartbeat { node, lease_s } => {
                if let Some((id, epoch)) = pick(&self.m.leased(), node) {
                    let expires = self.now + Duration::seconds(lease_s as i64);
                    prop_assert!(self.s.heartbeat(&id, epoch, expires).is_ok());
                    self.m.renew(&id, expires);
                }
            }
            Op::Hold {
                region,
                project,
                on,
            } => {
                let hold = (
                    REGIONS[region].to_string(),
                    project.map(|p| format!("p{p}")),
                );
                self.m.set_hold(hold, on);
                let holds = self.m.holds().map(|(r, p)| {
                    let h = Hold {
                        since: self.now,
                        by: "admin".into(),
                    };
                    (r, p, h)
                });
                self.s.set_holds(holds.collect());
            }
            Op::Cordon { node, on } => {
                if let Some(id) = pick(&self.m.node_ids(), node) {
                    self.m.set_cordon(id, on);
                    let cordons = self.m.cordons().map(|id| {
                        let c = Cordon {
                            since: self.now,
                            by: "admin".into(),
                            drain: false,
                        };
                        (id, c)
                    });
                    self.s.set_cordons(cordons.collect());
                }
            }
            Op::SetLimit {
                project,
                region,
                metric,
                limit,
            } => {
                let (project, region) = (format!("p{project}"), REGIONS[region]);
                let metric = QuotaMetric::ALL[metric];
                let limit = if metric == QuotaMetric::LocalSsdTotalGb {
                    limit * 375
                } else {
                    limit
                };
                self.s.set_quota_limit(&project, region, metric, limit);
                self.m.set_limit(project, region.into(), metric, limit);
            }
            Op::Reload(r) => {
                self.m.set_rules(r.limits.rules(), r.strict);
                self.m.toggle_virtual(r.virtual_node, r.declared);
                let layout = self.m.layout(pools(), policy(r.strict, r.weights));
                self.s.reconfigure(layout);
            }
            Op::Advance(secs) => {
                let target = self.now + Duration::seconds(secs as i64);
                // The harness's own deadlines and lease expiries, not the
                // core's: a deadline the core lost still gets its pass.
                while let Some(t) = self.m.next_event_after(self.now) {
                    if t > target {
                        break;
                    }
                    self.now = t;
                    self.pass()?;
                }
                self.now = target;
            }
        }
        self.pass()
    }
}

fn pick<T: Clone>(items: &[T], i: usize) -> Option<T> {
    (!items.is_empty()).then(|| items[i % items.len()].clone())
}

/// One run: the ops, each followed by a pass; then everything running
/// ends and quota no longer binds, and a last pass must start the head of
/// each region's queue where the model sees it fits (no starvation).
fn run(setup: &Setup, ops: Vec<Op>) -> Result<Tally, TestCaseError> {
    let mut h = Harness::new(setup);
    for op in ops {
        h.apply(op)?;
    }
    for key in h.m.running() {
        h.s.forget(key, h.now);
        h.m.end(key, End::Finished);
    }
    for p in 0..PROJECTS {
        for region in REGIONS {
            for metric in QuotaMetric::ALL {
                h.s.set_quota_limit(&format!("p{p}"), region, metric, 1_000_000);
                h.m.set_limit(format!("p{p}"), region.into(), metric, 1_000_000);
            }
        }
    }
    // The pass checks the heads against the model (`Model::check_heads`).
    h.pass()?;
    Ok(h.tally)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_decision_keeps_the_model_whole_in_time_and_within_capacity_and_quota(
        setup in setup(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        run(&setup, ops)?;
    }
}

/// The checks above see something: over a fixed seed, batches are
/// allocated, on their own placements and on alternatives, default-mode batches
/// meet stock-outs, and queue heads are judged by the liveness check. A
/// generator that stopped producing any of these would leave its checks
/// passing on nothing.
#[test]
fn a_fixed_seed_run_allocates_takes_alternatives_and_judges_queue_heads() {
    let mut runner = super::fixed_seed_runner(64);
    let total = std::cell::Cell::new(Tally::default());
    let strategy = (setup(), proptest::collection::vec(op(), 1..80));
    runner
        .run(&strategy, |(setup, ops)| {
            let t = run(&setup, ops)?;
            let sum = total.get();
            total.set(Tally {
                allocations: sum.allocations + t.allocations,
                on_alternatives: sum.on_alternatives + t.on_alternatives,
                heads_judged: sum.heads_judged + t.heads_judged,
                stock_outs: sum.stock_outs + t.stock_outs,
            });
            Ok(())
        })
        .expect("the property holds on the fixed seed");
    let t = total.get();
    assert!(
        t.allocations > 0 && t.on_alternatives > 0 && t.heads_judged > 0 && t.stock_outs > 0,
        "{t:?}"
    );
    // Not a golden figure: alternatives are a small share of what is allocated.
    assert!(t.on_alternatives < t.allocations, "{t:?}");
}
