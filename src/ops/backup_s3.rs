//! S3-compatible backup destinations (issue #37, item 4).
//!
//! The desired state names a destination; the server maps the name to its own files, never to
//! anything the repository says: `<creds-dir>/<cluster>/backup-destinations/<name>/`
//! - `destination.yaml` (not secret, read bounded): `endpoint`, `bucket`, `prefix`, `region`,
//!   `pathStyle`, `partSizeMiB`, `attempts`;
//! - `credentials` (0600 required, read bounded): `accessKeyId`, `secretAccessKey`, optional
//!   `sessionToken`;
//! - `ca.pem` (optional): the CA bundle the endpoint's certificate is checked against (else the
//!   platform's roots).
//!
//! Objects are `<prefix><cluster>/<file>`. Requests are signed with AWS SigV4 (`rusty-s3`,
//! presigned for 15 minutes, the secret never leaves the process) and sent with a blocking
//! HTTP client (`ureq`, rustls on ring) from the blocking [`Destination`] port. A snapshot is
//! uploaded as one `PutObject` when it fits one part, else as a multipart upload (parts of
//! `partSizeMiB`, default 16 MiB). Every request is retried (bounded attempts, exponential
//! backoff) on a transport error or an answer the server means as "try again" (408, 429, 5xx).
//! After the upload the object is verified: `HeadObject` must report the size written, and the
//! object read back must hash to the sha256 computed while writing; otherwise it is deleted and
//! the backup fails.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusty_s3::{Bucket, Credentials, S3Action as _, UrlStyle};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::backup::{Destination, ObjectWriter};

/// Under a cluster's credentials directory: one directory per destination name.
pub const DESTINATIONS_DIR: &str = "backup-destinations";
/// A destination's settings (not secret).
pub const CONFIG_FILE: &str = "destination.yaml";
/// A destination's access key (0600).
pub const CREDENTIALS_FILE: &str = "credentials";
/// A destination's CA bundle (optional).
pub const CA_FILE: &str = "ca.pem";
/// Largest settings, credentials or CA file read.
pub const MAX_FILE: u64 = 64 * 1024;
/// S3's smallest part (every part but the last).
pub const MIN_PART_MIB: u64 = 5;
/// The part size unless `partSizeMiB` says otherwise.
pub const DEFAULT_PART_MIB: u64 = 16;
/// Largest part size accepted.
pub const MAX_PART_MIB: u64 = 1024;
/// S3's largest part number.
const MAX_PARTS: usize = 10_000;
/// Attempts per request unless `attempts` says otherwise.
pub const DEFAULT_ATTEMPTS: u32 = 5;
/// How long a signed request stays valid.
const SIGNED_FOR: Duration = Duration::from_secs(15 * 60);
/// Largest XML answer read (a list page of 1000 keys is a few hundred KiB).
const MAX_ANSWER: u64 = 4 * 1024 * 1024;

/// Why an S3 destination could not be set up from the server's files.
#[derive(Debug, thiserror::Error)]
pub enum S3ConfigError {
    /// A file could not be read (missing, too large, readable by others for the credentials).
    #[error("reading `{}` failed", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        err: crate::private_file::BoundedReadError,
    },
    /// A file is not the YAML expected.
    #[error("`{}` is not a valid {what}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
        /// Why.
        #[source]
        err: Box<serde_saphyr::Error>,
    },
    /// The credentials file does not parse: the file and the line, never its content (the
    /// parser's own message would quote the secret access key).
    #[error("the S3 credentials are refused")]
    Secret(#[source] crate::secret::SecretFileError),
    /// A value is out of range or malformed.
    #[error("`{}`: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong and what to write instead.
        message: String,
    },
}

/// The settings file, as written by the operator.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ConfigFile {
    /// Only `s3` today.
    kind: String,
    endpoint: String,
    bucket: String,
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    path_style: bool,
    #[serde(default)]
    part_size_mi_b: Option<u64>,
    #[serde(default)]
    attempts: Option<u32>,
}

/// The credentials file. Never printed: no `Debug`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CredentialsFile {
    access_key_id: String,
    secret_access_key: String,
    #[serde(default)]
    session_token: Option<String>,
}

/// Where an S3 destination is, read from the server's files (or built by a test).
#[derive(Debug, Clone)]
pub struct S3Config {
    /// `http(s)://host[:port]`.
    pub endpoint: url::Url,
    /// The bucket (it must exist).
    pub bucket: String,
    /// Prepended to `<cluster>/<file>`; empty or ending in `/`.
    pub prefix: String,
    /// SigV4 region (`us-east-1` unless set).
    pub region: String,
    /// `https://endpoint/bucket/key` rather than `https://bucket.endpoint/key`.
    pub path_style: bool,
    /// Bytes per multipart part.
    pub part_size: usize,
    /// Attempts per request (at least 1).
    pub attempts: u32,
    /// Wait before the second attempt; doubled for each further one, at most 5 s.
    pub first_backoff: Duration,
    /// A CA bundle (PEM) for the endpoint; `None`: the platform's roots.
    pub ca_pem: Option<Vec<u8>>,
}

/// Access key of an S3 destination.
pub struct S3Credentials {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Session token of temporary credentials.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// `<creds-dir>/<cluster>/backup-destinations/<name>/`.
pub fn destination_dir(creds_dir: &Path, cluster: &str, name: &str) -> PathBuf {
    creds_dir.join(cluster).join(DESTINATIONS_DIR).join(name)
}

fn read(
    path: &Path,
    privacy: crate::private_file::Privacy,
) -> Result<Option<Vec<u8>>, S3ConfigError> {
    use crate::private_file::BoundedReadError;
    match crate::private_file::read_bounded(path, MAX_FILE, privacy) {
        Ok(b) => Ok(Some(b)),
        Err(BoundedReadError::Open { err, .. }) if err.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(err) => Err(S3ConfigError::Read {
            path: path.to_path_buf(),
            err,
        }),
    }
}

fn parse<T: for<'de> Deserialize<'de>>(
    path: &Path,
    bytes: &[u8],
    what: &'static str,
) -> Result<T, S3ConfigError> {
    let text = std::str::from_utf8(bytes).map_err(|_| S3ConfigError::Invalid {
        path: path.to_path_buf(),
        message: "not UTF-8 text".into(),
    })?;
    serde_saphyr::from_str(text).map_err(|err| S3ConfigError::Parse {
        path: path.to_path_buf(),
        what,
        err: Box::new(err),
    })
}

impl S3Config {
    /// The settings of destination directory `dir` (see the module's doc). `Ok(None)`: `dir`
    /// has no `destination.yaml`, so the server has no destination of that name.
    pub fn load(dir: &Path) -> Result<Option<(S3Config, S3Credentials)>, S3ConfigError> {
        use crate::private_file::Privacy;
        let path = dir.join(CONFIG_FILE);
        let Some(bytes) = read(&path, Privacy::Any)? else {
            return Ok(None);
        };
        let file: ConfigFile = parse(&path, &bytes, "S3 destination (destination.yaml)")?;
        let invalid = |message: String| S3ConfigError::Invalid {
            path: path.clone(),
            message,
        };
        if file.kind != "s3" {
            return Err(invalid(format!(
                "`kind: {}` is not a destination kind this server knows; write `kind: s3`",
                file.kind
            )));
        }
        let endpoint: url::Url = file.endpoint.parse().map_err(|e| {
            invalid(format!(
                "`endpoint: {}` is not a URL ({e}); write e.g. `https://s3.eu-central-1.amazonaws.com`",
                file.endpoint
            ))
        })?;
        if !matches!(endpoint.scheme(), "http" | "https")
            || endpoint.host_str().is_none()
            || !endpoint.username().is_empty()
            || endpoint.password().is_some()
            || endpoint.query().is_some()
            || !matches!(endpoint.path(), "" | "/")
        {
            return Err(invalid(format!(
                "`endpoint: {}` must be `http(s)://host[:port]` with no path, query or user (the access key goes in `{CREDENTIALS_FILE}`)",
                file.endpoint
            )));
        }
        if file.bucket.is_empty()
            || file.bucket.len() > 63
            || !file
                .bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        {
            return Err(invalid(format!(
                "`bucket: {}` is not an S3 bucket name (3-63 lowercase letters, digits, `-`, `.`)",
                file.bucket
            )));
        }
        let prefix = file.prefix;
        if !(prefix.is_empty() || prefix.ends_with('/'))
            || prefix.starts_with('/')
            || prefix.contains("//")
        {
            return Err(invalid(format!(
                "`prefix: {prefix}` must be empty or a relative key prefix ending in `/` (e.g. `medea/`)"
            )));
        }
        let part_mib = file.part_size_mi_b.unwrap_or(DEFAULT_PART_MIB);
        if !(MIN_PART_MIB..=MAX_PART_MIB).contains(&part_mib) {
            return Err(invalid(format!(
                "`partSizeMiB: {part_mib}` is outside {MIN_PART_MIB}..={MAX_PART_MIB} (S3 refuses parts under 5 MiB)"
            )));
        }
        let attempts = file.attempts.unwrap_or(DEFAULT_ATTEMPTS);
        if !(1..=20).contains(&attempts) {
            return Err(invalid(format!("`attempts: {attempts}` is outside 1..=20")));
        }
        let cred_path = dir.join(CREDENTIALS_FILE);
        let Some(cred_bytes) = read(&cred_path, Privacy::Private)? else {
            return Err(S3ConfigError::Invalid {
                path: cred_path,
                message: format!(
                    "missing: write `accessKeyId: …` and `secretAccessKey: …` there, mode 0600, beside `{CONFIG_FILE}`"
                ),
            });
        };
        let creds: CredentialsFile = crate::secret::parse_yaml(
            &cred_path,
            &cred_bytes,
            "S3 credentials file",
            &["accessKeyId", "secretAccessKey", "sessionToken"],
        )
        .map_err(S3ConfigError::Secret)?;
        if creds.access_key_id.is_empty() || creds.secret_access_key.is_empty() {
            return Err(S3ConfigError::Invalid {
                path: cred_path,
                message: "`accessKeyId` and `secretAccessKey` must not be empty".into(),
            });
        }
        let ca_pem = read(&dir.join(CA_FILE), Privacy::Any)?;
        Ok(Some((
            S3Config {
                endpoint,
                bucket: file.bucket,
                prefix,
                region: file.region.unwrap_or_else(|| "us-east-1".into()),
                path_style: file.path_style,
                part_size: usize::try_from(part_mib * 1024 * 1024).unwrap_or(usize::MAX),
                attempts,
                first_backoff: Duration::from_millis(200),
                ca_pem,
            },
            S3Credentials {
                access_key_id: creds.access_key_id,
                secret_access_key: creds.secret_access_key,
                session_token: creds.session_token,
            },
        )))
    }
}

/// An S3 request that failed, after its attempts.
#[derive(Debug, thiserror::Error)]
pub enum S3RequestError {
    /// No answer (connect, TLS, timeout, broken connection).
    #[error("{op} `{target}` at {endpoint}: no answer after {attempts} attempt(s)")]
    Transport {
        /// The S3 operation.
        op: &'static str,
        /// Bucket and key.
        target: String,
        /// The endpoint (no path, query or signature).
        endpoint: String,
        /// Attempts made.
        attempts: u32,
        /// The last error.
        #[source]
        err: Box<ureq::Error>,
    },
    /// The server answered with an error.
    #[error("{op} `{target}` at {endpoint}: HTTP {status} after {attempts} attempt(s): {detail}")]
    Status {
        /// The S3 operation.
        op: &'static str,
        /// Bucket and key.
        target: String,
        /// The endpoint.
        endpoint: String,
        /// Attempts made.
        attempts: u32,
        /// HTTP status.
        status: u16,
        /// The S3 error code and message, if the body had them.
        detail: String,
    },
    /// The answer was not what S3 sends.
    #[error("{op} `{target}` at {endpoint}: unexpected answer: {detail}")]
    Answer {
        /// The S3 operation.
        op: &'static str,
        /// Bucket and key.
        target: String,
        /// The endpoint.
        endpoint: String,
        /// What was wrong.
        detail: String,
    },
    /// The uploaded object does not read back as written.
    #[error("`{target}` at {endpoint} did not verify after upload: {detail}; it was deleted")]
    Verify {
        /// Bucket and key.
        target: String,
        /// The endpoint.
        endpoint: String,
        /// What differed.
        detail: String,
    },
}

impl From<S3RequestError> for std::io::Error {
    fn from(e: S3RequestError) -> std::io::Error {
        std::io::Error::other(e)
    }
}

/// An answer, body read (bounded).
struct Reply {
    status: u16,
    headers: ureq::http::HeaderMap,
    body: Vec<u8>,
}

/// The `<Code>` and `<Message>` of an S3 error body, if any.
fn error_detail(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let tag = |t: &str| {
        let open = format!("<{t}>");
        let close = format!("</{t}>");
        let start = text.find(&open)? + open.len();
        let end = text[start..].find(&close)? + start;
        Some(text[start..end].to_string())
    };
    match (tag("Code"), tag("Message")) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c,
        _ => "no S3 error code".into(),
    }
}

/// Why one attempt of an S3 request failed.
enum Failed {
    /// The server answered with an error status (`retry`: one worth another attempt).
    Status {
        status: u16,
        detail: String,
        retry: bool,
    },
    /// No answer.
    Transport(Box<ureq::Error>),
    /// Not worth another attempt, and already the request's error.
    Final(S3RequestError),
}

impl Failed {
    fn retry(&self) -> bool {
        match self {
            Failed::Status { retry, .. } => *retry,
            Failed::Transport(_) => true,
            Failed::Final(_) => false,
        }
    }
}

fn retryable(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504)
}

/// One S3-compatible destination of one cluster.
pub struct S3Destination {
    name: String,
    bucket: Bucket,
    creds: Credentials,
    /// `<prefix><cluster>/`.
    base: String,
    endpoint: String,
    agent: ureq::Agent,
    part_size: usize,
    attempts: u32,
    first_backoff: Duration,
}

impl S3Destination {
    /// The destination `name` of `cluster` at `config`.
    pub fn new(
        name: &str,
        cluster: &str,
        config: S3Config,
        credentials: S3Credentials,
    ) -> Result<S3Destination, S3ConfigError> {
        let invalid = |message: String| S3ConfigError::Invalid {
            path: PathBuf::from(CONFIG_FILE),
            message,
        };
        let style = if config.path_style {
            UrlStyle::Path
        } else {
            UrlStyle::VirtualHost
        };
        let bucket = Bucket::new(
            config.endpoint.clone(),
            style,
            config.bucket.clone(),
            config.region.clone(),
        )
        .map_err(|e| invalid(format!("endpoint `{}`: {e}", config.endpoint)))?;
        let creds = match config_token(&credentials) {
            Some(token) => Credentials::new_with_token(
                credentials.access_key_id.clone(),
                credentials.secret_access_key.clone(),
                token,
            ),
            None => Credentials::new(
                credentials.access_key_id.clone(),
                credentials.secret_access_key.clone(),
            ),
        };
        let roots = match &config.ca_pem {
            Some(pem) => {
                let certs: Vec<_> = ureq::tls::parse_pem(pem)
                    .filter_map(|item| match item {
                        Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                        _ => None,
                    })
                    .collect();
                if certs.is_empty() {
                    return Err(S3ConfigError::Invalid {
                        path: PathBuf::from(CA_FILE),
                        message: "holds no PEM certificate".into(),
                    });
                }
                ureq::tls::RootCerts::Specific(Arc::new(certs))
            }
            None => ureq::tls::RootCerts::PlatformVerifier,
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            // No byte for a minute (a part is sent or read in well under that on a live link).
            .timeout_recv_response(Some(Duration::from_secs(60)))
            // A whole part sent, or a whole object read back, within an hour: a stalled
            // connection fails the backup instead of holding the schedule forever.
            .timeout_send_body(Some(Duration::from_secs(3600)))
            .timeout_recv_body(Some(Duration::from_secs(3600)))
            .tls_config(ureq::tls::TlsConfig::builder().root_certs(roots).build())
            .user_agent(concat!("medea/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(S3Destination {
            name: name.to_string(),
            bucket,
            creds,
            base: format!("{}{cluster}/", config.prefix),
            endpoint: format!(
                "{}://{}",
                config.endpoint.scheme(),
                config.endpoint.host_str().unwrap_or_default()
            ) + &config
                .endpoint
                .port()
                .map(|p| format!(":{p}"))
                .unwrap_or_default(),
            agent,
            part_size: config.part_size.max(1),
            attempts: config.attempts.max(1),
            first_backoff: config.first_backoff,
        })
    }

    /// The object key of `file`.
    pub fn key(&self, file: &str) -> String {
        format!("{}{file}", self.base)
    }

    fn checked(&self, file: &str) -> std::io::Result<String> {
        if file.is_empty() || file.starts_with('.') || file.contains('/') || file.contains('\0') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("`{file}` is not a backup file name"),
            ));
        }
        Ok(self.key(file))
    }

    fn target(&self, key: &str) -> String {
        format!("{}/{key}", self.bucket.name())
    }

    /// The delays between a request's attempts: exponential from `first_backoff`, doubling,
    /// at most 5 s apart, `attempts` tries in all (`backon`, blocking: the caller runs on a
    /// blocking thread).
    fn backoff(&self) -> backon::ExponentialBuilder {
        backon::ExponentialBuilder::default()
            .with_min_delay(self.first_backoff)
            .with_factor(2.0)
            .with_max_delay(Duration::from_secs(5))
            .with_max_times(usize::try_from(self.attempts.saturating_sub(1)).unwrap_or(usize::MAX))
    }

    /// The error of a request that failed after `attempts` attempts.
    fn failed(&self, op: &'static str, key: &str, attempts: u32, f: Failed) -> S3RequestError {
        match f {
            Failed::Status { status, detail, .. } => S3RequestError::Status {
                op,
                target: self.target(key),
                endpoint: self.endpoint.clone(),
                attempts,
                status,
                detail,
            },
            Failed::Transport(err) => S3RequestError::Transport {
                op,
                target: self.target(key),
                endpoint: self.endpoint.clone(),
                attempts,
                err,
            },
            Failed::Final(e) => e,
        }
    }

    /// Send one request (signed anew for each attempt by `sign`), retrying transport errors
    /// and 408/429/5xx answers with exponential backoff ([`Self::backoff`]). Any other answer
    /// is returned.
    fn send(
        &self,
        op: &'static str,
        key: &str,
        sign: &dyn Fn() -> (ureq::http::Method, url::Url, Vec<(String, String)>),
        body: Option<&[u8]>,
    ) -> Result<Reply, S3RequestError> {
        use backon::BlockingRetryable as _;
        let attempts = std::cell::Cell::new(0u32);
        let once = || -> Result<Reply, Failed> {
            attempts.set(attempts.get() + 1);
            let (method, url, headers) = sign();
            let mut req = ureq::http::Request::builder()
                .method(method)
                .uri(url.as_str());
            for (k, v) in &headers {
                req = req.header(k.as_str(), v.as_str());
            }
            let req = req.body(body.unwrap_or_default()).map_err(|e| {
                Failed::Final(S3RequestError::Answer {
                    op,
                    target: self.target(key),
                    endpoint: self.endpoint.clone(),
                    detail: format!("the request could not be built: {e}"),
                })
            })?;
            let mut resp = self
                .agent
                .run(req)
                .map_err(|e| Failed::Transport(Box::new(e)))?;
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            match resp
                .body_mut()
                .with_config()
                .limit(MAX_ANSWER)
                .read_to_vec()
            {
                Ok(body) if !retryable(status) => Ok(Reply {
                    status,
                    headers,
                    body,
                }),
                body => Err(Failed::Status {
                    status,
                    detail: body
                        .map(|b| error_detail(&b))
                        .unwrap_or_else(|e| format!("the body could not be read: {e}")),
                    retry: true,
                }),
            }
        };
        once.retry(self.backoff())
            .sleep(std::thread::sleep)
            .when(Failed::retry)
            .notify(|f, _| match f {
                Failed::Status { status, .. } => tracing::debug!(
                    op,
                    key,
                    status,
                    attempt = attempts.get(),
                    "backup: S3 request failed; retrying"
                ),
                Failed::Transport(err) => {
                    tracing::debug!(op, key, error = %crate::error_chain(err), attempt = attempts.get(), "backup: S3 request failed; retrying");
                }
                Failed::Final(_) => {}
            })
            .call()
            .map_err(|f| self.failed(op, key, attempts.get(), f))
    }

    fn expect(&self, op: &'static str, key: &str, reply: Reply) -> Result<Reply, S3RequestError> {
        if (200..300).contains(&reply.status) {
            Ok(reply)
        } else {
            Err(S3RequestError::Status {
                op,
                target: self.target(key),
                endpoint: self.endpoint.clone(),
                attempts: 1,
                status: reply.status,
                detail: error_detail(&reply.body),
            })
        }
    }

    fn put(&self, key: &str, body: &[u8]) -> Result<(), S3RequestError> {
        let reply = self.send(
            "PutObject",
            key,
            &|| {
                let a = self.bucket.put_object(Some(&self.creds), key);
                (ureq::http::Method::PUT, a.sign(SIGNED_FOR), Vec::new())
            },
            Some(body),
        )?;
        self.expect("PutObject", key, reply).map(drop)
    }

    /// The object's size, `None` when it does not exist.
    fn head(&self, key: &str) -> Result<Option<u64>, S3RequestError> {
        let reply = self.send(
            "HeadObject",
            key,
            &|| {
                let a = self.bucket.head_object(Some(&self.creds), key);
                (ureq::http::Method::HEAD, a.sign(SIGNED_FOR), Vec::new())
            },
            None,
        )?;
        if reply.status == 404 {
            return Ok(None);
        }
        let reply = self.expect("HeadObject", key, reply)?;
        reply
            .headers
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .map(Some)
            .ok_or_else(|| S3RequestError::Answer {
                op: "HeadObject",
                target: self.target(key),
                endpoint: self.endpoint.clone(),
                detail: "no Content-Length".into(),
            })
    }

    fn delete_key(&self, key: &str) -> Result<(), S3RequestError> {
        let reply = self.send(
            "DeleteObject",
            key,
            &|| {
                let a = self.bucket.delete_object(Some(&self.creds), key);
                (ureq::http::Method::DELETE, a.sign(SIGNED_FOR), Vec::new())
            },
            None,
        )?;
        if reply.status == 404 {
            return Ok(());
        }
        self.expect("DeleteObject", key, reply).map(drop)
    }

    /// A GET of `key`, streaming (the first byte retried like any request, not the rest).
    fn get(&self, key: &str) -> Result<Box<dyn Read + Send>, S3RequestError> {
        use backon::BlockingRetryable as _;
        let attempts = std::cell::Cell::new(0u32);
        let once = || -> Result<Box<dyn Read + Send>, Failed> {
            attempts.set(attempts.get() + 1);
            let url = self
                .bucket
                .get_object(Some(&self.creds), key)
                .sign(SIGNED_FOR);
            let resp = self
                .agent
                .get(url.as_str())
                .call()
                .map_err(|e| Failed::Transport(Box::new(e)))?;
            let status = resp.status().as_u16();
            if resp.status().is_success() {
                let body = resp.into_body().into_with_config().limit(u64::MAX);
                return Ok(Box::new(body.reader()));
            }
            let detail = resp
                .into_body()
                .with_config()
                .limit(MAX_ANSWER)
                .read_to_vec()
                .map(|b| error_detail(&b))
                .unwrap_or_default();
            Err(Failed::Status {
                status,
                detail,
                retry: retryable(status),
            })
        };
        once.retry(self.backoff())
            .sleep(std::thread::sleep)
            .when(Failed::retry)
            .call()
            .map_err(|f| self.failed("GetObject", key, attempts.get(), f))
    }

    /// HEAD must report `size`, and the object read back must hash to `sha256`.
    fn verify(&self, key: &str, size: u64, sha256: &[u8]) -> Result<(), S3RequestError> {
        let bad = |detail: String| S3RequestError::Verify {
            target: self.target(key),
            endpoint: self.endpoint.clone(),
            detail,
        };
        match self.head(key)? {
            None => return Err(bad("it is not there".into())),
            Some(n) if n != size => {
                return Err(bad(format!("HEAD says {n} bytes, {size} were written")));
            }
            Some(_) => {}
        }
        let mut r = self.get(key)?;
        let mut hash = Sha256::new();
        let mut n = 0u64;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let k = r
                .read(&mut buf)
                .map_err(|e| bad(format!("reading it back failed: {e}")))?;
            if k == 0 {
                break;
            }
            hash.update(&buf[..k]);
            n += k as u64;
        }
        if n != size {
            return Err(bad(format!("read back {n} bytes, {size} were written")));
        }
        if hash.finalize().as_slice() != sha256 {
            return Err(bad("its sha256 differs from the one written".into()));
        }
        Ok(())
    }
}

fn config_token(c: &S3Credentials) -> Option<String> {
    c.session_token.clone().filter(|t| !t.is_empty())
}

/// A backup being uploaded: a part is buffered in memory, sent when full.
struct S3Writer {
    dest: Arc<S3Inner>,
    key: String,
    buf: Vec<u8>,
    upload: Option<String>,
    etags: Vec<String>,
    hash: Sha256,
    size: u64,
    done: bool,
}

/// What an [`S3Writer`] shares with its destination.
struct S3Inner(S3Destination);

impl S3Writer {
    fn send_part(&mut self) -> Result<(), S3RequestError> {
        let dest = self.dest.clone();
        let d = &dest.0;
        let key = self.key.clone();
        if self.etags.len() >= MAX_PARTS {
            return Err(S3RequestError::Answer {
                op: "UploadPart",
                target: d.target(&key),
                endpoint: d.endpoint.clone(),
                detail: format!("more than {MAX_PARTS} parts: raise partSizeMiB"),
            });
        }
        let upload = match &self.upload {
            Some(u) => u.clone(),
            None => {
                let reply = d.send(
                    "CreateMultipartUpload",
                    &key,
                    &|| {
                        let a = d.bucket.create_multipart_upload(Some(&d.creds), &key);
                        (ureq::http::Method::POST, a.sign(SIGNED_FOR), Vec::new())
                    },
                    None,
                )?;
                let reply = d.expect("CreateMultipartUpload", &key, reply)?;
                let text = String::from_utf8_lossy(&reply.body);
                let parsed = rusty_s3::actions::CreateMultipartUpload::parse_response(&text)
                    .map_err(|e| S3RequestError::Answer {
                        op: "CreateMultipartUpload",
                        target: d.target(&key),
                        endpoint: d.endpoint.clone(),
                        detail: e.to_string(),
                    })?;
                let id = parsed.upload_id().to_string();
                self.upload = Some(id.clone());
                id
            }
        };
        let number = u16::try_from(self.etags.len() + 1).unwrap_or(u16::MAX);
        let reply = d.send(
            "UploadPart",
            &key,
            &|| {
                let a = d.bucket.upload_part(Some(&d.creds), &key, number, &upload);
                (ureq::http::Method::PUT, a.sign(SIGNED_FOR), Vec::new())
            },
            Some(&self.buf),
        )?;
        let reply = d.expect("UploadPart", &key, reply)?;
        let etag = reply
            .headers
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| S3RequestError::Answer {
                op: "UploadPart",
                target: d.target(&key),
                endpoint: d.endpoint.clone(),
                detail: "no ETag".into(),
            })?
            .to_string();
        self.etags.push(etag);
        self.buf.clear();
        Ok(())
    }

    fn finish(&mut self) -> Result<(), S3RequestError> {
        let dest = self.dest.clone();
        let d = &dest.0;
        let key = self.key.clone();
        match self.upload.clone() {
            None => d.put(&key, &self.buf)?,
            Some(upload) => {
                if !self.buf.is_empty() {
                    self.send_part()?;
                }
                let etags = self.etags.clone();
                let reply = d.send(
                    "CompleteMultipartUpload",
                    &key,
                    &|| {
                        let a = d.bucket.complete_multipart_upload(
                            Some(&d.creds),
                            &key,
                            &upload,
                            etags.iter().map(String::as_str),
                        );
                        (ureq::http::Method::POST, a.sign(SIGNED_FOR), Vec::new())
                    },
                    Some(
                        rusty_s3::actions::CompleteMultipartUpload::new(
                            &d.bucket,
                            Some(&d.creds),
                            &key,
                            &upload,
                            etags.iter().map(String::as_str),
                        )
                        .body()
                        .as_bytes(),
                    ),
                )?;
                let reply = d.expect("CompleteMultipartUpload", &key, reply)?;
                // S3 may answer 200 with an error in the body.
                if String::from_utf8_lossy(&reply.body).contains("<Error>") {
                    return Err(S3RequestError::Status {
                        op: "CompleteMultipartUpload",
                        target: d.target(&key),
                        endpoint: d.endpoint.clone(),
                        attempts: 1,
                        status: reply.status,
                        detail: error_detail(&reply.body),
                    });
                }
            }
        }
        let sha = self.hash.clone().finalize();
        if let Err(e) = d.verify(&key, self.size, &sha) {
            let _ = d.delete_key(&key);
            return Err(e);
        }
        Ok(())
    }

    fn abort_upload(&mut self) {
        let dest = self.dest.clone();
        let d = &dest.0;
        if let Some(upload) = self.upload.take() {
            let key = self.key.clone();
            let _ = d.send(
                "AbortMultipartUpload",
                &key,
                &|| {
                    let a = d
                        .bucket
                        .abort_multipart_upload(Some(&d.creds), &key, &upload);
                    (ureq::http::Method::DELETE, a.sign(SIGNED_FOR), Vec::new())
                },
                None,
            );
        }
    }
}

impl Write for S3Writer {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let room = self.dest.0.part_size - self.buf.len();
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        self.hash.update(&data[..n]);
        self.size += n as u64;
        if self.buf.len() >= self.dest.0.part_size {
            self.send_part()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ObjectWriter for S3Writer {
    fn commit(mut self: Box<Self>) -> std::io::Result<()> {
        self.done = true;
        match self.finish() {
            Ok(()) => Ok(()),
            Err(e) => {
                self.abort_upload();
                Err(e.into())
            }
        }
    }
    fn abort(mut self: Box<Self>) {
        self.done = true;
        self.abort_upload();
    }
}

impl Drop for S3Writer {
    fn drop(&mut self) {
        if !self.done {
            self.abort_upload();
        }
    }
}

/// A cheap handle on one destination: writers share it.
pub struct S3 {
    inner: Arc<S3Inner>,
}

impl S3 {
    /// The destination `name` of `cluster` at `config`.
    pub fn new(
        name: &str,
        cluster: &str,
        config: S3Config,
        credentials: S3Credentials,
    ) -> Result<S3, S3ConfigError> {
        Ok(S3 {
            inner: Arc::new(S3Inner(S3Destination::new(
                name,
                cluster,
                config,
                credentials,
            )?)),
        })
    }
    /// The object key of `file`.
    pub fn key(&self, file: &str) -> String {
        self.inner.0.key(file)
    }
}

impl Destination for S3 {
    fn name(&self) -> &str {
        &self.inner.0.name
    }
    fn create(&self, file: &str) -> std::io::Result<Box<dyn ObjectWriter>> {
        let d = &self.inner.0;
        let key = d.checked(file)?;
        if d.head(&key)?.is_some() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("`{}` already exists", d.target(&key)),
            ));
        }
        Ok(Box::new(S3Writer {
            dest: self.inner.clone(),
            key,
            buf: Vec::with_capacity(d.part_size.min(64 * 1024 * 1024)),
            upload: None,
            etags: Vec::new(),
            hash: Sha256::new(),
            size: 0,
            done: false,
        }))
    }
    fn list(&self) -> std::io::Result<Vec<String>> {
        let d = &self.inner.0;
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let reply = d.send(
                "ListObjectsV2",
                &d.base,
                &|| {
                    let mut a = d.bucket.list_objects_v2(Some(&d.creds));
                    a.with_prefix(d.base.as_str());
                    if let Some(t) = &token {
                        a.with_continuation_token(t.as_str());
                    }
                    (ureq::http::Method::GET, a.sign(SIGNED_FOR), Vec::new())
                },
                None,
            )?;
            let reply = d.expect("ListObjectsV2", &d.base, reply)?;
            let text = String::from_utf8_lossy(&reply.body);
            let page = rusty_s3::actions::ListObjectsV2::parse_response(&text).map_err(|e| {
                S3RequestError::Answer {
                    op: "ListObjectsV2",
                    target: d.target(&d.base),
                    endpoint: d.endpoint.clone(),
                    detail: e.to_string(),
                }
            })?;
            for c in page.contents {
                if let Some(name) = c.key.strip_prefix(&d.base)
                    && !name.is_empty()
                    && !name.contains('/')
                    && !name.starts_with('.')
                {
                    out.push(name.to_string());
                }
            }
            match page.next_continuation_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => break,
            }
        }
        out.sort();
        Ok(out)
    }
    fn exists(&self, file: &str) -> std::io::Result<bool> {
        let d = &self.inner.0;
        let key = d.checked(file)?;
        Ok(d.head(&key)?.is_some())
    }
    fn open(&self, file: &str) -> std::io::Result<Box<dyn Read + Send>> {
        let d = &self.inner.0;
        let key = d.checked(file)?;
        Ok(d.get(&key)?)
    }
    fn delete(&self, file: &str) -> std::io::Result<()> {
        let d = &self.inner.0;
        let key = d.checked(file)?;
        Ok(d.delete_key(&key)?)
    }
}
