//! The simulated cluster's state and its transitions. Everything here runs under one lock and
//! never waits; the gRPC layer (`server.rs`) does the waiting (pull delays, reboot timers).

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};
use tonic::Status;
use tonic::metadata::MetadataMap;

use super::fault::{ArmedFault, Effect, Method, NodeCounters, Occasion};
use super::machineconfig::{self, ConfigFacts, NodeConfigSpec};
use super::scenario::{NodeSpec, Role, Scenario, Timing};
use crate::sim::node::NodeFacts;
use crate::talos::{NODE_METADATA_KEY, NODES_METADATA_KEY};
use crate::version::TalosVersion;

pub mod boot;

/// Whether a node answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Power {
    Up,
    /// Away for a reboot; comes back on its own (timed) or through `complete_boot` (manual).
    Rebooting,
    /// Went down and never came back (fault `neverReturn`).
    Gone,
}

/// How a node boots, which decides what the Talos API can tell about its next boot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bootloader {
    /// UEFI with systemd-boot (Talos' default on UEFI): the installer writes the UKI
    /// `Talos-<version>.efi` and sets the EFI variable `LoaderEntryDefault` to it; the variable
    /// is readable through `MachineService.Read` of efivarfs.
    #[default]
    SdBoot,
    /// UEFI with systemd-boot, booted from a Talos disk image: sd-boot sets
    /// `LoaderEntrySelected`, but `LoaderEntryDefault` is absent until the first install writes
    /// it (siderolabs/talos `…/bootloader/sdboot/sdboot.go`, `ProbeWithCallback`).
    SdBootImage,
    /// GRUB (BIOS machines, older installs): the default entry lives on the BOOT partition,
    /// which is not mounted at runtime, so no API shows the next boot.
    Grub,
}

impl Bootloader {
    /// systemd-boot: its EFI variables are readable through efivarfs.
    pub fn sd_boot(self) -> bool {
        matches!(self, Bootloader::SdBoot | Bootloader::SdBootImage)
    }
}

/// How the boot in progress will end (decided when the reboot starts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BootPlan {
    never_return: bool,
    old_version: bool,
    /// Through the firmware (a power cycle, a crash, an operator's reset) rather than the
    /// kexec Talos' own reboots use: sd-boot runs and sets `LoaderEntrySelected`.
    firmware: bool,
}

/// Live TRY-mode apply, reverted unless superseded.
#[derive(Debug, Clone)]
pub(crate) struct TryApply {
    pub generation: u64,
    previous: Vec<u8>,
}

#[derive(Debug, Clone)]
pub(crate) struct SimNode {
    pub spec: NodeSpec,
    pub running: TalosVersion,
    /// The boot entry an upgrade wrote; the default for the next boot.
    pub installed: Option<TalosVersion>,
    /// The Image Factory schematic of the installer that wrote [`SimNode::installed`] (`None`:
    /// an installer without one, or the schematic without customizations): the system
    /// extensions the node boots with.
    pub installed_schematic: Option<String>,
    pub bootloader: Bootloader,
    /// systemd-boot's `LoaderEntryDefault` (a UKI name), absent on a disk-image node until its
    /// first install.
    pub loader_default: Option<String>,
    /// systemd-boot's `LoaderEntrySelected`: the UKI booted now.
    pub loader_selected: String,
    /// The installed entry is one the node's firmware refuses to boot (a non-SecureBoot
    /// installer on a SecureBoot machine, `registry::firmware_refuses`): its next boot never
    /// comes back.
    pub firmware_refuses_entry: bool,
    /// systemd-boot: the UKIs on the ESP (`EFI/Linux/Talos-*.efi`), see `boot.rs`.
    pub ukis: Vec<String>,
    /// GRUB: the default and booted labels and their kernels, see `boot.rs`.
    pub grub: boot::Grub,
    /// The current boot came through kexec (Talos' reboots, which set
    /// `LoaderEntryOneShot` = "kexec reboot" and `LoaderEntryRebootReason` = "reboot"), not
    /// through the firmware (the first boot, a power cycle).
    pub kexec_boot: bool,
    /// The boot in which a `LifecycleService` install is running (upstream's one-at-a-time
    /// lock, `s.lock.TryLock()` in `internal/app/lifecycle/lifecycle.go`): a second install or
    /// upgrade in that boot is refused. The lock lives in machined, so a reboot drops it.
    pub installing: Option<String>,
    /// The other boot slot (A/B): the version and UKI the node booted before its last switch
    /// of version, what `MachineService.Rollback` makes the default again. `None` on a fresh
    /// install.
    pub previous: Option<(TalosVersion, String)>,
    /// `MachineStatus` says `booting`, not ready, until then (after a boot).
    pub ready_at: Option<tokio::time::Instant>,
    /// Calls routed to the node answer `UNAVAILABLE` until then (after a boot), as an apid
    /// endpoint redials it with backoff.
    pub apid_at: Option<tokio::time::Instant>,
    /// Calls routed to the node answer `PermissionDenied` until then (after a boot into Talos
    /// >= 1.14, tuppr#453), once apid reaches it.
    pub authz_at: Option<tokio::time::Instant>,
    pub boot_id: String,
    /// Reboots started; also identifies the boot in progress.
    pub reboot_seq: u64,
    pub power: Power,
    pub boot_plan: BootPlan,
    pub etcd_healthy: bool,
    pub member_id: u64,
    /// Service id → forced health (tests); absent = derived.
    pub service_health: BTreeMap<String, bool>,
    pub config: Vec<u8>,
    pub config_version: u64,
    pub staged: Option<Vec<u8>>,
    pub try_apply: Option<TryApply>,
    pub images: BTreeSet<String>,
    /// Images pulled into the CRI namespace (`k8s.io`), where the kubelet finds pod images.
    pub cri_images: BTreeSet<String>,
    /// Every pull that completed, in order: (image, into the CRI namespace).
    pub pulls: Vec<(String, bool)>,
    /// Static pod component → the image it crash-loops with (`crashLoop` fault).
    pub crashing: BTreeMap<String, String>,
    /// Static pod component → `metadata.version` of its config resource
    /// (`APIServerConfigs.kubernetes.talos.dev` …, namespace `controlplane`); absent = 1.
    /// Bumped by every config change that changes the component's image.
    pub component_config_versions: BTreeMap<String, u64>,
    /// Static pod component → the config version its mirror pod was rendered from (its
    /// `talos.dev/config-version` annotation); absent = 1. Follows the component's config
    /// version when the kubelet restarts the pod, unless `staleConfigVersion` holds it.
    pub pod_config_versions: BTreeMap<String, u64>,
    pub counters: NodeCounters,
    /// META keys written through the API (`MetaWrite`), by tag.
    pub meta: BTreeMap<u8, Vec<u8>>,
}

/// How far the version of a raw config resource (`kube-apiserver`, …) runs ahead of its
/// `final-<component>` resource on a simulated Talos >= 1.14 control plane
/// ([`SimNode::final_config_version`]). Both are COSI per-resource counters kept in memory, so
/// both restart at every boot; upstream the distance depends on how many times each
/// controller's inputs arrived since boot. The one real report (talos#14258, v1.14.0) has the
/// raw counter ahead of the final one; any non-zero distance exercises a client that compares
/// with the wrong resource.
pub const RAW_CONFIG_VERSION_LEAD: u64 = 1;

impl SimNode {
    pub fn control_plane(&self) -> bool {
        self.spec.role == Role::Controlplane
    }

    /// Record a completed pull of `image` into the system or the CRI namespace.
    pub fn pulled(&mut self, image: &str, cri: bool) {
        if cri {
            self.cri_images.insert(image.to_string());
        } else {
            self.images.insert(image.to_string());
        }
        self.pulls.push((image.to_string(), cri));
    }

    /// The static pods that crash-loop with the image they run now.
    pub fn crash_looping(&self) -> BTreeSet<String> {
        let Some(f) = self.facts() else {
            return BTreeSet::new();
        };
        self.crashing
            .iter()
            .filter(|(c, img)| f.static_pod_images.get(*c) == Some(*img))
            .map(|(c, _)| c.clone())
            .collect()
    }

    pub fn facts(&self) -> Option<ConfigFacts> {
        facts_of(&self.config)
    }

    /// The version of `component`'s (raw) config resource: where the counter starts at boot
    /// (`1`; on Talos >= 1.14 [`RAW_CONFIG_VERSION_LEAD`] more, the raw controller having
    /// written its output more times than the final one), moved on by every image change.
    pub fn component_config_version(&self, component: &str) -> u64 {
        self.component_config_versions
            .get(component)
            .copied()
            .unwrap_or(if self.renders_from_final() {
                1 + RAW_CONFIG_VERSION_LEAD
            } else {
                1
            })
    }

    /// Whether the node renders its static pods from the `final-<component>` config resources
    /// (Talos >= 1.14: `ControlPlaneStaticPodController` reads `FinalAPIServerConfigID` …, and
    /// the pod's `talos.dev/config-version` is that resource's version;
    /// siderolabs/talos `internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go`,
    /// `internal/k8stemplates/{apiserver,controller-manager,scheduler}.go`).
    pub fn renders_from_final(&self) -> bool {
        self.running.minor_line() >= (1, 14)
    }

    /// The version of `component`'s `final-<component>` config resource (Talos >= 1.14). The
    /// transform controllers that write it and the raw one
    /// (`control_plane_final.go`, `control_plane.go`) each bump their own output's version only
    /// when its spec changes (cosi-project/runtime `pkg/state/wrap.go` `UpdateWithConflicts`
    /// skips an equal update), and the final one has inputs the raw one lacks (the
    /// `KubernetesRoot` secrets), so the two counters run apart (talos#14258). The simulator
    /// keeps the raw one [`RAW_CONFIG_VERSION_LEAD`] ahead, bumps both on every change of the
    /// component's image, and restarts both at every boot.
    pub fn final_config_version(&self, component: &str) -> u64 {
        self.component_config_version(component)
            .saturating_sub(RAW_CONFIG_VERSION_LEAD)
            .max(1)
    }

    /// Whether a change of the scheduler's config also re-renders the kube-apiserver's static
    /// pod (talos#14152): before Talos v1.14.0, `RenderConfigsStaticPodController` concatenates
    /// the `SchedulerConfig` version into `ConfigStatus.Version`, which
    /// `ControlPlaneStaticPodController` writes into the kube-apiserver pod's
    /// `talos.dev/config-file-version` annotation (siderolabs/talos
    /// `internal/app/machined/pkg/controllers/k8s/render_config_static_pods.go` and
    /// `control_plane_static_pod.go` at v1.12.11, v1.13.9, v1.14.0-rc.1). PR #14177 (commit
    /// c027a947f, between v1.14.0-rc.2 and v1.14.0) left the scheduler out. Whether 1.12.12 and
    /// 1.13.10 got the fix could not be verified: the simulator assumes they did not.
    pub fn apiserver_follows_scheduler_config(&self) -> bool {
        self.running < TalosVersion::new(1, 14, 0)
    }

    /// The version of the node's `ConfigStatuses.kubernetes.talos.dev/static-pods` resource:
    /// the versions of the admission and audit config resources (never changed by the
    /// simulator, so `1` each), of the authorization config (whose spec carries the
    /// kube-apiserver's image, `ControlPlaneAuthorizationController` in `control_plane.go`, so
    /// it moves with the kube-apiserver's config version) and, on the Talos versions of
    /// [`Self::apiserver_follows_scheduler_config`], the scheduler's config version (the final
    /// one on 1.14 pre-releases, which read `FinalSchedulerConfigID`), concatenated as upstream
    /// does. The optional authentication config (1.14) is absent in the simulator.
    pub fn config_status_version(&self) -> String {
        // the authorization config's own counter: from 1 at boot, moved by the kube-apiserver's
        // image changes (the raw counter without its lead on 1.14)
        let authorization = self.component_config_version("kube-apiserver")
            - if self.renders_from_final() {
                RAW_CONFIG_VERSION_LEAD
            } else {
                0
            };
        let mut v = format!("11{authorization}");
        if self.apiserver_follows_scheduler_config() {
            v.push_str(&self.rendered_config_version("kube-scheduler").to_string());
        }
        v
    }

    /// The version of the config resource the node renders `component`'s static pod from:
    /// the final one on Talos >= 1.14, else the raw one.
    fn rendered_config_version(&self, component: &str) -> u64 {
        if self.renders_from_final() {
            self.final_config_version(component)
        } else {
            self.component_config_version(component)
        }
    }

    /// The config version `component`'s mirror pod shows.
    pub fn pod_config_version(&self, component: &str) -> u64 {
        self.pod_config_versions
            .get(component)
            .copied()
            // rendered at boot from the counter's start: 1, raw or final
            .unwrap_or(1)
    }

    /// The machine config changed from `old`: bump the config resource version of each static
    /// pod whose image changed (Talos re-renders it) and return those components. The caller
    /// moves their mirror pods on ([`Self::restart_static_pod`]).
    pub fn bump_component_configs(&mut self, old: Option<&ConfigFacts>) -> Vec<String> {
        let new = self
            .facts()
            .map(|f| f.static_pod_images)
            .unwrap_or_default();
        let changed: Vec<String> = new
            .iter()
            .filter(|(c, img)| old.and_then(|o| o.static_pod_images.get(*c)) != Some(*img))
            .map(|(c, _)| c.clone())
            .collect();
        for c in &changed {
            let v = self.component_config_version(c) + 1;
            self.component_config_versions.insert(c.clone(), v);
        }
        changed
    }

    /// The kubelet restarted `component`'s static pod from its current config resource.
    pub fn restart_static_pod(&mut self, component: &str) {
        let v = self.rendered_config_version(component);
        self.pod_config_versions.insert(component.to_string(), v);
    }

    /// A config change the node takes without the apply path's faults (a staged config at
    /// boot, a TRY revert): config versions move on and the pods follow.
    fn config_replaced(&mut self, old: Option<&ConfigFacts>) {
        for c in self.bump_component_configs(old) {
            self.restart_static_pod(&c);
        }
    }

    /// What [`Self::kube_facts`] derives from: power state, reboots started and boots finished
    /// (the running version changes only at a boot), the config version (bumped by every
    /// change of the machine config), the mirror pods' config versions, the config resources'
    /// versions (the kube-apiserver's `config-file-version` follows the scheduler's) and the
    /// crash-loop faults.
    #[allow(clippy::type_complexity, reason = "a tuple to hash, never named")]
    fn facts_state(
        &self,
    ) -> (
        Power,
        u64,
        u64,
        u64,
        &BTreeMap<String, u64>,
        &BTreeMap<String, u64>,
        &BTreeMap<String, String>,
    ) {
        (
            self.power,
            self.reboot_seq,
            self.counters.boots,
            self.config_version,
            &self.pod_config_versions,
            &self.component_config_versions,
            &self.crashing,
        )
    }

    fn kube_facts(&self) -> NodeFacts {
        let facts = self.facts();
        NodeFacts {
            name: self.spec.name.clone(),
            address: self.spec.address.clone(),
            control_plane: self.control_plane(),
            up: self.power == Power::Up,
            talos_version: self.running.to_string(),
            kubelet_version: facts
                .as_ref()
                .and_then(|f| machineconfig::tag_version(&f.kubelet_image))
                .unwrap_or_default(),
            crash_looping: self.crash_looping(),
            static_pod_config_versions: facts
                .as_ref()
                .map(|f| {
                    f.static_pod_images
                        .keys()
                        .map(|c| (c.clone(), self.pod_config_version(c).to_string()))
                        .collect()
                })
                .unwrap_or_default(),
            // the kube-apiserver pod's `talos.dev/config-file-version` is the `ConfigStatus`
            // version Talos rendered it with (`control_plane_static_pod.go`)
            static_pod_config_file_versions: facts
                .as_ref()
                .filter(|f| f.static_pod_images.contains_key("kube-apiserver"))
                .map(|_| {
                    BTreeMap::from([("kube-apiserver".to_string(), self.config_status_version())])
                })
                .unwrap_or_default(),
            static_pod_images: facts.map(|f| f.static_pod_images).unwrap_or_default(),
            extensions: {
                let mut e = self.spec.extensions.clone();
                if let Some(s) = &self.spec.schematic {
                    e.insert("schematic".to_string(), s.clone());
                }
                e
            },
        }
    }
}

/// [`machineconfig::facts`], memoized by content: every kube-side request derives the nodes
/// from the configs, and parsing six of them per request dominated the simulator's latency in
/// debug builds, while configs change only on apply and boot.
fn facts_of(config: &[u8]) -> Option<ConfigFacts> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static MEMO: OnceLock<Mutex<HashMap<Vec<u8>, Option<ConfigFacts>>>> = OnceLock::new();
    let memo = MEMO.get_or_init(Default::default);
    if let Some(f) = memo.lock().unwrap_or_else(|p| p.into_inner()).get(config) {
        return f.clone();
    }
    let f = machineconfig::facts(config).ok();
    let mut m = memo.lock().unwrap_or_else(|p| p.into_inner());
    if m.len() >= 4096 {
        m.clear();
    }
    m.insert(config.to_vec(), f.clone());
    f
}

fn hex_id(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    let x = hex::encode(h.finalize());
    format!(
        "{}-{}-{}-{}-{}",
        &x[0..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..32]
    )
}

fn member_id(name: &str) -> u64 {
    let h = Sha256::digest(name.as_bytes());
    u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]])
}

/// A reboot the server must finish (after the delay, or never in manual mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RebootTicket {
    pub node: usize,
    pub seq: u64,
}

/// The whole simulated cluster.
#[derive(Debug)]
pub(crate) struct TalosSide {
    pub name: String,
    pub timing: Timing,
    /// The nodes; read through [`Self::nodes`], changed only through [`Self::node_mut`] (or
    /// [`Self::nodes_mut`]), which keeps the per-node digests of [`Self::node_fingerprints`]
    /// current.
    machines: Vec<SimNode>,
    /// The digest bookkeeping behind [`Self::facts_fingerprint`].
    digests: Digests,
    pub faults: Vec<ArmedFault>,
    /// Requests that carried the deprecated `nodes` key (all refused).
    pub nodes_metadata_rejections: u64,
    /// Unix seconds the simulation started (COSI timestamps, service events).
    pub started_unix: i64,
    /// Active etcd alarms (member id, alarm), cluster-wide as etcd keeps them.
    pub etcd_alarms: std::collections::BTreeSet<(u64, crate::sim::talos::scenario::EtcdAlarmKind)>,
    /// Which images the registries have (`sim::talos::registry`).
    pub registry: super::registry::Registry,
    /// The etcd leader's state: who leads, elections, forfeits ([`etcd::EtcdLeadership`]).
    pub etcd: etcd::EtcdLeadership,
    /// Node name → server-side drains started on it (the `drain` phase of the legacy
    /// `MachineService.Upgrade`'s sequence, [`Self::begin_server_drain`]); nodes never drained
    /// are absent. The kube side runs each drain once (`NodeSource::talos_drains`).
    pub server_drains: BTreeMap<String, u64>,
    actor_seq: u64,
    apply_generation: u64,
    /// Name or address → position in `nodes` of the first node with it ([`Self::find`]);
    /// names, addresses and the node list are fixed after [`Self::new`] (whatever changes
    /// them calls [`Self::reindex`]).
    index: std::collections::HashMap<String, usize>,
}

/// Per-node digests of [`SimNode::facts_state`], kept current by [`TalosSide::node_mut`]: a
/// changed node is re-hashed when the digests are next read, so reading them costs O(nodes
/// changed) instead of hashing every node per request.
#[derive(Debug, Default)]
struct Digests {
    /// Bumped whenever a node's digest changes (and by [`TalosSide::reindex`]).
    generation: u64,
    /// The generation [`TalosSide::reindex`] last ran at: which nodes exist, and their
    /// names, may have changed then.
    rebuilt_at: u64,
    /// Per node (as `machines`): its digest and the generation it last changed at.
    per_node: Vec<(u64, u64)>,
    /// Nodes handed out by [`TalosSide::node_mut`] since the digests were last settled.
    touched: Vec<usize>,
    /// (generation, node) of every digest change after `log_from`, oldest first.
    log: Vec<(u64, usize)>,
    /// The changes up to this generation are no longer in `log`.
    log_from: u64,
}

/// How many digest changes [`Digests::log`] keeps beyond one per node before it drops the older
/// half (a reader that far behind reads every node again).
const DIGEST_LOG_SLACK: usize = 4096;

fn digest_of(n: &SimNode) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    n.facts_state().hash(&mut h);
    h.finish()
}

pub(crate) fn unavailable_node(node: &str) -> Status {
    Status::unavailable(format!(
        "connection error: desc = \"transport: Error while dialing: dial tcp {node}:50000: connect: connection refused\""
    ))
}

impl TalosSide {
    pub fn new(scenario: &Scenario, ca_pem: &str, started_unix: i64) -> TalosSide {
        let endpoint = scenario
            .nodes
            .iter()
            .find(|n| n.role == Role::Controlplane)
            .map(|n| n.address.clone())
            .unwrap_or_default();
        let nodes = scenario
            .nodes
            .iter()
            .map(|spec| {
                let config = machineconfig::generate(&NodeConfigSpec {
                    cluster_name: &scenario.cluster_name,
                    hostname: &spec.name,
                    address: &spec.address,
                    control_plane: spec.role == Role::Controlplane,
                    endpoint: &endpoint,
                    talos: &spec.talos,
                    kubernetes: &spec.kubernetes,
                    ca_pem,
                    extra: scenario.machine_config_extra(spec),
                    installer: &spec.config_installer(&spec.talos),
                    install_config: spec.install_config,
                })
                .into_bytes();
                SimNode {
                    spec: spec.clone(),
                    running: spec.talos.clone(),
                    installed: None,
                    installed_schematic: None,
                    firmware_refuses_entry: false,
                    bootloader: Bootloader::default(),
                    loader_default: Some(format!("Talos-{}.efi", spec.talos)),
                    loader_selected: format!("Talos-{}.efi", spec.talos),
                    ukis: vec![format!("Talos-{}.efi", spec.talos)],
                    grub: boot::Grub::fresh(&spec.talos),
                    kexec_boot: false,
                    installing: None,
                    previous: None,
                    ready_at: None,
                    apid_at: None,
                    authz_at: None,
                    boot_id: hex_id(&[&spec.name, "boot", "0"]),
                    reboot_seq: 0,
                    power: Power::Up,
                    boot_plan: BootPlan::default(),
                    etcd_healthy: true,
                    member_id: member_id(&spec.name),
                    service_health: BTreeMap::new(),
                    config,
                    config_version: 1,
                    staged: None,
                    try_apply: None,
                    images: BTreeSet::new(),
                    cri_images: BTreeSet::new(),
                    pulls: Vec::new(),
                    crashing: BTreeMap::new(),
                    component_config_versions: BTreeMap::new(),
                    pod_config_versions: BTreeMap::new(),
                    counters: NodeCounters::default(),
                    meta: BTreeMap::new(),
                }
            })
            .collect();
        let mut c = TalosSide {
            name: scenario.cluster_name.clone(),
            timing: scenario.timing,
            machines: nodes,
            digests: Digests::default(),
            faults: Vec::new(),
            nodes_metadata_rejections: 0,
            started_unix,
            etcd_alarms: Default::default(),
            registry: super::registry::Registry::of(scenario),
            etcd: etcd::EtcdLeadership::default(),
            server_drains: BTreeMap::new(),
            actor_seq: 0,
            apply_generation: 0,
            index: Default::default(),
        };
        c.reindex();
        c.etcd.leader = scenario
            .etcd_leader
            .as_deref()
            .and_then(|name| c.nodes().iter().find(|n| n.spec.name == name))
            .or_else(|| c.nodes().iter().find(|n| n.control_plane()))
            .map(|n| n.member_id);
        for f in &scenario.faults {
            c.faults.push(ArmedFault::new(f.clone()));
        }
        c
    }

    /// Every node, in scenario order.
    pub fn nodes(&self) -> &[SimNode] {
        &self.machines
    }

    /// Node `idx`, to change: the node's digest is re-checked when the digests are next read.
    pub fn node_mut(&mut self, idx: usize) -> &mut SimNode {
        self.digests.touched.push(idx);
        &mut self.machines[idx]
    }

    /// Every node, to change (tests).
    #[cfg(test)]
    pub fn nodes_mut(&mut self) -> &mut Vec<SimNode> {
        self.digests.touched.extend(0..self.machines.len());
        &mut self.machines
    }

    /// Bring the digests of the nodes changed since the last call up to date.
    fn settle(&mut self) {
        let d = &mut self.digests;
        if d.per_node.len() != self.machines.len() {
            d.generation += 1;
            d.rebuilt_at = d.generation;
            d.per_node = self
                .machines
                .iter()
                .map(|n| (digest_of(n), d.generation))
                .collect();
            d.touched.clear();
            d.log.clear();
            d.log_from = d.generation;
        }
        for idx in std::mem::take(&mut d.touched) {
            let now = digest_of(&self.machines[idx]);
            if d.per_node[idx].0 != now {
                d.generation += 1;
                d.per_node[idx] = (now, d.generation);
                d.log.push((d.generation, idx));
            }
        }
        if d.log.len() > self.machines.len() + DIGEST_LOG_SLACK {
            let drop = d.log.len() / 2;
            d.log_from = d.log[drop - 1].0;
            d.log.drain(..drop);
        }
        debug_assert!(
            self.machines
                .iter()
                .zip(&d.per_node)
                .all(|(n, (digest, _))| digest_of(n) == *digest),
            "a node changed without node_mut: its digest is stale"
        );
    }

    /// A node by name or address: the first node (in `nodes` order) with that name or
    /// address. Every Talos RPC routes through this, so it is an index lookup, not a scan.
    pub fn find(&self, key: &str) -> Option<usize> {
        let i = *self.index.get(key)?;
        debug_assert_eq!(Some(i), self.find_linear(key), "stale node index");
        Some(i)
    }

    /// [`Self::find`] by scanning every node (the reference the index must equal).
    fn find_linear(&self, key: &str) -> Option<usize> {
        self.nodes()
            .iter()
            .position(|n| n.spec.name == key || n.spec.address == key)
    }

    /// Rebuild [`Self::find`]'s index after the node list, a name or an address changed.
    pub(crate) fn reindex(&mut self) {
        // which nodes exist may have changed: every digest is taken again
        self.digests.per_node.clear();
        self.index.clear();
        for (i, n) in self.machines.iter().enumerate() {
            for key in [&n.spec.name, &n.spec.address] {
                self.index.entry(key.clone()).or_insert(i);
            }
        }
    }

    /// The node answering requests without `node` metadata (the endpoint's own node: the first
    /// control plane).
    fn endpoint_node(&self) -> usize {
        self.nodes()
            .iter()
            .position(SimNode::control_plane)
            .unwrap_or(0)
    }

    /// Route a request the way apid does, then apply injected `UNAVAILABLE` and count it.
    pub fn admit(&mut self, md: &MetadataMap, method: Method) -> Result<usize, Status> {
        if md.get_all(NODES_METADATA_KEY).iter().next().is_some() {
            self.nodes_metadata_rejections += 1;
            return Err(Status::invalid_argument(format!(
                "one-2-many proxying is not supported for method {}",
                method.grpc_path()
            )));
        }
        let values: Vec<_> = md.get_all(NODE_METADATA_KEY).iter().collect();
        if values.len() > 1 {
            return Err(Status::invalid_argument(
                "node metadata must be single-valued",
            ));
        }
        let idx = match values.first() {
            None => self.endpoint_node(),
            Some(v) => {
                let key = v.to_str().unwrap_or_default();
                self.find(key).ok_or_else(|| unavailable_node(key))?
            }
        };
        let node = &self.nodes()[idx];
        if node.power != Power::Up {
            let addr = node.spec.address.clone();
            *self
                .node_mut(idx)
                .counters
                .refused
                .entry(method)
                .or_default() += 1;
            return Err(unavailable_node(&addr));
        }
        if node
            .apid_at
            .is_some_and(|at| tokio::time::Instant::now() < at)
        {
            // the node is back, but the endpoint's connection to it is still in its dial
            // backoff (grpc-go's default backoff capped at 15 s by apid)
            let addr = node.spec.address.clone();
            *self
                .node_mut(idx)
                .counters
                .refused
                .entry(method)
                .or_default() += 1;
            return Err(unavailable_node(&addr));
        }
        if node
            .authz_at
            .is_some_and(|at| tokio::time::Instant::now() < at)
        {
            // a 1.14 node just booted: apid answers `PermissionDenied` for a while (tuppr#453)
            *self
                .node_mut(idx)
                .counters
                .refused
                .entry(method)
                .or_default() += 1;
            return Err(Status::permission_denied("not authorized"));
        }
        if self
            .fire(idx, Occasion::Call(method), |e| {
                matches!(e, Effect::Unavailable { .. })
            })
            .is_some()
        {
            *self
                .node_mut(idx)
                .counters
                .refused
                .entry(method)
                .or_default() += 1;
            return Err(Status::unavailable(format!(
                "connection error: desc = \"error reading server preface: EOF\" (injected for {})",
                self.nodes()[idx].spec.name
            )));
        }
        *self.node_mut(idx).counters.calls.entry(method).or_default() += 1;
        Ok(idx)
    }

    /// Offer an occasion to the faults of node `idx` that want it; return the first that fires.
    pub fn fire(
        &mut self,
        idx: usize,
        o: Occasion,
        wants: impl Fn(&Effect) -> bool,
    ) -> Option<Effect> {
        let (name, addr) = (
            self.nodes()[idx].spec.name.clone(),
            self.nodes()[idx].spec.address.clone(),
        );
        let mut fired = None;
        for f in self
            .faults
            .iter_mut()
            .filter(|f| f.plan.node == name || f.plan.node == addr)
        {
            if let Some(e) = f.observe(o, &wants)
                && fired.is_none()
            {
                fired = Some(e);
            }
        }
        fired
    }

    pub fn next_actor_id(&mut self, idx: usize) -> String {
        self.actor_seq += 1;
        hex_id(&[
            &self.nodes()[idx].spec.name,
            "actor",
            &self.actor_seq.to_string(),
        ])
    }

    /// The installer `image` wrote `target`'s boot entry and made it the default (both RPCs),
    /// removing or overwriting entries as the node's bootloader does upstream
    /// ([`SimNode::install_boot_entry`], `boot.rs`). The entry carries the installer's
    /// schematic, so its system extensions: an installer without the node's schematic strips
    /// them at the next boot (an Image Factory installer image bakes the schematic's extensions
    /// into what it installs; the default installer has none). The simulator knows no
    /// schematic's contents: a different schematic boots without extensions. `Err`: the
    /// bootloader's failure (the installer exits non-zero), nothing written.
    pub fn install_entry(
        &mut self,
        idx: usize,
        target: TalosVersion,
        image: &str,
    ) -> Result<(), String> {
        let n = self.node_mut(idx);
        n.install_boot_entry(&target)?;
        n.firmware_refuses_entry = super::registry::firmware_refuses(&n.spec, image);
        n.installed_schematic = crate::image::schematic_of(image)
            .filter(|s| *s != crate::image::EMPTY_SCHEMATIC)
            .map(str::to_string);
        Ok(())
    }

    /// `MachineService.Rollback`'s bootloader part (siderolabs/talos
    /// `internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go` `Rollback`, then
    /// `…/bootloader/sdboot/sdboot.go` `revert` and `…/bootloader/grub/revert.go`): make
    /// another entry the default boot entry ([`SimNode::revert_boot_entry`]). A second call
    /// flips it back. No other entry: the bootloader's error, returned raw (gRPC `Unknown`).
    pub fn revert_boot_entry(&mut self, idx: usize) -> Result<(), Status> {
        self.node_mut(idx)
            .revert_boot_entry()
            .map_err(Status::unknown)
    }

    /// Whether `MachineStatus` says running and ready (a boot's settling time has passed).
    pub fn machine_ready(&self, idx: usize) -> bool {
        self.nodes()[idx]
            .ready_at
            .is_none_or(|at| tokio::time::Instant::now() >= at)
    }

    /// The legacy `MachineService.Upgrade` of `idx` drains its node before it goes down
    /// (siderolabs/talos `v1alpha1_sequencer.go` `Upgrade`, phase `drain`,
    /// `CordonAndDrainNode`): counted here, evicted by the kube side at its next pass. The
    /// caller begins the node's reboot in the same critical section, which moves the facts'
    /// fingerprint, so the kube side does not skip that pass.
    pub fn begin_server_drain(&mut self, idx: usize) {
        let name = self.nodes()[idx].spec.name.clone();
        *self.server_drains.entry(name).or_insert(0) += 1;
    }

    /// The node goes down for a reboot. The returned ticket finishes the boot.
    pub fn begin_reboot(&mut self, idx: usize) -> RebootTicket {
        let never_return = self
            .fire(idx, Occasion::Boot, |e| matches!(e, Effect::NeverReturn))
            .is_some();
        let old_version = self
            .fire(idx, Occasion::Boot, |e| matches!(e, Effect::BootOldVersion))
            .is_some();
        // a leader going down: the other members elect one of them
        self.etcd_member_down(idx);
        let n = self.node_mut(idx);
        // a boot of an entry the firmware refuses stops there (`registry::firmware_refuses`)
        let never_return = never_return || (n.installed.is_some() && n.firmware_refuses_entry);
        n.reboot_seq += 1;
        n.power = Power::Rebooting;
        n.boot_plan = BootPlan {
            never_return,
            old_version,
            firmware: false,
        };
        RebootTicket {
            node: idx,
            seq: n.reboot_seq,
        }
    }

    /// The reboot of `idx` just begun goes through the firmware (a power cycle, a crash, an
    /// operator's reset) instead of Talos' kexec: sd-boot picks the entry and sets
    /// `LoaderEntrySelected`, and the next install's probe sees no kexec.
    pub fn through_firmware(&mut self, idx: usize) {
        self.node_mut(idx).boot_plan.firmware = true;
    }

    /// Finish the boot of `ticket` (no-op if another reboot superseded it or the node is up).
    pub fn finish_boot(&mut self, ticket: RebootTicket) {
        let timing = self.timing;
        let n = self.node_mut(ticket.node);
        if n.reboot_seq != ticket.seq || n.power != Power::Rebooting {
            return;
        }
        if n.boot_plan.never_return {
            n.power = Power::Gone;
            return;
        }
        // the next entry boots; a failed boot of a new entry falls back to the booted one,
        // which Talos makes the default again (`sdboot.go`, `Revert`)
        let schematic = n.installed_schematic.take();
        if n.boot_next_entry(n.boot_plan.old_version) && schematic != n.spec.schematic {
            n.spec.extensions.clear();
            n.spec.schematic = schematic;
        }
        n.kexec_boot = !n.boot_plan.firmware;
        let now = tokio::time::Instant::now();
        n.ready_at = Some(now + timing.machine_ready);
        n.apid_at = Some(now + timing.apid_redial);
        // Talos 1.14 reboots through a window where apid refuses the client's role (tuppr#453)
        n.authz_at = (n.running.minor_line() >= (1, 14))
            .then(|| now + timing.apid_redial + timing.apid_permission_denied);
        if let Some(staged) = n.staged.take() {
            let old = n.facts();
            n.config = staged;
            n.config_version += 1;
            n.config_replaced(old.as_ref());
        }
        n.try_apply = None;
        // COSI resources live in memory: every config resource's counter starts again, and the
        // static pods are rendered from them anew (from the `final-*` ones on Talos >= 1.14)
        n.component_config_versions.clear();
        for c in n
            .facts()
            .map(|f| f.static_pod_images)
            .unwrap_or_default()
            .into_keys()
        {
            n.restart_static_pod(&c);
        }
        n.counters.boots += 1;
        n.boot_id = hex_id(&[&n.spec.name, "boot", &n.reboot_seq.to_string()]);
        n.boot_plan = BootPlan::default();
        n.power = Power::Up;
    }

    /// Start a TRY apply generation; the server reverts it after the timeout.
    pub fn next_apply_generation(&mut self) -> u64 {
        self.apply_generation += 1;
        self.apply_generation
    }

    pub fn start_try(&mut self, idx: usize, generation: u64, previous: Vec<u8>) {
        self.node_mut(idx).try_apply = Some(TryApply {
            generation,
            previous,
        });
    }

    /// Revert a TRY apply that was not superseded.
    pub fn revert_try(&mut self, idx: usize, generation: u64) {
        let n = self.node_mut(idx);
        if let Some(t) = &n.try_apply
            && t.generation == generation
        {
            let old = n.facts();
            n.config = t.previous.clone();
            n.config_version += 1;
            n.try_apply = None;
            n.config_replaced(old.as_ref());
        }
    }

    /// Facts for the kube side.
    pub fn facts(&self) -> Vec<NodeFacts> {
        let mut out: Vec<NodeFacts> = self.nodes().iter().map(SimNode::kube_facts).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The control-plane nodes' facts for the kube side, sorted by name.
    pub fn control_plane_facts(&self) -> Vec<NodeFacts> {
        let mut out: Vec<NodeFacts> = self
            .nodes()
            .iter()
            .filter(|n| n.control_plane())
            .map(SimNode::kube_facts)
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// One node's facts for the kube side (by name or address).
    pub fn node_facts(&self, name: &str) -> Option<NodeFacts> {
        self.find(name).map(|i| self.nodes()[i].kube_facts())
    }

    /// A value that changes whenever [`Self::facts`] would: a generation bumped whenever a
    /// node's digest of everything its facts derive from changes (its power state, reboots
    /// started and boots finished, config version, mirror pods' config versions and
    /// crash-loop faults; names, addresses and roles never change after [`Self::new`]).
    /// O(nodes changed since the last call), not O(nodes).
    pub fn facts_fingerprint(&mut self) -> u64 {
        self.settle();
        self.digests.generation
    }

    /// Each node's name and a digest of what its [`NodeFacts`] derive from (the per-node part
    /// of [`Self::facts_fingerprint`]), sorted by name: the kube side re-derives only the
    /// nodes whose digest changed.
    pub fn node_fingerprints(&mut self) -> Vec<(String, u64)> {
        self.settle();
        let mut out: Vec<(String, u64)> = self
            .machines
            .iter()
            .zip(&self.digests.per_node)
            .map(|(n, (digest, _))| (n.spec.name.clone(), *digest))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// [`Self::node_fingerprints`] of only the nodes whose digest changed after generation
    /// `since` of [`Self::facts_fingerprint`], sorted by name; `None` when the node list was
    /// rebuilt since (the caller then reads every node).
    pub fn node_fingerprints_since(&mut self, since: u64) -> Option<Vec<(String, u64)>> {
        self.settle();
        let d = &self.digests;
        if since < d.rebuilt_at || since < d.log_from || since > d.generation {
            return None;
        }
        let first = d.log.partition_point(|(g, _)| *g <= since);
        let changed: BTreeSet<usize> = d.log[first..].iter().map(|(_, i)| *i).collect();
        let mut out: Vec<(String, u64)> = changed
            .into_iter()
            .map(|i| (self.machines[i].spec.name.clone(), d.per_node[i].0))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Some(out)
    }

    /// Service id → (state, healthy) for an up node.
    ///
    /// A system extension's service is listed too once a test gives it a health
    /// ([`crate::sim::talos::SimTalos::set_service_health`] with an `ext-<name>` id: Talos names
    /// extension services so, `internal/app/machined/pkg/system/services/extension.go` `ID`).
    /// It does not count for `MachineStatus` readiness, which looks only at the node's own
    /// services (`internal/app/machined/pkg/controllers/runtime/machine_status.go`).
    pub fn services(&self, idx: usize) -> Vec<(String, bool)> {
        let n = &self.nodes()[idx];
        let mut ids: Vec<String> = ["apid", "containerd", "cri", "kubelet", "machined", "udevd"]
            .into_iter()
            .map(str::to_string)
            .collect();
        if n.control_plane() {
            ids.extend(["etcd".to_string(), "trustd".to_string()]);
        }
        ids.extend(
            n.service_health
                .keys()
                .filter(|id| id.starts_with("ext-"))
                .cloned(),
        );
        ids.sort_unstable();
        ids.into_iter()
            .map(|id| {
                let default = if id == "etcd" { n.etcd_healthy } else { true };
                let healthy = n.service_health.get(&id).copied().unwrap_or(default);
                (id, healthy)
            })
            .collect()
    }

    /// Control-plane nodes' etcd members (the membership does not change while a node reboots).
    pub fn etcd_members(&self) -> Vec<&SimNode> {
        self.nodes().iter().filter(|n| n.control_plane()).collect()
    }

    /// Run the server-side health checks once: `(check, Ok | Err(reason))` in order, stopping
    /// at the first failure (talosctl runs them sequentially).
    pub fn health_checks(
        &self,
        control_planes: &[String],
        workers: &[String],
    ) -> Vec<(String, Result<(), String>)> {
        let pick = |keys: &[String], cp: bool| -> Result<Vec<&SimNode>, String> {
            if keys.is_empty() {
                return Ok(self
                    .nodes()
                    .iter()
                    .filter(|n| n.control_plane() == cp)
                    .collect());
            }
            keys.iter()
                .map(|k| {
                    self.find(k)
                        .map(|i| &self.nodes()[i])
                        .ok_or_else(|| format!("node {k:?} is not part of the cluster"))
                })
                .collect()
        };
        let mut out = Vec::new();
        let (cps, ws) = match (pick(control_planes, true), pick(workers, false)) {
            (Ok(c), Ok(w)) => (c, w),
            (Err(e), _) | (_, Err(e)) => {
                out.push(("discovered nodes".to_string(), Err(e)));
                return out;
            }
        };
        let all: Vec<&SimNode> = cps.iter().chain(ws.iter()).copied().collect();
        let down = |ns: &[&SimNode]| -> Option<String> {
            ns.iter()
                .find(|n| n.power != Power::Up)
                .map(|n| format!("node {:?} is not reachable", n.spec.address))
        };
        let checks: Vec<(&str, Option<String>)> = vec![
            (
                "etcd to be healthy",
                down(&cps).or_else(|| {
                    cps.iter().find(|n| !n.etcd_healthy).map(|n| {
                        format!("service \"etcd\" not healthy on node {:?}", n.spec.address)
                    })
                }),
            ),
            ("etcd members to be consistent across nodes", down(&cps)),
            ("etcd members to be control plane nodes", None),
            ("apid to be ready", down(&all)),
            (
                "kubelet to be healthy",
                cps.iter()
                    .find(|n| n.service_health.get("kubelet") == Some(&false))
                    .map(|n| {
                        format!(
                            "service \"kubelet\" not healthy on node {:?}",
                            n.spec.address
                        )
                    }),
            ),
            ("all nodes to finish boot sequence", down(&all)),
        ];
        for (name, problem) in checks {
            let failed = problem.is_some();
            out.push((name.to_string(), problem.map_or(Ok(()), Err)));
            if failed {
                break;
            }
        }
        out
    }
}

pub mod etcd;
#[cfg(test)]
mod tests;
