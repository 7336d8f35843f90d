//! Rollouts: the job state machine and the executor that drives it against production.
//!
//! **Owns:** jobs born from approved plans ([`job::create_jobs_txn`]), the pure job/step state
//! machine ([`sequencer`], with the typed halt reasons [`HaltReason`]/[`HaltCode`]), the
//! journal's records, deltas and replay ([`journal`]), the executor ([`executor`]), the port
//! traits it drives ([`ports`]) and in-memory fakes of them (`fake`: test support, compiled
//! only for tests and with the `fakes` feature, so a release binary carries no fake cluster).
//! **May depend on:** the `rollout` row of design/architecture.md's code map (the one list,
//! checked by `tests/it/architecture.rs`); its own ports. Never the Talos or Kubernetes
//! clients: the port implementations over them live at the edge (the clients' adapters, built
//! per cluster by the application layer), and loading jobs for the daemon and the CLI is the
//! application layer's.
//!
//! Architecture Invariant: [`sequencer`] and [`journal`] are pure: no tokio, no filesystem, no
//! network, no clock (`tests/it/architecture.rs` enforces it). Time and observations are
//! arguments; the journal builds transactions and folds entries it is given.
//! Architecture Invariant: no mutating call without a job (born from an approved, current,
//! never-consumed plan), the global `--rollouts` gate and the cluster's `rolloutsEnabled`; both
//! gates and halt requests are re-checked before every mutating command.
//! Architecture Invariant: intent before action: a command is journaled (fsync'd) before it is
//! made, and its outcome is journaled before the next decision. A journaled command without an
//! outcome is resolved by observing the node, never by repeating it blindly; a Talos `Upgrade`
//! is called again only when the node answered the previous call with a definitive failure (at
//! most `rollout.upgradeAttempts` of those) or proves it left no trace (within the health
//! timeout); never two in flight, at most one takes effect.
//! Architecture Invariant: the first failure halts the job (a failed Upgrade: the
//! `rollout.upgradeAttempts`-th), and a halted job never continues.
//!
//! See `design/rollout.md`.

pub mod executor;
#[cfg(any(test, feature = "fakes"))]
pub mod fake;
pub mod history;
pub mod job;
pub mod journal;
pub mod ports;
pub mod removed;
pub mod sequencer;

pub use executor::{
    Clock, CommitFence, CrashPoints, EventState, Executor, ExecutorConfig, Gate, NoFence,
    RolloutEvent, RunOutcome, SystemClock, TokioClock, request_halt,
};
pub use job::{Created, JobInputs, create_jobs_txn};
pub use sequencer::{HaltCode, HaltReason, Job, JobId, JobState};

use crate::plan::PlanId;
use crate::store::StoreError;

/// Errors of creating and running jobs.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// The server runs without `--rollouts`.
    #[error("rollouts are off on this server: start it with `--rollouts` to let jobs run")]
    RolloutsOff,
    /// The plan has blocking preflight findings nobody acknowledged (issue #22): it is never
    /// started, whatever approvals it has.
    #[error("{refusal}")]
    BlockingFindings {
        /// Why the plan is refused, naming the findings.
        refusal: String,
    },
    /// A cluster of the plan has `rolloutsEnabled: false`.
    #[error(
        "cluster `{cluster}` has rollouts disabled: enable them (`rolloutsEnabled`) before starting a job"
    )]
    ClusterDisabled {
        /// The cluster's name.
        cluster: String,
    },
    /// A cluster of the plan was never observed.
    #[error("cluster `{cluster}` has never been observed: refresh the inventory first")]
    UnknownCluster {
        /// The cluster's name.
        cluster: String,
    },
    /// The cluster's observed generation moved since the plan was computed.
    #[error(
        "plan {} is stale for cluster `{cluster}`: it was computed at observed generation {}, the cluster is now at {observed}; run `medea plan` again",
        .plan.to_hex(), .planned.map(|g| g.to_string()).unwrap_or_else(|| "none".into())
    )]
    StalePlan {
        /// The plan.
        plan: PlanId,
        /// The cluster's name.
        cluster: String,
        /// The generation the plan was computed at.
        planned: Option<u64>,
        /// The generation now.
        observed: u64,
    },
    /// A node the plan targets is not in the inventory.
    #[error("node `{node}` of cluster `{cluster}` is not in the observed inventory")]
    UnknownMachine {
        /// The cluster's name.
        cluster: String,
        /// The node.
        node: String,
    },
    /// The plan has no rollout step.
    #[error("plan {} has no rollout steps: there is nothing to run", .plan.to_hex())]
    NothingToRun {
        /// The plan.
        plan: PlanId,
    },
    /// No job has this id.
    #[error("no job `{job}`")]
    UnknownJob {
        /// The id as given.
        job: String,
    },
    /// The job already ended.
    #[error(
        "job `{job}` already finished; a finished job cannot be halted or resumed (a new plan continues its work)"
    )]
    AlreadyFinished {
        /// The job.
        job: String,
    },
    /// `resume` of a job that no inconclusive gate paused (issue #51 item 4).
    #[error(
        "job `{job}` is not paused; `medea rollout resume` continues a job an inconclusive gate with `onInconclusive: pause` stopped (a halted job needs a new plan)"
    )]
    NotPaused {
        /// The job.
        job: String,
    },
    /// Another writer changed the job (another medea, or leadership lost).
    #[error(
        "job `{job}` was changed by someone else while this executor ran it (another medea, or leadership lost); stopping"
    )]
    Fenced {
        /// The job.
        job: String,
        /// The refused commit.
        #[source]
        err: StoreError,
    },
    /// The store failed.
    #[error("store failed while running job `{job}`")]
    Store {
        /// The job.
        job: String,
        /// What the store failed with.
        #[source]
        err: StoreError,
    },
}
