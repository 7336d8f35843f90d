//! How far a job is, counted one way wherever it is shown (issue #52 item 2): in node upgrades,
//! one per node per step, the rows of `medea rollout status`. A node that a two-hop job moves
//! twice counts twice, so a resumed two-hop job reads `4/5 node upgrades` and never mixes
//! distinct nodes with node-steps. The journal's lines, `rollout list`, the API's
//! `nodesDone`/`nodesTotal` and the dashboard read [`Job::node_upgrades`] and [`NODE_UPGRADES`].

use std::collections::BTreeMap;

use super::model::{Job, StepKind, TaskState};

/// What the count is called wherever it is shown (`3/5 node upgrades`).
pub const NODE_UPGRADES: &str = "node upgrades";

/// A job's node upgrades done and in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeUpgrades {
    /// Done (on the target, or skipped because it already was).
    pub done: usize,
    /// In all.
    pub total: usize,
}

impl std::fmt::Display for NodeUpgrades {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} {NODE_UPGRADES}", self.done, self.total)
    }
}

impl Job {
    /// The job's node upgrades: every node of every Talos step (done when finished and not
    /// rolled back), and every node a Kubernetes step's planned tasks act on (done when all of
    /// its tasks are; a step not planned yet has no rows).
    pub fn node_upgrades(&self) -> NodeUpgrades {
        let mut n = NodeUpgrades::default();
        for step in &self.steps {
            match &step.kind {
                StepKind::Talos(t) => {
                    n.total += t.nodes.len();
                    n.done += t
                        .nodes
                        .iter()
                        .filter(|x| x.rollback.is_none() && x.phase.finished())
                        .count();
                }
                StepKind::Kubernetes(k) => {
                    let mut per_node: BTreeMap<&str, bool> = BTreeMap::new();
                    for t in k.tasks.list() {
                        let done = per_node.entry(t.node.node.as_str()).or_insert(true);
                        *done &= t.state == TaskState::Done;
                    }
                    n.total += per_node.len();
                    n.done += per_node.values().filter(|d| **d).count();
                }
            }
        }
        n
    }
}
