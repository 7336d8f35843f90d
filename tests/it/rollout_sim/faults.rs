//! The fault matrix, through the real adapters: a node that never returns, a silent revert,
//! installer exit codes, a failing extension service, a broken etcd snapshot, Talos `UNAVAILABLE`
//! bursts, the kube-apiserver away during a control-plane reboot, a node that cannot tell its
//! next boot.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_returns_halts_at_the_health_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    sim.talos
        .set_fault(fault("w-1", Trigger::boot(), Effect::NeverReturn))
        .unwrap();
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 2))];
    let run = run_for(&sim, dir.path(), steps).await;
    let out = run.go().await;
    let reason = halted_with(&out, HaltCode::NodeNotBack);
    assert!(reason.contains("did not come back within 2s"), "{reason}");
    assert_eq!(sim.upgrades("w-1"), 1);
    assert_eq!(sim.upgrades("w-2"), 0, "the next node is not touched");
    assert_eq!(sim.reboots("w-2"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_revert_halts_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    sim.talos
        .set_fault(fault("w-1", Trigger::boot(), Effect::BootOldVersion))
        .unwrap();
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::NodeReverted);
    assert!(reason.contains("node reverted"), "{reason}");
    assert!(reason.contains(FROM), "{reason}");
    assert_eq!(sim.talos.node_state("w-1").unwrap().running, tv(FROM));
    assert_eq!(sim.upgrades("w-2"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installer_exit_code_halts_without_a_reboot() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    // the installer keeps failing (a plan fires once: one per call, more than the bound)
    for nth in 1..=3 {
        sim.talos
            .set_fault(fault(
                "w-1",
                Trigger::nth_call(Method::Upgrade, nth),
                Effect::UpgradeExit {
                    code: 3,
                    message: "error writing boot assets: no space left on device".into(),
                },
            ))
            .unwrap();
    }
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::UpgradeRefused);
    assert!(reason.contains("exited with code 3"), "{reason}");
    assert!(reason.contains("no space left on device"), "{reason}");
    assert!(reason.contains("failed 2 times"), "{reason}");
    assert_eq!(
        sim.upgrades("w-1"),
        2,
        "rollout.upgradeAttempts (default 2) Upgrade calls, no more"
    );
    assert_eq!(sim.reboots("w-1"), 0, "no reboot after a failed install");
    assert_eq!(sim.upgrades("w-2"), 0);
    assert!(
        sim.cordoned("w-1"),
        "a halted node stays cordoned for the operator"
    );
}

/// Issue 20, item 2: a legacy (< 1.13) node whose installer keeps failing ("disk full", answered
/// `INTERNAL` by the node) used to get `MachineService.Upgrade` re-issued forever. The answer
/// proves the call ran and failed: after `rollout.upgradeAttempts` (2) the job halts with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_installer_that_keeps_failing_halts_after_the_bound_with_its_message() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start_from(dir.path(), 1, 2, KubeSimConfig::default(), "v1.12.6").await;
    for nth in 1..=4 {
        sim.talos
            .set_fault(fault(
                "w-1",
                Trigger::nth_call(Method::LegacyUpgrade, nth),
                Effect::UpgradeExit {
                    code: 1,
                    message: "disk full on /dev/sda".into(),
                },
            ))
            .unwrap();
    }
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::UpgradeRefused);
    assert!(reason.contains("disk full on /dev/sda"), "{reason}");
    assert!(reason.contains("failed 2 times"), "{reason}");
    let c = sim.talos.counters("w-1").unwrap();
    assert_eq!(
        c.calls(Method::LegacyUpgrade),
        2,
        "exactly the bound: {c:?}"
    );
    assert_eq!(c.calls(Method::Reboot), 0);
    assert_eq!(sim.talos.node_state("w-1").unwrap().running, tv("v1.12.6"));
    assert_eq!(sim.upgrades("w-2"), 0, "the next node is not touched");
    // each attempt was journaled (intent before the call) under its own key, with its outcome
    let journal: Vec<Entry> = run
        .store
        .scan_records::<JournalEntry>(&entries_prefix(&run.job))
        .unwrap()
        .into_iter()
        .map(|(_, e)| e.entry)
        .collect();
    let attempts = |intent: bool| -> Vec<u32> {
        journal
            .iter()
            .filter_map(|e| match e {
                Entry::Intent { key, .. } if intent && key.op == CommandOp::Upgrade => {
                    Some(key.attempt)
                }
                Entry::Result { key, .. } if !intent && key.op == CommandOp::Upgrade => {
                    Some(key.attempt)
                }
                _ => None,
            })
            .collect()
    };
    assert_eq!(attempts(true), vec![1, 2], "one intent per attempt");
    assert_eq!(attempts(false), vec![1, 2], "one outcome per attempt");
}

/// A system extension's service that was failing before the upgrade (`ext-<name>`, which
/// `MachineStatus` readiness ignores) does not keep the node "not back" after its reboot: the
/// services to wait for are compared with the states recorded before the upgrade (#33 item 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_service_failing_before_the_upgrade_does_not_hold_the_node_back() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    sim.talos
        .set_service_health("w-1", "ext-iscsi-tools", false)
        .unwrap();
    let steps = vec![sim.step("workers", &[&["w-1"]], 1, (60, 10))];
    let run = run_for(&sim, dir.path(), steps).await;
    let out = run.go().await;
    assert!(
        matches!(out, medea::rollout::RunOutcome::Succeeded),
        "{out:?}"
    );
    assert_eq!(sim.upgrades("w-1"), 1);
    let st = sim.talos.node_state("w-1").unwrap();
    assert_eq!(st.running, tv(TO));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_etcd_snapshot_touches_no_control_plane_node() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 1, KubeSimConfig::default()).await;
    for cp in ["cp-1", "cp-2", "cp-3"] {
        sim.talos
            .set_fault(fault(
                cp,
                Trigger::call(Method::EtcdSnapshot),
                Effect::SnapshotBreak { after_bytes: 5000 },
            ))
            .unwrap();
    }
    let steps = vec![sim.step(
        "control-plane",
        &[&["cp-1"], &["cp-2"], &["cp-3"]],
        1,
        (60, 60),
    )];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::CommandFailed);
    assert!(reason.contains("snapshot"), "{reason}");
    assert_eq!(sim.snapshots(), 1, "the snapshot was attempted once");
    for cp in ["cp-1", "cp-2", "cp-3"] {
        let c = sim.talos.counters(cp).unwrap();
        assert_eq!(c.mutating(), 0, "{cp}: no mutating call: {c:?}");
        assert!(!sim.cordoned(cp), "{cp} not cordoned");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path().join("snapshots"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "no partial snapshot is left: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talos_unavailable_bursts_are_waited_out_and_every_call_still_happens_once() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 2, KubeSimConfig::default()).await;
    let bursts = [
        fault(
            "cp-2",
            Trigger::any_call(),
            Effect::Unavailable { calls: 3 },
        ),
        fault("w-1", Trigger::any_call(), Effect::Unavailable { calls: 5 }),
        // refused mutating calls: the adapter reports them transient, the executor observes
        // that they did not happen and issues them again
        fault(
            "w-2",
            Trigger::call(Method::Upgrade),
            Effect::Unavailable { calls: 1 },
        ),
        fault(
            "cp-3",
            Trigger::call(Method::Reboot),
            Effect::Unavailable { calls: 2 },
        ),
    ];
    for b in bursts {
        sim.talos.set_fault(b).unwrap();
    }
    let steps = vec![
        sim.step(
            "control-plane",
            &[&["cp-1"], &["cp-2"], &["cp-3"]],
            1,
            (60, 60),
        ),
        sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60)),
    ];
    let run = run_for(&sim, dir.path(), steps).await;
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    for n in ["cp-1", "cp-2", "cp-3", "w-1", "w-2"] {
        assert_eq!(sim.talos.node_state(n).unwrap().running, tv(TO), "{n}");
        assert_eq!(sim.upgrades(n), 1, "{n}: one Upgrade");
        assert_eq!(sim.reboots(n), 1, "{n}: one Reboot");
        assert!(!sim.cordoned(n));
    }
    let c = |n: &str| sim.talos.counters(n).unwrap();
    assert_eq!(c("w-2").refused(Method::Upgrade), 1, "the burst fired");
    assert_eq!(c("cp-3").refused(Method::Reboot), 2);
    let refused: u64 = ["cp-2", "w-1"]
        .iter()
        .flat_map(|n| c(n).refused.into_values())
        .sum();
    assert!(refused >= 8, "every burst fired ({refused})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kube_apiserver_away_during_a_control_plane_reboot_is_waited_out() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 1, KubeSimConfig::default()).await;
    let steps = vec![sim.step(
        "control-plane",
        &[&["cp-1"], &["cp-2"], &["cp-3"]],
        1,
        (60, 60),
    )];
    let run = run_for(&sim, dir.path(), steps).await;
    let mut events = run.exec.subscribe();
    let kube = sim.kube.clone();
    let injector = tokio::spawn(async move {
        loop {
            let ev: RolloutEvent = events.recv().await.unwrap();
            let rebooted = ev.node.as_deref() == Some("cp-2")
                && ev.op == Some(CommandOp::Reboot)
                && matches!(ev.state, EventState::Done);
            if rebooted {
                // the apiserver goes away with the control-plane node, for longer than the
                // node's own reboot
                kube.inject(KubeFault::ApiUnavailable(Outage::For(
                    Duration::from_millis(1500),
                )));
                return;
            }
        }
    });
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    injector.await.unwrap();
    assert!(sim.kube.counters().unavailable > 0, "the outage was seen");
    for n in ["cp-1", "cp-2", "cp-3"] {
        assert_eq!(sim.talos.node_state(n).unwrap().running, tv(TO), "{n}");
        assert_eq!(sim.upgrades(n), 1);
        assert_eq!(sim.reboots(n), 1);
        assert!(!sim.cordoned(n));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upgrade_on_a_node_that_cannot_tell_its_next_boot_halts_instead_of_retrying() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    sim.talos.set_bootloader("w-1", Bootloader::Grub).unwrap();
    sim.talos
        .set_fault(fault(
            "w-1",
            Trigger::call(Method::Upgrade),
            Effect::Unavailable { calls: 1 },
        ))
        .unwrap();
    let steps = vec![sim.step("workers", &[&["w-1"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::OutcomeUnknown);
    assert!(
        reason.contains("cannot tell whether the upgrade of `w-1` ran"),
        "{reason}"
    );
    assert_eq!(
        sim.upgrades("w-1"),
        0,
        "the lost call is never repeated blindly"
    );
    assert_eq!(
        sim.talos.counters("w-1").unwrap().refused(Method::Upgrade),
        1
    );
}
