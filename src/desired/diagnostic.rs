//! Diagnostics: every problem found in the desired state, with file, line, column and span.
//!
//! Plain data here; the CLI turns them into miette reports with source snippets.

use serde::Serialize;

use super::model::Origin;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Stable code, e.g. `medea::desired::unknown-field`.
    pub code: &'static str,
    pub message: String,
    /// What the span points at, shown under the snippet.
    pub label: String,
    pub origin: Origin,
    pub help: Option<String>,
}

impl Diagnostic {
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
    pub fn warning(code: &'static str, origin: Origin, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, origin, message)
        }
    }
    pub fn with_help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }
    pub fn with_label(mut self, label: impl Into<String>) -> Diagnostic {
        self.label = label.into();
        self
    }
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
    pub const SYNTAX: &str = "medea::desired::syntax";
    pub const UNKNOWN_FIELD: &str = "medea::desired::unknown-field";
    pub const INVALID_VALUE: &str = "medea::desired::invalid-value";
    pub const API_VERSION: &str = "medea::desired::api-version";
    pub const KIND: &str = "medea::desired::kind";
    pub const NAME: &str = "medea::desired::name";
    pub const DUPLICATE: &str = "medea::desired::duplicate";
    pub const MISSING_CLUSTER: &str = "medea::desired::missing-cluster";
    pub const MISSING_POOL: &str = "medea::desired::missing-pool";
    pub const MACHINE_TWICE: &str = "medea::desired::machine-in-two-pools";
    pub const CONTROL_PLANE_UNAVAILABLE: &str = "medea::desired::controlplane-max-unavailable";
    pub const VERSION: &str = "medea::desired::version";
    pub const DURATION: &str = "medea::desired::duration";
    pub const IMAGE: &str = "medea::desired::installer-image";
    pub const WINDOW: &str = "medea::desired::window";
    pub const APPROVALS: &str = "medea::desired::approvals";
    pub const ORDER: &str = "medea::desired::order";
    pub const EMPTY_POOL: &str = "medea::desired::empty-pool";
    pub const FILE: &str = "medea::desired::file";
    pub const SYMLINK: &str = "medea::desired::symlink";
    pub const LIMIT: &str = "medea::desired::limit";
    pub const HEALTH: &str = "medea::desired::health";
    pub const PROMOTION: &str = "medea::desired::promotion";
    pub const ACKNOWLEDGE: &str = "medea::desired::acknowledge";
}
