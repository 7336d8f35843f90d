//! The simulated apid: tonic services for the RPCs medea uses, over the real wire types. Every
//! handler first routes the request ([`TalosSide::admit`]); RPCs not listed here answer
//! `Unimplemented` (the generated default stubs).
//!
//! **Owns:** the shared state and routing of the services (this file) and one file per gRPC
//! service: `machine` (`MachineService`), `lifecycle` (`LifecycleService`), `image`
//! (`ImageService`), `cluster` (`ClusterService`) and `state` (COSI `State`).
//! **May depend on:** the rest of `sim::talos` (model, fault, scenario, machineconfig) and the
//! generated wire types of `talos::proto`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::fault::{Effect, Method, Occasion};
use super::model::{RebootTicket, TalosSide};
use super::scenario::RebootTiming;
use crate::sim::node::{Keyspace, KeyspaceSource};
use crate::talos::proto::common;
use crate::version::TalosVersion;

mod cluster;
mod image;
mod lifecycle;
mod machine;
mod state;

/// State shared by every service of one simulator.
pub(crate) struct Shared {
    pub cluster: Mutex<TalosSide>,
    /// What the control plane's etcd holds: the kube side's store, once it started on this
    /// simulator ([`crate::sim::node::NodeSource::attach_keyspace`]). Read without holding
    /// `cluster` (the kube side reads the Talos side under its own lock).
    pub keyspace: Mutex<Option<Arc<dyn KeyspaceSource>>>,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, TalosSide> {
        // A panicking handler must not wedge the simulator for the other tests' requests.
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The keyspace etcd holds now: the kube side's, or an empty one (a new etcd's) when no kube
    /// side runs on this simulator. Never called with `cluster` locked.
    pub fn keyspace(&self) -> Keyspace {
        let source = self
            .keyspace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        source.and_then(|s| s.keyspace()).unwrap_or_default()
    }
}

/// Finish a reboot after the configured delay (no-op in manual mode).
pub(crate) fn schedule_boot(shared: &Arc<Shared>, ticket: RebootTicket, timing: RebootTiming) {
    if let RebootTiming::After(delay) = timing {
        let shared = shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            shared.lock().finish_boot(ticket);
        });
    }
}

/// The gRPC front of the simulator (one value serves all services).
#[derive(Clone)]
pub(crate) struct Api {
    pub shared: Arc<Shared>,
}

fn stream_of<T: Send + 'static>(items: Vec<Result<T, Status>>) -> Response<BoxStream<T>> {
    Response::new(Box::pin(tokio_stream::iter(items)))
}

fn v(major: u64, minor: u64) -> TalosVersion {
    TalosVersion::new(major, minor, 0)
}

fn ts(unix: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: unix,
        nanos: 0,
    }
}

fn meta() -> Option<common::Metadata> {
    None
}

/// Can `target` be installed over `host`? (installer pre-flight: same major, at most two minors
/// up and one down, as `compatibility.TalosVersion.UpgradeableFrom` allows.)
pub(crate) fn upgradeable(host: &TalosVersion, target: &TalosVersion) -> bool {
    host.major() == target.major()
        && host.minor() + 2 >= target.minor()
        && target.minor() + 1 >= host.minor()
}

impl Api {
    fn admit<T>(&self, req: &Request<T>, m: Method) -> Result<usize, Status> {
        self.shared.lock().admit(req.metadata(), m)
    }

    /// Talos' `machinehelper.CheckControlplane` (siderolabs/talos
    /// `internal/app/internal/machinehelper/machinehelper.go`): `Unimplemented`,
    /// `"<api> is only available on control plane nodes"` on a worker.
    fn require_control_plane(c: &TalosSide, idx: usize, api: &str) -> Result<(), Status> {
        if c.nodes()[idx].control_plane() {
            Ok(())
        } else {
            Err(Status::unimplemented(format!(
                "{api} is only available on control plane nodes"
            )))
        }
    }
}

/// How long a pull of `image` takes, or the error an armed `pullFail` answers with.
fn pull_delay(shared: &Shared, idx: usize, image: &str) -> Result<Duration, Status> {
    let mut c = shared.lock();
    match c.fire(idx, Occasion::Call(Method::ImagePull), |e| {
        matches!(e, Effect::SlowPull { .. } | Effect::PullFail { .. })
    }) {
        Some(Effect::SlowPull { delay }) => Ok(delay),
        Some(Effect::PullFail { message }) => Err(Status::unknown(format!(
            "failed to pull image {image:?}: {message}"
        ))),
        _ => Ok(c.timing.image_pull),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installer_preflight_allows_two_minors_up_and_one_down() {
        let t = |s: &str| TalosVersion::parse(s).unwrap();
        assert!(upgradeable(&t("v1.12.4"), &t("v1.14.0")));
        assert!(upgradeable(&t("v1.13.9"), &t("v1.13.9")));
        assert!(upgradeable(&t("v1.14.0"), &t("v1.13.9")));
        assert!(!upgradeable(&t("v1.11.6"), &t("v1.14.0")));
        assert!(!upgradeable(&t("v1.14.0"), &t("v1.12.4")));
        assert!(!upgradeable(&t("v1.13.0"), &t("v2.0.0")));
    }
}
