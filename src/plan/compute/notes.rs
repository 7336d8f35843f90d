//! The notes a cluster's plan carries for people: why machines are unavailable, what is
//! skipped, what to run next.

use std::collections::{BTreeMap, BTreeSet};

use super::*;

impl<'a> ClusterCtx<'a> {
    pub(super) fn notes(
        &self,
        members: &BTreeMap<String, Vec<Member<'a>>>,
        steps: &[Step],
    ) -> Vec<String> {
        // `rolloutsEnabled` is a gate, not part of what a plan does: it must not change the
        // plan's id (an approved plan waits for the gate; `medea approve` names closed gates),
        // so no note speaks of it.
        let mut notes = Vec::new();
        let managed: BTreeSet<&str> = members
            .values()
            .flatten()
            .map(|m| m.machine.node.as_str())
            .collect();
        let unmanaged: Vec<&str> = self
            .obs
            .machines
            .keys()
            .map(String::as_str)
            .filter(|n| !managed.contains(n))
            .collect();
        if !unmanaged.is_empty() {
            notes.push(format!(
                "not in any pool (medea never upgrades their Talos): {}",
                unmanaged.join(", ")
            ));
        }
        for pool in self.cluster.pools.values() {
            if !members.contains_key(&pool.name.value) {
                notes.push(format!(
                    "node pool `{}` selects no observed machine",
                    pool.name.value
                ));
            }
        }
        let away: Vec<String> = self
            .obs
            .machines
            .values()
            .filter(|m| m.unavailable())
            .map(|m| format!("{} ({})", m.node, why_unavailable(m)))
            .collect();
        if !away.is_empty() {
            notes.push(format!(
                "unavailable now, counted against maxUnavailable: {}",
                away.join(", ")
            ));
        }
        let unknown_kubelet: Vec<&str> = self
            .obs
            .machines
            .values()
            .filter(|m| m.kubelet_version.is_none())
            .map(|m| m.node.as_str())
            .collect();
        if !unknown_kubelet.is_empty() {
            notes.push(format!(
                "kubelet version unknown (not checked against the API server): {}",
                unknown_kubelet.join(", ")
            ));
        }
        notes.extend(skip_pods_on_legacy_upgrades(steps));
        if !steps.is_empty() {
            notes.extend(
                self.cluster
                    .exclusions
                    .iter()
                    .map(|e| crate::plan::preflight::exclusion::note(e, steps)),
            );
        }
        notes
    }
}

/// Machines whose hop starts on Talos < 1.13 in a pool that sets `drain.skipPods`: medea drains
/// them first and keeps the selected pods, but the legacy `MachineService.Upgrade` it must call
/// on such a node runs the node's own drain before installing (siderolabs/talos v1.12.11
/// `internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer.go` `Upgrade`: phase `drain`,
/// `CordonAndDrainNode`; `pkg/kubernetes/kubernetes.go` `Client.Drain` evicts every pod a
/// controller other than a DaemonSet owns, mirror and bare pods aside), which knows no skip
/// list. One note per pool hop that has such machines.
fn skip_pods_on_legacy_upgrades(steps: &[Step]) -> Vec<String> {
    let mut notes = Vec::new();
    for step in steps {
        let Step::Talos(t) = step else {
            continue;
        };
        if t.drain.skip_pods.is_empty() {
            continue;
        }
        let mut legacy: Vec<String> = t
            .waves
            .iter()
            .flatten()
            .filter(|m| !m.from.upgrades_through_lifecycle())
            .map(|m| m.node.clone())
            .collect();
        if legacy.is_empty() {
            continue;
        }
        legacy.sort();
        let selector: Vec<String> = t
            .drain
            .skip_pods
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        notes.push(format!(
            "node pool `{}`, hop {}/{} to {}: drain.skipPods ({}) does not hold for {}, which run{} Talos < 1.13: the legacy MachineService.Upgrade drains the node itself before installing and evicts every pod a controller owns (DaemonSets aside), the skipped ones included",
            t.pool,
            t.hop,
            t.hops,
            t.to,
            selector.join(","),
            machines_text(&legacy),
            if legacy.len() == 1 { "s" } else { "" },
        ));
    }
    notes
}

pub(super) fn why_unavailable(m: &Machine) -> String {
    let mut why = Vec::new();
    if !m.reachable {
        why.push("unreachable");
    }
    if !m.ready {
        why.push("NotReady");
    }
    if m.cordoned {
        why.push("cordoned");
    }
    why.join(", ")
}

pub(super) fn role_text(r: MachineRole) -> &'static str {
    match r {
        MachineRole::Controlplane => "control-plane",
        MachineRole::Worker => "worker",
    }
}

pub(super) fn machines_text(nodes: &[String]) -> String {
    let quoted: Vec<String> = nodes.iter().map(|n| format!("`{n}`")).collect();
    format!(
        "machine{} {}",
        if nodes.len() == 1 { "" } else { "s" },
        quoted.join(", ")
    )
}
