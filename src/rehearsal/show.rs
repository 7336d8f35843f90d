//! How a stored rehearsal is shown to signers beside the plan (the API's plan view, `medea
//! plan` from the server, the dashboard): one text form and the report's JSON, each saying
//! that the rehearsal is advice and not part of the plan id. Pure: the report comes in.

use std::fmt::Write as _;

use super::report::{BlockerKind, Outcome, Rehearsal};
use crate::plan::estimate::human;

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

/// A blocker kind in words, for people.
pub fn blocker_label(k: BlockerKind) -> &'static str {
    match k {
        BlockerKind::Pdb => "PodDisruptionBudget",
        BlockerKind::UnmanagedPod => "unmanaged pod",
        BlockerKind::LocalStorage => "local storage",
        BlockerKind::RemovedFlag => "removed flag",
        BlockerKind::WindowTooShort => "window too short",
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
/// …`, `not run: …`).
pub fn outcome_line(o: &Outcome) -> String {
    match o {
        Outcome::Completed { total_secs } => format!("completed in {}", human(*total_secs)),
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
            format!("halted{at} after {} ({code}): {reason}", human(*after_secs))
        }
        Outcome::NotRun { reason } => format!("not run: {reason}"),
    }
}

/// Where the twin's workloads came from, in words.
pub fn census_line(r: &Rehearsal) -> String {
    if r.census_gathered_at.is_empty() {
        "no workload census (nodes only)".to_string()
    } else {
        format!("the census gathered at {}", r.census_gathered_at)
    }
}

/// The report as text, after the plan: outcome, blockers, the timeline per wave and the
/// limits of the twin, headed by the cluster and the word that it is advice.
pub fn text(r: &Rehearsal) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "rehearsal of cluster {} ({ADVICE})", r.cluster);
    let _ = writeln!(
        s,
        "  ran {} on {}; time compressed {}x; timings: {}",
        r.ran_at,
        census_line(r),
        r.compression,
        r.timings
    );
    let _ = writeln!(s, "  outcome: {}", outcome_line(&r.outcome));
    if r.blockers.is_empty() {
        let _ = writeln!(s, "  blockers: none met");
    } else {
        let _ = writeln!(s, "  blockers:");
        for b in &r.blockers {
            let at = b
                .node
                .as_deref()
                .map(|n| format!(" on node {n}"))
                .unwrap_or_default();
            let _ = writeln!(s, "    - {}{at}: {}", blocker_label(b.kind), b.detail);
        }
    }
    if !r.waves.is_empty() {
        let _ = writeln!(s, "  timeline (real time from the job's start):");
        for w in &r.waves {
            let took = w
                .duration_secs
                .map(|d| format!("takes {}", human(d)))
                .unwrap_or_else(|| "did not finish".to_string());
            let _ = writeln!(
                s,
                "    {} wave {}: starts at +{}, {}; {}",
                w.step,
                w.wave,
                human(w.start_secs),
                took,
                w.nodes.join(", ")
            );
        }
    }
    if !r.limits.is_empty() {
        let _ = writeln!(s, "  limits of the twin:");
        for l in &r.limits {
            let _ = writeln!(s, "    - {l}");
        }
    }
    s
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
    fn the_text_names_the_outcome_the_blocker_and_its_node_the_waves_and_says_it_is_advice() {
        let t = text(&halted());
        let expected = "\
rehearsal of cluster home (advice, not part of the plan id)
  ran 2026-12-06T10:00:00Z on the census gathered at 2026-12-06T09:58:00Z; time compressed 60x; timings: history of 3 jobs
  outcome: halted at w-3 after 13m10s (drain_blocked): drain of w-3 timed out
  blockers:
    - PodDisruptionBudget on node w-3: PodDisruptionBudget shop/db allows no disruption
  timeline (real time from the job's start):
    talos workers wave 1: starts at +0s, takes 3m10s; w-1, w-2
    talos workers wave 2: starts at +3m10s, did not finish; w-3
  limits of the twin:
    - census truncated at 5000 pods
";
        assert_eq!(t, expected);
    }

    #[test]
    fn a_completed_run_without_census_or_blockers_says_so() {
        let r = Rehearsal {
            census_gathered_at: String::new(),
            outcome: Outcome::Completed { total_secs: 3725 },
            blockers: vec![],
            limits: vec![],
            waves: vec![],
            ..halted()
        };
        let t = text(&r);
        assert!(t.contains("on no workload census (nodes only)"), "{t}");
        assert!(t.contains("outcome: completed in 1h02m"), "{t}");
        assert!(t.contains("blockers: none met"), "{t}");
        assert!(!t.contains("limits"), "{t}");
        assert!(!t.contains("timeline"), "{t}");
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
