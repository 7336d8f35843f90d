//! Writing an etcd snapshot stream to disk, durably and verified.
//!
//! The stream is written to `<dest>.part` (mode 0600: it holds every Kubernetes secret), fsynced,
//! checked, then linked to `<dest>` (which must not exist; linking never clobbers) and the
//! directory fsynced. etcd appends the sha256 of the database to the snapshot, so a complete
//! snapshot has `size % 512 == 32` and its last 32 bytes equal the sha256 of the rest; both are
//! checked (the same check `etcdutl snapshot restore` makes).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt as _;

use super::TalosError;
use super::types::SnapshotInfo;

const TRAILER: usize = 32;

/// Why a snapshot stream is not a complete etcd snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrailerError {
    #[error("size {size} is not 512·n + 32: the stream is truncated or has no sha256 trailer")]
    Size { size: u64 },
    #[error("the sha256 trailer does not match the data")]
    Mismatch,
}

/// Incremental check of an etcd snapshot's sha256 trailer (pure, no I/O).
#[derive(Default)]
pub struct TrailerCheck {
    whole: Sha256,
    body: Sha256,
    /// The last (up to) 32 bytes seen, not yet fed to `body`.
    tail: Vec<u8>,
    size: u64,
}

impl TrailerCheck {
    pub fn update(&mut self, bytes: &[u8]) {
        self.whole.update(bytes);
        self.size += bytes.len() as u64;
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > TRAILER {
            let cut = self.tail.len() - TRAILER;
            self.body.update(&self.tail[..cut]);
            self.tail.drain(..cut);
        }
    }

    /// `(size, hex sha256 of everything)` if the trailer checks out, else the reason.
    pub fn finish(self) -> Result<(u64, String), TrailerError> {
        if self.size % 512 != TRAILER as u64 {
            return Err(TrailerError::Size { size: self.size });
        }
        let body = self.body.finalize();
        if body.as_slice() != self.tail.as_slice() {
            return Err(TrailerError::Mismatch);
        }
        Ok((self.size, hex::encode(self.whole.finalize())))
    }
}

/// Append an etcd-style sha256 trailer to `db` (used by the simulator to make snapshots).
pub fn with_trailer(mut db: Vec<u8>) -> Vec<u8> {
    let h = Sha256::digest(&db);
    db.extend_from_slice(&h);
    db
}

/// An open `<dest>.part` file being filled from the stream.
pub(crate) struct SnapshotWriter {
    file: tokio::fs::File,
    part: PathBuf,
    dest: PathBuf,
    check: TrailerCheck,
}

fn part_path(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    dest.with_file_name(name)
}

impl SnapshotWriter {
    pub(crate) async fn create(dest: &Path) -> Result<SnapshotWriter, TalosError> {
        let io = |err| TalosError::SnapshotIo {
            path: dest.to_path_buf(),
            err,
        };
        if dest.file_name().is_none() {
            return Err(TalosError::SnapshotIo {
                path: dest.to_path_buf(),
                err: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"),
            });
        }
        if tokio::fs::symlink_metadata(dest).await.is_ok() {
            return Err(TalosError::SnapshotExists {
                path: dest.to_path_buf(),
            });
        }
        // The directory is created 0700 when missing (a directory the user chose is left as it
        // is); the part file is 0600: a snapshot holds every Kubernetes secret.
        let part = part_path(dest);
        let (dir, part_for_open) = (
            crate::private_file::parent_dir(dest).to_path_buf(),
            part.clone(),
        );
        let file = tokio::task::spawn_blocking(move || {
            crate::private_file::private_dir(&dir, crate::private_file::ExistingDir::Keep)
                .map_err(crate::private_file::PrivateFileError::into_io)?;
            crate::private_file::open_private(&part_for_open)
        })
        .await
        .map_err(|e| io(std::io::Error::other(e)))?
        .map_err(|err| TalosError::SnapshotIo {
            path: part.clone(),
            err,
        })?;
        let file = tokio::fs::File::from_std(file);
        Ok(SnapshotWriter {
            file,
            part,
            dest: dest.to_path_buf(),
            check: TrailerCheck::default(),
        })
    }

    pub(crate) async fn write(&mut self, bytes: &[u8]) -> Result<(), TalosError> {
        self.check.update(bytes);
        self.file
            .write_all(bytes)
            .await
            .map_err(|err| TalosError::SnapshotIo {
                path: self.part.clone(),
                err,
            })
    }

    /// Remove the partial file (best effort: the error being reported matters more).
    pub(crate) async fn abort(self) {
        drop(self.file);
        let _ = tokio::fs::remove_file(&self.part).await;
    }

    pub(crate) async fn finish(mut self, node: &str) -> Result<SnapshotInfo, TalosError> {
        let part = self.part.clone();
        let io = |err| TalosError::SnapshotIo {
            path: part.clone(),
            err,
        };
        if let Err(e) = async {
            self.file.flush().await?;
            self.file.sync_all().await
        }
        .await
        {
            self.abort().await;
            return Err(io(e));
        }
        let SnapshotWriter {
            file,
            part,
            dest,
            check,
        } = self;
        drop(file);
        let (size, sha256) = match check.finish() {
            Ok(v) => v,
            Err(reason) => {
                let _ = tokio::fs::remove_file(&part).await;
                return Err(TalosError::SnapshotCorrupt {
                    node: node.to_string(),
                    reason,
                });
            }
        };
        // hard_link refuses an existing destination, unlike rename. Filesystems without hard
        // links get a checked rename.
        match tokio::fs::hard_link(&part, &dest).await {
            Ok(()) => {
                let _ = tokio::fs::remove_file(&part).await;
            }
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                let _ = tokio::fs::remove_file(&part).await;
                return Err(TalosError::SnapshotExists { path: dest });
            }
            Err(_) if tokio::fs::symlink_metadata(&dest).await.is_err() => {
                if let Err(err) = tokio::fs::rename(&part, &dest).await {
                    let _ = tokio::fs::remove_file(&part).await;
                    return Err(TalosError::SnapshotIo { path: dest, err });
                }
            }
            Err(err) => {
                let _ = tokio::fs::remove_file(&part).await;
                return Err(TalosError::SnapshotIo { path: dest, err });
            }
        }
        let dir = dest
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let sync_dir = async { tokio::fs::File::open(&dir).await?.sync_all().await };
        sync_dir.await.map_err(|err| TalosError::SnapshotIo {
            path: dir.clone(),
            err,
        })?;
        Ok(SnapshotInfo {
            path: dest,
            size,
            sha256,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(chunks: &[&[u8]]) -> Result<(u64, String), String> {
        let mut c = TrailerCheck::default();
        for ch in chunks {
            c.update(ch);
        }
        c.finish().map_err(|e| e.to_string())
    }

    #[test]
    fn accepts_a_snapshot_with_its_trailer_in_any_chunking() {
        let snap = with_trailer(vec![7u8; 1024]);
        let want = hex::encode(Sha256::digest(&snap));
        assert_eq!(check(&[&snap]).unwrap(), (1056, want.clone()));
        let (a, b) = snap.split_at(1040); // the trailer straddles two chunks
        assert_eq!(check(&[a, b]).unwrap(), (1056, want.clone()));
        let bytes: Vec<&[u8]> = snap.chunks(5).collect();
        assert_eq!(check(&bytes).unwrap(), (1056, want));
    }

    #[test]
    fn refuses_truncated_or_corrupt_snapshots() {
        let snap = with_trailer(vec![7u8; 1024]);
        let err = check(&[&snap[..1000]]).unwrap_err();
        assert!(err.contains("truncated"), "{err}");
        let mut bad = snap.clone();
        bad[10] ^= 1;
        let err = check(&[&bad]).unwrap_err();
        assert!(err.contains("does not match"), "{err}");
        assert!(check(&[]).is_err());
    }
}
