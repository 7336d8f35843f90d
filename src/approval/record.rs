//! The persisted form of an approval (the store keeps these; the API returns them).
//!
//! A record keeps the armored signature itself, so that whenever quorum is evaluated the
//! approval is verified again against the allowed signers in force *then*: removing a signer
//! (revocation) or an expired key takes effect on approvals recorded earlier.
//!
//! The record declares its encoding here, where it is defined (`store::Record`, table
//! `Approvals`, key [`approval_key`]); reading and committing it is `ops::approvals` and the
//! reconcile pass.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

pub use super::source::ApprovalSource;
use super::verify::{Outcome, VerifiedApproval, VerifyContext, verify};
use crate::plan::PlanId;
use crate::store::{Record, Table};

/// One recorded approval: who approved which plan, with which key, from where, when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    /// The full plan id (serialized as 64 hex characters).
    pub plan: PlanId,
    /// The canonical principal (the first on the signer's allowed_signers line).
    pub principal: String,
    /// `SHA256:...` of the signing key.
    pub fingerprint: String,
    /// Where the approval came from (a marker file or the API).
    pub source: ApprovalSource,
    /// When medea recorded the approval (RFC 3339, UTC).
    pub at: Timestamp,
    /// The armored SSHSIG, so the approval can be verified again later.
    pub signature: String,
}

impl ApprovalRecord {
    /// Record a verified approval at time `at`.
    pub fn new(approval: &VerifiedApproval, armored: &str, at: Timestamp) -> ApprovalRecord {
        ApprovalRecord {
            plan: approval.plan,
            principal: approval.principal.clone(),
            fingerprint: approval.fingerprint.clone(),
            source: approval.source.clone(),
            at,
            signature: armored.to_string(),
        }
    }

    /// Verify the recorded signature again under `ctx` (the trust root and plan state of now).
    /// An approval of another plan than `ctx.current` does not come out `Approved`.
    pub fn reverify(&self, ctx: &VerifyContext<'_>) -> Outcome {
        verify(&self.signature, self.source.clone(), ctx)
    }
}

impl Record for ApprovalRecord {
    const TABLE: Table = Table::Approvals;
    const KIND: &'static str = "approval";
    const SCHEMA: u32 = 1;
}

/// `<plan hex>/<key fingerprint>`: one approval per key per plan.
pub fn approval_key(plan: &PlanId, fingerprint: &str) -> String {
    format!("{}{fingerprint}", approvals_prefix(plan))
}

/// `<plan hex>/`: the keys of every approval of `plan`.
pub fn approvals_prefix(plan: &PlanId) -> String {
    format!("{}/", plan.to_hex())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_shape_is_stable() {
        let r = ApprovalRecord {
            plan: PlanId::from_digest([0xab; 32]),
            principal: "alice@example.com".into(),
            fingerprint: "SHA256:abc".into(),
            source: ApprovalSource::Marker {
                path: "approvals/abababababab-alice@example.com.sig".into(),
            },
            at: "2025-06-01T12:00:00Z".parse().unwrap(),
            signature: "-----BEGIN SSH SIGNATURE-----\n...".into(),
        };
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["plan"], "ab".repeat(32));
        assert_eq!(json["source"]["kind"], "marker");
        assert_eq!(json["at"], "2025-06-01T12:00:00Z");
        let back: ApprovalRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, r);
        let api = serde_json::to_value(ApprovalSource::Api).unwrap();
        assert_eq!(api, serde_json::json!({"kind": "api"}));
    }
}
