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

impl HealthSources {
    /// The sources a validated `health` block names (gated or not).
    pub fn of(s: &crate::desired::health::HealthSettings) -> HealthSources {
        let endpoint = |e: &crate::desired::health::HealthEndpoint| Endpoint {
            url: e.url.clone(),
            ca_file: e.ca_file.clone(),
            bearer_token_file: e.bearer_token_file.clone(),
        };
        HealthSources {
            prometheus: s.prometheus.as_ref().map(endpoint),
            alertmanager: s.alertmanager.as_ref().map(endpoint),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.prometheus.is_none() && self.alertmanager.is_none()
    }
}

impl HealthPolicy {
    /// The policy a plan carries for validated settings; `None` when nothing is gated.
    pub fn of(s: &crate::desired::health::HealthSettings) -> Option<HealthPolicy> {
        use crate::desired::health as d;
        if !s.is_gated() {
            return None;
        }
        Some(HealthPolicy {
            sources: HealthSources::of(s),
            gates: s
                .gates
                .iter()
                .map(|g| Gate {
                    name: g.name.clone(),
                    check: match &g.check {
                        d::HealthCheck::Query { query } => GateCheck::Query {
                            query: query.clone(),
                        },
                        d::HealthCheck::Alerts { matchers, ignore } => GateCheck::Alerts {
                            matchers: matchers.clone(),
                            ignore: ignore.clone(),
                        },
                        d::HealthCheck::Workloads { namespaces, kinds } => GateCheck::Workloads {
                            namespaces: namespaces.clone(),
                            kinds: kinds
                                .iter()
                                .map(|k| match k {
                                    d::WorkloadKind::Deployment => WorkloadKind::Deployment,
                                    d::WorkloadKind::StatefulSet => WorkloadKind::StatefulSet,
                                    d::WorkloadKind::DaemonSet => WorkloadKind::DaemonSet,
                                })
                                .collect(),
                        },
                    },
                })
                .collect(),
            soak: s.soak,
            interval: s.interval,
            failure_limit: s.failure_limit,
            on_failure: match s.on_failure {
                d::OnFailure::Halt => OnFailure::Halt,
                d::OnFailure::Rollback => OnFailure::Rollback,
            },
        })
    }
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
