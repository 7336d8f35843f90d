//! The job record: a job, its steps (Talos per pool and hop, Kubernetes), each node's progress
//! and each Kubernetes task. Plain data; the decisions are in the sibling modules.

use super::*;

/// The id of a job: `<plan short id>-<cluster>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(String);

impl JobId {
    /// The job of `plan` in `cluster` (one job per cluster of a plan).
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
    /// The id as text.
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
    /// The cron expression of its start.
    pub start: String,
    /// How long it stays open, in seconds.
    pub duration_secs: u64,
    /// The time zone the cron expression is read in.
    pub time_zone: String,
}

impl WindowSpec {
    /// The spec of `w`, as a job keeps it.
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
    /// The job's id.
    pub id: JobId,
    /// The approved plan it was born from.
    pub plan: PlanId,
    /// The cluster it runs in.
    pub cluster: String,
    /// When it was created.
    pub created_at: Timestamp,
    /// Node starts are gated on these (none = always open).
    pub windows: Vec<WindowSpec>,
    /// No node starts a change one of these holds (`spec.maintenance.exclusions` at
    /// creation; issue #36). Absent in older records: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclusions: Vec<crate::desired::exclusion::Exclusion>,
    /// The plan's predicted duration of this job (issue #36: advice, from the cluster's
    /// history at planning time); status, metrics and the overdue event compare with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted: Option<crate::plan::estimate::Bounds>,
    /// The cluster's control-plane machines at creation: etcd checks and the snapshot go
    /// through them.
    pub control_plane: Vec<NodeTarget>,
    /// The plan's steps for the cluster, with their progress.
    pub steps: Vec<JobStep>,
    /// Running, halted or succeeded.
    pub state: JobState,
    /// Bumped on every change of the job (omicron-style generation).
    pub generation: u64,
    /// The etcd snapshot taken before the first control-plane change of this job.
    pub snapshot: Option<SnapshotInfo>,
    /// Attempts of the snapshot command so far.
    #[serde(default)]
    pub snapshot_attempts: u32,
    /// The age recipients (`age1…`) of the cluster's `spec.backup` at creation (issue #49):
    /// when there are any, the etcd snapshot is saved only encrypted to them
    /// (`<snapshot-dir>/<job>.db.age`); none: plaintext `<job>.db`, 0600. Immutable for the
    /// job's life (a restarted executor looks for the same file). Absent in older records: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshot_recipients: Vec<String>,
    /// The journaled command whose outcome is not recorded yet.
    pub in_flight: Option<Intent>,
    /// Sequence number of the last journal entry of this job (maintained by the executor).
    pub journal_seq: u64,
    /// The cluster's health policy from the plan (issue #23): gates before and after the job,
    /// and for steps without a pool policy of their own. Immutable for the job's life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::plan::health::HealthPolicy>,
    /// Where the job is with its health gates, and the evidence they gave.
    #[serde(default, skip_serializing_if = "GateProgress::is_empty")]
    pub gates: GateProgress,
    /// The last-applied records of the plan's resources of this cluster (issue #32): written
    /// in the transaction that records the job's success, never before, so a job that halts
    /// leaves the next plan showing the same diff. Immutable for the job's life.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applies: Vec<crate::plan::AppliedResource>,
    /// The cluster's blocking hooks before and after the job, from the plan (issue #35).
    /// Immutable for the job's life; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<Arc<crate::desired::hooks::Hooks>>,
    /// Every hook the job has scheduled, by site (`<step>/<point>/<scope>/<name>`): its
    /// attempts and, once it succeeded, how. A hook whose site has no record never ran.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hook_runs: BTreeMap<String, HookRun>,
    /// What counts against the predicted duration (issue #51): from the first command, less
    /// the waits for maintenance windows and exclusions. Absent in older records: not started.
    #[serde(default, skip_serializing_if = "is_default_clock")]
    pub clock: JobClock,
}

fn is_default_clock(c: &JobClock) -> bool {
    *c == JobClock::default()
}

/// A hook's record in a job (issue #35).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookRun {
    /// Attempts issued: 1, or 2 for an idempotent hook run again after medea stopped while
    /// it ran.
    pub attempts: u32,
    /// Once it succeeded: how, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<String>,
}

/// Where a job stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum JobState {
    /// Still running (or paused at a gate).
    Running,
    /// Stopped for good: continuing needs a new plan and a new approval.
    Halted {
        /// The text (`reason`) and the code (`code`) of the halt, flattened into the record.
        #[serde(flatten)]
        reason: HaltReason,
        /// Index of the step that was running.
        step: Option<usize>,
        /// The node it halted at, if any.
        node: Option<String>,
        /// The command it halted at, if any.
        op: Option<CommandOp>,
        /// When.
        at: Timestamp,
    },
    /// Every step ran to its end.
    Succeeded {
        /// When.
        at: Timestamp,
    },
}

#[cfg(test)]
impl Job {
    /// A test fixture: cluster `home`'s running job of plan `plan`, created at `created_at`, with
    /// one Talos step over `rollout` in `state`; tests change the fields they need with
    /// `Job { windows: …, ..Job::one_talos_step(…) }`.
    pub(crate) fn one_talos_step(
        plan: PlanId,
        created_at: Timestamp,
        state: StepState,
        rollout: TalosRollout,
    ) -> Job {
        Job {
            id: JobId::for_plan(&plan, "home"),
            plan,
            cluster: "home".into(),
            created_at,
            windows: vec![],
            exclusions: vec![],
            predicted: None,
            control_plane: vec![],
            steps: vec![JobStep {
                state,
                kind: StepKind::Talos(TalosStep::new(rollout)),
            }],
            state: JobState::Running,
            generation: 1,
            snapshot: None,
            snapshot_attempts: 0,
            snapshot_recipients: Vec::new(),
            in_flight: None,
            journal_seq: 0,
            health: None,
            gates: Default::default(),
            applies: Vec::new(),
            hooks: None,
            hook_runs: Default::default(),
            clock: Default::default(),
        }
    }
}

impl JobState {
    /// Whether the job has ended (halted or succeeded).
    pub fn is_terminal(&self) -> bool {
        !matches!(self, JobState::Running)
    }
}

/// Where a step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StepState {
    /// Not started.
    Pending,
    /// Started.
    Running,
    /// Finished.
    Done,
}

/// One step of a job and its progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobStep {
    /// Where it stands.
    pub state: StepState,
    /// What it does.
    pub kind: StepKind,
}

/// What a step does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum StepKind {
    /// A Talos hop of one pool.
    Talos(TalosStep),
    /// A Kubernetes upgrade.
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
    /// The budget of the wave that started last (issue #35, pacing): `maxUnavailable` less the
    /// nodes of the pool already unavailable when it was about to start. Absent in older
    /// records (their waves used the whole `maxUnavailable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<WaveBudget>,
    /// Install-ahead batches settled so far (`rollout.stage: ahead`): the next batch's key
    /// attempt is this + 1.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stage_batches: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The budget of one wave (issue #35, pacing): how many of its nodes may be away at once,
/// once the nodes of the pool that are already unavailable (NotReady, or cordoned by someone
/// else) are counted against `maxUnavailable` (the control plane's one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaveBudget {
    /// The wave (0-based).
    pub wave: usize,
    /// Nodes of the wave that may be away at once.
    pub slots: usize,
    /// The nodes counted as already unavailable, with why (`w-3 (NotReady)`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
    /// When the wave's budget was first counted (a wave with no slot left waits from here,
    /// for the pool's `healthTimeout`, then the job halts).
    pub since: Timestamp,
}

impl TalosStep {
    /// The step of `rollout`, every node pending.
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
            stage_batches: 0,
            budget: None,
        }
    }
    pub(super) fn control_plane(&self) -> bool {
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
    /// Image pulled; cordon is next.
    Pulled,
    /// Cordoned; the drain is next.
    Cordoned,
    /// Drained; the wait for its volumes to detach is next (`drain.volumeDetachTimeout`).
    Drained,
    /// No `VolumeAttachment` names the node any more (or the pool does not wait for it); the
    /// upgrade is next.
    Detached,
    /// Installed (lifecycle path), not rebooted yet.
    Upgraded,
    /// Rebooted (or legacy upgrade accepted); waiting for the node to come back right.
    Rebooting,
    /// Back on the target, healthy and Ready; uncordon is next.
    Back,
    /// Uncordoned: the node is done.
    Done,
    /// Already ran the target when its turn came.
    Skipped,
}

impl NodePhase {
    /// Whether the node has nothing left to do.
    pub fn finished(self) -> bool {
        matches!(self, NodePhase::Done | NodePhase::Skipped)
    }
    /// Its next move is a check before a command of its own, and nothing medea did to it waits
    /// for a verdict: not started, being checked, drained and waiting for its volumes to
    /// detach, or about to be upgraded. Such a node is looked at when its turn in the wave
    /// comes, not in every decision.
    pub fn checked_at_its_turn(self) -> bool {
        matches!(
            self,
            NodePhase::Pending | NodePhase::Checking | NodePhase::Drained | NodePhase::Detached
        )
    }
    /// Cordoned or down: counts against `maxUnavailable`.
    pub fn away(self) -> bool {
        matches!(
            self,
            NodePhase::Cordoned
                | NodePhase::Drained
                | NodePhase::Detached
                | NodePhase::Upgraded
                | NodePhase::Rebooting
                | NodePhase::Back
        )
    }
}

/// One node's progress in a Talos step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeProgress {
    /// Immutable for the job's life; shared like [`TalosStep::rollout`].
    pub target: Arc<MachineTarget>,
    /// The wave it belongs to (0-based).
    pub wave: usize,
    /// Where it stands.
    pub phase: NodePhase,
    /// When the current phase began (timeouts count from here).
    pub since: Option<Timestamp>,
    /// Attempts of the current phase's command so far.
    pub attempt: u32,
    /// Boot id before the upgrade/reboot (what "came back" is compared with).
    pub boot_id_before: Option<String>,
    /// Kubelet version before the rollout (the node must come back with it).
    pub kubelet_before: Option<KubeVersion>,
    /// The Talos services that were not Running+healthy when the node's checks passed (an
    /// extension service that was failing already): they do not keep the node "not back"
    /// after its reboot; a service that was healthy before still does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services_unhealthy_before: Vec<String>,
    /// The upgrade RPC journaled for it, once chosen.
    pub method: Option<UpgradeMethod>,
    /// Do not retry the current command before this time (blocked drain).
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
    /// The node was already cordoned when its step started: medea did not cordon it, so it
    /// never uncordons it (it stays as the operator left it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub was_cordoned: bool,
    /// The node's image pull made ahead of its turn, while the wave before it was away
    /// (`None`: not made). A node pulled ahead skips its own pull.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulled_ahead: Option<PullAhead>,
    /// Rolling the node back after a failed health gate (`onFailure: rollback`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackPhase>,
    /// The silence of the node's expected alerts (issue #35), once its step asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence: Option<NodeSilence>,
    /// medea's pacing taint on the node (issue #35), once the node was in the next wave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pacing: Option<PacingTaint>,
    /// Its install ahead of the windows (`rollout.stage: ahead`, issue #36), once decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging: Option<Staging>,
    /// The volumes its drain evicted pods of (issue #48 item 7), from its cordon on: the
    /// volume-detach wait covers only their attachments. `None` (a node cordoned before medea
    /// recorded them): every attachment on the node counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_volumes: Option<DrainVolumes>,
    /// A control-plane node's etcd leadership handover before its reboot (issue #48), once
    /// it was asked to forfeit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<Handover>,
    /// The boot id in which the node answered an install call of this job with "another
    /// installation/upgrade is already in progress" (issue #48): an install of it is running,
    /// so an open install outcome is waited for (never issued again) while the node stays in
    /// that boot with its next boot unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installing: Option<String>,
}

/// The PersistentVolumes of the pods a node's drains evicted, as tuppr's
/// `EvictableVolumePVs` collects them before it drains.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum DrainVolumes {
    /// Every drain of the node since its cordon reported its volumes: these (sorted, each
    /// once).
    Known {
        /// PersistentVolume names.
        volumes: Vec<String>,
    },
    /// A drain's outcome was lost (a crash, a lost reply: the drain ran again and only saw
    /// the pods left) or did not report them: every attachment on the node counts.
    Unknown,
}

impl DrainVolumes {
    /// After a drain that reported `volumes` (`None`: did not report them).
    pub fn add(&mut self, volumes: Option<&[String]>) {
        match (&mut *self, volumes) {
            (DrainVolumes::Known { volumes: known }, Some(more)) => {
                known.extend(more.iter().cloned());
                known.sort();
                known.dedup();
            }
            (_, _) => *self = DrainVolumes::Unknown,
        }
    }
    /// Whether the detach wait covers an attachment of `pv` (`None`: its source is no
    /// PersistentVolume).
    pub fn covers(&self, pv: Option<&str>) -> bool {
        match self {
            DrainVolumes::Known { volumes } => pv.is_some_and(|pv| volumes.iter().any(|v| v == pv)),
            DrainVolumes::Unknown => true,
        }
    }
}

/// The forfeits of etcd leadership a control-plane node was asked for before its reboot
/// (`MachineService.EtcdForfeitLeadership`, issue #48).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Handover {
    /// Forfeit calls made (the attempt of the next call's key).
    pub calls: u32,
    /// The node answered the last call without an error.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub answered: bool,
    /// Why the last call failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Not asked again before this time (after a failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Timestamp>,
}

/// medea's pacing taint on a node (issue #35): `medea.dev/upgrade-pending=<job id>:
/// PreferNoSchedule`, put before the wave before the node's starts, removed once the node is
/// done or the job ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum PacingTaint {
    /// The apiserver took it: it must be removed before the job is over.
    Placed,
    /// Removed (or found gone).
    Removed,
    /// The apiserver refused it: the node went on untainted.
    NotPlaced {
        /// The refusal.
        error: String,
    },
    /// Removing it failed definitely: it stays on the node until someone removes it.
    Left {
        /// The refusal.
        error: String,
    },
}

/// Where a node is with its install ahead of the maintenance windows (`rollout.stage: ahead`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum Staging {
    /// The install call came back done; that the node's next boot is the target is not
    /// verified yet.
    Installed {
        /// The node's boot id when it was installed.
        boot_id: String,
    },
    /// Installed and verified: the node's default boot entry is the target. It still runs
    /// its old version; ANY reboot, medea's or not, boots the target.
    Staged {
        /// The boot id it was staged in: another one means it rebooted.
        boot_id: String,
        /// When it was verified.
        at: Timestamp,
    },
    /// Seen rebooted outside medea's step after its staging (a new boot id): verified on the
    /// target and healthy within the health timeout from `at`, then done without another
    /// install; otherwise the job halts naming it.
    RebootedExternally {
        /// The boot id it was staged in.
        staged_boot_id: String,
        /// When medea saw it.
        at: Timestamp,
    },
    /// Not installed ahead: it installs in the window as before (`why`).
    InWindow {
        /// Why, for a person.
        why: String,
    },
}

impl Staging {
    /// Whether the node holds the target as its next boot and has not rebooted into it.
    pub fn staged(&self) -> bool {
        matches!(self, Staging::Staged { .. } | Staging::Installed { .. })
    }
}

/// A node's silence (issue #35 item 1): a lease in Alertmanager, created before the cordon,
/// renewed while the node is away, expired once it is back and uncordoned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum NodeSilence {
    /// Alertmanager holds it until `ends_at` unless medea renews it.
    Active {
        /// Its id.
        id: String,
        /// When medea first asked for it (`maxDuration` counts from here).
        since: Timestamp,
        /// When it lapses unless renewed.
        ends_at: Timestamp,
        /// Renewals made so far (the silence command's attempt number).
        #[serde(default)]
        renewals: u32,
        /// A renewal failed: not tried again before this time.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_at: Option<Timestamp>,
    },
    /// Over: expired by medea, left to lapse, or never made (`proceed` after a refusal).
    Ended {
        /// The silence, when there was one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// How it ended, for a person.
        how: String,
    },
}

/// How a node's pull ahead of its turn went. It never halts the job: a node whose pull ahead
/// failed or was lost pulls at its turn, as every node did before pulls were made ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PullAhead {
    /// The node has the image: its turn goes from its checks straight to the cordon.
    Pulled,
    /// The call failed or its outcome was lost: the node pulls at its turn.
    Failed,
}

/// Where a node is in its rollback (after its wave failed a health gate): cordon, drain,
/// `MachineService.Rollback` (journaled before the call, never made twice), back on the
/// previous version, uncordon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RollbackPhase {
    /// Not started.
    Pending,
    /// Cordoned; the drain is next.
    Cordoned,
    /// Drained; the rollback call is next.
    Drained,
    /// The Rollback call was accepted; the node reboots into its previous version.
    Rebooting,
    /// Back on the previous version, healthy and Ready; uncordon is next.
    Back,
    /// Uncordoned: the node is back where it was.
    Done,
}

impl NodeProgress {
    pub(super) fn new(target: Arc<MachineTarget>, wave: usize) -> NodeProgress {
        NodeProgress {
            target,
            wave,
            phase: NodePhase::Pending,
            since: None,
            attempt: 0,
            boot_id_before: None,
            kubelet_before: None,
            services_unhealthy_before: Vec::new(),
            method: None,
            not_before: None,
            blocked: None,
            last_error: None,
            upgrade_failures: 0,
            was_cordoned: false,
            pulled_ahead: None,
            rollback: None,
            silence: None,
            staging: None,
            drain_volumes: None,
            pacing: None,
            handover: None,
            installing: None,
        }
    }
    /// How the ports address the node.
    pub fn node_target(&self) -> NodeTarget {
        NodeTarget {
            node: self.target.node.clone(),
            address: self.target.address.clone(),
        }
    }
    pub(super) fn enter(&mut self, phase: NodePhase, now: Timestamp) {
        self.phase = phase;
        self.since = Some(now);
        self.attempt = 0;
        self.not_before = None;
    }
    pub(super) fn enter_rollback(&mut self, phase: RollbackPhase, now: Timestamp) {
        self.rollback = Some(phase);
        self.since = Some(now);
        self.attempt = 0;
        self.not_before = None;
        self.blocked = None;
    }
}

/// The Kubernetes rollout of a cluster (the upgrade-k8s sequence).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeStep {
    /// The plan's rollout.
    pub rollout: KubeRollout,
    /// Control-plane nodes, patched one at a time.
    pub control_plane: Vec<NodeTarget>,
    /// Worker nodes (their kubelets).
    pub workers: Vec<NodeTarget>,
    /// When the pre-checks began.
    pub since: Option<Timestamp>,
    /// Built when the pre-checks pass.
    pub tasks: KubeTasks,
    /// Some node runs Talos < 1.13 (decided by the pre-checks): the manifests are synced the
    /// legacy way, as `upgrade-k8s` decides from the lowest Talos version.
    #[serde(default)]
    pub manifests_legacy: bool,
}

/// A Kubernetes step's task list: none until the pre-checks pass, then the tasks they planned.
/// Stored as before (`null`, or the list).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "Option<Vec<KubeTask>>", into = "Option<Vec<KubeTask>>")]
pub enum KubeTasks {
    /// The pre-checks have not passed yet.
    #[default]
    Unchecked,
    /// The pre-checks passed and planned these tasks, run in order.
    Planned(Vec<KubeTask>),
}

impl KubeTasks {
    /// The planned tasks; none before the pre-checks pass.
    pub fn list(&self) -> &[KubeTask] {
        match self {
            KubeTasks::Unchecked => &[],
            KubeTasks::Planned(t) => t,
        }
    }

    /// The tasks, mutable.
    pub fn list_mut(&mut self) -> &mut [KubeTask] {
        match self {
            KubeTasks::Unchecked => &mut [],
            KubeTasks::Planned(t) => t,
        }
    }
}

impl From<Option<Vec<KubeTask>>> for KubeTasks {
    fn from(o: Option<Vec<KubeTask>>) -> KubeTasks {
        o.map_or(KubeTasks::Unchecked, KubeTasks::Planned)
    }
}

impl From<KubeTasks> for Option<Vec<KubeTask>> {
    fn from(t: KubeTasks) -> Option<Vec<KubeTask>> {
        match t {
            KubeTasks::Unchecked => None,
            KubeTasks::Planned(t) => Some(t),
        }
    }
}

impl KubeStep {
    /// The step of `rollout` over these nodes, tasks not built yet.
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
            tasks: KubeTasks::Unchecked,
            manifests_legacy: false,
        }
    }
    pub(super) fn all_nodes(&self) -> impl Iterator<Item = &NodeTarget> {
        self.control_plane.iter().chain(self.workers.iter())
    }
}

/// What a Kubernetes task does.
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

/// Where a Kubernetes task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskState {
    /// Not started.
    Pending,
    /// Patched; waiting for the component to run the new image.
    Applied,
    /// Finished.
    Done,
}

/// One task of a Kubernetes step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeTask {
    /// What it does.
    pub op: KubeOp,
    /// The node it acts on.
    pub node: NodeTarget,
    /// The component, for a pull or a patch.
    pub component: Option<Component>,
    /// Target image (empty for manifests).
    pub image: String,
    /// Where it stands.
    pub state: TaskState,
    /// When its current state began.
    pub since: Option<Timestamp>,
    /// 1-based attempt of its current command.
    pub attempt: u32,
    /// The component config version (`talos.dev/config-version`) its mirror pod was verified
    /// at; `None` before, for other tasks, and when the pod carried no such annotation.
    #[serde(default)]
    pub config_version: Option<String>,
}
