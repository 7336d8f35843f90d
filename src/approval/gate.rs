//! Pure checks around approving and starting a plan: which plan an operator means, whether an
//! approved plan may start, and which other gates are still closed.
//!
//! The store calls [`ensure_startable`] inside the transaction that records the approval
//! reaching quorum and creates the job, with the current plan and the consumed flag read in
//! that same transaction.

use std::fmt;

use jiff::Timestamp;

use super::ApprovalError;
use super::quorum::QuorumStatus;
use crate::plan::{PlanId, PlanIdRef};

/// Resolve what an operator typed (`medea approve <id>`) against the current plan and the plans
/// the store knows. Only the current plan resolves; an older one is `Stale`, an unknown one
/// `UnknownPlan`, both naming the current plan.
pub fn resolve_plan(
    input: &PlanIdRef,
    current: Option<&PlanId>,
    known: &[PlanId],
) -> Result<PlanId, ApprovalError> {
    if let Some(c) = current
        && input.matches(c)
    {
        let others: Vec<&PlanId> = known
            .iter()
            .filter(|k| *k != c && input.matches(k))
            .collect();
        if !others.is_empty() {
            return Err(ApprovalError::AmbiguousPlan {
                input: input.as_str().to_string(),
                matches: std::iter::once(c)
                    .chain(others)
                    .map(PlanId::to_hex)
                    .collect(),
            });
        }
        return Ok(*c);
    }
    let matching: Vec<&PlanId> = known.iter().filter(|k| input.matches(k)).collect();
    match (matching.as_slice(), current) {
        ([], _) => Err(ApprovalError::UnknownPlan {
            input: input.as_str().to_string(),
            current: current.copied(),
        }),
        ([one], Some(c)) => Err(ApprovalError::StalePlan {
            plan: **one,
            current: *c,
        }),
        ([one], None) => Err(ApprovalError::UnknownPlan {
            input: one.to_hex(),
            current: None,
        }),
        (many, _) => Err(ApprovalError::AmbiguousPlan {
            input: input.as_str().to_string(),
            matches: many.iter().map(|p| p.to_hex()).collect(),
        }),
    }
}

/// Whether `plan` may start now: it is the current plan, it was never executed, and `status`
/// (for this plan) has reached quorum. Replay protection is the `consumed` check: a plan id that
/// started a job once never starts another, whatever approvals exist for it.
pub fn ensure_startable(
    plan: &PlanId,
    current: &PlanId,
    consumed: bool,
    status: &QuorumStatus,
) -> Result<(), ApprovalError> {
    if plan != current {
        return Err(ApprovalError::StalePlan {
            plan: *plan,
            current: *current,
        });
    }
    if consumed {
        return Err(ApprovalError::Consumed { plan: *plan });
    }
    if status.plan != *plan || !status.reached() {
        return Err(ApprovalError::QuorumNotReached {
            plan: *plan,
            have: if status.plan == *plan {
                status.count()
            } else {
                0
            },
            required: status.required,
        });
    }
    Ok(())
}

/// The other gates a job needs besides approval (invariant 1 in the architecture).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gates {
    /// The server's global `--rollouts` switch.
    pub global_rollouts: bool,
    /// Per cluster of the plan: its name and `rolloutsEnabled`.
    pub clusters: Vec<(String, bool)>,
    /// The maintenance window, when one is configured.
    pub window: Option<WindowState>,
}

/// Whether the maintenance window is open now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowState {
    /// Open now.
    Open,
    /// Closed now.
    Closed {
        /// When it opens next, if it ever does.
        next_open: Option<Timestamp>,
    },
}

/// A gate that keeps an approved plan from starting. Display tells how to open it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClosedGate {
    /// The daemon runs without `--rollouts`.
    GlobalRollouts,
    /// A cluster of the plan has `rolloutsEnabled: false`.
    ClusterDisabled {
        /// The cluster's name.
        cluster: String,
    },
    /// The maintenance window is closed.
    Window {
        /// When the window opens next, if it ever does.
        next_open: Option<Timestamp>,
    },
}

impl fmt::Display for ClosedGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClosedGate::GlobalRollouts => f.write_str(
                "rollouts are off on the server: nothing starts until it runs with `--rollouts`",
            ),
            ClosedGate::ClusterDisabled { cluster } => write!(
                f,
                "cluster `{cluster}` has rollouts disabled: `medea cluster enable-rollouts {cluster}` lets its jobs start"
            ),
            ClosedGate::Window { next_open: Some(t) } => {
                write!(
                    f,
                    "outside the maintenance window: the job waits until it opens at {t}"
                )
            }
            ClosedGate::Window { next_open: None } => {
                f.write_str("outside the maintenance window, and no future window is scheduled")
            }
        }
    }
}

/// The gates still closed, in the order an operator should open them.
pub fn closed_gates(g: &Gates) -> Vec<ClosedGate> {
    let mut out = Vec::new();
    if !g.global_rollouts {
        out.push(ClosedGate::GlobalRollouts);
    }
    for (cluster, enabled) in &g.clusters {
        if !enabled {
            out.push(ClosedGate::ClusterDisabled {
                cluster: cluster.clone(),
            });
        }
    }
    if let Some(WindowState::Closed { next_open }) = g.window {
        out.push(ClosedGate::Window { next_open });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::quorum::evaluate;

    fn plan(b: u8) -> PlanId {
        PlanId::from_digest([b; 32])
    }
    fn r(s: &str) -> PlanIdRef {
        PlanIdRef::parse(s).unwrap()
    }

    #[test]
    fn resolves_only_the_current_plan() {
        let (a, b) = (plan(0xaa), plan(0xbb));
        assert_eq!(resolve_plan(&r(&b.short()), Some(&b), &[a, b]).unwrap(), b);
        assert_eq!(resolve_plan(&r(&b.to_hex()), Some(&b), &[]).unwrap(), b);
        let e = resolve_plan(&r(&a.short()), Some(&b), &[a, b]).unwrap_err();
        assert!(
            matches!(e, ApprovalError::StalePlan { plan, current } if plan == a && current == b)
        );
        assert!(e.to_string().contains(&b.to_hex()), "{e}");
        let e = resolve_plan(&r("cccccccccccc"), Some(&b), &[a, b]).unwrap_err();
        assert!(matches!(e, ApprovalError::UnknownPlan { .. }));
        assert!(e.to_string().contains(&b.to_hex()), "{e}");
        let e = resolve_plan(&r("cccccccccccc"), None, &[]).unwrap_err();
        assert!(e.to_string().contains("no current plan"), "{e}");
        let mut x = [0xab; 32];
        x[31] = 1;
        let e = resolve_plan(
            &r(&plan(0xab).short()),
            None,
            &[plan(0xab), PlanId::from_digest(x)],
        )
        .unwrap_err();
        assert!(matches!(e, ApprovalError::AmbiguousPlan { .. }));
    }

    #[test]
    fn startable_only_when_current_unconsumed_and_quorate() {
        let (a, b) = (plan(1), plan(2));
        let none = evaluate(&a, 1, vec![]);
        assert!(matches!(
            ensure_startable(&a, &a, false, &none),
            Err(ApprovalError::QuorumNotReached {
                have: 0,
                required: 1,
                ..
            })
        ));
        assert!(matches!(
            ensure_startable(&a, &b, false, &none),
            Err(ApprovalError::StalePlan { .. })
        ));
        let alice = crate::approval::verify::VerifiedApproval {
            plan: a,
            principal: "alice@x".into(),
            principals: vec!["alice@x".into()],
            fingerprint: "SHA256:k".into(),
            key_type: "ED25519".into(),
            signers_line: 1,
            source: crate::approval::ApprovalSource::Api,
        };
        let ok = evaluate(&a, 1, vec![alice.clone()]);
        assert!(ensure_startable(&a, &a, false, &ok).is_ok());
        let e = ensure_startable(&a, &a, true, &ok).unwrap_err();
        assert!(matches!(e, ApprovalError::Consumed { .. }));
        assert!(e.to_string().contains("already executed"), "{e}");
        // a status for another plan never opens this one
        let other = evaluate(
            &b,
            1,
            vec![crate::approval::verify::VerifiedApproval { plan: b, ..alice }],
        );
        assert!(other.reached());
        assert!(matches!(
            ensure_startable(&a, &a, false, &other),
            Err(ApprovalError::QuorumNotReached { .. })
        ));
    }

    #[test]
    fn closed_gates_say_how_to_open_them() {
        let g = Gates {
            global_rollouts: false,
            clusters: vec![("prod".into(), false), ("dev".into(), true)],
            window: Some(WindowState::Closed {
                next_open: Some("2025-06-01T02:00:00Z".parse().unwrap()),
            }),
        };
        let c = closed_gates(&g);
        assert_eq!(c.len(), 3);
        assert!(c[0].to_string().contains("--rollouts"));
        assert!(c[1].to_string().contains("cluster `prod`"));
        assert!(c[2].to_string().contains("2025-06-01T02:00:00Z"));
        let open = Gates {
            global_rollouts: true,
            clusters: vec![("dev".into(), true)],
            window: Some(WindowState::Open),
        };
        assert!(closed_gates(&open).is_empty());
    }
}
