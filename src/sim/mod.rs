//! The simulator: a Talos machine API and a kube-apiserver that speak the real wire formats.
//!
//! **Owns:** simulated nodes, their PKI, fault injection, side-effect counters.
//! **May depend on:** the `sim` row of design/architecture.md's code map (the one list, checked
//! by `tests/it/architecture.rs`): wire types of the clients, never their logic.
//! Architecture Invariant: the simulator speaks the real protocols on real sockets; test knobs
//! live on a separate control surface (Rust handles and scenario files), never in the wire API.

pub mod bbolt;
pub mod cluster;
pub mod etcd;
pub mod kube;
pub mod node;
pub mod pki;
pub mod reference;
pub mod talos;
