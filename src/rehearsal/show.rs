//! How a stored rehearsal is shown to signers beside the plan (the API's plan view, `medea
//! plan` from the server, the dashboard): the wire names of its kinds, its outcome in one
//! line, its JSON, and the word that it is advice and not part of the plan id. The text form is
//! [`super::render::text`], the same `medea plan --rehearse` prints. Pure: the report comes in.

use super::render::secs;
use super::report::{BlockerKind, Outcome, Rehearsal};

/// What every view of a rehearsal says about it.
pub const ADVICE: &str = "advice, not part of the plan id";

/// The wire name of a blocker kind, as the report's JSON spells it.
pub fn blocker_kind(k: BlockerKind) -> &'static str {
    match k {
        BlockerKind::Pdb => "pdb",
        BlockerKind::UnmanagedPod => "unmanagedPod",
        BlockerKind::LocalStorage => "localStorage",
        BlockerKind::RemovedFlag => "removedFlag",
        BlockerKind::WindowTooShort => "windowTooShort",
        BlockerKind::Halt => "halt",
    }
}

/// The wire name of an outcome's kind, as the report's JSON spells it.
pub fn outcome_kind(o: &Outcome) -> &'static str {
    match o {
        Outcome::Completed { .. } => "completed",
        Outcome::Halted { .. } => "halted",
        Outcome::NotRun { .. } => "notRun",
    }
}

/// The outcome in one line (`completed in 42m10s`, `halted at w-2 after 12m00s (drain_blocked):
/// …`, `not run (not a pass): …`).
pub fn outcome_line(o: &Outcome) -> String {
    match o {
        Outcome::Completed { total_secs } => format!("completed in {}", secs(*total_secs)),
        Outcome::Halted {
            code,
            node,
            reason,
            after_secs,
        } => {
            let at = node
                .as_deref()
                .map(|n| format!(" at {n}"))
                .unwrap_or_default();
            format!("halted{at} after {} ({code}): {reason}", secs(*after_secs))
        }
        Outcome::NotRun { reason } => format!("not run (not a pass): {reason}"),
    }
}

/// The report as JSON (the stored record's data, camelCase), pretty-printed.
#[allow(
    clippy::expect_used,
    reason = "a report is plain structs with string keys and no non-finite floats: serializing it to JSON cannot fail"
)]
pub fn json(r: &Rehearsal) -> String {
    serde_json::to_string_pretty(r).expect("a rehearsal report serializes to JSON")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rehearsal::report::{Blocker, RehearsedWave};

    fn halted() -> Rehearsal {
        Rehearsal {
            plan: "ab".repeat(32),
            cluster: "home".into(),
            ran_at: "2026-12-06T10:00:00Z".into(),
            census_gathered_at: "2026-12-06T09:58:00Z".into(),
            compression: 60,
            timings: "history of 3 jobs".into(),
            waves: vec![
                RehearsedWave {
                    step: "talos workers".into(),
                    wave: 1,
                    nodes: vec!["w-1".into(), "w-2".into()],
                    start_secs: 0,
                    duration_secs: Some(190),
                },
                RehearsedWave {
                    step: "talos workers".into(),
                    wave: 2,
                    nodes: vec!["w-3".into()],
                    start_secs: 190,
                    duration_secs: None,
                },
            ],
            outcome: Outcome::Halted {
                code: "drain_blocked".into(),
                node: Some("w-3".into()),
                reason: "drain of w-3 timed out".into(),
                after_secs: 790,
            },
            blockers: vec![Blocker {
                kind: BlockerKind::Pdb,
                node: Some("w-3".into()),
                detail: "PodDisruptionBudget shop/db allows no disruption".into(),
            }],
            limits: vec!["census truncated at 5000 pods".into()],
        }
    }

    #[test]
    fn the_outcome_line_names_the_node_the_code_and_never_reads_not_run_as_a_pass() {
        assert_eq!(
            outcome_line(&halted().outcome),
            "halted at w-3 after 13m10s (drain_blocked): drain of w-3 timed out"
        );
        assert_eq!(
            outcome_line(&Outcome::Halted {
                code: "precheck_failed".into(),
                node: None,
                reason: "removed settings".into(),
                after_secs: 3,
            }),
            "halted after 3s (precheck_failed): removed settings"
        );
        assert_eq!(
            outcome_line(&Outcome::Completed { total_secs: 3725 }),
            "completed in 1h02m05s"
        );
        assert_eq!(
            outcome_line(&Outcome::NotRun {
                reason: "the twin could not start".into()
            }),
            "not run (not a pass): the twin could not start"
        );
    }

    #[test]
    fn wire_names_match_the_reports_json() {
        let r = halted();
        let v: serde_json::Value = serde_json::from_str(&json(&r)).unwrap();
        assert_eq!(v["outcome"]["kind"], outcome_kind(&r.outcome));
        assert_eq!(v["blockers"][0]["kind"], blocker_kind(BlockerKind::Pdb));
        for k in [
            BlockerKind::Pdb,
            BlockerKind::UnmanagedPod,
            BlockerKind::LocalStorage,
            BlockerKind::RemovedFlag,
            BlockerKind::WindowTooShort,
            BlockerKind::Halt,
        ] {
            assert_eq!(serde_json::to_value(k).unwrap(), blocker_kind(k));
        }
        for o in [
            Outcome::Completed { total_secs: 1 },
            Outcome::NotRun { reason: "x".into() },
        ] {
            assert_eq!(serde_json::to_value(&o).unwrap()["kind"], outcome_kind(&o));
        }
    }
}
