//! What a rehearsal found: the predicted timeline per wave and the blockers, stored with the
//! plan under [`rehearsal_key`] and never part of its id.

use serde::{Deserialize, Serialize};

/// Where the rehearsal of `plan` (full id) for `cluster` is stored.
pub fn rehearsal_key(plan: &str, cluster: &str) -> String {
    format!("rehearsal/{plan}/{cluster}")
}

/// One rehearsal of one cluster's part of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rehearsal {
    /// The plan's full id.
    pub plan: String,
    /// The cluster rehearsed.
    pub cluster: String,
    /// When the rehearsal ran (RFC 3339 UTC).
    pub ran_at: String,
    /// When the census it used was gathered; empty when there was none (nodes only).
    pub census_gathered_at: String,
    /// How much faster than real time the twin ran (60: one real minute per second).
    pub compression: u32,
    /// Where the per-node timings came from: `history of N jobs` or `defaults`.
    pub timings: String,
    /// The predicted timeline, in real (uncompressed) seconds from the job's start.
    pub waves: Vec<RehearsedWave>,
    /// How the run on the twin ended.
    pub outcome: Outcome,
    /// Everything that would stop or slow the real run, in the order met.
    pub blockers: Vec<Blocker>,
    /// What the twin could not model for this cluster (a truncated census, sources that
    /// could not be read), one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<String>,
}

/// One wave as the twin ran it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RehearsedWave {
    /// The step's label as the plan shows it (`talos controlplane`, `kubernetes`).
    pub step: String,
    /// 1-based wave number within the step.
    pub wave: usize,
    /// The wave's nodes, in the plan's order.
    pub nodes: Vec<String>,
    /// Predicted start, seconds after the job starts (real time).
    pub start_secs: u64,
    /// Predicted duration in real seconds; `None` when the wave never finished on the twin.
    pub duration_secs: Option<u64>,
}

/// How the run on the twin ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Outcome {
    /// Every step finished; `total_secs` is the predicted real duration.
    Completed {
        /// The predicted real duration of the whole job, in seconds.
        total_secs: u64,
    },
    /// The job halted on the twin, as the real one is predicted to.
    Halted {
        /// The halt code (`drain_failed`, `pool_unavailable`, …).
        code: String,
        /// The node it halted at, when the halt names one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        /// The halt's reason, as the job records it.
        reason: String,
        /// When it halted, in real seconds after the job started.
        after_secs: u64,
    },
    /// The twin could not run the plan (it could not start, or the run did not end within
    /// its bound); the reason says why. Never read as a pass.
    NotRun {
        /// Why it did not run, one line.
        reason: String,
    },
}

/// Something that would block or slow the real run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Blocker {
    /// What kind of blocker it is.
    pub kind: BlockerKind,
    /// The node it was met at, when it is about one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// One line, naming the object (`PodDisruptionBudget shop/db allows no disruption`).
    pub detail: String,
}

/// The kinds of blockers a rehearsal reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BlockerKind {
    /// A PodDisruptionBudget allowed no eviction on a node until the drain timed out.
    Pdb,
    /// A pod without a controller under `evictUnmanagedPods: false`.
    UnmanagedPod,
    /// A pod with local storage (emptyDir) under `deleteEmptyDirData: false`.
    LocalStorage,
    /// A flag or API the target version removed.
    RemovedFlag,
    /// A node's predicted time does not fit in the maintenance window.
    WindowTooShort,
    /// Any other halt of the twin's run.
    Halt,
}
