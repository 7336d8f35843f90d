//! The simulated apid: tonic services for the RPCs medea uses, over the real wire types. Every
//! handler first routes the request ([`Cluster::admit`]); RPCs not listed here answer
//! `Unimplemented` (the generated default stubs).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::fault::{Effect, Method, Occasion};
use super::machineconfig;
use super::model::{Cluster, Power, RebootTicket};
use super::scenario::RebootTiming;
use crate::talos::pbstruct;
use crate::talos::proto::cluster::{self as pb_cluster, cluster_service_server::ClusterService};
use crate::talos::proto::common;
use crate::talos::proto::cosi::resource::{self as cosi, state_server::State};
use crate::talos::proto::machine::image_service_pull_layer_progress::Status as LayerStatus;
use crate::talos::proto::machine::{
    self as pb, image_service_server::ImageService, lifecycle_service_server::LifecycleService,
    machine_service_server::MachineService,
};
use crate::talos::proto::resource::config::MachineConfigSpec;
use crate::talos::proto::talos::resource::definitions::{enums, k8s, runtime, v1alpha1};
use crate::talos::snapshot::with_trailer;
use crate::version::TalosVersion;

/// State shared by every service of one simulator.
pub(crate) struct Shared {
    pub cluster: Mutex<Cluster>,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, Cluster> {
        // A panicking handler must not wedge the simulator for the other tests' requests.
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
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

/// The one layer every simulated image has.
const SIM_LAYER: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

/// systemd-boot's variables (vendor GUID `4a67b082-…`, `efivarfs.ScopeSystemd` in Talos).
const LOADER_ENTRY_DEFAULT: &str =
    "/sys/firmware/efi/efivars/LoaderEntryDefault-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";
const LOADER_ENTRY_SELECTED: &str =
    "/sys/firmware/efi/efivars/LoaderEntrySelected-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";
/// EFI variable attributes: non-volatile, boot-service and runtime access.
const EFI_NV_BS_RT: u32 = 0x7;
const EFI_BS_RT: u32 = 0x6;

/// An efivarfs file: the 4-byte little-endian attributes, then the value, here a NUL-terminated
/// UTF-16LE string as systemd-boot (and Talos' `sdboot.WriteVariable`) stores it.
fn efivar(attributes: u32, value: &str) -> Vec<u8> {
    let mut out = attributes.to_le_bytes().to_vec();
    for unit in value.encode_utf16().chain([0]) {
        out.extend_from_slice(&unit.to_le_bytes());
    }
    out
}

const SNAPSHOT_DB_SIZE: usize = 64 * 1024;
const SNAPSHOT_CHUNK: usize = 16 * 1024;

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

    fn require_control_plane(c: &Cluster, idx: usize) -> Result<(), Status> {
        if c.nodes[idx].control_plane() {
            Ok(())
        } else {
            Err(Status::failed_precondition(
                "etcd is not available on worker nodes",
            ))
        }
    }
}

#[tonic::async_trait]
impl MachineService for Api {
    async fn version(&self, req: Request<()>) -> Result<Response<pb::VersionResponse>, Status> {
        let idx = self.admit(&req, Method::Version)?;
        let c = self.shared.lock();
        let n = &c.nodes[idx];
        Ok(Response::new(pb::VersionResponse {
            messages: vec![pb::Version {
                metadata: meta(),
                version: Some(pb::VersionInfo {
                    tag: n.running.to_string(),
                    sha: format!("sim{}", hex::encode(&n.running.to_string().as_bytes()[..4])),
                    built: String::new(),
                    go_version: "go1.25.5".to_string(),
                    os: "linux".to_string(),
                    arch: "amd64".to_string(),
                }),
                platform: Some(pb::PlatformInfo {
                    name: "metal".to_string(),
                    mode: "metal".to_string(),
                }),
                features: Some(pb::FeaturesInfo { rbac: true }),
            }],
        }))
    }

    async fn service_list(
        &self,
        req: Request<()>,
    ) -> Result<Response<pb::ServiceListResponse>, Status> {
        let idx = self.admit(&req, Method::ServiceList)?;
        let c = self.shared.lock();
        let since = c.started_unix;
        let services = c
            .services(idx)
            .into_iter()
            .map(|(id, healthy)| {
                let msg = if healthy {
                    "Health check successful".to_string()
                } else {
                    "Health check failed".to_string()
                };
                pb::ServiceInfo {
                    id: id.to_string(),
                    state: "Running".to_string(),
                    events: Some(pb::ServiceEvents {
                        events: vec![pb::ServiceEvent {
                            msg: msg.clone(),
                            state: "Running".to_string(),
                            ts: Some(ts(since)),
                        }],
                    }),
                    health: Some(pb::ServiceHealth {
                        unknown: false,
                        healthy,
                        last_message: msg,
                        last_change: Some(ts(since)),
                    }),
                }
            })
            .collect();
        Ok(Response::new(pb::ServiceListResponse {
            messages: vec![pb::ServiceList {
                metadata: meta(),
                services,
            }],
        }))
    }

    async fn etcd_member_list(
        &self,
        req: Request<pb::EtcdMemberListRequest>,
    ) -> Result<Response<pb::EtcdMemberListResponse>, Status> {
        let idx = self.admit(&req, Method::EtcdMemberList)?;
        let c = self.shared.lock();
        Self::require_control_plane(&c, idx)?;
        let local = req.get_ref().query_local;
        let members = c
            .etcd_members()
            .into_iter()
            .filter(|n| !local || n.spec.name == c.nodes[idx].spec.name)
            .map(|n| pb::EtcdMember {
                id: n.member_id,
                hostname: n.spec.name.clone(),
                peer_urls: vec![format!("https://{}:2380", n.spec.address)],
                client_urls: vec![format!("https://{}:2379", n.spec.address)],
                is_learner: false,
            })
            .collect();
        Ok(Response::new(pb::EtcdMemberListResponse {
            messages: vec![pb::EtcdMembers {
                metadata: meta(),
                legacy_members: vec![],
                members,
            }],
        }))
    }

    async fn etcd_status(
        &self,
        req: Request<()>,
    ) -> Result<Response<pb::EtcdStatusResponse>, Status> {
        let idx = self.admit(&req, Method::EtcdStatus)?;
        let c = self.shared.lock();
        Self::require_control_plane(&c, idx)?;
        let n = &c.nodes[idx];
        let errors = if n.etcd_healthy {
            vec![]
        } else {
            vec!["etcdserver: request timed out".to_string()]
        };
        let raft = 1000 + n.config_version + n.counters.boots * 100;
        Ok(Response::new(pb::EtcdStatusResponse {
            messages: vec![pb::EtcdStatus {
                metadata: meta(),
                member_status: Some(pb::EtcdMemberStatus {
                    storage_version: "3.6.0".to_string(),
                    member_id: n.member_id,
                    protocol_version: "3.6.5".to_string(),
                    db_size: SNAPSHOT_DB_SIZE as i64,
                    db_size_in_use: (SNAPSHOT_DB_SIZE / 2) as i64,
                    leader: c.etcd_leader(),
                    raft_index: raft,
                    raft_term: 2,
                    raft_applied_index: raft,
                    errors,
                    is_learner: false,
                }),
            }],
        }))
    }

    async fn etcd_snapshot(
        &self,
        req: Request<pb::EtcdSnapshotRequest>,
    ) -> Result<Response<BoxStream<common::Data>>, Status> {
        let idx = self.admit(&req, Method::EtcdSnapshot)?;
        let mut c = self.shared.lock();
        Self::require_control_plane(&c, idx)?;
        let brk = c.fire(idx, Occasion::Call(Method::EtcdSnapshot), |e| {
            matches!(e, Effect::SnapshotBreak { .. })
        });
        let n = &c.nodes[idx];
        let seed = format!(
            "{}:{}:{}",
            n.spec.name,
            n.config_version,
            n.counters.calls(Method::EtcdSnapshot)
        );
        let mut db = Vec::with_capacity(SNAPSHOT_DB_SIZE);
        while db.len() < SNAPSHOT_DB_SIZE {
            db.extend_from_slice(seed.as_bytes());
            db.push(b'\n');
        }
        db.truncate(SNAPSHOT_DB_SIZE);
        let snap = with_trailer(db);
        let limit = match brk {
            Some(Effect::SnapshotBreak { after_bytes }) => {
                usize::try_from(after_bytes).unwrap_or(usize::MAX)
            }
            _ => usize::MAX,
        };
        let mut items = Vec::new();
        let mut sent = 0usize;
        for chunk in snap.chunks(SNAPSHOT_CHUNK) {
            if sent >= limit {
                break;
            }
            let take = chunk.len().min(limit - sent);
            items.push(Ok(common::Data {
                metadata: meta(),
                bytes: chunk[..take].to_vec(),
            }));
            sent += take;
        }
        if limit != usize::MAX {
            items.push(Err(Status::internal(
                "failed to read etcd snapshot: unexpected EOF",
            )));
        }
        Ok(stream_of(items))
    }

    async fn read(
        &self,
        req: Request<pb::ReadRequest>,
    ) -> Result<Response<BoxStream<common::Data>>, Status> {
        let idx = self.admit(&req, Method::Read)?;
        let c = self.shared.lock();
        let n = &c.nodes[idx];
        let sd_boot = n.bootloader.sd_boot();
        match req.get_ref().path.as_str() {
            "/proc/sys/kernel/random/boot_id" => Ok(stream_of(vec![Ok(common::Data {
                metadata: meta(),
                bytes: format!("{}\n", n.boot_id).into_bytes(),
            })])),
            // systemd-boot's variables, as efivarfs shows them: the installer points
            // `LoaderEntryDefault` at the UKI it wrote; sd-boot sets `LoaderEntrySelected` to
            // the entry it booted.
            LOADER_ENTRY_DEFAULT if sd_boot && n.loader_default.is_some() => {
                let entry = n.loader_default.as_deref().unwrap_or_default();
                Ok(stream_of(vec![Ok(common::Data {
                    metadata: meta(),
                    bytes: efivar(EFI_NV_BS_RT, entry),
                })]))
            }
            LOADER_ENTRY_SELECTED if sd_boot => Ok(stream_of(vec![Ok(common::Data {
                metadata: meta(),
                bytes: efivar(EFI_BS_RT, &n.loader_selected),
            })])),
            p => Err(Status::not_found(format!(
                "open {p}: no such file or directory"
            ))),
        }
    }

    async fn reboot(
        &self,
        req: Request<pb::RebootRequest>,
    ) -> Result<Response<pb::RebootResponse>, Status> {
        let idx = self.admit(&req, Method::Reboot)?;
        let mut c = self.shared.lock();
        let actor_id = c.next_actor_id(idx);
        let ticket = c.begin_reboot(idx);
        let timing = c.timing.reboot;
        drop(c);
        schedule_boot(&self.shared, ticket, timing);
        Ok(Response::new(pb::RebootResponse {
            messages: vec![pb::Reboot {
                metadata: meta(),
                actor_id,
            }],
        }))
    }

    async fn upgrade(
        &self,
        req: Request<pb::UpgradeRequest>,
    ) -> Result<Response<pb::UpgradeResponse>, Status> {
        let idx = self.admit(&req, Method::LegacyUpgrade)?;
        #[allow(deprecated)]
        let r = req.into_inner();
        let mut c = self.shared.lock();
        if r.image.is_empty() {
            return Err(Status::invalid_argument("installer image is required"));
        }
        if let Some(Effect::UpgradeExit { message, .. }) =
            c.fire(idx, Occasion::Call(Method::LegacyUpgrade), |e| {
                matches!(e, Effect::UpgradeExit { .. })
            })
        {
            return Err(Status::internal(format!(
                "failed to run installer: {message}"
            )));
        }
        let target = crate::talos::types::image_tag(&r.image)
            .and_then(|t| TalosVersion::parse(t).ok())
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "installer image {:?} has no Talos version tag",
                    r.image
                ))
            })?;
        if !upgradeable(&c.nodes[idx].running, &target) {
            return Err(Status::failed_precondition(format!(
                "upgrade from {} to {target} is not supported",
                c.nodes[idx].running
            )));
        }
        // Without `force` (or `preserve`) a control plane checks etcd first (ValidateForUpgrade).
        if c.nodes[idx].control_plane()
            && !r.force
            && !r.preserve
            && let Some(bad) = c
                .etcd_members()
                .into_iter()
                .find(|n| n.power != Power::Up || !n.etcd_healthy)
        {
            return Err(Status::failed_precondition(format!(
                "etcd member {} is not healthy; all members must be healthy to perform an upgrade",
                bad.spec.name
            )));
        }
        c.nodes[idx].images.insert(r.image.clone());
        c.install_entry(idx, target);
        let actor_id = c.next_actor_id(idx);
        let ticket = c.begin_reboot(idx);
        let timing = c.timing.reboot;
        drop(c);
        schedule_boot(&self.shared, ticket, timing);
        Ok(Response::new(pb::UpgradeResponse {
            messages: vec![pb::Upgrade {
                metadata: meta(),
                ack: "Upgrade request received".to_string(),
                actor_id,
            }],
        }))
    }

    async fn image_pull(
        &self,
        req: Request<pb::ImagePullRequest>,
    ) -> Result<Response<pb::ImagePullResponse>, Status> {
        let idx = self.admit(&req, Method::ImagePull)?;
        #[allow(deprecated)]
        let r = req.into_inner();
        let image = r.reference;
        if image.is_empty() {
            return Err(Status::invalid_argument("image reference is required"));
        }
        let cri = r.namespace == common::ContainerdNamespace::NsCri as i32;
        let delay = pull_delay(&self.shared, idx, &image)?;
        tokio::time::sleep(delay).await;
        self.shared.lock().nodes[idx].pulled(&image, cri);
        Ok(Response::new(pb::ImagePullResponse {
            messages: vec![pb::ImagePull { metadata: meta() }],
        }))
    }

    async fn apply_configuration(
        &self,
        req: Request<pb::ApplyConfigurationRequest>,
    ) -> Result<Response<pb::ApplyConfigurationResponse>, Status> {
        let idx = self.admit(&req, Method::ApplyConfiguration)?;
        let r = req.into_inner();
        let mut c = self.shared.lock();
        let outcome = apply(&mut c, idx, &r)?;
        let timing = c.timing.reboot;
        drop(c);
        match outcome.after {
            After::Nothing => {}
            After::Reboot(ticket) => schedule_boot(&self.shared, ticket, timing),
            After::Revert {
                generation,
                timeout,
            } => {
                let shared = self.shared.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(timeout).await;
                    shared.lock().revert_try(idx, generation);
                });
            }
        }
        Ok(Response::new(pb::ApplyConfigurationResponse {
            messages: vec![pb::ApplyConfiguration {
                metadata: meta(),
                warnings: vec![],
                mode: outcome.mode as i32,
                mode_details: outcome.details,
            }],
        }))
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

enum After {
    Nothing,
    Reboot(RebootTicket),
    Revert { generation: u64, timeout: Duration },
}

struct Applied {
    mode: pb::apply_configuration_request::Mode,
    details: String,
    after: After,
}

/// ApplyConfiguration with the version-dependent semantics (1.14: no REBOOT, AUTO = NO_REBOOT,
/// NO_REBOOT applies everything live; ≤ 1.13: NO_REBOOT refuses changes that need a reboot,
/// AUTO reboots for them).
fn apply(
    c: &mut Cluster,
    idx: usize,
    r: &pb::ApplyConfigurationRequest,
) -> Result<Applied, Status> {
    use pb::apply_configuration_request::Mode;
    let modern = c.nodes[idx].running >= v(1, 14);
    let new = machineconfig::facts(&r.data).map_err(|e| Status::invalid_argument(e.to_string()))?;
    let old = c.nodes[idx].facts();
    if let Some(old) = &old
        && old.machine_type != new.machine_type
    {
        return Err(Status::invalid_argument(
            machineconfig::ConfigError::TypeChange {
                from: old.machine_type.clone(),
                to: new.machine_type.clone(),
            }
            .to_string(),
        ));
    }
    let needs_reboot = old
        .as_ref()
        .is_some_and(|o| machineconfig::needs_reboot(o, &new));
    #[allow(deprecated)]
    let requested =
        Mode::try_from(r.mode).map_err(|_| Status::invalid_argument("unknown apply mode"))?;
    #[allow(deprecated)]
    let mode = match (requested, modern) {
        (Mode::Reboot, true) => {
            return Err(Status::unimplemented(
                "apply configuration in REBOOT mode is only supported in maintenance mode",
            ));
        }
        (Mode::Auto, true) => Mode::NoReboot,
        (Mode::Auto, false) if needs_reboot => Mode::Reboot,
        (Mode::Auto, false) => Mode::NoReboot,
        (Mode::NoReboot, false) if needs_reboot => {
            return Err(Status::invalid_argument(
                "configuration change requires a reboot, and it can't be applied without a reboot",
            ));
        }
        (m, _) => m,
    };
    if r.dry_run {
        return Ok(Applied {
            mode,
            details: format!(
                "Dry run summary:\nApplied configuration with mode {}; the config would change (simulated, no diff).",
                mode.as_str_name()
            ),
            after: After::Nothing,
        });
    }
    let n = &mut c.nodes[idx];
    #[allow(deprecated)]
    let applied = match mode {
        Mode::NoReboot | Mode::Auto => {
            n.config = r.data.clone();
            n.config_version += 1;
            n.try_apply = None;
            Applied {
                mode,
                details: "Applied configuration without a reboot".to_string(),
                after: After::Nothing,
            }
        }
        Mode::Staged => {
            n.staged = Some(r.data.clone());
            Applied {
                mode,
                details: "Staged configuration to be applied after a reboot".to_string(),
                after: After::Nothing,
            }
        }
        Mode::Try => {
            let previous = std::mem::replace(&mut n.config, r.data.clone());
            n.config_version += 1;
            let timeout = r
                .try_mode_timeout
                .map(|d| Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32))
                .filter(|d| !d.is_zero())
                .unwrap_or(Duration::from_secs(60));
            let generation = c.next_apply_generation();
            c.start_try(idx, generation, previous);
            Applied {
                mode,
                details: format!(
                    "Applied configuration in a try mode for {}s",
                    timeout.as_secs()
                ),
                after: After::Revert {
                    generation,
                    timeout,
                },
            }
        }
        Mode::Reboot => {
            n.config = r.data.clone();
            n.config_version += 1;
            let ticket = c.begin_reboot(idx);
            Applied {
                mode,
                details: "Applied configuration with a reboot".to_string(),
                after: After::Reboot(ticket),
            }
        }
    };
    // The applied config is live: Talos re-renders each static pod whose image changed from a
    // new version of its config resource, and the kubelet restarts the pod from it (the mirror
    // pod's `talos.dev/config-version` follows) unless `staleConfigVersion` holds it back.
    if c.nodes[idx].config == r.data {
        let changed = c.nodes[idx].bump_component_configs(old.as_ref());
        for comp in changed {
            let fired = c.fire(
                idx,
                Occasion::Call(Method::ApplyConfiguration),
                |e| matches!(e, Effect::StaleConfigVersion { component } if *component == comp),
            );
            if fired.is_none() {
                c.nodes[idx].restart_static_pod(&comp);
            }
        }
    }
    // `crashLoop`: a static pod whose image this apply changed crash-loops with its new image.
    if c.nodes[idx].config == r.data
        && let Some(old) = &old
    {
        let changed: Vec<(String, String)> = new
            .static_pod_images
            .iter()
            .filter(|(comp, img)| old.static_pod_images.get(*comp) != Some(*img))
            .map(|(comp, img)| (comp.clone(), img.clone()))
            .collect();
        for (comp, img) in changed {
            let fired = c.fire(
                idx,
                Occasion::Call(Method::ApplyConfiguration),
                |e| matches!(e, Effect::CrashLoop { component } if *component == comp),
            );
            if fired.is_some() {
                c.nodes[idx].crashing.insert(comp, img);
            }
        }
    }
    Ok(applied)
}

#[tonic::async_trait]
impl LifecycleService for Api {
    async fn upgrade(
        &self,
        req: Request<pb::LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<BoxStream<pb::LifecycleServiceUpgradeResponse>>, Status> {
        let idx = self.admit(&req, Method::Upgrade)?;
        let r = req.into_inner();
        let mut c = self.shared.lock();
        let host = c.nodes[idx].running.clone();
        if host < v(1, 13) {
            return Err(Status::unimplemented(
                "unknown service machine.LifecycleService",
            ));
        }
        let image = r.source.map(|s| s.image_name).unwrap_or_default();
        if image.is_empty() {
            return Err(Status::invalid_argument("source image name is required"));
        }
        if !c.nodes[idx].images.contains(&image) {
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
            crate::talos::types::image_tag(&image).and_then(|t| TalosVersion::parse(t).ok());
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
                c.install_entry(idx, t);
            }
        }
        Ok(stream_of(items))
    }
}

#[tonic::async_trait]
impl ImageService for Api {
    async fn pull(
        &self,
        req: Request<pb::ImageServicePullRequest>,
    ) -> Result<Response<BoxStream<pb::ImageServicePullResponse>>, Status> {
        let idx = self.admit(&req, Method::ImagePull)?;
        let r = req.into_inner();
        if self.shared.lock().nodes[idx].running < v(1, 13) {
            return Err(Status::unimplemented(
                "unknown service machine.ImageService",
            ));
        }
        if r.image_ref.is_empty() {
            return Err(Status::invalid_argument("image reference is required"));
        }
        let cri = r
            .containerd
            .as_ref()
            .is_some_and(|c| c.namespace == common::ContainerdNamespace::NsCri as i32);
        let delay = pull_delay(&self.shared, idx, &r.image_ref)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            // Headers go out at once; the layers "download" for `delay`.
            tokio::time::sleep(delay).await;
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
            shared.lock().nodes[idx].pulled(&r.image_ref, cri);
            let done = pb::ImageServicePullResponse {
                response: Some(pb::image_service_pull_response::Response::Name(r.image_ref)),
            };
            let _ = tx.send(Ok(done)).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

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
            if !c.nodes[idx].control_plane() {
                return Err(Status::failed_precondition(
                    "health check is only supported on control plane nodes",
                ));
            }
            let names: Vec<String> = c.nodes.iter().map(|n| n.spec.address.clone()).collect();
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

/// Where a COSI resource lives and who owns it.
struct ResMeta<'a> {
    namespace: &'a str,
    rtype: &'a str,
    id: &'a str,
    version: u64,
    owner: &'a str,
}

fn cosi_resource(
    m: ResMeta<'_>,
    started: i64,
    proto_spec: Vec<u8>,
    yaml_spec: String,
) -> cosi::Resource {
    cosi::Resource {
        metadata: Some(cosi::Metadata {
            namespace: m.namespace.to_string(),
            r#type: m.rtype.to_string(),
            id: m.id.to_string(),
            version: m.version.to_string(),
            owner: m.owner.to_string(),
            phase: "running".to_string(),
            created: Some(ts(started)),
            updated: Some(ts(started)),
            finalizers: vec![],
            labels: Default::default(),
            annotations: Default::default(),
        }),
        spec: Some(cosi::Spec {
            proto_spec,
            yaml_spec,
        }),
    }
}

fn yaml<T: serde::Serialize>(v: &T) -> String {
    serde_saphyr::to_string(v).unwrap_or_default()
}

/// All resources of `(namespace, type)` on node `idx`; `None` if the type is not served.
fn resources(c: &Cluster, idx: usize, namespace: &str, rtype: &str) -> Option<Vec<cosi::Resource>> {
    use prost::Message as _;
    let n = &c.nodes[idx];
    let started = c.started_unix;
    let facts = n.facts();
    let out = match (namespace, rtype) {
        ("config", "MachineConfigs.config.talos.dev") => {
            let mut v = vec![];
            for (id, bytes) in [
                ("v1alpha1", n.config.clone()),
                ("persistent", n.staged.clone().unwrap_or_else(|| n.config.clone())),
            ] {
                let spec = MachineConfigSpec {
                    yaml_marshalled: bytes.clone(),
                };
                v.push(cosi_resource(
                    ResMeta {
                        namespace: "config",
                        rtype,
                        id,
                        version: n.config_version,
                        owner: "",
                    },
                    started,
                    spec.encode_to_vec(),
                    yaml(&String::from_utf8_lossy(&bytes).into_owned()),
                ));
            }
            v
        }
        ("runtime", "MachineStatuses.runtime.talos.dev") => {
            let ready = c.machine_ready(idx);
            let (stage, unmet, text) = if ready {
                (
                    enums::RuntimeMachineStage::MachineStageRunning,
                    vec![],
                    "stage: running\nstatus:\n    ready: true\n    unmetConditions: []\n".to_string(),
                )
            } else {
                (
                    enums::RuntimeMachineStage::MachineStageBooting,
                    vec![runtime::UnmetCondition {
                        name: "staticPods".to_string(),
                        reason: "static pods are not ready yet".to_string(),
                    }],
                    "stage: booting\nstatus:\n    ready: false\n    unmetConditions:\n        - name: staticPods\n          reason: static pods are not ready yet\n".to_string(),
                )
            };
            let spec = runtime::MachineStatusSpec {
                stage: stage as i32,
                status: Some(runtime::MachineStatusStatus {
                    ready,
                    unmet_conditions: unmet,
                }),
            };
            vec![cosi_resource(
                    ResMeta {
                        namespace: "runtime",
                        rtype,
                        id: "machine",
                        version: n.counters.boots + 1,
                        owner: "runtime.MachineStatusController",
                    },
                    started,
                spec.encode_to_vec(),
                text,
            )]
        }
        ("k8s", "KubeletSpecs.kubernetes.talos.dev") => {
            let image = facts.as_ref().map(|f| f.kubelet_image.clone()).unwrap_or_default();
            let args = vec![
                format!("--hostname-override={}", n.spec.name),
                format!("--node-ip={}", n.spec.address),
                "--config=/etc/kubernetes/kubelet.yaml".to_string(),
            ];
            let spec = k8s::KubeletSpecSpec {
                image: image.clone(),
                args: args.clone(),
                extra_mounts: vec![],
                expected_nodename: n.spec.name.clone(),
                config: None,
                credential_provider_config: None,
            };
            vec![cosi_resource(
                    ResMeta {
                        namespace: "k8s",
                        rtype,
                        id: "kubelet",
                        version: n.config_version,
                        owner: "k8s.KubeletSpecController",
                    },
                    started,
                spec.encode_to_vec(),
                yaml(&serde_json::json!({"image": image, "args": args, "expectedNodename": n.spec.name})),
            )]
        }
        // The per-component config resources a control plane renders its static pods from;
        // `upgrade-k8s` waits for the mirror pod's `talos.dev/config-version` to equal their
        // version (siderolabs/talos `pkg/cluster/kubernetes/talos_managed.go`).
        (
            "controlplane",
            "APIServerConfigs.kubernetes.talos.dev"
            | "ControllerManagerConfigs.kubernetes.talos.dev"
            | "SchedulerConfigs.kubernetes.talos.dev",
        ) => {
            let component = match rtype {
                "APIServerConfigs.kubernetes.talos.dev" => "kube-apiserver",
                "ControllerManagerConfigs.kubernetes.talos.dev" => "kube-controller-manager",
                _ => "kube-scheduler",
            };
            let image = facts
                .as_ref()
                .and_then(|f| f.static_pod_images.get(component).cloned());
            match image {
                Some(image) if n.control_plane() => {
                    let proto = match component {
                        "kube-apiserver" => k8s::ApiServerConfigSpec {
                            image: image.clone(),
                            ..Default::default()
                        }
                        .encode_to_vec(),
                        "kube-controller-manager" => k8s::ControllerManagerConfigSpec {
                            enabled: true,
                            image: image.clone(),
                            ..Default::default()
                        }
                        .encode_to_vec(),
                        _ => k8s::SchedulerConfigSpec {
                            enabled: true,
                            image: image.clone(),
                            ..Default::default()
                        }
                        .encode_to_vec(),
                    };
                    vec![cosi_resource(
                        ResMeta {
                            namespace: "controlplane",
                            rtype,
                            id: component,
                            version: n.component_config_version(component),
                            owner: "k8s.ControlPlaneController",
                        },
                        started,
                        proto,
                        yaml(&serde_json::json!({ "image": image })),
                    )]
                }
                _ => vec![],
            }
        }
        ("k8s", "StaticPodStatuses.kubernetes.talos.dev") => facts
            .map(|f| f.static_pod_images)
            .unwrap_or_default()
            .into_iter()
            .map(|(component, image)| {
                let status = serde_json::json!({
                    "phase": "Running",
                    "conditions": [
                        {"type": "Initialized", "status": "True"},
                        {"type": "Ready", "status": "True"},
                        {"type": "ContainersReady", "status": "True"},
                        {"type": "PodScheduled", "status": "True"}
                    ],
                    "hostIP": n.spec.address,
                    "podIP": n.spec.address,
                    "containerStatuses": [{"name": component, "image": image, "ready": true, "restartCount": 0}]
                });
                let spec = k8s::StaticPodStatusSpec {
                    pod_status: status.as_object().map(pbstruct::to_struct),
                };
                cosi_resource(
                    ResMeta {
                        namespace: "k8s",
                        rtype,
                        id: &format!("kube-system/{component}-{}", n.spec.name),
                        version: n.config_version,
                        owner: "k8s.StaticPodStatusController",
                    },
                    started,
                    spec.encode_to_vec(),
                    yaml(&serde_json::json!({ "podStatus": status })),
                )
            })
            .collect(),
        ("k8s", "Nodenames.kubernetes.talos.dev") => {
            let spec = k8s::NodenameSpec {
                nodename: n.spec.name.clone(),
                hostname_version: "1".to_string(),
                skip_node_registration: false,
            };
            vec![cosi_resource(
                    ResMeta {
                        namespace: "k8s",
                        rtype,
                        id: "nodename",
                        version: 1,
                        owner: "k8s.NodenameController",
                    },
                    started,
                spec.encode_to_vec(),
                format!(
                    "nodename: {}\nhostnameVersion: \"1\"\nskipNodeRegistration: false\n",
                    n.spec.name
                ),
            )]
        }
        // The bootstrap manifests a control plane renders (what upgrade-k8s applies last):
        // kube-proxy and CoreDNS, at the version of the node's kube-apiserver image.
        ("controlplane", "Manifests.kubernetes.talos.dev") => {
            let Some(f) = facts.as_ref().filter(|f| f.machine_type != "worker") else {
                return Some(vec![]);
            };
            let version = f
                .static_pod_images
                .get("kube-apiserver")
                .and_then(|i| i.rsplit(':').next())
                .unwrap_or("v0.0.0")
                .to_string();
            let manifests = [
                (
                    "10-kube-proxy",
                    serde_json::json!({
                        "apiVersion": "apps/v1", "kind": "DaemonSet",
                        "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": {"k8s-app": "kube-proxy"}},
                        "spec": {"selector": {"matchLabels": {"k8s-app": "kube-proxy"}},
                                 "template": {"metadata": {"labels": {"k8s-app": "kube-proxy"}},
                                              "spec": {"containers": [{"name": "kube-proxy", "image": format!("registry.k8s.io/kube-proxy:{version}")}]}}}
                    }),
                ),
                (
                    "11-core-dns",
                    serde_json::json!([{
                        "apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": "coredns", "namespace": "kube-system"}
                    }, {
                        "apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "coredns", "namespace": "kube-system"},
                        "data": {"Corefile": ".:53 {\n    errors\n    health\n    kubernetes cluster.local in-addr.arpa ip6.arpa\n    forward . /etc/resolv.conf\n    cache 30\n}\n"}
                    }]),
                ),
            ];
            manifests
                .into_iter()
                .map(|(id, obj)| {
                    // one resource may carry several objects (`spec.items`)
                    let objs = match obj {
                        serde_json::Value::Array(v) => v,
                        o => vec![o],
                    };
                    let spec = k8s::ManifestSpec {
                        items: objs
                            .iter()
                            .map(|o| k8s::SingleManifest {
                                object: o.as_object().map(pbstruct::to_struct),
                            })
                            .collect(),
                    };
                    let obj = serde_json::Value::Array(objs);
                    cosi_resource(
                        ResMeta {
                            namespace: "controlplane",
                            rtype,
                            id,
                            version: n.config_version,
                            owner: "k8s.ManifestController",
                        },
                        started,
                        spec.encode_to_vec(),
                        yaml(&obj),
                    )
                })
                .collect()
        }
        ("runtime", "Services.v1alpha1.talos.dev") => c
            .services(idx)
            .into_iter()
            .map(|(id, healthy)| {
                let spec = v1alpha1::ServiceSpec {
                    running: true,
                    healthy,
                    unknown: false,
                };
                cosi_resource(
                    ResMeta {
                        namespace: "runtime",
                        rtype,
                        id,
                        version: 1,
                        owner: "",
                    },
                    started,
                    spec.encode_to_vec(),
                    format!("running: true\nhealthy: {healthy}\nunknown: false\n"),
                )
            })
            .collect(),
        _ => return None,
    };
    Some(out)
}

fn not_registered(namespace: &str, rtype: &str) -> Status {
    Status::not_found(format!(
        "resource type {rtype:?} is not registered in namespace {namespace:?}"
    ))
}

#[tonic::async_trait]
impl State for Api {
    async fn get(
        &self,
        req: Request<cosi::GetRequest>,
    ) -> Result<Response<cosi::GetResponse>, Status> {
        let idx = self.admit(&req, Method::CosiGet)?;
        let r = req.into_inner();
        let c = self.shared.lock();
        let all = resources(&c, idx, &r.namespace, &r.r#type)
            .ok_or_else(|| not_registered(&r.namespace, &r.r#type))?;
        let found = all
            .into_iter()
            .find(|res| res.metadata.as_ref().is_some_and(|m| m.id == r.id))
            .ok_or_else(|| {
                Status::not_found(format!(
                    "resource {}({}/{}) doesn't exist",
                    r.r#type, r.namespace, r.id
                ))
            })?;
        Ok(Response::new(cosi::GetResponse {
            resource: Some(found),
        }))
    }

    async fn list(
        &self,
        req: Request<cosi::ListRequest>,
    ) -> Result<Response<BoxStream<cosi::ListResponse>>, Status> {
        let idx = self.admit(&req, Method::CosiList)?;
        let r = req.into_inner();
        let c = self.shared.lock();
        let all = resources(&c, idx, &r.namespace, &r.r#type)
            .ok_or_else(|| not_registered(&r.namespace, &r.r#type))?;
        Ok(stream_of(
            all.into_iter()
                .map(|res| {
                    Ok(cosi::ListResponse {
                        resource: Some(res),
                    })
                })
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efivars_are_attributes_then_nul_terminated_utf16le() {
        assert_eq!(
            efivar(EFI_NV_BS_RT, "Ta"),
            [7, 0, 0, 0, b'T', 0, b'a', 0, 0, 0]
        );
    }

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
