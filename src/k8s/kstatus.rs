//! Whether an applied object has reconciled, by kstatus' rules (fluxcd/cli-utils
//! `pkg/kstatus/status/status.go` `Compute`, `generic.go` and `core.go`, which fluxcd ssa
//! `WaitForSet` and so `talosctl upgrade-k8s` use after the manifests sync). Pure: the object
//! and the time are arguments.
//!
//! The order is upstream's: an object being deleted is in progress; then
//! `observedGeneration != generation` (when both are set) is in progress; then the first
//! `Reconciling=True` (in progress) or `Stalled=True` (failed) condition decides, for every
//! kind; then the kind's own rules (`legacyTypes`: Deployment, DaemonSet, StatefulSet,
//! ReplicaSet, Pod, Job, PersistentVolumeClaim, Service, PodDisruptionBudget, CRD, and the
//! always-ready ConfigMap, Secret and CronJob); any other kind is decided by its `Ready`
//! condition (`True` current, `False`/`Unknown` in progress) and is current without one.

use serde_json::Value;

/// The reconcile status of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Reconciled (`CurrentStatus`).
    Current,
    /// Not yet (`InProgressStatus`), with kstatus' message (`Updated: 1/2`).
    InProgress(String),
    /// Will not get there without a change (`FailedStatus`): a Deployment past its progress
    /// deadline, a CRD whose names were refused, a failed Job, a crash-looping Pod, an object
    /// reporting `Stalled`.
    Failed(String),
}

/// How long a Pod may stay unschedulable before it is reported failed (kstatus
/// `ScheduleWindow`).
pub const SCHEDULE_WINDOW: std::time::Duration = std::time::Duration::from_secs(15);

fn int(obj: &Value, pointer: &str, default: i64) -> i64 {
    obj.pointer(pointer)
        .and_then(Value::as_i64)
        .unwrap_or(default)
}

fn text<'a>(obj: &'a Value, pointer: &str, default: &'a str) -> &'a str {
    obj.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or(default)
}

fn conditions(obj: &Value) -> impl Iterator<Item = &Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn has_condition(obj: &Value, kind: &str, status: &str) -> bool {
    conditions(obj).any(|c| str_of(c, "type") == kind && str_of(c, "status") == status)
}

fn str_of<'a>(c: &'a Value, key: &str) -> &'a str {
    c.get(key).and_then(Value::as_str).unwrap_or("")
}

fn in_progress(message: impl Into<String>) -> Status {
    Status::InProgress(message.into())
}

/// The status of `obj` at `now` (its `apiVersion` and `kind` pick the rules; `now` only
/// matters for a Pending Pod the scheduler refused).
pub fn status(obj: &Value, now: jiff::Timestamp) -> Status {
    if let Some(s) = generic(obj) {
        return s;
    }
    let api_version = obj["apiVersion"].as_str().unwrap_or("");
    let group = api_version.split_once('/').map_or("", |(g, _)| g);
    match (group, obj["kind"].as_str().unwrap_or("")) {
        ("apps" | "extensions", "Deployment") => deployment(obj),
        ("apps" | "extensions", "DaemonSet") => daemonset(obj),
        ("apps" | "extensions", "ReplicaSet") => replicaset(obj),
        ("apps", "StatefulSet") => statefulset(obj),
        ("", "Pod") => pod(obj, now),
        ("", "PersistentVolumeClaim") => pvc(obj),
        ("", "Service") => service(obj),
        ("batch", "Job") => job(obj),
        // `pdbConditions`: the disruption controller sets no condition when it cannot compute
        // the allowed disruptions, so an observed PDB is current
        ("policy", "PodDisruptionBudget") => Status::Current,
        ("apiextensions.k8s.io", "CustomResourceDefinition") => crd(obj),
        ("", "ConfigMap" | "Secret") | ("batch", "CronJob") => Status::Current,
        _ => ready_condition(obj),
    }
}

/// `checkGenericProperties`: deletion, `checkGeneration`, then the first `Reconciling=True`
/// or `Stalled=True` condition; `None` when they decide nothing.
fn generic(obj: &Value) -> Option<Status> {
    if obj
        .pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty())
    {
        return Some(in_progress("Resource scheduled for deletion"));
    }
    if let (Some(generation), Some(observed)) = (
        obj.pointer("/metadata/generation").and_then(Value::as_i64),
        obj.pointer("/status/observedGeneration")
            .and_then(Value::as_i64),
    ) && observed != generation
    {
        return Some(in_progress(format!(
            "{} generation is {generation}, but latest observed generation is {observed}",
            obj["kind"].as_str().unwrap_or("object")
        )));
    }
    for c in conditions(obj) {
        match (str_of(c, "type"), str_of(c, "status")) {
            ("Reconciling", "True") => return Some(in_progress(str_of(c, "message"))),
            ("Stalled", "True") => return Some(Status::Failed(str_of(c, "message").to_string())),
            _ => {}
        }
    }
    None
}

/// `checkReadyCondition` for kinds without rules of their own: `Ready=True` current,
/// `Ready=False` or `Unknown` in progress, no `Ready` condition current.
fn ready_condition(obj: &Value) -> Status {
    for c in conditions(obj).filter(|c| str_of(c, "type") == "Ready") {
        match str_of(c, "status") {
            "True" => return Status::Current,
            "False" | "Unknown" => return in_progress(str_of(c, "message")),
            _ => {}
        }
    }
    Status::Current
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
        return in_progress(format!("Replicas: {replicas}/{spec}"));
    }
    if spec > updated {
        return in_progress(format!("Updated: {updated}/{spec}"));
    }
    if replicas > spec {
        return in_progress(format!("Pending termination: {}", replicas - spec));
    }
    if updated > avail {
        return in_progress(format!("Available: {avail}/{updated}"));
    }
    if spec > ready {
        return in_progress(format!("Ready: {ready}/{spec}"));
    }
    if !progressing {
        return in_progress("ReplicaSet not Available");
    }
    if !available {
        return in_progress("Deployment not Available");
    }
    Status::Current
}

/// `daemonsetConditions`: the controller has acted (`checkGenerationSet`: both generations
/// set) and every desired pod is current, updated, available and ready.
fn daemonset(obj: &Value) -> Status {
    for (pointer, field) in [
        ("/metadata/generation", "metadata.generation"),
        ("/status/observedGeneration", "status.observedGeneration"),
    ] {
        if obj.pointer(pointer).and_then(Value::as_i64).is_none() {
            return in_progress(format!("DaemonSet {field} not found"));
        }
    }
    let desired = int(obj, "/status/desiredNumberScheduled", -1);
    if desired == -1 {
        return in_progress("Missing .status.desiredNumberScheduled");
    }
    for (field, label) in [
        ("currentNumberScheduled", "Current"),
        ("updatedNumberScheduled", "Updated"),
        ("numberAvailable", "Available"),
        ("numberReady", "Ready"),
    ] {
        let n = int(obj, &format!("/status/{field}"), 0);
        if desired > n {
            return in_progress(format!("{label}: {n}/{desired}"));
        }
    }
    Status::Current
}

/// `stsConditions`: `OnDelete` StatefulSets are the user's to roll (current); a partitioned
/// rollout is done once the replicas above the partition are updated; otherwise every replica
/// ready and current at the update revision.
fn statefulset(obj: &Value) -> Status {
    if text(obj, "/spec/updateStrategy/type", "") == "OnDelete" {
        return Status::Current;
    }
    let spec = int(obj, "/spec/replicas", 1);
    let replicas = int(obj, "/status/replicas", 0);
    let ready = int(obj, "/status/readyReplicas", 0);
    let current = int(obj, "/status/currentReplicas", 0);
    let updated = int(obj, "/status/updatedReplicas", 0);
    let partition = int(obj, "/spec/updateStrategy/rollingUpdate/partition", -1);
    if spec > replicas {
        return in_progress(format!("Replicas: {replicas}/{spec}"));
    }
    if spec > ready {
        return in_progress(format!("Ready: {ready}/{spec}"));
    }
    if replicas > spec {
        return in_progress(format!("Pending termination: {}", replicas - spec));
    }
    if partition != -1 {
        if updated < spec - partition {
            return in_progress(format!("updated: {updated}/{}", spec - partition));
        }
        return Status::Current;
    }
    if spec > current {
        return in_progress(format!("current: {current}/{spec}"));
    }
    if text(obj, "/status/currentRevision", "") != text(obj, "/status/updateRevision", "") {
        return in_progress("Waiting for updated revision to match current");
    }
    Status::Current
}

/// `replicasetConditions`: no `ReplicaFailure`, every replica labelled, available and ready,
/// none too many.
fn replicaset(obj: &Value) -> Status {
    if has_condition(obj, "ReplicaFailure", "True") {
        return in_progress("Replica Failure condition. Check Pods");
    }
    let spec = int(obj, "/spec/replicas", 1);
    let replicas = int(obj, "/status/replicas", 0);
    for (field, label) in [
        ("fullyLabeledReplicas", "Labelled"),
        ("availableReplicas", "Available"),
        ("readyReplicas", "Ready"),
    ] {
        let n = int(obj, &format!("/status/{field}"), 0);
        if spec > n {
            return in_progress(format!("{label}: {n}/{spec}"));
        }
    }
    if replicas > spec {
        return in_progress(format!("Pending termination: {}", replicas - spec));
    }
    Status::Current
}

/// `podConditions`: a finished Pod (either way) is current; a Running one when Ready, failed
/// when a container is in `CrashLoopBackOff`; a Pending one the scheduler refused
/// (`PodScheduled=False`, `Unschedulable`) fails once it is older than [`SCHEDULE_WINDOW`].
fn pod(obj: &Value, now: jiff::Timestamp) -> Status {
    match text(obj, "/status/phase", "") {
        "Succeeded" | "Failed" => Status::Current,
        "Running" => {
            if has_condition(obj, "Ready", "True") {
                return Status::Current;
            }
            let crashing: Vec<&str> = obj
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|cs| {
                    cs.pointer("/state/waiting/reason").and_then(Value::as_str)
                        == Some("CrashLoopBackOff")
                })
                .filter_map(|cs| cs["name"].as_str())
                .collect();
            if crashing.is_empty() {
                in_progress("Pod is running but is not Ready")
            } else {
                Status::Failed(format!(
                    "Containers in CrashLoop state: {}",
                    crashing.join(",")
                ))
            }
        }
        "Pending" => {
            let unschedulable = conditions(obj).any(|c| {
                str_of(c, "type") == "PodScheduled"
                    && str_of(c, "status") == "False"
                    && str_of(c, "reason") == "Unschedulable"
            });
            if !unschedulable {
                return in_progress("Pod is in the Pending phase");
            }
            let created = text(obj, "/metadata/creationTimestamp", "")
                .parse::<jiff::Timestamp>()
                .ok();
            let window = jiff::SignedDuration::try_from(SCHEDULE_WINDOW)
                .unwrap_or(jiff::SignedDuration::ZERO);
            match created {
                Some(c) if now.duration_since(c) <= window => {
                    in_progress("Pod has not been scheduled")
                }
                _ => Status::Failed("Pod could not be scheduled".into()),
            }
        }
        "" => in_progress("Pod phase not available"),
        other => in_progress(format!("unknown phase {other}")),
    }
}

/// `pvcConditions`: Bound.
fn pvc(obj: &Value) -> Status {
    match text(obj, "/status/phase", "unknown") {
        "Bound" => Status::Current,
        phase => in_progress(format!("PVC is not Bound. phase: {phase}")),
    }
}

/// `serviceConditions`: a `LoadBalancer` Service needs its `spec.clusterIP`.
fn service(obj: &Value) -> Status {
    if text(obj, "/spec/type", "ClusterIP") == "LoadBalancer"
        && text(obj, "/spec/clusterIP", "").is_empty()
    {
        return in_progress("ClusterIP not set. Service type: LoadBalancer");
    }
    Status::Current
}

/// `jobConditions`: `Complete=True` current, `Failed=True` failed, else current once started
/// (a running Job does not hold the wait).
fn job(obj: &Value) -> Status {
    let parallelism = int(obj, "/spec/parallelism", 1);
    let completions = int(obj, "/spec/completions", parallelism);
    for c in conditions(obj) {
        match (str_of(c, "type"), str_of(c, "status")) {
            ("Complete", "True") => return Status::Current,
            ("Failed", "True") => {
                let failed = int(obj, "/status/failed", 0);
                return Status::Failed(format!("Job Failed. failed: {failed}/{completions}"));
            }
            _ => {}
        }
    }
    if text(obj, "/status/startTime", "").is_empty() {
        return in_progress("Job not started");
    }
    Status::Current
}

/// `crdConditions`, in the order of the conditions: `NamesAccepted=False` fails;
/// `Established=False` fails unless its reason is `Installing` (the naming controller's state
/// before the establishing controller ran); `Established=True` is current; else installing.
fn crd(obj: &Value) -> Status {
    for c in conditions(obj) {
        let (kind, status, reason) = (str_of(c, "type"), str_of(c, "status"), str_of(c, "reason"));
        match (kind, status) {
            ("NamesAccepted", "False") => {
                return Status::Failed(format!(
                    "names not accepted ({reason}): {}",
                    str_of(c, "message")
                ));
            }
            ("Established", "False") if reason != "Installing" => {
                return Status::Failed(format!(
                    "not established ({reason}): {}",
                    str_of(c, "message")
                ));
            }
            ("Established", "True") => return Status::Current,
            _ => {}
        }
    }
    in_progress("Install in progress")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status_now(obj: &Value) -> Status {
        status(obj, "2026-12-07T12:00:00Z".parse().unwrap())
    }

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
        assert_eq!(status_now(&deploy(done.clone(), false)), Status::Current);
        // an old ReplicaSet's pod still runs next to the two updated ones
        let mut old_left = done.clone();
        old_left["replicas"] = json!(3);
        assert_eq!(
            status_now(&deploy(old_left, false)),
            Status::InProgress("Pending termination: 1".into())
        );
        let mut unseen = done.clone();
        unseen["observedGeneration"] = json!(2);
        assert!(
            matches!(status_now(&deploy(unseen, false)), Status::InProgress(m) if m.contains("latest observed generation is 2"))
        );
        let mut updating = done;
        updating["updatedReplicas"] = json!(1);
        assert_eq!(
            status_now(&deploy(updating, false)),
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
            status_now(&deploy(s.clone(), true)),
            Status::InProgress("ReplicaSet not Available".into())
        );
        s["conditions"] = json!([available(), {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]);
        assert_eq!(status_now(&deploy(s, true)), Status::Current);
        let mut stuck = counts;
        stuck["updatedReplicas"] = json!(1);
        stuck["conditions"] = json!([{"type": "Progressing", "status": "False",
            "reason": "ProgressDeadlineExceeded", "message": "ReplicaSet \"d-1\" has timed out progressing."}]);
        assert!(
            matches!(status_now(&deploy(stuck, true)), Status::Failed(m) if m.contains("has timed out progressing")),
        );
    }

    #[test]
    fn daemonsets_crds_and_the_rest() {
        let ds = |ready: i64| {
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "p", "generation": 1},
                "status": {"observedGeneration": 1, "desiredNumberScheduled": 3, "currentNumberScheduled": 3,
                "updatedNumberScheduled": 3, "numberAvailable": 3, "numberReady": ready}})
        };
        assert_eq!(status_now(&ds(3)), Status::Current);
        assert_eq!(status_now(&ds(2)), Status::InProgress("Ready: 2/3".into()));
        let fresh = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "p", "generation": 1}});
        assert!(matches!(status_now(&fresh), Status::InProgress(_)));
        let crd = |conds: Value| {
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": "widgets.example.com"}, "status": {"conditions": conds}})
        };
        assert!(matches!(status_now(&crd(json!([]))), Status::InProgress(_)));
        assert_eq!(
            status_now(&crd(json!([{"type": "Established", "status": "True"}]))),
            Status::Current
        );
        assert!(matches!(
            status_now(&crd(json!([{"type": "NamesAccepted", "status": "False", "message": "taken"}]))),
            Status::Failed(m) if m.contains("taken")
        ));
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
        assert_eq!(status_now(&cm), Status::Current);
        let stalled = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
            "status": {"conditions": [{"type": "Stalled", "status": "True", "message": "broken"}]}});
        assert_eq!(status_now(&stalled), Status::Failed("broken".into()));
    }

    /// fluxcd/cli-utils `generic.go` `checkGeneration`: any difference, not only a lag, is
    /// in progress; and `Reconciling`/`Stalled` decide for every kind, before its own rules.
    #[test]
    fn generations_that_differ_and_reconciling_or_stalled_conditions_come_before_the_kind_rules() {
        let done = json!({"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2,
            "readyReplicas": 2, "availableReplicas": 2, "conditions": [available()]});
        let mut ahead = done.clone();
        ahead["observedGeneration"] = json!(4);
        assert!(matches!(
            status_now(&deploy(ahead, false)),
            Status::InProgress(m) if m.contains("generation is 3, but latest observed generation is 4")
        ));
        let mut reconciling = done.clone();
        reconciling["conditions"] = json!([available(),
            {"type": "Reconciling", "status": "True", "message": "rolling out"}]);
        assert_eq!(
            status_now(&deploy(reconciling, false)),
            Status::InProgress("rolling out".into())
        );
        let mut stalled = done;
        stalled["conditions"] = json!([{"type": "Stalled", "status": "True", "message": "stuck"},
            {"type": "Reconciling", "status": "True", "message": "rolling out"}]);
        assert_eq!(
            status_now(&deploy(stalled, false)),
            Status::Failed("stuck".into()),
            "the first of the two conditions decides"
        );
        // a ConfigMap is always ready, unless a generic condition says otherwise
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
            "status": {"conditions": [{"type": "Reconciling", "status": "True", "message": "x"}]}});
        assert!(matches!(status_now(&cm), Status::InProgress(_)));
    }

    #[test]
    fn jobs_claims_load_balancers_budgets_and_replicasets_follow_core_go() {
        let job = |status: Value| {
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                "spec": {"completions": 1}, "status": status})
        };
        assert_eq!(
            status_now(&job(json!({}))),
            Status::InProgress("Job not started".into())
        );
        assert_eq!(
            status_now(&job(
                json!({"startTime": "2026-12-07T11:59:00Z", "active": 1})
            )),
            Status::Current
        );
        assert_eq!(
            status_now(&job(
                json!({"startTime": "2026-12-07T11:59:00Z", "failed": 1,
                "conditions": [{"type": "Failed", "status": "True"}]})
            )),
            Status::Failed("Job Failed. failed: 1/1".into())
        );
        let pvc = |phase: Option<&str>| {
            let mut v = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data"}, "status": {}});
            if let Some(p) = phase {
                v["status"]["phase"] = json!(p);
            }
            v
        };
        assert_eq!(
            status_now(&pvc(Some("Pending"))),
            Status::InProgress("PVC is not Bound. phase: Pending".into())
        );
        assert!(matches!(status_now(&pvc(None)), Status::InProgress(m) if m.ends_with("unknown")));
        assert_eq!(status_now(&pvc(Some("Bound"))), Status::Current);
        let svc = |ty: &str, ip: &str| {
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
                "spec": {"type": ty, "clusterIP": ip}})
        };
        assert!(matches!(
            status_now(&svc("LoadBalancer", "")),
            Status::InProgress(_)
        ));
        assert_eq!(
            status_now(&svc("LoadBalancer", "10.96.0.9")),
            Status::Current
        );
        assert_eq!(status_now(&svc("ClusterIP", "")), Status::Current);
        // a PDB is current once observed, whatever its conditions (`pdbConditions`)
        let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "p", "generation": 2}, "status": {"observedGeneration": 2,
            "conditions": [{"type": "Ready", "status": "False"}]}});
        assert_eq!(status_now(&pdb), Status::Current);
        let rs = |status: Value| {
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "r"},
                "spec": {"replicas": 2}, "status": status})
        };
        assert_eq!(
            status_now(&rs(json!({"replicas": 2, "fullyLabeledReplicas": 2,
                "availableReplicas": 1, "readyReplicas": 2}))),
            Status::InProgress("Available: 1/2".into())
        );
        assert!(matches!(
            status_now(&rs(json!({"replicas": 2, "fullyLabeledReplicas": 2, "availableReplicas": 2,
                "readyReplicas": 2, "conditions": [{"type": "ReplicaFailure", "status": "True"}]}))),
            Status::InProgress(m) if m.contains("Replica Failure")
        ));
        assert_eq!(
            status_now(&rs(json!({"replicas": 2, "fullyLabeledReplicas": 2,
                "availableReplicas": 2, "readyReplicas": 2}))),
            Status::Current
        );
    }

    #[test]
    fn pods_by_phase_crash_loops_and_the_schedule_window() {
        let now: jiff::Timestamp = "2026-12-07T12:00:00Z".parse().unwrap();
        let pod = |status: Value| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "creationTimestamp": "2026-12-07T11:59:50Z"},
                "status": status})
        };
        for phase in ["Succeeded", "Failed"] {
            assert_eq!(status(&pod(json!({"phase": phase})), now), Status::Current);
        }
        assert_eq!(
            status(
                &pod(
                    json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})
                ),
                now
            ),
            Status::Current
        );
        assert_eq!(
            status(&pod(json!({"phase": "Running"})), now),
            Status::InProgress("Pod is running but is not Ready".into())
        );
        let crashing = pod(json!({"phase": "Running", "containerStatuses": [
            {"name": "coredns", "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            {"name": "sidecar", "state": {"running": {}}}]}));
        assert_eq!(
            status(&crashing, now),
            Status::Failed("Containers in CrashLoop state: coredns".into())
        );
        let unschedulable = pod(json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}));
        assert!(matches!(status(&unschedulable, now), Status::InProgress(_)));
        let later: jiff::Timestamp = "2026-12-07T12:00:06Z".parse().unwrap();
        assert_eq!(
            status(&unschedulable, later),
            Status::Failed("Pod could not be scheduled".into())
        );
        assert!(matches!(
            status(&pod(json!({})), now),
            Status::InProgress(m) if m == "Pod phase not available"
        ));
    }

    #[test]
    fn a_crd_established_false_fails_unless_it_is_installing_and_unknown_kinds_read_ready() {
        let crd = |conds: Value| {
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": "widgets.example.com"}, "status": {"conditions": conds}})
        };
        // the naming controller's state before the establishing controller ran
        assert!(matches!(
            status_now(&crd(json!([{"type": "NamesAccepted", "status": "True"},
                {"type": "Established", "status": "False", "reason": "Installing"}]))),
            Status::InProgress(_)
        ));
        assert!(matches!(
            status_now(&crd(json!([{"type": "Established", "status": "False",
                "reason": "NotAccepted", "message": "not all names are accepted"}]))),
            Status::Failed(m) if m.contains("not all names are accepted")
        ));
        let widget = |ready: &str| {
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
                "status": {"conditions": [{"type": "Ready", "status": ready, "message": "m"}]}})
        };
        assert_eq!(status_now(&widget("True")), Status::Current);
        assert!(matches!(
            status_now(&widget("False")),
            Status::InProgress(_)
        ));
        assert!(matches!(
            status_now(&widget("Unknown")),
            Status::InProgress(_)
        ));
    }

    #[test]
    fn statefulsets_on_delete_and_partitioned() {
        let sts = |strategy: Value, status: Value| {
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s"},
                "spec": {"replicas": 3, "updateStrategy": strategy}, "status": status})
        };
        let counts = json!({"replicas": 3, "readyReplicas": 3, "currentReplicas": 1,
            "updatedReplicas": 2, "currentRevision": "a", "updateRevision": "b"});
        assert_eq!(
            status_now(&sts(json!({"type": "OnDelete"}), json!({}))),
            Status::Current
        );
        assert_eq!(
            status_now(&sts(
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}),
                counts.clone()
            )),
            Status::Current
        );
        assert!(matches!(
            status_now(&sts(json!({"type": "RollingUpdate"}), counts)),
            Status::InProgress(m) if m == "current: 1/3"
        ));
    }
}
