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
        good.replacen("version: v1.14.6", "version: v1.14", 1),
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
    // two Talos hops per node (v1.13.10, then v1.14.6) and the Kubernetes step
    let deadline = Instant::now() + Duration::from_secs(180);
    wait("the rollout to finish", Duration::from_secs(210), || {
        if Instant::now() > deadline {
            dump();
            panic!("the rollout did not finish in 180s");
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
                        m["talosVersion"] == "v1.14.6"
                            && m["kubeletVersion"] == "v1.35.8"
                            && m["cordoned"] == false
                    })
            })
        },
    );
}

/// Issue 33 item 10: from the default scenario (Talos v1.12.11, Kubernetes v1.34.1) to Talos
/// v1.14.6 and Kubernetes v1.37.1 through the daemon. Kubernetes moves one minor per rollout,
/// so three rollouts: `examples/home` as it is (both Talos hops, v1.13.10 on the legacy RPC
/// and v1.14.6 on the lifecycle path, with Kubernetes v1.35.8), then v1.36.0, then v1.37.1 (the upgrade-k8s sequence on
/// Talos 1.14). At the end every kubelet runs v1.37.1, the bootstrap manifests' inventory
/// holds the CoreDNS RBAC objects under cli-utils keys, and each control plane's `final-*`
/// config resources keep their own counters.
#[test]
fn from_the_default_scenario_to_talos_1_14_6_and_kubernetes_1_37_1_through_every_hop() {
    let s = crate::fixtures::serve::serve().enable_rollouts().start();
    let cli = || s.cli();
    let pools = s.desired.join("home/pools.yaml");
    let cluster = s.desired.join("home/cluster.yaml");
    let text = std::fs::read_to_string(&pools).unwrap();
    assert_eq!(text.matches("version: v1.14.6").count(), 2, "{text}");

    // what examples/home asks for (Talos v1.14.6, Kubernetes v1.35.8), then the next minors
    let mut written = "v1.35.8";
    for (round, kube) in ["v1.35.8", "v1.36.0", "v1.37.1"].into_iter().enumerate() {
        let text = std::fs::read_to_string(&cluster).unwrap();
        assert!(text.contains(&format!("version: {written}")), "{text}");
        std::fs::write(
            &cluster,
            text.replace(&format!("version: {written}"), &format!("version: {kube}")),
        )
        .unwrap();
        written = kube;
        // the plan for this revision: every hop, then approved until a job starts (again
        // when a refresh makes the plan stale under the approval)
        let mut started: Option<String> = None;
        for _ in 0..10 {
            if started.is_some() {
                break;
            }
            let mut plan = serde_json::Value::Null;
            wait(
                &format!("the plan to {kube}"),
                Duration::from_secs(60),
                || {
                    plan = s.plan_json();
                    let steps = plan["clusters"][0]["steps"].as_array().cloned();
                    let has = |f: &dyn Fn(&serde_json::Value) -> bool| {
                        steps.as_ref().is_some_and(|st| st.iter().any(f))
                    };
                    plan["state"] == "pending"
                        && has(&|x| x["type"] == "kubernetes" && x["to"] == kube)
                        && (round > 0 || has(&|x| x["type"] == "talos" && x["to"] == "v1.14.6"))
                },
            );
            let steps = plan["clusters"][0]["steps"].as_array().unwrap();
            let talos: Vec<(String, String)> = steps
                .iter()
                .filter(|x| x["type"] == "talos")
                .map(|x| {
                    (
                        x["pool"].as_str().unwrap().to_string(),
                        x["to"].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            if round == 0 {
                let want: Vec<(String, String)> = [
                    ("controlplane", "v1.13.10"),
                    ("controlplane", "v1.14.6"),
                    ("workers", "v1.13.10"),
                    ("workers", "v1.14.6"),
                ]
                .iter()
                .map(|(p, v)| (p.to_string(), v.to_string()))
                .collect();
                let mut got = talos.clone();
                got.sort();
                assert_eq!(got, want, "{plan}");
            } else {
                assert!(talos.is_empty(), "{plan}");
            }
            let short = plan["shortId"].as_str().unwrap().to_string();
            for who in ["alice", "bob"] {
                let out = cli()
                    .args(["approve", &short, "--key"])
                    .arg(s.key(who))
                    .output()
                    .unwrap();
                let err = String::from_utf8_lossy(&out.stderr);
                if err.contains("which is stale") || err.contains("is stale: the current plan is") {
                    // a refresh replaced the plan (the last job's new versions observed, or a
                    // node rebooted into 1.14 still refusing reads, tuppr#453, seen
                    // unreachable for a moment): wait for the next one and approve that
                    break;
                }
                assert!(out.status.success(), "{err}");
                if String::from_utf8_lossy(&out.stdout).contains("started rollout job") {
                    started = Some(short.clone());
                    break;
                }
            }
        }
        let Some(short) = started else {
            panic!(
                "no plan to {kube} could be approved and started: {}",
                s.serve_log()
            );
        };
        wait(
            &format!("the rollout to {kube} to finish"),
            Duration::from_secs(240),
            || {
                let jobs = s.jobs();
                let newest = jobs
                    .as_array()
                    .and_then(|j| {
                        j.iter()
                            .find(|j| j["planId"].as_str().is_some_and(|p| p.starts_with(&short)))
                    })
                    .cloned()
                    .unwrap_or_default();
                assert_ne!(
                    newest["state"],
                    "halted",
                    "the rollout halted: {jobs}\n{}",
                    s.serve_log()
                );
                newest["state"] == "succeeded"
            },
        );
    }

    // every machine on Talos v1.14.6 with its kubelet on v1.37.1, nobody cordoned
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
                        m["talosVersion"] == "v1.14.6"
                            && m["kubeletVersion"] == "v1.37.1"
                            && m["cordoned"] == false
                    })
            })
        },
    );
    // the CoreDNS RBAC objects are in Talos' inventory under cli-utils keys
    let out = crate::fixtures::tool("kubectl")
        .arg("--kubeconfig")
        .arg(s.dir.join("sim/kubeconfig"))
        .args([
            "get",
            "configmap",
            medea::k8s::bootstrap::INVENTORY_NAME,
            "-n",
            "kube-system",
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inv: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "_system__coredns_rbac.authorization.k8s.io_ClusterRole",
        "_system__coredns_rbac.authorization.k8s.io_ClusterRoleBinding",
    ] {
        assert!(inv["data"].get(key).is_some(), "{key} missing: {inv}");
    }
    assert!(
        inv["data"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| !k.contains(':')),
        "{inv}"
    );
    // on Talos 1.14 the final-* config resources keep their own counters
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use medea::talos::{ClientSettings, NodeTarget, TalosClient};
        let (client, _) = TalosClient::from_talosconfig(
            &s.dir.join("sim/talosconfig"),
            None,
            ClientSettings::default(),
        )
        .unwrap();
        for cp in ["cp-1", "cp-2", "cp-3"] {
            let node = NodeTarget::parse(cp).unwrap();
            for (kind, component) in [
                ("APIServerConfigs.kubernetes.talos.dev", "kube-apiserver"),
                (
                    "ControllerManagerConfigs.kubernetes.talos.dev",
                    "kube-controller-manager",
                ),
                ("SchedulerConfigs.kubernetes.talos.dev", "kube-scheduler"),
            ] {
                let raw = client
                    .cosi_get(&node, "controlplane", kind, component)
                    .await
                    .unwrap()
                    .version;
                let fin = client
                    .cosi_get(&node, "controlplane", kind, &format!("final-{component}"))
                    .await
                    .unwrap()
                    .version;
                assert_ne!(raw, fin, "{cp} {component}: the counters are apart");
            }
        }
    });
}
