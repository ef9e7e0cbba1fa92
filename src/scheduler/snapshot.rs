//! What the metrics show of the scheduler, computed at scrape time from
//! its state, and the one tally kept for it as batches come and go (the
//! queued batches by kind: a scrape must not walk 100k of them).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rustc_hash::FxHashMap;

use chrono::{DateTime, Utc};

use super::core::Scheduler;
use super::model::{BatchKey, PendingBatch};
use super::views::CapacityRow;
use crate::spec::{QuotaAmount, QuotaMetric};

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
    pub agent_nodes: u64,
    pub virtual_nodes: u64,
}

/// The queued batches counted the way a scrape reports them, kept as
/// batches come and go ([`QueuedTally::add`] in `submit`,
/// [`QueuedTally::remove`] in `forget`), so that a scrape costs what the
/// kinds of batches cost, not their number.
#[derive(Debug, Default)]
pub(super) struct QueuedTally {
    /// region → project → (GPU type, quota the cluster asks) → batches:
    /// every batch of a class is short of quota, or not, alike.
    classes: HashMap<String, HashMap<String, HashMap<Class, u64>>>,
    /// region → allocation timeout (ms) → when its batches were queued: of
    /// batches with one timeout, the first queued has waited the largest
    /// fraction of it.
    waits: HashMap<String, BTreeMap<i64, Queued>>,
}

type Class = (&'static str, Vec<QuotaAmount>);

/// Batches by when they were queued, first first.
type Queued = BTreeSet<(DateTime<Utc>, BatchKey)>;

fn class_of(b: &PendingBatch) -> Class {
    (
        super::accelerator_label(&b.cluster),
        b.cluster.quota.clone(),
    )
}

/// The allocation timeout a deadline stands for, in ms (at least 1).
fn timeout_ms(b: &PendingBatch) -> Option<i64> {
    b.deadline
        .map(|d| (d - b.queued_at).num_milliseconds().max(1))
}

impl QueuedTally {
    /// Nothing counted (no batch queued).
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.classes.is_empty() && self.waits.is_empty()
    }

    pub(super) fn add(&mut self, b: &PendingBatch) {
        *self
            .classes
            .entry(b.region.clone())
            .or_default()
            .entry(b.project.clone())
            .or_default()
            .entry(class_of(b))
            .or_default() += 1;
        if let Some(t) = timeout_ms(b) {
            self.waits
                .entry(b.region.clone())
                .or_default()
                .entry(t)
                .or_default()
                .insert((b.queued_at, b.key));
        }
    }

    pub(super) fn remove(&mut self, b: &PendingBatch) {
        if let Some(projects) = self.classes.get_mut(&b.region) {
            if let Some(classes) = projects.get_mut(&b.project) {
                let class = class_of(b);
                if let Some(n) = classes.get_mut(&class) {
                    *n -= 1;
                    if *n == 0 {
                        classes.remove(&class);
                    }
                }
                if classes.is_empty() {
                    projects.remove(&b.project);
                }
            }
            if projects.is_empty() {
                self.classes.remove(&b.region);
            }
        }
        if let (Some(t), Some(by_timeout)) = (timeout_ms(b), self.waits.get_mut(&b.region)) {
            if let Some(queued) = by_timeout.get_mut(&t) {
                queued.remove(&(b.queued_at, b.key));
                if queued.is_empty() {
                    by_timeout.remove(&t);
                }
            }
            if by_timeout.is_empty() {
                self.waits.remove(&b.region);
            }
        }
    }
}

impl Scheduler {
    pub fn snapshot(&self, now: DateTime<Utc>) -> Snapshot {
        let mut s = Snapshot::default();
        // Queued batches by reason, from the tally: a class is short of
        // quota or not as a whole; of the others, those the last pass held
        // back for a reservation are told apart one by one (few).
        let mut pending: FxHashMap<(&str, &'static str, &'static str), u64> = FxHashMap::default();
        let mut seen: Vec<(&str, &str)> = Vec::new();
        for (region, projects) in &self.tally.classes {
            for (project, classes) in projects {
                seen.push((project, region));
                for ((accelerator, asked), n) in classes {
                    let reason = if self.ledger.shortfall(project, region, asked).is_some() {
                        "quota"
                    } else {
                        "capacity"
                    };
                    *pending.entry((region, accelerator, reason)).or_default() += n;
                }
            }
        }
        for key in &self.held_back {
            let Some(b) = self.pending.get(key) else {
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
            if let Some(n) = pending.get_mut(&(b.region.as_str(), accelerator, "capacity")) {
                // Its own class counted it there, by the same test.
                debug_assert!(*n > 0, "a held-back batch missing from its class");
                *n = n.saturating_sub(1);
            }
            *pending
                .entry((&b.region, accelerator, "reservation"))
                .or_default() += 1;
        }
        s.pending = pending
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|((r, a, why), n)| ((r.to_string(), a.to_string(), why), n))
            .collect();
        for (region, by_timeout) in &self.tally.waits {
            let longest = by_timeout
                .iter()
                .filter_map(|(total, queued)| {
                    let (first, _) = queued.first()?;
                    let waited = (now - *first).num_milliseconds().max(0) as f64;
                    Some(waited / *total as f64)
                })
                .fold(0.0, f64::max);
            s.wait_fraction.insert(region.clone(), longest);
        }
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
                    s.quotas
                        .insert((project.clone(), region.clone(), metric), (limit, usage));
                }
            }
        }
        s.capacity = self.capacity_rows();
        s.held = self
            .holds()
            .into_iter()
            .map(|(r, p, _)| (r, p.unwrap_or_else(|| "-".into())))
            .collect();
        for (region, project) in self.fair.projects().chain(
            self.project_queues
                .iter()
                .flat_map(|(r, ps)| ps.keys().map(move |p| (r.as_str(), p.as_str()))),
        ) {
            let st = self.fair.standing(region, project, now);
            s.fair_share.insert(
                (region.to_string(), project.to_string()),
                (st.usage, st.weight),
            );
        }
        s.agent_nodes = self.leases.active() as u64;
        s.virtual_nodes = self
            .capacity
            .nodes
            .values()
            .filter(|n| n.spec.is_virtual)
            .count() as u64;
        s
    }
}
