//! Store selection for `medea serve` (and the hidden HA probe): a directory, or an etcd cluster
//! for HA replicas, with the etcd TLS options, the replica id and the leader lease TTL.

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
    #[arg(long, default_value = "10s", env = "MEDEA_LEADER_TTL", value_parser = parse_duration)]
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
}

/// `500ms`, `2s`, `1m30s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Some(ms) = s.strip_suffix("ms") {
        return ms
            .parse()
            .map(Duration::from_millis)
            .map_err(|_| format!("invalid duration `{s}` (e.g. 500ms, 10s, 1m)"));
    }
    crate::desired::validate::parse_duration(s)
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
            let store = crate::store::fjall::FjallStore::open(path)
                .map_err(|e| miette::miette!("{}", crate::error_chain(&e)))?;
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
    if etcd.etcd_ca.is_some() || etcd.etcd_cert.is_some() {
        return Err(miette::miette!(
            help = "pass --store etcd://host:2379 to use etcd, or drop the --etcd-* flags",
            "--etcd-ca/--etcd-cert/--etcd-key only apply to an etcd:// store, and the store is the directory `{}`",
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
    let store = EtcdStore::connect(&config).map_err(|e| {
        miette::miette!(
            help = "check the endpoints, that etcd is up, and the --etcd-ca/--etcd-cert/--etcd-key files",
            "{}",
            crate::error_chain(&e)
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
        help = "rebuild with `cargo build --release --features etcd` (it needs protoc: apt-get install protobuf-compiler libprotobuf-dev), or use a store directory",
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

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert!(parse_duration("ten").is_err());
    }
}
