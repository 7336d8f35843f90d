//! Installs ahead of the maintenance windows (`rollout.stage: ahead`, issue #36), over the fakes.

use medea::rollout::sequencer::{Action, NodePhase, Staging, StepKind, staged_not_rebooted};

use super::*;

/// Wednesday 12:00 (t0) is outside the daily 02:00–03:00 window.
fn window() -> MaintenanceWindow {
    MaintenanceWindow::new("0 2 * * *", Duration::from_secs(3600), "UTC").unwrap()
}

fn thursday() -> Timestamp {
    "2026-12-03T02:00:00Z".parse().unwrap()
}

fn intents(w: &World) -> Vec<(Timestamp, CommandOp, Option<String>, Action)> {
    w.journal()
        .into_iter()
        .filter_map(|e| match e.entry {
            Entry::Intent { key, action } => Some((e.at, key.op, key.node, action)),
            _ => None,
        })
        .collect()
}

fn node_of<'a>(job: &'a Job, name: &str) -> &'a medea::rollout::sequencer::NodeProgress {
    job.steps
        .iter()
        .find_map(|s| match &s.kind {
            StepKind::Talos(t) => t.nodes.iter().find(|n| n.target.node == name),
            StepKind::Kubernetes(_) => None,
        })
        .map(|n| n.as_ref())
        .unwrap()
}

/// A staged pool installs on every node before the window, two at a time, with no install in
/// the window: inside it only cordon, drain, reboot and uncordon happen.
#[tokio::test(start_paused = true)]
async fn a_staged_pool_installs_outside_the_window_and_only_reboots_inside_it() {
    let w = world_in(
        FakeCluster::new(&specs(0, 4, FROM, KUBE)),
        Arc::new(MemStore::new()),
        |f| {
            vec![staged(
                talos_step(f, "workers", &[&["w-1", "w-2"], &["w-3", "w-4"]], TO, 2),
                2,
            )]
        },
        &[window()],
    );
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let all = intents(&w);
    let stages: Vec<_> = all.iter().filter(|i| i.1 == CommandOp::Stage).collect();
    assert_eq!(stages.len(), 2, "two batches of two: {all:#?}");
    for (at, _, _, action) in &stages {
        assert!(*at < thursday(), "staged at {at}, before the window");
        let Action::Stage { nodes } = action else {
            panic!("{action:?}")
        };
        assert_eq!(nodes.len(), 2, "stageParallelism 2");
    }
    assert!(
        !all.iter().any(|i| matches!(
            i.1,
            CommandOp::Upgrade | CommandOp::Pull | CommandOp::PullAhead
        )),
        "no install and no pull (not even ahead of a wave: the image is installed) in the window: {all:#?}"
    );
    for (at, op, node, _) in &all {
        if matches!(
            op,
            CommandOp::Cordon | CommandOp::Drain | CommandOp::Reboot | CommandOp::Uncordon
        ) {
            assert!(
                *at >= thursday()
                    && *at < thursday().checked_add(Duration::from_secs(3600)).unwrap(),
                "{op} of {node:?} at {at}: inside the window"
            );
        }
    }
    // exactly one install (the staged one) and one reboot per node
    assert_rolled(&w.state(), TO, 1);
    assert!(staged_not_rebooted(&w.job()).is_empty());
}

/// A node below Talos 1.13 cannot install without a reboot: it is not staged and upgrades in
/// the window as before; the others of the pool are staged.
#[tokio::test(start_paused = true)]
async fn a_node_below_1_13_in_a_staged_pool_upgrades_in_the_window() {
    let mut nodes = specs(0, 2, FROM, KUBE);
    nodes[1] = FakeNodeSpec::new("w-2", false, "v1.12.9", KUBE);
    let w = world_in(
        FakeCluster::new(&nodes),
        Arc::new(MemStore::new()),
        |f| {
            vec![staged(
                talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1),
                2,
            )]
        },
        &[window()],
    );
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let all = intents(&w);
    let staged_nodes: Vec<String> = all
        .iter()
        .filter_map(|(_, _, _, a)| match a {
            Action::Stage { nodes } => Some(nodes.iter().map(|n| n.node.node.clone())),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(staged_nodes, ["w-1"]);
    let upgrade = all
        .iter()
        .find(|i| i.1 == CommandOp::Upgrade)
        .expect("w-2 upgrades in the window");
    assert_eq!(upgrade.2.as_deref(), Some("w-2"));
    assert!(upgrade.0 >= thursday());
    assert!(matches!(
        node_of(&w.job(), "w-2").staging,
        Some(Staging::InWindow { .. })
    ));
    let s = w.state();
    for n in ["w-1", "w-2"] {
        assert_eq!(s.nodes[n].version, tv(TO));
        assert_eq!(s.nodes[n].counters.upgrade, 1, "{n}");
    }
}

/// Run the executor in the background until `until` holds of the job.
async fn run_until(w: &World, until: impl Fn(&Job) -> bool) -> tokio::task::JoinHandle<RunOutcome> {
    let exec = Arc::new(w.executor());
    let id = w.job.clone();
    let handle = {
        let exec = exec.clone();
        tokio::spawn(async move { exec.run(&id).await.unwrap() })
    };
    for _ in 0..10_000 {
        if until(&w.job()) {
            return handle;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("never reached the state: {:#?}", w.job());
}

fn all_staged(j: &Job) -> bool {
    staged_not_rebooted(j).len() == 2
        && j.steps.iter().all(|s| match &s.kind {
            StepKind::Talos(t) => t
                .nodes
                .iter()
                .all(|n| matches!(n.staging, Some(Staging::Staged { .. }))),
            StepKind::Kubernetes(_) => true,
        })
}

/// A staged node rebooted by someone else while the job waits for the window boots the
/// target: medea records it (event), verifies it and never installs or reboots it again; the
/// other node is rebooted in the window as planned.
#[tokio::test(start_paused = true)]
async fn a_staged_node_rebooted_outside_medea_is_recorded_verified_and_not_upgraded_again() {
    let w = world_in(
        FakeCluster::new(&specs(0, 2, FROM, KUBE)),
        Arc::new(MemStore::new()),
        |f| {
            vec![staged(
                talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1),
                2,
            )]
        },
        &[window()],
    );
    let exec = Arc::new(w.executor());
    let mut events = exec.subscribe();
    let id = w.job.clone();
    let run = {
        let exec = exec.clone();
        tokio::spawn(async move { exec.run(&id).await.unwrap() })
    };
    for _ in 0..10_000 {
        if all_staged(&w.job()) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(all_staged(&w.job()), "{:#?}", w.job());
    // what a halted job would tell: both nodes boot the target next
    assert_eq!(
        staged_not_rebooted(&w.job()),
        [("w-1".to_string(), tv(TO)), ("w-2".to_string(), tv(TO))]
    );
    w.fake.reboot_externally("w-2");
    assert_eq!(run.await.unwrap(), RunOutcome::Succeeded);
    let s = w.state();
    assert_eq!(s.nodes["w-2"].version, tv(TO));
    assert_eq!(s.nodes["w-2"].counters.upgrade, 1, "installed once, ahead");
    assert_eq!(s.nodes["w-2"].counters.reboot, 0, "medea never rebooted it");
    assert!(
        !s.log.iter().any(|l| l.starts_with("cordon w-2")),
        "never cordoned (so never uncordoned): {:#?}",
        s.log
    );
    assert_eq!(s.nodes["w-1"].counters.reboot, 1);
    let job = w.job();
    let w2 = node_of(&job, "w-2");
    assert_eq!(w2.phase, NodePhase::Done);
    let Some(Staging::RebootedExternally { at, .. }) = &w2.staging else {
        panic!("{:?}", w2.staging)
    };
    assert!(
        *at < thursday(),
        "seen while the job waited for the window: {at}"
    );
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        if let EventState::RebootedExternally { boots, .. } = &e.state {
            seen.push((e.node.clone(), boots.clone()));
        }
    }
    assert_eq!(seen, [(Some("w-2".to_string()), TO.to_string())]);
}

/// A staged node rebooted by someone else that does not come back healthy halts the job naming
/// it, at the health timeout from when medea saw it, before the window (nothing else touched).
#[tokio::test(start_paused = true)]
async fn a_staged_node_rebooted_outside_medea_that_does_not_come_back_halts_naming_it() {
    let w = world_in(
        FakeCluster::new(&specs(0, 2, FROM, KUBE)),
        Arc::new(MemStore::new()),
        |f| {
            vec![staged(
                talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1),
                2,
            )]
        },
        &[window()],
    );
    let run = run_until(&w, all_staged).await;
    // it boots (a new boot id) but never gets running and ready
    w.fake.edit(|s| s.booting_polls = u32::MAX);
    w.fake.reboot_externally("w-2");
    let RunOutcome::Halted { reason, node, .. } = run.await.unwrap() else {
        panic!("{:#?}", w.job())
    };
    assert_eq!(node.as_deref(), Some("w-2"));
    assert_eq!(reason.code(), HaltCode::NodeNotBack, "{reason}");
    assert!(
        reason
            .to_string()
            .contains("staged node `w-2` was rebooted outside medea"),
        "{reason}"
    );
    let s = w.state();
    assert_eq!(
        s.nodes["w-1"].counters.reboot, 0,
        "nothing else was touched"
    );
    assert!(!s.nodes["w-1"].cordoned);
    let JobState::Halted { at, .. } = w.job().state else {
        panic!()
    };
    assert!(at < thursday(), "halted at {at}");
    // the halted job names the staged node that has not rebooted yet
    assert_eq!(staged_not_rebooted(&w.job()), [("w-1".to_string(), tv(TO))]);
}

/// A staged pool two minors behind (issue #36 item 1, multi-hop): each hop stages ahead of its
/// own reboots, and a node is never staged for the second hop before it has booted the first
/// hop's version. Every node installs and reboots exactly once per hop and ends on the last hop.
#[tokio::test(start_paused = true)]
async fn a_staged_pool_two_minors_behind_stages_each_hop_after_the_hop_before_it_rebooted() {
    const MID: &str = "v1.14.3";
    const LAST: &str = "v1.15.0";
    let w = world_in(
        FakeCluster::new(&specs(0, 2, FROM, KUBE)),
        Arc::new(MemStore::new()),
        |f| {
            let waves: &[&[&str]] = &[&["w-1"], &["w-2"]];
            let mut first = staged(talos_step(f, "workers", waves, MID, 1), 2);
            let mut second = staged(talos_step(f, "workers", waves, LAST, 1), 2);
            if let (Step::Talos(a), Step::Talos(b)) = (&mut first, &mut second) {
                (a.hop, a.hops, b.hop, b.hops) = (1, 2, 2, 2);
                for t in b.waves.iter_mut().flatten() {
                    t.from = tv(MID);
                }
            }
            vec![first, second]
        },
        &[window()],
    );
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded,
        "{:#?}",
        w.job()
    );
    let s = w.state();
    for n in ["w-1", "w-2"] {
        assert_eq!(s.nodes[n].version, tv(LAST), "{n}\n{:#?}", s.log);
        assert_eq!(
            s.nodes[n].counters.upgrade, 2,
            "{n}: one install per hop\n{:#?}",
            s.log
        );
        assert_eq!(
            s.nodes[n].counters.reboot, 2,
            "{n}: one reboot per hop\n{:#?}",
            s.log
        );
        assert!(!s.nodes[n].cordoned, "{n}");
    }
    // per node: stage(hop 1) < reboot(hop 1) < stage-or-upgrade(hop 2) < reboot(hop 2)
    let all = intents(&w);
    for n in ["w-1", "w-2"] {
        let installs: Vec<_> = all
            .iter()
            .filter(|(_, op, node, action)| match action {
                Action::Stage { nodes } => nodes.iter().any(|t| t.node.node == n),
                _ => *op == CommandOp::Upgrade && node.as_deref() == Some(n),
            })
            .map(|i| i.0)
            .collect();
        let reboots: Vec<_> = all
            .iter()
            .filter(|(_, op, node, _)| *op == CommandOp::Reboot && node.as_deref() == Some(n))
            .map(|i| i.0)
            .collect();
        assert_eq!((installs.len(), reboots.len()), (2, 2), "{n}: {all:#?}");
        assert!(
            installs[0] <= reboots[0] && reboots[0] <= installs[1] && installs[1] <= reboots[1],
            "{n}: installs {installs:?}, reboots {reboots:?}"
        );
    }
    // every hop stages its nodes before their waves: no pull ahead of a wave is ever needed
    assert!(
        !all.iter().any(|i| i.1 == CommandOp::PullAhead),
        "a pull ahead of a node already installed: {all:#?}"
    );
    assert!(staged_not_rebooted(&w.job()).is_empty());
}

/// A staged batch whose install call never reaches a node (a transport error; an install
/// already in progress on the node answers as one, `talos::adapter::upgrade_in_progress`) is
/// resolved by observation and issued again, but only after the executor's backoff, as any
/// lost call: it was issued again at once, in a loop as fast as the journal could write. Once
/// the call gets through, each node is installed exactly once. (Real time on two workers: the
/// loop this guards against never lets paused time advance.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_install_that_never_arrives_is_issued_again_after_a_backoff_not_at_once() {
    let w = world_in(
        FakeCluster::new(&specs(0, 2, FROM, KUBE))
            .with_fault(Fault::UpgradeNeverArrives { node: "w-1".into() }),
        Arc::new(MemStore::new()),
        |f| {
            vec![staged(
                talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1),
                2,
            )]
        },
        &[],
    );
    let mut cfg = w.config();
    cfg.poll = Duration::from_millis(10);
    cfg.backoff_min = Duration::from_millis(300);
    cfg.backoff_max = Duration::from_millis(300);
    let exec = w.executor_with(cfg);
    let id = w.job.clone();
    let run = tokio::spawn(async move { exec.run(&id).await.unwrap() });
    let stage_intents = |w: &World| -> Vec<Timestamp> {
        intents(w)
            .into_iter()
            .filter(|i| i.1 == CommandOp::Stage)
            .map(|i| i.0)
            .collect()
    };
    let mut seen = Vec::new();
    for _ in 0..2000 {
        seen = stage_intents(&w);
        if seen.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(seen.len() >= 3, "issued again: {seen:?}");
    for pair in seen.windows(2) {
        let gap = pair[1].duration_since(pair[0]);
        assert!(
            gap >= jiff::SignedDuration::from_millis(300),
            "issued again after {gap}: {seen:?}"
        );
    }
    w.fake.edit(|s| s.faults.clear());
    assert_eq!(run.await.unwrap(), RunOutcome::Succeeded);
    let s = w.state();
    for n in ["w-1", "w-2"] {
        assert_eq!(s.nodes[n].counters.upgrade, 1, "{n}: installed once");
        assert_eq!(s.nodes[n].counters.reboot, 1, "{n}");
    }
}
