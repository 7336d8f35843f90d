//! The disruption controller's arithmetic (a PodDisruptionBudget's allowed disruptions) and the
//! eviction subresource that enforces it.

use std::collections::BTreeMap;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;
use tokio::time::Instant;

use super::{KubeSide, controller_of, from_value, is_terminating, phase, pod_ready};
use crate::sim::kube::resources::{DAEMONSETS, DEPLOYMENTS, PDBS, PODS, REPLICASETS, STATEFULSETS};
use crate::sim::kube::selector::{LabelSelector, selects};
use crate::sim::kube::status::ApiError;

/// The numbers a PodDisruptionBudget decides with (the disruption controller's status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PdbCalc {
    pub expected: i32,
    pub current_healthy: i32,
    pub desired_healthy: i32,
    pub disruptions_allowed: i32,
    /// Why the disruption controller could not sync the budget (upstream's `failSafe`: it then
    /// writes `disruptionsAllowed: 0` and a `SyncFailed` condition and keeps the rest of the
    /// status as it was); `None` when it could.
    pub sync_failed: Option<String>,
}

pub(super) fn scaled(v: &IntOrString, total: i32, round_up: bool) -> i32 {
    match v {
        IntOrString::Int(i) => *i,
        IntOrString::String(s) => {
            let pct: f64 = s.trim_end_matches('%').parse().unwrap_or(0.0);
            let x = pct * f64::from(total) / 100.0;
            (if round_up { x.ceil() } else { x.floor() }) as i32
        }
    }
}

impl KubeSide {
    /// The disruption controller's arithmetic for one PDB.
    pub fn pdb_calc(&self, pdb: &PodDisruptionBudget, ns: &str) -> PdbCalc {
        let spec = pdb.spec.clone().unwrap_or_default();
        let selector = LabelSelector::from_structured(spec.selector.as_ref());
        let pods: Vec<Value> = self
            .store
            .list(&PODS, Some(ns))
            .filter(|p| {
                selector
                    .as_ref()
                    .is_some_and(|s| s.matches(&crate::sim::kube::selector::labels_of(p)))
            })
            .cloned()
            .collect();
        let healthy = pods
            .iter()
            .filter(|p| !is_terminating(p) && pod_ready(p))
            .count() as i32;
        // The scale of the pods' controllers (a Deployment's via its ReplicaSet).
        let mut controllers: BTreeMap<String, i32> = BTreeMap::new();
        let mut uncontrolled = None;
        for p in &pods {
            match controller_of(p) {
                Some((kind, name, uid)) => {
                    let scale = self.controller_scale(&kind, ns, &name);
                    controllers.insert(uid, scale);
                }
                None => {
                    uncontrolled
                        .get_or_insert_with(|| crate::sim::kube::store::name_of(p).to_string());
                }
            }
        }
        let scale_total: i32 = controllers.values().sum::<i32>();
        // A percentage or `maxUnavailable` needs the controllers' scale, which upstream's
        // `getExpectedScale` cannot find for a pod without a controller: the sync fails.
        let needs_scale = spec.max_unavailable.is_some()
            || matches!(spec.min_available, Some(IntOrString::String(_)));
        if needs_scale && let Some(pod) = uncontrolled {
            return PdbCalc {
                expected: 0,
                current_healthy: healthy,
                desired_healthy: 0,
                disruptions_allowed: 0,
                sync_failed: Some(format!("found no controller ref for pod \"{pod}\"")),
            };
        }
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
        // `updatePdbStatus`: nothing is allowed while no pod is expected.
        let mut allowed = if expected <= 0 {
            0
        } else {
            (healthy - desired).max(0)
        };
        if self.pdb_never_allows(ns, pdb.metadata.name.as_deref().unwrap_or("")) {
            allowed = 0;
        }
        PdbCalc {
            expected,
            current_healthy: healthy,
            desired_healthy: desired,
            disruptions_allowed: allowed,
            sync_failed: None,
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
            // The disruption controller's `getPodStatefulSet`: the StatefulSet's
            // `spec.replicas` (the simulator runs no StatefulSet controller; a pod naming one
            // that does not exist counts as one, as before).
            "StatefulSet" => self.store.get(&STATEFULSETS, ns, name).map_or(1, |s| {
                s.pointer("/spec/replicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(1) as i32
            }),
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
        let labels = crate::sim::kube::selector::labels_of(&pod);
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
}
