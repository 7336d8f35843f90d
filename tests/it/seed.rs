//! `medea seed` and the inventory refresh against the simulated cluster: the record, the
//! credentials, the printed YAML (planned with `plan::compute`), refusals, and refreshes that
//! move the generation exactly when something observed changes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use medea::cli::seed::{SeedError, SeedRequest, seed};
use medea::desired::source::SourceFile;
use medea::desired::{Snapshot, Source};
use medea::inventory::{Inventory, ObservedCluster, cluster_key};
use medea::ops::refresh::{self, ClusterCreds, Observation, Outcome, refresh_all, refresh_cluster};
use medea::plan::{self, AppliedResource, LastApplied, Step};
use medea::sim::talos::{Effect, FaultPlan, Trigger};
use medea::store::fjall::FjallStore;
use medea::store::{Store, StoreError, StoreExt as _, Table, Txn};
use medea::talos::{ImageRef, NodeTarget, TalosApi as _, UpgradeOutcome};
use medea::version::{KubeVersion, TalosVersion};

use crate::sim_cluster::{Env, env, fast_refresh, flat, medea, mode, quick_default};

fn tv(s: &str) -> TalosVersion {
    TalosVersion::parse(s).unwrap()
}

fn kv(s: &str) -> KubeVersion {
    KubeVersion::parse(s).unwrap()
}

fn node(s: &str) -> NodeTarget {
    NodeTarget::parse(s).unwrap()
}

struct Paths {
    store: PathBuf,
    creds: PathBuf,
}

fn paths(e: &Env) -> Paths {
    Paths {
        store: e.dir.path().join("state/store"),
        creds: e.dir.path().join("state/creds"),
    }
}

fn request(e: &Env, p: &Paths, force: bool) -> SeedRequest {
    SeedRequest {
        cluster: "home".into(),
        talosconfig: e.creds.talosconfig.clone(),
        kubeconfig: e.creds.kubeconfig.clone(),
        creds_dir: p.creds.clone(),
        force,
        settings: fast_refresh(),
        approvals: Default::default(),
        record_as_applied: true,
    }
}

async fn seed_cli(e: &Env, p: &Paths, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "seed",
        "--cluster",
        "home",
        "--talosconfig",
        e.creds.talosconfig.to_str().unwrap(),
        "--kubeconfig",
        e.creds.kubeconfig.to_str().unwrap(),
        "--store",
        p.store.to_str().unwrap(),
        "--creds-dir",
        p.creds.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    medea(&args).await
}

fn load_yaml(name: &str, yaml: &str) -> medea::desired::Desired {
    let loaded = medea::desired::parse_snapshot(Snapshot {
        files: vec![SourceFile {
            path: name.into(),
            bytes: yaml.as_bytes().to_vec().into(),
        }],
        markers: vec![],
        commit: None,
        refused: Vec::new(),
    });
    let errors: Vec<String> = loaded.errors().map(|d| d.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}\n{yaml}");
    loaded.desired
}

fn record(store: &dyn Store) -> ObservedCluster {
    store
        .get_record::<ObservedCluster>(&cluster_key("home"))
        .unwrap()
        .expect("the cluster is recorded")
}

fn applied_from(desired: &medea::desired::Desired) -> LastApplied {
    let mut rs = Vec::new();
    for c in desired.clusters.values() {
        rs.push(AppliedResource::of_cluster(c));
        rs.extend(c.pools.values().map(|p| AppliedResource::of_pool(p)));
    }
    LastApplied::from_resources(rs)
}

// ---------------------------------------------------------------------------------------------
// medea seed

#[tokio::test]
async fn seed_records_the_cluster_copies_creds_and_prints_yaml_that_plans_no_rollout() {
    let e = env(quick_default()).await;
    let p = paths(&e);
    let out = seed_cli(&e, &p, &[]).await;
    let stderr = flat(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "seeded cluster `home`: 6 machines (3 control planes, 3 workers), Kubernetes v1.34.1, generation 1"
        ),
        "{stderr}"
    );
    assert!(
        stderr
            .contains("rollouts: disabled; enable them with `medea cluster enable-rollouts home`"),
        "{stderr}"
    );
    let yaml = String::from_utf8(out.stdout).unwrap();

    // The credentials: private copies of what was given.
    let creds = ClusterCreds::new(&p.creds, "home");
    assert_eq!(mode(&p.creds), 0o700);
    assert_eq!(mode(&creds.dir), 0o700);
    assert_eq!(mode(&creds.talosconfig), 0o600);
    assert_eq!(mode(&creds.kubeconfig), 0o600);
    assert_eq!(
        std::fs::read(&creds.talosconfig).unwrap(),
        std::fs::read(&e.creds.talosconfig).unwrap()
    );
    assert_eq!(
        std::fs::read(&creds.kubeconfig).unwrap(),
        std::fs::read(&e.creds.kubeconfig).unwrap()
    );
    assert!(
        !stderr.contains("token:") && !yaml.contains("token"),
        "no secret is printed"
    );

    // The record.
    let store = FjallStore::open(&p.store).unwrap();
    let inventory = Inventory::load(&store).unwrap();
    let home = &inventory.clusters["home"];
    assert!(!home.rollouts_enabled, "seeding never enables rollouts");
    assert_eq!(home.generation, 1);
    assert_eq!(home.kubernetes_version, Some(kv("v1.34.1")));
    let names: Vec<&str> = home.machines.keys().map(String::as_str).collect();
    assert_eq!(names, ["cp-1", "cp-2", "cp-3", "w-1", "w-2", "w-3"]);
    let cp1 = &home.machines["cp-1"];
    assert_eq!(cp1.address, "127.5.0.2");
    assert_eq!(cp1.role, medea::inventory::MachineRole::Controlplane);
    assert_eq!(
        cp1.installer_image.as_deref(),
        Some("ghcr.io/siderolabs/installer:v1.12.11")
    );
    assert_eq!(
        cp1.boot_id.as_deref(),
        Some(e.sim.talos.node_state("cp-1").unwrap().boot_id.as_str()),
        "the boot id Talos reports"
    );
    for m in home.machines.values() {
        assert!(m.reachable && m.ready && !m.cordoned, "{m:?}");
        assert_eq!(m.talos_version, Some(tv("v1.12.11")), "{}", m.node);
        assert_eq!(m.kubelet_version, Some(kv("v1.34.1")), "{}", m.node);
    }

    // The printed YAML is valid and matches the cluster: its plan has no rollout step, only
    // the resources' first registration; once that is applied, nothing at all.
    let desired = load_yaml("home.yaml", &yaml);
    let pools: Vec<&str> = desired.clusters["home"]
        .pools
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(pools, ["controlplane", "workers"], "{yaml}");
    let first = plan::compute(&desired, &inventory, &LastApplied::default(), None).unwrap();
    assert!(
        first.clusters.iter().all(|c| c.steps.is_empty()),
        "{first:#?}"
    );
    assert!(
        first.clusters[0]
            .settings
            .iter()
            .all(|s| s.field == plan::compute::RESOURCE_FIELD),
        "{:#?}",
        first.clusters[0].settings
    );
    let again = plan::compute(&desired, &inventory, &applied_from(&desired), None).unwrap();
    assert!(!again.has_changes(), "{again:#?}");

    // A clean start (#39): seed recorded what it printed as the last-applied state, so its
    // output committed as-is plans nothing, and the first version bump diffs one line.
    let recorded = medea::ops::replan::load_applied(&store).unwrap();
    let as_is = plan::compute(&desired, &inventory, &recorded, None).unwrap();
    assert!(!as_is.has_changes(), "{:#?}", as_is.clusters[0].settings);
    let bumped_yaml = {
        let at = yaml.find("name: workers").expect("the workers pool");
        let (head, tail) = yaml.split_at(at);
        format!("{head}{}", tail.replacen("v1.12.11", "v1.13.10", 1))
    };
    let bumped = load_yaml("home.yaml", &bumped_yaml);
    let plan = plan::compute(&bumped, &inventory, &recorded, None).unwrap();
    let diffs = &plan.clusters[0].diffs;
    assert_eq!(diffs.len(), 1, "{diffs:#?}");
    let changed: Vec<&str> = diffs[0]
        .diff
        .lines()
        .filter(|l| {
            (l.starts_with('+') || l.starts_with('-'))
                && !l.starts_with("+++")
                && !l.starts_with("---")
        })
        .collect();
    assert_eq!(changed.len(), 2, "one line out, one in: {}", diffs[0].diff);
    assert!(changed[1].contains("v1.13.10"), "{}", diffs[0].diff);

    // examples/home asks for Talos v1.14.6 and Kubernetes v1.35.8: the expected rollout (two
    // Talos hops per pool, through the newest 1.13).
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/home");
    let loaded = medea::desired::load(&Source::Dir(examples)).unwrap();
    assert!(!loaded.has_errors());
    let upgrade = plan::compute(
        &loaded.desired,
        &inventory,
        &applied_from(&loaded.desired),
        None,
    )
    .unwrap();
    let steps: Vec<String> = upgrade.clusters[0]
        .steps
        .iter()
        .map(|s| match s {
            Step::Talos(t) => format!(
                "talos {} {} -> {} ({} machines)",
                t.pool,
                t.hop,
                t.to,
                t.waves.iter().map(Vec::len).sum::<usize>()
            ),
            Step::Kubernetes(k) => format!("kubernetes {} -> {}", k.from, k.to),
        })
        .collect();
    assert_eq!(
        steps,
        [
            "talos controlplane 1 -> v1.13.10 (3 machines)",
            "talos controlplane 2 -> v1.14.6 (3 machines)",
            "talos workers 1 -> v1.13.10 (3 machines)",
            "talos workers 2 -> v1.14.6 (3 machines)",
            "kubernetes v1.34.1 -> v1.35.8",
        ]
    );
    e.sim.shutdown().await;
}

/// One person running a cluster alone (#39): the operator sets the bar at seed time; it is in
/// force from the start, and a re-seed never changes a bar already in force.
#[tokio::test]
async fn seed_sets_the_approval_bar_in_force_and_a_reseed_never_lowers_it() {
    let e = env(quick_default()).await;
    let p = paths(&e);
    let out = seed_cli(&e, &p, &["--approvals-control-plane", "1"]).await;
    assert!(out.status.success(), "{}", flat(&out.stderr));
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(
        yaml.contains("  approvals:\n    required: 1\n    controlPlane: 1\n"),
        "{yaml}"
    );
    let desired = load_yaml("home.yaml", &yaml);
    let bar = |p: &Paths| {
        let store = FjallStore::open(&p.store).unwrap();
        medea::ops::replan::load_applied(&store)
            .unwrap()
            .approvals_in_force("home")
    };
    assert_eq!(bar(&p).control_plane, 1);
    assert_eq!(
        desired.clusters["home"].approvals.control_plane, 1,
        "the YAML says what is in force"
    );
    // A re-seed with other values: the YAML shows them, the bar in force stays.
    let out = seed_cli(&e, &p, &["--force", "--approvals-control-plane", "3"]).await;
    assert!(out.status.success(), "{}", flat(&out.stderr));
    assert_eq!(bar(&p).control_plane, 1);
    // A control-plane bar below the ordinary one is refused before anything is written.
    let other = paths(&e);
    let out = seed_cli(
        &e,
        &other,
        &[
            "--approvals-required",
            "2",
            "--approvals-control-plane",
            "1",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        flat(&out.stderr)
            .contains("--approvals-control-plane (1) is lower than --approvals-required (2)"),
        "{}",
        flat(&out.stderr)
    );
    e.sim.shutdown().await;
}

#[tokio::test]
async fn seed_refuses_an_existing_record_unless_forced_and_force_keeps_rollouts() {
    let e = env(quick_default()).await;
    let p = paths(&e);
    {
        let store = FjallStore::open(&p.store).unwrap();
        let seeded = seed(&store, &request(&e, &p, false)).await.unwrap();
        assert!(!seeded.reseeded);
        // An operator enables rollouts.
        let on = record(&store).with_rollouts_enabled(true);
        store
            .commit(Txn::new().put_record(cluster_key("home"), &on))
            .unwrap();
    }
    let generation = {
        let store = FjallStore::open(&p.store).unwrap();
        record(&store).generation
    };

    let out = seed_cli(&e, &p, &[]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = flat(&out.stderr);
    assert!(
        stderr.contains("cluster `home` is already seeded")
            && stderr.contains("--force")
            && stderr.contains("rolloutsEnabled stays true"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    let out = seed_cli(&e, &p, &["--force"]).await;
    let stderr = flat(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("re-seeded cluster `home`"), "{stderr}");
    assert!(stderr.contains("rollouts: enabled (kept)"), "{stderr}");
    let store = FjallStore::open(&p.store).unwrap();
    let after = record(&store);
    assert!(after.rollouts_enabled);
    assert_eq!(after.generation, generation, "nothing observed changed");
    drop(store);

    // A change since: the re-seed moves the generation.
    e.talos().reboot(&node("w-1")).await.unwrap();
    e.sim.talos.complete_boot("w-1").unwrap();
    let store = FjallStore::open(&p.store).unwrap();
    let seeded = seed(&store, &request(&e, &p, true)).await.unwrap();
    assert!(seeded.reseeded);
    assert_eq!(seeded.cluster.generation, generation + 1);
    assert!(seeded.cluster.rollouts_enabled);
    e.sim.shutdown().await;
}

#[tokio::test]
async fn seed_against_a_locked_store_says_to_stop_the_server() {
    let e = env(quick_default()).await;
    let p = paths(&e);
    let held = FjallStore::open(&p.store).unwrap();
    let out = seed_cli(&e, &p, &[]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = flat(&out.stderr);
    assert!(
        stderr.contains("is locked by another medea process")
            && stderr.contains("stop `medea serve`"),
        "{stderr}"
    );
    assert!(!p.creds.exists(), "no credentials copied");
    assert!(record_absent(&held));
    e.sim.shutdown().await;
}

fn record_absent(store: &dyn Store) -> bool {
    store
        .get_record::<ObservedCluster>(&cluster_key("home"))
        .unwrap()
        .is_none()
}

#[tokio::test]
async fn seed_refuses_bad_input_and_writes_nothing() {
    let e = env(quick_default()).await;
    let p = paths(&e);
    let store = FjallStore::open(&p.store).unwrap();

    let mut bad_name = request(&e, &p, false);
    bad_name.cluster = "../home".into();
    let err = seed(&store, &bad_name).await.unwrap_err();
    assert!(matches!(err, SeedError::BadName { .. }), "{err}");

    // A kubeconfig that points at files a copy would leave behind.
    let kc = e.dir.path().join("files.kubeconfig");
    std::fs::write(
        &kc,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    certificate-authority: ca.pem\nusers:\n- name: u\n  user:\n    client-certificate: crt.pem\n    client-key: key.pem\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
    )
    .unwrap();
    let mut files = request(&e, &p, false);
    files.kubeconfig = kc;
    let err = seed(&store, &files).await.unwrap_err();
    let text = medea::error_chain(&err);
    assert!(
        matches!(err, SeedError::KubeconfigFiles { .. })
            && text.contains("certificate-authority, client-certificate, client-key")
            && text.contains("--flatten"),
        "{text}"
    );

    let mut missing = request(&e, &p, false);
    missing.talosconfig = e.dir.path().join("nope");
    let err = seed(&store, &missing).await.unwrap_err();
    assert!(matches!(err, SeedError::Read { .. }), "{err}");

    // The kube-apiserver is down: nothing can be discovered.
    e.sim
        .kube
        .inject(medea::sim::kube::KubeFault::ApiUnavailable(
            medea::sim::kube::Outage::For(std::time::Duration::from_secs(600)),
        ));
    let err = seed(&store, &request(&e, &p, false)).await.unwrap_err();
    let text = medea::error_chain(&err);
    assert!(
        matches!(err, SeedError::Discover { .. }) && text.contains("cannot list the nodes"),
        "{text}"
    );

    assert!(record_absent(&store));
    assert!(!p.creds.join("home").exists(), "no credentials copied");
    e.sim.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Inventory refresh

async fn seeded(e: &Env) -> (Paths, FjallStore) {
    let p = paths(e);
    let store = FjallStore::open(&p.store).unwrap();
    seed(&store, &request(e, &p, false)).await.unwrap();
    (p, store)
}

fn outcome(report: &refresh::RefreshReport, cluster: &str) -> Outcome {
    report
        .clusters
        .iter()
        .find(|c| c.cluster == cluster)
        .map(|c| c.outcome.clone())
        .expect("the cluster is in the report")
}

#[tokio::test]
async fn refresh_moves_the_generation_exactly_when_something_changes() {
    let e = env(quick_default()).await;
    let (p, store) = seeded(&e).await;
    let settings = fast_refresh();
    let talos = e.talos();

    let r = refresh_all(&store, &p.creds, &settings).await.unwrap();
    assert_eq!(outcome(&r, "home"), Outcome::Unchanged { generation: 1 });
    assert!(!r.changed());

    // A reboot is a change (new boot id), seen once.
    let boot_before = record(&store).machines["w-1"].boot_id.clone();
    talos.reboot(&node("w-1")).await.unwrap();
    e.sim.talos.complete_boot("w-1").unwrap();
    let r = refresh_all(&store, &p.creds, &settings).await.unwrap();
    assert_eq!(outcome(&r, "home"), Outcome::Changed { from: 1, to: 2 });
    assert_ne!(record(&store).machines["w-1"].boot_id, boot_before);
    let r = refresh_all(&store, &p.creds, &settings).await.unwrap();
    assert_eq!(outcome(&r, "home"), Outcome::Unchanged { generation: 2 });

    // An upgrade: away while it reboots, then on the new version.
    let image = ImageRef::parse("ghcr.io/siderolabs/installer:v1.13.9").unwrap();
    let up = talos.upgrade(&node("w-2"), &image).await.unwrap();
    assert!(matches!(up, UpgradeOutcome::Rebooting { .. }), "{up:?}");
    let r = refresh_cluster(&store, &p.creds, "home", &settings)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Changed { from: 2, to: 3 });
    let w2 = record(&store).machines["w-2"].clone();
    assert!(
        !w2.reachable && !w2.ready && w2.talos_version.is_none(),
        "{w2:?}"
    );
    e.sim.talos.complete_boot("w-2").unwrap();
    let r = refresh_cluster(&store, &p.creds, "home", &settings)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Changed { from: 3, to: 4 });
    let w2 = record(&store).machines["w-2"].clone();
    assert!(w2.reachable && w2.ready, "{w2:?}");
    assert_eq!(w2.talos_version, Some(tv("v1.13.9")));
    assert!(
        !record(&store).rollouts_enabled,
        "refresh never touches the gate"
    );
    e.sim.shutdown().await;
}

fn census(store: &dyn Store) -> Option<medea::inventory::census::Census> {
    store
        .get_record::<medea::inventory::census::Census>(&medea::inventory::census::census_key(
            "home",
        ))
        .unwrap()
}

#[tokio::test]
async fn refresh_stores_the_census_beside_the_record_and_pods_never_move_the_generation() {
    let e = env(quick_default()).await;
    let (p, store) = seeded(&e).await;
    assert!(census(&store).is_none(), "seed gathers no census");
    let mut settings = fast_refresh();
    settings.census_interval = std::time::Duration::ZERO;

    let r = refresh_all(&store, &p.creds, &settings).await.unwrap();
    assert_eq!(outcome(&r, "home"), Outcome::Unchanged { generation: 1 });
    let first = census(&store).expect("the refresh stored a census");
    assert!(first.gather_errors.is_empty(), "{:?}", first.gather_errors);
    assert_eq!(first.pods.len(), e.sim.kube.pods().len());
    assert_eq!(first.pdbs.len(), 1);

    // a pod comes: the census sees it, the cluster's generation does not move
    let pod = |name: &str| {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "w-2", "containers": [{"name": "c", "image": "registry.example/x:1"}]},
        })
    };
    e.sim.kube.create(pod("extra")).unwrap();
    let r = refresh_all(&store, &p.creds, &settings).await.unwrap();
    assert_eq!(outcome(&r, "home"), Outcome::Unchanged { generation: 1 });
    let second = census(&store).unwrap();
    let extra = second
        .pods
        .iter()
        .find(|p| p.name == "extra")
        .expect("the new pod is in the stored census");
    assert_eq!((extra.node.as_str(), extra.owner.as_ref()), ("w-2", None));
    assert_eq!(record(&store).generation, 1);

    // within the interval the stored census is kept as it is
    settings.census_interval = std::time::Duration::from_secs(3600);
    e.sim.kube.create(pod("later")).unwrap();
    let r = refresh_cluster(&store, &p.creds, "home", &settings)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Unchanged { generation: 1 });
    let third = census(&store).unwrap();
    assert_eq!(third, second, "not gathered again before the interval");
    assert!(!third.pods.iter().any(|p| p.name == "later"));
    assert!(
        refresh::census_due(
            &store,
            "home",
            third.gathered_at.parse::<jiff::Timestamp>().unwrap()
                + jiff::SignedDuration::from_secs(3600),
            settings.census_interval,
        )
        .unwrap(),
        "due once the interval has passed"
    );
    e.sim.shutdown().await;
}

#[tokio::test]
async fn refresh_marks_unreachable_nodes_and_a_dead_apiserver_changes_nothing() {
    let e = env(quick_default()).await;
    let (p, store) = seeded(&e).await;
    let settings = fast_refresh();

    // w-3 reboots and never comes back.
    e.sim
        .talos
        .set_fault(FaultPlan {
            node: "w-3".into(),
            on: Trigger::Boot { nth: 1 },
            effect: Effect::NeverReturn,
        })
        .unwrap();
    e.talos().reboot(&node("w-3")).await.unwrap();
    let r = refresh_all(&store, &p.creds, &settings).await.unwrap();
    assert_eq!(outcome(&r, "home"), Outcome::Changed { from: 1, to: 2 });
    let c = record(&store);
    let w3 = &c.machines["w-3"];
    assert!(
        !w3.reachable && w3.talos_version.is_none() && !w3.ready,
        "{w3:?}"
    );
    assert!(
        c.machines
            .values()
            .filter(|m| m.node != "w-3")
            .all(|m| m.reachable && m.talos_version == Some(tv("v1.12.11"))),
        "the other nodes are observed as usual"
    );
    assert_eq!(c.kubernetes_version, Some(kv("v1.34.1")));
    let r = refresh_all(&store, &p.creds, &settings).await.unwrap();
    assert_eq!(outcome(&r, "home"), Outcome::Unchanged { generation: 2 });

    // The whole Talos API goes away: every machine is unreachable, Kubernetes still answers.
    e.sim.talos.shutdown().await;
    let r = refresh_all(&store, &p.creds, &settings).await.unwrap();
    assert_eq!(outcome(&r, "home"), Outcome::Changed { from: 2, to: 3 });
    let c = record(&store);
    assert!(c.machines.values().all(|m| !m.reachable), "{c:#?}");
    assert_eq!(
        c.kubernetes_version,
        Some(kv("v1.34.1")),
        "still seen in the mirror pods"
    );

    // The kube-apiserver goes away: the refresh fails and the record stays as it was.
    let before = record(&store);
    drop(e.sim.kube);
    let r = refresh_all(&store, &p.creds, &settings).await.unwrap();
    assert!(
        matches!(outcome(&r, "home"), Outcome::Failed { ref error } if error.contains("cannot list the nodes")),
        "{r:?}"
    );
    assert_eq!(record(&store), before);
}

#[tokio::test]
async fn refresh_skips_unseeded_clusters() {
    let e = env(quick_default()).await;
    let p = paths(&e);
    let store = FjallStore::open(&p.store).unwrap();
    e.sim.write_creds(&p.creds.join("lab")).unwrap();
    let r = refresh_all(&store, &p.creds, &fast_refresh())
        .await
        .unwrap();
    assert_eq!(outcome(&r, "lab"), Outcome::NotSeeded);
    assert!(Inventory::load(&store).unwrap().clusters.is_empty());
    e.sim.shutdown().await;
}

/// A store whose first commit is preceded by a concurrent write of the record (an operator
/// enabling rollouts while the refresh observed).
struct RacingStore {
    inner: FjallStore,
    raced: std::sync::atomic::AtomicBool,
}

impl Store for RacingStore {
    fn get(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }
    fn scan(&self, table: Table, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.scan(table, prefix)
    }
    fn commit(&self, txn: Txn) -> Result<(), StoreError> {
        if !self.raced.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let on = record(&self.inner).with_rollouts_enabled(true);
            self.inner
                .commit(Txn::new().put_record(cluster_key("home"), &on))?;
        }
        self.inner.commit(txn)
    }
}

#[tokio::test]
async fn refresh_merges_into_a_record_written_concurrently() {
    let e = env(quick_default()).await;
    let (_, store) = seeded(&e).await;
    let base = record(&store);
    assert_eq!(base.generation, 1);
    let racing = RacingStore {
        inner: store,
        raced: false.into(),
    };
    let mut machines = base.machines.clone();
    machines.get_mut("w-1").unwrap().ready = false;
    let observed = BTreeMap::from([(
        "home".to_string(),
        Observation {
            kubernetes_version: base.kubernetes_version.clone(),
            machines,
            preflight: base.preflight.clone(),
        },
    )]);
    let outcomes = refresh::write_observations(&racing, &observed).unwrap();
    // Seeded at 1; the racer enables rollouts (a gate: no generation move); the observed
    // change on top: 2.
    assert_eq!(
        outcomes,
        [("home".into(), Outcome::Changed { from: 1, to: 2 })]
    );
    let after = record(&racing.inner);
    assert!(after.rollouts_enabled, "the concurrent write is kept");
    assert!(!after.machines["w-1"].ready, "and so is the observation");
    assert_eq!(after.generation, 2);
    e.sim.shutdown().await;
}

#[tokio::test]
async fn the_refresh_loop_runs_on_start_and_when_kicked() {
    let e = env(quick_default()).await;
    let (p, store) = seeded(&e).await;
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(store);
    let kick = std::sync::Arc::new(tokio::sync::Notify::new());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(refresh::refresh_loop(
        store.clone(),
        p.creds.clone(),
        std::time::Duration::from_secs(3600),
        fast_refresh(),
        kick.clone(),
        move |report: &refresh::RefreshReport| {
            let _ = tx.send(report.clone());
        },
    ));
    let first = rx.recv().await.expect("a refresh on start");
    assert_eq!(
        outcome(&first, "home"),
        Outcome::Unchanged { generation: 1 }
    );
    // A change, then a kick (a rollout step finished): the loop refreshes at once.
    e.talos().reboot(&node("w-1")).await.unwrap();
    e.sim.talos.complete_boot("w-1").unwrap();
    kick.notify_one();
    let report = rx.recv().await.expect("a refresh after the kick");
    assert!(report.changed());
    assert_eq!(
        outcome(&report, "home"),
        Outcome::Changed { from: 1, to: 2 }
    );
    assert_eq!(record(store.as_ref()).generation, 2);
    task.abort();
    e.sim.shutdown().await;
}

/// A node's platform (`Version`), its schematic and its system extensions (the Node's
/// `extensions.talos.dev/` labels and annotations, as Talos publishes them) are observed, and
/// the plan resolves its Image Factory installer from them, or refuses an installer that
/// would strip the extensions, naming them.
#[tokio::test]
async fn the_platform_schematic_and_extensions_of_a_node_are_observed_and_planned_with() {
    const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
    let mut scenario = quick_default();
    for n in &mut scenario.nodes {
        n.talos = tv("v1.13.10");
        if n.name == "w-1" {
            n.platform = Some("aws".into());
            n.schematic = Some(SCHEMATIC.into());
            n.extensions = [
                ("iscsi-tools".to_string(), "v0.1.6".to_string()),
                // not a valid label value: Talos writes it as an annotation
                ("util-linux-tools".to_string(), "2.40.2+git".to_string()),
            ]
            .into();
        }
    }
    let e = env(scenario).await;
    let (_p, store) = seeded(&e).await;
    let rec = record(&store);
    let w1 = &rec.machines["w-1"];
    assert_eq!(w1.platform.as_deref(), Some("aws"));
    assert_eq!(w1.schematic.as_deref(), Some(SCHEMATIC));
    assert_eq!(
        w1.extensions,
        BTreeMap::from([
            ("iscsi-tools".to_string(), "v0.1.6".to_string()),
            ("util-linux-tools".to_string(), "2.40.2+git".to_string()),
        ])
    );
    let w2 = &rec.machines["w-2"];
    assert_eq!(w2.platform.as_deref(), Some("metal"));
    assert!(w2.extensions.is_empty() && w2.schematic.is_none(), "{w2:?}");
    // the Node carries them as Talos writes them: a label, and an annotation
    let node = {
        use medea::k8s::KubeApi as _;
        let nodes = e.kube().await.nodes().await.unwrap();
        nodes.into_iter().find(|n| n.name == "w-1").unwrap()
    };
    assert_eq!(
        node.labels
            .get("extensions.talos.dev/iscsi-tools")
            .map(String::as_str),
        Some("v0.1.6")
    );
    assert_eq!(
        node.annotations
            .get("extensions.talos.dev/util-linux-tools")
            .map(String::as_str),
        Some("2.40.2+git")
    );
    assert_eq!(
        node.annotations
            .get("extensions.talos.dev/schematic")
            .map(String::as_str),
        Some(SCHEMATIC)
    );

    let pools = |installer: &str| {
        format!(
            "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: home\nspec:\n  kubernetes:\n    version: v1.34.1\n---\napiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: cp\nspec:\n  cluster: home\n  role: controlplane\n  machines: [cp-1, cp-2, cp-3]\n  talos:\n    version: v1.13.10\n---\napiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: workers\nspec:\n  cluster: home\n  role: worker\n  machines: [w-1, w-2, w-3]\n  talos:\n    version: v1.14.6\n{installer}"
        )
    };
    let inventory = Inventory {
        clusters: [("home".to_string(), std::sync::Arc::new(rec.clone()))].into(),
    };
    // no installer named: each worker's own factory installer
    let desired = load_yaml("home.yaml", &pools(""));
    let p = plan::compute(&desired, &inventory, &applied_from(&desired), None).unwrap();
    let Step::Talos(t) = &p.clusters[0].steps[0] else {
        panic!("{:#?}", p.clusters[0].steps)
    };
    let images: BTreeMap<&str, &str> = t
        .waves
        .iter()
        .flatten()
        .map(|m| (m.node.as_str(), t.image_for(m)))
        .collect();
    assert_eq!(
        images["w-1"],
        format!("factory.talos.dev/aws-installer/{SCHEMATIC}:v1.14.6")
    );
    let empty = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";
    for n in ["w-2", "w-3"] {
        assert_eq!(
            images[n],
            format!("factory.talos.dev/metal-installer/{empty}:v1.14.6")
        );
    }
    // an installer without them: refused, naming them
    let desired = load_yaml(
        "home.yaml",
        &pools("    installerImage: ghcr.io/siderolabs/installer\n"),
    );
    let errs = plan::compute(&desired, &inventory, &applied_from(&desired), None).unwrap_err();
    assert!(
        errs.iter().any(|d| d.message
            == "installer image `ghcr.io/siderolabs/installer` would drop Image Factory schematic ce4c980550dd that machine `w-1` runs, and with it its system extensions iscsi-tools v0.1.6, util-linux-tools 2.40.2+git"),
        "{errs:#?}"
    );
}
