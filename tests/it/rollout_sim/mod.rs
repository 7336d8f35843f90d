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
//!
//! This file holds the simulator world and the helpers the subjects (and `kube_sim`,
//! `rollout_health`, `ha`) share; each subject is a module: [`observations`], [`faults`],
//! [`drain`], [`coming_back`], [`crash`], [`machine_config`], [`stage`], [`pacing`] and
//! [`leadership`] (the etcd leader last, its forfeit; cordon ownership); [`snapshot_age`] (the
//! pre-upgrade etcd snapshot encrypted to the backup recipients, through crashes).

mod boot_entries;
mod coming_back;
mod crash;
mod drain;
mod faults;
mod installers;
mod leadership;
mod machine_config;
mod observations;
mod pacing;
mod snapshot_age;
mod stage;
mod volumes;

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
                        secure_boot: None,
                        factory_host: None,
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
            stage: None,
            health: None,
            silence: None,
            hooks: None,
            pool: pool.into(),
            role,
            hop: 1,
            hops: 1,
            to: tv(TO),
            image: format!(
                "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:{TO}"
            ),
            max_unavailable: max,
            drain_timeout: Duration::from_secs(timeouts.0),
            health_timeout: Duration::from_secs(timeouts.1),
            upgrade_attempts: medea::desired::model::DEFAULT_UPGRADE_ATTEMPTS,
            drain: medea::desired::model::DrainPolicy::default(),
            taint_next_wave: true,
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

// ---------------------------------------------------------------------------------------------
// the fault matrix's helpers (also used by `kube_sim`)

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
