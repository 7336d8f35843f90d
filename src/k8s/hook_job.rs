//! Job hooks (issue #35 item 2): a `batch/v1` Job made from the pod spec the approved plan
//! carries, run to its end in the target cluster.
//!
//! The Job is named by the hook's run id (stable for the hook's site in the rollout job), so
//! an attempt made again after medea stopped finds the Job the first attempt created instead
//! of making a second one. medea sets `restartPolicy: Never`, `backoffLimit: 0` (one pod, one
//! run), `activeDeadlineSeconds` (the hook's timeout: the Job controller stops the pod
//! there), the environment `MEDEA_NODE`, `MEDEA_JOB_ID`, `MEDEA_HOOK_POINT` in every
//! container, and labels naming the rollout job and the hook. Success is the Job's `Complete`
//! condition; its `Failed` condition or the timeout is a failure. Either way the pod's exit
//! code and the tail of its log (at most [`LOG_TAIL_LINES`] lines and [`LOG_TAIL_BYTES`]
//! bytes) are reported. The Job is left in place for people to read (its name is in the
//! journal).

use std::collections::BTreeMap;
use std::time::Duration;

use ::kube::api::{Api, ListParams, LogParams, PostParams};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

use super::K8sError;
use super::client::{KubeClient, is_status};

/// Most lines of a hook pod's log medea reads.
pub const LOG_TAIL_LINES: i64 = 40;
/// Most bytes of a hook pod's log medea reads.
pub const LOG_TAIL_BYTES: i64 = 8 * 1024;

/// Label naming the medea rollout job a hook Job belongs to (when it fits a label value).
pub const JOB_LABEL: &str = "medea.dev/job";
/// Label naming the hook.
pub const HOOK_LABEL: &str = "medea.dev/hook";
/// Label naming the hook's point.
pub const POINT_LABEL: &str = "medea.dev/hook-point";
/// Label `app.kubernetes.io/managed-by`.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// What a Job hook runs.
#[derive(Debug, Clone)]
pub struct HookJob<'a> {
    /// The Job's name (the hook's run id, a DNS label).
    pub name: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// The pod spec as approved.
    pub pod_spec: &'a serde_json::Value,
    /// The rollout job's id.
    pub job: &'a str,
    /// The hook's name.
    pub hook: &'a str,
    /// The hook's point (`beforeNode`).
    pub point: &'a str,
    /// The node (node hooks), else empty.
    pub node: &'a str,
    /// How long it may run.
    pub timeout: Duration,
    /// `spec.ttlSecondsAfterFinished`: Kubernetes deletes the finished Job (and its pod) this
    /// long after it ended.
    pub ttl_seconds_after_finished: u64,
}

/// How a Job hook ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookJobResult {
    /// `Complete`.
    pub succeeded: bool,
    /// What happened, for a person.
    pub detail: String,
    /// The pod's first container's exit code, when it terminated.
    pub exit_code: Option<i32>,
    /// The tail of the pod's log.
    pub log_tail: Option<String>,
}

fn label_value_ok(v: &str) -> bool {
    v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && v.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
}

/// The Job object of `h` (pure): the approved pod spec with `restartPolicy: Never` and the
/// `MEDEA_*` environment in every container (replacing any of those names), labels and
/// annotations naming the rollout job, the hook and the point.
pub fn job_manifest(h: &HookJob<'_>) -> serde_json::Value {
    let mut labels = BTreeMap::new();
    labels.insert(MANAGED_BY.to_string(), "medea".to_string());
    labels.insert(HOOK_LABEL.to_string(), h.hook.to_string());
    labels.insert(POINT_LABEL.to_string(), h.point.to_string());
    if label_value_ok(h.job) {
        labels.insert(JOB_LABEL.to_string(), h.job.to_string());
    }
    let annotations = serde_json::json!({
        JOB_LABEL: h.job,
        HOOK_LABEL: h.hook,
        POINT_LABEL: h.point,
        "medea.dev/node": h.node,
    });
    let mut pod = h.pod_spec.clone();
    if let Some(map) = pod.as_object_mut() {
        map.insert("restartPolicy".into(), "Never".into());
        if let Some(containers) = map.get_mut("containers").and_then(|c| c.as_array_mut()) {
            for c in containers {
                let Some(c) = c.as_object_mut() else { continue };
                let mut env: Vec<serde_json::Value> = c
                    .get("env")
                    .and_then(|e| e.as_array())
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|e| {
                        !e.get("name")
                            .and_then(|n| n.as_str())
                            .is_some_and(|n| crate::desired::hooks::JOB_ENV.contains(&n))
                    })
                    .collect();
                for (name, value) in [
                    ("MEDEA_NODE", h.node),
                    ("MEDEA_JOB_ID", h.job),
                    ("MEDEA_HOOK_POINT", h.point),
                ] {
                    env.push(serde_json::json!({"name": name, "value": value}));
                }
                c.insert("env".into(), serde_json::Value::Array(env));
            }
        }
    }
    serde_json::json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": h.name,
            "namespace": h.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": h.timeout.as_secs().max(1),
            "ttlSecondsAfterFinished": h.ttl_seconds_after_finished,
            "template": {
                "metadata": { "labels": labels },
                "spec": pod,
            },
        },
    })
}

/// `Complete`/`Failed` of a Job: `Some((succeeded, reason: message))` once it ended.
fn finished(job: &Job) -> Option<(bool, String)> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find_map(|c| {
        if c.status != "True" {
            return None;
        }
        let why = format!(
            "{}{}",
            c.reason.clone().unwrap_or_default(),
            c.message
                .as_ref()
                .map_or_else(String::new, |m| format!(": {m}"))
        );
        match c.type_.as_str() {
            "Complete" => Some((true, why)),
            "Failed" => Some((false, why)),
            _ => None,
        }
    })
}

impl KubeClient {
    /// Run the Job hook `h` to its end: create its Job (or find the one an earlier attempt
    /// made), poll it every `poll` until `Complete` or `Failed` or `h.timeout`, then read its
    /// pod's exit code and log tail. An error only when the Job cannot be made or read at
    /// all; a Job that fails or times out is a result.
    pub async fn run_hook_job(
        &self,
        h: &HookJob<'_>,
        poll: Duration,
    ) -> Result<HookJobResult, K8sError> {
        let deadline = tokio::time::Instant::now() + h.timeout;
        let api: Api<Job> = Api::namespaced(self.client.clone(), h.namespace);
        let target = format!("{}/{}", h.namespace, h.name);
        let manifest: Job =
            serde_json::from_value(job_manifest(h)).map_err(|err| K8sError::HookJobSpec {
                job: target.clone(),
                err,
            })?;
        let created = self
            .call("create job", &target, || async {
                match api.create(&PostParams::default(), &manifest).await {
                    Ok(_) => Ok(true),
                    Err(e) if is_status(&e, 409) => Ok(false),
                    Err(e) => Err(e),
                }
            })
            .await?;
        if created {
            tracing::info!(job = %target, hook = %h.hook, point = %h.point, "hook job created");
        } else {
            tracing::info!(job = %target, hook = %h.hook, point = %h.point, "hook job found (made by an earlier attempt)");
        }
        let outcome = loop {
            let job = self.call("get job", &target, || api.get(h.name)).await?;
            if let Some(done) = finished(&job) {
                break Some(done);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break None;
            }
            tokio::time::sleep(poll.min(left)).await;
        };
        let (exit_code, log_tail) = self.hook_pod(h).await;
        let (succeeded, detail) = match outcome {
            Some((true, why)) => (true, format!("Job {target} complete ({why})")),
            Some((false, why)) => (false, format!("Job {target} failed ({why})")),
            None => (
                false,
                format!(
                    "Job {target} did not complete within {}; it is left in place",
                    crate::desired::model::format_duration(h.timeout)
                ),
            ),
        };
        Ok(HookJobResult {
            succeeded,
            detail,
            exit_code,
            log_tail,
        })
    }

    /// The exit code and log tail of the newest pod of hook Job `h` (best effort: a pod or a
    /// log that cannot be read gives `None`, or a log tail saying why).
    async fn hook_pod(&self, h: &HookJob<'_>) -> (Option<i32>, Option<String>) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), h.namespace);
        let params = ListParams::default().labels(&format!("job-name={}", h.name));
        let Ok(list) = pods.list(&params).await else {
            return (None, None);
        };
        let Some(pod) = list
            .items
            .into_iter()
            .max_by_key(|p| p.metadata.creation_timestamp.clone())
        else {
            return (None, None);
        };
        let exit = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.first())
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code);
        let Some(name) = pod.metadata.name else {
            return (exit, None);
        };
        let params = LogParams {
            tail_lines: Some(LOG_TAIL_LINES),
            limit_bytes: Some(LOG_TAIL_BYTES),
            ..LogParams::default()
        };
        let log = match pods.logs(&name, &params).await {
            Ok(text) => text,
            Err(e) => format!("(the log of pod {name} cannot be read: {e})"),
        };
        let bounded: String = log.chars().take(LOG_TAIL_BYTES as usize).collect();
        (exit, Some(bounded))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_carries_the_pod_spec_medea_env_labels_and_bounds() {
        let pod = serde_json::json!({
            "serviceAccountName": "ceph",
            "containers": [{
                "name": "ceph",
                "image": "rook/ceph:v1.15.5",
                "command": ["ceph", "osd", "set", "noout"],
                "env": [{"name": "A", "value": "1"}, {"name": "MEDEA_NODE", "value": "spoofed"}],
            }],
        });
        let h = HookJob {
            name: "medea-hook-0123456789abcdef",
            namespace: "rook-ceph",
            pod_spec: &pod,
            job: "abc123-prod",
            hook: "noout",
            point: "beforeNode",
            node: "w-1",
            timeout: Duration::from_secs(300),
            ttl_seconds_after_finished: 3600,
        };
        let m = job_manifest(&h);
        // issue #51 item 5: the finished Job is deleted by Kubernetes' TTL controller
        assert_eq!(m["spec"]["ttlSecondsAfterFinished"], 3600);
        assert_eq!(m["metadata"]["name"], "medea-hook-0123456789abcdef");
        assert_eq!(m["metadata"]["labels"][JOB_LABEL], "abc123-prod");
        assert_eq!(m["metadata"]["labels"][HOOK_LABEL], "noout");
        assert_eq!(m["spec"]["backoffLimit"], 0);
        assert_eq!(m["spec"]["activeDeadlineSeconds"], 300);
        let spec = &m["spec"]["template"]["spec"];
        assert_eq!(spec["restartPolicy"], "Never");
        assert_eq!(spec["serviceAccountName"], "ceph");
        let env = spec["containers"][0]["env"].as_array().unwrap();
        let get = |n: &str| {
            env.iter()
                .filter(|e| e["name"] == n)
                .map(|e| e["value"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(get("A"), vec!["1"]);
        assert_eq!(
            get("MEDEA_NODE"),
            vec!["w-1"],
            "medea's value replaces any other"
        );
        assert_eq!(get("MEDEA_JOB_ID"), vec!["abc123-prod"]);
        assert_eq!(get("MEDEA_HOOK_POINT"), vec!["beforeNode"]);
        // it is a Job k8s-openapi reads
        let job: Job = serde_json::from_value(m).unwrap();
        assert_eq!(job.spec.unwrap().backoff_limit, Some(0));
        // a job id too long for a label value is only annotated
        let long = "x".repeat(70);
        let m = job_manifest(&HookJob { job: &long, ..h });
        assert!(m["metadata"]["labels"].get(JOB_LABEL).is_none());
        assert_eq!(m["metadata"]["annotations"][JOB_LABEL], long.as_str());
    }
}
