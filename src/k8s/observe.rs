//! What the preflight checks read from a cluster's Kubernetes API (issue #22): the
//! kube-apiserver's `/metrics` (the `apiserver_requested_deprecated_apis` gauge), discovery,
//! objects' `metadata.managedFields` (metadata-only lists), and PodDisruptionBudgets with the
//! pods they cover. Domain types only leave this module; the wire types stay in it.

use std::collections::BTreeMap;
use std::time::Duration;

use ::kube::api::{Api, DynamicObject, ListParams};
use ::kube::core::{ApiResource, GroupVersionKind};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use super::client::{KubeClient, api_err};
use super::{K8sError, selector};

/// How long a `/metrics` scrape of one apiserver may take to connect; a control-plane node
/// that does not answer must not hold up the refresh.
const METRICS_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a `/metrics` answer may take.
const METRICS_READ_TIMEOUT: Duration = Duration::from_secs(15);
/// Page size of the metadata-only lists.
const PAGE: u32 = 500;

/// One resource of a group-version, from discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedResource {
    /// Plural name (`flowschemas`); subresources are left out.
    pub plural: String,
    pub kind: String,
    pub namespaced: bool,
    /// Whether `list` is among its verbs.
    pub listable: bool,
}

/// One `metadata.managedFields[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FieldWriter {
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// `group/version` the writer used.
    pub api_version: String,
    /// `status`, `scale`, or empty.
    pub subresource: String,
}

/// An object's identity and its managedFields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectWriters {
    pub namespace: String,
    pub name: String,
    pub annotations: BTreeMap<String, String>,
    pub writers: Vec<FieldWriter>,
}

/// A PodDisruptionBudget and the pods it selects, each with its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdbCoverage {
    pub namespace: String,
    pub name: String,
    /// `status.disruptionsAllowed` (0 when the status is missing).
    pub disruptions_allowed: i64,
    /// `(pod, node)`; node empty when unscheduled. Sorted. Empty while the budget allows a
    /// disruption.
    pub pods: Vec<(String, String)>,
}

/// The objects one list returned: `namespace/name` (or `name`), sorted.
pub type AlphaList = Vec<String>;

/// One series of `apiserver_requested_deprecated_apis` whose value is 1.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeprecatedSeries {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub removed_release: String,
}

impl KubeClient {
    /// A client for the same credentials and CA against another apiserver (`https://host:port`),
    /// with short timeouts.
    fn for_server(&self, server: &str) -> Result<::kube::Client, K8sError> {
        let mut config = self.config.clone();
        config.cluster_url = server.parse().map_err(|_| K8sError::ServerUrl {
            url: server.to_string(),
        })?;
        config.connect_timeout = Some(METRICS_CONNECT_TIMEOUT);
        config.read_timeout = Some(METRICS_READ_TIMEOUT);
        ::kube::Client::try_from(config).map_err(|err| K8sError::ClientBuild {
            cluster_url: server.to_string(),
            err: Box::new(err),
        })
    }

    /// Every kube-apiserver's `address:port` the `kubernetes` EndpointSlices of `default`
    /// publish (kubernetes `pkg/controlplane/reconcilers/endpointsadapter.go`: the
    /// apiservers' endpoint reconciler keeps one endpoint per live apiserver there, with its
    /// advertise address and secure port), sorted.
    pub(super) async fn published_apiservers(&self) -> Result<Vec<(String, u16)>, K8sError> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), "default");
        let params = ListParams::default().labels("kubernetes.io/service-name=kubernetes");
        let slices = self
            .call(
                "list the kubernetes EndpointSlices",
                self.cluster_url(),
                || api.list(&params),
            )
            .await?;
        let mut out = Vec::new();
        for slice in slices.items {
            let Some(port) = slice
                .ports
                .as_ref()
                .and_then(|ports| ports.iter().find_map(|p| p.port))
                .and_then(|p| u16::try_from(p).ok())
            else {
                continue;
            };
            for endpoint in &slice.endpoints {
                if endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                out.extend(endpoint.addresses.iter().map(|a| (a.clone(), port)));
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    pub(super) async fn scrape_metrics(&self, server: Option<&str>) -> Result<String, K8sError> {
        let (client, target) = match server {
            Some(s) => (self.for_server(s)?, s.to_string()),
            None => (self.client.clone(), self.cluster_url().to_string()),
        };
        let request = hyper::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|_| K8sError::ServerUrl {
                url: target.clone(),
            })?;
        // one attempt: a refresh comes again soon
        client
            .request_text(request)
            .await
            .map_err(api_err("get /metrics", target))
    }

    pub(super) async fn preferred_versions(&self) -> Result<BTreeMap<String, String>, K8sError> {
        let groups = self
            .call("list API groups", self.cluster_url(), || {
                self.client.list_api_groups()
            })
            .await?;
        Ok(groups
            .groups
            .into_iter()
            .filter_map(|g| {
                let v = g
                    .preferred_version
                    .map(|p| p.version)
                    .or_else(|| g.versions.first().map(|v| v.version.clone()))?;
                Some((g.name, v))
            })
            .collect())
    }

    pub(super) async fn resources_of(
        &self,
        group: &str,
        version: &str,
    ) -> Result<Vec<ServedResource>, K8sError> {
        let gv = format!("{group}/{version}");
        let list = self
            .call("list API resources", &gv, || {
                self.client.list_api_group_resources(&gv)
            })
            .await?;
        Ok(list
            .resources
            .into_iter()
            .filter(|r| !r.name.contains('/'))
            .map(|r| ServedResource {
                listable: r.verbs.iter().any(|v| v == "list"),
                plural: r.name,
                kind: r.kind,
                namespaced: r.namespaced,
            })
            .collect())
    }

    pub(super) async fn writers_of(
        &self,
        group: &str,
        version: &str,
        resource: &ServedResource,
    ) -> Result<Vec<ObjectWriters>, K8sError> {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, &resource.kind),
            &resource.plural,
        );
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        let target = format!("{}.{version}.{group}", resource.plural);
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut params = ListParams::default().limit(PAGE);
            if let Some(t) = &token {
                params = params.continue_token(t);
            }
            let page = self
                .call("list object metadata", &target, || {
                    api.list_metadata(&params)
                })
                .await?;
            for o in page.items {
                let m = o.metadata;
                out.push(ObjectWriters {
                    namespace: m.namespace.unwrap_or_default(),
                    name: m.name.unwrap_or_default(),
                    annotations: m.annotations.unwrap_or_default(),
                    writers: m
                        .managed_fields
                        .unwrap_or_default()
                        .into_iter()
                        .map(|e| FieldWriter {
                            manager: e.manager.unwrap_or_default(),
                            operation: e.operation.unwrap_or_default(),
                            api_version: e.api_version.unwrap_or_default(),
                            subresource: e.subresource.unwrap_or_default(),
                        })
                        .collect(),
                });
            }
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                break;
            }
        }
        Ok(out)
    }

    pub(super) async fn names_of(
        &self,
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
    ) -> Result<Option<AlphaList>, K8sError> {
        let ar =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        let target = format!("{plural}.{version}.{group}");
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut params = ListParams::default().limit(PAGE);
            if let Some(t) = &token {
                params = params.continue_token(t);
            }
            let page = match self
                .call("list objects", &target, || api.list(&params))
                .await
            {
                Ok(p) => p,
                Err(K8sError::Api { err, .. }) if super::client::is_status(&err, 404) => {
                    return Ok(None);
                }
                Err(e) => return Err(e),
            };
            for o in page.items {
                let m = o.metadata;
                let name = m.name.unwrap_or_default();
                out.push(match m.namespace {
                    Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
                    _ => name,
                });
            }
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                break;
            }
        }
        out.sort();
        Ok(Some(out))
    }

    pub(super) async fn pdb_coverage(&self) -> Result<Vec<PdbCoverage>, K8sError> {
        let pdb_api: Api<PodDisruptionBudget> = Api::all(self.client.clone());
        let pod_api: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default();
        let pdbs = self
            .call("list PodDisruptionBudgets", self.cluster_url(), || {
                pdb_api.list(&params)
            })
            .await?;
        if pdbs.items.is_empty() {
            return Ok(Vec::new());
        }
        let pods = self
            .call("list pods", self.cluster_url(), || pod_api.list(&params))
            .await?;
        let mut out: Vec<PdbCoverage> = pdbs
            .items
            .iter()
            .map(|pdb| {
                let ns = pdb.metadata.namespace.clone().unwrap_or_default();
                let selector_ = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
                let mut covered: Vec<(String, String)> = pods
                    .items
                    .iter()
                    .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
                    .filter(|p| {
                        selector::selects(
                            selector_,
                            p.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
                        )
                    })
                    .map(|p| {
                        (
                            p.metadata.name.clone().unwrap_or_default(),
                            p.spec
                                .as_ref()
                                .and_then(|s| s.node_name.clone())
                                .unwrap_or_default(),
                        )
                    })
                    .collect();
                covered.sort();
                let disruptions_allowed = pdb
                    .status
                    .as_ref()
                    .map(|s| i64::from(s.disruptions_allowed))
                    .unwrap_or(0);
                // pods are only needed (and only kept) while the budget allows nothing: pod
                // names change with every rollout of a workload, and each change of an
                // observation makes the plans computed before it stale
                if disruptions_allowed > 0 {
                    covered.clear();
                }
                PdbCoverage {
                    namespace: ns,
                    name: pdb.metadata.name.clone().unwrap_or_default(),
                    disruptions_allowed,
                    pods: covered,
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Ok(out)
    }
}

/// The series of `apiserver_requested_deprecated_apis` with value 1 in a Prometheus text
/// exposition (format 0.0.4: `name{label="value",…} value`, `\\`, `\"` and `\n` escaped in
/// values; other metrics, comments and malformed lines are skipped).
pub fn deprecated_series(text: &str) -> Vec<DeprecatedSeries> {
    const NAME: &str = "apiserver_requested_deprecated_apis";
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(NAME) else {
            continue;
        };
        let Some(rest) = rest.strip_prefix('{') else {
            continue;
        };
        let Some((labels, value)) = parse_labels(rest) else {
            continue;
        };
        let value = value.split_whitespace().next().unwrap_or("");
        if value.parse::<f64>().ok() != Some(1.0) {
            continue;
        }
        let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
        out.push(DeprecatedSeries {
            group: get("group"),
            version: get("version"),
            resource: get("resource"),
            subresource: get("subresource"),
            removed_release: get("removed_release"),
        });
    }
    out.sort();
    out.dedup();
    out
}

/// `process_start_time_seconds` in a Prometheus text exposition, as Unix seconds: when the
/// process (here the kube-apiserver) started. client_golang's process collector writes it as
/// a float without labels (`process_start_time_seconds 1.7331e+09`); `None` when absent or
/// malformed.
pub fn process_start_time(text: &str) -> Option<i64> {
    const NAME: &str = "process_start_time_seconds";
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(NAME)?;
        let rest = rest.strip_prefix("{}").unwrap_or(rest);
        if !rest.starts_with(' ') {
            return None;
        }
        let v: f64 = rest.split_whitespace().next()?.parse().ok()?;
        #[allow(
            clippy::cast_possible_truncation,
            reason = "a start time in seconds since 1970 is far inside i64; fractions are dropped"
        )]
        (v.is_finite() && v > 0.0).then_some(v as i64)
    })
}

/// `a="x",b="y"} rest` → the labels and `rest`.
fn parse_labels(s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    let mut chars = s.char_indices().peekable();
    loop {
        while chars.peek().is_some_and(|(_, c)| *c == ',' || *c == ' ') {
            chars.next();
        }
        let (i, c) = chars.next()?;
        if c == '}' {
            return Some((labels, &s[i + 1..]));
        }
        let mut name = String::from(c);
        loop {
            let (_, c) = chars.next()?;
            if c == '=' {
                break;
            }
            name.push(c);
        }
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()?.1 {
                '"' => break,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        }
        labels.insert(name.trim().to_string(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deprecated_series_are_read_from_the_exposition() {
        let text = "# HELP apiserver_requested_deprecated_apis [STABLE] Gauge of deprecated APIs\n\
# TYPE apiserver_requested_deprecated_apis gauge\n\
apiserver_requested_deprecated_apis{group=\"flowcontrol.apiserver.k8s.io\",removed_release=\"1.32\",resource=\"flowschemas\",subresource=\"\",version=\"v1beta3\"} 1\n\
apiserver_requested_deprecated_apis{group=\"\",removed_release=\"\",resource=\"widgets\",subresource=\"status\",version=\"v1\"} 0\n\
apiserver_requested_deprecated_apis{group=\"x.io\",removed_release=\"\",resource=\"a\\\"b\",subresource=\"\",version=\"v2\"} 1\n\
apiserver_requested_deprecated_apis_total 3\n\
apiserver_requested_deprecated_apis{broken\n\
kubernetes_build_info{git_version=\"v1.31.2\"} 1\n";
        let s = deprecated_series(text);
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[0].group, "flowcontrol.apiserver.k8s.io");
        assert_eq!(s[0].version, "v1beta3");
        assert_eq!(s[0].resource, "flowschemas");
        assert_eq!(s[0].removed_release, "1.32");
        assert_eq!(s[1].resource, "a\"b");
    }

    #[test]
    fn the_process_start_time_is_read_from_the_exposition() {
        let text = "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n\
# TYPE process_start_time_seconds gauge\n\
process_start_time_seconds_total 4\n\
process_start_time_seconds 1.73310544232e+09\n";
        assert_eq!(process_start_time(text), Some(1_733_105_442));
        assert_eq!(
            process_start_time("process_start_time_seconds{} 12\n"),
            Some(12)
        );
        assert_eq!(process_start_time("kubernetes_build_info 1\n"), None);
        assert_eq!(process_start_time("process_start_time_seconds NaN\n"), None);
    }
}
