//! Private files: 0600 files inside 0700 directories, written atomically and durably.
//!
//! **Owns:** the one way medea writes a file that holds a secret or state nobody else may read:
//! TLS keys, API tokens, the secrets file, etcd snapshots, generated talosconfig/kubeconfig and
//! the store's directory; and the one way medea reads a file that configuration names
//! ([`read_bounded`]: no symbolic link, a regular file, a size cap).
//! **May depend on:** the `private_file` row of design/architecture.md's code map: nothing (a
//! leaf; `std::fs`, `tempfile` and `libc`'s open flags).
//!
//! Architecture Invariant: every private file is written by [`write_private`] (or, for a stream
//! too large to hold in memory, opened by [`open_private`] and finished with [`sync_dir`]). The
//! sequence is: create the directory 0700 (policy for an existing directory: [`ExistingDir`]),
//! write a temporary file 0600 next to the destination, fsync it, rename it over the
//! destination, fsync the directory. A reader never sees half a file, and after a crash the
//! file is either the old one or the new one.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// What to do with a directory that already exists. An existing directory is never re-moded
/// (issue #49 item 7): only directories medea creates are made 0700; one that was there is
/// the user's (`--state-dir $HOME` must not make a home directory 0700), and the files medea
/// puts in it are 0600 whatever the directory's mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExistingDir {
    /// Leave it as it is: a destination the user chose (`talos etcd-snapshot /backups/x.db`,
    /// `--write-kubeconfig ~/.kube/sim`), medea's state and credentials directories.
    Keep,
    /// Refuse it when group or others may access it: a directory that will hold private keys the
    /// user pointed medea at (`--tls-dir`, the simulator's PKI).
    RefuseLoose,
}

/// Why a private file or directory could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PrivateFileError {
    #[error("cannot create the private directory `{}`", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error(
        "directory `{}` is accessible by group or others (mode {mode:o}); make it 0700",
        path.display()
    )]
    LooseDir { path: PathBuf, mode: u32 },
    #[error("cannot write `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
}

impl PrivateFileError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            PrivateFileError::CreateDir { path, .. }
            | PrivateFileError::LooseDir { path, .. }
            | PrivateFileError::Write { path, .. } => path,
        }
    }

    /// As an `io::Error` for callers whose signature is `io::Result` (the chain is kept: the
    /// `io::Error` wraps this error, whose `source()` is the OS error).
    pub fn into_io(self) -> std::io::Error {
        match &self {
            PrivateFileError::CreateDir { err, .. } | PrivateFileError::Write { err, .. } => {
                std::io::Error::new(err.kind(), self)
            }
            PrivateFileError::LooseDir { .. } => {
                std::io::Error::new(std::io::ErrorKind::PermissionDenied, self)
            }
        }
    }
}

/// The directory `path` lives in (`.` for a bare file name).
pub fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Create `dir` (and missing parents) with mode 0700; an existing `dir` is never re-moded, and is
/// kept or refused by `existing`.
pub fn private_dir(dir: &Path, existing: ExistingDir) -> Result<(), PrivateFileError> {
    let create_err = |err| PrivateFileError::CreateDir {
        path: dir.to_path_buf(),
        err,
    };
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(create_err);
        }
        Err(e) => return Err(create_err(e)),
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    match existing {
        ExistingDir::Keep => Ok(()),
        ExistingDir::RefuseLoose => Err(PrivateFileError::LooseDir {
            path: dir.to_path_buf(),
            mode,
        }),
    }
}

/// Write `bytes` to `path` as a 0600 file inside a 0700 directory: temporary file, fsync,
/// rename, fsync of the directory (see the module docs). An existing `path` is replaced.
pub fn write_private(
    path: &Path,
    bytes: &[u8],
    existing: ExistingDir,
) -> Result<(), PrivateFileError> {
    let dir = parent_dir(path);
    private_dir(dir, existing)?;
    let write_err = |err| PrivateFileError::Write {
        path: path.to_path_buf(),
        err,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // The temporary file is created 0600 (never wider, whatever the umask) and removed if
    // anything below fails.
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)
        .map_err(write_err)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(write_err)?;
    tmp.write_all(bytes).map_err(write_err)?;
    tmp.as_file().sync_all().map_err(write_err)?;
    tmp.persist(path).map_err(|e| write_err(e.error))?;
    sync_dir(dir).map_err(write_err)
}

/// Open `path` for writing as a new or truncated 0600 file (for a stream written in pieces; the
/// caller fsyncs it, renames it into place and calls [`sync_dir`]). Its directory must exist
/// (see [`private_dir`]).
pub fn open_private(path: &Path) -> std::io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(f)
}

/// A new temporary directory, mode 0700 whatever the umask (`tempfile`'s default is 0777 less
/// the umask: 0755 under the usual 022, which lets every local user list it and read what lands
/// in it with a looser mode). For decrypted backups (`medea backup verify --restore`) and the
/// CLI's rehearsal; removed when dropped.
pub fn private_tempdir(prefix: &str) -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
}

/// fsync a directory, so a rename or a new file in it survives a crash.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Whether a file or directory is private (no group or other bits).
pub fn is_private(path: &Path) -> std::io::Result<bool> {
    Ok(std::fs::metadata(path)?.permissions().mode() & 0o077 == 0)
}

/// Why a file named by configuration could not be read ([`read_bounded`]).
#[derive(Debug, thiserror::Error)]
pub enum BoundedReadError {
    #[error("cannot open `{}`", path.display())]
    Open {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("`{}` is a symbolic link; medea does not follow links to files it reads for secrets", path.display())]
    Symlink { path: PathBuf },
    #[error("`{}` is not a regular file (it is {kind})", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("`{}` is larger than {max} bytes", path.display())]
    TooLarge { path: PathBuf, max: u64 },
    #[error("`{}` may be read by group or others (mode {mode:o}); make it 0600", path.display())]
    Loose { path: PathBuf, mode: u32 },
    #[error("cannot read `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
}

/// Who may read a file [`read_bounded`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privacy {
    /// A secret (a token): no group or other permission bits.
    Private,
    /// Not a secret (a CA bundle): any mode.
    Any,
}

/// Read a file that configuration names (a credential's token or CA bundle): the last path
/// component is opened with `O_NOFOLLOW` (a symbolic link is refused) and `O_NONBLOCK` (a
/// FIFO cannot block the open), the opened file must be a regular file (`/dev/zero`, a FIFO
/// or a directory is refused before a byte is read), and at most `max` bytes are read (a
/// larger file is refused, even one that grows while it is read).
pub fn read_bounded(path: &Path, max: u64, privacy: Privacy) -> Result<Vec<u8>, BoundedReadError> {
    use std::io::Read as _;
    use std::os::unix::fs::FileTypeExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|err| {
            if err.raw_os_error() == Some(libc::ELOOP) {
                BoundedReadError::Symlink {
                    path: path.to_path_buf(),
                }
            } else {
                BoundedReadError::Open {
                    path: path.to_path_buf(),
                    err,
                }
            }
        })?;
    let meta = file.metadata().map_err(|err| BoundedReadError::Read {
        path: path.to_path_buf(),
        err,
    })?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let kind = if ft.is_dir() {
            "a directory"
        } else if ft.is_char_device() {
            "a character device"
        } else if ft.is_block_device() {
            "a block device"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(BoundedReadError::NotRegular {
            path: path.to_path_buf(),
            kind,
        });
    }
    let mode = meta.permissions().mode() & 0o777;
    if privacy == Privacy::Private && mode & 0o077 != 0 {
        return Err(BoundedReadError::Loose {
            path: path.to_path_buf(),
            mode,
        });
    }
    if meta.len() > max {
        return Err(BoundedReadError::TooLarge {
            path: path.to_path_buf(),
            max,
        });
    }
    let mut out = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|err| BoundedReadError::Read {
            path: path.to_path_buf(),
            err,
        })?;
    if out.len() as u64 > max {
        return Err(BoundedReadError::TooLarge {
            path: path.to_path_buf(),
            max,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn files_are_0600_in_0700_dirs_and_replaced_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("a/b/token");
        write_private(&p, b"x", ExistingDir::Keep).unwrap();
        assert_eq!(mode(&p), 0o600);
        assert_eq!(mode(&tmp.path().join("a/b")), 0o700);
        assert_eq!(mode(&tmp.path().join("a")), 0o700);
        assert!(is_private(&p).unwrap());
        write_private(&p, b"y", ExistingDir::Keep).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"y");
        assert_eq!(mode(&p), 0o600);
        // No temporary file is left behind.
        let left: Vec<_> = std::fs::read_dir(tmp.path().join("a/b"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("token")]);
    }

    #[test]
    fn a_wide_existing_file_becomes_0600() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("d/key");
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        std::fs::set_permissions(tmp.path().join("d"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        std::fs::write(&p, b"old").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&p, b"new", ExistingDir::RefuseLoose).unwrap();
        assert_eq!(mode(&p), 0o600);
    }

    #[test]
    fn an_existing_loose_dir_is_kept_or_refused_never_re_moded() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("loose");
        std::fs::create_dir(&dir).unwrap();
        let loosen =
            || std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();

        loosen();
        write_private(&dir.join("k"), b"1", ExistingDir::Keep).unwrap();
        assert_eq!(mode(&dir), 0o755, "a user's directory is left alone");
        assert_eq!(mode(&dir.join("k")), 0o600);

        let e = write_private(&dir.join("k"), b"2", ExistingDir::RefuseLoose).unwrap_err();
        assert!(
            matches!(&e, PrivateFileError::LooseDir { mode: 0o755, path } if path == &dir),
            "{e:?}"
        );
        assert!(e.to_string().contains("make it 0700"), "{e}");
        assert_eq!(
            std::fs::read(dir.join("k")).unwrap(),
            b"1",
            "nothing written"
        );

        // An existing directory is never re-moded (issue #49 item 7): it used to be made 0700
        // (`--state-dir $HOME` made a home directory 0700).
        write_private(&dir.join("k"), b"3", ExistingDir::Keep).unwrap();
        assert_eq!(mode(&dir), 0o755);
        assert_eq!(mode(&dir.join("k")), 0o600);
        assert_eq!(std::fs::read(dir.join("k")).unwrap(), b"3");
    }

    #[test]
    fn errors_keep_their_os_cause() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, b"").unwrap();
        // A directory under a regular file cannot be created.
        let e = write_private(&file.join("sub/k"), b"x", ExistingDir::Keep).unwrap_err();
        assert!(matches!(e, PrivateFileError::CreateDir { .. }), "{e:?}");
        assert!(std::error::Error::source(&e).is_some());
        let io = e.into_io();
        assert!(
            io.to_string()
                .contains("cannot create the private directory"),
            "{io}"
        );
    }

    #[test]
    fn streams_open_0600() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("snap.part");
        let mut f = open_private(&p).unwrap();
        f.write_all(b"abc").unwrap();
        assert_eq!(mode(&p), 0o600);
        sync_dir(tmp.path()).unwrap();
    }

    #[test]
    fn bounded_reads_refuse_links_devices_fifos_and_large_files() {
        let tmp = tempfile::tempdir().unwrap();
        let ok = tmp.path().join("token");
        write_private(&ok, b"s3cret\n", ExistingDir::Keep).unwrap();
        assert_eq!(
            read_bounded(&ok, 64, Privacy::Private).unwrap(),
            b"s3cret\n"
        );
        // A symbolic link, even to a good file, is refused.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&ok, &link).unwrap();
        let e = read_bounded(&link, 64, Privacy::Private).unwrap_err();
        assert!(matches!(e, BoundedReadError::Symlink { .. }), "{e:?}");
        // A device is refused before any byte is read (no 64 KiB of zeros, no hang).
        let started = std::time::Instant::now();
        let e = read_bounded(Path::new("/dev/zero"), 65536, Privacy::Any).unwrap_err();
        assert!(
            matches!(
                e,
                BoundedReadError::NotRegular {
                    kind: "a character device",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        // A FIFO nobody writes does not block the open.
        let fifo = tmp.path().join("fifo");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        let e = read_bounded(&fifo, 64, Privacy::Any).unwrap_err();
        assert!(
            matches!(e, BoundedReadError::NotRegular { kind: "a FIFO", .. }),
            "{e:?}"
        );
        // A directory.
        let e = read_bounded(tmp.path(), 64, Privacy::Any).unwrap_err();
        assert!(matches!(e, BoundedReadError::NotRegular { .. }), "{e:?}");
        // Too large.
        let big = tmp.path().join("big");
        write_private(&big, &[b'x'; 65], ExistingDir::Keep).unwrap();
        let e = read_bounded(&big, 64, Privacy::Private).unwrap_err();
        assert!(
            matches!(e, BoundedReadError::TooLarge { max: 64, .. }),
            "{e:?}"
        );
        // A secret others may read.
        std::fs::set_permissions(&ok, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_bounded(&ok, 64, Privacy::Private).unwrap_err();
        assert!(
            matches!(e, BoundedReadError::Loose { mode: 0o644, .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("make it 0600"), "{e}");
        assert_eq!(read_bounded(&ok, 64, Privacy::Any).unwrap(), b"s3cret\n");
    }
}
