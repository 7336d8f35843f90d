//! The application layer: medea's use cases, between the pure domain and the edges.
//!
//! **Owns:** the operations the daemon and the CLI share: replanning (desired state +
//! observations + running jobs → a stored plan; [`replan`], with the plan and last-applied
//! loaders), rendering desired-state diagnostics for the CLI and the API ([`report`]), loading
//! jobs from the journal, observing a cluster through the Talos and Kubernetes clients, and
//! `medea doctor`'s checks.
//! **May depend on:** the domain modules (`desired`, `plan`, `approval`, `rollout`), `store`,
//! and the clients behind the domain's ports (`talos`, `k8s`).
//! **Used by:** `server` and `cli`; never by the domain modules.
//!
//! The domain stays pure because this layer does its I/O: it reads the store, calls the
//! clients, and hands plain values to `plan::compute` and the rollout state machine.

pub mod cluster_ports;
pub mod doctor;
pub mod jobs;
pub mod preflight;
pub mod refresh;
pub mod replan;
pub mod report;
