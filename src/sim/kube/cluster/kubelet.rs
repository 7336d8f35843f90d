//! The kubelet's pod side: mirror pods of the static control-plane pods, pod creation and
//! termination, and the pod lifecycle (Pending → Running → Ready, termination grace) over time.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus, Pod,
    PodSpec, PodStatus, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::{
    Active, CONFIG_FILE_VERSION_ANNOTATION, CONFIG_VERSION_ANNOTATION, KubeSide, MIRROR_ANNOTATION,
    NewPod, NodeView, PodTimer, condition, controller_of, is_mirror, is_terminating, node_name,
    phase, pod_ready, to_value,
};
use crate::sim::kube::batch::{EXIT_CODE_ANNOTATION, RUN_SECONDS_ANNOTATION};
use crate::sim::kube::resources::{NODES, PODS};
use crate::sim::kube::store::{k8s_time, name_of, ns_of, uid_of};
use crate::sim::node::NodeFacts;

fn mirror_pod(f: &NodeFacts, component: &str, image: &str, version: &str, name: &str) -> Pod {
    let mut annotations: BTreeMap<String, String> = [
        (
            "kubernetes.io/config.source".to_string(),
            "file".to_string(),
        ),
        (CONFIG_VERSION_ANNOTATION.to_string(), version.to_string()),
        // the sim never rotates the cluster secrets
        ("talos.dev/secrets-version".to_string(), "1".to_string()),
    ]
    .into();
    if let Some(v) = f.static_pod_config_file_versions.get(component) {
        annotations.insert(CONFIG_FILE_VERSION_ANNOTATION.to_string(), v.clone());
    }
    let hash = format!(
        "{:x}",
        Sha256::digest(format!("{}/{component}/{image}", f.name).as_bytes())
    );
    let hash = hash[..32].to_string();
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("kube-system".into()),
            labels: Some(
                [
                    ("k8s-app".to_string(), component.to_string()),
                    ("tier".to_string(), "control-plane".to_string()),
                ]
                .into(),
            ),
            annotations: Some({
                annotations.insert("kubernetes.io/config.hash".to_string(), hash.clone());
                annotations.insert(MIRROR_ANNOTATION.to_string(), hash);
                annotations
            }),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: component.to_string(),
                image: Some(image.to_string()),
                command: Some(vec![format!("/usr/local/bin/{component}")]),
                ..Container::default()
            }],
            host_network: Some(true),
            node_name: Some(f.name.clone()),
            priority: Some(2_000_001_000),
            priority_class_name: Some("system-node-critical".into()),
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".into()),
                ..Toleration::default()
            }]),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Pending".into()),
            host_ip: Some(f.address.clone()),
            ..PodStatus::default()
        }),
    }
}

#[allow(
    clippy::expect_used,
    reason = "k8s_time renders RFC 3339 with a Z offset, which k8s-openapi's Time always parses"
)]
fn pod_status(
    pod: &Value,
    node: &NodeView,
    started: bool,
    ready: bool,
    crash: bool,
    now: &str,
) -> PodStatus {
    let host_network = pod.pointer("/spec/hostNetwork") == Some(&json!(true));
    let pod_ip = if host_network {
        node.address.clone()
    } else {
        let h = Sha256::digest(uid_of(pod).as_bytes());
        format!("10.244.{}.{}", h[0], h[1].max(2))
    };
    let containers: Vec<Container> = pod
        .pointer("/spec/containers")
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default();
    let container_statuses = containers
        .iter()
        .map(|c| ContainerStatus {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            image_id: String::new(),
            container_id: started.then(|| {
                format!(
                    "containerd://{}",
                    &format!(
                        "{:x}",
                        Sha256::digest(format!("{}{}", uid_of(pod), c.name).as_bytes())
                    )[..32]
                )
            }),
            ready,
            started: Some(started),
            restart_count: if crash { 5 } else { 0 },
            state: Some(if started && crash {
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("CrashLoopBackOff".into()),
                        message: Some(format!(
                            "back-off 2m40s restarting failed container={} pod={}",
                            c.name,
                            name_of(pod)
                        )),
                    }),
                    ..ContainerState::default()
                }
            } else if started {
                ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(Time(now.parse().expect("k8s_time output parses"))),
                    }),
                    ..ContainerState::default()
                }
            } else {
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("ContainerCreating".into()),
                        message: None,
                    }),
                    ..ContainerState::default()
                }
            }),
            ..ContainerStatus::default()
        })
        .collect();
    let mut ready_condition = condition("Ready", ready, now);
    let mut containers_ready = condition("ContainersReady", ready, now);
    if !ready {
        ready_condition.reason = Some("ContainersNotReady".into());
        containers_ready.reason = Some("ContainersNotReady".into());
    }
    let qos = pod
        .pointer("/status/qosClass")
        .and_then(Value::as_str)
        .unwrap_or("BestEffort")
        .to_string();
    PodStatus {
        phase: Some(if started { "Running" } else { "Pending" }.into()),
        conditions: Some(vec![
            condition("PodReadyToStartContainers", started, now),
            condition("Initialized", true, now),
            ready_condition,
            containers_ready,
            condition("PodScheduled", true, now),
        ]),
        host_ip: Some(node.address.clone()),
        pod_ip: Some(pod_ip.clone()),
        pod_ips: Some(vec![k8s_openapi::api::core::v1::PodIP { ip: pod_ip }]),
        start_time: Some(Time(now.parse().expect("k8s_time output parses"))),
        container_statuses: Some(container_statuses),
        qos_class: Some(qos),
        ..PodStatus::default()
    }
}

impl KubeSide {
    pub(super) fn sync_mirror_pods(
        &mut self,
        nodes: &[NodeView],
        now: Instant,
        wall: jiff::Timestamp,
    ) {
        let mut wanted: BTreeSet<(String, String)> = BTreeSet::new();
        let present: HashSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        self.crash_looping.clear();
        self.inc.forget_mirrors();
        for f in self.source.nodes() {
            if !present.contains(f.name.as_str()) {
                continue;
            }
            for c in &f.crash_looping {
                self.crash_looping.insert((f.name.clone(), c.clone()));
            }
            for (component, image) in &f.static_pod_images {
                let name = format!("{component}-{}", f.name);
                wanted.insert(("kube-system".to_string(), name.clone()));
                self.inc.want_mirror(&f.name, &name);
                self.sync_mirror_pod(&f, component, image, &name, now, wall);
            }
        }
        let stale: Vec<String> = self
            .store
            .list(&PODS, Some("kube-system"))
            .filter(|pod| {
                is_mirror(pod)
                    && !wanted.contains(&(ns_of(pod).to_string(), name_of(pod).to_string()))
            })
            .map(|pod| name_of(pod).to_string())
            .collect();
        for name in stale {
            self.store.delete(&PODS, "kube-system", &name);
        }
    }

    /// Keep one static pod's mirror pod (`kube-system/name`) in step with the node's facts.
    pub(super) fn sync_mirror_pod(
        &mut self,
        f: &NodeFacts,
        component: &str,
        image: &str,
        name: &str,
        now: Instant,
        wall: jiff::Timestamp,
    ) {
        let key = (f.name.clone(), component.to_string());
        let existing = self.store.get(&PODS, "kube-system", name).cloned();
        let current_image = existing.as_ref().and_then(|p| {
            p.pointer("/spec/containers/0/image")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        let annotation = |key: &str| {
            existing.as_ref().and_then(|p| {
                p.pointer("/metadata/annotations")
                    .and_then(|a| a.get(key))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
        };
        let current_version = annotation(CONFIG_VERSION_ANNOTATION);
        let current_file_version = annotation(CONFIG_FILE_VERSION_ANNOTATION);
        // the config version the Talos side rendered the pod from; a source that does
        // not say (kube-side tests) counts image changes instead
        let counted = self
            .mirror_versions
            .get(&key)
            .map_or(1, |(img, v)| if img == image { *v } else { v + 1 });
        let version = f
            .static_pod_config_versions
            .get(component)
            .cloned()
            .unwrap_or_else(|| counted.to_string());
        if current_image.as_deref() == Some(image)
            && current_version.as_deref() == Some(version.as_str())
            && current_file_version.as_ref() == f.static_pod_config_file_versions.get(component)
        {
            return;
        }
        // The static pod changed (or is new): the kubelet replaces the mirror pod. Any change
        // of the manifest counts, an annotation too: the kubelet derives a static pod's UID
        // from a hash of the whole pod object (kubernetes `pkg/kubelet/config/common.go`,
        // `applyDefaults`), so a new annotation value is a new pod.
        if existing.is_some() {
            self.store.delete(&PODS, "kube-system", name);
        }
        self.mirror_versions
            .insert(key, (image.to_string(), counted));
        let pod = mirror_pod(f, component, image, &version, name);
        let mut value = to_value(&pod);
        value["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "v1",
            "kind": "Node",
            "name": f.name,
            "uid": self.store.get(&NODES, "", &f.name).map(uid_of).unwrap_or(""),
            "controller": true,
        }]);
        // a `SlowStaticPodStart` fault delays this component's new pods further
        let extra = self
            .faults
            .iter()
            .filter_map(|f| match f {
                Active::SlowStaticPodStart {
                    component: c,
                    extra,
                } if c == component => Some(*extra),
                _ => None,
            })
            .max()
            .unwrap_or_default();
        if let Ok(created) = self.store.create(&PODS, value, wall) {
            self.timers.insert(
                uid_of(&created).to_string(),
                PodTimer {
                    ready_at: Some(now + self.timing.start + extra),
                    remove_at: None,
                },
            );
        }
    }

    /// Create a pod for a controller; bound to `node` (DaemonSets) or left for the scheduler.
    pub(super) fn create_pod(&mut self, new: NewPod<'_>, now: Instant, wall: jiff::Timestamp) {
        let NewPod {
            ns,
            base,
            template,
            owner,
            node,
            extra_labels,
            extra_tolerations,
        } = new;
        let name = self.next_name(base);
        let mut meta = template.metadata.clone().unwrap_or_default();
        let mut labels = meta.labels.take().unwrap_or_default();
        labels.extend(extra_labels);
        let mut spec = template.spec.clone().unwrap_or_default();
        let mut tolerations = spec.tolerations.take().unwrap_or_default();
        tolerations.extend(extra_tolerations);
        spec.tolerations = (!tolerations.is_empty()).then_some(tolerations);
        spec.node_name = node.map(str::to_string);
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(ns.to_string()),
                labels: Some(labels),
                annotations: meta.annotations,
                owner_references: Some(vec![owner]),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                qos_class: Some("BestEffort".into()),
                ..PodStatus::default()
            }),
        };
        if let Ok(created) = self.store.create(&PODS, to_value(&pod), wall)
            && node.is_some()
        {
            self.timers.insert(
                uid_of(&created).to_string(),
                PodTimer {
                    ready_at: Some(now + self.timing.start),
                    remove_at: None,
                },
            );
        }
    }

    /// Begin deleting a pod: immediately, or after the termination delay.
    pub fn terminate(
        &mut self,
        ns: &str,
        name: &str,
        now: Instant,
        wall: jiff::Timestamp,
    ) -> Option<Value> {
        let pod = self.store.get(&PODS, ns, name)?.clone();
        if is_terminating(&pod) {
            return Some(pod);
        }
        let uid = uid_of(&pod).to_string();
        // a pod with finalizers stays (deleted, terminating) until they are removed
        if self.timing.termination.is_zero() && !super::jobs::has_finalizers(&pod) {
            self.timers.remove(&uid);
            let mut gone = self.store.delete(&PODS, ns, name)?;
            gone["metadata"]["deletionTimestamp"] = json!(k8s_time(wall));
            gone["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            return Some(gone);
        }
        let mut next = pod;
        let grace = self.timing.termination.as_secs().max(1);
        let deadline = wall
            .checked_add(jiff::SignedDuration::from_secs(grace as i64))
            .unwrap_or(wall);
        next["metadata"]["deletionTimestamp"] = json!(k8s_time(deadline));
        next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
        let timer = self.timers.entry(uid).or_insert(PodTimer {
            ready_at: None,
            remove_at: None,
        });
        timer.remove_at = Some(now + self.timing.termination);
        Some(self.store.put(&PODS, next, wall))
    }

    pub(super) fn pods_owned_by(&self, uid: &str) -> Vec<Value> {
        self.store
            .list(&PODS, None)
            .filter(|p| controller_of(p).is_some_and(|(_, _, u)| u == uid))
            .cloned()
            .collect()
    }

    pub(super) fn kubelet(&mut self, nodes: &[NodeView], now: Instant, wall: jiff::Timestamp) {
        let by_name: HashMap<&str, &NodeView> =
            nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        // Decide over the pods as they are, then write: each pod's decision reads only itself
        // and its own timer.
        let mut out = KubeletOut::default();
        for pod in self.store.list(&PODS, None) {
            let view = by_name.get(node_name(pod)).copied();
            self.kubelet_pod(pod, view, now, wall, &mut out);
        }
        self.kubelet_apply(out, wall);
    }

    /// The kubelet's decision for one pod (`view`: its node, if it exists).
    pub(super) fn kubelet_pod(
        &self,
        pod: &Value,
        view: Option<&NodeView>,
        now: Instant,
        wall: jiff::Timestamp,
        out: &mut KubeletOut,
    ) {
        let node = node_name(pod);
        if node.is_empty() || is_terminating(pod) || matches!(phase(pod), "Succeeded" | "Failed") {
            return;
        }
        let Some(view) = view else {
            // The node is gone: pod garbage collection.
            out.gone
                .push((ns_of(pod).to_string(), name_of(pod).to_string()));
            return;
        };
        let timer = self.timers.get(uid_of(pod));
        let started = phase(pod) == "Running"
            || (view.ready && timer.is_none_or(|t| t.ready_at.is_none_or(|r| r <= now)));
        if started && self.run_to_completion(pod, view, now, wall, out) {
            if timer.is_some() {
                out.started.push(uid_of(pod).to_string());
            }
            return;
        }
        let crash = is_mirror(pod)
            && pod
                .pointer("/metadata/labels/k8s-app")
                .and_then(Value::as_str)
                .is_some_and(|c| {
                    self.crash_looping
                        .contains(&(node.to_string(), c.to_string()))
                });
        let ready = started && view.ready && !crash;
        if started && timer.is_some() {
            out.started.push(uid_of(pod).to_string());
        }
        let was_running = phase(pod) == "Running";
        let has_status = pod.pointer("/status/containerStatuses").is_some();
        if has_status && was_running == started && pod_ready(pod) == ready {
            return;
        }
        let status = pod_status(pod, view, started, ready, crash, &k8s_time(wall));
        let mut next = pod.clone();
        next["status"] = to_value(&status);
        out.updated.push(next);
    }

    /// The kubelet's decision for a started container that runs to completion (a pod with
    /// `restartPolicy: Never` or `OnFailure`, a Job's): it exits `run-seconds` after it started
    /// (the test-only annotation [`RUN_SECONDS_ANNOTATION`], default at once) with its exit
    /// code ([`KubeSide::exit_code`]). Exit 0, or any exit under `Never`, ends the pod
    /// (`Succeeded` / `Failed`, containers `terminated`); a failed exit under `OnFailure`
    /// restarts the container in place (`restartCount` + 1) after the kubelet's crash back-off
    /// (10 s doubling, at most 300 s: kubernetes `pkg/kubelet/kubelet.go` `backOffPeriod`,
    /// `MaxContainerBackOff`). Returns whether it decided (else the pod is a running one).
    fn run_to_completion(
        &self,
        pod: &Value,
        view: &NodeView,
        now: Instant,
        wall: jiff::Timestamp,
        out: &mut KubeletOut,
    ) -> bool {
        let restart = pod
            .pointer("/spec/restartPolicy")
            .and_then(Value::as_str)
            .unwrap_or("Always");
        if is_mirror(pod) || !matches!(restart, "Never" | "OnFailure") {
            return false;
        }
        let uid = uid_of(pod).to_string();
        let run = run_time(pod);
        let end = self.runs.get(&uid).copied().unwrap_or(now + run);
        let time = k8s_time(wall);
        let mut base = if pod.pointer("/status/containerStatuses").is_some() {
            pod.get("status").cloned().unwrap_or_default()
        } else {
            to_value(&pod_status(pod, view, true, false, false, &time))
        };
        if end > now {
            // running until it exits
            if !self.runs.contains_key(&uid) {
                out.runs.push((uid, end));
            }
            if phase(pod) == "Running" && pod.pointer("/status/containerStatuses").is_some() {
                return true;
            }
            let mut next = pod.clone();
            next["status"] = base;
            out.updated.push(next);
            return true;
        }
        let code = self.exit_code(pod);
        let started_at = |c: &Value| {
            c.pointer("/state/running/startedAt")
                .cloned()
                .unwrap_or_else(|| json!(time))
        };
        let mut next = pod.clone();
        if code != 0 && restart == "OnFailure" {
            let mut restarts = 0;
            if let Some(cs) = base
                .get_mut("containerStatuses")
                .and_then(Value::as_array_mut)
            {
                for c in cs.iter_mut() {
                    let n = c["restartCount"].as_i64().unwrap_or(0) + 1;
                    restarts = restarts.max(n);
                    c["lastState"] = json!({"terminated": {
                        "exitCode": code, "reason": "Error",
                        "startedAt": started_at(c), "finishedAt": time,
                    }});
                    c["restartCount"] = json!(n);
                    c["state"] = json!({"running": {"startedAt": time}});
                }
            }
            let back_off = Duration::from_secs(10)
                .saturating_mul(1 << (restarts - 1).clamp(0, 5))
                .min(Duration::from_secs(300));
            out.runs.push((uid, now + back_off + run));
            next["status"] = base;
            out.updated.push(next);
            return true;
        }
        let (phase, reason) = if code == 0 {
            ("Succeeded", "PodCompleted")
        } else {
            ("Failed", "PodFailed")
        };
        base["phase"] = json!(phase);
        if let Some(conds) = base.get_mut("conditions").and_then(Value::as_array_mut) {
            for c in conds.iter_mut() {
                match c["type"].as_str() {
                    Some("Ready" | "ContainersReady") => {
                        c["status"] = json!("False");
                        c["reason"] = json!(reason);
                        c["lastTransitionTime"] = json!(time);
                    }
                    Some("Initialized") => c["reason"] = json!("PodCompleted"),
                    Some("PodReadyToStartContainers") => {
                        c["status"] = json!("False");
                        c["lastTransitionTime"] = json!(time);
                    }
                    _ => {}
                }
            }
        }
        if let Some(cs) = base
            .get_mut("containerStatuses")
            .and_then(Value::as_array_mut)
        {
            for c in cs.iter_mut() {
                let terminated = json!({"terminated": {
                    "exitCode": code,
                    "reason": if code == 0 { "Completed" } else { "Error" },
                    "startedAt": started_at(c),
                    "finishedAt": time,
                    "containerID": c["containerID"],
                }});
                c["state"] = terminated;
                c["ready"] = json!(false);
                c["started"] = json!(false);
            }
        }
        out.runs_done.push(uid);
        next["status"] = base;
        out.updated.push(next);
        true
    }

    /// The exit code of a run-to-completion pod's containers: the test-only annotation
    /// [`EXIT_CODE_ANNOTATION`], else a [`Active::JobPodExit`] fault naming its Job, else 0.
    fn exit_code(&self, pod: &Value) -> i64 {
        if let Some(code) = pod
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(EXIT_CODE_ANNOTATION))
            .and_then(Value::as_str)
            .and_then(|v| v.trim().parse::<i64>().ok())
        {
            return code;
        }
        let job = controller_of(pod).filter(|(kind, _, _)| kind == "Job");
        self.faults
            .iter()
            .find_map(|f| match (f, &job) {
                (
                    Active::JobPodExit {
                        namespace,
                        job_prefix,
                        exit_code,
                    },
                    Some((_, name, _)),
                ) if namespace == ns_of(pod) && name.starts_with(job_prefix.as_str()) => {
                    Some(i64::from(*exit_code))
                }
                _ => None,
            })
            .unwrap_or(0)
    }

    /// Write the kubelet's decisions: started timers, garbage-collected pods, new statuses.
    pub(super) fn kubelet_apply(&mut self, out: KubeletOut, wall: jiff::Timestamp) {
        for (uid, end) in out.runs {
            self.runs.insert(uid, end);
        }
        for uid in out.runs_done {
            self.runs.remove(&uid);
        }
        for uid in out.started {
            if let Some(t) = self.timers.get_mut(&uid) {
                t.ready_at = None;
                if t.remove_at.is_none() {
                    self.timers.remove(&uid);
                }
            }
        }
        for (ns, name) in out.gone {
            self.store.delete(&PODS, &ns, &name);
        }
        for next in out.updated {
            self.store.put(&PODS, next, wall);
        }
    }
}

/// What the kubelet decided over a set of pods, written by [`KubeSide::kubelet_apply`].
#[derive(Default)]
pub(super) struct KubeletOut {
    gone: Vec<(String, String)>,
    started: Vec<String>,
    updated: Vec<Value>,
    /// Run-to-completion containers that started (or restarted): when they exit.
    runs: Vec<(String, Instant)>,
    /// Run-to-completion pods that ended.
    runs_done: Vec<String>,
}

/// How long a run-to-completion container runs ([`RUN_SECONDS_ANNOTATION`], default 0).
fn run_time(pod: &Value) -> Duration {
    pod.pointer("/metadata/annotations")
        .and_then(|a| a.get(RUN_SECONDS_ANNOTATION))
        .and_then(Value::as_str)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_secs)
}
