//! Store selection for `medea serve` (and the hidden HA probe): a directory, or an etcd cluster
//! for HA replicas, with the etcd TLS options, the replica id and the leader lease TTL.

#[cfg(feature = "etcd")]
use miette::{IntoDiagnostic as _, WrapErr as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::store::location::StoreLocation;
use crate::store::{Leadership, Store};

/// Flags that only matter for an `etcd://` store.
#[derive(Debug, Clone, Args)]
pub struct HaArgs {
    /// This replica's id in leader election and `medea get server` (default: the hostname).
    #[arg(long, env = "MEDEA_REPLICA")]
    pub replica: Option<String>,
    /// Leader lease TTL (etcd store): a dead leader is replaced within about this long.
    #[arg(long, default_value = "10s", env = "MEDEA_LEADER_TTL", value_parser = crate::duration::parse_std)]
    pub leader_ttl: Duration,
    #[command(flatten)]
    pub etcd: EtcdArgs,
}

/// How to reach an `etcd://` store over TLS (every command that opens a store).
#[derive(Debug, Clone, Default, Args)]
pub struct EtcdArgs {
    /// CA certificate (PEM) that signed the etcd members' certificates; enables TLS to etcd.
    #[arg(long, env = "MEDEA_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's --client-cert-auth; needs --etcd-key and --etcd-ca.
    #[arg(long, env = "MEDEA_ETCD_CERT", requires_all = ["etcd_key", "etcd_ca"])]
    pub etcd_cert: Option<PathBuf>,
    /// Client key (PEM) for --etcd-cert.
    #[arg(long, env = "MEDEA_ETCD_KEY", requires_all = ["etcd_cert", "etcd_ca"])]
    pub etcd_key: Option<PathBuf>,
    /// Allow plaintext to etcd endpoints that are not on loopback (refused by default: whoever
    /// can write the store can bypass approvals).
    #[arg(long, env = "MEDEA_ETCD_INSECURE")]
    pub etcd_insecure: bool,
    /// etcd user for etcd's username/password authentication (`etcdctl auth enable`); the
    /// password comes from --etcd-password-file or MEDEA_ETCD_PASSWORD, never from the command
    /// line.
    #[arg(long, env = "MEDEA_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// File holding the --etcd-user's password (one line).
    #[arg(long, env = "MEDEA_ETCD_PASSWORD_FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
}

impl EtcdArgs {
    fn any(&self) -> bool {
        self.etcd_ca.is_some()
            || self.etcd_cert.is_some()
            || self.etcd_insecure
            || self.etcd_user.is_some()
            || self.etcd_password_file.is_some()
    }

    /// The etcd credentials: --etcd-user with its password from --etcd-password-file, else from
    /// `MEDEA_ETCD_PASSWORD`.
    #[cfg(feature = "etcd")]
    fn credentials(&self) -> miette::Result<Option<crate::store::etcd::EtcdCredentials>> {
        self.credentials_from(std::env::var("MEDEA_ETCD_PASSWORD").ok())
    }

    #[cfg(feature = "etcd")]
    fn credentials_from(
        &self,
        env_password: Option<String>,
    ) -> miette::Result<Option<crate::store::etcd::EtcdCredentials>> {
        let Some(user) = &self.etcd_user else {
            return Ok(None);
        };
        let password = match (&self.etcd_password_file, env_password) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path)
                    .into_diagnostic()
                    .wrap_err_with(|| {
                        format!("cannot read the etcd password file `{}`", path.display())
                    })?;
                let password = text.trim_end_matches(['\n', '\r']);
                // A second line is a typo (or the wrong file): refused, naming the file and
                // the line, never the content (issue #49 item 2).
                if let Some(n) = password.lines().count().checked_sub(1).filter(|n| *n > 0) {
                    return Err(miette::miette!(
                        help = "the file holds the password alone, on one line",
                        "the etcd password file `{}` has {} more line(s) after line 1; its content is not repeated here",
                        path.display(),
                        n
                    ));
                }
                password.to_string()
            }
            (None, Some(p)) => p,
            (None, None) => {
                return Err(miette::miette!(
                    help = "put the password in a 0600 file and pass --etcd-password-file, or set MEDEA_ETCD_PASSWORD",
                    "--etcd-user `{user}` needs a password"
                ));
            }
        };
        if password.is_empty() {
            return Err(miette::miette!(
                "the etcd password for `{user}` is empty (check --etcd-password-file / MEDEA_ETCD_PASSWORD)"
            ));
        }
        Ok(Some(crate::store::etcd::EtcdCredentials {
            user: user.clone(),
            password: crate::secret::Secret::new(password),
        }))
    }
}

/// An open store and this process's leadership over it.
pub struct Opened {
    pub store: Arc<dyn Store>,
    pub leadership: Leadership,
    /// `etcd://…` or the directory, for logs.
    pub location: String,
}

impl HaArgs {
    pub fn replica_id(&self) -> String {
        self.replica.clone().unwrap_or_else(hostname)
    }
}

pub fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "medea".into())
}

/// Open the store at `location`; for etcd, start campaigning as `replica`.
pub fn open_store(location: &StoreLocation, ha: &HaArgs) -> miette::Result<Opened> {
    let replica = ha.replica_id();
    match location {
        StoreLocation::Dir(path) => {
            refuse_etcd_flags(path, &ha.etcd)?;
            let store = super::store::open_dir(path, "start this one again")?;
            Ok(Opened {
                store: Arc::new(store),
                leadership: Leadership::solo(replica),
                location: path.display().to_string(),
            })
        }
        StoreLocation::Etcd(url) => open_etcd(url, ha, replica),
    }
}

fn refuse_etcd_flags(path: &std::path::Path, etcd: &EtcdArgs) -> miette::Result<()> {
    if etcd.any() {
        return Err(miette::miette!(
            help = "pass --store etcd://host:2379 to use etcd, or drop the --etcd-* flags",
            "--etcd-* flags only apply to an etcd:// store, and the store is the directory `{}`",
            path.display()
        ));
    }
    Ok(())
}

/// A store for a command that does not lead: for an `etcd://` store, a client that only
/// reads and writes with compare-and-swap transactions (no campaign; a running leader is
/// undisturbed). `Ok(None)` for a directory: the caller opens it (fjall's lock names a
/// running server).
pub fn open_etcd_client(
    location: &StoreLocation,
    etcd: &EtcdArgs,
) -> miette::Result<Option<Arc<dyn Store>>> {
    match location {
        StoreLocation::Dir(path) => {
            refuse_etcd_flags(path, etcd)?;
            Ok(None)
        }
        StoreLocation::Etcd(url) => connect_etcd(url, etcd),
    }
}

#[cfg(feature = "etcd")]
fn connect_etcd(
    url: &crate::store::location::EtcdUrl,
    etcd: &EtcdArgs,
) -> miette::Result<Option<Arc<dyn Store>>> {
    Ok(Some(Arc::new(etcd_store(url, etcd)?)))
}

#[cfg(feature = "etcd")]
fn etcd_store(
    url: &crate::store::location::EtcdUrl,
    etcd: &EtcdArgs,
) -> miette::Result<crate::store::etcd::EtcdStore> {
    use crate::store::etcd::{EtcdConfig, EtcdStore, EtcdTls};
    let mut config = EtcdConfig::new(url.clone());
    config.tls = etcd.etcd_ca.as_ref().map(|ca| EtcdTls {
        ca: ca.clone(),
        cert: etcd.etcd_cert.clone(),
        key: etcd.etcd_key.clone(),
    });
    config.insecure = etcd.etcd_insecure;
    config.credentials = etcd.credentials()?;
    let store = EtcdStore::connect(&config).map_err(|e| {
        let chain = crate::error_chain(&e);
        let help = if chain.contains("refusing plaintext") {
            "give etcd TLS (--etcd-ca, and --etcd-cert/--etcd-key for client certificates), or pass --etcd-insecure on a network you trust"
        } else if chain.contains("permission denied") || chain.contains("user name is empty") {
            "etcd has authentication enabled: pass --etcd-user and --etcd-password-file (or MEDEA_ETCD_PASSWORD)"
        } else {
            "check the endpoints, that etcd is up, the --etcd-ca/--etcd-cert/--etcd-key files and the etcd credentials"
        };
        miette::miette!(
            help = help,
            "{chain}"
        )
    })?;
    Ok(store)
}

#[cfg(not(feature = "etcd"))]
fn connect_etcd(
    url: &crate::store::location::EtcdUrl,
    _etcd: &EtcdArgs,
) -> miette::Result<Option<Arc<dyn Store>>> {
    Err(without_etcd(url))
}

#[cfg(feature = "etcd")]
fn open_etcd(
    url: &crate::store::location::EtcdUrl,
    ha: &HaArgs,
    replica: String,
) -> miette::Result<Opened> {
    let store = etcd_store(url, &ha.etcd)?;
    let leadership = store.campaign(replica, ha.leader_ttl);
    Ok(Opened {
        location: store.location().to_string(),
        store: Arc::new(store),
        leadership,
    })
}

#[cfg(not(feature = "etcd"))]
fn open_etcd(
    url: &crate::store::location::EtcdUrl,
    _ha: &HaArgs,
    _replica: String,
) -> miette::Result<Opened> {
    Err(without_etcd(url))
}

#[cfg(not(feature = "etcd"))]
fn without_etcd(url: &crate::store::location::EtcdUrl) -> miette::Report {
    miette::miette!(
        help = "rebuild with `cargo build --release --features etcd`, or use a store directory",
        "`{url}` is an etcd store, but this medea was built without etcd support"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ha() -> HaArgs {
        HaArgs {
            replica: Some("r1".into()),
            leader_ttl: Duration::from_secs(10),
            etcd: EtcdArgs::default(),
        }
    }

    #[test]
    fn etcd_flags_with_a_directory_store_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut args = ha();
        args.etcd.etcd_ca = Some("/etc/etcd/ca.crt".into());
        let err = open_store(&StoreLocation::Dir(dir.path().join("s")), &args)
            .err()
            .expect("refused");
        assert!(
            err.to_string().contains("only apply to an etcd:// store"),
            "{err}"
        );
        assert!(!dir.path().join("s").exists(), "nothing was created");
    }

    #[test]
    fn a_directory_store_leads_alone() {
        let dir = tempfile::tempdir().unwrap();
        let opened = open_store(&StoreLocation::Dir(dir.path().join("s")), &ha()).unwrap();
        assert!(opened.leadership.is_leader());
        assert_eq!(opened.leadership.replica(), "r1");
    }

    #[cfg(not(feature = "etcd"))]
    #[test]
    fn an_etcd_store_without_the_feature_names_the_fix() {
        let loc: StoreLocation = "etcd://127.0.0.1:2379".parse().unwrap();
        let err = open_store(&loc, &ha()).err().expect("refused");
        assert!(
            err.to_string().contains("built without etcd support"),
            "{err}"
        );
        let help = err.help().map(|h| h.to_string()).unwrap_or_default();
        assert!(help.contains("--features etcd"), "{help}");
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn etcd_passwords_come_from_a_file_or_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let mut args = EtcdArgs {
            etcd_user: Some("medea".into()),
            ..EtcdArgs::default()
        };
        let err = args.credentials_from(None).expect_err("no password");
        assert!(err.to_string().contains("needs a password"), "{err}");
        let c = args
            .credentials_from(Some("env-pw".into()))
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.user.as_str(), c.password.expose().as_str()),
            ("medea", "env-pw")
        );
        args.etcd_password_file = Some(file.clone());
        let c = args
            .credentials_from(Some("env-pw".into()))
            .unwrap()
            .unwrap();
        assert_eq!(
            c.password.expose(),
            "s3cret",
            "the file wins, without its newline"
        );
        // A typo: a second line, or bytes that are not UTF-8. Refused, naming the file and
        // never what is in it.
        const MARKER: &str = "MARKERSECRET0a1b2c3d4e5f";
        std::fs::write(&file, format!("{MARKER}\nuser: {MARKER}\n")).unwrap();
        let err = args.credentials_from(None).expect_err("two lines");
        let shown = format!("{err:?}");
        assert!(!shown.contains(MARKER), "{shown}");
        assert!(
            err.to_string().contains("more line(s) after line 1"),
            "{err}"
        );
        let mut bad = MARKER.as_bytes().to_vec();
        bad.extend_from_slice(b"\xff\n");
        std::fs::write(&file, bad).unwrap();
        let err = args.credentials_from(None).expect_err("not UTF-8");
        let shown = format!("{err:?}");
        assert!(!shown.contains(MARKER), "{shown}");
        assert!(err.to_string().contains("etcd password file"), "{err}");
        std::fs::write(&file, "\n").unwrap();
        let err = args.credentials_from(None).expect_err("empty");
        assert!(err.to_string().contains("is empty"), "{err}");
        args.etcd_user = None;
        assert!(args.credentials_from(Some("x".into())).unwrap().is_none());
    }
}
