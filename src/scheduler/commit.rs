//! What the store made of a pass's decisions, settled in the core: each
//! decision was written, or found void (its batch or node changed since
//! the pass decided). The core decides what each outcome means for its
//! own state — a preemption's victims with no process gone at once, a void
//! allocation given back, a void preemption withdrawn, a void node loss
//! that leaves the core unlike the store — and says what the engine must
//! still do ([`Committed`]).

use chrono::{DateTime, Utc};

use super::core::Scheduler;
use super::model::{Allocation, BatchKey, Decision, SuspendCause};

/// What became of one decision the store did not apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Void {
    /// A preemption not written: nothing stops, and the preemptor waits in
    /// the queue as before.
    PreemptionWithdrawn,
    /// A node's loss not written: it registered again meanwhile (on
    /// another replica), and the clusters the pass dropped still hold it.
    NodeBack,
    /// The batch left the queue meanwhile (cancelled): what the decision
    /// took is given back.
    BatchGone,
}

/// What the engine must still do after a commit, as the core settled it.
#[derive(Debug, Default)]
pub struct Committed {
    /// Batches the written decisions sent back to the queue (a lost node's,
    /// a preemption's victims with no process): the engine reads them back
    /// from the store ([`crate::store`] decided their retries).
    pub requeued: Vec<BatchKey>,
    /// Clusters given back at once: preemption victims with no process to
    /// wait for, banked for their preemptor.
    pub released: Vec<Allocation>,
    /// The decisions that were void (by index), and what the core made of
    /// each.
    pub void: Vec<(usize, Void)>,
    /// The core no longer matches the store: rebuild it before the next
    /// pass.
    pub rebuild: bool,
}

impl Scheduler {
    /// Settles the outcome of committing `decisions` (`applied[i]`: the
    /// store wrote decision i) at `now`.
    pub fn settle_commit(
        &mut self,
        decisions: &[Decision],
        applied: &[bool],
        now: DateTime<Utc>,
    ) -> Committed {
        let mut out = Committed::default();
        for (i, (d, ok)) in decisions.iter().zip(applied).enumerate() {
            if *ok {
                match d {
                    Decision::LoseNode { failed, .. } => out.requeued.extend(failed),
                    Decision::Preempt(p) => {
                        for v in p.victims.iter().filter(|v| v.at_once) {
                            out.requeued.push(v.key);
                            // Gone at once: its cluster is banked for the
                            // preemptor.
                            out.released.extend(self.forget(v.key, now));
                        }
                    }
                    _ => {}
                }
                continue;
            }
            let void = match d {
                Decision::Preempt(p) => {
                    self.withdraw_preemption(p.preemptor);
                    Void::PreemptionWithdrawn
                }
                Decision::LoseNode { .. } => {
                    out.rebuild = true;
                    Void::NodeBack
                }
                // The node registered again: its machine stays.
                Decision::Suspend(s) if matches!(s.cause, SuspendCause::Lost { .. }) => {
                    for node in &s.nodes {
                        self.provisions.suspending.remove(node);
                    }
                    self.refresh_unschedulable();
                    out.rebuild = true;
                    Void::NodeBack
                }
                // Nothing was asked of the provisioner: nothing to suspend.
                Decision::Provision(set) => {
                    self.withdraw_set(set.key);
                    self.forget(set.key, now);
                    Void::BatchGone
                }
                // At `now`, its allocation time: it never ran, so it adds
                // no usage.
                _ => {
                    self.forget(d.key(), now);
                    Void::BatchGone
                }
            };
            out.void.push((i, void));
        }
        out
    }
}
