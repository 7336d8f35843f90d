//! Benchmarks at fleet scale: a deterministic generator and the `medea bench` harness.
//!
//! **Owns:** fleet generation, benchmark scenarios and their reports.
//! **May depend on:** every module (it measures them); nothing depends on it.

pub mod fleet;
