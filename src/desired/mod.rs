//! The desired state: resource kinds, loading a directory or git revision, validation.
//!
//! **Owns:** the `medea/v1alpha1` file format ([`format`], also the source of `schemas/`), the
//! validated model ([`model`]), diagnostics with file:line:column ([`diagnostic`]), maintenance
//! windows ([`window`]), and reading a revision ([`source`]).
//! **May depend on:** `version` only.
//!
//! Architecture Invariant: parsing and validation ([`parse_snapshot`]) are pure functions of the
//! files' bytes; [`source`] is the only I/O in this module.
//! Architecture Invariant: every problem of a revision is reported at once, and a revision with
//! any error is never planned or stored ([`Loaded::valid`] returns `None`).

pub mod diagnostic;
pub mod edit;
pub mod format;
pub mod health;
pub mod model;
pub mod parse;
pub mod schema;
pub mod source;
pub mod validate;
pub mod window;

use std::collections::BTreeMap;

pub use diagnostic::{Diagnostic, Severity};
pub use model::{Cluster, Desired, NodePool, Origin, Revision, Role, Sourced};
pub use source::{MarkerFile, Refused, RefusedReason, Snapshot, Source, SourceError};

/// The result of loading one revision: the model, every diagnostic, and the sources for
/// rendering them.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub desired: Desired,
    pub diagnostics: Vec<Diagnostic>,
    /// File path → text, for diagnostics with snippets.
    pub sources: BTreeMap<String, String>,
    /// Approval marker candidates found in the revision.
    pub markers: Vec<MarkerFile>,
}

impl Loaded {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
    /// The desired state, only when the revision has no error.
    pub fn valid(&self) -> Option<&Desired> {
        (!self.has_errors()).then_some(&self.desired)
    }
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.is_error())
    }
}

/// Read and validate a revision.
pub fn load(source: &Source) -> Result<Loaded, SourceError> {
    Ok(parse_snapshot(source::read(source)?))
}

/// Validate the files of a revision. Pure.
pub fn parse_snapshot(snapshot: Snapshot) -> Loaded {
    let revision = source::revision_of(&snapshot);
    let mut diagnostics = Vec::new();
    let mut sources = BTreeMap::new();
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
                Origin {
                    file: r.path.clone(),
                    line: 1,
                    column: 1,
                    offset: 0,
                    len: 0,
                },
                format!("{what} {}", r.message()),
            )
            .with_help(r.help()),
        );
    }
    for f in &snapshot.files {
        if f.bytes.len() > parse::MAX_FILE_BYTES {
            diagnostics.push(Diagnostic::error(
                diagnostic::codes::FILE,
                Origin {
                    file: f.path.clone(),
                    line: 1,
                    column: 1,
                    offset: 0,
                    len: 0,
                },
                format!(
                    "file is larger than {} MiB (limit MAX_FILE_BYTES)",
                    parse::MAX_FILE_BYTES / (1024 * 1024)
                ),
            ));
            continue;
        }
        match String::from_utf8(f.bytes.clone()) {
            Ok(text) => {
                sources.insert(f.path.clone(), text);
            }
            Err(e) => {
                let at = e.utf8_error().valid_up_to();
                let line = f.bytes[..at].iter().filter(|b| **b == b'\n').count() + 1;
                diagnostics.push(
                    Diagnostic::error(
                        diagnostic::codes::FILE,
                        Origin {
                            file: f.path.clone(),
                            line,
                            column: 1,
                            offset: 0,
                            len: 0,
                        },
                        "file is not valid UTF-8",
                    )
                    .with_help("desired-state files are UTF-8 YAML"),
                );
            }
        }
    }
    let mut docs = Vec::new();
    let mut broken = Vec::new();
    for (path, text) in &sources {
        let split = parse::split_documents(path, text);
        if split.len() > parse::MAX_DOCUMENTS_PER_FILE {
            diagnostics.push(
                Diagnostic::error(
                    diagnostic::codes::LIMIT,
                    Origin {
                        file: path.clone(),
                        line: 1,
                        column: 1,
                        offset: 0,
                        len: 0,
                    },
                    format!(
                        "file has {} YAML documents, more than {} (limit MAX_DOCUMENTS_PER_FILE); none of them was read",
                        split.len(),
                        parse::MAX_DOCUMENTS_PER_FILE
                    ),
                )
                .with_help("split the file"),
            );
            continue;
        }
        for doc in split {
            match parse::read_document(doc.clone()) {
                Ok(raw) => docs.push(raw),
                Err(d) => {
                    diagnostics.push(d);
                    // Only a broken document needs the lenient second read.
                    broken.extend(parse::identify(&doc));
                }
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
        markers: snapshot.markers,
    }
}
