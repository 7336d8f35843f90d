//! Removed and deprecated Kubernetes APIs before a Kubernetes minor upgrade.
//!
//! Two live sources: the `apiserver_requested_deprecated_apis` gauge of every apiserver medea
//! scraped (a client called the API since that apiserver started), and objects whose
//! `managedFields` show a writer using the version. Usage of an API the target minor no longer
//! serves (`removed <= target`) is blocking; of one deprecated by the target minor, a warning.

use std::collections::BTreeMap;

use super::{Finding, Scope, Severity, checks};
use crate::api_lifecycle::{ApiLifecycle, Minor, REMOVED_ALPHA, lookup};
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

/// How long an apiserver must have been up for its deprecated-API gauge to count as evidence
/// that nothing still calls a removed API: the gauge starts empty with the process, and a
/// day covers daily jobs (CronJobs, backups, nightly CI) a shorter window would miss.
pub const MIN_GAUGE_WINDOW: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

pub(super) fn check(
    table: &[ApiLifecycle],
    p: &PreflightObservations,
    scope: &Scope,
    now: Option<jiff::Timestamp>,
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
    out.extend(removed_alpha(p, scope));
    if let Some(now) = now {
        out.extend(short_window(p, now, &target_text));
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

/// Objects of alpha resources the target minor removes: `talosctl upgrade-k8s` lists them
/// before the apiserver moves (go-kubernetes `kubernetes/upgrade/checks.go`,
/// `removedAPIResources`) and refuses while any exist; so does this check.
fn removed_alpha(p: &PreflightObservations, scope: &Scope) -> Vec<Finding> {
    let Some((from, to)) = scope.kube_minor else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for seen in &p.removed_alpha_objects {
        let Some(r) = REMOVED_ALPHA
            .iter()
            .find(|r| r.resource_arg() == seen.resource)
        else {
            continue;
        };
        if !(from < r.removed && r.removed <= to) {
            continue;
        }
        let av = r.api_version();
        let removed = format!("v{}.{}", r.removed.0, r.removed.1);
        let mut evidence: Vec<String> = seen
            .examples
            .iter()
            .map(|o| format!("{} {o} ({av})", r.kind))
            .collect();
        if seen.count > u64::try_from(seen.examples.len()).unwrap_or(u64::MAX) {
            evidence.push(format!(
                "{} objects in all (a list of {})",
                seen.count, seen.resource
            ));
        }
        out.push(Finding::new(
            format!("removed-api/{av}/{}", r.resource),
            checks::REMOVED_API,
            Severity::Blocking,
            format!(
                "{} object{} of the alpha resource {av} {} ({}) exist{} and {removed} no longer serves it ({}): `talosctl upgrade-k8s` refuses this upgrade while any exist",
                seen.count,
                if seen.count == 1 { "" } else { "s" },
                r.kind,
                r.resource,
                if seen.count == 1 { "s" } else { "" },
                r.pull
            ),
            evidence,
            format!(
                "delete them (`kubectl delete {} --all{}`) and turn the alpha API off before upgrading Kubernetes to {removed}; or acknowledge `removed-api/{av}/{}` under spec.preflight.acknowledge",
                seen.resource,
                if r.namespaced { " --all-namespaces" } else { "" },
                r.resource
            ),
        ));
    }
    out
}

/// Apiservers up for less than [`MIN_GAUGE_WINDOW`]: their deprecated-API gauge starts empty
/// with the process (k8s.io/apiserver `pkg/endpoints/metrics/metrics.go`), so its silence says
/// little about clients that call rarely.
fn short_window(p: &PreflightObservations, now: jiff::Timestamp, target: &str) -> Vec<Finding> {
    let now = now.as_second();
    let min = i64::try_from(MIN_GAUGE_WINDOW.as_secs()).unwrap_or(i64::MAX);
    let young: Vec<String> = p
        .apiserver_metrics
        .iter()
        .filter(|m| m.error.is_none())
        .filter_map(|m| {
            let started = m.started?;
            let up = now.saturating_sub(started);
            (up < min).then(|| {
                format!(
                    "apiserver {} has been up for {} (process_start_time_seconds {started}): its apiserver_requested_deprecated_apis gauge covers only that time",
                    m.endpoint,
                    super::dur(std::time::Duration::from_secs(u64::try_from(up.max(0)).unwrap_or(0)))
                )
            })
        })
        .collect();
    if young.is_empty() {
        return Vec::new();
    }
    vec![Finding::new(
        "removed-api/short-gauge-window",
        checks::REMOVED_API,
        Severity::Warning,
        format!(
            "not every apiserver has been up for {} yet: a client that last called an API {target} removes before the apiserver (re)started is not counted, so an empty gauge is weak evidence",
            super::dur(MIN_GAUGE_WINDOW)
        ),
        young,
        "let the apiservers run for a day (covering daily jobs) and refresh before approving, or check the clients otherwise (audit logs, `kubectl get --raw /metrics` after their next run)",
    )]
}
