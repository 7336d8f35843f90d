//! `medea serve` as a process: flags, environment, TLS files, an empty token.

use super::*;

/// A `medea serve` child process; killed on drop.
struct ServeProcess {
    child: std::process::Child,
    addr: String,
    log: Vec<String>,
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run `cmd` (a `medea serve …`) until it logs its API address; `Err(stderr)` when it exits
/// first.
fn spawn_serve(mut cmd: std::process::Command) -> Result<ServeProcess, String> {
    use std::io::BufRead;
    cmd.env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Keep draining after the test stops listening: a closed pipe would fail the
        // server's next log write.
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let mut log = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => {
                let addr = line
                    .contains("API listening")
                    .then(|| {
                        line.split_whitespace()
                            .find_map(|w| w.strip_prefix("addr="))
                            .map(str::to_string)
                    })
                    .flatten();
                log.push(line);
                if let Some(addr) = addr {
                    return Ok(ServeProcess { child, addr, log });
                }
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(log.join("\n"));
            }
        }
    }
}

/// `medea serve` with the client environment exported (`MEDEA_TOKEN`, `MEDEA_CA`,
/// `MEDEA_ADDR`): its own `--token-file` wins, and so does a client's `--token-file`; TLS files
/// named but missing are generated self-signed at exactly those paths, trusted by the client
/// with `--ca <cert>`, and reused on the next start.
#[test]
fn serve_with_the_client_environment_uses_its_flags_and_generates_tls_at_the_given_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, "file-token\n").unwrap();
    let tls = tmp.path().join("etc/medea/tls");
    let (cert, key) = (tls.join("cert.pem"), tls.join("key.pem"));
    let state = tmp.path().join("state");
    let serve = || {
        let mut c = crate::cli::medea();
        c.args(["serve", "--listen", "127.0.0.1:0", "--desired"])
            .arg(examples())
            .arg("--state-dir")
            .arg(&state)
            .arg("--token-file")
            .arg(&token_file)
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            // The client's environment, as the README's workflow exports it.
            .env("MEDEA_TOKEN", "env-token")
            .env("MEDEA_CA", tmp.path().join("elsewhere.crt"))
            .env("MEDEA_ADDR", "localhost:7600");
        c
    };
    let first = spawn_serve(serve()).unwrap_or_else(|log| panic!("serve did not start:\n{log}"));
    let log = first.log.join("\n");
    assert!(log.contains("generated a self-signed certificate"), "{log}");
    assert!(
        !log.contains("file-token") && !log.contains("env-token"),
        "{log}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&key), 0o600);
    assert_eq!(mode(&tls), 0o700);
    let pem = std::fs::read_to_string(&cert).unwrap();

    let client = |args: &[&str]| {
        crate::cli::medea()
            .args(["get", "clusters", "--addr", &first.addr, "--ca"])
            .arg(&cert)
            .args(args)
            .env("MEDEA_TOKEN", "env-token")
            .output()
            .unwrap()
    };
    // The server took its token from --token-file, not from MEDEA_TOKEN.
    let out = client(&[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wrong bearer token"), "{err}");
    // The client's --token-file beats its MEDEA_TOKEN too; --ca <cert> trusts the server.
    let tf = token_file.to_str().unwrap();
    let out = client(&["--token-file", tf]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(client(&["--token", "file-token"]).status.success());
    drop(first);

    // The next start reuses the files.
    let second = spawn_serve(serve()).unwrap_or_else(|log| panic!("restart:\n{log}"));
    assert!(
        !second.log.join("\n").contains("generated a self-signed"),
        "{}",
        second.log.join("\n")
    );
    assert_eq!(std::fs::read_to_string(&cert).unwrap(), pem);
    drop(second);

    // One file there, the other missing: a clear error, nothing written.
    std::fs::remove_file(&key).unwrap();
    let err = spawn_serve(serve()).err().expect("refused");
    assert!(err.contains("key") && err.contains("does not"), "{err}");
    assert!(!key.exists());
}

/// `--token ''` and `MEDEA_TOKEN=` are refused at startup, by serve (before creating anything)
/// and by the clients (before connecting).
#[test]
fn an_empty_token_is_refused_at_startup() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let serve = |token: Option<&str>, env: Option<&str>| {
        let mut c = crate::cli::medea();
        c.args(["serve", "--listen", "127.0.0.1:0", "--desired"])
            .arg(examples())
            .arg("--state-dir")
            .arg(&state)
            .env_remove("MEDEA_TOKEN")
            .env_remove("MEDEA_TOKEN_FILE");
        if let Some(t) = token {
            c.args(["--token", t]);
        }
        if let Some(e) = env {
            c.env("MEDEA_TOKEN", e);
        }
        c.output().unwrap()
    };
    for (out, what) in [
        (serve(Some(""), None), "--token is empty"),
        (serve(None, Some("")), "MEDEA_TOKEN is empty"),
        (serve(None, Some("  ")), "MEDEA_TOKEN is empty"),
    ] {
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(what), "{err}");
        assert!(!state.exists(), "nothing was created");
    }
    // Clients: refused before any connection (nothing listens on port 1).
    let out = crate::cli::medea()
        .args(["get", "clusters", "--insecure", "--addr", "127.0.0.1:1"])
        .env("MEDEA_TOKEN", "")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("MEDEA_TOKEN is empty"), "{err}");
    let out = crate::cli::medea()
        .args(["plan", "--insecure", "--addr", "127.0.0.1:1", "--token", ""])
        .env_remove("MEDEA_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--token is empty"), "{err}");
}
