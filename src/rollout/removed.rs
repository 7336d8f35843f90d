//! Kubernetes upgrade checks: command-line flags, feature gates and admission plugins that the
//! target minor removed, found in the `extraArgs` a node's machine configuration gives its
//! components. A component started with one of them does not start, so the Kubernetes step
//! stops before it touches a node.
//!
//! The table follows `upgrade-k8s`'s checks (siderolabs/go-kubernetes
//! `kubernetes/upgrade/checks.go`, `NewChecks` → `upgradeVersionCheck`, keyed there by the path
//! `"1.(N-1)->1.N"`; here by the target minor N since a Kubernetes step moves one minor), which
//! cite the Kubernetes changelogs and the feature-gates-removed page. Upstream reads the
//! rendered `StaticPods` commands and `KubeletSpec.args`; medea reads the machine
//! configuration that renders them (the same flags, before Talos adds its defaults).
//! Deliberate superset: upstream checks feature gates on the three control-plane components
//! only; medea also checks the kubelet's `feature-gates`, which fails the same way.
//!
//! Pure: no I/O. Unit-tested below.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::ports::Component;
use crate::version::KubeVersion;

/// Flags of each component as its machine configuration sets them (`extraArgs`): flag name
/// without the leading `--` → value.
pub type ComponentArgs = BTreeMap<Component, BTreeMap<String, String>>;

/// What a target minor removed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Removals {
    /// kube-apiserver flags.
    pub api_server_flags: &'static [&'static str],
    /// kube-controller-manager flags.
    pub controller_manager_flags: &'static [&'static str],
    /// kube-scheduler flags.
    pub scheduler_flags: &'static [&'static str],
    /// kubelet flags.
    pub kubelet_flags: &'static [&'static str],
    /// Admission plugins (`--enable-admission-plugins` of kube-apiserver).
    pub admission_plugins: &'static [&'static str],
    /// Feature gates (`--feature-gates`), common to all components.
    pub feature_gates: &'static [&'static str],
}

const NONE: Removals = Removals {
    api_server_flags: &[],
    controller_manager_flags: &[],
    scheduler_flags: &[],
    kubelet_flags: &[],
    admission_plugins: &[],
    feature_gates: &[],
};

/// What Kubernetes 1.`minor` removed (relative to 1.`minor-1`). Minors without an entry
/// removed nothing a flag can name (1.29 removed only an API version).
pub fn removed_in(minor: u64) -> Removals {
    match minor {
        25 => Removals {
            api_server_flags: &["service-account-api-audiences"],
            controller_manager_flags: &[
                "deleting-pods-qps",
                "deleting-pods-burst",
                "register-retry-count",
            ],
            admission_plugins: &["PodSecurityPolicy"],
            feature_gates: &[
                "CSIVolumeFSGroupPolicy",
                "ConfigurableFSGroupPolicy",
                "PodDisruptionBudget",
                "SelectorIndex",
            ],
            ..NONE
        },
        26 => Removals {
            api_server_flags: &["master-service-namespace"],
            feature_gates: &["DynamicKubeletConfig"],
            ..NONE
        },
        27 => Removals {
            controller_manager_flags: &["enable-taint-manager", "pod-eviction-timeout"],
            kubelet_flags: &["container-runtime", "master-service-namespace"],
            feature_gates: &[
                "ExpandCSIVolumes",
                "ExpandInUsePersistentVolumes",
                "ExpandPersistentVolumes",
                "ControllerManagerLeaderMigration",
                "CSIMigration",
                "CSIInlineVolume",
                "EphemeralContainers",
                "LocalStorageCapacityIsolation",
                "NetworkPolicyEndPort",
                "StatefulSetMinReadySeconds",
                "IdentifyPodOS",
                "DaemonSetUpdateSurge",
            ],
            ..NONE
        },
        28 => Removals {
            feature_gates: &[
                "AdvancedAuditing",
                "DelegateFSGroupToCSIDriver",
                "DevicePlugins",
                "DisableAcceleratorUsageMetrics",
                "EndpointSliceTerminatingCondition",
                "CSIStorageCapacity",
                "CSIMigrationGCE",
                "KubeletCredentialProviders",
                "MixedProtocolLBService",
                "ServiceInternalTrafficPolicy",
                "ServiceIPStaticSubrange",
                "WindowsHostProcessContainers",
            ],
            ..NONE
        },
        30 => Removals {
            admission_plugins: &["SecurityContextDeny"],
            feature_gates: &[
                "ExpandedDNSConfig",
                "ExperimentalHostUserNamespaceDefaultingGate",
                "IPTablesOwnershipCleanup",
                "KubeletPodResources",
                "KubeletPodResourcesGetAllocatable",
                "MinimizeIPTablesRestore",
                "ProxyTerminatingEndpoints",
                "RemoveSelfLink",
            ],
            ..NONE
        },
        31 => Removals {
            controller_manager_flags: &[
                "volume-host-cidr-denylist",
                "volume-host-allow-local-loopback",
                "horizontal-pod-autoscaler-upscale-delay",
                "horizontal-pod-autoscaler-downscale-delay",
            ],
            kubelet_flags: &[
                "keep-terminated-pod-volumes",
                "iptables-masquerade-bit",
                "iptables-drop-bit",
            ],
            feature_gates: &[
                "APIPriorityAndFairness",
                "CSINodeExpandSecret",
                "ConsistentHTTPGetHandlers",
                "DefaultHostNetworkHostPortsInPodTemplates",
                "ServiceNodePortStaticSubrange",
                "SkipReadOnlyValidationGCE",
            ],
            ..NONE
        },
        32 => Removals {
            feature_gates: &[
                "AllowServiceLBStatusOnNonLB",
                "CloudDualStackNodeIPs",
                "DRAControlPlaneController",
                "HPAContainerMetrics",
                "KMSv2",
                "KMSv2KDF",
                "LegacyServiceAccountTokenCleanUp",
                "MinDomainsInPodTopologySpread",
                "NewVolumeManagerReconstruction",
                "NodeOutOfServiceVolumeDetach",
                "ServerSideApply",
                "ServerSideFieldValidation",
                "StableLoadBalancerNodeSet",
                "ValidatingAdmissionPolicy",
                "ZeroLimitedNominalConcurrencyShares",
            ],
            ..NONE
        },
        33 => Removals {
            api_server_flags: &["cloud-config"],
            feature_gates: &[
                "AppArmor",
                "AppArmorFields",
                "CPUManager",
                "DisableCloudProviders",
                "DisableKubeletCloudCredentialProviders",
                "JobPodFailurePolicy",
                "KubeProxyDrainingTerminatingNodes",
                "PDBUnhealthyPodEvictionPolicy",
                "PersistentVolumeLastPhaseTransitionTime",
                "VolumeCapacityPriority",
            ],
            ..NONE
        },
        34 => Removals {
            kubelet_flags: &["cloud-config"],
            feature_gates: &[
                "DevicePluginCDIDevices",
                "LegacySidecarContainers",
                "PodDisruptionConditions",
            ],
            ..NONE
        },
        35 => Removals {
            kubelet_flags: &["pod-infra-container-image"],
            feature_gates: &[
                "SizeMemoryBackedVolumes",
                "UserNamespacesHostNetworkSupport",
            ],
            ..NONE
        },
        36 => Removals {
            feature_gates: &[
                "CSIMigrationPortworx",
                "HonorPVReclaimPolicy",
                "InTreePluginPortworxUnregister",
                "WatchFromStorageWithoutResourceVersion",
            ],
            ..NONE
        },
        // go-kubernetes 0caf1f2 ("add Kubernetes 1.37 compatibility"); upstream marks its 1.36
        // and 1.37 lists provisional until the release notes are final. The removed
        // `scheduling.k8s.io/v1alpha2` resources are an API check, not a flag (preflight).
        37 => Removals {
            // the deprecated cAdvisor flags (kubernetes/kubernetes#139870): the kubelet does
            // not start with any of them set
            kubelet_flags: &[
                "application-metrics-count-limit",
                "boot-id-file",
                "container-hints",
                "containerd",
                "containerd-namespace",
                "enable-load-reader",
                "event-storage-age-limit",
                "event-storage-event-limit",
                "global-housekeeping-interval",
                "log-cadvisor-usage",
                "machine-id-file",
                "storage-driver-user",
                "storage-driver-password",
                "storage-driver-host",
                "storage-driver-db",
                "storage-driver-table",
                "storage-driver-secure",
                "storage-driver-buffer-duration",
            ],
            feature_gates: &[
                "AnyVolumeDataSource",
                "DeclarativeValidationTakeover",
                "GangScheduling",
                "PreventStaticPodAPIReferences",
                "WorkloadAwarePreemption",
            ],
            ..NONE
        },
        _ => NONE,
    }
}

/// What kind of setting was removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RemovedKind {
    /// A command-line flag.
    Flag,
    /// A feature gate.
    FeatureGate,
    /// An admission plugin.
    AdmissionPlugin,
}

/// One removed setting a node's machine configuration still sets.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RemovedSetting {
    /// The node whose configuration sets it.
    pub node: String,
    /// The component.
    pub component: Component,
    /// Which kind of setting.
    pub kind: RemovedKind,
    /// The flag (without `--`), feature gate or admission plugin.
    pub name: String,
}

impl RemovedSetting {
    /// Where the machine configuration sets it.
    pub fn config_path(&self) -> &'static str {
        match self.component {
            Component::ApiServer => "cluster.apiServer.extraArgs",
            Component::ControllerManager => "cluster.controllerManager.extraArgs",
            Component::Scheduler => "cluster.scheduler.extraArgs",
            Component::Proxy => "cluster.proxy.extraArgs",
            Component::Kubelet => "machine.kubelet.extraArgs",
        }
    }
}

impl fmt::Display for RemovedSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            RemovedKind::Flag => format!("flag `--{}`", self.name),
            RemovedKind::FeatureGate => format!("feature gate `{}`", self.name),
            RemovedKind::AdmissionPlugin => format!("admission plugin `{}`", self.name),
        };
        write!(
            f,
            "{} on `{}`: {what} ({})",
            self.component,
            self.node,
            self.config_path()
        )
    }
}

/// The comma-separated names of a list flag (`A=true,B=false` → `A`, `B`).
fn list_names(value: &str) -> impl Iterator<Item = &str> {
    value
        .split(',')
        .map(|s| s.split('=').next().unwrap_or("").trim())
        .filter(|s| !s.is_empty())
}

/// The settings of `args` (one node's components) that Kubernetes `to` removed.
pub fn removed_settings(node: &str, args: &ComponentArgs, to: &KubeVersion) -> Vec<RemovedSetting> {
    let r = removed_in(to.minor());
    let mut out = Vec::new();
    let mut hit = |component, kind, name: &str| {
        out.push(RemovedSetting {
            node: node.to_string(),
            component,
            kind,
            name: name.to_string(),
        })
    };
    for (component, flags) in args {
        let removed_flags = match component {
            Component::ApiServer => r.api_server_flags,
            Component::ControllerManager => r.controller_manager_flags,
            Component::Scheduler => r.scheduler_flags,
            Component::Kubelet => r.kubelet_flags,
            Component::Proxy => &[],
        };
        for name in removed_flags {
            if flags.contains_key(*name) {
                hit(*component, RemovedKind::Flag, name);
            }
        }
        if *component == Component::Proxy {
            continue;
        }
        if let Some(gates) = flags.get("feature-gates") {
            for g in list_names(gates) {
                if r.feature_gates.contains(&g) {
                    hit(*component, RemovedKind::FeatureGate, g);
                }
            }
        }
        if *component == Component::ApiServer
            && let Some(plugins) = flags.get("enable-admission-plugins")
        {
            for p in list_names(plugins) {
                if r.admission_plugins.contains(&p) {
                    hit(*component, RemovedKind::AdmissionPlugin, p);
                }
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(s: &str) -> KubeVersion {
        KubeVersion::parse(s).unwrap()
    }

    fn args(entries: &[(Component, &[(&str, &str)])]) -> ComponentArgs {
        entries
            .iter()
            .map(|(c, flags)| {
                (
                    *c,
                    flags
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                )
            })
            .collect()
    }

    #[test]
    fn the_kubelet_pod_infra_container_image_flag_is_removed_in_1_35() {
        let a = args(&[(
            Component::Kubelet,
            &[("pod-infra-container-image", "registry.k8s.io/pause:3.10")],
        )]);
        let found = removed_settings("w-1", &a, &kv("v1.35.0"));
        assert_eq!(
            found,
            vec![RemovedSetting {
                node: "w-1".into(),
                component: Component::Kubelet,
                kind: RemovedKind::Flag,
                name: "pod-infra-container-image".into(),
            }]
        );
        assert_eq!(
            found[0].to_string(),
            "kubelet on `w-1`: flag `--pod-infra-container-image` (machine.kubelet.extraArgs)"
        );
        // still allowed by 1.34, and the table is per minor, not cumulative
        assert!(removed_settings("w-1", &a, &kv("v1.34.3")).is_empty());
        assert!(removed_settings("w-1", &a, &kv("v1.36.0")).is_empty());
    }

    #[test]
    fn the_kubelet_cadvisor_flags_are_removed_in_1_37() {
        let a = args(&[(
            Component::Kubelet,
            &[
                ("containerd", "/run/containerd/containerd.sock"),
                ("housekeeping-interval", "10s"),
            ],
        )]);
        let found = removed_settings("w-1", &a, &kv("v1.37.0"));
        assert_eq!(
            found,
            vec![RemovedSetting {
                node: "w-1".into(),
                component: Component::Kubelet,
                kind: RemovedKind::Flag,
                name: "containerd".into(),
            }],
            "`housekeeping-interval` stays; only the listed cAdvisor flags went"
        );
        assert!(removed_settings("w-1", &a, &kv("v1.36.2")).is_empty());
    }

    #[test]
    fn a_flag_of_another_component_is_not_a_hit() {
        // `cloud-config` left kube-apiserver in 1.33 and the kubelet in 1.34
        let a = args(&[
            (Component::ApiServer, &[("cloud-config", "/etc/cloud.conf")]),
            (Component::Kubelet, &[("cloud-config", "/etc/cloud.conf")]),
        ]);
        let at_33 = removed_settings("cp-1", &a, &kv("v1.33.0"));
        assert_eq!(at_33.len(), 1);
        assert_eq!(at_33[0].component, Component::ApiServer);
        let at_34 = removed_settings("cp-1", &a, &kv("v1.34.0"));
        assert_eq!(at_34.len(), 1);
        assert_eq!(at_34[0].component, Component::Kubelet);
    }

    #[test]
    fn feature_gates_and_admission_plugins_are_read_from_their_lists() {
        let a = args(&[
            (
                Component::ApiServer,
                &[
                    ("feature-gates", "SizeMemoryBackedVolumes=true, Foo=false"),
                    (
                        "enable-admission-plugins",
                        "NodeRestriction,SecurityContextDeny",
                    ),
                ],
            ),
            (
                Component::Scheduler,
                &[("feature-gates", "UserNamespacesHostNetworkSupport=true")],
            ),
        ]);
        let found = removed_settings("cp-1", &a, &kv("v1.35.2"));
        let names: Vec<(Component, RemovedKind, &str)> = found
            .iter()
            .map(|f| (f.component, f.kind, f.name.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![
                (
                    Component::ApiServer,
                    RemovedKind::FeatureGate,
                    "SizeMemoryBackedVolumes"
                ),
                (
                    Component::Scheduler,
                    RemovedKind::FeatureGate,
                    "UserNamespacesHostNetworkSupport"
                ),
            ]
        );
        // SecurityContextDeny was removed in 1.30
        let found = removed_settings("cp-1", &a, &kv("v1.30.0"));
        assert!(
            found
                .iter()
                .any(|f| f.kind == RemovedKind::AdmissionPlugin && f.name == "SecurityContextDeny"),
            "{found:?}"
        );
    }

    #[test]
    fn a_flag_name_is_matched_whole() {
        let a = args(&[(
            Component::Kubelet,
            &[("pod-infra-container-image-extra", "x")],
        )]);
        assert!(removed_settings("w-1", &a, &kv("v1.35.0")).is_empty());
    }
}
