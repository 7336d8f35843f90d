//! The simulator's PKI, shaped like a Talos cluster's: an Ed25519 OS CA, an Ed25519 apid server
//! certificate (SANs: the listen host, `127.0.0.1`, `::1`, `localhost`, the node addresses), and
//! an Ed25519 admin client certificate with `O=os:admin` and extended key usage exactly
//! `[ClientAuth]`. Keys are written in Talos' PEM flavour (`ED25519 PRIVATE KEY`), so the
//! talosconfig it produces looks like one from `talosctl gen config`.
//!
//! Also: [`write_secret_file`], the one way the simulator writes key material (0600 file in a
//! 0700 directory).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ED25519,
};

use crate::private_file::{ExistingDir, PrivateFileError};
use crate::secret::Secret;

/// Why PKI material could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("failed to generate the simulator's {what}")]
    Generate {
        what: &'static str,
        #[source]
        err: rcgen::Error,
    },
    #[error("failed to create directory `{path}`")]
    CreateDir {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error(
        "directory `{path}` is accessible by other users (mode {mode:04o}); secrets go only into a 0700 directory: use a new directory or `chmod 700` it"
    )]
    LooseDir { path: PathBuf, mode: u32 },
    #[error("failed to write secret file `{path}`")]
    Write {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
}

/// A certificate and its key, PEM.
#[derive(Clone)]
pub struct CertAndKey {
    pub cert_pem: String,
    /// PKCS#8 under Talos' label `ED25519 PRIVATE KEY`.
    pub key_pem: Secret<String>,
    /// The same key under the standard `PRIVATE KEY` label (what rustls/tonic load).
    pub key_pem_standard: Secret<String>,
}

impl std::fmt::Debug for CertAndKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAndKey").finish_non_exhaustive()
    }
}

/// The simulator's CA, server and admin credentials.
pub struct SimPki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
    not_before: jiff::civil::Date,
    pub server: CertAndKey,
    pub admin: CertAndKey,
}

impl std::fmt::Debug for SimPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimPki").finish_non_exhaustive()
    }
}

fn rc(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |err| PkiError::Generate { what, err }
}

/// Midnight UTC of a jiff date, as rcgen wants it (jiff dates are always valid calendar dates).
macro_rules! ymd {
    ($d:expr) => {{
        let d: jiff::civil::Date = $d;
        rcgen::date_time_ymd(i32::from(d.year()), d.month() as u8, d.day() as u8)
    }};
}

fn talos_label(pem: &str) -> String {
    pem.replace(
        "-----BEGIN PRIVATE KEY-----",
        "-----BEGIN ED25519 PRIVATE KEY-----",
    )
    .replace(
        "-----END PRIVATE KEY-----",
        "-----END ED25519 PRIVATE KEY-----",
    )
}

impl SimPki {
    /// Generate a fresh PKI valid from the day before `today` for a year (CA: ten years).
    /// `server_sans` are added to the server certificate's SANs.
    pub fn generate(server_sans: &[String], today: jiff::civil::Date) -> Result<SimPki, PkiError> {
        let not_before = today.yesterday().unwrap_or(today);
        let ca_key = KeyPair::generate_for(&PKCS_ED25519).map_err(rc("CA key"))?;
        let mut ca = CertificateParams::default();
        ca.distinguished_name = rcgen::DistinguishedName::new();
        ca.distinguished_name
            .push(DnType::OrganizationName, "talos");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::CrlSign,
        ];
        ca.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        ca.not_before = ymd!(not_before);
        ca.not_after = ymd!(today.saturating_add(jiff::Span::new().years(10)));
        let ca_cert = ca.self_signed(&ca_key).map_err(rc("CA certificate"))?;
        let issuer = Issuer::new(ca, ca_key);

        let mut pki = SimPki {
            ca_pem: ca_cert.pem(),
            issuer,
            not_before,
            server: placeholder(),
            admin: placeholder(),
        };

        let mut sans: Vec<String> = vec!["127.0.0.1".into(), "::1".into(), "localhost".into()];
        for s in server_sans {
            if !sans.contains(s) {
                sans.push(s.clone());
            }
        }
        pki.server = pki.issue(
            "server certificate",
            &sans,
            &[],
            "talos-sim",
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        pki.admin = pki.issue_client(&["os:admin"])?;
        Ok(pki)
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Issue another client certificate carrying `roles` as Organization values (e.g.
    /// `os:reader`), as `talosctl config new --roles` does.
    pub fn issue_client(&self, roles: &[&str]) -> Result<CertAndKey, PkiError> {
        self.issue(
            "client certificate",
            &[],
            roles,
            "admin",
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    /// [`Self::issue_client`] whose certificate stops being valid `valid_for` from now (a
    /// short-lived credential, as an operator's `talosctl config new --crt-ttl` issues).
    pub fn issue_client_valid_for(
        &self,
        roles: &[&str],
        valid_for: std::time::Duration,
    ) -> Result<CertAndKey, PkiError> {
        let now = u64::try_from(jiff::Timestamp::now().as_second()).unwrap_or(0);
        let not_after = now.saturating_add(valid_for.as_secs());
        self.issue_until(
            "client certificate",
            &[],
            roles,
            "admin",
            ExtendedKeyUsagePurpose::ClientAuth,
            Some(not_after),
        )
    }

    fn issue(
        &self,
        what: &'static str,
        sans: &[String],
        orgs: &[&str],
        cn: &str,
        eku: ExtendedKeyUsagePurpose,
    ) -> Result<CertAndKey, PkiError> {
        self.issue_until(what, sans, orgs, cn, eku, None)
    }

    fn issue_until(
        &self,
        what: &'static str,
        sans: &[String],
        orgs: &[&str],
        cn: &str,
        eku: ExtendedKeyUsagePurpose,
        not_after_unix: Option<u64>,
    ) -> Result<CertAndKey, PkiError> {
        let key = KeyPair::generate_for(&PKCS_ED25519).map_err(rc(what))?;
        let mut p = CertificateParams::new(sans.to_vec()).map_err(rc(what))?;
        p.distinguished_name = rcgen::DistinguishedName::new();
        for o in orgs {
            p.distinguished_name.push(DnType::OrganizationName, *o);
        }
        p.distinguished_name.push(DnType::CommonName, cn);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![eku];
        p.not_before = ymd!(self.not_before);
        p.not_after = match not_after_unix {
            Some(secs) => rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(secs),
            None => ymd!(self.not_before.saturating_add(jiff::Span::new().years(1))),
        };
        let cert = p.signed_by(&key, &self.issuer).map_err(rc(what))?;
        let standard = key.serialize_pem();
        Ok(CertAndKey {
            cert_pem: cert.pem(),
            key_pem: Secret::new(talos_label(&standard)),
            key_pem_standard: Secret::new(standard),
        })
    }
}

fn placeholder() -> CertAndKey {
    CertAndKey {
        cert_pem: String::new(),
        key_pem: Secret::new(String::new()),
        key_pem_standard: Secret::new(String::new()),
    }
}

/// Make sure `dir` exists and only its owner can enter it: create it 0700 if missing, refuse it
/// if it exists with group/other permissions (nothing is changed then).
pub fn ensure_private_dir(dir: &Path) -> Result<(), PkiError> {
    crate::private_file::private_dir(dir, ExistingDir::RefuseLoose).map_err(PkiError::from)
}

/// Write `contents` to `dir/name` with mode 0600 (through a temporary file and a rename, so a
/// reader never sees half a file). `dir` must be private (see [`ensure_private_dir`]).
pub fn write_secret_file(dir: &Path, name: &str, contents: &[u8]) -> Result<PathBuf, PkiError> {
    let path = dir.join(name);
    crate::private_file::write_private(&path, contents, ExistingDir::RefuseLoose)?;
    Ok(path)
}

impl From<PrivateFileError> for PkiError {
    fn from(e: PrivateFileError) -> Self {
        match e {
            PrivateFileError::CreateDir { path, err } => PkiError::CreateDir { path, err },
            PrivateFileError::LooseDir { path, mode } => PkiError::LooseDir { path, mode },
            PrivateFileError::Write { path, err } => PkiError::Write { path, err },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn keys_use_the_talos_label_and_certs_chain() {
        let pki = SimPki::generate(&["127.5.0.2".into()], jiff::civil::date(2026, 8, 21)).unwrap();
        assert!(
            pki.admin
                .key_pem
                .expose()
                .starts_with("-----BEGIN ED25519 PRIVATE KEY-----")
        );
        assert!(
            pki.admin
                .key_pem_standard
                .expose()
                .starts_with("-----BEGIN PRIVATE KEY-----")
        );
        assert!(pki.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(
            pki.server
                .cert_pem
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        // The Talos-labelled key must load through medea's own talosconfig path.
        let relabelled =
            crate::talos::config::relabel_ed25519(pki.admin.key_pem.expose().as_bytes());
        assert_eq!(relabelled, pki.admin.key_pem_standard.expose().as_bytes());
    }

    #[test]
    fn secret_files_are_private_and_loose_dirs_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        let p = write_secret_file(&dir, "talosconfig", b"x").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&p), 0o600);
        assert_eq!(mode(&dir), 0o700);

        let loose = tmp.path().join("loose");
        std::fs::create_dir(&loose).unwrap();
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = write_secret_file(&loose, "talosconfig", b"x").unwrap_err();
        assert!(
            matches!(err, PkiError::LooseDir { mode: 0o755, .. }),
            "{err}"
        );
        assert!(!loose.join("talosconfig").exists());
    }
}
