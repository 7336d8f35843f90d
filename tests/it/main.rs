//! The single integration-test binary (one link of kube/tonic/fjall instead of many).

// The whole crate is test code (helpers outside `#[test]` functions included): a panic is how a
// test reports a failure.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a panic is the failure report"
)]

mod approval;
mod approvals_cli;
mod architecture;
mod architecture_tidy;
mod backup;
mod backup_fixture;
mod backup_s3;
mod backup_trust;
mod bench;
mod census;
mod cli;
mod deploy;
mod desired;
mod doctor;
mod e2e;
#[cfg(feature = "etcd")]
mod etcd_harness;
mod first_day;
mod fixtures;
mod fleet;
mod fuzz_smoke;
#[cfg(feature = "etcd")]
mod ha;
mod health;
mod health_probes;
pub mod health_servers;
mod hooks;
mod k8s;
mod kube_sim;
mod loopback;
mod manifests_sync;
mod ops;
mod output_snapshots;
mod plan;
mod plan_scenarios;
mod plan_time;
mod preflight;
mod preflight_observe;
mod readme_links;
mod rehearsal;
mod rollout;
mod rollout_health;
mod rollout_hooks;
mod rollout_pause;
mod rollout_silence;
mod rollout_sim;
mod second_day;
mod secret_errors;
mod seed;
mod server;
mod sim_cluster;
mod sim_etcd;
mod sim_jobs;
mod store;
mod talos;
mod trust;
mod trust_low;
mod twin;
mod ui_browser;
mod upgrade;
