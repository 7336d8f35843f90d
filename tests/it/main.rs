//! The single integration-test binary (one link of kube/tonic/fjall instead of many).

mod approval;
mod architecture;
mod cli;
mod deploy;
mod desired;
#[cfg(feature = "etcd")]
mod etcd_harness;
mod fuzz_smoke;
mod ha;
mod k8s;
mod plan;
mod rollout;
mod rollout_sim;
mod server;
mod store;
mod talos;
mod upgrade;
