//! The apiserver's side of `batch/v1` Jobs: the defaults, the selector and pod-template labels
//! it generates from the Job's uid, and the validation of the pod template. The Job controller
//! that runs them is `cluster/jobs.rs`.
//!
//! Upstream: kubernetes `pkg/apis/batch/v1/defaults.go` (`SetDefaults_Job`: `completions` and
//! `parallelism` 1 when both are unset, `backoffLimit` 6, `completionMode: NonIndexed`,
//! `suspend: false`, `podReplacementPolicy: TerminatingOrFailed`, the Job's labels are its
//! template's when it has none), `pkg/registry/batch/job/strategy.go` (`PrepareForCreate`
//! clears the status; `generateSelector` adds `controller-uid`/`job-name` and their
//! `batch.kubernetes.io/` forms to the template's labels and selects
//! `batch.kubernetes.io/controller-uid`), `pkg/apis/batch/validation/validation.go`
//! (`validateJobSpec`: `restartPolicy` must be `OnFailure` or `Never`, and pods default to
//! `Always`, `pkg/apis/core/v1/defaults.go` `SetDefaults_PodSpec`).

use serde_json::{Map, Value, json};

use super::store::{name_of, uid_of};

/// The label that ties a Job's pods to it (`batch.ControllerUidLabel`).
pub(crate) const CONTROLLER_UID: &str = "batch.kubernetes.io/controller-uid";
/// Its legacy form, still added (`batch.LegacyControllerUidLabel`).
pub(crate) const LEGACY_CONTROLLER_UID: &str = "controller-uid";
/// The Job's name on its pods (`batch.JobNameLabel`).
pub(crate) const JOB_NAME: &str = "batch.kubernetes.io/job-name";
/// Its legacy form (`batch.LegacyJobNameLabel`).
pub(crate) const LEGACY_JOB_NAME: &str = "job-name";
/// The finalizer a Job's pods carry until the controller has counted them
/// (`batch.JobTrackingFinalizer`).
pub(crate) const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";

/// **Test-only** (the simulator's, no cluster knows it): the exit code of the containers of a
/// pod (or a Job's pod template) with this annotation, e.g. `"1"`. Without it a container of
/// a pod that runs to completion exits 0, unless a `JobPodExit` kube fault says otherwise.
pub(crate) const EXIT_CODE_ANNOTATION: &str = "sim.medea.dev/exit-code";
/// **Test-only**: how many seconds a run-to-completion container runs before it exits (default
/// 0: it exits as soon as it has started).
pub(crate) const RUN_SECONDS_ANNOTATION: &str = "sim.medea.dev/run-seconds";

/// `spec.backoffLimit` when the Job leaves it unset.
pub(crate) const DEFAULT_BACKOFF_LIMIT: i64 = 6;

/// The defaults of a Job as the apiserver stores it (`SetDefaults_Job`), on every write.
pub(crate) fn defaults(job: &mut Value) {
    let Some(spec) = job.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec.get("completions").is_none_or(Value::is_null)
        && spec.get("parallelism").is_none_or(Value::is_null)
    {
        spec.insert("completions".into(), json!(1));
        spec.insert("parallelism".into(), json!(1));
    }
    let mut default = |key: &str, value: Value| {
        if spec.get(key).is_none_or(Value::is_null) {
            spec.insert(key.into(), value);
        }
    };
    default("parallelism", json!(1));
    default("backoffLimit", json!(DEFAULT_BACKOFF_LIMIT));
    default("completionMode", json!("NonIndexed"));
    default("suspend", json!(false));
    default("podReplacementPolicy", json!("TerminatingOrFailed"));
    if let Some(pod) = spec
        .get_mut("template")
        .and_then(|t| t.get_mut("spec"))
        .and_then(Value::as_object_mut)
        && pod.get("restartPolicy").is_none_or(Value::is_null)
    {
        pod.insert("restartPolicy".into(), json!("Always"));
    }
}

/// What the apiserver does to a new Job once it has a uid (`PrepareForCreate`, then
/// `generateSelector` unless `spec.manualSelector`): status cleared, the pod template labelled
/// with the uid and the name, the selector on the uid, and the Job's own labels copied from the
/// template when it has none.
pub(crate) fn prepare_for_create(job: &mut Value) {
    if let Some(o) = job.as_object_mut() {
        o.remove("status");
    }
    defaults(job);
    let uid = uid_of(job).to_string();
    let name = name_of(job).to_string();
    let manual = job.pointer("/spec/manualSelector") == Some(&json!(true));
    if !manual {
        let Some(spec) = job.get_mut("spec").and_then(Value::as_object_mut) else {
            return;
        };
        let template = spec.entry("template").or_insert_with(|| json!({}));
        let labels = object_at(template, &["metadata", "labels"]);
        for (key, value) in [
            (LEGACY_JOB_NAME, &name),
            (JOB_NAME, &name),
            (LEGACY_CONTROLLER_UID, &uid),
            (CONTROLLER_UID, &uid),
        ] {
            labels
                .entry(key.to_string())
                .or_insert_with(|| json!(value));
        }
        let selector = spec.entry("selector").or_insert_with(|| json!({}));
        object_at(selector, &["matchLabels"])
            .entry(CONTROLLER_UID.to_string())
            .or_insert_with(|| json!(uid));
    }
    let own_labels_empty = job
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .is_none_or(Map::is_empty);
    if own_labels_empty && let Some(labels) = job.pointer("/spec/template/metadata/labels").cloned()
    {
        job["metadata"]["labels"] = labels;
    }
}

/// The object at `path` under `v`, created (and any non-object on the way replaced) if needed.
fn object_at<'a>(v: &'a mut Value, path: &[&str]) -> &'a mut Map<String, Value> {
    let mut cur = v;
    for key in path {
        if !cur.is_object() {
            *cur = json!({});
        }
        let Value::Object(map) = cur else {
            unreachable!("made an object above")
        };
        cur = map.entry(key.to_string()).or_insert_with(|| json!({}));
    }
    if !cur.is_object() {
        *cur = json!({});
    }
    match cur {
        Value::Object(map) => map,
        _ => unreachable!("made an object above"),
    }
}

/// One error of the apiserver's validation: the field path, the cause's reason
/// (`FieldValueNotSupported`, …) and the message after the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobError {
    pub field: String,
    pub reason: &'static str,
    pub message: String,
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn error(field: &str, reason: &'static str, message: String) -> JobError {
    JobError {
        field: field.to_string(),
        reason,
        message,
    }
}

/// The apiserver's validation of a Job's spec, in upstream's wording (`field.NotSupported`,
/// `field.Required`, `field.Invalid`).
pub(crate) fn validate(job: &Value) -> Vec<JobError> {
    let mut errors = Vec::new();
    let spec = job.get("spec");
    let pod = spec.and_then(|s| s.pointer("/template/spec"));
    let containers = pod
        .and_then(|p| p.get("containers"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if containers == 0 {
        errors.push(error(
            "spec.template.spec.containers",
            "FieldValueRequired",
            "Required value".to_string(),
        ));
    }
    let restart = pod
        .and_then(|p| p.get("restartPolicy"))
        .and_then(Value::as_str)
        .unwrap_or("Always");
    let field = "spec.template.spec.restartPolicy";
    if restart.is_empty() {
        errors.push(error(
            field,
            "FieldValueRequired",
            "Required value: valid values: \"OnFailure\", \"Never\"".to_string(),
        ));
    } else if restart != "OnFailure" && restart != "Never" {
        errors.push(error(
            field,
            "FieldValueNotSupported",
            format!(
                "Unsupported value: {}: supported values: \"OnFailure\", \"Never\"",
                json!(restart)
            ),
        ));
    }
    for key in ["parallelism", "completions", "backoffLimit"] {
        if let Some(n) = spec.and_then(|s| s.get(key)).and_then(Value::as_i64)
            && n < 0
        {
            errors.push(error(
                &format!("spec.{key}"),
                "FieldValueInvalid",
                format!("Invalid value: {n}: must be greater than or equal to 0"),
            ));
        }
    }
    if let Some(n) = spec
        .and_then(|s| s.get("activeDeadlineSeconds"))
        .and_then(Value::as_i64)
        && n <= 0
    {
        errors.push(error(
            "spec.activeDeadlineSeconds",
            "FieldValueInvalid",
            format!("Invalid value: {n}: must be greater than 0"),
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_job_gets_upstreams_defaults_selector_and_labels() {
        let mut job = json!({
            "metadata": {"name": "noout", "namespace": "rook-ceph", "uid": "u-1"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c"}]}}},
            "status": {"succeeded": 3},
        });
        prepare_for_create(&mut job);
        assert!(job.get("status").is_none(), "status is cleared");
        let spec = &job["spec"];
        assert_eq!(spec["completions"], 1);
        assert_eq!(spec["parallelism"], 1);
        assert_eq!(spec["backoffLimit"], 6);
        assert_eq!(spec["completionMode"], "NonIndexed");
        assert_eq!(spec["podReplacementPolicy"], "TerminatingOrFailed");
        assert_eq!(
            spec["selector"],
            json!({"matchLabels": {"batch.kubernetes.io/controller-uid": "u-1"}})
        );
        let labels = &spec["template"]["metadata"]["labels"];
        assert_eq!(labels["controller-uid"], "u-1");
        assert_eq!(labels["batch.kubernetes.io/controller-uid"], "u-1");
        assert_eq!(labels["job-name"], "noout");
        assert_eq!(labels["batch.kubernetes.io/job-name"], "noout");
        assert_eq!(
            job["metadata"]["labels"], *labels,
            "labels from the template"
        );
        assert!(validate(&job).is_empty(), "{:?}", validate(&job));
    }

    #[test]
    fn parallelism_alone_leaves_completions_unset_and_own_labels_stay() {
        let mut job = json!({
            "metadata": {"name": "j", "uid": "u", "labels": {"team": "storage"}},
            "spec": {"parallelism": 2, "template": {"spec": {"containers": [{"name": "c"}]}}},
        });
        prepare_for_create(&mut job);
        assert!(job["spec"].get("completions").is_none());
        assert_eq!(job["metadata"]["labels"], json!({"team": "storage"}));
        // the pod template's restartPolicy defaults to Always, which a Job refuses
        let errors: Vec<String> = validate(&job).iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                "spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\""
            ]
        );
        assert_eq!(validate(&job)[0].reason, "FieldValueNotSupported");
    }

    #[test]
    fn bad_numbers_and_a_missing_container_are_named() {
        let job = json!({"spec": {"backoffLimit": -1, "activeDeadlineSeconds": 0,
            "template": {"spec": {"restartPolicy": "Never"}}}});
        let errors: Vec<String> = validate(&job).iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                "spec.template.spec.containers: Required value",
                "spec.backoffLimit: Invalid value: -1: must be greater than or equal to 0",
                "spec.activeDeadlineSeconds: Invalid value: 0: must be greater than 0",
            ]
        );
    }
}
