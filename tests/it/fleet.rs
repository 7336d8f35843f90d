//! A fleet made from one template: two clusters whose machines carry the same names. A
//! machine's identity is (cluster, name) everywhere — validation, inventory, store keys, API,
//! CLI, plan — so both clusters are planned, approved and rolled in one store.

use std::time::Duration;

use crate::fixtures::wait;

/// Issue 39 item 11: `home` and `lab` both have `cp-1` … `w-3` (their own simulators, at
/// 127.5.0.x and 127.6.0.x). Both are seeded into one store, validated together (no "machine
/// `cp-1` is already in node pool `controlplane` of cluster `home`"), planned with their own
/// waves, approved once and rolled to the end; each inventory keeps its own addresses.
#[test]
fn two_clusters_from_one_template_share_machine_names_and_both_roll() {
    let s = crate::fixtures::serve::serve()
        .talos("v1.14.4")
        .kubernetes("v1.35.8")
        .twin("lab")
        .enable_rollouts()
        .start();
    let cli = || s.cli();
    let machines = |cluster: &str| -> Vec<serde_json::Value> {
        let out = cli()
            .args(["get", "machines", "--cluster", cluster, "-o", "json"])
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
    };
    // Each cluster's inventory: the same six names, its own addresses.
    for (cluster, prefix) in [("home", "127.5.0."), ("lab", "127.6.0.")] {
        let ms = machines(cluster);
        let mut names: Vec<&str> = ms.iter().filter_map(|m| m["node"].as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            ["cp-1", "cp-2", "cp-3", "w-1", "w-2", "w-3"],
            "{cluster}: {ms:?}"
        );
        assert!(
            ms.iter()
                .all(|m| m["address"].as_str().is_some_and(|a| a.starts_with(prefix))),
            "{cluster}: {ms:?}"
        );
    }

    // One plan with both clusters' waves, each wave naming its cluster's node.
    let mut started = Vec::new();
    for _ in 0..10 {
        if !started.is_empty() {
            break;
        }
        let mut plan = serde_json::Value::Null;
        wait("a plan for both clusters", Duration::from_secs(60), || {
            plan = s.plan_json();
            let clusters = plan["clusters"].as_array().cloned().unwrap_or_default();
            plan["state"] == "pending"
                && ["home", "lab"].iter().all(|c| {
                    clusters.iter().any(|x| {
                        x["cluster"] == *c
                            && x["steps"].as_array().is_some_and(|st| {
                                st.iter()
                                    .filter(|x| x["type"] == "talos" && x["to"] == "v1.14.6")
                                    .count()
                                    == 2
                            })
                    })
                })
        });
        let mut ids = std::collections::BTreeSet::new();
        for cluster in plan["clusters"].as_array().unwrap() {
            let name = cluster["cluster"].as_str().unwrap();
            let prefix = if name == "home" {
                "127.5.0."
            } else {
                "127.6.0."
            };
            let mut nodes = Vec::new();
            for step in cluster["steps"].as_array().unwrap() {
                for wave in step["waves"].as_array().into_iter().flatten() {
                    for node in wave.as_array().unwrap() {
                        assert!(
                            node["address"].as_str().unwrap().starts_with(prefix),
                            "{name}: {node}"
                        );
                        nodes.push(node["node"].as_str().unwrap().to_string());
                        ids.insert(node["id"].as_str().unwrap().to_string());
                    }
                }
            }
            nodes.sort();
            assert_eq!(
                nodes,
                ["cp-1", "cp-2", "cp-3", "w-1", "w-2", "w-3"],
                "{name}: {plan}"
            );
        }
        // Twelve machines, twelve machine ids: a name is not an identity.
        assert_eq!(ids.len(), 12, "{ids:?}");
        let short = plan["shortId"].as_str().unwrap().to_string();
        // The seeded bar (controlPlane 2) is in force: both approvers sign.
        for who in ["alice", "bob"] {
            let out = cli()
                .args(["approve", &short, "--key"])
                .arg(s.key(who))
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("which is stale") {
                break;
            }
            assert!(out.status.success(), "{err}");
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            if text.contains("started rollout job") {
                assert_eq!(who, "bob", "{text}");
                started.push(short.clone());
            }
        }
    }
    assert!(
        !started.is_empty(),
        "no plan could be approved: {}",
        s.serve_log()
    );

    // Both clusters' jobs run to the end, and every machine of each is on the target.
    wait("both rollouts to finish", Duration::from_secs(240), || {
        ["home", "lab"].iter().all(|c| {
            let out = cli()
                .args(["rollout", "list", "--cluster", c, "-o", "json"])
                .output()
                .unwrap();
            let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let newest = jobs[0].clone();
            assert_ne!(newest["state"], "halted", "{c}: {jobs}\n{}", s.serve_log());
            newest["state"] == "succeeded"
        })
    });
    // No phantom plan (issue #39 item 8): once a job ended, no plan is made from the
    // observation taken before its last node came back (which would propose upgrading a
    // node just upgraded and fire a "plan ready" webhook). Every plan logged after the first
    // job ended has no changes.
    let mut log = String::new();
    wait(
        "the plan after the last job",
        Duration::from_secs(60),
        || {
            log = s.serve_log();
            let last_end = log.rfind("job finished").unwrap_or(0);
            log[last_end..].contains("new plan")
        },
    );
    let after_end: Vec<&str> = log
        .lines()
        .skip_while(|l| !l.contains("job finished"))
        .filter(|l| l.contains("new plan"))
        .collect();
    assert!(
        !after_end.is_empty() && after_end.iter().all(|l| l.contains("changes=false")),
        "a plan with changes after a job ended: {after_end:#?}"
    );
    // Logs carry structured fields, never Rust Debug renderings (issue #39 item 8).
    let debug: Vec<&str> = log
        .lines()
        .filter(|l| {
            [
                "Some(",
                "None",
                "Progress {",
                "Halted {",
                "outcome=Succeeded",
                "RunOutcome",
            ]
            .iter()
            .any(|d| l.contains(d))
        })
        .collect();
    assert!(debug.is_empty(), "Debug renderings in the log: {debug:#?}");
    wait(
        "the new versions in both inventories",
        Duration::from_secs(30),
        || {
            ["home", "lab"].iter().all(|c| {
                let ms = machines(c);
                ms.len() == 6 && ms.iter().all(|m| m["talosVersion"] == "v1.14.6")
            })
        },
    );
}
