//! The Kubernetes rollout (the `upgrade-k8s` sequence) through the real adapters against the
//! simulator: pre-pulls into the CRI namespace, verification of work that looks done, the
//! control-plane health gate, the removed-flags checks and the bootstrap manifests sync.
//!
//! Each test fails against the behaviour it replaced (see issue 20 items 4–7).

use std::time::Duration;

use medea::plan::{KubeRollout, Step};
use medea::sim::kube::KubeSimConfig;
use medea::sim::talos::{Effect, Method, Trigger};
use medea::version::KubeVersion;

use crate::rollout::KUBE;
use crate::rollout_sim::{Sim, fault, halted, halted_with, run_for};
use medea::rollout::sequencer::HaltCode;

const TARGET: &str = "v1.34.1";

fn kube_step(sim: &Sim, to: &str, health_timeout: Duration) -> Step {
    let (cps, workers): (Vec<String>, Vec<String>) = sim
        .names
        .iter()
        .cloned()
        .partition(|n| n.starts_with("cp-"));
    Step::Kubernetes(KubeRollout {
        from: KubeVersion::parse(KUBE).unwrap(),
        to: KubeVersion::parse(to).unwrap(),
        control_plane: cps,
        workers,
        health_timeout,
        supported_talos: None,
    })
}

/// Run the Kubernetes step to [`TARGET`] (30 s health timeout) on `sim`; it must succeed.
async fn kube_step_succeeds(sim: &Sim, dir: &std::path::Path) {
    let run = run_for(
        sim,
        dir,
        vec![kube_step(sim, TARGET, Duration::from_secs(30))],
    )
    .await;
    let out = run.go().await;
    assert!(
        matches!(out, medea::rollout::RunOutcome::Succeeded),
        "{out:?}"
    );
}

fn applies(sim: &Sim, node: &str) -> u64 {
    sim.talos
        .counters(node)
        .unwrap()
        .calls(Method::ApplyConfiguration)
}

fn image(component: &str, v: &str) -> String {
    format!("registry.k8s.io/{component}:{v}")
}

// ---------------------------------------------------------------------------------------------
// item 7: pre-pull the control-plane images into the CRI namespace

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_images_are_pre_pulled_into_the_cri_namespace_before_any_patch() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 2, 1, KubeSimConfig::default()).await;
    kube_step_succeeds(&sim, dir.path()).await;
    for cp in ["cp-1", "cp-2"] {
        let st = sim.talos.node_state(cp).unwrap();
        for c in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ] {
            let want = image(c, TARGET);
            assert!(
                st.pulls.iter().any(|(i, cri)| *i == want && *cri),
                "{cp}: {want} pulled into the CRI namespace: {:?}",
                st.pulls
            );
            assert!(
                !st.pulled_images.contains(&want),
                "{cp}: {want} is not a system image"
            );
        }
        // the kubelet image goes into the system namespace
        assert!(
            st.pulls
                .iter()
                .any(|(i, cri)| i.contains("kubelet") && i.ends_with(TARGET) && !cri),
            "{:?}",
            st.pulls
        );
    }
    assert!(
        sim.talos
            .node_state("w-1")
            .unwrap()
            .pulls
            .iter()
            .all(|(_, cri)| !cri),
        "workers run no control-plane static pods"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_pre_pull_halts_before_any_patch() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 2, 1, KubeSimConfig::default()).await;
    // cp-2's second pull (its kube-controller-manager image) fails
    sim.talos
        .set_fault(fault(
            "cp-2",
            Trigger::nth_call(Method::ImagePull, 2),
            Effect::PullFail {
                message: "registry.k8s.io/kube-controller-manager:v1.34.1: not found".into(),
            },
        ))
        .unwrap();
    let run = run_for(
        &sim,
        dir.path(),
        vec![kube_step(&sim, TARGET, Duration::from_secs(30))],
    )
    .await;
    let reason = halted_with(&run.go().await, HaltCode::CommandFailed);
    assert!(reason.contains("failed to pull image"), "{reason}");
    assert!(reason.contains("cp-2"), "{reason}");
    for n in ["cp-1", "cp-2", "w-1"] {
        assert_eq!(applies(&sim, n), 0, "{n}: no machine config was patched");
    }
}

// ---------------------------------------------------------------------------------------------
// item 5: never trust work that looks done

/// `effect` strikes cp-1's kube-apiserver when its config is applied. The Kubernetes step
/// halts with `first` after patching cp-1 once; planned again (cp-1 now *looks* done: its
/// config names the target image), the new job still verifies cp-1 and halts with `second`
/// without patching it again. cp-2, cp-3 and the worker are never touched.
async fn cp_1_halts_the_step_twice_before_cp_2_is_touched(
    effect: Effect,
    first: &str,
    second: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 1, KubeSimConfig::default()).await;
    sim.talos
        .set_fault(fault(
            "cp-1",
            Trigger::call(Method::ApplyConfiguration),
            effect,
        ))
        .unwrap();
    for (run_dir, wanted, patched) in [
        ("first", first, "cp-1's apiserver was patched once"),
        ("second", second, "cp-1 is not patched again"),
    ] {
        let run = run_for(
            &sim,
            &dir.path().join(run_dir),
            vec![kube_step(&sim, TARGET, Duration::from_secs(2))],
        )
        .await;
        let reason = halted(&run.go().await).to_string();
        assert!(reason.contains(wanted), "{reason}");
        assert_eq!(applies(&sim, "cp-1"), 1, "{patched}");
        for n in ["cp-2", "cp-3", "w-1"] {
            assert_eq!(applies(&sim, n), 0, "{n} is not touched");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashlooping_new_kube_apiserver_on_cp_1_stops_the_job_before_cp_2_is_touched() {
    let not_ready = "kube-apiserver on `cp-1` is not Ready";
    cp_1_halts_the_step_twice_before_cp_2_is_touched(
        Effect::CrashLoop {
            component: "kube-apiserver".into(),
        },
        not_ready,
        not_ready,
    )
    .await;
}

/// The new image runs and is Ready; only the config version shows the pod is stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_apiserver_pod_stuck_on_its_old_config_version_stops_the_job_before_cp_2_is_touched()
{
    cp_1_halts_the_step_twice_before_cp_2_is_touched(
        Effect::StaleConfigVersion {
            component: "kube-apiserver".into(),
        },
        "kube-apiserver on `cp-1` is not at config version 2 (its mirror pod shows 1)",
        "is not at config version 2 (its mirror pod shows 1)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_upgrade_leaves_each_static_pod_at_its_new_config_version() {
    use medea::rollout::ports::{Component, KubePort, TalosPort};
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 1, KubeSimConfig::default()).await;
    let (talos, kube) = crate::rollout_sim::adapters(&sim).await;
    let cp1 = crate::rollout_sim::node(&sim, "cp-1");
    // before: every static pod was rendered from version 1 of its config resource
    assert_eq!(
        talos
            .component_config_version(&cp1, Component::ApiServer)
            .await
            .unwrap()
            .as_deref(),
        Some("1")
    );
    let run = run_for(
        &sim,
        &dir.path().join("run"),
        vec![kube_step(&sim, TARGET, Duration::from_secs(10))],
    )
    .await;
    assert!(
        matches!(run.go().await, medea::rollout::RunOutcome::Succeeded),
        "the upgrade succeeds"
    );
    for n in ["cp-1", "cp-2", "cp-3"] {
        let t = crate::rollout_sim::node(&sim, n);
        for c in Component::STATIC_PODS {
            let want = talos.component_config_version(&t, c).await.unwrap();
            assert_eq!(
                want.as_deref(),
                Some("2"),
                "{c} on {n}: one patch, one version"
            );
            let pod = kube.static_pod(n, c).await.unwrap().unwrap();
            assert_eq!(pod.config_version, want, "{c} on {n}");
            assert_eq!(pod.image, image(c.name(), TARGET));
            assert!(pod.ready);
        }
    }
    // a worker publishes no control-plane config resource
    let w1 = crate::rollout_sim::node(&sim, "w-1");
    assert_eq!(
        talos
            .component_config_version(&w1, Component::ApiServer)
            .await
            .unwrap(),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_control_plane_kubelet_halts_before_the_first_component_is_patched() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 1, KubeSimConfig::default()).await;
    sim.talos
        .set_service_health("cp-3", "kubelet", false)
        .unwrap();
    let run = run_for(
        &sim,
        dir.path(),
        vec![kube_step(&sim, TARGET, Duration::from_secs(2))],
    )
    .await;
    let reason = halted_with(&run.go().await, HaltCode::ControlPlaneUnhealthy);
    assert!(reason.contains("control plane unhealthy"), "{reason}");
    assert!(
        reason.contains("the kubelet service on `cp-3` is not healthy"),
        "{reason}"
    );
    for n in ["cp-1", "cp-2", "cp-3", "w-1"] {
        assert_eq!(applies(&sim, n), 0, "{n} is not touched");
    }
}

// ---------------------------------------------------------------------------------------------
// item 6: flags the target minor removed stop the step before it touches a node

/// Give `node`'s kubelet `extraArgs` through `ApplyConfiguration` (NO_REBOOT), as an operator
/// does with `talosctl apply-config`.
async fn set_kubelet_extra_args(sim: &Sim, node: &str, args: &str) {
    use medea::talos::{ApplyOptions, ClientSettings, MachineConfig, TalosApi, TalosClient};
    let talosconfig = sim.creds.join(crate::rollout::CLUSTER).join("talosconfig");
    let (client, _) =
        TalosClient::from_talosconfig(&talosconfig, None, ClientSettings::default()).unwrap();
    let yaml = String::from_utf8(sim.talos.machine_config(node).unwrap().expose().clone()).unwrap();
    let anchor = "    disableManifestsDirectory: true\n";
    assert!(yaml.contains(anchor));
    let patched = yaml.replacen(anchor, &format!("{anchor}    extraArgs:\n{args}"), 1);
    let addr = sim.talos.node_state(node).unwrap().address;
    client
        .apply_configuration(
            &medea::talos::NodeTarget::parse(&addr).unwrap(),
            &MachineConfig::from_yaml(patched.into_bytes()),
            ApplyOptions::no_reboot(),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_flag_the_target_removed_stops_the_step_before_any_node_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    // Kubernetes 1.34 removed the kubelet's `--cloud-config`
    set_kubelet_extra_args(
        &sim,
        "w-2",
        "      cloud-config: /etc/kubernetes/cloud.conf\n",
    )
    .await;
    let before: Vec<u64> = ["cp-1", "w-1", "w-2"]
        .iter()
        .map(|n| applies(&sim, n))
        .collect();
    let run = run_for(
        &sim,
        dir.path(),
        vec![kube_step(&sim, TARGET, Duration::from_secs(30))],
    )
    .await;
    let reason = halted_with(&run.go().await, HaltCode::PrecheckFailed);
    assert!(reason.contains("pre-check failed"), "{reason}");
    assert!(
        reason.contains("kubelet on `w-2`: flag `--cloud-config` (machine.kubelet.extraArgs)"),
        "{reason}"
    );
    let after: Vec<u64> = ["cp-1", "w-1", "w-2"]
        .iter()
        .map(|n| applies(&sim, n))
        .collect();
    assert_eq!(before, after, "no machine config was patched");
    for n in ["cp-1", "w-1", "w-2"] {
        let st = sim.talos.node_state(n).unwrap();
        assert!(st.pulls.is_empty(), "{n}: nothing pulled: {:?}", st.pulls);
        assert_eq!(
            sim.talos.counters(n).unwrap().calls(Method::EtcdSnapshot),
            0,
            "{n}: the step stopped before its snapshot"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// item 4: bootstrap manifests as upgrade-k8s syncs them

const CM: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: "hand-edited"
  extra: "kept"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_created_by_an_update_manager_is_taken_over_under_the_talos_field_manager() {
    use medea::k8s::bootstrap::{INVENTORY_ANNOTATION, INVENTORY_NAME};
    use medea::k8s::{ApplyOptions, ClientOptions, K8sError, KubeApi, KubeClient, Manifest};
    let Some(bin) = crate::sim_cluster::require_kubectl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    let kubeconfig = sim.creds.join(crate::rollout::CLUSTER).join("kubeconfig");
    // the CoreDNS ConfigMap already exists, created by `kubectl create` (an Update manager)
    let file = dir.path().join("cm.yaml");
    std::fs::write(&file, CM).unwrap();
    let (ok, out) = crate::sim_cluster::kubectl(
        &bin,
        &kubeconfig,
        dir.path(),
        &["create", "--validate=false", "-f", file.to_str().unwrap()],
    )
    .await;
    assert!(ok, "{out}");
    let client = KubeClient::from_kubeconfig(&kubeconfig, ClientOptions::default())
        .await
        .unwrap();
    // the simulator enforces field ownership: applying a different value without force is a
    // 409 naming the Update manager, as the apiserver answers
    let mine = Manifest::from_value(
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "data": {"Corefile": "other"}}),
        0,
    )
    .unwrap();
    let err = client
        .apply(
            &[mine],
            &ApplyOptions {
                field_manager: "talos".into(),
                force_conflicts: false,
                dry_run: false,
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, K8sError::ApplyConflict { .. }), "{err:?}");
    let chain = medea::error_chain(&err);
    assert!(
        chain.contains("conflict with \"kubectl-create\" using v1: .data.Corefile"),
        "{chain}"
    );

    kube_step_succeeds(&sim, dir.path()).await;
    let (ok, json) = crate::sim_cluster::kubectl(
        &bin,
        &kubeconfig,
        dir.path(),
        &[
            "get",
            "configmap",
            "coredns",
            "-n",
            "kube-system",
            "--show-managed-fields",
            "-o",
            "json",
        ],
    )
    .await;
    assert!(ok, "{json}");
    let cm: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        cm["data"]["Corefile"]
            .as_str()
            .unwrap()
            .contains("forward . /etc/resolv.conf"),
        "{cm}"
    );
    assert_eq!(
        cm["data"]["extra"], "kept",
        "fields talos does not set stay"
    );
    assert_eq!(
        cm["metadata"]["annotations"][INVENTORY_ANNOTATION],
        INVENTORY_NAME
    );
    let managed = cm["metadata"]["managedFields"].as_array().unwrap();
    let talos = managed
        .iter()
        .find(|m| m["manager"] == "talos")
        .expect("talos manages fields");
    assert_eq!(talos["operation"], "Apply");
    assert!(
        talos["fieldsV1"]["f:data"]["f:Corefile"].is_object(),
        "{talos}"
    );
    let kubectl = managed
        .iter()
        .find(|m| m["manager"] == "kubectl-create")
        .expect("kubectl-create keeps what talos does not set");
    assert_eq!(kubectl["operation"], "Update");
    assert!(
        kubectl["fieldsV1"]["f:data"].get("f:Corefile").is_none(),
        "{kubectl}"
    );
    // the inventory lists every applied object
    let inv = inventory(&bin, &kubeconfig, dir.path()).await;
    let keys = data_keys(&inv);
    assert_eq!(keys, TALOS_INVENTORY_KEYS);
    assert_eq!(
        inv["metadata"]["labels"]["cli-utils.sigs.k8s.io/inventory-id"],
        INVENTORY_NAME
    );
}

/// The inventory keys of Talos' default bootstrap manifests (Talos `ManifestController` with
/// CoreDNS, flannel and kube-proxy on), as cli-utils `ObjMetadata.String()` writes them: a `:`
/// in an RBAC name is `__`. Sorted, as a ConfigMap's `data` reads back.
const TALOS_INVENTORY_KEYS: [&str; 21] = [
    "_flannel_rbac.authorization.k8s.io_ClusterRole",
    "_flannel_rbac.authorization.k8s.io_ClusterRoleBinding",
    "_kube-proxy_rbac.authorization.k8s.io_ClusterRoleBinding",
    "_system-bootstrap-approve-node-client-csr_rbac.authorization.k8s.io_ClusterRoleBinding",
    "_system-bootstrap-node-bootstrapper_rbac.authorization.k8s.io_ClusterRoleBinding",
    "_system-bootstrap-node-renewal_rbac.authorization.k8s.io_ClusterRoleBinding",
    "_system__coredns_rbac.authorization.k8s.io_ClusterRole",
    "_system__coredns_rbac.authorization.k8s.io_ClusterRoleBinding",
    "_system__talos-nodes_rbac.authorization.k8s.io_ClusterRole",
    "_system__talos-nodes_rbac.authorization.k8s.io_ClusterRoleBinding",
    "kube-system_bootstrap-token-s1m0la__Secret",
    "kube-system_coredns__ConfigMap",
    "kube-system_coredns__ServiceAccount",
    "kube-system_coredns_apps_Deployment",
    "kube-system_flannel__ServiceAccount",
    "kube-system_kube-dns__Service",
    "kube-system_kube-flannel-cfg__ConfigMap",
    "kube-system_kube-flannel_apps_DaemonSet",
    "kube-system_kube-proxy__ServiceAccount",
    "kube-system_kube-proxy_apps_DaemonSet",
    "kube-system_kubeconfig-in-cluster__ConfigMap",
];

/// Issue #33 item 1: Talos' default manifests hold `ClusterRole`/`ClusterRoleBinding`
/// `system:coredns` and `system:talos-nodes`. Written verbatim into the inventory ConfigMap,
/// their keys hold a `:`, which the apiserver refuses (422, `IsConfigMapKey`): the last task
/// of every Kubernetes step on Talos >= 1.13 failed. The keys Talos' `ManifestApplyController`
/// wrote at bootstrap (cli-utils format) are read back, not pruned, and kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_step_on_talos_1_13_keeps_talos_rbac_in_the_inventory_under_cli_utils_keys() {
    use medea::k8s::bootstrap::{INVENTORY_ANNOTATION, INVENTORY_NAME};
    let Some(bin) = crate::sim_cluster::require_kubectl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    let kubeconfig = sim.creds.join(crate::rollout::CLUSTER).join("kubeconfig");
    // what Talos' ManifestApplyController left at bootstrap: the ClusterRole, annotated for
    // the inventory, and the inventory listing it under its cli-utils key
    let file = dir.path().join("bootstrap.yaml");
    std::fs::write(
        &file,
        format!(
            r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
  annotations:
    {INVENTORY_ANNOTATION}: {INVENTORY_NAME}
rules: []
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {INVENTORY_NAME}
  namespace: kube-system
data:
  _system__coredns_rbac.authorization.k8s.io_ClusterRole: ""
"#
        ),
    )
    .unwrap();
    let (ok, out) = crate::sim_cluster::kubectl(
        &bin,
        &kubeconfig,
        dir.path(),
        &["create", "--validate=false", "-f", file.to_str().unwrap()],
    )
    .await;
    assert!(ok, "{out}");
    // the simulator refuses a key with a `:` as the apiserver does
    let (ok, out) = crate::sim_cluster::kubectl(
        &bin,
        &kubeconfig,
        dir.path(),
        &[
            "patch",
            "configmap",
            INVENTORY_NAME,
            "-n",
            "kube-system",
            "--type=merge",
            "-p",
            r#"{"data":{"_system:coredns_rbac.authorization.k8s.io_ClusterRole":""}}"#,
        ],
    )
    .await;
    assert!(!ok, "{out}");
    assert!(
        out.contains("ConfigMap \"talos-bootstrap-manifests-inventory\" is invalid: data[_system:coredns_rbac.authorization.k8s.io_ClusterRole]: Invalid value: \"_system:coredns_rbac.authorization.k8s.io_ClusterRole\": a valid config key must consist of alphanumeric characters, '-', '_' or '.'"),
        "{out}"
    );

    kube_step_succeeds(&sim, dir.path()).await;
    let inv = inventory(&bin, &kubeconfig, dir.path()).await;
    let keys = data_keys(&inv);
    assert_eq!(keys, TALOS_INVENTORY_KEYS);
    // the RBAC objects are there, applied by the `talos` field manager, none pruned
    for kind in ["clusterrole", "clusterrolebinding"] {
        for name in ["system:coredns", "system:talos-nodes"] {
            let (ok, obj) = crate::sim_cluster::kubectl(
                &bin,
                &kubeconfig,
                dir.path(),
                &["get", kind, name, "--show-managed-fields", "-o", "json"],
            )
            .await;
            assert!(ok, "{kind} {name}: {obj}");
            let obj: serde_json::Value = serde_json::from_str(&obj).unwrap();
            assert_eq!(
                obj["metadata"]["annotations"][INVENTORY_ANNOTATION], INVENTORY_NAME,
                "{obj}"
            );
            assert!(
                obj["metadata"]["managedFields"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| m["manager"] == "talos" && m["operation"] == "Apply"),
                "{obj}"
            );
        }
    }
    let (ok, role) = crate::sim_cluster::kubectl(
        &bin,
        &kubeconfig,
        dir.path(),
        &["get", "clusterrole", "system:coredns", "-o", "json"],
    )
    .await;
    assert!(ok, "{role}");
    let role: serde_json::Value = serde_json::from_str(&role).unwrap();
    assert_eq!(
        role["rules"][1]["resources"][0], "endpointslices",
        "Talos' rules applied over the bootstrap copy: {role}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_the_manifests_no_longer_render_are_pruned_unless_another_inventory_owns_them() {
    use medea::k8s::bootstrap::{INVENTORY_ANNOTATION, INVENTORY_NAME};
    let Some(bin) = crate::sim_cluster::require_kubectl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    let kubeconfig = sim.creds.join(crate::rollout::CLUSTER).join("kubeconfig");
    let k = |args: Vec<String>| {
        let (bin, kubeconfig, home) = (bin.clone(), kubeconfig.clone(), dir.path().to_path_buf());
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            crate::sim_cluster::kubectl(&bin, &kubeconfig, &home, &args).await
        }
    };
    // an object an earlier sync applied (annotated, listed) that Talos no longer renders, and
    // one the inventory lists that carries no inventory's annotation
    let file = dir.path().join("objs.yaml");
    std::fs::write(
        &file,
        format!(
            r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: old-dns
  namespace: kube-system
  annotations:
    {INVENTORY_ANNOTATION}: {INVENTORY_NAME}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: unannotated
  namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {INVENTORY_NAME}
  namespace: kube-system
  labels:
    cli-utils.sigs.k8s.io/inventory-id: {INVENTORY_NAME}
data:
  kube-system_old-dns__ConfigMap: ""
  kube-system_unannotated__ConfigMap: ""
"#
        ),
    )
    .unwrap();
    let (ok, out) = k(vec![
        "create".into(),
        "--validate=false".into(),
        "-f".into(),
        file.to_str().unwrap().into(),
    ])
    .await;
    assert!(ok, "{out}");
    kube_step_succeeds(&sim, dir.path()).await;
    let (ok, out) = k(vec![
        "get".into(),
        "configmap".into(),
        "old-dns".into(),
        "-n".into(),
        "kube-system".into(),
    ])
    .await;
    assert!(!ok && out.contains("NotFound"), "old-dns is pruned: {out}");
    // listed and annotated for no inventory: `AdoptIfNoInventory` prunes it too
    let (ok, out) = k(vec![
        "get".into(),
        "configmap".into(),
        "unannotated".into(),
        "-n".into(),
        "kube-system".into(),
    ])
    .await;
    assert!(
        !ok && out.contains("NotFound"),
        "unannotated is pruned: {out}"
    );
    let (ok, inv) = k(vec![
        "get".into(),
        "configmap".into(),
        INVENTORY_NAME.into(),
        "-n".into(),
        "kube-system".into(),
        "-o".into(),
        "jsonpath={.data}".into(),
    ])
    .await;
    assert!(ok, "{inv}");
    assert!(!inv.contains("old-dns"), "{inv}");
    assert!(inv.contains("kube-system_coredns__ConfigMap"), "{inv}");

    // a listed object annotated for another inventory is never deleted: the job halts
    // (`AdoptIfNoInventory`, talosctl's default: go-kubernetes `checkInventoryPolicy`)
    let foreign = dir.path().join("foreign.yaml");
    std::fs::write(
        &foreign,
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: foreign\n  namespace: kube-system\n  annotations:\n    {INVENTORY_ANNOTATION}: another-inventory\n"
        ),
    )
    .unwrap();
    let (ok, out) = k(vec![
        "create".into(),
        "--validate=false".into(),
        "-f".into(),
        foreign.to_str().unwrap().into(),
    ])
    .await;
    assert!(ok, "{out}");
    let (ok, out) = k(vec![
        "patch".into(),
        "configmap".into(),
        INVENTORY_NAME.into(),
        "-n".into(),
        "kube-system".into(),
        "--type=merge".into(),
        "-p".into(),
        r#"{"data":{"kube-system_foreign__ConfigMap":""}}"#.into(),
    ])
    .await;
    assert!(ok, "{out}");
    let second = dir.path().join("second");
    let run = run_for(
        &sim,
        &second,
        vec![kube_step(&sim, TARGET, Duration::from_secs(30))],
    )
    .await;
    let reason = halted_with(&run.go().await, HaltCode::CommandFailed);
    assert!(reason.contains("ConfigMap kube-system/foreign"), "{reason}");
    assert!(reason.contains("not pruned"), "{reason}");
    assert!(
        reason.contains("status: NoMatch, policy: AdoptIfNoInventory"),
        "{reason}"
    );
    let (ok, out) = k(vec![
        "get".into(),
        "configmap".into(),
        "foreign".into(),
        "-n".into(),
        "kube-system".into(),
    ])
    .await;
    assert!(ok, "foreign is kept: {out}");
}

// ---------------------------------------------------------------------------------------------
// issue #33 item 2: Talos 1.14's `final-*` config resources

/// From Talos 1.14 a static pod is rendered from `final-<component>`, and its
/// `talos.dev/config-version` is that resource's version, which runs apart from the raw
/// `<component>` resource's (talos#14258). Comparing with the raw one, the control-plane wait
/// never matched and the step halted at the health timeout with a mixed control plane; talosctl
/// reads the final resource first (PR #14269) and so does medea.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_talos_1_14_the_control_plane_wait_compares_with_the_final_config_resource() {
    use medea::talos::{ClientSettings, NodeTarget, TalosClient};
    async fn version_of(client: &TalosClient, id: &str) -> String {
        client
            .cosi_get(
                &NodeTarget::parse("cp-1").unwrap(),
                "controlplane",
                "APIServerConfigs.kubernetes.talos.dev",
                id,
            )
            .await
            .unwrap()
            .version
    }
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start_from(dir.path(), 2, 1, KubeSimConfig::default(), "v1.14.0").await;
    let talosconfig = sim
        .talos
        .write_talosconfig(&dir.path().join("talos"))
        .unwrap();
    let (client, _) =
        TalosClient::from_talosconfig(&talosconfig, None, ClientSettings::default()).unwrap();
    let raw = version_of(&client, "kube-apiserver").await;
    let fin = version_of(&client, "final-kube-apiserver").await;
    assert_ne!(raw, fin, "the simulator keeps the two counters apart");

    let run = run_for(
        &sim,
        dir.path(),
        vec![kube_step(&sim, TARGET, Duration::from_secs(10))],
    )
    .await;
    let out = run.go().await;
    assert!(
        matches!(out, medea::rollout::RunOutcome::Succeeded),
        "{out:?}"
    );
    let raw2 = version_of(&client, "kube-apiserver").await;
    let fin2 = version_of(&client, "final-kube-apiserver").await;
    assert_ne!(raw2, fin2, "still apart after the patch");
    assert!(
        fin2 != fin && raw2 != raw,
        "both moved on: {raw}->{raw2}, {fin}->{fin2}"
    );
    for cp in ["cp-1", "cp-2"] {
        let st = sim.talos.node_state(cp).unwrap();
        for c in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ] {
            assert_eq!(st.static_pod_images[c], image(c, TARGET), "{cp} {c}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// talos#14152: on Talos < 1.14.0 a change of the scheduler's config also restarts the node's
// kube-apiserver

/// Move `node`'s kube-scheduler to image tag `tag` through `ApplyConfiguration` (NO_REBOOT),
/// as `talosctl patch mc` does: a scheduler-only config change.
async fn set_scheduler_image(sim: &Sim, node: &str, tag: &str) {
    use medea::talos::{ApplyOptions, ClientSettings, MachineConfig, TalosApi, TalosClient};
    let talosconfig = sim.creds.join(crate::rollout::CLUSTER).join("talosconfig");
    let (client, _) =
        TalosClient::from_talosconfig(&talosconfig, None, ClientSettings::default()).unwrap();
    let yaml = String::from_utf8(sim.talos.machine_config(node).unwrap().expose().clone()).unwrap();
    let from = format!("image: {}", image("kube-scheduler", KUBE));
    assert!(yaml.contains(&from), "{yaml}");
    let patched = yaml.replacen(
        &from,
        &format!("image: {}", image("kube-scheduler", tag)),
        1,
    );
    let addr = sim.talos.node_state(node).unwrap().address;
    client
        .apply_configuration(
            &medea::talos::NodeTarget::parse(&addr).unwrap(),
            &MachineConfig::from_yaml(patched.into_bytes()),
            ApplyOptions::no_reboot(),
        )
        .await
        .unwrap();
}

/// The uid and `talos.dev/config-file-version` of `component`'s mirror pod on `node`.
fn mirror_pod(sim: &Sim, component: &str, node: &str) -> (String, Option<String>) {
    sim.kube.pods(); // converge with the Talos side first
    let pod = sim
        .kube
        .get("v1", "Pod", "kube-system", &format!("{component}-{node}"))
        .unwrap();
    (
        pod["metadata"]["uid"].as_str().unwrap().to_string(),
        pod["metadata"]["annotations"]["talos.dev/config-file-version"]
            .as_str()
            .map(str::to_string),
    )
}

/// A scheduler-only config change on cp-1 of a cluster on Talos `talos`: whether cp-1's
/// kube-apiserver mirror pod was replaced, and its config-file-version before and after.
async fn scheduler_change_restarts_apiserver(
    talos: &str,
) -> (bool, Option<String>, Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start_from(dir.path(), 2, 0, KubeSimConfig::default(), talos).await;
    let (api_uid, file_before) = mirror_pod(&sim, "kube-apiserver", "cp-1");
    let (sched_uid, _) = mirror_pod(&sim, "kube-scheduler", "cp-1");
    let (other_uid, _) = mirror_pod(&sim, "kube-apiserver", "cp-2");
    set_scheduler_image(&sim, "cp-1", TARGET).await;
    let (api_uid2, file_after) = mirror_pod(&sim, "kube-apiserver", "cp-1");
    let (sched_uid2, _) = mirror_pod(&sim, "kube-scheduler", "cp-1");
    assert_ne!(sched_uid, sched_uid2, "the scheduler itself restarts");
    assert_eq!(
        other_uid,
        mirror_pod(&sim, "kube-apiserver", "cp-2").0,
        "another node's kube-apiserver is not touched"
    );
    (api_uid != api_uid2, file_before, file_after)
}

/// Talos v1.13.9 concatenates the scheduler config's version into the kube-apiserver pod's
/// `talos.dev/config-file-version` (`render_config_static_pods.go`): a scheduler-only change
/// restarts the same node's kube-apiserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_talos_1_13_a_scheduler_config_change_restarts_the_nodes_kube_apiserver() {
    let (restarted, before, after) = scheduler_change_restarts_apiserver("v1.13.9").await;
    assert!(restarted, "{before:?} -> {after:?}");
    assert_eq!(before.as_deref(), Some("1111"));
    assert_eq!(after.as_deref(), Some("1112"));
}

/// Stable Talos 1.14 (v1.14.0 and later, talos PR #14177) leaves the scheduler out of the
/// kube-apiserver's config-file-version: the kube-apiserver keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_stable_talos_1_14_a_scheduler_config_change_leaves_the_kube_apiserver_running() {
    let (restarted, before, after) = scheduler_change_restarts_apiserver("v1.14.6").await;
    assert!(!restarted, "{before:?} -> {after:?}");
    assert_eq!(before.as_deref(), Some("111"));
    assert_eq!(after, before);
}

/// Samples of the control plane while a step runs: which control planes' kube-apiserver
/// mirror pod is missing or not Ready, and how many `ApplyConfiguration` calls each node has
/// taken.
type Sample = (
    std::collections::BTreeSet<String>,
    std::collections::BTreeMap<String, u64>,
);

/// Sample the simulator until `stop` is set.
fn sample_control_plane(
    sim: &Sim,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    let (kube, talos, names) = (sim.kube.clone(), sim.talos.clone(), sim.names.clone());
    tokio::spawn(async move {
        let mut out = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let pods = kube.pods();
            let down = names
                .iter()
                .filter(|n| n.starts_with("cp-"))
                .filter(|n| {
                    !pods
                        .iter()
                        .any(|p| p.name == format!("kube-apiserver-{n}") && p.ready)
                })
                .cloned()
                .collect();
            let applies = names
                .iter()
                .map(|n| {
                    let calls = talos.counters(n).unwrap().calls(Method::ApplyConfiguration);
                    (n.clone(), calls)
                })
                .collect();
            out.push((down, applies));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        out
    })
}

/// Each time a node took a config while another control plane's kube-apiserver was down
/// (down in the samples before and after, and that node took no config in between, so it was
/// down the whole time): `(patched, down)`.
fn patched_while_an_apiserver_was_down(samples: &[Sample]) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for w in samples.windows(2) {
        let ((down_a, applies_a), (down_b, applies_b)) = (&w[0], &w[1]);
        for (y, n) in applies_b {
            if *n <= applies_a[y] {
                continue;
            }
            for x in down_a.intersection(down_b) {
                if x != y && applies_a[x] == applies_b[x] {
                    found.push((y.clone(), x.clone()));
                }
            }
        }
    }
    found
}

/// How many times each control plane's kube-apiserver went down in the samples.
fn apiserver_restarts(samples: &[Sample], node: &str) -> usize {
    let mut n = 0;
    let mut was_down = false;
    for (down, _) in samples {
        let d = down.contains(node);
        if d && !was_down {
            n += 1;
        }
        was_down = d;
    }
    n
}

/// On Talos 1.13 (talos#14152) the scheduler's patch restarts the same node's kube-apiserver,
/// which comes back later than the scheduler. The step waits for it before it touches the
/// next node, also after the last control plane's scheduler (the next task there is a
/// kube-proxy or kubelet patch, which the control-plane gate does not guard): no node takes a
/// config while another's kube-apiserver is down, and the step does not halt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_talos_1_13_the_step_waits_for_the_kube_apiserver_the_scheduler_patch_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start_from(dir.path(), 3, 1, KubeSimConfig::default(), "v1.13.9").await;
    sim.kube
        .set_pod_delays(Duration::from_millis(200), Duration::ZERO);
    sim.kube
        .inject(medea::sim::kube::KubeFault::SlowStaticPodStart {
            component: "kube-apiserver".into(),
            extra: Duration::from_millis(1500),
        });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_control_plane(&sim, stop.clone());
    let run = run_for(
        &sim,
        dir.path(),
        vec![kube_step(&sim, TARGET, Duration::from_secs(60))],
    )
    .await;
    let out = run.go().await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let samples = sampler.await.unwrap();
    assert!(
        matches!(out, medea::rollout::RunOutcome::Succeeded),
        "{out:?}"
    );
    assert_eq!(
        patched_while_an_apiserver_was_down(&samples),
        Vec::<(String, String)>::new(),
        "(node patched, control plane whose kube-apiserver was down)"
    );
    for cp in ["cp-1", "cp-2", "cp-3"] {
        assert!(
            apiserver_restarts(&samples, cp) >= 2,
            "{cp}: its kube-apiserver restarted for its own patch and again for the scheduler's"
        );
        assert_eq!(
            mirror_pod(&sim, "kube-apiserver", cp).1.as_deref(),
            Some("1122"),
            "{cp}: rendered after the authorization (kube-apiserver image) and the scheduler's \
             configs moved to version 2"
        );
    }
    // the step ended with every control plane back
    assert!(
        sim.kube.pods().iter().filter(|p| p.mirror).all(|p| p.ready),
        "{:?}",
        sim.kube.pods()
    );
}

/// The bootstrap-manifests inventory ConfigMap as real kubectl reads it (`-o json`).
async fn inventory(
    bin: &std::path::Path,
    kubeconfig: &std::path::Path,
    dir: &std::path::Path,
) -> serde_json::Value {
    let (ok, inv) = crate::sim_cluster::kubectl(
        bin,
        kubeconfig,
        dir,
        &[
            "get",
            "configmap",
            medea::k8s::bootstrap::INVENTORY_NAME,
            "-n",
            "kube-system",
            "-o",
            "json",
        ],
    )
    .await;
    assert!(ok, "{inv}");
    serde_json::from_str(&inv).unwrap()
}

/// The keys of a ConfigMap's `data`, in the order the apiserver returns them.
fn data_keys(obj: &serde_json::Value) -> Vec<&str> {
    obj["data"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect()
}
