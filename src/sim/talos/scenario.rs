//! Scenario files: the simulated cluster, its timing and its faults, as YAML.
//!
//! ```yaml
//! clusterName: home
//! timing:
//!   reboot: 2s           # how long a node is away when rebooting; `manual` = until a test boots it
//!   imagePull: 500ms     # how long an image pull takes
//!   podStart: 3s         # kube side: how long a (re)scheduled pod takes to become Ready
//!   podTermination: 1s   # kube side: how long an evicted pod stays Terminating
//! nodes:
//!   - { name: cp-1, address: 127.5.0.2, role: controlplane, talos: v1.12.11, kubernetes: v1.34.1 }
//!   - { name: w-1,  address: 127.5.0.5, role: worker,       talos: v1.12.11, kubernetes: v1.34.1,
//!       platform: aws, extensions: { iscsi-tools: v0.1.6 } }   # optional: default metal, none
//! faults:
//!   - node: cp-1
//!     on: { call: { method: upgrade, nth: 1 } }
//!     effect: { upgradeExit: { code: 1, message: "disk full" } }
//! workloads:             # read by the simulated kube-apiserver, not by the Talos side
//!   - { name: web, namespace: default, replicas: 3, pdbMinAvailable: 2 }
//! machineConfigExtra:    # kept byte for byte in every node's machine config (see MachineConfigExtra)
//!   machine: |
//!     sysctls: {vm.overcommit_memory: off}
//! kubeFaults:            # kube-apiserver faults, active from the start (see design/sim.md)
//!   - pdbNeverAllows: { namespace: default, pdb: web-pdb }
//!   - apiUnavailable: { requests: 3 }      # or { for: 30s }
//!   - nodeNeverReady: { node: w-1 }
//!   - forbidden: { verb: create, resource: pods/eviction }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use super::fault::{FaultError, FaultPlan, duration_text};
use crate::version::{KubeVersion, TalosVersion};

/// The cluster `medea sim` runs without `--scenario`: cluster `home` (the name and node names of
/// `examples/home`), 3 control planes and 3 workers on an older Talos (v1.12.11, an older 1.12
/// patch, so the first upgrade takes the legacy RPC) and Kubernetes v1.34.1 — `examples/home`
/// asks for v1.14.6 / v1.35.8, two Talos hops (v1.13.10 on the legacy RPC, v1.14.6 on the
/// lifecycle path) and one Kubernetes minor — with a 3-replica workload guarded by a PDB (minAvailable 2). Reboots take
/// 2 s, pulls 500 ms, pods 3 s to become Ready and 1 s to terminate.
pub const DEFAULT_SCENARIO: &str = r#"# medea sim default scenario
clusterName: home
timing:
  reboot: 2s
  imagePull: 500ms
  podStart: 3s
  podTermination: 1s
  machineReady: 2s
  apidRedial: 1s
  apidPermissionDenied: 1s
nodes:
  - { name: cp-1, address: 127.5.0.2, role: controlplane, talos: v1.12.11, kubernetes: v1.34.1 }
  - { name: cp-2, address: 127.5.0.3, role: controlplane, talos: v1.12.11, kubernetes: v1.34.1 }
  - { name: cp-3, address: 127.5.0.4, role: controlplane, talos: v1.12.11, kubernetes: v1.34.1 }
  - { name: w-1, address: 127.5.0.5, role: worker, talos: v1.12.11, kubernetes: v1.34.1 }
  - { name: w-2, address: 127.5.0.6, role: worker, talos: v1.12.11, kubernetes: v1.34.1 }
  - { name: w-3, address: 127.5.0.7, role: worker, talos: v1.12.11, kubernetes: v1.34.1 }
faults: []
workloads:
  - { name: web, namespace: default, replicas: 3, pdbMinAvailable: 2 }
kubeFaults: []
"#;

/// Why a scenario was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("failed to read scenario `{path}`")]
    Read {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("scenario `{path}` is not valid")]
    Parse {
        path: PathBuf,
        #[source]
        err: Box<serde_saphyr::Error>,
    },
    #[error("scenario `{path}`: {problem}")]
    Invalid { path: PathBuf, problem: String },
    #[error("scenario `{path}`")]
    Fault {
        path: PathBuf,
        #[source]
        err: FaultError,
    },
}

/// A node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Controlplane,
    Worker,
}

/// One simulated node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    /// Kubernetes node name and hostname.
    pub name: String,
    /// The address apid routes `node` metadata to (talosctl's `--nodes`).
    pub address: String,
    pub role: Role,
    /// The Talos version it boots.
    pub talos: TalosVersion,
    /// The Kubernetes version of its kubelet (and control-plane static pods).
    pub kubernetes: KubeVersion,
    /// Extra text for this node's machine config (replaces the scenario's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_config_extra: Option<MachineConfigExtra>,
    /// The platform `MachineService.Version` reports (`platform.name`); default `metal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    /// The Image Factory schematic id the node was installed from (published on its Node as
    /// the annotation `extensions.talos.dev/schematic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schematic: Option<String>,
    /// System extensions, name → version (published on its Node as
    /// `extensions.talos.dev/<name>`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub extensions: std::collections::BTreeMap<String, String>,
    /// The node booted with UEFI SecureBoot (COSI `SecurityState.secureBoot`): it boots only
    /// what a SecureBoot installer wrote (`sim::talos::registry`). Default `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secure_boot: bool,
    /// The registry host of the Image Factory that built the node (published as
    /// `ImageFactorySchematic.apiUrl` from Talos 1.14 when the node has a `schematic`); the
    /// simulator's registry serves its installers. Default `factory.talos.dev`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_factory: Option<String>,
    /// Where the node's machine config keeps its installer: `v1alpha1` (`machine.install.image`,
    /// the default) or `unattendedInstallConfig` (a Talos 1.14 `UnattendedInstallConfig`
    /// document, `installer.image`).
    #[serde(default, skip_serializing_if = "InstallConfig::is_default")]
    pub install_config: InstallConfig,
}

/// Which document of a node's machine config names its installer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum InstallConfig {
    /// `machine.install.image` of the v1alpha1 document (what talosctl <= 1.13 generates).
    #[default]
    V1alpha1,
    /// `installer.image` of an `UnattendedInstallConfig` document (Talos 1.14,
    /// `pkg/machinery/config/types/runtime/unattended_install.go`); the v1alpha1 document then
    /// has no `machine.install` (the two conflict upstream).
    UnattendedInstallConfig,
}

impl InstallConfig {
    fn is_default(&self) -> bool {
        *self == InstallConfig::V1alpha1
    }
}

impl NodeSpec {
    /// The installer keys of a node: a schematic is 64 lowercase hex digits, the factory a
    /// registry host, and the `UnattendedInstallConfig` document exists from Talos 1.14.
    fn validate_installer(&self) -> Result<(), String> {
        if let Some(s) = &self.schematic
            && crate::image::schematic_of(&format!("x.y/installer/{s}")) != Some(s.as_str())
        {
            return Err(format!(
                "node `{}`: schematic `{s}` is not an Image Factory schematic id (64 lowercase hex digits)",
                self.name
            ));
        }
        if let Some(h) = &self.image_factory {
            let ok = !h.is_empty()
                && (h.contains('.') || h.contains(':'))
                && h.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.:".contains(&b));
            if !ok {
                return Err(format!(
                    "node `{}`: imageFactory `{h}` must be a registry host such as `factory.example.org` or `factory.local:5000` (no scheme, no path)",
                    self.name
                ));
            }
        }
        if self.install_config == InstallConfig::UnattendedInstallConfig
            && self.talos.minor_line() < (1, 14)
        {
            return Err(format!(
                "node `{}`: `installConfig: unattendedInstallConfig` needs Talos 1.14 or later (the node runs {})",
                self.name, self.talos
            ));
        }
        Ok(())
    }

    /// The Image Factory host of the node ([`Self::image_factory`], else `factory.talos.dev`).
    pub fn factory_host(&self) -> &str {
        self.image_factory
            .as_deref()
            .unwrap_or(crate::image::DEFAULT_FACTORY)
    }

    /// The installer image the node's generated machine config names for `talos`: below 1.14
    /// `ghcr.io/siderolabs/installer:<talos>` (what talosctl <= 1.13 wrote, `pkg/images/images.go`
    /// at v1.13.9), from 1.14 the node's Image Factory installer (`pkg/images/images.go` at
    /// HEAD, `InstallerImage`).
    pub fn config_installer(&self, talos: &TalosVersion) -> String {
        if talos.minor_line() < (1, 14) {
            return format!("{}:{talos}", crate::image::GHCR_INSTALLER);
        }
        format!(
            "{}/{}-installer{}/{}:{talos}",
            self.factory_host(),
            self.platform.as_deref().unwrap_or("metal"),
            if self.secure_boot { "-secureboot" } else { "" },
            self.schematic
                .as_deref()
                .unwrap_or(crate::image::EMPTY_SCHEMATIC)
        )
    }
}

/// Text added to a node's generated machine config, kept byte for byte as written, so a
/// scenario can carry what real configurations hold (`permissions: 0644`, `off` strings,
/// anchors, comments, more documents) and a test can compare what the node was sent.
///
/// ```yaml
/// machineConfigExtra:
///   machine: |          # keys under `machine:` (indented by two spaces for you)
///     files:
///       - {path: /var/etc/a, permissions: 0644, op: create, content: x}
///     sysctls:
///       vm.overcommit: off
///   cluster: |          # keys under `cluster:`
///     allowSchedulingOnControlPlanes: no
///   documents: |        # documents after the v1alpha1 one (each starts with `---`)
///     ---
///     apiVersion: v1alpha1
///     kind: SideroLinkConfig
///     apiUrl: https://siderolink.example/?jointoken=off
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineConfigExtra {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<String>,
}

/// How long a rebooting node is away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebootTiming {
    /// Back after this long (zero: as soon as the reboot is acknowledged).
    After(Duration),
    /// Away until the test calls `SimTalos::complete_boot`.
    Manual,
}

impl<'de> Deserialize<'de> for RebootTiming {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.trim() == "manual" {
            return Ok(RebootTiming::Manual);
        }
        crate::duration::Duration::parse_lenient(&s)
            .map(|d| RebootTiming::After(d.get()))
            .map_err(serde::de::Error::custom)
    }
}

impl Serialize for RebootTiming {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RebootTiming::Manual => s.serialize_str("manual"),
            RebootTiming::After(d) => duration_text::serialize(d, s),
        }
    }
}

/// Simulated timing. Everything defaults to zero so tests run instantly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Timing {
    #[serde(default = "zero_reboot")]
    pub reboot: RebootTiming,
    #[serde(default, with = "duration_text")]
    pub image_pull: Duration,
    /// How long `LifecycleService.Upgrade` (Talos >= 1.13) runs the installer before it
    /// writes the boot entry and answers its exit code: upstream's install writes the UKI to
    /// the ESP and updates the bootloader while the call streams its output
    /// (`internal/app/lifecycle/lifecycle.go`).
    #[serde(default, with = "duration_text")]
    pub install: Duration,
    /// Interval between re-checks of a failing server-side health check.
    #[serde(default = "health_poll", with = "duration_text")]
    pub health_poll: Duration,
    /// Kube side: time a newly created or rescheduled pod needs to become Running and Ready.
    #[serde(default, with = "duration_text")]
    pub pod_start: Duration,
    /// Kube side: time an evicted or deleted pod stays Terminating.
    #[serde(default, with = "duration_text")]
    pub pod_termination: Duration,
    /// After a boot, how long `MachineStatus` stays `booting` and not ready (services and the
    /// Kubernetes node may already look fine): Talos reaches `running`+ready only when every
    /// readiness condition holds (`internal/app/machined/pkg/controllers/runtime/machine_status.go`).
    #[serde(default, with = "duration_text")]
    pub machine_ready: Duration,
    /// After a boot, how long calls routed to the node answer `UNAVAILABLE`: the endpoint apid's
    /// connection to it redials with backoff (grpc-go's default, max delay 15 s,
    /// `internal/app/apid/pkg/backend/apid.go`).
    #[serde(default, with = "duration_text")]
    pub apid_redial: Duration,
    /// After a boot into Talos >= 1.14, how long calls routed to the node answer
    /// `PermissionDenied` "not authorized" once apid reaches it (home-operations/tuppr#453: 1.14
    /// reboots through a window where apid refuses the client's role; its verification failed
    /// on it ~20 s after the installer succeeded). Upstream does not say how long the window
    /// lasts: default 1 s, enough for every client to meet it after each reboot.
    #[serde(default = "apid_permission_denied", with = "duration_text")]
    pub apid_permission_denied: Duration,
    /// Kube side: how long a CSI volume takes to detach once no pod on its node uses it (its
    /// VolumeAttachment stays, marked deleted, meanwhile). Default 2 s: unlike the other
    /// delays not zero, as no CSI driver detaches at once.
    #[serde(default = "volume_detach", with = "duration_text")]
    pub volume_detach: Duration,
}

fn zero_reboot() -> RebootTiming {
    RebootTiming::After(Duration::ZERO)
}
fn health_poll() -> Duration {
    Duration::from_millis(50)
}
fn volume_detach() -> Duration {
    Duration::from_secs(2)
}
fn apid_permission_denied() -> Duration {
    Duration::from_secs(1)
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            reboot: zero_reboot(),
            image_pull: Duration::ZERO,
            install: Duration::ZERO,
            health_poll: health_poll(),
            pod_start: Duration::ZERO,
            pod_termination: Duration::ZERO,
            machine_ready: Duration::ZERO,
            apid_redial: Duration::ZERO,
            apid_permission_denied: apid_permission_denied(),
            volume_detach: volume_detach(),
        }
    }
}

/// A replicated workload for the kube side of the simulator (carried, not used, by the Talos side).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadSpec {
    pub name: String,
    #[serde(default = "default_ns")]
    pub namespace: String,
    pub replicas: u32,
    /// A PodDisruptionBudget with this `minAvailable`, if set.
    #[serde(default)]
    pub pdb_min_available: Option<u32>,
}

/// A kube-apiserver fault active from the start (carried, not used, by the Talos side; the
/// simulated cluster turns each into a `sim::kube::KubeFault`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum KubeFaultSpec {
    /// Every eviction this PodDisruptionBudget guards is refused (429).
    PdbNeverAllows { namespace: String, pdb: String },
    /// The apiserver answers 503 for a number of requests or for a while.
    ApiUnavailable(OutageSpec),
    /// The node reports `Ready=False` whatever the Talos side says.
    NodeNeverReady { node: String },
    /// The user of the kubeconfig may not do `verb` on `resource` (`nodes`, `pods/eviction`,
    /// `poddisruptionbudgets.policy`; or a path such as `/metrics`): requests get 403, access
    /// reviews say no.
    Forbidden { verb: String, resource: String },
    /// The node reports a pressure condition (`MemoryPressure`, `DiskPressure`, `PIDPressure`)
    /// as `True`, with the kubelet's reason and message and the matching taint.
    NodePressure { node: String, condition: String },
    /// The containers of every pod of a Job in `namespace` whose name starts with `jobPrefix`
    /// exit with `exitCode` (1–255): a Job (a blocking hook) that fails.
    #[serde(rename_all = "camelCase")]
    JobPodExit {
        #[serde(default = "default_ns")]
        namespace: String,
        job_prefix: String,
        exit_code: i32,
    },
    /// The VolumeAttachments of `node` never finish detaching: the CSI driver's
    /// `ControllerUnpublishVolume` never returns, so each stays (deletionTimestamp set) until
    /// the fault is cleared.
    DetachNeverCompletes { node: String },
}

/// How long an `apiUnavailable` fault lasts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum OutageSpec {
    /// The next `n` requests.
    Requests(u32),
    /// Every request for this long from the start.
    For(#[serde(with = "duration_text")] Duration),
}

/// The node conditions a `nodePressure` kube fault may raise.
pub const PRESSURE_CONDITIONS: &[&str] = &["MemoryPressure", "DiskPressure", "PIDPressure"];

/// The verbs a `forbidden` kube fault may name (the apiserver's request verbs).
pub const KUBE_VERBS: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

fn default_ns() -> String {
    "default".to_string()
}

fn default_cluster_name() -> String {
    "medea-sim".to_string()
}

/// A whole simulated cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    #[serde(default = "default_cluster_name")]
    pub cluster_name: String,
    #[serde(default)]
    pub timing: Timing,
    pub nodes: Vec<NodeSpec>,
    #[serde(default)]
    pub faults: Vec<FaultPlan>,
    #[serde(default)]
    pub workloads: Vec<WorkloadSpec>,
    #[serde(default)]
    pub kube_faults: Vec<KubeFaultSpec>,
    /// Extra machine-config text for every node without its own
    /// ([`NodeSpec::machine_config_extra`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_config_extra: Option<MachineConfigExtra>,
    /// etcd alarms active from the start (`{node: cp-1, alarm: NOSPACE}`: the member of that
    /// control-plane node raised it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub etcd_alarms: Vec<EtcdAlarmSpec>,
    /// The control-plane node whose etcd member leads at the start (default: the first
    /// control-plane node). etcd elects another when it goes down or forfeits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_leader: Option<String>,
    /// How long the talosconfig's client certificate is valid from the start (default one
    /// year, as Talos issues them): a short-lived credential.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "optional_duration_text"
    )]
    pub client_cert_valid_for: Option<Duration>,
}

/// An etcd alarm of a scenario.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdAlarmSpec {
    /// The control-plane node whose member raised it.
    pub node: String,
    pub alarm: EtcdAlarmKind,
}

/// etcd's alarm types (`etcdserverpb.AlarmType`, Talos `EtcdMemberAlarm.AlarmType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum EtcdAlarmKind {
    /// The database exceeded its space quota: etcd refuses writes.
    Nospace = 1,
    /// A corruption check found members that disagree.
    Corrupt = 2,
}

mod optional_duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::duration_text::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        #[derive(Deserialize)]
        struct W(#[serde(with = "super::duration_text")] Duration);
        Ok(Option::<W>::deserialize(d)?.map(|W(d)| d))
    }
}

impl Scenario {
    /// Parse and validate scenario YAML; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Scenario, ScenarioError> {
        let s: Scenario = serde_saphyr::from_str(text).map_err(|err| ScenarioError::Parse {
            path: origin.to_path_buf(),
            err: Box::new(err),
        })?;
        s.validate(origin)?;
        Ok(s)
    }

    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|err| ScenarioError::Read {
            path: path.to_path_buf(),
            err,
        })?;
        Scenario::parse(&text, path)
    }

    /// The documented default cluster ([`DEFAULT_SCENARIO`]).
    pub fn default_cluster() -> Scenario {
        // A constant known to be valid (tested).
        Scenario::parse(DEFAULT_SCENARIO, Path::new("<default scenario>"))
            .unwrap_or_else(|e| unreachable!("the built-in scenario is valid: {e}"))
    }

    /// A cluster of `control_planes` + `workers` nodes, all on the same versions, zero timing.
    pub fn uniform(
        control_planes: usize,
        workers: usize,
        talos: TalosVersion,
        kubernetes: KubeVersion,
    ) -> Scenario {
        let mut nodes = Vec::new();
        for i in 0..control_planes + workers {
            let cp = i < control_planes;
            let name = if cp {
                format!("cp-{}", i + 1)
            } else {
                format!("w-{}", i - control_planes + 1)
            };
            nodes.push(NodeSpec {
                name,
                // 127.5.0.2, 127.5.0.3, …: loopback, one /16, so fleets of thousands fit
                address: format!("127.5.{}.{}", (i + 2) / 256, (i + 2) % 256),
                role: if cp { Role::Controlplane } else { Role::Worker },
                talos: talos.clone(),
                kubernetes: kubernetes.clone(),
                machine_config_extra: None,
                platform: None,
                schematic: None,
                extensions: std::collections::BTreeMap::new(),
                secure_boot: false,
                image_factory: None,
                install_config: InstallConfig::V1alpha1,
            });
        }
        Scenario {
            cluster_name: default_cluster_name(),
            timing: Timing::default(),
            nodes,
            faults: Vec::new(),
            workloads: Vec::new(),
            kube_faults: Vec::new(),
            machine_config_extra: None,
            etcd_alarms: Vec::new(),
            etcd_leader: None,
            client_cert_valid_for: None,
        }
    }

    /// The machine-config extra of `node`: its own, else the scenario's.
    pub fn machine_config_extra<'a>(
        &'a self,
        node: &'a NodeSpec,
    ) -> Option<&'a MachineConfigExtra> {
        node.machine_config_extra
            .as_ref()
            .or(self.machine_config_extra.as_ref())
    }

    /// Check names, addresses and faults.
    pub fn validate(&self, origin: &Path) -> Result<(), ScenarioError> {
        let invalid = |problem: String| ScenarioError::Invalid {
            path: origin.to_path_buf(),
            problem,
        };
        if self.nodes.is_empty() {
            return Err(invalid(
                "`nodes` is empty; a cluster needs at least one control-plane node".into(),
            ));
        }
        if !self.nodes.iter().any(|n| n.role == Role::Controlplane) {
            return Err(invalid("no node has `role: controlplane`".into()));
        }
        let mut seen = std::collections::BTreeSet::new();
        for n in &self.nodes {
            let ok_name = !n.name.is_empty()
                && n.name.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'
                });
            if !ok_name {
                return Err(invalid(format!(
                    "node name `{}` must be a DNS label (lowercase letters, digits, `-`, `.`)",
                    n.name
                )));
            }
            let Ok(ip) = n.address.parse::<std::net::IpAddr>() else {
                return Err(invalid(format!(
                    "node `{}`: address `{}` is not an IP address",
                    n.name, n.address
                )));
            };
            if !is_simulator_address(ip) {
                return Err(invalid(format!(
                    "node `{}`: address `{}` is not on loopback. The simulator serves every \
                     address it reports (each control plane's kube-apiserver, etcd and Talos \
                     endpoints) on this machine, and medea dials the addresses a cluster \
                     reports, so a node's address must be in 127.0.0.0/8 (for example \
                     127.5.0.2); Linux answers the whole /8 on `lo`",
                    n.name, n.address
                )));
            }
            for key in [&n.name, &n.address] {
                if !seen.insert(key.clone()) {
                    return Err(invalid(format!("`{key}` is used by two nodes")));
                }
            }
            n.validate_installer().map_err(invalid)?;
            if let Some(extra) = self.machine_config_extra(n) {
                let config =
                    super::machineconfig::generate(&super::machineconfig::NodeConfigSpec {
                        cluster_name: &self.cluster_name,
                        hostname: &n.name,
                        address: &n.address,
                        control_plane: n.role == Role::Controlplane,
                        endpoint: &n.address,
                        talos: &n.talos,
                        kubernetes: &n.kubernetes,
                        ca_pem: "",
                        extra: Some(extra),
                        installer: &n.config_installer(&n.talos),
                        install_config: n.install_config,
                    });
                if let Err(e) = super::machineconfig::facts(config.as_bytes()) {
                    return Err(invalid(format!(
                        "node `{}`: `machineConfigExtra` does not give a valid machine config ({e}); `machine` and `cluster` hold keys of those sections, `documents` whole documents",
                        n.name
                    )));
                }
            }
        }
        let mut workloads = std::collections::BTreeSet::new();
        for w in &self.workloads {
            if !workloads.insert((w.namespace.as_str(), w.name.as_str())) {
                return Err(invalid(format!(
                    "workload `{}/{}` is listed twice",
                    w.namespace, w.name
                )));
            }
        }
        for a in &self.etcd_alarms {
            if !self
                .nodes
                .iter()
                .any(|n| n.name == a.node && n.role == Role::Controlplane)
            {
                return Err(invalid(format!(
                    "etcd alarm names node `{}`, which is not a control-plane node in `nodes`",
                    a.node
                )));
            }
        }
        if let Some(leader) = &self.etcd_leader
            && !self
                .nodes
                .iter()
                .any(|n| &n.name == leader && n.role == Role::Controlplane)
        {
            return Err(invalid(format!(
                "`etcdLeader` names `{leader}`, which is not a control-plane node in `nodes`"
            )));
        }
        for f in &self.kube_faults {
            match f {
                KubeFaultSpec::NodeNeverReady { node }
                    if !self.nodes.iter().any(|n| &n.name == node) =>
                {
                    return Err(invalid(format!(
                        "kube fault `nodeNeverReady` names node `{node}`, which is not in `nodes`"
                    )));
                }
                KubeFaultSpec::Forbidden { verb, resource } => {
                    if !KUBE_VERBS.contains(&verb.as_str()) {
                        return Err(invalid(format!(
                            "kube fault `forbidden`: verb `{verb}` is not one of {}",
                            KUBE_VERBS.join(", ")
                        )));
                    }
                    // the one non-resource URL whose RBAC the simulator models
                    let path = resource == "/metrics" && verb == "get";
                    if resource.is_empty() || (resource.starts_with(['.', '/']) && !path) {
                        return Err(invalid(format!(
                            "kube fault `forbidden`: resource `{resource}` must be like `nodes`, `pods/eviction` or `poddisruptionbudgets.policy` (or `/metrics` with verb `get`)"
                        )));
                    }
                }
                KubeFaultSpec::NodePressure { node, condition } => {
                    if !self.nodes.iter().any(|n| &n.name == node) {
                        return Err(invalid(format!(
                            "kube fault `nodePressure` names node `{node}`, which is not in `nodes`"
                        )));
                    }
                    if !PRESSURE_CONDITIONS.contains(&condition.as_str()) {
                        return Err(invalid(format!(
                            "kube fault `nodePressure`: condition `{condition}` is not one of {}",
                            PRESSURE_CONDITIONS.join(", ")
                        )));
                    }
                }
                KubeFaultSpec::JobPodExit { exit_code, .. } if !(1..=255).contains(exit_code) => {
                    return Err(invalid(format!(
                        "kube fault `jobPodExit`: exitCode {exit_code} is not a failing exit code (1-255)"
                    )));
                }
                KubeFaultSpec::DetachNeverCompletes { node }
                    if !self.nodes.iter().any(|n| &n.name == node) =>
                {
                    return Err(invalid(format!(
                        "kube fault `detachNeverCompletes` names node `{node}`, which is not in `nodes`"
                    )));
                }
                _ => {}
            }
        }
        for f in &self.faults {
            if !self
                .nodes
                .iter()
                .any(|n| n.name == f.node || n.address == f.node)
            {
                return Err(ScenarioError::Fault {
                    path: origin.to_path_buf(),
                    err: FaultError::UnknownNode {
                        node: f.node.clone(),
                        known: self
                            .nodes
                            .iter()
                            .map(|n| n.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    },
                });
            }
            f.validate().map_err(|err| ScenarioError::Fault {
                path: origin.to_path_buf(),
                err,
            })?;
        }
        Ok(())
    }
}

/// Whether the simulator may give a node this address: IPv4 loopback (127.0.0.0/8), which
/// this machine serves on `lo` and nothing off it can answer. Nothing the simulator reports
/// can then make a client dial another host.
pub fn is_simulator_address(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_scenario_is_three_plus_three_on_older_versions() {
        let s = Scenario::default_cluster();
        let cps = s
            .nodes
            .iter()
            .filter(|n| n.role == Role::Controlplane)
            .count();
        assert_eq!((cps, s.nodes.len() - cps), (3, 3));
        assert!(
            s.nodes
                .iter()
                .all(|n| n.talos == TalosVersion::parse("v1.12.11").unwrap()
                    && n.kubernetes == KubeVersion::parse("v1.34.1").unwrap())
        );
        assert_eq!(s.cluster_name, "home");
        let names: Vec<&str> = s.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["cp-1", "cp-2", "cp-3", "w-1", "w-2", "w-3"]);
        assert_eq!(s.timing.pod_start, Duration::from_secs(3));
        // as hostile as a real node coming back: booting before ready, apid redialing
        assert_eq!(s.timing.machine_ready, Duration::from_secs(2));
        assert_eq!(s.timing.apid_redial, Duration::from_secs(1));
        assert!(s.kube_faults.is_empty());
        assert_eq!(s.workloads[0].pdb_min_available, Some(2));
        assert_eq!(s.timing.reboot, RebootTiming::After(Duration::from_secs(2)));
    }

    #[test]
    fn bad_scenarios_say_what_is_wrong() {
        let p = Path::new("s.yaml");
        let cases = [
            ("nodes: []", "at least one control-plane"),
            (
                "nodes: [{name: w-1, address: 127.0.0.1, role: worker, talos: v1.13.0, kubernetes: v1.34.1}]",
                "controlplane",
            ),
            (
                "nodes: [{name: cp-1, address: 10.5.0.2, role: controlplane, talos: v1.13.0, kubernetes: v1.34.1}]",
                "node `cp-1`: address `10.5.0.2` is not on loopback",
            ),
            (
                "nodes: [{name: cp-1, address: \"::1\", role: controlplane, talos: v1.13.0, kubernetes: v1.34.1}]",
                "must be in 127.0.0.0/8",
            ),
            (
                "nodes: [{name: cp-1, address: nope, role: controlplane, talos: v1.13.0, kubernetes: v1.34.1}]",
                "not an IP address",
            ),
            (
                "nodes: [{name: cp-1, address: 127.0.0.1, role: controlplane, talos: v1.13.0, kubernetes: v1.34.1},\n        {name: cp-1, address: 127.0.0.2, role: controlplane, talos: v1.13.0, kubernetes: v1.34.1}]",
                "used by two nodes",
            ),
        ];
        for (yaml, want) in cases {
            let err = Scenario::parse(yaml, p).unwrap_err().to_string();
            assert!(err.contains(want), "{yaml}: {err}");
        }
        let err = Scenario::parse(
            "nodes: [{name: cp-1, address: 127.0.0.1, role: controlplane, talos: 1.13, kubernetes: v1.34.1}]",
            p,
        )
        .unwrap_err();
        assert!(matches!(err, ScenarioError::Parse { .. }), "{err}");
        let err = Scenario::parse(
            "nodes: [{name: cp-1, address: 127.0.0.1, role: controlplane, talos: v1.13.0, kubernetes: v1.34.1}]\nfaults: [{node: cp-9, on: {boot: {}}, effect: neverReturn}]",
            p,
        )
        .unwrap_err();
        assert!(
            matches!(
                &err,
                ScenarioError::Fault {
                    err: FaultError::UnknownNode { .. },
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn preflight_knobs_parse_and_are_checked() {
        let p = Path::new("s.yaml");
        let nodes = "nodes: [{name: cp-1, address: 127.0.0.1, role: controlplane, talos: v1.13.0, kubernetes: v1.34.1}, {name: w-1, address: 127.0.0.2, role: worker, talos: v1.13.0, kubernetes: v1.34.1}]\n";
        let s = Scenario::parse(
            &format!(
                "{nodes}etcdAlarms: [{{node: cp-1, alarm: NOSPACE}}]\nclientCertValidFor: 2h\nkubeFaults:\n  - nodePressure: {{ node: w-1, condition: MemoryPressure }}\n  - forbidden: {{ verb: get, resource: /metrics }}\n"
            ),
            p,
        )
        .unwrap();
        assert_eq!(
            s.etcd_alarms,
            [EtcdAlarmSpec {
                node: "cp-1".into(),
                alarm: EtcdAlarmKind::Nospace
            }]
        );
        assert_eq!(s.client_cert_valid_for, Some(Duration::from_secs(7200)));
        assert_eq!(s.kube_faults.len(), 2);
        let err = Scenario::parse(
            &format!("{nodes}etcdAlarms: [{{node: w-1, alarm: CORRUPT}}]\n"),
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("not a control-plane node"), "{err}");
        let err = Scenario::parse(
            &format!("{nodes}etcdAlarms: [{{node: cp-1, alarm: FULL}}]\n"),
            p,
        )
        .unwrap_err();
        assert!(matches!(err, ScenarioError::Parse { .. }), "{err}");
    }

    #[test]
    fn kube_faults_parse_and_are_checked() {
        let p = Path::new("s.yaml");
        let nodes = "nodes: [{name: cp-1, address: 127.0.0.1, role: controlplane, talos: v1.13.0, kubernetes: v1.34.1}]\n";
        let s = Scenario::parse(
            &format!(
                "{nodes}timing: {{ podStart: 1s }}\nkubeFaults:\n  - pdbNeverAllows: {{ namespace: default, pdb: web-pdb }}\n  - apiUnavailable: {{ requests: 3 }}\n  - apiUnavailable: {{ for: 30s }}\n  - nodeNeverReady: {{ node: cp-1 }}\n  - forbidden: {{ verb: create, resource: pods/eviction }}\n"
            ),
            p,
        )
        .unwrap();
        assert_eq!(
            s.kube_faults,
            [
                KubeFaultSpec::PdbNeverAllows {
                    namespace: "default".into(),
                    pdb: "web-pdb".into()
                },
                KubeFaultSpec::ApiUnavailable(OutageSpec::Requests(3)),
                KubeFaultSpec::ApiUnavailable(OutageSpec::For(Duration::from_secs(30))),
                KubeFaultSpec::NodeNeverReady {
                    node: "cp-1".into()
                },
                KubeFaultSpec::Forbidden {
                    verb: "create".into(),
                    resource: "pods/eviction".into()
                },
            ]
        );
        assert_eq!(s.timing.pod_start, Duration::from_secs(1));
        for (fault, want) in [
            ("nodeNeverReady: { node: w-9 }", "not in `nodes`"),
            (
                "forbidden: { verb: drain, resource: nodes }",
                "is not one of",
            ),
            ("forbidden: { verb: get, resource: /x }", "must be like"),
            (
                "forbidden: { verb: list, resource: /metrics }",
                "must be like",
            ),
            (
                "nodePressure: { node: w-9, condition: DiskPressure }",
                "not in `nodes`",
            ),
            (
                "nodePressure: { node: cp-1, condition: Hungry }",
                "is not one of",
            ),
        ] {
            let err = Scenario::parse(&format!("{nodes}kubeFaults: [{{ {fault} }}]\n"), p)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{fault}: {err}");
        }
        let err =
            Scenario::parse(&format!("{nodes}kubeFaults: [{{ crash: {{}} }}]\n"), p).unwrap_err();
        assert!(matches!(err, ScenarioError::Parse { .. }), "{err}");
        let err = Scenario::parse(
            &format!("{nodes}workloads: [{{name: a, replicas: 1}}, {{name: a, replicas: 2}}]\n"),
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("listed twice"), "{err}");
    }

    #[test]
    fn machine_config_extras_are_kept_as_written() {
        let text = "nodes:\n  - { name: cp-1, address: 127.5.0.2, role: controlplane, talos: v1.13.9, kubernetes: v1.34.1 }\n  - name: w-1\n    address: 127.5.0.5\n    role: worker\n    talos: v1.13.9\n    kubernetes: v1.34.1\n    machineConfigExtra: { machine: \"sysctls: {a: on}\\n\" }\nmachineConfigExtra:\n  machine: |\n    files:\n      - path: /var/etc/a   # comment\n        permissions: 0644\n  cluster: |\n    allowSchedulingOnControlPlanes: off\n  documents: |\n    apiVersion: v1alpha1\n    kind: SideroLinkConfig\n    apiUrl: https://x/?jointoken=off\n";
        let s = Scenario::parse(text, Path::new("s.yaml")).unwrap();
        let cp = s.machine_config_extra(&s.nodes[0]).unwrap();
        assert!(cp.machine.as_deref().unwrap().contains("permissions: 0644"));
        let w = s.machine_config_extra(&s.nodes[1]).unwrap();
        assert_eq!(
            w.machine.as_deref(),
            Some("sysctls: {a: on}\n"),
            "a node's own wins"
        );
        let config =
            super::super::machineconfig::generate(&super::super::machineconfig::NodeConfigSpec {
                cluster_name: "c",
                hostname: "cp-1",
                address: "127.5.0.2",
                control_plane: true,
                endpoint: "127.5.0.2",
                talos: &s.nodes[0].talos,
                kubernetes: &s.nodes[0].kubernetes,
                ca_pem: "",
                extra: Some(cp),
                installer: "ghcr.io/siderolabs/installer:v1.13.9",
                install_config: InstallConfig::V1alpha1,
            });
        assert!(config.contains("\n  files:\n    - path: /var/etc/a   # comment\n      permissions: 0644\ncluster:\n"), "{config}");
        assert!(config.contains("\n  allowSchedulingOnControlPlanes: off\n---\napiVersion: v1alpha1\nkind: SideroLinkConfig\n"), "{config}");
        assert!(config.ends_with("apiUrl: https://x/?jointoken=off\n"));

        let bad = text.replace("permissions: 0644", "permissions: [0644");
        let e = Scenario::parse(&bad, Path::new("s.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("node `cp-1`: `machineConfigExtra`"), "{e}");
    }

    #[test]
    fn manual_reboot_timing_parses() {
        let s = Scenario::parse(
            "timing: { reboot: manual }\nnodes: [{name: cp-1, address: 127.0.0.1, role: controlplane, talos: v1.13.0, kubernetes: v1.34.1}]",
            Path::new("s.yaml"),
        )
        .unwrap();
        assert_eq!(s.timing.reboot, RebootTiming::Manual);
        assert_eq!(s.timing.image_pull, Duration::ZERO);
    }
}
