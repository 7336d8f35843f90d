//! talosconfig: the client configuration talosctl uses (`~/.talos/config`).
//!
//! Format (upstream `pkg/machinery/client/config/config.go`):
//!
//! ```yaml
//! context: mycluster
//! contexts:
//!   mycluster:
//!     endpoints: [10.0.0.2, cp.example.com:50000]
//!     nodes: [10.0.0.5]
//!     ca: <base64 of PEM CA certificate(s)>
//!     crt: <base64 of PEM client certificate>
//!     key: <base64 of PEM client key, "ED25519 PRIVATE KEY" PKCS#8>
//! ```
//!
//! Parsing decodes and checks everything a connection needs, so a bad file fails here with the
//! context and field named, not later inside a TLS handshake.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use rustls::SignatureAlgorithm;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

/// The Talos API port, used when an endpoint has none.
pub const DEFAULT_PORT: u16 = 50000;

use crate::secret::Secret;

/// Why a talosconfig could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TalosConfigError {
    #[error("failed to read talosconfig `{path}`")]
    Read {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    /// Only the position: the parser's own error quotes the input, which holds the client key.
    #[error("talosconfig `{path}` is not valid YAML in the talosconfig format{}", position(*line, *column))]
    Parse {
        path: PathBuf,
        line: Option<u64>,
        column: Option<u64>,
    },
    #[error(
        "talosconfig `{path}` has no current context and none was given; pick one with --context (available: {})",
        list(available)
    )]
    NoContext {
        path: PathBuf,
        available: Vec<String>,
    },
    #[error(
        "context `{context}` not found in talosconfig `{path}` (available: {}); check --context or the file's `context:` key",
        list(available)
    )]
    MissingContext {
        path: PathBuf,
        context: String,
        available: Vec<String>,
    },
    #[error(
        "context `{context}` in `{path}` has no endpoints; add the node IPs under `endpoints:`"
    )]
    NoEndpoints { path: PathBuf, context: String },
    #[error(
        "context `{context}` in `{path}`: endpoint `{endpoint}` is not a host or host:port ({reason})"
    )]
    BadEndpoint {
        path: PathBuf,
        context: String,
        endpoint: String,
        reason: &'static str,
    },
    #[error(
        "context `{context}` in `{path}` has no `{field}`; medea needs the CA, client certificate and key"
    )]
    MissingField {
        path: PathBuf,
        context: String,
        field: &'static str,
    },
    #[error(
        "context `{context}` in `{path}`: `{field}` is not valid base64 (standard alphabet, as talosctl writes it)"
    )]
    /// No source: base64's error names the offending byte and its offset in the key.
    Base64 {
        path: PathBuf,
        context: String,
        field: &'static str,
    },
    #[error("context `{context}` in `{path}`: `{field}` does not contain a PEM certificate")]
    NoCertificate {
        path: PathBuf,
        context: String,
        field: &'static str,
    },
    #[error(
        "context `{context}` in `{path}`: `key` does not contain a PEM private key (expected `ED25519 PRIVATE KEY`, `PRIVATE KEY`, `EC PRIVATE KEY` or `RSA PRIVATE KEY`)"
    )]
    NoKey { path: PathBuf, context: String },
    #[error(
        "context `{context}` in `{path}`: `key` is not an Ed25519, ECDSA or RSA private key; regenerate the talosconfig with `talosctl config new`"
    )]
    UnsupportedKey { path: PathBuf, context: String },
}

fn position(line: Option<u64>, column: Option<u64>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" (at line {l}, column {c})"),
        (Some(l), None) => format!(" (at line {l})"),
        _ => String::new(),
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

#[derive(Debug, Deserialize)]
struct RawConfig {
    #[serde(default)]
    context: Option<String>,
    #[serde(default)]
    contexts: BTreeMap<String, RawContext>,
}

#[derive(Deserialize)]
struct RawContext {
    #[serde(default)]
    endpoints: Vec<String>,
    /// Deprecated upstream (appended to endpoints), still honoured.
    #[serde(default)]
    target: Option<String>,
    #[serde(default)]
    nodes: Vec<String>,
    #[serde(default)]
    ca: Option<String>,
    #[serde(default)]
    crt: Option<String>,
    #[serde(default)]
    key: Option<String>,
}

impl fmt::Debug for RawContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawContext")
            .field("endpoints", &self.endpoints)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

/// A parsed talosconfig file: its contexts, not yet decoded.
#[derive(Debug)]
pub struct TalosConfig {
    path: PathBuf,
    raw: RawConfig,
}

impl TalosConfig {
    /// Read and parse a talosconfig file.
    pub fn load(path: &Path) -> Result<TalosConfig, TalosConfigError> {
        let text = std::fs::read_to_string(path).map_err(|err| TalosConfigError::Read {
            path: path.to_path_buf(),
            err,
        })?;
        TalosConfig::parse(&text, path)
    }

    /// Parse talosconfig text; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<TalosConfig, TalosConfigError> {
        let raw: RawConfig = serde_saphyr::from_str(text).map_err(|err: serde_saphyr::Error| {
            let at = err.location();
            TalosConfigError::Parse {
                path: origin.to_path_buf(),
                line: at.map(|l| l.line()),
                column: at.map(|l| l.column()),
            }
        })?;
        Ok(TalosConfig {
            path: origin.to_path_buf(),
            raw,
        })
    }

    /// The file the config came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The `context:` key, if set and not empty.
    pub fn current_context(&self) -> Option<&str> {
        self.raw.context.as_deref().filter(|c| !c.is_empty())
    }

    /// All context names, sorted.
    pub fn context_names(&self) -> Vec<String> {
        self.raw.contexts.keys().cloned().collect()
    }

    /// Decode the named context, or the current one when `name` is `None`.
    pub fn context(&self, name: Option<&str>) -> Result<TalosContext, TalosConfigError> {
        let path = self.path.clone();
        let name = match name.or(self.current_context()) {
            Some(n) => n.to_string(),
            None => {
                return Err(TalosConfigError::NoContext {
                    path,
                    available: self.context_names(),
                });
            }
        };
        let Some(raw) = self.raw.contexts.get(&name) else {
            return Err(TalosConfigError::MissingContext {
                path,
                context: name,
                available: self.context_names(),
            });
        };

        let mut endpoint_strings: Vec<&str> = raw.endpoints.iter().map(String::as_str).collect();
        if let Some(t) = raw.target.as_deref().filter(|t| !t.is_empty()) {
            endpoint_strings.push(t);
        }
        if endpoint_strings.is_empty() {
            return Err(TalosConfigError::NoEndpoints {
                path,
                context: name,
            });
        }
        let mut endpoints = Vec::new();
        for e in endpoint_strings {
            let ep = Endpoint::parse(e).map_err(|reason| TalosConfigError::BadEndpoint {
                path: path.clone(),
                context: name.clone(),
                endpoint: e.to_string(),
                reason,
            })?;
            endpoints.push(ep);
        }

        let field =
            |field: &'static str, value: &Option<String>| -> Result<Vec<u8>, TalosConfigError> {
                let value = value
                    .as_deref()
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| TalosConfigError::MissingField {
                        path: path.clone(),
                        context: name.clone(),
                        field,
                    })?;
                BASE64.decode(value).map_err(|_| TalosConfigError::Base64 {
                    path: path.clone(),
                    context: name.clone(),
                    field,
                })
            };
        let ca = field("ca", &raw.ca)?;
        let crt = field("crt", &raw.crt)?;
        let key = Secret::new(field("key", &raw.key)?);

        let ca_pem = certificates_pem(&ca).ok_or_else(|| TalosConfigError::NoCertificate {
            path: path.clone(),
            context: name.clone(),
            field: "ca",
        })?;
        let crt_pem = certificates_pem(&crt).ok_or_else(|| TalosConfigError::NoCertificate {
            path: path.clone(),
            context: name.clone(),
            field: "crt",
        })?;
        let key = ClientKey::from_pem(key.expose()).map_err(|e| match e {
            KeyProblem::NotPem => TalosConfigError::NoKey {
                path: path.clone(),
                context: name.clone(),
            },
            KeyProblem::Unsupported => TalosConfigError::UnsupportedKey {
                path: path.clone(),
                context: name.clone(),
            },
        })?;

        Ok(TalosContext {
            name,
            endpoints,
            nodes: raw.nodes.clone(),
            ca_pem,
            crt_pem,
            key,
        })
    }
}

/// The default talosconfig location, in talosctl's lookup order: `$TALOSCONFIG`, then
/// `$TALOS_HOME/config`, then `~/.talos/config`.
pub fn default_talosconfig_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TALOSCONFIG").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(h) = std::env::var_os("TALOS_HOME").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(h).join("config"));
    }
    std::env::var_os("HOME")
        .filter(|p| !p.is_empty())
        .map(|h| PathBuf::from(h).join(".talos").join("config"))
}

/// Return the PEM text if it holds at least one certificate.
fn certificates_pem(bytes: &[u8]) -> Option<String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<_, _>>()
        .ok()?;
    if certs.is_empty() {
        return None;
    }
    String::from_utf8(bytes.to_vec()).ok()
}

/// One decoded talosconfig context: everything needed to dial apid with mutual TLS.
#[derive(Clone)]
pub struct TalosContext {
    pub name: String,
    pub endpoints: Vec<Endpoint>,
    /// Default targets (`node` metadata) when the caller names none.
    pub nodes: Vec<String>,
    /// PEM CA certificate(s) the server chain must verify against.
    pub ca_pem: String,
    /// PEM client certificate.
    pub crt_pem: String,
    pub key: ClientKey,
}

impl fmt::Debug for TalosContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TalosContext")
            .field("name", &self.name)
            .field("endpoints", &self.endpoints)
            .field("nodes", &self.nodes)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// The algorithm of a client key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAlgorithm {
    Ed25519,
    Ecdsa,
    Rsa,
}

/// The client private key, as PEM with a label rustls understands.
///
/// Talos (`siderolabs/crypto`) writes Ed25519 PKCS#8 keys under the non-standard label
/// `ED25519 PRIVATE KEY`; the DER is plain PKCS#8, so it is relabelled `PRIVATE KEY`.
#[derive(Clone)]
pub struct ClientKey {
    pem: Secret<Vec<u8>>,
    algorithm: KeyAlgorithm,
}

enum KeyProblem {
    NotPem,
    Unsupported,
}

impl ClientKey {
    fn from_pem(pem: &[u8]) -> Result<ClientKey, KeyProblem> {
        let relabelled = relabel_ed25519(pem);
        let der = PrivateKeyDer::from_pem_slice(&relabelled).map_err(|_| KeyProblem::NotPem)?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&der)
            .map_err(|_| KeyProblem::Unsupported)?;
        let algorithm = match signer.algorithm() {
            SignatureAlgorithm::ED25519 => KeyAlgorithm::Ed25519,
            SignatureAlgorithm::ECDSA => KeyAlgorithm::Ecdsa,
            SignatureAlgorithm::RSA => KeyAlgorithm::Rsa,
            _ => return Err(KeyProblem::Unsupported),
        };
        Ok(ClientKey {
            pem: Secret::new(relabelled),
            algorithm,
        })
    }

    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// PEM accepted by rustls/tonic (`PRIVATE KEY`, `EC PRIVATE KEY` or `RSA PRIVATE KEY`).
    pub fn pem(&self) -> &Secret<Vec<u8>> {
        &self.pem
    }
}

impl fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientKey({:?}, <redacted>)", self.algorithm)
    }
}

const ED25519_BEGIN: &str = "-----BEGIN ED25519 PRIVATE KEY-----";
const ED25519_END: &str = "-----END ED25519 PRIVATE KEY-----";

/// Replace Talos' `ED25519 PRIVATE KEY` PEM label by the standard PKCS#8 `PRIVATE KEY`.
pub fn relabel_ed25519(pem: &[u8]) -> Vec<u8> {
    match std::str::from_utf8(pem) {
        Ok(text) if text.contains(ED25519_BEGIN) => text
            .replace(ED25519_BEGIN, "-----BEGIN PRIVATE KEY-----")
            .replace(ED25519_END, "-----END PRIVATE KEY-----")
            .into_bytes(),
        _ => pem.to_vec(),
    }
}

/// One apid endpoint: the address dialled and the TLS server name checked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    host: String,
    port: u16,
}

impl Endpoint {
    /// Parse a talosconfig endpoint: `host`, `host:port`, `[v6]:port`, a bare IPv6 address, or a
    /// URL (`https://host[:port][/path]`, port 443 when the scheme is https and none is given).
    pub fn parse(input: &str) -> Result<Endpoint, &'static str> {
        let s = input.trim();
        if s.is_empty() {
            return Err("empty");
        }
        let (rest, scheme_port) = if let Some(r) = s.strip_prefix("https://") {
            (r, Some(443))
        } else if s.contains("://") {
            return Err("only https:// URLs are accepted");
        } else {
            (s, None)
        };
        let rest = if scheme_port.is_some() {
            rest.split(['/', '?', '#']).next().unwrap_or("")
        } else {
            rest
        };
        let default_port = scheme_port.unwrap_or(DEFAULT_PORT);
        let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
            let (h, after) = inner
                .split_once(']')
                .ok_or("unclosed `[` in IPv6 address")?;
            let port = match after {
                "" => default_port,
                p => p
                    .strip_prefix(':')
                    .ok_or("unexpected text after `]`")?
                    .parse()
                    .map_err(|_| "port is not a number in 1..65535")?,
            };
            (h.to_string(), port)
        } else if rest.matches(':').count() > 1 {
            // A bare IPv6 address without a port.
            (rest.to_string(), default_port)
        } else if let Some((h, p)) = rest.split_once(':') {
            (
                h.to_string(),
                p.parse().map_err(|_| "port is not a number in 1..65535")?,
            )
        } else {
            (rest.to_string(), default_port)
        };
        if host.is_empty() {
            return Err("missing host");
        }
        if port == 0 {
            return Err("port is not a number in 1..65535");
        }
        if host.contains(['/', ' ', '@']) {
            return Err("host contains `/`, `@` or a space");
        }
        if host.contains(':') && host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("not a valid IPv6 address");
        }
        Ok(Endpoint { host, port })
    }

    pub fn new(host: impl Into<String>, port: u16) -> Endpoint {
        Endpoint {
            host: host.into(),
            port,
        }
    }

    /// The host (IP address or DNS name): also the TLS server name, as talosctl uses it.
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `https://host:port` (IPv6 hosts bracketed), the URI the gRPC channel dials.
    pub fn uri(&self) -> String {
        format!("https://{self}")
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 19: a malformed talosconfig is an error naming the file and the position, never
    /// quoting it (the key and certificates are in it).
    #[test]
    fn parse_errors_never_quote_the_file() {
        const SECRET: &str = "LS0tLS1CRUdJTiBFRDI1NTE5IFBSSVZBVEUgS0VZLS0tLS0KU0VDUkVU";
        for text in [
            format!("context: a\ncontexts:\n  a:\n    key: [{SECRET}\n"),
            format!("context: a\ncontexts:\n  a:\n    endpoints: {SECRET}\n"),
            format!("context: {{a: {SECRET}}}\n"),
            format!("{SECRET}\n"),
        ] {
            let e = TalosConfig::parse(&text, Path::new("/creds/talosconfig")).unwrap_err();
            assert!(matches!(e, TalosConfigError::Parse { .. }), "{e:?}");
            let mut all = format!("{e} {e:?}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                all.push_str(&format!(" {s} {s:?}"));
                src = s.source();
            }
            assert!(!all.contains(&SECRET[..16]), "{all}");
            assert!(all.contains("/creds/talosconfig"), "{all}");
        }
        // A key that is not base64: the error names the field, not the offending byte.
        let text = "context: a\ncontexts:\n  a:\n    endpoints: [10.0.0.1]\n    ca: QQ==\n    crt: QQ==\n    key: QUJD#Q0RF\n";
        let e = TalosConfig::parse(text, Path::new("/creds/talosconfig"))
            .unwrap()
            .context(None)
            .unwrap_err();
        assert!(
            matches!(e, TalosConfigError::Base64 { field: "key", .. }),
            "{e:?}"
        );
        assert!(std::error::Error::source(&e).is_none());
        assert!(!format!("{e} {e:?}").contains('#'), "{e:?}");
    }

    #[test]
    fn endpoints_parse_like_talosctl() {
        let cases = [
            ("10.0.0.2", "10.0.0.2", 50000),
            ("10.0.0.2:50001", "10.0.0.2", 50001),
            ("cp.example.com", "cp.example.com", 50000),
            ("https://cp.example.com", "cp.example.com", 443),
            (
                "https://cp.example.com:8443/some/path",
                "cp.example.com",
                8443,
            ),
            ("[fd00::1]:50000", "fd00::1", 50000),
            ("fd00::1", "fd00::1", 50000),
            ("[fd00::1]", "fd00::1", 50000),
        ];
        for (input, host, port) in cases {
            let ep = Endpoint::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!((ep.host(), ep.port()), (host, port), "{input}");
        }
        assert_eq!(
            Endpoint::parse("fd00::1").unwrap().uri(),
            "https://[fd00::1]:50000"
        );
        assert_eq!(
            Endpoint::parse("10.0.0.2").unwrap().uri(),
            "https://10.0.0.2:50000"
        );
    }

    #[test]
    fn bad_endpoints_are_refused_with_a_reason() {
        for (input, want) in [
            ("", "empty"),
            ("host:notaport", "port"),
            ("host:0", "port"),
            ("ftp://host", "https://"),
            ("[fd00::1", "unclosed"),
            ("fd00::zz", "IPv6"),
            (":50000", "missing host"),
        ] {
            let err = Endpoint::parse(input).unwrap_err();
            assert!(err.contains(want), "{input:?}: {err}");
        }
    }

    #[test]
    fn relabels_only_the_talos_ed25519_label() {
        let talos =
            b"-----BEGIN ED25519 PRIVATE KEY-----\nAAAA\n-----END ED25519 PRIVATE KEY-----\n";
        let out = String::from_utf8(relabel_ed25519(talos)).unwrap();
        assert_eq!(
            out,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
        );
        let ec = b"-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n";
        assert_eq!(relabel_ed25519(ec), ec.to_vec());
    }
}
