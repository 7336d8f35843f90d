//! A small writer of bbolt database files, for the simulator's etcd snapshots.
//!
//! etcd keeps its state in a bbolt database and `Maintenance.Snapshot` streams that database
//! (bbolt's `Tx.WriteTo`) followed by its sha256. The simulator builds the same bytes from
//! scratch: a whole database written in one go, every bucket a B+tree of full pages, as bbolt
//! lays it out (go.etcd.io/bbolt `internal/common/page.go`, `meta.go`, `bucket.go`, `tx.go`):
//!
//! - every page is [`PAGE_SIZE`] bytes and starts with a 16-byte header `id u64, flags u16,
//!   count u16, overflow u32` (little-endian); a page with `overflow = n` spans `n + 1` pages;
//! - pages 0 and 1 are meta pages (flags `0x04`): `magic 0xED0CDAED, version 2, pageSize,
//!   flags, root {pgid, sequence}, freelist, pgid (the high-water mark), txid, checksum` with
//!   the checksum the FNV-1a 64 of the meta before it. `Tx.WriteTo` writes the transaction's
//!   meta into both, the second with `txid - 1`, and so does this writer;
//! - a leaf page (`0x02`) holds `count` elements `flags u32, pos u32, ksize u32, vsize u32`,
//!   each key `pos` bytes after its element and its value right after the key; a branch page
//!   (`0x01`) holds elements `pos u32, ksize u32, pgid u64` whose key is the first key of the
//!   child page;
//! - the root bucket maps bucket names to leaf elements flagged `0x01` whose value is the bucket
//!   header `root pgid u64, sequence u64` (every bucket here has its own root page: bbolt reads
//!   a non-inline bucket of any size);
//! - the freelist is not written: etcd runs bbolt with `NoFreelistSync` (etcd
//!   `server/storage/backend/config_linux.go`), so its meta says `freelist = 0xFFFF…FFFF` and
//!   bbolt finds the free pages by walking the tree when it opens the file. Pages after the tree,
//!   up to the requested size, are free (zero) pages, as a busy database has.
//!
//! Validated only against the real thing: the integration tests restore these databases with
//! `etcdctl snapshot restore`, read them with `etcdctl snapshot status` (bbolt's `Tx.Check`) and
//! start an etcd on them (`tests/it/sim_etcd.rs`). Pure: bytes in, bytes out.

/// bbolt's page size on the platforms Talos runs on (the OS page size).
pub const PAGE_SIZE: usize = 4096;
const HEADER: usize = 16;
const ELEMENT: usize = 16;
const MAGIC: u32 = 0xED0C_DAED;
const VERSION: u32 = 2;
const BRANCH: u16 = 0x01;
const LEAF: u16 = 0x02;
const META: u16 = 0x04;
const BUCKET_LEAF: u32 = 0x01;
const NO_FREELIST: u64 = u64::MAX;
/// bbolt's `MaxKeySize`.
const MAX_KEY: usize = 32_768;
/// bbolt's `MaxValueSize`.
const MAX_VALUE: usize = (1 << 31) - 2;

/// One bucket: its name and its entries (sorted by key, keys unique and non-empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    pub name: Vec<u8>,
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Why a database could not be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BboltError {
    /// bbolt refuses empty keys (`ErrKeyRequired`) and keys over 32 KiB (`ErrKeyTooLarge`).
    #[error("bucket `{bucket}`: a key of {len} bytes (bbolt takes 1..=32768)")]
    KeySize { bucket: String, len: usize },
    /// bbolt refuses values over 2 GiB - 2 (`ErrValueTooLarge`).
    #[error("bucket `{bucket}`: a value of {len} bytes is too large for bbolt")]
    ValueSize { bucket: String, len: usize },
    /// Keys must be strictly increasing (a B+tree's order; bbolt's check refuses anything else).
    #[error("bucket `{bucket}`: keys are not strictly increasing at entry {index}")]
    Order { bucket: String, index: usize },
}

/// A page being laid out: its elements, each `(flags, key, value)` for a leaf or
/// `(child pgid, key)` for a branch.
enum Node {
    Leaf(Vec<(u32, Vec<u8>, Vec<u8>)>),
    Branch(Vec<(u64, Vec<u8>)>),
}

impl Node {
    fn bytes_needed(&self) -> usize {
        match self {
            Node::Leaf(els) => {
                HEADER
                    + els
                        .iter()
                        .map(|(_, k, v)| ELEMENT + k.len() + v.len())
                        .sum::<usize>()
            }
            Node::Branch(els) => HEADER + els.iter().map(|(_, k)| ELEMENT + k.len()).sum::<usize>(),
        }
    }
}

/// The file under construction: page `i` of `pages` is page id `i + 2`.
struct Writer {
    pages: Vec<u8>,
}

impl Writer {
    fn next_pgid(&self) -> u64 {
        (self.pages.len() / PAGE_SIZE) as u64 + 2
    }

    /// Lay `node` out at the next free page id (with overflow pages if it needs them).
    fn write(&mut self, node: &Node) -> u64 {
        let id = self.next_pgid();
        let need = node.bytes_needed();
        let span = need.div_ceil(PAGE_SIZE).max(1);
        let mut page = vec![0u8; span * PAGE_SIZE];
        let (flags, count) = match node {
            Node::Leaf(els) => (LEAF, els.len()),
            Node::Branch(els) => (BRANCH, els.len()),
        };
        page[0..8].copy_from_slice(&id.to_le_bytes());
        page[8..10].copy_from_slice(&flags.to_le_bytes());
        // A node never holds more than a page's worth of elements (at most 255 of 16 bytes in
        // 4 KiB) or one oversized element, so the count fits.
        page[10..12].copy_from_slice(&(count as u16).to_le_bytes());
        page[12..16].copy_from_slice(&((span - 1) as u32).to_le_bytes());
        let mut data = HEADER + count * ELEMENT;
        match node {
            Node::Leaf(els) => {
                for (i, (f, k, v)) in els.iter().enumerate() {
                    let at = HEADER + i * ELEMENT;
                    let pos = (data - at) as u32;
                    page[at..at + 4].copy_from_slice(&f.to_le_bytes());
                    page[at + 4..at + 8].copy_from_slice(&pos.to_le_bytes());
                    page[at + 8..at + 12].copy_from_slice(&(k.len() as u32).to_le_bytes());
                    page[at + 12..at + 16].copy_from_slice(&(v.len() as u32).to_le_bytes());
                    page[data..data + k.len()].copy_from_slice(k);
                    data += k.len();
                    page[data..data + v.len()].copy_from_slice(v);
                    data += v.len();
                }
            }
            Node::Branch(els) => {
                for (i, (child, k)) in els.iter().enumerate() {
                    let at = HEADER + i * ELEMENT;
                    let pos = (data - at) as u32;
                    page[at..at + 4].copy_from_slice(&pos.to_le_bytes());
                    page[at + 4..at + 8].copy_from_slice(&(k.len() as u32).to_le_bytes());
                    page[at + 8..at + 16].copy_from_slice(&child.to_le_bytes());
                    page[data..data + k.len()].copy_from_slice(k);
                    data += k.len();
                }
            }
        }
        self.pages.extend_from_slice(&page);
        id
    }

    /// Write a B+tree of `entries` (sorted) bottom-up and return its root page id: leaves packed
    /// up to a page each (an entry larger than a page gets a leaf of its own with overflow
    /// pages), then branch levels keyed by each child's first key, until one page remains.
    fn tree(&mut self, entries: Vec<(u32, Vec<u8>, Vec<u8>)>) -> u64 {
        let mut level: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut leaf: Vec<(u32, Vec<u8>, Vec<u8>)> = Vec::new();
        let mut used = HEADER;
        for (f, k, v) in entries {
            let size = ELEMENT + k.len() + v.len();
            if !leaf.is_empty() && used + size > PAGE_SIZE {
                let first = leaf[0].1.clone();
                let id = self.write(&Node::Leaf(std::mem::take(&mut leaf)));
                level.push((id, first));
                used = HEADER;
            }
            used += size;
            leaf.push((f, k, v));
        }
        if !leaf.is_empty() || level.is_empty() {
            // The last leaf, or the one empty leaf of an empty bucket.
            let first = leaf.first().map(|e| e.1.clone()).unwrap_or_default();
            let id = self.write(&Node::Leaf(leaf));
            level.push((id, first));
        }
        while level.len() > 1 {
            let mut next: Vec<(u64, Vec<u8>)> = Vec::new();
            let mut branch: Vec<(u64, Vec<u8>)> = Vec::new();
            let mut used = HEADER;
            for (child, k) in level {
                let size = ELEMENT + k.len();
                if !branch.is_empty() && used + size > PAGE_SIZE {
                    let first = branch[0].1.clone();
                    let id = self.write(&Node::Branch(std::mem::take(&mut branch)));
                    next.push((id, first));
                    used = HEADER;
                }
                used += size;
                branch.push((child, k));
            }
            let first = branch[0].1.clone();
            let id = self.write(&Node::Branch(branch));
            next.push((id, first));
            level = next;
        }
        level[0].0
    }
}

fn check(bucket: &Bucket) -> Result<(), BboltError> {
    let name = || String::from_utf8_lossy(&bucket.name).into_owned();
    for (i, (k, v)) in bucket.entries.iter().enumerate() {
        if k.is_empty() || k.len() > MAX_KEY {
            return Err(BboltError::KeySize {
                bucket: name(),
                len: k.len(),
            });
        }
        if v.len() > MAX_VALUE {
            return Err(BboltError::ValueSize {
                bucket: name(),
                len: v.len(),
            });
        }
        if i > 0 && bucket.entries[i - 1].0 >= *k {
            return Err(BboltError::Order {
                bucket: name(),
                index: i,
            });
        }
    }
    Ok(())
}

/// A meta page for `txid` (bbolt `Meta.Write`: the page id is `txid % 2`).
fn meta_page(root: u64, high_water: u64, txid: u64, page_id: u64) -> Vec<u8> {
    let mut p = vec![0u8; PAGE_SIZE];
    p[0..8].copy_from_slice(&page_id.to_le_bytes());
    p[8..10].copy_from_slice(&META.to_le_bytes());
    let m = &mut p[HEADER..HEADER + 64];
    m[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    m[4..8].copy_from_slice(&VERSION.to_le_bytes());
    m[8..12].copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
    // flags (0), then the root bucket: root page, sequence 0.
    m[16..24].copy_from_slice(&root.to_le_bytes());
    m[32..40].copy_from_slice(&NO_FREELIST.to_le_bytes());
    m[40..48].copy_from_slice(&high_water.to_le_bytes());
    m[48..56].copy_from_slice(&txid.to_le_bytes());
    let sum = fnv1a64(&m[..56]);
    m[56..64].copy_from_slice(&sum.to_le_bytes());
    p
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The database holding `buckets` (in any order; bbolt sorts them by name), at transaction
/// `txid` (at least 1), at least `min_len` bytes long (whole pages; free pages fill the rest),
/// as `Tx.WriteTo` would stream it.
pub fn write(buckets: &[Bucket], txid: u64, min_len: usize) -> Result<Vec<u8>, BboltError> {
    let mut sorted: Vec<&Bucket> = buckets.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let root_bucket = Bucket {
        name: Vec::new(),
        entries: sorted
            .iter()
            .map(|b| (b.name.clone(), Vec::new()))
            .collect(),
    };
    for b in &sorted {
        check(b)?;
    }
    check(&root_bucket).map_err(|e| match e {
        BboltError::Order { index, .. } => BboltError::Order {
            bucket: "<root: bucket names>".into(),
            index,
        },
        other => other,
    })?;
    let mut w = Writer { pages: Vec::new() };
    let mut names = Vec::with_capacity(sorted.len());
    for b in sorted {
        let root = w.tree(
            b.entries
                .iter()
                .map(|(k, v)| (0, k.clone(), v.clone()))
                .collect(),
        );
        let mut header = Vec::with_capacity(16);
        header.extend_from_slice(&root.to_le_bytes());
        header.extend_from_slice(&0u64.to_le_bytes());
        names.push((BUCKET_LEAF, b.name.clone(), header));
    }
    let root = w.tree(names);
    let used = w.next_pgid();
    let high_water = used.max(min_len.div_ceil(PAGE_SIZE) as u64);
    let txid = txid.max(1);
    let mut out = Vec::with_capacity(high_water as usize * PAGE_SIZE);
    out.extend_from_slice(&meta_page(root, high_water, txid, 0));
    out.extend_from_slice(&meta_page(root, high_water, txid - 1, 1));
    out.extend_from_slice(&w.pages);
    out.resize(high_water as usize * PAGE_SIZE, 0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le64(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn the_file_is_whole_pages_up_to_the_high_water_mark() {
        let db = write(
            &[Bucket {
                name: b"key".to_vec(),
                entries: vec![(b"a".to_vec(), b"1".to_vec())],
            }],
            7,
            64 * 1024,
        )
        .unwrap();
        assert_eq!(db.len(), 64 * 1024);
        // Both metas name the same tree and the high-water mark; the second one txid - 1.
        let (m0, m1) = (&db[HEADER..], &db[PAGE_SIZE + HEADER..]);
        assert_eq!(le64(m0, 40), 16, "16 pages");
        assert_eq!(le64(m0, 16), le64(m1, 16));
        assert_eq!((le64(m0, 48), le64(m1, 48)), (7, 6));
        assert_eq!(le64(m0, 32), u64::MAX, "no freelist page (NoFreelistSync)");
        assert_eq!(le64(m0, 56), fnv1a64(&m0[..56]));
        assert_eq!(le64(m1, 56), fnv1a64(&m1[..56]));
        // A database larger than asked is not cut.
        let big: Vec<(Vec<u8>, Vec<u8>)> = (0..100u32)
            .map(|i| (i.to_be_bytes().to_vec(), vec![b'v'; 1000]))
            .collect();
        let db = write(
            &[Bucket {
                name: b"key".to_vec(),
                entries: big,
            }],
            1,
            0,
        )
        .unwrap();
        assert!(db.len() > 100 * 1000 && db.len().is_multiple_of(PAGE_SIZE));
    }

    #[test]
    fn bad_entries_are_refused_with_the_bucket_named() {
        let one = |entries: Vec<(Vec<u8>, Vec<u8>)>| {
            write(
                &[Bucket {
                    name: b"meta".to_vec(),
                    entries,
                }],
                1,
                0,
            )
        };
        assert_eq!(
            one(vec![(vec![], vec![])]),
            Err(BboltError::KeySize {
                bucket: "meta".into(),
                len: 0
            })
        );
        assert_eq!(
            one(vec![(b"b".to_vec(), vec![]), (b"a".to_vec(), vec![])]),
            Err(BboltError::Order {
                bucket: "meta".into(),
                index: 1
            })
        );
        assert!(matches!(
            one(vec![(vec![b'k'; MAX_KEY + 1], vec![])]),
            Err(BboltError::KeySize { .. })
        ));
        let twice = write(
            &[
                Bucket {
                    name: b"x".to_vec(),
                    entries: vec![],
                },
                Bucket {
                    name: b"x".to_vec(),
                    entries: vec![],
                },
            ],
            1,
            0,
        );
        assert!(matches!(twice, Err(BboltError::Order { .. })), "{twice:?}");
    }
}
