//! Boot entries as upstream keeps them (issue #48 item 2), over the in-memory fakes: an install
//! is made only on a node whose next boot is the version it runs, since upstream's installer
//! keeps only the default entry besides the one it writes (sd-boot) or flips the default
//! label (GRUB).

use super::*;

/// A node staged outside this job (its next boot is the target already): rebooted, never
/// installed again.
#[tokio::test(start_paused = true)]
async fn a_node_whose_next_boot_is_the_target_is_rebooted_without_a_second_install() {
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE));
    fake.edit(|s| s.nodes.get_mut("w-1").unwrap().staged = Some(tv(TO)));
    let (w, out) = run_with(fake, |f| {
        vec![talos_step(f, "w", &[&["w-1"], &["w-2"]], TO, 1)]
    })
    .await;
    assert_eq!(out, RunOutcome::Succeeded);
    let s = w.state();
    assert_eq!(s.nodes["w-1"].version, tv(TO));
    assert_eq!(
        s.nodes["w-1"].counters.upgrade, 0,
        "no install over the staged entry\n{:#?}",
        s.log
    );
    assert_eq!(s.nodes["w-1"].counters.reboot, 1);
    assert_eq!(s.nodes["w-2"].counters.upgrade, 1);
    assert!(!s.nodes["w-1"].cordoned, "uncordoned after its reboot");
}

/// A node whose next boot is another version: an install would delete the entry it runs, so
/// the job halts before any call.
#[tokio::test(start_paused = true)]
async fn a_node_whose_next_boot_is_another_version_halts_before_any_install() {
    let fake = FakeCluster::new(&specs(0, 1, FROM, KUBE));
    fake.edit(|s| s.nodes.get_mut("w-1").unwrap().staged = Some(tv("v1.13.5")));
    let (w, out) = run_with(fake, |f| vec![talos_step(f, "w", &[&["w-1"]], TO, 1)]).await;
    halted_at(
        &out,
        "w-1",
        HaltCode::UnexpectedVersion,
        "would delete its running entry",
    );
    let s = w.state();
    assert_eq!(s.nodes["w-1"].counters.upgrade, 0, "{:#?}", s.log);
    assert_eq!(s.nodes["w-1"].counters.reboot, 0);
    assert_eq!(
        s.nodes["w-1"].staged,
        Some(tv("v1.13.5")),
        "nothing changed"
    );
}

/// A GRUB node (no next boot to read) whose installer answered a failure may have flipped its
/// default label already: a second install could overwrite the running label, so the job
/// refuses instead of trying again within `rollout.upgradeAttempts`.
#[tokio::test(start_paused = true)]
async fn a_grub_node_whose_install_failed_is_not_installed_again() {
    let fake = FakeCluster::new(&specs(0, 1, FROM, KUBE)).with_fault(Fault::UpgradeExitCode {
        node: "w-1".into(),
        code: 1,
    });
    fake.edit(|s| s.nodes.get_mut("w-1").unwrap().reports_next_boot = false);
    let (w, out) = run_with(fake, |f| vec![talos_step(f, "w", &[&["w-1"]], TO, 1)]).await;
    halted_at(
        &out,
        "w-1",
        HaltCode::OutcomeUnknown,
        "could overwrite the entry it runs",
    );
    assert_eq!(
        w.state().nodes["w-1"].counters.upgrade,
        1,
        "one install, never a second on a guess"
    );
}

/// The same failure on a node that reports its next boot is tried again (its next boot proves
/// nothing was staged), as before.
#[tokio::test(start_paused = true)]
async fn a_failed_install_on_a_node_that_reports_its_next_boot_is_still_tried_again() {
    let fake = FakeCluster::new(&specs(0, 1, FROM, KUBE)).with_fault(Fault::UpgradeExitCode {
        node: "w-1".into(),
        code: 1,
    });
    let (w, out) = run_with(fake, |f| vec![talos_step(f, "w", &[&["w-1"]], TO, 1)]).await;
    halted_at(
        &out,
        "w-1",
        HaltCode::UpgradeRefused,
        "failed 2 times (rollout.upgradeAttempts)",
    );
    assert_eq!(w.state().nodes["w-1"].counters.upgrade, 2);
}
