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
        notes.extend(current_minor_not_topped_up(self.catalog, steps));
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
/// list, keeps no emptyDir data (`drain.deleteEmptyDirData: false` does not hold for the
/// skipped pods) and is followed at once by the reboot (medea's wait for volumes to detach,
/// which follows medea's own drain, does not cover the pods it evicts). One note per pool hop
/// that has such machines, naming each of those settings the pool sets.
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
        // what else of the pool's drain policy the node's own drain ignores for those pods
        let mut also = String::new();
        if !t.drain.delete_empty_dir_data {
            also.push_str(
                "; drain.deleteEmptyDirData: false does not hold for them either (their emptyDir data is lost)",
            );
        }
        if t.drain.volume_detach_timeout_secs.is_some() {
            also.push_str(
                "; drain.waitForVolumeDetach does not cover them: the node reboots right after its own drain",
            );
        }
        notes.push(format!(
            "node pool `{}`, hop {}/{} to {}: drain.skipPods ({}) does not hold for {}, which run{} Talos < 1.13: the legacy MachineService.Upgrade drains the node itself before installing and evicts every pod a controller owns (DaemonSets aside), the skipped ones included{also}",
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

/// Machines whose first hop leaves their minor from an older patch than the catalog's newest
/// of that minor: the Talos docs recommend upgrading to the newest patch of the running minor
/// before the next minor (`/work/shared/reference/talos-today.md`, "Compatibility"; talos docs
/// "Upgrading Talos Linux"), medea goes to the next minor at once (Talos' own
/// `MinimumHostUpgradeVersion` allows it). One note per pool and running version, so the
/// operator can choose to plan the top-up first.
fn current_minor_not_topped_up(catalog: &Catalog, steps: &[Step]) -> Vec<String> {
    let mut notes = Vec::new();
    for step in steps {
        let Step::Talos(t) = step else {
            continue;
        };
        if t.hop != 1 {
            continue;
        }
        let mut by_from: BTreeMap<&crate::version::TalosVersion, Vec<String>> = BTreeMap::new();
        for m in t.waves.iter().flatten() {
            let crosses = m.from.major() == t.to.major() && m.from.minor() < t.to.minor();
            let newest = catalog.latest_stable(m.from.minor_line());
            if crosses && newest.is_some_and(|n| n > &m.from) {
                by_from.entry(&m.from).or_default().push(m.node.clone());
            }
        }
        for (from, mut machines) in by_from {
            let Some(newest) = catalog.latest_stable(from.minor_line()) else {
                continue;
            };
            machines.sort();
            notes.push(format!(
                "node pool `{}`: {} run{} {from}, not the newest patch of its minor ({newest}), and go{} straight to {}: the Talos docs recommend the newest patch of the running minor first; to follow them, plan {newest} for the pool before this",
                t.pool,
                machines_text(&machines),
                if machines.len() == 1 { "s" } else { "" },
                if machines.len() == 1 { "es" } else { "" },
                t.to,
            ));
        }
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
