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

    /// Campaign for leadership as `replica` with a lease of `ttl` (rounded up to whole
    /// seconds; etcd may raise very short TTLs to its minimum). Returns at once; the handle
    /// reports the outcome and every later change, and keeps the client running even if this
    /// store is dropped. [`Leadership::resign`] ends the campaign and releases the key at once;
    /// dropping every clone of the handle ends it too, and the key then expires with the lease.
    pub fn campaign(&self, replica: impl Into<String>, ttl: Duration) -> Leadership {
        let runs_on: std::sync::Arc<dyn Send + Sync> = self.rt.clone();
        let (leadership, campaigner) = Leadership::campaign(replica, Some(runs_on));
        let election = Election {
            client: self.client.clone(),
            key: self.leader_key(),
            ttl_secs: ttl.as_secs_f64().ceil().max(1.0) as i64,
            timeout: self.timeout,
            unrevoked: std::sync::Mutex::new(Vec::new()),
        };
        self.handle.spawn(election.run(campaigner));
        leadership
    }
}

/// What a failed transaction's probe read for one key: `(value, create_revision)`.
type Probed = BTreeMap<Vec<u8>, Option<(Vec<u8>, i64)>>;

impl Store for EtcdStore {
    fn get(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.client.clone();
        let key = self.key(table, key);
        let timeout = self.timeout;
        self.run("get", async move {
            let r = unary(&client, timeout, |c| {
                let req = rpc::get(key.clone());
                async move { c.kv().range(req).await }
            })
            .await?;
            Ok(r.kvs.into_iter().next().map(|kv| kv.value))
        })
    }

    fn scan(&self, table: Table, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let client = self.client.clone();
        let table_prefix = self.table_prefix(table);
        let start = format!("{table_prefix}{prefix}").into_bytes();
        let end = prefix_end(&start);
        let strip = table_prefix.len();
        let timeout = self.timeout;
        self.run("scan", async move {
            let pages = async {
                let mut out = Vec::new();
                let mut from = start;
                let mut revision = 0;
                loop {
                    // Every page from the first page's revision: one consistent snapshot.
                    let req = api::RangeRequest {
                        key: from.clone(),
                        range_end: end.clone(),
                        limit: PAGE,
                        revision,
                        ..Default::default()
                    };
                    let r = unary(&client, timeout, |c| {
                        let req = req.clone();
                        async move { c.kv().range(req).await }
                    })
                    .await?;
                    if revision == 0 {
                        revision = r.header.as_ref().map_or(0, |h| h.revision);
                    }
                    for kv in &r.kvs {
                        let key = std::str::from_utf8(&kv.key[strip..]).map_err(|_| {
                            EtcdError::NotUtf8 {
                                key: String::from_utf8_lossy(&kv.key).into_owned(),
                            }
                        })?;
                        out.push((key.to_string(), kv.value.clone()));
                    }
                    match r.kvs.last() {
                        Some(last) if r.more => {
                            from = last.key.clone();
                            from.push(0);
                        }
                        _ => return Ok(out),
                    }
                }
            };
            match tokio::time::timeout(timeout, pages).await {
                Ok(r) => r,
                Err(_) => Err(EtcdError::Timeout { timeout }),
            }
        })
    }

    fn commit(&self, txn: Txn) -> Result<(), StoreError> {
        let leader_key = self.leader_key().into_bytes();
        let mut compares = Vec::new();
        let mut probe_keys: Vec<Vec<u8>> = Vec::new();
        let mut probe = |k: &Vec<u8>| {
            if !probe_keys.contains(k) {
                probe_keys.push(k.clone());
            }
        };
        for check in &txn.checks {
            match check {
                Check::Absent(t, k) => {
                    let key = self.key(*t, k);
                    compares.push(rpc::create_revision_is(key.clone(), 0));
                    probe(&key);
                }
                Check::Equals(t, k, v) => {
                    let key = self.key(*t, k);
                    compares.push(rpc::value_is(key.clone(), v.clone()));
                    probe(&key);
                }
                Check::Leader(fence) => {
                    compares.push(rpc::create_revision_is(leader_key.clone(), fence.term()));
                    compares.push(rpc::value_is(
                        leader_key.clone(),
                        fence.replica().as_bytes().to_vec(),
                    ));
                    probe(&leader_key);
                }
            }
        }
        // Last op per key wins, as in a sequential application of the ops.
        let mut last: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        for op in txn.ops {
            match op {
                Op::Put(t, k, v) => last.insert(self.key(t, &k), Some(v)),
                Op::Delete(t, k) => last.insert(self.key(t, &k), None),
            };
        }
        let success: Vec<api::RequestOp> = last
            .into_iter()
            .map(|(k, v)| match v {
                Some(v) => rpc::op_put(k, v, 0),
                None => rpc::op_delete(k),
            })
            .collect();
        let failure: Vec<api::RequestOp> = probe_keys.iter().cloned().map(rpc::op_get).collect();
        let request = api::TxnRequest {
            compare: compares,
            success,
            failure,
        };
        let client = self.client.clone();
        let timeout = self.timeout;
        let keys = probe_keys.clone();
        let outcome: Option<Probed> = self.run("commit", async move {
            let r = unary(&client, timeout, |c| {
                let req = request.clone();
                async move { c.kv().txn(req).await }
            })
            .await?;
            if r.succeeded {
                return Ok(None);
            }
            if r.responses.len() != keys.len() {
                return Err(EtcdError::ShortTxnResponse);
            }
            let mut probed = Probed::new();
            for (k, resp) in keys.into_iter().zip(r.responses) {
                let Some(api::response_op::Response::ResponseRange(g)) = resp.response else {
                    return Err(EtcdError::ShortTxnResponse);
                };
                let found = g
                    .kvs
                    .into_iter()
                    .next()
                    .map(|kv| (kv.value, kv.create_revision));
                probed.insert(k, found);
            }
            Ok(Some(probed))
        })?;
        let Some(probed) = outcome else {
            return Ok(());
        };
        // Name the failed check: leadership first (it means "stop"), then the data checks in
        // the caller's order.
        let at = |k: &Vec<u8>| probed.get(k).cloned().flatten();
        for check in &txn.checks {
            if let Check::Leader(fence) = check {
                let holds = at(&leader_key)
                    .is_some_and(|(v, rev)| rev == fence.term() && v == fence.replica().as_bytes());
                if !holds {
                    return Err(StoreError::Fenced {
                        replica: fence.replica().to_string(),
                        term: fence.term(),
                    });
                }
            }
        }
        let mut first_data = None;
        for check in &txn.checks {
            let (table, key, holds) = match check {
                Check::Absent(t, k) => (*t, k, at(&self.key(*t, k)).is_none()),
                Check::Equals(t, k, v) => (
                    *t,
                    k,
                    at(&self.key(*t, k)).is_some_and(|(have, _)| have == *v),
                ),
                Check::Leader(_) => continue,
            };
            first_data.get_or_insert((table, key));
            if !holds {
                return Err(StoreError::Conflict {
                    table: table.name(),
                    key: key.clone(),
                });
            }
        }
        // Every check holds when re-read: it failed at the txn's revision and was changed back
        // since, which still is a concurrent change.
        let (table, key) =
            first_data.map_or(("leader", String::new()), |(t, k)| (t.name(), k.clone()));
        Err(StoreError::Conflict { table, key })
    }
}

/// One replica's campaign, run on the store's runtime.
struct Election {
    client: EtcdClient,
    key: String,
    ttl_secs: i64,
    timeout: Duration,
    /// Leases of ended terms that etcd could not be told about yet: revoked before the next
    /// round, so that a replica back in contact does not wait out its own stale key.
    unrevoked: std::sync::Mutex<Vec<i64>>,
}

enum Round {
    /// Look again (the key was released, or we lost it).
    Again,
    /// Resigned or every handle dropped: the campaign is over.
    Stopped,
}

/// How long before the confirmed lease expiry a leader stops acting: room for clock-rate
/// differences and for the time between a last check and a call leaving the process.
fn margin(ttl: Duration) -> Duration {
    (ttl / 5).max(Duration::from_millis(300)).min(ttl / 2)
}

fn stop_signal(c: &Campaigner) -> impl Future<Output = ()> + Send + 'static {
    c.stop_signal()
}

impl Election {
    async fn run(self, c: Campaigner) {
        let mut failures: u32 = 0;
        while !c.stopping() {
            match self.round(&c).await {
                Ok(Round::Stopped) => break,
                Ok(Round::Again) => failures = 0,
                Err(e) => {
                    c.follow(None);
                    failures = failures.saturating_add(1);
                    tracing::warn!(
                        replica = c.replica(),
                        error = %crate::error_chain(&e),
                        "leader election: etcd request failed; retrying"
                    );
                    let delay = Duration::from_millis(100)
                        .saturating_mul(1 << failures.min(5))
                        .min(Duration::from_secs(2));
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stop_signal(&c) => break,
                    }
                }
            }
        }
        // Dropping the campaigner publishes "follower" and completes `resign`.
    }

    #[allow(
        clippy::expect_used,
        reason = "a poisoned lock means a thread panicked mid-update; continuing on half-updated state would be worse than stopping"
    )]
    async fn round(&self, c: &Campaigner) -> Result<Round, EtcdError> {
        let pending: Vec<i64> = std::mem::take(&mut *self.unrevoked.lock().expect("lock"));
        for id in pending {
            self.revoke(id).await;
        }
        let r = self.range_leader(self.timeout).await?;
        if let Some(holder) = r.kvs.first() {
            let holder = String::from_utf8_lossy(&holder.value).into_owned();
            if holder == c.replica() {
                tracing::warn!(
                    replica = c.replica(),
                    "the leader key holds this replica's id from an earlier process; waiting for its lease to expire"
                );
            }
            c.follow(Some(holder));
            let from = r.header.as_ref().map_or(0, |h| h.revision) + 1;
            return self.follow(c, from).await;
        }
        self.campaign(c).await
    }

    /// Watch the held key until it is released.
    async fn follow(&self, c: &Campaigner, from: i64) -> Result<Round, EtcdError> {
        use rpc::pb::mvccpb::event::EventType;
        // The request stream stays open (the sender alive) for as long as we watch.
        let (requests, rx) = tokio::sync::mpsc::channel(1);
        let create = api::WatchRequest {
            request_union: Some(api::watch_request::RequestUnion::CreateRequest(
                api::WatchCreateRequest {
                    key: self.key.clone().into_bytes(),
                    start_revision: from,
                    ..Default::default()
                },
            )),
        };
        requests
            .send(create)
            .await
            .map_err(|_| EtcdError::StreamEnded)?;
        let mut watch = self.client.watch();
        let mut stream = open_stream(
            self.timeout,
            watch.watch(tokio_stream::wrappers::ReceiverStream::new(rx)),
        )
        .await?;
        loop {
            let msg = tokio::select! {
                m = stream.message() => m.map_err(EtcdError::Status)?,
                _ = stop_signal(c) => return Ok(Round::Stopped),
            };
            let Some(resp) = msg else {
                return Err(EtcdError::StreamEnded);
            };
            if resp.canceled {
                // Compacted past our revision, or the server dropped the watch: look again.
                return Ok(Round::Again);
            }
            for ev in resp.events {
                if ev.r#type == EventType::Delete as i32 {
                    return Ok(Round::Again);
                }
                if let Some(kv) = ev.kv {
                    c.follow(Some(String::from_utf8_lossy(&kv.value).into_owned()));
                }
            }
        }
    }

    async fn campaign(&self, c: &Campaigner) -> Result<Round, EtcdError> {
        let asked = Instant::now();
        let ttl_secs = self.ttl_secs;
        let grant = unary(&self.client, self.timeout, |c| async move {
            c.lease()
                .lease_grant(api::LeaseGrantRequest {
                    ttl: ttl_secs,
                    id: 0,
                })
                .await
        })
        .await?;
        let lease_id = grant.id;
        let ttl = Duration::from_secs(grant.ttl.max(1) as u64);
        let key = self.key.clone().into_bytes();
        let txn = api::TxnRequest {
            compare: vec![rpc::create_revision_is(key.clone(), 0)],
            success: vec![rpc::op_put(
                key.clone(),
                c.replica().as_bytes().to_vec(),
                lease_id,
            )],
            failure: vec![rpc::op_get(key)],
        };
        let r = match unary(&self.client, self.timeout, |c| {
            let req = txn.clone();
            async move { c.kv().txn(req).await }
        })
        .await
        {
            Ok(r) => r,
            Err(e) => {
                self.revoke(lease_id).await;
                return Err(e);
            }
        };
        if !r.succeeded {
            self.revoke(lease_id).await;
            let holder = r.responses.into_iter().find_map(|op| match op.response {
                Some(api::response_op::Response::ResponseRange(g)) => g
                    .kvs
                    .first()
                    .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()),
                _ => None,
            });
            c.follow(holder);
            return Ok(Round::Again);
        }
        let term = r.header.as_ref().map_or(0, |h| h.revision);
        let fence = Fence::new(c.replica(), term);
        let deadline = asked + ttl - margin(ttl);
        c.lead(fence.clone(), deadline);
        tracing::info!(
            replica = c.replica(),
            term,
            ttl_secs = ttl.as_secs(),
            "this replica leads"
        );
        let outcome = self.lead(c, lease_id, &fence, ttl, deadline).await;
        c.follow(None);
        match outcome {
            Ok(Lead::Stopped) => {
                self.revoke(lease_id).await;
                Ok(Round::Stopped)
            }
            Ok(Lead::Lost(why)) => {
                tracing::warn!(
                    replica = c.replica(),
                    term,
                    reason = why,
                    "this replica no longer leads"
                );
                self.revoke(lease_id).await;
                Ok(Round::Again)
            }
            Err(e) => {
                self.revoke(lease_id).await;
                Err(e)
            }
        }
    }

    /// Keep the lease alive until the term ends.
    async fn lead(
        &self,
        c: &Campaigner,
        lease_id: i64,
        fence: &Fence,
        ttl: Duration,
        mut deadline: Instant,
    ) -> Result<Lead, EtcdError> {
        let (mut keeper, mut stream) = match self.keep_alive(self.timeout, lease_id).await {
            Ok((k, s)) => (Some(k), Some(s)),
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "cannot open the lease keep-alive stream; retrying on the next tick");
                (None, None)
            }
        };
        let mut sent: VecDeque<Instant> = VecDeque::new();
        let mut tick = tokio::time::interval(ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate
        loop {
            enum Ev {
                Stop,
                Tick,
                Renewed(Result<Option<api::LeaseKeepAliveResponse>, tonic::Status>),
                Deadline,
            }
            let ev = tokio::select! {
                _ = stop_signal(c) => Ev::Stop,
                _ = tick.tick() => Ev::Tick,
                m = async {
                    match stream.as_mut() {
                        Some(s) => s.message().await,
                        None => std::future::pending().await,
                    }
                } => Ev::Renewed(m),
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => Ev::Deadline,
            };
            match ev {
                Ev::Stop => return Ok(Lead::Stopped),
                Ev::Deadline => {
                    return Ok(Lead::Lost(
                        "no lease renewal was confirmed before the deadline",
                    ));
                }
                Ev::Renewed(Ok(Some(resp))) => {
                    let Some(at) = sent.pop_front() else { continue };
                    if resp.ttl <= 0 {
                        return Ok(Lead::Lost("etcd reports the lease expired"));
                    }
                    if Instant::now() >= deadline {
                        // Too late: the term is over locally, whatever etcd says now.
                        return Ok(Lead::Lost(
                            "no lease renewal was confirmed before the deadline",
                        ));
                    }
                    let ttl = Duration::from_secs(resp.ttl as u64);
                    deadline = at + ttl - margin(ttl);
                    c.extend(deadline);
                }
                Ev::Renewed(Ok(None) | Err(_)) => {
                    keeper = None;
                    stream = None;
                    sent.clear();
                }
                Ev::Tick => {
                    // Is the key still ours? (An operator may have deleted it.)
                    match self.range_leader(self.timeout.min(ttl / 3)).await {
                        Ok(r) => {
                            let ours = r.kvs.first().is_some_and(|kv| {
                                kv.create_revision == fence.term()
                                    && kv.value == fence.replica().as_bytes()
                            });
                            if !ours {
                                return Ok(Lead::Lost("the leader key no longer holds this term"));
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %crate::error_chain(&e), "cannot read the leader key; the lease deadline decides")
                        }
                    }
                    // Opening the stream is itself a renewal we cannot date precisely: the
                    // next tick's keep-alive extends the deadline.
                    if keeper.is_none()
                        && let Ok((k, s)) =
                            self.keep_alive(self.timeout.min(ttl / 3), lease_id).await
                    {
                        keeper = Some(k);
                        stream = Some(s);
                    }
                    if let Some(k) = keeper.as_mut() {
                        let at = Instant::now();
                        if k.send(api::LeaseKeepAliveRequest { id: lease_id })
                            .await
                            .is_ok()
                        {
                            sent.push_back(at);
                        } else {
                            keeper = None;
                            stream = None;
                            sent.clear();
                        }
                    }
                }
            }
        }
    }

    /// Release the lease (and with it the key) without waiting long. If etcd cannot be
    /// reached, try again before the next round (meanwhile the lease may expire by itself).
    #[allow(
        clippy::expect_used,
        reason = "a poisoned lock means a thread panicked mid-update; continuing on half-updated state would be worse than stopping"
    )]
    async fn revoke(&self, lease_id: i64) {
        let limit = self.timeout.min(Duration::from_secs(2));
        let revoked = unary(&self.client, limit, |c| async move {
            c.lease()
                .lease_revoke(api::LeaseRevokeRequest { id: lease_id })
                .await
        })
        .await;
        match revoked {
            Ok(_) => {}
            // Already expired and gone.
            Err(EtcdError::Status(s)) if s.code() == tonic::Code::NotFound => {}
            Err(_) => self.unrevoked.lock().expect("lock").push(lease_id),
        }
    }
}

impl Election {
    /// Read the leader key.
    async fn range_leader(&self, timeout: Duration) -> Result<api::RangeResponse, EtcdError> {
        let key = self.key.clone().into_bytes();
        unary(&self.client, timeout, |c| {
            let req = rpc::get(key.clone());
            async move { c.kv().range(req).await }
        })
        .await
    }

    /// Open the lease keep-alive stream: the sender of renewals and the stream of answers.
    async fn keep_alive(
        &self,
        timeout: Duration,
        lease_id: i64,
    ) -> Result<
        (
            tokio::sync::mpsc::Sender<api::LeaseKeepAliveRequest>,
            tonic::Streaming<api::LeaseKeepAliveResponse>,
        ),
        EtcdError,
    > {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        // etcd answers (and so sends the stream's headers) only after a first renewal.
        tx.send(api::LeaseKeepAliveRequest { id: lease_id })
            .await
            .map_err(|_| EtcdError::StreamEnded)?;
        let mut lease = self.client.lease();
        let stream = open_stream(
            timeout,
            lease.lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx)),
        )
        .await?;
        Ok((tx, stream))
    }
}

enum Lead {
    Stopped,
    Lost(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> EtcdConfig {
        match url.parse().unwrap() {
            crate::store::location::StoreLocation::Etcd(u) => EtcdConfig::new(u),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn plaintext_to_a_remote_etcd_is_refused_unless_insecure() {
        for url in [
            "etcd://127.0.0.1:2379",
            "etcd://localhost:2379",
            "etcd://[::1]:2379",
            "etcd://127.0.0.2:2379,localhost:2380",
        ] {
            assert!(check_transport(&config(url)).is_ok(), "{url}");
        }
        let mut remote = config("etcd://127.0.0.1:2379,10.0.0.5:2379/medea");
        let err = check_transport(&remote).unwrap_err();
        assert!(
            matches!(&err, EtcdError::Plaintext { endpoint } if endpoint == "10.0.0.5:2379"),
            "{err}"
        );
        remote.insecure = true;
        assert!(check_transport(&remote).is_ok());
        remote.insecure = false;
        remote.tls = Some(EtcdTls {
            ca: "/nonexistent/ca.crt".into(),
            cert: None,
            key: None,
        });
        assert!(check_transport(&remote).is_ok());
    }

    #[test]
    fn credentials_never_show_the_password() {
        let c = EtcdCredentials {
            user: "medea".into(),
            password: crate::secret::Secret::new("hunter2".into()),
        };
        let shown = format!("{c:?}");
        assert!(
            shown.contains("medea") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[test]
    fn prefix_ranges() {
        assert_eq!(prefix_end(b"/medea/jobs/"), b"/medea/jobs0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
    }

    #[test]
    fn the_margin_leaves_room_for_renewals() {
        for secs in [1u64, 2, 5, 10, 60] {
            let ttl = Duration::from_secs(secs);
            let m = margin(ttl);
            assert!(m <= ttl / 2, "{secs}s: {m:?}");
            // a keep-alive every ttl/3 renews well before ttl - margin
            assert!(ttl / 3 < ttl - m, "{secs}s: {m:?}");
        }
    }
}
