//! Waves sized by maxUnavailable and the order pools and hops run in.

use super::*;

// ---------------------------------------------------------------- waves

#[test]
fn waves_are_sized_by_max_unavailable() {
    let d = one("v1.34.1", "", &[worker_pool(6, 2)]);
    let p = plan_ok(&d, &observed("v1.34.1", 1, workers(6, "v1.12.4")));
    let s = talos_steps(&p);
    assert_eq!(
        wave_nodes(s[0]),
        [["w-1", "w-2"], ["w-3", "w-4"], ["w-5", "w-6"]]
    );
    let text = render::text(&p, Default::default());
    assert!(
        text.contains("~ pool workers: talos v1.12.4 → v1.13.9 (6 machines, 3 waves of 2)"),
        "{text}"
    );
}

#[test]
fn already_unavailable_machines_go_first_and_count() {
    let d = one("v1.34.1", "", &[worker_pool(6, 2)]);
    // w-5 is NotReady and needs the hop: it goes first, with one more.
    let mut ms = workers(6, "v1.12.4");
    ms[4].ready = false;
    let p = plan_ok(&d, &observed("v1.34.1", 1, ms));
    assert_eq!(
        wave_nodes(talos_steps(&p)[0]),
        [["w-5", "w-1"], ["w-2", "w-3"], ["w-4", "w-6"]]
    );
    // w-6 is cordoned and already on the target: it stays away, so waves of 1.
    let mut ms = workers(6, "v1.12.4");
    ms[5].talos_version = Some(t("v1.13.9"));
    ms[5].cordoned = true;
    let p = plan_ok(&d, &observed("v1.34.1", 1, ms));
    assert_eq!(
        wave_nodes(talos_steps(&p)[0]),
        [["w-1"], ["w-2"], ["w-3"], ["w-4"], ["w-5"]]
    );
    // Two away already and not in the hop: nothing may start.
    let mut ms = workers(6, "v1.12.4");
    for m in &mut ms[4..] {
        m.talos_version = Some(t("v1.13.9"));
        m.ready = false;
    }
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, ms)),
        codes::UNAVAILABLE,
    );
    assert_eq!(
        e.message,
        "node pool `workers` has 2 machines unavailable already (`w-5` (NotReady), `w-6` (NotReady)), and at most 2 may be away at once: Talos v1.13.9 cannot start"
    );
    // More away (in the hop) than the pool may have away: refused too.
    let mut ms = workers(6, "v1.12.4");
    for m in &mut ms[..3] {
        m.cordoned = true;
    }
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, ms)),
        codes::UNAVAILABLE,
    );
    assert!(
        e.message
            .starts_with("node pool `workers` has 3 machines unavailable already"),
        "{e}"
    );
}

#[test]
fn control_plane_waves_are_one_node_and_count_the_whole_control_plane() {
    let d = one(
        "v1.34.1",
        "  rollout:\n    maxUnavailable: 3\n",
        &[cp_pool("v1.13.9")],
    );
    let p = plan_ok(&d, &observed("v1.34.1", 1, three_cps("v1.12.4")));
    assert_eq!(
        wave_nodes(talos_steps(&p)[0]),
        [["cp-1"], ["cp-2"], ["cp-3"]]
    );
    // An unmanaged control-plane node is NotReady: no control-plane node may go.
    let mut ms = three_cps("v1.12.4");
    let mut extra = cp("cp-4", "v1.13.9");
    extra.ready = false;
    ms.push(extra);
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, ms)),
        codes::UNAVAILABLE,
    );
    assert_eq!(
        e.message,
        "cluster `c1` has control-plane 1 machine unavailable already (`cp-4` (NotReady)), and at most 1 may be away at once: Talos v1.13.9 cannot start"
    );
}

// ---------------------------------------------------------------- ordering

#[test]
fn pools_run_in_after_order_control_plane_first() {
    let d = one(
        "v1.34.1",
        "",
        &[
            pool_doc(
                "a-workers",
                "worker",
                "w-1",
                "v1.13.9",
                "  after: [d-canary]\n",
            ),
            pool_doc("b-workers", "worker", "w-2", "v1.13.9", ""),
            pool_doc("d-canary", "worker", "w-3", "v1.13.9", ""),
            pool_doc("z-cp", "controlplane", "cp-1", "v1.13.9", ""),
        ],
    );
    let c = &d.clusters["c1"];
    assert_eq!(
        pool_order(c),
        ["z-cp", "b-workers", "d-canary", "a-workers"]
    );
    let p = plan_ok(
        &d,
        &observed(
            "v1.34.1",
            1,
            vec![
                cp("cp-1", "v1.12.4"),
                w("w-1", "v1.12.4"),
                w("w-2", "v1.12.4"),
                w("w-3", "v1.12.4"),
            ],
        ),
    );
    let pools: Vec<&str> = talos_steps(&p).iter().map(|s| s.pool.as_str()).collect();
    assert_eq!(pools, ["z-cp", "b-workers", "d-canary", "a-workers"]);
}

#[test]
fn every_hop_of_a_pool_runs_before_the_next_pool() {
    let d = one(
        "v1.34.1",
        "",
        &[
            pool_doc("cp", "controlplane", "cp-1", "v1.13.9", ""),
            pool_doc("w", "worker", "w-1", "v1.13.9", ""),
        ],
    );
    let p = plan_ok(
        &d,
        &observed(
            "v1.34.1",
            1,
            vec![cp("cp-1", "v1.11.5"), w("w-1", "v1.11.5")],
        ),
    );
    let order: Vec<(&str, u32)> = talos_steps(&p)
        .iter()
        .map(|s| (s.pool.as_str(), s.hop))
        .collect();
    assert_eq!(order, [("cp", 1), ("cp", 2), ("w", 1), ("w", 2)]);
}
