//! The bootstrap manifests sync of `talosctl upgrade-k8s` (talos
//! `pkg/cluster/kubernetes/talos_managed.go` `PerformManifestsSync`):
//!
//! - **server-side** (every node runs Talos >= 1.13; `syncManifestsSSA` over go-kubernetes
//!   `kubernetes/ssa` and fluxcd `ssa`): every object gets the annotation
//!   `config.k8s.io/owning-inventory: talos-bootstrap-manifests-inventory` (a manifest
//!   annotated for another inventory is refused, go-kubernetes `ssa/apply.go`
//!   `prepareObjects`), is applied with field manager `talos` and forced ownership (fluxcd ssa
//!   applies with `client.ForceOwnership`), in stages: CRDs, Namespaces and ClusterRoles, then
//!   `…Class` kinds, then ConfigMaps and Secrets (Talos' `CustomStageKinds`), then the rest;
//!   the first two stages are waited for (CRDs Established) before the next (fluxcd
//!   `ApplyAllStaged`) and a kind not served yet is retried ([`ManifestSyncOptions`]) only
//!   when a CRD of the same set defines it. Before anything is applied, every object's kind
//!   must be served or defined by the set, and its live copy must pass the
//!   [`InventoryPolicy`] (default `AdoptIfNoInventory`), as go-kubernetes diffs the whole set
//!   before applying; a pruned object must pass it too. The applied objects are recorded in
//!   the inventory ConfigMap
//!   `kube-system/talos-bootstrap-manifests-inventory` (cli-utils format: label
//!   `cli-utils.sigs.k8s.io/inventory-id`, one data key `<namespace>_<name>_<group>_<Kind>`
//!   per object, a `:` in an RBAC name written `__`: [`ObjRef::key`]; keys Talos'
//!   `ManifestApplyController` wrote at bootstrap read back with [`ObjRef::parse`]); objects
//!   the inventory lists that the manifests no longer render are pruned after everything
//!   applied (`calculatePruneObjects`); the inventory is written unconditionally (no
//!   resourceVersion), as go-kubernetes does, because Talos' `ManifestApplyController` rewrites
//!   it too; then the objects created or configured are waited for by kstatus' rules
//!   ([`super::kstatus`], `ssacli.Wait`, fail-fast).
//! - **legacy** (some node runs Talos < 1.13; `syncManifests`, go-kubernetes
//!   `kubernetes/manifests/sync.go`): per object GET, then create when missing or, when a
//!   dry-run update differs from the live object, update (PUT at the live resourceVersion),
//!   retrying 409s and retryable errors; no inventory, no pruning; then every Deployment and
//!   DaemonSet is waited for.
//!
//! [`ManifestSyncOptions`]: super::ManifestSyncOptions

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ::kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use ::kube::discovery::Scope;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{Value, json};

use super::client::{KubeClient, is_status};
use super::{K8sError, Manifest};

/// The field manager of the bootstrap manifests (talos `constants.KubernetesFieldManagerName`).
pub const FIELD_MANAGER: &str = "talos";
/// Namespace of the inventory ConfigMap (talos `constants.KubernetesInventoryNamespace`).
pub const INVENTORY_NAMESPACE: &str = "kube-system";
/// Name and id of the inventory (talos `constants.KubernetesBootstrapManifestsInventoryName`).
pub const INVENTORY_NAME: &str = "talos-bootstrap-manifests-inventory";
/// The annotation naming an object's inventory (go-kubernetes `ssa.InventoryAnnotationKey`).
pub const INVENTORY_ANNOTATION: &str = "config.k8s.io/owning-inventory";
/// The label of a cli-utils inventory ConfigMap.
pub const INVENTORY_ID_LABEL: &str = "cli-utils.sigs.k8s.io/inventory-id";
/// The API group of the kinds whose names may hold a `:` (cli-utils `RBACGroupKind`).
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
/// How cli-utils writes a `:` of an RBAC name in an inventory key (`colonTranscoded`).
const COLON_TRANSCODED: &str = "__";

/// How the manifests are synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Talos >= 1.13 everywhere: server-side apply with the inventory.
    ServerSide,
    /// Some node runs Talos < 1.13: GET, create or update.
    Legacy,
}

/// What a sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Objects applied (created, updated or unchanged), as `Kind namespace/name`.
    pub applied: Vec<String>,
    /// Objects pruned.
    pub pruned: Vec<String>,
}

/// An object's identity in an inventory: (namespace, name, group, kind).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjRef {
    pub namespace: String,
    pub name: String,
    pub group: String,
    pub kind: String,
}

impl ObjRef {
    pub fn of(m: &Manifest) -> ObjRef {
        let group = m
            .api_version()
            .split_once('/')
            .map(|(g, _)| g)
            .unwrap_or("");
        ObjRef {
            namespace: m.namespace().unwrap_or("").to_string(),
            name: m.name().to_string(),
            group: group.to_string(),
            kind: m.kind().to_string(),
        }
    }
    /// The inventory key, as cli-utils `ObjMetadata.String()` writes it
    /// (fluxcd/cli-utils `pkg/object/objmetadata.go`, which go-kubernetes `ssa` and Talos'
    /// `ManifestApplyController` use): `<namespace>_<name>_<group>_<Kind>`
    /// (`kube-system_coredns_apps_Deployment`), where the name of an RBAC object (`Role`,
    /// `ClusterRole`, `RoleBinding`, `ClusterRoleBinding` of `rbac.authorization.k8s.io`) has
    /// each `:` written as `__`, since a ConfigMap key may not hold a `:`
    /// (`_system__coredns_rbac.authorization.k8s.io_ClusterRole`).
    pub fn key(&self) -> String {
        let rbac = self.group == RBAC_GROUP
            && matches!(
                self.kind.as_str(),
                "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding"
            );
        let name = if rbac {
            self.name.replace(':', COLON_TRANSCODED)
        } else {
            self.name.clone()
        };
        format!("{}_{}_{}_{}", self.namespace, name, self.group, self.kind)
    }
    /// Parse an inventory key as cli-utils `ParseObjMetadata` does: the namespace up to the
    /// first `_`, the kind after the last one, the group after the one before it, and the
    /// name in between with every `__` read back as `:`. `None` when a separator is missing
    /// (upstream's "unable to parse stored object metadata").
    pub fn parse(key: &str) -> Option<ObjRef> {
        let (namespace, rest) = key.split_once('_')?;
        let (rest, kind) = rest.rsplit_once('_')?;
        let (name, group) = rest.rsplit_once('_')?;
        Some(ObjRef {
            namespace: namespace.to_string(),
            name: name.replace(COLON_TRANSCODED, ":"),
            group: group.to_string(),
            kind: kind.to_string(),
        })
    }
    fn describe(&self) -> String {
        if self.namespace.is_empty() {
            format!("{} {}", self.kind, self.name)
        } else {
            format!("{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// The apply stage of an object: CRDs, Namespaces and ClusterRoles (fluxcd ssa
/// `IsClusterDefinition`), `…Class` kinds, ConfigMaps and Secrets, everything else.
pub fn stage(m: &Manifest) -> u8 {
    match m.kind() {
        "CustomResourceDefinition" | "Namespace" | "ClusterRole" => 0,
        k if k.ends_with("Class") => 1,
        "ConfigMap" | "Secret" => 2,
        _ => 3,
    }
}

/// `manifests` annotated with the inventory and in apply order (stable within a stage).
/// An object already annotated for another inventory is refused.
#[allow(
    clippy::expect_used,
    reason = "Manifest::from_value refuses a manifest without an object `metadata`"
)]
pub fn prepare(manifests: &[Manifest]) -> Result<Vec<Manifest>, K8sError> {
    let mut out = Vec::with_capacity(manifests.len());
    for (i, m) in manifests.iter().enumerate() {
        let mut v = m.value().clone();
        let ann = v
            .pointer(&format!(
                "/metadata/annotations/{}",
                INVENTORY_ANNOTATION.replace('/', "~1")
            ))
            .and_then(Value::as_str)
            .map(str::to_string);
        if let Some(other) = ann.filter(|a| a != INVENTORY_NAME) {
            return Err(K8sError::ManifestInvalid {
                index: i,
                reason: format!(
                    "`{}` already belongs to inventory `{other}` (annotation {INVENTORY_ANNOTATION})",
                    m.describe()
                ),
            });
        }
        let meta = v["metadata"]
            .as_object_mut()
            .expect("a manifest has metadata (checked by Manifest::from_value)");
        let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
        if !annotations.is_object() {
            *annotations = json!({});
        }
        annotations[INVENTORY_ANNOTATION] = json!(INVENTORY_NAME);
        out.push(Manifest::from_value(v, i)?);
    }
    out.sort_by_key(stage);
    Ok(out)
}

/// Inventory refs that the current objects no longer include.
pub fn prune_set(inventory: &BTreeSet<ObjRef>, current: &[Manifest]) -> Vec<ObjRef> {
    inventory
        .iter()
        .filter(|r| {
            !current.iter().any(|m| {
                let c = ObjRef::of(m);
                c.kind == r.kind
                    && c.group == r.group
                    && c.name == r.name
                    && (c.namespace == r.namespace || r.namespace.is_empty())
            })
        })
        .cloned()
        .collect()
}

/// Whether a CustomResourceDefinition of `set` defines `m`'s kind (its `spec.group` and
/// `spec.names.kind`).
fn defined_in(set: &[Manifest], m: &Manifest) -> bool {
    let r = ObjRef::of(m);
    set.iter().any(|c| {
        let v = c.value();
        c.kind() == "CustomResourceDefinition"
            && c.api_version().starts_with("apiextensions.k8s.io/")
            && v.pointer("/spec/group").and_then(Value::as_str) == Some(r.group.as_str())
            && v.pointer("/spec/names/kind").and_then(Value::as_str) == Some(r.kind.as_str())
    })
}

fn sync_err(object: impl Into<String>, reason: impl Into<String>) -> K8sError {
    K8sError::ManifestSync {
        object: object.into(),
        reason: reason.into(),
    }
}

/// Which live objects the server-side sync may take over and prune: cli-utils'
/// `inventory.Policy` as go-kubernetes `ssa/inventory_policy.go` checks it against a live
/// object's `config.k8s.io/owning-inventory` annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InventoryPolicy {
    /// Only objects annotated for this inventory (or new ones).
    MustMatch,
    /// Also objects annotated for no inventory; never another inventory's (talosctl's
    /// default).
    #[default]
    AdoptIfNoInventory,
    /// Any object.
    AdoptAll,
}

impl InventoryPolicy {
    /// `checkInventoryPolicy`: whether an object with owning-inventory annotation `owner`
    /// may be changed or pruned; `Err` carries upstream's wording.
    pub fn check(self, owner: Option<&str>) -> Result<(), String> {
        let status = match owner {
            Some(o) if o == INVENTORY_NAME => return Ok(()),
            None => "Empty",
            Some(_) => "NoMatch",
        };
        let allowed = match (status, self) {
            ("Empty", InventoryPolicy::MustMatch) => false,
            ("Empty", _) => true,
            (_, InventoryPolicy::AdoptAll) => true,
            _ => false,
        };
        if allowed {
            Ok(())
        } else {
            Err(format!(
                "inventory policy prevented actuation (status: {status}, policy: {self:?}): annotated for {}",
                owner.map_or("no inventory".to_string(), |o| format!("inventory `{o}`"))
            ))
        }
    }
}

/// What applying one object did (fluxcd ssa `Action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Created,
    Configured,
    Unchanged,
}

/// Whether an error is worth retrying within the sync's retry window: go-kubernetes
/// `IsRetryableError` (timeouts, internal errors, connection trouble) plus `409 Conflict` for
/// the legacy sync (`manifests/sync.go`: `apierrors.IsConflict`).
fn retryable(e: &K8sError, conflicts: bool) -> bool {
    match e {
        K8sError::Api { err, .. } => super::transient(err) || (conflicts && is_status(err, 409)),
        _ => false,
    }
}

/// The fields `manifests/sync.go` `getResourceDiff` drops before comparing the live object
/// with the dry-run result: bookkeeping the apiserver writes, annotations of
/// `kubernetes.io/`, a ServiceAccount's injected `secrets`.
fn comparable(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in [
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "finalizers",
            "selfLink",
            "ownerReferences",
        ] {
            meta.remove(k);
        }
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.retain(|k, _| !k.contains("kubernetes.io/"));
            if a.is_empty() {
                meta.remove("annotations");
            }
        }
    }
    if o["kind"] == "ServiceAccount"
        && let Some(m) = o.as_object_mut()
    {
        m.remove("secrets");
    }
    o
}

impl KubeClient {
    async fn dynamic_api(&self, m: &Manifest) -> Result<Api<DynamicObject>, K8sError> {
        let (resource, caps) = self.resolve(m).await?;
        Ok(match caps.scope {
            Scope::Namespaced => match m.namespace() {
                Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
                None => Api::default_namespaced_with(self.client.clone(), &resource),
            },
            Scope::Cluster => Api::all_with(self.client.clone(), &resource),
        })
    }

    /// [`Self::dynamic_api`], retrying while the kind is not served for the sync's retry
    /// window, but only when a CRD of `set` defines it (applied moments ago, its kind not in
    /// discovery yet). go-kubernetes retries only `IsRetryableError`s, never a "no matches for
    /// kind": a kind is resolved once the CRDs of the same set are Established (`Apply` resets
    /// the REST mapper when the set holds CRDs); any other unknown kind fails at once.
    async fn dynamic_api_retrying(
        &self,
        m: &Manifest,
        set: &[Manifest],
    ) -> Result<Api<DynamicObject>, K8sError> {
        let o = &self.options.manifests;
        let deadline = tokio::time::Instant::now() + o.retry_for;
        loop {
            match self.dynamic_api(m).await {
                Err(e @ K8sError::UnknownKind { .. }) if !defined_in(set, m) => {
                    return Err(K8sError::ManifestKindUnserved {
                        object: m.describe(),
                        source: Box::new(e),
                    });
                }
                Err(e @ K8sError::UnknownKind { .. }) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(K8sError::ManifestRetriesExhausted {
                            object: m.describe(),
                            waited: o.retry_for,
                            source: Box::new(e),
                        });
                    }
                    tracing::info!(object = %m.describe(), error = %crate::error_chain(&e), "kind not served yet; retrying");
                    tokio::time::sleep(o.retry_interval).await;
                }
                other => return other,
            }
        }
    }

    async fn api_for_ref(&self, r: &ObjRef) -> Result<Option<Api<DynamicObject>>, K8sError> {
        let group = ::kube::discovery::group(&self.client, &r.group)
            .await
            .map_err(super::client::api_err(
                "discover API group",
                r.group.clone(),
            ));
        let group = match group {
            Ok(g) => g,
            // the group is gone: nothing of it is left to prune
            Err(K8sError::Api { err, .. }) if is_status(&err, 404) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some((resource, caps)) = group.recommended_kind(&r.kind) else {
            return Ok(None);
        };
        Ok(Some(match caps.scope {
            Scope::Namespaced => Api::namespaced_with(self.client.clone(), &r.namespace, &resource),
            Scope::Cluster => Api::all_with(self.client.clone(), &resource),
        }))
    }

    /// Before anything is applied, as go-kubernetes `ssa` `Apply` diffs every object (and
    /// checks its live copy against the inventory policy, `diff.go`) before `ApplyAllStaged`:
    /// a kind the cluster does not serve and no CRD of the set defines, and (server-side) a
    /// live object the inventory policy refuses, fail the sync with nothing changed. An object
    /// whose CRD is in the set has no live copy yet (upstream's diff counts it as created).
    async fn check_before_apply(
        &self,
        objects: &[Manifest],
        mode: SyncMode,
    ) -> Result<(), K8sError> {
        for m in objects {
            let api = match self.dynamic_api(m).await {
                Ok(api) => api,
                Err(K8sError::UnknownKind { .. }) if defined_in(objects, m) => continue,
                Err(e @ K8sError::UnknownKind { .. }) => {
                    return Err(K8sError::ManifestKindUnserved {
                        object: m.describe(),
                        source: Box::new(e),
                    });
                }
                Err(e) => return Err(e),
            };
            if mode == SyncMode::Legacy {
                continue;
            }
            let live = self
                .call("get", &m.describe(), || api.get_opt(m.name()))
                .await?;
            let owner = live.as_ref().and_then(|l| {
                l.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(INVENTORY_ANNOTATION))
            });
            if live.is_some() {
                self.options
                    .manifests
                    .inventory_policy
                    .check(owner.map(String::as_str))
                    .map_err(|reason| {
                        sync_err(m.describe(), format!("{reason}; nothing was applied"))
                    })?;
            }
        }
        Ok(())
    }

    /// Server-side apply one object (fluxcd ssa `Apply`): the live object, if any, must pass
    /// the inventory policy; the action is read from what the apiserver stored (a no-op apply
    /// keeps the resourceVersion).
    async fn apply_one(&self, api: &Api<DynamicObject>, m: &Manifest) -> Result<Action, K8sError> {
        let live = self
            .call("get", &m.describe(), || api.get_opt(m.name()))
            .await?;
        if let Some(live) = &live {
            let owner = live
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(INVENTORY_ANNOTATION));
            self.options
                .manifests
                .inventory_policy
                .check(owner.map(String::as_str))
                .map_err(|reason| sync_err(m.describe(), reason))?;
        }
        let mut params = PatchParams::apply(FIELD_MANAGER);
        params.force = true;
        let patch = Patch::Apply(m.value().clone());
        let applied = self
            .call("server-side apply", &m.describe(), || {
                api.patch(m.name(), &params, &patch)
            })
            .await?;
        Ok(match live {
            None => Action::Created,
            Some(l) if l.metadata.resource_version != applied.metadata.resource_version => {
                Action::Configured
            }
            Some(_) => Action::Unchanged,
        })
    }

    /// One object as go-kubernetes `manifests/sync.go` `updateManifest` syncs it: create it
    /// when missing; otherwise update it at the live resourceVersion, but only when a dry-run
    /// of that update differs from the live object.
    async fn update_one(&self, api: &Api<DynamicObject>, m: &Manifest) -> Result<Action, K8sError> {
        let live = self
            .call("get", &m.describe(), || api.get_opt(m.name()))
            .await?;
        let mut obj: DynamicObject = serde_json::from_value(m.value().clone())
            .map_err(|e| sync_err(m.describe(), e.to_string()))?;
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        let Some(live) = live else {
            self.call("create", &m.describe(), || api.create(&pp, &obj))
                .await?;
            return Ok(Action::Created);
        };
        obj.metadata.resource_version = live.metadata.resource_version.clone();
        let dry = PostParams {
            dry_run: true,
            ..pp.clone()
        };
        let preview = self
            .call("update (dry run)", &m.describe(), || {
                api.replace(m.name(), &dry, &obj)
            })
            .await?;
        let as_json = |o: &DynamicObject| {
            serde_json::to_value(o).map_err(|e| sync_err(m.describe(), e.to_string()))
        };
        if comparable(&as_json(&live)?) == comparable(&as_json(&preview)?) {
            return Ok(Action::Unchanged);
        }
        self.call("update", &m.describe(), || api.replace(m.name(), &pp, &obj))
            .await?;
        Ok(Action::Configured)
    }

    /// [`Self::update_one`], retried on conflicts and retryable errors for the retry window
    /// (`manifests/sync.go` `Sync`).
    async fn update_one_retrying(
        &self,
        api: &Api<DynamicObject>,
        m: &Manifest,
    ) -> Result<Action, K8sError> {
        let o = &self.options.manifests;
        let deadline = tokio::time::Instant::now() + o.retry_for;
        loop {
            match self.update_one(api, m).await {
                Err(e) if retryable(&e, true) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(K8sError::ManifestRetriesExhausted {
                            object: m.describe(),
                            waited: o.retry_for,
                            source: Box::new(e),
                        });
                    }
                    tracing::info!(object = %m.describe(), error = %crate::error_chain(&e), "manifest update failed; retrying");
                    tokio::time::sleep(o.retry_interval).await;
                }
                other => return other,
            }
        }
    }

    /// Sync the bootstrap manifests as `upgrade-k8s` does (see the module docs); `wait`
    /// bounds the wait for the applied objects to reconcile.
    pub async fn sync_bootstrap_manifests(
        &self,
        manifests: &[Manifest],
        mode: SyncMode,
        wait: Duration,
    ) -> Result<SyncReport, K8sError> {
        let mut report = SyncReport::default();
        let objects = match mode {
            SyncMode::ServerSide => prepare(manifests)?,
            SyncMode::Legacy => {
                let mut v = manifests.to_vec();
                v.sort_by_key(stage);
                v
            }
        };
        let inventory = match mode {
            SyncMode::ServerSide => Some(self.read_inventory().await?),
            SyncMode::Legacy => None,
        };
        self.check_before_apply(&objects, mode).await?;
        let mut changed: Vec<&Manifest> = Vec::new();
        let mut i = 0;
        while i < objects.len() {
            let this = stage(&objects[i]);
            let end = objects[i..]
                .iter()
                .position(|m| stage(m) != this)
                .map_or(objects.len(), |n| i + n);
            let batch = &objects[i..end];
            i = end;
            for m in batch {
                let api = self.dynamic_api_retrying(m, &objects).await?;
                let action = match mode {
                    SyncMode::ServerSide => self.apply_one(&api, m).await?,
                    SyncMode::Legacy => self.update_one_retrying(&api, m).await?,
                };
                if action != Action::Unchanged {
                    changed.push(m);
                }
                report.applied.push(ObjRef::of(m).describe());
            }
            // like fluxcd ssa `ApplyAllStaged`: the definitions of the first stages (CRDs
            // Established, Namespaces, ClusterRoles, `…Class` objects) must be current, by
            // kstatus, before the objects that use them are applied
            let definitions: Vec<&Manifest> = batch.iter().filter(|m| stage(m) <= 1).collect();
            if !definitions.is_empty() {
                let o = &self.options.manifests;
                self.wait_current(&definitions, o.retry_for).await?;
            }
        }
        if let Some(mut inv) = inventory {
            inv.extend(objects.iter().map(ObjRef::of));
            self.write_inventory(&inv).await?;
            for r in prune_set(&inv, &objects) {
                let Some(api) = self.api_for_ref(&r).await? else {
                    inv.remove(&r);
                    continue;
                };
                let live = self
                    .call("get", &r.describe(), || api.get_opt(&r.name))
                    .await?;
                let Some(live) = live else {
                    inv.remove(&r);
                    continue;
                };
                let owner = live
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(INVENTORY_ANNOTATION));
                self.options
                    .manifests
                    .inventory_policy
                    .check(owner.map(String::as_str))
                    .map_err(|reason| {
                        sync_err(
                            r.describe(),
                            format!(
                                "listed in inventory `{INVENTORY_NAME}` but not pruned: {reason}"
                            ),
                        )
                    })?;
                let dp = DeleteParams::background();
                self.call("prune", &r.describe(), || api.delete(&r.name, &dp))
                    .await?;
                inv.remove(&r);
                report.pruned.push(r.describe());
            }
            self.write_inventory(&inv).await?;
            // talosctl waits only for what this sync created or changed (`syncManifestsSSA`:
            // the change set's Created/Configured entries), by kstatus' rules
            self.wait_current(&changed, wait).await?;
        } else {
            self.wait_rolled_out(&objects, wait).await?;
        }
        Ok(report)
    }

    /// Wait for `objects` to be Current by kstatus' rules, polling every
    /// [`ManifestSyncOptions::poll_interval`](super::ManifestSyncOptions) up to `wait`; an
    /// object that is Failed (a Deployment past its progress deadline) fails the wait at once
    /// (fluxcd ssa `WaitForSet` with `FailFast`).
    async fn wait_current(&self, objects: &[&Manifest], wait: Duration) -> Result<(), K8sError> {
        let deadline = tokio::time::Instant::now() + wait;
        let poll = self.options.manifests.poll_interval;
        for m in objects {
            let api = self.dynamic_api(m).await?;
            loop {
                let live = self
                    .call("get", &m.describe(), || api.get_opt(m.name()))
                    .await?;
                let why = match live {
                    None => "it does not exist".to_string(),
                    Some(o) => {
                        let v = serde_json::to_value(&o)
                            .map_err(|e| sync_err(m.describe(), e.to_string()))?;
                        match super::kstatus::status(&v, jiff::Timestamp::now()) {
                            super::kstatus::Status::Current => break,
                            super::kstatus::Status::InProgress(why) => why,
                            super::kstatus::Status::Failed(why) => {
                                return Err(sync_err(m.describe(), format!("failed: {why}")));
                            }
                        }
                    }
                };
                if tokio::time::Instant::now() >= deadline {
                    return Err(sync_err(
                        m.describe(),
                        format!("not reconciled after {:?}: {why}", wait),
                    ));
                }
                tokio::time::sleep(poll.min(wait.max(Duration::from_millis(1)))).await;
            }
        }
        Ok(())
    }

    fn inventory_api(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), INVENTORY_NAMESPACE)
    }

    async fn read_inventory(&self) -> Result<BTreeSet<ObjRef>, K8sError> {
        let api = self.inventory_api();
        let cm = self
            .call("get inventory", INVENTORY_NAME, || {
                api.get_opt(INVENTORY_NAME)
            })
            .await?;
        // like go-kubernetes `ssa` (`inventory/configmap` `NewInventory`), a key that does not
        // parse fails the sync rather than being dropped from the inventory
        cm.and_then(|c| c.data)
            .unwrap_or_default()
            .keys()
            .map(|k| {
                ObjRef::parse(k).ok_or_else(|| {
                    sync_err(
                        format!("ConfigMap {INVENTORY_NAMESPACE}/{INVENTORY_NAME}"),
                        format!(
                            "inventory key `{k}` is not `<namespace>_<name>_<group>_<Kind>` (cli-utils ParseObjMetadata)"
                        ),
                    )
                })
            })
            .collect()
    }

    /// Write the inventory as go-kubernetes `ssa/internal/inventory/configmap` `Write` does:
    /// an unconditional update (no resourceVersion: a ConfigMap allows it, kubernetes
    /// `pkg/registry/core/configmap/strategy.go` `AllowUnconditionalUpdate`), since Talos' own
    /// `ManifestApplyController` rewrites the same ConfigMap (through the same go-kubernetes
    /// inventory) whenever it applies the manifests; an update at the resourceVersion read a
    /// moment before would lose to it with a 409. Created when missing (`NewInventory`), and
    /// updated after all when someone created it in between.
    async fn write_inventory(&self, refs: &BTreeSet<ObjRef>) -> Result<(), K8sError> {
        let api = self.inventory_api();
        let data: BTreeMap<String, String> =
            refs.iter().map(|r| (r.key(), String::new())).collect();
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        let cm: ConfigMap = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": INVENTORY_NAME,
                "namespace": INVENTORY_NAMESPACE,
                "labels": {INVENTORY_ID_LABEL: INVENTORY_NAME},
            },
            "data": data,
        }))
        .map_err(|e| sync_err(INVENTORY_NAME, e.to_string()))?;
        let update = || api.replace(INVENTORY_NAME, &pp, &cm);
        match self.call("update inventory", INVENTORY_NAME, update).await {
            Err(K8sError::Api { err, .. }) if is_status(&err, 404) => {
                match self
                    .call("create inventory", INVENTORY_NAME, || api.create(&pp, &cm))
                    .await
                {
                    Err(K8sError::Api { err, .. }) if is_status(&err, 409) => {
                        self.call("update inventory", INVENTORY_NAME, update)
                            .await?;
                    }
                    other => {
                        other?;
                    }
                }
            }
            other => {
                other?;
            }
        }
        Ok(())
    }

    /// Wait for the Deployments and DaemonSets among `objects` to roll out (observed the
    /// latest generation, every replica updated and available), every 2 s up to `wait`.
    async fn wait_rolled_out(&self, objects: &[Manifest], wait: Duration) -> Result<(), K8sError> {
        let deadline = tokio::time::Instant::now() + wait;
        for m in objects
            .iter()
            .filter(|m| matches!(m.kind(), "Deployment" | "DaemonSet"))
        {
            let api = self.dynamic_api(m).await?;
            loop {
                let live = self
                    .call("get", &m.describe(), || api.get_opt(m.name()))
                    .await?;
                let why = match live {
                    None => Some("it does not exist".to_string()),
                    Some(o) => not_rolled_out(m.kind(), &o),
                };
                let Some(why) = why else { break };
                if tokio::time::Instant::now() >= deadline {
                    return Err(sync_err(
                        m.describe(),
                        format!("not rolled out after {}s: {why}", wait.as_secs()),
                    ));
                }
                tokio::time::sleep(Duration::from_secs(2).min(wait)).await;
            }
        }
        Ok(())
    }
}

/// Why a Deployment or DaemonSet has not rolled out, or `None`.
fn not_rolled_out(kind: &str, o: &DynamicObject) -> Option<String> {
    let status = o.data.get("status").cloned().unwrap_or(Value::Null);
    let int = |k: &str| status.get(k).and_then(Value::as_i64).unwrap_or(0);
    let generation = o.metadata.generation.unwrap_or(0);
    if int("observedGeneration") < generation {
        return Some(format!(
            "generation {generation} not observed yet ({})",
            int("observedGeneration")
        ));
    }
    let (want, updated, available) = match kind {
        "Deployment" => (
            o.data
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1),
            int("updatedReplicas"),
            int("availableReplicas"),
        ),
        _ => (
            int("desiredNumberScheduled"),
            int("updatedNumberScheduled"),
            int("numberAvailable"),
        ),
    };
    (updated < want || available < want)
        .then(|| format!("{updated} updated and {available} available of {want}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(v: Value) -> Manifest {
        Manifest::from_value(v, 0).unwrap()
    }

    #[test]
    fn objects_are_annotated_and_staged() {
        let objs = vec![
            m(
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "coredns", "namespace": "kube-system"}}),
            ),
            m(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", "namespace": "kube-system"}}),
            ),
            m(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})),
            m(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "s"}}),
            ),
        ];
        let p = prepare(&objs).unwrap();
        let kinds: Vec<&str> = p.iter().map(|m| m.kind()).collect();
        assert_eq!(
            kinds,
            ["Namespace", "StorageClass", "ConfigMap", "Deployment"]
        );
        for o in &p {
            assert_eq!(
                o.value()["metadata"]["annotations"][INVENTORY_ANNOTATION],
                INVENTORY_NAME
            );
        }
        let foreign = m(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "a", "annotations": {INVENTORY_ANNOTATION: "other"}}}),
        );
        let err = prepare(&[foreign]).unwrap_err();
        assert!(err.to_string().contains("inventory `other`"), "{err}");
    }

    fn r(ns: &str, name: &str, group: &str, kind: &str) -> ObjRef {
        ObjRef {
            namespace: ns.into(),
            name: name.into(),
            group: group.into(),
            kind: kind.into(),
        }
    }

    #[test]
    fn rbac_names_with_colons_get_cli_utils_keys_a_configmap_may_hold() {
        let role = r("", "system:coredns", RBAC_GROUP, "ClusterRole");
        assert_eq!(
            role.key(),
            "_system__coredns_rbac.authorization.k8s.io_ClusterRole"
        );
        assert_eq!(ObjRef::parse(&role.key()), Some(role));
        let binding = r("", "system:talos-nodes", RBAC_GROUP, "ClusterRoleBinding");
        assert_eq!(
            binding.key(),
            "_system__talos-nodes_rbac.authorization.k8s.io_ClusterRoleBinding"
        );
        // every key is a valid ConfigMap key (apimachinery `IsConfigMapKey`)
        for k in [
            binding.key(),
            r("kube-system", "a:b", RBAC_GROUP, "Role").key(),
        ] {
            assert!(
                k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')),
                "{k}"
            );
        }
        // only RBAC kinds are transcoded (cli-utils `RBACGroupKind`)
        assert_eq!(
            r("ns", "a:b", "example.com", "Widget").key(),
            "ns_a:b_example.com_Widget"
        );
    }

    #[test]
    fn keys_parse_as_cli_utils_parse_obj_metadata() {
        // namespace from the first `_`, kind and group from the last two, `__` in the name is `:`
        for (key, want) in [
            (
                "_test-name_apps_ReplicaSet",
                r("", "test-name", "apps", "ReplicaSet"),
            ),
            (
                "test-namespace_test-name_apps_Deployment",
                r("test-namespace", "test-name", "apps", "Deployment"),
            ),
            (
                "test-namespace_kubeadm__nodes-kubeadm-config_rbac.authorization.k8s.io_Role",
                r(
                    "test-namespace",
                    "kubeadm:nodes-kubeadm-config",
                    RBAC_GROUP,
                    "Role",
                ),
            ),
            (
                "test-namespace_system____leader-locking-kube-scheduler_rbac.authorization.k8s.io_Role",
                r(
                    "test-namespace",
                    "system::leader-locking-kube-scheduler",
                    RBAC_GROUP,
                    "Role",
                ),
            ),
            (
                "kube-system_coredns__ConfigMap",
                r("kube-system", "coredns", "", "ConfigMap"),
            ),
        ] {
            assert_eq!(ObjRef::parse(key).as_ref(), Some(&want), "{key}");
        }
        for bad in ["", "nounderscore", "ns_nokind", "a_b"] {
            assert_eq!(ObjRef::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn inventory_keys_round_trip_and_the_prune_set_is_what_is_no_longer_rendered() {
        let cm = m(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", "namespace": "kube-system"}}),
        );
        let r = ObjRef::of(&cm);
        assert_eq!(r.key(), "kube-system_coredns__ConfigMap");
        assert_eq!(ObjRef::parse(&r.key()), Some(r.clone()));
        let dep = ObjRef::parse("kube-system_old-dns_apps_Deployment").unwrap();
        assert_eq!(dep.group, "apps");
        let inv: BTreeSet<ObjRef> = [r, dep.clone()].into();
        assert_eq!(prune_set(&inv, &[cm]), vec![dep]);
    }
}
