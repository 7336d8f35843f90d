//! The scheduler: binds pending pods to nodes whose `NoSchedule`/`NoExecute` taints they
//! tolerate and whose labels match their nodeSelector, preferring nodes with fewer
//! `PreferNoSchedule` taints they do not tolerate, then spreading them over the least-loaded
//! nodes (design/sim.md cites upstream's TaintToleration plugin).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Taint, Toleration};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{
    KubeSide, NodeView, PodTimer, condition, controller_of, is_terminating, node_name, phase,
    to_value,
};
use crate::sim::kube::resources::PODS;
use crate::sim::kube::store::{k8s_time, uid_of};

/// Per node: the pods bound to it (not terminating), and how many of each controller (by uid).
pub(super) type Load = HashMap<String, (usize, HashMap<String, usize>)>;

/// The scheduler's preference among feasible nodes (smallest first): fewest `PreferNoSchedule`
/// taints the pod does not tolerate (upstream's TaintToleration score plugin, which never
/// excludes such a node: with no other node feasible the pod still lands on it), then fewest
/// pods of the same controller, then fewest pods, then the name.
pub(super) fn spread_key(
    load: &Load,
    owner: Option<&String>,
    tolerations: &[Toleration],
    node: &NodeView,
) -> (usize, usize, usize, String) {
    let (total, same) = load.get(&node.name).map_or((0, 0), |(total, by)| {
        (*total, owner.and_then(|o| by.get(o)).copied().unwrap_or(0))
    });
    (
        intolerable_preferences(tolerations, node),
        same,
        total,
        node.name.clone(),
    )
}

/// How many of the node's `PreferNoSchedule` taints the pod does not tolerate (upstream
/// `countIntolerableTaintsPreferNoSchedule`: only tolerations with that effect, or none, count).
pub(super) fn intolerable_preferences(tolerations: &[Toleration], node: &NodeView) -> usize {
    node.taints
        .iter()
        .filter(|t| t.effect == "PreferNoSchedule" && !tolerates(tolerations, t))
        .count()
}

impl KubeSide {
    /// Bind `pod` to `choice` (node name, address) and count it in `load`, or, with no feasible
    /// node among `nodes`, mark it Unschedulable (once). Both scheduler passes (the full one
    /// and the dirty-set one) end here.
    #[allow(
        clippy::too_many_arguments,
        reason = "one scheduling decision and its context"
    )]
    pub(super) fn place(
        &mut self,
        pod: &Value,
        owner: Option<&String>,
        choice: Option<(&str, &str)>,
        load: &mut Load,
        nodes: usize,
        now: Instant,
        wall: jiff::Timestamp,
    ) {
        let mut next = pod.clone();
        match choice {
            Some((node, address)) => {
                let l = load.entry(node.to_string()).or_default();
                l.0 += 1;
                if let Some(o) = owner {
                    *l.1.entry(o.clone()).or_default() += 1;
                }
                self.record(crate::sim::kube::ClusterRecord::Bound {
                    pod: format!(
                        "{}/{}",
                        pod.pointer("/metadata/namespace")
                            .and_then(Value::as_str)
                            .unwrap_or(""),
                        pod.pointer("/metadata/name")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                    ),
                    node: node.to_string(),
                });
                next["spec"]["nodeName"] = json!(node);
                next["status"]["hostIP"] = json!(address);
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
                        "0/{nodes} nodes are available: no node is Ready, schedulable and free of untolerated taints."
                    ));
                    next["status"]["conditions"] = json!([to_value(&c)]);
                    self.store.put(&PODS, next, wall);
                }
            }
        }
    }
}

pub(super) fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
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
pub(super) fn can_schedule(
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
pub(super) fn can_stay(tolerations: &[Toleration], node: &NodeView) -> bool {
    node.taints
        .iter()
        .filter(|t| t.effect == "NoExecute")
        .all(|t| tolerates(tolerations, t))
}

impl KubeSide {
    pub(super) fn schedule(&mut self, nodes: &[NodeView], now: Instant, wall: jiff::Timestamp) {
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
        let mut load = Load::new();
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
                .min_by_key(|n| spread_key(&load, owner.as_ref(), &tolerations, n))
                .map(|n| (n.name.as_str(), n.address.as_str()));
            self.place(
                pod,
                owner.as_ref(),
                choice,
                &mut load,
                nodes.len(),
                now,
                wall,
            );
        }
    }
}
