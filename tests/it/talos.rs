//! The real Talos client against the Talos simulator, over real mTLS sockets: every operation,
//! every fault, version selection, talosconfig errors, secret file modes and the CLI.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use medea::sim::node::NodeSource as _;
use medea::sim::talos::{
    Effect, FaultPlan, Method, Power, RebootTiming, Scenario, SimTalos, TALOSCONFIG_FILE, Trigger,
};
use medea::talos::config::{KeyAlgorithm, TalosConfig, TalosConfigError};
use medea::talos::proto::machine::machine_service_client::MachineServiceClient;
use medea::talos::{
    AppliedMode, ApplyMode, ApplyOptions, ClientSettings, Health, HealthCheckSpec, ImageRef,
    MachineConfig, MachineStage, NodeTarget, RetryPolicy, TalosApi as _, TalosClient, TalosError,
    UpgradeOutcome, UpgradeRpc,
};
use medea::version::{KubeVersion, TalosVersion};
use sha2::Digest as _;
use tonic::Code;

fn tv(s: &str) -> TalosVersion {
    TalosVersion::parse(s).unwrap()
}

fn node(s: &str) -> NodeTarget {
    NodeTarget::parse(s).unwrap()
}

fn image(s: &str) -> ImageRef {
    ImageRef::parse(s).unwrap()
}

fn installer(v: &str) -> ImageRef {
    image(&format!("ghcr.io/siderolabs/installer:{v}"))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Short deadlines and millisecond backoff: faults resolve in milliseconds.
fn fast() -> ClientSettings {
    ClientSettings {
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        pull_timeout: Duration::from_secs(10),
        stream_idle_timeout: Duration::from_secs(10),
        retry: RetryPolicy {
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            max_attempts: 4,
        },
    }
}

struct Env {
    sim: SimTalos,
    client: TalosClient,
    talosconfig: PathBuf,
    dir: tempfile::TempDir,
}

fn scenario(talos: &str) -> Scenario {
    let mut s = Scenario::uniform(3, 2, tv(talos), KubeVersion::parse("v1.34.1").unwrap());
    // Tests step reboots explicitly.
    s.timing.reboot = RebootTiming::Manual;
    s
}

async fn env_with(scenario: Scenario, settings: ClientSettings) -> Env {
    let sim = SimTalos::start(scenario, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let talosconfig = sim.write_talosconfig(&dir.path().join("out")).unwrap();
    let (client, _) = TalosClient::from_talosconfig(&talosconfig, None, settings).unwrap();
    Env {
        sim,
        client,
        talosconfig,
        dir,
    }
}

async fn env(talos: &str) -> Env {
    env_with(scenario(talos), fast()).await
}

// ---------------------------------------------------------------------------------------------
// Read-only operations

#[tokio::test]
async fn version_over_mtls_reports_the_running_tag() {
    let e = env("v1.13.9").await;
    let v = e.client.version(&node("cp-2")).await.unwrap();
    assert_eq!(v.tag, tv("v1.13.9"));
    assert_eq!(
        (v.os.as_str(), v.arch.as_str(), v.platform.as_str()),
        ("linux", "amd64", "metal")
    );
    assert!(v.rbac);
    assert_eq!(e.sim.counters("cp-2").unwrap().calls(Method::Version), 1);
    assert_eq!(
        e.sim.counters("cp-1").unwrap().calls(Method::Version),
        0,
        "routed to cp-2 only"
    );
    // The `node` value may be the address, as talosctl uses it.
    e.client.version(&node("127.5.0.3")).await.unwrap();
    assert_eq!(e.sim.counters("cp-2").unwrap().calls(Method::Version), 2);
}

#[tokio::test]
async fn services_report_health_like_talosctl() {
    let e = env("v1.13.9").await;
    let cp = e.client.services(&node("cp-1")).await.unwrap();
    let ids: Vec<&str> = cp.iter().map(|s| s.id.as_str()).collect();
    for want in ["apid", "etcd", "kubelet", "machined", "trustd"] {
        assert!(ids.contains(&want), "{ids:?}");
    }
    assert!(cp.iter().all(|s| s.is_running_and_healthy()));
    let w = e.client.services(&node("w-1")).await.unwrap();
    assert!(!w.iter().any(|s| s.id == "etcd"), "workers run no etcd");

    e.sim.set_service_health("w-1", "kubelet", false).unwrap();
    let w = e.client.services(&node("w-1")).await.unwrap();
    let kubelet = w.iter().find(|s| s.id == "kubelet").unwrap();
    assert_eq!(kubelet.health, Health::Unhealthy);
    assert!(!kubelet.is_running_and_healthy());
}

#[tokio::test]
async fn etcd_members_and_status() {
    let e = env("v1.13.9").await;
    let members = e.client.etcd_members(&node("cp-1")).await.unwrap();
    let names: Vec<&str> = members.iter().map(|m| m.hostname.as_str()).collect();
    assert_eq!(names, ["cp-1", "cp-2", "cp-3"]);
    assert_eq!(members[1].peer_urls, ["https://127.5.0.3:2380"]);
    assert!(members.iter().all(|m| !m.is_learner));

    let status = e.client.etcd_status(&node("cp-2")).await.unwrap();
    assert_eq!(status.member_id, members[1].id);
    assert_eq!(status.leader, members[0].id);
    assert!(status.errors.is_empty());

    e.sim.set_etcd_healthy("cp-2", false).unwrap();
    let status = e.client.etcd_status(&node("cp-2")).await.unwrap();
    assert!(!status.errors.is_empty());
    let services = e.client.services(&node("cp-2")).await.unwrap();
    assert!(
        !services
            .iter()
            .find(|s| s.id == "etcd")
            .unwrap()
            .is_running_and_healthy()
    );

    let err = e.client.etcd_members(&node("w-1")).await.unwrap_err();
    // Talos' CheckControlplane: Unimplemented on a worker
    assert_eq!(err.code(), Some(Code::Unimplemented), "{err}");
    assert!(
        err.to_string()
            .contains("is only available on control plane nodes"),
        "{err}"
    );
    let err = e.client.etcd_alarms(&node("w-1")).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Unimplemented), "{err}");
    assert!(
        e.client
            .etcd_alarms(&node("cp-1"))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn cosi_reads_machine_config_static_pods_kubelet_and_machine_status() {
    let e = env("v1.13.9").await;
    let mc = e.client.machine_config(&node("cp-1")).await.unwrap();
    let yaml = String::from_utf8(mc.yaml().expose().clone()).unwrap();
    assert!(
        yaml.contains("image: ghcr.io/siderolabs/kubelet:v1.34.1"),
        "{yaml}"
    );
    assert!(yaml.starts_with("version: v1alpha1"));
    assert_eq!(mc.resource_version.as_deref(), Some("1"));

    let pods = e.client.static_pod_statuses(&node("cp-1")).await.unwrap();
    let ids: Vec<&str> = pods.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "kube-system/kube-apiserver-cp-1",
            "kube-system/kube-controller-manager-cp-1",
            "kube-system/kube-scheduler-cp-1"
        ]
    );
    assert!(pods.iter().all(|p| p.ready && p.phase == "Running"));
    assert_eq!(pods[0].images, ["registry.k8s.io/kube-apiserver:v1.34.1"]);
    assert!(
        e.client
            .static_pod_statuses(&node("w-1"))
            .await
            .unwrap()
            .is_empty()
    );

    let k = e.client.kubelet_spec(&node("w-2")).await.unwrap();
    assert_eq!(k.image, "ghcr.io/siderolabs/kubelet:v1.34.1");
    assert_eq!(k.expected_nodename, "w-2");

    let ms = e.client.machine_status(&node("w-2")).await.unwrap();
    assert_eq!((ms.stage, ms.ready), (MachineStage::Running, true));

    let missing = e
        .client
        .cosi_get(
            &node("cp-1"),
            "config",
            "MachineConfigs.config.talos.dev",
            "nope",
        )
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Some(Code::NotFound));
    let unknown = e
        .client
        .cosi_list(&node("cp-1"), "k8s", "Nope.example.com")
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Some(Code::NotFound));
    assert_eq!(e.sim.counters("cp-1").unwrap().calls(Method::CosiList), 2);
}

#[tokio::test]
async fn etcd_snapshot_is_streamed_fsynced_and_checksummed() {
    let e = env("v1.13.9").await;
    let dest = e.dir.path().join("backups").join("etcd.snapshot");
    let info = e.client.etcd_snapshot(&node("cp-1"), &dest).await.unwrap();
    let bytes = std::fs::read(&dest).unwrap();
    assert_eq!(info.path, dest);
    assert_eq!(info.size, bytes.len() as u64);
    assert_eq!(info.size % 512, 32, "etcd's sha256 trailer");
    assert_eq!(info.sha256, hex::encode(sha2::Sha256::digest(&bytes)));
    assert_eq!(
        mode(&dest),
        0o600,
        "a snapshot holds every Kubernetes secret"
    );
    assert_eq!(mode(dest.parent().unwrap()), 0o700);
    assert!(!e.dir.path().join("backups/etcd.snapshot.part").exists());

    // An existing destination is refused and left alone.
    let err = e
        .client
        .etcd_snapshot(&node("cp-1"), &dest)
        .await
        .unwrap_err();
    assert!(matches!(err, TalosError::SnapshotExists { .. }), "{err}");
    assert_eq!(std::fs::read(&dest).unwrap(), bytes);
}

// ---------------------------------------------------------------------------------------------
// Upgrade: version selection and faults

#[tokio::test]
async fn talos_1_12_takes_the_legacy_upgrade_rpc_and_reboots_itself() {
    let e = env("v1.12.6").await;
    let n = node("cp-1");
    let before = e.client.boot_id(&n).await.unwrap();
    let out = e.client.upgrade(&n, &installer("v1.13.9")).await.unwrap();
    assert!(
        matches!(&out, UpgradeOutcome::Rebooting { from, ack, .. } if *from == tv("v1.12.6") && ack == "Upgrade request received"),
        "{out:?}"
    );
    assert_eq!(out.rpc(), UpgradeRpc::Legacy);
    let c = e.sim.counters("cp-1").unwrap();
    assert_eq!(c.calls(Method::LegacyUpgrade), 1);
    assert_eq!(c.calls(Method::Upgrade), 0);
    assert_eq!(
        c.calls(Method::ImagePull),
        0,
        "the legacy RPC pulls server-side"
    );

    // The node is away until it boots.
    assert_eq!(e.sim.node_state("cp-1").unwrap().power, Power::Rebooting);
    let err = e.client.version(&n).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    e.sim.complete_boot("cp-1").unwrap();
    assert_eq!(e.client.version(&n).await.unwrap().tag, tv("v1.13.9"));
    assert_ne!(e.client.boot_id(&n).await.unwrap(), before);
}

#[tokio::test]
async fn talos_1_13_pulls_then_takes_the_lifecycle_rpc_and_the_caller_reboots() {
    let e = env("v1.13.2").await;
    let n = node("cp-2");
    let out = e.client.upgrade(&n, &installer("v1.14.0")).await.unwrap();
    assert!(
        matches!(&out, UpgradeOutcome::Installed { from, output } if *from == tv("v1.13.2") && !output.is_empty()),
        "{out:?}"
    );
    assert!(out.needs_reboot());
    let c = e.sim.counters("cp-2").unwrap();
    assert_eq!(
        (
            c.calls(Method::ImagePull),
            c.calls(Method::Upgrade),
            c.calls(Method::LegacyUpgrade)
        ),
        (1, 1, 0)
    );
    let s = e.sim.node_state("cp-2").unwrap();
    assert_eq!(
        s.running,
        tv("v1.13.2"),
        "the lifecycle RPC only writes the boot entry"
    );
    assert_eq!(s.installed, Some(tv("v1.14.0")));
    assert_eq!(s.pulled_images, ["ghcr.io/siderolabs/installer:v1.14.0"]);

    let before = e.client.boot_id(&n).await.unwrap();
    e.client.reboot(&n).await.unwrap();
    assert!(!e.sim.node("cp-2").unwrap().up);
    e.sim.complete_boot("cp-2").unwrap();
    let after = e.client.boot_id(&n).await.unwrap();
    assert_ne!(before, after);
    assert_eq!(e.client.version(&n).await.unwrap().tag, tv("v1.14.0"));
    assert_eq!(e.sim.node("cp-2").unwrap().talos_version, "v1.14.0");
    assert_eq!(e.sim.counters("cp-2").unwrap().calls(Method::Reboot), 1);
}

#[tokio::test]
async fn talos_1_14_takes_the_lifecycle_rpc() {
    let e = env("v1.14.0").await;
    let out = e
        .client
        .upgrade(&node("w-1"), &installer("v1.14.1"))
        .await
        .unwrap();
    assert_eq!(out.rpc(), UpgradeRpc::Lifecycle);
    let c = e.sim.counters("w-1").unwrap();
    assert_eq!(
        (c.calls(Method::Upgrade), c.calls(Method::LegacyUpgrade)),
        (1, 0)
    );
    assert_eq!(
        e.sim.node_state("w-1").unwrap().installed,
        Some(tv("v1.14.1"))
    );
}

#[tokio::test]
async fn the_simulator_refuses_the_wrong_rpc_for_the_version() {
    let e = env("v1.12.6").await;
    let err = e
        .client
        .lifecycle_upgrade(&node("cp-1"), &installer("v1.13.9"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::Unimplemented), "{err}");
    let e = env("v1.13.9").await;
    // LifecycleService needs the image pulled first.
    let err = e
        .client
        .lifecycle_upgrade(&node("cp-1"), &installer("v1.14.0"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::NotFound), "{err}");
    assert_eq!(e.sim.node_state("cp-1").unwrap().installed, None);
}

#[tokio::test]
async fn an_unsupported_upgrade_path_exits_non_zero() {
    let e = env("v1.13.9").await;
    let err = e
        .client
        .upgrade(&node("cp-1"), &installer("v1.16.0"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, TalosError::UpgradeExit { exit_code: 1, output, .. } if output.iter().any(|l| l.contains("not supported"))),
        "{err}"
    );
    assert_eq!(e.sim.node_state("cp-1").unwrap().installed, None);
}

#[tokio::test]
async fn fault_upgrade_exit_code_is_a_failure() {
    let e = env("v1.13.9").await;
    e.sim
        .set_fault(FaultPlan {
            node: "cp-3".into(),
            on: Trigger::call(Method::Upgrade),
            effect: Effect::UpgradeExit {
                code: 3,
                message: "error writing boot entry: disk full".into(),
            },
        })
        .unwrap();
    let err = e
        .client
        .upgrade(&node("cp-3"), &installer("v1.14.0"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, TalosError::UpgradeExit { exit_code: 3, output, .. } if output.iter().any(|l| l.contains("disk full"))),
        "{err}"
    );
    assert_eq!(e.sim.node_state("cp-3").unwrap().installed, None);
    assert_eq!(
        e.sim.counters("cp-3").unwrap().calls(Method::Upgrade),
        1,
        "not retried"
    );
}

#[tokio::test]
async fn fault_legacy_upgrade_failure_answered_by_the_node_is_definitive_and_not_retried() {
    let e = env("v1.12.6").await;
    e.sim
        .set_fault(FaultPlan {
            node: "w-1".into(),
            on: Trigger::call(Method::LegacyUpgrade),
            effect: Effect::UpgradeExit {
                code: 1,
                message: "failed to pull installer".into(),
            },
        })
        .unwrap();
    let err = e
        .client
        .upgrade(&node("w-1"), &installer("v1.13.9"))
        .await
        .unwrap_err();
    // the node answered INTERNAL itself (no transport cause): the call ran and failed
    assert!(
        matches!(
            &err,
            TalosError::Refused {
                code: Code::Internal,
                message,
                ..
            } if message.contains("failed to pull installer")
        ),
        "{err}"
    );
    let s = e.sim.node_state("w-1").unwrap();
    assert_eq!((s.power, s.running.clone()), (Power::Up, tv("v1.12.6")));
    assert_eq!(
        e.sim.counters("w-1").unwrap().calls(Method::LegacyUpgrade),
        1
    );
}

#[tokio::test]
async fn legacy_upgrade_keeps_the_server_side_etcd_check() {
    let e = env("v1.12.6").await;
    e.sim.set_etcd_healthy("cp-3", false).unwrap();
    let err = e
        .client
        .upgrade(&node("cp-1"), &installer("v1.13.9"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
    assert!(
        matches!(err, TalosError::Rpc { .. }),
        "refused before acting: {err}"
    );
    assert_eq!(e.sim.node_state("cp-1").unwrap().power, Power::Up);
}

#[tokio::test]
async fn fault_node_boots_back_on_the_old_version() {
    let e = env("v1.13.9").await;
    e.sim
        .set_fault(FaultPlan {
            node: "cp-1".into(),
            on: Trigger::boot(),
            effect: Effect::BootOldVersion,
        })
        .unwrap();
    let n = node("cp-1");
    e.client.upgrade(&n, &installer("v1.14.0")).await.unwrap();
    let before = e.client.boot_id(&n).await.unwrap();
    e.client.reboot(&n).await.unwrap();
    e.sim.complete_boot("cp-1").unwrap();
    // It rebooted (new boot id) and answers, yet the upgrade did not take.
    assert_ne!(e.client.boot_id(&n).await.unwrap(), before);
    assert_eq!(e.client.version(&n).await.unwrap().tag, tv("v1.13.9"));
    assert_eq!(e.sim.node_state("cp-1").unwrap().installed, None);
}

#[tokio::test]
async fn fault_node_never_returns() {
    let e = env("v1.13.9").await;
    e.sim
        .set_fault(FaultPlan {
            node: "w-2".into(),
            on: Trigger::boot(),
            effect: Effect::NeverReturn,
        })
        .unwrap();
    let n = node("w-2");
    e.client.reboot(&n).await.unwrap();
    e.sim.complete_boot("w-2").unwrap();
    assert_eq!(e.sim.node_state("w-2").unwrap().power, Power::Gone);
    let err = e.client.version(&n).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert_eq!(
        e.sim.counters("w-2").unwrap().refused(Method::Version),
        4,
        "retried to the budget"
    );
    assert!(!e.sim.node("w-2").unwrap().up);
}

#[tokio::test]
async fn fault_snapshot_stream_fails_midway_and_leaves_no_file() {
    let e = env("v1.13.9").await;
    e.sim
        .set_fault(FaultPlan {
            node: "cp-2".into(),
            on: Trigger::call(Method::EtcdSnapshot),
            effect: Effect::SnapshotBreak {
                after_bytes: 20_000,
            },
        })
        .unwrap();
    let dest = e.dir.path().join("etcd.snapshot");
    let err = e
        .client
        .etcd_snapshot(&node("cp-2"), &dest)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::Internal), "{err}");
    assert!(!dest.exists());
    assert!(!e.dir.path().join("etcd.snapshot.part").exists());
    // The fault is spent: the next snapshot works.
    e.client.etcd_snapshot(&node("cp-2"), &dest).await.unwrap();
}

#[tokio::test]
async fn fault_unavailable_for_n_calls_is_retried_for_reads() {
    let e = env("v1.13.9").await;
    e.sim
        .set_fault(FaultPlan {
            node: "cp-1".into(),
            on: Trigger::call(Method::Version),
            effect: Effect::Unavailable { calls: 2 },
        })
        .unwrap();
    assert_eq!(
        e.client.version(&node("cp-1")).await.unwrap().tag,
        tv("v1.13.9")
    );
    let c = e.sim.counters("cp-1").unwrap();
    assert_eq!(
        (c.refused(Method::Version), c.calls(Method::Version)),
        (2, 1)
    );
}

#[tokio::test]
async fn fault_unavailable_beyond_the_retry_budget_fails() {
    let e = env("v1.13.9").await;
    e.sim
        .set_fault(FaultPlan {
            node: "cp-1".into(),
            on: Trigger::any_call(),
            effect: Effect::Unavailable { calls: 100 },
        })
        .unwrap();
    let err = e.client.services(&node("cp-1")).await.unwrap_err();
    assert!(
        matches!(
            &err,
            TalosError::Rpc {
                code: Code::Unavailable,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        e.sim.counters("cp-1").unwrap().refused(Method::ServiceList),
        4
    );
}

#[tokio::test]
async fn fault_unavailable_on_mutating_calls_is_not_retried() {
    let e = env("v1.13.9").await;
    for m in [Method::Reboot, Method::ApplyConfiguration] {
        e.sim
            .set_fault(FaultPlan {
                node: "w-1".into(),
                on: Trigger::call(m),
                effect: Effect::Unavailable { calls: 1 },
            })
            .unwrap();
    }
    let n = node("w-1");
    let err = e.client.reboot(&n).await.unwrap_err();
    assert!(
        matches!(
            err,
            TalosError::Indeterminate {
                code: Code::Unavailable,
                ..
            }
        ),
        "{err}"
    );
    let mc = e.client.machine_config(&n).await.unwrap();
    let err = e
        .client
        .apply_configuration(&n, &mc, ApplyOptions::no_reboot())
        .await
        .unwrap_err();
    assert!(matches!(err, TalosError::Indeterminate { .. }), "{err}");
    let c = e.sim.counters("w-1").unwrap();
    assert_eq!(
        (c.refused(Method::Reboot), c.calls(Method::Reboot)),
        (1, 0),
        "exactly one attempt"
    );
    assert_eq!(c.refused(Method::ApplyConfiguration), 1);
    assert_eq!(c.mutating(), 0);
    assert_eq!(e.sim.node_state("w-1").unwrap().power, Power::Up);
}

#[tokio::test]
async fn mutating_calls_are_retried_when_the_connection_never_opened() {
    let e = env("v1.13.9").await;
    // A closed port first, the simulator second: the reboot fails to connect, moves on, and
    // reaches the node exactly once.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let cfg = TalosConfig::load(&e.talosconfig).unwrap();
    let mut ctx = cfg.context(None).unwrap();
    ctx.endpoints
        .insert(0, medea::talos::Endpoint::new("127.0.0.1", dead.port()));
    let client = TalosClient::new(&ctx, fast()).unwrap();
    client.reboot(&node("w-1")).await.unwrap();
    let c = e.sim.counters("w-1").unwrap();
    assert_eq!(c.calls(Method::Reboot), 1);
    assert_eq!(e.sim.node_state("w-1").unwrap().power, Power::Rebooting);
}

#[tokio::test]
async fn an_unknown_node_is_unavailable() {
    let e = env("v1.13.9").await;
    let err = e.client.version(&node("10.9.9.9")).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(err.to_string().contains("10.9.9.9"), "{err}");
}

#[tokio::test]
async fn fault_slow_image_pull() {
    let mut settings = fast();
    settings.stream_idle_timeout = Duration::from_millis(100);
    let e = env_with(scenario("v1.13.9"), settings).await;
    e.sim
        .set_fault(FaultPlan {
            node: "w-1".into(),
            on: Trigger::call(Method::ImagePull),
            effect: Effect::SlowPull {
                delay: Duration::from_secs(30),
            },
        })
        .unwrap();
    let err = e
        .client
        .pull_image(&node("w-1"), &installer("v1.14.0"))
        .await
        .unwrap_err();
    assert!(matches!(err, TalosError::Timeout { .. }), "{err}");
    assert!(e.sim.node_state("w-1").unwrap().pulled_images.is_empty());

    // A pull slower than the default but within the idle timeout succeeds.
    e.sim
        .set_fault(FaultPlan {
            node: "w-2".into(),
            on: Trigger::call(Method::ImagePull),
            effect: Effect::SlowPull {
                delay: Duration::from_millis(20),
            },
        })
        .unwrap();
    // (with the default idle timeout: a loaded machine must not make this flaky)
    let (client, _) = TalosClient::from_talosconfig(&e.talosconfig, None, fast()).unwrap();
    let start = std::time::Instant::now();
    let pulled = client
        .pull_image(&node("w-2"), &installer("v1.14.0"))
        .await
        .unwrap();
    assert!(start.elapsed() >= Duration::from_millis(20));
    assert_eq!(pulled.name, "ghcr.io/siderolabs/installer:v1.14.0");
    assert!(!pulled.legacy);
}

#[tokio::test]
async fn image_pull_falls_back_to_the_legacy_rpc_before_1_13() {
    let e = env("v1.12.6").await;
    let pulled = e
        .client
        .pull_image(&node("w-1"), &installer("v1.13.9"))
        .await
        .unwrap();
    assert!(pulled.legacy);
    assert_eq!(
        e.sim.node_state("w-1").unwrap().pulled_images,
        ["ghcr.io/siderolabs/installer:v1.13.9"]
    );
}

#[tokio::test]
async fn scenario_faults_are_armed_at_start() {
    let text = String::from(
        "timing: { reboot: manual }\nnodes:\n  - { name: cp-1, address: 127.5.0.2, role: controlplane, talos: v1.13.9, kubernetes: v1.34.1 }\nfaults:\n  - node: cp-1\n    on: { call: { method: upgrade, nth: 1 } }\n    effect: { upgradeExit: { code: 2, message: \"no space left on device\" } }\n",
    );
    let s = Scenario::parse(&text, Path::new("faults.yaml")).unwrap();
    let e = env_with(s, fast()).await;
    let err = e
        .client
        .upgrade(&node("cp-1"), &installer("v1.14.0"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, TalosError::UpgradeExit { exit_code: 2, .. }),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Reboot, boot id, ApplyConfiguration, health

#[tokio::test]
async fn reboot_takes_the_node_away_and_changes_the_boot_id() {
    let mut s = scenario("v1.13.9");
    s.timing.reboot = RebootTiming::After(Duration::ZERO);
    let e = env_with(s, fast()).await;
    let n = node("cp-3");
    let before = e.client.boot_id(&n).await.unwrap();
    let ack = e.client.reboot(&n).await.unwrap();
    assert!(!ack.actor_id.is_empty());
    // Timed mode: the node comes back by itself; the read-only retries ride over the gap.
    let mut after = e.client.boot_id(&n).await;
    for _ in 0..50 {
        if after.is_ok() {
            break;
        }
        tokio::task::yield_now().await;
        after = e.client.boot_id(&n).await;
    }
    assert_ne!(after.unwrap(), before);
    assert_eq!(e.sim.node_state("cp-3").unwrap().boots, 1);
}

fn bump_kubernetes(yaml: &[u8]) -> MachineConfig {
    let text = String::from_utf8(yaml.to_vec()).unwrap();
    MachineConfig::from_yaml(text.replace(":v1.34.1", ":v1.35.0"))
}

#[tokio::test]
async fn apply_configuration_no_reboot_moves_kubelet_and_static_pods() {
    let e = env("v1.14.0").await;
    let n = node("cp-1");
    let mc = e.client.machine_config(&n).await.unwrap();
    let out = e
        .client
        .apply_configuration(
            &n,
            &bump_kubernetes(mc.yaml().expose()),
            ApplyOptions::no_reboot(),
        )
        .await
        .unwrap();
    assert_eq!(out.mode, AppliedMode::NoReboot);
    let facts = e.sim.node("cp-1").unwrap();
    assert_eq!(facts.kubelet_version, "v1.35.0");
    assert_eq!(
        facts.static_pod_images["kube-apiserver"],
        "registry.k8s.io/kube-apiserver:v1.35.0"
    );
    assert!(facts.up, "no reboot");
    assert_eq!(
        e.client.kubelet_spec(&n).await.unwrap().image,
        "ghcr.io/siderolabs/kubelet:v1.35.0"
    );
    let pods = e.client.static_pod_statuses(&n).await.unwrap();
    assert!(
        pods.iter().all(|p| p.images[0].ends_with(":v1.35.0")),
        "{pods:?}"
    );
    let mc2 = e.client.machine_config(&n).await.unwrap();
    assert_eq!(mc2.resource_version.as_deref(), Some("2"));
    assert_eq!(
        e.sim
            .counters("cp-1")
            .unwrap()
            .calls(Method::ApplyConfiguration),
        1
    );
}

fn change_disk(mc: &MachineConfig) -> MachineConfig {
    let text = String::from_utf8(mc.yaml().expose().clone()).unwrap();
    MachineConfig::from_yaml(text.replace("disk: /dev/sda", "disk: /dev/vda"))
}

#[tokio::test]
async fn apply_configuration_1_13_refuses_no_reboot_for_a_change_that_needs_one() {
    let e = env("v1.13.9").await;
    let n = node("w-1");
    let mc = e.client.machine_config(&n).await.unwrap();
    let err = e
        .client
        .apply_configuration(&n, &change_disk(&mc), ApplyOptions::no_reboot())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            TalosError::Rpc {
                code: Code::InvalidArgument,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        e.sim.node_state("w-1").unwrap().config_version,
        1,
        "nothing changed"
    );

    // AUTO picks a reboot on 1.13.
    let out = e
        .client
        .apply_configuration(
            &n,
            &change_disk(&mc),
            ApplyOptions {
                mode: ApplyMode::Auto,
                dry_run: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(out.mode, AppliedMode::Reboot);
    assert_eq!(e.sim.node_state("w-1").unwrap().power, Power::Rebooting);
}

#[tokio::test]
async fn apply_configuration_1_14_applies_everything_live_and_auto_means_no_reboot() {
    let e = env("v1.14.0").await;
    let n = node("w-1");
    let mc = e.client.machine_config(&n).await.unwrap();
    let out = e
        .client
        .apply_configuration(&n, &change_disk(&mc), ApplyOptions::no_reboot())
        .await
        .unwrap();
    assert_eq!(out.mode, AppliedMode::NoReboot);
    let out = e
        .client
        .apply_configuration(
            &n,
            &mc,
            ApplyOptions {
                mode: ApplyMode::Auto,
                dry_run: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(out.mode, AppliedMode::NoReboot, "1.14: AUTO = NO_REBOOT");
    assert_eq!(e.sim.node_state("w-1").unwrap().power, Power::Up);
}

#[tokio::test]
async fn apply_configuration_staged_try_and_dry_run() {
    let e = env("v1.14.0").await;
    let n = node("cp-2");
    let mc = e.client.machine_config(&n).await.unwrap();
    let bumped = bump_kubernetes(mc.yaml().expose());

    let out = e
        .client
        .apply_configuration(
            &n,
            &bumped,
            ApplyOptions {
                mode: ApplyMode::NoReboot,
                dry_run: true,
            },
        )
        .await
        .unwrap();
    assert!(out.details.contains("Dry run"), "{}", out.details);
    assert_eq!(
        e.sim.node("cp-2").unwrap().kubelet_version,
        "v1.34.1",
        "dry run changes nothing"
    );

    let out = e
        .client
        .apply_configuration(
            &n,
            &bumped,
            ApplyOptions {
                mode: ApplyMode::Staged,
                dry_run: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(out.mode, AppliedMode::Staged);
    assert!(e.sim.node_state("cp-2").unwrap().staged_config);
    assert_eq!(
        e.sim.node("cp-2").unwrap().kubelet_version,
        "v1.34.1",
        "staged until reboot"
    );
    e.client.reboot(&n).await.unwrap();
    e.sim.complete_boot("cp-2").unwrap();
    assert_eq!(e.sim.node("cp-2").unwrap().kubelet_version, "v1.35.0");

    let out = e
        .client
        .apply_configuration(
            &n,
            &mc,
            ApplyOptions {
                mode: ApplyMode::Try {
                    timeout: Duration::from_secs(600),
                },
                dry_run: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(out.mode, AppliedMode::Try);
    assert_eq!(e.sim.node("cp-2").unwrap().kubelet_version, "v1.34.1");
}

#[tokio::test]
async fn apply_configuration_refuses_bad_configs_and_changes_nothing() {
    let e = env("v1.14.0").await;
    let n = node("w-1");
    for bad in [
        "machine: [unclosed".to_string(),
        "apiVersion: v1alpha1\nkind: KubeletConfig\nimage: x\n".to_string(),
    ] {
        let err = e
            .client
            .apply_configuration(
                &n,
                &MachineConfig::from_yaml(bad),
                ApplyOptions::no_reboot(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                TalosError::Rpc {
                    code: Code::InvalidArgument,
                    ..
                }
            ),
            "{err}"
        );
    }
    let mc = e.client.machine_config(&node("cp-1")).await.unwrap();
    let err = e
        .client
        .apply_configuration(&n, &mc, ApplyOptions::no_reboot())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("machine type"), "{err}");
    assert_eq!(e.sim.node_state("w-1").unwrap().config_version, 1);
}

#[tokio::test]
async fn health_check_streams_progress_and_fails_on_unhealthy_etcd() {
    let e = env("v1.13.9").await;
    let n = node("cp-1");
    let mut seen = Vec::new();
    let report = e
        .client
        .health_check_with_progress(&n, &HealthCheckSpec::waiting(Duration::ZERO), |l| {
            seen.push(l.to_string())
        })
        .await
        .unwrap();
    assert_eq!(report.messages, seen);
    assert!(
        report.messages[0].starts_with("discovered nodes:"),
        "{:?}",
        report.messages
    );
    assert!(
        report
            .messages
            .contains(&"waiting for etcd to be healthy: OK".to_string())
    );
    assert!(
        report
            .messages
            .contains(&"waiting for all nodes to finish boot sequence: OK".to_string())
    );

    e.sim.set_etcd_healthy("cp-3", false).unwrap();
    let err = e
        .client
        .health_check(&n, &HealthCheckSpec::waiting(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, TalosError::HealthCheckFailed { code: Code::DeadlineExceeded, progress, .. } if progress.iter().any(|l| l.contains("\"etcd\" not healthy"))),
        "{err}"
    );
    let err = e
        .client
        .health_check(&node("w-1"), &HealthCheckSpec::waiting(Duration::ZERO))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
}

#[tokio::test]
async fn health_check_waits_for_the_cluster_to_heal() {
    let e = env("v1.13.9").await;
    e.sim.set_etcd_healthy("cp-2", false).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let client = e.client;
    let check = tokio::spawn(async move {
        client
            .health_check_with_progress(
                &node("cp-1"),
                &HealthCheckSpec::waiting(Duration::from_secs(30)),
                |l| {
                    let _ = tx.send(l.to_string());
                },
            )
            .await
    });
    // Heal once the node has reported the problem.
    while let Some(line) = rx.recv().await {
        if line.contains("\"etcd\" not healthy") {
            e.sim.set_etcd_healthy("cp-2", true).unwrap();
            break;
        }
    }
    let report = check.await.unwrap().unwrap();
    assert!(
        report
            .messages
            .contains(&"waiting for etcd to be healthy: OK".to_string()),
        "{report:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Routing metadata: `node` only, never `nodes`

/// A raw tonic client with the simulator's admin credentials, to send what medea never sends.
async fn raw_machine(sim: &SimTalos) -> MachineServiceClient<tonic::transport::Channel> {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
    let tls = ClientTlsConfig::new()
        .domain_name("127.0.0.1")
        .ca_certificate(Certificate::from_pem(sim.pki().ca_pem()))
        .identity(Identity::from_pem(
            &sim.pki().admin.cert_pem,
            sim.pki().admin.key_pem_standard.expose(),
        ));
    let ch = Channel::from_shared(format!("https://{}", sim.endpoint()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    MachineServiceClient::new(ch)
}

#[tokio::test]
async fn the_client_never_sends_nodes_metadata() {
    let e = env("v1.13.9").await;
    let cp = node("cp-1");
    let w = node("w-1");
    // Every operation of the client, once.
    e.client.version(&cp).await.unwrap();
    e.client.services(&cp).await.unwrap();
    e.client.etcd_members(&cp).await.unwrap();
    e.client.etcd_status(&cp).await.unwrap();
    e.client
        .etcd_snapshot(&cp, &e.dir.path().join("snap"))
        .await
        .unwrap();
    e.client.machine_config(&cp).await.unwrap();
    e.client.static_pod_statuses(&cp).await.unwrap();
    e.client.kubelet_spec(&cp).await.unwrap();
    e.client.machine_status(&cp).await.unwrap();
    e.client.boot_id(&cp).await.unwrap();
    e.client
        .health_check(&cp, &HealthCheckSpec::waiting(Duration::ZERO))
        .await
        .unwrap();
    let mc = e.client.machine_config(&w).await.unwrap();
    e.client
        .apply_configuration(&w, &mc, ApplyOptions::no_reboot())
        .await
        .unwrap();
    e.client.upgrade(&w, &installer("v1.14.0")).await.unwrap();
    e.client.reboot(&w).await.unwrap();
    assert_eq!(e.sim.nodes_metadata_rejections(), 0);

    // The detector works: a request with `nodes` is refused and counted.
    let mut raw = raw_machine(&e.sim).await;
    let mut req = tonic::Request::new(());
    req.metadata_mut()
        .insert("nodes", "127.5.0.2".parse().unwrap());
    let err = raw.version(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("one-2-many"), "{}", err.message());
    assert_eq!(e.sim.nodes_metadata_rejections(), 1);
}

#[tokio::test]
async fn node_metadata_must_be_single_valued() {
    let e = env("v1.13.9").await;
    let mut raw = raw_machine(&e.sim).await;
    let mut req = tonic::Request::new(());
    req.metadata_mut().append("node", "cp-1".parse().unwrap());
    req.metadata_mut().append("node", "cp-2".parse().unwrap());
    let err = raw.version(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // Without `node` the endpoint's own node answers.
    raw.version(tonic::Request::new(())).await.unwrap();
    assert_eq!(e.sim.counters("cp-1").unwrap().calls(Method::Version), 1);
}

// ---------------------------------------------------------------------------------------------
// TLS and talosconfig

#[tokio::test]
async fn a_foreign_ca_is_a_tls_error_and_is_not_retried() {
    let a = env("v1.13.9").await;
    let b = env("v1.13.9").await;
    let cfg = TalosConfig::load(&b.talosconfig).unwrap();
    let mut ctx = cfg.context(None).unwrap();
    ctx.endpoints = vec![medea::talos::Endpoint::new(
        "127.0.0.1",
        a.sim.addr().port(),
    )];
    let client = TalosClient::new(&ctx, fast()).unwrap();
    let err = client.version(&node("cp-1")).await.unwrap_err();
    assert!(matches!(err, TalosError::Tls { .. }), "{err}");
    assert_eq!(a.sim.counters("cp-1").unwrap().calls(Method::Version), 0);
}

#[tokio::test]
async fn the_server_name_is_the_endpoint_host() {
    let e = env("v1.13.9").await;
    let cfg = TalosConfig::load(&e.talosconfig).unwrap();
    let mut ctx = cfg.context(None).unwrap();
    ctx.endpoints = vec![medea::talos::Endpoint::new(
        "localhost",
        e.sim.addr().port(),
    )];
    let client = TalosClient::new(&ctx, fast()).unwrap();
    client.version(&node("cp-1")).await.unwrap();
}

fn sim_talosconfig_text(e: &Env) -> String {
    std::fs::read_to_string(&e.talosconfig).unwrap()
}

/// Replace the value of `field:` in the (single) context.
fn with_field(text: &str, field: &str, value: &str) -> String {
    text.lines()
        .map(|l| {
            if l.trim_start().starts_with(&format!("{field}:")) {
                let indent = &l[..l.len() - l.trim_start().len()];
                format!("{indent}{field}: {value}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn key_pem(label: &str, der: &[u8]) -> String {
    let b64 = BASE64.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

#[tokio::test]
async fn talosconfig_parsing_and_errors() {
    let e = env("v1.13.9").await;
    let text = sim_talosconfig_text(&e);
    let p = Path::new("talosconfig");

    // The simulator writes the Talos flavour: an `ED25519 PRIVATE KEY`, accepted once relabelled.
    let key_b64 = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("key: "))
        .unwrap()
        .to_string();
    let key = String::from_utf8(BASE64.decode(&key_b64).unwrap()).unwrap();
    assert!(key.starts_with("-----BEGIN ED25519 PRIVATE KEY-----"));
    let ctx = TalosConfig::parse(&text, p).unwrap().context(None).unwrap();
    assert_eq!(ctx.key.algorithm(), KeyAlgorithm::Ed25519);
    assert_eq!(ctx.nodes, ["127.5.0.2"]);
    let dbg = format!("{ctx:?}");
    assert!(
        !dbg.contains("PRIVATE KEY") && !dbg.contains(&key_b64),
        "{dbg}"
    );

    // Missing context.
    let err = TalosConfig::parse(&text, p)
        .unwrap()
        .context(Some("prod"))
        .unwrap_err();
    assert!(
        matches!(&err, TalosConfigError::MissingContext { context, .. } if context == "prod"),
        "{err}"
    );
    assert!(err.to_string().contains("available: medea-sim"), "{err}");
    // No current context.
    let err = TalosConfig::parse(&with_field(&text, "context", "''"), p)
        .unwrap()
        .context(None)
        .unwrap_err();
    assert!(matches!(err, TalosConfigError::NoContext { .. }), "{err}");
    // Bad base64.
    let err = TalosConfig::parse(&with_field(&text, "ca", "not*base64!"), p)
        .unwrap()
        .context(None)
        .unwrap_err();
    assert!(
        matches!(err, TalosConfigError::Base64 { field: "ca", .. }),
        "{err}"
    );
    // Missing key.
    let err = TalosConfig::parse(&with_field(&text, "key", "''"), p)
        .unwrap()
        .context(None)
        .unwrap_err();
    assert!(
        matches!(err, TalosConfigError::MissingField { field: "key", .. }),
        "{err}"
    );
    // Not a PEM key at all.
    let err = TalosConfig::parse(&with_field(&text, "key", &BASE64.encode("hello")), p)
        .unwrap()
        .context(None)
        .unwrap_err();
    assert!(matches!(err, TalosConfigError::NoKey { .. }), "{err}");
    // A PKCS#8 key that is neither Ed25519, ECDSA nor RSA (X25519, OID 1.3.101.110).
    let mut x25519 = vec![
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x04, 0x22, 0x04,
        0x20,
    ];
    x25519.extend([7u8; 32]);
    let pem = key_pem("PRIVATE KEY", &x25519);
    let err = TalosConfig::parse(&with_field(&text, "key", &BASE64.encode(pem)), p)
        .unwrap()
        .context(None)
        .unwrap_err();
    assert!(
        matches!(err, TalosConfigError::UnsupportedKey { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("not an Ed25519, ECDSA or RSA"),
        "{err}"
    );
    // An ECDSA key is accepted.
    let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let ctx = TalosConfig::parse(
        &with_field(&text, "key", &BASE64.encode(ec.serialize_pem())),
        p,
    )
    .unwrap()
    .context(None)
    .unwrap();
    assert_eq!(ctx.key.algorithm(), KeyAlgorithm::Ecdsa);
    // No endpoints.
    let err = TalosConfig::parse("context: a\ncontexts:\n  a:\n    endpoints: []\n", p)
        .unwrap()
        .context(None)
        .unwrap_err();
    assert!(matches!(err, TalosConfigError::NoEndpoints { .. }), "{err}");
    // A file that is not there.
    let err = TalosConfig::load(Path::new("/nonexistent/talosconfig")).unwrap_err();
    assert!(matches!(err, TalosConfigError::Read { .. }), "{err}");
}

#[tokio::test]
async fn secrets_are_written_0600_in_0700_dirs() {
    let e = env("v1.13.9").await;
    assert_eq!(mode(&e.talosconfig), 0o600);
    assert_eq!(mode(e.talosconfig.parent().unwrap()), 0o700);

    let loose = e.dir.path().join("loose");
    std::fs::create_dir(&loose).unwrap();
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = e.sim.write_talosconfig(&loose).unwrap_err();
    assert!(
        err.source_chain_contains("accessible by other users"),
        "{err}"
    );
    assert!(!loose.join(TALOSCONFIG_FILE).exists(), "nothing written");
}

trait ChainExt {
    fn source_chain_contains(&self, s: &str) -> bool;
}
impl<E: std::error::Error> ChainExt for E {
    fn source_chain_contains(&self, s: &str) -> bool {
        let mut cur: Option<&dyn std::error::Error> = Some(self);
        while let Some(e) = cur {
            if e.to_string().contains(s) {
                return true;
            }
            cur = e.source();
        }
        false
    }
}

// ---------------------------------------------------------------------------------------------
// Wire contract

#[test]
fn vendored_protos_are_unmodified() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/talos");
    let sums = std::fs::read_to_string(root.join("UPSTREAM.sha256")).unwrap();
    let mut n = 0;
    for line in sums.lines().filter(|l| !l.trim().is_empty()) {
        let (want, file) = line.split_once("  ").unwrap();
        let got = hex::encode(sha2::Sha256::digest(
            std::fs::read(root.join(file)).unwrap(),
        ));
        assert_eq!(got, want, "{file} differs from upstream");
        n += 1;
    }
    assert_eq!(n, 12);
}

/// The COSI messages are re-declared by hand: pin their field numbers to the wire table.
#[test]
fn cosi_messages_match_the_wire_table() {
    use medea::talos::proto::cosi::resource as cosi;
    use prost::Message as _;
    let get = cosi::GetRequest {
        namespace: "a".into(),
        r#type: "b".into(),
        id: "c".into(),
        options: Some(cosi::GetOptions {}),
    };
    // 1 namespace, 2 type, 3 id (length-delimited), 4 options (empty message).
    assert_eq!(
        get.encode_to_vec(),
        [0x0a, 1, b'a', 0x12, 1, b'b', 0x1a, 1, b'c', 0x22, 0]
    );
    let md = cosi::Metadata {
        version: "7".into(),
        phase: "running".into(),
        labels: [("k".to_string(), "v".to_string())].into(),
        ..Default::default()
    };
    let bytes = md.encode_to_vec();
    // 4 version, 6 phase, 10 labels (map entry: 1 key, 2 value).
    assert_eq!(&bytes[..3], [0x22, 1, b'7']);
    assert_eq!(&bytes[3..5], [0x32, 7]);
    assert_eq!(&bytes[12..], [0x52, 6, 0x0a, 1, b'k', 0x12, 1, b'v']);
    let spec = cosi::Spec {
        proto_spec: vec![1],
        yaml_spec: "y".into(),
    };
    assert_eq!(spec.encode_to_vec(), [0x0a, 1, 1, 0x12, 1, b'y']);
    let ev = cosi::Event {
        resource: None,
        event_type: cosi::EventType::Destroyed as i32,
        old: None,
        error: Some(String::new()),
        bookmark: None,
    };
    // 2 event_type = DESTROYED (2), 4 optional error (present even when empty).
    assert_eq!(ev.encode_to_vec(), [0x10, 2, 0x22, 0]);
    let term = cosi::LabelTerm {
        key: "k".into(),
        op: cosi::label_term::Operation::LteNumeric as i32,
        value: vec![],
        invert: true,
    };
    assert_eq!(term.encode_to_vec(), [0x0a, 1, b'k', 0x10, 7, 0x28, 1]);
    let watch = cosi::WatchRequest {
        api_version: 1,
        id: Some("x".into()),
        ..Default::default()
    };
    assert_eq!(watch.encode_to_vec(), [0x1a, 1, b'x', 0x28, 1]);
    let opts = cosi::WatchOptions {
        bootstrap_bookmark: true,
        tail_events: 3,
        ..Default::default()
    };
    assert_eq!(opts.encode_to_vec(), [0x10, 3, 0x38, 1]);
}

#[test]
fn grpc_paths_are_talos_paths() {
    for (m, path) in [
        (Method::Upgrade, "/machine.LifecycleService/Upgrade"),
        (Method::LegacyUpgrade, "/machine.MachineService/Upgrade"),
        (Method::CosiGet, "/cosi.resource.State/Get"),
        (Method::HealthCheck, "/cluster.ClusterService/HealthCheck"),
    ] {
        assert_eq!(m.grpc_path(), path);
    }
    use medea::talos::proto::{cluster, cosi, machine};
    assert_eq!(
        machine::machine_service_server::SERVICE_NAME,
        "machine.MachineService"
    );
    assert_eq!(
        machine::lifecycle_service_server::SERVICE_NAME,
        "machine.LifecycleService"
    );
    assert_eq!(
        machine::image_service_server::SERVICE_NAME,
        "machine.ImageService"
    );
    assert_eq!(
        cluster::cluster_service_server::SERVICE_NAME,
        "cluster.ClusterService"
    );
    assert_eq!(
        cosi::resource::state_server::SERVICE_NAME,
        "cosi.resource.State"
    );
}

// ---------------------------------------------------------------------------------------------
// CLI

/// stderr with miette's wrapping and box drawing collapsed to single spaces.
fn flat(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    s.split(|c: char| c.is_whitespace() || "│×╰─├┬┴╭".contains(c))
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

async fn medea(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_medea"))
        .args(args)
        .env_remove("TALOSCONFIG")
        .output()
        .await
        .unwrap()
}

#[tokio::test]
async fn cli_talos_commands_against_the_simulator() {
    let e = env("v1.13.9").await;
    let cfg = e.talosconfig.to_str().unwrap();

    let out = medea(&["talos", "version", "--talosconfig", cfg, "--node", "cp-2"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("NODE:        cp-2") && stdout.contains("Tag:         v1.13.9"),
        "{stdout}"
    );

    let out = medea(&["talos", "version", "--talosconfig", cfg, "-o", "json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json[0]["node"], "127.5.0.2",
        "default node from the talosconfig"
    );
    assert_eq!(json[0]["tag"], "v1.13.9");

    let out = medea(&["talos", "services", "--talosconfig", cfg, "-n", "cp-1,w-1"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.starts_with("NODE   SERVICE      STATE     HEALTH"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("cp-1   etcd") && l.contains("Running   OK")),
        "{stdout}"
    );

    let out = medea(&[
        "talos",
        "etcd-members",
        "--talosconfig",
        cfg,
        "-n",
        "cp-1",
        "-o",
        "json",
    ])
    .await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json[0]["members"].as_array().unwrap().len(), 3);

    let snap = e.dir.path().join("cli.snapshot");
    let out = medea(&[
        "talos",
        "etcd-snapshot",
        snap.to_str().unwrap(),
        "--talosconfig",
        cfg,
        "-n",
        "cp-1",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("etcd snapshot saved to") && stdout.contains("65568 bytes"),
        "{stdout}"
    );
    assert_eq!(mode(&snap), 0o600);

    let out = medea(&[
        "talos",
        "health",
        "--talosconfig",
        cfg,
        "-n",
        "cp-1",
        "--wait-timeout",
        "0s",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("waiting for apid to be ready: OK"),
        "{stdout}"
    );

    assert_eq!(e.sim.nodes_metadata_rejections(), 0);
}

#[tokio::test]
async fn cli_talos_errors_are_clear() {
    let e = env("v1.13.9").await;
    let cfg = e.talosconfig.to_str().unwrap();
    let out = medea(&[
        "talos",
        "version",
        "--talosconfig",
        cfg,
        "--context",
        "prod",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = flat(&out.stderr);
    assert!(stderr.contains("context `prod` not found"), "{stderr}");

    let out = medea(&[
        "talos",
        "etcd-snapshot",
        "x",
        "--talosconfig",
        cfg,
        "-n",
        "cp-1,cp-2",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        flat(&out.stderr).contains("runs against one node"),
        "{}",
        flat(&out.stderr)
    );
    assert!(!Path::new("x").exists());
}

#[tokio::test]
async fn cli_sim_runs_standalone_and_serves_its_talosconfig() {
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
        text.contains("6 nodes (3 control planes, 3 workers)"),
        "{text}"
    );
    let talosconfig = out.join(TALOSCONFIG_FILE);
    assert!(
        text.contains(&format!("talosconfig: {}", talosconfig.display())),
        "{text}"
    );
    assert_eq!(mode(&talosconfig), 0o600);

    let (client, _) = TalosClient::from_talosconfig(&talosconfig, None, fast()).unwrap();
    assert_eq!(
        client.version(&node("w-3")).await.unwrap().tag,
        tv("v1.12.11")
    );
    assert_eq!(client.etcd_members(&node("cp-1")).await.unwrap().len(), 3);

    child.kill().await.unwrap();
}

#[tokio::test]
async fn cli_sim_refuses_a_bad_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.yaml");
    std::fs::write(&scenario, "nodes: []\n").unwrap();
    let out = medea(&[
        "sim",
        "--scenario",
        scenario.to_str().unwrap(),
        "--out",
        dir.path().join("o").to_str().unwrap(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        flat(&out.stderr).contains("at least one control-plane"),
        "{}",
        flat(&out.stderr)
    );
    assert!(!dir.path().join("o").exists(), "nothing written");

    let out = medea(&["sim", "--print-default-scenario"]).await;
    let text = String::from_utf8(out.stdout).unwrap();
    Scenario::parse(&text, Path::new("default.yaml")).unwrap();
}
