//! The quota ledger: limit and usage per project, region and metric.
//!
//! Limits come from config rules (`*` matches any project or region, the
//! most specific rule wins) and from admin overrides. Usage is the sum of
//! the clusters currently holding quota. A lowered limit never revokes
//! running work: usage may then exceed the limit, which only blocks new
//! admissions.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::spec::{QuotaAmount, QuotaMetric};

/// A configured limit rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaRule {
    pub project: String,
    pub region: String,
    pub metric: QuotaMetric,
    pub limit: u64,
}

/// One row of `GET .../quotas`, shaped like Compute Engine's quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaView {
    pub metric: QuotaMetric,
    pub limit: u64,
    pub usage: u64,
}

/// What is missing for an amount: the first metric short, with numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    pub metric: QuotaMetric,
    pub needed: u64,
    pub limit: u64,
    pub usage: u64,
}

impl Shortfall {
    pub fn free(&self) -> u64 {
        self.limit.saturating_sub(self.usage)
    }
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "needs {} {}, project has {} free of {}",
            self.needed,
            self.metric,
            self.free(),
            self.limit
        )
    }
}

const METRICS: usize = QuotaMetric::ALL.len();

fn slot(m: QuotaMetric) -> usize {
    QuotaMetric::ALL.iter().position(|x| *x == m).unwrap_or(0)
}

/// Nested by project then region so lookups borrow `&str` keys: the
/// scheduler checks quota for every queued batch it scans, and must not
/// allocate to do it.
type PerRegion<T> = HashMap<String, HashMap<String, [T; METRICS]>>;

/// Adds `amounts` to a project's counts in a region.
fn add(to: &mut PerRegion<u64>, project: &str, region: &str, amounts: &[QuotaAmount]) {
    let counts = to
        .entry(project.to_string())
        .or_default()
        .entry(region.to_string())
        .or_insert([0; METRICS]);
    for a in amounts {
        counts[slot(a.metric)] += a.amount;
    }
}

/// Takes `amounts` from a project's counts in a region (never below 0).
fn take(from: &mut PerRegion<u64>, project: &str, region: &str, amounts: &[QuotaAmount]) {
    if let Some(counts) = from.get_mut(project).and_then(|r| r.get_mut(region)) {
        for a in amounts {
            let c = &mut counts[slot(a.metric)];
            *c = c.saturating_sub(a.amount);
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Ledger {
    rules: Vec<QuotaRule>,
    overrides: PerRegion<Option<u64>>,
    usage: PerRegion<u64>,
    /// Quota set aside for preemptors while their victims stop: not used
    /// (usage and the API do not show it), but no other batch of the
    /// project may take it, or the victims would stop for nothing.
    aside: PerRegion<u64>,
}

impl Ledger {
    pub(super) fn new(rules: Vec<QuotaRule>) -> Ledger {
        Ledger {
            rules,
            ..Ledger::default()
        }
    }

    /// Replaces the config's rules; admins' overrides and usage stay.
    pub(super) fn set_rules(&mut self, rules: Vec<QuotaRule>) {
        self.rules = rules;
    }

    pub(super) fn limit(&self, project: &str, region: &str, metric: QuotaMetric) -> u64 {
        if let Some(l) = self
            .overrides
            .get(project)
            .and_then(|r| r.get(region))
            .and_then(|m| m[slot(metric)])
        {
            return l;
        }
        // Most specific rule: exact project beats "*", then exact region.
        self.rules
            .iter()
            .filter(|r| {
                r.metric == metric
                    && (r.project == project || r.project == "*")
                    && (r.region == region || r.region == "*")
            })
            .max_by_key(|r| (r.project != "*", r.region != "*"))
            .map(|r| r.limit)
            .unwrap_or(0)
    }

    pub(super) fn usage(&self, project: &str, region: &str, metric: QuotaMetric) -> u64 {
        self.usage
            .get(project)
            .and_then(|r| r.get(region))
            .map(|m| m[slot(metric)])
            .unwrap_or(0)
    }

    pub(super) fn set_limit(
        &mut self,
        project: &str,
        region: &str,
        metric: QuotaMetric,
        limit: u64,
    ) {
        self.overrides
            .entry(project.to_string())
            .or_default()
            .entry(region.to_string())
            .or_insert([None; METRICS])[slot(metric)] = Some(limit);
    }

    /// The first metric that does not have room for `amounts`.
    pub(super) fn shortfall(
        &self,
        project: &str,
        region: &str,
        amounts: &[QuotaAmount],
    ) -> Option<Shortfall> {
        self.first_short(project, region, amounts, true)
    }

    /// The first metric whose *limit* is below `amounts`: the request can
    /// never fit, whatever finishes.
    pub(super) fn never_fits(
        &self,
        project: &str,
        region: &str,
        amounts: &[QuotaAmount],
    ) -> Option<Shortfall> {
        self.first_short(project, region, amounts, false)
    }

    /// The first metric `amounts` exceed, against what is free (`in_use`)
    /// or against the bare limit.
    fn first_short(
        &self,
        project: &str,
        region: &str,
        amounts: &[QuotaAmount],
        in_use: bool,
    ) -> Option<Shortfall> {
        amounts.iter().find_map(|a| {
            let limit = self.limit(project, region, a.metric);
            let usage = self.usage(project, region, a.metric);
            let aside = self
                .aside
                .get(project)
                .and_then(|r| r.get(region))
                .map_or(0, |m| m[slot(a.metric)]);
            let taken = if in_use { usage + aside } else { 0 };
            (taken + a.amount > limit).then_some(Shortfall {
                metric: a.metric,
                needed: a.amount,
                limit,
                usage,
            })
        })
    }

    pub(super) fn charge(&mut self, project: &str, region: &str, amounts: &[QuotaAmount]) {
        add(&mut self.usage, project, region, amounts);
    }

    pub(super) fn refund(&mut self, project: &str, region: &str, amounts: &[QuotaAmount]) {
        take(&mut self.usage, project, region, amounts);
    }

    /// Sets `amounts` aside for a preemptor of `project` in `region`.
    pub(super) fn set_aside(&mut self, project: &str, region: &str, amounts: &[QuotaAmount]) {
        add(&mut self.aside, project, region, amounts);
    }

    /// Gives back what [`Self::set_aside`] set aside.
    pub(super) fn release_aside(&mut self, project: &str, region: &str, amounts: &[QuotaAmount]) {
        take(&mut self.aside, project, region, amounts);
    }

    /// Every (project, region) with usage, an override or a rule naming
    /// both: the quota series metrics export (bounded by the config and
    /// the projects that used flexq).
    pub(super) fn pairs(&self) -> std::collections::BTreeSet<(String, String)> {
        let mut out = std::collections::BTreeSet::new();
        for map in [&self.usage] {
            for (p, regions) in map {
                out.extend(regions.keys().map(|r| (p.clone(), r.clone())));
            }
        }
        for (p, regions) in &self.overrides {
            out.extend(regions.keys().map(|r| (p.clone(), r.clone())));
        }
        out.extend(
            self.rules
                .iter()
                .filter(|r| r.project != "*" && r.region != "*")
                .map(|r| (r.project.clone(), r.region.clone())),
        );
        out
    }

    /// Every metric of a project in a region with a limit or usage.
    pub(super) fn view(&self, project: &str, region: &str) -> Vec<QuotaView> {
        crate::spec::QuotaMetric::ALL
            .iter()
            .map(|&metric| QuotaView {
                metric,
                limit: self.limit(project, region, metric),
                usage: self.usage(project, region, metric),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(project: &str, region: &str, limit: u64) -> QuotaRule {
        QuotaRule {
            project: project.into(),
            region: region.into(),
            metric: QuotaMetric::PreemptibleNvidiaL4Gpus,
            limit,
        }
    }

    #[test]
    fn the_most_specific_rule_wins_and_overrides_beat_rules() {
        let mut l = Ledger::new(vec![
            rule("*", "*", 8),
            rule("*", "r1", 16),
            rule("p", "*", 32),
        ]);
        let m = QuotaMetric::PreemptibleNvidiaL4Gpus;
        assert_eq!(l.limit("x", "r2", m), 8);
        assert_eq!(l.limit("x", "r1", m), 16);
        assert_eq!(l.limit("p", "r1", m), 32);
        assert_eq!(l.limit("p", "r1", QuotaMetric::NvidiaL4Gpus), 0);
        l.set_limit("p", "r1", m, 4);
        assert_eq!(l.limit("p", "r1", m), 4);
    }

    #[test]
    fn shortfall_names_the_metric_with_numbers() {
        let mut l = Ledger::new(vec![rule("*", "*", 24)]);
        let need = |n| {
            vec![QuotaAmount {
                metric: QuotaMetric::PreemptibleNvidiaL4Gpus,
                amount: n,
            }]
        };
        l.charge("p", "r", &need(20));
        let s = l.shortfall("p", "r", &need(16)).expect("short");
        assert_eq!(
            s.to_string(),
            "needs 16 PREEMPTIBLE_NVIDIA_L4_GPUS, project has 4 free of 24"
        );
        assert!(l.shortfall("p", "r", &need(4)).is_none());
        assert!(l.never_fits("p", "r", &need(25)).is_some());
        l.refund("p", "r", &need(20));
        assert!(l.shortfall("p", "r", &need(16)).is_none());
    }
}
