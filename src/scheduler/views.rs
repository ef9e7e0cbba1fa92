//! What the scheduler shows of its queues and capacity without deciding
//! anything: queue pages and heads, quota and capacity views, nodes, and
//! the invariant check the tests use. Why a batch waits and when it may
//! start is `pending.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::capacity::{NodeId, NodeSpec};
use super::core::Scheduler;
use super::fairshare::Order;
use super::model::{BatchKey, PendingBatch};
use super::pending::{ESTIMATE_DEPTH, Place};
use super::queue::QueueKey;
use super::quota::QuotaView;
use super::reasons::PendingInfo;

/// What a node's holders hold of it: cores, memory (MB), local SSD (GB)
/// and GPU addresses. For the invariant check.
#[cfg(test)]
type NodeHeld<'a> = (u32, u64, u64, std::collections::HashSet<&'a String>);

/// Capacity per region, zone and GPU type, for the admin views.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityRow {
    pub region: String,
    pub zone: String,
    pub accelerator: String,
    pub nodes: u64,
    pub virtual_nodes: u64,
    pub total_gpus: u64,
    pub allocated_gpus: u64,
    /// Free on nodes that take new work.
    pub free_gpus: u64,
    /// Free on nodes that take no new work (cordoned by an admin, or
    /// retired by a config reload): not offered.
    pub cordoned_gpus: u64,
    pub total_local_ssd_gb: u64,
    pub free_local_ssd_gb: u64,
}

impl Scheduler {
    pub fn quotas(&self, project: &str, region: &str) -> Vec<QuotaView> {
        self.ledger.view(project, region)
    }

    /// The projects of `region` with quota in use, a limit of their own
    /// (a rule naming them, an admin's override) or queued batches, in
    /// name order: whose quotas an admin's view lists.
    pub fn quota_projects(&self, region: &str) -> Vec<String> {
        let mut projects: BTreeSet<String> = self
            .ledger
            .pairs()
            .into_iter()
            .filter(|(_, r)| r == region)
            .map(|(p, _)| p)
            .collect();
        if let Some(queued) = self.queue.projects_in(region) {
            projects.extend(queued.keys().cloned());
        }
        projects.into_iter().collect()
    }

    /// Total, allocated and free GPUs and SSD per region, zone and type.
    pub fn capacity_rows(&self) -> Vec<CapacityRow> {
        let mut rows: BTreeMap<(String, String, String), CapacityRow> = BTreeMap::new();
        for n in self.capacity.nodes.values() {
            let s = &n.spec;
            let row = rows
                .entry((s.region.clone(), s.zone.clone(), s.accelerator.to_string()))
                .or_insert_with(|| CapacityRow {
                    region: s.region.clone(),
                    zone: s.zone.clone(),
                    accelerator: s.accelerator.to_string(),
                    nodes: 0,
                    virtual_nodes: 0,
                    total_gpus: 0,
                    allocated_gpus: 0,
                    free_gpus: 0,
                    cordoned_gpus: 0,
                    total_local_ssd_gb: 0,
                    free_local_ssd_gb: 0,
                });
            row.nodes += 1;
            row.virtual_nodes += u64::from(s.is_virtual);
            row.total_gpus += s.gpu_addresses.len() as u64;
            if self.capacity.is_unschedulable(&s.id) {
                row.cordoned_gpus += u64::from(n.free_gpus());
            } else {
                row.free_gpus += u64::from(n.free_gpus());
            }
            row.allocated_gpus += (s.gpu_addresses.len() as u64) - u64::from(n.free_gpus());
            row.total_local_ssd_gb += s.local_ssd_gb;
            row.free_local_ssd_gb += n.free_ssd_gb;
        }
        rows.into_values().collect()
    }

    /// Whether a node is an operator-declared virtual node.
    pub fn is_virtual(&self, node: &NodeId) -> bool {
        self.capacity
            .nodes
            .get(node)
            .is_some_and(|n| n.spec.is_virtual)
    }

    /// Every node with what is free on it.
    pub fn nodes(&self) -> Vec<(NodeSpec, u32, u32, u64, u64)> {
        self.capacity
            .nodes
            .values()
            .map(|n| {
                (
                    n.spec.clone(),
                    n.free_gpus(),
                    n.free_cores,
                    n.free_memory_mb,
                    n.free_ssd_gb,
                )
            })
            .collect()
    }

    /// Checks the invariants: no node over-given, quota usage equal to what
    /// running clusters hold. For tests.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        self.check_queued_per_project()?;
        let used = self.held_per_node()?;
        self.check_nodes(used)?;
        self.check_quota_usage()?;
        self.check_loans()?;
        self.check_elastic()?;
        self.check_claims()
    }

    /// Each elastic cluster: its extras in its zone, executors of its
    /// shape, no more than its most nor its core fewer than its gang, each
    /// with its grant time; and the index of them by region is theirs.
    #[cfg(test)]
    fn check_elastic(&self) -> Result<(), String> {
        let mut indexed: Vec<(String, BatchKey)> = self
            .elastic
            .running
            .iter()
            .flat_map(|(r, keys)| keys.iter().map(move |k| (r.clone(), *k)))
            .collect();
        let mut running = Vec::new();
        for a in self.running.values() {
            let Some(g) = &a.elastic else { continue };
            running.push((a.region.clone(), a.key));
            let extras = a.extras();
            if g.core > a.placements.len()
                || extras.len() > g.max as usize
                || extras.len() != g.granted.len()
            {
                return Err(format!(
                    "cluster {}: core {}, {} parts, {} extras of at most {}, {} grant times",
                    a.key.0,
                    g.core,
                    a.placements.len(),
                    extras.len(),
                    g.max,
                    g.granted.len()
                ));
            }
            for p in extras {
                let zone = self
                    .capacity
                    .nodes
                    .get(&p.node)
                    .map(|n| n.spec.zone.as_str());
                if zone.is_some_and(|z| z != a.zone)
                    || p.role != crate::spec::PartRole::Executor
                    || p.gpus.len() as u32 != g.need.gpus
                    || p.cores != g.need.cores
                {
                    return Err(format!(
                        "cluster {} in {}: extra {p:?} is not an executor of its shape in its zone",
                        a.key.0, a.zone
                    ));
                }
            }
        }
        indexed.sort();
        running.sort();
        if indexed != running {
            return Err(format!(
                "elastic clusters indexed {indexed:?}, running {running:?}"
            ));
        }
        Ok(())
    }

    /// The loans the core indexes by region are the running clusters on
    /// a loan, each under the region it holds.
    #[cfg(test)]
    fn check_loans(&self) -> Result<(), String> {
        let mut indexed: Vec<(String, BatchKey)> = self
            .loans
            .iter()
            .flat_map(|(r, keys)| keys.iter().map(move |k| (r.clone(), *k)))
            .collect();
        let mut running: Vec<(String, BatchKey)> = self
            .running
            .values()
            .filter(|a| a.loan().is_some())
            .map(|a| (a.region.clone(), a.key))
            .collect();
        indexed.sort();
        running.sort();
        if indexed != running {
            return Err(format!(
                "loans indexed {indexed:?}, running on loan {running:?}"
            ));
        }
        Ok(())
    }

    /// The queued batches per project the queue counts are those it holds.
    #[cfg(test)]
    fn check_queued_per_project(&self) -> Result<(), String> {
        let mut by_project: HashMap<&str, usize> = HashMap::new();
        for b in self.queue.batches() {
            *by_project.entry(b.project.as_str()).or_default() += 1;
        }
        let counted: HashMap<&str, usize> = self
            .queue
            .per_project()
            .iter()
            .map(|(p, n)| (p.as_str(), *n))
            .collect();
        if by_project != counted {
            return Err(format!(
                "queued per project {counted:?} does not match the queue {by_project:?}"
            ));
        }
        Ok(())
    }

    /// What running clusters hold, and what is set aside for preemptors,
    /// per node: cores, memory, SSD and GPUs. Never a GPU twice, even in
    /// passing.
    #[cfg(test)]
    fn held_per_node(&self) -> Result<HashMap<&NodeId, NodeHeld<'_>>, String> {
        let mut used: HashMap<&NodeId, NodeHeld<'_>> = HashMap::new();
        let held = self
            .running
            .values()
            .map(|a| &a.placements)
            .chain(self.claims.iter().map(|(_, c)| &c.banked));
        for placements in held {
            for p in placements {
                let e = used.entry(&p.node).or_default();
                e.0 += p.cores;
                e.1 += p.memory_mb;
                e.2 += p.local_ssd_gb;
                for g in &p.gpus {
                    if !e.3.insert(g) {
                        return Err(format!("GPU {g} of {} given twice", p.node));
                    }
                }
            }
        }
        Ok(used)
    }

    /// Every node, those that hold nothing included: what is free and
    /// what is held (`used`) add up to the node, GPU by GPU, core, memory
    /// and SSD. A node whose GPUs leaked to no one shows here.
    #[cfg(test)]
    fn check_nodes(&self, mut used: HashMap<&NodeId, NodeHeld<'_>>) -> Result<(), String> {
        for (id, n) in &self.capacity.nodes {
            let (cores, mem, ssd, gpus) = used.remove(id).unwrap_or_default();
            if cores > n.spec.cores || mem > n.spec.memory_mb || ssd > n.spec.local_ssd_gb {
                return Err(format!("node {id} overcommitted"));
            }
            for (address, free) in n.spec.gpu_addresses.iter().zip(&n.gpu_free) {
                if *free == gpus.contains(address) {
                    return Err(format!(
                        "node {id}: GPU {address} is {} but {}",
                        if *free { "free" } else { "not free" },
                        if *free { "held" } else { "held by no one" }
                    ));
                }
            }
            if let Some(g) = gpus.iter().find(|g| !n.spec.gpu_addresses.contains(g)) {
                return Err(format!("node {id}: GPU {g} is held but not the node's"));
            }
            if n.free_cores + cores != n.spec.cores
                || n.free_memory_mb + mem != n.spec.memory_mb
                || n.free_ssd_gb + ssd != n.spec.local_ssd_gb
            {
                return Err(format!(
                    "node {id}: free and held do not add up: cores {}+{cores} of {}, memory {}+{mem} of {} MB, SSD {}+{ssd} of {} GB",
                    n.free_cores,
                    n.spec.cores,
                    n.free_memory_mb,
                    n.spec.memory_mb,
                    n.free_ssd_gb,
                    n.spec.local_ssd_gb
                ));
            }
        }
        Ok(())
    }

    /// The ledger's quota usage is what the running clusters hold.
    #[cfg(test)]
    fn check_quota_usage(&self) -> Result<(), String> {
        let mut usage: HashMap<(&str, &str, crate::spec::QuotaMetric), u64> = HashMap::new();
        for a in self.running.values() {
            for q in &a.quota {
                *usage.entry((&a.project, &a.region, q.metric)).or_default() += q.amount;
            }
        }
        for ((p, r, m), u) in usage {
            if self.ledger.usage(p, r, m) != u {
                return Err(format!("quota usage of {p}/{r}/{m} is off"));
            }
        }
        Ok(())
    }

    /// A preemptor waits in the queue; its victims still stopping run,
    /// each for one preemptor that counts it.
    #[cfg(test)]
    fn check_claims(&self) -> Result<(), String> {
        for (key, claim) in self.claims.iter() {
            if !self.queue.contains(*key) {
                return Err(format!("preemptor {} is not queued", key.0));
            }
            for v in &claim.waiting {
                if !self.running.contains_key(v) || self.claims.stopping_for(*v) != Some(*key) {
                    return Err(format!(
                        "victim {} of {} is not stopping for it",
                        v.0, key.0
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn running_keys(&self) -> Vec<BatchKey> {
        let mut keys: Vec<_> = self.running.keys().copied().collect();
        keys.sort();
        keys
    }

    #[cfg(test)]
    pub(crate) fn ledger_usage(
        &self,
        project: &str,
        region: &str,
        metric: crate::spec::QuotaMetric,
    ) -> u64 {
        self.ledger.usage(project, region, metric)
    }

    /// A page of a region's queue in its order at `now`: the `take`
    /// batches after the first `skip` of `project`'s (or of every
    /// project's), each with what a get shows of it (its position is in
    /// the whole region's order); and how many wait in that scope. Each
    /// batch's place comes from the walk itself; the walk goes only as far
    /// as the page, except for one project's page in strict order, which
    /// counts the other projects' batches ahead in one walk of the region.
    pub fn queue_page(
        &self,
        region: &str,
        project: Option<&str>,
        skip: usize,
        take: usize,
        now: DateTime<Utc>,
    ) -> (usize, Vec<(&PendingBatch, PendingInfo)>) {
        let total = self.queued_in(region, project);
        let placed: Vec<(BatchKey, Place)> = match (self.fair.order(), project) {
            (Order::FairShare, Some(p)) => self
                .queue
                .project_queue(region, p)
                .into_iter()
                .flatten()
                .enumerate()
                .skip(skip)
                .take(take)
                .map(|(i, (_, k))| (*k, Place::InProject(i + 1)))
                .collect(),
            (Order::Strict, Some(p)) => self
                .queue
                .region(region)
                .into_iter()
                .flatten()
                .enumerate()
                .filter(|(_, (_, k))| self.queue.get(*k).is_some_and(|b| b.project == p))
                .skip(skip)
                .take(take)
                .map(|(i, (_, k))| (*k, Place::Region(i + 1)))
                .collect(),
            (_, None) => self
                .region_walk(region, now)
                .enumerate()
                .skip(skip)
                .take(take)
                .map(|(i, k)| (k, Place::Region(i + 1)))
                .collect(),
        };
        // The start estimates of the page's batches near the head (with
        // at most ESTIMATE_DEPTH ahead), in one walk of the region's order
        // rather than one simulation each.
        // A project's page in fair share: its batches come after every
        // batch of the projects before it.
        let offset = match (self.fair.order(), project) {
            (Order::FairShare, Some(p)) => {
                let mine = (self.fair_key(region, p, now), p);
                self.queue
                    .projects_in(region)
                    .into_iter()
                    .flatten()
                    .filter(|(q, _)| (self.fair_key(region, q, now), q.as_str()) < mine)
                    .map(|(_, q)| q.len())
                    .sum()
            }
            _ => 0,
        };
        let in_region = |place: &Place| match place {
            Place::Region(i) => *i,
            Place::InProject(i) => offset + i,
            Place::Unknown => ESTIMATE_DEPTH + 1,
        };
        let deepest = placed
            .iter()
            .map(|(_, place)| in_region(place))
            .max()
            .unwrap_or(0)
            .min(ESTIMATE_DEPTH + 1);
        let shallow = placed
            .iter()
            .any(|(_, place)| in_region(place) <= ESTIMATE_DEPTH + 1);
        let estimates: HashMap<BatchKey, Option<DateTime<Utc>>> = if shallow {
            let order = self.region_order(region, deepest, now);
            order
                .iter()
                .copied()
                .zip(self.estimates_in_order(region, &order, now))
                .collect()
        } else {
            HashMap::new()
        };
        let page = placed
            .into_iter()
            .filter_map(|(k, place)| {
                Some((
                    self.queue.get(k)?,
                    self.pending_info_at(k, place, estimates.get(&k).copied(), now)?,
                ))
            })
            .collect();
        (total, page)
    }

    /// The first `n` batches of `region`'s queue in the order a pass walks
    /// it at `now` (strict, or fair share: the projects by usage ÷ weight,
    /// then each project's queue).
    fn region_order(&self, region: &str, n: usize, now: DateTime<Utc>) -> Vec<BatchKey> {
        self.region_walk(region, now).take(n).collect()
    }

    /// `region`'s queue in the order a pass walks it at `now`.
    fn region_walk<'a>(
        &'a self,
        region: &str,
        now: DateTime<Utc>,
    ) -> Box<dyn Iterator<Item = BatchKey> + 'a> {
        match self.fair.order() {
            Order::Strict => Box::new(
                self.queue
                    .region(region)
                    .into_iter()
                    .flatten()
                    .map(|(_, k)| *k),
            ),
            Order::FairShare => {
                let mut order: Vec<(u64, &str, &BTreeSet<QueueKey>)> = self
                    .queue
                    .projects_in(region)
                    .into_iter()
                    .flatten()
                    .map(|(p, q)| (self.fair_key(region, p, now), p.as_str(), q))
                    .collect();
                order.sort_unstable_by_key(|&(share, p, _)| (share, p));
                Box::new(
                    order
                        .into_iter()
                        .flat_map(|(_, _, q)| q.iter())
                        .map(|(_, k)| *k),
                )
            }
        }
    }

    /// The first batch of a region's queue in its order at `now`.
    pub fn queue_head(&self, region: &str, now: DateTime<Utc>) -> Option<BatchKey> {
        match self.fair.order() {
            Order::Strict => self.queue.region(region)?.first().map(|(_, k)| *k),
            Order::FairShare => self
                .queue
                .projects_in(region)?
                .iter()
                .min_by_key(|(p, _)| (self.fair_key(region, p, now), *p))
                .and_then(|(_, q)| q.first().map(|(_, k)| *k)),
        }
    }

    /// Batches queued in `region`, of `project` or of every project.
    pub fn queued_in(&self, region: &str, project: Option<&str>) -> usize {
        match project {
            None => self.queue.region(region).map_or(0, |q| q.len()),
            Some(p) => self.queue.project_queue(region, p).map_or(0, |q| q.len()),
        }
    }
}
