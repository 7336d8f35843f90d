//! The twin: a simulator scenario and kube objects built from an observed cluster and its
//! census (pure). The twin has the observed nodes (names, roles, Talos and kubelet versions,
//! platforms, schematics, extensions) on **loopback addresses only**, and the census's pods on
//! the same nodes with the same owner kinds, labels and emptyDir volumes, its DaemonSets and
//! its PodDisruptionBudgets over the same member pods with the same `minAvailable` /
//! `maxUnavailable`, so the simulator's disruption controller computes the same
//! `disruptionsAllowed`.
//!
//! How each census pod becomes a twin object (design/rehearsal.md, "The twin"):
//! - owned by a **ReplicaSet**: a ReplicaSet of the same name (replicas: its census pods,
//!   selector: a twin label) and the pods themselves, bound to their census node
//!   (`spec.nodeName`) and naming the ReplicaSet as their controller. The simulator's
//!   ReplicaSet controller counts them and creates nothing; a replacement after an eviction
//!   goes wherever the simulator's scheduler puts it.
//! - owned by a **DaemonSet**: the DaemonSet (tolerating every taint); the simulator's
//!   DaemonSet controller runs its pods, one per node.
//! - owned by a **StatefulSet**: the StatefulSet (the disruption controller reads its
//!   `spec.replicas`) and its pods; the simulator runs no StatefulSet controller, so an
//!   evicted pod is not recreated (a limit, said in the report).
//! - owned by any other kind (`Job`, `ReplicationController`, custom): the pods, naming their
//!   controller (its object is not modelled; said in the report).
//! - **bare** pods: the pods, with no owner.
//! - mirror pods, finished pods and pods on no node or on a node the cluster does not have
//!   are left out (drains skip the first two; the simulator runs control-plane static pods).
//!
//! PodDisruptionBudgets select their member pods by a twin label per budget
//! (`twin.medea.dev/pdb-<n>`), added to exactly the pods the census lists as members (and to
//! the template of a ReplicaSet all of whose pods are members, so its replacements count).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};

use crate::inventory::census::{Census, CensusPod};
use crate::inventory::{MachineRole, ObservedCluster};
use crate::sim::talos::{NodeSpec, RebootTiming, Role, Scenario, Timing};

/// The label the twin's controllers select their pods by.
pub const OWNER_LABEL: &str = "twin.medea.dev/owner";
/// The prefix of the label a twin PodDisruptionBudget selects its members by.
pub const PDB_LABEL_PREFIX: &str = "twin.medea.dev/pdb-";
/// The image every twin container runs (nothing is pulled: the simulator runs no images).
const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// The namespaces every simulated kube-apiserver has from the start.
const BUILTIN_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// How long the twin's nodes and pods take, already compressed (twin time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TwinTiming {
    /// A node is away this long after its reboot.
    pub reboot: Duration,
    /// An installer pull takes this long.
    pub image_pull: Duration,
    /// A (re)scheduled pod takes this long to become Ready.
    pub pod_start: Duration,
    /// An evicted pod stays Terminating this long.
    pub pod_termination: Duration,
}

/// A twin, ready to start: the scenario (nodes, timing) and the kube objects
/// (`SimClusterConfig::extra_objects`, with the platform off).
#[derive(Debug, Clone, PartialEq)]
pub struct Twin {
    /// Nodes (loopback addresses) and timing.
    pub scenario: Scenario,
    /// The kube objects (`SimClusterConfig::extra_objects`).
    pub objects: Vec<Value>,
    /// The twin's address of each node (node name → loopback address).
    pub addresses: BTreeMap<String, String>,
    /// What the twin does not model of this cluster, one line each.
    pub limits: Vec<String>,
}

/// The twin's loopback address of the `i`-th node (0-based): `127.77.0.2`, `127.77.0.3`, …;
/// never an observed address.
pub fn twin_address(i: usize) -> String {
    format!("127.77.{}.{}", (i + 2) / 256, (i + 2) % 256)
}

/// The twin of `observed` with `census` (`None`: nodes only, said in `limits`).
pub fn build(observed: &ObservedCluster, census: Option<&Census>, timing: TwinTiming) -> Twin {
    let mut limits = Vec::new();
    let mut nodes = Vec::new();
    let mut addresses = BTreeMap::new();
    for m in observed.machines.values() {
        let Some(talos) = m.talos_version.clone() else {
            limits.push(format!(
                "node {} is left out: its Talos version was not observed",
                m.node
            ));
            continue;
        };
        let Some(kubernetes) = m
            .kubelet_version
            .clone()
            .or_else(|| observed.kubernetes_version.clone())
        else {
            limits.push(format!(
                "node {} is left out: its kubelet version was not observed",
                m.node
            ));
            continue;
        };
        let address = twin_address(nodes.len());
        addresses.insert(m.node.clone(), address.clone());
        nodes.push(NodeSpec {
            name: m.node.clone(),
            address,
            role: match m.role {
                MachineRole::Controlplane => Role::Controlplane,
                MachineRole::Worker => Role::Worker,
            },
            talos,
            kubernetes,
            machine_config_extra: None,
            platform: m.platform.clone(),
            schematic: m.schematic.clone(),
            extensions: m.extensions.clone(),
        });
    }
    let scenario = Scenario {
        cluster_name: observed.name.clone(),
        timing: Timing {
            reboot: RebootTiming::After(timing.reboot),
            image_pull: timing.image_pull,
            pod_start: timing.pod_start,
            pod_termination: timing.pod_termination,
            ..Timing::default()
        },
        nodes,
        faults: Vec::new(),
        workloads: Vec::new(),
        kube_faults: Vec::new(),
        machine_config_extra: None,
        etcd_alarms: Vec::new(),
        client_cert_valid_for: None,
    };
    let objects = match census {
        Some(c) => workload_objects(c, &addresses, observed, &mut limits),
        None => {
            limits.push(
                "no census of the cluster's workloads is stored: the twin has its nodes only (no pods, no PodDisruptionBudgets), so drains meet nothing; refresh the inventory to gather one"
                    .to_string(),
            );
            Vec::new()
        }
    };
    Twin {
        scenario,
        objects,
        addresses,
        limits,
    }
}

/// `observed` as the twin runs it: every machine's address replaced by its twin address
/// (machines the twin left out are dropped). What the twin's job is created from.
pub fn observed_twin(observed: &ObservedCluster, twin: &Twin) -> ObservedCluster {
    let mut out = observed.clone();
    out.machines.retain(|name, _| twin.addresses.contains_key(name));
    for (name, m) in out.machines.iter_mut() {
        if let Some(a) = twin.addresses.get(name) {
            m.address = a.clone();
        }
    }
    out
}

/// `(kind, name)` of a census pod's controller, per namespace.
type OwnerKey = (String, String, String);

fn owner_key(p: &CensusPod) -> Option<OwnerKey> {
    p.owner
        .as_ref()
        .map(|o| (p.namespace.clone(), o.kind.clone(), o.name.clone()))
}

fn api_version_of(kind: &str) -> &'static str {
    match kind {
        "ReplicaSet" | "StatefulSet" | "DaemonSet" | "Deployment" => "apps/v1",
        "Job" => "batch/v1",
        _ => "v1",
    }
}

/// A uid for the controller of kind `kind` the twin does not model (`n`: its index).
fn synthetic_uid(n: usize) -> String {
    format!("00000000-0000-4000-8000-{n:012x}")
}

/// The int-or-string a PDB field was written as.
fn int_or_string(v: &str) -> Value {
    match v.trim().parse::<i64>() {
        Ok(i) => json!(i),
        Err(_) => json!(v),
    }
}

fn workload_objects(
    census: &Census,
    addresses: &BTreeMap<String, String>,
    observed: &ObservedCluster,
    limits: &mut Vec<String>,
) -> Vec<Value> {
    for t in &census.truncated {
        limits.push(format!("the census was cut: {t}"));
    }
    for (source, why) in &census.gather_errors {
        limits.push(format!(
            "the census could not read {source} ({why}): the twin has none"
        ));
    }
    // Which PDBs each pod is a member of (by the twin's PDB label).
    let mut pdb_labels: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (i, pdb) in census.pdbs.iter().enumerate() {
        for pod in &pdb.pods {
            pdb_labels
                .entry((pdb.namespace.clone(), pod.clone()))
                .or_default()
                .push(format!("{PDB_LABEL_PREFIX}{i}"));
        }
    }
    // The pods the twin runs, and their controllers.
    let mut kept: Vec<&CensusPod> = Vec::new();
    let mut elsewhere = BTreeSet::new();
    for p in &census.pods {
        // Drains skip mirror and finished pods; the simulator runs its own static pods.
        if p.mirror || matches!(p.phase.as_str(), "Succeeded" | "Failed") {
            continue;
        }
        if !addresses.contains_key(&p.node) {
            elsewhere.insert(p.node.clone());
        } else {
            kept.push(p);
        }
    }
    if !elsewhere.is_empty() {
        let nodes: Vec<String> = elsewhere
            .into_iter()
            .map(|n| if n.is_empty() { "(unscheduled)".into() } else { n })
            .collect();
        limits.push(format!(
            "pods on nodes the twin does not have are left out: {}",
            nodes.join(", ")
        ));
    }
    let mut owners: BTreeMap<OwnerKey, Vec<&CensusPod>> = BTreeMap::new();
    for p in &kept {
        if let Some(k) = owner_key(p) {
            owners.entry(k).or_default().push(p);
        }
    }
    // DaemonSets named by the census, and those only its pods name.
    let mut daemonsets: BTreeSet<(String, String)> = census
        .daemonsets
        .iter()
        .filter_map(|d| d.split_once('/'))
        .map(|(ns, n)| (ns.to_string(), n.to_string()))
        .collect();
    daemonsets.extend(
        owners
            .keys()
            .filter(|(_, k, _)| k == "DaemonSet")
            .map(|(ns, _, n)| (ns.clone(), n.clone())),
    );
    let control_planes: BTreeSet<&str> = observed
        .machines
        .values()
        .filter(|m| m.role == MachineRole::Controlplane)
        .map(|m| m.node.as_str())
        .collect();

    let mut objects = Vec::new();
    let namespaces: BTreeSet<&str> = kept
        .iter()
        .map(|p| p.namespace.as_str())
        .chain(census.pdbs.iter().map(|p| p.namespace.as_str()))
        .chain(daemonsets.iter().map(|(ns, _)| ns.as_str()))
        .filter(|ns| !BUILTIN_NAMESPACES.contains(ns))
        .collect();
    for ns in namespaces {
        objects.push(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }));
    }
    // Controllers, each selecting its pods by the twin's owner label.
    let mut owner_index: BTreeMap<OwnerKey, usize> = BTreeMap::new();
    let mut unmodelled: BTreeMap<String, usize> = BTreeMap::new();
    for (i, (key, pods)) in owners.iter().enumerate() {
        owner_index.insert(key.clone(), i);
        let (ns, kind, name) = key;
        let owner_value = format!("o{i}");
        // The labels all its pods share (a replacement carries these), PDB labels included.
        let mut template_labels = common_labels(pods, &pdb_labels);
        template_labels.insert(OWNER_LABEL.to_string(), owner_value.clone());
        let on_control_plane = pods.iter().any(|p| control_planes.contains(p.node.as_str()));
        let template = template_of(&template_labels, on_control_plane);
        let selector = json!({"matchLabels": {OWNER_LABEL: owner_value}});
        match kind.as_str() {
            "ReplicaSet" => objects.push(json!({
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"replicas": pods.len(), "selector": selector, "template": template},
            })),
            "StatefulSet" => {
                objects.push(json!({
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"replicas": pods.len(), "serviceName": name, "selector": selector, "template": template},
                }));
                *unmodelled.entry(kind.clone()).or_default() += pods.len();
            }
            "DaemonSet" => {}
            _ => *unmodelled.entry(kind.clone()).or_default() += pods.len(),
        }
    }
    for (kind, n) in &unmodelled {
        limits.push(format!(
            "{n} pod(s) owned by a {kind}: the simulator runs no {kind} controller, so an evicted one is not recreated in the twin"
        ));
    }
    for (d, (ns, name)) in daemonsets.iter().enumerate() {
        let key = (ns.clone(), "DaemonSet".to_string(), name.clone());
        let pods = owners.get(&key).cloned().unwrap_or_default();
        let mut labels = common_labels(&pods, &BTreeMap::new());
        labels.remove("controller-revision-hash");
        labels.remove("pod-template-generation");
        let owner_value = format!("ds{d}");
        labels.insert(OWNER_LABEL.to_string(), owner_value.clone());
        let mut template = template_of(&labels, false);
        template["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
        objects.push(json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"matchLabels": {OWNER_LABEL: owner_value}}, "template": template},
        }));
        let on: BTreeSet<&str> = pods.iter().map(|p| p.node.as_str()).collect();
        if !pods.is_empty() && on.len() < addresses.len() {
            limits.push(format!(
                "DaemonSet {ns}/{name} runs on {} of {} nodes; its twin runs on every node (drains skip DaemonSet pods)",
                on.len(),
                addresses.len()
            ));
        }
    }
    // The pods (DaemonSet pods come from their controller).
    for p in &kept {
        let key = owner_key(p);
        if key.as_ref().is_some_and(|(_, k, _)| k == "DaemonSet") {
            continue;
        }
        let mut labels: BTreeMap<String, String> = p.labels.clone();
        for l in pdb_labels
            .get(&(p.namespace.clone(), p.name.clone()))
            .into_iter()
            .flatten()
        {
            labels.insert(l.clone(), "member".into());
        }
        let owner_refs = match (&p.owner, &key) {
            (Some(o), Some(k)) => {
                let i = owner_index.get(k).copied().unwrap_or(0);
                labels.insert(OWNER_LABEL.to_string(), format!("o{i}"));
                let mut r = json!({
                    "apiVersion": api_version_of(&o.kind),
                    "kind": o.kind,
                    "name": o.name,
                    "controller": true,
                    "blockOwnerDeletion": true,
                });
                // The seeder fills in the uid of a seeded owner; the others get one of
                // their own.
                if !matches!(o.kind.as_str(), "ReplicaSet" | "StatefulSet") {
                    r["uid"] = json!(synthetic_uid(i));
                }
                json!([r])
            }
            _ => Value::Null,
        };
        let empty_dirs: Vec<Value> = (0..p.volumes.empty_dir)
            .map(|i| json!({"name": format!("scratch-{i}"), "emptyDir": {}}))
            .collect();
        let mounts: Vec<Value> = (0..p.volumes.empty_dir)
            .map(|i| json!({"name": format!("scratch-{i}"), "mountPath": format!("/scratch-{i}")}))
            .collect();
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": p.name, "namespace": p.namespace, "labels": labels},
            "spec": {
                "nodeName": p.node,
                "containers": [{"name": "c", "image": PAUSE_IMAGE}],
            },
        });
        if !owner_refs.is_null() {
            pod["metadata"]["ownerReferences"] = owner_refs;
        }
        if !empty_dirs.is_empty() {
            pod["spec"]["volumes"] = json!(empty_dirs);
            pod["spec"]["containers"][0]["volumeMounts"] = json!(mounts);
        }
        objects.push(pod);
    }
    // The budgets, over exactly their census members.
    for (i, pdb) in census.pdbs.iter().enumerate() {
        let mut spec = json!({
            "selector": {"matchLabels": {format!("{PDB_LABEL_PREFIX}{i}"): "member"}},
        });
        if let Some(v) = &pdb.min_available {
            spec["minAvailable"] = int_or_string(v);
        }
        if let Some(v) = &pdb.max_unavailable {
            spec["maxUnavailable"] = int_or_string(v);
        }
        objects.push(json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": pdb.name, "namespace": pdb.namespace},
            "spec": spec,
        }));
    }
    let attached: usize = census.attachments.values().map(Vec::len).sum();
    if attached > 0 {
        limits.push(format!(
            "{attached} CSI volume attachment(s) are not modelled: the twin's drains wait for no volume to detach"
        ));
    }
    objects
}

/// The labels every one of `pods` has with the same value, their PDB labels included.
fn common_labels(
    pods: &[&CensusPod],
    pdb_labels: &BTreeMap<(String, String), Vec<String>>,
) -> BTreeMap<String, String> {
    let with_pdbs = |p: &CensusPod| {
        let mut l = p.labels.clone();
        for k in pdb_labels
            .get(&(p.namespace.clone(), p.name.clone()))
            .into_iter()
            .flatten()
        {
            l.insert(k.clone(), "member".into());
        }
        l
    };
    let mut iter = pods.iter();
    let Some(first) = iter.next() else {
        return BTreeMap::new();
    };
    let mut common = with_pdbs(first);
    for p in iter {
        let l = with_pdbs(p);
        common.retain(|k, v| l.get(k) == Some(v));
    }
    common
}

/// A pod template with `labels`; `control_plane`: it tolerates the control-plane taint (its
/// census pods ran there).
fn template_of(labels: &BTreeMap<String, String>, control_plane: bool) -> Value {
    let mut t = json!({
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE}]},
    });
    if control_plane {
        t["spec"]["tolerations"] = json!([{
            "key": "node-role.kubernetes.io/control-plane",
            "operator": "Exists",
            "effect": "NoSchedule",
        }]);
    }
    t
}
