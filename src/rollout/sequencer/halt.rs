//! Why a job halted: [`HaltReason`] is the text people read (unchanged from when halts were
//! free text) and a stable [`HaltCode`] for machines (JSON `haltCode`, webhooks, tests).

use super::*;

/// Why a job halted. [`fmt::Display`] is the text people read; [`HaltReason::code`] is the
/// stable machine code. In a job record the text stays in `reason` and the code is stored
/// beside it as `code` (records written before it existed read as [`HaltCode::Unrecorded`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaltReason {
    #[serde(default)]
    code: HaltCode,
    #[serde(rename = "reason")]
    message: String,
    /// The failed health gate, for the halts of [`HaltCode::GateFailed`],
    /// [`HaltCode::GateInconclusive`] and [`HaltCode::RolledBack`]: the gate, where, and its last samples.
    #[serde(
        default,
        rename = "gateFailure",
        skip_serializing_if = "Option::is_none"
    )]
    gate: Option<Box<GateFailure>>,
    /// What, typed, a halt of a refused drain or a failed pre-check is about (issue #50: a
    /// report classifies the halt by this, never by its text). Not written when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cause: Option<HaltCause>,
}

/// The typed cause of a halt whose code alone does not say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum HaltCause {
    /// A drain refused to start for pods the pool's drain policy keeps.
    DrainRefused {
        /// Which pods.
        refusal: crate::rollout::ports::Refusal,
    },
    /// The Kubernetes step's pre-check found settings the target version removed.
    RemovedSettings,
}

impl HaltReason {
    /// A halt reason with its code and its message.
    pub fn new(code: HaltCode, message: impl Into<String>) -> HaltReason {
        HaltReason {
            code,
            message: message.into(),
            gate: None,
            cause: None,
        }
    }

    /// This halt, with its typed cause.
    pub fn with_cause(mut self, cause: HaltCause) -> HaltReason {
        self.cause = Some(cause);
        self
    }

    /// The typed cause, when it has one ([`HaltCause`]).
    pub fn cause(&self) -> Option<HaltCause> {
        self.cause
    }

    /// A halt for a failed health gate; the text names the gate and its last samples.
    pub fn gate(code: HaltCode, failure: GateFailure) -> HaltReason {
        HaltReason {
            code,
            message: failure.to_string(),
            gate: Some(Box::new(failure)),
            cause: None,
        }
    }

    /// A halt caused by a gate failure, with its own text (a rollback that failed).
    pub fn gate_message(
        code: HaltCode,
        message: impl Into<String>,
        failure: GateFailure,
    ) -> HaltReason {
        HaltReason {
            code,
            message: message.into(),
            gate: Some(Box::new(failure)),
            cause: None,
        }
    }

    /// The failed gate of a gate halt.
    pub fn gate_failure(&self) -> Option<&GateFailure> {
        self.gate.as_deref()
    }

    /// The code.
    pub fn code(&self) -> HaltCode {
        self.code
    }

    /// The text people read (the same as [`fmt::Display`]).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for HaltReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The kind of a halt, stable across releases: what JSON output (`haltCode`), webhooks and
/// alerts key on. [`HaltCode::as_str`] is the wire form (`snake_case`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HaltCode {
    /// An operator asked for it (`medea rollout halt`).
    OperatorRequest,
    /// A Talos `Upgrade` the node answered with a failure, `rollout.upgradeAttempts` times.
    UpgradeRefused,
    /// Lost Upgrade replies that left no trace, until the health timeout.
    UpgradeNotMade,
    /// Another command the node or the apiserver answered with a definite failure.
    CommandFailed,
    /// A PodDisruptionBudget still refused an eviction at the drain timeout.
    DrainBlocked,
    /// `VolumeAttachment`s still named the drained node at `drain.volumeDetachTimeout`: it
    /// was not rebooted (a reboot would leave their volumes attached to it).
    VolumesAttached,
    /// The node came back on the previous version (the boot fell back).
    NodeReverted,
    /// A node runs (or has staged) a version the plan did not expect.
    UnexpectedVersion,
    /// A rebooted node was not back (booted, ready, healthy) within the health timeout.
    NodeNotBack,
    /// etcd was not healthy (or would lose quorum) before a control-plane node.
    EtcdUnhealthy,
    /// A control-plane component or kubelet did not reach the target (image, config version,
    /// Ready) within the step's health timeout.
    ComponentNotReady,
    /// The control plane was unhealthy before a component was patched.
    ControlPlaneUnhealthy,
    /// A pre-check of the Kubernetes step failed (Talos support, version skew, removed settings).
    PrecheckFailed,
    /// The outcome of a journaled command could not be told (the node cannot say, or not
    /// before the timeout).
    OutcomeUnknown,
    /// Something needed could not be observed: unreachable until the timeout, or a definite
    /// read error.
    ObservationFailed,
    /// The job's maintenance windows are invalid or never open again.
    MaintenanceWindow,
    /// No control-plane node to take the etcd snapshot from.
    NoSnapshotNode,
    /// The job record contradicts itself (a bug; the job stops rather than guess).
    Inconsistent,
    /// A health gate failed `failureLimit` consecutive evaluations (before the job, before a
    /// wave, or during a soak); nothing further was touched.
    GateFailed,
    /// A health gate could not be evaluated `inconclusiveLimit` times since it last passed
    /// (source unreachable, query error or timeout, no value; issue #35): medea could not
    /// tell whether the cluster is healthy, so it touched nothing further. Never a rollback.
    GateInconclusive,
    /// A health gate failed after a wave and the pool's `onFailure: rollback` rolled the
    /// wave's nodes back to their previous version.
    RolledBack,
    /// Rolling a node back (after a failed gate) did not bring it back on its previous version.
    RollbackFailed,
    /// Alertmanager refused (or did not answer) the silence of a node's expected alerts, and
    /// `health.silence.onError` is `halt`: the node was not cordoned (issue #35).
    SilenceRefused,
    /// A blocking hook failed: an HTTP hook got no 2xx answer within its timeout, a Job hook
    /// failed or did not complete within it (issue #35). The halt names the hook and point.
    HookFailed,
    /// medea stopped while a hook that is not `idempotent` ran, so whether it ran is unknown;
    /// it is never run twice, so the job halts and a person decides (issue #35).
    HookInterrupted,
    /// No node of a wave could start: the pool's nodes already unavailable (NotReady, or
    /// cordoned by someone else) used up `maxUnavailable` (the control plane's one) and stayed
    /// so for the pool's `healthTimeout` (issue #35, pacing). Nothing of the wave was touched.
    PoolUnavailable,
    /// A control-plane node still led etcd at its health timeout, its forfeits of the
    /// leadership failing (issue #48): it was not rebooted.
    LeadershipKept,
    /// Halted before halt codes were recorded.
    #[default]
    Unrecorded,
}

impl HaltCode {
    /// The stable wire form, e.g. `upgrade_refused`.
    pub fn as_str(self) -> &'static str {
        match self {
            HaltCode::OperatorRequest => "operator_request",
            HaltCode::UpgradeRefused => "upgrade_refused",
            HaltCode::UpgradeNotMade => "upgrade_not_made",
            HaltCode::CommandFailed => "command_failed",
            HaltCode::DrainBlocked => "drain_blocked",
            HaltCode::VolumesAttached => "volumes_attached",
            HaltCode::NodeReverted => "node_reverted",
            HaltCode::UnexpectedVersion => "unexpected_version",
            HaltCode::NodeNotBack => "node_not_back",
            HaltCode::EtcdUnhealthy => "etcd_unhealthy",
            HaltCode::ComponentNotReady => "component_not_ready",
            HaltCode::ControlPlaneUnhealthy => "control_plane_unhealthy",
            HaltCode::PrecheckFailed => "precheck_failed",
            HaltCode::OutcomeUnknown => "outcome_unknown",
            HaltCode::ObservationFailed => "observation_failed",
            HaltCode::MaintenanceWindow => "maintenance_window",
            HaltCode::NoSnapshotNode => "no_snapshot_node",
            HaltCode::Inconsistent => "inconsistent",
            HaltCode::GateFailed => "gate_failed",
            HaltCode::GateInconclusive => "gate_inconclusive",
            HaltCode::RolledBack => "rolled_back",
            HaltCode::RollbackFailed => "rollback_failed",
            HaltCode::SilenceRefused => "silence_refused",
            HaltCode::HookFailed => "hook_failed",
            HaltCode::HookInterrupted => "hook_interrupted",
            HaltCode::PoolUnavailable => "pool_unavailable",
            HaltCode::LeadershipKept => "etcd_leadership_kept",
            HaltCode::Unrecorded => "unrecorded",
        }
    }
}

impl fmt::Display for HaltCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
