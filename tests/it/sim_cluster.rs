//! Both sides of the simulator together (`medea sim`, `SimCluster`): real talosctl-like and
//! kubectl clients against one simulated cluster, kube faults from the scenario. Shared helpers
//! for `seed` and `doctor` tests live here too.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use medea::k8s::{AccessCheck, ClientOptions, KubeApi as _, KubeClient, RetryPolicy};
use medea::ops::refresh::RefreshSettings;
use medea::sim::cluster::{SimCluster, SimClusterConfig, SimCreds};
use medea::sim::talos::scenario::{KubeFaultSpec, OutageSpec};
use medea::sim::talos::{Power, RebootTiming, Scenario, Timing};
use medea::talos::{ClientSettings, NodeTarget, TalosApi as _, TalosClient};
use medea::version::TalosVersion;

pub(crate) fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// stderr with miette's wrapping and box drawing collapsed to single spaces.
pub(crate) fn flat(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    s.split(|c: char| c.is_whitespace() || "│×╰─├┬┴╭".contains(c))
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) async fn medea(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_medea"))
        .args(args)
        .env_remove("TALOSCONFIG")
        .env_remove("KUBECONFIG")
        .env_remove("MEDEA_STORE")
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap()
}

/// Millisecond retries: faults resolve at once.
pub(crate) fn fast_talos() -> ClientSettings {
    ClientSettings {
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        pull_timeout: Duration::from_secs(10),
        stream_idle_timeout: Duration::from_secs(10),
        retry: medea::talos::RetryPolicy {
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            max_attempts: 2,
        },
    }
}

pub(crate) fn fast_kube() -> ClientOptions {
    ClientOptions {
        retry: RetryPolicy {
            attempts: 2,
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        },
        ..ClientOptions::default()
    }
}

pub(crate) fn fast_refresh() -> RefreshSettings {
    RefreshSettings {
        talos: fast_talos(),
        kube: fast_kube(),
        ..RefreshSettings::default()
    }
}

/// The default cluster (`home`, 3 + 3 on v1.12.11 / v1.34.1, `web` behind a PDB) with instant
/// pods and reboots that wait for the test (`complete_boot`).
pub(crate) fn quick_default() -> Scenario {
    let mut s = Scenario::default_cluster();
    s.timing = Timing {
        reboot: RebootTiming::Manual,
        ..Timing::default()
    };
    s
}

/// A running simulated cluster with its credentials written to `<tmp>/sim`.
pub(crate) struct Env {
    pub sim: SimCluster,
    pub creds: SimCreds,
    pub dir: tempfile::TempDir,
}

pub(crate) async fn env(scenario: Scenario) -> Env {
    let sim = SimCluster::start(scenario, SimClusterConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let creds = sim.write_creds(&dir.path().join("sim")).unwrap();
    Env { sim, creds, dir }
}

impl Env {
    pub(crate) async fn kube(&self) -> KubeClient {
        KubeClient::from_kubeconfig(&self.creds.kubeconfig, fast_kube())
            .await
            .unwrap()
    }
    pub(crate) fn talos(&self) -> TalosClient {
        TalosClient::from_talosconfig(&self.creds.talosconfig, None, fast_talos())
            .unwrap()
            .0
    }
}

/// kubectl, or a clear skip (a failure under CI).
pub(crate) fn require_kubectl() -> Option<PathBuf> {
    crate::fixtures::tool_or_skip("kubectl")
}

pub(crate) async fn kubectl(
    bin: &Path,
    kubeconfig: &Path,
    home: &Path,
    args: &[&str],
) -> (bool, String) {
    let out = tokio::process::Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("HOME", home)
        .env_remove("KUBECONFIG")
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn tv(s: &str) -> TalosVersion {
    TalosVersion::parse(s).unwrap()
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn medea_sim_serves_talos_and_kubectl_from_one_process() {
    use tokio::io::AsyncBufReadExt as _;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sim");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_medea"))
        .args(["sim", "--out", out.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        let ready = line.starts_with("ready");
        printed.push(line);
        if ready {
            break;
        }
    }
    let text = printed.join("\n");
    assert!(
        text.contains("cluster `home`, 6 nodes (3 control planes, 3 workers)"),
        "{text}"
    );
    let talosconfig = out.join("talosconfig");
    let kubeconfig = out.join("kubeconfig");
    assert!(
        text.contains(&format!("talosconfig: {}", talosconfig.display()))
            && text.contains(&format!("kubeconfig: {}", kubeconfig.display())),
        "{text}"
    );
    let url = text
        .lines()
        .find_map(|l| l.strip_prefix("kube-apiserver: "))
        .and_then(|l| l.split_whitespace().next())
        .expect("the kube-apiserver address is printed")
        .to_string();
    assert!(url.starts_with("https://127.0.0.1:"), "{text}");
    assert!(
        text.contains("workload default/web x3 (PodDisruptionBudget web-pdb minAvailable 2)"),
        "{text}"
    );
    assert_eq!(mode(&talosconfig), 0o600);
    assert_eq!(mode(&kubeconfig), 0o600);
    assert_eq!(mode(&out), 0o700);
    assert!(
        std::fs::read_to_string(&kubeconfig)
            .unwrap()
            .contains(&format!("server: {url}")),
        "the kubeconfig points at the printed address"
    );

    let talos = medea(&[
        "talos",
        "version",
        "--talosconfig",
        talosconfig.to_str().unwrap(),
        "--node",
        "w-3",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&talos.stdout);
    assert!(talos.status.success(), "{stdout}{}", flat(&talos.stderr));
    assert!(stdout.contains("Tag:         v1.12.11"), "{stdout}");

    // medea's own kube adapter sees the nodes the Talos side runs.
    let kube = KubeClient::from_kubeconfig(&kubeconfig, fast_kube())
        .await
        .unwrap();
    let nodes = kube.nodes().await.unwrap();
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["cp-1", "cp-2", "cp-3", "w-1", "w-2", "w-3"]);
    assert!(nodes.iter().all(|n| n.ready));

    if let Some(bin) = require_kubectl() {
        let home = tempfile::tempdir().unwrap();
        let (ok, out) = kubectl(&bin, &kubeconfig, home.path(), &["get", "nodes"]).await;
        assert!(ok, "{out}");
        let rows: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows[0],
            ["NAME", "STATUS", "ROLES", "AGE", "VERSION"],
            "{out}"
        );
        assert_eq!(rows.len(), 7, "{out}");
        assert_eq!(rows[1][..3], ["cp-1", "Ready", "control-plane"], "{out}");
        assert_eq!(rows[6][..3], ["w-3", "Ready", "<none>"], "{out}");
        assert!(rows[1..].iter().all(|r| r[4] == "v1.34.1"), "{out}");
        let (ok, out) = kubectl(
            &bin,
            &kubeconfig,
            home.path(),
            &["get", "pdb", "-n", "default"],
        )
        .await;
        assert!(ok && out.contains("web-pdb"), "{out}");
    }
    child.kill().await.unwrap();
}

#[tokio::test]
async fn medea_sim_refuses_a_bad_workload_before_listening() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.yaml");
    std::fs::write(
        &scenario,
        "nodes: [{name: cp-1, address: 127.0.0.1, role: controlplane, talos: v1.12.11, kubernetes: v1.34.1}]\nworkloads: [{name: web, replicas: 1, pdbMinAvailable: 2}]\n",
    )
    .unwrap();
    let out = medea(&[
        "sim",
        "--scenario",
        scenario.to_str().unwrap(),
        "--out",
        dir.path().join("o").to_str().unwrap(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = flat(&out.stderr);
    assert!(
        stderr.contains("default/web") && stderr.contains("larger than `replicas`"),
        "{stderr}"
    );
    assert!(!dir.path().join("o").exists(), "nothing written");
}

#[tokio::test]
async fn kube_nodes_follow_the_talos_side_through_a_reboot() {
    let e = env(quick_default()).await;
    let kube = e.kube().await;
    let talos = e.talos();
    let before = kube.nodes().await.unwrap();
    let w1 = before.iter().find(|n| n.name == "w-1").unwrap();
    assert_eq!(w1.internal_ip(), Some("127.5.0.5"));
    assert!(!w1.control_plane && w1.ready && !w1.unschedulable);
    assert_eq!(w1.os_image, "Talos (v1.12.11)");
    assert!(before.iter().filter(|n| n.control_plane).count() == 3);

    talos
        .reboot(&NodeTarget::parse("127.5.0.5").unwrap())
        .await
        .unwrap();
    assert_eq!(
        e.sim.talos.node_state("w-1").unwrap().power,
        Power::Rebooting
    );
    let during = kube.nodes().await.unwrap();
    let w1_during = during.iter().find(|n| n.name == "w-1").unwrap();
    assert!(!w1_during.ready, "a rebooting node is not Ready");

    e.sim.talos.complete_boot("w-1").unwrap();
    let after = kube.nodes().await.unwrap();
    let w1_after = after.iter().find(|n| n.name == "w-1").unwrap();
    assert!(w1_after.ready);
    assert_ne!(
        w1_after.boot_id, w1.boot_id,
        "a new boot id after the reboot"
    );
    assert_eq!(
        talos
            .version(&NodeTarget::parse("w-1").unwrap())
            .await
            .unwrap()
            .tag,
        tv("v1.12.11")
    );
    e.sim.shutdown().await;
}

#[tokio::test]
async fn scenario_kube_faults_are_active_from_the_start() {
    let mut s = quick_default();
    s.kube_faults = vec![
        KubeFaultSpec::NodeNeverReady { node: "w-2".into() },
        KubeFaultSpec::Forbidden {
            verb: "create".into(),
            resource: "pods/eviction".into(),
        },
        KubeFaultSpec::ApiUnavailable(OutageSpec::Requests(1)),
    ];
    let e = env(s).await;
    let kube = e.kube().await;
    // The first request is the 503; the client's retry gets through.
    let nodes = kube.nodes().await.unwrap();
    assert_eq!(e.sim.kube.counters().unavailable, 1);
    assert!(!nodes.iter().find(|n| n.name == "w-2").unwrap().ready);
    assert!(nodes.iter().find(|n| n.name == "w-1").unwrap().ready);

    let (allowed, _) = kube
        .can_i(&AccessCheck::new("create", "", "pods", "eviction"))
        .await
        .unwrap();
    assert!(!allowed, "the forbidden permission is denied");
    let (allowed, reason) = kube
        .can_i(&AccessCheck::new("patch", "", "nodes", ""))
        .await
        .unwrap();
    assert!(allowed && reason.contains("RBAC: allowed"), "{reason}");

    // The real request is refused too (403), so a drain cannot evict.
    let pod = e.sim.kube.pods_on("w-1");
    let web = pod
        .iter()
        .find(|p| p.namespace == "default")
        .expect("a web pod on w-1");
    let drain = kube
        .drain(
            "w-1",
            &medea::k8s::DrainOptions {
                timeout: Duration::from_secs(2),
                min_backoff: Duration::from_millis(10),
                max_backoff: Duration::from_millis(20),
                poll_interval: Duration::from_millis(10),
                ..medea::k8s::DrainOptions::default()
            },
        )
        .await
        .unwrap_err();
    let text = medea::error_chain(&drain);
    assert!(
        text.contains("forbidden") && text.contains("pods/eviction"),
        "{text}"
    );
    assert_eq!(e.sim.kube.counters().evictions, 0, "{}", web.name);

    if let Some(bin) = require_kubectl() {
        let home = tempfile::tempdir().unwrap();
        let kc = &e.creds.kubeconfig;
        let (_, out) = kubectl(
            &bin,
            kc,
            home.path(),
            &["auth", "can-i", "create", "pods", "--subresource=eviction"],
        )
        .await;
        assert_eq!(out.lines().next(), Some("no"), "{out}");
        let (ok, out) = kubectl(&bin, kc, home.path(), &["auth", "can-i", "patch", "nodes"]).await;
        assert!(ok && out.starts_with("yes"), "{out}");
    }
    e.sim.shutdown().await;
}

#[tokio::test]
async fn the_apiserver_reports_its_version_and_clock() {
    let e = env(quick_default()).await;
    let info = e.kube().await.server_info().await.unwrap();
    assert_eq!(info.git_version, "v1.34.1");
    let date = info.date.expect("the apiserver sends a Date header");
    let skew = (date - info.received).get_seconds().abs();
    assert!(skew <= 2, "same host, same clock: {skew}s");
    e.sim.shutdown().await;
}

#[tokio::test]
async fn sim_creds_refuse_a_directory_others_can_read() {
    let sim = SimCluster::start(quick_default(), SimClusterConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = sim.write_creds(&open).unwrap_err();
    assert!(
        medea::error_chain(&err).contains("accessible by other users"),
        "{}",
        medea::error_chain(&err)
    );
    assert_eq!(
        std::fs::read_dir(&open).unwrap().count(),
        0,
        "nothing written"
    );
    sim.shutdown().await;
}
