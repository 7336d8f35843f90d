//! The bootstrap manifests sync against the simulated apiserver (issue #33 items 3–5): CRDs
//! and their custom resources in one set, the legacy sync's conflict retries and dry-run
//! diff, the inventory policy and the wait on what changed.

use std::time::Duration;

use medea::k8s::bootstrap::{INVENTORY_ANNOTATION, INVENTORY_NAME, SyncMode};
use medea::k8s::{
    ApplyOptions, ClientOptions, K8sError, KubeApi as _, KubeClient, Manifest, ManifestSyncOptions,
};
use medea::sim::kube::{KubeFault, KubeSimConfig};
use serde_json::{Value, json};

use crate::rollout_sim::Sim;

/// Retries and polls every few milliseconds, for a minute at most: the tests wait on the
/// simulator's progress, the bound only keeps a broken run from hanging.
fn quick() -> ClientOptions {
    ClientOptions {
        manifests: ManifestSyncOptions {
            retry_for: Duration::from_secs(60),
            retry_interval: Duration::from_millis(20),
            poll_interval: Duration::from_millis(20),
            ..ManifestSyncOptions::default()
        },
        ..ClientOptions::default()
    }
}

async fn start(dir: &std::path::Path, kube: KubeSimConfig) -> (Sim, KubeClient) {
    let sim = Sim::start(dir, 1, 1, kube).await;
    let kubeconfig = sim.creds.join(crate::rollout::CLUSTER).join("kubeconfig");
    let client = KubeClient::from_kubeconfig(&kubeconfig, quick())
        .await
        .unwrap();
    (sim, client)
}

fn manifests(values: Vec<Value>) -> Vec<Manifest> {
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| Manifest::from_value(v, i).unwrap())
        .collect()
}

fn crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    })
}

fn widget() -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "namespace": "kube-system"}, "spec": {"size": 3}})
}

fn config_map(name: &str, data: Value, annotations: Option<Value>) -> Value {
    let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "kube-system"}, "data": data});
    if let Some(a) = annotations {
        cm["metadata"]["annotations"] = a;
    }
    cm
}

fn owner_of(sim: &Sim, name: &str) -> Option<String> {
    sim.kube
        .get("v1", "ConfigMap", "kube-system", name)
        .and_then(|o| {
            o.pointer("/metadata/annotations")
                .and_then(|a| a.get(INVENTORY_ANNOTATION))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
}

/// Item 3: a CRD is Established only after a delay (apiextensions' establishing controller;
/// 5 s on an HA control plane), and until then its kind is not served. A set with a CRD and a
/// custom resource of it failed right after the CRD (`the cluster does not serve
/// example.com/v1 Widget`); the sync waits for the CRD between stages, as fluxcd ssa
/// `ApplyAllStaged` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_and_a_custom_resource_of_it_sync_once_the_crd_is_established() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, client) = start(
        dir.path(),
        KubeSimConfig {
            crd_establish_delay: Duration::from_millis(400),
            ..KubeSimConfig::default()
        },
    )
    .await;
    // the simulator: right after the CRD is created its kind is not served
    let apply = ApplyOptions {
        field_manager: "test".into(),
        force_conflicts: true,
        dry_run: false,
    };
    client.apply(&manifests(vec![crd()]), &apply).await.unwrap();
    let err = client
        .apply(&manifests(vec![widget()]), &apply)
        .await
        .unwrap_err();
    assert!(matches!(err, K8sError::UnknownKind { .. }), "{err:?}");

    let report = client
        .sync_bootstrap_manifests(
            &manifests(vec![widget(), crd()]),
            SyncMode::ServerSide,
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(
        report.applied.iter().any(|a| a == "Widget kube-system/w"),
        "{report:?}"
    );
    let w = sim
        .kube
        .get("example.com/v1", "Widget", "kube-system", "w")
        .expect("the custom resource is stored");
    assert_eq!(w["spec"]["size"], 3);
    assert_eq!(
        w["metadata"]["annotations"][INVENTORY_ANNOTATION],
        INVENTORY_NAME
    );
    let crd = sim
        .kube
        .get(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "",
            "widgets.example.com",
        )
        .unwrap();
    let established = crd["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Established")
        .unwrap();
    assert_eq!(established["status"], "True");
    assert_eq!(established["reason"], "InitialNamesAccepted");
}

/// Item 4: the legacy sync (a node on Talos < 1.13) updates at the resourceVersion it just
/// read; another writer in between makes that a 409, which go-kubernetes `manifests/sync.go`
/// retries (3 minutes). It also writes only when a dry-run of the update differs from the live
/// object. Before, the first 409 failed the step and every object was rewritten every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_legacy_sync_retries_a_conflict_and_writes_only_what_differs() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, client) = start(dir.path(), KubeSimConfig::default()).await;
    let v1 = manifests(vec![config_map("legacy", json!({"k": "1"}), None)]);
    let wait = Duration::from_secs(60);
    client
        .sync_bootstrap_manifests(&v1, SyncMode::Legacy, wait)
        .await
        .unwrap();
    let before = sim.kube.counters();
    client
        .sync_bootstrap_manifests(&v1, SyncMode::Legacy, wait)
        .await
        .unwrap();
    assert_eq!(
        sim.kube.counters().updates,
        before.updates,
        "an unchanged object is not written"
    );

    // two concurrent writes, each right after the sync's GET: two conflicts, then the update
    sim.kube.inject(KubeFault::ConcurrentWriteAfterGet {
        namespace: "kube-system".into(),
        name: "legacy".into(),
        times: 2,
    });
    let v2 = manifests(vec![config_map("legacy", json!({"k": "2"}), None)]);
    client
        .sync_bootstrap_manifests(&v2, SyncMode::Legacy, wait)
        .await
        .unwrap();
    let cm = sim
        .kube
        .get("v1", "ConfigMap", "kube-system", "legacy")
        .unwrap();
    assert_eq!(cm["data"]["k"], "2");
    assert_eq!(sim.kube.counters().updates, before.updates + 1);

    // a conflict that outlasts the retry window fails, naming the object and the 409
    let short = KubeClient::from_kubeconfig(
        &sim.creds.join(crate::rollout::CLUSTER).join("kubeconfig"),
        ClientOptions {
            manifests: ManifestSyncOptions {
                retry_for: Duration::from_millis(100),
                retry_interval: Duration::from_millis(20),
                ..quick().manifests
            },
            ..quick()
        },
    )
    .await
    .unwrap();
    sim.kube.inject(KubeFault::ConcurrentWriteAfterGet {
        namespace: "kube-system".into(),
        name: "legacy".into(),
        times: u32::MAX,
    });
    let v3 = manifests(vec![config_map("legacy", json!({"k": "3"}), None)]);
    let err = short
        .sync_bootstrap_manifests(&v3, SyncMode::Legacy, wait)
        .await
        .unwrap_err();
    assert!(
        matches!(err, K8sError::ManifestRetriesExhausted { .. }),
        "{err:?}"
    );
    let chain = medea::error_chain(&err);
    assert!(chain.contains("ConfigMap kube-system/legacy"), "{chain}");
    assert!(chain.contains("the object has been modified"), "{chain}");
}

/// Item 5: talosctl syncs with `AdoptIfNoInventory`: a live object annotated for no
/// inventory is taken over, one annotated for another inventory is refused (cli-utils
/// `CanApply`, go-kubernetes `checkInventoryPolicy`) and left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_side_sync_adopts_unowned_objects_and_refuses_another_inventorys() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, client) = start(dir.path(), KubeSimConfig::default()).await;
    sim.kube
        .create(config_map("unowned", json!({"k": "live"}), None))
        .unwrap();
    sim.kube
        .create(config_map(
            "theirs",
            json!({"k": "live"}),
            Some(json!({INVENTORY_ANNOTATION: "someone-elses"})),
        ))
        .unwrap();
    let wait = Duration::from_secs(60);
    client
        .sync_bootstrap_manifests(
            &manifests(vec![config_map("unowned", json!({"k": "talos"}), None)]),
            SyncMode::ServerSide,
            wait,
        )
        .await
        .unwrap();
    assert_eq!(owner_of(&sim, "unowned").as_deref(), Some(INVENTORY_NAME));

    let err = client
        .sync_bootstrap_manifests(
            &manifests(vec![config_map("theirs", json!({"k": "talos"}), None)]),
            SyncMode::ServerSide,
            wait,
        )
        .await
        .unwrap_err();
    let chain = medea::error_chain(&err);
    assert!(chain.contains("ConfigMap kube-system/theirs"), "{chain}");
    assert!(
        chain.contains(
            "inventory policy prevented actuation (status: NoMatch, policy: AdoptIfNoInventory)"
        ),
        "{chain}"
    );
    let theirs = sim
        .kube
        .get("v1", "ConfigMap", "kube-system", "theirs")
        .unwrap();
    assert_eq!(theirs["data"]["k"], "live", "not taken over");
    assert_eq!(owner_of(&sim, "theirs").as_deref(), Some("someone-elses"));
}

/// Item 5: after the sync talosctl waits only for the objects it created or changed, by
/// kstatus' rules. A Deployment that had not rolled out held every later sync until its
/// timeout, although the sync did not touch it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_sync_only_created_or_changed_objects_are_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, client) = start(dir.path(), KubeSimConfig::default()).await;
    // pods of new ReplicaSets never become Ready during the test
    sim.kube
        .set_pod_delays(Duration::from_secs(3600), Duration::ZERO);
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "slow", "namespace": "kube-system"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "slow"}},
            "template": {"metadata": {"labels": {"app": "slow"}},
                "spec": {"containers": [{"name": "c", "image": "registry.example/slow:1"}]}},
        },
    });
    let set = manifests(vec![deployment]);
    // created: waited for, and it does not get there
    let err = client
        .sync_bootstrap_manifests(&set, SyncMode::ServerSide, Duration::from_millis(300))
        .await
        .unwrap_err();
    let chain = medea::error_chain(&err);
    assert!(chain.contains("Deployment kube-system/slow"), "{chain}");
    assert!(chain.contains("not reconciled"), "{chain}");
    // unchanged: not waited for
    client
        .sync_bootstrap_manifests(&set, SyncMode::ServerSide, Duration::from_millis(300))
        .await
        .unwrap();
}

/// Issue #48 item 7: Talos' own `ManifestApplyController` rewrites the inventory ConfigMap
/// (go-kubernetes `ssa/internal/inventory/configmap` `Write`, an unconditional update), so an
/// update at the resourceVersion medea read a moment before lost to it with a 409 and failed
/// the sync. medea writes it unconditionally as go-kubernetes does (the apiserver allows that
/// for ConfigMaps), so a writer after every one of its reads changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_is_written_unconditionally_while_talos_rewrites_it() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, client) = start(dir.path(), KubeSimConfig::default()).await;
    let wait = Duration::from_secs(60);
    client
        .sync_bootstrap_manifests(
            &manifests(vec![config_map("first", json!({"k": "1"}), None)]),
            SyncMode::ServerSide,
            wait,
        )
        .await
        .unwrap();
    sim.kube.inject(KubeFault::ConcurrentWriteAfterGet {
        namespace: "kube-system".into(),
        name: INVENTORY_NAME.into(),
        times: u32::MAX,
    });
    client
        .sync_bootstrap_manifests(
            &manifests(vec![
                config_map("first", json!({"k": "1"}), None),
                config_map("second", json!({"k": "2"}), None),
            ]),
            SyncMode::ServerSide,
            wait,
        )
        .await
        .unwrap();
    let inv = sim
        .kube
        .get("v1", "ConfigMap", "kube-system", INVENTORY_NAME)
        .unwrap();
    let keys: Vec<&String> = inv["data"].as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "kube-system_first__ConfigMap",
            "kube-system_second__ConfigMap"
        ]
    );
}

/// Issue #48 item 7: go-kubernetes `ssa` `Apply` diffs the whole set, checking each live
/// object against the inventory policy, before it applies anything. A set whose ConfigMap
/// belongs to another inventory applied the Namespace of its first stage before refusing the
/// ConfigMap; now the sync is refused with nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_object_is_refused_before_anything_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, client) = start(dir.path(), KubeSimConfig::default()).await;
    sim.kube
        .create(config_map(
            "theirs",
            json!({"k": "live"}),
            Some(json!({INVENTORY_ANNOTATION: "someone-elses"})),
        ))
        .unwrap();
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fresh"}});
    let err = client
        .sync_bootstrap_manifests(
            &manifests(vec![
                config_map("theirs", json!({"k": "talos"}), None),
                namespace,
            ]),
            SyncMode::ServerSide,
            Duration::from_secs(60),
        )
        .await
        .unwrap_err();
    let chain = medea::error_chain(&err);
    assert!(chain.contains("ConfigMap kube-system/theirs"), "{chain}");
    assert!(chain.contains("status: NoMatch"), "{chain}");
    assert!(chain.contains("nothing was applied"), "{chain}");
    assert!(
        sim.kube.get("v1", "Namespace", "", "fresh").is_none(),
        "the first stage was not applied"
    );
    assert!(
        sim.kube
            .get("v1", "ConfigMap", "kube-system", INVENTORY_NAME)
            .is_none(),
        "no inventory written"
    );
}

/// Issue #48 item 7: go-kubernetes retries only retryable errors (`IsRetryableError`), never
/// a kind the cluster does not serve; a custom resource is resolved once the CRDs of its own
/// set are Established. A Widget without its CRD was retried for the whole retry window (3
/// minutes by default) before failing; now it fails at once, before anything is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_kind_without_its_crd_in_the_set_fails_at_once_with_nothing_applied() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, client) = start(dir.path(), KubeSimConfig::default()).await;
    let err = client
        .sync_bootstrap_manifests(
            &manifests(vec![
                config_map("before", json!({"k": "1"}), None),
                widget(),
            ]),
            SyncMode::ServerSide,
            Duration::from_secs(60),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, K8sError::ManifestKindUnserved { object, .. } if object.ends_with("Widget kube-system/w")),
        "{err:?}"
    );
    let chain = medea::error_chain(&err);
    assert!(chain.contains("example.com/v1"), "{chain}");
    assert!(
        sim.kube
            .get("v1", "ConfigMap", "kube-system", "before")
            .is_none(),
        "nothing applied"
    );
    // the legacy sync (Talos < 1.13, go-kubernetes `manifests/sync.go`) does not retry it either
    let err = client
        .sync_bootstrap_manifests(
            &manifests(vec![widget()]),
            SyncMode::Legacy,
            Duration::from_secs(60),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, K8sError::ManifestKindUnserved { .. }),
        "{err:?}"
    );
}
