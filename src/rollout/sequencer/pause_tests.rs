//! A gate pause resumed by a person, and what an alerts gate is told to ignore (issue #51
//! items 3 and 4).

use super::*;
use crate::rollout::sequencer::model::NodeSilence;
use crate::version::TalosVersion;

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn job() -> Job {
    let v = |s: &str| TalosVersion::parse(s).unwrap();
    let target = |n: &str| MachineTarget {
        node: n.into(),
        id: format!("id-{n}"),
        address: format!("10.0.0.{}", &n[1..]),
        from: v("v1.13.2"),
        image: None,
    };
    let rollout = TalosRollout {
        pool: "workers".into(),
        role: MachineRole::Worker,
        hop: 1,
        hops: 1,
        to: v("v1.13.9"),
        image: "factory.talos.dev/installer/x:v1.13.9".into(),
        max_unavailable: 1,
        drain_timeout: Duration::from_secs(600),
        health_timeout: Duration::from_secs(900),
        upgrade_attempts: 1,
        drain: DrainPolicy::default(),
        waves: vec![vec![target("w1"), target("w2"), target("w3")]],
        health: None,
        silence: None,
        hooks: None,
        stage: None,
        taint_next_wave: false,
    };
    Job::one_talos_step(
        PlanId::from_digest([7; 32]),
        t("2026-12-05T11:00:00Z"),
        StepState::Running,
        rollout,
    )
}

fn node_mut(j: &mut Job, i: usize) -> &mut NodeProgress {
    match &mut j.steps[0].kind {
        StepKind::Talos(s) => Arc::make_mut(&mut s.nodes[i]),
        _ => unreachable!("one Talos step"),
    }
}

#[test]
fn a_paused_job_resumes_with_fresh_counts_and_its_clock_runs_again() {
    let mut j = job();
    let paused_at = t("2026-12-05T12:00:00Z");
    j.clock.started_at = Some(t("2026-12-05T11:30:00Z"));
    j.clock.paused_since = Some(paused_at);
    j.gates.paused = Some(GatePause {
        point: GatePoint::BeforeJob,
        gate: "ceph".into(),
        evaluations: 2,
        detail: "the query returned no value".into(),
        at: paused_at,
    });
    let waiting = j.gates.paused.as_ref().unwrap().waiting(&j.id);
    assert!(
        waiting.contains("medea rollout resume") && waiting.contains("`ceph`"),
        "{waiting}"
    );
    let (next, note) = pause::resume(&j, "api", t("2026-12-05T13:00:00Z")).unwrap();
    assert_eq!(next.gates.paused, None);
    assert_eq!(next.gates.current, None, "the gates are checked afresh");
    assert_eq!(next.clock.paused_since, None);
    assert_eq!(next.clock.paused_secs, 3600, "the pause did not count");
    assert!(note.starts_with("resumed by api"), "{note}");
    // nothing to resume: not paused, or over
    assert!(pause::resume(&next, "api", t("2026-12-05T13:00:01Z")).is_none());
    let over = halt(
        &j,
        HaltReason::new(HaltCode::OperatorRequest, "halted by api"),
        t("2026-12-05T13:00:00Z"),
    );
    assert!(pause::resume(&over, "api", t("2026-12-05T13:00:01Z")).is_none());
}

#[test]
fn alerts_gates_ignore_the_nodes_in_their_reboot_and_see_medeas_own_silences() {
    let mut j = job();
    node_mut(&mut j, 0).phase = NodePhase::Done;
    node_mut(&mut j, 0).silence = Some(NodeSilence::Ended {
        id: Some("s-1".into()),
        how: "expired".into(),
    });
    node_mut(&mut j, 1).phase = NodePhase::Rebooting;
    node_mut(&mut j, 1).silence = Some(NodeSilence::Active {
        id: "s-2".into(),
        since: t("2026-12-05T12:00:00Z"),
        ends_at: t("2026-12-05T12:10:00Z"),
        renewals: 0,
        retry_at: None,
    });
    node_mut(&mut j, 2).phase = NodePhase::Cordoned;
    assert_eq!(rebooting_nodes(&j), vec!["w2".to_string()]);
    node_mut(&mut j, 2).phase = NodePhase::Upgraded;
    assert_eq!(
        rebooting_nodes(&j),
        vec!["w2".to_string(), "w3".to_string()]
    );
    assert_eq!(own_silences(&j), vec!["s-1".to_string(), "s-2".to_string()]);
}
