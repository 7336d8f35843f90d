//! [`KubeClient`]: the [`KubeApi`] adapter over kube-rs. Converts k8s-openapi objects into
//! the domain types of this module and retries transient API failures with backoff.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use ::kube::api::{Api, DynamicObject, EvictParams, ListParams, Patch, PatchParams};
use ::kube::core::{ApiResource, GroupVersionKind};
use ::kube::discovery::{ApiCapabilities, Scope};
use backon::Retryable;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;

use super::drain::{self, DrainOps, DrainPod, Eviction};
use super::{
    AppliedObject, ApplyOptions, CONTROL_PLANE_LABEL, ClusterNode, ControlPlaneComponent,
    DrainOptions, DrainReport, K8sError, KubeApi, Manifest, NodeAddress, NodeReadiness,
    NodeTaintSpec, ObjectWriters, PdbCoverage, PodRef, ServedResource, StaticPodStatus, kubeconfig,
    selector, transient,
};
use crate::Locked as _;
use crate::rollout::ports::CORDONED_BY_ANNOTATION;
use crate::version::KubeVersion;

const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Node conditions that signal resource pressure (kubelet `pkg/kubelet/nodestatus/setters.go`).
const PRESSURE_CONDITIONS: &[&str] = &["DiskPressure", "MemoryPressure", "PIDPressure"];

/// Retries of individual API calls (not drains, which have their own timeout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts, including the first (at least 1).
    pub attempts: usize,
    pub min_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
        }
    }
}

/// How the client behaves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientOptions {
    pub retry: RetryPolicy,
    /// The bootstrap manifests sync's retries and waits.
    pub manifests: ManifestSyncOptions,
}

/// How the bootstrap manifests sync ([`KubeClient::sync_bootstrap_manifests`]) retries and
/// polls. The defaults are `talosctl upgrade-k8s`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestSyncOptions {
    /// How long an object whose kind is not served yet although a CRD of the same set defines
    /// it, or (legacy sync) whose update conflicts, is retried; also the bound of the wait for
    /// a stage's CRDs and Namespaces.
    /// go-kubernetes retries for 3 minutes (`ssa/apply.go` `Apply`, `manifests/sync.go`
    /// `Sync`: `retry.Constant(3*time.Minute, retry.WithUnits(10*time.Second))`).
    pub retry_for: Duration,
    /// Between those retries (go-kubernetes: 10 s).
    pub retry_interval: Duration,
    /// How often a wait polls the objects it waits for (fluxcd ssa `WaitInterval`, talosctl:
    /// 2 s).
    pub poll_interval: Duration,
    /// Which live objects the server-side sync may take over and prune (talosctl
    /// `--manifests-inventory-policy`, default `AdoptIfNoInventory`).
    pub inventory_policy: super::bootstrap::InventoryPolicy,
}

impl Default for ManifestSyncOptions {
    fn default() -> Self {
        ManifestSyncOptions {
            retry_for: Duration::from_secs(3 * 60),
            retry_interval: Duration::from_secs(10),
            poll_interval: Duration::from_secs(2),
            inventory_policy: super::bootstrap::InventoryPolicy::AdoptIfNoInventory,
        }
    }
}

/// The Kubernetes adapter for one cluster.
pub struct KubeClient {
    pub(super) client: ::kube::Client,
    /// What the client was built from: credentials and CA for other apiservers of the cluster
    /// (each control-plane node's `/metrics`).
    pub(super) config: ::kube::Config,
    cluster_url: String,
    pub(super) options: ClientOptions,
    discovered: Mutex<HashMap<(String, String), (ApiResource, ApiCapabilities)>>,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("cluster_url", &self.cluster_url)
            .finish_non_exhaustive()
    }
}

pub(super) fn api_err(
    op: &'static str,
    target: impl Into<String>,
) -> impl FnOnce(::kube::Error) -> K8sError {
    let target = target.into();
    move |err| K8sError::Api {
        op,
        target,
        err: Box::new(err),
    }
}

pub(super) fn is_status(err: &::kube::Error, code: u16) -> bool {
    matches!(err, ::kube::Error::Api(s) if s.code == code)
}

impl KubeClient {
    /// A client for the cluster in a kubeconfig file (its current context).
    pub async fn from_kubeconfig(
        path: &Path,
        options: ClientOptions,
    ) -> Result<KubeClient, K8sError> {
        let config = kubeconfig::load(path).await?;
        KubeClient::from_config(config, options)
    }

    /// A client for `<creds_dir>/kubeconfig`.
    pub async fn from_creds_dir(
        creds_dir: &Path,
        options: ClientOptions,
    ) -> Result<KubeClient, K8sError> {
        KubeClient::from_kubeconfig(&kubeconfig::path_in(creds_dir), options).await
    }

    /// A client from a kube-rs configuration.
    ///
    /// kube 5 enables a built-in tower retry layer by default (`Config::default_retry`) that
    /// retries 429/503/504 up to 15 times with delays growing to 1000 s. That would hide PDB
    /// refusals inside a single eviction call and defeat the drain timeout, so it is turned
    /// off: this adapter retries explicitly ([`RetryPolicy`], the drain backoff).
    pub fn from_config(
        mut config: ::kube::Config,
        options: ClientOptions,
    ) -> Result<KubeClient, K8sError> {
        config.default_retry = false;
        let cluster_url = config.cluster_url.to_string();
        let client =
            ::kube::Client::try_from(config.clone()).map_err(|err| K8sError::ClientBuild {
                cluster_url: cluster_url.clone(),
                err: Box::new(err),
            })?;
        Ok(KubeClient {
            client,
            config,
            cluster_url,
            options,
            discovered: Mutex::new(HashMap::new()),
        })
    }

    /// The apiserver URL.
    pub fn cluster_url(&self) -> &str {
        &self.cluster_url
    }

    /// Run `f`, retrying transient failures per the retry policy.
    pub(super) async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        target: &str,
        f: F,
    ) -> Result<T, K8sError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ::kube::Error>>,
    {
        let policy = &self.options.retry;
        let backoff = backon::ExponentialBuilder::default()
            .with_min_delay(policy.min_delay)
            .with_max_delay(policy.max_delay.max(policy.min_delay))
            .with_max_times(policy.attempts.saturating_sub(1));
        f.retry(backoff)
            .when(transient)
            .notify(|err, after| tracing::warn!(op, target, error = %err, ?after, "Kubernetes API call failed; retrying"))
            .await
            .map_err(api_err(op, target))
    }

    fn node_api(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// The `storage.k8s.io/v1` `VolumeAttachment`s whose `spec.nodeName` is `node`, as
    /// (name, `spec.source.persistentVolumeName`), sorted by name. Listed cluster-wide and
    /// filtered here: the apiserver offers no field selector on `spec.nodeName` (tuppr's
    /// `WaitForVolumeDetach` lists them the same way). Needs `list volumeattachments`.
    pub async fn volume_attachments(
        &self,
        node: &str,
    ) -> Result<Vec<(String, Option<String>)>, K8sError> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let params = ListParams::default();
        let list = self
            .call("list volumeattachments", node, || api.list(&params))
            .await?;
        let mut out: Vec<(String, Option<String>)> = list
            .items
            .into_iter()
            .filter(|va| va.spec.node_name == node)
            .map(|va| {
                (
                    va.metadata.name.unwrap_or_default(),
                    va.spec.source.persistent_volume_name,
                )
            })
            .collect();
        out.sort();
        Ok(out)
    }

    async fn node(&self, name: &str) -> Result<Node, K8sError> {
        let api = self.node_api();
        self.call("get node", name, || api.get_opt(name))
            .await?
            .ok_or_else(|| K8sError::NodeNotFound {
                node: name.to_string(),
            })
    }

    async fn set_unschedulable(&self, node: &str, cordon: bool) -> Result<(), K8sError> {
        let api = self.node_api();
        let op = if cordon {
            "cordon node"
        } else {
            "uncordon node"
        };
        let result = self
            .call(op, node, || async {
                if cordon {
                    api.cordon(node).await
                } else {
                    api.uncordon(node).await
                }
            })
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(K8sError::Api { err, .. }) if is_status(&err, 404) => Err(K8sError::NodeNotFound {
                node: node.to_string(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Cordon `node` for `owner` (`cordon`), or lift `owner`'s cordon (`!cordon`), in one merge
    /// patch of `spec.unschedulable` and the [`CORDONED_BY_ANNOTATION`] annotation that carries
    /// the node's `resourceVersion` (a concurrent writer makes it a 409: read again, retried).
    /// A cordon leaves a node that is cordoned already as it is (someone else's cordon is never
    /// claimed); an uncordon touches only a node whose annotation names `owner` (a node
    /// uncordoned by someone else meanwhile only loses the stale annotation). Issue #48 item 5.
    pub async fn set_cordon_of(
        &self,
        node: &str,
        owner: &str,
        cordon: bool,
    ) -> Result<(), K8sError> {
        let op = if cordon {
            "cordon node"
        } else {
            "uncordon node"
        };
        self.patch_node_read_modify_write(op, node, |current, rv| {
            let unschedulable = current
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false);
            let ours = current
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CORDONED_BY_ANNOTATION))
                .is_some_and(|v| v == owner);
            match (cordon, unschedulable, ours) {
                // cordoned already, by us or by someone else: nothing to do
                (true, true, _) => None,
                (true, false, _) => Some(serde_json::json!({
                    "metadata": {"resourceVersion": rv, "annotations": {CORDONED_BY_ANNOTATION: owner}},
                    "spec": {"unschedulable": true},
                })),
                // not ours: never lifted
                (false, _, false) => None,
                (false, true, true) => Some(serde_json::json!({
                    "metadata": {"resourceVersion": rv, "annotations": {CORDONED_BY_ANNOTATION: null}},
                    "spec": {"unschedulable": false},
                })),
                // uncordoned by someone else: only the stale annotation goes
                (false, false, true) => Some(serde_json::json!({
                    "metadata": {"resourceVersion": rv, "annotations": {CORDONED_BY_ANNOTATION: null}},
                })),
            }
        })
        .await
    }

    /// Read `node`, let `patch_of` choose the merge patch (given the node and its
    /// `resourceVersion`, which the patch carries; `None`: nothing to do) and apply it. A
    /// concurrent writer makes it a conflict (HTTP 409), read again and retried up to
    /// `TAINT_CONFLICT_RETRIES` times, never a lost update; a missing node is
    /// [`K8sError::NodeNotFound`].
    async fn patch_node_read_modify_write(
        &self,
        op: &'static str,
        node: &str,
        patch_of: impl Fn(&Node, &str) -> Option<serde_json::Value>,
    ) -> Result<(), K8sError> {
        let api = self.node_api();
        let not_found = || K8sError::NodeNotFound {
            node: node.to_string(),
        };
        let mut conflicts = 0;
        loop {
            let current = match self.node(node).await {
                Err(K8sError::Api { err, .. }) if is_status(&err, 404) => return Err(not_found()),
                r => r?,
            };
            let rv = current
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default();
            let Some(patch) = patch_of(&current, &rv) else {
                return Ok(());
            };
            let params = PatchParams::default();
            let result = self
                .call(op, node, || {
                    let (api, params, patch) = (&api, &params, &patch);
                    async move { api.patch(node, params, &Patch::Merge(patch)).await }
                })
                .await;
            match result {
                Ok(_) => return Ok(()),
                Err(K8sError::Api { err, .. })
                    if is_status(&err, 409) && conflicts < TAINT_CONFLICT_RETRIES =>
                {
                    conflicts += 1;
                }
                Err(K8sError::Api { err, .. }) if is_status(&err, 404) => return Err(not_found()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Add `taint` to `node` (`add`) or remove it (`!add`), touching no other taint: a taint
    /// with the same key and effect is never added twice nor changed (whatever its value), and
    /// only the taint with `taint`'s key, value and effect is removed. The new list is written
    /// with a merge patch that carries the node's `resourceVersion`, so a concurrent writer
    /// (the node lifecycle controller, an operator's `kubectl taint`) makes it a conflict
    /// (HTTP 409) that is read again and retried, never a lost update.
    pub async fn set_taint(
        &self,
        node: &str,
        taint: &NodeTaintSpec,
        add: bool,
    ) -> Result<(), K8sError> {
        let op = if add { "taint node" } else { "untaint node" };
        self.patch_node_read_modify_write(op, node, |current, rv| {
            let mut taints = current
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            let before = taints.len();
            if add {
                if taints
                    .iter()
                    .any(|t| t.key == taint.key && t.effect == taint.effect)
                {
                    return None;
                }
                taints.push(k8s_openapi::api::core::v1::Taint {
                    key: taint.key.clone(),
                    value: Some(taint.value.clone()).filter(|v| !v.is_empty()),
                    effect: taint.effect.clone(),
                    time_added: None,
                });
            } else {
                taints.retain(|t| {
                    !(t.key == taint.key
                        && t.effect == taint.effect
                        && t.value.as_deref().unwrap_or("") == taint.value)
                });
                if taints.len() == before {
                    return None;
                }
            }
            Some(serde_json::json!({
                "metadata": {"resourceVersion": rv},
                "spec": {"taints": taints},
            }))
        })
        .await
    }

    pub(super) async fn resolve(
        &self,
        manifest: &Manifest,
    ) -> Result<(ApiResource, ApiCapabilities), K8sError> {
        let key = (
            manifest.api_version().to_string(),
            manifest.kind().to_string(),
        );
        if let Some(found) = self.discovered.locked().get(&key) {
            return Ok(found.clone());
        }
        let (group, version) = match manifest.api_version().split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", manifest.api_version()),
        };
        let gvk = GroupVersionKind::gvk(group, version, manifest.kind());
        let found = (|| ::kube::discovery::pinned_kind(&self.client, &gvk))
            .retry(
                backon::ExponentialBuilder::default()
                    .with_max_times(self.options.retry.attempts.saturating_sub(1))
                    .with_min_delay(self.options.retry.min_delay)
                    .with_max_delay(
                        self.options
                            .retry
                            .max_delay
                            .max(self.options.retry.min_delay),
                    ),
            )
            .when(transient)
            .await
            .map_err(|err| {
                if transient(&err) {
                    K8sError::Api {
                        op: "discover",
                        target: manifest.describe(),
                        err: Box::new(err),
                    }
                } else {
                    K8sError::UnknownKind {
                        api_version: manifest.api_version().to_string(),
                        kind: manifest.kind().to_string(),
                        object: manifest.describe(),
                        err: Box::new(err),
                    }
                }
            })?;
        self.discovered.locked().insert(key, found.clone());
        Ok(found)
    }
}

/// What `GET /version` says, and the apiserver's clock (its `Date` header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `gitVersion`, e.g. `v1.34.1`.
    pub git_version: String,
    /// The response's `Date` header (one-second resolution), if it had a valid one.
    pub date: Option<jiff::Timestamp>,
    /// The local clock when the response arrived.
    pub received: jiff::Timestamp,
}

/// One permission to check with a `SelfSubjectAccessReview` (what `kubectl auth can-i` asks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessCheck {
    pub verb: String,
    /// API group, `""` for the core group.
    pub group: String,
    /// Plural resource, e.g. `pods`.
    pub resource: String,
    /// Subresource, e.g. `eviction`; empty for none.
    pub subresource: String,
}

impl AccessCheck {
    pub fn new(verb: &str, group: &str, resource: &str, subresource: &str) -> AccessCheck {
        AccessCheck {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: subresource.into(),
        }
    }
}

impl std::fmt::Display for AccessCheck {
    /// kubectl's notation: `create pods/eviction`, `list poddisruptionbudgets.policy`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if !self.subresource.is_empty() {
            write!(f, "/{}", self.subresource)?;
        }
        Ok(())
    }
}

impl KubeClient {
    /// `GET /version` (retried like every call) and the apiserver's `Date` header, for clock
    /// checks.
    #[allow(
        clippy::expect_used,
        reason = "a GET of a constant path with an empty body is always a valid request"
    )]
    pub async fn server_info(&self) -> Result<ServerInfo, K8sError> {
        let info = self
            .call("get version", &self.cluster_url, || {
                self.client.apiserver_version()
            })
            .await?;
        let request = hyper::Request::get("/version")
            .body(::kube::client::Body::empty())
            .expect("a static request is valid");
        let response = self
            .client
            .send(request)
            .await
            .map_err(api_err("get version", self.cluster_url.clone()))?;
        let received = jiff::Timestamp::now();
        let date = response
            .headers()
            .get(hyper::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                jiff::fmt::rfc2822::DateTimeParser::new()
                    .parse_timestamp(v)
                    .ok()
            });
        Ok(ServerInfo {
            git_version: info.git_version,
            date,
            received,
        })
    }

    /// Ask the apiserver whether the kubeconfig's user may do `check`, cluster-wide
    /// (`SelfSubjectAccessReview`). Returns the decision and the authorizer's reason.
    pub async fn can_i(&self, check: &AccessCheck) -> Result<(bool, String), K8sError> {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
        };
        let api: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(check.verb.clone()),
                    group: Some(check.group.clone()),
                    resource: Some(check.resource.clone()),
                    subresource: (!check.subresource.is_empty()).then(|| check.subresource.clone()),
                    ..ResourceAttributes::default()
                }),
                non_resource_attributes: None,
            },
            ..SelfSubjectAccessReview::default()
        };
        let params = ::kube::api::PostParams::default();
        let answer = self
            .call("access review", &check.to_string(), || {
                api.create(&params, &review)
            })
            .await?;
        let status = answer.status.unwrap_or_default();
        Ok((status.allowed, status.reason.unwrap_or_default()))
    }
}

fn cluster_node(node: Node) -> ClusterNode {
    let taints = taints_of(&node);
    let name = node.metadata.name.clone().unwrap_or_default();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    let status = node.status.unwrap_or_default();
    let info = status.node_info.unwrap_or_default();
    let conditions = status.conditions.unwrap_or_default();
    let ready = conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let mut pressure: Vec<String> = conditions
        .iter()
        .filter(|c| PRESSURE_CONDITIONS.contains(&c.type_.as_str()) && c.status == "True")
        .map(|c| c.type_.clone())
        .collect();
    pressure.sort();
    let kubelet_version = match KubeVersion::parse(&info.kubelet_version) {
        Ok(v) => Some(v),
        Err(err) => {
            tracing::warn!(node = %name, kubelet_version = %info.kubelet_version, error = %crate::error_chain(&err), "node reports a kubelet version medea cannot parse");
            None
        }
    };
    ClusterNode {
        addresses: status
            .addresses
            .unwrap_or_default()
            .into_iter()
            .map(|a| NodeAddress {
                kind: a.type_,
                address: a.address,
            })
            .collect(),
        control_plane: labels.contains_key(CONTROL_PLANE_LABEL),
        labels,
        annotations,
        ready,
        pressure,
        taints,
        unschedulable: node.spec.and_then(|s| s.unschedulable).unwrap_or(false),
        kubelet_version,
        kubelet_version_raw: info.kubelet_version,
        boot_id: info.boot_id,
        machine_id: info.machine_id,
        os_image: info.os_image,
        name,
    }
}

fn readiness(name: &str, node: Node) -> Result<NodeReadiness, K8sError> {
    let taints = taints_of(&node);
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    let status = node.status.unwrap_or_default();
    let raw = status
        .node_info
        .map(|i| i.kubelet_version)
        .unwrap_or_default();
    let kubelet_version = KubeVersion::parse(&raw).map_err(|err| K8sError::KubeletVersion {
        node: name.to_string(),
        raw: raw.clone(),
        err,
    })?;
    let ready_condition = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready");
    let ready = ready_condition.as_ref().is_some_and(|c| c.status == "True");
    let not_ready_reason = if ready {
        None
    } else {
        Some(match ready_condition {
            Some(c) => format!(
                "Ready={}: {}{}",
                c.status,
                c.reason.unwrap_or_default(),
                c.message.map(|m| format!(" ({m})")).unwrap_or_default()
            ),
            None => "the node has no Ready condition".to_string(),
        })
    };
    Ok(NodeReadiness {
        ready,
        kubelet_version,
        taints,
        unschedulable: node.spec.and_then(|s| s.unschedulable).unwrap_or(false),
        not_ready_reason,
        annotations,
    })
}

/// A node's `spec.taints`.
fn taints_of(node: &Node) -> Vec<NodeTaintSpec> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| {
            ts.iter()
                .map(|t| NodeTaintSpec {
                    key: t.key.clone(),
                    value: t.value.clone().unwrap_or_default(),
                    effect: t.effect.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// How many times a taint change is tried again after the node changed under it (HTTP 409).
const TAINT_CONFLICT_RETRIES: usize = 5;

fn pod_ref(pod: &Pod) -> PodRef {
    PodRef {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
    }
}

fn pod_is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn drain_pod(pod: &Pod) -> DrainPod {
    let controller = pod
        .metadata
        .owner_references
        .as_ref()
        .and_then(|refs| refs.iter().find(|r| r.controller == Some(true)));
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    DrainPod {
        pod: pod_ref(pod),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        mirror: pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)),
        daemonset: controller.is_some_and(|c| c.kind == "DaemonSet"),
        controlled: controller.is_some(),
        empty_dir: pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|vs| vs.iter().any(|v| v.empty_dir.is_some())),
        finished: matches!(phase, "Succeeded" | "Failed"),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        claims: pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.clone())
            .collect(),
    }
}

/// The component a mirror pod runs, if it is a control-plane static pod of `node`.
fn component_of(pod: &Pod, node: &str) -> Option<ControlPlaneComponent> {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or("");
    ControlPlaneComponent::ALL.into_iter().find(|c| {
        labels.get("k8s-app").map(String::as_str) == Some(c.name())
            || labels.get("component").map(String::as_str) == Some(c.name())
            || name == format!("{}-{node}", c.name())
    })
}

impl KubeClient {
    /// The PersistentVolumes of the pods a drain of `node` with `options` would evict now
    /// (sorted, each once), read before the drain as tuppr's `EvictableVolumePVs` does;
    /// `None` when the kubeconfig may not read PersistentVolumeClaims.
    pub async fn drain_volumes(
        &self,
        node: &str,
        options: &DrainOptions,
    ) -> Result<Option<Vec<String>>, K8sError> {
        drain::evicted_volumes(self, node, options).await
    }
}

impl DrainOps for KubeClient {
    async fn list(&self, node: &str) -> Result<Vec<DrainPod>, K8sError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let pods = api
            .list(&params)
            .await
            .map_err(api_err("list pods on node", node))?;
        Ok(pods.items.iter().map(drain_pod).collect())
    }

    async fn evict(&self, pod: &PodRef) -> Result<Eviction, K8sError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        match api.evict(&pod.name, &EvictParams::default()).await {
            Ok(_) => Ok(Eviction::Accepted),
            Err(::kube::Error::Api(s)) if s.code == 404 => Ok(Eviction::Gone),
            Err(::kube::Error::Api(s)) if s.code == 429 => {
                let cause = s
                    .details
                    .as_ref()
                    .and_then(|d| d.causes.iter().find(|c| !c.message.is_empty()))
                    .map(|c| c.message.clone());
                Ok(Eviction::Refused {
                    message: cause.unwrap_or_else(|| s.message.clone()),
                })
            }
            Err(err) => Err(K8sError::Api {
                op: "evict pod",
                target: pod.to_string(),
                err: Box::new(err),
            }),
        }
    }

    async fn blocking_pdb(&self, pod: &PodRef, refusal: &str) -> Option<String> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), &pod.namespace);
        let from_api = async {
            let labels = pods
                .get(&pod.name)
                .await
                .ok()?
                .metadata
                .labels
                .unwrap_or_default();
            let list = pdbs.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|pdb| {
                    selector::selects(pdb.spec.as_ref().and_then(|s| s.selector.as_ref()), &labels)
                })
                .and_then(|pdb| pdb.metadata.name)
        };
        let name = match from_api.await {
            Some(name) => Some(name),
            None => drain::pdb_from_message(refusal),
        };
        name.map(|n| format!("{}/{n}", pod.namespace))
    }

    async fn claim_volume(&self, namespace: &str, claim: &str) -> Result<Option<String>, K8sError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        match api.get_opt(claim).await {
            Ok(pvc) => Ok(pvc
                .and_then(|c| c.spec)
                .and_then(|s| s.volume_name)
                .filter(|v| !v.is_empty())),
            Err(err) => Err(K8sError::Api {
                op: "get persistentvolumeclaim",
                target: format!("{namespace}/{claim}"),
                err: Box::new(err),
            }),
        }
    }

    async fn gone(&self, pod: &DrainPod) -> Result<bool, K8sError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.pod.namespace);
        match api.get_opt(&pod.pod.name).await {
            Ok(None) => Ok(true),
            Ok(Some(p)) => Ok(p.metadata.uid.as_deref() != Some(pod.uid.as_str())),
            Err(err) => Err(K8sError::Api {
                op: "get pod",
                target: pod.pod.to_string(),
                err: Box::new(err),
            }),
        }
    }
}

impl KubeApi for KubeClient {
    fn server_url(&self) -> String {
        self.cluster_url.trim_end_matches('/').to_string()
    }

    async fn published_apiservers(&self) -> Result<Vec<(String, u16)>, K8sError> {
        KubeClient::published_apiservers(self).await
    }

    async fn apiserver_metrics(&self, server: Option<&str>) -> Result<String, K8sError> {
        self.scrape_metrics(server).await
    }

    async fn preferred_versions(&self) -> Result<BTreeMap<String, String>, K8sError> {
        KubeClient::preferred_versions(self).await
    }

    async fn served_resources(
        &self,
        group: &str,
        version: &str,
    ) -> Result<Vec<ServedResource>, K8sError> {
        self.resources_of(group, version).await
    }

    async fn object_writers(
        &self,
        group: &str,
        version: &str,
        resource: &ServedResource,
    ) -> Result<Vec<ObjectWriters>, K8sError> {
        self.writers_of(group, version, resource).await
    }

    async fn list_names(
        &self,
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
    ) -> Result<Option<crate::k8s::AlphaList>, K8sError> {
        self.names_of(group, version, plural, kind).await
    }

    async fn disruption_budgets(&self) -> Result<Vec<PdbCoverage>, K8sError> {
        self.pdb_coverage().await
    }

    async fn workloads(&self, page_size: u32) -> super::census::WorkloadLists {
        self.census_lists(page_size).await
    }

    async fn cordon(&self, node: &str) -> Result<(), K8sError> {
        self.set_unschedulable(node, true).await
    }

    async fn uncordon(&self, node: &str) -> Result<(), K8sError> {
        self.set_unschedulable(node, false).await
    }

    async fn drain(&self, node: &str, options: &DrainOptions) -> Result<DrainReport, K8sError> {
        self.cordon(node).await?;
        drain::run(self, node, options).await
    }

    async fn nodes(&self) -> Result<Vec<ClusterNode>, K8sError> {
        let api = self.node_api();
        let params = ListParams::default();
        let list = self
            .call("list nodes", &self.cluster_url, || api.list(&params))
            .await?;
        let mut nodes: Vec<ClusterNode> = list.items.into_iter().map(cluster_node).collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(nodes)
    }

    async fn node_readiness(&self, node: &str) -> Result<NodeReadiness, K8sError> {
        readiness(node, self.node(node).await?)
    }

    async fn control_plane_pods(&self, node: &str) -> Result<Vec<StaticPodStatus>, K8sError> {
        // Make a missing node an explicit error rather than "no static pods".
        self.node(node).await?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), "kube-system");
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let pods = self
            .call("list kube-system pods on node", node, || api.list(&params))
            .await?;
        let mut out: Vec<StaticPodStatus> = pods
            .items
            .iter()
            .filter(|p| {
                p.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
            })
            .filter_map(|p| {
                let component = component_of(p, node)?;
                let containers = p
                    .spec
                    .as_ref()
                    .map(|s| s.containers.clone())
                    .unwrap_or_default();
                let image = containers
                    .iter()
                    .find(|c| c.name == component.name())
                    .or_else(|| containers.first())
                    .and_then(|c| c.image.clone())
                    .unwrap_or_default();
                Some(StaticPodStatus {
                    component,
                    pod: pod_ref(p),
                    running: p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"),
                    ready: pod_is_ready(p),
                    image,
                    config_version: p
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(crate::rollout::ports::ANNOTATION_CONFIG_VERSION))
                        .cloned(),
                })
            })
            .collect();
        out.sort_by_key(|s| s.component);
        Ok(out)
    }

    async fn apply(
        &self,
        manifests: &[Manifest],
        options: &ApplyOptions,
    ) -> Result<Vec<AppliedObject>, K8sError> {
        let mut applied = Vec::with_capacity(manifests.len());
        for manifest in manifests {
            let (resource, caps) = self.resolve(manifest).await?;
            let api: Api<DynamicObject> = match caps.scope {
                Scope::Namespaced => match manifest.namespace() {
                    Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
                    None => Api::default_namespaced_with(self.client.clone(), &resource),
                },
                Scope::Cluster => Api::all_with(self.client.clone(), &resource),
            };
            let mut params = PatchParams::apply(&options.field_manager);
            params.force = options.force_conflicts;
            params.dry_run = options.dry_run;
            let patch = Patch::Apply(manifest.value().clone());
            let result = self
                .call("server-side apply", &manifest.describe(), || {
                    api.patch(manifest.name(), &params, &patch)
                })
                .await;
            let obj = match result {
                Ok(obj) => obj,
                Err(K8sError::Api { err, .. }) if is_status(&err, 409) => {
                    return Err(K8sError::ApplyConflict {
                        object: manifest.describe(),
                        err,
                    });
                }
                Err(e) => return Err(e),
            };
            applied.push(AppliedObject {
                api_version: manifest.api_version().to_string(),
                kind: manifest.kind().to_string(),
                namespace: obj.metadata.namespace.clone(),
                name: obj.metadata.name.clone().unwrap_or_default(),
                uid: obj.metadata.uid.clone().unwrap_or_default(),
                resource_version: obj.metadata.resource_version.clone().unwrap_or_default(),
                generation: obj.metadata.generation,
            });
        }
        Ok(applied)
    }
}
