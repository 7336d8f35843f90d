//! `machine.LifecycleService`: the Talos 1.13+ Upgrade (installer pre-flight, streamed progress).

use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::{Api, stream_of, upgradeable, v};
use crate::sim::talos::fault::{Effect, Method, Occasion};
use crate::talos::proto::machine::{self as pb, lifecycle_service_server::LifecycleService};
use crate::version::TalosVersion;

#[tonic::async_trait]
impl LifecycleService for Api {
    async fn upgrade(
        &self,
        req: Request<pb::LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<BoxStream<pb::LifecycleServiceUpgradeResponse>>, Status> {
        let idx = self.admit(&req, Method::Upgrade)?;
        let r = req.into_inner();
        let mut c = self.shared.lock();
        let host = c.nodes()[idx].running.clone();
        if host < v(1, 13) {
            return Err(Status::unimplemented(
                "unknown service machine.LifecycleService",
            ));
        }
        let image = r.source.map(|s| s.image_name).unwrap_or_default();
        if image.is_empty() {
            return Err(Status::invalid_argument("source image name is required"));
        }
        if !c.nodes()[idx].images.contains(&image) {
            return Err(Status::not_found(format!(
                "image {image:?} not found in the system containerd namespace: pull it first (ImageService.Pull)"
            )));
        }
        let progress = |p| Ok(pb::LifecycleServiceUpgradeResponse { progress: Some(p) });
        let msg = |m: String| {
            progress(pb::LifecycleServiceInstallProgress {
                response: Some(pb::lifecycle_service_install_progress::Response::Message(m)),
            })
        };
        let exit = |code| {
            progress(pb::LifecycleServiceInstallProgress {
                response: Some(pb::lifecycle_service_install_progress::Response::ExitCode(
                    code,
                )),
            })
        };
        let mut items = vec![msg(format!("running installer {image}"))];
        if let Some(Effect::UpgradeExit { code, message }) =
            c.fire(idx, Occasion::Call(Method::Upgrade), |e| {
                matches!(e, Effect::UpgradeExit { .. })
            })
        {
            items.push(msg(message));
            items.push(exit(code));
            return Ok(stream_of(items));
        }
        let target =
            crate::sim::reference::tag_of(&image).and_then(|t| TalosVersion::parse(t).ok());
        match target {
            None => {
                items.push(msg(format!(
                    "installer image {image:?} does not carry a Talos version tag"
                )));
                items.push(exit(1));
            }
            Some(t) if !upgradeable(&host, &t) => {
                items.push(msg(format!(
                    "pre-flight check failed: upgrade from {host} to {t} is not supported"
                )));
                items.push(exit(1));
            }
            Some(t) => {
                items.push(msg(format!("installing Talos {t} (current {host})")));
                items.push(msg("boot entry updated; reboot to activate".to_string()));
                items.push(exit(0));
                c.install_entry(idx, t, &image);
            }
        }
        Ok(stream_of(items))
    }
}
