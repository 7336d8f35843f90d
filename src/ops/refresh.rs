//! Inventory refresh: observe a cluster through its kube-apiserver and the Talos API of each of
//! its nodes, and write what changed to the store with compare-and-swap. The one way a
//! cluster is observed: the daemon's refresh loop, `medea seed` ([`observe`]) and
//! `medea doctor` all use it.
//!
//! **Discovery.** The machines of a cluster are its Kubernetes Nodes ([`KubeApi::nodes`]): name,
//! InternalIP (the Talos `node` target), labels, role (the control-plane label), Ready,
//! cordoned, kubelet version. Each node is then asked, with a single `node` target, for its
//! Talos `Version`, its boot id, its machine config's installer image (`machine.install.image`,
//! or a Talos 1.14 `UnattendedInstallConfig` document's `installer.image`; its Image Factory
//! schematic the planner keeps), whether it booted with SecureBoot (`SecurityState`) and the
//! Image Factory that built it (`ImageFactorySchematic`, Talos >= 1.14).
//!
//! **Kubernetes version.** The cluster's version is the lowest `kube-apiserver` version running:
//! the image tag of each control-plane node's kube-apiserver static pod, as the node's Talos API
//! reports it (`StaticPodStatus`), or, when Talos does not answer, as its mirror pod in the API
//! shows it. The apiserver's `/version` is not used: behind a load balancer it answers for one
//! apiserver only, which in the middle of an upgrade is not the lowest.
//!
//! **Unreachable nodes** (the Talos API does not answer `Version`) are recorded with
//! `reachable: false` and no Talos facts (version, boot id from the Node, no installer image);
//! the error is logged, never fatal. A kube-apiserver that does not answer fails the cluster's
//! refresh instead (its record is left as it was): without the Node list there is nothing to
//! observe.
//!
//! **Writes.** [`refresh_all`] refreshes every seeded cluster that has credentials in
//! `<creds-dir>/<cluster>/{talosconfig,kubeconfig}` and writes the changed records in one
//! transaction, each guarded by `Check::Equals` on the bytes it was computed from. A concurrent
//! write (e.g. `medea cluster enable-rollouts`) fails the check; the observation is then merged
//! into the new record and written again. The generation moves only when something observed
//! changed ([`ObservedCluster::observe`]), and `rolloutsEnabled` is never touched.
//!
//! **Workload census.** A cluster observed by [`refresh_all`] / [`refresh_cluster`] also has its
//! workload census gathered ([`super::census`]) when the one stored under
//! [`census_key`] is older than [`RefreshSettings::census_interval`] (or missing), and stored
//! there in its own transaction: the cluster record and its generation are never touched, so
//! pods that come and go never make a plan stale. A cluster whose observation failed keeps its
//! stored census; a census with unreadable sources is stored with its `gatherErrors`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;

use super::preflight::CredentialFiles;
use crate::inventory::census::{Census, census_key};
use crate::inventory::preflight::PreflightObservations;
use crate::inventory::{Machine, MachineRole, ObservedCluster, cluster_key};
use crate::k8s::{
    ClientOptions, ClusterNode, ControlPlaneComponent, K8sError, KubeApi, KubeClient,
    kubeconfig::KUBECONFIG_FILE,
};
use crate::store::{Check, Record as _, Store, StoreError, Table, Txn, record};
use crate::talos::{ClientSettings, NodeTarget, RetryPolicy, TalosApi, TalosClient, TalosError};
use crate::version::KubeVersion;

/// The talosconfig's file name inside a cluster's credentials directory.
pub const TALOSCONFIG_FILE: &str = "talosconfig";

/// How many nodes are observed at once.
const PARALLEL_NODES: usize = 16;

/// Why a refresh failed.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error("cannot list the nodes of cluster `{cluster}` from its kube-apiserver")]
    ListNodes {
        cluster: String,
        #[source]
        err: Box<K8sError>,
    },
    #[error(
        "the kube-apiserver of cluster `{cluster}` lists no nodes; check that the kubeconfig points at the right cluster"
    )]
    NoNodes { cluster: String },
    #[error("cannot use the talosconfig of cluster `{cluster}` (`{path}`)")]
    Talosconfig {
        cluster: String,
        path: PathBuf,
        #[source]
        err: Box<TalosError>,
    },
    #[error("cannot use the kubeconfig of cluster `{cluster}` (`{path}`)")]
    Kubeconfig {
        cluster: String,
        path: PathBuf,
        #[source]
        err: Box<K8sError>,
    },
    #[error("cannot read the credentials directory `{path}`")]
    CredsDir {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("the inventory store failed")]
    Store(#[source] StoreError),
    #[error(
        "the record of cluster `{cluster}` kept changing while the refresh wrote it; it is refreshed again next time"
    )]
    Contended { cluster: String },
}

/// What one observation found (before it is merged into a record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The lowest kube-apiserver version running; `None` when no control plane showed one.
    pub kubernetes_version: Option<KubeVersion>,
    /// Machines by node name.
    pub machines: BTreeMap<String, Machine>,
    /// What the preflight checks read ([`super::preflight`]).
    pub preflight: PreflightObservations,
}

/// Observe a cluster now. `cluster` names it in logs and errors.
pub async fn observe<T: TalosApi, K: KubeApi>(
    talos: &T,
    kube: &K,
    cluster: &str,
) -> Result<Observation, RefreshError> {
    observe_with_credentials(talos, kube, cluster, None).await
}

/// [`observe`], also reading the expiry of the client certificates in `credentials`.
pub async fn observe_with_credentials<T: TalosApi, K: KubeApi>(
    talos: &T,
    kube: &K,
    cluster: &str,
    credentials: Option<CredentialFiles<'_>>,
) -> Result<Observation, RefreshError> {
    let nodes = kube.nodes().await.map_err(|err| RefreshError::ListNodes {
        cluster: cluster.to_string(),
        err: Box::new(err),
    })?;
    if nodes.is_empty() {
        return Err(RefreshError::NoNodes {
            cluster: cluster.to_string(),
        });
    }
    // The futures are built first so the stream holds no closure (a closure there makes the
    // future not provably `Send`, rust-lang/rust#102211).
    let pending: Vec<_> = nodes
        .iter()
        .map(|n| observe_machine(talos, kube, cluster, n))
        .collect();
    let observed: Vec<(Machine, Option<KubeVersion>)> = futures::stream::iter(pending)
        .buffered(PARALLEL_NODES)
        .collect()
        .await;
    let kubernetes_version = observed.iter().filter_map(|(_, v)| v.clone()).min();
    if kubernetes_version.is_none() {
        tracing::warn!(
            cluster,
            "no control-plane node shows a kube-apiserver version; the cluster's Kubernetes version is unknown"
        );
    }
    let preflight = super::preflight::gather(
        talos,
        kube,
        cluster,
        &nodes,
        kubernetes_version.as_ref(),
        credentials,
    )
    .await;
    Ok(Observation {
        kubernetes_version,
        machines: observed
            .into_iter()
            .map(|(m, _)| (m.node.clone(), m))
            .collect(),
        preflight,
    })
}

/// Observe a cluster and merge the observation into its previous record: the same generation
/// when nothing changed, the next one otherwise; `rolloutsEnabled` is kept.
pub async fn observe_cluster<T: TalosApi, K: KubeApi>(
    talos: &T,
    kube: &K,
    previous: &ObservedCluster,
) -> Result<ObservedCluster, RefreshError> {
    let o = observe(talos, kube, &previous.name).await?;
    Ok(previous.observe_with(o.kubernetes_version, o.machines, o.preflight))
}

/// One machine: the Node's facts plus what its Talos API says, and (control planes) the
/// kube-apiserver version it runs.
async fn observe_machine<T: TalosApi, K: KubeApi>(
    talos: &T,
    kube: &K,
    cluster: &str,
    node: &ClusterNode,
) -> (Machine, Option<KubeVersion>) {
    let address = node.internal_ip().unwrap_or(&node.name).to_string();
    let role = if node.control_plane {
        MachineRole::Controlplane
    } else {
        MachineRole::Worker
    };
    let mut machine = Machine {
        node: node.name.clone(),
        id: if node.machine_id.is_empty() {
            node.name.clone()
        } else {
            node.machine_id.clone()
        },
        address: address.clone(),
        role,
        talos_version: None,
        installer_image: None,
        schematic: None,
        platform: None,
        secure_boot: None,
        factory_host: None,
        extensions: BTreeMap::new(),
        kubelet_version: node.kubelet_version.clone(),
        ready: node.ready,
        cordoned: node.unschedulable,
        reachable: false,
        boot_id: (!node.boot_id.is_empty()).then(|| node.boot_id.clone()),
        labels: node.labels.clone(),
    };
    let target = match NodeTarget::parse(&address) {
        Ok(t) => t,
        Err(err) => {
            tracing::warn!(cluster, node = %node.name, error = %crate::error_chain(&err), "node has no usable Talos API target; marked unreachable");
            return (machine, None);
        }
    };
    match talos.version(&target).await {
        Ok(v) => {
            machine.talos_version = Some(v.tag);
            machine.platform = (!v.platform.is_empty()).then_some(v.platform);
            machine.reachable = true;
        }
        Err(err) => {
            tracing::warn!(cluster, node = %node.name, target = %address, error = %crate::error_chain(&err), "Talos API of the node did not answer; marked unreachable");
            return (
                machine,
                apiserver_version(talos, kube, cluster, node, None).await,
            );
        }
    }
    match talos.boot_id(&target).await {
        Ok(id) => machine.boot_id = Some(id.0),
        Err(err) => {
            tracing::warn!(cluster, node = %node.name, error = %crate::error_chain(&err), "cannot read the node's boot id from Talos; using the Node's")
        }
    }
    let (extensions, schematic) = node_extensions(node);
    machine.extensions = extensions;
    machine.schematic = schematic;
    match talos.machine_config(&target).await {
        Ok(config) => {
            machine.installer_image = install_image(config.yaml().expose());
            if machine.schematic.is_none() {
                machine.schematic = machine
                    .installer_image
                    .as_deref()
                    .and_then(crate::desired::model::schematic_of)
                    .map(str::to_string);
            }
        }
        Err(err) => {
            // Needs `os:admin`; a reader certificate cannot see it. Not fatal.
            tracing::info!(cluster, node = %node.name, error = %crate::error_chain(&err), "cannot read the node's machine config; installer image unknown")
        }
    }
    observe_boot_assets(talos, cluster, node, &target, &mut machine).await;
    let version = apiserver_version(talos, kube, cluster, node, Some(&target)).await;
    (machine, version)
}

/// What the node's boot assets say about the installer it needs: SecureBoot (COSI
/// `SecurityState`) and the Image Factory that built it (COSI `ImageFactorySchematic`, from
/// Talos 1.14; else the host of the factory installer it was installed from). A read that fails
/// leaves the fact unknown, which the planner refuses to guess for a factory installer.
async fn observe_boot_assets<T: TalosApi>(
    talos: &T,
    cluster: &str,
    node: &ClusterNode,
    target: &NodeTarget,
    machine: &mut Machine,
) {
    match talos.security_state(target).await {
        Ok(s) => machine.secure_boot = Some(s.secure_boot),
        Err(err) => {
            tracing::warn!(cluster, node = %node.name, error = %crate::error_chain(&err), "cannot read the node's SecurityState; SecureBoot unknown")
        }
    }
    match talos.image_factory_schematic(target).await {
        Ok(Some(f)) => {
            machine.factory_host = f.host();
            if machine.schematic.is_none() && !f.schematic_id.is_empty() {
                machine.schematic = Some(f.schematic_id);
            }
        }
        Ok(None) => {}
        Err(err) => {
            tracing::info!(cluster, node = %node.name, error = %crate::error_chain(&err), "cannot read the node's ImageFactorySchematic; factory host from its installer image")
        }
    }
    if machine.factory_host.is_none() {
        machine.factory_host = machine
            .installer_image
            .as_deref()
            .and_then(crate::image::factory_installer_of)
            .map(|f| f.host.to_string());
    }
}

/// The Node's `extensions.talos.dev/` prefix: Talos publishes each system extension of the node
/// as `extensions.talos.dev/<name>: <version>`, a label when the version is a valid label value
/// and an annotation otherwise, and the Image Factory schematic as the extension `schematic`
/// (siderolabs/talos `internal/app/machined/pkg/controllers/k8s/node_label_spec.go` and
/// `node_annotation_spec.go`, `extensionsToNodeKV`; `pkg/machinery/constants` `K8sExtensionPrefix`,
/// `ImageFactorySchematicExtensionName`).
pub const EXTENSION_PREFIX: &str = "extensions.talos.dev/";

/// The node's system extensions (name → version) and its schematic, from its labels and
/// annotations (annotations win on a clash, as neither should happen).
pub fn node_extensions(node: &ClusterNode) -> (BTreeMap<String, String>, Option<String>) {
    let mut extensions = BTreeMap::new();
    for (k, v) in node.labels.iter().chain(node.annotations.iter()) {
        if let Some(name) = k.strip_prefix(EXTENSION_PREFIX) {
            extensions.insert(name.to_string(), v.clone());
        }
    }
    let schematic = extensions.remove("schematic").filter(|s| !s.is_empty());
    (extensions, schematic)
}

/// The kube-apiserver version a control-plane node runs: the image of its kube-apiserver static
/// pod as Talos reports it (`StaticPodStatus`, asked of the node itself), else as its mirror pod
/// in the API shows it (when Talos does not answer).
async fn apiserver_version<T: TalosApi, K: KubeApi>(
    talos: &T,
    kube: &K,
    cluster: &str,
    node: &ClusterNode,
    target: Option<&NodeTarget>,
) -> Option<KubeVersion> {
    if !node.control_plane {
        return None;
    }
    if let Some(target) = target {
        match talos.static_pod_statuses(target).await {
            Ok(statuses) => {
                let found = statuses
                    .iter()
                    .filter(|s| s.id.contains(ControlPlaneComponent::ApiServer.name()))
                    .flat_map(|s| s.images.iter())
                    .find_map(|i| image_version(i));
                if found.is_some() {
                    return found;
                }
            }
            Err(err) => {
                tracing::warn!(cluster, node = %node.name, error = %crate::error_chain(&err), "cannot read the node's static pods from Talos; asking Kubernetes")
            }
        }
    }
    match kube.control_plane_pods(&node.name).await {
        Ok(pods) => pods
            .iter()
            .find(|p| p.component == ControlPlaneComponent::ApiServer)
            .and_then(|p| image_version(&p.image)),
        Err(err) => {
            tracing::warn!(cluster, node = %node.name, error = %crate::error_chain(&err), "cannot list the node's control-plane pods");
            None
        }
    }
}

fn image_version(image: &str) -> Option<KubeVersion> {
    crate::image::tag_of(image).and_then(|t| KubeVersion::parse(t).ok())
}

/// The installer image of a machine config: `machine.install.image` of the v1alpha1 document,
/// else `installer.image` of a Talos 1.14 `UnattendedInstallConfig` document (`apiVersion:
/// v1alpha1`, siderolabs/talos `pkg/machinery/config/types/runtime/unattended_install.go`; the
/// two conflict upstream, so at most one is set). The config holds secrets: parse errors are
/// dropped, never logged.
fn install_image(yaml: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(yaml).ok()?;
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(text).ok()?;
    fn str_at<'a>(d: &'a serde_json::Value, field: &str) -> Option<&'a str> {
        d.get(field).and_then(|v| v.as_str())
    }
    let v1alpha1 = docs
        .iter()
        .filter(|d| str_at(d, "version") == Some("v1alpha1"))
        .find_map(|d| d.pointer("/machine/install/image")?.as_str());
    let unattended = || {
        docs.iter()
            .filter(|d| {
                str_at(d, "kind") == Some("UnattendedInstallConfig")
                    && str_at(d, "apiVersion") == Some("v1alpha1")
            })
            .find_map(|d| d.pointer("/installer/image")?.as_str())
    };
    v1alpha1
        .filter(|s| !s.is_empty())
        .or_else(|| unattended().filter(|s| !s.is_empty()))
        .map(str::to_string)
}

// ---------------------------------------------------------------------------------------------
// Credentials and store

/// Client timeouts and retries for refreshes. Fewer retries than the executor's: a refresh
/// runs again soon, and an unreachable node must not hold up the others for long.
#[derive(Debug, Clone)]
pub struct RefreshSettings {
    pub talos: ClientSettings,
    pub kube: ClientOptions,
    /// The least time between two workload censuses of a cluster ([`DEFAULT_CENSUS_INTERVAL`];
    /// `medea serve --census-interval`). Zero gathers one on every refresh.
    pub census_interval: Duration,
}

/// How often a cluster's workload census is gathered by default: a census lists every pod of
/// the cluster (a paged list of every pod, and the PDBs, DaemonSets and VolumeAttachments),
/// far more than the refresh itself reads, and a rehearsal needs the workloads' shape, not
/// this minute's pod names.
pub const DEFAULT_CENSUS_INTERVAL: Duration = Duration::from_secs(10 * 60);

impl Default for RefreshSettings {
    fn default() -> Self {
        RefreshSettings {
            talos: ClientSettings {
                connect_timeout: Duration::from_secs(5),
                request_timeout: Duration::from_secs(15),
                retry: RetryPolicy {
                    min_delay: Duration::from_millis(250),
                    max_delay: Duration::from_secs(1),
                    max_attempts: 2,
                },
                ..ClientSettings::default()
            },
            kube: ClientOptions {
                retry: crate::k8s::RetryPolicy {
                    attempts: 3,
                    min_delay: Duration::from_millis(200),
                    max_delay: Duration::from_secs(1),
                },
                ..ClientOptions::default()
            },
            census_interval: DEFAULT_CENSUS_INTERVAL,
        }
    }
}

/// Where a cluster's credentials live: `<creds-dir>/<cluster>/{talosconfig,kubeconfig}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterCreds {
    pub dir: PathBuf,
    pub talosconfig: PathBuf,
    pub kubeconfig: PathBuf,
}

impl ClusterCreds {
    pub fn new(creds_dir: &Path, cluster: &str) -> ClusterCreds {
        let dir = creds_dir.join(cluster);
        ClusterCreds {
            talosconfig: dir.join(TALOSCONFIG_FILE),
            kubeconfig: dir.join(KUBECONFIG_FILE),
            dir,
        }
    }

    /// Both files exist.
    pub fn present(&self) -> bool {
        self.talosconfig.is_file() && self.kubeconfig.is_file()
    }

    /// Build the two clients (the talosconfig's and the kubeconfig's current contexts).
    /// Must run inside a tokio runtime.
    pub async fn clients(
        &self,
        cluster: &str,
        settings: &RefreshSettings,
    ) -> Result<(TalosClient, KubeClient), RefreshError> {
        let (talos, _) = TalosClient::from_talosconfig(&self.talosconfig, None, settings.talos)
            .map_err(|err| RefreshError::Talosconfig {
                cluster: cluster.to_string(),
                path: self.talosconfig.clone(),
                err: Box::new(err),
            })?;
        let kube = KubeClient::from_kubeconfig(&self.kubeconfig, settings.kube.clone())
            .await
            .map_err(|err| RefreshError::Kubeconfig {
                cluster: cluster.to_string(),
                path: self.kubeconfig.clone(),
                err: Box::new(err),
            })?;
        Ok((talos, kube))
    }
}

/// The clusters with a credentials directory holding both files, sorted. A missing
/// `creds_dir` has none.
pub fn clusters_with_creds(creds_dir: &Path) -> Result<Vec<String>, RefreshError> {
    let entries = match std::fs::read_dir(creds_dir) {
        Ok(e) => e,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => {
            return Err(RefreshError::CredsDir {
                path: creds_dir.to_path_buf(),
                err,
            });
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|err| RefreshError::CredsDir {
            path: creds_dir.to_path_buf(),
            err,
        })?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !name.starts_with('.') && ClusterCreds::new(creds_dir, &name).present() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// What a refresh did to one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Something observed changed; the record was written with the new generation.
    Changed { from: u64, to: u64 },
    /// Nothing observed changed; nothing was written.
    Unchanged { generation: u64 },
    /// The cluster could not be observed (the error, with its causes); its record is as it was.
    Failed { error: String },
    /// Credentials exist but the cluster was never seeded (`medea seed` creates the record).
    NotSeeded,
}

/// One cluster's refresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRefresh {
    pub cluster: String,
    pub outcome: Outcome,
}

/// Every cluster's refresh, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefreshReport {
    pub clusters: Vec<ClusterRefresh>,
}

impl RefreshReport {
    /// Whether any record was written (plans computed before are now stale).
    pub fn changed(&self) -> bool {
        self.clusters
            .iter()
            .any(|c| matches!(c.outcome, Outcome::Changed { .. }))
    }
}

/// A stored record with the exact bytes it was read from (the compare-and-swap operand).
struct Base {
    raw: Vec<u8>,
    cluster: ObservedCluster,
}

fn load_base(store: &dyn Store, cluster: &str) -> Result<Option<Base>, RefreshError> {
    let key = cluster_key(cluster);
    let Some(raw) = store
        .get(Table::Inventory, &key)
        .map_err(RefreshError::Store)?
    else {
        return Ok(None);
    };
    let cluster = record::decode::<ObservedCluster>(&key, &raw).map_err(RefreshError::Store)?;
    Ok(Some(Base { raw, cluster }))
}

/// Refresh every seeded cluster that has credentials under `creds_dir`, and write the changed
/// records in one transaction (compare-and-swap on each). Clusters are observed concurrently;
/// one that cannot be observed is reported [`Outcome::Failed`] and does not stop the others.
/// Errors are store failures only.
pub async fn refresh_all(
    store: &dyn Store,
    creds_dir: &Path,
    settings: &RefreshSettings,
) -> Result<RefreshReport, RefreshError> {
    let names = clusters_with_creds(creds_dir)?;
    refresh_clusters(store, creds_dir, &names, settings).await
}

/// Refresh one cluster (e.g. right after a rollout step), as [`refresh_all`] does.
#[allow(
    clippy::expect_used,
    reason = "refresh_clusters returns one report per cluster passed in, and exactly one is passed"
)]
pub async fn refresh_cluster(
    store: &dyn Store,
    creds_dir: &Path,
    cluster: &str,
    settings: &RefreshSettings,
) -> Result<ClusterRefresh, RefreshError> {
    let report = refresh_clusters(store, creds_dir, &[cluster.to_string()], settings).await?;
    Ok(report
        .clusters
        .into_iter()
        .next()
        .expect("one cluster in, one out"))
}

async fn refresh_clusters(
    store: &dyn Store,
    creds_dir: &Path,
    names: &[String],
    settings: &RefreshSettings,
) -> Result<RefreshReport, RefreshError> {
    let mut seeded = Vec::new();
    let mut report = BTreeMap::new();
    for name in names {
        if load_base(store, name)?.is_some() {
            seeded.push(name.clone());
        } else {
            report.insert(name.clone(), Outcome::NotSeeded);
        }
    }
    let now = jiff::Timestamp::now();
    let mut pending = Vec::new();
    for name in &seeded {
        let census = census_due(store, name, now, settings.census_interval)?;
        pending.push(observe_from_creds(creds_dir, name, settings, census));
    }
    let observations = futures::future::join_all(pending).await;
    let mut observed = BTreeMap::new();
    let mut censuses = BTreeMap::new();
    for (name, result, census) in observations {
        if let Some(census) = census {
            censuses.insert(name.clone(), census);
        }
        match result {
            Ok(o) => {
                observed.insert(name, o);
            }
            Err(e) => {
                tracing::error!(cluster = %name, error = %crate::error_chain(&e), "inventory refresh failed; the record is unchanged");
                report.insert(
                    name,
                    Outcome::Failed {
                        error: crate::error_chain(&e),
                    },
                );
            }
        }
    }
    for (name, outcome) in write_observations(store, &observed)? {
        report.insert(name, outcome);
    }
    for (name, census) in &censuses {
        write_census(store, name, census);
    }
    Ok(RefreshReport {
        clusters: report
            .into_iter()
            .map(|(cluster, outcome)| ClusterRefresh { cluster, outcome })
            .collect(),
    })
}

/// Observe one cluster with the clients its credentials directory describes, and gather its
/// workload census when `census` (it is due) and the observation succeeded.
async fn observe_from_creds(
    creds_dir: &Path,
    name: &str,
    settings: &RefreshSettings,
    census: bool,
) -> (String, Result<Observation, RefreshError>, Option<Census>) {
    let creds = ClusterCreds::new(creds_dir, name);
    let (result, census) = match creds.clients(name, settings).await {
        Ok((talos, kube)) => {
            let files = CredentialFiles {
                talosconfig: &creds.talosconfig,
                kubeconfig: &creds.kubeconfig,
            };
            let result = observe_with_credentials(&talos, &kube, name, Some(files)).await;
            let census = if census && result.is_ok() {
                Some(super::census::gather(&kube, jiff::Timestamp::now()).await)
            } else {
                None
            };
            (result, census)
        }
        Err(e) => (Err(e), None),
    };
    (name.to_string(), result, census)
}

/// Whether the census stored for `cluster` is missing, unreadable, from the future (the
/// clock moved back) or at least `interval` old at `now`.
pub fn census_due(
    store: &dyn Store,
    cluster: &str,
    now: jiff::Timestamp,
    interval: Duration,
) -> Result<bool, RefreshError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Head {
        gathered_at: String,
    }
    let Some(raw) = store
        .get(Census::TABLE, &census_key(cluster))
        .map_err(RefreshError::Store)?
    else {
        return Ok(true);
    };
    let Some(head) = record::decode_view::<Census, Head>(&raw) else {
        return Ok(true);
    };
    let Ok(at) = head.gathered_at.parse::<jiff::Timestamp>() else {
        return Ok(true);
    };
    let age = now.duration_since(at);
    Ok(age.is_negative() || age.unsigned_abs() >= interval)
}

/// Store a cluster's census under [`census_key`], in its own transaction. A failure is logged:
/// the census is advice for rehearsals, and the next refresh gathers it again.
fn write_census(store: &dyn Store, cluster: &str, census: &Census) {
    if !census.gather_errors.is_empty() {
        tracing::warn!(cluster, unread = ?census.gather_errors.keys().collect::<Vec<_>>(), "workload census is partial: some sources could not be read (see its gatherErrors)");
    }
    if let Err(e) = store.commit(Txn::new().put_record(census_key(cluster), census)) {
        tracing::warn!(cluster, error = %crate::error_chain(&e), "cannot store the workload census; gathered again at the next refresh");
    }
}

/// Merge each observation into its cluster's current record and write the changed ones in one
/// transaction guarded by `Check::Equals` on every record read. On a conflict the records are
/// re-read and the observations merged again (a few times).
pub fn write_observations(
    store: &dyn Store,
    observed: &BTreeMap<String, Observation>,
) -> Result<Vec<(String, Outcome)>, RefreshError> {
    const ATTEMPTS: usize = 5;
    for _ in 0..ATTEMPTS {
        let mut txn = Txn::new();
        let mut outcomes = Vec::new();
        for (name, o) in observed {
            let Some(base) = load_base(store, name)? else {
                // Deleted meanwhile: nothing to refresh.
                outcomes.push((name.clone(), Outcome::NotSeeded));
                continue;
            };
            let next = base.cluster.observe_with(
                o.kubernetes_version.clone(),
                o.machines.clone(),
                o.preflight.clone(),
            );
            if next.generation == base.cluster.generation {
                outcomes.push((
                    name.clone(),
                    Outcome::Unchanged {
                        generation: next.generation,
                    },
                ));
                continue;
            }
            let key = cluster_key(name);
            txn = txn
                .check(Check::Equals(Table::Inventory, key.clone(), base.raw))
                .put_record(key, &next);
            outcomes.push((
                name.clone(),
                Outcome::Changed {
                    from: base.cluster.generation,
                    to: next.generation,
                },
            ));
        }
        if txn.ops.is_empty() {
            return Ok(outcomes);
        }
        match store.commit(txn) {
            Ok(()) => {
                for (name, outcome) in &outcomes {
                    if let Outcome::Changed { from, to } = outcome {
                        tracing::info!(cluster = %name, from, to, "inventory changed");
                    }
                }
                return Ok(outcomes);
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(RefreshError::Store(e)),
        }
    }
    Err(RefreshError::Contended {
        cluster: observed.keys().cloned().collect::<Vec<_>>().join(", "),
    })
}

/// Refresh forever: now, then every `interval` or as soon as `kick` is notified (e.g. after a
/// rollout step; use `notify_one`, which is remembered if the loop is busy). `on_refresh` runs
/// after every refresh with its report; re-plan when [`RefreshReport::changed`]. Store errors
/// are logged and retried at the next tick.
pub async fn refresh_loop(
    store: Arc<dyn Store>,
    creds_dir: PathBuf,
    interval: Duration,
    settings: RefreshSettings,
    kick: Arc<tokio::sync::Notify>,
    on_refresh: impl Fn(&RefreshReport) + Send,
) {
    loop {
        match refresh_all(store.as_ref(), &creds_dir, &settings).await {
            Ok(report) => on_refresh(&report),
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "inventory refresh failed")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = kick.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_install_image_is_read_from_the_v1alpha1_document() {
        let yaml = b"version: v1alpha1\nmachine:\n  type: worker\n  token: s3cret\n  install:\n    disk: /dev/sda\n    image: factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.12.11\n---\napiVersion: v1alpha1\nkind: KubeletConfig\nimage: x\n";
        assert_eq!(
            install_image(yaml).as_deref(),
            Some(
                "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.12.11"
            )
        );
        assert_eq!(install_image(b"version: v1alpha1\nmachine: {}\n"), None);
        assert_eq!(install_image(b"machine: [unclosed"), None);
    }

    #[test]
    fn the_install_image_is_read_from_an_unattended_install_config_document() {
        let yaml = b"version: v1alpha1\nmachine:\n  type: worker\n  token: s3cret\n---\napiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller:\n  image: factory.talos.dev/metal-installer-secureboot/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.6\nprovisioning:\n  diskSelector:\n    match: disk.transport == \"nvme\"\n";
        assert_eq!(
            install_image(yaml).as_deref(),
            Some(
                "factory.talos.dev/metal-installer-secureboot/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.6"
            )
        );
        // an empty v1alpha1 field does not hide the document's
        let yaml = b"version: v1alpha1\nmachine:\n  install:\n    image: \"\"\n---\napiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller:\n  image: factory.example/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.6\n";
        assert_eq!(
            install_image(yaml).as_deref(),
            Some(
                "factory.example/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.6"
            )
        );
        // another kind with an `installer.image` is not read
        let yaml = b"version: v1alpha1\nmachine:\n  type: worker\n---\napiVersion: v1alpha1\nkind: Other\ninstaller:\n  image: x/y:v1.14.6\n";
        assert_eq!(install_image(yaml), None);
    }

    #[test]
    fn image_versions_come_from_the_tag() {
        assert_eq!(
            image_version("registry.k8s.io/kube-apiserver:v1.34.1"),
            Some(KubeVersion::parse("v1.34.1").unwrap())
        );
        assert_eq!(image_version("registry.local:5000/kube-apiserver"), None);
        assert_eq!(image_version("registry.k8s.io/kube-apiserver:latest"), None);
    }

    #[test]
    fn creds_dirs_need_both_files() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            clusters_with_creds(&dir.path().join("missing"))
                .unwrap()
                .is_empty()
        );
        for (name, files) in [
            ("home", &["talosconfig", "kubeconfig"][..]),
            ("half", &["talosconfig"][..]),
            (".hidden", &["talosconfig", "kubeconfig"][..]),
            ("lab", &["kubeconfig", "talosconfig"][..]),
        ] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
            for f in files {
                std::fs::write(dir.path().join(name).join(f), "x").unwrap();
            }
        }
        assert_eq!(clusters_with_creds(dir.path()).unwrap(), ["home", "lab"]);
    }
}
