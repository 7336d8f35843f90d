//! Health gates (issue #23) as a plan carries them: the resolved gates, soak and failure
//! policy of a cluster and of each pool. The executor gates on these (what was approved),
//! never on the live desired state. Pure data.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where gates are evaluated. URLs and file paths are not secrets; the token file's
/// contents are read only by the probe at the edge and never recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthSources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<Endpoint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alertmanager: Option<Endpoint>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<String>,
}

/// The effective health policy of a cluster or a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthPolicy {
    pub sources: HealthSources,
    pub gates: Vec<Gate>,
    /// After each wave (and pool, and the job): every gate passes continuously this long.
    #[serde(with = "crate::duration::serde_lenient")]
    pub soak: Duration,
    /// How often gates are evaluated.
    #[serde(with = "crate::duration::serde_lenient")]
    pub interval: Duration,
    /// Consecutive failed evaluations before a gate fails.
    pub failure_limit: u32,
    pub on_failure: OnFailure,
}

/// One named gate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gate {
    pub name: String,
    pub check: GateCheck,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GateCheck {
    /// A PromQL instant query (`/api/v1/query`).
    Query { query: String },
    /// Alertmanager `/api/v2/alerts` (active, not silenced or inhibited).
    Alerts {
        matchers: Vec<String>,
        ignore: Vec<String>,
    },
    /// Deployments/StatefulSets/DaemonSets updated and available.
    Workloads {
        namespaces: Vec<String>,
        kinds: Vec<WorkloadKind>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    DaemonSet,
}

/// What a failed gate does to the wave that broke it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OnFailure {
    /// Halt before touching another node.
    #[default]
    Halt,
    /// Roll the failing wave's nodes back (Talos `MachineService.Rollback`), then halt.
    /// Talos steps only: Kubernetes steps never roll back.
    Rollback,
}
