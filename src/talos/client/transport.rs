//! How a request reaches a node: one lazily connected mTLS channel per talosconfig endpoint
//! (ALPN `h2`, server name = endpoint host, trust = the talosconfig CA only), the `node`
//! metadata key, failover to the next endpoint, deadlines, retries per [`RetryPolicy`] and the
//! mapping of a gRPC status to a [`TalosError`].

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Request, Response, Status, Streaming};

use super::{ClientSettings, TalosClient, with_limits};
use crate::talos::config::{TalosConfig, TalosContext};
use crate::talos::proto::cluster::cluster_service_client::ClusterServiceClient;
use crate::talos::proto::cosi::resource::state_client::StateClient;
use crate::talos::proto::machine::image_service_client::ImageServiceClient;
use crate::talos::proto::machine::lifecycle_service_client::LifecycleServiceClient;
use crate::talos::proto::machine::machine_service_client::MachineServiceClient;
use crate::talos::retry::{self, Attempt, CallKind};
use crate::talos::types::*;
use crate::talos::{NODE_METADATA_KEY, TalosError};

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

    /// The same endpoints and connections (tonic channels are shared handles), without
    /// retries: every call makes one attempt. For observations whose caller polls anyway, so
    /// that a node that is away is reported at once instead of after the backoff.
    pub fn without_retries(&self) -> TalosClient {
        TalosClient {
            channels: self.channels.clone(),
            current: AtomicUsize::new(self.current.load(std::sync::atomic::Ordering::Relaxed)),
            settings: ClientSettings {
                retry: crate::talos::retry::RetryPolicy::none(),
                ..self.settings
            },
        }
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
    pub(super) fn error(
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
    pub(super) async fn unary<Req, Resp, F, Fut>(
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
    pub(super) async fn unary_within<Req, Resp, F, Fut>(
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
    pub(super) async fn open_stream<Req, Resp, F, Fut>(
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
    pub(super) async fn next<T>(
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

    pub(super) fn machine(ch: Channel) -> MachineServiceClient<Channel> {
        with_limits!(MachineServiceClient::new(ch))
    }
    pub(super) fn lifecycle(ch: Channel) -> LifecycleServiceClient<Channel> {
        with_limits!(LifecycleServiceClient::new(ch))
    }
    pub(super) fn images(ch: Channel) -> ImageServiceClient<Channel> {
        with_limits!(ImageServiceClient::new(ch))
    }
    pub(super) fn cluster(ch: Channel) -> ClusterServiceClient<Channel> {
        with_limits!(ClusterServiceClient::new(ch))
    }
    pub(super) fn state(ch: Channel) -> StateClient<Channel> {
        with_limits!(StateClient::new(ch))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_message_includes_the_cause_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let st = Status::from_error(Box::new(tonic::ConnectError(Box::new(io))));
        let m = status_message(&st);
        assert!(m.contains("connection refused"), "{m}");
    }
}
