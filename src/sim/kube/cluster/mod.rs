//! The simulated cluster behind the apiserver: a "kubelet" that derives Nodes and mirror pods
//! from the Talos side, a scheduler, DaemonSet/Deployment/ReplicaSet controllers, a
//! disruption controller (PDB status) and the eviction subresource's PDB check.
//!
//! Everything here is synchronous and takes the time as arguments (`now` for delays,
//! `wall` for timestamps); the server calls [`KubeSide::reconcile`] before every request and
//! from a background tick, so observable state is always converged for the current time.
//!
//! **Owns:** the state of the simulated cluster ([`KubeSide`]), its faults and the reconcile
//! loop (this file); each concern adds its part of `impl KubeSide` in its own file: `nodes`
//! (Node objects), `kubelet` (mirror pods, the pod lifecycle), `scheduler`, `controllers`
//! (DaemonSet, Deployment, ReplicaSet), `statuses` (their status and PDB status) and
//! `disruption` (PDB arithmetic, the eviction subresource).
//! **May depend on:** the rest of `sim::kube` (store, resources, selector, status),
//! `sim::node` (the Talos side's [`NodeFacts`]), `k8s::selector`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PodCondition, PodTemplateSpec, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::resources::{self, PODS, ResourceType};
use super::store::{ObjKey, Store, name_of, ns_of, uid_of};
use super::{KubeCounters, KubeFault, Outage};
use crate::sim::node::{NodeFacts, NodeSource};

mod controllers;
mod crds;
mod disruption;
mod incremental;
mod jobs;
mod kubelet;

pub(crate) use jobs::Propagation;
pub(crate) use volumes::attachment_name;
mod nodes;
mod scheduler;
mod statuses;
mod talos_drain;
mod volumes;

/// The annotation that marks a mirror pod (the API view of a static pod).
pub(crate) const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Talos' `AnnotationStaticPodConfigVersion` (siderolabs/talos `pkg/machinery/constants`).
const CONFIG_VERSION_ANNOTATION: &str = "talos.dev/config-version";
/// Talos' `AnnotationStaticPodConfigFileVersion`, on the kube-apiserver's pod only.
const CONFIG_FILE_VERSION_ANNOTATION: &str = "talos.dev/config-file-version";
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
    /// How long a new CustomResourceDefinition takes to become Established (see `crds`).
    pub crd_establish: Duration,
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
    /// Pressure conditions a [`KubeFault::NodePressure`] holds `True`.
    pressure: BTreeSet<String>,
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
    PdbNeverAllows {
        namespace: String,
        pdb: String,
    },
    ApiUnavailableRequests(u32),
    ApiUnavailableUntil(Instant),
    NodeNeverReady(String),
    Forbidden(super::Forbidden),
    NodePressure {
        node: String,
        condition: String,
    },
    ConcurrentWriteAfterGet {
        namespace: String,
        name: String,
        remaining: u32,
    },
    SlowStaticPodStart {
        component: String,
        extra: Duration,
    },
    JobPodExit {
        namespace: String,
        job_prefix: String,
        exit_code: i32,
    },
    DetachNeverCompletes(String),
}

/// The annotation a [`KubeFault::ConcurrentWriteAfterGet`] writer changes.
const CONCURRENT_WRITER_ANNOTATION: &str = "sim.medea.dev/concurrent-writer";

/// What a reconcile pass that changed nothing saw (see [`KubeSide::reconcile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Settled {
    fingerprint: u64,
    resource_version: u64,
    inputs: u64,
    /// The earliest timer after the pass: when it is due, a pass may change something.
    due: Option<Instant>,
}

pub(crate) struct KubeSide {
    pub store: Store,
    source: Arc<dyn NodeSource>,
    timing: Timing,
    overlays: BTreeMap<String, NodeOverlay>,
    /// What each stored Node was last derived from, and the resourceVersion it got: a node
    /// whose facts, overlay and stored object are unchanged is not derived again.
    derived: HashMap<String, (NodeFacts, NodeOverlay, String)>,
    timers: HashMap<String, PodTimer>,
    /// Run-to-completion containers (Job pods) by pod uid: when they exit (`kubelet.rs`).
    runs: HashMap<String, Instant>,
    /// Jobs with `activeDeadlineSeconds`, by uid: when the deadline passes (`jobs.rs`).
    job_deadlines: HashMap<String, Instant>,
    /// VolumeAttachments being detached, by name: when the detach completes (`volumes.rs`).
    detaching: HashMap<String, Instant>,
    /// How long a CSI detach takes (the external-attacher's `ControllerUnpublishVolume`).
    pub detach_delay: Duration,
    mirror_versions: BTreeMap<(String, String), (String, u64)>,
    faults: Vec<Active>,
    pub counters: KubeCounters,
    /// Bumped whenever an input of [`KubeSide::reconcile`] that lives outside the store and
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
    /// Deprecated-API memory: the `/metrics` gauge and who wrote which object with which
    /// group-version (`sim::kube::deprecation`).
    pub deprecation: super::deprecation::Deprecation,
    /// Alpha resources a later minor removes that a test turned on (`--runtime-config`),
    /// by go-kubernetes name (`clustercidrs.v1alpha1.networking.k8s.io`), with their objects
    /// `(namespace, name)` (`sim::kube::api::alpha`).
    pub alpha: BTreeMap<String, Vec<(String, String)>>,
    /// The port of every control-plane node's own kube-apiserver (0: none listens).
    pub apiserver_port: u16,
    /// The dirty-set bookkeeping of the incremental pass (`incremental.rs`).
    inc: incremental::State,
    /// Re-derive everything on every pass (the reference the incremental pass is tested
    /// against).
    full_only: bool,
    /// The kinds of the Established CustomResourceDefinitions (`crds`).
    custom: Vec<&'static ResourceType>,
    /// CRDs whose names were accepted, by name: when the establishing controller takes them.
    crd_due: BTreeMap<String, Instant>,
    /// The latest cordons, uncordons and bindings, in order (a test's record of what
    /// happened, e.g. where evicted pods landed while which node was cordoned); the oldest
    /// go beyond [`HISTORY_CAP`].
    pub history: std::collections::VecDeque<super::ClusterRecord>,
    /// Node name → the server-side drains of the node source already run
    /// ([`NodeSource::talos_drains`], `talos_drain.rs`); starts at what the source reports
    /// when the kube side starts, so a drain is run once.
    talos_drains_seen: BTreeMap<String, u64>,
}

/// How many [`KubeSide::history`] records are kept.
pub(crate) const HISTORY_CAP: usize = 20_000;

#[allow(
    clippy::expect_used,
    reason = "k8s-openapi types have string keys and no non-finite floats: serializing them to a JSON value cannot fail"
)]
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

#[allow(
    clippy::expect_used,
    reason = "k8s_time renders RFC 3339 with a Z offset, which k8s-openapi's Time always parses"
)]
fn condition(kind: &str, status: bool, since: &str) -> PodCondition {
    PodCondition {
        type_: kind.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        last_transition_time: Some(Time(since.parse().expect("k8s_time output parses"))),
        ..PodCondition::default()
    }
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

/// Whether `rt` is served for `apiVersion`/`kind` (used when validating bodies).
pub(crate) fn kind_matches(rt: &ResourceType, obj: &Value) -> bool {
    let api_version = obj.get("apiVersion").and_then(Value::as_str);
    let kind = obj.get("kind").and_then(Value::as_str);
    api_version.is_none_or(|v| v == rt.api_version())
        && kind.is_none_or(|k| k == rt.kind)
        && resources::by_kind(&rt.api_version(), rt.kind).is_some()
}

impl KubeSide {
    pub fn new(source: Arc<dyn NodeSource>, timing: Timing, seed: u64) -> KubeSide {
        let talos_drains_seen = source.talos_drains().into_iter().collect();
        KubeSide {
            store: Store::new(seed),
            source,
            timing,
            overlays: BTreeMap::new(),
            derived: HashMap::new(),
            timers: HashMap::new(),
            runs: HashMap::new(),
            job_deadlines: HashMap::new(),
            detaching: HashMap::new(),
            detach_delay: Duration::from_secs(2),
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
            deprecation: Default::default(),
            alpha: BTreeMap::new(),
            apiserver_port: 0,
            inc: incremental::State::default(),
            full_only: false,
            custom: Vec::new(),
            crd_due: BTreeMap::new(),
            history: Default::default(),
            talos_drains_seen,
        }
    }

    /// Remember `r` in [`KubeSide::history`].
    pub(crate) fn record(&mut self, r: super::ClusterRecord) {
        if self.history.len() >= HISTORY_CAP {
            self.history.pop_front();
        }
        self.history.push_back(r);
    }

    pub fn timing(&self) -> Timing {
        self.timing
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
            KubeFault::NodePressure { node, condition } => Active::NodePressure { node, condition },
            KubeFault::ConcurrentWriteAfterGet {
                namespace,
                name,
                times,
            } => Active::ConcurrentWriteAfterGet {
                namespace,
                name,
                remaining: times,
            },
            KubeFault::SlowStaticPodStart { component, extra } => {
                Active::SlowStaticPodStart { component, extra }
            }
            KubeFault::JobPodExit {
                namespace,
                job_prefix,
                exit_code,
            } => Active::JobPodExit {
                namespace,
                job_prefix,
                exit_code,
            },
            KubeFault::DetachNeverCompletes { node } => Active::DetachNeverCompletes(node),
        });
    }

    /// A GET of `ns/name` was answered: a [`KubeFault::ConcurrentWriteAfterGet`] writer now
    /// changes the object, as another client racing the reader would.
    pub fn after_get(
        &mut self,
        rt: &'static ResourceType,
        ns: &str,
        name: &str,
        wall: jiff::Timestamp,
    ) {
        let Some(remaining) = self.faults.iter_mut().find_map(|f| match f {
            Active::ConcurrentWriteAfterGet {
                namespace,
                name: n,
                remaining,
            } if namespace == ns && n == name && *remaining > 0 => Some(remaining),
            _ => None,
        }) else {
            return;
        };
        *remaining -= 1;
        let Some(mut obj) = self.store.get(rt, ns, name).cloned() else {
            return;
        };
        let writes = obj
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(CONCURRENT_WRITER_ANNOTATION))
            .and_then(Value::as_str)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let meta = &mut obj["metadata"];
        if !meta["annotations"].is_object() {
            meta["annotations"] = json!({});
        }
        meta["annotations"][CONCURRENT_WRITER_ANNOTATION] = json!((writes + 1).to_string());
        self.store.put(rt, obj, wall);
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

    fn pressure_of(&self, node: &str) -> BTreeSet<String> {
        self.faults
            .iter()
            .filter_map(|f| match f {
                Active::NodePressure { node: n, condition } if n == node => Some(condition.clone()),
                _ => None,
            })
            .collect()
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
    /// tick. Timers that are due are consumed by [`KubeSide::reconcile`].
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        self.timers
            .values()
            .flat_map(|t| [t.ready_at, t.remove_at])
            .flatten()
            .chain(self.crd_due.values().copied())
            .chain(self.runs.values().copied())
            .chain(self.job_deadlines.values().copied())
            .chain(self.detaching.values().copied())
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
        self.establish_crds(now, wall);
        self.talos_drains(now, wall);
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
            if due.iter().any(|u| u == uid_of(&pod)) && !jobs::has_finalizers(&pod) {
                self.store.delete(&PODS, ns_of(&pod), name_of(&pod));
            }
        }
        for uid in due {
            self.timers.remove(&uid);
        }
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

    /// Bring the deprecated-API memory up to date with the control plane (served minor; a
    /// restarted or upgraded kube-apiserver starts with an empty gauge). Cheap when the node
    /// source can tell that nothing changed.
    pub fn observe_apiservers(&mut self) {
        let fingerprint = self.source.fingerprint();
        if !self.deprecation.stale(fingerprint) {
            return;
        }
        let control_planes = self.source.control_planes();
        let instances: Vec<(String, String, bool)> = control_planes
            .iter()
            .map(|n| {
                let image = n
                    .static_pod_images
                    .get("kube-apiserver")
                    .cloned()
                    .unwrap_or_default();
                (n.name.clone(), image, n.up)
            })
            .collect();
        let version = self.version_of(&control_planes);
        let now = jiff::Timestamp::now();
        self.deprecation
            .observe(fingerprint, instances, &version, now.as_second());
        self.publish_apiserver_endpoints(&control_planes, now);
    }

    /// Whether `node`'s own kube-apiserver is up (its listener takes connections).
    pub fn apiserver_up(&self, node: &str) -> bool {
        self.source
            .control_planes()
            .iter()
            .any(|n| n.name == node && n.up)
    }

    /// Write the `kubernetes` EndpointSlice of `default` as the kube-apiserver's endpoint
    /// reconciler does (kubernetes `pkg/controlplane/reconcilers/endpointsadapter.go`
    /// `updateEndpointSlice`, lease reconciler `lease.go`): one endpoint per live apiserver
    /// (its advertise address, here the node's address), `ready: true`, the label
    /// `kubernetes.io/service-name: kubernetes`, and one port list for all of them (the
    /// apiservers' common secure port). An apiserver that stopped (its node reboots) drops out.
    fn publish_apiserver_endpoints(
        &mut self,
        control_planes: &[crate::sim::node::NodeFacts],
        wall: jiff::Timestamp,
    ) {
        if self.apiserver_port == 0 {
            return;
        }
        let mut live: Vec<(std::net::IpAddr, &str)> = control_planes
            .iter()
            .filter(|n| n.up)
            .filter_map(|n| Some((n.address.parse().ok()?, n.address.as_str())))
            .collect();
        live.sort();
        let endpoints: Vec<Value> = live
            .iter()
            .map(|(_, a)| serde_json::json!({"addresses": [a], "conditions": {"ready": true}}))
            .collect();
        let slice = serde_json::json!({
            "metadata": {
                "name": "kubernetes",
                "namespace": "default",
                "labels": {"kubernetes.io/service-name": "kubernetes"},
            },
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": [{"name": "https", "port": self.apiserver_port, "protocol": "TCP"}],
        });
        self.store
            .put(&super::resources::ENDPOINTSLICES, slice, wall);
    }

    /// The version of the kube-apiserver that serves a request: `node`'s own, else the one
    /// holding the control-plane endpoint (see [`super::deprecation`]).
    pub fn server_version_of(&self, node: Option<&str>) -> String {
        let control_planes = self.source.control_planes();
        let serving = self.deprecation.serving(node);
        let own = control_planes
            .iter()
            .filter(|n| Some(n.name.as_str()) == serving)
            .find_map(|n| n.static_pod_images.get("kube-apiserver"))
            .and_then(|img| crate::sim::reference::tag_of(img).map(str::to_string));
        own.unwrap_or_else(|| self.version_of(&control_planes))
    }

    /// The kube-apiserver version of the first of `control_planes` that runs one, else the
    /// first node's kubelet version.
    fn version_of(&self, control_planes: &[crate::sim::node::NodeFacts]) -> String {
        control_planes
            .iter()
            .find_map(|n| n.static_pod_images.get("kube-apiserver"))
            .and_then(|img| crate::sim::reference::tag_of(img).map(str::to_string))
            .or_else(|| {
                self.source
                    .nodes()
                    .first()
                    .map(|n| n.kubelet_version.clone())
            })
            .unwrap_or_else(|| "v1.33.0".to_string())
    }
}

#[cfg(test)]
mod incremental_tests;
#[cfg(test)]
mod tests;
