//! Clusters, settings changes and the approval bars they need.

use super::*;

// ---------------------------------------------------------------- clusters, settings, approvals

#[test]
fn a_cluster_never_observed_says_so_and_plans_nothing() {
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let p = plan_ok(&d, &Inventory::default());
    assert_eq!(p.clusters[0].status, ClusterStatus::NotObserved);
    assert!(!p.has_changes());
    assert!(p.basis.observed.is_empty());
    assert!(p.applies.put.is_empty(), "nothing is applied for it");
    let text = render::text(&p, Default::default());
    assert!(
        text.contains("not observed yet: run `medea seed`"),
        "{text}"
    );
    assert!(text.contains("no changes"), "{text}");
    // Nothing was compared: the closing line must not say the clusters match (#39).
    let last = render::summary_line(&p);
    assert!(!last.contains("match the desired state"), "{last}");
    assert!(
        last.contains("not observed yet, so nothing is compared: c1"),
        "{last}"
    );
}

#[test]
fn a_cluster_with_a_running_job_plans_nothing_until_it_ends() {
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let obs = observed("v1.34.1", 4, three_cps("v1.12.11"));
    let idle = plan_ok(&d, &obs);
    assert!(idle.has_changes(), "there is work to do");
    let running: BTreeMap<String, String> = [("c1".to_string(), "job-7".to_string())].into();
    let applied = LastApplied::default();
    let busy_inputs = PlanInputs {
        running: &running,
        ..PlanInputs::new(&d, &obs, &applied)
    };
    let busy = compute_memo(&busy_inputs, &mut PlanMemo::one_off()).unwrap();
    let c = &busy.clusters[0];
    assert_eq!(c.status, ClusterStatus::RollingOut);
    assert!(c.steps.is_empty() && c.settings.is_empty() && c.diffs.is_empty());
    assert!(!busy.has_changes(), "nothing to approve while the job runs");
    assert!(
        busy.applies.put.is_empty(),
        "its last-applied state is left alone"
    );
    assert_eq!(busy.basis.running, running);
    let text = render::text(&busy, Default::default());
    assert!(text.contains("cluster c1 (rollout running)"), "{text}");
    assert!(text.contains("rollout job job-7 is running"), "{text}");
    // The closing line says why there is nothing to approve, not "no changes … match" (#39).
    let last = render::summary_line(&busy);
    assert!(!last.contains("match the desired state"), "{last}");
    assert!(
        last.contains("job job-7 is rolling out cluster c1; what remains is planned when it ends (follow it: medea rollout status job-7 -w)"),
        "{last}"
    );
    // The job ending changes the basis: the busy plan is stale, and the idle one is current.
    assert_ne!(busy.id, idle.id);
    assert!(busy.is_stale(&basis_of(&d, &obs, &LastApplied::default())));
    assert!(!idle.is_stale(&basis_of(&d, &obs, &LastApplied::default())));
    // A job of a cluster the desired state does not name is not part of the basis.
    let other: BTreeMap<String, String> = [("else".to_string(), "j".to_string())].into();
    let other_inputs = PlanInputs {
        running: &other,
        ..PlanInputs::new(&d, &obs, &applied)
    };
    let p = compute_memo(&other_inputs, &mut PlanMemo::one_off()).unwrap();
    assert_eq!(p.id, idle.id);
}

#[test]
fn first_plan_creates_every_resource_then_only_real_changes_show() {
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let i = observed("v1.34.1", 1, three_cps("v1.13.9"));
    let first = plan_ok(&d, &i);
    let created: Vec<(&str, &str)> = first.clusters[0]
        .settings
        .iter()
        .map(|s| (s.resource.as_str(), s.field.as_str()))
        .collect();
    assert_eq!(
        created,
        [("cluster", RESOURCE_FIELD), ("pool cp", RESOURCE_FIELD)]
    );
    assert_eq!(first.applies.put.len(), 2);

    // Applied; then the drain timeout changes and the version moves.
    let applied = applied_of(&d);
    let d2 = one(
        "v1.34.1",
        "  rollout:\n    drainTimeout: 20m\n",
        &[cp_pool("v1.13.9")],
    );
    let p = compute(&d2, &i, &applied, None).unwrap();
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
            ("cluster", "rollout.drainTimeout", "10m", "20m"),
            ("pool cp", "rollout.drainTimeout", "10m", "20m")
        ]
    );
    assert!(
        p.clusters[0]
            .diffs
            .iter()
            .any(|d| d.diff.contains("+    drainTimeout: 20m"))
    );
    // A version edit with every machine already there: no change at all.
    let d3 = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    assert!(!compute(&d3, &i, &applied, None).unwrap().has_changes());
}

#[test]
fn removed_pools_and_clusters_are_settings_changes() {
    let before = load(&[
        ("c1.yaml", cluster_doc("c1", "v1.34.1", "")),
        (
            "pools.yaml",
            [
                cp_pool("v1.13.9"),
                pool_doc("w", "worker", "w-1", "v1.13.9", ""),
            ]
            .concat(),
        ),
        ("old.yaml", cluster_doc("old", "v1.34.1", "")),
    ]);
    let applied = applied_of(&before);
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let mut ms = three_cps("v1.13.9");
    ms.push(w("w-1", "v1.13.9"));
    let p = compute(&d, &observed("v1.34.1", 1, ms), &applied, None).unwrap();
    let c1 = &p.clusters[0];
    assert_eq!(c1.settings.len(), 1);
    assert_eq!(
        (c1.settings[0].resource.as_str(), c1.settings[0].to.as_str()),
        ("pool w", "removed")
    );
    let old = &p.clusters[1];
    assert_eq!(
        (old.cluster.as_str(), old.status),
        ("old", ClusterStatus::Removed)
    );
    assert_eq!(
        p.applies.delete,
        [ResourceKey::cluster("old"), ResourceKey::pool("c1", "w")]
    );
    let ops = approval_writes(&p);
    assert!(ops.contains(&Op::Delete(
        crate::store::Table::Desired,
        "pool/c1/w".into()
    )));
    assert!(
        ops.iter()
            .any(|o| matches!(o, Op::Put(_, k, _) if k == "cluster/c1"))
    );
}

#[test]
fn approvals_take_the_higher_of_the_bar_in_force_and_the_desired_one() {
    let i = observed("v1.34.1", 1, vec![w("w-1", "v1.12.4")]);
    let wp = pool_doc("w", "worker", "w-1", "v1.13.9", "");
    // Never applied: defaults (1 ordinary, 2 control plane) are in force.
    let lowered = "  approvals:\n    required: 1\n    controlPlane: 1\n";
    let d = one("v1.34.1", lowered, &[cp_pool("v1.13.9"), wp.clone()]);
    let mut ms = three_cps("v1.12.4");
    ms.push(w("w-1", "v1.12.4"));
    let p = plan_ok(&d, &observed("v1.34.1", 1, ms.clone()));
    assert_eq!(
        p.approvals_required, 2,
        "the lowering plan needs the old bar"
    );
    assert!(p.clusters[0].notes.iter().any(|n| {
        n.to_string()
            .contains("highest bar in force, max(required 1, controlPlane 2)")
    }));
    // Once applied, the lower bar is in force.
    let p = compute(&d, &observed("v1.34.1", 1, ms), &applied_of(&d), None).unwrap();
    assert_eq!(p.approvals_required, 1);
    // Workers only: the ordinary bar.
    let raised = "  approvals:\n    required: 3\n    controlPlane: 4\n";
    let d = one("v1.34.1", raised, &[wp]);
    assert_eq!(plan_ok(&d, &i).approvals_required, 3);
}

/// Issue #52 item 7: the hint on a plan that needs two signers leads somewhere: it says that
/// lowering a bar needs the bar in force, and the two ways that work (two signers once, or
/// seeding with the lower bar before the first applied settings), never "one person alone sets
/// `controlPlane: 1`" (itself a change that needs two).
#[test]
fn the_approval_bar_hint_says_what_works_for_one_person() {
    let ms = three_cps("v1.12.4");
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let p = plan_ok(&d, &observed("v1.34.1", 1, ms));
    assert_eq!(p.approvals_required, 2);
    let text = render::text(&p, Default::default());
    assert!(!text.contains("one person alone sets"), "{text}");
    assert!(
        text.contains("To approve alone later: lowering a bar needs the bar in force, so 2 signers approve `controlPlane: 1` (and `required: 1`) once; or, before the cluster's first settings are applied, run medea seed with `--approvals-control-plane 1`."),
        "{text}"
    );
    // one signer: no hint
    let i = observed("v1.34.1", 1, vec![w("w-1", "v1.12.4")]);
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "w-1", "v1.13.9", "")],
    );
    let p = plan_ok(&d, &i);
    assert_eq!(p.approvals_required, 1);
    assert_eq!(render::alone_hint(&p), None);
    assert!(!render::text(&p, Default::default()).contains("To approve alone"));
}

/// Issue 19: the bar in force guards every change to the bar. Each path that changes a
/// cluster's approvals setting needs `max(required, controlPlane)` of the applied setting.
#[test]
fn every_change_to_the_bar_needs_the_highest_bar_in_force() {
    let ms = three_cps("v1.13.9");
    let i = observed("v1.34.1", 1, ms);
    let with =
        |req: u32, cp: u32| format!("  approvals:\n    required: {req}\n    controlPlane: {cp}\n");
    let needs = |applied: &Desired, next: &Desired| {
        let p = compute(next, &i, &applied_of(applied), None).unwrap_or_else(|e| panic!("{e:#?}"));
        assert!(
            p.clusters.iter().all(|c| c.steps.is_empty()),
            "settings-only"
        );
        let text = render::text(&p, Default::default());
        assert!(
            text.contains(&format!("It needs {} approval", p.approvals_required)),
            "{text}"
        );
        p.approvals_required
    };
    let base = one("v1.34.1", &with(1, 2), &[cp_pool("v1.13.9")]);
    // Unchanged bar, settings-only change of the cluster alone: the ordinary bar.
    let downgrade = format!("{}  upgradePolicy:\n    allowDowngrade: true\n", with(1, 2));
    assert_eq!(
        needs(&base, &one("v1.34.1", &downgrade, &[cp_pool("v1.13.9")])),
        1
    );
    // A cluster default that reaches a control-plane pool's effective settings (issue #32:
    // settings of control-plane pools need the control-plane bar).
    let drain = format!("{}  rollout:\n    drainTimeout: 20m\n", with(1, 2));
    assert_eq!(
        needs(&base, &one("v1.34.1", &drain, &[cp_pool("v1.13.9")])),
        2
    );
    // Lowering controlPlane alone (the reported hole: this needed 1).
    let p = compute(
        &one("v1.34.1", &with(1, 1), &[cp_pool("v1.13.9")]),
        &i,
        &applied_of(&base),
        None,
    )
    .unwrap();
    assert_eq!(p.approvals_required, 2);
    assert!(
        p.clusters[0]
            .notes
            .iter()
            .any(|n| n.to_string().contains("changes the approvals setting")),
        "{:?}",
        p.clusters[0].notes
    );
    assert_eq!(
        needs(&base, &one("v1.34.1", &with(1, 1), &[cp_pool("v1.13.9")])),
        2
    );
    // Lowering required.
    let strict = one("v1.34.1", &with(2, 3), &[cp_pool("v1.13.9")]);
    assert_eq!(
        needs(&strict, &one("v1.34.1", &with(1, 3), &[cp_pool("v1.13.9")])),
        3
    );
    // Deleting the approvals block (the defaults, 1 and 2).
    assert_eq!(
        needs(&strict, &one("v1.34.1", "", &[cp_pool("v1.13.9")])),
        3
    );
    // Raising: the new bar.
    assert_eq!(
        needs(&base, &one("v1.34.1", &with(4, 4), &[cp_pool("v1.13.9")])),
        4
    );
    // Deleting a cluster.
    let two = load(&[
        ("c1.yaml", cluster_doc("c1", "v1.34.1", "")),
        ("pools.yaml", cp_pool("v1.13.9")),
        ("old.yaml", cluster_doc("old", "v1.34.1", &with(1, 3))),
    ]);
    assert_eq!(needs(&two, &one("v1.34.1", "", &[cp_pool("v1.13.9")])), 3);
    // Renaming a cluster (c1 -> c9: c1 is removed, c9 is new and not observed).
    let renamed = load(&[
        ("c1.yaml", cluster_doc("c9", "v1.34.1", &with(1, 1))),
        (
            "pools.yaml",
            cp_pool("v1.13.9").replace("cluster: c1", "cluster: c9"),
        ),
    ]);
    assert_eq!(needs(&strict, &renamed), 3);
}

// ---------------------------------------------------------------- issue 32: signers see all

/// Issue 32: a workers-only plan that also points the health source elsewhere showed neither
/// the URL nor the credential, and needed the ordinary bar. Now where health data and
/// credentials go is rendered, is a settings change, and needs the highest bar in force.
#[test]
fn moving_a_health_source_is_shown_and_needs_the_highest_bar_in_force() {
    let i = observed("v1.34.1", 1, vec![w("w-1", "v1.12.4")]);
    let health = |url: &str, credential: &str| {
        format!(
            "  approvals:\n    required: 1\n    controlPlane: 3\n  health:\n    prometheus: {{ url: \"{url}\"{credential} }}\n    gates:\n      - name: up\n        query: 'up == 1'\n"
        )
    };
    let workers = |talos: &str| vec![pool_doc("w", "worker", "w-1", talos, "")];
    let applied = one(
        "v1.34.1",
        &health("https://prom.monitoring:9090", ", credential: prom"),
        &workers("v1.12.4"),
    );
    // The same bump without touching the source: the ordinary bar.
    let p = compute(
        &one(
            "v1.34.1",
            &health("https://prom.monitoring:9090", ", credential: prom"),
            &workers("v1.13.9"),
        ),
        &i,
        &applied_of(&applied),
        None,
    )
    .unwrap();
    assert_eq!(p.approvals_required, 1);
    assert!(
        p.clusters[0].settings.is_empty(),
        "{:?}",
        p.clusters[0].settings
    );
    let text = render::text(&p, Default::default());
    assert!(
        text.contains("source prometheus: https://prom.monitoring:9090 (credential prom)"),
        "{text}"
    );

    // The attack: the bump, plus the source pointed at the committer's listener.
    for (url, credential, from, to) in [
        (
            "https://127.0.0.1:4444",
            ", credential: prom",
            "https://prom.monitoring:9090 (credential prom)",
            "https://127.0.0.1:4444 (credential prom)",
        ),
        (
            "https://prom.monitoring:9090",
            ", credential: etcd",
            "https://prom.monitoring:9090 (credential prom)",
            "https://prom.monitoring:9090 (credential etcd)",
        ),
        (
            "http://prom.monitoring:9090",
            "",
            "https://prom.monitoring:9090 (credential prom)",
            "http://prom.monitoring:9090 (no credential)",
        ),
    ] {
        let next = one("v1.34.1", &health(url, credential), &workers("v1.13.9"));
        let p = compute(&next, &i, &applied_of(&applied), None).unwrap();
        assert_eq!(p.approvals_required, 3, "{url}{credential}");
        let c = &p.clusters[0];
        assert!(
            c.settings.iter().any(|s| s.resource == "cluster"
                && s.field == "health.prometheus"
                && s.from == from
                && s.to == to),
            "{:#?}",
            c.settings
        );
        assert!(
            c.notes.iter().any(|n| n
                .to_string()
                .contains("changes where health data and credentials go (health.prometheus)")),
            "{:#?}",
            c.notes
        );
        let text = render::text(&p, Default::default());
        assert!(
            text.contains(&format!("~ cluster health.prometheus: {from} → {to}")),
            "{text}"
        );
        assert!(text.contains(&format!("source prometheus: {to}")), "{text}");
        assert!(text.contains("It needs 3 approvals"), "{text}");
        // The JSON names the source and the credential, never a path.
        let json = render::json(&p);
        assert!(json.contains(url), "{json}");
        assert!(!json.contains("File"), "{json}");
    }

    // A new cluster with sources: from the defaults in force (1, 2), the highest (2).
    let fresh = one(
        "v1.34.1",
        &health("https://prom.monitoring:9090", ", credential: prom"),
        &workers("v1.13.9"),
    );
    let p = compute(&fresh, &i, &LastApplied::default(), None).unwrap();
    assert_eq!(
        p.approvals_required, 2,
        "the highest bar of the defaults in force"
    );
    assert!(
        p.clusters[0]
            .notes
            .iter()
            .any(|n| n.to_string().contains("the new cluster's health sources")),
        "{:#?}",
        p.clusters[0].notes
    );
}

/// Issue 32: gates, soak, failure policy, promotion, acknowledgements, removed-API rows, pool
/// health overrides, `onFailure` and `installerImage` changed without a settings change.
#[test]
fn every_setting_that_acts_is_a_settings_change() {
    let i = observed("v1.34.1", 1, vec![w("w-1", "v1.13.9")]);
    // `c1` and the cluster it is promoted after.
    let two = |cluster_extra: &str, pools: &[String]| {
        load(&[
            ("c1.yaml", cluster_doc("c1", "v1.34.1", cluster_extra)),
            ("pools.yaml", pools.concat()),
            ("staging.yaml", cluster_doc("staging", "v1.34.1", "")),
        ])
    };
    let base_cluster = "  health:\n    prometheus: { url: \"https://prom:9090\" }\n    gates:\n      - name: up\n        query: 'up == 1'\n    soak: 5m\n    failureLimit: 2\n  preflight:\n    acknowledge: [a/b]\n  promotion:\n    after: staging\n    soak: 24h\n";
    let base_pool = "  onFailure: rollback\n  health:\n    gates:\n      - name: ceph\n        query: 'ceph_health_status == 0'\n";
    let applied = two(
        base_cluster,
        &[pool_doc("w", "worker", "w-1", "v1.13.9", base_pool)],
    );
    let changed = |cluster: &str, pool: &str| {
        let next = two(cluster, &[pool_doc("w", "worker", "w-1", "v1.13.9", pool)]);
        let p =
            compute(&next, &i, &applied_of(&applied), None).unwrap_or_else(|e| panic!("{e:#?}"));
        assert!(p.has_changes(), "a change to sign: {:#?}", p.clusters[0]);
        p
    };
    let fields = |p: &Plan| -> Vec<(String, String)> {
        p.clusters[0]
            .settings
            .iter()
            .map(|s| (s.resource.clone(), s.field.clone()))
            .collect()
    };
    let has = |p: &Plan, resource: &str, field: &str| {
        assert!(
            fields(p).contains(&(resource.to_string(), field.to_string())),
            "no {resource} {field} in {:#?}",
            fields(p)
        );
    };
    // Unchanged: nothing to sign.
    let p = compute(
        &two(
            base_cluster,
            &[pool_doc("w", "worker", "w-1", "v1.13.9", base_pool)],
        ),
        &i,
        &applied_of(&applied),
        None,
    )
    .unwrap();
    assert!(!p.has_changes(), "{:#?}", p.clusters[0].settings);

    let p = changed(&base_cluster.replace("up == 1", "up == 0"), base_pool);
    has(&p, "cluster", "health.gates");
    let p = changed(&base_cluster.replace("soak: 5m", "soak: 1m"), base_pool);
    has(&p, "cluster", "health.soak");
    let p = changed(
        &base_cluster.replace("failureLimit: 2", "failureLimit: 9"),
        base_pool,
    );
    has(&p, "cluster", "health.failureLimit");
    let p = changed(&base_cluster.replace("[a/b]", "[a/b, c/d]"), base_pool);
    has(&p, "cluster", "preflight.acknowledge");
    let p = changed(&base_cluster.replace("soak: 24h", "soak: 1h"), base_pool);
    has(&p, "cluster", "promotion");
    let removed = format!(
        "{base_cluster}  upgradePolicy:\n    removedApis:\n      - {{ group: example.com, version: v1beta1, resource: widgets, kind: Widget, deprecatedIn: v1.29, removedIn: v1.32 }}\n"
    );
    let p = changed(&removed, base_pool);
    has(&p, "cluster", "upgradePolicy.removedApis");
    let p = changed(base_cluster, &base_pool.replace("rollback", "halt"));
    has(&p, "pool w", "onFailure");
    let p = changed(base_cluster, &base_pool.replace("== 0", "== 1"));
    has(&p, "pool w", "health.gates");
    let p = changed(base_cluster, &format!("{base_pool}    soak: 10m\n"));
    has(&p, "pool w", "health.soak");
    let image = base_pool.to_string();
    let next = two(
        base_cluster,
        &[pool_doc("w", "worker", "w-1", "v1.13.9", &image).replace(
            "    version: v1.13.9\n",
            "    version: v1.13.9\n    installerImage: registry.example/talos/installer\n",
        )],
    );
    let p = compute(&next, &i, &applied_of(&applied), None).unwrap();
    has(&p, "pool w", "talos.installerImage");

    // Removing every gate, or the promotion, says so in a note.
    let ungated = base_cluster.replace(
        "    gates:\n      - name: up\n        query: 'up == 1'\n    soak: 5m\n",
        "",
    );
    let p = changed(&ungated, "  onFailure: halt\n  health:\n    gates: []\n");
    let notes = &p.clusters[0].notes;
    assert!(
        notes
            .iter()
            .any(|n| n.to_string() == "this plan removes every health gate of the cluster: its rollouts will no longer wait for any gate"
                && matches!(n, crate::plan::note::Note::GatesRemoved { resource } if resource == "cluster")),
        "{notes:#?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.to_string().contains("every health gate of the pool w")),
        "{notes:#?}"
    );
    let unpromoted = base_cluster.replace("  promotion:\n    after: staging\n    soak: 24h\n", "");
    let p = changed(&unpromoted, base_pool);
    assert!(
        p.clusters[0].notes.iter().any(|n| n
            .to_string()
            .contains("removes the promotion after cluster staging")),
        "{:#?}",
        p.clusters[0].notes
    );

    // A comment alone is no setting, but its diff is shown: signers see the text they sign.
    let commented = format!("{base_cluster}  # a comment\n");
    let next = two(
        &commented,
        &[pool_doc("w", "worker", "w-1", "v1.13.9", base_pool)],
    );
    let p = compute(&next, &i, &applied_of(&applied), None).unwrap();
    assert!(
        p.clusters[0]
            .diffs
            .iter()
            .any(|d| d.resource == "cluster" && d.diff.contains("+  # a comment")),
        "{:#?}",
        p.clusters[0].diffs
    );
}

/// Issue 32: settings of a control-plane pool act on control-plane nodes: the control-plane
/// bar, even without a step.
#[test]
fn control_plane_pool_settings_need_the_control_plane_bar() {
    let i = observed("v1.34.1", 1, three_cps("v1.13.9"));
    let bar = "  approvals:\n    required: 1\n    controlPlane: 2\n";
    let applied = one("v1.34.1", bar, &[cp_pool("v1.13.9")]);
    let next = one(
        "v1.34.1",
        bar,
        &[pool_doc(
            "cp",
            "controlplane",
            "cp-1, cp-2, cp-3",
            "v1.13.9",
            "  rollout:\n    healthTimeout: 1m\n",
        )],
    );
    let p = compute(&next, &i, &applied_of(&applied), None).unwrap();
    assert!(p.clusters[0].steps.is_empty());
    assert_eq!(p.approvals_required, 2);
}

#[test]
fn a_plan_after_a_halt_is_a_plan_of_its_own_and_says_which_job_it_continues() {
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let obs = observed("v1.34.1", 4, three_cps("v1.12.11"));
    let before = plan_ok(&d, &obs);
    // No halted job: the plan is unchanged (existing ids stay what they were).
    assert_eq!(
        super::compute::after_halts(before.clone(), &BTreeMap::new()),
        before
    );
    let halted: BTreeMap<String, String> = [("c1".to_string(), "job-7".to_string())].into();
    let after = super::compute::after_halts(before.clone(), &halted);
    // Same steps, another id: the halted job's (consumed) plan is never the continuation.
    assert_eq!(after.clusters, before.clusters);
    assert_ne!(after.id, before.id);
    assert_eq!(after.basis.halted, halted);
    // Deterministic, and another halted job gives another plan.
    assert_eq!(
        super::compute::after_halts(before.clone(), &halted).id,
        after.id
    );
    let later: BTreeMap<String, String> = [("c1".to_string(), "job-8".to_string())].into();
    assert_ne!(
        super::compute::after_halts(before.clone(), &later).id,
        after.id
    );
    // A basis without the halt (what approval compares with) finds it stale, and one with it
    // does not.
    let mut basis = basis_of(&d, &obs, &LastApplied::default());
    assert!(after.is_stale(&basis));
    basis.halted = halted;
    assert!(!after.is_stale(&basis));
    let text = render::text(&after, Default::default());
    assert!(
        text.contains(
            "After:    job job-7 halted (cluster c1): this plan continues from what it left"
        ),
        "{text}"
    );
}
