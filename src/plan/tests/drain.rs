//! The drain policy and the upgrade bound (issue 20).

use super::*;

// ---------------------------------------------------------------------------------------------
// the drain policy and the upgrade bound (issue 20)

fn policy_of(p: &Plan, pool: &str) -> (DrainPolicy, u64, u32) {
    let t = talos_steps(p)
        .into_iter()
        .find(|t| t.pool == pool)
        .expect("the pool has a step");
    (
        t.drain.clone(),
        t.drain_timeout.as_secs(),
        t.upgrade_attempts,
    )
}

#[test]
fn the_drain_policy_defaults_like_talosctl_and_pools_override_the_cluster() {
    let p = plan_ok(&two_worker_pools("", ""), &two_workers());
    let (d, timeout, attempts) = policy_of(&p, "a");
    assert!(
        d.delete_empty_dir_data,
        "talosctl drains with DeleteEmptyDirData"
    );
    assert!(!d.evict_unmanaged_pods);
    assert!(d.skip_pods.is_empty());
    assert_eq!((timeout, attempts), (600, 2));

    let cluster = "  drain:\n    deleteEmptyDirData: false\n    skipPods:\n      matchLabels:\n        app: local-path\n    timeout: 3m\n  rollout:\n    upgradeAttempts: 3\n";
    let pool = "  drain:\n    evictUnmanagedPods: true\n    timeout: 7m\n  rollout:\n    upgradeAttempts: 1\n";
    let p2 = plan_ok(&two_worker_pools(cluster, pool), &two_workers());
    let (a, ta, na) = policy_of(&p2, "a");
    assert!(!a.delete_empty_dir_data && !a.evict_unmanaged_pods);
    assert_eq!(
        a.skip_pods,
        [("app".to_string(), "local-path".to_string())].into()
    );
    assert_eq!((ta, na), (180, 3));
    let (b, tb, nb) = policy_of(&p2, "b");
    assert!(!b.delete_empty_dir_data, "inherited from the cluster");
    assert!(b.evict_unmanaged_pods, "the pool's override");
    assert_eq!(b.skip_pods, a.skip_pods);
    assert_eq!((tb, nb), (420, 1));
    // the plan shows the effective policy, and its id covers it
    let text = render::text(&p2, Default::default());
    assert!(
        text.contains("drain deleteEmptyDirData=false evictUnmanagedPods=true skipPods=app=local-path volumeDetachTimeout=5m timeout 7m; upgrade attempts 1"),
        "{text}"
    );
    assert_ne!(p.id, p2.id);
    let p3 = plan_ok(
        &two_worker_pools("", "  drain:\n    evictUnmanagedPods: true\n"),
        &two_workers(),
    );
    assert_ne!(
        p.id, p3.id,
        "a drain policy change alone changes the plan id"
    );
}

/// `rollout.taintNextWave` (issue #35): on by default and then absent from the plan's JSON
/// (plans made before it keep their ids); off per pool or cluster-wide, shown and in the id.
#[test]
fn taint_next_wave_is_on_by_default_and_off_is_shown_and_changes_the_id() {
    let p = plan_ok(&two_worker_pools("", ""), &two_workers());
    assert!(talos_steps(&p).iter().all(|t| t.taint_next_wave));
    let json = serde_json::to_string(&p).unwrap();
    assert!(!json.contains("taintNextWave"), "{json}");
    let text = render::text(&p, Default::default());
    assert!(!text.contains("not tainted"), "{text}");

    let off = plan_ok(
        &two_worker_pools("", "  rollout:\n    taintNextWave: false\n"),
        &two_workers(),
    );
    let steps = talos_steps(&off);
    let by_pool = |pool: &str| {
        steps
            .iter()
            .find(|t| t.pool == pool)
            .unwrap()
            .taint_next_wave
    };
    assert!(by_pool("a"), "the other pool keeps the default");
    assert!(!by_pool("b"));
    assert!(
        serde_json::to_string(&off)
            .unwrap()
            .contains("\"taintNextWave\":false")
    );
    let text = render::text(&off, Default::default());
    assert_eq!(
        text.matches("next wave not tainted (rollout.taintNextWave: false)")
            .count(),
        1,
        "{text}"
    );
    assert_ne!(p.id, off.id);
    let cluster_off = plan_ok(
        &two_worker_pools("  rollout:\n    taintNextWave: false\n", ""),
        &two_workers(),
    );
    assert!(talos_steps(&cluster_off).iter().all(|t| !t.taint_next_wave));
}

#[test]
fn both_drain_timeouts_or_a_bad_bound_or_an_empty_skip_selector_are_refused() {
    let d = diagnostics_of(
        "  rollout:\n    drainTimeout: 5m\n  drain:\n    timeout: 6m\n",
        "",
    );
    let e = only(&d, crate::desired::diagnostic::codes::DURATION);
    assert!(
        e.message.contains("drain.timeout") && e.message.contains("rollout.drainTimeout"),
        "{e:?}"
    );
    // on different levels they do not clash: the pool's drain.timeout overrides the cluster's
    assert!(
        diagnostics_of(
            "  rollout:\n    drainTimeout: 5m\n",
            "  drain:\n    timeout: 6m\n"
        )
        .iter()
        .all(|d| !d.is_error())
    );
    let d = diagnostics_of("", "  rollout:\n    upgradeAttempts: 0\n");
    let e = only(&d, crate::desired::diagnostic::codes::INVALID_VALUE);
    assert!(e.message.contains("upgradeAttempts"), "{e:?}");
    let d = diagnostics_of("  rollout:\n    upgradeAttempts: 9\n", "");
    assert!(
        only(&d, crate::desired::diagnostic::codes::INVALID_VALUE)
            .message
            .contains("between 1 and 5")
    );
    let d = diagnostics_of("  drain:\n    skipPods:\n      matchLabels: {}\n", "");
    let e = only(&d, crate::desired::diagnostic::codes::INVALID_VALUE);
    assert!(e.message.contains("skipPods"), "{e:?}");
}

/// Issue #48 item 7: the Talos docs recommend the newest patch of the running minor before
/// the next minor; medea goes to the next minor at once, and the plan says so, per pool and
/// running version, naming the patch to plan first. Nothing is said when a machine already
/// runs that patch or stays in its minor.
#[test]
fn a_hop_that_skips_topping_up_the_current_minor_is_noted() {
    let d = one(
        "v1.34.1",
        "",
        &[
            pool_doc("a", "worker", "w-1, w-2, w-3", "v1.14.6", ""),
            pool_doc("b", "worker", "w-4", "v1.13.10", ""),
        ],
    );
    let inv = observed(
        "v1.34.1",
        1,
        vec![
            w("w-1", "v1.13.2"),
            w("w-2", "v1.13.2"),
            w("w-3", "v1.13.10"),
            w("w-4", "v1.13.4"),
        ],
    );
    let p = plan_ok(&d, &inv);
    let notes: Vec<String> = p.clusters[0]
        .notes
        .iter()
        .filter(|n| matches!(n, crate::plan::note::Note::NotToppedUp { .. }))
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        notes,
        [
            "node pool `a`: machines `w-1`, `w-2` run v1.13.2, not the newest patch of its minor (v1.13.10), and go straight to v1.14.6: the Talos docs recommend the newest patch of the running minor first; to follow them, plan v1.13.10 for the pool before this"
        ],
        "{:#?}",
        p.clusters[0].notes
    );
}

#[test]
fn skip_pods_on_a_hop_from_talos_below_1_13_is_noted_for_those_machines_only() {
    let skip = "  drain:\n    skipPods:\n      matchLabels:\n        app: local-path\n";
    // pool a skips pods, w-1 starts on 1.12 (two hops: the first on the legacy RPC), w-2
    // already runs 1.13; pool b skips nothing
    let d = one(
        "v1.34.1",
        "",
        &[
            pool_doc("a", "worker", "w-1, w-2", "v1.14.6", skip),
            pool_doc("b", "worker", "w-3", "v1.14.6", ""),
        ],
    );
    let inv = observed(
        "v1.34.1",
        1,
        vec![
            w("w-1", "v1.12.11"),
            w("w-2", "v1.13.2"),
            w("w-3", "v1.12.11"),
        ],
    );
    let p = plan_ok(&d, &inv);
    let notes: Vec<String> = p.clusters[0]
        .notes
        .iter()
        .filter(|n| matches!(n, crate::plan::note::Note::SkipPodsLegacy { .. }))
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        notes,
        [
            "node pool `a`, hop 1/2 to v1.13.10: drain.skipPods (app=local-path) does not hold for machine `w-1`, which runs Talos < 1.13: the legacy MachineService.Upgrade drains the node itself before installing and evicts every pod a controller owns (DaemonSets aside), the skipped ones included; drain.waitForVolumeDetach does not cover them: the node reboots right after its own drain"
        ],
        "{:#?}",
        p.clusters[0].notes
    );
    // every machine already on 1.13: no note
    let on_1_13 = observed(
        "v1.34.1",
        1,
        vec![
            w("w-1", "v1.13.0"),
            w("w-2", "v1.13.2"),
            w("w-3", "v1.12.11"),
        ],
    );
    let p = plan_ok(&d, &on_1_13);
    assert!(
        p.clusters[0]
            .notes
            .iter()
            .all(|n| !matches!(n, crate::plan::note::Note::SkipPodsLegacy { .. })),
        "{:#?}",
        p.clusters[0].notes
    );
}

/// Issue 48, item 6: the legacy Upgrade's own drain ignores more of the pool's drain policy
/// than the skip list: it keeps no emptyDir data, and the node reboots right after it, so
/// medea's wait for volumes to detach does not cover the pods it evicts. The note names each
/// such setting the pool sets, and only those.
#[test]
fn the_skip_pods_note_names_the_other_drain_settings_the_legacy_drain_ignores() {
    let inv = observed(
        "v1.34.1",
        1,
        vec![w("w-1", "v1.12.11"), w("w-2", "v1.12.11")],
    );
    let note = |drain: &str| -> String {
        let d = one(
            "v1.34.1",
            "",
            &[pool_doc("a", "worker", "w-1, w-2", "v1.13.10", drain)],
        );
        let p = plan_ok(&d, &inv);
        let notes: Vec<String> = p.clusters[0]
            .notes
            .iter()
            .filter(|n| matches!(n, crate::plan::note::Note::SkipPodsLegacy { .. }))
            .map(ToString::to_string)
            .collect();
        assert_eq!(notes.len(), 1, "{:#?}", p.clusters[0].notes);
        notes[0].clone()
    };
    let skip = "  drain:\n    skipPods:\n      matchLabels:\n        app: local-path\n";
    let kept = note(&format!(
        "{skip}    deleteEmptyDirData: false\n    waitForVolumeDetach: false\n"
    ));
    assert!(
        kept.ends_with("the skipped ones included; drain.deleteEmptyDirData: false does not hold for them either (their emptyDir data is lost)"),
        "{kept}"
    );
    let waits = note(skip);
    assert!(
        waits.ends_with("the skipped ones included; drain.waitForVolumeDetach does not cover them: the node reboots right after its own drain"),
        "{waits}"
    );
    assert!(!waits.contains("deleteEmptyDirData"), "{waits}");
}

#[test]
fn talos_steps_stored_before_the_drain_policy_keep_what_was_approved() {
    let p = plan_ok(&two_worker_pools("", ""), &two_workers());
    let t = talos_steps(&p)[0].clone();
    let mut v = serde_json::to_value(&t).unwrap();
    let obj = v.as_object_mut().unwrap();
    obj.remove("drain");
    obj.remove("upgradeAttempts");
    let old: TalosRollout = serde_json::from_value(v).unwrap();
    assert_eq!(
        old.drain,
        DrainPolicy::legacy(),
        "emptyDir and bare pods refused"
    );
    assert_eq!(
        old.upgrade_attempts, 1,
        "the first definitive failure halts, as it did"
    );
}
