//! Plans over the API: plans served and approvals (API and markers) reaching quorum, an invalid
//! edit, rollouts enabled per cluster, a settings-only plan applied.

use super::*;

#[test]
fn enable_rollouts_flips_the_gate_and_keeps_the_generation() {
    let s = start(examples(), vec![home_inventory()]);
    let out = s
        .cli()
        .args(["cluster", "enable-rollouts", "home"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "cluster home: rollouts enabled\n"
    );
    let out = s
        .cli()
        .args(["get", "clusters", "-o", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["rolloutsEnabled"], true);
    assert_eq!(
        v[0]["generation"], 1,
        "a gate change does not make plans stale"
    );
    let out = s
        .cli()
        .args(["cluster", "enable-rollouts", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has not been observed"));
}

#[test]
fn plan_is_served_and_approvals_from_api_and_marker_reach_quorum() {
    let tmp = tempfile::tempdir().unwrap();
    let desired = tmp.path().join("desired");
    copy_dir(&examples(), &desired);
    let (alice, alice_pub) = keygen(tmp.path(), "alice");
    let (bob, bob_pub) = keygen(tmp.path(), "bob");
    let signers = tmp.path().join("allowed_signers");
    std::fs::write(&signers, format!("alice@example.com namespaces=\"medea-approve\" {alice_pub}\nbob@example.com namespaces=\"medea-approve\" {bob_pub}\n")).unwrap();
    let s = start_with(
        desired.clone(),
        vec![home_inventory()],
        Some(signers),
        false,
    );

    // The plan is there at once, with changes (exit 2), from the server.
    let out = s.cli().args(["plan"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("~ pool controlplane: talos v1.12.4 → v1.14.6"),
        "{text}"
    );
    let json = s.cli().args(["plan", "-o", "json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    let short = v["shortId"].as_str().unwrap().to_string();
    // Never applied: the default bar for control-plane plans (2) is in force.
    assert_eq!(v["approvalsRequired"], 2);

    // alice approves over the API with the short id.
    let out = s
        .cli()
        .args(["approve", &short, "--key"])
        .arg(&alice)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(
        said.contains(&format!("approved plan {short} by alice@example.com")),
        "{said}"
    );
    assert!(said.contains("(1 of 2 approvals)"), "{said}");
    // It printed the full id it signed.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("signing plan {id}")),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing typed names no plan: bob's key signs nothing (it used to sign the current plan).
    for nothing in ["", "  "] {
        let out = s
            .cli()
            .args(["approve", nothing, "--key"])
            .arg(&bob)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "`{nothing}`");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("invalid plan id"), "{err}");
        assert!(!err.contains("signing plan"), "{err}");
    }
    let out = s.cli().args(["plan"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("approvals 1/2 (alice@example.com)"), "{err}");
    // Approving again with the same key does not count twice.
    let out = s
        .cli()
        .args(["approve", &short, "--key"])
        .arg(&alice)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("(1 of 2 approvals)"));

    // bob approves with a marker file written by plain ssh-keygen.
    let mut child = crate::fixtures::tool("ssh-keygen")
        .args(["-Y", "sign", "-q", "-n", "medea-approve", "-f"])
        .arg(&bob)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{id}\n").as_bytes())
        .unwrap();
    let sig = child.wait_with_output().unwrap();
    assert!(sig.status.success());
    std::fs::create_dir_all(desired.join("approvals")).unwrap();
    std::fs::write(
        desired.join(format!("approvals/{short}-bob.sig")),
        &sig.stdout,
    )
    .unwrap();

    wait_until("bob's marker to be recorded", || {
        let out = s.cli().args(["plan"]).output().unwrap();
        String::from_utf8_lossy(&out.stderr).contains("approvals 2/2")
    });
    // Quorum, but --rollouts is off: nothing starts, and the plan is not consumed.
    let out = s.cli().args(["plan"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("plan {short} is approved")), "{err}");
    // Approved: it says so and stops offering the approve and sign commands.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("This plan is approved"), "{text}");
    assert!(
        !text.contains("Approve with") && !text.contains("ssh-keygen"),
        "{text}"
    );
    let json = s.cli().args(["plan", "-o", "json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["state"], "approved");
    assert!(
        v["approveCommand"].is_null() && v["signCommand"].is_null(),
        "{v}"
    );

    // A signature by someone not in allowed_signers is refused with its reason.
    let (mallory, _) = keygen(tmp.path(), "mallory");
    let out = s
        .cli()
        .args(["approve", &short, "--key"])
        .arg(&mallory)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown key"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_invalid_edit_changes_nothing_and_is_diagnosed_by_medea_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let desired = tmp.path().join("desired");
    copy_dir(&examples(), &desired);
    let s = start(desired.clone(), vec![home_inventory()]);
    let before = s.cli().args(["plan", "-o", "json"]).output().unwrap();
    let before: serde_json::Value = serde_json::from_slice(&before.stdout).unwrap();
    let p = desired.join("home/pools.yaml");
    let text =
        std::fs::read_to_string(&p)
            .unwrap()
            .replacen("version: v1.14.6", "version: v1.14", 1);
    std::fs::write(&p, text).unwrap();
    wait_until("the invalid edit to be diagnosed", || {
        let out = s.cli().args(["plan"]).output().unwrap();
        out.status.code() == Some(1)
    });
    let out = s.cli().args(["plan"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("version `v1.14` must have three numeric parts"),
        "{err}"
    );
    assert!(err.contains("home/pools.yaml:17:14"), "{err}");
    // The current plan did not change.
    let out = s
        .cli()
        .args(["get", "clusters", "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let store_plan = s.cli().args(["plan", "-o", "json"]).output().unwrap();
    assert_eq!(store_plan.status.code(), Some(1), "still invalid");
    let _ = before;
}

/// A settings-only plan that reaches quorum is applied, says so (text and `-o json` `state`),
/// stops offering the approve and sign commands, and the server replans at once: the current
/// plan is the next one, with no changes (the refresh interval here is an hour).
#[test]
fn a_settings_only_plan_says_it_was_applied_and_the_next_plan_follows_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let desired = tmp.path().join("desired");
    copy_dir(&examples().join("home"), &desired.join("home"));
    // The versions the cluster runs: only the settings (never applied) change.
    for (file, from, to) in [
        ("home/pools.yaml", "v1.14.6", "v1.12.4"),
        ("home/cluster.yaml", "v1.35.8", "v1.34.1"),
    ] {
        let p = desired.join(file);
        let text = std::fs::read_to_string(&p).unwrap().replace(from, to);
        std::fs::write(&p, text).unwrap();
    }
    let (alice, alice_pub) = keygen(tmp.path(), "alice");
    let (bob, bob_pub) = keygen(tmp.path(), "bob");
    let signers = tmp.path().join("allowed_signers");
    std::fs::write(&signers, format!("alice@example.com namespaces=\"medea-approve\" {alice_pub}\nbob@example.com namespaces=\"medea-approve\" {bob_pub}\n")).unwrap();
    let s = start_with(desired, vec![home_inventory()], Some(signers), false);

    let json = |args: &[&str]| -> serde_json::Value {
        let out = s
            .cli()
            .args(["plan", "-o", "json"])
            .args(args)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
    };
    let v = json(&[]);
    assert_eq!(v["state"], "pending");
    assert_eq!(v["summary"]["rollouts"], 0, "{v}");
    assert!(v["summary"]["settingsChanges"].as_u64().unwrap() > 0, "{v}");
    assert!(v["approveCommand"].is_string(), "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let short = v["shortId"].as_str().unwrap().to_string();
    let required = v["approvalsRequired"].as_u64().unwrap();
    for key in [&alice, &bob].into_iter().take(required as usize) {
        let out = s
            .cli()
            .args(["approve", &short, "--key"])
            .arg(key)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The applied plan, asked for by id, says what became of it.
    let mut c = rt_client(&s);
    let old = c.plan(&id);
    assert_eq!(old.state, "applied");
    assert!(!old.rendered.contains("Approve with"), "{}", old.rendered);
    assert!(!old.rendered.contains("ssh-keygen"), "{}", old.rendered);
    assert!(old.rendered.contains("applied"), "{}", old.rendered);
    let oj: serde_json::Value = serde_json::from_str(&old.json).unwrap();
    assert_eq!(oj["state"], "applied");
    assert!(
        oj["approveCommand"].is_null() && oj["signCommand"].is_null(),
        "{oj}"
    );

    // The current plan is the next one, without waiting for a refresh (an hour here).
    wait_until("the server to replan", || json(&[])["id"] != id.as_str());
    let v = json(&[]);
    assert_eq!(v["hasChanges"], false, "{v}");
    assert_eq!(v["state"], "no-changes");
    let out = s.cli().args(["plan"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no changes"), "{text}");
    assert!(!text.contains("Approve with"), "{text}");
}

/// A tiny gRPC client for `GetPlan` by id.
struct PlanClient {
    rt: tokio::runtime::Runtime,
    args: medea::cli::client::ClientArgs,
}

impl PlanClient {
    fn plan(&mut self, id: &str) -> medea::api::pb::Plan {
        let args = self.args.clone();
        let id = id.to_string();
        self.rt.block_on(async move {
            let mut c = args.connect().await.unwrap();
            c.get_plan(medea::api::pb::GetPlanRequest { id })
                .await
                .unwrap()
                .into_inner()
                .plan
                .unwrap()
        })
    }
}

fn rt_client(s: &TestServer) -> PlanClient {
    PlanClient {
        rt: tokio::runtime::Runtime::new().unwrap(),
        args: medea::cli::client::ClientArgs {
            addr: Some(s.addr.to_string()),
            token: Some(s.token.clone()),
            token_file: None,
            ca: Some(s.ca.clone()),
            insecure: false,
            context: None,
        },
    }
}

/// Issue 36 item 4: `medea plan --rehearse` against the server asks it to rehearse its current
/// plan (`RehearsePlan`), waits for the run, and prints each stored report after the plan; a
/// later `medea plan` prints the same report (stored beside the plan), and the plan's id has
/// not changed.
#[test]
fn plan_rehearse_against_the_server_prints_the_stored_report_after_the_plan() {
    let s = start(examples(), vec![home_inventory()]);
    let id = |s: &TestServer| {
        let out = s.cli().args(["plan", "-o", "json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["id"].as_str().unwrap().to_string()
    };
    let before = id(&s);
    let out = s
        .cli()
        .args(["plan", "--rehearse", "--rehearse-compression", "600"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "rehearsing plan {} on the server (started: home)",
            &before[..12]
        )),
        "{stderr}"
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let head = format!(
        "rehearsal of plan {} on a twin of cluster home (advice, not part of the plan id)",
        &before[..12]
    );
    let at = text.find(&head).unwrap_or_else(|| panic!("{text}"));
    assert!(
        text[..at].contains("~ pool controlplane: talos v1.12.4 → v1.14.6"),
        "the plan first: {text}"
    );
    // The twin ran the plan: its timeline per wave, and an outcome that is not "not run".
    let report = &text[at..];
    assert!(report.contains("  outcome: "), "{report}");
    assert!(!report.contains("NOT RUN"), "{report}");
    assert!(
        report.contains("    talos controlplane (hop 1/2) wave 1: +")
            && report.contains("    talos workers (hop 2/2) wave 3: +"),
        "{report}"
    );

    let again = s.cli().args(["plan"]).output().unwrap();
    let again = String::from_utf8(again.stdout).unwrap();
    let at_again = again.find(&head).unwrap_or_else(|| panic!("{again}"));
    assert_eq!(&again[at_again..], &text[at..], "the stored report");
    assert_eq!(id(&s), before, "a rehearsal never changes the plan id");
}
