//! Rollout executor: sequences, safety rails, fault matrix, resume, crash harness.
//!
//! Executor tests run against the in-memory fakes with paused tokio time (zero real delay).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use medea::desired::Revision;
use medea::desired::window::MaintenanceWindow;
use medea::inventory::{Machine, MachineRole, ObservedCluster, cluster_key};
use medea::plan::{
    Basis, ClusterPlan, KubeRollout, MachineTarget, Plan, PlanId, Step, TalosRollout,
};
use medea::rollout::executor::{EventState, RolloutEvent};
use medea::rollout::fake::{FakeCluster, FakeNodeSpec, FakeState, Fault, MemStore};
use medea::rollout::journal::{Entry, JournalEntry, entries_prefix, job_key};
use medea::rollout::machine::{Job, JobId, JobState, Op};
use medea::rollout::ports::Component;
use medea::rollout::{
    CURRENT_PLAN_KEY, Executor, ExecutorConfig, Gate, JobInputs, RolloutError, RunOutcome,
    TokioClock, create_jobs_txn, current_plan_value, request_halt,
};
use medea::store::record::{decode, encode};
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
        pool: pool.into(),
        role,
        hop: 1,
        hops: 1,
        to: tv(to),
        image: format!("factory.talos.dev/installer/abc:{to}"),
        max_unavailable: max,
        drain_timeout: Duration::from_secs(600),
        health_timeout: Duration::from_secs(900),
        waves: waves
            .iter()
            .map(|w| {
                w.iter()
                    .map(|n| MachineTarget {
                        node: n.to_string(),
                        id: format!("id-{n}"),
                        address: s.nodes[*n].address.clone(),
                        from: s.nodes[*n].version.clone(),
                    })
                    .collect()
            })
            .collect(),
    })
}

pub fn kube_step(cps: &[&str], workers: &[&str], from: &str, to: &str) -> Step {
    Step::Kubernetes(KubeRollout {
        from: KubeVersion::parse(from).unwrap(),
        to: KubeVersion::parse(to).unwrap(),
        control_plane: cps.iter().map(|s| s.to_string()).collect(),
        workers: workers.iter().map(|s| s.to_string()).collect(),
        health_timeout: Duration::from_secs(600),
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
        },
        clusters: vec![ClusterPlan {
            cluster: CLUSTER.into(),
            steps,
            settings: vec![],
            unchanged: vec![],
        }],
        approvals_required: 1,
    }
}

/// Make `plan` current, record the cluster, create the job.
pub fn install(
    store: &dyn Store,
    plan: &Plan,
    observed: &ObservedCluster,
    windows: &[MaintenanceWindow],
) -> Result<JobId, RolloutError> {
    store
        .commit(
            Txn::new()
                .put(Table::Plans, CURRENT_PLAN_KEY, current_plan_value(&plan.id))
                .put_record(cluster_key(CLUSTER), observed),
        )
        .unwrap();
    let inputs = JobInputs {
        global_rollouts: true,
        clusters: [(CLUSTER.to_string(), observed)].into(),
        windows: [(CLUSTER.to_string(), windows)].into(),
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
    let obs = observed(&fake);
    let p = plan(&obs, steps(&fake), 1);
    let job = install(store.as_ref(), &p, &obs, windows).unwrap();
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
        self.store
            .get_record::<Job>(&job_key(&self.job))
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

fn is_intent(op: Op) -> impl Fn(&JournalEntry) -> bool {
    move |e| matches!(&e.entry, Entry::Intent { key, .. } if key.op == op)
}
fn is_result(op: Op) -> impl Fn(&JournalEntry) -> bool {
    move |e| matches!(&e.entry, Entry::Result { key, .. } if key.op == op)
}

// ---------------------------------------------------------------------------------------------
// sequences

#[tokio::test(start_paused = true)]
async fn mixed_talos_rollout_succeeds_in_order() {
    let w = world(FakeCluster::new(&specs(3, 3, FROM, KUBE)), mixed_steps);
    let exec = w.executor();
    let mut events = exec.subscribe();
    let out = exec.run(&w.job).await.unwrap();
    assert_eq!(out, RunOutcome::Succeeded);
    let s = w.state();
    assert_rolled(&s, TO, 1);
    assert_eq!(s.snapshots, 1);
    let log = &s.log;
    // the snapshot precedes any change to a control-plane node
    let snap = position(log, "etcd-snapshot");
    assert_eq!(snap, 0, "{log:#?}");
    // per node: pull, cordon, drain, upgrade, reboot, uncordon
    let ops: Vec<String> = mutations_of(log, "cp-2")
        .iter()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert_eq!(
        ops,
        ["pull", "cordon", "drain", "upgrade", "reboot", "uncordon"]
    );
    // control plane strictly one at a time; the first worker wave away together
    assert_eq!(max_away(log, &["cp-1", "cp-2", "cp-3"]), 1);
    assert_eq!(max_away(log, &["w-1", "w-2", "w-3"]), 2);
    assert!(
        position(log, "uncordon cp-3") < position(log, "pull w-1"),
        "pools in plan order"
    );
    assert!(
        position(log, "uncordon w-2") < position(log, "pull w-3"),
        "waves in order"
    );
    // the job says so, and the snapshot file is there, private and checksummed
    let job = w.job();
    assert!(matches!(job.state, JobState::Succeeded { .. }));
    let snap = job.snapshot.clone().unwrap();
    let bytes = std::fs::read(&snap.path).unwrap();
    use sha2::Digest;
    assert_eq!(snap.sha256, hex::encode(sha2::Sha256::digest(&bytes)));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&snap.path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // nothing left active: a new job for the cluster could start
    assert_eq!(
        w.store
            .get(Table::Jobs, &format!("active/{CLUSTER}"))
            .unwrap(),
        None
    );
    // events carry pool and node
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    assert!(seen.iter().any(|e: &RolloutEvent| e.op == Some(Op::Upgrade)
        && e.node.as_deref() == Some("w-3")
        && e.pool.as_deref() == Some("workers")
        && matches!(e.state, EventState::Intended { attempt: 1 })));
    assert!(matches!(seen.last().unwrap().state, EventState::Succeeded));
}

#[tokio::test(start_paused = true)]
async fn every_result_is_preceded_by_its_intent_in_the_journal() {
    let w = world(FakeCluster::new(&specs(1, 1, FROM, KUBE)), |f| {
        vec![talos_step(f, "all", &[&["cp-1"], &["w-1"]], TO, 1)]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let j = w.journal();
    assert!(matches!(j[0].entry, Entry::Created { .. }));
    for (i, e) in j.iter().enumerate() {
        assert_eq!(e.seq, i as u64, "sequence numbers are dense");
        if let Entry::Result { key, .. } = &e.entry {
            assert!(
                matches!(&j[i - 1].entry, Entry::Intent { key: k, .. } if k == key),
                "result {key} right after its intent"
            );
        }
    }
    let upgrades = j
        .iter()
        .filter(|e| matches!(&e.entry, Entry::Intent { key, .. } if key.op == Op::Upgrade))
        .count();
    assert_eq!(upgrades, 2);
    assert_eq!(w.job().journal_seq, (j.len() - 1) as u64);
}

#[tokio::test(start_paused = true)]
async fn legacy_nodes_upgrade_through_the_legacy_rpc_and_reboot_by_themselves() {
    let w = world(FakeCluster::new(&specs(1, 1, "v1.12.4", "v1.32.3")), |f| {
        vec![talos_step(f, "all", &[&["cp-1"], &["w-1"]], "v1.13.9", 1)]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_rolled(&s, "v1.13.9", 0);
    let job = w.job();
    let intents: Vec<_> = w
        .journal()
        .into_iter()
        .filter_map(|e| match e.entry {
            Entry::Intent { action, .. } => Some(action),
            _ => None,
        })
        .collect();
    assert!(intents.iter().any(|a| matches!(
        a,
        medea::rollout::machine::Action::Upgrade {
            method: medea::rollout::ports::UpgradeMethod::Legacy,
            ..
        }
    )));
    assert!(matches!(job.state, JobState::Succeeded { .. }));
}

#[tokio::test(start_paused = true)]
async fn multi_hop_plans_run_hop_by_hop() {
    let w = world(FakeCluster::new(&specs(0, 2, "v1.13.2", KUBE)), |f| {
        let mut hop1 = talos_step(f, "workers", &[&["w-1"], &["w-2"]], "v1.13.9", 1);
        let mut hop2 = talos_step(f, "workers", &[&["w-1"], &["w-2"]], "v1.14.1", 1);
        if let (Step::Talos(a), Step::Talos(b)) = (&mut hop1, &mut hop2) {
            a.hops = 2;
            b.hop = 2;
            b.hops = 2;
            for t in b.waves.iter_mut().flatten() {
                t.from = tv("v1.13.9");
            }
        }
        vec![hop1, hop2]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    for n in s.nodes.values() {
        assert_eq!(n.version, tv("v1.14.1"));
        assert_eq!(n.counters.upgrade, 2, "one Upgrade per hop");
        assert_eq!(n.counters.reboot, 2);
    }
    let first_hop2 = position(
        &s.log,
        "upgrade w-1 factory.talos.dev/installer/abc:v1.14.1",
    );
    let last_hop1 = position(
        &s.log,
        "upgrade w-2 factory.talos.dev/installer/abc:v1.13.9",
    );
    assert!(last_hop1 < first_hop2, "{:#?}", s.log);
    assert_eq!(s.snapshots, 0, "workers only: no etcd snapshot");
}

#[tokio::test(start_paused = true)]
async fn a_node_already_on_target_is_skipped() {
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE));
    let w = world(fake, |f| {
        vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)]
    });
    w.fake
        .edit(|s| s.nodes.get_mut("w-2").unwrap().version = tv(TO));
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_eq!(s.nodes["w-2"].counters, Default::default(), "w-2 untouched");
    assert_eq!(s.nodes["w-1"].counters.upgrade, 1);
}

#[tokio::test(start_paused = true)]
async fn a_node_on_an_unexpected_version_halts_the_job() {
    let w = world(FakeCluster::new(&specs(0, 2, FROM, KUBE)), |f| {
        vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)]
    });
    w.fake
        .edit(|s| s.nodes.get_mut("w-1").unwrap().version = tv("v1.12.0"));
    let out = w.executor().run(&w.job).await.unwrap();
    assert!(
        matches!(&out, RunOutcome::Halted { reason, node: Some(n), .. } if reason.contains("plan expected v1.13.2") && n == "w-1"),
        "{out:?}"
    );
    assert!(w.state().log.is_empty());
}
