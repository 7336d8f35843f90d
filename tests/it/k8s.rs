//! The Kubernetes adapter against the simulated kube-apiserver over real TLS, and real
//! kubectl against the simulator.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use medea::desired::model::DrainPolicy;
use medea::k8s::{
    ApplyOptions, ClientOptions, ControlPlaneComponent, DrainOptions, K8sError, KubeApi,
    KubeClient, Manifest, PodRef, RetryPolicy, SkipReason, check_control_plane,
};
use medea::sim::kube::{KubeFault, KubeSim, KubeSimConfig, Outage, scenario};
use medea::sim::node::{NodeFacts, NodeSource};
use serde_json::Value;

/// A NodeSource over a plain map (what the Talos simulator provides in the real thing).
#[derive(Default)]
pub struct MapNodes(Mutex<BTreeMap<String, NodeFacts>>);

impl NodeSource for MapNodes {
    fn nodes(&self) -> Vec<NodeFacts> {
        self.0.lock().unwrap().values().cloned().collect()
    }
}

impl MapNodes {
    fn insert(&self, facts: NodeFacts) {
        self.0.lock().unwrap().insert(facts.name.clone(), facts);
    }

    fn update(&self, name: &str, f: impl FnOnce(&mut NodeFacts)) {
        f(self.0.lock().unwrap().get_mut(name).expect("node exists"));
    }
}

fn images(version: &str) -> BTreeMap<String, String> {
    [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ]
    .into_iter()
    .map(|c| (c.to_string(), format!("registry.k8s.io/{c}:{version}")))
    .collect()
}

fn facts(name: &str, n: u8, control_plane: bool) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        address: format!("127.5.0.{n}"),
        control_plane,
        up: true,
        talos_version: "v1.13.9".into(),
        kubelet_version: "v1.34.1".into(),
        static_pod_images: if control_plane {
            images("v1.34.1")
        } else {
            BTreeMap::new()
        },
        crash_looping: Default::default(),
        extensions: Default::default(),
        static_pod_config_versions: Default::default(),
        static_pod_config_file_versions: Default::default(),
    }
}

/// One control-plane node and three workers.
fn four_nodes() -> Arc<MapNodes> {
    let nodes = MapNodes::default();
    nodes.insert(facts("cp-1", 2, true));
    for (i, w) in ["w-1", "w-2", "w-3"].into_iter().enumerate() {
        nodes.insert(facts(w, 10 + i as u8, false));
    }
    Arc::new(nodes)
}

fn json_of<T: serde::Serialize>(t: &T) -> Value {
    serde_json::to_value(t).unwrap()
}

/// `web`: 4 replicas (two land on w-1), PDB `web-pdb` minAvailable 3; DaemonSet kube-proxy.
fn workload() -> Vec<Value> {
    vec![
        json_of(&scenario::daemonset(
            "kube-system",
            "kube-proxy",
            "registry.k8s.io/kube-proxy:v1.34.1",
            Some(scenario::tolerate_everything()),
        )),
        json_of(&scenario::deployment("default", "web", 4, "nginx:1.29")),
        json_of(&scenario::pdb_min_available("default", "web-pdb", "web", 3)),
    ]
}

struct Fixture {
    sim: KubeSim,
    nodes: Arc<MapNodes>,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

async fn fixture(objects: Vec<Value>) -> Fixture {
    let nodes = four_nodes();
    let config = KubeSimConfig {
        objects,
        refresh_interval: Duration::from_millis(20),
        ..KubeSimConfig::default()
    };
    let sim = medea::sim::kube::start(config, nodes.clone())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("creds/sim/kubeconfig");
    sim.write_kubeconfig(&kubeconfig, "sim").unwrap();
    Fixture {
        sim,
        nodes,
        kubeconfig,
        _dir: dir,
    }
}

fn quick_retry() -> ClientOptions {
    ClientOptions {
        retry: RetryPolicy {
            attempts: 4,
            min_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(40),
        },
        ..ClientOptions::default()
    }
}

async fn client(f: &Fixture) -> KubeClient {
    KubeClient::from_kubeconfig(&f.kubeconfig, quick_retry())
        .await
        .unwrap()
}

fn quick_drain(timeout_ms: u64) -> DrainOptions {
    DrainOptions {
        timeout: Duration::from_millis(timeout_ms),
        min_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        poll_interval: Duration::from_millis(20),
        ..DrainOptions::default()
    }
}

fn web_on(sim: &KubeSim, node: &str) -> Vec<String> {
    sim.pods_on(node)
        .into_iter()
        .filter(|p| p.name.starts_with("web-") && !p.terminating)
        .map(|p| p.name)
        .collect()
}

// ------------------------------------------------------------------- kubectl

/// kubectl, or a clear skip (a failure under CI).
fn require_kubectl() -> Option<PathBuf> {
    crate::fixtures::tool_or_skip("kubectl")
}

async fn kubectl(
    bin: &Path,
    kubeconfig: &Path,
    home: &Path,
    args: &[&str],
) -> (bool, String, String) {
    let out = tokio::process::Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
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

// ------------------------------------------------------------------- adapter

#[tokio::test]
async fn cordon_and_uncordon_are_idempotent() {
    let f = fixture(workload()).await;
    let c = client(&f).await;
    c.cordon("w-1").await.unwrap();
    c.cordon("w-1").await.unwrap();
    assert_eq!(f.sim.unschedulable("w-1"), Some(true));
    assert!(c.node_readiness("w-1").await.unwrap().unschedulable);
    c.uncordon("w-1").await.unwrap();
    c.uncordon("w-1").await.unwrap();
    assert_eq!(f.sim.unschedulable("w-1"), Some(false));
    assert!(!c.node_readiness("w-1").await.unwrap().unschedulable);
    let err = c.cordon("nope").await.unwrap_err();
    assert!(
        matches!(&err, K8sError::NodeNotFound { node } if node == "nope"),
        "{err:?}"
    );
}

#[tokio::test]
async fn drain_without_pdb_pressure_evicts_and_pods_come_back_elsewhere() {
    let f = fixture(workload()).await;
    let c = client(&f).await;
    let before = web_on(&f.sim, "w-3");
    assert_eq!(before.len(), 1, "{:?}", f.sim.pods());
    let report = c.drain("w-3", &quick_drain(5_000)).await.unwrap();
    assert_eq!(
        report.evicted,
        vec![PodRef {
            namespace: "default".into(),
            name: before[0].clone()
        }]
    );
    assert_eq!(report.pdb_refusals, 0);
    assert!(
        matches!(report.skipped.as_slice(), [(p, SkipReason::DaemonSet)] if p.name.starts_with("kube-proxy-")),
        "{:?}",
        report.skipped
    );
    assert_eq!(
        f.sim.unschedulable("w-3"),
        Some(true),
        "drain cordons first"
    );
    assert!(web_on(&f.sim, "w-3").is_empty());
    let web: Vec<_> = f
        .sim
        .pods()
        .into_iter()
        .filter(|p| p.name.starts_with("web-"))
        .collect();
    assert_eq!(web.len(), 4);
    assert!(
        web.iter()
            .all(|p| p.ready && p.node.as_deref() != Some("w-3")),
        "{web:?}"
    );
    let counters = f.sim.counters();
    assert_eq!(counters.evictions, 1);
    assert_eq!(counters.pod_deletes, 0);
}

#[tokio::test]
async fn drain_under_pdb_pressure_waits_for_replacements_to_become_ready() {
    let f = fixture(workload()).await;
    let c = client(&f).await;
    assert_eq!(web_on(&f.sim, "w-1").len(), 2, "{:?}", f.sim.pods());
    // From now on a replacement takes a while to become Ready: the second eviction from
    // w-1 would leave web-pdb below minAvailable=3 until the first replacement is Ready.
    f.sim
        .set_pod_delays(Duration::from_millis(300), Duration::ZERO);
    let report = c.drain("w-1", &quick_drain(10_000)).await.unwrap();
    assert_eq!(report.evicted.len(), 2, "{report:?}");
    assert!(report.pdb_refusals >= 1, "{report:?}");
    let counters = f.sim.counters();
    assert!(counters.evictions_blocked >= 1, "{counters:?}");
    assert_eq!(counters.evictions, 2);
    assert_eq!(counters.pod_deletes, 0);
    assert!(web_on(&f.sim, "w-1").is_empty());
}

#[tokio::test]
async fn drain_timeout_names_the_pdb_and_deletes_nothing() {
    let f = fixture(workload()).await;
    let c = client(&f).await;
    f.sim.inject(KubeFault::PdbNeverAllows {
        namespace: "default".into(),
        pdb: "web-pdb".into(),
    });
    let before = web_on(&f.sim, "w-1");
    let err = c.drain("w-1", &quick_drain(400)).await.unwrap_err();
    match &err {
        K8sError::DrainBlocked {
            node,
            pod,
            pdb,
            blocked,
            evicted,
            ..
        } => {
            assert_eq!(node, "w-1");
            assert_eq!(pdb.as_deref(), Some("default/web-pdb"));
            assert!(before.contains(&pod.name), "{pod} not in {before:?}");
            assert_eq!((*blocked, *evicted), (2, 0));
        }
        other => panic!("expected DrainBlocked, got {other:?}"),
    }
    assert!(
        err.to_string()
            .contains("PodDisruptionBudget `default/web-pdb`"),
        "{err}"
    );
    let counters = f.sim.counters();
    assert_eq!(
        (counters.pod_deletes, counters.deletes, counters.evictions),
        (0, 0, 0)
    );
    assert!(counters.evictions_blocked >= 2, "{counters:?}");
    assert_eq!(
        web_on(&f.sim, "w-1"),
        before,
        "the blocked pods are untouched"
    );
}

#[tokio::test]
async fn drain_skips_daemonset_and_mirror_pods() {
    let f = fixture(workload()).await;
    let c = client(&f).await;
    let report = c.drain("cp-1", &quick_drain(5_000)).await.unwrap();
    assert!(report.evicted.is_empty(), "{report:?}");
    let mut mirror: Vec<&str> = report
        .skipped
        .iter()
        .filter(|(_, r)| *r == SkipReason::Mirror)
        .map(|(p, _)| p.name.as_str())
        .collect();
    mirror.sort();
    assert_eq!(
        mirror,
        [
            "kube-apiserver-cp-1",
            "kube-controller-manager-cp-1",
            "kube-scheduler-cp-1"
        ]
    );
    assert_eq!(
        report
            .skipped
            .iter()
            .filter(|(_, r)| *r == SkipReason::DaemonSet)
            .count(),
        1
    );
    assert_eq!(f.sim.pods_on("cp-1").len(), 4, "nothing left the node");
    assert_eq!(f.sim.counters().evictions, 0);
}

#[tokio::test]
async fn local_storage_and_unmanaged_pods_refuse_the_drain_until_allowed() {
    let f = fixture(workload()).await;
    let c = client(&f).await;
    f.sim
        .create(json_of(&scenario::bare_pod(
            "default", "scratch", "w-2", true,
        )))
        .unwrap();
    let scratch = PodRef {
        namespace: "default".into(),
        name: "scratch".into(),
    };
    let err = c.drain("w-2", &quick_drain(2_000)).await.unwrap_err();
    assert!(
        matches!(&err, K8sError::DrainLocalStorage { pods, .. } if *pods == vec![scratch.clone()]),
        "{err:?}"
    );
    assert_eq!(
        f.sim.counters().evictions,
        0,
        "refused before evicting anything"
    );
    let opt_in = DrainOptions {
        policy: DrainPolicy {
            delete_empty_dir_data: true,
            ..DrainPolicy::legacy()
        },
        ..quick_drain(2_000)
    };
    let err = c.drain("w-2", &opt_in).await.unwrap_err();
    assert!(
        matches!(&err, K8sError::DrainUnmanaged { pods, .. } if *pods == vec![scratch.clone()]),
        "{err:?}"
    );
    let all_in = DrainOptions {
        policy: DrainPolicy {
            evict_unmanaged_pods: true,
            ..opt_in.policy.clone()
        },
        ..opt_in
    };
    let report = c.drain("w-2", &all_in).await.unwrap();
    assert!(report.evicted.contains(&scratch), "{report:?}");
    assert_eq!(f.sim.counters().pod_deletes, 0);
}

/// Issue 50 item 3: the adapter types a drain the pool's policy refuses (the halt and the
/// rehearsal read the refusal from there, never from the error's text).
#[tokio::test]
async fn the_adapter_types_a_refused_drain() {
    use medea::rollout::ports::{KubePort, PortError, Refusal};
    let f = fixture(workload()).await;
    let a = medea::k8s::adapter::KubeAdapter::new(client(&f).await);
    f.sim
        .create(json_of(&scenario::bare_pod(
            "default", "scratch", "w-2", true,
        )))
        .unwrap();
    let timeout = Duration::from_secs(2);
    let err = a
        .drain("w-2", timeout, &DrainPolicy::legacy())
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            PortError::Refused {
                refusal: Refusal::LocalStorage,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.refusal(), Some(Refusal::LocalStorage));
    assert!(!err.is_transient(), "a refusal halts");
    let opt_in = DrainPolicy {
        delete_empty_dir_data: true,
        ..DrainPolicy::legacy()
    };
    let err = a.drain("w-2", timeout, &opt_in).await.unwrap_err();
    assert_eq!(err.refusal(), Some(Refusal::UnmanagedPods), "{err:?}");
    assert_eq!(
        f.sim.counters().evictions,
        0,
        "refused before evicting anything"
    );
}

#[tokio::test]
async fn readiness_follows_the_talos_side() {
    let f = fixture(workload()).await;
    let c = client(&f).await;
    let r = c.node_readiness("w-1").await.unwrap();
    assert!(
        r.ready && !r.unschedulable && r.not_ready_reason.is_none(),
        "{r:?}"
    );
    assert_eq!(r.kubelet_version.to_string(), "v1.34.1");

    f.nodes.update("w-1", |n| n.up = false);
    let r = c.node_readiness("w-1").await.unwrap();
    assert!(!r.ready);
    assert!(
        r.not_ready_reason
            .as_deref()
            .is_some_and(|m| m.contains("NodeStatusUnknown")),
        "{r:?}"
    );

    f.nodes.update("w-1", |n| {
        n.up = true;
        n.kubelet_version = "v1.35.0".into();
    });
    let r = c.node_readiness("w-1").await.unwrap();
    assert!(r.ready, "{r:?}");
    assert_eq!(r.kubelet_version.to_string(), "v1.35.0");
    assert!(matches!(
        c.node_readiness("nope").await,
        Err(K8sError::NodeNotFound { .. })
    ));
}

#[tokio::test]
async fn control_plane_static_pods_reflect_the_machine_config() {
    let f = fixture(workload()).await;
    let c = client(&f).await;
    let pods = c.control_plane_pods("cp-1").await.unwrap();
    assert_eq!(pods.len(), 3, "{pods:?}");
    assert!(pods.iter().all(|p| p.running && p.ready), "{pods:?}");
    assert_eq!(pods[0].component, ControlPlaneComponent::ApiServer);
    assert_eq!(pods[0].image, "registry.k8s.io/kube-apiserver:v1.34.1");
    let want = vec![(
        ControlPlaneComponent::ApiServer,
        "registry.k8s.io/kube-apiserver:v1.35.0".to_string(),
    )];
    let problems = check_control_plane(&pods, &want);
    assert!(
        matches!(
            problems.as_slice(),
            [medea::k8s::ControlPlaneProblem::WrongImage { .. }]
        ),
        "{problems:?}"
    );

    // Talos applies the new apiserver image: the kubelet replaces the static pod.
    f.nodes.update("cp-1", |n| {
        n.static_pod_images.insert(
            "kube-apiserver".into(),
            "registry.k8s.io/kube-apiserver:v1.35.0".into(),
        );
    });
    let pods = c.control_plane_pods("cp-1").await.unwrap();
    assert!(check_control_plane(&pods, &want).is_empty(), "{pods:?}");

    // A worker has none.
    let worker = c.control_plane_pods("w-1").await.unwrap();
    assert_eq!(check_control_plane(&worker, &[]).len(), 3);

    // While the node reboots its static pods are not Ready.
    f.nodes.update("cp-1", |n| n.up = false);
    let pods = c.control_plane_pods("cp-1").await.unwrap();
    assert!(pods.iter().all(|p| !p.ready), "{pods:?}");
}

#[tokio::test]
async fn node_never_ready_fault_keeps_the_node_not_ready() {
    let f = fixture(workload()).await;
    let c = client(&f).await;
    f.sim
        .inject(KubeFault::NodeNeverReady { node: "w-2".into() });
    f.nodes.update("w-2", |n| n.up = true);
    let r = c.node_readiness("w-2").await.unwrap();
    assert!(!r.ready);
    assert!(
        r.not_ready_reason
            .as_deref()
            .is_some_and(|m| m.contains("KubeletNotReady")),
        "{r:?}"
    );
    f.sim.clear_faults();
    assert!(c.node_readiness("w-2").await.unwrap().ready);
}

#[tokio::test]
async fn apiserver_unavailable_is_retried_then_reported() {
    let f = fixture(workload()).await;
    let c = client(&f).await;
    f.sim.inject(KubeFault::ApiUnavailable(Outage::Requests(2)));
    assert!(c.node_readiness("w-1").await.unwrap().ready);
    assert_eq!(f.sim.counters().unavailable, 2);

    f.sim
        .inject(KubeFault::ApiUnavailable(Outage::For(Duration::from_secs(
            600,
        ))));
    let err = c.node_readiness("w-1").await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(
        matches!(&err, K8sError::Api { op: "get node", .. }),
        "{err:?}"
    );
    assert_eq!(
        f.sim.counters().unavailable,
        2 + 4,
        "one try plus three retries"
    );

    // A drain rides out a short outage.
    f.sim.clear_faults();
    f.sim.inject(KubeFault::ApiUnavailable(Outage::Requests(3)));
    let report = c.drain("w-3", &quick_drain(5_000)).await.unwrap();
    assert_eq!(report.evicted.len(), 1);
}

#[tokio::test]
async fn server_side_apply_creates_updates_and_detects_conflicts() {
    let f = fixture(Vec::new()).await;
    let c = client(&f).await;
    let manifests = Manifest::parse_yaml(
        "apiVersion: v1
kind: ConfigMap
metadata:
  name: medea-test
  namespace: kube-system
data:
  a: \"1\"
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: api
spec:
  replicas: 2
  selector:
    matchLabels: {app: api}
  template:
    metadata:
      labels: {app: api}
    spec:
      containers:
      - name: api
        image: example/api:v1
",
    )
    .unwrap();
    let opts = ApplyOptions::default();
    let first = c.apply(&manifests, &opts).await.unwrap();
    assert_eq!(first.len(), 2);
    assert_eq!(
        first[1].namespace.as_deref(),
        Some("default"),
        "namespaced objects default to the context namespace"
    );
    assert_eq!(first[1].generation, Some(1));
    let api_pods: Vec<_> = f
        .sim
        .pods()
        .into_iter()
        .filter(|p| p.name.starts_with("api-"))
        .collect();
    assert_eq!(
        api_pods.len(),
        2,
        "the applied Deployment runs: {api_pods:?}"
    );
    assert!(
        api_pods
            .iter()
            .all(|p| p.image == "example/api:v1" && p.ready)
    );

    let again = c.apply(&manifests, &opts).await.unwrap();
    assert_eq!(
        again[0].resource_version, first[0].resource_version,
        "a no-op apply changes nothing"
    );
    assert_eq!(f.sim.counters().applies, 4);

    // The object carries medea's field ownership.
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(
        kube::Client::try_from(medea::k8s::kubeconfig::load(&f.kubeconfig).await.unwrap()).unwrap(),
        "kube-system",
    );
    let cm = cms.get("medea-test").await.unwrap();
    let managers: Vec<String> = cm
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, ["medea"]);

    // Another manager changing medea's field conflicts, unless forced.
    let talos = ApplyOptions {
        field_manager: "talos".into(),
        ..ApplyOptions::default()
    };
    let changed = Manifest::parse_yaml("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: medea-test, namespace: kube-system}\ndata: {a: \"2\"}\n").unwrap();
    let err = c.apply(&changed, &talos).await.unwrap_err();
    assert!(
        matches!(&err, K8sError::ApplyConflict { object, .. } if object == "v1 ConfigMap kube-system/medea-test"),
        "{err:?}"
    );
    let forced = ApplyOptions {
        force_conflicts: true,
        ..talos
    };
    c.apply(&changed, &forced).await.unwrap();
    assert_eq!(cms.get("medea-test").await.unwrap().data.unwrap()["a"], "2");

    // A kind the cluster does not serve is named (the simulator serves batch/v1 Jobs since
    // issue #35; it serves no networking.k8s.io kind).
    let ingress = Manifest::parse_yaml(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: j, namespace: default}\n",
    )
    .unwrap();
    let err = c.apply(&ingress, &opts).await.unwrap_err();
    assert!(
        matches!(&err, K8sError::UnknownKind { kind, .. } if kind == "Ingress"),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_wrong_token_is_refused_with_401() {
    let f = fixture(workload()).await;
    let text = std::fs::read_to_string(&f.kubeconfig).unwrap();
    let bad = f.kubeconfig.with_file_name("bad-kubeconfig");
    std::fs::write(&bad, text.replace(f.sim.token().expose(), "not-the-token")).unwrap();
    let c = KubeClient::from_kubeconfig(&bad, quick_retry())
        .await
        .unwrap();
    let err = c.node_readiness("w-1").await.unwrap_err();
    assert!(
        matches!(&err, K8sError::Api { err, .. } if matches!(&**err, kube::Error::Api(s) if s.code == 401 && s.reason == "Unauthorized")),
        "{err:?}"
    );
    assert!(!err.is_transient());
    assert!(f.sim.counters().unauthorized >= 1);
    assert!(
        !format!("{:?}", f.sim).contains(f.sim.token().expose()),
        "the handle's Debug hides the token"
    );
}

#[tokio::test]
async fn the_sim_kubeconfig_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture(Vec::new()).await;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&f.kubeconfig), 0o600);
    assert_eq!(mode(f.kubeconfig.parent().unwrap()), 0o700);
}

#[tokio::test]
async fn nodes_can_be_watched_until_ready() {
    use kube::runtime::wait::await_condition;
    let f = fixture(Vec::new()).await;
    f.nodes.update("w-1", |n| n.up = false);
    let config = medea::k8s::kubeconfig::load(&f.kubeconfig).await.unwrap();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
        kube::Api::all(kube::Client::try_from(config).unwrap());
    let ready = |n: Option<&k8s_openapi::api::core::v1::Node>| {
        n.and_then(|n| n.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let waiting = tokio::spawn(await_condition(nodes.clone(), "w-1", ready));
    // The watch is open before the node comes back; the server pushes the change.
    let not_ready = nodes.get("w-1").await.unwrap();
    assert!(!ready(Some(&not_ready)));
    f.nodes.update("w-1", |n| n.up = true);
    let node = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the watch delivered the Ready node")
        .unwrap()
        .unwrap();
    assert!(ready(node.as_ref()));
}

// ------------------------------------------------------------------- kubectl

#[tokio::test]
async fn kubectl_get_cordon_and_drain_behave_like_a_real_cluster() {
    let Some(bin) = require_kubectl() else { return };
    let f = fixture(workload()).await;
    let home = tempfile::tempdir().unwrap();
    let run = |args: &'static [&'static str]| {
        let (bin, kc, home) = (bin.clone(), f.kubeconfig.clone(), home.path().to_path_buf());
        async move { kubectl(&bin, &kc, &home, args).await }
    };

    let (ok, out, err) = run(&["get", "nodes"]).await;
    assert!(ok, "{err}");
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["NAME", "STATUS", "ROLES", "AGE", "VERSION"],
        "{out}"
    );
    assert_eq!(lines[1][..3], ["cp-1", "Ready", "control-plane"], "{out}");
    assert_eq!(lines[2][..3], ["w-1", "Ready", "<none>"], "{out}");
    assert_eq!(lines[2][4], "v1.34.1", "{out}");
    assert_eq!(lines.len(), 5, "{out}");

    let (ok, out, err) = run(&["cordon", "w-1"]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "node/w-1 cordoned");
    assert_eq!(f.sim.unschedulable("w-1"), Some(true));
    let (_, out, _) = run(&["get", "node", "w-1"]).await;
    assert!(out.contains("Ready,SchedulingDisabled"), "{out}");
    let (ok, out, _) = run(&["cordon", "w-1"]).await;
    assert!(ok);
    assert_eq!(out.trim(), "node/w-1 already cordoned");

    // Two web pods on w-1 and minAvailable=3 of 4: kubectl's concurrent evictions get one
    // 429, which kubectl retries after 5 s, once the replacement is Ready.
    f.sim.set_pod_delays(Duration::from_secs(1), Duration::ZERO);
    let (ok, out, err) = run(&["drain", "--ignore-daemonsets", "--timeout=60s", "w-1"]).await;
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("node/w-1 already cordoned"), "{out}");
    // kubectl 1.20 (Debian bookworm's kubernetes-client) ends with "node/w-1 evicted".
    assert!(
        out.contains("node/w-1 drained") || out.contains("node/w-1 evicted"),
        "{out}"
    );
    let evicted_pods = out
        .lines()
        .filter(|l| l.starts_with("pod/web-") && l.ends_with(" evicted"))
        .count();
    assert_eq!(evicted_pods, 2, "{out}");
    assert!(
        err.to_lowercase()
            .contains("warning: ignoring daemonset-managed pods: kube-system/kube-proxy-"),
        "{err}"
    );
    assert!(
        err.contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{err}"
    );
    assert!(err.contains("will retry after 5s"), "{err}");
    let counters = f.sim.counters();
    assert_eq!(
        counters.pod_deletes, 0,
        "kubectl drain evicts; it never deletes"
    );
    assert!(counters.evictions_blocked >= 1);
    assert!(web_on(&f.sim, "w-1").is_empty());

    let (ok, out, err) = run(&["uncordon", "w-1"]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "node/w-1 uncordoned");
    assert_eq!(f.sim.unschedulable("w-1"), Some(false));

    let (ok, out, err) = run(&["get", "pods", "-A"]).await;
    assert!(ok, "{err}");
    assert!(
        out.lines()
            .next()
            .is_some_and(|h| h.split_whitespace().collect::<Vec<_>>()
                == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]),
        "{out}"
    );
    assert!(out.contains("kube-apiserver-cp-1"), "{out}");
}

/// `kubectl apply -f` with kubectl's default validation (`--validate=strict`): kubectl reads the
/// OpenAPI v3 documents, finds `fieldValidation` on each kind's PATCH operation and lets the
/// server validate strictly; a second apply patches with a strategic merge patch computed from
/// the served schema and the last-applied annotation (issue 20, item 9).
#[tokio::test]
async fn kubectl_apply_creates_patches_and_validates_against_the_served_openapi() {
    let Some(bin) = require_kubectl() else { return };
    let f = fixture(workload()).await;
    let home = tempfile::tempdir().unwrap();
    let run = |args: Vec<String>| {
        let (bin, kc, home) = (bin.clone(), f.kubeconfig.clone(), home.path().to_path_buf());
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kubectl(&bin, &kc, &home, &args).await
        }
    };
    let original = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kubectl-apply/workloads.yaml"
    ))
    .unwrap();
    let write = |name: &str, text: &str| {
        let p = home.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    };
    let apply = |file: String| run(vec!["apply".into(), "-f".into(), file]);

    let (ok, out, err) = apply(write("v1.yaml", &original)).await;
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "configmap/app-config created",
            "deployment.apps/metrics-server created",
            "daemonset.apps/node-agent created",
            "statefulset.apps/db created",
            "poddisruptionbudget.policy/db-pdb created",
        ],
        "{err}"
    );
    assert!(err.is_empty(), "no warnings: {err}");

    // a second apply with changes patches each object; the changes are visible
    let changed = original
        .replace("mode: \"blue\"", "mode: \"green\"")
        .replace("metrics-server:v0.8.0", "metrics-server:v0.8.1")
        .replace(
            "replicas: 1\n  selector:\n    matchLabels: {app: db}",
            "replicas: 3\n  selector:\n    matchLabels: {app: db}",
        )
        .replace("minAvailable: 1", "minAvailable: 2");
    let (ok, out, err) = apply(write("v2.yaml", &changed)).await;
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "configmap/app-config configured",
            "deployment.apps/metrics-server configured",
            "daemonset.apps/node-agent unchanged",
            "statefulset.apps/db configured",
            "poddisruptionbudget.policy/db-pdb configured",
        ],
        "{err}"
    );
    assert!(err.is_empty(), "no warnings: {err}");
    let get = |what: &str, path: &str| {
        run(vec![
            "get".into(),
            what.into(),
            "-n".into(),
            "default".into(),
            "-o".into(),
            format!("jsonpath={path}"),
        ])
    };
    let (_, out, _) = get("configmap/app-config", "{.data.mode}").await;
    assert_eq!(out, "green");
    let (_, out, _) = get(
        "deployment/metrics-server",
        "{.spec.template.spec.containers[0].image} {.spec.template.spec.containers[0].args[0]} {.spec.template.spec.volumes[0].name}",
    )
    .await;
    assert_eq!(
        out, "registry.k8s.io/metrics-server/metrics-server:v0.8.1 --secure-port=10250 tmp",
        "the rest of the pod template is kept"
    );
    let (_, out, _) = get("statefulset/db", "{.spec.replicas}").await;
    assert_eq!(out, "3");
    let (_, out, _) = get("pdb/db-pdb", "{.spec.minAvailable}").await;
    assert_eq!(out, "2");
    let (_, out, _) = get(
        "configmap/app-config",
        "{.metadata.annotations.kubectl\\.kubernetes\\.io/last-applied-configuration}",
    )
    .await;
    assert!(
        out.contains("\"mode\":\"green\""),
        "the last-applied annotation follows: {out}"
    );
    let (ok, out, err) = apply(write("v2.yaml", &changed)).await;
    assert!(ok, "{err}");
    assert!(out.lines().all(|l| l.ends_with(" unchanged")), "{out}");

    // an unknown field is refused by the validation kubectl asks for, and nothing is written
    let typo = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: typo, namespace: default}\nspec:\n  replicass: 2\n  selector: {matchLabels: {app: t}}\n  template:\n    metadata: {labels: {app: t}}\n    spec:\n      containers: [{name: t, imagee: registry.example/t:1}]\n";
    let (ok, out, err) = apply(write("typo.yaml", typo)).await;
    assert!(!ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains(r#"strict decoding error: unknown field "spec.replicass", unknown field "spec.template.spec.containers[0].imagee""#),
        "{err}"
    );
    let (ok, _, err) = run(vec![
        "get".into(),
        "deployment/typo".into(),
        "-n".into(),
        "default".into(),
    ])
    .await;
    assert!(!ok && err.contains("NotFound"), "{err}");
    // with validation off kubectl sends it as is and the server only warns
    let (ok, out, err) = run(vec![
        "apply".into(),
        "--validate=false".into(),
        "-f".into(),
        write("typo.yaml", typo),
    ])
    .await;
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("deployment.apps/typo created"), "{out}");
}
