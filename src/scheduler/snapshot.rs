//! What the metrics show of the scheduler, computed at scrape time from
//! its state (never kept up to date all over the code).

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::{FxHashMap, FxHashSet};

use chrono::{DateTime, Utc};

use super::core::Scheduler;
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
    pub agent_nodes: u64,
    pub virtual_nodes: u64,
}

impl Scheduler {
    pub fn snapshot(&self, now: DateTime<Utc>) -> Snapshot {
        let mut s = Snapshot::default();
        // Borrowed keys while walking every pending batch: a scrape with
        // 100k of them must not allocate per batch.
        let mut pending: FxHashMap<(&str, &'static str, &'static str), u64> = FxHashMap::default();
        let mut fraction: FxHashMap<&str, f64> = FxHashMap::default();
        let mut seen: FxHashSet<(&str, &str)> = FxHashSet::default();
        // What is free per (project, region) and metric, computed once per
        // pair rather than once per batch.
        let mut free: FxHashMap<(&str, &str), [u64; QuotaMetric::ALL.len()]> = FxHashMap::default();
        for b in self.pending.values() {
            // Pending batches are visited in hash order; a fast hasher for
            // these scrape-local maps keeps a 100k-batch scrape cheap.
            let room = free.entry((&b.project, &b.region)).or_insert_with(|| {
                QuotaMetric::ALL.map(|m| {
                    self.ledger
                        .limit(&b.project, &b.region, m)
                        .saturating_sub(self.ledger.usage(&b.project, &b.region, m))
                })
            });
            let short = b.cluster.quota.iter().any(|q| {
                QuotaMetric::ALL
                    .iter()
                    .position(|m| *m == q.metric)
                    .is_some_and(|i| q.amount > room[i])
            });
            let reason = if short {
                "quota"
            } else if self.held_back.contains(&b.key) {
                "reservation"
            } else {
                "capacity"
            };
            let accelerator = super::accelerator_label(&b.cluster);
            *pending.entry((&b.region, accelerator, reason)).or_default() += 1;
            if let Some(deadline) = b.deadline {
                let total = (deadline - b.queued_at).num_milliseconds().max(1) as f64;
                let waited = (now - b.queued_at).num_milliseconds().max(0) as f64;
                let f = fraction.entry(&b.region).or_default();
                *f = f.max(waited / total);
            }
            seen.insert((&b.project, &b.region));
        }
        s.pending = pending
            .into_iter()
            .map(|((r, a, why), n)| ((r.to_string(), a.to_string(), why), n))
            .collect();
        s.wait_fraction = fraction
            .into_iter()
            .map(|(r, f)| (r.to_string(), f))
            .collect();
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
