//! What the executor reports: the gate that paused a job, how a run ended ([`RunOutcome`])
//! and the step events of the watch API ([`RolloutEvent`]).

use super::*;

/// A gate that keeps a job from making its next mutating command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "gate")]
pub enum Gate {
    /// The server runs without `--rollouts`.
    GlobalRollouts,
    /// The cluster has `rolloutsEnabled: false`.
    ClusterDisabled {
        /// The cluster's name.
        cluster: String,
    },
    /// A gate with `onInconclusive: pause` could not tell (issue #51 item 4): the job waits
    /// for `medea rollout resume`.
    Inconclusive {
        /// The gate's name.
        #[serde(rename = "name")]
        gate: String,
        /// Where in the job.
        point: String,
    },
}

impl std::fmt::Display for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Gate::GlobalRollouts => f.write_str("rollouts are off on this server (`--rollouts`)"),
            Gate::ClusterDisabled { cluster } => {
                write!(f, "cluster `{cluster}` has rollouts disabled")
            }
            Gate::Inconclusive { gate, point } => write!(
                f,
                "health gate `{gate}` was inconclusive {point}: `medea rollout resume` continues"
            ),
        }
    }
}

/// How a [`Executor::run`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// Every step ran to its end.
    Succeeded,
    /// The job halted and will not continue.
    Halted {
        /// Why.
        reason: HaltReason,
        /// The plan step it halted in, if any.
        step: Option<usize>,
        /// The node it halted at, if any.
        node: Option<String>,
    },
    /// A gate is closed: the job is still running and continues when it opens (run it again).
    Paused {
        /// The closed gate.
        gate: Gate,
    },
}

/// A step event for the watch API and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutEvent {
    /// The job.
    pub job: JobId,
    /// The job's cluster.
    pub cluster: String,
    /// Index of the plan step.
    pub step: Option<usize>,
    /// The pool of the step, for a Talos step.
    pub pool: Option<String>,
    /// The node, when the event is about one.
    pub node: Option<String>,
    /// The command, when the event is about one.
    pub op: Option<CommandOp>,
    /// What happened.
    pub state: EventState,
    /// How many steps the job has (for "step 1/3").
    pub steps: usize,
    /// The image a pull, upgrade or image change is about.
    pub image: Option<String>,
}

/// What a [`RolloutEvent`] reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum EventState {
    /// Journaled, about to be called.
    Intended {
        /// 1-based attempt of the command.
        attempt: u32,
    },
    /// The call succeeded.
    Done,
    /// The call came back transient; its effect will be observed.
    Unknown {
        /// The error, for a person.
        error: String,
    },
    /// Something advanced on observations alone.
    Progress {
        /// What advanced.
        note: String,
    },
    /// Waiting for something to happen (a node to come back, a drain, a window).
    Waiting {
        /// What it waits for.
        reason: String,
        /// What a person need not read to follow the job (the transport error of a node down
        /// for its reboot, as expected; issue #52): the journal's detail and `-o json` show it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// A health gate was evaluated (issue #23).
    GateEvaluated {
        /// Where in the job the gate was evaluated.
        point: crate::rollout::sequencer::GatePoint,
        /// The verdict and its evidence.
        evaluation: crate::rollout::ports::GateEvaluation,
    },
    /// A gate is closed: the job waits for it to open.
    Paused {
        /// The closed gate.
        gate: Gate,
    },
    /// A node installed ahead (`rollout.stage: ahead`) was seen rebooted outside medea's step
    /// (a new boot id): it boots the target; medea verifies it and never upgrades it again.
    RebootedExternally {
        /// When medea saw it.
        at: Timestamp,
        /// The version its reboot boots.
        boots: String,
    },
    /// The job halted.
    Halted {
        /// Serialized as `reason` (the text) and `code` (the stable halt code).
        #[serde(flatten)]
        reason: HaltReason,
    },
    /// The job succeeded.
    Succeeded,
}

impl EventState {
    /// The state's stable name on the watch API and in logs (`intended`, `waiting`, …).
    pub fn name(&self) -> &'static str {
        match self {
            EventState::Intended { .. } => "intended",
            EventState::Done => "done",
            EventState::Unknown { .. } => "unknown",
            EventState::Progress { .. } => "progress",
            EventState::Waiting { .. } => "waiting",
            EventState::GateEvaluated { .. } => "gate",
            EventState::Paused { .. } => "paused",
            EventState::RebootedExternally { .. } => "rebooted-externally",
            EventState::Halted { .. } => "halted",
            EventState::Succeeded => "succeeded",
        }
    }

    /// What a person need not read to follow the job, when there is such a thing.
    pub fn detail(&self) -> Option<&str> {
        match self {
            EventState::Waiting { detail, .. } => detail.as_deref(),
            _ => None,
        }
    }

    /// What the state says, in words ("" when its name says it all).
    pub fn message(&self) -> String {
        match self {
            EventState::Intended { attempt } => format!("attempt {attempt}"),
            EventState::Done | EventState::Succeeded => String::new(),
            EventState::Unknown { error } => error.clone(),
            EventState::Progress { note } => note.clone(),
            EventState::Waiting { reason, .. } => reason.clone(),
            EventState::GateEvaluated { point, evaluation } => format!(
                "health gate `{}` {point}: {} ({})",
                evaluation.gate,
                evaluation.verdict_text(),
                evaluation.detail
            ),
            EventState::Paused { gate } => gate.to_string(),
            EventState::RebootedExternally { at, boots } => format!(
                "rebooted outside medea after its install ahead (seen at {at}): it boots {boots}; verified, never upgraded again"
            ),
            EventState::Halted { reason } => reason.to_string(),
        }
    }
}
