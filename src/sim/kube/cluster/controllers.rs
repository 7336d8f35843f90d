//! The workload controllers: DaemonSet (one pod per eligible node, template-hash rollouts),
//! Deployment (one ReplicaSet per template) and ReplicaSet (replica count).

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::scheduler::{can_schedule, can_stay};
use super::{
    KubeSide, NewPod, NodeView, TAINT_NOT_READY, TAINT_UNREACHABLE, TAINT_UNSCHEDULABLE,
    controller_of, from_value, is_terminating, node_name, phase, pod_ready, short_hash, to_value,
};
use crate::sim::kube::resources::{DAEMONSETS, DEPLOYMENTS, PODS, REPLICASETS, ResourceType};
use crate::sim::kube::store::{name_of, ns_of, uid_of};

/// What the DaemonSet controller reads of one of its pods.
pub(super) struct DsPod {
    pub ns: String,
    pub name: String,
    pub node: String,
    pub terminating: bool,
    /// Labelled with the DaemonSet template's current hash.
    pub current: bool,
}

impl DsPod {
    pub fn of(p: &Value, hash: &str) -> DsPod {
        DsPod {
            ns: ns_of(p).to_string(),
            name: name_of(p).to_string(),
            node: node_name(p).to_string(),
            terminating: is_terminating(p),
            current: p
                .pointer("/metadata/labels/controller-revision-hash")
                .and_then(Value::as_str)
                == Some(hash),
        }
    }
}

/// What the DaemonSet controller decides a DaemonSet's pods with.
pub(super) struct DsCtx {
    pub ns: String,
    pub name: String,
    pub uid: String,
    pub hash: String,
    pub generation: String,
    pub owner: OwnerReference,
    pub template: k8s_openapi::api::core::v1::PodTemplateSpec,
    /// The template's tolerations plus the ones the controller adds.
    pub tolerations: Vec<Toleration>,
    pub selector: BTreeMap<String, String>,
}

impl DsCtx {
    pub fn of(ds_value: &Value) -> Option<DsCtx> {
        let ds = from_value::<DaemonSet>(ds_value)?;
        let spec = ds.spec?;
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
        Some(DsCtx {
            ns: ns_of(ds_value).to_string(),
            name: name_of(ds_value).to_string(),
            uid: uid_of(ds_value).to_string(),
            hash,
            generation: ds_value
                .pointer("/metadata/generation")
                .map(|g| g.to_string())
                .unwrap_or_else(|| "1".into()),
            owner: owner_ref(&DAEMONSETS, ds_value),
            template: spec.template,
            tolerations,
            selector,
        })
    }
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
pub(super) fn daemonset_tolerations() -> Vec<Toleration> {
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

impl KubeSide {
    pub(super) fn daemonsets(&mut self, nodes: &[NodeView], now: Instant, wall: jiff::Timestamp) {
        for ds_value in self.store.list_owned(&DAEMONSETS, None) {
            let Some(ctx) = DsCtx::of(&ds_value) else {
                continue;
            };
            // the DaemonSet's pods, as much of them as the decisions below read
            let uid = uid_of(&ds_value);
            let pods: Vec<DsPod> = self
                .store
                .list(&PODS, None)
                .filter(|p| controller_of(p).is_some_and(|(_, _, u)| u == uid))
                .map(|p| DsPod::of(p, &ctx.hash))
                .collect();
            let mut by_node: HashMap<&str, Vec<&DsPod>> = HashMap::new();
            for p in pods.iter().filter(|p| !p.terminating) {
                by_node.entry(p.node.as_str()).or_default().push(p);
            }
            for node in nodes {
                let here = by_node.remove(node.name.as_str()).unwrap_or_default();
                self.daemonset_node(&ctx, node, &here, now, wall);
            }
            let present: HashSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
            for p in pods.iter().filter(|p| !present.contains(p.node.as_str())) {
                self.terminate(&p.ns, &p.name, now, wall);
            }
        }
    }

    /// The DaemonSet controller on one node: keep exactly one current pod where the
    /// DaemonSet may run (`here`: its non-terminating pods on the node).
    pub(super) fn daemonset_node(
        &mut self,
        ctx: &DsCtx,
        node: &NodeView,
        here: &[&DsPod],
        now: Instant,
        wall: jiff::Timestamp,
    ) {
        let stay = can_stay(&ctx.tolerations, node)
            && ctx
                .selector
                .iter()
                .all(|(k, v)| node.labels.get(k) == Some(v));
        let mut has_current = false;
        for p in here {
            if !stay || !p.current || has_current {
                self.terminate(&p.ns, &p.name, now, wall);
            } else {
                has_current = true;
            }
        }
        if !has_current && can_schedule(&ctx.tolerations, &ctx.selector, node) {
            let labels = [
                ("controller-revision-hash".to_string(), ctx.hash.clone()),
                (
                    "pod-template-generation".to_string(),
                    ctx.generation.clone(),
                ),
            ]
            .into();
            let new = NewPod {
                ns: &ctx.ns,
                base: &ctx.name,
                template: &ctx.template,
                owner: ctx.owner.clone(),
                node: Some(&node.name),
                extra_labels: labels,
                extra_tolerations: daemonset_tolerations(),
            };
            self.create_pod(new, now, wall);
        }
    }

    pub(super) fn deployments(&mut self, wall: jiff::Timestamp) {
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

    /// The ReplicaSet controller; `only`: just these ReplicaSets (by uid), their pods found
    /// through the incremental pass's index instead of scanning every pod.
    pub(super) fn replicasets(
        &mut self,
        only: Option<&HashSet<String>>,
        now: Instant,
        wall: jiff::Timestamp,
    ) {
        for rs_value in self.store.list_owned(&REPLICASETS, None) {
            if only.is_some_and(|o| !o.contains(uid_of(&rs_value))) {
                continue;
            }
            let Some(rs) = from_value::<ReplicaSet>(&rs_value) else {
                continue;
            };
            let Some(spec) = rs.spec else { continue };
            let Some(template) = spec.template else {
                continue;
            };
            let want = spec.replicas.unwrap_or(1).max(0) as usize;
            let owned = if only.is_some() {
                self.inc.owned_pods(&self.store, uid_of(&rs_value))
            } else {
                self.pods_owned_by(uid_of(&rs_value))
            };
            let active: Vec<Value> = owned
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
}
