//! The Kubernetes adapter: cordon, PDB-aware drain, readiness and server-side apply against
//! a cluster's kube-apiserver, as an outward client (kube-rs over rustls).
//!
//! **Owns:** loading a cluster's kubeconfig, the [`KubeApi`] port the executor drives, the
//! drain policy (what is evicted, skipped or refused; backoff; timeouts) and the conversion
//! from k8s-openapi wire types into medea's domain types below, and running a blocking hook's
//! Kubernetes Job to its end ([`hook_job`], issue #35: created once under a stable name, waited
//! for, its exit code and bounded log tail read).
//! **May depend on:** the `k8s` row of design/architecture.md's code map (the one list, checked
//! by `tests/it/architecture.rs`); kube-rs and k8s-openapi types stay inside this module.
//!
//! Architecture Invariant: drain **never deletes and never forces**. It only uses the
//! policy/v1 Eviction subresource; a PodDisruptionBudget refusal (429) is retried with
//! backoff until the drain timeout, and then the drain fails naming the blocking PDB. There
//! is no code path in this module that sends `DELETE` for a pod.
//!
//! Architecture Invariant: no k8s-openapi or kube-rs type appears in [`KubeApi`] or in the
//! domain types; they are converted at the edge, in `client.rs`.
//!
//! Architecture Invariant: kubeconfig contents and tokens are never logged or formatted
//! into errors (parse errors carry only a location).
//!
//! Drain policy (see `design/k8s.md`):
//! - mirror (static) pods and DaemonSet-owned pods are skipped, like
//!   `kubectl drain --ignore-daemonsets`;
//! - pods with `emptyDir` volumes are refused unless the policy's `delete_empty_dir_data`
//!   ([`DrainOptions::policy`]: the pool's opt-in, kubectl's `--delete-emptydir-data`); the
//!   refusal names every such pod and happens before any eviction;
//! - pods without a controller are refused unless its `evict_unmanaged_pods` (they would not
//!   come back); same up-front refusal;
//! - completed pods (Succeeded/Failed) are evicted like the others (the apiserver lets them
//!   go regardless of PDBs);
//! - pods already terminating are not evicted again; drain waits for them too.

pub mod adapter;
pub mod bootstrap;
pub mod census;
mod client;
pub(crate) mod drain;
pub mod hook_job;
pub mod kstatus;
pub mod kubeconfig;
pub mod observe;
pub mod selector;
pub mod workloads;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use crate::desired::model::DrainPolicy;
use crate::version::{KubeVersion, VersionError};

pub use client::{
    AccessCheck, ClientOptions, KubeClient, ManifestSyncOptions, RetryPolicy, ServerInfo,
};
pub use observe::{
    AlphaList, DeprecatedSeries, FieldWriter, ObjectWriters, PdbCoverage, ServedResource,
};

/// The label that marks a control-plane node (Talos and kubeadm set it).
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// One `status.addresses` entry of a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddress {
    /// `InternalIP`, `ExternalIP`, `Hostname`, ...
    pub kind: String,
    pub address: String,
}

/// A Kubernetes Node as medea's inventory sees it (discovery of a cluster's machines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub name: String,
    /// `status.addresses`, in the order the kubelet reports them.
    pub addresses: Vec<NodeAddress>,
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations` (Talos puts system extensions there whose versions are no valid
    /// label value, and the Image Factory schematic: `extensions.talos.dev/schematic`).
    pub annotations: BTreeMap<String, String>,
    /// Has the [`CONTROL_PLANE_LABEL`] label.
    pub control_plane: bool,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// Pressure conditions that are `True` (`DiskPressure`, `MemoryPressure`, `PIDPressure`), sorted.
    pub pressure: Vec<String>,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// `spec.taints`, in the node's order.
    pub taints: Vec<NodeTaintSpec>,
    /// `status.nodeInfo.kubeletVersion`, when it parses (see `kubelet_version_raw`).
    pub kubelet_version: Option<KubeVersion>,
    pub kubelet_version_raw: String,
    /// `status.nodeInfo.bootID` (the kernel's boot id, as Talos reports it too).
    pub boot_id: String,
    /// `status.nodeInfo.machineID`.
    pub machine_id: String,
    /// `status.nodeInfo.osImage`, e.g. `Talos (v1.12.11)`.
    pub os_image: String,
}

impl ClusterNode {
    /// The first `InternalIP` address: where Talos' apid routes `node` targets.
    pub fn internal_ip(&self) -> Option<&str> {
        self.addresses
            .iter()
            .find(|a| a.kind == "InternalIP")
            .map(|a| a.address.as_str())
    }
}

/// A pod, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How a drain behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainOptions {
    /// The whole drain (evicting and waiting for pods to go) must finish within this.
    pub timeout: Duration,
    /// Which pods the drain evicts, refuses or leaves (the pool's `drain:`, the one type from
    /// the desired state to here): `emptyDir` pods unless `delete_empty_dir_data`, bare pods
    /// unless `evict_unmanaged_pods`; pods carrying all `skip_pods` labels stay on the node
    /// (not evicted, not waited for). Default: [`DrainPolicy::legacy`], refuse both, skip none.
    pub policy: DrainPolicy,
    /// First wait after a refused (429) or failed eviction round; doubles up to `max_backoff`.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// How often to check that evicted pods are gone.
    pub poll_interval: Duration,
}

impl Default for DrainOptions {
    fn default() -> Self {
        DrainOptions {
            timeout: Duration::from_secs(600),
            policy: DrainPolicy::legacy(),
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
        }
    }
}

/// Why a pod was left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SkipReason {
    /// A mirror pod: the kubelet runs the static pod regardless of the API.
    Mirror,
    /// Owned by a DaemonSet, which would recreate it on the same node.
    DaemonSet,
    /// Matched by the drain's `skipPods` selector.
    Selected,
}

/// The outcome of a successful drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainReport {
    pub node: String,
    /// Pods evicted and confirmed gone (plus pods that were already terminating).
    pub evicted: Vec<PodRef>,
    pub skipped: Vec<(PodRef, SkipReason)>,
    /// How many eviction attempts a PodDisruptionBudget refused along the way.
    pub pdb_refusals: u32,
}

/// What medea checks before and after touching a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReadiness {
    /// The Node `Ready` condition is `True`.
    pub ready: bool,
    /// `status.nodeInfo.kubeletVersion`.
    pub kubelet_version: KubeVersion,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// The Ready condition's reason and message when not ready, for operators.
    pub not_ready_reason: Option<String>,
    /// `spec.taints`, in the node's order.
    pub taints: Vec<NodeTaintSpec>,
    /// `metadata.annotations` (who cordoned the node: `medea.dev/cordoned-by`,
    /// `talos.dev/client-cordoned`).
    pub annotations: BTreeMap<String, String>,
}

/// One of a Node's `spec.taints`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTaintSpec {
    pub key: String,
    /// Empty when the taint has none.
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// The control-plane components Talos runs as static pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ControlPlaneComponent {
    ApiServer,
    ControllerManager,
    Scheduler,
}

impl ControlPlaneComponent {
    pub const ALL: [ControlPlaneComponent; 3] = [
        ControlPlaneComponent::ApiServer,
        ControlPlaneComponent::ControllerManager,
        ControlPlaneComponent::Scheduler,
    ];

    /// `kube-apiserver`, `kube-controller-manager`, `kube-scheduler` (the container name and
    /// the pods' `k8s-app` label).
    pub fn name(self) -> &'static str {
        match self {
            ControlPlaneComponent::ApiServer => "kube-apiserver",
            ControlPlaneComponent::ControllerManager => "kube-controller-manager",
            ControlPlaneComponent::Scheduler => "kube-scheduler",
        }
    }
}

impl fmt::Display for ControlPlaneComponent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One control-plane static pod as the API shows it (its mirror pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPodStatus {
    pub component: ControlPlaneComponent,
    pub pod: PodRef,
    /// `status.phase == Running`.
    pub running: bool,
    /// The pod `Ready` condition is `True`.
    pub ready: bool,
    /// The component container's image.
    pub image: String,
    /// The `talos.dev/config-version` annotation Talos rendered the static pod with, if any.
    pub config_version: Option<String>,
}

/// Something wrong with a node's control-plane static pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlPlaneProblem {
    Missing {
        component: ControlPlaneComponent,
    },
    NotRunning {
        component: ControlPlaneComponent,
    },
    NotReady {
        component: ControlPlaneComponent,
    },
    WrongImage {
        component: ControlPlaneComponent,
        expected: String,
        found: String,
    },
}

impl fmt::Display for ControlPlaneProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlPlaneProblem::Missing { component } => {
                write!(f, "{component} has no static pod")
            }
            ControlPlaneProblem::NotRunning { component } => {
                write!(f, "{component} is not Running")
            }
            ControlPlaneProblem::NotReady { component } => write!(f, "{component} is not Ready"),
            ControlPlaneProblem::WrongImage {
                component,
                expected,
                found,
            } => {
                write!(f, "{component} runs `{found}`, expected `{expected}`")
            }
        }
    }
}

/// Check a node's static pods against the expected image per component (pure).
/// Components without an expectation only need to be Running and Ready.
pub fn check_control_plane(
    pods: &[StaticPodStatus],
    expected: &[(ControlPlaneComponent, String)],
) -> Vec<ControlPlaneProblem> {
    let mut problems = Vec::new();
    for component in ControlPlaneComponent::ALL {
        let Some(pod) = pods.iter().find(|p| p.component == component) else {
            problems.push(ControlPlaneProblem::Missing { component });
            continue;
        };
        if !pod.running {
            problems.push(ControlPlaneProblem::NotRunning { component });
        } else if !pod.ready {
            problems.push(ControlPlaneProblem::NotReady { component });
        }
        if let Some((_, want)) = expected.iter().find(|(c, _)| *c == component)
            && *want != pod.image
        {
            problems.push(ControlPlaneProblem::WrongImage {
                component,
                expected: want.clone(),
                found: pod.image.clone(),
            });
        }
    }
    problems
}

/// One Kubernetes object to apply, validated to have `apiVersion`, `kind` and a name.
#[derive(Clone, PartialEq)]
pub struct Manifest {
    value: serde_json::Value,
}

impl fmt::Debug for Manifest {
    // Manifests can be Secrets: show identity only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Manifest({})", self.describe())
    }
}

impl Manifest {
    /// Validate a JSON object as a manifest; `index` is its position, for errors.
    pub fn from_value(value: serde_json::Value, index: usize) -> Result<Manifest, K8sError> {
        let invalid = |reason: &str| K8sError::ManifestInvalid {
            index,
            reason: reason.to_string(),
        };
        if !value.is_object() {
            return Err(invalid("it is not a mapping"));
        }
        let has = |pointer: &str| {
            value
                .pointer(pointer)
                .and_then(|v| v.as_str())
                .is_some_and(|s| !s.is_empty())
        };
        if !has("/apiVersion") {
            return Err(invalid("`apiVersion` is missing"));
        }
        if !has("/kind") {
            return Err(invalid("`kind` is missing"));
        }
        if !has("/metadata/name") {
            return Err(invalid("`metadata.name` is missing"));
        }
        Ok(Manifest { value })
    }

    /// Parse a multi-document YAML stream; empty documents are skipped.
    pub fn parse_yaml(text: &str) -> Result<Vec<Manifest>, K8sError> {
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(text).map_err(|e| {
            // The error text could quote a Secret's data: keep only the location.
            let loc = e.location();
            K8sError::ManifestParse {
                line: loc.map(|l| l.line()),
                column: loc.map(|l| l.column()),
            }
        })?;
        docs.into_iter()
            .filter(|d| !d.is_null())
            .enumerate()
            .map(|(i, d)| Manifest::from_value(d, i))
            .collect()
    }

    pub fn api_version(&self) -> &str {
        self.value["apiVersion"].as_str().unwrap_or_default()
    }

    pub fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.value
            .pointer("/metadata/name")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
    }

    pub fn namespace(&self) -> Option<&str> {
        self.value
            .pointer("/metadata/namespace")
            .and_then(|v| v.as_str())
    }

    pub(crate) fn value(&self) -> &serde_json::Value {
        &self.value
    }

    /// `apps/v1 DaemonSet kube-system/kube-proxy`.
    pub fn describe(&self) -> String {
        match self.namespace() {
            Some(ns) => format!(
                "{} {} {ns}/{}",
                self.api_version(),
                self.kind(),
                self.name()
            ),
            None => format!("{} {} {}", self.api_version(), self.kind(), self.name()),
        }
    }
}

/// How manifests are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyOptions {
    /// The server-side apply field manager (`medea`).
    pub field_manager: String,
    /// Take ownership of fields another manager owns (SSA `force=true`).
    pub force_conflicts: bool,
    /// Ask the server to validate and compute without persisting (`dryRun=All`).
    pub dry_run: bool,
}

impl Default for ApplyOptions {
    fn default() -> Self {
        ApplyOptions {
            field_manager: "medea".into(),
            force_conflicts: false,
            dry_run: false,
        }
    }
}

/// An object as the server stored it after an apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedObject {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub generation: Option<i64>,
}

/// The port the rollout executor uses to act on Kubernetes. Implemented by [`KubeClient`];
/// tests can fake it. Node names are Kubernetes node names.
pub trait KubeApi: Send + Sync {
    /// Mark the node unschedulable. Idempotent.
    fn cordon(&self, node: &str) -> impl Future<Output = Result<(), K8sError>> + Send;

    /// Mark the node schedulable again. Idempotent.
    fn uncordon(&self, node: &str) -> impl Future<Output = Result<(), K8sError>> + Send;

    /// Cordon, then evict every pod of the node per the drain policy and wait until they are
    /// gone. Never deletes, never forces.
    fn drain(
        &self,
        node: &str,
        options: &DrainOptions,
    ) -> impl Future<Output = Result<DrainReport, K8sError>> + Send;

    /// Every Node of the cluster, sorted by name.
    fn nodes(&self) -> impl Future<Output = Result<Vec<ClusterNode>, K8sError>> + Send;

    /// The node's Ready condition, kubelet version and cordon state.
    fn node_readiness(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<NodeReadiness, K8sError>> + Send;

    /// The node's control-plane static pods (kube-apiserver, -controller-manager,
    /// -scheduler) as their mirror pods show them; see [`check_control_plane`].
    fn control_plane_pods(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<Vec<StaticPodStatus>, K8sError>> + Send;

    /// Server-side apply each manifest in order; stops at the first failure.
    fn apply(
        &self,
        manifests: &[Manifest],
        options: &ApplyOptions,
    ) -> impl Future<Output = Result<Vec<AppliedObject>, K8sError>> + Send;

    /// The kubeconfig's apiserver URL (`https://host:port`).
    fn server_url(&self) -> String;

    /// Every kube-apiserver's `(address, port)` as the cluster publishes them (the
    /// `kubernetes` EndpointSlices of `default`, kept by the apiservers themselves), sorted.
    fn published_apiservers(
        &self,
    ) -> impl Future<Output = Result<Vec<(String, u16)>, K8sError>> + Send;

    /// `GET /metrics` (Prometheus text) of the kube-apiserver at `server` (`https://host:port`,
    /// same credentials and CA), or of the kubeconfig's server when `None`. One attempt.
    fn apiserver_metrics(
        &self,
        server: Option<&str>,
    ) -> impl Future<Output = Result<String, K8sError>> + Send;

    /// Every served API group (not the core group) and its preferred version (`GET /apis`).
    fn preferred_versions(
        &self,
    ) -> impl Future<Output = Result<BTreeMap<String, String>, K8sError>> + Send;

    /// The resources of `group/version` (`GET /apis/<group>/<version>`), subresources left out.
    fn served_resources(
        &self,
        group: &str,
        version: &str,
    ) -> impl Future<Output = Result<Vec<ServedResource>, K8sError>> + Send;

    /// Every object of a resource with its `managedFields`, through a metadata-only list
    /// (`PartialObjectMetadataList`), paged.
    fn object_writers(
        &self,
        group: &str,
        version: &str,
        resource: &ServedResource,
    ) -> impl Future<Output = Result<Vec<ObjectWriters>, K8sError>> + Send;

    /// The objects of `group/version/plural` across all namespaces (`namespace/name` or
    /// `name`, sorted), through a plain list as go-kubernetes' upgrade check does; `None` when
    /// the apiserver does not serve the resource (404).
    fn list_names(
        &self,
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
    ) -> impl Future<Output = Result<Option<AlphaList>, K8sError>> + Send;

    /// Every PodDisruptionBudget with the pods it selects and their nodes (one list of PDBs,
    /// one of pods), sorted.
    fn disruption_budgets(&self)
    -> impl Future<Output = Result<Vec<PdbCoverage>, K8sError>> + Send;

    /// What the workload census reads (issue #36 item 4): every pod, PodDisruptionBudget (with
    /// its member pods), DaemonSet and VolumeAttachment across all namespaces, each list paged
    /// `page_size` objects at a time. Never fails as a whole: each source carries its own
    /// result, so one the credentials may not list does not lose the others.
    fn workloads(&self, page_size: u32) -> impl Future<Output = census::WorkloadLists> + Send;
}

fn pdb_text(pdb: &Option<String>) -> String {
    match pdb {
        Some(name) => format!("PodDisruptionBudget `{name}`"),
        None => "a PodDisruptionBudget the adapter could not identify".to_string(),
    }
}

fn pods_text(pods: &[PodRef]) -> String {
    pods.iter()
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Everything that can go wrong in the Kubernetes adapter.
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    #[error("failed to read kubeconfig `{path}`")]
    KubeconfigRead {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("kubeconfig `{path}` is not valid YAML/kubeconfig{}", location_text(*line, *column))]
    KubeconfigParse {
        path: PathBuf,
        line: Option<u64>,
        column: Option<u64>,
    },
    #[error(
        "kubeconfig `{path}` cannot be used (check its current-context, cluster and user entries)"
    )]
    KubeconfigInvalid {
        path: PathBuf,
        #[source]
        err: Box<::kube::config::KubeconfigError>,
    },
    #[error("failed to build a Kubernetes client for `{cluster_url}`")]
    ClientBuild {
        cluster_url: String,
        #[source]
        err: Box<::kube::Error>,
    },
    #[error("Kubernetes API call failed: {op} `{target}`")]
    Api {
        op: &'static str,
        target: String,
        #[source]
        err: Box<::kube::Error>,
    },
    #[error("`{url}` is not a usable apiserver URL")]
    ServerUrl { url: String },
    #[error("the hook's Job `{job}` is not a valid batch/v1 Job (its podSpec?)")]
    HookJobSpec {
        job: String,
        #[source]
        err: serde_json::Error,
    },
    #[error("node `{node}` does not exist in the cluster (check the Kubernetes node name)")]
    NodeNotFound { node: String },
    #[error("node `{node}` reports kubelet version `{raw}`, which medea cannot parse")]
    KubeletVersion {
        node: String,
        raw: String,
        #[source]
        err: VersionError,
    },
    #[error(
        "refusing to drain node `{node}`: pods {} use emptyDir (node-local) storage that eviction would delete; set `drain.deleteEmptyDirData: true` (the default) on the Cluster or NodePool to evict them, list them under `drain.skipPods`, or move them first",
        pods_text(pods)
    )]
    DrainLocalStorage { node: String, pods: Vec<PodRef> },
    #[error(
        "refusing to drain node `{node}`: pods {} have no controller and would not come back; set `drain.evictUnmanagedPods: true` on the Cluster or NodePool to evict them, list them under `drain.skipPods`, or delete them yourself",
        pods_text(pods)
    )]
    DrainUnmanaged { node: String, pods: Vec<PodRef> },
    #[error(
        "drain of node `{node}` timed out after {waited:?}: evicting pod `{pod}` is blocked by {} ({blocked} pod(s) still blocked, {evicted} evicted; nothing was deleted)",
        pdb_text(pdb)
    )]
    DrainBlocked {
        node: String,
        pod: PodRef,
        pdb: Option<String>,
        blocked: u32,
        evicted: u32,
        waited: Duration,
    },
    /// An eviction answered with an error kubectl does not retry (anything but a 429): the
    /// drain stops at once, nothing was deleted.
    #[error(
        "drain of node `{node}` stopped: evicting pod `{pod}` failed ({evicted} pod(s) evicted before it; nothing was deleted)"
    )]
    EvictionFailed {
        node: String,
        pod: PodRef,
        evicted: u32,
        #[source]
        source: Box<K8sError>,
    },
    #[error(
        "drain of node `{node}` timed out after {waited:?} waiting for evicted pods to terminate: {}",
        pods_text(pods)
    )]
    DrainTimeout {
        node: String,
        pods: Vec<PodRef>,
        waited: Duration,
    },
    #[error("manifest #{index} is invalid: {reason}")]
    ManifestInvalid { index: usize, reason: String },
    #[error("manifests are not valid YAML{}", location_text(*line, *column))]
    ManifestParse {
        line: Option<u64>,
        column: Option<u64>,
    },
    #[error("the cluster does not serve `{api_version}` `{kind}` (needed to apply `{object}`)")]
    UnknownKind {
        api_version: String,
        kind: String,
        object: String,
        #[source]
        err: Box<::kube::Error>,
    },
    #[error(
        "applying `{object}` conflicts with fields another field manager owns; re-run with force_conflicts to take them over"
    )]
    ApplyConflict {
        object: String,
        #[source]
        err: Box<::kube::Error>,
    },
    #[error("bootstrap manifests sync: `{object}`: {reason}")]
    ManifestSync { object: String, reason: String },
    #[error(
        "bootstrap manifests sync: `{object}`: its kind is not served and no CustomResourceDefinition among the manifests defines it; nothing was applied (install the CRD first, or drop the object)"
    )]
    ManifestKindUnserved {
        object: String,
        #[source]
        source: Box<K8sError>,
    },
    #[error("bootstrap manifests sync: `{object}`: still failing after retrying for {waited:?}")]
    ManifestRetriesExhausted {
        object: String,
        waited: Duration,
        #[source]
        source: Box<K8sError>,
    },
}

fn location_text(line: Option<u64>, column: Option<u64>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" (at line {l}, column {c})"),
        (Some(l), None) => format!(" (at line {l})"),
        _ => String::new(),
    }
}

impl K8sError {
    /// Whether retrying the same call later may succeed (apiserver unavailable, connection
    /// trouble, throttling).
    pub fn is_transient(&self) -> bool {
        match self {
            K8sError::Api { err, .. } => transient(err),
            _ => false,
        }
    }
}

/// Transient kube-rs errors: 429 (throttling), 5xx except 501, and transport failures.
pub(crate) fn transient(err: &::kube::Error) -> bool {
    match err {
        ::kube::Error::Api(status) => {
            status.code == 429 || (status.code >= 500 && status.code != 501)
        }
        ::kube::Error::HyperError(_) | ::kube::Error::Service(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(
        component: ControlPlaneComponent,
        running: bool,
        ready: bool,
        image: &str,
    ) -> StaticPodStatus {
        StaticPodStatus {
            component,
            pod: PodRef {
                namespace: "kube-system".into(),
                name: format!("{component}-cp-1"),
            },
            running,
            ready,
            image: image.into(),
            config_version: None,
        }
    }

    #[test]
    fn control_plane_check_reports_each_problem() {
        use ControlPlaneComponent::*;
        let pods = vec![
            pod(
                ApiServer,
                true,
                true,
                "registry.k8s.io/kube-apiserver:v1.34.1",
            ),
            pod(
                ControllerManager,
                true,
                false,
                "registry.k8s.io/kube-controller-manager:v1.34.1",
            ),
        ];
        let expected = vec![(
            ApiServer,
            "registry.k8s.io/kube-apiserver:v1.35.0".to_string(),
        )];
        let problems = check_control_plane(&pods, &expected);
        assert_eq!(
            problems,
            vec![
                ControlPlaneProblem::WrongImage {
                    component: ApiServer,
                    expected: "registry.k8s.io/kube-apiserver:v1.35.0".into(),
                    found: "registry.k8s.io/kube-apiserver:v1.34.1".into(),
                },
                ControlPlaneProblem::NotReady {
                    component: ControllerManager
                },
                ControlPlaneProblem::Missing {
                    component: Scheduler
                },
            ]
        );
        let all_good = vec![
            pod(ApiServer, true, true, "a"),
            pod(ControllerManager, true, true, "b"),
            pod(Scheduler, true, true, "c"),
        ];
        assert!(check_control_plane(&all_good, &[(Scheduler, "c".into())]).is_empty());
    }

    #[test]
    fn manifests_parse_from_multi_document_yaml_and_bad_ones_are_named() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  namespace: kube-system\n---\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: b\n";
        let manifests = Manifest::parse_yaml(text).unwrap();
        assert_eq!(manifests.len(), 2);
        assert_eq!(manifests[0].describe(), "v1 ConfigMap kube-system/a");
        assert_eq!(manifests[1].namespace(), None);
        let err = Manifest::parse_yaml("apiVersion: v1\nkind: Secret\nmetadata: {}\n").unwrap_err();
        assert!(
            matches!(err, K8sError::ManifestInvalid { index: 0, ref reason } if reason.contains("metadata.name"))
        );
        let err = Manifest::parse_yaml("kind: Secret\ndata: {password: [unclosed\n").unwrap_err();
        assert!(matches!(err, K8sError::ManifestParse { .. }));
        assert!(!err.to_string().contains("password"), "{err}");
    }

    #[test]
    fn manifest_debug_shows_identity_only() {
        let m = Manifest::from_value(
            serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"k": "c2VjcmV0"}}),
            0,
        )
        .unwrap();
        let dbg = format!("{m:?}");
        assert_eq!(dbg, "Manifest(v1 Secret s)");
    }
}
