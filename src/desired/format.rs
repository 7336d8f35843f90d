//! The file format: what operators write, exactly as serde reads it.
//!
//! These types mirror the YAML one to one (camelCase keys, unknown fields rejected) and carry
//! source positions ([`Spanned`]) on every value a later rule may complain about. They are also
//! the source of the JSON Schemas in `schemas/`. Validation turns them into the typed model in
//! [`super::model`]; nothing outside `desired` sees these types.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_saphyr::Spanned;

pub const API_VERSION: &str = "medea/v1alpha1";

/// The two-field header read first, to pick the concrete kind without losing positions.
#[derive(Debug, Clone, Deserialize)]
pub struct Header {
    #[serde(rename = "apiVersion")]
    pub api_version: Option<Spanned<String>>,
    pub kind: Option<Spanned<String>>,
}

/// A lenient read of a document's identity, used when its strict read failed so that other
/// documents referring to it do not report follow-on errors.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Identity {
    pub kind: Option<String>,
    pub metadata: Option<IdentityMeta>,
    pub spec: Option<IdentitySpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct IdentityMeta {
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct IdentitySpec {
    pub cluster: Option<String>,
}

/// Object metadata, as in Kubernetes.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Metadata {
    /// Name of the object: a DNS label (lowercase letters, digits and `-`, at most 63).
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// Free-form labels; medea does not interpret them.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Free-form annotations; medea does not interpret them.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// A Kubernetes cluster running on Talos Linux, and how medea may roll it.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "Cluster")]
pub struct ClusterDoc {
    /// Always `medea/v1alpha1`.
    #[schemars(with = "String")]
    pub api_version: Spanned<String>,
    /// Always `Cluster`.
    #[schemars(with = "String")]
    pub kind: Spanned<String>,
    pub metadata: Metadata,
    pub spec: ClusterSpec,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterSpec {
    pub kubernetes: KubernetesSpec,
    /// Rollout defaults for every pool of this cluster.
    #[serde(default)]
    pub rollout: Option<RolloutSpec>,
    /// Drain defaults for every pool of this cluster.
    #[serde(default)]
    pub drain: Option<DrainSpec>,
    /// How many distinct signers a plan needs before it may run.
    #[serde(default)]
    pub approvals: Option<ApprovalsSpec>,
    /// When rollouts may start a node. Without windows, any time.
    #[serde(default)]
    pub maintenance_windows: Vec<WindowSpec>,
    /// Upgrade-path policy.
    #[serde(default)]
    pub upgrade_policy: Option<UpgradePolicySpec>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesSpec {
    /// Target Kubernetes version, e.g. `v1.34.1`.
    #[schemars(with = "crate::version::KubeVersion")]
    pub version: Spanned<String>,
}

/// Rollout parameters. On a Cluster they are defaults; on a NodePool, overrides.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RolloutSpec {
    /// How many machines of a pool may be away at once (control-plane pools: always 1).
    #[serde(default)]
    #[schemars(with = "Option<u32>", range(min = 1))]
    pub max_unavailable: Option<Spanned<u32>>,
    /// How long a drain may wait on PodDisruptionBudgets before the rollout halts (`10m`).
    #[serde(default)]
    #[schemars(with = "Option<DurationString>")]
    pub drain_timeout: Option<Spanned<String>>,
    /// How long a node may take to come back healthy after its reboot (`15m`).
    #[serde(default)]
    #[schemars(with = "Option<DurationString>")]
    pub health_timeout: Option<Spanned<String>>,
    /// How many times medea calls Upgrade on one node before the job halts, when the node
    /// answers that the upgrade ran and failed (installer exit, image validation) or the call's
    /// outcome stays unknown and the node shows no trace of it (default 2, at most 5).
    #[serde(default)]
    #[schemars(with = "Option<u32>", range(min = 1, max = 5))]
    pub upgrade_attempts: Option<Spanned<u32>>,
}

/// How nodes are drained before their upgrade. On a Cluster these are defaults; on a NodePool,
/// overrides. Evictions always go through the Eviction API: a PodDisruptionBudget is never
/// bypassed, whatever is set here.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DrainSpec {
    /// Evict pods that use `emptyDir` volumes; their emptyDir data is lost (default `true`, as
    /// `talosctl upgrade` and kubectl's `--delete-emptydir-data` do).
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub delete_empty_dir_data: Option<Spanned<bool>>,
    /// Evict pods that no controller recreates (bare pods); they are gone for good (default
    /// `false`: the drain is refused, naming them).
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub evict_unmanaged_pods: Option<Spanned<bool>>,
    /// Pods left on the node (never evicted, not waited for), e.g. local-storage agents.
    #[serde(default)]
    #[schemars(with = "Option<SelectorSpec>")]
    pub skip_pods: Option<Spanned<SelectorSpec>>,
    /// How long a drain may wait on PodDisruptionBudgets before the rollout halts (`10m`).
    /// Replaces `rollout.drainTimeout`; set one of them.
    #[serde(default)]
    #[schemars(with = "Option<DurationString>")]
    pub timeout: Option<Spanned<String>>,
}

/// A duration such as `90s`, `10m` or `1h30m`.
#[derive(JsonSchema)]
#[schemars(
    transparent,
    extend("pattern" = "^([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$", "examples" = ["10m", "90s", "1h30m"])
)]
#[allow(dead_code)]
pub struct DurationString(String);

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApprovalsSpec {
    /// Distinct signers a plan needs (default 1).
    #[serde(default)]
    #[schemars(with = "Option<u32>", range(min = 1))]
    pub required: Option<Spanned<u32>>,
    /// Distinct signers a plan needs when it touches control-plane nodes or Kubernetes
    /// (default 2, and never less than `required`).
    #[serde(default)]
    #[schemars(with = "Option<u32>", range(min = 1))]
    pub control_plane: Option<Spanned<u32>>,
}

/// A recurring window in which rollouts may start nodes.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WindowSpec {
    /// Window start, a 5-field cron expression (`0 2 * * 6` = Saturdays 02:00).
    #[schemars(with = "String")]
    pub start: Spanned<String>,
    /// Window length (`4h`).
    #[schemars(with = "DurationString")]
    pub duration: Spanned<String>,
    /// IANA time zone of `start` (`Europe/Berlin`; default `UTC`).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub time_zone: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpgradePolicySpec {
    /// Allow plans that move Talos back to an older release (default false). Kubernetes is
    /// never moved backwards.
    #[serde(default)]
    pub allow_downgrade: bool,
    /// Talos releases medea's built-in compatibility catalog does not know yet (a patch
    /// published after this medea was built). The newest stable patch of each minor is the
    /// stop on multi-minor upgrade paths.
    #[serde(default)]
    #[schemars(with = "Vec<crate::version::TalosVersion>")]
    pub talos_releases: Vec<Spanned<String>>,
    /// Kubernetes versions a Talos minor supports, overriding (or extending) the built-in
    /// table; copy them from the Talos support matrix.
    #[serde(default)]
    pub kubernetes_support: Vec<KubernetesSupportSpec>,
}

/// The Kubernetes minors one Talos minor supports (both ends inclusive).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesSupportSpec {
    /// A Talos minor line, e.g. `v1.15`.
    #[schemars(with = "MinorString")]
    pub talos: Spanned<String>,
    /// Oldest supported Kubernetes minor, e.g. `v1.33`.
    #[schemars(with = "MinorString")]
    pub min_kubernetes: Spanned<String>,
    /// Newest supported Kubernetes minor, e.g. `v1.38`.
    #[schemars(with = "MinorString")]
    pub max_kubernetes: Spanned<String>,
}

/// A minor line such as `v1.15`.
#[derive(JsonSchema)]
#[schemars(
    transparent,
    extend("pattern" = "^v(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)$", "examples" = ["v1.15"])
)]
#[allow(dead_code)]
pub struct MinorString(String);

/// A set of machines of one cluster that share a role, a Talos version and rollout settings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "NodePool")]
pub struct NodePoolDoc {
    /// Always `medea/v1alpha1`.
    #[schemars(with = "String")]
    pub api_version: Spanned<String>,
    /// Always `NodePool`.
    #[schemars(with = "String")]
    pub kind: Spanned<String>,
    pub metadata: Metadata,
    pub spec: NodePoolSpec,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodePoolSpec {
    /// Name of the Cluster this pool belongs to.
    #[schemars(with = "String")]
    pub cluster: Spanned<String>,
    /// `controlplane` or `worker`.
    #[schemars(with = "Role")]
    pub role: Spanned<Role>,
    /// Machines by Kubernetes node name.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub machines: Vec<Spanned<String>>,
    /// Machines by node label; combined with `machines` (union).
    #[serde(default)]
    pub selector: Option<SelectorSpec>,
    pub talos: TalosSpec,
    /// Overrides of the cluster's rollout defaults.
    #[serde(default)]
    pub rollout: Option<RolloutSpec>,
    /// Overrides of the cluster's drain defaults.
    #[serde(default)]
    pub drain: Option<DrainSpec>,
    /// Pools of the same cluster that must finish their rollouts before this one starts.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub after: Vec<Spanned<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Controlplane,
    Worker,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SelectorSpec {
    /// Every label must match exactly.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub match_labels: BTreeMap<String, Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TalosSpec {
    /// Target Talos version, e.g. `v1.13.9`.
    #[schemars(with = "crate::version::TalosVersion")]
    pub version: Spanned<String>,
    /// Installer image repository without a tag; the tag is the version. Keep the Image
    /// Factory schematic of the running image (`factory.talos.dev/installer/<schematic>`).
    /// Default `ghcr.io/siderolabs/installer`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub installer_image: Option<Spanned<String>>,
}
