//! Health gates (issue #23) in the executor, against the in-memory fakes with paused tokio
//! time: gates before the job and each wave, soaks after each wave, the failure limit, halts
//! before the next wave, per-wave rollback through `MachineService.Rollback`, the evidence in
//! the journal, and the crash harness over the new journal points.

use std::sync::Arc;
use std::time::Duration;

use medea::plan::Step;
use medea::plan::health::{Gate, GateCheck, HealthPolicy, HealthSources, OnFailure};
use medea::rollout::RunOutcome;
use medea::rollout::executor::EventState;
use medea::rollout::fake::{FakeCluster, FakeGate, FakeProbe, MemStore};
use medea::rollout::journal::Entry;
use medea::rollout::sequencer::{GatePoint, HaltCode, JobState};
use medea::store::Store;
use medea::version::TalosVersion;

use crate::rollout::{
    CLUSTER, FROM, KUBE, TO, World, install, observed, plan, specs, t0, talos_step,
};

fn tv(s: &str) -> TalosVersion {
    TalosVersion::parse(s).unwrap()
}

pub fn policy(gates: &[&str], soak: u64, interval: u64, limit: u32, on: OnFailure) -> HealthPolicy {
    HealthPolicy {
        sources: HealthSources::default(),
        gates: gates
            .iter()
            .map(|g| Gate {
                name: g.to_string(),
                dry_run: false,
                consecutive_error_limit: medea::plan::health::DEFAULT_CONSECUTIVE_ERROR_LIMIT,
                on_inconclusive: Default::default(),
                check: GateCheck::Query {
                    query: format!("{g}_ok == 1"),
                },
            })
            .collect(),
        soak: Duration::from_secs(soak),
        interval: Duration::from_secs(interval),
        failure_limit: limit,
        inconclusive_limit: 1,
        on_failure: on,
    }
}

/// A world whose pool step (and, optionally, cluster) carry health policies.
pub fn health_world(
    fake: FakeCluster,
    steps: impl FnOnce(&FakeCluster) -> Vec<Step>,
    pool: Option<HealthPolicy>,
    cluster: Option<HealthPolicy>,
) -> World {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let obs = observed(&fake);
    let mut steps = steps(&fake);
    for s in &mut steps {
        if let Step::Talos(t) = s {
            t.health = pool.clone();
        }
    }
    let mut p = plan(&obs, steps, 3);
    std::sync::Arc::make_mut(&mut p.clusters[0]).health = cluster;
    let job = install(store.as_ref(), &p, &obs, &[]).unwrap();
    World {
        fake,
        store,
        job,
        dir: tempfile::tempdir().unwrap(),
    }
}

pub fn set_gate(fake: &FakeCluster, name: &str, g: FakeGate) {
    fake.edit(|s| {
        s.gates.insert(name.to_string(), g);
    });
}

fn workers_in_waves(f: &FakeCluster) -> Vec<Step> {
    vec![talos_step(
        f,
        "workers",
        &[&["w-1"], &["w-2"], &["w-3"]],
        TO,
        1,
    )]
}

#[tokio::test(start_paused = true)]
async fn a_gate_that_goes_bad_after_a_wave_halts_before_the_next_wave() {
    let w = health_world(
        FakeCluster::new(&specs(0, 3, FROM, KUBE)),
        workers_in_waves,
        Some(policy(&["ingress"], 60, 30, 2, OnFailure::Halt)),
        None,
    );
    // the workload breaks once w-1 runs the target
    set_gate(
        &w.fake,
        "ingress",
        FakeGate {
            fail_while: Some((vec!["w-1".into()], tv(TO))),
            ..FakeGate::default()
        },
    );
    let exec = w.executor().with_probe(FakeProbe(w.fake.clone()));
    let mut events = exec.subscribe();
    let out = exec.run(&w.job).await.unwrap();
    let RunOutcome::Halted { reason, node, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(reason.code(), HaltCode::GateFailed, "{reason}");
    assert!(node.is_none());
    let f = reason.gate_failure().expect("a gate halt names its gate");
    assert_eq!(f.gate, "ingress");
    assert_eq!(f.point, GatePoint::AfterWave { step: 0, wave: 0 });
    assert_eq!(f.failures, 2, "failureLimit consecutive failures");
    assert_eq!(f.samples.len(), 1, "the last samples: {f:?}");
    assert_eq!(f.samples[0].labels["node"], "w-1");
    assert!(reason.message().contains("ingress"), "{reason}");
    let s = w.state();
    // no further Upgrade call: the next waves were never touched
    assert_eq!(s.nodes["w-1"].counters.upgrade, 1);
    assert_eq!(s.nodes["w-2"].counters.upgrade, 0, "{:#?}", s.log);
    assert_eq!(s.nodes["w-3"].counters.upgrade, 0, "{:#?}", s.log);
    assert!(
        !s.log.iter().any(|l| l.contains("w-2") || l.contains("w-3")),
        "{:#?}",
        s.log
    );
    assert!(!s.nodes["w-1"].cordoned);
    // the evidence: journaled, with the failures kept
    let job = w.job();
    assert!(matches!(job.state, JobState::Halted { .. }));
    let fails = job
        .gates
        .evidence
        .iter()
        .filter(|r| {
            r.evaluation.gate == "ingress"
                && r.evaluation.verdict == medea::rollout::ports::GateVerdict::Fail
        })
        .count();
    assert_eq!(fails, 2, "{:#?}", job.gates.evidence);
    let journaled: Vec<_> = w
        .journal()
        .into_iter()
        .filter_map(|e| match e.entry {
            Entry::Gates { point, evaluations } => Some((point, evaluations)),
            _ => None,
        })
        .collect();
    assert!(
        journaled
            .iter()
            .any(|(p, e)| *p == GatePoint::AfterWave { step: 0, wave: 0 }
                && e[0].verdict == medea::rollout::ports::GateVerdict::Fail
                && e[0].samples.len() == 1),
        "{journaled:#?}"
    );
    // `medea rollout status` shows the evidence and the halt code
    let view = medea::server::rollouts::rollout_pb(&job);
    assert_eq!(view.halt_code, "gate_failed");
    assert!(
        view.gate_point.is_empty(),
        "nothing is being checked after the halt"
    );
    assert!(
        view.gates.iter().any(|g| g.gate == "ingress"
            && g.verdict == "fail"
            && g.samples.len() == 1
            && g.samples[0].labels["node"] == "w-1"),
        "{:?}",
        view.gates
    );
    // and the events carried each evaluation
    let mut gate_events = 0;
    while let Ok(e) = events.try_recv() {
        if matches!(e.state, EventState::GateEvaluated { .. }) {
            gate_events += 1;
        }
    }
    assert!(
        gate_events >= 3,
        "before-wave pass + 2 soak failures: {gate_events}"
    );
}

#[tokio::test(start_paused = true)]
async fn with_on_failure_rollback_the_wave_goes_back_one_node_at_a_time_then_halts() {
    let w = health_world(
        FakeCluster::new(&specs(0, 3, FROM, KUBE)),
        |f| {
            vec![talos_step(
                f,
                "workers",
                &[&["w-1", "w-2"], &["w-3"]],
                TO,
                2,
            )]
        },
        Some(policy(&["ceph"], 120, 30, 1, OnFailure::Rollback)),
        None,
    );
    set_gate(
        &w.fake,
        "ceph",
        FakeGate {
            fail_while: Some((vec!["w-1".into(), "w-2".into()], tv(TO))),
            ..FakeGate::default()
        },
    );
    let exec = w.executor().with_probe(FakeProbe(w.fake.clone()));
    let out = exec.run(&w.job).await.unwrap();
    let RunOutcome::Halted { reason, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(reason.code(), HaltCode::RolledBack, "{reason}");
    let f = reason.gate_failure().unwrap();
    assert_eq!(f.gate, "ceph");
    assert_eq!(f.rolled_back, vec!["w-1".to_string(), "w-2".to_string()]);
    assert!(reason.message().contains("rolled back"), "{reason}");
    let s = w.state();
    for n in ["w-1", "w-2"] {
        let x = &s.nodes[n];
        assert_eq!(
            x.version,
            tv(FROM),
            "{n} back on the old version\n{:#?}",
            s.log
        );
        assert!(!x.cordoned, "{n} uncordoned");
        assert!(!x.down());
        assert_eq!(x.counters.upgrade, 1);
        assert_eq!(x.counters.rollback, 1, "{n}: exactly one Rollback call");
    }
    assert_eq!(
        s.nodes["w-3"].counters.upgrade, 0,
        "the next wave untouched"
    );
    assert_eq!(s.nodes["w-3"].counters.cordon, 0);
    let view = medea::server::rollouts::rollout_pb(&w.job());
    assert_eq!(view.halt_code, "rolled_back");
    let states: Vec<(&str, &str)> = view
        .nodes
        .iter()
        .map(|n| (n.node.as_str(), n.state.as_str()))
        .collect();
    assert_eq!(
        states,
        vec![
            ("w-1", "rolled-back"),
            ("w-2", "rolled-back"),
            ("w-3", "pending")
        ]
    );
    // one node at a time: cordon → drain → rollback → uncordon, w-1 before w-2
    let first_rollback = s.log.iter().position(|l| l == "rollback w-1").unwrap();
    let second = s.log.iter().position(|l| l == "rollback w-2").unwrap();
    let uncordon_1 = s.log.iter().rposition(|l| l == "uncordon w-1").unwrap();
    let cordon_2 = s.log.iter().rposition(|l| l == "cordon w-2").unwrap();
    assert!(
        first_rollback < uncordon_1 && uncordon_1 < cordon_2 && cordon_2 < second,
        "{:#?}",
        s.log
    );
    let drain_1 = s.log.iter().rposition(|l| l == "drain w-1").unwrap();
    assert!(drain_1 < first_rollback, "drained before the rollback");
    // journaled like any step: the intent before the call
    let j = w.journal();
    let intent = j
        .iter()
        .position(|e| matches!(&e.entry, Entry::Intent { key, .. } if key.op == medea::rollout::sequencer::CommandOp::Rollback && key.node.as_deref() == Some("w-1")))
        .expect("rollback requested");
    let result = j
        .iter()
        .position(|e| matches!(&e.entry, Entry::Result { key, .. } if key.op == medea::rollout::sequencer::CommandOp::Rollback && key.node.as_deref() == Some("w-1")))
        .expect("rollback result");
    assert!(intent < result);
}

#[tokio::test(start_paused = true)]
async fn a_failing_gate_keeps_the_job_from_starting() {
    let w = health_world(
        FakeCluster::new(&specs(0, 2, FROM, KUBE)),
        |f| vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)],
        None,
        Some(policy(&["no-critical-alerts"], 0, 10, 3, OnFailure::Halt)),
    );
    set_gate(
        &w.fake,
        "no-critical-alerts",
        FakeGate {
            fail: true,
            ..FakeGate::default()
        },
    );
    let exec = w.executor().with_probe(FakeProbe(w.fake.clone()));
    let out = exec.run(&w.job).await.unwrap();
    let RunOutcome::Halted { reason, step, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(reason.code(), HaltCode::GateFailed);
    assert_eq!(
        reason.gate_failure().unwrap().point,
        GatePoint::BeforeJob,
        "{reason}"
    );
    assert_eq!(*step, None);
    let s = w.state();
    assert!(s.log.is_empty(), "nothing touched: {:#?}", s.log);
    assert_eq!(
        s.gate_log.len(),
        3,
        "failureLimit evaluations: {:?}",
        s.gate_log
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_probe_every_gate_is_inconclusive_and_nothing_is_touched() {
    let w = health_world(
        FakeCluster::new(&specs(0, 1, FROM, KUBE)),
        |f| vec![talos_step(f, "workers", &[&["w-1"]], TO, 1)],
        Some(policy(&["app"], 0, 5, 1, OnFailure::Rollback)),
        None,
    );
    let out = w.executor().run(&w.job).await.unwrap();
    let RunOutcome::Halted { reason, .. } = &out else {
        panic!("{out:?}")
    };
    // we could not tell: its own halt code, and no rollback despite `onFailure: rollback`
    assert_eq!(reason.code(), HaltCode::GateInconclusive);
    assert!(reason.message().contains("no health probe"), "{reason}");
    assert!(reason.gate_failure().unwrap().inconclusive);
    assert!(w.state().log.is_empty());
}

/// Issue #35: an unreachable source is inconclusive, counted against `inconclusiveLimit`
/// (not `failureLimit`), and halts with `gate_inconclusive` after exactly that many.
#[tokio::test(start_paused = true)]
async fn an_unreachable_source_halts_with_gate_inconclusive_after_the_limit() {
    let mut p = policy(&["app"], 0, 10, 1, OnFailure::Rollback);
    p.inconclusive_limit = 3;
    let w = health_world(
        FakeCluster::new(&specs(0, 2, FROM, KUBE)),
        |f| vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)],
        None,
        Some(p),
    );
    set_gate(
        &w.fake,
        "app",
        FakeGate {
            inconclusive_next: 100,
            ..FakeGate::default()
        },
    );
    let exec = w.executor().with_probe(FakeProbe(w.fake.clone()));
    let out = exec.run(&w.job).await.unwrap();
    let RunOutcome::Halted { reason, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(reason.code(), HaltCode::GateInconclusive, "{reason}");
    assert_eq!(reason.code().as_str(), "gate_inconclusive");
    let f = reason.gate_failure().unwrap();
    assert!(f.inconclusive);
    assert_eq!(f.failures, 3, "inconclusiveLimit evaluations");
    assert!(
        reason.message().contains("could not be evaluated"),
        "{reason}"
    );
    let s = w.state();
    assert_eq!(s.gate_log, vec!["app inconclusive"; 3]);
    assert!(s.log.is_empty(), "nothing touched: {:#?}", s.log);
}

/// Issue #35: inconclusive evaluations do not count as failures, a pass clears both counts,
/// and a gate that then fails for real halts with `gate_failed` after `failureLimit`.
#[tokio::test(start_paused = true)]
async fn a_bad_metric_still_fails_as_a_failure_not_as_inconclusive() {
    let mut p = policy(&["app"], 0, 10, 2, OnFailure::Halt);
    p.inconclusive_limit = 2;
    let w = health_world(
        FakeCluster::new(&specs(0, 1, FROM, KUBE)),
        |f| vec![talos_step(f, "workers", &[&["w-1"]], TO, 1)],
        None,
        Some(p),
    );
    set_gate(
        &w.fake,
        "app",
        FakeGate {
            inconclusive_next: 1,
            fail: true,
            ..FakeGate::default()
        },
    );
    let exec = w.executor().with_probe(FakeProbe(w.fake.clone()));
    let out = exec.run(&w.job).await.unwrap();
    let RunOutcome::Halted { reason, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(reason.code(), HaltCode::GateFailed, "{reason}");
    let f = reason.gate_failure().unwrap();
    assert!(!f.inconclusive);
    assert_eq!(f.failures, 2);
    assert_eq!(
        w.state().gate_log,
        vec!["app inconclusive", "app fail", "app fail"]
    );
}

/// Issue #35: a `dryRun` gate that fails every evaluation never blocks: the job succeeds, and
/// its failures are journaled and emitted as gate events marked dry run.
#[tokio::test(start_paused = true)]
async fn a_dry_run_gate_that_fails_never_blocks_and_its_outcome_is_journaled() {
    let mut p = policy(&["app", "shadow"], 0, 10, 1, OnFailure::Halt);
    p.gates[1].dry_run = true;
    let w = health_world(
        FakeCluster::new(&specs(0, 2, FROM, KUBE)),
        |f| vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)],
        Some(p.clone()),
        Some(p),
    );
    set_gate(
        &w.fake,
        "shadow",
        FakeGate {
            fail: true,
            ..FakeGate::default()
        },
    );
    let exec = w.executor().with_probe(FakeProbe(w.fake.clone()));
    let mut events = exec.subscribe();
    let out = exec.run(&w.job).await.unwrap();
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    let s = w.state();
    assert_eq!(s.nodes["w-1"].counters.upgrade, 1);
    assert_eq!(s.nodes["w-2"].counters.upgrade, 1);
    assert!(
        s.gate_log.iter().any(|l| l == "shadow fail"),
        "{:?}",
        s.gate_log
    );
    // journaled as evidence, marked dry run
    let journaled: Vec<_> = w
        .journal()
        .iter()
        .filter_map(|e| match &e.entry {
            Entry::Gates { evaluations, .. } => Some(evaluations.clone()),
            _ => None,
        })
        .flatten()
        .filter(|e| e.gate == "shadow")
        .collect();
    assert!(!journaled.is_empty());
    assert!(
        journaled
            .iter()
            .all(|e| e.dry_run && e.verdict == medea::rollout::ports::GateVerdict::Fail)
    );
    // shown: the gate events say so
    let mut shown = Vec::new();
    while let Ok(e) = events.try_recv() {
        if let EventState::GateEvaluated { evaluation, .. } = &e.state
            && evaluation.gate == "shadow"
        {
            shown.push(e.state.message());
        }
    }
    assert!(!shown.is_empty());
    assert!(
        shown.iter().all(|m| m.contains("fail (dry run)")),
        "{shown:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_soak_needs_every_gate_passing_continuously_and_a_flap_restarts_it() {
    let w = health_world(
        FakeCluster::new(&specs(0, 1, FROM, KUBE)),
        |f| vec![talos_step(f, "workers", &[&["w-1"]], TO, 1)],
        Some(policy(&["app", "db"], 90, 30, 3, OnFailure::Halt)),
        Some(policy(&["alerts"], 0, 30, 1, OnFailure::Halt)),
    );
    let exec = w.executor().with_probe(FakeProbe(w.fake.clone()));
    // before the job: alerts; before wave 1: app, db; then the soak. "db" flaps once in the
    // soak's second evaluation, which restarts its 90s.
    set_gate(&w.fake, "db", FakeGate::default());
    let fake = w.fake.clone();
    let job = w.job.clone();
    let task = tokio::spawn(async move { exec.run(&job).await });
    // wait until the soak has begun (w-1 uncordoned), then make db fail its next evaluation
    // paused time: the deadline is virtual, far past the soak, and a stuck executor reaches it
    tokio::time::timeout(Duration::from_secs(3600), async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if fake.state().log.iter().any(|l| l == "uncordon w-1") {
                break;
            }
        }
    })
    .await
    .expect("the soak begins (w-1 uncordoned) before the deadline");
    set_gate(
        &fake,
        "db",
        FakeGate {
            fail_next: 1,
            ..FakeGate::default()
        },
    );
    // in the soak: status shows where and when it ends
    tokio::time::sleep(Duration::from_millis(100)).await;
    let view = medea::server::rollouts::rollout_pb(&w.job());
    assert_eq!(view.gate_point, "soak after wave 1 of step 1", "{view:?}");
    let out = task.await.unwrap().unwrap();
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    let s = w.state();
    assert_eq!(s.nodes["w-1"].version, tv(TO));
    let db: Vec<&String> = s.gate_log.iter().filter(|l| l.starts_with("db ")).collect();
    // before-wave pass; soak: pass at t, fail at t+30 (streak broken), then 90s of passes
    // (t+60, t+90, t+120, t+150)
    assert_eq!(
        db,
        vec![
            "db pass", "db pass", "db fail", "db pass", "db pass", "db pass", "db pass"
        ],
        "{:?}",
        s.gate_log
    );
    let job = w.job();
    assert!(
        job.gates
            .passed
            .contains(&GatePoint::AfterWave { step: 0, wave: 0 })
            && job.gates.passed.contains(&GatePoint::BeforeJob)
            && job.gates.passed.contains(&GatePoint::AfterJob),
        "{:?}",
        job.gates.passed
    );
    // bounded evidence: the latest of each gate plus the failure
    assert!(job.gates.evidence.len() <= 4, "{:#?}", job.gates.evidence);
    assert!(job.gates.evidence.iter().any(|r| r.evaluation.gate == "db"
        && r.evaluation.verdict == medea::rollout::ports::GateVerdict::Fail));
}

#[tokio::test(start_paused = true)]
async fn a_node_cordoned_before_its_step_stays_cordoned() {
    // maxUnavailable 2: w-1, left cordoned after its own wave, is a node "cordoned by someone
    // else" that takes one slot of wave 2's budget (issue #35 item 4); with a budget of 1 the
    // job would wait for it and halt `pool_unavailable` instead
    let w = health_world(
        FakeCluster::new(&specs(0, 2, FROM, KUBE)),
        |f| vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 2)],
        None,
        None,
    );
    w.fake
        .edit(|s| s.nodes.get_mut("w-1").unwrap().cordoned = true);
    let out = w.executor().run(&w.job).await.unwrap();
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    let s = w.state();
    assert_eq!(s.nodes["w-1"].version, tv(TO));
    assert!(
        s.nodes["w-1"].cordoned,
        "medea never uncordons what it did not cordon"
    );
    assert_eq!(s.nodes["w-1"].counters.uncordon, 0, "{:#?}", s.log);
    assert!(!s.nodes["w-2"].cordoned);
    assert_eq!(s.nodes["w-2"].counters.uncordon, 1);
    let job = w.job();
    assert!(matches!(job.state, JobState::Succeeded { .. }));
    let _ = (CLUSTER, t0());
}

/// The same node left cordoned by its operator, with a budget of one: it is a node of the pool
/// cordoned by someone else, so wave 2 has no slot, waits, and halts `pool_unavailable` naming
/// it, having touched nothing of wave 2 (issue #35 item 4).
#[tokio::test(start_paused = true)]
async fn a_node_left_cordoned_by_its_operator_takes_the_next_waves_only_slot() {
    let w = health_world(
        FakeCluster::new(&specs(0, 2, FROM, KUBE)),
        |f| vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)],
        None,
        None,
    );
    w.fake
        .edit(|s| s.nodes.get_mut("w-1").unwrap().cordoned = true);
    let out = w.executor().run(&w.job).await.unwrap();
    let RunOutcome::Halted { reason, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(reason.code(), HaltCode::PoolUnavailable, "{reason}");
    assert!(reason.to_string().contains("w-1 cordoned"), "{reason}");
    let s = w.state();
    assert_eq!(s.nodes["w-1"].version, tv(TO));
    assert!(s.nodes["w-1"].cordoned);
    assert_eq!(s.nodes["w-2"].version, tv(FROM), "wave 2 untouched");
    assert_eq!(s.nodes["w-2"].counters.cordon, 0, "{:#?}", s.log);
}

// crash harness: a child medea killed at every journal point of a rollout whose gate fails
// after the first wave and rolls it back (gate evaluations, rollback requested, rolled back)

mod crash {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use medea::rollout::sequencer::CommandOp;
    use medea::store::StoreExt;
    use medea::store::fjall::FjallStore;

    use super::*;
    use crate::rollout::crash::scratch;

    fn prepare(dir: &Path) {
        let fake = FakeCluster::new(&specs(0, 3, FROM, KUBE));
        fake.edit(|s| {
            s.gates.insert(
                "ceph".into(),
                FakeGate {
                    fail_while: Some((vec!["w-1".into(), "w-2".into()], tv(TO))),
                    ..FakeGate::default()
                },
            );
        });
        fake.save(&dir.join("cluster.json")).unwrap();
        let store = FjallStore::open(&dir.join("store")).unwrap();
        let obs = observed(&fake);
        let mut step = talos_step(&fake, "workers", &[&["w-1", "w-2"], &["w-3"]], TO, 2);
        if let Step::Talos(t) = &mut step {
            t.health = Some(policy(&["ceph"], 0, 1, 1, OnFailure::Rollback));
        }
        let mut p = plan(&obs, vec![step], 11);
        std::sync::Arc::make_mut(&mut p.clusters[0]).health =
            Some(policy(&["alerts"], 0, 1, 1, OnFailure::Halt));
        install(&store, &p, &obs, &[]).unwrap();
    }

    fn child(dir: &Path) -> Command {
        let mut c = crate::cli::medea();
        c.arg("__rollout-run")
            .arg("--rollouts")
            .arg("--store")
            .arg(dir.join("store"))
            .arg("--fake-state")
            .arg(dir.join("cluster.json"))
            .arg("--snapshots")
            .arg(dir.join("snapshots"))
            .env_remove("MEDEA_CRASH_AT")
            .env_remove("MEDEA_CRASH_AFTER")
            .env_remove("MEDEA_CRASH_BEFORE");
        c
    }

    fn store(dir: &Path) -> PathBuf {
        dir.join("store")
    }

    /// The wave is back on the old version, uncordoned, with exactly one Upgrade and one
    /// Rollback per node; the next wave untouched; the job halted `rolled_back`.
    fn check(dir: &Path, what: &str) {
        let s = FakeCluster::persistent(&dir.join("cluster.json"))
            .unwrap()
            .state();
        for n in ["w-1", "w-2"] {
            let x = &s.nodes[n];
            assert_eq!(
                x.version,
                tv(FROM),
                "{what}: {n} on the old version\n{:#?}",
                s.log
            );
            assert!(!x.cordoned, "{what}: {n} left cordoned");
            assert_eq!(
                x.counters.upgrade, 1,
                "{what}: {n} Upgrade calls\n{:#?}",
                s.log
            );
            assert_eq!(
                x.counters.rollback, 1,
                "{what}: {n} Rollback calls\n{:#?}",
                s.log
            );
        }
        assert_eq!(
            s.nodes["w-3"].counters.upgrade, 0,
            "{what}: no further Upgrade"
        );
        assert_eq!(s.nodes["w-3"].counters.cordon, 0, "{what}");
        let store = FjallStore::open(&store(dir)).unwrap();
        let jobs = medea::ops::jobs::load_jobs(&store).unwrap();
        assert!(
            matches!(&jobs[0].state, JobState::Halted { reason, .. } if reason.code() == HaltCode::RolledBack),
            "{what}: {:?}",
            jobs[0].state
        );
    }

    fn harness(var: &str) -> u64 {
        use std::os::unix::process::ExitStatusExt;
        for n in 1u64.. {
            let dir = scratch();
            prepare(dir.path());
            let first = child(dir.path()).env(var, n.to_string()).output().unwrap();
            if first.status.signal() != Some(6) {
                assert!(n > 1, "the rollout has journal points");
                check(dir.path(), &format!("{var}={n} (never reached)"));
                // the new journal points were among those crossed
                let store = FjallStore::open(&store(dir.path())).unwrap();
                let entries = store
                    .scan_records::<medea::rollout::journal::JournalEntry>("")
                    .unwrap();
                let has = |f: &dyn Fn(&Entry) -> bool| entries.iter().any(|(_, e)| f(&e.entry));
                assert!(has(&|e| matches!(e, Entry::Gates { .. })));
                assert!(has(
                    &|e| matches!(e, Entry::Intent { key, .. } if key.op == CommandOp::Rollback)
                ));
                assert!(has(
                    &|e| matches!(e, Entry::Result { key, .. } if key.op == CommandOp::Rollback)
                ));
                return n - 1;
            }
            let again = child(dir.path()).output().unwrap();
            assert_eq!(
                again.status.signal(),
                None,
                "{var}={n}: the restarted child must not crash: {}",
                String::from_utf8_lossy(&again.stderr)
            );
            check(dir.path(), &format!("{var}={n}"));
        }
        unreachable!()
    }

    #[test]
    fn killed_after_every_journal_write_the_wave_is_rolled_back_exactly_once() {
        let points = harness("MEDEA_CRASH_AT");
        assert!(points > 20, "{points}");
    }

    #[test]
    fn killed_before_every_journal_write_the_wave_is_rolled_back_exactly_once() {
        let points = harness("MEDEA_CRASH_BEFORE");
        assert!(points > 20, "{points}");
    }
}

// the simulator, through the real adapters: MachineService.Rollback and a rollback wave

mod sim {
    use medea::rollout::executor::ExecutorConfig;
    use medea::rollout::ports::{
        GateContext, GateEvaluation, GateSample, GateVerdict, HealthProbe, NextBoot, TalosPort,
    };
    use medea::rollout::{Executor, SystemClock};
    use medea::sim::kube::KubeSimConfig;
    use medea::sim::talos::{Method, SimTalos};

    use super::*;
    use crate::rollout_sim::{Sim, adapters, node};

    /// Fails while any of `nodes` runs [`TO`] on the simulator (the workload breaks there).
    struct BreaksOnTarget<'a> {
        talos: &'a SimTalos,
        nodes: Vec<&'static str>,
    }

    impl HealthProbe for BreaksOnTarget<'_> {
        async fn evaluate(&self, gate: &Gate, _ctx: &GateContext) -> GateEvaluation {
            let bad: Vec<GateSample> = self
                .nodes
                .iter()
                .filter(|n| self.talos.node_state(n).unwrap().running == tv(TO))
                .map(|n| GateSample {
                    labels: [("node".to_string(), n.to_string())].into(),
                    value: "0".into(),
                })
                .collect();
            GateEvaluation {
                gate: gate.name.clone(),
                verdict: if bad.is_empty() {
                    GateVerdict::Pass
                } else {
                    GateVerdict::Fail
                },
                detail: format!("{} node(s) broken", bad.len()),
                samples: bad,
                dry_run: gate.dry_run,
                error: false,
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_simulated_rollback_flips_the_boot_slot_and_a_second_call_flips_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
        let (talos, _) = adapters(&sim).await;
        let w1 = node(&sim, "w-1");
        // a fresh install has no previous slot
        let e = talos.rollback(&w1).await.unwrap_err();
        assert!(!e.is_transient(), "{e}");
        assert!(
            medea::error_chain(&e).contains("previous UKI not found"),
            "{}",
            medea::error_chain(&e)
        );
        let image = format!(
            "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:{TO}"
        );
        talos
            .pull_image(&w1, &image, medea::rollout::ports::ImageNamespace::System)
            .await
            .unwrap();
        talos
            .upgrade(&w1, &image, medea::rollout::ports::UpgradeMethod::Lifecycle)
            .await
            .unwrap();
        talos.reboot(&w1).await.unwrap();
        let back = |want: &'static str| {
            let talos = &talos;
            let w1 = &w1;
            async move {
                for _ in 0..400 {
                    if let Ok(n) = talos.node(w1).await
                        && n.version == tv(want)
                        && n.ready
                    {
                        return n;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!("w-1 never came back on {want}");
            }
        };
        let up = back(TO).await;
        assert_eq!(up.next_boot, NextBoot::Same);
        talos.rollback(&w1).await.unwrap();
        let rolled = back(FROM).await;
        assert_ne!(rolled.boot_id, up.boot_id, "it rebooted");
        assert_eq!(
            sim.talos.counters("w-1").unwrap().calls(Method::Rollback),
            2,
            "the refused call and this one reached the node"
        );
        // a second rollback flips back to the other slot: the upgraded version
        talos.rollback(&w1).await.unwrap();
        back(TO).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_the_simulator_a_failed_wave_is_rolled_back_and_the_next_wave_never_upgraded() {
        let dir = tempfile::tempdir().unwrap();
        let sim = Sim::start(dir.path(), 1, 3, KubeSimConfig::default()).await;
        let mut step = sim.step("workers", &[&["w-1", "w-2"], &["w-3"]], 2, (60, 60));
        if let Step::Talos(t) = &mut step {
            t.health = Some(policy(&["app"], 0, 1, 1, OnFailure::Rollback));
        }
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let obs = sim.observed();
        let job = install(store.as_ref(), &plan(&obs, vec![step], 1), &obs, &[]).unwrap();
        let (talos, kube) = adapters(&sim).await;
        let mut cfg = ExecutorConfig::new(true, dir.path().join("snapshots"));
        cfg.poll = Duration::from_millis(20);
        cfg.backoff_min = Duration::from_millis(20);
        cfg.backoff_max = Duration::from_millis(160);
        cfg.max_sleep = Duration::from_secs(1);
        let exec = Executor::new(store.clone(), talos, kube, SystemClock, cfg).with_probe(
            BreaksOnTarget {
                talos: &sim.talos,
                nodes: vec!["w-1", "w-2"],
            },
        );
        let out = tokio::time::timeout(Duration::from_secs(60), exec.run(&job))
            .await
            .expect("within a minute")
            .unwrap();
        let RunOutcome::Halted { reason, .. } = &out else {
            panic!("{out:?}")
        };
        assert_eq!(reason.code(), HaltCode::RolledBack, "{reason}");
        for n in ["w-1", "w-2"] {
            let s = sim.talos.node_state(n).unwrap();
            assert_eq!(s.running, tv(FROM), "{n} back on the old version");
            assert!(!sim.cordoned(n), "{n} uncordoned");
            assert_eq!(sim.upgrades(n), 1, "{n}");
            assert_eq!(
                sim.talos.counters(n).unwrap().calls(Method::Rollback),
                1,
                "{n}: one Rollback"
            );
        }
        // no further Upgrade call, by the simulator's counters
        assert_eq!(sim.upgrades("w-3"), 0);
        assert_eq!(sim.talos.counters("w-3").unwrap().mutating(), 0);
        assert!(!sim.cordoned("w-3"));
        let _ = CLUSTER;
    }
}

// Done when (issue #23), on the simulator with a real Prometheus and a real Alertmanager (the
// Debian binaries, started here on loopback): a query gate that goes bad after the first wave
// rolls that wave back and the next wave is never upgraded; a firing critical alert keeps a
// job from starting. The gates are evaluated by medea's own probes (`health::Probes`, as in
// `medea serve`), which find the servers in the plan.

mod real {
    use std::net::SocketAddr;
    use std::path::Path;

    use medea::health::Probes;
    use medea::plan::health::Endpoint;
    use medea::rollout::executor::ExecutorConfig;
    use medea::rollout::{Executor, SystemClock};
    use medea::sim::kube::KubeSimConfig;
    use medea::sim::talos::{Method, SimTalos};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::health_servers::{AlertmanagerServer, PrometheusServer};
    use crate::rollout_sim::{Sim, adapters};

    /// `/metrics`: `app_healthy{app="web"}` is 0 while w-1 or w-2 runs the target.
    async fn exporter(talos: SimTalos) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                let talos = talos.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let broken = ["w-1", "w-2"]
                        .iter()
                        .any(|n| talos.node_state(n).is_some_and(|x| x.running == tv(TO)));
                    let body = format!(
                        "# TYPE app_healthy gauge\napp_healthy{{app=\"web\"}} {}\n",
                        if broken { 0 } else { 1 }
                    );
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(resp.as_bytes()).await;
                });
            }
        });
        addr
    }

    /// Where medea's probes find the two servers: in the plan, as `medea serve` does.
    fn sources(prom: &PrometheusServer, am: &AlertmanagerServer) -> HealthSources {
        let at = |url: &str| Endpoint {
            url: url.to_string(),
            credential: None,
        };
        HealthSources {
            prometheus: Some(at(&prom.url)),
            alertmanager: Some(at(&am.url)),
        }
    }

    fn alerts_policy(sources: HealthSources) -> HealthPolicy {
        HealthPolicy {
            sources,
            gates: vec![Gate {
                name: "no-critical-alerts".into(),
                dry_run: false,
                consecutive_error_limit: medea::plan::health::DEFAULT_CONSECUTIVE_ERROR_LIMIT,
                on_inconclusive: Default::default(),
                check: GateCheck::Alerts {
                    matchers: vec!["severity=\"critical\"".into()],
                    ignore: vec![],
                    skip_operator_silences: false,
                },
            }],
            soak: Duration::ZERO,
            interval: Duration::from_secs(1),
            failure_limit: 2,
            inconclusive_limit: 1,
            on_failure: OnFailure::Halt,
        }
    }

    fn config(dir: &Path) -> ExecutorConfig {
        let mut cfg = ExecutorConfig::new(true, dir.join("snapshots"));
        cfg.poll = Duration::from_millis(20);
        cfg.backoff_min = Duration::from_millis(20);
        cfg.backoff_max = Duration::from_millis(160);
        cfg.max_sleep = Duration::from_secs(1);
        cfg
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_real_prometheus_and_alertmanager_a_bad_wave_is_rolled_back_and_a_critical_alert_blocks_the_start()
     {
        let dir = tempfile::tempdir().unwrap();
        let sim = Sim::start(dir.path(), 1, 3, KubeSimConfig::default()).await;
        let target = exporter(sim.talos.clone()).await;
        // Both are required here (a missing one fails with the package to install).
        crate::fixtures::require_tool("prometheus");
        crate::fixtures::require_tool("prometheus-alertmanager");
        let prom = PrometheusServer::start(target)
            .await
            .expect("prometheus is installed");
        let am = AlertmanagerServer::start()
            .await
            .expect("prometheus-alertmanager is installed");
        // medea's own probes (`medea serve`'s), reading the sources from the plan
        let probe = || Probes::new(HealthSources::default());
        let sources = sources(&prom, &am);
        // the series exists once Prometheus has scraped the exporter (healthy: nothing runs
        // the target yet)
        prom.wait_for_value("app_healthy", "1").await;

        // 1. a query gate goes bad after wave 1 (w-1, w-2): rolled back, w-3 never upgraded
        let mut step = sim.step("workers", &[&["w-1", "w-2"], &["w-3"]], 2, (60, 60));
        if let Step::Talos(t) = &mut step {
            let mut p = policy(&["web"], 8, 1, 2, OnFailure::Rollback);
            p.sources = sources.clone();
            p.gates[0].check = GateCheck::Query {
                query: "app_healthy == 1".into(),
            };
            t.health = Some(p);
        }
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let obs = sim.observed();
        let mut p = plan(&obs, vec![step], 1);
        std::sync::Arc::make_mut(&mut p.clusters[0]).health = Some(alerts_policy(sources.clone()));
        let job = install(store.as_ref(), &p, &obs, &[]).unwrap();
        let (talos, kube) = adapters(&sim).await;
        let exec = Executor::new(store.clone(), talos, kube, SystemClock, config(dir.path()))
            .with_probe(probe());
        let out = tokio::time::timeout(Duration::from_secs(90), exec.run(&job))
            .await
            .expect("within 90s")
            .unwrap();
        let RunOutcome::Halted { reason, .. } = &out else {
            panic!("{out:?}")
        };
        assert_eq!(reason.code(), HaltCode::RolledBack, "{reason}");
        let f = reason.gate_failure().unwrap();
        assert_eq!(f.gate, "web");
        assert_eq!(
            f.samples.len(),
            0,
            "a false comparison returns nothing: {f:?}"
        );
        for n in ["w-1", "w-2"] {
            assert_eq!(sim.talos.node_state(n).unwrap().running, tv(FROM), "{n}");
            assert!(!sim.cordoned(n), "{n} uncordoned");
            assert_eq!(sim.talos.counters(n).unwrap().calls(Method::Rollback), 1);
        }
        assert_eq!(sim.upgrades("w-3"), 0, "no further Upgrade call");

        // 2. a firing critical alert keeps the next job from starting
        // (`fire` asserts Alertmanager accepted it with 200.)
        am.fire(&[("alertname", "CephDown"), ("severity", "critical")])
            .await;
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let obs = sim.observed();
        let mut p = plan(&obs, vec![sim.step("workers", &[&["w-3"]], 1, (60, 60))], 2);
        std::sync::Arc::make_mut(&mut p.clusters[0]).health = Some(alerts_policy(sources.clone()));
        let job = install(store.as_ref(), &p, &obs, &[]).unwrap();
        let (talos, kube) = adapters(&sim).await;
        let before = sim.talos.counters("w-3").unwrap().mutating();
        let exec = Executor::new(store.clone(), talos, kube, SystemClock, config(dir.path()))
            .with_probe(probe());
        let out = tokio::time::timeout(Duration::from_secs(30), exec.run(&job))
            .await
            .expect("within 30s")
            .unwrap();
        let RunOutcome::Halted { reason, step, .. } = &out else {
            panic!("{out:?}")
        };
        assert_eq!(reason.code(), HaltCode::GateFailed, "{reason}");
        assert_eq!(*step, None);
        let f = reason.gate_failure().unwrap();
        assert_eq!(f.point, GatePoint::BeforeJob);
        assert_eq!(f.samples[0].labels["alertname"], "CephDown", "{f:?}");
        assert_eq!(sim.talos.counters("w-3").unwrap().mutating(), before);
        assert!(!sim.cordoned("w-3"));
    }
}
