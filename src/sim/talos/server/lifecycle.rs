//! `machine.LifecycleService`: the Talos 1.13+ Upgrade (installer pre-flight, streamed progress;
//! the install itself takes the scenario's `timing.install`).
//!
//! As upstream (siderolabs/talos `internal/app/lifecycle/lifecycle.go`, `container.go`): one
//! install or upgrade at a time per node (`TryLock`, else `FailedPrecondition` "another
//! installation/upgrade is already in progress"), and the installer is waited for on a
//! detached context, so a caller that goes away (a crash, a lost connection) does not stop it:
//! the boot entry is written when the install ends all the same. Meanwhile the node runs its
//! version, `MachineStatus` stays `running` (the lifecycle service changes no machine stage)
//! and its next boot is unchanged.

use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::{Api, stream_of, upgradeable, v};
use crate::sim::talos::fault::{Effect, Method, Occasion};
use crate::sim::talos::model::Power;
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
        // upstream takes its lock before anything else
        let boot_id = c.nodes()[idx].boot_id.clone();
        if c.nodes()[idx].installing.as_ref() == Some(&boot_id) {
            return Err(Status::failed_precondition(
                "another installation/upgrade is already in progress",
            ));
        }
        let image = r.source.map(|s| s.image_name).unwrap_or_default();
        if image.is_empty() {
            return Err(Status::invalid_argument("source image name is required"));
        }
        if !c.nodes()[idx].images.contains(&image) {
            return Err(crate::sim::talos::registry::lifecycle_not_found(&image));
        }
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
                let install = c.timing.install;
                if install.is_zero() {
                    items.extend(installed(c.install_entry(idx, t, &image)));
                    return Ok(stream_of(items));
                }
                // The installer runs on its own (upstream waits for it on a detached
                // context) holding the node's lock, while the stream streams its output: the
                // first lines now, the boot entry and the exit code once `timing.install` has
                // passed, whether the caller is still there or not. A node that went down
                // meanwhile breaks the stream as its connection would, and nothing is
                // installed (the lock went with the boot).
                c.node_mut(idx).installing = Some(boot_id.clone());
                drop(c);
                let (tx, rx) = tokio::sync::mpsc::channel(items.len() + 2);
                for item in items {
                    // capacity for every line: cannot be full
                    let _ = tx.try_send(item);
                }
                let shared = self.shared.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(install).await;
                    let rest = {
                        let mut c = shared.lock();
                        let n = c.node_mut(idx);
                        let same_boot = n.power == Power::Up && n.boot_id == boot_id;
                        if n.installing.as_ref() == Some(&boot_id) {
                            n.installing = None;
                        }
                        if same_boot {
                            installed(c.install_entry(idx, t, &image))
                        } else {
                            vec![Err(Status::unavailable(
                                "connection reset: the node went down during the install",
                            ))]
                        }
                    };
                    for item in rest {
                        // the caller may be gone: the install is done all the same
                        if tx.send(item).await.is_err() {
                            break;
                        }
                    }
                });
                return Ok(Response::new(Box::pin(ReceiverStream::new(rx))));
            }
        }
        Ok(stream_of(items))
    }
}

type Item = Result<pb::LifecycleServiceUpgradeResponse, Status>;

fn progress(p: pb::LifecycleServiceInstallProgress) -> Item {
    Ok(pb::LifecycleServiceUpgradeResponse { progress: Some(p) })
}

/// An installer output line.
fn msg(m: String) -> Item {
    progress(pb::LifecycleServiceInstallProgress {
        response: Some(pb::lifecycle_service_install_progress::Response::Message(m)),
    })
}

/// The installer's last lines: the boot entry written, or the bootloader's error and a
/// non-zero exit code.
fn installed(r: Result<(), String>) -> Vec<Item> {
    match r {
        Ok(()) => vec![
            msg("boot entry updated; reboot to activate".to_string()),
            exit(0),
        ],
        Err(e) => vec![msg(e), exit(1)],
    }
}

/// The installer's exit code, the stream's last message.
fn exit(code: i32) -> Item {
    progress(pb::LifecycleServiceInstallProgress {
        response: Some(pb::lifecycle_service_install_progress::Response::ExitCode(
            code,
        )),
    })
}
