//! Domain types the Talos adapter returns. No prost type appears here: replies are converted at
//! the edge (`client.rs`), so callers never depend on the wire schema.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use super::TalosError;
use crate::secret::Secret;
use crate::version::TalosVersion;

/// Target of a request: the value of the single-valued `node` gRPC metadata key (an address or
/// name apid can reach, as in talosconfig `nodes`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct NodeTarget(String);

impl NodeTarget {
    pub fn parse(value: &str) -> Result<NodeTarget, TalosError> {
        let bad = |reason| TalosError::BadNode {
            value: value.to_string(),
            reason,
        };
        if value.is_empty() {
            return Err(bad("it is empty"));
        }
        if value.contains(',') {
            return Err(bad(
                "it contains `,`; give one node per request (the `nodes` fan-out is deprecated)",
            ));
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad("it contains whitespace or non-ASCII characters"));
        }
        Ok(NodeTarget(value.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A container image reference with a tag (`ghcr.io/siderolabs/installer:v1.13.9`), optionally
/// pinned by digest: a [`crate::image::ImageRef`] that Talos can install (it must have a tag).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct ImageRef(crate::image::ImageRef);

impl ImageRef {
    pub fn parse(value: &str) -> Result<ImageRef, TalosError> {
        let parsed = crate::image::ImageRef::parse(value).map_err(|err| TalosError::ImageRef {
            image: value.to_string(),
            err,
        })?;
        Self::new(parsed)
    }

    /// An already-parsed reference, refused when it has no tag.
    pub fn new(image: crate::image::ImageRef) -> Result<ImageRef, TalosError> {
        if image.tag().is_none() {
            return Err(TalosError::BadImage {
                image: image.to_string(),
                reason: "it has no `:tag` (for example `ghcr.io/siderolabs/installer:v1.13.9`)",
            });
        }
        Ok(ImageRef(image))
    }

    pub fn image(&self) -> &crate::image::ImageRef {
        &self.0
    }

    /// The tag: the text after the last `:` of the last path segment, without any `@digest`.
    pub fn tag(&self) -> Option<&str> {
        self.0.tag()
    }

    /// The Talos version the tag names, if it is one (`v1.13.9`).
    pub fn talos_version(&self) -> Option<TalosVersion> {
        self.0.talos_version()
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The tag of an image reference reported by a node, if any (see [`crate::image::tag_of`]).
pub fn image_tag(reference: &str) -> Option<&str> {
    crate::image::tag_of(reference)
}

/// Which RPC upgrades a node: picked from the version it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradeRpc {
    /// `ImageService.Pull` then `LifecycleService.Upgrade` (Talos ≥ 1.13): writes the new boot
    /// entry only; the caller drains and reboots.
    Lifecycle,
    /// `MachineService.Upgrade` (Talos < 1.13; deprecated in 1.13, removed in 1.18): the node
    /// pulls, installs and reboots itself.
    Legacy,
}

impl UpgradeRpc {
    /// `>= v1.13.0` → lifecycle, else legacy ([`TalosVersion::upgrades_through_lifecycle`]).
    /// Pre-releases of 1.13.0 order below it and take the legacy RPC, which every 1.13 build
    /// still serves.
    pub fn for_running(running: &TalosVersion) -> UpgradeRpc {
        if running.upgrades_through_lifecycle() {
            UpgradeRpc::Lifecycle
        } else {
            UpgradeRpc::Legacy
        }
    }
}

/// What `Version` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeVersion {
    pub node: NodeTarget,
    pub tag: TalosVersion,
    pub sha: String,
    pub built: String,
    pub go_version: String,
    pub os: String,
    pub arch: String,
    pub platform: String,
    pub rbac: bool,
}

/// Health of a service as `ServiceList` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Health {
    Healthy,
    Unhealthy,
    /// The service has no health check or has not run one yet.
    Unknown,
}

/// One service (`apid`, `etcd`, `kubelet`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServiceHealth {
    pub id: String,
    /// `Running`, `Waiting`, `Preparing`, `Finished`, `Failed`, ...
    pub state: String,
    pub health: Health,
    pub last_message: String,
    /// The last event's message (what talosctl prints as LAST EVENT).
    pub last_event: Option<String>,
    /// Unix seconds of the last health change.
    pub last_change_unix: Option<i64>,
}

impl ServiceHealth {
    /// talosctl's rule (`talosctl health`): state `Running` and health `healthy`.
    pub fn is_running_and_healthy(&self) -> bool {
        self.state == "Running" && self.health == Health::Healthy
    }
}

/// One etcd member, from `EtcdMemberList`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EtcdMember {
    pub id: u64,
    pub hostname: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

/// The local member's status, from `EtcdStatus`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EtcdMemberStatus {
    pub member_id: u64,
    pub leader: u64,
    pub protocol_version: String,
    pub storage_version: String,
    pub db_size: i64,
    pub db_size_in_use: i64,
    pub raft_index: u64,
    pub raft_term: u64,
    pub raft_applied_index: u64,
    pub is_learner: bool,
    /// Non-empty when the member reports problems.
    pub errors: Vec<String>,
}

/// One active etcd alarm, from `EtcdAlarmList` (etcd's alarms are cluster-wide; the member
/// is the one that raised it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct EtcdAlarm {
    pub member_id: u64,
    /// `NOSPACE`, `CORRUPT` (etcd's `AlarmType` names); an unknown number as `ALARM_<n>`.
    pub alarm: String,
}

/// A saved, fsynced, checksummed etcd snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotInfo {
    pub path: PathBuf,
    pub size: u64,
    /// Hex sha256 of the whole file (etcd's own sha256 trailer included).
    pub sha256: String,
}

/// An etcd snapshot streamed to a consumer and checked (issue #37).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StreamedSnapshot {
    /// Bytes streamed.
    pub size: u64,
    /// Hex sha256 of the whole stream (etcd's own sha256 trailer included).
    pub sha256: String,
}

/// The containerd namespace an image is pulled into (`common.ContainerdNamespace`, driver CRI).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PullNamespace {
    /// `NS_SYSTEM`: installer and kubelet images (`talosctl upgrade`, the kubelet pre-pull).
    System,
    /// `NS_CRI` (`k8s.io`): images of pods, e.g. the control-plane static pods
    /// (`talosctl upgrade-k8s` pre-pull, talos `pkg/cluster/kubernetes/talos_managed.go`
    /// `prePullImages`).
    Cri,
}

/// The result of an image pull.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PulledImage {
    /// The name the node reports for the pulled image.
    pub name: String,
    /// `true` when the node served the deprecated `MachineService.ImagePull` (Talos < 1.13).
    pub legacy: bool,
}

/// What an upgrade call did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "rpc", rename_all = "kebab-case")]
pub enum UpgradeOutcome {
    /// LifecycleService: the installer exited 0 and the new boot entry is the default. The node
    /// still runs `from` until the caller reboots it.
    Installed {
        from: TalosVersion,
        /// The installer's output lines.
        output: Vec<String>,
    },
    /// Legacy MachineService.Upgrade: the node acknowledged and now installs and reboots itself.
    Rebooting {
        from: TalosVersion,
        ack: String,
        actor_id: String,
    },
}

impl UpgradeOutcome {
    pub fn rpc(&self) -> UpgradeRpc {
        match self {
            UpgradeOutcome::Installed { .. } => UpgradeRpc::Lifecycle,
            UpgradeOutcome::Rebooting { .. } => UpgradeRpc::Legacy,
        }
    }
    /// `true` when the caller must reboot the node for the upgrade to take.
    pub fn needs_reboot(&self) -> bool {
        matches!(self, UpgradeOutcome::Installed { .. })
    }
}

/// `Reboot` acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RebootAck {
    pub actor_id: String,
}

/// `/proc/sys/kernel/random/boot_id`: changes on every boot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct BootId(pub String);

impl fmt::Display for BootId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A node's machine configuration (multi-document YAML). It holds cluster secrets, so its bytes
/// are a [`Secret`].
#[derive(Clone, PartialEq, Eq)]
pub struct MachineConfig {
    yaml: Secret<Vec<u8>>,
    /// The COSI resource version it was read at (`None` for a config built locally).
    pub resource_version: Option<String>,
}

impl MachineConfig {
    pub fn from_yaml(yaml: impl Into<Vec<u8>>) -> MachineConfig {
        MachineConfig {
            yaml: Secret::new(yaml.into()),
            resource_version: None,
        }
    }
    pub fn yaml(&self) -> &Secret<Vec<u8>> {
        &self.yaml
    }
}

impl fmt::Debug for MachineConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MachineConfig")
            .field("yaml", &self.yaml)
            .field("resource_version", &self.resource_version)
            .finish()
    }
}

/// How `ApplyConfiguration` should apply a config. There is deliberately no `Reboot`: it is
/// deprecated and Talos 1.14 refuses it outside maintenance mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyMode {
    /// Apply live. Talos ≤ 1.13 refuses (`InvalidArgument`) a change that needs a reboot;
    /// Talos 1.14 applies every change live.
    NoReboot,
    /// Talos ≤ 1.13: live if possible, else reboot. Talos 1.14: the same as `NoReboot`.
    Auto,
    /// Persist for the next boot only.
    Staged,
    /// Apply live and roll back unless confirmed within `timeout`.
    Try { timeout: Duration },
}

/// Options of an apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApplyOptions {
    pub mode: ApplyMode,
    /// Validate and report the diff without changing anything.
    pub dry_run: bool,
}

impl ApplyOptions {
    pub fn no_reboot() -> ApplyOptions {
        ApplyOptions {
            mode: ApplyMode::NoReboot,
            dry_run: false,
        }
    }
}

/// The mode Talos reports it actually used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AppliedMode {
    Reboot,
    Auto,
    NoReboot,
    Staged,
    Try,
}

/// What `ApplyConfiguration` answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApplyOutcome {
    pub mode: AppliedMode,
    pub warnings: Vec<String>,
    pub details: String,
}

/// A static pod's status as the kubelet reports it to Talos (`StaticPodStatuses.kubernetes.talos.dev`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StaticPodStatus {
    /// Resource id, `kube-system/kube-apiserver-<nodename>`.
    pub id: String,
    pub phase: String,
    pub ready: bool,
    /// Container images in the pod status.
    pub images: Vec<String>,
}

/// The kubelet spec Talos renders (`KubeletSpecs.kubernetes.talos.dev/kubelet`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KubeletSpec {
    pub image: String,
    pub args: Vec<String>,
    pub expected_nodename: String,
}

/// Machine stage (`MachineStatuses.runtime.talos.dev/machine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MachineStage {
    Unknown,
    Booting,
    Installing,
    Maintenance,
    Running,
    Rebooting,
    ShuttingDown,
    Resetting,
    Upgrading,
}

/// Machine status: booted and ready is `stage == Running && ready`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MachineStatus {
    pub stage: MachineStage,
    pub ready: bool,
    /// `(condition, reason)` pairs that keep the machine from being ready.
    pub unmet_conditions: Vec<(String, String)>,
}

/// What a node's COSI `runtime/SecurityStates.talos.dev/securitystate` says
/// (siderolabs/talos `pkg/machinery/resources/runtime/security_status.go`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecurityState {
    /// The node booted with UEFI SecureBoot enabled.
    pub secure_boot: bool,
}

/// A node's COSI `runtime/ImageFactorySchematics.runtime.talos.dev/image-factory-schematic`
/// (Talos >= 1.14; siderolabs/talos `internal/app/machined/pkg/controllers/runtime/
/// image_factory_schematic.go`): the schematic extension an Image Factory put into the node's
/// boot assets, with the factory's name and URL parsed from the extension's author
/// (`Image Factory (https://factory.talos.dev)`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FactorySchematic {
    pub schematic_id: String,
    /// `Image Factory`, `Omni`, … (the author's name).
    pub flavor: String,
    /// `https://factory.talos.dev`; empty when the author carried no URL.
    pub api_url: String,
}

impl FactorySchematic {
    /// The host (and port) of [`Self::api_url`]: where the factory serves its installer
    /// images (`<host>/<platform>-installer/<schematic>:<version>`). `None` without a URL.
    pub fn host(&self) -> Option<String> {
        let rest = self
            .api_url
            .strip_prefix("https://")
            .or_else(|| self.api_url.strip_prefix("http://"))
            .unwrap_or(&self.api_url);
        let host = rest.split(['/', '?', '#']).next().unwrap_or("");
        let host = host.rsplit('@').next().unwrap_or(host).to_ascii_lowercase();
        (!host.is_empty()).then_some(host)
    }
}

/// Arguments of a server-side health check (`ClusterService.HealthCheck`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheckSpec {
    /// How long the node may wait for the cluster to become healthy.
    pub wait_timeout: Duration,
    /// Control-plane node addresses; empty lets the node discover them.
    pub control_plane_nodes: Vec<String>,
    pub worker_nodes: Vec<String>,
}

impl Default for HealthCheckSpec {
    /// talosctl's default: wait up to 20 minutes, let the node discover the members.
    fn default() -> Self {
        HealthCheckSpec {
            wait_timeout: Duration::from_secs(20 * 60),
            control_plane_nodes: Vec::new(),
            worker_nodes: Vec::new(),
        }
    }
}

impl HealthCheckSpec {
    /// Discovered members, waiting at most `wait_timeout`.
    pub fn waiting(wait_timeout: Duration) -> HealthCheckSpec {
        HealthCheckSpec {
            wait_timeout,
            ..HealthCheckSpec::default()
        }
    }
}

/// Progress lines of a passed health check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthReport {
    pub messages: Vec<String>,
}

/// A COSI resource as read through `cosi.resource.State` (generic, low level).
#[derive(Clone, PartialEq, Eq)]
pub struct CosiResource {
    pub namespace: String,
    pub resource_type: String,
    pub id: String,
    pub version: String,
    pub phase: String,
    /// Protobuf spec bytes; may hold secrets (MachineConfig).
    pub proto_spec: Secret<Vec<u8>>,
    /// YAML rendering of the spec; may hold secrets.
    pub yaml_spec: Secret<String>,
}

impl fmt::Debug for CosiResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CosiResource")
            .field("namespace", &self.namespace)
            .field("resource_type", &self.resource_type)
            .field("id", &self.id)
            .field("version", &self.version)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> TalosVersion {
        TalosVersion::parse(s).unwrap()
    }

    #[test]
    fn upgrade_rpc_follows_the_running_version() {
        for (running, want) in [
            ("v1.11.6", UpgradeRpc::Legacy),
            ("v1.12.0", UpgradeRpc::Legacy),
            ("v1.12.9", UpgradeRpc::Legacy),
            ("v1.13.0-alpha.3", UpgradeRpc::Legacy),
            ("v1.13.0-beta.1", UpgradeRpc::Legacy),
            ("v1.13.0", UpgradeRpc::Lifecycle),
            ("v1.13.9", UpgradeRpc::Lifecycle),
            ("v1.14.0-rc.1", UpgradeRpc::Lifecycle),
            ("v1.14.2", UpgradeRpc::Lifecycle),
            ("v2.0.0", UpgradeRpc::Lifecycle),
        ] {
            assert_eq!(UpgradeRpc::for_running(&v(running)), want, "{running}");
        }
    }

    #[test]
    fn image_tags_and_versions() {
        let cases = [
            ("ghcr.io/siderolabs/installer:v1.13.9", Some("v1.13.9")),
            (
                "factory.talos.dev/metal-installer/3765679:v1.14.0-rc.1",
                Some("v1.14.0-rc.1"),
            ),
            ("localhost:5000/installer:v1.12.4", Some("v1.12.4")),
            ("localhost:5000/installer", None),
            (
                "ghcr.io/siderolabs/installer:v1.13.9@sha256:abcd",
                Some("v1.13.9"),
            ),
            ("ghcr.io/siderolabs/installer@sha256:abcd", None),
        ];
        for (img, tag) in cases {
            assert_eq!(image_tag(img), tag, "{img}");
        }
        let img = ImageRef::parse("ghcr.io/siderolabs/installer:v1.13.9").unwrap();
        assert_eq!(img.talos_version(), Some(v("v1.13.9")));
        assert_eq!(
            ImageRef::parse("ghcr.io/x/y:latest")
                .unwrap()
                .talos_version(),
            None
        );
        let err = ImageRef::parse("localhost:5000/installer")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no `:tag`"), "{err}");
        assert!(ImageRef::parse("a b:v1").is_err());
    }

    #[test]
    fn node_targets_are_single_values() {
        assert_eq!(NodeTarget::parse("10.5.0.2").unwrap().as_str(), "10.5.0.2");
        let err = NodeTarget::parse("10.5.0.2,10.5.0.3")
            .unwrap_err()
            .to_string();
        assert!(err.contains("one node per request"), "{err}");
        assert!(NodeTarget::parse("").is_err());
        assert!(NodeTarget::parse("a b").is_err());
    }

    #[test]
    fn outcome_says_who_reboots() {
        let installed = UpgradeOutcome::Installed {
            from: v("v1.13.0"),
            output: vec![],
        };
        assert!(installed.needs_reboot());
        assert_eq!(installed.rpc(), UpgradeRpc::Lifecycle);
        let legacy = UpgradeOutcome::Rebooting {
            from: v("v1.12.0"),
            ack: "Upgrade request received".into(),
            actor_id: "x".into(),
        };
        assert!(!legacy.needs_reboot());
        assert_eq!(legacy.rpc(), UpgradeRpc::Legacy);
    }

    #[test]
    fn machine_config_debug_is_redacted() {
        let mc = MachineConfig::from_yaml("machine:\n  token: secret-token\n");
        let dbg = format!("{mc:?}");
        assert!(!dbg.contains("secret-token"), "{dbg}");
    }
}
