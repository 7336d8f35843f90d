//! Issue #22, observations: the simulator serves deprecated APIs as a real kube-apiserver does
//! (discovery per minor, the `Warning: 299` header, the `apiserver_requested_deprecated_apis`
//! gauge, managedFields with the writer's version) and medea's refresh gathers what real
//! client actions leave behind (the gauge, managedFields, PDBs, etcd alarms, node pressure,
//! credential expiry).

use std::path::{Path, PathBuf};

use medea::sim::kube::KubeSimConfig;
use medea::sim::talos::Scenario;
use medea::version::{KubeVersion, TalosVersion};

use crate::rollout::{CLUSTER, FROM};
use crate::rollout_sim::Sim;

const FLOWSCHEMA_WARNING: &str = "Warning: flowcontrol.apiserver.k8s.io/v1beta3 FlowSchema is deprecated in v1.29+, unavailable in v1.32+; use flowcontrol.apiserver.k8s.io/v1 FlowSchema";

async fn sim_on(dir: &Path, kube: &str) -> Sim {
    let scenario = Scenario::uniform(
        1,
        1,
        TalosVersion::parse(FROM).unwrap(),
        KubeVersion::parse(kube).unwrap(),
    );
    Sim::start_scenario(dir, scenario, KubeSimConfig::default()).await
}

fn kubeconfig(sim: &Sim) -> PathBuf {
    sim.creds.join(CLUSTER).join("kubeconfig")
}

async fn kubectl(bin: &Path, sim: &Sim, home: &Path, args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig(sim))
        .args(args)
        .env("HOME", home)
        .env_remove("KUBECONFIG")
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const GAUGE_LINE: &str = "apiserver_requested_deprecated_apis{group=\"flowcontrol.apiserver.k8s.io\",removed_release=\"1.32\",resource=\"flowschemas\",subresource=\"\",version=\"v1beta3\"} 1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_sees_the_deprecation_warning_and_the_gauge_on_a_1_31_simulator() {
    let Some(bin) = crate::sim_cluster::require_kubectl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let sim = sim_on(dir.path(), "v1.31.4").await;
    // nothing asked for a deprecated API yet
    let (ok, metrics, err) = kubectl(&bin, &sim, &home, &["get", "--raw", "/metrics"]).await;
    assert!(ok, "{err}");
    assert!(
        !metrics.contains("apiserver_requested_deprecated_apis"),
        "{metrics}"
    );
    assert!(metrics.contains("kubernetes_build_info{"), "{metrics}");

    let (ok, out, err) = kubectl(
        &bin,
        &sim,
        &home,
        &["get", "flowschemas.v1beta3.flowcontrol.apiserver.k8s.io"],
    )
    .await;
    assert!(ok, "{out}{err}");
    assert!(err.contains(FLOWSCHEMA_WARNING), "stderr: {err}");
    // the apiserver's own mandatory objects are there
    assert!(out.contains("catch-all") && out.contains("exempt"), "{out}");
    // the stored version draws no warning
    let (ok, _, err) = kubectl(&bin, &sim, &home, &["get", "flowschemas", "-o", "name"]).await;
    assert!(ok && !err.contains("Warning"), "{err}");

    let (ok, metrics, err) = kubectl(&bin, &sim, &home, &["get", "--raw", "/metrics"]).await;
    assert!(ok, "{err}");
    assert!(metrics.contains(GAUGE_LINE), "{metrics}");
    assert!(
        metrics.contains("# TYPE apiserver_requested_deprecated_apis gauge"),
        "{metrics}"
    );
    // an object read through v1beta3 says v1beta3
    let (ok, out, err) = kubectl(
        &bin,
        &sim,
        &home,
        &[
            "get",
            "flowschemas.v1beta3.flowcontrol.apiserver.k8s.io",
            "exempt",
            "-o",
            "jsonpath={.apiVersion}",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out, "flowcontrol.apiserver.k8s.io/v1beta3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_32_simulator_no_longer_serves_flowcontrol_v1beta3() {
    let Some(bin) = crate::sim_cluster::require_kubectl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let sim = sim_on(dir.path(), "v1.32.3").await;
    let (ok, _, err) = kubectl(
        &bin,
        &sim,
        &home,
        &["get", "flowschemas.v1beta3.flowcontrol.apiserver.k8s.io"],
    )
    .await;
    assert!(!ok, "{err}");
    assert!(
        err.contains("the server doesn't have a resource type"),
        "{err}"
    );
    let (ok, out, err) = kubectl(
        &bin,
        &sim,
        &home,
        &["get", "--raw", "/apis/flowcontrol.apiserver.k8s.io"],
    )
    .await;
    assert!(ok, "{err}");
    let group: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(group["versions"].as_array().unwrap().len(), 1, "{group}");
    assert_eq!(group["preferredVersion"]["version"], "v1");
}

const V1BETA3_FLOWSCHEMA: &str = r#"apiVersion: flowcontrol.apiserver.k8s.io/v1beta3
kind: FlowSchema
metadata:
  name: legacy-operator
spec:
  matchingPrecedence: 500
  priorityLevelConfiguration:
    name: catch-all
  rules:
  - subjects:
    - kind: ServiceAccount
      serviceAccount:
        name: legacy-operator
        namespace: default
    resourceRules:
    - verbs: ["*"]
      apiGroups: ["*"]
      resources: ["*"]
      namespaces: ["*"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_a_v1beta3_flowschema_records_the_version_in_managed_fields() {
    let Some(bin) = crate::sim_cluster::require_kubectl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let sim = sim_on(dir.path(), "v1.30.6").await;
    let file = dir.path().join("fs.yaml");
    std::fs::write(&file, V1BETA3_FLOWSCHEMA).unwrap();
    let (ok, out, err) = kubectl(&bin, &sim, &home, &["apply", "-f", file.to_str().unwrap()]).await;
    assert!(ok, "{out}{err}");
    assert!(err.contains(FLOWSCHEMA_WARNING), "{err}");
    // read back through v1: stored in v1, the writer's entry keeps v1beta3
    let (ok, out, err) = kubectl(
        &bin,
        &sim,
        &home,
        &[
            "get",
            "flowschemas.v1.flowcontrol.apiserver.k8s.io",
            "legacy-operator",
            "-o",
            "json",
            "--show-managed-fields",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let obj: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(obj["apiVersion"], "flowcontrol.apiserver.k8s.io/v1");
    let entries = obj["metadata"]["managedFields"].as_array().unwrap();
    let csa = entries
        .iter()
        .find(|e| e["manager"] == "kubectl-client-side-apply")
        .unwrap_or_else(|| panic!("{entries:?}"));
    assert_eq!(csa["apiVersion"], "flowcontrol.apiserver.k8s.io/v1beta3");
    assert_eq!(csa["operation"], "Update");
    // a later write through v1 by another manager does not rewrite that entry
    let (ok, _, err) = kubectl(
        &bin,
        &sim,
        &home,
        &[
            "label",
            "flowschemas.v1.flowcontrol.apiserver.k8s.io",
            "legacy-operator",
            "team=platform",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let (_, out, _) = kubectl(
        &bin,
        &sim,
        &home,
        &[
            "get",
            "flowschemas",
            "legacy-operator",
            "-o",
            "json",
            "--show-managed-fields",
        ],
    )
    .await;
    let obj: serde_json::Value = serde_json::from_str(&out).unwrap();
    let entries = obj["metadata"]["managedFields"].as_array().unwrap();
    let version_of = |m: &str| {
        entries
            .iter()
            .find(|e| e["manager"] == m)
            .map(|e| e["apiVersion"].as_str().unwrap().to_string())
    };
    assert_eq!(
        version_of("kubectl-client-side-apply").as_deref(),
        Some("flowcontrol.apiserver.k8s.io/v1beta3"),
        "{entries:?}"
    );
    assert_eq!(
        version_of("kubectl-label").as_deref(),
        Some("flowcontrol.apiserver.k8s.io/v1"),
        "{entries:?}"
    );
}
