//! The store: the single source of truth for everything medea knows and has done.
//!
//! **Owns:** the [`Store`] trait (conditional atomic transactions over named tables), the
//! versioned record encoding ([`record`]), the embedded fjall backend ([`fjall`]), the
//! in-memory backend for tests ([`mem`], same check semantics as fjall), the etcd
//! backend for HA replicas (`etcd`, behind the `etcd` cargo feature), where a store lives
//! ([`location`]), and leadership with fencing ([`leader`]).
//! **May depend on:** the `store` row of design/architecture.md's code map; each record type
//! implements [`Record`] next to its definition, so the store names none of them.
//!
//! Architecture Invariant: every multi-key change is one [`Txn`], applied all-or-nothing; a
//! [`Durability::Durable`] commit is on disk (fsync) before `commit` returns, which is what the
//! rollout journal relies on ("intent before action").
//! Architecture Invariant: every value carries its record kind and schema version; a value
//! written by a newer medea is refused with [`StoreError::NewerRecord`], never misread.
//! Architecture Invariant: the trait maps one to one onto etcd transactions (compare → put/delete),
//! so an HA backend can implement it with the same semantics.
//! Architecture Invariant: a [`Check::Leader`] holds only while the fence's leadership term is
//! the store's current one; every write of a leader's loops (planner, refresh, executor) carries
//! one (see [`leader`]), so a deposed leader that wakes up cannot write.

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod fjall;
pub mod leader;
pub mod location;
pub mod mem;
pub mod record;

use std::path::PathBuf;

pub use leader::{Fence, FencedStore, Leadership, Role};
pub use record::{Record, StoreExt};

/// The tables of the store. Each backend maps a table to a keyspace (fjall) or key prefix (etcd).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// Store format, identity.
    Meta,
    /// Last applied desired state per resource.
    Desired,
    /// Observed inventory: clusters, pools, machines.
    Inventory,
    /// Computed plans by id, and the current-plan pointer.
    Plans,
    /// Approval records.
    Approvals,
    /// Rollout jobs.
    Jobs,
    /// The rollout journal: intents and results, per job.
    Journal,
    /// Scheduled etcd backups: records, intents, the last slot taken (issue #37).
    Backups,
}

impl Table {
    pub const ALL: [Table; 8] = [
        Table::Meta,
        Table::Desired,
        Table::Inventory,
        Table::Plans,
        Table::Approvals,
        Table::Jobs,
        Table::Journal,
        Table::Backups,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Table::Meta => "meta",
            Table::Desired => "desired",
            Table::Inventory => "inventory",
            Table::Plans => "plans",
            Table::Approvals => "approvals",
            Table::Jobs => "jobs",
            Table::Journal => "journal",
            Table::Backups => "backups",
        }
    }
}

/// How hard a commit is pushed to disk before `commit` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync'd: survives power loss. The default, and required for the journal.
    Durable,
    /// Written to the OS; survives a crash of medea, not of the host. For caches only.
    Buffered,
}

/// A precondition of a transaction, checked atomically with its writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// The key must not exist.
    Absent(Table, String),
    /// The key must hold exactly these bytes.
    Equals(Table, String, Vec<u8>),
    /// The fence's leadership term must still be the current one: the writer still leads.
    /// Get one from [`Leadership::check`] or [`Txn::fenced`].
    Leader(Fence),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put(Table, String, Vec<u8>),
    Delete(Table, String),
}

/// An atomic, conditional write: if every check holds, every op is applied; otherwise none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Txn {
    pub checks: Vec<Check>,
    pub ops: Vec<Op>,
    pub durability: Durability,
}

impl Default for Txn {
    fn default() -> Self {
        Txn::new()
    }
}

impl Txn {
    pub fn new() -> Txn {
        Txn {
            checks: Vec::new(),
            ops: Vec::new(),
            durability: Durability::Durable,
        }
    }
    pub fn check(mut self, c: Check) -> Txn {
        self.checks.push(c);
        self
    }
    pub fn put(mut self, table: Table, key: impl Into<String>, value: Vec<u8>) -> Txn {
        self.ops.push(Op::Put(table, key.into(), value));
        self
    }
    pub fn delete(mut self, table: Table, key: impl Into<String>) -> Txn {
        self.ops.push(Op::Delete(table, key.into()));
        self
    }
    pub fn buffered(mut self) -> Txn {
        self.durability = Durability::Buffered;
        self
    }
    pub fn push(&mut self, op: Op) {
        self.ops.push(op);
    }
    /// Make the transaction conditional on `fence`'s leadership term (see [`Check::Leader`]).
    pub fn fenced(self, fence: &Fence) -> Txn {
        self.check(Check::Leader(fence.clone()))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the store at `{path}` is locked by another medea process")]
    Locked { path: PathBuf },
    #[error(
        "the store at `{path}` was written by a newer medea (store format {found}, this medea reads up to {supported})"
    )]
    NewerFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("failed to open the store at `{path}`")]
    Open {
        path: PathBuf,
        #[source]
        err: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("store backend failed during {op}")]
    Backend {
        op: &'static str,
        #[source]
        err: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("a transaction precondition failed on {table}/{key}: the store changed concurrently")]
    Conflict { table: &'static str, key: String },
    /// Refused before writing: this replica does not lead. Stop acting; the leader does.
    #[error("replica `{replica}` is not the leader ({})", leader_note(.leader))]
    NotLeader {
        replica: String,
        leader: Option<String>,
    },
    /// Refused by the store: the writer's leadership term has ended (its lease expired or
    /// another replica was elected). Stop acting now; the new leader resumes from the journal.
    #[error(
        "write refused: the leadership term {term} of replica `{replica}` has ended (another replica leads, or its lease expired)"
    )]
    Fenced { replica: String, term: i64 },
    #[error(
        "record {table}/{key} was written by a newer medea ({kind} schema {found}, this medea reads up to {supported})"
    )]
    NewerRecord {
        table: &'static str,
        key: String,
        kind: &'static str,
        found: u32,
        supported: u32,
    },
    #[error("record {table}/{key} is corrupt or not a {kind}")]
    Decode {
        table: &'static str,
        key: String,
        kind: &'static str,
        #[source]
        err: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn leader_note(leader: &Option<String>) -> String {
    match leader {
        Some(l) => format!("replica `{l}` leads"),
        None => "no replica leads right now".into(),
    }
}

impl StoreError {
    /// Whether this error means "this process no longer leads": the caller must stop acting
    /// (no Talos or Kubernetes call) and leave the job to the current leader.
    pub fn is_leadership_lost(&self) -> bool {
        matches!(
            self,
            StoreError::NotLeader { .. } | StoreError::Fenced { .. }
        )
    }
}

/// A transactional key-value store of named tables.
///
/// Keys are UTF-8 strings; hierarchical keys use `/` (`cluster/home/machine/cp-1`) so prefix
/// scans list a subtree. Implementations must be safe to share between threads.
pub trait Store: Send + Sync {
    fn get(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Every key starting with `prefix`, in key order.
    fn scan(&self, table: Table, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
    /// Every key starting with `prefix`, in key order, without its value. The backends read
    /// keys only (fjall: the key of each entry, values are not copied out; etcd: a
    /// `keys_only` range), so listing plans costs their keys, not megabytes of plan JSON.
    /// The default reads through [`Store::scan`] (wrappers and test stores).
    fn scan_keys(&self, table: Table, prefix: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .scan(table, prefix)?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }
    /// Apply `txn` atomically; `Err(Conflict)` (and no change) when a check fails, `Err(Fenced)`
    /// (and no change) when a [`Check::Leader`] fails.
    fn commit(&self, txn: Txn) -> Result<(), StoreError>;
}
