//! Upgrade: version selection (legacy and lifecycle RPCs, image pulls) and faults.

use super::*;

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
    assert_eq!(s.pulled_images, [format!("{FACTORY_METAL}:v1.14.0")]);

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
    // LifecycleService needs the image pulled first: the installer container finds no image
    // (`internal/app/lifecycle/container.go`), answered as `Internal "upgrade failed: …"`
    // (`lifecycle.go`)
    let err = e
        .client
        .lifecycle_upgrade(&node("cp-1"), &installer("v1.14.0"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::Internal), "{err}");
    assert!(
        err.to_string().contains("upgrade failed: installer image")
            && err.to_string().contains("not found in containerd store"),
        "{err}"
    );
    assert_eq!(e.sim.node_state("cp-1").unwrap().installed, None);
}

/// As upstream's lifecycle service (siderolabs/talos `internal/app/lifecycle/lifecycle.go`,
/// `container.go`): while an install runs the node still runs its version, `MachineStatus`
/// says running and its next boot is unchanged; a second `Upgrade` is refused
/// (`FailedPrecondition`, "another installation/upgrade is already in progress"); and the
/// install outlives a caller that went away (the installer is waited for on a detached
/// context), writing the boot entry when it ends. Then the lock is free again.
#[tokio::test]
async fn a_lifecycle_install_in_progress_refuses_a_second_and_outlives_its_caller() {
    let mut s = scenario("v1.13.2");
    s.timing.install = Duration::from_millis(1500);
    let e = env_with(s, fast()).await;
    let n = node("w-1");
    e.client
        .pull_image(&n, &installer("v1.13.9"))
        .await
        .unwrap();
    let (caller, _) = TalosClient::from_talosconfig(&e.talosconfig, None, fast()).unwrap();
    let first = {
        let n = n.clone();
        tokio::spawn(async move { caller.lifecycle_upgrade(&n, &installer("v1.13.9")).await })
    };
    while !e.sim.node_state("w-1").unwrap().installing {
        tokio::task::yield_now().await;
    }
    // the caller goes away mid-install (a crash, a lost connection)
    first.abort();
    let _ = first.await;
    let state = e.sim.node_state("w-1").unwrap();
    assert_eq!((state.running, state.installed), (tv("v1.13.2"), None));
    let status = e.client.machine_status(&n).await.unwrap();
    assert_eq!(status.stage, MachineStage::Running, "{status:?}");
    let err = e
        .client
        .lifecycle_upgrade(&n, &installer("v1.13.9"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
    assert!(
        err.to_string()
            .contains("another installation/upgrade is already in progress"),
        "{err}"
    );
    // the abandoned install ends and writes the boot entry
    tokio::time::timeout(crate::fixtures::POLL_DEADLINE, async {
        while e.sim.node_state("w-1").unwrap().installing {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the abandoned install ends (deadline passed)");
    let state = e.sim.node_state("w-1").unwrap();
    assert_eq!(state.installed, Some(tv("v1.13.9")));
    assert_eq!(state.running, tv("v1.13.2"), "no reboot");
    assert_eq!(e.sim.counters("w-1").unwrap().calls(Method::Upgrade), 2);
    // the lock is free again: another call is taken (and runs its own install)
    let output = e
        .client
        .lifecycle_upgrade(&n, &installer("v1.13.9"))
        .await
        .unwrap();
    assert!(
        output.iter().any(|l| l.contains("boot entry updated")),
        "{output:?}"
    );
    assert!(!e.sim.node_state("w-1").unwrap().installing);
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
    assert_eq!(pulled.name, format!("{FACTORY_METAL}:v1.14.0"));
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

/// The simulator's registry (issue #48 item 6): `ghcr.io/siderolabs/installer` has no tag from
/// v1.14.0, and a pull of a missing image answers as machined does (`NotFound "error pulling
/// image: …"`, siderolabs/talos `internal/app/images/images.go`); the legacy RPC, which pulls
/// and validates the installer itself, refuses it before anything else ("error validating
/// installer image"). Nothing is installed either way.
#[tokio::test]
async fn the_registry_has_no_ghcr_installer_from_talos_1_14() {
    let e = env("v1.13.10").await;
    let ghcr = image("ghcr.io/siderolabs/installer:v1.14.6");
    let err = e.client.pull_image(&node("w-1"), &ghcr).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::NotFound), "{err}");
    assert!(err.to_string().contains("error pulling image"), "{err}");
    let err = e.client.upgrade(&node("w-2"), &ghcr).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::NotFound), "{err}");
    for n in ["w-1", "w-2"] {
        let s = e.sim.node_state(n).unwrap();
        assert!(s.pulled_images.is_empty() && s.installed.is_none(), "{s:?}");
    }
    // the 1.13 tag exists, and so does the factory's 1.14 installer
    e.client
        .pull_image(
            &node("w-1"),
            &image("ghcr.io/siderolabs/installer:v1.13.10"),
        )
        .await
        .unwrap();
    e.client
        .upgrade(&node("w-2"), &installer("v1.14.6"))
        .await
        .unwrap();
    assert_eq!(
        e.sim.node_state("w-2").unwrap().installed,
        Some(tv("v1.14.6"))
    );

    // below 1.13 the legacy Upgrade pulls the installer itself
    let e = env("v1.12.11").await;
    let err = e
        .client
        .upgrade(&node("w-1"), &image("ghcr.io/siderolabs/installer:v1.14.6"))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("error validating installer image \"ghcr.io/siderolabs/installer:v1.14.6\""),
        "{err}"
    );
    let s = e.sim.node_state("w-1").unwrap();
    assert_eq!((s.installed.clone(), s.power), (None, Power::Up), "{s:?}");
}

/// A SecureBoot machine boots only what a SecureBoot installer wrote: after a non-SecureBoot
/// install its firmware refuses the new boot assets and it never comes back (talos#9245,
/// talos#8097); its SecureBoot installer brings it back on the new version.
#[tokio::test]
async fn a_secure_boot_node_does_not_come_back_from_a_non_secure_boot_installer() {
    let mut s = scenario("v1.13.10");
    for n in &mut s.nodes {
        n.secure_boot = n.name.starts_with("w-");
    }
    let e = env_with(s, fast()).await;
    let plain = image(&format!("{FACTORY_METAL}:v1.14.6"));
    let secure = image(
        "factory.talos.dev/metal-installer-secureboot/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.6",
    );
    e.client.upgrade(&node("w-1"), &plain).await.unwrap();
    e.client.reboot(&node("w-1")).await.unwrap();
    e.sim.complete_boot("w-1").unwrap();
    let s = e.sim.node_state("w-1").unwrap();
    assert_eq!(
        (s.power, s.running.clone()),
        (Power::Gone, tv("v1.13.10")),
        "{s:?}"
    );
    assert!(e.client.version(&node("w-1")).await.is_err());

    e.client.upgrade(&node("w-2"), &secure).await.unwrap();
    e.client.reboot(&node("w-2")).await.unwrap();
    e.sim.complete_boot("w-2").unwrap();
    let s = e.sim.node_state("w-2").unwrap();
    assert_eq!(
        (s.power, s.running.clone()),
        (Power::Up, tv("v1.14.6")),
        "{s:?}"
    );
}
