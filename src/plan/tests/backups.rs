//! Scheduled backups as settings: changes, bars and located errors (issue 37).

use super::*;

// ---------------------------------------------------------------- issue 37: scheduled backups

/// Issue 37: `spec.backup` is a settings change like any other, and where backups go and who
/// can decrypt them (they hold every Secret) need the highest bar in force.
#[test]
fn backup_settings_are_a_settings_change_and_recipients_need_the_highest_bar() {
    let i = observed("v1.34.1", 1, vec![w("w-1", "v1.13.9")]);
    let key_a = age::x25519::Identity::generate().to_public().to_string();
    let key_b = age::x25519::Identity::generate().to_public().to_string();
    let backup = |schedule: &str, keep: u32, keys: &[&str]| {
        format!(
            "  approvals:\n    required: 1\n    controlPlane: 3\n  backup:\n    schedule: '{schedule}'\n    timeZone: Europe/Berlin\n    retention: {{ keep: {keep}, maxAge: 720h }}\n    recipients: [{}]\n",
            keys.join(", ")
        )
    };
    let pools = vec![pool_doc("w", "worker", "w-1", "v1.13.9", "")];
    let plain = "  approvals:\n    required: 1\n    controlPlane: 3\n";
    let applied = one("v1.34.1", &backup("0 3 * * *", 7, &[&key_a]), &pools);
    // Unchanged: nothing to sign.
    let same = compute(&applied, &i, &applied_of(&applied), None).unwrap();
    assert!(!same.has_changes(), "{:#?}", same.clusters[0].settings);

    let field = |p: &Plan, f: &str| {
        p.clusters[0]
            .settings
            .iter()
            .find(|s| s.resource == "cluster" && s.field == f)
            .map(|s| (s.from.clone(), s.to.clone()))
    };
    // The schedule or retention alone: what a backup keeps and how often it runs decide what
    // a restore can bring back, so the highest bar (3; issue #50 changed this from the
    // ordinary bar, 1).
    let p = compute(
        &one("v1.34.1", &backup("0 4 * * *", 3, &[&key_a]), &pools),
        &i,
        &applied_of(&applied),
        None,
    )
    .unwrap();
    assert_eq!(
        field(&p, "backup.schedule"),
        Some((
            "0 3 * * * (Europe/Berlin)".into(),
            "0 4 * * * (Europe/Berlin)".into()
        ))
    );
    assert_eq!(
        field(&p, "backup.retention"),
        Some(("keep 7, maxAge 720h".into(), "keep 3, maxAge 720h".into()))
    );
    assert_eq!(p.approvals_required, 3);

    // Another recipient: who can read every Secret changes, so the highest bar (3).
    let p = compute(
        &one(
            "v1.34.1",
            &backup("0 3 * * *", 7, &[&key_a, &key_b]),
            &pools,
        ),
        &i,
        &applied_of(&applied),
        None,
    )
    .unwrap();
    assert_eq!(
        field(&p, "backup.recipients"),
        Some((format!("[{key_a}]"), format!("[{key_a}, {key_b}]")))
    );
    assert_eq!(p.approvals_required, 3);
    let text = render::text(&p, Default::default());
    assert!(
        text.contains(&format!(
            "~ cluster backup.recipients: [{key_a}] → [{key_a}, {key_b}]"
        )),
        "{text}"
    );
    assert!(
        p.clusters[0]
            .notes
            .iter()
            .any(|n| n.to_string().contains("(backup.recipients)")),
        "{:#?}",
        p.clusters[0].notes
    );

    // Turning backups off (or on) shows every field and its old value.
    let p = compute(
        &one("v1.34.1", plain, &pools),
        &i,
        &applied_of(&applied),
        None,
    )
    .unwrap();
    assert_eq!(
        field(&p, "backup.schedule"),
        Some(("0 3 * * * (Europe/Berlin)".into(), "off".into()))
    );
    assert_eq!(
        field(&p, "backup.destination"),
        Some(("local".into(), "none".into()))
    );

    // A cluster without backups, applied before this field existed, plans no change.
    let old = one("v1.34.1", plain, &pools);
    let mut applied_old = applied_of(&old);
    for r in applied_old.resources.values_mut() {
        let mut v = serde_json::to_value(&*r).unwrap();
        assert!(v["settings"].get("backup").is_none(), "{v}");
        v["settings"].as_object_mut().unwrap().remove("backup");
        *r = serde_json::from_value(v).unwrap();
    }
    let p = compute(&old, &i, &applied_old, None).unwrap();
    assert!(!p.has_changes(), "{:#?}", p.clusters[0].settings);
}

/// Issue 37: every bad `spec.backup` value is reported at once, at its line.
#[test]
fn bad_backup_settings_are_located() {
    let doc = cluster_doc(
        "c1",
        "v1.34.1",
        "  backup:\n    schedule: '0 3 * *'\n    timeZone: Mars/Olympus\n    retention: { keep: 0, maxAge: 30d }\n    destination: /etc/medea\n    recipients: [age1nope]\n",
    );
    let snap = Snapshot {
        files: vec![SourceFile {
            path: "c1.yaml".into(),
            bytes: doc.as_bytes().to_vec().into(),
        }],
        markers: Vec::new(),
        commit: None,
        refused: Vec::new(),
    };
    let loaded = parse_snapshot(snap);
    let found: Vec<(usize, String)> = loaded
        .diagnostics
        .iter()
        .filter(|d| d.code == crate::desired::diagnostic::codes::BACKUP)
        .map(|d| (d.origin.line, d.message.clone()))
        .collect();
    let lines: Vec<usize> = found.iter().map(|(l, _)| *l).collect();
    // schedule (line 9), keep and maxAge (line 11), destination (12), recipient (13).
    assert_eq!(lines, vec![9, 11, 11, 12, 13], "{found:#?}");
    assert!(found[0].1.contains("5-field cron"), "{found:#?}");
    assert!(found[3].1.contains("not a destination name"), "{found:#?}");
    assert!(found[4].1.contains("not an age public key"), "{found:#?}");
    assert!(loaded.desired.clusters.is_empty() || loaded.has_errors());

    // The zone is checked once the expression parses.
    let doc = cluster_doc(
        "c1",
        "v1.34.1",
        "  backup:\n    schedule: '0 3 * * *'\n    timeZone: Mars/Olympus\n    recipients: []\n",
    );
    let loaded = parse_snapshot(Snapshot {
        files: vec![SourceFile {
            path: "c1.yaml".into(),
            bytes: doc.as_bytes().to_vec().into(),
        }],
        markers: Vec::new(),
        commit: None,
        refused: Vec::new(),
    });
    let msgs: Vec<String> = loaded
        .diagnostics
        .iter()
        .map(|d| format!("{}: {}", d.origin.line, d.message))
        .collect();
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("10: unknown time zone `Mars/Olympus`")),
        "{msgs:#?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.contains("`backup.recipients` is empty")),
        "{msgs:#?}"
    );
}
