//! What the property test generates: the world (regions, zones, pools,
//! node sizes), batches of the shapes `spec` allows, and the operations
//! the engine performs on the core.

use proptest::prelude::*;

use crate::scheduler::*;
use crate::spec::alternatives::{Alternative, Target, translate};
use crate::spec::{
    Accelerator, ClusterRequest, NodeShape, ProvisioningMode, QuotaMetric, Request, RuntimeVersion,
    Workload, quota_amounts,
};

/// (region, zone, the GPU types of its pools): each region offers every
/// type somewhere, and no zone offers them all.
pub(super) const ZONES: [(&str, &str, [Accelerator; 2]); 4] = [
    ("r0", "r0-a", [Accelerator::L4, Accelerator::A100_40]),
    ("r0", "r0-b", [Accelerator::L4, Accelerator::A100_80]),
    ("r1", "r1-a", [Accelerator::A100_40, Accelerator::A100_80]),
    ("r1", "r1-b", [Accelerator::L4, Accelerator::A100_40]),
];
pub(super) const REGIONS: [&str; 2] = ["r0", "r1"];
/// Nodes a pool may hold, virtual and agents' together.
pub(super) const POOL_MAX: u32 = 4;
pub(super) const PROJECTS: u8 = 3;

/// A node's size: its resources grow with its GPUs, at a ratio drawn on
/// both sides of what one GPU's part needs (a 1-GPU L4 part takes 4 to 16
/// cores, up to 53 GB and 375 GB of SSD; an A100 part 12 cores, up to
/// 78 or 165 GB and 375 to 9000 GB of SSD), so any of them can run out
/// first.
#[derive(Debug, Clone, Copy)]
pub(super) struct NodeGen {
    pub(super) gpus: u32,
    pub(super) cores_per_gpu: u32,
    pub(super) memory_per_gpu_mb: u64,
    pub(super) ssd_per_gpu_gb: u64,
}

pub(super) fn node_gen() -> impl Strategy<Value = NodeGen> {
    (
        1u32..=8,
        prop::sample::select(vec![4u32, 8, 12, 16, 24]),
        prop::sample::select(vec![16_000u64, 54_000, 90_000, 170_000]),
        prop::sample::select(vec![375u64, 750, 1500, 3000]),
    )
        .prop_map(
            |(gpus, cores_per_gpu, memory_per_gpu_mb, ssd_per_gpu_gb)| NodeGen {
                gpus,
                cores_per_gpu,
                memory_per_gpu_mb,
                ssd_per_gpu_gb,
            },
        )
}

pub(super) fn node_spec(
    id: String,
    zone: usize,
    pool: usize,
    g: NodeGen,
    is_virtual: bool,
) -> NodeSpec {
    let (region, zone, types) = ZONES[zone];
    let accelerator = types[pool];
    NodeSpec {
        id: NodeId(id),
        region: region.into(),
        zone: zone.into(),
        pool: accelerator.name().into(),
        accelerator,
        gpu_addresses: (0..g.gpus).map(|i| i.to_string()).collect(),
        cores: g.gpus * g.cores_per_gpu,
        memory_mb: u64::from(g.gpus) * g.memory_per_gpu_mb,
        local_ssd_gb: u64::from(g.gpus) * g.ssd_per_gpu_gb,
        is_virtual,
    }
}

/// One part's shape, from the shapes `spec` allows for its GPU type (or a
/// CPU driver): `size` picks the cores (and so the GPUs), `memory_tenths`
/// how much of the shape's memory it asks, `ssd` one of its SSD sizes.
#[derive(Debug, Clone, Copy)]
pub(super) struct PartGen {
    pub(super) accelerator: Option<Accelerator>,
    pub(super) size: usize,
    pub(super) memory_tenths: u64,
    pub(super) ssd: usize,
}

pub(super) fn accelerator() -> impl Strategy<Value = Accelerator> {
    prop::sample::select(Accelerator::ALL.to_vec())
}

pub(super) fn part_gen(
    accelerator: impl Strategy<Value = Option<Accelerator>>,
) -> impl Strategy<Value = PartGen> {
    // Mostly the 1-GPU shapes; L4's 2-, 4- and 8-GPU ones less often.
    let size = prop_oneof![3 => 0usize..4, 1 => 4usize..7];
    (accelerator, size, 2u64..=10, 0usize..6).prop_map(|(accelerator, size, memory_tenths, ssd)| {
        PartGen {
            accelerator,
            size,
            memory_tenths,
            ssd,
        }
    })
}

impl PartGen {
    pub(super) fn shape(self) -> NodeShape {
        let Some(a) = self.accelerator else {
            let cores = [4u32, 8, 16][self.size % 3];
            let total = u64::from(cores) * 4000 * self.memory_tenths / 10;
            return NodeShape {
                accelerator: None,
                cores,
                gpus: 0,
                memory_mb: total - total / 10,
                memory_overhead_mb: total / 10,
                local_ssd_gb: 0,
            };
        };
        let allowed = a.allowed_cores();
        let cores = allowed[self.size % allowed.len()];
        let total = a.max_total_memory_mb(cores).unwrap_or(13384) * self.memory_tenths / 10;
        let (ssd_choices, default_ssd) = a.local_ssd_choices_gb(cores);
        NodeShape {
            accelerator: Some(a),
            cores,
            gpus: a.gpus_for_cores(cores).unwrap_or(1),
            memory_mb: total - total / 10,
            memory_overhead_mb: total / 10,
            local_ssd_gb: ssd_choices
                .get(self.ssd % ssd_choices.len().max(1))
                .copied()
                .unwrap_or(default_ssd),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Submit {
    pub(super) region: usize,
    pub(super) project: u8,
    pub(super) priority: i32,
    pub(super) executor: PartGen,
    /// A CPU driver, or one of any GPU type (a driver may differ from
    /// its executors); `driver_like_executors` gives it theirs.
    pub(super) driver: PartGen,
    pub(super) driver_like_executors: bool,
    pub(super) executors: u32,
    pub(super) queue: bool,
    pub(super) timeout_s: u64,
    pub(super) ttl_s: u64,
    pub(super) retries: u32,
    /// Its alternatives (queue mode only): targets repeated or equal to its own
    /// placement are dropped, as a create refuses or skips them.
    pub(super) alternatives: Vec<AlternativeGen>,
}

/// An alternative: another GPU type in the batch's region, on-demand quota, or
/// the other region; its delay a tenth of the allocation timeout.
#[derive(Debug, Clone, Copy)]
pub(super) struct AlternativeGen {
    pub(super) kind: u8,
    pub(super) to: Accelerator,
    pub(super) after_tenths: u64,
}

pub(super) fn alternative_gen() -> impl Strategy<Value = AlternativeGen> {
    (
        prop_oneof![4 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)],
        accelerator(),
        0u64..10,
    )
        .prop_map(|(kind, to, after_tenths)| AlternativeGen {
            kind,
            to,
            after_tenths,
        })
}

pub(super) fn submit() -> impl Strategy<Value = Submit> {
    (
        (
            0usize..2,
            0..PROJECTS,
            prop::sample::select(vec![-1i32, 0, 0, 1, 5]),
        ),
        part_gen(accelerator().prop_map(Some)),
        part_gen(prop::option::weighted(0.7, accelerator())),
        any::<bool>(),
        0u32..5,
        prop::bool::weighted(0.8),
        (
            prop_oneof![1u64..120, 300u64..900],
            prop::sample::select(vec![600u64, 1800, 7200]),
            0u32..3,
        ),
        prop_oneof![
            3 => Just(Vec::new()),
            2 => proptest::collection::vec(alternative_gen(), 1..=2),
        ],
    )
        .prop_map(
            |(
                (region, project, priority),
                executor,
                driver,
                driver_like_executors,
                executors,
                queue,
                (timeout_s, ttl_s, retries),
                alternatives,
            )| Submit {
                region,
                project,
                priority,
                executor,
                driver,
                driver_like_executors,
                executors,
                queue,
                timeout_s,
                ttl_s,
                retries,
                alternatives,
            },
        )
}

impl Submit {
    pub(super) fn request(&self) -> Request {
        let executor = self.executor.shape();
        let mut driver = self.driver;
        if self.driver_like_executors {
            driver.accelerator = self.executor.accelerator;
        }
        let driver = driver.shape();
        let mode = if self.queue {
            ProvisioningMode::Queue
        } else {
            ProvisioningMode::Default
        };
        let own = ClusterRequest {
            workload: Workload::Pyspark,
            runtime: RuntimeVersion::new(3, 0),
            quota: quota_amounts(&driver, &executor, self.executors, mode),
            driver,
            executor,
            executor_count: self.executors,
            mode,
            allocation_timeout_s: self.timeout_s,
            ttl_s: Some(self.ttl_s),
            infrastructure_retries: self.retries,
            preemptible: true,
            dynamic_allocation: false,
            max_extras: 0,
        };
        let mut alternatives = Vec::new();
        if mode == ProvisioningMode::Queue {
            let region = REGIONS[self.region];
            let mut targets = Vec::new();
            for g in &self.alternatives {
                let target = match g.kind {
                    0 => Target::Accelerator(g.to),
                    1 => Target::OnDemand,
                    _ => Target::Region(REGIONS[1 - self.region].to_string()),
                };
                if targets.contains(&target) || target == Target::Accelerator(own_type(&own)) {
                    continue;
                }
                targets.push(target.clone());
                alternatives.push(Alternative {
                    index: targets.len() as u32,
                    after_s: self.timeout_s * g.after_tenths / 10,
                    region: match &target {
                        Target::Region(r) => r.clone(),
                        _ => region.to_string(),
                    },
                    cluster: alternative_cluster(&own, &target),
                    target,
                });
            }
        }
        Request {
            cluster: own,
            alternatives,
        }
    }
}

/// The GPU type of a cluster's executors (always one here).
fn own_type(c: &ClusterRequest) -> Accelerator {
    c.executor.accelerator.unwrap_or(Accelerator::L4)
}

/// A part of GPU type `from` on `to`, as a create gives it: the shape
/// `translate` picks, the type's default disk, 80 % of its memory.
fn part_on(shape: &NodeShape, from: Accelerator, to: Accelerator) -> NodeShape {
    if shape.accelerator != Some(from) {
        return *shape;
    }
    let (cores, gpus) = translate(shape.gpus, shape.cores, to);
    let total = to.max_total_memory_mb(cores).unwrap_or(13384) * 8 / 10;
    NodeShape {
        accelerator: Some(to),
        cores,
        gpus,
        memory_mb: total - total / 10,
        memory_overhead_mb: total / 10,
        local_ssd_gb: to.local_ssd_choices_gb(cores).1,
    }
}

/// The cluster a batch is on `target` (docs/rules.md#placement-alternatives):
/// its own GPU type's parts reshaped, as many executors as keep its GPUs;
/// on-demand: default mode; another region: the same cluster.
fn alternative_cluster(own: &ClusterRequest, target: &Target) -> ClusterRequest {
    let mut c = own.clone();
    match target {
        Target::Accelerator(to) => {
            let from = own_type(own);
            c.driver = part_on(&own.driver, from, *to);
            c.executor = part_on(&own.executor, from, *to);
            let total = u64::from(own.executor_count) * u64::from(own.executor.gpus);
            c.executor_count = total.div_ceil(u64::from(c.executor.gpus.max(1))) as u32;
        }
        Target::OnDemand => c.mode = ProvisioningMode::Default,
        Target::Region(_) => {}
    }
    c.quota = quota_amounts(&c.driver, &c.executor, c.executor_count, c.mode);
    c
}

/// Quota rules as a config declares them: one limit for every GPU metric
/// and one for local SSD, for every project and region, and a rule of its
/// own for one project in one region.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) gpus: u64,
    pub(super) ssd_gb: u64,
    pub(super) special: (u8, usize, usize, u64),
}

pub(super) fn limits() -> impl Strategy<Value = Limits> {
    (
        2u64..40,
        prop::sample::select(vec![1500u64, 6000, 20_000, 100_000]),
        (
            0..PROJECTS,
            0usize..2,
            0usize..QuotaMetric::ALL.len(),
            0u64..24,
        ),
    )
        .prop_map(|(gpus, ssd_gb, special)| Limits {
            gpus,
            ssd_gb,
            special,
        })
}

impl Limits {
    pub(super) fn rules(self) -> Vec<QuotaRule> {
        let (project, region, metric, limit) = self.special;
        QuotaMetric::ALL
            .into_iter()
            .map(|metric| QuotaRule {
                project: "*".into(),
                region: "*".into(),
                metric,
                limit: if metric == QuotaMetric::LocalSsdTotalGb {
                    self.ssd_gb
                } else {
                    self.gpus
                },
            })
            .chain([QuotaRule {
                project: format!("p{project}"),
                region: REGIONS[region].into(),
                metric: QuotaMetric::ALL[metric],
                limit: if QuotaMetric::ALL[metric] == QuotaMetric::LocalSsdTotalGb {
                    limit * 375
                } else {
                    limit
                },
            }])
            .collect()
    }
}

/// A config reload: queue order and weights, quota rules, and whether one
/// of the virtual nodes drawn at the start is declared.
#[derive(Debug, Clone)]
pub(super) struct Reload {
    pub(super) strict: bool,
    pub(super) weights: [u8; 3],
    pub(super) limits: Limits,
    pub(super) virtual_node: usize,
    pub(super) declared: bool,
}

#[derive(Debug, Clone)]
pub(super) enum Op {
    Submit(Submit),
    /// Another batch of an earlier one's shape, mode and ttl, in its
    /// region (work repeats; and only batches of one shape tell whether
    /// the queue's order held).
    SubmitLike {
        like: usize,
        project: u8,
        priority: i32,
    },
    /// A cancel of a queued or running batch.
    Cancel(usize),
    /// A running batch ends (its work is done or failed).
    Finish(usize),
    /// A running batch's agent reports an infrastructure failure: it goes
    /// back to the queue if it has retries left, else it fails.
    InfraFailure(usize),
    /// An agent registers its node (again, when the id is known): a lease
    /// that lapses unless renewed.
    Register {
        zone: usize,
        pool: usize,
        n: u8,
        node: NodeGen,
        lease_s: u64,
    },
    Heartbeat {
        node: usize,
        lease_s: u64,
    },
    /// Holds or resumes a region's queue, or one project's in it.
    Hold {
        region: usize,
        project: Option<u8>,
        on: bool,
    },
    Cordon {
        node: usize,
        on: bool,
    },
    /// An admin's quota override.
    SetLimit {
        project: u8,
        region: usize,
        metric: usize,
        limit: u64,
    },
    Reload(Reload),
    Advance(u64),
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => submit().prop_map(Op::Submit),
        4 => (any::<usize>(), 0..PROJECTS, prop::sample::select(vec![-1i32, 0, 0, 1, 5]))
            .prop_map(|(like, project, priority)| Op::SubmitLike { like, project, priority }),
        1 => any::<usize>().prop_map(Op::Cancel),
        2 => any::<usize>().prop_map(Op::Finish),
        1 => any::<usize>().prop_map(Op::InfraFailure),
        2 => (0usize..4, 0usize..2, 0u8..3, node_gen(), 1u64..200)
            .prop_map(|(zone, pool, n, node, lease_s)| Op::Register { zone, pool, n, node, lease_s }),
        1 => (any::<usize>(), 1u64..200).prop_map(|(node, lease_s)| Op::Heartbeat { node, lease_s }),
        1 => (0usize..2, prop::option::of(0..PROJECTS), any::<bool>())
            .prop_map(|(region, project, on)| Op::Hold { region, project, on }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(node, on)| Op::Cordon { node, on }),
        1 => (0..PROJECTS, 0usize..2, 0usize..QuotaMetric::ALL.len(), 0u64..24)
            .prop_map(|(project, region, metric, limit)| Op::SetLimit { project, region, metric, limit }),
        1 => (any::<bool>(), [0u8..3, 0u8..3, 0u8..3], limits(), any::<usize>(), any::<bool>())
            .prop_map(|(strict, weights, limits, virtual_node, declared)| Op::Reload(Reload {
                strict, weights, limits, virtual_node, declared,
            })),
        3 => (1u64..90).prop_map(Op::Advance),
    ]
}

/// What the config declares at the start: queue order, quota rules and
/// the virtual nodes, as (zone, pool, size).
#[derive(Debug, Clone)]
pub(super) struct Setup {
    pub(super) strict: bool,
    pub(super) limits: Limits,
    pub(super) virtual_nodes: Vec<(usize, usize, NodeGen)>,
}

pub(super) fn setup() -> impl Strategy<Value = Setup> {
    (
        any::<bool>(),
        limits(),
        proptest::collection::vec((0usize..4, 0usize..2, node_gen()), 2..12),
    )
        .prop_map(|(strict, limits, virtual_nodes)| Setup {
            strict,
            limits,
            virtual_nodes,
        })
}

pub(super) fn policy(strict: bool, weights: [u8; 3]) -> FairSharePolicy {
    FairSharePolicy {
        order: if strict {
            Order::Strict
        } else {
            Order::FairShare
        },
        weights: weights
            .iter()
            .enumerate()
            .map(|(p, w)| (format!("p{p}"), [1.0, 2.0, 0.5][usize::from(*w)]))
            .collect(),
        ..FairSharePolicy::default()
    }
}

/// The pools every zone declares: the largest node drawn, `POOL_MAX` of
/// them (what never-fit checks compare with).
pub(super) fn pools() -> Vec<PoolDecl> {
    let largest = NodeGen {
        gpus: 8,
        cores_per_gpu: 24,
        memory_per_gpu_mb: 170_000,
        ssd_per_gpu_gb: 3000,
    };
    (0..ZONES.len())
        .flat_map(|zone| {
            (0..2).map(move |pool| {
                let node = node_spec(format!("pool/{zone}/{pool}"), zone, pool, largest, true);
                PoolDecl {
                    region: node.region.clone(),
                    zone: node.zone.clone(),
                    node,
                    max_nodes: POOL_MAX,
                    provisioner: None,
                }
            })
        })
        .collect()
}
