//! Generated code of `proto/talos` (tonic clients and servers, prost messages), one Rust module
//! per proto package: `machine`, `common`, `cluster`, `cosi::resource`, `resource::config`,
//! `talos::resource::definitions::{k8s, runtime, enums, proto, v1alpha1}`, `google::rpc`.
//! Only the adapter (`talos::client`) and the simulator touch these types.

#![allow(
    clippy::all,
    clippy::pedantic,
    deprecated,
    missing_docs,
    rustdoc::all,
    unreachable_pub
)]

include!(concat!(env!("OUT_DIR"), "/talos_api.rs"));
