//! Issue #49 item 7, the low items: medea's state never lands in the desired work tree, an
//! existing directory is never re-moded, nothing is read from the working directory when HOME
//! is unset, and `--insecure` never sends the local server's token.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn medea() -> Command {
    Command::new(env!("CARGO_BIN_EXE_medea"))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Run `cmd` to its end, within `limit` (killed and failed otherwise): its exit success and
/// its stdout and stderr.
fn run_within(mut cmd: Command, limit: Duration) -> (bool, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `--state-dir` (or `--creds-dir`) inside the desired-state directory is refused before any
/// file is written: medea's token, TLS key and store would be committed with the repository.
#[test]
fn serve_refuses_a_state_dir_inside_the_desired_work_tree_before_writing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let desired = dir.path().join("repo");
    crate::fixtures::copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples"),
        &desired,
    );
    for (flag, inside) in [
        ("--state-dir", desired.join(".medea")),
        ("--creds-dir", desired.join("home/creds")),
    ] {
        let mut cmd = medea();
        cmd.args(["serve", "--desired"]).arg(&desired).args([
            "--listen",
            "127.0.0.1:0",
            "--token",
            "t0k3n",
        ]);
        if flag == "--creds-dir" {
            cmd.arg("--state-dir").arg(dir.path().join("state"));
        }
        cmd.arg(flag).arg(&inside);
        let (ok, said) = run_within(cmd, Duration::from_secs(60));
        assert!(!ok, "{said}");
        assert!(
            said.contains("inside the desired-state work tree"),
            "{flag}: {said}"
        );
        assert!(!inside.exists(), "{flag}: nothing was written: {said}");
        assert!(
            !dir.path().join("state").exists(),
            "{flag}: nothing was written: {said}"
        );
    }
}

/// A directory that exists is never re-moded: medea used to make an existing state or store
/// directory 0700 (`--state-dir $HOME` made a home directory 0700). What medea creates is 0700
/// and its files 0600.
#[test]
fn an_existing_directory_is_never_re_moded() {
    let dir = tempfile::tempdir().unwrap();
    let existing = dir.path().join("home");
    std::fs::create_dir(&existing).unwrap();
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o755)).unwrap();
    medea::server::secrets::write_private(&existing.join("token"), b"x").unwrap();
    assert_eq!(
        mode(&existing),
        0o755,
        "the existing directory is as it was"
    );
    assert_eq!(mode(&existing.join("token")), 0o600);
    medea::store::fjall::create_private_dir(&existing).unwrap();
    assert_eq!(mode(&existing), 0o755);
    medea::server::secrets::write_private(&existing.join("tls/key.pem"), b"k").unwrap();
    assert_eq!(
        mode(&existing.join("tls")),
        0o700,
        "what medea creates is 0700"
    );
}

/// With HOME unset, the CLI reads no client context and no local server's token from the
/// working directory (it used to read `./.config/medea/config.yaml` and
/// `./.local/state/medea/token`): whoever can write the directory someone runs medea in chose
/// the address the token went to.
#[test]
fn with_home_unset_nothing_is_read_from_the_working_directory() {
    let cwd = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(cwd.path().join(".config/medea")).unwrap();
    std::fs::write(
        cwd.path().join(".config/medea/config.yaml"),
        "currentContext: planted\ncontexts: [ this is not a context\n",
    )
    .unwrap();
    // A token "file" that cannot be read: reading it is an error that says so.
    std::fs::create_dir_all(cwd.path().join(".local/state/medea/token")).unwrap();
    let port = crate::fixtures::free_port();
    let mut cmd = medea();
    cmd.current_dir(cwd.path())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["get", "server", "--addr", &format!("127.0.0.1:{port}")]);
    let (ok, said) = run_within(cmd, Duration::from_secs(60));
    assert!(!ok, "nothing listens there: {said}");
    assert!(
        !said.contains("config.yaml"),
        "no context file read: {said}"
    );
    // (the no-CA error's help may name the word `token` as advice; reading the planted
    // "file" would name its path and fail on it)
    assert!(
        !said.contains("medea/token") && !said.contains("directory (os error"),
        "no token file read: {said}"
    );
}

/// `--insecure` (no certificate check, loopback only) never sends the token a local `medea
/// serve` keeps in its state directory: an unverified server on the loopback port may be
/// another local user's listener. With a CA the local token is still used.
#[test]
fn insecure_never_sends_the_local_state_dir_token() {
    let home = tempfile::tempdir().unwrap();
    let state = home.path().join("state");
    // A token "file" that cannot be read: reading it is an error that says so.
    std::fs::create_dir_all(state.join("token")).unwrap();
    let ca = home.path().join("ca.crt");
    std::fs::write(&ca, "not a certificate").unwrap();
    let port = crate::fixtures::free_port();
    let run = |extra: &[&str], ca: Option<&Path>| {
        let mut cmd = medea();
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .env("MEDEA_STATE_DIR", &state)
            .args(["get", "server", "--addr", &format!("127.0.0.1:{port}")])
            .args(extra);
        if let Some(ca) = ca {
            cmd.arg("--ca").arg(ca);
        }
        run_within(cmd, Duration::from_secs(60))
    };
    let (ok, said) = run(&["--insecure"], None);
    assert!(!ok, "{said}");
    assert!(
        !said.contains("token file"),
        "the local token is not read: {said}"
    );
    let (ok, said) = run(&[], Some(&ca));
    assert!(!ok, "{said}");
    assert!(
        said.contains("token file"),
        "without --insecure the local token is used: {said}"
    );
}
