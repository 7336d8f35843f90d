//! The dirty-set reconcile pass: each pass re-derives only the nodes and pods a change touched.
//!
//! A full pass ([`KubeSide::pass_full`]) walks every node and every pod, O(nodes + pods) per
//! pass, and the apiserver runs a pass after every change: a 1,000-node rollout then spends
//! its time re-deriving unchanged objects. The incremental pass
//! ([`KubeSide::pass_incremental`]) runs the same controllers over a dirty set instead:
//!
//! - **nodes** whose Talos-side facts changed (the per-node digest
//!   [`NodeSource::node_fingerprints`]; only the changed nodes' digests, from
//!   [`NodeSource::node_fingerprints_since`], when the source keeps them), whose stored Node
//!   changed, or that were patched (a cordon dirties one node);
//! - **pods** that changed (an eviction dirties one pod, and through its owner the
//!   controller's status), pods on a dirty node (a node reboot dirties that node and its pods),
//!   pods whose timer fell due;
//! - **controllers** (DaemonSets, PodDisruptionBudgets) whose object, pods or nodes changed
//!   (a controller change dirties its pods).
//!
//! What changed comes from the store's event history ([`Store::changes_since`]): each phase
//! remembers the resourceVersion at which it last started and reads the events after it, which
//! include the writes of the phases that ran after it in the previous pass. A phase whose events
//! are no longer retained, a fault or timing change, and the first pass fall back to the full
//! pass, which stays the reference: a property test
//! (`an_incremental_pass_derives_what_a_full_pass_derives`) runs random changes through both and
//! requires the same store, byte for byte and resourceVersion for resourceVersion.
//!
//! Why skipping is exact: every phase's decision for an element (a node, a pod, a DaemonSet on
//! a node) is a function of objects whose changes are events, of the node's facts (digest), of
//! faults and timing (a change forces a full pass) and of timers (due timers are dirty). A phase
//! that processed an element and wrote nothing for it writes nothing again until one of those
//! changes; a phase that wrote for it sees its own write as an event and processes it again.
//!
//! [`NodeSource::node_fingerprints`]: crate::sim::node::NodeSource::node_fingerprints
//! [`NodeSource::node_fingerprints_since`]: crate::sim::node::NodeSource::node_fingerprints_since
//! [`Store::changes_since`]: crate::sim::kube::store::Store::changes_since

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::controllers::{DsCtx, DsPod};
use super::kubelet::KubeletOut;
use super::nodes::view_of;
use super::scheduler::can_schedule;
use super::{
    KubeSide, NodeView, controller_of, from_value, is_mirror, is_terminating, node_name, phase,
    pod_ready,
};
use crate::sim::kube::resources::{
    DAEMONSETS, DEPLOYMENTS, NODES, PDBS, PODS, REPLICASETS, ResKey,
};
use crate::sim::kube::selector::LabelSelector;
use crate::sim::kube::store::{Event, EventType, Store, name_of, ns_of, uid_of};

/// Each DaemonSet's template hash and generation.
fn ds_decisions(store: &Store) -> HashMap<String, (String, String)> {
    store
        .list(&DAEMONSETS, None)
        .filter_map(DsCtx::of)
        .map(|c| (c.uid, (c.hash, c.generation)))
        .collect()
}

/// `(namespace, name)` of a pod, ordered as the store lists pods.
type PodKey = (String, String);

fn key_of(pod: &Value) -> PodKey {
    (ns_of(pod).to_string(), name_of(pod).to_string())
}

/// The non-terminating pods of one controller, counted as its status needs them.
#[derive(Debug, Default, Clone, PartialEq)]
struct OwnerAgg {
    active: usize,
    ready: usize,
    /// `controller-revision-hash` label → pods.
    by_hash: HashMap<String, usize>,
    /// node (`""`: unbound) → pods.
    per_node: HashMap<String, usize>,
}

/// Pods indexed by node, owner and uid, kept current from the store's events.
#[derive(Debug, Default)]
struct Index {
    /// The resourceVersion the index reflects.
    rv: u64,
    by_node: HashMap<String, BTreeSet<PodKey>>,
    by_owner: HashMap<String, BTreeSet<PodKey>>,
    unbound: BTreeSet<PodKey>,
    uids: HashMap<String, PodKey>,
    aggs: HashMap<String, OwnerAgg>,
}

impl Index {
    fn rebuild(&mut self, store: &Store) {
        *self = Index {
            rv: store.resource_version(),
            ..Index::default()
        };
        for p in store.list(&PODS, None) {
            self.add(p);
        }
    }

    fn apply(&mut self, e: &Event) {
        if e.res != PODS.key() {
            return;
        }
        match e.kind {
            EventType::Added => self.add(&e.object),
            EventType::Modified => {
                if let Some(old) = &e.old {
                    self.remove(old);
                }
                self.add(&e.object);
            }
            EventType::Deleted => self.remove(&e.object),
        }
    }

    fn add(&mut self, p: &Value) {
        let key = key_of(p);
        let node = node_name(p);
        if node.is_empty() {
            self.unbound.insert(key.clone());
        } else {
            self.by_node
                .entry(node.to_string())
                .or_default()
                .insert(key.clone());
        }
        self.uids.insert(uid_of(p).to_string(), key.clone());
        let Some((_, _, owner)) = controller_of(p) else {
            return;
        };
        self.by_owner.entry(owner.clone()).or_default().insert(key);
        if is_terminating(p) {
            return;
        }
        let agg = self.aggs.entry(owner).or_default();
        agg.active += 1;
        agg.ready += usize::from(pod_ready(p));
        if let Some(h) = p
            .pointer("/metadata/labels/controller-revision-hash")
            .and_then(Value::as_str)
        {
            *agg.by_hash.entry(h.to_string()).or_default() += 1;
        }
        *agg.per_node.entry(node.to_string()).or_default() += 1;
    }

    fn remove(&mut self, p: &Value) {
        let key = key_of(p);
        let node = node_name(p);
        if node.is_empty() {
            self.unbound.remove(&key);
        } else if let Some(set) = self.by_node.get_mut(node) {
            set.remove(&key);
            if set.is_empty() {
                self.by_node.remove(node);
            }
        }
        self.uids.remove(uid_of(p));
        let Some((_, _, owner)) = controller_of(p) else {
            return;
        };
        if let Some(set) = self.by_owner.get_mut(&owner) {
            set.remove(&key);
            if set.is_empty() {
                self.by_owner.remove(&owner);
            }
        }
        if is_terminating(p) {
            return;
        }
        let Some(agg) = self.aggs.get_mut(&owner) else {
            return;
        };
        agg.active -= 1;
        agg.ready -= usize::from(pod_ready(p));
        if let Some(h) = p
            .pointer("/metadata/labels/controller-revision-hash")
            .and_then(Value::as_str)
            && let Some(n) = agg.by_hash.get_mut(h)
        {
            *n -= 1;
            if *n == 0 {
                agg.by_hash.remove(h);
            }
        }
        if let Some(n) = agg.per_node.get_mut(node) {
            *n -= 1;
            if *n == 0 {
                agg.per_node.remove(node);
            }
        }
        if agg.active == 0 {
            self.aggs.remove(&owner);
        }
    }
}

/// The resourceVersion at which each phase last started.
#[derive(Debug, Default, Clone, Copy)]
struct Marks {
    nodes: u64,
    mirror: u64,
    daemonsets: u64,
    deployments: u64,
    replicasets: u64,
    kubelet: u64,
    statuses: u64,
    timers: u64,
}

impl Marks {
    fn min(&self) -> u64 {
        [
            self.nodes,
            self.mirror,
            self.daemonsets,
            self.deployments,
            self.replicasets,
            self.kubelet,
            self.statuses,
            self.timers,
        ]
        .into_iter()
        .min()
        .unwrap_or(0)
    }
}

/// A DaemonSet's `desiredNumberScheduled`, kept per node.
#[derive(Debug, Default)]
struct DsDesired {
    hash: String,
    /// node → counted (the DaemonSet may run there, or has a pod there).
    nodes: HashMap<String, bool>,
    count: usize,
}

/// The node digests a pass compares with the ones the stored Nodes were derived from.
enum Prints {
    /// Every node's: the node list as the source has it now.
    All(Vec<(String, u64)>),
    /// Only the nodes changed since the digests were last read; every other node's digest
    /// is the one in [`State::prints`], and the node list is unchanged.
    Changed(Vec<(String, u64)>),
}

/// The bookkeeping of the incremental pass.
#[derive(Debug, Default)]
pub(super) struct State {
    /// A full pass ran, so the bookkeeping below is valid.
    ready: bool,
    /// [`KubeSide::inputs`] as of the last pass.
    inputs: u64,
    marks: Marks,
    /// The node digests the stored Nodes were last derived from.
    prints: HashMap<String, u64>,
    /// The node source's [`NodeSource::fingerprint`] read just before `prints` was last
    /// brought up to date: the next pass asks only for the nodes changed since.
    ///
    /// [`NodeSource::fingerprint`]: crate::sim::node::NodeSource::fingerprint
    prints_at: Option<u64>,
    /// Nodes derived since the mirror pods were last synced.
    facts_dirty: BTreeSet<String>,
    /// Nodes whose crash-looping components changed in this pass (the kubelet re-reads their
    /// pods).
    crash_dirty: BTreeSet<String>,
    /// The stored Nodes as the controllers see them, and the resourceVersion they reflect.
    views: BTreeMap<String, NodeView>,
    views_rv: u64,
    index: Index,
    /// node → its mirror pods' names, and back.
    mirrors: HashMap<String, Vec<String>>,
    mirror_node: HashMap<String, String>,
    /// DaemonSet → the template hash and generation the DaemonSet controller last went over
    /// every node with.
    ds_seen: HashMap<String, (String, String)>,
    ds_desired: HashMap<String, DsDesired>,
    /// PDB → the controllers (kind, name) its last status read the scale of.
    pdb_deps: HashMap<PodKey, BTreeSet<(String, String)>>,
    /// Incremental passes run, nodes they re-derived and pods the kubelet read (tests check
    /// that a change touches only what it dirties).
    pub incremental_passes: u64,
    /// Reads of the node digests that listed only the changed nodes.
    pub changed_prints: u64,
    pub nodes_derived: u64,
    pub pods_examined: u64,
}

impl State {
    pub fn forget_mirrors(&mut self) {
        self.mirrors.clear();
        self.mirror_node.clear();
    }

    pub fn want_mirror(&mut self, node: &str, pod: &str) {
        self.mirrors
            .entry(node.to_string())
            .or_default()
            .push(pod.to_string());
        self.mirror_node.insert(pod.to_string(), node.to_string());
    }

    /// The pods controlled by `uid`, in store order, as owned values.
    pub fn owned_pods(&self, store: &Store, uid: &str) -> Vec<Value> {
        self.index
            .by_owner
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|(ns, name)| store.get(&PODS, ns, name).cloned())
            .collect()
    }
}

/// What a slice of events touched, as the phases ask it.
#[derive(Default)]
struct Touched {
    nodes: BTreeSet<String>,
    pods: BTreeSet<PodKey>,
    /// controller uid → nodes (old and new) of its changed pods (`""`: unbound).
    owner_nodes: HashMap<String, BTreeSet<String>>,
    /// (resource, namespace, name) of every other changed object.
    objects: HashSet<(ResKey, String, String)>,
    uids: HashSet<String>,
}

impl Touched {
    fn of(events: &[Arc<Event>]) -> Touched {
        let mut t = Touched::default();
        for e in events {
            if e.res == NODES.key() {
                t.nodes.insert(name_of(&e.object).to_string());
            } else if e.res == PODS.key() {
                t.pods.insert(key_of(&e.object));
                for o in std::iter::once(&e.object).chain(e.old.as_ref()) {
                    if let Some((_, _, u)) = controller_of(o) {
                        t.owner_nodes
                            .entry(u)
                            .or_default()
                            .insert(node_name(o).to_string());
                    }
                }
            } else {
                t.objects.insert((
                    e.res,
                    ns_of(&e.object).to_string(),
                    name_of(&e.object).to_string(),
                ));
                t.uids.insert(uid_of(&e.object).to_string());
            }
        }
        t
    }
}

impl KubeSide {
    /// Run the full pass when the incremental one cannot be trusted (first pass, a fault or
    /// timing change, events no longer retained, or the full pass forced), else the dirty-set
    /// pass.
    pub(super) fn pass(&mut self, now: Instant, wall: jiff::Timestamp) {
        if self.full_only
            || !self.inc.ready
            || self.inc.inputs != self.inputs
            || !self.store.retains(self.inc.marks.min())
        {
            self.pass_full(now, wall);
        } else {
            self.inc.incremental_passes += 1;
            self.pass_incremental(now, wall);
        }
        self.inc.inputs = self.inputs;
    }

    /// Re-derive every node and pod (the reference the incremental pass must equal).
    pub(super) fn pass_full(&mut self, now: Instant, wall: jiff::Timestamp) {
        self.take_unavailable_expiry(now);
        self.remove_due(now);
        let prints_at = self.source.fingerprint();
        let prints = self.source.node_fingerprints();
        self.inc.marks.nodes = self.store.resource_version();
        self.sync_nodes(wall);
        let nodes = self.node_views();
        self.inc.marks.mirror = self.store.resource_version();
        self.inc.views_rv = self.store.resource_version();
        self.sync_mirror_pods(&nodes, now, wall);
        self.inc.marks.daemonsets = self.store.resource_version();
        self.daemonsets(&nodes, now, wall);
        self.inc.marks.deployments = self.store.resource_version();
        self.deployments(wall);
        self.inc.marks.replicasets = self.store.resource_version();
        self.replicasets(None, now, wall);
        self.jobs(now, wall);
        self.schedule(&nodes, now, wall);
        self.inc.marks.kubelet = self.store.resource_version();
        self.kubelet(&nodes, now, wall);
        self.jobs(now, wall);
        self.volumes(now, wall);
        self.inc.marks.statuses = self.store.resource_version();
        self.statuses(wall);
        self.inc.marks.timers = self.store.resource_version();
        let live: BTreeSet<String> = self
            .store
            .list(&PODS, None)
            .map(|p| uid_of(p).to_string())
            .collect();
        self.timers.retain(|uid, _| live.contains(uid));
        self.runs.retain(|uid, _| live.contains(uid));
        // the incremental pass's bookkeeping, from scratch
        let inc = &mut self.inc;
        inc.ready = true;
        inc.prints = prints.into_iter().collect();
        inc.prints_at = prints_at;
        inc.facts_dirty.clear();
        inc.crash_dirty.clear();
        inc.views = nodes.into_iter().map(|v| (v.name.clone(), v)).collect();
        inc.index.rebuild(&self.store);
        inc.ds_seen = ds_decisions(&self.store);
        inc.ds_desired.clear();
        inc.pdb_deps.clear();
    }

    /// The dirty-set pass: the same phases as [`Self::pass_full`], each over what changed.
    fn pass_incremental(&mut self, now: Instant, wall: jiff::Timestamp) {
        self.take_unavailable_expiry(now);
        self.catch_up();
        self.remove_due_indexed(now);
        let prints = self.current_prints();
        let since = std::mem::replace(&mut self.inc.marks.nodes, self.store.resource_version());
        self.sync_nodes_dirty(&prints, None, since, wall);
        self.refresh_views();
        let since = std::mem::replace(&mut self.inc.marks.mirror, self.store.resource_version());
        self.sync_mirror_pods_dirty(since, now, wall);
        let since = std::mem::replace(
            &mut self.inc.marks.daemonsets,
            self.store.resource_version(),
        );
        self.daemonsets_dirty(since, now, wall);
        // the Deployment controller reads only Deployments and ReplicaSets
        let since = std::mem::replace(
            &mut self.inc.marks.deployments,
            self.store.resource_version(),
        );
        if self.store.changes_since(since).is_none_or(|events| {
            events
                .iter()
                .any(|e| e.res == DEPLOYMENTS.key() || e.res == REPLICASETS.key())
        }) {
            self.deployments(wall);
        }
        // the ReplicaSet controller, over the ReplicaSets that or whose pods changed
        let since = std::mem::replace(
            &mut self.inc.marks.replicasets,
            self.store.resource_version(),
        );
        self.catch_up();
        let dirty: HashSet<String> = match self.store.changes_since(since) {
            Some(events) => {
                let touched = Touched::of(&events);
                let mut dirty = touched.uids;
                dirty.extend(touched.owner_nodes.into_keys());
                dirty
            }
            None => self
                .store
                .list(&REPLICASETS, None)
                .map(|r| uid_of(r).to_string())
                .collect(),
        };
        if self
            .store
            .list(&REPLICASETS, None)
            .any(|r| dirty.contains(uid_of(r)))
        {
            self.replicasets(Some(&dirty), now, wall);
        }
        self.jobs(now, wall);
        self.catch_up();
        self.schedule_indexed(now, wall);
        let since = std::mem::replace(&mut self.inc.marks.kubelet, self.store.resource_version());
        self.kubelet_dirty(since, now, wall);
        self.jobs(now, wall);
        self.volumes(now, wall);
        let since = std::mem::replace(&mut self.inc.marks.statuses, self.store.resource_version());
        self.statuses_dirty(since, wall);
        let since = std::mem::replace(&mut self.inc.marks.timers, self.store.resource_version());
        match self.store.changes_since(since) {
            Some(events) => {
                for e in events
                    .iter()
                    .filter(|e| e.res == PODS.key() && e.kind == EventType::Deleted)
                {
                    self.timers.remove(uid_of(&e.object));
                    self.runs.remove(uid_of(&e.object));
                }
            }
            None => {
                let live: BTreeSet<String> = self
                    .store
                    .list(&PODS, None)
                    .map(|p| uid_of(p).to_string())
                    .collect();
                self.timers.retain(|uid, _| live.contains(uid));
                self.runs.retain(|uid, _| live.contains(uid));
            }
        }
    }

    /// Bring the pod index up to the store's current resourceVersion.
    fn catch_up(&mut self) {
        match self.store.changes_since(self.inc.index.rv) {
            Some(events) => {
                for e in &events {
                    self.inc.index.apply(e);
                }
                self.inc.index.rv = self.store.resource_version();
            }
            None => self.inc.index.rebuild(&self.store),
        }
    }

    fn views_vec(&self) -> Vec<NodeView> {
        self.inc.views.values().cloned().collect()
    }

    /// The Node side of a client's patch: re-derive the patched node (and any node whose
    /// facts changed meanwhile, as a full sync would).
    pub(super) fn sync_nodes_after_patch(&mut self, name: &str, wall: jiff::Timestamp) {
        if self.full_only || !self.inc.ready {
            self.sync_nodes(wall);
            return;
        }
        let prints = self.current_prints();
        self.sync_nodes_dirty(&prints, Some(name), self.inc.marks.nodes, wall);
    }

    /// The node digests to compare with the ones the stored Nodes were derived from: only
    /// the nodes changed since they were last read when the source can tell
    /// ([`NodeSource::node_fingerprints_since`]), else every node's.
    ///
    /// [`NodeSource::node_fingerprints_since`]: crate::sim::node::NodeSource::node_fingerprints_since
    fn current_prints(&mut self) -> Prints {
        let generation = self.source.fingerprint();
        let changed = match (generation, self.inc.prints_at) {
            (Some(_), Some(at)) => self.source.node_fingerprints_since(at),
            _ => None,
        };
        self.inc.prints_at = generation;
        match changed {
            Some(changed) => {
                self.inc.changed_prints += 1;
                Prints::Changed(changed)
            }
            None => Prints::All(self.source.node_fingerprints()),
        }
    }

    /// Derive the nodes whose digest changed, whose stored Node changed since `since`, and
    /// `extra`; remove the ones gone from the Talos side.
    fn sync_nodes_dirty(
        &mut self,
        prints: &Prints,
        extra: Option<&str>,
        since: u64,
        wall: jiff::Timestamp,
    ) {
        let (listed, all) = match prints {
            Prints::All(l) => (l, true),
            Prints::Changed(l) => (l, false),
        };
        let names: HashMap<&str, u64> = listed.iter().map(|(n, p)| (n.as_str(), *p)).collect();
        let mut candidates: BTreeSet<String> = listed
            .iter()
            .filter(|(n, p)| self.inc.prints.get(n) != Some(p))
            .map(|(n, _)| n.clone())
            .collect();
        if all {
            candidates.extend(
                self.inc
                    .prints
                    .keys()
                    .filter(|n| !names.contains_key(n.as_str()))
                    .cloned(),
            );
        }
        match self.store.changes_since(since) {
            Some(events) => candidates.extend(
                events
                    .iter()
                    .filter(|e| e.res == NODES.key())
                    .map(|e| name_of(&e.object).to_string()),
            ),
            None => {
                candidates.extend(
                    self.store
                        .list(&NODES, None)
                        .map(|n| name_of(n).to_string()),
                );
                candidates.extend(names.keys().map(|n| n.to_string()));
                if !all {
                    candidates.extend(self.inc.prints.keys().cloned());
                }
            }
        }
        candidates.extend(extra.map(str::to_string));
        // each candidate's current digest: listed, or (when only changes are listed) the one
        // it was derived from; none for a node the source no longer has
        let resolved: Vec<(String, Option<u64>)> = candidates
            .into_iter()
            .map(|n| {
                let print = names
                    .get(n.as_str())
                    .copied()
                    .or_else(|| (!all).then(|| self.inc.prints.get(&n).copied()).flatten());
                (n, print)
            })
            .collect();
        for (gone, _) in resolved.iter().filter(|(_, p)| p.is_none()) {
            if self.store.get(&NODES, "", gone).is_some() {
                self.drop_node(gone);
            }
            self.inc.prints.remove(gone);
            self.inc.facts_dirty.insert(gone.clone());
        }
        for (name, print) in resolved.iter().filter_map(|(n, p)| p.map(|p| (n, p))) {
            let Some(f) = self.source.node(name) else {
                // not derived: read every digest next time, so that it is compared again
                self.inc.prints_at = None;
                continue;
            };
            self.sync_node(&f, wall);
            self.inc.nodes_derived += 1;
            self.inc.prints.insert(name.clone(), print);
            self.inc.facts_dirty.insert(name.clone());
        }
    }

    /// Re-read the views of the Nodes stored since they were last read.
    fn refresh_views(&mut self) {
        match self.store.changes_since(self.inc.views_rv) {
            Some(events) => {
                let names: BTreeSet<&str> = events
                    .iter()
                    .filter(|e| e.res == NODES.key())
                    .map(|e| name_of(&e.object))
                    .collect();
                for name in names {
                    match self.store.get(&NODES, "", name).and_then(view_of) {
                        Some(v) => {
                            self.inc.views.insert(name.to_string(), v);
                        }
                        None => {
                            self.inc.views.remove(name);
                        }
                    }
                }
            }
            None => {
                self.inc.views = self
                    .node_views()
                    .into_iter()
                    .map(|v| (v.name.clone(), v))
                    .collect();
            }
        }
        self.inc.views_rv = self.store.resource_version();
    }

    /// Mirror pods of the nodes derived since the last sync, of the Nodes stored since
    /// `since`, and of the mirror pods changed since; stale mirror pods among those removed.
    fn sync_mirror_pods_dirty(&mut self, since: u64, now: Instant, wall: jiff::Timestamp) {
        let Some(events) = self.store.changes_since(since) else {
            let nodes = self.views_vec();
            self.sync_mirror_pods(&nodes, now, wall);
            self.inc.facts_dirty.clear();
            return;
        };
        let mut nodes = std::mem::take(&mut self.inc.facts_dirty);
        let mut stale: BTreeSet<String> = BTreeSet::new();
        for e in events.iter() {
            if e.res == NODES.key() {
                nodes.insert(name_of(&e.object).to_string());
            } else if e.res == PODS.key() && ns_of(&e.object) == "kube-system" {
                let name = name_of(&e.object);
                if let Some(n) = self.inc.mirror_node.get(name) {
                    nodes.insert(n.clone());
                }
                if std::iter::once(&e.object)
                    .chain(e.old.as_ref())
                    .any(is_mirror)
                {
                    stale.insert(name.to_string());
                }
            }
        }
        for n in &nodes {
            for name in self.inc.mirrors.remove(n).unwrap_or_default() {
                self.inc.mirror_node.remove(&name);
                stale.insert(name);
            }
            let before = self.crash_looping.len();
            self.crash_looping.retain(|(node, _)| node != n);
            let mut crash_changed = self.crash_looping.len() != before;
            let f = if self.inc.views.contains_key(n) {
                self.source.node(n)
            } else {
                None
            };
            if let Some(f) = f {
                for c in &f.crash_looping {
                    self.crash_looping.insert((f.name.clone(), c.clone()));
                    crash_changed = true;
                }
                for (component, image) in &f.static_pod_images {
                    let name = format!("{component}-{}", f.name);
                    self.inc.want_mirror(&f.name, &name);
                    self.sync_mirror_pod(&f, component, image, &name, now, wall);
                }
            }
            if crash_changed {
                self.inc.crash_dirty.insert(n.clone());
            }
        }
        for name in stale {
            if self
                .store
                .get(&PODS, "kube-system", &name)
                .is_some_and(is_mirror)
                && !self.inc.mirror_node.contains_key(&name)
            {
                self.store.delete(&PODS, "kube-system", &name);
            }
        }
    }

    /// The DaemonSet controller over the nodes whose Node or whose DaemonSet pods changed
    /// since `since`; over every node for a DaemonSet that changed.
    fn daemonsets_dirty(&mut self, since: u64, now: Instant, wall: jiff::Timestamp) {
        let Some(events) = self.store.changes_since(since) else {
            let nodes = self.views_vec();
            self.daemonsets(&nodes, now, wall);
            self.inc.ds_seen = ds_decisions(&self.store);
            return;
        };
        self.catch_up();
        let touched = Touched::of(&events);
        for ds_value in self.store.list_owned(&DAEMONSETS, None) {
            let Some(ctx) = DsCtx::of(&ds_value) else {
                continue;
            };
            // a new template (or generation, which pods are labelled with) changes the
            // decision on every node; a status write changes none
            let decided = (ctx.hash.clone(), ctx.generation.clone());
            let every_node =
                self.inc.ds_seen.insert(ctx.uid.clone(), decided.clone()) != Some(decided);
            let targets: BTreeSet<String> = if every_node {
                let mut all: BTreeSet<String> = self.inc.views.keys().cloned().collect();
                if let Some(pods) = self.inc.index.by_owner.get(&ctx.uid) {
                    for (ns, name) in pods {
                        if let Some(p) = self.store.get(&PODS, ns, name) {
                            all.insert(node_name(p).to_string());
                        }
                    }
                }
                all
            } else {
                let mut t = touched.nodes.clone();
                t.extend(
                    touched
                        .owner_nodes
                        .get(&ctx.uid)
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
                t
            };
            // the DaemonSet's pods on the target nodes, read before any write
            let mut pods: Vec<DsPod> = Vec::new();
            for node in &targets {
                let keys = if node.is_empty() {
                    Some(&self.inc.index.unbound)
                } else {
                    self.inc.index.by_node.get(node)
                };
                for (ns, name) in keys.into_iter().flatten() {
                    if let Some(p) = self.store.get(&PODS, ns, name)
                        && controller_of(p).is_some_and(|(_, _, u)| u == ctx.uid)
                    {
                        pods.push(DsPod::of(p, &ctx.hash));
                    }
                }
            }
            pods.sort_by(|a, b| (&a.ns, &a.name).cmp(&(&b.ns, &b.name)));
            for node in &targets {
                let Some(view) = self.inc.views.get(node).cloned() else {
                    continue;
                };
                let here: Vec<&DsPod> = pods
                    .iter()
                    .filter(|p| !p.terminating && p.node == *node)
                    .collect();
                self.daemonset_node(&ctx, &view, &here, now, wall);
            }
            let absent: Vec<&DsPod> = pods
                .iter()
                .filter(|p| !self.inc.views.contains_key(&p.node))
                .collect();
            for p in absent {
                self.terminate(&p.ns, &p.name, now, wall);
            }
        }
    }

    /// Delete the pods whose termination grace ended (their timers name them).
    fn remove_due_indexed(&mut self, now: Instant) {
        let due: HashSet<String> = self
            .timers
            .iter()
            .filter(|(_, t)| t.remove_at.is_some_and(|r| r <= now))
            .map(|(uid, _)| uid.clone())
            .collect();
        if due.is_empty() {
            return;
        }
        let mut keys: Vec<PodKey> = due
            .iter()
            .filter_map(|u| self.inc.index.uids.get(u).cloned())
            .collect();
        keys.sort();
        for (ns, name) in keys {
            if self
                .store
                .get(&PODS, &ns, &name)
                .is_some_and(|p| due.contains(uid_of(p)) && !super::jobs::has_finalizers(p))
            {
                self.store.delete(&PODS, &ns, &name);
            }
        }
        for uid in due {
            self.timers.remove(&uid);
        }
    }

    /// The scheduler over the unbound pods (the index lists them), reading only the load of
    /// the nodes a pod may go to.
    fn schedule_indexed(&mut self, now: Instant, wall: jiff::Timestamp) {
        let pending: Vec<Value> = self
            .inc
            .index
            .unbound
            .iter()
            .filter_map(|(ns, name)| self.store.get(&PODS, ns, name))
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
        // per node, filled lazily for the candidates: see `scheduler::Load`
        let mut load = super::scheduler::Load::new();
        for pod in &pending {
            let tolerations: Vec<k8s_openapi::api::core::v1::Toleration> = pod
                .pointer("/spec/tolerations")
                .and_then(|t| serde_json::from_value(t.clone()).ok())
                .unwrap_or_default();
            let selector: BTreeMap<String, String> = pod
                .pointer("/spec/nodeSelector")
                .and_then(|s| serde_json::from_value(s.clone()).ok())
                .unwrap_or_default();
            let owner = controller_of(pod).map(|(_, _, u)| u);
            let candidates: Vec<&NodeView> = self
                .inc
                .views
                .values()
                .filter(|n| can_schedule(&tolerations, &selector, n))
                .collect();
            for n in &candidates {
                if load.contains_key(&n.name) {
                    continue;
                }
                let mut l: (usize, HashMap<String, usize>) = Default::default();
                for (ns, name) in self.inc.index.by_node.get(&n.name).into_iter().flatten() {
                    let Some(p) = self.store.get(&PODS, ns, name) else {
                        continue;
                    };
                    if is_terminating(p) {
                        continue;
                    }
                    l.0 += 1;
                    if let Some((_, _, u)) = controller_of(p) {
                        *l.1.entry(u).or_default() += 1;
                    }
                }
                load.insert(n.name.clone(), l);
            }
            let choice = candidates
                .into_iter()
                .min_by_key(|n| {
                    super::scheduler::spread_key(&load, owner.as_ref(), &tolerations, n)
                })
                .map(|n| (n.name.clone(), n.address.clone()));
            let nodes = self.inc.views.len();
            self.place(
                pod,
                owner.as_ref(),
                choice.as_ref().map(|(n, a)| (n.as_str(), a.as_str())),
                &mut load,
                nodes,
                now,
                wall,
            );
        }
    }

    /// The kubelet over the pods changed since `since`, the pods on Nodes changed since then
    /// or whose crash-looping components changed, and the pods whose start timer is due.
    fn kubelet_dirty(&mut self, since: u64, now: Instant, wall: jiff::Timestamp) {
        let Some(events) = self.store.changes_since(since) else {
            let nodes = self.views_vec();
            self.kubelet(&nodes, now, wall);
            self.inc.crash_dirty.clear();
            return;
        };
        self.catch_up();
        let touched = Touched::of(&events);
        let mut keys = touched.pods;
        let crash = std::mem::take(&mut self.inc.crash_dirty);
        for node in touched.nodes.iter().chain(crash.iter()) {
            keys.extend(
                self.inc
                    .index
                    .by_node
                    .get(node)
                    .into_iter()
                    .flatten()
                    .cloned(),
            );
        }
        for (uid, t) in &self.timers {
            if t.ready_at.is_some_and(|r| r <= now)
                && let Some(k) = self.inc.index.uids.get(uid)
            {
                keys.insert(k.clone());
            }
        }
        // run-to-completion containers that exit now
        for (uid, end) in &self.runs {
            if *end <= now
                && let Some(k) = self.inc.index.uids.get(uid)
            {
                keys.insert(k.clone());
            }
        }
        let mut out = KubeletOut::default();
        self.inc.pods_examined += keys.len() as u64;
        for (ns, name) in &keys {
            let Some(pod) = self.store.get(&PODS, ns, name) else {
                continue;
            };
            let view = self.inc.views.get(node_name(pod));
            self.kubelet_pod(pod, view, now, wall, &mut out);
        }
        self.kubelet_apply(out, wall);
    }

    /// The controllers' statuses: a DaemonSet's when its object, its pods or a Node changed
    /// since `since`; every ReplicaSet's and Deployment's (a few, from the index); a PDB's when
    /// it, a pod it selects or a controller whose scale it read changed.
    fn statuses_dirty(&mut self, since: u64, wall: jiff::Timestamp) {
        let Some(events) = self.store.changes_since(since) else {
            self.statuses(wall);
            self.inc.ds_desired.clear();
            self.inc.pdb_deps.clear();
            return;
        };
        self.catch_up();
        let touched = Touched::of(&events);
        let mut writes = Vec::new();
        let mut seen_ds: HashSet<String> = HashSet::new();
        for ds_value in self.store.list_owned(&DAEMONSETS, None) {
            let Some(ctx) = DsCtx::of(&ds_value) else {
                continue;
            };
            seen_ds.insert(ctx.uid.clone());
            let uid = ctx.uid.as_str();
            // a new template changes where the DaemonSet may run: count every node again
            let fresh = self
                .inc
                .ds_desired
                .get(uid)
                .is_none_or(|d| d.hash != ctx.hash);
            let pod_nodes = touched.owner_nodes.get(uid);
            if !fresh
                && touched.nodes.is_empty()
                && pod_nodes.is_none()
                && !touched.uids.contains(uid)
            {
                continue;
            }
            let agg = self.inc.index.aggs.get(uid).cloned().unwrap_or_default();
            let mut desired = if fresh {
                DsDesired {
                    hash: ctx.hash.clone(),
                    ..DsDesired::default()
                }
            } else {
                self.inc.ds_desired.remove(uid).unwrap_or_default()
            };
            let nodes: Vec<String> = if fresh {
                self.inc.views.keys().cloned().collect()
            } else {
                touched
                    .nodes
                    .iter()
                    .chain(pod_nodes.into_iter().flatten())
                    .cloned()
                    .collect()
            };
            for n in nodes {
                let counted = self.inc.views.get(&n).is_some_and(|v| {
                    can_schedule(&ctx.tolerations, &ctx.selector, v)
                        || agg.per_node.get(&n).is_some_and(|c| *c > 0)
                });
                let before = desired.nodes.insert(n, counted).unwrap_or(false);
                match (before, counted) {
                    (false, true) => desired.count += 1,
                    (true, false) => desired.count -= 1,
                    _ => {}
                }
            }
            let status = json!({
                "currentNumberScheduled": agg.active,
                "desiredNumberScheduled": desired.count,
                "numberMisscheduled": 0,
                "numberReady": agg.ready,
                "numberAvailable": agg.ready,
                "numberUnavailable": desired.count.saturating_sub(agg.ready),
                "updatedNumberScheduled": agg.by_hash.get(&ctx.hash).copied().unwrap_or(0),
                "observedGeneration": ds_value.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
            });
            self.inc.ds_desired.insert(ctx.uid.clone(), desired);
            writes.push((&DAEMONSETS, ds_value, status));
        }
        self.inc
            .ds_desired
            .retain(|uid, _| touched.uids.contains(uid) || seen_ds.contains(uid));
        for rs_value in self.store.list_owned(&REPLICASETS, None) {
            let agg = self
                .inc
                .index
                .aggs
                .get(uid_of(&rs_value))
                .cloned()
                .unwrap_or_default();
            let status = json!({
                "replicas": agg.active,
                "fullyLabeledReplicas": agg.active,
                "readyReplicas": agg.ready,
                "availableReplicas": agg.ready,
                "observedGeneration": rs_value.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
            });
            writes.push((&REPLICASETS, rs_value, status));
        }
        for (rt, obj, status) in writes {
            self.put_status(rt, &obj, status, wall);
        }
        // with this phase's own status writes counted as changes
        let Some(events) = self.store.changes_since(since) else {
            self.deployment_statuses(wall);
            for pdb_value in self.store.list_owned(&PDBS, None) {
                self.pdb_status(&pdb_value, wall);
            }
            self.inc.pdb_deps.clear();
            return;
        };
        if events
            .iter()
            .any(|e| e.res == DEPLOYMENTS.key() || e.res == REPLICASETS.key())
        {
            // a Deployment's status reads only it and its ReplicaSets
            self.deployment_statuses(wall);
        }
        let events = self.store.changes_since(since).unwrap_or_default();
        let touched = Touched::of(&events);
        let pods: Vec<&Value> = events
            .iter()
            .filter(|e| e.res == PODS.key())
            .flat_map(|e| std::iter::once(&e.object).chain(e.old.as_ref()))
            .collect();
        for pdb_value in self.store.list_owned(&PDBS, None) {
            let key = key_of(&pdb_value);
            let ns = key.0.as_str();
            let dirty = match self.inc.pdb_deps.get(&key) {
                None => true,
                Some(deps) => {
                    touched
                        .objects
                        .contains(&(PDBS.key(), key.0.clone(), key.1.clone()))
                        || [&REPLICASETS, &DEPLOYMENTS, &DAEMONSETS].iter().any(|rt| {
                            deps.iter().any(|(kind, name)| {
                                kind == rt.kind
                                    && touched.objects.contains(&(
                                        rt.key(),
                                        ns.to_string(),
                                        name.clone(),
                                    ))
                            })
                        })
                        || {
                            let selector = LabelSelector::from_structured(
                                from_value::<PodDisruptionBudget>(&pdb_value)
                                    .and_then(|p| p.spec)
                                    .and_then(|s| s.selector)
                                    .as_ref(),
                            );
                            selector.is_some_and(|s| {
                                pods.iter().any(|p| {
                                    ns_of(p) == ns
                                        && s.matches(&crate::sim::kube::selector::labels_of(p))
                                })
                            })
                        }
                }
            };
            if !dirty {
                continue;
            }
            let deps = self.pdb_controllers(&pdb_value);
            self.inc.pdb_deps.insert(key, deps);
            self.pdb_status(&pdb_value, wall);
        }
        self.inc
            .pdb_deps
            .retain(|(ns, name), _| self.store.get(&PDBS, ns, name).is_some());
    }

    /// The controllers (kind, name) whose scale a PDB's status reads: its pods' controllers
    /// and, for a ReplicaSet, the Deployment that owns it.
    fn pdb_controllers(&self, pdb_value: &Value) -> BTreeSet<(String, String)> {
        let ns = ns_of(pdb_value);
        let selector = LabelSelector::from_structured(
            from_value::<PodDisruptionBudget>(pdb_value)
                .and_then(|p| p.spec)
                .and_then(|s| s.selector)
                .as_ref(),
        );
        let mut deps = BTreeSet::new();
        for p in self.store.list(&PODS, Some(ns)).filter(|p| {
            selector
                .as_ref()
                .is_some_and(|s| s.matches(&crate::sim::kube::selector::labels_of(p)))
        }) {
            if let Some((kind, name, _)) = controller_of(p) {
                if kind == "ReplicaSet"
                    && let Some(rs) = self.store.get(&REPLICASETS, ns, &name)
                    && let Some((k, d, _)) = controller_of(rs)
                {
                    deps.insert((k, d));
                }
                deps.insert((kind, name));
            }
        }
        deps
    }
}
