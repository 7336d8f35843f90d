//! Diagnostics: every problem found in the desired state, with file, line, column and span.
//!
//! Plain data here; the CLI turns them into miette reports with source snippets.

use serde::Serialize;

use super::model::Origin;

/// How bad a diagnostic is: an error blocks the revision, a warning does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The revision is invalid and is not planned.
    Error,
    /// Worth a look, but the revision is still valid.
    Warning,
}

/// One problem found in the desired state, located by file, line, column and span.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// Whether it blocks the revision.
    pub severity: Severity,
    /// Stable code, e.g. `medea::desired::unknown-field`.
    pub code: &'static str,
    /// What is wrong, in one sentence.
    pub message: String,
    /// What the span points at, shown under the snippet.
    pub label: String,
    /// Where in which file the problem is.
    pub origin: Origin,
    /// How to fix it, when there is a known fix.
    pub help: Option<String>,
}

impl Diagnostic {
    /// An error with `code` at `origin`, labelled "here", without help.
    pub fn error(code: &'static str, origin: Origin, message: impl Into<String>) -> Diagnostic {
        let message = message.into();
        Diagnostic {
            severity: Severity::Error,
            code,
            label: String::from("here"),
            message,
            origin,
            help: None,
        }
    }
    /// A warning with `code` at `origin`, labelled "here", without help.
    pub fn warning(code: &'static str, origin: Origin, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, origin, message)
        }
    }
    /// The same diagnostic with a hint on how to fix it.
    pub fn with_help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }
    /// The same diagnostic with `label` shown under the snippet instead of "here".
    pub fn with_label(mut self, label: impl Into<String>) -> Diagnostic {
        self.label = label.into();
        self
    }
    /// Whether this diagnostic blocks the revision.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl std::fmt::Display for Diagnostic {
    /// One line, `file:line:col: error[code]: message`, as compilers print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(
            f,
            "{}:{}:{}: {sev}[{}]: {}",
            self.origin.file, self.origin.line, self.origin.column, self.code, self.message
        )?;
        if let Some(h) = &self.help {
            write!(f, " (help: {h})")?;
        }
        Ok(())
    }
}

/// Diagnostic codes, in one place so documentation and tests can list them.
pub mod codes {
    /// The YAML cannot be read at all.
    pub const SYNTAX: &str = "medea::desired::syntax";
    /// A field the document kind does not have (often a typo).
    pub const UNKNOWN_FIELD: &str = "medea::desired::unknown-field";
    /// A field's value has the wrong type or is out of range.
    pub const INVALID_VALUE: &str = "medea::desired::invalid-value";
    /// `apiVersion` is not one medea reads.
    pub const API_VERSION: &str = "medea::desired::api-version";
    /// `kind` is missing or not `Cluster`/`NodePool`.
    pub const KIND: &str = "medea::desired::kind";
    /// `metadata.name` is missing or not a valid name.
    pub const NAME: &str = "medea::desired::name";
    /// Two documents of the same kind share a name.
    pub const DUPLICATE: &str = "medea::desired::duplicate";
    /// A node pool names a cluster no document defines.
    pub const MISSING_CLUSTER: &str = "medea::desired::missing-cluster";
    /// A node pool comes after a pool its cluster does not have.
    pub const MISSING_POOL: &str = "medea::desired::missing-pool";
    /// One machine is listed in two node pools.
    pub const MACHINE_TWICE: &str = "medea::desired::machine-in-two-pools";
    /// The control-plane pool allows more than one node down at a time.
    pub const CONTROL_PLANE_UNAVAILABLE: &str = "medea::desired::controlplane-max-unavailable";
    /// A Talos or Kubernetes version is not a full `vX.Y.Z` or is not allowed.
    pub const VERSION: &str = "medea::desired::version";
    /// A duration is not a valid Go-style duration (`10m`, `1h30m`).
    pub const DURATION: &str = "medea::desired::duration";
    /// The installer image is not a valid image reference.
    pub const IMAGE: &str = "medea::desired::installer-image";
    /// A maintenance window's cron start, duration or time zone is invalid.
    pub const WINDOW: &str = "medea::desired::window";
    /// A maintenance exclusion's name, times, time zone or scope is invalid.
    pub const EXCLUSION: &str = "medea::desired::exclusion";
    /// An approval count is below 1 or the control-plane count is below `required`.
    pub const APPROVALS: &str = "medea::desired::approvals";
    /// The node pools' `after:` order is invalid (itself, a cycle, control plane after workers).
    pub const ORDER: &str = "medea::desired::order";
    /// A node pool lists no machine.
    pub const EMPTY_POOL: &str = "medea::desired::empty-pool";
    /// A file of the desired state cannot be read.
    pub const FILE: &str = "medea::desired::file";
    /// A symlink in the desired state is refused.
    pub const SYMLINK: &str = "medea::desired::symlink";
    /// A size or count limit (file size, documents, files) is exceeded.
    pub const LIMIT: &str = "medea::desired::limit";
    /// A health check (source, query, threshold) is invalid.
    pub const HEALTH: &str = "medea::desired::health";
    /// `promotion.after` names itself, an undefined cluster, or forms a cycle.
    pub const PROMOTION: &str = "medea::desired::promotion";
    /// An acknowledged finding id is empty or invalid.
    pub const ACKNOWLEDGE: &str = "medea::desired::acknowledge";
    /// A bad `spec.backup` value (schedule, time zone, retention, destination, recipient).
    pub const BACKUP: &str = "medea::desired::backup";
    /// A bad `hooks:` entry (name, timeout, kind, URL, credential, Job template).
    pub const HOOKS: &str = "medea::desired::hooks";
    /// A Job hook asks for what the server's hook policy refuses (a privileged container, a
    /// host namespace or path, a namespace the server does not list, an image without a
    /// digest; issue #49). Added by the server, which owns the policy, not by the files.
    pub const HOOK_POLICY: &str = "medea::desired::hook-policy";
    /// A setting that does nothing where it is written (a warning: `stageParallelism`
    /// without `stage: ahead`).
    pub const NO_EFFECT: &str = "medea::desired::no-effect";
}
