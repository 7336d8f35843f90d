//! Commands: what the sequencer asks the executor to do, their idempotency keys, the intent
//! journaled before a call and the outcome recorded after it.

use super::*;

/// The kinds of command; part of every idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CommandOp {
    /// Save an etcd snapshot.
    Snapshot,
    /// Pull the installer image.
    Pull,
    /// The pull of a node of the next wave, made while the current wave is away (best effort:
    /// a failure never halts the job; the node then pulls at its turn).
    PullAhead,
    /// Cordon the node.
    Cordon,
    /// Drain the node.
    Drain,
    /// Install the new version.
    Upgrade,
    /// Reboot the node.
    Reboot,
    /// Uncordon the node.
    Uncordon,
    /// Set a static-pod component's image.
    SetImage,
    /// Sync the bootstrap manifests.
    ApplyManifests,
    /// `MachineService.Rollback` after a failed health gate (never made twice).
    Rollback,
    /// Create or renew the silence of a node's expected alerts (issue #35).
    Silence,
    /// Expire a node's silence once it is back and uncordoned.
    Unsilence,
    /// Run a blocking hook (issue #35): an HTTP call or a Kubernetes Job, to its end.
    Hook,
    /// Pull and install without reboot on a batch of nodes ahead of the windows
    /// (`rollout.stage: ahead`, issue #36).
    Stage,
    /// Put medea's pacing taint on a node of the next wave (issue #35).
    Taint,
    /// Remove medea's pacing taint from a node (done, or the job over).
    Untaint,
    /// Ask a control-plane node that leads etcd to hand its leadership over before it is
    /// rebooted (`MachineService.EtcdForfeitLeadership`, issue #48).
    Forfeit,
}

impl CommandOp {
    /// The name journal points and events use (`upgrade`, `pull-ahead`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CommandOp::Snapshot => "etcd-snapshot",
            CommandOp::Pull => "pull",
            CommandOp::PullAhead => "pull-ahead",
            CommandOp::Cordon => "cordon",
            CommandOp::Drain => "drain",
            CommandOp::Upgrade => "upgrade",
            CommandOp::Reboot => "reboot",
            CommandOp::Uncordon => "uncordon",
            CommandOp::SetImage => "set-image",
            CommandOp::ApplyManifests => "apply-manifests",
            CommandOp::Rollback => "rollback",
            CommandOp::Silence => "silence",
            CommandOp::Unsilence => "unsilence",
            CommandOp::Hook => "hook",
            CommandOp::Stage => "stage",
            CommandOp::Taint => "taint",
            CommandOp::Untaint => "untaint",
            CommandOp::Forfeit => "forfeit-leadership",
        }
    }
}

impl fmt::Display for CommandOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The idempotency key of a command: (job, step, node, op, attempt).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CommandKey {
    /// The job.
    pub job: JobId,
    /// The step's index in the job.
    pub step: usize,
    /// The node, for a per-node command.
    pub node: Option<String>,
    /// The command.
    pub op: CommandOp,
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
        /// The node whose etcd is snapshotted.
        via: NodeTarget,
    },
    /// Pull an image into the node's CRI namespace.
    Pull {
        /// The node.
        node: NodeTarget,
        /// The image.
        image: String,
        /// The CRI namespace (the installer's, or the static pods').
        namespace: ImageNamespace,
    },
    /// Cordon the node.
    Cordon {
        /// The node name.
        node: String,
    },
    /// Drain the node by evictions.
    Drain {
        /// The node name.
        node: String,
        /// How long PodDisruptionBudgets may block it.
        timeout_secs: u64,
        /// Which pods are evicted. Journals written before the field existed read as
        /// [`DrainPolicy::legacy`], what those drains did.
        #[serde(default = "DrainPolicy::legacy")]
        policy: DrainPolicy,
    },
    /// Install `image` on the node.
    Upgrade {
        /// The node.
        node: NodeTarget,
        /// The installer image.
        image: String,
        /// The RPC (the lifecycle service, or the legacy one that reboots by itself).
        method: UpgradeMethod,
        /// Boot id observed right before the call.
        boot_id_before: String,
    },
    /// Reboot the node.
    Reboot {
        /// The node.
        node: NodeTarget,
        /// Its boot id before the call: a new one proves the reboot.
        boot_id_before: String,
    },
    /// Uncordon the node.
    Uncordon {
        /// The node name.
        node: String,
    },
    /// Set a static-pod component's image in the node's machine config.
    SetImage {
        /// The node.
        node: NodeTarget,
        /// The component.
        component: Component,
        /// The image.
        image: String,
    },
    /// Sync the bootstrap manifests through `via`.
    ApplyManifests {
        /// The control-plane node the sync goes through.
        via: NodeTarget,
        /// A node runs Talos < 1.13: the legacy sync (no server-side apply, no inventory).
        #[serde(default)]
        legacy: bool,
    },
    /// Roll the node back to its previous installation (`MachineService.Rollback`): it boots
    /// `to` again. Journaled before the call; after a crash it is resolved by observing the
    /// node, never made again (a second call would flip the A/B slot back).
    Rollback {
        /// The node.
        node: NodeTarget,
        /// The version the node must come back on (what it ran before the job).
        to: crate::version::TalosVersion,
        /// Boot id observed right before the call.
        boot_id_before: String,
    },
    /// Create (`id: None`) or renew a silence of the node's expected alerts in Alertmanager
    /// (issue #35). Journaled before the call: a silence whose reply was lost is found again
    /// by `marker` and renewed, never created twice.
    Silence {
        /// The node.
        node: String,
        /// The Alertmanager (boxed: the largest command stays small).
        alertmanager: Box<crate::plan::health::Endpoint>,
        /// The silence renewed; `None` at creation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// Its matchers (the policy's and the node's).
        matchers: Vec<crate::plan::health::SilenceMatcher>,
        /// When it lapses unless renewed.
        ends_at: Timestamp,
        /// Its comment.
        comment: String,
        /// The job's node step, as the comment carries it.
        marker: String,
    },
    /// Pull the installer and install it without reboot (`LifecycleService.Upgrade`) on each
    /// node of the batch, the nodes at once (`rollout.stage: ahead`). Journaled before the
    /// calls; after a crash each node is resolved by observing its next boot, never by
    /// installing again on a guess.
    Stage {
        /// The nodes, at most the step's stage parallelism.
        nodes: Vec<StageNode>,
    },
    /// Put `taint` on the node unless a taint with its key and effect is there already (issue
    /// #35, pacing). Idempotent: after a crash it is resolved by observing the node.
    Taint {
        /// The node name.
        node: String,
        /// medea's pacing taint (value: the job's id).
        taint: NodeTaint,
    },
    /// Remove exactly `taint` (key, value and effect) from the node; any other taint stays.
    /// Idempotent.
    Untaint {
        /// The node name.
        node: String,
        /// medea's pacing taint (value: the job's id).
        taint: NodeTaint,
    },
    /// Ask the node's etcd member to hand its leadership to another member
    /// (`MachineService.EtcdForfeitLeadership`) before the node is rebooted (issue #48).
    /// Journaled before the call; after a crash it is resolved by observing who leads: the
    /// node no longer leading is done, else it is asked again.
    ForfeitLeadership {
        /// The control-plane node.
        node: NodeTarget,
    },
    /// Expire the node's silence (it is back and uncordoned).
    Unsilence {
        /// The node.
        node: String,
        /// The Alertmanager.
        alertmanager: crate::plan::health::Endpoint,
        /// The silence.
        id: String,
    },
    /// Run a blocking hook to its end (issue #35). Journaled before the call: an intent
    /// without a result is run again only when the hook is idempotent, else the job halts
    /// (`hook_interrupted`).
    Hook {
        /// Where it runs.
        point: crate::desired::hooks::HookPoint,
        /// Its place in the job (`<step>/<point>/<scope>/<name>`), the key of its record in
        /// [`Job::hook_runs`].
        site: String,
        /// Stable for the site across attempts and restarts (`medea-hook-<hex>`): the
        /// Kubernetes Job's name, and the HTTP event's `runId`.
        run_id: String,
        /// The pool, for node and wave hooks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<String>,
        /// The node, for node hooks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        /// The wave (1-based), for wave and node hooks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wave: Option<usize>,
        /// The hook, as approved.
        hook: Box<crate::desired::hooks::Hook>,
    },
}

impl Action {
    /// The image a pull, upgrade or image change is about.
    pub fn image(&self) -> Option<&str> {
        match self {
            Action::Pull { image, .. }
            | Action::Upgrade { image, .. }
            | Action::SetImage { image, .. } => Some(image),
            _ => None,
        }
    }
}

impl Action {
    /// The command's kind.
    pub fn op(&self) -> CommandOp {
        match self {
            Action::Snapshot { .. } => CommandOp::Snapshot,
            Action::Pull { .. } => CommandOp::Pull,
            Action::Cordon { .. } => CommandOp::Cordon,
            Action::Drain { .. } => CommandOp::Drain,
            Action::Upgrade { .. } => CommandOp::Upgrade,
            Action::Reboot { .. } => CommandOp::Reboot,
            Action::Uncordon { .. } => CommandOp::Uncordon,
            Action::SetImage { .. } => CommandOp::SetImage,
            Action::ApplyManifests { .. } => CommandOp::ApplyManifests,
            Action::Rollback { .. } => CommandOp::Rollback,
            Action::Silence { .. } => CommandOp::Silence,
            Action::Unsilence { .. } => CommandOp::Unsilence,
            Action::Taint { .. } => CommandOp::Taint,
            Action::Untaint { .. } => CommandOp::Untaint,
            Action::Hook { .. } => CommandOp::Hook,
            Action::Stage { .. } => CommandOp::Stage,
            Action::ForfeitLeadership { .. } => CommandOp::Forfeit,
        }
    }
}

/// One node of a [`Action::Stage`] batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageNode {
    /// The node.
    pub node: NodeTarget,
    /// Its installer image.
    pub image: String,
    /// Its boot id right before the call.
    pub boot_id_before: String,
}

/// How one node of a [`Action::Stage`] batch came out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "result")]
pub enum StageResult {
    /// The pull and the install came back done.
    Installed,
    /// Resolved by observation: the call left no trace (nothing staged, same boot).
    NoEffect,
    /// The call may or may not have installed (transport lost): observed before anything else.
    Transient {
        /// The error, for a person.
        error: String,
    },
    /// The node answered with a failure (installer exit code, refused image).
    Failed {
        /// The error, for a person.
        error: String,
    },
    /// The node refused the call because an install is already running on it ("another
    /// installation/upgrade is already in progress"): an earlier call of the batch whose reply
    /// was lost is still at work. Observed like a lost reply, and the node is kept *installing*
    /// until its next boot changes (issue #48).
    Installing {
        /// The error, for a person.
        error: String,
    },
}

/// A command to make: its idempotency key and what it does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    /// The idempotency key.
    pub key: CommandKey,
    /// What it does.
    pub action: Action,
}

/// A command journaled as intended whose outcome is not recorded yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Intent {
    /// The idempotency key.
    pub key: CommandKey,
    /// What it does.
    pub action: Action,
    /// When it was journaled.
    pub issued_at: Timestamp,
    /// Set when the call came back transient: its effect is unknown until observed.
    pub last_error: Option<String>,
}

/// How a hook ran (issue #35), as journaled and shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookReport {
    /// Whether it succeeded (a 2xx answer; a Job `Complete`).
    pub succeeded: bool,
    /// What happened, for a person (the last answer or error; the Job's condition).
    pub detail: String,
    /// A Job hook: its container's exit code, when the pod ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// A Job hook: the tail of its pod's log (bounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_tail: Option<String>,
}

/// The outcome of one command, as recorded in the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "outcome")]
pub enum CommandOutcome {
    /// The call succeeded.
    Done,
    /// The snapshot was saved.
    Snapshot {
        /// Where, and its size.
        info: SnapshotInfo,
    },
    /// The drain ended.
    Drain {
        /// How.
        result: DrainOutcome,
    },
    /// Alertmanager created or renewed the node's silence.
    Silenced {
        /// The silence's id.
        id: String,
    },
    /// A hook ran to its end (issue #35): succeeded, or failed within its timeout.
    Hook {
        /// How it went.
        report: HookReport,
    },
    /// How each node of an install-ahead batch came out.
    Staged {
        /// Per node, in the batch's order.
        results: Vec<(String, StageResult)>,
    },
    /// The call may or may not have taken effect (UNAVAILABLE, connection lost).
    Transient {
        /// The error, for a person.
        error: String,
    },
    /// An install refused because another is already running on the node (an earlier call
    /// whose reply was lost): open like [`CommandOutcome::Transient`], and the node is kept
    /// *installing* until its next boot changes (issue #48).
    Installing {
        /// The error, for a person.
        error: String,
    },
    /// The call failed definitely: the job halts.
    Failed {
        /// The error, for a person.
        error: String,
        /// A drain that refused to start, typed (the halt carries it; not written otherwise).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refusal: Option<crate::rollout::ports::Refusal>,
    },
}
