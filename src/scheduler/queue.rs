//! The queue: every queued batch and the indexes kept over them — each
//! region's order (strict, and per project for fair share), the
//! deadlines, the shapes queued per region, the alternatives that wait or may be
//! tried ([`Alternatives`]), the tally a scrape reads, and the batches the last
//! pass held back. [`Queue::insert`] and [`Queue::remove`] are the only
//! ways in and out, so the indexes cannot drift apart.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::alternatives::Alternatives;
use super::model::{BatchKey, PendingBatch, ShapeKey, shape_key};
use super::tally::QueuedTally;
use crate::spec::{ClusterRequest, ProvisioningMode};

/// Queue order within a project, and across projects in strict order:
/// higher priority first, then older first.
pub(super) type QueueKey = (std::cmp::Reverse<i32>, BatchKey);

/// Where `batch` stands in its queues.
pub(super) fn queue_key(batch: &PendingBatch) -> QueueKey {
    (std::cmp::Reverse(batch.priority), batch.key)
}

/// Queued batches of one shape in a region: how many, and how many of each
/// ttl (the shortest bounds whether any of them could backfill).
#[derive(Debug, Default)]
pub(super) struct ShapeStats {
    pub(super) count: usize,
    pub(super) ttls: BTreeMap<u64, usize>,
}

fn ttl_key(c: &ClusterRequest) -> u64 {
    c.ttl_s.unwrap_or(u64::MAX)
}

#[derive(Debug, Default)]
pub(super) struct Queue {
    /// Boxed: growing a map of a million entries moves only pointers, not
    /// the batches (a rehash of inline entries stalled creates for 0.6 s).
    batches: HashMap<BatchKey, Box<PendingBatch>>,
    /// Queued batches per project (for the per-project limit).
    per_project: HashMap<String, usize>,
    /// Per region, in strict order.
    regions: BTreeMap<String, BTreeSet<QueueKey>>,
    /// The same batches per region and project, for fair-share order.
    projects: HashMap<String, HashMap<String, BTreeSet<QueueKey>>>,
    deadlines: BTreeSet<(DateTime<Utc>, BatchKey)>,
    /// Per region: how many queued batches of each shape, and of default
    /// mode. A pass stops scanning a region once every shape present has
    /// failed and no default-mode batch awaits its verdict.
    shapes: HashMap<String, HashMap<ShapeKey, ShapeStats>>,
    defaults: HashMap<String, usize>,
    alternatives: Alternatives,
    /// The queued batches counted as a scrape reports them (`tally.rs`).
    tally: QueuedTally,
    /// Queued batches held back last time only by the reservation of an
    /// earlier batch (for the metrics' not-admitted reason).
    held_back: HashSet<BatchKey>,
}

fn decrement<K: std::hash::Hash + Eq + Clone>(counts: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = counts.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(key);
        }
    }
}

impl Queue {
    /// Queues `batch`; false when it is queued already.
    pub(super) fn insert(&mut self, batch: PendingBatch) -> bool {
        if self.batches.contains_key(&batch.key) {
            return false;
        }
        let stats = self
            .shapes
            .entry(batch.region.clone())
            .or_default()
            .entry(shape_key(&batch.cluster))
            .or_default();
        stats.count += 1;
        *stats.ttls.entry(ttl_key(&batch.cluster)).or_default() += 1;
        if batch.cluster.mode == ProvisioningMode::Default {
            *self.defaults.entry(batch.region.clone()).or_default() += 1;
        }
        let at = queue_key(&batch);
        self.regions
            .entry(batch.region.clone())
            .or_default()
            .insert(at);
        self.projects
            .entry(batch.region.clone())
            .or_default()
            .entry(batch.project.clone())
            .or_default()
            .insert(at);
        if let Some(d) = batch.deadline {
            self.deadlines.insert((d, batch.key));
        }
        *self.per_project.entry(batch.project.clone()).or_default() += 1;
        self.alternatives.schedule(&batch);
        self.tally.add(&batch);
        self.batches.insert(batch.key, Box::new(batch));
        true
    }

    /// Takes `key` out of the queue and every index; None when it was not
    /// queued.
    pub(super) fn remove(&mut self, key: BatchKey) -> Option<Box<PendingBatch>> {
        self.held_back.remove(&key);
        let b = self.batches.remove(&key)?;
        self.tally.remove(&b);
        decrement(&mut self.per_project, &b.project);
        if let Some(m) = self.shapes.get_mut(&b.region) {
            let shape = shape_key(&b.cluster);
            if let Some(stats) = m.get_mut(&shape) {
                stats.count -= 1;
                decrement_ttl(&mut stats.ttls, ttl_key(&b.cluster));
                if stats.count == 0 {
                    m.remove(&shape);
                }
            }
        }
        if b.cluster.mode == ProvisioningMode::Default {
            if let Some(n) = self.defaults.get_mut(&b.region) {
                *n = n.saturating_sub(1);
            }
        }
        let at = queue_key(&b);
        if let Some(q) = self.regions.get_mut(&b.region) {
            q.remove(&at);
        }
        if let Some(projects) = self.projects.get_mut(&b.region) {
            if let Some(q) = projects.get_mut(&b.project) {
                q.remove(&at);
                if q.is_empty() {
                    projects.remove(&b.project);
                }
            }
        }
        if let Some(d) = b.deadline {
            self.deadlines.remove(&(d, key));
        }
        self.alternatives.drop_batch(&b);
        Some(b)
    }

    pub(super) fn get(&self, key: BatchKey) -> Option<&PendingBatch> {
        self.batches.get(&key).map(Box::as_ref)
    }

    pub(super) fn contains(&self, key: BatchKey) -> bool {
        self.batches.contains_key(&key)
    }

    pub(super) fn len(&self) -> usize {
        self.batches.len()
    }

    /// Every queued batch, in no order.
    #[cfg(test)]
    pub(super) fn batches(&self) -> impl Iterator<Item = &PendingBatch> {
        self.batches.values().map(Box::as_ref)
    }

    /// Queued batches of `project`.
    pub(super) fn of_project(&self, project: &str) -> usize {
        self.per_project.get(project).copied().unwrap_or(0)
    }

    /// Every project with queued batches, and how many.
    #[cfg(test)]
    pub(super) fn per_project(&self) -> &HashMap<String, usize> {
        &self.per_project
    }

    /// The regions that ever had a queue.
    pub(super) fn region_names(&self) -> impl Iterator<Item = &String> {
        self.regions.keys()
    }

    /// A region's queue in strict order.
    pub(super) fn region(&self, region: &str) -> Option<&BTreeSet<QueueKey>> {
        self.regions.get(region)
    }

    /// Whether `region` has batches of its own queued.
    pub(super) fn has_queued(&self, region: &str) -> bool {
        self.regions.get(region).is_some_and(|q| !q.is_empty())
    }

    /// A region's queue per project (fair-share order).
    pub(super) fn projects_in(&self, region: &str) -> Option<&HashMap<String, BTreeSet<QueueKey>>> {
        self.projects.get(region)
    }

    /// Every (region, project) with a queue.
    pub(super) fn region_projects(&self) -> impl Iterator<Item = (&str, &str)> {
        self.projects
            .iter()
            .flat_map(|(r, ps)| ps.keys().map(move |p| (r.as_str(), p.as_str())))
    }

    /// One project's queue in a region.
    pub(super) fn project_queue(&self, region: &str, project: &str) -> Option<&BTreeSet<QueueKey>> {
        self.projects.get(region)?.get(project)
    }

    /// The earliest deadline, and whose.
    pub(super) fn first_deadline(&self) -> Option<(DateTime<Utc>, BatchKey)> {
        self.deadlines.first().copied()
    }

    /// The shapes queued in `region`, counted.
    pub(super) fn shapes(&self, region: &str) -> Option<&HashMap<ShapeKey, ShapeStats>> {
        self.shapes.get(region)
    }

    /// Default-mode batches queued in `region`.
    pub(super) fn defaults(&self, region: &str) -> usize {
        self.defaults.get(region).copied().unwrap_or(0)
    }

    pub(super) fn alternatives(&self) -> &Alternatives {
        &self.alternatives
    }

    /// Alternatives whose delay has passed at `now` may be tried from now on;
    /// answers the regions of their batches.
    pub(super) fn ripen(&mut self, now: DateTime<Utc>) -> Vec<String> {
        let batches = &self.batches;
        self.alternatives
            .ripen(now, |key| batches.get(&key).map(Box::as_ref))
    }

    pub(super) fn tally(&self) -> &QueuedTally {
        &self.tally
    }

    /// The batches the last pass held back only for an earlier batch's
    /// reservation.
    pub(super) fn held_back(&self) -> &HashSet<BatchKey> {
        &self.held_back
    }

    /// Marks (or clears) that the reservation alone held `key` back.
    pub(super) fn set_held_back(&mut self, key: BatchKey, held: bool) {
        if held {
            self.held_back.insert(key);
        } else {
            self.held_back.remove(&key);
        }
    }
}

fn decrement_ttl(ttls: &mut BTreeMap<u64, usize>, ttl: u64) {
    if let Some(n) = ttls.get_mut(&ttl) {
        *n -= 1;
        if *n == 0 {
            ttls.remove(&ttl);
        }
    }
}
