//! `medea serve`: TLS, token auth, read APIs and the rollout gate, through the real CLI.
//!
//! This file holds the server fixtures other areas use too (`start`, `home_inventory`,
//! `TestServer`, ...); each subject is a module: [`access`] (TLS, tokens, finding a server),
//! [`plans`] (plans and approvals over the API), [`trust_root`], [`process`] (`medea serve`
//! as a process), [`dashboard`] (connection limits), [`flood`] (the API's listener under a
//! flood, with a lowered descriptor limit) and [`completion`].

mod access;
mod completion;
mod dashboard;
mod flood;
mod plans;
mod process;
mod trust_root;

use crate::fixtures::copy_dir;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use medea::desired::Source;
use medea::inventory::{Machine, MachineRole, ObservedCluster, cluster_key};
use medea::secret::Secret;
use medea::server::{ServerConfig, run};
use medea::store::fjall::FjallStore;
use medea::store::{Store, Txn};
use medea::version::{KubeVersion, TalosVersion};

pub struct TestServer {
    pub addr: SocketAddr,
    pub state: tempfile::TempDir,
    pub ca: PathBuf,
    pub token: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn machine(node: &str, role: MachineRole, talos: &str) -> Machine {
    Machine {
        node: node.into(),
        id: format!("id-{node}"),
        address: "127.0.0.1".into(),
        role,
        talos_version: Some(TalosVersion::parse(talos).unwrap()),
        installer_image: None,
        schematic: None,
        platform: None,
        secure_boot: None,
        factory_host: None,
        extensions: BTreeMap::new(),
        kubelet_version: Some(KubeVersion::parse("v1.34.1").unwrap()),
        ready: true,
        cordoned: false,
        reachable: true,
        boot_id: Some("boot-1".into()),
        labels: BTreeMap::new(),
    }
}

pub fn home_inventory() -> ObservedCluster {
    let mut machines = BTreeMap::new();
    for n in ["cp-1", "cp-2", "cp-3"] {
        machines.insert(
            n.to_string(),
            machine(n, MachineRole::Controlplane, "v1.12.4"),
        );
    }
    for n in ["w-1", "w-2", "w-3"] {
        machines.insert(n.to_string(), machine(n, MachineRole::Worker, "v1.12.4"));
    }
    ObservedCluster::new("home").observe(Some(KubeVersion::parse("v1.34.1").unwrap()), machines)
}

pub fn start(desired: PathBuf, inventory: Vec<ObservedCluster>) -> TestServer {
    start_with(desired, inventory, None, false)
}

pub fn start_with(
    desired: PathBuf,
    inventory: Vec<ObservedCluster>,
    allowed_signers: Option<PathBuf>,
    rollouts: bool,
) -> TestServer {
    start_in(
        tempfile::tempdir().unwrap(),
        desired,
        inventory,
        allowed_signers,
        rollouts,
    )
}

/// [`start_with`] over a state directory the caller prepared (its `store/` may already hold
/// records, e.g. rollout jobs); `inventory` is written on top.
pub fn start_in(
    state: tempfile::TempDir,
    desired: PathBuf,
    inventory: Vec<ObservedCluster>,
    allowed_signers: Option<PathBuf>,
    rollouts: bool,
) -> TestServer {
    start_full(
        state,
        Source::Dir(desired),
        inventory,
        allowed_signers,
        rollouts,
        None,
    )
}

/// [`start`] over a git checkout: the server plans the commits of `reference`.
pub fn start_git(repo: PathBuf, reference: &str) -> TestServer {
    start_full(
        tempfile::tempdir().unwrap(),
        Source::Git {
            path: repo,
            reference: reference.to_string(),
        },
        vec![home_inventory()],
        None,
        false,
        None,
    )
}

/// [`start`] with the web dashboard on `ui` (a free loopback address) under `limits`.
pub fn start_with_ui(
    desired: PathBuf,
    inventory: Vec<ObservedCluster>,
    ui: SocketAddr,
    limits: medea::server::ui::Limits,
) -> TestServer {
    start_full(
        tempfile::tempdir().unwrap(),
        Source::Dir(desired),
        inventory,
        None,
        false,
        Some((ui, limits)),
    )
}

fn start_full(
    state: tempfile::TempDir,
    source: Source,
    inventory: Vec<ObservedCluster>,
    allowed_signers: Option<PathBuf>,
    rollouts: bool,
    ui: Option<(SocketAddr, medea::server::ui::Limits)>,
) -> TestServer {
    let store = FjallStore::open(&state.path().join("store")).unwrap();
    let mut txn = Txn::new();
    for c in &inventory {
        txn = txn.put_record(cluster_key(&c.name), c);
    }
    store.commit(txn).unwrap();
    let token = "t0ken-for-tests".to_string();
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        source,
        state_dir: state.path().to_path_buf(),
        creds_dir: state.path().join("creds"),
        tls_cert: None,
        tls_key: None,
        token: Secret::new(token.clone()),
        rollouts,
        allowed_signers,
        debounce: Duration::from_millis(100),
        refresh_interval: Duration::from_secs(3600),
        census_interval: medea::ops::refresh::DEFAULT_CENSUS_INTERVAL,
        replica: "test".into(),
        metrics_listen: None,
        webhooks: vec![],
        executor_poll: None,
        client_tick: None,
        ui_listen: ui.as_ref().map(|(a, _)| *a),
        ui_limits: ui.map(|(_, l)| l).unwrap_or_default(),
        hook_policy: Default::default(),
        api_limits: Default::default(),
        metrics_limits: medea::server::listen::Limits::metrics(),
    };
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let store: Arc<dyn Store> = Arc::new(store);
            let server = tokio::spawn(run(config, store, Some(tx), async move {
                let _ = stop_rx.await;
            }));
            bound_tx.send(rx.await.unwrap()).unwrap();
            server.await.unwrap().unwrap();
        });
    });
    let addr = bound_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server started");
    let ca = state.path().join("tls/ca.crt");
    TestServer {
        addr,
        ca,
        token,
        state,
        stop: Some(stop_tx),
        thread: Some(thread),
    }
}

impl TestServer {
    pub fn cli(&self) -> std::process::Command {
        let mut c = crate::cli::medea();
        c.env("MEDEA_ADDR", self.addr.to_string())
            .env("MEDEA_TOKEN", &self.token)
            .env("MEDEA_CA", &self.ca)
            // No local server's files: a test that wants them names its state directory.
            .env("MEDEA_STATE_DIR", "/nonexistent/medea-tests/state");
        c
    }
}

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// Wait (bounded) for a condition a real server reaches asynchronously (file watcher, loops).
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn keygen(dir: &std::path::Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(name);
    let out = crate::fixtures::tool("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&key)
        .output()
        .expect("ssh-keygen (openssh-client) is installed");
    assert!(out.status.success());
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    (key, public.trim().to_string())
}
