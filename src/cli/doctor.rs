//! `medea doctor`: an offline preflight of every cluster in the credentials directory. It talks
//! to the Talos API and the kube-apiserver directly (no server needed) and prints a checklist:
//!
//! - credentials: `<creds-dir>` and `<creds-dir>/<cluster>` are 0700, both files 0600;
//! - the talosconfig's client certificate: not expired (warn within 30 days), role `os:admin`
//!   (the certificate's Organization; medea upgrades, reboots and reads machine configs);
//!   the kubeconfig's client certificate, when it uses one: not expired;
//! - the kube-apiserver: reachable (`/version`), and RBAC for what medea does (get/list/patch
//!   nodes, get/list pods, create pods/eviction, list poddisruptionbudgets) by
//!   `SelfSubjectAccessReview`;
//! - clock skew: the kube-apiserver's `Date` header against the local clock (the Talos API has no
//!   time RPC medea uses): warn above 5 s, fail above 30 s;
//! - per node (from the kube Node list, else the talosconfig's `nodes`): the Talos API answers
//!   `Version` through the talosconfig endpoint;
//! - etcd: every control plane's `EtcdStatus` has no errors, and the member list has one
//!   voting member per control-plane node.
//!
//! Exit status 1 when any check fails; warnings do not fail. `-o json` prints the same report.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use futures::StreamExt as _;
use miette::{IntoDiagnostic as _, WrapErr as _};
use serde::Serialize;

use super::exit;
use crate::k8s::{AccessCheck, ClusterNode, KubeApi as _, KubeClient};
use crate::server::refresh::{ClusterCreds, RefreshSettings, clusters_with_creds};
use crate::talos::{NodeTarget, TalosApi as _, TalosClient, TalosContext, TalosError};

/// The role medea needs in the talosconfig's client certificate.
pub const REQUIRED_TALOS_ROLE: &str = "os:admin";
/// Certificates expiring sooner than this are a warning.
pub const CERT_WARN_DAYS: i64 = 30;
/// Clock skew above this is a warning...
pub const CLOCK_WARN_SECS: i64 = 5;
/// ...and above this a failure.
pub const CLOCK_FAIL_SECS: i64 = 30;

/// The permissions medea's drain and readiness checks use.
pub fn required_permissions() -> Vec<AccessCheck> {
    vec![
        AccessCheck::new("get", "", "nodes", ""),
        AccessCheck::new("list", "", "nodes", ""),
        AccessCheck::new("patch", "", "nodes", ""),
        AccessCheck::new("get", "", "pods", ""),
        AccessCheck::new("list", "", "pods", ""),
        AccessCheck::new("create", "", "pods", "eviction"),
        AccessCheck::new("list", "policy", "poddisruptionbudgets", ""),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  medea doctor --creds-dir /var/lib/medea/creds\n  medea doctor --cluster home --creds-dir ./state/creds -o json\n\nExit status: 0 every check passed (warnings allowed), 1 something to fix."
)]
pub struct DoctorArgs {
    /// Check only this cluster (default: every <creds-dir>/<cluster>/ with both files).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Credentials directory: <DIR>/<cluster>/{talosconfig,kubeconfig} (what `medea seed` writes).
    #[arg(long, value_name = "DIR")]
    pub creds_dir: PathBuf,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Output,
}

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Warn,
    Fail,
    /// Not run because something it needs failed first.
    Skip,
}

/// One line of the checklist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// `creds`, `talos-cert`, `kube-cert`, `kube-apiserver`, `rbac`, `clock`, `kube-nodes`,
    /// `talos-api`, `etcd`, `etcd-members`.
    pub check: &'static str,
    /// What was checked: a path, a node, a URL.
    pub target: String,
    pub status: Status,
    pub detail: String,
    /// What to do about a failure or warning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn pass(check: &'static str, target: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            check,
            target: target.into(),
            status: Status::Pass,
            detail: detail.into(),
            fix: None,
        }
    }
    fn fail(
        check: &'static str,
        target: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check {
            check,
            target: target.into(),
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
    fn warn(
        check: &'static str,
        target: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check {
            status: Status::Warn,
            ..Check::fail(check, target, detail, fix)
        }
    }
    fn skip(check: &'static str, target: impl Into<String>, why: impl Into<String>) -> Check {
        Check {
            check,
            target: target.into(),
            status: Status::Skip,
            detail: why.into(),
            fix: None,
        }
    }
}

/// One cluster's checklist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterReport {
    pub cluster: String,
    pub creds_dir: String,
    pub checks: Vec<Check>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// No check failed.
    pub ok: bool,
    pub clusters: Vec<ClusterReport>,
}

impl Report {
    fn new(clusters: Vec<ClusterReport>) -> Report {
        let ok = clusters
            .iter()
            .flat_map(|c| &c.checks)
            .all(|c| c.status != Status::Fail);
        Report { ok, clusters }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    #[error(
        "no cluster credentials under `{path}` (expected `{path}/<cluster>/talosconfig` and `kubeconfig`); run `medea seed` first"
    )]
    NoClusters { path: PathBuf },
    #[error("cannot read the credentials directory")]
    CredsDir(#[source] Box<crate::server::refresh::RefreshError>),
}

// ---------------------------------------------------------------------------------------------
// Pure checks

/// What medea reads out of a client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFacts {
    pub not_after: jiff::Timestamp,
    /// Subject Organization values (Talos roles, Kubernetes groups).
    pub organizations: Vec<String>,
}

/// Parse the first certificate of a PEM bundle.
pub fn cert_facts(pem: &str) -> Result<CertFacts, String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|_| "the certificate is not PEM".to_string())?;
    let cert = pem
        .parse_x509()
        .map_err(|_| "the certificate is not valid X.509".to_string())?;
    let not_after = jiff::Timestamp::from_second(cert.validity().not_after.timestamp())
        .map_err(|_| "the certificate's expiry is out of range".to_string())?;
    let organizations = cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Ok(CertFacts {
        not_after,
        organizations,
    })
}

fn expiry_text(not_after: jiff::Timestamp, now: jiff::Timestamp) -> (i64, String) {
    let days = (not_after - now).get_seconds().div_euclid(86_400);
    let date = not_after.strftime("%Y-%m-%d").to_string();
    (days, date)
}

/// The talosconfig client certificate: expiry and role. Pure (`now` is an argument).
pub fn talos_cert_check(target: &str, crt_pem: &str, now: jiff::Timestamp) -> Check {
    const CHECK: &str = "talos-cert";
    let regenerate = "generate an admin talosconfig: `talosctl config new --roles os:admin talosconfig` against the cluster (or from its secrets), then `medea seed --force`";
    let facts = match cert_facts(crt_pem) {
        Ok(f) => f,
        Err(e) => return Check::fail(CHECK, target, e, regenerate),
    };
    let (days, date) = expiry_text(facts.not_after, now);
    let roles = if facts.organizations.is_empty() {
        "no role".to_string()
    } else {
        format!("role {}", facts.organizations.join(", "))
    };
    if facts.not_after <= now {
        return Check::fail(
            CHECK,
            target,
            format!("{roles}, expired on {date}"),
            regenerate,
        );
    }
    if !facts.organizations.iter().any(|o| o == REQUIRED_TALOS_ROLE) {
        return Check::fail(
            CHECK,
            target,
            format!(
                "{roles}, expires {date}: medea needs `{REQUIRED_TALOS_ROLE}` (upgrades, reboots, machine config)"
            ),
            regenerate,
        );
    }
    if days < CERT_WARN_DAYS {
        return Check::warn(
            CHECK,
            target,
            format!("{roles}, expires {date} (in {days} days)"),
            regenerate,
        );
    }
    Check::pass(
        CHECK,
        target,
        format!("{roles}, expires {date} (in {days} days)"),
    )
}

/// The kube-apiserver's clock against ours. Pure.
pub fn clock_check(target: &str, server: Option<jiff::Timestamp>, local: jiff::Timestamp) -> Check {
    const CHECK: &str = "clock";
    let Some(server) = server else {
        return Check::skip(
            CHECK,
            target,
            "the kube-apiserver sent no usable Date header",
        );
    };
    let skew = (server - local).get_seconds();
    let detail = format!(
        "local clock {} the kube-apiserver's by {}s (limit {CLOCK_FAIL_SECS}s)",
        if skew > 0 { "behind" } else { "ahead of" },
        skew.abs()
    );
    let fix = "synchronize this host's clock (chrony or systemd-timesyncd) and check the nodes' time servers (`talosctl get timestatus`)";
    if skew.abs() > CLOCK_FAIL_SECS {
        Check::fail(CHECK, target, detail, fix)
    } else if skew.abs() > CLOCK_WARN_SECS {
        Check::warn(CHECK, target, detail, fix)
    } else {
        Check::pass(CHECK, target, format!("within {}s", skew.abs().max(0)))
    }
}

fn mode_check(path: &Path, want_dir: bool) -> Check {
    use std::os::unix::fs::PermissionsExt as _;
    const CHECK: &str = "creds";
    let target = path.display().to_string();
    let (want, chmod) = if want_dir {
        ("0700", "700")
    } else {
        ("0600", "600")
    };
    match std::fs::metadata(path) {
        Err(e) => Check::fail(
            CHECK,
            target,
            format!("cannot be read: {e}"),
            "run `medea seed` for this cluster (it writes the credentials)",
        ),
        Ok(m) if m.is_dir() != want_dir => Check::fail(
            CHECK,
            target,
            if want_dir {
                "is not a directory"
            } else {
                "is not a file"
            },
            "run `medea seed` for this cluster (it writes the credentials)",
        ),
        Ok(m) => {
            let mode = m.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                Check::fail(
                    CHECK,
                    &target,
                    format!("mode {mode:04o}: other users can read the credentials"),
                    format!("chmod {chmod} {target}"),
                )
            } else {
                Check::pass(CHECK, target, format!("mode {mode:04o} (want {want})"))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Checks against the cluster

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

fn kube_cert_check(kubeconfig: &Path, now: jiff::Timestamp) -> Option<Check> {
    use base64::Engine as _;
    const CHECK: &str = "kube-cert";
    let kc = crate::k8s::kubeconfig::read(kubeconfig).ok()?;
    let context = kc.current_context.as_deref()?;
    let user = kc
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .user
        .clone()?;
    let auth = kc
        .auth_infos
        .iter()
        .find(|a| a.name == user)?
        .auth_info
        .as_ref()?;
    let data = auth.client_certificate_data.as_deref()?;
    let target = kubeconfig.display().to_string();
    let fix = "get a fresh kubeconfig (`talosctl kubeconfig`), then `medea seed --force`";
    let pem = match base64::engine::general_purpose::STANDARD.decode(data.trim()) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => {
            return Some(Check::fail(
                CHECK,
                target,
                "client-certificate-data is not base64",
                fix,
            ));
        }
    };
    Some(match cert_facts(&pem) {
        Err(e) => Check::fail(CHECK, target, e, fix),
        Ok(f) => {
            let (days, date) = expiry_text(f.not_after, now);
            if f.not_after <= now {
                Check::fail(CHECK, target, format!("expired on {date}"), fix)
            } else if days < CERT_WARN_DAYS {
                Check::warn(
                    CHECK,
                    target,
                    format!("expires {date} (in {days} days)"),
                    fix,
                )
            } else {
                Check::pass(CHECK, target, format!("expires {date} (in {days} days)"))
            }
        }
    })
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
            if t.control_plane.is_none() && e.code() == Some(tonic::Code::FailedPrecondition) =>
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
    let next = crate::version::KubeVersion::new(running.major(), running.minor() + 1, 0);
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

/// Check every cluster under `creds_dir` (or just `cluster`).
pub async fn diagnose(
    creds_dir: &Path,
    cluster: Option<&str>,
    settings: &RefreshSettings,
) -> Result<Report, DoctorError> {
    let names = match cluster {
        Some(c) => vec![c.to_string()],
        None => clusters_with_creds(creds_dir).map_err(|e| DoctorError::CredsDir(Box::new(e)))?,
    };
    if names.is_empty() {
        return Err(DoctorError::NoClusters {
            path: creds_dir.to_path_buf(),
        });
    }
    let mut clusters = Vec::new();
    for name in &names {
        clusters.push(diagnose_cluster(creds_dir, name, settings).await);
    }
    Ok(Report::new(clusters))
}

// ---------------------------------------------------------------------------------------------
// Rendering

/// The checklist for people.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    let mut todo = Vec::new();
    for c in &report.clusters {
        out.push_str(&format!("cluster {} ({})\n", c.cluster, c.creds_dir));
        let width = c.checks.iter().map(|k| k.check.len()).max().unwrap_or(0);
        for k in &c.checks {
            let mark = match k.status {
                Status::Pass => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
                Status::Skip => "skip",
            };
            out.push_str(&format!(
                "  {mark}  {:<width$}  {}: {}\n",
                k.check, k.target, k.detail
            ));
            if let (Some(fix), Status::Fail | Status::Warn) = (&k.fix, k.status) {
                todo.push(format!(
                    "  [ ] {}{} {}: {fix}",
                    if k.status == Status::Warn {
                        "(warning) "
                    } else {
                        ""
                    },
                    c.cluster,
                    k.target
                ));
            }
        }
    }
    let count = |s: Status| {
        report
            .clusters
            .iter()
            .flat_map(|c| &c.checks)
            .filter(|k| k.status == s)
            .count()
    };
    out.push_str(&format!(
        "{} passed, {} warnings, {} failed, {} skipped\n",
        count(Status::Pass),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::Skip)
    ));
    if !todo.is_empty() {
        out.push_str("to fix:\n");
        for t in todo {
            out.push_str(&t);
            out.push('\n');
        }
    }
    out
}

pub fn run(args: DoctorArgs) -> miette::Result<u8> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .into_diagnostic()
        .wrap_err("failed to start the async runtime")?;
    let settings = RefreshSettings {
        talos: crate::talos::ClientSettings {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            ..RefreshSettings::default().talos
        },
        ..RefreshSettings::default()
    };
    let report = rt
        .block_on(diagnose(
            &args.creds_dir,
            args.cluster.as_deref(),
            &settings,
        ))
        .map_err(|e| miette::miette!("{}", crate::error_chain(&e)))?;
    match args.output {
        Output::Text => print!("{}", render_text(&report)),
        Output::Json => print!("{}", super::output::json(&report)),
    }
    Ok(if report.ok { exit::OK } else { exit::ERROR })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(orgs: &[&str], not_after: jiff::civil::Date) -> String {
        let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
        for o in orgs {
            p.distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(
            not_after.year().into(),
            not_after.month() as u8,
            not_after.day() as u8,
        );
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        p.self_signed(&key).unwrap().pem()
    }

    fn now() -> jiff::Timestamp {
        "2026-08-21T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn talos_certificates_need_os_admin_and_time_left() {
        let ok = talos_cert_check(
            "t",
            &cert(&["os:admin"], jiff::civil::date(2027, 8, 21)),
            now(),
        );
        assert_eq!(ok.status, Status::Pass, "{ok:?}");
        assert!(
            ok.detail.contains("role os:admin, expires 2027-08-21"),
            "{ok:?}"
        );

        let reader = talos_cert_check(
            "t",
            &cert(&["os:reader"], jiff::civil::date(2027, 8, 21)),
            now(),
        );
        assert_eq!(reader.status, Status::Fail);
        assert!(
            reader.detail.contains("role os:reader") && reader.detail.contains("needs `os:admin`"),
            "{reader:?}"
        );

        let soon = talos_cert_check(
            "t",
            &cert(&["os:admin"], jiff::civil::date(2026, 9, 1)),
            now(),
        );
        assert_eq!(soon.status, Status::Warn, "{soon:?}");
        assert!(soon.detail.contains("in 10 days"), "{soon:?}");

        let expired = talos_cert_check(
            "t",
            &cert(&["os:admin"], jiff::civil::date(2026, 8, 1)),
            now(),
        );
        assert_eq!(expired.status, Status::Fail);
        assert!(
            expired.detail.contains("expired on 2026-08-01"),
            "{expired:?}"
        );

        let garbage = talos_cert_check("t", "not a cert", now());
        assert_eq!(garbage.status, Status::Fail);
        assert!(garbage.fix.unwrap().contains("talosctl config new"));
    }

    #[test]
    fn clock_skew_warns_then_fails() {
        let at = |s: i64| {
            now()
                .checked_add(jiff::SignedDuration::from_secs(s))
                .unwrap()
        };
        assert_eq!(clock_check("k", Some(at(2)), now()).status, Status::Pass);
        let w = clock_check("k", Some(at(-10)), now());
        assert_eq!(w.status, Status::Warn);
        assert!(
            w.detail.contains("ahead of the kube-apiserver's by 10s"),
            "{w:?}"
        );
        let f = clock_check("k", Some(at(120)), now());
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.detail.contains("behind the kube-apiserver's by 120s"),
            "{f:?}"
        );
        assert_eq!(clock_check("k", None, now()).status, Status::Skip);
    }

    #[test]
    fn loose_modes_fail_with_the_chmod_to_run() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("talosconfig");
        std::fs::write(&f, "x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let c = mode_check(&f, false);
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            c.fix.as_deref(),
            Some(format!("chmod 600 {}", f.display()).as_str())
        );
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(mode_check(&f, false).status, Status::Pass);
        assert_eq!(
            mode_check(&f, true).status,
            Status::Fail,
            "a file is not a dir"
        );
        assert_eq!(
            mode_check(&dir.path().join("nope"), false).status,
            Status::Fail
        );
    }
}
