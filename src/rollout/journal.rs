//! The rollout journal and the job records: their keys, record formats and deltas, folding a
//! journal into a job ([`replay`]) and the transaction that appends to it ([`advance_txn`]).
//! Pure: it builds [`Txn`] values and folds entries it is given; reading and committing are the
//! callers' (`ops::jobs` loads jobs, the executor commits).
//!
//! Keys (all UTF-8):
//! - `Jobs/job/<job-id>`: a **checkpoint** of the [`Job`]: written at creation, then by every
//!   [`CHECKPOINT_EVERY`]-th executor transaction, by every transaction that ends the job, and by
//!   any transaction whose change a [`JobDelta`] cannot express;
//! - `Jobs/active/<cluster>`: [`ActiveJob`], present while a job of the cluster is running (at
//!   most one at a time);
//! - `Jobs/halt/<job-id>`: [`HaltRequest`], written by `medea rollout halt`;
//! - `Journal/<job-id>/<seq, 10 digits>`: [`JournalEntry`], append-only, one per transaction
//!   (sequence 0 is the creation). Every entry after the creation carries the [`JobDelta`] it
//!   made, so the current job is the checkpoint plus the deltas of the entries after its
//!   `journal_seq` ([`replay`], `ops::jobs::load_job`);
//! - `Plans/consumed/<plan hex>`: [`PlanConsumed`], a plan that started jobs never starts again.
//!
//! Every executor write is one durable [`Txn`] holding the journal entry (with its delta) and,
//! at checkpoints, the whole job, so the job state and the journal never disagree. The
//! transaction's precondition is that the *next* entry is absent: an append-only log admits one
//! writer per sequence number, which is the compare-and-swap the whole-job rewrite used to give,
//! at O(1) bytes per commit instead of O(job).

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::ports::GateEvaluation;
use super::ports::SnapshotInfo;
use super::sequencer::{
    Action, CommandKey, CommandOutcome, GatePoint, GateProgress, HookRun, Intent, Job, JobId,
    JobState, KubeTask, KubeTasks, NodeProgress, StepKind, StepState,
};
use crate::plan::PlanId;
use crate::store::record::encode;
use crate::store::{Check, Op, Record, StoreError, Table, Txn};

/// A full job record is written at least every this many journal entries, so reading a job
/// replays at most this many deltas.
pub const CHECKPOINT_EVERY: u64 = 64;

/// The key of job `id`'s record.
pub fn job_key(id: &JobId) -> String {
    format!("job/{id}")
}
/// The key of the marker of `cluster`'s running job.
pub fn active_key(cluster: &str) -> String {
    format!("active/{cluster}")
}
/// The key of the halt request of job `id`.
pub fn halt_key(id: &JobId) -> String {
    format!("halt/{id}")
}
/// The key of journal entry `seq` of job `id`.
pub fn entry_key(id: &JobId, seq: u64) -> String {
    format!("{id}/{seq:010}")
}
/// Prefix of every journal entry of a job (scan in sequence order).
pub fn entries_prefix(id: &JobId) -> String {
    format!("{id}/")
}

impl Record for Job {
    const TABLE: Table = Table::Jobs;
    const KIND: &'static str = "rollout-job";
    /// 2: the record is a checkpoint; the journal's deltas after its `journal_seq` complete it
    /// (a medea that reads schema 1 would take the checkpoint for the current job, so it must
    /// refuse these). Schema 1 records were always current; they read as they are.
    const SCHEMA: u32 = 2;
    fn upgrade(schema: u32, data: serde_json::Value) -> Result<serde_json::Value, String> {
        match schema {
            1 => Ok(data),
            _ => Err(format!("no upgrade path from schema {schema}")),
        }
    }
}

/// One journal entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalEntry {
    /// The job.
    pub job: JobId,
    /// The entry's place in the job's journal (0: the creation).
    pub seq: u64,
    /// When it was written.
    pub at: Timestamp,
    /// The job generation this entry moved the job to.
    pub generation: u64,
    /// What happened.
    pub entry: Entry,
    /// What changed with it (human readable).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The change this entry made to the job (every entry after the creation; entries written
    /// before deltas existed have none and were always followed by a full job record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<JobDelta>,
}

impl Record for JournalEntry {
    const TABLE: Table = Table::Journal;
    const KIND: &'static str = "rollout-journal";
    const SCHEMA: u32 = 1;
}

/// What one journal entry records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum Entry {
    /// The job was born from an approved plan.
    Created {
        /// The plan.
        plan: PlanId,
    },
    /// A command is about to be made (written and fsync'd before the call).
    Intent {
        /// The command's idempotency key.
        key: CommandKey,
        /// What the command does.
        action: Action,
    },
    /// The outcome of a command.
    Result {
        /// The command's idempotency key.
        key: CommandKey,
        /// Its outcome.
        outcome: CommandOutcome,
    },
    /// Progress from observations alone (checks passed, node back, step done, resolution).
    Progress,
    /// The job stopped on an operator's request.
    HaltRequested {
        /// Who asked.
        by: String,
    },
    /// Health gates were evaluated at `point` (the evidence, as the probe returned it).
    Gates {
        /// Where in the job.
        point: GatePoint,
        /// Each gate's verdict and evidence.
        evaluations: Vec<GateEvaluation>,
    },
}

impl Entry {
    /// The entry's kind, for journal points (`intent`, `result`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Entry::Created { .. } => "created",
            Entry::Intent { .. } => "intent",
            Entry::Result { .. } => "result",
            Entry::Progress => "progress",
            Entry::HaltRequested { .. } => "halt-requested",
            Entry::Gates { .. } => "gates",
        }
    }
}

/// Marks the cluster's running job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveJob {
    /// The job.
    pub job: JobId,
}

impl Record for ActiveJob {
    const TABLE: Table = Table::Jobs;
    const KIND: &'static str = "rollout-active";
    const SCHEMA: u32 = 1;
}

/// An operator's request to stop a job before its next mutating command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaltRequest {
    /// The job to halt.
    pub job: JobId,
    /// Who asked.
    pub by: String,
    /// Why, if they said.
    pub reason: Option<String>,
    /// When.
    pub at: Timestamp,
}

impl Record for HaltRequest {
    const TABLE: Table = Table::Jobs;
    const KIND: &'static str = "rollout-halt-request";
    const SCHEMA: u32 = 1;
}

/// A plan that started jobs: it can never start again. Kept in the `Plans` table under
/// [`crate::plan::stored::consumed_key`] (the table's key layout is `plan::stored`'s); the
/// record is declared here, where it is defined, because it names the jobs it created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanConsumed {
    /// The executed plan.
    pub plan: PlanId,
    /// The jobs started from it.
    pub jobs: Vec<JobId>,
    /// When.
    pub at: Timestamp,
}

impl Record for PlanConsumed {
    const TABLE: Table = Table::Plans;
    const KIND: &'static str = "plan-consumed";
    const SCHEMA: u32 = 1;
}

/// What one transaction changed in a job: its mutable head, and the steps, nodes and tasks
/// that changed (each written whole). The plan-derived parts of a job (targets, waves,
/// rollouts, windows, control plane) never change after creation; a change to them is not
/// expressible here and gets a checkpoint instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobDelta {
    /// The job's state.
    pub state: JobState,
    /// The job's generation after the entry.
    pub generation: u64,
    /// The etcd snapshot taken, once there is one.
    pub snapshot: Option<SnapshotInfo>,
    /// Snapshot attempts so far.
    pub snapshot_attempts: u32,
    /// The command journaled and not resolved yet.
    pub in_flight: Option<Intent>,
    /// The steps that changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepDelta>,
    /// The job's health-gate progress, when it changed (whole: it is bounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gates: Option<GateProgress>,
    /// The job's hook records that changed (issue #35), by site (each written whole).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hook_runs: BTreeMap<String, HookRun>,
    /// The job's clock (issue #51), when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<crate::rollout::sequencer::JobClock>,
}

/// What changed in one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepDelta {
    /// The step's index in the job.
    pub index: usize,
    /// Its state.
    pub state: StepState,
    /// Talos step: the nodes that changed, by index in the step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<(usize, std::sync::Arc<NodeProgress>)>,
    /// Kubernetes step: its progress, when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube: Option<KubeDelta>,
    /// Talos step: the budget of its current wave, when it changed (issue #35, pacing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::rollout::sequencer::WaveBudget>,
}

/// What changed in a Kubernetes step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeDelta {
    /// When the step started.
    pub since: Option<Timestamp>,
    /// Its tasks.
    pub tasks: TasksDelta,
}

/// What changed in a Kubernetes step's tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum TasksDelta {
    /// Nothing.
    Unchanged,
    /// The task list was built (or replaced) whole.
    Set {
        /// The whole list.
        tasks: KubeTasks,
    },
    /// These tasks changed, by index.
    Changed {
        /// The changed tasks with their indexes.
        tasks: Vec<(usize, KubeTask)>,
    },
}

impl JobDelta {
    /// The delta that turns `prev` into `next`, or `None` when `next` differs from `prev` in a
    /// part that never changes after creation.
    pub fn between(prev: &Job, next: &Job) -> Option<JobDelta> {
        if prev.id != next.id
            || prev.plan != next.plan
            || prev.cluster != next.cluster
            || prev.created_at != next.created_at
            || prev.windows != next.windows
            || prev.exclusions != next.exclusions
            || prev.predicted != next.predicted
            || prev.control_plane != next.control_plane
            || prev.health != next.health
            || prev.applies != next.applies
            || prev.hooks != next.hooks
            || prev.steps.len() != next.steps.len()
            // records are added and changed, never removed
            || prev.hook_runs.keys().any(|k| !next.hook_runs.contains_key(k))
        {
            return None;
        }
        let mut steps = Vec::new();
        for (index, (a, b)) in prev.steps.iter().zip(&next.steps).enumerate() {
            let mut d = StepDelta {
                index,
                state: b.state,
                nodes: Vec::new(),
                kube: None,
                budget: None,
            };
            match (&a.kind, &b.kind) {
                (StepKind::Talos(x), StepKind::Talos(y)) => {
                    if x.rollout != y.rollout || x.nodes.len() != y.nodes.len() {
                        return None;
                    }
                    if x.budget != y.budget {
                        // a budget is only ever counted (again), never cleared
                        d.budget = Some(y.budget.clone()?);
                    }
                    d.nodes = x
                        .nodes
                        .iter()
                        .zip(&y.nodes)
                        .enumerate()
                        .filter(|(_, (p, n))| p != n)
                        .map(|(i, (_, n))| (i, n.clone()))
                        .collect();
                }
                (StepKind::Kubernetes(x), StepKind::Kubernetes(y)) => {
                    if x.rollout != y.rollout
                        || x.control_plane != y.control_plane
                        || x.workers != y.workers
                    {
                        return None;
                    }
                    let tasks = match (&x.tasks, &y.tasks) {
                        (p, n) if p == n => TasksDelta::Unchanged,
                        (KubeTasks::Planned(p), KubeTasks::Planned(n)) if p.len() == n.len() => {
                            TasksDelta::Changed {
                                tasks: p
                                    .iter()
                                    .zip(n)
                                    .enumerate()
                                    .filter(|(_, (p, n))| p != n)
                                    .map(|(i, (_, n))| (i, n.clone()))
                                    .collect(),
                            }
                        }
                        (_, n) => TasksDelta::Set { tasks: n.clone() },
                    };
                    if x.since != y.since || tasks != TasksDelta::Unchanged {
                        d.kube = Some(KubeDelta {
                            since: y.since,
                            tasks,
                        });
                    }
                }
                _ => return None,
            }
            if a.state != b.state || !d.nodes.is_empty() || d.kube.is_some() || d.budget.is_some() {
                steps.push(d);
            }
        }
        Some(JobDelta {
            state: next.state.clone(),
            generation: next.generation,
            snapshot: next.snapshot.clone(),
            snapshot_attempts: next.snapshot_attempts,
            in_flight: next.in_flight.clone(),
            steps,
            gates: (prev.gates != next.gates).then(|| next.gates.clone()),
            hook_runs: next
                .hook_runs
                .iter()
                .filter(|(k, r)| prev.hook_runs.get(*k) != Some(*r))
                .map(|(k, r)| (k.clone(), r.clone()))
                .collect(),
            clock: (prev.clock != next.clock).then_some(next.clock),
        })
    }

    /// Apply the delta to `job` (the job as of the entry before). Refuses a delta that does not
    /// fit the job (a step or node it does not have).
    pub fn apply(&self, job: &mut Job) -> Result<(), String> {
        for d in &self.steps {
            let step = job
                .steps
                .get_mut(d.index)
                .ok_or_else(|| format!("the delta names step {} the job lacks", d.index))?;
            step.state = d.state;
            match &mut step.kind {
                StepKind::Talos(t) => {
                    if d.kube.is_some() {
                        return Err(format!("step {} is a Talos step", d.index));
                    }
                    if let Some(b) = &d.budget {
                        t.budget = Some(b.clone());
                    }
                    for (i, n) in &d.nodes {
                        let slot = t.nodes.get_mut(*i).ok_or_else(|| {
                            format!("the delta names node {i} of step {} it lacks", d.index)
                        })?;
                        *slot = n.clone();
                    }
                }
                StepKind::Kubernetes(k) => {
                    if !d.nodes.is_empty() || d.budget.is_some() {
                        return Err(format!("step {} is a Kubernetes step", d.index));
                    }
                    if let Some(kd) = &d.kube {
                        k.since = kd.since;
                        match &kd.tasks {
                            TasksDelta::Unchanged => {}
                            TasksDelta::Set { tasks } => k.tasks = tasks.clone(),
                            TasksDelta::Changed { tasks } => {
                                let KubeTasks::Planned(have) = &mut k.tasks else {
                                    return Err(format!("step {} has no tasks to change", d.index));
                                };
                                for (i, t) in tasks {
                                    let slot = have.get_mut(*i).ok_or_else(|| {
                                        format!(
                                            "the delta names task {i} of step {} it lacks",
                                            d.index
                                        )
                                    })?;
                                    *slot = t.clone();
                                }
                            }
                        }
                    }
                }
            }
        }
        job.state = self.state.clone();
        job.generation = self.generation;
        job.snapshot = self.snapshot.clone();
        job.snapshot_attempts = self.snapshot_attempts;
        job.in_flight = self.in_flight.clone();
        if let Some(g) = &self.gates {
            job.gates = g.clone();
        }
        for (site, run) in &self.hook_runs {
            job.hook_runs.insert(site.clone(), run.clone());
        }
        if let Some(c) = self.clock {
            job.clock = c;
        }
        Ok(())
    }
}

/// Fold the journal into `job` (its checkpoint): the delta of every entry after
/// `job.journal_seq`, in order, until `entry` finds none. `entry(key)` reads one journal entry
/// by its store key; this function only folds (the reading is the caller's:
/// `ops::jobs::load_job`, the executor).
pub fn replay(
    job: &mut Job,
    mut entry: impl FnMut(&str) -> Result<Option<JournalEntry>, StoreError>,
) -> Result<(), StoreError> {
    loop {
        let seq = job.journal_seq + 1;
        let key = entry_key(&job.id, seq);
        let Some(e) = entry(&key)? else {
            return Ok(());
        };
        let bad = |why: String| StoreError::Decode {
            table: Table::Journal.name(),
            key: key.clone(),
            kind: JournalEntry::KIND,
            err: why.into(),
        };
        if e.job != job.id || e.seq != seq {
            return Err(bad(format!(
                "the entry is {} seq {}, not {} seq {seq}",
                e.job, e.seq, job.id
            )));
        }
        let delta = e.delta.as_ref().ok_or_else(|| {
            bad("an entry after the job's checkpoint carries no change to replay".into())
        })?;
        delta.apply(job).map_err(bad)?;
        job.journal_seq = seq;
    }
}

/// Whether the transaction writing `entry` (moving the job to `job`) must be durable by itself.
///
/// An intent must be on disk before its call, and a halt or the end of a job before anyone
/// acts on it: these are fsync'd commits. A result or a progress entry is written to the
/// store's journal (visible to every reader at once, and surviving the death of the process)
/// without an fsync of its own. The store's journal is sequential, so the next durable commit
/// (at the latest the intent of the next call) makes it durable before anything else is
/// called. Losing it to a power failure is the same as crashing right before its commit: the
/// in-flight command is resolved by observing the node, which the crash harness covers at
/// every journal point.
pub fn needs_own_fsync(entry: &Entry, job: &Job) -> bool {
    match entry {
        Entry::Intent { .. } | Entry::HaltRequested { .. } | Entry::Created { .. } => true,
        Entry::Result { .. } | Entry::Progress | Entry::Gates { .. } => job.state.is_terminal(),
    }
}

/// The transaction that moves a job from `prev` (as stored: the checkpoint plus the journal up
/// to `prev.journal_seq`) to `next` and appends `entry`: the next journal entry must be absent
/// (nobody else advanced the job), the entry with its [`JobDelta`], the whole job when this is a
/// checkpoint, and the cluster's active marker removed when `next` is terminal. Returns the job
/// as written (its `journal_seq` advanced).
pub fn advance_txn(
    prev: &Job,
    next: &Job,
    entry: Entry,
    notes: Vec<String>,
    at: Timestamp,
) -> (Txn, Job) {
    let mut job = next.clone();
    job.journal_seq = prev.journal_seq + 1;
    let delta = JobDelta::between(prev, &job);
    let checkpoint = delta.is_none()
        || job.state.is_terminal()
        || job.journal_seq.is_multiple_of(CHECKPOINT_EVERY);
    let e = JournalEntry {
        job: job.id.clone(),
        seq: job.journal_seq,
        at,
        generation: job.generation,
        entry,
        notes,
        delta,
    };
    let mut txn = Txn::new()
        .check(Check::Absent(Table::Journal, entry_key(&job.id, e.seq)))
        .put_record(entry_key(&job.id, e.seq), &e);
    if checkpoint {
        txn = txn.put_record(job_key(&job.id), &job);
    }
    if job.state.is_terminal() {
        txn = txn.delete(Table::Jobs, active_key(&job.cluster));
    }
    // What the job applied becomes the last-applied state with its success, in the same
    // transaction (issue #32); a halted job writes none of it.
    if matches!(job.state, JobState::Succeeded { .. })
        && !matches!(prev.state, JobState::Succeeded { .. })
    {
        for r in &job.applies {
            txn.push(Op::Put(Table::Desired, r.key.store_key(), encode(r)));
        }
    }
    if !needs_own_fsync(&e.entry, &job) {
        txn = txn.buffered();
    }
    (txn, job)
}
