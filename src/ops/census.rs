//! Gathering a cluster's workload census (issue #36 item 4) for rehearsals: what
//! [`KubeApi::workloads`] reads, turned into an [`inventory::census::Census`], sorted and
//! bounded. The refresh ([`super::refresh`]) gathers it at most once per census interval and
//! stores it under [`census_key`](crate::inventory::census::census_key), beside the cluster
//! record and never in it.
//!
//! Gathering never fails: a source that cannot be read (403 without the RBAC of
//! design/k8s.md, 404, an apiserver that stops answering) is named in
//! [`Census::gather_errors`] with why, its field left empty, and the other sources are kept. A
//! rehearsal reads `gather_errors` to say its twin is partial.

use std::collections::BTreeMap;

use crate::inventory::census::{
    Census, CensusPdb, CensusPod, MAX_LABELS, MAX_PDB_PODS, MAX_PODS, Owner, VolumeKinds,
};
use crate::k8s::KubeApi;
use crate::k8s::census::{WorkloadLists, WorkloadPdb, WorkloadPod};

/// Objects asked for per list request (`limit`), as the preflight's metadata lists page.
pub const PAGE_SIZE: u32 = 500;

/// The bounds of a census and the page size of its lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Pods kept ([`MAX_PODS`]).
    pub max_pods: usize,
    /// Labels kept per pod ([`MAX_LABELS`]).
    pub max_labels: usize,
    /// Member pods kept per PodDisruptionBudget ([`MAX_PDB_PODS`]).
    pub max_pdb_pods: usize,
    /// Objects per list request ([`PAGE_SIZE`]).
    pub page_size: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_pods: MAX_PODS,
            max_labels: MAX_LABELS,
            max_pdb_pods: MAX_PDB_PODS,
            page_size: PAGE_SIZE,
        }
    }
}

/// The census of the cluster behind `kube`, gathered now (`now` is its `gatheredAt`), with the
/// default bounds.
pub async fn gather<K: KubeApi>(kube: &K, now: jiff::Timestamp) -> Census {
    gather_with(kube, now, &Limits::default()).await
}

/// [`gather`] with other bounds.
pub async fn gather_with<K: KubeApi>(kube: &K, now: jiff::Timestamp, limits: &Limits) -> Census {
    build(kube.workloads(limits.page_size).await, now, limits)
}

/// The census from what the sources returned: sorted, bounded, each failed source named.
fn build(lists: WorkloadLists, now: jiff::Timestamp, limits: &Limits) -> Census {
    let mut census = Census {
        gathered_at: now.to_string(),
        ..Census::default()
    };
    match lists.pods {
        Ok(pods) => {
            let mut over_labels = 0usize;
            let mut pods: Vec<CensusPod> = pods
                .into_iter()
                .map(|p| {
                    if p.labels.len() > limits.max_labels {
                        over_labels += 1;
                    }
                    census_pod(p, limits.max_labels)
                })
                .collect();
            pods.sort_by(|a, b| {
                (&a.node, &a.namespace, &a.name).cmp(&(&b.node, &b.namespace, &b.name))
            });
            if pods.len() > limits.max_pods {
                census.truncated.push(format!(
                    "pods: {} seen, {} kept",
                    pods.len(),
                    limits.max_pods
                ));
                pods.truncate(limits.max_pods);
            }
            if over_labels > 0 {
                census.truncated.push(format!(
                    "labels: {over_labels} pod(s) have more than {} labels; the first {} (in key order) kept",
                    limits.max_labels, limits.max_labels
                ));
            }
            census.pods = pods;
        }
        Err(err) => {
            census
                .gather_errors
                .insert("pods".into(), crate::error_chain(&err));
        }
    }
    match lists.pdbs {
        Ok(pdbs) => {
            let mut pdbs: Vec<CensusPdb> = pdbs
                .into_iter()
                .map(|p| census_pdb(p, limits.max_pdb_pods, &mut census.truncated))
                .collect();
            pdbs.sort();
            census.pdbs = pdbs;
        }
        Err(err) => {
            census
                .gather_errors
                .insert("podDisruptionBudgets".into(), crate::error_chain(&err));
        }
    }
    match lists.daemonsets {
        Ok(mut ds) => {
            ds.sort();
            ds.dedup();
            census.daemonsets = ds;
        }
        Err(err) => {
            census
                .gather_errors
                .insert("daemonSets".into(), crate::error_chain(&err));
        }
    }
    match lists.attachments {
        Ok(list) => {
            let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for a in list.into_iter().filter(|a| a.attached) {
                if let Some(pv) = a.persistent_volume {
                    by_node.entry(a.node).or_default().push(pv);
                }
            }
            for pvs in by_node.values_mut() {
                pvs.sort();
                pvs.dedup();
            }
            census.attachments = by_node;
        }
        Err(err) => {
            census
                .gather_errors
                .insert("volumeAttachments".into(), crate::error_chain(&err));
        }
    }
    census
}

fn census_pod(p: WorkloadPod, max_labels: usize) -> CensusPod {
    CensusPod {
        node: p.node,
        namespace: p.namespace,
        name: p.name,
        owner: p.owner.map(|(kind, name)| Owner { kind, name }),
        mirror: p.mirror,
        phase: p.phase,
        labels: p.labels.into_iter().take(max_labels).collect(),
        volumes: VolumeKinds {
            empty_dir: p.volumes.empty_dir,
            host_path: p.volumes.host_path,
            persistent_volume_claim: p.volumes.persistent_volume_claim,
            csi: p.volumes.csi,
        },
    }
}

fn census_pdb(p: WorkloadPdb, max_pods: usize, truncated: &mut Vec<String>) -> CensusPdb {
    let mut pods = p.pods;
    pods.sort();
    if pods.len() > max_pods {
        truncated.push(format!(
            "podDisruptionBudget {}/{}: {} pods selected, {} kept",
            p.namespace,
            p.name,
            pods.len(),
            max_pods
        ));
        pods.truncate(max_pods);
    }
    CensusPdb {
        namespace: p.namespace,
        name: p.name,
        min_available: p.min_available,
        max_unavailable: p.max_unavailable,
        disruptions_allowed: p.disruptions_allowed,
        expected_pods: p.expected_pods,
        pods,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::census::{Attachment, PodVolumeKinds};

    fn pod(node: &str, ns: &str, name: &str, labels: usize) -> WorkloadPod {
        WorkloadPod {
            namespace: ns.into(),
            name: name.into(),
            node: node.into(),
            owner: None,
            mirror: false,
            phase: "Running".into(),
            labels: (0..labels)
                .map(|i| (format!("k{i:02}"), i.to_string()))
                .collect(),
            volumes: PodVolumeKinds::default(),
        }
    }

    fn forbidden() -> crate::k8s::K8sError {
        crate::k8s::K8sError::ServerUrl {
            url: "refused".into(),
        }
    }

    #[test]
    fn bounds_cut_what_they_say_and_everything_is_sorted() {
        let lists = WorkloadLists {
            pods: Ok(vec![
                pod("w-2", "a", "p3", 1),
                pod("w-1", "b", "p1", 5),
                pod("w-1", "a", "p2", 0),
                pod("", "a", "pending", 0),
            ]),
            pdbs: Ok(vec![WorkloadPdb {
                namespace: "a".into(),
                name: "budget".into(),
                min_available: Some("50%".into()),
                max_unavailable: None,
                disruptions_allowed: 1,
                expected_pods: 3,
                pods: vec!["p3".into(), "p2".into(), "p1".into()],
            }]),
            daemonsets: Ok(vec!["kube-system/z".into(), "kube-system/a".into()]),
            attachments: Ok(vec![
                Attachment {
                    name: "csi-2".into(),
                    node: "w-1".into(),
                    persistent_volume: Some("pv-b".into()),
                    attached: true,
                },
                Attachment {
                    name: "csi-1".into(),
                    node: "w-1".into(),
                    persistent_volume: Some("pv-a".into()),
                    attached: true,
                },
                Attachment {
                    name: "csi-3".into(),
                    node: "w-2".into(),
                    persistent_volume: Some("pv-c".into()),
                    attached: false,
                },
            ]),
        };
        let limits = Limits {
            max_pods: 3,
            max_labels: 2,
            max_pdb_pods: 2,
            page_size: 1,
        };
        let c = build(lists, jiff::Timestamp::UNIX_EPOCH, &limits);
        let names: Vec<_> = c
            .pods
            .iter()
            .map(|p| format!("{}:{}/{}", p.node, p.namespace, p.name))
            .collect();
        assert_eq!(names, [":a/pending", "w-1:a/p2", "w-1:b/p1"]);
        assert_eq!(
            c.pods[2].labels.keys().collect::<Vec<_>>(),
            ["k00", "k01"],
            "the first labels in key order"
        );
        assert_eq!(c.pdbs[0].pods, ["p1", "p2"]);
        assert_eq!(c.daemonsets, ["kube-system/a", "kube-system/z"]);
        assert_eq!(
            c.attachments,
            BTreeMap::from([("w-1".to_string(), vec!["pv-a".into(), "pv-b".into()])]),
            "only attached volumes"
        );
        assert_eq!(
            c.truncated,
            [
                "pods: 4 seen, 3 kept",
                "labels: 1 pod(s) have more than 2 labels; the first 2 (in key order) kept",
                "podDisruptionBudget a/budget: 3 pods selected, 2 kept",
            ]
        );
        assert!(c.gather_errors.is_empty());
        assert_eq!(c.gathered_at, "1970-01-01T00:00:00Z");
    }

    #[test]
    fn a_failed_source_is_named_and_the_others_are_kept() {
        let lists = WorkloadLists {
            pods: Ok(vec![pod("w-1", "a", "p", 0)]),
            pdbs: Err(forbidden()),
            daemonsets: Ok(vec!["kube-system/kube-proxy".into()]),
            attachments: Err(forbidden()),
        };
        let c = build(lists, jiff::Timestamp::UNIX_EPOCH, &Limits::default());
        assert_eq!(
            c.gather_errors.keys().collect::<Vec<_>>(),
            ["podDisruptionBudgets", "volumeAttachments"]
        );
        assert!(c.gather_errors["podDisruptionBudgets"].contains("refused"));
        assert_eq!(c.pods.len(), 1);
        assert_eq!(c.daemonsets.len(), 1);
        assert!(c.truncated.is_empty());
    }
}
