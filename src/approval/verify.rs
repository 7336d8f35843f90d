//! Verifying one approval signature against the current plan and the allowed signers.
//!
//! The order of the checks, and so which outcome a candidate gets when several things are wrong:
//! 1. it must be an armored SSHSIG (`Malformed` otherwise);
//! 2. its namespace must be `medea-approve` (`WrongNamespace`; a git commit signature uses `git`);
//! 3. its signature algorithm must fit its key (`BadSignature`);
//! 4. its key must be in the allowed signers (`UnknownKey`: never added, or removed = revoked);
//! 5. it must verify over the current plan's message (`<full-id>\n`); if it does not, it is
//!    tried against the other plans the caller knows, to tell `StalePlan` from `OtherPlan`
//!    (a signature over an unknown message, including a tampered one, cannot be told apart
//!    from a signature over a plan medea never saw);
//! 6. a plan that was already executed cannot be approved again (`Replayed`);
//! 7. a signer line for that key must allow the namespace (`NamespaceNotAllowed`), be valid at
//!    `now` (`NotYetValid`, `Expired`) and name literal principals (`PatternPrincipal`); the
//!    first line (file order) that passes gives the principal, like ssh-keygen.

use std::fmt;

use jiff::Timestamp;
use ssh_key::{Algorithm, HashAlg, SshSig};

use super::NAMESPACE;
use super::allowed_signers::{AllowedSigners, SignerEntry, Validity};
use super::source::ApprovalSource;
use crate::plan::PlanId;

/// What a verification is checked against. `now` is the verification time (validity windows are
/// evaluated at it: SSHSIG carries no trustworthy signing time).
#[derive(Debug, Clone, Copy)]
pub struct VerifyContext<'a> {
    /// The trust root: the server's allowed_signers, never a file from the desired state.
    pub signers: &'a AllowedSigners,
    /// The plan that is current now.
    pub current: &'a PlanId,
    /// Earlier plans the store knows (only used to name a stale plan in the outcome).
    pub known: &'a [PlanId],
    /// Plans that were already executed (a job was started from them).
    pub consumed: &'a [PlanId],
    /// Validity windows of allowed_signers lines are checked at this time.
    pub now: Timestamp,
}

/// An approval that counts: a good signature over `plan` by a trusted, currently valid key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedApproval {
    /// The plan the signature covers.
    pub plan: PlanId,
    /// The canonical principal: the first one on the signer's allowed_signers line.
    pub principal: String,
    /// Every principal on that line (aliases of the same person; used by the quorum count).
    pub principals: Vec<String>,
    /// `SHA256:...` of the signing key.
    pub fingerprint: String,
    /// `ED25519`, `ECDSA`, `RSA`: the key type, as ssh-keygen names it.
    pub key_type: String,
    /// The allowed_signers line that granted it.
    pub signers_line: usize,
    /// Where the approval came from.
    pub source: ApprovalSource,
}

/// The outcome of verifying one candidate. Each variant has its own message (Display).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A good signature over the current plan by a trusted, currently valid key.
    Approved(VerifiedApproval),
    /// The signature does not cover the current plan, nor any plan medea knows.
    OtherPlan {
        /// The current plan.
        current: PlanId,
        /// `SHA256:...` of the signing key.
        fingerprint: String,
    },
    /// The signature covers a plan that is no longer current.
    StalePlan {
        /// The plan the signature covers.
        signed: PlanId,
        /// The current plan.
        current: PlanId,
        /// `SHA256:...` of the signing key.
        fingerprint: String,
    },
    /// The signature covers a plan that was already executed: an approval is used once.
    Replayed {
        /// The executed plan the signature covers.
        plan: PlanId,
        /// `SHA256:...` of the signing key.
        fingerprint: String,
    },
    /// The signature is structurally wrong for its key.
    BadSignature {
        /// `SHA256:...` of the key the signature names.
        fingerprint: String,
        /// Why it does not verify.
        reason: String,
    },
    /// Signed for another namespace (`git`, `file`, ...).
    WrongNamespace {
        /// The namespace the signature was made for.
        found: String,
    },
    /// The key is not in the allowed signers file (never added, or removed).
    UnknownKey {
        /// `SHA256:...` of the key the signature names.
        fingerprint: String,
    },
    /// The signer's line restricts `namespaces=` to a list without `medea-approve`.
    NamespaceNotAllowed {
        /// The line's canonical principal.
        principal: String,
        /// `SHA256:...` of the signing key.
        fingerprint: String,
        /// The allowed_signers line.
        line: usize,
        /// The line's `namespaces=` list.
        namespaces: String,
    },
    /// The signer's `valid-before` is in the past.
    Expired {
        /// The line's canonical principal.
        principal: String,
        /// `SHA256:...` of the signing key.
        fingerprint: String,
        /// The allowed_signers line.
        line: usize,
        /// The line's `valid-before`.
        valid_before: Timestamp,
    },
    /// The signer's `valid-after` is in the future.
    NotYetValid {
        /// The line's canonical principal.
        principal: String,
        /// `SHA256:...` of the signing key.
        fingerprint: String,
        /// The allowed_signers line.
        line: usize,
        /// The line's `valid-after`.
        valid_after: Timestamp,
    },
    /// The signer's line names principals by pattern, which cannot identify one person.
    PatternPrincipal {
        /// The line's principals pattern list, as written.
        principals: String,
        /// `SHA256:...` of the signing key.
        fingerprint: String,
        /// The allowed_signers line.
        line: usize,
    },
    /// Not an SSH signature medea can read.
    Malformed {
        /// Why it cannot be read.
        reason: String,
    },
}

impl Outcome {
    /// The approval, when the outcome is [`Outcome::Approved`].
    pub fn approved(&self) -> Option<&VerifiedApproval> {
        match self {
            Outcome::Approved(a) => Some(a),
            _ => None,
        }
    }
    /// The key that made the signature, when the signature could be read (SHA256 fingerprint).
    pub fn fingerprint(&self) -> Option<&str> {
        match self {
            Outcome::Approved(a) => Some(&a.fingerprint),
            Outcome::OtherPlan { fingerprint, .. }
            | Outcome::StalePlan { fingerprint, .. }
            | Outcome::Replayed { fingerprint, .. }
            | Outcome::BadSignature { fingerprint, .. }
            | Outcome::UnknownKey { fingerprint }
            | Outcome::NamespaceNotAllowed { fingerprint, .. }
            | Outcome::Expired { fingerprint, .. }
            | Outcome::NotYetValid { fingerprint, .. }
            | Outcome::PatternPrincipal { fingerprint, .. } => Some(fingerprint),
            Outcome::WrongNamespace { .. } | Outcome::Malformed { .. } => None,
        }
    }
    /// The signer line's principal(s) the outcome names, when it names one.
    pub fn principal(&self) -> Option<&str> {
        match self {
            Outcome::Approved(a) => Some(&a.principal),
            Outcome::NamespaceNotAllowed { principal, .. }
            | Outcome::Expired { principal, .. }
            | Outcome::NotYetValid { principal, .. } => Some(principal),
            Outcome::PatternPrincipal { principals, .. } => Some(principals),
            _ => None,
        }
    }
    /// A stable machine-readable code for the outcome (`medea approvals --json`, API).
    pub fn code(&self) -> &'static str {
        match self {
            Outcome::Approved(_) => "approved",
            Outcome::OtherPlan { .. } => "other-plan",
            Outcome::StalePlan { .. } => "stale-plan",
            Outcome::Replayed { .. } => "replayed",
            Outcome::BadSignature { .. } => "bad-signature",
            Outcome::WrongNamespace { .. } => "wrong-namespace",
            Outcome::UnknownKey { .. } => "unknown-key",
            Outcome::NamespaceNotAllowed { .. } => "namespace-not-allowed",
            Outcome::Expired { .. } => "expired",
            Outcome::NotYetValid { .. } => "not-yet-valid",
            Outcome::PatternPrincipal { .. } => "pattern-principal",
            Outcome::Malformed { .. } => "malformed",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Approved(a) => write!(
                f,
                "approved plan {} by {} ({} key {})",
                a.plan.short(),
                a.principal,
                a.key_type,
                a.fingerprint
            ),
            Outcome::OtherPlan {
                current,
                fingerprint,
            } => write!(
                f,
                "does not sign the current plan {}: the signature by key {fingerprint} is over another plan or an altered message",
                current.short()
            ),
            Outcome::StalePlan {
                signed,
                current,
                fingerprint,
            } => write!(
                f,
                "signs plan {}, which is stale (the current plan is {}); key {fingerprint} must approve the current plan",
                signed.short(),
                current.short()
            ),
            Outcome::Replayed { plan, fingerprint } => write!(
                f,
                "signs plan {}, which was already executed; an approval (key {fingerprint}) cannot start a plan twice",
                plan.short()
            ),
            Outcome::BadSignature {
                fingerprint,
                reason,
            } => {
                write!(f, "bad signature by key {fingerprint}: {reason}")
            }
            Outcome::WrongNamespace { found } => write!(
                f,
                "signed for namespace `{found}`, not `{NAMESPACE}`; sign with `ssh-keygen -Y sign -n {NAMESPACE}`"
            ),
            Outcome::UnknownKey { fingerprint } => write!(
                f,
                "unknown key {fingerprint}: it is not in the allowed signers file (never added, or removed)"
            ),
            Outcome::NamespaceNotAllowed {
                principal,
                fingerprint,
                line,
                namespaces,
            } => write!(
                f,
                "key {fingerprint} of {principal} may only sign namespaces `{namespaces}` (allowed signers line {line}), which excludes `{NAMESPACE}`"
            ),
            Outcome::Expired {
                principal,
                fingerprint,
                line,
                valid_before,
            } => write!(
                f,
                "key {fingerprint} of {principal} expired at {valid_before} (valid-before on allowed signers line {line})"
            ),
            Outcome::NotYetValid {
                principal,
                fingerprint,
                line,
                valid_after,
            } => write!(
                f,
                "key {fingerprint} of {principal} is not valid before {valid_after} (valid-after on allowed signers line {line})"
            ),
            Outcome::PatternPrincipal {
                principals,
                fingerprint,
                line,
            } => write!(
                f,
                "key {fingerprint} is listed for principal pattern `{principals}` (allowed signers line {line}); medea counts approvals per person, so list literal principals"
            ),
            Outcome::Malformed { reason } => write!(f, "not a valid SSH signature: {reason}"),
        }
    }
}

/// One signature offered as an approval, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Where the signature came from.
    pub source: ApprovalSource,
    /// The armored signature (`-----BEGIN SSH SIGNATURE-----`).
    pub armored: String,
    /// The plan the submitter says it signs (an API submission's plan id; a marker names its
    /// plan in its file name instead). Tried after the current plan, so a signature over a
    /// plan replaced a moment ago reads as stale, not as "another plan".
    pub named: Option<crate::plan::PlanId>,
}

/// A candidate with its outcome, for per-file reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Where the signature came from.
    pub source: ApprovalSource,
    /// What verifying it gave.
    pub outcome: Outcome,
}

/// Verify many candidates (markers and API submissions) against the same context.
pub fn verify_all(candidates: &[Candidate], ctx: &VerifyContext<'_>) -> Vec<Verified> {
    candidates
        .iter()
        .map(|c| Verified {
            source: c.source.clone(),
            outcome: verify(&c.armored, c.source.clone(), ctx),
        })
        .collect()
}

const BEGIN: &str = "-----BEGIN SSH SIGNATURE-----";

/// Parse an armored SSHSIG. The reason is for the operator.
pub fn parse_armored(armored: &str) -> Result<SshSig, String> {
    let text = armored.trim();
    if !text.starts_with(BEGIN) {
        return Err(format!(
            "expected an armored signature starting with `{BEGIN}`"
        ));
    }
    let sig = SshSig::from_pem(text).map_err(|e| match e {
        ssh_key::Error::Version { number } => format!("unsupported SSHSIG version {number} (medea reads version 1)"),
        ssh_key::Error::Namespace => "the signature has an empty namespace".to_string(),
        ssh_key::Error::AlgorithmUnknown | ssh_key::Error::AlgorithmUnsupported { .. } => {
            "the signature uses a key or hash algorithm medea does not accept (ed25519, ecdsa, rsa with sha256/sha512)".to_string()
        }
        _ => "the armored data does not decode to an SSHSIG blob (truncated or altered?)".to_string(),
    })?;
    Ok(sig)
}

fn key_type_name(alg: &Algorithm) -> String {
    match alg {
        Algorithm::Ed25519 => "ED25519".into(),
        Algorithm::Ecdsa { .. } => "ECDSA".into(),
        Algorithm::Rsa { .. } => "RSA".into(),
        Algorithm::SkEd25519 => "ED25519-SK".into(),
        Algorithm::SkEcdsaSha2NistP256 => "ECDSA-SK".into(),
        other => other.as_str().to_uppercase(),
    }
}

/// Whether the signature algorithm belongs to the key's algorithm family.
fn algorithm_fits(key: &Algorithm, sig: &Algorithm) -> bool {
    match (key, sig) {
        (Algorithm::Rsa { .. }, Algorithm::Rsa { hash }) => hash.is_some(),
        (a, b) => a == b,
    }
}

/// The user-presence bit of a FIDO security-key signature's flags (`SSH_SK_USER_PRESENCE_REQD`).
const SK_USER_PRESENCE: u8 = 0x01;

/// The flags byte of a security-key (`sk-…`) signature: ssh-key keeps `flags` (1 byte) and
/// `counter` (4 bytes) after the raw signature. `None` for other algorithms.
fn sk_flags(sig: &SshSig) -> Option<u8> {
    match sig.algorithm() {
        Algorithm::SkEd25519 | Algorithm::SkEcdsaSha2NistP256 => {
            let bytes = sig.signature().as_bytes();
            bytes.len().checked_sub(5).map(|i| bytes[i])
        }
        _ => None,
    }
}

/// The signature stage of a verification: everything that depends only on the signature's
/// bytes, the allowed signers and the plans offered — not on the time or on which plans were
/// executed. It holds the expensive part (the signature checks), so the daemon keeps it per
/// (candidate digest, current plan, signers generation) and only [`judge`]s it again on each
/// pass (`ops::approvals`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureCheck {
    /// Refused before any plan was tried: `Malformed`, `WrongNamespace`, `BadSignature` or
    /// `UnknownKey`.
    Refused(Outcome),
    /// A good signature by an allowed key over `plan`, the first of the plans offered it
    /// verifies over.
    Signs {
        /// The plan.
        plan: PlanId,
        /// The signing key.
        key: ssh_key::public::KeyData,
        /// `SHA256:...` of the signing key.
        fingerprint: String,
    },
    /// A signature by an allowed key over none of the plans offered.
    NoPlan {
        /// `SHA256:...` of the signing key.
        fingerprint: String,
    },
}

/// Check `armored` (steps 1–5 of the module's order) against the plans `offered`, in order
/// (the current plan first). Returns the check and how many signature verifications it made:
/// at most one per plan offered, none when refused earlier.
pub fn check_signature(
    armored: &str,
    signers: &AllowedSigners,
    offered: &[PlanId],
) -> (SignatureCheck, usize) {
    let sig = match parse_armored(armored) {
        Ok(s) => s,
        Err(reason) => return (SignatureCheck::Refused(Outcome::Malformed { reason }), 0),
    };
    if sig.namespace() != NAMESPACE {
        return (
            SignatureCheck::Refused(Outcome::WrongNamespace {
                found: sig.namespace().to_string(),
            }),
            0,
        );
    }
    let key_data = sig.public_key();
    let fingerprint = key_data.fingerprint(HashAlg::Sha256).to_string();
    if !algorithm_fits(&key_data.algorithm(), &sig.algorithm()) {
        return (
            SignatureCheck::Refused(Outcome::BadSignature {
                fingerprint,
                reason: format!(
                    "a `{}` signature cannot come from a `{}` key",
                    sig.algorithm().as_str(),
                    key_data.algorithm().as_str()
                ),
            }),
            0,
        );
    }
    // A security-key signature carries the authenticator's flags (signed with it); without
    // user presence nobody touched the key, which `ssh-keygen -Y verify` refuses too.
    if let Some(flags) = sk_flags(&sig)
        && flags & SK_USER_PRESENCE == 0
    {
        return (
            SignatureCheck::Refused(Outcome::BadSignature {
                fingerprint,
                reason: "the security-key signature lacks the user-presence flag (the key was not touched); sign again and touch the key".into(),
            }),
            0,
        );
    }
    let Some(first) = signers.entries_for_key(key_data).next() else {
        return (
            SignatureCheck::Refused(Outcome::UnknownKey { fingerprint }),
            0,
        );
    };
    let key = first.key();
    let mut checks = 0;
    for plan in offered {
        checks += 1;
        if key.verify(NAMESPACE, &plan.signed_message(), &sig).is_ok() {
            return (
                SignatureCheck::Signs {
                    plan: *plan,
                    key: key_data.clone(),
                    fingerprint,
                },
                checks,
            );
        }
    }
    (SignatureCheck::NoPlan { fingerprint }, checks)
}

/// The outcome of a [`SignatureCheck`] now (steps 5–7 of the module's order): against the
/// current plan, whether the signed plan was executed (`consumed`), and the signer lines of
/// the key at `now`. Cheap: no signature is verified here.
pub fn judge(
    check: &SignatureCheck,
    source: ApprovalSource,
    signers: &AllowedSigners,
    current: &PlanId,
    consumed: &dyn Fn(&PlanId) -> bool,
    now: Timestamp,
) -> Outcome {
    let (signed, key_data, fingerprint) = match check {
        SignatureCheck::Refused(o) => return o.clone(),
        SignatureCheck::NoPlan { fingerprint } => {
            return Outcome::OtherPlan {
                current: *current,
                fingerprint: fingerprint.clone(),
            };
        }
        SignatureCheck::Signs {
            plan,
            key,
            fingerprint,
        } => (*plan, key, fingerprint.clone()),
    };
    if consumed(&signed) {
        return Outcome::Replayed {
            plan: signed,
            fingerprint,
        };
    }
    if signed != *current {
        return Outcome::StalePlan {
            signed,
            current: *current,
            fingerprint,
        };
    }
    let entries: Vec<&SignerEntry> = signers.entries_for_key(key_data).collect();
    if entries.is_empty() {
        return Outcome::UnknownKey { fingerprint };
    }

    // The signature is good. Which signer line (file order) lets it count?
    let mut first_refusal = None;
    for e in &entries {
        let shown = e.principals().to_string();
        let refusal = if !e.allows_namespace(NAMESPACE) {
            Some(Outcome::NamespaceNotAllowed {
                principal: shown,
                fingerprint: fingerprint.clone(),
                line: e.line(),
                namespaces: e.namespaces().unwrap_or_default().to_string(),
            })
        } else {
            match e.validity_at(now) {
                Validity::Expired { valid_before } => Some(Outcome::Expired {
                    principal: shown,
                    fingerprint: fingerprint.clone(),
                    line: e.line(),
                    valid_before,
                }),
                Validity::NotYetValid { valid_after } => Some(Outcome::NotYetValid {
                    principal: shown,
                    fingerprint: fingerprint.clone(),
                    line: e.line(),
                    valid_after,
                }),
                Validity::Valid => match e.literal_principals() {
                    None => Some(Outcome::PatternPrincipal {
                        principals: shown,
                        fingerprint: fingerprint.clone(),
                        line: e.line(),
                    }),
                    Some(list) => {
                        return Outcome::Approved(VerifiedApproval {
                            plan: signed,
                            principal: list[0].to_string(),
                            principals: list.iter().map(|s| s.to_string()).collect(),
                            fingerprint,
                            key_type: key_type_name(&key_data.algorithm()),
                            signers_line: e.line(),
                            source,
                        });
                    }
                },
            }
        };
        if first_refusal.is_none() {
            first_refusal = refusal;
        }
    }
    first_refusal.unwrap_or(Outcome::UnknownKey { fingerprint })
}

/// Verify one armored signature as an approval of `ctx.current`: [`check_signature`] over the
/// current plan, then `ctx.known` and `ctx.consumed`, then [`judge`]. The daemon bounds what it
/// offers (`ops::approvals`: the current plan and the plans a marker's file name names).
pub fn verify(armored: &str, source: ApprovalSource, ctx: &VerifyContext<'_>) -> Outcome {
    let offered: Vec<PlanId> = std::iter::once(*ctx.current)
        .chain(
            ctx.known
                .iter()
                .chain(ctx.consumed)
                .filter(|p| *p != ctx.current)
                .copied(),
        )
        .collect();
    let (check, _) = check_signature(armored, ctx.signers, &offered);
    judge(
        &check,
        source,
        ctx.signers,
        ctx.current,
        &|p| ctx.consumed.contains(p),
        ctx.now,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::allowed_signers;
    use ssh_key::private::{Ed25519Keypair, KeypairData};
    use ssh_key::{LineEnding, PrivateKey};

    fn private(seed: u8) -> PrivateKey {
        PrivateKey::new(
            KeypairData::Ed25519(Ed25519Keypair::from_seed(&[seed; 32])),
            "",
        )
        .unwrap()
    }
    fn plan(b: u8) -> PlanId {
        PlanId::from_digest([b; 32])
    }
    fn sign(seed: u8, ns: &str, msg: &[u8]) -> String {
        private(seed)
            .sign(ns, HashAlg::Sha512, msg)
            .unwrap()
            .to_pem(LineEnding::LF)
            .unwrap()
    }
    fn signers(text: &str) -> AllowedSigners {
        let (s, d) = allowed_signers::parse(text);
        assert!(d.is_empty(), "{d:?}");
        s
    }
    fn line(principals: &str, opts: &str, seed: u8) -> String {
        format!(
            "{principals} {opts} {}\n",
            private(seed).public_key().to_openssh().unwrap()
        )
    }
    fn now() -> Timestamp {
        "2025-06-01T00:00:00Z".parse().unwrap()
    }

    /// A security-key (`sk-ssh-ed25519@openssh.com`) approval of `plan`, made the way a FIDO
    /// authenticator makes it: Ed25519 over sha256(application) || flags || counter ||
    /// sha256(SSHSIG signed data). Returns the armored signature and the allowed_signers line.
    fn sk_approval(seed: u8, flags: u8, plan: &PlanId) -> (String, String) {
        use sha2::{Digest, Sha256};
        use ssh_key::public::{Ed25519PublicKey, KeyData, SkEd25519};
        use ssh_key::{Algorithm, Signature, SshSig};
        let pair = Ed25519Keypair::from_seed(&[seed; 32]);
        let public = KeyData::SkEd25519(SkEd25519::new(Ed25519PublicKey(pair.public.0), "ssh:"));
        let blob = SshSig::signed_data(NAMESPACE, HashAlg::Sha512, &plan.signed_message()).unwrap();
        let counter = 7u32.to_be_bytes();
        let mut data = Sha256::digest(b"ssh:").to_vec();
        data.push(flags);
        data.extend(counter);
        data.extend(Sha256::digest(&blob));
        let raw = rsa::signature::Signer::<Signature>::sign(&pair, &data);
        let mut bytes = raw.as_bytes().to_vec();
        bytes.push(flags);
        bytes.extend(counter);
        let sig = Signature::new(Algorithm::SkEd25519, bytes).unwrap();
        let armored = SshSig::new(public.clone(), NAMESPACE, HashAlg::Sha512, sig)
            .unwrap()
            .to_pem(LineEnding::LF)
            .unwrap();
        let line = format!(
            "alice@x {}\n",
            ssh_key::PublicKey::from(public).to_openssh().unwrap()
        );
        (armored, line)
    }

    /// Issue 19: a security-key signature counts only with the user-presence flag (the key
    /// was touched), as `ssh-keygen -Y verify` requires without `no-touch-required`.
    #[test]
    fn security_key_signatures_need_user_presence() {
        let (touched, line) = sk_approval(9, 0x01, &plan(1));
        let s = signers(&line);
        let out = check(&touched, &s, plan(1), &[], &[]);
        assert!(
            matches!(&out, Outcome::Approved(a) if a.key_type == "ED25519-SK"),
            "{out}"
        );
        let (untouched, _) = sk_approval(9, 0x00, &plan(1));
        let out = check(&untouched, &s, plan(1), &[], &[]);
        assert!(
            matches!(&out, Outcome::BadSignature { reason, .. } if reason.contains("user-presence flag")),
            "{out}"
        );
        // user verification alone (0x04) is not presence either
        let (uv_only, _) = sk_approval(9, 0x04, &plan(1));
        assert!(matches!(
            check(&uv_only, &s, plan(1), &[], &[]),
            Outcome::BadSignature { .. }
        ));
    }
    fn check(
        armored: &str,
        s: &AllowedSigners,
        current: PlanId,
        known: &[PlanId],
        consumed: &[PlanId],
    ) -> Outcome {
        let ctx = VerifyContext {
            signers: s,
            current: &current,
            known,
            consumed,
            now: now(),
        };
        verify(armored, ApprovalSource::Api, &ctx)
    }

    #[test]
    fn approves_the_current_plan() {
        let s = signers(&line("alice@x,alice@y", "", 1));
        let o = check(
            &sign(1, NAMESPACE, &plan(1).signed_message()),
            &s,
            plan(1),
            &[],
            &[],
        );
        let a = o.approved().expect("approved");
        assert_eq!(a.principal, "alice@x");
        assert_eq!(a.principals, vec!["alice@x", "alice@y"]);
        assert_eq!(a.key_type, "ED25519");
        assert!(a.fingerprint.starts_with("SHA256:"));
        assert!(
            o.to_string()
                .starts_with("approved plan 010101010101 by alice@x (ED25519 key SHA256:"),
            "{o}"
        );
    }

    #[test]
    fn each_rejection_has_its_own_outcome() {
        let s = signers(&format!(
            "{}{}{}{}{}",
            line("alice@x", "", 1),
            line("bob@x", "valid-before=\"20250101Z\"", 2),
            line("carol@x", "valid-after=\"20260101Z\"", 3),
            line("dave@x", "namespaces=\"git\"", 4),
            line("*@x", "", 5),
        ));
        let m1 = plan(1).signed_message();
        let cases: Vec<(String, &str)> = vec![
            (sign(1, "git", &m1), "wrong-namespace"),
            (sign(9, NAMESPACE, &m1), "unknown-key"),
            (sign(1, NAMESPACE, b"tampered\n"), "other-plan"),
            (sign(2, NAMESPACE, &m1), "expired"),
            (sign(3, NAMESPACE, &m1), "not-yet-valid"),
            (sign(4, NAMESPACE, &m1), "namespace-not-allowed"),
            (sign(5, NAMESPACE, &m1), "pattern-principal"),
            ("garbage".into(), "malformed"),
            (
                "-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n".into(),
                "malformed",
            ),
        ];
        let mut messages = std::collections::BTreeSet::new();
        for (armored, code) in cases {
            let o = check(&armored, &s, plan(1), &[], &[]);
            assert_eq!(o.code(), code, "{o}");
            messages.insert(o.to_string());
        }
        assert_eq!(
            messages.len(),
            9,
            "every case has its own message (malformed twice, with different reasons)"
        );
    }

    #[test]
    fn stale_and_replayed_plans_are_named() {
        let s = signers(&line("alice@x", "", 1));
        let old = sign(1, NAMESPACE, &plan(1).signed_message());
        let o = check(&old, &s, plan(2), &[plan(1)], &[]);
        assert_eq!(
            o,
            Outcome::StalePlan {
                signed: plan(1),
                current: plan(2),
                fingerprint: private(1)
                    .public_key()
                    .fingerprint(HashAlg::Sha256)
                    .to_string(),
            }
        );
        assert!(
            o.to_string()
                .contains("stale (the current plan is 020202020202)"),
            "{o}"
        );
        // not known: just "does not sign the current plan"
        assert_eq!(check(&old, &s, plan(2), &[], &[]).code(), "other-plan");
        // executed, then recomputed identically: the old approval cannot start it again
        let o = check(&old, &s, plan(1), &[], &[plan(1)]);
        assert_eq!(o.code(), "replayed");
        assert!(o.to_string().contains("already executed"), "{o}");
        // executed plan signed while another is current
        assert_eq!(check(&old, &s, plan(2), &[], &[plan(1)]).code(), "replayed");
    }

    #[test]
    fn first_passing_line_wins_and_refusal_comes_from_first_line() {
        let s = signers(&format!(
            "{}{}",
            line("old@x", "valid-before=\"20240101Z\"", 1),
            line("new@x", "", 1)
        ));
        let o = check(
            &sign(1, NAMESPACE, &plan(1).signed_message()),
            &s,
            plan(1),
            &[],
            &[],
        );
        assert_eq!(o.approved().unwrap().principal, "new@x");
        let s = signers(&format!(
            "{}{}",
            line("old@x", "valid-before=\"20240101Z\"", 1),
            line("new@x", "namespaces=\"git\"", 1)
        ));
        let o = check(
            &sign(1, NAMESPACE, &plan(1).signed_message()),
            &s,
            plan(1),
            &[],
            &[],
        );
        assert_eq!(o.code(), "expired");
    }
}
