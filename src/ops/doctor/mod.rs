//! `medea doctor`'s checks: an offline preflight of every cluster in the credentials directory,
//! as data ([`Report`] → [`ClusterReport`] → [`Check`]); `cli::doctor` parses the arguments and
//! renders the report. It talks to the Talos API and the kube-apiserver directly (no server
//! needed):
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
//! - health sources: every Prometheus and Alertmanager the **last-applied** state names (read
//!   from the store, `--store`) answers a trivial question (`vector(1)`, `/api/v2/status`),
//!   asked with the credential it names. A source only the unapproved desired state
//!   (`--desired`) names is listed (URL and credential name) but not contacted, unless the
//!   operator passes `--contact-unapproved`; even then it is asked without any credential
//!   (issue #32: a commit alone never makes medea send its secrets anywhere).
//!
//! **Owns:** the checks, their thresholds and the report types.
//! **May depend on:** `k8s` and `talos` (the clients), `ops::refresh` (the credentials
//! layout). **Used by:** `cli::doctor`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::k8s::AccessCheck;
use crate::ops::refresh::{RefreshSettings, clusters_with_creds};
use crate::plan::health::HealthSources;

mod checks;
mod cluster;

pub use checks::{CertFacts, cert_facts, clock_check, talos_cert_check};
pub use cluster::diagnose_cluster;

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
    /// `talos-api`, `etcd`, `etcd-members`, `prometheus`, `alertmanager`, `preflight` (a plan's
    /// finding; target = its id).
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
    CredsDir(#[source] Box<crate::ops::refresh::RefreshError>),
}

/// The preflight findings of `plan` (issue #22) as checklist lines, per cluster: a blocking
/// finding nobody acknowledged fails, a warning warns, an acknowledged finding passes (marked).
/// The same findings `medea plan` shows, since they come from the same plan.
pub fn preflight_checks(plan: &crate::plan::Plan) -> Vec<(String, Check)> {
    let mut out = Vec::new();
    for c in &plan.clusters {
        for f in &c.preflight {
            let check = if f.acknowledged {
                Check::pass(
                    "preflight",
                    f.id.clone(),
                    format!("{} (acknowledged)", f.message),
                )
            } else if f.blocks() {
                Check::fail("preflight", f.id.clone(), f.message.clone(), f.help.clone())
            } else {
                Check::warn("preflight", f.id.clone(), f.message.clone(), f.help.clone())
            };
            out.push((c.cluster.clone(), check));
        }
    }
    out
}

impl Report {
    /// Add `checks` to their clusters' lists (a cluster without credentials gets a list of its
    /// own) and recompute `ok`.
    pub fn with_checks(self, checks: Vec<(String, Check)>) -> Report {
        let mut clusters = self.clusters;
        for (cluster, check) in checks {
            match clusters.iter_mut().find(|c| c.cluster == cluster) {
                Some(c) => c.checks.push(check),
                None => clusters.push(ClusterReport {
                    cluster,
                    creds_dir: String::new(),
                    checks: vec![check],
                }),
            }
        }
        Report::new(clusters)
    }
}

/// Check every cluster under `creds_dir` (or just `cluster`).
pub async fn diagnose(
    creds_dir: &Path,
    cluster: Option<&str>,
    settings: &RefreshSettings,
) -> Result<Report, DoctorError> {
    diagnose_with_health(
        creds_dir,
        cluster,
        settings,
        &BTreeMap::new(),
        ContactUnapproved(false),
    )
    .await
}

/// One cluster's health sources as `medea doctor` sees them: those of the last-applied state
/// (approved: asked with their credentials) and those the desired state names (`None`: no
/// desired state given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourcesToCheck {
    pub approved: HealthSources,
    pub desired: Option<HealthSources>,
}

/// Whether sources only the unapproved desired state names are asked (without credentials).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContactUnapproved(pub bool);

/// The `prometheus` and `alertmanager` checks of one cluster's health sources: each approved
/// source answers a trivial question within the probes' timeout, asked with the credential it
/// names (resolved under `<creds_dir>/<cluster>/health/`); each source only the desired state
/// names is skipped, or with [`ContactUnapproved`] asked without any credential.
pub async fn health_source_checks(
    creds_dir: &Path,
    cluster: &str,
    sources: &SourcesToCheck,
    unapproved: ContactUnapproved,
) -> Vec<Check> {
    let mut out = Vec::new();
    let credentials = match crate::ops::cluster_ports::health_credentials(creds_dir, cluster) {
        Ok(c) => c,
        Err(e) => {
            out.push(Check::fail(
                "health-sources",
                cluster.to_string(),
                crate::error_chain(&e),
                "use the cluster's name as the inventory knows it",
            ));
            return out;
        }
    };
    let approved = crate::health::Probes::new(sources.approved.clone())
        .with_credentials(credentials)
        .check_sources()
        .await;
    for (name, url, result) in approved {
        out.push(match result {
            Ok(summary) => Check::pass(name, url, summary),
            Err(e) => Check::fail(
                name,
                url.clone(),
                crate::error_chain(&e),
                format!("make {url} reachable from medea (and its credential's files under {}/{cluster}/health/ readable), or fix `health.{name}` in the Cluster", creds_dir.display()),
            ),
        });
    }
    let Some(desired) = &sources.desired else {
        return out;
    };
    let mut unapproved_sources = HealthSources::default();
    for (slot, mine, applied) in [
        (
            &mut unapproved_sources.prometheus,
            &desired.prometheus,
            &sources.approved.prometheus,
        ),
        (
            &mut unapproved_sources.alertmanager,
            &desired.alertmanager,
            &sources.approved.alertmanager,
        ),
    ] {
        if let Some(e) = mine
            && Some(e) != applied.as_ref()
        {
            *slot = Some(e.clone());
        }
    }
    if !unapproved.0 {
        for (name, e) in [
            ("prometheus", &unapproved_sources.prometheus),
            ("alertmanager", &unapproved_sources.alertmanager),
        ] {
            if let Some(e) = e {
                out.push(Check::skip(
                    name,
                    e.summary(),
                    "not contacted: only the unapproved desired state names this source (approve a plan that names it, or pass --contact-unapproved to ask it without medea's credentials)",
                ));
            }
        }
        return out;
    }
    // Asked as anyone on the network would: no credential of medea's is read or sent.
    let strip = |e: &Option<crate::plan::health::Endpoint>| {
        e.as_ref().map(|e| crate::plan::health::Endpoint {
            url: e.url.clone(),
            credential: None,
        })
    };
    let bare = HealthSources {
        prometheus: strip(&unapproved_sources.prometheus),
        alertmanager: strip(&unapproved_sources.alertmanager),
    };
    let asked = crate::health::Probes::new(bare)
        .with_credentials(crate::health::http::Credentials::None)
        .check_sources()
        .await;
    for (name, url, result) in asked {
        let shown = match name {
            "prometheus" => unapproved_sources.prometheus.as_ref(),
            _ => unapproved_sources.alertmanager.as_ref(),
        }
        .map_or(url.clone(), crate::plan::health::Endpoint::summary);
        out.push(match result {
            Ok(summary) => Check::warn(
                name,
                shown,
                format!("{summary} (unapproved source, asked without credentials)"),
                "approve a plan that names this source before medea uses it",
            ),
            Err(e) => Check::fail(
                name,
                shown,
                format!(
                    "{} (unapproved source, asked without credentials)",
                    crate::error_chain(&e)
                ),
                format!("make {url} reachable from medea, or fix `health.{name}` in the Cluster"),
            ),
        });
    }
    out
}

/// [`diagnose`], and for each cluster in `health` (cluster → its approved and desired
/// sources) the [`health_source_checks`].
pub async fn diagnose_with_health(
    creds_dir: &Path,
    cluster: Option<&str>,
    settings: &RefreshSettings,
    health: &BTreeMap<String, SourcesToCheck>,
    unapproved: ContactUnapproved,
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
        let mut report = diagnose_cluster(creds_dir, name, settings).await;
        if let Some(sources) = health.get(name) {
            report
                .checks
                .extend(health_source_checks(creds_dir, name, sources, unapproved).await);
        }
        clusters.push(report);
    }
    Ok(Report::new(clusters))
}
