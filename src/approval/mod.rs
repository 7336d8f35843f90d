//! Signed approvals: the SSHSIG format, allowed signers, verification, quorum, replay rules.
//!
//! **Owns:** what an approval signs (`PlanId::signed_message()`: the full lowercase hex id and one
//! `\n`, under the SSHSIG namespace [`NAMESPACE`]), the allowed_signers parser, the per-candidate
//! verification outcomes, the quorum count (against the anti-self-lowering rule of
//! [`crate::plan::bar`], re-exported from [`quorum`]), where an approval came from
//! ([`source`]), the persisted [`ApprovalRecord`], the signing adapter ([`sign`]) and the one
//! reader of the allowed_signers file ([`allowed_signers::read()`]).
//! **May depend on:** the `approval` row of design/architecture.md's code map (ids and the
//! approval bar, the bounded read of the allowed_signers file). Nothing here knows the store,
//! the server or the CLI. Inside: `record` uses `verify` and `source`; `verify` uses `source`,
//! never `record`.
//!
//! Architecture Invariant: everything but [`sign`] and [`allowed_signers::read()`] is pure: no
//! file, socket or clock access; the verification time comes in as an argument. `sign` is the
//! adapter (key files, ssh-agent socket, marker files) and nothing else in the module calls
//! it; `allowed_signers::read` reads the trust root for the server and the CLI alike.
//! Architecture Invariant: the trust root (the allowed signers) is an argument supplied by the
//! server from its own configuration, never read from the desired state; the quorum a plan
//! needs is the one in force before it ([`quorum::required_quorum`]).
//! Architecture Invariant: an approval names exactly one plan id; it never counts for another
//! plan, and a consumed plan id never starts again ([`gate::ensure_startable`]).
//!
//! See `design/approvals.md`.

pub mod allowed_signers;
pub mod gate;
pub mod quorum;
pub mod record;
pub mod sign;
pub mod source;
pub mod verify;

pub use allowed_signers::{AllowedSigners, SignerEntry, SignersDiagnostic, SignersFileError};
pub use gate::{ClosedGate, Gates, WindowState, closed_gates, ensure_startable, resolve_plan};
pub use quorum::{
    BarChange, ClusterQuorum, NotCounted, PlanScope, QuorumPolicy, QuorumStatus, evaluate,
    required_for_plan, required_quorum,
};
pub use record::ApprovalRecord;
pub use source::ApprovalSource;
pub use verify::{
    Candidate, Outcome, Verified, VerifiedApproval, VerifyContext, verify, verify_all,
};

use crate::plan::PlanId;

/// The SSHSIG namespace of approvals. Never `git`: no signed commit can pass as an approval.
pub const NAMESPACE: &str = "medea-approve";

/// Errors of approving and starting plans (the pure gate checks).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    /// No plan has this id or prefix.
    #[error("{}", unknown_plan(.input, .current.as_ref()))]
    UnknownPlan {
        /// The id or prefix as typed.
        input: String,
        /// The current plan, if there is one.
        current: Option<PlanId>,
    },
    /// The plan is not the current one.
    #[error(
        "plan {} is stale: the current plan is {}; review it with `medea plan` and approve that id",
        .plan.to_hex(), .current.to_hex()
    )]
    StalePlan {
        /// The plan the approval names.
        plan: PlanId,
        /// The current plan.
        current: PlanId,
    },
    /// The prefix matches several plans.
    #[error("plan id `{input}` is ambiguous: it matches {}; type more characters", .matches.join(", "))]
    AmbiguousPlan {
        /// The prefix as typed.
        input: String,
        /// The plan ids it matches.
        matches: Vec<String>,
    },
    /// The plan was already executed (consumed).
    #[error("plan {} was already executed; an approval cannot start a plan twice", .plan.to_hex())]
    Consumed {
        /// The executed plan.
        plan: PlanId,
    },
    /// Fewer distinct people approved than the bar requires.
    #[error("plan {} has {have} of {required} approvals from distinct people", .plan.to_hex())]
    QuorumNotReached {
        /// The plan.
        plan: PlanId,
        /// Approvals that count (one per person).
        have: u32,
        /// Approvals the bar requires.
        required: u32,
    },
}

fn unknown_plan(input: &str, current: Option<&PlanId>) -> String {
    match current {
        Some(c) => format!("no plan `{input}`; the current plan is {}", c.to_hex()),
        None => format!("no plan `{input}`, and there is no current plan (run `medea plan`)"),
    }
}

/// The plain-OpenSSH way to approve `plan`, for `medea plan` to print:
/// `echo <full-id> | ssh-keygen -Y sign -n medea-approve -f KEY > approvals/<short>-YOU.sig`.
pub fn ssh_keygen_command(plan: &PlanId) -> String {
    format!(
        "echo {} | ssh-keygen -Y sign -n {NAMESPACE} -f ~/.ssh/id_ed25519 > approvals/{}-YOU.sig",
        plan.to_hex(),
        plan.short()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_keygen_command_signs_exactly_the_signed_message() {
        let p = PlanId::from_digest([0xcd; 32]);
        let cmd = ssh_keygen_command(&p);
        // `echo X` writes X and one newline: the bytes of `signed_message()`.
        assert!(cmd.starts_with(&format!("echo {} |", p.to_hex())));
        assert_eq!(format!("{}\n", p.to_hex()).into_bytes(), p.signed_message());
        assert!(cmd.contains("-n medea-approve"));
        assert!(cmd.contains("approvals/cdcdcdcdcdcd-"));
    }
}
