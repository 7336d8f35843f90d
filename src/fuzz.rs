//! Fuzz entry points: every parser of untrusted input, as functions that must never panic.
//!
//! `tests/fuzz/` (cargo fuzz) calls these from libFuzzer; `tests/it/fuzz_smoke.rs` runs them
//! over the seed corpora and seeded mutations in the normal test suite.

use crate::approval::{self, ApprovalSource, VerifyContext};
use crate::desired::{self, Snapshot, source::SourceFile};
use crate::plan::PlanId;

/// The desired-state loader: bytes of one file → diagnostics (never a panic).
pub fn desired_loader(data: &[u8]) {
    let snapshot = Snapshot {
        files: vec![SourceFile {
            path: "fuzz.yaml".into(),
            bytes: data.to_vec(),
        }],
        markers: vec![],
        commit: None,
    };
    let loaded = desired::parse_snapshot(snapshot);
    // Every diagnostic must point inside the file it names.
    for d in &loaded.diagnostics {
        if let Some(text) = loaded.sources.get(&d.origin.file) {
            assert!(
                d.origin.offset + d.origin.len <= text.len(),
                "span past end: {d:?}"
            );
        }
    }
}

/// The allowed_signers parser.
pub fn allowed_signers(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let (_signers, diags) = approval::allowed_signers::parse(text);
        let lines = text.lines().count().max(1);
        for d in diags {
            assert!(
                d.line >= 1 && d.line <= lines + 1,
                "diagnostic line {} of {lines}",
                d.line
            );
        }
    }
}

/// The armored SSH signature parser and verifier.
pub fn armored_signature(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let (signers, _) = approval::allowed_signers::parse("");
        let current = PlanId::from_digest([7; 32]);
        let ctx = VerifyContext {
            signers: &signers,
            current: &current,
            known: &[],
            consumed: &[],
            now: jiff::Timestamp::UNIX_EPOCH,
        };
        let outcome = approval::verify(text, ApprovalSource::Api, &ctx);
        assert!(
            outcome.approved().is_none(),
            "nobody is trusted, so nothing can be approved"
        );
    }
}
