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

// ---------------------------------------------------------------------------------------------
// Gathering: real client actions on the simulator → medea's observation

use medea::inventory::ObservedCluster;
use medea::inventory::preflight::PreflightObservations;
use medea::k8s::KubeClient;
use medea::ops::preflight::CredentialFiles;
use medea::ops::refresh;
use medea::sim::kube::{Forbidden, KubeFault};
use medea::sim::talos::{EtcdAlarmKind, EtcdAlarmSpec};
use medea::talos::TalosClient;

async fn observe(sim: &Sim) -> PreflightObservations {
    let dir = sim.creds.join(CLUSTER);
    let talosconfig = dir.join("talosconfig");
    let kubeconfig = dir.join("kubeconfig");
    let (talos, _) =
        TalosClient::from_talosconfig(&talosconfig, None, crate::sim_cluster::fast_talos())
            .unwrap();
    let kube = KubeClient::from_kubeconfig(&kubeconfig, crate::sim_cluster::fast_kube())
        .await
        .unwrap();
    let files = CredentialFiles {
        talosconfig: &talosconfig,
        kubeconfig: &kubeconfig,
    };
    refresh::observe_with_credentials(&talos, &kube, CLUSTER, Some(files))
        .await
        .unwrap()
        .preflight
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deprecated_request_by_kubectl_reaches_the_observation_through_the_gauge_and_managed_fields()
 {
    let Some(bin) = crate::sim_cluster::require_kubectl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let sim = sim_on(dir.path(), "v1.31.4").await;
    let before = observe(&sim).await;
    assert!(before.gathered);
    assert!(before.deprecated_api_requests.is_empty(), "{before:?}");
    // the apiserver's own APF objects carry no client's deprecated entries
    assert!(
        before.managed_fields.is_empty(),
        "{:?}",
        before.managed_fields
    );
    assert!(
        before.gather_errors.is_empty(),
        "{:?}",
        before.gather_errors
    );
    // the control-plane node's own apiserver, where the `kubernetes` EndpointSlice says it
    // is (its address, the published port), answers; the kubeconfig's endpoint is then not
    // asked (it is only the fallback when no apiserver answers)
    let server = sim.kube.node_apiserver_url("cp-1").unwrap();
    assert!(server.starts_with("https://127.5.0.2:"), "{server}");
    assert_eq!(
        before.apiserver_metrics,
        [medea::inventory::preflight::MetricsSource {
            endpoint: server.clone(),
            error: None,
            started: before.apiserver_metrics[0].started,
        }]
    );
    assert!(before.apiserver_metrics[0].started.is_some(), "{before:?}");
    // observing again changes nothing (the generation would not move)
    assert_eq!(observe(&sim).await, before);

    let file = dir.path().join("fs.yaml");
    std::fs::write(&file, V1BETA3_FLOWSCHEMA).unwrap();
    let (ok, out, err) = kubectl(&bin, &sim, &home, &["apply", "-f", file.to_str().unwrap()]).await;
    assert!(ok, "{out}{err}");
    let after = observe(&sim).await;
    let req = after
        .deprecated_api_requests
        .iter()
        .find(|r| r.resource == "flowschemas")
        .unwrap_or_else(|| panic!("{:?}", after.deprecated_api_requests));
    assert_eq!(req.group, "flowcontrol.apiserver.k8s.io");
    assert_eq!(req.version, "v1beta3");
    assert_eq!(req.removed_release, "1.32");
    assert_eq!(req.source, server);
    assert_eq!(after.managed_fields.len(), 1, "{:?}", after.managed_fields);
    let m = &after.managed_fields[0];
    assert_eq!(m.name, "legacy-operator");
    assert_eq!(m.resource, "flowschemas");
    assert_eq!(m.kind, "FlowSchema");
    assert_eq!(m.api_version, "flowcontrol.apiserver.k8s.io/v1beta3");
    assert_eq!(m.manager, "kubectl-client-side-apply");
    assert_eq!(m.operation, "Update");
    let cluster = ObservedCluster::new(CLUSTER);
    let seen = cluster.observe_with(None, Default::default(), before.clone());
    assert_ne!(
        seen.observe_with(None, Default::default(), after.clone())
            .generation,
        seen.generation,
        "a new deprecated request moves the generation"
    );
    assert_eq!(
        seen.observe_with(None, Default::default(), before)
            .generation,
        seen.generation
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_endpoint_that_refuses_is_an_outcome_not_a_pass() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim_on(dir.path(), "v1.31.4").await;
    sim.kube
        .inject(KubeFault::Forbidden(Forbidden::parse("get", "/metrics")));
    let obs = observe(&sim).await;
    let server = format!("https://{}", sim.kube.addr());
    let refused = obs
        .apiserver_metrics
        .iter()
        .find(|m| m.endpoint == server)
        .unwrap_or_else(|| panic!("{:?}", obs.apiserver_metrics));
    let error = refused.error.as_deref().unwrap();
    assert!(
        error.contains("403") || error.contains("orbidden"),
        "{error}"
    );
    assert!(error.contains("/metrics"), "{error}");
    assert!(obs.apiserver_metrics.iter().all(|m| m.error.is_some()));
}

const WEB: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: nginx:1.27}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: web}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdb_patched_to_allow_nothing_is_observed_with_its_pods_and_nodes() {
    let Some(bin) = crate::sim_cluster::require_kubectl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let sim = sim_on(dir.path(), "v1.33.4").await;
    let file = dir.path().join("web.yaml");
    std::fs::write(&file, WEB).unwrap();
    let (ok, out, err) = kubectl(&bin, &sim, &home, &["apply", "-f", file.to_str().unwrap()]).await;
    assert!(ok, "{out}{err}");
    let obs = observe(&sim).await;
    let pdb = obs
        .pod_disruption_budgets
        .iter()
        .find(|p| p.name == "web")
        .unwrap_or_else(|| panic!("{:?}", obs.pod_disruption_budgets));
    assert_eq!(pdb.namespace, "default");
    assert_eq!(pdb.disruptions_allowed, 1);
    // pods are kept only while the budget allows nothing
    assert!(pdb.pods.is_empty(), "{pdb:?}");

    let (ok, out, err) = kubectl(
        &bin,
        &sim,
        &home,
        &[
            "patch",
            "pdb",
            "web",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"minAvailable":2}}"#,
        ],
    )
    .await;
    assert!(ok, "{out}{err}");
    let obs = observe(&sim).await;
    let pdb = obs
        .pod_disruption_budgets
        .iter()
        .find(|p| p.name == "web")
        .unwrap();
    assert_eq!(pdb.disruptions_allowed, 0, "{pdb:?}");
    assert_eq!(pdb.pods.len(), 2, "{pdb:?}");
    assert!(pdb.pods.iter().all(|p| !p.node.is_empty()), "{pdb:?}");
    let nodes: Vec<&str> = pdb.pods.iter().map(|p| p.node.as_str()).collect();
    assert!(
        nodes.iter().all(|n| sim.names.iter().any(|s| s == n)),
        "{nodes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_etcd_alarms_node_pressure_and_short_lived_credentials_are_observed() {
    let dir = tempfile::tempdir().unwrap();
    let mut scenario = Scenario::uniform(
        3,
        1,
        TalosVersion::parse(FROM).unwrap(),
        KubeVersion::parse("v1.33.4").unwrap(),
    );
    let cp = scenario.nodes[0].name.clone();
    let worker = scenario.nodes[3].name.clone();
    scenario.etcd_alarms.push(EtcdAlarmSpec {
        node: cp.clone(),
        alarm: EtcdAlarmKind::Nospace,
    });
    scenario.client_cert_valid_for = Some(std::time::Duration::from_secs(2 * 3600));
    let sim = Sim::start_scenario(dir.path(), scenario, KubeSimConfig::default()).await;
    sim.kube.inject(KubeFault::NodePressure {
        node: worker.clone(),
        condition: "DiskPressure".into(),
    });
    let obs = observe(&sim).await;

    let etcd = obs.etcd.as_ref().expect("etcd observed");
    assert_eq!(etcd.members.len(), 3, "{etcd:?}");
    assert!(
        etcd.members.iter().all(|m| m.healthy && !m.learner),
        "{etcd:?}"
    );
    assert!(etcd.unreachable.is_empty(), "{etcd:?}");
    assert_eq!(etcd.alarms.len(), 1, "{etcd:?}");
    assert_eq!(etcd.alarms[0].alarm, "NOSPACE");
    let member = etcd.members.iter().find(|m| m.name == cp).unwrap();
    assert_eq!(etcd.alarms[0].member, member.id);

    assert_eq!(
        obs.node_pressure.get(&worker).map(Vec::as_slice),
        Some(&["DiskPressure".to_string()][..]),
        "{:?}",
        obs.node_pressure
    );
    assert_eq!(obs.node_pressure.len(), 1);

    let talos = obs
        .credentials
        .iter()
        .find(|c| c.credential == "talosconfig client certificate")
        .unwrap_or_else(|| panic!("{:?} {:?}", obs.credentials, obs.gather_errors));
    let not_after: jiff::Timestamp = talos.not_after.parse().unwrap();
    let left = not_after.as_second() - jiff::Timestamp::now().as_second();
    assert!(
        (3600..=2 * 3600).contains(&left),
        "{left}s left, {}",
        talos.not_after
    );
    // the simulator's kubeconfig authenticates with a token: no certificate expiry to read
    assert!(
        !obs.credentials
            .iter()
            .any(|c| c.credential.starts_with("kubeconfig")),
        "{:?}",
        obs.credentials
    );

    // disarmed: the next observation no longer shows it
    sim.talos.set_etcd_alarm(&cp, None).unwrap();
    sim.talos
        .set_etcd_healthy(&scenario_second_cp(&sim), false)
        .unwrap();
    let obs = observe(&sim).await;
    let etcd = obs.etcd.unwrap();
    assert!(etcd.alarms.is_empty());
    assert_eq!(
        etcd.members.iter().filter(|m| !m.healthy).count(),
        1,
        "{etcd:?}"
    );
}

fn scenario_second_cp(sim: &Sim) -> String {
    sim.names[1].clone()
}

/// Issue #38: every control-plane node's kube-apiserver is served at the node's own loopback
/// address and the port the `kubernetes` EndpointSlice publishes; each counts only the
/// requests it served (a request through one node's apiserver shows at that node only); an
/// apiserver whose node is rebooting leaves the slice, refuses connections and is reported
/// unreachable while the others still answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_control_plane_apiserver_lives_on_its_loopback_address_and_counts_its_own_requests() {
    let Some(bin) = crate::sim_cluster::require_kubectl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let scenario = Scenario::uniform(
        3,
        1,
        TalosVersion::parse(FROM).unwrap(),
        KubeVersion::parse("v1.31.4").unwrap(),
    );
    // a reboot lasts until the test completes it
    let sim = Sim::start_scenario_tuned(dir.path(), scenario, KubeSimConfig::default(), |t| {
        t.reboot = medea::sim::talos::RebootTiming::Manual
    })
    .await;
    let url = |n: &str| sim.kube.node_apiserver_url(n).unwrap();
    let port = sim.kube.apiserver_port();
    for (n, a) in [
        ("cp-1", "127.5.0.2"),
        ("cp-2", "127.5.0.3"),
        ("cp-3", "127.5.0.4"),
    ] {
        assert_eq!(url(n), format!("https://{a}:{port}"));
    }
    assert!(sim.kube.node_apiserver_url("w-1").is_none());
    let kube = KubeClient::from_kubeconfig(&kubeconfig(&sim), crate::sim_cluster::fast_kube())
        .await
        .unwrap();
    use medea::k8s::KubeApi;
    use medea::talos::TalosApi;
    let published = kube.published_apiservers().await.unwrap();
    assert_eq!(
        published,
        [
            ("127.5.0.2".to_string(), port),
            ("127.5.0.3".to_string(), port),
            ("127.5.0.4".to_string(), port)
        ]
    );
    // a deprecated list through cp-2's own apiserver (kubectl --server, the cluster's CA)
    let (ok, out, err) = kubectl(
        &bin,
        &sim,
        &home,
        &[
            "--server",
            &url("cp-2"),
            "get",
            "flowschemas.v1beta3.flowcontrol.apiserver.k8s.io",
        ],
    )
    .await;
    assert!(ok, "{out}{err}");
    let obs = observe(&sim).await;
    let sources: Vec<&str> = obs
        .deprecated_api_requests
        .iter()
        .filter(|r| r.resource == "flowschemas")
        .map(|r| r.source.as_str())
        .collect();
    assert_eq!(sources, [url("cp-2").as_str()], "{obs:?}");
    assert_eq!(
        obs.apiserver_metrics.len(),
        3,
        "{:?}",
        obs.apiserver_metrics
    );
    assert!(obs.apiserver_metrics.iter().all(|m| m.error.is_none()));

    // cp-3 reboots: its apiserver leaves the slice and refuses; cp-3 is still asked, at the
    // published port, and shows as unreachable
    let (talos, _) = TalosClient::from_talosconfig(
        &sim.creds.join(CLUSTER).join("talosconfig"),
        None,
        crate::sim_cluster::fast_talos(),
    )
    .unwrap();
    talos
        .reboot(&medea::talos::NodeTarget::parse("127.5.0.4").unwrap())
        .await
        .unwrap();
    let published = published_count(&kube, 2).await;
    assert_eq!(published.len(), 2, "{published:?}");
    let obs = observe(&sim).await;
    let cp3 = obs
        .apiserver_metrics
        .iter()
        .find(|m| m.endpoint == url("cp-3"))
        .unwrap_or_else(|| panic!("{:?}", obs.apiserver_metrics));
    assert!(
        cp3.error
            .as_deref()
            .is_some_and(|e| e.starts_with("not reachable")),
        "{cp3:?}"
    );
    assert!(
        obs.apiserver_metrics
            .iter()
            .filter(|m| m.endpoint != url("cp-3"))
            .all(|m| m.error.is_none()),
        "{:?}",
        obs.apiserver_metrics
    );
    sim.talos.complete_boot("cp-3").unwrap();
    // the node is back once its machine is ready (the simulator's timing), not at the boot
    assert_eq!(published_count(&kube, 3).await.len(), 3);
}

/// The apiservers the `kubernetes` EndpointSlice publishes, polled until there are `want` of
/// them: a rebooted node rejoins when its machine is ready, after the simulator's timing, so
/// the test waits on that progress rather than reading once. Gives up after a generous bound
/// and returns what it saw last.
async fn published_count(kube: &KubeClient, want: usize) -> Vec<(String, u16)> {
    use medea::k8s::KubeApi;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let published = kube.published_apiservers().await.unwrap();
        if published.len() == want || tokio::time::Instant::now() >= deadline {
            return published;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_of_an_enabled_alpha_resource_and_the_apiserver_start_time_are_observed() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim_on(dir.path(), "v1.36.3").await;
    let before = observe(&sim).await;
    assert!(before.removed_alpha_objects.is_empty(), "{before:?}");
    assert!(
        before.gather_errors.is_empty(),
        "{:?}",
        before.gather_errors
    );
    // the simulator's cluster has been running for a while: its apiserver too
    let now = jiff::Timestamp::now().as_second();
    let started = before.apiserver_metrics[0]
        .started
        .expect("process_start_time_seconds");
    assert!(now - started > 24 * 3600, "started {started}, now {now}");

    // scheduling.k8s.io/v1alpha2 turned on (--runtime-config) with objects; ClusterCIDRs
    // left 1.29, so a 1.36 apiserver does not serve them even when asked to
    sim.kube
        .enable_alpha(
            "workloads.v1alpha2.scheduling.k8s.io",
            &[("batch", "train-2"), ("batch", "train-1")],
        )
        .unwrap();
    sim.kube
        .enable_alpha("podgroups.v1alpha2.scheduling.k8s.io", &[])
        .unwrap();
    sim.kube
        .enable_alpha("clustercidrs.v1alpha1.networking.k8s.io", &[("", "pods")])
        .unwrap();
    assert!(
        sim.kube
            .enable_alpha("widgets.v1alpha1.example.com", &[])
            .is_err()
    );
    sim.kube.set_apiserver_started("cp-1", now - 60);
    let after = observe(&sim).await;
    assert_eq!(
        after.removed_alpha_objects,
        [medea::inventory::preflight::AlphaObjects {
            resource: "workloads.v1alpha2.scheduling.k8s.io".into(),
            count: 2,
            examples: vec!["batch/train-1".into(), "batch/train-2".into()],
        }]
    );
    assert_eq!(after.apiserver_metrics[0].started, Some(now - 60));
    assert!(after.gather_errors.is_empty(), "{:?}", after.gather_errors);
}
