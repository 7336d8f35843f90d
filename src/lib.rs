//! medea: an external control plane for Talos Linux Kubernetes clusters.
//!
//! See `design/architecture.md` for the module map. Domain modules (`desired`, `plan`,
//! `approval`, `rollout::machine`) are pure; adapters (`store`, `talos`, `k8s`) sit at the edge.

pub mod cli;
pub mod desired;
pub mod inventory;
pub mod plan;
pub mod rollout;
pub mod sim;
pub mod store;
pub mod version;
