//! The resource types the simulated kube-apiserver serves, and the discovery documents built
//! from them (`/api`, `/api/v1`, `/apis`, `/apis/<group>`, `/apis/<group>/<version>`).
//!
//! One static table drives routing, discovery and the object store, so what discovery
//! advertises is exactly what the server implements.

use serde_json::{Value, json};

use crate::api_lifecycle::{self, ApiLifecycle, Minor};

/// Verbs every generically stored resource supports.
const VERBS: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// How the server treats writes to a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// Stored as written (ConfigMaps, Deployments, PDBs, ...).
    Generic,
    /// Derived from the Talos side ([`crate::sim::node::NodeSource`]); writes may only change
    /// the kube-owned fields (`spec.unschedulable`, `spec.taints`, labels, annotations).
    Node,
}

/// One subresource advertised in the group-version resource list.
#[derive(Debug)]
pub(crate) struct Subresource {
    pub name: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub verbs: &'static [&'static str],
}

/// One resource type (`/api/v1/pods`, `/apis/apps/v1/deployments`, ...).
#[derive(Debug)]
pub(crate) struct ResourceType {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub subresources: &'static [Subresource],
    pub owner: Owner,
}

impl ResourceType {
    /// `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The list kind, `PodList`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// The store key of this type.
    pub fn key(&'static self) -> ResKey {
        ResKey {
            group: self.group,
            plural: self.plural,
        }
    }

    /// `pods` or `deployments.apps` (how Kubernetes names the resource in Status messages).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// The identity of a resource type inside the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ResKey {
    pub group: &'static str,
    pub plural: &'static str,
}

const fn generic(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
) -> ResourceType {
    ResourceType {
        group,
        version,
        kind,
        plural,
        singular,
        namespaced,
        short_names,
        categories: &[],
        subresources: &[],
        owner: Owner::Generic,
    }
}

pub(crate) static NAMESPACES: ResourceType = generic(
    "",
    "v1",
    "Namespace",
    "namespaces",
    "namespace",
    false,
    &["ns"],
);
pub(crate) static NODES: ResourceType = ResourceType {
    group: "",
    version: "v1",
    kind: "Node",
    plural: "nodes",
    singular: "node",
    namespaced: false,
    short_names: &["no"],
    categories: &[],
    subresources: &[],
    owner: Owner::Node,
};
pub(crate) static PODS: ResourceType = ResourceType {
    group: "",
    version: "v1",
    kind: "Pod",
    plural: "pods",
    singular: "pod",
    namespaced: true,
    short_names: &["po"],
    categories: &["all"],
    subresources: &[
        Subresource {
            name: "eviction",
            group: "policy",
            version: "v1",
            kind: "Eviction",
            verbs: &["create"],
        },
        // a container's log (`GET …/pods/<name>/log`, text); no group or version of its own,
        // as the apiserver lists it (kubernetes `pkg/registry/core/pod/rest/log.go`)
        Subresource {
            name: "log",
            group: "",
            version: "",
            kind: "Pod",
            verbs: &["get"],
        },
    ],
    owner: Owner::Generic,
};
pub(crate) static CONFIGMAPS: ResourceType = generic(
    "",
    "v1",
    "ConfigMap",
    "configmaps",
    "configmap",
    true,
    &["cm"],
);
pub(crate) static SECRETS: ResourceType =
    generic("", "v1", "Secret", "secrets", "secret", true, &[]);
pub(crate) static SERVICEACCOUNTS: ResourceType = generic(
    "",
    "v1",
    "ServiceAccount",
    "serviceaccounts",
    "serviceaccount",
    true,
    &["sa"],
);
pub(crate) static SERVICES: ResourceType = ResourceType {
    categories: &["all"],
    ..generic("", "v1", "Service", "services", "service", true, &["svc"])
};
pub(crate) static DEPLOYMENTS: ResourceType = ResourceType {
    categories: &["all"],
    ..generic(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        "deployment",
        true,
        &["deploy"],
    )
};
pub(crate) static DAEMONSETS: ResourceType = ResourceType {
    categories: &["all"],
    ..generic(
        "apps",
        "v1",
        "DaemonSet",
        "daemonsets",
        "daemonset",
        true,
        &["ds"],
    )
};
pub(crate) static STATEFULSETS: ResourceType = ResourceType {
    categories: &["all"],
    ..generic(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        "statefulset",
        true,
        &["sts"],
    )
};
pub(crate) static REPLICASETS: ResourceType = ResourceType {
    categories: &["all"],
    ..generic(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        "replicaset",
        true,
        &["rs"],
    )
};
/// `batch/v1` Jobs, run by the simulated Job controller (`cluster/jobs.rs`); the apiserver's
/// defaults and generated selector come from `sim::kube::batch`.
pub(crate) static JOBS: ResourceType = ResourceType {
    categories: &["all"],
    ..generic(BATCH_GROUP, "v1", "Job", "jobs", "job", true, &[])
};
/// PersistentVolumes (cluster-scoped) and PersistentVolumeClaims: stored as written, read by
/// the attach/detach controller (`cluster/volumes.rs`) to find a pod's CSI volumes.
pub(crate) static PERSISTENTVOLUMES: ResourceType = generic(
    "",
    "v1",
    "PersistentVolume",
    "persistentvolumes",
    "persistentvolume",
    false,
    &["pv"],
);
pub(crate) static PERSISTENTVOLUMECLAIMS: ResourceType = generic(
    "",
    "v1",
    "PersistentVolumeClaim",
    "persistentvolumeclaims",
    "persistentvolumeclaim",
    true,
    &["pvc"],
);
/// The `kubernetes` EndpointSlice of `default` is the only one the simulator writes (every
/// live kube-apiserver's address and port, as the apiserver's endpoint reconciler does).
pub(crate) static ENDPOINTSLICES: ResourceType = generic(
    DISCOVERY_GROUP,
    "v1",
    "EndpointSlice",
    "endpointslices",
    "endpointslice",
    true,
    &[],
);
pub(crate) static PDBS: ResourceType = generic(
    "policy",
    "v1",
    "PodDisruptionBudget",
    "poddisruptionbudgets",
    "poddisruptionbudget",
    true,
    &["pdb"],
);
pub(crate) static CLUSTERROLES: ResourceType = generic(
    "rbac.authorization.k8s.io",
    "v1",
    "ClusterRole",
    "clusterroles",
    "clusterrole",
    false,
    &[],
);
pub(crate) static CLUSTERROLEBINDINGS: ResourceType = generic(
    "rbac.authorization.k8s.io",
    "v1",
    "ClusterRoleBinding",
    "clusterrolebindings",
    "clusterrolebinding",
    false,
    &[],
);
pub(crate) static ROLES: ResourceType = generic(
    "rbac.authorization.k8s.io",
    "v1",
    "Role",
    "roles",
    "role",
    true,
    &[],
);
pub(crate) static ROLEBINDINGS: ResourceType = generic(
    "rbac.authorization.k8s.io",
    "v1",
    "RoleBinding",
    "rolebindings",
    "rolebinding",
    true,
    &[],
);
/// `storage.k8s.io/v1` VolumeAttachments, cluster-scoped, as every kube-apiserver serves
/// them (`pkg/apis/storage`); the simulated attach/detach controller (`cluster/volumes.rs`)
/// creates one for each CSI volume a pod on a node uses, and a client may create its own.
pub(crate) static VOLUMEATTACHMENTS: ResourceType = generic(
    STORAGE_GROUP,
    "v1",
    "VolumeAttachment",
    "volumeattachments",
    "volumeattachment",
    false,
    &[],
);

/// CustomResourceDefinitions (apiextensions-apiserver): stored like any object; once one is
/// Established ([`crate::sim::kube::cluster`]'s establishing controller) its kinds are served
/// as [`custom`] types.
pub(crate) static CRDS: ResourceType = generic(
    APIEXTENSIONS_GROUP,
    "v1",
    "CustomResourceDefinition",
    "customresourcedefinitions",
    "customresourcedefinition",
    false,
    &["crd", "crds"],
);

pub(crate) static FLOWSCHEMAS: ResourceType = generic(
    FLOWCONTROL_GROUP,
    "v1",
    "FlowSchema",
    "flowschemas",
    "flowschema",
    false,
    &[],
);
pub(crate) static PRIORITYLEVELS: ResourceType = generic(
    FLOWCONTROL_GROUP,
    "v1",
    "PriorityLevelConfiguration",
    "prioritylevelconfigurations",
    "prioritylevelconfiguration",
    false,
    &[],
);

/// The API Priority and Fairness group, the one whose deprecated beta versions a default
/// kube-apiserver still served in 1.29–1.31 (see [`crate::api_lifecycle::served_by_default`]).
pub(crate) const FLOWCONTROL_GROUP: &str = "flowcontrol.apiserver.k8s.io";

/// Older group-versions of stored resource types: served (with the deprecation warning) on
/// the minors whose default kube-apiserver serves them
/// ([`crate::api_lifecycle::served_by_default`]), stored as their [`ALL`] type with the same
/// group and plural (the apiserver converts between versions; these kinds' schemas only
/// differ in fields the simulator does not interpret).
pub(crate) static OLDER_VERSIONS: &[&ResourceType] = &[
    &generic(
        FLOWCONTROL_GROUP,
        "v1beta1",
        "FlowSchema",
        "flowschemas",
        "flowschema",
        false,
        &[],
    ),
    &generic(
        FLOWCONTROL_GROUP,
        "v1beta1",
        "PriorityLevelConfiguration",
        "prioritylevelconfigurations",
        "prioritylevelconfiguration",
        false,
        &[],
    ),
    &generic(
        FLOWCONTROL_GROUP,
        "v1beta2",
        "FlowSchema",
        "flowschemas",
        "flowschema",
        false,
        &[],
    ),
    &generic(
        FLOWCONTROL_GROUP,
        "v1beta2",
        "PriorityLevelConfiguration",
        "prioritylevelconfigurations",
        "prioritylevelconfiguration",
        false,
        &[],
    ),
    &generic(
        FLOWCONTROL_GROUP,
        "v1beta3",
        "FlowSchema",
        "flowschemas",
        "flowschema",
        false,
        &[],
    ),
    &generic(
        FLOWCONTROL_GROUP,
        "v1beta3",
        "PriorityLevelConfiguration",
        "prioritylevelconfigurations",
        "prioritylevelconfiguration",
        false,
        &[],
    ),
];

/// Every served resource type, in discovery order.
pub(crate) static ALL: &[&ResourceType] = &[
    &NAMESPACES,
    &NODES,
    &PODS,
    &CONFIGMAPS,
    &SECRETS,
    &SERVICEACCOUNTS,
    &SERVICES,
    &DEPLOYMENTS,
    &DAEMONSETS,
    &STATEFULSETS,
    &REPLICASETS,
    &ENDPOINTSLICES,
    &PDBS,
    &CLUSTERROLES,
    &CLUSTERROLEBINDINGS,
    &ROLES,
    &ROLEBINDINGS,
    &FLOWSCHEMAS,
    &PRIORITYLEVELS,
    &CRDS,
    &VOLUMEATTACHMENTS,
    &JOBS,
    &PERSISTENTVOLUMES,
    &PERSISTENTVOLUMECLAIMS,
];

/// Groups other than the core group, each with its single (preferred) version.
const GROUPS: &[(&str, &str)] = &[
    (APIEXTENSIONS_GROUP, "v1"),
    ("apps", "v1"),
    ("authorization.k8s.io", "v1"),
    (BATCH_GROUP, "v1"),
    (DISCOVERY_GROUP, "v1"),
    (FLOWCONTROL_GROUP, "v1"),
    ("policy", "v1"),
    ("rbac.authorization.k8s.io", "v1"),
    (STORAGE_GROUP, "v1"),
];

/// The group of CustomResourceDefinitions.
pub(crate) const APIEXTENSIONS_GROUP: &str = "apiextensions.k8s.io";

/// The group of Jobs.
pub(crate) const BATCH_GROUP: &str = "batch";

/// The group of VolumeAttachments.
pub(crate) const STORAGE_GROUP: &str = "storage.k8s.io";

/// The group of EndpointSlices.
pub(crate) const DISCOVERY_GROUP: &str = "discovery.k8s.io";

/// The group of `SelfSubjectAccessReview`s (create-only, answered, never stored).
pub(crate) const AUTHORIZATION_GROUP: &str = "authorization.k8s.io";

/// The resource type served at `group/version/plural` by a kube-apiserver of `minor` with the
/// established custom types `custom`, if any.
pub(crate) fn lookup(
    group: &str,
    version: &str,
    plural: &str,
    minor: Minor,
    custom: &[&'static ResourceType],
) -> Option<&'static ResourceType> {
    served(minor)
        .chain(custom.iter().copied())
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource type for an `apiVersion` + `kind` pair (stored versions, and every custom
/// type any CustomResourceDefinition of this process defined).
pub(crate) fn by_kind(api_version: &str, kind: &str) -> Option<&'static ResourceType> {
    ALL.iter()
        .copied()
        .chain(interned())
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

/// The identity of a custom type: what a CRD's `spec` says about one served version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CustomType {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
}

static CUSTOM_TYPES: std::sync::Mutex<Vec<&'static ResourceType>> =
    std::sync::Mutex::new(Vec::new());

#[allow(
    clippy::expect_used,
    reason = "a poisoned registry lock means a thread panicked while pushing one entry"
)]
fn interned() -> Vec<&'static ResourceType> {
    CUSTOM_TYPES.lock().expect("custom type registry").clone()
}

/// The `&'static` resource type of a custom type. Resource types are `'static` everywhere in
/// the simulator (routing, store keys), so each distinct definition is leaked once and
/// reused: the registry grows with the number of distinct CRD versions a process ever
/// serves, not with requests.
#[allow(
    clippy::expect_used,
    reason = "a poisoned registry lock means a thread panicked while pushing one entry"
)]
pub(crate) fn custom(t: &CustomType) -> &'static ResourceType {
    let mut reg = CUSTOM_TYPES.lock().expect("custom type registry");
    if let Some(found) = reg.iter().find(|r| {
        r.group == t.group
            && r.version == t.version
            && r.kind == t.kind
            && r.plural == t.plural
            && r.singular == t.singular
            && r.namespaced == t.namespaced
    }) {
        return found;
    }
    let leak = |s: &str| -> &'static str { Box::leak(s.to_string().into_boxed_str()) };
    let rt: &'static ResourceType = Box::leak(Box::new(ResourceType {
        group: leak(&t.group),
        version: leak(&t.version),
        kind: leak(&t.kind),
        plural: leak(&t.plural),
        singular: leak(&t.singular),
        namespaced: t.namespaced,
        short_names: &[],
        categories: &[],
        subresources: &[],
        owner: Owner::Generic,
    }));
    reg.push(rt);
    rt
}

/// The stored type an older version of a resource converts to (itself for a stored type).
pub(crate) fn storage_of(rt: &'static ResourceType) -> &'static ResourceType {
    ALL.iter()
        .copied()
        .find(|r| r.group == rt.group && r.plural == rt.plural)
        .unwrap_or(rt)
}

/// The lifecycle row of `rt` when a kube-apiserver of `minor` serves it deprecated (its
/// requests then draw the deprecation warning and set `apiserver_requested_deprecated_apis`).
pub(crate) fn deprecation(rt: &ResourceType, minor: Minor) -> Option<ApiLifecycle> {
    api_lifecycle::served_by_default(minor)
        .into_iter()
        .find(|l| {
            l.group == rt.group
                && l.version == rt.version
                && l.resource == rt.plural
                && l.deprecated_in(minor)
        })
}

/// Every resource type a kube-apiserver of `minor` serves: the stored types, plus the older
/// versions its default configuration still serves.
pub(crate) fn served(minor: Minor) -> impl Iterator<Item = &'static ResourceType> {
    let older = api_lifecycle::served_by_default(minor);
    ALL.iter()
        .copied()
        .chain(OLDER_VERSIONS.iter().copied().filter(move |r| {
            older
                .iter()
                .any(|l| l.group == r.group && l.version == r.version && l.resource == r.plural)
        }))
}

/// The versions of `group` served on `minor`, preferred (stored) first.
fn versions_of(group: &str, minor: Minor, custom: &[&'static ResourceType]) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in served(minor)
        .chain(custom.iter().copied())
        .filter(|r| r.group == group)
    {
        if !out.contains(&r.version) {
            out.push(r.version);
        }
    }
    if let Some((_, v)) = GROUPS.iter().find(|(g, _)| *g == group)
        && !out.contains(v)
    {
        out.insert(0, v);
    }
    out
}

/// Whether `group/version` is served at all by a kube-apiserver of `minor`.
pub(crate) fn group_version_exists(
    group: &str,
    version: &str,
    minor: Minor,
    custom: &[&'static ResourceType],
) -> bool {
    if group.is_empty() {
        return version == "v1";
    }
    versions_of(group, minor, custom).contains(&version)
}

/// `GET /api`: `APIVersions`.
pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            { "clientCIDR": "0.0.0.0/0", "serverAddress": server_address }
        ]
    })
}

/// An `APIGroup`: every served version, the stored one preferred (as the apiserver lists a
/// group's versions, preferred first).
fn group_doc(
    group: &str,
    preferred: &str,
    minor: Minor,
    custom: &[&'static ResourceType],
) -> Value {
    let gv = |v: &str| json!({ "groupVersion": format!("{group}/{v}"), "version": v });
    let versions: Vec<Value> = versions_of(group, minor, custom)
        .into_iter()
        .map(gv)
        .collect();
    json!({
        "name": group,
        "versions": versions,
        "preferredVersion": gv(preferred),
    })
}

/// The groups served, each with its preferred version: the built-in ones, then those only
/// custom types serve (the first served version of a CRD preferred, as apiextensions'
/// discovery controller orders them by the CRD's version priority).
fn groups(custom: &[&'static ResourceType]) -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = GROUPS.to_vec();
    for r in custom {
        if !out.iter().any(|(g, _)| *g == r.group) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// `GET /apis`: `APIGroupList`.
pub(crate) fn group_list(minor: Minor, custom: &[&'static ResourceType]) -> Value {
    let groups: Vec<Value> = groups(custom)
        .iter()
        .map(|(g, v)| group_doc(g, v, minor, custom))
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

/// `GET /apis/<group>`: `APIGroup`.
pub(crate) fn group(name: &str, minor: Minor, custom: &[&'static ResourceType]) -> Option<Value> {
    groups(custom)
        .iter()
        .find(|(g, _)| *g == name)
        .map(|(g, v)| {
            let mut doc = group_doc(g, v, minor, custom);
            doc["kind"] = json!("APIGroup");
            doc["apiVersion"] = json!("v1");
            doc
        })
}

/// `GET /api/v1` or `/apis/<group>/<version>`: `APIResourceList`.
pub(crate) fn resource_list(
    group: &str,
    version: &str,
    minor: Minor,
    custom: &[&'static ResourceType],
) -> Value {
    let mut resources = Vec::new();
    for r in served(minor)
        .chain(custom.iter().copied())
        .filter(|r| r.group == group && r.version == version)
    {
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": VERBS,
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        resources.push(entry);
        for sub in r.subresources {
            let mut entry = json!({
                "name": format!("{}/{}", r.plural, sub.name),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": sub.kind,
                "verbs": sub.verbs,
            });
            if !sub.group.is_empty() || !sub.version.is_empty() {
                entry["group"] = json!(sub.group);
                entry["version"] = json!(sub.version);
            }
            resources.push(entry);
        }
    }
    if group == AUTHORIZATION_GROUP && version == "v1" {
        resources.push(json!({
            "name": "selfsubjectaccessreviews",
            "singularName": "selfsubjectaccessreview",
            "namespaced": false,
            "kind": "SelfSubjectAccessReview",
            "verbs": ["create"],
        }));
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_resource_list_advertises_policy_v1_eviction() {
        let list = resource_list("", "v1", (1, 33), &[]);
        let eviction = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods/eviction")
            .expect("pods/eviction advertised");
        // kubectl drain (CheckEvictionSupport) needs exactly these to use policy/v1 Evictions.
        assert_eq!(eviction["group"], "policy");
        assert_eq!(eviction["version"], "v1");
        assert_eq!(eviction["kind"], "Eviction");
    }

    #[test]
    fn every_group_of_a_resource_is_advertised() {
        for r in ALL {
            assert!(
                group_version_exists(r.group, r.version, (1, 33), &[]),
                "{}",
                r.qualified()
            );
            assert!(lookup(r.group, r.version, r.plural, (1, 33), &[]).is_some());
            assert!(by_kind(&r.api_version(), r.kind).is_some());
        }
    }

    #[test]
    fn discovery_follows_the_served_minor() {
        let fc = |m| group(FLOWCONTROL_GROUP, m, &[]).unwrap();
        let versions = |m| {
            fc(m)["versions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v["version"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(versions((1, 31)), ["v1", "v1beta3"]);
        assert_eq!(versions((1, 32)), ["v1"]);
        assert_eq!(fc((1, 31))["preferredVersion"]["version"], "v1");
        let list = resource_list(FLOWCONTROL_GROUP, "v1beta3", (1, 30), &[]);
        let names: Vec<&str> = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["flowschemas", "prioritylevelconfigurations"]);
        let older = lookup(FLOWCONTROL_GROUP, "v1beta3", "flowschemas", (1, 31), &[]).unwrap();
        assert!(std::ptr::eq(storage_of(older), &FLOWSCHEMAS));
        assert!(deprecation(older, (1, 31)).is_some());
        assert!(
            deprecation(older, (1, 28)).is_none(),
            "deprecated from 1.29 on"
        );
        assert!(lookup(FLOWCONTROL_GROUP, "v1beta3", "flowschemas", (1, 32), &[]).is_none());
    }
}
