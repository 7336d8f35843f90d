//! The pre-upgrade etcd snapshot of a cluster with backup recipients (issue #49 item 7): saved
//! only encrypted to them, through the real adapters against the simulator, in the crash
//! harness's child; it decrypts with the stock `age` tool to a valid etcd snapshot, a crash at
//! its journal points still gives exactly one, and no plaintext file ever appears in the
//! snapshot directory.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};

use age::secrecy::ExposeSecret as _;
use sha2::Digest as _;

use super::crash::{SimWorld, crash_at};
use super::*;

fn key() -> (age::x25519::Identity, medea::desired::backup::Recipient) {
    let id = age::x25519::Identity::generate();
    let r = medea::desired::backup::Recipient::parse(&id.to_public().to_string()).unwrap();
    (id, r)
}

const AGE_HEADER: &[u8] = b"age-encryption.org/v1\n";

/// Watches a snapshot directory while a child runs: every file seen there must be age
/// ciphertext (or the start of it) or the JSON record beside it. Scans until stopped, then
/// once more.
struct Watch {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<(BTreeSet<String>, Vec<String>)>,
}

fn scan(dir: &Path, seen: &mut BTreeSet<String>, bad: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // a file can be renamed away between the listing and the read
        let Ok(bytes) = std::fs::read(e.path()) else {
            continue;
        };
        seen.insert(name.clone());
        let ok = if name.ends_with(".json") {
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .is_ok_and(|v| v.get("snapshotSha256").is_some())
        } else {
            let n = bytes.len().min(AGE_HEADER.len());
            bytes[..n] == AGE_HEADER[..n]
        };
        if !ok {
            bad.push(format!("{name} ({} bytes)", bytes.len()));
        }
    }
}

fn watch(dir: PathBuf) -> Watch {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let handle = std::thread::spawn(move || {
        let (mut seen, mut bad) = (BTreeSet::new(), Vec::new());
        while !flag.load(Ordering::SeqCst) {
            scan(&dir, &mut seen, &mut bad);
            std::thread::sleep(Duration::from_millis(2));
        }
        scan(&dir, &mut seen, &mut bad);
        (seen, bad)
    });
    Watch { stop, handle }
}

impl Watch {
    /// Stop; panics if a file that is not ciphertext was ever seen. Returns the names seen.
    fn end(self, what: &str) -> BTreeSet<String> {
        self.stop.store(true, Ordering::SeqCst);
        let (seen, bad) = self.handle.join().unwrap();
        assert!(
            bad.is_empty(),
            "{what}: plaintext in the snapshot directory: {bad:?}"
        );
        seen
    }
}

/// The job's snapshot: encrypted to `recipient`, alone in the directory with its record, and
/// decrypting (with the age crate) to what the job recorded. Returns the plaintext.
fn check_encrypted(
    w: &SimWorld,
    id: &age::x25519::Identity,
    recipient: &medea::desired::backup::Recipient,
    what: &str,
) -> Vec<u8> {
    let job = w.job();
    let snap = job.snapshot.clone().expect("the job recorded its snapshot");
    let dir = w.dir.join("snapshots");
    assert_eq!(snap.path, dir.join(format!("{}.db.age", job.id)), "{what}");
    let enc = snap.encrypted.clone().expect("recorded as encrypted");
    assert_eq!(
        enc.recipients,
        vec![recipient.as_str().to_string()],
        "{what}"
    );
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            format!("{}.db.age", job.id),
            format!("{}.db.age.json", job.id)
        ],
        "{what}: the snapshot directory"
    );
    let bytes = std::fs::read(&snap.path).unwrap();
    assert_eq!(
        hex::encode(sha2::Sha256::digest(&bytes)),
        enc.sha256,
        "{what}"
    );
    let d = age::Decryptor::new(&bytes[..]).unwrap();
    let mut r = d
        .decrypt(std::iter::once(id as &dyn age::Identity))
        .unwrap();
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut r, &mut plain).unwrap();
    assert_eq!(plain.len() as u64, snap.size, "{what}");
    assert_eq!(
        hex::encode(sha2::Sha256::digest(&plain)),
        snap.sha256,
        "{what}"
    );
    let mut check = medea::talos::snapshot::TrailerCheck::default();
    check.update(&plain);
    assert!(check.finish().is_ok(), "{what}: etcd's sha256 trailer");
    plain
}

/// A cluster with backup recipients: its job's etcd snapshot is `<job>.db.age`, never a
/// plaintext file (watched while the child runs), and `age -d -i key` (as an operator would,
/// README) decrypts it to a valid etcd snapshot (`etcdctl snapshot status`) whose sha256 and
/// size are the job's record.
#[test]
fn an_encrypted_pre_upgrade_snapshot_decrypts_with_age_to_a_valid_etcd_snapshot() {
    let dir = scratch();
    let (id, recipient) = key();
    let w = SimWorld::prepare_full(dir.path(), &[], std::slice::from_ref(&recipient));
    let watcher = watch(w.dir.join("snapshots"));
    let out = w.child().output().unwrap();
    let seen = watcher.end("clean run");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    check_rolled_out(&w, "encrypted snapshot");
    assert!(seen.iter().all(|n| n.contains(".db.age")), "{seen:?}");
    let plain = check_encrypted(&w, &id, &recipient, "clean run");
    let job = w.job();
    let snap = job.snapshot.clone().unwrap();
    // The journal says where it went and that it is encrypted.
    let notes: Vec<String> = w.journal().into_iter().flat_map(|e| e.notes).collect();
    let saved = format!(
        "etcd snapshot saved: {} ({} bytes, sha256 {}, encrypted to 1 age recipient)",
        snap.path.display(),
        snap.size,
        snap.sha256
    );
    assert!(notes.contains(&saved), "{notes:#?}");

    if let Some(age_bin) = crate::fixtures::tool_or_skip("age") {
        let key = dir.path().join("key.txt");
        std::fs::write(&key, format!("{}\n", id.to_string().expose_secret())).unwrap();
        let out = std::process::Command::new(age_bin)
            .args(["-d", "-i"])
            .arg(&key)
            .arg(&snap.path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, plain);
    }
    if let Some(etcdctl) = crate::fixtures::tool_or_skip("etcdctl") {
        let restored = dir.path().join("restored.snapshot");
        std::fs::write(&restored, &plain).unwrap();
        let status = crate::sim_etcd::etcdctl_json(
            &etcdctl,
            None,
            &["snapshot", "status", restored.to_str().unwrap()],
        );
        assert!(
            status["revision"].as_i64().is_some_and(|r| r > 0)
                && status["totalKey"].as_i64().is_some_and(|k| k > 0),
            "{status}"
        );
    }
}

/// The crash harness at the encrypted snapshot's journal points: killed right after its
/// intent (the stream never asked for), right before its result (the file written and
/// committed, the outcome never journaled) and right after its result. Each restarted run
/// ends Succeeded with exactly one EtcdSnapshot call (the simulator's counter), the one
/// encrypted file and its record, and no plaintext file ever seen in the directory.
#[test]
fn a_crash_at_the_encrypted_snapshots_journal_points_still_gives_one_snapshot() {
    let dir = scratch();
    let (id, recipient) = key();
    let w = SimWorld::prepare_full(dir.path(), &[], std::slice::from_ref(&recipient));
    assert!(w.child().output().unwrap().status.success());
    check_rolled_out(&w, "clean run");
    let journal = w.journal();
    let seq = |intent: bool| {
        journal
            .iter()
            .find(|e| match &e.entry {
                Entry::Intent { key, .. } => intent && key.op == CommandOp::Snapshot,
                Entry::Result { key, .. } => !intent && key.op == CommandOp::Snapshot,
                _ => false,
            })
            .map(|e| e.seq)
            .expect("the snapshot's journal entries")
    };
    let (intent, result) = (seq(true), seq(false));
    drop(w);
    for (var, n) in [
        ("MEDEA_CRASH_AT", intent),
        ("MEDEA_CRASH_BEFORE", result),
        ("MEDEA_CRASH_AT", result),
    ] {
        let what = format!("{var}={n}");
        let dir = scratch();
        let w = SimWorld::prepare_full(dir.path(), &[], std::slice::from_ref(&recipient));
        let watcher = watch(w.dir.join("snapshots"));
        assert!(crash_at(&w, var, n), "{what} was reached");
        watcher.end(&what);
        check_rolled_out(&w, &what);
        check_encrypted(&w, &id, &recipient, &what);
    }
}
