//! [`TalosClient`]: the real Talos machine API client (tonic over rustls, mutual TLS).
//!
//! One gRPC channel per talosconfig endpoint (connected lazily, ALPN `h2`, TLS server name =
//! endpoint host, trust = the talosconfig CA only, client certificate from the talosconfig).
//! Requests go to the current endpoint and move to the next one when a connection attempt
//! fails. Each request carries the single-valued `node` metadata key; apid routes it to that
//! node. Message limits are Talos' 32 MiB both ways.
//!
//! **Owns:** [`TalosClient`] and its [`ClientSettings`] (this file); `transport` (channels,
//! mTLS, endpoint failover, deadlines and retries, gRPC status →
//! [`TalosError`](super::TalosError)), `convert` (wire ↔ domain types, reply checks) and
//! `calls` (the RPCs: [`TalosApi`](super::TalosApi) and the client's public helpers).
//! **May depend on:** the rest of `talos` (config, proto, retry, snapshot, types) and `version`.

use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use tonic::transport::Channel;

use super::config::Endpoint;
use super::retry::RetryPolicy;

mod calls;
mod convert;
mod transport;

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

/// Talos' 32 MiB message limit, both ways, on a generated client or server.
macro_rules! with_limits {
    ($svc:expr) => {
        $svc.max_decoding_message_size($crate::talos::MAX_MESSAGE_SIZE)
            .max_encoding_message_size($crate::talos::MAX_MESSAGE_SIZE)
    };
}
pub(crate) use with_limits;

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
