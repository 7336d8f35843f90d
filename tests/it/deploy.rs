//! deploy/: the systemd unit is valid and hardened; the Prometheus alert rules pass `promtool`
//! (syntax and their unit tests) and, with the Grafana dashboard, name only metrics medea exports.

use std::path::PathBuf;

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

#[test]
fn systemd_unit_is_hardened() {
    let unit = std::fs::read_to_string(deploy().join("medea.service")).unwrap();
    for line in [
        "Type=notify",
        "User=medea",
        "StateDirectory=medea",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=",
        "UMask=0077",
        // the default soft limit of 1024 is too few (issue #32)
        "LimitNOFILE=65536",
    ] {
        assert!(unit.lines().any(|l| l == line), "missing `{line}`");
    }
}

#[test]
fn systemd_unit_verifies() {
    // tests/run installs the systemd package; under CI a missing tool fails this test.
    let Some(analyze) = crate::fixtures::tool_or_skip("systemd-analyze") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(deploy().join("medea.service"))
        .unwrap()
        .replace("/usr/local/bin/medea", env!("CARGO_BIN_EXE_medea"));
    let path = tmp.path().join("medea.service");
    std::fs::write(&path, unit).unwrap();
    let out = std::process::Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Only complaints about this unit count (the host's other units are not ours).
    let ours: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("medea.service"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {err}"
    );
}

#[test]
fn containerfile_runs_as_non_root_on_distroless() {
    let c = std::fs::read_to_string(deploy().join("Containerfile")).unwrap();
    assert!(c.contains("FROM gcr.io/distroless/cc-debian12:nonroot"));
    assert!(c.contains("USER nonroot:nonroot"));
    assert!(c.matches("FROM ").count() >= 2, "multi-stage");
}

/// The metric names a sample of medea's exposition can carry.
fn exported_sample_names() -> std::collections::BTreeSet<String> {
    medea::metrics::sample_names().into_iter().collect()
}

/// Every `medea_…` metric name in `exprs` that medea does not export.
fn unknown_metrics<'a>(
    exprs: impl IntoIterator<Item = &'a str>,
    exported: &std::collections::BTreeSet<String>,
) -> Vec<String> {
    let name = regex::Regex::new(r"\bmedea_[a-z0-9_]+").unwrap();
    let mut unknown = Vec::new();
    for e in exprs {
        for m in name.find_iter(e) {
            if !exported.contains(m.as_str()) {
                unknown.push(format!("{} in `{e}`", m.as_str()));
            }
        }
    }
    unknown
}

fn rules() -> serde_json::Value {
    let text = std::fs::read_to_string(deploy().join("prometheus/medea-rules.yml")).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

/// Each alerting rule: (name, expr).
fn alerts(rules: &serde_json::Value) -> Vec<(String, String)> {
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .map(|r| {
            (
                r["alert"].as_str().unwrap().to_string(),
                r["expr"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn dashboard_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(deploy().join("grafana/medea-dashboard.json")).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            exprs.push(q.to_string());
        }
    }
    exprs
}

#[test]
fn the_dashboard_and_the_alert_rules_name_only_metrics_medea_exports() {
    let exported = exported_sample_names();
    // The check itself: a family medea exports passes, a made-up one does not.
    assert!(
        exported.contains("medea_rollout_halts_total"),
        "{exported:?}"
    );
    assert!(exported.contains("medea_reconcile_duration_seconds_bucket"));
    assert_eq!(
        unknown_metrics(
            ["rate(medea_rollout_halts_total[5m]) + medea_nope"],
            &exported
        ),
        vec!["medea_nope in `rate(medea_rollout_halts_total[5m]) + medea_nope`".to_string()]
    );

    let rules = rules();
    let alerts = alerts(&rules);
    assert!(alerts.len() >= 6, "{alerts:?}");
    let unknown = unknown_metrics(alerts.iter().map(|(_, e)| e.as_str()), &exported);
    assert!(unknown.is_empty(), "alert rules: {unknown:#?}");

    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 15, "{exprs:?}");
    let unknown = unknown_metrics(exprs.iter().map(String::as_str), &exported);
    assert!(unknown.is_empty(), "dashboard: {unknown:#?}");
    // What issue #35 asks the dashboard to show, each by the metric that carries it.
    let all = exprs.join("\n");
    for (what, metric) in [
        (
            "rollout progress per cluster and pool",
            "medea_rollout_job_nodes_done",
        ),
        ("gate outcomes", "medea_rollout_gate_evaluations_total"),
        ("halts", "medea_rollout_halts_total"),
        ("plan state", "medea_plan_approvals_missing"),
        ("API latency", "medea_api_call_duration_seconds_bucket"),
        (
            "reconcile duration",
            "medea_reconcile_duration_seconds_bucket",
        ),
        (
            "the newest backup per cluster (issue #37)",
            "medea_backup_last_success_timestamp_seconds",
        ),
    ] {
        assert!(
            all.contains(metric),
            "the dashboard shows {what} ({metric})"
        );
    }
}

#[test]
fn the_alert_rules_pass_promtool_and_each_alert_has_a_unit_test_that_fires_it() {
    let rules = rules();
    let alerts = alerts(&rules);
    for (what, needle) in [
        ("a halted job", "medea_rollout_cluster_halted"),
        (
            "a job running longer than a limit, by its clock (issue #51)",
            "medea_rollout_job_active_seconds",
        ),
        (
            "a failing trust-root reload",
            "medea_allowed_signers_reload_failed",
        ),
        ("a replica without a leader", "medea_leader"),
        (
            "failing refreshes",
            "medea_inventory_last_refresh_timestamp_seconds",
        ),
        (
            "no backup within twice the schedule (issue #37)",
            "medea_backup_interval_seconds",
        ),
    ] {
        assert!(
            alerts.iter().any(|(_, e)| e.contains(needle)),
            "an alert for {what} ({needle})"
        );
    }
    // Every alert is fired by at least one unit test (and so checked by `promtool test rules`).
    let text = std::fs::read_to_string(deploy().join("prometheus/medea-rules.test.yml")).unwrap();
    let tests: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let fired: std::collections::BTreeSet<&str> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap().iter())
        .filter(|a| a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()))
        .map(|a| a["alertname"].as_str().unwrap())
        .collect();
    for (name, _) in &alerts {
        assert!(fired.contains(name.as_str()), "no unit test fires {name}");
    }

    let Some(promtool) = crate::fixtures::tool_or_skip("promtool") else {
        return;
    };
    let dir = deploy().join("prometheus");
    for args in [
        ["check", "rules", "medea-rules.yml"],
        ["test", "rules", "medea-rules.test.yml"],
    ] {
        let out = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
