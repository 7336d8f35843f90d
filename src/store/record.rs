//! Versioned record encoding: `{"kind": "...", "schema": N, "data": {...}}` as JSON.
//!
//! JSON keeps records inspectable and stable across serde changes; the envelope names the
//! record kind (a value is never read as the wrong type) and its schema version (a newer
//! value is refused, an older one goes through [`Record::upgrade`]).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{Check, Op, Store, StoreError, Table, Txn};

/// A type persisted in the store.
pub trait Record: Serialize + DeserializeOwned {
    const TABLE: Table;
    /// Stable kind name written into every value.
    const KIND: &'static str;
    /// Current schema version of this record's encoding.
    const SCHEMA: u32;
    /// Convert an older encoding (`schema < SCHEMA`) to the current one.
    fn upgrade(schema: u32, _data: serde_json::Value) -> Result<serde_json::Value, String> {
        Err(format!("no upgrade path from schema {schema}"))
    }
}

#[derive(Serialize)]
struct EnvelopeOut<'a, T> {
    kind: &'a str,
    schema: u32,
    data: &'a T,
}

#[derive(Deserialize)]
struct EnvelopeIn {
    kind: String,
    schema: u32,
    data: serde_json::Value,
}

#[allow(
    clippy::expect_used,
    reason = "records are plain structs with string keys and no non-finite floats: serializing them to JSON cannot fail"
)]
pub fn encode<R: Record>(r: &R) -> Vec<u8> {
    serde_json::to_vec(&EnvelopeOut {
        kind: R::KIND,
        schema: R::SCHEMA,
        data: r,
    })
    .expect("records serialize to JSON")
}

/// A record of the current kind and schema, read in one typed pass (the common case).
#[derive(Deserialize)]
struct EnvelopeTyped<T> {
    kind: String,
    schema: u32,
    data: T,
}

pub fn decode<R: Record>(key: &str, bytes: &[u8]) -> Result<R, StoreError> {
    // Fast path: straight into `R`, no intermediate JSON tree. Anything else (another kind,
    // an older or newer schema, a decode error) takes the full path below, which decides
    // and reports exactly as before.
    if let Some(r) = decode_view::<R, R>(bytes) {
        return Ok(r);
    }
    decode_slow(key, bytes)
}

/// A partial view `V` of a record of kind `R` at its current schema (the fields `V` names,
/// the rest skipped unallocated), or `None` for anything else (another kind or schema, a
/// decode error): the caller then decodes the full record, which reports as [`decode`] does.
pub fn decode_view<R: Record, V: DeserializeOwned>(bytes: &[u8]) -> Option<V> {
    match serde_json::from_slice::<EnvelopeTyped<V>>(bytes) {
        Ok(env) if env.kind == R::KIND && env.schema == R::SCHEMA => Some(env.data),
        _ => None,
    }
}

/// [`decode_view`], or else the full record (its upgrade path and its errors) mapped by `full`.
pub fn decode_view_or<R: Record, V: DeserializeOwned>(
    key: &str,
    bytes: &[u8],
    full: impl FnOnce(R) -> V,
) -> Result<V, StoreError> {
    match decode_view::<R, V>(bytes) {
        Some(v) => Ok(v),
        None => decode_slow::<R>(key, bytes).map(full),
    }
}

fn decode_slow<R: Record>(key: &str, bytes: &[u8]) -> Result<R, StoreError> {
    let derr = |err: Box<dyn std::error::Error + Send + Sync>| StoreError::Decode {
        table: R::TABLE.name(),
        key: key.to_string(),
        kind: R::KIND,
        err,
    };
    let env: EnvelopeIn = serde_json::from_slice(bytes).map_err(|e| derr(Box::new(e)))?;
    if env.kind != R::KIND {
        return Err(derr(format!("found a `{}` record", env.kind).into()));
    }
    if env.schema > R::SCHEMA {
        return Err(StoreError::NewerRecord {
            table: R::TABLE.name(),
            key: key.to_string(),
            kind: R::KIND,
            found: env.schema,
            supported: R::SCHEMA,
        });
    }
    let data = if env.schema < R::SCHEMA {
        R::upgrade(env.schema, env.data).map_err(|e| derr(e.into()))?
    } else {
        env.data
    };
    serde_json::from_value(data).map_err(|e| derr(Box::new(e)))
}

/// Typed access on top of any [`Store`].
pub trait StoreExt: Store {
    fn get_record<R: Record>(&self, key: &str) -> Result<Option<R>, StoreError> {
        match self.get(R::TABLE, key)? {
            Some(bytes) => decode(key, &bytes).map(Some),
            None => Ok(None),
        }
    }
    fn scan_records<R: Record>(&self, prefix: &str) -> Result<Vec<(String, R)>, StoreError> {
        self.scan(R::TABLE, prefix)?
            .into_iter()
            .map(|(k, v)| decode(&k, &v).map(|r| (k, r)))
            .collect()
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

impl Txn {
    pub fn put_record<R: Record>(self, key: impl Into<String>, r: &R) -> Txn {
        self.put(R::TABLE, key, encode(r))
    }
    pub fn push_record<R: Record>(&mut self, key: impl Into<String>, r: &R) {
        self.push(Op::Put(R::TABLE, key.into(), encode(r)));
    }
    /// Require the key to hold exactly `r`'s current encoding (compare-and-swap).
    pub fn check_record<R: Record>(self, key: impl Into<String>, r: &R) -> Txn {
        self.check(Check::Equals(R::TABLE, key.into(), encode(r)))
    }
}
