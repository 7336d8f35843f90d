//! The simulated cluster behind the apiserver: a "kubelet" that derives Nodes and mirror pods
//! from the Talos side, a scheduler, DaemonSet/Deployment/ReplicaSet controllers, a
//! disruption controller (PDB status) and the eviction subresource's PDB check.
//!
//! Everything here is synchronous and takes the time as arguments (`now` for delays,
//! `wall` for timestamps); the server calls [`Cluster::reconcile`] before every request and
//! from a background tick, so observable state is always converged for the current time.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus,
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, Pod, PodCondition, PodSpec, PodStatus, PodTemplateSpec, Taint, Toleration,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::resources::{
    self, DAEMONSETS, DEPLOYMENTS, NODES, PDBS, PODS, REPLICASETS, ResourceType,
};
use super::status::ApiError;
use super::store::{ObjKey, Store, k8s_time, name_of, ns_of, uid_of};
use super::{KubeCounters, KubeFault, Outage};
use crate::k8s::selector::selects;
use crate::sim::node::{NodeFacts, NodeSource};

/// The annotation that marks a mirror pod (the API view of a static pod).
pub(crate) const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Talos' `AnnotationStaticPodConfigVersion` (siderolabs/talos `pkg/machinery/constants`).
const CONFIG_VERSION_ANNOTATION: &str = "talos.dev/config-version";
const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
const TAINT_CONTROL_PLANE: &str = "node-role.kubernetes.io/control-plane";
const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";

/// How long simulated pods take to start and to terminate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub start: Duration,
    pub termination: Duration,
}

/// What the kube side owns about a node (the rest comes from [`NodeFacts`]).
#[derive(Debug, Clone, PartialEq)]
struct NodeOverlay {
    unschedulable: bool,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    taints: Vec<Taint>,
    boot: u64,
    last_up: bool,
    ready_status: &'static str,
    ready_since: jiff::Timestamp,
    cordoned_since: Option<jiff::Timestamp>,
}

#[derive(Debug, Clone, Copy)]
struct PodTimer {
    /// When the pod may start; cleared once it has.
    ready_at: Option<Instant>,
    remove_at: Option<Instant>,
}

/// A node as the scheduler and controllers see it.
#[derive(Debug, Clone)]
struct NodeView {
    name: String,
    address: String,
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    ready: bool,
}

/// A pod a controller wants: bound to `node` (DaemonSets) or left for the scheduler.
struct NewPod<'a> {
    ns: &'a str,
    /// Name prefix; a random suffix is appended.
    base: &'a str,
    template: &'a PodTemplateSpec,
    owner: OwnerReference,
    node: Option<&'a str>,
    extra_labels: BTreeMap<String, String>,
    extra_tolerations: Vec<Toleration>,
}

/// An active fault.
#[derive(Debug, Clone)]
pub(crate) enum Active {
    PdbNeverAllows { namespace: String, pdb: String },
    ApiUnavailableRequests(u32),
    ApiUnavailableUntil(Instant),
    NodeNeverReady(String),
    Forbidden(super::Forbidden),
}

/// What the DaemonSet controller reads of one of its pods.
struct DsPod {
    ns: String,
    name: String,
    node: String,
    terminating: bool,
    /// Labelled with the DaemonSet template's current hash.
    current: bool,
}

/// What a reconcile pass that changed nothing saw (see [`Cluster::reconcile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Settled {
    fingerprint: u64,
    resource_version: u64,
    inputs: u64,
    /// The earliest timer after the pass: when it is due, a pass may change something.
    due: Option<Instant>,
}

pub(crate) struct Cluster {
    pub store: Store,
    source: Arc<dyn NodeSource>,
    timing: Timing,
    overlays: BTreeMap<String, NodeOverlay>,
    /// What each stored Node was last derived from, and the resourceVersion it got: a node
    /// whose facts, overlay and stored object are unchanged is not derived again.
    derived: HashMap<String, (NodeFacts, NodeOverlay, String)>,
    timers: HashMap<String, PodTimer>,
    mirror_versions: BTreeMap<(String, String), (String, u64)>,
    faults: Vec<Active>,
    pub counters: KubeCounters,
    /// Bumped whenever an input of [`Cluster::reconcile`] that lives outside the store and
    /// the node source changes (faults, timing).
    inputs: u64,
    /// The inputs of the last reconcile pass that changed nothing: while they hold, a pass
    /// would change nothing either and is skipped.
    settled: Option<Settled>,
    /// Server-side apply: field manager → owned configuration, per object.
    pub owners: HashMap<ObjKey, BTreeMap<String, Value>>,
    /// The managers of `owners` whose last write was an `Update` (create, replace, patch),
    /// per object; the others applied (`operation: Apply`).
    pub updaters: HashMap<ObjKey, BTreeSet<String>>,
    /// (node, static pod component) whose current image crash-loops (a Talos-side fault):
    /// the kubelet keeps its mirror pod Running but never Ready (`CrashLoopBackOff`).
    crash_looping: HashSet<(String, String)>,
    names: u64,
    seed: u64,
}

fn to_value<T: serde::Serialize>(t: &T) -> Value {
    serde_json::to_value(t).expect("k8s-openapi types serialize")
}

fn from_value<T: serde::de::DeserializeOwned>(v: &Value) -> Option<T> {
    serde_json::from_value(v.clone()).ok()
}

fn short_hash(v: &Value, len: usize) -> String {
    let digest = Sha256::digest(v.to_string().as_bytes());
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    digest
        .iter()
        .take(len)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

fn condition(kind: &str, status: bool, since: &str) -> PodCondition {
    PodCondition {
        type_: kind.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        last_transition_time: Some(Time(since.parse().expect("k8s_time output parses"))),
        ..PodCondition::default()
    }
}

fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| {
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == taint.effect);
        let op = t.operator.as_deref().unwrap_or("Equal");
        let key_ok = match (op, t.key.as_deref()) {
            ("Exists", None | Some("")) => true,
            ("Exists", Some(k)) => k == taint.key,
            (_, Some(k)) => {
                k == taint.key
                    && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
            }
            _ => false,
        };
        effect_ok && key_ok
    })
}

fn pod_tolerations(pod: &Value) -> Vec<Toleration> {
    pod.pointer("/spec/tolerations")
        .and_then(|t| serde_json::from_value(t.clone()).ok())
        .unwrap_or_default()
}

/// Whether a pod with these tolerations/nodeSelector may be placed on the node.
fn can_schedule(
    tolerations: &[Toleration],
    node_selector: &BTreeMap<String, String>,
    node: &NodeView,
) -> bool {
    node.taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| tolerates(tolerations, t))
        && node_selector
            .iter()
            .all(|(k, v)| node.labels.get(k) == Some(v))
}

/// Whether a pod already on the node may stay (NoExecute taints only).
fn can_stay(tolerations: &[Toleration], node: &NodeView) -> bool {
    node.taints
        .iter()
        .filter(|t| t.effect == "NoExecute")
        .all(|t| tolerates(tolerations, t))
}

fn is_terminating(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp").is_some()
}

fn phase(pod: &Value) -> &str {
    pod.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn node_name(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn is_mirror(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
}

/// The controller owner reference of an object: `(kind, name, uid)`.
pub(crate) fn controller_of(obj: &Value) -> Option<(String, String, String)> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r["controller"] == true)
        .map(|r| {
            (
                r["kind"].as_str().unwrap_or("").to_string(),
                r["name"].as_str().unwrap_or("").to_string(),
                r["uid"].as_str().unwrap_or("").to_string(),
            )
        })
}

fn owner_ref(rt: &ResourceType, obj: &Value) -> OwnerReference {
    OwnerReference {
        api_version: rt.api_version(),
        kind: rt.kind.to_string(),
        name: name_of(obj).to_string(),
        uid: uid_of(obj).to_string(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The tolerations the DaemonSet controller adds to every DaemonSet pod.
fn daemonset_tolerations() -> Vec<Toleration> {
    let t = |key: &str, effect: &str| Toleration {
        key: Some(key.to_string()),
        operator: Some("Exists".into()),
        effect: Some(effect.to_string()),
        ..Toleration::default()
    };
    vec![
        t(TAINT_NOT_READY, "NoExecute"),
        t(TAINT_UNREACHABLE, "NoExecute"),
        t("node.kubernetes.io/disk-pressure", "NoSchedule"),
        t("node.kubernetes.io/memory-pressure", "NoSchedule"),
        t("node.kubernetes.io/pid-pressure", "NoSchedule"),
        t(TAINT_UNSCHEDULABLE, "NoSchedule"),
    ]
}

/// The numbers a PodDisruptionBudget decides with (the disruption controller's status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PdbCalc {
    pub expected: i32,
    pub current_healthy: i32,
    pub desired_healthy: i32,
    pub disruptions_allowed: i32,
}

fn scaled(v: &IntOrString, total: i32, round_up: bool) -> i32 {
    match v {
        IntOrString::Int(i) => *i,
        IntOrString::String(s) => {
            let pct: f64 = s.trim_end_matches('%').parse().unwrap_or(0.0);
            let x = pct * f64::from(total) / 100.0;
            (if round_up { x.ceil() } else { x.floor() }) as i32
        }
    }
}

impl Cluster {
    pub fn new(source: Arc<dyn NodeSource>, timing: Timing, seed: u64) -> Cluster {
        Cluster {
            store: Store::new(seed),
            source,
            timing,
            overlays: BTreeMap::new(),
            derived: HashMap::new(),
            timers: HashMap::new(),
            mirror_versions: BTreeMap::new(),
            faults: Vec::new(),
            counters: KubeCounters::default(),
            inputs: 0,
            settled: None,
            owners: HashMap::new(),
            updaters: HashMap::new(),
            crash_looping: HashSet::new(),
            names: 0,
            seed,
        }
    }

    pub fn set_timing(&mut self, timing: Timing) {
        self.timing = timing;
        self.inputs += 1;
    }

    /// Remove every fault.
    pub fn clear_faults(&mut self) {
        self.faults.clear();
        self.inputs += 1;
    }

    pub fn inject(&mut self, fault: KubeFault, now: Instant) {
        self.inputs += 1;
        self.faults.push(match fault {
            KubeFault::PdbNeverAllows { namespace, pdb } => {
                Active::PdbNeverAllows { namespace, pdb }
            }
            KubeFault::ApiUnavailable(Outage::Requests(n)) => Active::ApiUnavailableRequests(n),
            KubeFault::ApiUnavailable(Outage::For(d)) => Active::ApiUnavailableUntil(now + d),
            KubeFault::NodeNeverReady { node } => Active::NodeNeverReady(node),
            KubeFault::Forbidden(rule) => Active::Forbidden(rule),
        });
    }

    /// Whether an RBAC fault forbids `verb` on `group`/`resource`[/`subresource`].
    pub fn forbids(&self, verb: &str, group: &str, resource: &str, subresource: &str) -> bool {
        self.faults.iter().any(|f| {
            matches!(f, Active::Forbidden(rule) if rule.matches(verb, group, resource, subresource))
        })
    }

    /// Whether this request is refused because the apiserver is "down"; consumes one
    /// request of a counted outage.
    pub fn take_unavailable(&mut self, now: Instant) -> bool {
        self.faults.retain(|f| match f {
            Active::ApiUnavailableRequests(0) => false,
            Active::ApiUnavailableUntil(t) => *t > now,
            _ => true,
        });
        for f in &mut self.faults {
            match f {
                Active::ApiUnavailableRequests(n) => {
                    *n -= 1;
                    return true;
                }
                Active::ApiUnavailableUntil(_) => return true,
                _ => {}
            }
        }
        false
    }

    fn never_ready(&self, node: &str) -> bool {
        self.faults
            .iter()
            .any(|f| matches!(f, Active::NodeNeverReady(n) if n == node))
    }

    fn pdb_never_allows(&self, ns: &str, name: &str) -> bool {
        self.faults.iter().any(
            |f| matches!(f, Active::PdbNeverAllows { namespace, pdb } if namespace == ns && pdb == name),
        )
    }

    fn next_name(&mut self, base: &str) -> String {
        self.names += 1;
        let suffix = short_hash(&json!([self.seed, self.names]), 5);
        format!("{base}-{suffix}")
    }

    /// The earliest timer still in the future (pod start or removal), for the background
    /// tick. Timers that are due are consumed by [`Cluster::reconcile`].
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        self.timers
            .values()
            .flat_map(|t| [t.ready_at, t.remove_at])
            .flatten()
            .filter(|t| *t > now)
            .min()
    }

    // ---------------------------------------------------------------- reconcile

    /// Converge everything for the current time.
    ///
    /// A pass reads the store, the node source, the faults and the timers; when a pass changed
    /// nothing (no store write) those inputs are remembered, and the next call skips the pass
    /// while they are unchanged (same store resourceVersion, same node-source fingerprint, no
    /// fault or timing change, no timer due): a pass would be a no-op again. This keeps reads
    /// O(1) in the cluster size instead of re-deriving every node and pod per request.
    pub fn reconcile(&mut self, now: Instant, wall: jiff::Timestamp) {
        let fingerprint = self.source.fingerprint();
        if let (Some(fp), Some(s)) = (fingerprint, self.settled)
            && s.fingerprint == fp
            && s.resource_version == self.store.resource_version()
            && s.inputs == self.inputs
            && s.due.is_none_or(|d| now < d)
        {
            return;
        }
        let before = self.store.resource_version();
        self.counters.reconciles += 1;
        self.pass(now, wall);
        let resource_version = self.store.resource_version();
        self.settled = match fingerprint {
            Some(fp) if resource_version == before && self.source.fingerprint() == Some(fp) => {
                Some(Settled {
                    fingerprint: fp,
                    resource_version,
                    inputs: self.inputs,
                    due: self.next_due(now),
                })
            }
            _ => None,
        };
    }

    fn pass(&mut self, now: Instant, wall: jiff::Timestamp) {
        self.take_unavailable_expiry(now);
        self.remove_due(now);
        self.sync_nodes(wall);
        let nodes = self.node_views();
        self.sync_mirror_pods(&nodes, now, wall);
        self.daemonsets(&nodes, now, wall);
        self.deployments(wall);
        self.replicasets(now, wall);
        self.schedule(&nodes, now, wall);
        self.kubelet(&nodes, now, wall);
        self.statuses(wall);
        let live: BTreeSet<String> = self
            .store
            .list(&PODS, None)
            .map(|p| uid_of(p).to_string())
            .collect();
        self.timers.retain(|uid, _| live.contains(uid));
    }

    fn take_unavailable_expiry(&mut self, now: Instant) {
        self.faults.retain(|f| match f {
            Active::ApiUnavailableUntil(t) => *t > now,
            Active::ApiUnavailableRequests(n) => *n > 0,
            _ => true,
        });
    }

    fn remove_due(&mut self, now: Instant) {
        let due: Vec<String> = self
            .timers
            .iter()
            .filter(|(_, t)| t.remove_at.is_some_and(|r| r <= now))
            .map(|(uid, _)| uid.clone())
            .collect();
        if due.is_empty() {
            return;
        }
        let pods = self.store.list_owned(&PODS, None);
        for pod in pods {
            if due.iter().any(|u| u == uid_of(&pod)) {
                self.store.delete(&PODS, ns_of(&pod), name_of(&pod));
            }
        }
        for uid in due {
            self.timers.remove(&uid);
        }
    }

    fn sync_nodes(&mut self, wall: jiff::Timestamp) {
        let facts = self.source.nodes();
        let names: BTreeSet<&str> = facts.iter().map(|f| f.name.as_str()).collect();
        for stale in self
            .store
            .list(&NODES, None)
            .map(|n| name_of(n).to_string())
            .filter(|n| !names.contains(n.as_str()))
            .collect::<Vec<_>>()
        {
            self.store.delete(&NODES, "", &stale);
            self.overlays.remove(&stale);
            self.derived.remove(&stale);
        }
        for f in &facts {
            let never_ready = self.never_ready(&f.name);
            let overlay = self
                .overlays
                .entry(f.name.clone())
                .or_insert_with(|| NodeOverlay {
                    unschedulable: false,
                    labels: BTreeMap::new(),
                    annotations: BTreeMap::new(),
                    taints: Vec::new(),
                    boot: 1,
                    last_up: f.up,
                    ready_status: "",
                    ready_since: wall,
                    cordoned_since: None,
                });
            if f.up && !overlay.last_up {
                overlay.boot += 1;
            }
            overlay.last_up = f.up;
            let status = if !f.up {
                "Unknown"
            } else if never_ready {
                "False"
            } else {
                "True"
            };
            if status != overlay.ready_status {
                overlay.ready_status = status;
                overlay.ready_since = wall;
            }
            let stored_rv = self
                .store
                .get(&NODES, "", &f.name)
                .and_then(|n| n.pointer("/metadata/resourceVersion"))
                .and_then(Value::as_str);
            if let Some((facts, seen, rv)) = self.derived.get(&f.name)
                && facts == f
                && seen == overlay
                && stored_rv == Some(rv.as_str())
            {
                continue;
            }
            let node = derive_node(f, overlay);
            let stored = self.store.put(&NODES, to_value(&node), wall);
            let rv = stored
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            self.derived
                .insert(f.name.clone(), (f.clone(), overlay.clone(), rv));
        }
    }

    fn node_views(&self) -> Vec<NodeView> {
        self.store
            .list(&NODES, None)
            .filter_map(from_value::<Node>)
            .map(|n| {
                let status = n.status.unwrap_or_default();
                NodeView {
                    name: n.metadata.name.unwrap_or_default(),
                    address: status
                        .addresses
                        .unwrap_or_default()
                        .into_iter()
                        .find(|a| a.type_ == "InternalIP")
                        .map(|a| a.address)
                        .unwrap_or_default(),
                    labels: n.metadata.labels.unwrap_or_default(),
                    taints: n.spec.unwrap_or_default().taints.unwrap_or_default(),
                    ready: status
                        .conditions
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True"),
                }
            })
            .collect()
    }

    /// Apply a client's change to a node: only the kube-owned fields are taken.
    pub fn patch_node(
        &mut self,
        name: &str,
        patched: &Value,
        wall: jiff::Timestamp,
    ) -> Result<Value, ApiError> {
        let Some(overlay) = self.overlays.get_mut(name) else {
            return Err(ApiError::not_found(&NODES, name));
        };
        let node: Node = serde_json::from_value(patched.clone()).map_err(|e| {
            ApiError::bad_request(format!(
                "the patched Node `{name}` is not a valid Node: {e}"
            ))
        })?;
        let spec = node.spec.unwrap_or_default();
        let unschedulable = spec.unschedulable.unwrap_or(false);
        if unschedulable && !overlay.unschedulable {
            overlay.cordoned_since = Some(wall);
        }
        if !unschedulable {
            overlay.cordoned_since = None;
        }
        overlay.unschedulable = unschedulable;
        overlay.taints = spec
            .taints
            .unwrap_or_default()
            .into_iter()
            .filter(|t| {
                ![
                    TAINT_CONTROL_PLANE,
                    TAINT_UNSCHEDULABLE,
                    TAINT_NOT_READY,
                    TAINT_UNREACHABLE,
                ]
                .contains(&t.key.as_str())
            })
            .collect();
        let Some(facts) = self.source.node(name) else {
            return Err(ApiError::not_found(&NODES, name));
        };
        let derived = derived_labels(&facts);
        overlay.labels = node
            .metadata
            .labels
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, v)| derived.get(k) != Some(v))
            .collect();
        overlay.annotations = node.metadata.annotations.unwrap_or_default();
        self.sync_nodes(wall);
        Ok(self
            .store
            .get(&NODES, "", name)
            .cloned()
            .unwrap_or(Value::Null))
    }

    fn sync_mirror_pods(&mut self, nodes: &[NodeView], now: Instant, wall: jiff::Timestamp) {
        let mut wanted: BTreeSet<(String, String)> = BTreeSet::new();
        let present: HashSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        self.crash_looping.clear();
        for f in self.source.nodes() {
            if !present.contains(f.name.as_str()) {
                continue;
            }
            for c in &f.crash_looping {
                self.crash_looping.insert((f.name.clone(), c.clone()));
            }
            for (component, image) in &f.static_pod_images {
                let name = format!("{component}-{}", f.name);
                wanted.insert(("kube-system".to_string(), name.clone()));
                let key = (f.name.clone(), component.clone());
                let existing = self.store.get(&PODS, "kube-system", &name).cloned();
                let current_image = existing.as_ref().and_then(|p| {
                    p.pointer("/spec/containers/0/image")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                });
                let current_version = existing.as_ref().and_then(|p| {
                    p.pointer("/metadata/annotations")
                        .and_then(|a| a.get(CONFIG_VERSION_ANNOTATION))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                });
                // the config version the Talos side rendered the pod from; a source that does
                // not say (kube-side tests) counts image changes instead
                let counted = self
                    .mirror_versions
                    .get(&key)
                    .map_or(1, |(img, v)| if img == image { *v } else { v + 1 });
                let version = f
                    .static_pod_config_versions
                    .get(component)
                    .cloned()
                    .unwrap_or_else(|| counted.to_string());
                if current_image.as_deref() == Some(image.as_str())
                    && current_version.as_deref() == Some(version.as_str())
                {
                    continue;
                }
                // The static pod changed (or is new): the kubelet replaces the mirror pod.
                if existing.is_some() {
                    self.store.delete(&PODS, "kube-system", &name);
                }
                self.mirror_versions.insert(key, (image.clone(), counted));
                let pod = mirror_pod(&f, component, image, &version, &name);
                let mut value = to_value(&pod);
                value["metadata"]["ownerReferences"] = json!([{
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": f.name,
                    "uid": self.store.get(&NODES, "", &f.name).map(uid_of).unwrap_or(""),
                    "controller": true,
                }]);
                if let Ok(created) = self.store.create(&PODS, value, wall) {
                    self.timers.insert(
                        uid_of(&created).to_string(),
                        PodTimer {
                            ready_at: Some(now + self.timing.start),
                            remove_at: None,
                        },
                    );
                }
            }
        }
        let stale: Vec<String> = self
            .store
            .list(&PODS, Some("kube-system"))
            .filter(|pod| {
                is_mirror(pod)
                    && !wanted.contains(&(ns_of(pod).to_string(), name_of(pod).to_string()))
            })
            .map(|pod| name_of(pod).to_string())
            .collect();
        for name in stale {
            self.store.delete(&PODS, "kube-system", &name);
        }
    }

    /// Create a pod for a controller; bound to `node` (DaemonSets) or left for the scheduler.
    fn create_pod(&mut self, new: NewPod<'_>, now: Instant, wall: jiff::Timestamp) {
        let NewPod {
            ns,
            base,
            template,
            owner,
            node,
            extra_labels,
            extra_tolerations,
        } = new;
        let name = self.next_name(base);
        let mut meta = template.metadata.clone().unwrap_or_default();
        let mut labels = meta.labels.take().unwrap_or_default();
        labels.extend(extra_labels);
        let mut spec = template.spec.clone().unwrap_or_default();
        let mut tolerations = spec.tolerations.take().unwrap_or_default();
        tolerations.extend(extra_tolerations);
        spec.tolerations = (!tolerations.is_empty()).then_some(tolerations);
        spec.node_name = node.map(str::to_string);
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(ns.to_string()),
                labels: Some(labels),
                annotations: meta.annotations,
                owner_references: Some(vec![owner]),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                qos_class: Some("BestEffort".into()),
                ..PodStatus::default()
            }),
        };
        if let Ok(created) = self.store.create(&PODS, to_value(&pod), wall)
            && node.is_some()
        {
            self.timers.insert(
                uid_of(&created).to_string(),
                PodTimer {
                    ready_at: Some(now + self.timing.start),
                    remove_at: None,
                },
            );
        }
    }

    /// Begin deleting a pod: immediately, or after the termination delay.
    pub fn terminate(
        &mut self,
        ns: &str,
        name: &str,
        now: Instant,
        wall: jiff::Timestamp,
    ) -> Option<Value> {
        let pod = self.store.get(&PODS, ns, name)?.clone();
        if is_terminating(&pod) {
            return Some(pod);
        }
        let uid = uid_of(&pod).to_string();
        if self.timing.termination.is_zero() {
            self.timers.remove(&uid);
            let mut gone = self.store.delete(&PODS, ns, name)?;
            gone["metadata"]["deletionTimestamp"] = json!(k8s_time(wall));
            gone["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            return Some(gone);
        }
        let mut next = pod;
        let grace = self.timing.termination.as_secs().max(1);
        let deadline = wall
            .checked_add(jiff::SignedDuration::from_secs(grace as i64))
            .unwrap_or(wall);
        next["metadata"]["deletionTimestamp"] = json!(k8s_time(deadline));
        next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
        let timer = self.timers.entry(uid).or_insert(PodTimer {
            ready_at: None,
            remove_at: None,
        });
        timer.remove_at = Some(now + self.timing.termination);
        Some(self.store.put(&PODS, next, wall))
    }

    fn pods_owned_by(&self, uid: &str) -> Vec<Value> {
        self.store
            .list(&PODS, None)
            .filter(|p| controller_of(p).is_some_and(|(_, _, u)| u == uid))
            .cloned()
            .collect()
    }

    fn daemonsets(&mut self, nodes: &[NodeView], now: Instant, wall: jiff::Timestamp) {
        for ds_value in self.store.list_owned(&DAEMONSETS, None) {
            let Some(ds) = from_value::<DaemonSet>(&ds_value) else {
                continue;
            };
            let Some(spec) = ds.spec else { continue };
            let ns = ns_of(&ds_value).to_string();
            let name = name_of(&ds_value).to_string();
            let hash = short_hash(&to_value(&spec.template), 10);
            let owner = owner_ref(&DAEMONSETS, &ds_value);
            let mut tolerations = spec
                .template
                .spec
                .as_ref()
                .and_then(|s| s.tolerations.clone())
                .unwrap_or_default();
            tolerations.extend(daemonset_tolerations());
            let selector = spec
                .template
                .spec
                .as_ref()
                .and_then(|s| s.node_selector.clone())
                .unwrap_or_default();
            // the DaemonSet's pods, as much of them as the decisions below read
            let uid = uid_of(&ds_value);
            let pods: Vec<DsPod> = self
                .store
                .list(&PODS, None)
                .filter(|p| controller_of(p).is_some_and(|(_, _, u)| u == uid))
                .map(|p| DsPod {
                    ns: ns_of(p).to_string(),
                    name: name_of(p).to_string(),
                    node: node_name(p).to_string(),
                    terminating: is_terminating(p),
                    current: p.pointer("/metadata/labels/controller-revision-hash")
                        == Some(&json!(hash)),
                })
                .collect();
            let mut by_node: HashMap<&str, Vec<&DsPod>> = HashMap::new();
            for p in pods.iter().filter(|p| !p.terminating) {
                by_node.entry(p.node.as_str()).or_default().push(p);
            }
            for node in nodes {
                let here = by_node.remove(node.name.as_str()).unwrap_or_default();
                let stay = can_stay(&tolerations, node)
                    && selector.iter().all(|(k, v)| node.labels.get(k) == Some(v));
                let mut has_current = false;
                for p in &here {
                    if !stay || !p.current || has_current {
                        self.terminate(&p.ns, &p.name, now, wall);
                    } else {
                        has_current = true;
                    }
                }
                if !has_current && can_schedule(&tolerations, &selector, node) {
                    let labels = [
                        ("controller-revision-hash".to_string(), hash.clone()),
                        (
                            "pod-template-generation".to_string(),
                            ds_value
                                .pointer("/metadata/generation")
                                .map(|g| g.to_string())
                                .unwrap_or_else(|| "1".into()),
                        ),
                    ]
                    .into();
                    let new = NewPod {
                        ns: &ns,
                        base: &name,
                        template: &spec.template,
                        owner: owner.clone(),
                        node: Some(&node.name),
                        extra_labels: labels,
                        extra_tolerations: daemonset_tolerations(),
                    };
                    self.create_pod(new, now, wall);
                }
            }
            let present: HashSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
            for p in pods.iter().filter(|p| !present.contains(p.node.as_str())) {
                self.terminate(&p.ns, &p.name, now, wall);
            }
        }
    }

    fn deployments(&mut self, wall: jiff::Timestamp) {
        for d_value in self.store.list_owned(&DEPLOYMENTS, None) {
            let Some(d) = from_value::<Deployment>(&d_value) else {
                continue;
            };
            let Some(spec) = d.spec else { continue };
            let ns = ns_of(&d_value).to_string();
            let hash = short_hash(&to_value(&spec.template), 10);
            let rs_name = format!("{}-{hash}", name_of(&d_value));
            let mut template = spec.template.clone();
            let mut meta = template.metadata.take().unwrap_or_default();
            meta.labels
                .get_or_insert_with(BTreeMap::new)
                .insert("pod-template-hash".into(), hash.clone());
            template.metadata = Some(meta);
            let mut selector = spec.selector.clone();
            selector
                .match_labels
                .get_or_insert_with(BTreeMap::new)
                .insert("pod-template-hash".into(), hash.clone());
            let owner = owner_ref(&DEPLOYMENTS, &d_value);
            let mut labels = spec
                .template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.clone())
                .unwrap_or_default();
            labels.insert("pod-template-hash".into(), hash.clone());
            let rs = ReplicaSet {
                metadata: ObjectMeta {
                    name: Some(rs_name.clone()),
                    namespace: Some(ns.clone()),
                    labels: Some(labels),
                    owner_references: Some(vec![owner]),
                    ..ObjectMeta::default()
                },
                spec: Some(k8s_openapi::api::apps::v1::ReplicaSetSpec {
                    replicas: Some(spec.replicas.unwrap_or(1)),
                    selector,
                    template: Some(template),
                    min_ready_seconds: None,
                }),
                status: None,
            };
            let mut rs_value = to_value(&rs);
            if let Some(old) = self.store.get(&REPLICASETS, &ns, &rs_name) {
                rs_value["status"] = old.get("status").cloned().unwrap_or(Value::Null);
                if rs_value["status"].is_null() {
                    rs_value.as_object_mut().map(|m| m.remove("status"));
                }
            } else {
                rs_value.as_object_mut().map(|m| m.remove("status"));
            }
            self.store.put(&REPLICASETS, rs_value, wall);
            // Older ReplicaSets of this Deployment scale to zero (Recreate-like rollout).
            for old in self.store.list_owned(&REPLICASETS, Some(&ns)) {
                let owned = controller_of(&old).is_some_and(|(_, _, u)| u == uid_of(&d_value));
                if owned
                    && name_of(&old) != rs_name
                    && old.pointer("/spec/replicas") != Some(&json!(0))
                {
                    let mut scaled = old.clone();
                    scaled["spec"]["replicas"] = json!(0);
                    self.store.put(&REPLICASETS, scaled, wall);
                }
            }
        }
    }

    fn replicasets(&mut self, now: Instant, wall: jiff::Timestamp) {
        for rs_value in self.store.list_owned(&REPLICASETS, None) {
            let Some(rs) = from_value::<ReplicaSet>(&rs_value) else {
                continue;
            };
            let Some(spec) = rs.spec else { continue };
            let Some(template) = spec.template else {
                continue;
            };
            let want = spec.replicas.unwrap_or(1).max(0) as usize;
            let active: Vec<Value> = self
                .pods_owned_by(uid_of(&rs_value))
                .into_iter()
                .filter(|p| !is_terminating(p) && !matches!(phase(p), "Succeeded" | "Failed"))
                .collect();
            let ns = ns_of(&rs_value).to_string();
            if active.len() < want {
                let owner = owner_ref(&REPLICASETS, &rs_value);
                for _ in active.len()..want {
                    let new = NewPod {
                        ns: &ns,
                        base: name_of(&rs_value),
                        template: &template,
                        owner: owner.clone(),
                        node: None,
                        extra_labels: BTreeMap::new(),
                        extra_tolerations: Vec::new(),
                    };
                    self.create_pod(new, now, wall);
                }
            } else if active.len() > want {
                // Scale down: unscheduled first, then not ready, then newest.
                let excess = active.len() - want;
                let mut victims = active;
                victims.sort_by_key(|p| {
                    let created = p
                        .pointer("/metadata/creationTimestamp")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    (
                        !node_name(p).is_empty(),
                        pod_ready(p),
                        std::cmp::Reverse(created),
                    )
                });
                for p in victims.into_iter().take(excess) {
                    self.terminate(ns_of(&p), name_of(&p), now, wall);
                }
            }
        }
    }

    fn schedule(&mut self, nodes: &[NodeView], now: Instant, wall: jiff::Timestamp) {
        let pending: Vec<Value> = self
            .store
            .list(&PODS, None)
            .filter(|p| {
                node_name(p).is_empty()
                    && !is_terminating(p)
                    && !matches!(phase(p), "Succeeded" | "Failed")
            })
            .cloned()
            .collect();
        if pending.is_empty() {
            return;
        }
        // per node: pods bound to it (not terminating), and how many of each controller
        let mut load: HashMap<String, (usize, HashMap<String, usize>)> = HashMap::new();
        for p in self
            .store
            .list(&PODS, None)
            .filter(|p| !node_name(p).is_empty() && !is_terminating(p))
        {
            let l = load.entry(node_name(p).to_string()).or_default();
            l.0 += 1;
            if let Some((_, _, u)) = controller_of(p) {
                *l.1.entry(u).or_default() += 1;
            }
        }
        for pod in &pending {
            let tolerations = pod_tolerations(pod);
            let selector: BTreeMap<String, String> = pod
                .pointer("/spec/nodeSelector")
                .and_then(|s| serde_json::from_value(s.clone()).ok())
                .unwrap_or_default();
            let owner = controller_of(pod).map(|(_, _, u)| u);
            let choice = nodes
                .iter()
                .filter(|n| can_schedule(&tolerations, &selector, n))
                .min_by_key(|n| {
                    let (total, same) = load.get(&n.name).map_or((0, 0), |(total, by)| {
                        (
                            *total,
                            owner.as_ref().and_then(|o| by.get(o)).copied().unwrap_or(0),
                        )
                    });
                    (same, total, n.name.clone())
                });
            let mut next = pod.clone();
            match choice {
                Some(node) => {
                    let l = load.entry(node.name.clone()).or_default();
                    l.0 += 1;
                    if let Some(o) = &owner {
                        *l.1.entry(o.clone()).or_default() += 1;
                    }
                    next["spec"]["nodeName"] = json!(node.name);
                    next["status"]["hostIP"] = json!(node.address);
                    next["status"]["conditions"] =
                        json!([to_value(&condition("PodScheduled", true, &k8s_time(wall)))]);
                    let stored = self.store.put(&PODS, next, wall);
                    self.timers.insert(
                        uid_of(&stored).to_string(),
                        PodTimer {
                            ready_at: Some(now + self.timing.start),
                            remove_at: None,
                        },
                    );
                }
                None => {
                    let already =
                        pod.pointer("/status/conditions/0/reason") == Some(&json!("Unschedulable"));
                    if !already {
                        let mut c = condition("PodScheduled", false, &k8s_time(wall));
                        c.reason = Some("Unschedulable".into());
                        c.message = Some(format!(
                            "0/{} nodes are available: no node is Ready, schedulable and free of untolerated taints.",
                            nodes.len()
                        ));
                        next["status"]["conditions"] = json!([to_value(&c)]);
                        self.store.put(&PODS, next, wall);
                    }
                }
            }
        }
    }

    fn kubelet(&mut self, nodes: &[NodeView], now: Instant, wall: jiff::Timestamp) {
        let by_name: HashMap<&str, &NodeView> =
            nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        // Decide over the pods as they are, then write: each pod's decision reads only itself
        // and its own timer.
        let mut gone: Vec<(String, String)> = Vec::new();
        let mut started_uids: Vec<String> = Vec::new();
        let mut updated: Vec<Value> = Vec::new();
        for pod in self.store.list(&PODS, None) {
            let node = node_name(pod);
            if node.is_empty()
                || is_terminating(pod)
                || matches!(phase(pod), "Succeeded" | "Failed")
            {
                continue;
            }
            let Some(view) = by_name.get(node).copied() else {
                // The node is gone: pod garbage collection.
                gone.push((ns_of(pod).to_string(), name_of(pod).to_string()));
                continue;
            };
            let timer = self.timers.get(uid_of(pod));
            let started = phase(pod) == "Running"
                || (view.ready && timer.is_none_or(|t| t.ready_at.is_none_or(|r| r <= now)));
            let crash = is_mirror(pod)
                && pod
                    .pointer("/metadata/labels/k8s-app")
                    .and_then(Value::as_str)
                    .is_some_and(|c| {
                        self.crash_looping
                            .contains(&(node.to_string(), c.to_string()))
                    });
            let ready = started && view.ready && !crash;
            if started && timer.is_some() {
                started_uids.push(uid_of(pod).to_string());
            }
            let was_running = phase(pod) == "Running";
            let has_status = pod.pointer("/status/containerStatuses").is_some();
            if has_status && was_running == started && pod_ready(pod) == ready {
                continue;
            }
            let status = pod_status(pod, view, started, ready, crash, &k8s_time(wall));
            let mut next = pod.clone();
            next["status"] = to_value(&status);
            updated.push(next);
        }
        for uid in started_uids {
            if let Some(t) = self.timers.get_mut(&uid) {
                t.ready_at = None;
                if t.remove_at.is_none() {
                    self.timers.remove(&uid);
                }
            }
        }
        for (ns, name) in gone {
            self.store.delete(&PODS, &ns, &name);
        }
        for next in updated {
            self.store.put(&PODS, next, wall);
        }
    }

    fn statuses(&mut self, wall: jiff::Timestamp) {
        let mut writes: Vec<(&'static ResourceType, Value, Value)> = Vec::new();
        // pods (not terminating) by controller uid, borrowed from the store
        let mut by_owner: HashMap<String, Vec<&Value>> = HashMap::new();
        for p in self.store.list(&PODS, None).filter(|p| !is_terminating(p)) {
            if let Some((_, _, uid)) = controller_of(p) {
                by_owner.entry(uid).or_default().push(p);
            }
        }
        let no_pods: Vec<&Value> = Vec::new();
        let nodes = self.node_views();
        for ds_value in self.store.list_owned(&DAEMONSETS, None) {
            let Some(ds) = from_value::<DaemonSet>(&ds_value) else {
                continue;
            };
            let Some(spec) = ds.spec else { continue };
            let hash = short_hash(&to_value(&spec.template), 10);
            let mut tolerations = spec
                .template
                .spec
                .as_ref()
                .and_then(|s| s.tolerations.clone())
                .unwrap_or_default();
            tolerations.extend(daemonset_tolerations());
            let selector = spec
                .template
                .spec
                .as_ref()
                .and_then(|s| s.node_selector.clone())
                .unwrap_or_default();
            let owned = by_owner.get(uid_of(&ds_value)).unwrap_or(&no_pods);
            let with_pod: HashSet<&str> = owned.iter().map(|p| node_name(p)).collect();
            let desired = nodes
                .iter()
                .filter(|n| {
                    can_schedule(&tolerations, &selector, n) || with_pod.contains(n.name.as_str())
                })
                .count();
            let scheduled = owned.len();
            let ready = owned.iter().filter(|p| pod_ready(p)).count();
            let updated = owned
                .iter()
                .filter(|p| {
                    p.pointer("/metadata/labels/controller-revision-hash") == Some(&json!(hash))
                })
                .count();
            let status = json!({
                "currentNumberScheduled": scheduled,
                "desiredNumberScheduled": desired,
                "numberMisscheduled": 0,
                "numberReady": ready,
                "numberAvailable": ready,
                "numberUnavailable": desired.saturating_sub(ready),
                "updatedNumberScheduled": updated,
                "observedGeneration": ds_value.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
            });
            writes.push((&DAEMONSETS, ds_value, status));
        }
        for rs_value in self.store.list_owned(&REPLICASETS, None) {
            let owned = by_owner.get(uid_of(&rs_value)).unwrap_or(&no_pods);
            let ready = owned.iter().filter(|p| pod_ready(p)).count();
            let status = json!({
                "replicas": owned.len(),
                "fullyLabeledReplicas": owned.len(),
                "readyReplicas": ready,
                "availableReplicas": ready,
                "observedGeneration": rs_value.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
            });
            writes.push((&REPLICASETS, rs_value, status));
        }
        drop(by_owner);
        for (rt, obj, status) in writes {
            self.put_status(rt, &obj, status, wall);
        }
        let replicasets = self.store.list_owned(&REPLICASETS, None);
        for d_value in self.store.list_owned(&DEPLOYMENTS, None) {
            let Some(d) = from_value::<Deployment>(&d_value) else {
                continue;
            };
            let Some(spec) = d.spec else { continue };
            let hash = short_hash(&to_value(&spec.template), 10);
            let current_rs = format!("{}-{hash}", name_of(&d_value));
            let mut replicas = 0;
            let mut ready = 0;
            let mut updated = 0;
            for rs in replicasets
                .iter()
                .filter(|rs| controller_of(rs).is_some_and(|(_, _, u)| u == uid_of(&d_value)))
            {
                let n = rs
                    .pointer("/status/replicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                replicas += n;
                ready += rs
                    .pointer("/status/readyReplicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                if name_of(rs) == current_rs {
                    updated += n;
                }
            }
            let want = i64::from(spec.replicas.unwrap_or(1));
            let available = ready >= want;
            let status = json!({
                "replicas": replicas,
                "updatedReplicas": updated,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "unavailableReplicas": (want - ready).max(0),
                "observedGeneration": d_value.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
                "conditions": [{
                    "type": "Available",
                    "status": if available { "True" } else { "False" },
                    "reason": if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
                    "message": if available { "Deployment has minimum availability." } else { "Deployment does not have minimum availability." },
                }],
            });
            self.put_status(&DEPLOYMENTS, &d_value, status, wall);
        }
        for pdb_value in self.store.list_owned(&PDBS, None) {
            let Some(pdb) = from_value::<PodDisruptionBudget>(&pdb_value) else {
                continue;
            };
            let calc = self.pdb_calc(&pdb, ns_of(&pdb_value));
            let allowed = calc.disruptions_allowed > 0;
            let old_since = pdb_value
                .pointer("/status/conditions/0")
                .filter(|c| c["status"] == if allowed { "True" } else { "False" })
                .and_then(|c| c["lastTransitionTime"].as_str())
                .map(str::to_string);
            let since = old_since.unwrap_or_else(|| k8s_time(wall));
            let status = PodDisruptionBudgetStatus {
                current_healthy: calc.current_healthy,
                desired_healthy: calc.desired_healthy,
                disruptions_allowed: calc.disruptions_allowed,
                expected_pods: calc.expected,
                observed_generation: pdb_value
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64),
                conditions: Some(vec![Condition {
                    type_: "DisruptionAllowed".into(),
                    status: if allowed { "True" } else { "False" }.into(),
                    reason: if allowed {
                        "SufficientPods"
                    } else {
                        "InsufficientPods"
                    }
                    .into(),
                    message: String::new(),
                    observed_generation: pdb_value
                        .pointer("/metadata/generation")
                        .and_then(Value::as_i64),
                    last_transition_time: Time(since.parse().expect("k8s_time output parses")),
                }]),
                disrupted_pods: None,
            };
            self.put_status(&PDBS, &pdb_value, to_value(&status), wall);
        }
    }

    fn put_status(
        &mut self,
        rt: &'static ResourceType,
        obj: &Value,
        status: Value,
        wall: jiff::Timestamp,
    ) {
        if obj.get("status") == Some(&status) {
            return;
        }
        let mut next = obj.clone();
        next["status"] = status;
        self.store.put(rt, next, wall);
    }

    /// The disruption controller's arithmetic for one PDB.
    pub fn pdb_calc(&self, pdb: &PodDisruptionBudget, ns: &str) -> PdbCalc {
        let spec = pdb.spec.clone().unwrap_or_default();
        let pods: Vec<Value> = self
            .store
            .list(&PODS, Some(ns))
            .filter(|p| selects(spec.selector.as_ref(), &super::selector::labels_of(p)))
            .cloned()
            .collect();
        let healthy = pods
            .iter()
            .filter(|p| !is_terminating(p) && pod_ready(p))
            .count() as i32;
        // The scale of the pods' controllers (a Deployment's via its ReplicaSet).
        let mut controllers: BTreeMap<String, i32> = BTreeMap::new();
        let mut uncontrolled = 0;
        for p in &pods {
            match controller_of(p) {
                Some((kind, name, uid)) => {
                    let scale = self.controller_scale(&kind, ns, &name);
                    controllers.insert(uid, scale);
                }
                None => uncontrolled += 1,
            }
        }
        let scale_total: i32 = controllers.values().sum::<i32>() + uncontrolled;
        let (expected, desired) = match (&spec.min_available, &spec.max_unavailable) {
            (Some(IntOrString::Int(n)), _) => (pods.len() as i32, *n),
            (Some(pct @ IntOrString::String(_)), _) => {
                (scale_total, scaled(pct, scale_total, true))
            }
            (None, Some(max)) => {
                let max = scaled(max, scale_total, true);
                (scale_total, (scale_total - max).max(0))
            }
            (None, None) => (pods.len() as i32, 0),
        };
        let mut allowed = (healthy - desired).max(0);
        if self.pdb_never_allows(ns, pdb.metadata.name.as_deref().unwrap_or("")) {
            allowed = 0;
        }
        PdbCalc {
            expected,
            current_healthy: healthy,
            desired_healthy: desired,
            disruptions_allowed: allowed,
        }
    }

    fn controller_scale(&self, kind: &str, ns: &str, name: &str) -> i32 {
        match kind {
            "ReplicaSet" => {
                let Some(rs) = self.store.get(&REPLICASETS, ns, name) else {
                    return 0;
                };
                if let Some((k, dname, _)) = controller_of(rs)
                    && k == "Deployment"
                    && let Some(d) = self.store.get(&DEPLOYMENTS, ns, &dname)
                {
                    return d
                        .pointer("/spec/replicas")
                        .and_then(Value::as_i64)
                        .unwrap_or(1) as i32;
                }
                rs.pointer("/spec/replicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(1) as i32
            }
            "DaemonSet" => self
                .store
                .get(&DAEMONSETS, ns, name)
                .and_then(|d| {
                    d.pointer("/status/desiredNumberScheduled")
                        .and_then(Value::as_i64)
                })
                .unwrap_or(0) as i32,
            _ => 1,
        }
    }

    // ---------------------------------------------------------------- eviction

    /// `POST …/pods/<name>/eviction` (policy/v1), with the apiserver's PDB semantics.
    pub fn evict(
        &mut self,
        ns: &str,
        name: &str,
        now: Instant,
        wall: jiff::Timestamp,
    ) -> Result<(), ApiError> {
        let Some(pod) = self.store.get(&PODS, ns, name).cloned() else {
            return Err(ApiError::not_found(&PODS, name));
        };
        if is_terminating(&pod) {
            self.counters.evictions += 1;
            return Ok(());
        }
        if matches!(phase(&pod), "Succeeded" | "Failed" | "Pending") {
            self.counters.evictions += 1;
            self.terminate(ns, name, now, wall);
            return Ok(());
        }
        let labels = super::selector::labels_of(&pod);
        let pdbs: Vec<PodDisruptionBudget> = self
            .store
            .list(&PDBS, Some(ns))
            .filter_map(from_value::<PodDisruptionBudget>)
            .filter(|pdb| selects(pdb.spec.as_ref().and_then(|s| s.selector.as_ref()), &labels))
            .collect();
        if pdbs.len() > 1 {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
        if let Some(pdb) = pdbs.first() {
            let calc = self.pdb_calc(pdb, ns);
            let pdb_name = pdb.metadata.name.clone().unwrap_or_default();
            let never = self.pdb_never_allows(ns, &pdb_name);
            let unhealthy_ok = !pod_ready(&pod)
                && !never
                && (pdb
                    .spec
                    .as_ref()
                    .and_then(|s| s.unhealthy_pod_eviction_policy.as_deref())
                    == Some("AlwaysAllow")
                    || (calc.current_healthy >= calc.desired_healthy && calc.desired_healthy > 0));
            if !unhealthy_ok && calc.disruptions_allowed <= 0 {
                self.counters.evictions_blocked += 1;
                return Err(ApiError::disruption_budget(
                    &pdb_name,
                    calc.desired_healthy,
                    calc.current_healthy,
                ));
            }
        }
        self.counters.evictions += 1;
        self.terminate(ns, name, now, wall);
        Ok(())
    }

    /// Pods for the control handle.
    pub fn pods(&self) -> Vec<super::SimPod> {
        self.store
            .list(&PODS, None)
            .map(|p| super::SimPod {
                namespace: ns_of(p).to_string(),
                name: name_of(p).to_string(),
                node: Some(node_name(p).to_string()).filter(|n| !n.is_empty()),
                phase: phase(p).to_string(),
                ready: pod_ready(p),
                terminating: is_terminating(p),
                mirror: is_mirror(p),
                controller: controller_of(p).map(|(k, n, _)| format!("{k}/{n}")),
                image: p
                    .pointer("/spec/containers/0/image")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            })
            .collect()
    }

    /// The first control-plane node's kube-apiserver version (for `/version`).
    pub fn server_version(&self) -> String {
        let nodes = self.source.nodes();
        nodes
            .iter()
            .filter(|n| n.control_plane)
            .find_map(|n| n.static_pod_images.get("kube-apiserver"))
            .and_then(|img| img.rsplit_once(':').map(|(_, tag)| tag.to_string()))
            .or_else(|| nodes.first().map(|n| n.kubelet_version.clone()))
            .unwrap_or_else(|| "v1.33.0".to_string())
    }
}

fn derived_labels(f: &NodeFacts) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = [
        ("beta.kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/os", "linux"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    labels.insert("kubernetes.io/hostname".into(), f.name.clone());
    if f.control_plane {
        labels.insert(CONTROL_PLANE_LABEL.into(), String::new());
    }
    labels
}

fn derive_node(f: &NodeFacts, o: &NodeOverlay) -> Node {
    let mut labels = derived_labels(f);
    labels.extend(o.labels.clone());
    let mut annotations = o.annotations.clone();
    annotations.insert("node.alpha.kubernetes.io/ttl".into(), "0".into());
    let mut taints = Vec::new();
    if f.control_plane {
        taints.push(Taint {
            key: TAINT_CONTROL_PLANE.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        });
    }
    if o.unschedulable {
        taints.push(Taint {
            key: TAINT_UNSCHEDULABLE.into(),
            effect: "NoSchedule".into(),
            time_added: o.cordoned_since.map(Time),
            ..Taint::default()
        });
    }
    match o.ready_status {
        "Unknown" => {
            for effect in ["NoSchedule", "NoExecute"] {
                taints.push(Taint {
                    key: TAINT_UNREACHABLE.into(),
                    effect: effect.into(),
                    time_added: (effect == "NoExecute").then_some(Time(o.ready_since)),
                    ..Taint::default()
                });
            }
        }
        "False" => taints.push(Taint {
            key: TAINT_NOT_READY.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }),
        _ => {}
    }
    taints.extend(o.taints.clone());
    let since = Time(o.ready_since);
    let (reason, message) = match o.ready_status {
        "True" => ("KubeletReady", "kubelet is posting ready status"),
        "False" => (
            "KubeletNotReady",
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized",
        ),
        _ => ("NodeStatusUnknown", "Kubelet stopped posting node status."),
    };
    let pressure = |kind: &str, reason: &str, message: &str| NodeCondition {
        type_: kind.into(),
        status: if o.ready_status == "Unknown" {
            "Unknown"
        } else {
            "False"
        }
        .into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(since.clone()),
        last_transition_time: Some(since.clone()),
    };
    let quantity = |s: &str| Quantity(s.to_string());
    let resources: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), quantity("4")),
        ("ephemeral-storage".to_string(), quantity("40Gi")),
        ("memory".to_string(), quantity("8Gi")),
        ("pods".to_string(), quantity("110")),
    ]
    .into();
    let machine = format!("{:x}", Sha256::digest(f.name.as_bytes()));
    Node {
        metadata: ObjectMeta {
            name: Some(f.name.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            creation_timestamp: None,
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            unschedulable: o.unschedulable.then_some(true),
            taints: (!taints.is_empty()).then_some(taints),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: f.address.clone(),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: f.name.clone(),
                },
            ]),
            allocatable: Some(resources.clone()),
            capacity: Some(resources),
            conditions: Some(vec![
                pressure(
                    "MemoryPressure",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                pressure(
                    "DiskPressure",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                pressure(
                    "PIDPressure",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                NodeCondition {
                    type_: "Ready".into(),
                    status: o.ready_status.into(),
                    reason: Some(reason.into()),
                    message: Some(message.into()),
                    last_heartbeat_time: Some(since.clone()),
                    last_transition_time: Some(since),
                },
            ]),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint { port: 10250 }),
            }),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".into(),
                boot_id: format!("{}-boot-{}", &machine[..8], o.boot),
                container_runtime_version: "containerd://2.1.4".into(),
                kernel_version: "6.12.48-talos".into(),
                kube_proxy_version: String::new(),
                kubelet_version: f.kubelet_version.clone(),
                machine_id: machine[..32].to_string(),
                operating_system: "linux".into(),
                os_image: format!("Talos ({})", f.talos_version),
                system_uuid: machine[32..64].to_string(),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        }),
    }
}

fn mirror_pod(f: &NodeFacts, component: &str, image: &str, version: &str, name: &str) -> Pod {
    let hash = format!(
        "{:x}",
        Sha256::digest(format!("{}/{component}/{image}", f.name).as_bytes())
    );
    let hash = hash[..32].to_string();
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("kube-system".into()),
            labels: Some(
                [
                    ("k8s-app".to_string(), component.to_string()),
                    ("tier".to_string(), "control-plane".to_string()),
                ]
                .into(),
            ),
            annotations: Some(
                [
                    ("kubernetes.io/config.hash".to_string(), hash.clone()),
                    (MIRROR_ANNOTATION.to_string(), hash),
                    (
                        "kubernetes.io/config.source".to_string(),
                        "file".to_string(),
                    ),
                    (CONFIG_VERSION_ANNOTATION.to_string(), version.to_string()),
                    // the sim never rotates the cluster secrets
                    ("talos.dev/secrets-version".to_string(), "1".to_string()),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: component.to_string(),
                image: Some(image.to_string()),
                command: Some(vec![format!("/usr/local/bin/{component}")]),
                ..Container::default()
            }],
            host_network: Some(true),
            node_name: Some(f.name.clone()),
            priority: Some(2_000_001_000),
            priority_class_name: Some("system-node-critical".into()),
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".into()),
                ..Toleration::default()
            }]),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Pending".into()),
            host_ip: Some(f.address.clone()),
            ..PodStatus::default()
        }),
    }
}

fn pod_status(
    pod: &Value,
    node: &NodeView,
    started: bool,
    ready: bool,
    crash: bool,
    now: &str,
) -> PodStatus {
    let host_network = pod.pointer("/spec/hostNetwork") == Some(&json!(true));
    let pod_ip = if host_network {
        node.address.clone()
    } else {
        let h = Sha256::digest(uid_of(pod).as_bytes());
        format!("10.244.{}.{}", h[0], h[1].max(2))
    };
    let containers: Vec<Container> = pod
        .pointer("/spec/containers")
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default();
    let container_statuses = containers
        .iter()
        .map(|c| ContainerStatus {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            image_id: String::new(),
            container_id: started.then(|| {
                format!(
                    "containerd://{}",
                    &format!(
                        "{:x}",
                        Sha256::digest(format!("{}{}", uid_of(pod), c.name).as_bytes())
                    )[..32]
                )
            }),
            ready,
            started: Some(started),
            restart_count: if crash { 5 } else { 0 },
            state: Some(if started && crash {
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("CrashLoopBackOff".into()),
                        message: Some(format!(
                            "back-off 2m40s restarting failed container={} pod={}",
                            c.name,
                            name_of(pod)
                        )),
                    }),
                    ..ContainerState::default()
                }
            } else if started {
                ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(Time(now.parse().expect("k8s_time output parses"))),
                    }),
                    ..ContainerState::default()
                }
            } else {
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("ContainerCreating".into()),
                        message: None,
                    }),
                    ..ContainerState::default()
                }
            }),
            ..ContainerStatus::default()
        })
        .collect();
    let mut ready_condition = condition("Ready", ready, now);
    let mut containers_ready = condition("ContainersReady", ready, now);
    if !ready {
        ready_condition.reason = Some("ContainersNotReady".into());
        containers_ready.reason = Some("ContainersNotReady".into());
    }
    let qos = pod
        .pointer("/status/qosClass")
        .and_then(Value::as_str)
        .unwrap_or("BestEffort")
        .to_string();
    PodStatus {
        phase: Some(if started { "Running" } else { "Pending" }.into()),
        conditions: Some(vec![
            condition("PodReadyToStartContainers", started, now),
            condition("Initialized", true, now),
            ready_condition,
            containers_ready,
            condition("PodScheduled", true, now),
        ]),
        host_ip: Some(node.address.clone()),
        pod_ip: Some(pod_ip.clone()),
        pod_ips: Some(vec![k8s_openapi::api::core::v1::PodIP { ip: pod_ip }]),
        start_time: Some(Time(now.parse().expect("k8s_time output parses"))),
        container_statuses: Some(container_statuses),
        qos_class: Some(qos),
        ..PodStatus::default()
    }
}

/// Whether `rt` is served for `apiVersion`/`kind` (used when validating bodies).
pub(crate) fn kind_matches(rt: &ResourceType, obj: &Value) -> bool {
    let api_version = obj.get("apiVersion").and_then(Value::as_str);
    let kind = obj.get("kind").and_then(Value::as_str);
    api_version.is_none_or(|v| v == rt.api_version())
        && kind.is_none_or(|k| k == rt.kind)
        && resources::by_kind(&rt.api_version(), rt.kind).is_some()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::super::scenario;
    use super::*;

    struct Nodes(Mutex<Vec<NodeFacts>>);

    impl NodeSource for Nodes {
        fn nodes(&self) -> Vec<NodeFacts> {
            self.0.lock().unwrap().clone()
        }
    }

    fn node(name: &str, cp: bool) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            address: format!("10.0.0.{}", name.len()),
            control_plane: cp,
            up: true,
            talos_version: "v1.13.9".into(),
            kubelet_version: "v1.34.1".into(),
            static_pod_images: if cp {
                [(
                    "kube-apiserver".to_string(),
                    "registry.k8s.io/kube-apiserver:v1.34.1".to_string(),
                )]
                .into()
            } else {
                BTreeMap::new()
            },
            crash_looping: Default::default(),
            static_pod_config_versions: Default::default(),
        }
    }

    fn cluster(objects: Vec<Value>, start: Duration) -> (Cluster, Arc<Nodes>) {
        let nodes = Arc::new(Nodes(Mutex::new(vec![
            node("cp-1", true),
            node("w-1", false),
            node("w-2", false),
            node("w-3", false),
        ])));
        let mut c = Cluster::new(
            nodes.clone(),
            Timing {
                start,
                termination: Duration::ZERO,
            },
            42,
        );
        let wall = jiff::Timestamp::now();
        for o in objects {
            let rt = resources::by_kind(
                o["apiVersion"].as_str().unwrap(),
                o["kind"].as_str().unwrap(),
            )
            .unwrap();
            c.store.create(rt, o, wall).unwrap();
        }
        (c, nodes)
    }

    fn json<T: serde::Serialize>(t: &T) -> Value {
        serde_json::to_value(t).unwrap()
    }

    fn web_pods(c: &Cluster) -> Vec<super::super::SimPod> {
        c.pods()
            .into_iter()
            .filter(|p| p.name.starts_with("web-"))
            .collect()
    }

    #[test]
    fn a_pass_that_changed_nothing_is_skipped_until_an_input_changes() {
        struct Hashed(Mutex<Vec<NodeFacts>>);
        impl NodeSource for Hashed {
            fn nodes(&self) -> Vec<NodeFacts> {
                self.0.lock().unwrap().clone()
            }
            fn fingerprint(&self) -> Option<u64> {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                self.0.lock().unwrap().hash(&mut h);
                Some(h.finish())
            }
        }
        let src = Arc::new(Hashed(Mutex::new(vec![
            node("cp-1", true),
            node("w-1", false),
            node("w-2", false),
        ])));
        let start = Duration::from_secs(5);
        let mut c = Cluster::new(
            src.clone(),
            Timing {
                start,
                termination: Duration::ZERO,
            },
            42,
        );
        let wall = jiff::Timestamp::now();
        for o in scenario::default_scenario() {
            let rt = resources::by_kind(
                o["apiVersion"].as_str().unwrap(),
                o["kind"].as_str().unwrap(),
            )
            .unwrap();
            c.store.create(rt, o, wall).unwrap();
        }
        let t0 = Instant::now();
        for _ in 0..4 {
            c.reconcile(t0, wall);
        }
        let passes = c.counters.reconciles;
        let rv = c.store.resource_version();
        c.reconcile(t0, wall);
        c.reconcile(t0 + start / 2, wall);
        assert_eq!(c.counters.reconciles, passes, "nothing changed: no pass");
        assert_eq!(c.store.resource_version(), rv);
        assert!(web_pods(&c).iter().all(|p| !p.ready), "pods still starting");

        // a pod start falls due
        c.reconcile(t0 + start, wall);
        assert!(c.counters.reconciles > passes);
        assert!(web_pods(&c).iter().all(|p| p.ready), "{:#?}", web_pods(&c));

        // the node source changes
        let ready = |c: &Cluster, n: &str| {
            c.store.get(&NODES, "", n).unwrap()["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == "Ready")
                .unwrap()["status"]
                .clone()
        };
        c.reconcile(t0 + start, wall);
        let passes = c.counters.reconciles;
        c.reconcile(t0 + start, wall);
        assert_eq!(c.counters.reconciles, passes);
        src.0.lock().unwrap()[1].up = false;
        c.reconcile(t0 + start, wall);
        assert_eq!(ready(&c, "w-1"), "Unknown");

        // a fault is injected (no store write)
        c.reconcile(t0 + start, wall);
        c.inject(KubeFault::NodeNeverReady { node: "w-2".into() }, t0);
        c.reconcile(t0 + start, wall);
        assert_eq!(ready(&c, "w-2"), "False");

        // a client's write
        c.reconcile(t0 + start, wall);
        let passes = c.counters.reconciles;
        c.store.delete(&PODS, "kube-system", "kube-apiserver-cp-1");
        c.reconcile(t0 + start, wall);
        assert!(c.counters.reconciles > passes);
        assert!(
            c.store
                .get(&PODS, "kube-system", "kube-apiserver-cp-1")
                .is_some(),
            "the kubelet recreates its mirror pod"
        );
    }

    #[test]
    fn the_default_scenario_converges_with_pods_spread_over_workers() {
        let (mut c, _) = cluster(scenario::default_scenario(), Duration::ZERO);
        let t0 = Instant::now();
        c.reconcile(t0, jiff::Timestamp::now());
        let pods = c.pods();
        assert!(
            pods.iter().all(|p| p.ready && p.phase == "Running"),
            "{pods:#?}"
        );
        let web = web_pods(&c);
        let mut nodes: Vec<_> = web.iter().map(|p| p.node.clone().unwrap()).collect();
        nodes.sort();
        assert_eq!(
            nodes,
            ["w-1", "w-2", "w-3"],
            "spread, and never on the tainted control plane"
        );
        let proxies = pods
            .iter()
            .filter(|p| p.name.starts_with("kube-proxy-"))
            .count();
        assert_eq!(
            proxies, 4,
            "a DaemonSet that tolerates everything runs on every node"
        );
        assert!(
            pods.iter()
                .any(|p| p.mirror && p.name == "kube-apiserver-cp-1")
        );
        // A second pass changes nothing.
        let rv = c.store.resource_version();
        c.reconcile(t0, jiff::Timestamp::now());
        assert_eq!(c.store.resource_version(), rv);
    }

    #[test]
    fn evictions_respect_the_budget_until_replacements_are_ready() {
        let objects = vec![
            json(&scenario::deployment("default", "web", 3, "nginx")),
            json(&scenario::pdb_min_available("default", "web-pdb", "web", 2)),
        ];
        let (mut c, _) = cluster(objects, Duration::ZERO);
        let t0 = Instant::now();
        let wall = jiff::Timestamp::now();
        c.reconcile(t0, wall);
        c.set_timing(Timing {
            start: Duration::from_secs(5),
            termination: Duration::ZERO,
        });
        let web = web_pods(&c);
        c.evict("default", &web[0].name, t0, wall).unwrap();
        c.reconcile(t0, wall);
        let refused = c.evict("default", &web[1].name, t0, wall).unwrap_err();
        assert_eq!(refused.code, 429);
        assert_eq!(
            refused.to_status()["details"]["causes"][0]["message"],
            "The disruption budget web-pdb needs 2 healthy pods and has 2 currently"
        );
        // The replacement exists at once (Pending), and is Ready after the start delay.
        assert_eq!(web_pods(&c).len(), 3);
        assert_eq!(web_pods(&c).iter().filter(|p| p.ready).count(), 2);
        c.reconcile(t0 + Duration::from_secs(5), wall);
        assert_eq!(web_pods(&c).iter().filter(|p| p.ready).count(), 3);
        c.evict("default", &web[1].name, t0 + Duration::from_secs(5), wall)
            .unwrap();
        assert_eq!((c.counters.evictions, c.counters.evictions_blocked), (2, 1));
    }

    #[test]
    fn max_unavailable_percentages_scale_with_the_controller() {
        let objects = vec![
            json(&scenario::deployment("default", "web", 4, "nginx")),
            json(&scenario::pdb_max_unavailable(
                "default",
                "web-pdb",
                "web",
                IntOrString::String("25%".into()),
            )),
        ];
        let (mut c, _) = cluster(objects, Duration::ZERO);
        c.reconcile(Instant::now(), jiff::Timestamp::now());
        let pdb: PodDisruptionBudget =
            from_value(c.store.get(&PDBS, "default", "web-pdb").unwrap()).unwrap();
        let calc = c.pdb_calc(&pdb, "default");
        assert_eq!(
            calc,
            PdbCalc {
                expected: 4,
                current_healthy: 4,
                desired_healthy: 3,
                disruptions_allowed: 1
            }
        );
        let status = pdb.status.unwrap();
        assert_eq!((status.disruptions_allowed, status.expected_pods), (1, 4));
    }

    #[test]
    fn two_budgets_over_one_pod_are_an_error_like_the_apiserver() {
        let objects = vec![
            json(&scenario::deployment("default", "web", 2, "nginx")),
            json(&scenario::pdb_min_available("default", "a", "web", 1)),
            json(&scenario::pdb_min_available("default", "b", "web", 1)),
        ];
        let (mut c, _) = cluster(objects, Duration::ZERO);
        let t0 = Instant::now();
        c.reconcile(t0, jiff::Timestamp::now());
        let name = web_pods(&c)[0].name.clone();
        let err = c
            .evict("default", &name, t0, jiff::Timestamp::now())
            .unwrap_err();
        assert_eq!(err.code, 500);
        assert!(
            err.message.contains("more than one PodDisruptionBudget"),
            "{err:?}"
        );
    }

    #[test]
    fn a_rebooting_node_is_not_ready_and_keeps_its_daemonset_pods() {
        let objects = vec![json(&scenario::daemonset(
            "kube-system",
            "agent",
            "agent:1",
            None,
        ))];
        let (mut c, nodes) = cluster(objects, Duration::ZERO);
        let t0 = Instant::now();
        c.reconcile(t0, jiff::Timestamp::now());
        let agents_before: Vec<_> = c
            .pods()
            .into_iter()
            .filter(|p| p.name.starts_with("agent-"))
            .collect();
        assert_eq!(
            agents_before.len(),
            3,
            "no toleration for the control-plane taint: workers only"
        );
        nodes.0.lock().unwrap()[1].up = false;
        c.reconcile(t0, jiff::Timestamp::now());
        let w1 = c.store.get(&NODES, "", "w-1").unwrap();
        let ready = w1["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["status"], "Unknown");
        let taints: Vec<&str> = w1["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap())
            .collect();
        assert!(taints.contains(&TAINT_UNREACHABLE), "{taints:?}");
        let agents: Vec<_> = c
            .pods()
            .into_iter()
            .filter(|p| p.name.starts_with("agent-"))
            .collect();
        assert_eq!(
            agents.iter().map(|p| &p.name).collect::<Vec<_>>(),
            agents_before.iter().map(|p| &p.name).collect::<Vec<_>>(),
            "DaemonSet pods stay on an unreachable node"
        );
        assert!(
            agents
                .iter()
                .any(|p| p.node.as_deref() == Some("w-1") && !p.ready)
        );
        // Boot ID changes when it comes back.
        let boot_before = w1["status"]["nodeInfo"]["bootID"].clone();
        nodes.0.lock().unwrap()[1].up = true;
        c.reconcile(t0, jiff::Timestamp::now());
        let w1 = c.store.get(&NODES, "", "w-1").unwrap();
        assert_ne!(w1["status"]["nodeInfo"]["bootID"], boot_before);
    }

    #[test]
    fn a_new_daemonset_template_replaces_its_pods() {
        let ds = json(&scenario::daemonset(
            "kube-system",
            "agent",
            "agent:1",
            None,
        ));
        let (mut c, _) = cluster(vec![ds.clone()], Duration::ZERO);
        let t0 = Instant::now();
        let wall = jiff::Timestamp::now();
        c.reconcile(t0, wall);
        let mut next = c
            .store
            .get(&DAEMONSETS, "kube-system", "agent")
            .unwrap()
            .clone();
        next["spec"]["template"]["spec"]["containers"][0]["image"] = json!("agent:2");
        c.store.put(&DAEMONSETS, next, wall);
        c.reconcile(t0, wall);
        let agents: Vec<_> = c
            .pods()
            .into_iter()
            .filter(|p| p.name.starts_with("agent-"))
            .collect();
        assert_eq!(agents.len(), 3);
        assert!(
            agents.iter().all(|p| p.image == "agent:2" && p.ready),
            "{agents:?}"
        );
        let status = &c.store.get(&DAEMONSETS, "kube-system", "agent").unwrap()["status"];
        assert_eq!(status["updatedNumberScheduled"], 3);
        assert_eq!(status["observedGeneration"], 2);
    }
}
