//! `medea serve`: TLS, token auth, read APIs and the rollout gate, through the real CLI.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use medea::desired::Source;
use medea::inventory::{Machine, MachineRole, ObservedCluster, cluster_key};
use medea::server::secrets::Secret;
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
    let state = tempfile::tempdir().unwrap();
    let store = FjallStore::open(&state.path().join("store")).unwrap();
    let mut txn = Txn::new();
    for c in &inventory {
        txn = txn.put_record(cluster_key(&c.name), c);
    }
    store.commit(txn).unwrap();
    let token = "t0ken-for-tests".to_string();
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        source: Source::Dir(desired),
        state_dir: state.path().to_path_buf(),
        creds_dir: state.path().join("creds"),
        tls_cert: None,
        tls_key: None,
        token: Secret::new(token.clone()),
        rollouts: false,
        allowed_signers: None,
        debounce: Duration::from_millis(100),
        refresh_interval: Duration::from_secs(3600),
        replica: "test".into(),
        metrics_listen: None,
        webhooks: vec![],
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
            .env("MEDEA_CA", &self.ca);
        c
    }
}

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples")
}

#[test]
fn get_machines_clusters_and_pools_over_tls_with_token() {
    let s = start(examples(), vec![home_inventory()]);
    let out = s
        .cli()
        .args(["get", "machines", "--cluster", "home"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("CLUSTER  POOL          NODE  ROLE"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 7, "{text}");
    assert!(
        text.contains("home     controlplane  cp-1  controlplane  v1.12.4"),
        "{text}"
    );
    assert!(
        text.contains("home     workers       w-3   worker        v1.12.4"),
        "{text}"
    );

    let out = s
        .cli()
        .args(["get", "clusters", "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["name"], "home");
    assert_eq!(v[0]["kubernetesVersion"], "v1.34.1");
    assert_eq!(v[0]["desiredKubernetesVersion"], "v1.35.0");
    assert_eq!(v[0]["rolloutsEnabled"], false);
    assert_eq!(v[1]["name"], "prod");
    assert_eq!(v[1]["observed"], false);

    let out = s
        .cli()
        .args(["get", "nodepools", "--cluster", "home", "-o", "yaml"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("desiredTalosVersion: v1.13.9"), "{text}");
    assert!(text.contains("- v1.12.4"), "{text}");
}

#[test]
fn wrong_or_missing_token_is_unauthenticated_and_names_the_fix() {
    let s = start(examples(), vec![]);
    let out = s
        .cli()
        .env("MEDEA_TOKEN", "nope")
        .args(["get", "clusters"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wrong bearer token"), "{err}");
    assert!(err.contains("MEDEA_TOKEN"), "{err}");
    let out = s
        .cli()
        .env_remove("MEDEA_TOKEN")
        .args(["get", "clusters"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing bearer token"));
}

#[test]
fn missing_or_wrong_ca_is_a_clear_tls_error() {
    let s = start(examples(), vec![]);
    let out = s
        .cli()
        .env_remove("MEDEA_CA")
        .args(["get", "clusters"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no CA certificate"), "{err}");
    assert!(err.contains("--ca"), "{err}");
    // A CA that did not sign the server certificate.
    let other = start(examples(), vec![]);
    let out = s
        .cli()
        .env("MEDEA_CA", &other.ca)
        .args(["get", "clusters"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not trusted") || err.contains("certificate"),
        "{err}"
    );
    // --insecure works on loopback only.
    let out = s
        .cli()
        .env_remove("MEDEA_CA")
        .args(["get", "clusters", "--insecure"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = s
        .cli()
        .env_remove("MEDEA_CA")
        .args([
            "get",
            "clusters",
            "--insecure",
            "--addr",
            "example.com:7600",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("only allowed for loopback"));
}

#[test]
fn unreachable_server_names_the_address() {
    let out = crate::cli::medea()
        .args(["get", "clusters", "--insecure", "--addr", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach medea at 127.0.0.1:1"), "{err}");
    assert!(err.contains("medea serve"), "{err}");
}

#[test]
fn generated_tls_files_are_private() {
    let s = start(examples(), vec![]);
    for f in ["tls/ca.crt", "tls/server.crt", "tls/server.key"] {
        assert!(
            medea::server::secrets::is_private(&s.state.path().join(f)).unwrap(),
            "{f}"
        );
    }
}

#[test]
fn enable_rollouts_flips_the_gate_and_keeps_the_generation() {
    let s = start(examples(), vec![home_inventory()]);
    let out = s
        .cli()
        .args(["cluster", "enable-rollouts", "home"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "cluster home: rollouts enabled\n"
    );
    let out = s
        .cli()
        .args(["get", "clusters", "-o", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["rolloutsEnabled"], true);
    assert_eq!(
        v[0]["generation"], 1,
        "a gate change does not make plans stale"
    );
    let out = s
        .cli()
        .args(["cluster", "enable-rollouts", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has not been observed"));
}
