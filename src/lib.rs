//! medea: an external control plane for Talos Linux Kubernetes clusters.
//!
//! See `design/architecture.md` for the module map. Domain modules (`desired`, `plan`,
//! `approval`, `rollout::machine`) are pure; adapters (`store`, `talos`, `k8s`) sit at the edge.

pub mod cli;
pub mod k8s;
pub mod plan;
pub mod sim;
pub mod version;
