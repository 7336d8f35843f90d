//! Where an approval came from: a marker file or the API. Shared by verification (each
//! candidate carries its source) and the persisted [`super::record::ApprovalRecord`].

use serde::{Deserialize, Serialize};

/// Where an approval came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ApprovalSource {
    /// A marker file, by its path relative to the desired-state root (`approvals/...sig`).
    Marker {
        /// The marker's path relative to the desired-state root.
        path: String,
    },
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

impl ApprovalSource {
    /// The plan id prefix a marker's file name names: `approvals/<short-id>-<who>.sig`
    /// ([`super::sign::marker_file_name`]; any directory below `approvals/`), the leading
    /// 12 to 64 lowercase hex characters of the file name, followed by `-`. `None` for the
    /// API and for a file name that names no plan. Verification offers a marker the current
    /// plan and the plans its name names, never every stored plan (issue #32).
    pub fn named_plan(&self) -> Option<crate::plan::PlanIdRef> {
        let ApprovalSource::Marker { path } = self else {
            return None;
        };
        let name = path.rsplit('/').next().unwrap_or(path);
        let (hex, _) = name.split_once('-')?;
        if hex.len() < crate::plan::id::SHORT_LEN {
            return None;
        }
        crate::plan::PlanIdRef::parse(hex).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker(path: &str) -> ApprovalSource {
        ApprovalSource::Marker { path: path.into() }
    }

    #[test]
    fn a_marker_names_the_plan_its_file_name_starts_with() {
        let named = |p: &str| marker(p).named_plan().map(|r| r.as_str().to_string());
        assert_eq!(
            named("approvals/abababababab-alice@example.com.sig").as_deref(),
            Some("abababababab")
        );
        assert_eq!(
            named("approvals/team/0123456789abcdef-bob.sig").as_deref(),
            Some("0123456789abcdef")
        );
        // too short, not hex, upper case, no dash: names nothing
        assert_eq!(named("approvals/abab-alice.sig"), None);
        assert_eq!(named("approvals/zzzzzzzzzzzz-alice.sig"), None);
        assert_eq!(named("approvals/ABABABABABAB-alice.sig"), None);
        assert_eq!(named("approvals/abababababab.sig"), None);
        // the directory never names a plan, only the file name
        assert_eq!(named("approvals/abababababab-x/alice.sig"), None);
        assert_eq!(ApprovalSource::Api.named_plan(), None);
    }
}
