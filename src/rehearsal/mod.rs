//! Rehearsal on a twin (issue #36 item 4): before a plan is approved, run it on a simulated
//! twin of the observed cluster, in-process and with compressed time, and report the predicted
//! timeline per wave and the blockers the run met.
//!
//! **Owns:** the twin (a simulator scenario built from an [`ObservedCluster`] and its
//! [`Census`]), the compression of a plan's durations, and the [`report::Rehearsal`] a run
//! produces.
//! **May depend on:** the `rehearsal` row of design/architecture.md's code map (the one list,
//! checked by `tests/it/architecture.rs`). Starting the twin and driving the executor is the
//! edge's job.
//! Architecture Invariant: a rehearsal never changes a plan or its id; its report is stored
//! beside the plan and shown to signers as advice. The twin never dials anything but
//! loopback: it listens on 127.0.0.1 and its nodes have loopback addresses, whatever the
//! observed cluster's addresses are (issue #32).
//!
//! [`ObservedCluster`]: crate::inventory::ObservedCluster
//! [`Census`]: crate::inventory::census::Census

pub mod compress;
pub mod render;
pub mod report;
pub mod show;
pub mod twin;
