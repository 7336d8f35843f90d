//! The validated desired state: typed, cross-checked, with source positions kept where later
//! rules (the planner's upgrade-path checks) need to point at the YAML.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Serialize;

pub use super::format::Role;
use super::window::MaintenanceWindow;
use crate::image::ImageRef;
use crate::version::{KubeVersion, TalosVersion};

/// Where a value came from: file (relative to the desired root) and span.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Origin {
    /// Path of the file, relative to the desired-state root.
    pub file: String,
    /// 1-based line and column.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// Byte span inside the file.
    pub offset: usize,
    /// Length of the span in bytes.
    pub len: usize,
}

/// A value and where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sourced<T> {
    /// The value, after parsing and defaults.
    pub value: T,
    /// Where the value was written (for a default: where its enclosing object was).
    pub origin: Origin,
}

impl<T> std::ops::Deref for Sourced<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

/// Identifies one revision of the desired state.
///
/// `content` hashes the resource files only (never `approvals/`), so committing an approval
/// marker does not make the plan it approves stale. In git mode `commit` records the sha the
/// files were read from; it is shown in plans but is not part of the basis.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub struct Revision {
    /// sha256 (hex) over the sorted resource files' paths and bytes.
    pub content: String,
    /// The git commit sha, in git mode.
    pub commit: Option<String>,
}

impl Revision {
    /// The first 12 characters of the content hash, for display.
    pub fn short(&self) -> &str {
        &self.content[..12.min(self.content.len())]
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.commit {
            Some(c) => write!(
                f,
                "commit {} (content {})",
                &c[..12.min(c.len())],
                self.short()
            ),
            None => write!(f, "content {}", self.short()),
        }
    }
}

/// Rollout parameters after defaults and overrides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSettings {
    /// Nodes of the pool that may be down at once (`rollout.maxUnavailable`; control plane: 1).
    pub max_unavailable: u32,
    /// How long a node may take to drain before the step fails (`rollout.drainTimeout`).
    #[serde(with = "duration_text")]
    pub drain_timeout: Duration,
    /// How long a node may take to become healthy after its upgrade (`rollout.healthTimeout`).
    #[serde(with = "duration_text")]
    pub health_timeout: Duration,
    /// Upgrade calls per node before the job halts (`rollout.upgradeAttempts`).
    pub upgrade_attempts: u32,
    /// The drain policy (`drain:`; its timeout is [`Self::drain_timeout`]).
    pub drain: DrainPolicy,
    /// When the new Talos is installed (`rollout.stage`).
    pub stage: Stage,
    /// Nodes installing ahead at once (`rollout.stageParallelism`).
    pub stage_parallelism: u32,
    /// Taint the next wave's nodes `PreferNoSchedule` before each wave (`rollout.taintNextWave`,
    /// default on). Not written when on, so summaries from before the setting compare equal.
    #[serde(skip_serializing_if = "is_on")]
    pub taint_next_wave: bool,
}

fn is_on(b: &bool) -> bool {
    *b
}

/// When a pool's nodes install the new Talos (`rollout.stage`, issue #36).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Stage {
    /// Pull, install and reboot inside the maintenance windows.
    #[default]
    InWindow,
    /// Pull and install without reboot (Talos >= 1.13) as soon as the job reaches the pool,
    /// windows or not; cordon, drain and reboot inside the windows.
    Ahead,
}

/// Default of `rollout.stageParallelism`.
pub const DEFAULT_STAGE_PARALLELISM: u32 = 2;
/// Largest `rollout.stageParallelism` accepted.
pub const MAX_STAGE_PARALLELISM: u32 = 10;

/// Default of `rollout.upgradeAttempts`.
pub const DEFAULT_UPGRADE_ATTEMPTS: u32 = 2;
/// Largest `rollout.upgradeAttempts` accepted.
pub const MAX_UPGRADE_ATTEMPTS: u32 = 5;

impl Default for RolloutSettings {
    fn default() -> Self {
        RolloutSettings {
            max_unavailable: 1,
            drain_timeout: Duration::from_secs(10 * 60),
            health_timeout: Duration::from_secs(15 * 60),
            upgrade_attempts: DEFAULT_UPGRADE_ATTEMPTS,
            drain: DrainPolicy::default(),
            stage: Stage::InWindow,
            stage_parallelism: DEFAULT_STAGE_PARALLELISM,
            taint_next_wave: true,
        }
    }
}

/// The drain policy: which pods a drain evicts, after the Cluster's defaults and the
/// NodePool's overrides (`drain:`). A PodDisruptionBudget is never bypassed: evictions only,
/// never a delete, never forced.
///
/// One type from the desired state to the adapter (issue #34): validation builds it, the plan
/// carries it per Talos hop (`plan::TalosRollout::drain`) and in the last-applied summary,
/// the journal records it in the drain command, and the Kubernetes adapter drains by it
/// (`k8s::DrainOptions::policy`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainPolicy {
    /// Evict pods with `emptyDir` volumes (`drain.deleteEmptyDirData`; talosctl's default).
    pub delete_empty_dir_data: bool,
    /// Evict pods no controller recreates (`drain.evictUnmanagedPods`).
    pub evict_unmanaged_pods: bool,
    /// Pods with all these labels stay on the node (`drain.skipPods.matchLabels`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub skip_pods: BTreeMap<String, String>,
    /// After the drain and before the reboot, wait this many seconds at most until no
    /// `VolumeAttachment` names the node, then halt naming those left
    /// (`drain.volumeDetachTimeout`); `None`: no wait (`drain.waitForVolumeDetach: false`).
    /// Plans and journals written before the wait existed read as `None`: what was approved.
    #[serde(default)]
    pub volume_detach_timeout_secs: Option<u64>,
}

/// Default of `drain.volumeDetachTimeout`.
pub const DEFAULT_VOLUME_DETACH_TIMEOUT: Duration = Duration::from_secs(5 * 60);

impl Default for DrainPolicy {
    /// What `drain:` means when nothing is written: evict `emptyDir` pods, refuse bare ones.
    fn default() -> Self {
        DrainPolicy {
            delete_empty_dir_data: true,
            evict_unmanaged_pods: false,
            skip_pods: BTreeMap::new(),
            volume_detach_timeout_secs: Some(DEFAULT_VOLUME_DETACH_TIMEOUT.as_secs()),
        }
    }
}

impl DrainPolicy {
    /// What every drain did before the policy could be set: refuse emptyDir and bare pods
    /// (what a stored plan or journal written before the policy existed reads as).
    pub fn legacy() -> DrainPolicy {
        DrainPolicy {
            delete_empty_dir_data: false,
            evict_unmanaged_pods: false,
            skip_pods: BTreeMap::new(),
            volume_detach_timeout_secs: None,
        }
    }

    /// How long the wait for the node's volumes to detach may take; `None`: no wait.
    pub fn volume_detach_timeout(&self) -> Option<Duration> {
        self.volume_detach_timeout_secs.map(Duration::from_secs)
    }

    /// `deleteEmptyDirData=true evictUnmanagedPods=false skipPods=app=x`, as the plan shows it.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "deleteEmptyDirData={} evictUnmanagedPods={}",
            self.delete_empty_dir_data, self.evict_unmanaged_pods
        );
        if !self.skip_pods.is_empty() {
            let sel: Vec<String> = self
                .skip_pods
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            s.push_str(&format!(" skipPods={}", sel.join(",")));
        }
        match self.volume_detach_timeout() {
            Some(d) => s.push_str(&format!(" volumeDetachTimeout={}", format_duration(d))),
            None => s.push_str(" waitForVolumeDetach=false"),
        }
        s
    }
}

/// How many distinct signers a plan needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalSettings {
    /// For plans that touch only worker pools or settings.
    pub required: u32,
    /// For plans that touch control-plane nodes or Kubernetes.
    pub control_plane: u32,
}

impl Default for ApprovalSettings {
    fn default() -> Self {
        ApprovalSettings {
            required: 1,
            control_plane: 2,
        }
    }
}

/// A `(major, minor)` release line, written `v1.15`.
pub type MinorLine = (u64, u64);

/// A minor line that is not `vMAJOR.MINOR`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a minor line: write `vMAJOR.MINOR`, e.g. `v1.15`")]
pub struct MinorLineError {
    /// The minor line as written.
    pub input: String,
}

/// Parse a minor line written `vMAJOR.MINOR` (`v1.15`).
pub fn parse_minor_line(input: &str) -> Result<MinorLine, MinorLineError> {
    let bad = || MinorLineError {
        input: input.to_string(),
    };
    let rest = input.strip_prefix('v').ok_or_else(bad)?;
    let (major, minor) = rest.split_once('.').ok_or_else(bad)?;
    let num = |s: &str| -> Result<u64, MinorLineError> {
        let ok = !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'));
        if !ok {
            return Err(bad());
        }
        s.parse().map_err(|_| bad())
    };
    Ok((num(major)?, num(minor)?))
}

/// A Talos minor and the Kubernetes minors it supports (inclusive), from the desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SupportOverride {
    /// The Talos minor line this row is for, e.g. `v1.11`.
    pub talos: MinorLine,
    /// The oldest Kubernetes minor this Talos minor supports.
    pub min_kubernetes: MinorLine,
    /// The newest Kubernetes minor this Talos minor supports.
    pub max_kubernetes: MinorLine,
}

/// `spec.upgradePolicy` of a Cluster, after defaults: which version moves plans may contain.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradePolicy {
    /// Talos only; Kubernetes is never moved backwards.
    pub allow_downgrade: bool,
    /// Releases added to the planner's built-in catalog, sorted.
    pub talos_releases: Vec<TalosVersion>,
    /// Support windows overriding the built-in ones, sorted by Talos minor.
    pub kubernetes_support: Vec<SupportOverride>,
    /// Rows added to (or replacing) the built-in API removal table, sorted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub removed_apis: Vec<crate::api_lifecycle::ApiLifecycle>,
}

impl UpgradePolicy {
    /// The built-in API removal table with this policy's rows on top (a row with the same
    /// group, version and resource replaces the built-in one), sorted.
    pub fn api_table(&self) -> Vec<crate::api_lifecycle::ApiLifecycle> {
        let mut table: Vec<_> = crate::api_lifecycle::builtin()
            .into_iter()
            .filter(|b| {
                !self.removed_apis.iter().any(|r| {
                    r.group == b.group && r.version == b.version && r.resource == b.resource
                })
            })
            .collect();
        table.extend(self.removed_apis.iter().cloned());
        table.sort();
        table
    }
}

/// `spec.preflight` of a Cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreflightSettings {
    /// Finding ids accepted, as written (duplicates rejected).
    pub acknowledge: Vec<Sourced<String>>,
}

impl PreflightSettings {
    /// Whether the finding `id` is acknowledged in `spec.preflight.acknowledge`.
    pub fn acknowledges(&self, id: &str) -> bool {
        self.acknowledge.iter().any(|a| a.value == id)
    }
}

/// `spec.promotion` of a Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promotion {
    /// The upstream cluster.
    pub after: Sourced<String>,
    /// How long the upstream cluster must have run its target before this one is planned.
    pub soak: Duration,
}

/// A validated Cluster and its pools.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// `metadata.name`.
    pub name: Sourced<String>,
    /// `spec.kubernetes.version`: the Kubernetes version the cluster should run.
    pub kubernetes_version: Sourced<KubeVersion>,
    /// Effective rollout defaults for the cluster's pools.
    pub rollout: RolloutSettings,
    /// How many signers a plan needs (`spec.approvals`, after defaults).
    pub approvals: ApprovalSettings,
    /// Maintenance windows (`spec.windows`); a rollout step starts only inside one. Empty: any time.
    pub windows: Vec<MaintenanceWindow>,
    /// Maintenance exclusions (`spec.maintenance.exclusions`), in file order: no node starts
    /// a change an exclusion in force covers.
    pub exclusions: Vec<super::exclusion::Exclusion>,
    /// `spec.upgradePolicy`, after defaults.
    pub upgrade_policy: UpgradePolicy,
    /// Health gates (`health:`); no gates when the block is absent.
    pub health: super::health::HealthSettings,
    /// `spec.preflight`: acknowledged finding ids.
    pub preflight: PreflightSettings,
    /// `spec.promotion`: the upstream cluster and its soak.
    pub promotion: Option<Promotion>,
    /// `spec.backup`: scheduled etcd backups; `None`: off.
    pub backup: Option<super::backup::BackupSettings>,
    /// `spec.hooks`: blocking hooks before and after each job (issue #35); empty: none.
    pub hooks: super::hooks::Hooks,
    /// Where each hook was written (the server's hook policy locates its refusals there).
    pub hook_origins: super::hooks::HookOrigins,
    /// Pools by name. Each pool is its own allocation (`Arc`): a B-tree node has room for
    /// eleven entries, so a map of whole pools held ~9 KiB per cluster, most of it empty.
    pub pools: BTreeMap<String, std::sync::Arc<NodePool>>,
    /// The YAML document as written (for plan diffs against the last applied version).
    pub document: String,
}

/// A validated NodePool.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePool {
    /// `metadata.name`.
    pub name: Sourced<String>,
    /// `spec.cluster`: the cluster this pool belongs to.
    pub cluster: Sourced<String>,
    /// `spec.role`: control plane or worker.
    pub role: Role,
    /// Machines named explicitly (Kubernetes node names).
    pub machines: Vec<Sourced<String>>,
    /// Machines selected by node labels (all must match); empty = none by label.
    pub selector: BTreeMap<String, String>,
    /// `spec.talos.version`: the Talos version the pool's machines should run.
    pub talos_version: Sourced<TalosVersion>,
    /// `talos.installerImage`, or [`DEFAULT_INSTALLER`] when the pool names none.
    pub installer_image: Sourced<InstallerImage>,
    /// Whether the pool names its installer. A pool that does not gets, for hops to Talos 1.14
    /// and later (which no longer publish [`DEFAULT_INSTALLER`]), each node's own Image Factory
    /// installer (`plan::compute`, `factory_installer`).
    pub installer_named: bool,
    /// Effective settings: pool overrides on top of the cluster defaults; control plane is 1.
    pub rollout: RolloutSettings,
    /// Effective health gates: the pool's `health:` fields on top of the cluster's, and the
    /// pool's `onFailure`.
    pub health: super::health::HealthSettings,
    /// Pools of the same cluster this pool is rolled after (`spec.after`).
    pub after: Vec<Sourced<String>>,
    /// `spec.hooks`: blocking hooks around each node and wave (issue #35); empty: none.
    pub hooks: super::hooks::Hooks,
    /// Where each hook was written (the server's hook policy locates its refusals there).
    pub hook_origins: super::hooks::HookOrigins,
    /// The YAML document as written (for plan diffs against the last applied version).
    pub document: String,
}

impl NodePool {
    /// Whether a machine with this node name and these labels belongs to the pool.
    pub fn selects(&self, node: &str, labels: &BTreeMap<String, String>) -> bool {
        self.machines.iter().any(|m| m.value == node)
            || (!self.selector.is_empty()
                && self
                    .selector
                    .iter()
                    .all(|(k, v)| labels.get(k).is_some_and(|l| l == v)))
    }
}

/// The whole validated desired state.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// Which files and commit this state was loaded from.
    pub revision: Revision,
    /// Clusters by name. Shared (`Arc`): the loader's memo, every later revision that left a
    /// cluster unchanged and the plan side hold the same allocation.
    pub clusters: BTreeMap<String, std::sync::Arc<Cluster>>,
}

/// An installer image repository, without tag or digest (`ghcr.io/siderolabs/installer`).
/// An installer image repository without tag or digest (the tag is the Talos version).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstallerImage(ImageRef);

/// The installer repository a pool gets when it names none.
pub const DEFAULT_INSTALLER: &str = crate::image::GHCR_INSTALLER;

/// Why `talos.installerImage` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error(
        "installer image `{input}` must be a repository without a tag: the tag is the Talos version (write `{repo}`)"
    )]
    /// The image carries a tag; medea adds the Talos version as the tag itself.
    Tagged {
        /// The value as written.
        input: String,
        /// The same repository without the tag, to write instead.
        repo: String,
    },
    /// The image carries a digest, which would pin one version.
    #[error("installer image `{input}` must not carry a digest: the tag is the Talos version")]
    Digest {
        /// The value as written.
        input: String,
    },
    #[error(
        "installer image `{input}` is not a valid image repository (lowercase letters, digits, `.`, `_`, `-` and `/`)"
    )]
    /// The text is not an image repository.
    Invalid {
        /// The value as written.
        input: String,
        /// What is wrong with it.
        #[source]
        err: crate::image::ImageRefError,
    },
}

impl InstallerImage {
    /// Read `talos.installerImage`: a repository without tag or digest.
    pub fn parse(input: &str) -> Result<InstallerImage, ImageError> {
        if input.contains('@') {
            return Err(ImageError::Digest {
                input: input.to_string(),
            });
        }
        let image = ImageRef::parse(input).map_err(|err| ImageError::Invalid {
            input: input.to_string(),
            err,
        })?;
        if image.tag().is_some() {
            return Err(ImageError::Tagged {
                input: input.to_string(),
                repo: image.repository(),
            });
        }
        Ok(InstallerImage(image))
    }

    /// The repository, e.g. `ghcr.io/siderolabs/installer`.
    pub fn repository(&self) -> String {
        self.0.repository()
    }

    /// The image reference for a version: `<repository>:<version>`.
    pub fn reference(&self, version: &TalosVersion) -> String {
        format!("{}:{}", self.0, version)
    }

    /// The Image Factory schematic id, when the repository ends in one
    /// (`factory.talos.dev/installer/<64 hex>`).
    pub fn schematic(&self) -> Option<&str> {
        self.0.schematic()
    }

    /// Whether this is a SecureBoot installer (`…installer-secureboot/<schematic>`): the only
    /// kind a SecureBoot node may be upgraded with, and a kind a non-SecureBoot node may not
    /// (talos#9245).
    pub fn secure_boot(&self) -> bool {
        crate::image::is_secure_boot_installer(&self.0.to_string())
    }

    /// Whether this is `ghcr.io/siderolabs/installer`, published up to Talos 1.13 only.
    pub fn is_ghcr(&self) -> bool {
        self.repository() == crate::image::GHCR_INSTALLER
    }
}

pub use crate::image::{DEFAULT_FACTORY, EMPTY_SCHEMATIC};

/// The schematic id in an image reference or repository (the last path segment when it is
/// 64 lowercase hex characters, as Image Factory writes them), ignoring any tag.
pub fn schematic_of(image: &str) -> Option<&str> {
    crate::image::schematic_of(image)
}

impl fmt::Display for InstallerImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Durations are written as `1h30m`, `10m`, `90s`: [`crate::duration::Duration`]'s `Display`.
pub fn format_duration(d: Duration) -> String {
    crate::duration::Duration::from(d).to_string()
}

mod duration_text {
    use std::time::Duration;
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_duration(*d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installer_images() {
        let i = InstallerImage::parse("ghcr.io/siderolabs/installer").unwrap();
        assert_eq!(
            i.reference(&TalosVersion::parse("v1.13.9").unwrap()),
            "ghcr.io/siderolabs/installer:v1.13.9"
        );
        assert_eq!(i.schematic(), None);
        let s = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";
        let f = InstallerImage::parse(&format!("factory.talos.dev/installer/{s}")).unwrap();
        assert_eq!(f.schematic(), Some(s));
        assert_eq!(
            schematic_of(&format!("factory.talos.dev/metal-installer/{s}:v1.12.4")),
            Some(s)
        );
        assert!(InstallerImage::parse("registry.local:5000/talos/installer").is_ok());
        let e = InstallerImage::parse("ghcr.io/siderolabs/installer:v1.13.9").unwrap_err();
        assert!(
            e.to_string()
                .contains("write `ghcr.io/siderolabs/installer`"),
            "{e}"
        );
        assert!(matches!(
            InstallerImage::parse("ghcr.io/siderolabs/installer@sha256:abc"),
            Err(ImageError::Digest { .. })
        ));
        assert!(matches!(
            InstallerImage::parse("Ghcr.io/X"),
            Err(ImageError::Invalid { .. })
        ));
        assert!(matches!(
            InstallerImage::parse(""),
            Err(ImageError::Invalid { .. })
        ));
    }

    #[test]
    fn durations_format_compactly() {
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format_duration(Duration::ZERO), "0s");
    }
}
