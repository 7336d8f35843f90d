//! Gathering the preflight observations of a cluster (issue #22): what the planner's preflight
//! checks read, collected by every observation of a live cluster (`medea seed`, the refresh
//! loop, `medea doctor`).
//!
//! Sources, and what each costs per refresh (N control-plane nodes, R resources of the removal
//! table still served, G their API groups):
//! - the `apiserver_requested_deprecated_apis` gauge: `GET /metrics` of each control-plane
//!   node's kube-apiserver, at its InternalIP and the port the cluster publishes in the
//!   `kubernetes` EndpointSlice of `default` (one list; an address there that is no
//!   control-plane node's is never dialed, and an apiserver that is down has left the slice
//!   and shows as unreachable); when the slice cannot be read, `https://<InternalIP>:6443`
//!   (Talos' default `localAPIServerPort`).
//!   N requests in parallel, the kubeconfig's credentials and CA; only when none answers, the
//!   kubeconfig's endpoint (one more). Every endpoint's outcome is recorded, so a 403 or an
//!   unreachable node is visible.
//! - `metadata.managedFields`: `GET /apis` (1), each group's preferred version resource list
//!   (G), one metadata-only list per resource (R, paged by 500). Never through a deprecated
//!   version (that request would itself set the gauge).
//! - PodDisruptionBudgets: one list of PDBs, one list of pods (skipped when there are no PDBs).
//! - etcd through Talos: `EtcdStatus` and `EtcdAlarmList` of each control-plane node, one
//!   `EtcdMemberList` (2N + 1 calls).
//! - node pressure: from the Node list the refresh reads anyway (no request).
//! - credential expiry: the talosconfig's and kubeconfig's client certificates (local files).
//!
//! Everything is sorted and carries no timestamps of its own, so a refresh that sees the same
//! cluster produces the same observations and the generation does not move.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::api_lifecycle::{self, ApiLifecycle, Minor};
use crate::inventory::preflight::{
    AlphaObjects, CredentialExpiry, DeprecatedApiRequest, EtcdAlarmObservation,
    EtcdMemberObservation, EtcdObservation, ManagedFieldsUse, MetricsSource, ObservedPdb, PdbPod,
    PreflightObservations,
};
use crate::k8s::observe::{deprecated_series, process_start_time};
use crate::k8s::{ClusterNode, K8sError, KubeApi, ObjectWriters};
use crate::talos::{NodeTarget, TalosApi, TalosConfig, TalosError};
use crate::version::KubeVersion;

/// The kube-apiserver's port on a control-plane node when the cluster does not publish one
/// (Talos' default `cluster.localAPIServerPort`).
pub const APISERVER_PORT: u16 = 6443;

/// Field managers whose managedFields entries are the control plane's own bookkeeping, not a
/// client still using an old version: the apiserver's API Priority and Fairness configuration
/// writer (kubernetes `pkg/registry/flowcontrol/ensurer/strategy.go`) keeps stale entries of
/// versions it no longer writes on the objects it maintains.
const NOISE_MANAGERS: &[&str] = &[
    "api-priority-and-fairness-config-producer-v1",
    "kube-apiserver",
    "kube-controller-manager",
];

/// Keys of [`PreflightObservations::gather_errors`].
pub const MANAGED_FIELDS: &str = "managedFields";
pub const PDBS: &str = "podDisruptionBudgets";
pub const REMOVED_ALPHA: &str = "removedAlphaObjects";

/// How many object names of a removed alpha resource the observation keeps as examples.
const ALPHA_EXAMPLES: usize = 5;
pub const TALOSCONFIG: &str = "credentials/talosconfig";
pub const KUBECONFIG: &str = "credentials/kubeconfig";

/// Where a cluster's credentials are (their client certificates' expiry is read from them).
#[derive(Debug, Clone, Copy)]
pub struct CredentialFiles<'a> {
    pub talosconfig: &'a Path,
    pub kubeconfig: &'a Path,
}

/// Gather everything, concurrently. `nodes` is the Node list the observation already read;
/// `kubernetes` the cluster's (lowest) version, which decides which table rows are still
/// served. Never fails: what could not be read is recorded as such.
pub async fn gather<T: TalosApi, K: KubeApi>(
    talos: &T,
    kube: &K,
    cluster: &str,
    nodes: &[ClusterNode],
    kubernetes: Option<&KubeVersion>,
    credentials: Option<CredentialFiles<'_>>,
) -> PreflightObservations {
    let minor = kubernetes.map(KubeVersion::minor_line);
    let ((requests, sources), managed, pdbs, etcd, alpha) = futures::join!(
        deprecated_requests(kube, nodes),
        managed_fields(kube, minor),
        disruption_budgets(kube),
        etcd(talos, nodes),
        removed_alpha_objects(kube, minor),
    );
    let mut obs = PreflightObservations {
        gathered: true,
        deprecated_api_requests: requests,
        apiserver_metrics: sources,
        etcd,
        node_pressure: nodes
            .iter()
            .filter(|n| !n.pressure.is_empty())
            .map(|n| (n.name.clone(), n.pressure.clone()))
            .collect(),
        ..PreflightObservations::default()
    };
    match managed {
        Ok(m) => obs.managed_fields = m,
        Err(e) => {
            obs.gather_errors.insert(MANAGED_FIELDS.into(), e);
        }
    }
    match alpha {
        Ok(a) => obs.removed_alpha_objects = a,
        Err(e) => {
            obs.gather_errors.insert(REMOVED_ALPHA.into(), e);
        }
    }
    match pdbs {
        Ok(p) => obs.pod_disruption_budgets = p,
        Err(e) => {
            obs.gather_errors.insert(PDBS.into(), e);
        }
    }
    if let Some(files) = credentials {
        credential_expiry(files, &mut obs);
    }
    for (source, error) in &obs.gather_errors {
        tracing::warn!(
            cluster,
            source,
            error,
            "preflight observation could not be gathered"
        );
    }
    obs
}

/// A stable, actionable class of a failed `/metrics` read. The whole chain goes to the log of
/// the process that gathered the observation (the daemon's refresh, or `medea seed`), so the
/// class names that log rather than "the daemon log": a plan made offline from a seeded
/// store has no daemon.
fn metrics_failure(chain: &str) -> &'static str {
    let has = |needle: &str| chain.contains(needle);
    if has("403") || has("Forbidden") {
        "forbidden (HTTP 403): grant get on the nonResourceURL /metrics"
    } else if has("401") || has("Unauthorized") {
        "unauthorized (HTTP 401): the kubeconfig's credentials were refused"
    } else if [
        "certificate",
        "Certificate",
        "tls",
        "TLS",
        "timed out",
        "Timeout",
        "timeout",
        "elapsed",
        "Connect",
        "connect",
        "refused",
        "unreachable",
    ]
    .iter()
    .any(|n| has(n))
    {
        // One class: which of these a network gives (refused, blackholed, intercepted) varies
        // by where medea runs, and the finding's text is part of the plan id.
        "not reachable (connection, TLS or timeout; the cause is logged as `apiserver /metrics could not be read` by the command that refreshed the inventory: `medea serve` or `medea seed`)"
    } else {
        "the request failed (the cause is logged as `apiserver /metrics could not be read` by the command that refreshed the inventory: `medea serve` or `medea seed`)"
    }
}

fn one_line(e: &dyn std::error::Error) -> String {
    crate::error_chain(e).replace('\n', " ")
}

/// `https://<address>:6443`, brackets around an IPv6 address.
pub fn apiserver_endpoint(address: &str) -> String {
    apiserver_endpoint_at(address, APISERVER_PORT)
}

/// `https://<address>:<port>`, brackets around an IPv6 address.
pub fn apiserver_endpoint_at(address: &str, port: u16) -> String {
    if address.contains(':') {
        format!("https://[{address}]:{port}")
    } else {
        format!("https://{address}:{port}")
    }
}

/// Where each kube-apiserver is: every control-plane node's InternalIP, at the port the
/// cluster publishes for it (6443 when nothing is published for the control plane or the list
/// cannot be read).
///
/// Only control-plane nodes' addresses are dialed: the EndpointSlice is an object that
/// others than the apiservers may be allowed to write, and medea sends its kubeconfig's
/// credentials with every scrape, so a published address that is no control-plane node's is
/// ignored; the slice contributes the port.
pub fn apiserver_endpoints(
    published: Option<&[(String, u16)]>,
    nodes: &[ClusterNode],
) -> BTreeSet<String> {
    let published = published.unwrap_or_default();
    let control_planes: Vec<&str> = nodes
        .iter()
        .filter(|n| n.control_plane)
        .filter_map(|n| n.internal_ip())
        .collect();
    let port = published
        .iter()
        .find(|(a, _)| control_planes.contains(&a.as_str()))
        .map(|(_, p)| *p)
        .unwrap_or(APISERVER_PORT);
    control_planes
        .iter()
        .map(|a| {
            let own = published.iter().find(|(p, _)| p == a).map(|(_, p)| *p);
            apiserver_endpoint_at(a, own.unwrap_or(port))
        })
        .collect()
}

async fn deprecated_requests<K: KubeApi>(
    kube: &K,
    nodes: &[ClusterNode],
) -> (Vec<DeprecatedApiRequest>, Vec<MetricsSource>) {
    let published = match kube.published_apiservers().await {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::debug!(error = %one_line(&e), "the kubernetes EndpointSlice could not be read; assuming port {APISERVER_PORT}");
            None
        }
    };
    let endpoints = apiserver_endpoints(published.as_deref(), nodes);
    let scrapes: Vec<_> = endpoints
        .iter()
        .map(|e| async move { (e.clone(), kube.apiserver_metrics(Some(e)).await) })
        .collect();
    let mut answers = futures::future::join_all(scrapes).await;
    let server = kube.server_url();
    if answers.iter().all(|(_, r)| r.is_err()) && !endpoints.contains(&server) {
        answers.push((server, kube.apiserver_metrics(None).await));
    }
    let mut requests = Vec::new();
    let mut sources = Vec::new();
    for (endpoint, result) in answers {
        match result {
            Ok(text) => {
                requests.extend(deprecated_series(&text).into_iter().map(|s| {
                    DeprecatedApiRequest {
                        group: s.group,
                        version: s.version,
                        resource: s.resource,
                        subresource: s.subresource,
                        removed_release: s.removed_release,
                        source: endpoint.clone(),
                    }
                }));
                sources.push(MetricsSource {
                    started: process_start_time(&text),
                    endpoint,
                    error: None,
                });
            }
            Err(e) => {
                // The full chain goes to the log; the observation keeps a stable class of
                // failure, so a flapping error text does not move the generation (and make
                // every plan stale) while the endpoint stays unreadable.
                tracing::warn!(%endpoint, error = %one_line(&e), "apiserver /metrics could not be read");
                sources.push(MetricsSource {
                    error: Some(metrics_failure(&one_line(&e)).to_string()),
                    endpoint,
                    started: None,
                })
            }
        }
    }
    requests.sort();
    sources.sort();
    (requests, sources)
}

/// The table rows a cluster of `minor` still serves (all of them when the minor is unknown).
fn live_rows(minor: Option<Minor>) -> Vec<ApiLifecycle> {
    api_lifecycle::builtin()
        .into_iter()
        .filter(|r| minor.is_none_or(|m| r.served_in(m)))
        .collect()
}

async fn managed_fields<K: KubeApi>(
    kube: &K,
    minor: Option<Minor>,
) -> Result<Vec<ManagedFieldsUse>, String> {
    let table = api_lifecycle::builtin();
    let rows = live_rows(minor);
    let preferred = kube.preferred_versions().await.map_err(|e| one_line(&e))?;
    // group → resources of the table in it
    let mut wanted: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for r in &rows {
        wanted
            .entry(r.group.as_str())
            .or_default()
            .insert(r.resource.as_str());
    }
    let mut out = Vec::new();
    for (group, plurals) in wanted {
        let Some(version) = preferred.get(group) else {
            continue;
        };
        let served = kube
            .served_resources(group, version)
            .await
            .map_err(|e| one_line(&e))?;
        for res in served
            .iter()
            .filter(|r| r.listable && plurals.contains(r.plural.as_str()))
        {
            // listing a deprecated version would itself count as a deprecated request
            if api_lifecycle::lookup(&table, group, version, &res.plural).is_some() {
                continue;
            }
            let objects = kube
                .object_writers(group, version, res)
                .await
                .map_err(|e| one_line(&e))?;
            out.extend(uses_of(&table, group, &res.plural, &objects));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The managedFields entries of `objects` (of `group`/`plural`) written through a version of
/// the table, without the control plane's own entries and status writers.
pub fn uses_of(
    table: &[ApiLifecycle],
    group: &str,
    plural: &str,
    objects: &[ObjectWriters],
) -> Vec<ManagedFieldsUse> {
    let mut out = Vec::new();
    for o in objects {
        for w in &o.writers {
            if !w.subresource.is_empty() || NOISE_MANAGERS.contains(&w.manager.as_str()) {
                continue;
            }
            let (g, v) = w
                .api_version
                .rsplit_once('/')
                .unwrap_or(("", &w.api_version));
            if g != group {
                continue;
            }
            let Some(row) = api_lifecycle::lookup(table, g, v, plural) else {
                continue;
            };
            out.push(ManagedFieldsUse {
                api_version: w.api_version.clone(),
                resource: plural.to_string(),
                kind: row.kind.clone(),
                namespace: o.namespace.clone(),
                name: o.name.clone(),
                manager: w.manager.clone(),
                operation: w.operation.clone(),
            });
        }
    }
    out
}

/// Objects of the alpha resources a later minor removes (go-kubernetes
/// `PopulateRemovedAPIResources`: a plain list of each, 404 meaning not served): only the
/// resources a cluster of `minor` could still serve (all when the minor is unknown), one list
/// each.
async fn removed_alpha_objects<K: KubeApi>(
    kube: &K,
    minor: Option<Minor>,
) -> Result<Vec<AlphaObjects>, String> {
    let mut out = Vec::new();
    for r in api_lifecycle::REMOVED_ALPHA
        .iter()
        .filter(|r| minor.is_none_or(|m| m < r.removed))
    {
        let Some(names) = kube
            .list_names(r.group, r.version, r.resource, r.kind)
            .await
            .map_err(|e| one_line(&e))?
        else {
            continue;
        };
        if names.is_empty() {
            continue;
        }
        out.push(AlphaObjects {
            resource: r.resource_arg(),
            count: u64::try_from(names.len()).unwrap_or(u64::MAX),
            examples: names.into_iter().take(ALPHA_EXAMPLES).collect(),
        });
    }
    out.sort();
    Ok(out)
}

async fn disruption_budgets<K: KubeApi>(kube: &K) -> Result<Vec<ObservedPdb>, String> {
    let pdbs = kube
        .disruption_budgets()
        .await
        .map_err(|e: K8sError| one_line(&e))?;
    Ok(pdbs
        .into_iter()
        .map(|p| ObservedPdb {
            namespace: p.namespace,
            name: p.name,
            disruptions_allowed: p.disruptions_allowed,
            pods: p
                .pods
                .into_iter()
                .map(|(name, node)| PdbPod { name, node })
                .collect(),
        })
        .collect())
}

/// What one control-plane node said about etcd.
enum EtcdAnswer {
    /// The node is not a control plane after all (`Unimplemented`).
    NotControlPlane,
    Failed(String),
    Answered {
        member_id: u64,
        healthy: bool,
        learner: bool,
        alarms: Vec<crate::talos::EtcdAlarm>,
    },
}

async fn etcd_of<T: TalosApi>(talos: &T, target: &NodeTarget) -> EtcdAnswer {
    let not_cp = |e: &TalosError| e.code() == Some(tonic::Code::Unimplemented);
    let (status, alarms) = futures::join!(talos.etcd_status(target), talos.etcd_alarms(target));
    match (status, alarms) {
        (Err(e), _) | (_, Err(e)) if not_cp(&e) => EtcdAnswer::NotControlPlane,
        (Err(e), _) | (_, Err(e)) => EtcdAnswer::Failed(one_line(&e)),
        (Ok(s), Ok(alarms)) => EtcdAnswer::Answered {
            member_id: s.member_id,
            healthy: s.errors.is_empty() && s.leader != 0,
            learner: s.is_learner,
            alarms,
        },
    }
}

async fn etcd<T: TalosApi>(talos: &T, nodes: &[ClusterNode]) -> Option<EtcdObservation> {
    let cps: Vec<(&str, Result<NodeTarget, String>)> = nodes
        .iter()
        .filter(|n| n.control_plane)
        .map(|n| {
            let address = n.internal_ip().unwrap_or(&n.name);
            (
                n.name.as_str(),
                NodeTarget::parse(address).map_err(|e| one_line(&e)),
            )
        })
        .collect();
    if cps.is_empty() {
        return None;
    }
    let asks: Vec<_> = cps
        .iter()
        .map(|(name, target)| async move {
            let answer = match target {
                Ok(t) => etcd_of(talos, t).await,
                Err(e) => EtcdAnswer::Failed(e.clone()),
            };
            (*name, target.as_ref().ok(), answer)
        })
        .collect();
    let answers = futures::future::join_all(asks).await;
    let mut obs = EtcdObservation::default();
    let mut statuses: BTreeMap<u64, (bool, bool)> = BTreeMap::new();
    let mut alarms = BTreeSet::new();
    let mut asked: Vec<&NodeTarget> = Vec::new();
    for (name, target, answer) in &answers {
        match answer {
            EtcdAnswer::NotControlPlane => {}
            EtcdAnswer::Failed(e) => {
                obs.unreachable.insert((*name).to_string(), e.clone());
            }
            EtcdAnswer::Answered {
                member_id,
                healthy,
                learner,
                alarms: a,
            } => {
                statuses.insert(*member_id, (*healthy, *learner));
                alarms.extend(a.iter().cloned());
                if let Some(t) = target {
                    asked.push(t);
                }
            }
        }
    }
    // the member list, from the first node that answered (it is cluster-wide)
    let mut members = None;
    for t in asked {
        match talos.etcd_members(t).await {
            Ok(m) => {
                members = Some(m);
                break;
            }
            Err(e) => {
                tracing::info!(node = %t, error = %one_line(&e), "EtcdMemberList failed; asking the next control plane");
            }
        }
    }
    obs.members = members
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            let (healthy, learner) = statuses.get(&m.id).copied().unwrap_or((false, false));
            EtcdMemberObservation {
                id: format!("{:x}", m.id),
                name: m.hostname,
                learner: learner || m.is_learner,
                healthy,
            }
        })
        .collect();
    obs.members.sort();
    obs.alarms = alarms
        .into_iter()
        .map(|a| EtcdAlarmObservation {
            member: format!("{:x}", a.member_id),
            alarm: a.alarm,
        })
        .collect();
    obs.alarms.sort();
    if obs.members.is_empty() && obs.unreachable.is_empty() && obs.alarms.is_empty() {
        // every "control plane" turned out not to be one
        return None;
    }
    Some(obs)
}

/// `notAfter` of a PEM certificate, RFC 3339 UTC.
fn not_after(pem: &str) -> Result<String, String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| format!("not a PEM certificate: {e}"))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let ts = jiff::Timestamp::from_second(cert.validity().not_after.timestamp())
        .map_err(|e| format!("notAfter is out of range: {e}"))?;
    Ok(ts.to_string())
}

fn credential_expiry(files: CredentialFiles<'_>, obs: &mut PreflightObservations) {
    let talos = TalosConfig::load(files.talosconfig)
        .and_then(|c| c.context(None))
        .map_err(|e| one_line(&e))
        .and_then(|ctx| not_after(&ctx.crt_pem));
    match talos {
        Ok(t) => obs.credentials.push(CredentialExpiry {
            credential: "talosconfig client certificate".into(),
            not_after: t,
        }),
        Err(e) => {
            obs.gather_errors.insert(TALOSCONFIG.into(), e);
        }
    }
    match crate::k8s::kubeconfig::client_certificate_pem(files.kubeconfig) {
        Ok(Some(pem)) => match not_after(&pem) {
            Ok(t) => obs.credentials.push(CredentialExpiry {
                credential: "kubeconfig client certificate".into(),
                not_after: t,
            }),
            Err(e) => {
                obs.gather_errors.insert(KUBECONFIG.into(), e);
            }
        },
        // a token or an exec plugin: its expiry cannot be read without using it
        Ok(None) => {}
        Err(e) => {
            obs.gather_errors.insert(KUBECONFIG.into(), one_line(&e));
        }
    }
    obs.credentials.sort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_failures_are_stable_classes() {
        assert!(
            metrics_failure("get /metrics: ApiError: forbidden (403)").starts_with("forbidden")
        );
        for e in [
            "client error (Connect): invalid peer certificate: UnknownIssuer",
            "client error (Connect): tcp connect error: Connection refused",
            "operation timed out",
        ] {
            assert!(metrics_failure(e).starts_with("not reachable"), "{e}");
        }
        // a plan made offline has no daemon: the class never sends the reader to its log
        for e in ["something else", "connection refused", "403"] {
            let class = metrics_failure(e);
            assert!(!class.contains("daemon log"), "{class}");
        }
        assert!(metrics_failure("something else").contains("`medea serve` or `medea seed`"));
    }

    fn node(name: &str, address: &str, control_plane: bool) -> ClusterNode {
        ClusterNode {
            name: name.into(),
            addresses: vec![crate::k8s::NodeAddress {
                kind: "InternalIP".into(),
                address: address.into(),
            }],
            labels: Default::default(),
            annotations: Default::default(),
            control_plane,
            ready: true,
            pressure: Vec::new(),
            unschedulable: false,
            taints: Vec::new(),
            kubelet_version: None,
            kubelet_version_raw: String::new(),
            boot_id: String::new(),
            machine_id: String::new(),
            os_image: String::new(),
        }
    }

    #[test]
    fn apiservers_are_where_the_cluster_publishes_them_and_every_control_plane_is_asked() {
        let nodes = [
            node("cp-1", "127.5.0.2", true),
            node("cp-2", "127.5.0.3", true),
            node("w-1", "127.5.0.5", false),
        ];
        // cp-2's apiserver is down, so it left the slice: it is still asked, at the same port
        let published = [("127.5.0.2".to_string(), 7443)];
        let endpoints: Vec<String> = apiserver_endpoints(Some(&published), &nodes)
            .into_iter()
            .collect();
        assert_eq!(
            endpoints,
            ["https://127.5.0.2:7443", "https://127.5.0.3:7443"]
        );
        // nothing published (or the list was refused): Talos' default port
        let endpoints: Vec<String> = apiserver_endpoints(None, &nodes).into_iter().collect();
        assert_eq!(
            endpoints,
            ["https://127.5.0.2:6443", "https://127.5.0.3:6443"]
        );
        // an address that is no control-plane node's is never dialed (the slice can be written
        // by others than the apiservers, and the scrape carries medea's credentials); a port
        // published only for such an address is not taken either
        let published = [("10.9.9.9".to_string(), 7443)];
        let endpoints: Vec<String> = apiserver_endpoints(Some(&published), &nodes)
            .into_iter()
            .collect();
        assert_eq!(
            endpoints,
            ["https://127.5.0.2:6443", "https://127.5.0.3:6443"]
        );
    }
    use crate::k8s::FieldWriter;

    fn writer(manager: &str, api_version: &str, sub: &str) -> FieldWriter {
        FieldWriter {
            manager: manager.into(),
            operation: "Update".into(),
            api_version: api_version.into(),
            subresource: sub.into(),
        }
    }

    #[test]
    fn managed_fields_noise_is_filtered() {
        let table = api_lifecycle::builtin();
        let objects = vec![
            ObjectWriters {
                namespace: String::new(),
                name: "legacy".into(),
                annotations: BTreeMap::new(),
                writers: vec![
                    writer(
                        "kubectl-client-side-apply",
                        "flowcontrol.apiserver.k8s.io/v1beta3",
                        "",
                    ),
                    writer("helm", "flowcontrol.apiserver.k8s.io/v1", ""),
                    writer("kubectl", "flowcontrol.apiserver.k8s.io/v1beta3", "status"),
                ],
            },
            ObjectWriters {
                namespace: String::new(),
                name: "catch-all".into(),
                annotations: BTreeMap::from([(
                    "apf.kubernetes.io/autoupdate-spec".into(),
                    "true".into(),
                )]),
                writers: vec![writer(
                    "api-priority-and-fairness-config-producer-v1",
                    "flowcontrol.apiserver.k8s.io/v1beta2",
                    "",
                )],
            },
        ];
        let uses = uses_of(
            &table,
            "flowcontrol.apiserver.k8s.io",
            "flowschemas",
            &objects,
        );
        assert_eq!(uses.len(), 1, "{uses:?}");
        assert_eq!(uses[0].name, "legacy");
        assert_eq!(uses[0].manager, "kubectl-client-side-apply");
        assert_eq!(uses[0].kind, "FlowSchema");
        assert_eq!(uses[0].api_version, "flowcontrol.apiserver.k8s.io/v1beta3");
    }

    #[test]
    fn endpoints_bracket_ipv6() {
        assert_eq!(apiserver_endpoint("10.5.0.2"), "https://10.5.0.2:6443");
        assert_eq!(apiserver_endpoint("fd00::2"), "https://[fd00::2]:6443");
    }

    #[test]
    fn only_rows_still_served_are_inspected() {
        let rows = live_rows(Some((1, 31)));
        assert!(rows.iter().all(|r| r.removed > (1, 31)));
        assert!(
            rows.iter()
                .any(|r| r.version == "v1beta3" && r.resource == "flowschemas")
        );
        assert!(
            !live_rows(Some((1, 32)))
                .iter()
                .any(|r| r.group == "flowcontrol.apiserver.k8s.io")
        );
    }
}
