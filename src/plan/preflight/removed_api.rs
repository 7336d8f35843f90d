//! Removed and deprecated Kubernetes APIs before a Kubernetes minor upgrade.
//!
//! Two live sources: the `apiserver_requested_deprecated_apis` gauge of every apiserver medea
//! scraped (a client called the API since that apiserver started), and objects whose
//! `managedFields` show a writer using the version. Usage of an API the target minor no longer
//! serves (`removed <= target`) is blocking; of one deprecated by the target minor, a warning.

use std::collections::BTreeMap;

use super::{Finding, Scope, Severity, checks};
use crate::api_lifecycle::{ApiLifecycle, Minor, lookup};
use crate::inventory::preflight::PreflightObservations;

/// Managers whose managedFields entries are the apiserver's own bookkeeping, never a client
/// still calling an old version (the APF config producer keeps `v1beta2`/`v1beta3` entries on
/// the built-in FlowSchemas forever; `pkg/registry/flowcontrol/ensurer/strategy.go`).
pub const IGNORED_MANAGERS: &[&str] = &[
    "api-priority-and-fairness-config-producer-v1",
    "kube-apiserver",
    "kube-controller-manager",
];

/// `1.32` (the gauge's `removed_release`) → `(1, 32)`.
fn release(s: &str) -> Option<Minor> {
    let (a, b) = s.trim_start_matches('v').split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

fn api_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// One group-version-resource and what was seen of it.
#[derive(Default)]
struct Usage {
    kind: String,
    /// From the table (or the gauge's `removed_release` for APIs the table lacks).
    removed: Option<Minor>,
    deprecated: Option<Minor>,
    replacement: Option<String>,
    evidence: Vec<String>,
}

pub(super) fn check(
    table: &[ApiLifecycle],
    p: &PreflightObservations,
    scope: &Scope,
) -> Vec<Finding> {
    let Some((_, target)) = scope.kube_minor else {
        return Vec::new();
    };
    let target_text = format!("v{}.{}", target.0, target.1);
    let mut usages: BTreeMap<(String, String, String), Usage> = BTreeMap::new();
    let entry = |usages: &mut BTreeMap<(String, String, String), Usage>,
                 g: &str,
                 v: &str,
                 r: &str|
     -> (String, String, String) {
        let key = (g.to_string(), v.to_string(), r.to_string());
        let u = usages.entry(key.clone()).or_default();
        if let Some(row) = lookup(table, g, v, r) {
            u.kind = row.kind.clone();
            u.removed = Some(row.removed);
            u.deprecated = Some(row.deprecated);
            u.replacement = row.replacement.clone();
        }
        key
    };
    for s in &p.deprecated_api_requests {
        let key = entry(&mut usages, &s.group, &s.version, &s.resource);
        let u = usages.entry(key).or_default();
        if u.removed.is_none() {
            u.removed = release(&s.removed_release);
        }
        let sub = if s.subresource.is_empty() {
            String::new()
        } else {
            format!(" (subresource {})", s.subresource)
        };
        u.evidence.push(format!(
            "apiserver {} counted requests to {}{sub} (apiserver_requested_deprecated_apis, removed_release \"{}\")",
            s.source,
            api_version(&s.group, &s.version),
            s.removed_release
        ));
    }
    for m in &p.managed_fields {
        if IGNORED_MANAGERS.contains(&m.manager.as_str()) {
            continue;
        }
        let (g, v) = m
            .api_version
            .rsplit_once('/')
            .unwrap_or(("", &m.api_version));
        if lookup(table, g, v, &m.resource).is_none() {
            continue; // not a version the table knows to go away
        }
        let key = entry(&mut usages, g, v, &m.resource);
        let u = usages.entry(key).or_default();
        if u.kind.is_empty() {
            u.kind = m.kind.clone();
        }
        let obj = if m.namespace.is_empty() {
            m.name.clone()
        } else {
            format!("{}/{}", m.namespace, m.name)
        };
        u.evidence.push(format!(
            "{} {obj}: managedFields entry of manager `{}` ({}) written with {}",
            m.kind, m.manager, m.operation, m.api_version
        ));
    }

    let mut partial: Vec<String> = p
        .apiserver_metrics
        .iter()
        .filter_map(|m| {
            m.error.as_ref().map(|e| {
                format!(
                    "partial view: apiserver {} did not answer /metrics: {e}",
                    m.endpoint
                )
            })
        })
        .collect();
    let answered = p.apiserver_metrics.iter().any(|m| m.error.is_none());
    if p.apiserver_metrics.is_empty() {
        partial.push("partial view: no apiserver /metrics endpoint was scraped".into());
    }

    let mut out = Vec::new();
    for ((g, v, r), mut u) in usages {
        let av = api_version(&g, &v);
        let removed_by_target = u.removed.is_some_and(|rm| rm <= target);
        let deprecated_by_target = u.deprecated.is_none_or(|d| d <= target);
        if !removed_by_target && !deprecated_by_target {
            continue;
        }
        let what = if u.kind.is_empty() {
            format!("{av} {r}")
        } else {
            format!("{av} {} ({r})", u.kind)
        };
        let lifecycle = match (u.deprecated, u.removed) {
            (Some(d), Some(rm)) => format!(
                "deprecated in v{}.{}, removed in v{}.{}",
                d.0, d.1, rm.0, rm.1
            ),
            (None, Some(rm)) => format!("removed in v{}.{}", rm.0, rm.1),
            (Some(d), None) => format!("deprecated in v{}.{}", d.0, d.1),
            (None, None) => "deprecated, no removal planned".to_string(),
        };
        let instead = u
            .replacement
            .as_ref()
            .map_or_else(|| "no replacement".to_string(), |x| format!("use {x}"));
        u.evidence.extend(partial.iter().cloned());
        let (id, severity, message, help) = if removed_by_target {
            (
                format!("removed-api/{av}/{r}"),
                Severity::Blocking,
                format!(
                    "{what} is still used and {target_text} no longer serves it ({lifecycle}; {instead})"
                ),
                format!(
                    "move every client and manifest to the replacement ({instead}) before upgrading Kubernetes to {target_text}; or acknowledge `removed-api/{av}/{r}` under spec.preflight.acknowledge"
                ),
            )
        } else {
            (
                format!("deprecated-api/{av}/{r}"),
                Severity::Warning,
                format!(
                    "{what} is still used and deprecated in {target_text} ({lifecycle}; {instead})"
                ),
                format!(
                    "move its clients to the replacement ({instead}) before a later upgrade removes it"
                ),
            )
        };
        out.push(Finding::new(
            id,
            checks::REMOVED_API,
            severity,
            message,
            u.evidence,
            help,
        ));
    }
    if !answered {
        out.push(Finding::new(
            "removed-api/unobserved",
            checks::REMOVED_API,
            Severity::Blocking,
            format!("no apiserver's deprecated-API usage could be read before the Kubernetes upgrade to {target_text}: removed APIs still in use cannot be ruled out"),
            partial,
            "give medea's kubeconfig `get` on the non-resource URL /metrics (or make each control-plane node's kube-apiserver port reachable from medea) and refresh; or acknowledge `removed-api/unobserved`",
        ));
    } else if !partial.is_empty() {
        out.push(Finding::new(
            "removed-api/partial-view",
            checks::REMOVED_API,
            Severity::Warning,
            format!("not every apiserver's deprecated-API usage could be read before the Kubernetes upgrade to {target_text}: the view is partial"),
            partial,
            "each kube-apiserver counts only the requests it served: make every control-plane node's kube-apiserver /metrics readable from medea (its address and port are in the `kubernetes` EndpointSlice of `default`) and refresh",
        ));
    }
    out
}
