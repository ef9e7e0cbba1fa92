//! The one tally the core keeps for its metrics as batches come and go:
//! the queued batches by kind (region, project, GPU type and quota asked)
//! and by allocation timeout, so that a scrape (`snapshot.rs`) must not
//! walk 100k of them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};

use super::model::{BatchKey, PendingBatch};
use crate::spec::QuotaAmount;

/// The queued batches counted the way a scrape reports them, kept as
/// batches come and go ([`QueuedTally::add`] in `submit`,
/// [`QueuedTally::remove`] in `forget`), so that a scrape costs what the
/// kinds of batches cost, not their number.
#[derive(Debug, Default)]
pub(super) struct QueuedTally {
    /// region → project → (GPU type, quota the cluster asks) → batches:
    /// every batch of a class is short of quota, or not, alike.
    pub(super) classes: HashMap<String, HashMap<String, HashMap<Class, u64>>>,
    /// region → allocation timeout (ms) → when its batches were queued: of
    /// batches with one timeout, the first queued has waited the largest
    /// fraction of it.
    pub(super) waits: HashMap<String, BTreeMap<i64, Queued>>,
}

pub(super) type Class = (&'static str, Vec<QuotaAmount>);

/// Batches by when they were queued, first first.
pub(super) type Queued = BTreeSet<(DateTime<Utc>, BatchKey)>;

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
