//! Crash harness: a child medea killed at every journal point.

use std::path::{Path, PathBuf};
use std::process::Command;

use medea::store::fjall::FjallStore;

use super::*;

/// What the harness checks after each run, whatever the cluster is made of.
#[derive(Debug)]
pub struct Summary {
    /// Node → (running version, cordoned, Upgrade calls, Reboot calls).
    pub nodes: BTreeMap<String, (TalosVersion, bool, u32, u32)>,
    pub snapshots: u32,
    /// Accepted mutating calls, for failure messages.
    pub log: Vec<String>,
    /// Nodes that still carry medea's pacing taint (`medea.dev/upgrade-pending`, issue #35).
    pub tainted: Vec<String>,
}

/// A cluster that survives the child's death, and how to run the child against it.
/// `FakeWorld` keeps the cluster in a JSON file; a simulator world runs `medea sim`, seeds
/// the store the same way, points the child at the simulator, and reads the simulator's
/// side-effect counters into a [`Summary`].
pub trait CrashWorld {
    fn prepare(dir: &Path) -> Self;
    /// `medea __rollout-run ...` for this world (without crash variables).
    fn child(&self) -> Command;
    /// The cluster's state and side-effect counters.
    fn summary(&self) -> Summary;
    fn store(&self) -> PathBuf;
}

pub struct FakeWorld {
    dir: PathBuf,
}

impl CrashWorld for FakeWorld {
    fn prepare(dir: &Path) -> FakeWorld {
        let fake = FakeCluster::new(&specs(3, 3, FROM, KUBE));
        fake.save(&dir.join("cluster.json")).unwrap();
        let store = FjallStore::open(&dir.join("store")).unwrap();
        let obs = observed(&fake);
        let p = plan(&obs, mixed_steps(&fake), 9);
        install(&store, &p, &obs, &[]).unwrap();
        drop(store);
        FakeWorld {
            dir: dir.to_path_buf(),
        }
    }
    fn child(&self) -> Command {
        let mut c = crate::cli::medea();
        c.arg("__rollout-run")
            .arg("--rollouts")
            .arg("--store")
            .arg(self.dir.join("store"))
            .arg("--fake-state")
            .arg(self.dir.join("cluster.json"))
            .arg("--snapshots")
            .arg(self.dir.join("snapshots"))
            .env_remove("MEDEA_CRASH_AT")
            .env_remove("MEDEA_CRASH_AFTER")
            .env_remove("MEDEA_CRASH_BEFORE");
        c
    }
    fn summary(&self) -> Summary {
        let s = FakeCluster::persistent(&self.dir.join("cluster.json"))
            .unwrap()
            .state();
        Summary {
            nodes: s
                .nodes
                .iter()
                .map(|(k, n)| {
                    (
                        k.clone(),
                        (
                            n.version.clone(),
                            n.cordoned,
                            n.counters.upgrade,
                            n.counters.reboot,
                        ),
                    )
                })
                .collect(),
            snapshots: s.snapshots,
            tainted: s
                .nodes
                .iter()
                .filter(|(_, n)| {
                    n.taints
                        .iter()
                        .any(|t| t.key == medea::rollout::ports::PACING_TAINT_KEY)
                })
                .map(|(k, _)| k.clone())
                .collect(),
            log: s.log,
        }
    }
    fn store(&self) -> PathBuf {
        self.dir.join("store")
    }
}

/// [`FakeWorld`] with both pools staged ahead (`rollout.stage: ahead`, issue #36): the installs
/// are `stage` batches, and no `upgrade` command is ever made.
pub struct StagedFakeWorld(FakeWorld);

impl CrashWorld for StagedFakeWorld {
    fn prepare(dir: &Path) -> StagedFakeWorld {
        let fake = FakeCluster::new(&specs(3, 3, FROM, KUBE));
        fake.save(&dir.join("cluster.json")).unwrap();
        let store = FjallStore::open(&dir.join("store")).unwrap();
        let obs = observed(&fake);
        let p = plan(&obs, staged_mixed_steps(&fake), 9);
        install(&store, &p, &obs, &[]).unwrap();
        drop(store);
        StagedFakeWorld(FakeWorld {
            dir: dir.to_path_buf(),
        })
    }
    fn child(&self) -> Command {
        self.0.child()
    }
    fn summary(&self) -> Summary {
        // every install went through a staged batch
        let store = FjallStore::open(&self.store()).unwrap();
        let jobs = medea::ops::jobs::load_jobs(&store).unwrap();
        let ops: Vec<CommandOp> = store
            .scan_records::<JournalEntry>(&entries_prefix(&jobs[0].id))
            .unwrap()
            .into_iter()
            .filter_map(|(_, e)| match e.entry {
                Entry::Intent { key, .. } => Some(key.op),
                _ => None,
            })
            .collect();
        drop(store);
        assert!(ops.contains(&CommandOp::Stage), "{ops:?}");
        assert!(!ops.contains(&CommandOp::Upgrade), "{ops:?}");
        self.0.summary()
    }
    fn store(&self) -> PathBuf {
        self.0.store()
    }
}

/// Scratch space on tmpfs when there is one (the harness fsyncs a lot).
pub fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::tempdir_in(shm)
    {
        return d;
    }
    tempfile::tempdir().unwrap()
}

/// For N = 1, 2, …: run the rollout with the child aborting at journal point N (`var`),
/// restart it, and check the outcome; stop at the first N the child never reaches.
/// Returns the number of journal points.
pub fn harness<W: CrashWorld>(var: &str) -> u64 {
    for n in 1u64.. {
        let dir = scratch();
        let w = W::prepare(dir.path());
        let first = w.child().env(var, n.to_string()).output().unwrap();
        if first.status.success() {
            assert!(n > 1, "the rollout has journal points");
            check(&w, &format!("{var}={n} (never reached)"));
            // every executor commit is one journal entry after the creation (seq 0)
            let store = FjallStore::open(&w.store()).unwrap();
            let jobs = medea::ops::jobs::load_jobs(&store).unwrap();
            assert_eq!(jobs[0].journal_seq, n - 1, "journal points");
            return n - 1;
        }
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            first.status.signal(),
            Some(6),
            "{var}={n}: the child must die by abort, not fail: {}",
            String::from_utf8_lossy(&first.stderr)
        );
        let again = w.child().output().unwrap();
        assert!(
            again.status.success(),
            "{var}={n}: the restarted child failed: {}\n{}",
            String::from_utf8_lossy(&again.stdout),
            String::from_utf8_lossy(&again.stderr)
        );
        check(&w, &format!("{var}={n}"));
    }
    unreachable!()
}

pub fn check<W: CrashWorld>(w: &W, what: &str) {
    let s = w.summary();
    assert_eq!(s.nodes.len(), 6);
    for (name, (version, cordoned, upgrades, reboots)) in &s.nodes {
        assert_eq!(version, &tv(TO), "{what}: {name} on target");
        assert!(!cordoned, "{what}: {name} left cordoned");
        assert_eq!(*upgrades, 1, "{what}: {name} Upgrade calls\n{:#?}", s.log);
        assert_eq!(*reboots, 1, "{what}: {name} Reboot calls\n{:#?}", s.log);
    }
    assert_eq!(s.snapshots, 1, "{what}: one snapshot");
    assert!(
        s.tainted.is_empty(),
        "{what}: pacing taints left on {:?}\n{:#?}",
        s.tainted,
        s.log
    );
    let store = FjallStore::open(&w.store()).unwrap();
    let jobs = medea::ops::jobs::load_jobs(&store).unwrap();
    assert_eq!(jobs.len(), 1);
    assert!(
        matches!(jobs[0].state, JobState::Succeeded { .. }),
        "{what}: {:?}",
        jobs[0].state
    );
}

#[test]
fn killed_after_every_journal_write_the_rollout_completes_exactly_once() {
    let points = harness::<FakeWorld>("MEDEA_CRASH_AT");
    assert!(
        points > 50,
        "a 6-node rollout has many journal points ({points})"
    );
}

#[test]
fn killed_before_every_journal_write_the_rollout_completes_exactly_once() {
    let points = harness::<FakeWorld>("MEDEA_CRASH_BEFORE");
    assert!(points > 50, "{points}");
}

/// Issue #36: the staged 3 + 3 rollout killed after every journal write (staging intents and
/// results included): exactly one install (staged, never in the window) and one reboot per
/// node, whatever the crash.
#[test]
fn killed_after_every_journal_write_the_staged_rollout_completes_exactly_once() {
    let points = harness::<StagedFakeWorld>("MEDEA_CRASH_AT");
    assert!(points > 40, "{points}");
}

/// Issue #36: killed right before each journal write, i.e. after the calls a result records
/// (a staged batch installed, its result never journaled): resolved by observation, never
/// installed twice.
#[test]
fn killed_before_every_journal_write_the_staged_rollout_completes_exactly_once() {
    let points = harness::<StagedFakeWorld>("MEDEA_CRASH_BEFORE");
    assert!(points > 40, "{points}");
}

#[test]
fn the_harness_command_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let out = crate::cli::medea()
        .args(["__rollout-run", "--store"])
        .arg(dir.path().join("store"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--fake-state"), "{err}");
    assert!(!dir.path().join("store").exists(), "nothing created");
    let out = crate::cli::medea()
        .args(["__rollout-run", "--store"])
        .arg(dir.path().join("store"))
        .arg("--fake-state")
        .arg(dir.path().join("missing.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot load the fake cluster"));
}
