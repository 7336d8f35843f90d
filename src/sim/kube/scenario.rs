//! Workload content for the simulated cluster, built from real k8s-openapi types: the
//! default scenario that `medea sim` / `medea demo` start with, and builders tests use for
//! their own content.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, Pod, PodSpec, PodTemplateSpec, Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

fn labels(app: &str) -> BTreeMap<String, String> {
    [("app".to_string(), app.to_string())].into()
}

fn meta(ns: &str, name: &str, labels: Option<BTreeMap<String, String>>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(ns.to_string()),
        labels,
        ..ObjectMeta::default()
    }
}

fn template(app: &str, image: &str, tolerations: Option<Vec<Toleration>>) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(app)),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: app.to_string(),
                image: Some(image.to_string()),
                ..Container::default()
            }],
            tolerations,
            ..PodSpec::default()
        }),
    }
}

#[allow(
    clippy::expect_used,
    reason = "k8s-openapi types have string keys and no non-finite floats: serializing them to a JSON value cannot fail"
)]
fn json<T: serde::Serialize>(t: &T) -> Value {
    serde_json::to_value(t).expect("k8s-openapi types serialize")
}

/// A Deployment `name` with `replicas` pods labelled `app=<name>`.
pub fn deployment(ns: &str, name: &str, replicas: i32, image: &str) -> Deployment {
    Deployment {
        metadata: meta(ns, name, Some(labels(name))),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(labels(name)),
                match_expressions: None,
            },
            template: template(name, image, None),
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// Toleration of every taint (what kube-proxy and CNI DaemonSets carry).
pub fn tolerate_everything() -> Vec<Toleration> {
    vec![Toleration {
        operator: Some("Exists".into()),
        ..Toleration::default()
    }]
}

/// A DaemonSet `name` with pods labelled `app=<name>`, on every node it tolerates.
pub fn daemonset(
    ns: &str,
    name: &str,
    image: &str,
    tolerations: Option<Vec<Toleration>>,
) -> DaemonSet {
    DaemonSet {
        metadata: meta(ns, name, Some(labels(name))),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels(name)),
                match_expressions: None,
            },
            template: template(name, image, tolerations),
            ..DaemonSetSpec::default()
        }),
        status: None,
    }
}

/// A PDB over `app=<app>` with `minAvailable`.
pub fn pdb_min_available(
    ns: &str,
    name: &str,
    app: &str,
    min_available: i32,
) -> PodDisruptionBudget {
    pdb(ns, name, app, Some(IntOrString::Int(min_available)), None)
}

/// A PDB over `app=<app>` with `maxUnavailable` (an integer or a percentage like `"25%"`).
pub fn pdb_max_unavailable(
    ns: &str,
    name: &str,
    app: &str,
    max_unavailable: IntOrString,
) -> PodDisruptionBudget {
    pdb(ns, name, app, None, Some(max_unavailable))
}

fn pdb(
    ns: &str,
    name: &str,
    app: &str,
    min_available: Option<IntOrString>,
    max_unavailable: Option<IntOrString>,
) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(ns, name, None),
        spec: Some(PodDisruptionBudgetSpec {
            min_available,
            max_unavailable,
            selector: Some(LabelSelector {
                match_labels: Some(labels(app)),
                match_expressions: None,
            }),
            unhealthy_pod_eviction_policy: None,
        }),
        status: None,
    }
}

/// A bare pod (no controller) on `node`; with `empty_dir` it also mounts an emptyDir volume.
pub fn bare_pod(ns: &str, name: &str, node: &str, empty_dir: bool) -> Pod {
    let (volumes, mounts) = if empty_dir {
        (
            Some(vec![Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            }]),
            Some(vec![VolumeMount {
                name: "scratch".into(),
                mount_path: "/scratch".into(),
                ..VolumeMount::default()
            }]),
        )
    } else {
        (None, None)
    };
    Pod {
        metadata: meta(ns, name, Some(labels(name))),
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            containers: vec![Container {
                name: name.to_string(),
                image: Some("registry.k8s.io/pause:3.10".into()),
                volume_mounts: mounts,
                ..Container::default()
            }],
            volumes,
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The objects every simulated cluster runs: DaemonSets on every node
/// (`kube-system/kube-proxy`, `kube-system/kube-flannel`, host network, tolerating everything),
/// CoreDNS (`kube-system/coredns`, 2 replicas, tolerating control-plane nodes) and a
/// [`metrics_server`] (emptyDir at `/tmp`, on a worker: a drain with kubectl's defaults refuses
/// its node, as in most real clusters).
pub fn platform() -> Vec<Value> {
    let mut coredns = deployment(
        "kube-system",
        "coredns",
        2,
        "registry.k8s.io/coredns/coredns:v1.12.3",
    );
    if let Some(spec) = coredns.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        spec.tolerations = Some(vec![Toleration {
            key: Some("node-role.kubernetes.io/control-plane".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        }]);
    }
    // kube-proxy and flannel run in the host network namespace.
    let host_network = |mut ds: DaemonSet| {
        if let Some(spec) = ds.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
            spec.host_network = Some(true);
        }
        ds
    };
    vec![
        json(&host_network(daemonset(
            "kube-system",
            "kube-proxy",
            "registry.k8s.io/kube-proxy:v1.34.1",
            Some(tolerate_everything()),
        ))),
        json(&host_network(daemonset(
            "kube-system",
            "kube-flannel",
            "ghcr.io/siderolabs/flannel:v0.27.4",
            Some(tolerate_everything()),
        ))),
        json(&coredns),
        json(&metrics_server()),
    ]
}

/// A replicated workload: Deployment `ns/name` (nginx, `replicas` pods labelled `app=<name>`)
/// and, with `pdb_min` (its `minAvailable`), the PodDisruptionBudget `ns/<name>-pdb` guarding it.
pub fn workload(ns: &str, name: &str, replicas: i32, pdb_min: Option<i32>) -> Vec<Value> {
    let mut out = vec![json(&deployment(
        ns,
        name,
        replicas,
        "docker.io/library/nginx:1.29",
    ))];
    if let Some(min) = pdb_min {
        out.push(json(&pdb_min_available(
            ns,
            &format!("{name}-pdb"),
            name,
            min,
        )));
    }
    out
}

/// A metrics-server-like Deployment (`kube-system/metrics-server`, 1 replica): like the
/// upstream manifest (kubernetes-sigs/metrics-server `manifests/base/deployment.yaml`) it mounts
/// an `emptyDir` at `/tmp`, so draining its node evicts emptyDir data. Found in most clusters.
pub fn metrics_server() -> Deployment {
    let mut d = deployment(
        "kube-system",
        "metrics-server",
        1,
        "registry.k8s.io/metrics-server/metrics-server:v0.8.0",
    );
    if let Some(spec) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        spec.volumes = Some(vec![Volume {
            name: "tmp-dir".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        }]);
        for c in &mut spec.containers {
            c.volume_mounts = Some(vec![VolumeMount {
                name: "tmp-dir".into(),
                mount_path: "/tmp".into(),
                ..VolumeMount::default()
            }]);
        }
    }
    d
}

/// The default scenario: the [`platform`] plus a replicated workload guarded by a PDB
/// (`default/web`, 3 replicas, `web-pdb` minAvailable 2).
pub fn default_scenario() -> Vec<Value> {
    let mut objects = platform();
    objects.extend(workload("default", "web", 3, Some(2)));
    objects
}

/// A workload with a CSI volume (what a database on Ceph RBD looks like): a PersistentVolume
/// `pv-<name>` of `driver` with `handle` (`ReadWriteOnce`), a PersistentVolumeClaim `<name>`
/// bound to it, and a one-replica Deployment `<name>` pinned to `node`
/// (`kubernetes.io/hostname`) that mounts the claim. Once its pod is on `node`, the simulated
/// attach/detach controller keeps a VolumeAttachment
/// ([`super::volume_attachment_name`]`(handle, driver, node)`) there.
pub fn csi_workload(ns: &str, name: &str, node: &str, driver: &str, handle: &str) -> Vec<Value> {
    let pv = format!("pv-{name}");
    let mut d = deployment(ns, name, 1, "docker.io/library/postgres:17");
    if let Some(spec) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        spec.node_selector =
            Some([("kubernetes.io/hostname".to_string(), node.to_string())].into());
        spec.volumes = Some(vec![Volume {
            name: "data".into(),
            persistent_volume_claim: Some(
                k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
                    claim_name: name.to_string(),
                    read_only: None,
                },
            ),
            ..Volume::default()
        }]);
        for c in &mut spec.containers {
            c.volume_mounts = Some(vec![VolumeMount {
                name: "data".into(),
                mount_path: "/var/lib/postgresql/data".into(),
                ..VolumeMount::default()
            }]);
        }
    }
    vec![
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": "ceph-block",
                "csi": {"driver": driver, "volumeHandle": handle, "fsType": "ext4"},
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": ns, "name": name},
            },
            "status": {"phase": "Bound"},
        }),
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "10Gi"}},
                "storageClassName": "ceph-block",
                "volumeName": pv,
            },
            "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"}},
        }),
        json(&d),
    ]
}
