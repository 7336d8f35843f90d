//! Where an approval came from: a marker file or the API. Shared by verification (each
//! candidate carries its source) and the persisted [`super::record::ApprovalRecord`].

use serde::{Deserialize, Serialize};

/// Where an approval came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ApprovalSource {
    /// A marker file, by its path relative to the desired-state root (`approvals/...sig`).
    Marker { path: String },
    /// Submitted over the API (`medea approve` without `--write-marker`).
    Api,
}

impl std::fmt::Display for ApprovalSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApprovalSource::Marker { path } => write!(f, "marker {path}"),
            ApprovalSource::Api => f.write_str("api"),
        }
    }
}
