//! Access: the API over TLS with its token, clients finding a server (flags, contexts, the
//! local state directory), the generated token and TLS files.

use super::*;

#[test]
fn get_machines_clusters_and_pools_over_tls_with_token() {
    let s = start(examples(), vec![home_inventory()]);
    let out = s
        .cli()
        .args(["get", "machines", "--cluster", "home"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("CLUSTER  POOL          NODE  ROLE"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 7, "{text}");
    assert!(
        text.contains("home     controlplane  cp-1  controlplane  v1.12.4"),
        "{text}"
    );
    assert!(
        text.contains("home     workers       w-3   worker        v1.12.4"),
        "{text}"
    );

    let out = s
        .cli()
        .args(["get", "clusters", "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["name"], "home");
    assert_eq!(v[0]["kubernetesVersion"], "v1.34.1");
    assert_eq!(v[0]["desiredKubernetesVersion"], "v1.35.8");
    assert_eq!(v[0]["rolloutsEnabled"], false);
    assert_eq!(v[1]["name"], "prod");
    assert_eq!(v[1]["observed"], false);

    let out = s
        .cli()
        .args(["get", "nodepools", "--cluster", "home", "-o", "yaml"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("desiredTalosVersion: v1.14.6"), "{text}");
    assert!(text.contains("- v1.12.4"), "{text}");
}

#[test]
fn wrong_or_missing_token_is_unauthenticated_and_names_the_fix() {
    let s = start(examples(), vec![]);
    let out = s
        .cli()
        .env("MEDEA_TOKEN", "nope")
        .args(["get", "clusters"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wrong bearer token"), "{err}");
    assert!(err.contains("MEDEA_TOKEN"), "{err}");
    let out = s
        .cli()
        .env_remove("MEDEA_TOKEN")
        .args(["get", "clusters"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing bearer token"), "{err}");
    // issue #52: the fix is a file or the state directory, never the token on the command line
    assert!(
        err.contains("--token-file") && err.contains("MEDEA_STATE_DIR"),
        "{err}"
    );
    assert!(
        !err.contains("--token ") && !err.contains("--token or"),
        "{err}"
    );
}

/// Like kubeconfig/talosconfig: with no flag and no `MEDEA_*` variable, a loopback client
/// uses the token and CA of the local server's state directory; a context from `medea config`
/// names another server; flags and variables win over the context; an unknown context is an
/// error.
#[test]
fn clients_find_a_local_server_and_named_contexts_without_flags() {
    let s = start(examples(), vec![home_inventory()]);
    let tmp = tempfile::tempdir().unwrap();
    let bare = |c: &mut std::process::Command| {
        c.env_remove("MEDEA_ADDR")
            .env_remove("MEDEA_TOKEN")
            .env_remove("MEDEA_CA")
            .env("MEDEA_CONFIG", tmp.path().join("config.yaml"));
    };
    // The local server's state directory: its CA is there; the token is written like serve's.
    medea::server::secrets::write_private(&s.state.path().join("token"), s.token.as_bytes())
        .unwrap();
    let mut c = s.cli();
    bare(&mut c);
    c.env("MEDEA_STATE_DIR", s.state.path()).args([
        "get",
        "clusters",
        "--addr",
        &s.addr.to_string(),
    ]);
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("home"));
    // ... but a non-loopback address never gets the local token or CA.
    let mut c = s.cli();
    bare(&mut c);
    c.env("MEDEA_STATE_DIR", s.state.path())
        .args(["get", "clusters", "--addr", "192.0.2.1:7600"]);
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no CA certificate"), "{err}");

    // A context, set and used with no flag.
    let token_file = tmp.path().join("prod.token");
    medea::server::secrets::write_private(&token_file, s.token.as_bytes()).unwrap();
    let mut c = crate::cli::medea();
    bare(&mut c);
    c.args([
        "config",
        "set-context",
        "prod",
        "--addr",
        &s.addr.to_string(),
        "--ca",
    ])
    .arg(&s.ca)
    .arg("--token-file")
    .arg(&token_file);
    assert!(c.output().unwrap().status.success());
    let config = tmp.path().join("config.yaml");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&config).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(
        !text.contains(&s.token),
        "the config names files, never the token: {text}"
    );
    let mut c = s.cli();
    bare(&mut c);
    c.args(["get", "machines", "--cluster", "home"]);
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("cp-1"));
    // A variable beats the context: a wrong token from MEDEA_TOKEN is used and refused.
    let mut c = s.cli();
    bare(&mut c);
    c.env("MEDEA_TOKEN", "nope").args(["get", "clusters"]);
    let out = c.output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("wrong bearer token"));
    // An unknown context is an error naming the fix.
    let mut c = s.cli();
    bare(&mut c);
    c.args(["get", "clusters", "--context", "staging"]);
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no client context named `staging`"), "{err}");
    let mut c = crate::cli::medea();
    bare(&mut c);
    c.args(["config", "get-contexts"]);
    let out = c.output().unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with('*') && l.contains("prod")),
        "{listed}"
    );
}

/// `medea serve --token-file F` generates F (0600) when it does not exist, like the TLS files;
/// a token file that group or others may read is used, with a warning naming the fix.
#[test]
fn serve_generates_a_missing_token_file_and_warns_about_a_readable_one() {
    use std::os::unix::fs::PermissionsExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let token = tmp.path().join("secrets/token");
    let serve = |token: &std::path::Path| {
        let mut c = crate::cli::medea();
        c.args(["serve", "--desired"])
            .arg(examples())
            .arg("--state-dir")
            .arg(tmp.path().join("state"))
            .arg("--token-file")
            .arg(token)
            .args(["--listen", "127.0.0.1:0"])
            .env_remove("MEDEA_TOKEN")
            .env_remove("MEDEA_TOKEN_FILE")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        // Progress, not patience: read stderr until the server says it listens.
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(child.stderr.take().unwrap()));
        let mut seen = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            seen.push_str(&line);
            seen.push('\n');
            if line.contains("listening") || line.contains("error") || line.contains("Error") {
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        seen
    };
    let seen = serve(&token);
    assert!(seen.contains("generated an API token in"), "{seen}");
    assert_eq!(
        std::fs::metadata(&token).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(!std::fs::read_to_string(&token).unwrap().trim().is_empty());
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let seen = serve(&token);
    assert!(
        seen.contains("readable by group or others (mode 0644): run chmod 600"),
        "{seen}"
    );
    assert!(!seen.contains("generated an API token"), "{seen}");
}

#[test]
fn missing_or_wrong_ca_is_a_clear_tls_error() {
    let s = start(examples(), vec![]);
    let out = s
        .cli()
        .env_remove("MEDEA_CA")
        .args(["get", "clusters"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no CA certificate"), "{err}");
    assert!(err.contains("--ca"), "{err}");
    // issue #52: it names what it looked at, the state directory's CA as an absolute path,
    // and the fixes
    let tmp = tempfile::tempdir().unwrap();
    let out = s
        .cli()
        .env_remove("MEDEA_CA")
        .env("MEDEA_STATE_DIR", "./state")
        .env("MEDEA_CONFIG", tmp.path().join("config.yaml"))
        .current_dir(tmp.path())
        .args(["get", "clusters"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let abs = tmp.path().join("state/tls/ca.crt");
    assert!(
        err.contains(&format!(
            "{} (MEDEA_STATE_DIR): does not exist",
            abs.display()
        )),
        "{err}"
    );
    assert!(err.contains("--ca / MEDEA_CA: not set"), "{err}");
    assert!(err.contains("client context: none in use"), "{err}");
    assert!(err.contains("medea config set-context"), "{err}");
    // A CA that did not sign the server certificate.
    let other = start(examples(), vec![]);
    let out = s
        .cli()
        .env("MEDEA_CA", &other.ca)
        .args(["get", "clusters"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not trusted") || err.contains("certificate"),
        "{err}"
    );
    // --insecure works on loopback only.
    let out = s
        .cli()
        .env_remove("MEDEA_CA")
        .args(["get", "clusters", "--insecure"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = s
        .cli()
        .env_remove("MEDEA_CA")
        .args([
            "get",
            "clusters",
            "--insecure",
            "--addr",
            "example.com:7600",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("only allowed for loopback"));
}

#[test]
fn unreachable_server_names_the_address() {
    let out = crate::cli::medea()
        .args(["get", "clusters", "--insecure", "--addr", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach medea at 127.0.0.1:1"), "{err}");
    assert!(err.contains("medea serve"), "{err}");
}

#[test]
fn generated_tls_files_are_private() {
    let s = start(examples(), vec![]);
    for f in ["tls/ca.crt", "tls/server.crt", "tls/server.key"] {
        assert!(
            medea::server::secrets::is_private(&s.state.path().join(f)).unwrap(),
            "{f}"
        );
    }
}
