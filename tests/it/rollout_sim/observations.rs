//! The adapters' observations: the next boot from systemd-boot's `LoaderEntryDefault`, one
//! attempt at a node that is away, etcd, images and Kubernetes of the simulator.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_talos_adapter_reads_the_next_boot_from_the_default_boot_entry() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    let (talos, _) = adapters(&sim).await;
    let w1 = node(&sim, "w-1");
    let seen = talos.node(&w1).await.unwrap();
    assert_eq!(seen.version, tv(FROM));
    assert_eq!(seen.next_boot, NextBoot::Same);
    assert!(seen.unhealthy_services.is_empty(), "{seen:?}");
    assert_eq!(seen.boot_id, sim.talos.node_state("w-1").unwrap().boot_id);

    let image = format!(
        "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:{TO}"
    );
    talos
        .pull_image(&w1, &image, medea::rollout::ports::ImageNamespace::System)
        .await
        .unwrap();
    talos
        .upgrade(&w1, &image, UpgradeMethod::Lifecycle)
        .await
        .unwrap();
    let seen = talos.node(&w1).await.unwrap();
    assert_eq!(seen.version, tv(FROM), "installed, not booted");
    assert_eq!(seen.next_boot, NextBoot::Version(tv(TO)));

    talos.reboot(&w1).await.unwrap();
    let back = loop {
        match talos.node(&w1).await {
            Ok(n) if n.boot_id != seen.boot_id => break n,
            Ok(_) => {}
            Err(e) => assert!(e.is_transient(), "a rebooting node is transient: {e}"),
        }
        // waiting on the simulator's 30 ms reboot; each failed observation already backs off
        tokio::task::yield_now().await;
    };
    assert_eq!(back.version, tv(TO));
    assert_eq!(back.next_boot, NextBoot::Same);

    sim.talos.set_bootloader("w-2", Bootloader::Grub).unwrap();
    let grub = talos.node(&node(&sim, "w-2")).await.unwrap();
    assert_eq!(
        grub.next_boot,
        NextBoot::Unknown,
        "a GRUB node cannot tell what it boots next"
    );

    let metrics = medea::metrics::render();
    for m in [
        "api=\"talos\",method=\"Version\"",
        "api=\"talos\",method=\"Read\"",
        "api=\"talos\",method=\"Upgrade\"",
        "api=\"talos\",method=\"Reboot\"",
    ] {
        assert!(
            metrics.contains(&format!("medea_api_call_duration_seconds_count{{{m}}}")),
            "{m} missing from\n{metrics}"
        );
    }
}

/// The executor's observations make one attempt: a node that is away is reported transient at
/// once (the sequencer polls again within its own deadlines) instead of after the client's
/// backoff, which used to hold every decision of a wave while one of its nodes rebooted. A
/// command still retries as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observing_a_node_that_is_away_makes_one_attempt() {
    use medea::talos::TalosApi as _;
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 1, KubeSimConfig::default()).await;
    let (talos, _kube) = adapters(&sim).await;
    sim.talos
        .set_fault(FaultPlan {
            node: "w-1".into(),
            on: Trigger::Boot { nth: 1 },
            effect: Effect::NeverReturn,
        })
        .unwrap();
    let w1 = node(&sim, "w-1");
    talos
        .client()
        .reboot(&medea::talos::NodeTarget::parse(&w1.address).unwrap())
        .await
        .unwrap();
    let before = sim.talos.counters("w-1").unwrap();
    let err = talos.node(&w1).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    let after = sim.talos.counters("w-1").unwrap();
    assert_eq!(
        after.refused(Method::Version) - before.refused(Method::Version),
        1,
        "{after:?}"
    );
    // The etcd observation asks the control planes, which are up: unchanged.
    let cps: Vec<NodeTarget> = ["cp-1", "cp-2", "cp-3"]
        .iter()
        .map(|n| node(&sim, n))
        .collect();
    assert_eq!(talos.etcd(&cps).await.unwrap().members.len(), 3);
    // A read through the client itself (not an observation) still retries: 4 attempts in
    // `quick_talos`.
    let before = sim.talos.counters("w-1").unwrap();
    talos
        .client()
        .version(&medea::talos::NodeTarget::parse(&w1.address).unwrap())
        .await
        .unwrap_err();
    let after = sim.talos.counters("w-1").unwrap();
    assert_eq!(
        after.refused(Method::Version) - before.refused(Method::Version),
        4,
        "{after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adapters_reach_etcd_images_and_kubernetes_of_the_simulator() {
    use medea::rollout::ports::{Component, KubePort};
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 1, KubeSimConfig::default()).await;
    let (talos, kube) = adapters(&sim).await;
    let cps: Vec<NodeTarget> = ["cp-1", "cp-2", "cp-3"]
        .iter()
        .map(|n| node(&sim, n))
        .collect();
    let etcd = talos.etcd(&cps).await.unwrap();
    assert_eq!(etcd.members.len(), 3);
    assert!(etcd.members.iter().all(|m| m.healthy && !m.learner));
    sim.talos.set_etcd_healthy("cp-2", false).unwrap();
    let etcd = talos.etcd(&cps).await.unwrap();
    let cp2 = etcd.members.iter().find(|m| m.name == "cp-2").unwrap();
    assert!(!cp2.healthy && !cp2.errors.is_empty(), "{cp2:?}");
    assert!(etcd.alarms.is_empty(), "{etcd:?}");
    // An alarm raised on one member is reported cluster-wide, by name, and fails the etcd check
    // the executor runs before every control-plane step.
    sim.talos
        .set_etcd_alarm(
            "cp-3",
            Some(medea::sim::talos::scenario::EtcdAlarmKind::Nospace),
        )
        .unwrap();
    let etcd = talos.etcd(&cps).await.unwrap();
    assert_eq!(etcd.alarms, vec!["cp-3: NOSPACE".to_string()]);
    let verdict = medea::rollout::sequencer::etcd_verdict(&etcd).unwrap_err();
    assert!(
        verdict.contains("etcd alarms are active: cp-3: NOSPACE"),
        "{verdict}"
    );
    sim.talos.set_etcd_alarm("cp-3", None).unwrap();
    assert!(talos.etcd(&cps).await.unwrap().alarms.is_empty());

    let imgs = talos.component_images(&cps[0]).await.unwrap();
    let api = format!("registry.k8s.io/kube-apiserver:{KUBE}");
    assert_eq!(imgs.get(&Component::ApiServer), Some(&api));
    let new = "registry.k8s.io/kube-scheduler:v1.34.0";
    talos
        .set_component_image(&cps[0], Component::Scheduler, new)
        .await
        .unwrap();
    let imgs = talos.component_images(&cps[0]).await.unwrap();
    assert_eq!(
        imgs.get(&Component::Scheduler).map(String::as_str),
        Some(new)
    );
    assert_eq!(imgs.get(&Component::ApiServer), Some(&api), "the rest kept");
    // mirror pods follow the machine config on every request
    let pod = kube
        .static_pod("cp-1", Component::Scheduler)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pod.image, new);
    assert!(pod.ready);

    let k = kube.node("w-1").await.unwrap();
    assert!(k.ready && !k.unschedulable);
    assert_eq!(
        k.kubelet_version.map(|v| v.to_string()).as_deref(),
        Some(KUBE)
    );
    kube.cordon("w-1", "job-1").await.unwrap();
    let k = kube.node("w-1").await.unwrap();
    assert!(k.unschedulable && k.cordoned_by_job("job-1"));
    // another job's uncordon leaves it; its own lifts it
    kube.uncordon("w-1", "job-2").await.unwrap();
    assert!(sim.cordoned("w-1"));
    kube.uncordon("w-1", "job-1").await.unwrap();
    assert!(!sim.cordoned("w-1"));
    assert!(
        medea::metrics::render().contains("api=\"kubernetes\",method=\"Cordon\""),
        "kube calls are timed"
    );
}
