//! The job's etcd snapshot on disk (design/rollout.md, "etcd snapshot").
//!
//! A job with backup recipients (`Job::snapshot_recipients`, the cluster's `spec.backup` at
//! creation; issue #49) saves its snapshot **only encrypted**: the Talos port streams it
//! ([`TalosPort::etcd_snapshot_stream`], which verifies etcd's sha256 trailer after the last
//! chunk, as for the scheduled backups) and each chunk goes straight into an age writer, so no
//! plaintext byte is ever written to a disk. The sha256 and size of the plaintext are computed
//! as it passes. The age file is written as `<job>.db.age.part` (0600, directory 0700),
//! finished and fsync'd; then the record of what was verified, `<job>.db.age.json` (the
//! plaintext's size and sha256, the age file's size and sha256, the recipients), is written
//! durably (temporary file, fsync, rename, directory fsync); then the age file is linked to
//! `<job>.db.age` (never over an existing file) and the directory fsync'd. `<job>.db.age`
//! existing is the commit point: a restarted executor that finds it takes the snapshot as done
//! from its record, re-hashing only the ciphertext (no key, no plaintext needed); a `.part` or
//! a record without its file is an interrupted attempt, overwritten by the next one.
//!
//! A job without recipients keeps the plaintext snapshot, `<job>.db`, 0600 in a 0700 directory
//! ([`TalosPort::etcd_snapshot`]). Both are pruned by `backup::snapshot_retention`.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::super::ports::{EncryptedSnapshot, PortError, SnapshotInfo, SnapshotStreamed};
use super::super::sequencer::Job;

/// Suffix of an encrypted pre-upgrade snapshot.
pub const ENCRYPTED_SUFFIX: &str = ".db.age";
/// Suffix of the record beside an encrypted snapshot (appended to its file name).
pub const RECORD_SUFFIX: &str = ".json";
/// Chunks in flight between the Talos stream and the encrypting writer.
const CHANNEL_CHUNKS: usize = 8;
const OP: &str = "etcd-snapshot";

/// The file `job`'s snapshot is saved to in `dir`: `<job>.db.age` when it has backup
/// recipients, else `<job>.db`.
pub fn snapshot_path(dir: &Path, job: &Job) -> PathBuf {
    if job.snapshot_recipients.is_empty() {
        dir.join(format!("{}.db", job.id))
    } else {
        dir.join(format!("{}{ENCRYPTED_SUFFIX}", job.id))
    }
}

/// `<dest><suffix>`.
fn with_suffix(dest: &Path, suffix: &str) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    dest.with_file_name(name)
}

/// The record beside the encrypted snapshot `dest`.
pub fn record_path(dest: &Path) -> PathBuf {
    with_suffix(dest, RECORD_SUFFIX)
}

/// What was verified of an encrypted snapshot as it was written (`<job>.db.age.json`). No
/// secret: hashes, sizes, public keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    /// The etcd snapshot (plaintext, etcd's trailer included): size and sha256.
    snapshot_size: u64,
    snapshot_sha256: String,
    /// The age file: size and sha256.
    size: u64,
    sha256: String,
    /// The age recipients.
    recipients: Vec<String>,
}

/// Why an encrypted snapshot could not be written or read back.
#[derive(Debug, thiserror::Error)]
pub enum EncryptedSnapshotError {
    /// A recipient of the job is not an age public key (the desired-state loader refuses
    /// those, so a record written by another medea version).
    #[error("the job's backup recipient `{recipient}` is not an age public key: {reason}")]
    Recipient { recipient: String, reason: String },
    /// The age encryptor could not be set up.
    #[error("the encryption to the backup recipients could not start")]
    Encrypt(#[source] Box<age::EncryptError>),
    /// A file could not be written, read or moved.
    #[error("the encrypted etcd snapshot `{}`", path.display())]
    Io {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    /// The destination is there already: a snapshot is never written over another.
    #[error("`{}` already exists; a snapshot is never written over another", path.display())]
    Exists { path: PathBuf },
    /// What passed through the writer is not what the port reports it streamed.
    #[error(
        "what passed to the encryption ({passed} bytes) differs from what the port streamed ({streamed} bytes)"
    )]
    Stream { passed: u64, streamed: u64 },
    /// The encrypted file has no readable record, or differs from it.
    #[error(
        "the encrypted etcd snapshot `{}` does not match its record `{}` ({what}); move both away to take the snapshot again",
        path.display(), record.display()
    )]
    Mismatch {
        path: PathBuf,
        record: PathBuf,
        what: String,
    },
}

/// Counts and hashes what passes through to the inner writer.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    size: u64,
}

impl<W> Hashing<W> {
    fn new(inner: W) -> Hashing<W> {
        Hashing {
            inner,
            hash: Sha256::new(),
            size: 0,
        }
    }
    fn done(self) -> (W, u64, String) {
        (self.inner, self.size, hex::encode(self.hash.finalize()))
    }
}

impl<W: std::io::Write> std::io::Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn encryptor(recipients: &[String]) -> Result<age::Encryptor, EncryptedSnapshotError> {
    let keys = recipients
        .iter()
        .map(|r| {
            crate::desired::backup::Recipient::parse(r)
                .map(|k| k.to_age())
                .map_err(|reason| EncryptedSnapshotError::Recipient {
                    recipient: r.clone(),
                    reason,
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    age::Encryptor::with_recipients(keys.iter().map(|k| k as &dyn age::Recipient))
        .map_err(|e| EncryptedSnapshotError::Encrypt(Box::new(e)))
}

/// The plaintext (size, sha256) and the ciphertext (size, sha256) of a finished `.part`.
type Written = ((u64, String), (u64, String));

/// Receive the chunks, encrypt them into `part` (0600; directory 0700 when created), finish
/// and fsync. Blocking.
fn consume(
    encryptor: age::Encryptor,
    part: &Path,
    mut rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
) -> std::io::Result<Written> {
    crate::private_file::private_dir(
        crate::private_file::parent_dir(part),
        crate::private_file::ExistingDir::Keep,
    )
    .map_err(crate::private_file::PrivateFileError::into_io)?;
    let file = crate::private_file::open_private(part)?;
    let mut enc = encryptor.wrap_output(Hashing::new(file))?;
    let (mut plain, mut plain_size) = (Sha256::new(), 0u64);
    while let Some(chunk) = rx.blocking_recv() {
        plain.update(&chunk);
        plain_size += chunk.len() as u64;
        enc.write_all(&chunk)?;
    }
    let mut hashing = enc.finish()?;
    hashing.flush()?;
    let (file, size, sha256) = hashing.done();
    file.sync_all()?;
    Ok(((plain_size, hex::encode(plain.finalize())), (size, sha256)))
}

/// Take the job's snapshot encrypted to `recipients` into `dest` (see the module's doc):
/// `stream` is the port's [`TalosPort::etcd_snapshot_stream`] of the node `node`. A port error
/// is returned as it is (its class decides a retry); a local failure is a definite one. On
/// any failure nothing is left at `dest`.
///
/// [`TalosPort::etcd_snapshot_stream`]: super::super::ports::TalosPort::etcd_snapshot_stream
pub async fn take_encrypted<F, Fut>(
    dest: &Path,
    recipients: &[String],
    node: &str,
    stream: F,
) -> Result<SnapshotInfo, PortError>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Vec<u8>>) -> Fut,
    Fut: std::future::Future<Output = Result<SnapshotStreamed, PortError>>,
{
    let local = |e: EncryptedSnapshotError| PortError::failed(OP, node, e);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |err| EncryptedSnapshotError::Io { path, err }
    };
    let encryptor = encryptor(recipients).map_err(local)?;
    if tokio::fs::symlink_metadata(dest).await.is_ok() {
        return Err(local(EncryptedSnapshotError::Exists {
            path: dest.to_path_buf(),
        }));
    }
    let part = with_suffix(dest, ".part");
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(CHANNEL_CHUNKS);
    let consumer = tokio::task::spawn_blocking({
        let part = part.clone();
        move || consume(encryptor, &part, rx)
    });
    let streamed = stream(tx).await;
    let written = consumer
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
    let discard = || async {
        let _ = tokio::fs::remove_file(&part).await;
    };
    let (plain, cipher) = match (streamed, written) {
        (Ok(s), Ok((plain, cipher))) => {
            if plain.0 != s.size || plain.1 != s.sha256 {
                discard().await;
                return Err(local(EncryptedSnapshotError::Stream {
                    passed: plain.0,
                    streamed: s.size,
                }));
            }
            (plain, cipher)
        }
        // The writer failed (the stream then fails too: its consumer is gone): report it.
        (_, Err(err)) => {
            discard().await;
            return Err(local(io(&part)(err)));
        }
        (Err(e), Ok(_)) => {
            discard().await;
            return Err(e);
        }
    };
    let record = Record {
        snapshot_size: plain.0,
        snapshot_sha256: plain.1,
        size: cipher.0,
        sha256: cipher.1,
        recipients: recipients.to_vec(),
    };
    if let Err(e) = commit(dest, &part, &record).await {
        discard().await;
        return Err(local(e));
    }
    Ok(info(dest, record))
}

fn info(dest: &Path, r: Record) -> SnapshotInfo {
    SnapshotInfo {
        path: dest.to_path_buf(),
        size: r.snapshot_size,
        sha256: r.snapshot_sha256,
        encrypted: Some(EncryptedSnapshot {
            size: r.size,
            sha256: r.sha256,
            recipients: r.recipients,
        }),
    }
}

/// Write the record durably, then link the finished `part` to `dest` (refusing an existing
/// one) and fsync the directory: `dest` appears only with its record in place.
async fn commit(dest: &Path, part: &Path, record: &Record) -> Result<(), EncryptedSnapshotError> {
    let (dest, part) = (dest.to_path_buf(), part.to_path_buf());
    let json = serde_json::to_vec_pretty(record).map_err(|e| EncryptedSnapshotError::Io {
        path: record_path(&dest),
        err: std::io::Error::other(e),
    })?;
    tokio::task::spawn_blocking(move || {
        // The record of a committed snapshot is never replaced (only one executor runs a
        // job, and each replica has its own directory; this keeps it so regardless).
        if std::fs::symlink_metadata(&dest).is_ok() {
            return Err(EncryptedSnapshotError::Exists { path: dest.clone() });
        }
        let rec = record_path(&dest);
        crate::private_file::write_private(&rec, &json, crate::private_file::ExistingDir::Keep)
            .map_err(|e| EncryptedSnapshotError::Io {
                path: rec.clone(),
                err: e.into_io(),
            })?;
        let io = |err| EncryptedSnapshotError::Io {
            path: dest.clone(),
            err,
        };
        // hard_link refuses an existing destination, unlike rename; filesystems without hard
        // links get a checked rename.
        match std::fs::hard_link(&part, &dest) {
            Ok(()) => {
                let _ = std::fs::remove_file(&part);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(EncryptedSnapshotError::Exists { path: dest.clone() });
            }
            Err(_) if std::fs::symlink_metadata(&dest).is_err() => {
                std::fs::rename(&part, &dest).map_err(io)?
            }
            Err(e) => return Err(io(e)),
        }
        crate::private_file::sync_dir(crate::private_file::parent_dir(&dest)).map_err(io)
    })
    .await
    .map_err(|e| EncryptedSnapshotError::Io {
        path: PathBuf::new(),
        err: std::io::Error::other(e),
    })?
}

/// The job's encrypted snapshot as it is on disk, if its file exists: read from its record,
/// the age file re-hashed against it (no key and no plaintext needed). A file without a
/// readable, matching record is an error (the job halts on it rather than take another over
/// it).
pub async fn encrypted_on_disk(
    dest: &Path,
) -> Result<Option<SnapshotInfo>, EncryptedSnapshotError> {
    let dest = dest.to_path_buf();
    tokio::task::spawn_blocking(move || encrypted_on_disk_blocking(&dest))
        .await
        .map_err(|e| EncryptedSnapshotError::Io {
            path: PathBuf::new(),
            err: std::io::Error::other(e),
        })?
}

fn encrypted_on_disk_blocking(dest: &Path) -> Result<Option<SnapshotInfo>, EncryptedSnapshotError> {
    let mut file = match std::fs::File::open(dest) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => {
            return Err(EncryptedSnapshotError::Io {
                path: dest.to_path_buf(),
                err,
            });
        }
    };
    let rec = record_path(dest);
    let mismatch = |what: String| EncryptedSnapshotError::Mismatch {
        path: dest.to_path_buf(),
        record: rec.clone(),
        what,
    };
    let record: Record = match std::fs::read(&rec) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| mismatch(format!("the record cannot be read: {e}")))?,
        Err(e) => return Err(mismatch(format!("the record cannot be read: {e}"))),
    };
    let mut hashing = Hashing::new(std::io::sink());
    std::io::copy(&mut file, &mut hashing).map_err(|err| EncryptedSnapshotError::Io {
        path: dest.to_path_buf(),
        err,
    })?;
    let (_, size, sha256) = hashing.done();
    if size != record.size || sha256 != record.sha256 {
        return Err(mismatch(format!(
            "{size} bytes with sha256 {sha256}, recorded {} bytes with sha256 {}",
            record.size, record.sha256
        )));
    }
    Ok(Some(info(dest, record)))
}

/// The job's plaintext snapshot file as it is on disk (re-hashed), if it exists. The port
/// creates the file only once the snapshot is complete and verified, so its presence means a
/// good snapshot.
pub async fn plaintext_on_disk(path: &Path) -> std::io::Result<Option<SnapshotInfo>> {
    match tokio::fs::read(path).await {
        Ok(bytes) => Ok(Some(SnapshotInfo {
            path: path.to_path_buf(),
            size: bytes.len() as u64,
            sha256: hex::encode(Sha256::digest(&bytes)),
            encrypted: None,
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
