//! Signatures both ways: ssh-keygen's verify in medea for every key type and hash, medea's
//! (key file, agent, P-521 with a short scalar) pass `ssh-keygen -Y verify`.

use super::*;

#[test]
fn ssh_keygen_signatures_are_approvals_for_every_key_type_and_hash() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan("a");
    for (name, kind) in KEY_TYPES {
        let key = keygen(dir.path(), name, kind);
        let principal = format!("{name}@example.com");
        let s = signers(&format!(
            "{principal} namespaces=\"medea-approve\" {}\n",
            key.public
        ));
        for hash in ["sha256", "sha512"] {
            let armored = keygen_sign(&key, "medea-approve", hash, &p.signed_message());
            let o = check(&armored, &s, &p, &[], &[]);
            let a = o.approved().unwrap_or_else(|| panic!("{name}/{hash}: {o}"));
            assert_eq!(a.principal, principal);
            assert_eq!(a.plan, p);
            assert_eq!(a.fingerprint, key.fingerprint(), "{name}");
            let expected = format!("approved plan {} by {principal} (", p.short());
            assert!(o.to_string().starts_with(&expected), "{o}");
        }
    }
}

#[test]
fn the_documented_echo_pipeline_signs_exactly_the_plan_message() {
    let dir = tempfile::tempdir().unwrap();
    let key = keygen(dir.path(), "alice", &["-t", "ed25519"]);
    let p = plan("echo");
    let cmd = medea::approval::ssh_keygen_command(&p)
        .replace("~/.ssh/id_ed25519", key.private.to_str().unwrap());
    let (pipeline, redirect) = cmd.split_once(" > ").unwrap();
    assert!(redirect.starts_with(&format!("approvals/{}-", p.short())));
    let out = Command::new("sh").arg("-c").arg(pipeline).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = signers(&format!("alice@example.com {}\n", key.public));
    let o = check(&String::from_utf8(out.stdout).unwrap(), &s, &p, &[], &[]);
    assert!(matches!(o, Outcome::Approved(_)), "{o}");
}

#[test]
fn medea_key_file_signatures_pass_ssh_keygen_verify() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan("b");
    for (name, kind) in KEY_TYPES {
        let key = keygen(dir.path(), name, kind);
        let KeyFile::Private(secret) = sign::load_key_file(&key.private).unwrap() else {
            panic!("{name}: private key file read as a public key");
        };
        let allowed = format!("alice@example.com {}\n", key.public);
        for hash in [HashAlg::Sha256, HashAlg::Sha512] {
            let signed =
                sign::sign_with_key(&secret, &p, hash).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert_eq!(signed.fingerprint, key.fingerprint());
            let (ok, text) = keygen_verify(
                dir.path(),
                &allowed,
                "alice@example.com",
                &signed.armored,
                &p.signed_message(),
            );
            assert!(ok, "{name}/{hash:?}: {text}");
            assert!(
                text.contains("Good \"medea-approve\" signature for alice@example.com"),
                "{text}"
            );
            // and ssh-keygen refuses it for another plan
            let (ok, _) = keygen_verify(
                dir.path(),
                &allowed,
                "alice@example.com",
                &signed.armored,
                &plan("c").signed_message(),
            );
            assert!(!ok, "{name}: verified over the wrong plan");
        }
        // a public key file means "the agent's key"
        assert!(matches!(
            sign::load_key_file(&key.public_path()).unwrap(),
            KeyFile::Public(_)
        ));
    }
}

#[test]
fn medea_agent_signatures_pass_ssh_keygen_verify() {
    let dir = tempfile::tempdir().unwrap();
    let agent = SshAgent::start(dir.path());
    let p = plan("agent");
    let mut keys = Vec::new();
    for (name, kind) in [KEY_TYPES[0], KEY_TYPES[1], KEY_TYPES[2], KEY_TYPES[4]] {
        let key = keygen(dir.path(), name, kind);
        agent.add(&key);
        keys.push((name, key));
    }
    let mut conn = Agent::connect(&agent.socket).unwrap();
    assert_eq!(conn.identities().unwrap().len(), 4);
    for (name, key) in &keys {
        let pk = ssh_key::PublicKey::from_openssh(&key.public).unwrap();
        let chosen = conn.choose(Some(&pk)).unwrap();
        let signed = conn.sign(&chosen, &p, HashAlg::Sha512).unwrap();
        let allowed = format!("bob@example.com {}\n", key.public);
        let (ok, text) = keygen_verify(
            dir.path(),
            &allowed,
            "bob@example.com",
            &signed.armored,
            &p.signed_message(),
        );
        assert!(ok, "{name}: {text}");
        if *name == "rsa" {
            let sig: ssh_key::SshSig = signed.armored.parse().unwrap();
            assert_eq!(
                sig.algorithm().as_str(),
                "rsa-sha2-512",
                "never SHA-1 ssh-rsa"
            );
        }
        let s = signers(&allowed);
        assert!(matches!(
            check(&signed.armored, &s, &p, &[], &[]),
            Outcome::Approved(_)
        ));
    }
    // several keys and no choice: a clear error naming them
    let e = conn.choose(None).unwrap_err();
    assert!(matches!(e, SignError::AgentAmbiguous { .. }));
    assert!(e.to_string().contains("--key PATH.pub"), "{e}");
    // a key the agent does not hold
    let stranger = keygen(dir.path(), "stranger", &["-t", "ed25519"]);
    let e = conn
        .choose(Some(
            &ssh_key::PublicKey::from_openssh(&stranger.public).unwrap(),
        ))
        .unwrap_err();
    assert!(matches!(e, SignError::AgentKeyMissing { .. }), "{e}");
    drop(conn);
    drop(agent);
}

#[test]
fn p521_keys_with_a_short_scalar_load_and_sign() {
    // About half of OpenSSH's P-521 keys store a scalar shorter than 66 bytes, which ssh-key
    // 0.6.7 refuses to read; medea re-pads it (sign::load_key_file). Find such a key.
    let dir = tempfile::tempdir().unwrap();
    let p = plan("p521");
    let mut found = None;
    for i in 0..40 {
        let key = keygen(
            dir.path(),
            &format!("p521-{i}"),
            &["-t", "ecdsa", "-b", "521"],
        );
        let text = std::fs::read_to_string(&key.private).unwrap();
        if ssh_key::PrivateKey::from_openssh(&text).is_err() {
            found = Some(key);
            break;
        }
    }
    let key = found.expect("no P-521 key in 40 that ssh-key rejects: has ssh-key fixed its scalar decoding? then drop sign::pad_ecdsa_scalar");
    let KeyFile::Private(secret) = sign::load_key_file(&key.private).unwrap() else {
        panic!("read as a public key");
    };
    assert_eq!(
        secret
            .public_key()
            .to_openssh()
            .unwrap()
            .split_whitespace()
            .nth(1),
        key.public.split_whitespace().nth(1)
    );
    let signed = sign::sign_with_key(&secret, &p, HashAlg::Sha512).unwrap();
    let allowed = format!("alice@example.com {}\n", key.public);
    let (ok, text) = keygen_verify(
        dir.path(),
        &allowed,
        "alice@example.com",
        &signed.armored,
        &p.signed_message(),
    );
    assert!(ok, "{text}");
}
