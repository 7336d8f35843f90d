//! `medea bench rollout`: the rollout engine (state machine + executor + durable fjall
//! journal) on the in-memory fakes of both ports (`rollout::fake`).
//!
//! Two measurements:
//! - **engine overhead**: every port call returns at once and a rebooted node is back at the
//!   next observation; the executor polls without pause. Wall time per node is what the
//!   engine itself costs (state machine steps, journal writes with fsync, observations).
//! - **wall time with fixed per-node delays**: a node is away for exactly `delay` after its
//!   reboot (a [`Delayed`] Talos port answers UNAVAILABLE until then), nodes of a wave are away
//!   together, and the ideal is `waves × delay`.
//!
//! The real Talos/Kubernetes adapters against the simulator are not measured here (see
//! design/performance.md for what that leaves out).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;

use super::BenchError;
use crate::desired::Revision;
use crate::inventory::{Machine, MachineRole, ObservedCluster, cluster_key};
use crate::plan::stored::{CURRENT_KEY, CurrentPlan};
use crate::plan::{Basis, ClusterPlan, MachineTarget, Plan, PlanId, Step, TalosRollout};
use crate::rollout::fake::{FakeCluster, FakeNodeSpec};
use crate::rollout::ports::{
    Component, ComponentImages, EtcdHealth, ImageNamespace, Manifest, NodeTarget, PortError,
    SnapshotInfo, TalosNode, TalosPort, UpgradeMethod,
};
use crate::rollout::{
    Executor, ExecutorConfig, JobInputs, RunOutcome, SystemClock, create_jobs_txn,
};
use crate::store::fjall::FjallStore;
use crate::store::{Store, Txn};
use crate::version::TalosVersion;

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
            .lock()
            .expect("delay lock")
            .insert(node.to_string(), Instant::now() + self.delay);
    }
    fn check(&self, op: &'static str, node: &str) -> Result<(), PortError> {
        let until = self
            .away_until
            .lock()
            .expect("delay lock")
            .get(node)
            .copied();
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
    async fn reboot(&self, node: &NodeTarget) -> Result<(), PortError> {
        self.inner.reboot(node).await?;
        self.went_down(&node.node);
        Ok(())
    }
    async fn component_images(&self, node: &NodeTarget) -> Result<ComponentImages, PortError> {
        self.inner.component_images(node).await
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
    pub upgrades: u32,
    pub max_upgrades_per_node: u32,
}

impl RolloutReport {
    pub fn ratio_to_ideal(&self) -> f64 {
        self.wall_ms / self.ideal_ms
    }
}

fn observed(fake: &FakeCluster) -> ObservedCluster {
    let s = fake.state();
    let machines = s
        .nodes
        .iter()
        .map(|(name, n)| {
            (
                name.clone(),
                Machine {
                    node: name.clone(),
                    id: format!("id-{name}"),
                    address: n.address.clone(),
                    role: if n.control_plane {
                        MachineRole::Controlplane
                    } else {
                        MachineRole::Worker
                    },
                    talos_version: Some(n.version.clone()),
                    installer_image: None,
                    schematic: None,
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

fn step(fake: &FakeCluster, pool: &str, nodes: &[String], max: u32) -> Step {
    let s = fake.state();
    let role = if s.nodes[&nodes[0]].control_plane {
        MachineRole::Controlplane
    } else {
        MachineRole::Worker
    };
    Step::Talos(TalosRollout {
        pool: pool.into(),
        role,
        hop: 1,
        hops: 1,
        to: TalosVersion::parse(TO).expect("literal"),
        image: format!("factory.talos.dev/installer/abc:{TO}"),
        max_unavailable: max,
        drain_timeout: Duration::from_secs(600),
        health_timeout: Duration::from_secs(900),
        waves: nodes
            .chunks(max as usize)
            .map(|w| {
                w.iter()
                    .map(|n| MachineTarget {
                        node: n.clone(),
                        id: format!("id-{n}"),
                        address: s.nodes[n].address.clone(),
                        from: s.nodes[n].version.clone(),
                    })
                    .collect()
            })
            .collect(),
    })
}

/// A cluster of `cps` control planes and `workers` workers, one job rolling all of them
/// (control planes one at a time, workers `max` at a time) in a fresh fjall store in `dir`.
fn install(
    dir: &Path,
    cps: usize,
    workers: usize,
    max: u32,
) -> Result<(FakeCluster, Arc<FjallStore>, crate::rollout::JobId, usize), BenchError> {
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
    let obs = observed(&fake);
    let mut steps = Vec::new();
    let cp: Vec<String> = (1..=cps).map(|i| format!("cp-{i}")).collect();
    let w: Vec<String> = (1..=workers).map(|i| format!("w-{i:04}")).collect();
    if !cp.is_empty() {
        steps.push(step(&fake, "controlplane", &cp, 1));
    }
    if !w.is_empty() {
        steps.push(step(&fake, "workers", &w, max));
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
        },
        clusters: vec![ClusterPlan {
            cluster: CLUSTER.into(),
            steps,
            settings: vec![],
            unchanged: vec![],
            status: Default::default(),
            notes: vec![],
            diffs: vec![],
        }],
        approvals_required: 1,
        catalog: String::new(),
        applies: Default::default(),
    };
    let store =
        Arc::new(FjallStore::open(&dir.join("store")).map_err(|e| BenchError::Store(Box::new(e)))?);
    store
        .commit(
            Txn::new()
                .put_record(CURRENT_KEY, &CurrentPlan { id: plan.id })
                .put_record(cluster_key(CLUSTER), &obs),
        )
        .map_err(|e| BenchError::Store(Box::new(e)))?;
    let no_windows: &[crate::desired::window::MaintenanceWindow] = &[];
    let inputs = JobInputs {
        global_rollouts: true,
        clusters: [(CLUSTER.to_string(), &obs)].into(),
        windows: [(CLUSTER.to_string(), no_windows)].into(),
    };
    let created =
        create_jobs_txn(&plan, &inputs, Timestamp::now()).map_err(|e| BenchError::Rollout {
            what: crate::error_chain(&e),
        })?;
    store
        .commit(created.txn)
        .map_err(|e| BenchError::Store(Box::new(e)))?;
    let job = created.jobs[0].id.clone();
    Ok((fake, store, job, waves))
}

/// Run one rollout of `cps + workers` nodes; `delay` is how long each node is away after its
/// reboot (zero: the engine-overhead measurement), `poll` the executor's poll interval.
pub fn run(
    dir: &Path,
    cps: usize,
    workers: usize,
    max: u32,
    delay: Duration,
    poll: Duration,
) -> Result<RolloutReport, BenchError> {
    let (fake, store, job, waves) = install(dir, cps, workers, max)?;
    let mut cfg = ExecutorConfig::new(true, dir.join("snapshots"));
    cfg.poll = poll;
    cfg.backoff_min = poll;
    cfg.backoff_max = poll.max(Duration::from_millis(1));
    let store_dyn: Arc<dyn Store> = store.clone();
    let exec = Executor::new(
        store_dyn,
        Delayed::new(fake.talos(), delay),
        fake.kube(),
        SystemClock,
        cfg,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| BenchError::Spawn {
            what: "a tokio runtime".into(),
            err,
        })?;
    let t = Instant::now();
    let outcome = rt
        .block_on(exec.run(&job))
        .map_err(|e| BenchError::Rollout {
            what: crate::error_chain(&e),
        })?;
    let wall = t.elapsed();
    if outcome != RunOutcome::Succeeded {
        return Err(BenchError::Rollout {
            what: format!("the job did not succeed: {outcome:?}"),
        });
    }
    let s = fake.state();
    let nodes = s.nodes.len();
    for (name, n) in &s.nodes {
        if n.version.to_string() != TO {
            return Err(BenchError::Rollout {
                what: format!("{name} still runs {}", n.version),
            });
        }
    }
    Ok(RolloutReport {
        nodes,
        waves,
        wall_ms: wall.as_secs_f64() * 1e3,
        per_node_ms: wall.as_secs_f64() * 1e3 / nodes as f64,
        commits: exec.commits(),
        ideal_ms: waves as f64 * delay.as_secs_f64() * 1e3,
        upgrades: s.nodes.values().map(|n| n.counters.upgrade).sum(),
        max_upgrades_per_node: s
            .nodes
            .values()
            .map(|n| n.counters.upgrade)
            .max()
            .unwrap_or(0),
    })
}
