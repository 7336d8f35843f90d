//! The node side of the kubelet: Node objects derived from the Talos side's [`NodeFacts`] plus
//! what the kube side owns (cordon, taints, labels set through the API), and the node views the
//! scheduler and controllers decide with.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{
    CONTROL_PLANE_LABEL, KubeSide, NodeOverlay, NodeView, TAINT_CONTROL_PLANE, TAINT_NOT_READY,
    TAINT_UNREACHABLE, TAINT_UNSCHEDULABLE, from_value, to_value,
};
use crate::sim::kube::resources::NODES;
use crate::sim::kube::status::ApiError;
use crate::sim::kube::store::name_of;
use crate::sim::node::NodeFacts;

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

/// Whether `v` is a valid label value (k8s.io/apimachinery `pkg/util/validation`
/// `IsValidLabelValue`: at most 63 characters, empty or alphanumeric at both ends, `-`, `_`,
/// `.` inside).
fn valid_label_value(v: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    v.is_empty()
        || (v.len() <= 63
            && v.starts_with(alnum)
            && v.ends_with(alnum)
            && v.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.')))
}

/// The errors of a Node update's taint values, as kubernetes `pkg/apis/core/validation`
/// `validateNodeTaints` reports them (`field.Invalid(spec.taints[i].value, …)` with
/// apimachinery `IsValidLabelValue`'s messages): the apiserver refuses the whole update.
fn taint_value_errors(taints: &[Taint]) -> Vec<crate::sim::kube::status::FieldError> {
    let mut errors = Vec::new();
    for (i, t) in taints.iter().enumerate() {
        let v = t.value.as_deref().unwrap_or("");
        if valid_label_value(v) {
            continue;
        }
        let mut details = Vec::new();
        if v.len() > 63 {
            details.push("must be no more than 63 characters".to_string());
        }
        let alnum = |c: char| c.is_ascii_alphanumeric();
        if !(v.starts_with(alnum)
            && v.ends_with(alnum)
            && v.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.')))
        {
            details.push(
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_string(),
            );
        }
        for detail in details {
            errors.push(crate::sim::kube::status::FieldError {
                field: format!("spec.taints[{i}].value"),
                value: v.to_string(),
                detail,
            });
        }
    }
    errors
}

fn derive_node(f: &NodeFacts, o: &NodeOverlay) -> Node {
    let mut labels = derived_labels(f);
    labels.extend(o.labels.clone());
    let mut annotations = o.annotations.clone();
    // Talos publishes each system extension (and the schematic) as `extensions.talos.dev/<name>:
    // <version>`: a label when the version is a valid label value, else an annotation
    // (siderolabs/talos `internal/app/machined/pkg/controllers/k8s/node_label_spec.go`,
    // `node_annotation_spec.go`, `extensionsToNodeKV`)
    for (name, version) in &f.extensions {
        let key = format!("extensions.talos.dev/{name}");
        if valid_label_value(version) {
            labels.insert(key, version.clone());
        } else {
            annotations.insert(key, version.clone());
        }
    }
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
    // the node lifecycle controller taints nodes by condition (kubernetes
    // `pkg/controller/nodelifecycle/node_lifecycle_controller.go`, `nodeConditionToTaintKeyStatusMap`)
    for (condition, key) in [
        ("MemoryPressure", "node.kubernetes.io/memory-pressure"),
        ("DiskPressure", "node.kubernetes.io/disk-pressure"),
        ("PIDPressure", "node.kubernetes.io/pid-pressure"),
    ] {
        if o.ready_status != "Unknown" && o.pressure.contains(condition) {
            taints.push(Taint {
                key: key.into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            });
        }
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
    // the kubelet's reasons and messages when a condition is True (kubernetes
    // `pkg/kubelet/nodestatus/setters.go`: MemoryPressureCondition, DiskPressureCondition,
    // PIDPressureCondition)
    let under = |kind: &str| o.ready_status != "Unknown" && o.pressure.contains(kind);
    let pressure = |kind: &str, reason: &str, message: &str| NodeCondition {
        type_: kind.into(),
        status: if o.ready_status == "Unknown" {
            "Unknown"
        } else if under(kind) {
            "True"
        } else {
            "False"
        }
        .into(),
        reason: Some(
            match (under(kind), kind) {
                (true, "MemoryPressure") => "KubeletHasInsufficientMemory",
                (true, "DiskPressure") => "KubeletHasDiskPressure",
                (true, _) => "KubeletHasInsufficientPID",
                (false, _) => reason,
            }
            .into(),
        ),
        message: Some(
            match (under(kind), kind) {
                (true, "MemoryPressure") => "kubelet has insufficient memory available",
                (true, "DiskPressure") => "kubelet has disk pressure",
                (true, _) => "kubelet has insufficient PID available",
                (false, _) => message,
            }
            .into(),
        ),
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
    // A machine's id is its own, not its name's: Talos generates the machine id at install
    // and the system UUID is the hardware's, so two clusters made from one template (both
    // with a `cp-1`) have different ids. The node's address tells simulated machines apart.
    let machine = format!(
        "{:x}",
        Sha256::digest(format!("{}\0{}", f.name, f.address).as_bytes())
    );
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

/// A stored Node as the scheduler and controllers see it; `None` when it is not a valid Node.
pub(super) fn view_of(value: &Value) -> Option<NodeView> {
    let n = from_value::<Node>(value)?;
    let status = n.status.unwrap_or_default();
    Some(NodeView {
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
    })
}

impl KubeSide {
    pub(super) fn sync_nodes(&mut self, wall: jiff::Timestamp) {
        let facts = self.source.nodes();
        let names: BTreeSet<&str> = facts.iter().map(|f| f.name.as_str()).collect();
        for stale in self
            .store
            .list(&NODES, None)
            .map(|n| name_of(n).to_string())
            .filter(|n| !names.contains(n.as_str()))
            .collect::<Vec<_>>()
        {
            self.drop_node(&stale);
        }
        for f in &facts {
            self.sync_node(f, wall);
        }
    }

    /// Remove a stored Node whose machine is gone from the Talos side.
    pub(super) fn drop_node(&mut self, name: &str) {
        self.store.delete(&NODES, "", name);
        self.overlays.remove(name);
        self.derived.remove(name);
    }

    /// Derive one Node from its facts and overlay; written only when its facts, overlay or
    /// stored object changed since it was last derived.
    pub(super) fn sync_node(&mut self, f: &NodeFacts, wall: jiff::Timestamp) {
        let never_ready = self.never_ready(&f.name);
        let pressure = self.pressure_of(&f.name);
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
                pressure: BTreeSet::new(),
            });
        overlay.pressure = pressure;
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
            return;
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

    pub(super) fn node_views(&self) -> Vec<NodeView> {
        self.store.list(&NODES, None).filter_map(view_of).collect()
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
        let invalid = taint_value_errors(spec.taints.as_deref().unwrap_or_default());
        if !invalid.is_empty() {
            return Err(ApiError::invalid_fields(&NODES, name, &invalid));
        }
        let unschedulable = spec.unschedulable.unwrap_or(false);
        if unschedulable && !overlay.unschedulable {
            overlay.cordoned_since = Some(wall);
        }
        if !unschedulable {
            overlay.cordoned_since = None;
        }
        let flipped = overlay.unschedulable != unschedulable;
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
        if flipped {
            self.record(if unschedulable {
                super::super::ClusterRecord::Cordoned(name.to_string())
            } else {
                super::super::ClusterRecord::Uncordoned(name.to_string())
            });
        }
        self.sync_nodes_after_patch(name, wall);
        Ok(self
            .store
            .get(&NODES, "", name)
            .cloned()
            .unwrap_or(Value::Null))
    }
}
