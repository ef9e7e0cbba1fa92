//! What the metrics show of the scheduler, computed at scrape time from
//! its state (never kept up to date all over the code).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

use super::core::{CapacityRow, Scheduler};
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
    pub agent_nodes: u64,
    pub virtual_nodes: u64,
}

impl Scheduler {
    pub fn snapshot(&self, now: DateTime<Utc>) -> Snapshot {
        let mut s = Snapshot::default();
        let mut pairs: BTreeSet<(String, String)> = self.ledger.pairs();
        for b in self.pending.values() {
            let reason = if self
                .ledger
                .shortfall(&b.project, &b.region, &b.cluster.quota)
                .is_some()
            {
                "quota"
            } else if self.held_back.contains(&b.key) {
                "reservation"
            } else {
                "capacity"
            };
            let accelerator = b
                .cluster
                .executor
                .accelerator
                .or(b.cluster.driver.accelerator)
                .map_or("cpu", |a| a.name());
            *s.pending
                .entry((b.region.clone(), accelerator.to_string(), reason))
                .or_default() += 1;
            if let Some(deadline) = b.deadline {
                let total = (deadline - b.queued_at).num_milliseconds().max(1) as f64;
                let waited = (now - b.queued_at).num_milliseconds().max(0) as f64;
                let f = s.wait_fraction.entry(b.region.clone()).or_default();
                *f = f.max(waited / total);
            }
            if !pairs.contains(&(b.project.clone(), b.region.clone())) {
                pairs.insert((b.project.clone(), b.region.clone()));
            }
        }
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
