//! Read-only operations: version, services, etcd, COSI resources, etcd snapshots.

use super::*;

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

/// The snapshot is a database etcd opens, even with no kube-apiserver writing to it: a new
/// etcd's (no keys, revision 0), padded to the member's database size. (With the kube side,
/// `sim_etcd::` checks the keys.)
#[tokio::test]
async fn etcd_snapshot_without_a_kube_side_is_an_empty_etcd_database() {
    let Some(etcdctl) = crate::fixtures::tool_or_skip("etcdctl") else {
        return;
    };
    let e = env("v1.13.9").await;
    let dest = e.dir.path().join("etcd.snapshot");
    let info = e.client.etcd_snapshot(&node("cp-1"), &dest).await.unwrap();
    assert_eq!(info.size, 64 * 1024 + 32, "the default database size");
    let status = crate::sim_etcd::etcdctl_json(
        &etcdctl,
        None,
        &["snapshot", "status", dest.to_str().unwrap()],
    );
    assert_eq!(status["revision"].as_i64(), Some(0), "{status}");
    let Some(etcd) = crate::etcd_harness::Etcd::restored(&dest) else {
        return;
    };
    let (_, kvs) = crate::sim_etcd::all_keys(&etcdctl, &etcd.endpoint);
    assert!(kvs.is_empty(), "{kvs:?}");
}
