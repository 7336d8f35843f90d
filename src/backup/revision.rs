//! The etcd revision of a snapshot, read from its bbolt database as the snapshot streams by.
//!
//! Talos' `EtcdStatus` reports the raft index, not the revision. etcd's own tool reads the
//! revision from the snapshot (etcd-io/etcd `etcdutl/snapshot/v3_snapshot.go`, `Status`): it opens
//! the bbolt database, walks the `key` bucket, whose keys are revisions (8-byte big-endian main
//! revision, `_`, 8-byte big-endian sub revision, and `t` for a tombstone), and reports the main
//! revision of the last key (`bytesToRev(k).Main`). Keys sort bytewise, so that is the highest.
//!
//! bbolt's layout (go.etcd.io/bbolt `page.go`, `db.go`, `bucket.go`), little-endian:
//!
//! - every page starts with a 16-byte header: `id u64, flags u16, count u16, overflow u32`; a page
//!   with `overflow = n` spans `n + 1` pages; page `id` lives at offset `id * pageSize`;
//! - pages 0 and 1 are meta pages: after the header, `magic u32 (0xED0CDAED), version u32 (2),
//!   pageSize u32, flags u32, root {pgid u64, sequence u64}, freelist u64, pgid u64, txid u64,
//!   checksum u64` (FNV-1a 64 over the meta before the checksum); the valid meta with the higher
//!   txid is the current one;
//! - a branch page (flags `0x01`) holds `count` elements `pos u32, ksize u32, pgid u64`, a leaf
//!   page (`0x02`) holds `flags u32, pos u32, ksize u32, vsize u32`; an element's key starts `pos`
//!   bytes after the element, its value right after the key;
//! - the root bucket's tree (meta `root`) maps bucket names to leaf elements flagged `0x01` whose
//!   value starts with a bucket header `root u64, sequence u64`; `root = 0` is an inline bucket,
//!   its leaf page following the header in the value.
//!
//! The snapshot streams into the encryptor and never touches a disk, so the reader takes it chunk
//! by chunk: it keeps a small summary of every page (a branch's children; a leaf's bucket entries
//! and the revision of its last key) and walks the tree from the current meta when the stream
//! ends. Memory is bounded by the page count (a few bytes a page) and one page span
//! ([`MAX_PAGE_SPAN`]). Pure: no I/O; a malformed database is an error, never a panic.

use std::collections::HashMap;

/// bbolt's magic number.
const MAGIC: u32 = 0xED0C_DAED;
/// bbolt's data-file format version.
const VERSION: u32 = 2;
const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
const BRANCH: u16 = 0x01;
const LEAF: u16 = 0x02;
const BUCKET_LEAF: u32 = 0x01;
/// Bytes of the meta the checksum covers (everything before `checksum`).
const META_SUMMED: usize = 56;
const META_LEN: usize = 64;
/// The largest page span (a page and its overflow pages) the reader buffers: etcd's values are
/// at most a request's size (1.5 MiB by default), so real pages stay far below this.
pub const MAX_PAGE_SPAN: u64 = 64 * 1024 * 1024;
/// Tree depth bound: a bbolt tree of billions of keys is a few levels deep.
const MAX_DEPTH: usize = 64;
/// The bucket holding etcd's keys by revision (etcd `server/storage/schema/bucket.go`).
const KEY_BUCKET: &[u8] = b"key";
/// The bucket holding etcd's own metadata (`consistent_index`, `term`, `storageVersion`).
const META_BUCKET: &[u8] = b"meta";
/// The key of the `meta` bucket that holds the storage version (etcd
/// `server/storage/schema/version.go`, `ReadStorageVersionFromSnapshot`; written since 3.6).
const STORAGE_VERSION_KEY: &[u8] = b"storageVersion";
/// The longest storage version value kept (`3.7.0`; anything longer is not a version).
const MAX_STORAGE_VERSION: usize = 32;

/// Why a snapshot's revision could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RevisionError {
    /// The snapshot ended before its first meta page.
    #[error("the snapshot is shorter than a bbolt meta page ({0} bytes)")]
    TooShort(u64),
    /// No meta page is valid.
    #[error("no valid bbolt meta page: {0}")]
    NoMeta(String),
    /// A page the tree reaches is missing or malformed.
    #[error("bbolt page {pgid}: {what}")]
    Page {
        /// The page id.
        pgid: u64,
        /// What is wrong with it.
        what: String,
    },
    /// The database has no `key` bucket.
    #[error("the snapshot has no `key` bucket: not an etcd database")]
    NoKeyBucket,
}

#[derive(Debug, Clone, Copy)]
struct Meta {
    page_size: u64,
    root: u64,
    high_water: u64,
    txid: u64,
}

/// What the walk needs of a leaf page.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LeafSummary {
    /// The main revision of the last key (`None`: the leaf is empty).
    last: Option<Result<i64, String>>,
    /// Bucket entries: name and root page, or the inline bucket's own summary.
    buckets: Vec<(Vec<u8>, BucketRoot)>,
    /// The value of a `storageVersion` key on this leaf (only the `meta` bucket's is used).
    storage_version: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum BucketRoot {
    Page(u64),
    Inline(Box<LeafSummary>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Summary {
    Branch(Vec<u64>),
    Leaf(LeafSummary),
    /// Not a page the walk may use: why.
    Bad(String),
}

/// Reads the revision of an etcd snapshot fed to it chunk by chunk ([`RevisionReader::update`]),
/// then [`RevisionReader::finish`].
#[derive(Debug, Default)]
pub struct RevisionReader {
    /// Bytes from file offset `buf_start` on that a page still needs.
    buf: Vec<u8>,
    buf_start: u64,
    received: u64,
    page_size: Option<u64>,
    metas: Vec<Meta>,
    meta_errors: Vec<String>,
    /// Offset of the next page whose header is not read yet.
    next_header: u64,
    /// Pages whose header was read and whose span is not complete: (start, end).
    pending: Vec<(u64, u64)>,
    pages: HashMap<u64, Summary>,
    /// A failure that makes the rest moot (no page size).
    fatal: Option<RevisionError>,
}

impl RevisionReader {
    /// Feed the next bytes of the snapshot.
    pub fn update(&mut self, chunk: &[u8]) {
        if self.fatal.is_some() || chunk.is_empty() {
            return;
        }
        self.buf.extend_from_slice(chunk);
        self.received += chunk.len() as u64;
        if self.page_size.is_none() {
            if self.received < (PAGE_HEADER + META_LEN) as u64 {
                return;
            }
            match parse_meta(&self.buf[PAGE_HEADER..PAGE_HEADER + META_LEN]) {
                Ok(m) => self.page_size = Some(m.page_size),
                Err(e) => {
                    self.fatal = Some(RevisionError::NoMeta(format!("meta page 0: {e}")));
                    self.buf = Vec::new();
                    return;
                }
            }
        }
        let Some(ps) = self.page_size else { return };
        while self.next_header + PAGE_HEADER as u64 <= self.received {
            let start = self.next_header;
            let h = self.slice(start, PAGE_HEADER as u64);
            let id = le_u64(h, 0);
            let overflow = u64::from(le_u32(h, 12));
            let span = overflow.saturating_add(1).saturating_mul(ps);
            let pgid = start / ps;
            if id != pgid && pgid < 2 {
                self.meta_errors
                    .push(format!("meta page {pgid}: its header names page {id}"));
            } else if id != pgid {
                // Never written, or garbage: the walk must not reach it.
                self.pages
                    .insert(pgid, Summary::Bad(format!("its header names page {id}")));
            } else if span > MAX_PAGE_SPAN {
                self.pages.insert(
                    pgid,
                    Summary::Bad(format!("it spans {span} bytes, over {MAX_PAGE_SPAN}")),
                );
            } else {
                self.pending.push((start, start + span));
            }
            self.next_header += ps;
        }
        let received = self.received;
        let done: Vec<(u64, u64)> = self
            .pending
            .iter()
            .copied()
            .filter(|&(_, end)| end <= received)
            .collect();
        self.pending.retain(|&(_, end)| end > received);
        for (start, end) in done {
            let pgid = start / ps;
            let page = self.slice(start, end - start);
            let summary = if pgid < 2 {
                match parse_meta(page.get(PAGE_HEADER..).unwrap_or(&[])) {
                    Ok(m) => {
                        self.metas.push(m);
                        continue;
                    }
                    Err(e) => {
                        self.meta_errors.push(format!("meta page {pgid}: {e}"));
                        continue;
                    }
                }
            } else {
                summarize(page)
            };
            self.pages.insert(pgid, summary);
        }
        // Keep only the bytes a page still needs.
        let keep_from = self
            .pending
            .iter()
            .map(|&(s, _)| s)
            .min()
            .unwrap_or(self.next_header)
            .min(self.next_header);
        if keep_from > self.buf_start {
            let drop = usize::try_from(keep_from - self.buf_start)
                .unwrap_or(self.buf.len())
                .min(self.buf.len());
            self.buf.drain(..drop);
            self.buf_start += drop as u64;
        }
    }

    /// `len` bytes at file offset `at`, which `update` guarantees are buffered.
    fn slice(&self, at: u64, len: u64) -> &[u8] {
        let from = usize::try_from(at - self.buf_start).unwrap_or(usize::MAX);
        let to = from.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
        self.buf.get(from..to).unwrap_or(&[])
    }

    /// The snapshot's storage version: the `storageVersion` key of its `meta` bucket, as
    /// `etcdutl snapshot status` reports it in `version` (etcd-io/etcd
    /// `etcdutl/snapshot/v3_snapshot.go`, `Status`; `server/storage/schema/version.go`). etcd
    /// writes it since 3.6 (`3.6.0`); `None` for an older etcd's snapshot (the key is absent)
    /// or a database whose `meta` bucket cannot be walked. Call it once the whole snapshot was
    /// fed, before [`RevisionReader::finish`].
    pub fn storage_version(&self) -> Option<String> {
        let meta = self.metas.iter().max_by_key(|m| m.txid).copied()?;
        let walk = Walk {
            pages: &self.pages,
            high_water: meta.high_water,
        };
        let mut budget = self.pages.len() + 1;
        let bucket = walk
            .find_bucket(meta.root, META_BUCKET, 0, &mut budget)
            .ok()??;
        let value = match bucket {
            BucketRoot::Inline(leaf) => leaf.storage_version,
            BucketRoot::Page(pgid) => walk.find_value(pgid, 0, &mut budget),
        }?;
        String::from_utf8(value).ok()
    }

    /// The snapshot's revision: the main revision of the last key of the `key` bucket (0 when it
    /// is empty, as `etcdutl snapshot status` reports).
    pub fn finish(self) -> Result<i64, RevisionError> {
        if let Some(e) = self.fatal {
            return Err(e);
        }
        if self.page_size.is_none() {
            return Err(RevisionError::TooShort(self.received));
        }
        let Some(meta) = self.metas.iter().max_by_key(|m| m.txid).copied() else {
            return Err(RevisionError::NoMeta(if self.meta_errors.is_empty() {
                "the snapshot ends inside its meta pages".into()
            } else {
                self.meta_errors.join("; ")
            }));
        };
        let walk = Walk {
            pages: &self.pages,
            high_water: meta.high_water,
        };
        let mut budget = self.pages.len() + 1;
        let key = walk
            .find_bucket(meta.root, KEY_BUCKET, 0, &mut budget)?
            .ok_or(RevisionError::NoKeyBucket)?;
        let leaf = match key {
            BucketRoot::Inline(leaf) => *leaf,
            BucketRoot::Page(pgid) => walk.rightmost_leaf(pgid)?.1,
        };
        match leaf.last {
            None => Ok(0),
            Some(Ok(rev)) => Ok(rev),
            Some(Err(what)) => Err(RevisionError::Page {
                pgid: 0,
                what: format!("last key of the `key` bucket: {what}"),
            }),
        }
    }
}

struct Walk<'a> {
    pages: &'a HashMap<u64, Summary>,
    high_water: u64,
}

impl Walk<'_> {
    fn page(&self, pgid: u64) -> Result<&Summary, RevisionError> {
        let err = |what: &str| RevisionError::Page {
            pgid,
            what: what.to_string(),
        };
        if pgid < 2 {
            return Err(err("a meta page where a tree page belongs"));
        }
        if pgid >= self.high_water {
            return Err(err(&format!(
                "beyond the database's last page ({})",
                self.high_water
            )));
        }
        match self.pages.get(&pgid) {
            None => Err(err("missing from the snapshot")),
            Some(Summary::Bad(why)) => Err(err(why)),
            Some(s) => Ok(s),
        }
    }

    fn find_bucket(
        &self,
        pgid: u64,
        name: &[u8],
        depth: usize,
        budget: &mut usize,
    ) -> Result<Option<BucketRoot>, RevisionError> {
        if depth > MAX_DEPTH || *budget == 0 {
            return Err(RevisionError::Page {
                pgid,
                what: "the root bucket's tree is too deep or has a cycle".into(),
            });
        }
        *budget -= 1;
        match self.page(pgid)? {
            Summary::Branch(children) => {
                for &child in children {
                    if let Some(b) = self.find_bucket(child, name, depth + 1, budget)? {
                        return Ok(Some(b));
                    }
                }
                Ok(None)
            }
            Summary::Leaf(leaf) => Ok(leaf
                .buckets
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, root)| root.clone())),
            Summary::Bad(_) => Ok(None),
        }
    }

    /// The `storageVersion` value anywhere in the (small) tree under `pgid`.
    fn find_value(&self, pgid: u64, depth: usize, budget: &mut usize) -> Option<Vec<u8>> {
        if depth > MAX_DEPTH || *budget == 0 {
            return None;
        }
        *budget -= 1;
        match self.page(pgid).ok()? {
            Summary::Branch(children) => children
                .iter()
                .find_map(|&c| self.find_value(c, depth + 1, budget)),
            Summary::Leaf(leaf) => leaf.storage_version.clone(),
            Summary::Bad(_) => None,
        }
    }

    /// Follow the last child down to a leaf.
    fn rightmost_leaf(&self, mut pgid: u64) -> Result<(u64, LeafSummary), RevisionError> {
        for _ in 0..=MAX_DEPTH {
            match self.page(pgid)? {
                Summary::Branch(children) => {
                    pgid = *children.last().ok_or(RevisionError::Page {
                        pgid,
                        what: "an empty branch page".into(),
                    })?;
                }
                Summary::Leaf(leaf) => return Ok((pgid, leaf.clone())),
                Summary::Bad(why) => {
                    return Err(RevisionError::Page {
                        pgid,
                        what: why.clone(),
                    });
                }
            }
        }
        Err(RevisionError::Page {
            pgid,
            what: "the `key` bucket's tree is too deep or has a cycle".into(),
        })
    }
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A meta (the 64 bytes after a meta page's header), validated as bbolt's `meta.validate` does.
fn parse_meta(m: &[u8]) -> Result<Meta, String> {
    if m.len() < META_LEN {
        return Err("truncated".into());
    }
    if le_u32(m, 0) != MAGIC {
        return Err("bad magic (not a bbolt database)".into());
    }
    if le_u32(m, 4) != VERSION {
        return Err(format!("unknown version {}", le_u32(m, 4)));
    }
    if le_u64(m, 56) != fnv1a64(&m[..META_SUMMED]) {
        return Err("checksum mismatch".into());
    }
    let page_size = u64::from(le_u32(m, 8));
    if !(512..=1 << 20).contains(&page_size) || !page_size.is_power_of_two() {
        return Err(format!("page size {page_size} out of range"));
    }
    Ok(Meta {
        page_size,
        root: le_u64(m, 16),
        high_water: le_u64(m, 40),
        txid: le_u64(m, 48),
    })
}

/// Summarize one page (its header and its overflow included).
fn summarize(page: &[u8]) -> Summary {
    let byte = |i: usize| page.get(i).copied().unwrap_or(0);
    let flags = u16::from_le_bytes([byte(8), byte(9)]);
    if flags & BRANCH != 0 {
        branch(page).map_or_else(Summary::Bad, Summary::Branch)
    } else if flags & LEAF != 0 {
        leaf(page, 0).map_or_else(Summary::Bad, Summary::Leaf)
    } else {
        Summary::Bad(format!("neither a branch nor a leaf (flags {flags:#x})"))
    }
}

fn count(page: &[u8]) -> usize {
    usize::from(u16::from_le_bytes([
        page.get(10).copied().unwrap_or(0),
        page.get(11).copied().unwrap_or(0),
    ]))
}

/// The element `i`'s offset, checked to fit.
fn element(page: &[u8], i: usize) -> Result<usize, String> {
    let at = PAGE_HEADER + i * ELEMENT;
    if at + ELEMENT > page.len() {
        return Err(format!("element {i} past the page's end"));
    }
    Ok(at)
}

/// `len` bytes `pos` after the element at `at`, checked to fit.
fn bytes_at(page: &[u8], at: usize, pos: u32, len: u32) -> Result<&[u8], String> {
    let from = at
        .checked_add(pos as usize)
        .ok_or_else(|| "element offset overflows".to_string())?;
    let to = from
        .checked_add(len as usize)
        .ok_or_else(|| "element length overflows".to_string())?;
    page.get(from..to).ok_or_else(|| {
        format!(
            "element bytes {from}..{to} past the page's end ({})",
            page.len()
        )
    })
}

fn branch(page: &[u8]) -> Result<Vec<u64>, String> {
    (0..count(page))
        .map(|i| element(page, i).map(|at| le_u64(page, at + 8)))
        .collect()
}

/// A leaf page's summary; `depth` > 0 for an inline bucket's page (which cannot nest further in
/// etcd's database, and is bounded here anyway).
fn leaf(page: &[u8], depth: usize) -> Result<LeafSummary, String> {
    let n = count(page);
    let mut buckets = Vec::new();
    let mut last = None;
    let mut storage_version = None;
    for i in 0..n {
        let at = element(page, i)?;
        let (flags, pos, ksize, vsize) = (
            le_u32(page, at),
            le_u32(page, at + 4),
            le_u32(page, at + 8),
            le_u32(page, at + 12),
        );
        let key = bytes_at(page, at, pos, ksize)?;
        if i + 1 == n {
            last = Some(revision_of(key));
        }
        if flags & BUCKET_LEAF == 0
            && key == STORAGE_VERSION_KEY
            && (vsize as usize) <= MAX_STORAGE_VERSION
        {
            storage_version = Some(bytes_at(page, at, pos.saturating_add(ksize), vsize)?.to_vec());
        }
        if flags & BUCKET_LEAF != 0 {
            let value = bytes_at(page, at, pos.saturating_add(ksize), vsize)?;
            if value.len() < 16 {
                return Err(format!("bucket `{}`: short header", key.escape_ascii()));
            }
            let root = le_u64(value, 0);
            let bucket = if root != 0 {
                BucketRoot::Page(root)
            } else if depth >= 2 {
                return Err("inline buckets nested too deep".into());
            } else {
                let inline = &value[16..];
                if inline.len() < PAGE_HEADER {
                    return Err(format!(
                        "inline bucket `{}`: short page",
                        key.escape_ascii()
                    ));
                }
                BucketRoot::Inline(Box::new(leaf(inline, depth + 1)?))
            };
            buckets.push((key.to_vec(), bucket));
        }
    }
    Ok(LeafSummary {
        last,
        buckets,
        storage_version,
    })
}

/// etcd's `bytesToRev(k).Main`: the first 8 bytes, big-endian (a revision key is 17 bytes, 18
/// for a tombstone, with `_` at byte 8).
fn revision_of(key: &[u8]) -> Result<i64, String> {
    match key.get(..8) {
        Some(b) if key.get(8) == Some(&b'_') => {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            Ok(i64::from_be_bytes(a))
        }
        _ => Err(format!("`{}` is not a revision key", key.escape_ascii())),
    }
}

/// Read the storage version of a snapshot from `r`, streamed (`medea backup verify --restore`
/// reads the decrypted file): see [`RevisionReader::storage_version`].
pub fn storage_version_of(mut r: impl std::io::Read) -> std::io::Result<Option<String>> {
    let mut reader = RevisionReader::default();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        reader.update(&buf[..n]);
    }
    Ok(reader.storage_version())
}

/// Read the revision of a whole snapshot in memory (tests, `backup verify`).
pub fn revision(snapshot: &[u8]) -> Result<i64, RevisionError> {
    let mut r = RevisionReader::default();
    for chunk in snapshot.chunks(64 * 1024) {
        r.update(chunk);
    }
    r.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PS: usize = 4096;

    fn page_header(id: u64, flags: u16, count: u16, overflow: u32) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend_from_slice(&id.to_le_bytes());
        p.extend_from_slice(&flags.to_le_bytes());
        p.extend_from_slice(&count.to_le_bytes());
        p.extend_from_slice(&overflow.to_le_bytes());
        p
    }

    fn meta_page(id: u64, root: u64, high_water: u64, txid: u64) -> Vec<u8> {
        let mut p = page_header(id, 0x04, 0, 0);
        let mut m = Vec::new();
        m.extend_from_slice(&MAGIC.to_le_bytes());
        m.extend_from_slice(&VERSION.to_le_bytes());
        m.extend_from_slice(&(PS as u32).to_le_bytes());
        m.extend_from_slice(&0u32.to_le_bytes());
        m.extend_from_slice(&root.to_le_bytes());
        m.extend_from_slice(&0u64.to_le_bytes());
        m.extend_from_slice(&0u64.to_le_bytes());
        m.extend_from_slice(&high_water.to_le_bytes());
        m.extend_from_slice(&txid.to_le_bytes());
        let sum = fnv1a64(&m);
        m.extend_from_slice(&sum.to_le_bytes());
        p.extend_from_slice(&m);
        p.resize(PS, 0);
        p
    }

    /// A leaf page of (flags, key, value) elements.
    fn leaf_page(id: u64, elems: &[(u32, Vec<u8>, Vec<u8>)], pad: bool) -> Vec<u8> {
        let mut p = page_header(id, LEAF, elems.len() as u16, 0);
        let data_start = PAGE_HEADER + elems.len() * ELEMENT;
        let mut data = Vec::new();
        for (i, (flags, k, v)) in elems.iter().enumerate() {
            let at = PAGE_HEADER + i * ELEMENT;
            let pos = (data_start + data.len() - at) as u32;
            p.extend_from_slice(&flags.to_le_bytes());
            p.extend_from_slice(&pos.to_le_bytes());
            p.extend_from_slice(&(k.len() as u32).to_le_bytes());
            p.extend_from_slice(&(v.len() as u32).to_le_bytes());
            data.extend_from_slice(k);
            data.extend_from_slice(v);
        }
        p.extend_from_slice(&data);
        if pad {
            p.resize(PS, 0);
        }
        p
    }

    fn rev_key(main: i64, sub: i64) -> Vec<u8> {
        let mut k = main.to_be_bytes().to_vec();
        k.push(b'_');
        k.extend_from_slice(&sub.to_be_bytes());
        k
    }

    fn bucket_value(root: u64) -> Vec<u8> {
        let mut v = root.to_le_bytes().to_vec();
        v.extend_from_slice(&0u64.to_le_bytes());
        v
    }

    /// meta 0/1, root bucket leaf at 2 naming `key` at page 3 (a leaf with revisions 5 and 9).
    fn db() -> Vec<u8> {
        let mut f = meta_page(0, 2, 4, 7);
        f.extend(meta_page(1, 2, 4, 6));
        f.extend(leaf_page(
            2,
            &[
                (BUCKET_LEAF, b"key".to_vec(), bucket_value(3)),
                (BUCKET_LEAF, b"meta".to_vec(), bucket_value(3)),
            ],
            true,
        ));
        f.extend(leaf_page(
            3,
            &[
                (0, rev_key(5, 0), b"a".to_vec()),
                (0, rev_key(9, 1), b"b".to_vec()),
            ],
            true,
        ));
        f.extend([0u8; 32]); // etcd's sha256 trailer: not a page
        f
    }

    #[test]
    fn reads_the_last_revision_of_the_key_bucket_in_any_chunking() {
        let f = db();
        assert_eq!(revision(&f), Ok(9));
        for size in [1, 7, 100, 4095, 4097] {
            let mut r = RevisionReader::default();
            for c in f.chunks(size) {
                r.update(c);
            }
            assert_eq!(r.finish(), Ok(9), "chunks of {size}");
        }
    }

    #[test]
    fn an_inline_key_bucket_and_the_newer_meta_are_used() {
        let inline = leaf_page(0, &[(0, rev_key(42, 0), b"v".to_vec())], false);
        let mut v = bucket_value(0);
        v.extend(inline);
        // meta 1 is newer and names page 3; meta 0 names page 2 (a bucket without `key`).
        let mut f = meta_page(0, 2, 4, 1);
        f.extend(meta_page(1, 3, 4, 2));
        f.extend(leaf_page(
            2,
            &[(BUCKET_LEAF, b"lease".to_vec(), bucket_value(5))],
            true,
        ));
        f.extend(leaf_page(3, &[(BUCKET_LEAF, b"key".to_vec(), v)], true));
        assert_eq!(revision(&f), Ok(42));
    }

    #[test]
    fn malformed_databases_are_errors() {
        assert_eq!(revision(b"short"), Err(RevisionError::TooShort(5)));
        assert!(matches!(
            revision(&[0u8; 9000]),
            Err(RevisionError::NoMeta(_))
        ));
        // No `key` bucket.
        let mut f = meta_page(0, 2, 3, 1);
        f.extend(meta_page(1, 2, 3, 0));
        f.extend(leaf_page(
            2,
            &[(BUCKET_LEAF, b"meta".to_vec(), bucket_value(5))],
            true,
        ));
        assert_eq!(revision(&f), Err(RevisionError::NoKeyBucket));
        // Truncated before the `key` bucket's page.
        let f = db();
        assert!(matches!(
            revision(&f[..3 * PS]),
            Err(RevisionError::Page { pgid: 3, .. })
        ));
        // A corrupted checksum in both metas.
        let mut f = db();
        f[PAGE_HEADER + 60] ^= 1;
        f[PS + PAGE_HEADER + 60] ^= 1;
        assert!(matches!(revision(&f), Err(RevisionError::NoMeta(_))));
        // An element pointing past its page.
        let mut f = db();
        f[3 * PS + PAGE_HEADER + 4] = 0xff;
        f[3 * PS + PAGE_HEADER + 5] = 0xff;
        assert!(revision(&f).is_err());
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..20_000)) {
            let _ = revision(&bytes);
        }

        #[test]
        fn a_mutated_database_never_panics(at in 0usize..4 * PS, byte in any::<u8>(), cut in 0usize..4 * PS + 32) {
            let mut f = db();
            f[at] = byte;
            f.truncate(cut.max(at + 1));
            let _ = revision(&f);
        }
    }
}
