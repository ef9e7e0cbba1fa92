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
        Some(StoppedFor {
            by: "urgent",
            reason: RequeueReason::Preempted,
        }),
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
        message.starts_with("Requeued after an infrastructure failure (attempt 2 of 2 next): lost"),
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
