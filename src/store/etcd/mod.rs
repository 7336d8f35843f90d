//! The etcd backend for HA replicas: every table is a key prefix in one etcd cluster, every
//! commit is one etcd transaction, and replicas elect their leader with a lease.
//!
//! Layout under the prefix `P` (default `/medea`, set by the URL's path):
//!
//! | key | value |
//! |---|---|
//! | `P/<table>/<key>` | the record: the same versioned bytes as the fjall backend |
//! | `P/meta/store-format` | this layout's version; a newer one is refused |
//! | `P/leader` | the leading replica's id, attached to its lease |
//!
//! **Transactions.** `Check::Absent` is `create_revision(key) == 0`, `Check::Equals` is
//! `value(key) == bytes` (false for a missing key), `Check::Leader(fence)` is
//! `create_revision(P/leader) == term && value(P/leader) == replica`. The failure branch reads
//! every checked key in the same revision, so a failed commit names the check that failed.
//! Several ops on one key collapse to the last one (etcd refuses duplicate keys in a txn).
//! etcd applies a txn through raft and fsyncs its WAL before answering, so every commit is
//! durable; `Durability::Buffered` is the same as `Durable` here.
//!
//! **Election.** A replica reads `P/leader`. If it is held, it watches the key from the read's
//! revision and campaigns when it is deleted. To campaign it grants a lease and runs
//! `if create_revision(P/leader) == 0 then put(P/leader, id, lease)`; the put's revision is the
//! term. The leader sends keep-alives every TTL/3, checks on each tick that the key is still its
//! own, and steps down when the key changed, when etcd reports the lease gone, or when no
//! keep-alive was confirmed before its local deadline (the last confirmed renewal's send time +
//! TTL − margin). Resigning revokes the lease, which deletes the key at once.
//!
//! The `Store` trait is synchronous; the client runs on a small runtime owned by the store, and
//! callers block on a channel (inside a multi-threaded tokio runtime, via `block_in_place`).
//!
//! **Files.** This one owns the configuration, TLS/credentials checks, connecting and the client
//! runtime; [`txn`] the `Store` reads and commits; [`election`] the leader campaign; [`rpc`] the
//! generated etcd gRPC client.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub mod rpc;

pub use rpc::EtcdCredentials;
use rpc::{CallError, EtcdClient, RpcError, api};

use super::leader::{Campaigner, Fence, Leadership};
use super::location::EtcdUrl;
use super::{Check, Op, Store, StoreError, Table, Txn};

/// The key layout this medea writes and reads in etcd.
pub const FORMAT_VERSION: u32 = 1;
const FORMAT_KEY: &str = "store-format";
/// Keys per range request when scanning (keeps each response well under gRPC's 4 MiB).
const PAGE: i64 = 256;

/// TLS towards etcd: the CA that signed the members' certificates, and optionally a client
/// certificate and key (etcd's `--client-cert-auth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: PathBuf,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct EtcdConfig {
    pub url: EtcdUrl,
    pub tls: Option<EtcdTls>,
    /// etcd username/password authentication, when etcd has `auth enable`d.
    pub credentials: Option<EtcdCredentials>,
    /// Allow plaintext (no TLS) to endpoints that are not on loopback. Off by default:
    /// whoever can write the store can bypass approvals, and whoever can read the traffic
    /// reads the auth token and every record.
    pub insecure: bool,
    /// Bound on each store request (a scan counts as one).
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
}

impl EtcdConfig {
    pub fn new(url: EtcdUrl) -> EtcdConfig {
        EtcdConfig {
            url,
            tls: None,
            credentials: None,
            insecure: false,
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("cannot read the {what} `{path}`")]
    ReadFile {
        what: &'static str,
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error(
        "an etcd client certificate needs its key and the key its certificate (--etcd-cert with --etcd-key)"
    )]
    HalfIdentity,
    #[error("cannot start the etcd client runtime")]
    Runtime(#[source] std::io::Error),
    #[error(
        "refusing plaintext to the etcd endpoint `{endpoint}`, which is not on loopback: anyone on the path could read and rewrite medea's store (and with it, approvals)"
    )]
    Plaintext { endpoint: String },
    #[error("the etcd client runtime has stopped")]
    RuntimeGone,
    #[error("etcd did not answer within {timeout:?}")]
    Timeout { timeout: Duration },
    #[error("etcd request failed")]
    Client(#[source] RpcError),
    #[error("etcd refused the request: {}", .0.message())]
    Status(#[source] tonic::Status),
    #[error("an etcd stream (watch or lease keep-alive) ended")]
    StreamEnded,
    #[error("the store format marker is unreadable: `{found}`")]
    BadFormat { found: String },
    #[error("key `{key}` under medea's prefix is not UTF-8")]
    NotUtf8 { key: String },
    #[error("etcd answered a transaction without the reads medea asked for")]
    ShortTxnResponse,
}

fn backend(op: &'static str, e: EtcdError) -> StoreError {
    StoreError::Backend {
        op,
        err: Box::new(e),
    }
}

fn call_err(e: CallError) -> EtcdError {
    match e {
        CallError::Status(s) => EtcdError::Status(s),
        CallError::Client(RpcError::Timeout { timeout }) => EtcdError::Timeout { timeout },
        CallError::Client(e) => EtcdError::Client(e),
    }
}

/// The client's runtime; shut down (without blocking) when the store and every leadership
/// handle campaigning through it are gone.
struct ClientRuntime(Option<tokio::runtime::Runtime>);

impl Drop for ClientRuntime {
    fn drop(&mut self) {
        // Never blocks, so the last handle may be dropped inside an async context.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

pub struct EtcdStore {
    rt: std::sync::Arc<ClientRuntime>,
    handle: tokio::runtime::Handle,
    client: EtcdClient,
    prefix: String,
    location: String,
    timeout: Duration,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("location", &self.location)
            .finish()
    }
}

fn read_file(what: &'static str, path: &PathBuf) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(path).map_err(|err| EtcdError::ReadFile {
        what,
        path: path.clone(),
        err,
    })
}

fn tls_options(tls: &EtcdTls) -> Result<tonic::transport::ClientTlsConfig, EtcdError> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let ca = read_file("etcd CA certificate", &tls.ca)?;
    let mut opts = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let cert = read_file("etcd client certificate", cert)?;
            let key = read_file("etcd client key", key)?;
            opts = opts.identity(Identity::from_pem(cert, key));
        }
        (None, None) => {}
        _ => return Err(EtcdError::HalfIdentity),
    }
    Ok(opts)
}

/// Whether `endpoint` (`host:port`) is on loopback: `localhost`, 127.0.0.0/8 or `[::1]`.
pub fn is_loopback(endpoint: &str) -> bool {
    let host = match endpoint.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => endpoint.rsplit_once(':').map_or(endpoint, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Plaintext to a non-loopback endpoint is refused unless `insecure` says otherwise.
fn check_transport(config: &EtcdConfig) -> Result<(), EtcdError> {
    if config.tls.is_some() || config.insecure {
        return Ok(());
    }
    match config.url.endpoints.iter().find(|e| !is_loopback(e)) {
        Some(e) => Err(EtcdError::Plaintext {
            endpoint: e.clone(),
        }),
        None => Ok(()),
    }
}

/// Run `fut` on `handle` and wait for it from any context (plain thread, `spawn_blocking`, or a
/// worker of a multi-threaded runtime).
fn block_on<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    fut: impl Future<Output = T> + Send + 'static,
) -> Result<T, EtcdError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    handle.spawn(async move {
        let _ = tx.send(fut.await);
    });
    let wait = move || rx.recv().map_err(|_| EtcdError::RuntimeGone);
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

/// One unary call on `client` within `timeout` (renewing the auth token once if etcd asks).
async fn unary<T, F, Fut>(client: &EtcdClient, timeout: Duration, call: F) -> Result<T, EtcdError>
where
    F: Fn(EtcdClient) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    client.unary(timeout, call).await.map_err(call_err)
}

/// Open a bidirectional stream within `timeout`.
async fn open_stream<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, EtcdError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r
            .map(tonic::Response::into_inner)
            .map_err(EtcdError::Status),
        Err(_) => Err(EtcdError::Timeout { timeout }),
    }
}

/// The end of the key range that holds every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // the whole keyspace (never reached: medea keys are UTF-8 under a prefix)
}

impl EtcdStore {
    /// Connect to the cluster, check (or write) the layout version under the prefix, and
    /// return the store. Fails when no endpoint answers within the connect/request timeouts.
    pub fn connect(config: &EtcdConfig) -> Result<EtcdStore, StoreError> {
        let location = config.url.to_string();
        let open_err = |e: EtcdError| StoreError::Open {
            path: PathBuf::from(&location),
            err: Box::new(e),
        };
        check_transport(config).map_err(open_err)?;
        let tls = config
            .tls
            .as_ref()
            .map(tls_options)
            .transpose()
            .map_err(open_err)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("medea-etcd")
            .enable_all()
            .build()
            .map_err(|e| open_err(EtcdError::Runtime(e)))?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let endpoints: Vec<String> = config
            .url
            .endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect();
        let connect_timeout = config.connect_timeout;
        let credentials = config.credentials.clone();
        let client = block_on(rt.handle(), async move {
            EtcdClient::connect(&endpoints, tls, connect_timeout, credentials)
                .await
                .map_err(EtcdError::Client)
        })
        .and_then(|r| r)
        .map_err(open_err)?;
        let store = EtcdStore {
            handle: rt.handle().clone(),
            rt: std::sync::Arc::new(ClientRuntime(Some(rt))),
            client,
            prefix: config.url.prefix.clone(),
            location: location.clone(),
            timeout: config.request_timeout,
        };
        let unbox = |e: StoreError| match e {
            StoreError::Backend { err, .. } => StoreError::Open {
                path: PathBuf::from(&location),
                err,
            },
            other => other,
        };
        match store.get(Table::Meta, FORMAT_KEY).map_err(unbox)? {
            Some(bytes) => {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let found: u32 = text
                    .parse()
                    .map_err(|_| open_err(EtcdError::BadFormat { found: text }))?;
                if found > FORMAT_VERSION {
                    return Err(StoreError::NewerFormat {
                        path: PathBuf::from(&location),
                        found,
                        supported: FORMAT_VERSION,
                    });
                }
            }
            None => {
                let marker = Txn::new()
                    .check(Check::Absent(Table::Meta, FORMAT_KEY.into()))
                    .put(
                        Table::Meta,
                        FORMAT_KEY,
                        FORMAT_VERSION.to_string().into_bytes(),
                    );
                match store.commit(marker) {
                    // Another replica wrote it first: fine, it is the same marker or newer, and
                    // the next open checks it.
                    Ok(()) | Err(StoreError::Conflict { .. }) => {}
                    Err(e) => return Err(unbox(e)),
                }
            }
        }
        Ok(store)
    }

    /// `etcd://endpoints/prefix`, for messages.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The leader key's full name (`<prefix>/leader`).
    pub fn leader_key(&self) -> String {
        format!("{}/leader", self.prefix)
    }

    fn table_prefix(&self, table: Table) -> String {
        format!("{}/{}/", self.prefix, table.name())
    }

    fn key(&self, table: Table, key: &str) -> Vec<u8> {
        format!("{}{}", self.table_prefix(table), key).into_bytes()
    }

    fn run<T: Send + 'static>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, EtcdError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        block_on(&self.handle, fut)
            .and_then(|r| r)
            .map_err(|e| backend(op, e))
    }

    /// Who holds the leader key now: `(replica, term)`.
    pub fn current_leader(&self) -> Result<Option<(String, i64)>, StoreError> {
        let client = self.client.clone();
        let key = self.leader_key().into_bytes();
        let timeout = self.timeout;
        self.run("leader", async move {
            let r = unary(&client, timeout, |c| {
                let req = rpc::get(key.clone());
                async move { c.kv().range(req).await }
            })
            .await?;
            Ok(r.kvs.first().map(|kv| {
                (
                    String::from_utf8_lossy(&kv.value).into_owned(),
                    kv.create_revision,
                )
            }))
        })
    }
}

mod election;
mod txn;

#[cfg(test)]
use election::margin;

#[cfg(test)]
mod tests;
