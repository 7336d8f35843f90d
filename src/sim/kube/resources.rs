//! The resource types the simulated kube-apiserver serves, and the discovery documents built
//! from them (`/api`, `/api/v1`, `/apis`, `/apis/<group>`, `/apis/<group>/<version>`).
//!
//! One static table drives routing, discovery and the object store, so what discovery
//! advertises is exactly what the server implements.

use serde_json::{Value, json};

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
    subresources: &[Subresource {
        name: "eviction",
        group: "policy",
        version: "v1",
        kind: "Eviction",
        verbs: &["create"],
    }],
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
    &PDBS,
    &CLUSTERROLES,
    &CLUSTERROLEBINDINGS,
    &ROLES,
    &ROLEBINDINGS,
];

/// Groups other than the core group, each with its single (preferred) version.
const GROUPS: &[(&str, &str)] = &[
    ("apps", "v1"),
    ("authorization.k8s.io", "v1"),
    ("policy", "v1"),
    ("rbac.authorization.k8s.io", "v1"),
];

/// The group of `SelfSubjectAccessReview`s (create-only, answered, never stored).
pub(crate) const AUTHORIZATION_GROUP: &str = "authorization.k8s.io";

/// The resource type served at `group/version/plural`, if any.
pub(crate) fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    ALL.iter()
        .copied()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource type for an `apiVersion` + `kind` pair.
pub(crate) fn by_kind(api_version: &str, kind: &str) -> Option<&'static ResourceType> {
    ALL.iter()
        .copied()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

/// Whether `group/version` is served at all.
pub(crate) fn group_version_exists(group: &str, version: &str) -> bool {
    if group.is_empty() {
        return version == "v1";
    }
    GROUPS.iter().any(|(g, v)| *g == group && *v == version)
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

fn group_doc(group: &str, version: &str) -> Value {
    let gv = json!({ "groupVersion": format!("{group}/{version}"), "version": version });
    json!({
        "name": group,
        "versions": [gv.clone()],
        "preferredVersion": gv,
    })
}

/// `GET /apis`: `APIGroupList`.
pub(crate) fn group_list() -> Value {
    let groups: Vec<Value> = GROUPS.iter().map(|(g, v)| group_doc(g, v)).collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

/// `GET /apis/<group>`: `APIGroup`.
pub(crate) fn group(name: &str) -> Option<Value> {
    GROUPS.iter().find(|(g, _)| *g == name).map(|(g, v)| {
        let mut doc = group_doc(g, v);
        doc["kind"] = json!("APIGroup");
        doc["apiVersion"] = json!("v1");
        doc
    })
}

/// `GET /api/v1` or `/apis/<group>/<version>`: `APIResourceList`.
pub(crate) fn resource_list(group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for r in ALL
        .iter()
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
            resources.push(json!({
                "name": format!("{}/{}", r.plural, sub.name),
                "singularName": "",
                "namespaced": r.namespaced,
                "group": sub.group,
                "version": sub.version,
                "kind": sub.kind,
                "verbs": sub.verbs,
            }));
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
        let list = resource_list("", "v1");
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
                group_version_exists(r.group, r.version),
                "{}",
                r.qualified()
            );
            assert!(lookup(r.group, r.version, r.plural).is_some());
            assert!(by_kind(&r.api_version(), r.kind).is_some());
        }
    }
}
