//! Incremental loading: re-parse only the files whose bytes changed. Pure (the reading stays
//! in [`super::source`]).
//!
//! A revision is loaded in two stages:
//!
//! 1. **Per file** ([`parse_file`]): bytes → text (size and UTF-8 checks), documents, and each
//!    document read strictly (or identified leniently when that fails). The result depends on
//!    the file's path and bytes only, so it is kept in a [`Loader`] keyed by path and reused
//!    while the file's bytes are unchanged; the files that need it are parsed on up to
//!    [`PARSE_THREADS`] threads and the results put back in path order. Between loads a file
//!    keeps, per document, a [`validate::Summary`] (names, a pool's cluster and machines), not
//!    its full reading, which is read again from the file's text when stage 2 needs it.
//! 2. **Whole revision** (`assemble`): the refused entries' diagnostics, then every file's
//!    documents in path order handed, borrowed, to [`super::validate::validate`] with the
//!    loader's [`validate::Memo`]: each Cluster document is validated alone once (keyed by
//!    its [`validate::DocId`], the file's parse number and the document's index), each
//!    cluster's pools together again only when that cluster's inputs moved — its defining
//!    document, its pool documents, the pool names declared for it, and which pools list its
//!    machines first — and the cheap whole-revision rules (duplicate and missing clusters,
//!    the machine → first pool index, promotion) run over the summaries every time.
//!
//! A cold load ([`super::parse_snapshot`]) is the same code with an empty cache and memo, so
//! the two can differ only if a cached result were reused for different inputs; the property
//! test `incremental_load_equals_cold_load` (tests) checks that over random edit sequences,
//! and the tests below it the edge cases of the memo (a machine moving between files and
//! clusters, duplicate names appearing and disappearing).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use super::diagnostic::{self, Diagnostic};
use super::model::Origin;
use super::parse::{self, Broken, DocText, RawDoc};
use super::source::{self, Snapshot, SourceError, Stamp};
use super::{Loaded, validate};

/// What one document of a file became in stage 1.
#[derive(Debug)]
enum DocOutcome {
    /// Read strictly: what every load's rules read of it, and the full reading while a load
    /// needs it. The full reading is dropped after each load and read again from the file's
    /// text by the next load that needs it (one cluster's documents after a change): the
    /// summaries and the validated model are what a loader holds between loads.
    Read {
        summary: validate::Summary,
        full: std::sync::OnceLock<validate::Full>,
    },
    /// Not readable; its diagnostic is in the file's `doc_diags`; identified leniently when
    /// possible (so references to it are not reported again).
    Broken(Option<Broken>),
}

/// One document: where it sits in its file and what it became.
#[derive(Debug)]
struct ParsedDoc {
    /// Byte offset and length of the document's text, 0-based line of its start.
    offset: usize,
    len: usize,
    line: usize,
    outcome: DocOutcome,
}

/// Stage 1's result for one file: a pure function of its path and bytes.
#[derive(Debug)]
pub struct ParsedFile {
    /// The file's bytes as read (the cache key together with the path). When the file is
    /// readable, the same allocation as `text` (one copy of each file is held).
    bytes: Arc<[u8]>,
    /// The file's text, when the bytes are the text of the file (within the size limit and
    /// UTF-8); shared with every [`Loaded::sources`] that shows it.
    text: Option<Arc<str>>,
    /// Problems with the file itself (too large, not UTF-8).
    file_diags: Vec<Diagnostic>,
    /// Problems with its documents (too many, unreadable).
    doc_diags: Vec<Diagnostic>,
    docs: Vec<ParsedDoc>,
}

fn whole_file(path: &str, line: usize) -> Origin {
    Origin {
        file: path.to_string(),
        line,
        column: 1,
        offset: 0,
        len: 0,
    }
}

/// Stage 1: read one file's documents.
pub fn parse_file(path: &str, bytes: &Arc<[u8]>) -> ParsedFile {
    let mut out = ParsedFile {
        bytes: bytes.clone(),
        text: None,
        file_diags: Vec::new(),
        doc_diags: Vec::new(),
        docs: Vec::new(),
    };
    if bytes.len() > parse::MAX_FILE_BYTES {
        out.file_diags.push(Diagnostic::error(
            diagnostic::codes::FILE,
            whole_file(path, 1),
            format!(
                "file is larger than {} MiB (limit MAX_FILE_BYTES)",
                parse::MAX_FILE_BYTES / (1024 * 1024)
            ),
        ));
        return out;
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let at = e.valid_up_to();
            let line = bytes[..at].iter().filter(|b| **b == b'\n').count() + 1;
            out.file_diags.push(
                Diagnostic::error(
                    diagnostic::codes::FILE,
                    whole_file(path, line),
                    "file is not valid UTF-8",
                )
                .with_help("desired-state files are UTF-8 YAML"),
            );
            return out;
        }
    };
    let split = parse::split_documents(path, text);
    if split.len() > parse::MAX_DOCUMENTS_PER_FILE {
        out.doc_diags.push(
            Diagnostic::error(
                diagnostic::codes::LIMIT,
                whole_file(path, 1),
                format!(
                    "file has {} YAML documents, more than {} (limit MAX_DOCUMENTS_PER_FILE); none of them was read",
                    split.len(),
                    parse::MAX_DOCUMENTS_PER_FILE
                ),
            )
            .with_help("split the file"),
        );
    } else {
        for doc in split {
            let (offset, len, line) = (doc.offset, doc.text.len(), doc.line);
            let read = |full: validate::Full| DocOutcome::Read {
                summary: validate::Summary::of(&full),
                full: std::sync::OnceLock::from(full),
            };
            // Past its unknown fields, so their document's other errors show too (issue #52).
            let (raw, diags) = parse::read_past_unknown_fields(doc.clone());
            out.doc_diags.extend(diags);
            let outcome = match raw {
                Some(RawDoc::Cluster(c, _)) => read(validate::Full::Cluster(Box::new(c))),
                Some(RawDoc::NodePool(p, _)) => read(validate::Full::NodePool(Box::new(p))),
                // Only a broken document needs the lenient second read.
                None => DocOutcome::Broken(parse::identify(&doc)),
            };
            out.docs.push(ParsedDoc {
                offset,
                len,
                line,
                outcome,
            });
        }
    }
    let text: Arc<str> = Arc::from(text);
    out.bytes = Arc::from(text.clone());
    out.text = Some(text);
    out
}

impl ParsedFile {
    /// The file's text, when it is readable.
    fn text(&self) -> Option<&str> {
        self.text.as_deref()
    }
}

/// What the last [`Loader::load_snapshot`] did, for logs and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Files parsed (new or changed bytes).
    pub parsed: usize,
    /// Files whose previous parse was reused.
    pub reused: usize,
    /// Cached files dropped (gone from the revision).
    pub dropped: usize,
    /// Files not even read: their stamp proved the cached bytes current (directory mode,
    /// [`Loader::load`]); counted in `reused` too.
    pub unread: usize,
}

/// One file in the loader's cache: its parse, and (directory mode) the stamp it had when its
/// bytes were read and when that read's scan started.
#[derive(Debug)]
struct Cached {
    parsed: ParsedFile,
    read: Option<(Stamp, SystemTime)>,
    /// This parse's number (never reused by the loader): with a document's index, the
    /// identity [`validate::DocId`] the validation memo is keyed by.
    id: u64,
}

/// Loads revision after revision, keeping each file's parse while its bytes are unchanged,
/// and (directory mode) not reading a file whose stamp proves its bytes unchanged.
#[derive(Debug, Default)]
pub struct Loader {
    files: BTreeMap<String, Cached>,
    last: LoadStats,
    /// What stage 2 keeps between loads (each cluster's validated part, by its inputs).
    memo: validate::Memo,
    /// The number the next parse gets.
    next_id: u64,
    /// How many runs stage 1 splits its files into, and who runs them (none: the
    /// caller's thread).
    threads: usize,
    runner: Option<Runner>,
}

impl Loader {
    /// An empty loader: no cache, stage 1 on the caller's thread.
    pub fn new() -> Loader {
        Loader::default()
    }

    /// A loader that splits the files it parses into `threads` runs and hands them to
    /// `runner` (which may run them at once). The result is the same as [`Loader::new`]'s
    /// for every `threads`; only the wall time differs.
    pub fn parallel(runner: Runner, threads: usize) -> Loader {
        Loader {
            threads,
            runner: Some(runner),
            ..Loader::default()
        }
    }

    /// Read and validate a revision, re-reading only files whose stamp moved (or changed
    /// too recently to trust it) and re-parsing only files whose bytes changed.
    pub fn load(&mut self, source: &source::Source) -> Result<Loaded, SourceError> {
        self.load_scan(source, None)
    }

    /// [`Loader::load`] with the scan's start time given instead of the reader's clock: the
    /// racy rule ([`Stamp::settled_before`]) compares the files' stamps with it (tests).
    pub fn load_at(
        &mut self,
        source: &source::Source,
        scan: SystemTime,
    ) -> Result<Loaded, SourceError> {
        self.load_scan(source, Some(scan))
    }

    fn load_scan(
        &mut self,
        source: &source::Source,
        scan: Option<SystemTime>,
    ) -> Result<Loaded, SourceError> {
        let files = &self.files;
        let reuse = |path: &str, stamp: &Stamp| -> Option<Arc<[u8]>> {
            let c = files.get(path)?;
            let (was, read_at) = c.read.as_ref()?;
            (was == stamp && stamp.settled_before(*read_at)).then(|| c.parsed.bytes.clone())
        };
        let stamped = source::read_with(source, &reuse)?;
        let scan = scan.unwrap_or(stamped.scan);
        let loaded = self.load_stamped(stamped.snapshot, &stamped.stamps, scan);
        self.last.unread = stamped.unread;
        Ok(loaded)
    }

    /// What the last load parsed and reused.
    pub fn last_stats(&self) -> LoadStats {
        self.last
    }

    /// Validate the files of a revision, reusing the parse of every file whose path and bytes
    /// are those of the previous revision. Equal to [`super::parse_snapshot`] of the same
    /// snapshot.
    pub fn load_snapshot(&mut self, snapshot: Snapshot) -> Loaded {
        self.load_stamped(snapshot, &BTreeMap::new(), SystemTime::UNIX_EPOCH)
    }

    /// [`Loader::load_snapshot`] remembering each file's stamp (when it has one) and the
    /// start of the scan that read it.
    fn load_stamped(
        &mut self,
        snapshot: Snapshot,
        stamps: &BTreeMap<String, Stamp>,
        scan: SystemTime,
    ) -> Loaded {
        let mut stats = LoadStats::default();
        let mut next: BTreeMap<String, Cached> = BTreeMap::new();
        // Files whose bytes are new or changed, parsed below (in parallel).
        let mut fresh: Vec<&source::SourceFile> = Vec::new();
        for f in &snapshot.files {
            let stamp = stamps.get(&f.path).copied();
            match self.files.remove(&f.path) {
                Some(old)
                    if Arc::ptr_eq(&old.parsed.bytes, &f.bytes) || old.parsed.bytes == f.bytes =>
                {
                    stats.reused += 1;
                    // Read again (same bytes): this scan read them. Reused unread: the stamp
                    // was settled before an earlier scan, so before this one too.
                    next.insert(
                        f.path.clone(),
                        Cached {
                            parsed: old.parsed,
                            read: stamp.map(|s| (s, scan)),
                            id: old.id,
                        },
                    );
                }
                _ => fresh.push(f),
            }
        }
        stats.parsed = fresh.len();
        for (f, parsed) in fresh
            .iter()
            .zip(parse_all(&fresh, self.threads, self.runner))
        {
            let stamp = stamps.get(&f.path).copied();
            self.next_id += 1;
            next.insert(
                f.path.clone(),
                Cached {
                    parsed,
                    read: stamp.map(|s| (s, scan)),
                    id: self.next_id,
                },
            );
        }
        stats.dropped = self.files.len();
        self.files = next;
        self.last = stats;
        let loaded = assemble(&snapshot, &self.files, &mut self.memo);
        // Between loads only the summaries are kept (the next load reads again the few
        // documents it needs in full).
        for c in self.files.values_mut() {
            for d in &mut c.parsed.docs {
                if let DocOutcome::Read { full, .. } = &mut d.outcome {
                    full.take();
                }
            }
        }
        loaded
    }

    /// Cluster groups validated again by the last load (the rest were reused unchanged).
    pub fn last_revalidated(&self) -> usize {
        self.memo.last_revalidated
    }
}

/// One job of stage 1: parse a contiguous run of files.
pub type ParseJob<'a> = Box<dyn FnOnce() -> Vec<ParsedFile> + Send + 'a>;

/// Runs stage 1's jobs, possibly at the same time, and returns their results in the order of
/// the jobs. `desired` is pure and starts no thread: a caller that may use threads hands the
/// loader one ([`Loader::parallel`]; `ops::desired_loader` uses `std::thread::scope`).
pub type Runner = for<'a> fn(Vec<ParseJob<'a>>) -> Vec<Vec<ParsedFile>>;

/// Stage 1 for several files: on the caller's thread, or split into `threads` runs of about
/// equal bytes handed to `runner`; the results in the order of `files` either way (so
/// everything after is the same as a parse on one thread).
fn parse_all(
    files: &[&source::SourceFile],
    threads: usize,
    runner: Option<Runner>,
) -> Vec<ParsedFile> {
    let bytes: usize = files.iter().map(|f| f.bytes.len()).sum();
    let Some(runner) =
        runner.filter(|_| threads >= 2 && files.len() >= 2 && bytes >= PARALLEL_FROM_BYTES)
    else {
        return files
            .iter()
            .map(|f| parse_file(&f.path, &f.bytes))
            .collect();
    };
    let per = bytes.div_ceil(threads);
    let mut chunks: Vec<&[&source::SourceFile]> = Vec::new();
    let (mut start, mut acc) = (0, 0);
    for (i, f) in files.iter().enumerate() {
        acc += f.bytes.len();
        if acc >= per && chunks.len() + 1 < threads {
            chunks.push(&files[start..=i]);
            (start, acc) = (i + 1, 0);
        }
    }
    chunks.push(&files[start..]);
    let jobs: Vec<ParseJob<'_>> = chunks
        .into_iter()
        .map(|chunk| -> ParseJob<'_> {
            Box::new(move || {
                chunk
                    .iter()
                    .map(|f| parse_file(&f.path, &f.bytes))
                    .collect()
            })
        })
        .collect();
    runner(jobs).into_iter().flatten().collect()
}

/// Most runs a parallel loader should split stage 1 into (`ops::desired_loader`).
pub const PARSE_THREADS: usize = 4;

/// Below this many bytes to parse, one thread (starting threads costs more than it saves).
const PARALLEL_FROM_BYTES: usize = 64 * 1024;

/// Stage 2: the whole revision from its files' parses (in path order, as a cold load reads
/// them), every cross-file rule run again.
fn assemble(
    snapshot: &Snapshot,
    files: &BTreeMap<String, Cached>,
    memo: &mut validate::Memo,
) -> Loaded {
    let revision = source::revision_of(snapshot);
    let mut diagnostics = Vec::new();
    for r in &snapshot.refused {
        // Never any byte of the entry: the origin names the path only (no snippet).
        let code = match r.reason {
            source::RefusedReason::Symlink => diagnostic::codes::SYMLINK,
            source::RefusedReason::NotARegularFile => diagnostic::codes::FILE,
            _ => diagnostic::codes::LIMIT,
        };
        let what = if r.path.is_empty() {
            "the desired state".to_string()
        } else {
            format!("`{}`", r.path)
        };
        diagnostics.push(
            Diagnostic::error(
                code,
                whole_file(&r.path, 1),
                format!("{what} {}", r.message()),
            )
            .with_help(r.help()),
        );
    }
    let mut sources = BTreeMap::new();
    for (path, f) in files {
        let f = &f.parsed;
        diagnostics.extend(f.file_diags.iter().cloned());
        if let Some(text) = &f.text {
            sources.insert(path.clone(), text.clone());
        }
    }
    let mut inputs = Vec::new();
    let mut broken = Vec::new();
    // Documents of the revision, in path order; past the limit none is validated (issue #49:
    // a committer must not be able to stall planning with documents).
    let total: usize = files.values().map(|c| c.parsed.docs.len()).sum();
    let mut counted = 0;
    for (path, c) in files {
        let f = &c.parsed;
        let Some(text) = f.text() else { continue };
        let room = source::limits::MAX_DOCUMENTS - counted;
        let over = f.docs.get(room);
        // The documents' own diagnostics, up to the first one past the limit.
        diagnostics.extend(
            f.doc_diags
                .iter()
                .filter(|d| over.is_none_or(|at| d.origin.line < at.line))
                .cloned(),
        );
        if let Some(at) = over {
            diagnostics.push(
                Diagnostic::error(
                    diagnostic::codes::LIMIT,
                    whole_file(path, at.line),
                    format!(
                        "the desired state has {total} YAML documents, more than {} (limit MAX_DOCUMENTS); this is the first one past it, and none from here on was validated",
                        source::limits::MAX_DOCUMENTS
                    ),
                )
                .with_help("a pool holds any number of machines: merge pools, or split the fleet over several medea servers"),
            );
        }
        counted += f.docs.len().min(room);
        for (index, d) in f.docs.iter().enumerate().take(room) {
            let doc = DocText {
                file: path,
                text: &text[d.offset..d.offset + d.len],
                offset: d.offset,
                line: d.line,
            };
            let id = validate::DocId {
                file: c.id,
                index: index as u32,
            };
            match &d.outcome {
                DocOutcome::Read { summary, full } => inputs.push(validate::Input {
                    id,
                    doc,
                    summary,
                    full,
                }),
                DocOutcome::Broken(b) => broken.extend(b.clone()),
            }
        }
        if over.is_some() {
            break;
        }
    }
    let (desired, semantic) = validate::validate(&inputs, &broken, revision, memo);
    diagnostics.extend(semantic);
    diagnostics.sort_by(|a, b| {
        a.origin
            .cmp(&b.origin)
            .then_with(|| a.message.cmp(&b.message))
    });
    Loaded {
        desired,
        diagnostics,
        sources,
        markers: snapshot.markers.clone(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;
    use crate::desired::parse_snapshot;
    use crate::desired::source::{Refused, RefusedReason, SourceFile};

    /// One document of the generated repository.
    #[derive(Debug, Clone)]
    enum Doc {
        Cluster {
            name: String,
            kube: String,
            max_unavailable: u8,
        },
        Pool {
            name: String,
            cluster: String,
            controlplane: bool,
            talos: String,
            machines: Vec<u8>,
            after: Option<String>,
        },
    }

    /// A repository: documents placed in files, some files broken, some refused entries.
    #[derive(Debug, Clone)]
    struct Repo {
        /// (file number, document)
        docs: Vec<(u8, Doc)>,
        /// Files with garbage appended (a YAML syntax error, an unknown kind) or invalid UTF-8.
        broken: BTreeMap<u8, u8>,
        refused: bool,
    }

    const NAMES: [&str; 5] = ["alpha", "beta", "gamma", "Bad_Name", "delta"];
    const KUBE: [&str; 4] = ["v1.34.1", "v1.33.0", "v1.35.0", "1.34"];
    const TALOS: [&str; 4] = ["v1.12.4", "v1.11.5", "v1.13.0", "v1.x"];

    fn render_doc(d: &Doc) -> String {
        match d {
            Doc::Cluster {
                name,
                kube,
                max_unavailable,
            } => format!(
                "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  kubernetes:\n    version: {kube}\n  rollout:\n    maxUnavailable: {max_unavailable}\n"
            ),
            Doc::Pool {
                name,
                cluster,
                controlplane,
                talos,
                machines,
                after,
            } => {
                let ms: Vec<String> = machines.iter().map(|m| format!("m-{m}")).collect();
                let after = after
                    .as_ref()
                    .map(|a| format!("  after: [{a}]\n"))
                    .unwrap_or_default();
                format!(
                    "apiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: {name}\nspec:\n  cluster: {cluster}\n  role: {}\n  machines: [{}]\n  talos:\n    version: {talos}\n{after}",
                    if *controlplane {
                        "controlplane"
                    } else {
                        "worker"
                    },
                    ms.join(", ")
                )
            }
        }
    }

    impl Repo {
        fn snapshot(&self) -> Snapshot {
            let mut files: BTreeMap<u8, Vec<String>> = BTreeMap::new();
            for (f, d) in &self.docs {
                files.entry(*f).or_default().push(render_doc(d));
            }
            let files = files
                .into_iter()
                .map(|(f, docs)| {
                    let mut bytes = docs.join("---\n").into_bytes();
                    match self.broken.get(&f) {
                        Some(0) => bytes.extend_from_slice(b"spec: [unclosed\n  : :\n"),
                        Some(1) => bytes.extend_from_slice(b"\n---\nkind: Nothing\n"),
                        Some(_) => bytes.extend_from_slice(&[0xff, 0xfe, b'\n']),
                        None => {}
                    }
                    SourceFile {
                        path: format!("dir{}/f{f}.yaml", f % 2),
                        bytes: bytes.into(),
                    }
                })
                .collect();
            Snapshot {
                files,
                markers: Vec::new(),
                commit: None,
                refused: if self.refused {
                    vec![Refused {
                        path: "link.yaml".into(),
                        reason: RefusedReason::Symlink,
                    }]
                } else {
                    Vec::new()
                },
            }
        }
    }

    /// One edit of the repository; indices are taken modulo the current sizes.
    #[derive(Debug, Clone)]
    enum Edit {
        /// Change a value of a document (versions, maxUnavailable, machines).
        Value(usize, u8),
        /// Break a file's YAML (or its encoding), or repair it.
        Break(u8, Option<u8>),
        /// Add a document in a (possibly new) file.
        Add(u8, Doc),
        /// Remove every document of a file (the file is gone).
        RemoveFile(u8),
        /// Rename a pool (or a cluster) and nothing else.
        Rename(usize, u8),
        /// Move a document to another file.
        Move(usize, u8),
        Refused(bool),
    }

    fn doc_strategy() -> impl Strategy<Value = Doc> {
        prop_oneof![
            (0..5usize, 0..4usize, 0..4u8).prop_map(|(n, k, m)| Doc::Cluster {
                name: NAMES[n].to_string(),
                kube: KUBE[k].to_string(),
                max_unavailable: m,
            }),
            (
                0..5usize,
                0..5usize,
                any::<bool>(),
                0..4usize,
                proptest::collection::vec(0..6u8, 0..3),
                proptest::option::of(0..5usize)
            )
                .prop_map(|(n, c, cp, t, ms, after)| Doc::Pool {
                    name: format!("p{n}"),
                    cluster: NAMES[c].to_string(),
                    controlplane: cp,
                    talos: TALOS[t].to_string(),
                    machines: ms,
                    after: after.map(|a| format!("p{a}")),
                }),
        ]
    }

    fn edit_strategy() -> impl Strategy<Value = Edit> {
        prop_oneof![
            3 => (any::<usize>(), any::<u8>()).prop_map(|(i, v)| Edit::Value(i, v)),
            1 => (0..6u8, proptest::option::of(0..3u8)).prop_map(|(f, b)| Edit::Break(f, b)),
            2 => (0..6u8, doc_strategy()).prop_map(|(f, d)| Edit::Add(f, d)),
            1 => (0..6u8).prop_map(Edit::RemoveFile),
            2 => (any::<usize>(), 0..5u8).prop_map(|(i, n)| Edit::Rename(i, n)),
            2 => (any::<usize>(), 0..6u8).prop_map(|(i, f)| Edit::Move(i, f)),
            1 => any::<bool>().prop_map(Edit::Refused),
        ]
    }

    fn apply(repo: &mut Repo, edit: &Edit) {
        let n = repo.docs.len();
        match edit {
            Edit::Value(i, v) if n > 0 => match &mut repo.docs[i % n].1 {
                Doc::Cluster {
                    kube,
                    max_unavailable,
                    ..
                } => {
                    if v % 2 == 0 {
                        *kube = KUBE[*v as usize % KUBE.len()].to_string();
                    } else {
                        *max_unavailable = v % 4;
                    }
                }
                Doc::Pool {
                    talos, machines, ..
                } => {
                    if v % 2 == 0 {
                        *talos = TALOS[*v as usize % TALOS.len()].to_string();
                    } else {
                        *machines = vec![v % 6];
                    }
                }
            },
            Edit::Break(f, b) => match b {
                Some(b) => {
                    repo.broken.insert(*f, *b);
                }
                None => {
                    repo.broken.remove(f);
                }
            },
            Edit::Add(f, d) => repo.docs.push((*f, d.clone())),
            Edit::RemoveFile(f) => repo.docs.retain(|(g, _)| g != f),
            Edit::Rename(i, to) if n > 0 => match &mut repo.docs[i % n].1 {
                Doc::Cluster { name, .. } => *name = NAMES[*to as usize].to_string(),
                Doc::Pool { name, .. } => *name = format!("p{to}"),
            },
            Edit::Move(i, f) if n > 0 => {
                let (_, d) = repo.docs.remove(i % n);
                repo.docs.push((*f, d));
            }
            Edit::Refused(r) => repo.refused = *r,
            _ => {}
        }
    }

    fn assert_same(inc: &Loaded, cold: &Loaded) {
        assert_eq!(inc.diagnostics, cold.diagnostics);
        assert_eq!(inc.desired, cold.desired);
        assert_eq!(inc.desired.revision, cold.desired.revision);
        assert_eq!(inc.sources, cold.sources);
        assert_eq!(inc.markers, cold.markers);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn incremental_load_equals_cold_load(
            docs in proptest::collection::vec((0..6u8, doc_strategy()), 0..8),
            edits in proptest::collection::vec(edit_strategy(), 1..12),
        ) {
            let mut repo = Repo { docs, broken: BTreeMap::new(), refused: false };
            let mut loader = Loader::new();
            assert_same(&loader.load_snapshot(repo.snapshot()), &parse_snapshot(repo.snapshot()));
            for edit in &edits {
                let before: BTreeSet<(String, Vec<u8>)> = repo
                    .snapshot()
                    .files
                    .into_iter()
                    .map(|f| (f.path, f.bytes.to_vec()))
                    .collect();
                apply(&mut repo, edit);
                let snap = repo.snapshot();
                let changed = snap
                    .files
                    .iter()
                    .filter(|f| !before.contains(&(f.path.clone(), f.bytes.to_vec())))
                    .count();
                let inc = loader.load_snapshot(snap.clone());
                assert_same(&inc, &parse_snapshot(snap.clone()));
                let stats = loader.last_stats();
                prop_assert_eq!(stats.parsed, changed, "only changed files are parsed");
                prop_assert_eq!(stats.reused, snap.files.len() - changed);
            }
        }
    }

    /// Write `snap` into `dir` as a directory read would find it: files whose bytes changed
    /// since `prev` are written and given a new mtime of their own (`clock`, counting), files
    /// gone are removed, a refused entry is a symlink. Returns the paths written.
    fn write_snapshot(
        dir: &std::path::Path,
        prev: &BTreeMap<String, Vec<u8>>,
        snap: &Snapshot,
        clock: &mut u64,
    ) -> BTreeSet<String> {
        let now: BTreeMap<String, Vec<u8>> = snap
            .files
            .iter()
            .map(|f| (f.path.clone(), f.bytes.to_vec()))
            .collect();
        for path in prev.keys().filter(|p| !now.contains_key(*p)) {
            std::fs::remove_file(dir.join(path)).unwrap();
        }
        let mut written = BTreeSet::new();
        for (path, bytes) in &now {
            if prev.get(path) == Some(bytes) {
                continue;
            }
            let full = dir.join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(&full, bytes).unwrap();
            *clock += 1;
            let mtime = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + *clock);
            std::fs::File::options()
                .write(true)
                .open(&full)
                .unwrap()
                .set_modified(mtime)
                .unwrap();
            written.insert(path.clone());
        }
        let link = dir.join("link.yaml");
        let linked = link.symlink_metadata().is_ok();
        if !snap.refused.is_empty() && !linked {
            std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
        } else if snap.refused.is_empty() && linked {
            std::fs::remove_file(&link).unwrap();
        }
        written
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// The same, through a real directory and the stamp check: a loader that skips reading
        /// files whose stamp is unchanged equals a cold `desired::load` of the directory after
        /// every edit, and reads exactly the files that were written. The scan time is put an
        /// hour ahead so every stamp is settled (the racy rule is the unit test
        /// `a_stamp_changed_within_the_margin_is_never_trusted`); every write gets an mtime of
        /// its own, so a changed file's stamp always moves.
        #[test]
        fn a_loader_that_skips_unchanged_files_equals_a_cold_load(
            docs in proptest::collection::vec((0..6u8, doc_strategy()), 0..8),
            edits in proptest::collection::vec(edit_strategy(), 1..10),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let source = crate::desired::Source::Dir(dir.path().to_path_buf());
            let later = SystemTime::now() + std::time::Duration::from_secs(3600);
            let mut repo = Repo { docs, broken: BTreeMap::new(), refused: false };
            let mut clock = 0;
            let mut on_disk = BTreeMap::new();
            let mut loader = Loader::new();
            let mut snap = repo.snapshot();
            write_snapshot(dir.path(), &on_disk, &snap, &mut clock);
            assert_same(&loader.load_at(&source, later).unwrap(), &crate::desired::load(&source).unwrap());
            for edit in &edits {
                on_disk = snap.files.iter().map(|f| (f.path.clone(), f.bytes.to_vec())).collect();
                apply(&mut repo, edit);
                snap = repo.snapshot();
                let written = write_snapshot(dir.path(), &on_disk, &snap, &mut clock);
                let inc = loader.load_at(&source, later).unwrap();
                assert_same(&inc, &crate::desired::load(&source).unwrap());
                let stats = loader.last_stats();
                prop_assert_eq!(stats.unread, snap.files.len() - written.len(), "exactly the written files are read");
            }
        }
    }

    #[test]
    fn a_stamp_changed_within_the_margin_is_never_trusted() {
        use crate::desired::source::RACY_MARGIN;
        use std::time::Duration;
        let at = |s: i64| Stamp {
            dev: 1,
            ino: 2,
            size: 3,
            mtime: (s, 0),
            ctime: (s, 0),
        };
        let scan = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let margin = RACY_MARGIN.as_secs() as i64;
        assert!(at(1_000 - margin - 1).settled_before(scan));
        // Changed at the scan's tick, or within the margin before it: racy.
        assert!(!at(1_000).settled_before(scan));
        assert!(!at(1_000 - margin).settled_before(scan));
        assert!(!at(2_000).settled_before(scan));
        // An old mtime (`touch -d`, `cp -p`) with a recent ctime is racy too.
        let mut touched = at(10);
        touched.ctime = (999, 999_999_999);
        assert!(!touched.settled_before(scan));
        touched.ctime = (1_000 - margin - 1, 999_999_999);
        assert!(touched.settled_before(scan));
    }

    #[test]
    fn an_edit_right_after_a_read_is_read_even_when_the_stamp_looks_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let source = crate::desired::Source::Dir(dir.path().to_path_buf());
        let file = dir.path().join("c.yaml");
        let doc = |m: u8| {
            format!(
                "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: c1\nspec:\n  kubernetes:\n    version: v1.34.1\n  rollout:\n    maxUnavailable: {m}\n"
            )
        };
        std::fs::write(&file, doc(1)).unwrap();
        let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
        let mut loader = Loader::new();
        let first = loader.load(&source).unwrap();
        // Same size, the mtime put back: within the same tick the ctime may not move either.
        std::fs::write(&file, doc(2)).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let second = loader.load(&source).unwrap();
        assert_eq!(loader.last_stats().unread, 0, "a racy file is read again");
        assert_ne!(first.desired, second.desired);
        assert_same(&second, &crate::desired::load(&source).unwrap());
    }

    #[test]
    fn an_unchanged_file_is_not_parsed_again_and_a_changed_one_is() {
        let cluster = "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: c1\nspec:\n  kubernetes:\n    version: v1.34.1\n";
        let pool = |v: &str| {
            format!(
                "apiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: cp\nspec:\n  cluster: c1\n  role: controlplane\n  machines: [a]\n  talos:\n    version: {v}\n"
            )
        };
        let snap = |p: &str| Snapshot {
            files: vec![
                SourceFile {
                    path: "c1.yaml".into(),
                    bytes: cluster.as_bytes().to_vec().into(),
                },
                SourceFile {
                    path: "pool.yaml".into(),
                    bytes: p.as_bytes().to_vec().into(),
                },
            ],
            markers: Vec::new(),
            commit: None,
            refused: Vec::new(),
        };
        let mut loader = Loader::new();
        let first = loader.load_snapshot(snap(&pool("v1.12.4")));
        assert!(!first.has_errors(), "{:#?}", first.diagnostics);
        assert_eq!(
            loader.last_stats(),
            LoadStats {
                parsed: 2,
                reused: 0,
                dropped: 0,
                unread: 0,
            }
        );
        let second = loader.load_snapshot(snap(&pool("v1.x")));
        assert_eq!(
            loader.last_stats(),
            LoadStats {
                parsed: 1,
                reused: 1,
                dropped: 0,
                unread: 0,
            }
        );
        assert!(
            second.has_errors(),
            "the changed file's new error is reported"
        );
        assert_ne!(first.desired.revision, second.desired.revision);
        let third = loader.load_snapshot(snap(&pool("v1.12.4")));
        assert_eq!(
            loader.last_stats(),
            LoadStats {
                parsed: 1,
                reused: 1,
                dropped: 0,
                unread: 0,
            }
        );
        assert_eq!(third.diagnostics, first.diagnostics);
        assert_eq!(third.desired, first.desired);
    }

    fn cluster_doc(name: &str, extra: &str) -> String {
        format!(
            "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  kubernetes:\n    version: v1.34.1\n{extra}"
        )
    }

    fn pool_doc(name: &str, cluster: &str, machines: &[&str], after: &str) -> String {
        format!(
            "apiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: {name}\nspec:\n  cluster: {cluster}\n  role: worker\n  machines: [{}]\n  talos:\n    version: v1.12.4\n{after}",
            machines.join(", ")
        )
    }

    fn files(files: &[(&str, Vec<String>)]) -> Snapshot {
        Snapshot {
            files: files
                .iter()
                .map(|(path, docs)| SourceFile {
                    path: path.to_string(),
                    bytes: docs.join("---\n").into_bytes().into(),
                })
                .collect(),
            markers: Vec::new(),
            commit: None,
            refused: Vec::new(),
        }
    }

    /// Load `snap` incrementally, compare with a cold load, return the codes of its errors
    /// and how many cluster groups were validated again.
    fn step(loader: &mut Loader, snap: Snapshot) -> (Vec<&'static str>, usize) {
        let inc = loader.load_snapshot(snap.clone());
        assert_same(&inc, &parse_snapshot(snap));
        (
            inc.diagnostics.iter().map(|d| d.code).collect(),
            loader.last_revalidated(),
        )
    }

    /// A machine is named per cluster (issue 39 item 11): `m-1` in cluster `a` and `m-1` in
    /// cluster `b` are two machines; listed twice within one cluster (two pools, two files)
    /// is the error, named at the second listing with the first one in its help.
    #[test]
    fn a_machine_moving_between_files_and_pools_is_validated_like_a_cold_load() {
        let mut loader = Loader::new();
        let a = cluster_doc("a", "");
        let b = cluster_doc("b", "");
        let clusters = ("clusters.yaml", vec![a.clone(), b.clone()]);
        let lab = ("lab.yaml", vec![pool_doc("p3", "b", &["m-1"], "")]);
        // m-1 in a/p1 and in b/p3: the same name in two clusters is no conflict.
        let (codes, n) = step(
            &mut loader,
            files(&[
                clusters.clone(),
                ("a.yaml", vec![pool_doc("p1", "a", &["m-1"], "")]),
                ("b.yaml", vec![pool_doc("p2", "a", &["m-2"], "")]),
                lab.clone(),
            ]),
        );
        assert!(codes.is_empty(), "{codes:?}");
        assert_eq!(n, 2, "a cold load validates every cluster");
        // m-1 listed in a's other pool too (another file, same cluster): only `a` is
        // validated again; the error names the first listing in a.yaml.
        let snap = files(&[
            clusters.clone(),
            ("a.yaml", vec![pool_doc("p1", "a", &["m-1"], "")]),
            ("b.yaml", vec![pool_doc("p2", "a", &["m-2", "m-1"], "")]),
            lab.clone(),
        ]);
        let inc = loader.load_snapshot(snap.clone());
        assert_same(&inc, &parse_snapshot(snap));
        assert_eq!(loader.last_revalidated(), 1);
        assert_eq!(inc.diagnostics.len(), 1);
        let d = &inc.diagnostics[0];
        assert_eq!(d.code, crate::desired::diagnostic::codes::MACHINE_TWICE);
        assert_eq!(d.origin.file, "b.yaml");
        assert!(
            d.help.as_deref().is_some_and(|h| h.contains("a.yaml:8")),
            "{:?}",
            d.help
        );
        assert!(d.message.contains("of cluster `a`"), "{}", d.message);
        // Removed from a.yaml: `a` changes (its file and its conflict), `b` does not.
        let (codes, n) = step(
            &mut loader,
            files(&[
                clusters.clone(),
                ("a.yaml", vec![pool_doc("p1", "a", &["m-3"], "")]),
                ("b.yaml", vec![pool_doc("p2", "a", &["m-2", "m-1"], "")]),
                lab.clone(),
            ]),
        );
        assert!(codes.is_empty(), "{codes:?}");
        assert_eq!(n, 1);
        // Listed back in a.yaml, whose path sorts first: a.yaml's listing is now the first
        // one, so b.yaml (unchanged bytes) gets the error again.
        let (codes, n) = step(
            &mut loader,
            files(&[
                clusters.clone(),
                ("a.yaml", vec![pool_doc("p1", "a", &["m-3", "m-1"], "")]),
                ("b.yaml", vec![pool_doc("p2", "a", &["m-2", "m-1"], "")]),
                lab.clone(),
            ]),
        );
        assert_eq!(
            codes,
            vec![crate::desired::diagnostic::codes::MACHINE_TWICE]
        );
        assert_eq!(n, 1);
        // Cluster `b` becomes invalid: its own error is reported, `a` keeps its conflict
        // (it never depended on `b`) and is not validated again.
        let b_invalid = || {
            files(&[
                (
                    "clusters.yaml",
                    vec![a.clone(), cluster_doc("b", "").replace("v1.34.1", "1.34")],
                ),
                ("a.yaml", vec![pool_doc("p1", "a", &["m-3", "m-1"], "")]),
                ("b.yaml", vec![pool_doc("p2", "a", &["m-2", "m-1"], "")]),
                lab.clone(),
            ])
        };
        let snap = b_invalid();
        let inc = loader.load_snapshot(snap.clone());
        assert_same(&inc, &parse_snapshot(snap));
        let mut codes: Vec<&str> = inc.diagnostics.iter().map(|d| d.code).collect();
        codes.sort();
        let mut want = vec![
            crate::desired::diagnostic::codes::MACHINE_TWICE,
            crate::desired::diagnostic::codes::VERSION,
        ];
        want.sort();
        assert_eq!(codes, want);
        // Nothing changed: nothing validated again.
        let (_, n) = step(&mut loader, b_invalid());
        assert_eq!(n, 0);
    }

    #[test]
    fn duplicate_names_appearing_and_disappearing_are_validated_like_a_cold_load() {
        use crate::desired::diagnostic::codes;
        let mut loader = Loader::new();
        let one = cluster_doc("c", "");
        let other = cluster_doc("c", "  rollout:\n    maxUnavailable: 3\n");
        let pools = (
            "pools.yaml",
            vec![
                pool_doc("p1", "c", &["m-1"], ""),
                pool_doc("p2", "c", &["m-2"], "  after: [p1]\n"),
            ],
        );
        let (codes, _) = step(
            &mut loader,
            files(&[("a.yaml", vec![one.clone()]), pools.clone()]),
        );
        assert!(codes.is_empty(), "{codes:?}");
        // A second Cluster `c` in another file: the first one (by path) still defines it.
        let snap = files(&[
            ("a.yaml", vec![one.clone()]),
            ("b.yaml", vec![other.clone()]),
            pools.clone(),
        ]);
        let inc = loader.load_snapshot(snap.clone());
        assert_same(&inc, &parse_snapshot(snap));
        assert_eq!(inc.diagnostics.len(), 1);
        assert_eq!(inc.diagnostics[0].code, codes::DUPLICATE);
        assert_eq!(inc.diagnostics[0].origin.file, "b.yaml");
        assert_eq!(inc.desired.clusters["c"].rollout.max_unavailable, 1);
        // The first one removed: the other defines `c` now, and every pool is validated
        // against it (its rollout settings are the pools' base).
        let snap = files(&[("b.yaml", vec![other.clone()]), pools.clone()]);
        let inc = loader.load_snapshot(snap.clone());
        assert_same(&inc, &parse_snapshot(snap));
        assert!(inc.diagnostics.is_empty(), "{:?}", inc.diagnostics);
        assert_eq!(
            inc.desired.clusters["c"].pools["p2"]
                .rollout
                .max_unavailable,
            3
        );
        // A duplicate pool appears in another file, then the original goes: `after: [p1]`
        // keeps pointing at a pool of that name.
        let dup = ("q.yaml", vec![pool_doc("p1", "c", &["m-9"], "")]);
        let (codes, _) = step(
            &mut loader,
            files(&[("b.yaml", vec![other.clone()]), pools.clone(), dup.clone()]),
        );
        assert_eq!(codes, vec![codes::DUPLICATE]);
        let (codes, _) = step(
            &mut loader,
            files(&[
                ("b.yaml", vec![other.clone()]),
                (
                    "pools.yaml",
                    vec![pool_doc("p2", "c", &["m-2"], "  after: [p1]\n")],
                ),
                dup.clone(),
            ]),
        );
        assert!(codes.is_empty(), "{codes:?}");
        // And goes too: `after: [p1]` now names no pool.
        let (codes, _) = step(
            &mut loader,
            files(&[
                ("b.yaml", vec![other.clone()]),
                (
                    "pools.yaml",
                    vec![pool_doc("p2", "c", &["m-2"], "  after: [p1]\n")],
                ),
            ]),
        );
        assert_eq!(codes, vec![codes::MISSING_POOL]);
    }

    #[test]
    fn one_changed_file_validates_only_the_clusters_it_can_affect() {
        let mut loader = Loader::new();
        let repo = |version: &str| {
            let mut out = Vec::new();
            for c in 0..5 {
                let name = format!("c{c}");
                let mut docs = vec![cluster_doc(&name, "")];
                let m = format!("m-{c}");
                docs.push(pool_doc("w", &name, &[m.as_str()], ""));
                if c == 2 {
                    docs[0] = docs[0].replace("v1.34.1", version);
                }
                out.push((format!("{name}.yaml"), docs));
            }
            let refs: Vec<(&str, Vec<String>)> =
                out.iter().map(|(p, d)| (p.as_str(), d.clone())).collect();
            files(&refs)
        };
        assert_eq!(step(&mut loader, repo("v1.34.1")).1, 5);
        assert_eq!(step(&mut loader, repo("v1.34.2")).1, 1);
        assert_eq!(loader.last_stats().parsed, 1);
        assert_eq!(step(&mut loader, repo("v1.34.2")).1, 0);
        // A load split into runs (here run in reverse order, then put back) equals one on
        // the calling thread.
        fn reversed(jobs: Vec<ParseJob<'_>>) -> Vec<Vec<ParsedFile>> {
            let mut out: Vec<_> = jobs.into_iter().rev().map(|j| j()).collect();
            out.reverse();
            out
        }
        let big = |v: &str| {
            let mut snap = repo(v);
            for f in &mut snap.files {
                let mut bytes = f.bytes.to_vec();
                bytes.extend(std::iter::repeat_n(b'#', PARALLEL_FROM_BYTES));
                bytes.push(b'\n');
                f.bytes = bytes.into();
            }
            snap
        };
        for threads in [2, 3, 7] {
            assert_same(
                &Loader::parallel(reversed, threads).load_snapshot(big("v1.34.2")),
                &Loader::new().load_snapshot(big("v1.34.2")),
            );
        }
    }
}
