//! Where a store lives: a directory (the embedded fjall store, the default) or an etcd
//! cluster (`etcd://host:2379[,host2:2379…][/prefix]`, for HA replicas).
//!
//! Parsing is available in every build, so that a binary built without the `etcd` feature can
//! still say precisely why an `etcd://` store cannot be opened.

use std::path::PathBuf;
use std::str::FromStr;

/// The key prefix under which medea keeps everything in etcd when the URL names none.
pub const DEFAULT_ETCD_PREFIX: &str = "/medea";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// An embedded fjall store in this directory.
    Dir(PathBuf),
    Etcd(EtcdUrl),
}

/// The endpoints of one etcd cluster and medea's key prefix in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    /// `host:port` of each member, in the order given.
    pub endpoints: Vec<String>,
    /// Starts with `/`, never ends with `/`; every key of this medea lives under it.
    pub prefix: String,
}

impl std::fmt::Display for EtcdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "etcd://{}{}", self.endpoints.join(","), self.prefix)
    }
}

impl std::fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreLocation::Dir(p) => write!(f, "{}", p.display()),
            StoreLocation::Etcd(u) => u.fmt(f),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocationError {
    #[error("store URL `{url}` names no etcd endpoint (expected etcd://host:2379[,host2:2379…])")]
    NoEndpoints { url: String },
    #[error(
        "store URL `{url}`: endpoint `{endpoint}` is not host:port (for example 10.0.0.5:2379)"
    )]
    BadEndpoint { url: String, endpoint: String },
    #[error(
        "store URL `{url}`: the key prefix `{prefix}` must be /-separated non-empty names without `.`-only parts, e.g. /medea or /medea/prod"
    )]
    BadPrefix { url: String, prefix: String },
    #[error("store URL `{url}` uses scheme `{scheme}`; medea stores are a directory or etcd://…")]
    UnknownScheme { url: String, scheme: String },
}

impl FromStr for StoreLocation {
    type Err = LocationError;
    fn from_str(s: &str) -> Result<StoreLocation, LocationError> {
        match s.split_once("://") {
            Some(("etcd", rest)) => parse_etcd(s, rest).map(StoreLocation::Etcd),
            Some((scheme, _))
                if !scheme.is_empty()
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
            {
                Err(LocationError::UnknownScheme {
                    url: s.to_string(),
                    scheme: scheme.to_string(),
                })
            }
            _ => Ok(StoreLocation::Dir(PathBuf::from(s))),
        }
    }
}

fn parse_etcd(url: &str, rest: &str) -> Result<EtcdUrl, LocationError> {
    let (hosts, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let endpoints: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_string)
        .collect();
    if endpoints.is_empty() {
        return Err(LocationError::NoEndpoints {
            url: url.to_string(),
        });
    }
    for e in &endpoints {
        let ok = e.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty()
                && !host.contains('/')
                && !host.contains('@')
                && port.parse::<u16>().is_ok_and(|p| p != 0)
        });
        if !ok {
            return Err(LocationError::BadEndpoint {
                url: url.to_string(),
                endpoint: e.clone(),
            });
        }
    }
    let prefix = match prefix.trim_end_matches('/') {
        "" => DEFAULT_ETCD_PREFIX.to_string(),
        p => {
            let bad = p[1..]
                .split('/')
                .any(|seg| seg.is_empty() || seg == "." || seg == "..")
                || p.chars().any(|c| c.is_control() || c == '?' || c == '#');
            if bad {
                return Err(LocationError::BadPrefix {
                    url: url.to_string(),
                    prefix: p.to_string(),
                });
            }
            p.to_string()
        }
    };
    Ok(EtcdUrl { endpoints, prefix })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etcd(s: &str) -> EtcdUrl {
        match s.parse::<StoreLocation>().unwrap() {
            StoreLocation::Etcd(u) => u,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn paths_and_etcd_urls() {
        assert_eq!(
            "/var/lib/medea/store".parse::<StoreLocation>().unwrap(),
            StoreLocation::Dir("/var/lib/medea/store".into())
        );
        assert_eq!(
            "relative/dir".parse::<StoreLocation>().unwrap(),
            StoreLocation::Dir("relative/dir".into())
        );
        let u = etcd("etcd://127.0.0.1:2379,10.0.0.2:22379");
        assert_eq!(u.endpoints, ["127.0.0.1:2379", "10.0.0.2:22379"]);
        assert_eq!(u.prefix, "/medea");
        assert_eq!(u.to_string(), "etcd://127.0.0.1:2379,10.0.0.2:22379/medea");
        let u = etcd("etcd://etcd-0.etcd:2379/medea/prod/");
        assert_eq!(u.endpoints, ["etcd-0.etcd:2379"]);
        assert_eq!(u.prefix, "/medea/prod");
        assert_eq!(etcd("etcd://[::1]:2379").endpoints, ["[::1]:2379"]);
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        let e = "etcd://".parse::<StoreLocation>().unwrap_err();
        assert!(matches!(e, LocationError::NoEndpoints { .. }), "{e}");
        let e = "etcd://host".parse::<StoreLocation>().unwrap_err();
        assert!(
            matches!(&e, LocationError::BadEndpoint { endpoint, .. } if endpoint == "host"),
            "{e}"
        );
        assert!(e.to_string().contains("host:port"));
        let e = "etcd://h:0".parse::<StoreLocation>().unwrap_err();
        assert!(matches!(e, LocationError::BadEndpoint { .. }), "{e}");
        let e = "etcd://h:2379/a//b".parse::<StoreLocation>().unwrap_err();
        assert!(matches!(e, LocationError::BadPrefix { .. }), "{e}");
        let e = "etcd://h:2379/a/../b".parse::<StoreLocation>().unwrap_err();
        assert!(matches!(e, LocationError::BadPrefix { .. }), "{e}");
        let e = "postgres://h/db".parse::<StoreLocation>().unwrap_err();
        assert!(
            matches!(&e, LocationError::UnknownScheme { scheme, .. } if scheme == "postgres"),
            "{e}"
        );
    }
}
