//! The Kubernetes rollout: the upgrade-k8s sequence, its pre-checks, reruns and static pods.

use super::*;

fn kube_world(talos: &str, from: &str, to: &str) -> World {
    world(FakeCluster::new(&specs(3, 2, talos, from)), |_| {
        vec![kube_step(
            &["cp-1", "cp-2", "cp-3"],
            &["w-1", "w-2"],
            from,
            to,
        )]
    })
}

#[tokio::test(start_paused = true)]
async fn kubernetes_rollout_follows_the_upgrade_k8s_sequence() {
    let w = kube_world(TO, KUBE, "v1.34.1");
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    for (name, n) in &s.nodes {
        assert_eq!(n.kubelet, KubeVersion::parse("v1.34.1").unwrap(), "{name}");
        assert_eq!(
            n.counters.upgrade + n.counters.reboot + n.counters.cordon,
            0,
            "no reboot, no drain"
        );
        if n.control_plane {
            for c in [
                Component::ApiServer,
                Component::ControllerManager,
                Component::Scheduler,
                Component::Proxy,
            ] {
                assert_eq!(n.images[&c], format!("{}:v1.34.1", c.default_repository()));
            }
        }
    }
    assert_eq!(s.snapshots, 1);
    assert_eq!(s.manifest_applies, 1);
    let patches: Vec<&str> = s
        .log
        .iter()
        .filter(|l| l.starts_with("set-image"))
        .map(|l| l.as_str())
        .collect();
    let order: Vec<String> = patches
        .iter()
        .map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            format!("{} {}", p[2], p[1])
        })
        .collect();
    let mut expected = Vec::new();
    for c in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
    ] {
        for n in ["cp-1", "cp-2", "cp-3"] {
            expected.push(format!("{c} {n}"));
        }
    }
    for n in ["cp-1", "cp-2", "cp-3", "w-1", "w-2"] {
        expected.push(format!("kubelet {n}"));
    }
    assert_eq!(order, expected);
    // snapshot and pre-pulls come first, the manifests last
    assert!(s.log[0].starts_with("etcd-snapshot"), "{:#?}", s.log);
    assert!(position(&s.log, "pull w-2") < position(&s.log, "set-image"));
    assert!(s.log.last().unwrap().starts_with("apply-manifests"));
}

#[tokio::test(start_paused = true)]
async fn kubernetes_pre_checks_refuse_two_minors_and_unsupported_talos() {
    let w = kube_world(TO, "v1.32.2", "v1.34.1");
    let out = w.executor().run(&w.job).await.unwrap();
    assert!(
        matches!(&out, RunOutcome::Halted { reason, .. } if reason.code() == HaltCode::PrecheckFailed && reason.message().contains("more than one minor")),
        "{out:?}"
    );
    assert!(w.state().log.is_empty());

    let w = kube_world("v1.12.4", "v1.35.0", "v1.36.1");
    let out = w.executor().run(&w.job).await.unwrap();
    assert!(
        matches!(&out, RunOutcome::Halted { reason, .. } if reason.code() == HaltCode::PrecheckFailed && reason.message().contains("does not support Kubernetes v1.36.1")),
        "{out:?}"
    );
    assert!(w.state().log.is_empty());
}

/// A plan whose catalog (`upgradePolicy.kubernetesSupport`) lets Talos 1.12 run Kubernetes
/// 1.36 runs to the end: the pre-check applies the plan's support rule, not one of its own.
#[tokio::test(start_paused = true)]
async fn kubernetes_pre_check_follows_the_plans_support_windows() {
    let w = world(FakeCluster::new(&specs(3, 2, "v1.12.4", "v1.35.0")), |_| {
        let mut step = kube_step(
            &["cp-1", "cp-2", "cp-3"],
            &["w-1", "w-2"],
            "v1.35.0",
            "v1.36.1",
        );
        if let Step::Kubernetes(k) = &mut step {
            k.supported_talos = Some(vec![(1, 12), (1, 13), (1, 14)]);
        }
        vec![step]
    });
    let out = w.executor().run(&w.job).await.unwrap();
    assert_eq!(out, RunOutcome::Succeeded, "{out:?}");
    for (name, n) in &w.state().nodes {
        assert_eq!(n.kubelet, KubeVersion::parse("v1.36.1").unwrap(), "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_manifests_are_synced_the_legacy_way_when_a_node_runs_talos_before_1_13() {
    // upgrade-k8s decides from the lowest Talos version (`SupportsSSAManifestSync`)
    let w = kube_world("v1.12.4", KUBE, "v1.34.1");
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let last = w.state().log.last().cloned().unwrap();
    assert!(
        last.starts_with("apply-manifests") && last.ends_with(" legacy"),
        "{last}"
    );
    let w = kube_world(TO, KUBE, "v1.34.1");
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let last = w.state().log.last().cloned().unwrap();
    assert!(
        last.starts_with("apply-manifests") && !last.ends_with(" legacy"),
        "{last}"
    );
}

#[tokio::test(start_paused = true)]
async fn kubernetes_rollout_rerun_skips_what_is_already_done() {
    // the control plane already runs the new apiserver (an interrupted earlier attempt)
    let w = kube_world(TO, KUBE, "v1.34.1");
    w.fake.edit(|s| {
        for n in ["cp-1", "cp-2", "cp-3"] {
            s.nodes.get_mut(n).unwrap().images.insert(
                Component::ApiServer,
                "registry.k8s.io/kube-apiserver:v1.34.1".into(),
            );
        }
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert!(
        !s.log
            .iter()
            .any(|l| l.contains("set-image") && l.contains("kube-apiserver")),
        "{:#?}",
        s.log
    );
    assert!(
        !s.log
            .iter()
            .any(|l| l.starts_with("pull") && l.contains("kube-apiserver"))
    );
}

#[tokio::test(start_paused = true)]
async fn kubernetes_rollout_waits_for_the_new_config_version_of_each_static_pod() {
    let w = kube_world(TO, KUBE, "v1.34.1");
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    // each patched component was verified at the config version its apply produced
    let notes: Vec<String> = w.journal().into_iter().flat_map(|e| e.notes).collect();
    for n in ["cp-1", "cp-2", "cp-3"] {
        let want = format!(
            "kube-apiserver on `{n}` runs registry.k8s.io/kube-apiserver:v1.34.1 (config version 2)"
        );
        assert!(notes.contains(&want), "{want}: {notes:#?}");
    }
}

#[tokio::test(start_paused = true)]
async fn kubernetes_a_static_pod_stuck_on_its_old_config_version_halts_before_the_next_node() {
    let fake = FakeCluster::new(&specs(3, 2, TO, KUBE)).with_fault(Fault::StaleConfigVersion {
        node: "cp-1".into(),
        component: Component::ApiServer,
    });
    let w = world(fake, |_| {
        vec![kube_step(
            &["cp-1", "cp-2", "cp-3"],
            &["w-1", "w-2"],
            KUBE,
            "v1.34.1",
        )]
    });
    let out = w.executor().run(&w.job).await.unwrap();
    // the pod runs the new image and is Ready: only the config version tells it is stale
    halted_at(
        &out,
        "cp-1",
        HaltCode::ComponentNotReady,
        "kube-apiserver on `cp-1` is not at config version 2 (its mirror pod shows 1)",
    );
    let s = w.state();
    assert_eq!(
        s.nodes["cp-1"].images[&Component::ApiServer],
        "registry.k8s.io/kube-apiserver:v1.34.1"
    );
    assert_eq!(s.nodes["cp-1"].counters.set_image, 1);
    for n in ["cp-2", "cp-3", "w-1", "w-2"] {
        assert_eq!(s.nodes[n].counters.set_image, 0, "{n} untouched");
    }
}

#[tokio::test(start_paused = true)]
async fn kubernetes_a_component_already_at_the_target_is_verified_at_the_current_config_version() {
    // cp-1 already runs the new apiserver image and is Ready, but its mirror pod was rendered
    // from an older config than Talos has now: that is work that only looks done
    let w = kube_world(TO, KUBE, "v1.34.1");
    w.fake.edit(|s| {
        let n = s.nodes.get_mut("cp-1").unwrap();
        n.images.insert(
            Component::ApiServer,
            "registry.k8s.io/kube-apiserver:v1.34.1".into(),
        );
        n.config_versions.insert(Component::ApiServer, 7);
        n.pod_config_versions.insert(Component::ApiServer, 6);
    });
    let out = w.executor().run(&w.job).await.unwrap();
    halted_at(
        &out,
        "cp-1",
        HaltCode::ComponentNotReady,
        "is not at config version 7 (its mirror pod shows 6)",
    );
    let s = w.state();
    assert!(
        !s.log.iter().any(|l| l.starts_with("set-image")),
        "nothing patched: {:#?}",
        s.log
    );
}
