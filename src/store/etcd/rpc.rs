//! A small etcd v3 client: the KV, Watch, Lease and Auth services generated (tonic + prost, in
//! `build.rs`) from etcd's own protos in `proto/etcd/`, compiled with the vendored `protoc` like
//! every other proto set, so `--features etcd` needs no system `protoc`.
//!
//! Every request carries `hasleader: true` (etcd refuses it when the member has lost its
//! leader, instead of answering from a partitioned member) and, once authenticated, the auth
//! token in the `token` metadata, which is what etcd's own Go client sends. A token that etcd
//! no longer accepts (expired, or the auth store moved on) is renewed once per call.

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::secret::Secret;

/// The generated code: `etcdserverpb` (the services), `mvccpb` (key-values, events),
/// `authpb`, and the option packages etcd's protos import.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/etcd_api.rs"));
}

use crate::Locked as _;
use api::auth_client::AuthClient;
use api::kv_client::KvClient;
use api::lease_client::LeaseClient;
use api::watch_client::WatchClient;
pub use pb::etcdserverpb as api;

/// etcd username/password authentication (etcd's `auth enable`). The password never appears
/// in `Debug` output or logs.
#[derive(Clone)]
pub struct EtcdCredentials {
    pub user: String,
    pub password: Secret<String>,
}

impl std::fmt::Debug for EtcdCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCredentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("invalid etcd endpoint `{endpoint}`")]
    Endpoint {
        endpoint: String,
        #[source]
        err: tonic::transport::Error,
    },
    #[error("cannot connect to etcd at {endpoint}")]
    Connect {
        endpoint: String,
        #[source]
        err: tonic::transport::Error,
    },
    #[error("etcd did not answer within {timeout:?}")]
    Timeout { timeout: Duration },
    #[error("etcd refused the credentials of user `{user}`")]
    Authenticate {
        user: String,
        #[source]
        err: tonic::Status,
    },
    #[error("etcd answered with an auth token that cannot be sent back")]
    BadToken,
}

/// Adds `hasleader` and the auth token to every request.
#[derive(Clone)]
pub struct Metadata {
    token: Arc<RwLock<Option<AsciiMetadataValue>>>,
}

impl tonic::service::Interceptor for Metadata {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut()
            .insert("hasleader", MetadataValue::from_static("true"));
        if let Some(t) = self.token.read_locked().as_ref() {
            req.metadata_mut().insert("token", t.clone());
        }
        Ok(req)
    }
}

pub type Service = InterceptedService<Channel, Metadata>;

/// A connection to one etcd cluster (a channel balanced over its endpoints).
#[derive(Clone)]
pub struct EtcdClient {
    channel: Channel,
    metadata: Metadata,
    credentials: Option<Arc<EtcdCredentials>>,
}

/// Whether etcd refused a request for its token (expired, or issued before an auth change).
fn token_refused(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::Unauthenticated
        || (s.code() == tonic::Code::InvalidArgument
            && s.message().contains("revision of auth store is old"))
}

impl EtcdClient {
    /// Connect to `endpoints` (`http://host:port` or `https://…` with `tls`), trying each in
    /// turn until one answers, then authenticate when `credentials` are given. Requests are
    /// balanced over every endpoint afterwards.
    pub async fn connect(
        endpoints: &[String],
        tls: Option<ClientTlsConfig>,
        connect_timeout: Duration,
        credentials: Option<EtcdCredentials>,
    ) -> Result<EtcdClient, RpcError> {
        let mut list = Vec::new();
        for e in endpoints {
            let mut ep = Endpoint::from_shared(e.clone())
                .map_err(|err| RpcError::Endpoint {
                    endpoint: e.clone(),
                    err,
                })?
                .connect_timeout(connect_timeout)
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(3))
                .keep_alive_while_idle(true);
            if let Some(t) = &tls {
                ep = ep.tls_config(t.clone()).map_err(|err| RpcError::Endpoint {
                    endpoint: e.clone(),
                    err,
                })?;
            }
            list.push((e.clone(), ep));
        }
        // One endpoint must answer now, so that a wrong address or TLS setting is reported as
        // such rather than as a timeout of the first request.
        let mut first_err = None;
        let mut connected = None;
        for (name, ep) in &list {
            match tokio::time::timeout(connect_timeout, ep.connect()).await {
                Ok(Ok(ch)) => {
                    connected = Some(ch);
                    break;
                }
                Ok(Err(err)) => {
                    first_err.get_or_insert(RpcError::Connect {
                        endpoint: name.clone(),
                        err,
                    });
                }
                Err(_) => {
                    first_err.get_or_insert(RpcError::Timeout {
                        timeout: connect_timeout,
                    });
                }
            }
        }
        let channel = match (connected, list.len()) {
            (Some(ch), 1) => ch,
            (Some(_), _) => Channel::balance_list(list.into_iter().map(|(_, ep)| ep)),
            (None, _) => {
                return Err(first_err.unwrap_or(RpcError::Timeout {
                    timeout: connect_timeout,
                }));
            }
        };
        let client = EtcdClient {
            channel,
            metadata: Metadata {
                token: Arc::new(RwLock::new(None)),
            },
            credentials: credentials.map(Arc::new),
        };
        if client.credentials.is_some() {
            client.authenticate().await?;
        }
        Ok(client)
    }

    /// Exchange the credentials for a token (etcd `Auth.Authenticate`).
    pub async fn authenticate(&self) -> Result<(), RpcError> {
        let Some(c) = &self.credentials else {
            return Ok(());
        };
        let mut auth = AuthClient::new(self.channel.clone());
        let r = auth
            .authenticate(api::AuthenticateRequest {
                name: c.user.clone(),
                password: c.password.expose().clone(),
            })
            .await
            .map_err(|err| RpcError::Authenticate {
                user: c.user.clone(),
                err,
            })?
            .into_inner();
        let token: AsciiMetadataValue = r.token.parse().map_err(|_| RpcError::BadToken)?;
        *self.metadata.token.locked() = Some(token);
        Ok(())
    }

    pub fn kv(&self) -> KvClient<Service> {
        KvClient::with_interceptor(self.channel.clone(), self.metadata.clone())
    }

    pub fn watch(&self) -> WatchClient<Service> {
        WatchClient::with_interceptor(self.channel.clone(), self.metadata.clone())
    }

    pub fn lease(&self) -> LeaseClient<Service> {
        LeaseClient::with_interceptor(self.channel.clone(), self.metadata.clone())
    }

    /// The Auth service with this client's token (user and role administration).
    pub fn auth(&self) -> AuthClient<Service> {
        AuthClient::with_interceptor(self.channel.clone(), self.metadata.clone())
    }

    /// Run one unary call within `timeout`; when etcd refuses the token, authenticate again
    /// and run it once more.
    pub async fn unary<T, F, Fut>(&self, timeout: Duration, call: F) -> Result<T, CallError>
    where
        F: Fn(EtcdClient) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let run = async {
            match call(self.clone()).await {
                Ok(r) => Ok(r.into_inner()),
                Err(s) if self.credentials.is_some() && token_refused(&s) => {
                    self.authenticate().await.map_err(CallError::Client)?;
                    call(self.clone())
                        .await
                        .map(tonic::Response::into_inner)
                        .map_err(CallError::Status)
                }
                Err(s) => Err(CallError::Status(s)),
            }
        };
        match tokio::time::timeout(timeout, run).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Client(RpcError::Timeout { timeout })),
        }
    }
}

/// A failed call: etcd's answer, or the client's own failure (timeout, re-authentication).
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("etcd refused the request: {}", .0.message())]
    Status(#[source] tonic::Status),
    #[error(transparent)]
    Client(RpcError),
}

impl CallError {
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            CallError::Status(s) => Some(s.code()),
            CallError::Client(_) => None,
        }
    }
}

/// `RangeRequest` for one key.
pub fn get(key: impl Into<Vec<u8>>) -> api::RangeRequest {
    api::RangeRequest {
        key: key.into(),
        ..Default::default()
    }
}

/// `Compare`: the key's create revision equals `rev` (0: the key does not exist).
pub fn create_revision_is(key: Vec<u8>, rev: i64) -> api::Compare {
    api::Compare {
        result: api::compare::CompareResult::Equal as i32,
        target: api::compare::CompareTarget::Create as i32,
        key,
        range_end: Vec::new(),
        target_union: Some(api::compare::TargetUnion::CreateRevision(rev)),
    }
}

/// `Compare`: the key's value equals `value` (false when the key is missing).
pub fn value_is(key: Vec<u8>, value: Vec<u8>) -> api::Compare {
    api::Compare {
        result: api::compare::CompareResult::Equal as i32,
        target: api::compare::CompareTarget::Value as i32,
        key,
        range_end: Vec::new(),
        target_union: Some(api::compare::TargetUnion::Value(value)),
    }
}

pub fn op_put(key: Vec<u8>, value: Vec<u8>, lease: i64) -> api::RequestOp {
    api::RequestOp {
        request: Some(api::request_op::Request::RequestPut(api::PutRequest {
            key,
            value,
            lease,
            ..Default::default()
        })),
    }
}

pub fn op_delete(key: Vec<u8>) -> api::RequestOp {
    api::RequestOp {
        request: Some(api::request_op::Request::RequestDeleteRange(
            api::DeleteRangeRequest {
                key,
                ..Default::default()
            },
        )),
    }
}

pub fn op_get(key: Vec<u8>) -> api::RequestOp {
    api::RequestOp {
        request: Some(api::request_op::Request::RequestRange(get(key))),
    }
}
