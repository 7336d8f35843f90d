//! `cluster.ClusterService`: HealthCheck, the streamed cluster health report.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::{Api, meta};
use crate::sim::talos::fault::Method;
use crate::talos::proto::cluster::{self as pb_cluster, cluster_service_server::ClusterService};

#[tonic::async_trait]
impl ClusterService for Api {
    async fn health_check(
        &self,
        req: Request<pb_cluster::HealthCheckRequest>,
    ) -> Result<Response<BoxStream<pb_cluster::HealthCheckProgress>>, Status> {
        let idx = self.admit(&req, Method::HealthCheck)?;
        let r = req.into_inner();
        let info = r.cluster_info.unwrap_or_default();
        let wait = r
            .wait_timeout
            .map(|d| Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32))
            .unwrap_or_default();
        let (poll, discovered) = {
            let c = self.shared.lock();
            if !c.nodes()[idx].control_plane() {
                return Err(Status::failed_precondition(
                    "health check is only supported on control plane nodes",
                ));
            }
            let names: Vec<String> = c.nodes().iter().map(|n| n.spec.address.clone()).collect();
            (c.timing.health_poll, names)
        };
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let line = |m: String| {
                Ok(pb_cluster::HealthCheckProgress {
                    metadata: meta(),
                    message: m,
                })
            };
            if tx
                .send(line(format!(
                    "discovered nodes: [{}]",
                    discovered.join(" ")
                )))
                .await
                .is_err()
            {
                return;
            }
            let deadline = tokio::time::Instant::now() + wait;
            let mut reported = BTreeSet::new();
            loop {
                let results = shared
                    .lock()
                    .health_checks(&info.control_plane_nodes, &info.worker_nodes);
                let mut failure = None;
                for (check, res) in results {
                    match res {
                        Ok(()) => {
                            if reported.insert(check.clone()) {
                                let _ = tx.send(line(format!("waiting for {check}: OK"))).await;
                            }
                        }
                        Err(reason) => failure = Some((check, reason)),
                    }
                }
                let Some((check, reason)) = failure else {
                    return;
                };
                let _ = tx
                    .send(line(format!("waiting for {check}: {reason}")))
                    .await;
                if tokio::time::Instant::now() >= deadline {
                    let _ = tx
                        .send(Err(Status::deadline_exceeded(format!(
                            "health check timed out waiting for {check}: {reason}"
                        ))))
                        .await;
                    return;
                }
                tokio::time::sleep(poll).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
