//! The drain policy (issue 20, item 1): emptyDir data, bare pods, `skipPods`, PDBs that never
//! allow or overlap.

use super::*;

/// The default scenario runs a metrics-server-like Deployment (emptyDir at `/tmp`) on a
/// worker; the plan's default drain policy (`deleteEmptyDirData: true`, as talosctl) drains it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_server_with_an_emptydir_drains_with_the_default_policy() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        dir.path(),
        1,
        2,
        KubeSimConfig {
            objects: medea::sim::kube::scenario::default_scenario(),
            ..KubeSimConfig::default()
        },
    )
    .await;
    let mut host = None;
    for _ in 0..500 {
        host = sim
            .kube
            .pods()
            .into_iter()
            .find(|p| p.name.starts_with("metrics-server-") && p.ready)
            .and_then(|p| p.node);
        if host.is_some() {
            break;
        }
        // the simulator's controllers create and schedule pods in the background
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let host = host.expect("the metrics-server pod is scheduled and ready");
    assert!(
        host.starts_with("w-"),
        "metrics-server runs on a worker: {host}"
    );
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let out = run.go().await;
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    assert_eq!(sim.upgrades("w-1"), 1);
    assert_eq!(sim.upgrades("w-2"), 1);
    let c = sim.kube.counters();
    assert!(c.evictions > 0, "{c:?}");
    assert_eq!(c.pod_deletes, 0, "evictions only");
}

/// One control-plane node and two workers, the default workloads plus a bare pod (no
/// controller) `namespace/name` on w-1, with an emptyDir volume when `empty_dir`.
async fn sim_with_bare_pod(
    dir: &std::path::Path,
    namespace: &str,
    name: &str,
    empty_dir: bool,
) -> Sim {
    use medea::sim::kube::scenario;
    let mut objects = scenario::default_scenario();
    objects
        .push(serde_json::to_value(scenario::bare_pod(namespace, name, "w-1", empty_dir)).unwrap());
    Sim::start(
        dir,
        1,
        2,
        KubeSimConfig {
            objects,
            ..KubeSimConfig::default()
        },
    )
    .await
}

/// A bare pod (no controller) is refused before any eviction, naming the pod and the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_pod_is_refused_naming_the_pod_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim_with_bare_pod(dir.path(), "default", "debug-shell", false).await;
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::CommandFailed);
    assert!(reason.contains("default/debug-shell"), "{reason}");
    assert!(reason.contains("drain.evictUnmanagedPods"), "{reason}");
    assert_eq!(sim.upgrades("w-1"), 0, "no upgrade on an undrained node");
    assert_eq!(sim.upgrades("w-2"), 0);
    assert!(
        sim.kube
            .pods_on("w-1")
            .iter()
            .any(|p| p.name == "debug-shell"),
        "the bare pod is left alone"
    );
}

/// `drain.skipPods` leaves matching pods on the node (a local-storage agent) and the drain
/// goes on; a PDB is still never bypassed for the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_pods_leaves_matching_pods_on_the_node() {
    // `bare_pod` labels the pod `app: <name>`; with emptyDir, as local-storage agents have
    let dir = tempfile::tempdir().unwrap();
    let sim = sim_with_bare_pod(dir.path(), "storage", "local-agent", true).await;
    let mut step = sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60));
    if let Step::Talos(t) = &mut step {
        t.drain.skip_pods = [("app".to_string(), "local-agent".to_string())].into();
    }
    let run = run_for(&sim, dir.path(), vec![step]).await;
    let out = run.go().await;
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    assert_eq!(sim.upgrades("w-1"), 1);
    assert!(
        sim.kube.pods().iter().any(|p| p.name == "local-agent"),
        "the skipped pod was not evicted"
    );
    assert_eq!(sim.kube.counters().pod_deletes, 0);
}

/// Issue 48, item 6: on a node still on Talos < 1.13 medea must call the legacy
/// `MachineService.Upgrade`, whose upgrade sequence drains the node again itself, server-side,
/// without medea's skip list (siderolabs/talos `v1alpha1_sequencer.go` `Upgrade`, phase `drain`,
/// `CordonAndDrainNode`; `pkg/kubernetes/kubernetes.go` `Client.Drain`). A controller-owned pod
/// `drain.skipPods` kept (a local-storage agent) is evicted by the node's own drain; DaemonSet
/// pods stay. Before, the simulator's legacy Upgrade drained nothing and the pod survived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_legacy_upgrade_drains_the_node_itself_and_evicts_the_skipped_pods() {
    use medea::sim::kube::{ClusterRecord, scenario};
    let dir = tempfile::tempdir().unwrap();
    let mut objects = scenario::default_scenario();
    let mut agent = scenario::deployment("storage", "local-agent", 1, "local-agent:1");
    if let Some(spec) = agent.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        spec.node_selector =
            Some([("kubernetes.io/hostname".to_string(), "w-1".to_string())].into());
    }
    objects.push(serde_json::to_value(agent).unwrap());
    let sim = Sim::start_from(
        dir.path(),
        1,
        2,
        KubeSimConfig {
            objects,
            ..KubeSimConfig::default()
        },
        "v1.12.6",
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let original = loop {
        let agent = sim
            .kube
            .pods_on("w-1")
            .into_iter()
            .find(|p| p.name.starts_with("local-agent-") && p.ready);
        if let Some(p) = agent {
            break p.name;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent is never Ready on w-1: {:?}",
            sim.kube.pods()
        );
        // the simulator's controllers create and schedule pods in the background
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let mut step = sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60));
    if let Step::Talos(t) = &mut step {
        assert!(
            t.waves.iter().flatten().all(|m| m.from == tv("v1.12.6")),
            "the legacy path"
        );
        t.drain.skip_pods = [("app".to_string(), "local-agent".to_string())].into();
    }
    let run = run_for(&sim, dir.path(), vec![step]).await;
    let out = run.go().await;
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    assert_eq!(sim.upgrades("w-1"), 1);
    assert!(
        !sim.kube.pods().iter().any(|p| p.name == original),
        "the skipped pod {original} did not survive the legacy upgrade: {:?}",
        sim.kube.pods()
    );
    let history = sim.kube.history();
    assert!(
        history.iter().any(|r| matches!(
            r,
            ClusterRecord::TalosEvicted { pod, node } if *pod == format!("storage/{original}") && node == "w-1"
        )),
        "evicted by w-1's own drain: {history:?}"
    );
    assert!(
        !history.iter().any(|r| matches!(
            r,
            ClusterRecord::TalosEvicted { pod, .. } if pod.starts_with("kube-system/kube-proxy-")
        )),
        "DaemonSet pods stay"
    );
    let c = sim.kube.counters();
    assert!(c.talos_drain_evictions >= 1, "{c:?}");
    assert_eq!(c.pod_deletes, 0, "evictions only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdb_that_never_allows_halts_at_the_drain_timeout_and_deletes_nothing() {
    use medea::sim::kube::scenario;
    let objects = vec![
        serde_json::to_value(scenario::deployment("default", "web", 6, "nginx:1.29")).unwrap(),
        serde_json::to_value(scenario::pdb_min_available("default", "web-pdb", "web", 6)).unwrap(),
    ];
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        dir.path(),
        1,
        2,
        KubeSimConfig {
            objects,
            ..KubeSimConfig::default()
        },
    )
    .await;
    assert!(
        !sim.kube.pods_on("w-1").is_empty(),
        "the workload has pods on w-1"
    );
    sim.kube.inject(KubeFault::PdbNeverAllows {
        namespace: "default".into(),
        pdb: "web-pdb".into(),
    });
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (2, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::DrainBlocked);
    assert!(reason.contains("drain of `w-1` timed out"), "{reason}");
    assert!(reason.contains("default/web-pdb"), "{reason}");
    let c = sim.kube.counters();
    assert_eq!(c.pod_deletes, 0, "medea never deletes a pod");
    assert!(c.evictions_blocked > 0, "{c:?}");
    assert_eq!(sim.upgrades("w-1"), 0, "no upgrade on an undrained node");
    assert_eq!(sim.upgrades("w-2"), 0);
}

/// kubectl's drain retries an eviction only on a 429: the apiserver's 500 for a pod that two
/// PodDisruptionBudgets select (k8s `pkg/registry/core/pod/storage/eviction.go`) never goes
/// away by waiting, so the drain stops at once with its message instead of at the timeout
/// (#33 item 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_under_two_pdbs_halts_the_drain_at_once_with_the_apiservers_message() {
    use medea::sim::kube::scenario;
    let objects = vec![
        serde_json::to_value(scenario::deployment("default", "web", 6, "nginx:1.29")).unwrap(),
        serde_json::to_value(scenario::pdb_min_available("default", "web-pdb", "web", 1)).unwrap(),
        serde_json::to_value(scenario::pdb_min_available(
            "default",
            "web-pdb-2",
            "web",
            1,
        ))
        .unwrap(),
    ];
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        dir.path(),
        1,
        2,
        KubeSimConfig {
            objects,
            ..KubeSimConfig::default()
        },
    )
    .await;
    assert!(!sim.kube.pods_on("w-1").is_empty());
    // a 300 s drain timeout
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (300, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let started = std::time::Instant::now();
    let out = run.go().await;
    let reason = halted(&out).to_string();
    assert!(
        reason.contains("This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."),
        "{reason}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "halted at once, not at the 300 s drain timeout: {:?}",
        started.elapsed()
    );
    assert_eq!(
        sim.kube.counters().pod_deletes,
        0,
        "medea never deletes a pod"
    );
    assert_eq!(sim.upgrades("w-1"), 0, "no upgrade on an undrained node");
    assert_eq!(sim.upgrades("w-2"), 0);
}

/// Issue #35 item 3 on the simulator: a VolumeAttachment naming w-1 (as the attach/detach
/// controller leaves one for a CSI volume) holds the upgrade after the drain, through the real
/// `storage.k8s.io/v1` list, until a client deletes it; then the node upgrades once. Since
/// issue #48 only the attachments of the volumes of the pods the drain evicted count (tuppr
/// `WaitForVolumeDetach`): the attachment is of the PersistentVolume `pvc-data-0` of the
/// drained pod `default/data` (a volume the simulated attach/detach controller does not
/// manage, so only the client's delete removes the attachment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_attachment_on_the_simulator_holds_the_upgrade_until_it_is_deleted() {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    let dir = tempfile::tempdir().unwrap();
    let mut objects = medea::sim::kube::scenario::csi_workload(
        "default",
        "data",
        "w-1",
        "rbd.csi.ceph.com",
        "0001-data",
    );
    for o in &mut objects {
        match o["kind"].as_str() {
            Some("PersistentVolume") => {
                o["metadata"]["name"] = serde_json::json!("pvc-data-0");
                let spec = o["spec"].as_object_mut().unwrap();
                spec.remove("csi");
                spec.insert(
                    "nfs".into(),
                    serde_json::json!({"server": "nfs.example", "path": "/data"}),
                );
            }
            Some("PersistentVolumeClaim") => {
                o["spec"]["volumeName"] = serde_json::json!("pvc-data-0");
            }
            _ => {}
        }
    }
    let sim = Sim::start(
        dir.path(),
        1,
        1,
        KubeSimConfig {
            objects,
            ..KubeSimConfig::default()
        },
    )
    .await;
    sim.kube
        .create(serde_json::json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttachment",
            "metadata": {"name": "csi-0a1b2c"},
            "spec": {
                "attacher": "rbd.csi.ceph.com",
                "nodeName": "w-1",
                "source": {"persistentVolumeName": "pvc-data-0"}
            }
        }))
        .unwrap();
    let steps = vec![sim.step("workers", &[&["w-1"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let mut events = run.exec.subscribe();
    let kube = sim.kube.clone();
    let talos = sim.talos.clone();
    let kubeconfig = sim.creds.join(CLUSTER).join("kubeconfig");
    let detacher = tokio::spawn(async move {
        loop {
            let ev: RolloutEvent = events.recv().await.unwrap();
            if ev.node.as_deref() == Some("w-1")
                && ev.op == Some(CommandOp::Drain)
                && matches!(ev.state, EventState::Done)
            {
                break;
            }
        }
        // the executor polls the attachments: let it ask a few more times, then check it
        // has not upgraded the node meanwhile
        let asked = kube.counters().requests;
        tokio::time::timeout(crate::fixtures::POLL_DEADLINE, async {
            while kube.counters().requests < asked + 5 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the executor keeps polling the attachments (deadline passed)");
        let upgrades = talos.counters("w-1").unwrap().upgrades();
        let api: kube::Api<VolumeAttachment> = kube::Api::all(
            kube::Client::try_from(medea::k8s::kubeconfig::load(&kubeconfig).await.unwrap())
                .unwrap(),
        );
        api.delete("csi-0a1b2c", &Default::default()).await.unwrap();
        upgrades
    });
    let out = run.go().await;
    assert_eq!(out, RunOutcome::Succeeded);
    assert_eq!(
        detacher.await.unwrap(),
        0,
        "no upgrade while the volume was attached"
    );
    assert_eq!(sim.upgrades("w-1"), 1);
}
