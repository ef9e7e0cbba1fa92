//! Fair-share order (docs/rules.md#fair-share-order): in a region, the next
//! batch considered comes from the project with the lowest decayed GPU
//! usage ÷ weight; within a project, priority then age.
//!
//! A project's usage is measured in GPUs, each counted at its type's
//! weight (1 unless the operator weights the type): what it holds now,
//! plus what it held before, decayed with the configured half-life. Holding `g` GPUs for
//! ever tends to `g`; a project idle for one half-life counts half of what
//! it used. In GPU-seconds, history decays as `exp(-t/τ)` with
//! `τ = half_life / ln 2`, and `g` GPUs held from `a` to `r` add
//! `g·τ·(1 − exp(−(r−a)/τ))` at `r`; divided by `τ`, that is GPUs.
//! Counting what is held at once (not as it accrues) makes an allocation
//! move its project back in the order within the same pass, so one project
//! cannot take every GPU that frees at once.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::capacity::Placement;
use crate::spec::Accelerator;

/// How a region's queue is ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// Projects by decayed usage ÷ weight, then priority and age.
    #[default]
    FairShare,
    /// Priority, then age, across projects (flexq before fair share).
    Strict,
}

/// The operator's fair-share settings: queue order, usage half-life,
/// weights. (What the batch rules read is `spec::Policy`.)
#[derive(Debug, Clone, PartialEq)]
pub struct FairSharePolicy {
    pub order: Order,
    pub half_life: Duration,
    /// Weights of projects that do not have the default of 1.
    pub weights: HashMap<String, f64>,
    /// What a GPU of each type counts in usage, for types that do not
    /// count 1 (an A100-hour may cost more than an L4-hour).
    pub gpu_weights: HashMap<Accelerator, f64>,
}

impl Default for FairSharePolicy {
    fn default() -> FairSharePolicy {
        FairSharePolicy {
            order: Order::FairShare,
            half_life: Duration::from_secs(24 * 3600),
            weights: HashMap::new(),
            gpu_weights: HashMap::new(),
        }
    }
}

impl FairSharePolicy {
    pub fn weight(&self, project: &str) -> f64 {
        self.weights.get(project).copied().unwrap_or(1.0)
    }

    /// What one GPU of `accelerator` counts in usage.
    pub fn gpu_weight(&self, accelerator: Option<Accelerator>) -> f64 {
        accelerator
            .and_then(|a| self.gpu_weights.get(&a).copied())
            .unwrap_or(1.0)
    }

    /// What a cluster's parts count in usage while held: their GPUs, each
    /// at its type's weight.
    pub fn charge(&self, placements: &[Placement]) -> f64 {
        placements
            .iter()
            .map(|p| p.gpus.len() as f64 * self.gpu_weight(p.accelerator))
            .sum()
    }

    /// `τ`, in seconds: history decays as `exp(−t/τ)`.
    fn tau(&self) -> f64 {
        self.half_life.as_secs_f64().max(1.0) / std::f64::consts::LN_2
    }
}

/// One project's usage in one region.
#[derive(Debug, Clone, Default)]
struct Usage {
    /// GPUs its running clusters hold, weighted by type.
    held: f64,
    /// Decayed GPU-seconds of its ended clusters, as of `at`.
    history: f64,
    at: Option<DateTime<Utc>>,
}

impl Usage {
    /// The decayed history as of `now`, in GPU-seconds.
    fn history_at(&self, now: DateTime<Utc>, tau: f64) -> f64 {
        match self.at {
            Some(at) => self.history * decay(now, at, tau),
            None => 0.0,
        }
    }

    /// Adds `value` GPU-seconds measured at `when` (in any order of time).
    fn add(&mut self, value: f64, when: DateTime<Utc>, tau: f64) {
        match self.at {
            Some(at) if when < at => self.history += value * decay(at, when, tau),
            _ => {
                self.history = self.history_at(when, tau) + value;
                self.at = Some(when);
            }
        }
    }
}

/// `exp(−(later − earlier)/τ)`; 1 when `later` is not later.
fn decay(later: DateTime<Utc>, earlier: DateTime<Utc>, tau: f64) -> f64 {
    let dt = (later - earlier).num_milliseconds().max(0) as f64 / 1000.0;
    (-dt / tau).exp()
}

/// Usage per (region, project), and the policy that orders by it.
#[derive(Debug, Clone, Default)]
pub(super) struct FairShare {
    policy: FairSharePolicy,
    usage: HashMap<(String, String), Usage>,
}

/// A project's place in a region's fair-share order.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Standing {
    /// Decayed usage, in GPUs.
    pub usage: f64,
    pub weight: f64,
    /// usage ÷ weight: lower goes first.
    pub share: f64,
}

impl FairShare {
    /// Replaces the policy; usage stays (it does not depend on it but for
    /// the half-life, which applies from now on).
    pub(super) fn set_policy(&mut self, policy: FairSharePolicy) {
        self.policy = policy;
    }

    /// The policy in force.
    pub(super) fn policy(&self) -> &FairSharePolicy {
        &self.policy
    }

    /// Forgets the usage of ended clusters (what running clusters hold
    /// stays), to record it again under a new half-life or GPU weights.
    pub(super) fn clear_history(&mut self) {
        for u in self.usage.values_mut() {
            u.history = 0.0;
            u.at = None;
        }
        self.usage.retain(|_, u| u.held > 0.0);
    }

    /// Forgets what running clusters hold, to count it again under new
    /// GPU weights (`hold` each of them next).
    pub(super) fn clear_held(&mut self) {
        for u in self.usage.values_mut() {
            u.held = 0.0;
        }
    }

    pub(super) fn order(&self) -> Order {
        self.policy.order
    }

    /// A cluster on `placements` was allocated.
    pub(super) fn hold(&mut self, region: &str, project: &str, placements: &[Placement]) {
        let charge = self.policy.charge(placements);
        self.entry(region, project).held += charge;
    }

    /// A cluster on `placements` held from `from` was given back at `to`.
    pub(super) fn release(
        &mut self,
        region: &str,
        project: &str,
        placements: &[Placement],
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) {
        let charge = self.policy.charge(placements);
        let u = self.entry(region, project);
        // Sums of the same weights in another order: 0 within rounding.
        u.held = (u.held - charge).max(0.0);
        if u.held < 1e-9 {
            u.held = 0.0;
        }
        self.record_past(region, project, charge, from, to);
    }

    /// `charge` (GPUs, weighted by type) held from `from` to `to`: a
    /// cluster that ended, now or before this core was built (its usage,
    /// read back from the store).
    pub(super) fn record_past(
        &mut self,
        region: &str,
        project: &str,
        charge: f64,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) {
        let tau = self.policy.tau();
        let value = charge * tau * (1.0 - decay(to, from, tau));
        if value > 0.0 {
            self.entry(region, project).add(value, to, tau);
        }
    }

    /// Where `project` stands in `region` at `now`.
    pub(super) fn standing(&self, region: &str, project: &str, now: DateTime<Utc>) -> Standing {
        let tau = self.policy.tau();
        let usage = self
            .usage
            .get(&(region.to_string(), project.to_string()))
            .map_or(0.0, |u| u.held + u.history_at(now, tau) / tau);
        let weight = self.policy.weight(project);
        Standing {
            usage,
            weight,
            share: usage / weight,
        }
    }

    /// Forgets projects that hold nothing and whose past usage has decayed
    /// below a millionth of a GPU (they count as none).
    pub(super) fn prune(&mut self, now: DateTime<Utc>) {
        let tau = self.policy.tau();
        self.usage
            .retain(|_, u| u.held > 0.0 || u.history_at(now, tau) / tau >= 1e-6);
    }

    /// Every (region, project) with usage recorded.
    pub(super) fn projects(&self) -> impl Iterator<Item = (&str, &str)> {
        self.usage.keys().map(|(r, p)| (r.as_str(), p.as_str()))
    }

    /// How far back ended clusters still count for something (their
    /// weight has fallen below one in a thousand after ten half-lives).
    pub(super) fn memory(&self) -> Duration {
        self.policy.half_life.saturating_mul(10)
    }

    fn entry(&mut self, region: &str, project: &str) -> &mut Usage {
        self.usage
            .entry((region.to_string(), project.to_string()))
            .or_default()
    }
}

/// An order key for a share: total for finite, non-negative floats.
pub(super) fn share_key(share: f64) -> u64 {
    // Non-negative IEEE 754 doubles order as their bit patterns.
    share.max(0.0).to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + s, 0)
            .single()
            .expect("time")
    }

    /// A cluster of `n` GPUs of type `a` on one node.
    fn gpus(n: usize, a: Accelerator) -> Vec<Placement> {
        vec![Placement {
            node: crate::scheduler::NodeId("n".into()),
            role: crate::spec::PartRole::Executor,
            gpus: (0..n).map(|i| i.to_string()).collect(),
            cores: 4,
            memory_mb: 16_384,
            local_ssd_gb: 0,
            accelerator: Some(a),
        }]
    }

    fn l4(n: usize) -> Vec<Placement> {
        gpus(n, Accelerator::L4)
    }

    fn with(policy: FairSharePolicy) -> FairShare {
        let mut f = FairShare::default();
        f.set_policy(policy);
        f
    }

    fn hour_half_life() -> FairShare {
        with(FairSharePolicy {
            half_life: Duration::from_secs(3600),
            ..FairSharePolicy::default()
        })
    }

    #[test]
    fn held_gpus_count_at_once_and_history_halves_each_half_life() {
        let mut f = hour_half_life();
        f.hold("r", "a", &l4(8));
        assert_eq!(f.standing("r", "a", t(0)).usage, 8.0);
        // Held for a very long time, then given back: about 8 GPUs of
        // history, which halves an hour later.
        f.release("r", "a", &l4(8), t(0), t(100 * 3600));
        let at_release = f.standing("r", "a", t(100 * 3600)).usage;
        assert!((at_release - 8.0).abs() < 1e-6, "{at_release}");
        let later = f.standing("r", "a", t(101 * 3600)).usage;
        assert!((later - 4.0).abs() < 1e-6, "{later}");
    }

    #[test]
    fn a_short_cluster_counts_little_and_past_records_add_up_in_any_order() {
        let mut a = hour_half_life();
        a.record_past("r", "p", 4.0, t(0), t(60));
        a.record_past("r", "p", 2.0, t(600), t(1200));
        let mut b = hour_half_life();
        b.record_past("r", "p", 2.0, t(600), t(1200));
        b.record_past("r", "p", 4.0, t(0), t(60));
        let (ua, ub) = (
            a.standing("r", "p", t(3600)).usage,
            b.standing("r", "p", t(3600)).usage,
        );
        assert!((ua - ub).abs() < 1e-9, "{ua} vs {ub}");
        // 4 GPUs for a minute is far less than 4 GPUs held.
        assert!(ua > 0.0 && ua < 1.0, "{ua}");
    }

    #[test]
    fn forgotten_usage_is_pruned_held_usage_is_not() {
        let mut f = hour_half_life();
        f.hold("r", "busy", &l4(1));
        f.record_past("r", "idle", 4.0, t(0), t(3600));
        f.prune(t(3600));
        assert_eq!(f.projects().count(), 2);
        // Twenty-five half-lives later idle's usage is below a millionth
        // of a GPU, though its decayed GPU-seconds are not (cargo-mutants:
        // a prune by GPU-seconds, `/` → `%`, was missed at forty).
        let faded = f.standing("r", "idle", t(26 * 3600)).usage;
        assert!(faded < 1e-6 && faded * f.policy.tau() > 1e-4, "{faded}");
        f.prune(t(26 * 3600));
        assert_eq!(f.projects().collect::<Vec<_>>(), vec![("r", "busy")]);
    }

    #[test]
    fn weight_divides_usage() {
        let mut f = with(FairSharePolicy {
            weights: HashMap::from([("big".to_string(), 4.0)]),
            ..FairSharePolicy::default()
        });
        f.hold("r", "big", &l4(8));
        f.hold("r", "small", &l4(4));
        assert_eq!(f.standing("r", "big", t(0)).share, 2.0);
        assert_eq!(f.standing("r", "small", t(0)).share, 4.0);
        assert_eq!(f.standing("r", "none", t(0)).share, 0.0);
    }

    #[test]
    fn a_weighted_gpu_type_counts_more_held_and_after() {
        let mut f = with(FairSharePolicy {
            half_life: Duration::from_secs(3600),
            gpu_weights: HashMap::from([(Accelerator::A100_40, 3.0)]),
            ..FairSharePolicy::default()
        });
        f.hold("r", "a100s", &gpus(4, Accelerator::A100_40));
        f.hold("r", "l4s", &l4(4));
        assert_eq!(f.standing("r", "a100s", t(0)).usage, 12.0);
        assert_eq!(f.standing("r", "l4s", t(0)).usage, 4.0);
        // Given back after a long time: the history keeps the weight, and
        // nothing stays held.
        f.release(
            "r",
            "a100s",
            &gpus(4, Accelerator::A100_40),
            t(0),
            t(100 * 3600),
        );
        let after = f.standing("r", "a100s", t(100 * 3600)).usage;
        assert!((after - 12.0).abs() < 1e-6, "{after}");
        let later = f.standing("r", "a100s", t(101 * 3600)).usage;
        assert!((later - 6.0).abs() < 1e-6, "{later}");
    }

    #[test]
    fn share_keys_order_as_the_shares() {
        let shares = [0.0, 1e-9, 0.4, 2.1, 2.1000001, 1e12];
        for w in shares.windows(2) {
            assert!(share_key(w[0]) < share_key(w[1]), "{w:?}");
        }
    }
}
