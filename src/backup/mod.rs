//! Scheduled etcd backups (issue #37): taking one, recording it, cleaning up after a crash.
//!
//! **Owns:** everything about etcd backups, in one home (issue #50): the journal and taking a
//! backup (here), destinations ([`s3`] and the local directory), the bbolt revision reader
//! ([`revision`]) and the retention of the rollout's pre-upgrade snapshots
//! ([`snapshot_retention`]).
//! **May depend on:** the `backup` row of design/architecture.md's code map (the one list,
//! checked by `tests/it/architecture.rs`).
//! **Used by:** `server` (the schedule's wiring, `server::backups`) and `cli`.
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

mod destination;
mod retention;
pub mod revision;
pub mod s3;
mod schedule;
pub mod snapshot_retention;
mod take;
mod verify;

pub use destination::*;
pub use retention::*;
pub use schedule::*;
pub use take::*;
pub use verify::*;

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
    /// status` does (`backup::revision`). `None`: it could not be read (the backup is still
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
        err: Box<crate::backup::s3::S3ConfigError>,
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
