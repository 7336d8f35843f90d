//! The Job controller (kubernetes `pkg/controller/job/job_controller.go`, `syncJob`), as the
//! simulator runs it: the pods of a Job are created from its template, unbound (the scheduler
//! places them), named `<job>-<suffix>` (`generateName`), with the template's labels, a
//! controller ownerReference (`blockOwnerDeletion`) and the tracking finalizer
//! `batch.kubernetes.io/job-tracking`; a finished pod (Succeeded, Failed, or deleted before it
//! succeeded) is counted once in `status.succeeded`/`status.failed` and loses the finalizer
//! (`trackJobStatusAndRemoveFinalizers`). `failed > backoffLimit` (or, with `restartPolicy:
//! OnFailure`, the active pods' restarts reaching it: `pastBackoffLimitOnFailure`) and an
//! elapsed `activeDeadlineSeconds` fail the Job: its active pods are deleted, the interim
//! `FailureTarget` condition is written, and `Failed` once no pod is terminating
//! (`delayTerminalCondition`, as on 1.31+). Enough successes write `SuccessCriteriaMet` and
//! `Complete` (reason `CompletionsReached`) with `completionTime`.
//!
//! Deviations: a failed pod's replacement is created at once (upstream waits a back-off of
//! 10 s doubling per failure, `pkg/controller/job/backoff_utils.go`); Indexed Jobs,
//! `podFailurePolicy`, `successPolicy` and `backoffLimitPerIndex` are not modelled (an
//! Indexed Job runs as NonIndexed); `ttlSecondsAfterFinished` is not honoured.

use serde_json::{Value, json};
use tokio::time::Instant;

use super::{KubeSide, controller_of, is_terminating, phase, pod_ready};
use crate::sim::kube::batch::{DEFAULT_BACKOFF_LIMIT, TRACKING_FINALIZER};
use crate::sim::kube::resources::{JOBS, PODS};
use crate::sim::kube::store::{k8s_time, name_of, ns_of, uid_of};

/// The finalizer of an object whose dependents are deleted before it (`metav1.FinalizerDeleteDependents`).
pub(crate) const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

fn terminal(pod: &Value) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

/// Whether an object still has finalizers (a deleted one stays until they are removed).
pub(crate) fn has_finalizers(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

fn has_tracking_finalizer(pod: &Value) -> bool {
    pod.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| f.iter().any(|x| x == TRACKING_FINALIZER))
}

/// `isPodFailed` with `podReplacementPolicy: TerminatingOrFailed`: Failed, or deleted before
/// it succeeded.
fn counts_failed(pod: &Value) -> bool {
    phase(pod) == "Failed" || (is_terminating(pod) && phase(pod) != "Succeeded")
}

fn condition_true(job: &Value, kind: &str) -> Option<Value> {
    job.pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c["type"] == kind && c["status"] == "True")
        .cloned()
}

/// A Job that is done: `Complete` or `Failed` is true (`util.IsJobFinished`).
pub(crate) fn finished(job: &Value) -> bool {
    condition_true(job, "Complete").is_some() || condition_true(job, "Failed").is_some()
}

fn new_condition(kind: &str, reason: &str, message: &str, now: &str) -> Value {
    json!({
        "type": kind,
        "status": "True",
        "lastProbeTime": now,
        "lastTransitionTime": now,
        "reason": reason,
        "message": message,
    })
}

fn int(job: &Value, ptr: &str) -> Option<i64> {
    job.pointer(ptr).and_then(Value::as_i64)
}

impl KubeSide {
    /// One sync of every Job, in store order (a no-op without Jobs). Run before the scheduler
    /// (so new pods are placed in the same pass) and after the kubelet (so pods that just
    /// finished are counted in the same pass).
    pub(super) fn jobs(&mut self, now: Instant, wall: jiff::Timestamp) {
        if self.store.list(&JOBS, None).next().is_none() {
            self.job_deadlines.clear();
            return;
        }
        for job in self.store.list_owned(&JOBS, None) {
            self.sync_job(&job, now, wall);
        }
        let running: std::collections::HashSet<&str> = self
            .store
            .list(&JOBS, None)
            .filter(|j| !finished(j))
            .map(uid_of)
            .collect();
        self.job_deadlines
            .retain(|uid, _| running.contains(uid.as_str()));
    }

    /// The pods whose controller is the Job with `uid`, in `ns`, in store order.
    fn job_pods(&self, ns: &str, uid: &str) -> Vec<Value> {
        self.store
            .list(&PODS, Some(ns))
            .filter(|p| controller_of(p).is_some_and(|(_, _, u)| u == uid))
            .cloned()
            .collect()
    }

    fn sync_job(&mut self, job: &Value, now: Instant, wall: jiff::Timestamp) {
        let (ns, name, uid) = (ns_of(job), name_of(job), uid_of(job));
        let pods = self.job_pods(ns, uid);
        if job.pointer("/metadata/deletionTimestamp").is_some() {
            // foreground deletion: the garbage collector deletes the dependents, then the owner
            for p in &pods {
                self.terminate(ns_of(p), name_of(p), now, wall);
                self.drop_tracking_finalizer(ns_of(p), name_of(p), now, wall);
            }
            if self.job_pods(ns, uid).is_empty() {
                self.store.delete(&JOBS, ns, name);
                let key = (JOBS.key(), ns.to_string(), name.to_string());
                self.owners.remove(&key);
                self.updaters.remove(&key);
            }
            return;
        }
        if finished(job) {
            return;
        }
        let time = k8s_time(wall);
        let completions = int(job, "/spec/completions");
        let parallelism = int(job, "/spec/parallelism").unwrap_or(1).max(0);
        let backoff_limit = int(job, "/spec/backoffLimit").unwrap_or(DEFAULT_BACKOFF_LIMIT);
        let suspended = job.pointer("/spec/suspend") == Some(&json!(true));
        let on_failure =
            job.pointer("/spec/template/spec/restartPolicy") == Some(&json!("OnFailure"));

        let counted_now: Vec<&Value> = pods
            .iter()
            .filter(|p| has_tracking_finalizer(p) && (terminal(p) || is_terminating(p)))
            .collect();
        let new_succeeded = counted_now
            .iter()
            .filter(|p| phase(p) == "Succeeded")
            .count() as i64;
        let new_failed = counted_now.iter().filter(|p| counts_failed(p)).count() as i64;
        let succeeded = int(job, "/status/succeeded").unwrap_or(0) + new_succeeded;
        let failed = int(job, "/status/failed").unwrap_or(0) + new_failed;
        let mut active: Vec<&Value> = pods
            .iter()
            .filter(|p| !terminal(p) && !is_terminating(p))
            .collect();
        let mut terminating = pods
            .iter()
            .filter(|p| is_terminating(p) && !terminal(p))
            .count() as i64;

        let mut status = job.get("status").cloned().unwrap_or_else(|| json!({}));
        if status.get("startTime").is_none() && !suspended {
            status["startTime"] = json!(time);
        }
        let mut conditions: Vec<Value> = status
            .get("conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();

        // a failure found now or in an earlier sync (`FailureTarget`)
        let restarts: i64 = active
            .iter()
            .filter(|p| matches!(phase(p), "Running" | "Pending"))
            .flat_map(|p| {
                p.pointer("/status/containerStatuses")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|c| c["restartCount"].as_i64())
            .sum();
        let past_on_failure = on_failure
            && if backoff_limit == 0 {
                restarts > 0
            } else {
                restarts >= backoff_limit
            };
        let started_at = status
            .get("startTime")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok());
        let past_deadline = match (int(job, "/spec/activeDeadlineSeconds"), started_at) {
            (Some(secs), Some(start)) if !suspended => {
                let left = secs.saturating_sub(wall.as_second().saturating_sub(start.as_second()));
                // the controller syncs the Job again when its deadline comes (`queue.AddAfter`)
                self.job_deadlines.insert(
                    uid.to_string(),
                    now + std::time::Duration::from_secs(left.max(0).unsigned_abs()),
                );
                left <= 0
            }
            _ => false,
        };
        let failure = condition_true(job, "FailureTarget").or_else(|| {
            if failed > backoff_limit || past_on_failure {
                Some(new_condition(
                    "FailureTarget",
                    "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit",
                    &time,
                ))
            } else if past_deadline {
                Some(new_condition(
                    "FailureTarget",
                    "DeadlineExceeded",
                    "Job was active longer than specified deadline",
                    &time,
                ))
            } else {
                None
            }
        });
        let mut finalize: Vec<&Value> = counted_now.clone();
        let mut failed = failed;
        if let Some(target) = failure {
            // the Job failed: its active pods are deleted and, with every pod left, counted
            // failed ("every non-terminated pod is considered failed")
            for p in &active {
                self.terminate(ns_of(p), name_of(p), now, wall);
            }
            failed += active.len() as i64;
            active.clear();
            if !conditions.iter().any(|c| c["type"] == "FailureTarget") {
                conditions.push(target.clone());
            }
            for (pns, pname) in pods
                .iter()
                .filter(|p| has_tracking_finalizer(p))
                .map(|p| (ns_of(p).to_string(), name_of(p).to_string()))
                .collect::<Vec<_>>()
            {
                self.drop_tracking_finalizer(&pns, &pname, now, wall);
            }
            finalize.clear();
            terminating = self
                .job_pods(ns, uid)
                .iter()
                .filter(|p| is_terminating(p) && !terminal(p))
                .count() as i64;
            if terminating == 0 {
                let mut failed_condition = target;
                failed_condition["type"] = json!("Failed");
                failed_condition["lastProbeTime"] = json!(time);
                failed_condition["lastTransitionTime"] = json!(time);
                conditions.push(failed_condition);
            }
        } else {
            // manageJob: as many active pods as the Job still wants
            let want = if suspended {
                0
            } else {
                match completions {
                    None if succeeded > 0 => active.len() as i64,
                    None => parallelism,
                    Some(c) => (c - succeeded).clamp(0, parallelism),
                }
            };
            let have = active.len() as i64;
            if have < want && condition_true(job, "SuccessCriteriaMet").is_none() {
                for _ in have..want {
                    self.create_job_pod(job, wall);
                }
            } else if have > want {
                let extra = (have - want) as usize;
                for p in active.split_off(active.len() - extra) {
                    self.terminate(ns_of(p), name_of(p), now, wall);
                    terminating += 1;
                }
            }
            let active_now = self
                .job_pods(ns, uid)
                .iter()
                .filter(|p| !terminal(p) && !is_terminating(p))
                .count() as i64;
            let complete = match completions {
                None => succeeded > 0 && active_now == 0,
                Some(c) => succeeded >= c && active_now == 0,
            };
            if complete {
                const MESSAGE: &str = "Reached expected number of succeeded pods";
                if !conditions.iter().any(|c| c["type"] == "SuccessCriteriaMet") {
                    conditions.push(new_condition(
                        "SuccessCriteriaMet",
                        "CompletionsReached",
                        MESSAGE,
                        &time,
                    ));
                }
                if terminating == 0 {
                    conditions.push(new_condition(
                        "Complete",
                        "CompletionsReached",
                        MESSAGE,
                        &time,
                    ));
                    status["completionTime"] = json!(time);
                }
            }
        }
        let pods_now = self.job_pods(ns, uid);
        let active_now: Vec<&Value> = pods_now
            .iter()
            .filter(|p| !terminal(p) && !is_terminating(p))
            .collect();
        let ready = active_now.iter().filter(|p| pod_ready(p)).count() as i64;
        let mut set = |key: &str, n: i64, omit_zero: bool| {
            if n == 0 && omit_zero {
                if let Some(o) = status.as_object_mut() {
                    o.remove(key);
                }
            } else {
                status[key] = json!(n);
            }
        };
        // `active`, `succeeded`, `failed` are `omitempty`; `ready` and `terminating` pointers
        set("active", active_now.len() as i64, true);
        set("succeeded", succeeded, true);
        set("failed", failed, true);
        set("ready", ready, false);
        set("terminating", terminating, false);
        status["uncountedTerminatedPods"] = json!({});
        if conditions.is_empty() {
            if let Some(o) = status.as_object_mut() {
                o.remove("conditions");
            }
        } else {
            status["conditions"] = json!(conditions);
        }
        // the counted pods lose the tracking finalizer
        let finalize: Vec<(String, String)> = finalize
            .iter()
            .map(|p| (ns_of(p).to_string(), name_of(p).to_string()))
            .collect();
        for (pns, pname) in finalize {
            self.drop_tracking_finalizer(&pns, &pname, now, wall);
        }
        if let Some(current) = self.store.get(&JOBS, ns, name).cloned() {
            self.put_status(&JOBS, &current, status, wall);
        }
    }

    /// Remove the tracking finalizer of a counted pod; a deleted pod whose grace has ended and
    /// that has no finalizer left is gone then.
    fn drop_tracking_finalizer(
        &mut self,
        ns: &str,
        name: &str,
        now: Instant,
        wall: jiff::Timestamp,
    ) {
        let Some(mut pod) = self.store.get(&PODS, ns, name).cloned() else {
            return;
        };
        let Some(list) = pod
            .pointer_mut("/metadata/finalizers")
            .and_then(Value::as_array_mut)
        else {
            return;
        };
        list.retain(|f| f != TRACKING_FINALIZER);
        if list.is_empty()
            && let Some(meta) = pod.get_mut("metadata").and_then(Value::as_object_mut)
        {
            meta.remove("finalizers");
        }
        let stored = self.store.put(&PODS, pod, wall);
        let uid = uid_of(&stored).to_string();
        let grace_over = self
            .timers
            .get(&uid)
            .is_none_or(|t| t.remove_at.is_none_or(|r| r <= now));
        if is_terminating(&stored) && !has_finalizers(&stored) && grace_over {
            self.timers.remove(&uid);
            self.store.delete(&PODS, ns, name);
        }
    }

    /// A new pod from the Job's template (`podControl.CreatePodsWithGenerateName`), left for
    /// the scheduler.
    fn create_job_pod(&mut self, job: &Value, wall: jiff::Timestamp) {
        let (ns, name, uid) = (ns_of(job), name_of(job), uid_of(job));
        let template = job.pointer("/spec/template").cloned().unwrap_or_default();
        let pod_name = self.next_name(name);
        let mut metadata = json!({
            "name": pod_name,
            "generateName": format!("{name}-"),
            "namespace": ns,
            "finalizers": [TRACKING_FINALIZER],
            "ownerReferences": [{
                "apiVersion": JOBS.api_version(),
                "kind": "Job",
                "name": name,
                "uid": uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        });
        for key in ["labels", "annotations"] {
            if let Some(v) = template.pointer(&format!("/metadata/{key}")) {
                metadata[key] = v.clone();
            }
        }
        let pod = json!({
            "metadata": metadata,
            "spec": template.get("spec").cloned().unwrap_or_else(|| json!({})),
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        });
        let _ = self.store.create(&PODS, pod, wall);
    }

    /// `DELETE` of a Job (the garbage collector's part of it, done at once): `Orphan` (batch/v1's
    /// default) leaves its pods without the owner reference and the tracking finalizer,
    /// `Background` deletes the Job and then its pods, `Foreground` marks the Job deleted
    /// (`deletionTimestamp`, finalizer `foregroundDeletion`) until the controller has deleted
    /// its pods.
    pub fn delete_job(
        &mut self,
        ns: &str,
        name: &str,
        policy: Propagation,
        now: Instant,
        wall: jiff::Timestamp,
    ) -> Option<Value> {
        let job = self.store.get(&JOBS, ns, name)?.clone();
        let uid = uid_of(&job).to_string();
        let key = (JOBS.key(), ns.to_string(), name.to_string());
        match policy {
            Propagation::Foreground => {
                if job.pointer("/metadata/deletionTimestamp").is_some() {
                    return Some(job);
                }
                let mut next = job;
                next["metadata"]["deletionTimestamp"] = json!(k8s_time(wall));
                next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                let mut finalizers: Vec<Value> = next
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                finalizers.push(json!(FOREGROUND_FINALIZER));
                next["metadata"]["finalizers"] = json!(finalizers);
                let stored = self.store.put(&JOBS, next, wall);
                self.sync_job(&stored, now, wall);
                Some(self.store.get(&JOBS, ns, name).cloned().unwrap_or(stored))
            }
            Propagation::Background => {
                let gone = self.store.delete(&JOBS, ns, name);
                self.owners.remove(&key);
                self.updaters.remove(&key);
                for p in self.job_pods(ns, &uid) {
                    self.terminate(ns_of(&p), name_of(&p), now, wall);
                    self.drop_tracking_finalizer(ns_of(&p), name_of(&p), now, wall);
                }
                gone
            }
            Propagation::Orphan => {
                let gone = self.store.delete(&JOBS, ns, name);
                self.owners.remove(&key);
                self.updaters.remove(&key);
                for mut p in self.job_pods(ns, &uid) {
                    if let Some(refs) = p
                        .pointer_mut("/metadata/ownerReferences")
                        .and_then(Value::as_array_mut)
                    {
                        refs.retain(|r| r["uid"] != json!(uid));
                    }
                    if let Some(list) = p
                        .pointer_mut("/metadata/finalizers")
                        .and_then(Value::as_array_mut)
                    {
                        list.retain(|f| f != TRACKING_FINALIZER);
                    }
                    self.store.put(&PODS, p, wall);
                }
                gone
            }
        }
    }
}

/// `DeleteOptions.propagationPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Orphan,
    Background,
    Foreground,
}

impl Propagation {
    pub fn parse(s: &str) -> Option<Propagation> {
        match s {
            "Orphan" => Some(Propagation::Orphan),
            "Background" => Some(Propagation::Background),
            "Foreground" => Some(Propagation::Foreground),
            _ => None,
        }
    }
}
