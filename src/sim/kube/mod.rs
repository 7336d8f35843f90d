//! The simulated kube-apiserver: an HTTPS server (rustls, bearer-token auth) implementing the
//! subset of the Kubernetes REST API that medea's `k8s` adapter and real `kubectl` use.
//!
//! **Owns:** the simulated cluster's Kubernetes objects (nodes as derived from the Talos side,
//! pods, workloads, PDBs, applied objects), its PKI and token, kube-side faults and
//! side-effect counters.
//! **May depend on:** [`crate::sim::node`] (node facts from the Talos side), `k8s` helpers
//! (label-selector semantics), k8s-openapi wire types.
//!
//! Architecture Invariant: the wire API is the real one (paths, JSON shapes, status codes,
//! discovery, watch framing, `Table`s); test knobs (faults, counters, inspection, object
//! seeding) live only on [`KubeSim`], never in the HTTP surface.
//!
//! Architecture Invariant: Node objects are *derived*: `Ready`, `kubeletVersion`, `osImage`,
//! addresses and mirror pods come from [`NodeSource`] on every reconcile; the kube side owns
//! only `spec.unschedulable`, user taints, labels and annotations.
//!
//! See `design/k8s.md` for the endpoint table and the fault catalog.

mod api;
mod apply;
mod batch;
mod cluster;
mod deprecation;
#[doc(hidden)]
pub mod fuzzing;
mod kubeconfig;
mod openapi;
mod pki;
mod resources;
pub mod scenario;
mod selector;
mod status;
mod store;
mod table;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::sim::node::{Keyspace, KeyspaceSource, NodeSource};
use cluster::{KubeSide, Timing};

pub use kubeconfig::write_kubeconfig;

/// The name the CSI attacher gives the VolumeAttachment of volume `handle` of `driver` on
/// `node` (kubernetes `pkg/volume/csi/csi_attacher.go` `getAttachmentName`).
pub fn volume_attachment_name(handle: &str, driver: &str, node: &str) -> String {
    cluster::attachment_name(handle, driver, node)
}
pub use pki::BearerToken;

/// Errors of the simulated kube-apiserver's control surface.
#[derive(Debug, thiserror::Error)]
pub enum KubeSimError {
    #[error("failed to generate the simulated apiserver's certificates")]
    Pki {
        #[source]
        err: rcgen::Error,
    },
    #[error("failed to build the simulated apiserver's TLS configuration")]
    Tls {
        #[source]
        err: rustls::Error,
    },
    #[error("failed to listen on `{addr}` for the simulated apiserver")]
    Bind {
        addr: SocketAddr,
        #[source]
        err: std::io::Error,
    },
    #[error(
        "`{resource}` is not an alpha resource the simulator knows to be removed (api_lifecycle::REMOVED_ALPHA)"
    )]
    UnknownAlpha { resource: String },
    #[error("failed to write the kubeconfig `{path}`")]
    WriteKubeconfig {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error(
        "cluster name `{name}` is not usable in a kubeconfig: use 1-63 lowercase letters, digits, `-` or `.`"
    )]
    ClusterName { name: String },
    #[error("initial object #{index} (`{api_version}/{kind}`) is not a kind the simulator serves")]
    UnknownKind {
        index: usize,
        api_version: String,
        kind: String,
    },
    #[error("initial object #{index} (`{kind}/{name}`) could not be created: {reason}")]
    Seed {
        index: usize,
        kind: String,
        name: String,
        reason: String,
    },
}

/// How long simulated things take, and what the cluster starts with.
#[derive(Debug, Clone)]
pub struct KubeSimConfig {
    /// Address to listen on; port 0 picks a free port.
    pub bind: SocketAddr,
    /// Time a newly created or rescheduled pod needs to become Running and Ready
    /// (what unblocks a PDB after an eviction). Zero in tests.
    pub pod_start_delay: Duration,
    /// Time an evicted or deleted pod stays Terminating before it disappears. Zero in tests.
    pub pod_termination_delay: Duration,
    /// How often the server re-reads the [`NodeSource`] while watches are open (requests
    /// always see fresh state).
    pub refresh_interval: Duration,
    /// Objects the cluster starts with (Deployments, DaemonSets, PDBs, ConfigMaps, pods...),
    /// for example [`scenario::default_scenario`].
    pub objects: Vec<Value>,
    /// Time a new CustomResourceDefinition takes to become Established (and its kinds to be
    /// served): 5 s on an HA control plane upstream (apiextensions-apiserver
    /// `customresource_handler.go`).
    pub crd_establish_delay: Duration,
    /// Time a CSI volume takes to detach once no pod on its node uses it: its VolumeAttachment
    /// stays, marked deleted, this long (the external-attacher's `ControllerUnpublishVolume`).
    pub volume_detach_delay: Duration,
}

impl Default for KubeSimConfig {
    /// Instant pods, no content: what tests usually want.
    fn default() -> Self {
        KubeSimConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            pod_start_delay: Duration::ZERO,
            pod_termination_delay: Duration::ZERO,
            refresh_interval: Duration::from_millis(200),
            objects: Vec::new(),
            crd_establish_delay: Duration::from_secs(5),
            volume_detach_delay: Duration::from_secs(2),
        }
    }
}

impl KubeSimConfig {
    /// The demo: the default scenario with pods that take a few seconds to come and go.
    pub fn demo() -> Self {
        KubeSimConfig {
            pod_start_delay: Duration::from_secs(3),
            pod_termination_delay: Duration::from_secs(1),
            objects: scenario::default_scenario(),
            ..KubeSimConfig::default()
        }
    }
}

/// How long the apiserver stays unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    /// The next `n` requests get `503 ServiceUnavailable`.
    Requests(u32),
    /// Every request gets 503 for this long (from when the fault is injected).
    For(Duration),
}

/// Kube-side faults, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeFault {
    /// The PDB never allows a disruption: every eviction it guards gets 429.
    PdbNeverAllows { namespace: String, pdb: String },
    /// The apiserver answers 503 for a while.
    ApiUnavailable(Outage),
    /// The node reports `Ready=False` (KubeletNotReady) whatever the Talos side says.
    NodeNeverReady { node: String },
    /// RBAC takes a permission away: matching requests get 403 `Forbidden` and
    /// `SelfSubjectAccessReview`s (`kubectl auth can-i`) answer `allowed: false`.
    Forbidden(Forbidden),
    /// The node reports `condition` (`MemoryPressure`, `DiskPressure`, `PIDPressure`) as
    /// `True`, with the kubelet's reason and message and the matching NoSchedule taint.
    NodePressure { node: String, condition: String },
    /// Another client writes the object `namespace/name` (of any resource) right after each
    /// of the next `times` GETs of it: the writer's annotation `sim.medea.dev/concurrent-writer`
    /// changes and the resourceVersion moves on, so an update at the resourceVersion just read
    /// gets the apiserver's `409 Conflict` ("the object has been modified").
    ConcurrentWriteAfterGet {
        namespace: String,
        name: String,
        times: u32,
    },
    /// Every new pod of the static pod `component` (`kube-apiserver`, …) needs `extra` on top
    /// of the pod start delay to become Ready, as a kube-apiserver that must reach etcd and
    /// pass its startup probe (Talos 1.14 `k8stemplates/apiserver.go`: `initialDelaySeconds:
    /// 10`) comes back later than a kube-scheduler restarted with it.
    SlowStaticPodStart { component: String, extra: Duration },
    /// The containers of every pod of a Job in `namespace` whose name starts with
    /// `job_prefix` exit with `exit_code` (a failing hook Job), unless the pod carries the
    /// test-only annotation `sim.medea.dev/exit-code`.
    JobPodExit {
        namespace: String,
        job_prefix: String,
        exit_code: i32,
    },
    /// The VolumeAttachments of `node` never finish detaching (the CSI driver's
    /// `ControllerUnpublishVolume` hangs): each stays, marked deleted, while the fault holds.
    DetachNeverCompletes { node: String },
}

/// One permission the simulated user does not have: a verb on a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forbidden {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete` (`*` = every verb).
    pub verb: String,
    /// API group, `""` for the core group.
    pub group: String,
    /// Plural resource name, e.g. `pods`; or a non-resource URL path, e.g. `/metrics`.
    pub resource: String,
    /// Subresource, e.g. `eviction`; `""` for the resource itself.
    pub subresource: String,
}

impl Forbidden {
    /// Parse kubectl's resource notation: `nodes`, `pods/eviction`,
    /// `poddisruptionbudgets.policy`; a path (`/metrics`) is a non-resource URL.
    pub fn parse(verb: &str, resource: &str) -> Forbidden {
        if resource.starts_with('/') {
            return Forbidden {
                verb: verb.to_string(),
                group: String::new(),
                resource: resource.to_string(),
                subresource: String::new(),
            };
        }
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
        Forbidden {
            verb: verb.to_string(),
            group: group.to_string(),
            resource: plural.to_string(),
            subresource: subresource.to_string(),
        }
    }

    pub(crate) fn matches(&self, verb: &str, group: &str, resource: &str, sub: &str) -> bool {
        (self.verb == "*" || self.verb == verb)
            && self.group == group
            && self.resource == resource
            && self.subresource == sub
    }
}

/// Side effects the simulated apiserver has seen (tests assert on these).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KubeCounters {
    /// Authenticated requests (including refused ones).
    pub requests: u64,
    /// Requests refused with 401.
    pub unauthorized: u64,
    /// Requests refused with 503 by an [`KubeFault::ApiUnavailable`] fault.
    pub unavailable: u64,
    /// Evictions accepted.
    pub evictions: u64,
    /// Evictions refused with 429 by a PodDisruptionBudget.
    pub evictions_blocked: u64,
    /// `DELETE` requests on pods (medea's drain must never send one).
    pub pod_deletes: u64,
    /// `DELETE` requests on any resource.
    pub deletes: u64,
    /// Merge / strategic-merge patches.
    pub patches: u64,
    /// Server-side applies.
    pub applies: u64,
    /// Creates (`POST`).
    pub creates: u64,
    /// Replaces (`PUT`).
    pub updates: u64,
    /// Reconcile passes run (a request whose inputs did not change since a pass that changed
    /// nothing runs none).
    pub reconciles: u64,
    /// Evictions accepted that a node's own server-side drain sent (Talos' legacy
    /// `MachineService.Upgrade`), not counted in `evictions`.
    pub talos_drain_evictions: u64,
    /// Evictions of a node's own server-side drain refused (a PodDisruptionBudget's 429), not
    /// counted in `evictions_blocked`.
    pub talos_drain_refused: u64,
}

/// One thing the simulated cluster recorded ([`KubeSim::history`]), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterRecord {
    /// A Node became unschedulable.
    Cordoned(String),
    /// A Node became schedulable again.
    Uncordoned(String),
    /// The scheduler bound a pod (`namespace/name`) to a node.
    Bound {
        /// The pod.
        pod: String,
        /// The node.
        node: String,
    },
    /// A node's own server-side drain (Talos' legacy `MachineService.Upgrade`) evicted a pod
    /// (`namespace/name`).
    TalosEvicted {
        /// The pod.
        pod: String,
        /// The node that drained itself.
        node: String,
    },
    /// A node's own server-side drain could not evict a pod (a PodDisruptionBudget refused);
    /// the pod stays.
    TalosEvictionRefused {
        /// The pod.
        pod: String,
        /// The node that drained itself.
        node: String,
    },
}

/// A pod as the control handle reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimPod {
    pub namespace: String,
    pub name: String,
    pub node: Option<String>,
    pub phase: String,
    pub ready: bool,
    pub terminating: bool,
    /// A mirror pod (a static pod's API object).
    pub mirror: bool,
    /// `Kind/name` of the controller, e.g. `ReplicaSet/web-7c9d…` or `DaemonSet/kube-proxy`.
    pub controller: Option<String>,
    /// The first container's image.
    pub image: String,
}

pub(crate) struct Shared {
    pub cluster: Mutex<KubeSide>,
    pub token: BearerToken,
    pub server_address: String,
    pub wake: Notify,
    refresh: Duration,
}

/// A running simulated kube-apiserver and its control handle. Dropping it stops the server.
pub struct KubeSim {
    addr: SocketAddr,
    /// The port every control-plane node's own kube-apiserver listens on (0: none).
    apiserver_port: u16,
    /// The control-plane nodes with their own listener, by name.
    control_planes: Vec<(String, IpAddr)>,
    ca_pem: String,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for KubeSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSim")
            .field("addr", &self.addr)
            .field("token", &self.shared.token)
            .finish_non_exhaustive()
    }
}

/// Start the simulated kube-apiserver; nodes are derived from `nodes`.
pub async fn start(
    config: KubeSimConfig,
    nodes: Arc<dyn NodeSource>,
) -> Result<KubeSim, KubeSimError> {
    let control_planes: Vec<(String, IpAddr)> = nodes
        .control_planes()
        .into_iter()
        .filter_map(|n| Some((n.name, n.address.parse().ok()?)))
        .collect();
    let addresses: Vec<IpAddr> = control_planes.iter().map(|(_, ip)| *ip).collect();
    let pki = pki::generate(&addresses)?;
    let token = BearerToken::generate()?;
    let listener = TcpListener::bind(config.bind)
        .await
        .map_err(|err| KubeSimError::Bind {
            addr: config.bind,
            err,
        })?;
    let addr = listener.local_addr().map_err(|err| KubeSimError::Bind {
        addr: config.bind,
        err,
    })?;
    let (apiserver_port, node_listeners) = bind_node_apiservers(&control_planes).await?;
    let seed = u64::from_str_radix(&token.expose()[..16], 16).unwrap_or(1);
    let source = nodes.clone();
    let mut cluster = KubeSide::new(
        nodes,
        Timing {
            start: config.pod_start_delay,
            termination: config.pod_termination_delay,
            crd_establish: config.crd_establish_delay,
        },
        seed,
    );
    cluster.apiserver_port = apiserver_port;
    cluster.detach_delay = config.volume_detach_delay;
    seed_objects(&mut cluster, &config.objects)?;
    let shared = Arc::new(Shared {
        cluster: Mutex::new(cluster),
        token,
        server_address: addr.to_string(),
        wake: Notify::new(),
        refresh: config.refresh_interval,
    });
    // What this apiserver stores is what the control plane's etcd holds.
    source.attach_keyspace(Arc::new(StoredKeyspace(Arc::downgrade(&shared))));
    let router = axum::Router::new()
        .fallback(api::handle)
        .with_state(shared.clone());
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.tls.clone());
    let mut tasks = vec![tokio::spawn(serve_listener(
        listener,
        acceptor.clone(),
        router.clone().layer(axum::Extension(ServedBy(None))),
        None,
    ))];
    for (node, listener) in node_listeners {
        let router = router
            .clone()
            .layer(axum::Extension(ServedBy(Some(node.clone()))));
        tasks.push(tokio::spawn(serve_listener(
            listener,
            acceptor.clone(),
            router,
            Some((shared.clone(), node)),
        )));
    }
    tasks.push(tokio::spawn(tick(shared.clone())));
    Ok(KubeSim {
        addr,
        apiserver_port,
        control_planes,
        ca_pem: pki.ca_pem,
        shared,
        tasks,
    })
}

/// The store of a running kube side as etcd's keyspace ([`KeyspaceSource`]); it holds the
/// kube side weakly, so a Talos side that outlives it (or keeps it) leaks nothing.
struct StoredKeyspace(std::sync::Weak<Shared>);

impl KeyspaceSource for StoredKeyspace {
    fn keyspace(&self) -> Option<Keyspace> {
        let shared = self.0.upgrade()?;
        let mut c = shared.cluster.lock().ok()?;
        // Converge first, as every request does: the Nodes the kubelets registered are stored.
        c.reconcile(Instant::now(), jiff::Timestamp::now());
        Some(c.store.etcd_keyspace())
    }
}

/// Which kube-apiserver a listener stands for: a control-plane node's own (by name), or the
/// control-plane endpoint (`None`), whose requests the endpoint's holder serves.
#[derive(Debug, Clone)]
pub(crate) struct ServedBy(pub Option<String>);

/// Bind every control-plane node's own kube-apiserver listener, `<address>:<port>` with one
/// port for all of them, as a real control plane has (each apiserver's `--secure-port`; the
/// `kubernetes` EndpointSlice carries a single port for every address). The port is a free
/// one, so several simulators on one machine can share node addresses; a port another
/// simulator holds on one of the addresses is given up and another tried.
async fn bind_node_apiservers(
    control_planes: &[(String, IpAddr)],
) -> Result<(u16, Vec<(String, TcpListener)>), KubeSimError> {
    let Some(((first_name, first_ip), rest)) = control_planes.split_first() else {
        return Ok((0, Vec::new()));
    };
    let bind =
        |addr: SocketAddr| async move { TcpListener::bind(addr).await.map_err(|err| (addr, err)) };
    let mut last = None;
    for _ in 0..64 {
        let first = bind(SocketAddr::new(*first_ip, 0))
            .await
            .map_err(|(addr, err)| KubeSimError::Bind { addr, err })?;
        let port = first
            .local_addr()
            .map_err(|err| KubeSimError::Bind {
                addr: SocketAddr::new(*first_ip, 0),
                err,
            })?
            .port();
        let mut bound = vec![(first_name.clone(), first)];
        let mut clash = None;
        for (name, ip) in rest {
            match bind(SocketAddr::new(*ip, port)).await {
                Ok(l) => bound.push((name.clone(), l)),
                Err((addr, err)) if err.kind() == std::io::ErrorKind::AddrInUse => {
                    clash = Some((addr, err));
                    break;
                }
                Err((addr, err)) => return Err(KubeSimError::Bind { addr, err }),
            }
        }
        match clash {
            None => return Ok((port, bound)),
            Some(c) => last = Some(c),
        }
    }
    let (addr, err) = last.unwrap_or_else(|| {
        (
            SocketAddr::new(*first_ip, 0),
            std::io::Error::from(std::io::ErrorKind::AddrInUse),
        )
    });
    Err(KubeSimError::Bind { addr, err })
}

/// Accept TLS connections on `listener` and serve `router` on them. A node's own listener
/// (`node` set) takes no connection while that node's kube-apiserver is down (the node is
/// rebooting or upgrading): the connection is closed at once, as a port nobody listens on
/// refuses it.
#[allow(
    clippy::expect_used,
    reason = "a poisoned cluster lock means a simulator thread panicked mid-update; serving its half-updated state would be worse than stopping"
)]
async fn serve_listener(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    router: axum::Router,
    node: Option<(Arc<Shared>, String)>,
) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((tcp, _peer)) = listener.accept().await else {
            // a passing accept error (EMFILE): back off instead of spinning
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if let Some((shared, name)) = &node {
            let up = {
                let c = shared.cluster.lock().expect("cluster lock");
                c.apiserver_up(name)
            };
            if !up {
                drop(tcp);
                continue;
            }
        }
        // as Go's net/http does: no Nagle delay on small responses
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(router.clone());
        connections.spawn(async move {
            let Ok(Ok(tls)) =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
            else {
                return;
            };
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(tls), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

fn seed_objects(cluster: &mut KubeSide, objects: &[Value]) -> Result<(), KubeSimError> {
    let wall = jiff::Timestamp::now();
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let _ = cluster.store.create(
            &resources::NAMESPACES,
            serde_json::json!({
                "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            }),
            wall,
        );
    }
    seed_apf_configuration(cluster, wall);
    for (index, obj) in objects.iter().enumerate() {
        seed_one(cluster, index, obj.clone())?;
    }
    Ok(())
}

/// Seeded objects may name an owner seeded before them without its `uid` (which the store
/// assigns at creation): the seeder fills in that owner's `uid`, as a restore of etcd holds
/// both with their references intact. An owner named without a `uid` that was not seeded
/// before is refused. (The API itself never resolves a reference: a request names the uid.)
fn resolve_owner_uids(cluster: &KubeSide, obj: &mut Value) -> Result<(), String> {
    let ns = store::ns_of(obj).to_string();
    let Some(refs) = obj
        .pointer_mut("/metadata/ownerReferences")
        .and_then(Value::as_array_mut)
    else {
        return Ok(());
    };
    for r in refs {
        let has_uid = r
            .get("uid")
            .and_then(Value::as_str)
            .is_some_and(|u| !u.is_empty());
        if has_uid {
            continue;
        }
        let text = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let (api_version, kind, name) = (text("apiVersion"), text("kind"), text("name"));
        let uid = resources::by_kind(&api_version, &kind)
            .and_then(|rt| cluster.store.get(rt, if rt.namespaced { &ns } else { "" }, &name))
            .map(|owner| store::uid_of(owner).to_string())
            .ok_or_else(|| {
                format!(
                    "ownerReference to {kind} `{name}` has no uid and no such object was seeded before it"
                )
            })?;
        r["uid"] = Value::String(uid);
    }
    Ok(())
}

/// The field manager of the kube-apiserver's API Priority and Fairness configuration
/// (kubernetes `pkg/registry/flowcontrol/ensurer/strategy.go`, `fieldManager`).
pub(crate) const APF_MANAGER: &str = "api-priority-and-fairness-config-producer-v1";

/// The mandatory APF objects every kube-apiserver creates at start (`exempt`, `catch-all`;
/// k8s.io/apiserver `pkg/apis/flowcontrol/bootstrap/default.go`), written through
/// `flowcontrol.apiserver.k8s.io/v1` by [`APF_MANAGER`] and marked for auto-update: the
/// managedFields entries a deprecated-API check must not mistake for a client's.
fn seed_apf_configuration(cluster: &mut KubeSide, wall: jiff::Timestamp) {
    let annotations = serde_json::json!({"apf.kubernetes.io/autoupdate-spec": "true"});
    let rules = |groups: &[&str]| {
        let subjects: Vec<Value> = groups
            .iter()
            .map(|g| serde_json::json!({"kind": "Group", "group": {"name": g}}))
            .collect();
        serde_json::json!([{
            "subjects": subjects,
            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": true, "namespaces": ["*"]}],
            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
        }])
    };
    let objects = [
        (
            &resources::PRIORITYLEVELS,
            serde_json::json!({"metadata": {"name": "exempt", "annotations": annotations},
                "spec": {"type": "Exempt", "exempt": {"nominalConcurrencyShares": 0, "lendablePercent": 0}}}),
        ),
        (
            &resources::PRIORITYLEVELS,
            serde_json::json!({"metadata": {"name": "catch-all", "annotations": annotations},
                "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 5, "lendablePercent": 0, "limitResponse": {"type": "Reject"}}}}),
        ),
        (
            &resources::FLOWSCHEMAS,
            serde_json::json!({"metadata": {"name": "exempt", "annotations": annotations},
                "spec": {"matchingPrecedence": 1, "priorityLevelConfiguration": {"name": "exempt"}, "rules": rules(&["system:masters"])}}),
        ),
        (
            &resources::FLOWSCHEMAS,
            serde_json::json!({"metadata": {"name": "catch-all", "annotations": annotations},
                "spec": {"matchingPrecedence": 10000, "priorityLevelConfiguration": {"name": "catch-all"},
                    "distinguisherMethod": {"type": "ByUser"},
                    "rules": rules(&["system:unauthenticated", "system:authenticated"])}}),
        ),
    ];
    let time = store::k8s_time(wall);
    for (rt, mut obj) in objects {
        obj["apiVersion"] = serde_json::json!(rt.api_version());
        obj["kind"] = serde_json::json!(rt.kind);
        let key = (rt.key(), String::new(), store::name_of(&obj).to_string());
        let owners = cluster.owners.entry(key.clone()).or_default();
        apply::record_update(None, &obj, owners, APF_MANAGER);
        cluster
            .updaters
            .entry(key.clone())
            .or_default()
            .insert(APF_MANAGER.to_string());
        cluster
            .deprecation
            .note_writer(&key, APF_MANAGER, &rt.api_version(), &time);
        let owners = cluster.owners.get(&key).cloned().unwrap_or_default();
        let updaters = cluster.updaters.get(&key).cloned().unwrap_or_default();
        obj["metadata"]["managedFields"] =
            api::managed_fields(cluster, rt, &key, &owners, &updaters, wall);
        let _ = cluster.store.create(rt, obj, wall);
    }
}

/// Create one object as a client would (any served kind except nodes).
fn seed_one(cluster: &mut KubeSide, index: usize, mut obj: Value) -> Result<(), KubeSimError> {
    let api_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let Some(rt) = resources::by_kind(&api_version, &kind) else {
        return Err(KubeSimError::UnknownKind {
            index,
            api_version,
            kind,
        });
    };
    let name = store::name_of(&obj).to_string();
    let err = |reason: &str| KubeSimError::Seed {
        index,
        kind: kind.clone(),
        name: name.clone(),
        reason: reason.to_string(),
    };
    if name.is_empty() {
        return Err(err("metadata.name is missing"));
    }
    if rt.owner == resources::Owner::Node {
        return Err(err("nodes come from the Talos side (NodeSource)"));
    }
    if rt.namespaced && store::ns_of(&obj).is_empty() {
        obj["metadata"]["namespace"] = serde_json::json!("default");
    }
    resolve_owner_uids(cluster, &mut obj).map_err(|reason| err(&reason))?;
    cluster
        .store
        .create(rt, obj, jiff::Timestamp::now())
        .map(|_| ())
        .map_err(|_| err("an object with this name already exists"))
}

/// Reconcile when something is due (a pod start or removal) and, while watches are open,
/// every refresh interval so NodeSource changes reach watchers.
#[allow(
    clippy::expect_used,
    reason = "a poisoned cluster lock means a simulator thread panicked mid-update; serving its half-updated state would be worse than stopping"
)]
async fn tick(shared: Arc<Shared>) {
    loop {
        let (due, watching) = {
            let c = shared.cluster.lock().expect("cluster lock");
            (c.next_due(Instant::now()), c.store.has_watchers())
        };
        let refresh = watching.then(|| Instant::now() + shared.refresh);
        let wake_at = [due, refresh].into_iter().flatten().min();
        match wake_at {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = shared.wake.notified() => {}
                }
            }
            None => shared.wake.notified().await,
        }
        let mut c = shared.cluster.lock().expect("cluster lock");
        c.reconcile(Instant::now(), jiff::Timestamp::now());
    }
}

impl KubeSim {
    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The port every control-plane node's own kube-apiserver listens on, at the node's
    /// address (what the `kubernetes` EndpointSlice of `default` publishes).
    pub fn apiserver_port(&self) -> u16 {
        self.apiserver_port
    }

    /// `https://<address>:<port>` of `node`'s own kube-apiserver, if it is a control plane.
    pub fn node_apiserver_url(&self, node: &str) -> Option<String> {
        self.control_planes
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, ip)| format!("https://{}", SocketAddr::new(*ip, self.apiserver_port)))
    }

    /// The CA certificate (PEM) that signed the serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The bearer token clients must present.
    pub fn token(&self) -> &BearerToken {
        &self.shared.token
    }

    /// Write a kubeconfig for this server (0600, parents 0700).
    pub fn write_kubeconfig(&self, path: &Path, cluster: &str) -> Result<(), KubeSimError> {
        write_kubeconfig(path, &self.url(), &self.ca_pem, &self.shared.token, cluster)
    }

    #[allow(
        clippy::expect_used,
        reason = "a poisoned cluster lock means a simulator thread panicked mid-update; serving its half-updated state would be worse than stopping"
    )]
    fn cluster(&self) -> std::sync::MutexGuard<'_, KubeSide> {
        self.shared.cluster.lock().expect("cluster lock")
    }

    /// Activate a fault.
    pub fn inject(&self, fault: KubeFault) {
        self.cluster().inject(fault, Instant::now());
        self.shared.wake.notify_one();
    }

    /// Change how long pods take to start and terminate from now on (e.g. start a test with
    /// instantly Ready pods, then make replacements slow to create PDB pressure).
    pub fn set_pod_delays(&self, start: Duration, termination: Duration) {
        let mut cluster = self.cluster();
        let crd_establish = cluster.timing().crd_establish;
        cluster.set_timing(Timing {
            start,
            termination,
            crd_establish,
        });
    }

    /// Change how long a CSI volume takes to detach from now on.
    pub fn set_volume_detach_delay(&self, delay: Duration) {
        self.cluster().detach_delay = delay;
        self.shared.wake.notify_one();
    }

    /// Remove every fault.
    pub fn clear_faults(&self) {
        self.cluster().clear_faults();
        self.shared.wake.notify_one();
    }

    /// The side-effect counters so far.
    pub fn counters(&self) -> KubeCounters {
        self.cluster().counters
    }

    /// Converge now (e.g. after the Talos side changed) and list every pod.
    pub fn pods(&self) -> Vec<SimPod> {
        let mut c = self.cluster();
        c.reconcile(Instant::now(), jiff::Timestamp::now());
        c.pods()
    }

    /// The pods currently bound to `node`.
    pub fn pods_on(&self, node: &str) -> Vec<SimPod> {
        self.pods()
            .into_iter()
            .filter(|p| p.node.as_deref() == Some(node))
            .collect()
    }

    /// The latest cordons, uncordons and pod bindings, in order (a test's record).
    pub fn history(&self) -> Vec<ClusterRecord> {
        let mut c = self.cluster();
        c.reconcile(Instant::now(), jiff::Timestamp::now());
        c.history.iter().cloned().collect()
    }

    /// The node's taints (`key=value:effect`), if it exists.
    pub fn taints(&self, node: &str) -> Option<Vec<String>> {
        let mut c = self.cluster();
        c.reconcile(Instant::now(), jiff::Timestamp::now());
        let n = c.store.get(&resources::NODES, "", node)?;
        Some(
            n.pointer("/spec/taints")
                .and_then(Value::as_array)
                .map(|ts| {
                    ts.iter()
                        .map(|t| {
                            let s = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or("");
                            format!("{}={}:{}", s("key"), s("value"), s("effect"))
                        })
                        .collect()
                })
                .unwrap_or_default(),
        )
    }

    /// Whether the node is cordoned (`spec.unschedulable`), if it exists.
    pub fn unschedulable(&self, node: &str) -> Option<bool> {
        let mut c = self.cluster();
        c.reconcile(Instant::now(), jiff::Timestamp::now());
        c.store
            .get(&resources::NODES, "", node)
            .map(|n| n.pointer("/spec/unschedulable") == Some(&serde_json::json!(true)))
    }

    /// Add an object as if a client had created it (any kind the simulator serves except
    /// nodes), e.g. a bare pod or an extra PDB.
    pub fn create(&self, obj: Value) -> Result<(), KubeSimError> {
        let mut c = self.cluster();
        seed_one(&mut c, 0, obj)?;
        c.reconcile(Instant::now(), jiff::Timestamp::now());
        self.shared.wake.notify_one();
        Ok(())
    }

    /// The stored object of `api_version` `kind` (a custom kind once its CRD is Established)
    /// at `namespace/name` (`""` for a cluster-scoped one), as the simulated controllers last
    /// left it.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let mut c = self.cluster();
        c.reconcile(Instant::now(), jiff::Timestamp::now());
        let rt = resources::by_kind(api_version, kind)?;
        c.store.get(rt, namespace, name).cloned()
    }

    /// Converge now, then what this apiserver has stored, as the control plane's etcd holds
    /// it: what the Talos side's `EtcdSnapshot` serves (tests compare the two).
    pub fn keyspace(&self) -> Keyspace {
        let mut c = self.cluster();
        c.reconcile(Instant::now(), jiff::Timestamp::now());
        c.store.etcd_keyspace()
    }

    /// Turn on an alpha resource that a later minor removes, as `--runtime-config` does, with
    /// objects `(namespace, name)` (namespace empty for a cluster-scoped one): it is listed
    /// while the served minor is below its removal. `resource` is go-kubernetes' name
    /// (`podgroups.v1alpha2.scheduling.k8s.io`).
    pub fn enable_alpha(
        &self,
        resource: &str,
        objects: &[(&str, &str)],
    ) -> Result<(), KubeSimError> {
        if !crate::api_lifecycle::REMOVED_ALPHA
            .iter()
            .any(|r| r.resource_arg() == resource)
        {
            return Err(KubeSimError::UnknownAlpha {
                resource: resource.to_string(),
            });
        }
        self.cluster().alpha.insert(
            resource.to_string(),
            objects
                .iter()
                .map(|(ns, n)| (ns.to_string(), n.to_string()))
                .collect(),
        );
        Ok(())
    }

    /// Pretend the kube-apiserver of control-plane node `node` (re)started at `unix` seconds
    /// (its `/metrics` then reports that `process_start_time_seconds`); no effect on a node
    /// whose apiserver is down.
    pub fn set_apiserver_started(&self, node: &str, unix: i64) {
        let mut c = self.cluster();
        c.observe_apiservers();
        c.deprecation.set_started(node, unix);
    }

    /// Stop serving (also happens on drop).
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for KubeSim {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
