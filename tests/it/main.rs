//! The single integration-test binary (one link of kube/tonic/fjall instead of many).

mod approval;
mod approvals_cli;
mod architecture;
mod bench;
mod cli;
mod deploy;
mod desired;
mod doctor;
mod e2e;
#[cfg(feature = "etcd")]
mod etcd_harness;
mod fixtures;
mod fuzz_smoke;
#[cfg(feature = "etcd")]
mod ha;
mod k8s;
mod kube_sim;
mod ops;
mod plan;
mod rollout;
mod rollout_sim;
mod seed;
mod server;
mod sim_cluster;
mod store;
mod talos;
mod ui_browser;
mod upgrade;
