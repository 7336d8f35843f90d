//! The CustomResourceDefinition controllers of the apiextensions-apiserver, as far as a client
//! of the API can tell them apart:
//!
//! - the naming controller (`pkg/controller/status/naming_controller.go`) accepts a new
//!   CRD's names at once: `status.acceptedNames`, condition `NamesAccepted=True`
//!   (`NoConflicts`) and, until the CRD is established, `Established=False` with reason
//!   `Installing` ("the initial names have been accepted", `calculateNamesAndConditions`);
//! - the establishing controller (`pkg/controller/establish/establishing_controller.go`) sets
//!   `Established=True` (`InitialNamesAccepted`, "the initial names have been accepted") after
//!   the CRD was queued by `pkg/apiserver/customresource_handler.go`
//!   `updateCustomResourceDefinition`: after 5 s when more than one apiserver runs (an HA
//!   control plane, as Talos runs it), at once otherwise. Here the delay is
//!   [`super::Timing::crd_establish`];
//! - only then do the CRD's kinds appear in discovery (`pkg/apiserver/
//!   customresource_discovery_controller.go` skips CRDs that are not Established) and are
//!   their objects served (`customresource_handler.go` `ServeHTTP` answers 404 for a CRD whose
//!   names are neither accepted nor established).

use serde_json::{Value, json};
use tokio::time::Instant;

use super::KubeSide;
use crate::sim::kube::resources::{self, CRDS, CustomType, ResourceType};
use crate::sim::kube::store::{k8s_time, name_of};

fn condition_true(crd: &Value, kind: &str) -> bool {
    crd.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == kind && c["status"] == "True")
        })
}

/// The types an Established CRD serves: one per version with `served: true`.
fn served_types(crd: &Value) -> Vec<&'static ResourceType> {
    let spec = &crd["spec"];
    let (Some(group), Some(kind), Some(plural)) = (
        spec["group"].as_str(),
        spec.pointer("/names/kind").and_then(Value::as_str),
        spec.pointer("/names/plural").and_then(Value::as_str),
    ) else {
        return Vec::new();
    };
    let singular = spec
        .pointer("/names/singular")
        .and_then(Value::as_str)
        .map_or_else(|| kind.to_ascii_lowercase(), str::to_string);
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"].as_bool().unwrap_or(true))
        .filter_map(|v| v["name"].as_str())
        .map(|version| {
            resources::custom(&CustomType {
                group: group.to_string(),
                version: version.to_string(),
                kind: kind.to_string(),
                plural: plural.to_string(),
                singular: singular.clone(),
                namespaced,
            })
        })
        .collect()
}

impl KubeSide {
    /// Accept the names of new CRDs, establish those whose delay is over, and serve the kinds
    /// of the Established ones.
    pub(super) fn establish_crds(&mut self, now: Instant, wall: jiff::Timestamp) {
        let crds: Vec<Value> = self.store.list(&CRDS, None).cloned().collect();
        let time = k8s_time(wall);
        let mut custom = Vec::new();
        self.crd_due
            .retain(|name, _| crds.iter().any(|c| name_of(c) == name));
        for crd in crds {
            let name = name_of(&crd).to_string();
            let mut status = crd.get("status").cloned().unwrap_or_else(|| json!({}));
            let mut changed = false;
            if !condition_true(&crd, "NamesAccepted") {
                status["acceptedNames"] = crd["spec"]["names"].clone();
                let mut conditions: Vec<Value> =
                    status["conditions"].as_array().cloned().unwrap_or_default();
                conditions.retain(|c| c["type"] != "NamesAccepted");
                conditions.push(json!({
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": time,
                }));
                // `calculateNamesAndConditions`: names accepted and not Established yet is
                // `Established=False`, reason `Installing`, until the establishing controller
                // ran (kstatus reads any other `False` as failed)
                if !condition_true(&crd, "Established") {
                    conditions.retain(|c| c["type"] != "Established");
                    conditions.push(json!({
                        "type": "Established",
                        "status": "False",
                        "reason": "Installing",
                        "message": "the initial names have been accepted",
                        "lastTransitionTime": time,
                    }));
                }
                status["conditions"] = json!(conditions);
                self.crd_due
                    .insert(name.clone(), now + self.timing.crd_establish);
                changed = true;
            }
            let established = condition_true(&crd, "Established");
            if !established && self.crd_due.get(&name).is_some_and(|due| *due <= now) {
                let mut conditions: Vec<Value> =
                    status["conditions"].as_array().cloned().unwrap_or_default();
                conditions.retain(|c| c["type"] != "Established");
                conditions.push(json!({
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": time,
                }));
                status["conditions"] = json!(conditions);
                self.crd_due.remove(&name);
                changed = true;
                custom.extend(served_types(&crd));
            } else if established {
                custom.extend(served_types(&crd));
            }
            if changed {
                self.put_status(&CRDS, &crd, status, wall);
            }
        }
        self.custom = custom;
    }

    /// The kinds the Established CRDs serve.
    pub fn custom_types(&self) -> &[&'static ResourceType] {
        &self.custom
    }
}
