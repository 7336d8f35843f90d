//! Issue #36 item 4, the workload census: `ops::census::gather` through the real `KubeClient`
//! against the simulated kube-apiserver (`SimCluster`): pods per node with their owners,
//! PodDisruptionBudgets with what they allow and their members, DaemonSets; no secrets; bounds;
//! paging; a forbidden source. The refresh that stores it is tested in `seed::`.

use std::time::Duration;

use medea::inventory::census::Census;
use medea::ops::census::{self, Limits};
use medea::sim::kube::{Forbidden, KubeFault};
use serde_json::json;

use crate::sim_cluster::{Env, env, quick_default};

/// Poll `done` until it holds (at most 30 s of progress).
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `web` PDB counting its three pods healthy (the disruption controller has run).
async fn settled(e: &Env) {
    wait_until("the web PDB's status", || {
        let pdb = e
            .sim
            .kube
            .get("policy/v1", "PodDisruptionBudget", "default", "web-pdb");
        let status = pdb.as_ref().and_then(|p| p.get("status"));
        status.and_then(|s| s["expectedPods"].as_i64()) == Some(3)
            && status.and_then(|s| s["disruptionsAllowed"].as_i64()) == Some(1)
    })
    .await;
}

fn bare_pod(ns: &str, name: &str, node: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "registry.example/plain:1"}],
        },
    })
}

fn pod_names(c: &Census) -> Vec<String> {
    c.pods
        .iter()
        .map(|p| format!("{}:{}/{}", p.node, p.namespace, p.name))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_census_lists_every_pod_on_its_node_with_its_owner_the_pdbs_and_the_daemonsets() {
    let e = env(quick_default()).await;
    settled(&e).await;
    let kube = e.kube().await;
    let c = census::gather(&kube, jiff::Timestamp::now()).await;
    assert!(c.gather_errors.is_empty(), "{:?}", c.gather_errors);
    assert!(c.truncated.is_empty(), "{:?}", c.truncated);

    // every pod the simulator runs, on its node, with its controller's kind and name
    let mut expected: Vec<(String, String, String, Option<String>, bool)> = e
        .sim
        .kube
        .pods()
        .into_iter()
        .map(|p| {
            (
                p.node.unwrap_or_default(),
                p.namespace,
                p.name,
                p.controller,
                p.mirror,
            )
        })
        .collect();
    expected.sort();
    let seen: Vec<(String, String, String, Option<String>, bool)> = c
        .pods
        .iter()
        .map(|p| {
            (
                p.node.clone(),
                p.namespace.clone(),
                p.name.clone(),
                p.owner.as_ref().map(|o| format!("{}/{}", o.kind, o.name)),
                p.mirror,
            )
        })
        .collect();
    assert_eq!(seen, expected, "sorted by node, namespace, name");

    let web: Vec<_> = c
        .pods
        .iter()
        .filter(|p| p.namespace == "default" && p.name.starts_with("web-"))
        .collect();
    assert_eq!(web.len(), 3);
    assert!(
        web.iter().all(
            |p| p.owner.as_ref().map(|o| o.kind.as_str()) == Some("ReplicaSet")
                && p.phase == "Running"
                && !p.node.is_empty()
        ),
        "{web:?}"
    );
    let proxies: Vec<_> = c
        .pods
        .iter()
        .filter(|p| p.name.starts_with("kube-proxy-"))
        .collect();
    assert_eq!(proxies.len(), 6, "one per node");
    assert!(proxies.iter().all(
        |p| p.owner.as_ref().map(|o| (o.kind.as_str(), o.name.as_str()))
            == Some(("DaemonSet", "kube-proxy"))
    ));
    let mirrors = c.pods.iter().filter(|p| p.mirror).count();
    assert!(mirrors >= 3, "the control planes' static pods: {mirrors}");
    // the metrics-server mounts an emptyDir at /tmp
    let metrics = c
        .pods
        .iter()
        .find(|p| p.name.starts_with("metrics-server-"))
        .expect("the platform's metrics-server");
    assert_eq!(metrics.volumes.empty_dir, 1, "{metrics:?}");

    // the PDB: as written, what it allows, its members
    assert_eq!(c.pdbs.len(), 1, "{:?}", c.pdbs);
    let pdb = &c.pdbs[0];
    assert_eq!(
        (pdb.namespace.as_str(), pdb.name.as_str()),
        ("default", "web-pdb")
    );
    assert_eq!(pdb.min_available.as_deref(), Some("2"));
    assert_eq!(pdb.max_unavailable, None);
    assert_eq!((pdb.disruptions_allowed, pdb.expected_pods), (1, 3));
    let mut members: Vec<String> = web.iter().map(|p| p.name.clone()).collect();
    members.sort();
    assert_eq!(pdb.pods, members);

    assert!(
        c.daemonsets.iter().any(|d| d == "kube-system/kube-proxy")
            && c.daemonsets.iter().any(|d| d == "kube-system/kube-flannel"),
        "{:?}",
        c.daemonsets
    );
    let mut sorted = c.daemonsets.clone();
    sorted.sort();
    assert_eq!(c.daemonsets, sorted);
    e.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_pod_has_no_owner_its_emptydir_is_counted_and_no_secret_reaches_the_census() {
    let e = env(quick_default()).await;
    settled(&e).await;
    e.sim
        .kube
        .create(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "lonely", "namespace": "default", "labels": {"app": "lonely"}},
            "spec": {
                "nodeName": "w-1",
                "containers": [{
                    "name": "c",
                    "image": "registry.example/private-image-xyz:1",
                    "env": [
                        {"name": "PLAIN_SETTING_ENV", "value": "plain-value-abc"},
                        {"name": "API_TOKEN_ENV", "valueFrom": {"secretKeyRef": {"name": "env-secret-name", "key": "token"}}},
                    ],
                    "envFrom": [{"secretRef": {"name": "envfrom-secret-name"}}],
                }],
                "volumes": [
                    {"name": "creds", "secret": {"secretName": "volume-secret-name"}},
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "logs", "hostPath": {"path": "/var/log/host-path-xyz"}},
                ],
            },
        }))
        .unwrap();
    let kube = e.kube().await;
    let c = census::gather(&kube, jiff::Timestamp::now()).await;
    let lonely = c
        .pods
        .iter()
        .find(|p| p.name == "lonely")
        .expect("the bare pod is listed");
    assert_eq!(lonely.node, "w-1");
    assert_eq!(lonely.owner, None, "a bare pod has no controller");
    assert_eq!(
        (
            lonely.volumes.empty_dir,
            lonely.volumes.host_path,
            lonely.volumes.persistent_volume_claim,
            lonely.volumes.csi
        ),
        (1, 1, 0, 0),
        "the Secret volume is not counted as any of the kinds"
    );
    let text = serde_json::to_string(&c).unwrap();
    for secret in [
        "env-secret-name",
        "envfrom-secret-name",
        "volume-secret-name",
        "API_TOKEN_ENV",
        "PLAIN_SETTING_ENV",
        "plain-value-abc",
        "private-image-xyz",
        "host-path-xyz",
        "creds",
        "scratch",
    ] {
        assert!(!text.contains(secret), "`{secret}` leaked into {text}");
    }
    assert!(text.contains("\"lonely\""), "{text}");
    e.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_bounds_say_what_they_cut_and_the_sizes_hold() {
    let e = env(quick_default()).await;
    settled(&e).await;
    let mut labelled = bare_pod("default", "many-labels", "w-2");
    for i in 0..5 {
        labelled["metadata"]["labels"][format!("extra-{i}")] = json!("x");
    }
    e.sim.kube.create(labelled).unwrap();
    let kube = e.kube().await;
    let full = census::gather(&kube, jiff::Timestamp::now()).await;
    let limits = Limits {
        max_pods: 5,
        max_labels: 2,
        max_pdb_pods: 1,
        page_size: 500,
    };
    let c = census::gather_with(&kube, jiff::Timestamp::now(), &limits).await;
    assert_eq!(c.pods.len(), 5);
    assert_eq!(
        pod_names(&c),
        pod_names(&full)[..5],
        "the first pods in (node, namespace, name) order are kept"
    );
    assert!(c.pods.iter().all(|p| p.labels.len() <= 2));
    assert!(c.pdbs.iter().all(|p| p.pods.len() <= 1));
    assert_eq!(
        c.truncated[0],
        format!("pods: {} seen, 5 kept", full.pods.len())
    );
    assert!(
        c.truncated
            .iter()
            .any(|t| t.starts_with("labels: ") && t.contains("more than 2 labels")),
        "{:?}",
        c.truncated
    );
    assert!(
        c.truncated
            .iter()
            .any(|t| t == "podDisruptionBudget default/web-pdb: 3 pods selected, 1 kept"),
        "{:?}",
        c.truncated
    );
    assert!(full.truncated.is_empty(), "{:?}", full.truncated);
    e.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_listed_over_many_pages_are_all_seen() {
    let e = env(quick_default()).await;
    settled(&e).await;
    // `app` sorts before `app-staging` as a namespace, after it as a `namespace/name` string:
    // a continue token compared as a string skipped `app-staging` (fixed in the simulator)
    for ns in ["app", "app-staging", "apps"] {
        for i in 0..3 {
            e.sim
                .kube
                .create(bare_pod(ns, &format!("p-{i}"), "w-3"))
                .unwrap();
        }
    }
    let kube = e.kube().await;
    let one_page = census::gather(&kube, jiff::Timestamp::now()).await;
    let before = e.sim.kube.counters().requests;
    let paged = census::gather_with(
        &kube,
        jiff::Timestamp::now(),
        &Limits {
            page_size: 2,
            ..Limits::default()
        },
    )
    .await;
    let requests = e.sim.kube.counters().requests - before;
    assert!(paged.gather_errors.is_empty(), "{:?}", paged.gather_errors);
    assert_eq!(pod_names(&paged), pod_names(&one_page));
    assert_eq!(paged.pdbs, one_page.pdbs);
    assert_eq!(paged.daemonsets, one_page.daemonsets);
    assert_eq!(pod_names(&paged).len(), e.sim.kube.pods().len());
    for ns in ["app", "app-staging", "apps"] {
        assert_eq!(
            paged.pods.iter().filter(|p| p.namespace == ns).count(),
            3,
            "{ns}: {:?}",
            pod_names(&paged)
        );
    }
    let pages = paged.pods.len().div_ceil(2);
    assert!(
        requests as usize >= pages,
        "{requests} requests for {pages} pages of pods"
    );
    e.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_source_is_a_gather_error_and_the_others_are_still_read() {
    let e = env(quick_default()).await;
    settled(&e).await;
    e.sim.kube.inject(KubeFault::Forbidden(Forbidden::parse(
        "list",
        "poddisruptionbudgets.policy",
    )));
    e.sim.kube.inject(KubeFault::Forbidden(Forbidden::parse(
        "list",
        "volumeattachments.storage.k8s.io",
    )));
    let kube = e.kube().await;
    let c = census::gather(&kube, jiff::Timestamp::now()).await;
    assert_eq!(
        c.gather_errors.keys().collect::<Vec<_>>(),
        ["podDisruptionBudgets", "volumeAttachments"],
        "{:?}",
        c.gather_errors
    );
    assert!(
        c.gather_errors["podDisruptionBudgets"].contains("forbidden"),
        "{}",
        c.gather_errors["podDisruptionBudgets"]
    );
    assert!(c.pdbs.is_empty());
    assert_eq!(c.pods.len(), e.sim.kube.pods().len());
    assert!(!c.daemonsets.is_empty());
    let text = serde_json::to_value(&c).unwrap();
    assert!(
        text["gatherErrors"]["podDisruptionBudgets"].is_string(),
        "{text}"
    );
    e.sim.shutdown().await;
}
