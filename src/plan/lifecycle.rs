//! A plan's lifecycle: what became of it, as one type ([`PlanState`]).
//!
//! The server decides a plan's state (from the store: current, consumed, its jobs, its
//! approvals); the API carries it as its wire string; rendering, `medea approve` and the
//! dashboard read it back through [`PlanState::from_wire`] and match on the variant, never
//! on text.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What became of a plan, from "waits for approvals" to "its rollout ended".
///
/// The wire form ([`PlanState::as_str`], serde, `Display`) is the API's and the plan JSON's
/// `state` string: `pending`, `approved`, `running`, `applied`, `halted`, `consumed`,
/// `superseded`, `blocked`, `no-changes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlanState {
    /// The current plan, with changes, waiting for approvals.
    Pending,
    /// Approved (quorum reached), not started yet: the rollout gates are closed.
    Approved,
    /// Consumed, and one of its jobs still runs.
    Running,
    /// Consumed, and every job succeeded (or it had none: settings only).
    Applied,
    /// Consumed, and a job halted.
    Halted,
    /// Consumed, and a job of it is no longer in the store.
    Consumed,
    /// No longer the current plan.
    Superseded,
    /// The current plan, with blocking preflight findings nobody acknowledged: it cannot be
    /// approved.
    Blocked,
    /// The current plan, with nothing to do.
    NoChanges,
    /// Computed by the server from files sent to it (`PreviewPlan`), never stored: it cannot
    /// be approved.
    Preview,
}

impl PlanState {
    /// Every state, in lifecycle order.
    pub const ALL: [PlanState; 10] = [
        PlanState::Pending,
        PlanState::Approved,
        PlanState::Running,
        PlanState::Applied,
        PlanState::Halted,
        PlanState::Consumed,
        PlanState::Superseded,
        PlanState::Blocked,
        PlanState::NoChanges,
        PlanState::Preview,
    ];

    /// The wire string (API `Plan.state`, the plan JSON's `state`).
    pub fn as_str(self) -> &'static str {
        match self {
            PlanState::Pending => "pending",
            PlanState::Approved => "approved",
            PlanState::Running => "running",
            PlanState::Applied => "applied",
            PlanState::Halted => "halted",
            PlanState::Consumed => "consumed",
            PlanState::Superseded => "superseded",
            PlanState::Blocked => "blocked",
            PlanState::NoChanges => "no-changes",
            PlanState::Preview => "preview",
        }
    }

    /// The state a wire string names; `None` for a string no version of medea sends (an
    /// older or newer server's, or none at all).
    pub fn from_wire(s: &str) -> Option<PlanState> {
        PlanState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// What became of a plan once it left "pending", in a sentence (for `medea plan` against
    /// a server); `None` while it still waits for approvals or has nothing to do.
    pub fn sentence(self) -> Option<&'static str> {
        Some(match self {
            PlanState::Approved => {
                "approved: it starts when the rollout gates open (`medea get server`, `medea cluster enable-rollouts`)"
            }
            // the summary line names the command per cluster (`render::summary_line`)
            PlanState::Running => "approved and running",
            PlanState::Applied => "approved and applied: nothing is left to approve",
            PlanState::Halted => "approved, and its rollout halted: see `medea rollout list`",
            PlanState::Consumed => "approved and consumed: nothing is left to approve",
            PlanState::Superseded => "superseded by a newer plan: nothing is left to approve here",
            PlanState::Blocked => {
                "blocked by preflight findings: it cannot be approved until they are fixed or acknowledged (`spec.preflight.acknowledge`)"
            }
            PlanState::Preview => {
                "a preview of an edit the server does not plan yet: it cannot be approved; commit the edit (or write it where the server reads) and the server plans it"
            }
            PlanState::Pending | PlanState::NoChanges => return None,
        })
    }

    /// Whether a plan in this state still offers the approve and sign commands (its
    /// rendering's, its JSON's): only while it waits for approvals.
    pub fn offers_approval(self) -> bool {
        self.sentence().is_none()
    }
}

impl fmt::Display for PlanState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_strings_are_the_apis_and_round_trip() {
        let wire: Vec<&str> = PlanState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            wire,
            [
                "pending",
                "approved",
                "running",
                "applied",
                "halted",
                "consumed",
                "superseded",
                "blocked",
                "no-changes",
                "preview"
            ]
        );
        for s in PlanState::ALL {
            assert_eq!(PlanState::from_wire(s.as_str()), Some(s));
            assert_eq!(s.to_string(), s.as_str());
            // serde agrees with the wire form (the plan JSON's `state`).
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
            assert_eq!(
                serde_json::from_str::<PlanState>(&format!("\"{s}\"")).unwrap(),
                s
            );
        }
        assert_eq!(PlanState::from_wire("Pending"), None);
        assert_eq!(PlanState::from_wire(""), None);
        assert_eq!(PlanState::from_wire("no_changes"), None);
    }

    #[test]
    fn only_a_pending_plan_or_one_without_changes_offers_approval() {
        let offering: Vec<PlanState> = PlanState::ALL
            .into_iter()
            .filter(|s| s.offers_approval())
            .collect();
        assert_eq!(offering, [PlanState::Pending, PlanState::NoChanges]);
    }
}
