//! The single integration-test binary (one link of kube/tonic/fjall instead of many).

mod approval;
mod cli;
mod deploy;
mod desired;
mod doctor;
mod fuzz_smoke;
mod k8s;
mod plan;
mod seed;
mod server;
mod sim_cluster;
mod store;
mod talos;
mod upgrade;
