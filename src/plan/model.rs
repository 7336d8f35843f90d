//! What a plan says: immutable, bound to its basis, ordered into steps.
//!
//! These types are the contract between the planner (which builds them), the approval layer
//! (which signs `Plan::id`), the store (which keeps them) and the rollout executor (which turns
//! an approved plan's steps into jobs).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::id::PlanId;
use crate::desired::Revision;
use crate::inventory::MachineRole;
use crate::version::{KubeVersion, TalosVersion};

/// What a plan was computed from. A plan whose basis differs from the store's current basis
/// is stale and can never be approved or started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Basis {
    /// Content revision of the desired state (commit sha recorded alongside in git mode).
    pub desired: Revision,
    /// Observed generation of every cluster the desired state names (absent = never observed).
    pub observed: BTreeMap<String, u64>,
}

/// One machine of a Talos rollout wave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineTarget {
    pub node: String,
    pub id: String,
    pub address: String,
    /// The version the machine runs before this hop.
    pub from: TalosVersion,
}

/// Talos OS rollout of one pool, one hop (one minor line) of its upgrade path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TalosRollout {
    pub pool: String,
    pub role: MachineRole,
    /// 1-based hop number and total hops of this pool's path.
    pub hop: u32,
    pub hops: u32,
    pub to: TalosVersion,
    /// Installer image reference with tag, e.g. `factory.talos.dev/installer/<id>:v1.13.9`.
    pub image: String,
    pub max_unavailable: u32,
    #[serde(with = "secs")]
    pub drain_timeout: Duration,
    #[serde(with = "secs")]
    pub health_timeout: Duration,
    /// Machines in order, grouped into waves that may be away together.
    pub waves: Vec<Vec<MachineTarget>>,
}

/// Kubernetes rollout of a whole cluster (the upgrade-k8s sequence).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeRollout {
    pub from: KubeVersion,
    pub to: KubeVersion,
    /// Control-plane node names, in order (one at a time).
    pub control_plane: Vec<String>,
    /// Worker node names, in order (kubelet upgrades).
    pub workers: Vec<String>,
    #[serde(with = "secs")]
    pub health_timeout: Duration,
}

/// One step of a cluster's plan. Steps run strictly one after another, so a Talos rollout and
/// a Kubernetes rollout of one cluster are never in the same wave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum Step {
    Talos(TalosRollout),
    Kubernetes(KubeRollout),
}

impl Step {
    pub fn touches_control_plane(&self) -> bool {
        match self {
            Step::Talos(t) => t.role == MachineRole::Controlplane,
            Step::Kubernetes(_) => true,
        }
    }
}

/// An inert change: applied to the store on approval, acts on nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SettingsChange {
    /// `cluster` or `pool <name>`.
    pub resource: String,
    /// Dotted field path, e.g. `rollout.drainTimeout`.
    pub field: String,
    pub from: String,
    pub to: String,
}

/// Everything the plan does to one cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPlan {
    pub cluster: String,
    /// In execution order.
    pub steps: Vec<Step>,
    pub settings: Vec<SettingsChange>,
    /// Pools with nothing to do.
    pub unchanged: Vec<String>,
}

/// An immutable plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// sha256 over the canonical encoding of `basis` and `clusters` (not `parent`).
    pub id: PlanId,
    /// The plan that was current before this one, if any.
    pub parent: Option<PlanId>,
    pub basis: Basis,
    /// Clusters by name order.
    pub clusters: Vec<ClusterPlan>,
    /// Distinct signers needed: the highest requirement of any changed cluster, counting the
    /// settings in force before this plan when the plan changes them.
    pub approvals_required: u32,
}

impl Plan {
    pub fn has_changes(&self) -> bool {
        self.clusters
            .iter()
            .any(|c| !c.steps.is_empty() || !c.settings.is_empty())
    }
}

mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_secs(u64::deserialize(d)?))
    }
}
