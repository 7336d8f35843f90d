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

fn applied_of(d: &Desired) -> LastApplied {
    let mut rs = Vec::new();
    for c in d.clusters.values() {
        rs.push(AppliedResource::of_cluster(c));
        rs.extend(c.pools.values().map(|p| AppliedResource::of_pool(p)));
    }
    LastApplied::from_resources(rs)
}

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

mod approvals;
mod backups;
mod bars;
mod drain;
mod hooks;
mod hops;
mod identity;
mod properties;
mod refusals;
mod staging;
mod waves;
