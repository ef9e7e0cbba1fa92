//! What the core keeps of elastic clusters (docs/rules.md#elastic-batches):
//! the regions' policies, the running elastic clusters by region, what
//! each region's last walk left waiting for capacity, and the extras
//! taken back in a pass. The rules that read and change it are
//! `elastic.rs`.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::model::{BatchKey, ElasticPolicy, ExtraChange};
use crate::spec::Accelerator;

/// What a region's last walk left waiting for capacity: extras of a GPU
/// type in a region are granted only where nothing waits for it.
#[derive(Debug, Clone, Default)]
pub(super) struct Waiting {
    /// The walked region's own GPU types some queued batch waited for.
    here: HashSet<Option<Accelerator>>,
    /// (another region, GPU type) an alternative waited for.
    elsewhere: HashSet<(String, Option<Accelerator>)>,
}

impl Waiting {
    pub(super) fn here(&mut self, accelerator: Option<Accelerator>) {
        self.here.insert(accelerator);
    }

    pub(super) fn elsewhere(&mut self, region: &str, accelerator: Option<Accelerator>) {
        if !self.elsewhere.contains(&(region.to_string(), accelerator)) {
            self.elsewhere.insert((region.to_string(), accelerator));
        }
    }
}

/// The running elastic clusters, by region, and what each region's last
/// walk left waiting.
#[derive(Debug, Default)]
pub(super) struct Elastic {
    pub(super) policies: HashMap<String, ElasticPolicy>,
    /// Running clusters that may grow, by the region they hold.
    pub(super) running: HashMap<String, BTreeSet<BatchKey>>,
    /// Per region, how many of those need each GPU type for an extra: a
    /// region where every type they need is waited for is not looked at.
    needs: HashMap<String, HashMap<Option<Accelerator>, usize>>,
    /// Extras taken back, or lost with their node, in a pass, for
    /// [`Scheduler::grow`] to answer.
    pub(super) changes: Vec<ExtraChange>,
    /// Per walked region: what its last walk left waiting
    /// ([`Scheduler::pass`] keeps it).
    pub(super) waiting: HashMap<String, Waiting>,
}

impl Elastic {
    /// Running cluster `key` in `region` may grow, by extras of
    /// `accelerator`.
    pub(super) fn track(&mut self, region: &str, key: BatchKey, accelerator: Option<Accelerator>) {
        if self
            .running
            .entry(region.to_string())
            .or_default()
            .insert(key)
        {
            *self
                .needs
                .entry(region.to_string())
                .or_default()
                .entry(accelerator)
                .or_default() += 1;
        }
    }

    /// Running cluster `key` in `region` stopped.
    pub(super) fn untrack(
        &mut self,
        region: &str,
        key: BatchKey,
        accelerator: Option<Accelerator>,
    ) {
        let Some(keys) = self.running.get_mut(region) else {
            return;
        };
        if !keys.remove(&key) {
            return;
        }
        if keys.is_empty() {
            self.running.remove(region);
        }
        if let Some(needs) = self.needs.get_mut(region) {
            if let Some(n) = needs.get_mut(&accelerator) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    needs.remove(&accelerator);
                }
            }
            if needs.is_empty() {
                self.needs.remove(region);
            }
        }
    }

    /// Every (region, GPU type) a queued batch's last walk waited for
    /// (what [`Elastic::is_waited_for`] asks, gathered once for a round of
    /// grants).
    pub(super) fn waited(&self) -> HashSet<(String, Option<Accelerator>)> {
        let mut out = HashSet::new();
        for (walked, w) in &self.waiting {
            out.extend(w.here.iter().map(|a| (walked.clone(), *a)));
            out.extend(w.elsewhere.iter().cloned());
        }
        out
    }

    /// Whether every GPU type that `region`'s growing clusters need is
    /// waited for there (in `waited`): no extra can be granted in it.
    pub(super) fn all_waited(
        &self,
        region: &str,
        waited: &HashSet<(String, Option<Accelerator>)>,
    ) -> bool {
        self.needs.get(region).is_none_or(|needs| {
            needs
                .keys()
                .all(|a| waited.contains(&(region.to_string(), *a)))
        })
    }

    /// Whether a queued batch's last walk waited for capacity of
    /// `accelerator` in `region`.
    pub(super) fn is_waited_for(&self, region: &str, accelerator: Option<Accelerator>) -> bool {
        self.waiting.iter().any(|(walked, w)| {
            (walked == region && w.here.contains(&accelerator))
                || w.elsewhere.contains(&(region.to_string(), accelerator))
        })
    }
}
