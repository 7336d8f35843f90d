//! Coming back (issue 20, items 8 and 9): boot entries after a lost reply or a reinstall, a
//! booting machine status and apid's redial backoff.

use super::*;

/// A node written from a disk image has no `LoaderEntryDefault` until its first install. A lost
/// Upgrade reply there is resolved from `LoaderEntrySelected` (the node boots what it runs), so
/// the call is made again instead of halting "cannot tell".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_image_node_without_a_default_boot_entry_is_upgraded_after_a_lost_reply() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    sim.talos
        .set_bootloader("w-1", Bootloader::SdBootImage)
        .unwrap();
    let (talos, _) = adapters(&sim).await;
    let seen = talos.node(&node(&sim, "w-1")).await.unwrap();
    assert_eq!(
        seen.next_boot,
        NextBoot::Same,
        "read from LoaderEntrySelected"
    );
    sim.talos
        .set_fault(fault(
            "w-1",
            Trigger::call(Method::Upgrade),
            Effect::Unavailable { calls: 1 },
        ))
        .unwrap();
    let steps = vec![sim.step("workers", &[&["w-1"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    assert_eq!(sim.talos.node_state("w-1").unwrap().running, tv(TO));
    let c = sim.talos.counters("w-1").unwrap();
    assert_eq!(c.refused(Method::Upgrade), 1, "the lost call");
    assert_eq!(c.calls(Method::Upgrade), 1, "one Upgrade reached the node");
    assert_eq!(c.calls(Method::Reboot), 1);
    // the install wrote the default entry; the node booted it
    let back = talos.node(&node(&sim, "w-1")).await.unwrap();
    assert_eq!(back.next_boot, NextBoot::Same);
}

/// Installing the version a node already has writes `Talos-<v>~1.efi` (a reinstall entry);
/// the adapter reads what it boots from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reinstall_boot_entries_say_what_boots_next() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    let (talos, _) = adapters(&sim).await;
    let w1 = node(&sim, "w-1");
    for (v, next) in [(FROM, NextBoot::Same), (TO, NextBoot::Version(tv(TO)))] {
        let image = format!(
            "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:{v}"
        );
        talos
            .pull_image(&w1, &image, medea::rollout::ports::ImageNamespace::System)
            .await
            .unwrap();
        talos
            .upgrade(&w1, &image, UpgradeMethod::Lifecycle)
            .await
            .unwrap();
        let seen = talos.node(&w1).await.unwrap();
        assert_eq!(seen.next_boot, next, "after installing {v}");
        if v == FROM {
            // booting the reinstall entry: it is also what it boots next
            let before = seen.boot_id.clone();
            talos.reboot(&w1).await.unwrap();
            let back = loop {
                match talos.node(&w1).await {
                    Ok(n) if n.boot_id != before => break n,
                    Ok(_) => {}
                    Err(e) => assert!(e.is_transient(), "{e}"),
                }
                tokio::task::yield_now().await;
            };
            assert_eq!(back.next_boot, NextBoot::Same);
        }
    }
}

/// After its reboot a node is up, but `MachineStatus` says `booting` for a while and the
/// endpoint apid keeps answering `UNAVAILABLE` for it (dial backoff): medea waits both out,
/// without a halt and without doing anything twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booting_machine_status_and_apid_redial_backoff_are_waited_out() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start_timed(dir.path(), 1, 2, KubeSimConfig::default(), FROM, |t| {
        t.machine_ready = Duration::from_millis(400);
        t.apid_redial = Duration::from_millis(250);
    })
    .await;
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    for n in ["w-1", "w-2"] {
        assert_eq!(sim.talos.node_state(n).unwrap().running, tv(TO), "{n}");
        assert_eq!(sim.upgrades(n), 1, "{n}: one Upgrade");
        assert_eq!(sim.reboots(n), 1, "{n}: one Reboot");
        assert!(!sim.cordoned(n));
        let c = sim.talos.counters(n).unwrap();
        let refused: u64 = c.refused.values().sum();
        assert!(refused > 0, "{n}: apid's redial backoff was met: {c:?}");
    }
}
