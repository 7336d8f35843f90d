//! [`TalosClient`]: the real Talos machine API client (tonic over rustls, mutual TLS).
//!
//! One gRPC channel per talosconfig endpoint (connected lazily, ALPN `h2`, TLS server name =
//! endpoint host, trust = the talosconfig CA only, client certificate from the talosconfig).
//! Requests go to the current endpoint and move to the next one when a connection attempt
//! fails. Each request carries the single-valued `node` metadata key; apid routes it to that
//! node. Message limits are Talos' 32 MiB both ways.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Request, Response, Status, Streaming};

use super::api::TalosApi;
use super::config::{Endpoint, TalosConfig, TalosContext};
use super::proto::cluster::cluster_service_client::ClusterServiceClient;
use super::proto::common;
use super::proto::cosi::resource as cosi;
use super::proto::cosi::resource::state_client::StateClient;
use super::proto::machine;
use super::proto::machine::image_service_client::ImageServiceClient;
use super::proto::machine::lifecycle_service_client::LifecycleServiceClient;
use super::proto::machine::machine_service_client::MachineServiceClient;
use super::proto::resource::config::MachineConfigSpec;
use super::proto::talos::resource::definitions::{enums, k8s, runtime};
use super::retry::{self, Attempt, CallKind, RetryPolicy};
use super::snapshot::SnapshotWriter;
use super::types::*;
use super::{NODE_METADATA_KEY, TalosError, pbstruct};
use crate::version::TalosVersion;

/// Timeouts and retries of a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSettings {
    /// TCP + TLS connect timeout per attempt.
    pub connect_timeout: Duration,
    /// Deadline of a unary call (and of opening a stream).
    pub request_timeout: Duration,
    /// Deadline of the unary calls that pull an image before answering (legacy
    /// `MachineService.Upgrade` and `MachineService.ImagePull`).
    pub pull_timeout: Duration,
    /// Longest silence tolerated between two messages of a stream.
    pub stream_idle_timeout: Duration,
    /// Backoff for retried calls (see [`retry`](super::retry) for what is retried).
    pub retry: RetryPolicy,
}

impl Default for ClientSettings {
    fn default() -> Self {
        ClientSettings {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            pull_timeout: Duration::from_secs(15 * 60),
            stream_idle_timeout: Duration::from_secs(300),
            retry: RetryPolicy::default(),
        }
    }
}

/// The containerd instance `talosctl upgrade` pulls the installer into (`--namespace system`).
fn system_containerd() -> common::ContainerdInstance {
    containerd(PullNamespace::System)
}

fn containerd_namespace(ns: PullNamespace) -> common::ContainerdNamespace {
    match ns {
        PullNamespace::System => common::ContainerdNamespace::NsSystem,
        PullNamespace::Cri => common::ContainerdNamespace::NsCri,
    }
}

fn containerd(ns: PullNamespace) -> common::ContainerdInstance {
    common::ContainerdInstance {
        driver: common::ContainerDriver::Cri as i32,
        namespace: containerd_namespace(ns) as i32,
    }
}

/// Talos' 32 MiB message limit, both ways, on a generated client or server.
macro_rules! with_limits {
    ($svc:expr) => {
        $svc.max_decoding_message_size($crate::talos::MAX_MESSAGE_SIZE)
            .max_encoding_message_size($crate::talos::MAX_MESSAGE_SIZE)
    };
}
pub(crate) use with_limits;

/// Lines of installer output kept in [`TalosError::UpgradeExit`].
const OUTPUT_TAIL: usize = 20;

/// A Talos machine API client for one talosconfig context.
pub struct TalosClient {
    channels: Vec<(Endpoint, Channel)>,
    current: AtomicUsize,
    settings: ClientSettings,
}

impl std::fmt::Debug for TalosClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TalosClient")
            .field(
                "endpoints",
                &self.channels.iter().map(|(e, _)| e).collect::<Vec<_>>(),
            )
            .field("settings", &self.settings)
            .finish()
    }
}

impl TalosClient {
    /// Build a client for a decoded context. No connection is made until the first call.
    /// Must be called within a tokio runtime (the lazy channels spawn their workers on it).
    pub fn new(ctx: &TalosContext, settings: ClientSettings) -> Result<TalosClient, TalosError> {
        let identity = Identity::from_pem(ctx.crt_pem.as_bytes(), ctx.key.pem().expose());
        let ca = Certificate::from_pem(ctx.ca_pem.as_bytes());
        let mut channels = Vec::new();
        for ep in &ctx.endpoints {
            let tls = ClientTlsConfig::new()
                .domain_name(ep.host())
                .ca_certificate(ca.clone())
                .identity(identity.clone());
            let channel_err = |err: tonic::transport::Error| TalosError::Channel {
                endpoint: ep.to_string(),
                err: Box::new(err),
            };
            let endpoint = Channel::from_shared(ep.uri())
                .map_err(|e| TalosError::Channel {
                    endpoint: ep.to_string(),
                    err: Box::new(e),
                })?
                .tls_config(tls)
                .map_err(channel_err)?
                .connect_timeout(settings.connect_timeout)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5))
                .keep_alive_while_idle(false);
            channels.push((ep.clone(), endpoint.connect_lazy()));
        }
        Ok(TalosClient {
            channels,
            current: AtomicUsize::new(0),
            settings,
        })
    }

    /// Load a talosconfig file and build a client for `context` (or the current context).
    pub fn from_talosconfig(
        path: &Path,
        context: Option<&str>,
        settings: ClientSettings,
    ) -> Result<(TalosClient, TalosContext), TalosError> {
        let config_err = |e| TalosError::Config(Box::new(e));
        let cfg = TalosConfig::load(path).map_err(config_err)?;
        let ctx = cfg.context(context).map_err(config_err)?;
        Ok((TalosClient::new(&ctx, settings)?, ctx))
    }

    pub fn settings(&self) -> &ClientSettings {
        &self.settings
    }

    fn pick(&self) -> (usize, Channel) {
        let i = self.current.load(Ordering::Relaxed) % self.channels.len();
        (i, self.channels[i].1.clone())
    }

    /// After a failed connect on endpoint `i`, move on to the next endpoint.
    fn rotate_from(&self, i: usize) {
        let n = self.channels.len();
        let _ = self
            .current
            .compare_exchange(i, (i + 1) % n, Ordering::Relaxed, Ordering::Relaxed);
    }

    fn request<T>(
        &self,
        node: &NodeTarget,
        msg: T,
        timeout: Option<Duration>,
    ) -> Result<Request<T>, TalosError> {
        let mut req = Request::new(msg);
        let value = MetadataValue::try_from(node.as_str()).map_err(|_| TalosError::BadNode {
            value: node.to_string(),
            reason: "it is not a valid gRPC metadata value",
        })?;
        req.metadata_mut().insert(NODE_METADATA_KEY, value);
        if let Some(t) = timeout {
            req.set_timeout(t);
        }
        Ok(req)
    }

    /// Map the final failed attempt of `op` to an error.
    fn error(
        &self,
        op: &'static str,
        node: &NodeTarget,
        kind: CallKind,
        attempt: Attempt,
    ) -> TalosError {
        let node = node.to_string();
        match attempt {
            Attempt::Timeout(after) => match kind {
                CallKind::ReadOnly => TalosError::Timeout { op, node, after },
                CallKind::Mutating => TalosError::Indeterminate {
                    op,
                    node,
                    code: Code::DeadlineExceeded,
                    message: format!("no answer within {after:?}"),
                },
            },
            Attempt::Status(status) => {
                let message = status_message(&status);
                if retry::is_tls_error(&status) {
                    return TalosError::Tls { node, message };
                }
                let code = status.code();
                let never_sent = retry::is_connect_error(&status);
                if kind == CallKind::Mutating && retry::answered_failure(&status) {
                    TalosError::Refused {
                        op,
                        node,
                        code,
                        message,
                    }
                } else if kind == CallKind::Mutating
                    && !never_sent
                    && !retry::refused_before_acting(code)
                {
                    TalosError::Indeterminate {
                        op,
                        node,
                        code,
                        message,
                    }
                } else {
                    TalosError::Rpc {
                        op,
                        node,
                        code,
                        message,
                    }
                }
            }
        }
    }

    /// A unary call with the default deadline and retries.
    async fn unary<Req, Resp, F, Fut>(
        &self,
        op: &'static str,
        node: &NodeTarget,
        kind: CallKind,
        msg: Req,
        call: F,
    ) -> Result<Resp, TalosError>
    where
        Req: Clone + Send + Sync,
        F: Fn(Channel, Request<Req>) -> Fut + Send + Sync,
        Fut: Future<Output = Result<Response<Resp>, Status>> + Send,
        Resp: Send,
    {
        self.unary_within(self.settings.request_timeout, op, node, kind, msg, call)
            .await
    }

    /// A unary call with deadline `timeout` and retries.
    async fn unary_within<Req, Resp, F, Fut>(
        &self,
        timeout: Duration,
        op: &'static str,
        node: &NodeTarget,
        kind: CallKind,
        msg: Req,
        call: F,
    ) -> Result<Resp, TalosError>
    where
        Req: Clone + Send + Sync,
        F: Fn(Channel, Request<Req>) -> Fut + Send + Sync,
        Fut: Future<Output = Result<Response<Resp>, Status>> + Send,
        Resp: Send,
    {
        self.attempts(timeout, Some(timeout), op, node, kind, msg, call)
            .await
    }

    /// Open a server stream with retries (only the opening is retried). No `grpc-timeout` is
    /// sent: streams may legitimately run for long; [`Self::next`] bounds silences instead.
    async fn open_stream<Req, Resp, F, Fut>(
        &self,
        op: &'static str,
        node: &NodeTarget,
        kind: CallKind,
        msg: Req,
        call: F,
    ) -> Result<Streaming<Resp>, TalosError>
    where
        Req: Clone + Send + Sync,
        F: Fn(Channel, Request<Req>) -> Fut + Send + Sync,
        Fut: Future<Output = Result<Response<Streaming<Resp>>, Status>> + Send,
        Resp: Send,
    {
        let timeout = self.settings.request_timeout;
        self.attempts(timeout, None, op, node, kind, msg, call)
            .await
    }

    /// Run `call` under the retry policy: each attempt picks the current endpoint, is bounded by
    /// `timeout`, and moves to the next endpoint when it could not connect.
    #[allow(clippy::too_many_arguments)]
    async fn attempts<Req, Out, F, Fut>(
        &self,
        timeout: Duration,
        grpc_timeout: Option<Duration>,
        op: &'static str,
        node: &NodeTarget,
        kind: CallKind,
        msg: Req,
        call: F,
    ) -> Result<Out, TalosError>
    where
        Req: Clone + Send + Sync,
        F: Fn(Channel, Request<Req>) -> Fut + Send + Sync,
        Fut: Future<Output = Result<Response<Out>, Status>> + Send,
        Out: Send,
    {
        // Validate the target once, before any attempt.
        self.request(node, (), None)?;
        let res = retry::run(&self.settings.retry, kind, |_| async {
            let (i, ch) = self.pick();
            let req = self
                .request(node, msg.clone(), grpc_timeout)
                .map_err(|_| Attempt::Status(Status::invalid_argument("bad node")))?;
            match tokio::time::timeout(timeout, call(ch, req)).await {
                Err(_) => Err(Attempt::Timeout(timeout)),
                Ok(Err(status)) => {
                    if retry::is_connect_error(&status) {
                        self.rotate_from(i);
                    }
                    Err(Attempt::Status(status))
                }
                Ok(Ok(resp)) => Ok(resp.into_inner()),
            }
        })
        .await;
        res.map_err(|a| self.error(op, node, kind, a))
    }

    /// The next message of a stream, with the idle timeout; `Ok(None)` at the end.
    async fn next<T>(
        &self,
        op: &'static str,
        node: &NodeTarget,
        kind: CallKind,
        stream: &mut Streaming<T>,
    ) -> Result<Option<T>, TalosError> {
        let idle = self.settings.stream_idle_timeout;
        match tokio::time::timeout(idle, stream.message()).await {
            Err(_) => Err(self.error(op, node, kind, Attempt::Timeout(idle))),
            // Mid-stream failures are never retried here.
            Ok(Err(status)) => Err(self.error(op, node, kind, Attempt::Status(status))),
            Ok(Ok(m)) => Ok(m),
        }
    }

    fn machine(ch: Channel) -> MachineServiceClient<Channel> {
        with_limits!(MachineServiceClient::new(ch))
    }
    fn lifecycle(ch: Channel) -> LifecycleServiceClient<Channel> {
        with_limits!(LifecycleServiceClient::new(ch))
    }
    fn images(ch: Channel) -> ImageServiceClient<Channel> {
        with_limits!(ImageServiceClient::new(ch))
    }
    fn cluster(ch: Channel) -> ClusterServiceClient<Channel> {
        with_limits!(ClusterServiceClient::new(ch))
    }
    fn state(ch: Channel) -> StateClient<Channel> {
        with_limits!(StateClient::new(ch))
    }

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
        let req = super::proto::cluster::HealthCheckRequest {
            wait_timeout: Some(prost_duration(spec.wait_timeout)),
            cluster_info: Some(super::proto::cluster::ClusterInfo {
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

fn status_message(status: &Status) -> String {
    let mut msg = status.message().to_string();
    let mut cur = std::error::Error::source(status);
    while let Some(e) = cur {
        let s = e.to_string();
        if !s.is_empty() && !msg.contains(&s) {
            if !msg.is_empty() {
                msg.push_str(": ");
            }
            msg.push_str(&s);
        }
        cur = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    if msg.is_empty() {
        msg = status.code().description().to_string();
    }
    msg
}

fn bad_reply(op: &'static str, node: &NodeTarget, what: impl Into<String>) -> TalosError {
    TalosError::BadReply {
        op,
        node: node.to_string(),
        what: what.into(),
    }
}

/// The single message of a single-node reply.
fn first<T>(op: &'static str, node: &NodeTarget, messages: Vec<T>) -> Result<T, TalosError> {
    messages
        .into_iter()
        .next()
        .ok_or_else(|| bad_reply(op, node, "the reply has no messages"))
}

/// Legacy proxies report per-node failures in `metadata.error`; treat it as an error.
#[allow(deprecated)]
fn check_metadata(
    op: &'static str,
    node: &NodeTarget,
    md: &Option<common::Metadata>,
) -> Result<(), TalosError> {
    match md {
        Some(m) if !m.error.is_empty() => Err(TalosError::NodeError {
            op,
            node: node.to_string(),
            message: m.error.clone(),
        }),
        _ => Ok(()),
    }
}

fn prost_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn cosi_resource(r: cosi::Resource) -> CosiResource {
    let md = r.metadata.unwrap_or_default();
    let spec = r.spec.unwrap_or_default();
    CosiResource {
        namespace: md.namespace,
        resource_type: md.r#type,
        id: md.id,
        version: md.version,
        phase: md.phase,
        proto_spec: super::Secret::new(spec.proto_spec),
        yaml_spec: super::Secret::new(spec.yaml_spec),
    }
}

fn decode_spec<M: prost::Message + Default>(
    op: &'static str,
    node: &NodeTarget,
    r: &CosiResource,
) -> Result<M, TalosError> {
    M::decode(r.proto_spec.expose().as_slice()).map_err(|e| {
        bad_reply(
            op,
            node,
            format!("the {} spec does not decode: {e}", r.resource_type),
        )
    })
}

fn machine_stage(stage: i32) -> MachineStage {
    use enums::RuntimeMachineStage as S;
    match S::try_from(stage).unwrap_or(S::MachineStageUnknown) {
        S::MachineStageUnknown => MachineStage::Unknown,
        S::MachineStageBooting => MachineStage::Booting,
        S::MachineStageInstalling => MachineStage::Installing,
        S::MachineStageMaintenance => MachineStage::Maintenance,
        S::MachineStageRunning => MachineStage::Running,
        S::MachineStageRebooting => MachineStage::Rebooting,
        S::MachineStageShuttingDown => MachineStage::ShuttingDown,
        S::MachineStageResetting => MachineStage::Resetting,
        S::MachineStageUpgrading => MachineStage::Upgrading,
    }
}

/// Read the interesting parts of a pod status JSON.
fn static_pod_status(id: String, status: &serde_json::Value) -> StaticPodStatus {
    let phase = status["phase"].as_str().unwrap_or_default().to_string();
    let ready = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    let images = status["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["image"].as_str().map(str::to_string))
        .collect();
    StaticPodStatus {
        id,
        phase,
        ready,
        images,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_static_pod_status_json() {
        let json = serde_json::json!({
            "phase": "Running",
            "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "kube-apiserver", "image": "registry.k8s.io/kube-apiserver:v1.34.1"}]
        });
        let s = static_pod_status("kube-system/kube-apiserver-cp-1".into(), &json);
        assert_eq!(s.phase, "Running");
        assert!(s.ready);
        assert_eq!(s.images, ["registry.k8s.io/kube-apiserver:v1.34.1"]);
        let not_ready = static_pod_status("x".into(), &serde_json::json!({"phase": "Pending"}));
        assert!(!not_ready.ready);
    }

    #[test]
    fn status_message_includes_the_cause_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let st = Status::from_error(Box::new(tonic::ConnectError(Box::new(io))));
        let m = status_message(&st);
        assert!(m.contains("connection refused"), "{m}");
    }
}
