//! Crash injection on the simulator: the crash harness's world, every journal point, a node
//! that cannot tell its next boot, the debug runner's checks and health gates.

use super::*;

/// The crash harness's world on the simulator: `SimTalos` + the simulated kube-apiserver in
/// this process (on a runtime of their own, so they keep serving while the test thread waits
/// for the child), a fjall store seeded with the mixed 3 + 3 job, and a child
/// `medea __rollout-run --creds-dir <dir>/creds --cluster prod` that reaches the simulator
/// through the real adapters. The summary comes from the simulator's counters.
pub struct SimWorld {
    // dropped before the runtime that serves them
    pub(super) sim: Sim,
    pub(super) dir: PathBuf,
    _rt: tokio::runtime::Runtime,
}

impl SimWorld {
    fn prepare_with(dir: &Path, grub: &[&str]) -> SimWorld {
        SimWorld::prepare_full(dir, grub, &[])
    }

    /// [`SimWorld::prepare_with`], the job made with the cluster's backup `recipients` (its
    /// etcd snapshot is then saved encrypted to them, issue #49).
    pub(super) fn prepare_full(
        dir: &Path,
        grub: &[&str],
        recipients: &[medea::desired::backup::Recipient],
    ) -> SimWorld {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let sim = rt.block_on(Sim::start(dir, 3, 3, KubeSimConfig::default()));
        for n in grub {
            sim.talos.set_bootloader(n, Bootloader::Grub).unwrap();
        }
        let store = FjallStore::open(&dir.join("store")).unwrap();
        let obs = sim.observed();
        crate::rollout::install_full(
            &store,
            &plan(&obs, sim.mixed(), 9),
            &obs,
            &[],
            &[],
            recipients,
        )
        .unwrap();
        drop(store);
        SimWorld {
            sim,
            dir: dir.to_path_buf(),
            _rt: rt,
        }
    }

    pub(super) fn job(&self) -> Job {
        let store = FjallStore::open(&self.store()).unwrap();
        let jobs = medea::ops::jobs::load_jobs(&store).unwrap();
        assert_eq!(jobs.len(), 1);
        jobs.into_iter().next().unwrap()
    }

    pub(super) fn journal(&self) -> Vec<JournalEntry> {
        let job = self.job();
        let store = FjallStore::open(&self.store()).unwrap();
        store
            .scan_records::<JournalEntry>(&entries_prefix(&job.id))
            .unwrap()
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    }
}

impl CrashWorld for SimWorld {
    fn prepare(dir: &Path) -> SimWorld {
        SimWorld::prepare_with(dir, &[])
    }

    fn child(&self) -> Command {
        let mut c = crate::cli::medea();
        c.arg("__rollout-run")
            .arg("--rollouts")
            .arg("--store")
            .arg(self.dir.join("store"))
            .arg("--creds-dir")
            .arg(&self.sim.creds)
            .arg("--cluster")
            .arg(CLUSTER)
            .arg("--snapshots")
            .arg(self.dir.join("snapshots"))
            .arg("--poll-ms")
            .arg("10")
            .env_remove("MEDEA_CRASH_AT")
            .env_remove("MEDEA_CRASH_AFTER")
            .env_remove("MEDEA_CRASH_BEFORE");
        c
    }

    fn summary(&self) -> Summary {
        let mut log = Vec::new();
        let nodes = self
            .sim
            .names
            .iter()
            .map(|n| {
                let s = self.sim.talos.node_state(n).unwrap();
                let c = self.sim.talos.counters(n).unwrap();
                log.push(format!("{n}: {c:?}"));
                (
                    n.clone(),
                    (
                        s.running,
                        self.sim.cordoned(n),
                        c.upgrades() as u32,
                        c.calls(Method::Reboot) as u32,
                    ),
                )
            })
            .collect();
        Summary {
            nodes,
            snapshots: self.sim.snapshots() as u32,
            tainted: self
                .sim
                .names
                .iter()
                .filter(|n| {
                    self.sim.kube.taints(n).unwrap().iter().any(|t| {
                        t.starts_with(&format!("{}=", medea::rollout::ports::PACING_TAINT_KEY))
                    })
                })
                .cloned()
                .collect(),
            log,
        }
    }

    fn store(&self) -> PathBuf {
        self.dir.join("store")
    }
}

/// Kill the child at journal point `n` of `var`, restart it; `false` if it never got there.
pub(super) fn crash_at(w: &SimWorld, var: &str, n: u64) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let first = w.child().env(var, n.to_string()).output().unwrap();
    if first.status.success() {
        return false;
    }
    assert_eq!(
        first.status.signal(),
        Some(6),
        "{var}={n}: the child must die by abort, not fail: {}\n{}",
        String::from_utf8_lossy(&first.stdout),
        String::from_utf8_lossy(&first.stderr)
    );
    let again = w.child().output().unwrap();
    assert!(
        again.status.success(),
        "{var}={n}: the restarted child failed: {}\n{}",
        String::from_utf8_lossy(&again.stdout),
        String::from_utf8_lossy(&again.stderr)
    );
    true
}

/// Crash runs in flight at once: each is a simulator plus a child, and about half of a run is
/// waiting (reboots, polls), so a few overlap well even on two cores.
const PARALLEL_RUNS: usize = 3;

/// Run `points` (`(variable, N)`) on fresh worlds, [`PARALLEL_RUNS`] at a time; panics listing
/// every point whose run failed.
fn crash_points(points: &[(&'static str, u64)]) {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..PARALLEL_RUNS {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(&(var, n)) = points.get(i) else {
                        return;
                    };
                    let r = std::panic::catch_unwind(|| {
                        let dir = scratch();
                        let w = SimWorld::prepare(dir.path());
                        assert!(crash_at(&w, var, n), "{var}={n} was reached");
                        check_rolled_out(&w, &format!("{var}={n}"));
                    });
                    if let Err(e) = r {
                        let msg = e
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        failures.lock().unwrap().push(format!("{var}={n}: {msg}"));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The crash harness on the simulator: the child is killed at **every** journal point, then
/// restarted. `MEDEA_CRASH_AT=N` aborts right after commit N is durable, for every N: that is
/// every state a crash can leave in which the journal is complete. The one other state is
/// "call made, outcome never journaled" (the case the at-most-once argument is about), and it
/// exists only between an intent and its result: `MEDEA_CRASH_BEFORE=N` at every result.
/// `BEFORE` at an intent or a progress entry is not run separately: between the previous
/// commit and it only observations happen, so it leaves the state of `AT` the previous point.
///
/// Each run ends with the job Succeeded, every node on the target, exactly one Upgrade and one
/// Reboot per node (simulator counters), nobody cordoned and one etcd snapshot.
#[test]
fn killed_at_journal_points_the_simulated_rollout_completes_exactly_once() {
    // the clean run: the journal points and what each one records
    let dir = scratch();
    let w = SimWorld::prepare(dir.path());
    let clean = w.child().output().unwrap();
    assert!(
        clean.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&clean.stdout),
        String::from_utf8_lossy(&clean.stderr)
    );
    check_rolled_out(&w, "clean run");
    let journal = w.journal();
    let points = w.job().journal_seq;
    assert!(
        points > 50,
        "a 6-node rollout has many journal points ({points})"
    );
    drop(w);

    let mut runs: Vec<(&'static str, u64)> = Vec::new();
    let mut critical = 0;
    for e in journal.iter().filter(|e| e.seq >= 1) {
        runs.push(("MEDEA_CRASH_AT", e.seq));
        match &e.entry {
            Entry::Intent { key, .. }
                if matches!(key.op, CommandOp::Upgrade | CommandOp::Reboot) =>
            {
                critical += 1
            }
            Entry::Result { .. } => runs.push(("MEDEA_CRASH_BEFORE", e.seq)),
            _ => {}
        }
    }
    assert_eq!(
        runs.iter().filter(|(v, _)| *v == "MEDEA_CRASH_AT").count() as u64,
        points,
        "every journal point is a crash point"
    );
    assert_eq!(critical, 12, "an Upgrade and a Reboot intent per node");
    let started = std::time::Instant::now();
    crash_points(&runs);
    eprintln!(
        "crash harness: {} runs ({points} journal points) in {:?}",
        runs.len(),
        started.elapsed()
    );
}

/// A node that cannot report its next boot (GRUB): a crash right after its Upgrade intent
/// (the call never made) and right before its Upgrade result (the call made, the reply never
/// journaled) both halt the restarted job, naming the node, with at most the one Upgrade:
/// never a second one on a guess.
#[test]
fn a_crash_around_the_upgrade_of_a_node_that_cannot_tell_halts_with_at_most_one_upgrade() {
    // find w-3's Upgrade intent and result in a clean run of the same rollout
    let dir = scratch();
    let w = SimWorld::prepare_with(dir.path(), &["w-3"]);
    assert!(w.child().output().unwrap().status.success());
    check_rolled_out(&w, "clean run with a GRUB node");
    let journal = w.journal();
    let seq_of = |want_intent: bool| {
        journal
            .iter()
            .find(|e| match &e.entry {
                Entry::Intent { key, .. } if want_intent => {
                    key.op == CommandOp::Upgrade && key.node.as_deref() == Some("w-3")
                }
                Entry::Result { key, .. } if !want_intent => {
                    key.op == CommandOp::Upgrade && key.node.as_deref() == Some("w-3")
                }
                _ => false,
            })
            .map(|e| e.seq)
            .unwrap()
    };
    let (intent, result) = (seq_of(true), seq_of(false));
    drop(w);

    for (var, n, upgrades) in [
        ("MEDEA_CRASH_AT", intent, 0),
        ("MEDEA_CRASH_BEFORE", result, 1),
    ] {
        let dir = scratch();
        let w = SimWorld::prepare_with(dir.path(), &["w-3"]);
        let first = w.child().env(var, n.to_string()).output().unwrap();
        assert!(!first.status.success(), "{var}={n} was reached");
        let again = w.child().output().unwrap();
        assert_eq!(again.status.code(), Some(1), "the job does not succeed");
        let job = w.job();
        let JobState::Halted { reason, node, .. } = &job.state else {
            panic!("{var}={n}: expected a halt, got {:?}", job.state);
        };
        assert_eq!(
            reason.code(),
            HaltCode::OutcomeUnknown,
            "{var}={n}: {reason}"
        );
        assert!(
            reason
                .message()
                .contains("cannot tell whether the upgrade of `w-3` ran"),
            "{var}={n}: {reason}"
        );
        assert_eq!(node.as_deref(), Some("w-3"));
        assert_eq!(w.sim.upgrades("w-3"), upgrades, "{var}={n}");
        assert_eq!(w.sim.reboots("w-3"), 0, "{var}={n}");
        for other in ["cp-1", "cp-2", "cp-3", "w-1", "w-2"] {
            assert_eq!(w.sim.upgrades(other), 1, "{var}={n}: {other}");
        }
    }
}

#[test]
fn the_harness_command_checks_the_credentials_before_touching_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let out = crate::cli::medea()
        .args(["__rollout-run", "--store"])
        .arg(&store)
        .arg("--creds-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--cluster"), "{err}");
    let out = crate::cli::medea()
        .args(["__rollout-run", "--store"])
        .arg(&store)
        .arg("--creds-dir")
        .arg(dir.path())
        .args(["--cluster", "prod"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("talosconfig of cluster `prod`"), "{err}");
    assert!(!store.exists(), "nothing created");
    let out = crate::cli::medea()
        .args(["__rollout-run", "--store"])
        .arg(&store)
        .arg("--creds-dir")
        .arg(dir.path())
        .args(["--cluster", "../etc"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot name a credentials directory"));
}

/// `medea __rollout-run --creds-dir` evaluates health gates with the same probes as `medea
/// serve` (it used `NoProbe`, which fails every gate): a workloads gate on the simulator's
/// kube-system DaemonSets passes and the gated job runs to the end.
#[test]
fn the_debug_runner_evaluates_gates_with_real_probes() {
    use medea::plan::health::{
        Gate, GateCheck, HealthPolicy, HealthSources, OnFailure, WorkloadKind,
    };
    let dir = scratch();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sim = rt.block_on(Sim::start(dir.path(), 3, 1, KubeSimConfig::default()));
    let store_dir = dir.path().join("store");
    {
        let store = FjallStore::open(&store_dir).unwrap();
        let obs = sim.observed();
        let mut p = plan(
            &obs,
            vec![sim.step("workers", &[&["w-1"]], 1, (600, 900))],
            9,
        );
        std::sync::Arc::make_mut(&mut p.clusters[0]).health = Some(HealthPolicy {
            sources: HealthSources::default(),
            gates: vec![Gate {
                name: "system-daemonsets".into(),
                dry_run: false,
                consecutive_error_limit: medea::plan::health::DEFAULT_CONSECUTIVE_ERROR_LIMIT,
                on_inconclusive: Default::default(),
                check: GateCheck::Workloads {
                    namespaces: vec!["kube-system".into()],
                    kinds: vec![WorkloadKind::DaemonSet],
                },
            }],
            soak: Duration::ZERO,
            interval: Duration::from_millis(200),
            // a DaemonSet pod of the rebooted node takes a moment to be Ready again
            failure_limit: 100,
            inconclusive_limit: 1,
            on_failure: OnFailure::Halt,
        });
        install(&store, &p, &obs, &[]).unwrap();
    }
    let out = crate::cli::medea()
        .arg("__rollout-run")
        .arg("--rollouts")
        .arg("--store")
        .arg(&store_dir)
        .arg("--creds-dir")
        .arg(&sim.creds)
        .arg("--cluster")
        .arg(CLUSTER)
        .arg("--snapshots")
        .arg(dir.path().join("snapshots"))
        .arg("--poll-ms")
        .arg("10")
        .env_remove("MEDEA_CRASH_AT")
        .env_remove("MEDEA_CRASH_AFTER")
        .env_remove("MEDEA_CRASH_BEFORE")
        .output()
        .unwrap();
    let store = FjallStore::open(&store_dir).unwrap();
    let jobs = medea::ops::jobs::load_jobs(&store).unwrap();
    assert!(
        matches!(jobs[0].state, JobState::Succeeded { .. }),
        "{}\n{}\n{:#?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        jobs[0].state
    );
    assert_eq!(sim.upgrades("w-1"), 1);
    drop(store);
    drop(sim);
}
