//! Preflight findings (issue #22) end to end: the simulator, `medea seed`, etcd's NOSPACE alarm
//! raised in the simulator's scenario (seen through Talos's `EtcdAlarmList`), `medea serve --rollouts`. The blocking finding keeps the plan
//! from being approved (neither `medea approve` nor a committed marker starts it); listing its
//! id under `spec.preflight.acknowledge` makes a new plan, which is approved and starts; the
//! executor's own etcd check still halts it before the first control plane. Also `medea plan --observed FILE` with a `preflight:` block.

use std::time::{Duration, Instant};

use crate::fixtures::{sign, wait};

/// The id of etcd's NOSPACE finding starts so (the member id follows).
const FINDING: &str = "etcd/alarm/NOSPACE/";

#[test]
fn a_blocking_finding_keeps_the_plan_unapprovable_until_acknowledged_then_the_executor_still_halts_on_it()
 {
    let s = crate::fixtures::serve::serve()
        // etcd's NOSPACE alarm, raised by cp-1's member: seed and every refresh see it
        // through Talos's EtcdAlarmList.
        .scenario_tail("etcdAlarms: [{node: cp-1, alarm: NOSPACE}]\n")
        .token("preflight-token-0123456789")
        .enable_rollouts()
        .start();
    let (d, desired) = (s.dir.as_path(), s.desired.as_path());
    let cli = || s.cli();
    let plan_json = || s.plan_json();
    wait("the blocked plan", Duration::from_secs(20), || {
        plan_json()["state"] == "blocked"
    });
    let blocked = plan_json();
    let (blocked_id, blocked_short) = (
        blocked["id"].as_str().unwrap().to_string(),
        blocked["shortId"].as_str().unwrap().to_string(),
    );
    let f = &blocked["clusters"][0]["preflight"][0];
    let finding = f["id"].as_str().unwrap_or_default().to_string();
    assert!(finding.starts_with(FINDING), "{blocked}");
    assert_eq!(f["severity"], "blocking");
    assert_eq!(f["acknowledged"], false);
    assert!(blocked["approveCommand"].is_null(), "{blocked}");
    let out = cli().args(["plan"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "    blocking [{finding}]: etcd alarm NOSPACE is active"
        )),
        "{text}"
    );
    assert!(text.contains("It cannot be approved"), "{text}");

    // `medea approve` refuses before signing, naming the finding and the way out.
    let out = cli()
        .args(["approve", &blocked_short, "--key"])
        .arg(d.join("alice"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("[{finding}]")), "{err}");
    assert!(err.contains("spec.preflight.acknowledge"), "{err}");
    assert!(!err.contains("signing plan"), "{err}");
    // A marker signed outside medea does not count either.
    std::fs::create_dir_all(desired.join("approvals")).unwrap();
    std::fs::write(
        desired.join(format!("approvals/{blocked_short}-alice.sig")),
        sign(&d.join("alice"), &blocked_id),
    )
    .unwrap();

    // Acknowledge it: a new desired revision, a new plan, approvable.
    // The same commit shortens healthTimeout, so the executor's own etcd rail (below) answers
    // within the test instead of after 15 minutes.
    let cluster = desired.join("home/cluster.yaml");
    let text = std::fs::read_to_string(&cluster).unwrap();
    assert!(text.contains("healthTimeout: 15m"), "{text}");
    let text = text.replace("healthTimeout: 15m", "healthTimeout: 5s");
    std::fs::write(
        &cluster,
        format!("{text}  preflight:\n    acknowledge:\n      - {finding}\n"),
    )
    .unwrap();
    wait("the acknowledged plan", Duration::from_secs(20), || {
        let p = plan_json();
        p["id"] != blocked_id.as_str() && p["state"] == "pending"
    });
    let plan = plan_json();
    let f = &plan["clusters"][0]["preflight"][0];
    assert_eq!(f["id"], finding.as_str(), "{plan}");
    assert_eq!(f["acknowledged"], true, "{plan}");
    let out = cli().args(["plan"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("[{finding}] (acknowledged)")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let short = plan["shortId"].as_str().unwrap().to_string();
    let out = cli()
        .args(["approve", &short, "--key"])
        .arg(d.join("alice"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Never applied: the default control-plane bar (2) is in force.
    let out = cli()
        .args(["approve", &short, "--key"])
        .arg(d.join("bob"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("started rollout job"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // An acknowledgement lets the plan be approved and started; it does not switch off the
    // executor's rails. The alarm is still raised (on a real cluster NOSPACE refuses every
    // write), so before taking the first control plane down the executor's etcd check (which
    // reads `EtcdAlarmList`) waits out healthTimeout and halts, having upgraded no node.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut jobs = serde_json::Value::Null;
    wait(
        "the rollout to halt on the alarm",
        Duration::from_secs(120),
        || {
            assert!(
                Instant::now() < deadline,
                "the rollout did not halt: {}",
                s.serve_log()
            );
            let out = cli()
                .args(["rollout", "list", "--cluster", "home", "-o", "json"])
                .output()
                .unwrap();
            jobs = serde_json::from_slice(&out.stdout).unwrap_or_default();
            assert_ne!(
                jobs[0]["state"], "succeeded",
                "the rollout ran past the alarm: {jobs}"
            );
            jobs[0]["state"] == "halted"
        },
    );
    let reason = jobs[0]["haltReason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("etcd alarms are active") && reason.contains("NOSPACE"),
        "{jobs}"
    );
    assert_eq!(jobs[0]["nodesDone"], 0, "{jobs}");
    // The only job is the acknowledged plan's: the blocked one never started.
    assert_eq!(jobs.as_array().map(Vec::len), Some(1), "{jobs}");
    assert!(
        !jobs.to_string().contains(&blocked_short),
        "the blocked plan started a job: {jobs}"
    );
}

#[test]
fn medea_plan_observed_reads_a_preflight_block() {
    let tmp = tempfile::tempdir().unwrap();
    let inv = tmp.path().join("inv.yaml");
    std::fs::write(
        &inv,
        "clusters:
  - name: home
    kubernetesVersion: v1.34.1
    machines:
      - {node: cp-1, address: 10.0.1.11, role: controlplane, talosVersion: v1.12.4}
      - {node: cp-2, address: 10.0.1.12, role: controlplane, talosVersion: v1.12.4}
      - {node: cp-3, address: 10.0.1.13, role: controlplane, talosVersion: v1.12.4}
      - {node: w-1, address: 10.0.1.21, role: worker, talosVersion: v1.12.4, cordoned: true}
      - {node: w-2, address: 10.0.1.22, role: worker, talosVersion: v1.12.4}
      - {node: w-3, address: 10.0.1.23, role: worker, talosVersion: v1.12.4}
    preflight:
      apiserverMetrics:
        - {endpoint: \"https://10.0.1.11:6443\"}
        - {endpoint: \"https://10.0.1.12:6443\", error: \"HTTP 403 Forbidden\"}
      deprecatedApiRequests:
        - {group: flowcontrol.apiserver.k8s.io, version: v1beta3, resource: flowschemas, removedRelease: \"1.32\", source: \"https://10.0.1.11:6443\"}
      podDisruptionBudgets:
        - {namespace: db, name: pg, disruptionsAllowed: 0, pods: [{name: pg-0, node: w-2}]}
      etcd:
        members:
          - {id: \"1\", name: cp-1, learner: false, healthy: true}
          - {id: \"2\", name: cp-2, learner: true, healthy: true}
          - {id: \"3\", name: cp-3, learner: false, healthy: true}
      nodePressure: {w-3: [MemoryPressure]}
      credentials:
        - {credential: kubeconfig client certificate, notAfter: \"2000-01-01T00:00:00Z\"}
",
    )
    .unwrap();
    let examples = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    let out = crate::cli::medea()
        .args(["plan", "--desired"])
        .arg(&examples)
        .arg("--observed")
        .arg(&inv)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // home goes v1.34 → v1.35: flowschemas v1beta3 (removed in 1.32) is long gone by then.
    for want in [
        "    blocking [credentials/kubeconfig-client-certificate/expired]: the kubeconfig client certificate expired at 2000-01-01T00:00:00Z",
        "    blocking [removed-api/flowcontrol.apiserver.k8s.io/v1beta3/flowschemas]: ",
        "      evidence: partial view: apiserver https://10.0.1.12:6443 did not answer /metrics: HTTP 403 Forbidden",
        "    warning [removed-api/partial-view]: ",
        "    warning [pdb/db/pg]: PodDisruptionBudget db/pg allows 0 disruptions and covers pods on nodes this plan drains (w-2): drain will wait up to drainTimeout (5m), then halt",
        "    warning [etcd/learner/cp-2]: ",
        "    warning [node/cordoned/w-1]: node w-1 is already cordoned: cordoned by someone else; medea will leave it cordoned",
        "    warning [node/pressure/w-3/MemoryPressure]: node w-3 reports MemoryPressure",
        // issue #51 item 7: w-1, cordoned by someone else, keeps its slot after its wave, and
        // the workers' maxUnavailable is 1: each hop's second wave could never start
        "    blocking [budget/workers/v1.13.10]: pool workers cannot start wave 2 of its Talos v1.13.10 hop: its 1 slot (maxUnavailable) is taken by nodes already unavailable (w-1 cordoned by someone else",
        "    blocking [budget/workers/v1.14.6]: ",
        "It cannot be approved: 4 blocking preflight findings",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let out = crate::cli::medea()
        .args(["plan", "-o", "json", "--desired"])
        .arg(&examples)
        .arg("--observed")
        .arg(&inv)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let home = v["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cluster"] == "home")
        .unwrap();
    let ids: Vec<&str> = home["preflight"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "budget/workers/v1.13.10",
            "budget/workers/v1.14.6",
            "credentials/kubeconfig-client-certificate/expired",
            "removed-api/flowcontrol.apiserver.k8s.io/v1beta3/flowschemas",
            "etcd/learner/cp-2",
            "node/cordoned/w-1",
            "node/pressure/w-3/MemoryPressure",
            "pdb/db/pg",
            "removed-api/partial-view",
        ]
    );
    // `medea doctor` shows the same findings (blocking ones fail, warnings warn).
    let out = crate::cli::medea()
        .args(["doctor", "--cluster", "home", "-o", "json", "--creds-dir"])
        .arg(tmp.path().join("creds"))
        .arg("--desired")
        .arg(&examples)
        .arg("--observed")
        .arg(&inv)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lines: Vec<(&str, &str)> = v["clusters"][0]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["check"] == "preflight")
        .map(|c| (c["target"].as_str().unwrap(), c["status"].as_str().unwrap()))
        .collect();
    let want: Vec<(&str, &str)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, if i < 4 { "fail" } else { "warn" }))
        .collect();
    assert_eq!(lines, want);
}
