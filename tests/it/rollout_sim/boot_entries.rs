//! Boot entries and the reboot of Talos 1.14 on the simulator, through the real adapters
//! (issue #48 items 2 and 4): a node that says an install is running is waited for, never
//! installed again; apid's `PermissionDenied` window after a 1.14 reboot is "still rebooting";
//! the fallback entry survives a rollout.

use medea::rollout::ports::ImageNamespace;

use super::*;

/// A step of `sim` to `to` over one wave of `nodes`.
fn step_to(sim: &Sim, nodes: &[&str], to: &str) -> Step {
    let mut step = sim.step("workers", &[nodes], 1, (60, 60));
    if let Step::Talos(t) = &mut step {
        t.to = tv(to);
        t.image = format!(
            "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:{to}"
        );
    }
    step
}

/// Poll `what` until it holds, failing at a deadline.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An install of the target is already running on `w-1` when the job reaches it (a caller
/// gone, as after a crash): medea's install is refused "already in progress", and from then
/// on the node is *installing*: medea waits for its next boot to change and reboots it,
/// without another install call. Before, every resolution saw "next boot = running, same
/// boot" and issued the install again after each backoff (and one landing just after the
/// first ended would have installed a second time over the staged entry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_says_an_install_is_running_is_waited_for_not_installed_again() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start_timed(dir.path(), 1, 1, KubeSimConfig::default(), FROM, |t| {
        t.install = Duration::from_millis(1500);
    })
    .await;
    // the earlier caller: pull, then an install it never waits for
    let (earlier, _) = adapters(&sim).await;
    let w1 = node(&sim, "w-1");
    let image = format!(
        "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:{TO}"
    );
    earlier
        .pull_image(&w1, &image, ImageNamespace::System)
        .await
        .unwrap();
    let install = {
        let (w1, image) = (w1.clone(), image.clone());
        tokio::spawn(async move { earlier.upgrade(&w1, &image, UpgradeMethod::Lifecycle).await })
    };
    until("the earlier install runs", || {
        sim.talos.node_state("w-1").unwrap().installing
    })
    .await;
    let run = run_for(&sim, dir.path(), vec![step_to(&sim, &["w-1"], TO)]).await;
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    install.await.unwrap().unwrap();
    let s = sim.talos.node_state("w-1").unwrap();
    assert_eq!(s.running, tv(TO));
    assert_eq!(
        sim.upgrades("w-1"),
        2,
        "the earlier install and medea's one refused call, never another"
    );
    assert_eq!(sim.reboots("w-1"), 1);
    assert_eq!(
        s.boot_entries
            .iter()
            .map(|(_, v)| v.clone())
            .collect::<Vec<_>>(),
        [tv(FROM), tv(TO)],
        "the entry it ran before is still there: {:?}",
        s.boot_entries
    );
}

/// After its reboot into Talos 1.14 a node's apid answers `PermissionDenied` for a while
/// (tuppr#453): medea takes it for "not back yet" and waits it out within the health timeout.
/// Before, the refusal of a read was definitive and the job halted (`observation_failed`)
/// right after a good upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_denied_after_a_reboot_into_1_14_is_waited_out() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start_timed(dir.path(), 1, 2, KubeSimConfig::default(), "v1.13.9", |t| {
        t.apid_permission_denied = Duration::from_millis(600);
    })
    .await;
    let run = run_for(
        &sim,
        dir.path(),
        vec![step_to(&sim, &["w-1", "w-2"], "v1.14.6")],
    )
    .await;
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    for n in ["w-1", "w-2"] {
        assert_eq!(sim.talos.node_state(n).unwrap().running, tv("v1.14.6"));
        assert_eq!(sim.upgrades(n), 1, "{n}: one install");
        assert_eq!(sim.reboots(n), 1, "{n}: one reboot");
        let c = sim.talos.counters(n).unwrap();
        assert!(
            c.refused.values().sum::<u64>() > 0,
            "{n}: the PermissionDenied window was met: {c:?}"
        );
    }
}

/// On a GRUB node (which cannot report its next boot) and a systemd-boot one, a rollout keeps
/// the entry each ran before: `MachineService.Rollback` afterwards boots the old version again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_entry_survives_a_rollout_on_grub_and_systemd_boot() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    sim.talos.set_bootloader("w-2", Bootloader::Grub).unwrap();
    let run = run_for(&sim, dir.path(), vec![step_to(&sim, &["w-1", "w-2"], TO)]).await;
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    let (talos, _) = adapters(&sim).await;
    for n in ["w-1", "w-2"] {
        assert_eq!(sim.talos.node_state(n).unwrap().running, tv(TO), "{n}");
        let before = sim.talos.node_state(n).unwrap().boot_id;
        talos.rollback(&node(&sim, n)).await.unwrap();
        until("back from the rollback", || {
            let s = sim.talos.node_state(n).unwrap();
            s.boot_id != before && s.power == medea::sim::talos::Power::Up
        })
        .await;
        assert_eq!(
            sim.talos.node_state(n).unwrap().running,
            tv(FROM),
            "{n} falls back to the version it ran before"
        );
    }
}
