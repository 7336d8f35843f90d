//! The rollout executor through the real adapters (`talos::adapter`, `k8s::adapter`) against the simulator:
//! the Talos side over gRPC/mTLS, the kube side over HTTPS, exactly as against a real cluster.
//!
//! - the adapters' observations (`next_boot` from systemd-boot's `LoaderEntryDefault`, GRUB
//!   nodes that cannot tell) and their metrics;
//! - the fault matrix of issue 6: a node that never returns, a silent revert, an installer
//!   exit code, a PDB that never allows, a broken etcd snapshot, Talos `UNAVAILABLE` bursts,
//!   the kube-apiserver away during a control-plane reboot;
//! - the crash harness of `rollout::crash` on the simulator: a child `medea __rollout-run
//!   --creds-dir … --cluster prod` killed with `abort()` at journal points, restarted, and
//!   the simulator's counters checked (see `killed_at_journal_points_…` for which points run).
//!
//! The simulator runs in the test process (it survives the child), with real sockets and real
//! time; reboots take 30 ms so the executor's waits are exercised.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use medea::inventory::{Machine, MachineRole, ObservedCluster};
use medea::k8s::adapter::KubeAdapter;
use medea::k8s::{ClientOptions, DrainOptions};
use medea::plan::{MachineTarget, Step, TalosRollout};
use medea::rollout::executor::{EventState, RolloutEvent};
use medea::rollout::fake::MemStore;
use medea::rollout::journal::{Entry, JournalEntry, entries_prefix};
use medea::rollout::ports::{NextBoot, NodeTarget, TalosPort, UpgradeMethod};
use medea::rollout::sequencer::{CommandOp, HaltCode, HaltReason, Job, JobState};
use medea::rollout::{Executor, ExecutorConfig, RunOutcome, SystemClock};
use medea::sim::kube::{KubeFault, KubeSim, KubeSimConfig, Outage};
use medea::sim::talos::{
    Bootloader, Effect, FaultPlan, Method, RebootTiming, Scenario, SimTalos, Trigger,
};
use medea::store::fjall::FjallStore;
use medea::store::{Store, StoreExt};
use medea::talos::adapter::TalosAdapter;
use medea::talos::{ClientSettings, RetryPolicy};
use medea::version::{KubeVersion, TalosVersion};

use crate::rollout::crash::{CrashWorld, Summary, check as check_rolled_out, scratch};
use crate::rollout::{CLUSTER, FROM, KUBE, TO, install, plan};

fn tv(s: &str) -> TalosVersion {
    TalosVersion::parse(s).unwrap()
}

const REBOOT: Duration = Duration::from_millis(30);

/// A simulated cluster (both sides) and the credentials directory that reaches it (also used
/// by the HA tests in `ha.rs`).
pub(crate) struct Sim {
    pub(crate) talos: SimTalos,
    pub(crate) kube: Arc<KubeSim>,
    pub(crate) names: Vec<String>,
    /// `<dir>/creds`: `prod/talosconfig` and `prod/kubeconfig`.
    pub(crate) creds: PathBuf,
}

impl Sim {
    pub(crate) async fn start(dir: &Path, cps: usize, workers: usize, kube: KubeSimConfig) -> Sim {
        Sim::start_from(dir, cps, workers, kube, FROM).await
    }

    /// [`Sim::start`] with every node on Talos `from`.
    pub(crate) async fn start_from(
        dir: &Path,
        cps: usize,
        workers: usize,
        kube: KubeSimConfig,
        from: &str,
    ) -> Sim {
        Sim::start_timed(dir, cps, workers, kube, from, |_| {}).await
    }

    /// [`Sim::start_from`] with the scenario's timing adjusted by `tune`.
    pub(crate) async fn start_timed(
        dir: &Path,
        cps: usize,
        workers: usize,
        kube: KubeSimConfig,
        from: &str,
        tune: impl FnOnce(&mut medea::sim::talos::Timing),
    ) -> Sim {
        let scenario = Scenario::uniform(cps, workers, tv(from), KubeVersion::parse(KUBE).unwrap());
        Sim::start_scenario_tuned(dir, scenario, kube, tune).await
    }

    /// [`Sim::start`] for a scenario of the caller's (reboots take [`REBOOT`]).
    pub(crate) async fn start_scenario(dir: &Path, scenario: Scenario, kube: KubeSimConfig) -> Sim {
        Sim::start_scenario_tuned(dir, scenario, kube, |_| {}).await
    }

    /// [`Sim::start_scenario`], then `tune` the timing (after the reboot time is set).
    pub(crate) async fn start_scenario_tuned(
        dir: &Path,
        mut scenario: Scenario,
        kube: KubeSimConfig,
        tune: impl FnOnce(&mut medea::sim::talos::Timing),
    ) -> Sim {
        scenario.timing.reboot = RebootTiming::After(REBOOT);
        tune(&mut scenario.timing);
        let names = scenario.nodes.iter().map(|n| n.name.clone()).collect();
        let talos = SimTalos::start(scenario, "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let kube = medea::sim::kube::start(
            KubeSimConfig {
                refresh_interval: Duration::from_millis(20),
                ..kube
            },
            Arc::new(talos.clone()),
        )
        .await
        .unwrap();
        let creds = dir.join("creds");
        talos.write_talosconfig(&creds.join(CLUSTER)).unwrap();
        kube.write_kubeconfig(&creds.join(CLUSTER).join("kubeconfig"), CLUSTER)
            .unwrap();
        Sim {
            talos,
            kube: Arc::new(kube),
            names,
            creds,
        }
    }

    pub(crate) fn observed(&self) -> ObservedCluster {
        let machines = self
            .names
            .iter()
            .map(|name| {
                let n = self.talos.node_state(name).unwrap();
                let role = match n.role {
                    medea::sim::talos::Role::Controlplane => MachineRole::Controlplane,
                    medea::sim::talos::Role::Worker => MachineRole::Worker,
                };
                (
                    name.clone(),
                    Machine {
                        node: name.clone(),
                        id: format!("id-{name}"),
                        address: n.address.clone(),
                        role,
                        talos_version: Some(n.running.clone()),
                        installer_image: None,
                        schematic: None,
                        platform: None,
                        extensions: BTreeMap::new(),
                        kubelet_version: Some(KubeVersion::parse(KUBE).unwrap()),
                        ready: true,
                        cordoned: false,
                        reachable: true,
                        boot_id: Some(n.boot_id.clone()),
                        labels: BTreeMap::new(),
                    },
                )
            })
            .collect();
        ObservedCluster::new(CLUSTER)
            .observe(None, machines)
            .with_rollouts_enabled(true)
    }

    /// A Talos pool step to [`TO`] over `waves` of node names.
    pub(crate) fn step(
        &self,
        pool: &str,
        waves: &[&[&str]],
        max: u32,
        timeouts: (u64, u64),
    ) -> Step {
        let role = match self.talos.node_state(waves[0][0]).unwrap().role {
            medea::sim::talos::Role::Controlplane => MachineRole::Controlplane,
            medea::sim::talos::Role::Worker => MachineRole::Worker,
        };
        Step::Talos(TalosRollout {
            health: None,
            pool: pool.into(),
            role,
            hop: 1,
            hops: 1,
            to: tv(TO),
            image: format!("factory.talos.dev/installer/abc:{TO}"),
            max_unavailable: max,
            drain_timeout: Duration::from_secs(timeouts.0),
            health_timeout: Duration::from_secs(timeouts.1),
            upgrade_attempts: medea::desired::model::DEFAULT_UPGRADE_ATTEMPTS,
            drain: medea::desired::model::DrainPolicy::default(),
            waves: waves
                .iter()
                .map(|w| {
                    w.iter()
                        .map(|n| {
                            let s = self.talos.node_state(n).unwrap();
                            MachineTarget {
                                node: n.to_string(),
                                id: format!("id-{n}"),
                                address: s.address,
                                from: s.running,
                                image: None,
                            }
                        })
                        .collect()
                })
                .collect(),
        })
    }

    /// The 3 + 3 rollout of the crash harness: control planes one by one, workers two at a time.
    fn mixed(&self) -> Vec<Step> {
        vec![
            self.step(
                "control-plane",
                &[&["cp-1"], &["cp-2"], &["cp-3"]],
                1,
                (600, 900),
            ),
            self.step("workers", &[&["w-1", "w-2"], &["w-3"]], 2, (600, 900)),
        ]
    }

    pub(crate) fn upgrades(&self, node: &str) -> u64 {
        self.talos.counters(node).unwrap().upgrades()
    }
    pub(crate) fn reboots(&self, node: &str) -> u64 {
        self.talos.counters(node).unwrap().calls(Method::Reboot)
    }
    pub(crate) fn snapshots(&self) -> u64 {
        self.names
            .iter()
            .map(|n| self.talos.counters(n).unwrap().calls(Method::EtcdSnapshot))
            .sum()
    }
    pub(crate) fn cordoned(&self, node: &str) -> bool {
        self.kube.unschedulable(node).unwrap()
    }
}

fn quick_talos() -> ClientSettings {
    ClientSettings {
        connect_timeout: Duration::from_secs(3),
        request_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            min_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(80),
            max_attempts: 4,
        },
        ..ClientSettings::default()
    }
}

fn quick_kube() -> ClientOptions {
    ClientOptions {
        retry: medea::k8s::RetryPolicy {
            attempts: 4,
            min_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(80),
        },
        ..ClientOptions::default()
    }
}

fn quick_drain() -> DrainOptions {
    DrainOptions {
        min_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        poll_interval: Duration::from_millis(20),
        ..DrainOptions::default()
    }
}

pub(crate) async fn adapters(sim: &Sim) -> (TalosAdapter, KubeAdapter) {
    let talos = TalosAdapter::from_creds_with(&sim.creds, CLUSTER, quick_talos()).unwrap();
    let kube = KubeAdapter::from_creds_with(&sim.creds, CLUSTER, quick_kube())
        .await
        .unwrap()
        .with_drain_policy(quick_drain());
    (talos, kube)
}

/// An executor over the real adapters, a job for `steps`, in memory.
pub(crate) struct Run {
    exec: Executor<TalosAdapter, KubeAdapter, SystemClock>,
    job: medea::rollout::JobId,
    store: Arc<dyn Store>,
}

pub(crate) async fn run_for(sim: &Sim, dir: &Path, steps: Vec<Step>) -> Run {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let obs = sim.observed();
    let job = install(store.as_ref(), &plan(&obs, steps, 1), &obs, &[]).unwrap();
    let (talos, kube) = adapters(sim).await;
    let mut cfg = ExecutorConfig::new(true, dir.join("snapshots"));
    cfg.poll = Duration::from_millis(20);
    cfg.backoff_min = Duration::from_millis(20);
    cfg.backoff_max = Duration::from_millis(160);
    cfg.max_sleep = Duration::from_secs(1);
    let exec = Executor::new(store.clone(), talos, kube, SystemClock, cfg);
    Run { exec, job, store }
}

impl Run {
    pub(crate) async fn go(&self) -> RunOutcome {
        tokio::time::timeout(Duration::from_secs(60), self.exec.run(&self.job))
            .await
            .expect("the rollout ends within a minute")
            .unwrap()
    }
}

pub(crate) fn node(sim: &Sim, name: &str) -> NodeTarget {
    NodeTarget {
        node: name.into(),
        address: sim.talos.node_state(name).unwrap().address,
    }
}

// ---------------------------------------------------------------------------------------------
// the adapters' observations

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_talos_adapter_reads_the_next_boot_from_the_default_boot_entry() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    let (talos, _) = adapters(&sim).await;
    let w1 = node(&sim, "w-1");
    let seen = talos.node(&w1).await.unwrap();
    assert_eq!(seen.version, tv(FROM));
    assert_eq!(seen.next_boot, NextBoot::Same);
    assert!(seen.unhealthy_services.is_empty(), "{seen:?}");
    assert_eq!(seen.boot_id, sim.talos.node_state("w-1").unwrap().boot_id);

    let image = format!("factory.talos.dev/installer/abc:{TO}");
    talos
        .pull_image(&w1, &image, medea::rollout::ports::ImageNamespace::System)
        .await
        .unwrap();
    talos
        .upgrade(&w1, &image, UpgradeMethod::Lifecycle)
        .await
        .unwrap();
    let seen = talos.node(&w1).await.unwrap();
    assert_eq!(seen.version, tv(FROM), "installed, not booted");
    assert_eq!(seen.next_boot, NextBoot::Version(tv(TO)));

    talos.reboot(&w1).await.unwrap();
    let back = loop {
        match talos.node(&w1).await {
            Ok(n) if n.boot_id != seen.boot_id => break n,
            Ok(_) => {}
            Err(e) => assert!(e.is_transient(), "a rebooting node is transient: {e}"),
        }
        // waiting on the simulator's 30 ms reboot; each failed observation already backs off
        tokio::task::yield_now().await;
    };
    assert_eq!(back.version, tv(TO));
    assert_eq!(back.next_boot, NextBoot::Same);

    sim.talos.set_bootloader("w-2", Bootloader::Grub).unwrap();
    let grub = talos.node(&node(&sim, "w-2")).await.unwrap();
    assert_eq!(
        grub.next_boot,
        NextBoot::Unknown,
        "a GRUB node cannot tell what it boots next"
    );

    let metrics = medea::metrics::render();
    for m in [
        "api=\"talos\",method=\"Version\"",
        "api=\"talos\",method=\"Read\"",
        "api=\"talos\",method=\"Upgrade\"",
        "api=\"talos\",method=\"Reboot\"",
    ] {
        assert!(
            metrics.contains(&format!("medea_api_call_duration_seconds_count{{{m}}}")),
            "{m} missing from\n{metrics}"
        );
    }
}

/// The executor's observations make one attempt: a node that is away is reported transient at
/// once (the sequencer polls again within its own deadlines) instead of after the client's
/// backoff, which used to hold every decision of a wave while one of its nodes rebooted. A
/// command still retries as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observing_a_node_that_is_away_makes_one_attempt() {
    use medea::talos::TalosApi as _;
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 1, KubeSimConfig::default()).await;
    let (talos, _kube) = adapters(&sim).await;
    sim.talos
        .set_fault(FaultPlan {
            node: "w-1".into(),
            on: Trigger::Boot { nth: 1 },
            effect: Effect::NeverReturn,
        })
        .unwrap();
    let w1 = node(&sim, "w-1");
    talos
        .client()
        .reboot(&medea::talos::NodeTarget::parse(&w1.address).unwrap())
        .await
        .unwrap();
    let before = sim.talos.counters("w-1").unwrap();
    let err = talos.node(&w1).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    let after = sim.talos.counters("w-1").unwrap();
    assert_eq!(
        after.refused(Method::Version) - before.refused(Method::Version),
        1,
        "{after:?}"
    );
    // The etcd observation asks the control planes, which are up: unchanged.
    let cps: Vec<NodeTarget> = ["cp-1", "cp-2", "cp-3"]
        .iter()
        .map(|n| node(&sim, n))
        .collect();
    assert_eq!(talos.etcd(&cps).await.unwrap().members.len(), 3);
    // A read through the client itself (not an observation) still retries: 4 attempts in
    // `quick_talos`.
    let before = sim.talos.counters("w-1").unwrap();
    talos
        .client()
        .version(&medea::talos::NodeTarget::parse(&w1.address).unwrap())
        .await
        .unwrap_err();
    let after = sim.talos.counters("w-1").unwrap();
    assert_eq!(
        after.refused(Method::Version) - before.refused(Method::Version),
        4,
        "{after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adapters_reach_etcd_images_and_kubernetes_of_the_simulator() {
    use medea::rollout::ports::{Component, KubePort};
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 1, KubeSimConfig::default()).await;
    let (talos, kube) = adapters(&sim).await;
    let cps: Vec<NodeTarget> = ["cp-1", "cp-2", "cp-3"]
        .iter()
        .map(|n| node(&sim, n))
        .collect();
    let etcd = talos.etcd(&cps).await.unwrap();
    assert_eq!(etcd.members.len(), 3);
    assert!(etcd.members.iter().all(|m| m.healthy && !m.learner));
    sim.talos.set_etcd_healthy("cp-2", false).unwrap();
    let etcd = talos.etcd(&cps).await.unwrap();
    let cp2 = etcd.members.iter().find(|m| m.name == "cp-2").unwrap();
    assert!(!cp2.healthy && !cp2.errors.is_empty(), "{cp2:?}");
    assert!(etcd.alarms.is_empty(), "{etcd:?}");
    // An alarm raised on one member is reported cluster-wide, by name, and fails the etcd check
    // the executor runs before every control-plane step.
    sim.talos
        .set_etcd_alarm(
            "cp-3",
            Some(medea::sim::talos::scenario::EtcdAlarmKind::Nospace),
        )
        .unwrap();
    let etcd = talos.etcd(&cps).await.unwrap();
    assert_eq!(etcd.alarms, vec!["cp-3: NOSPACE".to_string()]);
    let verdict = medea::rollout::sequencer::etcd_verdict(&etcd).unwrap_err();
    assert!(
        verdict.contains("etcd alarms are active: cp-3: NOSPACE"),
        "{verdict}"
    );
    sim.talos.set_etcd_alarm("cp-3", None).unwrap();
    assert!(talos.etcd(&cps).await.unwrap().alarms.is_empty());

    let imgs = talos.component_images(&cps[0]).await.unwrap();
    let api = format!("registry.k8s.io/kube-apiserver:{KUBE}");
    assert_eq!(imgs.get(&Component::ApiServer), Some(&api));
    let new = "registry.k8s.io/kube-scheduler:v1.34.0";
    talos
        .set_component_image(&cps[0], Component::Scheduler, new)
        .await
        .unwrap();
    let imgs = talos.component_images(&cps[0]).await.unwrap();
    assert_eq!(
        imgs.get(&Component::Scheduler).map(String::as_str),
        Some(new)
    );
    assert_eq!(imgs.get(&Component::ApiServer), Some(&api), "the rest kept");
    // mirror pods follow the machine config on every request
    let pod = kube
        .static_pod("cp-1", Component::Scheduler)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pod.image, new);
    assert!(pod.ready);

    let k = kube.node("w-1").await.unwrap();
    assert!(k.ready && !k.unschedulable);
    assert_eq!(
        k.kubelet_version.map(|v| v.to_string()).as_deref(),
        Some(KUBE)
    );
    kube.cordon("w-1").await.unwrap();
    assert!(kube.node("w-1").await.unwrap().unschedulable);
    kube.uncordon("w-1").await.unwrap();
    assert!(!sim.cordoned("w-1"));
    assert!(
        medea::metrics::render().contains("api=\"kubernetes\",method=\"Cordon\""),
        "kube calls are timed"
    );
}

// ---------------------------------------------------------------------------------------------
// the fault matrix, through the real adapters

pub(crate) fn fault(node: &str, on: Trigger, effect: Effect) -> FaultPlan {
    FaultPlan {
        node: node.into(),
        on,
        effect,
    }
}

pub(crate) fn halted(out: &RunOutcome) -> &HaltReason {
    match out {
        RunOutcome::Halted { reason, .. } => reason,
        other => panic!("expected a halt, got {other:?}"),
    }
}

/// The text of a halt whose code is `code`.
pub(crate) fn halted_with(out: &RunOutcome, code: HaltCode) -> String {
    let reason = halted(out);
    assert_eq!(reason.code(), code, "{reason}");
    reason.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_returns_halts_at_the_health_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    sim.talos
        .set_fault(fault("w-1", Trigger::boot(), Effect::NeverReturn))
        .unwrap();
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 2))];
    let run = run_for(&sim, dir.path(), steps).await;
    let out = run.go().await;
    let reason = halted_with(&out, HaltCode::NodeNotBack);
    assert!(reason.contains("did not come back within 2s"), "{reason}");
    assert_eq!(sim.upgrades("w-1"), 1);
    assert_eq!(sim.upgrades("w-2"), 0, "the next node is not touched");
    assert_eq!(sim.reboots("w-2"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_revert_halts_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    sim.talos
        .set_fault(fault("w-1", Trigger::boot(), Effect::BootOldVersion))
        .unwrap();
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::NodeReverted);
    assert!(reason.contains("node reverted"), "{reason}");
    assert!(reason.contains(FROM), "{reason}");
    assert_eq!(sim.talos.node_state("w-1").unwrap().running, tv(FROM));
    assert_eq!(sim.upgrades("w-2"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installer_exit_code_halts_without_a_reboot() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    // the installer keeps failing (a plan fires once: one per call, more than the bound)
    for nth in 1..=3 {
        sim.talos
            .set_fault(fault(
                "w-1",
                Trigger::nth_call(Method::Upgrade, nth),
                Effect::UpgradeExit {
                    code: 3,
                    message: "error writing boot assets: no space left on device".into(),
                },
            ))
            .unwrap();
    }
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::UpgradeRefused);
    assert!(reason.contains("exited with code 3"), "{reason}");
    assert!(reason.contains("no space left on device"), "{reason}");
    assert!(reason.contains("failed 2 times"), "{reason}");
    assert_eq!(
        sim.upgrades("w-1"),
        2,
        "rollout.upgradeAttempts (default 2) Upgrade calls, no more"
    );
    assert_eq!(sim.reboots("w-1"), 0, "no reboot after a failed install");
    assert_eq!(sim.upgrades("w-2"), 0);
    assert!(
        sim.cordoned("w-1"),
        "a halted node stays cordoned for the operator"
    );
}

// ---------------------------------------------------------------------------------------------
// the drain policy (issue 20, item 1)

/// The default scenario runs a metrics-server-like Deployment (emptyDir at `/tmp`) on a
/// worker; the plan's default drain policy (`deleteEmptyDirData: true`, as talosctl) drains it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_server_with_an_emptydir_drains_with_the_default_policy() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        dir.path(),
        1,
        2,
        KubeSimConfig {
            objects: medea::sim::kube::scenario::default_scenario(),
            ..KubeSimConfig::default()
        },
    )
    .await;
    let mut host = None;
    for _ in 0..500 {
        host = sim
            .kube
            .pods()
            .into_iter()
            .find(|p| p.name.starts_with("metrics-server-") && p.ready)
            .and_then(|p| p.node);
        if host.is_some() {
            break;
        }
        // the simulator's controllers create and schedule pods in the background
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let host = host.expect("the metrics-server pod is scheduled and ready");
    assert!(
        host.starts_with("w-"),
        "metrics-server runs on a worker: {host}"
    );
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let out = run.go().await;
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    assert_eq!(sim.upgrades("w-1"), 1);
    assert_eq!(sim.upgrades("w-2"), 1);
    let c = sim.kube.counters();
    assert!(c.evictions > 0, "{c:?}");
    assert_eq!(c.pod_deletes, 0, "evictions only");
}

/// One control-plane node and two workers, the default workloads plus a bare pod (no
/// controller) `namespace/name` on w-1, with an emptyDir volume when `empty_dir`.
async fn sim_with_bare_pod(
    dir: &std::path::Path,
    namespace: &str,
    name: &str,
    empty_dir: bool,
) -> Sim {
    use medea::sim::kube::scenario;
    let mut objects = scenario::default_scenario();
    objects
        .push(serde_json::to_value(scenario::bare_pod(namespace, name, "w-1", empty_dir)).unwrap());
    Sim::start(
        dir,
        1,
        2,
        KubeSimConfig {
            objects,
            ..KubeSimConfig::default()
        },
    )
    .await
}

/// A bare pod (no controller) is refused before any eviction, naming the pod and the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_pod_is_refused_naming_the_pod_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim_with_bare_pod(dir.path(), "default", "debug-shell", false).await;
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::CommandFailed);
    assert!(reason.contains("default/debug-shell"), "{reason}");
    assert!(reason.contains("drain.evictUnmanagedPods"), "{reason}");
    assert_eq!(sim.upgrades("w-1"), 0, "no upgrade on an undrained node");
    assert_eq!(sim.upgrades("w-2"), 0);
    assert!(
        sim.kube
            .pods_on("w-1")
            .iter()
            .any(|p| p.name == "debug-shell"),
        "the bare pod is left alone"
    );
}

/// `drain.skipPods` leaves matching pods on the node (a local-storage agent) and the drain
/// goes on; a PDB is still never bypassed for the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_pods_leaves_matching_pods_on_the_node() {
    // `bare_pod` labels the pod `app: <name>`; with emptyDir, as local-storage agents have
    let dir = tempfile::tempdir().unwrap();
    let sim = sim_with_bare_pod(dir.path(), "storage", "local-agent", true).await;
    let mut step = sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60));
    if let Step::Talos(t) = &mut step {
        t.drain.skip_pods = [("app".to_string(), "local-agent".to_string())].into();
    }
    let run = run_for(&sim, dir.path(), vec![step]).await;
    let out = run.go().await;
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    assert_eq!(sim.upgrades("w-1"), 1);
    assert!(
        sim.kube.pods().iter().any(|p| p.name == "local-agent"),
        "the skipped pod was not evicted"
    );
    assert_eq!(sim.kube.counters().pod_deletes, 0);
}

/// Issue 20, item 2: a legacy (< 1.13) node whose installer keeps failing ("disk full", answered
/// `INTERNAL` by the node) used to get `MachineService.Upgrade` re-issued forever. The answer
/// proves the call ran and failed: after `rollout.upgradeAttempts` (2) the job halts with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_installer_that_keeps_failing_halts_after_the_bound_with_its_message() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start_from(dir.path(), 1, 2, KubeSimConfig::default(), "v1.12.6").await;
    for nth in 1..=4 {
        sim.talos
            .set_fault(fault(
                "w-1",
                Trigger::nth_call(Method::LegacyUpgrade, nth),
                Effect::UpgradeExit {
                    code: 1,
                    message: "disk full on /dev/sda".into(),
                },
            ))
            .unwrap();
    }
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::UpgradeRefused);
    assert!(reason.contains("disk full on /dev/sda"), "{reason}");
    assert!(reason.contains("failed 2 times"), "{reason}");
    let c = sim.talos.counters("w-1").unwrap();
    assert_eq!(
        c.calls(Method::LegacyUpgrade),
        2,
        "exactly the bound: {c:?}"
    );
    assert_eq!(c.calls(Method::Reboot), 0);
    assert_eq!(sim.talos.node_state("w-1").unwrap().running, tv("v1.12.6"));
    assert_eq!(sim.upgrades("w-2"), 0, "the next node is not touched");
    // each attempt was journaled (intent before the call) under its own key, with its outcome
    let journal: Vec<Entry> = run
        .store
        .scan_records::<JournalEntry>(&entries_prefix(&run.job))
        .unwrap()
        .into_iter()
        .map(|(_, e)| e.entry)
        .collect();
    let attempts = |intent: bool| -> Vec<u32> {
        journal
            .iter()
            .filter_map(|e| match e {
                Entry::Intent { key, .. } if intent && key.op == CommandOp::Upgrade => {
                    Some(key.attempt)
                }
                Entry::Result { key, .. } if !intent && key.op == CommandOp::Upgrade => {
                    Some(key.attempt)
                }
                _ => None,
            })
            .collect()
    };
    assert_eq!(attempts(true), vec![1, 2], "one intent per attempt");
    assert_eq!(attempts(false), vec![1, 2], "one outcome per attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdb_that_never_allows_halts_at_the_drain_timeout_and_deletes_nothing() {
    use medea::sim::kube::scenario;
    let objects = vec![
        serde_json::to_value(scenario::deployment("default", "web", 6, "nginx:1.29")).unwrap(),
        serde_json::to_value(scenario::pdb_min_available("default", "web-pdb", "web", 6)).unwrap(),
    ];
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        dir.path(),
        1,
        2,
        KubeSimConfig {
            objects,
            ..KubeSimConfig::default()
        },
    )
    .await;
    assert!(
        !sim.kube.pods_on("w-1").is_empty(),
        "the workload has pods on w-1"
    );
    sim.kube.inject(KubeFault::PdbNeverAllows {
        namespace: "default".into(),
        pdb: "web-pdb".into(),
    });
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (2, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::DrainBlocked);
    assert!(reason.contains("drain of `w-1` timed out"), "{reason}");
    assert!(reason.contains("default/web-pdb"), "{reason}");
    let c = sim.kube.counters();
    assert_eq!(c.pod_deletes, 0, "medea never deletes a pod");
    assert!(c.evictions_blocked > 0, "{c:?}");
    assert_eq!(sim.upgrades("w-1"), 0, "no upgrade on an undrained node");
    assert_eq!(sim.upgrades("w-2"), 0);
}

/// A system extension's service that was failing before the upgrade (`ext-<name>`, which
/// `MachineStatus` readiness ignores) does not keep the node "not back" after its reboot: the
/// services to wait for are compared with the states recorded before the upgrade (#33 item 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_service_failing_before_the_upgrade_does_not_hold_the_node_back() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    sim.talos
        .set_service_health("w-1", "ext-iscsi-tools", false)
        .unwrap();
    let steps = vec![sim.step("workers", &[&["w-1"]], 1, (60, 10))];
    let run = run_for(&sim, dir.path(), steps).await;
    let out = run.go().await;
    assert!(
        matches!(out, medea::rollout::RunOutcome::Succeeded),
        "{out:?}"
    );
    assert_eq!(sim.upgrades("w-1"), 1);
    let st = sim.talos.node_state("w-1").unwrap();
    assert_eq!(st.running, tv(TO));
}

/// kubectl's drain retries an eviction only on a 429: the apiserver's 500 for a pod that two
/// PodDisruptionBudgets select (k8s `pkg/registry/core/pod/storage/eviction.go`) never goes
/// away by waiting, so the drain stops at once with its message instead of at the timeout
/// (#33 item 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_under_two_pdbs_halts_the_drain_at_once_with_the_apiservers_message() {
    use medea::sim::kube::scenario;
    let objects = vec![
        serde_json::to_value(scenario::deployment("default", "web", 6, "nginx:1.29")).unwrap(),
        serde_json::to_value(scenario::pdb_min_available("default", "web-pdb", "web", 1)).unwrap(),
        serde_json::to_value(scenario::pdb_min_available(
            "default",
            "web-pdb-2",
            "web",
            1,
        ))
        .unwrap(),
    ];
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        dir.path(),
        1,
        2,
        KubeSimConfig {
            objects,
            ..KubeSimConfig::default()
        },
    )
    .await;
    assert!(!sim.kube.pods_on("w-1").is_empty());
    // a 300 s drain timeout
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (300, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let started = std::time::Instant::now();
    let out = run.go().await;
    let reason = halted(&out).to_string();
    assert!(
        reason.contains("This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."),
        "{reason}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "halted at once, not at the 300 s drain timeout: {:?}",
        started.elapsed()
    );
    assert_eq!(
        sim.kube.counters().pod_deletes,
        0,
        "medea never deletes a pod"
    );
    assert_eq!(sim.upgrades("w-1"), 0, "no upgrade on an undrained node");
    assert_eq!(sim.upgrades("w-2"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_etcd_snapshot_touches_no_control_plane_node() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 1, KubeSimConfig::default()).await;
    for cp in ["cp-1", "cp-2", "cp-3"] {
        sim.talos
            .set_fault(fault(
                cp,
                Trigger::call(Method::EtcdSnapshot),
                Effect::SnapshotBreak { after_bytes: 5000 },
            ))
            .unwrap();
    }
    let steps = vec![sim.step(
        "control-plane",
        &[&["cp-1"], &["cp-2"], &["cp-3"]],
        1,
        (60, 60),
    )];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::CommandFailed);
    assert!(reason.contains("snapshot"), "{reason}");
    assert_eq!(sim.snapshots(), 1, "the snapshot was attempted once");
    for cp in ["cp-1", "cp-2", "cp-3"] {
        let c = sim.talos.counters(cp).unwrap();
        assert_eq!(c.mutating(), 0, "{cp}: no mutating call: {c:?}");
        assert!(!sim.cordoned(cp), "{cp} not cordoned");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path().join("snapshots"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "no partial snapshot is left: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talos_unavailable_bursts_are_waited_out_and_every_call_still_happens_once() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 2, KubeSimConfig::default()).await;
    let bursts = [
        fault(
            "cp-2",
            Trigger::any_call(),
            Effect::Unavailable { calls: 3 },
        ),
        fault("w-1", Trigger::any_call(), Effect::Unavailable { calls: 5 }),
        // refused mutating calls: the adapter reports them transient, the executor observes
        // that they did not happen and issues them again
        fault(
            "w-2",
            Trigger::call(Method::Upgrade),
            Effect::Unavailable { calls: 1 },
        ),
        fault(
            "cp-3",
            Trigger::call(Method::Reboot),
            Effect::Unavailable { calls: 2 },
        ),
    ];
    for b in bursts {
        sim.talos.set_fault(b).unwrap();
    }
    let steps = vec![
        sim.step(
            "control-plane",
            &[&["cp-1"], &["cp-2"], &["cp-3"]],
            1,
            (60, 60),
        ),
        sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60)),
    ];
    let run = run_for(&sim, dir.path(), steps).await;
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    for n in ["cp-1", "cp-2", "cp-3", "w-1", "w-2"] {
        assert_eq!(sim.talos.node_state(n).unwrap().running, tv(TO), "{n}");
        assert_eq!(sim.upgrades(n), 1, "{n}: one Upgrade");
        assert_eq!(sim.reboots(n), 1, "{n}: one Reboot");
        assert!(!sim.cordoned(n));
    }
    let c = |n: &str| sim.talos.counters(n).unwrap();
    assert_eq!(c("w-2").refused(Method::Upgrade), 1, "the burst fired");
    assert_eq!(c("cp-3").refused(Method::Reboot), 2);
    let refused: u64 = ["cp-2", "w-1"]
        .iter()
        .flat_map(|n| c(n).refused.into_values())
        .sum();
    assert!(refused >= 8, "every burst fired ({refused})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kube_apiserver_away_during_a_control_plane_reboot_is_waited_out() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 1, KubeSimConfig::default()).await;
    let steps = vec![sim.step(
        "control-plane",
        &[&["cp-1"], &["cp-2"], &["cp-3"]],
        1,
        (60, 60),
    )];
    let run = run_for(&sim, dir.path(), steps).await;
    let mut events = run.exec.subscribe();
    let kube = sim.kube.clone();
    let injector = tokio::spawn(async move {
        loop {
            let ev: RolloutEvent = events.recv().await.unwrap();
            let rebooted = ev.node.as_deref() == Some("cp-2")
                && ev.op == Some(CommandOp::Reboot)
                && matches!(ev.state, EventState::Done);
            if rebooted {
                // the apiserver goes away with the control-plane node, for longer than the
                // node's own reboot
                kube.inject(KubeFault::ApiUnavailable(Outage::For(
                    Duration::from_millis(1500),
                )));
                return;
            }
        }
    });
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    injector.await.unwrap();
    assert!(sim.kube.counters().unavailable > 0, "the outage was seen");
    for n in ["cp-1", "cp-2", "cp-3"] {
        assert_eq!(sim.talos.node_state(n).unwrap().running, tv(TO), "{n}");
        assert_eq!(sim.upgrades(n), 1);
        assert_eq!(sim.reboots(n), 1);
        assert!(!sim.cordoned(n));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upgrade_on_a_node_that_cannot_tell_its_next_boot_halts_instead_of_retrying() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    sim.talos.set_bootloader("w-1", Bootloader::Grub).unwrap();
    sim.talos
        .set_fault(fault(
            "w-1",
            Trigger::call(Method::Upgrade),
            Effect::Unavailable { calls: 1 },
        ))
        .unwrap();
    let steps = vec![sim.step("workers", &[&["w-1"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let reason = halted_with(&run.go().await, HaltCode::OutcomeUnknown);
    assert!(
        reason.contains("cannot tell whether the upgrade of `w-1` ran"),
        "{reason}"
    );
    assert_eq!(
        sim.upgrades("w-1"),
        0,
        "the lost call is never repeated blindly"
    );
    assert_eq!(
        sim.talos.counters("w-1").unwrap().refused(Method::Upgrade),
        1
    );
}

// ---------------------------------------------------------------------------------------------
// coming back (issue 20, items 8 and 9)

/// A node written from a disk image has no `LoaderEntryDefault` until its first install. A lost
/// Upgrade reply there is resolved from `LoaderEntrySelected` (the node boots what it runs), so
/// the call is made again instead of halting "cannot tell".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_image_node_without_a_default_boot_entry_is_upgraded_after_a_lost_reply() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    sim.talos
        .set_bootloader("w-1", Bootloader::SdBootImage)
        .unwrap();
    let (talos, _) = adapters(&sim).await;
    let seen = talos.node(&node(&sim, "w-1")).await.unwrap();
    assert_eq!(
        seen.next_boot,
        NextBoot::Same,
        "read from LoaderEntrySelected"
    );
    sim.talos
        .set_fault(fault(
            "w-1",
            Trigger::call(Method::Upgrade),
            Effect::Unavailable { calls: 1 },
        ))
        .unwrap();
    let steps = vec![sim.step("workers", &[&["w-1"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    assert_eq!(sim.talos.node_state("w-1").unwrap().running, tv(TO));
    let c = sim.talos.counters("w-1").unwrap();
    assert_eq!(c.refused(Method::Upgrade), 1, "the lost call");
    assert_eq!(c.calls(Method::Upgrade), 1, "one Upgrade reached the node");
    assert_eq!(c.calls(Method::Reboot), 1);
    // the install wrote the default entry; the node booted it
    let back = talos.node(&node(&sim, "w-1")).await.unwrap();
    assert_eq!(back.next_boot, NextBoot::Same);
}

/// Installing the version a node already has writes `Talos-<v>~1.efi` (a reinstall entry);
/// the adapter reads what it boots from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reinstall_boot_entries_say_what_boots_next() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    let (talos, _) = adapters(&sim).await;
    let w1 = node(&sim, "w-1");
    for (v, next) in [(FROM, NextBoot::Same), (TO, NextBoot::Version(tv(TO)))] {
        let image = format!("factory.talos.dev/installer/abc:{v}");
        talos
            .pull_image(&w1, &image, medea::rollout::ports::ImageNamespace::System)
            .await
            .unwrap();
        talos
            .upgrade(&w1, &image, UpgradeMethod::Lifecycle)
            .await
            .unwrap();
        let seen = talos.node(&w1).await.unwrap();
        assert_eq!(seen.next_boot, next, "after installing {v}");
        if v == FROM {
            // booting the reinstall entry: it is also what it boots next
            let before = seen.boot_id.clone();
            talos.reboot(&w1).await.unwrap();
            let back = loop {
                match talos.node(&w1).await {
                    Ok(n) if n.boot_id != before => break n,
                    Ok(_) => {}
                    Err(e) => assert!(e.is_transient(), "{e}"),
                }
                tokio::task::yield_now().await;
            };
            assert_eq!(back.next_boot, NextBoot::Same);
        }
    }
}

/// After its reboot a node is up, but `MachineStatus` says `booting` for a while and the
/// endpoint apid keeps answering `UNAVAILABLE` for it (dial backoff): medea waits both out,
/// without a halt and without doing anything twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booting_machine_status_and_apid_redial_backoff_are_waited_out() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start_timed(dir.path(), 1, 2, KubeSimConfig::default(), FROM, |t| {
        t.machine_ready = Duration::from_millis(400);
        t.apid_redial = Duration::from_millis(250);
    })
    .await;
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    for n in ["w-1", "w-2"] {
        assert_eq!(sim.talos.node_state(n).unwrap().running, tv(TO), "{n}");
        assert_eq!(sim.upgrades(n), 1, "{n}: one Upgrade");
        assert_eq!(sim.reboots(n), 1, "{n}: one Reboot");
        assert!(!sim.cordoned(n));
        let c = sim.talos.counters(n).unwrap();
        let refused: u64 = c.refused.values().sum();
        assert!(refused > 0, "{n}: apid's redial backoff was met: {c:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// crash injection on the simulator

/// The crash harness's world on the simulator: `SimTalos` + the simulated kube-apiserver in
/// this process (on a runtime of their own, so they keep serving while the test thread waits
/// for the child), a fjall store seeded with the mixed 3 + 3 job, and a child
/// `medea __rollout-run --creds-dir <dir>/creds --cluster prod` that reaches the simulator
/// through the real adapters. The summary comes from the simulator's counters.
pub struct SimWorld {
    // dropped before the runtime that serves them
    sim: Sim,
    dir: PathBuf,
    _rt: tokio::runtime::Runtime,
}

impl SimWorld {
    fn prepare_with(dir: &Path, grub: &[&str]) -> SimWorld {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let sim = rt.block_on(Sim::start(dir, 3, 3, KubeSimConfig::default()));
        for n in grub {
            sim.talos.set_bootloader(n, Bootloader::Grub).unwrap();
        }
        let store = FjallStore::open(&dir.join("store")).unwrap();
        let obs = sim.observed();
        install(&store, &plan(&obs, sim.mixed(), 9), &obs, &[]).unwrap();
        drop(store);
        SimWorld {
            sim,
            dir: dir.to_path_buf(),
            _rt: rt,
        }
    }

    fn job(&self) -> Job {
        let store = FjallStore::open(&self.store()).unwrap();
        let jobs = medea::ops::jobs::load_jobs(&store).unwrap();
        assert_eq!(jobs.len(), 1);
        jobs.into_iter().next().unwrap()
    }

    fn journal(&self) -> Vec<JournalEntry> {
        let job = self.job();
        let store = FjallStore::open(&self.store()).unwrap();
        store
            .scan_records::<JournalEntry>(&entries_prefix(&job.id))
            .unwrap()
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    }
}

impl CrashWorld for SimWorld {
    fn prepare(dir: &Path) -> SimWorld {
        SimWorld::prepare_with(dir, &[])
    }

    fn child(&self) -> Command {
        let mut c = crate::cli::medea();
        c.arg("__rollout-run")
            .arg("--rollouts")
            .arg("--store")
            .arg(self.dir.join("store"))
            .arg("--creds-dir")
            .arg(&self.sim.creds)
            .arg("--cluster")
            .arg(CLUSTER)
            .arg("--snapshots")
            .arg(self.dir.join("snapshots"))
            .arg("--poll-ms")
            .arg("10")
            .env_remove("MEDEA_CRASH_AT")
            .env_remove("MEDEA_CRASH_AFTER")
            .env_remove("MEDEA_CRASH_BEFORE");
        c
    }

    fn summary(&self) -> Summary {
        let mut log = Vec::new();
        let nodes = self
            .sim
            .names
            .iter()
            .map(|n| {
                let s = self.sim.talos.node_state(n).unwrap();
                let c = self.sim.talos.counters(n).unwrap();
                log.push(format!("{n}: {c:?}"));
                (
                    n.clone(),
                    (
                        s.running,
                        self.sim.cordoned(n),
                        c.upgrades() as u32,
                        c.calls(Method::Reboot) as u32,
                    ),
                )
            })
            .collect();
        Summary {
            nodes,
            snapshots: self.sim.snapshots() as u32,
            log,
        }
    }

    fn store(&self) -> PathBuf {
        self.dir.join("store")
    }
}

/// Kill the child at journal point `n` of `var`, restart it; `false` if it never got there.
fn crash_at(w: &SimWorld, var: &str, n: u64) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let first = w.child().env(var, n.to_string()).output().unwrap();
    if first.status.success() {
        return false;
    }
    assert_eq!(
        first.status.signal(),
        Some(6),
        "{var}={n}: the child must die by abort, not fail: {}\n{}",
        String::from_utf8_lossy(&first.stdout),
        String::from_utf8_lossy(&first.stderr)
    );
    let again = w.child().output().unwrap();
    assert!(
        again.status.success(),
        "{var}={n}: the restarted child failed: {}\n{}",
        String::from_utf8_lossy(&again.stdout),
        String::from_utf8_lossy(&again.stderr)
    );
    true
}

/// Crash runs in flight at once: each is a simulator plus a child, and about half of a run is
/// waiting (reboots, polls), so a few overlap well even on two cores.
const PARALLEL_RUNS: usize = 3;

/// Run `points` (`(variable, N)`) on fresh worlds, [`PARALLEL_RUNS`] at a time; panics listing
/// every point whose run failed.
fn crash_points(points: &[(&'static str, u64)]) {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..PARALLEL_RUNS {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(&(var, n)) = points.get(i) else {
                        return;
                    };
                    let r = std::panic::catch_unwind(|| {
                        let dir = scratch();
                        let w = SimWorld::prepare(dir.path());
                        assert!(crash_at(&w, var, n), "{var}={n} was reached");
                        check_rolled_out(&w, &format!("{var}={n}"));
                    });
                    if let Err(e) = r {
                        let msg = e
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        failures.lock().unwrap().push(format!("{var}={n}: {msg}"));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The crash harness on the simulator: the child is killed at **every** journal point, then
/// restarted. `MEDEA_CRASH_AT=N` aborts right after commit N is durable, for every N: that is
/// every state a crash can leave in which the journal is complete. The one other state is
/// "call made, outcome never journaled" (the case the at-most-once argument is about), and it
/// exists only between an intent and its result: `MEDEA_CRASH_BEFORE=N` at every result.
/// `BEFORE` at an intent or a progress entry is not run separately: between the previous
/// commit and it only observations happen, so it leaves the state of `AT` the previous point.
///
/// Each run ends with the job Succeeded, every node on the target, exactly one Upgrade and one
/// Reboot per node (simulator counters), nobody cordoned and one etcd snapshot.
#[test]
fn killed_at_journal_points_the_simulated_rollout_completes_exactly_once() {
    // the clean run: the journal points and what each one records
    let dir = scratch();
    let w = SimWorld::prepare(dir.path());
    let clean = w.child().output().unwrap();
    assert!(
        clean.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&clean.stdout),
        String::from_utf8_lossy(&clean.stderr)
    );
    check_rolled_out(&w, "clean run");
    let journal = w.journal();
    let points = w.job().journal_seq;
    assert!(
        points > 50,
        "a 6-node rollout has many journal points ({points})"
    );
    drop(w);

    let mut runs: Vec<(&'static str, u64)> = Vec::new();
    let mut critical = 0;
    for e in journal.iter().filter(|e| e.seq >= 1) {
        runs.push(("MEDEA_CRASH_AT", e.seq));
        match &e.entry {
            Entry::Intent { key, .. }
                if matches!(key.op, CommandOp::Upgrade | CommandOp::Reboot) =>
            {
                critical += 1
            }
            Entry::Result { .. } => runs.push(("MEDEA_CRASH_BEFORE", e.seq)),
            _ => {}
        }
    }
    assert_eq!(
        runs.iter().filter(|(v, _)| *v == "MEDEA_CRASH_AT").count() as u64,
        points,
        "every journal point is a crash point"
    );
    assert_eq!(critical, 12, "an Upgrade and a Reboot intent per node");
    let started = std::time::Instant::now();
    crash_points(&runs);
    eprintln!(
        "crash harness: {} runs ({points} journal points) in {:?}",
        runs.len(),
        started.elapsed()
    );
}

/// A node that cannot report its next boot (GRUB): a crash right after its Upgrade intent
/// (the call never made) and right before its Upgrade result (the call made, the reply never
/// journaled) both halt the restarted job, naming the node, with at most the one Upgrade:
/// never a second one on a guess.
#[test]
fn a_crash_around_the_upgrade_of_a_node_that_cannot_tell_halts_with_at_most_one_upgrade() {
    // find w-3's Upgrade intent and result in a clean run of the same rollout
    let dir = scratch();
    let w = SimWorld::prepare_with(dir.path(), &["w-3"]);
    assert!(w.child().output().unwrap().status.success());
    check_rolled_out(&w, "clean run with a GRUB node");
    let journal = w.journal();
    let seq_of = |want_intent: bool| {
        journal
            .iter()
            .find(|e| match &e.entry {
                Entry::Intent { key, .. } if want_intent => {
                    key.op == CommandOp::Upgrade && key.node.as_deref() == Some("w-3")
                }
                Entry::Result { key, .. } if !want_intent => {
                    key.op == CommandOp::Upgrade && key.node.as_deref() == Some("w-3")
                }
                _ => false,
            })
            .map(|e| e.seq)
            .unwrap()
    };
    let (intent, result) = (seq_of(true), seq_of(false));
    drop(w);

    for (var, n, upgrades) in [
        ("MEDEA_CRASH_AT", intent, 0),
        ("MEDEA_CRASH_BEFORE", result, 1),
    ] {
        let dir = scratch();
        let w = SimWorld::prepare_with(dir.path(), &["w-3"]);
        let first = w.child().env(var, n.to_string()).output().unwrap();
        assert!(!first.status.success(), "{var}={n} was reached");
        let again = w.child().output().unwrap();
        assert_eq!(again.status.code(), Some(1), "the job does not succeed");
        let job = w.job();
        let JobState::Halted { reason, node, .. } = &job.state else {
            panic!("{var}={n}: expected a halt, got {:?}", job.state);
        };
        assert_eq!(
            reason.code(),
            HaltCode::OutcomeUnknown,
            "{var}={n}: {reason}"
        );
        assert!(
            reason
                .message()
                .contains("cannot tell whether the upgrade of `w-3` ran"),
            "{var}={n}: {reason}"
        );
        assert_eq!(node.as_deref(), Some("w-3"));
        assert_eq!(w.sim.upgrades("w-3"), upgrades, "{var}={n}");
        assert_eq!(w.sim.reboots("w-3"), 0, "{var}={n}");
        for other in ["cp-1", "cp-2", "cp-3", "w-1", "w-2"] {
            assert_eq!(w.sim.upgrades(other), 1, "{var}={n}: {other}");
        }
    }
}

#[test]
fn the_harness_command_checks_the_credentials_before_touching_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let out = crate::cli::medea()
        .args(["__rollout-run", "--store"])
        .arg(&store)
        .arg("--creds-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--cluster"), "{err}");
    let out = crate::cli::medea()
        .args(["__rollout-run", "--store"])
        .arg(&store)
        .arg("--creds-dir")
        .arg(dir.path())
        .args(["--cluster", "prod"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("talosconfig of cluster `prod`"), "{err}");
    assert!(!store.exists(), "nothing created");
    let out = crate::cli::medea()
        .args(["__rollout-run", "--store"])
        .arg(&store)
        .arg("--creds-dir")
        .arg(dir.path())
        .args(["--cluster", "../etc"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot name a credentials directory"));
}

// ---------------------------------------------------------------------------------------------
// machine-config edits (issue 20, item 3)

/// What real configurations hold and a YAML 1.1 re-encoding would change: octal modes, `off`
/// and `yes` strings, an anchor and its alias, comments, flow style, another document.
fn typed_extras() -> medea::sim::talos::MachineConfigExtra {
    medea::sim::talos::MachineConfigExtra {
        machine: Some(
            "files:\n  - content: |\n      MODE=off\n    permissions: 0644   # rw-r--r--\n    path: /var/etc/nut/upsmon.conf\n    op: create\nsysctls: &sysctls\n  net.ipv4.ip_forward: on\n  vm.overcommit_memory: off\nnodeLabels: {rack: \"07\", spare: yes}\n".into(),
        ),
        cluster: Some(
            "# headers for extraManifests\nextraManifestHeaders: {X-Mode: off, X-Copy: 0755}\n".into(),
        ),
        documents: Some(
            "---\napiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: https://siderolink.example/?jointoken=off\n".into(),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_upgrade_sends_each_machine_config_back_byte_identical_but_the_images() {
    let dir = tempfile::tempdir().unwrap();
    let mut scenario = Scenario::uniform(1, 1, tv(FROM), KubeVersion::parse(KUBE).unwrap());
    scenario.machine_config_extra = Some(typed_extras());
    let sim = Sim::start_scenario(dir.path(), scenario, KubeSimConfig::default()).await;
    let before: BTreeMap<String, String> = ["cp-1", "w-1"]
        .iter()
        .map(|n| {
            let c = sim.talos.machine_config(n).unwrap();
            (
                n.to_string(),
                String::from_utf8(c.expose().clone()).unwrap(),
            )
        })
        .collect();
    assert!(before["cp-1"].contains("permissions: 0644   # rw-r--r--"));
    let to = "v1.34.1";
    let run = run_for(
        &sim,
        dir.path(),
        vec![crate::rollout::kube_step(&["cp-1"], &["w-1"], KUBE, to)],
    )
    .await;
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    for (name, old) in &before {
        let new = sim.talos.machine_config(name).unwrap();
        let new = String::from_utf8(new.expose().clone()).unwrap();
        // every component image the step sets moved to the target (on a worker: the kubelet's;
        // its `cluster.proxy` is the control plane's business); not one other byte changed
        let expected = if name.starts_with("cp-") {
            old.replace(&format!(":{KUBE}\n"), &format!(":{to}\n"))
        } else {
            old.replace(&format!("kubelet:{KUBE}\n"), &format!("kubelet:{to}\n"))
        };
        assert_ne!(&expected, old);
        assert_eq!(new, expected, "{name}");
    }
}

/// `medea __rollout-run --creds-dir` evaluates health gates with the same probes as `medea
/// serve` (it used `NoProbe`, which fails every gate): a workloads gate on the simulator's
/// kube-system DaemonSets passes and the gated job runs to the end.
#[test]
fn the_debug_runner_evaluates_gates_with_real_probes() {
    use medea::plan::health::{
        Gate, GateCheck, HealthPolicy, HealthSources, OnFailure, WorkloadKind,
    };
    let dir = scratch();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sim = rt.block_on(Sim::start(dir.path(), 3, 1, KubeSimConfig::default()));
    let store_dir = dir.path().join("store");
    {
        let store = FjallStore::open(&store_dir).unwrap();
        let obs = sim.observed();
        let mut p = plan(
            &obs,
            vec![sim.step("workers", &[&["w-1"]], 1, (600, 900))],
            9,
        );
        std::sync::Arc::make_mut(&mut p.clusters[0]).health = Some(HealthPolicy {
            sources: HealthSources::default(),
            gates: vec![Gate {
                name: "system-daemonsets".into(),
                check: GateCheck::Workloads {
                    namespaces: vec!["kube-system".into()],
                    kinds: vec![WorkloadKind::DaemonSet],
                },
            }],
            soak: Duration::ZERO,
            interval: Duration::from_millis(200),
            // a DaemonSet pod of the rebooted node takes a moment to be Ready again
            failure_limit: 100,
            on_failure: OnFailure::Halt,
        });
        install(&store, &p, &obs, &[]).unwrap();
    }
    let out = crate::cli::medea()
        .arg("__rollout-run")
        .arg("--rollouts")
        .arg("--store")
        .arg(&store_dir)
        .arg("--creds-dir")
        .arg(&sim.creds)
        .arg("--cluster")
        .arg(CLUSTER)
        .arg("--snapshots")
        .arg(dir.path().join("snapshots"))
        .arg("--poll-ms")
        .arg("10")
        .env_remove("MEDEA_CRASH_AT")
        .env_remove("MEDEA_CRASH_AFTER")
        .env_remove("MEDEA_CRASH_BEFORE")
        .output()
        .unwrap();
    let store = FjallStore::open(&store_dir).unwrap();
    let jobs = medea::ops::jobs::load_jobs(&store).unwrap();
    assert!(
        matches!(jobs[0].state, JobState::Succeeded { .. }),
        "{}\n{}\n{:#?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        jobs[0].state
    );
    assert_eq!(sim.upgrades("w-1"), 1);
    drop(store);
    drop(sim);
}
