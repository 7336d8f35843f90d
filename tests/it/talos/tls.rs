//! TLS and talosconfig: CA and server-name checks, parsing and its errors, secret file modes.

use super::*;

#[tokio::test]
async fn a_foreign_ca_is_a_tls_error_and_is_not_retried() {
    let a = env("v1.13.9").await;
    let b = env("v1.13.9").await;
    let cfg = TalosConfig::load(&b.talosconfig).unwrap();
    let mut ctx = cfg.context(None).unwrap();
    ctx.endpoints = vec![medea::talos::Endpoint::new(
        "127.0.0.1",
        a.sim.addr().port(),
    )];
    let client = TalosClient::new(&ctx, fast()).unwrap();
    let err = client.version(&node("cp-1")).await.unwrap_err();
    assert!(matches!(err, TalosError::Tls { .. }), "{err}");
    assert_eq!(a.sim.counters("cp-1").unwrap().calls(Method::Version), 0);
}

#[tokio::test]
async fn the_server_name_is_the_endpoint_host() {
    let e = env("v1.13.9").await;
    let cfg = TalosConfig::load(&e.talosconfig).unwrap();
    let mut ctx = cfg.context(None).unwrap();
    ctx.endpoints = vec![medea::talos::Endpoint::new(
        "localhost",
        e.sim.addr().port(),
    )];
    let client = TalosClient::new(&ctx, fast()).unwrap();
    client.version(&node("cp-1")).await.unwrap();
}

fn sim_talosconfig_text(e: &Env) -> String {
    std::fs::read_to_string(&e.talosconfig).unwrap()
}

/// Replace the value of `field:` in the (single) context.
fn with_field(text: &str, field: &str, value: &str) -> String {
    text.lines()
        .map(|l| {
            if l.trim_start().starts_with(&format!("{field}:")) {
                let indent = &l[..l.len() - l.trim_start().len()];
                format!("{indent}{field}: {value}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn key_pem(label: &str, der: &[u8]) -> String {
    let b64 = BASE64.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

#[tokio::test]
async fn talosconfig_parsing_and_errors() {
    let e = env("v1.13.9").await;
    let text = sim_talosconfig_text(&e);
    let p = Path::new("talosconfig");

    // The simulator writes the Talos flavour: an `ED25519 PRIVATE KEY`, accepted once relabelled.
    let key_b64 = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("key: "))
        .unwrap()
        .to_string();
    let key = String::from_utf8(BASE64.decode(&key_b64).unwrap()).unwrap();
    assert!(key.starts_with("-----BEGIN ED25519 PRIVATE KEY-----"));
    let ctx = TalosConfig::parse(&text, p).unwrap().context(None).unwrap();
    assert_eq!(ctx.key.algorithm(), KeyAlgorithm::Ed25519);
    assert_eq!(ctx.nodes, ["127.5.0.2"]);
    let dbg = format!("{ctx:?}");
    assert!(
        !dbg.contains("PRIVATE KEY") && !dbg.contains(&key_b64),
        "{dbg}"
    );

    // Missing context.
    let err = TalosConfig::parse(&text, p)
        .unwrap()
        .context(Some("prod"))
        .unwrap_err();
    assert!(
        matches!(&err, TalosConfigError::MissingContext { context, .. } if context == "prod"),
        "{err}"
    );
    assert!(err.to_string().contains("available: medea-sim"), "{err}");
    // No current context.
    let err = TalosConfig::parse(&with_field(&text, "context", "''"), p)
        .unwrap()
        .context(None)
        .unwrap_err();
    assert!(matches!(err, TalosConfigError::NoContext { .. }), "{err}");
    // Bad base64.
    let err = TalosConfig::parse(&with_field(&text, "ca", "not*base64!"), p)
        .unwrap()
        .context(None)
        .unwrap_err();
    assert!(
        matches!(err, TalosConfigError::Base64 { field: "ca", .. }),
        "{err}"
    );
    // Missing key.
    let err = TalosConfig::parse(&with_field(&text, "key", "''"), p)
        .unwrap()
        .context(None)
        .unwrap_err();
    assert!(
        matches!(err, TalosConfigError::MissingField { field: "key", .. }),
        "{err}"
    );
    // Not a PEM key at all.
    let err = TalosConfig::parse(&with_field(&text, "key", &BASE64.encode("hello")), p)
        .unwrap()
        .context(None)
        .unwrap_err();
    assert!(matches!(err, TalosConfigError::NoKey { .. }), "{err}");
    // A PKCS#8 key that is neither Ed25519, ECDSA nor RSA (X25519, OID 1.3.101.110).
    let mut x25519 = vec![
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x04, 0x22, 0x04,
        0x20,
    ];
    x25519.extend([7u8; 32]);
    let pem = key_pem("PRIVATE KEY", &x25519);
    let err = TalosConfig::parse(&with_field(&text, "key", &BASE64.encode(pem)), p)
        .unwrap()
        .context(None)
        .unwrap_err();
    assert!(
        matches!(err, TalosConfigError::UnsupportedKey { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("not an Ed25519, ECDSA or RSA"),
        "{err}"
    );
    // An ECDSA key is accepted.
    let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let ctx = TalosConfig::parse(
        &with_field(&text, "key", &BASE64.encode(ec.serialize_pem())),
        p,
    )
    .unwrap()
    .context(None)
    .unwrap();
    assert_eq!(ctx.key.algorithm(), KeyAlgorithm::Ecdsa);
    // No endpoints.
    let err = TalosConfig::parse("context: a\ncontexts:\n  a:\n    endpoints: []\n", p)
        .unwrap()
        .context(None)
        .unwrap_err();
    assert!(matches!(err, TalosConfigError::NoEndpoints { .. }), "{err}");
    // A file that is not there.
    let err = TalosConfig::load(Path::new("/nonexistent/talosconfig")).unwrap_err();
    assert!(matches!(err, TalosConfigError::Read { .. }), "{err}");
}

#[tokio::test]
async fn secrets_are_written_0600_in_0700_dirs() {
    let e = env("v1.13.9").await;
    assert_eq!(mode(&e.talosconfig), 0o600);
    assert_eq!(mode(e.talosconfig.parent().unwrap()), 0o700);

    let loose = e.dir.path().join("loose");
    std::fs::create_dir(&loose).unwrap();
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = e.sim.write_talosconfig(&loose).unwrap_err();
    assert!(
        err.source_chain_contains("accessible by other users"),
        "{err}"
    );
    assert!(!loose.join(TALOSCONFIG_FILE).exists(), "nothing written");
}

trait ChainExt {
    fn source_chain_contains(&self, s: &str) -> bool;
}
impl<E: std::error::Error> ChainExt for E {
    fn source_chain_contains(&self, s: &str) -> bool {
        let mut cur: Option<&dyn std::error::Error> = Some(self);
        while let Some(e) = cur {
            if e.to_string().contains(s) {
                return true;
            }
            cur = e.source();
        }
        false
    }
}
