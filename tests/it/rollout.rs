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
        health: None,
        pool: pool.into(),
        role,
        hop: 1,
        hops: 1,
        to: tv(to),
        image: format!("factory.talos.dev/installer/abc:{to}"),
        max_unavailable: max,
        drain_timeout: Duration::from_secs(600),
        health_timeout: Duration::from_secs(900),
        upgrade_attempts: medea::desired::model::DEFAULT_UPGRADE_ATTEMPTS,
        drain: medea::desired::model::DrainPolicy::default(),
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
            preflight: Vec::new(),
            health: None,
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
                .put_record(CURRENT_KEY, &CurrentPlan { id: plan.id })
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
// journal format

/// Records the size of every committed transaction and whether it rewrote the job record;
/// and the durability of each journal entry kind.
struct Sizes {
    inner: MemStore,
    commits: Mutex<Vec<(usize, bool)>>,
    durability: Mutex<Vec<(String, bool, medea::store::Durability)>>,
}

impl Store for Sizes {
    fn get(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }
    fn scan(&self, table: Table, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.scan(table, prefix)
    }
    fn commit(&self, txn: Txn) -> Result<(), StoreError> {
        let bytes = txn
            .ops
            .iter()
            .map(|op| match op {
                TxnOp::Put(_, k, v) => k.len() + v.len(),
                TxnOp::Delete(_, k) => k.len(),
            })
            .sum();
        let job = txn
            .ops
            .iter()
            .any(|op| matches!(op, TxnOp::Put(Table::Jobs, k, _) if k.starts_with("job/")));
        let entry = journal_entry(&txn);
        let durability = txn.durability;
        self.inner.commit(txn)?;
        self.commits.lock().unwrap().push((bytes, job));
        if let Some(e) = entry {
            let terminal = !matches!(
                e.delta.as_ref().map(|d| &d.state),
                None | Some(JobState::Running)
            );
            self.durability.lock().unwrap().push((
                e.entry.name().to_string(),
                terminal,
                durability,
            ));
        }
        Ok(())
    }
}

/// Run a one-pool rollout of `workers` workers (4 at a time) on a [`Sizes`] store.
async fn sized_run(workers: usize) -> (Vec<(usize, bool)>, World, Arc<Sizes>, Job) {
    let sizes = Arc::new(Sizes {
        inner: MemStore::new(),
        commits: Mutex::new(Vec::new()),
        durability: Mutex::new(Vec::new()),
    });
    let names: Vec<String> = (1..=workers).map(|i| format!("w-{i}")).collect();
    let w = world_in(
        FakeCluster::new(&specs(0, workers, FROM, KUBE)),
        sizes.clone(),
        |f| {
            let waves: Vec<Vec<&str>> = names
                .chunks(4)
                .map(|c| c.iter().map(|s| s.as_str()).collect())
                .collect();
            let waves: Vec<&[&str]> = waves.iter().map(|w| w.as_slice()).collect();
            vec![talos_step(f, "workers", &waves, TO, 4)]
        },
        &[],
    );
    sizes.commits.lock().unwrap().clear();
    let created = w.job();
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let commits = sizes.commits.lock().unwrap().clone();
    (commits, w, sizes, created)
}

#[tokio::test(start_paused = true)]
async fn journal_commits_do_not_grow_with_the_job() {
    let (small, ..) = sized_run(4).await;
    let (large, w, ..) = sized_run(120).await;
    // between checkpoints a commit carries the journal entry and its delta only: the same size
    // whether the job has 4 nodes or 120 (node names differ in length by at most 2 bytes)
    let largest =
        |c: &[(usize, bool)]| c.iter().filter(|(_, j)| !j).map(|(b, _)| *b).max().unwrap();
    assert!(
        largest(&large) <= largest(&small) + 64,
        "120 nodes: {} bytes, 4 nodes: {} bytes",
        largest(&large),
        largest(&small)
    );
    // the whole job is rewritten only at checkpoints and at the end
    let rewrites: Vec<usize> = large
        .iter()
        .enumerate()
        .filter(|(_, (_, j))| *j)
        .map(|(i, _)| i + 1)
        .collect();
    let every = medea::rollout::journal::CHECKPOINT_EVERY as usize;
    assert_eq!(
        rewrites.last(),
        Some(&large.len()),
        "the final commit checkpoints"
    );
    assert_eq!(
        rewrites.len(),
        large.len() / every + usize::from(large.len() % every != 0)
    );
    assert!(
        rewrites.iter().rev().skip(1).all(|i| i % every == 0),
        "{rewrites:?}"
    );
    // and the job reads back complete: checkpoint plus the journal after it
    let job = w.job();
    assert!(matches!(job.state, JobState::Succeeded { .. }));
    assert_eq!(job.journal_seq as usize, large.len());
    assert_rolled(&w.state(), TO, 1);
}

#[tokio::test(start_paused = true)]
async fn intents_and_the_end_of_a_job_are_fsynced_results_ride_on_the_next_intent() {
    use medea::store::Durability;
    let (_, _, sizes, _) = sized_run(8).await;
    let d = sizes.durability.lock().unwrap().clone();
    assert!(d.iter().any(|(n, ..)| n == "result"));
    for (i, (name, terminal, durability)) in d.iter().enumerate() {
        let want = if name == "intent" || name == "created" || *terminal {
            Durability::Durable
        } else {
            Durability::Buffered
        };
        assert_eq!(
            *durability, want,
            "commit {i}: {name} (terminal: {terminal})"
        );
        // a buffered entry is always followed by a durable one before the job ends: the next
        // call's intent or the job's end
        if *durability == Durability::Buffered {
            assert!(d[i + 1..].iter().any(|(.., x)| *x == Durability::Durable));
        }
    }
    assert!(d.last().unwrap().1, "the last entry ends the job");
    assert_eq!(d.last().unwrap().2, Durability::Durable);
}

#[tokio::test(start_paused = true)]
async fn a_job_reads_back_from_its_checkpoint_and_the_journal_after_it() {
    let (commits, w, sizes, created) = sized_run(40).await;
    let every = medea::rollout::journal::CHECKPOINT_EVERY;
    assert!(commits.len() as u64 > 2 * every);
    let done = w.job();
    let entries = w.journal();
    assert_eq!(entries.len() as u64, done.journal_seq + 1);
    assert!(
        entries[0].delta.is_none(),
        "the creation carries the whole job"
    );
    assert!(
        entries[1..].iter().all(|e| e.delta.is_some()),
        "every later entry its delta"
    );
    // the journal alone, from the creation, rebuilds the finished job
    let mut replay = created.clone();
    for e in &entries[1..] {
        e.delta.as_ref().unwrap().apply(&mut replay).unwrap();
        replay.journal_seq = e.seq;
    }
    assert_eq!(replay, done);
    // put back the older checkpoint (the last multiple of CHECKPOINT_EVERY before the end):
    // reading the job replays the entries after it and finds the finished job
    let at = (done.journal_seq - 1) / every * every;
    let mut old = created.clone();
    for e in &entries[1..=at as usize] {
        e.delta.as_ref().unwrap().apply(&mut old).unwrap();
        old.journal_seq = e.seq;
    }
    assert!(!old.state.is_terminal());
    sizes
        .inner
        .commit(Txn::new().put_record(job_key(&w.job), &old))
        .unwrap();
    assert_eq!(
        w.job(),
        done,
        "the entries after the checkpoint bring it up to date"
    );
    // an entry after the checkpoint without its delta is refused, never skipped
    let mut broken = entries[at as usize + 1].clone();
    broken.delta = None;
    sizes
        .inner
        .commit(Txn::new().put_record(
            medea::rollout::journal::entry_key(&w.job, broken.seq),
            &broken,
        ))
        .unwrap();
    let err = medea::ops::jobs::load_job(sizes.as_ref(), &w.job).unwrap_err();
    assert!(matches!(err, StoreError::Decode { .. }), "{err}");
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
    assert!(
        seen.iter()
            .any(|e: &RolloutEvent| e.op == Some(CommandOp::Upgrade)
                && e.node.as_deref() == Some("w-3")
                && e.pool.as_deref() == Some("workers")
                && matches!(e.state, EventState::Intended { attempt: 1 }))
    );
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
        .filter(|e| matches!(&e.entry, Entry::Intent { key, .. } if key.op == CommandOp::Upgrade))
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
        medea::rollout::sequencer::Action::Upgrade {
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

/// A node already on the target is skipped, and not pulled ahead either while w-1 reboots:
/// it is never touched.
#[tokio::test(start_paused = true)]
async fn a_node_already_on_target_is_skipped() {
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE));
    fake.edit(|s| s.reboot_polls = 5);
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
    assert!(intent_ops(&w, "w-2").is_empty());
    assert_eq!(s.nodes["w-1"].counters.upgrade, 1);
}

/// The commands of `node`'s journal intents, in order.
fn intent_ops(w: &World, node: &str) -> Vec<CommandOp> {
    w.journal()
        .into_iter()
        .filter_map(|e| match e.entry {
            Entry::Intent { key, .. } if key.node.as_deref() == Some(node) => Some(key.op),
            _ => None,
        })
        .collect()
}

fn pulled_ahead(job: &Job, node: &str) -> Option<medea::rollout::sequencer::PullAhead> {
    job.steps
        .iter()
        .find_map(|s| match &s.kind {
            medea::rollout::sequencer::StepKind::Talos(t) => {
                t.nodes.iter().find(|n| n.target.node == node)
            }
            _ => None,
        })
        .and_then(|n| n.pulled_ahead)
}

/// While a wave's nodes reboot, the next wave's nodes pull the image (once each: not again at
/// their turn); their disruption still waits until the wave before is back in service.
#[tokio::test(start_paused = true)]
async fn the_next_wave_pulls_its_image_while_the_wave_reboots() {
    use medea::rollout::sequencer::PullAhead;
    let fake = FakeCluster::new(&specs(0, 4, FROM, KUBE));
    fake.edit(|s| s.reboot_polls = 5);
    let w = world(fake, |f| {
        vec![talos_step(
            f,
            "workers",
            &[&["w-1", "w-2"], &["w-3", "w-4"]],
            TO,
            2,
        )]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_rolled(&s, TO, 1);
    let log = &s.log;
    for n in ["w-1", "w-2", "w-3", "w-4"] {
        assert_eq!(s.nodes[n].counters.pull, 1, "{n} pulled once: {log:#?}");
    }
    for n in ["w-3", "w-4"] {
        let pull = position(log, &format!("pull {n}"));
        assert!(
            position(log, "reboot w-2") < pull && pull < position(log, "uncordon w-1"),
            "{n} pulled while the first wave was away: {log:#?}"
        );
    }
    assert!(
        position(log, "uncordon w-2") < position(log, "cordon w-3"),
        "the second wave is disrupted only after the first is back: {log:#?}"
    );
    use CommandOp::*;
    assert_eq!(
        intent_ops(&w, "w-1"),
        [Pull, Cordon, Drain, Upgrade, Reboot, Uncordon]
    );
    assert_eq!(
        intent_ops(&w, "w-3"),
        [PullAhead, Cordon, Drain, Upgrade, Reboot, Uncordon]
    );
    let job = w.job();
    assert_eq!(pulled_ahead(&job, "w-1"), None);
    assert_eq!(pulled_ahead(&job, "w-3"), Some(PullAhead::Pulled));
    assert_eq!(pulled_ahead(&job, "w-4"), Some(PullAhead::Pulled));
}

/// A machine with its own installer (a pool without one, on Talos >= 1.14: each node's Image
/// Factory installer) is pulled, pulled ahead and upgraded with that image, the others with
/// the step's.
#[tokio::test(start_paused = true)]
async fn a_machine_with_its_own_installer_is_pulled_and_upgraded_with_it() {
    let fake = FakeCluster::new(&specs(0, 4, FROM, KUBE));
    fake.edit(|s| s.reboot_polls = 5);
    let own = format!("factory.talos.dev/aws-installer/abc:{TO}");
    let w = world(fake, |f| {
        let mut step = talos_step(f, "workers", &[&["w-1", "w-2"], &["w-3", "w-4"]], TO, 2);
        if let Step::Talos(t) = &mut step {
            for m in t.waves.iter_mut().flatten() {
                if m.node == "w-2" || m.node == "w-4" {
                    m.image = Some(own.clone());
                }
            }
        }
        vec![step]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_rolled(&s, TO, 1);
    let step_image = format!("factory.talos.dev/installer/abc:{TO}");
    for (n, image) in [
        ("w-1", &step_image),
        ("w-2", &own),
        ("w-3", &step_image),
        ("w-4", &own),
    ] {
        for op in ["pull", "upgrade"] {
            let want = format!("{op} {n} {image}");
            assert!(s.log.contains(&want), "{want} missing: {:#?}", s.log);
        }
        assert!(
            s.log
                .iter()
                .filter(|l| l.starts_with(&format!("upgrade {n} "))
                    || l.starts_with(&format!("pull {n} ")))
                .all(|l| l.ends_with(image.as_str())),
            "{n} only with {image}: {:#?}",
            s.log
        );
    }
}

/// A pull ahead is best effort: its failure (here a lost reply) never halts the job, and the
/// node pulls again at its turn.
#[tokio::test(start_paused = true)]
async fn a_pull_ahead_that_fails_never_halts_and_the_node_pulls_at_its_turn() {
    use medea::rollout::sequencer::PullAhead;
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE)).with_fault(Fault::LostReply {
        node: "w-2".into(),
        op: "pull".into(),
    });
    fake.edit(|s| s.reboot_polls = 5);
    let w = world(fake, |f| {
        vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_rolled(&s, TO, 1);
    assert_eq!(s.nodes["w-2"].counters.pull, 2, "{:#?}", s.log);
    use CommandOp::*;
    assert_eq!(
        intent_ops(&w, "w-2"),
        [PullAhead, Pull, Cordon, Drain, Upgrade, Reboot, Uncordon]
    );
    assert_eq!(pulled_ahead(&w.job(), "w-2"), Some(PullAhead::Failed));
    assert!(
        w.journal().iter().any(|e| e
            .notes
            .iter()
            .any(|n| n.contains("w-2: the pull ahead of its turn failed"))),
        "the failure is on record"
    );
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
        matches!(&out, RunOutcome::Halted { reason, node: Some(n), .. } if reason.code() == HaltCode::UnexpectedVersion && reason.message().contains("plan expected v1.13.2") && n == "w-1"),
        "{out:?}"
    );
    assert!(w.state().log.is_empty());
}

// ---------------------------------------------------------------------------------------------
// job creation and the gates

#[test]
fn job_creation_checks_the_gates_and_the_plan() {
    let fake = FakeCluster::new(&specs(1, 1, FROM, KUBE));
    let obs = observed(&fake);
    let p = plan(&obs, mixed_steps_small(&fake), 7);
    let store = MemStore::new();
    let none: &[MaintenanceWindow] = &[];
    fn inputs<'a>(
        global: bool,
        c: &'a ObservedCluster,
        none: &'a [MaintenanceWindow],
    ) -> JobInputs<'a> {
        JobInputs {
            global_rollouts: global,
            clusters: [(CLUSTER.to_string(), c)].into(),
            windows: [(CLUSTER.to_string(), none)].into(),
        }
    }
    // global gate off
    let e = create_jobs_txn(&p, &inputs(false, &obs, none), t0()).unwrap_err();
    assert!(matches!(e, RolloutError::RolloutsOff), "{e}");
    assert!(e.to_string().contains("--rollouts"));
    // cluster disabled
    let off = obs.with_rollouts_enabled(false);
    let e = create_jobs_txn(&p, &inputs(true, &off, none), t0()).unwrap_err();
    assert!(matches!(e, RolloutError::ClusterDisabled { .. }), "{e}");
    // observed generation moved since planning
    let mut moved = obs.clone();
    moved.generation += 1;
    let e = create_jobs_txn(&p, &inputs(true, &moved, none), t0()).unwrap_err();
    assert!(matches!(e, RolloutError::StalePlan { .. }), "{e}");
    assert!(e.to_string().contains("medea plan"), "{e}");
    // a blocking preflight finding nobody acknowledged: never started, whatever the gates
    // (defense in depth: approval refuses such a plan first)
    let mut blocked = p.clone();
    std::sync::Arc::make_mut(&mut blocked.clusters[0])
        .preflight
        .push(medea::plan::preflight::Finding {
            id: "etcd/alarm/NOSPACE/1".into(),
            check: "etcd".into(),
            severity: medea::plan::preflight::Severity::Blocking,
            message: "etcd alarm NOSPACE is active on member 1".into(),
            evidence: vec![],
            help: String::new(),
            acknowledged: false,
        });
    let e = create_jobs_txn(&blocked, &inputs(true, &obs, none), t0()).unwrap_err();
    assert!(matches!(e, RolloutError::BlockingFindings { .. }), "{e}");
    assert!(e.to_string().contains("[etcd/alarm/NOSPACE/1]"), "{e}");
    assert!(e.to_string().contains("spec.preflight.acknowledge"), "{e}");
    std::sync::Arc::make_mut(&mut blocked.clusters[0]).preflight[0].acknowledged = true;
    assert!(create_jobs_txn(&blocked, &inputs(true, &obs, none), t0()).is_ok());

    // not the current plan: the transaction refuses atomically
    store
        .commit(Txn::new().put_record(
            CURRENT_KEY,
            &CurrentPlan {
                id: PlanId::from_digest([0xee; 32]),
            },
        ))
        .unwrap();
    store
        .commit(Txn::new().put_record(cluster_key(CLUSTER), &obs))
        .unwrap();
    let c = create_jobs_txn(&p, &inputs(true, &obs, none), t0()).unwrap();
    assert!(matches!(
        store.commit(c.txn.clone()),
        Err(StoreError::Conflict { .. })
    ));
    assert!(
        store.scan(Table::Jobs, "").unwrap().is_empty(),
        "nothing created"
    );

    // current: created once; the same plan never starts again
    store
        .commit(Txn::new().put_record(CURRENT_KEY, &CurrentPlan { id: p.id }))
        .unwrap();
    store.commit(c.txn.clone()).unwrap();
    assert!(matches!(
        store.commit(c.txn.clone()),
        Err(StoreError::Conflict { .. })
    ));
    let job = medea::ops::jobs::load_job(&store, &c.jobs[0].id)
        .unwrap()
        .unwrap();
    assert_eq!(job.plan, p.id);
    assert!(matches!(job.state, JobState::Running));

    // a second plan for the same cluster cannot start while the first job runs
    let p2 = plan(&obs, mixed_steps_small(&fake), 8);
    store
        .commit(Txn::new().put_record(CURRENT_KEY, &CurrentPlan { id: p2.id }))
        .unwrap();
    let c2 = create_jobs_txn(&p2, &inputs(true, &obs, none), t0()).unwrap();
    assert!(matches!(
        store.commit(c2.txn),
        Err(StoreError::Conflict { key, .. }) if key == format!("active/{CLUSTER}")
    ));
}

fn mixed_steps_small(f: &FakeCluster) -> Vec<Step> {
    vec![talos_step(f, "all", &[&["cp-1"], &["w-1"]], TO, 1)]
}

#[tokio::test(start_paused = true)]
async fn global_gate_off_means_no_mutating_call_at_all() {
    let w = world(FakeCluster::new(&specs(3, 3, FROM, KUBE)), mixed_steps);
    let mut cfg = w.config();
    cfg.rollouts = false;
    let out = w.executor_with(cfg).run(&w.job).await.unwrap();
    assert_eq!(
        out,
        RunOutcome::Paused {
            gate: Gate::GlobalRollouts
        }
    );
    assert!(w.state().log.is_empty());
    assert_eq!(w.state().snapshots, 0);
    assert!(
        matches!(w.job().state, JobState::Running),
        "paused, not halted"
    );
}

#[tokio::test(start_paused = true)]
async fn cluster_disabled_means_no_mutating_call_at_all() {
    let w = world(FakeCluster::new(&specs(3, 3, FROM, KUBE)), mixed_steps);
    let off = observed(&w.fake).with_rollouts_enabled(false);
    w.store
        .commit(Txn::new().put_record(cluster_key(CLUSTER), &off))
        .unwrap();
    let out = w.executor().run(&w.job).await.unwrap();
    assert_eq!(
        out,
        RunOutcome::Paused {
            gate: Gate::ClusterDisabled {
                cluster: CLUSTER.into()
            }
        }
    );
    assert!(w.state().log.is_empty());
    assert_eq!(w.state().snapshots, 0);
}

#[tokio::test(start_paused = true)]
async fn disabling_the_cluster_mid_job_stops_before_the_next_mutating_command() {
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE));
    let store = Arc::new(Tripwire::new());
    let w = world_in(
        fake,
        store.clone(),
        |f| vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)],
        &[],
    );
    let off = observed(&w.fake).with_rollouts_enabled(false);
    store.arm(
        is_result(CommandOp::Cordon),
        Trip::AlsoCommit,
        Some(Txn::new().put_record(cluster_key(CLUSTER), &off)),
    );
    let out = w.executor().run(&w.job).await.unwrap();
    assert!(
        matches!(
            out,
            RunOutcome::Paused {
                gate: Gate::ClusterDisabled { .. }
            }
        ),
        "{out:?}"
    );
    assert_eq!(
        w.state().log,
        [
            "pull w-1 factory.talos.dev/installer/abc:v1.13.9",
            "cordon w-1"
        ]
    );
    assert!(
        w.job().in_flight.is_none(),
        "no intent was journaled past the gate"
    );
    // re-enabled: the same job continues (a gate pauses, it does not halt)
    let on = observed(&w.fake);
    let mut on = on.with_rollouts_enabled(true);
    on.generation = off.generation;
    w.store
        .commit(Txn::new().put_record(cluster_key(CLUSTER), &on))
        .unwrap();
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    assert_rolled(&w.state(), TO, 1);
}

#[tokio::test(start_paused = true)]
async fn a_halt_request_stops_before_the_next_mutating_command_and_for_good() {
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE));
    let store = Arc::new(Tripwire::new());
    let w = world_in(
        fake,
        store.clone(),
        |f| vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)],
        &[],
    );
    let halt = Txn::new().put_record(
        medea::rollout::journal::halt_key(&w.job),
        &medea::rollout::journal::HaltRequest {
            job: w.job.clone(),
            by: "alice@example.com".into(),
            reason: Some("pager went off".into()),
            at: t0(),
        },
    );
    store.arm(is_result(CommandOp::Drain), Trip::AlsoCommit, Some(halt));
    let out = w.executor().run(&w.job).await.unwrap();
    assert!(
        matches!(&out, RunOutcome::Halted { reason, .. } if reason.code() == HaltCode::OperatorRequest && reason.message().contains("alice@example.com") && reason.message().contains("pager went off")),
        "{out:?}"
    );
    let log = w.state().log;
    assert_eq!(log.last().unwrap(), "drain w-1", "{log:#?}");
    assert_eq!(w.state().nodes["w-1"].counters.upgrade, 0);
    let job = w.job();
    assert!(matches!(&job.state, JobState::Halted { step: Some(0), .. }));
    assert!(
        w.journal()
            .iter()
            .any(|e| matches!(e.entry, Entry::HaltRequested { .. }))
    );
    // a halted job never resumes by itself
    assert!(matches!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Halted { .. }
    ));
    assert_eq!(w.state().log, log);
    assert!(w.executor().running_jobs().unwrap().is_empty());
    // and cannot be halted twice
    let e = request_halt(w.store.as_ref(), &w.job, "bob", None, t0()).unwrap_err();
    assert!(matches!(e, RolloutError::AlreadyFinished { .. }), "{e}");
}

#[tokio::test(start_paused = true)]
async fn request_halt_refuses_unknown_jobs_and_records_running_ones() {
    let w = world(FakeCluster::new(&specs(0, 1, FROM, KUBE)), |f| {
        vec![talos_step(f, "workers", &[&["w-1"]], TO, 1)]
    });
    let e = request_halt(
        w.store.as_ref(),
        &JobId::parse("nope").unwrap(),
        "bob",
        None,
        t0(),
    )
    .unwrap_err();
    assert!(matches!(e, RolloutError::UnknownJob { .. }), "{e}");
    request_halt(w.store.as_ref(), &w.job, "bob", None, t0()).unwrap();
    let out = w.executor().run(&w.job).await.unwrap();
    assert!(
        matches!(&out, RunOutcome::Halted { reason, .. } if reason.code() == HaltCode::OperatorRequest && reason.message() == "halted by bob"),
        "{out:?}"
    );
    assert!(w.state().log.is_empty(), "halted before the first command");
}

#[tokio::test(start_paused = true)]
async fn maintenance_windows_gate_the_start_of_each_node() {
    // t0 is Wednesday 2026-12-02 12:00 UTC; the window opens daily at 02:00 for 1 minute.
    let window = MaintenanceWindow::new("0 2 * * *", Duration::from_secs(60), "UTC").unwrap();
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE));
    fake.edit(|s| s.reboot_polls = 30); // each node takes minutes to come back
    let w = world_in(
        fake,
        Arc::new(MemStore::new()),
        |f| vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)],
        &[window],
    );
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let first_intent = |node: &str, ahead: bool| {
        w.journal()
            .into_iter()
            .find(|e| matches!(&e.entry, Entry::Intent { key, .. } if key.node.as_deref() == Some(node) && (key.op == CommandOp::PullAhead) == ahead))
            .unwrap()
            .at
    };
    let thursday: Timestamp = "2026-12-03T02:00:00Z".parse().unwrap();
    let friday: Timestamp = "2026-12-04T02:00:00Z".parse().unwrap();
    let w1 = first_intent("w-1", false);
    let w2 = first_intent("w-2", false);
    // w-2's image was pulled while w-1 rebooted: inside Thursday's window as well
    let w2_pull = first_intent("w-2", true);
    assert!(
        w2_pull >= thursday && w2_pull < thursday.checked_add(Duration::from_secs(60)).unwrap(),
        "w-2 pulled ahead at {w2_pull}"
    );
    assert!(
        w1 >= thursday && w1 < thursday.checked_add(Duration::from_secs(60)).unwrap(),
        "w-1 started at {w1}"
    );
    assert!(
        w2 >= friday && w2 < friday.checked_add(Duration::from_secs(60)).unwrap(),
        "w-2 started at {w2}: the window had closed"
    );
    assert_rolled(&w.state(), TO, 1);
}

// ---------------------------------------------------------------------------------------------
// the fault matrix

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

#[tokio::test(start_paused = true)]
async fn fault_node_never_returns_halts_after_the_health_timeout() {
    let fake = FakeCluster::new(&specs(3, 3, FROM, KUBE)).with_fault(Fault::NeverReturns {
        node: "cp-2".into(),
    });
    let start = tokio::time::Instant::now();
    let (w, out) = run_with(fake, mixed_steps).await;
    halted_at(&out, "cp-2", HaltCode::NodeNotBack, "did not come back");
    assert!(
        start.elapsed() >= Duration::from_secs(900),
        "waited the health timeout"
    );
    let s = w.state();
    assert_eq!(
        s.nodes["cp-3"].counters,
        Default::default(),
        "nothing after the failure"
    );
    assert!(
        s.nodes
            .iter()
            .filter(|(n, _)| n.starts_with("w-"))
            .all(|(_, n)| n.counters == Default::default())
    );
    let job = w.job();
    assert!(
        matches!(
            &job.state,
            JobState::Halted {
                step: Some(0),
                op: Some(CommandOp::Reboot),
                ..
            }
        ),
        "{:?}",
        job.state
    );
}

#[tokio::test(start_paused = true)]
async fn fault_silent_revert_halts_with_node_reverted() {
    let fake = FakeCluster::new(&specs(3, 3, FROM, KUBE))
        .with_fault(Fault::SilentRevert { node: "w-1".into() });
    let (w, out) = run_with(fake, mixed_steps).await;
    halted_at(&out, "w-1", HaltCode::NodeReverted, "node reverted");
    let s = w.state();
    assert_eq!(s.nodes["w-1"].version, tv(FROM));
    assert_eq!(s.nodes["w-3"].counters, Default::default());
    assert!(
        s.nodes["w-1"].cordoned,
        "a failed node stays cordoned for the operator"
    );
}

#[tokio::test(start_paused = true)]
async fn fault_upgrade_exit_code_halts_without_reboot() {
    let fake = FakeCluster::new(&specs(3, 0, FROM, KUBE)).with_fault(Fault::UpgradeExitCode {
        node: "cp-1".into(),
        code: 1,
    });
    let (w, out) = run_with(fake, |f| {
        vec![talos_step(
            f,
            "cp",
            &[&["cp-1"], &["cp-2"], &["cp-3"]],
            TO,
            1,
        )]
    })
    .await;
    halted_at(
        &out,
        "cp-1",
        HaltCode::UpgradeRefused,
        "installer exited with code 1",
    );
    halted_at(
        &out,
        "cp-1",
        HaltCode::UpgradeRefused,
        "failed 2 times (rollout.upgradeAttempts)",
    );
    let s = w.state();
    assert_eq!(
        s.nodes["cp-1"].counters.upgrade, 2,
        "a definitive failure is retried up to the bound (2), never more"
    );
    assert_eq!(s.nodes["cp-1"].counters.reboot, 0);
    assert_eq!(s.nodes["cp-2"].counters, Default::default());
    assert!(
        w.job().in_flight.is_none(),
        "the failure is recorded as the result"
    );
}

/// Lost Upgrade replies that left no trace do not count against `rollout.upgradeAttempts` (a
/// flaky network must not halt a healthy rollout), but they are re-made only within the
/// pool's health timeout from the drain: then the job halts naming the transport error.
#[tokio::test(start_paused = true)]
async fn upgrade_calls_that_never_arrive_are_retried_only_within_the_health_timeout() {
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE))
        .with_fault(Fault::UpgradeNeverArrives { node: "w-1".into() });
    let start = tokio::time::Instant::now();
    let (w, out) = run_with(fake, |f| {
        vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)]
    })
    .await;
    halted_at(
        &out,
        "w-1",
        HaltCode::UpgradeNotMade,
        "could not be made within 900s",
    );
    halted_at(&out, "w-1", HaltCode::UpgradeNotMade, "connection refused");
    assert!(
        start.elapsed() >= Duration::from_secs(900),
        "waited the health timeout"
    );
    let s = w.state();
    assert_eq!(s.nodes["w-1"].counters.upgrade, 0, "none reached the node");
    assert_eq!(s.nodes["w-1"].counters.reboot, 0);
    assert_eq!(s.nodes["w-2"].counters, Default::default());
    let job = w.job();
    assert!(job.in_flight.is_none(), "{:?}", job.in_flight);
    // every attempt was journaled under its own key, one at a time
    let mut last = 0;
    for e in w.journal() {
        if let Entry::Intent { key, .. } = &e.entry
            && key.op == CommandOp::Upgrade
        {
            assert_eq!(key.attempt, last + 1, "attempts in order, none twice");
            last = key.attempt;
        }
    }
    assert!(last > 2, "re-made more than upgradeAttempts times: {last}");
}

/// Issue 20, item 8: Kubernetes says Ready and the services are healthy before Talos'
/// `MachineStatus` is `running` and ready; medea waits for the latter before it uncordons.
#[tokio::test(start_paused = true)]
async fn a_node_is_back_only_when_its_machine_status_is_running_and_ready() {
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE));
    fake.edit(|s| s.booting_polls = 3);
    let (w, out) = run_with(fake, |f| {
        vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)]
    })
    .await;
    assert_eq!(out, RunOutcome::Succeeded);
    let s = w.state();
    assert!(
        s.log.iter().all(|l| !l.contains("booting")),
        "uncordoned while Talos still reported the node booting: {:#?}",
        s.log
    );
    for n in ["w-1", "w-2"] {
        assert!(s.log.iter().any(|l| l == &format!("uncordon {n}")), "{n}");
        assert_eq!(s.nodes[n].counters.upgrade, 1);
        assert_eq!(s.nodes[n].counters.reboot, 1);
    }
}

#[tokio::test(start_paused = true)]
async fn fault_pdb_blocking_forever_halts_at_the_drain_timeout_and_never_forces() {
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE)).with_fault(Fault::PdbBlocks {
        node: "w-1".into(),
        pdb: "default/app".into(),
    });
    let start = tokio::time::Instant::now();
    let (w, out) = run_with(fake, |f| {
        vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)]
    })
    .await;
    halted_at(&out, "w-1", HaltCode::DrainBlocked, "never forces");
    assert!(
        matches!(&out, RunOutcome::Halted { reason, .. } if reason.code() == HaltCode::DrainBlocked && reason.message().contains("default/app"))
    );
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_secs(600) && elapsed < Duration::from_secs(700),
        "{elapsed:?}"
    );
    let s = w.state();
    assert_eq!(
        s.nodes["w-1"].counters.upgrade, 0,
        "never upgraded an undrained node"
    );
    assert!(s.nodes["w-1"].counters.drain >= 1);
    assert_eq!(s.nodes["w-2"].counters, Default::default());
}

#[tokio::test(start_paused = true)]
async fn fault_snapshot_fails_before_any_control_plane_node_is_touched() {
    let fake = FakeCluster::new(&specs(3, 3, FROM, KUBE)).with_fault(Fault::SnapshotFails);
    let (w, out) = run_with(fake, mixed_steps).await;
    assert!(
        matches!(&out, RunOutcome::Halted { reason, .. } if reason.code() == HaltCode::CommandFailed && reason.message().contains("etcd-snapshot")),
        "{out:?}"
    );
    let s = w.state();
    assert!(s.log.is_empty(), "no node touched: {:#?}", s.log);
    assert!(s.nodes.values().all(|n| n.counters == Default::default()));
    assert!(w.job().snapshot.is_none());
}

#[tokio::test(start_paused = true)]
async fn fault_talos_unavailable_bursts_are_retried() {
    let fake =
        FakeCluster::new(&specs(3, 3, FROM, KUBE)).with_fault(Fault::TalosUnavailable { calls: 7 });
    let (w, out) = run_with(fake.clone(), mixed_steps).await;
    assert_eq!(out, RunOutcome::Succeeded);
    assert_rolled(&w.state(), TO, 1);
    assert!(
        w.state()
            .faults
            .contains(&Fault::TalosUnavailable { calls: 0 }),
        "the burst happened"
    );
    // more bursts in the middle of the rollout
    let fake = FakeCluster::new(&specs(3, 3, FROM, KUBE));
    let store = Arc::new(Tripwire::new());
    let w = world_in(fake, store.clone(), mixed_steps, &[]);
    let f2 = w.fake.clone();
    store.arm(
        move |e| {
            let hit = matches!(&e.entry, Entry::Intent { key, .. } if key.op == CommandOp::Reboot && key.node.as_deref() == Some("cp-2"));
            if hit {
                f2.edit(|s| s.faults.push(Fault::TalosUnavailable { calls: 5 }));
            }
            hit
        },
        Trip::AlsoCommit,
        None,
    );
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    assert_rolled(&w.state(), TO, 1);
    assert!(
        w.state()
            .faults
            .contains(&Fault::TalosUnavailable { calls: 0 }),
        "the burst happened"
    );
}

#[tokio::test(start_paused = true)]
async fn fault_kube_apiserver_down_during_a_control_plane_reboot_is_waited_out() {
    let fake = FakeCluster::new(&specs(3, 1, FROM, KUBE))
        .with_fault(Fault::ApiserverAwayDuringControlPlaneReboot { calls: 6 });
    fake.edit(|s| s.reboot_polls = 3);
    let w = world(fake, |f| {
        vec![
            talos_step(f, "cp", &[&["cp-1"], &["cp-2"], &["cp-3"]], TO, 1),
            talos_step(f, "w", &[&["w-1"]], TO, 1),
        ]
    });
    let exec = w.executor();
    let mut events = exec.subscribe();
    assert_eq!(exec.run(&w.job).await.unwrap(), RunOutcome::Succeeded);
    assert_rolled(&w.state(), TO, 1);
    let mut waited = false;
    while let Ok(e) = events.try_recv() {
        if let EventState::Waiting { reason } = &e.state {
            waited |= reason.contains("Kubernetes API unreachable");
        }
    }
    assert!(waited, "the apiserver outage was seen and waited out");
}

#[tokio::test(start_paused = true)]
async fn lost_replies_are_resolved_by_observation_not_repeated() {
    for op in ["upgrade", "reboot", "cordon", "uncordon", "drain", "pull"] {
        let fake = FakeCluster::new(&specs(1, 1, FROM, KUBE))
            .with_fault(Fault::LostReply {
                node: "cp-1".into(),
                op: op.into(),
            })
            .with_fault(Fault::LostReply {
                node: "w-1".into(),
                op: op.into(),
            });
        let (w, out) = run_with(fake, |f| {
            vec![talos_step(f, "all", &[&["cp-1"], &["w-1"]], TO, 1)]
        })
        .await;
        assert_eq!(out, RunOutcome::Succeeded, "lost {op} reply");
        assert_rolled(&w.state(), TO, 1);
        let resolved = w.journal().iter().any(|e| {
            e.notes
                .iter()
                .any(|n| n.contains("resolved by observation"))
        });
        assert!(resolved, "lost {op} reply resolved by observation");
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_that_cannot_report_its_next_boot_halts_instead_of_upgrading_twice() {
    let fake = FakeCluster::new(&specs(0, 1, FROM, KUBE)).with_fault(Fault::LostReply {
        node: "w-1".into(),
        op: "upgrade".into(),
    });
    fake.edit(|s| s.nodes.get_mut("w-1").unwrap().reports_next_boot = false);
    let (w, out) = run_with(fake, |f| vec![talos_step(f, "w", &[&["w-1"]], TO, 1)]).await;
    halted_at(
        &out,
        "w-1",
        HaltCode::OutcomeUnknown,
        "cannot tell whether the upgrade",
    );
    assert_eq!(w.state().nodes["w-1"].counters.upgrade, 1);
}

// ---------------------------------------------------------------------------------------------
// Kubernetes rollout

fn kube_world(talos: &str, from: &str, to: &str) -> World {
    world(FakeCluster::new(&specs(3, 2, talos, from)), |_| {
        vec![kube_step(
            &["cp-1", "cp-2", "cp-3"],
            &["w-1", "w-2"],
            from,
            to,
        )]
    })
}

#[tokio::test(start_paused = true)]
async fn kubernetes_rollout_follows_the_upgrade_k8s_sequence() {
    let w = kube_world(TO, KUBE, "v1.34.1");
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    for (name, n) in &s.nodes {
        assert_eq!(n.kubelet, KubeVersion::parse("v1.34.1").unwrap(), "{name}");
        assert_eq!(
            n.counters.upgrade + n.counters.reboot + n.counters.cordon,
            0,
            "no reboot, no drain"
        );
        if n.control_plane {
            for c in [
                Component::ApiServer,
                Component::ControllerManager,
                Component::Scheduler,
                Component::Proxy,
            ] {
                assert_eq!(n.images[&c], format!("{}:v1.34.1", c.default_repository()));
            }
        }
    }
    assert_eq!(s.snapshots, 1);
    assert_eq!(s.manifest_applies, 1);
    let patches: Vec<&str> = s
        .log
        .iter()
        .filter(|l| l.starts_with("set-image"))
        .map(|l| l.as_str())
        .collect();
    let order: Vec<String> = patches
        .iter()
        .map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            format!("{} {}", p[2], p[1])
        })
        .collect();
    let mut expected = Vec::new();
    for c in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
    ] {
        for n in ["cp-1", "cp-2", "cp-3"] {
            expected.push(format!("{c} {n}"));
        }
    }
    for n in ["cp-1", "cp-2", "cp-3", "w-1", "w-2"] {
        expected.push(format!("kubelet {n}"));
    }
    assert_eq!(order, expected);
    // snapshot and pre-pulls come first, the manifests last
    assert!(s.log[0].starts_with("etcd-snapshot"), "{:#?}", s.log);
    assert!(position(&s.log, "pull w-2") < position(&s.log, "set-image"));
    assert!(s.log.last().unwrap().starts_with("apply-manifests"));
}

#[tokio::test(start_paused = true)]
async fn kubernetes_pre_checks_refuse_two_minors_and_unsupported_talos() {
    let w = kube_world(TO, "v1.32.2", "v1.34.1");
    let out = w.executor().run(&w.job).await.unwrap();
    assert!(
        matches!(&out, RunOutcome::Halted { reason, .. } if reason.code() == HaltCode::PrecheckFailed && reason.message().contains("more than one minor")),
        "{out:?}"
    );
    assert!(w.state().log.is_empty());

    let w = kube_world("v1.12.4", "v1.35.0", "v1.36.1");
    let out = w.executor().run(&w.job).await.unwrap();
    assert!(
        matches!(&out, RunOutcome::Halted { reason, .. } if reason.code() == HaltCode::PrecheckFailed && reason.message().contains("does not support Kubernetes v1.36.1")),
        "{out:?}"
    );
    assert!(w.state().log.is_empty());
}

/// A plan whose catalog (`upgradePolicy.kubernetesSupport`) lets Talos 1.12 run Kubernetes
/// 1.36 runs to the end: the pre-check applies the plan's support rule, not one of its own.
#[tokio::test(start_paused = true)]
async fn kubernetes_pre_check_follows_the_plans_support_windows() {
    let w = world(FakeCluster::new(&specs(3, 2, "v1.12.4", "v1.35.0")), |_| {
        let mut step = kube_step(
            &["cp-1", "cp-2", "cp-3"],
            &["w-1", "w-2"],
            "v1.35.0",
            "v1.36.1",
        );
        if let Step::Kubernetes(k) = &mut step {
            k.supported_talos = Some(vec![(1, 12), (1, 13), (1, 14)]);
        }
        vec![step]
    });
    let out = w.executor().run(&w.job).await.unwrap();
    assert_eq!(out, RunOutcome::Succeeded, "{out:?}");
    for (name, n) in &w.state().nodes {
        assert_eq!(n.kubelet, KubeVersion::parse("v1.36.1").unwrap(), "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_manifests_are_synced_the_legacy_way_when_a_node_runs_talos_before_1_13() {
    // upgrade-k8s decides from the lowest Talos version (`SupportsSSAManifestSync`)
    let w = kube_world("v1.12.4", KUBE, "v1.34.1");
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let last = w.state().log.last().cloned().unwrap();
    assert!(
        last.starts_with("apply-manifests") && last.ends_with(" legacy"),
        "{last}"
    );
    let w = kube_world(TO, KUBE, "v1.34.1");
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let last = w.state().log.last().cloned().unwrap();
    assert!(
        last.starts_with("apply-manifests") && !last.ends_with(" legacy"),
        "{last}"
    );
}

#[tokio::test(start_paused = true)]
async fn kubernetes_rollout_rerun_skips_what_is_already_done() {
    // the control plane already runs the new apiserver (an interrupted earlier attempt)
    let w = kube_world(TO, KUBE, "v1.34.1");
    w.fake.edit(|s| {
        for n in ["cp-1", "cp-2", "cp-3"] {
            s.nodes.get_mut(n).unwrap().images.insert(
                Component::ApiServer,
                "registry.k8s.io/kube-apiserver:v1.34.1".into(),
            );
        }
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert!(
        !s.log
            .iter()
            .any(|l| l.contains("set-image") && l.contains("kube-apiserver")),
        "{:#?}",
        s.log
    );
    assert!(
        !s.log
            .iter()
            .any(|l| l.starts_with("pull") && l.contains("kube-apiserver"))
    );
}

#[tokio::test(start_paused = true)]
async fn kubernetes_rollout_waits_for_the_new_config_version_of_each_static_pod() {
    let w = kube_world(TO, KUBE, "v1.34.1");
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    // each patched component was verified at the config version its apply produced
    let notes: Vec<String> = w.journal().into_iter().flat_map(|e| e.notes).collect();
    for n in ["cp-1", "cp-2", "cp-3"] {
        let want = format!(
            "kube-apiserver on `{n}` runs registry.k8s.io/kube-apiserver:v1.34.1 (config version 2)"
        );
        assert!(notes.contains(&want), "{want}: {notes:#?}");
    }
}

#[tokio::test(start_paused = true)]
async fn kubernetes_a_static_pod_stuck_on_its_old_config_version_halts_before_the_next_node() {
    let fake = FakeCluster::new(&specs(3, 2, TO, KUBE)).with_fault(Fault::StaleConfigVersion {
        node: "cp-1".into(),
        component: Component::ApiServer,
    });
    let w = world(fake, |_| {
        vec![kube_step(
            &["cp-1", "cp-2", "cp-3"],
            &["w-1", "w-2"],
            KUBE,
            "v1.34.1",
        )]
    });
    let out = w.executor().run(&w.job).await.unwrap();
    // the pod runs the new image and is Ready: only the config version tells it is stale
    halted_at(
        &out,
        "cp-1",
        HaltCode::ComponentNotReady,
        "kube-apiserver on `cp-1` is not at config version 2 (its mirror pod shows 1)",
    );
    let s = w.state();
    assert_eq!(
        s.nodes["cp-1"].images[&Component::ApiServer],
        "registry.k8s.io/kube-apiserver:v1.34.1"
    );
    assert_eq!(s.nodes["cp-1"].counters.set_image, 1);
    for n in ["cp-2", "cp-3", "w-1", "w-2"] {
        assert_eq!(s.nodes[n].counters.set_image, 0, "{n} untouched");
    }
}

#[tokio::test(start_paused = true)]
async fn kubernetes_a_component_already_at_the_target_is_verified_at_the_current_config_version() {
    // cp-1 already runs the new apiserver image and is Ready, but its mirror pod was rendered
    // from an older config than Talos has now: that is work that only looks done
    let w = kube_world(TO, KUBE, "v1.34.1");
    w.fake.edit(|s| {
        let n = s.nodes.get_mut("cp-1").unwrap();
        n.images.insert(
            Component::ApiServer,
            "registry.k8s.io/kube-apiserver:v1.34.1".into(),
        );
        n.config_versions.insert(Component::ApiServer, 7);
        n.pod_config_versions.insert(Component::ApiServer, 6);
    });
    let out = w.executor().run(&w.job).await.unwrap();
    halted_at(
        &out,
        "cp-1",
        HaltCode::ComponentNotReady,
        "is not at config version 7 (its mirror pod shows 6)",
    );
    let s = w.state();
    assert!(
        !s.log.iter().any(|l| l.starts_with("set-image")),
        "nothing patched: {:#?}",
        s.log
    );
}

// ---------------------------------------------------------------------------------------------
// resume from every kind of dangling intent

/// A job that has every command kind: control plane + worker Talos rollout, then Kubernetes.
fn full_steps(f: &FakeCluster) -> Vec<Step> {
    vec![
        talos_step(f, "cp", &[&["cp-1"]], TO, 1),
        talos_step(f, "w", &[&["w-1"]], TO, 1),
        kube_step(&["cp-1"], &["w-1"], KUBE, "v1.34.1"),
    ]
}

fn assert_full(s: &FakeState) {
    assert_rolled(s, TO, 1);
    assert_eq!(s.snapshots, 1, "one snapshot");
    for n in s.nodes.values() {
        assert_eq!(n.kubelet, KubeVersion::parse("v1.34.1").unwrap());
    }
}

#[tokio::test(start_paused = true)]
async fn resumes_every_dangling_intent_by_observation() {
    let ops = [
        CommandOp::Snapshot,
        CommandOp::Pull,
        CommandOp::Cordon,
        CommandOp::Drain,
        CommandOp::Upgrade,
        CommandOp::Reboot,
        CommandOp::Uncordon,
        CommandOp::SetImage,
        CommandOp::ApplyManifests,
    ];
    for op in ops {
        // (a) died right after journaling the intent: the call was never made
        // (b) died after the call, before journaling its result
        for (trip, pred) in [
            (Trip::AfterCommit, Box::new(is_intent(op)) as Pred),
            (Trip::InsteadOfCommit, Box::new(is_result(op)) as Pred),
        ] {
            let fake = FakeCluster::new(&specs(1, 1, FROM, KUBE));
            let store = Arc::new(Tripwire::new());
            let w = world_in(fake, store.clone(), full_steps, &[]);
            store.arm(pred, trip, None);
            let e = w.executor().run(&w.job).await.unwrap_err();
            assert!(matches!(e, RolloutError::Store { .. }), "{op}: {e}");
            let dangling = w.job().in_flight.expect("an intent without a result");
            assert_eq!(dangling.key.op, op);
            // a new executor (a restarted medea) picks the job up
            let exec = w.executor();
            let running = exec.running_jobs().unwrap();
            assert_eq!(running.len(), 1);
            assert_eq!(
                exec.run(&w.job).await.unwrap(),
                RunOutcome::Succeeded,
                "{op} {trip:?}"
            );
            let s = w.state();
            assert_full(&s);
            let resolved = w.journal().iter().any(|e| {
                e.notes.iter().any(|n| {
                    n.contains(&format!("/{op}/")) && n.contains("resolved by observation")
                })
            });
            assert!(resolved, "{op} {trip:?}: resolved by observation");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// property: whatever the order of crashes, lost replies and refusals, the machine never
// upgrades or reboots a node twice and never takes more than allowed away

mod machine_props {
    use super::*;
    use medea::error_chain;
    use medea::rollout::ports::{PortError, SnapshotInfo};
    use medea::rollout::sequencer::{
        self, Action, Command, CommandOutcome, Needs, Next, ObsError, Observations,
    };
    use proptest::prelude::*;

    fn obs_err(e: PortError) -> ObsError {
        ObsError {
            transient: e.is_transient(),
            message: error_chain(&e),
        }
    }

    fn observe(fake: &FakeCluster, needs: &Needs, snap: &Option<SnapshotInfo>) -> Observations {
        let mut o = Observations::default();
        for t in &needs.talos {
            o.talos
                .insert(t.node.clone(), fake.talos_node(t).map_err(obs_err));
        }
        for k in &needs.kube {
            o.kube.insert(k.clone(), fake.kube_node(k).map_err(obs_err));
        }
        if let Some(via) = &needs.etcd {
            o.etcd = Some(fake.talos_etcd(via).map_err(obs_err));
        }
        for t in &needs.args {
            o.args
                .insert(t.node.clone(), fake.talos_args(t).map_err(obs_err));
        }
        for t in &needs.images {
            o.images
                .insert(t.node.clone(), fake.talos_images(t).map_err(obs_err));
        }
        for (n, c) in &needs.static_pods {
            o.static_pods.insert(
                (n.clone(), *c),
                fake.kube_static_pod(n, *c).map_err(obs_err),
            );
        }
        for (t, c) in &needs.config_versions {
            o.config_versions.insert(
                (t.node.clone(), *c),
                fake.talos_config_version(t, *c).map_err(obs_err),
            );
        }
        if needs.snapshot {
            o.snapshot = Some(Ok(snap.clone()));
        }
        o
    }

    fn fake_op(op: CommandOp) -> &'static str {
        match op {
            CommandOp::Snapshot => "etcd-snapshot",
            CommandOp::Pull | CommandOp::PullAhead => "pull",
            CommandOp::Cordon => "cordon",
            CommandOp::Drain => "drain",
            CommandOp::Upgrade => "upgrade",
            CommandOp::Reboot => "reboot",
            CommandOp::Uncordon => "uncordon",
            CommandOp::SetImage => "apply-configuration",
            CommandOp::ApplyManifests => "server-side-apply",
            CommandOp::Rollback => "rollback",
        }
    }

    fn execute(
        fake: &FakeCluster,
        cmd: &Command,
        snap: &mut Option<SnapshotInfo>,
    ) -> CommandOutcome {
        let r: Result<CommandOutcome, PortError> = match &cmd.action {
            Action::Snapshot { via } => fake.talos_snapshot(via).map(|bytes| {
                use sha2::Digest;
                let info = SnapshotInfo {
                    path: "/snapshots/job.db".into(),
                    size: bytes.len() as u64,
                    sha256: hex::encode(sha2::Sha256::digest(&bytes)),
                };
                *snap = Some(info.clone());
                CommandOutcome::Snapshot { info }
            }),
            Action::Pull { node, image, .. } => {
                fake.talos_pull(node, image).map(|()| CommandOutcome::Done)
            }
            Action::Cordon { node } => fake.kube_cordon(node, true).map(|()| CommandOutcome::Done),
            Action::Uncordon { node } => {
                fake.kube_cordon(node, false).map(|()| CommandOutcome::Done)
            }
            Action::Drain { node, .. } => fake
                .kube_drain(node)
                .map(|result| CommandOutcome::Drain { result }),
            Action::Upgrade {
                node,
                image,
                method,
                ..
            } => fake
                .talos_upgrade(node, image, *method)
                .map(|()| CommandOutcome::Done),
            Action::Reboot { node, .. } => fake.talos_reboot(node).map(|()| CommandOutcome::Done),
            Action::Rollback { node, .. } => {
                fake.talos_rollback(node).map(|()| CommandOutcome::Done)
            }
            Action::SetImage {
                node,
                component,
                image,
            } => fake
                .talos_set_image(node, *component, image)
                .map(|()| CommandOutcome::Done),
            Action::ApplyManifests { via, legacy } => fake
                .talos_manifests(via)
                .and_then(|m| fake.kube_apply(&m, *legacy))
                .map(|()| CommandOutcome::Done),
        };
        match r {
            Ok(o) => o,
            Err(e) if e.is_transient() => CommandOutcome::Transient {
                error: error_chain(&e),
            },
            Err(e) => CommandOutcome::Failed {
                error: error_chain(&e),
            },
        }
    }

    fn check_invariants(s: &FakeState, max: usize) {
        let away = |cp: bool| {
            s.nodes
                .values()
                .filter(|n| n.control_plane == cp && (n.cordoned || n.down()))
                .count()
        };
        assert!(
            away(true) <= 1,
            "control plane: {} away\n{:#?}",
            away(true),
            s.log
        );
        assert!(
            away(false) <= max,
            "workers: {} away, max {max}\n{:#?}",
            away(false),
            s.log
        );
        for (name, n) in &s.nodes {
            assert!(
                n.counters.upgrade <= 1,
                "{name} upgraded twice\n{:#?}",
                s.log
            );
            assert!(
                n.counters.reboot <= 1,
                "{name} rebooted twice\n{:#?}",
                s.log
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    /// `next`, after checking that the journal's delta from `job` to `next` (through its JSON
    /// encoding, as stored) rebuilds `next` exactly.
    fn replayed(job: &Job, next: Job) -> Job {
        use medea::rollout::journal::JobDelta;
        let delta =
            JobDelta::between(job, &next).expect("a transition changes no plan-derived part");
        let delta: JobDelta = serde_json::from_slice(&serde_json::to_vec(&delta).unwrap()).unwrap();
        let mut rebuilt = job.clone();
        delta.apply(&mut rebuilt).unwrap();
        rebuilt.journal_seq = next.journal_seq;
        assert_eq!(rebuilt, next, "the delta rebuilds the transition");
        next
    }

    fn run(
        cps: usize,
        workers: usize,
        max: u32,
        reboot_polls: u32,
        with_kube: bool,
        oversized_waves: bool,
        chaos: Vec<u8>,
    ) {
        let fake = FakeCluster::new(&specs(cps, workers, FROM, KUBE));
        fake.edit(|s| s.reboot_polls = reboot_polls);
        let obs = observed(&fake);
        let cp_names: Vec<String> = (1..=cps).map(|i| format!("cp-{i}")).collect();
        let w_names: Vec<String> = (1..=workers).map(|i| format!("w-{i}")).collect();
        // oversized waves stand for a planner bug: the machine must still honour the limits
        let cp_waves: Vec<Vec<&str>> = if oversized_waves {
            vec![cp_names.iter().map(|n| n.as_str()).collect()]
        } else {
            cp_names.iter().map(|n| vec![n.as_str()]).collect()
        };
        let chunk = if oversized_waves {
            max as usize * 2
        } else {
            max as usize
        };
        let w_waves: Vec<Vec<&str>> = w_names
            .chunks(chunk)
            .map(|c| c.iter().map(|s| s.as_str()).collect())
            .collect();
        let mut steps = vec![talos_step(
            &fake,
            "cp",
            &cp_waves.iter().map(|w| w.as_slice()).collect::<Vec<_>>(),
            TO,
            1,
        )];
        if !w_waves.is_empty() {
            steps.push(talos_step(
                &fake,
                "w",
                &w_waves.iter().map(|w| w.as_slice()).collect::<Vec<_>>(),
                TO,
                max,
            ));
        }
        if with_kube {
            let c: Vec<&str> = cp_names.iter().map(|s| s.as_str()).collect();
            let w: Vec<&str> = w_names.iter().map(|s| s.as_str()).collect();
            steps.push(kube_step(&c, &w, KUBE, "v1.34.1"));
        }
        let p = plan(&obs, steps, 3);
        let none: &[MaintenanceWindow] = &[];
        let inputs = JobInputs {
            global_rollouts: true,
            clusters: [(CLUSTER.to_string(), &obs)].into(),
            windows: [(CLUSTER.to_string(), none)].into(),
        };
        let mut job = create_jobs_txn(&p, &inputs, t0()).unwrap().jobs.remove(0);
        let mut now = t0();
        let mut snap = None;
        // every cycle of the chaos has at least one clean call, so the world lets it progress
        let mut chaos = chaos.into_iter().chain([7]).cycle();
        for _ in 0..20_000 {
            let mut o = observe(&fake, &sequencer::needs(&job, now), &snap);
            let mut t = sequencer::step(&job, &o, now);
            for _ in 0..16 {
                if t.missing.is_empty() {
                    break;
                }
                o.merge(observe(&fake, &t.missing, &snap));
                t = sequencer::step(&job, &o, now);
            }
            job = replayed(&job, t.job);
            match t.next {
                Next::Finished => break,
                Next::Run(cmd) => {
                    job = replayed(&job, sequencer::intend(&job, &cmd, now));
                    match chaos.next().unwrap() {
                        // crashed right after journaling the intent
                        0 => {}
                        // crashed after the call, before journaling its result
                        1 => {
                            execute(&fake, &cmd, &mut snap);
                        }
                        // the call took effect, the reply was lost
                        2 => {
                            let node = cmd.key.node.clone().unwrap_or_default();
                            let node = if cmd.key.op == CommandOp::Snapshot {
                                match &cmd.action {
                                    Action::Snapshot { via } => via.node.clone(),
                                    _ => node,
                                }
                            } else {
                                node
                            };
                            fake.edit(|s| {
                                s.faults.push(Fault::LostReply {
                                    node,
                                    op: fake_op(cmd.key.op).into(),
                                })
                            });
                            let out = execute(&fake, &cmd, &mut snap);
                            job = replayed(&job, sequencer::complete(&job, &cmd.key, &out, now).0);
                            fake.edit(|s| {
                                s.faults.retain(|f| !matches!(f, Fault::LostReply { .. }))
                            });
                        }
                        // the Talos API refused the call (UNAVAILABLE, no effect)
                        3 => {
                            fake.edit(|s| s.faults.push(Fault::TalosUnavailable { calls: 1 }));
                            let out = execute(&fake, &cmd, &mut snap);
                            job = replayed(&job, sequencer::complete(&job, &cmd.key, &out, now).0);
                            fake.edit(|s| {
                                s.faults
                                    .retain(|f| !matches!(f, Fault::TalosUnavailable { .. }))
                            });
                        }
                        _ => {
                            let out = execute(&fake, &cmd, &mut snap);
                            job = replayed(&job, sequencer::complete(&job, &cmd.key, &out, now).0);
                        }
                    }
                    check_invariants(&fake.state(), max as usize);
                }
                Next::Poll { .. } => now = now.checked_add(Duration::from_secs(5)).unwrap(),
                Next::WaitUntil { at, .. } => now = at,
            }
            now = now.checked_add(Duration::from_secs(1)).unwrap();
        }
        assert!(
            matches!(job.state, JobState::Succeeded { .. }),
            "{:?}\n{:#?}",
            job.state,
            fake.state().log
        );
        let s = fake.state();
        assert_rolled(&s, TO, 1);
        assert!(s.snapshots >= 1);
        if with_kube {
            assert!(
                s.nodes
                    .values()
                    .all(|n| n.kubelet == KubeVersion::parse("v1.34.1").unwrap())
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn never_twice_never_too_many_away(
            cps in prop_oneof![Just(1usize), Just(3usize)],
            workers in 0usize..=4,
            max in 1u32..=3,
            reboot_polls in 0u32..3,
            with_kube in any::<bool>(),
            oversized_waves in any::<bool>(),
            chaos in proptest::collection::vec(0u8..8, 1..64),
        ) {
            run(cps, workers, max, reboot_polls, with_kube, oversized_waves, chaos);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// crash harness: a child medea killed at every journal point

pub mod crash {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use medea::store::fjall::FjallStore;

    use super::*;

    /// What the harness checks after each run, whatever the cluster is made of.
    #[derive(Debug)]
    pub struct Summary {
        /// Node → (running version, cordoned, Upgrade calls, Reboot calls).
        pub nodes: BTreeMap<String, (TalosVersion, bool, u32, u32)>,
        pub snapshots: u32,
        /// Accepted mutating calls, for failure messages.
        pub log: Vec<String>,
    }

    /// A cluster that survives the child's death, and how to run the child against it.
    /// `FakeWorld` keeps the cluster in a JSON file; a simulator world runs `medea sim`, seeds
    /// the store the same way, points the child at the simulator, and reads the simulator's
    /// side-effect counters into a [`Summary`].
    pub trait CrashWorld {
        fn prepare(dir: &Path) -> Self;
        /// `medea __rollout-run ...` for this world (without crash variables).
        fn child(&self) -> Command;
        /// The cluster's state and side-effect counters.
        fn summary(&self) -> Summary;
        fn store(&self) -> PathBuf;
    }

    pub struct FakeWorld {
        dir: PathBuf,
    }

    impl CrashWorld for FakeWorld {
        fn prepare(dir: &Path) -> FakeWorld {
            let fake = FakeCluster::new(&specs(3, 3, FROM, KUBE));
            fake.save(&dir.join("cluster.json")).unwrap();
            let store = FjallStore::open(&dir.join("store")).unwrap();
            let obs = observed(&fake);
            let p = plan(&obs, mixed_steps(&fake), 9);
            install(&store, &p, &obs, &[]).unwrap();
            drop(store);
            FakeWorld {
                dir: dir.to_path_buf(),
            }
        }
        fn child(&self) -> Command {
            let mut c = crate::cli::medea();
            c.arg("__rollout-run")
                .arg("--rollouts")
                .arg("--store")
                .arg(self.dir.join("store"))
                .arg("--fake-state")
                .arg(self.dir.join("cluster.json"))
                .arg("--snapshots")
                .arg(self.dir.join("snapshots"))
                .env_remove("MEDEA_CRASH_AT")
                .env_remove("MEDEA_CRASH_AFTER")
                .env_remove("MEDEA_CRASH_BEFORE");
            c
        }
        fn summary(&self) -> Summary {
            let s = FakeCluster::persistent(&self.dir.join("cluster.json"))
                .unwrap()
                .state();
            Summary {
                nodes: s
                    .nodes
                    .iter()
                    .map(|(k, n)| {
                        (
                            k.clone(),
                            (
                                n.version.clone(),
                                n.cordoned,
                                n.counters.upgrade,
                                n.counters.reboot,
                            ),
                        )
                    })
                    .collect(),
                snapshots: s.snapshots,
                log: s.log,
            }
        }
        fn store(&self) -> PathBuf {
            self.dir.join("store")
        }
    }

    /// Scratch space on tmpfs when there is one (the harness fsyncs a lot).
    pub fn scratch() -> tempfile::TempDir {
        let shm = Path::new("/dev/shm");
        if shm.is_dir()
            && let Ok(d) = tempfile::tempdir_in(shm)
        {
            return d;
        }
        tempfile::tempdir().unwrap()
    }

    /// For N = 1, 2, …: run the rollout with the child aborting at journal point N (`var`),
    /// restart it, and check the outcome; stop at the first N the child never reaches.
    /// Returns the number of journal points.
    pub fn harness<W: CrashWorld>(var: &str) -> u64 {
        for n in 1u64.. {
            let dir = scratch();
            let w = W::prepare(dir.path());
            let first = w.child().env(var, n.to_string()).output().unwrap();
            if first.status.success() {
                assert!(n > 1, "the rollout has journal points");
                check(&w, &format!("{var}={n} (never reached)"));
                // every executor commit is one journal entry after the creation (seq 0)
                let store = FjallStore::open(&w.store()).unwrap();
                let jobs = medea::ops::jobs::load_jobs(&store).unwrap();
                assert_eq!(jobs[0].journal_seq, n - 1, "journal points");
                return n - 1;
            }
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                first.status.signal(),
                Some(6),
                "{var}={n}: the child must die by abort, not fail: {}",
                String::from_utf8_lossy(&first.stderr)
            );
            let again = w.child().output().unwrap();
            assert!(
                again.status.success(),
                "{var}={n}: the restarted child failed: {}\n{}",
                String::from_utf8_lossy(&again.stdout),
                String::from_utf8_lossy(&again.stderr)
            );
            check(&w, &format!("{var}={n}"));
        }
        unreachable!()
    }

    pub fn check<W: CrashWorld>(w: &W, what: &str) {
        let s = w.summary();
        assert_eq!(s.nodes.len(), 6);
        for (name, (version, cordoned, upgrades, reboots)) in &s.nodes {
            assert_eq!(version, &tv(TO), "{what}: {name} on target");
            assert!(!cordoned, "{what}: {name} left cordoned");
            assert_eq!(*upgrades, 1, "{what}: {name} Upgrade calls\n{:#?}", s.log);
            assert_eq!(*reboots, 1, "{what}: {name} Reboot calls\n{:#?}", s.log);
        }
        assert_eq!(s.snapshots, 1, "{what}: one snapshot");
        let store = FjallStore::open(&w.store()).unwrap();
        let jobs = medea::ops::jobs::load_jobs(&store).unwrap();
        assert_eq!(jobs.len(), 1);
        assert!(
            matches!(jobs[0].state, JobState::Succeeded { .. }),
            "{what}: {:?}",
            jobs[0].state
        );
    }

    #[test]
    fn killed_after_every_journal_write_the_rollout_completes_exactly_once() {
        let points = harness::<FakeWorld>("MEDEA_CRASH_AT");
        assert!(
            points > 50,
            "a 6-node rollout has many journal points ({points})"
        );
    }

    #[test]
    fn killed_before_every_journal_write_the_rollout_completes_exactly_once() {
        let points = harness::<FakeWorld>("MEDEA_CRASH_BEFORE");
        assert!(points > 50, "{points}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_halt_request_is_noticed_while_waiting_for_a_window() {
    let window = MaintenanceWindow::new("0 2 * * 6", Duration::from_secs(3600), "UTC").unwrap();
    let w = world_in(
        FakeCluster::new(&specs(0, 1, FROM, KUBE)),
        Arc::new(MemStore::new()),
        |f| vec![talos_step(f, "workers", &[&["w-1"]], TO, 1)],
        &[window],
    );
    let exec = w.executor();
    let job = w.job.clone();
    let task = tokio::spawn(async move { exec.run(&job).await });
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!task.is_finished(), "waiting for Saturday");
    request_halt(
        w.store.as_ref(),
        &w.job,
        "carol",
        Some("change freeze"),
        t0(),
    )
    .unwrap();
    let out = task.await.unwrap().unwrap();
    assert!(
        matches!(&out, RunOutcome::Halted { reason, .. } if reason.code() == HaltCode::OperatorRequest && reason.message().contains("change freeze")),
        "{out:?}"
    );
    assert!(w.state().log.is_empty());
}

struct LostLease;

impl medea::rollout::CommitFence for LostLease {
    fn checks(&self) -> Vec<medea::store::Check> {
        vec![medea::store::Check::Equals(
            Table::Meta,
            "leader".into(),
            b"me".to_vec(),
        )]
    }
}

#[tokio::test(start_paused = true)]
async fn a_fenced_executor_makes_no_call() {
    let w = world(FakeCluster::new(&specs(0, 1, FROM, KUBE)), |f| {
        vec![talos_step(f, "workers", &[&["w-1"]], TO, 1)]
    });
    w.store
        .commit(Txn::new().put(Table::Meta, "leader", b"someone-else".to_vec()))
        .unwrap();
    let exec = w.executor().with_fence(Arc::new(LostLease));
    let e = exec.run(&w.job).await.unwrap_err();
    assert!(matches!(e, RolloutError::Fenced { .. }), "{e}");
    assert!(
        w.state().log.is_empty(),
        "the intent could not be journaled, so nothing was called"
    );
    // with the lease, the same job runs
    w.store
        .commit(Txn::new().put(Table::Meta, "leader", b"me".to_vec()))
        .unwrap();
    let exec = w.executor().with_fence(Arc::new(LostLease));
    assert_eq!(exec.run(&w.job).await.unwrap(), RunOutcome::Succeeded);
}

/// A term that ends between the fenced intent write and the call (the leader was stopped in
/// between): the checks still pass at the write, `ensure` refuses afterwards.
struct TermEndsAfterTheIntent;

impl medea::rollout::CommitFence for TermEndsAfterTheIntent {
    fn checks(&self) -> Vec<medea::store::Check> {
        Vec::new()
    }
    fn ensure(&self, _intent_checks: &[medea::store::Check]) -> Result<(), StoreError> {
        Err(StoreError::Fenced {
            replica: "a".into(),
            term: 7,
        })
    }
}

#[tokio::test(start_paused = true)]
async fn an_intent_whose_term_ended_before_the_call_is_not_acted_on() {
    let w = world(FakeCluster::new(&specs(0, 1, FROM, KUBE)), |f| {
        vec![talos_step(f, "workers", &[&["w-1"]], TO, 1)]
    });
    let exec = w.executor().with_fence(Arc::new(TermEndsAfterTheIntent));
    let e = exec.run(&w.job).await.unwrap_err();
    assert!(matches!(e, RolloutError::Fenced { .. }), "{e}");
    assert!(w.state().log.is_empty(), "no call: {:?}", w.state().log);
    let last = w.journal().pop().unwrap();
    assert!(
        matches!(last.entry, Entry::Intent { .. }),
        "the intent was journaled, its outcome was not: {last:?}"
    );
    // The next leader resumes that intent and makes each call once.
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let log = w.state().log;
    for op in ["upgrade w-1", "reboot w-1"] {
        assert_eq!(
            log.iter().filter(|l| l.starts_with(op)).count(),
            1,
            "{op}: {log:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn resume_all_runs_every_running_job() {
    let w = world(FakeCluster::new(&specs(3, 3, FROM, KUBE)), mixed_steps);
    let exec = Arc::new(w.executor());
    let results = exec.resume_all().await.unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, w.job);
    assert!(matches!(results[0].1, Ok(RunOutcome::Succeeded)));
    assert!(
        exec.resume_all().await.unwrap().is_empty(),
        "nothing left running"
    );
    assert!(exec.commits() > 0);
}

#[test]
fn the_journaled_upgrade_method_is_the_rpc_the_talos_client_picks() {
    use medea::rollout::ports::UpgradeMethod;
    use medea::talos::UpgradeRpc;
    for v in [
        "v1.10.7",
        "v1.12.4",
        "v1.13.0-alpha.2",
        "v1.13.0-beta.1",
        "v1.13.0",
        "v1.13.9",
        "v1.14.0-rc.1",
        "v1.15.2",
        "v2.0.0",
    ] {
        let v = tv(v);
        let ours = UpgradeMethod::for_version(&v);
        let theirs = UpgradeRpc::for_running(&v);
        let same = matches!(
            (ours, theirs),
            (UpgradeMethod::Lifecycle, UpgradeRpc::Lifecycle)
                | (UpgradeMethod::Legacy, UpgradeRpc::Legacy)
        );
        assert!(same, "{v}: {ours:?} vs {theirs:?}");
    }
}

#[test]
fn the_harness_command_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let out = crate::cli::medea()
        .args(["__rollout-run", "--store"])
        .arg(dir.path().join("store"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--fake-state"), "{err}");
    assert!(!dir.path().join("store").exists(), "nothing created");
    let out = crate::cli::medea()
        .args(["__rollout-run", "--store"])
        .arg(dir.path().join("store"))
        .arg("--fake-state")
        .arg(dir.path().join("missing.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot load the fake cluster"));
}

/// A drained node waiting for its Upgrade is observed when its turn comes, not in every
/// decision of its wave: a wave of n nodes costs O(n) such observations, not O(n²).
#[tokio::test(start_paused = true)]
async fn a_drained_node_is_observed_at_its_turn_not_at_every_decision_of_its_wave() {
    let names: Vec<String> = (1..=8).map(|i| format!("w-{i}")).collect();
    let wave: Vec<&str> = names.iter().map(String::as_str).collect();
    let w = world(FakeCluster::new(&specs(0, 8, FROM, KUBE)), |f| {
        vec![talos_step(f, "workers", &[&wave], TO, 8)]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    assert_rolled(&w.state(), TO, 1);
    let seen = w.fake.observations_while_drained();
    assert_eq!(
        seen.len(),
        8,
        "every node was checked before its upgrade: {seen:?}"
    );
    assert!(
        seen.values().all(|n| *n == 1),
        "each drained node observed once, right before its Upgrade: {seen:?}"
    );
    // lockstep is kept: every node drained before the first upgrade, every upgrade before the
    // first reboot
    let log = &w.state().log;
    assert!(
        position(log, "drain w-8") < position(log, "upgrade w-1"),
        "{log:#?}"
    );
    assert!(
        position(log, "upgrade w-8") < position(log, "reboot w-1"),
        "{log:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_nodes_of_a_wave_are_observed_concurrently() {
    // the three nodes stay away long enough to be rebooting together: a decision then
    // observes all three (a wave's nodes waiting for their turn are observed at their turn)
    let fake = FakeCluster::new(&specs(0, 3, FROM, KUBE));
    fake.edit(|s| s.reboot_polls = 3);
    let w = world(fake, |f| {
        vec![talos_step(f, "workers", &[&["w-1", "w-2", "w-3"]], TO, 3)]
    });
    w.fake.yield_in_observations();
    let exec = w.executor();
    assert_eq!(exec.run(&w.job).await.unwrap(), RunOutcome::Succeeded);
    assert_rolled(&w.state(), TO, 1);
    assert_eq!(
        w.fake.max_concurrent_observations(),
        3,
        "the three nodes of the wave were observed at once"
    );
}
