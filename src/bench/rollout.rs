//! `medea bench rollout`: the rollout engine (state machine + executor + durable fjall
//! journal) driving a cluster, on one of two backends ([`Backend`]):
//! - **the simulator** (default): `sim::SimCluster` in this process, reached through the real
//!   adapters (`talos::adapter`, `k8s::adapter`): the Talos machine API over gRPC/mTLS and the
//!   kube-apiserver over HTTPS, exactly as against a real cluster;
//! - **the in-memory fakes** of both ports (`rollout::fake`): the engine alone, without
//!   encoding, TLS or the simulator's own work.
//!
//! Two measurements:
//! - **engine overhead**: every call is answered at once and a rebooted node is back at once;
//!   the executor polls without pause. Wall time per node is what the engine costs (state
//!   machine steps, journal writes with fsync, observations; on the simulator also the API
//!   calls and the simulator serving them).
//! - **wall time with fixed per-node delays**: a node is away for exactly `delay` after its
//!   reboot (the simulator's reboot timing; on the fakes a [`Delayed`] Talos port answers
//!   UNAVAILABLE until then), nodes of a wave are away together, and the ideal is
//!   `waves × delay`.
//!
//! And, for issue #36 item 6, [`window`]: the window time (first cordon → last uncordon, read
//! from the job's journal) of a pool that stages its installs ahead (`rollout.stage: ahead`)
//! against the same pool upgraded inside the window, on the simulator with fixed pull,
//! install and reboot delays.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;

use super::BenchError;
use crate::Locked as _;
use crate::desired::Revision;
use crate::inventory::{Machine, MachineRole, ObservedCluster, cluster_key};
use crate::plan::estimate::{DEFAULTS, Estimate, HISTORY_JOBS, History, JobSamples, estimate};
use crate::plan::stored::{CURRENT_KEY, CurrentPlan};
use crate::plan::{
    Basis, ClusterPlan, MachineTarget, Plan, PlanId, StageAhead, Step, TalosRollout,
};
#[cfg(feature = "fakes")]
use crate::rollout::fake::{FakeCluster, FakeNodeSpec};
use crate::rollout::journal::{JournalEntry, entries_prefix};
use crate::rollout::ports::{
    Component, ComponentImages, EtcdHealth, ImageNamespace, Manifest, NodeTarget, PortError,
    SnapshotInfo, SnapshotStreamed, TalosNode, TalosPort, UpgradeMethod,
};
use crate::rollout::{
    Executor, ExecutorConfig, JobInputs, RunOutcome, SystemClock, create_jobs_txn,
};
use crate::sim::cluster::{SimCluster, SimClusterConfig};
use crate::sim::talos::{RebootTiming, Role as SimRole, Scenario};
use crate::store::fjall::FjallStore;
use crate::store::{Store, StoreExt, Txn};
use crate::version::{KubeVersion, TalosVersion};

const FROM: &str = "v1.13.2";
const TO: &str = "v1.13.9";
const KUBE: &str = "v1.34.1";
const CLUSTER: &str = "bench";

/// A Talos port whose nodes stay away for `delay` after each reboot.
pub struct Delayed<T> {
    inner: T,
    delay: Duration,
    away_until: Mutex<HashMap<String, Instant>>,
}

impl<T> Delayed<T> {
    pub fn new(inner: T, delay: Duration) -> Delayed<T> {
        Delayed {
            inner,
            delay,
            away_until: Mutex::new(HashMap::new()),
        }
    }
    fn went_down(&self, node: &str) {
        self.away_until
            .locked()
            .insert(node.to_string(), Instant::now() + self.delay);
    }
    fn check(&self, op: &'static str, node: &str) -> Result<(), PortError> {
        let until = self.away_until.locked().get(node).copied();
        match until {
            Some(t) if Instant::now() < t => Err(PortError::transient(
                op,
                node,
                crate::rollout::ports::Detail("connection refused (rebooting)".into()),
            )),
            _ => Ok(()),
        }
    }
}

impl<T: TalosPort> TalosPort for Delayed<T> {
    async fn node(&self, node: &NodeTarget) -> Result<TalosNode, PortError> {
        self.check("version", &node.node)?;
        self.inner.node(node).await
    }
    async fn etcd(&self, control_plane: &[NodeTarget]) -> Result<EtcdHealth, PortError> {
        self.inner.etcd(control_plane).await
    }
    async fn etcd_snapshot(
        &self,
        node: &NodeTarget,
        dest: &Path,
    ) -> Result<SnapshotInfo, PortError> {
        self.inner.etcd_snapshot(node, dest).await
    }
    async fn etcd_snapshot_stream(
        &self,
        node: &NodeTarget,
        chunks: tokio::sync::mpsc::Sender<Vec<u8>>,
    ) -> Result<SnapshotStreamed, PortError> {
        self.inner.etcd_snapshot_stream(node, chunks).await
    }
    async fn pull_image(
        &self,
        node: &NodeTarget,
        image: &str,
        namespace: ImageNamespace,
    ) -> Result<(), PortError> {
        self.inner.pull_image(node, image, namespace).await
    }
    async fn upgrade(
        &self,
        node: &NodeTarget,
        image: &str,
        method: UpgradeMethod,
    ) -> Result<(), PortError> {
        self.inner.upgrade(node, image, method).await?;
        if method == UpgradeMethod::Legacy {
            self.went_down(&node.node);
        }
        Ok(())
    }
    async fn etcd_forfeit_leadership(
        &self,
        node: &NodeTarget,
    ) -> Result<Option<String>, PortError> {
        self.check("forfeit", &node.node)?;
        self.inner.etcd_forfeit_leadership(node).await
    }
    async fn reboot(&self, node: &NodeTarget) -> Result<(), PortError> {
        self.inner.reboot(node).await?;
        self.went_down(&node.node);
        Ok(())
    }
    async fn rollback(&self, node: &NodeTarget) -> Result<(), PortError> {
        self.inner.rollback(node).await?;
        self.went_down(&node.node);
        Ok(())
    }
    async fn component_images(&self, node: &NodeTarget) -> Result<ComponentImages, PortError> {
        self.inner.component_images(node).await
    }
    async fn component_args(
        &self,
        node: &NodeTarget,
    ) -> Result<crate::rollout::ports::ComponentArgs, PortError> {
        self.inner.component_args(node).await
    }
    async fn component_config_version(
        &self,
        node: &NodeTarget,
        component: crate::rollout::ports::Component,
    ) -> Result<Option<String>, PortError> {
        self.inner.component_config_version(node, component).await
    }
    async fn set_component_image(
        &self,
        node: &NodeTarget,
        component: Component,
        image: &str,
    ) -> Result<(), PortError> {
        self.inner.set_component_image(node, component, image).await
    }
    async fn bootstrap_manifests(&self, node: &NodeTarget) -> Result<Vec<Manifest>, PortError> {
        self.inner.bootstrap_manifests(node).await
    }
}

#[derive(Debug, Clone, Default)]
pub struct RolloutReport {
    pub nodes: usize,
    pub waves: usize,
    pub wall_ms: f64,
    pub per_node_ms: f64,
    pub commits: u64,
    pub ideal_ms: f64,
    pub upgrades: u64,
    pub max_upgrades_per_node: u64,
    /// The job's timings as its journal recorded them (what a plan's prediction is built
    /// from: `rollout::history`).
    pub samples: JobSamples,
    /// The plan the job ran.
    pub plan: Option<Arc<ClusterPlan>>,
    /// The job's window time as its journal recorded it: first cordon intent to last
    /// uncordon result (`rollout::history::window`).
    pub window: Option<Duration>,
    /// The job's installs ahead of the window, first `stage` intent to last `stage` result
    /// (`rollout::history::staging`); `None` when it staged nothing.
    pub staging: Option<Duration>,
    /// Boots per node, fewest and most (the simulator's counters; zero on the fakes, which
    /// do not count them).
    pub boots_per_node: (u64, u64),
}

impl RolloutReport {
    pub fn ratio_to_ideal(&self) -> f64 {
        self.wall_ms / self.ideal_ms
    }
}

/// One node as the benchmark plans it, from either backend.
struct NodeFacts {
    name: String,
    address: String,
    control_plane: bool,
    version: TalosVersion,
    kubelet: KubeVersion,
    boot_id: String,
}

fn observed(nodes: &[NodeFacts]) -> ObservedCluster {
    let machines = nodes
        .iter()
        .map(|n| {
            (
                n.name.clone(),
                Machine {
                    node: n.name.clone(),
                    id: format!("id-{}", n.name),
                    address: n.address.clone(),
                    role: if n.control_plane {
                        MachineRole::Controlplane
                    } else {
                        MachineRole::Worker
                    },
                    talos_version: Some(n.version.clone()),
                    installer_image: None,
                    schematic: None,
                    platform: None,
                    secure_boot: None,
                    factory_host: None,
                    extensions: std::collections::BTreeMap::new(),
                    kubelet_version: Some(n.kubelet.clone()),
                    ready: true,
                    cordoned: false,
                    reachable: true,
                    boot_id: Some(n.boot_id.clone()),
                    labels: Default::default(),
                },
            )
        })
        .collect();
    ObservedCluster::new(CLUSTER)
        .observe(None, machines)
        .with_rollouts_enabled(true)
}

#[allow(
    clippy::expect_used,
    reason = "a constant version literal that parses (unit tests build the same values)"
)]
fn step(pool: &str, nodes: &[&NodeFacts], max: u32, stage: Option<StageAhead>) -> Step {
    let role = if nodes[0].control_plane {
        MachineRole::Controlplane
    } else {
        MachineRole::Worker
    };
    Step::Talos(TalosRollout {
        stage,
        health: None,
        silence: None,
        hooks: None,
        pool: pool.into(),
        role,
        hop: 1,
        hops: 1,
        to: TalosVersion::parse(TO).expect("literal"),
        image: format!(
            "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:{TO}"
        ),
        max_unavailable: max,
        drain_timeout: Duration::from_secs(600),
        health_timeout: Duration::from_secs(900),
        upgrade_attempts: crate::desired::model::DEFAULT_UPGRADE_ATTEMPTS,
        drain: crate::desired::model::DrainPolicy::default(),
        taint_next_wave: true,
        waves: nodes
            .chunks(max as usize)
            .map(|w| {
                w.iter()
                    .map(|n| MachineTarget {
                        node: n.name.clone(),
                        id: format!("id-{}", n.name),
                        address: n.address.clone(),
                        from: n.version.clone(),
                        image: None,
                    })
                    .collect()
            })
            .collect(),
    })
}

/// A fresh fjall store in `dir` holding the cluster and one job rolling all of `nodes`
/// (control planes one at a time, workers `max` at a time; both staging ahead with `stage`).
fn install(
    dir: &Path,
    nodes: &[NodeFacts],
    max: u32,
    stage: Option<StageAhead>,
) -> Result<Installed, BenchError> {
    let obs = observed(nodes);
    let cp: Vec<&NodeFacts> = nodes.iter().filter(|n| n.control_plane).collect();
    let w: Vec<&NodeFacts> = nodes.iter().filter(|n| !n.control_plane).collect();
    let mut steps = Vec::new();
    if !cp.is_empty() {
        steps.push(step("controlplane", &cp, 1, stage.clone()));
    }
    if !w.is_empty() {
        steps.push(step("workers", &w, max, stage));
    }
    let waves = steps
        .iter()
        .map(|s| match s {
            Step::Talos(t) => t.waves.len(),
            _ => 0,
        })
        .sum();
    let plan = Plan {
        id: PlanId::from_digest([0xb5; 32]),
        parent: None,
        basis: Basis {
            desired: Revision {
                content: "bench".into(),
                commit: None,
            },
            observed: [(CLUSTER.to_string(), obs.generation)].into(),
            applied: String::new(),
            running: Default::default(),
            halted: Default::default(),
        },
        clusters: vec![Arc::new(ClusterPlan {
            raised_by: Vec::new(),
            preflight: Vec::new(),
            health: None,
            hooks: None,
            cluster: CLUSTER.into(),
            steps,
            settings: vec![],
            unchanged: vec![],
            status: Default::default(),
            notes: vec![],
            diffs: vec![],
        })],
        approvals_required: 1,
        catalog: String::new(),
        applies: Default::default(),
        estimates: Vec::new(),
    };
    let store = Arc::new(FjallStore::open(&dir.join("store")).map_err(store_err)?);
    store
        .commit(
            Txn::new()
                .put_record(CURRENT_KEY, &CurrentPlan { id: plan.id })
                .put_record(cluster_key(CLUSTER), &obs),
        )
        .map_err(store_err)?;
    let no_windows: &[crate::desired::window::MaintenanceWindow] = &[];
    let inputs = JobInputs {
        global_rollouts: true,
        clusters: [(CLUSTER.to_string(), &obs)].into(),
        windows: [(CLUSTER.to_string(), no_windows)].into(),
        exclusions: Default::default(),
        backup_recipients: Default::default(),
    };
    let created =
        create_jobs_txn(&plan, &inputs, Timestamp::now()).map_err(|e| BenchError::Rollout {
            what: crate::error_chain(&e),
        })?;
    store.commit(created.txn).map_err(store_err)?;
    let job = created.jobs[0].id.clone();
    let cluster_plan = plan.clusters[0].clone();
    Ok(Installed {
        store,
        job,
        waves,
        plan: cluster_plan,
    })
}

/// What [`install`] set up.
struct Installed {
    store: Arc<FjallStore>,
    job: crate::rollout::JobId,
    waves: usize,
    plan: Arc<ClusterPlan>,
}

/// What finished job `id`'s journal says: its samples, window time and staging time.
struct JournalFacts {
    samples: JobSamples,
    window: Option<Duration>,
    staging: Option<Duration>,
}

/// [`JournalFacts`] of finished job `id`, read back from its journal.
fn journal_of(store: &dyn Store, id: &crate::rollout::JobId) -> Result<JournalFacts, BenchError> {
    let job = crate::ops::jobs::load_job(store, id)
        .map_err(store_err)?
        .ok_or_else(|| BenchError::Rollout {
            what: format!("job {id} is not in the store"),
        })?;
    let entries: Vec<JournalEntry> = store
        .scan_records::<JournalEntry>(&entries_prefix(id))
        .map_err(store_err)?
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    Ok(JournalFacts {
        samples: crate::rollout::history::samples(&job, &entries),
        window: crate::rollout::history::window(&entries),
        staging: crate::rollout::history::staging(&entries),
    })
}

/// Where the rollout runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// The simulator (Talos API over gRPC/mTLS, kube-apiserver over HTTPS) through the real
    /// adapters.
    Sim,
    /// The in-memory fakes of both ports: the engine alone.
    Fakes,
}

impl Backend {
    /// Issue #25's target for the zero-delay run, per node: the engine alone, or through the
    /// real adapters against the in-process simulator (which shares the CPUs).
    pub fn per_node_target_ms(self) -> u32 {
        match self {
            Backend::Sim => 15,
            Backend::Fakes => 5,
        }
    }

    /// Issue #25's target for the fixed-delay run, wall time over the ideal.
    pub fn ratio_target(self) -> f64 {
        match self {
            Backend::Sim => 1.10,
            Backend::Fakes => 1.02,
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Sim => "simulator via the real adapters",
            Backend::Fakes => "in-memory fakes",
        })
    }
}

/// Run one rollout of `cps + workers` nodes on `backend`; `delay` is how long each node is
/// away after its reboot (zero: the engine-overhead measurement), `poll` the executor's poll
/// interval (and on the simulator the adapters' retry and drain pace, at least 1 ms).
pub fn run(
    dir: &Path,
    backend: Backend,
    cps: usize,
    workers: usize,
    max: u32,
    delay: Duration,
    poll: Duration,
) -> Result<RolloutReport, BenchError> {
    let mut cfg = ExecutorConfig::new(true, dir.join("snapshots"));
    cfg.poll = poll;
    cfg.backoff_min = poll;
    cfg.backoff_max = poll.max(Duration::from_millis(1));
    // The engine alone runs on one thread, as a job does in the daemon; the simulator's
    // servers get worker threads of their own.
    let rt = super::runtime(match backend {
        Backend::Fakes => tokio::runtime::Builder::new_current_thread(),
        Backend::Sim => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
    })?;
    match backend {
        #[cfg(feature = "fakes")]
        Backend::Fakes => run_fakes(&rt, dir, cfg, cps, workers, max, delay),
        #[cfg(not(feature = "fakes"))]
        Backend::Fakes => Err(BenchError::Rollout {
            what: "`--backend fakes` needs a medea built with the `fakes` feature \
                   (cargo build --release --features fakes); `--backend sim` runs in any build"
                .to_string(),
        }),
        Backend::Sim => rt.block_on(run_sim(
            dir,
            cfg,
            cps,
            workers,
            max,
            SimJob {
                delays: SimDelays {
                    reboot: delay,
                    ..SimDelays::default()
                },
                stage: None,
            },
            poll,
        )),
    }
}

fn store_err(e: crate::store::StoreError) -> BenchError {
    BenchError::Store(Box::new(e))
}

/// The executor's run of `job`, timed; an error unless it succeeded.
async fn timed_run<T: TalosPort, K: crate::rollout::ports::KubePort>(
    exec: &Executor<T, K, SystemClock>,
    job: &crate::rollout::JobId,
) -> Result<Duration, BenchError> {
    let t = Instant::now();
    let outcome = exec.run(job).await.map_err(|e| BenchError::Rollout {
        what: crate::error_chain(&e),
    })?;
    let wall = t.elapsed();
    if outcome != RunOutcome::Succeeded {
        return Err(BenchError::Rollout {
            what: format!("the job did not succeed: {outcome:?}"),
        });
    }
    Ok(wall)
}

/// The report, after checking that every node runs [`TO`]; `nodes` yields each node's name,
/// running version and Upgrade calls.
fn report(
    nodes: impl Iterator<Item = (String, String, u64)>,
    waves: usize,
    wall: Duration,
    delay: Duration,
    commits: u64,
) -> Result<RolloutReport, BenchError> {
    let mut count = 0;
    let mut upgrades = 0;
    let mut max_upgrades = 0;
    for (name, running, n) in nodes {
        if running != TO {
            return Err(BenchError::Rollout {
                what: format!("{name} still runs {running}"),
            });
        }
        count += 1;
        upgrades += n;
        max_upgrades = max_upgrades.max(n);
    }
    let wall_ms = wall.as_secs_f64() * 1e3;
    Ok(RolloutReport {
        nodes: count,
        waves,
        wall_ms,
        per_node_ms: wall_ms / count.max(1) as f64,
        commits,
        ideal_ms: waves as f64 * delay.as_secs_f64() * 1e3,
        upgrades,
        max_upgrades_per_node: max_upgrades,
        samples: JobSamples::default(),
        plan: None,
        window: None,
        staging: None,
        boots_per_node: (0, 0),
    })
}

#[cfg(feature = "fakes")]
fn run_fakes(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    cfg: ExecutorConfig,
    cps: usize,
    workers: usize,
    max: u32,
    delay: Duration,
) -> Result<RolloutReport, BenchError> {
    let mut specs = Vec::new();
    for i in 1..=cps {
        specs.push(FakeNodeSpec::new(&format!("cp-{i}"), true, FROM, KUBE));
    }
    for i in 1..=workers {
        specs.push(FakeNodeSpec::new(&format!("w-{i:04}"), false, FROM, KUBE));
    }
    let fake = FakeCluster::new(&specs);
    // A rebooted node is back at the first observation after its reboot.
    fake.edit(|s| s.reboot_polls = 0);
    let facts: Vec<NodeFacts> = {
        let s = fake.state();
        specs
            .iter()
            .map(|spec| {
                let n = &s.nodes[&spec.name];
                NodeFacts {
                    name: spec.name.clone(),
                    address: n.address.clone(),
                    control_plane: n.control_plane,
                    version: n.version.clone(),
                    kubelet: n.kubelet.clone(),
                    boot_id: n.boot_id.clone(),
                }
            })
            .collect()
    };
    let Installed {
        store,
        job,
        waves,
        plan,
    } = install(dir, &facts, max, None)?;
    let store_dyn: Arc<dyn Store> = store;
    let exec = Executor::new(
        store_dyn.clone(),
        Delayed::new(fake.talos(), delay),
        fake.kube(),
        SystemClock,
        cfg,
    );
    let wall = rt.block_on(timed_run(&exec, &job))?;
    let s = fake.state();
    let journal = journal_of(store_dyn.as_ref(), &job)?;
    report(
        s.nodes.iter().map(|(name, n)| {
            (
                name.clone(),
                n.version.to_string(),
                u64::from(n.counters.upgrade),
            )
        }),
        waves,
        wall,
        delay,
        exec.commits(),
    )
    .map(|r| RolloutReport {
        samples: journal.samples,
        window: journal.window,
        staging: journal.staging,
        plan: Some(plan),
        ..r
    })
}

/// The simulator's fixed per-node delays.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimDelays {
    /// An image pull (`timing.imagePull`).
    pub pull: Duration,
    /// A `LifecycleService.Upgrade`'s install (`timing.install`).
    pub install: Duration,
    /// How long a node is away after its reboot (`timing.reboot`).
    pub reboot: Duration,
}

/// What a simulator run varies besides its size: the delays, and whether the pool stages.
#[derive(Debug, Clone, Default)]
struct SimJob {
    delays: SimDelays,
    stage: Option<StageAhead>,
}

#[allow(
    clippy::expect_used,
    reason = "a constant version literal that parses (unit tests build the same values)"
)]
async fn run_sim(
    dir: &Path,
    cfg: ExecutorConfig,
    cps: usize,
    workers: usize,
    max: u32,
    SimJob { delays, stage }: SimJob,
    poll: Duration,
) -> Result<RolloutReport, BenchError> {
    let version = TalosVersion::parse(FROM).expect("literal");
    let kube = KubeVersion::parse(KUBE).expect("literal");
    // The simulator needs a control plane; a workers-only run leaves it out of the job.
    let mut scenario = Scenario::uniform(cps.max(1), workers, version, kube.clone());
    scenario.cluster_name = CLUSTER.into();
    scenario.timing.reboot = RebootTiming::After(delays.reboot);
    scenario.timing.image_pull = delays.pull;
    scenario.timing.install = delays.install;
    let sim_err = |e: crate::sim::cluster::SimClusterError| BenchError::Rollout {
        what: format!("the simulator: {}", crate::error_chain(&e)),
    };
    let sim = SimCluster::start(scenario, SimClusterConfig::default())
        .await
        .map_err(sim_err)?;
    let creds = dir.join("creds");
    sim.write_creds(&creds.join(CLUSTER)).map_err(sim_err)?;
    let names: Vec<String> = sim
        .scenario()
        .nodes
        .iter()
        .filter(|n| cps > 0 || n.role != SimRole::Controlplane)
        .map(|n| n.name.clone())
        .collect();
    let state = |name: &str| {
        sim.talos
            .node_state(name)
            .ok_or_else(|| BenchError::Invalid {
                what: format!("the simulator has no node `{name}`"),
            })
    };
    let mut facts = Vec::with_capacity(names.len());
    for name in &names {
        let n = state(name)?;
        facts.push(NodeFacts {
            name: name.clone(),
            address: n.address,
            control_plane: n.role == SimRole::Controlplane,
            version: n.running,
            kubelet: kube.clone(),
            boot_id: n.boot_id,
        });
    }
    let Installed {
        store,
        job,
        waves,
        plan,
    } = install(dir, &facts, max, stage)?;
    let (talos, kube) =
        crate::ops::cluster_ports::paced(&creds, CLUSTER, poll.max(Duration::from_millis(1)))
            .await
            .map_err(|e| BenchError::Rollout {
                what: crate::error_chain(&e),
            })?;
    let store_dyn: Arc<dyn Store> = store;
    let exec = Executor::new(store_dyn.clone(), talos, kube, SystemClock, cfg);
    let wall = timed_run(&exec, &job).await;
    let mut nodes = Vec::with_capacity(names.len());
    let mut boots = (u64::MAX, 0);
    for name in &names {
        let running = state(name)?.running.to_string();
        let counters = sim.talos.counters(name);
        let upgrades = counters.as_ref().map_or(0, |c| c.upgrades());
        let booted = counters.as_ref().map_or(0, |c| c.boots);
        boots = (boots.0.min(booted), boots.1.max(booted));
        nodes.push((name.clone(), running, upgrades));
    }
    sim.shutdown().await;
    let wall = wall?;
    let journal = journal_of(store_dyn.as_ref(), &job)?;
    report(
        nodes.into_iter(),
        waves,
        wall,
        delays.reboot,
        exec.commits(),
    )
    .map(|r| RolloutReport {
        samples: journal.samples,
        window: journal.window,
        staging: journal.staging,
        boots_per_node: if names.is_empty() { (0, 0) } else { boots },
        plan: Some(plan),
        ..r
    })
}

/// One rollout of the prediction benchmark: what the plan predicted from the journals of the
/// runs before it, and how long it took.
#[derive(Debug, Clone)]
pub struct PredictionRow {
    /// The prediction for the whole job (median and pessimistic bound, whole seconds).
    pub predicted: Estimate,
    /// The job's wall time, in milliseconds.
    pub actual_ms: f64,
}

impl PredictionRow {
    /// The median prediction's error relative to the actual wall time: positive when the
    /// prediction was too long.
    pub fn error(&self) -> f64 {
        (self.predicted.total.median_secs as f64 * 1e3 - self.actual_ms) / self.actual_ms
    }
    /// Whether the actual wall time stayed within the pessimistic bound.
    pub fn within_pessimistic(&self) -> bool {
        self.actual_ms <= self.predicted.total.pessimistic_secs as f64 * 1e3
    }
}

/// Issue #36 item 6: how close a plan's predicted duration comes to the rollout it predicts.
/// `runs + 1` identical rollouts of `workers` workers on the simulator with fixed per-node
/// delays, one after another; before each run after the first, the plan's prediction is
/// computed exactly as the daemon computes it (`plan::estimate` from the samples
/// `rollout::history` reads back from the journals of the runs before it, at most
/// [`HISTORY_JOBS`]), then compared with the run's wall time.
pub fn prediction(
    dir: &Path,
    workers: usize,
    max: u32,
    delay: Duration,
    poll: Duration,
    runs: usize,
) -> Result<Vec<PredictionRow>, BenchError> {
    let mut history = History::default();
    let mut rows = Vec::with_capacity(runs);
    for k in 0..=runs {
        let r = run(
            &dir.join(format!("run-{k}")),
            Backend::Sim,
            0,
            workers,
            max,
            delay,
            poll,
        )?;
        let plan = r.plan.clone().ok_or_else(|| BenchError::Rollout {
            what: "the run reported no plan".into(),
        })?;
        if k > 0 {
            rows.push(PredictionRow {
                predicted: estimate(&plan, &history, &DEFAULTS, &[], &[], None),
                actual_ms: r.wall_ms,
            });
        }
        history.jobs.insert(0, r.samples);
        history.jobs.truncate(HISTORY_JOBS);
    }
    Ok(rows)
}

/// One rollout of the window benchmark, as its journal and the simulator recorded it.
#[derive(Debug, Clone)]
pub struct WindowRun {
    /// First cordon intent to last uncordon result.
    pub window: Duration,
    /// First `stage` intent to last `stage` result; `None` for the unstaged job.
    pub staging: Option<Duration>,
    /// The whole job's wall time, in milliseconds.
    pub wall_ms: f64,
}

/// Issue #36 item 6: the same pool's window time unstaged and staged, run after run.
#[derive(Debug, Clone)]
pub struct WindowReport {
    /// Workers rolled (one pool).
    pub workers: usize,
    /// Waves of the pool.
    pub waves: usize,
    /// The unstaged runs, in the order they ran (each right before its staged twin).
    pub unstaged: Vec<WindowRun>,
    /// The staged runs.
    pub staged: Vec<WindowRun>,
}

impl WindowReport {
    fn windows(runs: &[WindowRun]) -> super::stats::Samples {
        let mut s = super::stats::Samples::new();
        for r in runs {
            s.push(r.window);
        }
        s
    }
    /// The unstaged window times, in milliseconds.
    pub fn unstaged_ms(&self) -> super::stats::Samples {
        Self::windows(&self.unstaged)
    }
    /// The staged window times, in milliseconds.
    pub fn staged_ms(&self) -> super::stats::Samples {
        Self::windows(&self.staged)
    }
    /// The staged runs' installs ahead of the window, in milliseconds.
    pub fn staging_ms(&self) -> super::stats::Samples {
        let mut s = super::stats::Samples::new();
        for d in self.staged.iter().filter_map(|r| r.staging) {
            s.push(d);
        }
        s
    }
    /// Median staged window over median unstaged window (below 1: staging saves window time).
    pub fn ratio(&self) -> f64 {
        self.staged_ms().median() / self.unstaged_ms().median()
    }
    /// The median of each round's staged window over its unstaged twin's.
    pub fn ratio_per_round(&self) -> super::stats::Samples {
        let mut s = super::stats::Samples::new();
        for (u, st) in self.unstaged.iter().zip(&self.staged) {
            s.push_value(st.window.as_secs_f64() / u.window.as_secs_f64());
        }
        s
    }
}

/// Issue #36 item 6: a staged pool's window time against the unstaged one. `runs` rounds;
/// each rolls `workers` workers (`max` at a time) on a fresh simulator with fixed `delays`,
/// first unstaged (each node pulls, installs and reboots inside the window), then with
/// `rollout.stage: ahead` and `parallelism` (pull + install of every node before the first
/// cordon, so the window holds the reboots alone). Both jobs are the plan/job machinery's own
/// (`create_jobs_txn` from a plan whose TalosRollout carries the stage setting, the executor
/// through the real adapters, no maintenance windows: staging starts as soon as the job reaches
/// the step). Each run must succeed with every node on the target, installed once and booted
/// once; the window time is read from its journal.
pub fn window(
    dir: &Path,
    workers: usize,
    max: u32,
    delays: SimDelays,
    parallelism: u32,
    poll: Duration,
    runs: usize,
) -> Result<WindowReport, BenchError> {
    if workers == 0 || max == 0 || parallelism == 0 {
        return Err(BenchError::Invalid {
            what: "the window benchmark needs at least one worker, a maxUnavailable and a stage parallelism of at least 1".into(),
        });
    }
    let mut out = WindowReport {
        workers,
        waves: workers.div_ceil(max as usize),
        unstaged: Vec::with_capacity(runs),
        staged: Vec::with_capacity(runs),
    };
    for k in 0..runs {
        for staged in [false, true] {
            let stage = staged.then_some(StageAhead { parallelism });
            let name = if staged { "staged" } else { "unstaged" };
            let run = window_run(
                &dir.join(format!("run-{k}-{name}")),
                workers,
                max,
                delays,
                stage,
                poll,
            )?;
            if staged {
                out.staged.push(run);
            } else {
                out.unstaged.push(run);
            }
        }
    }
    Ok(out)
}

/// One job of the window benchmark on a fresh simulator, checked.
fn window_run(
    dir: &Path,
    workers: usize,
    max: u32,
    delays: SimDelays,
    stage: Option<StageAhead>,
    poll: Duration,
) -> Result<WindowRun, BenchError> {
    let staged = stage.is_some();
    let mut cfg = ExecutorConfig::new(true, dir.join("snapshots"));
    cfg.poll = poll;
    cfg.backoff_min = poll;
    cfg.backoff_max = poll.max(Duration::from_millis(1));
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.worker_threads(2);
    let rt = super::runtime(b)?;
    let r = rt.block_on(run_sim(
        dir,
        cfg,
        0,
        workers,
        max,
        SimJob { delays, stage },
        poll,
    ))?;
    let failed = |what: String| BenchError::Rollout {
        what: format!(
            "the {} job: {what}",
            if staged { "staged" } else { "unstaged" }
        ),
    };
    if r.upgrades != r.nodes as u64 || r.max_upgrades_per_node != 1 {
        return Err(failed(format!(
            "{} installs on {} nodes, at most {} on one (one each expected)",
            r.upgrades, r.nodes, r.max_upgrades_per_node
        )));
    }
    if r.boots_per_node != (1, 1) {
        return Err(failed(format!(
            "boots per node between {} and {} (one each expected)",
            r.boots_per_node.0, r.boots_per_node.1
        )));
    }
    let window = r
        .window
        .ok_or_else(|| failed("its journal holds no cordon or no uncordon".into()))?;
    if staged != r.staging.is_some() {
        return Err(failed(format!(
            "its journal {} stage command",
            if staged { "holds no" } else { "holds a" }
        )));
    }
    Ok(WindowRun {
        window,
        staging: r.staging,
        wall_ms: r.wall_ms,
    })
}
