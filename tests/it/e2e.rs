//! End to end with real processes: `medea sim`, `medea seed`, `medea serve --rollouts` on a git
//! checkout, an approval marker committed, the rollout completed, the new versions observed;
//! plus a wrong token, a missing CA and an invalid edit on the way.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) use crate::fixtures::Kill;

pub(crate) use crate::fixtures::git;

pub(crate) fn wait(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn sign(key: &Path, id: &str) -> Vec<u8> {
    let mut c = crate::fixtures::tool("ssh-keygen")
        .args(["-Y", "sign", "-q", "-n", "medea-approve", "-f"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(format!("{id}\n").as_bytes())
        .unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success());
    out.stdout
}

#[test]
fn from_an_edited_yaml_to_a_completed_rollout_with_real_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // 1. The simulator, as its own process, on a quick clock.
    let scenario = crate::fixtures::default_scenario()
        .replace("reboot: 2s", "reboot: 500ms")
        .replace("imagePull: 500ms", "imagePull: 50ms")
        .replace("podStart: 3s", "podStart: 300ms")
        .replace("podTermination: 1s", "podTermination: 100ms");
    let sim = crate::fixtures::spawn_sim(d, &scenario);
    // 2. Seed the store from it (server stopped).
    let state = d.join("state");
    crate::fixtures::seed_home(d, &[]);
    // 3. A git checkout with the examples, committed.
    let repo = d.join("repo");
    std::fs::create_dir_all(repo.join("home")).unwrap();
    let ex = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/home");
    for f in ["cluster.yaml", "pools.yaml"] {
        std::fs::copy(ex.join(f), repo.join("home").join(f)).unwrap();
    }
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "desired state"]);
    // Approvers.
    crate::fixtures::approvers(d, &["alice", "bob"]);
    // 4. The daemon, with the executor gate on.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let token = "e2e-token-0123456789";
    let _serve = Kill(
        crate::cli::medea()
            .args(["serve", "--desired"])
            .arg(&repo)
            .args([
                "--git-ref",
                "main",
                "--rollouts",
                "--listen",
                &addr,
                "--token",
                token,
                "--debounce",
                "200ms",
                "--job-poll",
                "200ms",
                "--refresh-interval",
                "2s",
                "--state-dir",
            ])
            .arg(&state)
            .arg("--allowed-signers")
            .arg(d.join("allowed_signers"))
            .stderr(std::fs::File::create(d.join("serve.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let cli = || {
        let mut c = crate::cli::medea();
        c.env("MEDEA_ADDR", &addr)
            .env("MEDEA_TOKEN", token)
            .env("MEDEA_CA", state.join("tls/ca.crt"));
        c
    };
    wait("the server", Duration::from_secs(30), || {
        cli()
            .args(["get", "server"])
            .output()
            .unwrap()
            .status
            .success()
    });
    // A wrong token and a missing CA are refused with the fix named.
    let out = cli()
        .env("MEDEA_TOKEN", "wrong")
        .args(["get", "machines"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("wrong bearer token"));
    let out = cli()
        .env_remove("MEDEA_CA")
        .args(["get", "machines"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ca"));

    // 5. An invalid edit, committed: diagnosed, nothing changes.
    let plan_json = |cli: &dyn Fn() -> Command| -> serde_json::Value {
        serde_json::from_slice(&cli().args(["plan", "-o", "json"]).output().unwrap().stdout)
            .unwrap_or(serde_json::Value::Null)
    };
    let first = plan_json(&cli);
    assert_eq!(first["hasChanges"], true, "{first}");
    let pools = repo.join("home/pools.yaml");
    let good = std::fs::read_to_string(&pools).unwrap();
    std::fs::write(
        &pools,
        good.replacen("version: v1.13.9", "version: v1.13", 1),
    )
    .unwrap();
    git(&repo, &["commit", "-qam", "typo"]);
    wait(
        "the invalid commit to be diagnosed",
        Duration::from_secs(20),
        || cli().args(["plan"]).output().unwrap().status.code() == Some(1),
    );
    let out = cli().args(["plan"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("must have three numeric parts"));
    std::fs::write(&pools, &good).unwrap();
    git(&repo, &["commit", "-qam", "fix typo"]);
    wait(
        "the fixed commit to be planned",
        Duration::from_secs(20),
        || cli().args(["plan"]).output().unwrap().status.code() == Some(2),
    );
    let plan = plan_json(&cli);
    let (id, short) = (
        plan["id"].as_str().unwrap().to_string(),
        plan["shortId"].as_str().unwrap().to_string(),
    );

    // 6. Approvals committed as marker files; rollouts enabled for the cluster.
    let out = cli()
        .args(["cluster", "enable-rollouts", "home"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::create_dir_all(repo.join("approvals")).unwrap();
    for who in ["alice", "bob"] {
        std::fs::write(
            repo.join(format!("approvals/{short}-{who}.sig")),
            sign(&d.join(who), &id),
        )
        .unwrap();
    }
    git(&repo, &["add", "approvals"]);
    git(&repo, &["commit", "-qm", &format!("approve plan {short}")]);

    // 7. The job runs to the end.
    let log = d.join("serve.log");
    let dump = || {
        let l = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = l.lines().rev().take(60).collect();
        eprintln!(
            "--- serve.log (last lines, newest first)\n{}",
            tail.join("\n")
        );
        eprintln!(
            "--- plan: {} (signed {short})",
            String::from_utf8_lossy(&cli().args(["plan"]).output().unwrap().stderr)
        );
        eprintln!(
            "--- plans: {}",
            String::from_utf8_lossy(&cli().args(["plan", "-o", "json"]).output().unwrap().stdout)
                .lines()
                .filter(|l| l.contains("observed")
                    || l.contains("\"home\"")
                    || l.contains("generation"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    wait("the rollout to finish", Duration::from_secs(120), || {
        if Instant::now() > deadline {
            dump();
            panic!("the rollout did not finish in 90s");
        }
        let out = cli()
            .args(["rollout", "list", "--cluster", "home", "-o", "json"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let state = v[0]["state"].as_str().unwrap_or("").to_string();
        assert_ne!(state, "halted", "the rollout halted: {v}");
        state == "succeeded"
    });
    // 8. The inventory shows the new versions.
    wait(
        "the new versions to be observed",
        Duration::from_secs(30),
        || {
            let out = cli()
                .args(["get", "machines", "--cluster", "home", "-o", "json"])
                .output()
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            v.as_array().is_some_and(|ms| {
                ms.len() == 6
                    && ms.iter().all(|m| {
                        m["talosVersion"] == "v1.13.9"
                            && m["kubeletVersion"] == "v1.35.0"
                            && m["cordoned"] == false
                    })
            })
        },
    );
    drop(sim);
}
