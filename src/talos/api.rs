//! [`TalosApi`]: what the rollout executor (and `medea talos`) can ask of one Talos node.
//!
//! Implemented by [`TalosClient`](super::TalosClient) over the real gRPC API; tests and the
//! executor's fakes can implement it in memory. Methods return `impl Future + Send`, so the trait
//! is used generically (`T: TalosApi`), not as `dyn`.

use std::future::Future;
use std::path::Path;

use super::TalosError;
use super::types::*;

/// Per-node operations on the Talos machine API. Every call targets exactly one node.
pub trait TalosApi: Send + Sync {
    /// `MachineService.Version`.
    fn version(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<NodeVersion, TalosError>> + Send;

    /// `MachineService.ServiceList`: apid, machined, etcd, kubelet, ... sorted by id.
    fn services(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<Vec<ServiceHealth>, TalosError>> + Send;

    /// `MachineService.EtcdMemberList` (cluster-wide view, `query_local = false`).
    fn etcd_members(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<Vec<EtcdMember>, TalosError>> + Send;

    /// `MachineService.EtcdStatus` of the node's local member.
    fn etcd_status(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<EtcdMemberStatus, TalosError>> + Send;

    /// `MachineService.EtcdAlarmList`: the active alarms (`NONE` entries left out). A worker
    /// answers `Unimplemented` ("… is only available on control plane nodes").
    fn etcd_alarms(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<Vec<EtcdAlarm>, TalosError>> + Send;

    /// `MachineService.EtcdSnapshot`, streamed to `dest` (which must not exist), fsynced, its
    /// etcd sha256 trailer verified; size and sha256 of the file are returned.
    fn etcd_snapshot(
        &self,
        node: &NodeTarget,
        dest: &Path,
    ) -> impl Future<Output = Result<SnapshotInfo, TalosError>> + Send;

    /// `MachineService.EtcdSnapshot`, each chunk sent to `chunks` as it arrives (nothing is
    /// written to disk here: a scheduled backup encrypts the stream before it touches one).
    /// Once the stream ends, etcd's sha256 trailer is verified; a truncated or corrupt stream
    /// is [`TalosError::SnapshotCorrupt`], and a receiver gone is [`TalosError::SnapshotIo`].
    /// Returns the size and sha256 of the whole stream.
    fn etcd_snapshot_stream(
        &self,
        node: &NodeTarget,
        chunks: tokio::sync::mpsc::Sender<Vec<u8>>,
    ) -> impl Future<Output = Result<StreamedSnapshot, TalosError>> + Send;

    /// `ImageService.Pull` into the system containerd namespace (`{CRI, NS_SYSTEM}`, as
    /// `talosctl upgrade`), falling back to the deprecated `MachineService.ImagePull` on nodes
    /// without ImageService (Talos < 1.13).
    fn pull_image(
        &self,
        node: &NodeTarget,
        image: &ImageRef,
    ) -> impl Future<Output = Result<PulledImage, TalosError>> + Send {
        self.pull_image_into(node, image, PullNamespace::System)
    }

    /// [`Self::pull_image`] into `namespace`: `{CRI, NS_CRI}` puts an image where the kubelet
    /// finds it for a pod (the `upgrade-k8s` pre-pull of the control-plane images).
    fn pull_image_into(
        &self,
        node: &NodeTarget,
        image: &ImageRef,
        namespace: PullNamespace,
    ) -> impl Future<Output = Result<PulledImage, TalosError>> + Send;

    /// Upgrade the node to the installer `image`, choosing the RPC from the running version
    /// ([`UpgradeRpc::for_running`]): `>= v1.13.0` pulls the image, then streams
    /// `LifecycleService.Upgrade` (a non-zero `exit_code` is [`TalosError::UpgradeExit`]) and
    /// returns [`UpgradeOutcome::Installed`] (the caller reboots); older nodes get the legacy
    /// `MachineService.Upgrade` and return [`UpgradeOutcome::Rebooting`]. `force` is never set.
    fn upgrade(
        &self,
        node: &NodeTarget,
        image: &ImageRef,
    ) -> impl Future<Output = Result<UpgradeOutcome, TalosError>> + Send;

    /// `MachineService.EtcdForfeitLeadership`: if the node's etcd member leads, Talos moves
    /// the leadership to the first other member of the member list (etcd `MoveLeader`); a
    /// member that does not lead answers with no new leader. Returns the new leader's name
    /// when one was named. A worker answers `Unimplemented`, a lone member an error.
    fn etcd_forfeit_leadership(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<Option<String>, TalosError>> + Send;

    /// `MachineService.Reboot` (mode DEFAULT). The node goes away right after acknowledging.
    fn reboot(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<RebootAck, TalosError>> + Send;

    /// `MachineService.Rollback`: the previous installation becomes the default boot entry and
    /// the node reboots (gracefully, without cordon or drain). Not idempotent (a second call
    /// flips the A/B slot back); never retried once it may have reached the node.
    fn rollback(&self, node: &NodeTarget) -> impl Future<Output = Result<(), TalosError>> + Send;

    /// `MachineService.Read` of `/proc/sys/kernel/random/boot_id`.
    fn boot_id(&self, node: &NodeTarget)
    -> impl Future<Output = Result<BootId, TalosError>> + Send;

    /// COSI `config/MachineConfigs.config.talos.dev/v1alpha1` (needs `os:admin`).
    fn machine_config(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<MachineConfig, TalosError>> + Send;

    /// COSI `k8s/StaticPodStatuses.kubernetes.talos.dev` (control planes: apiserver,
    /// controller-manager, scheduler).
    fn static_pod_statuses(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<Vec<StaticPodStatus>, TalosError>> + Send;

    /// COSI `k8s/KubeletSpecs.kubernetes.talos.dev/kubelet`.
    fn kubelet_spec(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<KubeletSpec, TalosError>> + Send;

    /// COSI `runtime/MachineStatuses.runtime.talos.dev/machine`.
    fn machine_status(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<MachineStatus, TalosError>> + Send;

    /// COSI `runtime/SecurityStates.talos.dev/securitystate`: whether the node booted with
    /// SecureBoot.
    fn security_state(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<SecurityState, TalosError>> + Send;

    /// COSI `runtime/ImageFactorySchematics.runtime.talos.dev/image-factory-schematic` (from
    /// Talos 1.14): `None` when the node has none (`NotFound`: not built by an Image Factory, or a
    /// Talos that does not publish the resource).
    fn image_factory_schematic(
        &self,
        node: &NodeTarget,
    ) -> impl Future<Output = Result<Option<FactorySchematic>, TalosError>> + Send;

    /// `MachineService.ApplyConfiguration` with the whole config (Talos has no server-side
    /// patch). See [`ApplyMode`] for the 1.13 vs 1.14 semantics.
    fn apply_configuration(
        &self,
        node: &NodeTarget,
        config: &MachineConfig,
        options: ApplyOptions,
    ) -> impl Future<Output = Result<ApplyOutcome, TalosError>> + Send;

    /// `ClusterService.HealthCheck` run by `node` (a control plane), streamed to the end.
    fn health_check(
        &self,
        node: &NodeTarget,
        spec: &HealthCheckSpec,
    ) -> impl Future<Output = Result<HealthReport, TalosError>> + Send;
}
