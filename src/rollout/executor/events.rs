//! What the executor reports: the gate that paused a job, how a run ended ([`RunOutcome`])
//! and the step events of the watch API ([`RolloutEvent`]).

use super::*;

/// A gate that keeps a job from making its next mutating command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "gate")]
pub enum Gate {
    GlobalRollouts,
    ClusterDisabled { cluster: String },
}

impl std::fmt::Display for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Gate::GlobalRollouts => f.write_str("rollouts are off on this server (`--rollouts`)"),
            Gate::ClusterDisabled { cluster } => {
                write!(f, "cluster `{cluster}` has rollouts disabled")
            }
        }
    }
}

/// How a [`Executor::run`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    Succeeded,
    Halted {
        reason: HaltReason,
        step: Option<usize>,
        node: Option<String>,
    },
    /// A gate is closed: the job is still running and continues when it opens (run it again).
    Paused {
        gate: Gate,
    },
}

/// A step event for the watch API and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutEvent {
    pub job: JobId,
    pub cluster: String,
    /// Index of the plan step.
    pub step: Option<usize>,
    pub pool: Option<String>,
    pub node: Option<String>,
    pub op: Option<CommandOp>,
    pub state: EventState,
    /// How many steps the job has (for "step 1/3").
    pub steps: usize,
    /// The image a pull, upgrade or image change is about.
    pub image: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum EventState {
    /// Journaled, about to be called.
    Intended {
        attempt: u32,
    },
    Done,
    /// The call came back transient; its effect will be observed.
    Unknown {
        error: String,
    },
    /// Something advanced on observations alone.
    Progress {
        note: String,
    },
    Waiting {
        reason: String,
    },
    /// A health gate was evaluated (issue #23).
    GateEvaluated {
        point: crate::rollout::sequencer::GatePoint,
        evaluation: crate::rollout::ports::GateEvaluation,
    },
    Paused {
        gate: Gate,
    },
    Halted {
        /// Serialized as `reason` (the text) and `code` (the stable halt code).
        #[serde(flatten)]
        reason: HaltReason,
    },
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
            EventState::Halted { .. } => "halted",
            EventState::Succeeded => "succeeded",
        }
    }

    /// What the state says, in words ("" when its name says it all).
    pub fn message(&self) -> String {
        match self {
            EventState::Intended { attempt } => format!("attempt {attempt}"),
            EventState::Done | EventState::Succeeded => String::new(),
            EventState::Unknown { error } => error.clone(),
            EventState::Progress { note } => note.clone(),
            EventState::Waiting { reason } => reason.clone(),
            EventState::GateEvaluated { point, evaluation } => format!(
                "health gate `{}` {point}: {} ({})",
                evaluation.gate,
                match evaluation.verdict {
                    crate::rollout::ports::GateVerdict::Pass => "pass",
                    crate::rollout::ports::GateVerdict::Fail => "fail",
                },
                evaluation.detail
            ),
            EventState::Paused { gate } => gate.to_string(),
            EventState::Halted { reason } => reason.to_string(),
        }
    }
}
