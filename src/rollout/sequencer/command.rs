//! Commands: what the sequencer asks the executor to do, their idempotency keys, the intent
//! journaled before a call and the outcome recorded after it.

use super::*;

/// The kinds of command; part of every idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CommandOp {
    Snapshot,
    Pull,
    /// The pull of a node of the next wave, made while the current wave is away (best effort:
    /// a failure never halts the job; the node then pulls at its turn).
    PullAhead,
    Cordon,
    Drain,
    Upgrade,
    Reboot,
    Uncordon,
    SetImage,
    ApplyManifests,
    /// `MachineService.Rollback` after a failed health gate (never made twice).
    Rollback,
}

impl CommandOp {
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
    pub job: JobId,
    pub step: usize,
    pub node: Option<String>,
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
    /// Roll the node back to its previous installation (`MachineService.Rollback`): it boots
    /// `to` again. Journaled before the call; after a crash it is resolved by observing the
    /// node, never made again (a second call would flip the A/B slot back).
    Rollback {
        node: NodeTarget,
        /// The version the node must come back on (what it ran before the job).
        to: crate::version::TalosVersion,
        /// Boot id observed right before the call.
        boot_id_before: String,
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
pub enum CommandOutcome {
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
