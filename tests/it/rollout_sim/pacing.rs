//! Pacing (issue #35 item 4) on the simulator: the next wave's nodes are tainted
//! `PreferNoSchedule` so pods evicted now land elsewhere, the taints are gone after the job
//! (someone else's taint with the same key stays), and a wave's budget counts a node of the
//! pool that is already NotReady. What the simulated cluster did is read from its own record
//! of cordons and bindings ([`medea::sim::kube::KubeSim::history`]).

use super::*;
use medea::rollout::ports::{KubePort, NodeTaint, PACING_TAINT_KEY};
use medea::sim::kube::ClusterRecord;

/// One control-plane node, workers w-1..w-4, and a Deployment of 8 replicas (without a PDB)
/// spread over the workers; waits until every replica runs.
async fn sim_with_web(dir: &Path) -> Sim {
    use medea::sim::kube::scenario;
    let mut objects = scenario::platform();
    objects.extend(scenario::workload("default", "spread", 8, None));
    let sim = Sim::start(
        dir,
        1,
        4,
        KubeSimConfig {
            objects,
            ..KubeSimConfig::default()
        },
    )
    .await;
    for _ in 0..1000 {
        let ready = sim
            .kube
            .pods()
            .iter()
            .filter(|p| p.name.starts_with("spread-") && p.ready)
            .count();
        if ready == 8 {
            return sim;
        }
        // the simulator's controllers create and schedule pods in the background
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the 8 replicas never all ran: {:#?}", sim.kube.pods());
}

/// The job's journal, in order.
fn journal(run: &Run) -> Vec<JournalEntry> {
    run.store
        .scan_records::<JournalEntry>(&entries_prefix(&run.job))
        .unwrap()
        .into_iter()
        .map(|(_, e)| e)
        .collect()
}

/// The pods bound to `node` while `cordoned` was cordoned (first cordon to its uncordon).
fn bound_while_cordoned(history: &[ClusterRecord], cordoned: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut out = Vec::new();
    for r in history {
        match r {
            ClusterRecord::Cordoned(n) if n == cordoned => inside = true,
            ClusterRecord::Uncordoned(n) if n == cordoned => return out,
            ClusterRecord::Bound { pod, node } if inside => out.push((pod.clone(), node.clone())),
            _ => {}
        }
    }
    out
}

/// The most `nodes` cordoned at once in `history`, up to (not including) the first cordon of
/// any of `until`.
fn max_cordoned(history: &[ClusterRecord], nodes: &[&str], until: &[&str]) -> usize {
    let mut now = std::collections::BTreeSet::new();
    let mut max = 0;
    for r in history {
        match r {
            ClusterRecord::Cordoned(n) if until.contains(&n.as_str()) => break,
            ClusterRecord::Cordoned(n) if nodes.contains(&n.as_str()) => {
                now.insert(n.clone());
                max = max.max(now.len());
            }
            ClusterRecord::Uncordoned(n) => {
                now.remove(n);
            }
            _ => {}
        }
    }
    max
}

/// Waves [w-1], [w-2], [w-3], [w-4]: while w-1 drains, w-2 (next) carries medea's taint and
/// w-4 an operator's `medea.dev/upgrade-pending=operator:PreferNoSchedule`, so w-1's evicted
/// replicas land on w-3, never on w-2 (without the taints the scheduler's spread puts one on
/// w-2, the least loaded by name). After the job no node carries the job's taint and the
/// operator's taint is still on w-4, untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_pods_avoid_the_next_wave_and_the_taints_are_gone_after_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim_with_web(dir.path()).await;
    let (_, kube) = adapters(&sim).await;
    let operator = NodeTaint {
        key: PACING_TAINT_KEY.into(),
        value: "operator".into(),
        effect: "PreferNoSchedule".into(),
    };
    kube.taint("w-4", &operator).await.unwrap();
    let on_w1 = sim
        .kube
        .pods_on("w-1")
        .iter()
        .filter(|p| p.name.starts_with("spread-"))
        .count();
    assert!(on_w1 > 0, "w-1 runs replicas: {:#?}", sim.kube.pods());

    let steps = vec![sim.step(
        "workers",
        &[&["w-1"], &["w-2"], &["w-3"], &["w-4"]],
        1,
        (60, 60),
    )];
    let run = run_for(&sim, dir.path(), steps).await;
    let out = run.go().await;
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");

    let history = sim.kube.history();
    let moved = bound_while_cordoned(&history, "w-1");
    let replicas: Vec<&(String, String)> = moved
        .iter()
        .filter(|(pod, _)| pod.starts_with("default/spread-"))
        .collect();
    assert!(
        replicas.len() >= on_w1,
        "w-1's {on_w1} replicas were scheduled again while it was cordoned: {history:#?}"
    );
    assert!(
        replicas.iter().all(|(_, node)| node == "w-3"),
        "evicted replicas land on w-3 (w-2 is the next wave, w-4 carries an operator's taint): {replicas:?}"
    );

    let job = run.job.to_string();
    for n in ["w-1", "w-2", "w-3", "w-4"] {
        let taints = sim.kube.taints(n).unwrap();
        assert!(
            !taints.iter().any(|t| t.contains(&job)),
            "{n} still carries the job's taint: {taints:?}"
        );
    }
    assert_eq!(
        sim.kube.taints("w-4").unwrap(),
        ["medea.dev/upgrade-pending=operator:PreferNoSchedule"],
        "someone else's taint with medea's key is left alone"
    );
    // medea tainted each node of a next wave, and removed each taint it put
    let journal = journal(&run);
    let intents = |op: CommandOp| {
        journal
            .iter()
            .filter_map(|e| match &e.entry {
                Entry::Intent { key, .. } if key.op == op => key.node.clone(),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(intents(CommandOp::Taint), ["w-2", "w-3", "w-4"]);
    assert_eq!(intents(CommandOp::Untaint), ["w-2", "w-3", "w-4"]);
}

/// Waves [w-1, w-2], [w-3, w-4] with `maxUnavailable: 2`, and w-4 NotReady (its kubelet,
/// whatever Talos says) until wave 1 is over: wave 1 starts with one slot, so w-1 and w-2 are
/// never cordoned together; wave 2, with every other node back, drains two at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_with_a_node_already_notready_drains_one_fewer_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 4, KubeSimConfig::default()).await;
    sim.kube
        .inject(KubeFault::NodeNeverReady { node: "w-4".into() });
    let steps = vec![sim.step("workers", &[&["w-1", "w-2"], &["w-3", "w-4"]], 2, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let mut events = run.exec.subscribe();
    let kube = sim.kube.clone();
    // w-4 recovers once wave 1 is over (w-2, the second of wave 1, uncordoned)
    let recover = tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(e)
                    if e.node.as_deref() == Some("w-2")
                        && e.op == Some(CommandOp::Uncordon)
                        && matches!(e.state, EventState::Done) =>
                {
                    kube.clear_faults();
                    return true;
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return false,
            }
        }
    });
    let out = run.go().await;
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    assert!(recover.await.unwrap(), "wave 1 ended");
    let history = sim.kube.history();
    assert_eq!(
        max_cordoned(&history, &["w-1", "w-2"], &["w-3", "w-4"]),
        1,
        "wave 1 runs with one slot (w-4 NotReady): {history:#?}"
    );
    assert_eq!(
        max_cordoned(&history, &["w-3", "w-4"], &[]),
        2,
        "wave 2 has both slots back: {history:#?}"
    );
    let budgets: Vec<String> = journal(&run)
        .into_iter()
        .flat_map(|e| e.notes)
        .filter(|n| n.contains("already unavailable"))
        .collect();
    assert!(
        budgets
            .iter()
            .any(|n| n == "wave 1: pool workers: 1 node already unavailable (w-4 NotReady); 1 of 2 slots left"),
        "{budgets:?}"
    );
}

/// With no slot left (the control plane's one, taken by a control-plane node someone else
/// cordoned), the wave waits and then halts `pool_unavailable` naming the node, having touched
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_with_a_node_cordoned_by_someone_else_halts_pool_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 0, KubeSimConfig::default()).await;
    let (_, kube) = adapters(&sim).await;
    kube.cordon("cp-3", "someone-else").await.unwrap();
    let steps = vec![sim.step(
        "control-plane",
        &[&["cp-1"], &["cp-2"], &["cp-3"]],
        1,
        (60, 1),
    )];
    let run = run_for(&sim, dir.path(), steps).await;
    let out = run.go().await;
    let text = halted_with(&out, HaltCode::PoolUnavailable);
    assert!(text.contains("cp-3 cordoned"), "{text}");
    assert!(text.contains("0 of 1 slot left"), "{text}");
    for n in ["cp-1", "cp-2"] {
        assert!(!sim.cordoned(n), "{n} untouched");
        assert_eq!(sim.upgrades(n), 0, "{n} untouched");
    }
    assert!(sim.cordoned("cp-3"), "the operator's cordon stays");
}
