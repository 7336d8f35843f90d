//! The server-side drain of Talos' legacy `MachineService.Upgrade`, as the kube-apiserver sees
//! it: evictions of a node's pods sent by the node itself, whatever the client drained or
//! skipped before.
//!
//! Upstream (siderolabs/talos v1.12/v1.13, the same in v1.14 and main):
//! `internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer.go` `Upgrade` runs phase
//! `drain` (`CordonAndDrainNode` in `v1alpha1_sequencer_tasks.go`, skipped only when the
//! kubelet does not register the node) before it stops the pods, installs and reboots;
//! `pkg/kubernetes/kubernetes.go` `Client.Drain` lists the node's pods (`spec.nodeName`) and
//! evicts, through the eviction subresource (so PodDisruptionBudgets hold), every pod but
//! mirror pods, pods without a controller and DaemonSet pods. It knows no skip list.

use jiff::Timestamp;
use serde_json::Value;
use tokio::time::Instant;

use super::{KubeSide, controller_of, is_mirror};
use crate::sim::kube::ClusterRecord;
use crate::sim::kube::store::{name_of, ns_of};

/// Whether upstream's `Client.Drain` evicts `pod`: not a mirror pod
/// (`kubernetes.io/config.mirror`), owned by a controller (`metav1.GetControllerOf`), and that
/// controller not a DaemonSet. A pod already terminating is evicted again (upstream logs
/// "skipping deleted pod" but does not skip it).
pub(crate) fn evicted_by_talos_drain(pod: &Value) -> bool {
    !is_mirror(pod) && controller_of(pod).is_some_and(|(kind, _, _)| kind != "DaemonSet")
}

impl KubeSide {
    /// Run each server-side drain the node source started since the last look
    /// ([`crate::sim::node::NodeSource::talos_drains`]), before the pass that sees the node go
    /// down: the node drains while it is still up.
    pub(super) fn talos_drains(&mut self, now: Instant, wall: Timestamp) {
        for (node, count) in self.source.talos_drains() {
            let seen = self.talos_drains_seen.entry(node.clone()).or_insert(0);
            if *seen >= count {
                continue;
            }
            *seen = count;
            self.talos_drain(&node, now, wall);
        }
    }

    /// One drain of `node`: each pod upstream's drain picks is evicted once, with the
    /// eviction subresource's rules ([`KubeSide::evict`]); a refusal (a PodDisruptionBudget's
    /// 429) leaves the pod. Upstream retries a 429 every 5 s within its 5-minute
    /// `DrainTimeout`, then logs it and goes on with the upgrade: the simulator tries once and
    /// never holds the reboot (the node's reboot began with the call). The evictions count in
    /// [`crate::sim::kube::KubeCounters::talos_drain_evictions`] / `talos_drain_refused`, not
    /// in the counters of the clients' evictions.
    fn talos_drain(&mut self, node: &str, now: Instant, wall: Timestamp) {
        let pods: Vec<(String, String)> = self
            .store
            .pods_on_node(node, None)
            .filter(|p| evicted_by_talos_drain(p))
            .map(|p| (ns_of(p).to_string(), name_of(p).to_string()))
            .collect();
        for (ns, name) in pods {
            let clients = (self.counters.evictions, self.counters.evictions_blocked);
            let result = self.evict(&ns, &name, now, wall);
            (self.counters.evictions, self.counters.evictions_blocked) = clients;
            let pod = format!("{ns}/{name}");
            let node = node.to_string();
            if result.is_ok() {
                self.counters.talos_drain_evictions += 1;
                self.record(ClusterRecord::TalosEvicted { pod, node });
            } else {
                self.counters.talos_drain_refused += 1;
                self.record(ClusterRecord::TalosEvictionRefused { pod, node });
            }
        }
    }
}
