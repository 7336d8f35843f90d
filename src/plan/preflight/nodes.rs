//! Nodes of the plan that are NotReady, under pressure, or already cordoned.

use super::{Finding, Scope, Severity, checks};
use crate::inventory::ObservedCluster;

pub(super) fn check(obs: &ObservedCluster, scope: &Scope) -> Vec<Finding> {
    let mut out = Vec::new();
    for node in &scope.nodes {
        let Some(m) = obs.machines.get(node) else {
            continue;
        };
        if !m.ready {
            out.push(Finding::new(
                format!("node/not-ready/{node}"),
                checks::NODE,
                Severity::Warning,
                format!("node {node} is NotReady before the rollout"),
                vec![format!("node {node}: Ready condition is not True")],
                "find out why before rolling it (the rollout waits for it to come back Ready and halts after healthTimeout)",
            ));
        }
        if m.cordoned {
            out.push(Finding::new(
                format!("node/cordoned/{node}"),
                checks::NODE,
                Severity::Warning,
                format!("node {node} is already cordoned: cordoned by someone else; medea will leave it cordoned"),
                vec![format!("node {node}: spec.unschedulable = true")],
                "uncordon it yourself when it should take pods again (`kubectl uncordon`)",
            ));
        }
        for cond in obs.preflight.node_pressure.get(node).into_iter().flatten() {
            out.push(Finding::new(
                format!("node/pressure/{node}/{cond}"),
                checks::NODE,
                Severity::Warning,
                format!("node {node} reports {cond}"),
                vec![format!("node {node}: condition {cond} = True")],
                "relieve the pressure first: pods drained elsewhere add to the other nodes' load",
            ));
        }
    }
    out
}
