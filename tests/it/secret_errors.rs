//! Issue #49 item 2: no secret in an error's text. A typo in a file that holds a secret used to
//! put the secret into every error about it: the YAML parser's message quotes what it could not
//! read, and that message went into the `backup.failed` webhook (Slack included), the `medea
//! backup now` error a token holder sees, and the log. Each secret-bearing file is fed a typo
//! next to a marker secret here, and the marker appears nowhere; the error still names the file
//! and the line.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

/// The secret planted in every file.
const MARKER: &str = "MARKERSECRET0a1b2c3d4e5f";

/// S3 credentials with a typo (the colon after `secretAccessKey` forgotten), end to end through
/// the daemon: the scheduled backup fails and says so in the log and a `backup.failed` webhook,
/// `medea backup now` fails with the server's error, and none of them holds the secret access
/// key; they name the file and its line.
#[test]
fn a_typo_in_s3_credentials_puts_the_secret_in_no_log_webhook_api_error_or_cli_output() {
    let (hook, got) = crate::backup_s3::receiver();
    let alice_age = age::x25519::Identity::generate();
    let block = format!(
        "spec:\n  backup:\n    schedule: '0 3 * * *'\n    destination: offsite\n    recipients: [{}]\n",
        alice_age.to_public()
    );
    let s = crate::fixtures::serve::serve()
        .talos("v1.14.6")
        .kubernetes("v1.35.8")
        .desired_edit("home/cluster.yaml", "spec:\n", &block)
        .webhook(&hook)
        .start();
    let dest = medea::backup::s3::destination_dir(&s.state.join("creds"), "home", "offsite");
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::write(
        dest.join("destination.yaml"),
        "kind: s3\nendpoint: http://127.0.0.1:9\nbucket: medea\npathStyle: true\nattempts: 1\n",
    )
    .unwrap();
    let cred = dest.join("credentials");
    std::fs::write(
        &cred,
        format!("accessKeyId: AKIAEXAMPLE\nsecretAccessKey {MARKER}\nsessionToken: t\n"),
    )
    .unwrap();
    std::fs::set_permissions(&cred, std::fs::Permissions::from_mode(0o600)).unwrap();

    let mut plan = serde_json::Value::Null;
    crate::fixtures::wait(
        "the plan with the backup settings",
        Duration::from_secs(60),
        || {
            plan = s.plan_json();
            plan.to_string().contains("backup.destination")
        },
    );
    let (id, short) = (
        plan["id"].as_str().unwrap().to_string(),
        plan["shortId"].as_str().unwrap().to_string(),
    );
    std::fs::create_dir_all(s.desired.join("approvals")).unwrap();
    for who in ["alice", "bob"] {
        std::fs::write(
            s.desired.join(format!("approvals/{short}-{who}.sig")),
            crate::fixtures::sign(&s.key(who), &id),
        )
        .unwrap();
    }
    // The scheduled backup (due at once) fails on the credentials: a webhook says so.
    crate::fixtures::wait("the backup.failed webhook", Duration::from_secs(90), || {
        got.lock()
            .unwrap()
            .iter()
            .any(|b| b["event"] == "backup.failed" && b["cluster"] == "home")
    });
    // A token holder asks for one: refused, with the server's error.
    let out = s
        .cli()
        .args(["backup", "now", "--cluster", "home"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let cli = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let bodies: Vec<String> = got.lock().unwrap().iter().map(|b| b.to_string()).collect();
    let failed = bodies
        .iter()
        .find(|b| b.contains("backup.failed"))
        .unwrap()
        .clone();
    let log = s.serve_log();
    for (what, text) in [
        ("the CLI's output", &cli),
        ("the backup.failed webhook", &failed),
        ("the server's log", &log),
    ] {
        assert!(!text.contains(MARKER), "{what} holds the secret: {text}");
    }
    for b in &bodies {
        assert!(!b.contains(MARKER), "a webhook holds the secret: {b}");
    }
    // What they do say: the file and the line, so the operator can fix it.
    for (what, text) in [("the CLI's output", &cli), ("the webhook", &failed)] {
        assert!(
            text.contains("offsite/credentials") && text.contains(" line "),
            "{what} names the file and the line: {text}"
        );
    }
    assert!(
        log.contains("offsite/credentials"),
        "the log names the file"
    );
}

/// A health source's token file (also an HTTP hook's: the same reader) with a typo: a second
/// line, and bytes that are not UTF-8. The request is refused naming the file, never the token.
#[tokio::test]
async fn a_typo_in_a_health_or_hook_token_puts_the_secret_in_no_error() {
    use medea::health::http::{Credentials, Request, exchange};
    let dir = tempfile::tempdir().unwrap();
    let cred = dir.path().join("prom");
    std::fs::create_dir(&cred).unwrap();
    std::fs::set_permissions(&cred, std::fs::Permissions::from_mode(0o700)).unwrap();
    let token = cred.join("token");
    let endpoint = medea::plan::health::Endpoint {
        url: "https://127.0.0.1:9".into(),
        credential: Some("prom".into()),
    };
    let mut bad_utf8 = MARKER.as_bytes().to_vec();
    bad_utf8.extend_from_slice(b"\xff\xfe\n");
    for body in [
        format!("{MARKER}\nBearer {MARKER}\n").into_bytes(),
        format!("token: {MARKER}\x7f\n").into_bytes(),
        bad_utf8,
    ] {
        std::fs::write(&token, &body).unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = exchange(
            &endpoint,
            &Credentials::Dir(dir.path().to_path_buf()),
            Request::Get,
            "/api/v1/query",
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        let shown = format!("{} {e:?}", medea::error_chain(&e));
        assert!(!shown.contains(MARKER), "{shown}");
        assert!(shown.contains("prom/token"), "{shown}");
    }
}

/// The API token file with a typo (a second line, a control character, bytes that are not
/// UTF-8): the CLI refuses it before it sends anything, and says which file, never its content.
#[test]
fn a_typo_in_the_api_token_file_puts_the_secret_in_no_cli_output() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    let mut bad_utf8 = MARKER.as_bytes().to_vec();
    bad_utf8.extend_from_slice(b"\xff\xfe\n");
    for body in [
        format!("{MARKER}\nsecond {MARKER}\n").into_bytes(),
        format!("{MARKER}\x07\n").into_bytes(),
        bad_utf8,
    ] {
        std::fs::write(&file, &body).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_medea"))
            .args([
                "get",
                "server",
                "--addr",
                "127.0.0.1:9",
                "--insecure",
                "--token-file",
            ])
            .arg(&file)
            .env_remove("MEDEA_TOKEN")
            .env_remove("MEDEA_CONTEXT")
            .env("HOME", dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success());
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!said.contains(MARKER), "{said}");
    }
}
