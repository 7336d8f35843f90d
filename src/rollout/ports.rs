//! The ports the executor drives: what medea needs from Talos and from Kubernetes, in domain
//! types only. `talos::adapter` and `k8s::adapter` implement them over the real clients; the
//! tests use [`crate::rollout::fake`] or the simulator.
//!
//! Every method is one request (or one bounded sequence, such as a drain) against one node or
//! the cluster; retries, waits and ordering are the executor's business. Errors say whether they
//! are worth waiting out ([`PortError::Transient`]) or must halt the job ([`PortError::Failed`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::desired::model::DrainPolicy;
use crate::version::{KubeVersion, TalosVersion};

/// Boxed error source carried by a [`PortError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A node as both sides address it: the Kubernetes node name and the Talos API address
/// (used as the single-valued `node` metadata target).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeTarget {
    /// The Kubernetes node name.
    pub node: String,
    /// The address its Talos API answers on.
    pub address: String,
}

/// How an installer is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradeMethod {
    /// Talos >= 1.13.0: `LifecycleService.Upgrade` only writes the new boot entry; medea
    /// reboots the node itself afterwards (`MachineService.Reboot`).
    Lifecycle,
    /// Older Talos: `MachineService.Upgrade` (never with `force`); the node reboots by itself.
    Legacy,
}

impl UpgradeMethod {
    /// The method for a node running `running`: `>= v1.13.0` the lifecycle path, older nodes
    /// the legacy RPC ([`TalosVersion::upgrades_through_lifecycle`], which
    /// `talos::UpgradeRpc::for_running` calls too; a test pins that they agree), so the adapter
    /// and the journal always name the same RPC.
    pub fn for_version(running: &TalosVersion) -> UpgradeMethod {
        if running.upgrades_through_lifecycle() {
            UpgradeMethod::Lifecycle
        } else {
            UpgradeMethod::Legacy
        }
    }
}

/// Talos `MachineStatus` stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MachineStage {
    /// Booting.
    Booting,
    /// Running.
    Running,
    /// Rebooting.
    Rebooting,
    /// Shutting down.
    ShuttingDown,
    /// Upgrading.
    Upgrading,
    /// Installing.
    Installing,
    /// In maintenance mode.
    Maintenance,
    /// Any other stage.
    Other,
}

impl MachineStage {
    /// The stage as Talos names it (`MACHINE_STAGE_RUNNING` → `running`).
    pub fn name(self) -> &'static str {
        match self {
            MachineStage::Booting => "booting",
            MachineStage::Running => "running",
            MachineStage::Rebooting => "rebooting",
            MachineStage::ShuttingDown => "shutting down",
            MachineStage::Upgrading => "upgrading",
            MachineStage::Installing => "installing",
            MachineStage::Maintenance => "in maintenance",
            MachineStage::Other => "in another stage",
        }
    }

    /// A stage in which the node is on its way down or up, or applying an upgrade.
    pub fn in_transition(self) -> bool {
        matches!(
            self,
            MachineStage::Booting
                | MachineStage::Rebooting
                | MachineStage::ShuttingDown
                | MachineStage::Upgrading
                | MachineStage::Installing
        )
    }
}

/// What the next boot of a node would run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NextBoot {
    /// No upgrade is staged: the next boot runs the running version.
    Same,
    /// An installed-but-not-booted upgrade (after `LifecycleService.Upgrade`) will boot this.
    Version(TalosVersion),
    /// The adapter cannot tell. A dangling Upgrade intent that only this could resolve halts
    /// the job instead of calling Upgrade a second time.
    Unknown,
}

/// One node as the Talos API reports it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TalosNode {
    /// Running version (`Version.tag`).
    pub version: TalosVersion,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// What `MachineStatus` reports.
    pub stage: MachineStage,
    /// `MachineStatus.status.ready`: every condition of the node's readiness is met (time
    /// synced, network, services, static pods; `machine_status.go`). "Back" after a reboot is
    /// `stage == Running && ready`, as `talosctl upgrade --wait` decides.
    #[serde(default)]
    pub ready: bool,
    /// What the node boots next (the bootloader's default entry).
    pub next_boot: NextBoot,
    /// Services that are not Running+healthy (`ServiceList`), by id; empty when all are.
    pub unhealthy_services: Vec<String>,
}

/// One etcd member as seen from the control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdMember {
    /// Member hostname (the node name on Talos).
    pub name: String,
    /// Whether the member is a learner.
    pub learner: bool,
    /// Answered `EtcdStatus` with no errors.
    pub healthy: bool,
    /// `EtcdMemberStatus.errors`.
    pub errors: Vec<String>,
}

/// The etcd cluster of a Kubernetes cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdHealth {
    /// The members.
    pub members: Vec<EtcdMember>,
    /// Active alarms (`NOSPACE`, `CORRUPT`), as `member: alarm`.
    pub alarms: Vec<String>,
    /// The member the answering members report as their leader (`EtcdStatus.leader`, mapped
    /// to its name through the member list); `None` when none answered with a known leader (an
    /// election under way) or they disagree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
}

/// One Node as the kube-apiserver reports it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeNode {
    /// Condition `Ready=True`.
    pub ready: bool,
    /// `status.nodeInfo.kubeletVersion`, when reported and parseable.
    pub kubelet_version: Option<KubeVersion>,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// `spec.taints` (every one, medea's pacing taint among them when it is there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<NodeTaint>,
    /// Who says they cordoned the node: the value of [`CORDONED_BY_ANNOTATION`] (a medea
    /// job's id), else the name of another cordon annotation it carries
    /// ([`FOREIGN_CORDON_ANNOTATIONS`]); `None` when no annotation says (a plain `kubectl
    /// cordon`, or not cordoned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordoned_by: Option<CordonedBy>,
}

/// Who a node's annotations say cordoned it (issue #48 item 5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "by", content = "value")]
pub enum CordonedBy {
    /// A medea job: the value of `medea.dev/cordoned-by`.
    Job(String),
    /// Someone else, named by the annotation they leave (`talos.dev/client-cordoned`,
    /// `talos.dev/cordoned`).
    Annotation(String),
}

impl KubeNode {
    /// Whether the node is cordoned by the job `job` (its annotation names the job): the only
    /// cordon that job may lift.
    pub fn cordoned_by_job(&self, job: &str) -> bool {
        matches!(&self.cordoned_by, Some(CordonedBy::Job(j)) if j == job)
    }

    /// Who cordoned the node, for a person: `job 3f2a…`, `talos.dev/client-cordoned`, or
    /// `someone else (no annotation says who)`.
    pub fn cordoned_by_text(&self) -> String {
        match &self.cordoned_by {
            Some(CordonedBy::Job(j)) => format!("medea job `{j}`"),
            Some(CordonedBy::Annotation(a)) => format!("`{a}`"),
            None => "someone else (no annotation says who)".into(),
        }
    }
}

/// The annotation every cordon medea makes carries, valued with the job's id (issue #48 item
/// 5): medea only ever uncordons a node carrying its own job's annotation, and removes the
/// annotation with the cordon.
pub const CORDONED_BY_ANNOTATION: &str = "medea.dev/cordoned-by";

/// Annotations by which others mark a cordon of theirs: talosctl ≥ 1.15 (`talos.dev/client-
/// cordoned`, it lifts only the cordons it marked) and machined's own cordon before a
/// shutdown or an upgrade (`talos.dev/cordoned`, siderolabs/talos `pkg/machinery/constants`
/// `AnnotationCordonedKey`, `internal/app/machined/pkg/controllers/k8s/node_apply.go`
/// `ApplyCordoned`). Only to name them: any cordon without medea's annotation is someone
/// else's.
pub const FOREIGN_CORDON_ANNOTATIONS: [&str; 2] =
    ["talos.dev/client-cordoned", "talos.dev/cordoned"];

/// One taint of a Node (`spec.taints[]`): key, value and effect (`NoSchedule`,
/// `PreferNoSchedule`, `NoExecute`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTaint {
    /// The taint's key.
    pub key: String,
    /// Its value (empty when none).
    #[serde(default)]
    pub value: String,
    /// Its effect.
    pub effect: String,
}

/// The key of the taint medea puts on the nodes of the next wave (issue #35, pacing): pods
/// evicted from the current wave prefer other nodes. Its value is the job's id, so medea only
/// ever removes the taint a job of its own put there.
pub const PACING_TAINT_KEY: &str = "medea.dev/upgrade-pending";

/// The effect of the pacing taint: a preference of the scheduler, never a refusal.
pub const PACING_TAINT_EFFECT: &str = "PreferNoSchedule";

/// The result of a drain that did not fail outright.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "result")]
pub enum DrainOutcome {
    /// Every evictable pod is gone (DaemonSet and mirror pods stay).
    Drained {
        /// The PersistentVolumes of the pods this drain evicted (tuppr `EvictableVolumePVs`):
        /// the volume-detach wait covers their attachments on the node. `None`: not reported
        /// (a journal written before it was): every attachment on the node counts.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        volumes: Option<Vec<String>>,
    },
    /// Evictions were still refused (HTTP 429) when the timeout ran out. medea never forces.
    Blocked {
        /// The PodDisruptionBudget that refused (`namespace/name`), when the API said.
        pdb: String,
        /// The pod that could not be evicted (`namespace/name`).
        pod: String,
        /// The PersistentVolumes of the pods this drain set out to evict, as for
        /// [`DrainOutcome::Drained`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        volumes: Option<Vec<String>>,
    },
}

/// A `storage.k8s.io/v1` `VolumeAttachment` that names a node (`spec.nodeName`): a volume
/// the attach/detach controller has attached to it, or not detached from it yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeAttachment {
    /// The object's name (`csi-<sha256>` for CSI attachments).
    pub name: String,
    /// `spec.source.persistentVolumeName`, when the source is a PersistentVolume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume: Option<String>,
}

impl std::fmt::Display for VolumeAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.persistent_volume {
            Some(pv) => write!(f, "{} (PersistentVolume {pv})", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// A Kubernetes component managed through the Talos machine configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Component {
    /// kube-apiserver.
    ApiServer,
    /// kube-controller-manager.
    ControllerManager,
    /// kube-scheduler.
    Scheduler,
    /// kube-proxy.
    Proxy,
    /// The kubelet.
    Kubelet,
}

impl Component {
    /// The static pod / `k8s-app` name (`kube-apiserver`, …), and `kubelet`.
    pub fn name(self) -> &'static str {
        match self {
            Component::ApiServer => "kube-apiserver",
            Component::ControllerManager => "kube-controller-manager",
            Component::Scheduler => "kube-scheduler",
            Component::Proxy => "kube-proxy",
            Component::Kubelet => "kubelet",
        }
    }
    /// The upstream image repository used when a node's configuration names none.
    pub fn default_repository(self) -> &'static str {
        match self {
            Component::ApiServer => "registry.k8s.io/kube-apiserver",
            Component::ControllerManager => "registry.k8s.io/kube-controller-manager",
            Component::Scheduler => "registry.k8s.io/kube-scheduler",
            Component::Proxy => "registry.k8s.io/kube-proxy",
            Component::Kubelet => "ghcr.io/siderolabs/kubelet",
        }
    }
    /// The control-plane static pods, in upgrade order.
    pub const STATIC_PODS: [Component; 3] = [
        Component::ApiServer,
        Component::ControllerManager,
        Component::Scheduler,
    ];
    /// The containerd namespace its image is pulled into.
    pub fn namespace(self) -> ImageNamespace {
        match self {
            Component::Kubelet => ImageNamespace::System,
            _ => ImageNamespace::Cri,
        }
    }
}

impl std::fmt::Display for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

pub use super::removed::ComponentArgs;

/// Component images a node's machine configuration names (v1alpha1 fields or the Talos 1.14
/// per-component documents, whichever the node has). Absent = not configured (default image).
pub type ComponentImages = BTreeMap<Component, String>;

/// A static pod as the kube-apiserver shows it (mirror pod of the node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaticPod {
    /// Its image.
    pub image: String,
    /// Whether it is Ready.
    pub ready: bool,
    /// The mirror pod's `talos.dev/config-version` annotation: the version of the component's
    /// config resource (`APIServerConfigs.kubernetes.talos.dev`, …) the static pod was rendered
    /// from. `None` when the pod carries no such annotation.
    #[serde(default)]
    pub config_version: Option<String>,
}

/// The annotation Talos puts on the static pods it renders (`AnnotationStaticPodConfigVersion`
/// in siderolabs/talos `pkg/machinery/constants`).
pub const ANNOTATION_CONFIG_VERSION: &str = "talos.dev/config-version";
/// Its companion, the version of the secrets the pod was rendered with.
pub const ANNOTATION_SECRETS_VERSION: &str = "talos.dev/secrets-version";

/// Where `ImageService.Pull` puts an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageNamespace {
    /// `{driver: CRI, namespace: NS_SYSTEM}`: installer and kubelet images.
    System,
    /// `{driver: CRI, namespace: NS_CRI}`: images of pods (control-plane static pods).
    Cri,
}

/// One bootstrap manifest object (from COSI `Manifests.kubernetes.talos.dev`), as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest(pub serde_json::Value);

/// A saved etcd snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// Where it was saved.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// sha256 of the whole file, computed by medea, lowercase hex. For an encrypted snapshot:
    /// of the etcd snapshot (the plaintext), as `size` is.
    pub sha256: String,
    /// Set when the snapshot was saved encrypted to the cluster's backup recipients (issue
    /// #49): `path` is then the age file, `size`/`sha256` stay the plaintext snapshot's.
    /// Absent in older records and for a plaintext snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<EncryptedSnapshot>,
}

/// The encrypted file of a pre-upgrade etcd snapshot (issue #49).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EncryptedSnapshot {
    /// Size of the age file.
    pub size: u64,
    /// sha256 of the age file, lowercase hex (checkable without a key).
    pub sha256: String,
    /// The age recipients (`age1…`) it is encrypted to.
    pub recipients: Vec<String>,
}

/// An etcd snapshot streamed to a consumer, its trailer verified (issue #37).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotStreamed {
    /// Bytes streamed.
    pub size: u64,
    /// sha256 of the whole stream, computed by medea, lowercase hex.
    pub sha256: String,
}

/// A plain message used as an error source where no richer error exists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Detail(pub String);

/// Why a port call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// Worth waiting out: gRPC `UNAVAILABLE`, connection refused or reset, timeouts, the
    /// kube-apiserver away during a control-plane reboot, HTTP 5xx. The call may or may not
    /// have taken effect; the executor observes before it calls again.
    #[error("{op} on `{target}` is temporarily unavailable")]
    Transient {
        /// The call.
        op: &'static str,
        /// The node or object it was made to.
        target: String,
        /// What it failed with.
        #[source]
        source: BoxError,
    },
    /// An install refused because another install is already running on the node
    /// (`LifecycleService.Upgrade` `FailedPrecondition` "another installation/upgrade is
    /// already in progress"): an earlier call, whose reply was lost, is still at work. Open like
    /// [`PortError::Transient`]; the sequencer also keeps the node *installing* until its next
    /// boot changes (issue #48).
    #[error("{op} on `{target}` was refused: an install is already running on the node")]
    Busy {
        /// The call.
        op: &'static str,
        /// The node it was made to.
        target: String,
        /// What it failed with.
        #[source]
        source: BoxError,
    },
    /// Definite, and typed: the drain refused to start for pods the pool's drain policy does
    /// not let it evict ([`Refusal`]). The job halts, as for [`PortError::Failed`]; the halt
    /// carries the refusal (issue #50: nothing reads it from the error's text).
    #[error("{op} on `{target}` was refused")]
    Refused {
        /// The call.
        op: &'static str,
        /// The node it was made to.
        target: String,
        /// Why.
        refusal: Refusal,
        /// What it failed with.
        #[source]
        source: BoxError,
    },
    /// Definite: the call was refused or reported failure (installer exit code non-zero,
    /// `FailedPrecondition`, `PermissionDenied`, an unparseable reply). The job halts.
    #[error("{op} on `{target}` failed")]
    Failed {
        /// The call.
        op: &'static str,
        /// The node or object it was made to.
        target: String,
        /// What it failed with.
        #[source]
        source: BoxError,
    },
}

/// Why a drain refused to start, before any eviction (the pool's drain policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Refusal {
    /// Pods use emptyDir (node-local) storage and `drain.deleteEmptyDirData` is false.
    LocalStorage,
    /// Pods have no controller and `drain.evictUnmanagedPods` is false.
    UnmanagedPods,
}

impl PortError {
    /// The typed refusal of a [`PortError::Refused`].
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            PortError::Refused { refusal, .. } => Some(*refusal),
            _ => None,
        }
    }
    /// A drain of `target` refused before any eviction, for `refusal`.
    pub fn refused(
        op: &'static str,
        target: impl Into<String>,
        refusal: Refusal,
        source: impl Into<BoxError>,
    ) -> PortError {
        PortError::Refused {
            op,
            target: target.into(),
            refusal,
            source: source.into(),
        }
    }
    /// A transient error of `op` on `target`.
    pub fn transient(
        op: &'static str,
        target: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> PortError {
        PortError::Transient {
            op,
            target: target.into(),
            source: source.into(),
        }
    }
    /// A definitive failure of `op` on `target`.
    pub fn failed(
        op: &'static str,
        target: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> PortError {
        PortError::Failed {
            op,
            target: target.into(),
            source: source.into(),
        }
    }
    /// An install refused because another one is running on the node ([`PortError::Busy`]).
    pub fn busy(
        op: &'static str,
        target: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> PortError {
        PortError::Busy {
            op,
            target: target.into(),
            source: source.into(),
        }
    }
    /// Whether the call may not have run (re-observe before acting again).
    pub fn is_transient(&self) -> bool {
        matches!(self, PortError::Transient { .. } | PortError::Busy { .. })
    }
    /// Whether the node answered that an install is already running on it.
    pub fn is_busy(&self) -> bool {
        matches!(self, PortError::Busy { .. })
    }
}

/// What medea needs from the Talos machine API. One request per node (single `node` metadata).
pub trait TalosPort: Send + Sync {
    /// `Version`, boot id, `MachineStatus` stage, staged upgrade and service health of a node.
    fn node(&self, node: &NodeTarget) -> impl Future<Output = Result<TalosNode, PortError>> + Send;

    /// Member list, per-member status and alarms of etcd, asked through `control_plane`.
    fn etcd(
        &self,
        control_plane: &[NodeTarget],
    ) -> impl Future<Output = Result<EtcdHealth, PortError>> + Send;

    /// `EtcdSnapshot` from `node`, saved to `dest` (which must not exist): streamed to a 0600
    /// `.part` file, fsync'd, etcd's sha256 trailer verified, then moved to `dest` and the
    /// directory fsync'd. `dest` exists only once the snapshot is complete (the executor relies
    /// on that after a restart). `talos::TalosApi::etcd_snapshot` does exactly this.
    fn etcd_snapshot(
        &self,
        node: &NodeTarget,
        dest: &Path,
    ) -> impl Future<Output = Result<SnapshotInfo, PortError>> + Send;

    /// `EtcdSnapshot` from `node`, streamed chunk by chunk into `chunks` and never written to
    /// disk here (a scheduled backup, issue #37, and the pre-upgrade snapshot of a cluster with
    /// backup recipients, issue #49, encrypt it first). After the last chunk,
    /// etcd's sha256 trailer is verified as for [`Self::etcd_snapshot`]: a truncated or
    /// corrupt stream is an error, and the consumer must then discard what it received.
    fn etcd_snapshot_stream(
        &self,
        node: &NodeTarget,
        chunks: tokio::sync::mpsc::Sender<Vec<u8>>,
    ) -> impl Future<Output = Result<SnapshotStreamed, PortError>> + Send;

    /// `ImageService.Pull` (legacy `ImagePull` on old nodes); idempotent.
    fn pull_image(
        &self,
        node: &NodeTarget,
        image: &str,
        namespace: ImageNamespace,
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    /// Install `image` with `method`. `Lifecycle`: wait for the stream's `exit_code`; a non-zero
    /// code is [`PortError::Failed`]. `Legacy`: `MachineService.Upgrade{image}` (no force, no
    /// stage); returns once acknowledged, the node then reboots by itself.
    fn upgrade(
        &self,
        node: &NodeTarget,
        image: &str,
        method: UpgradeMethod,
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    /// `MachineService.EtcdForfeitLeadership` on a control-plane node: if its etcd member
    /// leads, leadership moves to another member (Talos picks the first other member of the
    /// member list); a member that does not lead answers at once with no new leader. Returns
    /// the new leader's name, if the node named one.
    fn etcd_forfeit_leadership(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<Option<String>, PortError>> + Send;

    /// `MachineService.Reboot` (mode DEFAULT); returns once accepted.
    fn reboot(&self, node: &NodeTarget) -> impl Future<Output = Result<(), PortError>> + Send;

    /// `MachineService.Rollback`: Talos makes the previous installation the default boot
    /// entry and reboots gracefully (it neither cordons nor drains). Returns once accepted.
    /// Not idempotent: a second call flips the A/B slot back, so the executor journals it
    /// first and never makes it twice. No previous installation: [`PortError::Failed`].
    fn rollback(&self, node: &NodeTarget) -> impl Future<Output = Result<(), PortError>> + Send;

    /// Component images named by the node's machine configuration.
    fn component_images(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<ComponentImages, PortError>> + Send;

    /// The flags (`extraArgs`) the node's machine configuration gives each component
    /// (v1alpha1 `cluster.{apiServer,controllerManager,scheduler}.extraArgs`,
    /// `machine.kubelet.extraArgs`), for the Kubernetes upgrade checks.
    fn component_args(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<ComponentArgs, PortError>> + Send;

    /// The `metadata.version` of the component's config resource on the node (COSI namespace
    /// `controlplane`, `APIServerConfigs` / `ControllerManagerConfigs` / `SchedulerConfigs`
    /// `.kubernetes.talos.dev`, id = the component name): the value its mirror pod's
    /// `talos.dev/config-version` annotation shows once the kubelet runs the static pod
    /// rendered from it. `None` when the node has no such resource (not a control plane, or a
    /// Talos that does not publish it). Only for the static-pod components.
    fn component_config_version(
        &self,
        node: &NodeTarget,
        component: Component,
    ) -> impl Future<Output = Result<Option<String>, PortError>> + Send;

    /// Set one component image in the node's machine configuration (read the config, patch the
    /// v1alpha1 field or the per-component document, `ApplyConfiguration` mode `NO_REBOOT`).
    fn set_component_image(
        &self,
        node: &NodeTarget,
        component: Component,
        image: &str,
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    /// The bootstrap manifests the node renders (COSI `Manifests.kubernetes.talos.dev`).
    fn bootstrap_manifests(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<Vec<Manifest>, PortError>> + Send;
}

/// What medea needs from the kube-apiserver.
pub trait KubePort: Send + Sync {
    /// Readiness, kubelet version, cordon state and taints of a Node.
    fn node(&self, node: &str) -> impl Future<Output = Result<KubeNode, PortError>> + Send;
    /// Every Node of the cluster, by name (one list call): what the budget of a wave counts
    /// before the wave starts.
    fn nodes(&self) -> impl Future<Output = Result<BTreeMap<String, KubeNode>, PortError>> + Send;
    /// Cordon the node for job `owner`: `spec.unschedulable=true` and
    /// [`CORDONED_BY_ANNOTATION`]`=owner` in one patch, conditional on the node's
    /// `resourceVersion`. A node that is cordoned already is left as it is (someone else's
    /// cordon is never claimed). Idempotent.
    fn cordon(&self, node: &str, owner: &str)
    -> impl Future<Output = Result<(), PortError>> + Send;
    /// Lift job `owner`'s cordon: `spec.unschedulable=false` and the annotation removed in one
    /// conditional patch, only when the node carries `owner`'s annotation; a cordon anyone
    /// else made stays. Idempotent.
    fn uncordon(
        &self,
        node: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Add `taint` to the node unless a taint with its key and effect is there already (then
    /// nothing changes, whatever its value: a taint someone else put is never changed).
    /// Idempotent; never touches another taint.
    fn taint(
        &self,
        node: &str,
        taint: &NodeTaint,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Remove the node's taint with `taint`'s key, value and effect, if it is there; any other
    /// taint (the same key with another value included) stays. Idempotent.
    fn untaint(
        &self,
        node: &str,
        taint: &NodeTaint,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Evict every evictable pod of the node through the Eviction API, retrying PDB refusals
    /// (HTTP 429) until `timeout`, then wait for them to be gone. Never deletes, never forces.
    /// `policy` says which pods are evicted: emptyDir pods, bare pods, and pods it skips; a pod
    /// the policy refuses fails the drain ([`PortError::Failed`]) before any eviction, naming
    /// the pods and the desired-state field that would allow them.
    fn drain(
        &self,
        node: &str,
        timeout: Duration,
        policy: &DrainPolicy,
    ) -> impl Future<Output = Result<DrainOutcome, PortError>> + Send;
    /// The `VolumeAttachment`s whose `spec.nodeName` is `node`, sorted by name (listed
    /// cluster-wide: the apiserver offers no field selector on `spec.nodeName`).
    fn volume_attachments(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<Vec<VolumeAttachment>, PortError>> + Send;
    /// The node's mirror pod of a control-plane component (`kube-system`, `k8s-app=<name>`,
    /// on that node), if present.
    fn static_pod(
        &self,
        node: &str,
        component: Component,
    ) -> impl Future<Output = Result<Option<StaticPod>, PortError>> + Send;
    /// Sync the bootstrap manifests as `upgrade-k8s` does: server-side apply under field
    /// manager `talos` with forced ownership, the inventory annotation and ConfigMap, staged
    /// (CRDs/Namespaces/ClusterRoles — waited for —, classes, ConfigMaps/Secrets, the rest),
    /// pruning, then wait up to `wait` for the objects it created or changed to reconcile;
    /// `legacy` (a node runs Talos < 1.13): GET then create or, when a dry-run differs,
    /// update, retrying conflicts; no inventory, no pruning; then wait for Deployments and
    /// DaemonSets (`k8s::bootstrap`).
    fn apply_manifests(
        &self,
        manifests: &[Manifest],
        legacy: bool,
        wait: Duration,
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    /// Run a Job hook to its end (issue #35): create the `batch/v1` Job named `req.run_id`
    /// (or find the one a previous attempt created), wait for it to complete within the
    /// hook's timeout, and report its exit code and the tail of its pod's log. A port without
    /// a Kubernetes client reports a failure.
    fn run_job_hook(&self, req: &HookRequest) -> impl Future<Output = HookReport> + Send {
        let _ = req;
        async move { HookReport::failed("this medea has no Kubernetes client to run Job hooks with") }
    }
}

/// A blocking hook to run (issue #35), as the executor hands it to
/// [`HealthProbe::run_http_hook`] or [`KubePort::run_job_hook`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookRequest {
    /// The cluster.
    pub cluster: String,
    /// The rollout job.
    pub job: String,
    /// Stable for the hook's site in the job: the Kubernetes Job's name, the event's `runId`.
    pub run_id: String,
    /// Where it runs.
    pub point: crate::desired::hooks::HookPoint,
    /// The pool (node and wave hooks).
    pub pool: Option<String>,
    /// The node (node hooks).
    pub node: Option<String>,
    /// The wave, 1-based (node and wave hooks).
    pub wave: Option<usize>,
    /// 1, or 2 for an idempotent hook run again after medea stopped while it ran.
    pub attempt: u32,
    /// The hook, as approved.
    pub hook: crate::desired::hooks::Hook,
}

impl HookRequest {
    /// The JSON event an HTTP hook posts: `jobId`, `cluster`, `pool`, `node`, `wave`,
    /// `point`, `hook`, `attempt`, `runId` (absent fields are `null`).
    pub fn event(&self) -> serde_json::Value {
        serde_json::json!({
            "jobId": self.job,
            "cluster": self.cluster,
            "pool": self.pool,
            "node": self.node,
            "wave": self.wave,
            "point": self.point.as_str(),
            "hook": self.hook.name,
            "attempt": self.attempt,
            "runId": self.run_id,
        })
    }
}

pub use super::sequencer::HookReport;

impl HookReport {
    /// A hook that could not run at all.
    pub fn failed(detail: impl Into<String>) -> HookReport {
        HookReport {
            succeeded: false,
            detail: detail.into(),
            exit_code: None,
            log_tail: None,
        }
    }
}

/// One gate evaluation's context: what the probe may ignore right now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateContext {
    /// The cluster.
    pub cluster: String,
    /// Nodes medea is taking down or bringing back at this moment (installed and about to
    /// reboot, or rebooting and not back yet): alerts about them are expected and ignored by
    /// `alerts` gates.
    pub rebooting: Vec<String>,
    /// The ids of the Alertmanager silences medea made for this job: an alert they mute is
    /// not counted by `alerts` gates (an operator's silence is, unless the gate skips it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own_silences: Vec<String>,
    /// Where the gate's policy says to evaluate it (the pool's or the cluster's sources).
    #[serde(default)]
    pub sources: crate::plan::health::HealthSources,
}

/// A gate's verdict (issue #35): the check said yes, said no, or could not tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GateVerdict {
    /// The gate passes.
    Pass,
    /// The check ran and said no: the metric is bad, an alert fires, a workload is not
    /// available. Counted against `failureLimit`.
    Fail,
    /// The check could not tell: the source is unreachable or answered an error, the query
    /// timed out (an error: [`GateEvaluation::error`], counted against
    /// `consecutiveErrorLimit`), or it returned no value where one was needed (counted
    /// against `inconclusiveLimit`). Never a pass.
    Inconclusive,
}

impl GateVerdict {
    /// The stable wire form: `pass`, `fail` or `inconclusive` (status, metrics, webhooks).
    pub fn as_str(self) -> &'static str {
        match self {
            GateVerdict::Pass => "pass",
            GateVerdict::Fail => "fail",
            GateVerdict::Inconclusive => "inconclusive",
        }
    }
}

impl GateVerdict {
    /// The verdict of its wire form (`pass`, `fail`, `inconclusive`).
    pub fn parse(s: &str) -> Option<GateVerdict> {
        match s {
            "pass" => Some(GateVerdict::Pass),
            "fail" => Some(GateVerdict::Fail),
            "inconclusive" => Some(GateVerdict::Inconclusive),
            _ => None,
        }
    }
}

impl std::fmt::Display for GateVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One sample (or alert, or workload) a gate looked at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateSample {
    /// The series' labels, the alert's labels, or `{kind, namespace, name}` of a workload.
    pub labels: BTreeMap<String, String>,
    /// The sample value, or a short state (`firing`, `2/3 available`).
    pub value: String,
}

/// The result of evaluating one gate once. Journaled as evidence; holds no secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateEvaluation {
    /// The gate's name.
    pub gate: String,
    /// Its verdict.
    pub verdict: GateVerdict,
    /// What the check saw (bounded by the probe: at most a few dozen).
    pub samples: Vec<GateSample>,
    /// Why it failed (one line, with the cause chain flattened for display), or a summary.
    pub detail: String,
    /// The gate is `dryRun: true`: evaluated, journaled, shown and notified, never blocking.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// An inconclusive evaluation because the source could not be asked at all (refused,
    /// timed out, an HTTP or TLS error, an answer that is not the API's): counted against the
    /// gate's `consecutiveErrorLimit`, not its `inconclusiveLimit` (issue #51 item 4).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub error: bool,
}

impl GateEvaluation {
    /// The verdict as people read it: `fail`, or `fail (dry run)` for a dry-run gate.
    pub fn verdict_text(&self) -> String {
        if self.dry_run {
            format!("{} (dry run)", self.verdict)
        } else {
            self.verdict.to_string()
        }
    }
}

/// What medea needs to evaluate health gates (Prometheus, Alertmanager, workloads).
/// `health::Probes` implements it at the edge; evaluation never returns an error: a source
/// that cannot be asked gives [`GateVerdict::Inconclusive`] with the reason in `detail`.
pub trait HealthProbe: Send + Sync {
    /// Evaluates `gate` once in `ctx`.
    fn evaluate(
        &self,
        gate: &crate::plan::health::Gate,
        ctx: &GateContext,
    ) -> impl Future<Output = GateEvaluation> + Send;

    /// Create or renew a silence in the request's Alertmanager (`POST /api/v2/silences`);
    /// its id. A probe without an Alertmanager client refuses (definitively).
    fn silence(
        &self,
        req: &SilenceRequest,
    ) -> impl Future<Output = Result<Silenced, PortError>> + Send {
        let target = req.alertmanager.url.clone();
        async move {
            Err(PortError::failed(
                "silence",
                target,
                "this medea has no Alertmanager client to silence with",
            ))
        }
    }

    /// Run an HTTP hook to its end (issue #35): `POST` its event to the hook's URL with the
    /// credential it names, retried with backoff until a 2xx answer or the hook's timeout. A
    /// probe without an HTTP client reports a failure.
    fn run_http_hook(&self, req: &HookRequest) -> impl Future<Output = HookReport> + Send {
        let _ = req;
        async move { HookReport::failed("this medea has no HTTP client to run hooks with") }
    }

    /// Expire silence `id` now (`DELETE /api/v2/silence/{id}`); one that is already expired
    /// or gone is not an error.
    fn expire_silence(
        &self,
        alertmanager: &crate::plan::health::Endpoint,
        id: &str,
    ) -> impl Future<Output = Result<(), PortError>> + Send {
        let target = format!("{} silence {id}", alertmanager.url);
        async move {
            Err(PortError::failed(
                "expire silence",
                target,
                "this medea has no Alertmanager client to expire silences with",
            ))
        }
    }
}

/// Who medea's silences say created them (`createdBy`).
pub const SILENCE_CREATED_BY: &str = "medea";

/// A silence of a node's expected alerts to create or renew (issue #35 item 1), as the
/// executor hands it to [`HealthProbe::silence`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SilenceRequest {
    /// The Alertmanager, and the credential to ask it with.
    pub alertmanager: crate::plan::health::Endpoint,
    /// The silence to renew (`None`: this node's, found by `marker`, or a new one).
    pub id: Option<String>,
    /// Its matchers (the policy's and the node's).
    pub matchers: Vec<crate::plan::health::SilenceMatcher>,
    /// When it ends.
    pub ends_at: jiff::Timestamp,
    /// Its comment (names the job, the node and medea; ends with `marker`).
    pub comment: String,
    /// Unique to the job's node step: a silence whose creation reply was lost is found by it
    /// (an active `createdBy: medea` silence whose comment holds it) and renewed, never
    /// created a second time.
    pub marker: String,
}

/// What a silence call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Silenced {
    /// The silence's id (Alertmanager gives a new one when it cannot update in place).
    pub id: String,
    /// `true` when the silence was created by this call (not an existing one renewed).
    pub created: bool,
}

/// The probe of an executor given none: every gate is inconclusive ("this medea has no
/// health probe"), so a plan with gates can never pass them unchecked.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProbe;

impl HealthProbe for NoProbe {
    async fn evaluate(
        &self,
        gate: &crate::plan::health::Gate,
        _ctx: &GateContext,
    ) -> GateEvaluation {
        GateEvaluation {
            gate: gate.name.clone(),
            verdict: GateVerdict::Inconclusive,
            samples: Vec::new(),
            detail: "this medea has no health probe to evaluate the gate with".into(),
            dry_run: gate.dry_run,
            error: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_follows_the_running_version() {
        let v = |s| TalosVersion::parse(s).unwrap();
        assert_eq!(
            UpgradeMethod::for_version(&v("v1.12.4")),
            UpgradeMethod::Legacy
        );
        assert_eq!(
            UpgradeMethod::for_version(&v("v1.13.0-beta.1")),
            UpgradeMethod::Legacy
        );
        assert_eq!(
            UpgradeMethod::for_version(&v("v1.13.0")),
            UpgradeMethod::Lifecycle
        );
        assert_eq!(
            UpgradeMethod::for_version(&v("v1.13.9")),
            UpgradeMethod::Lifecycle
        );
        assert_eq!(
            UpgradeMethod::for_version(&v("v1.14.0-rc.1")),
            UpgradeMethod::Lifecycle
        );
    }
}
