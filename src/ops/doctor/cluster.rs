//! The checks against a running cluster: the kube-apiserver (reachable, RBAC by
//! `SelfSubjectAccessReview`, Nodes), the Talos API of every node, etcd health and membership,
//! and the flags the next Kubernetes minor removes.

use std::path::Path;

use futures::StreamExt as _;

use super::checks::{clock_check, kube_cert_check, mode_check, talos_cert_check};
use super::{Check, ClusterReport, required_permissions};
use crate::k8s::{ClusterNode, KubeApi as _, KubeClient};
use crate::ops::refresh::{ClusterCreds, RefreshSettings};
use crate::talos::{NodeTarget, TalosApi as _, TalosClient, TalosContext, TalosError};

/// Check one cluster. Never fails: every problem is a [`Check`].
pub async fn diagnose_cluster(
    creds_dir: &Path,
    cluster: &str,
    settings: &RefreshSettings,
) -> ClusterReport {
    let creds = ClusterCreds::new(creds_dir, cluster);
    let mut checks = vec![
        mode_check(creds_dir, true),
        mode_check(&creds.dir, true),
        mode_check(&creds.talosconfig, false),
        mode_check(&creds.kubeconfig, false),
    ];

    // Talos client and certificate.
    let talos: Option<(TalosClient, TalosContext)> =
        match TalosClient::from_talosconfig(&creds.talosconfig, None, settings.talos) {
            Ok((client, ctx)) => {
                checks.push(talos_cert_check(
                    &creds.talosconfig.display().to_string(),
                    &ctx.crt_pem,
                    jiff::Timestamp::now(),
                ));
                Some((client, ctx))
            }
            Err(e) => {
                checks.push(Check::fail(
                    "talos-cert",
                    creds.talosconfig.display().to_string(),
                    crate::error_chain(&e),
                    "fix or replace the talosconfig (`medea seed --force` copies a new one)",
                ));
                None
            }
        };
    if let Some(c) = kube_cert_check(&creds.kubeconfig, jiff::Timestamp::now()) {
        checks.push(c);
    }

    // The kube-apiserver: reachable, RBAC, clock, nodes.
    let kube = match KubeClient::from_kubeconfig(&creds.kubeconfig, settings.kube.clone()).await {
        Ok(k) => Some(k),
        Err(e) => {
            checks.push(Check::fail(
                "kube-apiserver",
                creds.kubeconfig.display().to_string(),
                crate::error_chain(&e),
                "fix or replace the kubeconfig (`medea seed --force` copies a new one)",
            ));
            None
        }
    };
    let mut nodes: Option<Vec<ClusterNode>> = None;
    if let Some(kube) = &kube {
        let url = kube.cluster_url().to_string();
        match kube.server_info().await {
            Ok(info) => {
                checks.push(Check::pass(
                    "kube-apiserver",
                    &url,
                    format!("reachable, Kubernetes {}", info.git_version),
                ));
                checks.push(clock_check(&url, info.date, info.received));
                checks.push(rbac_check(kube, &url).await);
                match kube.nodes().await {
                    Ok(n) => {
                        checks.push(Check::pass(
                            "kube-nodes",
                            &url,
                            format!(
                                "{} nodes, {} Ready",
                                n.len(),
                                n.iter().filter(|n| n.ready).count()
                            ),
                        ));
                        nodes = Some(n);
                    }
                    Err(e) => checks.push(Check::fail(
                        "kube-nodes",
                        &url,
                        crate::error_chain(&e),
                        "grant the kubeconfig's user `list nodes`",
                    )),
                }
            }
            Err(e) => {
                checks.push(Check::fail(
                    "kube-apiserver",
                    &url,
                    crate::error_chain(&e),
                    format!(
                        "check that the kube-apiserver at {url} is up and reachable from this host (`kubectl --kubeconfig {} get --raw /version`)",
                        creds.kubeconfig.display()
                    ),
                ));
                let why = "not checked: the kube-apiserver did not answer";
                checks.push(Check::skip("clock", &url, why));
                checks.push(Check::skip("rbac", &url, why));
            }
        }
    }

    // Talos, per node; etcd on control planes.
    if let Some((talos, ctx)) = &talos {
        checks.extend(talos_checks(talos, ctx, nodes.as_deref()).await);
    } else {
        checks.push(Check::skip(
            "talos-api",
            cluster,
            "not checked: the talosconfig cannot be used",
        ));
    }
    ClusterReport {
        cluster: cluster.to_string(),
        creds_dir: creds.dir.display().to_string(),
        checks,
    }
}

async fn rbac_check(kube: &KubeClient, url: &str) -> Check {
    const CHECK: &str = "rbac";
    let mut denied = Vec::new();
    let mut errors = Vec::new();
    let wanted = required_permissions();
    for p in &wanted {
        match kube.can_i(p).await {
            Ok((true, _)) => {}
            Ok((false, _)) => denied.push(p.to_string()),
            Err(e) => errors.push(format!("{p}: {}", crate::error_chain(&e))),
        }
    }
    if !errors.is_empty() {
        return Check::fail(
            CHECK,
            url,
            format!("access reviews failed: {}", errors.join("; ")),
            "allow the kubeconfig's user to create selfsubjectaccessreviews.authorization.k8s.io (every user may by default)",
        );
    }
    if denied.is_empty() {
        Check::pass(
            CHECK,
            url,
            format!(
                "allowed: {}",
                wanted
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    } else {
        Check::fail(
            CHECK,
            url,
            format!(
                "denied: {} (medea cordons with `patch nodes` and drains with `create pods/eviction`)",
                denied.join(", ")
            ),
            format!(
                "bind the kubeconfig's user to a ClusterRole that allows {}",
                denied.join(", ")
            ),
        )
    }
}

/// One Talos target: a Kubernetes node, or (when the Node list is unavailable) a talosconfig
/// `nodes` entry.
struct Target {
    label: String,
    address: String,
    /// `None` when unknown (talosconfig fallback).
    control_plane: Option<bool>,
}

async fn talos_checks(
    talos: &TalosClient,
    ctx: &TalosContext,
    nodes: Option<&[ClusterNode]>,
) -> Vec<Check> {
    let targets: Vec<Target> = match nodes {
        Some(nodes) => nodes
            .iter()
            .map(|n| Target {
                label: n.name.clone(),
                address: n.internal_ip().unwrap_or(&n.name).to_string(),
                control_plane: Some(n.control_plane),
            })
            .collect(),
        None => ctx
            .nodes
            .iter()
            .map(|n| Target {
                label: n.clone(),
                address: n.clone(),
                control_plane: None,
            })
            .collect(),
    };
    let endpoints = ctx
        .endpoints
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let per_node: Vec<(Vec<Check>, Option<NodeTarget>)> = futures::stream::iter(targets.iter())
        .map(|t| node_checks(talos, t, &endpoints))
        .buffered(16)
        .collect()
        .await;
    let mut checks = Vec::new();
    let mut first_cp = None;
    for (c, cp) in per_node {
        checks.extend(c);
        if first_cp.is_none() {
            first_cp = cp;
        }
    }
    let expected = nodes.map(|n| n.iter().filter(|n| n.control_plane).count());
    match first_cp {
        Some(cp) => checks.push(members_check(talos, &cp, expected).await),
        None => checks.push(Check::skip(
            "etcd-members",
            "etcd",
            "not checked: no control-plane node answered",
        )),
    }
    checks
}

/// Version (+ etcd status on control planes) of one node; returns the node's target when it
/// is a reachable control plane with a healthy etcd member.
async fn node_checks(
    talos: &TalosClient,
    t: &Target,
    endpoints: &str,
) -> (Vec<Check>, Option<NodeTarget>) {
    let label = if t.label == t.address {
        t.label.clone()
    } else {
        format!("{} ({})", t.label, t.address)
    };
    let target = match NodeTarget::parse(&t.address) {
        Ok(n) => n,
        Err(e) => {
            return (
                vec![Check::fail(
                    "talos-api",
                    label,
                    crate::error_chain(&e),
                    "give the node an InternalIP address",
                )],
                None,
            );
        }
    };
    let mut checks = Vec::new();
    match talos.version(&target).await {
        Ok(v) => checks.push(Check::pass(
            "talos-api",
            &label,
            format!("reachable, Talos {}", v.tag),
        )),
        Err(e) => {
            let text = crate::error_chain(&e);
            let fix = match &e {
                TalosError::Tls { .. } => format!(
                    "the talosconfig's CA or client certificate does not match the cluster's Talos API at {endpoints}: use the cluster's own talosconfig"
                ),
                _ if text.contains("tcp connect error") || text.contains("timed out") => format!(
                    "the Talos API endpoint {endpoints} does not answer from this host: check the talosconfig's endpoints and the firewall (port 50000)"
                ),
                _ => format!(
                    "check that the node is up and that apid at {endpoints} can reach it (`talosctl -n {} version`)",
                    t.address
                ),
            };
            checks.push(Check::fail(
                "talos-api",
                &label,
                crate::error_chain(&e),
                fix,
            ));
            return (checks, None);
        }
    }
    checks.extend(kube_upgrade_check(talos, &target, &label, t.control_plane).await);
    if t.control_plane == Some(false) {
        return (checks, None);
    }
    match talos.etcd_status(&target).await {
        Ok(s) if s.errors.is_empty() => {
            checks.push(Check::pass(
                "etcd",
                &label,
                format!(
                    "member {:x} healthy{}",
                    s.member_id,
                    if s.leader == s.member_id {
                        ", leader"
                    } else {
                        ""
                    }
                ),
            ));
            (checks, Some(target))
        }
        Ok(s) => {
            checks.push(Check::fail(
                "etcd",
                &label,
                format!("etcd member {:x} reports: {}", s.member_id, s.errors.join("; ")),
                format!(
                    "look at `talosctl -n {} service etcd` and `talosctl -n {} logs etcd`; medea will not touch control planes while etcd is unhealthy",
                    t.address, t.address
                ),
            ));
            (checks, None)
        }
        // A talosconfig `nodes` entry that turns out to be a worker.
        Err(e)
            if t.control_plane.is_none()
                && matches!(
                    e.code(),
                    Some(tonic::Code::Unimplemented | tonic::Code::FailedPrecondition)
                ) =>
        {
            (checks, None)
        }
        Err(e) => {
            checks.push(Check::fail(
                "etcd",
                &label,
                crate::error_chain(&e),
                format!("look at `talosctl -n {} service etcd`", t.address),
            ));
            (checks, None)
        }
    }
}

/// Flags, feature gates and admission plugins the next Kubernetes minor removes that the node's
/// machine config still sets (`extraArgs`; the table of `upgrade-k8s`'s checks, go-kubernetes
/// `upgrade/checks.go`, in `rollout::removed`): a warning, since a Kubernetes step to that minor
/// halts on them. Nothing when there is none; a skip when the config cannot be read.
async fn kube_upgrade_check(
    talos: &TalosClient,
    target: &NodeTarget,
    label: &str,
    control_plane: Option<bool>,
) -> Option<Check> {
    use crate::rollout::ports::Component;
    use crate::rollout::removed::removed_settings;
    use crate::rollout::sequencer::image_version;
    use crate::talos::adapter::{component_args_of, component_images_of};
    const CHECK: &str = "kube-upgrade";
    let mc = match talos.machine_config(target).await {
        Ok(mc) => mc,
        Err(e) => {
            return Some(Check::skip(
                CHECK,
                label,
                format!(
                    "cannot read the machine configuration: {}",
                    crate::error_chain(&e)
                ),
            ));
        }
    };
    let yaml = mc.yaml().expose();
    let (mut args, images) = match (component_args_of(yaml), component_images_of(yaml)) {
        (Ok(a), Ok(i)) => (a, i),
        (Err(e), _) | (_, Err(e)) => {
            return Some(Check::skip(CHECK, label, crate::error_chain(&e)));
        }
    };
    let (running, _) = images
        .get(&Component::Kubelet)
        .and_then(|i| image_version(i))?;
    let next = running.next_minor();
    if control_plane == Some(false) {
        args.retain(|c, _| *c == Component::Kubelet);
    }
    let found = removed_settings(label, &args, &next);
    if found.is_empty() {
        return None;
    }
    let list: Vec<String> = found.iter().map(|f| f.to_string()).collect();
    Some(Check::warn(
        CHECK,
        label,
        format!(
            "Kubernetes 1.{} removes settings this node's machine config sets: {}",
            next.minor(),
            list.join("; ")
        ),
        format!(
            "remove them from the machine config before upgrading Kubernetes to 1.{} (a Kubernetes step halts on them)",
            next.minor()
        ),
    ))
}

async fn members_check(talos: &TalosClient, from: &NodeTarget, expected: Option<usize>) -> Check {
    const CHECK: &str = "etcd-members";
    let target = format!("etcd (via {})", from.as_str());
    match talos.etcd_members(from).await {
        Err(e) => Check::fail(
            CHECK,
            target,
            crate::error_chain(&e),
            format!("look at `talosctl -n {} etcd members`", from.as_str()),
        ),
        Ok(members) => {
            let learners: Vec<&str> = members
                .iter()
                .filter(|m| m.is_learner)
                .map(|m| m.hostname.as_str())
                .collect();
            let voting = members.len() - learners.len();
            let names = members
                .iter()
                .map(|m| m.hostname.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            if !learners.is_empty() {
                return Check::fail(
                    CHECK,
                    target,
                    format!("learners still joining: {}", learners.join(", ")),
                    "wait for the learners to be promoted before any rollout",
                );
            }
            match expected {
                Some(n) if n != voting => Check::fail(
                    CHECK,
                    target,
                    format!("{voting} members ({names}) for {n} control-plane nodes"),
                    "remove stale members (`talosctl etcd remove-member`) or join the missing control planes before any rollout",
                ),
                _ => Check::pass(CHECK, target, format!("{voting} members: {names}")),
            }
        }
    }
}
