//! The trust root (`--allowed-signers`, issue 19): refused at start when unusable, the last
//! good file kept after start.

use super::*;

/// Issue 19: a missing, unreadable or bad `--allowed-signers`, or one inside the desired-state
/// directory, stops `medea serve` at startup with the reason.
#[test]
fn serve_refuses_to_start_without_a_usable_trust_root() {
    let tmp = tempfile::tempdir().unwrap();
    let desired = tmp.path().join("desired");
    copy_dir(&examples(), &desired);
    let (_, alice_pub) = keygen(tmp.path(), "alice");
    let bad = tmp.path().join("bad_signers");
    std::fs::write(&bad, "alice@example.com ssh-ed25519 ???\n").unwrap();
    let inside = desired.join("allowed_signers");
    std::fs::write(&inside, format!("alice@example.com {alice_pub}\n")).unwrap();
    let unreadable = tmp.path().join("a_directory");
    std::fs::create_dir_all(&unreadable).unwrap();
    for (signers, want) in [
        (
            tmp.path().join("missing"),
            "cannot read the allowed signers file",
        ),
        (unreadable, "cannot read the allowed signers file"),
        (bad, "has errors"),
        (inside, "is inside the desired-state directory"),
    ] {
        let out = crate::cli::medea()
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--token",
                "t0ken-for-tests",
                "--desired",
            ])
            .arg(&desired)
            .arg("--state-dir")
            .arg(tmp.path().join("state"))
            .arg("--allowed-signers")
            .arg(&signers)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", signers.display());
        assert!(err.contains(want), "{}: {err}", signers.display());
    }
}

/// Issue 19: after start, a broken allowed_signers keeps the last good file in force; the
/// problem shows in `medea get server` and the metric.
#[test]
fn a_broken_trust_root_after_start_keeps_the_last_good_file() {
    let tmp = tempfile::tempdir().unwrap();
    let desired = tmp.path().join("desired");
    copy_dir(&examples(), &desired);
    let (alice, alice_pub) = keygen(tmp.path(), "alice");
    let signers = tmp.path().join("allowed_signers");
    std::fs::write(&signers, format!("alice@example.com {alice_pub}\n")).unwrap();
    let s = start_with(
        desired.clone(),
        vec![home_inventory()],
        Some(signers.clone()),
        false,
    );
    let v: serde_json::Value = serde_json::from_slice(
        &s.cli()
            .args(["get", "server", "-o", "json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(v["allowedSignersProblem"], "", "{v:#}");

    std::fs::write(&signers, "garbage\n").unwrap();
    let json = s.cli().args(["plan", "-o", "json"]).output().unwrap();
    let short = serde_json::from_slice::<serde_json::Value>(&json.stdout).unwrap()["shortId"]
        .as_str()
        .unwrap()
        .to_string();
    // alice (in the last good file) still approves; the reload failure is reported.
    let out = s
        .cli()
        .args(["approve", &short, "--key"])
        .arg(&alice)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("approved plan"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(
        &s.cli()
            .args(["get", "server", "-o", "json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(
        v["allowedSignersProblem"]
            .as_str()
            .is_some_and(|p| p.contains("has errors")),
        "{v:#}"
    );
    let out = s.cli().args(["get", "server"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ERROR allowed signers"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
