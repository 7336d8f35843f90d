//! A plan's notes: each kind's text (as the planner wrote it before notes were typed), the
//! wire shape, classification by kind whatever the text, and plans stored before.

use super::*;
use crate::plan::model::{ClusterPlan, Plan};

fn away(node: &str, why: &str) -> Away {
    Away {
        node: node.into(),
        why: why.into(),
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Every kind, with the text the planner wrote for it before notes were typed (the format
/// strings of `plan::compute`, `plan::preflight` at the commit before), byte for byte.
fn every_kind() -> Vec<(Note, &'static str)> {
    vec![
        (
            Note::RollingOut {
                job: "j-1".into(),
                cluster: "home".into(),
            },
            "rollout job j-1 is running: nothing is planned for this cluster until it ends (follow it with `medea rollout status --cluster home -w`); the next plan shows what is left",
        ),
        (
            Note::Removed {},
            "gone from the desired state: medea stops managing it on approval (nothing on the cluster changes)",
        ),
        (
            Note::NotObserved {},
            "not observed yet: run `medea seed` to observe it; nothing is planned for it",
        ),
        (
            Note::Unmanaged {
                machines: strings(&["spare-1", "spare-2"]),
            },
            "not in any pool (medea never upgrades their Talos): spare-1, spare-2",
        ),
        (
            Note::PoolSelectsNothing { pool: "gpu".into() },
            "node pool `gpu` selects no observed machine",
        ),
        (
            Note::Unavailable {
                machines: vec![
                    away("w-2", "NotReady"),
                    away("w-3", "unreachable, cordoned"),
                ],
            },
            "unavailable now, counted against maxUnavailable: w-2 (NotReady), w-3 (unreachable, cordoned)",
        ),
        (
            Note::KubeletUnknown {
                machines: strings(&["w-3"]),
            },
            "kubelet version unknown (not checked against the API server): w-3",
        ),
        (
            Note::SkipPodsLegacy {
                pool: "a".into(),
                hop: 1,
                hops: 2,
                to: "v1.13.10".into(),
                selector: strings(&["app=local-path"]),
                machines: strings(&["w-1"]),
                empty_dir_lost: false,
                volume_wait_skipped: true,
            },
            "node pool `a`, hop 1/2 to v1.13.10: drain.skipPods (app=local-path) does not hold for machine `w-1`, which runs Talos < 1.13: the legacy MachineService.Upgrade drains the node itself before installing and evicts every pod a controller owns (DaemonSets aside), the skipped ones included; drain.waitForVolumeDetach does not cover them: the node reboots right after its own drain",
        ),
        (
            Note::SkipPodsLegacy {
                pool: "a".into(),
                hop: 1,
                hops: 1,
                to: "v1.13.10".into(),
                selector: strings(&["app=x", "tier=db"]),
                machines: strings(&["w-1", "w-2"]),
                empty_dir_lost: true,
                volume_wait_skipped: false,
            },
            "node pool `a`, hop 1/1 to v1.13.10: drain.skipPods (app=x,tier=db) does not hold for machines `w-1`, `w-2`, which run Talos < 1.13: the legacy MachineService.Upgrade drains the node itself before installing and evicts every pod a controller owns (DaemonSets aside), the skipped ones included; drain.deleteEmptyDirData: false does not hold for them either (their emptyDir data is lost)",
        ),
        (
            Note::NotToppedUp {
                pool: "workers".into(),
                machines: strings(&["w-1"]),
                from: "v1.12.4".into(),
                newest: "v1.12.12".into(),
                to: "v1.13.10".into(),
            },
            "node pool `workers`: machine `w-1` runs v1.12.4, not the newest patch of its minor (v1.12.12), and goes straight to v1.13.10: the Talos docs recommend the newest patch of the running minor first; to follow them, plan v1.12.12 for the pool before this",
        ),
        (
            Note::NotToppedUp {
                pool: "workers".into(),
                machines: strings(&["w-1", "w-2"]),
                from: "v1.12.4".into(),
                newest: "v1.12.12".into(),
                to: "v1.13.10".into(),
            },
            "node pool `workers`: machines `w-1`, `w-2` run v1.12.4, not the newest patch of its minor (v1.12.12), and go straight to v1.13.10: the Talos docs recommend the newest patch of the running minor first; to follow them, plan v1.12.12 for the pool before this",
        ),
        (
            Note::Exclusion {
                exclusion: "`freeze` (x)".into(),
                holds: vec![],
            },
            "maintenance exclusion `freeze` (x): holds none of this plan's changes",
        ),
        (
            Note::Exclusion {
                exclusion: "`freeze` (x)".into(),
                holds: strings(&[
                    "pool w v1.13.2 → v1.14.6 (minor)",
                    "kubernetes v1.34.2 → v1.35.8 (minor)",
                ]),
            },
            "maintenance exclusion `freeze` (x): no node starts these changes inside it: pool w v1.13.2 → v1.14.6 (minor), kubernetes v1.34.2 → v1.35.8 (minor)",
        ),
        (
            Note::ControlPlaneSettings {
                settings: strings(&["pool controlplane role", "kubernetes"]),
            },
            "settings of a control-plane pool act on control-plane nodes, and the cluster's Kubernetes settings on the control plane: the control-plane approval bar applies (pool controlplane role, kubernetes)",
        ),
        (
            Note::ApprovalsChange {
                required: 1,
                control_plane: 2,
                needs: 3,
            },
            "this plan changes the approvals setting: it needs the highest bar in force, max(required 1, controlPlane 2), or the new bar if higher (3); the new setting applies to later plans",
        ),
        (
            Note::SourcesChange {
                settings: strings(&["health.prometheus"]),
                required: 1,
                control_plane: 2,
                needs: 2,
            },
            "this plan changes where health data and credentials go (health.prometheus): it needs the highest bar in force, max(required 1, controlPlane 2) (2)",
        ),
        (
            Note::HighestSettings {
                settings: strings(&["health.silence.lease"]),
                required: 1,
                control_plane: 2,
                needs: 2,
            },
            "this plan changes what alert silences cover or when backups run and what they keep (health.silence.lease): it needs the highest bar in force, max(required 1, controlPlane 2) (2)",
        ),
        (
            Note::HooksChange {
                settings: strings(&["pool workers hooks.beforeNode"]),
                required: 1,
                control_plane: 2,
                needs: 2,
            },
            "this plan changes blocking hooks (pool workers hooks.beforeNode): hooks run actions of their own (a Job in the cluster, a call carrying the server's credential), so it needs the highest bar in force, max(required 1, controlPlane 2) (2)",
        ),
        (
            Note::GatesRemoved {
                resource: "pool w".into(),
            },
            "this plan removes every health gate of the pool w: its rollouts will no longer wait for any gate",
        ),
        (
            Note::PromotionRemoved {
                after: "staging".into(),
            },
            "this plan removes the promotion after cluster staging: versions no longer wait for it to run them first",
        ),
        (
            Note::BudgetUnavailable {
                pool: "workers".into(),
                to: "v1.13.9".into(),
                wave: 2,
                machines: vec![away("w-2", "NotReady")],
                slots: 0,
                capacity: 1,
            },
            "pool workers (Talos v1.13.9): wave 2 counts 1 node already unavailable (w-2 NotReady); 0 of 1 slot left",
        ),
        (
            Note::BudgetUnavailable {
                pool: "workers".into(),
                to: "v1.13.9".into(),
                wave: 1,
                machines: vec![away("w-2", "NotReady"), away("w-3", "cordoned")],
                slots: 1,
                capacity: 3,
            },
            "pool workers (Talos v1.13.9): wave 1 counts 2 nodes already unavailable (w-2 NotReady, w-3 cordoned); 1 of 3 slots left",
        ),
        (
            Note::StaleAcknowledgement {
                id: "removed-api/gone/v1/things".into(),
                file: "clusters/home.yaml".into(),
                line: 12,
            },
            "spec.preflight.acknowledge lists `removed-api/gone/v1/things` (clusters/home.yaml:12), which matches no current finding: a stale acknowledgement; remove it",
        ),
        (Note::Legacy("an old note".into()), "an old note"),
    ]
}

fn section(notes: Vec<Note>) -> ClusterPlan {
    ClusterPlan {
        cluster: "home".into(),
        steps: Vec::new(),
        settings: Vec::new(),
        unchanged: Vec::new(),
        status: Default::default(),
        notes,
        diffs: Vec::new(),
        preflight: Vec::new(),
        health: None,
        hooks: None,
        raised_by: Vec::new(),
    }
}

#[test]
fn each_kind_renders_the_text_it_had_before_and_is_sent_with_it() {
    for (note, text) in every_kind() {
        assert_eq!(note.to_string(), text, "{note:?}");
        let json = serde_json::to_value(section(vec![note.clone()])).expect("serializes");
        let sent = &json["notes"][0];
        if let Note::Legacy(_) = note {
            assert_eq!(
                sent,
                &serde_json::json!(text),
                "a legacy note is sent as its string"
            );
        } else {
            assert_eq!(sent["text"], serde_json::json!(text), "{sent}");
            assert!(sent["kind"].is_string(), "{sent}");
        }
        let back: ClusterPlan = serde_json::from_value(json).expect("reads back");
        assert_eq!(back.notes, [note], "a note reads back as itself");
    }
}

#[test]
fn a_note_is_sent_as_its_kind_and_data() {
    let n = Note::BudgetUnavailable {
        pool: "workers".into(),
        to: "v1.13.9".into(),
        wave: 2,
        machines: vec![away("w-2", "NotReady")],
        slots: 0,
        capacity: 1,
    };
    let json = serde_json::to_value(section(vec![n])).expect("serializes");
    assert_eq!(
        json["notes"][0],
        serde_json::json!({
            "kind": "budgetUnavailable",
            "pool": "workers",
            "to": "v1.13.9",
            "wave": 2,
            "machines": [{"node": "w-2", "why": "NotReady"}],
            "slots": 0,
            "capacity": 1,
            "text": "pool workers (Talos v1.13.9): wave 2 counts 1 node already unavailable (w-2 NotReady); 0 of 1 slot left",
        })
    );
}

/// The kind is the note: a reader (or a later medea whose wording changed) that reads a note
/// whose `text` says something else classifies it by its kind, and renders its own text.
#[test]
fn a_note_whose_text_changes_keeps_its_kind() {
    let sent = serde_json::json!([{
        "kind": "hooksChange",
        "settings": ["pool workers hooks.beforeNode"],
        "required": 1,
        "controlPlane": 2,
        "needs": 2,
        "text": "reworded: nothing here says hooks",
    }, {
        "kind": "removed",
        "text": "this plan changes blocking hooks (a removed cluster's note, worded like another kind)",
    }]);
    let mut c = serde_json::to_value(section(Vec::new())).expect("serializes");
    c["notes"] = sent;
    let back: ClusterPlan = serde_json::from_value(c).expect("reads");
    assert!(matches!(
        &back.notes[..],
        [Note::HooksChange { needs: 2, .. }, Note::Removed {}]
    ));
    assert!(back.notes[0].to_string().starts_with(HOOKS_CHANGE_NOTE));
    assert!(!back.notes[1].to_string().contains("hooks"));
}

/// A plan stored before notes were typed (`medea plan -o json` of `plan_notes_text_and_json`
/// at the commit before, cut to the stored fields): it loads, its notes are its strings, and
/// it writes back the same JSON, so the sections its id hashes are unchanged.
#[test]
fn a_plan_stored_with_string_notes_still_loads_and_keeps_its_bytes() {
    let old = include_str!("../../tests/fixtures/plan-untyped-notes.json");
    let plan: Plan = serde_json::from_str(old).expect("an old stored plan loads");
    let notes = &plan.clusters[0].notes;
    assert_eq!(notes.len(), 8, "{notes:#?}");
    assert!(
        notes.iter().all(|n| matches!(n, Note::Legacy(_))),
        "{notes:#?}"
    );
    assert_eq!(
        notes[0].to_string(),
        "not in any pool (medea never upgrades their Talos): spare-1"
    );
    let was: serde_json::Value = serde_json::from_str(old).expect("json");
    let now = serde_json::to_value(&plan).expect("serializes");
    assert_eq!(now["clusters"], was["clusters"]);
    // and the text rendering shows them as before
    let text = crate::plan::render::text(&plan, crate::plan::render::Options { color: false });
    assert!(
        text.contains("note: node pool `gpu` selects no observed machine"),
        "{text}"
    );
}
