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

/// A preempted batch's processes are gone (or it had none): its whole
/// cluster is given back and it goes back to the queue at its place, its
/// preemption counted (docs/rules.md#preemption). One being cancelled ends
/// CANCELLED instead; one that ended stays as it is.
pub(crate) fn preempted(state: State, by: &str) -> Vec<Step> {
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
    vec![
        Step::Release,
        Step::To(
            State::Pending,
            format!(
                "Requeued after preemption by {by}: its processes stopped and its cluster was released; it keeps its place in the queue, with a fresh allocation deadline."
            ),
        ),
        Step::Requeue(RequeueReason::Preempted),
        Step::Preempted,
    ]
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
/// `preempted_by`: the batch it gives way to, while it is being preempted:
/// the end of its run then sends it back to the queue
/// ([`preempted`]) rather than ending it.
pub(crate) fn report(
    state: State,
    node: &str,
    batch_id: &str,
    holding: Holding,
    event: &AgentEvent,
    attempts: Attempts,
    preempted_by: Option<&str>,
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
    if let (Some(by), true) = (preempted_by, run_ends) {
        let exit_code = match event {
            AgentEvent::Finished { exit_code, .. } => *exit_code,
            _ => None,
        };
        let mut steps = vec![Step::RunEnded { exit_code }];
        steps.extend(preempted(state, by));
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
mod tests {
    use super::*;

    /// A report from the node that runs the driver of batch `b`.
    fn on_driver(state: State, event: &AgentEvent, attempts: Attempts) -> Result<Outcome, Refused> {
        report(state, "n1", "b", Holding::Driver, event, attempts, None)
    }

    /// The same, while `b` is being preempted by `urgent`.
    fn on_driver_preempted(state: State, event: &AgentEvent) -> Result<Outcome, Refused> {
        report(
            state,
            "n1",
            "b",
            Holding::Driver,
            event,
            NONE,
            Some("urgent"),
        )
    }

    fn to(outcome: &Outcome) -> Vec<State> {
        outcome.states().collect()
    }

    #[test]
    fn cancel_of_a_queued_batch_ends_it_without_touching_capacity() {
        let o = cancel(State::Pending, false).expect("allowed");
        assert_eq!(to(&o), [State::Cancelling, State::Cancelled]);
        assert!(!o.steps.contains(&Step::Release));
        assert_eq!(o.ended(), Some(State::Cancelled));
    }

    #[test]
    fn cancel_of_an_allocated_batch_releases_its_cluster_in_the_same_decision() {
        let o = cancel(State::Pending, true).expect("allowed");
        assert!(o.steps.contains(&Step::Release));
        assert_eq!(o.ended(), Some(State::Cancelled));
    }

    #[test]
    fn cancel_of_a_running_batch_waits_for_its_agents() {
        let o = cancel(State::Running, true).expect("allowed");
        assert_eq!(to(&o), [State::Cancelling]);
        assert_eq!(o.ended(), None);
        assert!(!o.steps.contains(&Step::Release));
        assert!(
            cancel(State::Cancelling, true)
                .expect("again")
                .steps
                .is_empty()
        );
    }

    /// Every outcome that ends a batch without success names one typed
    /// reason, the one its cause gives; nothing else names one.
    #[test]
    fn every_unsuccessful_end_names_its_reason_and_only_those_do() {
        let retries = [
            NONE,
            Attempts {
                attempt: 1,
                retries: 1,
            },
        ];
        let events = |succeeded: bool, infrastructure: bool| {
            [
                AgentEvent::Finished {
                    succeeded,
                    message: "m".into(),
                    exit_code: None,
                },
                AgentEvent::PartFailed {
                    message: "m".into(),
                    infrastructure,
                },
            ]
        };
        let mut seen = std::collections::HashSet::new();
        for state in [State::Pending, State::Running, State::Cancelling] {
            for attempts in retries {
                // Each outcome with the reason a failure of it must give.
                let mut outcomes = vec![(
                    node_lost(Some(state), "lost", attempts),
                    EndReason::Infrastructure,
                )];
                outcomes.extend(cancel(state, true).map(|o| (o, EndReason::WorkFailed)));
                for succeeded in [false, true] {
                    for event in events(succeeded, !succeeded) {
                        let cause = match event {
                            AgentEvent::PartFailed {
                                infrastructure: true,
                                ..
                            } => EndReason::Infrastructure,
                            _ => EndReason::WorkFailed,
                        };
                        outcomes.extend(
                            report(state, "n", "b", Holding::Driver, &event, attempts, None)
                                .map(|o| (o, cause)),
                        );
                    }
                }
                for (o, cause) in outcomes {
                    let reasons: Vec<_> = o
                        .steps
                        .iter()
                        .filter(|s| matches!(s, Step::Ended(_)))
                        .collect();
                    let expected = match o.ended() {
                        Some(State::Cancelled) => Some(EndReason::Cancelled),
                        Some(State::Failed) => Some(cause),
                        _ => None,
                    };
                    assert!(reasons.len() <= 1, "{o:?}");
                    assert_eq!(o.end_reason(), expected, "{state:?}: {o:?}");
                    if let Some(r) = expected {
                        seen.insert(r);
                    }
                }
            }
        }
        // A lost node fails its batch for the infrastructure, a failed
        // driver for the work itself, a cancel for the user.
        let lost = node_lost(Some(State::Running), "lost", NONE);
        assert_eq!(lost.end_reason(), Some(EndReason::Infrastructure));
        let failed = report(
            State::Running,
            "n",
            "b",
            Holding::Driver,
            &events(false, false)[0],
            NONE,
            None,
        )
        .expect("ok");
        assert_eq!(failed.end_reason(), Some(EndReason::WorkFailed));
        let requeued = node_lost(Some(State::Running), "lost", retries[1]);
        assert_eq!(
            requeued.end_reason(),
            None,
            "a requeued batch has not ended"
        );
        assert_eq!(
            seen,
            [
                EndReason::Cancelled,
                EndReason::Infrastructure,
                EndReason::WorkFailed
            ]
            .into()
        );
    }

    #[test]
    fn ended_batches_cannot_be_cancelled() {
        for s in [State::Succeeded, State::Failed, State::Cancelled] {
            let e = cancel(s, false).expect_err("refused");
            assert!(e.0.contains(&s.to_string()), "{e}");
        }
    }

    #[test]
    fn only_the_driver_node_reports_driver_events() {
        let started = AgentEvent::DriverStarted { rapids: "x".into() };
        let e = report(
            State::Pending,
            "n1",
            "b",
            Holding::Executors,
            &started,
            NONE,
            None,
        )
        .expect_err("no");
        assert!(e.0.contains("does not run the driver"), "{e}");
        let e = report(
            State::Pending,
            "n1",
            "b",
            Holding::Nothing,
            &started,
            NONE,
            None,
        )
        .expect_err("no");
        assert!(e.0.contains("holds no part"), "{e}");
        let failed = AgentEvent::PartFailed {
            message: "worker died".into(),
            infrastructure: false,
        };
        let o = report(
            State::Running,
            "n1",
            "b",
            Holding::Executors,
            &failed,
            RETRY,
            None,
        )
        .expect("any part");
        assert_eq!(o.ended(), Some(State::Failed));
        assert!(o.steps.contains(&Step::Release));
    }

    #[test]
    fn a_driver_start_makes_a_pending_batch_running_once() {
        let started = AgentEvent::DriverStarted {
            rapids: "enabled".into(),
        };
        let o = on_driver(State::Pending, &started, NONE).expect("ok");
        assert_eq!(to(&o), [State::Running]);
        let again = on_driver(State::Running, &started, NONE).expect("ok");
        assert!(to(&again).is_empty());
    }

    #[test]
    fn the_end_of_a_cancelled_batch_is_cancelled_whatever_the_driver_said() {
        let finished = AgentEvent::Finished {
            succeeded: true,
            message: "done".into(),
            exit_code: Some(0),
        };
        let o = on_driver(State::Cancelling, &finished, NONE).expect("ok");
        assert_eq!(o.ended(), Some(State::Cancelled));
        let o = on_driver(State::Running, &finished, NONE).expect("ok");
        assert_eq!(o.ended(), Some(State::Succeeded));
        assert!(o.steps.contains(&Step::RunEnded { exit_code: Some(0) }));
    }

    /// No retries: the first failure is the last.
    const NONE: Attempts = Attempts {
        attempt: 1,
        retries: 0,
    };
    /// One retry left.
    const RETRY: Attempts = Attempts {
        attempt: 1,
        retries: 1,
    };

    #[test]
    fn a_lost_node_fails_only_batches_that_have_not_ended() {
        assert_eq!(
            node_lost(Some(State::Running), "lost", NONE).ended(),
            Some(State::Failed)
        );
        let ended = node_lost(Some(State::Succeeded), "lost", RETRY);
        assert_eq!(ended.steps, [Step::Release]);
    }

    #[test]
    fn an_infrastructure_failure_requeues_while_retries_last() {
        let o = node_lost(Some(State::Running), "lost", RETRY);
        assert_eq!(to(&o), [State::Pending]);
        assert_eq!(o.ended(), None);
        assert_eq!(o.steps.first(), Some(&Step::Release));
        assert_eq!(
            o.steps.last(),
            Some(&Step::Requeue(RequeueReason::Infrastructure))
        );
        let Step::To(_, message) = &o.steps[1] else {
            panic!("{o:?}")
        };
        assert!(
            message.starts_with(
                "Requeued after an infrastructure failure (attempt 2 of 2 next): lost"
            ),
            "{message}"
        );
        // The last retry used: it fails.
        let spent = Attempts {
            attempt: 2,
            retries: 1,
        };
        assert_eq!(
            node_lost(Some(State::Running), "lost", spent).ended(),
            Some(State::Failed)
        );
        // Being cancelled: never requeued.
        assert_eq!(
            node_lost(Some(State::Cancelling), "lost", RETRY).ended(),
            Some(State::Cancelled)
        );
        // An agent that restarted without the work: requeued; a part that
        // failed of itself: not.
        let restarted = AgentEvent::PartFailed {
            message: "agent restarted".into(),
            infrastructure: true,
        };
        let o = on_driver(State::Running, &restarted, RETRY).expect("ok");
        assert_eq!(to(&o), [State::Pending]);
        assert!(
            o.steps
                .contains(&Step::Requeue(RequeueReason::Infrastructure))
        );
        let own = AgentEvent::PartFailed {
            message: "executor exited".into(),
            infrastructure: false,
        };
        let o = on_driver(State::Running, &own, RETRY).expect("ok");
        assert_eq!(o.ended(), Some(State::Failed));
        // The user's code failing is never requeued.
        let failed = AgentEvent::Finished {
            succeeded: false,
            message: "exit 1".into(),
            exit_code: Some(1),
        };
        let o = on_driver(State::Running, &failed, RETRY).expect("ok");
        assert_eq!(o.ended(), Some(State::Failed));
    }

    #[test]
    fn a_restarted_agent_loses_started_work_it_no_longer_runs_once_per_batch() {
        let part = |uuid, state, role, master_started| HeldPart {
            uuid,
            state,
            role,
            master_started,
        };
        let parts = [
            part("u1", State::Running, PartRole::Driver, true),
            part("u1", State::Running, PartRole::Executor, true),
            part("u2", State::Pending, PartRole::Executor, false),
            part("u3", State::Pending, PartRole::Driver, true),
            part("u4", State::Running, PartRole::Executor, false),
        ];
        let lost = lost_on_restart("n1", &parts, &["u4".to_string()]);
        let uuids: Vec<_> = lost.iter().map(|(u, _)| u.as_str()).collect();
        assert_eq!(uuids, ["u1", "u3"]);
    }

    #[test]
    fn orphaned_clusters_become_one_lost_node_decision() {
        assert!(orphaned(vec![]).is_none());
        let d = orphaned(vec![(BatchKey(7), "b".into())]).expect("decision");
        assert!(matches!(d, Decision::LoseNode { ref failed, .. } if failed == &[BatchKey(7)]));
    }

    #[test]
    fn a_preempted_batch_whose_run_ends_goes_back_to_the_queue() {
        let stopped = AgentEvent::Finished {
            succeeded: false,
            message: "driver exited with status 143".into(),
            exit_code: Some(143),
        };
        let o = on_driver_preempted(State::Running, &stopped).expect("ok");
        assert_eq!(o.ended(), None, "not ended: {o:?}");
        assert_eq!(o.states().collect::<Vec<_>>(), vec![State::Pending]);
        assert_eq!(o.requeued(), Some(RequeueReason::Preempted));
        assert!(o.steps.contains(&Step::Preempted));
        assert!(o.steps.contains(&Step::Release));
        // Not preempted: the same report fails it.
        let o = on_driver(State::Running, &stopped, NONE).expect("ok");
        assert_eq!(o.ended(), Some(State::Failed));
        // Cancelled meanwhile: it ends CANCELLED, not requeued.
        let o = on_driver_preempted(State::Cancelling, &stopped).expect("ok");
        assert_eq!(o.ended(), Some(State::Cancelled));
        assert_eq!(o.requeued(), None);
        // Reports that do not end the run change nothing of it.
        let started = AgentEvent::DriverStarted {
            rapids: "on".into(),
        };
        let o = on_driver_preempted(State::Running, &started).expect("ok");
        assert_eq!(o.requeued(), None);
    }

    #[test]
    fn an_idle_warning_is_a_note_not_a_transition_and_a_cancel_is_one() {
        use crate::gpu::IdleVerdict;
        let warned = gpu_idle(State::Running, false, &IdleVerdict::Warn("idle".into()));
        assert_eq!(warned.states().count(), 0, "{warned:?}");
        assert!(warned.steps.contains(&Step::Note("idle".into())));
        let cancelled = gpu_idle(State::Running, false, &IdleVerdict::Cancel("idle".into()));
        assert_eq!(cancelled.states().collect::<Vec<_>>(), [State::Cancelling]);
        // Only a RUNNING batch is judged.
        assert!(
            gpu_idle(State::Pending, false, &IdleVerdict::Warn("idle".into()))
                .steps
                .is_empty()
        );
    }

    #[test]
    fn a_second_idle_warning_judged_before_the_first_was_stored_writes_nothing() {
        use crate::gpu::IdleVerdict;
        let again = gpu_idle(State::Running, true, &IdleVerdict::Warn("idle".into()));
        assert_eq!(again, Outcome::default());
        // A cancel after a warning still cancels: the warning was its notice.
        let cancelled = gpu_idle(State::Running, true, &IdleVerdict::Cancel("idle".into()));
        assert_eq!(cancelled.states().collect::<Vec<_>>(), [State::Cancelling]);
        assert!(
            cancelled
                .steps
                .contains(&Step::Because(EndReason::IdleGpus))
        );
    }
}
