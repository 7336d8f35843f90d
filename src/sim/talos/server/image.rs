//! `machine.ImageService`: Pull into a containerd namespace, with per-layer progress.

use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::{Api, pull_delay, v};
use crate::sim::talos::fault::Method;
use crate::sim::talos::registry;
use crate::talos::proto::common;
use crate::talos::proto::machine::image_service_pull_layer_progress::Status as LayerStatus;
use crate::talos::proto::machine::{self as pb, image_service_server::ImageService};

/// The one layer every simulated image has.
const SIM_LAYER: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

#[tonic::async_trait]
impl ImageService for Api {
    async fn pull(
        &self,
        req: Request<pb::ImageServicePullRequest>,
    ) -> Result<Response<BoxStream<pb::ImageServicePullResponse>>, Status> {
        let idx = self.admit(&req, Method::ImagePull)?;
        let r = req.into_inner();
        if self.shared.lock().nodes()[idx].running < v(1, 13) {
            return Err(Status::unimplemented(
                "unknown service machine.ImageService",
            ));
        }
        if r.image_ref.is_empty() {
            return Err(Status::invalid_argument("image reference is required"));
        }
        if let Err(why) = self.shared.lock().registry.lookup(&r.image_ref) {
            return Err(registry::pull_not_found(&why));
        }
        let cri = r
            .containerd
            .as_ref()
            .is_some_and(|c| c.namespace == common::ContainerdNamespace::NsCri as i32);
        let delay = pull_delay(&self.shared, idx, &r.image_ref)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            // Headers go out at once; the layers "download" for `delay`. (A zero delay skips
            // the timer: tokio rounds every sleep up to its 1 ms tick.)
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let layer = pb::ImageServicePullResponse {
                response: Some(pb::image_service_pull_response::Response::PullProgress(
                    pb::ImageServicePullProgress {
                        layer_id: SIM_LAYER.to_string(),
                        progress: Some(pb::ImageServicePullLayerProgress {
                            status: LayerStatus::DownloadComplete as i32,
                            elapsed: Some(prost_types::Duration {
                                seconds: delay.as_secs() as i64,
                                nanos: delay.subsec_nanos() as i32,
                            }),
                            offset: 1024,
                            total: 1024,
                        }),
                    },
                )),
            };
            if tx.send(Ok(layer)).await.is_err() {
                return;
            }
            shared.lock().node_mut(idx).pulled(&r.image_ref, cri);
            let done = pb::ImageServicePullResponse {
                response: Some(pb::image_service_pull_response::Response::Name(r.image_ref)),
            };
            let _ = tx.send(Ok(done)).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
