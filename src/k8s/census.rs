//! What the workload census reads (issue #36 item 4): every pod, PodDisruptionBudget,
//! DaemonSet and VolumeAttachment of a cluster, each list paged (`limit` + `continue`) and
//! converted at this edge into the small types below. Each source is read on its own, so a
//! source the credentials may not list (403) or the apiserver does not serve (404) costs only
//! itself: the others are still returned. What is kept of a pod is its identity, node, owner,
//! phase, labels and the *kinds* of its volumes, never its spec (images, env, a volume's
//! source such as a Secret's name).

use std::collections::BTreeMap;
use std::fmt::Debug;

use ::kube::api::{Api, ListParams};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;

use super::client::KubeClient;
use super::{K8sError, selector};

const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// One pod as the census keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadPod {
    pub namespace: String,
    pub name: String,
    /// `spec.nodeName`; empty when unscheduled.
    pub node: String,
    /// The owner reference with `controller: true`: (kind, name).
    pub owner: Option<(String, String)>,
    /// Carries the `kubernetes.io/config.mirror` annotation (a static pod's mirror).
    pub mirror: bool,
    /// `status.phase` (empty when the status has none yet).
    pub phase: String,
    /// Every label (the census caps them; PDB membership is computed here on all of them).
    pub labels: BTreeMap<String, String>,
    pub volumes: PodVolumeKinds,
}

/// How many volumes of each kind a pod declares (`spec.volumes`). Other kinds (Secret,
/// ConfigMap, projected, downwardAPI …) are not counted and nothing of their source is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodVolumeKinds {
    pub empty_dir: u32,
    pub host_path: u32,
    pub persistent_volume_claim: u32,
    pub csi: u32,
}

/// A PodDisruptionBudget, its spec as written, its status and its member pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadPdb {
    pub namespace: String,
    pub name: String,
    /// `spec.minAvailable` as written (`2`, `50%`).
    pub min_available: Option<String>,
    /// `spec.maxUnavailable` as written.
    pub max_unavailable: Option<String>,
    /// `status.disruptionsAllowed` (0 without a status).
    pub disruptions_allowed: i64,
    /// `status.expectedPods` (0 without a status).
    pub expected_pods: i64,
    /// The pods of its namespace its selector selects (names, sorted); empty when the pods
    /// could not be listed ([`WorkloadLists::pods`] is then an error).
    pub pods: Vec<String>,
}

/// A `storage.k8s.io/v1` VolumeAttachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub name: String,
    /// `spec.nodeName`.
    pub node: String,
    /// `spec.source.persistentVolumeName` (absent for an inline volume).
    pub persistent_volume: Option<String>,
    /// `status.attached`.
    pub attached: bool,
}

/// The four census sources, each read on its own.
#[derive(Debug)]
pub struct WorkloadLists {
    /// Every pod, in the order the apiserver listed them.
    pub pods: Result<Vec<WorkloadPod>, K8sError>,
    pub pdbs: Result<Vec<WorkloadPdb>, K8sError>,
    /// Every DaemonSet, `namespace/name`.
    pub daemonsets: Result<Vec<String>, K8sError>,
    pub attachments: Result<Vec<Attachment>, K8sError>,
}

impl KubeClient {
    /// Every object of `api`, `page` at a time (`limit` + `continue`, as `object_writers`
    /// pages), each converted by `each` as its page arrives so no page's wire objects outlive
    /// it.
    async fn list_paged<T, O>(
        &self,
        api: &Api<T>,
        op: &'static str,
        page: u32,
        mut each: impl FnMut(T) -> O,
    ) -> Result<Vec<O>, K8sError>
    where
        T: Clone + DeserializeOwned + Debug,
    {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut params = ListParams::default().limit(page.max(1));
            if let Some(t) = &token {
                params = params.continue_token(t);
            }
            let list = self
                .call(op, self.cluster_url(), || api.list(&params))
                .await?;
            out.extend(list.items.into_iter().map(&mut each));
            token = list.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    /// Read the census sources, `page` objects per request; see [`WorkloadLists`].
    pub(super) async fn census_lists(&self, page: u32) -> WorkloadLists {
        let pod_api: Api<Pod> = Api::all(self.client.clone());
        let pdb_api: Api<PodDisruptionBudget> = Api::all(self.client.clone());
        let ds_api: Api<DaemonSet> = Api::all(self.client.clone());
        let va_api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let (pods, pdbs, daemonsets, attachments) = futures::join!(
            self.list_paged(&pod_api, "list pods", page, workload_pod),
            self.list_paged(&pdb_api, "list PodDisruptionBudgets", page, |p| p),
            self.list_paged(&ds_api, "list DaemonSets", page, |d| {
                let m = d.metadata;
                format!(
                    "{}/{}",
                    m.namespace.unwrap_or_default(),
                    m.name.unwrap_or_default()
                )
            }),
            self.list_paged(&va_api, "list VolumeAttachments", page, attachment),
        );
        let no_pods = Vec::new();
        let members = pods.as_ref().unwrap_or(&no_pods);
        let pdbs = pdbs.map(|list| list.iter().map(|p| workload_pdb(p, members)).collect());
        WorkloadLists {
            pods,
            pdbs,
            daemonsets,
            attachments,
        }
    }
}

fn workload_pod(pod: Pod) -> WorkloadPod {
    let m = pod.metadata;
    let owner = m
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .find(|r| r.controller == Some(true))
        .map(|r| (r.kind, r.name));
    let mut volumes = PodVolumeKinds::default();
    let spec = pod.spec.unwrap_or_default();
    for v in spec.volumes.iter().flatten() {
        let slot = if v.empty_dir.is_some() {
            &mut volumes.empty_dir
        } else if v.host_path.is_some() {
            &mut volumes.host_path
        } else if v.persistent_volume_claim.is_some() {
            &mut volumes.persistent_volume_claim
        } else if v.csi.is_some() {
            &mut volumes.csi
        } else {
            continue;
        };
        *slot = slot.saturating_add(1);
    }
    WorkloadPod {
        namespace: m.namespace.unwrap_or_default(),
        name: m.name.unwrap_or_default(),
        node: spec.node_name.unwrap_or_default(),
        owner,
        mirror: m
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)),
        phase: pod.status.and_then(|s| s.phase).unwrap_or_default(),
        labels: m.labels.unwrap_or_default(),
        volumes,
    }
}

fn as_written(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// The budget and its members: the pods of its namespace its selector selects, by the rule
/// the PDB coverage of preflight uses ([`selector::selects`]).
fn workload_pdb(pdb: &PodDisruptionBudget, pods: &[WorkloadPod]) -> WorkloadPdb {
    let ns = pdb.metadata.namespace.clone().unwrap_or_default();
    let spec = pdb.spec.as_ref();
    let sel = spec.and_then(|s| s.selector.as_ref());
    let mut members: Vec<String> = pods
        .iter()
        .filter(|p| p.namespace == ns && selector::selects(sel, &p.labels))
        .map(|p| p.name.clone())
        .collect();
    members.sort();
    let status = pdb.status.as_ref();
    WorkloadPdb {
        name: pdb.metadata.name.clone().unwrap_or_default(),
        namespace: ns,
        min_available: spec.and_then(|s| s.min_available.as_ref()).map(as_written),
        max_unavailable: spec
            .and_then(|s| s.max_unavailable.as_ref())
            .map(as_written),
        disruptions_allowed: status.map_or(0, |s| i64::from(s.disruptions_allowed)),
        expected_pods: status.map_or(0, |s| i64::from(s.expected_pods)),
        pods: members,
    }
}

fn attachment(va: VolumeAttachment) -> Attachment {
    Attachment {
        name: va.metadata.name.unwrap_or_default(),
        node: va.spec.node_name,
        persistent_volume: va.spec.source.persistent_volume_name,
        attached: va.status.is_some_and(|s| s.attached),
    }
}
