//! A rehearsal report as text for people (pure): what `medea plan --rehearse` prints after
//! the plan. The JSON form is the report's own serialization (design/rehearsal.md).

use std::fmt::Write as _;

use super::report::{BlockerKind, Outcome, Rehearsal};

/// Whole seconds as `1h02m03s`, `4m05s` or `6s`.
pub fn secs(s: u64) -> String {
    let (h, m, sec) = (s / 3600, (s % 3600) / 60, s % 60);
    if h > 0 {
        format!("{h}h{m:02}m{sec:02}s")
    } else if m > 0 {
        format!("{m}m{sec:02}s")
    } else {
        format!("{sec}s")
    }
}

fn kind(k: BlockerKind) -> &'static str {
    match k {
        BlockerKind::Pdb => "PodDisruptionBudget",
        BlockerKind::UnmanagedPod => "unmanaged pod",
        BlockerKind::LocalStorage => "local storage",
        BlockerKind::RemovedFlag => "removed flag",
        BlockerKind::WindowTooShort => "window too short",
        BlockerKind::Halt => "halt",
    }
}

/// The report, one block per cluster: outcome, timeline per wave, blockers, limits, and that
/// it is advice outside the plan id.
pub fn text(r: &Rehearsal) -> String {
    let mut out = String::new();
    let short = r.plan.get(..12).unwrap_or(&r.plan);
    let _ = writeln!(
        out,
        "rehearsal of plan {short} on a twin of cluster {} (advice, not part of the plan id)",
        r.cluster
    );
    let census = if r.census_gathered_at.is_empty() {
        "no census (nodes only)".to_string()
    } else {
        format!("census of {}", r.census_gathered_at)
    };
    let _ = writeln!(
        out,
        "  ran {} at {}× real time; {census}; timings: {}",
        r.ran_at, r.compression, r.timings
    );
    let outcome = match &r.outcome {
        Outcome::Completed { total_secs } => {
            format!("completed: predicted {}", secs(*total_secs))
        }
        Outcome::Halted {
            code,
            node,
            reason,
            after_secs,
        } => format!(
            "HALTED ({code}{}) after {}: {reason}",
            node.as_deref()
                .map(|n| format!(" at node {n}"))
                .unwrap_or_default(),
            secs(*after_secs)
        ),
        Outcome::NotRun { reason } => format!("NOT RUN (not a pass): {reason}"),
    };
    let _ = writeln!(out, "  outcome: {outcome}");
    if !r.waves.is_empty() {
        let _ = writeln!(out, "  timeline:");
        for w in &r.waves {
            let took = w
                .duration_secs
                .map_or_else(|| "did not finish".to_string(), secs);
            let _ = writeln!(
                out,
                "    {} wave {}: +{} {took} [{}]",
                w.step,
                w.wave,
                secs(w.start_secs),
                w.nodes.join(", ")
            );
        }
    }
    if r.blockers.is_empty() {
        let _ = writeln!(out, "  blockers: none met");
    } else {
        let _ = writeln!(out, "  blockers:");
        for b in &r.blockers {
            let at = b
                .node
                .as_deref()
                .map(|n| format!(" at node {n}"))
                .unwrap_or_default();
            let _ = writeln!(out, "    - {}{at}: {}", kind(b.kind), b.detail);
        }
    }
    if !r.limits.is_empty() {
        let _ = writeln!(out, "  limits of the twin:");
        for l in &r.limits {
            let _ = writeln!(out, "    - {l}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rehearsal::report::{Blocker, RehearsedWave};

    fn report(outcome: Outcome, blockers: Vec<Blocker>) -> Rehearsal {
        Rehearsal {
            plan: "0123456789abcdef".into(),
            cluster: "prod".into(),
            ran_at: "2026-01-01T00:00:00Z".into(),
            census_gathered_at: String::new(),
            compression: 60,
            timings: "defaults".into(),
            waves: vec![
                RehearsedWave {
                    step: "talos workers".into(),
                    wave: 1,
                    nodes: vec!["w-1".into(), "w-2".into()],
                    start_secs: 5,
                    duration_secs: Some(3725),
                },
                RehearsedWave {
                    step: "talos workers".into(),
                    wave: 2,
                    nodes: vec!["w-3".into()],
                    start_secs: 3730,
                    duration_secs: None,
                },
            ],
            outcome,
            blockers,
            limits: vec!["no census".into()],
        }
    }

    #[test]
    fn a_halt_names_its_node_and_blockers_and_the_report_says_it_is_advice() {
        let t = text(&report(
            Outcome::Halted {
                code: "drain_blocked".into(),
                node: Some("w-3".into()),
                reason: "drain timed out".into(),
                after_secs: 4000,
            },
            vec![Blocker {
                kind: BlockerKind::Pdb,
                node: Some("w-3".into()),
                detail: "PodDisruptionBudget shop/db allows no disruption".into(),
            }],
        ));
        assert!(t.contains("plan 0123456789ab on a twin of cluster prod (advice, not part of the plan id)"), "{t}");
        assert!(t.contains("outcome: HALTED (drain_blocked at node w-3) after 1h06m40s: drain timed out"), "{t}");
        assert!(t.contains("talos workers wave 1: +5s 1h02m05s [w-1, w-2]"), "{t}");
        assert!(t.contains("talos workers wave 2: +1h02m10s did not finish [w-3]"), "{t}");
        assert!(t.contains("- PodDisruptionBudget at node w-3: PodDisruptionBudget shop/db allows no disruption"), "{t}");
        assert!(t.contains("no census (nodes only)") && t.contains("    - no census\n"), "{t}");
    }

    #[test]
    fn not_run_is_never_shown_as_a_pass() {
        let t = text(&report(
            Outcome::NotRun {
                reason: "the twin could not start".into(),
            },
            vec![],
        ));
        assert!(t.contains("outcome: NOT RUN (not a pass): the twin could not start"), "{t}");
        assert!(!t.contains("completed"), "{t}");
    }
}
