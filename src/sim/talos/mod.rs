//! The Talos side of the simulator: one mTLS gRPC listener that serves the Talos machine API for
//! many simulated nodes, routing on the `node` metadata key like apid.
//!
//! **Owns:** the simulated nodes' state ([`model`]), the wire handlers ([`server`]), fault plans
//! ([`fault`]), scenario files ([`scenario`]) and the machine configs ([`machineconfig`]).
//! **May depend on:** `talos` (wire types, `Secret`), `sim::pki`, `sim::node`, `version`.
//!
//! Architecture Invariants:
//! - The wire API is the real one (`proto/talos`); test knobs live on [`SimTalos`] only.
//! - A request carrying the deprecated `nodes` key is refused (`InvalidArgument`) and counted
//!   ([`SimTalos::nodes_metadata_rejections`]), so tests can prove a client never sends it.
//! - Every call that reaches a node is counted per node and method ([`NodeCounters`]).

pub mod fault;
pub mod machineconfig;
pub(crate) mod manifests;
pub(crate) mod model;
pub(crate) mod registry;
pub mod scenario;
pub(crate) mod server;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Serialize;
use tonic::transport::{Identity, Server, ServerTlsConfig};

pub use fault::{Effect, FaultError, FaultPlan, Method, NodeCounters, Trigger};
pub use model::etcd::Forfeit as EtcdForfeit;
pub use model::{Bootloader, Power};
pub use scenario::{
    EtcdAlarmKind, EtcdAlarmSpec, MachineConfigExtra, NodeSpec, RebootTiming, Role, Scenario,
    ScenarioError, Timing, WorkloadSpec,
};

use self::fault::ArmedFault;
use self::model::{RebootTicket, TalosSide};
use self::server::{Api, Shared};
use crate::secret::Secret;
use crate::sim::node::{NodeFacts, NodeSource};
use crate::sim::pki::{PkiError, SimPki, write_secret_file};
use crate::talos::client::with_limits;
use crate::talos::proto::cluster::cluster_service_server::ClusterServiceServer;
use crate::talos::proto::cosi::resource::state_server::StateServer;
use crate::talos::proto::machine::image_service_server::ImageServiceServer;
use crate::talos::proto::machine::lifecycle_service_server::LifecycleServiceServer;
use crate::talos::proto::machine::machine_service_server::MachineServiceServer;
use crate::version::TalosVersion;

/// The talosconfig context name the simulator writes.
pub const SIM_CONTEXT: &str = "medea-sim";
/// The file name [`SimTalos::write_talosconfig`] writes.
pub const TALOSCONFIG_FILE: &str = "talosconfig";

/// Why the simulator could not start or act.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("failed to listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        err: std::io::Error,
    },
    #[error("failed to set up the simulator's TLS")]
    Tls(#[source] tonic::transport::Error),
    #[error("simulator PKI")]
    Pki(#[source] PkiError),
    #[error("invalid fault plan")]
    Fault(#[source] FaultError),
    #[error("no simulated node `{node}` (nodes: {known})")]
    UnknownNode { node: String, known: String },
    #[error("node `{node}` is not rebooting ({state:?}); only a rebooting node can finish booting")]
    NotRebooting { node: String, state: Power },
    #[error("invalid scenario")]
    Scenario(#[source] Box<ScenarioError>),
}

type ServeTask = tokio::task::JoinHandle<Result<(), tonic::transport::Error>>;

/// A snapshot of one simulated node, for assertions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeState {
    pub name: String,
    pub address: String,
    pub role: Role,
    pub power: Power,
    /// The version it runs now.
    pub running: TalosVersion,
    /// A boot entry written by an upgrade, booted by the next reboot.
    pub installed: Option<TalosVersion>,
    /// Every boot entry on the node and the version it boots: systemd-boot's UKIs
    /// (`Talos-<v>[~N].efi`), GRUB's labels (`A`, `B`). What a rollback can reach is here.
    pub boot_entries: Vec<(String, TalosVersion)>,
    pub boot_id: String,
    pub boots: u64,
    pub etcd_healthy: bool,
    pub config_version: u64,
    pub staged_config: bool,
    pub kubelet_image: String,
    pub static_pod_images: BTreeMap<String, String>,
    pub pulled_images: Vec<String>,
    /// Images pulled into the CRI namespace (`k8s.io`).
    pub cri_images: Vec<String>,
    /// Every completed pull in order: (image, into the CRI namespace).
    pub pulls: Vec<(String, bool)>,
    /// A `LifecycleService` install is running in the current boot (its one-at-a-time lock
    /// is held).
    pub installing: bool,
}

/// A running Talos simulator and its control surface. Cheap to clone; all clones drive the same
/// simulator. Implements [`NodeSource`] for the kube side.
#[derive(Clone)]
pub struct SimTalos {
    shared: Arc<Shared>,
    pki: Arc<SimPki>,
    addr: SocketAddr,
    shutdown: Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>,
    task: Arc<Mutex<Option<ServeTask>>>,
}

impl std::fmt::Debug for SimTalos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimTalos")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl SimTalos {
    /// Start the simulator on `listen` (use `127.0.0.1:0` for a free port; see [`Self::addr`]).
    pub async fn start(scenario: Scenario, listen: SocketAddr) -> Result<SimTalos, SimError> {
        scenario
            .validate(Path::new("<scenario>"))
            .map_err(|e| SimError::Scenario(Box::new(e)))?;
        let now = jiff::Timestamp::now();
        let today = now.to_zoned(jiff::tz::TimeZone::UTC).date();
        let mut sans: Vec<String> = scenario.nodes.iter().map(|n| n.address.clone()).collect();
        if !listen.ip().is_unspecified() {
            sans.push(listen.ip().to_string());
        }
        let mut pki = SimPki::generate(&sans, today).map_err(SimError::Pki)?;
        if let Some(valid_for) = scenario.client_cert_valid_for {
            pki.admin = pki
                .issue_client_valid_for(&["os:admin"], valid_for)
                .map_err(SimError::Pki)?;
        }

        let mut cluster = TalosSide::new(&scenario, pki.ca_pem(), now.as_second());
        for a in &scenario.etcd_alarms {
            if let Some(n) = cluster.nodes().iter().find(|n| n.spec.name == a.node) {
                let member = n.member_id;
                cluster.etcd_alarms.insert((member, a.alarm));
            }
        }
        let shared = Arc::new(Shared {
            cluster: Mutex::new(cluster),
            keyspace: Mutex::new(None),
        });
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|err| SimError::Bind { addr: listen, err })?;
        let addr = listener
            .local_addr()
            .map_err(|err| SimError::Bind { addr: listen, err })?;

        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(
                &pki.server.cert_pem,
                pki.server.key_pem_standard.expose(),
            ))
            .client_ca_root(tonic::transport::Certificate::from_pem(pki.ca_pem()));
        let api = Api {
            shared: shared.clone(),
        };
        let router = Server::builder()
            .tls_config(tls)
            .map_err(SimError::Tls)?
            .add_service(with_limits!(MachineServiceServer::new(api.clone())))
            .add_service(with_limits!(LifecycleServiceServer::new(api.clone())))
            .add_service(with_limits!(ImageServiceServer::new(api.clone())))
            .add_service(with_limits!(ClusterServiceServer::new(api.clone())))
            .add_service(with_limits!(StateServer::new(api)));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        // Go servers (apid) disable Nagle on every connection; without it each small gRPC
        // frame waits for the peer's delayed ACK (40 ms on Linux).
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |conn| {
                conn.inspect(|tcp| {
                    let _ = tcp.set_nodelay(true);
                })
            },
        );
        let task = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
            let _ = rx.await;
        }));
        let sim = SimTalos {
            shared,
            pki: Arc::new(pki),
            addr,
            shutdown: Arc::new(Mutex::new(Some(tx))),
            task: Arc::new(Mutex::new(Some(task))),
        };
        for f in &scenario.faults {
            sim.set_fault(f.clone())?;
        }
        Ok(sim)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The endpoint clients dial (`127.0.0.1:PORT` when listening on all addresses).
    pub fn endpoint(&self) -> String {
        let ip = if self.addr.ip().is_unspecified() {
            IpAddr::from([127, 0, 0, 1])
        } else {
            self.addr.ip()
        };
        SocketAddr::new(ip, self.addr.port()).to_string()
    }

    /// The scenario's cluster name.
    pub fn cluster_name(&self) -> String {
        self.shared.lock().name.clone()
    }

    /// The simulator's PKI (e.g. to issue a reader certificate in a test).
    pub fn pki(&self) -> &SimPki {
        &self.pki
    }

    fn known(&self) -> String {
        self.shared
            .lock()
            .nodes()
            .iter()
            .map(|n| n.spec.name.clone())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn index(&self, node: &str) -> Result<usize, SimError> {
        self.shared
            .lock()
            .find(node)
            .ok_or_else(|| SimError::UnknownNode {
                node: node.to_string(),
                known: self.known(),
            })
    }

    /// Arm a fault.
    pub fn set_fault(&self, plan: FaultPlan) -> Result<(), SimError> {
        plan.validate().map_err(SimError::Fault)?;
        self.index(&plan.node).map_err(|_| {
            SimError::Fault(FaultError::UnknownNode {
                node: plan.node.clone(),
                known: self.known(),
            })
        })?;
        self.shared.lock().faults.push(ArmedFault::new(plan));
        Ok(())
    }

    /// Disarm every fault.
    pub fn clear_faults(&self) {
        self.shared.lock().faults.clear();
    }

    /// Side-effect counters of a node (by name or address).
    pub fn counters(&self, node: &str) -> Option<NodeCounters> {
        let c = self.shared.lock();
        c.find(node).map(|i| c.nodes()[i].counters.clone())
    }

    /// Requests refused because they carried the deprecated `nodes` metadata key.
    pub fn nodes_metadata_rejections(&self) -> u64 {
        self.shared.lock().nodes_metadata_rejections
    }

    /// A snapshot of a node's state.
    pub fn node_state(&self, node: &str) -> Option<NodeState> {
        let c = self.shared.lock();
        let n = &c.nodes()[c.find(node)?];
        let facts = n.facts();
        Some(NodeState {
            name: n.spec.name.clone(),
            address: n.spec.address.clone(),
            role: n.spec.role,
            power: n.power,
            running: n.running.clone(),
            installed: n.installed.clone(),
            boot_entries: n.boot_entries(),
            boot_id: n.boot_id.clone(),
            boots: n.counters.boots,
            etcd_healthy: n.etcd_healthy,
            config_version: n.config_version,
            staged_config: n.staged.is_some(),
            kubelet_image: facts
                .as_ref()
                .map(|f| f.kubelet_image.clone())
                .unwrap_or_default(),
            static_pod_images: facts.map(|f| f.static_pod_images).unwrap_or_default(),
            pulled_images: n.images.iter().cloned().collect(),
            cri_images: n.cri_images.iter().cloned().collect(),
            pulls: n.pulls.clone(),
            installing: n.installing.as_ref() == Some(&n.boot_id),
        })
    }

    /// The machine config a node runs (YAML; it holds the cluster's secrets).
    pub fn machine_config(&self, node: &str) -> Option<Secret<Vec<u8>>> {
        let c = self.shared.lock();
        c.find(node)
            .map(|i| Secret::new(c.nodes()[i].config.clone()))
    }

    /// Finish a reboot in progress (needed with `RebootTiming::Manual`; harmless otherwise).
    pub fn complete_boot(&self, node: &str) -> Result<(), SimError> {
        let idx = self.index(node)?;
        let mut c = self.shared.lock();
        let n = &c.nodes()[idx];
        if n.power != Power::Rebooting {
            return Err(SimError::NotRebooting {
                node: node.to_string(),
                state: n.power,
            });
        }
        let ticket = RebootTicket {
            node: idx,
            seq: n.reboot_seq,
        };
        c.finish_boot(ticket);
        Ok(())
    }

    /// Reboot `node` as someone other than medea would (an operator's `talosctl reboot`, a
    /// power loss, a kernel panic): no API call is counted; the node boots its default boot
    /// entry like after any reboot, so a node whose install (`LifecycleService.Upgrade`) was
    /// not followed by a reboot comes back on the installed version (upstream: the installer
    /// makes the new entry the default, `internal/app/lifecycle/lifecycle.go` and
    /// `internal/app/machined/pkg/runtime/v1alpha1/bootloader/sdboot/sdboot.go`). It is back
    /// after the scenario's reboot time (with `RebootTiming::Manual`, after
    /// [`Self::complete_boot`]).
    pub fn reboot_externally(&self, node: &str) -> Result<(), SimError> {
        let idx = self.index(node)?;
        let mut c = self.shared.lock();
        let ticket = c.begin_reboot(idx);
        c.through_firmware(idx);
        let timing = c.timing.reboot;
        drop(c);
        server::schedule_boot(&self.shared, ticket, timing);
        Ok(())
    }

    /// Raise (`Some`) or disarm (`None`, every alarm of the member) an etcd alarm on the member
    /// of control-plane `node`, as etcd does when its quota is exceeded (`NOSPACE`) or a
    /// corruption check fails (`CORRUPT`). `EtcdAlarmList` reports it from every member.
    pub fn set_etcd_alarm(&self, node: &str, alarm: Option<EtcdAlarmKind>) -> Result<(), SimError> {
        let idx = self.index(node)?;
        let mut c = self.shared.lock();
        let member = c.nodes()[idx].member_id;
        match alarm {
            Some(a) => {
                c.etcd_alarms.insert((member, a));
            }
            None => c.etcd_alarms.retain(|(m, _)| *m != member),
        }
        Ok(())
    }

    /// The node whose etcd member leads now (`None`: no member can lead).
    pub fn etcd_leader(&self) -> Option<String> {
        self.shared.lock().etcd_leader_name()
    }

    /// Every `EtcdForfeitLeadership` a member answered, in order (issue #48).
    pub fn etcd_forfeits(&self) -> Vec<EtcdForfeit> {
        self.shared.lock().etcd.forfeits.clone()
    }

    /// Make a control plane's etcd member (un)healthy.
    pub fn set_etcd_healthy(&self, node: &str, healthy: bool) -> Result<(), SimError> {
        let idx = self.index(node)?;
        self.shared.lock().node_mut(idx).etcd_healthy = healthy;
        Ok(())
    }

    /// Choose how a node boots (systemd-boot by default). With GRUB the node, like a real one,
    /// offers no way to see an installed-but-not-booted upgrade.
    pub fn set_bootloader(&self, node: &str, bootloader: Bootloader) -> Result<(), SimError> {
        let idx = self.index(node)?;
        let mut c = self.shared.lock();
        let n = c.node_mut(idx);
        n.bootloader = bootloader;
        n.grub = model::boot::Grub::fresh(&n.running);
        match bootloader {
            // written from a disk image: no install has set `LoaderEntryDefault` yet
            Bootloader::SdBootImage => n.loader_default = None,
            Bootloader::SdBoot if n.loader_default.is_none() => {
                n.loader_default = Some(n.loader_selected.clone());
            }
            _ => {}
        }
        Ok(())
    }

    /// Force the health of a service (`kubelet`, `apid`, ...) on a node.
    pub fn set_service_health(
        &self,
        node: &str,
        service: &str,
        healthy: bool,
    ) -> Result<(), SimError> {
        let idx = self.index(node)?;
        self.shared
            .lock()
            .node_mut(idx)
            .service_health
            .insert(service.to_string(), healthy);
        Ok(())
    }

    /// The talosconfig for this simulator (context [`SIM_CONTEXT`], endpoint [`Self::endpoint`],
    /// default node the first control plane, admin credentials). It holds the admin key.
    pub fn talosconfig(&self) -> Secret<String> {
        #[derive(Serialize)]
        struct Ctx {
            endpoints: Vec<String>,
            nodes: Vec<String>,
            ca: String,
            crt: String,
            key: String,
        }
        #[derive(Serialize)]
        struct Cfg {
            context: String,
            contexts: BTreeMap<String, Ctx>,
        }
        let first_cp = {
            let c = self.shared.lock();
            c.nodes()
                .iter()
                .find(|n| n.control_plane())
                .map(|n| n.spec.address.clone())
                .unwrap_or_default()
        };
        let cfg = Cfg {
            context: SIM_CONTEXT.to_string(),
            contexts: BTreeMap::from([(
                SIM_CONTEXT.to_string(),
                Ctx {
                    endpoints: vec![self.endpoint()],
                    nodes: vec![first_cp],
                    ca: BASE64.encode(self.pki.ca_pem()),
                    crt: BASE64.encode(&self.pki.admin.cert_pem),
                    key: BASE64.encode(self.pki.admin.key_pem.expose()),
                },
            )]),
        };
        // Plain scalars (no folded blocks), one line per base64 value, as talosctl writes them.
        let options = serde_saphyr::ser_options! { prefer_block_scalars: false };
        Secret::new(serde_saphyr::to_string_with_options(&cfg, options).unwrap_or_default())
    }

    /// Write [`Self::talosconfig`] to `dir/talosconfig` (0600; `dir` created 0700 if missing,
    /// refused if others can read it).
    pub fn write_talosconfig(&self, dir: &Path) -> Result<PathBuf, SimError> {
        write_secret_file(
            dir,
            TALOSCONFIG_FILE,
            self.talosconfig().expose().as_bytes(),
        )
        .map_err(SimError::Pki)
    }

    /// Stop serving (idempotent).
    pub async fn shutdown(&self) {
        let tx = self
            .shutdown
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(tx) = tx {
            let _ = tx.send(());
        }
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl NodeSource for SimTalos {
    fn nodes(&self) -> Vec<NodeFacts> {
        self.shared.lock().facts()
    }
    fn node(&self, name: &str) -> Option<NodeFacts> {
        self.shared.lock().node_facts(name)
    }
    fn control_planes(&self) -> Vec<NodeFacts> {
        self.shared.lock().control_plane_facts()
    }
    fn fingerprint(&self) -> Option<u64> {
        Some(self.shared.lock().facts_fingerprint())
    }
    fn node_fingerprints(&self) -> Vec<(String, u64)> {
        self.shared.lock().node_fingerprints()
    }
    fn node_fingerprints_since(&self, since: u64) -> Option<Vec<(String, u64)>> {
        self.shared.lock().node_fingerprints_since(since)
    }
    fn talos_drains(&self) -> Vec<(String, u64)> {
        let c = self.shared.lock();
        c.server_drains
            .iter()
            .map(|(n, k)| (n.clone(), *k))
            .collect()
    }
    fn attach_keyspace(&self, keyspace: Arc<dyn crate::sim::node::KeyspaceSource>) {
        *self
            .shared
            .keyspace
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(keyspace);
    }
}
