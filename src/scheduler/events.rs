//! The events that change the scheduler core's state: nodes added,
//! removed, registered and heartbeating; batches submitted, restored as
//! running after a restart, and forgotten (left the queue or ended); quota
//! limits set. Each marks the regions it touched as dirty, so the next pass
//! (`pass.rs`) scans only them.

use chrono::{DateTime, Utc};

use super::capacity::{Node, NodeId, NodeSpec};
use super::core::Scheduler;
use super::lease::NodeLeaseError;
use super::model::{Allocation, BatchKey, PendingBatch};

impl Scheduler {
    /// A node joins (a virtual one, the simulator's, or an agent's as it
    /// registers): a slot of a set being created is that set's batch's.
    pub fn add_node(&mut self, spec: NodeSpec) {
        self.dirty.insert(spec.region.clone());
        let id = spec.id.clone();
        if !self.capacity.nodes.contains_key(&spec.id) {
            self.capacity.insert(Node::new(spec));
        }
        self.bind_slot(&id);
    }

    /// Removes a node; returns the batches holding part of it (the caller
    /// fails them: a partial cluster must not keep running).
    pub fn remove_node(&mut self, id: &NodeId) -> Vec<BatchKey> {
        self.slot_lost(id);
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
        if self.running.contains_key(&batch.key) {
            return;
        }
        let region = batch.region.clone();
        if self.queue.insert(batch) {
            self.dirty.insert(region);
        }
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
        self.start_running(alloc);
        true
    }

    /// A batch left the queue or ended at `now`: drop it and give back what
    /// it held. Idempotent. Answers the cluster it gave back, if it held
    /// one.
    pub fn forget(&mut self, key: BatchKey, now: DateTime<Utc>) -> Option<Allocation> {
        if let Some(b) = self.queue.remove(key) {
            self.dirty.insert(b.region.clone());
            // A preemptor that leaves gives back what was set aside; so
            // does a batch whose nodes are being created.
            self.drop_claim(key);
            self.abandon_set(key, "the batch left the queue");
        }
        let a = self.stop_running(key)?;
        self.dirty.insert(a.region.clone());
        // A preempted cluster's capacity goes to its preemptor.
        if !self.bank_victim(&a) {
            self.capacity.give_back(&a.placements);
        }
        if a.placements.iter().any(|p| self.retired.contains(&p.node)) {
            // A retired node may now be empty: a virtual one leaves.
            self.settle_layout();
        }
        self.ledger.refund(&a.project, &a.region, &a.quota);
        self.release_share(&a, now);
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
            // A slot of a set being created is its batch's alone (add_node
            // binds a new node itself).
            self.bind_slot(&id);
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
    ) -> Result<(), NodeLeaseError> {
        self.leases.renew(node, epoch, expires)
    }
}
