//! Connecting to a running `medea serve`: TLS (a CA to verify the server, or no verification
//! for a loopback address only) and a bearer token on every request.
//!
//! Where the address, token and CA come from (flags, environment, defaults) is the caller's
//! business (`cli::client`); this module takes them resolved.

use std::path::PathBuf;
use std::sync::Arc;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::pb::medea_client::MedeaClient;
use crate::secret::Secret;

/// A connected API client: every request carries the bearer token, if any.
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

/// Where and how to reach the server.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` (an `https://` prefix is accepted).
    pub addr: String,
    /// The API bearer token, if the server wants one.
    pub token: Option<Secret<String>>,
    /// The CA certificate that signed the server's certificate.
    pub ca: Option<PathBuf>,
    /// Skip server certificate verification (loopback addresses only).
    pub insecure: bool,
}

/// Why a client could not connect. Nothing was sent to the server unless the variant is
/// [`ConnectError::Connect`].
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("the token contains characters that cannot be sent")]
    Token,
    #[error("invalid address `{addr}`")]
    Address {
        addr: String,
        #[source]
        err: tonic::transport::Error,
    },
    #[error("insecure connections are only allowed for loopback addresses, not `{host}`")]
    InsecureNotLoopback { host: String },
    #[error("no CA certificate to verify the server at {addr} with")]
    NoCa { addr: String },
    #[error("cannot read CA certificate `{}`", .path.display())]
    ReadCa {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("TLS setup failed")]
    Tls(#[source] tonic::transport::Error),
    #[error("cannot reach medea at {addr}")]
    Connect {
        addr: String,
        #[source]
        err: tonic::transport::Error,
    },
}

pub fn host_of(addr: &str) -> &str {
    let a = addr.trim_start_matches("https://");
    if let Some(rest) = a.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    a.rsplit_once(':').map_or(a, |(h, _)| h)
}

pub fn is_loopback(host: &str) -> bool {
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

/// Connect to the server described by `cfg`.
pub async fn connect(cfg: &ClientConfig) -> Result<Client, ConnectError> {
    // The token first: a token that cannot be sent is refused before anything is sent.
    let token = match &cfg.token {
        Some(t) => Some(
            format!("Bearer {}", t.expose())
                .parse()
                .map_err(|_| ConnectError::Token)?,
        ),
        None => None,
    };
    let host = host_of(&cfg.addr).to_string();
    let uri = format!("https://{}", cfg.addr.trim_start_matches("https://"));
    let endpoint = Endpoint::from_shared(uri)
        .map_err(|err| ConnectError::Address {
            addr: cfg.addr.clone(),
            err,
        })?
        .connect_timeout(std::time::Duration::from_secs(5));
    let tls = ClientTlsConfig::new().domain_name(host.clone());
    let endpoint = if cfg.insecure {
        if !is_loopback(&host) {
            return Err(ConnectError::InsecureNotLoopback { host });
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        endpoint
            .tls_config_with_verifier(tls, Arc::new(NoVerify(provider)))
            .map_err(ConnectError::Tls)?
    } else {
        let ca_path = cfg.ca.clone().ok_or_else(|| ConnectError::NoCa {
            addr: cfg.addr.clone(),
        })?;
        let pem = std::fs::read(&ca_path).map_err(|err| ConnectError::ReadCa {
            path: ca_path.clone(),
            err,
        })?;
        endpoint
            .tls_config(tls.ca_certificate(Certificate::from_pem(pem)))
            .map_err(ConnectError::Tls)?
    };
    let channel = endpoint
        .connect()
        .await
        .map_err(|err| ConnectError::Connect {
            addr: cfg.addr.clone(),
            err,
        })?;
    Ok(MedeaClient::with_interceptor(channel, BearerToken(token))
        .max_decoding_message_size(64 * 1024 * 1024))
}
