//! Preflight findings (issue #22): what would break if the plan ran, computed from the
//! observations (`inventory::preflight`) and the plan's own steps. Pure: no I/O, no clock
//! (the time of the observation is an input).

use serde::{Deserialize, Serialize};

/// How much a finding weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The plan cannot be approved unless the Cluster acknowledges the finding's id.
    Blocking,
    Warning,
}

/// One preflight finding in a cluster's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// Stable across runs for the same fact (`removed-api/flowcontrol.apiserver.k8s.io/v1beta3/flowschemas`).
    pub id: String,
    /// Which check found it (`removed-api`, `pdb`, `etcd`, `node`, `credentials`, `promotion`).
    pub check: String,
    pub severity: Severity,
    pub message: String,
    /// What was seen, and where (one line each).
    pub evidence: Vec<String>,
    /// What to do about it.
    pub help: String,
    /// Listed in the Cluster's `spec.preflight.acknowledge`.
    pub acknowledged: bool,
}

impl Finding {
    /// Blocking and not acknowledged: the plan cannot be approved.
    pub fn blocks(&self) -> bool {
        self.severity == Severity::Blocking && !self.acknowledged
    }
}
