//! Every setting of a desired document, one enum variant each (issue #50 item 1).
//!
//! The applied record's summaries ([`super::applied::ClusterSettings`],
//! [`super::applied::PoolSettings`]) yield `(Setting, rendered value)` for every setting by
//! exhaustive destructuring (no `..`), so a field added to a summary does not compile until it
//! is listed here or declared inert there; the plan's settings diff and its rendering come from
//! that one list. The approval bar of each variant is chosen in [`super::bar::bar_of`], an
//! exhaustive `match`: a new variant does not compile until its bar is chosen.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One setting of a Cluster or NodePool document, named in plans by its dotted YAML path
/// ([`Setting::path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Setting {
    /// `role`: A pool's role.
    Role,
    /// `machines`: A pool's machines named explicitly.
    Machines,
    /// `selector.matchLabels`: A pool's label selector.
    Selector,
    /// `after`: Pools a pool rolls after.
    After,
    /// `talos.installerImage`: A pool's installer image.
    InstallerImage,
    /// `rollout.maxUnavailable`: Machines of a pool away at once.
    MaxUnavailable,
    /// `rollout.drainTimeout`: How long PodDisruptionBudgets may block a drain.
    DrainTimeout,
    /// `rollout.healthTimeout`: How long a node may take to come back healthy.
    HealthTimeout,
    /// `rollout.upgradeAttempts`: Upgrade attempts per node.
    UpgradeAttempts,
    /// `rollout.stage`: When a pool installs the new Talos.
    Stage,
    /// `rollout.stageParallelism`: Nodes installing ahead at once.
    StageParallelism,
    /// `rollout.taintNextWave`: Whether the next wave's nodes are tainted ahead.
    TaintNextWave,
    /// `drain.deleteEmptyDirData`: A drain evicts `emptyDir` pods.
    DeleteEmptyDirData,
    /// `drain.evictUnmanagedPods`: A drain evicts pods no controller recreates.
    EvictUnmanagedPods,
    /// `drain.skipPods.matchLabels`: Pods a drain leaves on the node.
    SkipPods,
    /// `drain.waitForVolumeDetach`: Whether a node waits for its volumes to detach before the reboot.
    WaitForVolumeDetach,
    /// `drain.volumeDetachTimeout`: How long that wait may take.
    VolumeDetachTimeout,
    /// `approvals.required`: Approvals every plan needs.
    ApprovalsRequired,
    /// `approvals.controlPlane`: Approvals a control-plane or Kubernetes plan needs.
    ApprovalsControlPlane,
    /// `maintenanceWindows`: When rollouts may run.
    MaintenanceWindows,
    /// `maintenance.exclusions`: When rollouts may not run.
    Exclusions,
    /// `upgradePolicy.allowDowngrade`: Whether downgrades are planned.
    AllowDowngrade,
    /// `upgradePolicy.talosReleases`: Extra Talos releases the path may stop at.
    TalosReleases,
    /// `upgradePolicy.kubernetesSupport`: Catalog overrides of Kubernetes support.
    KubernetesSupport,
    /// `upgradePolicy.removedApis`: Kubernetes APIs the preflight looks for.
    RemovedApis,
    /// `health.prometheus`: Where Prometheus health data and its credential come from.
    HealthPrometheus,
    /// `health.alertmanager`: Where Alertmanager data and its credential come from.
    HealthAlertmanager,
    /// `health.gates`: The health gates.
    HealthGates,
    /// `health.gates[].alerts.skipOperatorSilences`: The alerts gates that let operators'
    /// silences hide an alert (what silences cover, so the highest bar).
    GatesSkippingOperatorSilences,
    /// `health.soak`: How long gates pass after a wave.
    HealthSoak,
    /// `health.interval`: How often gates are evaluated.
    HealthInterval,
    /// `health.failureLimit`: Failed evaluations before a gate fails.
    HealthFailureLimit,
    /// `health.inconclusiveLimit`: Inconclusive evaluations before a gate halts the job.
    HealthInconclusiveLimit,
    /// `health.silence.matchers`: The alerts a node's silence covers.
    SilenceMatchers,
    /// `health.silence.nodeLabel`: The label naming the node in a silence.
    SilenceNodeLabel,
    /// `health.silence.lease`: How long a silence lasts past its last renewal.
    SilenceLease,
    /// `health.silence.maxDuration`: How long a silence may be renewed.
    SilenceMaxDuration,
    /// `health.silence.onError`: What a node does when its silence is refused.
    SilenceOnError,
    /// `onFailure`: What a failed gate does to a pool's wave.
    OnFailure,
    /// `preflight.acknowledge`: Preflight findings acknowledged.
    Acknowledge,
    /// `promotion`: The cluster this one is promoted after.
    Promotion,
    /// `backup.schedule`: When backups run.
    BackupSchedule,
    /// `backup.retention`: Which backups are kept.
    BackupRetention,
    /// `backup.destination`: Where backups go.
    BackupDestination,
    /// `backup.recipients`: Who can decrypt backups.
    BackupRecipients,
    /// `hooks.beforeJob`: Blocking hooks before a job.
    HooksBeforeJob,
    /// `hooks.afterJob`: Blocking hooks after a job.
    HooksAfterJob,
    /// `hooks.beforeWave`: Blocking hooks before a wave.
    HooksBeforeWave,
    /// `hooks.beforeNode`: Blocking hooks before a node.
    HooksBeforeNode,
    /// `hooks.afterNode`: Blocking hooks after a node.
    HooksAfterNode,
    /// `hooks.afterWave`: Blocking hooks after a wave.
    HooksAfterWave,
}

impl Setting {
    /// Every setting, in display order.
    pub const ALL: [Setting; 51] = [
        Setting::Role,
        Setting::Machines,
        Setting::Selector,
        Setting::After,
        Setting::InstallerImage,
        Setting::MaxUnavailable,
        Setting::DrainTimeout,
        Setting::HealthTimeout,
        Setting::UpgradeAttempts,
        Setting::Stage,
        Setting::StageParallelism,
        Setting::TaintNextWave,
        Setting::DeleteEmptyDirData,
        Setting::EvictUnmanagedPods,
        Setting::SkipPods,
        Setting::WaitForVolumeDetach,
        Setting::VolumeDetachTimeout,
        Setting::ApprovalsRequired,
        Setting::ApprovalsControlPlane,
        Setting::MaintenanceWindows,
        Setting::Exclusions,
        Setting::AllowDowngrade,
        Setting::TalosReleases,
        Setting::KubernetesSupport,
        Setting::RemovedApis,
        Setting::HealthPrometheus,
        Setting::HealthAlertmanager,
        Setting::HealthGates,
        Setting::GatesSkippingOperatorSilences,
        Setting::HealthSoak,
        Setting::HealthInterval,
        Setting::HealthFailureLimit,
        Setting::HealthInconclusiveLimit,
        Setting::SilenceMatchers,
        Setting::SilenceNodeLabel,
        Setting::SilenceLease,
        Setting::SilenceMaxDuration,
        Setting::SilenceOnError,
        Setting::OnFailure,
        Setting::Acknowledge,
        Setting::Promotion,
        Setting::BackupSchedule,
        Setting::BackupRetention,
        Setting::BackupDestination,
        Setting::BackupRecipients,
        Setting::HooksBeforeJob,
        Setting::HooksAfterJob,
        Setting::HooksBeforeWave,
        Setting::HooksBeforeNode,
        Setting::HooksAfterNode,
        Setting::HooksAfterWave,
    ];

    /// The dotted YAML path plans name the setting by (`rollout.drainTimeout`).
    pub const fn path(self) -> &'static str {
        match self {
            Setting::Role => "role",
            Setting::Machines => "machines",
            Setting::Selector => "selector.matchLabels",
            Setting::After => "after",
            Setting::InstallerImage => "talos.installerImage",
            Setting::MaxUnavailable => "rollout.maxUnavailable",
            Setting::DrainTimeout => "rollout.drainTimeout",
            Setting::HealthTimeout => "rollout.healthTimeout",
            Setting::UpgradeAttempts => "rollout.upgradeAttempts",
            Setting::Stage => "rollout.stage",
            Setting::StageParallelism => "rollout.stageParallelism",
            Setting::TaintNextWave => "rollout.taintNextWave",
            Setting::DeleteEmptyDirData => "drain.deleteEmptyDirData",
            Setting::EvictUnmanagedPods => "drain.evictUnmanagedPods",
            Setting::SkipPods => "drain.skipPods.matchLabels",
            Setting::WaitForVolumeDetach => "drain.waitForVolumeDetach",
            Setting::VolumeDetachTimeout => "drain.volumeDetachTimeout",
            Setting::ApprovalsRequired => "approvals.required",
            Setting::ApprovalsControlPlane => "approvals.controlPlane",
            Setting::MaintenanceWindows => "maintenanceWindows",
            Setting::Exclusions => "maintenance.exclusions",
            Setting::AllowDowngrade => "upgradePolicy.allowDowngrade",
            Setting::TalosReleases => "upgradePolicy.talosReleases",
            Setting::KubernetesSupport => "upgradePolicy.kubernetesSupport",
            Setting::RemovedApis => "upgradePolicy.removedApis",
            Setting::HealthPrometheus => "health.prometheus",
            Setting::HealthAlertmanager => "health.alertmanager",
            Setting::HealthGates => "health.gates",
            Setting::GatesSkippingOperatorSilences => "health.gates.skipOperatorSilences",
            Setting::HealthSoak => "health.soak",
            Setting::HealthInterval => "health.interval",
            Setting::HealthFailureLimit => "health.failureLimit",
            Setting::HealthInconclusiveLimit => "health.inconclusiveLimit",
            Setting::SilenceMatchers => "health.silence.matchers",
            Setting::SilenceNodeLabel => "health.silence.nodeLabel",
            Setting::SilenceLease => "health.silence.lease",
            Setting::SilenceMaxDuration => "health.silence.maxDuration",
            Setting::SilenceOnError => "health.silence.onError",
            Setting::OnFailure => "onFailure",
            Setting::Acknowledge => "preflight.acknowledge",
            Setting::Promotion => "promotion",
            Setting::BackupSchedule => "backup.schedule",
            Setting::BackupRetention => "backup.retention",
            Setting::BackupDestination => "backup.destination",
            Setting::BackupRecipients => "backup.recipients",
            Setting::HooksBeforeJob => "hooks.beforeJob",
            Setting::HooksAfterJob => "hooks.afterJob",
            Setting::HooksBeforeWave => "hooks.beforeWave",
            Setting::HooksBeforeNode => "hooks.beforeNode",
            Setting::HooksAfterNode => "hooks.afterNode",
            Setting::HooksAfterWave => "hooks.afterWave",
        }
    }

    /// Whether the setting is a point's blocking hooks (`hooks.*`).
    pub const fn is_hook(self) -> bool {
        matches!(
            self,
            Setting::HooksBeforeJob
                | Setting::HooksAfterJob
                | Setting::HooksBeforeWave
                | Setting::HooksBeforeNode
                | Setting::HooksAfterNode
                | Setting::HooksAfterWave
        )
    }

    /// The setting named `path` ([`Setting::path`]), if any.
    pub fn from_path(path: &str) -> Option<Setting> {
        Setting::ALL.into_iter().find(|s| s.path() == path)
    }
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.path())
    }
}

impl Serialize for Setting {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.path())
    }
}

impl<'de> Deserialize<'de> for Setting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Setting, D::Error> {
        let path = String::deserialize(d)?;
        Setting::from_path(&path)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown setting `{path}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_has_one_path_and_reads_back_from_it() {
        let paths: std::collections::BTreeSet<&str> =
            Setting::ALL.iter().map(|s| s.path()).collect();
        assert_eq!(paths.len(), Setting::ALL.len(), "two settings share a path");
        for s in Setting::ALL {
            assert_eq!(Setting::from_path(s.path()), Some(s));
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(serde_json::from_str::<Setting>(&json).unwrap(), s);
        }
    }
}
