//! Preflight findings (issue #22): what would break if the plan ran, computed from the
//! observations (`inventory::preflight`) and the plan's own steps. Pure: no I/O, no clock
//! (the time of the observation is an input).

use serde::{Deserialize, Serialize};

/// How much a finding weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The plan cannot be approved unless the Cluster acknowledges the finding's id.
    Blocking,
    /// Shown; the plan can be approved.
    Warning,
}

/// One preflight finding in a cluster's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// Stable across runs for the same fact (`removed-api/flowcontrol.apiserver.k8s.io/v1beta3/flowschemas`).
    pub id: String,
    /// Which check found it (`removed-api`, `pdb`, `etcd`, `node`, `credentials`, `promotion`,
    /// `exclusion`, `budget`, `observations`).
    pub check: String,
    /// Blocking or a warning.
    pub severity: Severity,
    /// What was found, for a person.
    pub message: String,
    /// What was seen, and where (one line each).
    pub evidence: Vec<String>,
    /// What to do about it.
    pub help: String,
    /// Listed in the Cluster's `spec.preflight.acknowledge`.
    pub acknowledged: bool,
    /// When the finding stops holding by itself, with no other change (a promotion soak's
    /// end): the daemon computes the plan again at that time (issue #36).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<jiff::Timestamp>,
}

/// The earliest time a finding of `plan` ends by itself ([`Finding::until`]): when the plan
/// must be computed again though nothing else changed.
pub fn next_expiry(plan: &super::Plan) -> Option<jiff::Timestamp> {
    plan.clusters
        .iter()
        .flat_map(|c| c.preflight.iter())
        .filter_map(|f| f.until)
        .min()
}

impl Finding {
    /// This finding ends by itself at `t`.
    fn until(mut self, t: jiff::Timestamp) -> Finding {
        self.until = Some(t);
        self
    }

    /// Blocking and not acknowledged: the plan cannot be approved.
    pub fn blocks(&self) -> bool {
        self.severity == Severity::Blocking && !self.acknowledged
    }
}

mod budget;
mod credentials;
mod etcd;
pub mod exclusion;
mod nodes;
mod pdb;
mod promotion;
mod removed_api;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;

use jiff::Timestamp;

pub use promotion::{PromotionEvidence, earliest_proceed};

use crate::desired::model::Cluster;
use crate::inventory::ObservedCluster;
use crate::plan::model::{ClusterPlan, Step};

/// The check names, as `Finding::check` carries them.
pub mod checks {
    /// An API the target Kubernetes removes is still used.
    pub const REMOVED_API: &str = "removed-api";
    /// A PodDisruptionBudget that would block a drain.
    pub const PDB: &str = "pdb";
    /// etcd's health (alarms, members).
    pub const ETCD: &str = "etcd";
    /// A node under pressure or not ready.
    pub const NODE: &str = "node";
    /// Credentials that expire soon.
    pub const CREDENTIALS: &str = "credentials";
    /// A version the upstream cluster has not run long enough.
    pub const PROMOTION: &str = "promotion";
    /// Observations that were not gathered.
    pub const OBSERVATIONS: &str = "observations";
    /// A maintenance exclusion holds changes of the plan.
    pub const EXCLUSION: &str = "exclusion";
    /// A pool's wave would find every slot (`maxUnavailable`) taken (issue #51).
    pub const BUDGET: &str = "budget";
}

/// The inputs of one cluster's preflight checks beyond its desired state, its observation and
/// its plan: explicit, so a memo of the cluster's plan section can key on them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inputs {
    /// The time the plan is computed at (credential expiry, promotion soak). `None` when the
    /// caller has no clock (offline computations in tests and benches): the time-dependent
    /// checks then say they were not evaluated.
    pub now: Option<Timestamp>,
    /// The upstream cluster's job history when the Cluster has `spec.promotion`.
    pub upstream: Option<PromotionEvidence>,
}

impl Finding {
    fn new(
        id: impl Into<String>,
        check: &str,
        severity: Severity,
        message: impl Into<String>,
        evidence: Vec<String>,
        help: impl Into<String>,
    ) -> Finding {
        Finding {
            id: id.into(),
            check: check.to_string(),
            severity,
            message: message.into(),
            evidence,
            help: help.into(),
            acknowledged: false,
            until: None,
        }
    }
}

/// What the plan does that the checks weigh: the nodes it drains, every node it touches,
/// whether it touches the control plane or Kubernetes, and its longest possible run.
#[derive(Debug, Default)]
pub(crate) struct Scope {
    /// Nodes a Talos step drains, with that step's drain timeout.
    pub drained: std::collections::BTreeMap<String, std::time::Duration>,
    /// Every node any step touches.
    pub nodes: BTreeSet<String>,
    pub control_plane_or_kubernetes: bool,
    /// Upper bound of the rollout's length: each Talos wave and each Kubernetes node, times its
    /// health timeout.
    pub run: std::time::Duration,
    /// The Kubernetes minor upgrade `(from, to)`, if the plan has one.
    pub kube_minor: Option<((u64, u64), (u64, u64))>,
}

impl Scope {
    pub(crate) fn of(plan: &ClusterPlan) -> Scope {
        let mut s = Scope::default();
        for step in &plan.steps {
            s.control_plane_or_kubernetes |= step.touches_control_plane();
            match step {
                Step::Talos(t) => {
                    for wave in &t.waves {
                        for m in wave {
                            s.drained.insert(m.node.clone(), t.drain_timeout);
                            s.nodes.insert(m.node.clone());
                        }
                        s.run += t.health_timeout + t.drain_timeout;
                    }
                }
                Step::Kubernetes(k) => {
                    for n in k.control_plane.iter().chain(&k.workers) {
                        s.nodes.insert(n.clone());
                        s.run += k.health_timeout;
                    }
                    if k.to.minor_line() > k.from.minor_line() {
                        s.kube_minor = Some((k.from.minor_line(), k.to.minor_line()));
                    }
                }
            }
        }
        s
    }
}

/// The preflight findings of one cluster's plan, acknowledgements applied, sorted (blocking
/// first, then by id); and the notes about acknowledgements that match no finding. A plan
/// without steps has no findings: nothing would run.
pub fn check(
    cluster: &Cluster,
    obs: &ObservedCluster,
    plan: &ClusterPlan,
    inputs: &Inputs,
) -> (Vec<Finding>, Vec<crate::plan::note::Note>) {
    let mut found = Vec::new();
    let mut notes = Vec::new();
    if !plan.steps.is_empty() {
        let scope = Scope::of(plan);
        let p = &obs.preflight;
        if !p.gathered {
            found.push(Finding::new(
                "observations/not-gathered",
                checks::OBSERVATIONS,
                Severity::Warning,
                "no preflight observations were gathered for this cluster: deprecated-API usage, PodDisruptionBudgets, etcd, node pressure and credential lifetimes were not checked",
                vec!["the cluster's observation has no preflight block (observed by a medea before preflight checks, or an inventory file without `preflight:`)".into()],
                "let the daemon refresh the cluster, or seed it again (medea seed … --force); in an inventory file, add a `preflight:` block",
            ));
        } else {
            // What the refresh could not read leaves the checks that need it blind: say so.
            for (what, err) in &p.gather_errors {
                found.push(Finding::new(
                    format!("observations/{what}"),
                    checks::OBSERVATIONS,
                    Severity::Warning,
                    format!("medea could not read {what} of this cluster: the preflight checks that need it saw nothing"),
                    vec![err.clone()],
                    "check the credentials and RBAC medea uses for this cluster (README: \"What each observation reads\"), then let the daemon refresh it",
                ));
            }
            let table = cluster.upgrade_policy.api_table();
            found.extend(removed_api::check(&table, p, &scope, inputs.now));
            found.extend(pdb::check(p, &scope));
            found.extend(etcd::check(p, &scope));
        }
        found.extend(nodes::check(obs, &scope));
        let (b, budget_notes) = budget::check(obs, plan);
        found.extend(b);
        notes.extend(budget_notes);
        if p.gathered {
            found.extend(credentials::check(p, &scope, inputs.now));
        }
        if let Some(promo) = &cluster.promotion {
            found.extend(promotion::check(promo, plan, inputs));
        }
        found.extend(exclusion::check(
            &cluster.exclusions,
            plan,
            &scope,
            inputs.now,
        ));
    }
    for f in &mut found {
        f.acknowledged = cluster.preflight.acknowledges(&f.id);
    }
    for a in &cluster.preflight.acknowledge {
        if !found.iter().any(|f| f.id == a.value) {
            notes.push(crate::plan::note::Note::StaleAcknowledgement {
                id: a.value.clone(),
                file: a.origin.file.to_string(),
                line: a.origin.line,
            });
        }
    }
    found.sort_by(|a, b| a.severity.cmp(&b.severity).then_with(|| a.id.cmp(&b.id)));
    found.dedup_by(|a, b| a.id == b.id);
    (found, notes)
}

/// The findings of a plan that keep it from being approved or started (blocking and not
/// acknowledged), as `(cluster, finding)`.
pub fn blocking(plan: &crate::plan::Plan) -> Vec<(&str, &Finding)> {
    plan.clusters
        .iter()
        .flat_map(|c| {
            c.preflight
                .iter()
                .filter(|f| f.blocks())
                .map(move |f| (c.cluster.as_str(), f))
        })
        .collect()
}

/// Why a plan cannot be approved or started, one line per blocking finding, naming its id and
/// how to acknowledge it; `None` when nothing blocks.
pub fn refusal(plan: &crate::plan::Plan) -> Option<String> {
    let b = blocking(plan);
    if b.is_empty() {
        return None;
    }
    let mut msg = format!(
        "plan {} has {} blocking preflight finding{} and cannot be approved or started:",
        plan.id.short(),
        b.len(),
        if b.len() == 1 { "" } else { "s" }
    );
    for (cluster, f) in &b {
        msg.push_str(&format!("\n  cluster {cluster}: [{}] {}", f.id, f.message));
    }
    msg.push_str("\nfix the cause and replan, or accept a finding by listing its id under `spec.preflight.acknowledge` of the Cluster (a new desired revision, so a new plan to approve)");
    Some(msg)
}

/// `std::time::Duration` in medea's duration grammar (`168h`, `10m`).
pub(crate) fn dur(d: std::time::Duration) -> String {
    crate::duration::Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .to_string()
}

/// The preflight inputs of a whole planning call: the time, and the job history of every
/// cluster some Cluster is promoted after.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// The time findings are judged at (credential lifetimes, promotion soak); `None`: unknown.
    pub now: Option<Timestamp>,
    /// Upstream cluster name → what its successful jobs proved.
    pub promotion: std::collections::BTreeMap<String, PromotionEvidence>,
}

impl Context {
    /// The explicit inputs of `cluster`'s checks.
    pub fn for_cluster(&self, cluster: &Cluster) -> Inputs {
        Inputs {
            now: self.now,
            upstream: cluster.promotion.as_ref().map(|p| {
                self.promotion
                    .get(&p.after.value)
                    .cloned()
                    .unwrap_or_else(|| PromotionEvidence::new(p.after.value.clone()))
            }),
        }
    }
}
