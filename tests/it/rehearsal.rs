//! Issue #36 item 4 (rehearsal on a twin) and item 6's first proof line: a rehearsal predicts
//! the PodDisruptionBudget block the real run then hits, at the same node.
//!
//! The "real" cluster is a `SimCluster` (the default scenario: 3 control planes, 3 workers,
//! `web` behind a PDB), seeded into a fjall store as `medea seed` does, with rollouts enabled
//! and its census gathered with `ops::census::gather` and stored where the refresh stores it.
//! The desired state is the seed's YAML with the workers pool moved to the next patch. The
//! rehearsal runs in this process on a twin (`ops::rehearse`); the real run is the daemon's
//! path: the stored plan, `create_jobs_txn`, the executor through the real adapters.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use medea::cli::seed::{SeedRequest, seed};
use medea::desired::source::SourceFile;
use medea::desired::{Desired, Snapshot};
use medea::inventory::census::census_key;
use medea::inventory::{Inventory, ObservedCluster, cluster_key};
use medea::ops::rehearse::{self, Input, Settings};
use medea::plan::estimate::History;
use medea::plan::stored::{CURRENT_KEY, plan_key};
use medea::plan::{Plan, Step};
use medea::rehearsal::report::{BlockerKind, Outcome, Rehearsal};
use medea::rollout::sequencer::HaltCode;
use medea::rollout::{
    Executor, ExecutorConfig, JobInputs, RunOutcome, SystemClock, create_jobs_txn,
};
use medea::sim::talos::scenario::WorkloadSpec;
use medea::sim::talos::{RebootTiming, Scenario, Timing};
use medea::store::fjall::FjallStore;
use medea::store::{Store, StoreExt as _, Table, Txn};

use crate::sim_cluster::{Env, env, fast_refresh};

const CLUSTER: &str = "home";
const FROM: &str = "v1.12.11";
const TO: &str = "v1.12.12";

/// The default scenario with quick pods and reboots, and `extra` workloads.
fn scenario(extra: Vec<WorkloadSpec>) -> Scenario {
    let mut s = Scenario::default_cluster();
    s.timing = Timing {
        reboot: RebootTiming::After(Duration::from_millis(300)),
        image_pull: Duration::from_millis(20),
        pod_start: Duration::from_millis(100),
        pod_termination: Duration::from_millis(50),
        ..Timing::default()
    };
    s.workloads.extend(extra);
    s
}

/// A workload of one pod whose budget allows no disruption.
fn db() -> WorkloadSpec {
    WorkloadSpec {
        name: "db".into(),
        namespace: "default".into(),
        replicas: 1,
        pdb_min_available: Some(1),
    }
}

/// Poll `done` until it holds: each poll is progress; at most 60 s of them.
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every pod Ready and every PodDisruptionBudget counting its pods healthy.
async fn settled(e: &Env, pdbs: &[&str]) {
    wait_until("the pods and the budgets", || {
        let pods = e.sim.kube.pods();
        pods.iter().all(|p| p.ready || p.terminating || p.mirror)
            && pdbs.iter().all(|name| {
                let pdb = e
                    .sim
                    .kube
                    .get("policy/v1", "PodDisruptionBudget", "default", name);
                let status = pdb.as_ref().and_then(|p| p.get("status"));
                let n = |f: &str| status.and_then(|s| s[f].as_i64());
                n("expectedPods").is_some_and(|x| x > 0) && n("currentHealthy") == n("expectedPods")
            })
    })
    .await;
}

/// The seed's YAML with the workers pool moved to [`TO`], drained with a short timeout.
fn upgrade_workers(yaml: &str) -> String {
    yaml.split("\n---\n")
        .map(|doc| {
            if doc.contains("kind: NodePool") && doc.contains("  name: workers\n") {
                let doc = doc.replace(&format!("version: {FROM}"), &format!("version: {TO}"));
                format!(
                    "{}\n  rollout:\n    maxUnavailable: 1\n    drainTimeout: 2s\n",
                    doc.trim_end()
                )
            } else {
                doc.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n---\n")
}

fn load_desired(yaml: &str) -> Desired {
    let loaded = medea::desired::parse_snapshot(Snapshot {
        files: vec![SourceFile {
            path: "home.yaml".into(),
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

/// The "real" cluster, seeded and censused, and the desired state that upgrades its workers.
struct World {
    e: Env,
    store_path: PathBuf,
    creds: PathBuf,
    yaml: String,
}

async fn world(extra: Vec<WorkloadSpec>, pdbs: &[&str]) -> World {
    let e = env(scenario(extra)).await;
    settled(&e, pdbs).await;
    let store_path = e.dir.path().join("state/store");
    let creds = e.dir.path().join("state/creds");
    let yaml = {
        let store = FjallStore::open(&store_path).unwrap();
        let seeded = seed(
            &store,
            &SeedRequest {
                cluster: CLUSTER.into(),
                talosconfig: e.creds.talosconfig.clone(),
                kubeconfig: e.creds.kubeconfig.clone(),
                creds_dir: creds.clone(),
                force: false,
                settings: fast_refresh(),
                approvals: Default::default(),
                record_as_applied: true,
            },
        )
        .await
        .unwrap();
        // What `medea cluster enable-rollouts home` does.
        store
            .commit(Txn::new().put_record(
                cluster_key(CLUSTER),
                &seeded.cluster.with_rollouts_enabled(true),
            ))
            .unwrap();
        // The census, stored where the refresh stores it.
        let census = medea::ops::census::gather(&e.kube().await, jiff::Timestamp::now()).await;
        assert!(
            census.gather_errors.is_empty(),
            "{:?}",
            census.gather_errors
        );
        store
            .commit(Txn::new().put_record(census_key(CLUSTER), &census))
            .unwrap();
        upgrade_workers(&seeded.desired_yaml)
    };
    World {
        e,
        store_path,
        creds,
        yaml,
    }
}

/// The talos steps' waves of `plan`'s only cluster, as node names.
fn plan_waves(plan: &Plan) -> Vec<Vec<String>> {
    plan.clusters[0]
        .steps
        .iter()
        .flat_map(|s| match s {
            Step::Talos(t) => t
                .waves
                .iter()
                .map(|w| w.iter().map(|m| m.node.clone()).collect())
                .collect::<Vec<Vec<String>>>(),
            Step::Kubernetes(_) => Vec::new(),
        })
        .collect()
}

fn fast() -> Settings {
    Settings {
        compression: 120,
        ..Settings::default()
    }
}

/// The node the `db` pod runs on.
fn db_node(e: &Env) -> String {
    let on: Vec<String> = e
        .sim
        .kube
        .pods()
        .into_iter()
        .filter(|p| p.namespace == "default" && p.name.starts_with("db-") && !p.terminating)
        .filter_map(|p| p.node)
        .collect();
    assert_eq!(on.len(), 1, "one db pod: {on:?}");
    on[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rehearsal_predicts_the_pdb_block_the_real_run_then_hits_at_the_same_node() {
    let w = world(vec![db()], &["web-pdb", "db-pdb"]).await;
    let x = db_node(&w.e);
    assert!(x.starts_with("w-"), "the db pod runs on a worker: {x}");
    let store = Arc::new(FjallStore::open(&w.store_path).unwrap());
    let desired = load_desired(&w.yaml);
    let replanned = medea::ops::replan::replan(store.as_ref(), &desired).unwrap();
    let plan = replanned.plan;
    assert_eq!(
        plan_waves(&plan),
        [["w-1"], ["w-2"], ["w-3"]],
        "one worker at a time"
    );

    // The rehearsal.
    let reports = rehearse::rehearse_plan(
        Some(store.as_ref()),
        &plan,
        &replanned.inventory,
        &desired,
        &fast(),
    )
    .await
    .unwrap();
    assert_eq!(reports.len(), 1);
    let r = &reports[0];
    let Outcome::Halted { code, node, .. } = &r.outcome else {
        panic!("the twin's run halts: {r:#?}");
    };
    assert_eq!(code, HaltCode::DrainBlocked.as_str(), "{r:#?}");
    let pdb = r
        .blockers
        .iter()
        .find(|b| b.kind == BlockerKind::Pdb)
        .unwrap_or_else(|| panic!("a PDB blocker: {r:#?}"));
    let predicted = pdb.node.clone().expect("the blocker names its node");
    assert_eq!(node.as_deref(), Some(predicted.as_str()));
    assert!(pdb.detail.contains("db"), "{}", pdb.detail);
    assert!(!r.census_gathered_at.is_empty(), "the census was used");

    // The real run, the daemon's way: the stored plan becomes a job, the executor runs it.
    let inventory = Inventory::load(store.as_ref()).unwrap();
    let observed: &ObservedCluster = &inventory.clusters[CLUSTER];
    let none: &[medea::desired::window::MaintenanceWindow] = &[];
    let created = create_jobs_txn(
        &plan,
        &JobInputs {
            global_rollouts: true,
            clusters: [(CLUSTER.to_string(), observed)].into(),
            windows: [(CLUSTER.to_string(), none)].into(),
            exclusions: Default::default(),
            backup_recipients: Default::default(),
        },
        jiff::Timestamp::now(),
    )
    .unwrap();
    store.commit(created.txn).unwrap();
    let job = created.jobs[0].id.clone();
    let tick = Duration::from_millis(10);
    let (talos, kube) = medea::ops::cluster_ports::paced(&w.creds, CLUSTER, tick)
        .await
        .unwrap();
    let mut cfg = ExecutorConfig::new(true, w.e.dir.path().join("snapshots"));
    cfg.poll = tick;
    cfg.backoff_min = tick;
    cfg.backoff_max = tick * 8;
    let store_dyn: Arc<dyn Store> = store.clone();
    let exec = Executor::new(store_dyn, talos, kube, SystemClock, cfg);
    let out = exec.run(&job).await.unwrap();
    let RunOutcome::Halted { reason, node, .. } = &out else {
        panic!("the real run halts: {out:?}");
    };
    assert_eq!(reason.code(), HaltCode::DrainBlocked, "{out:?}");
    let real = node.clone().expect("the halt names its node");
    assert_eq!(
        predicted, real,
        "the rehearsal named the node the real run halted at"
    );
    assert_eq!(real, x, "the node holding the budget's pod");
    w.e.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rehearsal_without_blockers_completes_wave_by_wave_and_never_touches_the_plan() {
    let w = world(vec![], &["web-pdb"]).await;
    let store = FjallStore::open(&w.store_path).unwrap();
    let desired = load_desired(&w.yaml);
    let replanned = medea::ops::replan::replan(&store, &desired).unwrap();
    let plan = replanned.plan;
    let plan_bytes = store.get(Table::Plans, &plan_key(&plan.id)).unwrap();
    let current = store.get(Table::Plans, CURRENT_KEY).unwrap();
    assert!(plan_bytes.is_some() && current.is_some());

    let reports =
        rehearse::rehearse_plan(Some(&store), &plan, &replanned.inventory, &desired, &fast())
            .await
            .unwrap();
    assert_eq!(reports.len(), 1);
    let r = &reports[0];
    assert!(
        matches!(r.outcome, Outcome::Completed { total_secs } if total_secs > 0),
        "{r:#?}"
    );
    assert!(r.blockers.is_empty(), "{r:#?}");
    let waves: Vec<Vec<String>> = r.waves.iter().map(|w| w.nodes.clone()).collect();
    assert_eq!(
        waves,
        plan_waves(&plan),
        "a timeline entry per wave of the plan"
    );
    assert!(
        r.waves
            .iter()
            .all(|w| w.step == "talos workers" && w.duration_secs.is_some()),
        "{r:#?}"
    );
    assert!(
        r.waves
            .windows(2)
            .all(|p| p[0].start_secs <= p[1].start_secs),
        "in order: {r:#?}"
    );
    assert_eq!(r.plan, plan.id.to_hex());

    rehearse::store_report(&store, r).unwrap();
    assert_eq!(
        rehearse::load_report(&store, &plan.id, CLUSTER)
            .unwrap()
            .as_ref(),
        Some(r)
    );
    assert_eq!(
        store.get(Table::Plans, &plan_key(&plan.id)).unwrap(),
        plan_bytes,
        "the plan's record is byte-identical"
    );
    assert_eq!(
        store.get(Table::Plans, CURRENT_KEY).unwrap(),
        current,
        "the plan is still current"
    );
    // Planning again gives the same plan: the report is beside it, not in it.
    let again = medea::ops::replan::replan(&store, &desired).unwrap();
    assert_eq!(again.plan.id, plan.id);
    assert!(!again.stored);
    w.e.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_that_cannot_start_is_not_run_never_a_pass() {
    let w = world(vec![], &["web-pdb"]).await;
    let store = FjallStore::open(&w.store_path).unwrap();
    let desired = load_desired(&w.yaml);
    let replanned = medea::ops::replan::replan(&store, &desired).unwrap();
    // The control planes did not answer the last refresh: the twin has no control plane,
    // and a simulated cluster without one does not start.
    let mut observed = (*replanned.inventory.clusters[CLUSTER]).clone();
    for m in observed.machines.values_mut() {
        if m.role == medea::inventory::MachineRole::Controlplane {
            m.talos_version = None;
        }
    }
    let r: Rehearsal = rehearse::rehearse(
        Input {
            plan: &replanned.plan,
            cluster: &replanned.plan.clusters[0],
            observed: &observed,
            census: None,
            history: &History::default(),
            windows: &[],
        },
        &fast(),
    )
    .await;
    let Outcome::NotRun { reason } = &r.outcome else {
        panic!("not a pass: {r:#?}");
    };
    assert!(reason.contains("the twin could not start"), "{reason}");
    assert!(
        reason.contains("controlplane"),
        "the cause is kept: {reason}"
    );
    assert!(r.waves.is_empty() && r.blockers.is_empty(), "{r:#?}");
    assert!(
        r.limits
            .iter()
            .any(|l| l.contains("cp-1") && l.contains("left out")),
        "{:?}",
        r.limits
    );
    assert!(
        r.limits.iter().any(|l| l.contains("no census")),
        "nodes only, said: {:?}",
        r.limits
    );
    let text = medea::rehearsal::render::text(&r);
    assert!(text.contains("NOT RUN (not a pass)"), "{text}");
    w.e.sim.shutdown().await;
}

/// `medea plan DIR --store S --rehearse` (the daemon stopped).
fn plan_cli(dir: &Path, store: &Path, extra: &[&str]) -> std::process::Output {
    crate::cli::medea()
        .arg("plan")
        .arg(dir)
        .arg("--store")
        .arg(store)
        .args(extra)
        .env("NO_COLOR", "1")
        .env_remove("MEDEA_STORE")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn medea_plan_rehearse_prints_the_report_after_the_plan_and_stores_it() {
    let w = world(vec![], &["web-pdb"]).await;
    let dir = w.e.dir.path().join("desired");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("home.yaml"), &w.yaml).unwrap();

    let out = plan_cli(
        &dir,
        &w.store_path,
        &["--rehearse", "--rehearse-compression", "120"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "changes: {stdout}\n{stderr}");
    let plan_at = stdout
        .find("talos v1.12.11 → v1.12.12")
        .unwrap_or_else(|| panic!("{stdout}"));
    let rehearsal_at = stdout
        .find("rehearsal of plan ")
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        plan_at < rehearsal_at,
        "the report follows the plan: {stdout}"
    );
    for want in [
        "on a twin of cluster home (advice, not part of the plan id)",
        "outcome: completed: predicted ",
        "talos workers wave 1:",
        "talos workers wave 3:",
        "blockers: none met",
        "report stored beside the plan (rehearsal/",
    ] {
        assert!(stdout.contains(want), "{want:?} in:\n{stdout}");
    }

    // Stored beside the current plan.
    let id = {
        let store = FjallStore::open(&w.store_path).unwrap();
        let current: medea::plan::stored::CurrentPlan =
            store.get_record(CURRENT_KEY).unwrap().unwrap();
        let stored = rehearse::load_report(&store, &current.id, CLUSTER)
            .unwrap()
            .expect("the report is stored");
        assert!(
            matches!(stored.outcome, Outcome::Completed { .. }),
            "{stored:#?}"
        );
        current.id
    };

    // JSON: the plan's document unchanged, beside the rehearsals.
    let plain = plan_cli(&dir, &w.store_path, &["-o", "json"]);
    assert_eq!(plain.status.code(), Some(2));
    let plain: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    let out = plan_cli(
        &dir,
        &w.store_path,
        &["-o", "json", "--rehearse", "--rehearse-compression", "120"],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(doc["plan"], plain, "the plan's JSON as without --rehearse");
    let one = &doc["rehearsals"][0];
    assert_eq!(one["stored"], true);
    assert_eq!(one["report"]["plan"], id.to_hex());
    assert_eq!(one["report"]["cluster"], CLUSTER);
    assert_eq!(one["report"]["outcome"]["kind"], "completed");
    assert_eq!(one["report"]["waves"].as_array().map(Vec::len), Some(3));

    // Planned against another inventory: rehearsed, not stored, and it says so.
    let mut inventory = String::from(
        "clusters:\n  - name: home\n    kubernetesVersion: v1.34.1\n    generation: 99\n    rolloutsEnabled: true\n    machines:\n",
    );
    for (i, (node, role)) in [
        ("cp-1", "controlplane"),
        ("cp-2", "controlplane"),
        ("cp-3", "controlplane"),
        ("w-1", "worker"),
        ("w-2", "worker"),
        ("w-3", "worker"),
    ]
    .iter()
    .enumerate()
    {
        inventory.push_str(&format!(
            "      - {{node: {node}, address: 127.5.0.{}, role: {role}, talosVersion: {FROM}, kubeletVersion: v1.34.1}}\n",
            i + 2
        ));
    }
    let file = w.e.dir.path().join("inventory.yaml");
    std::fs::write(&file, inventory).unwrap();
    let out = plan_cli(
        &dir,
        &w.store_path,
        &[
            "--observed",
            file.to_str().unwrap(),
            "--rehearse",
            "--rehearse-compression",
            "120",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("not stored: the observed inventory given differs"),
        "{stderr}"
    );
    assert!(stdout.contains("outcome: completed"), "{stdout}");
    assert!(
        stdout.contains("report not stored: the plan is not stored"),
        "{stdout}"
    );
    let store = FjallStore::open(&w.store_path).unwrap();
    let rehearsals = store.scan_keys(Table::Plans, "rehearsal/").unwrap();
    assert_eq!(
        rehearsals,
        [format!("rehearsal/{}/{CLUSTER}", id.to_hex())],
        "only the stored plan's report"
    );
    // Without the desired state and a store, `--rehearse` asks the server to rehearse its
    // current plan (`RehearsePlan`; tested in `server::plans`).
    if std::env::var_os("REHEARSAL_SHOW").is_some() {
        eprintln!("{stdout}");
    }
    w.e.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_journal_stops_moving_within_its_bound_is_not_run_never_a_pass() {
    let w = world(vec![], &["web-pdb"]).await;
    let store = FjallStore::open(&w.store_path).unwrap();
    let desired = load_desired(&w.yaml);
    let replanned = medea::ops::replan::replan(&store, &desired).unwrap();
    // 10×: a twin node's pull takes 6 s of no journal entry, longer than the bound of no
    // progress given here (the computed one is longer than any wait of the plan).
    let settings = Settings {
        compression: 10,
        stall_bound: Some(Duration::from_millis(1500)),
        ..Settings::default()
    };
    let reports = rehearse::rehearse_plan(
        Some(&store),
        &replanned.plan,
        &replanned.inventory,
        &desired,
        &settings,
    )
    .await
    .unwrap();
    let r = &reports[0];
    let Outcome::NotRun { reason } = &r.outcome else {
        panic!("not a pass: {r:#?}");
    };
    assert!(
        reason.contains("did not end") && reason.contains("did not move for 1500 ms"),
        "{reason}"
    );
    assert!(
        r.waves.iter().all(|w| w.duration_secs.is_none()),
        "no wave finished: {r:#?}"
    );
    w.e.sim.shutdown().await;
}
