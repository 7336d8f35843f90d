//! Reading a revision: a directory tree or a git commit. The one I/O edge of `desired`.
//!
//! Directory mode reads `*.yaml`/`*.yml` below the root (hidden entries and `approvals/` are
//! skipped) and `approvals/**/*.sig` as approval markers. Git mode reads the same paths from the
//! committed tree at a ref with gix; the work tree, the index and uncommitted edits are ignored.
//!
//! Nothing outside the desired tree is ever read: a symbolic link (file or directory, in the
//! directory or committed as mode 120000) is a [`Refused`] entry, never followed. Directory
//! mode walks with directory descriptors: every directory and file below the root is opened
//! relative to its parent's descriptor (`openat`) with `O_NOFOLLOW` (directories with
//! `O_DIRECTORY` too, files with `O_NONBLOCK`), so a component swapped for a symlink during
//! the walk is refused, never followed; files must be regular files. Reading is bounded by
//! [`limits`]; in git mode an object's size comes from its header before it is inflated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use super::model::Revision;
use super::parse::MAX_FILE_BYTES;

/// Where the desired state comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A directory on disk, read as it is now.
    Dir(PathBuf),
    /// A ref of a git repository, read from its committed tree (the work tree is ignored).
    Git {
        /// A path inside the repository: the desired root.
        path: PathBuf,
        /// The ref to read (branch, tag or sha).
        reference: String,
    },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Dir(p) => write!(f, "{}", p.display()),
            Source::Git { path, reference } => write!(f, "{} at {reference}", path.display()),
        }
    }
}

/// One file of a revision, path relative to the desired root with `/` separators. The bytes
/// are shared (an `Arc`) with the loader's cache, never copied per revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Path relative to the desired root, `/` separators.
    pub path: String,
    /// The file's bytes, shared with the loader's cache.
    pub bytes: Arc<[u8]>,
}

/// How long after its last change a file's stamp is trusted to tell its bytes
/// ([`Stamp::settled_before`]). Far above the filesystems' timestamp granularity (the kernel's
/// coarse clock ticks every few milliseconds; FAT keeps 2 s) and small next to human edits.
pub const RACY_MARGIN: Duration = Duration::from_secs(2);

/// A file's identity and change stamp as the filesystem reports it: the "stat data" git's
/// index keeps to tell an unchanged file without reading it (device, inode, size, mtime and
/// ctime with their nanoseconds).
///
/// A write changes the mtime and ctime to the current time, a rename-over changes the inode,
/// `touch -d` or `cp -p` set the mtime back but move the ctime (which nobody can set). Only a
/// write within the same timestamp tick as the read can leave the stamp as it was: that is
/// what [`Stamp::settled_before`] rules out ("racy" files are read again, as in git).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Device id of the filesystem holding the file.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Seconds and nanoseconds since the epoch.
    pub mtime: (i64, i64),
    /// Status-change time: seconds and nanoseconds since the epoch.
    pub ctime: (i64, i64),
}

impl Stamp {
    /// The stamp of a file from its metadata.
    pub fn of(meta: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The stamp of an `lstat` made relative to a directory descriptor.
    #[allow(
        clippy::unnecessary_cast,
        reason = "the kernel's stat field types differ between architectures"
    )]
    pub fn of_stat(st: &rustix::fs::Stat) -> Stamp {
        Stamp {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            size: st.st_size as u64,
            mtime: (st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as i64),
        }
    }

    /// Whether bytes read during a scan that started at `scan` are still the file's bytes
    /// while the file shows this same stamp: its last change (the later of mtime and ctime)
    /// is older than the scan by more than [`RACY_MARGIN`], so any write after the read would
    /// have moved the stamp. A file changed within the margin is "racy" and is read again.
    pub fn settled_before(&self, scan: SystemTime) -> bool {
        let ns = |(s, n): (i64, i64)| i128::from(s) * 1_000_000_000 + i128::from(n);
        let changed = ns(self.mtime).max(ns(self.ctime));
        let Ok(scan) = scan.duration_since(SystemTime::UNIX_EPOCH) else {
            return false;
        };
        let limit = scan.as_nanos() as i128 - RACY_MARGIN.as_nanos() as i128;
        changed < limit
    }
}

/// A file whose bytes a reader may use instead of reading it: given its path and its stamp
/// now, the bytes read before when the stamp proves them current (see [`read_with`]).
pub type Reuse<'a> = &'a dyn Fn(&str, &Stamp) -> Option<Arc<[u8]>>;

/// What [`read_with`] read: the snapshot, the stamp of every resource file it holds (directory
/// mode; empty in git mode), how many files were reused unread, and when the scan started
/// (what [`Stamp::settled_before`] compares the stamps with next time).
#[derive(Debug, Clone)]
pub struct Stamped {
    /// The files read, and reused from the previous scan.
    pub snapshot: Snapshot,
    /// Stamp of every resource file, by relative path (empty in git mode).
    pub stamps: BTreeMap<String, Stamp>,
    /// How many files were reused from the previous scan without being read.
    pub unread: usize,
    /// When this scan started.
    pub scan: SystemTime,
}

/// A candidate approval marker (`approvals/**/*.sig`), verified by `approval`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerFile {
    /// Path relative to the desired root, `/` separators.
    pub path: String,
    /// The marker's bytes (an SSH signature), at most `MAX_FILE_BYTES`.
    pub contents: Vec<u8>,
}

/// Everything read from one revision, before parsing.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The resource files (`*.yaml`, `*.yml` outside `approvals/`).
    pub files: Vec<SourceFile>,
    /// The approval marker candidates (`approvals/**/*.sig`).
    pub markers: Vec<MarkerFile>,
    /// The git commit sha, in git mode.
    pub commit: Option<String>,
    /// Entries not read (a symlink, a limit exceeded): each becomes an error diagnostic, so a
    /// revision with one never yields a plan.
    pub refused: Vec<Refused>,
}

/// What one revision may contain. Exceeding one is an error diagnostic naming the limit; the
/// loader stops reading at the limit, so the daemon's memory stays bounded whatever is committed.
pub mod limits {
    /// Bytes of one resource or marker file.
    pub const MAX_FILE_BYTES: usize = super::MAX_FILE_BYTES;
    /// Resource and marker files read from one revision.
    pub const MAX_FILES: usize = 2_000;
    /// Bytes of all resource and marker files of one revision.
    pub const MAX_TOTAL_BYTES: u64 = 32 * 1024 * 1024;
    /// Directory entries below the root (directory mode), or entries of every tree object
    /// read (git mode: the trees on the way to the desired root too, hidden entries too).
    pub const MAX_ENTRIES: usize = 100_000;
    /// Bytes of one git tree object (from its header, before it is inflated).
    pub const MAX_TREE_BYTES: u64 = 8 * 1024 * 1024;
    /// Bytes of all git tree objects read from one revision.
    pub const MAX_TREE_TOTAL_BYTES: u64 = 64 * 1024 * 1024;
    /// YAML documents in one file.
    pub const MAX_DOCUMENTS_PER_FILE: usize = crate::desired::parse::MAX_DOCUMENTS_PER_FILE;
    /// YAML documents in one revision (issue #49): twenty times the largest fleet `medea
    /// bench` plans (1,000 clusters of 3 to 5 pools); the documents past it are not validated.
    pub const MAX_DOCUMENTS: usize = 20_000;
    /// Node pools of one cluster (issue #49): a pool holds any number of machines, so more
    /// pools than this is a mistake or an attack on the planner; the pools past it are not
    /// validated.
    pub const MAX_POOLS_PER_CLUSTER: usize = 1_000;
}

/// An entry of the tree that was not read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Relative path (`/` separators); empty for the whole tree.
    pub path: String,
    /// Why it was not read.
    pub reason: RefusedReason,
}

/// Why an entry of the desired-state tree was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedReason {
    /// A symbolic link: never followed.
    Symlink,
    /// Not a regular file (a FIFO, socket or device under a resource or marker name).
    NotARegularFile,
    /// Larger than [`limits::MAX_FILE_BYTES`].
    FileTooLarge,
    /// More than [`limits::MAX_FILES`] files: this one and the rest were not read.
    TooManyFiles,
    /// More than [`limits::MAX_TOTAL_BYTES`] in all: this file and the rest were not read.
    TooManyBytes,
    /// More than [`limits::MAX_ENTRIES`] entries below the root: the walk stopped.
    TooManyEntries,
    /// A git tree object larger than [`limits::MAX_TREE_BYTES`]: not inflated; the walk stopped.
    TreeTooLarge,
    /// More than [`limits::MAX_TREE_TOTAL_BYTES`] of git tree objects: the walk stopped.
    TooManyTreeBytes,
}

impl Refused {
    /// The diagnostic message (never any byte of the entry itself).
    pub fn message(&self) -> String {
        match self.reason {
            RefusedReason::Symlink => "is a symbolic link: medea never follows links in the desired state (nothing outside the desired directory is read)".into(),
            RefusedReason::NotARegularFile => "is not a regular file".into(),
            RefusedReason::FileTooLarge => format!(
                "file is larger than {} MiB (limit MAX_FILE_BYTES)",
                limits::MAX_FILE_BYTES / (1024 * 1024)
            ),
            RefusedReason::TooManyFiles => format!(
                "more than {} resource and marker files (limit MAX_FILES): this file and the rest were not read",
                limits::MAX_FILES
            ),
            RefusedReason::TooManyBytes => format!(
                "more than {} MiB of resource and marker files in all (limit MAX_TOTAL_BYTES): this file and the rest were not read",
                limits::MAX_TOTAL_BYTES / (1024 * 1024)
            ),
            RefusedReason::TooManyEntries => format!(
                "more than {} entries below the desired root (limit MAX_ENTRIES): the rest was not read",
                limits::MAX_ENTRIES
            ),
            RefusedReason::TreeTooLarge => format!(
                "git tree object larger than {} MiB (limit MAX_TREE_BYTES): it was not read, nor the rest of the tree",
                limits::MAX_TREE_BYTES / (1024 * 1024)
            ),
            RefusedReason::TooManyTreeBytes => format!(
                "more than {} MiB of git tree objects in all (limit MAX_TREE_TOTAL_BYTES): the rest was not read",
                limits::MAX_TREE_TOTAL_BYTES / (1024 * 1024)
            ),
        }
    }
    /// How to fix the refusal, one sentence for the diagnostic's help.
    pub fn help(&self) -> &'static str {
        match self.reason {
            RefusedReason::Symlink => "commit the file itself, not a link to it",
            RefusedReason::NotARegularFile => "desired-state files are regular files",
            _ => {
                "split the desired state, or point medea at a smaller directory (the limits are in design/server.md)"
            }
        }
    }
}

/// Counts what a read admitted against [`limits`].
#[derive(Default)]
struct Budget {
    files: usize,
    bytes: u64,
    entries: usize,
    /// A whole-tree limit was hit: nothing more is read.
    exhausted: bool,
    refused: Vec<Refused>,
}

impl Budget {
    fn refuse(&mut self, path: &str, reason: RefusedReason) {
        self.refused.push(Refused {
            path: path.to_string(),
            reason,
        });
    }
    /// One more entry walked; false (recorded once) past [`limits::MAX_ENTRIES`].
    fn entry(&mut self) -> bool {
        if self.exhausted {
            return false;
        }
        self.entries += 1;
        if self.entries > limits::MAX_ENTRIES {
            self.exhausted = true;
            self.refuse("", RefusedReason::TooManyEntries);
            return false;
        }
        true
    }
    /// Admit the file `path` of `size` bytes (from its metadata or object header, before
    /// reading it); false, recorded, when it may not be read.
    fn admit(&mut self, path: &str, size: u64) -> bool {
        if self.exhausted {
            return false;
        }
        if size > limits::MAX_FILE_BYTES as u64 {
            self.refuse(path, RefusedReason::FileTooLarge);
            return false;
        }
        if self.files + 1 > limits::MAX_FILES {
            self.exhausted = true;
            self.refuse(path, RefusedReason::TooManyFiles);
            return false;
        }
        if self.bytes + size > limits::MAX_TOTAL_BYTES {
            self.exhausted = true;
            self.refuse(path, RefusedReason::TooManyBytes);
            return false;
        }
        self.files += 1;
        self.bytes += size;
        true
    }
    /// The file grew between its metadata and the read: count what was read.
    fn correct(&mut self, admitted: u64, read: u64) {
        self.bytes = self.bytes - admitted + read;
    }
}

/// Why the desired state could not be read at all (nothing is planned).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The directory does not exist or is not a directory.
    #[error("desired-state directory `{path}` does not exist or is not a directory")]
    NotADir {
        /// The path given.
        path: PathBuf,
    },
    /// A file or directory could not be read.
    #[error("failed to read `{path}`")]
    Read {
        /// The path that failed.
        path: PathBuf,
        /// The I/O error.
        #[source]
        err: std::io::Error,
    },
    /// The path is not inside a git repository.
    #[error("`{path}` is not inside a git repository")]
    NotARepo {
        /// The path given.
        path: PathBuf,
        /// Why git could not open it.
        #[source]
        err: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The git ref does not resolve to a commit.
    #[error("git ref `{reference}` not found in `{path}`")]
    RefNotFound {
        /// The repository path.
        path: PathBuf,
        /// The ref as given (branch, tag or sha).
        reference: String,
        /// Why it did not resolve.
        #[source]
        err: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The commit's tree could not be read.
    #[error("failed to read the git tree of `{reference}` in `{path}`")]
    Git {
        /// The repository path.
        path: PathBuf,
        /// The ref as given.
        reference: String,
        /// Why the tree could not be read.
        #[source]
        err: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// A path with an empty, hidden (`.x`) or parent (`..`) segment is never read.
fn ordinary(rel: &str) -> bool {
    rel.split('/')
        .all(|seg| !seg.is_empty() && !seg.starts_with('.'))
}

/// Whether a relative path is a resource file: `*.yaml`/`*.yml`, not hidden, not under `approvals/`.
pub fn is_resource_path(rel: &str) -> bool {
    let hidden = !ordinary(rel);
    !hidden && !rel.starts_with("approvals/") && (rel.ends_with(".yaml") || rel.ends_with(".yml"))
}

/// Approval marker candidates: `approvals/**/*.sig` (verified by `approval`).
pub fn is_marker_path(rel: &str) -> bool {
    let hidden = !ordinary(rel);
    !hidden && rel.starts_with("approvals/") && rel.ends_with(".sig")
}

/// The content revision: sha256 over the sorted resource files (never the markers).
pub fn content_hash(files: &[SourceFile]) -> String {
    let mut sorted: Vec<&SourceFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    let mut h = Sha256::new();
    h.update(b"medea-desired-v1\0");
    for f in sorted {
        h.update((f.path.len() as u64).to_le_bytes());
        h.update(f.path.as_bytes());
        h.update((f.bytes.len() as u64).to_le_bytes());
        h.update(&f.bytes);
    }
    hex::encode(h.finalize())
}

/// The revision of a snapshot: content hash (refused entries included) and commit.
pub fn revision_of(snapshot: &Snapshot) -> Revision {
    let mut content = content_hash(&snapshot.files);
    if !snapshot.refused.is_empty() {
        // A refused entry changes the revision (never its bytes: they were not read).
        let mut h = Sha256::new();
        h.update(content.as_bytes());
        for r in &snapshot.refused {
            h.update(b"\0refused\0");
            h.update(r.path.as_bytes());
            h.update(format!("{:?}", r.reason).as_bytes());
        }
        content = hex::encode(h.finalize());
    }
    Revision {
        content,
        commit: snapshot.commit.clone(),
    }
}

/// Read a revision.
pub fn read(source: &Source) -> Result<Snapshot, SourceError> {
    Ok(read_with(source, &|_, _| None)?.snapshot)
}

/// Read a revision, taking a resource file's bytes from `reuse` instead of reading them
/// when it has them for the file's stamp (directory mode; git mode reads every object). The
/// snapshot is the one [`read`] gives, as long as `reuse` only returns bytes its stamp
/// proves current.
pub fn read_with(source: &Source, reuse: Reuse<'_>) -> Result<Stamped, SourceError> {
    // Before the first stamp is taken: a write after this instant stamps a later time.
    let scan = SystemTime::now();
    match source {
        Source::Dir(root) => read_dir(root, reuse, scan),
        Source::Git { path, reference } => Ok(Stamped {
            snapshot: read_git(path, reference)?,
            stamps: BTreeMap::new(),
            unread: 0,
            scan,
        }),
    }
}

/// A directory listed but not yet opened: its parent's descriptor and its name there.
struct Pending {
    parent: Arc<rustix::fd::OwnedFd>,
    name: std::ffi::CString,
    path: PathBuf,
}

fn read_dir(root: &Path, reuse: Reuse<'_>, scan: SystemTime) -> Result<Stamped, SourceError> {
    use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
    use std::os::unix::ffi::OsStrExt;
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |err: rustix::io::Errno| SourceError::Read {
            path,
            err: err.into(),
        }
    };
    // The root as the operator named it (links the operator chose are fine); below it, every
    // directory is opened relative to its parent's descriptor with O_NOFOLLOW | O_DIRECTORY,
    // so a directory swapped for a symlink mid-walk is refused, never followed, and no path
    // is resolved from the root again (issue #32).
    let root_fd = match rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => {
            return Err(SourceError::NotADir {
                path: root.to_path_buf(),
            });
        }
        Err(e) => return Err(io_err(root)(e)),
    };
    let mut files = Vec::new();
    let mut markers = Vec::new();
    let mut stamps = BTreeMap::new();
    let mut unread = 0;
    let mut budget = Budget::default();
    let mut pending: Vec<Pending> = Vec::new();
    let mut next = Some((root_fd, root.to_path_buf()));
    'walk: loop {
        let (fd, dir) = match next.take() {
            Some(d) => d,
            None => {
                let Some(p) = pending.pop() else {
                    break;
                };
                match rustix::fs::openat(
                    &*p.parent,
                    p.name.as_c_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => (fd, p.path),
                    // Replaced since it was listed: a symlink is refused; anything else
                    // that is no longer a directory is left to the next reload.
                    Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                        let link = rustix::fs::statat(
                            &*p.parent,
                            p.name.as_c_str(),
                            AtFlags::SYMLINK_NOFOLLOW,
                        )
                        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
                        if link {
                            budget.refuse(&rel_path(root, &p.path), RefusedReason::Symlink);
                        }
                        continue;
                    }
                    Err(e) => return Err(io_err(&p.path)(e)),
                }
            }
        };
        let fd = Arc::new(fd);
        let entries = Dir::read_from(&*fd).map_err(io_err(&dir))?;
        for entry in entries {
            let entry = entry.map_err(io_err(&dir))?;
            let name = entry.file_name();
            let bytes = name.to_bytes();
            if bytes.starts_with(b".") {
                continue;
            }
            if !budget.entry() {
                break 'walk;
            }
            let path = dir.join(std::ffi::OsStr::from_bytes(bytes));
            // The entry's own type (getdents, or lstat relative to the directory when the
            // filesystem does not say): a symlink is never followed.
            let ft = match entry.file_type() {
                FileType::Unknown => rustix::fs::statat(&*fd, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| FileType::from_raw_mode(st.st_mode))
                    .map_err(io_err(&path))?,
                ft => ft,
            };
            let rel = rel_path(root, &path);
            if ft == FileType::Symlink {
                budget.refuse(&rel, RefusedReason::Symlink);
                continue;
            }
            if ft == FileType::Directory {
                pending.push(Pending {
                    parent: fd.clone(),
                    name: name.to_owned(),
                    path,
                });
                continue;
            }
            let wanted = is_resource_path(&rel) || is_marker_path(&rel);
            if !wanted {
                continue;
            }
            if ft != FileType::RegularFile {
                budget.refuse(&rel, RefusedReason::NotARegularFile);
                continue;
            }
            let marker = is_marker_path(&rel);
            // A resource file whose stamp (lstat relative to its directory: the entry itself,
            // never a link's target) proves the bytes read before current is not opened:
            // admitted as the read would admit it (its size then is the stamp's), the bytes
            // taken from `reuse`.
            if !marker
                && let Ok(st) = rustix::fs::statat(&*fd, name, AtFlags::SYMLINK_NOFOLLOW)
                && FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
            {
                let stamp = Stamp::of_stat(&st);
                if let Some(bytes) = reuse(&rel, &stamp) {
                    if budget.admit(&rel, stamp.size) {
                        budget.correct(stamp.size, bytes.len() as u64);
                        stamps.insert(rel.clone(), stamp);
                        files.push(SourceFile { path: rel, bytes });
                        unread += 1;
                    }
                    continue;
                }
            }
            let Some((bytes, stamp)) = read_bounded(&fd, name, &path, &rel, &mut budget)? else {
                continue;
            };
            if marker {
                markers.push(MarkerFile {
                    path: rel,
                    contents: bytes,
                });
            } else {
                stamps.insert(rel.clone(), stamp);
                files.push(SourceFile {
                    path: rel,
                    bytes: bytes.into(),
                });
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    markers.sort_by(|a, b| a.path.cmp(&b.path));
    budget.refused.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Stamped {
        snapshot: Snapshot {
            files,
            markers,
            commit: None,
            refused: budget.refused,
        },
        stamps,
        unread,
        scan,
    })
}

/// Open `name` in the directory `dir` without following a symlink and without blocking on a
/// FIFO, check it is a regular file within the budget, and read at most
/// [`limits::MAX_FILE_BYTES`] + 1 bytes, with the file's stamp taken before reading (a write
/// during the read moves the stamp the next read sees). `None`: refused (recorded in
/// `budget`).
fn read_bounded(
    dir: &rustix::fd::OwnedFd,
    name: &std::ffi::CStr,
    path: &Path,
    rel: &str,
    budget: &mut Budget,
) -> Result<Option<(Vec<u8>, Stamp)>, SourceError> {
    use rustix::fs::{Mode, OFlags};
    use std::io::Read;
    let read_err = |err| SourceError::Read {
        path: path.to_path_buf(),
        err,
    };
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        // Replaced by a symlink since the directory was listed.
        Err(rustix::io::Errno::LOOP) => {
            budget.refuse(rel, RefusedReason::Symlink);
            return Ok(None);
        }
        Err(e) => return Err(read_err(e.into())),
    };
    let f = std::fs::File::from(fd);
    let meta = f.metadata().map_err(read_err)?;
    if !meta.is_file() {
        budget.refuse(rel, RefusedReason::NotARegularFile);
        return Ok(None);
    }
    if !budget.admit(rel, meta.len()) {
        return Ok(None);
    }
    let mut buf = Vec::new();
    // One byte over the limit is enough to report the file as too large.
    f.take(limits::MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(read_err)?;
    budget.correct(meta.len(), buf.len() as u64);
    Ok(Some((buf, Stamp::of(&meta))))
}

fn rel_path(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

fn read_git(path: &Path, reference: &str) -> Result<Snapshot, SourceError> {
    let git_err = |err: Box<dyn std::error::Error + Send + Sync>| SourceError::Git {
        path: path.to_path_buf(),
        reference: reference.to_string(),
        err,
    };
    let repo = gix::discover(path).map_err(|err| SourceError::NotARepo {
        path: path.to_path_buf(),
        err: Box::new(err),
    })?;
    // The desired root may be a subdirectory of the repository.
    let prefix = match repo.workdir() {
        Some(wd) => {
            let wd = wd.canonicalize().map_err(|err| SourceError::Read {
                path: wd.to_path_buf(),
                err,
            })?;
            let here = path.canonicalize().map_err(|err| SourceError::Read {
                path: path.to_path_buf(),
                err,
            })?;
            let rel = rel_path(&wd, &here);
            if rel.is_empty() {
                String::new()
            } else {
                format!("{rel}/")
            }
        }
        None => String::new(),
    };
    let id = repo
        .rev_parse_single(reference)
        .map_err(|err| SourceError::RefNotFound {
            path: path.to_path_buf(),
            reference: reference.to_string(),
            err: Box::new(err),
        })?;
    let commit = id
        .object()
        .map_err(|e| git_err(Box::new(e)))?
        .peel_to_commit()
        .map_err(|e| git_err(Box::new(e)))?;
    let sha = commit.id.to_string();
    // The root tree's id only: no tree is inflated before its header passed the budget.
    let root = commit.tree_id().map_err(|e| git_err(Box::new(e)))?.detach();
    let mut budget = Budget::default();
    let wanted = walk_git(&repo, root, &prefix, &mut budget).map_err(git_err)?;
    let mut files = Vec::new();
    let mut markers = Vec::new();
    for (rel, oid) in wanted {
        // The size from the object's header, before inflating it.
        let header = repo.find_header(oid).map_err(|e| git_err(Box::new(e)))?;
        if !budget.admit(&rel, header.size()) {
            continue;
        }
        let obj = repo.find_object(oid).map_err(|e| git_err(Box::new(e)))?;
        let mut bytes = obj.detach().data;
        bytes.truncate(limits::MAX_FILE_BYTES + 1);
        if is_marker_path(&rel) {
            markers.push(MarkerFile {
                path: rel,
                contents: bytes,
            });
        } else {
            files.push(SourceFile {
                path: rel,
                bytes: bytes.into(),
            });
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    markers.sort_by(|a, b| a.path.cmp(&b.path));
    budget.refused.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Snapshot {
        files,
        markers,
        commit: Some(sha),
        refused: budget.refused,
    })
}

/// Walk the committed tree from `root` breadth first, descending only toward the desired root
/// (`prefix`, `""` or ending in `/`) and, inside it, into directories that are not hidden.
/// Every tree object's size comes from its header and is checked against
/// [`limits::MAX_TREE_BYTES`] and [`limits::MAX_TREE_TOTAL_BYTES`] before it is inflated;
/// every entry of every tree read counts against [`limits::MAX_ENTRIES`] (hidden ones and
/// those beside the way to the root too). Symlinks are refused; only the wanted blobs' paths
/// (relative to the desired root) and ids are kept.
fn walk_git(
    repo: &gix::Repository,
    root: gix::ObjectId,
    prefix: &str,
    budget: &mut Budget,
) -> Result<Vec<(String, gix::ObjectId)>, Box<dyn std::error::Error + Send + Sync>> {
    let mut wanted = Vec::new();
    let mut tree_bytes: u64 = 0;
    // (the tree's path in the repository, `""` or ending in `/`; its id)
    let mut queue = std::collections::VecDeque::from([(String::new(), root)]);
    'walk: while let Some((dir, oid)) = queue.pop_front() {
        let shown = dir
            .strip_prefix(prefix)
            .unwrap_or(&dir)
            .trim_end_matches('/')
            .to_string();
        let size = repo.find_header(oid)?.size();
        if size > limits::MAX_TREE_BYTES {
            budget.refuse(&shown, RefusedReason::TreeTooLarge);
            budget.exhausted = true;
            break;
        }
        tree_bytes += size;
        if tree_bytes > limits::MAX_TREE_TOTAL_BYTES {
            budget.refuse(&shown, RefusedReason::TooManyTreeBytes);
            budget.exhausted = true;
            break;
        }
        let tree = repo.find_tree(oid)?;
        for entry in tree.iter() {
            let entry = entry?;
            if !budget.entry() {
                break 'walk;
            }
            let mode = entry.inner.mode;
            let full = format!("{dir}{}", entry.inner.filename);
            let Some(rel) = full.strip_prefix(prefix) else {
                // Above the root: descend only toward it.
                let below = format!("{full}/");
                if mode.is_tree() && prefix.starts_with(&below) {
                    queue.push_back((below, entry.inner.oid.to_owned()));
                }
                continue;
            };
            if !ordinary(rel) {
                continue;
            }
            if mode.is_tree() {
                queue.push_back((format!("{full}/"), entry.inner.oid.to_owned()));
            } else if mode.is_link() {
                budget.refuse(rel, RefusedReason::Symlink);
            } else if (is_resource_path(rel) || is_marker_path(rel)) && mode.is_blob() {
                wanted.push((rel.to_string(), entry.inner.oid.to_owned()));
            }
        }
    }
    Ok(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 32: the walk descends with directory descriptors. A directory swapped for a
    /// symlink after it was listed (here: while its parent's files are read, through the
    /// `reuse` hook the walk calls for each resource file) is refused, and nothing behind the
    /// link is read. Before, the walk re-resolved the path from the root and followed the link.
    #[test]
    fn a_directory_swapped_for_a_symlink_mid_walk_is_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("desired");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("a.yaml"), "a: 1\n").unwrap();
        std::fs::write(root.join("sub/b.yaml"), "b: 1\n").unwrap();
        std::fs::write(outside.join("secret.yaml"), "SECRET: 1\n").unwrap();
        let swapped = std::cell::Cell::new(false);
        let reuse = |rel: &str, _: &Stamp| -> Option<Arc<[u8]>> {
            if rel == "a.yaml" && !swapped.replace(true) {
                std::fs::rename(root.join("sub"), tmp.path().join("sub.moved")).unwrap();
                std::os::unix::fs::symlink(&outside, root.join("sub")).unwrap();
            }
            None
        };
        let read = read_with(&Source::Dir(root.clone()), &reuse).unwrap();
        assert!(
            swapped.get(),
            "the hook ran before the subdirectory was opened"
        );
        let paths: Vec<&str> = read
            .snapshot
            .files
            .iter()
            .map(|f| f.path.as_str())
            .collect();
        assert_eq!(paths, ["a.yaml"]);
        assert!(
            read.snapshot
                .files
                .iter()
                .all(|f| !String::from_utf8_lossy(&f.bytes).contains("SECRET"))
        );
        assert_eq!(
            read.snapshot.refused,
            [Refused {
                path: "sub".into(),
                reason: RefusedReason::Symlink
            }]
        );
    }

    /// A file swapped for a symlink after its directory was listed is refused too, and so is
    /// a symlink listed as such; a directory reached by descriptor reads as before.
    #[test]
    fn symlinked_files_are_refused_and_subdirectories_are_read() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("d");
        std::fs::create_dir_all(root.join("x/y")).unwrap();
        std::fs::write(root.join("x/y/c.yaml"), "c: 1\n").unwrap();
        std::fs::write(root.join("x/a.yaml"), "a: 1\n").unwrap();
        std::fs::write(tmp.path().join("secret"), "SECRET\n").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret"), root.join("x/l.yaml")).unwrap();
        let read = read_with(&Source::Dir(root.clone()), &|_, _| None).unwrap();
        let paths: Vec<&str> = read
            .snapshot
            .files
            .iter()
            .map(|f| f.path.as_str())
            .collect();
        assert_eq!(paths, ["x/a.yaml", "x/y/c.yaml"]);
        assert_eq!(
            read.snapshot.refused,
            [Refused {
                path: "x/l.yaml".into(),
                reason: RefusedReason::Symlink
            }]
        );
        assert!(matches!(
            read_with(&Source::Dir(root.join("nope")), &|_, _| None),
            Err(SourceError::NotADir { .. })
        ));
    }

    #[test]
    fn the_budget_stops_at_each_limit() {
        let mut b = Budget::default();
        for _ in 0..limits::MAX_ENTRIES {
            assert!(b.entry());
        }
        assert!(!b.entry(), "one entry too many");
        assert!(!b.entry());
        assert!(!b.admit("a.yaml", 1), "nothing more is read");
        assert_eq!(b.refused.len(), 1, "recorded once");
        assert_eq!(b.refused[0].reason, RefusedReason::TooManyEntries);
        assert!(b.refused[0].message().contains("limit MAX_ENTRIES"));

        let mut b = Budget::default();
        assert!(!b.admit("big.yaml", limits::MAX_FILE_BYTES as u64 + 1));
        assert!(b.admit("ok.yaml", limits::MAX_FILE_BYTES as u64));
        assert_eq!(b.refused[0].reason, RefusedReason::FileTooLarge);
    }

    #[test]
    fn which_paths_are_read() {
        for yes in ["approvals/abc-alice@x.sig", "approvals/team/2025/a.sig"] {
            assert!(is_marker_path(yes), "{yes}");
            assert!(!is_resource_path(yes), "{yes}");
        }
        for no in [
            "approvals/a.txt",
            "approvals/.sig",
            "approvals/x/.sig",
            "approvals/../a.sig",
            "other/approvals/a.sig",
            "approvals//a.sig",
            "approvals.sig",
        ] {
            assert!(!is_marker_path(no), "{no}");
        }
        assert!(is_resource_path("home/cluster.yaml"));
        assert!(is_resource_path("a.yml"));
        for no in [
            ".github/x.yaml",
            "approvals/x.yaml",
            "home/.hidden.yaml",
            "notes.txt",
            "a//b.yaml",
        ] {
            assert!(!is_resource_path(no), "{no}");
        }
    }
}
