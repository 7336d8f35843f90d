//! Workloads gates: every Deployment, StatefulSet and DaemonSet of the selected kinds in the
//! selected namespaces is rolled out (`k8s::workloads::WorkloadState::is_rolled_out`: the
//! controller saw the latest spec, desired replicas updated and available, no old replica
//! left). A namespace without workloads passes (nothing there is unavailable).

use super::{MAX_SAMPLES, ProbeError};
use crate::k8s::KubeClient;
use crate::k8s::workloads::WorkloadState;
use crate::plan::health::WorkloadKind;
use crate::rollout::ports::{GateSample, GateVerdict};

/// List the workloads (namespaces × kinds, in that order).
pub async fn list(
    kube: &KubeClient,
    namespaces: &[String],
    kinds: &[WorkloadKind],
) -> Result<Vec<WorkloadState>, ProbeError> {
    let mut out = Vec::new();
    for ns in namespaces {
        for kind in kinds {
            let ws = kube
                .workloads(ns, *kind)
                .await
                .map_err(|err| ProbeError::Kube { err: Box::new(err) })?;
            out.extend(ws);
        }
    }
    Ok(out)
}

fn state_text(w: &WorkloadState) -> String {
    let mut s = format!(
        "{}/{} updated, {}/{} available",
        w.updated, w.desired, w.available, w.desired
    );
    if let Some(t) = w.total
        && t > w.updated
    {
        s.push_str(&format!(", {} old", t - w.updated));
    }
    if !w.observed {
        s.push_str(", spec not yet observed");
    }
    s
}

/// Judge the listed workloads. Pure.
pub fn judge(workloads: &[WorkloadState]) -> (GateVerdict, Vec<GateSample>, String) {
    let bad: Vec<&WorkloadState> = workloads.iter().filter(|w| !w.is_rolled_out()).collect();
    let samples = bad
        .iter()
        .take(MAX_SAMPLES)
        .map(|w| GateSample {
            labels: [
                ("kind".to_string(), format!("{:?}", w.kind)),
                ("namespace".to_string(), w.namespace.clone()),
                ("name".to_string(), w.name.clone()),
            ]
            .into_iter()
            .collect(),
            value: state_text(w),
        })
        .collect();
    match bad.first() {
        None => (
            GateVerdict::Pass,
            samples,
            format!(
                "{} rolled out",
                if workloads.len() == 1 {
                    "1 workload".to_string()
                } else {
                    format!("{} workloads", workloads.len())
                }
            ),
        ),
        Some(w) => (
            GateVerdict::Fail,
            samples,
            format!(
                "{} of {} workloads not rolled out: {:?} {}/{} has {}",
                bad.len(),
                workloads.len(),
                w.kind,
                w.namespace,
                w.name,
                state_text(w)
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(
        name: &str,
        desired: i64,
        updated: i64,
        available: i64,
        total: Option<i64>,
    ) -> WorkloadState {
        WorkloadState {
            kind: WorkloadKind::Deployment,
            namespace: "default".into(),
            name: name.into(),
            desired,
            updated,
            available,
            total,
            observed: true,
        }
    }

    #[test]
    fn every_workload_must_be_rolled_out() {
        let (v, s, d) = judge(&[w("a", 2, 2, 2, Some(2)), w("b", 3, 3, 3, Some(3))]);
        assert_eq!(v, GateVerdict::Pass, "{d}");
        assert!(s.is_empty());
        let (v, s, d) = judge(&[w("a", 2, 2, 2, Some(2)), w("b", 3, 3, 1, Some(3))]);
        assert_eq!(v, GateVerdict::Fail);
        assert_eq!(s[0].labels["name"], "b");
        assert_eq!(
            d,
            "1 of 2 workloads not rolled out: Deployment default/b has 3/3 updated, 1/3 available"
        );
        // old replicas left over
        let (v, _, d) = judge(&[w("c", 2, 2, 2, Some(3))]);
        assert_eq!(v, GateVerdict::Fail, "{d}");
        let mut stale = w("d", 1, 1, 1, Some(1));
        stale.observed = false;
        assert_eq!(judge(&[stale]).0, GateVerdict::Fail);
        assert_eq!(judge(&[]).0, GateVerdict::Pass);
    }
}
