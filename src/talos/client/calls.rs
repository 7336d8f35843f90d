//! The calls: [`TalosApi`] over [`TalosClient`] (Version, ServiceList, etcd, image pull,
//! Upgrade, Reboot, COSI reads, ApplyConfiguration, HealthCheck) and the client's own
//! public helpers (Lifecycle upgrade, legacy upgrade, COSI get/list, Read).

use std::path::Path;

use tonic::Code;

use super::TalosClient;
use super::convert::{
    bad_reply, check_metadata, containerd, containerd_namespace, cosi_resource, decode_spec, first,
    machine_stage, prost_duration, static_pod_status, system_containerd,
};
use crate::talos::api::TalosApi;
use crate::talos::proto::cosi::resource as cosi;
use crate::talos::proto::machine;
use crate::talos::proto::resource::config::MachineConfigSpec;
use crate::talos::proto::talos::resource::definitions::{k8s, runtime};
use crate::talos::retry::CallKind;
use crate::talos::snapshot::SnapshotWriter;
use crate::talos::types::*;
use crate::talos::{TalosError, pbstruct};
use crate::version::TalosVersion;

/// Lines of installer output kept in [`TalosError::UpgradeExit`].
const OUTPUT_TAIL: usize = 20;

impl TalosClient {
    /// `LifecycleService.Upgrade` (Talos ≥ 1.13) with an already pulled installer image; returns
    /// the installer output. Exposed for callers that sequence pull and upgrade themselves;
    /// [`TalosApi::upgrade`] picks the RPC from the running version.
    pub async fn lifecycle_upgrade(
        &self,
        node: &NodeTarget,
        image: &ImageRef,
    ) -> Result<Vec<String>, TalosError> {
        const OP: &str = "LifecycleService.Upgrade";
        let req = machine::LifecycleServiceUpgradeRequest {
            containerd: Some(system_containerd()),
            source: Some(machine::InstallArtifactsSource {
                image_name: image.to_string(),
            }),
        };
        let mut stream = self
            .open_stream(OP, node, CallKind::Mutating, req, |ch, r| async move {
                Self::lifecycle(ch).upgrade(r).await
            })
            .await?;
        let mut output = Vec::new();
        let mut exit_code = None;
        while let Some(msg) = self.next(OP, node, CallKind::Mutating, &mut stream).await? {
            use machine::lifecycle_service_install_progress::Response as P;
            match msg.progress.and_then(|p| p.response) {
                Some(P::Message(m)) => {
                    tracing::debug!(node = %node, line = %m, "installer");
                    output.push(m);
                }
                Some(P::ExitCode(c)) => exit_code = Some(c),
                None => {}
            }
        }
        match exit_code {
            Some(0) => Ok(output),
            Some(code) => {
                let skip = output.len().saturating_sub(OUTPUT_TAIL);
                Err(TalosError::UpgradeExit {
                    node: node.to_string(),
                    image: image.to_string(),
                    exit_code: code,
                    output: output.split_off(skip),
                })
            }
            None => Err(TalosError::Indeterminate {
                op: OP,
                node: node.to_string(),
                code: Code::Unknown,
                message: "the upgrade stream ended without an exit code".to_string(),
            }),
        }
    }

    /// Legacy `MachineService.Upgrade` (Talos < 1.13): `force`, `stage` and `preserve` false,
    /// so the node keeps its server-side etcd checks. Returns `(ack, actor_id)`.
    pub async fn legacy_upgrade(
        &self,
        node: &NodeTarget,
        image: &ImageRef,
    ) -> Result<(String, String), TalosError> {
        const OP: &str = "MachineService.Upgrade";
        #[allow(deprecated)]
        let req = machine::UpgradeRequest {
            image: image.to_string(),
            preserve: false,
            stage: false,
            force: false,
            reboot_mode: machine::upgrade_request::RebootMode::Default as i32,
        };
        // The node pulls and validates the installer before it answers.
        #[allow(deprecated)]
        let resp = self
            .unary_within(
                self.settings.pull_timeout,
                OP,
                node,
                CallKind::Mutating,
                req,
                |ch, r| async move { Self::machine(ch).upgrade(r).await },
            )
            .await?;
        let m = first(OP, node, resp.messages)?;
        check_metadata(OP, node, &m.metadata)?;
        Ok((m.ack, m.actor_id))
    }

    /// `ClusterService.HealthCheck`, calling `progress` with each line as it arrives.
    pub async fn health_check_with_progress(
        &self,
        node: &NodeTarget,
        spec: &HealthCheckSpec,
        mut progress: impl FnMut(&str) + Send,
    ) -> Result<HealthReport, TalosError> {
        const OP: &str = "ClusterService.HealthCheck";
        let req = crate::talos::proto::cluster::HealthCheckRequest {
            wait_timeout: Some(prost_duration(spec.wait_timeout)),
            cluster_info: Some(crate::talos::proto::cluster::ClusterInfo {
                control_plane_nodes: spec.control_plane_nodes.clone(),
                worker_nodes: spec.worker_nodes.clone(),
                force_endpoint: String::new(),
            }),
        };
        let mut stream = self
            .open_stream(OP, node, CallKind::ReadOnly, req, |ch, r| async move {
                Self::cluster(ch).health_check(r).await
            })
            .await?;
        let mut messages = Vec::new();
        loop {
            match self.next(OP, node, CallKind::ReadOnly, &mut stream).await {
                Ok(Some(m)) => {
                    check_metadata(OP, node, &m.metadata)?;
                    progress(&m.message);
                    messages.push(m.message);
                }
                Ok(None) => return Ok(HealthReport { messages }),
                Err(e) => {
                    let (code, message) = match &e {
                        TalosError::Rpc { code, message, .. } => (*code, message.clone()),
                        TalosError::Timeout { .. } => (Code::DeadlineExceeded, e.to_string()),
                        _ => return Err(e),
                    };
                    return Err(TalosError::HealthCheckFailed {
                        node: node.to_string(),
                        code,
                        message,
                        progress: messages,
                    });
                }
            }
        }
    }

    /// COSI `State.Get`.
    pub async fn cosi_get(
        &self,
        node: &NodeTarget,
        namespace: &str,
        resource_type: &str,
        id: &str,
    ) -> Result<CosiResource, TalosError> {
        const OP: &str = "cosi.resource.State.Get";
        let req = cosi::GetRequest {
            namespace: namespace.to_string(),
            r#type: resource_type.to_string(),
            id: id.to_string(),
            options: Some(cosi::GetOptions {}),
        };
        let resp = self
            .unary(OP, node, CallKind::ReadOnly, req, |ch, r| async move {
                Self::state(ch).get(r).await
            })
            .await?;
        let res = resp
            .resource
            .ok_or_else(|| bad_reply(OP, node, "no resource in the reply"))?;
        Ok(cosi_resource(res))
    }

    /// COSI `State.List` of one resource type in a namespace.
    pub async fn cosi_list(
        &self,
        node: &NodeTarget,
        namespace: &str,
        resource_type: &str,
    ) -> Result<Vec<CosiResource>, TalosError> {
        const OP: &str = "cosi.resource.State.List";
        let req = cosi::ListRequest {
            namespace: namespace.to_string(),
            r#type: resource_type.to_string(),
            options: Some(cosi::ListOptions::default()),
        };
        let mut stream = self
            .open_stream(OP, node, CallKind::ReadOnly, req, |ch, r| async move {
                Self::state(ch).list(r).await
            })
            .await?;
        let mut out = Vec::new();
        while let Some(m) = self.next(OP, node, CallKind::ReadOnly, &mut stream).await? {
            if let Some(r) = m.resource {
                out.push(cosi_resource(r));
            }
        }
        Ok(out)
    }

    /// `MachineService.Read` of a file, concatenated.
    pub async fn read_file(&self, node: &NodeTarget, path: &str) -> Result<Vec<u8>, TalosError> {
        const OP: &str = "MachineService.Read";
        let req = machine::ReadRequest {
            path: path.to_string(),
        };
        let mut stream = self
            .open_stream(OP, node, CallKind::ReadOnly, req, |ch, r| async move {
                Self::machine(ch).read(r).await
            })
            .await?;
        let mut out = Vec::new();
        while let Some(m) = self.next(OP, node, CallKind::ReadOnly, &mut stream).await? {
            check_metadata(OP, node, &m.metadata)?;
            out.extend_from_slice(&m.bytes);
        }
        Ok(out)
    }
}

impl TalosApi for TalosClient {
    async fn version(&self, node: &NodeTarget) -> Result<NodeVersion, TalosError> {
        const OP: &str = "MachineService.Version";
        let resp = self
            .unary(OP, node, CallKind::ReadOnly, (), |ch, r| async move {
                Self::machine(ch).version(r).await
            })
            .await?;
        let m = first(OP, node, resp.messages)?;
        check_metadata(OP, node, &m.metadata)?;
        let v = m
            .version
            .ok_or_else(|| bad_reply(OP, node, "no version info"))?;
        let tag = TalosVersion::parse(&v.tag)
            .map_err(|e| bad_reply(OP, node, format!("version tag `{}`: {e}", v.tag)))?;
        Ok(NodeVersion {
            node: node.clone(),
            tag,
            sha: v.sha,
            built: v.built,
            go_version: v.go_version,
            os: v.os,
            arch: v.arch,
            platform: m.platform.map(|p| p.name).unwrap_or_default(),
            rbac: m.features.is_some_and(|f| f.rbac),
        })
    }

    async fn services(&self, node: &NodeTarget) -> Result<Vec<ServiceHealth>, TalosError> {
        const OP: &str = "MachineService.ServiceList";
        let resp = self
            .unary(OP, node, CallKind::ReadOnly, (), |ch, r| async move {
                Self::machine(ch).service_list(r).await
            })
            .await?;
        let m = first(OP, node, resp.messages)?;
        check_metadata(OP, node, &m.metadata)?;
        let mut out: Vec<ServiceHealth> = m
            .services
            .into_iter()
            .map(|s| {
                let h = s.health.unwrap_or_default();
                let last_event = s
                    .events
                    .and_then(|e| e.events.into_iter().last())
                    .map(|e| e.msg);
                ServiceHealth {
                    id: s.id,
                    state: s.state,
                    health: if h.unknown {
                        Health::Unknown
                    } else if h.healthy {
                        Health::Healthy
                    } else {
                        Health::Unhealthy
                    },
                    last_message: h.last_message,
                    last_event,
                    last_change_unix: h.last_change.map(|t| t.seconds),
                }
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn etcd_members(&self, node: &NodeTarget) -> Result<Vec<EtcdMember>, TalosError> {
        const OP: &str = "MachineService.EtcdMemberList";
        let req = machine::EtcdMemberListRequest { query_local: false };
        let resp = self
            .unary(OP, node, CallKind::ReadOnly, req, |ch, r| async move {
                Self::machine(ch).etcd_member_list(r).await
            })
            .await?;
        let m = first(OP, node, resp.messages)?;
        check_metadata(OP, node, &m.metadata)?;
        Ok(m.members
            .into_iter()
            .map(|e| EtcdMember {
                id: e.id,
                hostname: e.hostname,
                peer_urls: e.peer_urls,
                client_urls: e.client_urls,
                is_learner: e.is_learner,
            })
            .collect())
    }

    async fn etcd_status(&self, node: &NodeTarget) -> Result<EtcdMemberStatus, TalosError> {
        const OP: &str = "MachineService.EtcdStatus";
        let resp = self
            .unary(OP, node, CallKind::ReadOnly, (), |ch, r| async move {
                Self::machine(ch).etcd_status(r).await
            })
            .await?;
        let m = first(OP, node, resp.messages)?;
        check_metadata(OP, node, &m.metadata)?;
        let s = m
            .member_status
            .ok_or_else(|| bad_reply(OP, node, "no member status"))?;
        Ok(EtcdMemberStatus {
            member_id: s.member_id,
            leader: s.leader,
            protocol_version: s.protocol_version,
            storage_version: s.storage_version,
            db_size: s.db_size,
            db_size_in_use: s.db_size_in_use,
            raft_index: s.raft_index,
            raft_term: s.raft_term,
            raft_applied_index: s.raft_applied_index,
            is_learner: s.is_learner,
            errors: s.errors,
        })
    }

    async fn etcd_alarms(&self, node: &NodeTarget) -> Result<Vec<EtcdAlarm>, TalosError> {
        const OP: &str = "MachineService.EtcdAlarmList";
        let resp = self
            .unary(OP, node, CallKind::ReadOnly, (), |ch, r| async move {
                Self::machine(ch).etcd_alarm_list(r).await
            })
            .await?;
        let m = first(OP, node, resp.messages)?;
        check_metadata(OP, node, &m.metadata)?;
        let mut alarms: Vec<EtcdAlarm> = m
            .member_alarms
            .into_iter()
            .filter(|a| a.alarm != 0)
            .map(|a| EtcdAlarm {
                member_id: a.member_id,
                alarm: machine::etcd_member_alarm::AlarmType::try_from(a.alarm)
                    .map(|t| t.as_str_name().to_string())
                    .unwrap_or_else(|_| format!("ALARM_{}", a.alarm)),
            })
            .collect();
        alarms.sort();
        Ok(alarms)
    }

    async fn etcd_snapshot(
        &self,
        node: &NodeTarget,
        dest: &Path,
    ) -> Result<SnapshotInfo, TalosError> {
        const OP: &str = "MachineService.EtcdSnapshot";
        let mut writer = SnapshotWriter::create(dest).await?;
        let opened = self
            .open_stream(
                OP,
                node,
                CallKind::ReadOnly,
                machine::EtcdSnapshotRequest {},
                |ch, r| async move { Self::machine(ch).etcd_snapshot(r).await },
            )
            .await;
        let mut stream = match opened {
            Ok(s) => s,
            Err(e) => {
                writer.abort().await;
                return Err(e);
            }
        };
        loop {
            match self.next(OP, node, CallKind::ReadOnly, &mut stream).await {
                Ok(Some(m)) => {
                    if let Err(e) = check_metadata(OP, node, &m.metadata) {
                        writer.abort().await;
                        return Err(e);
                    }
                    if let Err(e) = writer.write(&m.bytes).await {
                        writer.abort().await;
                        return Err(e);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    writer.abort().await;
                    return Err(e);
                }
            }
        }
        writer.finish(node.as_str()).await
    }

    async fn etcd_snapshot_stream(
        &self,
        node: &NodeTarget,
        chunks: tokio::sync::mpsc::Sender<Vec<u8>>,
    ) -> Result<StreamedSnapshot, TalosError> {
        const OP: &str = "MachineService.EtcdSnapshot";
        let mut stream = self
            .open_stream(
                OP,
                node,
                CallKind::ReadOnly,
                machine::EtcdSnapshotRequest {},
                |ch, r| async move { Self::machine(ch).etcd_snapshot(r).await },
            )
            .await?;
        let mut check = crate::talos::snapshot::TrailerCheck::default();
        while let Some(m) = self.next(OP, node, CallKind::ReadOnly, &mut stream).await? {
            check_metadata(OP, node, &m.metadata)?;
            check.update(&m.bytes);
            if chunks.send(m.bytes).await.is_err() {
                return Err(TalosError::SnapshotIo {
                    path: std::path::PathBuf::from("<backup stream>"),
                    err: std::io::Error::new(
                        std::io::ErrorKind::BrokenPipe,
                        "the consumer of the snapshot stream stopped",
                    ),
                });
            }
        }
        let (size, sha256) = check
            .finish()
            .map_err(|reason| TalosError::SnapshotCorrupt {
                node: node.as_str().to_string(),
                reason,
            })?;
        Ok(StreamedSnapshot { size, sha256 })
    }

    async fn pull_image_into(
        &self,
        node: &NodeTarget,
        image: &ImageRef,
        namespace: PullNamespace,
    ) -> Result<PulledImage, TalosError> {
        const OP: &str = "ImageService.Pull";
        let req = machine::ImageServicePullRequest {
            containerd: Some(containerd(namespace)),
            image_ref: image.to_string(),
        };
        // Pulling the same reference again is a no-op on the node: safe to retry.
        let opened = self
            .open_stream(OP, node, CallKind::ReadOnly, req, |ch, r| async move {
                Self::images(ch).pull(r).await
            })
            .await;
        let mut stream = match opened {
            Ok(s) => s,
            Err(e) if e.code() == Some(Code::Unimplemented) => {
                const LEGACY: &str = "MachineService.ImagePull";
                #[allow(deprecated)]
                let req = machine::ImagePullRequest {
                    namespace: containerd_namespace(namespace) as i32,
                    reference: image.to_string(),
                };
                #[allow(deprecated)]
                let resp = self
                    .unary_within(
                        self.settings.pull_timeout,
                        LEGACY,
                        node,
                        CallKind::ReadOnly,
                        req,
                        |ch, r| async move { Self::machine(ch).image_pull(r).await },
                    )
                    .await?;
                let m = first(LEGACY, node, resp.messages)?;
                check_metadata(LEGACY, node, &m.metadata)?;
                return Ok(PulledImage {
                    name: image.to_string(),
                    legacy: true,
                });
            }
            Err(e) => return Err(e),
        };
        let mut name = None;
        while let Some(m) = self.next(OP, node, CallKind::ReadOnly, &mut stream).await? {
            use machine::image_service_pull_response::Response as R;
            if let Some(R::Name(n)) = m.response {
                name = Some(n);
            }
        }
        let name = name
            .ok_or_else(|| bad_reply(OP, node, "the pull stream ended without the image name"))?;
        Ok(PulledImage {
            name,
            legacy: false,
        })
    }

    async fn upgrade(
        &self,
        node: &NodeTarget,
        image: &ImageRef,
    ) -> Result<UpgradeOutcome, TalosError> {
        let from = self.version(node).await?.tag;
        match UpgradeRpc::for_running(&from) {
            UpgradeRpc::Lifecycle => {
                self.pull_image(node, image).await?;
                let output = self.lifecycle_upgrade(node, image).await?;
                Ok(UpgradeOutcome::Installed { from, output })
            }
            UpgradeRpc::Legacy => {
                let (ack, actor_id) = self.legacy_upgrade(node, image).await?;
                Ok(UpgradeOutcome::Rebooting {
                    from,
                    ack,
                    actor_id,
                })
            }
        }
    }

    async fn etcd_forfeit_leadership(
        &self,
        node: &NodeTarget,
    ) -> Result<Option<String>, TalosError> {
        const OP: &str = "MachineService.EtcdForfeitLeadership";
        let resp = self
            .unary(
                OP,
                node,
                CallKind::Mutating,
                machine::EtcdForfeitLeadershipRequest {},
                |ch, r| async move { Self::machine(ch).etcd_forfeit_leadership(r).await },
            )
            .await?;
        let m = first(OP, node, resp.messages)?;
        check_metadata(OP, node, &m.metadata)?;
        Ok(Some(m.member).filter(|m| !m.is_empty()))
    }

    async fn reboot(&self, node: &NodeTarget) -> Result<RebootAck, TalosError> {
        const OP: &str = "MachineService.Reboot";
        let req = machine::RebootRequest {
            mode: machine::reboot_request::Mode::Default as i32,
        };
        let resp = self
            .unary(OP, node, CallKind::Mutating, req, |ch, r| async move {
                Self::machine(ch).reboot(r).await
            })
            .await?;
        let m = first(OP, node, resp.messages)?;
        check_metadata(OP, node, &m.metadata)?;
        Ok(RebootAck {
            actor_id: m.actor_id,
        })
    }

    async fn rollback(&self, node: &NodeTarget) -> Result<(), TalosError> {
        const OP: &str = "MachineService.Rollback";
        let resp = self
            .unary(
                OP,
                node,
                CallKind::Mutating,
                machine::RollbackRequest {},
                |ch, r| async move { Self::machine(ch).rollback(r).await },
            )
            .await?;
        let m = first(OP, node, resp.messages)?;
        check_metadata(OP, node, &m.metadata)?;
        Ok(())
    }

    async fn boot_id(&self, node: &NodeTarget) -> Result<BootId, TalosError> {
        let bytes = self
            .read_file(node, "/proc/sys/kernel/random/boot_id")
            .await?;
        let id = String::from_utf8_lossy(&bytes).trim().to_string();
        if id.is_empty() {
            return Err(bad_reply("MachineService.Read", node, "empty boot_id"));
        }
        Ok(BootId(id))
    }

    async fn machine_config(&self, node: &NodeTarget) -> Result<MachineConfig, TalosError> {
        const OP: &str = "cosi.resource.State.Get";
        let r = self
            .cosi_get(
                node,
                "config",
                "MachineConfigs.config.talos.dev",
                "v1alpha1",
            )
            .await?;
        let spec: MachineConfigSpec = decode_spec(OP, node, &r)?;
        let mut mc = MachineConfig::from_yaml(spec.yaml_marshalled);
        mc.resource_version = Some(r.version.clone());
        Ok(mc)
    }

    async fn static_pod_statuses(
        &self,
        node: &NodeTarget,
    ) -> Result<Vec<StaticPodStatus>, TalosError> {
        const OP: &str = "cosi.resource.State.List";
        let list = self
            .cosi_list(node, "k8s", "StaticPodStatuses.kubernetes.talos.dev")
            .await?;
        let mut out = Vec::new();
        for r in list {
            let spec: k8s::StaticPodStatusSpec = decode_spec(OP, node, &r)?;
            let json = spec
                .pod_status
                .as_ref()
                .map(pbstruct::from_struct)
                .unwrap_or(serde_json::Value::Null);
            out.push(static_pod_status(r.id.clone(), &json));
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn kubelet_spec(&self, node: &NodeTarget) -> Result<KubeletSpec, TalosError> {
        const OP: &str = "cosi.resource.State.Get";
        let r = self
            .cosi_get(node, "k8s", "KubeletSpecs.kubernetes.talos.dev", "kubelet")
            .await?;
        let spec: k8s::KubeletSpecSpec = decode_spec(OP, node, &r)?;
        Ok(KubeletSpec {
            image: spec.image,
            args: spec.args,
            expected_nodename: spec.expected_nodename,
        })
    }

    async fn machine_status(&self, node: &NodeTarget) -> Result<MachineStatus, TalosError> {
        const OP: &str = "cosi.resource.State.Get";
        let r = self
            .cosi_get(
                node,
                "runtime",
                "MachineStatuses.runtime.talos.dev",
                "machine",
            )
            .await?;
        let spec: runtime::MachineStatusSpec = decode_spec(OP, node, &r)?;
        let status = spec.status.unwrap_or_default();
        Ok(MachineStatus {
            stage: machine_stage(spec.stage),
            ready: status.ready,
            unmet_conditions: status
                .unmet_conditions
                .into_iter()
                .map(|c| (c.name, c.reason))
                .collect(),
        })
    }

    async fn security_state(&self, node: &NodeTarget) -> Result<SecurityState, TalosError> {
        const OP: &str = "cosi.resource.State.Get";
        let r = self
            .cosi_get(node, "runtime", "SecurityStates.talos.dev", "securitystate")
            .await?;
        let spec: runtime::SecurityStateSpec = decode_spec(OP, node, &r)?;
        Ok(SecurityState {
            secure_boot: spec.secure_boot,
        })
    }

    async fn image_factory_schematic(
        &self,
        node: &NodeTarget,
    ) -> Result<Option<FactorySchematic>, TalosError> {
        const OP: &str = "cosi.resource.State.Get";
        let r = match self
            .cosi_get(
                node,
                "runtime",
                "ImageFactorySchematics.runtime.talos.dev",
                "image-factory-schematic",
            )
            .await
        {
            Ok(r) => r,
            Err(e) if e.code() == Some(tonic::Code::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        let spec: runtime::ImageFactorySchematicSpec = decode_spec(OP, node, &r)?;
        Ok(Some(FactorySchematic {
            schematic_id: spec.schematic_id,
            flavor: spec.flavor,
            api_url: spec.apiurl,
        }))
    }

    async fn apply_configuration(
        &self,
        node: &NodeTarget,
        config: &MachineConfig,
        options: ApplyOptions,
    ) -> Result<ApplyOutcome, TalosError> {
        const OP: &str = "MachineService.ApplyConfiguration";
        use machine::apply_configuration_request::Mode;
        let (mode, try_timeout) = match options.mode {
            ApplyMode::NoReboot => (Mode::NoReboot, None),
            ApplyMode::Auto => (Mode::Auto, None),
            ApplyMode::Staged => (Mode::Staged, None),
            ApplyMode::Try { timeout } => (Mode::Try, Some(prost_duration(timeout))),
        };
        let req = machine::ApplyConfigurationRequest {
            data: config.yaml().expose().clone(),
            mode: mode as i32,
            dry_run: options.dry_run,
            try_mode_timeout: try_timeout,
        };
        let kind = if options.dry_run {
            CallKind::ReadOnly
        } else {
            CallKind::Mutating
        };
        let resp = self
            .unary(OP, node, kind, req, |ch, r| async move {
                Self::machine(ch).apply_configuration(r).await
            })
            .await?;
        let m = first(OP, node, resp.messages)?;
        check_metadata(OP, node, &m.metadata)?;
        #[allow(deprecated)]
        let mode = match Mode::try_from(m.mode) {
            Ok(Mode::Reboot) => AppliedMode::Reboot,
            Ok(Mode::Auto) => AppliedMode::Auto,
            Ok(Mode::NoReboot) => AppliedMode::NoReboot,
            Ok(Mode::Staged) => AppliedMode::Staged,
            Ok(Mode::Try) => AppliedMode::Try,
            Err(_) => {
                return Err(bad_reply(
                    OP,
                    node,
                    format!("unknown apply mode {}", m.mode),
                ));
            }
        };
        Ok(ApplyOutcome {
            mode,
            warnings: m.warnings,
            details: m.mode_details,
        })
    }

    async fn health_check(
        &self,
        node: &NodeTarget,
        spec: &HealthCheckSpec,
    ) -> Result<HealthReport, TalosError> {
        self.health_check_with_progress(node, spec, |_| {}).await
    }
}
