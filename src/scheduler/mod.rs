//! The scheduler core: the capacity-aware queue, pure.
//!
//! It holds the region queues, the quota ledger, the capacity map and the
//! agents' leases, and decides: which batch is allocated where, which
//! expires, which node is lost ([`Scheduler::pass`]), and what a cancel or
//! an agent's report does to a batch ([`lifecycle`]). No tokio, sqlx, axum,
//! clock or I/O: time is an argument, and it imports nothing above
//! [`crate::spec`]. The engine ([`crate::engine`]) drives it and the store
//! commits what it decides.

mod alternatives;
mod assess;
mod capacity;
mod claims;
mod commit;
mod core;
mod declared;
mod elastic;
mod estimate;
mod events;
mod fairshare;
mod growth;
mod holds;
mod layout;
mod lease;
pub(crate) mod lifecycle;
mod model;
mod pass;
mod pending;
mod preempt;
mod provision;
mod provisions;
mod queue;
mod quota;
mod reasons;
mod snapshot;
mod tally;
mod views;
mod walk;

pub use crate::spec::PartRole;
pub use capacity::{NodeId, NodeSpec, Placement};
pub use commit::{Committed, Void};
pub use core::Scheduler;
pub use fairshare::{FairSharePolicy, Order};
pub use layout::{Layout, Settled};
pub use lease::NodeLeaseError;
pub use model::{
    Allocation, BatchKey, Cause, Cordon, Decision, ElasticPolicy, ElasticView, ExtraChange, Growth,
    Hold, Loan, NodeSet, OnAlternative, PendingBatch, PoolDecl, Preemption, PreemptionPolicy,
    ProvisionPolicy, SuspendCause, Suspension, Victim, accelerator_label, lender, shape_text,
};
pub use pending::ESTIMATE_DEPTH;
pub use provision::PROVISIONED_STATES;
pub use quota::{QuotaRule, QuotaView, Shortfall};
pub use reasons::{Blocker, NotAdmitted, PendingInfo, Reason, Verdict, messages};
pub use snapshot::Snapshot;
pub use views::CapacityRow;

#[cfg(test)]
mod tests;
