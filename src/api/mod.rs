//! medea's own gRPC API (`proto/medea/v1/medea.proto`): the generated types and the client.
//!
//! **Owns:** the generated tonic/prost code of the API ([`pb`]), the one message written by hand
//! so the server can send rows it encoded once ([`machines`]), and connecting a client to a
//! running `medea serve` over TLS with a bearer token ([`client`]).
//! **May depend on:** the `api` row of design/architecture.md's code map (the token type). The
//! server implements the service; the CLI, the benchmarks and the demo call it through
//! [`client`].
//!
//! Architecture Invariant: wire types stay at the API edge: the server converts its domain
//! values into [`pb`] messages, and no domain module imports this one.

pub mod client;
pub mod machines;

pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("medea.v1");
    pub use super::machines::ListMachinesResponse;
}
