//! medea: an external control plane for Talos Linux Kubernetes clusters.
//!
//! See `design/architecture.md` for the module map. Domain modules (`desired`, `plan`,
//! `approval`, `rollout::sequencer`) are pure; adapters (`store`, `talos`, `k8s`) sit at the edge.

pub mod api;
pub mod api_lifecycle;
pub mod backup;
// Every public item of these domain modules is documented (issue #34 item 7).
#[warn(missing_docs)]
pub mod approval;
pub mod bench;
pub mod build_info;
pub mod cli;
#[warn(missing_docs)]
pub mod desired;
pub mod duration;
pub mod fuzz;
pub mod health;
pub mod image;
pub mod inventory;
pub mod k8s;
pub mod metrics;
pub mod ops;
#[warn(missing_docs)]
pub mod plan;
pub mod private_file;
#[warn(missing_docs)]
pub mod rehearsal;
pub mod rollout;
pub mod secret;
pub mod server;
pub mod sim;
pub mod store;
pub mod talos;
pub mod version;
pub mod webhook;

/// Render an error with its whole `source()` chain, for logs: `outer: inner: root cause`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
