//! Planner tests: hop expansion, every refusal rule with its message, waves, ordering,
//! settings, approvals, staleness, and properties (determinism, wave invariants).

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::applied::{AppliedResource, LastApplied, ResourceKey};
use super::compute::{PlanMemo, RESOURCE_FIELD, codes, pool_order};
use super::model::*;
use super::render;
use super::stored::approval_writes;
use super::{PlanInputs, basis_of, compute, compute_memo};
use crate::desired::model::DrainPolicy;
use crate::desired::source::{Snapshot, SourceFile};
use crate::desired::{Desired, Diagnostic, parse_snapshot};
use crate::inventory::{Inventory, Machine, MachineRole, ObservedCluster};
use crate::store::Op;
use crate::version::{KubeVersion, TalosVersion};

const FACTORY: &str = "factory.talos.dev/installer";
const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
const EMPTY: &str = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

fn t(s: &str) -> TalosVersion {
    TalosVersion::parse(s).unwrap()
}
fn k(s: &str) -> KubeVersion {
    KubeVersion::parse(s).unwrap()
}

pub(crate) fn load(files: &[(&str, String)]) -> Desired {
    let snap = Snapshot {
        files: files
            .iter()
            .map(|(p, text)| SourceFile {
                path: p.to_string(),
                bytes: text.as_bytes().to_vec().into(),
            })
            .collect(),
        markers: Vec::new(),
        commit: None,
        refused: Vec::new(),
    };
    let loaded = parse_snapshot(snap);
    assert!(!loaded.has_errors(), "{:#?}", loaded.diagnostics);
    loaded.desired
}

pub(crate) fn cluster_doc(name: &str, kube: &str, extra: &str) -> String {
    format!(
        "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  kubernetes:\n    version: {kube}\n{extra}"
    )
}

pub(crate) fn pool_doc(name: &str, role: &str, machines: &str, talos: &str, extra: &str) -> String {
    format!(
        "---\napiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: {name}\nspec:\n  cluster: c1\n  role: {role}\n  machines: [{machines}]\n  talos:\n    version: {talos}\n{extra}"
    )
}

/// One cluster `c1`: a cluster document plus pool documents in `pools.yaml`.
pub(crate) fn one(kube: &str, cluster_extra: &str, pools: &[String]) -> Desired {
    load(&[
        ("c1.yaml", cluster_doc("c1", kube, cluster_extra)),
        ("pools.yaml", pools.concat()),
    ])
}

fn machine(node: &str, role: MachineRole, talos: &str, kubelet: &str) -> Machine {
    Machine {
        node: node.into(),
        id: format!("id-{node}"),
        address: format!("10.0.0.{}", node.len()),
        role,
        talos_version: Some(t(talos)),
        installer_image: Some(format!("ghcr.io/siderolabs/installer:{talos}")),
        schematic: None,
        platform: Some("metal".into()),
        secure_boot: Some(false),
        factory_host: None,
        extensions: BTreeMap::new(),
        kubelet_version: Some(k(kubelet)),
        ready: true,
        cordoned: false,
        reachable: true,
        boot_id: None,
        labels: BTreeMap::new(),
    }
}

/// A control-plane machine; its kubelet runs the cluster's Kubernetes (see [`observed`]).
pub(crate) fn cp(node: &str, talos: &str) -> Machine {
    Machine {
        kubelet_version: None,
        ..machine(node, MachineRole::Controlplane, talos, "v1.34.1")
    }
}
pub(crate) fn w(node: &str, talos: &str) -> Machine {
    Machine {
        kubelet_version: None,
        ..machine(node, MachineRole::Worker, talos, "v1.34.1")
    }
}

/// Cluster `c1` running `kube`; machines without a kubelet version get `kube`.
pub(crate) fn observed(kube: &str, gen_: u64, machines: Vec<Machine>) -> Inventory {
    let mut c = ObservedCluster::new("c1");
    c.kubernetes_version = Some(k(kube));
    c.generation = gen_;
    c.machines = machines
        .into_iter()
        .map(|mut m| {
            m.kubelet_version.get_or_insert_with(|| k(kube));
            (m.node.clone(), m)
        })
        .collect();
    Inventory {
        clusters: [("c1".to_string(), std::sync::Arc::new(c))].into(),
    }
}

fn plan_ok(d: &Desired, i: &Inventory) -> Plan {
    compute(d, i, &LastApplied::default(), None).unwrap_or_else(|e| panic!("{e:#?}"))
}

fn plan_err(d: &Desired, i: &Inventory) -> Vec<Diagnostic> {
    match compute(d, i, &LastApplied::default(), None) {
        Ok(p) => panic!(
            "expected errors, got a plan:\n{}",
            render::text(&p, Default::default())
        ),
        Err(e) => e,
    }
}

fn talos_steps(p: &Plan) -> Vec<&TalosRollout> {
    p.clusters[0]
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Talos(t) => Some(t),
            _ => None,
        })
        .collect()
}

fn wave_nodes(t: &TalosRollout) -> Vec<Vec<&str>> {
    t.waves
        .iter()
        .map(|w| w.iter().map(|m| m.node.as_str()).collect())
        .collect()
}

fn only(diags: &[Diagnostic], code: &str) -> Diagnostic {
    let hits: Vec<&Diagnostic> = diags.iter().filter(|d| d.code == code).collect();
    assert_eq!(hits.len(), 1, "want one {code}, got {diags:#?}");
    hits[0].clone()
}

pub(crate) fn cp_pool(talos: &str) -> String {
    pool_doc("cp", "controlplane", "cp-1, cp-2, cp-3", talos, "")
}

pub(crate) fn three_cps(talos: &str) -> Vec<Machine> {
    vec![cp("cp-1", talos), cp("cp-2", talos), cp("cp-3", talos)]
}

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

// ---------------------------------------------------------------- waves

pub(crate) fn workers(n: usize, talos: &str) -> Vec<Machine> {
    (1..=n).map(|i| w(&format!("w-{i}"), talos)).collect()
}

pub(crate) fn worker_pool(n: usize, max: u32) -> String {
    let names: Vec<String> = (1..=n).map(|i| format!("w-{i}")).collect();
    pool_doc(
        "workers",
        "worker",
        &names.join(", "),
        "v1.13.9",
        &format!("  rollout:\n    maxUnavailable: {max}\n"),
    )
}

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

fn applied_of(d: &Desired) -> LastApplied {
    let mut rs = Vec::new();
    for c in d.clusters.values() {
        rs.push(AppliedResource::of_cluster(c));
        rs.extend(c.pools.values().map(|p| AppliedResource::of_pool(p)));
    }
    LastApplied::from_resources(rs)
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
    assert!(
        p.clusters[0]
            .notes
            .iter()
            .any(|n| n.contains("highest bar in force, max(required 1, controlPlane 2)"))
    );
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
            .any(|n| n.contains("changes the approvals setting")),
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

// ---------------------------------------------------------------- identity and staleness

#[test]
fn same_inputs_same_id_any_basis_change_makes_it_stale() {
    let d = one("v1.35.0", "", &[cp_pool("v1.13.9")]);
    let i = observed("v1.34.1", 4, three_cps("v1.12.4"));
    let a = plan_ok(&d, &i);
    let b = plan_ok(&d, &i);
    assert_eq!(a.id, b.id);
    assert_eq!(
        render::text(&a, Default::default()),
        render::text(&b, Default::default())
    );
    assert_eq!(render::json(&a), render::json(&b));
    assert_eq!(a.basis, basis_of(&d, &i, &LastApplied::default()));
    assert!(!a.is_stale(&a.basis));

    // The parent is not part of the id.
    let with_parent = compute(&d, &i, &LastApplied::default(), Some(a.id)).unwrap();
    assert_eq!(with_parent.id, a.id);

    // Observed generation.
    let mut i2 = i.clone();
    std::sync::Arc::make_mut(i2.clusters.get_mut("c1").unwrap()).generation += 1;
    let c = plan_ok(&d, &i2);
    assert_ne!(c.id, a.id);
    assert!(a.is_stale(&c.basis));
    // Desired revision (a comment changes nothing but the revision).
    let d2 = load(&[
        ("c1.yaml", cluster_doc("c1", "v1.35.0", "# a comment\n")),
        ("pools.yaml", cp_pool("v1.13.9")),
    ]);
    let e = plan_ok(&d2, &i);
    assert_ne!(e.id, a.id);
    assert!(a.is_stale(&e.basis));
    // Last-applied state.
    let f = compute(&d, &i, &applied_of(&d), None).unwrap();
    assert_ne!(f.id, a.id);
    assert!(a.is_stale(&f.basis));
}

#[test]
fn the_summary_line_names_the_id_and_the_approve_command() {
    let d = one("v1.34.1", "", &[worker_pool(6, 2)]);
    let p = plan_ok(&d, &observed("v1.34.1", 1, workers(6, "v1.12.4")));
    let short = p.id.short();
    assert_eq!(
        render::summary_line(&p),
        format!(
            "Plan {short}: 1 rollout (6 machines), 2 settings changes. Approve with: medea approve {short}"
        )
    );
    assert!(
        render::sign_command(&p)
            .starts_with(&format!("echo {} | ssh-keygen -Y sign", p.id.to_hex()))
    );
    let colored = render::text(&p, render::Options { color: true });
    assert!(colored.contains("\x1b[33m~ pool workers"), "{colored}");
    assert!(!render::text(&p, Default::default()).contains('\x1b'));
}

/// Issue #34: a plan's state is a `PlanState`; past `pending` the closing line says what
/// became of the plan (`PlanState::sentence`) and neither the text nor the JSON offers the
/// approve or sign command. A blocked plan keeps its "cannot be approved" line and says so.
#[test]
fn past_pending_a_rendered_plan_says_its_state_and_offers_no_approval() {
    use crate::plan::PlanState;
    use crate::plan::preflight::{Finding, Severity};
    let d = one("v1.34.1", "", &[worker_pool(6, 2)]);
    let p = plan_ok(&d, &observed("v1.34.1", 1, workers(6, "v1.12.4")));
    let short = p.id.short();
    let head = format!("Plan {short}: 1 rollout (6 machines), 2 settings changes");
    let o = render::Options::default();
    for state in PlanState::ALL {
        let text = render::text_in_state(&p, o, state);
        let json: serde_json::Value =
            serde_json::from_str(&render::json_in_state(&p, state)).unwrap();
        assert_eq!(json["state"], state.as_str());
        match state.sentence() {
            None => {
                assert!(
                    text.contains(&format!("{head}. Approve with: medea approve {short}\n")),
                    "{state}: {text}"
                );
                assert!(text.contains("To sign without the API:"), "{state}: {text}");
                assert_eq!(json["approveCommand"], format!("medea approve {short}"));
                assert!(json["signCommand"].is_string(), "{state}: {json}");
            }
            Some(sentence) => {
                // a running plan names the command that follows its cluster's job (issue #51)
                let sentence = if state == PlanState::Running {
                    format!(
                        "{sentence}: follow it with `medea rollout status -w --cluster {}`",
                        p.clusters[0].cluster
                    )
                } else {
                    sentence.to_string()
                };
                assert!(
                    text.contains(&format!("{head}. This plan is {sentence}.\n")),
                    "{state}: {text}"
                );
                assert!(!text.contains("Approve with:"), "{state}: {text}");
                assert!(
                    !text.contains("To sign without the API:"),
                    "{state}: {text}"
                );
                assert!(json["approveCommand"].is_null(), "{state}: {json}");
                assert!(json["signCommand"].is_null(), "{state}: {json}");
            }
        }
    }
    assert!(!render::json(&p).contains("\"state\""));

    let mut blocked = p.clone();
    std::sync::Arc::make_mut(&mut blocked.clusters[0])
        .preflight
        .push(Finding {
            id: "etcd/alarm/CORRUPT/1".into(),
            check: "etcd".into(),
            severity: Severity::Blocking,
            message: "etcd member 1 has alarm CORRUPT".into(),
            evidence: vec![],
            help: String::new(),
            acknowledged: false,
            until: None,
        });
    let cannot = format!(
        "{head}. It cannot be approved: 1 blocking preflight finding (see `preflight:` above); fix it and replan, or acknowledge it under `spec.preflight.acknowledge`"
    );
    assert_eq!(render::summary_line(&blocked), cannot);
    let text = render::text_in_state(&blocked, o, PlanState::Blocked);
    assert!(
        text.contains(&format!(
            "{cannot}. This plan is {}.\n",
            PlanState::Blocked.sentence().unwrap()
        )),
        "{text}"
    );
    let text = render::text_in_state(&blocked, o, PlanState::Pending);
    assert!(text.contains(&format!("{cannot}\n")), "{text}");
    assert!(!text.contains("To sign without the API:"), "{text}");
}

// ---------------------------------------------------------------- properties

const VERSIONS: &[&str] = &["v1.11.5", "v1.12.4", "v1.12.11", "v1.13.2", "v1.13.9"];

#[derive(Debug, Clone)]
struct Node {
    version: usize,
    ready: bool,
    cordoned: bool,
}

fn arb_nodes() -> impl Strategy<Value = Vec<Node>> {
    prop::collection::vec(
        (
            0..VERSIONS.len(),
            prop::bool::weighted(0.85),
            prop::bool::weighted(0.1),
        )
            .prop_map(|(version, ready, cordoned)| Node {
                version,
                ready,
                cordoned,
            }),
        1..10,
    )
}

fn scenario(cps: &[Node], ws: &[Node], max: u32, target: usize, gen_: u64) -> (Desired, Inventory) {
    let cp_names: Vec<String> = (1..=cps.len()).map(|i| format!("cp-{i}")).collect();
    let w_names: Vec<String> = (1..=ws.len()).map(|i| format!("w-{i}")).collect();
    let d = one(
        "v1.34.1",
        &format!("  rollout:\n    maxUnavailable: {max}\n"),
        &[
            pool_doc(
                "cp",
                "controlplane",
                &cp_names.join(", "),
                VERSIONS[target],
                "",
            ),
            pool_doc("w", "worker", &w_names.join(", "), VERSIONS[target], ""),
        ],
    );
    let mut ms = Vec::new();
    for (name, n, role) in cp_names
        .iter()
        .zip(cps)
        .map(|(a, b)| (a, b, MachineRole::Controlplane))
        .chain(
            w_names
                .iter()
                .zip(ws)
                .map(|(a, b)| (a, b, MachineRole::Worker)),
        )
    {
        let mut m = machine(name, role, VERSIONS[n.version], "v1.34.1");
        m.ready = n.ready;
        m.cordoned = n.cordoned;
        ms.push(m);
    }
    (d, observed("v1.34.1", gen_, ms))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn plans_are_deterministic_and_waves_keep_their_invariants(
        cps in arb_nodes(),
        ws in arb_nodes(),
        max in 1u32..4,
        target in 2usize..VERSIONS.len(),
        gen_ in 1u64..1000,
    ) {
        let (d, i) = scenario(&cps, &ws, max, target, gen_);
        let a = compute(&d, &i, &LastApplied::default(), None);
        let b = compute(&d, &i, &LastApplied::default(), None);
        prop_assert_eq!(&a, &b);
        let Ok(plan) = a else { return Ok(()) };
        let b = b.unwrap();
        prop_assert_eq!(plan.id, b.id);
        prop_assert_eq!(render::text(&plan, Default::default()), render::text(&b, Default::default()));
        prop_assert_eq!(render::json(&plan), render::json(&b));

        // Any change of the observed generation gives another id and makes this plan stale.
        let mut i2 = i.clone();
        std::sync::Arc::make_mut(i2.clusters.get_mut("c1").unwrap()).generation += 1;
        let c = compute(&d, &i2, &LastApplied::default(), None).unwrap();
        prop_assert_ne!(c.id, plan.id);
        prop_assert!(plan.is_stale(&c.basis));

        let obs = &i.clusters["c1"];
        let target_v = t(VERSIONS[target]);
        for step in &plan.clusters[0].steps {
            let Step::Talos(s) = step else { continue };
            let cap = if s.role == MachineRole::Controlplane { 1 } else { max as usize };
            let in_hop: Vec<&str> = s.waves.iter().flatten().map(|m| m.node.as_str()).collect();
            let mut dedup = in_hop.clone();
            dedup.sort();
            dedup.dedup();
            prop_assert_eq!(dedup.len(), in_hop.len(), "a machine appears once per hop");
            let scope: Vec<&Machine> = obs.machines.values().filter(|m| m.role == s.role).collect();
            let away_out = scope.iter().filter(|m| m.unavailable() && !in_hop.contains(&m.node.as_str())).count();
            for (n, wave) in s.waves.iter().enumerate() {
                prop_assert!(!wave.is_empty());
                prop_assert!(wave.len() + away_out <= cap, "wave {} of {} too big", n, s.pool);
                if s.role == MachineRole::Controlplane {
                    prop_assert_eq!(wave.len(), 1);
                }
                if n > 0 {
                    prop_assert!(wave.iter().all(|m| !obs.machines[&m.node].unavailable()),
                        "already-unavailable machines go in the first wave");
                }
            }
        }
        // Every machine not on the target takes the last hop of its pool exactly once.
        for m in obs.machines.values() {
            let last = plan.clusters[0].steps.iter().rev().find_map(|s| match s {
                Step::Talos(s) if s.role == m.role => Some(s),
                _ => None,
            });
            let count = last.map_or(0, |s| s.waves.iter().flatten().filter(|x| x.node == m.node).count());
            let needs = m.talos_version.as_ref() != Some(&target_v);
            prop_assert_eq!(count, usize::from(needs), "{}", m.node);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// the drain policy and the upgrade bound (issue 20)

fn two_worker_pools(cluster_extra: &str, pool_extra: &str) -> Desired {
    one(
        "v1.34.1",
        cluster_extra,
        &[
            pool_doc("a", "worker", "w-1", "v1.13.9", ""),
            pool_doc("b", "worker", "w-2", "v1.13.9", pool_extra),
        ],
    )
}

fn two_workers() -> Inventory {
    observed("v1.34.1", 1, vec![w("w-1", "v1.13.2"), w("w-2", "v1.13.2")])
}

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

fn diagnostics_of(cluster_extra: &str, pool_extra: &str) -> Vec<Diagnostic> {
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
                bytes: pool_doc("a", "worker", "w-1", "v1.13.9", pool_extra)
                    .into_bytes()
                    .into(),
            },
        ],
        markers: Vec::new(),
        commit: None,
        refused: Vec::new(),
    };
    parse_snapshot(snap).diagnostics
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
    let notes: Vec<&String> = p.clusters[0]
        .notes
        .iter()
        .filter(|n| n.contains("newest patch"))
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
    let notes: Vec<&String> = p.clusters[0]
        .notes
        .iter()
        .filter(|n| n.contains("skipPods"))
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
        p.clusters[0].notes.iter().all(|n| !n.contains("skipPods")),
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
        let notes: Vec<&String> = p.clusters[0]
            .notes
            .iter()
            .filter(|n| n.contains("skipPods"))
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
            c.notes
                .iter()
                .any(|n| n
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
            .any(|n| n.contains("the new cluster's health sources")),
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
            .any(|n| n == "this plan removes every health gate of the cluster: its rollouts will no longer wait for any gate"),
        "{notes:#?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.contains("every health gate of the pool w")),
        "{notes:#?}"
    );
    let unpromoted = base_cluster.replace("  promotion:\n    after: staging\n    soak: 24h\n", "");
    let p = changed(&unpromoted, base_pool);
    assert!(
        p.clusters[0]
            .notes
            .iter()
            .any(|n| n.contains("removes the promotion after cluster staging")),
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
    // The schedule or retention alone: the ordinary bar.
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
    assert_eq!(p.approvals_required, 1);

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
            .any(|n| n.contains("(backup.recipients)")),
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
                .any(|n| n.starts_with(crate::plan::compute::HOOKS_CHANGE_NOTE)),
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
    use super::applied::Settings;
    use crate::desired::model::{DEFAULT_STAGE_PARALLELISM, Stage};
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
        r.fields()
            .into_iter()
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
