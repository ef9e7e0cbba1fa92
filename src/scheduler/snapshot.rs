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
    pub agent_nodes: u64,
    pub virtual_nodes: u64,
}

impl Scheduler {
    pub fn snapshot(&self, now: DateTime<Utc>) -> Snapshot {
        let mut s = Snapshot::default();
        // Queued batches by reason, from the tally: a class is short of
        // quota or not as a whole; of the others, those the last pass held
        // back for a reservation are told apart one by one (few).
        let mut pending: FxHashMap<(&str, &'static str, &'static str), u64> = FxHashMap::default();
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
        s.pending = pending
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|((r, a, why), n)| ((r.to_string(), a.to_string(), why), n))
            .collect();
        for (region, by_timeout) in &self.queue.tally().waits {
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
        for (region, project) in self.fair.projects().chain(self.queue.region_projects()) {
            let st = self.fair.standing(region, project, now);
            s.fair_share.insert(
                (region.to_string(), project.to_string()),
                (st.usage, st.weight),
            );
        }
        for (region, policy) in &self.preemption {
            let protected = self
                .running
                .values()
                .filter(|a| &a.region == region && a.preemptions >= policy.max_preemptions)
                .count() as u64;
            s.preemption_protected.insert(region.clone(), protected);
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
