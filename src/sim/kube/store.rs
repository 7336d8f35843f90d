//! The simulated apiserver's object store: every object as JSON, keyed by resource type,
//! namespace and name, with the apiserver's bookkeeping (`uid`, `resourceVersion`,
//! `creationTimestamp`, `generation`) and a bounded event history that watches replay from.
//!
//! Invariant: every change bumps the single cluster-wide resourceVersion exactly once and
//! emits exactly one watch event; writing an identical object changes nothing.
//!
//! Pods are also indexed by `spec.nodeName` ([`Store::pods_on_node`]), updated in the same
//! call as the object itself, so a `fieldSelector=spec.nodeName=…` list reads the pods of one
//! node instead of every pod (the real apiserver's watch cache keeps the same index:
//! kubernetes `pkg/registry/core/pod/storage/storage.go` registers `pod.NodeNameIndexFunc`
//! from `pkg/registry/core/pod/strategy.go` as the cacher's `spec.nodeName` indexer).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::resources::{JOBS, PODS, ResKey, ResourceType};
use super::selector::field_text;

/// `(resource, namespace or "", name)`.
pub(crate) type ObjKey = (ResKey, String, String);

/// A watch's subscription plus the retained events it must replay first.
pub(crate) type WatchStart = (broadcast::Receiver<Arc<Event>>, Vec<Arc<Event>>);

/// How many past events a watch can resume from.
const HISTORY: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug)]
pub(crate) struct Event {
    pub rv: u64,
    pub res: ResKey,
    pub kind: EventType,
    /// The object after the change (before it, for deletions).
    pub object: Value,
    /// The object before the change, for selector transitions.
    pub old: Option<Value>,
}

/// Kubernetes' `Time` format: RFC 3339 with second precision, UTC.
pub(crate) fn k8s_time(ts: jiff::Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub(crate) fn ns_of(obj: &Value) -> &str {
    obj.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub(crate) fn name_of(obj: &Value) -> &str {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub(crate) fn uid_of(obj: &Value) -> &str {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Whether everything but `metadata` and `status` (what `generation` tracks) is the same in
/// both, compared in place.
fn same_spec(a: &Value, b: &Value) -> bool {
    let tracked = |m: &'_ serde_json::Map<String, Value>| {
        m.iter()
            .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status"))
            .count()
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            tracked(x) == tracked(y)
                && x.iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status"))
                    .all(|(k, v)| y.get(k) == Some(v))
        }
        _ => a == b,
    }
}

/// `spec.nodeName` of a pod as a field selector reads it (`""`: not bound).
fn pod_node(pod: &Value) -> Cow<'_, str> {
    field_text(pod.pointer("/spec/nodeName"))
}

pub(crate) struct Store {
    objects: BTreeMap<ObjKey, Value>,
    /// `spec.nodeName` (`""` for unbound pods) → `(namespace, name)` of the pods stored with
    /// it, in store order; exact against `objects` after every call.
    pods_by_node: HashMap<String, BTreeSet<(String, String)>>,
    rv: u64,
    history: VecDeque<Arc<Event>>,
    /// Events up to and including this resourceVersion are no longer in `history`.
    compacted: u64,
    events: broadcast::Sender<Arc<Event>>,
    uid_seed: u64,
    uid_counter: u64,
}

impl Store {
    pub fn new(uid_seed: u64) -> Store {
        let (events, _) = broadcast::channel(4096);
        Store {
            objects: BTreeMap::new(),
            pods_by_node: HashMap::new(),
            rv: 1000,
            history: VecDeque::new(),
            compacted: 1000,
            events,
            uid_seed,
            uid_counter: 0,
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    fn new_uid(&mut self) -> String {
        self.uid_counter += 1;
        let a = self.uid_seed ^ self.uid_counter.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (a >> 32) as u32,
            (a >> 16) as u16,
            (a as u16) & 0xfff,
            (self.uid_counter as u16) & 0xfff,
            self.uid_counter & 0xffff_ffff_ffff
        )
    }

    pub fn get(&self, rt: &'static ResourceType, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&(rt.key(), ns.to_string(), name.to_string()))
    }

    /// Objects of a type, optionally in one namespace, sorted by namespace and name.
    pub fn list<'a>(
        &'a self,
        rt: &'static ResourceType,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        let key = rt.key();
        self.objects
            .range((key, String::new(), String::new())..)
            .take_while(move |((k, _, _), _)| *k == key)
            .filter(move |((_, n, _), _)| ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v)
    }

    /// The pods whose `spec.nodeName` is `node` (`""`: unbound pods), optionally in one
    /// namespace, in the order of [`Self::list`]: what `list(&PODS, ns)` filtered on the node
    /// name yields, read from the index.
    pub fn pods_on_node<'a>(
        &'a self,
        node: &str,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        let key = PODS.key();
        self.pods_by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter(move |(n, _)| ns.is_none_or(|ns| ns == n))
            .filter_map(move |(n, name)| self.objects.get(&(key, n.clone(), name.clone())))
    }

    /// Keep [`Self::pods_by_node`] in step with `objects` for the object at `key` changing
    /// from `old` to `new`.
    fn reindex(&mut self, key: &ObjKey, old: Option<&Value>, new: Option<&Value>) {
        if key.0 != PODS.key() {
            return;
        }
        let (old_node, new_node) = (old.map(pod_node), new.map(pod_node));
        if old_node == new_node {
            return;
        }
        let pod = (key.1.clone(), key.2.clone());
        if let Some(node) = old_node
            && let Some(set) = self.pods_by_node.get_mut(node.as_ref())
        {
            set.remove(&pod);
            if set.is_empty() {
                self.pods_by_node.remove(node.as_ref());
            }
        }
        if let Some(node) = new_node {
            self.pods_by_node
                .entry(node.into_owned())
                .or_default()
                .insert(pod);
        }
    }

    /// Cloned objects of a type (for controllers that write while iterating).
    pub fn list_owned(&self, rt: &'static ResourceType, ns: Option<&str>) -> Vec<Value> {
        self.list(rt, ns).cloned().collect()
    }

    fn emit(&mut self, res: ResKey, kind: EventType, object: Value, old: Option<Value>) {
        let ev = Arc::new(Event {
            rv: self.rv,
            res,
            kind,
            object,
            old,
        });
        if self.history.len() == HISTORY
            && let Some(dropped) = self.history.pop_front()
        {
            self.compacted = dropped.rv;
        }
        self.history.push_back(ev.clone());
        let _ = self.events.send(ev);
    }

    /// Create a new object; `Err(existing)` when the name is taken.
    #[allow(
        clippy::expect_used,
        reason = "callers pass objects checked to be JSON objects by the API layer"
    )]
    pub fn create(
        &mut self,
        rt: &'static ResourceType,
        mut obj: Value,
        now: jiff::Timestamp,
    ) -> Result<Value, Value> {
        let key = (rt.key(), ns_of(&obj).to_string(), name_of(&obj).to_string());
        if let Some(existing) = self.objects.get(&key) {
            return Err(existing.clone());
        }
        self.rv += 1;
        let uid = self.new_uid();
        let has_spec = obj.get("spec").is_some();
        let meta = obj
            .as_object_mut()
            .expect("objects are JSON objects")
            .entry("metadata")
            .or_insert_with(|| json!({}));
        meta["uid"] = json!(uid);
        meta["resourceVersion"] = json!(self.rv.to_string());
        meta["creationTimestamp"] = json!(k8s_time(now));
        if has_spec {
            meta["generation"] = json!(1);
        }
        obj["apiVersion"] = json!(rt.api_version());
        obj["kind"] = json!(rt.kind);
        if rt.key() == JOBS.key() {
            // what the Job strategy does once the object has its uid (generated selector)
            super::batch::prepare_for_create(&mut obj);
        }
        self.reindex(&key, None, Some(&obj));
        self.objects.insert(key, obj.clone());
        self.emit(rt.key(), EventType::Added, obj.clone(), None);
        Ok(obj)
    }

    /// Replace an existing object (creating it if absent), keeping its identity (`uid`,
    /// `creationTimestamp`) and bumping `generation` when anything outside metadata and
    /// status changed. Returns the stored object; an identical write changes nothing.
    pub fn put(
        &mut self,
        rt: &'static ResourceType,
        mut obj: Value,
        now: jiff::Timestamp,
    ) -> Value {
        let key = (rt.key(), ns_of(&obj).to_string(), name_of(&obj).to_string());
        let Some(old) = self.objects.get(&key) else {
            return match self.create(rt, obj, now) {
                Ok(v) | Err(v) => v,
            };
        };
        obj["apiVersion"] = json!(rt.api_version());
        obj["kind"] = json!(rt.kind);
        for field in ["uid", "creationTimestamp", "resourceVersion"] {
            if let Some(v) = old.pointer(&format!("/metadata/{field}")) {
                obj["metadata"][field] = v.clone();
            }
        }
        let old_gen = old.pointer("/metadata/generation").and_then(Value::as_i64);
        if let Some(g) = old_gen {
            let bumped = if !same_spec(old, &obj) { g + 1 } else { g };
            obj["metadata"]["generation"] = json!(bumped);
        } else if obj.get("spec").is_some() {
            obj["metadata"]["generation"] = json!(1);
        }
        if obj == *old {
            return old.clone();
        }
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let old = self.objects.insert(key.clone(), obj.clone());
        self.reindex(&key, old.as_ref(), Some(&obj));
        self.emit(rt.key(), EventType::Modified, obj.clone(), old);
        obj
    }

    /// Remove an object, returning it as it was.
    pub fn delete(&mut self, rt: &'static ResourceType, ns: &str, name: &str) -> Option<Value> {
        let key = (rt.key(), ns.to_string(), name.to_string());
        let mut old = self.objects.remove(&key)?;
        self.reindex(&key, Some(&old), None);
        self.rv += 1;
        old["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.emit(rt.key(), EventType::Deleted, old.clone(), None);
        Some(old)
    }

    /// Every object (tests compare whole stores).
    #[cfg(test)]
    pub fn objects(&self) -> &BTreeMap<ObjKey, Value> {
        &self.objects
    }

    /// Whether the events after `since` are all retained.
    pub fn retains(&self, since: u64) -> bool {
        since >= self.compacted
    }

    /// The retained events after `since`, oldest first; `None` when `since` is older than
    /// the retained history (the simulated cluster then re-derives everything).
    pub fn changes_since(&self, since: u64) -> Option<Vec<Arc<Event>>> {
        if since < self.compacted {
            return None;
        }
        let first = self.history.partition_point(|e| e.rv <= since);
        Some(self.history.range(first..).cloned().collect())
    }

    /// Subscribe to future events and collect the retained events after `since`.
    /// `None` when `since` is older than the retained history (the watch gets 410 Gone).
    pub fn watch_from(&self, since: u64) -> Option<WatchStart> {
        if since < self.compacted {
            return None;
        }
        let rx = self.events.subscribe();
        let replay = self
            .history
            .iter()
            .filter(|e| e.rv > since)
            .cloned()
            .collect();
        Some((rx, replay))
    }

    /// Subscribe to future events only.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }

    pub fn has_watchers(&self) -> bool {
        self.events.receiver_count() > 0
    }
}

#[cfg(test)]
mod tests {
    use super::super::resources::CONFIGMAPS;
    use super::*;

    fn now() -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_700_000_000).unwrap()
    }

    #[test]
    fn identical_writes_change_nothing_and_changes_bump_once() {
        let mut s = Store::new(7);
        let cm = json!({"metadata": {"name": "a", "namespace": "default"}, "data": {"k": "v"}});
        let created = s.create(&CONFIGMAPS, cm.clone(), now()).unwrap();
        let rv = s.resource_version();
        assert_eq!(created["metadata"]["resourceVersion"], rv.to_string());
        assert_eq!(
            created["metadata"]["creationTimestamp"],
            "2023-11-14T22:13:20Z"
        );
        let same = s.put(&CONFIGMAPS, cm.clone(), now());
        assert_eq!(s.resource_version(), rv);
        assert_eq!(same, created);
        let mut changed = cm;
        changed["data"]["k"] = json!("w");
        let updated = s.put(&CONFIGMAPS, changed, now());
        assert_eq!(s.resource_version(), rv + 1);
        assert_eq!(updated["metadata"]["uid"], created["metadata"]["uid"]);
        let (_rx, replay) = s.watch_from(rv).unwrap();
        assert_eq!(replay.len(), 1);
        assert_eq!(replay[0].kind, EventType::Modified);
        assert!(
            s.create(
                &CONFIGMAPS,
                json!({"metadata": {"name": "a", "namespace": "default"}}),
                now()
            )
            .is_err()
        );
    }

    #[test]
    fn generation_tracks_spec_changes_only() {
        use super::super::resources::DEPLOYMENTS;
        let mut s = Store::new(1);
        let d = json!({"metadata": {"name": "d", "namespace": "default"}, "spec": {"replicas": 1}});
        s.create(&DEPLOYMENTS, d.clone(), now()).unwrap();
        let mut with_status = d.clone();
        with_status["status"] = json!({"replicas": 1});
        let v = s.put(&DEPLOYMENTS, with_status, now());
        assert_eq!(v["metadata"]["generation"], 1);
        let mut scaled = d;
        scaled["spec"]["replicas"] = json!(2);
        let v = s.put(&DEPLOYMENTS, scaled, now());
        assert_eq!(v["metadata"]["generation"], 2);
    }
}
