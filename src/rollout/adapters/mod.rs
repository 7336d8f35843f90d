//! The adapters between the executor's ports and the real clients: [`TalosAdapter`] implements
//! [`TalosPort`](super::ports::TalosPort) over [`crate::talos::TalosClient`] (gRPC, mTLS) and
//! [`KubeAdapter`] implements [`KubePort`](super::ports::KubePort) over
//! [`crate::k8s::KubeClient`] (kube-rs). This is the one part of `rollout` that depends on
//! `talos` and `k8s`; the machine and the executor only see the ports.
//!
//! What they add to the clients:
//! - **error classes**: every client error becomes [`PortError::Transient`] (worth waiting out:
//!   `UNAVAILABLE`, timeouts, the apiserver away, and every mutating call whose outcome is open,
//!   `TalosError::Indeterminate`) or [`PortError::Failed`] (halt). A transient reply to a
//!   mutating command leaves the command in flight; the executor resolves it by observing the
//!   node before anything is called again (`design/rollout.md`, "At most once").
//! - **`next_boot`**: what a node boots next, read from systemd-boot's `LoaderEntryDefault`
//!   EFI variable through `MachineService.Read` ([`talos::next_boot_from_efivar`]); nodes that
//!   cannot tell (GRUB, no efivarfs, no permission) report `NextBoot::Unknown`.
//! - **metrics**: every Talos and Kubernetes call is timed into
//!   [`crate::metrics::observe_call`] (`api` = `talos` / `kubernetes`).
//!
//! Credentials follow the daemon's layout, `<creds-dir>/<cluster>/{talosconfig,kubeconfig}`
//! ([`cluster_creds_dir`]). Their contents are never logged.

mod kube;
mod machine_config;
mod talos;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use self::kube::KubeAdapter;
pub use self::machine_config::{check_only_image_changed, set_component_image_in};
pub use self::talos::{
    LOADER_ENTRY_DEFAULT, TALOSCONFIG_FILE, TalosAdapter, component_images_of,
    next_boot_from_efivar,
};

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
/// `tick` (retries from `tick` up to `8 × tick`, 4 attempts; drain polled every `tick`), for
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

/// Run one client call and record its latency and success.
async fn timed<T, E>(
    api: &'static str,
    method: &'static str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let start = Instant::now();
    let r = call.await;
    crate::metrics::observe_call(api, method, start.elapsed(), r.is_ok());
    r
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
