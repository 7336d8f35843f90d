//! The single integration-test binary (one link of kube/tonic/fjall instead of many).

mod architecture;
mod cli;
mod desired;
mod rollout;
mod store;
