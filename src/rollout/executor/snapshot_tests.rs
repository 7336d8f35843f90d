use std::os::unix::fs::PermissionsExt as _;
use std::time::{Duration, Instant};

use super::*;

/// A plaintext that is easy to find: any file holding one of its pieces leaked it.
const MARKER: &[u8] = b"PLAINTEXT-SECRET-MARKER:";

fn plaintext(len: usize) -> Vec<u8> {
    MARKER.iter().copied().cycle().take(len).collect()
}

fn leaks(bytes: &[u8]) -> bool {
    bytes.windows(MARKER.len()).any(|w| w == MARKER)
}

/// Every file of `dir` (name, bytes).
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

fn streamed(bytes: &[u8]) -> SnapshotStreamed {
    SnapshotStreamed {
        size: bytes.len() as u64,
        sha256: hex::encode(Sha256::digest(bytes)),
    }
}

fn decrypt(id: &age::x25519::Identity, path: &Path) -> Vec<u8> {
    let enc = std::fs::read(path).unwrap();
    let d = age::Decryptor::new(&enc[..]).unwrap();
    let mut r = d
        .decrypt(std::iter::once(id as &dyn age::Identity))
        .unwrap();
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut r, &mut out).unwrap();
    out
}

/// Issue #49: with recipients, the snapshot is written only encrypted. While the stream is
/// half-way, the directory (created 0700) holds only the 0600 `.part` file, already age
/// ciphertext; afterwards the age file and its record, neither with a plaintext byte. The
/// file decrypts to the stream, and reading it back needs no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_snapshot_never_touches_the_disk_in_plaintext() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snapshots");
    let dest = dir.join("job-1.db.age");
    let id = age::x25519::Identity::generate();
    let recipients = vec![id.to_public().to_string()];
    let plain = plaintext(300 * 1024);
    let (first, rest) = plain.split_at(150 * 1024);
    let info = take_encrypted(&dest, &recipients, "cp-1", |tx| {
        let (dir, plain) = (dir.clone(), plain.clone());
        async move {
            tx.send(first.to_vec()).await.unwrap();
            // Wait (on progress, with a deadline) until ciphertext reached the part file.
            let part = dir.join("job-1.db.age.part");
            let deadline = Instant::now() + Duration::from_secs(60);
            while std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0) < 64 * 1024 {
                assert!(
                    Instant::now() < deadline,
                    "nothing reached {}",
                    part.display()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let during = files(&dir);
            assert_eq!(
                during.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
                ["job-1.db.age.part"]
            );
            assert!(during[0].1.starts_with(b"age-encryption.org/v1\n"));
            assert!(!leaks(&during[0].1), "plaintext in the part file");
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&part), 0o600);
            assert_eq!(mode(&dir), 0o700);
            tx.send(rest.to_vec()).await.unwrap();
            Ok(streamed(&plain))
        }
    })
    .await
    .unwrap();
    let after = files(&dir);
    assert_eq!(
        after.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
        ["job-1.db.age", "job-1.db.age.json"]
    );
    assert!(after.iter().all(|f| !leaks(&f.1)), "plaintext on disk");
    assert_eq!(decrypt(&id, &dest), plain);
    assert_eq!(info.path, dest);
    assert_eq!(info.size, plain.len() as u64);
    assert_eq!(info.sha256, hex::encode(Sha256::digest(&plain)));
    let enc = info.encrypted.clone().unwrap();
    assert_eq!(enc.recipients, recipients);
    assert_eq!(enc.sha256, hex::encode(Sha256::digest(&after[0].1)));
    // A restarted executor finds it complete from its record, without the key.
    assert_eq!(encrypted_on_disk(&dest).await.unwrap(), Some(info));
    // Never written over.
    let again = take_encrypted(&dest, &recipients, "cp-1", |_tx| async {
        Ok(streamed(b""))
    })
    .await
    .unwrap_err();
    assert!(again.to_string().contains("etcd-snapshot"), "{again}");
    assert!(crate::error_chain(&again).contains("already exists"));
}

/// A crash mid-stream leaves a `.part` (and perhaps the record of an earlier try): not a
/// snapshot; the next attempt writes over both. A file that does not match its record, or
/// has none, is an error, never taken as a snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_encrypted_snapshot_is_taken_again_and_a_tampered_one_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("j.db.age");
    std::fs::write(tmp.path().join("j.db.age.part"), b"half").unwrap();
    std::fs::write(record_path(&dest), b"{\"stale\": true}").unwrap();
    assert_eq!(encrypted_on_disk(&dest).await.unwrap(), None);
    let id = age::x25519::Identity::generate();
    let recipients = vec![id.to_public().to_string()];
    let plain = plaintext(1000);
    let info = take_encrypted(&dest, &recipients, "cp-1", |tx| {
        let plain = plain.clone();
        async move {
            tx.send(plain.clone()).await.unwrap();
            Ok(streamed(&plain))
        }
    })
    .await
    .unwrap();
    assert_eq!(decrypt(&id, &dest), plain);
    assert_eq!(encrypted_on_disk(&dest).await.unwrap(), Some(info));
    assert!(!tmp.path().join("j.db.age.part").exists());

    let mut bytes = std::fs::read(&dest).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&dest, &bytes).unwrap();
    let err = encrypted_on_disk(&dest).await.unwrap_err();
    assert!(
        matches!(&err, EncryptedSnapshotError::Mismatch { what, .. } if what.contains("recorded")),
        "{err}"
    );
    std::fs::remove_file(record_path(&dest)).unwrap();
    let err = encrypted_on_disk(&dest).await.unwrap_err();
    assert!(
        matches!(&err, EncryptedSnapshotError::Mismatch { what, .. } if what.contains("record cannot be read")),
        "{err}"
    );
}

/// A stream that breaks is the port's error, as it classed it; nothing stays behind. So does
/// a stream whose bytes differ from what the port reports, and a bad recipient.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("j.db.age");
    let id = age::x25519::Identity::generate();
    let recipients = vec![id.to_public().to_string()];
    let err = take_encrypted(&dest, &recipients, "cp-1", |tx| async move {
        tx.send(plaintext(2000)).await.unwrap();
        Err(PortError::transient(
            "EtcdSnapshot",
            "cp-1",
            "unexpected EOF",
        ))
    })
    .await
    .unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(files(tmp.path()).is_empty(), "{:?}", files(tmp.path()));

    let err = take_encrypted(&dest, &recipients, "cp-1", |tx| async move {
        tx.send(plaintext(2000)).await.unwrap();
        Ok(streamed(&plaintext(1000)))
    })
    .await
    .unwrap_err();
    assert!(
        matches!(&err, PortError::Failed { .. }) && crate::error_chain(&err).contains("differs"),
        "{err}"
    );
    assert!(files(tmp.path()).is_empty(), "{:?}", files(tmp.path()));

    let err = take_encrypted(&dest, &["age1nope".to_string()], "cp-1", |_tx| async {
        Ok(streamed(b""))
    })
    .await
    .unwrap_err();
    assert!(crate::error_chain(&err).contains("age1nope"), "{err}");
    assert!(files(tmp.path()).is_empty());
}
