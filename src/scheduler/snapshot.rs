//! What the metrics show of the scheduler, computed at scrape time from
//! its state and from the tally kept as batches come and go (`tally.rs`:
//! the queued batches by kind, since a scrape must not walk 100k of them).

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use chrono::{DateTime, Utc};

use super::core::Scheduler;
use super::reasons::NotAdmitted;
use super::views::CapacityRow;
use crate::spec::QuotaMetric;

/// Plain numbers; `metrics` turns them into series.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// (region, accelerator, reason) → queued batches.
    pub pending: BTreeMap<(String, String, &'static str), u64>,
    /// region → the largest fraction of its allocation timeout any queued
    /// batch has waited (1.0 = at its deadline).
    pub wait_fraction: BTreeMap<String, f64>,
    /// (project, region, metric) → (limit, usage).
    pub quotas: BTreeMap<(String, String, QuotaMetric), (u64, u64)>,
    pub capacity: Vec<CapacityRow>,
    /// (region, project) → (decayed usage in GPUs, weight), for projects
    /// with usage or queued batches.
    pub fair_share: BTreeMap<(String, String), (f64, f64)>,
    /// Held queues: (region, project, or `-` for the whole region).
    pub held: Vec<(String, String)>,
    /// Per region where preemption is on: running clusters of batches
    /// preempted `max_preemptions` times, which are never victims again.
    pub preemption_protected: BTreeMap<String, u64>,
    /// (region, zone, GPU type lent) → (clusters on loan, their GPUs).
    pub loans: BTreeMap<(String, String, &'static str), (u64, u64)>,
    /// (region, project, GPU type) → (extras elastic clusters hold, their
    /// GPUs).
    pub extras: BTreeMap<(String, String, &'static str), (u64, u64)>,
    pub agent_nodes: u64,
    pub virtual_nodes: u64,
    /// ((region, zone, pool), state) → nodes of the provisioned pools
    /// (docs/rules.md#provisioned-capacity).
    pub provisioned_nodes: BTreeMap<((String, String, String), &'static str), u64>,
    /// (region, zone, pool) → idle node-seconds of the provisioned pools
    /// since this scheduler started.
    pub idle_node_seconds: BTreeMap<(String, String, String), f64>,
}

/// Queued batches by (region, accelerator, reason), as a snapshot shows them.
type PendingByReason = BTreeMap<(String, String, &'static str), u64>;

/// Queued batches counted by (region, accelerator, reason), borrowed from
/// the scheduler while they are counted.
type PendingCounts<'a> = FxHashMap<(&'a str, &'static str, &'static str), u64>;

impl Scheduler {
    /// What the metrics show of the scheduler at `now`.
    pub fn snapshot(&self, now: DateTime<Utc>) -> Snapshot {
        let mut s = Snapshot::default();
        let (pending, seen) = self.pending_by_reason();
        s.pending = pending;
        s.wait_fraction = self.wait_fractions(now);
        s.quotas = self.quota_rows(seen);
        s.capacity = self.capacity_rows();
        s.held = self
            .holds()
            .into_iter()
            .map(|(r, p, _)| (r, p.unwrap_or_else(|| "-".into())))
            .collect();
        s.fair_share = self.fair_shares(now);
        s.preemption_protected = self.preemption_protected();
        s.loans = self.loans_held();
        s.extras = self.extras_held();
        s.agent_nodes = self.leases.active() as u64;
        s.virtual_nodes = self
            .capacity
            .nodes
            .values()
            .filter(|n| n.spec.is_virtual)
            .count() as u64;
        s.provisioned_nodes = self.provisioned_nodes();
        s.idle_node_seconds = self.idle_node_seconds(now);
        s
    }

    /// Queued batches by reason, from the tally: a class is short of
    /// quota or not as a whole; of the others, those the last pass held
    /// back for a reservation are told apart one by one (few). Also the
    /// (project, region) pairs with queued batches.
    fn pending_by_reason(&self) -> (PendingByReason, Vec<(&str, &str)>) {
        let mut pending: PendingCounts<'_> = FxHashMap::default();
        let mut seen: Vec<(&str, &str)> = Vec::new();
        for (region, projects) in &self.queue.tally().classes {
            for (project, classes) in projects {
                seen.push((project, region));
                for ((accelerator, asked), n) in classes {
                    let reason = if self.ledger.shortfall(project, region, asked).is_some() {
                        NotAdmitted::Quota
                    } else {
                        NotAdmitted::Capacity
                    }
                    .label();
                    *pending.entry((region, accelerator, reason)).or_default() += n;
                }
            }
        }
        self.count_held_back(&mut pending);
        let pending = pending
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|((r, a, why), n)| ((r.to_string(), a.to_string(), why), n))
            .collect();
        (pending, seen)
    }

    /// Moves the batches the last pass held back for a reservation, and
    /// not short of quota, from their class's capacity count to the
    /// reservation count.
    fn count_held_back<'a>(&'a self, pending: &mut PendingCounts<'a>) {
        for key in self.queue.held_back() {
            let Some(b) = self.queue.get(*key) else {
                continue;
            };
            if self
                .ledger
                .shortfall(&b.project, &b.region, &b.cluster.quota)
                .is_some()
            {
                continue;
            }
            let accelerator = super::accelerator_label(&b.cluster);
            if let Some(n) = pending.get_mut(&(
                b.region.as_str(),
                accelerator,
                NotAdmitted::Capacity.label(),
            )) {
                // Its own class counted it there, by the same test.
                debug_assert!(*n > 0, "a held-back batch missing from its class");
                *n = n.saturating_sub(1);
            }
            *pending
                .entry((&b.region, accelerator, NotAdmitted::Reservation.label()))
                .or_default() += 1;
        }
    }

    /// Per region, the largest fraction of its allocation timeout any
    /// queued batch has waited.
    fn wait_fractions(&self, now: DateTime<Utc>) -> BTreeMap<String, f64> {
        let mut wait_fraction = BTreeMap::new();
        for (region, by_timeout) in &self.queue.tally().waits {
            let longest = by_timeout
                .iter()
                .filter_map(|(total, queued)| {
                    let (first, _) = queued.first()?;
                    let waited = (now - *first).num_milliseconds().max(0) as f64;
                    Some(waited / *total as f64)
                })
                .fold(0.0, f64::max);
            wait_fraction.insert(region.clone(), longest);
        }
        wait_fraction
    }

    /// Each quota's limit and usage, for the (project, region) pairs the
    /// ledger knows and those with queued batches (`seen`), where either
    /// is not zero.
    fn quota_rows(
        &self,
        seen: Vec<(&str, &str)>,
    ) -> BTreeMap<(String, String, QuotaMetric), (u64, u64)> {
        let mut quotas = BTreeMap::new();
        let mut pairs: BTreeSet<(String, String)> = self.ledger.pairs();
        pairs.extend(
            seen.into_iter()
                .map(|(p, r)| (p.to_string(), r.to_string())),
        );
        for (project, region) in pairs {
            for metric in QuotaMetric::ALL {
                let limit = self.ledger.limit(&project, &region, metric);
                let usage = self.ledger.usage(&project, &region, metric);
                if limit > 0 || usage > 0 {
                    quotas.insert((project.clone(), region.clone(), metric), (limit, usage));
                }
            }
        }
        quotas
    }

    /// (region, project) → (decayed usage in GPUs, weight), for projects
    /// with usage or queued batches.
    fn fair_shares(&self, now: DateTime<Utc>) -> BTreeMap<(String, String), (f64, f64)> {
        let mut fair_share = BTreeMap::new();
        for (region, project) in self.fair.projects().chain(self.queue.region_projects()) {
            let st = self.fair.standing(region, project, now);
            fair_share.insert(
                (region.to_string(), project.to_string()),
                (st.usage, st.weight),
            );
        }
        fair_share
    }

    /// The clusters running on loans, and their GPUs, by whose capacity
    /// they hold: region, zone and GPU type.
    fn loans_held(&self) -> BTreeMap<(String, String, &'static str), (u64, u64)> {
        let mut loans: BTreeMap<(String, String, &'static str), (u64, u64)> = BTreeMap::new();
        for a in self.loans.keys().flat_map(|region| self.loans_in(region)) {
            let held = loans
                .entry((a.region.clone(), a.zone.clone(), a.accelerator))
                .or_default();
            held.0 += 1;
            held.1 += a.gpus();
        }
        loans
    }

    /// The extras elastic clusters hold, and their GPUs, by region,
    /// project and GPU type.
    fn extras_held(&self) -> BTreeMap<(String, String, &'static str), (u64, u64)> {
        let mut extras: BTreeMap<(String, String, &'static str), (u64, u64)> = BTreeMap::new();
        let running = self.elastic.running.values().flatten();
        for a in running.filter_map(|k| self.running.get(k)) {
            if a.extras().is_empty() {
                continue;
            }
            let held = extras
                .entry((a.region.clone(), a.project.clone(), a.accelerator))
                .or_default();
            held.0 += a.extras().len() as u64;
            held.1 += a.extras().iter().map(|p| p.gpus.len() as u64).sum::<u64>();
        }
        extras
    }

    /// Per region where preemption is on: the running clusters of batches
    /// preempted `max_preemptions` times.
    fn preemption_protected(&self) -> BTreeMap<String, u64> {
        let mut protected_by_region = BTreeMap::new();
        for (region, policy) in &self.preemption {
            let protected = self
                .running
                .values()
                .filter(|a| &a.region == region && a.preemptions >= policy.max_preemptions)
                .count() as u64;
            protected_by_region.insert(region.clone(), protected);
        }
        protected_by_region
    }
}
