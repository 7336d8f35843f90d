//! Scheduled etcd backups (issue #37): taking one, recording it, cleaning up after a crash.
//!
//! A backup is the Talos `EtcdSnapshot` stream of one control-plane member, streamed through
//! the rollout's Talos port ([`TalosPort::etcd_snapshot_stream`], the same RPC as the
//! pre-upgrade snapshot), encrypted on the fly to the cluster's age recipients (the private
//! keys are never on the medea host, and no plaintext byte touches a disk), and written to a
//! [`Destination`]: the embedded `local` one is `<state-dir>/backups/<cluster>/`, 0700, files
//! 0600, written as a hidden temporary file, fsynced, renamed, the directory fsynced.
//!
//! Journal ([`Table::Backups`], every write fenced by the leader's term):
//! 1. intent: `intent/<cluster>/<file>` ([`BackupIntent`]) — and, for a scheduled backup, the
//!    slot it stands for in `schedule/<cluster>` ([`ScheduleMark`]) — in one transaction,
//!    *before* the snapshot is asked for: a slot is taken at most once, even across a crash
//!    or a failover;
//! 2. the stream is checked (etcd's own sha256 trailer, as `etcdutl snapshot restore` checks
//!    it) while it is encrypted; a failed or truncated stream is discarded, never recorded;
//! 3. record: `backup/<cluster>/<file>` ([`BackupRecord`]) put and the intent deleted in one
//!    transaction.
//!
//! A crash between 1 and 3 leaves an intent: [`recover`] (run before a leader's first backup)
//! removes the file it names if it was written (an orphan: never counted as a backup) and
//! reports it. A file in the destination with neither record nor intent is foreign: reported,
//! left alone. Retention ([`prune`]) journals each deletion the same way.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::desired::backup::{BackupSettings, Due};
use crate::rollout::ports::{NodeTarget, PortError, TalosPort};
use crate::store::{Fence, Record, Store, StoreError, StoreExt, Table, Txn};

/// The embedded destination's name: `<state-dir>/backups/<cluster>/`.
pub const LOCAL: &str = crate::desired::backup::DEFAULT_DESTINATION;
/// Suffix of every backup file (an age-encrypted etcd snapshot).
pub const SUFFIX: &str = ".db.age";
/// Chunks in flight between the Talos stream and the encrypting writer.
const CHANNEL_CHUNKS: usize = 8;

/// Why a backup was scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trigger {
    /// A slot of `spec.backup.schedule`.
    Scheduled,
    /// `medea backup now`.
    Manual,
}

/// A backup that was taken, checked, encrypted, written and fsynced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupRecord {
    /// The cluster.
    pub cluster: String,
    /// File name in the destination (`<cluster>-<time>.db.age`).
    pub file: String,
    /// When the snapshot was asked for.
    pub taken_at: Timestamp,
    /// The schedule slot it stands for (`None`: taken by hand).
    #[serde(default)]
    pub slot: Option<Timestamp>,
    /// Scheduled or by hand.
    pub trigger: Trigger,
    /// The control-plane member that served the snapshot.
    pub member: String,
    /// Size of the etcd snapshot (plaintext, etcd's trailer included).
    pub snapshot_size: u64,
    /// sha256 of the etcd snapshot (plaintext), lowercase hex.
    pub snapshot_sha256: String,
    /// The etcd revision of the snapshot, read from its bbolt database as `etcdutl snapshot
    /// status` does (`ops::backup_revision`). `None`: it could not be read (the backup is still
    /// a backup: its integrity checks passed; the reason is logged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// Size of the encrypted file.
    pub size: u64,
    /// sha256 of the encrypted file, lowercase hex: what `verify` checks without a key.
    pub sha256: String,
    /// The destination's name.
    pub destination: String,
    /// The age recipients it is encrypted to.
    pub recipients: Vec<String>,
}

impl Record for BackupRecord {
    const TABLE: Table = Table::Backups;
    const KIND: &'static str = "backup";
    const SCHEMA: u32 = 1;
}

/// A backup begun and not yet recorded: written before the snapshot is asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupIntent {
    /// The cluster.
    pub cluster: String,
    /// The file it will write.
    pub file: String,
    /// The destination's name.
    pub destination: String,
    /// When it began.
    pub started_at: Timestamp,
    /// The schedule slot it takes (`None`: by hand).
    #[serde(default)]
    pub slot: Option<Timestamp>,
    /// The slot taken before it: if this backup is never recorded (a crash, a failover), the
    /// schedule goes back to it, so the slot is taken again, once, by the next leader.
    #[serde(default)]
    pub previous_slot: Option<Timestamp>,
}

impl Record for BackupIntent {
    const TABLE: Table = Table::Backups;
    const KIND: &'static str = "backup-intent";
    const SCHEMA: u32 = 1;
}

/// The last schedule slot a backup was begun for, per cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleMark {
    /// The slot.
    pub last_slot: Timestamp,
}

impl Record for ScheduleMark {
    const TABLE: Table = Table::Backups;
    const KIND: &'static str = "backup-schedule";
    const SCHEMA: u32 = 1;
}

/// When the last manual backup (`BackupNow`) of a cluster was begun: written with its intent,
/// before the snapshot is asked for, so a failed one counts too (it loaded etcd as much), and
/// read by [`take_now`] to refuse another within [`MANUAL_MIN_INTERVAL`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManualMark {
    /// When it began.
    pub last_started: Timestamp,
}

impl Record for ManualMark {
    const TABLE: Table = Table::Backups;
    const KIND: &'static str = "backup-manual";
    const SCHEMA: u32 = 1;
}

/// The shortest time between two manual backups of one cluster (`BackupNow`, issue #49 item 4).
/// Each asks a control-plane member for its whole etcd database (read from its disk, sent over
/// the network, encrypted, uploaded): a token holder calling it in a loop would load the
/// cluster's etcd and the destination, and, before manual backups had their own count, erased
/// every scheduled backup. An operator's "backup before I touch it" needs one; a failed one
/// (the destination down) can be retried after a fix within minutes.
pub const MANUAL_MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// A deletion begun (retention, or an orphan's removal) and not yet finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeletionIntent {
    /// The cluster.
    pub cluster: String,
    /// The file.
    pub file: String,
    /// The destination's name.
    pub destination: String,
    /// Why it goes.
    pub reason: String,
}

impl Record for DeletionIntent {
    const TABLE: Table = Table::Backups;
    const KIND: &'static str = "backup-deletion";
    const SCHEMA: u32 = 1;
}

/// Store key of a backup record.
pub fn record_key(cluster: &str, file: &str) -> String {
    format!("backup/{cluster}/{file}")
}
fn intent_key(cluster: &str, file: &str) -> String {
    format!("intent/{cluster}/{file}")
}
fn schedule_key(cluster: &str) -> String {
    format!("schedule/{cluster}")
}
fn manual_key(cluster: &str) -> String {
    format!("manual/{cluster}")
}
fn deletion_key(cluster: &str, file: &str) -> String {
    format!("deleting/{cluster}/{file}")
}

/// Why a backup operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The store refused or failed (a lost leadership included: stop acting).
    #[error("the backup journal of cluster `{cluster}` could not be written")]
    Store {
        /// The cluster.
        cluster: String,
        /// Why.
        #[source]
        err: Box<StoreError>,
    },
    /// No control-plane member to ask.
    #[error(
        "cluster `{cluster}` has no control-plane machine in the inventory to take a snapshot from"
    )]
    NoControlPlane {
        /// The cluster.
        cluster: String,
    },
    /// The snapshot stream failed or did not check out (truncated, trailer mismatch).
    #[error(
        "the etcd snapshot of cluster `{cluster}` from `{member}` failed; nothing was recorded"
    )]
    Snapshot {
        /// The cluster.
        cluster: String,
        /// The member asked.
        member: String,
        /// Why.
        #[source]
        err: Box<PortError>,
    },
    /// The destination failed.
    #[error("backup destination `{destination}` of cluster `{cluster}` failed")]
    Destination {
        /// The cluster.
        cluster: String,
        /// The destination's name.
        destination: String,
        /// Why.
        #[source]
        err: std::io::Error,
    },
    /// The destination's settings on the server do not check out.
    #[error(
        "the server's settings of backup destination `{destination}` of cluster `{cluster}` are refused"
    )]
    DestinationConfig {
        /// The cluster.
        cluster: String,
        /// The destination's name.
        destination: String,
        /// Why.
        #[source]
        err: Box<crate::ops::backup_s3::S3ConfigError>,
    },
    /// The destination name is not one this server has.
    #[error(
        "cluster `{cluster}` names backup destination `{destination}`, which this server does not have: it has `local`, and an S3-compatible one for each `<creds-dir>/{cluster}/backup-destinations/<name>/destination.yaml`"
    )]
    UnknownDestination {
        /// The cluster.
        cluster: String,
        /// The name.
        destination: String,
    },
    /// The cluster's Talos credentials could not be used.
    #[error("cannot reach the Talos API of cluster `{cluster}` for a backup")]
    Ports {
        /// The cluster.
        cluster: String,
        /// Why.
        #[source]
        err: Box<crate::ops::cluster_ports::AdapterError>,
    },
    /// Encrypting failed.
    #[error("encrypting the backup of cluster `{cluster}` failed")]
    Encrypt {
        /// The cluster.
        cluster: String,
        /// Why.
        #[source]
        err: Box<age::EncryptError>,
    },
}

/// Where backups of one cluster go: a small port at the edge, so other destinations (object
/// storage) plug in beside the local directory. Blocking calls: run them off the async
/// runtime's workers.
pub trait Destination: Send + Sync {
    /// The destination's name, as the desired state names it.
    fn name(&self) -> &str;
    /// Begin writing `file`; it becomes visible (to [`Destination::list`]) only on
    /// [`ObjectWriter::commit`].
    fn create(&self, file: &str) -> std::io::Result<Box<dyn ObjectWriter>>;
    /// The complete files, sorted.
    fn list(&self) -> std::io::Result<Vec<String>>;
    /// Whether `file` exists, complete or begun.
    fn exists(&self, file: &str) -> std::io::Result<bool>;
    /// Read `file`.
    fn open(&self, file: &str) -> std::io::Result<Box<dyn std::io::Read + Send>>;
    /// Remove `file` and anything begun under its name; `Ok` when nothing was there.
    fn delete(&self, file: &str) -> std::io::Result<()>;
}

/// A file being written to a [`Destination`].
pub trait ObjectWriter: Write + Send {
    /// Make the file durable and visible under its name.
    fn commit(self: Box<Self>) -> std::io::Result<()>;
    /// Throw away what was written.
    fn abort(self: Box<Self>);
}

/// The embedded destination: a directory medea owns, `<state-dir>/backups/<cluster>/` (0700,
/// files 0600).
pub struct LocalDir {
    root: PathBuf,
}

impl LocalDir {
    /// The local destination of `cluster` under `state_dir`.
    pub fn new(state_dir: &Path, cluster: &str) -> LocalDir {
        LocalDir {
            root: state_dir.join("backups").join(cluster),
        }
    }
    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
    fn checked(&self, file: &str) -> std::io::Result<PathBuf> {
        if file.is_empty() || file.starts_with('.') || file.contains('/') || file.contains('\0') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("`{file}` is not a backup file name"),
            ));
        }
        Ok(self.root.join(file))
    }
    fn part(&self, file: &str) -> PathBuf {
        self.root.join(format!(".{file}.part"))
    }
}

struct LocalWriter {
    file: std::io::BufWriter<std::fs::File>,
    part: PathBuf,
    dest: PathBuf,
    dir: PathBuf,
}

impl Write for LocalWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl ObjectWriter for LocalWriter {
    fn commit(self: Box<Self>) -> std::io::Result<()> {
        let LocalWriter {
            file,
            part,
            dest,
            dir,
        } = *self;
        let file = file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        if std::fs::symlink_metadata(&dest).is_ok() {
            let _ = std::fs::remove_file(&part);
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("`{}` already exists", dest.display()),
            ));
        }
        std::fs::rename(&part, &dest)?;
        crate::private_file::sync_dir(&dir)
    }
    fn abort(self: Box<Self>) {
        let part = self.part.clone();
        drop(self);
        let _ = std::fs::remove_file(part);
    }
}

impl Destination for LocalDir {
    fn name(&self) -> &str {
        LOCAL
    }
    fn create(&self, file: &str) -> std::io::Result<Box<dyn ObjectWriter>> {
        let dest = self.checked(file)?;
        crate::private_file::private_dir(&self.root, crate::private_file::ExistingDir::Keep)
            .map_err(crate::private_file::PrivateFileError::into_io)?;
        let part = self.part(file);
        let f = crate::private_file::open_private(&part)?;
        Ok(Box::new(LocalWriter {
            file: std::io::BufWriter::with_capacity(256 * 1024, f),
            part,
            dest,
            dir: self.root.clone(),
        }))
    }
    fn list(&self) -> std::io::Result<Vec<String>> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for e in entries {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') && e.file_type()?.is_file() {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }
    fn exists(&self, file: &str) -> std::io::Result<bool> {
        let dest = self.checked(file)?;
        Ok(std::fs::symlink_metadata(dest).is_ok()
            || std::fs::symlink_metadata(self.part(file)).is_ok())
    }
    fn open(&self, file: &str) -> std::io::Result<Box<dyn std::io::Read + Send>> {
        let dest = self.checked(file)?;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dest)?;
        Ok(Box::new(f))
    }
    fn delete(&self, file: &str) -> std::io::Result<()> {
        let dest = self.checked(file)?;
        let mut removed = false;
        for p in [dest, self.part(file)] {
            match std::fs::remove_file(&p) {
                Ok(()) => removed = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        if removed {
            crate::private_file::sync_dir(&self.root)?;
        }
        Ok(())
    }
}

/// Where this server keeps what its destinations need: the local destination's files, and the
/// settings and credentials of its other destinations.
#[derive(Debug, Clone)]
pub struct Dirs {
    /// `--state-dir`: the `local` destination is `<state-dir>/backups/<cluster>/`.
    pub state_dir: PathBuf,
    /// `--creds-dir`: destination `<name>` of a cluster is set up by
    /// `<creds-dir>/<cluster>/backup-destinations/<name>/` (see [`crate::ops::backup_s3`]).
    /// `None`: only `local`.
    pub creds_dir: Option<PathBuf>,
}

impl Dirs {
    /// Only the `local` destination, under `state_dir`.
    pub fn local(state_dir: &Path) -> Dirs {
        Dirs {
            state_dir: state_dir.to_path_buf(),
            creds_dir: None,
        }
    }
}

/// The destination `name` of `cluster`, as this server maps names: `local` is
/// `<state-dir>/backups/<cluster>/`; another name is the S3-compatible destination set up in
/// `<creds-dir>/<cluster>/backup-destinations/<name>/` (files the server owns, never the
/// repository).
pub fn destination(
    dirs: &Dirs,
    cluster: &str,
    name: &str,
) -> Result<Box<dyn Destination>, BackupError> {
    if name == LOCAL {
        return Ok(Box::new(LocalDir::new(&dirs.state_dir, cluster)));
    }
    let unknown = || BackupError::UnknownDestination {
        cluster: cluster.to_string(),
        destination: name.to_string(),
    };
    let Some(creds) = &dirs.creds_dir else {
        return Err(unknown());
    };
    if !crate::desired::validate::is_dns_label(name)
        || !crate::desired::validate::is_dns_label(cluster)
    {
        return Err(unknown());
    }
    let dir = crate::ops::backup_s3::destination_dir(creds, cluster, name);
    let config_err = |err| BackupError::DestinationConfig {
        cluster: cluster.to_string(),
        destination: name.to_string(),
        err: Box::new(err),
    };
    match crate::ops::backup_s3::S3Config::load(&dir).map_err(config_err)? {
        None => Err(unknown()),
        Some((config, credentials)) => Ok(Box::new(
            crate::ops::backup_s3::S3::new(name, cluster, config, credentials)
                .map_err(config_err)?,
        )),
    }
}

/// The file name of a backup of `cluster` taken at `at`: sorts by time.
pub fn file_name(cluster: &str, at: Timestamp) -> String {
    format!("{cluster}-{}{SUFFIX}", at.strftime("%Y%m%dT%H%M%SZ"))
}

/// Counts and hashes what passes through to the inner writer.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    size: u64,
}

impl<W: Write> Write for Hashing<W> {
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

/// Run `f`, which calls a destination (blocking: file I/O, or S3 requests retried with
/// backoff), without holding up the async runtime: on a multi-threaded runtime the worker hands
/// its other tasks over first (`block_in_place`); elsewhere `f` just runs.
fn off_the_workers<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// What one backup run is asked to do.
pub struct BackupRequest<'a> {
    /// The cluster.
    pub cluster: &'a str,
    /// Its applied backup settings.
    pub settings: &'a BackupSettings,
    /// Its control-plane members, in the order to try them.
    pub control_plane: &'a [NodeTarget],
    /// The time it begins (also the file's name).
    pub now: Timestamp,
    /// The slot of a scheduled backup (`None`: by hand).
    pub slot: Option<Timestamp>,
}

fn store_err(cluster: &str) -> impl Fn(StoreError) -> BackupError + '_ {
    move |err| BackupError::Store {
        cluster: cluster.to_string(),
        err: Box::new(err),
    }
}

fn fenced(txn: Txn, fence: Option<&Fence>) -> Txn {
    match fence {
        Some(f) => txn.fenced(f),
        None => txn,
    }
}

/// Whether a scheduled backup of `cluster` is due at `now` (reads the last slot taken).
pub fn due(
    store: &dyn Store,
    cluster: &str,
    settings: &BackupSettings,
    now: Timestamp,
) -> Result<Due, BackupError> {
    let last = store
        .get_record::<ScheduleMark>(&schedule_key(cluster))
        .map_err(store_err(cluster))?
        .map(|m| m.last_slot);
    Ok(settings.schedule.due(last, now))
}

/// Take one backup of a cluster: journal the intent (and the slot), stream the snapshot of the
/// first control-plane member that serves one through the age encryptor into `dest`, then
/// record it. The first member's failure is tried on the next; a snapshot that does not check
/// out is never recorded and its file is removed. `fence`: the leader's term every write is
/// conditional on (`None` for a single-process store in tests and `medea backup now` offline).
pub async fn take<T: TalosPort>(
    store: &dyn Store,
    fence: Option<&Fence>,
    talos: &T,
    dest: std::sync::Arc<dyn Destination>,
    req: BackupRequest<'_>,
) -> Result<BackupRecord, BackupError> {
    let cluster = req.cluster;
    let file = file_name(cluster, req.now);
    let mark_key = schedule_key(cluster);
    let mark = store
        .get(Table::Backups, &mark_key)
        .map_err(store_err(cluster))?;
    let previous_slot = match &mark {
        Some(bytes) => Some(
            crate::store::record::decode::<ScheduleMark>(&mark_key, bytes)
                .map_err(store_err(cluster))?
                .last_slot,
        ),
        None => None,
    };
    let intent = BackupIntent {
        cluster: cluster.to_string(),
        file: file.clone(),
        destination: dest.name().to_string(),
        started_at: req.now,
        slot: req.slot,
        previous_slot,
    };
    // A second backup of the same cluster in the same second (a manual one beside a scheduled
    // one) would write the same file: the second is refused here, before anything is written.
    let mut txn = Txn::new()
        .check(crate::store::Check::Absent(
            Table::Backups,
            intent_key(cluster, &file),
        ))
        .check(crate::store::Check::Absent(
            Table::Backups,
            record_key(cluster, &file),
        ))
        .put_record(intent_key(cluster, &file), &intent);
    if let Some(slot) = req.slot {
        // Compare-and-swap on the mark: of two passes that read the same last slot, one takes
        // the new slot and the other is refused.
        txn = txn
            .check(match mark {
                Some(bytes) => crate::store::Check::Equals(Table::Backups, mark_key.clone(), bytes),
                None => crate::store::Check::Absent(Table::Backups, mark_key.clone()),
            })
            .put_record(mark_key, &ScheduleMark { last_slot: slot });
    } else {
        // A manual backup: when it began, for the rate limit ([`take_now`]), compare-and-swap
        // as the schedule's mark, so of two that read the same mark only one is begun.
        let key = manual_key(cluster);
        let manual = store
            .get(Table::Backups, &key)
            .map_err(store_err(cluster))?;
        txn = txn
            .check(match manual {
                Some(bytes) => crate::store::Check::Equals(Table::Backups, key.clone(), bytes),
                None => crate::store::Check::Absent(Table::Backups, key.clone()),
            })
            .put_record(
                key,
                &ManualMark {
                    last_started: req.now,
                },
            );
    }
    store
        .commit(fenced(txn, fence))
        .map_err(store_err(cluster))?;

    if req.control_plane.is_empty() {
        forget_intent(store, fence, cluster, &file)?;
        return Err(BackupError::NoControlPlane {
            cluster: cluster.to_string(),
        });
    }
    let mut last_err = None;
    for member in req.control_plane {
        match stream_one(talos, dest.clone(), cluster, member, &file, req.settings).await {
            Ok(written) => {
                let record = BackupRecord {
                    cluster: cluster.to_string(),
                    file: file.clone(),
                    taken_at: req.now,
                    slot: req.slot,
                    trigger: if req.slot.is_some() {
                        Trigger::Scheduled
                    } else {
                        Trigger::Manual
                    },
                    member: member.node.clone(),
                    snapshot_size: written.snapshot_size,
                    snapshot_sha256: written.snapshot_sha256,
                    revision: written.revision,
                    size: written.size,
                    sha256: written.sha256,
                    destination: dest.name().to_string(),
                    recipients: req
                        .settings
                        .recipients
                        .iter()
                        .map(|r| r.as_str().to_string())
                        .collect(),
                };
                let txn = Txn::new()
                    .put_record(record_key(cluster, &file), &record)
                    .delete(Table::Backups, intent_key(cluster, &file));
                store
                    .commit(fenced(txn, fence))
                    .map_err(store_err(cluster))?;
                return Ok(record);
            }
            // Another member would meet the same destination: stop here.
            Err(e @ (BackupError::Destination { .. } | BackupError::Encrypt { .. })) => {
                forget_intent(store, fence, cluster, &file)?;
                return Err(e);
            }
            Err(e) => {
                tracing::warn!(cluster, member = %member.node, error = %crate::error_chain(&e), "backup: snapshot failed");
                last_err = Some(e);
            }
        }
    }
    forget_intent(store, fence, cluster, &file)?;
    Err(last_err.unwrap_or(BackupError::NoControlPlane {
        cluster: cluster.to_string(),
    }))
}

fn forget_intent(
    store: &dyn Store,
    fence: Option<&Fence>,
    cluster: &str,
    file: &str,
) -> Result<(), BackupError> {
    store
        .commit(fenced(
            Txn::new().delete(Table::Backups, intent_key(cluster, file)),
            fence,
        ))
        .map_err(store_err(cluster))
}

struct Written {
    snapshot_size: u64,
    snapshot_sha256: String,
    revision: Option<i64>,
    size: u64,
    sha256: String,
}

/// Stream one member's snapshot, encrypted, into `file`; commit the file only if the stream
/// checked out and the encryption finished. On any failure nothing stays in the destination.
async fn stream_one<T: TalosPort>(
    talos: &T,
    dest: std::sync::Arc<dyn Destination>,
    cluster: &str,
    member: &NodeTarget,
    file: &str,
    settings: &BackupSettings,
) -> Result<Written, BackupError> {
    let cluster_err = |err: std::io::Error| BackupError::Destination {
        cluster: cluster.to_string(),
        destination: dest.name().to_string(),
        err,
    };
    let recipients: Vec<age::x25519::Recipient> =
        settings.recipients.iter().map(|r| r.to_age()).collect();
    let encryptor =
        age::Encryptor::with_recipients(recipients.iter().map(|r| r as &dyn age::Recipient))
            .map_err(|err| BackupError::Encrypt {
                cluster: cluster.to_string(),
                err: Box::new(err),
            })?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(CHANNEL_CHUNKS);
    let writer_dest = dest.clone();
    let writer_file = file.to_string();
    // The consumer: blocking file I/O and encryption on a blocking thread. It returns the
    // still-uncommitted writer, so the caller commits only once the stream checked out.
    let consumer = tokio::task::spawn_blocking(move || -> std::io::Result<_> {
        let object = writer_dest.create(&writer_file)?;
        let hashing = Hashing {
            inner: object,
            hash: Sha256::new(),
            size: 0,
        };
        let mut enc = match encryptor.wrap_output(hashing) {
            Ok(e) => e,
            Err(e) => {
                let _ = writer_dest.delete(&writer_file);
                return Err(e);
            }
        };
        // The revision is read from the plaintext as it passes, before encryption.
        let mut revision = crate::ops::backup_revision::RevisionReader::default();
        while let Some(chunk) = rx.blocking_recv() {
            revision.update(&chunk);
            if let Err(e) = enc.write_all(&chunk) {
                // Dropping the encryptor drops the writer; remove the part file.
                let _ = writer_dest.delete(&writer_file);
                return Err(e);
            }
        }
        let hashing = match enc.finish() {
            Ok(h) => h,
            Err(e) => {
                let _ = writer_dest.delete(&writer_file);
                return Err(e);
            }
        };
        Ok((hashing, revision))
    });
    let streamed = talos.etcd_snapshot_stream(member, tx).await;
    let written = consumer
        .await
        .map_err(|e| cluster_err(std::io::Error::other(e)));
    let snapshot_err = |err| BackupError::Snapshot {
        cluster: cluster.to_string(),
        member: member.node.clone(),
        err: Box::new(err),
    };
    let failure = match (streamed, written) {
        (Ok(s), Ok(Ok((mut h, revision)))) => {
            let flushed = h.flush();
            let (size, sha256) = (h.size, hex::encode(h.hash.finalize()));
            let object = h.inner;
            let done = tokio::task::spawn_blocking(move || {
                flushed?;
                object.commit()
            })
            .await
            .map_err(|e| cluster_err(std::io::Error::other(e)))
            .and_then(|r| r.map_err(cluster_err));
            match done {
                Ok(()) => {
                    let revision = match revision.finish() {
                        Ok(rev) => Some(rev),
                        Err(e) => {
                            tracing::warn!(cluster, member = %member.node, error = %e, "backup: the snapshot's etcd revision cannot be read; recorded without it");
                            None
                        }
                    };
                    return Ok(Written {
                        snapshot_size: s.size,
                        snapshot_sha256: s.sha256,
                        revision,
                        size,
                        sha256,
                    });
                }
                Err(e) => e,
            }
        }
        // The destination failed (the stream then fails too: its consumer is gone): report the
        // destination, not the member.
        (_, Ok(Err(e))) => cluster_err(e),
        (Err(err), _) => snapshot_err(err),
        (Ok(_), Err(e)) => e,
    };
    // Whatever failed, nothing of this backup stays in the destination.
    let _ = tokio::task::spawn_blocking({
        let (dest, file) = (dest.clone(), file.to_string());
        move || dest.delete(&file)
    })
    .await;
    Err(failure)
}

/// What [`recover`] found in one cluster's journal and destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Files a crash left between write and record, now removed (never counted as backups).
    pub orphans_removed: Vec<String>,
    /// Schedule slots whose backup was never recorded, given back to be taken again once.
    pub slots_given_back: Vec<Timestamp>,
    /// Begun deletions finished.
    pub deletions_finished: Vec<String>,
    /// Files in the destination medea has no record or intent of: reported, left alone.
    pub foreign: Vec<String>,
}

/// After a restart or a failover, before the new leader's first backup of `cluster`: finish
/// what a crash interrupted. An intent without a record names an orphan (or nothing, when the
/// crash came before the file was begun): its file is removed, then the intent, and the
/// schedule slot it took is given back (the next pass takes it once more). A begun deletion is
/// finished.
pub fn recover(
    store: &dyn Store,
    fence: Option<&Fence>,
    cluster: &str,
    dest: &dyn Destination,
) -> Result<Recovery, BackupError> {
    let mut out = Recovery::default();
    let derr = |err| BackupError::Destination {
        cluster: cluster.to_string(),
        destination: dest.name().to_string(),
        err,
    };
    let intents = store
        .scan_records::<BackupIntent>(&intent_key(cluster, ""))
        .map_err(store_err(cluster))?;
    for (key, intent) in intents {
        if intent.destination != dest.name() {
            continue;
        }
        let recorded = store
            .get_record::<BackupRecord>(&record_key(cluster, &intent.file))
            .map_err(store_err(cluster))?
            .is_some();
        if !recorded && dest.exists(&intent.file).map_err(derr)? {
            dest.delete(&intent.file).map_err(derr)?;
            out.orphans_removed.push(intent.file.clone());
        }
        let mut txn = Txn::new().delete(Table::Backups, key);
        // The slot this unrecorded backup took is given back (once: the mark must still be
        // that slot), so the next pass takes it again instead of leaving it without a backup.
        let mark_key = schedule_key(cluster);
        if !recorded
            && let Some(slot) = intent.slot
            && let Some(bytes) = store
                .get(Table::Backups, &mark_key)
                .map_err(store_err(cluster))?
            && crate::store::record::decode::<ScheduleMark>(&mark_key, &bytes)
                .map_err(store_err(cluster))?
                .last_slot
                == slot
        {
            txn = txn.check(crate::store::Check::Equals(
                Table::Backups,
                mark_key.clone(),
                bytes,
            ));
            txn = match intent.previous_slot {
                Some(prev) => txn.put_record(mark_key, &ScheduleMark { last_slot: prev }),
                None => txn.delete(Table::Backups, mark_key),
            };
            out.slots_given_back.push(slot);
        }
        store
            .commit(fenced(txn, fence))
            .map_err(store_err(cluster))?;
    }
    let deletions = store
        .scan_records::<DeletionIntent>(&deletion_key(cluster, ""))
        .map_err(store_err(cluster))?;
    for (key, d) in deletions {
        if d.destination != dest.name() {
            continue;
        }
        dest.delete(&d.file).map_err(derr)?;
        store
            .commit(fenced(
                Txn::new()
                    .delete(Table::Backups, key)
                    .delete(Table::Backups, record_key(cluster, &d.file)),
                fence,
            ))
            .map_err(store_err(cluster))?;
        out.deletions_finished.push(d.file);
    }
    let known: std::collections::BTreeSet<String> =
        list(store, cluster)?.into_iter().map(|r| r.file).collect();
    for f in dest.list().map_err(derr)? {
        if !known.contains(&f) {
            out.foreign.push(f);
        }
    }
    Ok(out)
}

/// The recorded backups of `cluster`, oldest first.
pub fn list(store: &dyn Store, cluster: &str) -> Result<Vec<BackupRecord>, BackupError> {
    let mut v: Vec<BackupRecord> = store
        .scan_records::<BackupRecord>(&record_key(cluster, ""))
        .map_err(store_err(cluster))?
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    v.sort_by(|a, b| a.taken_at.cmp(&b.taken_at).then(a.file.cmp(&b.file)));
    Ok(v)
}

/// Apply `retention` to the recorded backups of `cluster`. Scheduled and manual backups are
/// counted apart (issue #49 item 4): a backup goes when it is not among the `keep` newest *of
/// its trigger*, or is older than `maxAge` at `now`; the newest scheduled backup and the newest
/// manual one never go (every recorded backup was checked before it was recorded, so each is
/// the newest verified one of its kind). So `medea backup now`, which any token holder may call,
/// only ever pushes out older manual backups, never a scheduled one: at most `2 × keep` backups
/// are kept. Each deletion is journaled: a [`DeletionIntent`] before the file is removed, the
/// record and the intent deleted after ([`recover`] finishes one a crash interrupted).
/// Returns the files removed, oldest first.
///
/// Rollout jobs keep their pre-upgrade snapshots elsewhere (`<state-dir>/snapshots/`), never
/// in a backup destination, so pruning cannot remove a snapshot a job references.
pub fn prune(
    store: &dyn Store,
    fence: Option<&Fence>,
    cluster: &str,
    retention: &crate::desired::backup::Retention,
    dest: &dyn Destination,
    now: Timestamp,
) -> Result<Vec<String>, BackupError> {
    let all = list(store, cluster)?;
    let mut doomed = Vec::new();
    for trigger in [Trigger::Scheduled, Trigger::Manual] {
        let of_kind: Vec<&BackupRecord> = all.iter().filter(|r| r.trigger == trigger).collect();
        doomed.extend(to_prune(&of_kind, retention, now, trigger));
    }
    doomed.sort_by(|(a, _), (b, _)| a.taken_at.cmp(&b.taken_at).then(a.file.cmp(&b.file)));
    let mut removed = Vec::new();
    for (r, reason) in doomed {
        if r.destination != dest.name() {
            continue;
        }
        let intent = DeletionIntent {
            cluster: cluster.to_string(),
            file: r.file.clone(),
            destination: r.destination.clone(),
            reason,
        };
        store
            .commit(fenced(
                Txn::new().put_record(deletion_key(cluster, &r.file), &intent),
                fence,
            ))
            .map_err(store_err(cluster))?;
        dest.delete(&r.file)
            .map_err(|err| BackupError::Destination {
                cluster: cluster.to_string(),
                destination: dest.name().to_string(),
                err,
            })?;
        store
            .commit(fenced(
                Txn::new()
                    .delete(Table::Backups, record_key(cluster, &r.file))
                    .delete(Table::Backups, deletion_key(cluster, &r.file)),
                fence,
            ))
            .map_err(store_err(cluster))?;
        tracing::info!(cluster, file = %r.file, reason = %intent.reason, "backup: pruned");
        removed.push(r.file.clone());
    }
    Ok(removed)
}

/// The backups of one trigger (`records`, oldest first) that retention removes, with the
/// reason: beyond the `keep` newest of that trigger or older than `maxAge`; never the newest.
fn to_prune<'a>(
    records: &[&'a BackupRecord],
    retention: &crate::desired::backup::Retention,
    now: Timestamp,
    trigger: Trigger,
) -> Vec<(&'a BackupRecord, String)> {
    let keep = usize::try_from(retention.keep.max(1)).unwrap_or(usize::MAX);
    let kind = match trigger {
        Trigger::Scheduled => "scheduled",
        Trigger::Manual => "manual",
    };
    let newest = records.len().saturating_sub(1);
    let mut out = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if i == newest {
            continue;
        }
        let beyond_keep = records.len() - i > keep;
        let too_old = retention.max_age.is_some_and(|max| {
            std::time::Duration::try_from(now.duration_since(r.taken_at)).is_ok_and(|age| age > max)
        });
        if beyond_keep {
            out.push((*r, format!("not among the {keep} newest {kind} backups")));
        } else if too_old {
            out.push((*r, "older than retention.maxAge".to_string()));
        }
    }
    out
}

/// What one [`pass`] did, per cluster.
#[derive(Debug, Default)]
pub struct PassReport {
    /// Backups taken and recorded.
    pub taken: Vec<BackupRecord>,
    /// Clusters whose due backup failed, with the error.
    pub failed: Vec<(String, BackupError)>,
    /// What recovery found, per cluster it ran for.
    pub recovered: Vec<(String, Recovery)>,
    /// Files pruned, per cluster.
    pub pruned: Vec<(String, Vec<String>)>,
    /// The earliest next slot of any cluster (when to look again).
    pub next: Option<Timestamp>,
    /// Every cluster with backups on, after the pass: what the metrics show.
    pub status: Vec<ClusterStatus>,
}

/// A cluster's backups as the metrics and the alert rule see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The cluster.
    pub cluster: String,
    /// The schedule's current period: from its latest slot to the next (seconds).
    pub interval_secs: Option<u64>,
    /// The newest recorded backup: when it was taken and its size.
    pub newest: Option<(Timestamp, u64)>,
}

/// One pass of the backup schedule over every cluster whose **applied** settings turn backups
/// on: recover a cluster's journal once per leadership term (`recovered` remembers which), then
/// take the backup that is due at `now`, if any, and apply retention. The caller runs it only
/// while it leads and passes its fence, so a deposed leader's writes are refused by the store.
/// `talos_for` builds a cluster's Talos port (the server: from its credentials directory).
pub async fn pass<T, F>(
    store: &dyn Store,
    fence: Option<&Fence>,
    dirs: &Dirs,
    talos_for: F,
    now: Timestamp,
    recovered: &mut std::collections::BTreeSet<String>,
) -> Result<PassReport, BackupError>
where
    T: TalosPort,
    F: Fn(&str) -> Result<T, crate::ops::cluster_ports::AdapterError>,
{
    let mut report = PassReport::default();
    let mut enabled = Vec::new();
    let applied = crate::ops::replan::load_applied(store).map_err(store_err("*"))?;
    for name in applied.cluster_names() {
        let Some(summary) = applied
            .cluster_settings(&name)
            .and_then(|c| c.backup.as_ref())
        else {
            continue;
        };
        let settings = match summary.settings() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(cluster = %name, error = %crate::error_chain(&e), "backup: the applied settings are refused; no backup");
                continue;
            }
        };
        enabled.push((name.clone(), settings.schedule.clone()));
        let dest: std::sync::Arc<dyn Destination> = match destination(
            dirs,
            &name,
            &settings.destination,
        ) {
            Ok(d) => std::sync::Arc::from(d),
            Err(e) => {
                tracing::warn!(cluster = %name, error = %crate::error_chain(&e), "backup: the destination cannot be used; no backup");
                report.failed.push((name.clone(), e));
                continue;
            }
        };
        if !recovered.contains(&name) {
            // A destination that cannot be read (an unreachable S3 server) fails this
            // cluster's pass, not every cluster's: recovery runs again on the next pass.
            let r = match off_the_workers(|| recover(store, fence, &name, dest.as_ref())) {
                Ok(r) => r,
                Err(e @ BackupError::Store { .. }) => return Err(e),
                Err(e) => {
                    tracing::warn!(cluster = %name, error = %crate::error_chain(&e), "backup: recovering the journal failed; no backup until it succeeds");
                    report.failed.push((name.clone(), e));
                    continue;
                }
            };
            for f in &r.orphans_removed {
                tracing::warn!(cluster = %name, file = %f, "backup: removed an orphan a crash left between write and record (never counted as a backup)");
            }
            for f in &r.foreign {
                tracing::warn!(cluster = %name, file = %f, "backup: a file medea has no record of is in the destination; left alone");
            }
            recovered.insert(name.clone());
            report.recovered.push((name.clone(), r));
        }
        let slot = match due(store, &name, &settings, now)? {
            Due::Now { slot } => slot,
            Due::Later { next } => {
                report.next = earliest(report.next, next);
                continue;
            }
        };
        report.next = earliest(report.next, settings.schedule.next_after(now));
        let control_plane = control_plane_of(store, &name)?;
        let talos = match talos_for(&name) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(cluster = %name, error = %crate::error_chain(&e), "backup: no Talos credentials");
                report.failed.push((
                    name.clone(),
                    BackupError::Ports {
                        cluster: name.clone(),
                        err: Box::new(e),
                    },
                ));
                continue;
            }
        };
        let req = BackupRequest {
            cluster: &name,
            settings: &settings,
            control_plane: &control_plane,
            now,
            slot: Some(slot),
        };
        match take(store, fence, &talos, dest.clone(), req).await {
            Ok(rec) => {
                tracing::info!(cluster = %name, file = %rec.file, member = %rec.member, size = rec.size, "backup: taken");
                report.taken.push(rec);
                match off_the_workers(|| {
                    prune(store, fence, &name, &settings.retention, dest.as_ref(), now)
                }) {
                    Ok(pruned) => report.pruned.push((name.clone(), pruned)),
                    Err(e @ BackupError::Store { .. }) => return Err(e),
                    Err(e) => {
                        tracing::warn!(cluster = %name, error = %crate::error_chain(&e), "backup: retention failed; the next pass tries again");
                        report.failed.push((name.clone(), e));
                    }
                }
            }
            Err(e @ BackupError::Store { .. }) => return Err(e),
            Err(e) => {
                tracing::warn!(cluster = %name, error = %crate::error_chain(&e), "backup: failed; the next slot tries again");
                report.failed.push((name.clone(), e));
            }
        }
    }
    for (cluster, schedule) in enabled {
        let latest = schedule.latest_at_or_before(now).unwrap_or(now);
        let interval_secs = schedule
            .next_after(latest)
            .and_then(|next| u64::try_from(next.duration_since(latest).as_secs()).ok());
        let newest = list(store, &cluster)?.last().map(|r| (r.taken_at, r.size));
        report.status.push(ClusterStatus {
            cluster,
            interval_secs,
            newest,
        });
    }
    Ok(report)
}

/// Why `medea backup now` cannot take a backup of a cluster.
#[derive(Debug, thiserror::Error)]
pub enum NowError {
    /// The cluster's applied settings have no `spec.backup`.
    #[error("backups are off for cluster `{cluster}`: its applied settings have no `spec.backup`")]
    Off {
        /// The cluster.
        cluster: String,
    },
    /// The applied settings no longer check out.
    #[error("the applied backup settings of cluster `{cluster}` are refused")]
    Settings {
        /// The cluster.
        cluster: String,
        /// Why.
        #[source]
        err: crate::desired::backup::SummaryError,
    },
    /// A manual backup of the cluster was begun less than [`MANUAL_MIN_INTERVAL`] ago.
    #[error(
        "a manual backup of cluster `{cluster}` was begun at {last}; manual backups are limited to one every {} minutes per cluster (each reads the whole etcd database from a control-plane member): try again after {next}",
        MANUAL_MIN_INTERVAL.as_secs() / 60
    )]
    TooSoon {
        /// The cluster.
        cluster: String,
        /// When the last one began.
        last: Timestamp,
        /// When the next one may begin.
        next: Timestamp,
    },
    /// Taking it failed.
    #[error(transparent)]
    Backup(#[from] BackupError),
}

/// Take a backup of `cluster` now (`medea backup now`): its applied settings, no schedule slot
/// (the schedule is not moved), then retention (which counts manual backups apart from
/// scheduled ones, [`prune`]). Refused ([`NowError::TooSoon`]) within [`MANUAL_MIN_INTERVAL`]
/// of the last manual backup begun, failed ones included; the mark is in the store, so a
/// restart or a failover does not reset it.
pub async fn take_now<T: TalosPort>(
    store: &dyn Store,
    fence: Option<&Fence>,
    dirs: &Dirs,
    talos: &T,
    cluster: &str,
    now: Timestamp,
) -> Result<BackupRecord, NowError> {
    let applied = crate::ops::replan::load_applied(store).map_err(store_err(cluster))?;
    let summary = applied
        .cluster_settings(cluster)
        .and_then(|c| c.backup.as_ref())
        .ok_or_else(|| NowError::Off {
            cluster: cluster.to_string(),
        })?;
    let settings = summary.settings().map_err(|err| NowError::Settings {
        cluster: cluster.to_string(),
        err,
    })?;
    if let Some(mark) = store
        .get_record::<ManualMark>(&manual_key(cluster))
        .map_err(store_err(cluster))?
    {
        let next = mark
            .last_started
            .checked_add(MANUAL_MIN_INTERVAL)
            .unwrap_or(mark.last_started);
        if now < next {
            return Err(NowError::TooSoon {
                cluster: cluster.to_string(),
                last: mark.last_started,
                next,
            });
        }
    }
    let dest: std::sync::Arc<dyn Destination> =
        std::sync::Arc::from(destination(dirs, cluster, &settings.destination)?);
    let control_plane = control_plane_of(store, cluster)?;
    let req = BackupRequest {
        cluster,
        settings: &settings,
        control_plane: &control_plane,
        now,
        slot: None,
    };
    let rec = take(store, fence, talos, dest.clone(), req).await?;
    off_the_workers(|| {
        prune(
            store,
            fence,
            cluster,
            &settings.retention,
            dest.as_ref(),
            now,
        )
    })?;
    Ok(rec)
}

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

fn earliest(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The control-plane members of `cluster` as the inventory knows them, by node name.
fn control_plane_of(store: &dyn Store, cluster: &str) -> Result<Vec<NodeTarget>, BackupError> {
    let observed = store
        .get_record::<crate::inventory::ObservedCluster>(&crate::inventory::cluster_key(cluster))
        .map_err(store_err(cluster))?;
    Ok(observed
        .map(|o| {
            o.machines
                .values()
                .filter(|m| m.role == crate::inventory::MachineRole::Controlplane)
                .map(|m| NodeTarget {
                    node: m.node.clone(),
                    address: m.address.clone(),
                })
                .collect()
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_sort_by_time_and_stay_in_the_directory() {
        let a = file_name("prod", "2026-12-05T02:00:00Z".parse().unwrap());
        let b = file_name("prod", "2026-12-06T01:59:59Z".parse().unwrap());
        assert_eq!(a, "prod-20261205T020000Z.db.age");
        assert!(a < b);
        let d = LocalDir::new(Path::new("/state"), "prod");
        assert!(d.checked("../x").is_err());
        assert!(d.checked(".hidden").is_err());
        assert_eq!(
            d.checked(&a).unwrap(),
            Path::new("/state/backups/prod").join(&a)
        );
    }
}
