//! Hop expansion: minors through the latest patch, prereleases, catalog overrides.

use super::*;

// ---------------------------------------------------------------- hops

#[test]
fn two_minors_become_two_hops_through_the_latest_patch() {
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let p = plan_ok(&d, &observed("v1.34.1", 1, three_cps("v1.11.5")));
    let steps = talos_steps(&p);
    assert_eq!(steps.len(), 2);
    assert_eq!(
        (steps[0].hop, steps[0].hops, &steps[0].to),
        (1, 2, &t("v1.12.12"))
    );
    assert_eq!(
        (steps[1].hop, steps[1].hops, &steps[1].to),
        (2, 2, &t("v1.13.9"))
    );
    assert!(
        steps[0]
            .waves
            .iter()
            .flatten()
            .all(|m| m.from == t("v1.11.5"))
    );
    assert!(
        steps[1]
            .waves
            .iter()
            .flatten()
            .all(|m| m.from == t("v1.12.12"))
    );
    assert_eq!(steps[1].image, "ghcr.io/siderolabs/installer:v1.13.9");
    let text = render::text(&p, Default::default());
    assert!(
        text.contains("~ pool cp: talos v1.11.5 → v1.13.9 (3 machines, 2 hops)"),
        "{text}"
    );
    assert!(
        text.contains("hop 1/2: v1.11.5 → v1.12.12 (3 machines, 3 waves of 1)"),
        "{text}"
    );
}

#[test]
fn mixed_versions_join_the_hops_they_need() {
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a, b, c", "v1.13.9", "")],
    );
    let p = plan_ok(
        &d,
        &observed(
            "v1.34.1",
            1,
            vec![w("a", "v1.11.5"), w("b", "v1.12.3"), w("c", "v1.13.9")],
        ),
    );
    let steps = talos_steps(&p);
    assert_eq!(steps.len(), 2);
    assert_eq!(wave_nodes(steps[0]), [["a"]]);
    assert_eq!(wave_nodes(steps[1]), [["a"], ["b"]]);
    let froms: Vec<&TalosVersion> = steps[1].waves.iter().flatten().map(|m| &m.from).collect();
    assert_eq!(froms, [&t("v1.12.12"), &t("v1.12.3")]);
}

#[test]
fn a_prerelease_target_is_one_hop_and_never_a_stop() {
    let d = one("v1.34.1", "", &[cp_pool("v1.15.0-beta.0")]);
    let p = plan_ok(&d, &observed("v1.34.1", 1, three_cps("v1.14.6")));
    assert_eq!(talos_steps(&p)[0].to, t("v1.15.0-beta.0"));
    // Through 1.15 to 1.16: no stable 1.15 to stop at.
    let d = one(
        "v1.34.1",
        "  upgradePolicy:\n    kubernetesSupport:\n      - { talos: v1.16, minKubernetes: v1.34, maxKubernetes: v1.39 }\n",
        &[cp_pool("v1.16.0")],
    );
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, three_cps("v1.14.6"))),
        codes::TALOS_PATH,
    );
    assert!(
        e.message.starts_with("no stable Talos 1.15 release is known to stop at on the way from what `cp-1` (v1.14.6), `cp-2` (v1.14.6), `cp-3` (v1.14.6) run to v1.16.0"),
        "{e}"
    );
    assert!(e.help.unwrap().contains("upgradePolicy.talosReleases"));
}

#[test]
fn the_catalog_override_adds_releases_and_windows() {
    let d = one(
        "v1.34.1",
        "  upgradePolicy:\n    talosReleases: [v1.15.2]\n    kubernetesSupport:\n      - { talos: v1.16, minKubernetes: v1.34, maxKubernetes: v1.39 }\n",
        &[cp_pool("v1.16.0")],
    );
    let p = plan_ok(&d, &observed("v1.34.1", 1, three_cps("v1.14.6")));
    let tos: Vec<&TalosVersion> = talos_steps(&p).iter().map(|s| &s.to).collect();
    assert_eq!(tos, [&t("v1.15.2"), &t("v1.16.0")]);
    assert!(p.catalog.ends_with("+overrides"), "{}", p.catalog);
}

/// The executor's pre-check asks the plan's Kubernetes step which Talos minors support the
/// target, so a window extended by `upgradePolicy.kubernetesSupport` holds at execution too
/// (the executor used to apply a built-in formula of its own and halted such plans).
#[test]
fn the_kubernetes_step_carries_the_catalogs_support_rule_to_the_executor() {
    let kube_step = |p: &Plan| -> KubeRollout {
        p.clusters[0]
            .steps
            .iter()
            .find_map(|s| match s {
                Step::Kubernetes(k) => Some(k.clone()),
                _ => None,
            })
            .expect("a Kubernetes step")
    };
    // Built in, Talos 1.12 supports up to Kubernetes 1.35 and 1.13 supports 1.36.
    let d = one("v1.36.1", "", &[cp_pool("v1.13.9")]);
    let k_step = kube_step(&plan_ok(&d, &observed("v1.35.0", 1, three_cps("v1.13.9"))));
    assert_eq!(
        k_step.supported_talos,
        Some(vec![(1, 13), (1, 14), (1, 15)])
    );
    assert!(k_step.talos_supports_target(&t("v1.13.9")));
    assert!(!k_step.talos_supports_target(&t("v1.12.11")));
    // Extended: Talos 1.12 runs Kubernetes 1.36 too.
    let d = one(
        "v1.36.1",
        "  upgradePolicy:\n    kubernetesSupport:\n      - { talos: v1.12, minKubernetes: v1.30, maxKubernetes: v1.36 }\n",
        &[cp_pool("v1.12.11")],
    );
    let k_step = kube_step(&plan_ok(&d, &observed("v1.35.0", 1, three_cps("v1.12.11"))));
    assert_eq!(
        k_step.supported_talos,
        Some(vec![(1, 12), (1, 13), (1, 14), (1, 15)])
    );
    assert!(k_step.talos_supports_target(&t("v1.12.11")));
    let json = serde_json::to_value(&k_step).unwrap();
    assert_eq!(
        json["supportedTalos"],
        serde_json::json!(["v1.12", "v1.13", "v1.14", "v1.15"])
    );
    let back: KubeRollout = serde_json::from_value(json).unwrap();
    assert_eq!(back, k_step);
}

#[test]
fn an_unknown_talos_minor_asks_for_a_support_window() {
    let d = one(
        "v1.34.1",
        "  upgradePolicy:\n    talosReleases: [v1.15.2]\n",
        &[cp_pool("v1.16.0")],
    );
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, three_cps("v1.14.6"))),
        codes::CATALOG,
    );
    assert!(
        e.message
            .contains("Talos 1.16 is not in medea's compatibility catalog"),
        "{e}"
    );
    assert!(e.help.unwrap().contains("kubernetesSupport"));
}
