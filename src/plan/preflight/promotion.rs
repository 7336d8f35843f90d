//! Promotion between clusters (rollout sequencing): a Cluster with `spec.promotion: {after,
//! soak}` rolls a Talos or Kubernetes version only after the upstream cluster has run it, since
//! the end of a successful rollout job that brought it, for at least `soak`.
//!
//! The evidence is the upstream cluster's job history ([`PromotionEvidence`], built from the
//! store by `ops::replan`). Only the exact version counts: a newer patch on the upstream
//! cluster is a different build and proves nothing about this one.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};

use super::{Finding, Inputs, Severity, checks, dur};
use crate::desired::model::Promotion;
use crate::plan::model::{ClusterPlan, Step};
use crate::version::{KubeVersion, TalosVersion};

/// What one cluster's successful rollout jobs proved: each version they brought, and when the
/// first such job ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromotionEvidence {
    /// The cluster's name.
    pub cluster: String,
    /// Each Talos version a successful job brought, and when the first such job ended.
    pub talos: BTreeMap<TalosVersion, Timestamp>,
    /// Each Kubernetes version a successful job brought, and when the first such job ended.
    pub kubernetes: BTreeMap<KubeVersion, Timestamp>,
}

impl PromotionEvidence {
    /// Evidence of `cluster`, empty.
    pub fn new(cluster: impl Into<String>) -> PromotionEvidence {
        PromotionEvidence {
            cluster: cluster.into(),
            ..Default::default()
        }
    }

    /// Record a successful job that ended at `at` and brought these versions (keeps the
    /// earliest end per version).
    pub fn record(&mut self, at: Timestamp, talos: &[TalosVersion], kubernetes: &[KubeVersion]) {
        for v in talos {
            let e = self.talos.entry(v.clone()).or_insert(at);
            *e = (*e).min(at);
        }
        for v in kubernetes {
            let e = self.kubernetes.entry(v.clone()).or_insert(at);
            *e = (*e).min(at);
        }
    }
}

/// When a version first proven at `proven` may be rolled downstream: `proven + soak`.
pub fn earliest_proceed(proven: Timestamp, soak: std::time::Duration) -> Option<Timestamp> {
    let soak = SignedDuration::try_from(soak).ok()?;
    proven.checked_add(soak).ok()
}

fn one(
    promo: &Promotion,
    what: &str,
    version: String,
    proven: Option<Timestamp>,
    now: Option<Timestamp>,
) -> Option<Finding> {
    let up = &promo.after.value;
    let soak = dur(promo.soak);
    let id = format!("promotion/{}/{version}", what.to_ascii_lowercase());
    let help = format!(
        "roll {what} {version} on cluster `{up}` first and let it soak {soak}; or acknowledge `{id}` under spec.preflight.acknowledge to skip the wait"
    );
    match proven {
        None => Some(Finding::new(
            id.clone(),
            checks::PROMOTION,
            Severity::Blocking,
            format!(
                "{what} {version} has not run on upstream cluster `{up}` after a successful rollout job (promotion soak {soak})"
            ),
            vec![format!(
                "no successful rollout job of cluster `{up}` brought {what} {version}"
            )],
            help,
        )),
        Some(proven) => {
            let Some(ready) = earliest_proceed(proven, promo.soak) else {
                return Some(Finding::new(
                    id,
                    checks::PROMOTION,
                    Severity::Blocking,
                    format!("the promotion soak {soak} of {what} {version} cannot be computed"),
                    vec![format!("cluster `{up}` proved it at {proven}")],
                    help,
                ));
            };
            let waiting = now.is_none_or(|n| n < ready);
            waiting.then(|| {
                Finding::new(
                    id.clone(),
                    checks::PROMOTION,
                    Severity::Blocking,
                    format!("{what} {version} is still soaking on upstream cluster `{up}`: it may proceed from {ready}"),
                    vec![format!(
                        "a successful rollout job of cluster `{up}` brought {what} {version}, ending {proven}; soak {soak}"
                    )],
                    help,
                )
                .until(ready)
            })
        }
    }
}

pub(super) fn check(promo: &Promotion, plan: &ClusterPlan, inputs: &Inputs) -> Vec<Finding> {
    let empty = PromotionEvidence::default();
    let ev = inputs.upstream.as_ref().unwrap_or(&empty);
    let mut talos = std::collections::BTreeSet::new();
    let mut kube = std::collections::BTreeSet::new();
    for s in &plan.steps {
        match s {
            Step::Talos(t) => {
                talos.insert(t.to.clone());
            }
            Step::Kubernetes(k) => {
                kube.insert(k.to.clone());
            }
        }
    }
    let mut out = Vec::new();
    for v in talos {
        out.extend(one(
            promo,
            "Talos",
            v.to_string(),
            ev.talos.get(&v).copied(),
            inputs.now,
        ));
    }
    for v in kube {
        out.extend(one(
            promo,
            "Kubernetes",
            v.to_string(),
            ev.kubernetes.get(&v).copied(),
            inputs.now,
        ));
    }
    out
}
