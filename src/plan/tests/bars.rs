//! Every setting that acts is a settings change with the bar issue #50 names, alone and riding
//! along a routine worker version bump; a new document counts as each of its settings changing.

use super::*;
use crate::plan::LastApplied;
use crate::plan::bar::{Bar, bar_of};
use crate::plan::setting::Setting;
use std::collections::BTreeSet;

/// `approvals.required: 1`, `controlPlane: 3`: the ordinary bar is 1, the control-plane and
/// the highest bar in force 3.
const APPROVALS: &str = "  approvals:\n    required: 1\n    controlPlane: 3\n";
const AM: &str =
    "  health:\n    alertmanager: { url: \"https://am.monitoring:9093\", credential: am }\n";

fn silence(body: &str) -> String {
    format!("{APPROVALS}{AM}    silence:\n{body}")
}

const SILENCE: &str = "      matchers: ['alertname=\"KubeNodeNotReady\"']\n      nodeLabel: instance\n      lease: 5m\n      maxDuration: 1h\n";

/// The plan of `cluster_after`/`pool_after` over the applied `cluster_before`/`pool_before`,
/// with worker `w-1` already on the target (`bump: false`) or one patch behind it.
fn plan_of(
    cluster_before: &str,
    cluster_after: &str,
    pool_before: &str,
    pool_after: &str,
    bump: bool,
) -> Plan {
    let pool = |extra: &str| vec![pool_doc("w", "worker", "w-1", "v1.13.9", extra)];
    let applied = one("v1.34.1", cluster_before, &pool(pool_before));
    let next = one("v1.34.1", cluster_after, &pool(pool_after));
    let running = if bump { "v1.13.2" } else { "v1.13.9" };
    let i = observed("v1.34.1", 1, vec![w("w-1", running)]);
    compute(&next, &i, &applied_of(&applied), None).unwrap_or_else(|e| panic!("{e:#?}"))
}

/// The plan lists a change of `setting` and needs `needs` approvals, said by a typed raise
/// of the bar `bar_of` chose (none for an ordinary setting).
fn assert_change(p: &Plan, setting: Setting, needs: u32, bump: bool) {
    let c = &p.clusters[0];
    assert!(
        c.settings.iter().any(|s| s.field == setting.path()),
        "{setting} (bump {bump}) is not a settings change: {:#?}",
        c.settings
    );
    assert_eq!(
        c.steps.is_empty(),
        !bump,
        "{setting}: the bump rides along or not"
    );
    assert_eq!(p.approvals_required, needs, "{setting} (bump {bump})");
    let raised = c.raised_by.iter().find(|r| r.setting == setting);
    match bar_of(setting) {
        Bar::Ordinary => assert!(raised.is_none(), "{setting}: {:#?}", c.raised_by),
        bar => {
            assert!(
                raised.is_some_and(|r| r.bar == bar),
                "{setting}: {:#?}",
                c.raised_by
            );
            let text = render::text(p, Default::default());
            assert!(text.contains(setting.path()), "{text}");
            let json: serde_json::Value = serde_json::from_str(&render::json(p)).unwrap();
            let raised = json.to_string();
            assert!(
                raised.contains(&format!("\"setting\":\"{}\"", setting.path())),
                "the plan's JSON names {setting}: {raised}"
            );
        }
    }
}

/// Each case alone and riding along a worker's patch bump.
fn both(cb: &str, ca: &str, pb: &str, pa: &str, setting: Setting, needs: u32) {
    for bump in [false, true] {
        assert_change(&plan_of(cb, ca, pb, pa, bump), setting, needs, bump);
    }
}

#[test]
fn health_silence_alone_is_a_settings_change_at_the_highest_bar() {
    // It planned "no changes" before issue #50.
    let off = format!("{APPROVALS}{AM}");
    both(&off, &silence(SILENCE), "", "", Setting::SilenceMatchers, 3);
    both(&silence(SILENCE), &off, "", "", Setting::SilenceLease, 3);
}

#[test]
fn every_silence_setting_is_a_settings_change_at_the_highest_bar() {
    let base = silence(SILENCE);
    let cases = [
        (
            SILENCE.replace("KubeNodeNotReady\"", "Kube.*\""),
            Setting::SilenceMatchers,
        ),
        (
            SILENCE.replace("lease: 5m", "lease: 10m"),
            Setting::SilenceLease,
        ),
        (
            SILENCE.replace("maxDuration: 1h", "maxDuration: 2h"),
            Setting::SilenceMaxDuration,
        ),
        (
            format!("{SILENCE}      onError: proceed\n"),
            Setting::SilenceOnError,
        ),
        (
            SILENCE.replace("nodeLabel: instance", "nodeLabel: node"),
            Setting::SilenceNodeLabel,
        ),
    ];
    for (body, setting) in cases {
        both(&base, &silence(&body), "", "", setting, 3);
    }
}

#[test]
fn taint_next_wave_and_the_volume_detach_wait_are_settings_changes_at_the_ordinary_bar() {
    let cases = [
        (
            "  rollout:\n    taintNextWave: false\n",
            Setting::TaintNextWave,
        ),
        (
            "  drain:\n    waitForVolumeDetach: false\n",
            Setting::WaitForVolumeDetach,
        ),
        (
            "  drain:\n    volumeDetachTimeout: 10m\n",
            Setting::VolumeDetachTimeout,
        ),
    ];
    for (pool, setting) in cases {
        both(APPROVALS, APPROVALS, "", pool, setting, 1);
    }
}

#[test]
fn a_control_plane_pools_taint_and_detach_settings_need_the_control_plane_bar() {
    let applied = one("v1.34.1", APPROVALS, &[cp_pool("v1.13.9")]);
    let next = one(
        "v1.34.1",
        APPROVALS,
        &[pool_doc(
            "cp",
            "controlplane",
            "cp-1, cp-2, cp-3",
            "v1.13.9",
            "  rollout:\n    taintNextWave: false\n  drain:\n    volumeDetachTimeout: 10m\n",
        )],
    );
    let i = observed("v1.34.1", 1, three_cps("v1.13.9"));
    let p = compute(&next, &i, &applied_of(&applied), None).unwrap();
    assert_eq!(p.approvals_required, 3);
    let raised: Vec<(Setting, Bar)> = p.clusters[0]
        .raised_by
        .iter()
        .map(|r| (r.setting, r.bar))
        .collect();
    assert!(
        raised.contains(&(Setting::TaintNextWave, Bar::ControlPlane)),
        "{raised:?}"
    );
    assert!(
        raised.contains(&(Setting::VolumeDetachTimeout, Bar::ControlPlane)),
        "{raised:?}"
    );
}

fn backup(schedule: &str, keep: u32, key: &str) -> String {
    format!(
        "{APPROVALS}  backup:\n    schedule: '{schedule}'\n    timeZone: Europe/Berlin\n    retention: {{ keep: {keep}, maxAge: 720h }}\n    recipients: [{key}]\n"
    )
}

#[test]
fn backup_schedule_and_retention_need_the_highest_bar() {
    let key = age::x25519::Identity::generate().to_public().to_string();
    let base = backup("0 3 * * *", 7, &key);
    both(
        &base,
        &backup("0 4 * * *", 7, &key),
        "",
        "",
        Setting::BackupSchedule,
        3,
    );
    both(
        &base,
        &backup("0 3 * * *", 3, &key),
        "",
        "",
        Setting::BackupRetention,
        3,
    );
}

#[test]
fn hooks_and_health_source_credentials_need_the_highest_bar() {
    let hook = |url: &str| {
        format!(
            "{APPROVALS}  hooks:\n    beforeJob:\n      - name: announce\n        timeout: 1m\n        http: {{ url: \"{url}\", credential: ops }}\n"
        )
    };
    both(
        &hook("https://hooks.example/a"),
        &hook("https://hooks.example/b"),
        "",
        "",
        Setting::HooksBeforeJob,
        3,
    );
    let with_cred = |c: &str| {
        format!(
            "{APPROVALS}  health:\n    alertmanager: {{ url: \"https://am.monitoring:9093\", credential: {c} }}\n"
        )
    };
    both(
        &with_cred("am"),
        &with_cred("other"),
        "",
        "",
        Setting::HealthAlertmanager,
        3,
    );
}

#[test]
fn a_new_cluster_bringing_backups_needs_the_highest_bar() {
    let key = age::x25519::Identity::generate().to_public().to_string();
    let pools = vec![pool_doc("w", "worker", "w-1", "v1.13.9", "")];
    let i = observed("v1.34.1", 1, vec![w("w-1", "v1.13.9")]);
    // Without backups, a new workers-only cluster needs the ordinary bar of the defaults (1).
    let plain = compute(
        &one("v1.34.1", "", &pools),
        &i,
        &LastApplied::default(),
        None,
    )
    .unwrap();
    assert_eq!(plain.approvals_required, 1);
    assert!(plain.clusters[0].raised_by.is_empty());
    // With `spec.backup`: where backups go and who can read them are new, so the highest bar
    // of the defaults in force (2).
    let doc = format!(
        "  backup:\n    schedule: '0 3 * * *'\n    timeZone: Europe/Berlin\n    retention: {{ keep: 7 }}\n    recipients: [{key}]\n"
    );
    let p = compute(
        &one("v1.34.1", &doc, &pools),
        &i,
        &LastApplied::default(),
        None,
    )
    .unwrap();
    assert_eq!(p.approvals_required, 2);
    let c = &p.clusters[0];
    assert!(
        c.settings
            .iter()
            .any(|s| s.resource == "cluster" && s.to == "created"),
        "{:#?}",
        c.settings
    );
    for s in [
        Setting::BackupSchedule,
        Setting::BackupRetention,
        Setting::BackupDestination,
        Setting::BackupRecipients,
    ] {
        assert!(
            c.raised_by
                .iter()
                .any(|r| r.setting == s && r.bar == Bar::Highest && r.whole_resource),
            "{s}: {:#?}",
            c.raised_by
        );
    }
    assert!(
        render::bar_reason(&p).contains("backup.destination"),
        "{}",
        render::bar_reason(&p)
    );
}

/// Every setting the applied records yield is in `Setting::ALL` and every variant is yielded
/// by a Cluster's or a NodePool's record: the settings list is the one the types give.
#[test]
fn every_setting_is_yielded_by_a_record_and_listed_once() {
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "w-1", "v1.13.9", "")],
    );
    let applied = applied_of(&d);
    let mut yielded = std::collections::BTreeSet::new();
    for r in applied.resources.values() {
        for (s, _) in r.settings() {
            assert!(
                yielded.insert((r.key.label(), s)),
                "{s} twice in {}",
                r.key.label()
            );
        }
    }
    let all: std::collections::BTreeSet<Setting> = Setting::ALL.into_iter().collect();
    let seen: std::collections::BTreeSet<Setting> = yielded.iter().map(|(_, s)| *s).collect();
    assert_eq!(seen, all);
}

/// Issue #50 item 4: a lease over 30m, a maxDuration over 12h and a lone matcher that matches
/// every alert are refused where they are written, with a help line.
#[test]
fn silence_bounds_and_match_all_matchers_are_refused_where_written() {
    let cases = [
        (
            SILENCE.replace("lease: 5m", "lease: 8760h"),
            "lease: 8760h",
            "`health.silence.lease` is 8760h, longer than 30m",
        ),
        (
            SILENCE.replace("maxDuration: 1h", "maxDuration: 87600h"),
            "maxDuration: 87600h",
            "`health.silence.maxDuration` is 87600h, longer than 12h",
        ),
        (
            SILENCE.replace("alertname=\"KubeNodeNotReady\"", "alertname=~\".+\""),
            "matchers:",
            "alone matches every alert",
        ),
        (
            SILENCE.replace("alertname=\"KubeNodeNotReady\"", "alertname=~\".*\""),
            "matchers:",
            "alone matches every alert",
        ),
        (
            SILENCE.replace("alertname=\"KubeNodeNotReady\"", "severity!=\"\""),
            "matchers:",
            "alone matches every alert",
        ),
        (
            SILENCE.replace("alertname=\"KubeNodeNotReady\"", "job=~\".*\""),
            "matchers:",
            "alone matches every alert",
        ),
    ];
    for (body, line, message) in cases {
        let cluster = silence(&body);
        let d = diagnostics_of(&cluster, "");
        let hit = d
            .iter()
            .find(|x| x.message.contains(message))
            .unwrap_or_else(|| panic!("{message}: {d:#?}"));
        assert_eq!(hit.origin.file, "c1.yaml", "{hit:#?}");
        let text = cluster_doc("c1", "v1.34.1", &cluster);
        let at = text.lines().nth(hit.origin.line - 1).unwrap_or("");
        assert!(at.contains(line), "{message} at `{at}`");
        assert!(hit.help.is_some(), "{hit:#?}");
    }
    // A match-all matcher beside one that narrows it, and the bounds themselves, are fine.
    for body in [
        SILENCE.replace(
            "['alertname=\"KubeNodeNotReady\"']",
            "['alertname=\"KubeNodeNotReady\"', 'job=~\".*\"']",
        ),
        SILENCE
            .replace("lease: 5m", "lease: 30m")
            .replace("maxDuration: 1h", "maxDuration: 12h"),
    ] {
        let d = diagnostics_of(&silence(&body), "");
        assert!(
            !d.iter().any(|x| x.message.contains("health.silence")),
            "{d:#?}"
        );
    }
}

/// The README's table of settings and their bars is the one `bar_of` gives (issue #50): a
/// setting added or moved to another bar fails here until the README says so.
#[test]
fn the_readme_table_of_settings_and_bars_is_the_match() {
    let mut table = String::from("| Setting | Approval bar |\n|---|---|\n");
    for s in Setting::ALL {
        table.push_str(&format!("| `{}` | {} |\n", s.path(), bar_of(s).label()));
    }
    let readme = include_str!("../../../README.md");
    let begin = "<!-- settings-bars:begin -->\n";
    let end = "<!-- settings-bars:end -->";
    let found = readme
        .split_once(begin)
        .and_then(|(_, rest)| rest.split_once(end))
        .map(|(t, _)| t);
    assert_eq!(
        found,
        Some(table.as_str()),
        "README.md's table should read:\n{table}"
    );
}

/// Issue #50 item 4: a backup schedule more often than every 15 minutes is refused at the
/// `schedule` line, with a help line; every 15 minutes is accepted.
#[test]
fn a_backup_schedule_more_often_than_every_15_minutes_is_refused_where_written() {
    let key = age::x25519::Identity::generate().to_public().to_string();
    let cluster = backup("*/5 * * * *", 7, &key);
    let d = diagnostics_of(&cluster, "");
    let hit = d
        .iter()
        .find(|x| x.message.contains("more often than every 15m"))
        .unwrap_or_else(|| panic!("{d:#?}"));
    let text = cluster_doc("c1", "v1.34.1", &cluster);
    let at = text.lines().nth(hit.origin.line - 1).unwrap_or("");
    assert!(at.contains("schedule: '*/5 * * * *'"), "at `{at}`");
    assert!(
        hit.help
            .as_deref()
            .is_some_and(|h| h.contains("15 minutes"))
    );
    let ok = diagnostics_of(&backup("*/15 * * * *", 7, &key), "");
    assert!(!ok.iter().any(|x| x.message.contains("backup")), "{ok:#?}");
}

/// Issue #51's gate settings (folded in at the merge): `skipOperatorSilences` decides what
/// operators' silences cover, so it needs the highest bar; `consecutiveErrorLimit` and
/// `onInconclusive` are gate settings at the ordinary bar. Each is a settings change, alone and
/// riding along a bump.
#[test]
fn the_gate_settings_of_issue_51_are_settings_changes_with_their_bars() {
    let gates = |alerts: &str, query: &str| {
        format!(
            "{APPROVALS}  health:\n    prometheus: {{ url: \"https://prom.monitoring:9090\", credential: prom }}\n    alertmanager: {{ url: \"https://am.monitoring:9093\", credential: am }}\n    gates:\n      - name: critical\n        alerts: {{ matchers: ['severity=\"critical\"']{alerts} }}\n      - name: ceph\n        query: 'ceph_health_status == 0'\n{query}"
        )
    };
    let base = gates("", "");
    both(
        &base,
        &gates(", skipOperatorSilences: true", ""),
        "",
        "",
        Setting::GatesSkippingOperatorSilences,
        3,
    );
    both(
        &base,
        &gates("", "        consecutiveErrorLimit: 6\n"),
        "",
        "",
        Setting::HealthGates,
        1,
    );
    both(
        &base,
        &gates("", "        onInconclusive: pause\n"),
        "",
        "",
        Setting::HealthGates,
        1,
    );
}

/// Spec fields that are not settings, and why (issue #50 item 1).
const INERT: &[(&str, &str)] = &[
    (
        "kubernetes.version",
        "a version is what the plan's steps do, not a setting",
    ),
    (
        "talos.version",
        "a version is what the plan's steps do, not a setting",
    ),
    (
        "cluster",
        "a NodePool's cluster is its identity (the applied record's key), not a setting",
    ),
];

/// Spec fields whose value is shown by a setting of another path, and how.
const SHOWN_BY: &[(&str, Setting, &str)] = &[
    (
        "drain.timeout",
        Setting::DrainTimeout,
        "replaces `rollout.drainTimeout`: both land in the one drain timeout",
    ),
    (
        "backup.timeZone",
        Setting::BackupSchedule,
        "shown with the schedule, `<cron> (<zone>)`",
    ),
];

/// Every property path under `spec` of a committed JSON schema (arrays and maps walked into).
fn spec_paths(schema: &serde_json::Value) -> BTreeSet<String> {
    fn walk(
        root: &serde_json::Value,
        node: &serde_json::Value,
        path: &str,
        seen: &BTreeSet<String>,
        out: &mut BTreeSet<String>,
    ) {
        let mut seen = seen.clone();
        let mut node = node;
        if let Some(r) = node.get("$ref").and_then(|r| r.as_str()) {
            let name = r.rsplit('/').next().unwrap().to_string();
            if !seen.insert(name.clone()) {
                return;
            }
            node = &root["$defs"][&name];
        }
        for k in ["anyOf", "oneOf", "allOf"] {
            for n in node.get(k).and_then(|v| v.as_array()).into_iter().flatten() {
                walk(root, n, path, &seen, out);
            }
        }
        for k in ["items", "additionalProperties"] {
            if let Some(n) = node.get(k).filter(|n| n.is_object()) {
                walk(root, n, path, &seen, out);
            }
        }
        for (k, v) in node
            .get("properties")
            .and_then(|p| p.as_object())
            .into_iter()
            .flatten()
        {
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            out.insert(p.clone());
            walk(root, v, &p, &seen, out);
        }
    }
    let mut out = BTreeSet::new();
    walk(
        schema,
        &schema["properties"]["spec"],
        "",
        &BTreeSet::new(),
        &mut out,
    );
    out
}

/// The leaves of `paths` that no setting covers and neither list names.
fn uncovered(paths: &BTreeSet<String>) -> Vec<String> {
    paths
        .iter()
        .filter(|p| !paths.iter().any(|q| q.starts_with(&format!("{p}."))))
        .filter(|p| {
            !(Setting::ALL
                .iter()
                .any(|s| *p == s.path() || p.starts_with(&format!("{}.", s.path())))
                || INERT.iter().any(|(i, _)| i == p)
                || SHOWN_BY.iter().any(|(i, _, _)| i == p))
        })
        .cloned()
        .collect()
}

/// Issue #50 item 1: every field of the Cluster and NodePool spec types is a setting (its own
/// path, or under a setting whose value shows it), shown by another setting ([`SHOWN_BY`]), or
/// declared inert with why ([`INERT`]). The committed schemas are the spec types
/// (`committed_schemas_match_the_code`), so a field added to a spec type fails here until its
/// setting is chosen.
#[test]
fn every_spec_field_is_a_setting_or_declared_inert() {
    let mut missing = Vec::new();
    let mut all = BTreeSet::new();
    for file in ["cluster", "nodepool"] {
        let text = std::fs::read_to_string(format!(
            "{}/schemas/{file}.json",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let paths = spec_paths(&serde_json::from_str(&text).unwrap());
        assert!(paths.len() > 20, "{file}: {paths:?}");
        missing.extend(
            uncovered(&paths)
                .into_iter()
                .map(|p| format!("{file}: spec.{p}")),
        );
        all.extend(paths);
    }
    assert!(
        missing.is_empty(),
        "spec fields that are no setting (add a `Setting`, or list them in INERT or SHOWN_BY \
         with why): {missing:#?}"
    );
    for (p, _) in INERT {
        assert!(all.contains(*p), "INERT lists {p}, which no spec has");
    }
    for (p, s, _) in SHOWN_BY {
        assert!(all.contains(*p), "SHOWN_BY lists {p}, which no spec has");
        assert!(Setting::ALL.contains(s));
    }
}

/// The check above catches a field no setting covers (run on a synthetic schema).
#[test]
fn a_spec_field_without_a_setting_is_found() {
    let schema = serde_json::json!({
        "properties": {"spec": {"$ref": "#/$defs/S"}},
        "$defs": {"S": {"properties": {
            "rollout": {"properties": {"maxUnavailable": {}, "brandNew": {}}},
            "health": {"properties": {"gates": {"items": {"$ref": "#/$defs/G"}}}}
        }}, "G": {"properties": {"name": {}}}}
    });
    let paths = spec_paths(&schema);
    assert!(paths.contains("rollout.brandNew"), "{paths:?}");
    assert!(paths.contains("health.gates.name"), "{paths:?}");
    assert_eq!(uncovered(&paths), vec!["rollout.brandNew".to_string()]);
}
