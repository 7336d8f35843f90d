//! `machine.MachineService`: Version, ServiceList, the etcd RPCs (member list, status,
//! snapshot), Read (efivarfs), Reboot, Upgrade, ImagePull and ApplyConfiguration with its
//! version-dependent modes.

use std::time::Duration;

use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::{Api, meta, pull_delay, schedule_boot, stream_of, ts, upgradeable, v};
use crate::sim::etcd;
use crate::sim::talos::fault::{Effect, Method, Occasion};
use crate::sim::talos::machineconfig;
use crate::sim::talos::model::{Power, RebootTicket, SimNode, TalosSide};
use crate::talos::proto::common;
use crate::talos::proto::machine::{self as pb, machine_service_server::MachineService};
use crate::talos::snapshot::with_trailer;
use crate::version::TalosVersion;

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

/// A member's database size unless a `largeSnapshot` fault says otherwise (free pages pad a
/// smaller keyspace to it; a larger one is as large as it needs).
const SNAPSHOT_DB_SIZE: usize = 64 * 1024;
/// The simulated cluster's raft term: one election, at bootstrap.
const RAFT_TERM: u64 = 2;

/// The raft index a member applied last: it moves with each config change and boot.
/// META's `Upgrade` tag (the fallback label the installer writes; `pkg/machinery/meta`).
pub(crate) const META_UPGRADE: u8 = 0x06;

/// A META key a `MetaWrite`/`MetaDelete` on a node running `running` may touch: a uint8, and
/// not one Talos owns on a Talos that protects them (`meta.IsAPIWriteable`, PR #14192, in
/// 1.13.10 and 1.14.0). Only the `Upgrade` tag is modelled as Talos-owned.
fn meta_key(running: &TalosVersion, key: u32) -> Result<u8, Status> {
    let k = u8::try_from(key).map_err(|_| Status::invalid_argument("key must be a uint8"))?;
    let protects = running >= &TalosVersion::new(1, 14, 0)
        || (running.minor_line() == (1, 13) && running >= &TalosVersion::new(1, 13, 10));
    if protects && k == META_UPGRADE {
        return Err(Status::permission_denied(
            "meta key is not writeable via the API",
        ));
    }
    Ok(k)
}

fn raft_index(n: &SimNode) -> u64 {
    1000 + n.config_version + n.counters.boots * 100
}
const SNAPSHOT_CHUNK: usize = 16 * 1024;

#[tonic::async_trait]
impl MachineService for Api {
    async fn version(&self, req: Request<()>) -> Result<Response<pb::VersionResponse>, Status> {
        let idx = self.admit(&req, Method::Version)?;
        let c = self.shared.lock();
        let n = &c.nodes()[idx];
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
                    name: n
                        .spec
                        .platform
                        .clone()
                        .unwrap_or_else(|| "metal".to_string()),
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
        Self::require_control_plane(&c, idx, "member list")?;
        let local = req.get_ref().query_local;
        let members = c
            .etcd_members()
            .into_iter()
            .filter(|n| !local || n.spec.name == c.nodes()[idx].spec.name)
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

    async fn etcd_alarm_list(
        &self,
        req: Request<()>,
    ) -> Result<Response<pb::EtcdAlarmListResponse>, Status> {
        let idx = self.admit(&req, Method::EtcdAlarmList)?;
        let c = self.shared.lock();
        Self::require_control_plane(&c, idx, "etcd alarm list")?;
        // etcd's alarm list is cluster-wide (raft-replicated): every member answers the same
        Ok(Response::new(pb::EtcdAlarmListResponse {
            messages: vec![pb::EtcdAlarm {
                metadata: meta(),
                member_alarms: c
                    .etcd_alarms
                    .iter()
                    .map(|(member_id, alarm)| pb::EtcdMemberAlarm {
                        member_id: *member_id,
                        alarm: *alarm as i32,
                    })
                    .collect(),
            }],
        }))
    }

    async fn etcd_status(
        &self,
        req: Request<()>,
    ) -> Result<Response<pb::EtcdStatusResponse>, Status> {
        let idx = self.admit(&req, Method::EtcdStatus)?;
        let c = self.shared.lock();
        Self::require_control_plane(&c, idx, "etcd status")?;
        let n = &c.nodes()[idx];
        let errors = if n.etcd_healthy {
            vec![]
        } else {
            vec!["etcdserver: request timed out".to_string()]
        };
        let raft = raft_index(n);
        let (storage_version, server_version) = etcd::etcd_of(&n.running);
        Ok(Response::new(pb::EtcdStatusResponse {
            messages: vec![pb::EtcdStatus {
                metadata: meta(),
                member_status: Some(pb::EtcdMemberStatus {
                    storage_version: storage_version.to_string(),
                    member_id: n.member_id,
                    protocol_version: server_version.to_string(),
                    db_size: SNAPSHOT_DB_SIZE as i64,
                    db_size_in_use: (SNAPSHOT_DB_SIZE / 2) as i64,
                    leader: c.etcd_leader(),
                    raft_index: raft,
                    // a new term at every leader change
                    raft_term: RAFT_TERM + c.etcd.elections,
                    raft_applied_index: raft,
                    errors,
                    is_learner: false,
                }),
            }],
        }))
    }

    async fn etcd_forfeit_leadership(
        &self,
        req: Request<pb::EtcdForfeitLeadershipRequest>,
    ) -> Result<Response<pb::EtcdForfeitLeadershipResponse>, Status> {
        let idx = self.admit(&req, Method::EtcdForfeitLeadership)?;
        let mut c = self.shared.lock();
        Self::require_control_plane(&c, idx, "etcd forfeit leadership")?;
        let member = c.forfeit_leadership(idx)?;
        Ok(Response::new(pb::EtcdForfeitLeadershipResponse {
            messages: vec![pb::EtcdForfeitLeadership {
                metadata: meta(),
                member,
            }],
        }))
    }

    async fn etcd_snapshot(
        &self,
        req: Request<pb::EtcdSnapshotRequest>,
    ) -> Result<Response<BoxStream<common::Data>>, Status> {
        let idx = self.admit(&req, Method::EtcdSnapshot)?;
        // What etcd holds: read before the Talos side is locked (the kube side reads the Talos
        // side under its own lock).
        let keyspace = self.shared.keyspace();
        let mut c = self.shared.lock();
        Self::require_control_plane(&c, idx, "etcd snapshot")?;
        let brk = c.fire(idx, Occasion::Call(Method::EtcdSnapshot), |e| {
            matches!(e, Effect::SnapshotBreak { .. })
        });
        let size = match c.fire(idx, Occasion::Call(Method::EtcdSnapshot), |e| {
            matches!(e, Effect::LargeSnapshot { .. })
        }) {
            Some(Effect::LargeSnapshot { db_bytes }) => {
                usize::try_from(db_bytes).unwrap_or(SNAPSHOT_DB_SIZE)
            }
            _ => SNAPSHOT_DB_SIZE,
        };
        let members: Vec<etcd::Member> = c
            .etcd_members()
            .into_iter()
            .map(|m| etcd::Member {
                id: m.member_id,
                name: m.spec.name.clone(),
                address: m.spec.address.clone(),
            })
            .collect();
        let consistent_index = raft_index(&c.nodes()[idx]);
        let (storage_version, _) = etcd::etcd_of(&c.nodes()[idx].running);
        let cluster_version = c
            .etcd_members()
            .into_iter()
            .map(|m| etcd::etcd_of(&m.running).0)
            .min()
            .unwrap_or(storage_version);
        drop(c);
        // The member's bbolt database (etcd's `Maintenance.Snapshot` streams `Tx.WriteTo`),
        // padded with free pages to the member's database size, then etcd's sha256 trailer.
        let db = etcd::database(
            &etcd::MemberDb {
                keyspace: &keyspace,
                members: &members,
                consistent_index,
                term: RAFT_TERM,
                storage_version,
                cluster_version,
            },
            size,
        )
        .map_err(|e| Status::internal(format!("failed to snapshot the etcd database: {e}")))?;
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
        let n = &c.nodes()[idx];
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

    /// Upstream: flip the boot default to the other slot, answer at once, then reboot
    /// gracefully (no cordon, no drain); see `TalosSide::revert_boot_entry`.
    async fn rollback(
        &self,
        req: Request<pb::RollbackRequest>,
    ) -> Result<Response<pb::RollbackResponse>, Status> {
        let idx = self.admit(&req, Method::Rollback)?;
        let mut c = self.shared.lock();
        c.revert_boot_entry(idx)?;
        let ticket = c.begin_reboot(idx);
        let timing = c.timing.reboot;
        drop(c);
        schedule_boot(&self.shared, ticket, timing);
        Ok(Response::new(pb::RollbackResponse {
            messages: vec![pb::Rollback { metadata: meta() }],
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
        // pulled and validated before anything else (`PullAndValidateInstallerImage`)
        if let Err(why) = c.registry.lookup(&r.image) {
            return Err(crate::sim::talos::registry::legacy_upgrade_not_found(
                &r.image, &why,
            ));
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
        let target = crate::sim::reference::tag_of(&r.image)
            .and_then(|t| TalosVersion::parse(t).ok())
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "installer image {:?} has no Talos version tag",
                    r.image
                ))
            })?;
        if !upgradeable(&c.nodes()[idx].running, &target) {
            return Err(Status::failed_precondition(format!(
                "upgrade from {} to {target} is not supported",
                c.nodes()[idx].running
            )));
        }
        // Without `force` (or `preserve`) a control plane checks etcd first (ValidateForUpgrade).
        if c.nodes()[idx].control_plane()
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
        c.node_mut(idx).images.insert(r.image.clone());
        c.install_entry(idx, target, &r.image)
            .map_err(|e| Status::internal(format!("failed to run installer: {e}")))?;
        let actor_id = c.next_actor_id(idx);
        // The upgrade sequence drains the node first, server-side, whatever the client drained
        // or skipped (`v1alpha1_sequencer.go` `Upgrade`: phase `drain`, `CordonAndDrainNode`;
        // `pkg/kubernetes/kubernetes.go` `Client.Drain`); a staged upgrade only reboots
        // (`StageUpgrade` has no drain phase). The kube side evicts at its next pass.
        if !r.stage {
            c.begin_server_drain(idx);
        }
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

    /// Upstream (`v1alpha1_server.go` `MetaWrite`, talos PR #14192): a key Talos owns (the
    /// `Upgrade` fallback tag, 0x06) is refused with `PermissionDenied` from 1.13.10/1.14.0 on;
    /// other keys are stored. medea never writes META.
    async fn meta_write(
        &self,
        req: Request<pb::MetaWriteRequest>,
    ) -> Result<Response<pb::MetaWriteResponse>, Status> {
        let idx = self.admit(&req, Method::MetaWrite)?;
        let r = req.into_inner();
        let mut c = self.shared.lock();
        let key = meta_key(&c.nodes()[idx].running, r.key)?;
        c.node_mut(idx).meta.insert(key, r.value);
        Ok(Response::new(pb::MetaWriteResponse {
            messages: vec![pb::MetaWrite { metadata: meta() }],
        }))
    }

    /// As [`Self::meta_write`]; a key that is not there answers `NotFound`.
    async fn meta_delete(
        &self,
        req: Request<pb::MetaDeleteRequest>,
    ) -> Result<Response<pb::MetaDeleteResponse>, Status> {
        let idx = self.admit(&req, Method::MetaDelete)?;
        let r = req.into_inner();
        let mut c = self.shared.lock();
        let key = meta_key(&c.nodes()[idx].running, r.key)?;
        if c.node_mut(idx).meta.remove(&key).is_none() {
            return Err(Status::not_found("meta key not found"));
        }
        Ok(Response::new(pb::MetaDeleteResponse {
            messages: vec![pb::MetaDelete { metadata: meta() }],
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
        if let Err(why) = self.shared.lock().registry.lookup(&image) {
            return Err(crate::sim::talos::registry::pull_not_found(&why));
        }
        let cri = r.namespace == common::ContainerdNamespace::NsCri as i32;
        let delay = pull_delay(&self.shared, idx, &image)?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.shared.lock().node_mut(idx).pulled(&image, cri);
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

pub(super) enum After {
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
    c: &mut TalosSide,
    idx: usize,
    r: &pb::ApplyConfigurationRequest,
) -> Result<Applied, Status> {
    use pb::apply_configuration_request::Mode;
    let modern = c.nodes()[idx].running >= v(1, 14);
    let new = machineconfig::facts(&r.data).map_err(|e| Status::invalid_argument(e.to_string()))?;
    let old = c.nodes()[idx].facts();
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
    let n = c.node_mut(idx);
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
    if c.nodes()[idx].config == r.data {
        let changed = c.node_mut(idx).bump_component_configs(old.as_ref());
        for comp in changed {
            let fired = c.fire(
                idx,
                Occasion::Call(Method::ApplyConfiguration),
                |e| matches!(e, Effect::StaleConfigVersion { component } if *component == comp),
            );
            if fired.is_none() {
                c.node_mut(idx).restart_static_pod(&comp);
            }
        }
    }
    // `crashLoop`: a static pod whose image this apply changed crash-loops with its new image.
    if c.nodes()[idx].config == r.data
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
                c.node_mut(idx).crashing.insert(comp, img);
            }
        }
    }
    Ok(applied)
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

    /// talos PR #14192: the `Upgrade` tag cannot be written or deleted through the API from
    /// 1.13.10 and 1.14.0; before, and for other keys, it can.
    #[test]
    fn the_upgrade_meta_key_is_refused_from_1_13_10_and_1_14() {
        let t = |s: &str| TalosVersion::parse(s).unwrap();
        for v in ["v1.13.10", "v1.14.0", "v1.14.6"] {
            let e = meta_key(&t(v), META_UPGRADE.into()).unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{v}");
            assert_eq!(e.message(), "meta key is not writeable via the API");
            assert_eq!(meta_key(&t(v), 0x0a).unwrap(), 0x0a, "{v}: a user key");
        }
        for v in ["v1.13.9", "v1.12.12"] {
            assert_eq!(meta_key(&t(v), META_UPGRADE.into()).unwrap(), META_UPGRADE);
        }
        assert_eq!(
            meta_key(&t("v1.14.6"), 0x100).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
