//! A small HTTP(S) client for the health sources: one request, bounded in time and size,
//! with the source's credential (a bearer token and/or a CA bundle, [`Credentials`]) read at
//! the moment of the request (tokens rotate). Neither the token nor the files' contents are
//! ever logged or put into an error.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;

use crate::plan::health::Endpoint;

/// Largest answer read from a source.
pub const MAX_BODY: usize = 8 * 1024 * 1024;

/// Why a request to a source failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(
        "the source names credential `{name}`, but medea has no credentials for it here (a source only the unapproved desired state names is asked without credentials)"
    )]
    NoCredentials { name: String },
    #[error("`{name}` is not a credential name (a DNS label)")]
    CredentialName { name: String },
    #[error(
        "credential `{name}` has neither `token` nor `ca.pem` in `{}`",
        dir.display()
    )]
    CredentialMissing { name: String, dir: PathBuf },
    #[error("cannot read credential `{name}`")]
    CredentialFile {
        name: String,
        #[source]
        err: crate::private_file::BoundedReadError,
    },
    #[error("reading credential `{name}` failed")]
    CredentialTask {
        name: String,
        #[source]
        err: tokio::task::JoinError,
    },
    #[error(
        "credential `{name}` holds a bearer token and {url} is plain http://: medea never sends a token in clear"
    )]
    TokenOverHttp { name: String, url: String },
    #[error("the CA file `{}` holds no PEM certificate", path.display())]
    CaEmpty { path: PathBuf },
    #[error("the CA file `{}` has a certificate rustls refuses", path.display())]
    CaInvalid {
        path: PathBuf,
        #[source]
        err: rustls::Error,
    },
    #[error("the bearer token file `{}` is empty or not a valid header value", path.display())]
    TokenInvalid { path: PathBuf },
    #[error(
        "no TLS root certificates on this machine (give the source a credential with `ca.pem`)"
    )]
    NativeRoots {
        #[source]
        err: std::io::Error,
    },
    #[error("TLS setup failed")]
    Tls {
        #[source]
        err: rustls::Error,
    },
    #[error("`{url}` is not a valid request URL")]
    Url {
        url: String,
        #[source]
        err: hyper::http::Error,
    },
    #[error("request to {url} failed")]
    Request {
        url: String,
        #[source]
        err: hyper_util::client::legacy::Error,
    },
    #[error("no answer from {url} within {}", crate::desired::model::format_duration(*after))]
    Timeout { url: String, after: Duration },
    #[error("reading the answer of {url} failed (or it is larger than {} MiB)", MAX_BODY / (1024 * 1024))]
    Body {
        url: String,
        #[source]
        err: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// An answer: status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

type Connector = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// Largest token or CA file medea reads for a credential.
pub const MAX_CREDENTIAL_FILE: u64 = 64 * 1024;
/// A credential's bearer token, in its directory.
pub const TOKEN_FILE: &str = "token";
/// A credential's CA bundle (PEM), in its directory.
pub const CA_FILE: &str = "ca.pem";

/// Where the server keeps the credentials health sources name, for one cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Credentials {
    /// `<creds-dir>/<cluster>/health`: credential `<name>` is `<dir>/<name>/{token,ca.pem}`.
    Dir(PathBuf),
    /// None: a source that names a credential is refused, and no token is ever sent (what
    /// `medea doctor` uses for sources the last-applied state does not name).
    #[default]
    None,
}

/// A credential's files, read.
struct Material {
    token: Option<hyper::header::HeaderValue>,
    ca: Option<(PathBuf, Vec<u8>)>,
}

/// `path` read with [`crate::private_file::read_bounded`]; `None` when it does not exist.
fn optional(
    name: &str,
    path: &std::path::Path,
    privacy: crate::private_file::Privacy,
) -> Result<Option<Vec<u8>>, HttpError> {
    use crate::private_file::BoundedReadError;
    match crate::private_file::read_bounded(path, MAX_CREDENTIAL_FILE, privacy) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(BoundedReadError::Open { err, .. }) if err.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(err) => Err(HttpError::CredentialFile {
            name: name.to_string(),
            err,
        }),
    }
}

impl Credentials {
    /// The credential `endpoint` names, read now (off the async threads; the caller bounds
    /// the time). No credential: nothing. A token is never paired with an `http://` URL.
    async fn material(&self, endpoint: &Endpoint) -> Result<Material, HttpError> {
        let Some(name) = &endpoint.credential else {
            return Ok(Material {
                token: None,
                ca: None,
            });
        };
        if !crate::desired::validate::is_dns_label(name) {
            return Err(HttpError::CredentialName { name: name.clone() });
        }
        let Credentials::Dir(root) = self else {
            return Err(HttpError::NoCredentials { name: name.clone() });
        };
        let dir = root.join(name);
        let (n, d) = (name.clone(), dir.clone());
        let (token, ca) = tokio::task::spawn_blocking(move || {
            let token = optional(
                &n,
                &d.join(TOKEN_FILE),
                crate::private_file::Privacy::Private,
            )?;
            let ca = optional(&n, &d.join(CA_FILE), crate::private_file::Privacy::Any)?;
            Ok::<_, HttpError>((token, ca))
        })
        .await
        .map_err(|err| HttpError::CredentialTask {
            name: name.clone(),
            err,
        })??;
        if token.is_none() && ca.is_none() {
            return Err(HttpError::CredentialMissing {
                name: name.clone(),
                dir,
            });
        }
        let token = match token {
            None => None,
            Some(raw) => {
                let path = dir.join(TOKEN_FILE);
                if endpoint.url.starts_with("http://") {
                    return Err(HttpError::TokenOverHttp {
                        name: name.clone(),
                        url: endpoint.url.clone(),
                    });
                }
                let text = std::str::from_utf8(&raw)
                    .map_err(|_| HttpError::TokenInvalid { path: path.clone() })?;
                let token = text.trim();
                if token.is_empty() {
                    return Err(HttpError::TokenInvalid { path });
                }
                let mut value = hyper::header::HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|_| HttpError::TokenInvalid { path })?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(Material {
            token,
            ca: ca.map(|bytes| (dir.join(CA_FILE), bytes)),
        })
    }
}

fn connector(ca: Option<(PathBuf, Vec<u8>)>, timeout: Duration) -> Result<Connector, HttpError> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(timeout));
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = match ca {
        Some((path, pem)) => {
            let mut roots = rustls::RootCertStore::empty();
            use rustls::pki_types::pem::PemObject;
            for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem).flatten() {
                roots.add(cert).map_err(|err| HttpError::CaInvalid {
                    path: path.clone(),
                    err,
                })?;
            }
            if roots.is_empty() {
                return Err(HttpError::CaEmpty { path });
            }
            let config = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|err| HttpError::Tls { err })?
            .with_root_certificates(roots)
            .with_no_client_auth();
            builder.with_tls_config(config)
        }
        None => builder
            .with_native_roots()
            .map_err(|err| HttpError::NativeRoots { err })?,
    };
    Ok(builder.https_or_http().enable_http1().wrap_connector(http))
}

/// Send one request to `endpoint.url` + `path_and_query`: a GET, or a form POST when `form`
/// is given, with the credential the endpoint names from `credentials`. The whole exchange
/// (reading the credential, connect, TLS, answer, body) is bounded by `timeout`.
pub async fn send(
    endpoint: &Endpoint,
    credentials: &Credentials,
    path_and_query: &str,
    form: Option<String>,
    timeout: Duration,
) -> Result<Answer, HttpError> {
    let request = match form {
        Some(f) => Request::Post {
            content_type: "application/x-www-form-urlencoded",
            body: f,
        },
        None => Request::Get,
    };
    exchange(endpoint, credentials, request, path_and_query, timeout).await
}

/// The method (and body) of one request to a source.
#[derive(Debug, Clone)]
pub enum Request {
    /// `GET`.
    Get,
    /// `POST` of `body`, typed `content_type`.
    Post {
        content_type: &'static str,
        body: String,
    },
    /// `DELETE`.
    Delete,
}

/// One request to `endpoint.url` + `path_and_query`, as [`send`] (same credential, bounds and
/// errors) with any [`Request`].
pub async fn exchange(
    endpoint: &Endpoint,
    credentials: &Credentials,
    request: Request,
    path_and_query: &str,
    timeout: Duration,
) -> Result<Answer, HttpError> {
    let url = format!("{}{path_and_query}", endpoint.url);
    let work = async {
        let material = credentials.material(endpoint).await?;
        let connector = connector(material.ca, timeout)?;
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build::<_, Full<Bytes>>(connector);
        let (builder, body) = match &request {
            Request::Get => (hyper::Request::get(url.as_str()), String::new()),
            Request::Post { content_type, body } => (
                hyper::Request::post(url.as_str()).header("content-type", *content_type),
                body.clone(),
            ),
            Request::Delete => (hyper::Request::delete(url.as_str()), String::new()),
        };
        let mut req = builder
            .header("accept", "application/json")
            .header("user-agent", concat!("medea/", env!("CARGO_PKG_VERSION")));
        if let Some(token) = material.token {
            req = req.header(hyper::header::AUTHORIZATION, token);
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|err| HttpError::Url {
                url: url.clone(),
                err,
            })?;
        let resp = client
            .request(req)
            .await
            .map_err(|err| HttpError::Request {
                url: url.clone(),
                err,
            })?;
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|err| HttpError::Body {
                url: url.clone(),
                err,
            })?
            .to_bytes();
        Ok(Answer { status, body })
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(HttpError::Timeout {
            url: url.clone(),
            after: timeout,
        }),
    }
}

/// `application/x-www-form-urlencoded` / query-string encoding of one value.
pub fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 3 / 2);
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A short, one-line excerpt of an error body for a detail (at most 300 characters).
pub fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let t = one_line.trim();
    if t.chars().count() > 300 {
        let cut: String = t.chars().take(300).collect();
        format!("{cut}…")
    } else {
        t.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encoding() {
        assert_eq!(encode("up == 1"), "up%20%3D%3D%201");
        assert_eq!(
            encode(r#"severity="critical""#),
            "severity%3D%22critical%22"
        );
        assert_eq!(encode("a~b.c_d-e"), "a~b.c_d-e");
        assert_eq!(encode("é"), "%C3%A9");
    }

    #[test]
    fn excerpts_are_one_bounded_line() {
        assert_eq!(excerpt(b"bad\ngateway\n"), "bad gateway");
        let long = vec![b'x'; 1000];
        assert_eq!(excerpt(&long).chars().count(), 301);
    }
}
