//! End to end with real processes: `medea sim`, `medea seed`, `medea serve --rollouts` on a git
//! checkout, an approval marker committed, the rollout completed, the new versions observed;
//! plus a wrong token, a missing CA and an invalid edit on the way.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::fixtures::{git, sign, wait};

#[test]
fn from_an_edited_yaml_to_a_completed_rollout_with_real_processes() {
    // 1.–4. The simulator on a quick clock, the store seeded from it once its pods are ready,
    // the examples committed in a git checkout, two approvers, the daemon with the executor
    // gate on (`fixtures::serve`).
    let s = crate::fixtures::serve::serve()
        .git()
        .token("e2e-token-0123456789")
        .start();
    let (d, repo) = (s.dir.as_path(), s.desired.as_path());
    let cli = || s.cli();
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
    git(repo, &["commit", "-qam", "typo"]);
    wait(
        "the invalid commit to be diagnosed",
        Duration::from_secs(20),
        || cli().args(["plan"]).output().unwrap().status.code() == Some(1),
    );
    let out = cli().args(["plan"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("must have three numeric parts"));
    std::fs::write(&pools, &good).unwrap();
    git(repo, &["commit", "-qam", "fix typo"]);
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
    s.enable_rollouts();
    std::fs::create_dir_all(repo.join("approvals")).unwrap();
    for who in ["alice", "bob"] {
        std::fs::write(
            repo.join(format!("approvals/{short}-{who}.sig")),
            sign(&d.join(who), &id),
        )
        .unwrap();
    }
    git(repo, &["add", "approvals"]);
    git(repo, &["commit", "-qm", &format!("approve plan {short}")]);

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
}
