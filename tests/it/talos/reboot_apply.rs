//! Reboot and boot id, ApplyConfiguration (modes, refusals), the health check.

use super::*;

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
