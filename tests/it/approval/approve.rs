//! `medea approve`: a marker that ssh-keygen and medea accept, signing through the agent, clear
//! refusals that write nothing.

use super::*;

/// stderr with miette's wrapping undone (box-drawing margins removed, whitespace collapsed).
fn flat(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .replace(['│', '×'], " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn approve_cmd(args: &[&str]) -> std::process::Output {
    medea()
        .arg("approve")
        .args(args)
        .env_remove("SSH_AUTH_SOCK")
        .output()
        .unwrap()
}

#[test]
fn medea_approve_writes_a_marker_that_ssh_keygen_and_medea_accept() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = keygen(d, "alice", &["-t", "ed25519"]);
    let allowed = format!("alice@example.com,alice@corp.example {}\n", key.public);
    let allowed_path = d.join("allowed_signers");
    std::fs::write(&allowed_path, &allowed).unwrap();
    let repo = d.join("repo");
    std::fs::create_dir(&repo).unwrap();
    let p = plan("cli");
    let full = p.to_hex();

    let out = approve_cmd(&[
        &full,
        "--key",
        key.private.to_str().unwrap(),
        "--allowed-signers",
        allowed_path.to_str().unwrap(),
        "--write-marker",
        "--desired",
        repo.to_str().unwrap(),
    ]);
    let stderr = flat(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let marker = repo.join(format!("approvals/{}-alice@example.com.sig", p.short()));
    assert!(
        stderr.contains(&format!("approvals/{}-alice@example.com.sig", p.short())),
        "{stderr}"
    );
    let armored = std::fs::read_to_string(&marker).unwrap();
    let (ok, text) = keygen_verify(
        d,
        &allowed,
        "alice@example.com",
        &armored,
        &p.signed_message(),
    );
    assert!(ok, "{text}");
    assert!(matches!(
        check(&armored, &signers(&allowed), &p, &[], &[]),
        Outcome::Approved(_)
    ));
    // the same approval again is fine (idempotent), a different one is refused
    let again = approve_cmd(&[
        &full,
        "--key",
        key.private.to_str().unwrap(),
        "--principal",
        "alice@example.com",
        "--write-marker",
        "--desired",
        repo.to_str().unwrap(),
    ]);
    // ed25519 signatures are deterministic, so this is the same file
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let other_hash = approve_cmd(&[
        &full,
        "--key",
        key.private.to_str().unwrap(),
        "--principal",
        "alice@example.com",
        "--write-marker",
        "--desired",
        repo.to_str().unwrap(),
        "--hash",
        "sha256",
    ]);
    assert!(!other_hash.status.success());
    assert!(flat(&other_hash.stderr).contains("already exists"));
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        armored,
        "marker unchanged"
    );
}

#[test]
fn medea_approve_signs_through_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = SshAgent::start(d);
    let key = keygen(d, "bob", &["-t", "ecdsa", "-b", "384"]);
    agent.add(&key);
    let p = plan("cli-agent");
    let out = medea()
        .args(["approve", &p.to_hex(), "--output", "-"])
        .env("SSH_AUTH_SOCK", &agent.socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let armored = String::from_utf8(out.stdout).unwrap();
    let allowed = format!("bob@example.com {}\n", key.public);
    let (ok, text) = keygen_verify(
        d,
        &allowed,
        "bob@example.com",
        &armored,
        &p.signed_message(),
    );
    assert!(ok, "{text}");
    // --key KEY.pub selects the agent's key
    let out = medea()
        .args(["approve", &p.to_hex(), "--output", "-", "--key"])
        .arg(key.public_path())
        .env("SSH_AUTH_SOCK", &agent.socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(agent);
}

#[test]
fn medea_approve_refuses_clearly_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = keygen(d, "alice", &["-t", "ed25519"]);
    let stranger = keygen(d, "stranger", &["-t", "ed25519"]);
    let allowed_path = d.join("allowed_signers");
    std::fs::write(&allowed_path, format!("alice@example.com {}\n", key.public)).unwrap();
    let repo = d.join("repo");
    std::fs::create_dir(&repo).unwrap();
    let p = plan("refuse");
    let full = p.to_hex();
    let short = p.short();
    let k = key.private.to_str().unwrap();
    let repo_s = repo.to_str().unwrap();
    let signers_s = allowed_path.to_str().unwrap();

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![&short, "--key", k, "--output", "-"],
            "is a short plan id",
        ),
        (vec!["XYZ", "--key", k, "--output", "-"], "invalid plan id"),
        // No marker, no output: submit to the server, which is not there.
        (vec![&full, "--key", k], "localhost:7600"),
        (
            vec![&full, "--key", k, "--write-marker", "--desired", repo_s],
            "needs your principal",
        ),
        (vec![&full, "--output", "-"], "SSH_AUTH_SOCK"),
        (
            vec![
                &full,
                "--key",
                stranger.private.to_str().unwrap(),
                "--allowed-signers",
                signers_s,
                "--write-marker",
                "--desired",
                repo_s,
            ],
            "unknown key",
        ),
        (
            vec![
                &full,
                "--key",
                k,
                "--allowed-signers",
                signers_s,
                "--principal",
                "mallory@example.com",
                "--write-marker",
                "--desired",
                repo_s,
            ],
            "not listed for key",
        ),
    ];
    for (args, expected) in cases {
        let out = approve_cmd(&args);
        let stderr = flat(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            stderr.contains(expected),
            "{args:?}: expected `{expected}` in:\n{stderr}"
        );
    }
    assert!(
        !repo.join("approvals").exists(),
        "a refused approval wrote a marker"
    );

    // passphrase-protected key
    let locked = d.join("locked");
    let out = ssh_keygen()
        .args(["-q", "-t", "ed25519", "-N", "secret passphrase", "-f"])
        .arg(&locked)
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = approve_cmd(&[&full, "--key", locked.to_str().unwrap(), "--output", "-"]);
    let stderr = flat(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("passphrase-protected") && stderr.contains("ssh-add"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    // a broken allowed signers file is reported with its line
    std::fs::write(
        &allowed_path,
        format!("alice@example.com cert-authority {}\n", key.public),
    )
    .unwrap();
    let out = approve_cmd(&[
        &full,
        "--key",
        k,
        "--allowed-signers",
        signers_s,
        "--output",
        "-",
    ]);
    let stderr = flat(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("allowed_signers:1:19: `cert-authority` is not supported")
            && stderr.contains("cert-authority"),
        "{stderr}"
    );
}
