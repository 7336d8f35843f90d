//! The notes a cluster's plan carries for people: why machines are unavailable, what is
//! skipped, what to run next.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::plan::note::Away;

impl<'a> ClusterCtx<'a> {
    pub(super) fn notes(
        &self,
        members: &BTreeMap<String, Vec<Member<'a>>>,
        steps: &[Step],
    ) -> Vec<Note> {
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
            notes.push(Note::Unmanaged {
                machines: unmanaged.iter().map(|n| n.to_string()).collect(),
            });
        }
        for pool in self.cluster.pools.values() {
            if !members.contains_key(&pool.name.value) {
                notes.push(Note::PoolSelectsNothing {
                    pool: pool.name.value.clone(),
                });
            }
        }
        let away: Vec<Away> = self
            .obs
            .machines
            .values()
            .filter(|m| m.unavailable())
            .map(|m| Away {
                node: m.node.clone(),
                why: why_unavailable(m),
            })
            .collect();
        if !away.is_empty() {
            notes.push(Note::Unavailable { machines: away });
        }
        let unknown_kubelet: Vec<&str> = self
            .obs
            .machines
            .values()
            .filter(|m| m.kubelet_version.is_none())
            .map(|m| m.node.as_str())
            .collect();
        if !unknown_kubelet.is_empty() {
            notes.push(Note::KubeletUnknown {
                machines: unknown_kubelet.iter().map(|n| n.to_string()).collect(),
            });
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
fn skip_pods_on_legacy_upgrades(steps: &[Step]) -> Vec<Note> {
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
        notes.push(Note::SkipPodsLegacy {
            pool: t.pool.clone(),
            hop: t.hop,
            hops: t.hops,
            to: t.to.to_string(),
            selector,
            machines: legacy,
            empty_dir_lost: !t.drain.delete_empty_dir_data,
            volume_wait_skipped: t.drain.volume_detach_timeout_secs.is_some(),
        });
    }
    notes
}

/// Machines whose first hop leaves their minor from an older patch than the catalog's newest
/// of that minor: the Talos docs recommend upgrading to the newest patch of the running minor
/// before the next minor (`/work/shared/reference/talos-today.md`, "Compatibility"; talos docs
/// "Upgrading Talos Linux"), medea goes to the next minor at once (Talos' own
/// `MinimumHostUpgradeVersion` allows it). One note per pool and running version, so the
/// operator can choose to plan the top-up first.
fn current_minor_not_topped_up(catalog: &Catalog, steps: &[Step]) -> Vec<Note> {
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
            notes.push(Note::NotToppedUp {
                pool: t.pool.clone(),
                machines,
                from: from.to_string(),
                newest: newest.to_string(),
                to: t.to.to_string(),
            });
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
