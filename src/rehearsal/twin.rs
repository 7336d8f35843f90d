//! The twin: a simulator scenario and kube objects built from an observed cluster and its
//! census (pure). The twin has the observed nodes (names, roles, Talos and kubelet versions,
//! platforms, schematics, extensions) on **loopback addresses only**, and the census's pods on
//! the same nodes with the same owner kinds, labels and volumes (as many emptyDir, hostPath,
//! persistentVolumeClaim and inline CSI volumes as the census counted; their sources are the
//! twin's own), its DaemonSets and its PodDisruptionBudgets over the same member pods with the
//! same `minAvailable` / `maxUnavailable`, so the simulator's disruption controller computes
//! the same `disruptionsAllowed`.
//!
//! How each census pod becomes a twin object (design/sim.md, "The twin"):
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

use crate::inventory::census::{Census, CensusPod, VolumeKinds};
use crate::inventory::{MachineRole, ObservedCluster};
use crate::sim::talos::{NodeSpec, RebootTiming, Role, Scenario, Timing};

/// The label the twin's controllers select their pods by.
pub const OWNER_LABEL: &str = "twin.medea.dev/owner";
/// The prefix of the label a twin PodDisruptionBudget selects its members by.
pub const PDB_LABEL_PREFIX: &str = "twin.medea.dev/pdb-";
/// The image every twin container runs (nothing is pulled: the simulator runs no images).
const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// Where the twin's `hostPath` volumes point (never a path of the real cluster: the census
/// keeps no volume source).
pub const TWIN_HOST_PATH: &str = "/var/lib/medea-twin";
/// The driver the twin's inline `csi` volumes name.
pub const TWIN_CSI_DRIVER: &str = "twin.medea.dev";
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
            secure_boot: m.secure_boot == Some(true),
            image_factory: m.factory_host.clone(),
            install_config: Default::default(),
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
        etcd_leader: None,
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
    out.machines
        .retain(|name, _| twin.addresses.contains_key(name));
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
            .map(|n| {
                if n.is_empty() {
                    "(unscheduled)".into()
                } else {
                    n
                }
            })
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
        let on_control_plane = pods
            .iter()
            .any(|p| control_planes.contains(p.node.as_str()));
        let template = template_of(&template_labels, &common_volumes(pods), on_control_plane);
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
        let mut template = template_of(&labels, &common_volumes(&pods), false);
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
        with_volumes(&mut pod["spec"], &p.volumes);
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

/// The volumes every one of `pods` has: per kind, the fewest any of them mounts.
fn common_volumes(pods: &[&CensusPod]) -> VolumeKinds {
    let fewest =
        |count: fn(&VolumeKinds) -> u32| pods.iter().map(|p| count(&p.volumes)).min().unwrap_or(0);
    VolumeKinds {
        empty_dir: fewest(|v| v.empty_dir),
        host_path: fewest(|v| v.host_path),
        persistent_volume_claim: fewest(|v| v.persistent_volume_claim),
        csi: fewest(|v| v.csi),
    }
}

/// Give a pod spec (its first container) as many volumes of each kind as `volumes` counts.
/// Only the kind is the census's: the sources are the twin's own and name nothing of the
/// real cluster (the census keeps none). A `hostPath` is a directory under
/// [`TWIN_HOST_PATH`], a `persistentVolumeClaim` names a claim the twin does not create (the
/// simulator starts a pod without waiting for its volumes, and attaches nothing for a claim
/// it does not have), an inline `csi` volume names the twin's own driver.
fn with_volumes(spec: &mut Value, volumes: &VolumeKinds) {
    let mut list = Vec::new();
    for i in 0..volumes.empty_dir {
        list.push(json!({"name": format!("scratch-{i}"), "emptyDir": {}}));
    }
    for i in 0..volumes.host_path {
        list.push(json!({
            "name": format!("host-{i}"),
            "hostPath": {"path": format!("{TWIN_HOST_PATH}/host-{i}"), "type": "DirectoryOrCreate"},
        }));
    }
    for i in 0..volumes.persistent_volume_claim {
        list.push(json!({
            "name": format!("claim-{i}"),
            "persistentVolumeClaim": {"claimName": format!("twin-claim-{i}")},
        }));
    }
    for i in 0..volumes.csi {
        list.push(json!({
            "name": format!("csi-{i}"),
            "csi": {"driver": TWIN_CSI_DRIVER},
        }));
    }
    if list.is_empty() {
        return;
    }
    let mounts: Vec<Value> = list
        .iter()
        .map(|v| {
            let name = v["name"].as_str().unwrap_or_default();
            json!({"name": name, "mountPath": format!("/{name}")})
        })
        .collect();
    spec["volumes"] = json!(list);
    spec["containers"][0]["volumeMounts"] = json!(mounts);
}

/// A pod template with `labels` and `volumes`; `control_plane`: it tolerates the
/// control-plane taint (its census pods ran there).
fn template_of(
    labels: &BTreeMap<String, String>,
    volumes: &VolumeKinds,
    control_plane: bool,
) -> Value {
    let mut t = json!({
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE}]},
    });
    with_volumes(&mut t["spec"], volumes);
    if control_plane {
        t["spec"]["tolerations"] = json!([{
            "key": "node-role.kubernetes.io/control-plane",
            "operator": "Exists",
            "effect": "NoSchedule",
        }]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Machine;
    use crate::inventory::census::{CensusPdb, Owner};
    use crate::version::{KubeVersion, TalosVersion};

    const QUICK: TwinTiming = TwinTiming {
        reboot: Duration::from_secs(1),
        image_pull: Duration::ZERO,
        pod_start: Duration::ZERO,
        pod_termination: Duration::ZERO,
    };

    fn machine(node: &str, role: MachineRole, address: &str, talos: Option<&str>) -> Machine {
        Machine {
            node: node.into(),
            id: format!("id-{node}"),
            address: address.into(),
            role,
            talos_version: talos.map(|t| TalosVersion::parse(t).unwrap()),
            installer_image: None,
            schematic: None,
            platform: Some("metal".into()),
            secure_boot: None,
            factory_host: None,
            extensions: BTreeMap::new(),
            kubelet_version: Some(KubeVersion::parse("v1.34.1").unwrap()),
            ready: true,
            cordoned: false,
            reachable: true,
            boot_id: None,
            labels: BTreeMap::new(),
        }
    }

    /// cp-1 (v1.12.11), w-1 and w-2 (v1.13.0) at public and private addresses, and w-9, whose
    /// Talos version was not observed.
    fn observed() -> ObservedCluster {
        let machines = [
            machine(
                "cp-1",
                MachineRole::Controlplane,
                "203.0.113.10",
                Some("v1.12.11"),
            ),
            machine("w-1", MachineRole::Worker, "10.0.0.11", Some("v1.13.0")),
            machine("w-2", MachineRole::Worker, "2001:db8::12", Some("v1.13.0")),
            machine("w-9", MachineRole::Worker, "fd00::9", None),
        ]
        .into_iter()
        .map(|m| (m.node.clone(), m))
        .collect();
        ObservedCluster::new("home").observe(Some(KubeVersion::parse("v1.34.1").unwrap()), machines)
    }

    fn pod(node: &str, ns: &str, name: &str, owner: Option<(&str, &str)>) -> CensusPod {
        CensusPod {
            node: node.into(),
            namespace: ns.into(),
            name: name.into(),
            owner: owner.map(|(kind, name)| Owner {
                kind: kind.into(),
                name: name.into(),
            }),
            mirror: false,
            phase: "Running".into(),
            labels: BTreeMap::from([("app".to_string(), name.to_string())]),
            volumes: VolumeKinds::default(),
        }
    }

    fn census() -> Census {
        let mut web_a = pod("w-1", "shop", "web-a", Some(("ReplicaSet", "web-5d8f")));
        let mut web_b = pod("w-2", "shop", "web-b", Some(("ReplicaSet", "web-5d8f")));
        for p in [&mut web_a, &mut web_b] {
            p.labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        }
        web_b.labels.insert("zone".into(), "b".into());
        let mut scratch = pod("w-2", "default", "scratch", None);
        scratch.volumes = VolumeKinds {
            empty_dir: 2,
            host_path: 1,
            persistent_volume_claim: 1,
            csi: 1,
        };
        let mut mirror = pod("cp-1", "kube-system", "kube-apiserver-cp-1", None);
        mirror.mirror = true;
        let mut done = pod("w-1", "default", "migrate", Some(("Job", "migrate")));
        done.phase = "Succeeded".into();
        let mut pods = vec![
            web_a,
            web_b,
            pod("w-1", "shop", "db-0", Some(("StatefulSet", "db"))),
            scratch,
            mirror,
            done,
            pod("w-9", "default", "elsewhere", None),
            pod("", "default", "pending", None),
        ];
        for node in ["cp-1", "w-1", "w-2"] {
            let mut p = pod(
                node,
                "kube-system",
                &format!("proxy-{node}"),
                Some(("DaemonSet", "proxy")),
            );
            p.labels = BTreeMap::from([
                ("app".to_string(), "proxy".to_string()),
                ("controller-revision-hash".to_string(), "abc".to_string()),
            ]);
            pods.push(p);
        }
        Census {
            gathered_at: "2026-12-06T00:00:00Z".into(),
            pods,
            pdbs: vec![
                CensusPdb {
                    namespace: "shop".into(),
                    name: "web".into(),
                    min_available: Some("1".into()),
                    max_unavailable: None,
                    disruptions_allowed: 1,
                    expected_pods: 2,
                    pods: vec!["web-a".into(), "web-b".into()],
                },
                CensusPdb {
                    namespace: "shop".into(),
                    name: "db".into(),
                    min_available: None,
                    max_unavailable: Some("50%".into()),
                    disruptions_allowed: 0,
                    expected_pods: 1,
                    pods: vec!["db-0".into()],
                },
            ],
            daemonsets: vec!["kube-system/proxy".into()],
            ..Census::default()
        }
    }

    fn objects_of<'a>(twin: &'a Twin, kind: &str) -> Vec<&'a Value> {
        twin.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn named<'a>(twin: &'a Twin, kind: &str, name: &str) -> &'a Value {
        objects_of(twin, kind)
            .into_iter()
            .find(|o| o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in {:#?}", twin.objects))
    }

    #[test]
    fn the_twin_has_the_observed_nodes_on_loopback_addresses_only() {
        let o = observed();
        let twin = build(&o, Some(&census()), QUICK);
        let nodes: Vec<(&str, Role, String, String)> = twin
            .scenario
            .nodes
            .iter()
            .map(|n| {
                (
                    n.name.as_str(),
                    n.role,
                    n.talos.to_string(),
                    n.kubernetes.to_string(),
                )
            })
            .collect();
        assert_eq!(
            nodes,
            [
                (
                    "cp-1",
                    Role::Controlplane,
                    "v1.12.11".into(),
                    "v1.34.1".into()
                ),
                ("w-1", Role::Worker, "v1.13.0".into(), "v1.34.1".into()),
                ("w-2", Role::Worker, "v1.13.0".into(), "v1.34.1".into()),
            ]
        );
        assert_eq!(twin.scenario.cluster_name, "home");
        for n in &twin.scenario.nodes {
            let ip: std::net::IpAddr = n.address.parse().unwrap();
            assert!(ip.is_loopback(), "{} at {}", n.name, n.address);
            assert_ne!(n.address, o.machines[&n.name].address);
            assert_eq!(twin.addresses.get(&n.name), Some(&n.address));
        }
        assert!(
            twin.limits
                .iter()
                .any(|l| l == "node w-9 is left out: its Talos version was not observed"),
            "{:?}",
            twin.limits
        );
        let run = observed_twin(&o, &twin);
        assert_eq!(
            run.machines.keys().collect::<Vec<_>>(),
            ["cp-1", "w-1", "w-2"]
        );
        for m in run.machines.values() {
            assert_eq!(Some(&m.address), twin.addresses.get(&m.node));
        }
        assert_eq!(twin_address(0), "127.77.0.2");
        assert_eq!(twin_address(254), "127.77.1.0");
    }

    #[test]
    fn census_pods_become_twin_pods_on_their_nodes_with_their_owners_labels_and_volumes() {
        let twin = build(&observed(), Some(&census()), QUICK);
        let mut pods: Vec<(&str, &str, &str)> = objects_of(&twin, "Pod")
            .iter()
            .map(|p| {
                (
                    p["metadata"]["namespace"].as_str().unwrap(),
                    p["metadata"]["name"].as_str().unwrap(),
                    p["spec"]["nodeName"].as_str().unwrap(),
                )
            })
            .collect();
        pods.sort();
        assert_eq!(
            pods,
            [
                ("default", "scratch", "w-2"),
                ("shop", "db-0", "w-1"),
                ("shop", "web-a", "w-1"),
                ("shop", "web-b", "w-2"),
            ],
            "no mirror, finished, DaemonSet or unplaceable pod"
        );
        // owners
        let web_b = named(&twin, "Pod", "web-b");
        let owner = &web_b["metadata"]["ownerReferences"][0];
        assert_eq!(
            (&owner["kind"], &owner["name"]),
            (&json!("ReplicaSet"), &json!("web-5d8f"))
        );
        assert_eq!(owner["controller"], true);
        assert_eq!(
            named(&twin, "Pod", "db-0")["metadata"]["ownerReferences"][0]["kind"],
            "StatefulSet"
        );
        let bare = named(&twin, "Pod", "scratch");
        assert!(bare["metadata"].get("ownerReferences").is_none(), "{bare}");
        // labels: the census's, plus the twin's own
        let labels = &web_b["metadata"]["labels"];
        assert_eq!(
            (&labels["app"], &labels["zone"]),
            (&json!("web"), &json!("b"))
        );
        // volumes: as many of each kind, with sources of the twin's own
        let volumes = bare["spec"]["volumes"].as_array().unwrap();
        let count = |kind: &str| volumes.iter().filter(|v| v.get(kind).is_some()).count();
        assert_eq!(
            (
                count("emptyDir"),
                count("hostPath"),
                count("persistentVolumeClaim"),
                count("csi")
            ),
            (2, 1, 1, 1)
        );
        for v in volumes {
            if let Some(path) = v.pointer("/hostPath/path").and_then(Value::as_str) {
                assert!(path.starts_with(TWIN_HOST_PATH), "{path}");
            }
        }
        assert_eq!(
            bare["spec"]["containers"][0]["volumeMounts"]
                .as_array()
                .unwrap()
                .len(),
            5
        );
        // controllers
        let rs = named(&twin, "ReplicaSet", "web-5d8f");
        assert_eq!(rs["spec"]["replicas"], 2);
        assert_eq!(
            rs["spec"]["template"]["metadata"]["labels"]["app"], "web",
            "the labels its pods share"
        );
        assert!(
            rs["spec"]["template"]["metadata"]["labels"]
                .get("zone")
                .is_none()
        );
        assert_eq!(named(&twin, "StatefulSet", "db")["spec"]["replicas"], 1);
        let ds = named(&twin, "DaemonSet", "proxy");
        assert_eq!(ds["metadata"]["namespace"], "kube-system");
        assert_eq!(
            ds["spec"]["template"]["spec"]["tolerations"],
            json!([{"operator": "Exists"}])
        );
        let ds_labels = &ds["spec"]["template"]["metadata"]["labels"];
        assert_eq!(ds_labels["app"], "proxy");
        assert!(
            ds_labels.get("controller-revision-hash").is_none(),
            "the DaemonSet controller stamps its own"
        );
        // namespaces: only those the apiserver does not start with
        let namespaces: Vec<&str> = objects_of(&twin, "Namespace")
            .iter()
            .map(|n| n["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(namespaces, ["shop"]);
        assert!(
            twin.limits
                .iter()
                .any(|l| l.contains("w-9") && l.contains("(unscheduled)")),
            "{:?}",
            twin.limits
        );
        assert!(
            twin.limits
                .iter()
                .any(|l| l.contains("owned by a StatefulSet")),
            "{:?}",
            twin.limits
        );
    }

    #[test]
    fn each_budget_selects_exactly_its_census_members_with_the_same_spec() {
        let c = census();
        let twin = build(&observed(), Some(&c), QUICK);
        for budget in &c.pdbs {
            let pdb = named(&twin, "PodDisruptionBudget", &budget.name);
            assert_eq!(pdb["metadata"]["namespace"], budget.namespace.as_str());
            let selector = pdb["spec"]["selector"]["matchLabels"].as_object().unwrap();
            assert_eq!(selector.len(), 1, "{pdb}");
            let (key, value) = selector.iter().next().unwrap();
            assert!(key.starts_with(PDB_LABEL_PREFIX), "{key}");
            let mut members: Vec<String> = objects_of(&twin, "Pod")
                .iter()
                .filter(|p| {
                    p["metadata"]["namespace"] == budget.namespace.as_str()
                        && p["metadata"]["labels"].get(key) == Some(value)
                })
                .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
                .collect();
            members.sort();
            assert_eq!(members, budget.pods, "{}", budget.name);
        }
        let web = named(&twin, "PodDisruptionBudget", "web");
        assert_eq!(web["spec"]["minAvailable"], 1, "an int stays an int");
        assert!(web["spec"].get("maxUnavailable").is_none());
        let db = named(&twin, "PodDisruptionBudget", "db");
        assert_eq!(db["spec"]["maxUnavailable"], "50%");
        assert!(db["spec"].get("minAvailable").is_none());
        // a ReplicaSet all of whose pods are members carries the label into its replacements
        let rs = named(&twin, "ReplicaSet", "web-5d8f");
        let key = web["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap()
            .keys()
            .next()
            .unwrap();
        assert_eq!(rs["spec"]["template"]["metadata"]["labels"][key], "member");
    }

    #[test]
    fn without_a_census_the_twin_has_its_nodes_only_and_says_so() {
        let twin = build(&observed(), None, QUICK);
        assert_eq!(twin.scenario.nodes.len(), 3);
        assert!(twin.objects.is_empty());
        assert!(
            twin.limits.iter().any(|l| l.starts_with("no census")),
            "{:?}",
            twin.limits
        );
    }

    #[test]
    fn a_cut_or_partial_census_and_csi_attachments_are_said_in_the_limits() {
        let mut c = census();
        c.truncated = vec!["pods: 23112 seen, 20000 kept".into()];
        c.gather_errors
            .insert("podDisruptionBudgets".into(), "403 forbidden".into());
        c.attachments
            .insert("w-1".into(), vec!["pv-a".into(), "pv-b".into()]);
        let twin = build(&observed(), Some(&c), QUICK);
        for expected in [
            "the census was cut: pods: 23112 seen, 20000 kept",
            "the census could not read podDisruptionBudgets (403 forbidden): the twin has none",
            "2 CSI volume attachment(s) are not modelled: the twin's drains wait for no volume to detach",
        ] {
            assert!(
                twin.limits.iter().any(|l| l == expected),
                "{expected}: {:?}",
                twin.limits
            );
        }
    }
}
