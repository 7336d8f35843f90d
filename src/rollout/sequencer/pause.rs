//! A job paused by an inconclusive gate (issue #51 item 4): a gate with `onInconclusive:
//! pause` that reached its `inconclusiveLimit` holds the job at its point for a person, instead
//! of halting it. The job stays running (its clock stands still); `medea rollout resume`
//! ([`resume`]) clears the pause and the point's gates are checked afresh, with fresh counts.
//! No new plan is needed: nothing the approval covers changed. Pure.

use super::*;

/// Why and where a job waits for `medea rollout resume`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatePause {
    /// The point the job waits at.
    pub point: GatePoint,
    /// The gate that could not tell.
    pub gate: String,
    /// Its inconclusive evaluations in the run.
    pub evaluations: u32,
    /// The last evaluation's detail.
    pub detail: String,
    /// When the job paused.
    pub at: Timestamp,
}

impl GatePause {
    pub(super) fn new(f: &GateFailure, now: Timestamp) -> GatePause {
        GatePause {
            point: f.point.clone(),
            gate: f.gate.clone(),
            evaluations: f.failures,
            detail: f.detail.clone(),
            at: now,
        }
    }

    /// The journal note of the pause.
    pub(super) fn note(&self, job: &JobId) -> String {
        format!(
            "paused: health gate `{}` was inconclusive {} ({} evaluation(s)): {}; `medea rollout resume {job}` checks it again",
            self.gate, self.point, self.evaluations, self.detail
        )
    }

    /// What the job waits for, as status shows it.
    pub fn waiting(&self, job: &JobId) -> String {
        format!(
            "paused since {}: health gate `{}` was inconclusive {}; `medea rollout resume {job}` continues",
            self.at, self.gate, self.point
        )
    }
}

/// The job after a person's `resume` at `now`, and the journal note, or `None` when the job is
/// not paused (a resume of a running job changes nothing; a finished job is never resumed).
pub fn resume(j: &Job, by: &str, now: Timestamp) -> Option<(Job, String)> {
    if j.state.is_terminal() {
        return None;
    }
    let p = j.gates.paused.as_ref()?;
    let note = format!(
        "resumed by {by}: health gate `{}` is checked again {} with fresh counts",
        p.gate, p.point
    );
    let mut next = j.clone();
    next.gates.paused = None;
    next.gates.current = None;
    super::clock::unpause(&mut next, now);
    Some((next, note))
}

#[cfg(test)]
#[path = "pause_tests.rs"]
mod tests;
