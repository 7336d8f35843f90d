//! Staged pools: the plan, located diagnostics and applied records (issue 36).

use super::*;

/// Issue #36: `rollout.stage: ahead` puts the pool's staging in the plan (and its id), names
/// the staged nodes with the warning a signer cannot miss, and names the nodes below Talos 1.13
/// that upgrade in the window as before.
#[test]
fn a_staged_pool_names_its_nodes_warns_of_any_reboot_and_changes_the_plan_id() {
    let p = plan_ok(&two_worker_pools("", ""), &two_workers());
    let staged = "  rollout:\n    stage: ahead\n    stageParallelism: 3\n";
    let inv = observed(
        "v1.34.1",
        1,
        vec![
            w("w-1", "v1.13.2"),
            w("w-2", "v1.13.2"),
            w("w-3", "v1.12.9"),
        ],
    );
    let d = one(
        "v1.34.1",
        "",
        &[
            pool_doc("a", "worker", "w-1", "v1.13.9", ""),
            pool_doc("b", "worker", "w-2, w-3", "v1.13.9", staged),
        ],
    );
    let p2 = plan_ok(&d, &inv);
    let b = talos_steps(&p2)
        .into_iter()
        .find(|t| t.pool == "b")
        .cloned()
        .expect("pool b has a step");
    assert_eq!(b.stage, Some(crate::plan::StageAhead { parallelism: 3 }));
    let a = talos_steps(&p2)
        .into_iter()
        .find(|t| t.pool == "a")
        .cloned()
        .expect("pool a has a step");
    assert_eq!(a.stage, None, "inWindow is the default");
    let text = render::text(&p2, Default::default());
    for want in [
        "stage ahead: w-2 installed without reboot as soon as the job reaches this step, windows or not (3 at a time)",
        "WARNING: any reboot of a staged node, planned or not (an operator, a power loss, a kernel panic), boots v1.13.9",
        "not staged (Talos < 1.13 installs only by rebooting): w-3 upgrade in the window as before",
    ] {
        assert!(text.contains(want), "{want}\n{text}");
    }
    // the same pools without staging: another plan id
    let p3 = plan_ok(&two_worker_pools("", staged), &two_workers());
    assert_ne!(p.id, p3.id, "staging alone changes the plan id");
    assert!(!render::text(&p, Default::default()).contains("WARNING"));
}

/// The diagnostics of cluster `c1` (with `cluster_extra`) and the pool documents `pools`.
fn diagnostics_of_pools(cluster_extra: &str, pools: &[String]) -> Vec<Diagnostic> {
    let snap = Snapshot {
        files: vec![
            SourceFile {
                path: "c1.yaml".into(),
                bytes: cluster_doc("c1", "v1.34.1", cluster_extra)
                    .into_bytes()
                    .into(),
            },
            SourceFile {
                path: "pools.yaml".into(),
                bytes: pools.concat().into_bytes().into(),
            },
        ],
        markers: Vec::new(),
        commit: None,
        refused: Vec::new(),
    };
    parse_snapshot(snap).diagnostics
}

/// The text of the line a diagnostic points at.
fn line_at(text: &str, d: &Diagnostic) -> String {
    text.lines()
        .nth(d.origin.line - 1)
        .unwrap_or("")
        .to_string()
}

/// Issue #36: `stageParallelism` where nothing stages is a warning at the field, saying it has
/// no effect; where it bounds an install ahead, nothing is said.
#[test]
fn stage_parallelism_without_stage_ahead_is_a_warning_where_it_is_written() {
    use crate::desired::diagnostic::codes::NO_EFFECT;
    // a pool's, without `stage: ahead` on it or its cluster
    let pool_extra = "  rollout:\n    stageParallelism: 3\n";
    let d = diagnostics_of("", pool_extra);
    let e = only(&d, NO_EFFECT);
    assert!(!e.is_error(), "a warning, not an error: {e:?}");
    assert_eq!(e.origin.file, "pools.yaml");
    assert!(
        e.message
            .contains("`stageParallelism` has no effect: pool `a` does not stage"),
        "{e:?}"
    );
    let text = pool_doc("a", "worker", "w-1", "v1.13.9", pool_extra);
    assert!(line_at(&text, &e).contains("stageParallelism: 3"), "{e:?}");
    // a cluster's, when no pool stages with it
    let cluster_extra = "  rollout:\n    stageParallelism: 4\n";
    let d = diagnostics_of(cluster_extra, "");
    let e = only(&d, NO_EFFECT);
    assert_eq!(e.origin.file, "c1.yaml");
    assert!(e.message.contains("cluster `c1` does not stage"), "{e:?}");
    let text = cluster_doc("c1", "v1.34.1", cluster_extra);
    assert!(line_at(&text, &e).contains("stageParallelism: 4"), "{e:?}");
    // in effect: no warning
    for (c, p) in [
        (
            "",
            "  rollout:\n    stage: ahead\n    stageParallelism: 3\n",
        ),
        (
            "  rollout:\n    stage: ahead\n",
            "  rollout:\n    stageParallelism: 3\n",
        ),
        (
            "  rollout:\n    stageParallelism: 4\n",
            "  rollout:\n    stage: ahead\n",
        ),
        (
            "  rollout:\n    stage: ahead\n    stageParallelism: 4\n",
            "",
        ),
    ] {
        let d = diagnostics_of(c, p);
        assert!(
            d.iter().all(|d| d.code != NO_EFFECT),
            "cluster {c:?}, pool {p:?}: {d:#?}"
        );
    }
    // a pool that stages with its own value leaves the cluster's unused
    let d = diagnostics_of(
        "  rollout:\n    stageParallelism: 4\n",
        "  rollout:\n    stage: ahead\n    stageParallelism: 3\n",
    );
    assert_eq!(only(&d, NO_EFFECT).origin.file, "c1.yaml");
    // a pool that turns staging off under a staging cluster: its value is unused
    let d = diagnostics_of(
        "  rollout:\n    stage: ahead\n",
        "  rollout:\n    stage: inWindow\n    stageParallelism: 3\n",
    );
    assert_eq!(only(&d, NO_EFFECT).origin.file, "pools.yaml");
    // a control-plane pool installs ahead one node at a time whatever it says
    let cp = pool_doc(
        "cp",
        "controlplane",
        "cp-1",
        "v1.13.9",
        "  rollout:\n    stage: ahead\n    stageParallelism: 3\n",
    );
    let d = diagnostics_of_pools("", &[cp]);
    let e = only(&d, NO_EFFECT);
    assert!(e.message.contains("one node at a time"), "{e:?}");
    // and does not use the cluster's value either
    let cp = pool_doc(
        "cp",
        "controlplane",
        "cp-1",
        "v1.13.9",
        "  rollout:\n    stage: ahead\n",
    );
    let d = diagnostics_of_pools("  rollout:\n    stageParallelism: 4\n", &[cp]);
    assert_eq!(only(&d, NO_EFFECT).origin.file, "c1.yaml");
}

#[test]
fn a_bad_stage_or_stage_parallelism_is_refused_where_it_is_written() {
    let d = diagnostics_of("", "  rollout:\n    stageParallelism: 0\n");
    let e = only(&d, crate::desired::diagnostic::codes::INVALID_VALUE);
    assert!(
        e.message
            .contains("stageParallelism must be between 1 and 10, not 0"),
        "{e:?}"
    );
    assert_eq!(e.origin.file, "pools.yaml");
    let d = diagnostics_of("  rollout:\n    stageParallelism: 11\n", "");
    let e = only(&d, crate::desired::diagnostic::codes::INVALID_VALUE);
    assert_eq!(e.origin.file, "c1.yaml");
    let d = diagnostics_of("", "  rollout:\n    stage: sometimes\n");
    let e = d.iter().find(|d| d.is_error()).expect("an error");
    assert_eq!(e.origin.file, "pools.yaml", "{e:?}");
    assert!(
        e.message.contains("sometimes") || e.message.contains("ahead"),
        "{e:?}"
    );
}

// ---------------------------------------------------------------- issue 36: applied staging

/// The records of cluster `c1` and its pool `a` (`one("v1.34.1", "", [pool a: w-1 on
/// v1.13.9])`), byte for byte as medea wrote them before the applied settings kept
/// `rollout.stage` and `rollout.stageParallelism`, and the digest of the two.
const APPLIED_CLUSTER_BEFORE_STAGING: &str = r#"{"key":{"kind":"cluster","name":"c1"},"file":"c1.yaml","document":"apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: c1\nspec:\n  kubernetes:\n    version: v1.34.1\n","settings":{"type":"cluster","kubernetesVersion":"v1.34.1","rollout":{"maxUnavailable":1,"drainTimeoutSecs":600,"healthTimeoutSecs":900},"approvalsRequired":1,"approvalsControlPlane":2,"maintenanceWindows":[],"allowDowngrade":false,"talosReleases":[],"kubernetesSupport":[]}}"#;
const APPLIED_POOL_BEFORE_STAGING: &str = r#"{"key":{"kind":"pool","cluster":"c1","pool":"a"},"file":"pools.yaml","document":"---\napiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: a\nspec:\n  cluster: c1\n  role: worker\n  machines: [w-1]\n  talos:\n    version: v1.13.9\n","settings":{"type":"pool","role":"worker","talosVersion":"v1.13.9","installerImage":"ghcr.io/siderolabs/installer","machines":["w-1"],"selector":{},"after":[],"rollout":{"maxUnavailable":1,"drainTimeoutSecs":600,"healthTimeoutSecs":900}}}"#;
const APPLIED_DIGEST_BEFORE_STAGING: &str =
    "a6e755ebaaa51a0a224ebaf71c5fee05ae980f2eb914e44c64b0a719ea675a30";

/// Issue #36: records written before the applied settings kept the pool's staging decode as
/// `inWindow` with the default parallelism and encode back byte for byte; records made today
/// from the same YAML are those bytes, so every stored basis keeps its applied digest.
#[test]
fn applied_records_from_before_staging_keep_their_bytes_and_digest() {
    use crate::desired::model::{DEFAULT_STAGE_PARALLELISM, Stage};
    use crate::plan::applied::Settings;
    let mut decoded = Vec::new();
    for old in [APPLIED_CLUSTER_BEFORE_STAGING, APPLIED_POOL_BEFORE_STAGING] {
        let r: AppliedResource = serde_json::from_str(old).unwrap();
        assert_eq!(serde_json::to_string(&r).unwrap(), old, "re-encoded");
        let rollout = match &r.settings {
            Settings::Cluster(c) => &c.rollout,
            Settings::Pool(p) => &p.rollout,
        };
        assert_eq!(
            (rollout.stage, rollout.stage_parallelism),
            (Stage::InWindow, DEFAULT_STAGE_PARALLELISM)
        );
        decoded.push(r);
    }
    let old = LastApplied::from_resources(decoded);
    assert_eq!(old.digest(), APPLIED_DIGEST_BEFORE_STAGING);
    let now = applied_of(&one(
        "v1.34.1",
        "",
        &[pool_doc("a", "worker", "w-1", "v1.13.9", "")],
    ));
    assert_eq!(now, old);
    assert_eq!(
        serde_json::to_string(&now.resources["pool/c1/a"]).unwrap(),
        APPLIED_POOL_BEFORE_STAGING
    );
    assert_eq!(now.digest(), APPLIED_DIGEST_BEFORE_STAGING);
}

/// Issue #36: a staged pool's applied record keeps `stage` and `stageParallelism` (a
/// cluster's too, the default of its pools); they render right after the other rollout
/// fields, and staging a pool whose machines are all on the target already is a settings
/// change a signer sees.
#[test]
fn a_staged_pools_applied_record_carries_its_staging_and_a_change_is_a_settings_change() {
    let staged = "  rollout:\n    stage: ahead\n    stageParallelism: 3\n";
    let d = two_worker_pools("", staged);
    let a = applied_of(&d);
    let b = serde_json::to_value(&a.resources["pool/c1/b"]).unwrap();
    assert_eq!(b["settings"]["rollout"]["stage"], "ahead", "{b}");
    assert_eq!(b["settings"]["rollout"]["stageParallelism"], 3, "{b}");
    let back: AppliedResource = serde_json::from_value(b).unwrap();
    assert_eq!(back, a.resources["pool/c1/b"]);
    let not_staged = serde_json::to_value(&a.resources["pool/c1/a"]).unwrap();
    let rollout = not_staged["settings"]["rollout"].as_object().unwrap();
    assert!(
        !rollout.contains_key("stage") && !rollout.contains_key("stageParallelism"),
        "defaults are not written: {not_staged}"
    );
    // the field lines, where the other rollout fields are
    let rollout_lines = |r: &AppliedResource| -> Vec<(&'static str, String)> {
        r.settings()
            .into_iter()
            .map(|(f, v)| (f.path(), v))
            .filter(|(f, _)| f.starts_with("rollout."))
            .collect()
    };
    let s = |x: &str| x.to_string();
    assert_eq!(
        rollout_lines(&a.resources["pool/c1/b"]),
        [
            ("rollout.maxUnavailable", s("1")),
            ("rollout.drainTimeout", s("10m")),
            ("rollout.healthTimeout", s("15m")),
            ("rollout.upgradeAttempts", s("2")),
            ("rollout.stage", s("ahead")),
            ("rollout.stageParallelism", s("3")),
            ("rollout.taintNextWave", s("true")),
        ]
    );
    assert!(rollout_lines(&a.resources["pool/c1/a"]).contains(&("rollout.stage", s("inWindow"))));
    // a cluster's staging is its own record's and the default of its pools
    let c = applied_of(&two_worker_pools("  rollout:\n    stage: ahead\n", ""));
    for key in ["cluster/c1", "pool/c1/a", "pool/c1/b"] {
        assert!(
            rollout_lines(&c.resources[key]).contains(&("rollout.stage", s("ahead"))),
            "{key}"
        );
    }
    // staging a pool alone (every machine on the target) is a settings change
    let on_target = observed("v1.34.1", 1, vec![w("w-1", "v1.13.9"), w("w-2", "v1.13.9")]);
    let p = compute(&d, &on_target, &applied_of(&two_worker_pools("", "")), None).unwrap();
    let changes: Vec<(&str, &str, &str, &str)> = p.clusters[0]
        .settings
        .iter()
        .map(|s| {
            (
                s.resource.as_str(),
                s.field.as_str(),
                s.from.as_str(),
                s.to.as_str(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("pool b", "rollout.stage", "inWindow", "ahead"),
            ("pool b", "rollout.stageParallelism", "2", "3"),
        ]
    );
    // and applied, nothing is left to sign
    let p = compute(&d, &on_target, &a, None).unwrap();
    assert!(!p.has_changes(), "{:#?}", p.clusters[0].settings);
}
