//! Listeners that hold (issues #32 and #49): the one accept loop of the gRPC API, the web
//! dashboard and `/metrics`, with a connection cap in all and per peer address, a handshake
//! timeout, a timeout for the first bytes after it, and a pause after a failed `accept`.
//!
//! **Owns:** [`Limits`], the accept loop ([`accept`]), the connections it hands out ([`Conn`],
//! which hold their slots until dropped), serving an axum router on one of them
//! ([`serve_http`]) and the rustls configuration of a TLS listener ([`tls_config`]).
//! **May depend on:** `server::tls` (the identity); nothing else of the daemon.
//!
//! Architecture Invariant: a peer that says nothing holds nothing for long: before its first
//! bytes a connection is *pending*; a pending connection is closed after the handshake
//! timeout (and the header timeout after the handshake), and when the cap in all is reached
//! the oldest pending connection is closed to admit the new one, so a flood of silent
//! connections never locks out a client that talks.
//! Architecture Invariant: no listener takes more than an eighth of the process's file
//! descriptors ([`Limits::within_descriptors`]), so a flood never starves the store, the
//! inventory refresh or the desired-state reload of descriptors.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::tls::ServerIdentity;
use crate::Locked as _;

/// How much of the daemon one listener may take: connections, and how long a peer may hold
/// one without saying anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Open connections in all; past it the oldest connection that has sent nothing yet is
    /// closed to make room, and when every one has, the new one is closed at once.
    pub max_connections: usize,
    /// Open connections from one IP address; one more is closed at once.
    pub max_per_peer: usize,
    /// How long a TLS handshake may take.
    pub handshake_timeout: Duration,
    /// How long a peer may take to send its first bytes after the handshake; for HTTP/1.1
    /// (dashboard, metrics) also how long it may take to send a request's headers, counted
    /// from the moment the connection waits for a request (so it is also the idle timeout of
    /// a kept-alive connection).
    pub header_timeout: Duration,
    /// HTTP/2: how often the server pings, and how long it waits for the answer.
    pub keep_alive: Duration,
}

impl Default for Limits {
    /// The API's and the dashboard's: 256 connections, 32 per peer, 10 s for the handshake,
    /// 30 s for the first bytes and for headers, a ping every 30 s.
    fn default() -> Self {
        Limits {
            max_connections: 256,
            max_per_peer: 32,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(30),
            keep_alive: Duration::from_secs(30),
        }
    }
}

/// The share of the descriptor limit one listener may hold: three listeners take at most
/// 3/8 of it, the rest is the store's, the refresh's and the reload's.
const DESCRIPTOR_SHARE: u64 = 8;

impl Limits {
    /// `/metrics`: one scraper or two and a person with curl.
    pub fn metrics() -> Limits {
        Limits {
            max_connections: 64,
            max_per_peer: 16,
            ..Limits::default()
        }
    }

    /// These limits with the caps lowered, where needed, to an eighth of `nofile` (the soft
    /// `RLIMIT_NOFILE`; `None`: unlimited) and the per-peer cap never above the cap in all.
    pub fn within_descriptors(&self, nofile: Option<u64>) -> Limits {
        let mut l = self.clone();
        if let Some(n) = nofile {
            let share = usize::try_from(n / DESCRIPTOR_SHARE).unwrap_or(usize::MAX);
            l.max_connections = l.max_connections.min(share).max(1);
        }
        l.max_per_peer = l.max_per_peer.min(l.max_connections).max(1);
        l
    }
}

/// The process's soft file-descriptor limit (`None`: unlimited).
pub fn descriptor_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// How long to wait after a failed `accept` (EMFILE, ENFILE, ENOBUFS …): the error repeats at
/// once while its cause lasts, so retrying without a pause spins a core. Doubles from 10 ms to
/// 1 s, back to the start after a success.
#[derive(Debug)]
pub(crate) struct AcceptBackoff(Duration);

impl AcceptBackoff {
    const MIN: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    pub(crate) fn new() -> Self {
        AcceptBackoff(Self::MIN)
    }
    /// The pause after this failure.
    pub(crate) fn failed(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(Self::MAX);
        d
    }
    pub(crate) fn succeeded(&mut self) {
        self.0 = Self::MIN;
    }
}

/// Connections per peer address, each held by a [`PeerSlot`].
#[derive(Default)]
struct Peers(std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>);

struct PeerSlot {
    peers: Arc<Peers>,
    ip: IpAddr,
}

impl Peers {
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut map = self.0.locked();
        let n = map.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut map = self.peers.0.locked();
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// A connection that passed the caps, its handshake and sent its first bytes (kept in the
/// buffer). It holds its place under the caps until dropped.
pub struct Conn<IO> {
    io: BufReader<IO>,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    _permit: OwnedSemaphorePermit,
    _slot: PeerSlot,
}

impl<IO: AsyncRead> Conn<IO> {
    /// The stream under the buffer (a TLS stream: its ALPN protocol).
    pub fn get_ref(&self) -> &IO {
        self.io.get_ref()
    }
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Conn<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Conn<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO> tonic::transport::server::Connected for Conn<IO> {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.local,
            remote_addr: Some(self.peer),
        }
    }
}

/// Accept on `listener` under `limits`: each connection is admitted under the caps, given
/// `Nagle` off, passed through `handshake` (TLS, or nothing) within the handshake timeout,
/// and handed out once its first bytes came within the header timeout. The loop runs until
/// the receiver is dropped; `name` says which listener in the log.
pub fn accept<IO, H, F>(
    name: &'static str,
    listener: TcpListener,
    limits: Limits,
    handshake: H,
) -> mpsc::Receiver<Conn<IO>>
where
    H: Fn(TcpStream) -> F + Send + 'static,
    F: Future<Output = std::io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(limits.max_connections.clamp(1, 1024));
    tokio::spawn(accept_loop(name, listener, limits, handshake, tx));
    rx
}

async fn accept_loop<IO, H, F>(
    name: &'static str,
    listener: TcpListener,
    limits: Limits,
    handshake: H,
    tx: mpsc::Sender<Conn<IO>>,
) where
    H: Fn(TcpStream) -> F + Send + 'static,
    F: Future<Output = std::io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let global = Arc::new(Semaphore::new(limits.max_connections));
    let peers = Arc::new(Peers::default());
    let local = listener.local_addr().ok();
    // Connections that have sent nothing yet, oldest first: closed by a send (or dropped).
    let mut pending: VecDeque<oneshot::Sender<()>> = VecDeque::new();
    let mut handshakes = tokio::task::JoinSet::new();
    let mut backoff = AcceptBackoff::new();
    loop {
        let accepted = tokio::select! {
            _ = tx.closed() => return,
            a = listener.accept() => a,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => {
                backoff.succeeded();
                a
            }
            Err(e) => {
                let pause = backoff.failed();
                tracing::warn!(listener = name, error = %e, pause_ms = pause.as_millis() as u64, "accept failed; pausing");
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        while handshakes.try_join_next().is_some() {}
        pending.retain(|p| !p.is_closed());
        // Over a cap: dropping the stream closes it before any TLS work is done.
        let Some(slot) = peers.take(peer.ip(), limits.max_per_peer) else {
            tracing::debug!(listener = name, %peer, "per-peer connection cap reached; closing");
            continue;
        };
        let Some(permit) = admit(&global, &mut pending).await else {
            tracing::debug!(listener = name, %peer, "connection cap reached and every connection talks; closing");
            continue;
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(listener = name, error = %e, "cannot set TCP_NODELAY");
        }
        let (evict, evicted) = oneshot::channel();
        pending.push_back(evict);
        let shake = handshake(tcp);
        let (limits, tx) = (limits.clone(), tx.clone());
        handshakes.spawn(async move {
            let io = tokio::select! {
                biased;
                _ = evicted => return,
                io = first_bytes(shake, &limits) => io,
            };
            let Some(io) = io else { return };
            let conn = Conn {
                io,
                peer,
                local,
                _permit: permit,
                _slot: slot,
            };
            let _ = tx.send(conn).await;
        });
    }
}

/// A permit under the cap in all; when it is reached, the oldest pending connection is closed
/// to make room (its permit comes back as its task ends). `None` when nothing is pending.
async fn admit(
    global: &Arc<Semaphore>,
    pending: &mut VecDeque<oneshot::Sender<()>>,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(p) = global.clone().try_acquire_owned() {
        return Some(p);
    }
    while let Some(oldest) = pending.pop_front() {
        if oldest.send(()).is_ok() {
            // The evicted task returns at its next poll and drops its permit.
            return tokio::time::timeout(Duration::from_secs(1), global.clone().acquire_owned())
                .await
                .ok()?
                .ok();
        }
    }
    None
}

/// The handshake within its timeout, then the first bytes within the header timeout (hyper's
/// HTTP/2 server waits for a client's preface with no timer of its own). The bytes read stay
/// in the buffer.
async fn first_bytes<IO, F>(shake: F, limits: &Limits) -> Option<BufReader<IO>>
where
    F: Future<Output = std::io::Result<IO>>,
    IO: AsyncRead + Unpin,
{
    let io = tokio::time::timeout(limits.handshake_timeout, shake)
        .await
        .ok()?
        .ok()?;
    let mut io = BufReader::new(io);
    match tokio::time::timeout(limits.header_timeout, io.fill_buf()).await {
        Ok(Ok(first)) if !first.is_empty() => Some(io),
        _ => None,
    }
}

/// Which HTTP a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Http {
    /// HTTP/1.1 only (TLS without `h2` by ALPN).
    H1,
    /// HTTP/2 only (`h2` by ALPN).
    H2,
    /// Either, by the client's first bytes (plain TCP: HTTP/1.1 or HTTP/2 with prior knowledge).
    Auto,
}

/// Serve `app` on one connection: HTTP/1.1 with the header timeout, HTTP/2 with keep-alive
/// pings. Returns when the connection ends.
pub async fn serve_http<IO>(conn: Conn<IO>, app: axum::Router, limits: Limits, http: Http)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.keep_alive)
        .keep_alive_timeout(limits.keep_alive);
    let builder = match http {
        Http::H1 => builder.http1_only(),
        Http::H2 => builder.http2_only(),
        Http::Auto => builder,
    };
    let service = TowerToHyperService::new(app);
    let _ = builder.serve_connection(TokioIo::new(conn), service).await;
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("the certificate or key is not usable")]
    Tls(#[source] rustls::Error),
    #[error("the certificate or key PEM cannot be read")]
    Pem(#[source] rustls::pki_types::pem::Error),
}

/// The rustls configuration of a TLS listener with `identity`, offering `alpn`.
pub fn tls_config(
    identity: &ServerIdentity,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, ConfigError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_slice_iter(identity.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(ConfigError::Pem)?;
    let key = PrivateKeyDer::from_pem_slice(identity.key_pem.expose().as_bytes())
        .map_err(ConfigError::Pem)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(ConfigError::Tls)?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(ConfigError::Tls)?;
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests;
