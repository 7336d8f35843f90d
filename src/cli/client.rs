//! Connecting the CLI to a running `medea serve`: flags → env → defaults.

use miette::{IntoDiagnostic as _, WrapErr as _};
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::server::api::pb::medea_client::MedeaClient;

pub const DEFAULT_ADDR: &str = "localhost:7600";

#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Address of `medea serve`.
    #[arg(long, env = "MEDEA_ADDR", default_value = DEFAULT_ADDR, global = true)]
    pub addr: String,
    /// API bearer token [env: MEDEA_TOKEN]. Prefer --token-file. A flag beats the
    /// environment; an empty token is refused.
    #[arg(long, global = true, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// File holding the API bearer token [env: MEDEA_TOKEN_FILE].
    #[arg(long, global = true)]
    pub token_file: Option<PathBuf>,
    /// CA certificate that signed the server's certificate (medea serve writes
    /// `<state-dir>/tls/ca.crt` when it generates one).
    #[arg(long, env = "MEDEA_CA", global = true)]
    pub ca: Option<PathBuf>,
    /// Skip server certificate verification. Only allowed for loopback addresses.
    #[arg(long, global = true)]
    pub insecure: bool,
}

pub type Client =
    MedeaClient<tonic::service::interceptor::InterceptedService<Channel, BearerToken>>;

#[derive(Clone)]
pub struct BearerToken(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// Where an API token comes from when no flag names one.
pub const TOKEN_ENV: &str = "MEDEA_TOKEN";
pub const TOKEN_FILE_ENV: &str = "MEDEA_TOKEN_FILE";

/// Where the API token was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `--token` or `MEDEA_TOKEN`.
    Value(String),
    /// `--token-file` or `MEDEA_TOKEN_FILE`.
    File(PathBuf),
}

/// The API token's source: an explicit `--token`/`--token-file` beats `MEDEA_TOKEN` and
/// `MEDEA_TOKEN_FILE` from the environment (so a shell with the client's `MEDEA_TOKEN`
/// exported can still run `medea serve --token-file F`); then `MEDEA_TOKEN`, then
/// `MEDEA_TOKEN_FILE`. `None`: nothing given. An empty token (`--token ''`, `MEDEA_TOKEN=`)
/// is an error, never "no token".
pub fn token_source(
    flag: Option<String>,
    flag_file: Option<PathBuf>,
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> miette::Result<Option<TokenSource>> {
    let empty = |what: &str| {
        miette::miette!(
            help = "pass the server's token, or leave it unset to use --token-file / the default token file",
            "{what} is empty: an empty API token is refused"
        )
    };
    if let Some(t) = flag {
        if t.trim().is_empty() {
            return Err(empty("--token"));
        }
        return Ok(Some(TokenSource::Value(t)));
    }
    if let Some(f) = flag_file {
        return Ok(Some(TokenSource::File(f)));
    }
    if let Some(t) = env(TOKEN_ENV) {
        let t = t
            .into_string()
            .map_err(|_| miette::miette!("{TOKEN_ENV} is not valid UTF-8"))?;
        if t.trim().is_empty() {
            return Err(empty(TOKEN_ENV));
        }
        return Ok(Some(TokenSource::Value(t)));
    }
    match env(TOKEN_FILE_ENV) {
        Some(f) if f.is_empty() => Err(empty(TOKEN_FILE_ENV)),
        Some(f) => Ok(Some(TokenSource::File(PathBuf::from(f)))),
        None => Ok(None),
    }
}

/// Read a token file: trimmed, never empty.
pub fn read_token_file(path: &std::path::Path) -> miette::Result<crate::secret::Secret<String>> {
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => Ok(crate::secret::Secret::new(t.trim().to_string())),
        Ok(_) => Err(miette::miette!(
            "token file `{}` is empty: an empty API token is refused",
            path.display()
        )),
        Err(e) => Err(miette::miette!(
            help = "check --token-file / MEDEA_TOKEN_FILE",
            "cannot read token file `{}`: {e}",
            path.display()
        )),
    }
}

/// The client's token, from [`token_source`].
pub fn resolve_token(
    flag: Option<String>,
    flag_file: Option<PathBuf>,
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> miette::Result<Option<crate::secret::Secret<String>>> {
    match token_source(flag, flag_file, env)? {
        Some(TokenSource::Value(t)) => Ok(Some(crate::secret::Secret::new(t))),
        Some(TokenSource::File(p)) => read_token_file(&p).map(Some),
        None => Ok(None),
    }
}

fn host_of(addr: &str) -> &str {
    let a = addr.trim_start_matches("https://");
    if let Some(rest) = a.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    a.rsplit_once(':').map_or(a, |(h, _)| h)
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl ClientArgs {
    pub async fn connect(&self) -> miette::Result<Client> {
        // The token first: an empty one is refused before anything is sent.
        let token = match resolve_token(self.token.clone(), self.token_file.clone(), &|name| {
            std::env::var_os(name)
        })? {
            Some(t) => Some(format!("Bearer {}", t.expose()).parse().map_err(|_| {
                miette::miette!("the token contains characters that cannot be sent")
            })?),
            None => None,
        };
        let host = host_of(&self.addr).to_string();
        let uri = format!("https://{}", self.addr.trim_start_matches("https://"));
        let endpoint = Endpoint::from_shared(uri.clone())
            .map_err(|e| {
                miette::miette!(
                    help = "use host:port, e.g. localhost:7600",
                    "invalid --addr `{}`: {e}",
                    self.addr
                )
            })?
            .connect_timeout(std::time::Duration::from_secs(5));
        let tls = ClientTlsConfig::new().domain_name(host.clone());
        let endpoint = if self.insecure {
            if !is_loopback(&host) {
                return Err(miette::miette!(
                    help = "pass --ca with the server's CA certificate instead",
                    "--insecure is only allowed for loopback addresses, not `{host}`"
                ));
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            endpoint
                .tls_config_with_verifier(tls, Arc::new(NoVerify(provider)))
                .into_diagnostic()
                .wrap_err("TLS setup failed")?
        } else {
            let ca_path = self.ca.clone().ok_or_else(|| {
                miette::miette!(
                    help = "pass --ca <state-dir>/tls/ca.crt (or set MEDEA_CA); for a local server, --insecure also works",
                    "no CA certificate to verify the server at {} with",
                    self.addr
                )
            })?;
            let pem = std::fs::read(&ca_path).map_err(|e| {
                miette::miette!(
                    help = "check --ca / MEDEA_CA",
                    "cannot read CA certificate `{}`: {e}",
                    ca_path.display()
                )
            })?;
            endpoint
                .tls_config(tls.ca_certificate(Certificate::from_pem(pem)))
                .into_diagnostic()
                .wrap_err("TLS setup failed")?
        };
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| connect_error(&self.addr, &e))?;
        Ok(MedeaClient::with_interceptor(channel, BearerToken(token))
            .max_decoding_message_size(64 * 1024 * 1024))
    }
}

fn connect_error(addr: &str, e: &tonic::transport::Error) -> miette::Report {
    let chain = crate::error_chain(e);
    let help = if chain.contains("UnknownIssuer")
        || chain.contains("certificate")
        || chain.contains("InvalidCertificate")
    {
        "the server's TLS certificate is not trusted: pass --ca with the CA that signed it (medea serve writes <state-dir>/tls/ca.crt)"
    } else if chain.contains("refused") {
        "is `medea serve` running there? (default address localhost:7600, or set MEDEA_ADDR)"
    } else {
        "check the address, network and TLS settings"
    };
    miette::miette!(help = help, "cannot reach medea at {addr}: {chain}")
}

/// Turn an RPC failure into an error that names the fix.
pub fn rpc_error(addr: &str, s: tonic::Status) -> miette::Report {
    match s.code() {
        tonic::Code::Unauthenticated => miette::miette!(
            help =
                "pass --token or set MEDEA_TOKEN to the server's token (medea serve --token-file)",
            "medea at {addr} refused the request: {}",
            s.message()
        ),
        tonic::Code::Unavailable => {
            let chain = crate::error_chain(&s);
            let help = if chain.contains("certificate") || chain.contains("UnknownIssuer") {
                "the server's TLS certificate is not trusted: pass --ca with the CA that signed it"
            } else {
                "is `medea serve` running there? (default localhost:7600, or set MEDEA_ADDR)"
            };
            miette::miette!(help = help, "cannot reach medea at {addr}: {chain}")
        }
        _ => miette::miette!("medea at {addr}: {}", s.message()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn flags_beat_the_environment() {
        let e = env(&[
            ("MEDEA_TOKEN", "from-env"),
            ("MEDEA_TOKEN_FILE", "/env/file"),
        ]);
        assert_eq!(
            token_source(None, Some("/flag/file".into()), &e).unwrap(),
            Some(TokenSource::File("/flag/file".into()))
        );
        assert_eq!(
            token_source(Some("flag".into()), None, &e).unwrap(),
            Some(TokenSource::Value("flag".into()))
        );
        assert_eq!(
            token_source(None, None, &e).unwrap(),
            Some(TokenSource::Value("from-env".into()))
        );
        assert_eq!(
            token_source(None, None, &env(&[("MEDEA_TOKEN_FILE", "/env/file")])).unwrap(),
            Some(TokenSource::File("/env/file".into()))
        );
        assert_eq!(token_source(None, None, &env(&[])).unwrap(), None);
    }

    #[test]
    fn an_empty_token_is_refused() {
        let err = token_source(Some(String::new()), None, &env(&[])).unwrap_err();
        assert!(err.to_string().contains("--token is empty"), "{err}");
        let err = token_source(None, None, &env(&[("MEDEA_TOKEN", "")])).unwrap_err();
        assert!(err.to_string().contains("MEDEA_TOKEN is empty"), "{err}");
        let err = token_source(Some("  ".into()), None, &env(&[])).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t");
        std::fs::write(&f, "\n").unwrap();
        let err = resolve_token(None, Some(f), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");
    }
}
