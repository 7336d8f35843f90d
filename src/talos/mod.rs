//! The Talos machine API adapter: talosconfig, a gRPC client over mutual TLS, and the generated
//! wire types.
//!
//! **Owns:** the talosconfig format ([`config`]), the generated code of `proto/talos`
//! ([`proto`]), [`TalosClient`] and the [`TalosApi`] trait with its domain types ([`types`]).
//! **May depend on:** the `talos` row of design/architecture.md's code map (the one list,
//! checked by `tests/it/architecture.rs`), plus tonic/prost/rustls. Nothing in here plans or
//! sequences rollouts: the executor drives nodes through the port that `adapter` implements.
//!
//! Architecture Invariants:
//! - Every request names exactly one target in the single-valued `node` metadata key; the
//!   deprecated `nodes` fan-out key is never sent.
//! - Prost types never leave this module: [`TalosApi`] returns the domain types of [`types`].
//! - A mutating call (Upgrade, Reboot, ApplyConfiguration) is retried only when the request
//!   provably never left the client; a failure the node itself answered (`UNKNOWN`/`INTERNAL`
//!   from the handler) is [`TalosError::Refused`] (definitive); every other failure of it is
//!   [`TalosError::Indeterminate`] (see [`retry`]).
//! - Upgrade never sets `force`; the RPC is chosen from the node's running version
//!   ([`UpgradeRpc::for_running`]).
//! - Key material is held in [`crate::secret::Secret`] and never logged.

pub mod adapter;
pub mod api;
pub mod client;
pub mod config;
pub(crate) mod pbstruct;
pub mod proto;
pub mod retry;
pub mod snapshot;
pub mod types;

use std::path::PathBuf;
use std::time::Duration;

pub use api::TalosApi;
pub use client::{ClientSettings, TalosClient};
pub use config::{Endpoint, TalosConfig, TalosConfigError, TalosContext};
pub use retry::RetryPolicy;
pub use types::*;

/// The gRPC metadata key that routes a request to one node through apid.
pub const NODE_METADATA_KEY: &str = "node";
/// The deprecated fan-out key (Talos 1.14 deprecates it). medea never sends it.
pub const NODES_METADATA_KEY: &str = "nodes";
/// Talos' gRPC message size limit (`constants.GRPCMaxMessageSize`).
pub const MAX_MESSAGE_SIZE: usize = 32 * 1024 * 1024;

/// `: <the installer's last non-empty output line>`, or nothing: what an operator reads first
/// in a halt reason or a notification.
fn last_line(output: &[String]) -> String {
    output
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| !l.is_empty())
        .map(|l| format!(": {l}"))
        .unwrap_or_default()
}

/// Why a Talos API operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TalosError {
    #[error("cannot use the talosconfig")]
    Config(#[source] Box<TalosConfigError>),
    #[error("`{value}` is not a valid node target: {reason}")]
    BadNode { value: String, reason: &'static str },
    #[error("`{image}` is not a usable image reference: {reason}")]
    BadImage { image: String, reason: &'static str },
    #[error("`{image}` is not a usable image reference")]
    ImageRef {
        image: String,
        #[source]
        err: crate::image::ImageRefError,
    },
    #[error("failed to set up the gRPC channel to `{endpoint}`")]
    Channel {
        endpoint: String,
        #[source]
        err: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(
        "TLS with the Talos API on node `{node}` failed: {message}; check the talosconfig CA and client certificate, and that the endpoint name is in the server certificate"
    )]
    Tls { node: String, message: String },
    #[error("{op} on node `{node}` failed: {code:?}: {message}")]
    Rpc {
        op: &'static str,
        node: String,
        code: tonic::Code,
        message: String,
    },
    #[error(
        "{op} on node `{node}` may or may not have taken effect ({code:?}: {message}); re-observe the node before calling it again"
    )]
    Indeterminate {
        op: &'static str,
        node: String,
        code: tonic::Code,
        message: String,
    },
    /// A mutating call the node ran and answered with a failure of its own (`UNKNOWN` or
    /// `INTERNAL` from the handler, not from the transport): definitive, nothing is in flight.
    /// See [`retry`] for how it is told apart from a lost reply.
    #[error("node `{node}` ran {op} and it failed ({code:?}): {message}")]
    Refused {
        op: &'static str,
        node: String,
        code: tonic::Code,
        message: String,
    },
    #[error("{op} on node `{node}` timed out after {after:?}")]
    Timeout {
        op: &'static str,
        node: String,
        after: Duration,
    },
    #[error("node `{node}` answered {op} with an error: {message}")]
    NodeError {
        op: &'static str,
        node: String,
        message: String,
    },
    #[error("{op} on node `{node}`: unexpected reply: {what}")]
    BadReply {
        op: &'static str,
        node: String,
        what: String,
    },
    #[error(
        "upgrade of node `{node}` to `{image}` failed: the installer exited with code {exit_code}{}",
        last_line(output)
    )]
    UpgradeExit {
        node: String,
        image: String,
        exit_code: i32,
        /// The installer's last output lines.
        output: Vec<String>,
    },
    #[error("health check on node `{node}` failed: {code:?}: {message}")]
    HealthCheckFailed {
        node: String,
        code: tonic::Code,
        message: String,
        /// Progress lines received before the failure.
        progress: Vec<String>,
    },
    #[error("etcd snapshot destination `{path}` already exists; choose a new path or remove it")]
    SnapshotExists { path: PathBuf },
    #[error("failed to write etcd snapshot file `{path}`")]
    SnapshotIo {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("etcd snapshot from node `{node}` is not usable")]
    SnapshotCorrupt {
        node: String,
        #[source]
        reason: snapshot::TrailerError,
    },
}

impl TalosError {
    /// The gRPC code, for failures that carry one.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            TalosError::Rpc { code, .. }
            | TalosError::Indeterminate { code, .. }
            | TalosError::Refused { code, .. }
            | TalosError::HealthCheckFailed { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// `true` when the node could not be reached (down, rebooting, apid could not route).
    pub fn is_unavailable(&self) -> bool {
        self.code() == Some(tonic::Code::Unavailable)
    }
}

#[cfg(test)]
mod upgrade_exit_tests {
    use super::*;

    #[test]
    fn an_installer_failure_names_its_last_output_line() {
        let e = TalosError::UpgradeExit {
            node: "10.5.0.6".into(),
            image: "ghcr.io/siderolabs/installer:v1.13.9".into(),
            exit_code: 1,
            output: vec![
                "running installer".into(),
                "disk full on /dev/sda".into(),
                " ".into(),
            ],
        };
        assert_eq!(
            e.to_string(),
            "upgrade of node `10.5.0.6` to `ghcr.io/siderolabs/installer:v1.13.9` failed: the installer exited with code 1: disk full on /dev/sda"
        );
        let quiet = TalosError::UpgradeExit {
            node: "n".into(),
            image: "i".into(),
            exit_code: 2,
            output: vec![],
        };
        assert!(quiet.to_string().ends_with("exited with code 2"));
    }
}
