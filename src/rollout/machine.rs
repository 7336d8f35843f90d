//! The rollout state machine: pure functions from (job, fresh observations, now) to the next
//! job state and the next command. No I/O, no clock, no sleeping (see `design/rollout.md`).
//!
//! The executor loop is:
//! 1. [`step`] with the observations of [`needs`] (and of [`Transition::missing`], until it is
//!    empty) returns the new job and a [`Next`]: run a command, poll, wait until a time, or stop;
//! 2. for [`Next::Run`], [`intend`] marks the command in flight; the executor journals that job
//!    (the intent), calls the port, and records the [`Outcome`] with [`complete`];
//! 3. a job that still has a command in flight when [`step`] is called (a crash, or a transient
//!    outcome) gets it *resolved by observation*: the node is observed and the command is either
//!    taken as done, re-issued with the next attempt, waited for, or the job halts. An Upgrade is
//!    re-issued only when the node proves the first call left no trace.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::ports::{
    ANNOTATION_CONFIG_VERSION, Component, ComponentArgs, ComponentImages, DrainOutcome, EtcdHealth,
    ImageNamespace, KubeNode, MachineStage, NextBoot, NodeTarget, SnapshotInfo, StaticPod,
    TalosNode, UpgradeMethod,
};
use super::removed::{RemovedSetting, removed_settings};
use crate::desired::window::{MaintenanceWindow, open_at};
use crate::inventory::MachineRole;
use crate::plan::{DrainPolicy, KubeRollout, MachineTarget, PlanId, TalosRollout};
use crate::version::KubeVersion;

/// How long a drain that came back blocked waits before it is tried again (within the drain
/// timeout).
pub const DRAIN_RETRY: Duration = Duration::from_secs(10);

/// The id of a job: `<plan short id>-<cluster>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(String);

impl JobId {
    pub fn for_plan(plan: &PlanId, cluster: &str) -> JobId {
        JobId(format!("{}-{cluster}", plan.short()))
    }
    /// A job id as typed by an operator; must be non-empty and free of `/` and whitespace.
    pub fn parse(input: &str) -> Option<JobId> {
        let ok = !input.is_empty()
            && input
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        ok.then(|| JobId(input.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A maintenance window as recorded in the job (from the cluster's desired state at creation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowSpec {
    pub start: String,
    pub duration_secs: u64,
    pub time_zone: String,
}

impl WindowSpec {
    pub fn of(w: &MaintenanceWindow) -> WindowSpec {
        WindowSpec {
            start: w.start().to_string(),
            duration_secs: w.duration().as_secs(),
            time_zone: w.time_zone().to_string(),
        }
    }
}

/// A rollout job: one cluster's steps of an approved plan, with per-node progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Job {
    pub id: JobId,
    pub plan: PlanId,
    pub cluster: String,
    #[serde(with = "ts")]
    pub created_at: Timestamp,
    /// Node starts are gated on these (none = always open).
    pub windows: Vec<WindowSpec>,
    /// The cluster's control-plane machines at creation: etcd checks and the snapshot go
    /// through them.
    pub control_plane: Vec<NodeTarget>,
    pub steps: Vec<JobStep>,
    pub state: JobState,
    /// Bumped on every change of the job (omicron-style generation).
    pub generation: u64,
    /// The etcd snapshot taken before the first control-plane change of this job.
    pub snapshot: Option<SnapshotInfo>,
    /// Attempts of the snapshot command so far.
    #[serde(default)]
    pub snapshot_attempts: u32,
    /// The journaled command whose outcome is not recorded yet.
    pub in_flight: Option<Intent>,
    /// Sequence number of the last journal entry of this job (maintained by the executor).
    pub journal_seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum JobState {
    Running,
    /// Stopped for good: continuing needs a new plan and a new approval.
    Halted {
        reason: String,
        /// Index of the step that was running.
        step: Option<usize>,
        node: Option<String>,
        op: Option<Op>,
        #[serde(with = "ts")]
        at: Timestamp,
    },
    Succeeded {
        #[serde(with = "ts")]
        at: Timestamp,
    },
}

impl JobState {
    pub fn is_terminal(&self) -> bool {
        !matches!(self, JobState::Running)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StepState {
    Pending,
    Running,
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobStep {
    pub state: StepState,
    pub kind: StepKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum StepKind {
    Talos(TalosStep),
    Kubernetes(KubeStep),
}

impl JobStep {
    /// The pool of a Talos step.
    pub fn pool(&self) -> Option<&str> {
        match &self.kind {
            StepKind::Talos(t) => Some(&t.rollout.pool),
            StepKind::Kubernetes(_) => None,
        }
    }
}

/// A Talos OS rollout of one pool, one hop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TalosStep {
    /// The plan's step, immutable for the job's life: shared, so that the transition of
    /// every command does not copy every wave's targets (serialized as the plain value).
    pub rollout: Arc<TalosRollout>,
    /// Every machine of the rollout, wave by wave, in plan order.
    /// Shared per node and copied on write ([`Arc::make_mut`]): a transition copies only the
    /// nodes it changes, and comparing two jobs skips the nodes they share.
    pub nodes: Vec<Arc<NodeProgress>>,
}

impl TalosStep {
    pub fn new(rollout: TalosRollout) -> TalosStep {
        let nodes = rollout
            .waves
            .iter()
            .enumerate()
            .flat_map(|(w, wave)| {
                wave.iter()
                    .map(move |t| Arc::new(NodeProgress::new(Arc::new(t.clone()), w)))
            })
            .collect();
        TalosStep {
            rollout: Arc::new(rollout),
            nodes,
        }
    }
    fn control_plane(&self) -> bool {
        self.rollout.role == MachineRole::Controlplane
    }
    /// Nodes that may be away at once: `maxUnavailable`, and always 1 for the control plane.
    pub fn capacity(&self) -> usize {
        if self.control_plane() {
            1
        } else {
            self.rollout.max_unavailable.max(1) as usize
        }
    }
}

/// Where one machine is in its Talos rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodePhase {
    /// Not started.
    Pending,
    /// Started (window was open): checking version, reachability and etcd.
    Checking,
    /// Checks passed; the pre-pull is next.
    Checked,
    Pulled,
    Cordoned,
    Drained,
    /// Installed (lifecycle path), not rebooted yet.
    Upgraded,
    /// Rebooted (or legacy upgrade accepted); waiting for the node to come back right.
    Rebooting,
    /// Back on the target, healthy and Ready; uncordon is next.
    Back,
    Done,
    /// Already ran the target when its turn came.
    Skipped,
}

impl NodePhase {
    pub fn finished(self) -> bool {
        matches!(self, NodePhase::Done | NodePhase::Skipped)
    }
    /// Cordoned or down: counts against `maxUnavailable`.
    pub fn away(self) -> bool {
        matches!(
            self,
            NodePhase::Cordoned
                | NodePhase::Drained
                | NodePhase::Upgraded
                | NodePhase::Rebooting
                | NodePhase::Back
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeProgress {
    /// Immutable for the job's life; shared like [`TalosStep::rollout`].
    pub target: Arc<MachineTarget>,
    pub wave: usize,
    pub phase: NodePhase,
    /// When the current phase began (timeouts count from here).
    #[serde(with = "ts_opt")]
    pub since: Option<Timestamp>,
    /// Attempts of the current phase's command so far.
    pub attempt: u32,
    /// Boot id before the upgrade/reboot (what "came back" is compared with).
    pub boot_id_before: Option<String>,
    /// Kubelet version before the rollout (the node must come back with it).
    pub kubelet_before: Option<KubeVersion>,
    pub method: Option<UpgradeMethod>,
    /// Do not retry the current command before this time (blocked drain).
    #[serde(with = "ts_opt")]
    pub not_before: Option<Timestamp>,
    /// The last drain refusal.
    pub blocked: Option<String>,
    /// Why the last Upgrade attempt of this node did not take (its definitive failure, or the
    /// transport error of a call the node shows no trace of).
    #[serde(default)]
    pub last_error: Option<String>,
    /// Upgrade calls of this node that the node answered with a definitive failure (bounded by
    /// `rollout.upgradeAttempts`).
    #[serde(default)]
    pub upgrade_failures: u32,
}

impl NodeProgress {
    fn new(target: Arc<MachineTarget>, wave: usize) -> NodeProgress {
        NodeProgress {
            target,
            wave,
            phase: NodePhase::Pending,
            since: None,
            attempt: 0,
            boot_id_before: None,
            kubelet_before: None,
            method: None,
            not_before: None,
            blocked: None,
            last_error: None,
            upgrade_failures: 0,
        }
    }
    pub fn node_target(&self) -> NodeTarget {
        NodeTarget {
            node: self.target.node.clone(),
            address: self.target.address.clone(),
        }
    }
    fn enter(&mut self, phase: NodePhase, now: Timestamp) {
        self.phase = phase;
        self.since = Some(now);
        self.attempt = 0;
        self.not_before = None;
    }
}

/// The Kubernetes rollout of a cluster (the upgrade-k8s sequence).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeStep {
    pub rollout: KubeRollout,
    pub control_plane: Vec<NodeTarget>,
    pub workers: Vec<NodeTarget>,
    /// When the pre-checks began.
    #[serde(with = "ts_opt")]
    pub since: Option<Timestamp>,
    /// Built when the pre-checks pass; `None` before.
    pub tasks: Option<Vec<KubeTask>>,
    /// Some node runs Talos < 1.13 (decided by the pre-checks): the manifests are synced the
    /// legacy way, as `upgrade-k8s` decides from the lowest Talos version.
    #[serde(default)]
    pub manifests_legacy: bool,
}

impl KubeStep {
    pub fn new(
        rollout: KubeRollout,
        control_plane: Vec<NodeTarget>,
        workers: Vec<NodeTarget>,
    ) -> KubeStep {
        KubeStep {
            rollout,
            control_plane,
            workers,
            since: None,
            tasks: None,
            manifests_legacy: false,
        }
    }
    fn all_nodes(&self) -> impl Iterator<Item = &NodeTarget> {
        self.control_plane.iter().chain(self.workers.iter())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KubeOp {
    /// Pre-pull the component image.
    Pull,
    /// Set the component image in the machine config (`NO_REBOOT`) and wait for it.
    Patch,
    /// Server-side apply of the bootstrap manifests.
    Manifests,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskState {
    Pending,
    /// Patched; waiting for the component to run the new image.
    Applied,
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeTask {
    pub op: KubeOp,
    pub node: NodeTarget,
    pub component: Option<Component>,
    /// Target image (empty for manifests).
    pub image: String,
    pub state: TaskState,
    #[serde(with = "ts_opt")]
    pub since: Option<Timestamp>,
    pub attempt: u32,
    /// The component config version (`talos.dev/config-version`) its mirror pod was verified
    /// at; `None` before, for other tasks, and when the pod carried no such annotation.
    #[serde(default)]
    pub config_version: Option<String>,
}

/// The kinds of command; part of every idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    Snapshot,
    Pull,
    Cordon,
    Drain,
    Upgrade,
    Reboot,
    Uncordon,
    SetImage,
    ApplyManifests,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Snapshot => "etcd-snapshot",
            Op::Pull => "pull",
            Op::Cordon => "cordon",
            Op::Drain => "drain",
            Op::Upgrade => "upgrade",
            Op::Reboot => "reboot",
            Op::Uncordon => "uncordon",
            Op::SetImage => "set-image",
            Op::ApplyManifests => "apply-manifests",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The idempotency key of a command: (job, step, node, op, attempt).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CommandKey {
    pub job: JobId,
    pub step: usize,
    pub node: Option<String>,
    pub op: Op,
    /// 1 for the first call, +1 for each re-issue.
    pub attempt: u32,
}

impl fmt::Display for CommandKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}/{}",
            self.job,
            self.step,
            self.node.as_deref().unwrap_or("-"),
            self.op,
            self.attempt
        )
    }
}

/// What a command does (every command changes something and is journaled first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "op")]
pub enum Action {
    /// Save an etcd snapshot through `via` into the job's snapshot file.
    Snapshot {
        via: NodeTarget,
    },
    Pull {
        node: NodeTarget,
        image: String,
        namespace: ImageNamespace,
    },
    Cordon {
        node: String,
    },
    Drain {
        node: String,
        timeout_secs: u64,
        /// Which pods are evicted. Journals written before the field existed read as
        /// [`DrainPolicy::legacy`], what those drains did.
        #[serde(default = "DrainPolicy::legacy")]
        policy: DrainPolicy,
    },
    Upgrade {
        node: NodeTarget,
        image: String,
        method: UpgradeMethod,
        /// Boot id observed right before the call.
        boot_id_before: String,
    },
    Reboot {
        node: NodeTarget,
        boot_id_before: String,
    },
    Uncordon {
        node: String,
    },
    SetImage {
        node: NodeTarget,
        component: Component,
        image: String,
    },
    ApplyManifests {
        via: NodeTarget,
        /// A node runs Talos < 1.13: the legacy sync (no server-side apply, no inventory).
        #[serde(default)]
        legacy: bool,
    },
}

impl Action {
    pub fn op(&self) -> Op {
        match self {
            Action::Snapshot { .. } => Op::Snapshot,
            Action::Pull { .. } => Op::Pull,
            Action::Cordon { .. } => Op::Cordon,
            Action::Drain { .. } => Op::Drain,
            Action::Upgrade { .. } => Op::Upgrade,
            Action::Reboot { .. } => Op::Reboot,
            Action::Uncordon { .. } => Op::Uncordon,
            Action::SetImage { .. } => Op::SetImage,
            Action::ApplyManifests { .. } => Op::ApplyManifests,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    pub key: CommandKey,
    pub action: Action,
}

/// A command journaled as intended whose outcome is not recorded yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Intent {
    pub key: CommandKey,
    pub action: Action,
    #[serde(with = "ts")]
    pub issued_at: Timestamp,
    /// Set when the call came back transient: its effect is unknown until observed.
    pub last_error: Option<String>,
}

/// The outcome of one command, as recorded in the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "outcome")]
pub enum Outcome {
    Done,
    Snapshot {
        info: SnapshotInfo,
    },
    Drain {
        result: DrainOutcome,
    },
    /// The call may or may not have taken effect (UNAVAILABLE, connection lost).
    Transient {
        error: String,
    },
    /// The call failed definitely: the job halts.
    Failed {
        error: String,
    },
}

/// An observation that could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObsError {
    /// Worth waiting out (node rebooting, API away).
    pub transient: bool,
    pub message: String,
}

pub type Obs<T> = Result<T, ObsError>;

/// Fresh observations, keyed like [`Needs`].
#[derive(Debug, Clone, Default)]
pub struct Observations {
    pub talos: BTreeMap<String, Obs<TalosNode>>,
    pub kube: BTreeMap<String, Obs<KubeNode>>,
    pub etcd: Option<Obs<EtcdHealth>>,
    pub images: BTreeMap<String, Obs<ComponentImages>>,
    /// Component flags from the machine configuration, by node.
    pub args: BTreeMap<String, Obs<ComponentArgs>>,
    pub static_pods: BTreeMap<(String, Component), Obs<Option<StaticPod>>>,
    /// The version of a static-pod component's config resource on a node (`None`: the node
    /// publishes none).
    pub config_versions: BTreeMap<(String, Component), Obs<Option<String>>>,
    /// The job's snapshot file, if it exists.
    pub snapshot: Option<Obs<Option<SnapshotInfo>>>,
}

impl Observations {
    /// Add `other`'s entries (a later round of the same instant).
    pub fn merge(&mut self, other: Observations) {
        self.talos.extend(other.talos);
        self.kube.extend(other.kube);
        if other.etcd.is_some() {
            self.etcd = other.etcd;
        }
        self.images.extend(other.images);
        self.args.extend(other.args);
        self.static_pods.extend(other.static_pods);
        self.config_versions.extend(other.config_versions);
        if other.snapshot.is_some() {
            self.snapshot = other.snapshot;
        }
    }
}

/// What a decision needs observed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    pub talos: BTreeSet<NodeTarget>,
    pub kube: BTreeSet<String>,
    /// etcd health, asked through these control-plane nodes.
    pub etcd: Option<Vec<NodeTarget>>,
    pub images: BTreeSet<NodeTarget>,
    pub args: BTreeSet<NodeTarget>,
    pub static_pods: BTreeSet<(String, Component)>,
    pub config_versions: BTreeSet<(NodeTarget, Component)>,
    pub snapshot: bool,
}

impl Needs {
    pub fn is_empty(&self) -> bool {
        self == &Needs::default()
    }
}

/// Why the machine wants to look again later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollWhy {
    /// Something is in progress (a reboot, a pod restart): poll at the normal interval.
    Waiting,
    /// Something could not be reached: back off.
    Unreachable,
}

/// What the executor should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Check the gates, journal the intent ([`intend`]), call, [`complete`].
    Run(Command),
    /// Observe again after a while.
    Poll { why: PollWhy, reason: String },
    /// Nothing may start before `at` (maintenance window).
    WaitUntil { at: Timestamp, reason: String },
    /// The job is terminal.
    Finished,
}

/// The result of [`step`].
#[derive(Debug, Clone)]
pub struct Transition {
    /// The new job; its generation moved iff anything changed.
    pub job: Job,
    pub next: Next,
    /// What changed, for the journal and the events.
    pub notes: Vec<String>,
    /// Observations the decision wanted but did not get: observe them and call [`step`]
    /// again with the merged observations (same `now`).
    pub missing: Needs,
}

impl Transition {
    pub fn changed(&self, before: &Job) -> bool {
        self.job.generation != before.generation
    }
}

/// What the next [`step`] needs observed (the first round).
pub fn needs(job: &Job, now: Timestamp) -> Needs {
    step(job, &Observations::default(), now).missing
}

/// Decide: resolve a dangling intent, advance every step and node the observations allow, and
/// pick the next command.
pub fn step(job: &Job, obs: &Observations, now: Timestamp) -> Transition {
    let eyes = Eyes {
        obs,
        missing: RefCell::new(Needs::default()),
    };
    let mut j = job.clone();
    let mut notes = Vec::new();
    let next = drive(&mut j, &eyes, now, &mut notes);
    bump(job, &mut j);
    Transition {
        job: j,
        next,
        notes,
        missing: eyes.missing.into_inner(),
    }
}

/// Mark `cmd` in flight: the job to journal, durably, before the call.
pub fn intend(job: &Job, cmd: &Command, now: Timestamp) -> Job {
    let mut j = job.clone();
    j.in_flight = Some(Intent {
        key: cmd.key.clone(),
        action: cmd.action.clone(),
        issued_at: now,
        last_error: None,
    });
    bump(job, &mut j);
    j
}

/// Record the outcome of the command in flight. A key that is not in flight changes nothing.
pub fn complete(
    job: &Job,
    key: &CommandKey,
    outcome: &Outcome,
    now: Timestamp,
) -> (Job, Vec<String>) {
    let mut j = job.clone();
    let mut notes = Vec::new();
    match j.in_flight.clone() {
        Some(intent) if &intent.key == key && !j.state.is_terminal() => {
            apply(&mut j, &intent, outcome, false, now, &mut notes);
        }
        _ => notes.push(format!("ignored an outcome for {key}: not in flight")),
    }
    bump(job, &mut j);
    (j, notes)
}

/// Halt the job (operator request or executor decision). A terminal job is left as it is.
pub fn halt(job: &Job, reason: impl Into<String>, now: Timestamp) -> Job {
    let mut j = job.clone();
    if !j.state.is_terminal() {
        let (step, node, op) = match &j.in_flight {
            Some(i) => (Some(i.key.step), i.key.node.clone(), Some(i.key.op)),
            None => (current_step(&j), None, None),
        };
        j.state = JobState::Halted {
            reason: reason.into(),
            step,
            node,
            op,
            at: now,
        };
    }
    bump(job, &mut j);
    j
}

/// Index of the first step that is not done.
pub fn current_step(job: &Job) -> Option<usize> {
    job.steps.iter().position(|s| s.state != StepState::Done)
}

fn bump(before: &Job, after: &mut Job) {
    after.generation = before.generation;
    if after != before {
        after.generation = before.generation + 1;
    }
}

// ---------------------------------------------------------------------------------------------
// observations

struct Eyes<'a> {
    obs: &'a Observations,
    missing: RefCell<Needs>,
}

enum Seen<'a, T> {
    Missing,
    Transient(&'a str),
    Failed(&'a str),
    Got(&'a T),
}

fn seen<T>(o: Option<&Obs<T>>) -> Seen<'_, T> {
    match o {
        None => Seen::Missing,
        Some(Ok(t)) => Seen::Got(t),
        Some(Err(e)) if e.transient => Seen::Transient(&e.message),
        Some(Err(e)) => Seen::Failed(&e.message),
    }
}

impl<'a> Eyes<'a> {
    fn talos(&self, t: &NodeTarget) -> Seen<'a, TalosNode> {
        let s = seen(self.obs.talos.get(&t.node));
        if matches!(s, Seen::Missing) {
            self.missing.borrow_mut().talos.insert(t.clone());
        }
        s
    }
    fn kube(&self, node: &str) -> Seen<'a, KubeNode> {
        let s = seen(self.obs.kube.get(node));
        if matches!(s, Seen::Missing) {
            self.missing.borrow_mut().kube.insert(node.to_string());
        }
        s
    }
    fn etcd(&self, via: &[NodeTarget]) -> Seen<'a, EtcdHealth> {
        let s = seen(self.obs.etcd.as_ref());
        if matches!(s, Seen::Missing) {
            self.missing.borrow_mut().etcd = Some(via.to_vec());
        }
        s
    }
    fn images(&self, t: &NodeTarget) -> Seen<'a, ComponentImages> {
        let s = seen(self.obs.images.get(&t.node));
        if matches!(s, Seen::Missing) {
            self.missing.borrow_mut().images.insert(t.clone());
        }
        s
    }
    fn args(&self, t: &NodeTarget) -> Seen<'a, ComponentArgs> {
        let s = seen(self.obs.args.get(&t.node));
        if matches!(s, Seen::Missing) {
            self.missing.borrow_mut().args.insert(t.clone());
        }
        s
    }
    fn static_pod(&self, node: &str, c: Component) -> Seen<'a, Option<StaticPod>> {
        let key = (node.to_string(), c);
        let s = seen(self.obs.static_pods.get(&key));
        if matches!(s, Seen::Missing) {
            self.missing.borrow_mut().static_pods.insert(key);
        }
        s
    }
    fn config_version(&self, t: &NodeTarget, c: Component) -> Seen<'a, Option<String>> {
        let s = seen(self.obs.config_versions.get(&(t.node.clone(), c)));
        if matches!(s, Seen::Missing) {
            self.missing
                .borrow_mut()
                .config_versions
                .insert((t.clone(), c));
        }
        s
    }
    fn snapshot(&self) -> Seen<'a, Option<SnapshotInfo>> {
        let s = seen(self.obs.snapshot.as_ref());
        if matches!(s, Seen::Missing) {
            self.missing.borrow_mut().snapshot = true;
        }
        s
    }
}

// ---------------------------------------------------------------------------------------------
// driving

/// What one node, task or step wants.
enum Flow {
    Run(Box<Command>),
    Poll(PollWhy, String),
    Wait(Timestamp, String),
    Halt {
        reason: String,
        node: Option<String>,
        op: Option<Op>,
    },
    /// Nothing left to do here.
    Done,
}

fn halt_flow(reason: String, node: Option<&str>, op: Option<Op>) -> Flow {
    Flow::Halt {
        reason,
        node: node.map(str::to_string),
        op,
    }
}

fn add(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(d).unwrap_or(Timestamp::MAX)
}

/// An observation that must be present to go on; otherwise the flow to return.
fn need<'a, T>(
    s: Seen<'a, T>,
    what: &str,
    deadline: Timestamp,
    now: Timestamp,
    node: Option<&str>,
) -> Result<&'a T, Flow> {
    match s {
        Seen::Got(t) => Ok(t),
        Seen::Missing => Err(Flow::Poll(PollWhy::Waiting, format!("observing {what}"))),
        Seen::Transient(m) if now >= deadline => Err(halt_flow(
            format!("{what} stayed unreachable until the timeout ({m})"),
            node,
            None,
        )),
        Seen::Transient(m) => Err(Flow::Poll(
            PollWhy::Unreachable,
            format!("{what} unreachable ({m})"),
        )),
        Seen::Failed(m) => Err(halt_flow(format!("reading {what} failed: {m}"), node, None)),
    }
}

fn drive(j: &mut Job, eyes: &Eyes, now: Timestamp, notes: &mut Vec<String>) -> Next {
    if j.state.is_terminal() {
        return Next::Finished;
    }
    if let Some(intent) = j.in_flight.clone() {
        match resolve(j, &intent, eyes, now) {
            Resolution::Done { outcome, rebooted } => {
                notes.push(format!(
                    "{}: resolved by observation: it took effect",
                    intent.key
                ));
                apply(j, &intent, &outcome, rebooted, now, notes);
                if j.state.is_terminal() {
                    return Next::Finished;
                }
            }
            Resolution::Reissue => {
                notes.push(format!(
                    "{}: resolved by observation: no effect, issuing it again",
                    intent.key
                ));
                j.in_flight = None;
                if intent.key.op == Op::Upgrade {
                    record_upgrade_error(
                        j,
                        &intent.key,
                        intent
                            .last_error
                            .clone()
                            .unwrap_or_else(|| "its outcome was lost".into()),
                        false,
                    );
                }
                bump_attempt(j, &intent.key);
            }
            Resolution::Pending(why, reason) => {
                let deadline = add(intent.issued_at, step_timeout(j, intent.key.step));
                if now >= deadline {
                    let reason = format!(
                        "could not determine the outcome of {} on {} before the timeout: {reason}",
                        intent.key.op,
                        intent.key.node.as_deref().unwrap_or("the cluster")
                    );
                    notes.push(reason.clone());
                    *j = halt(j, reason, now);
                    return Next::Finished;
                }
                return Next::Poll { why, reason };
            }
            Resolution::Halt(reason) => {
                notes.push(reason.clone());
                *j = halt(j, reason, now);
                return Next::Finished;
            }
        }
    }
    loop {
        let Some(si) = current_step(j) else {
            j.state = JobState::Succeeded { at: now };
            notes.push("job succeeded".into());
            return Next::Finished;
        };
        if j.steps[si].state == StepState::Pending {
            j.steps[si].state = StepState::Running;
            notes.push(format!("step {si} started"));
        }
        let flow = match j.steps[si].kind.clone() {
            StepKind::Talos(_) => talos_step(j, si, eyes, now, notes),
            StepKind::Kubernetes(_) => kube_step(j, si, eyes, now, notes),
        };
        match flow {
            Flow::Done => {
                j.steps[si].state = StepState::Done;
                notes.push(format!("step {si} done"));
            }
            Flow::Run(cmd) => return Next::Run(*cmd),
            Flow::Poll(why, reason) => return Next::Poll { why, reason },
            Flow::Wait(at, reason) => return Next::WaitUntil { at, reason },
            Flow::Halt { reason, node, op } => {
                notes.push(format!("halted: {reason}"));
                j.state = JobState::Halted {
                    reason,
                    step: Some(si),
                    node,
                    op,
                    at: now,
                };
                return Next::Finished;
            }
        }
    }
}

fn step_timeout(j: &Job, si: usize) -> Duration {
    match j.steps.get(si).map(|s| &s.kind) {
        Some(StepKind::Talos(t)) => t.rollout.health_timeout,
        Some(StepKind::Kubernetes(k)) => k.rollout.health_timeout,
        None => Duration::from_secs(15 * 60),
    }
}

/// Whether a node may start now; otherwise the flow to return (wait for the window).
fn window_gate(j: &Job, now: Timestamp) -> Result<(), Flow> {
    if j.windows.is_empty() {
        return Ok(());
    }
    let mut windows = Vec::new();
    for w in &j.windows {
        match MaintenanceWindow::new(&w.start, Duration::from_secs(w.duration_secs), &w.time_zone) {
            Ok(w) => windows.push(w),
            Err(e) => {
                return Err(halt_flow(
                    format!("the job's maintenance window `{}` is invalid: {e}", w.start),
                    None,
                    None,
                ));
            }
        }
    }
    if open_at(&windows, now) {
        return Ok(());
    }
    match windows.iter().filter_map(|w| w.next_start(now)).min() {
        Some(at) => Err(Flow::Wait(
            at,
            format!("outside the maintenance windows; the next opens at {at}"),
        )),
        None => Err(halt_flow(
            "outside the maintenance windows, and none opens again".into(),
            None,
            None,
        )),
    }
}

fn key(j: &Job, si: usize, node: Option<&str>, op: Op, attempt: u32) -> CommandKey {
    CommandKey {
        job: j.id.clone(),
        step: si,
        node: node.map(str::to_string),
        op,
        attempt: attempt + 1,
    }
}

fn snapshot_command(j: &Job, si: usize, via: NodeTarget) -> Command {
    Command {
        key: key(j, si, None, Op::Snapshot, j.snapshot_attempts),
        action: Action::Snapshot { via },
    }
}

/// etcd is healthy and losing one member keeps quorum.
pub fn etcd_verdict(h: &EtcdHealth) -> Result<(), String> {
    if h.members.is_empty() {
        return Err("etcd reports no members".into());
    }
    if !h.alarms.is_empty() {
        return Err(format!("etcd alarms are active: {}", h.alarms.join(", ")));
    }
    if let Some(m) = h.members.iter().find(|m| m.learner) {
        return Err(format!("etcd member `{}` is still a learner", m.name));
    }
    if let Some(m) = h
        .members
        .iter()
        .find(|m| !m.healthy || !m.errors.is_empty())
    {
        let detail = if m.errors.is_empty() {
            "not answering".to_string()
        } else {
            m.errors.join("; ")
        };
        return Err(format!("etcd member `{}` is unhealthy: {detail}", m.name));
    }
    if h.members.len() == 2 {
        return Err(
            "etcd has 2 members: taking one away loses quorum (add a third control-plane node)"
                .into(),
        );
    }
    Ok(())
}

fn talos_step(
    j: &mut Job,
    si: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Flow {
    let StepKind::Talos(ts) = &j.steps[si].kind else {
        unreachable!("talos_step on a Talos step")
    };
    let Some(wave) = ts
        .nodes
        .iter()
        .filter(|n| !n.phase.finished())
        .map(|n| n.wave)
        .min()
    else {
        return Flow::Done;
    };
    let members: Vec<usize> = (0..ts.nodes.len())
        .filter(|&i| ts.nodes[i].wave == wave && !ts.nodes[i].phase.finished())
        .collect();
    let mut runs: Vec<(NodePhase, usize, Box<Command>)> = Vec::new();
    let mut polls: Vec<(PollWhy, String)> = Vec::new();
    let mut waits: Vec<(Timestamp, String)> = Vec::new();
    for i in members {
        match talos_node(j, si, i, eyes, now, notes) {
            Flow::Run(cmd) => {
                let phase = talos_of(j, si).nodes[i].phase;
                runs.push((phase, i, cmd));
            }
            Flow::Poll(w, r) => polls.push((w, r)),
            Flow::Wait(at, r) => waits.push((at, r)),
            h @ Flow::Halt { .. } => return h,
            Flow::Done => {}
        }
    }
    // Lockstep inside a wave: the node furthest behind goes first, so the wave's nodes are
    // away together rather than one after another.
    if let Some((_, _, cmd)) = runs.into_iter().min_by_key(|(p, i, _)| (*p, *i)) {
        return Flow::Run(cmd);
    }
    if let Some((w, r)) = polls
        .iter()
        .find(|(w, _)| *w == PollWhy::Unreachable)
        .or(polls.first())
        .cloned()
    {
        return Flow::Poll(w, r);
    }
    if let Some((at, r)) = waits.into_iter().min_by_key(|(at, _)| *at) {
        return Flow::Wait(at, r);
    }
    // every node of the wave finished in this pass: look at the next wave
    if talos_of(j, si).nodes.iter().all(|n| n.phase.finished()) {
        return Flow::Done;
    }
    talos_step(j, si, eyes, now, notes)
}

fn talos_of(j: &Job, si: usize) -> &TalosStep {
    match &j.steps[si].kind {
        StepKind::Talos(t) => t,
        StepKind::Kubernetes(_) => unreachable!("step {si} is a Talos step"),
    }
}

/// Node `i` of Talos step `si`, for writing (copied first if another job shares it).
fn node_mut(j: &mut Job, si: usize, i: usize) -> &mut NodeProgress {
    Arc::make_mut(&mut talos_mut(j, si).nodes[i])
}

fn talos_mut(j: &mut Job, si: usize) -> &mut TalosStep {
    match &mut j.steps[si].kind {
        StepKind::Talos(t) => t,
        StepKind::Kubernetes(_) => unreachable!("step {si} is a Talos step"),
    }
}

fn talos_node(
    j: &mut Job,
    si: usize,
    i: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Flow {
    loop {
        let ts = talos_of(j, si);
        let spec = &ts.rollout;
        let n = &ts.nodes[i];
        let name = n.target.node.clone();
        let target = n.node_target();
        let cp = ts.control_plane();
        let since = n.since.unwrap_or(now);
        let health_deadline = add(since, spec.health_timeout);
        let to = spec.to.clone();
        let from = n.target.from.clone();
        let nd = Some(name.as_str());
        match n.phase {
            NodePhase::Pending => {
                if let Err(flow) = window_gate(j, now) {
                    return flow;
                }
                node_mut(j, si, i).enter(NodePhase::Checking, now);
                notes.push(format!("{name}: started"));
            }
            NodePhase::Checking => {
                let t = match need(
                    eyes.talos(&target),
                    &format!("node `{name}`"),
                    health_deadline,
                    now,
                    nd,
                ) {
                    Ok(t) => t,
                    Err(f) => return f,
                };
                if t.version == to {
                    node_mut(j, si, i).enter(NodePhase::Skipped, now);
                    notes.push(format!("{name}: already runs {to}, skipped"));
                    return Flow::Done;
                }
                if t.version != from {
                    return halt_flow(
                        format!(
                            "node `{name}` runs {}, but the plan expected {from}: something else changed it; plan again",
                            t.version
                        ),
                        nd,
                        None,
                    );
                }
                let k = match need(
                    eyes.kube(&name),
                    &format!("Kubernetes node `{name}`"),
                    health_deadline,
                    now,
                    nd,
                ) {
                    Ok(k) => k,
                    Err(f) => return f,
                };
                if cp {
                    let via = j.control_plane.clone();
                    let e = match need(eyes.etcd(&via), "etcd", health_deadline, now, nd) {
                        Ok(e) => e,
                        Err(f) => return f,
                    };
                    if let Err(why) = etcd_verdict(e) {
                        if now >= health_deadline {
                            return halt_flow(
                                format!(
                                    "etcd did not become healthy before node `{name}` could start: {why}"
                                ),
                                nd,
                                None,
                            );
                        }
                        return Flow::Poll(PollWhy::Waiting, why);
                    }
                }
                let method = UpgradeMethod::for_version(&t.version);
                let boot = t.boot_id.clone();
                let kubelet = k.kubelet_version.clone();
                let n = node_mut(j, si, i);
                n.boot_id_before = Some(boot);
                n.kubelet_before = kubelet;
                n.method = Some(method);
                n.enter(NodePhase::Checked, now);
                notes.push(format!(
                    "{name}: checks passed (runs {from}, {method:?} upgrade)"
                ));
            }
            NodePhase::Checked => {
                if cp && j.snapshot.is_none() {
                    let Some(via) = j.control_plane.first().cloned() else {
                        return halt_flow(
                            "no control-plane node is known to take the etcd snapshot from".into(),
                            None,
                            Some(Op::Snapshot),
                        );
                    };
                    return Flow::Run(Box::new(snapshot_command(j, si, via)));
                }
                return Flow::Run(Box::new(Command {
                    key: key(j, si, nd, Op::Pull, n.attempt),
                    action: Action::Pull {
                        node: target,
                        image: spec.image.clone(),
                        namespace: ImageNamespace::System,
                    },
                }));
            }
            NodePhase::Pulled => {
                let away = ts.nodes.iter().filter(|n| n.phase.away()).count();
                if away >= ts.capacity() {
                    return Flow::Poll(
                        PollWhy::Waiting,
                        format!("{name}: waiting, {away} node(s) already away"),
                    );
                }
                return Flow::Run(Box::new(Command {
                    key: key(j, si, nd, Op::Cordon, n.attempt),
                    action: Action::Cordon { node: name },
                }));
            }
            NodePhase::Cordoned => {
                let deadline = add(since, spec.drain_timeout);
                if let Some(nb) = n.not_before
                    && nb > now
                {
                    return Flow::Wait(
                        nb,
                        format!(
                            "{name}: drain blocked ({}), retrying",
                            n.blocked.as_deref().unwrap_or("eviction refused")
                        ),
                    );
                }
                let left = deadline.duration_since(now);
                let timeout = left.as_secs().max(1) as u64;
                return Flow::Run(Box::new(Command {
                    key: key(j, si, nd, Op::Drain, n.attempt),
                    action: Action::Drain {
                        node: name,
                        timeout_secs: timeout,
                        policy: spec.drain.clone(),
                    },
                }));
            }
            NodePhase::Drained => {
                let t = match need(
                    eyes.talos(&target),
                    &format!("node `{name}`"),
                    health_deadline,
                    now,
                    nd,
                ) {
                    Ok(t) => t,
                    Err(f) => return f,
                };
                if t.version != from {
                    return halt_flow(
                        format!(
                            "node `{name}` runs {} before its upgrade, expected {from}",
                            t.version
                        ),
                        nd,
                        Some(Op::Upgrade),
                    );
                }
                if cp {
                    let via = j.control_plane.clone();
                    let e = match need(eyes.etcd(&via), "etcd", health_deadline, now, nd) {
                        Ok(e) => e,
                        Err(f) => return f,
                    };
                    if let Err(why) = etcd_verdict(e) {
                        if now >= health_deadline {
                            return halt_flow(
                                format!(
                                    "etcd did not become healthy before upgrading `{name}`: {why}"
                                ),
                                nd,
                                Some(Op::Upgrade),
                            );
                        }
                        return Flow::Poll(PollWhy::Waiting, why);
                    }
                }
                // A call whose reply was lost and that the node shows no trace of is made
                // again, but only within the health timeout from the drain (definitive failures
                // are bounded by `upgradeAttempts` in `apply`); see design/rollout.md, "one
                // Upgrade per node".
                if n.attempt > 0 && now >= health_deadline {
                    return halt_flow(
                        format!(
                            "upgrade of `{name}` to {to} could not be made within {}s ({} call(s) left no trace): {}",
                            spec.health_timeout.as_secs(),
                            n.attempt,
                            n.last_error.as_deref().unwrap_or("no error was reported")
                        ),
                        nd,
                        Some(Op::Upgrade),
                    );
                }
                let boot = t.boot_id.clone();
                let method = n
                    .method
                    .unwrap_or_else(|| UpgradeMethod::for_version(&t.version));
                let cmd = Command {
                    key: key(j, si, nd, Op::Upgrade, n.attempt),
                    action: Action::Upgrade {
                        node: target,
                        image: spec.image.clone(),
                        method,
                        boot_id_before: boot.clone(),
                    },
                };
                node_mut(j, si, i).boot_id_before = Some(boot);
                return Flow::Run(Box::new(cmd));
            }
            NodePhase::Upgraded => {
                let Some(boot) = n.boot_id_before.clone() else {
                    return halt_flow(
                        format!("node `{name}` has no recorded boot id before its reboot"),
                        nd,
                        Some(Op::Reboot),
                    );
                };
                return Flow::Run(Box::new(Command {
                    key: key(j, si, nd, Op::Reboot, n.attempt),
                    action: Action::Reboot {
                        node: target,
                        boot_id_before: boot,
                    },
                }));
            }
            NodePhase::Rebooting => {
                let what = format!("node `{name}` after its reboot");
                let t = match eyes.talos(&target) {
                    Seen::Got(t) => t,
                    Seen::Missing => {
                        return Flow::Poll(PollWhy::Waiting, format!("observing {what}"));
                    }
                    Seen::Transient(m) => {
                        if now >= health_deadline {
                            return halt_flow(
                                format!(
                                    "node `{name}` did not come back within {}s of its reboot ({m})",
                                    spec.health_timeout.as_secs()
                                ),
                                nd,
                                Some(Op::Reboot),
                            );
                        }
                        return Flow::Poll(PollWhy::Waiting, format!("{name}: rebooting ({m})"));
                    }
                    Seen::Failed(m) => {
                        return halt_flow(
                            format!("reading {what} failed: {m}"),
                            nd,
                            Some(Op::Reboot),
                        );
                    }
                };
                let before = n.boot_id_before.as_deref().unwrap_or("");
                let late = |what: String| {
                    if now >= health_deadline {
                        halt_flow(
                            format!(
                                "node `{name}` {what} within {}s of its reboot",
                                spec.health_timeout.as_secs()
                            ),
                            nd,
                            Some(Op::Reboot),
                        )
                    } else {
                        Flow::Poll(PollWhy::Waiting, format!("{name}: {what}"))
                    }
                };
                if t.boot_id == before {
                    return late("has not rebooted yet".into());
                }
                if t.version != to {
                    return halt_flow(
                        format!(
                            "node reverted: `{name}` came back on {} instead of {to} (the boot fell back to the previous version)",
                            t.version
                        ),
                        nd,
                        Some(Op::Reboot),
                    );
                }
                // back = MachineStatus stage `running` *and* ready (talosctl upgrade --wait:
                // `MachineReadyEventFn`), the boot id changed (above) and the target version
                // runs (above); services and the Kubernetes node are checked as well
                if t.stage != MachineStage::Running || !t.ready {
                    return late(format!(
                        "is {} and {}, not running and ready yet",
                        t.stage.name(),
                        if t.ready { "ready" } else { "not ready" }
                    ));
                }
                if !t.unhealthy_services.is_empty() {
                    return late(format!(
                        "services not healthy yet: {}",
                        t.unhealthy_services.join(", ")
                    ));
                }
                let k = match eyes.kube(&name) {
                    Seen::Got(k) => k,
                    Seen::Missing => {
                        return Flow::Poll(
                            PollWhy::Waiting,
                            format!("observing Kubernetes node `{name}`"),
                        );
                    }
                    Seen::Transient(m) => {
                        // the kube-apiserver may be away while a control-plane node reboots
                        return late(format!("Kubernetes API unreachable ({m})"));
                    }
                    Seen::Failed(m) => {
                        return halt_flow(
                            format!("reading Kubernetes node `{name}` failed: {m}"),
                            nd,
                            Some(Op::Reboot),
                        );
                    }
                };
                if !k.ready {
                    return late("is not Ready".into());
                }
                if let Some(expected) = &n.kubelet_before
                    && k.kubelet_version.as_ref() != Some(expected)
                {
                    return late(format!(
                        "reports kubelet {}, expected {expected}",
                        k.kubelet_version
                            .as_ref()
                            .map(|v| v.to_string())
                            .unwrap_or_else(|| "none".into())
                    ));
                }
                node_mut(j, si, i).enter(NodePhase::Back, now);
                notes.push(format!("{name}: back on {to}, healthy and Ready"));
            }
            NodePhase::Back => {
                return Flow::Run(Box::new(Command {
                    key: key(j, si, nd, Op::Uncordon, n.attempt),
                    action: Action::Uncordon { node: name },
                }));
            }
            NodePhase::Done | NodePhase::Skipped => return Flow::Done,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kubernetes

fn kube_of(j: &Job, si: usize) -> &KubeStep {
    match &j.steps[si].kind {
        StepKind::Kubernetes(k) => k,
        StepKind::Talos(_) => unreachable!("step {si} is a Kubernetes step"),
    }
}

fn kube_mut(j: &mut Job, si: usize) -> &mut KubeStep {
    match &mut j.steps[si].kind {
        StepKind::Kubernetes(k) => k,
        StepKind::Talos(_) => unreachable!("step {si} is a Kubernetes step"),
    }
}

/// `repo:tag` without a digest: (repository, tag).
pub fn split_image(image: &str) -> (&str, Option<&str>) {
    crate::image::name_and_tag(image)
}

/// The Kubernetes version of a component image and the kubelet flavour suffix (`-fat`).
pub fn image_version(image: &str) -> Option<(KubeVersion, &str)> {
    crate::image::kube_version_of_tag(split_image(image).1?)
}

/// The image of `component` for version `to`: same repository (and kubelet flavour) as
/// `current`, or the upstream default when the node names none.
pub fn target_image(component: Component, current: Option<&str>, to: &KubeVersion) -> String {
    match current {
        Some(cur) => {
            let (repo, _) = split_image(cur);
            let suffix = image_version(cur).map(|(_, s)| s).unwrap_or("");
            format!("{repo}:{to}{suffix}")
        }
        None => format!("{}:{to}", component.default_repository()),
    }
}

fn kube_step(j: &mut Job, si: usize, eyes: &Eyes, now: Timestamp, notes: &mut Vec<String>) -> Flow {
    if kube_of(j, si).since.is_none() {
        kube_mut(j, si).since = Some(now);
    }
    if kube_of(j, si).tasks.is_none() {
        match kube_prechecks(j, si, eyes, now) {
            Ok((tasks, note, legacy)) => {
                notes.push(note);
                let k = kube_mut(j, si);
                k.tasks = Some(tasks);
                k.manifests_legacy = legacy;
            }
            Err(flow) => return flow,
        }
    }
    if j.snapshot.is_none() {
        let ks = kube_of(j, si);
        let via = j
            .control_plane
            .first()
            .or(ks.control_plane.first())
            .cloned();
        let Some(via) = via else {
            return halt_flow(
                "no control-plane node is known to take the etcd snapshot from".into(),
                None,
                Some(Op::Snapshot),
            );
        };
        return Flow::Run(Box::new(snapshot_command(j, si, via)));
    }
    loop {
        let ks = kube_of(j, si);
        let tasks = ks.tasks.as_ref().expect("tasks built");
        let Some(ti) = tasks.iter().position(|t| t.state != TaskState::Done) else {
            return Flow::Done;
        };
        let t = &tasks[ti];
        let name = t.node.node.clone();
        let nd = Some(name.as_str());
        let to = ks.rollout.to.clone();
        let timeout = ks.rollout.health_timeout;
        match (t.op, t.state) {
            (KubeOp::Pull, _) => {
                let c = t.component.unwrap_or(Component::Kubelet);
                return Flow::Run(Box::new(Command {
                    key: key(j, si, nd, Op::Pull, t.attempt),
                    action: Action::Pull {
                        node: t.node.clone(),
                        image: t.image.clone(),
                        namespace: c.namespace(),
                    },
                }));
            }
            (KubeOp::Manifests, _) => {
                return Flow::Run(Box::new(Command {
                    key: key(j, si, None, Op::ApplyManifests, t.attempt),
                    action: Action::ApplyManifests {
                        via: t.node.clone(),
                        legacy: ks.manifests_legacy,
                    },
                }));
            }
            (KubeOp::Patch, TaskState::Pending) => {
                if let Err(flow) = window_gate(j, now) {
                    return flow;
                }
                let c = t.component.expect("patch tasks name a component");
                if Component::STATIC_PODS.contains(&c)
                    && let Err(flow) = control_plane_gate(j, si, ti, eyes, now, notes)
                {
                    return flow;
                }
                let t = &kube_of(j, si).tasks.as_ref().expect("tasks built")[ti];
                return Flow::Run(Box::new(Command {
                    key: key(j, si, nd, Op::SetImage, t.attempt),
                    action: Action::SetImage {
                        node: t.node.clone(),
                        component: c,
                        image: t.image.clone(),
                    },
                }));
            }
            (KubeOp::Patch, TaskState::Applied) => {
                let c = t.component.expect("patch tasks name a component");
                let since = t.since;
                if since.is_none() {
                    // verification of a component found at the target starts now
                    kube_mut(j, si).tasks.as_mut().expect("tasks")[ti].since = Some(now);
                }
                let t = &kube_of(j, si).tasks.as_ref().expect("tasks built")[ti];
                let deadline = add(since.unwrap_or(now), timeout);
                let late = |what: String| {
                    if now >= deadline {
                        halt_flow(
                            format!("{c} on `{name}` {what} within {}s", timeout.as_secs()),
                            nd,
                            Some(Op::SetImage),
                        )
                    } else {
                        Flow::Poll(PollWhy::Waiting, format!("{c} on `{name}`: {what}"))
                    }
                };
                let mut verified_at: Option<String> = None;
                let ok = match c {
                    Component::Kubelet => match eyes.kube(&name) {
                        Seen::Got(k) => {
                            if k.kubelet_version.as_ref() != Some(&to) {
                                return late(format!(
                                    "does not report {to} yet (reports {})",
                                    k.kubelet_version
                                        .as_ref()
                                        .map(|v| v.to_string())
                                        .unwrap_or_else(|| "none".into())
                                ));
                            }
                            if !k.ready {
                                return late("is not Ready".into());
                            }
                            true
                        }
                        Seen::Missing => {
                            return Flow::Poll(PollWhy::Waiting, format!("observing `{name}`"));
                        }
                        Seen::Transient(m) => {
                            return late(format!("Kubernetes API unreachable ({m})"));
                        }
                        Seen::Failed(m) => {
                            return halt_flow(
                                format!("reading Kubernetes node `{name}` failed: {m}"),
                                nd,
                                Some(Op::SetImage),
                            );
                        }
                    },
                    Component::Proxy => true,
                    _ => match eyes.static_pod(&name, c) {
                        Seen::Got(Some(p)) => {
                            if p.image != t.image {
                                return late(format!("still runs {}", p.image));
                            }
                            // the config version the node's Talos rendered the component from
                            // now, as `checkPodStatus` waits for it
                            let wanted = match eyes.config_version(&t.node, c) {
                                Seen::Got(v) => v.clone(),
                                Seen::Missing => {
                                    return Flow::Poll(
                                        PollWhy::Waiting,
                                        format!("observing the config version of {c} on `{name}`"),
                                    );
                                }
                                Seen::Transient(m) => {
                                    return late(format!(
                                        "config version cannot be read from Talos ({m})"
                                    ));
                                }
                                Seen::Failed(m) => {
                                    return halt_flow(
                                        format!(
                                            "reading the config version of {c} on `{name}` failed: {m}"
                                        ),
                                        nd,
                                        Some(Op::SetImage),
                                    );
                                }
                            };
                            if let (Some(w), Some(seen)) = (&wanted, &p.config_version)
                                && w != seen
                            {
                                return late(format!(
                                    "is not at config version {w} (its mirror pod shows {seen})"
                                ));
                            }
                            if !p.ready {
                                return late("is not Ready".into());
                            }
                            verified_at = match (&wanted, &p.config_version) {
                                (Some(w), Some(_)) => Some(w.clone()),
                                (_, None) => {
                                    notes.push(format!(
                                        "{c} on `{name}`: its mirror pod has no {ANNOTATION_CONFIG_VERSION} annotation; verified by image and Ready only"
                                    ));
                                    None
                                }
                                (None, Some(_)) => {
                                    notes.push(format!(
                                        "{c} on `{name}`: Talos publishes no config resource for it; verified by image and Ready only"
                                    ));
                                    None
                                }
                            };
                            true
                        }
                        Seen::Got(None) => return late("has no static pod".into()),
                        Seen::Missing => {
                            return Flow::Poll(
                                PollWhy::Waiting,
                                format!("observing {c} on `{name}`"),
                            );
                        }
                        Seen::Transient(m) => {
                            return late(format!("Kubernetes API unreachable ({m})"));
                        }
                        Seen::Failed(m) => {
                            return halt_flow(
                                format!("reading {c} on `{name}` failed: {m}"),
                                nd,
                                Some(Op::SetImage),
                            );
                        }
                    },
                };
                if ok {
                    let image = t.image.clone();
                    let tm = &mut kube_mut(j, si).tasks.as_mut().expect("tasks")[ti];
                    tm.state = TaskState::Done;
                    tm.since = Some(now);
                    match &verified_at {
                        Some(v) => {
                            notes.push(format!("{c} on `{name}` runs {image} (config version {v})"))
                        }
                        None => notes.push(format!("{c} on `{name}` runs {image}")),
                    }
                    tm.config_version = verified_at;
                }
            }
            (KubeOp::Patch, TaskState::Done) => unreachable!("skipped above"),
        }
    }
}

/// Before a control-plane component is patched, every control-plane static pod is Ready and
/// every control-plane kubelet service is healthy; otherwise poll until the step's health
/// timeout (counted from when the gate first found something wrong), then halt naming what is
/// unhealthy. An unreachable source is a failed check, never a pass.
fn control_plane_gate(
    j: &mut Job,
    si: usize,
    ti: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<(), Flow> {
    let ks = kube_of(j, si);
    let t = &ks.tasks.as_ref().expect("tasks built")[ti];
    let (name, c) = (t.node.node.clone(), t.component);
    let timeout = ks.rollout.health_timeout;
    let mut missing = false;
    let mut bad: Vec<String> = Vec::new();
    for n in &ks.control_plane {
        match eyes.talos(n) {
            Seen::Got(tn) => {
                if tn.unhealthy_services.iter().any(|s| s == "kubelet") {
                    bad.push(format!(
                        "the kubelet service on `{}` is not healthy",
                        n.node
                    ));
                }
            }
            Seen::Missing => missing = true,
            Seen::Transient(m) | Seen::Failed(m) => {
                bad.push(format!("node `{}` unreachable ({m})", n.node));
            }
        }
        for sp in Component::STATIC_PODS {
            match eyes.static_pod(&n.node, sp) {
                Seen::Got(Some(p)) if p.ready => {}
                Seen::Got(Some(p)) => {
                    bad.push(format!("{sp} on `{}` ({}) is not Ready", n.node, p.image));
                }
                Seen::Got(None) => bad.push(format!("{sp} on `{}` has no static pod", n.node)),
                Seen::Missing => missing = true,
                Seen::Transient(m) | Seen::Failed(m) => {
                    bad.push(format!("{sp} on `{}` cannot be read ({m})", n.node));
                }
            }
        }
    }
    if missing {
        return Err(Flow::Poll(
            PollWhy::Waiting,
            "observing the control plane's health".into(),
        ));
    }
    if bad.is_empty() {
        return Ok(());
    }
    let what = c.map(|c| c.name()).unwrap_or("component");
    let since = match t.since {
        Some(s) => s,
        None => {
            kube_mut(j, si).tasks.as_mut().expect("tasks")[ti].since = Some(now);
            notes.push(format!(
                "control plane unhealthy before {what} on `{name}`: {}",
                bad.join("; ")
            ));
            now
        }
    };
    if now >= add(since, timeout) {
        return Err(halt_flow(
            format!(
                "control plane unhealthy before patching {what} on `{name}` (waited {}s): {}",
                timeout.as_secs(),
                bad.join("; ")
            ),
            Some(&name),
            Some(Op::SetImage),
        ));
    }
    Err(Flow::Poll(
        PollWhy::Waiting,
        format!("control plane unhealthy: {}", bad.join("; ")),
    ))
}

/// Pre-checks of a Kubernetes rollout and the task list it runs.
fn kube_prechecks(
    j: &Job,
    si: usize,
    eyes: &Eyes,
    now: Timestamp,
) -> Result<(Vec<KubeTask>, String, bool), Flow> {
    let ks = kube_of(j, si);
    let to = ks.rollout.to.clone();
    let deadline = add(ks.since.unwrap_or(now), ks.rollout.health_timeout);
    let cps: BTreeSet<&str> = ks.control_plane.iter().map(|n| n.node.as_str()).collect();
    // ask for everything first, so one round observes it all
    let mut pending: Option<Flow> = None;
    let mut talos = BTreeMap::new();
    let mut kube = BTreeMap::new();
    let mut images = BTreeMap::new();
    let mut args = BTreeMap::new();
    for n in ks.all_nodes() {
        let nd = Some(n.node.as_str());
        let r1 = need(
            eyes.talos(n),
            &format!("node `{}`", n.node),
            deadline,
            now,
            nd,
        );
        let r2 = need(
            eyes.kube(&n.node),
            &format!("Kubernetes node `{}`", n.node),
            deadline,
            now,
            nd,
        );
        let r3 = need(
            eyes.images(n),
            &format!("machine config of `{}`", n.node),
            deadline,
            now,
            nd,
        );
        let r4 = need(
            eyes.args(n),
            &format!("component flags in the machine config of `{}`", n.node),
            deadline,
            now,
            nd,
        );
        for r in [
            r1.map(|t| {
                talos.insert(n.node.clone(), t);
            }),
            r2.map(|k| {
                kube.insert(n.node.clone(), k);
            }),
            r3.map(|i| {
                images.insert(n.node.clone(), i);
            }),
            r4.map(|a| {
                args.insert(n.node.clone(), a);
            }),
        ] {
            if let Err(f) = r {
                match (&pending, &f) {
                    (_, Flow::Halt { .. }) => return Err(f),
                    (None, _) => pending = Some(f),
                    _ => {}
                }
            }
        }
    }
    if let Some(f) = pending {
        return Err(f);
    }
    // Talos support window
    for n in ks.all_nodes() {
        let t = talos[&n.node];
        if !ks.rollout.talos_supports_target(&t.version) {
            return Err(halt_flow(
                format!(
                    "pre-check failed: node `{}` runs Talos {}, which does not support Kubernetes {to}; upgrade Talos first",
                    n.node, t.version
                ),
                Some(&n.node),
                None,
            ));
        }
    }
    // lowest running version: control-plane component images and every kubelet
    let mut running: Vec<(KubeVersion, String)> = Vec::new();
    for n in ks.all_nodes() {
        if let Some(v) = &kube[&n.node].kubelet_version {
            running.push((v.clone(), format!("kubelet on `{}`", n.node)));
        }
        if cps.contains(n.node.as_str()) {
            for c in Component::STATIC_PODS {
                if let Some((v, _)) = images[&n.node].get(&c).and_then(|i| image_version(i)) {
                    running.push((v, format!("{c} on `{}`", n.node)));
                }
            }
        }
    }
    let Some((lowest, lowest_what)) = running.into_iter().min_by(|a, b| a.0.cmp(&b.0)) else {
        return Err(halt_flow(
            "pre-check failed: no running Kubernetes version could be determined".into(),
            None,
            None,
        ));
    };
    if lowest > to {
        return Err(halt_flow(
            format!("pre-check failed: {lowest_what} runs {lowest}, newer than the target {to}"),
            None,
            None,
        ));
    }
    if lowest.major() != to.major() || to.minor() > lowest.minor() + 1 {
        return Err(halt_flow(
            format!(
                "pre-check failed: {lowest_what} runs {lowest}; {to} is more than one minor away (upgrade one minor at a time)"
            ),
            None,
            None,
        ));
    }
    // flags, feature gates and admission plugins the target removed (go-kubernetes
    // `upgrade/checks.go`, run by upgrade-k8s before it pre-pulls or patches anything)
    let mut found: Vec<RemovedSetting> = Vec::new();
    for n in ks.all_nodes() {
        let mut a: ComponentArgs = args[&n.node].clone();
        if !cps.contains(n.node.as_str()) {
            // workers run no control-plane components
            a.retain(|c, _| *c == Component::Kubelet);
        }
        found.extend(removed_settings(&n.node, &a, &to));
    }
    if !found.is_empty() {
        let list: Vec<String> = found.iter().map(|f| f.to_string()).collect();
        return Err(halt_flow(
            format!(
                "pre-check failed: Kubernetes {to} removed settings the machine configuration still sets; remove them first: {}",
                list.join("; ")
            ),
            found.first().map(|f| f.node.as_str()),
            None,
        ));
    }
    // the task list, in upgrade-k8s order
    let mut tasks = Vec::new();
    // A component already at the target is never trusted: its task starts `Applied`, so the
    // static pod (Ready, with the target image and the node's current config version for it) or the kubelet (version, Ready) is verified
    // before the next node is touched, as `upgrade-k8s` waits in `checkPodStatus` even when the
    // patch was skipped (talos `pkg/cluster/kubernetes/talos_managed.go`). kube-proxy has
    // nothing to wait for (its DaemonSet changes with the manifests).
    let task = |op, node: &NodeTarget, component, image: String, done: bool| KubeTask {
        op,
        node: node.clone(),
        component,
        image,
        state: match (done, op, component) {
            (false, _, _) => TaskState::Pending,
            (true, KubeOp::Patch, Some(c)) if c != Component::Proxy => TaskState::Applied,
            (true, _, _) => TaskState::Done,
        },
        since: None,
        attempt: 0,
        config_version: None,
    };
    let target = |n: &NodeTarget, c: Component| {
        let cur = images[&n.node].get(&c).map(String::as_str);
        let t = target_image(c, cur, &to);
        let done = cur == Some(t.as_str());
        (t, done)
    };
    for n in &ks.control_plane {
        for c in Component::STATIC_PODS {
            let (img, done) = target(n, c);
            if !done {
                tasks.push(task(KubeOp::Pull, n, Some(c), img, false));
            }
        }
    }
    for n in ks.all_nodes() {
        let (img, done) = target(n, Component::Kubelet);
        if !done {
            tasks.push(task(KubeOp::Pull, n, Some(Component::Kubelet), img, false));
        }
    }
    for c in Component::STATIC_PODS {
        for n in &ks.control_plane {
            let (img, done) = target(n, c);
            tasks.push(task(KubeOp::Patch, n, Some(c), img, done));
        }
    }
    for n in &ks.control_plane {
        let (img, done) = target(n, Component::Proxy);
        tasks.push(task(KubeOp::Patch, n, Some(Component::Proxy), img, done));
    }
    for n in ks.all_nodes() {
        let (img, done) = target(n, Component::Kubelet);
        tasks.push(task(KubeOp::Patch, n, Some(Component::Kubelet), img, done));
    }
    if let Some(first) = ks.control_plane.first() {
        tasks.push(task(KubeOp::Manifests, first, None, String::new(), false));
    }
    // the manifests sync: server-side apply when every node runs Talos >= 1.13
    // (`SupportsSSAManifestSync` of the lowest version, talos_managed.go)
    let legacy = talos
        .values()
        .any(|t| UpgradeMethod::for_version(&t.version) == UpgradeMethod::Legacy);
    Ok((
        tasks,
        format!(
            "Kubernetes pre-checks passed: lowest running {lowest} ({lowest_what}), target {to}"
        ),
        legacy,
    ))
}

// ---------------------------------------------------------------------------------------------
// outcomes and resolution

enum Resolution {
    /// The command took effect (`rebooted`: the node already rebooted since).
    Done {
        outcome: Outcome,
        rebooted: bool,
    },
    /// It had no effect: issue it again (next attempt).
    Reissue,
    /// Cannot tell yet.
    Pending(PollWhy, String),
    Halt(String),
}

fn resolve(j: &Job, intent: &Intent, eyes: &Eyes, now: Timestamp) -> Resolution {
    let _ = now;
    let done = Resolution::Done {
        outcome: Outcome::Done,
        rebooted: false,
    };
    let away =
        |m: &str| Resolution::Pending(PollWhy::Unreachable, format!("cannot observe yet ({m})"));
    match &intent.action {
        Action::Pull { .. } | Action::Drain { .. } | Action::ApplyManifests { .. } => {
            // idempotent: doing it again is the same as doing it once
            Resolution::Reissue
        }
        Action::Snapshot { .. } => match eyes.snapshot() {
            Seen::Got(Some(info)) => Resolution::Done {
                outcome: Outcome::Snapshot { info: info.clone() },
                rebooted: false,
            },
            Seen::Got(None) => Resolution::Reissue,
            Seen::Missing => {
                Resolution::Pending(PollWhy::Waiting, "observing the snapshot file".into())
            }
            Seen::Transient(m) => away(m),
            Seen::Failed(m) => Resolution::Halt(format!("cannot read the snapshot file: {m}")),
        },
        Action::Cordon { node } | Action::Uncordon { node } => {
            let want = matches!(intent.action, Action::Cordon { .. });
            match eyes.kube(node) {
                Seen::Got(k) if k.unschedulable == want => done,
                Seen::Got(_) => Resolution::Reissue,
                Seen::Missing => {
                    Resolution::Pending(PollWhy::Waiting, format!("observing `{node}`"))
                }
                Seen::Transient(m) => away(m),
                Seen::Failed(m) => {
                    Resolution::Halt(format!("cannot read Kubernetes node `{node}`: {m}"))
                }
            }
        }
        Action::SetImage {
            node,
            component,
            image,
        } => match eyes.images(node) {
            Seen::Got(imgs) if imgs.get(component) == Some(image) => done,
            Seen::Got(_) => Resolution::Reissue,
            Seen::Missing => {
                Resolution::Pending(PollWhy::Waiting, format!("observing `{}`", node.node))
            }
            Seen::Transient(m) => away(m),
            Seen::Failed(m) => Resolution::Halt(format!(
                "cannot read the machine config of `{}`: {m}",
                node.node
            )),
        },
        Action::Upgrade {
            node,
            boot_id_before,
            ..
        } => {
            let to = match j.steps.get(intent.key.step).map(|s| &s.kind) {
                Some(StepKind::Talos(t)) => t.rollout.to.clone(),
                _ => return Resolution::Halt("an upgrade intent outside a Talos step".into()),
            };
            match eyes.talos(node) {
                Seen::Got(t) => {
                    if &t.boot_id != boot_id_before || t.version == to {
                        // it rebooted since: the legacy upgrade ran (or a reboot happened); the
                        // post-reboot checks decide whether it took
                        Resolution::Done {
                            outcome: Outcome::Done,
                            rebooted: true,
                        }
                    } else if t.next_boot == NextBoot::Version(to.clone()) {
                        done
                    } else if let NextBoot::Version(v) = &t.next_boot {
                        Resolution::Halt(format!(
                            "node `{}` has {v} staged for its next boot, not {to}",
                            node.node
                        ))
                    } else if t.stage.in_transition() {
                        Resolution::Pending(
                            PollWhy::Waiting,
                            format!("`{}` is {:?}", node.node, t.stage),
                        )
                    } else if t.next_boot == NextBoot::Same {
                        Resolution::Reissue
                    } else {
                        Resolution::Halt(format!(
                            "cannot tell whether the upgrade of `{}` ran (the node does not report its next boot); check the node and plan again",
                            node.node
                        ))
                    }
                }
                Seen::Missing => {
                    Resolution::Pending(PollWhy::Waiting, format!("observing `{}`", node.node))
                }
                Seen::Transient(m) => away(m),
                Seen::Failed(m) => {
                    Resolution::Halt(format!("cannot read node `{}`: {m}", node.node))
                }
            }
        }
        Action::Reboot {
            node,
            boot_id_before,
        } => match eyes.talos(node) {
            Seen::Got(t) if &t.boot_id != boot_id_before || t.stage.in_transition() => done,
            Seen::Got(_) => Resolution::Reissue,
            Seen::Missing => {
                Resolution::Pending(PollWhy::Waiting, format!("observing `{}`", node.node))
            }
            Seen::Transient(m) => away(m),
            Seen::Failed(m) => Resolution::Halt(format!("cannot read node `{}`: {m}", node.node)),
        },
    }
}

fn bump_attempt(j: &mut Job, key: &CommandKey) {
    if key.op == Op::Snapshot {
        j.snapshot_attempts += 1;
        return;
    }
    let Some(node) = key.node.as_deref() else {
        if let Some(StepKind::Kubernetes(k)) = j.steps.get_mut(key.step).map(|s| &mut s.kind)
            && let Some(t) = k
                .tasks
                .iter_mut()
                .flatten()
                .find(|t| t.op == KubeOp::Manifests)
        {
            t.attempt += 1;
        }
        return;
    };
    match j.steps.get_mut(key.step).map(|s| &mut s.kind) {
        Some(StepKind::Talos(t)) => {
            if let Some(n) = t.nodes.iter_mut().find(|n| n.target.node == node) {
                Arc::make_mut(n).attempt += 1;
            }
        }
        Some(StepKind::Kubernetes(k)) => {
            if let Some(t) = current_task_mut(k) {
                t.attempt += 1;
            }
        }
        None => {}
    }
}

/// Remember why an Upgrade attempt of the key's node did not take (and count it when the node
/// answered it with a failure).
fn record_upgrade_error(j: &mut Job, key: &CommandKey, error: String, definitive: bool) {
    let Some(node) = key.node.as_deref() else {
        return;
    };
    if let Some(StepKind::Talos(t)) = j.steps.get_mut(key.step).map(|s| &mut s.kind)
        && let Some(n) = t.nodes.iter_mut().find(|n| n.target.node == node)
    {
        let n = Arc::make_mut(n);
        n.last_error = Some(error);
        if definitive {
            n.upgrade_failures += 1;
        }
    }
}

fn current_task_mut(k: &mut KubeStep) -> Option<&mut KubeTask> {
    k.tasks
        .iter_mut()
        .flatten()
        .find(|t| t.state != TaskState::Done)
}

fn apply(
    j: &mut Job,
    intent: &Intent,
    outcome: &Outcome,
    rebooted: bool,
    now: Timestamp,
    notes: &mut Vec<String>,
) {
    let key = &intent.key;
    let who = key.node.as_deref().unwrap_or("cluster");
    match outcome {
        Outcome::Transient { error } => {
            if let Some(i) = j.in_flight.as_mut() {
                i.last_error = Some(error.clone());
            }
            notes.push(format!("{key}: outcome unknown ({error}); will observe"));
            return;
        }
        Outcome::Failed { error } => {
            // A definitive Upgrade failure (the node ran it and said it failed) may be tried
            // again, within the pool's bound; nothing is in flight once it answered.
            let (bound, failures) = match j.steps.get(key.step).map(|s| &s.kind) {
                Some(StepKind::Talos(t)) if key.op == Op::Upgrade => {
                    let failures = t
                        .nodes
                        .iter()
                        .find(|n| Some(n.target.node.as_str()) == key.node.as_deref())
                        .map(|n| n.upgrade_failures)
                        .unwrap_or(0);
                    (t.rollout.upgrade_attempts.max(1), failures + 1)
                }
                _ => (1, 1),
            };
            if key.op == Op::Upgrade {
                record_upgrade_error(j, key, error.clone(), true);
            }
            if failures < bound {
                notes.push(format!(
                    "{key}: the node answered failure {failures} of {bound} ({error}); trying again"
                ));
                j.in_flight = None;
                bump_attempt(j, key);
                return;
            }
            let reason = if bound > 1 {
                format!(
                    "{} on `{who}` failed {bound} times (rollout.upgradeAttempts); the last: {error}",
                    key.op
                )
            } else {
                format!("{} on `{who}` failed: {error}", key.op)
            };
            notes.push(format!("halted: {reason}"));
            *j = halt(j, reason, now);
            j.in_flight = None;
            return;
        }
        _ => {}
    }
    j.in_flight = None;
    if let Outcome::Snapshot { info } = outcome {
        notes.push(format!(
            "etcd snapshot saved: {} ({} bytes, sha256 {})",
            info.path.display(),
            info.size,
            info.sha256
        ));
        j.snapshot = Some(info.clone());
        return;
    }
    if key.op == Op::Snapshot {
        // a snapshot command that came back without its file: take it again
        j.snapshot_attempts += 1;
        return;
    }
    let Some(step) = j.steps.get_mut(key.step) else {
        return;
    };
    match &mut step.kind {
        StepKind::Talos(ts) => {
            let drain_timeout = ts.rollout.drain_timeout;
            let Some(n) = ts
                .nodes
                .iter_mut()
                .find(|n| Some(n.target.node.as_str()) == key.node.as_deref())
            else {
                return;
            };
            let n = Arc::make_mut(n);
            match (key.op, outcome) {
                (Op::Pull, _) => n.enter(NodePhase::Pulled, now),
                (Op::Cordon, _) => n.enter(NodePhase::Cordoned, now),
                (
                    Op::Drain,
                    Outcome::Drain {
                        result: DrainOutcome::Blocked { pdb, pod },
                    },
                ) => {
                    let deadline = add(n.since.unwrap_or(now), drain_timeout);
                    let why = format!("eviction of `{pod}` refused by PodDisruptionBudget `{pdb}`");
                    if now >= deadline {
                        let reason = format!(
                            "drain of `{who}` timed out after {}s: {why}; medea never forces evictions",
                            drain_timeout.as_secs()
                        );
                        notes.push(format!("halted: {reason}"));
                        j.state = JobState::Halted {
                            reason,
                            step: Some(key.step),
                            node: key.node.clone(),
                            op: Some(Op::Drain),
                            at: now,
                        };
                        return;
                    }
                    n.attempt += 1;
                    n.blocked = Some(why.clone());
                    n.not_before = Some(add(now, DRAIN_RETRY).min(deadline));
                    notes.push(format!("{who}: drain blocked: {why}"));
                    return;
                }
                (Op::Drain, _) => n.enter(NodePhase::Drained, now),
                (Op::Upgrade, _) => {
                    let legacy = matches!(
                        intent.action,
                        Action::Upgrade {
                            method: UpgradeMethod::Legacy,
                            ..
                        }
                    );
                    if rebooted || legacy {
                        n.enter(NodePhase::Rebooting, now);
                    } else {
                        n.enter(NodePhase::Upgraded, now);
                    }
                }
                (Op::Reboot, _) => n.enter(NodePhase::Rebooting, now),
                (Op::Uncordon, _) => n.enter(NodePhase::Done, now),
                _ => {}
            }
            notes.push(format!("{who}: {} done", key.op));
        }
        StepKind::Kubernetes(k) => {
            let Some(t) = current_task_mut(k) else {
                return;
            };
            match (key.op, t.op) {
                (Op::Pull, KubeOp::Pull) | (Op::ApplyManifests, KubeOp::Manifests) => {
                    t.state = TaskState::Done;
                }
                (Op::SetImage, KubeOp::Patch) => {
                    t.state = if t.component == Some(Component::Proxy) {
                        TaskState::Done
                    } else {
                        TaskState::Applied
                    };
                }
                _ => return,
            }
            t.since = Some(now);
            t.attempt = 0;
            notes.push(format!("{who}: {} done", key.op));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// serde helpers for timestamps (RFC 3339)

pub(crate) mod ts {
    use jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(t)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

pub(crate) mod ts_opt {
    use jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.collect_str(t),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| s.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::ports::EtcdMember;

    fn kv(s: &str) -> KubeVersion {
        KubeVersion::parse(s).unwrap()
    }
    fn tv(s: &str) -> crate::version::TalosVersion {
        crate::version::TalosVersion::parse(s).unwrap()
    }

    #[test]
    fn images_are_retagged_keeping_repository_and_flavour() {
        assert_eq!(
            split_image("registry.local:5000/k8s/kube-apiserver:v1.33.4"),
            ("registry.local:5000/k8s/kube-apiserver", Some("v1.33.4"))
        );
        assert_eq!(
            split_image("registry.local:5000/x"),
            ("registry.local:5000/x", None)
        );
        assert_eq!(
            split_image("ghcr.io/a/b:v1@sha256:abc"),
            ("ghcr.io/a/b", Some("v1"))
        );
        assert_eq!(
            image_version("ghcr.io/siderolabs/kubelet:v1.33.4-fat"),
            Some((kv("v1.33.4"), "-fat"))
        );
        assert_eq!(image_version("ghcr.io/siderolabs/kubelet:latest"), None);
        let to = kv("v1.34.1");
        assert_eq!(
            target_image(
                Component::Kubelet,
                Some("ghcr.io/siderolabs/kubelet:v1.33.4-slim"),
                &to
            ),
            "ghcr.io/siderolabs/kubelet:v1.34.1-slim"
        );
        assert_eq!(
            target_image(
                Component::ApiServer,
                Some("mirror:5000/kube-apiserver:v1.33.4"),
                &to
            ),
            "mirror:5000/kube-apiserver:v1.34.1"
        );
        assert_eq!(
            target_image(Component::Scheduler, None, &to),
            "registry.k8s.io/kube-scheduler:v1.34.1"
        );
    }

    /// The pre-check's support rule is the plan's (the catalog's), overrides included.
    #[test]
    fn talos_support_window() {
        let rollout = |to: &str, supported: Option<Vec<(u64, u64)>>| KubeRollout {
            from: kv("v1.30.0"),
            to: kv(to),
            control_plane: Vec::new(),
            workers: Vec::new(),
            health_timeout: Duration::from_secs(60),
            supported_talos: supported,
        };
        // Recorded by an older medea: the built-in catalog.
        assert!(rollout("v1.31.0", None).talos_supports_target(&tv("v1.13.9")));
        assert!(rollout("v1.36.4", None).talos_supports_target(&tv("v1.13.9")));
        assert!(!rollout("v1.37.0", None).talos_supports_target(&tv("v1.13.9")));
        assert!(!rollout("v1.30.9", None).talos_supports_target(&tv("v1.13.9")));
        // A Talos minor the catalog does not know supports nothing (the planner refuses it too).
        assert!(!rollout("v1.38.0", None).talos_supports_target(&tv("v1.15.0")));
        assert!(!rollout("v1.38.0", None).talos_supports_target(&tv("v2.0.0")));
        // Recorded by the planner: exactly its list, which `upgradePolicy.kubernetesSupport`
        // may have extended beyond the built-in windows.
        let extended = rollout("v1.37.0", Some(vec![(1, 13), (1, 14)]));
        assert!(extended.talos_supports_target(&tv("v1.13.9")));
        assert!(extended.talos_supports_target(&tv("v1.14.0")));
        assert!(!extended.talos_supports_target(&tv("v1.12.11")));
    }

    #[test]
    fn etcd_must_be_healthy_and_keep_quorum_without_one_member() {
        let m = |name: &str, healthy| EtcdMember {
            name: name.into(),
            learner: false,
            healthy,
            errors: vec![],
        };
        let h = |members| EtcdHealth {
            members,
            alarms: vec![],
        };
        assert!(etcd_verdict(&h(vec![m("a", true), m("b", true), m("c", true)])).is_ok());
        assert!(
            etcd_verdict(&h(vec![m("a", true)])).is_ok(),
            "single node: accepted"
        );
        let e = etcd_verdict(&h(vec![m("a", true), m("b", true)])).unwrap_err();
        assert!(e.contains("2 members"), "{e}");
        let e = etcd_verdict(&h(vec![m("a", true), m("b", false), m("c", true)])).unwrap_err();
        assert!(e.contains("`b` is unhealthy"), "{e}");
        let mut learner = h(vec![m("a", true), m("b", true), m("c", true)]);
        learner.members[2].learner = true;
        assert!(etcd_verdict(&learner).unwrap_err().contains("learner"));
        let mut alarm = h(vec![m("a", true), m("b", true), m("c", true)]);
        alarm.alarms.push("a: NOSPACE".into());
        assert!(etcd_verdict(&alarm).unwrap_err().contains("NOSPACE"));
        assert!(etcd_verdict(&h(vec![])).is_err());
    }

    #[test]
    fn job_ids_are_plain() {
        assert!(JobId::parse("abc123-prod").is_some());
        assert!(JobId::parse("a/b").is_none());
        assert!(JobId::parse("").is_none());
        assert!(JobId::parse("a b").is_none());
        let id = JobId::for_plan(&PlanId::from_digest([0xab; 32]), "prod");
        assert_eq!(id.as_str(), "abababababab-prod");
    }

    #[test]
    fn drains_journaled_before_the_policy_existed_keep_what_they_did() {
        // a `Drain` intent written by an older medea has no policy: it refused emptyDir and
        // bare pods, and so does its re-issue after an upgrade of medea
        let old: Action =
            serde_json::from_str(r#"{"op":"drain","node":"w-1","timeout_secs":600}"#).unwrap();
        assert!(
            matches!(&old, Action::Drain { policy, .. } if *policy == DrainPolicy::legacy()),
            "{old:?}"
        );
        let new = Action::Drain {
            node: "w-1".into(),
            timeout_secs: 600,
            policy: DrainPolicy {
                delete_empty_dir_data: true,
                evict_unmanaged_pods: false,
                skip_pods: [("app".to_string(), "local-path".to_string())].into(),
            },
        };
        let back: Action = serde_json::from_str(&serde_json::to_string(&new).unwrap()).unwrap();
        assert_eq!(back, new);
    }

    #[test]
    fn command_keys_name_job_step_node_op_attempt() {
        let k = CommandKey {
            job: JobId::parse("j").unwrap(),
            step: 2,
            node: Some("cp-1".into()),
            op: Op::Upgrade,
            attempt: 1,
        };
        assert_eq!(k.to_string(), "j/2/cp-1/upgrade/1");
    }
}
