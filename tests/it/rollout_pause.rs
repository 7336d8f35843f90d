//! Issue #51 item 4, in the executor against the in-memory fakes with paused tokio time: a
//! source that cannot be asked (a Prometheus timeout) is counted apart from an answer without
//! data — one no longer halts a job, `consecutiveErrorLimit` (default 4, as Argo Rollouts) in
//! a row do — and a gate with `onInconclusive: pause` pauses the job for a person, who
//! resumes it without a new plan.

use std::time::Duration;

use medea::plan::health::{DEFAULT_CONSECUTIVE_ERROR_LIMIT, OnFailure, OnInconclusive};
use medea::rollout::executor::{EventState, Gate, request_resume};
use medea::rollout::fake::{FakeCluster, FakeGate, FakeProbe};
use medea::rollout::journal::Entry;
use medea::rollout::sequencer::{HaltCode, JobState};
use medea::rollout::{RolloutError, RunOutcome};

use crate::rollout::{FROM, KUBE, TO, World, specs, talos_step};
use crate::rollout_health::{health_world, policy, set_gate};

fn world(gate: FakeGate, on_inconclusive: OnInconclusive, inconclusive_limit: u32) -> World {
    let mut p = policy(&["app"], 0, 10, 1, OnFailure::Halt);
    p.inconclusive_limit = inconclusive_limit;
    p.gates[0].on_inconclusive = on_inconclusive;
    let w = health_world(
        FakeCluster::new(&specs(0, 1, FROM, KUBE)),
        |f| vec![talos_step(f, "workers", &[&["w-1"]], TO, 1)],
        None,
        Some(p),
    );
    set_gate(&w.fake, "app", gate);
    w
}

#[tokio::test(start_paused = true)]
async fn one_prometheus_timeout_no_longer_halts_the_job() {
    let w = world(
        FakeGate {
            error_next: 1,
            ..FakeGate::default()
        },
        OnInconclusive::Halt,
        1,
    );
    let exec = w.executor().with_probe(FakeProbe(w.fake.clone()));
    let out = exec.run(&w.job).await.unwrap();
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    let log = w.state().gate_log;
    assert_eq!(log[..2], ["app error", "app pass"], "{log:?}");
}

#[tokio::test(start_paused = true)]
async fn four_consecutive_errors_halt_and_touch_nothing() {
    let w = world(
        FakeGate {
            error_next: 100,
            ..FakeGate::default()
        },
        // the pause is for answers without data: errors in a row always halt
        OnInconclusive::Pause,
        1,
    );
    let exec = w.executor().with_probe(FakeProbe(w.fake.clone()));
    let out = exec.run(&w.job).await.unwrap();
    let RunOutcome::Halted { reason, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(reason.code(), HaltCode::GateInconclusive, "{reason}");
    let f = reason.gate_failure().unwrap();
    assert!(f.inconclusive);
    assert_eq!(f.failures, DEFAULT_CONSECUTIVE_ERROR_LIMIT);
    assert_eq!(DEFAULT_CONSECUTIVE_ERROR_LIMIT, 4);
    let s = w.state();
    assert_eq!(s.gate_log, vec!["app error"; 4]);
    assert!(s.log.is_empty(), "nothing touched: {:#?}", s.log);
}

#[tokio::test(start_paused = true)]
async fn an_inconclusive_gate_pauses_the_job_and_resume_continues_it_without_a_new_plan() {
    let w = world(
        FakeGate {
            inconclusive_next: 2,
            ..FakeGate::default()
        },
        OnInconclusive::Pause,
        2,
    );
    // not paused yet: a resume is refused, and nothing is written
    let refused = request_resume(w.store.as_ref(), &w.job, "test", crate::rollout::t0());
    assert!(
        matches!(refused, Err(RolloutError::NotPaused { .. })),
        "{refused:?}"
    );
    let exec = w.executor().with_probe(FakeProbe(w.fake.clone()));
    let mut events = exec.subscribe();
    let id = w.job.clone();
    let run = tokio::spawn(async move { exec.run(&id).await.unwrap() });

    // the job pauses at its first gate point, running, nothing touched
    let mut rounds = 0;
    let job = tokio::time::timeout(Duration::from_secs(3600), async {
        loop {
            let j = w.job();
            if j.gates.paused.is_some() {
                break j;
            }
            rounds += 1;
            assert!(
                rounds < 1000,
                "the job never paused: {:?}",
                w.state().gate_log
            );
            assert!(!run.is_finished(), "the job ended instead of pausing");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await
    .expect("the job pauses within an hour of paused time");
    assert!(matches!(job.state, JobState::Running), "{:?}", job.state);
    let p = job.gates.paused.as_ref().unwrap();
    assert_eq!(p.gate, "app");
    assert_eq!(p.evaluations, 2);
    assert!(job.clock.paused_since.is_some() || job.clock.started_at.is_none());
    assert!(
        w.state().log.is_empty(),
        "nothing touched: {:#?}",
        w.state().log
    );
    // it stays paused: more time passes, no more evaluation
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(w.state().gate_log, vec!["app inconclusive"; 2]);
    assert!(!run.is_finished());

    request_resume(w.store.as_ref(), &w.job, "test", crate::rollout::t0()).unwrap();
    let out = tokio::time::timeout(Duration::from_secs(3600), run)
        .await
        .expect("the resumed job ends")
        .unwrap();
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    assert_eq!(
        w.state().gate_log[..3],
        ["app inconclusive", "app inconclusive", "app pass"]
    );
    assert!(
        w.journal()
            .iter()
            .any(|e| matches!(&e.entry, Entry::ResumeRequested { by } if by == "test")),
        "the resume is journaled"
    );
    let mut paused_events = 0;
    while let Ok(e) = events.try_recv() {
        if let EventState::Paused {
            gate: Gate::Inconclusive { gate, .. },
        } = &e.state
        {
            assert_eq!(gate, "app");
            paused_events += 1;
        }
    }
    assert_eq!(paused_events, 1, "one `paused` event (the webhook's)");
}
