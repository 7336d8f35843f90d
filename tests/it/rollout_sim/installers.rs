//! Installers that exist (issue #48 items 1 and 6): a cluster built with talosctl <= 1.13
//! (`ghcr.io/siderolabs/installer` in `machine.install.image`) is seeded, planned to Talos
//! v1.14.6 and rolled out over the real adapters against the simulator, whose registry has no
//! ghcr tag from v1.14.0; each node gets its own Image Factory installer, a SecureBoot node the
//! SecureBoot one.

use super::*;
use medea::cli::seed::{SeedRequest, seed};
use medea::desired::source::{Snapshot, SourceFile};
use medea::inventory::Inventory;
use medea::plan::applied::{AppliedResource, LastApplied};
use medea::rollout::fake::MemStore;

const EMPTY: &str = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

/// One control plane and two workers on Talos v1.13.10 as talosctl 1.13 configured them; w-2
/// booted with SecureBoot.
async fn talosctl_1_13_cluster(dir: &Path) -> Sim {
    let mut scenario = Scenario::uniform(1, 2, tv("v1.13.10"), KubeVersion::parse(KUBE).unwrap());
    for n in &mut scenario.nodes {
        n.secure_boot = n.name == "w-2";
    }
    Sim::start_scenario(dir, scenario, KubeSimConfig::default()).await
}

fn load(yaml: &str) -> medea::desired::Desired {
    let loaded = medea::desired::parse_snapshot(Snapshot {
        files: vec![SourceFile {
            path: "prod.yaml".into(),
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

fn applied_from(desired: &medea::desired::Desired) -> LastApplied {
    let mut rs = Vec::new();
    for c in desired.clusters.values() {
        rs.push(AppliedResource::of_cluster(c));
        rs.extend(c.pools.values().map(|p| AppliedResource::of_pool(p)));
    }
    LastApplied::from_resources(rs)
}

/// `medea seed` against the simulator: the observed cluster and the YAML it wrote.
async fn seeded(sim: &Sim, dir: &Path) -> (ObservedCluster, String) {
    let store = MemStore::new();
    let s = seed(
        &store,
        &SeedRequest {
            cluster: CLUSTER.into(),
            talosconfig: sim.creds.join(CLUSTER).join("talosconfig"),
            kubeconfig: sim.creds.join(CLUSTER).join("kubeconfig"),
            creds_dir: dir.join("seeded"),
            force: false,
            settings: Default::default(),
            approvals: Default::default(),
            record_as_applied: true,
        },
    )
    .await
    .unwrap();
    (s.cluster.with_rollouts_enabled(true), s.desired_yaml)
}

/// Run `plan`'s job to its end over the real adapters.
async fn run_plan(
    sim: &Sim,
    dir: &Path,
    plan: &medea::plan::Plan,
    obs: &ObservedCluster,
) -> RunOutcome {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let job = install(store.as_ref(), plan, obs, &[]).unwrap();
    let (talos, kube) = adapters(sim).await;
    let mut cfg = ExecutorConfig::new(true, dir.join("snapshots"));
    cfg.poll = Duration::from_millis(20);
    cfg.backoff_min = Duration::from_millis(20);
    cfg.backoff_max = Duration::from_millis(160);
    cfg.max_sleep = Duration::from_secs(1);
    let exec = Executor::new(store, talos, kube, SystemClock, cfg);
    tokio::time::timeout(Duration::from_secs(120), exec.run(&job))
        .await
        .expect("the rollout ends within two minutes")
        .unwrap()
}

/// The one change a person makes to the seeded YAML: every pool to Talos v1.14.6.
fn to_1_14_6(yaml: &str) -> String {
    assert!(yaml.contains("    version: v1.13.10\n"), "{yaml}");
    yaml.replace("    version: v1.13.10\n", "    version: v1.14.6\n")
}

/// What today's seed wrote (before issue #48): the observed ghcr repository, named.
fn as_seed_wrote_it(yaml: &str) -> String {
    yaml.replace(
        "  talos:\n    version: v1.14.6\n",
        "  talos:\n    version: v1.14.6\n    installerImage: ghcr.io/siderolabs/installer\n",
    )
}

/// The failure of issue #48 on the simulator: a job whose installer is
/// `ghcr.io/siderolabs/installer:v1.14.6` (what a pool seeded with ghcr planned) halts at the
/// first node's pull, as a real cluster does, with nothing installed.
#[tokio::test]
async fn a_job_naming_ghcr_for_talos_1_14_halts_at_the_first_pull() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start_from(dir.path(), 1, 2, KubeSimConfig::default(), "v1.13.10").await;
    let mut step = sim.step("workers", &[&["w-1"], &["w-2"]], 1, (30, 30));
    if let Step::Talos(t) = &mut step {
        t.to = tv("v1.14.6");
        t.image = "ghcr.io/siderolabs/installer:v1.14.6".into();
    }
    let run = run_for(&sim, dir.path(), vec![step]).await;
    let out = run.go().await;
    let reason = halted(&out).to_string();
    assert!(reason.contains("error pulling image"), "{reason}");
    assert!(
        matches!(&out, RunOutcome::Halted { node: Some(n), .. } if n == "w-1"),
        "{out:?}"
    );
    for n in ["w-1", "w-2"] {
        let s = sim.talos.node_state(n).unwrap();
        assert_eq!(
            (s.running.clone(), s.installed.clone()),
            (tv("v1.13.10"), None),
            "{n}"
        );
        assert_eq!(sim.upgrades(n), 0, "{n}: the installer never ran");
    }
}

/// Issue #48's "done when": seeded from a talosctl-1.13-style config, the cluster rolls to
/// v1.14.6 with each node's own factory installer (the SecureBoot node's SecureBoot one), end to
/// end: seed, plan, job, executor over the real adapters. The YAML today's seed wrote is refused
/// at plan time, naming each node's factory installer.
#[tokio::test]
async fn a_cluster_seeded_from_a_talosctl_1_13_config_rolls_to_1_14_6_with_factory_installers() {
    let dir = tempfile::tempdir().unwrap();
    let sim = talosctl_1_13_cluster(dir.path()).await;
    let (observed, yaml) = seeded(&sim, dir.path()).await;
    let w2 = &observed.machines["w-2"];
    assert_eq!(
        (w2.secure_boot, w2.installer_image.as_deref()),
        (Some(true), Some("ghcr.io/siderolabs/installer:v1.13.10"))
    );
    assert!(!yaml.contains("installerImage"), "{yaml}");
    let applied = applied_from(&load(&yaml));
    let inventory = Inventory {
        clusters: [(CLUSTER.to_string(), Arc::new(observed.clone()))].into(),
    };

    // what seed wrote before: refused, with each node's own installer in the help
    let old = load(&as_seed_wrote_it(&to_1_14_6(&yaml)));
    let errs = medea::plan::compute(&old, &inventory, &applied, None).unwrap_err();
    let unpublished: Vec<_> = errs
        .iter()
        .filter(|d| d.code == medea::plan::compute::codes::INSTALLER_UNPUBLISHED)
        .collect();
    assert_eq!(unpublished.len(), 2, "one per pool: {errs:#?}");
    let help: String = unpublished.iter().filter_map(|d| d.help.clone()).collect();
    assert!(
        help.contains(&format!(
            "`factory.talos.dev/metal-installer-secureboot/{EMPTY}` for w-2"
        )),
        "{help}"
    );

    let desired = load(&to_1_14_6(&yaml));
    let plan = medea::plan::compute(&desired, &inventory, &applied, None).unwrap();
    let out = run_plan(&sim, dir.path(), &plan, &observed).await;
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    for (n, installer) in [
        (
            "cp-1",
            format!("factory.talos.dev/metal-installer/{EMPTY}:v1.14.6"),
        ),
        (
            "w-1",
            format!("factory.talos.dev/metal-installer/{EMPTY}:v1.14.6"),
        ),
        (
            "w-2",
            format!("factory.talos.dev/metal-installer-secureboot/{EMPTY}:v1.14.6"),
        ),
    ] {
        let s = sim.talos.node_state(n).unwrap();
        assert_eq!(
            (s.power, s.running.clone()),
            (medea::sim::talos::Power::Up, tv("v1.14.6")),
            "{n}"
        );
        assert_eq!(s.pulled_images, [installer], "{n}");
    }
}
