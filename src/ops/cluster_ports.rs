//! The rollout ports of one cluster, built from the daemon's credentials layout
//! (`<creds-dir>/<cluster>/{talosconfig,kubeconfig}`): [`TalosAdapter`] (the Talos port over
//! [`crate::talos::TalosClient`], in `talos::adapter`) and [`KubeAdapter`] (the Kubernetes port
//! over [`crate::k8s::KubeClient`], in `k8s::adapter`).
//!
//! The adapters themselves live at the edge with their clients; what they add to them (error
//! classes, `next_boot`, call metrics) is documented there. This module only knows where a
//! cluster's credentials are ([`cluster_creds_dir`]) and how to build both adapters for it
//! ([`TalosAdapter::from_creds`], [`KubeAdapter::from_creds`], [`paced`]), and is the
//! executor's [`PortFactory`] ([`CredsPorts`]). Credentials are never logged.

use std::future::Future;
use std::path::{Path, PathBuf};

pub use crate::k8s::adapter::KubeAdapter;
use crate::k8s::{self, ClientOptions, KubeClient};
use crate::rollout::ports::{KubePort, TalosPort};
pub use crate::talos::adapter::{TALOSCONFIG_FILE, TalosAdapter};
use crate::talos::{ClientSettings, TalosClient};

/// Builds the ports of a cluster's executor (the real adapters in `medea serve`, fakes in
/// tests).
pub trait PortFactory: Send + Sync + 'static {
    type Talos: TalosPort + 'static;
    type Kube: KubePort + 'static;
    fn ports(
        &self,
        cluster: &str,
    ) -> impl Future<Output = Result<(Self::Talos, Self::Kube), AdapterError>> + Send;
    /// The health probes of a cluster's executor. Prometheus and Alertmanager come from each
    /// gate's context (the approved plan's sources); the default has no kube client, so
    /// workloads gates fail (never pass) — factories with credentials give it one.
    fn probe(
        &self,
        _cluster: &str,
    ) -> impl Future<Output = Result<crate::health::Probes, AdapterError>> + Send {
        std::future::ready(Ok(crate::health::Probes::new(
            crate::plan::health::HealthSources::default(),
        )))
    }
}

/// The real ports of a cluster, from `<creds-dir>/<cluster>/{talosconfig,kubeconfig}`.
pub struct CredsPorts {
    pub creds_dir: std::path::PathBuf,
    /// The clients' pace ([`paced`]); zero: the adapters' defaults.
    pub tick: std::time::Duration,
}

impl PortFactory for CredsPorts {
    type Talos = TalosAdapter;
    type Kube = KubeAdapter;
    async fn ports(&self, cluster: &str) -> Result<(Self::Talos, Self::Kube), AdapterError> {
        paced(&self.creds_dir, cluster, self.tick).await
    }
    async fn probe(&self, cluster: &str) -> Result<crate::health::Probes, AdapterError> {
        health_probes(
            &self.creds_dir,
            cluster,
            crate::plan::health::HealthSources::default(),
        )
        .await
    }
}

/// Why an adapter could not be built for a cluster.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error(
        "`{cluster}` cannot name a credentials directory: {reason}; use the cluster's name as the inventory knows it"
    )]
    ClusterName {
        cluster: String,
        reason: &'static str,
    },
    #[error(
        "cannot use the talosconfig of cluster `{cluster}` at `{path}` (medea expects <creds-dir>/<cluster>/talosconfig)"
    )]
    Talos {
        cluster: String,
        path: PathBuf,
        #[source]
        err: Box<crate::talos::TalosError>,
    },
    #[error(
        "cannot use the kubeconfig of cluster `{cluster}` at `{path}` (medea expects <creds-dir>/<cluster>/kubeconfig)"
    )]
    Kube {
        cluster: String,
        path: PathBuf,
        #[source]
        err: Box<crate::k8s::K8sError>,
    },
}

/// Both adapters for `cluster` with their clients' retries and the drain's polling scaled to
/// `tick` (retries from `tick` up to `8 × tick`, 4 attempts; drain polled every `tick`; the
/// manifests sync retries every `tick` for `180 × tick` and polls every `tick`), for
/// runs whose simulated waits are milliseconds (the crash harness, `medea bench rollout`).
/// A zero tick gives the defaults the daemon uses. Must run inside a tokio runtime.
pub async fn paced(
    creds_dir: &Path,
    cluster: &str,
    tick: std::time::Duration,
) -> Result<(TalosAdapter, KubeAdapter), AdapterError> {
    use crate::k8s::{ClientOptions, DrainOptions};
    use crate::talos::{ClientSettings, RetryPolicy};
    if tick.is_zero() {
        let talos = TalosAdapter::from_creds(creds_dir, cluster)?;
        let kube = KubeAdapter::from_creds(creds_dir, cluster).await?;
        return Ok((talos, kube));
    }
    let talos = TalosAdapter::from_creds_with(
        creds_dir,
        cluster,
        ClientSettings {
            retry: RetryPolicy {
                min_delay: tick,
                max_delay: tick * 8,
                max_attempts: 4,
            },
            ..ClientSettings::default()
        },
    )?;
    let kube = KubeAdapter::from_creds_with(
        creds_dir,
        cluster,
        ClientOptions {
            retry: crate::k8s::RetryPolicy {
                attempts: 4,
                min_delay: tick,
                max_delay: tick * 8,
            },
            manifests: crate::k8s::ManifestSyncOptions {
                retry_for: tick * 180,
                retry_interval: tick,
                poll_interval: tick,
                ..crate::k8s::ManifestSyncOptions::default()
            },
        },
    )
    .await?
    .with_drain_policy(DrainOptions {
        min_backoff: tick,
        max_backoff: tick * 8,
        poll_interval: tick,
        ..DrainOptions::default()
    });
    Ok((talos, kube))
}

/// The health probes of `cluster` for a plan's health sources (issue #23): Prometheus and
/// Alertmanager as the plan names them, with the credentials they name resolved under
/// `<creds_dir>/<cluster>/health/` ([`health_credentials`]), and the cluster's kube client from
/// `<creds_dir>/<cluster>/kubeconfig` for workloads gates. The executor builds one per job
/// from the approved plan's `HealthPolicy::sources`. Must run inside a tokio runtime.
pub async fn health_probes(
    creds_dir: &Path,
    cluster: &str,
    sources: crate::plan::health::HealthSources,
) -> Result<crate::health::Probes, AdapterError> {
    let dir = cluster_creds_dir(creds_dir, cluster)?;
    let client = KubeClient::from_creds_dir(&dir, ClientOptions::default())
        .await
        .map_err(|err| AdapterError::Kube {
            cluster: cluster.to_string(),
            path: k8s::kubeconfig::path_in(&dir),
            err: Box::new(err),
        })?;
    Ok(crate::health::Probes::new(sources)
        .with_credentials(crate::health::http::Credentials::Dir(
            dir.join(HEALTH_CREDENTIALS_DIR),
        ))
        .with_hook_credentials(crate::health::http::Credentials::Dir(
            dir.join(HOOK_CREDENTIALS_DIR),
        ))
        .with_kube(std::sync::Arc::new(client)))
}

/// The directory, inside a cluster's credentials directory, of the credentials its health
/// sources name: `<creds-dir>/<cluster>/health/<credential>/{token,ca.pem}`.
pub const HEALTH_CREDENTIALS_DIR: &str = "health";

/// The directory, inside a cluster's credentials directory, of the credentials its HTTP hooks
/// name (issue #35): `<creds-dir>/<cluster>/hooks/<credential>/{token,ca.pem}`.
pub const HOOK_CREDENTIALS_DIR: &str = "hooks";

/// Where the credentials `cluster`'s health sources name are resolved:
/// `<creds_dir>/<cluster>/health` (issue #32: the server's files, never a path from the desired
/// state).
pub fn health_credentials(
    creds_dir: &Path,
    cluster: &str,
) -> Result<crate::health::http::Credentials, AdapterError> {
    Ok(crate::health::http::Credentials::Dir(
        cluster_creds_dir(creds_dir, cluster)?.join(HEALTH_CREDENTIALS_DIR),
    ))
}

/// `<creds_dir>/<cluster>`, refusing cluster names that are not one plain path component.
pub fn cluster_creds_dir(creds_dir: &Path, cluster: &str) -> Result<PathBuf, AdapterError> {
    let bad = |reason| AdapterError::ClusterName {
        cluster: cluster.to_string(),
        reason,
    };
    if cluster.is_empty() {
        return Err(bad("it is empty"));
    }
    if cluster == "." || cluster == ".." {
        return Err(bad("`.` and `..` are not names"));
    }
    if cluster.contains('/') || cluster.contains('\\') {
        return Err(bad("it contains a path separator"));
    }
    if !cluster.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad(
            "it contains whitespace, control or non-ASCII characters",
        ));
    }
    Ok(creds_dir.join(cluster))
}

impl TalosAdapter {
    /// The adapter for `cluster`, from `<creds_dir>/<cluster>/talosconfig` (its current
    /// context), with the client's default timeouts and retries. Must run inside a tokio
    /// runtime; no connection is made until the first call.
    pub fn from_creds(creds_dir: &Path, cluster: &str) -> Result<TalosAdapter, AdapterError> {
        TalosAdapter::from_creds_with(creds_dir, cluster, ClientSettings::default())
    }

    /// [`Self::from_creds`] with explicit client settings.
    pub fn from_creds_with(
        creds_dir: &Path,
        cluster: &str,
        settings: ClientSettings,
    ) -> Result<TalosAdapter, AdapterError> {
        let path = cluster_creds_dir(creds_dir, cluster)?.join(TALOSCONFIG_FILE);
        let (client, _ctx) =
            TalosClient::from_talosconfig(&path, None, settings).map_err(|err| {
                AdapterError::Talos {
                    cluster: cluster.to_string(),
                    path: path.clone(),
                    err: Box::new(err),
                }
            })?;
        Ok(TalosAdapter::new(client))
    }
}

impl KubeAdapter {
    /// The adapter for `cluster`, from `<creds_dir>/<cluster>/kubeconfig` (its current context).
    pub async fn from_creds(creds_dir: &Path, cluster: &str) -> Result<KubeAdapter, AdapterError> {
        KubeAdapter::from_creds_with(creds_dir, cluster, ClientOptions::default()).await
    }

    /// [`Self::from_creds`] with explicit client options (retries).
    pub async fn from_creds_with(
        creds_dir: &Path,
        cluster: &str,
        options: ClientOptions,
    ) -> Result<KubeAdapter, AdapterError> {
        let dir = cluster_creds_dir(creds_dir, cluster)?;
        let client = KubeClient::from_creds_dir(&dir, options)
            .await
            .map_err(|err| AdapterError::Kube {
                cluster: cluster.to_string(),
                path: k8s::kubeconfig::path_in(&dir),
                err: Box::new(err),
            })?;
        Ok(KubeAdapter::new(client))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_names_must_be_one_path_component() {
        let root = Path::new("/creds");
        assert_eq!(
            cluster_creds_dir(root, "prod-eu.1").unwrap(),
            Path::new("/creds/prod-eu.1")
        );
        for bad in ["", ".", "..", "a/b", "../x", "a b", "é"] {
            let e = cluster_creds_dir(root, bad).unwrap_err();
            assert!(
                matches!(e, AdapterError::ClusterName { .. }),
                "{bad:?}: {e}"
            );
        }
    }
}
