//! PodDisruptionBudgets that allow no disruption now and cover pods on nodes the plan drains:
//! the drain waits for them up to the pool's drain timeout, then the job halts.

use std::collections::BTreeSet;

use super::{Finding, Scope, Severity, checks, dur};
use crate::inventory::preflight::PreflightObservations;

pub(super) fn check(p: &PreflightObservations, scope: &Scope) -> Vec<Finding> {
    let mut out = Vec::new();
    for pdb in &p.pod_disruption_budgets {
        if pdb.disruptions_allowed > 0 {
            continue;
        }
        let hit: Vec<_> = pdb
            .pods
            .iter()
            .filter(|pod| scope.drained.contains_key(&pod.node))
            .collect();
        if hit.is_empty() {
            continue;
        }
        let nodes: BTreeSet<&str> = hit.iter().map(|p| p.node.as_str()).collect();
        let timeout = nodes
            .iter()
            .filter_map(|n| scope.drained.get(*n))
            .max()
            .copied()
            .unwrap_or_default();
        let evidence = hit
            .iter()
            .map(|pod| format!("pod {}/{} on node {}", pdb.namespace, pod.name, pod.node))
            .chain(std::iter::once(format!(
                "status.disruptionsAllowed = {}",
                pdb.disruptions_allowed
            )))
            .collect();
        out.push(Finding::new(
            format!("pdb/{}/{}", pdb.namespace, pdb.name),
            checks::PDB,
            Severity::Warning,
            format!(
                "PodDisruptionBudget {}/{} allows 0 disruptions and covers pods on nodes this plan drains ({}): drain will wait up to drainTimeout ({}), then halt",
                pdb.namespace,
                pdb.name,
                nodes.into_iter().collect::<Vec<_>>().join(", "),
                dur(timeout)
            ),
            evidence,
            "scale the workload up or relax the budget (minAvailable/maxUnavailable) so one pod may go, then refresh",
        ));
    }
    out
}
