//! The batch lifecycle outside allocation, as pure decisions: what a
//! cancel, an agent's report, a lost node, an agent that came back without
//! its work and a cluster whose nodes left the configuration do to a batch.
//!
//! Each function takes what the store read (inside the transaction that
//! will commit the answer) and returns the [`Step`]s to commit, or why the
//! request is refused. The store executes the steps in that one
//! transaction; the engine logs and counts the outcome. The rules are the
//! state machine of docs/rules.md#states.

use super::capacity::NodeId;
use super::model::{BatchKey, Decision};
use crate::api::{EndReason, RequeueReason, State};
use crate::spec::PartRole;

/// One thing to write about a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The batch moves to a state, with this message in its history.
    To(State, String),
    /// Every part of its cluster is given back.
    Release,
    /// The batch's Spark master listens at this URL.
    MasterUrl(String),
    /// The driver process started on `node` (kept if it was already
    /// recorded: a repeated report keeps the first start time).
    DriverStarted { node: String, rapids: String },
    /// The run ended; the driver's exit status when it is known.
    RunEnded { exit_code: Option<i32> },
    /// Why the batch ended without succeeding (with the `To` that ends
    /// it): stored with it, its API code derived from it.
    Ended(EndReason),
    /// The batch goes back to the queue after an infrastructure failure
    /// or a preemption (with a `To(Pending)` before it): its next attempt,
    /// queued as it was at create, with a fresh allocation deadline and no
    /// run yet; why is stored with it.
    Requeue(RequeueReason),
    /// It was preempted (with a `Requeue`): one more preemption counted.
    Preempted,
    /// Its loan was reclaimed (with a `Requeue`): the parts given back
    /// held work lost to reclaim; no preemption counted.
    Reclaimed,
    /// Why it will end once its processes are gone (a policy's cancel):
    /// kept over the reason its end would give.
    Because(EndReason),
    /// The GPU idle policy warned about it (once a run).
    IdleWarned,
    /// An entry in its history, in the state it is in: something its
    /// owner should know that changes no state (counted as no
    /// transition).
    Note(String),
}

/// A batch's attempts: which one runs (1 for the first) and how many
/// requeues after infrastructure failures it may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attempts {
    pub attempt: u32,
    pub retries: u32,
}

impl Attempts {
    fn can_retry(self) -> bool {
        self.attempt <= self.retries
    }
}

/// A failure of the infrastructure, not of the batch's code: the batch
/// goes back to the queue while it has retries, else it fails. Never once
/// it ended or while it is being cancelled.
fn infrastructure_failure(state: State, message: &str, attempts: Attempts) -> Vec<Step> {
    if state.is_terminal() {
        return vec![Step::Release];
    }
    if state != State::Cancelling && attempts.can_retry() {
        return vec![
            Step::Release,
            Step::To(
                State::Pending,
                format!(
                    "Requeued after an infrastructure failure (attempt {} of {} next): {message}",
                    attempts.attempt + 1,
                    attempts.retries + 1
                ),
            ),
            Step::Requeue(RequeueReason::Infrastructure),
        ];
    }
    let (to, reason) = if state == State::Cancelling {
        (State::Cancelled, EndReason::Cancelled)
    } else {
        (State::Failed, EndReason::Infrastructure)
    };
    vec![
        Step::Release,
        Step::To(to, message.to_string()),
        Step::Ended(reason),
    ]
}

/// A preempted (or reclaimed) batch's processes are gone (or it had
/// none): its whole cluster is given back and it goes back to the queue at
/// its place, a preemption counted (docs/rules.md#preemption; a loan taken
/// back is not one, docs/rules.md#loans-and-reclaim). One being cancelled
/// ends CANCELLED instead; one that ended stays as it is.
pub(crate) fn preempted(state: State, stopped: StoppedFor<'_>) -> Vec<Step> {
    if state.is_terminal() {
        return vec![Step::Release];
    }
    if state == State::Cancelling {
        return vec![
            Step::Release,
            Step::To(
                State::Cancelled,
                "Cancelled: the Spark processes were stopped and the cluster was released.".into(),
            ),
            Step::Ended(EndReason::Cancelled),
        ];
    }
    let StoppedFor { by, reason } = stopped;
    let after = match reason {
        RequeueReason::Reclaimed => format!("its loan was reclaimed by {by}"),
        _ => format!("preemption by {by}"),
    };
    let mut steps = vec![
        Step::Release,
        Step::To(
            State::Pending,
            format!(
                "Requeued after {after}: its processes stopped and its cluster was released; it keeps its place in the queue, with a fresh allocation deadline."
            ),
        ),
        Step::Requeue(reason),
    ];
    match reason {
        RequeueReason::Preempted => steps.push(Step::Preempted),
        RequeueReason::Reclaimed => steps.push(Step::Reclaimed),
        RequeueReason::Infrastructure => {}
    }
    steps
}

/// The batch a running one is stopping for, and why it goes back to the
/// queue once it has stopped (PREEMPTED or RECLAIMED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoppedFor<'a> {
    pub(crate) by: &'a str,
    pub(crate) reason: RequeueReason,
}

/// The GPU idle policy's verdict on a batch (docs/rules.md#gpu-telemetry):
/// a RUNNING batch gets the warning in its history (unless `warned`, as
/// stored now, says it got it this run), or is cancelled with the end
/// reason IDLE_GPUS; any other is left alone.
pub(crate) fn gpu_idle(state: State, warned: bool, verdict: &crate::gpu::IdleVerdict) -> Outcome {
    use crate::gpu::IdleVerdict;
    if state != State::Running {
        return Outcome::default();
    }
    let steps = match verdict {
        // The verdict was judged on the run as an upload left it; two
        // uploads judged at once both saw no warning. The flag read where
        // the warning is written keeps it to one.
        IdleVerdict::Warn(_) if warned => return Outcome::default(),
        IdleVerdict::Warn(message) => {
            vec![Step::Note(message.clone()), Step::IdleWarned]
        }
        IdleVerdict::Cancel(message) => vec![
            Step::To(State::Cancelling, message.clone()),
            Step::Because(EndReason::IdleGpus),
            Step::IdleWarned,
        ],
    };
    Outcome { steps }
}

/// What a decision does to one batch.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Outcome {
    pub steps: Vec<Step>,
}

impl Outcome {
    /// The terminal state the batch ends in, if the decision ends it.
    pub fn ended(&self) -> Option<State> {
        self.states().filter(|s| s.is_terminal()).last()
    }

    /// Why the batch ended without succeeding, if the decision ends it so.
    pub fn end_reason(&self) -> Option<EndReason> {
        self.steps.iter().find_map(|s| match s {
            Step::Ended(reason) => Some(*reason),
            _ => None,
        })
    }

    /// Why the decision sends the batch back to the queue, if it does.
    pub fn requeued(&self) -> Option<RequeueReason> {
        self.steps.iter().find_map(|s| match s {
            Step::Requeue(reason) => Some(*reason),
            _ => None,
        })
    }

    /// Every state the batch passes through, in order.
    pub fn states(&self) -> impl Iterator<Item = State> + '_ {
        self.steps.iter().filter_map(|s| match s {
            Step::To(state, _) => Some(*state),
            _ => None,
        })
    }
}

/// A request the batch's state does not allow; the message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Refused(pub String);

/// Cancel: a PENDING batch goes through CANCELLING to CANCELLED at once
/// (nothing runs yet; a cluster already allocated is given back); a
/// RUNNING one becomes CANCELLING until its agents report the work
/// stopped. Cancelling twice is harmless; a batch that ended cannot be.
pub(crate) fn cancel(state: State, holds_cluster: bool) -> Result<Outcome, Refused> {
    let requested = || Step::To(State::Cancelling, "Cancellation requested.".into());
    let steps = match state {
        State::Pending if holds_cluster => vec![
            Step::Release,
            requested(),
            Step::To(
                State::Cancelled,
                "Cancelled before the work started; its cluster was released.".into(),
            ),
            Step::Ended(EndReason::Cancelled),
        ],
        State::Pending => vec![
            requested(),
            Step::To(
                State::Cancelled,
                "Cancelled before allocation; no capacity was used.".into(),
            ),
            Step::Ended(EndReason::Cancelled),
        ],
        State::Running => vec![Step::To(
            State::Cancelling,
            "Cancellation requested; stopping the work.".into(),
        )],
        State::Cancelling => vec![],
        ended => {
            return Err(Refused(format!(
                "the batch is already {ended}; only PENDING or RUNNING batches can be cancelled"
            )));
        }
    };
    Ok(Outcome { steps })
}

/// What an agent reports about a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    /// The driver's node started the batch's Spark master.
    MasterReady { url: String },
    /// The driver process started: the batch is RUNNING.
    DriverStarted { rapids: String },
    /// The driver ended: SUCCEEDED or FAILED (CANCELLED when the batch was
    /// being cancelled).
    Finished {
        succeeded: bool,
        message: String,
        exit_code: Option<i32>,
    },
    /// A part could not run (a worker died, a start failed): the whole
    /// batch fails, a partial cluster must not go on. `infrastructure`:
    /// the failure was not the batch's code (its agent stopped or
    /// restarted): the batch may be requeued.
    PartFailed {
        message: String,
        infrastructure: bool,
    },
}

impl AgentEvent {
    /// The event's name on the wire and in metrics.
    pub fn name(&self) -> &'static str {
        match self {
            AgentEvent::MasterReady { .. } => "MASTER_READY",
            AgentEvent::DriverStarted { .. } => "DRIVER_STARTED",
            AgentEvent::Finished { .. } => "FINISHED",
            AgentEvent::PartFailed { .. } => "PART_FAILED",
        }
    }
}

/// What the reporting node holds of the batch now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holding {
    /// No part (its cluster was released, or it never had one).
    Nothing,
    /// Executors only.
    Executors,
    /// The driver (and perhaps executors).
    Driver,
}

/// An agent's report. Only a node that holds a part of the batch may
/// report about it, and only the driver's node about the driver. A driver
/// that ends, or any part that fails, ends the whole batch and releases its
/// cluster in the same decision: a partial cluster never goes on.
/// `stopped_for`: the batch it gives way to, while it is being preempted or
/// its loan reclaimed: the end of its run then sends it back to the queue
/// ([`preempted`]) rather than ending it.
pub(crate) fn report(
    state: State,
    node: &str,
    batch_id: &str,
    holding: Holding,
    event: &AgentEvent,
    attempts: Attempts,
    stopped_for: Option<StoppedFor<'_>>,
) -> Result<Outcome, Refused> {
    if holding == Holding::Nothing {
        return Err(Refused(format!(
            "node {node} holds no part of batch {batch_id} (it is {state}; its cluster was released)"
        )));
    }
    let needs_driver = !matches!(event, AgentEvent::PartFailed { .. });
    if needs_driver && holding != Holding::Driver {
        return Err(Refused(format!(
            "node {node} does not run the driver of batch {batch_id}"
        )));
    }
    let run_ends = matches!(
        event,
        AgentEvent::Finished { .. } | AgentEvent::PartFailed { .. }
    );
    if let (Some(stopped), true) = (stopped_for, run_ends) {
        let exit_code = match event {
            AgentEvent::Finished { exit_code, .. } => *exit_code,
            _ => None,
        };
        let mut steps = vec![Step::RunEnded { exit_code }];
        steps.extend(preempted(state, stopped));
        return Ok(Outcome { steps });
    }
    let steps = match event {
        AgentEvent::MasterReady { url } => vec![Step::MasterUrl(url.clone())],
        AgentEvent::DriverStarted { rapids } => {
            let mut steps = vec![Step::DriverStarted {
                node: node.to_string(),
                rapids: rapids.clone(),
            }];
            if state == State::Pending {
                steps.push(Step::To(
                    State::Running,
                    format!("The driver started on node {node}. RAPIDS Accelerator: {rapids}."),
                ));
            }
            steps
        }
        AgentEvent::Finished {
            succeeded,
            message,
            exit_code,
        } => {
            let (to, message) = match (state, succeeded) {
                (State::Cancelling, _) => (
                    State::Cancelled,
                    "Cancelled: the Spark processes were stopped and the cluster was released."
                        .to_string(),
                ),
                (_, true) => (State::Succeeded, message.clone()),
                (_, false) => (State::Failed, message.clone()),
            };
            end(to, message, *exit_code)
        }
        AgentEvent::PartFailed {
            message,
            infrastructure: true,
        } => {
            let mut steps = vec![Step::RunEnded { exit_code: None }];
            steps.extend(infrastructure_failure(state, message, attempts));
            steps
        }
        AgentEvent::PartFailed { message, .. } => {
            let to = if state == State::Cancelling {
                State::Cancelled
            } else {
                State::Failed
            };
            end(to, message.clone(), None)
        }
    };
    Ok(Outcome { steps })
}

/// The run ended in `to`: a cancel is the user's, a failure the work's own.
fn end(to: State, message: String, exit_code: Option<i32>) -> Vec<Step> {
    let mut steps = vec![Step::RunEnded { exit_code }, Step::To(to, message)];
    match to {
        State::Cancelled => steps.push(Step::Ended(EndReason::Cancelled)),
        State::Failed => steps.push(Step::Ended(EndReason::WorkFailed)),
        _ => {}
    }
    steps.push(Step::Release);
    steps
}

/// A lost node (its lease lapsed, or its cluster left the config): each
/// batch that held a part of it gives its whole cluster back and, unless
/// it already ended, goes back to the queue while it has retries, or fails
/// with `message`.
pub(crate) fn node_lost(state: Option<State>, message: &str, attempts: Attempts) -> Outcome {
    let steps = match state {
        Some(s) => infrastructure_failure(s, message, attempts),
        None => vec![Step::Release],
    };
    Outcome { steps }
}

/// A part of a batch that a node holds, as registration sees it.
#[derive(Debug, Clone)]
pub(crate) struct HeldPart<'a> {
    pub uuid: &'a str,
    pub state: State,
    pub role: PartRole,
    /// The batch's Spark master was reported started.
    pub master_started: bool,
}

/// An agent registered again and says which batches it still runs
/// (`running`, by uuid). Work its node had started that it no longer runs
/// was lost with the old agent's processes: each such batch gets one
/// `PartFailed` report, in the order of `parts`.
pub(crate) fn lost_on_restart(
    node: &str,
    parts: &[HeldPart<'_>],
    running: &[String],
) -> Vec<(String, AgentEvent)> {
    let mut lost: Vec<(String, AgentEvent)> = Vec::new();
    for part in parts {
        let started = matches!(part.state, State::Running | State::Cancelling)
            || (part.role == PartRole::Driver && part.master_started);
        let reported = running.iter().any(|u| u == part.uuid);
        if started && !reported && !lost.iter().any(|(u, _)| u == part.uuid) {
            let message = format!(
                "The agent of node {node} restarted and no longer runs this batch's {} (its Spark processes were lost); the batch failed and its cluster was released.",
                part.role.name()
            );
            lost.push((
                part.uuid.to_string(),
                AgentEvent::PartFailed {
                    message,
                    infrastructure: true,
                },
            ));
        }
    }
    lost
}

/// Allocated clusters that no longer fit their nodes when the core is
/// rebuilt (virtual nodes removed, a pool shrunk in the config): they fail
/// and give back what the store holds, like a lost node, rather than stay
/// provisioned forever.
pub(crate) fn orphaned(batches: Vec<(BatchKey, String)>) -> Option<Decision> {
    if batches.is_empty() {
        return None;
    }
    let (failed, failed_ids) = batches.into_iter().unzip();
    Some(Decision::LoseNode {
        node: NodeId("(configuration)".into()),
        epoch: None,
        failed,
        failed_ids,
        message: "The nodes of this batch's cluster are no longer declared in the configuration; the batch failed and its cluster was released.".into(),
        // Never restored in the core: their usage is in the store alone.
        released: Vec::new(),
    })
}

#[cfg(test)]
mod tests;
