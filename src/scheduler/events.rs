//! The events that change the scheduler core's state: nodes added,
//! removed, registered and heartbeating; batches submitted, restored as
//! running after a restart, and forgotten (left the queue or ended); quota
//! limits set. Each marks the regions it touched as dirty, so the next pass
//! (`pass.rs`) scans only them.

use chrono::{DateTime, Utc};

use super::capacity::{Node, NodeId, NodeSpec};
use super::core::{Scheduler, ttl_key};
use super::lease::LeaseError;
use super::model::{Allocation, BatchKey, PendingBatch, shape_key};
use crate::spec::ProvisioningMode;

impl Scheduler {
    pub fn add_node(&mut self, spec: NodeSpec) {
        self.dirty.insert(spec.region.clone());
        if !self.capacity.nodes.contains_key(&spec.id) {
            self.capacity.insert(Node::new(spec));
        }
    }

    /// Removes a node; returns the batches holding part of it (the caller
    /// fails them: a partial cluster must not keep running).
    pub fn remove_node(&mut self, id: &NodeId) -> Vec<BatchKey> {
        if let Some(n) = self.capacity.remove(id) {
            self.dirty.insert(n.spec.region);
        }
        let mut hit: Vec<BatchKey> = self
            .running
            .values()
            .filter(|a| a.placements.iter().any(|p| &p.node == id))
            .map(|a| a.key)
            .collect();
        hit.sort();
        hit
    }

    pub fn submit(&mut self, batch: PendingBatch) {
        if self.pending.contains_key(&batch.key) || self.running.contains_key(&batch.key) {
            return;
        }
        self.dirty.insert(batch.region.clone());
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
        self.queues
            .entry(batch.region.clone())
            .or_default()
            .insert((std::cmp::Reverse(batch.priority), batch.key));
        self.project_queues
            .entry(batch.region.clone())
            .or_default()
            .entry(batch.project.clone())
            .or_default()
            .insert((std::cmp::Reverse(batch.priority), batch.key));
        if let Some(d) = batch.deadline {
            self.deadlines.insert((d, batch.key));
        }
        *self
            .pending_by_project
            .entry(batch.project.clone())
            .or_default() += 1;
        self.schedule_rungs(&batch);
        self.tally.add(&batch);
        self.pending.insert(batch.key, Box::new(batch));
    }

    /// Restores a cluster that holds capacity (after a restart). False when
    /// its nodes cannot hold it (the caller fails the batch).
    pub fn restore_allocation(&mut self, alloc: Allocation) -> bool {
        if self.running.contains_key(&alloc.key) || !self.capacity.take(&alloc.placements) {
            return false;
        }
        self.ledger
            .charge(&alloc.project, &alloc.region, &alloc.quota);
        self.fair
            .hold(&alloc.region, &alloc.project, &alloc.placements);
        self.running.insert(alloc.key, alloc);
        true
    }

    /// A batch left the queue or ended at `now`: drop it and give back what
    /// it held. Idempotent. Answers the cluster it gave back, if it held
    /// one.
    pub fn forget(&mut self, key: BatchKey, now: DateTime<Utc>) -> Option<Allocation> {
        self.held_back.remove(&key);
        if let Some(b) = self.pending.remove(&key) {
            self.tally.remove(&b);
            self.dirty.insert(b.region.clone());
            if let Some(n) = self.pending_by_project.get_mut(&b.project) {
                *n -= 1;
                if *n == 0 {
                    self.pending_by_project.remove(&b.project);
                }
            }
            if let Some(m) = self.shapes.get_mut(&b.region) {
                let shape = shape_key(&b.cluster);
                if let Some(stats) = m.get_mut(&shape) {
                    stats.count -= 1;
                    let ttl = ttl_key(&b.cluster);
                    if let Some(n) = stats.ttls.get_mut(&ttl) {
                        *n -= 1;
                        if *n == 0 {
                            stats.ttls.remove(&ttl);
                        }
                    }
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
            if let Some(q) = self.queues.get_mut(&b.region) {
                q.remove(&(std::cmp::Reverse(b.priority), key));
            }
            if let Some(projects) = self.project_queues.get_mut(&b.region) {
                if let Some(q) = projects.get_mut(&b.project) {
                    q.remove(&(std::cmp::Reverse(b.priority), key));
                    if q.is_empty() {
                        projects.remove(&b.project);
                    }
                }
            }
            if let Some(d) = b.deadline {
                self.deadlines.remove(&(d, key));
            }
            self.drop_rungs(&b);
            // A preemptor that leaves gives back what was set aside.
            self.drop_claim(key);
        }
        let a = self.running.remove(&key)?;
        self.dirty.insert(a.region.clone());
        // A preempted cluster's capacity goes to its preemptor.
        if !self.bank_victim(&a) {
            self.capacity.give_back(&a.placements);
        }
        if a.placements.iter().any(|p| self.retired.contains(&p.node)) {
            // A retired node may now be empty: a virtual one leaves.
            self.settle();
        }
        self.ledger.refund(&a.project, &a.region, &a.quota);
        self.fair
            .release(&a.region, &a.project, &a.placements, a.allocated_at, now);
        Some(a)
    }

    pub fn set_quota_limit(
        &mut self,
        project: &str,
        region: &str,
        metric: crate::spec::QuotaMetric,
        limit: u64,
    ) {
        self.ledger.set_limit(project, region, metric, limit);
        self.dirty.insert(region.to_string());
    }

    /// An agent registered its node (again): it joins the capacity with a
    /// fresh lease. A node already known keeps what it holds; its shape is
    /// updated when what it holds still fits the new one. Answers `false`
    /// when the new shape is smaller than what the node holds, and the old
    /// shape was kept.
    pub fn register_node(&mut self, spec: NodeSpec, epoch: u64, expires: DateTime<Utc>) -> bool {
        let id = spec.id.clone();
        let changed = self.capacity.nodes.get(&id).is_some_and(|n| n.spec != spec);
        let mut taken = true;
        if changed {
            let held: Vec<_> = self
                .running
                .values()
                .flat_map(|a| a.placements.iter().filter(|p| p.node == id).cloned())
                .collect();
            self.dirty.insert(spec.region.clone());
            if let Some(old) = self.capacity.insert(Node::new(spec)) {
                if !self.capacity.take(&held) {
                    self.capacity.insert(old);
                    taken = false;
                }
            }
        } else {
            self.add_node(spec);
        }
        self.leases.grant(id, epoch, expires);
        taken
    }

    /// An agent's heartbeat: renews the lease of the current epoch only.
    pub fn heartbeat(
        &mut self,
        node: &NodeId,
        epoch: u64,
        expires: DateTime<Utc>,
    ) -> Result<(), LeaseError> {
        self.leases.renew(node, epoch, expires)
    }
}
