//! Retention of the rollout's pre-upgrade etcd snapshots (issue #49 item 7).
//!
//! Before the first control-plane change of a job the executor saves an etcd snapshot in
//! `<state-dir>/snapshots/` (architecture.md, safety invariant 2): encrypted to the cluster's
//! backup recipients as `<job-id>.db.age` with its record `<job-id>.db.age.json` when the
//! cluster has `spec.backup` (`rollout::executor::snapshot`), else plaintext `<job-id>.db`
//! (0600 in a 0700 directory). They used to be kept forever. Each holds every Secret of its
//! cluster, so they are pruned: a snapshot goes when it is not among the [`KEEP`] newest, or is
//! older than [`MAX_AGE`], **unless its job is still running** (a running job's executor
//! re-observes its snapshot after a crash, so it is never touched) — and the newest one always
//! stays. An encrypted snapshot goes with its record. What an interrupted attempt left (a
//! `.part` file, a record without its snapshot) goes once its job is no longer running. The
//! scheduled backups (`backup`) are the restore points meant to be kept; these are the
//! rollout's own safety net.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::store::Store;

/// How many pre-upgrade snapshots are kept (the newest).
pub const KEEP: usize = 10;
/// The oldest a pre-upgrade snapshot of an ended job is kept: 14 days, enough to notice a bad
/// upgrade and go back, short enough that a laptop or a replica does not collect every
/// cluster's Secrets for ever.
pub const MAX_AGE: Duration = Duration::from_secs(14 * 24 * 3600);

/// Why pruning failed.
#[derive(Debug, thiserror::Error)]
pub enum PruneError {
    /// The directory or a file could not be read or removed.
    #[error("pruning pre-upgrade snapshots in `{}` failed", dir.display())]
    Io {
        /// The snapshots directory.
        dir: PathBuf,
        /// Why.
        #[source]
        err: std::io::Error,
    },
    /// The jobs could not be read (nothing was removed).
    #[error("reading the rollout jobs failed; no pre-upgrade snapshot was pruned")]
    Store(#[source] crate::store::StoreError),
}

/// Remove the pre-upgrade snapshots of `dir` that retention lets go (see the module's doc) at
/// `now`. Returns the files removed. A missing directory is nothing to prune.
pub fn prune(store: &dyn Store, dir: &Path, now: SystemTime) -> Result<Vec<PathBuf>, PruneError> {
    let io = |err| PruneError::Io {
        dir: dir.to_path_buf(),
        err,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(e)),
    };
    let mut files = Vec::new();
    let mut leftovers = Vec::new();
    for e in entries {
        let e = e.map_err(io)?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((id, kind)) = classify(&name) else {
            continue;
        };
        let meta = e.metadata().map_err(io)?;
        if !meta.is_file() {
            continue;
        }
        match kind {
            Kind::Snapshot => files.push((meta.modified().map_err(io)?, id, e.path())),
            Kind::Record | Kind::Part => leftovers.push((name, id, e.path())),
        }
    }
    // Newest first.
    files.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    let running: std::collections::BTreeSet<String> = crate::ops::jobs::load_jobs(store)
        .map_err(PruneError::Store)?
        .into_iter()
        .filter(|j| !j.state.is_terminal())
        .map(|j| j.id.to_string())
        .collect();
    let mut removed = Vec::new();
    for (i, (modified, id, path)) in files.into_iter().enumerate() {
        let too_old = now.duration_since(modified).is_ok_and(|age| age > MAX_AGE);
        if i == 0 || running.contains(&id) || (i < KEEP && !too_old) {
            continue;
        }
        std::fs::remove_file(&path).map_err(io)?;
        removed.push(path);
    }
    // A record goes with its snapshot; a record without one, and a `.part`, are what an
    // interrupted attempt left: they go once the job no longer runs (its executor takes the
    // snapshot again over them).
    for (name, id, path) in leftovers {
        let with_snapshot = name
            .strip_suffix(RECORD)
            .is_some_and(|snap| path.with_file_name(snap).exists());
        if with_snapshot || running.contains(&id) {
            continue;
        }
        std::fs::remove_file(&path).map_err(io)?;
        removed.push(path);
    }
    Ok(removed)
}

/// A file of the snapshots directory: a snapshot, the record of an encrypted one, or a part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Snapshot,
    Record,
    Part,
}

const RECORD: &str = crate::rollout::executor::snapshot::RECORD_SUFFIX;

/// The job id and kind of a file name of the snapshots directory; `None`: not medea's.
fn classify(name: &str) -> Option<(String, Kind)> {
    let enc = crate::rollout::executor::snapshot::ENCRYPTED_SUFFIX;
    let record = format!("{enc}{RECORD}");
    let kinds = [
        (record.as_str(), Kind::Record),
        (".db.age.part", Kind::Part),
        (".db.part", Kind::Part),
        (enc, Kind::Snapshot),
        (".db", Kind::Snapshot),
    ];
    kinds.iter().find_map(|(suffix, kind)| {
        name.strip_suffix(suffix)
            .filter(|id| !id.is_empty())
            .map(|id| (id.to_string(), *kind))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{PlanId, TalosRollout};
    use crate::rollout::Job;
    use crate::rollout::sequencer::StepState;
    use crate::store::Txn;

    fn job(seed: u8, running: bool) -> Job {
        let target = serde_json::json!({"node": "cp-1", "id": "id-cp-1", "address": "10.0.0.1", "from": "v1.12.4"});
        let rollout: TalosRollout = serde_json::from_value(serde_json::json!({
            "pool": "cp", "role": "controlplane", "hop": 1, "hops": 1, "to": "v1.13.9",
            "image": "factory.talos.dev/installer/x:v1.13.9", "maxUnavailable": 1,
            "drainTimeout": 300, "healthTimeout": 600, "waves": [[target]],
        }))
        .unwrap();
        let mut j = Job::one_talos_step(
            PlanId::from_digest([seed; 32]),
            jiff::Timestamp::from_second(1_800_000_000).unwrap(),
            StepState::Pending,
            rollout,
        );
        if !running {
            j.state = crate::rollout::sequencer::JobState::Succeeded {
                at: jiff::Timestamp::from_second(1_800_000_100).unwrap(),
            };
        }
        j
    }

    /// Snapshots of ended jobs beyond the newest `KEEP` or older than `MAX_AGE` go; a running
    /// job's snapshot and the newest one stay whatever their age.
    #[test]
    fn pre_upgrade_snapshots_are_kept_by_count_and_age_never_a_running_jobs() {
        let store = crate::rollout::fake::MemStore::new();
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let day = Duration::from_secs(24 * 3600);
        // 14 ended jobs, one a day (the newest today), and a running one 60 days old.
        let mut ids = Vec::new();
        for d in 0..14u8 {
            let j = job(d + 1, false);
            ids.push(j.id.to_string());
            store
                .commit(Txn::new().put_record(crate::rollout::journal::job_key(&j.id), &j))
                .unwrap();
            let p = dir.path().join(format!("{}.db", j.id));
            let f = std::fs::File::create(&p).unwrap();
            f.set_modified(now - day * u32::from(d)).unwrap();
        }
        let running = job(100, true);
        store
            .commit(Txn::new().put_record(crate::rollout::journal::job_key(&running.id), &running))
            .unwrap();
        let rp = dir.path().join(format!("{}.db", running.id));
        std::fs::File::create(&rp)
            .unwrap()
            .set_modified(now - day * 60)
            .unwrap();
        let removed = prune(&store, dir.path(), now).unwrap();
        // Kept: days 0..=9 would be the 10 newest, but 14 days is the age limit, so all of
        // them are young enough; days 10..=13 are beyond the count.
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want: Vec<String> = ids[..KEEP].iter().map(|i| format!("{i}.db")).collect();
        want.push(format!("{}.db", running.id));
        want.sort();
        assert_eq!(left, want, "removed {removed:?}");
        assert_eq!(removed.len(), 4);
        // Everything old: only the running job's and the newest stay.
        let removed = prune(&store, dir.path(), now + day * 400).unwrap();
        assert_eq!(removed.len(), KEEP - 1);
        assert!(rp.exists(), "a running job's snapshot is never removed");
        assert!(
            dir.path().join(format!("{}.db", ids[0])).exists(),
            "the newest stays"
        );
    }

    /// Encrypted snapshots (issue #49) are kept and pruned like plaintext ones, each with its
    /// record; what an interrupted attempt left goes once its job has ended, never a running
    /// job's.
    #[test]
    fn encrypted_snapshots_go_with_their_record_and_leftovers_of_ended_jobs_go() {
        let store = crate::rollout::fake::MemStore::new();
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let day = Duration::from_secs(24 * 3600);
        let put = |j: &Job| {
            store
                .commit(Txn::new().put_record(crate::rollout::journal::job_key(&j.id), j))
                .unwrap();
        };
        let touch = |name: String, age: Duration| {
            let f = std::fs::File::create(dir.path().join(name)).unwrap();
            f.set_modified(now - age).unwrap();
        };
        let mut ids = Vec::new();
        for d in 0..12u8 {
            let j = job(d + 1, false);
            put(&j);
            touch(format!("{}.db.age", j.id), day * u32::from(d));
            touch(format!("{}.db.age.json", j.id), day * u32::from(d));
            ids.push(j.id.to_string());
        }
        let ended = job(50, false);
        put(&ended);
        for suffix in [".db.age.part", ".db.age.json", ".db.part"] {
            touch(format!("{}{suffix}", ended.id), Duration::ZERO);
        }
        let running = job(60, true);
        put(&running);
        touch(format!("{}.db.age.part", running.id), Duration::ZERO);
        touch("notes.txt".to_string(), day * 100);
        let removed = prune(&store, dir.path(), now).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want: Vec<String> = ids[..KEEP]
            .iter()
            .flat_map(|i| [format!("{i}.db.age"), format!("{i}.db.age.json")])
            .collect();
        want.push(format!("{}.db.age.part", running.id));
        want.push("notes.txt".to_string());
        want.sort();
        assert_eq!(left, want, "removed {removed:?}");
        assert_eq!(removed.len(), 2 * 2 + 3);
    }
}
