//! The gRPC API (`proto/medea/v1/medea.proto`). Read RPCs serve from the store and the last
//! loaded desired state; mutating RPCs go through the same store transactions as the CLI.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::Shared;
use crate::inventory::{self, MachineRole, ObservedCluster};
use crate::store::{StoreExt, Txn};

pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("medea.v1");
}

pub struct MedeaApi {
    pub shared: Arc<Shared>,
}

fn internal(e: impl std::fmt::Display) -> Status {
    tracing::error!(error = %e, "API request failed");
    Status::internal(e.to_string())
}

fn role_name(r: MachineRole) -> &'static str {
    match r {
        MachineRole::Controlplane => "controlplane",
        MachineRole::Worker => "worker",
    }
}

impl MedeaApi {
    fn cluster_pb(&self, name: &str, observed: Option<&ObservedCluster>) -> pb::Cluster {
        let desired = self.shared.desired();
        let desired_k8s = desired
            .as_ref()
            .and_then(|d| d.desired.clusters.get(name))
            .map(|c| c.kubernetes_version.value.to_string())
            .unwrap_or_default();
        match observed {
            Some(o) => pb::Cluster {
                name: name.to_string(),
                kubernetes_version: o
                    .kubernetes_version
                    .as_ref()
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
                desired_kubernetes_version: desired_k8s,
                rollouts_enabled: o.rollouts_enabled,
                generation: o.generation,
                machines: o.machines.len() as u32,
                machines_ready: o.machines.values().filter(|m| m.ready).count() as u32,
                observed: true,
            },
            None => pb::Cluster {
                name: name.to_string(),
                desired_kubernetes_version: desired_k8s,
                ..Default::default()
            },
        }
    }

    /// The pool a machine belongs to in the current desired state, if any.
    fn pool_of(&self, cluster: &str, m: &inventory::Machine) -> String {
        let desired = self.shared.desired();
        desired
            .as_ref()
            .and_then(|d| d.desired.clusters.get(cluster))
            .and_then(|c| c.pools.values().find(|p| p.selects(&m.node, &m.labels)))
            .map(|p| p.name.value.clone())
            .unwrap_or_default()
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::RolloutEvent, Status>> + Send>>;

#[tonic::async_trait]
impl pb::medea_server::Medea for MedeaApi {
    async fn server_info(
        &self,
        _: Request<pb::ServerInfoRequest>,
    ) -> Result<Response<pb::ServerInfoResponse>, Status> {
        let desired = self.shared.desired();
        Ok(Response::new(pb::ServerInfoResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            git_sha: crate::build_info::GIT_SHA.to_string(),
            rollouts_gate: self.shared.rollouts_gate,
            replica: self.shared.replica.clone(),
            leader: true,
            leader_replica: self.shared.replica.clone(),
            desired_source: self.shared.source.to_string(),
            desired_revision: desired
                .map(|d| d.desired.revision.to_string())
                .unwrap_or_default(),
        }))
    }

    async fn list_clusters(
        &self,
        _: Request<pb::ListClustersRequest>,
    ) -> Result<Response<pb::ListClustersResponse>, Status> {
        let inv = inventory::Inventory::load(self.shared.store.as_ref()).map_err(internal)?;
        let mut names: std::collections::BTreeSet<String> = inv.clusters.keys().cloned().collect();
        if let Some(d) = self.shared.desired() {
            names.extend(d.desired.clusters.keys().cloned());
        }
        let clusters = names
            .iter()
            .map(|n| self.cluster_pb(n, inv.clusters.get(n)))
            .collect();
        Ok(Response::new(pb::ListClustersResponse { clusters }))
    }

    async fn list_node_pools(
        &self,
        req: Request<pb::ListNodePoolsRequest>,
    ) -> Result<Response<pb::ListNodePoolsResponse>, Status> {
        let filter = req.into_inner().cluster;
        let inv = inventory::Inventory::load(self.shared.store.as_ref()).map_err(internal)?;
        let mut pools = Vec::new();
        if let Some(d) = self.shared.desired() {
            for (cname, c) in &d.desired.clusters {
                if !filter.is_empty() && &filter != cname {
                    continue;
                }
                for p in c.pools.values() {
                    let members: Vec<&inventory::Machine> = inv
                        .clusters
                        .get(cname)
                        .map(|o| {
                            o.machines
                                .values()
                                .filter(|m| p.selects(&m.node, &m.labels))
                                .collect()
                        })
                        .unwrap_or_default();
                    let mut running: Vec<String> = members
                        .iter()
                        .filter_map(|m| m.talos_version.as_ref().map(|v| v.to_string()))
                        .collect();
                    running.sort();
                    running.dedup();
                    pools.push(pb::NodePool {
                        cluster: cname.clone(),
                        name: p.name.value.clone(),
                        role: match p.role {
                            crate::desired::Role::Controlplane => "controlplane".into(),
                            crate::desired::Role::Worker => "worker".into(),
                        },
                        desired_talos_version: p.talos_version.value.to_string(),
                        running_talos_versions: running,
                        machines: members.len() as u32,
                        max_unavailable: p.rollout.max_unavailable,
                    });
                }
            }
        }
        Ok(Response::new(pb::ListNodePoolsResponse { pools }))
    }

    async fn list_machines(
        &self,
        req: Request<pb::ListMachinesRequest>,
    ) -> Result<Response<pb::ListMachinesResponse>, Status> {
        let filter = req.into_inner().cluster;
        let inv = inventory::Inventory::load(self.shared.store.as_ref()).map_err(internal)?;
        let mut machines = Vec::new();
        for (cname, c) in &inv.clusters {
            if !filter.is_empty() && &filter != cname {
                continue;
            }
            for m in c.machines.values() {
                machines.push(pb::Machine {
                    cluster: cname.clone(),
                    pool: self.pool_of(cname, m),
                    node: m.node.clone(),
                    id: m.id.clone(),
                    address: m.address.clone(),
                    role: role_name(m.role).into(),
                    talos_version: m
                        .talos_version
                        .as_ref()
                        .map(|v| v.to_string())
                        .unwrap_or_default(),
                    kubelet_version: m
                        .kubelet_version
                        .as_ref()
                        .map(|v| v.to_string())
                        .unwrap_or_default(),
                    ready: m.ready,
                    cordoned: m.cordoned,
                    reachable: m.reachable,
                });
            }
        }
        Ok(Response::new(pb::ListMachinesResponse { machines }))
    }

    async fn get_plan(
        &self,
        _: Request<pb::GetPlanRequest>,
    ) -> Result<Response<pb::GetPlanResponse>, Status> {
        Err(Status::unimplemented(
            "plans are served once the planner is wired in",
        ))
    }

    async fn list_plans(
        &self,
        _: Request<pb::ListPlansRequest>,
    ) -> Result<Response<pb::ListPlansResponse>, Status> {
        Err(Status::unimplemented(
            "plans are served once the planner is wired in",
        ))
    }

    async fn submit_approval(
        &self,
        _: Request<pb::SubmitApprovalRequest>,
    ) -> Result<Response<pb::SubmitApprovalResponse>, Status> {
        Err(Status::unimplemented(
            "approvals are served once the approval layer is wired in",
        ))
    }

    async fn set_rollouts_enabled(
        &self,
        req: Request<pb::SetRolloutsEnabledRequest>,
    ) -> Result<Response<pb::SetRolloutsEnabledResponse>, Status> {
        let req = req.into_inner();
        let key = inventory::cluster_key(&req.cluster);
        let store = self.shared.store.as_ref();
        let current: ObservedCluster =
            store.get_record(&key).map_err(internal)?.ok_or_else(|| {
                Status::not_found(format!(
                    "cluster `{}` has not been observed: run `medea seed` first",
                    req.cluster
                ))
            })?;
        let next = current.with_rollouts_enabled(req.enabled);
        store
            .commit(
                Txn::new()
                    .check_record(key.as_str(), &current)
                    .put_record(key.as_str(), &next),
            )
            .map_err(|e| match e {
                crate::store::StoreError::Conflict { .. } => {
                    Status::aborted("the cluster changed concurrently; retry")
                }
                other => internal(other),
            })?;
        tracing::info!(cluster = %req.cluster, enabled = req.enabled, "rolloutsEnabled changed");
        self.shared.changed.notify_waiters();
        Ok(Response::new(pb::SetRolloutsEnabledResponse {
            cluster: Some(self.cluster_pb(&req.cluster, Some(&next))),
        }))
    }

    async fn list_rollouts(
        &self,
        _: Request<pb::ListRolloutsRequest>,
    ) -> Result<Response<pb::ListRolloutsResponse>, Status> {
        Err(Status::unimplemented(
            "rollouts are served once the executor is wired in",
        ))
    }

    async fn watch_rollout(
        &self,
        _: Request<pb::WatchRolloutRequest>,
    ) -> Result<Response<EventStream>, Status> {
        Err(Status::unimplemented(
            "rollouts are served once the executor is wired in",
        ))
    }

    async fn halt_rollout(
        &self,
        _: Request<pb::HaltRolloutRequest>,
    ) -> Result<Response<pb::HaltRolloutResponse>, Status> {
        Err(Status::unimplemented(
            "rollouts are served once the executor is wired in",
        ))
    }
}
