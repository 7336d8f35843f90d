//! The single integration-test binary (one link of kube/tonic/fjall instead of many).

mod cli;
mod desired;
#[cfg(feature = "etcd")]
mod etcd_harness;
#[cfg(feature = "etcd")]
mod ha;
mod server;
mod store;
