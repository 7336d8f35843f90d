//! `meta.k8s.io/v1` `Table` responses, which `kubectl get` asks for
//! (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`). The columns and cell formats
//! follow the apiserver's printers (`pkg/printers/internalversion/printers.go`).

use serde_json::{Value, json};

use super::resources::ResourceType;

/// `k8s.io/apimachinery/pkg/util/duration.HumanDuration`.
pub(crate) fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

fn age(obj: &Value, now: jiff::Timestamp) -> String {
    let created = obj
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<jiff::Timestamp>().ok());
    match created {
        Some(c) => human_duration(now.as_second() - c.as_second()),
        None => "<unknown>".into(),
    }
}

fn col(name: &str, kind: &str, priority: u8, description: &str) -> Value {
    let mut c = json!({
        "name": name,
        "type": kind,
        "format": "",
        "description": description,
        "priority": priority,
    });
    if name == "Name" {
        c["format"] = json!("name");
    }
    c
}

fn s<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn i(obj: &Value, pointer: &str) -> i64 {
    obj.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

fn or_none(v: &str) -> String {
    if v.is_empty() {
        "<none>".into()
    } else {
        v.into()
    }
}

fn node_row(n: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let conditions = n
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut status: Vec<&str> = Vec::new();
    match conditions.iter().find(|c| c["type"] == "Ready") {
        Some(c) if c["status"] == "True" => status.push("Ready"),
        Some(_) => status.push("NotReady"),
        None => status.push("Unknown"),
    }
    if n.pointer("/spec/unschedulable") == Some(&json!(true)) {
        status.push("SchedulingDisabled");
    }
    let mut roles: Vec<String> = n
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| {
                    if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                        Some(role.to_string())
                    } else if k == "kubernetes.io/role" {
                        v.as_str().map(str::to_string)
                    } else {
                        None
                    }
                })
                .filter(|r| !r.is_empty())
                .collect()
        })
        .unwrap_or_default();
    roles.sort();
    let address = |kind: &str| {
        n.pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|x| x["type"] == kind))
            .and_then(|x| x["address"].as_str())
            .unwrap_or("")
            .to_string()
    };
    vec![
        json!(s(n, "/metadata/name")),
        json!(status.join(",")),
        json!(if roles.is_empty() {
            "<none>".to_string()
        } else {
            roles.join(",")
        }),
        json!(age(n, now)),
        json!(s(n, "/status/nodeInfo/kubeletVersion")),
        json!(or_none(&address("InternalIP"))),
        json!(or_none(&address("ExternalIP"))),
        json!(s(n, "/status/nodeInfo/osImage")),
        json!(s(n, "/status/nodeInfo/kernelVersion")),
        json!(s(n, "/status/nodeInfo/containerRuntimeVersion")),
    ]
}

fn pod_row(p: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let statuses = p
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let total = p
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let ready = statuses.iter().filter(|c| c["ready"] == true).count();
    let restarts: i64 = statuses
        .iter()
        .map(|c| c["restartCount"].as_i64().unwrap_or(0))
        .sum();
    let mut reason = s(p, "/status/phase").to_string();
    if let Some(r) = p.pointer("/status/reason").and_then(Value::as_str) {
        reason = r.to_string();
    }
    for c in &statuses {
        if let Some(w) = c.pointer("/state/waiting/reason").and_then(Value::as_str) {
            reason = w.to_string();
        }
    }
    if p.pointer("/metadata/deletionTimestamp").is_some() {
        reason = "Terminating".into();
    }
    vec![
        json!(s(p, "/metadata/name")),
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts.to_string()),
        json!(age(p, now)),
        json!(or_none(s(p, "/status/podIP"))),
        json!(or_none(s(p, "/spec/nodeName"))),
        json!(or_none(s(p, "/status/nominatedNodeName"))),
        json!("<none>"),
    ]
}

fn int_or_string(v: Option<&Value>) -> String {
    match v {
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s.clone(),
        _ => "N/A".into(),
    }
}

fn pdb_row(p: &Value, now: jiff::Timestamp) -> Vec<Value> {
    vec![
        json!(s(p, "/metadata/name")),
        json!(int_or_string(p.pointer("/spec/minAvailable"))),
        json!(int_or_string(p.pointer("/spec/maxUnavailable"))),
        json!(i(p, "/status/disruptionsAllowed")),
        json!(age(p, now)),
    ]
}

fn deployment_row(d: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let want = d
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    vec![
        json!(s(d, "/metadata/name")),
        json!(format!("{}/{want}", i(d, "/status/readyReplicas"))),
        json!(i(d, "/status/updatedReplicas")),
        json!(i(d, "/status/availableReplicas")),
        json!(age(d, now)),
    ]
}

fn replicaset_row(r: &Value, now: jiff::Timestamp) -> Vec<Value> {
    vec![
        json!(s(r, "/metadata/name")),
        json!(
            r.pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1)
        ),
        json!(i(r, "/status/replicas")),
        json!(i(r, "/status/readyReplicas")),
        json!(age(r, now)),
    ]
}

fn daemonset_row(d: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let selector = d
        .pointer("/spec/template/spec/nodeSelector")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    vec![
        json!(s(d, "/metadata/name")),
        json!(i(d, "/status/desiredNumberScheduled")),
        json!(i(d, "/status/currentNumberScheduled")),
        json!(i(d, "/status/numberReady")),
        json!(i(d, "/status/updatedNumberScheduled")),
        json!(i(d, "/status/numberAvailable")),
        json!(or_none(&selector)),
        json!(age(d, now)),
    ]
}

fn columns(rt: &ResourceType) -> Vec<Value> {
    let name = col(
        "Name",
        "string",
        0,
        "Name must be unique within a namespace.",
    );
    let age = col(
        "Age",
        "string",
        0,
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    );
    match rt.plural {
        "nodes" => vec![
            name,
            col("Status", "string", 0, "The status of the node"),
            col("Roles", "string", 0, "The roles of the node"),
            age,
            col(
                "Version",
                "string",
                0,
                "Kubelet Version reported by the node.",
            ),
            col(
                "Internal-IP",
                "string",
                1,
                "List of addresses reachable to the node. Queried from cloud provider, if available.",
            ),
            col(
                "External-IP",
                "string",
                1,
                "List of addresses reachable to the node. Queried from cloud provider, if available.",
            ),
            col(
                "OS-Image",
                "string",
                1,
                "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
            ),
            col(
                "Kernel-Version",
                "string",
                1,
                "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
            ),
            col(
                "Container-Runtime",
                "string",
                1,
                "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
            ),
        ],
        "pods" => vec![
            name,
            col(
                "Ready",
                "string",
                0,
                "The aggregate readiness state of this pod for accepting traffic.",
            ),
            col(
                "Status",
                "string",
                0,
                "The aggregate status of the containers in this pod.",
            ),
            col(
                "Restarts",
                "string",
                0,
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
            ),
            age,
            col(
                "IP",
                "string",
                1,
                "IP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
            ),
            col(
                "Node",
                "string",
                1,
                "NodeName is a request to schedule this pod onto a specific node.",
            ),
            col(
                "Nominated Node",
                "string",
                1,
                "nominatedNodeName is set only when this pod preempts other pods on the node.",
            ),
            col(
                "Readiness Gates",
                "string",
                1,
                "If specified, all readiness gates will be evaluated for pod readiness.",
            ),
        ],
        "poddisruptionbudgets" => vec![
            name,
            col(
                "Min Available",
                "string",
                0,
                "The minimum number of pods that must be available simultaneously.",
            ),
            col(
                "Max Unavailable",
                "string",
                0,
                "The maximum number of pods that may be unavailable simultaneously.",
            ),
            col(
                "Allowed Disruptions",
                "integer",
                0,
                "Calculated number of pods that may be disrupted at this time.",
            ),
            age,
        ],
        "deployments" => vec![
            name,
            col("Ready", "string", 0, "Number of the pod with ready state"),
            col(
                "Up-to-date",
                "string",
                0,
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
            ),
            col(
                "Available",
                "string",
                0,
                "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
            ),
            age,
        ],
        "replicasets" => vec![
            name,
            col("Desired", "integer", 0, "Number of desired pods."),
            col("Current", "integer", 0, "Number of actual replicas."),
            col(
                "Ready",
                "integer",
                0,
                "The number of ready replicas for this replica set.",
            ),
            age,
        ],
        "daemonsets" => vec![
            name,
            col(
                "Desired",
                "integer",
                0,
                "The total number of nodes that should be running the daemon pod.",
            ),
            col(
                "Current",
                "integer",
                0,
                "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod.",
            ),
            col(
                "Ready",
                "integer",
                0,
                "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready.",
            ),
            col(
                "Up-to-date",
                "integer",
                0,
                "The total number of nodes that are running updated daemon pod",
            ),
            col(
                "Available",
                "integer",
                0,
                "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available.",
            ),
            col(
                "Node Selector",
                "string",
                0,
                "NodeSelector is a selector which must be true for the pod to fit on a node.",
            ),
            age,
        ],
        _ => vec![name, age],
    }
}

fn cells(rt: &ResourceType, obj: &Value, now: jiff::Timestamp) -> Vec<Value> {
    match rt.plural {
        "nodes" => node_row(obj, now),
        "pods" => pod_row(obj, now),
        "poddisruptionbudgets" => pdb_row(obj, now),
        "deployments" => deployment_row(obj, now),
        "daemonsets" => daemonset_row(obj, now),
        "replicasets" => replicaset_row(obj, now),
        _ => vec![json!(s(obj, "/metadata/name")), json!(age(obj, now))],
    }
}

/// A `Table` of `items`. `include_object` is the request's `includeObject`
/// (`Metadata`, the default; `Object`; or `None`).
pub(crate) fn table(
    rt: &ResourceType,
    items: &[Value],
    resource_version: &str,
    continue_token: Option<&str>,
    include_object: &str,
    now: jiff::Timestamp,
) -> Value {
    let rows: Vec<Value> = items
        .iter()
        .map(|obj| {
            let mut row = json!({ "cells": cells(rt, obj, now) });
            match include_object {
                "None" => {}
                "Object" => row["object"] = obj.clone(),
                _ => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
                    })
                }
            }
            row
        })
        .collect();
    let mut metadata = json!({ "resourceVersion": resource_version });
    if let Some(c) = continue_token {
        metadata["continue"] = json!(c);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns(rt),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::super::resources::NODES;
    use super::*;

    #[test]
    fn human_duration_matches_apimachinery() {
        assert_eq!(human_duration(45), "45s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
        assert_eq!(human_duration(100 * 86400), "100d");
    }

    #[test]
    fn node_status_column_shows_scheduling_disabled() {
        let now = jiff::Timestamp::from_second(1_700_000_100).unwrap();
        let node = json!({
            "metadata": {"name": "w1", "creationTimestamp": "2023-11-14T22:13:20Z",
                         "labels": {"node-role.kubernetes.io/control-plane": ""}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "nodeInfo": {"kubeletVersion": "v1.34.1"}},
        });
        let t = table(&NODES, &[node], "7", None, "Metadata", now);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "w1");
        assert_eq!(cells[1], "Ready,SchedulingDisabled");
        assert_eq!(cells[2], "control-plane");
        assert_eq!(cells[3], "100s");
        assert_eq!(cells[4], "v1.34.1");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }
}
