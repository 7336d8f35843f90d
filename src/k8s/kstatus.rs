//! Whether an applied object has reconciled, by kstatus' rules (kubernetes-sigs/cli-utils
//! `pkg/kstatus/status/core.go` and `generic.go`, which fluxcd ssa `WaitForSet` and so
//! `talosctl upgrade-k8s` use after the manifests sync). Pure: the object is an argument.

use serde_json::Value;

/// The reconcile status of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Reconciled (`CurrentStatus`).
    Current,
    /// Not yet (`InProgressStatus`), with kstatus' message (`Updated: 1/2`).
    InProgress(String),
    /// Will not get there without a change (`FailedStatus`): a Deployment past its progress
    /// deadline, a CRD whose names were refused, an object reporting `Stalled`.
    Failed(String),
}

fn int(obj: &Value, pointer: &str, default: i64) -> i64 {
    obj.pointer(pointer)
        .and_then(Value::as_i64)
        .unwrap_or(default)
}

fn conditions(obj: &Value) -> impl Iterator<Item = &Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a Value> {
    conditions(obj).find(|c| c["type"] == kind)
}

fn str_of<'a>(c: &'a Value, key: &str) -> &'a str {
    c.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The status of `obj` (its `apiVersion` and `kind` pick the rules).
pub fn status(obj: &Value) -> Status {
    if obj.pointer("/metadata/deletionTimestamp").is_some() {
        return Status::InProgress("Resource scheduled for deletion".into());
    }
    // generic.go `checkGenericProperties`: a spec change the controller has not seen yet
    if let Some(observed) = obj
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64)
    {
        let generation = int(obj, "/metadata/generation", 0);
        if observed < generation {
            return Status::InProgress(format!(
                "{} generation is {generation}, but latest observed generation is {observed}",
                obj["kind"].as_str().unwrap_or("object")
            ));
        }
    }
    let api_version = obj["apiVersion"].as_str().unwrap_or("");
    let group = api_version.split_once('/').map_or("", |(g, _)| g);
    match (group, obj["kind"].as_str().unwrap_or("")) {
        ("apps" | "extensions", "Deployment") => deployment(obj),
        ("apps" | "extensions", "DaemonSet") => daemonset(obj),
        ("apps", "StatefulSet") => statefulset(obj),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => crd(obj),
        ("", "ConfigMap" | "Secret") => Status::Current,
        _ => generic(obj),
    }
}

/// `deploymentConditions`: every replica updated and available, no old replica left, and
/// the controller's `Progressing`/`Available` conditions; `ProgressDeadlineExceeded` fails.
fn deployment(obj: &Value) -> Status {
    // without a progress deadline the controller sets no `Progressing` condition
    let mut progressing = obj.pointer("/spec/progressDeadlineSeconds").is_none();
    let mut available = false;
    for c in conditions(obj) {
        match str_of(c, "type") {
            "Progressing" => {
                if str_of(c, "reason") == "ProgressDeadlineExceeded" {
                    return Status::Failed(format!(
                        "Progress deadline exceeded: {}",
                        str_of(c, "message")
                    ));
                }
                if str_of(c, "status") == "True" && str_of(c, "reason") == "NewReplicaSetAvailable"
                {
                    progressing = true;
                }
            }
            "Available" if str_of(c, "status") == "True" => available = true,
            _ => {}
        }
    }
    let spec = int(obj, "/spec/replicas", 1);
    let replicas = int(obj, "/status/replicas", 0);
    let updated = int(obj, "/status/updatedReplicas", 0);
    let ready = int(obj, "/status/readyReplicas", 0);
    let avail = int(obj, "/status/availableReplicas", 0);
    if spec > replicas {
        return Status::InProgress(format!("Replicas: {replicas}/{spec}"));
    }
    if spec > updated {
        return Status::InProgress(format!("Updated: {updated}/{spec}"));
    }
    if replicas > spec {
        return Status::InProgress(format!("Pending termination: {}", replicas - spec));
    }
    if updated > avail {
        return Status::InProgress(format!("Available: {avail}/{updated}"));
    }
    if spec > ready {
        return Status::InProgress(format!("Ready: {ready}/{spec}"));
    }
    if !progressing {
        return Status::InProgress("ReplicaSet not Available".into());
    }
    if !available {
        return Status::InProgress("Deployment not Available".into());
    }
    Status::Current
}

/// `daemonsetConditions`: the controller has acted (generation observed) and every desired
/// pod is current, updated, available and ready.
fn daemonset(obj: &Value) -> Status {
    if obj.pointer("/metadata/generation").is_none()
        || obj.pointer("/status/observedGeneration").is_none()
    {
        return Status::InProgress("DaemonSet status.observedGeneration not found".into());
    }
    let desired = int(obj, "/status/desiredNumberScheduled", -1);
    if desired == -1 {
        return Status::InProgress("Missing .status.desiredNumberScheduled".into());
    }
    for (field, label) in [
        ("currentNumberScheduled", "Current"),
        ("updatedNumberScheduled", "Updated"),
        ("numberAvailable", "Available"),
        ("numberReady", "Ready"),
    ] {
        let n = int(obj, &format!("/status/{field}"), 0);
        if desired > n {
            return Status::InProgress(format!("{label}: {n}/{desired}"));
        }
    }
    Status::Current
}

/// `stsConditions` (without partitions and `OnDelete`, which Talos' manifests do not use,
/// they are treated as the rolling case).
fn statefulset(obj: &Value) -> Status {
    let spec = int(obj, "/spec/replicas", 1);
    let replicas = int(obj, "/status/replicas", 0);
    let ready = int(obj, "/status/readyReplicas", 0);
    let current = int(obj, "/status/currentReplicas", 0);
    if spec > replicas {
        return Status::InProgress(format!("Replicas: {replicas}/{spec}"));
    }
    if spec > ready {
        return Status::InProgress(format!("Ready: {ready}/{spec}"));
    }
    if replicas > spec {
        return Status::InProgress(format!("Pending termination: {}", replicas - spec));
    }
    if spec > current {
        return Status::InProgress(format!("current: {current}/{spec}"));
    }
    if obj.pointer("/status/currentRevision") != obj.pointer("/status/updateRevision") {
        return Status::InProgress("Waiting for updated revision to match current".into());
    }
    Status::Current
}

/// `crdConditions`: `Established=True`; `NamesAccepted=False` fails.
fn crd(obj: &Value) -> Status {
    if let Some(c) = condition(obj, "NamesAccepted")
        && str_of(c, "status") == "False"
    {
        return Status::Failed(format!("names not accepted: {}", str_of(c, "message")));
    }
    match condition(obj, "Established") {
        Some(c) if str_of(c, "status") == "True" => Status::Current,
        _ => Status::InProgress("CRD is not established".into()),
    }
}

/// `generic.go` `GetGenericConditions`: `Stalled=True` fails, `Reconciling=True` and
/// `Ready=False` are in progress, anything else is current.
fn generic(obj: &Value) -> Status {
    for c in conditions(obj) {
        let (kind, status) = (str_of(c, "type"), str_of(c, "status"));
        match (kind, status) {
            ("Stalled", "True") => return Status::Failed(str_of(c, "message").to_string()),
            ("Reconciling", "True") => {
                return Status::InProgress(str_of(c, "message").to_string());
            }
            ("Ready", "False") => return Status::InProgress(str_of(c, "message").to_string()),
            _ => {}
        }
    }
    Status::Current
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deploy(status: Value, deadline: bool) -> Value {
        let mut spec = json!({"replicas": 2});
        if deadline {
            spec["progressDeadlineSeconds"] = json!(600);
        }
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "generation": 3}, "spec": spec, "status": status})
    }

    fn available() -> Value {
        json!({"type": "Available", "status": "True"})
    }

    #[test]
    fn a_deployment_is_current_only_with_no_old_replica_left() {
        let done = json!({"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2,
            "readyReplicas": 2, "availableReplicas": 2, "conditions": [available()]});
        assert_eq!(status(&deploy(done.clone(), false)), Status::Current);
        // an old ReplicaSet's pod still runs next to the two updated ones
        let mut old_left = done.clone();
        old_left["replicas"] = json!(3);
        assert_eq!(
            status(&deploy(old_left, false)),
            Status::InProgress("Pending termination: 1".into())
        );
        let mut unseen = done.clone();
        unseen["observedGeneration"] = json!(2);
        assert!(
            matches!(status(&deploy(unseen, false)), Status::InProgress(m) if m.contains("latest observed generation is 2"))
        );
        let mut updating = done;
        updating["updatedReplicas"] = json!(1);
        assert_eq!(
            status(&deploy(updating, false)),
            Status::InProgress("Updated: 1/2".into())
        );
    }

    #[test]
    fn a_deployment_past_its_progress_deadline_fails_and_one_with_a_deadline_needs_the_progressing_condition()
     {
        let counts = json!({"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2,
            "readyReplicas": 2, "availableReplicas": 2});
        let mut s = counts.clone();
        s["conditions"] = json!([available()]);
        assert_eq!(
            status(&deploy(s.clone(), true)),
            Status::InProgress("ReplicaSet not Available".into())
        );
        s["conditions"] = json!([available(), {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]);
        assert_eq!(status(&deploy(s, true)), Status::Current);
        let mut stuck = counts;
        stuck["updatedReplicas"] = json!(1);
        stuck["conditions"] = json!([{"type": "Progressing", "status": "False",
            "reason": "ProgressDeadlineExceeded", "message": "ReplicaSet \"d-1\" has timed out progressing."}]);
        assert!(
            matches!(status(&deploy(stuck, true)), Status::Failed(m) if m.contains("has timed out progressing")),
        );
    }

    #[test]
    fn daemonsets_crds_and_the_rest() {
        let ds = |ready: i64| {
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "p", "generation": 1},
                "status": {"observedGeneration": 1, "desiredNumberScheduled": 3, "currentNumberScheduled": 3,
                "updatedNumberScheduled": 3, "numberAvailable": 3, "numberReady": ready}})
        };
        assert_eq!(status(&ds(3)), Status::Current);
        assert_eq!(status(&ds(2)), Status::InProgress("Ready: 2/3".into()));
        let fresh = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "p", "generation": 1}});
        assert!(matches!(status(&fresh), Status::InProgress(_)));
        let crd = |conds: Value| {
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": "widgets.example.com"}, "status": {"conditions": conds}})
        };
        assert!(matches!(status(&crd(json!([]))), Status::InProgress(_)));
        assert_eq!(
            status(&crd(json!([{"type": "Established", "status": "True"}]))),
            Status::Current
        );
        assert!(matches!(
            status(&crd(json!([{"type": "NamesAccepted", "status": "False", "message": "taken"}]))),
            Status::Failed(m) if m.contains("taken")
        ));
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
        assert_eq!(status(&cm), Status::Current);
        let stalled = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
            "status": {"conditions": [{"type": "Stalled", "status": "True", "message": "broken"}]}});
        assert_eq!(status(&stalled), Status::Failed("broken".into()));
    }
}
