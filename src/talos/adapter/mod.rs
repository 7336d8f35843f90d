//! [`TalosAdapter`]: [`TalosPort`] over the Talos machine API client.
//!
//! One port call is one client call or a short fixed sequence of them (a node observation is
//! `Version`, `Read boot_id`, COSI `MachineStatus`, `ServiceList` and `Read LoaderEntryDefault`).
//! Retries of read-only calls happen inside the client (`talos::retry`); the adapter only sorts
//! the final errors into transient and failed.

use std::collections::BTreeMap;
use std::path::Path;

use prost::Message as _;
use tonic::Code;

mod machine_config;

pub use self::machine_config::{check_only_image_changed, set_component_image_in};
use crate::error_chain;
use crate::metrics::timed;
use crate::rollout::ports::{
    Component, ComponentArgs, ComponentImages, Detail, EtcdHealth, EtcdMember, ImageNamespace,
    MachineStage, Manifest, NextBoot, NodeTarget, PortError, SnapshotInfo, SnapshotStreamed,
    TalosNode, TalosPort, UpgradeMethod,
};
use crate::talos::{
    self, ApplyOptions, ImageRef, MachineConfig, PullNamespace, TalosApi, TalosClient, TalosError,
};
use crate::version::TalosVersion;

/// The talosconfig's file name inside a cluster's credentials directory.
pub const TALOSCONFIG_FILE: &str = "talosconfig";

/// systemd-boot's `LoaderEntryDefault` variable (vendor GUID `4a67b082-…`, Talos'
/// `efivarfs.ScopeSystemd`) as efivarfs exposes it. The Talos installer sets it to the UKI it
/// wrote (`Talos-<version>.efi`), so on a UEFI node booting through systemd-boot it names what
/// the next boot runs. GRUB nodes have no such file.
pub const LOADER_ENTRY_DEFAULT: &str =
    "/sys/firmware/efi/efivars/LoaderEntryDefault-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";

/// systemd-boot's `LoaderEntrySelected`: the entry it booted this time. A node booted from a
/// Talos disk image has only this one until its first install writes `LoaderEntryDefault`
/// (siderolabs/talos `internal/app/machined/pkg/runtime/v1alpha1/bootloader/sdboot/sdboot.go`,
/// `ProbeWithCallback`).
pub const LOADER_ENTRY_SELECTED: &str =
    "/sys/firmware/efi/efivars/LoaderEntrySelected-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";

const API: &str = "talos";

/// The Talos side of one cluster.
#[derive(Debug)]
pub struct TalosAdapter {
    client: TalosClient,
    /// `client` without retries, for the executor's node and etcd observations: the sequencer
    /// treats a transient failure as "poll again" within its own deadlines, so client retries
    /// there only delayed every decision of a wave by the backoff (about 8 s by default) while
    /// one of its nodes rebooted.
    observer: TalosClient,
}

/// Why a machine configuration could not be read or patched. Never quotes the configuration:
/// it holds the cluster's secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MachineConfigError {
    #[error("the machine configuration is not valid YAML{}", at(*line, *column))]
    Yaml {
        line: Option<u64>,
        column: Option<u64>,
    },
    #[error("the machine configuration has no v1alpha1 document (`version: v1alpha1`)")]
    NoV1alpha1,
    #[error("`{path}` in the machine configuration is not a mapping")]
    NotAMapping { path: String },
    #[error("`{image}` is not an image reference medea writes into a machine configuration")]
    BadImage { image: String },
    #[error("`{path}` in the machine configuration cannot be edited in place: {reason}")]
    NotEditable { path: String, reason: &'static str },
    #[error(
        "refusing to apply the patched machine configuration: document {document} differs at `{path}`, not only in the image; nothing was applied"
    )]
    UnexpectedChange { document: usize, path: String },
    #[error(
        "refusing to apply the patched machine configuration: its text differs from the node's at line {line} beyond the image; nothing was applied"
    )]
    TextChange { line: usize },
}

fn at(line: Option<u64>, column: Option<u64>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" (line {l}, column {c})"),
        (Some(l), None) => format!(" (line {l})"),
        _ => String::new(),
    }
}

impl TalosAdapter {
    pub fn new(client: TalosClient) -> TalosAdapter {
        let observer = client.without_retries();
        TalosAdapter { client, observer }
    }

    pub fn client(&self) -> &TalosClient {
        &self.client
    }

    /// What the node boots next, from `LoaderEntryDefault` (see [`next_boot_from_efivar`]).
    /// Without it, a node that booted through systemd-boot (`LoaderEntrySelected` is set) was
    /// never installed over since its disk image was written: every Talos install sets
    /// `LoaderEntryDefault` (`sdboot.go`, `setup`), so the next boot is the entry booted now.
    /// Neither variable (GRUB, BIOS): cannot tell.
    async fn next_boot(
        &self,
        t: &talos::NodeTarget,
        n: &NodeTarget,
        running: &TalosVersion,
        loader_default: Option<Vec<u8>>,
    ) -> Result<NextBoot, PortError> {
        match loader_default {
            Some(bytes) => Ok(next_boot_from_efivar(&bytes, running)),
            None => match self.read_efivar(t, n, LOADER_ENTRY_SELECTED).await? {
                Some(bytes) => Ok(next_boot_from_efivar(&bytes, running)),
                None => Ok(NextBoot::Unknown),
            },
        }
    }

    /// An efivarfs file, or `None` when it does not exist or cannot be read by this role.
    async fn read_efivar(
        &self,
        t: &talos::NodeTarget,
        n: &NodeTarget,
        path: &str,
    ) -> Result<Option<Vec<u8>>, PortError> {
        let start = std::time::Instant::now();
        let outcome = match self.observer.read_file(t, path).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if file_absent(&e) || e.code() == Some(Code::PermissionDenied) => Ok(None),
            Err(e) => Err(classify_read("MachineService.Read", &n.node, e)),
        };
        crate::metrics::observe_call(API, "Read", start.elapsed(), outcome.is_ok());
        outcome
    }
}

/// The node's Talos API target: its address (what apid routes `node` metadata to), else its
/// name.
fn target(n: &NodeTarget) -> Result<talos::NodeTarget, PortError> {
    let value = if n.address.is_empty() {
        &n.node
    } else {
        &n.address
    };
    talos::NodeTarget::parse(value).map_err(|e| PortError::failed("address the node", &n.node, e))
}

/// Worth waiting out: the node or apid unreachable, a deadline, or a mutating call whose outcome
/// is open (the executor observes before it calls again).
fn is_transient(e: &TalosError) -> bool {
    match e {
        TalosError::Indeterminate { .. } | TalosError::Timeout { .. } => true,
        TalosError::Rpc { code, .. } => matches!(
            code,
            Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::Cancelled
        ),
        _ => false,
    }
}

fn classify(op: &'static str, node: &str, e: TalosError) -> PortError {
    if is_transient(&e) {
        PortError::transient(op, node, e)
    } else {
        PortError::failed(op, node, e)
    }
}

/// [`classify`] for a read-only call: `PermissionDenied` is transient too. After a reboot on
/// Talos 1.14 apid answers `PermissionDenied` for a while before it authorizes the client's
/// role again (home-operations/tuppr#453: its verification after an install failed on it
/// ~20 s after the installer succeeded). A read changes nothing, so waiting it out is safe;
/// every caller bounds the wait (the node's health timeout), and a role that really lacks the
/// right halts there, naming the error. A mutating call refused so stays a failure.
fn classify_read(op: &'static str, node: &str, e: TalosError) -> PortError {
    if e.code() == Some(Code::PermissionDenied) {
        PortError::transient(op, node, e)
    } else {
        classify(op, node, e)
    }
}

/// A `Read` of a file that does not exist: apid answers `NotFound`, or relays machined's Go
/// error (`stat …: no such file or directory`) as `Unknown`.
fn file_absent(e: &TalosError) -> bool {
    match e {
        TalosError::Rpc { code, message, .. } => {
            *code == Code::NotFound || message.contains("no such file or directory")
        }
        _ => false,
    }
}

/// `LifecycleService.Upgrade` refused because an install is already running on the node
/// (`FailedPrecondition`, "another installation/upgrade is already in progress"): the earlier
/// call is still at work, so this is waited out and observed like a lost reply.
fn upgrade_in_progress(e: &TalosError) -> bool {
    matches!(e, TalosError::Rpc { code: Code::FailedPrecondition, message, .. }
        if message.contains("already in progress"))
}

/// Decode an efivarfs `LoaderEntryDefault` file (4 bytes of attributes, then a NUL-terminated
/// UTF-16LE entry name) into what the node boots next: `Talos-<v>.efi` with `v == running` is
/// [`NextBoot::Same`], another version is [`NextBoot::Version`], anything else (not a Talos
/// UKI, not a version, malformed) is [`NextBoot::Unknown`].
pub fn next_boot_from_efivar(file: &[u8], running: &TalosVersion) -> NextBoot {
    let Some(data) = file.get(4..) else {
        return NextBoot::Unknown;
    };
    if data.len() % 2 != 0 {
        return NextBoot::Unknown;
    }
    let units: Vec<u16> = data
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|u| *u != 0)
        .collect();
    let Ok(entry) = String::from_utf16(&units) else {
        return NextBoot::Unknown;
    };
    let lower = entry.to_ascii_lowercase();
    if entry.len() < "talos-.efi".len() || !lower.starts_with("talos-") || !lower.ends_with(".efi")
    {
        return NextBoot::Unknown;
    }
    // the prefix and suffix are ASCII, so these are character boundaries
    let name = &entry["talos-".len()..entry.len() - ".efi".len()];
    // a reinstall of a version already on the ESP is `Talos-<v>~<N>.efi` (`sdboot.go`,
    // `generateNextUKIName`)
    let version = match name.rsplit_once('~') {
        Some((v, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => v,
        Some(_) => return NextBoot::Unknown,
        None => name,
    };
    match TalosVersion::parse(version) {
        Ok(v) if &v == running => NextBoot::Same,
        Ok(v) => NextBoot::Version(v),
        Err(_) => NextBoot::Unknown,
    }
}

fn stage(s: talos::MachineStage) -> MachineStage {
    use talos::MachineStage as S;
    match s {
        S::Booting => MachineStage::Booting,
        S::Running => MachineStage::Running,
        S::Rebooting => MachineStage::Rebooting,
        S::ShuttingDown => MachineStage::ShuttingDown,
        S::Upgrading => MachineStage::Upgrading,
        S::Installing => MachineStage::Installing,
        S::Maintenance => MachineStage::Maintenance,
        S::Unknown | S::Resetting => MachineStage::Other,
    }
}

/// A service is a problem when it failed or is not up yet (`Running`, or `Finished` for
/// one-shot services, are fine), or when its health check fails. Services without a health
/// check (`Unknown`) are judged by their state only, as `talosctl services` shows them.
fn service_problem(s: &talos::ServiceHealth) -> bool {
    let state_ok = s.state == "Running" || s.state == "Finished";
    !state_ok || s.health == talos::Health::Unhealthy
}

/// Where a component's image is configured: its Talos 1.14 document kind, and the v1alpha1
/// path used when the configuration has no such document.
pub(super) fn image_location(c: Component) -> (&'static str, [&'static str; 2]) {
    match c {
        Component::ApiServer => ("KubeAPIServerConfig", ["cluster", "apiServer"]),
        Component::ControllerManager => (
            "KubeControllerManagerConfig",
            ["cluster", "controllerManager"],
        ),
        Component::Scheduler => ("KubeSchedulerConfig", ["cluster", "scheduler"]),
        Component::Proxy => ("KubeProxyConfig", ["cluster", "proxy"]),
        Component::Kubelet => ("KubeletConfig", ["machine", "kubelet"]),
    }
}

const COMPONENTS: [Component; 5] = [
    Component::ApiServer,
    Component::ControllerManager,
    Component::Scheduler,
    Component::Proxy,
    Component::Kubelet,
];

pub(super) fn parse_docs(yaml: &[u8]) -> Result<Vec<serde_json::Value>, MachineConfigError> {
    let text = std::str::from_utf8(yaml).map_err(|_| MachineConfigError::Yaml {
        line: None,
        column: None,
    })?;
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(text).map_err(|e| {
        // the parser's message may quote the offending text (a key or token): keep the place
        let loc = e.location();
        MachineConfigError::Yaml {
            line: loc.map(|l| l.line()),
            column: loc.map(|l| l.column()),
        }
    })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn is_v1alpha1(d: &serde_json::Value) -> bool {
    d.get("version").and_then(|v| v.as_str()) == Some("v1alpha1") && d.get("kind").is_none()
}

fn of_kind(docs: &[serde_json::Value], kind: &str) -> Option<usize> {
    docs.iter()
        .position(|d| d.get("kind").and_then(|k| k.as_str()) == Some(kind))
}

/// The component images a machine configuration names: the `image` of a component's own
/// document (Talos 1.14 multi-doc) when present, else the v1alpha1 field. Unset or empty
/// images are absent (the node runs Talos' default for its version).
pub fn component_images_of(yaml: &[u8]) -> Result<ComponentImages, MachineConfigError> {
    let docs = parse_docs(yaml)?;
    let v1 = docs
        .iter()
        .find(|d| is_v1alpha1(d))
        .ok_or(MachineConfigError::NoV1alpha1)?;
    let mut out = ComponentImages::new();
    for c in COMPONENTS {
        let (kind, [section, field]) = image_location(c);
        let from_doc = of_kind(&docs, kind)
            .and_then(|i| docs[i].get("image"))
            .and_then(|v| v.as_str());
        let from_v1 = v1
            .get(section)
            .and_then(|s| s.get(field))
            .and_then(|f| f.get("image"))
            .and_then(|v| v.as_str());
        if let Some(img) = from_doc.or(from_v1).filter(|s| !s.is_empty()) {
            out.insert(c, img.to_string());
        }
    }
    Ok(out)
}

/// The documents of a machine configuration (as values) with `component`'s image set to
/// `image` where the node keeps it: what a text edit must amount to
/// ([`super::machine_config::check_only_image_changed`]).
pub(super) fn expected_docs(
    mut docs: Vec<serde_json::Value>,
    component: Component,
    image: &str,
) -> Result<Vec<serde_json::Value>, MachineConfigError> {
    let (kind, [section, field]) = image_location(component);
    if let Some(i) = of_kind(&docs, kind) {
        let Some(doc) = docs[i].as_object_mut() else {
            return Err(MachineConfigError::NotAMapping {
                path: kind.to_string(),
            });
        };
        doc.insert("image".into(), serde_json::Value::String(image.into()));
    } else {
        let v1 = docs
            .iter_mut()
            .find(|d| is_v1alpha1(d))
            .ok_or(MachineConfigError::NoV1alpha1)?;
        let mut cur = v1;
        let mut path = String::new();
        for key in [section, field] {
            path = if path.is_empty() {
                key.to_string()
            } else {
                format!("{path}.{key}")
            };
            let map = cur
                .as_object_mut()
                .ok_or_else(|| MachineConfigError::NotAMapping { path: path.clone() })?;
            cur = map
                .entry(key)
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
            if cur.is_null() {
                *cur = serde_json::Value::Object(Default::default());
            }
        }
        let map = cur
            .as_object_mut()
            .ok_or(MachineConfigError::NotAMapping { path })?;
        map.insert("image".into(), serde_json::Value::String(image.into()));
    }
    Ok(docs)
}

/// JSON numbers from a protobuf `Struct` are all doubles; Kubernetes wants integers where the
/// value is integral (`replicas: 2`, not `2.0`).
fn integral_numbers(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => {
                Value::Number((f as i64).into())
            }
            _ => Value::Number(n),
        },
        Value::Array(a) => Value::Array(a.into_iter().map(integral_numbers).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (k, integral_numbers(v)))
                .collect(),
        ),
        other => other,
    }
}

impl TalosPort for TalosAdapter {
    async fn node(&self, n: &NodeTarget) -> Result<TalosNode, PortError> {
        let t = target(n)?;
        let c = &self.observer;
        // Five independent reads, made at once: one round trip's wait instead of five (they
        // share the endpoint's HTTP/2 connection; apid proxies each on its own). Their errors
        // are taken in the order below, the order in which they used to run one by one.
        let (version, boot_id, status, services, loader_default) = tokio::join!(
            timed(API, "Version", c.version(&t)),
            timed(API, "Read", c.boot_id(&t)),
            timed(API, "MachineStatus", c.machine_status(&t)),
            timed(API, "ServiceList", c.services(&t)),
            self.read_efivar(&t, n, LOADER_ENTRY_DEFAULT),
        );
        let version = version
            .map_err(|e| classify_read("MachineService.Version", &n.node, e))?
            .tag;
        let boot_id = boot_id
            .map_err(|e| classify_read("MachineService.Read", &n.node, e))?
            .0;
        let status = status.map_err(|e| classify_read("cosi.resource.State.Get", &n.node, e))?;
        let services =
            services.map_err(|e| classify_read("MachineService.ServiceList", &n.node, e))?;
        let next_boot = self.next_boot(&t, n, &version, loader_default?).await?;
        let mut unhealthy_services: Vec<String> = services
            .iter()
            .filter(|s| service_problem(s))
            .map(|s| s.id.clone())
            .collect();
        if status.stage == talos::MachineStage::Running && !status.ready {
            // talosctl's "back": RUNNING *and* ready; the unmet conditions say what is missing
            unhealthy_services.extend(
                status
                    .unmet_conditions
                    .iter()
                    .map(|(name, _)| format!("machine-status/{name}")),
            );
        }
        Ok(TalosNode {
            version,
            boot_id,
            stage: stage(status.stage),
            ready: status.ready,
            next_boot,
            unhealthy_services,
        })
    }

    async fn etcd(&self, control_plane: &[NodeTarget]) -> Result<EtcdHealth, PortError> {
        let c = &self.observer;
        let mut listed = None;
        let mut last = None;
        for cp in control_plane {
            let t = target(cp)?;
            match timed(API, "EtcdMemberList", c.etcd_members(&t)).await {
                Ok(m) => {
                    listed = Some((m, t, cp.node.clone()));
                    break;
                }
                Err(e) => last = Some(classify_read("MachineService.EtcdMemberList", &cp.node, e)),
            }
        }
        let Some((list, asked, asked_node)) = listed else {
            return Err(last.unwrap_or_else(|| {
                PortError::failed(
                    "MachineService.EtcdMemberList",
                    "the control plane",
                    Detail("no control-plane node to ask".into()),
                )
            }));
        };
        // Alarms are cluster-wide in etcd: the member that answered the list reports them all.
        // A failed read is an error (the etcd check fails), never "no alarms".
        let raised = timed(API, "EtcdAlarmList", c.etcd_alarms(&asked))
            .await
            .map_err(|e| classify_read("MachineService.EtcdAlarmList", &asked_node, e))?;
        let alarms = raised
            .iter()
            .map(|a| match list.iter().find(|m| m.id == a.member_id) {
                Some(m) => format!("{}: {}", m.hostname, a.alarm),
                None => format!("member {:x}: {}", a.member_id, a.alarm),
            })
            .collect();
        let mut members = Vec::new();
        let mut leaders: BTreeMap<u64, usize> = BTreeMap::new();
        let ids: Vec<(u64, String)> = list.iter().map(|m| (m.id, m.hostname.clone())).collect();
        for m in list {
            // a member is asked through its node: the known control plane of that name, else the
            // host of its client URL
            let known = control_plane.iter().find(|cp| cp.node == m.hostname);
            let host = m
                .client_urls
                .iter()
                .chain(&m.peer_urls)
                .find_map(|u| url_host(u))
                .map(str::to_string);
            let t = match known {
                Some(cp) => target(cp).ok(),
                None => host.and_then(|h| talos::NodeTarget::parse(&h).ok()),
            };
            let (healthy, errors, learner) = match t {
                None => (
                    false,
                    vec![format!(
                        "member `{}` has no address medea can reach",
                        m.hostname
                    )],
                    m.is_learner,
                ),
                Some(t) => match timed(API, "EtcdStatus", c.etcd_status(&t)).await {
                    Ok(s) => {
                        if s.leader != 0 {
                            *leaders.entry(s.leader).or_default() += 1;
                        }
                        (s.errors.is_empty(), s.errors, m.is_learner || s.is_learner)
                    }
                    Err(e) => (false, vec![error_chain(&e)], m.is_learner),
                },
            };
            members.push(EtcdMember {
                name: m.hostname,
                learner,
                healthy,
                errors,
            });
        }
        Ok(EtcdHealth {
            members,
            alarms,
            leader: agreed_leader(&leaders, &ids),
        })
    }

    async fn etcd_snapshot(&self, n: &NodeTarget, dest: &Path) -> Result<SnapshotInfo, PortError> {
        let t = target(n)?;
        let info = timed(API, "EtcdSnapshot", self.client.etcd_snapshot(&t, dest))
            .await
            .map_err(|e| classify("MachineService.EtcdSnapshot", &n.node, e))?;
        Ok(SnapshotInfo {
            path: info.path,
            size: info.size,
            sha256: info.sha256,
            encrypted: None,
        })
    }

    async fn etcd_snapshot_stream(
        &self,
        n: &NodeTarget,
        chunks: tokio::sync::mpsc::Sender<Vec<u8>>,
    ) -> Result<SnapshotStreamed, PortError> {
        let t = target(n)?;
        let s = timed(
            API,
            "EtcdSnapshot",
            self.client.etcd_snapshot_stream(&t, chunks),
        )
        .await
        .map_err(|e| classify("MachineService.EtcdSnapshot", &n.node, e))?;
        Ok(SnapshotStreamed {
            size: s.size,
            sha256: s.sha256,
        })
    }

    async fn pull_image(
        &self,
        n: &NodeTarget,
        image: &str,
        namespace: ImageNamespace,
    ) -> Result<(), PortError> {
        // Control-plane images go into the CRI namespace (`k8s.io`), where the kubelet looks
        // for pod images, as `talosctl upgrade-k8s` pre-pulls them (talos
        // `pkg/cluster/kubernetes/talos_managed.go` `prePullImages`); the kubelet image into
        // the system namespace.
        let ns = match namespace {
            ImageNamespace::System => PullNamespace::System,
            ImageNamespace::Cri => PullNamespace::Cri,
        };
        let t = target(n)?;
        let img = ImageRef::parse(image)
            .map_err(|e| PortError::failed("ImageService.Pull", &n.node, e))?;
        timed(API, "ImagePull", self.client.pull_image_into(&t, &img, ns))
            .await
            .map(|_| ())
            .map_err(|e| classify("ImageService.Pull", &n.node, e))
    }

    async fn upgrade(
        &self,
        n: &NodeTarget,
        image: &str,
        method: UpgradeMethod,
    ) -> Result<(), PortError> {
        let t = target(n)?;
        let img = ImageRef::parse(image).map_err(|e| PortError::failed("Upgrade", &n.node, e))?;
        // The method is the journaled one (chosen when the node was checked), never re-decided.
        let r = match method {
            UpgradeMethod::Lifecycle => {
                timed(API, "Upgrade", self.client.lifecycle_upgrade(&t, &img))
                    .await
                    .map(|_| ())
            }
            UpgradeMethod::Legacy => {
                timed(API, "LegacyUpgrade", self.client.legacy_upgrade(&t, &img))
                    .await
                    .map(|_| ())
            }
        };
        let op = match method {
            UpgradeMethod::Lifecycle => "LifecycleService.Upgrade",
            UpgradeMethod::Legacy => "MachineService.Upgrade",
        };
        r.map_err(|e| {
            if upgrade_in_progress(&e) {
                PortError::busy(op, &n.node, e)
            } else {
                classify(op, &n.node, e)
            }
        })
    }

    async fn etcd_forfeit_leadership(&self, n: &NodeTarget) -> Result<Option<String>, PortError> {
        let t = target(n)?;
        timed(
            API,
            "EtcdForfeitLeadership",
            self.client.etcd_forfeit_leadership(&t),
        )
        .await
        .map_err(|e| classify("MachineService.EtcdForfeitLeadership", &n.node, e))
    }

    async fn reboot(&self, n: &NodeTarget) -> Result<(), PortError> {
        let t = target(n)?;
        timed(API, "Reboot", self.client.reboot(&t))
            .await
            .map(|_| ())
            .map_err(|e| classify("MachineService.Reboot", &n.node, e))
    }

    async fn rollback(&self, n: &NodeTarget) -> Result<(), PortError> {
        let t = target(n)?;
        timed(API, "Rollback", self.client.rollback(&t))
            .await
            .map_err(|e| classify("MachineService.Rollback", &n.node, e))
    }

    async fn component_images(&self, n: &NodeTarget) -> Result<ComponentImages, PortError> {
        let t = target(n)?;
        let mc = timed(API, "MachineConfig", self.client.machine_config(&t))
            .await
            .map_err(|e| classify_read("cosi.resource.State.Get", &n.node, e))?;
        component_images_of(mc.yaml().expose())
            .map_err(|e| PortError::failed("read the machine configuration", &n.node, e))
    }

    async fn component_args(&self, n: &NodeTarget) -> Result<ComponentArgs, PortError> {
        let t = target(n)?;
        let mc = timed(API, "MachineConfig", self.client.machine_config(&t))
            .await
            .map_err(|e| classify_read("cosi.resource.State.Get", &n.node, e))?;
        component_args_of(mc.yaml().expose())
            .map_err(|e| PortError::failed("read the machine configuration", &n.node, e))
    }

    async fn component_config_version(
        &self,
        n: &NodeTarget,
        component: Component,
    ) -> Result<Option<String>, PortError> {
        // the resource `upgrade-k8s` watches in `upgradeStaticPodOnNode` (siderolabs/talos
        // `pkg/cluster/kubernetes/talos_managed.go`, `controlplaneConfigResourceType`)
        let rtype = match component {
            Component::ApiServer => "APIServerConfigs.kubernetes.talos.dev",
            Component::ControllerManager => "ControllerManagerConfigs.kubernetes.talos.dev",
            Component::Scheduler => "SchedulerConfigs.kubernetes.talos.dev",
            Component::Proxy | Component::Kubelet => return Ok(None),
        };
        let t = target(n)?;
        // From Talos 1.14 the static pod is rendered from `final-<component>` (the raw config
        // merged with defaults by a transform controller) and its `talos.dev/config-version`
        // is that resource's version, which runs apart from the raw one's (talos#14258). Read
        // the final resource first and fall back to the raw one where it does not exist, as
        // talosctl does since siderolabs/talos PR #14269.
        for id in [
            format!("final-{}", component.name()),
            component.name().to_string(),
        ] {
            match timed(
                API,
                "ComponentConfig",
                self.client.cosi_get(&t, "controlplane", rtype, &id),
            )
            .await
            {
                Ok(r) => return Ok(Some(r.version)),
                Err(TalosError::Rpc {
                    code: Code::NotFound,
                    ..
                }) => continue,
                Err(e) => return Err(classify_read("cosi.resource.State.Get", &n.node, e)),
            }
        }
        Ok(None)
    }

    async fn set_component_image(
        &self,
        n: &NodeTarget,
        component: Component,
        image: &str,
    ) -> Result<(), PortError> {
        let t = target(n)?;
        let mc = timed(API, "MachineConfig", self.client.machine_config(&t))
            .await
            .map_err(|e| classify("cosi.resource.State.Get", &n.node, e))?;
        let current = mc.yaml().expose();
        let patched = set_component_image_in(current, component, image)
            .and_then(|p| check_only_image_changed(current, &p, component, image).map(|()| p))
            .map_err(|e| PortError::failed("patch the machine configuration", &n.node, e))?;
        timed(
            API,
            "ApplyConfiguration",
            self.client.apply_configuration(
                &t,
                &MachineConfig::from_yaml(patched),
                ApplyOptions::no_reboot(),
            ),
        )
        .await
        .map(|_| ())
        .map_err(|e| classify("MachineService.ApplyConfiguration", &n.node, e))
    }

    async fn bootstrap_manifests(&self, n: &NodeTarget) -> Result<Vec<Manifest>, PortError> {
        use crate::talos::proto::talos::resource::definitions::k8s::ManifestSpec;
        const OP: &str = "cosi.resource.State.List";
        let t = target(n)?;
        let mut list = timed(
            API,
            "Manifests",
            self.client
                .cosi_list(&t, "controlplane", "Manifests.kubernetes.talos.dev"),
        )
        .await
        .map_err(|e| classify(OP, &n.node, e))?;
        // ids are ordered on purpose (`00-…`, `01-…`, …): apply in that order
        list.sort_by(|a, b| a.id.cmp(&b.id));
        let mut out = Vec::new();
        for r in list {
            let spec = ManifestSpec::decode(r.proto_spec.expose().as_slice()).map_err(|e| {
                PortError::failed(
                    OP,
                    &n.node,
                    Detail(format!("manifest `{}` does not decode: {e}", r.id)),
                )
            })?;
            for item in spec.items {
                let obj = item
                    .object
                    .as_ref()
                    .map(crate::talos::pbstruct::from_struct)
                    .unwrap_or(serde_json::Value::Null);
                if obj.is_object() {
                    out.push(Manifest(integral_numbers(obj)));
                }
            }
        }
        Ok(out)
    }
}

/// The host of `https://10.0.0.2:2379` (brackets of IPv6 removed).
fn url_host(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let authority = rest.split('/').next()?;
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next()?
    } else {
        authority
            .rsplit_once(':')
            .map(|(h, _)| h)
            .unwrap_or(authority)
    };
    (!host.is_empty()).then_some(host)
}

/// The flags (`extraArgs`) a machine configuration gives each component: a component's own
/// document (Talos 1.14 multi-doc) when it has `extraArgs`, else the v1alpha1 field
/// (`cluster.apiServer.extraArgs`, …, `machine.kubelet.extraArgs`). A value may be a string,
/// a scalar (kept as its text) or a list (joined with `,`, as Talos renders repeated values).
pub fn component_args_of(yaml: &[u8]) -> Result<ComponentArgs, MachineConfigError> {
    fn text(v: &serde_json::Value) -> String {
        match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(","),
            other => other.to_string(),
        }
    }
    let docs = parse_docs(yaml)?;
    let v1 = docs
        .iter()
        .find(|d| is_v1alpha1(d))
        .ok_or(MachineConfigError::NoV1alpha1)?;
    let mut out = ComponentArgs::new();
    for c in COMPONENTS {
        let (kind, [section, field]) = image_location(c);
        let from_doc = of_kind(&docs, kind).and_then(|i| docs[i].get("extraArgs"));
        let from_v1 = v1
            .get(section)
            .and_then(|s| s.get(field))
            .and_then(|f| f.get("extraArgs"));
        let Some(map) = from_doc.or(from_v1).and_then(|v| v.as_object()) else {
            continue;
        };
        let flags: std::collections::BTreeMap<String, String> = map
            .iter()
            .map(|(k, v)| (k.trim_start_matches("--").to_string(), text(v)))
            .collect();
        if !flags.is_empty() {
            out.insert(c, flags);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;

/// The leader the members agree on: every member that answered with a leader (`EtcdStatus`
/// `leader`, a member id) names the same one, and it is in the member list; `None` otherwise
/// (an election under way, a member that lost touch).
fn agreed_leader(leaders: &BTreeMap<u64, usize>, members: &[(u64, String)]) -> Option<String> {
    let mut named = leaders.keys();
    let (Some(id), None) = (named.next(), named.next()) else {
        return None;
    };
    members
        .iter()
        .find(|(m, _)| m == id)
        .map(|(_, name)| name.clone())
}
