//! The last-applied desired state: per resource, the YAML text and a parsed summary of its
//! settings as of the last approved plan. Plans diff against it, settings changes compare with
//! it, and the approval bar in force comes from it.
//!
//! Store layout (table `Desired`): `cluster/<name>` and `pool/<cluster>/<pool>`, each an
//! [`AppliedResource`] record. They are written only by [`super::stored::approval_writes`]
//! (resources of clusters without steps, inside the transaction that marks a plan approved) and
//! by the transaction that records a job's success (`rollout::journal::advance_txn` puts the
//! records [`super::stored::job_applies`] gave the job; issue #32), and read by the application
//! layer (`ops`, its replan use case).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::desired::hooks::{HookPoint, Hooks};
use crate::desired::model::{
    ApprovalSettings, Cluster, MinorLine, NodePool, Role, RolloutSettings, Stage, format_duration,
};
use crate::inventory::MachineRole;
use crate::plan::health::{Gate, HealthSources, OnFailure};
use crate::store::{Record, Table};
use crate::version::{KubeVersion, TalosVersion};

/// Which resource a record describes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum ResourceKey {
    /// A Cluster document.
    Cluster {
        /// The cluster's name.
        name: String,
    },
    /// A NodePool document.
    Pool {
        /// The cluster the pool belongs to.
        cluster: String,
        /// The pool's name.
        pool: String,
    },
}

impl ResourceKey {
    /// The key of cluster `name`.
    pub fn cluster(name: &str) -> ResourceKey {
        ResourceKey::Cluster { name: name.into() }
    }
    /// The key of pool `pool` of cluster `cluster`.
    pub fn pool(cluster: &str, pool: &str) -> ResourceKey {
        ResourceKey::Pool {
            cluster: cluster.into(),
            pool: pool.into(),
        }
    }
    /// The store key: `cluster/<name>` or `pool/<cluster>/<pool>`.
    pub fn store_key(&self) -> String {
        match self {
            ResourceKey::Cluster { name } => format!("cluster/{name}"),
            ResourceKey::Pool { cluster, pool } => format!("pool/{cluster}/{pool}"),
        }
    }
    /// The cluster the resource belongs to (its own name for a Cluster).
    pub fn cluster_name(&self) -> &str {
        match self {
            ResourceKey::Cluster { name } => name,
            ResourceKey::Pool { cluster, .. } => cluster,
        }
    }
    /// How plans name the resource: `cluster` or `pool <name>`.
    pub fn label(&self) -> String {
        match self {
            ResourceKey::Cluster { .. } => "cluster".into(),
            ResourceKey::Pool { pool, .. } => format!("pool {pool}"),
        }
    }
}

/// Rollout parameters, durations in seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSummary {
    /// Machines of a pool away at once (`rollout.maxUnavailable`).
    pub max_unavailable: u32,
    /// How long PodDisruptionBudgets may block a drain (`rollout.drainTimeout`).
    pub drain_timeout_secs: u64,
    /// How long a node may take to come back healthy (`rollout.healthTimeout`).
    pub health_timeout_secs: u64,
    /// Records written before the field existed read as the default; the default is not
    /// written, so the applied basis of a store that never set it stays what it was.
    #[serde(
        default = "default_upgrade_attempts",
        skip_serializing_if = "is_default_upgrade_attempts"
    )]
    pub upgrade_attempts: u32,
    /// Records written before the drain policy existed read as the default policy (not
    /// written when default, like `upgrade_attempts`).
    #[serde(default = "default_drain", skip_serializing_if = "is_default_drain")]
    pub drain: crate::desired::model::DrainPolicy,
    /// `rollout.stage` (issue #36): when the pool installs the new Talos. Records written
    /// before the field existed read as `inWindow`, which is not written, so their bytes and
    /// the applied digest stay what they were.
    #[serde(default, skip_serializing_if = "is_in_window")]
    pub stage: Stage,
    /// `rollout.stageParallelism` (issue #36): nodes installing ahead at once. Records written
    /// before the field existed read as the default, which is not written.
    #[serde(
        default = "default_stage_parallelism",
        skip_serializing_if = "is_default_stage_parallelism"
    )]
    pub stage_parallelism: u32,
}

fn is_in_window(s: &Stage) -> bool {
    *s == Stage::InWindow
}

fn default_stage_parallelism() -> u32 {
    crate::desired::model::DEFAULT_STAGE_PARALLELISM
}

fn is_default_stage_parallelism(n: &u32) -> bool {
    *n == default_stage_parallelism()
}

fn default_upgrade_attempts() -> u32 {
    crate::desired::model::DEFAULT_UPGRADE_ATTEMPTS
}

fn is_default_upgrade_attempts(n: &u32) -> bool {
    *n == default_upgrade_attempts()
}

fn default_drain() -> crate::desired::model::DrainPolicy {
    crate::desired::model::DrainPolicy::default()
}

fn is_default_drain(d: &crate::desired::model::DrainPolicy) -> bool {
    *d == default_drain()
}

impl From<&RolloutSettings> for RolloutSummary {
    fn from(r: &RolloutSettings) -> Self {
        RolloutSummary {
            max_unavailable: r.max_unavailable,
            drain_timeout_secs: r.drain_timeout.as_secs(),
            health_timeout_secs: r.health_timeout.as_secs(),
            upgrade_attempts: r.upgrade_attempts,
            drain: r.drain.clone(),
            stage: r.stage,
            stage_parallelism: r.stage_parallelism,
        }
    }
}

/// A maintenance window as applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowSummary {
    /// The cron expression of its start, as written.
    pub start: String,
    /// How long it stays open, in seconds.
    pub duration_secs: u64,
    /// The time zone the cron expression is read in.
    pub time_zone: String,
}

/// One row of `kubernetesSupport` as applied: a Talos minor's supported Kubernetes minors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SupportSummary {
    /// The Talos minor.
    pub talos: MinorLine,
    /// The oldest Kubernetes minor it supports.
    pub min_kubernetes: MinorLine,
    /// The newest Kubernetes minor it supports.
    pub max_kubernetes: MinorLine,
}

/// Health settings as applied (issue #32): where health data and credentials go, the gates,
/// their timing and the failure policy. Records written before it read as the defaults (no
/// source, no gate), and the defaults are not written, so an unchanged store keeps its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthSummary {
    /// Where health data comes from (Prometheus, Alertmanager).
    #[serde(default, skip_serializing_if = "HealthSources::is_empty")]
    pub sources: HealthSources,
    /// The gates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<Gate>,
    /// How long every gate passes continuously after a wave.
    #[serde(with = "crate::duration::serde_lenient")]
    pub soak: std::time::Duration,
    /// How often gates are evaluated.
    #[serde(with = "crate::duration::serde_lenient")]
    pub interval: std::time::Duration,
    /// Consecutive failed evaluations before a gate fails.
    pub failure_limit: u32,
    /// Inconclusive evaluations before a gate halts the job (issue #35); not written when it
    /// is the default, so records made before it keep their digest.
    #[serde(
        default = "crate::plan::health::default_inconclusive_limit",
        skip_serializing_if = "crate::plan::health::is_default_inconclusive_limit"
    )]
    pub inconclusive_limit: u32,
    /// What a failed gate does (halt, or roll the wave back).
    #[serde(default)]
    pub on_failure: OnFailure,
}

impl Default for HealthSummary {
    fn default() -> Self {
        HealthSummary::of(&crate::desired::health::HealthSettings::default())
    }
}

impl HealthSummary {
    /// The summary of `h`, as a record keeps it.
    pub fn of(h: &crate::desired::health::HealthSettings) -> HealthSummary {
        HealthSummary {
            sources: HealthSources::of(h),
            gates: crate::plan::health::gates_of(h),
            soak: h.soak,
            interval: h.interval,
            failure_limit: h.failure_limit,
            inconclusive_limit: h.inconclusive_limit,
            on_failure: crate::plan::health::on_failure_of(h),
        }
    }

    fn is_default(&self) -> bool {
        *self == HealthSummary::default()
    }

    /// The gate fields, in display order (sources are the cluster's: see [`Self::source_fields`]).
    fn gate_fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("health.gates", list(self.gates.iter().map(Gate::summary))),
            ("health.soak", format_duration(self.soak)),
            ("health.interval", format_duration(self.interval)),
            ("health.failureLimit", self.failure_limit.to_string()),
            (
                "health.inconclusiveLimit",
                self.inconclusive_limit.to_string(),
            ),
        ]
    }

    /// Where health data and credentials go.
    fn source_fields(&self) -> Vec<(&'static str, String)> {
        let show = |e: &Option<crate::plan::health::Endpoint>| {
            e.as_ref().map_or_else(
                || "none".to_string(),
                crate::plan::health::Endpoint::summary,
            )
        };
        vec![
            ("health.prometheus", show(&self.sources.prometheus)),
            ("health.alertmanager", show(&self.sources.alertmanager)),
        ]
    }
}

/// `spec.promotion` as applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromotionSummary {
    /// The cluster this one is promoted after.
    pub after: String,
    /// How long a version must have run there first.
    #[serde(with = "crate::duration::serde_lenient")]
    pub soak: std::time::Duration,
}

/// The settings fields naming where health data or credentials go: a change to any needs the
/// highest approval bar in force (issue #32). A backup holds every Secret of its cluster, so
/// where backups go and who can decrypt them count too (issue #37).
pub const SOURCE_FIELDS: [&str; 4] = [
    "health.prometheus",
    "health.alertmanager",
    "backup.destination",
    "backup.recipients",
];

/// `spec.backup` as applied (issue #37): what the server's backup task runs. It runs the
/// applied (signed) settings, never an unapproved revision's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupSummary {
    /// The 5-field cron expression, as written.
    pub schedule: String,
    /// The IANA zone it is read in.
    pub time_zone: String,
    /// How many of the newest backups are kept.
    pub keep: u32,
    /// Older backups are deleted (seconds); `None`: no age limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_secs: Option<u64>,
    /// The destination's name.
    pub destination: String,
    /// The age recipients (`age1…`).
    pub recipients: Vec<String>,
}

impl BackupSummary {
    /// The summary of validated settings.
    pub fn of(b: &crate::desired::backup::BackupSettings) -> BackupSummary {
        BackupSummary {
            schedule: b.schedule.expression().to_string(),
            time_zone: b.schedule.time_zone().to_string(),
            keep: b.retention.keep,
            max_age_secs: b.retention.max_age.map(|d| d.as_secs()),
            destination: b.destination.clone(),
            recipients: b
                .recipients
                .iter()
                .map(|r| r.as_str().to_string())
                .collect(),
        }
    }

    /// The settings again, checked as the loader checks them (a record written by another
    /// medea version may hold what this one refuses).
    pub fn settings(
        &self,
    ) -> Result<crate::desired::backup::BackupSettings, crate::desired::backup::SummaryError> {
        use crate::desired::backup::{
            BackupSchedule, BackupSettings, Recipient, Retention, SummaryError,
        };
        let schedule =
            BackupSchedule::new(&self.schedule, &self.time_zone).map_err(SummaryError::Schedule)?;
        let recipients = self
            .recipients
            .iter()
            .map(|r| {
                Recipient::parse(r).map_err(|reason| SummaryError::Recipient {
                    recipient: r.clone(),
                    reason,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if recipients.is_empty() {
            return Err(SummaryError::NoRecipient);
        }
        Ok(BackupSettings {
            schedule,
            retention: Retention {
                keep: self.keep.max(1),
                max_age: self.max_age_secs.map(std::time::Duration::from_secs),
            },
            destination: self.destination.clone(),
            recipients,
        })
    }

    /// The plan's fields of `backup` (`None`: off).
    fn fields(b: Option<&BackupSummary>) -> Vec<(&'static str, String)> {
        let Some(b) = b else {
            return vec![
                ("backup.schedule", "off".to_string()),
                ("backup.retention", "none".to_string()),
                ("backup.destination", "none".to_string()),
                ("backup.recipients", "[]".to_string()),
            ];
        };
        vec![
            (
                "backup.schedule",
                format!("{} ({})", b.schedule, b.time_zone),
            ),
            (
                "backup.retention",
                match b.max_age_secs {
                    Some(s) => format!(
                        "keep {}, maxAge {}",
                        b.keep,
                        format_duration(std::time::Duration::from_secs(s))
                    ),
                    None => format!("keep {}", b.keep),
                },
            ),
            ("backup.destination", b.destination.clone()),
            ("backup.recipients", list(b.recipients.iter().cloned())),
        ]
    }
}

/// A Cluster's settings as applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSettings {
    /// The target at the time (informational; versions are actions, not settings).
    pub kubernetes_version: KubeVersion,
    /// The cluster's rollout parameters.
    pub rollout: RolloutSummary,
    /// Approvals from distinct people every plan needs (`approvals.required`).
    pub approvals_required: u32,
    /// Approvals a plan touching control planes or Kubernetes needs (`approvals.controlPlane`).
    pub approvals_control_plane: u32,
    /// `maintenanceWindows`.
    pub maintenance_windows: Vec<WindowSummary>,
    /// `maintenance.exclusions` (issue #36; absent in older records and when empty, so the
    /// applied digest of a store without exclusions is unchanged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclusions: Vec<crate::desired::exclusion::Exclusion>,
    /// `rollout.allowDowngrade`.
    pub allow_downgrade: bool,
    /// `talosReleases`: extra releases the upgrade path may stop at.
    pub talos_releases: Vec<TalosVersion>,
    /// `kubernetesSupport`: catalog overrides.
    pub kubernetes_support: Vec<SupportSummary>,
    /// `health:` (issue #32; absent in older records: the defaults).
    #[serde(default, skip_serializing_if = "HealthSummary::is_default")]
    pub health: HealthSummary,
    /// `preflight.acknowledge`, as written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acknowledge: Vec<String>,
    /// `spec.promotion`, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promotion: Option<PromotionSummary>,
    /// `upgradePolicy.removedApis`, one line per row.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_apis: Vec<String>,
    /// `spec.backup`, if set (issue #37; absent in older records: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSummary>,
    /// `spec.hooks` (issue #35; absent in older records and when empty: none, so the
    /// applied digest of a store without hooks is unchanged).
    #[serde(default, skip_serializing_if = "Hooks::is_empty")]
    pub hooks: Hooks,
}

/// A NodePool's settings as applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSettings {
    /// The pool's role.
    pub role: MachineRole,
    /// The target at the time (informational; versions are actions, not settings).
    pub talos_version: TalosVersion,
    /// The installer image, as written.
    pub installer_image: String,
    /// Machines named explicitly.
    pub machines: Vec<String>,
    /// Machines picked by label.
    pub selector: BTreeMap<String, String>,
    /// Pools of the cluster this pool rolls after.
    pub after: Vec<String>,
    /// The pool's effective rollout parameters.
    pub rollout: RolloutSummary,
    /// The pool's effective gates, timing and `onFailure` (issue #32; sources are the
    /// cluster's and not kept here). Absent in older records: the defaults.
    #[serde(default, skip_serializing_if = "HealthSummary::is_default")]
    pub health: HealthSummary,
    /// `spec.hooks` (issue #35; absent in older records and when empty: none).
    #[serde(default, skip_serializing_if = "Hooks::is_empty")]
    pub hooks: Hooks,
}

/// The settings of one resource, by kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum Settings {
    /// A Cluster's.
    Cluster(ClusterSettings),
    /// A NodePool's.
    Pool(PoolSettings),
}

/// One resource as last applied (or as a plan will apply it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedResource {
    /// Which resource.
    pub key: ResourceKey,
    /// File of the document, relative to the desired root.
    pub file: String,
    /// The YAML document as written.
    pub document: String,
    /// Its settings.
    pub settings: Settings,
}

impl Record for AppliedResource {
    const TABLE: Table = Table::Desired;
    const KIND: &'static str = "applied-resource";
    const SCHEMA: u32 = 1;
}

/// The inventory's machine role of a desired pool role.
pub fn role_of(r: Role) -> MachineRole {
    match r {
        Role::Controlplane => MachineRole::Controlplane,
        Role::Worker => MachineRole::Worker,
    }
}

impl ClusterSettings {
    /// The settings of `c`, as a record keeps them.
    pub fn of(c: &Cluster) -> ClusterSettings {
        ClusterSettings {
            kubernetes_version: c.kubernetes_version.value.clone(),
            rollout: (&c.rollout).into(),
            approvals_required: c.approvals.required,
            approvals_control_plane: c.approvals.control_plane,
            maintenance_windows: c
                .windows
                .iter()
                .map(|w| WindowSummary {
                    start: w.start().to_string(),
                    duration_secs: w.duration().as_secs(),
                    time_zone: w.time_zone().to_string(),
                })
                .collect(),
            exclusions: c.exclusions.clone(),
            allow_downgrade: c.upgrade_policy.allow_downgrade,
            talos_releases: c.upgrade_policy.talos_releases.clone(),
            kubernetes_support: c
                .upgrade_policy
                .kubernetes_support
                .iter()
                .map(|s| SupportSummary {
                    talos: s.talos,
                    min_kubernetes: s.min_kubernetes,
                    max_kubernetes: s.max_kubernetes,
                })
                .collect(),
            health: HealthSummary::of(&c.health),
            acknowledge: c
                .preflight
                .acknowledge
                .iter()
                .map(|a| a.value.clone())
                .collect(),
            promotion: c.promotion.as_ref().map(|p| PromotionSummary {
                after: p.after.value.clone(),
                soak: p.soak,
            }),
            removed_apis: c
                .upgrade_policy
                .removed_apis
                .iter()
                .map(|r| {
                    format!(
                        "{} {} ({}): deprecated v{}.{}, removed v{}.{}{}",
                        r.api_version(),
                        r.resource,
                        r.kind,
                        r.deprecated.0,
                        r.deprecated.1,
                        r.removed.0,
                        r.removed.1,
                        r.replacement
                            .as_ref()
                            .map_or(String::new(), |x| format!(", use {x}"))
                    )
                })
                .collect(),
            backup: c.backup.as_ref().map(BackupSummary::of),
            hooks: c.hooks.clone(),
        }
    }

    /// The approval bar these settings set.
    pub fn approvals(&self) -> ApprovalSettings {
        ApprovalSettings {
            required: self.approvals_required,
            control_plane: self.approvals_control_plane,
        }
    }

    /// The inert fields, in display order: `(dotted YAML path, value as text)`.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut out = rollout_fields(&self.rollout);
        out.push(("approvals.required", self.approvals_required.to_string()));
        out.push((
            "approvals.controlPlane",
            self.approvals_control_plane.to_string(),
        ));
        out.push((
            "maintenanceWindows",
            list(self.maintenance_windows.iter().map(|w| {
                format!(
                    "{} for {} ({})",
                    w.start,
                    format_duration(std::time::Duration::from_secs(w.duration_secs)),
                    w.time_zone
                )
            })),
        ));
        out.push((
            "maintenance.exclusions",
            list(self.exclusions.iter().map(|e| e.summary())),
        ));
        out.push((
            "upgradePolicy.allowDowngrade",
            self.allow_downgrade.to_string(),
        ));
        out.push((
            "upgradePolicy.talosReleases",
            list(self.talos_releases.iter().map(|r| r.to_string())),
        ));
        out.push((
            "upgradePolicy.kubernetesSupport",
            list(self.kubernetes_support.iter().map(|s| {
                format!(
                    "Talos v{}.{}: v{}.{}-v{}.{}",
                    s.talos.0,
                    s.talos.1,
                    s.min_kubernetes.0,
                    s.min_kubernetes.1,
                    s.max_kubernetes.0,
                    s.max_kubernetes.1
                )
            })),
        ));
        out.push((
            "upgradePolicy.removedApis",
            list(self.removed_apis.iter().cloned()),
        ));
        out.extend(self.health.source_fields());
        out.extend(self.health.gate_fields());
        out.push((
            "preflight.acknowledge",
            list(self.acknowledge.iter().cloned()),
        ));
        out.push((
            "promotion",
            self.promotion.as_ref().map_or_else(
                || "none".to_string(),
                |p| format!("after {} for {}", p.after, format_duration(p.soak)),
            ),
        ));
        out.extend(BackupSummary::fields(self.backup.as_ref()));
        out.extend(hook_fields(
            &self.hooks,
            &[HookPoint::BeforeJob, HookPoint::AfterJob],
        ));
        out
    }
}

impl PoolSettings {
    /// The settings of `p`, as a record keeps them.
    pub fn of(p: &NodePool) -> PoolSettings {
        PoolSettings {
            role: role_of(p.role),
            talos_version: p.talos_version.value.clone(),
            installer_image: p.installer_image.value.to_string(),
            machines: p.machines.iter().map(|m| m.value.clone()).collect(),
            selector: p.selector.clone(),
            after: p.after.iter().map(|a| a.value.clone()).collect(),
            rollout: (&p.rollout).into(),
            health: HealthSummary {
                sources: HealthSources::default(),
                ..HealthSummary::of(&p.health)
            },
            hooks: p.hooks.clone(),
        }
    }

    /// The inert fields, in display order: `(dotted YAML path, value as text)`.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            (
                "role",
                match self.role {
                    MachineRole::Controlplane => "controlplane".to_string(),
                    MachineRole::Worker => "worker".to_string(),
                },
            ),
            ("machines", list(self.machines.iter().cloned())),
            (
                "selector.matchLabels",
                list(self.selector.iter().map(|(k, v)| format!("{k}={v}"))),
            ),
            ("after", list(self.after.iter().cloned())),
            ("talos.installerImage", self.installer_image.clone()),
        ];
        out.extend(rollout_fields(&self.rollout));
        out.extend(self.health.gate_fields());
        out.push((
            "onFailure",
            match self.health.on_failure {
                OnFailure::Halt => "halt".to_string(),
                OnFailure::Rollback => "rollback".to_string(),
            },
        ));
        out.extend(hook_fields(
            &self.hooks,
            &[
                HookPoint::BeforeWave,
                HookPoint::BeforeNode,
                HookPoint::AfterNode,
                HookPoint::AfterWave,
            ],
        ));
        out
    }
}

/// The plan's fields of `hooks` at `points` (`hooks.beforeNode`), each hook as
/// [`crate::desired::hooks::Hook::one_line`] says it (its summary and, for a Job hook, every
/// container with its command, privileges, host access, service account, placement and
/// Secrets: issue #49) followed by the first 12 hex digits of the sha256 of all it does: a
/// change of a Job's environment, which the line does not show, is a settings change too
/// (the resource's diff shows the text).
fn hook_fields(hooks: &Hooks, points: &[HookPoint]) -> Vec<(&'static str, String)> {
    points
        .iter()
        .map(|p| {
            (
                hook_field(*p),
                list(hooks.at(*p).iter().map(|h| {
                    let json = serde_json::to_vec(h).unwrap_or_default();
                    let digest = hex::encode(Sha256::digest(&json));
                    format!("{} #{}", h.one_line(), &digest[..12])
                })),
            )
        })
        .collect()
}

/// The dotted field of the hooks of `point`.
pub fn hook_field(point: HookPoint) -> &'static str {
    match point {
        HookPoint::BeforeJob => "hooks.beforeJob",
        HookPoint::BeforeWave => "hooks.beforeWave",
        HookPoint::BeforeNode => "hooks.beforeNode",
        HookPoint::AfterNode => "hooks.afterNode",
        HookPoint::AfterWave => "hooks.afterWave",
        HookPoint::AfterJob => "hooks.afterJob",
    }
}

fn rollout_fields(r: &RolloutSummary) -> Vec<(&'static str, String)> {
    use std::time::Duration;
    vec![
        ("rollout.maxUnavailable", r.max_unavailable.to_string()),
        (
            "rollout.drainTimeout",
            format_duration(Duration::from_secs(r.drain_timeout_secs)),
        ),
        (
            "rollout.healthTimeout",
            format_duration(Duration::from_secs(r.health_timeout_secs)),
        ),
        ("rollout.upgradeAttempts", r.upgrade_attempts.to_string()),
        (
            "rollout.stage",
            match r.stage {
                Stage::InWindow => "inWindow".to_string(),
                Stage::Ahead => "ahead".to_string(),
            },
        ),
        ("rollout.stageParallelism", r.stage_parallelism.to_string()),
        (
            "drain.deleteEmptyDirData",
            r.drain.delete_empty_dir_data.to_string(),
        ),
        (
            "drain.evictUnmanagedPods",
            r.drain.evict_unmanaged_pods.to_string(),
        ),
        (
            "drain.skipPods.matchLabels",
            list(r.drain.skip_pods.iter().map(|(k, v)| format!("{k}={v}"))),
        ),
    ]
}

fn list(items: impl Iterator<Item = String>) -> String {
    let v: Vec<String> = items.collect();
    if v.is_empty() {
        "[]".into()
    } else {
        format!("[{}]", v.join(", "))
    }
}

impl AppliedResource {
    /// The record of Cluster `c`.
    pub fn of_cluster(c: &Cluster) -> AppliedResource {
        AppliedResource {
            key: ResourceKey::cluster(&c.name.value),
            file: c.name.origin.file.clone(),
            document: c.document.clone(),
            settings: Settings::Cluster(ClusterSettings::of(c)),
        }
    }
    /// The record of NodePool `p`.
    pub fn of_pool(p: &NodePool) -> AppliedResource {
        AppliedResource {
            key: ResourceKey::pool(&p.cluster.value, &p.name.value),
            file: p.name.origin.file.clone(),
            document: p.document.clone(),
            settings: Settings::Pool(PoolSettings::of(p)),
        }
    }
    /// Every setting as (field path, value), for diffs.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        match &self.settings {
            Settings::Cluster(c) => c.fields(),
            Settings::Pool(p) => p.fields(),
        }
    }
}

/// Every resource as last applied, by store key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastApplied {
    /// By store key ([`ResourceKey::store_key`]).
    pub resources: BTreeMap<String, AppliedResource>,
}

impl LastApplied {
    /// Keyed by their store keys.
    pub fn from_resources(rs: impl IntoIterator<Item = AppliedResource>) -> LastApplied {
        LastApplied {
            resources: rs.into_iter().map(|r| (r.key.store_key(), r)).collect(),
        }
    }
    /// The resource `key`, if it was applied.
    pub fn get(&self, key: &ResourceKey) -> Option<&AppliedResource> {
        self.resources.get(&key.store_key())
    }
    /// The settings of cluster `name`, if it was applied.
    pub fn cluster_settings(&self, name: &str) -> Option<&ClusterSettings> {
        match &self.get(&ResourceKey::cluster(name))?.settings {
            Settings::Cluster(c) => Some(c),
            Settings::Pool(_) => None,
        }
    }
    /// The approval bar in force for a cluster: the applied one, or the defaults.
    pub fn approvals_in_force(&self, cluster: &str) -> ApprovalSettings {
        self.cluster_settings(cluster)
            .map(ClusterSettings::approvals)
            .unwrap_or_default()
    }
    /// Cluster names with any applied resource.
    pub fn cluster_names(&self) -> std::collections::BTreeSet<String> {
        self.resources
            .values()
            .map(|r| r.key.cluster_name().to_string())
            .collect()
    }
    /// sha256 (hex) over the canonical JSON of every record: part of a plan's basis.
    #[allow(
        clippy::expect_used,
        reason = "plain structs with string keys and no non-finite floats: serializing them to JSON cannot fail"
    )]
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"medea-applied-v1\0");
        h.update(serde_json::to_vec(&self.resources).expect("applied records serialize"));
        hex::encode(h.finalize())
    }
}
