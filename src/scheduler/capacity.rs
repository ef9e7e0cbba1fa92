//! The capacity map: nodes with their GPU addresses and free resources, and
//! the placement of a whole cluster onto the nodes of one zone.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::spec::{Accelerator, ClusterRequest, NodeShape, PartRole};

/// A node's id: `virtual/{zone}/{pool}/{n}` for operator-declared virtual
/// nodes, the agent's id for registered ones.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub String);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a node is: where it lives and what it has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub id: NodeId,
    pub region: String,
    pub zone: String,
    pub pool: String,
    pub accelerator: Accelerator,
    /// GPU addresses as the node's discovery reports them ("0", "1", …).
    pub gpu_addresses: Vec<String>,
    pub cores: u32,
    pub memory_mb: u64,
    pub local_ssd_gb: u64,
    /// Declared by the operator for simulation: no agent, no real GPU.
    pub is_virtual: bool,
}

/// A node and what of it is free.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub spec: NodeSpec,
    /// Per GPU address: free or not.
    pub gpu_free: Vec<bool>,
    pub free_cores: u32,
    pub free_memory_mb: u64,
    pub free_ssd_gb: u64,
}

impl Node {
    pub(super) fn new(spec: NodeSpec) -> Node {
        Node {
            gpu_free: vec![true; spec.gpu_addresses.len()],
            free_cores: spec.cores,
            free_memory_mb: spec.memory_mb,
            free_ssd_gb: spec.local_ssd_gb,
            spec,
        }
    }

    pub(super) fn free_gpus(&self) -> u32 {
        self.gpu_free.iter().filter(|f| **f).count() as u32
    }
}

/// The part of a cluster on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub node: NodeId,
    pub role: PartRole,
    /// The GPU addresses given, exactly.
    pub gpus: Vec<String>,
    pub cores: u32,
    pub memory_mb: u64,
    pub local_ssd_gb: u64,
    /// The type of the GPUs given; None for a part without GPUs (or one
    /// stored before the type was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Accelerator>,
}

/// What one part needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PartNeed {
    pub role: PartRole,
    pub accelerator: Option<Accelerator>,
    pub gpus: u32,
    pub cores: u32,
    pub memory_mb: u64,
    pub ssd_gb: u64,
}

impl PartNeed {
    pub(crate) fn of(role: PartRole, shape: &NodeShape) -> PartNeed {
        PartNeed {
            role,
            accelerator: shape.accelerator,
            gpus: shape.gpus,
            cores: shape.cores,
            memory_mb: shape.memory_mb + shape.memory_overhead_mb,
            ssd_gb: shape.local_ssd_gb,
        }
    }
}

/// The parts of a cluster, largest first (placing big parts first packs
/// better).
pub(crate) fn needs(cluster: &ClusterRequest) -> Vec<PartNeed> {
    let driver = PartNeed::of(PartRole::Driver, &cluster.driver);
    let exec = PartNeed::of(PartRole::Executor, &cluster.executor);
    parts_of(driver, exec, cluster.executor_count)
}

/// A driver and `count` executors, largest first.
pub(super) fn parts_of(driver: PartNeed, executor: PartNeed, count: u32) -> Vec<PartNeed> {
    let mut needs = vec![driver];
    needs.extend(std::iter::repeat_n(executor, count as usize));
    needs.sort_by_key(|n| std::cmp::Reverse((n.gpus, n.cores, n.memory_mb)));
    needs
}

/// Whether `need` fits a node of type `accelerator` with `free` =
/// (GPUs, cores, memory MB, SSD GB) left.
fn fits(accelerator: Accelerator, free: (u32, u32, u64, u64), need: &PartNeed) -> bool {
    need.accelerator.is_none_or(|a| a == accelerator)
        && free.0 >= need.gpus
        && free.1 >= need.cores
        && free.2 >= need.memory_mb
        && free.3 >= need.ssd_gb
}

/// The outcome of trying to place a cluster in one zone.
pub(crate) struct ZonePlan {
    pub placements: Vec<Placement>,
    /// How many parts could be placed (all of them when the plan is
    /// complete).
    pub placed: usize,
    pub total: usize,
    /// Free GPUs left on the nodes the plan touched: lower is tighter.
    pub crumbs: u64,
}

impl ZonePlan {
    pub(super) fn complete(&self) -> bool {
        self.placed == self.total
    }
}

/// Best-fit placement of every part onto `nodes` (one zone), without
/// changing them. Each part goes to the node it fits most tightly, which
/// keeps whole nodes free for large clusters.
pub(crate) fn plan_zone(nodes: &[&Node], needs: &[PartNeed]) -> ZonePlan {
    // Scratch copies of what is free.
    let mut free: Vec<(u32, u32, u64, u64)> = nodes
        .iter()
        .map(|n| (n.free_gpus(), n.free_cores, n.free_memory_mb, n.free_ssd_gb))
        .collect();
    let mut taken_gpus: Vec<Vec<bool>> = nodes.iter().map(|n| n.gpu_free.clone()).collect();
    let mut touched = vec![false; nodes.len()];
    let mut placements = Vec::with_capacity(needs.len());
    for need in needs {
        let best = nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| fits(n.spec.accelerator, free[*i], need))
            .min_by_key(|(i, n)| {
                let (g, c, _, _) = free[*i];
                // GPU parts: fewest GPUs left over; CPU parts: prefer nodes
                // whose GPUs are already busy, then fewest cores left.
                let gpu_left = g - need.gpus;
                let cpu_only_penalty = u32::from(need.gpus == 0 && g > 0) * g;
                (gpu_left + cpu_only_penalty, c - need.cores, &n.spec.id)
            })
            .map(|(i, _)| i);
        let Some(i) = best else { continue };
        let node = nodes[i];
        let mut gpus = Vec::with_capacity(need.gpus as usize);
        for (slot, is_free) in taken_gpus[i].iter_mut().enumerate() {
            if gpus.len() == need.gpus as usize {
                break;
            }
            if *is_free {
                *is_free = false;
                gpus.push(node.spec.gpu_addresses[slot].clone());
            }
        }
        let f = &mut free[i];
        f.0 -= need.gpus;
        f.1 -= need.cores;
        f.2 -= need.memory_mb;
        f.3 -= need.ssd_gb;
        touched[i] = true;
        placements.push(Placement {
            node: node.spec.id.clone(),
            role: need.role,
            gpus,
            cores: need.cores,
            memory_mb: need.memory_mb,
            local_ssd_gb: need.ssd_gb,
            accelerator: need.accelerator.filter(|_| need.gpus > 0),
        });
    }
    let crumbs = free
        .iter()
        .zip(&touched)
        .filter(|(_, t)| **t)
        .map(|(f, _)| u64::from(f.0))
        .sum();
    ZonePlan {
        placed: placements.len(),
        total: needs.len(),
        placements,
        crumbs,
    }
}

/// Every node, and an index of them by region and zone: a placement
/// looks at one region's zones, never at every node.
#[derive(Debug, Clone, Default)]
pub(crate) struct Capacity {
    /// Read freely; changed only through [`Capacity::insert`] and
    /// [`Capacity::remove`], which keep the index.
    pub nodes: BTreeMap<NodeId, Node>,
    zones: HashMap<String, BTreeMap<String, BTreeSet<NodeId>>>,
    /// Nodes that take nothing new (placement never sees them) but keep
    /// what they hold: cordoned by an admin, or retired by the config.
    unschedulable: HashSet<NodeId>,
}

impl Capacity {
    /// Adds or replaces a node; answers the node it replaced.
    pub(super) fn insert(&mut self, node: Node) -> Option<Node> {
        let old = self.remove(&node.spec.id);
        self.zones
            .entry(node.spec.region.clone())
            .or_default()
            .entry(node.spec.zone.clone())
            .or_default()
            .insert(node.spec.id.clone());
        self.nodes.insert(node.spec.id.clone(), node);
        old
    }

    pub(super) fn remove(&mut self, id: &NodeId) -> Option<Node> {
        let node = self.nodes.remove(id)?;
        if let Some(zones) = self.zones.get_mut(&node.spec.region) {
            if let Some(ids) = zones.get_mut(&node.spec.zone) {
                ids.remove(id);
                if ids.is_empty() {
                    zones.remove(&node.spec.zone);
                }
            }
            if zones.is_empty() {
                self.zones.remove(&node.spec.region);
            }
        }
        Some(node)
    }

    /// The zones of `region` that have nodes, in name order.
    pub(super) fn zones<'a>(&'a self, region: &str) -> impl Iterator<Item = &'a str> + 'a {
        self.zones
            .get(region)
            .into_iter()
            .flat_map(|z| z.keys().map(String::as_str))
    }

    /// The nodes of a zone that take new work, in id order.
    pub(super) fn zone_nodes<'a>(&'a self, region: &str, zone: &str) -> Vec<&'a Node> {
        self.zones
            .get(region)
            .and_then(|z| z.get(zone))
            .into_iter()
            .flatten()
            .filter(|id| !self.unschedulable.contains(*id))
            .filter_map(|id| self.nodes.get(id))
            .collect()
    }

    /// Every node of a zone, those that take no new work too, in id order.
    pub(super) fn zone_nodes_all<'a>(
        &'a self,
        region: &str,
        zone: &str,
    ) -> impl Iterator<Item = &'a Node> + 'a {
        self.zones
            .get(region)
            .and_then(|z| z.get(zone))
            .into_iter()
            .flatten()
            .filter_map(|id| self.nodes.get(id))
    }

    /// Which nodes take no new work.
    pub(super) fn set_unschedulable(&mut self, ids: HashSet<NodeId>) {
        self.unschedulable = ids;
    }

    pub(super) fn is_unschedulable(&self, id: &NodeId) -> bool {
        self.unschedulable.contains(id)
    }

    /// A copy of one zone's schedulable nodes, to plan on without
    /// touching these.
    pub(super) fn zone(&self, region: &str, zone: &str) -> Capacity {
        let mut out = Capacity::default();
        for n in self.zone_nodes(region, zone) {
            out.insert(n.clone());
        }
        out
    }

    /// A copy of one region's nodes that take new work.
    pub(super) fn region(&self, region: &str) -> Capacity {
        let mut out = Capacity::default();
        for zone in self.zones(region) {
            for n in self.zone_nodes(region, zone) {
                out.insert(n.clone());
            }
        }
        out
    }

    /// Takes the resources of `placements`. False (and nothing taken) when
    /// any part no longer fits: the invariant "no node given twice" is
    /// checked here, not assumed.
    pub(super) fn take(&mut self, placements: &[Placement]) -> bool {
        let ok = placements.iter().all(|p| {
            self.nodes.get(&p.node).is_some_and(|n| {
                p.gpus.iter().all(|g| {
                    n.spec
                        .gpu_addresses
                        .iter()
                        .position(|a| a == g)
                        .is_some_and(|i| n.gpu_free[i])
                })
            })
        });
        // Each GPU is free; no GPU is given twice (a plan never does, but
        // a bad restore could); and each node's cores, memory and SSD
        // cover the sum of its parts.
        if !ok || !no_gpu_twice(placements) || !sums_fit(self, placements) {
            return false;
        }
        for p in placements {
            if let Some(n) = self.nodes.get_mut(&p.node) {
                n.free_cores -= p.cores;
                n.free_memory_mb -= p.memory_mb;
                n.free_ssd_gb -= p.local_ssd_gb;
                for g in &p.gpus {
                    if let Some(i) = n.spec.gpu_addresses.iter().position(|a| a == g) {
                        n.gpu_free[i] = false;
                    }
                }
            }
        }
        true
    }

    /// Takes, of each of `planned`, what is free now (the GPUs among its
    /// addresses that are free, and up to its cores, memory and SSD), and
    /// answers what it took: a preemptor's claim sets aside the free part
    /// of its plan while its victims stop (`preempt.rs`).
    pub(super) fn take_free(&mut self, planned: &[Placement]) -> Vec<Placement> {
        let mut taken = Vec::new();
        for p in planned {
            let Some(n) = self.nodes.get_mut(&p.node) else {
                continue;
            };
            let mut gpus = Vec::new();
            for g in &p.gpus {
                if let Some(i) = n.spec.gpu_addresses.iter().position(|a| a == g) {
                    if n.gpu_free[i] {
                        n.gpu_free[i] = false;
                        gpus.push(g.clone());
                    }
                }
            }
            let part = Placement {
                node: p.node.clone(),
                role: p.role,
                gpus,
                cores: p.cores.min(n.free_cores),
                memory_mb: p.memory_mb.min(n.free_memory_mb),
                local_ssd_gb: p.local_ssd_gb.min(n.free_ssd_gb),
                accelerator: p.accelerator,
            };
            n.free_cores -= part.cores;
            n.free_memory_mb -= part.memory_mb;
            n.free_ssd_gb -= part.local_ssd_gb;
            taken.push(part);
        }
        taken
    }

    /// Gives back what `placements` took (nodes that left are skipped).
    pub(super) fn give_back(&mut self, placements: &[Placement]) {
        for p in placements {
            if let Some(n) = self.nodes.get_mut(&p.node) {
                n.free_cores = (n.free_cores + p.cores).min(n.spec.cores);
                n.free_memory_mb = (n.free_memory_mb + p.memory_mb).min(n.spec.memory_mb);
                n.free_ssd_gb = (n.free_ssd_gb + p.local_ssd_gb).min(n.spec.local_ssd_gb);
                for g in &p.gpus {
                    if let Some(i) = n.spec.gpu_addresses.iter().position(|a| a == g) {
                        n.gpu_free[i] = true;
                    }
                }
            }
        }
    }
}

fn no_gpu_twice(placements: &[Placement]) -> bool {
    let mut seen = std::collections::HashSet::new();
    placements
        .iter()
        .flat_map(|p| p.gpus.iter().map(move |g| (&p.node, g)))
        .all(|k| seen.insert(k))
}

fn sums_fit(c: &Capacity, placements: &[Placement]) -> bool {
    let mut per_node: BTreeMap<&NodeId, (u32, u64, u64)> = BTreeMap::new();
    for p in placements {
        let e = per_node.entry(&p.node).or_default();
        e.0 += p.cores;
        e.1 += p.memory_mb;
        e.2 += p.local_ssd_gb;
    }
    per_node.iter().all(|(id, (cores, mem, ssd))| {
        c.nodes.get(*id).is_some_and(|n| {
            n.free_cores >= *cores && n.free_memory_mb >= *mem && n.free_ssd_gb >= *ssd
        })
    })
}
