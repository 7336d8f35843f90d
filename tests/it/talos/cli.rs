//! CLI: `medea talos …` and `medea sim` against the simulator.

use super::*;

/// stderr with miette's wrapping and box drawing collapsed to single spaces.
fn flat(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    s.split(|c: char| c.is_whitespace() || "│×╰─├┬┴╭".contains(c))
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

async fn medea(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_medea"))
        .args(args)
        .env_remove("TALOSCONFIG")
        .output()
        .await
        .unwrap()
}

#[tokio::test]
async fn cli_talos_commands_against_the_simulator() {
    let e = env("v1.13.9").await;
    let cfg = e.talosconfig.to_str().unwrap();

    let out = medea(&["talos", "version", "--talosconfig", cfg, "--node", "cp-2"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("NODE:        cp-2") && stdout.contains("Tag:         v1.13.9"),
        "{stdout}"
    );

    let out = medea(&["talos", "version", "--talosconfig", cfg, "-o", "json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json[0]["node"], "127.5.0.2",
        "default node from the talosconfig"
    );
    assert_eq!(json[0]["tag"], "v1.13.9");

    let out = medea(&["talos", "services", "--talosconfig", cfg, "-n", "cp-1,w-1"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.starts_with("NODE   SERVICE      STATE     HEALTH"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("cp-1   etcd") && l.contains("Running   OK")),
        "{stdout}"
    );

    let out = medea(&[
        "talos",
        "etcd-members",
        "--talosconfig",
        cfg,
        "-n",
        "cp-1",
        "-o",
        "json",
    ])
    .await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json[0]["members"].as_array().unwrap().len(), 3);

    let snap = e.dir.path().join("cli.snapshot");
    let out = medea(&[
        "talos",
        "etcd-snapshot",
        snap.to_str().unwrap(),
        "--talosconfig",
        cfg,
        "-n",
        "cp-1",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("etcd snapshot saved to") && stdout.contains("65568 bytes"),
        "{stdout}"
    );
    assert_eq!(mode(&snap), 0o600);

    let out = medea(&[
        "talos",
        "health",
        "--talosconfig",
        cfg,
        "-n",
        "cp-1",
        "--wait-timeout",
        "0s",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("waiting for apid to be ready: OK"),
        "{stdout}"
    );

    assert_eq!(e.sim.nodes_metadata_rejections(), 0);
}

#[tokio::test]
async fn cli_talos_errors_are_clear() {
    let e = env("v1.13.9").await;
    let cfg = e.talosconfig.to_str().unwrap();
    let out = medea(&[
        "talos",
        "version",
        "--talosconfig",
        cfg,
        "--context",
        "prod",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = flat(&out.stderr);
    assert!(stderr.contains("context `prod` not found"), "{stderr}");

    let out = medea(&[
        "talos",
        "etcd-snapshot",
        "x",
        "--talosconfig",
        cfg,
        "-n",
        "cp-1,cp-2",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        flat(&out.stderr).contains("runs against one node"),
        "{}",
        flat(&out.stderr)
    );
    assert!(!Path::new("x").exists());
}

#[tokio::test]
async fn cli_sim_runs_standalone_and_serves_its_talosconfig() {
    use tokio::io::AsyncBufReadExt as _;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sim");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_medea"))
        .args(["sim", "--out", out.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        let ready = line.starts_with("ready");
        printed.push(line);
        if ready {
            break;
        }
    }
    let text = printed.join("\n");
    assert!(
        text.contains("6 nodes (3 control planes, 3 workers)"),
        "{text}"
    );
    let talosconfig = out.join(TALOSCONFIG_FILE);
    assert!(
        text.contains(&format!("talosconfig: {}", talosconfig.display())),
        "{text}"
    );
    assert_eq!(mode(&talosconfig), 0o600);

    let (client, _) = TalosClient::from_talosconfig(&talosconfig, None, fast()).unwrap();
    assert_eq!(
        client.version(&node("w-3")).await.unwrap().tag,
        tv("v1.12.11")
    );
    assert_eq!(client.etcd_members(&node("cp-1")).await.unwrap().len(), 3);

    child.kill().await.unwrap();
}

#[tokio::test]
async fn cli_sim_refuses_a_bad_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.yaml");
    std::fs::write(&scenario, "nodes: []\n").unwrap();
    let out = medea(&[
        "sim",
        "--scenario",
        scenario.to_str().unwrap(),
        "--out",
        dir.path().join("o").to_str().unwrap(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        flat(&out.stderr).contains("at least one control-plane"),
        "{}",
        flat(&out.stderr)
    );
    assert!(!dir.path().join("o").exists(), "nothing written");

    let out = medea(&["sim", "--print-default-scenario"]).await;
    let text = String::from_utf8(out.stdout).unwrap();
    Scenario::parse(&text, Path::new("default.yaml")).unwrap();
}
