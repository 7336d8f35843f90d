//! Every refusal rule with its message: downgrades, skew, roles, selectors, installers.

use super::*;

// ---------------------------------------------------------------- refusals

#[test]
fn downgrades_are_refused_unless_allowed() {
    let d = one("v1.34.1", "", &[cp_pool("v1.12.4")]);
    let i = observed("v1.34.1", 1, three_cps("v1.13.9"));
    let e = only(&plan_err(&d, &i), codes::DOWNGRADE);
    assert_eq!(
        e.message,
        "downgrade refused: node pool `cp` asks for Talos v1.12.4, older than what `cp-1` (v1.13.9), `cp-2` (v1.13.9), `cp-3` (v1.13.9) run"
    );
    assert_eq!(e.origin.file, "pools.yaml");
    assert!(
        e.help
            .unwrap()
            .contains("upgradePolicy.allowDowngrade: true")
    );

    let d = one(
        "v1.34.1",
        "  upgradePolicy:\n    allowDowngrade: true\n",
        &[cp_pool("v1.12.4")],
    );
    let p = plan_ok(&d, &i);
    assert_eq!(talos_steps(&p)[0].to, t("v1.12.4"));
}

#[test]
fn kubernetes_moves_at_most_one_minor() {
    let d = one("v1.36.0", "", &[cp_pool("v1.13.9")]);
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, three_cps("v1.13.9"))),
        codes::KUBERNETES_SKEW,
    );
    assert_eq!(
        e.message,
        "Kubernetes moves at most one minor per rollout: v1.34.1 → v1.36.0 skips 1.35"
    );
    assert_eq!(e.origin.file, "c1.yaml");
    assert_eq!(e.origin.line, 7, "points at kubernetes.version");
}

#[test]
fn kubernetes_is_never_moved_backwards() {
    let d = one(
        "v1.34.0",
        "  upgradePolicy:\n    allowDowngrade: true\n",
        &[cp_pool("v1.13.9")],
    );
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, three_cps("v1.13.9"))),
        codes::KUBERNETES_DOWNGRADE,
    );
    assert_eq!(
        e.message,
        "Kubernetes downgrade refused: cluster `c1` runs v1.34.1, newer than v1.34.0"
    );
}

#[test]
fn target_kubernetes_must_be_supported_by_the_talos_every_node_will_run() {
    // Talos 1.12 supports Kubernetes up to 1.35.
    let d = one("v1.36.0", "", &[cp_pool("v1.12.11")]);
    let e = only(
        &plan_err(&d, &observed("v1.35.2", 1, three_cps("v1.12.11"))),
        codes::KUBERNETES_UNSUPPORTED,
    );
    assert_eq!(
        e.message,
        "Kubernetes v1.36.0 is not supported by Talos v1.12.11, which machines `cp-1`, `cp-2`, `cp-3` would run when the Kubernetes rollout starts"
    );
    assert!(
        e.help
            .unwrap()
            .starts_with("Talos 1.12 supports Kubernetes 1.30 to 1.35"),
    );
}

#[test]
fn a_talos_hop_must_support_the_kubernetes_running_then() {
    // Talos 1.13 needs Kubernetes 1.31 or newer.
    let d = one("v1.30.4", "", &[cp_pool("v1.13.9")]);
    let e = only(
        &plan_err(&d, &observed("v1.30.4", 1, three_cps("v1.12.11"))),
        codes::KUBERNETES_UNSUPPORTED,
    );
    assert_eq!(
        e.message,
        "Talos v1.13.9 (hop 1/1 of node pool `cp`) does not support Kubernetes v1.30.4, which cluster `c1` runs at that point"
    );
    assert_eq!(e.origin.file, "pools.yaml", "points at talos.version");
    assert!(
        e.help
            .unwrap()
            .contains("roll Kubernetes into that range first")
    );
}

#[test]
fn kubernetes_goes_first_when_the_new_talos_needs_it() {
    // Talos 1.13 needs Kubernetes ≥ 1.31; Talos 1.12 runs both 1.30 and 1.31.
    let d = one("v1.31.0", "", &[cp_pool("v1.13.9")]);
    let p = plan_ok(&d, &observed("v1.30.4", 1, three_cps("v1.12.11")));
    let kinds: Vec<&str> = p.clusters[0]
        .steps
        .iter()
        .map(|s| match s {
            Step::Talos(_) => "talos",
            Step::Kubernetes(_) => "kubernetes",
        })
        .collect();
    assert_eq!(kinds, ["kubernetes", "talos"]);
}

#[test]
fn talos_goes_first_when_the_new_kubernetes_needs_it() {
    // Kubernetes 1.35 needs Talos ≥ 1.12; Talos 1.12 still runs 1.34.
    let d = one("v1.35.0", "", &[cp_pool("v1.12.11")]);
    let p = plan_ok(&d, &observed("v1.34.1", 1, three_cps("v1.11.5")));
    assert!(matches!(p.clusters[0].steps[0], Step::Talos(_)));
    assert!(matches!(
        &p.clusters[0].steps[1],
        Step::Kubernetes(k8s) if k8s.from == k("v1.34.1") && k8s.to == k("v1.35.0")
            && k8s.control_plane == ["cp-1", "cp-2", "cp-3"]
    ));
    // Both would work: Talos first.
    let d = one("v1.35.0", "", &[cp_pool("v1.13.9")]);
    let p = plan_ok(&d, &observed("v1.34.1", 1, three_cps("v1.12.11")));
    assert!(matches!(p.clusters[0].steps[0], Step::Talos(_)));
    assert!(matches!(p.clusters[0].steps[1], Step::Kubernetes(_)));
}

#[test]
fn kubelet_must_not_end_newer_than_the_apiserver() {
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let mut ms = three_cps("v1.13.9");
    ms[1].kubelet_version = Some(k("v1.35.0"));
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, ms)),
        codes::KUBELET_SKEW,
    );
    assert_eq!(
        e.message,
        "machine `cp-2` runs kubelet v1.35.0, newer than the kube-apiserver v1.34.1 this plan ends with"
    );
    assert!(
        e.help
            .unwrap()
            .contains("set the version to v1.35.0 or newer")
    );
}

#[test]
fn kubelets_more_than_three_minors_behind_are_refused() {
    let d = one("v1.35.0", "", &[cp_pool("v1.13.9")]);
    let mut ms = three_cps("v1.13.9");
    ms[0].kubelet_version = Some(k("v1.31.4"));
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, ms)),
        codes::KUBELET_SKEW,
    );
    assert_eq!(
        e.message,
        "machine `cp-1` runs kubelet v1.31.4, more than three minors older than Kubernetes v1.35.0"
    );
}

#[test]
fn a_listed_machine_must_be_observed() {
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a, ghost", "v1.13.9", "")],
    );
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![w("a", "v1.13.9")])),
        codes::UNKNOWN_MACHINE,
    );
    assert_eq!(
        e.message,
        "machine `ghost` of node pool `w` is not in the observed inventory of cluster `c1`"
    );
    assert_eq!(e.origin.line, 9, "points at the machines entry");
    assert!(e.help.unwrap().contains("observed machines: a"));
}

#[test]
fn roles_must_match() {
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "cp-1", "v1.13.9", "")],
    );
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![cp("cp-1", "v1.13.9")])),
        codes::ROLE_MISMATCH,
    );
    assert_eq!(
        e.message,
        "machine `cp-1` is a control-plane node, but node pool `w` has role worker"
    );
}

#[test]
fn a_machine_claimed_by_two_selectors_is_refused() {
    let sel = "  selector:\n    matchLabels:\n      tier: app\n";
    let d = one(
        "v1.34.1",
        "",
        &[
            pool_doc("a", "worker", "", "v1.13.9", sel),
            pool_doc("b", "worker", "", "v1.13.9", sel),
        ],
    );
    let mut m = w("x", "v1.13.9");
    m.labels.insert("tier".into(), "app".into());
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![m.clone()])),
        codes::MACHINE_TWICE,
    );
    assert_eq!(
        e.message,
        "machine `x` matches the selector of node pool `a` and also the selector of node pool `b`"
    );
    // Listed in one pool and matched by another's selector: the same rule.
    let d = one(
        "v1.34.1",
        "",
        &[
            pool_doc("a", "worker", "x", "v1.13.9", ""),
            pool_doc("b", "worker", "", "v1.13.9", sel),
        ],
    );
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![m])),
        codes::MACHINE_TWICE,
    );
    assert_eq!(
        e.message,
        "machine `x` is listed in node pool `a` and also matches the selector of node pool `b`"
    );
}

#[test]
fn dropping_a_factory_schematic_is_refused() {
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a", "v1.13.9", "")],
    );
    let mut m = w("a", "v1.12.4");
    m.installer_image = Some(format!("{FACTORY}/{SCHEMATIC}:v1.12.4"));
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![m.clone()])),
        codes::SCHEMATIC_DROPPED,
    );
    assert_eq!(
        e.message,
        "installer image `ghcr.io/siderolabs/installer` would drop Image Factory schematic ce4c980550dd that machine `a` runs"
    );
    // the node's platform names its factory installer
    assert!(
        e.help
            .unwrap()
            .contains(&format!("factory.talos.dev/metal-installer/{SCHEMATIC}")),
    );

    // Keeping it is fine, and the empty schematic may be dropped (it carries nothing).
    let keep = format!("    installerImage: {FACTORY}/{SCHEMATIC}\n");
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a", "v1.13.9", &keep)],
    );
    let p = plan_ok(&d, &observed("v1.34.1", 1, vec![m.clone()]));
    assert_eq!(
        talos_steps(&p)[0].image,
        format!("{FACTORY}/{SCHEMATIC}:v1.13.9")
    );
    m.installer_image = Some(format!("{FACTORY}/{EMPTY}:v1.12.4"));
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a", "v1.13.9", "")],
    );
    assert_eq!(
        talos_steps(&plan_ok(&d, &observed("v1.34.1", 1, vec![m]))).len(),
        1
    );
}

#[test]
fn a_pool_without_an_installer_gets_each_nodes_factory_installer_from_talos_1_14() {
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a, b, c", "v1.14.6", "")],
    );
    let mut a = w("a", "v1.13.10");
    a.schematic = Some(SCHEMATIC.into());
    a.extensions = [("iscsi-tools".to_string(), "v0.1.6".to_string())].into();
    let b = w("b", "v1.13.10");
    let mut c = w("c", "v1.13.10");
    c.platform = Some("aws".into());
    let p = plan_ok(&d, &observed("v1.34.1", 1, vec![a, b, c]));
    let s = talos_steps(&p);
    assert_eq!(s.len(), 1);
    let images: Vec<(&str, &str)> = s[0]
        .waves
        .iter()
        .flatten()
        .map(|m| (m.node.as_str(), s[0].image_for(m)))
        .collect();
    let metal = |id: &str| format!("factory.talos.dev/metal-installer/{id}:v1.14.6");
    assert_eq!(
        images,
        [
            ("a", metal(SCHEMATIC).as_str()),
            ("b", metal(EMPTY).as_str()),
            (
                "c",
                format!("factory.talos.dev/aws-installer/{EMPTY}:v1.14.6").as_str()
            ),
        ]
    );
    assert_eq!(
        s[0].image,
        metal(SCHEMATIC),
        "the first machine's is the step's"
    );
    let text = render::text(&p, Default::default());
    for line in [
        format!("      image {}: a\n", metal(SCHEMATIC)),
        format!("      image {}: b\n", metal(EMPTY)),
        format!("      image factory.talos.dev/aws-installer/{EMPTY}:v1.14.6: c\n"),
    ] {
        assert!(text.contains(&line), "{line}{text}");
    }

    // machines that share one installer: one line, no per-machine images
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "b, c", "v1.14.6", "")],
    );
    let p = plan_ok(
        &d,
        &observed("v1.34.1", 1, vec![w("b", "v1.13.10"), w("c", "v1.13.2")]),
    );
    let s = talos_steps(&p);
    assert!(s[0].waves.iter().flatten().all(|m| m.image.is_none()));
    assert!(
        render::text(&p, Default::default()).contains(&format!("      image {}\n", metal(EMPTY)))
    );

    // below 1.14 the default installer still exists: a hop to 1.13 uses it
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "b", "v1.14.6", "")],
    );
    let p = plan_ok(&d, &observed("v1.34.1", 1, vec![w("b", "v1.12.11")]));
    let images: Vec<&str> = talos_steps(&p).iter().map(|s| s.image.as_str()).collect();
    assert_eq!(
        images,
        [
            "ghcr.io/siderolabs/installer:v1.13.10",
            metal(EMPTY).as_str()
        ]
    );

    // a named installer is used as written
    let named = format!("    installerImage: {FACTORY}/{SCHEMATIC}\n");
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "b", "v1.14.6", &named)],
    );
    let p = plan_ok(&d, &observed("v1.34.1", 1, vec![w("b", "v1.13.10")]));
    assert_eq!(
        talos_steps(&p)[0].image,
        format!("{FACTORY}/{SCHEMATIC}:v1.14.6")
    );
}

#[test]
fn an_installer_without_the_nodes_extensions_is_refused_naming_them() {
    let mut a = w("a", "v1.13.10");
    a.schematic = Some(SCHEMATIC.into());
    a.extensions = [
        ("iscsi-tools".to_string(), "v0.1.6".to_string()),
        ("util-linux-tools".to_string(), "2.40.2".to_string()),
    ]
    .into();
    // a pool that names the schematic-less installer
    let ghcr = "    installerImage: ghcr.io/siderolabs/installer\n";
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a", "v1.14.6", ghcr)],
    );
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![a.clone()])),
        codes::SCHEMATIC_DROPPED,
    );
    assert_eq!(
        e.message,
        "installer image `ghcr.io/siderolabs/installer` would drop Image Factory schematic ce4c980550dd that machine `a` runs, and with it its system extensions iscsi-tools v0.1.6, util-linux-tools 2.40.2"
    );
    // a pool without an installer whose path has a hop below 1.14 (the default installer)
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a", "v1.14.6", "")],
    );
    let mut old = a.clone();
    old.talos_version = Some(t("v1.12.11"));
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![old])),
        codes::SCHEMATIC_DROPPED,
    );
    assert!(e.message.contains("iscsi-tools v0.1.6"), "{e:?}");
    // extensions without a known schematic (a custom installer) are refused too
    let mut custom = a.clone();
    custom.schematic = None;
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a", "v1.14.6", ghcr)],
    );
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![custom])),
        codes::SCHEMATIC_DROPPED,
    );
    assert!(
        e.message
            == "installer image `ghcr.io/siderolabs/installer` would drop the system extensions that machine `a` runs: iscsi-tools v0.1.6, util-linux-tools 2.40.2",
        "{e:?}"
    );
    // the pool without an installer keeps them from 1.14 on: planned
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a", "v1.14.6", "")],
    );
    let p = plan_ok(&d, &observed("v1.34.1", 1, vec![a.clone()]));
    assert_eq!(
        talos_steps(&p)[0].image,
        format!("factory.talos.dev/metal-installer/{SCHEMATIC}:v1.14.6")
    );
    // but not without the node's platform
    let mut unknown = a;
    unknown.platform = None;
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![unknown])),
        codes::UNOBSERVED,
    );
    assert!(
        e.message.contains("the platform of machine `a` is unknown"),
        "{e:?}"
    );
}

#[test]
fn a_pool_naming_ghcr_for_a_hop_to_talos_1_14_is_refused_naming_each_nodes_factory_installer() {
    // what `medea seed` wrote for clusters built with talosctl <= 1.13 (issue #48 item 1a)
    let ghcr = "    installerImage: ghcr.io/siderolabs/installer\n";
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a, b, c, d", "v1.14.6", ghcr)],
    );
    let mut a = w("a", "v1.13.10");
    a.schematic = Some(SCHEMATIC.into());
    let b = w("b", "v1.13.10");
    let mut c = w("c", "v1.12.11");
    c.secure_boot = Some(true);
    let mut d_ = w("d", "v1.13.10");
    d_.factory_host = Some("factory.example.org".into());
    let diags = plan_err(&d, &observed("v1.34.1", 1, vec![a.clone(), b, c, d_]));
    let e = only(&diags, codes::INSTALLER_UNPUBLISHED);
    assert_eq!(
        e.message,
        "installer image `ghcr.io/siderolabs/installer` is not published for Talos 1.14 and later, and node pool `w` takes machines to Talos v1.14.6 with it: every pull would fail"
    );
    assert_eq!(
        (e.origin.file.as_str(), e.origin.line),
        ("pools.yaml", 12),
        "points at talos.installerImage"
    );
    let help = e.help.unwrap();
    for own in [
        format!("`factory.talos.dev/metal-installer/{SCHEMATIC}` for a"),
        format!("`factory.talos.dev/metal-installer/{EMPTY}` for b"),
        format!("`factory.talos.dev/metal-installer-secureboot/{EMPTY}` for c"),
        format!("`factory.example.org/metal-installer/{EMPTY}` for d"),
    ] {
        assert!(help.contains(&own), "{own}: {help}");
    }
    // the schematic finding is reported with it, not instead of it
    assert!(
        diags.iter().any(|d| d.code == codes::SCHEMATIC_DROPPED),
        "{diags:#?}"
    );

    // the same pool to Talos 1.13 is fine: ghcr publishes it
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "b", "v1.13.10", ghcr)],
    );
    let p = plan_ok(&d, &observed("v1.34.1", 1, vec![w("b", "v1.12.11")]));
    assert_eq!(
        talos_steps(&p)[0].image,
        "ghcr.io/siderolabs/installer:v1.13.10"
    );
}

#[test]
fn a_secure_boot_node_gets_the_secure_boot_installer_of_its_own_factory() {
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a, b, c", "v1.14.6", "")],
    );
    let mut a = w("a", "v1.13.10");
    a.secure_boot = Some(true);
    a.schematic = Some(SCHEMATIC.into());
    let mut b = w("b", "v1.13.10");
    b.factory_host = Some("factory.example.org:5000".into());
    let mut c = w("c", "v1.13.10");
    c.secure_boot = Some(true);
    c.platform = Some("aws".into());
    c.factory_host = Some("omni.example.org".into());
    let p = plan_ok(&d, &observed("v1.34.1", 1, vec![a, b, c]));
    let s = talos_steps(&p);
    let images: Vec<(&str, &str)> = s[0]
        .waves
        .iter()
        .flatten()
        .map(|m| (m.node.as_str(), s[0].image_for(m)))
        .collect();
    assert_eq!(
        images,
        [
            (
                "a",
                format!("factory.talos.dev/metal-installer-secureboot/{SCHEMATIC}:v1.14.6")
                    .as_str()
            ),
            (
                "b",
                format!("factory.example.org:5000/metal-installer/{EMPTY}:v1.14.6").as_str()
            ),
            (
                "c",
                format!("omni.example.org/aws-installer-secureboot/{EMPTY}:v1.14.6").as_str()
            ),
        ]
    );
    // the plan shows them per machine
    let text = render::text(&p, Default::default());
    assert!(
        text.contains(&format!(
            "      image factory.talos.dev/metal-installer-secureboot/{SCHEMATIC}:v1.14.6: a\n"
        )),
        "{text}"
    );

    // SecureBoot unknown: medea does not guess (a wrong guess leaves the node unbootable)
    let mut unknown = w("a", "v1.13.10");
    unknown.secure_boot = None;
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a", "v1.14.6", "")],
    );
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![unknown])),
        codes::UNOBSERVED,
    );
    assert!(
        e.message
            .contains("whether it booted with SecureBoot of machine `a` is unknown"),
        "{e:?}"
    );
}

#[test]
fn an_installer_of_the_other_secure_boot_kind_is_refused() {
    let mut sb = w("a", "v1.13.10");
    sb.secure_boot = Some(true);
    sb.schematic = Some(SCHEMATIC.into());
    // a SecureBoot node and a named non-SecureBoot installer
    let plain = format!("    installerImage: factory.talos.dev/metal-installer/{SCHEMATIC}\n");
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a", "v1.14.6", &plain)],
    );
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![sb.clone()])),
        codes::SECURE_BOOT,
    );
    assert_eq!(
        e.message,
        format!(
            "machine `a` booted with SecureBoot, and installer image `factory.talos.dev/metal-installer/{SCHEMATIC}` is not a SecureBoot installer: a SecureBoot system cannot be upgraded with a non-SecureBoot installer (talos#9245)"
        )
    );
    assert_eq!(e.origin.line, 12, "points at talos.installerImage");
    assert!(e.help.unwrap().contains(&format!(
        "factory.talos.dev/metal-installer-secureboot/{SCHEMATIC}"
    )));
    // its own SecureBoot installer is fine
    let secure =
        format!("    installerImage: factory.talos.dev/metal-installer-secureboot/{SCHEMATIC}\n");
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a", "v1.14.6", &secure)],
    );
    assert_eq!(
        talos_steps(&plan_ok(&d, &observed("v1.34.1", 1, vec![sb.clone()])))[0].image,
        format!("factory.talos.dev/metal-installer-secureboot/{SCHEMATIC}:v1.14.6")
    );
    // and vice versa: a non-SecureBoot node and a SecureBoot installer
    let mut plain_node = sb.clone();
    plain_node.secure_boot = Some(false);
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![plain_node])),
        codes::SECURE_BOOT,
    );
    assert!(
        e.message
            .contains("machine `a` did not boot with SecureBoot"),
        "{e:?}"
    );
    // a pool without an installer whose path has a hop below 1.14 (the non-SecureBoot default)
    let mut old = sb;
    old.talos_version = Some(t("v1.12.11"));
    old.schematic = None;
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a", "v1.14.6", "")],
    );
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![old])),
        codes::SECURE_BOOT,
    );
    assert!(
        e.message
            .contains("the default installer `ghcr.io/siderolabs/installer`"),
        "{e:?}"
    );
}

#[test]
fn extensions_without_a_schematic_are_refused_on_the_factory_path_too() {
    // a node whose extensions came from a custom installer: no schematic is known, and its
    // factory installer (the empty schematic) would strip them
    let mut a = w("a", "v1.13.10");
    a.extensions = [("iscsi-tools".to_string(), "v0.1.6".to_string())].into();
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a", "v1.14.6", "")],
    );
    let e = only(
        &plan_err(&d, &observed("v1.34.1", 1, vec![a])),
        codes::SCHEMATIC_DROPPED,
    );
    assert_eq!(
        e.message,
        format!(
            "its own Image Factory installer `factory.talos.dev/metal-installer/{EMPTY}`, without a schematic, would drop the system extension that machine `a` runs: iscsi-tools v0.1.6"
        )
    );
}

#[test]
fn a_new_schematic_at_the_same_version_is_a_reinstall() {
    let img = format!("    installerImage: {FACTORY}/{SCHEMATIC}\n");
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a", "v1.13.9", &img)],
    );
    let p = plan_ok(&d, &observed("v1.34.1", 1, vec![w("a", "v1.13.9")]));
    let s = talos_steps(&p);
    assert_eq!(s.len(), 1);
    assert_eq!(
        (&s[0].to, &s[0].waves[0][0].from),
        (&t("v1.13.9"), &t("v1.13.9"))
    );
}

#[test]
fn machines_nobody_can_see_are_not_planned() {
    let d = one(
        "v1.34.1",
        "",
        &[pool_doc("w", "worker", "a, b", "v1.13.9", "")],
    );
    let mut b = w("b", "v1.12.4");
    b.talos_version = None;
    b.reachable = false;
    let e = only(
        &plan_err(
            &d,
            &observed("v1.34.1", 1, vec![w("a", "v1.13.9"), b.clone()]),
        ),
        codes::UNOBSERVED,
    );
    assert_eq!(
        e.message,
        "the running Talos version of machine `b` is unknown (its Talos API did not answer at the last refresh)"
    );
    // Known (stale) version but unreachable, and it needs the hop.
    b.talos_version = Some(t("v1.12.4"));
    let e = only(
        &plan_err(
            &d,
            &observed("v1.34.1", 1, vec![w("a", "v1.13.9"), b.clone()]),
        ),
        codes::UNOBSERVED,
    );
    assert_eq!(
        e.message,
        "machine `b` needs Talos v1.13.9 but its Talos API did not answer at the last refresh"
    );
    // Unreachable but already on the target: counted as away, nothing to do.
    b.talos_version = Some(t("v1.13.9"));
    let p = plan_ok(&d, &observed("v1.34.1", 1, vec![w("a", "v1.13.9"), b]));
    assert!(
        !p.clusters[0]
            .steps
            .iter()
            .any(|s| matches!(s, Step::Talos(_)))
    );
}

#[test]
fn an_unknown_kubernetes_version_is_not_planned() {
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let mut i = observed("v1.34.1", 1, three_cps("v1.13.9"));
    std::sync::Arc::make_mut(i.clusters.get_mut("c1").unwrap()).kubernetes_version = None;
    let e = only(&plan_err(&d, &i), codes::UNOBSERVED);
    assert!(
        e.message
            .contains("the Kubernetes version of cluster `c1` is unknown"),
        "{e}"
    );
}
