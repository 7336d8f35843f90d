//! `batch/v1` Jobs on the simulated kube-apiserver (issue #35 item 2's simulator side), through
//! real kubectl and the `kube` client: the Job controller's pods, status and conditions, the
//! exit codes a test gives, the pod log, and deletion with each propagation policy.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams, PropagationPolicy};
use medea::sim::kube::{KubeFault, KubeSimConfig};
use serde_json::{Value, json};

use crate::rollout::CLUSTER;
use crate::rollout_sim::Sim;
use crate::sim_cluster::{kubectl, require_kubectl};

/// A hook-like Job: one container that gets the node and the job id as env.
fn job_yaml(name: &str, extra_spec: &str, annotations: &str) -> String {
    format!(
        r#"apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: default
spec:
{extra_spec}  template:
    metadata:
      annotations: {{{annotations}}}
    spec:
      restartPolicy: Never
      containers:
        - name: hook
          image: quay.io/ceph/ceph:v19
          command: ["ceph", "osd", "set", "noout"]
          env:
            - name: NODE
              value: w-1
            - name: JOB
              value: job-7
"#
    )
}

async fn ctl(bin: &Path, sim: &Sim, home: &Path, args: &[&str]) -> (bool, String) {
    let kubeconfig = sim.creds.join(CLUSTER).join("kubeconfig");
    kubectl(bin, &kubeconfig, home, args).await
}

async fn ctl_json(bin: &Path, sim: &Sim, home: &Path, args: &[&str]) -> Value {
    let (ok, out) = ctl(bin, sim, home, args).await;
    assert!(ok, "kubectl {args:?}: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn condition<'a>(job: &'a Value, kind: &str) -> Option<&'a Value> {
    job.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind && c["status"] == "True")
}

/// `kubectl apply` of a Job: one pod from the template (labels, owner, scheduled), Succeeded;
/// the Job `Complete` (and `SuccessCriteriaMet`) with `CompletionsReached` and its generated
/// selector; `kubectl logs job/…` shows the env the template passes; `kubectl delete`
/// (cascade=background) takes the pod with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_applied_with_kubectl_runs_to_completion_and_logs_its_env() {
    let Some(bin) = require_kubectl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let sim = Sim::start(home, 1, 2, KubeSimConfig::default()).await;
    let file = home.join("job.yaml");
    std::fs::write(&file, job_yaml("noout-w-1", "", "")).unwrap();
    let (ok, out) = ctl(&bin, &sim, home, &["apply", "-f", file.to_str().unwrap()]).await;
    assert!(ok, "{out}");
    let (ok, out) = ctl(
        &bin,
        &sim,
        home,
        &[
            "wait",
            "--for=condition=complete",
            "job/noout-w-1",
            "--timeout=30s",
        ],
    )
    .await;
    assert!(ok, "{out}");
    let job = ctl_json(&bin, &sim, home, &["get", "job", "noout-w-1", "-o", "json"]).await;
    let uid = job["metadata"]["uid"].as_str().unwrap();
    assert_eq!(
        job["spec"]["selector"]["matchLabels"],
        json!({"batch.kubernetes.io/controller-uid": uid})
    );
    assert_eq!(job["spec"]["backoffLimit"], 6, "the apiserver's default");
    assert_eq!(job["status"]["succeeded"], 1, "{job}");
    assert!(job["status"].get("active").is_none(), "{job}");
    assert!(job["status"]["completionTime"].is_string(), "{job}");
    for kind in ["SuccessCriteriaMet", "Complete"] {
        let c = condition(&job, kind).unwrap_or_else(|| panic!("{kind}: {job}"));
        assert_eq!(c["reason"], "CompletionsReached");
    }
    let pods = ctl_json(
        &bin,
        &sim,
        home,
        &["get", "pods", "-l", "job-name=noout-w-1", "-o", "json"],
    )
    .await;
    let items = pods["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{pods}");
    let pod = &items[0];
    assert!(
        pod["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("noout-w-1-")
    );
    assert_eq!(pod["status"]["phase"], "Succeeded");
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        0
    );
    assert!(
        pod["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty())
    );
    let owner = &pod["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Job");
    assert_eq!(owner["uid"], uid);
    assert_eq!(owner["controller"], true);
    assert!(
        pod["metadata"].get("finalizers").is_none(),
        "the tracking finalizer goes once the pod is counted: {pod}"
    );
    assert_eq!(
        pod["metadata"]["labels"]["batch.kubernetes.io/controller-uid"],
        uid
    );
    let (ok, log) = ctl(&bin, &sim, home, &["logs", "job/noout-w-1"]).await;
    assert!(ok, "{log}");
    for line in [
        "NODE=w-1",
        "JOB=job-7",
        "sim: running ceph osd set noout",
        "sim: exited with code 0",
    ] {
        assert!(log.lines().any(|l| l == line), "{line} in {log}");
    }
    let (ok, tail) = ctl(&bin, &sim, home, &["logs", "job/noout-w-1", "--tail=1"]).await;
    assert!(ok, "{tail}");
    assert_eq!(tail.trim(), "sim: exited with code 0");
    let (ok, out) = ctl(&bin, &sim, home, &["delete", "job", "noout-w-1"]).await;
    assert!(ok, "{out}");
    let (ok, out) = ctl(
        &bin,
        &sim,
        home,
        &["get", "pods", "-l", "job-name=noout-w-1", "-o", "name"],
    )
    .await;
    assert!(ok, "{out}");
    assert!(
        out.trim().is_empty(),
        "kubectl deletes in the background: {out}"
    );
}

/// A Job whose pods exit non-zero (the test-only annotation) is retried `backoffLimit` times,
/// then fails with `BackoffLimitExceeded`; a pod template with the default restart policy is
/// refused as the apiserver does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_job_exhausts_its_backoff_limit_and_a_restarting_template_is_refused() {
    let Some(bin) = require_kubectl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let sim = Sim::start(home, 1, 2, KubeSimConfig::default()).await;
    let file = home.join("job.yaml");
    std::fs::write(
        &file,
        job_yaml(
            "noout-fails",
            "  backoffLimit: 1\n",
            "\"sim.medea.dev/exit-code\": \"3\"",
        ),
    )
    .unwrap();
    let (ok, out) = ctl(&bin, &sim, home, &["apply", "-f", file.to_str().unwrap()]).await;
    assert!(ok, "{out}");
    let (ok, out) = ctl(
        &bin,
        &sim,
        home,
        &[
            "wait",
            "--for=condition=failed",
            "job/noout-fails",
            "--timeout=30s",
        ],
    )
    .await;
    assert!(ok, "{out}");
    let job = ctl_json(
        &bin,
        &sim,
        home,
        &["get", "job", "noout-fails", "-o", "json"],
    )
    .await;
    assert_eq!(job["status"]["failed"], 2, "one try and one retry: {job}");
    for kind in ["FailureTarget", "Failed"] {
        let c = condition(&job, kind).unwrap_or_else(|| panic!("{kind}: {job}"));
        assert_eq!(c["reason"], "BackoffLimitExceeded");
        assert_eq!(c["message"], "Job has reached the specified backoff limit");
    }
    assert!(condition(&job, "Complete").is_none());
    let pods = ctl_json(
        &bin,
        &sim,
        home,
        &["get", "pods", "-l", "job-name=noout-fails", "-o", "json"],
    )
    .await;
    let items = pods["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{pods}");
    for p in items {
        assert_eq!(p["status"]["phase"], "Failed");
        let t = &p["status"]["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(t["exitCode"], 3, "{p}");
        assert_eq!(t["reason"], "Error");
        let name = p["metadata"]["name"].as_str().unwrap();
        let (ok, tail) = ctl(&bin, &sim, home, &["logs", name, "--tail=1"]).await;
        assert!(ok, "{tail}");
        assert_eq!(tail.trim(), "sim: exited with code 3");
    }

    let always =
        job_yaml("restarts", "", "").replace("restartPolicy: Never", "restartPolicy: Always");
    std::fs::write(&file, always).unwrap();
    let (ok, out) = ctl(&bin, &sim, home, &["apply", "-f", file.to_str().unwrap()]).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains(
            "spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\""
        ),
        "{out}"
    );
    let (ok, out) = ctl(&bin, &sim, home, &["get", "job", "restarts"]).await;
    assert!(!ok && out.contains("NotFound"), "nothing stored: {out}");
}

/// A long-running Job with `activeDeadlineSeconds` fails with `DeadlineExceeded` and its pod
/// is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_active_deadline_fails_and_its_pod_is_deleted() {
    let Some(bin) = require_kubectl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let sim = Sim::start(home, 1, 2, KubeSimConfig::default()).await;
    let file = home.join("job.yaml");
    std::fs::write(
        &file,
        job_yaml(
            "slow",
            "  activeDeadlineSeconds: 1\n",
            "\"sim.medea.dev/run-seconds\": \"600\"",
        ),
    )
    .unwrap();
    let (ok, out) = ctl(&bin, &sim, home, &["apply", "-f", file.to_str().unwrap()]).await;
    assert!(ok, "{out}");
    let (ok, out) = ctl(
        &bin,
        &sim,
        home,
        &[
            "wait",
            "--for=condition=failed",
            "job/slow",
            "--timeout=30s",
        ],
    )
    .await;
    assert!(ok, "{out}");
    let job = ctl_json(&bin, &sim, home, &["get", "job", "slow", "-o", "json"]).await;
    let failed = condition(&job, "Failed").unwrap();
    assert_eq!(failed["reason"], "DeadlineExceeded", "{job}");
    assert_eq!(job["status"]["failed"], 1, "{job}");
    assert!(
        sim.kube.pods().iter().all(|p| !p.name.starts_with("slow-")),
        "the running pod was deleted"
    );
}

async fn client(sim: &Sim) -> kube::Client {
    let kubeconfig = sim.creds.join(CLUSTER).join("kubeconfig");
    kube::Client::try_from(medea::k8s::kubeconfig::load(&kubeconfig).await.unwrap()).unwrap()
}

async fn wait_for_job(api: &Api<Job>, name: &str, kind: &str) -> Job {
    for _ in 0..600 {
        let job = api.get(name).await.unwrap();
        let done = job
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == kind && c.status == "True"));
        if done {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("job {name} never got {kind}");
}

fn hook_job(name: &str) -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "hook", "image": "busybox",
                    "env": [{"name": "NODE", "value": "w-2"}]}],
            }},
        },
    }))
    .unwrap()
}

/// Through the `kube` client: a created Job completes and its pod's log can be read; a
/// `JobPodExit` fault fails another at once (`backoffLimit: 0`); a delete without a policy
/// orphans the pods (batch/v1's default), `Foreground` takes them with the Job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kube_client_creates_waits_reads_logs_and_deletes_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    let client = client(&sim).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    jobs.create(&PostParams::default(), &hook_job("medea-hook-ok"))
        .await
        .unwrap();
    let done = wait_for_job(&jobs, "medea-hook-ok", "Complete").await;
    assert_eq!(done.status.unwrap().succeeded, Some(1));
    let listed = pods
        .list(&ListParams::default().labels("job-name=medea-hook-ok"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    let pod_name = listed.items[0].metadata.name.clone().unwrap();
    let log = pods
        .logs(
            &pod_name,
            &LogParams {
                tail_lines: Some(2),
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(log, "NODE=w-2\nsim: exited with code 0\n");

    sim.kube.inject(KubeFault::JobPodExit {
        namespace: "default".into(),
        job_prefix: "medea-hook-bad".into(),
        exit_code: 2,
    });
    jobs.create(&PostParams::default(), &hook_job("medea-hook-bad"))
        .await
        .unwrap();
    let failed = wait_for_job(&jobs, "medea-hook-bad", "Failed").await;
    let status = failed.status.unwrap();
    assert_eq!(status.failed, Some(1), "backoffLimit 0: no retry");
    assert!(status.succeeded.is_none());

    // the default propagation of batch/v1 orphans the pods
    jobs.delete("medea-hook-ok", &DeleteParams::default())
        .await
        .unwrap();
    let orphan = pods.get(&pod_name).await.unwrap();
    assert!(
        orphan
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty(),
        "orphaned"
    );
    // foreground: the Job goes once its pods are gone
    jobs.delete(
        "medea-hook-bad",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    for _ in 0..600 {
        if jobs.get_opt("medea-hook-bad").await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(jobs.get_opt("medea-hook-bad").await.unwrap().is_none());
    let left = pods
        .list(&ListParams::default().labels("job-name=medea-hook-bad"))
        .await
        .unwrap();
    assert!(left.items.is_empty(), "{:?}", left.items);
}
