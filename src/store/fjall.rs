//! The embedded backend: one fjall database in one directory, one keyspace per table.
//!
//! Transactions run on fjall's single-writer transactional database (serializable); checks are
//! read inside the write transaction, so check-and-write is atomic. Durable commits use
//! `PersistMode::SyncAll`. fjall's lock file makes a second process fail to open the store,
//! which is why its leadership is `Leadership::solo` and `Check::Leader` is the solo term.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fjall::{
    KeyspaceCreateOptions, PersistMode, Readable, SingleWriterTxDatabase, SingleWriterTxKeyspace,
};

use super::leader::SOLO_TERM;
use super::{Check, Durability, Op, Store, StoreError, Table, Txn};

/// The store directory format this medea writes and reads.
pub const FORMAT_VERSION: u32 = 1;
const FORMAT_KEY: &str = "store-format";

pub struct FjallStore {
    db: SingleWriterTxDatabase,
    tables: BTreeMap<Table, SingleWriterTxKeyspace>,
    path: PathBuf,
}

impl std::fmt::Debug for FjallStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FjallStore")
            .field("path", &self.path)
            .finish()
    }
}

fn backend(op: &'static str) -> impl FnOnce(fjall::Error) -> StoreError {
    move |err| StoreError::Backend {
        op,
        err: Box::new(err),
    }
}

impl FjallStore {
    /// Open (or create) the store in `path`. The directory is created 0700.
    pub fn open(path: &Path) -> Result<FjallStore, StoreError> {
        let open_err = |err: Box<dyn std::error::Error + Send + Sync>| StoreError::Open {
            path: path.to_path_buf(),
            err,
        };
        create_private_dir(path).map_err(|e| open_err(Box::new(e)))?;
        let db = SingleWriterTxDatabase::builder(path)
            .open()
            .map_err(|e| match e {
                fjall::Error::Locked => StoreError::Locked {
                    path: path.to_path_buf(),
                },
                other => open_err(Box::new(other)),
            })?;
        let mut tables = BTreeMap::new();
        for t in Table::ALL {
            let ks = db
                .keyspace(t.name(), KeyspaceCreateOptions::default)
                .map_err(|e| open_err(Box::new(e)))?;
            tables.insert(t, ks);
        }
        let store = FjallStore {
            db,
            tables,
            path: path.to_path_buf(),
        };
        match store.get(Table::Meta, FORMAT_KEY)? {
            Some(bytes) => {
                let found: u32 = std::str::from_utf8(&bytes)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| open_err("the store format marker is unreadable".into()))?;
                if found > FORMAT_VERSION {
                    return Err(StoreError::NewerFormat {
                        path: path.to_path_buf(),
                        found,
                        supported: FORMAT_VERSION,
                    });
                }
            }
            None => store.commit(
                Txn::new()
                    .check(Check::Absent(Table::Meta, FORMAT_KEY.into()))
                    .put(
                        Table::Meta,
                        FORMAT_KEY,
                        FORMAT_VERSION.to_string().into_bytes(),
                    ),
            )?,
        }
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn ks(&self, t: Table) -> &SingleWriterTxKeyspace {
        &self.tables[&t]
    }
}

/// Create `path` (and parents) with mode 0700 for the last component (an existing directory
/// is left as it is: never re-moded): [`crate::private_file::private_dir`].
pub fn create_private_dir(path: &Path) -> std::io::Result<()> {
    crate::private_file::private_dir(path, crate::private_file::ExistingDir::Keep)
        .map_err(crate::private_file::PrivateFileError::into_io)
}

impl Store for FjallStore {
    fn get(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let v = self.ks(table).get(key).map_err(backend("get"))?;
        Ok(v.map(|v| v.to_vec()))
    }

    fn scan(&self, table: Table, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let snap = self.db.read_tx();
        let mut out = Vec::new();
        for guard in snap.prefix(self.ks(table), prefix) {
            let (k, v) = guard.into_inner().map_err(backend("scan"))?;
            let key = String::from_utf8(k.to_vec()).map_err(|e| StoreError::Backend {
                op: "scan",
                err: Box::new(e),
            })?;
            out.push((key, v.to_vec()));
        }
        Ok(out)
    }

    fn scan_keys(&self, table: Table, prefix: &str) -> Result<Vec<String>, StoreError> {
        let snap = self.db.read_tx();
        let mut out = Vec::new();
        for guard in snap.prefix(self.ks(table), prefix) {
            // The key alone: the value is not copied out (nor read from a blob file when
            // fjall keeps it separated).
            let k = guard.key().map_err(backend("scan keys"))?;
            let key = String::from_utf8(k.to_vec()).map_err(|e| StoreError::Backend {
                op: "scan keys",
                err: Box::new(e),
            })?;
            out.push(key);
        }
        Ok(out)
    }

    fn commit(&self, txn: Txn) -> Result<(), StoreError> {
        let mode = match txn.durability {
            Durability::Durable => PersistMode::SyncAll,
            Durability::Buffered => PersistMode::Buffer,
        };
        // The process lock makes this process the only writer: its one leader is
        // `Leadership::solo`, whose term is SOLO_TERM. Any other term is a fence from some
        // other store and must not pass here. Leadership is reported before data conflicts,
        // as on etcd: it means "stop".
        for check in &txn.checks {
            if let Check::Leader(fence) = check
                && fence.term() != SOLO_TERM
            {
                return Err(StoreError::Fenced {
                    replica: fence.replica().to_string(),
                    term: fence.term(),
                });
            }
        }
        let mut tx = self.db.write_tx().durability(Some(mode));
        for check in &txn.checks {
            let (table, key, want) = match check {
                Check::Absent(t, k) => (*t, k, None),
                Check::Equals(t, k, v) => (*t, k, Some(v.as_slice())),
                Check::Leader(_) => continue,
            };
            let have = tx
                .get(self.ks(table), key.as_str())
                .map_err(backend("check"))?;
            if have.as_deref() != want {
                tx.rollback();
                return Err(StoreError::Conflict {
                    table: table.name(),
                    key: key.clone(),
                });
            }
        }
        for op in txn.ops {
            match op {
                Op::Put(t, k, v) => tx.insert(self.ks(t), k, v),
                Op::Delete(t, k) => tx.remove(self.ks(t), k),
            }
        }
        // With `durability(Some(SyncAll))` fjall's commit writes the batch to its journal and
        // `sync_all`s the journal file under the journal writer's lock before it returns
        // (fjall 3.1 `batch::commit` → `journal_writer.persist(mode)`), so a returned durable
        // commit is on disk. A buffered commit is written to the same, strictly sequential
        // journal, and becomes durable with the next durable commit (journal rotation also
        // syncs the sealed file first). A second `persist` here would only repeat the fsync.
        tx.commit().map_err(backend("commit"))?;
        Ok(())
    }
}
