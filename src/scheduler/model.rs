//! The scheduler's model: what the core takes and returns. A batch's key,
//! a queued batch, an allocation, a decision, a declared pool, an admin's
//! hold or cordon, what a cluster asks for as a shape (its key, its
//! metric label, its text), and a preemption's policy, decision and claim
//! (what `preempt.rs` decides), an elastic cluster's growth and its
//! changes (what `elastic.rs` decides). Types and pure functions of them; the
//! [`Scheduler`](super::Scheduler) that acts on them is `core.rs` (its
//! state), `events.rs` and `pass.rs`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::fmt;

use super::capacity::{NodeId, NodeSpec, PartNeed, Placement};
use crate::api::EndReason;
use crate::spec::{Accelerator, Alternative, ClusterRequest, PartRole, QuotaAmount};

/// A batch's key: its store sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BatchKey(pub i64);

/// A batch waiting for its cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingBatch {
    pub key: BatchKey,
    /// The batch id, for logs (`batch.id`).
    pub batch_id: String,
    pub project: String,
    pub region: String,
    pub priority: i32,
    pub queued_at: DateTime<Utc>,
    /// Queue mode: queue time + allocation timeout. None: default mode.
    pub deadline: Option<DateTime<Utc>>,
    pub cluster: ClusterRequest,
    /// Where else it may run once it has waited, in order.
    pub alternatives: Vec<Alternative>,
    /// How many times it was preempted (a victim no more once the
    /// region's `max_preemptions`).
    pub preemptions: u32,
}

/// A cluster holding capacity and quota.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    pub key: BatchKey,
    pub batch_id: String,
    pub project: String,
    pub region: String,
    pub zone: String,
    pub placements: Vec<Placement>,
    pub quota: Vec<QuotaAmount>,
    pub allocated_at: DateTime<Utc>,
    /// allocated_at + ttl, when the batch has a ttl.
    pub expected_end: Option<DateTime<Utc>>,
    /// When the batch was queued (its wait is allocated_at − queued_at).
    pub queued_at: DateTime<Utc>,
    /// The GPU type, for metric labels ("cpu" without one).
    pub accelerator: &'static str,
    /// On a placement alternative: which, and why; None on its own
    /// placement.
    pub alternative: Option<OnAlternative>,
    /// What preemption looks at: the batch's `flexq-priority`, whether it
    /// may be preempted (`spark.flexq.preemptible`) and how many times it
    /// was.
    pub priority: i32,
    pub preemptible: bool,
    pub preemptions: u32,
    /// Spark's dynamic allocation on: its core gang and its extras
    /// (`elastic.rs`); None for a cluster of a fixed size.
    pub elastic: Option<Box<Growth>>,
}

/// A cluster allocated on a placement alternative.
#[derive(Debug, Clone, PartialEq)]
pub struct OnAlternative {
    /// 1 and up: its place in the batch's alternatives.
    pub index: u32,
    /// The GPU type the batch asked for ("cpu" without one).
    pub asked: &'static str,
    /// Why its own placement did not serve, for its history.
    pub note: String,
    /// Where the alternative runs on capacity others own: a loan.
    pub loan: Option<Loan>,
}

impl OnAlternative {
    /// A batch of `home` whose own cluster is `own` placed on `alternative`,
    /// for `note`.
    pub fn of(home: &str, own: &ClusterRequest, alternative: &Alternative, note: String) -> Self {
        OnAlternative {
            index: alternative.index,
            asked: accelerator_label(own),
            note,
            loan: alternative.is_loan().then(|| Loan {
                home: home.to_string(),
                asked: own.accelerator(),
            }),
        }
    }
}

/// A cluster that runs on capacity others own — another GPU type, or
/// another region — until its owners need it back
/// (docs/rules.md#loans-and-reclaim). Whose capacity it is is where the
/// allocation is: its region, zone and GPU type.
#[derive(Debug, Clone, PartialEq)]
pub struct Loan {
    /// The batch's own region and GPU type: the operator's alternatives
    /// entry for them says when the loan may be reclaimed.
    pub home: String,
    pub asked: Option<Accelerator>,
}

impl Allocation {
    /// The alternative it holds: 0 its own placement.
    pub fn alternative_index(&self) -> u32 {
        self.alternative.as_ref().map_or(0, |r| r.index)
    }

    /// The loan it runs on, if it does.
    pub fn loan(&self) -> Option<&Loan> {
        self.alternative.as_ref()?.loan.as_ref()
    }

    /// Whose capacity a loan is: "a100-40 in europe-west4-b".
    pub fn lender(&self) -> String {
        lender(self.accelerator, &self.zone)
    }
}

/// Whose capacity a loan is, in words: its GPU type and where
/// ("a100-40 in europe-west4-b").
pub fn lender(accelerator: &str, place: &str) -> String {
    format!("{accelerator} in {place}")
}

impl Allocation {
    /// GPUs of the whole cluster.
    pub fn gpus(&self) -> u64 {
        self.placements.iter().map(|p| p.gpus.len() as u64).sum()
    }

    /// GPU-seconds held from the allocation until `until`.
    /// An elastic cluster's extras count from their grants.
    pub fn gpu_seconds(&self, until: DateTime<Utc>) -> f64 {
        let held = |from: DateTime<Utc>| (until - from).num_milliseconds().max(0) as f64 / 1000.0;
        let extras = self.extras();
        let core = self.core_parts();
        let core_gpus: usize = core.iter().map(|p| p.gpus.len()).sum();
        let granted = self.elastic.iter().flat_map(|g| g.granted.iter());
        let extra_seconds: f64 = extras
            .iter()
            .zip(granted)
            .map(|(p, at)| p.gpus.len() as f64 * held(*at))
            .sum();
        core_gpus as f64 * held(self.allocated_at) + extra_seconds
    }
}

/// What the scheduler decided; the runner commits it.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Every node of the cluster, at once.
    Allocate(Allocation),
    /// The deadline passed first.
    Expire {
        key: BatchKey,
        batch_id: String,
        message: String,
        region: String,
        accelerator: &'static str,
    },
    /// Default mode: no capacity or quota right now.
    Reject {
        key: BatchKey,
        batch_id: String,
        message: String,
        /// [`EndReason::Quota`] or [`EndReason::StockOut`].
        reason: EndReason,
    },
    /// A node's lease lapsed: it leaves the capacity, and every batch that
    /// held part of it fails (a partial cluster must not go on).
    LoseNode {
        node: NodeId,
        /// The registration that lapsed; `None` for a node the config no
        /// longer declares. A registration since (on another replica)
        /// makes the decision void.
        epoch: Option<u64>,
        failed: Vec<BatchKey>,
        /// The ids of `failed`, for logs.
        failed_ids: Vec<String>,
        message: String,
        /// The clusters given back, for usage counts.
        released: Vec<Allocation>,
    },
    /// Running clusters stop so that a batch blocked by capacity starts:
    /// once every victim is gone, an `Allocate` of the preemptor follows.
    Preempt(Preemption),
    /// New nodes are created for a batch that only capacity blocks: once
    /// every slot has registered, an `Allocate` of the batch follows
    /// (docs/rules.md#provisioned-capacity).
    Provision(NodeSet),
    /// Nodes are deleted: idle too long, of a set that failed or whose
    /// batch left the queue, or lost (their lease expired).
    Suspend(Suspension),
}

impl Decision {
    pub fn key(&self) -> BatchKey {
        match self {
            Decision::Allocate(a) => a.key,
            Decision::Expire { key, .. } | Decision::Reject { key, .. } => *key,
            Decision::Preempt(p) => p.preemptor,
            Decision::Provision(set) => set.key,
            Decision::Suspend(s) => match &s.cause {
                SuspendCause::Failed { key, .. } | SuspendCause::Abandoned { key, .. } => *key,
                SuspendCause::Idle | SuspendCause::Lost { .. } => BatchKey(0),
            },
            // Not about one batch; never void.
            Decision::LoseNode { .. } => BatchKey(0),
        }
    }
}

/// The declared (not registered) capacity of a zone pool: what the region
/// could offer if every node were up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolDecl {
    pub region: String,
    pub zone: String,
    pub node: NodeSpec,
    pub max_nodes: u32,
    /// When flexq creates and deletes the pool's nodes; None: the nodes
    /// are the operator's.
    pub provisioner: Option<ProvisionPolicy>,
}

/// When a pool's nodes are created and deleted
/// (docs/rules.md#provisioned-capacity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionPolicy {
    /// How long every slot of a set has to register.
    pub resume_timeout: std::time::Duration,
    /// How long a node holds nothing before it is suspended.
    pub suspend_after: std::time::Duration,
    /// Never suspended below this many nodes.
    pub min_nodes: u32,
    /// At most this many nodes asked for a minute.
    pub resume_rate: u32,
    /// The pool's backoff after a failed set: `base`, doubling on each
    /// failure in a row, up to `max`.
    pub backoff_base: std::time::Duration,
    pub backoff_max: std::time::Duration,
    /// Where the pool's boot time (p90) is above this, a blocked batch
    /// preempts before it waits for new nodes.
    pub preempt_if_boot_over: Option<std::time::Duration>,
}

/// Nodes to be created for one batch in one zone's pool, all or nothing:
/// the slots' ids are the nodes' ids their agents register with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSet {
    pub key: BatchKey,
    pub batch_id: String,
    pub project: String,
    pub region: String,
    pub zone: String,
    pub pool: String,
    pub slots: Vec<NodeId>,
    /// What each new node is to offer: the pool's declared shape.
    pub shape: NodeSpec,
    pub decided_at: DateTime<Utc>,
    /// Every slot registers by then, or the set fails: the pool's
    /// `resume_timeout`, bounded by the batch's deadline.
    pub register_by: DateTime<Utc>,
    /// The cluster's parts on nodes that were there already: set aside for
    /// it while the slots register.
    pub on_present: Vec<Placement>,
}

/// Nodes to delete, of one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suspension {
    pub region: String,
    pub zone: String,
    pub pool: String,
    pub nodes: Vec<NodeId>,
    pub cause: SuspendCause,
    pub message: String,
}

/// Why nodes are suspended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuspendCause {
    /// They held nothing for the pool's `suspend_after`.
    Idle,
    /// Their set failed: a slot's program failed, a node left, or the
    /// resume timeout passed. The pool backs off until `backoff_until`;
    /// the batch stays queued.
    Failed {
        key: BatchKey,
        batch_id: String,
        backoff_until: DateTime<Utc>,
    },
    /// Their batch left the queue (cancelled, expired) before the set was
    /// complete.
    Abandoned { key: BatchKey, batch_id: String },
    /// Its agent stopped heartbeating and the lease of `epoch` expired:
    /// the machine may still be up (costing money, its name taken), so it
    /// is deleted. Written only with the node's loss (void if the node
    /// registered again meanwhile).
    Lost { epoch: u64 },
}

impl SuspendCause {
    /// The label of metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            SuspendCause::Idle => "idle",
            SuspendCause::Failed { .. } => "failed",
            SuspendCause::Abandoned { .. } => "abandoned",
            SuspendCause::Lost { .. } => "lost",
        }
    }
}

/// A queue an admin held: nothing in it is allocated until it is resumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub since: DateTime<Utc>,
    /// The admin who held it.
    pub by: String,
}

/// A node an admin cordoned: it takes no new work. Draining is the same,
/// and the node shows drained once its running parts have ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cordon {
    pub since: DateTime<Utc>,
    pub by: String,
    pub drain: bool,
}

/// The holds of one region: all of it, or some projects' queues.
#[derive(Debug, Clone, Default)]
pub(super) struct RegionHolds {
    pub all: Option<Hold>,
    pub projects: HashMap<String, Hold>,
}

/// What a cluster needs, as a small key (see [`shape_key`]).
pub(super) type ShapeKey = (PartNeed, PartNeed, u32);

/// The GPU type of a cluster for metric labels: the executors', else the
/// driver's, else "cpu".
pub fn accelerator_label(c: &ClusterRequest) -> &'static str {
    c.accelerator().map_or("cpu", |a| a.name())
}

/// What a cluster needs, as a small key: two clusters with equal keys fit
/// or fail alike.
pub(super) fn shape_key(c: &ClusterRequest) -> ShapeKey {
    (
        PartNeed::of(PartRole::Driver, &c.driver),
        PartNeed::of(PartRole::Executor, &c.executor),
        c.executor_count,
    )
}

/// "1 driver + 8 executors of l4 (4 cores, 1 GPU, 375 GB local SSD)".
pub fn shape_text(c: &ClusterRequest) -> String {
    let exec = match c.executor.accelerator {
        Some(a) => format!(
            "{} ({} cores, {} GPU{}, {} GB local SSD)",
            a,
            c.executor.cores,
            c.executor.gpus,
            if c.executor.gpus == 1 { "" } else { "s" },
            c.executor.local_ssd_gb
        ),
        None => format!("CPU ({} cores)", c.executor.cores),
    };
    let driver = match c.driver.accelerator {
        Some(a) => format!("{a} driver"),
        None => "CPU driver".to_string(),
    };
    format!("1 {driver} + {} executors of {exec}", c.executor_count)
}

/// A region's preemption policy (`[regions.NAME.preemption]`); a region
/// without one never preempts.
#[derive(Debug, Clone, PartialEq)]
pub struct PreemptionPolicy {
    /// A batch of strictly higher `flexq-priority` may preempt.
    pub by_priority: bool,
    /// A project under its fair share may reclaim from one over it.
    pub by_fair_share: bool,
    /// Fair share: the preemptor's usage ÷ weight times this must be below
    /// the victim's (and stay at most the victim's after the preemption).
    pub fair_share_margin: f64,
    /// A cluster that has run less than this is never a victim.
    pub min_runtime: std::time::Duration,
    /// A batch preempted this many times is never a victim again.
    pub max_preemptions: u32,
    /// How long a victim has to stop cleanly before it is killed.
    pub grace: std::time::Duration,
    /// Whether a batch's `spark.flexq.preemptible=false` is honoured.
    pub allow_opt_out: bool,
}

impl Default for PreemptionPolicy {
    fn default() -> PreemptionPolicy {
        PreemptionPolicy {
            by_priority: true,
            by_fair_share: false,
            fair_share_margin: 2.0,
            min_runtime: std::time::Duration::from_secs(15 * 60),
            max_preemptions: 2,
            grace: std::time::Duration::from_secs(60),
            allow_opt_out: true,
        }
    }
}

/// Why a victim gives way.
#[derive(Debug, Clone, PartialEq)]
pub enum Cause {
    Priority {
        preemptor: i32,
        victim: i32,
    },
    /// Usage ÷ weight of the two projects in the region.
    FairShare {
        preemptor: String,
        preemptor_share: f64,
        victim: String,
        victim_share: f64,
    },
    /// The victim runs on a loan of the preemptor's own capacity
    /// (docs/rules.md#loans-and-reclaim): whose capacity, and how long
    /// the loan ran.
    Reclaim {
        lender: String,
        on_loan: std::time::Duration,
    },
}

impl Cause {
    /// The metric label: `priority` or `fair-share`.
    pub fn label(&self) -> &'static str {
        match self {
            Cause::Priority { .. } => "priority",
            Cause::FairShare { .. } => "fair-share",
            Cause::Reclaim { .. } => "reclaim",
        }
    }

    /// Whether the victim is reclaimed (a loan taken back), not preempted.
    pub fn is_reclaim(&self) -> bool {
        matches!(self, Cause::Reclaim { .. })
    }
}

impl fmt::Display for Cause {
    /// "priority 10 > 0", "fair share: team-a 0.40 < team-b 1.90".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Priority { preemptor, victim } => write!(f, "priority {preemptor} > {victim}"),
            Cause::FairShare {
                preemptor,
                preemptor_share,
                victim,
                victim_share,
            } => write!(
                f,
                "fair share: {preemptor} {preemptor_share:.2} < {victim} {victim_share:.2}"
            ),
            Cause::Reclaim { lender, on_loan } => write!(
                f,
                "after {} on loan ({lender})",
                humantime::format_duration(std::time::Duration::from_secs(on_loan.as_secs()))
            ),
        }
    }
}

/// A running cluster that gives way.
#[derive(Debug, Clone, PartialEq)]
pub struct Victim {
    pub key: BatchKey,
    pub batch_id: String,
    pub project: String,
    pub gpus: u64,
    /// GPU-seconds its cluster had run: the work lost.
    pub gpu_seconds: f64,
    pub cause: Cause,
    /// Every part is on a virtual node: no process to wait for, it is gone
    /// at once.
    pub at_once: bool,
}

/// A preemption decided: the victims stop, and once every one is gone
/// their GPUs go to the preemptor.
#[derive(Debug, Clone, PartialEq)]
pub struct Preemption {
    pub preemptor: BatchKey,
    pub preemptor_id: String,
    pub project: String,
    pub region: String,
    pub zone: String,
    pub victims: Vec<Victim>,
    /// How long each victim has to stop before it is killed.
    pub grace: std::time::Duration,
}

impl Preemption {
    /// GPUs of every victim.
    pub fn gpus(&self) -> u64 {
        self.victims.iter().map(|v| v.gpus).sum()
    }
}

/// What a preemptor waits for: its plan in one zone, the victims still
/// holding their clusters, and what is set aside for it meanwhile (its
/// project's quota, the capacity its plan found free at the decision, and
/// each victim's cluster once it is gone).
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    pub(crate) region: String,
    pub(crate) project: String,
    /// The preemptor's quota, set aside in the ledger.
    pub(crate) quota: Vec<QuotaAmount>,
    pub(crate) plan: Vec<Placement>,
    pub(crate) waiting: BTreeSet<BatchKey>,
    pub(crate) banked: Vec<Placement>,
}

/// How a region lets elastic clusters grow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ElasticPolicy {
    /// The most of the region's GPUs extras may hold at once, 0 to 1.
    pub max_share: f64,
}

/// An elastic cluster's growth beyond its core gang.
#[derive(Debug, Clone, PartialEq)]
pub struct Growth {
    /// How many of the allocation's placements are its core gang; the
    /// rest are its extras, in grant order.
    pub core: usize,
    /// The most extras it may hold (Spark's maxExecutors less the core).
    pub max: u32,
    /// How many extras Spark wants now.
    pub wanted: u32,
    /// One extra: an executor of the placed cluster's shape.
    pub(crate) need: PartNeed,
    /// What one extra draws from quota.
    pub quota: Vec<QuotaAmount>,
    /// When each extra was granted, in grant order.
    pub granted: Vec<DateTime<Utc>>,
}

impl Growth {
    /// The growth of a cluster allocated as `cluster` with `core` parts:
    /// None when Spark's dynamic allocation may not add executors to it.
    pub fn of(cluster: &ClusterRequest, core: usize) -> Option<Growth> {
        (cluster.max_extras > 0).then(|| Growth {
            core,
            max: cluster.max_extras,
            wanted: 0,
            need: PartNeed::of(PartRole::Executor, &cluster.executor),
            quota: cluster.extra_quota(),
            granted: Vec::new(),
        })
    }
}

/// What a running elastic cluster's page shows
/// (docs/rules.md#elastic-batches).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElasticView {
    /// Executors of its core gang.
    pub core: u32,
    /// Extras it holds.
    pub extras: u32,
    /// Extras Spark wants.
    pub wanted: u32,
    /// The most extras it may hold.
    pub max: u32,
    /// Where it wants more than it holds: the first rule that stops it
    /// (QUEUED_BATCHES, REGION_SHARE, QUOTA, CAPACITY, STOPPING,
    /// EXTRAS_OFF).
    pub blocked_by: Option<&'static str>,
}

/// A change to a running cluster's extras, for the runner to commit.
#[derive(Debug, Clone, PartialEq)]
pub enum ExtraChange {
    Granted {
        key: BatchKey,
        batch_id: String,
        placement: Placement,
    },
    /// Taken back at once for a queued batch blocked by capacity of its
    /// zone (`for_batch`): it goes back before any cluster is preempted.
    Reclaimed {
        key: BatchKey,
        batch_id: String,
        placement: Placement,
        since: DateTime<Utc>,
        for_batch: String,
    },
    /// Spark wants fewer (the newest extra goes back), or its worker had
    /// no executor for a while (that one goes back).
    Released {
        key: BatchKey,
        batch_id: String,
        placement: Placement,
        /// When it was granted.
        since: DateTime<Utc>,
    },
    /// Its node was lost: the extra goes, the batch goes on (Spark reruns
    /// the extra's tasks on the rest).
    Lost {
        key: BatchKey,
        batch_id: String,
        placement: Placement,
        since: DateTime<Utc>,
    },
}

impl ExtraChange {
    pub fn key(&self) -> BatchKey {
        match self {
            ExtraChange::Granted { key, .. }
            | ExtraChange::Reclaimed { key, .. }
            | ExtraChange::Released { key, .. }
            | ExtraChange::Lost { key, .. } => *key,
        }
    }

    pub fn batch_id(&self) -> &str {
        match self {
            ExtraChange::Granted { batch_id, .. }
            | ExtraChange::Reclaimed { batch_id, .. }
            | ExtraChange::Released { batch_id, .. }
            | ExtraChange::Lost { batch_id, .. } => batch_id,
        }
    }

    pub fn placement(&self) -> &Placement {
        match self {
            ExtraChange::Granted { placement, .. }
            | ExtraChange::Reclaimed { placement, .. }
            | ExtraChange::Released { placement, .. }
            | ExtraChange::Lost { placement, .. } => placement,
        }
    }

    /// What the metrics call it: granted, released, reclaimed or lost.
    pub fn label(&self) -> &'static str {
        match self {
            ExtraChange::Granted { .. } => "granted",
            ExtraChange::Reclaimed { .. } => "reclaimed",
            ExtraChange::Released { .. } => "released",
            ExtraChange::Lost { .. } => "lost",
        }
    }

    /// When the extra it gives back was granted (None for a grant).
    pub fn since(&self) -> Option<DateTime<Utc>> {
        match self {
            ExtraChange::Granted { .. } => None,
            ExtraChange::Reclaimed { since, .. }
            | ExtraChange::Released { since, .. }
            | ExtraChange::Lost { since, .. } => Some(*since),
        }
    }
}

impl Allocation {
    /// Its extras (none when it is not elastic).
    pub fn extras(&self) -> &[Placement] {
        let core = self
            .elastic
            .as_ref()
            .map_or(self.placements.len(), |g| g.core);
        self.placements.get(core..).unwrap_or_default()
    }

    /// Its core gang's parts (all of them when it is not elastic).
    pub fn core_parts(&self) -> &[Placement] {
        &self.placements[..self.placements.len() - self.extras().len()]
    }
}
