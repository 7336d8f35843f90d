//! [`KubeAdapter`]: [`KubePort`] over the Kubernetes client.
//!
//! The drain is the client's PDB-aware drain (evictions only, never a delete); a PodDisruption
//! Budget that still refuses when the drain timeout runs out comes back as
//! [`DrainOutcome::Blocked`], which the machine turns into a halt once the pool's drain timeout
//! has passed.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::desired::hooks::HookAction;
use crate::desired::model::DrainPolicy;
use crate::k8s::{self, ControlPlaneComponent, DrainOptions, K8sError, KubeApi, KubeClient};
use crate::metrics::timed;
use crate::rollout::ports::{
    CORDONED_BY_ANNOTATION, Component, CordonedBy, DrainOutcome, FOREIGN_CORDON_ANNOTATIONS,
    HookReport, HookRequest, KubeNode, KubePort, Manifest, NodeTaint, PortError, Refusal,
    StaticPod, VolumeAttachment,
};

const API: &str = "kubernetes";

/// The Kubernetes side of one cluster.
#[derive(Debug)]
pub struct KubeAdapter {
    client: KubeClient,
    /// Drain pacing (backoff, polling); the timeout and the pod policy (emptyDir, bare pods,
    /// skipped pods) come from each call, i.e. from the approved plan.
    drain: DrainOptions,
}

fn classify(op: &'static str, target: &str, e: K8sError) -> PortError {
    if e.is_transient() {
        PortError::transient(op, target, e)
    } else {
        PortError::failed(op, target, e)
    }
}

fn component(c: Component) -> Option<ControlPlaneComponent> {
    match c {
        Component::ApiServer => Some(ControlPlaneComponent::ApiServer),
        Component::ControllerManager => Some(ControlPlaneComponent::ControllerManager),
        Component::Scheduler => Some(ControlPlaneComponent::Scheduler),
        Component::Proxy | Component::Kubelet => None,
    }
}

fn port_taint(t: k8s::NodeTaintSpec) -> NodeTaint {
    NodeTaint {
        key: t.key,
        value: t.value,
        effect: t.effect,
    }
}

fn spec(t: &NodeTaint) -> k8s::NodeTaintSpec {
    k8s::NodeTaintSpec {
        key: t.key.clone(),
        value: t.value.clone(),
        effect: t.effect.clone(),
    }
}

impl KubeAdapter {
    /// The adapter over `client`, with the default drain pacing.
    pub fn new(client: KubeClient) -> KubeAdapter {
        KubeAdapter {
            client,
            drain: DrainOptions::default(),
        }
    }

    /// Use `options`' backoff and polling for drains; the timeout and the pod policy always
    /// come from the executor's command (the plan's `drain:`).
    pub fn with_drain_policy(mut self, options: DrainOptions) -> KubeAdapter {
        self.drain = options;
        self
    }

    pub fn client(&self) -> &KubeClient {
        &self.client
    }
}

impl KubePort for KubeAdapter {
    async fn run_job_hook(&self, req: &HookRequest) -> HookReport {
        let HookAction::Job {
            namespace,
            pod_spec,
            ttl_seconds_after_finished,
        } = &req.hook.action
        else {
            return HookReport::failed("not a Job hook");
        };
        let h = k8s::hook_job::HookJob {
            name: &req.run_id,
            namespace,
            pod_spec,
            job: &req.job,
            hook: &req.hook.name,
            point: req.point.as_str(),
            node: req.node.as_deref().unwrap_or(""),
            timeout: req.hook.timeout,
            ttl_seconds_after_finished: *ttl_seconds_after_finished,
        };
        match timed(
            API,
            "RunHookJob",
            self.client.run_hook_job(&h, self.drain.poll_interval),
        )
        .await
        {
            Ok(r) => HookReport {
                succeeded: r.succeeded,
                detail: r.detail,
                exit_code: r.exit_code,
                log_tail: r.log_tail,
            },
            Err(e) => HookReport::failed(crate::error_chain(&e)),
        }
    }

    async fn node(&self, node: &str) -> Result<KubeNode, PortError> {
        let r = timed(API, "GetNode", self.client.node_readiness(node))
            .await
            .map_err(|e| classify("get node", node, e))?;
        Ok(KubeNode {
            ready: r.ready,
            kubelet_version: Some(r.kubelet_version),
            unschedulable: r.unschedulable,
            taints: r.taints.into_iter().map(port_taint).collect(),
            cordoned_by: cordoned_by(&r.annotations),
        })
    }

    async fn nodes(&self) -> Result<BTreeMap<String, KubeNode>, PortError> {
        let list = timed(API, "ListNodes", KubeApi::nodes(&self.client))
            .await
            .map_err(|e| classify("list nodes", "the cluster", e))?;
        Ok(list
            .into_iter()
            .map(|n| {
                (
                    n.name,
                    KubeNode {
                        ready: n.ready,
                        kubelet_version: n.kubelet_version,
                        unschedulable: n.unschedulable,
                        taints: n.taints.into_iter().map(port_taint).collect(),
                        cordoned_by: cordoned_by(&n.annotations),
                    },
                )
            })
            .collect())
    }

    async fn taint(&self, node: &str, taint: &NodeTaint) -> Result<(), PortError> {
        timed(
            API,
            "Taint",
            self.client.set_taint(node, &spec(taint), true),
        )
        .await
        .map_err(|e| classify("taint", node, e))
    }

    async fn untaint(&self, node: &str, taint: &NodeTaint) -> Result<(), PortError> {
        timed(
            API,
            "Untaint",
            self.client.set_taint(node, &spec(taint), false),
        )
        .await
        .map_err(|e| classify("untaint", node, e))
    }

    async fn cordon(&self, node: &str, owner: &str) -> Result<(), PortError> {
        timed(API, "Cordon", self.client.set_cordon_of(node, owner, true))
            .await
            .map_err(|e| classify("cordon", node, e))
    }

    async fn uncordon(&self, node: &str, owner: &str) -> Result<(), PortError> {
        timed(
            API,
            "Uncordon",
            self.client.set_cordon_of(node, owner, false),
        )
        .await
        .map_err(|e| classify("uncordon", node, e))
    }

    async fn drain(
        &self,
        node: &str,
        timeout: Duration,
        policy: &DrainPolicy,
    ) -> Result<DrainOutcome, PortError> {
        let options = DrainOptions {
            timeout,
            policy: policy.clone(),
            ..self.drain.clone()
        };
        // the volumes of the pods this drain evicts, read before it (tuppr `EvictableVolumePVs`)
        let volumes = timed(
            API,
            "DrainVolumes",
            self.client.drain_volumes(node, &options),
        )
        .await
        .map_err(|e| classify("drain", node, e))?;
        match timed(API, "Drain", self.client.drain(node, &options)).await {
            Ok(_report) => Ok(DrainOutcome::Drained { volumes }),
            Err(K8sError::DrainBlocked { pod, pdb, .. }) => Ok(DrainOutcome::Blocked {
                volumes,
                pdb: pdb.unwrap_or_else(|| "(unidentified)".to_string()),
                pod: pod.to_string(),
            }),
            // pods the policy refuses: halt, naming them, with the refusal typed
            Err(e @ K8sError::DrainLocalStorage { .. }) => {
                Err(PortError::refused("drain", node, Refusal::LocalStorage, e))
            }
            Err(e @ K8sError::DrainUnmanaged { .. }) => {
                Err(PortError::refused("drain", node, Refusal::UnmanagedPods, e))
            }
            // evicted pods that never went away: halt, naming them
            Err(e) => Err(classify("drain", node, e)),
        }
    }

    async fn volume_attachments(&self, node: &str) -> Result<Vec<VolumeAttachment>, PortError> {
        let list = timed(
            API,
            "ListVolumeAttachments",
            self.client.volume_attachments(node),
        )
        .await
        .map_err(|e| classify("list volumeattachments", node, e))?;
        Ok(list
            .into_iter()
            .map(|(name, persistent_volume)| VolumeAttachment {
                name,
                persistent_volume,
            })
            .collect())
    }

    async fn static_pod(&self, node: &str, c: Component) -> Result<Option<StaticPod>, PortError> {
        let Some(want) = component(c) else {
            return Ok(None);
        };
        let pods = timed(
            API,
            "ControlPlanePods",
            self.client.control_plane_pods(node),
        )
        .await
        .map_err(|e| classify("list control-plane pods", node, e))?;
        Ok(pods
            .into_iter()
            .find(|p| p.component == want)
            .map(|p| StaticPod {
                image: p.image,
                ready: p.running && p.ready,
                config_version: p.config_version,
            }))
    }

    async fn apply_manifests(
        &self,
        manifests: &[Manifest],
        legacy: bool,
        wait: Duration,
    ) -> Result<(), PortError> {
        let objects = manifests
            .iter()
            .enumerate()
            .map(|(i, m)| k8s::Manifest::from_value(m.0.clone(), i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| PortError::failed("manifests sync", "bootstrap manifests", e))?;
        let mode = if legacy {
            k8s::bootstrap::SyncMode::Legacy
        } else {
            k8s::bootstrap::SyncMode::ServerSide
        };
        let report = timed(
            API,
            "Apply",
            self.client.sync_bootstrap_manifests(&objects, mode, wait),
        )
        .await
        .map_err(|e| classify("manifests sync", "bootstrap manifests", e))?;
        tracing::info!(
            applied = report.applied.len(),
            pruned = ?report.pruned,
            ?mode,
            "bootstrap manifests synced"
        );
        Ok(())
    }
}

/// Who the node's annotations say cordoned it ([`CordonedBy`]): medea's job annotation first,
/// else the first foreign cordon annotation it carries.
fn cordoned_by(annotations: &BTreeMap<String, String>) -> Option<CordonedBy> {
    if let Some(job) = annotations.get(CORDONED_BY_ANNOTATION) {
        return Some(CordonedBy::Job(job.clone()));
    }
    FOREIGN_CORDON_ANNOTATIONS
        .iter()
        .find(|a| annotations.contains_key(**a))
        .map(|a| CordonedBy::Annotation((*a).to_string()))
}
