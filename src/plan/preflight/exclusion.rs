//! Maintenance exclusions (`spec.maintenance.exclusions`, issue #36) against a plan: which of
//! its changes each exclusion holds (the plan's notes say so, whatever the time), and, at the
//! time the plan is computed, a blocking finding for an exclusion in force that holds some of
//! them, ending when the exclusion ends ([`Finding::until`]: the daemon plans again then),
//! and a warning for one that begins before the rollout's longest run could end.
//!
//! The executor applies the same rule per node (`rollout::sequencer`'s exclusion gate), so an
//! acknowledged finding lets the plan be approved but not a held node start.

use jiff::{SignedDuration, Timestamp};

use super::{Finding, Scope, Severity, checks};
use crate::desired::exclusion::{Change, Exclusion, ExclusionScope};
use crate::plan::model::{ClusterPlan, Step};

/// The changes of `steps` that `scope` holds, one label each, in plan order:
/// `pool workers v1.13.10 → v1.14.6 (minor)`, `kubernetes v1.34.2 → v1.35.8 (minor)`.
pub fn held(steps: &[Step], scope: ExclusionScope) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |label: String| {
        if !out.contains(&label) {
            out.push(label);
        }
    };
    for s in steps {
        match s {
            Step::Talos(t) => {
                for m in t.waves.iter().flatten() {
                    let change = Change::talos(&m.from, &t.to);
                    if scope.covers(change) {
                        push(format!(
                            "pool {} {} → {} ({})",
                            t.pool,
                            m.from,
                            t.to,
                            change.as_str()
                        ));
                    }
                }
            }
            Step::Kubernetes(k) => {
                let change = Change::kubernetes(&k.from, &k.to);
                if scope.covers(change) {
                    push(format!(
                        "kubernetes {} → {} ({})",
                        k.from,
                        k.to,
                        change.as_str()
                    ));
                }
            }
        }
    }
    out
}

/// The plan's note about exclusion `e`: when it is, what it holds, and which of `steps` it
/// holds.
pub fn note(e: &Exclusion, steps: &[Step]) -> crate::plan::note::Note {
    crate::plan::note::Note::Exclusion {
        exclusion: e.summary(),
        holds: held(steps, e.scope),
    }
}

pub(super) fn check(
    exclusions: &[Exclusion],
    plan: &ClusterPlan,
    scope: &Scope,
    now: Option<Timestamp>,
) -> Vec<Finding> {
    let Some(now) = now else {
        return Vec::new();
    };
    let run_end = SignedDuration::try_from(scope.run)
        .ok()
        .and_then(|d| now.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX);
    let mut out = Vec::new();
    for e in exclusions {
        if e.to <= now {
            continue;
        }
        let h = held(&plan.steps, e.scope);
        if h.is_empty() {
            continue;
        }
        let id = format!("exclusion/{}", e.name);
        let evidence = vec![
            format!(
                "spec.maintenance.exclusions `{}`: {} → {}, scope {}",
                e.name, e.from, e.to, e.scope
            ),
            format!("held changes: {}", h.join(", ")),
        ];
        if e.in_force(now) {
            out.push(
                Finding::new(
                    id.clone(),
                    checks::EXCLUSION,
                    Severity::Blocking,
                    format!(
                        "maintenance exclusion `{}` ({}) is in force until {}: it holds changes of this plan",
                        e.name, e.scope, e.to
                    ),
                    evidence,
                    format!(
                        "wait: medea plans again when it ends at {}; or acknowledge `{id}` under spec.preflight.acknowledge to approve now (the job still starts no held node before {})",
                        e.to, e.to
                    ),
                )
                .until(e.to),
            );
        } else if e.from < run_end {
            out.push(
                Finding::new(
                    id.clone(),
                    checks::EXCLUSION,
                    Severity::Warning,
                    format!(
                        "maintenance exclusion `{}` ({}) begins at {}, before this rollout could end: a held node not started by then waits until {}",
                        e.name, e.scope, e.from, e.to
                    ),
                    evidence,
                    "approve early enough, or move the exclusion",
                )
                .until(e.from),
            );
        }
    }
    out
}
