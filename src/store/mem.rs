//! An in-memory store for tests: the [`Store`](crate::store::Store) contract without a disk.

use crate::Locked as _;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// An in-memory [`Store`](crate::store::Store) with the same check semantics as the fjall
/// backend, for fast executor tests.
#[derive(Debug, Default)]
pub struct MemStore {
    data: Mutex<BTreeMap<(crate::store::Table, String), Vec<u8>>>,
}

impl MemStore {
    pub fn new() -> MemStore {
        MemStore::default()
    }
}

impl crate::store::Store for MemStore {
    fn get(
        &self,
        table: crate::store::Table,
        key: &str,
    ) -> Result<Option<Vec<u8>>, crate::store::StoreError> {
        Ok(self.data.locked().get(&(table, key.to_string())).cloned())
    }

    fn scan(
        &self,
        table: crate::store::Table,
        prefix: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, crate::store::StoreError> {
        Ok(self
            .data
            .locked()
            .range((table, prefix.to_string())..)
            .take_while(|((t, k), _)| *t == table && k.starts_with(prefix))
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect())
    }

    fn scan_keys(
        &self,
        table: crate::store::Table,
        prefix: &str,
    ) -> Result<Vec<String>, crate::store::StoreError> {
        Ok(self
            .data
            .locked()
            .range((table, prefix.to_string())..)
            .take_while(|((t, k), _)| *t == table && k.starts_with(prefix))
            .map(|((_, k), _)| k.clone())
            .collect())
    }

    fn commit(&self, txn: crate::store::Txn) -> Result<(), crate::store::StoreError> {
        use crate::store::{Check, Op};
        let mut data = self.data.locked();
        for c in &txn.checks {
            let (t, k, want) = match c {
                Check::Absent(t, k) => (*t, k, None),
                Check::Equals(t, k, v) => (*t, k, Some(v)),
                // Like fjall: one process, one solo leader.
                Check::Leader(fence) if fence.term() == crate::store::leader::SOLO_TERM => continue,
                Check::Leader(fence) => {
                    return Err(crate::store::StoreError::Fenced {
                        replica: fence.replica().to_string(),
                        term: fence.term(),
                    });
                }
            };
            if data.get(&(t, k.clone())) != want {
                return Err(crate::store::StoreError::Conflict {
                    table: t.name(),
                    key: k.clone(),
                });
            }
        }
        for op in txn.ops {
            match op {
                Op::Put(t, k, v) => {
                    data.insert((t, k), v);
                }
                Op::Delete(t, k) => {
                    data.remove(&(t, k));
                }
            }
        }
        Ok(())
    }
}
