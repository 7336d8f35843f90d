//! `rollout.stage: ahead` (issue #36) on the simulator, through the real adapters: installs
//! ahead of the window, reboots inside it, and a staged node rebooted by someone else.

use medea::desired::window::MaintenanceWindow;
use medea::rollout::TokioClock;
use medea::rollout::sequencer::{NodePhase, Staging, StepKind, staged_not_rebooted};

use super::*;

/// The daily window opens at 02:00; the executor's clock starts this long before it and runs
/// at real speed, so the staging happens outside the window and the reboots inside it.
const BEFORE_WINDOW: Duration = Duration::from_secs(20);

fn window_opens() -> jiff::Timestamp {
    "2026-12-03T02:00:00Z".parse().unwrap()
}

/// Installs a one-step job for `step` behind the daily 02:00 window and runs its executor on a
/// clock [`BEFORE_WINDOW`] before the window opens: (store, job, the running executor).
async fn start_before_the_window(
    sim: &Sim,
    dir: &std::path::Path,
    step: Step,
) -> (
    Arc<dyn Store>,
    medea::rollout::sequencer::JobId,
    tokio::task::JoinHandle<RunOutcome>,
) {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let obs = sim.observed();
    let window = MaintenanceWindow::new("0 2 * * *", Duration::from_secs(3600), "UTC").unwrap();
    let job = install(store.as_ref(), &plan(&obs, vec![step], 1), &obs, &[window]).unwrap();
    let (talos, kube) = adapters(sim).await;
    let mut cfg = ExecutorConfig::new(true, dir.join("snapshots"));
    cfg.poll = Duration::from_millis(20);
    cfg.backoff_min = Duration::from_millis(20);
    cfg.backoff_max = Duration::from_millis(160);
    cfg.max_sleep = Duration::from_millis(200);
    let start = window_opens().checked_sub(BEFORE_WINDOW).unwrap();
    let exec = Arc::new(Executor::new(
        store.clone(),
        talos,
        kube,
        TokioClock::starting_at(start),
        cfg,
    ));
    let run = {
        let job = job.clone();
        tokio::spawn(async move { exec.run(&job).await.unwrap() })
    };
    (store, job, run)
}

fn journal(store: &dyn Store, job: &medea::rollout::sequencer::JobId) -> Vec<JournalEntry> {
    store
        .scan_records::<JournalEntry>(&entries_prefix(job))
        .unwrap()
        .into_iter()
        .map(|(_, e)| e)
        .collect()
}

/// A staged pool of three workers: every node is installed (pulled + `LifecycleService.Upgrade`)
/// before the window and runs its old version until its reboot; w-2, rebooted by "someone
/// else" meanwhile, comes back on the target and is recorded, verified and never installed or
/// rebooted by medea again; inside the window w-1 and w-3 are only cordoned, drained, rebooted
/// and uncordoned: no install, no pull in the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_pool_installs_before_the_window_and_an_external_reboot_is_recorded() {
    let dir = scratch();
    let sim = Sim::start(dir.path(), 1, 3, KubeSimConfig::default()).await;
    let mut step = sim.step("workers", &[&["w-1"], &["w-2"], &["w-3"]], 1, (600, 900));
    if let Step::Talos(t) = &mut step {
        t.stage = Some(medea::plan::StageAhead { parallelism: 2 });
    }
    let (store, job, run) = start_before_the_window(&sim, dir.path(), step).await;
    let load = || {
        medea::ops::jobs::load_job(store.as_ref(), &job)
            .unwrap()
            .unwrap()
    };
    // wait (on progress) until every node is staged
    let deadline = std::time::Instant::now() + BEFORE_WINDOW;
    while staged_not_rebooted(&load()).len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "not staged before the window: {:#?}",
            load()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for n in ["w-1", "w-2", "w-3"] {
        let s = sim.talos.node_state(n).unwrap();
        assert_eq!(s.running, tv(FROM), "{n} still runs its old version");
        assert_eq!(s.installed, Some(tv(TO)), "{n} boots {TO} next");
        assert_eq!(sim.upgrades(n), 1, "{n}: one install");
    }
    // someone else reboots w-2: it boots what was staged
    sim.talos.reboot_externally("w-2").unwrap();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .expect("the rollout ends")
        .unwrap();
    assert_eq!(out, RunOutcome::Succeeded, "{:#?}", load());
    for n in ["w-1", "w-2", "w-3"] {
        assert_eq!(sim.talos.node_state(n).unwrap().running, tv(TO), "{n}");
        assert_eq!(sim.upgrades(n), 1, "{n}: never installed twice");
        assert!(!sim.cordoned(n), "{n} left cordoned");
    }
    assert_eq!(sim.reboots("w-2"), 0, "medea never rebooted w-2");
    assert_eq!(sim.reboots("w-1"), 1);
    assert_eq!(sim.reboots("w-3"), 1);
    let job = load();
    let StepKind::Talos(t) = &job.steps[0].kind else {
        panic!()
    };
    let w2 = t.nodes.iter().find(|n| n.target.node == "w-2").unwrap();
    assert_eq!(w2.phase, NodePhase::Done);
    assert!(
        matches!(w2.staging, Some(Staging::RebootedExternally { .. })),
        "{:?}",
        w2.staging
    );
    let entries = journal(store.as_ref(), &job.id);
    for e in &entries {
        if let Entry::Intent { key, .. } = &e.entry {
            match key.op {
                CommandOp::Stage => assert!(e.at < window_opens(), "staged at {}", e.at),
                CommandOp::Upgrade | CommandOp::Pull | CommandOp::PullAhead => {
                    panic!("an install or pull in the window: {key}")
                }
                CommandOp::Cordon | CommandOp::Reboot => {
                    assert!(
                        e.at >= window_opens(),
                        "{key} at {}: outside the window",
                        e.at
                    );
                    assert_ne!(key.node.as_deref(), Some("w-2"), "{key}");
                }
                _ => {}
            }
        }
    }
}

/// A staged control-plane pool on the simulator (issue #36 item 1): the etcd snapshot comes
/// before the first install, the control-plane nodes install ahead one at a time (an install's
/// result is journaled before the next node's intent), all before the window; inside the window
/// each is only cordoned, drained and rebooted, and each installs and reboots exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_control_plane_snapshots_first_and_installs_one_node_at_a_time_before_the_window()
{
    let dir = scratch();
    let sim = Sim::start(dir.path(), 3, 0, KubeSimConfig::default()).await;
    let mut step = sim.step(
        "control-plane",
        &[&["cp-1"], &["cp-2"], &["cp-3"]],
        1,
        (600, 900),
    );
    if let Step::Talos(t) = &mut step {
        t.stage = Some(medea::plan::StageAhead { parallelism: 1 });
    }
    let (store, job, run) = start_before_the_window(&sim, dir.path(), step).await;
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the rollout ends")
        .unwrap();
    let load = || {
        medea::ops::jobs::load_job(store.as_ref(), &job)
            .unwrap()
            .unwrap()
    };
    assert_eq!(out, RunOutcome::Succeeded, "{:#?}", load());
    for n in ["cp-1", "cp-2", "cp-3"] {
        assert_eq!(sim.talos.node_state(n).unwrap().running, tv(TO), "{n}");
        assert_eq!(sim.upgrades(n), 1, "{n}: installed once");
        assert_eq!(sim.reboots(n), 1, "{n}: rebooted once, by medea");
        assert!(!sim.cordoned(n), "{n} left cordoned");
    }
    assert!(sim.snapshots() >= 1, "no etcd snapshot was taken");
    let entries = journal(store.as_ref(), &job);
    let intents: Vec<(usize, &JournalEntry, &medea::rollout::sequencer::CommandKey)> = entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match &e.entry {
            Entry::Intent { key, .. } => Some((i, e, key)),
            _ => None,
        })
        .collect();
    let first = |op: CommandOp| {
        intents
            .iter()
            .find(|(_, _, k)| k.op == op)
            .map(|(i, _, _)| *i)
            .unwrap_or_else(|| panic!("no {op:?} intent in {entries:#?}"))
    };
    assert!(
        first(CommandOp::Snapshot) < first(CommandOp::Stage),
        "the first install ahead came before the etcd snapshot"
    );
    let stages: Vec<_> = intents
        .iter()
        .filter(|(_, _, k)| k.op == CommandOp::Stage)
        .collect();
    assert_eq!(stages.len(), 3, "one install ahead per control-plane node");
    for pair in stages.windows(2) {
        let (i, _, key) = pair[0];
        let (next, _, _) = pair[1];
        let done = entries[*i..*next]
            .iter()
            .any(|e| matches!(&e.entry, Entry::Result { key: k, .. } if k == *key));
        assert!(
            done,
            "{key} was still installing when the next node's install began"
        );
    }
    for (_, e, key) in &intents {
        match key.op {
            CommandOp::Stage => assert!(e.at < window_opens(), "{key} at {}", e.at),
            CommandOp::Upgrade | CommandOp::Pull | CommandOp::PullAhead => {
                panic!("an install or pull in the window: {key}")
            }
            CommandOp::Cordon | CommandOp::Reboot => {
                assert!(
                    e.at >= window_opens(),
                    "{key} at {}: outside the window",
                    e.at
                )
            }
            _ => {}
        }
    }
}
