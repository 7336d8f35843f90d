//! Incremental loading: re-parse only the files whose bytes changed. Pure (the reading stays
//! in [`super::source`]).
//!
//! A revision is loaded in two stages:
//!
//! 1. **Per file** ([`parse_file`]): bytes → text (size and UTF-8 checks), documents, and each
//!    document read strictly (or identified leniently when that fails). The result depends on
//!    the file's path and bytes only, so it is kept in a [`Loader`] keyed by path and reused
//!    while the file's bytes are unchanged. This stage is the cost of a load (YAML parsing).
//! 2. **Whole revision** (`assemble`): the refused entries' diagnostics, then every file's
//!    parsed documents in path order handed to [`super::validate::validate`], which runs every
//!    cross-file rule (cluster references, duplicates, machines in two pools, `after:` order)
//!    again over the cached documents. Those rules cost a few percent of a parse (measured in
//!    design/performance.md), so they are not split further: re-running them all is what
//!    makes an incremental load equal to a cold one by construction.
//!
//! A cold load ([`super::parse_snapshot`]) is the same code with an empty cache, so the two
//! can differ only if a cached file result were reused for different bytes; the property test
//! `incremental_load_equals_cold_load` (tests) checks that over random edit sequences.

use std::collections::BTreeMap;

use super::diagnostic::{self, Diagnostic};
use super::format::{ClusterDoc, NodePoolDoc};
use super::model::Origin;
use super::parse::{self, Broken, DocText, RawDoc};
use super::source::{self, Snapshot, SourceError};
use super::{Loaded, validate};

/// What one document of a file became in stage 1.
#[derive(Debug, Clone)]
enum DocOutcome {
    Cluster(ClusterDoc),
    NodePool(NodePoolDoc),
    /// Not readable; its diagnostic is in the file's `doc_diags`; identified leniently when
    /// possible (so references to it are not reported again).
    Broken(Option<Broken>),
}

/// One document: where it sits in its file and what it became.
#[derive(Debug, Clone)]
struct ParsedDoc {
    /// Byte offset and length of the document's text, 0-based line of its start.
    offset: usize,
    len: usize,
    line: usize,
    outcome: DocOutcome,
}

/// Stage 1's result for one file: a pure function of its path and bytes.
#[derive(Debug, Clone)]
pub struct ParsedFile {
    /// The file's bytes as read (the cache key together with the path).
    bytes: Vec<u8>,
    /// Whether the bytes are the text of the file (within the size limit and UTF-8).
    readable: bool,
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
pub fn parse_file(path: &str, bytes: &[u8]) -> ParsedFile {
    let mut out = ParsedFile {
        bytes: bytes.to_vec(),
        readable: false,
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
            let outcome = match parse::read_document(doc.clone()) {
                Ok(RawDoc::Cluster(c, _)) => DocOutcome::Cluster(c),
                Ok(RawDoc::NodePool(p, _)) => DocOutcome::NodePool(p),
                Err(d) => {
                    out.doc_diags.push(d);
                    // Only a broken document needs the lenient second read.
                    DocOutcome::Broken(parse::identify(&doc))
                }
            };
            out.docs.push(ParsedDoc {
                offset,
                len,
                line,
                outcome,
            });
        }
    }
    out.readable = true;
    out
}

impl ParsedFile {
    /// The file's text, when it is readable.
    fn text(&self) -> Option<&str> {
        if !self.readable {
            return None;
        }
        std::str::from_utf8(&self.bytes).ok()
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
}

/// Loads revision after revision, keeping each file's parse while its bytes are unchanged.
#[derive(Debug, Default)]
pub struct Loader {
    files: BTreeMap<String, ParsedFile>,
    last: LoadStats,
}

impl Loader {
    pub fn new() -> Loader {
        Loader::default()
    }

    /// Read and validate a revision, re-parsing only files whose bytes changed.
    pub fn load(&mut self, source: &source::Source) -> Result<Loaded, SourceError> {
        Ok(self.load_snapshot(source::read(source)?))
    }

    /// What the last load parsed and reused.
    pub fn last_stats(&self) -> LoadStats {
        self.last
    }

    /// Validate the files of a revision, reusing the parse of every file whose path and bytes
    /// are those of the previous revision. Equal to [`super::parse_snapshot`] of the same
    /// snapshot.
    pub fn load_snapshot(&mut self, snapshot: Snapshot) -> Loaded {
        let mut stats = LoadStats::default();
        let mut next: BTreeMap<String, ParsedFile> = BTreeMap::new();
        for f in &snapshot.files {
            let parsed = match self.files.remove(&f.path) {
                Some(old) if old.bytes == f.bytes => {
                    stats.reused += 1;
                    old
                }
                _ => {
                    stats.parsed += 1;
                    parse_file(&f.path, &f.bytes)
                }
            };
            next.insert(f.path.clone(), parsed);
        }
        stats.dropped = self.files.len();
        self.files = next;
        self.last = stats;
        assemble(&snapshot, &self.files)
    }
}

/// Stage 2: the whole revision from its files' parses (in path order, as a cold load reads
/// them), every cross-file rule run again.
fn assemble(snapshot: &Snapshot, files: &BTreeMap<String, ParsedFile>) -> Loaded {
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
            Diagnostic::error(code, whole_file(&r.path, 1), format!("{what} {}", r.message()))
                .with_help(r.help()),
        );
    }
    let mut sources = BTreeMap::new();
    for (path, f) in files {
        diagnostics.extend(f.file_diags.iter().cloned());
        if let Some(text) = f.text() {
            sources.insert(path.clone(), text.to_string());
        }
    }
    let mut docs = Vec::new();
    let mut broken = Vec::new();
    for (path, f) in files {
        let Some(text) = f.text() else { continue };
        diagnostics.extend(f.doc_diags.iter().cloned());
        for d in &f.docs {
            let doc = DocText {
                file: path,
                text: &text[d.offset..d.offset + d.len],
                offset: d.offset,
                line: d.line,
            };
            match &d.outcome {
                DocOutcome::Cluster(c) => docs.push(RawDoc::Cluster(c.clone(), doc)),
                DocOutcome::NodePool(p) => docs.push(RawDoc::NodePool(p.clone(), doc)),
                DocOutcome::Broken(b) => broken.extend(b.clone()),
            }
        }
    }
    let (desired, semantic) = validate::validate(docs, &broken, revision);
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
