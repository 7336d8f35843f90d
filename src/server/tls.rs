//! The API's TLS identity: given files, or a CA + server certificate generated on first run.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};

use super::secrets::{Secret, write_private};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("failed to read TLS file `{path}`")]
    Read {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("failed to write TLS file `{path}`")]
    Write {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("failed to generate the server certificate")]
    Generate {
        #[source]
        err: rcgen::Error,
    },
    #[error("--tls-cert and --tls-key must be given together")]
    Half,
}

/// PEM certificate chain and key the server presents.
#[derive(Debug)]
pub struct ServerIdentity {
    pub cert_pem: String,
    pub key_pem: Secret<String>,
    /// Where the CA clients should trust lives, when medea generated it.
    pub ca_path: Option<PathBuf>,
}

/// Load the given cert/key, or generate (once) `<dir>/ca.crt`, `server.crt`, `server.key`.
pub fn server_identity(
    cert: Option<&Path>,
    key: Option<&Path>,
    dir: &Path,
    extra_names: &[String],
) -> Result<ServerIdentity, TlsError> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|err| TlsError::Read {
            path: p.to_path_buf(),
            err,
        })
    };
    match (cert, key) {
        (Some(c), Some(k)) => Ok(ServerIdentity {
            cert_pem: read(c)?,
            key_pem: Secret::new(read(k)?),
            ca_path: None,
        }),
        (None, None) => {
            let (ca_p, crt_p, key_p) = (
                dir.join("ca.crt"),
                dir.join("server.crt"),
                dir.join("server.key"),
            );
            if !(ca_p.exists() && crt_p.exists() && key_p.exists()) {
                generate(dir, extra_names)?;
            }
            Ok(ServerIdentity {
                cert_pem: read(&crt_p)?,
                key_pem: Secret::new(read(&key_p)?),
                ca_path: Some(ca_p),
            })
        }
        _ => Err(TlsError::Half),
    }
}

fn generate(dir: &Path, extra_names: &[String]) -> Result<(), TlsError> {
    let gen_err = |err| TlsError::Generate { err };
    let ca_key = KeyPair::generate_for(&rcgen::PKCS_ED25519).map_err(gen_err)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
    ca.distinguished_name
        .push(DnType::CommonName, "medea local CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).map_err(gen_err)?;

    let mut names = vec!["localhost".to_string()];
    names.extend(extra_names.iter().cloned());
    let mut params = CertificateParams::new(names).map_err(gen_err)?;
    params.distinguished_name.push(DnType::CommonName, "medea");
    for ip in ["127.0.0.1", "::1"] {
        params
            .subject_alt_names
            .push(SanType::IpAddress(ip.parse().expect("literal ip")));
    }
    let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).map_err(gen_err)?;
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let cert = params.signed_by(&key, &issuer).map_err(gen_err)?;

    let w = |name: &str, data: String| {
        let p = dir.join(name);
        write_private(&p, data.as_bytes()).map_err(|err| TlsError::Write { path: p, err })
    };
    w("server.key", key.serialize_pem())?;
    w("server.crt", cert.pem())?;
    w("ca.crt", ca_cert.pem())?;
    Ok(())
}
