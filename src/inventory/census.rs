//! A census of a cluster's workloads (issue #36 item 4): what a rehearsal needs to build a
//! simulated twin of the cluster and drain it the way the real one drains. Pods per node with
//! their owner kind, labels and the kinds of volumes they mount, the PodDisruptionBudgets and
//! what they allow, the DaemonSets, and the CSI volume attachments per node.
//!
//! The census is advice, like the prediction: it is **not** part of [`super::ObservedCluster`]
//! (pods churn with every workload rollout; a census in the observation would make every plan
//! stale on every refresh) and never part of a plan id. It is stored beside the cluster
//! record, under [`census_key`], and read by `medea plan --rehearse`.
//!
//! It holds no pod specs and no secrets: names, owner kinds, labels and volume *kinds* only
//! (never a volume's source, a Secret or ConfigMap name, an env var or an image). Its size is
//! bounded by [`MAX_PODS`], [`MAX_LABELS`] and [`MAX_PDB_PODS`]; what a bound cut is said in
//! [`Census::truncated`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::store::{Record, Table};

/// The most pods a census keeps; the rest are counted in [`Census::truncated`].
pub const MAX_PODS: usize = 20_000;
/// The most labels kept per pod (in key order).
pub const MAX_LABELS: usize = 16;
/// The most member pods kept per PodDisruptionBudget.
pub const MAX_PDB_PODS: usize = 1_000;

/// Where a cluster's census is stored (beside [`super::cluster_key`]).
pub fn census_key(cluster: &str) -> String {
    format!("census/{cluster}")
}

/// The workloads of one cluster as one refresh saw them. Every list is sorted, so equal
/// censuses encode to equal bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Census {
    /// When it was gathered (RFC 3339 UTC). Not compared by rehearsals.
    pub gathered_at: String,
    /// Every pod (up to [`MAX_PODS`]), sorted by node, namespace, name.
    pub pods: Vec<CensusPod>,
    /// Every PodDisruptionBudget, sorted by namespace, name.
    pub pdbs: Vec<CensusPdb>,
    /// Every DaemonSet (`namespace/name`), sorted.
    pub daemonsets: Vec<String>,
    /// CSI volume attachments per node (`VolumeAttachment`s with `status.attached`), by
    /// node name: the persistent volume names, sorted.
    pub attachments: BTreeMap<String, Vec<String>>,
    /// What a bound cut, one line each (`pods: 23112 seen, 20000 kept`); empty when the census
    /// is complete.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub truncated: Vec<String>,
    /// Sources that could not be read, with why (one line each): `pods`,
    /// `podDisruptionBudgets`, `daemonSets`, `volumeAttachments`. The matching field is then
    /// empty because it was not seen, not because there is nothing.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub gather_errors: BTreeMap<String, String>,
}

/// Stored in the inventory table under [`census_key`], its own record: writing it never
/// touches the cluster record (nor its generation).
impl Record for Census {
    const TABLE: Table = Table::Inventory;
    const KIND: &'static str = "census";
    const SCHEMA: u32 = 1;
}

impl Census {
    /// The pods scheduled on `node`.
    pub fn pods_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a CensusPod> + 'a {
        self.pods.iter().filter(move |p| p.node == node)
    }
}

/// One pod: who owns it, where it runs, what kinds of volumes it mounts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CensusPod {
    /// The node it is scheduled on; empty when it is not scheduled.
    pub node: String,
    pub namespace: String,
    pub name: String,
    /// Its controller owner reference; `None` for a bare pod (one `kubectl drain` calls
    /// unmanaged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// A static pod's mirror (`kubernetes.io/config.mirror`): drains skip it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mirror: bool,
    /// `status.phase`: `Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`.
    pub phase: String,
    /// `metadata.labels` (at most [`MAX_LABELS`], in key order): drain policies and PDBs
    /// select by them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The kinds of volumes it mounts, counted.
    #[serde(default)]
    pub volumes: VolumeKinds,
}

/// A controller owner reference.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    /// `ReplicaSet`, `StatefulSet`, `DaemonSet`, `Job`, `ReplicationController`, or any
    /// other kind as the reference names it.
    pub kind: String,
    pub name: String,
}

/// How many volumes of each kind a pod mounts. Sources (paths, claim names of Secrets) are
/// never kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VolumeKinds {
    /// `emptyDir` volumes (drains refuse them unless `deleteEmptyDirData`).
    pub empty_dir: u32,
    /// `hostPath` volumes.
    pub host_path: u32,
    /// `persistentVolumeClaim` volumes (local or CSI: see [`Census::attachments`]).
    pub persistent_volume_claim: u32,
    /// Inline `csi` volumes.
    pub csi: u32,
}

/// A PodDisruptionBudget and the pods it covers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CensusPdb {
    pub namespace: String,
    pub name: String,
    /// `spec.minAvailable` as written (`2`, `50%`), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<String>,
    /// `spec.maxUnavailable` as written, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<String>,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: i64,
    /// `status.expectedPods`.
    pub expected_pods: i64,
    /// The names of the pods it selects (its namespace), at most [`MAX_PDB_PODS`], sorted;
    /// empty when the pods could not be listed (`pods` in [`Census::gather_errors`]).
    pub pods: Vec<String>,
}
