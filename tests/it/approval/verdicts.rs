//! Verdicts: every rejection has its own outcome and message, revoked signers, quorum counts
//! people, allowed_signers decisions match ssh-keygen's.

use super::*;

#[test]
fn every_rejection_has_its_own_outcome_and_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let alice = keygen(d, "alice", &["-t", "ed25519"]);
    let bob = keygen(d, "bob", &["-t", "ed25519"]);
    let carol = keygen(d, "carol", &["-t", "ecdsa", "-b", "256"]);
    let dave = keygen(d, "dave", &["-t", "ed25519"]);
    let mallory = keygen(d, "mallory", &["-t", "ed25519"]);
    let allowed = format!(
        "alice@example.com {}\n\
         bob@example.com valid-before=\"20250101Z\" {}\n\
         carol@example.com valid-after=\"20990101Z\" {}\n\
         dave@example.com namespaces=\"git,file\" {}\n",
        alice.public, bob.public, carol.public, dave.public
    );
    let s = signers(&allowed);
    let (a, b) = (plan("A"), plan("B"));
    let ma = a.signed_message();
    let mut tampered = ma.clone();
    tampered[0] = if tampered[0] == b'0' { b'1' } else { b'0' };

    let good = keygen_sign(&alice, "medea-approve", "sha512", &ma);
    let mut altered_sig = good.clone();
    // flip one base64 character in the body (line 2)
    let body_at = altered_sig.find('\n').unwrap() + 40;
    let flipped = if altered_sig.as_bytes()[body_at] == b'A' {
        "B"
    } else {
        "A"
    };
    altered_sig.replace_range(body_at..body_at + 1, flipped);

    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "tampered message",
            keygen_sign(&alice, "medea-approve", "sha512", &tampered),
            "other-plan",
            "alice",
        ),
        (
            "wrong namespace",
            keygen_sign(&alice, "git", "sha512", &ma),
            "wrong-namespace",
            "alice",
        ),
        (
            "unknown key",
            keygen_sign(&mallory, "medea-approve", "sha512", &ma),
            "unknown-key",
            "mallory",
        ),
        (
            "expired",
            keygen_sign(&bob, "medea-approve", "sha512", &ma),
            "expired",
            "bob",
        ),
        (
            "not yet valid",
            keygen_sign(&carol, "medea-approve", "sha256", &ma),
            "not-yet-valid",
            "carol",
        ),
        (
            "namespace excluded",
            keygen_sign(&dave, "medea-approve", "sha512", &ma),
            "namespace-not-allowed",
            "dave",
        ),
        ("not a signature", "hello".to_string(), "malformed", "alice"),
    ];
    let mut messages = BTreeSet::new();
    for (what, armored, code, who) in &cases {
        let o = check(armored, &s, &a, &[], &[]);
        assert_eq!(o.code(), *code, "{what}: {o}");
        messages.insert(o.to_string());
        // ssh-keygen agrees that none of these is a valid medea-approve signature of plan A
        let (ok, text) = keygen_verify(d, &allowed, &format!("{who}@example.com"), armored, &ma);
        assert!(!ok, "ssh-keygen accepted the {what} case: {text}");
    }
    assert_eq!(messages.len(), cases.len(), "{messages:#?}");
    let o = check(&altered_sig, &s, &a, &[], &[]);
    assert!(o.approved().is_none(), "altered signature accepted: {o}");

    let m = |c: &str| {
        check(
            &cases.iter().find(|x| x.2 == c).unwrap().1,
            &s,
            &a,
            &[],
            &[],
        )
        .to_string()
    };
    // the good signature itself passes both
    assert!(matches!(
        check(&good, &s, &a, &[], &[]),
        Outcome::Approved(_)
    ));
    assert!(keygen_verify(d, &allowed, "alice@example.com", &good, &ma).0);
    assert!(m("other-plan").contains(&format!("does not sign the current plan {}", a.short())));
    assert!(m("wrong-namespace").contains("namespace `git`, not `medea-approve`"));
    assert!(m("unknown-key").contains(&mallory.fingerprint()));
    assert!(m("expired").contains("bob@example.com expired at 2025-01-01T00:00:00Z"));
    assert!(
        m("not-yet-valid").contains("carol@example.com is not valid before 2099-01-01T00:00:00Z")
    );
    assert!(m("namespace-not-allowed").contains("`git,file`"));

    // stale: A's approval once B is current; A never counts for B
    let o = check(&good, &s, &b, &[a], &[]);
    assert!(
        matches!(o, Outcome::StalePlan { signed, current, .. } if signed == a && current == b),
        "{o}"
    );
    assert!(o.to_string().contains("stale"));
    let o = check(&good, &s, &b, &[], &[]);
    assert_eq!(o.code(), "other-plan");
    // replayed: A executed, then A current again
    let o = check(&good, &s, &a, &[], &[a]);
    assert_eq!(o.code(), "replayed");
    assert!(o.to_string().contains("already executed"));
    let approved = check(&good, &s, &a, &[], &[]).approved().unwrap().clone();
    let status = evaluate(&a, 1, vec![approved]);
    assert!(status.reached());
    assert!(matches!(
        ensure_startable(&a, &a, true, &status),
        Err(ApprovalError::Consumed { .. })
    ));
    assert!(ensure_startable(&a, &a, false, &status).is_ok());
    assert!(matches!(
        ensure_startable(&a, &b, false, &status),
        Err(ApprovalError::StalePlan { .. })
    ));
}

#[test]
fn revoked_signer_no_longer_counts_even_for_recorded_approvals() {
    let dir = tempfile::tempdir().unwrap();
    let alice = keygen(dir.path(), "alice", &["-t", "ed25519"]);
    let bob = keygen(dir.path(), "bob", &["-t", "ed25519"]);
    let p = plan("revoke");
    let before = signers(&format!(
        "alice@example.com {}\nbob@example.com {}\n",
        alice.public, bob.public
    ));
    let armored = keygen_sign(&alice, "medea-approve", "sha512", &p.signed_message());
    let a = check(&armored, &before, &p, &[], &[])
        .approved()
        .unwrap()
        .clone();
    let record = ApprovalRecord::new(&a, &armored, now());
    let json = serde_json::to_string(&record).unwrap();
    let record: ApprovalRecord = serde_json::from_str(&json).unwrap();

    // alice's line removed
    let after = signers(&format!("bob@example.com {}\n", bob.public));
    let ctx = VerifyContext {
        signers: &after,
        current: &p,
        known: &[],
        consumed: &[],
        now: now(),
    };
    let o = record.reverify(&ctx);
    assert!(
        matches!(&o, Outcome::UnknownKey { fingerprint } if *fingerprint == alice.fingerprint()),
        "{o}"
    );
    assert!(o.to_string().contains("never added, or removed"));
    let (ok, _) = keygen_verify(
        dir.path(),
        &format!("bob@example.com {}\n", bob.public),
        "alice@example.com",
        &armored,
        &p.signed_message(),
    );
    assert!(!ok, "ssh-keygen still trusts the removed signer");
}

#[test]
fn quorum_counts_people_not_keys_or_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let laptop = keygen(d, "alice-laptop", &["-t", "ed25519"]);
    let yubi = keygen(d, "alice-desk", &["-t", "ecdsa", "-b", "256"]);
    let bob = keygen(d, "bob", &["-t", "ed25519"]);
    let s = signers(&format!(
        "alice@example.com {}\nalice@example.com {}\nbob@example.com {}\n",
        laptop.public, yubi.public, bob.public
    ));
    let (a, b) = (plan("A"), plan("B"));
    let sig = |k: &Key, p: &PlanId| keygen_sign(k, "medea-approve", "sha512", &p.signed_message());
    let verified = |armored: &str, path: &str, current: &PlanId| {
        let ctx = VerifyContext {
            signers: &s,
            current,
            known: &[],
            consumed: &[],
            now: now(),
        };
        let o = verify(armored, ApprovalSource::Marker { path: path.into() }, &ctx);
        o.approved().unwrap_or_else(|| panic!("{o}")).clone()
    };
    let laptop_sig = sig(&laptop, &a);
    let alice1 = verified(&laptop_sig, "approvals/a-alice1.sig", &a);
    let alice2 = verified(&sig(&yubi, &a), "approvals/a-alice2.sig", &a);
    let alice_copy = verified(&laptop_sig, "approvals/copy.sig", &a);
    let status = evaluate(&a, 2, vec![alice1.clone(), alice2, alice_copy]);
    assert!(!status.reached(), "{status}");
    assert_eq!(status.count(), 1);
    assert_eq!(status.not_counted.len(), 2);
    assert!(
        status
            .not_counted
            .iter()
            .all(|(_, why)| matches!(why, NotCounted::SamePrincipal { .. }))
    );
    assert!(
        status.not_counted[0]
            .1
            .to_string()
            .starts_with("duplicate principal: alice@example.com")
    );
    assert!(matches!(
        ensure_startable(&a, &a, false, &status),
        Err(ApprovalError::QuorumNotReached {
            have: 1,
            required: 2,
            ..
        })
    ));

    // bob approves plan B: it does not count for A
    let bob_b = verified(&sig(&bob, &b), "approvals/b-bob.sig", &b);
    let status = evaluate(&a, 2, vec![alice1.clone(), bob_b]);
    assert!(!status.reached());
    assert!(matches!(
        status.not_counted[0].1,
        NotCounted::OtherPlan { .. }
    ));

    let bob_a = verified(&sig(&bob, &a), "approvals/a-bob.sig", &a);
    let status = evaluate(&a, 2, vec![alice1, bob_a]);
    assert!(status.reached(), "{status}");
    assert_eq!(
        status.principals(),
        vec!["alice@example.com", "bob@example.com"]
    );
}

#[test]
fn allowed_signers_decisions_match_ssh_keygen() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = keygen(d, "k", &["-t", "ed25519"]);
    let p = plan("parity");
    let armored = keygen_sign(&key, "medea-approve", "sha512", &p.signed_message());
    // (options, medea approves?, ssh-keygen accepts?)
    let cases = [
        ("", true, true),
        ("namespaces=\"medea-approve\"", true, true),
        ("namespaces=\"medea-*\"", true, true),
        ("namespaces=\"git\"", false, false),
        ("namespaces=\"*,!medea-approve\"", false, false),
        (
            "valid-after=\"20250101Z\",valid-before=\"20251231Z\"",
            true,
            true,
        ),
        ("VALID-AFTER=\"20250601Z\"", true, true),
        ("valid-before=\"20250531235959Z\"", false, false),
        ("valid-after=\"202506010001Z\"", false, false),
    ];
    for (opts, medea_ok, keygen_ok) in cases {
        let allowed = format!("alice@example.com {opts} {}\n", key.public);
        let o = check(&armored, &signers(&allowed), &p, &[], &[]);
        assert_eq!(o.approved().is_some(), medea_ok, "{opts}: {o}");
        let (ok, text) = keygen_verify(
            d,
            &allowed,
            "alice@example.com",
            &armored,
            &p.signed_message(),
        );
        assert_eq!(ok, keygen_ok, "{opts}: {text}");
    }
    // deliberate difference: ssh-keygen accepts a pattern principal for `-I alice@example.com`;
    // medea needs a literal person to count
    let allowed = format!("*@example.com {}\n", key.public);
    let (ok, _) = keygen_verify(
        d,
        &allowed,
        "alice@example.com",
        &armored,
        &p.signed_message(),
    );
    assert!(ok);
    assert_eq!(
        check(&armored, &signers(&allowed), &p, &[], &[]).code(),
        "pattern-principal"
    );
    // ssh-keygen rejects what medea diagnoses
    for bad in [
        "namespaces=medea-approve",
        "bogus=\"x\"",
        "valid-after=\"2025\"",
    ] {
        let allowed = format!("alice@example.com {bad} {}\n", key.public);
        let (_, diags) = allowed_signers::parse(&allowed);
        assert_eq!(diags.len(), 1, "{bad}");
        assert_eq!(diags[0].line, 1);
        let (ok, _) = keygen_verify(
            d,
            &allowed,
            "alice@example.com",
            &armored,
            &p.signed_message(),
        );
        assert!(!ok, "ssh-keygen accepted `{bad}`");
    }
}
