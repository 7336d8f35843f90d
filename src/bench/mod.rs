//! Benchmarks at fleet scale: a deterministic generator and the `medea bench` harness.
//!
//! **Owns:** fleet generation ([`fleet`]), benchmark scenarios ([`pipeline`], [`process`],
//! [`server`], [`rollout`], [`approvals`], [`pools`]), the regression check ([`ci`]), their
//! statistics ([`stats`]) and the host
//! description ([`host`]).
//! **May depend on:** the `bench` row of design/architecture.md's code map (the modules it
//! measures, the API through its client only); nothing but the CLI (`medea bench`) depends on
//! it.
//!
//! Architecture Invariant: targets are measured and reported, never asserted in timed unit
//! tests; every figure is a median of repeated runs, and every ratio compares runs taken side
//! by side in the same process. `design/performance.md` records the results.

pub mod approvals;
pub mod ci;
pub mod fleet;
pub mod host;
pub mod incremental;
pub mod pipeline;
pub mod pools;
pub mod process;
pub mod rollout;
pub mod server;
pub mod stats;

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot read the generated desired state")]
    Desired(#[source] Box<crate::desired::SourceError>),
    #[error("the benchmark input is not what the scenario expects: {what}")]
    Invalid { what: String },
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("cannot start {what}")]
    Spawn {
        what: String,
        #[source]
        err: std::io::Error,
    },
    #[error("store error in the benchmark")]
    Store(#[source] Box<crate::store::StoreError>),
    #[error("the server under test misbehaved: {what}")]
    Server { what: String },
    #[error("the process under test failed: {what}")]
    Process { what: String },
    #[error("the rollout under test failed: {what}")]
    Rollout { what: String },
}

/// Build a tokio runtime (with I/O and time) for a benchmark scenario.
pub(crate) fn runtime(
    mut builder: tokio::runtime::Builder,
) -> Result<tokio::runtime::Runtime, BenchError> {
    builder
        .enable_all()
        .build()
        .map_err(|err| BenchError::Spawn {
            what: "a tokio runtime".into(),
            err,
        })
}
