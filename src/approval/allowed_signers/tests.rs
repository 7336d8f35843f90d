use super::*;

#[test]
fn a_time_ending_in_a_multibyte_character_is_an_error_not_a_panic() {
    // Found by the allowed_signers fuzzer (tests/fuzz/regressions/allowed_signers/).
    assert!(parse_time("2026010\u{5a5}").is_err());
    assert!(parse_time("\u{5a5}").is_err());
    assert!(parse_time("20260101Z").is_ok());
}
use proptest::prelude::*;
use ssh_key::private::{Ed25519Keypair, KeypairData};

fn key(seed: u8) -> PublicKey {
    let kp = Ed25519Keypair::from_seed(&[seed; 32]);
    ssh_key::PrivateKey::new(KeypairData::Ed25519(kp), "")
        .unwrap()
        .public_key()
        .clone()
}
fn key_text(seed: u8) -> String {
    key(seed).to_openssh().unwrap()
}

#[test]
fn parses_plain_options_comments_and_blank_lines() {
    let text = format!(
        "# team\n\n   \nalice@example.com {k1} alice laptop\n\
             bob@example.com,robert@example.com NAMESPACES=\"medea-approve,file\",valid-after=\"20240101\",valid-before=\"202501011230Z\" {k2}\n\
             \"carol@example.com\" {k3}\n",
        k1 = key_text(1),
        k2 = key_text(2),
        k3 = key_text(3)
    );
    let (signers, diags) = parse(&text);
    assert!(diags.is_empty(), "{diags:?}");
    let e = signers.entries();
    assert_eq!(e.len(), 3);
    assert_eq!(e[0].line(), 4);
    assert_eq!(e[0].principals(), "alice@example.com");
    assert_eq!(e[0].key().comment(), "alice laptop");
    assert!(e[0].allows_namespace("medea-approve"));
    assert_eq!(e[1].line(), 5);
    assert_eq!(
        e[1].literal_principals().unwrap(),
        vec!["bob@example.com", "robert@example.com"]
    );
    assert_eq!(e[1].namespaces(), Some("medea-approve,file"));
    assert_eq!(
        e[1].valid_after().unwrap().to_string(),
        "2024-01-01T00:00:00Z"
    );
    assert_eq!(
        e[1].valid_before().unwrap().to_string(),
        "2025-01-01T12:30:00Z"
    );
    assert_eq!(e[2].principals(), "carol@example.com");
}

#[test]
fn namespace_patterns_and_negation() {
    let text = format!(
        "a@x namespaces=\"git\" {k}\nb@x namespaces=\"medea-*\" {k}\nc@x namespaces=\"*,!medea-approve\" {k}\n",
        k = key_text(1)
    );
    let (s, d) = parse(&text);
    assert!(d.is_empty(), "{d:?}");
    let allowed: Vec<bool> = s
        .entries()
        .iter()
        .map(|e| e.allows_namespace("medea-approve"))
        .collect();
    assert_eq!(allowed, vec![false, true, false]);
}

#[test]
fn principal_patterns() {
    assert_eq!(
        match_pattern_list("alice@example.com", "*@example.com"),
        PatternMatch::Positive
    );
    assert_eq!(
        match_pattern_list("alice@example.com", "*@example.com,!alice@*"),
        PatternMatch::Negative
    );
    assert_eq!(
        match_pattern_list("bob@example.org", "*@example.com"),
        PatternMatch::NoMatch
    );
    assert_eq!(match_pattern_list("ab", "a?"), PatternMatch::Positive);
    assert_eq!(match_pattern_list("abc", "a?"), PatternMatch::NoMatch);
    assert_eq!(match_pattern_list("Alice", "alice"), PatternMatch::NoMatch);
    let (s, _) = parse(&format!("*@example.com {}", key_text(1)));
    assert!(s.entries()[0].literal_principals().is_none());
    assert!(s.entries()[0].matches_principal("dave@example.com"));
}

#[test]
fn validity_window_is_inclusive() {
    let (s, d) = parse(&format!(
        "a@x valid-after=\"20240101000000Z\",valid-before=\"20240102000000Z\" {}",
        key_text(1)
    ));
    assert!(d.is_empty(), "{d:?}");
    let e = &s.entries()[0];
    let t = |x: &str| x.parse::<Timestamp>().unwrap();
    assert_eq!(e.validity_at(t("2024-01-01T00:00:00Z")), Validity::Valid);
    assert_eq!(e.validity_at(t("2024-01-02T00:00:00Z")), Validity::Valid);
    assert!(matches!(
        e.validity_at(t("2023-12-31T23:59:59Z")),
        Validity::NotYetValid { .. }
    ));
    assert!(matches!(
        e.validity_at(t("2024-01-02T00:00:01Z")),
        Validity::Expired { .. }
    ));
}

#[test]
fn time_formats() {
    assert_eq!(
        parse_time("20240229").unwrap().to_string(),
        "2024-02-29T00:00:00Z"
    );
    assert_eq!(
        parse_time("20240229z").unwrap().to_string(),
        "2024-02-29T00:00:00Z"
    );
    assert_eq!(
        parse_time("202402291201UTC").unwrap().to_string(),
        "2024-02-29T12:01:00Z"
    );
    assert_eq!(
        parse_time("20240229120159").unwrap().to_string(),
        "2024-02-29T12:01:59Z"
    );
    for bad in [
        "2024",
        "20230229",
        "2024022912",
        "20241301",
        "2024-01-01",
        "19700101Z",
        "",
        "Z",
        "ZZ",
    ] {
        assert!(parse_time(bad).is_err(), "{bad}");
    }
}

fn diag(line: &str) -> SignersDiagnostic {
    let (s, d) = parse(line);
    assert!(s.is_empty(), "{line}");
    assert_eq!(d.len(), 1, "{line}: {d:?}");
    d.into_iter().next().unwrap()
}

#[test]
fn diagnostics_have_lines_columns_and_say_what_to_do() {
    let k = key_text(1);
    let d = diag(&format!("a@x cert-authority {k}"));
    assert_eq!((d.line, d.column), (1, Some(5)));
    assert!(
        d.message.contains("`cert-authority` is not supported"),
        "{}",
        d.message
    );

    let d = diag(&format!("a@x namespaces=medea-approve {k}"));
    assert!(
        d.message.contains("must be in double quotes"),
        "{}",
        d.message
    );
    assert_eq!(d.column, Some(16));

    let d = diag(&format!("a@x foo=\"bar\" {k}"));
    assert!(d.message.contains("unknown option `foo`"), "{}", d.message);

    let d = diag(&format!("a@x namespaces=\"a\",namespaces=\"b\" {k}"));
    assert!(d.message.contains("more than once"), "{}", d.message);

    let d = diag(&format!("a@x valid-after=\"2024\" {k}"));
    assert!(d.message.contains("invalid time `2024`"), "{}", d.message);

    let d = diag(&format!(
        "a@x valid-after=\"20250101\",valid-before=\"20240101\" {k}"
    ));
    assert!(
        d.message.contains("later than `valid-after`"),
        "{}",
        d.message
    );

    let d = diag("a@x");
    assert!(d.message.contains("missing key"), "{}", d.message);
    let d = diag("a@x namespaces=\"x\"");
    assert!(d.message.contains("missing key"), "{}", d.message);
    let d = diag("a@x ssh-ed25519");
    assert!(d.message.contains("missing base64"), "{}", d.message);
    let d = diag("a@x ssh-ed25519 AAAAnotakey");
    assert!(d.message.contains("invalid public key"), "{}", d.message);
    let d = diag(&format!("a@x namespaces=\"x\",{k}"));
    assert!(
        d.message.contains("unknown option") || d.message.contains("missing key"),
        "{}",
        d.message
    );
    let d = diag(&format!("a@x namespaces=\"x\", {k}"));
    assert!(
        d.message.contains("unexpected end of options"),
        "{}",
        d.message
    );
    let d = diag(&format!("a@x namespaces=\"x {k}"));
    assert!(d.message.contains("double quote"), "{}", d.message);
    let d = diag(&format!("a@x,,b@x {k}"));
    assert!(d.message.contains("empty entry"), "{}", d.message);
    let mismatched = k.replace("ssh-ed25519", "ssh-rsa");
    let d = diag(&format!("a@x {mismatched}"));
    assert!(
        d.message.contains("invalid public key") || d.message.contains("does not match"),
        "{}",
        d.message
    );
}

#[test]
fn good_lines_survive_bad_ones() {
    let text = format!("a@x {}\nbad line here\nb@x {}\n", key_text(1), key_text(2));
    let (s, d) = parse(&text);
    assert_eq!(s.entries().len(), 2);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].line, 2);
    assert_eq!(
        d[0].to_string().split(':').next().unwrap(),
        "line 2, column 5"
    );
}

proptest! {
    #[test]
    fn never_panics(text in "\\PC*") {
        let _ = parse(&text);
    }

    #[test]
    fn never_panics_on_near_valid_lines(
        prefix in "[a-z@.,*!?\" =\\-]{0,40}",
        opts in "[a-zA-Z=\",\\- 0-9Z]{0,60}",
    ) {
        let line = format!("{prefix} {opts} {}", key_text(7));
        let _ = parse(&line);
    }

    #[test]
    fn valid_lines_round_trip(
        principals in proptest::collection::vec("[a-z][a-z0-9._+-]{0,8}@[a-z]{1,8}\\.(com|org)", 1..4),
        namespaces in proptest::option::of(proptest::collection::vec("(medea-approve|git|file|medea-\\*)", 1..3)),
        after in proptest::option::of(1_000_000_000i64..1_500_000_000),
        span in 1i64..100_000_000,
        before_only in any::<bool>(),
        seed in 1u8..255,
        comment in "[a-zA-Z0-9 ]{0,20}",
    ) {
        let mut opts = Vec::new();
        if let Some(ns) = &namespaces {
            opts.push(format!("namespaces=\"{}\"", ns.join(",")));
        }
        let after_t = after.map(|a| Timestamp::from_second(a).unwrap());
        if let Some(a) = after_t && !before_only {
            opts.push(format!("valid-after=\"{}\"", format_time(a)));
        }
        let before_t = after.map(|a| Timestamp::from_second(a + span).unwrap());
        if let Some(b) = before_t {
            opts.push(format!("VALID-BEFORE=\"{}\"", format_time(b)));
        }
        let opts = if opts.is_empty() { String::new() } else { format!("{} ", opts.join(",")) };
        let line = format!("{}  {opts}{} {comment}", principals.join(","), key_text(seed));
        let (s, d) = parse(&line);
        prop_assert!(d.is_empty(), "{line}: {d:?}");
        prop_assert_eq!(s.entries().len(), 1);
        let e = &s.entries()[0];
        prop_assert_eq!(e.principals(), principals.join(","));
        prop_assert_eq!(e.namespaces().map(str::to_string), namespaces.map(|n| n.join(",")));
        prop_assert_eq!(e.valid_before(), before_t);
        prop_assert_eq!(e.valid_after(), if before_only { None } else { after_t });
        let expected = key(seed);
        prop_assert_eq!(e.key().key_data(), expected.key_data());
        // canonical form parses to the same entry (comment aside)
        let canonical = e.to_string();
        let (s2, d2) = parse(&canonical);
        prop_assert!(d2.is_empty(), "{canonical}: {d2:?}");
        let e2 = &s2.entries()[0];
        prop_assert_eq!(e2.principals(), e.principals());
        prop_assert_eq!(e2.namespaces(), e.namespaces());
        prop_assert_eq!(e2.valid_after(), e.valid_after());
        prop_assert_eq!(e2.valid_before(), e.valid_before());
        prop_assert_eq!(e2.key().key_data(), e.key().key_data());
    }
}
