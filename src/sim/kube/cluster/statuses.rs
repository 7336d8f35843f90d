//! The status writers of the controllers: DaemonSet, Deployment, ReplicaSet and (the disruption
//! controller) PodDisruptionBudget status, written only when it changed.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

use super::controllers::daemonset_tolerations;
use super::scheduler::can_schedule;
use super::{
    KubeSide, controller_of, from_value, is_terminating, node_name, pod_ready, short_hash, to_value,
};
use crate::sim::kube::resources::{DAEMONSETS, DEPLOYMENTS, PDBS, PODS, REPLICASETS, ResourceType};
use crate::sim::kube::store::{k8s_time, name_of, ns_of, uid_of};

impl KubeSide {
    #[allow(
        clippy::expect_used,
        reason = "k8s_time renders RFC 3339 with a Z offset, which k8s-openapi's Time always parses"
    )]
    pub(super) fn statuses(&mut self, wall: jiff::Timestamp) {
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
        self.deployment_statuses(wall);
        for pdb_value in self.store.list_owned(&PDBS, None) {
            self.pdb_status(&pdb_value, wall);
        }
    }

    /// The Deployment controller's status: summed from its ReplicaSets' status.
    pub(super) fn deployment_statuses(&mut self, wall: jiff::Timestamp) {
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
    }

    /// The disruption controller's status of one PodDisruptionBudget.
    #[allow(
        clippy::expect_used,
        reason = "k8s_time renders RFC 3339 with a Z offset, which k8s-openapi's Time always parses"
    )]
    pub(super) fn pdb_status(&mut self, pdb_value: &Value, wall: jiff::Timestamp) {
        let Some(pdb) = from_value::<PodDisruptionBudget>(pdb_value) else {
            return;
        };
        let calc = self.pdb_calc(&pdb, ns_of(pdb_value));
        if let Some(why) = &calc.sync_failed {
            self.pdb_fail_safe(pdb_value, why, wall);
            return;
        }
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
        self.put_status(&PDBS, pdb_value, to_value(&status), wall);
    }

    /// The disruption controller's `failSafe` (kubernetes `pkg/controller/disruption/
    /// disruption.go`): a budget it could not sync keeps its status but for
    /// `disruptionsAllowed: 0` and a `DisruptionAllowed` condition `False`, reason
    /// `SyncFailed`, with the error as its message; `observedGeneration` is not advanced.
    fn pdb_fail_safe(&mut self, pdb_value: &Value, why: &str, wall: jiff::Timestamp) {
        let mut status = pdb_value
            .get("status")
            .cloned()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        status["disruptionsAllowed"] = json!(0);
        for field in ["currentHealthy", "desiredHealthy", "expectedPods"] {
            if status.get(field).is_none() {
                status[field] = json!(0);
            }
        }
        let old = pdb_value.pointer("/status/conditions/0").filter(|c| {
            c["status"] == "False" && c["reason"] == "SyncFailed" && c["message"] == why
        });
        let since = old
            .and_then(|c| c["lastTransitionTime"].as_str())
            .map_or_else(|| k8s_time(wall), str::to_string);
        let mut condition = json!({
            "type": "DisruptionAllowed",
            "status": "False",
            "reason": "SyncFailed",
            "message": why,
            "lastTransitionTime": since,
        });
        if let Some(g) = status.get("observedGeneration").cloned() {
            condition["observedGeneration"] = g;
        }
        status["conditions"] = json!([condition]);
        self.put_status(&PDBS, pdb_value, status, wall);
    }

    pub(super) fn put_status(
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
}
