//! The desired state: resource kinds, loading a directory or git revision, validation.
//!
//! **Owns:** the `medea/v1alpha1` file format ([`format`], also the source of `schemas/`), the
//! validated model ([`model`]), diagnostics with file:line:column ([`diagnostic`]), maintenance
//! windows ([`window`]) and exclusions ([`exclusion`]), scheduled backups ([`backup`]), blocking
//! hooks ([`hooks`]; what a Job hook runs, [`hook_view`]; the server's policy over them,
//! [`hook_policy`]), and
//! reading a revision ([`source`]).
//! **May depend on:** the `desired` row of design/architecture.md's code map (the one list,
//! checked by `tests/it/architecture.rs`).
//!
//! Architecture Invariant: parsing and validation ([`parse_snapshot`]) are pure functions of the
//! files' bytes; [`source`] is the only I/O in this module.
//! Architecture Invariant: every problem of a revision is reported at once, and a revision with
//! any error is never planned or stored ([`Loaded::valid`] returns `None`).

pub mod backup;
pub mod diagnostic;
pub mod edit;
pub mod exclusion;
pub mod format;
pub mod health;
pub mod hook_policy;
pub mod hook_view;
pub mod hooks;
pub mod incremental;
pub mod model;
pub mod parse;
pub mod schema;
pub mod source;
pub mod validate;
pub mod window;

use std::collections::BTreeMap;

pub use diagnostic::{Diagnostic, Severity};
pub use incremental::Loader;
pub use model::{Cluster, Desired, NodePool, Origin, Revision, Role, Sourced};
pub use source::{MarkerFile, Refused, RefusedReason, Snapshot, Source, SourceError};

/// The result of loading one revision: the model, every diagnostic, and the sources for
/// rendering them.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The model as far as it could be built (check `has_errors` before using it).
    pub desired: Desired,
    /// Every problem found, errors and warnings, in file order.
    pub diagnostics: Vec<Diagnostic>,
    /// File path → text, for diagnostics with snippets (shared with the loader's cache).
    pub sources: BTreeMap<String, std::sync::Arc<str>>,
    /// Approval marker candidates found in the revision.
    pub markers: Vec<MarkerFile>,
}

impl Loaded {
    /// Whether any diagnostic is an error (the revision must not be planned).
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
    /// The desired state, only when the revision has no error.
    pub fn valid(&self) -> Option<&Desired> {
        (!self.has_errors()).then_some(&self.desired)
    }
    /// Only the diagnostics that are errors.
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.is_error())
    }
}

/// Read and validate a revision.
pub fn load(source: &Source) -> Result<Loaded, SourceError> {
    Ok(parse_snapshot(source::read(source)?))
}

/// Validate the files of a revision. Pure. A cold load: [`incremental::Loader`] with nothing
/// cached.
pub fn parse_snapshot(snapshot: Snapshot) -> Loaded {
    incremental::Loader::new().load_snapshot(snapshot)
}
