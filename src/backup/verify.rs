//! Verifying a stored backup ([`verify`]): decrypt with an identity, check etcd's sha256
//! trailer and the recorded digest.

use super::*;

/// What [`verify`] checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Size and sha256 of the encrypted file, equal to the record's.
    pub size: u64,
    /// sha256 of the encrypted file.
    pub sha256: String,
    /// With an identity: the decrypted etcd snapshot's size, its trailer checked and its
    /// sha256 equal to the record's.
    pub snapshot: Option<(u64, String)>,
}

/// Why a backup file did not verify.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Reading the file failed.
    #[error("cannot read the backup file")]
    Read(#[source] std::io::Error),
    /// A size or checksum differs from the record.
    #[error(
        "the backup's {what} is {found}, the record says {expected}: the file is not the backup medea recorded (or it was damaged)"
    )]
    Mismatch {
        /// Which value.
        what: &'static str,
        /// The record's.
        expected: String,
        /// The file's.
        found: String,
    },
    /// The identity cannot decrypt it.
    #[error(
        "the backup cannot be decrypted with this identity (is its public key one of the recipients?)"
    )]
    Decrypt(#[source] age::DecryptError),
    /// Decrypted, but not a complete etcd snapshot.
    #[error("the decrypted snapshot is not a complete etcd snapshot")]
    Snapshot(#[source] crate::talos::snapshot::TrailerError),
}

/// Hashes and counts what is read through it.
struct HashingReader<R> {
    inner: R,
    hash: Sha256,
    size: u64,
}

impl<R: std::io::Read> std::io::Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
}

/// Verify a backup file against its record, streaming (`medea backup verify`, on the
/// operator's machine): its size and sha256; with `identity` (the operator's age key, never
/// the server's), also decrypt it, check etcd's sha256 trailer and compare the snapshot's size
/// and sha256 with the record's.
pub fn verify(
    file: impl std::io::Read,
    record: &BackupRecord,
    identity: Option<&age::x25519::Identity>,
) -> Result<Verified, VerifyError> {
    use std::io::Read as _;
    let mut reader = HashingReader {
        inner: std::io::BufReader::with_capacity(256 * 1024, file),
        hash: Sha256::new(),
        size: 0,
    };
    let mut buf = vec![0u8; 64 * 1024];
    let snapshot = match identity {
        Some(id) => {
            let decryptor = age::Decryptor::new(&mut reader).map_err(VerifyError::Decrypt)?;
            let mut plain = decryptor
                .decrypt(std::iter::once(id as &dyn age::Identity))
                .map_err(VerifyError::Decrypt)?;
            let mut check = crate::talos::snapshot::TrailerCheck::default();
            loop {
                let n = plain.read(&mut buf).map_err(VerifyError::Read)?;
                if n == 0 {
                    break;
                }
                check.update(&buf[..n]);
            }
            drop(plain);
            Some(check.finish().map_err(VerifyError::Snapshot)?)
        }
        None => None,
    };
    // Whatever the decryption left unread (nothing, for an intact file) still counts.
    loop {
        let n = reader.read(&mut buf).map_err(VerifyError::Read)?;
        if n == 0 {
            break;
        }
    }
    let (size, sha256) = (reader.size, hex::encode(reader.hash.finalize()));
    let mismatch = |what, expected: String, found: String| VerifyError::Mismatch {
        what,
        expected,
        found,
    };
    if size != record.size {
        return Err(mismatch("size", record.size.to_string(), size.to_string()));
    }
    if sha256 != record.sha256 {
        return Err(mismatch("sha256", record.sha256.clone(), sha256));
    }
    if let Some((snap_size, snap_sha)) = &snapshot {
        if *snap_size != record.snapshot_size {
            return Err(mismatch(
                "snapshot size",
                record.snapshot_size.to_string(),
                snap_size.to_string(),
            ));
        }
        if *snap_sha != record.snapshot_sha256 {
            return Err(mismatch(
                "snapshot sha256",
                record.snapshot_sha256.clone(),
                snap_sha.clone(),
            ));
        }
    }
    Ok(Verified {
        size,
        sha256,
        snapshot,
    })
}
