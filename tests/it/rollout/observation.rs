//! Observation: when and how the nodes of a wave are observed.

use super::*;

/// A drained node waiting for its Upgrade is observed when its turn comes, not in every
/// decision of its wave: a wave of n nodes costs O(n) such observations, not O(n²).
#[tokio::test(start_paused = true)]
async fn a_drained_node_is_observed_at_its_turn_not_at_every_decision_of_its_wave() {
    let names: Vec<String> = (1..=8).map(|i| format!("w-{i}")).collect();
    let wave: Vec<&str> = names.iter().map(String::as_str).collect();
    let w = world(FakeCluster::new(&specs(0, 8, FROM, KUBE)), |f| {
        vec![talos_step(f, "workers", &[&wave], TO, 8)]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    assert_rolled(&w.state(), TO, 1);
    let seen = w.fake.observations_while_drained();
    assert_eq!(
        seen.len(),
        8,
        "every node was checked before its upgrade: {seen:?}"
    );
    assert!(
        seen.values().all(|n| *n == 1),
        "each drained node observed once, right before its Upgrade: {seen:?}"
    );
    // lockstep is kept: every node drained before the first upgrade, every upgrade before the
    // first reboot
    let log = &w.state().log;
    assert!(
        position(log, "drain w-8") < position(log, "upgrade w-1"),
        "{log:#?}"
    );
    assert!(
        position(log, "upgrade w-8") < position(log, "reboot w-1"),
        "{log:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_nodes_of_a_wave_are_observed_concurrently() {
    // the three nodes stay away long enough to be rebooting together: a decision then
    // observes all three (a wave's nodes waiting for their turn are observed at their turn)
    let fake = FakeCluster::new(&specs(0, 3, FROM, KUBE));
    fake.edit(|s| s.reboot_polls = 3);
    let w = world(fake, |f| {
        vec![talos_step(f, "workers", &[&["w-1", "w-2", "w-3"]], TO, 3)]
    });
    w.fake.yield_in_observations();
    let exec = w.executor();
    assert_eq!(exec.run(&w.job).await.unwrap(), RunOutcome::Succeeded);
    assert_rolled(&w.state(), TO, 1);
    assert_eq!(
        w.fake.max_concurrent_observations(),
        3,
        "the three nodes of the wave were observed at once"
    );
}
