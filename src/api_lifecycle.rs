//! The lifecycle of built-in Kubernetes APIs: which group-version of a resource is deprecated
//! in which minor, removed in which, and what replaces it; and the warning text the
//! kube-apiserver sends for a deprecated one.
//!
//! **Owns:** the built-in removal table and the deprecation warning text.
//! **May depend on:** the `api_lifecycle` row of design/architecture.md's code map: nothing
//! (plain data; the planner reads it for preflight findings, the application layer to know
//! which objects to inspect, the simulator to serve exactly what a real apiserver serves).
//!
//! Source: the `APILifecycleDeprecated/Removed/Replacement` functions of
//! `k8s.io/api/<group>/<version>/zz_generated.prerelease-lifecycle.go` (kubernetes/api @ 10b39a3
//! and tags v0.24.0–v0.36.0), cross-checked with the Deprecated API Migration Guide
//! (<https://kubernetes.io/docs/reference/using-api/deprecation-guide/>). Only beta versions
//! that a real cluster serves are listed (alpha versions are off by default). The warning
//! text follows `k8s.io/apiserver/pkg/endpoints/deprecation.WarningMessage` (@ 95f0849).

/// A Kubernetes minor release line, `(major, minor)`: `(1, 32)` is v1.32.
pub type Minor = (u64, u64);

/// One resource's group-version and its lifecycle.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiLifecycle {
    /// API group; `""` is the core group.
    pub group: String,
    pub version: String,
    /// Resource, plural and lower case (`flowschemas`).
    pub resource: String,
    /// Kind (`FlowSchema`).
    pub kind: String,
    /// First minor that marks it deprecated.
    pub deprecated: Minor,
    /// First minor that no longer serves it.
    pub removed: Minor,
    /// What to use instead, as `group/version Kind`; `None` when nothing replaces it.
    pub replacement: Option<String>,
}

impl ApiLifecycle {
    /// `group/version` as written in `apiVersion` (`v1` alone for the core group).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether a kube-apiserver of `minor` still serves this group-version (removed APIs are
    /// not served from their removal release on; `pkg/server/deleted_kinds.go`).
    pub fn served_in(&self, minor: Minor) -> bool {
        minor < self.removed
    }

    /// Whether requests to it draw a deprecation warning from a kube-apiserver of `minor`.
    pub fn deprecated_in(&self, minor: Minor) -> bool {
        minor >= self.deprecated
    }

    /// The apiserver's warning text: `flowcontrol.apiserver.k8s.io/v1beta3 FlowSchema is
    /// deprecated in v1.29+, unavailable in v1.32+; use flowcontrol.apiserver.k8s.io/v1 FlowSchema`.
    pub fn warning(&self) -> String {
        let mut msg = format!(
            "{} {} is deprecated in v{}.{}+, unavailable in v{}.{}+",
            self.api_version(),
            self.kind,
            self.deprecated.0,
            self.deprecated.1,
            self.removed.0,
            self.removed.1
        );
        if let Some(r) = &self.replacement {
            msg.push_str("; use ");
            msg.push_str(r);
        }
        msg
    }

    /// The `removed_release` label of `apiserver_requested_deprecated_apis` (`1.32`).
    pub fn removed_release(&self) -> String {
        format!("{}.{}", self.removed.0, self.removed.1)
    }
}

/// (group, version, resource, kind, deprecated, removed, replacement)
type Row = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Minor,
    Minor,
    Option<&'static str>,
);

const BUILTIN: &[Row] = &[
    (
        "batch",
        "v1beta1",
        "cronjobs",
        "CronJob",
        (1, 21),
        (1, 25),
        Some("batch/v1 CronJob"),
    ),
    (
        "discovery.k8s.io",
        "v1beta1",
        "endpointslices",
        "EndpointSlice",
        (1, 21),
        (1, 25),
        Some("discovery.k8s.io/v1 EndpointSlice"),
    ),
    (
        "events.k8s.io",
        "v1beta1",
        "events",
        "Event",
        (1, 22),
        (1, 25),
        Some("events.k8s.io/v1 Event"),
    ),
    (
        "autoscaling",
        "v2beta1",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        (1, 22),
        (1, 25),
        Some("autoscaling/v2 HorizontalPodAutoscaler"),
    ),
    (
        "policy",
        "v1beta1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        (1, 21),
        (1, 25),
        Some("policy/v1 PodDisruptionBudget"),
    ),
    (
        "policy",
        "v1beta1",
        "podsecuritypolicies",
        "PodSecurityPolicy",
        (1, 21),
        (1, 25),
        None,
    ),
    (
        "node.k8s.io",
        "v1beta1",
        "runtimeclasses",
        "RuntimeClass",
        (1, 22),
        (1, 25),
        Some("node.k8s.io/v1 RuntimeClass"),
    ),
    (
        "autoscaling",
        "v2beta2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        (1, 23),
        (1, 26),
        Some("autoscaling/v2 HorizontalPodAutoscaler"),
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        "v1beta1",
        "flowschemas",
        "FlowSchema",
        (1, 23),
        (1, 26),
        Some("flowcontrol.apiserver.k8s.io/v1beta3 FlowSchema"),
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        "v1beta1",
        "prioritylevelconfigurations",
        "PriorityLevelConfiguration",
        (1, 23),
        (1, 26),
        Some("flowcontrol.apiserver.k8s.io/v1beta3 PriorityLevelConfiguration"),
    ),
    (
        "storage.k8s.io",
        "v1beta1",
        "csistoragecapacities",
        "CSIStorageCapacity",
        (1, 24),
        (1, 27),
        Some("storage.k8s.io/v1 CSIStorageCapacity"),
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        "v1beta2",
        "flowschemas",
        "FlowSchema",
        (1, 26),
        (1, 29),
        Some("flowcontrol.apiserver.k8s.io/v1beta3 FlowSchema"),
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        "v1beta2",
        "prioritylevelconfigurations",
        "PriorityLevelConfiguration",
        (1, 26),
        (1, 29),
        Some("flowcontrol.apiserver.k8s.io/v1beta3 PriorityLevelConfiguration"),
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        "v1beta3",
        "flowschemas",
        "FlowSchema",
        (1, 29),
        (1, 32),
        Some("flowcontrol.apiserver.k8s.io/v1 FlowSchema"),
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        "v1beta3",
        "prioritylevelconfigurations",
        "PriorityLevelConfiguration",
        (1, 29),
        (1, 32),
        Some("flowcontrol.apiserver.k8s.io/v1 PriorityLevelConfiguration"),
    ),
    (
        "authentication.k8s.io",
        "v1beta1",
        "selfsubjectreviews",
        "SelfSubjectReview",
        (1, 30),
        (1, 33),
        Some("authentication.k8s.io/v1 SelfSubjectReview"),
    ),
    (
        "admissionregistration.k8s.io",
        "v1beta1",
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        (1, 31),
        (1, 34),
        Some("admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy"),
    ),
    (
        "admissionregistration.k8s.io",
        "v1beta1",
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
        (1, 31),
        (1, 34),
        Some("admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding"),
    ),
    (
        "networking.k8s.io",
        "v1beta1",
        "ipaddresses",
        "IPAddress",
        (1, 34),
        (1, 37),
        Some("networking.k8s.io/v1 IPAddress"),
    ),
    (
        "networking.k8s.io",
        "v1beta1",
        "servicecidrs",
        "ServiceCIDR",
        (1, 34),
        (1, 37),
        Some("networking.k8s.io/v1 ServiceCIDR"),
    ),
    (
        "storage.k8s.io",
        "v1beta1",
        "volumeattributesclasses",
        "VolumeAttributesClass",
        (1, 34),
        (1, 37),
        Some("storage.k8s.io/v1 VolumeAttributesClass"),
    ),
    (
        "resource.k8s.io",
        "v1beta1",
        "deviceclasses",
        "DeviceClass",
        (1, 35),
        (1, 38),
        Some("resource.k8s.io/v1 DeviceClass"),
    ),
    (
        "resource.k8s.io",
        "v1beta1",
        "resourceclaims",
        "ResourceClaim",
        (1, 35),
        (1, 38),
        Some("resource.k8s.io/v1 ResourceClaim"),
    ),
    (
        "resource.k8s.io",
        "v1beta1",
        "resourceclaimtemplates",
        "ResourceClaimTemplate",
        (1, 35),
        (1, 38),
        Some("resource.k8s.io/v1 ResourceClaimTemplate"),
    ),
    (
        "resource.k8s.io",
        "v1beta1",
        "resourceslices",
        "ResourceSlice",
        (1, 35),
        (1, 38),
        Some("resource.k8s.io/v1 ResourceSlice"),
    ),
    (
        "resource.k8s.io",
        "v1beta2",
        "deviceclasses",
        "DeviceClass",
        (1, 36),
        (1, 39),
        Some("resource.k8s.io/v1 DeviceClass"),
    ),
    (
        "resource.k8s.io",
        "v1beta2",
        "resourceclaims",
        "ResourceClaim",
        (1, 36),
        (1, 39),
        Some("resource.k8s.io/v1 ResourceClaim"),
    ),
    (
        "resource.k8s.io",
        "v1beta2",
        "resourceclaimtemplates",
        "ResourceClaimTemplate",
        (1, 36),
        (1, 39),
        Some("resource.k8s.io/v1 ResourceClaimTemplate"),
    ),
    (
        "resource.k8s.io",
        "v1beta2",
        "resourceslices",
        "ResourceSlice",
        (1, 36),
        (1, 39),
        Some("resource.k8s.io/v1 ResourceSlice"),
    ),
    (
        "storagemigration.k8s.io",
        "v1beta1",
        "storageversionmigrations",
        "StorageVersionMigration",
        (1, 37),
        (1, 40),
        Some("storagemigration.k8s.io/v1 StorageVersionMigration"),
    ),
    (
        "admissionregistration.k8s.io",
        "v1beta1",
        "mutatingadmissionpolicies",
        "MutatingAdmissionPolicy",
        (1, 37),
        (1, 40),
        Some("admissionregistration.k8s.io/v1 MutatingAdmissionPolicy"),
    ),
    (
        "admissionregistration.k8s.io",
        "v1beta1",
        "mutatingadmissionpolicybindings",
        "MutatingAdmissionPolicyBinding",
        (1, 37),
        (1, 40),
        Some("admissionregistration.k8s.io/v1 MutatingAdmissionPolicyBinding"),
    ),
    (
        "certificates.k8s.io",
        "v1beta1",
        "clustertrustbundles",
        "ClusterTrustBundle",
        (1, 37),
        (1, 40),
        Some("certificates.k8s.io/v1 ClusterTrustBundle"),
    ),
    // `coordination/v1beta1` LeaseCandidate: `+k8s:prerelease-lifecycle-gen:introduced=1.33`,
    // so prerelease-lifecycle-gen's defaults deprecate it three minors later and remove it
    // three after that; off by default (KEP-3136), no GA version yet.
    (
        "coordination.k8s.io",
        "v1beta1",
        "leasecandidates",
        "LeaseCandidate",
        (1, 36),
        (1, 39),
        None,
    ),
    (
        "certificates.k8s.io",
        "v1beta1",
        "podcertificaterequests",
        "PodCertificateRequest",
        (1, 37),
        (1, 40),
        Some("certificates.k8s.io/v1 PodCertificateRequest"),
    ),
];

/// An alpha resource a Kubernetes minor stops serving, whose remaining objects make
/// `talosctl upgrade-k8s` refuse the upgrade into that minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemovedAlpha {
    pub group: &'static str,
    pub version: &'static str,
    /// Plural, lower case.
    pub resource: &'static str,
    pub kind: &'static str,
    /// Whether its objects live in namespaces.
    pub namespaced: bool,
    /// The first minor that no longer serves it.
    pub removed: Minor,
    /// The Kubernetes pull request that removed it.
    pub pull: &'static str,
}

impl RemovedAlpha {
    /// `clustercidrs.v1alpha1.networking.k8s.io`, as go-kubernetes names it
    /// (`schema.ParseResourceArg`).
    pub fn resource_arg(&self) -> String {
        format!("{}.{}.{}", self.resource, self.version, self.group)
    }

    /// `networking.k8s.io/v1alpha1`.
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }
}

/// go-kubernetes `kubernetes/upgrade/checks.go` (`removedAPIResources` of each
/// `"1.N->1.N+1"` step): alpha resources whose objects `upgrade-k8s` lists before moving the
/// apiserver into `removed`, refusing the upgrade while any exist. Alpha versions are served
/// only when `--runtime-config` enables them, so a cluster that never did answers 404 (no
/// objects).
pub const REMOVED_ALPHA: &[RemovedAlpha] = &[
    RemovedAlpha {
        group: "networking.k8s.io",
        version: "v1alpha1",
        resource: "clustercidrs",
        kind: "ClusterCIDR",
        namespaced: false,
        removed: (1, 29),
        pull: "kubernetes/kubernetes#121229",
    },
    RemovedAlpha {
        group: "resource.k8s.io",
        version: "v1alpha3",
        resource: "podschedulingcontexts",
        kind: "PodSchedulingContext",
        namespaced: true,
        removed: (1, 32),
        pull: "kubernetes/kubernetes#128003",
    },
    RemovedAlpha {
        group: "scheduling.k8s.io",
        version: "v1alpha2",
        resource: "workloads",
        kind: "Workload",
        namespaced: true,
        removed: (1, 37),
        pull: "kubernetes/kubernetes#138572",
    },
    RemovedAlpha {
        group: "scheduling.k8s.io",
        version: "v1alpha2",
        resource: "podgroups",
        kind: "PodGroup",
        namespaced: true,
        removed: (1, 37),
        pull: "kubernetes/kubernetes#138572",
    },
];

/// The built-in table, in a stable order (group, version, resource).
pub fn builtin() -> Vec<ApiLifecycle> {
    let mut rows: Vec<ApiLifecycle> = BUILTIN
        .iter()
        .map(
            |&(group, version, resource, kind, deprecated, removed, replacement)| ApiLifecycle {
                group: group.to_string(),
                version: version.to_string(),
                resource: resource.to_string(),
                kind: kind.to_string(),
                deprecated,
                removed,
                replacement: replacement.map(str::to_string),
            },
        )
        .collect();
    rows.sort();
    rows
}

/// The row for `group`/`version`/`resource` in `table`, if any.
pub fn lookup<'t>(
    table: &'t [ApiLifecycle],
    group: &str,
    version: &str,
    resource: &str,
) -> Option<&'t ApiLifecycle> {
    table
        .iter()
        .find(|r| r.group == group && r.version == version && r.resource == resource)
}

/// Group-versions of the built-in table that a default kube-apiserver of `minor` serves.
/// KEP-3136 turned *new* beta APIs off by default from 1.24: every beta of the table removed
/// by 1.32 was on by default (introduced before 1.24, or the `flowcontrol.apiserver.k8s.io/v1beta3`
/// exception, `legacyBetaEnabledByDefaultResources` in `pkg/controlplane/instance.go`); every
/// later one is off unless `--runtime-config` enables it.
pub fn served_by_default(minor: Minor) -> Vec<ApiLifecycle> {
    builtin()
        .into_iter()
        .filter(|r| r.served_in(minor) && r.removed <= (1, 32))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warning_matches_the_apiserver_text() {
        let t = builtin();
        let fs = lookup(&t, "flowcontrol.apiserver.k8s.io", "v1beta3", "flowschemas").unwrap();
        assert_eq!(
            fs.warning(),
            "flowcontrol.apiserver.k8s.io/v1beta3 FlowSchema is deprecated in v1.29+, \
             unavailable in v1.32+; use flowcontrol.apiserver.k8s.io/v1 FlowSchema"
        );
        assert_eq!(fs.removed_release(), "1.32");
        let psp = lookup(&t, "policy", "v1beta1", "podsecuritypolicies").unwrap();
        assert_eq!(
            psp.warning(),
            "policy/v1beta1 PodSecurityPolicy is deprecated in v1.21+, unavailable in v1.25+"
        );
    }

    #[test]
    fn served_and_deprecated_follow_the_release_lines() {
        let t = builtin();
        let fs = lookup(&t, "flowcontrol.apiserver.k8s.io", "v1beta3", "flowschemas").unwrap();
        assert!(fs.served_in((1, 31)) && !fs.served_in((1, 32)));
        assert!(!fs.deprecated_in((1, 28)) && fs.deprecated_in((1, 29)));
        let names = |m| {
            served_by_default(m)
                .into_iter()
                .map(|r| format!("{}/{}", r.api_version(), r.resource))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names((1, 30)),
            [
                "flowcontrol.apiserver.k8s.io/v1beta3/flowschemas",
                "flowcontrol.apiserver.k8s.io/v1beta3/prioritylevelconfigurations"
            ]
        );
        assert!(names((1, 32)).is_empty());
        assert!(
            names((1, 26)).contains(&"storage.k8s.io/v1beta1/csistoragecapacities".to_string())
        );
        assert!(
            names((1, 26))
                .contains(&"flowcontrol.apiserver.k8s.io/v1beta2/flowschemas".to_string())
        );
        assert!(
            !names((1, 26))
                .contains(&"flowcontrol.apiserver.k8s.io/v1beta1/flowschemas".to_string())
        );
    }

    /// Issue #33 item 8: the beta `LeaseCandidate` (introduced 1.33, off by default) is in the
    /// table with prerelease-lifecycle-gen's defaults, so a 1.39 target is refused while a
    /// cluster still has its objects, and the warning says what the apiserver says.
    #[test]
    fn lease_candidate_v1beta1_is_deprecated_in_1_36_and_gone_in_1_39() {
        let t = builtin();
        let lc = lookup(&t, "coordination.k8s.io", "v1beta1", "leasecandidates")
            .expect("coordination.k8s.io/v1beta1 leasecandidates is in the table");
        assert_eq!(lc.kind, "LeaseCandidate");
        assert!(!lc.deprecated_in((1, 35)) && lc.deprecated_in((1, 36)));
        assert!(lc.served_in((1, 38)) && !lc.served_in((1, 39)));
        assert_eq!(lc.removed_release(), "1.39");
        assert_eq!(
            lc.warning(),
            "coordination.k8s.io/v1beta1 LeaseCandidate is deprecated in v1.36+, unavailable in v1.39+"
        );
        // Beta after KEP-3136: not served unless `--runtime-config` enables it.
        assert!(
            !served_by_default((1, 36))
                .iter()
                .any(|r| r.resource == "leasecandidates")
        );
    }

    #[test]
    fn every_row_is_deprecated_before_it_is_removed_and_unique() {
        let t = builtin();
        for r in &t {
            assert!(r.deprecated < r.removed, "{r:?}");
            assert_eq!(
                t.iter()
                    .filter(|o| (&o.group, &o.version, &o.resource)
                        == (&r.group, &r.version, &r.resource))
                    .count(),
                1
            );
        }
    }
}
