//! What a refresh saw that the planner's preflight checks read (issue #22): deprecated-API
//! usage, PodDisruptionBudgets, etcd, node conditions and credential lifetimes.
//!
//! These are observations like any other: they are part of [`super::ObservedCluster`], so a
//! change moves the cluster's generation and makes every plan computed before it stale.
//! Everything here is plain data in a stable order (sorted vectors, `BTreeMap`s) so equal
//! observations compare equal and encode to the same bytes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Everything the preflight checks read about one cluster. Empty when nothing was gathered
/// (old records, inventory files without the block): the checks then say what they could
/// not see rather than passing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PreflightObservations {
    /// Whether a refresh gathered this block at all (`false` on records written before #22).
    pub gathered: bool,
    /// Series of `apiserver_requested_deprecated_apis` with value 1, from every apiserver
    /// that answered, sorted.
    pub deprecated_api_requests: Vec<DeprecatedApiRequest>,
    /// Every apiserver `/metrics` endpoint medea tried, and how it answered.
    pub apiserver_metrics: Vec<MetricsSource>,
    /// Objects whose `metadata.managedFields[]` show a writer using a deprecated group-version.
    pub managed_fields: Vec<ManagedFieldsUse>,
    /// Alpha resources a later minor removes that still have objects (go-kubernetes
    /// `removedAPIResources`), one entry per resource with objects, sorted. Empty when the
    /// resource is not served (404) or has none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub removed_alpha_objects: Vec<AlphaObjects>,
    /// PodDisruptionBudgets with the pods they cover (name, node).
    pub pod_disruption_budgets: Vec<ObservedPdb>,
    /// etcd as the control-plane nodes report it; `None` when no node answered.
    pub etcd: Option<EtcdObservation>,
    /// Node conditions that are `True` and signal pressure (`MemoryPressure`, `DiskPressure`,
    /// `PIDPressure`), by node name.
    pub node_pressure: BTreeMap<String, Vec<String>>,
    /// Expiry of the credentials medea uses for this cluster.
    pub credentials: Vec<CredentialExpiry>,
    /// Sources that could not be read, with why (one line each): `managedFields`,
    /// `podDisruptionBudgets`, `credentials/talosconfig`, `credentials/kubeconfig`. The
    /// matching field is then empty because it was not seen, not because there is nothing.
    /// (`/metrics` and etcd failures are in [`Self::apiserver_metrics`] and
    /// [`EtcdObservation::unreachable`].)
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub gather_errors: BTreeMap<String, String>,
}

impl PreflightObservations {
    /// Nothing gathered (records and files from before preflight checks).
    pub fn is_empty(&self) -> bool {
        *self == PreflightObservations::default()
    }
}

/// One series of the kube-apiserver's `apiserver_requested_deprecated_apis` gauge.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeprecatedApiRequest {
    /// API group (`""` for the core group).
    pub group: String,
    pub version: String,
    pub resource: String,
    #[serde(default)]
    pub subresource: String,
    /// `removed_release` label, e.g. `1.32`; empty when the API has no planned removal.
    #[serde(default)]
    pub removed_release: String,
    /// The apiserver endpoint that reported the series.
    pub source: String,
}

/// One apiserver `/metrics` endpoint and how it answered.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetricsSource {
    /// `https://host:port`.
    pub endpoint: String,
    /// `None` when it answered; else why not (HTTP status, connection error), one line.
    pub error: Option<String>,
    /// `process_start_time_seconds` of the apiserver that answered (Unix seconds): its
    /// deprecated-API gauge counts requests since then only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<i64>,
}

/// Objects of one alpha resource that the target minor no longer serves.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlphaObjects {
    /// `clustercidrs.v1alpha1.networking.k8s.io`.
    pub resource: String,
    /// How many objects the list returned.
    pub count: u64,
    /// The first few (`namespace/name` or `name`), sorted.
    pub examples: Vec<String>,
}

/// An object whose managedFields show a writer using a deprecated group-version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedFieldsUse {
    /// `group/version` as written in the managedFields entry (`policy/v1beta1`).
    pub api_version: String,
    /// Resource (plural, lower case) of the object, e.g. `flowschemas`.
    pub resource: String,
    pub kind: String,
    #[serde(default)]
    pub namespace: String,
    pub name: String,
    /// The entry's `manager`.
    pub manager: String,
    /// The entry's `operation` (`Apply` or `Update`).
    pub operation: String,
}

/// A PodDisruptionBudget and the pods it selects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedPdb {
    pub namespace: String,
    pub name: String,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: i64,
    /// Pods the PDB covers, with the node each runs on (sorted). Gathered only while
    /// `disruptions_allowed` is 0 (pod names churn with every workload rollout; a change here
    /// makes earlier plans stale).
    pub pods: Vec<PdbPod>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PdbPod {
    pub name: String,
    /// Empty when the pod is not scheduled.
    pub node: String,
}

/// etcd as seen through Talos (`EtcdMemberList`, `EtcdStatus`, `EtcdAlarmList`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EtcdObservation {
    pub members: Vec<EtcdMemberObservation>,
    /// Active alarms (`NOSPACE`, `CORRUPT`), sorted.
    pub alarms: Vec<EtcdAlarmObservation>,
    /// Control-plane nodes that could not be asked, with why (one line each).
    pub unreachable: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMemberObservation {
    /// Member id in hex, as `etcdctl` prints it.
    pub id: String,
    pub name: String,
    pub learner: bool,
    /// Whether the member answered `EtcdStatus` without errors.
    pub healthy: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdAlarmObservation {
    /// Member id in hex.
    pub member: String,
    /// `NOSPACE` or `CORRUPT`.
    pub alarm: String,
}

/// When one of medea's credentials for the cluster stops working.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialExpiry {
    /// What it is: `talosconfig client certificate`, `kubeconfig client certificate`, `kubeconfig token`.
    pub credential: String,
    /// RFC 3339 UTC `notAfter`.
    pub not_after: String,
}
