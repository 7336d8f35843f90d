//! Workload rollout state for health gates (issue #23): Deployments, StatefulSets and
//! DaemonSets of a namespace with their desired, updated and available replica counts,
//! converted from k8s-openapi at this edge.

use ::kube::api::{Api, ListParams};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};

use super::K8sError;
use super::client::KubeClient;
use crate::plan::health::WorkloadKind;

/// One workload's rollout state, as `kubectl rollout status` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadState {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
    /// Desired replicas (`spec.replicas`, default 1; a DaemonSet's
    /// `status.desiredNumberScheduled`).
    pub desired: i64,
    /// Replicas at the current template (`updatedReplicas` / `updatedNumberScheduled`).
    pub updated: i64,
    /// Available replicas (`availableReplicas` / `numberAvailable`).
    pub available: i64,
    /// Replicas in total, old template included (Deployments; `None` otherwise).
    pub total: Option<i64>,
    /// The controller has seen the latest spec (`status.observedGeneration >=
    /// metadata.generation`).
    pub observed: bool,
}

impl WorkloadState {
    /// Rolled out: the controller saw the latest spec, every desired replica is updated and
    /// available, and no replica of an old template is left.
    pub fn is_rolled_out(&self) -> bool {
        self.observed
            && self.updated >= self.desired
            && self.available >= self.desired
            && self.total.is_none_or(|t| t <= self.updated)
    }
}

fn observed(generation: Option<i64>, observed: Option<i64>) -> bool {
    match (generation, observed) {
        (Some(g), Some(o)) => o >= g,
        (None, _) => true,
        (Some(_), None) => false,
    }
}

impl KubeClient {
    /// The workloads of one kind in `namespace`, by name.
    pub async fn workloads(
        &self,
        namespace: &str,
        kind: WorkloadKind,
    ) -> Result<Vec<WorkloadState>, K8sError> {
        let lp = ListParams::default();
        let mut out = match kind {
            WorkloadKind::Deployment => {
                let api: Api<Deployment> = Api::namespaced(self.client.clone(), namespace);
                let list = self
                    .call("list deployments in", namespace, || api.list(&lp))
                    .await?;
                list.items
                    .into_iter()
                    .map(|d| {
                        let st = d.status.unwrap_or_default();
                        WorkloadState {
                            kind,
                            namespace: namespace.to_string(),
                            name: d.metadata.name.unwrap_or_default(),
                            desired: i64::from(d.spec.and_then(|s| s.replicas).unwrap_or(1)),
                            updated: i64::from(st.updated_replicas.unwrap_or(0)),
                            available: i64::from(st.available_replicas.unwrap_or(0)),
                            total: Some(i64::from(st.replicas.unwrap_or(0))),
                            observed: observed(d.metadata.generation, st.observed_generation),
                        }
                    })
                    .collect::<Vec<_>>()
            }
            WorkloadKind::StatefulSet => {
                let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), namespace);
                let list = self
                    .call("list statefulsets in", namespace, || api.list(&lp))
                    .await?;
                list.items
                    .into_iter()
                    .map(|s| {
                        let st = s.status.unwrap_or_default();
                        WorkloadState {
                            kind,
                            namespace: namespace.to_string(),
                            name: s.metadata.name.unwrap_or_default(),
                            desired: i64::from(s.spec.and_then(|s| s.replicas).unwrap_or(1)),
                            updated: i64::from(st.updated_replicas.unwrap_or(0)),
                            available: i64::from(st.available_replicas.unwrap_or(0)),
                            total: None,
                            observed: observed(s.metadata.generation, st.observed_generation),
                        }
                    })
                    .collect()
            }
            WorkloadKind::DaemonSet => {
                let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), namespace);
                let list = self
                    .call("list daemonsets in", namespace, || api.list(&lp))
                    .await?;
                list.items
                    .into_iter()
                    .map(|d| {
                        let st = d.status.unwrap_or_default();
                        WorkloadState {
                            kind,
                            namespace: namespace.to_string(),
                            name: d.metadata.name.unwrap_or_default(),
                            desired: i64::from(st.desired_number_scheduled),
                            updated: i64::from(st.updated_number_scheduled.unwrap_or(0)),
                            available: i64::from(st.number_available.unwrap_or(0)),
                            total: None,
                            observed: observed(d.metadata.generation, st.observed_generation),
                        }
                    })
                    .collect()
            }
        };
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}
