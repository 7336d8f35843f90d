//! The simulated apiserver's PKI: a fresh self-signed CA (ECDSA P-256, what kubectl's Go TLS
//! and rustls both accept), a serving certificate for `127.0.0.1`/`localhost` signed by it,
//! and a random bearer token. Nothing is reused between simulator runs.

use std::fmt;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};

use super::KubeSimError;

/// A bearer token. `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(String);

impl BearerToken {
    /// The token itself, for writing it into a kubeconfig or an `Authorization` header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Compare in constant time.
    pub(crate) fn matches(&self, candidate: &str) -> bool {
        use subtle::ConstantTimeEq;
        self.0.as_bytes().ct_eq(candidate.as_bytes()).into()
    }

    /// A fixed token, for the request fuzzer only.
    pub(crate) fn fixed(token: &str) -> BearerToken {
        BearerToken(token.to_string())
    }

    /// A fresh random token (64 hex characters from 256 bits of OS randomness).
    pub(crate) fn generate() -> Result<BearerToken, KubeSimError> {
        let key = KeyPair::generate().map_err(|err| KubeSimError::Pki { err })?;
        Ok(BearerToken(hex::encode(Sha256::digest(
            key.serialize_der(),
        ))))
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

impl fmt::Display for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The server's certificates.
pub(crate) struct ServerPki {
    pub ca_pem: String,
    pub tls: Arc<rustls::ServerConfig>,
}

/// The CA and one serving certificate for the control-plane endpoint (`127.0.0.1`,
/// `localhost`, the `kubernetes` service names) and every control-plane node's address in
/// `node_addresses`, as a kube-apiserver's serving certificate names its advertise address.
pub(crate) fn generate(node_addresses: &[std::net::IpAddr]) -> Result<ServerPki, KubeSimError> {
    let pki = |err| KubeSimError::Pki { err };
    let ca_key = KeyPair::generate().map_err(pki)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(pki)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "medea-sim kubernetes CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    ca_params.not_before = rcgen::date_time_ymd(2025, 1, 1);
    ca_params.not_after = rcgen::date_time_ymd(2099, 12, 31);
    let ca_cert = ca_params.self_signed(&ca_key).map_err(pki)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate().map_err(pki)?;
    let mut names = vec![
        "127.0.0.1".to_string(),
        "::1".to_string(),
        "localhost".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
    ];
    names.extend(
        node_addresses
            .iter()
            .map(ToString::to_string)
            .filter(|a| a != "127.0.0.1"),
    );
    let mut params = CertificateParams::new(names).map_err(pki)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = rcgen::date_time_ymd(2025, 1, 1);
    params.not_after = rcgen::date_time_ymd(2099, 12, 31);
    let cert = params.signed_by(&key, &issuer).map_err(pki)?;

    let chain = vec![CertificateDer::from(cert.der().to_vec())];
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|err| KubeSimError::Tls { err })?
    .with_no_client_auth()
    .with_single_cert(chain, key_der)
    .map_err(|err| KubeSimError::Tls { err })?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(ServerPki {
        ca_pem: ca_cert.pem(),
        tls: Arc::new(tls),
    })
}
