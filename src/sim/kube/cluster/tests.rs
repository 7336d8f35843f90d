//! Tests of the simulated cluster: convergence, scheduling, eviction budgets, DaemonSet rollouts.

use std::sync::Mutex;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::super::resources::{DAEMONSETS, NODES, PDBS};
use super::super::scenario;
use super::disruption::PdbCalc;
use super::*;

struct Nodes(Mutex<Vec<NodeFacts>>);

impl NodeSource for Nodes {
    fn nodes(&self) -> Vec<NodeFacts> {
        self.0.lock().unwrap().clone()
    }
}

fn node(name: &str, cp: bool) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        address: format!("10.0.0.{}", name.len()),
        control_plane: cp,
        up: true,
        talos_version: "v1.13.9".into(),
        kubelet_version: "v1.34.1".into(),
        static_pod_images: if cp {
            [(
                "kube-apiserver".to_string(),
                "registry.k8s.io/kube-apiserver:v1.34.1".to_string(),
            )]
            .into()
        } else {
            BTreeMap::new()
        },
        crash_looping: Default::default(),
        extensions: Default::default(),
        static_pod_config_versions: Default::default(),
        static_pod_config_file_versions: Default::default(),
    }
}

fn cluster(objects: Vec<Value>, start: Duration) -> (KubeSide, Arc<Nodes>) {
    let nodes = Arc::new(Nodes(Mutex::new(vec![
        node("cp-1", true),
        node("w-1", false),
        node("w-2", false),
        node("w-3", false),
    ])));
    let mut c = KubeSide::new(
        nodes.clone(),
        Timing {
            start,
            termination: Duration::ZERO,
            crd_establish: Duration::ZERO,
        },
        42,
    );
    let wall = jiff::Timestamp::now();
    for o in objects {
        let rt = resources::by_kind(
            o["apiVersion"].as_str().unwrap(),
            o["kind"].as_str().unwrap(),
        )
        .unwrap();
        c.store.create(rt, o, wall).unwrap();
    }
    (c, nodes)
}

fn json<T: serde::Serialize>(t: &T) -> Value {
    serde_json::to_value(t).unwrap()
}

fn web_pods(c: &KubeSide) -> Vec<super::super::SimPod> {
    c.pods()
        .into_iter()
        .filter(|p| p.name.starts_with("web-"))
        .collect()
}

#[test]
fn a_pass_that_changed_nothing_is_skipped_until_an_input_changes() {
    struct Hashed(Mutex<Vec<NodeFacts>>);
    impl NodeSource for Hashed {
        fn nodes(&self) -> Vec<NodeFacts> {
            self.0.lock().unwrap().clone()
        }
        fn fingerprint(&self) -> Option<u64> {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            self.0.lock().unwrap().hash(&mut h);
            Some(h.finish())
        }
    }
    let src = Arc::new(Hashed(Mutex::new(vec![
        node("cp-1", true),
        node("w-1", false),
        node("w-2", false),
    ])));
    let start = Duration::from_secs(5);
    let mut c = KubeSide::new(
        src.clone(),
        Timing {
            start,
            termination: Duration::ZERO,
            crd_establish: Duration::ZERO,
        },
        42,
    );
    let wall = jiff::Timestamp::now();
    for o in scenario::default_scenario() {
        let rt = resources::by_kind(
            o["apiVersion"].as_str().unwrap(),
            o["kind"].as_str().unwrap(),
        )
        .unwrap();
        c.store.create(rt, o, wall).unwrap();
    }
    let t0 = Instant::now();
    for _ in 0..4 {
        c.reconcile(t0, wall);
    }
    let passes = c.counters.reconciles;
    let rv = c.store.resource_version();
    c.reconcile(t0, wall);
    c.reconcile(t0 + start / 2, wall);
    assert_eq!(c.counters.reconciles, passes, "nothing changed: no pass");
    assert_eq!(c.store.resource_version(), rv);
    assert!(web_pods(&c).iter().all(|p| !p.ready), "pods still starting");

    // a pod start falls due
    c.reconcile(t0 + start, wall);
    assert!(c.counters.reconciles > passes);
    assert!(web_pods(&c).iter().all(|p| p.ready), "{:#?}", web_pods(&c));

    // the node source changes
    let ready = |c: &KubeSide, n: &str| {
        c.store.get(&NODES, "", n).unwrap()["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap()["status"]
            .clone()
    };
    c.reconcile(t0 + start, wall);
    let passes = c.counters.reconciles;
    c.reconcile(t0 + start, wall);
    assert_eq!(c.counters.reconciles, passes);
    src.0.lock().unwrap()[1].up = false;
    c.reconcile(t0 + start, wall);
    assert_eq!(ready(&c, "w-1"), "Unknown");

    // a fault is injected (no store write)
    c.reconcile(t0 + start, wall);
    c.inject(KubeFault::NodeNeverReady { node: "w-2".into() }, t0);
    c.reconcile(t0 + start, wall);
    assert_eq!(ready(&c, "w-2"), "False");

    // a client's write
    c.reconcile(t0 + start, wall);
    let passes = c.counters.reconciles;
    c.store.delete(&PODS, "kube-system", "kube-apiserver-cp-1");
    c.reconcile(t0 + start, wall);
    assert!(c.counters.reconciles > passes);
    assert!(
        c.store
            .get(&PODS, "kube-system", "kube-apiserver-cp-1")
            .is_some(),
        "the kubelet recreates its mirror pod"
    );
}

#[test]
fn the_default_scenario_converges_with_pods_spread_over_workers() {
    let (mut c, _) = cluster(scenario::default_scenario(), Duration::ZERO);
    let t0 = Instant::now();
    c.reconcile(t0, jiff::Timestamp::now());
    let pods = c.pods();
    assert!(
        pods.iter().all(|p| p.ready && p.phase == "Running"),
        "{pods:#?}"
    );
    let web = web_pods(&c);
    let mut nodes: Vec<_> = web.iter().map(|p| p.node.clone().unwrap()).collect();
    nodes.sort();
    assert_eq!(
        nodes,
        ["w-1", "w-2", "w-3"],
        "spread, and never on the tainted control plane"
    );
    let proxies = pods
        .iter()
        .filter(|p| p.name.starts_with("kube-proxy-"))
        .count();
    assert_eq!(
        proxies, 4,
        "a DaemonSet that tolerates everything runs on every node"
    );
    assert!(
        pods.iter()
            .any(|p| p.mirror && p.name == "kube-apiserver-cp-1")
    );
    // A second pass changes nothing.
    let rv = c.store.resource_version();
    c.reconcile(t0, jiff::Timestamp::now());
    assert_eq!(c.store.resource_version(), rv);
}

#[test]
fn evictions_respect_the_budget_until_replacements_are_ready() {
    let objects = vec![
        json(&scenario::deployment("default", "web", 3, "nginx")),
        json(&scenario::pdb_min_available("default", "web-pdb", "web", 2)),
    ];
    let (mut c, _) = cluster(objects, Duration::ZERO);
    let t0 = Instant::now();
    let wall = jiff::Timestamp::now();
    c.reconcile(t0, wall);
    c.set_timing(Timing {
        start: Duration::from_secs(5),
        termination: Duration::ZERO,
        crd_establish: Duration::ZERO,
    });
    let web = web_pods(&c);
    c.evict("default", &web[0].name, t0, wall).unwrap();
    c.reconcile(t0, wall);
    let refused = c.evict("default", &web[1].name, t0, wall).unwrap_err();
    assert_eq!(refused.code, 429);
    assert_eq!(
        refused.to_status()["details"]["causes"][0]["message"],
        "The disruption budget web-pdb needs 2 healthy pods and has 2 currently"
    );
    // The replacement exists at once (Pending), and is Ready after the start delay.
    assert_eq!(web_pods(&c).len(), 3);
    assert_eq!(web_pods(&c).iter().filter(|p| p.ready).count(), 2);
    c.reconcile(t0 + Duration::from_secs(5), wall);
    assert_eq!(web_pods(&c).iter().filter(|p| p.ready).count(), 3);
    c.evict("default", &web[1].name, t0 + Duration::from_secs(5), wall)
        .unwrap();
    assert_eq!((c.counters.evictions, c.counters.evictions_blocked), (2, 1));
}

#[test]
fn max_unavailable_percentages_scale_with_the_controller() {
    let objects = vec![
        json(&scenario::deployment("default", "web", 4, "nginx")),
        json(&scenario::pdb_max_unavailable(
            "default",
            "web-pdb",
            "web",
            IntOrString::String("25%".into()),
        )),
    ];
    let (mut c, _) = cluster(objects, Duration::ZERO);
    c.reconcile(Instant::now(), jiff::Timestamp::now());
    let pdb: PodDisruptionBudget =
        from_value(c.store.get(&PDBS, "default", "web-pdb").unwrap()).unwrap();
    let calc = c.pdb_calc(&pdb, "default");
    assert_eq!(
        calc,
        PdbCalc {
            expected: 4,
            current_healthy: 4,
            desired_healthy: 3,
            disruptions_allowed: 1,
            sync_failed: None,
        }
    );
    let status = pdb.status.unwrap();
    assert_eq!((status.disruptions_allowed, status.expected_pods), (1, 4));
}

/// kubernetes `pkg/controller/disruption/disruption.go`: a percentage or `maxUnavailable`
/// needs the controllers' scale, `getExpectedScale` fails on a pod without a controller
/// ("found no controller ref for pod"), and `failSafe` writes `disruptionsAllowed: 0` with a
/// `SyncFailed` condition; an int `minAvailable` counts the pods and needs no controller.
#[test]
fn a_budget_needing_a_scale_over_a_bare_pod_fails_safe_like_the_disruption_controller() {
    let bare = |name: &str| {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "solo"}},
            "spec": {"nodeName": "w-1", "containers": [{"name": "c", "image": "nginx"}]},
        })
    };
    for (budget, sync_failed) in [
        (
            scenario::pdb_max_unavailable("default", "solo-pdb", "solo", IntOrString::Int(1)),
            true,
        ),
        (
            scenario::pdb_max_unavailable(
                "default",
                "solo-pdb",
                "solo",
                IntOrString::String("50%".into()),
            ),
            true,
        ),
        (
            scenario::pdb_min_available("default", "solo-pdb", "solo", 1),
            false,
        ),
    ] {
        let (mut c, _) = cluster(
            vec![bare("solo-a"), bare("solo-b"), json(&budget)],
            Duration::ZERO,
        );
        let t0 = Instant::now();
        let wall = jiff::Timestamp::now();
        c.reconcile(t0, wall);
        c.reconcile(t0, wall);
        let status = c.store.get(&PDBS, "default", "solo-pdb").unwrap()["status"].clone();
        let condition = &status["conditions"][0];
        let evicted = c.evict("default", "solo-a", t0, wall);
        if sync_failed {
            assert_eq!(status["disruptionsAllowed"], 0, "{status}");
            assert_eq!(status["expectedPods"], 0, "{status}");
            assert_eq!(condition["reason"], "SyncFailed", "{status}");
            assert_eq!(
                condition["message"], "found no controller ref for pod \"solo-a\"",
                "{status}"
            );
            assert_eq!(evicted.unwrap_err().code, 429);
        } else {
            assert_eq!(status["disruptionsAllowed"], 1, "{status}");
            assert_eq!(status["expectedPods"], 2, "{status}");
            assert_eq!(condition["reason"], "SufficientPods", "{status}");
            evicted.unwrap();
        }
    }
}

#[test]
fn two_budgets_over_one_pod_are_an_error_like_the_apiserver() {
    let objects = vec![
        json(&scenario::deployment("default", "web", 2, "nginx")),
        json(&scenario::pdb_min_available("default", "a", "web", 1)),
        json(&scenario::pdb_min_available("default", "b", "web", 1)),
    ];
    let (mut c, _) = cluster(objects, Duration::ZERO);
    let t0 = Instant::now();
    c.reconcile(t0, jiff::Timestamp::now());
    let name = web_pods(&c)[0].name.clone();
    let err = c
        .evict("default", &name, t0, jiff::Timestamp::now())
        .unwrap_err();
    assert_eq!(err.code, 500);
    assert!(
        err.message.contains("more than one PodDisruptionBudget"),
        "{err:?}"
    );
}

#[test]
fn a_rebooting_node_is_not_ready_and_keeps_its_daemonset_pods() {
    let objects = vec![json(&scenario::daemonset(
        "kube-system",
        "agent",
        "agent:1",
        None,
    ))];
    let (mut c, nodes) = cluster(objects, Duration::ZERO);
    let t0 = Instant::now();
    c.reconcile(t0, jiff::Timestamp::now());
    let agents_before: Vec<_> = c
        .pods()
        .into_iter()
        .filter(|p| p.name.starts_with("agent-"))
        .collect();
    assert_eq!(
        agents_before.len(),
        3,
        "no toleration for the control-plane taint: workers only"
    );
    nodes.0.lock().unwrap()[1].up = false;
    c.reconcile(t0, jiff::Timestamp::now());
    let w1 = c.store.get(&NODES, "", "w-1").unwrap();
    let ready = w1["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "Unknown");
    let taints: Vec<&str> = w1["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["key"].as_str().unwrap())
        .collect();
    assert!(taints.contains(&TAINT_UNREACHABLE), "{taints:?}");
    let agents: Vec<_> = c
        .pods()
        .into_iter()
        .filter(|p| p.name.starts_with("agent-"))
        .collect();
    assert_eq!(
        agents.iter().map(|p| &p.name).collect::<Vec<_>>(),
        agents_before.iter().map(|p| &p.name).collect::<Vec<_>>(),
        "DaemonSet pods stay on an unreachable node"
    );
    assert!(
        agents
            .iter()
            .any(|p| p.node.as_deref() == Some("w-1") && !p.ready)
    );
    // Boot ID changes when it comes back.
    let boot_before = w1["status"]["nodeInfo"]["bootID"].clone();
    nodes.0.lock().unwrap()[1].up = true;
    c.reconcile(t0, jiff::Timestamp::now());
    let w1 = c.store.get(&NODES, "", "w-1").unwrap();
    assert_ne!(w1["status"]["nodeInfo"]["bootID"], boot_before);
}

#[test]
fn a_new_daemonset_template_replaces_its_pods() {
    let ds = json(&scenario::daemonset(
        "kube-system",
        "agent",
        "agent:1",
        None,
    ));
    let (mut c, _) = cluster(vec![ds.clone()], Duration::ZERO);
    let t0 = Instant::now();
    let wall = jiff::Timestamp::now();
    c.reconcile(t0, wall);
    let mut next = c
        .store
        .get(&DAEMONSETS, "kube-system", "agent")
        .unwrap()
        .clone();
    next["spec"]["template"]["spec"]["containers"][0]["image"] = json!("agent:2");
    c.store.put(&DAEMONSETS, next, wall);
    c.reconcile(t0, wall);
    let agents: Vec<_> = c
        .pods()
        .into_iter()
        .filter(|p| p.name.starts_with("agent-"))
        .collect();
    assert_eq!(agents.len(), 3);
    assert!(
        agents.iter().all(|p| p.image == "agent:2" && p.ready),
        "{agents:?}"
    );
    let status = &c.store.get(&DAEMONSETS, "kube-system", "agent").unwrap()["status"];
    assert_eq!(status["updatedNumberScheduled"], 3);
    assert_eq!(status["observedGeneration"], 2);
}

/// apiextensions: a CRD's names are accepted at once (and it is `Established=False`,
/// `Installing`), it is Established only after the establishing delay, and only then do its
/// kinds route and show in discovery.
#[test]
fn a_crd_serves_its_kind_only_once_established() {
    let (mut c, _) = cluster(Vec::new(), Duration::ZERO);
    c.set_timing(Timing {
        start: Duration::ZERO,
        termination: Duration::ZERO,
        crd_establish: Duration::from_secs(5),
    });
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.org"},
        "spec": {"group": "example.org", "scope": "Cluster",
            "names": {"kind": "Gadget", "plural": "gadgets"},
            "versions": [{"name": "v1", "served": true, "storage": true},
                         {"name": "v0", "served": false, "storage": false}]},
    });
    let wall = jiff::Timestamp::now();
    c.store.create(&resources::CRDS, crd, wall).unwrap();
    let t0 = Instant::now();
    c.reconcile(t0, wall);
    let status = |c: &KubeSide| {
        c.store
            .get(&resources::CRDS, "", "gadgets.example.org")
            .unwrap()["status"]
            .clone()
    };
    let conditions = |c: &KubeSide| -> Vec<(String, String)> {
        status(c)["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                (
                    x["type"].as_str().unwrap().to_string(),
                    x["status"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    // kubernetes apiextensions `naming_controller.go` `calculateNamesAndConditions`: until
    // the establishing controller ran, `Established=False` with reason `Installing`
    assert_eq!(
        conditions(&c),
        [
            ("NamesAccepted".into(), "True".into()),
            ("Established".into(), "False".into())
        ]
    );
    assert_eq!(status(&c)["conditions"][1]["reason"], "Installing");
    assert_eq!(status(&c)["acceptedNames"]["plural"], "gadgets");
    assert!(c.custom_types().is_empty());
    assert!(!resources::group_version_exists(
        "example.org",
        "v1",
        (1, 34),
        c.custom_types()
    ));
    assert_eq!(c.next_due(t0), Some(t0 + Duration::from_secs(5)));
    c.reconcile(t0 + Duration::from_secs(4), wall);
    assert!(c.custom_types().is_empty(), "not before the delay");
    c.reconcile(t0 + Duration::from_secs(5), wall);
    assert_eq!(
        conditions(&c),
        [
            ("NamesAccepted".into(), "True".into()),
            ("Established".into(), "True".into())
        ]
    );
    let served = c.custom_types();
    assert_eq!(served.len(), 1, "only the served version");
    let rt = resources::lookup("example.org", "v1", "gadgets", (1, 34), served).unwrap();
    assert!(!rt.namespaced);
    assert_eq!(rt.singular, "gadget");
    let list = resources::resource_list("example.org", "v1", (1, 34), served);
    assert_eq!(list["resources"][0]["kind"], "Gadget");
    assert!(
        resources::group_list((1, 34), served)["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "example.org")
    );
    assert!(resources::lookup("example.org", "v0", "gadgets", (1, 34), served).is_none());
}

/// A new `talos.dev/config-file-version` is a new static pod manifest: the kubelet replaces the
/// mirror pod (new uid, the annotation it carries), which is not Ready until it has started.
#[test]
fn a_new_config_file_version_replaces_the_mirror_pod() {
    let (mut c, nodes) = cluster(vec![], Duration::from_secs(5));
    let set = |v: &str| {
        nodes.0.lock().unwrap()[0].static_pod_config_file_versions =
            [("kube-apiserver".to_string(), v.to_string())].into();
    };
    let apiserver = |c: &KubeSide| {
        c.store
            .get(&PODS, "kube-system", "kube-apiserver-cp-1")
            .cloned()
            .unwrap()
    };
    set("1111");
    let t0 = Instant::now();
    let wall = jiff::Timestamp::now();
    c.reconcile(t0, wall);
    c.reconcile(t0 + Duration::from_secs(6), wall);
    let before = apiserver(&c);
    assert_eq!(
        before["metadata"]["annotations"]["talos.dev/config-file-version"],
        "1111"
    );
    assert!(pod_ready(&before));
    // the same facts: the pod stays
    c.reconcile(t0 + Duration::from_secs(7), wall);
    assert_eq!(uid_of(&apiserver(&c)), uid_of(&before));
    set("1112");
    c.reconcile(t0 + Duration::from_secs(8), wall);
    let after = apiserver(&c);
    assert_ne!(uid_of(&after), uid_of(&before));
    assert_eq!(
        after["metadata"]["annotations"]["talos.dev/config-file-version"],
        "1112"
    );
    assert!(!pod_ready(&after), "starting");
    c.reconcile(t0 + Duration::from_secs(14), wall);
    assert!(pod_ready(&apiserver(&c)));
}

/// kubernetes `pkg/apis/core/validation` `validateNodeTaints`: a taint's value must be a label
/// value (apimachinery `IsValidLabelValue`); a Node update with a longer one is refused with
/// a 422 naming `spec.taints[i].value`, and the node keeps its taints. The simulator took any
/// value, so a pacing taint too long for a real apiserver went unnoticed.
#[test]
fn a_taint_whose_value_is_no_label_value_is_refused() {
    let (mut c, _) = cluster(Vec::new(), Duration::ZERO);
    let wall = jiff::Timestamp::now();
    c.reconcile(Instant::now(), wall);
    let mut node = c.store.get(&NODES, "", "w-1").unwrap().clone();
    let long = "a".repeat(64);
    node["spec"]["taints"] =
        json!([{"key": "medea.dev/upgrade-pending", "value": long, "effect": "PreferNoSchedule"}]);
    let err = c.patch_node("w-1", &node, wall).unwrap_err();
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains("spec.taints[0].value")
            && err.message.contains("must be no more than 63 characters"),
        "{}",
        err.message
    );
    node["spec"]["taints"][0]["value"] = json!("job-");
    let err = c.patch_node("w-1", &node, wall).unwrap_err();
    assert!(
        err.message.contains("start and end with an alphanumeric"),
        "{}",
        err.message
    );
    let stored = c.store.get(&NODES, "", "w-1").unwrap();
    assert!(
        stored["spec"]["taints"]
            .as_array()
            .is_none_or(|ts| ts.iter().all(|t| t["key"] != "medea.dev/upgrade-pending")),
        "{stored}"
    );
    node["spec"]["taints"][0]["value"] = json!("0123456789ab-prod");
    c.patch_node("w-1", &node, wall).unwrap();
}

/// A node source whose nodes start server-side drains (Talos' legacy `MachineService.Upgrade`).
struct Draining {
    nodes: Vec<NodeFacts>,
    drains: Mutex<BTreeMap<String, u64>>,
}

impl NodeSource for Draining {
    fn nodes(&self) -> Vec<NodeFacts> {
        self.nodes.clone()
    }
    fn talos_drains(&self) -> Vec<(String, u64)> {
        self.drains
            .lock()
            .unwrap()
            .iter()
            .map(|(n, k)| (n.clone(), *k))
            .collect()
    }
}

fn draining_cluster(objects: Vec<Value>) -> (KubeSide, Arc<Draining>) {
    let src = Arc::new(Draining {
        nodes: vec![
            node("cp-1", true),
            node("w-1", false),
            node("w-2", false),
            node("w-3", false),
        ],
        drains: Mutex::new(BTreeMap::new()),
    });
    let mut c = KubeSide::new(
        src.clone(),
        Timing {
            start: Duration::ZERO,
            termination: Duration::from_secs(30),
            crd_establish: Duration::ZERO,
        },
        42,
    );
    let wall = jiff::Timestamp::now();
    for o in objects {
        let rt = resources::by_kind(
            o["apiVersion"].as_str().unwrap(),
            o["kind"].as_str().unwrap(),
        )
        .unwrap();
        c.store.create(rt, o, wall).unwrap();
    }
    c.reconcile(Instant::now(), wall);
    (c, src)
}

fn talos_records(c: &KubeSide) -> Vec<super::super::ClusterRecord> {
    use super::super::ClusterRecord;
    c.history
        .iter()
        .filter(|r| {
            matches!(
                r,
                ClusterRecord::TalosEvicted { .. } | ClusterRecord::TalosEvictionRefused { .. }
            )
        })
        .cloned()
        .collect()
}

/// Talos' server-side drain (`pkg/kubernetes/kubernetes.go` `Client.Drain`) evicts every pod a
/// controller other than a DaemonSet owns, and leaves mirror pods, DaemonSet pods and bare
/// pods; it runs once per drain the node source started; a client's eviction counters do not
/// move.
#[test]
fn a_talos_server_side_drain_evicts_controller_pods_and_leaves_daemonset_mirror_and_bare_pods() {
    use super::super::ClusterRecord;
    let mut objects = scenario::default_scenario();
    objects.push(json(&scenario::bare_pod("default", "debug", "w-1", false)));
    let (mut c, src) = draining_cluster(objects);
    let t0 = Instant::now();
    let wall = jiff::Timestamp::now();
    let before: Vec<(String, String, bool)> = ["cp-1", "w-1"]
        .iter()
        .flat_map(|n| c.store.pods_on_node(n, None).cloned().collect::<Vec<_>>())
        .map(|p| {
            (
                format!("{}/{}", ns_of(&p), name_of(&p)),
                node_name(&p).to_string(),
                talos_drain::evicted_by_talos_drain(&p),
            )
        })
        .collect();
    let kept: Vec<&str> = before
        .iter()
        .filter(|b| !b.2)
        .map(|b| b.0.as_str())
        .collect();
    assert!(kept.iter().any(|p| *p == "default/debug"), "{kept:?}");
    assert!(
        kept.iter()
            .any(|p| p.starts_with("kube-system/kube-proxy-"))
    );
    assert!(kept.iter().any(|p| *p == "kube-system/kube-apiserver-cp-1"));
    assert!(
        before
            .iter()
            .any(|b| b.2 && b.1 == "w-1" && b.0.starts_with("default/web-")),
        "{before:?}"
    );
    assert!(talos_records(&c).is_empty());

    *src.drains.lock().unwrap() = [("cp-1".to_string(), 1), ("w-1".to_string(), 1)].into();
    c.reconcile(t0, wall);
    let records = talos_records(&c);
    for (pod, node, evicted) in &before {
        let named = records.iter().any(|r| match r {
            ClusterRecord::TalosEvicted { pod: p, node: n }
            | ClusterRecord::TalosEvictionRefused { pod: p, node: n } => p == pod && n == node,
            _ => false,
        });
        assert_eq!(named, *evicted, "{pod} on {node}: {records:?}");
        if !evicted {
            let (ns, name) = pod.split_once('/').unwrap();
            let p = c.store.get(&PODS, ns, name).expect("kept");
            assert!(!is_terminating(p), "{pod} left alone");
        }
    }
    let web = before
        .iter()
        .find(|b| b.1 == "w-1" && b.0.starts_with("default/web-"))
        .unwrap();
    let (ns, name) = web.0.split_once('/').unwrap();
    assert!(
        c.store.get(&PODS, ns, name).is_none_or(is_terminating),
        "the web pod on w-1 is evicted"
    );
    assert!(c.counters.talos_drain_evictions >= 1, "{:?}", c.counters);
    assert_eq!(
        (c.counters.evictions, c.counters.evictions_blocked),
        (0, 0),
        "a client's counters"
    );

    // the same drain is not run again; a second one is
    let n = records.len();
    c.reconcile(t0 + Duration::from_secs(60), wall);
    assert_eq!(talos_records(&c).len(), n, "once per drain");
    src.drains.lock().unwrap().insert("w-2".to_string(), 1);
    c.reconcile(t0 + Duration::from_secs(60), wall);
    assert!(talos_records(&c).len() > n, "w-2's drain ran");
}

/// The server-side drain goes through the eviction subresource, so a PodDisruptionBudget
/// holds: two nodes draining at once under `web-pdb` (minAvailable 2 of 3) get one web pod
/// evicted and the other refused, which stays.
#[test]
fn a_talos_server_side_drain_honours_pod_disruption_budgets() {
    use super::super::ClusterRecord;
    let (mut c, src) = draining_cluster(scenario::default_scenario());
    let t0 = Instant::now();
    let wall = jiff::Timestamp::now();
    assert!(web_pods(&c).iter().all(|p| p.ready));
    *src.drains.lock().unwrap() = [("w-1".to_string(), 1), ("w-2".to_string(), 1)].into();
    c.reconcile(t0, wall);
    let web: Vec<_> = talos_records(&c)
        .into_iter()
        .filter(|r| match r {
            ClusterRecord::TalosEvicted { pod, .. }
            | ClusterRecord::TalosEvictionRefused { pod, .. } => pod.starts_with("default/web-"),
            _ => false,
        })
        .collect();
    assert_eq!(web.len(), 2, "{web:?}");
    let refused: Vec<&String> = web
        .iter()
        .filter_map(|r| match r {
            ClusterRecord::TalosEvictionRefused { pod, .. } => Some(pod),
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 1, "{web:?}");
    let (ns, name) = refused[0].split_once('/').unwrap();
    let stays = c.store.get(&PODS, ns, name).expect("the refused pod stays");
    assert!(!is_terminating(stays));
    assert!(c.counters.talos_drain_refused >= 1);
    assert_eq!(c.counters.evictions_blocked, 0);
}
