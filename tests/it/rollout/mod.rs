//! Rollout executor: sequences, safety rails, fault matrix, resume, crash harness.
//!
//! Executor tests run against the in-memory fakes with paused tokio time (zero real delay).
//! This file holds what the subjects share (the fake world, plans, steps, the tripwire store);
//! each subject is a module:
//!
//! - [`journal`]: the journal format (commit sizes, fsyncs, checkpoints);
//! - [`sequences`]: the order of a Talos rollout (waves, multi-hop, legacy nodes, pull-ahead);
//! - [`stage`]: installs ahead of the windows (`rollout.stage: ahead`, issue #36);
//! - [`gates`]: job creation, the global and per-cluster switches, halt requests, windows;
//! - [`faults`]: the fault matrix over the fakes;
//! - [`kubernetes`]: the Kubernetes rollout;
//! - [`leadership`]: the etcd leader last, its forfeit, the quorum gate, cordon ownership;
//! - [`resume`]: resuming from every kind of dangling intent;
//! - [`observation`]: when the nodes of a wave are observed;
//! - [`fencing`]: a fenced executor, an ended term;
//! - [`machine_props`]: property tests of the state machine;
//! - [`crash`]: the crash harness (a child medea killed at every journal point), also used by
//!   `rollout_sim` and `rollout_health`.

mod boot_entries;
pub mod crash;
mod estimate;
mod faults;
mod fencing;
mod gates;
mod journal;
mod kubernetes;
mod leadership;
mod machine_props;
mod observation;
mod resume;
mod sequences;
mod stage;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use medea::desired::Revision;
use medea::desired::window::MaintenanceWindow;
use medea::inventory::{Machine, MachineRole, ObservedCluster, cluster_key};
use medea::plan::stored::{CURRENT_KEY, CurrentPlan};
use medea::plan::{
    Basis, ClusterPlan, KubeRollout, MachineTarget, Plan, PlanId, Step, TalosRollout,
};
use medea::rollout::executor::{EventState, RolloutEvent};
use medea::rollout::fake::{FakeCluster, FakeNodeSpec, FakeState, Fault, MemStore};
use medea::rollout::journal::{Entry, JournalEntry, entries_prefix, job_key};
use medea::rollout::ports::Component;
use medea::rollout::sequencer::{CommandOp, HaltCode, Job, JobId, JobState};
use medea::rollout::{
    Executor, ExecutorConfig, Gate, JobInputs, RolloutError, RunOutcome, TokioClock,
    create_jobs_txn, request_halt,
};
use medea::store::record::decode;
use medea::store::{Op as TxnOp, Store, StoreError, StoreExt, Table, Txn};
use medea::version::{KubeVersion, TalosVersion};

pub const FROM: &str = "v1.13.2";
pub const TO: &str = "v1.13.9";
pub const KUBE: &str = "v1.33.4";
pub const CLUSTER: &str = "prod";

pub fn t0() -> Timestamp {
    "2026-12-02T12:00:00Z".parse().unwrap()
}

fn tv(s: &str) -> TalosVersion {
    TalosVersion::parse(s).unwrap()
}

/// `cp-1..cp-N` control-plane nodes and `w-1..w-M` workers.
pub fn specs(cps: usize, workers: usize, talos: &str, kube: &str) -> Vec<FakeNodeSpec> {
    let mut v = Vec::new();
    for i in 1..=cps {
        v.push(FakeNodeSpec::new(&format!("cp-{i}"), true, talos, kube));
    }
    for i in 1..=workers {
        v.push(FakeNodeSpec::new(&format!("w-{i}"), false, talos, kube));
    }
    v
}

/// The observed record of the fake cluster, rollouts enabled.
pub fn observed(fake: &FakeCluster) -> ObservedCluster {
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
                    platform: None,
                    secure_boot: None,
                    factory_host: None,
                    extensions: BTreeMap::new(),
                    kubelet_version: Some(n.kubelet.clone()),
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

/// A Talos step of `pool` with the given waves.
pub fn talos_step(fake: &FakeCluster, pool: &str, waves: &[&[&str]], to: &str, max: u32) -> Step {
    let s = fake.state();
    let role = if s.nodes[waves[0][0]].control_plane {
        MachineRole::Controlplane
    } else {
        MachineRole::Worker
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
        to: tv(to),
        image: format!(
            "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:{to}"
        ),
        max_unavailable: max,
        drain_timeout: Duration::from_secs(600),
        health_timeout: Duration::from_secs(900),
        upgrade_attempts: medea::desired::model::DEFAULT_UPGRADE_ATTEMPTS,
        drain: medea::desired::model::DrainPolicy::default(),
        taint_next_wave: true,
        waves: waves
            .iter()
            .map(|w| {
                w.iter()
                    .map(|n| MachineTarget {
                        node: n.to_string(),
                        id: format!("id-{n}"),
                        address: s.nodes[*n].address.clone(),
                        from: s.nodes[*n].version.clone(),
                        image: None,
                    })
                    .collect()
            })
            .collect(),
    })
}

/// `step` with `rollout.stage: ahead` at `parallelism` (issue #36).
pub fn staged(step: Step, parallelism: u32) -> Step {
    match step {
        Step::Talos(mut t) => {
            t.stage = Some(medea::plan::StageAhead { parallelism });
            Step::Talos(t)
        }
        other => other,
    }
}

/// The standard mixed rollout with both pools staged ahead.
pub fn staged_mixed_steps(fake: &FakeCluster) -> Vec<Step> {
    mixed_steps(fake)
        .into_iter()
        .map(|s| staged(s, 2))
        .collect()
}

pub fn kube_step(cps: &[&str], workers: &[&str], from: &str, to: &str) -> Step {
    Step::Kubernetes(KubeRollout {
        from: KubeVersion::parse(from).unwrap(),
        to: KubeVersion::parse(to).unwrap(),
        control_plane: cps.iter().map(|s| s.to_string()).collect(),
        workers: workers.iter().map(|s| s.to_string()).collect(),
        health_timeout: Duration::from_secs(600),
        supported_talos: None,
    })
}

/// The standard mixed rollout: the control plane one by one, then the workers two at a time.
pub fn mixed_steps(fake: &FakeCluster) -> Vec<Step> {
    vec![
        talos_step(
            fake,
            "control-plane",
            &[&["cp-1"], &["cp-2"], &["cp-3"]],
            TO,
            1,
        ),
        talos_step(fake, "workers", &[&["w-1", "w-2"], &["w-3"]], TO, 2),
    ]
}

pub fn plan(observed: &ObservedCluster, steps: Vec<Step>, salt: u8) -> Plan {
    let mut digest = [0u8; 32];
    digest[0] = salt;
    digest[1] = steps.len() as u8;
    digest[31] = 0x5a;
    Plan {
        id: PlanId::from_digest(digest),
        parent: None,
        basis: Basis {
            desired: Revision {
                content: "c0ffee".into(),
                commit: None,
            },
            observed: [(CLUSTER.to_string(), observed.generation)].into(),
            applied: String::new(),
            running: Default::default(),
            halted: Default::default(),
        },
        clusters: vec![std::sync::Arc::new(ClusterPlan {
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
    }
}

/// Make `plan` current, record the cluster, create the job.
pub fn install(
    store: &dyn Store,
    plan: &Plan,
    observed: &ObservedCluster,
    windows: &[MaintenanceWindow],
) -> Result<JobId, RolloutError> {
    install_with(store, plan, observed, windows, &[])
}

/// [`install`] with maintenance exclusions.
pub fn install_with(
    store: &dyn Store,
    plan: &Plan,
    observed: &ObservedCluster,
    windows: &[MaintenanceWindow],
    exclusions: &[medea::desired::exclusion::Exclusion],
) -> Result<JobId, RolloutError> {
    install_full(store, plan, observed, windows, exclusions, &[])
}

/// [`install_with`] with the cluster's backup recipients (its etcd snapshot is encrypted to
/// them, issue #49).
pub fn install_full(
    store: &dyn Store,
    plan: &Plan,
    observed: &ObservedCluster,
    windows: &[MaintenanceWindow],
    exclusions: &[medea::desired::exclusion::Exclusion],
    recipients: &[medea::desired::backup::Recipient],
) -> Result<JobId, RolloutError> {
    store
        .commit(
            Txn::new()
                .put_record(CURRENT_KEY, &CurrentPlan { id: plan.id })
                .put_record(cluster_key(CLUSTER), observed),
        )
        .unwrap();
    let inputs = JobInputs {
        global_rollouts: true,
        clusters: [(CLUSTER.to_string(), observed)].into(),
        windows: [(CLUSTER.to_string(), windows)].into(),
        exclusions: [(CLUSTER.to_string(), exclusions)].into(),
        backup_recipients: [(CLUSTER.to_string(), recipients)].into(),
    };
    let created = create_jobs_txn(plan, &inputs, t0())?;
    store.commit(created.txn).unwrap();
    Ok(created.jobs[0].id.clone())
}

pub struct World {
    pub fake: FakeCluster,
    pub store: Arc<dyn Store>,
    pub job: JobId,
    pub dir: tempfile::TempDir,
}

pub fn world(fake: FakeCluster, steps: impl FnOnce(&FakeCluster) -> Vec<Step>) -> World {
    world_in(fake, Arc::new(MemStore::new()), steps, &[])
}

pub fn world_in(
    fake: FakeCluster,
    store: Arc<dyn Store>,
    steps: impl FnOnce(&FakeCluster) -> Vec<Step>,
    windows: &[MaintenanceWindow],
) -> World {
    world_with(fake, store, steps, windows, &[])
}

/// [`world_in`] with maintenance exclusions.
pub fn world_with(
    fake: FakeCluster,
    store: Arc<dyn Store>,
    steps: impl FnOnce(&FakeCluster) -> Vec<Step>,
    windows: &[MaintenanceWindow],
    exclusions: &[medea::desired::exclusion::Exclusion],
) -> World {
    let obs = observed(&fake);
    let p = plan(&obs, steps(&fake), 1);
    let job = install_with(store.as_ref(), &p, &obs, windows, exclusions).unwrap();
    World {
        fake,
        store,
        job,
        dir: tempfile::tempdir().unwrap(),
    }
}

impl World {
    pub fn config(&self) -> ExecutorConfig {
        ExecutorConfig::new(true, self.dir.path().join("snapshots"))
    }
    pub fn executor(
        &self,
    ) -> Executor<medea::rollout::fake::FakeTalos, medea::rollout::fake::FakeKube, TokioClock> {
        self.executor_with(self.config())
    }
    pub fn executor_with(
        &self,
        cfg: ExecutorConfig,
    ) -> Executor<medea::rollout::fake::FakeTalos, medea::rollout::fake::FakeKube, TokioClock> {
        Executor::new(
            self.store.clone(),
            self.fake.talos(),
            self.fake.kube(),
            TokioClock::starting_at(t0()),
            cfg,
        )
    }
    pub fn job(&self) -> Job {
        medea::ops::jobs::load_job(self.store.as_ref(), &self.job)
            .unwrap()
            .unwrap()
    }
    pub fn journal(&self) -> Vec<JournalEntry> {
        self.store
            .scan_records::<JournalEntry>(&entries_prefix(&self.job))
            .unwrap()
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    }
    pub fn state(&self) -> FakeState {
        self.fake.state()
    }
}

/// Every node on `to`, uncordoned, up; exactly one Upgrade and (lifecycle) one Reboot each.
pub fn assert_rolled(s: &FakeState, to: &str, reboots: u32) {
    for (name, n) in &s.nodes {
        assert_eq!(n.version, tv(to), "{name} version\n{:#?}", s.log);
        assert!(!n.cordoned, "{name} left cordoned");
        assert!(!n.down(), "{name} left down");
        assert_eq!(n.counters.upgrade, 1, "{name}: Upgrade calls\n{:#?}", s.log);
        assert_eq!(
            n.counters.reboot, reboots,
            "{name}: Reboot calls\n{:#?}",
            s.log
        );
    }
}

/// The largest number of `nodes` cordoned at the same time, replaying the fake's log.
pub fn max_away(log: &[String], nodes: &[&str]) -> usize {
    let mut away = std::collections::BTreeSet::new();
    let mut max = 0;
    for line in log {
        let mut parts = line.split_whitespace();
        let (op, node) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if !nodes.contains(&node) {
            continue;
        }
        match op {
            "cordon" => {
                away.insert(node.to_string());
            }
            "uncordon" => {
                away.remove(node);
            }
            _ => {}
        }
        max = max.max(away.len());
    }
    max
}

fn position(log: &[String], prefix: &str) -> usize {
    log.iter()
        .position(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` in {log:#?}"))
}

fn mutations_of(log: &[String], node: &str) -> Vec<String> {
    log.iter()
        .filter(|l| l.split_whitespace().nth(1) == Some(node))
        .cloned()
        .collect()
}

// ---------------------------------------------------------------------------------------------
// a store that trips at a chosen journal entry

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[allow(clippy::enum_variant_names)]
pub enum Trip {
    /// Commit, then fail (the process died right after the fsync).
    AfterCommit,
    /// Fail without committing (the process died before the write).
    InsteadOfCommit,
    /// Commit, then also commit the extra transaction, and carry on.
    AlsoCommit,
}

type Pred = Box<dyn Fn(&JournalEntry) -> bool + Send + Sync>;

pub struct Tripwire {
    inner: MemStore,
    rule: Mutex<Option<(Pred, Trip, Option<Txn>)>>,
}

impl Tripwire {
    pub fn new() -> Tripwire {
        Tripwire {
            inner: MemStore::new(),
            rule: Mutex::new(None),
        }
    }
    pub fn arm(
        &self,
        pred: impl Fn(&JournalEntry) -> bool + Send + Sync + 'static,
        trip: Trip,
        extra: Option<Txn>,
    ) {
        *self.rule.lock().unwrap() = Some((Box::new(pred), trip, extra));
    }
}

fn journal_entry(txn: &Txn) -> Option<JournalEntry> {
    txn.ops.iter().find_map(|op| match op {
        TxnOp::Put(Table::Journal, k, v) => decode::<JournalEntry>(k, v).ok(),
        _ => None,
    })
}

impl Store for Tripwire {
    fn get(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }
    fn scan(&self, table: Table, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.scan(table, prefix)
    }
    fn commit(&self, txn: Txn) -> Result<(), StoreError> {
        let mut rule = self.rule.lock().unwrap();
        let hit = match (&*rule, journal_entry(&txn)) {
            (Some((pred, _, _)), Some(e)) => pred(&e),
            _ => false,
        };
        if !hit {
            return self.inner.commit(txn);
        }
        let (_, trip, extra) = rule.take().unwrap();
        let died = || StoreError::Backend {
            op: "commit",
            err: "simulated crash".into(),
        };
        match trip {
            Trip::AfterCommit => {
                self.inner.commit(txn)?;
                Err(died())
            }
            Trip::InsteadOfCommit => Err(died()),
            Trip::AlsoCommit => {
                self.inner.commit(txn)?;
                if let Some(x) = extra {
                    self.inner.commit(x).unwrap();
                }
                Ok(())
            }
        }
    }
}

fn is_intent(op: CommandOp) -> impl Fn(&JournalEntry) -> bool {
    move |e| matches!(&e.entry, Entry::Intent { key, .. } if key.op == op)
}
fn is_result(op: CommandOp) -> impl Fn(&JournalEntry) -> bool {
    move |e| matches!(&e.entry, Entry::Result { key, .. } if key.op == op)
}

// ---------------------------------------------------------------------------------------------
// running a world to its outcome (the fault matrix and the Kubernetes rollout)

async fn run_with(
    fake: FakeCluster,
    steps: impl FnOnce(&FakeCluster) -> Vec<Step>,
) -> (World, RunOutcome) {
    let w = world(fake, steps);
    let out = w.executor().run(&w.job).await.unwrap();
    (w, out)
}

fn halted_at(out: &RunOutcome, node: &str, code: HaltCode, needle: &str) {
    assert!(
        matches!(out, RunOutcome::Halted { reason, node: Some(n), .. } if n == node && reason.code() == code && reason.message().contains(needle)),
        "expected a halt ({code}) at {node} mentioning `{needle}`, got {out:?}"
    );
}
