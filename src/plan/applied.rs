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
use crate::plan::setting::Setting;
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
    /// `rollout.taintNextWave` (issue #50): records written before it was kept read as the
    /// default (on), which is not written, so their bytes and the applied digest stay.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub taint_next_wave: bool,
}

fn yes() -> bool {
    true
}

fn is_yes(b: &bool) -> bool {
    *b
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
        // Every field, no `..`: a setting added to the model does not compile until kept.
        let RolloutSettings {
            max_unavailable,
            drain_timeout,
            health_timeout,
            upgrade_attempts,
            drain,
            stage,
            stage_parallelism,
            taint_next_wave,
        } = r;
        RolloutSummary {
            max_unavailable: *max_unavailable,
            drain_timeout_secs: drain_timeout.as_secs(),
            health_timeout_secs: health_timeout.as_secs(),
            upgrade_attempts: *upgrade_attempts,
            drain: drain.clone(),
            stage: *stage,
            stage_parallelism: *stage_parallelism,
            taint_next_wave: *taint_next_wave,
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
    /// `health.silence` (issue #50: what medea silences, for how long, and what a refused
    /// silence does). The cluster's; absent in older records and when off, so their digest
    /// stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence: Option<SilenceSummary>,
}

/// `health.silence` as applied (issue #50).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SilenceSummary {
    /// The matchers, as written.
    pub matchers: Vec<String>,
    /// The label naming the node.
    pub node_label: String,
    /// How long a silence lasts past its last renewal.
    #[serde(with = "crate::duration::serde_lenient")]
    pub lease: std::time::Duration,
    /// How long after its creation a silence is no longer renewed.
    #[serde(with = "crate::duration::serde_lenient")]
    pub max_duration: std::time::Duration,
    /// What a node does when its silence is refused.
    pub on_error: crate::desired::health::SilenceOnError,
}

impl Default for HealthSummary {
    fn default() -> Self {
        HealthSummary::of(&crate::desired::health::HealthSettings::default())
    }
}

impl HealthSummary {
    /// The summary of `h`, as a record keeps it.
    pub fn of(h: &crate::desired::health::HealthSettings) -> HealthSummary {
        // Every field, no `..`: a setting added to the model does not compile until kept.
        let crate::desired::health::HealthSettings {
            prometheus: _,   // kept in `sources` (HealthSources::of)
            alertmanager: _, // kept in `sources`
            gates: _,        // kept as `gates_of(h)`
            soak,
            interval,
            failure_limit,
            inconclusive_limit,
            on_failure: _, // kept as `on_failure_of(h)`
            silence,
        } = h;
        HealthSummary {
            sources: HealthSources::of(h),
            gates: crate::plan::health::gates_of(h),
            soak: *soak,
            interval: *interval,
            failure_limit: *failure_limit,
            inconclusive_limit: *inconclusive_limit,
            on_failure: crate::plan::health::on_failure_of(h),
            silence: silence.as_ref().map(|s| {
                let crate::desired::health::SilenceSettings {
                    matchers,
                    node_label,
                    lease,
                    max_duration,
                    on_error,
                } = s;
                SilenceSummary {
                    matchers: matchers.clone(),
                    node_label: node_label.clone(),
                    lease: *lease,
                    max_duration: *max_duration,
                    on_error: *on_error,
                }
            }),
        }
    }

    fn is_default(&self) -> bool {
        *self == HealthSummary::default()
    }

    /// Every health setting of a Cluster (`pool: false`) or a NodePool (`pool: true`), in
    /// display order. No `..`: a field added here does not compile until listed or declared
    /// inert with its reason.
    fn settings(&self, pool: bool, out: &mut Vec<(Setting, String)>) {
        let HealthSummary {
            sources,
            gates,
            soak,
            interval,
            failure_limit,
            inconclusive_limit,
            // Inert on a Cluster: the pools' effective value is their `onFailure` setting.
            on_failure,
            // Inert on a NodePool: the cluster's (cleared in a pool's record).
            silence,
        } = self;
        let show = |e: &Option<crate::plan::health::Endpoint>| {
            e.as_ref().map_or_else(
                || "none".to_string(),
                crate::plan::health::Endpoint::summary,
            )
        };
        if !pool {
            // Inert on a NodePool: the sources are the cluster's (cleared in a pool's record).
            out.push((Setting::HealthPrometheus, show(&sources.prometheus)));
            out.push((Setting::HealthAlertmanager, show(&sources.alertmanager)));
        }
        out.push((Setting::HealthGates, list(gates.iter().map(Gate::summary))));
        out.push((
            Setting::GatesSkippingOperatorSilences,
            list(
                gates
                    .iter()
                    .filter(|g| g.skips_operator_silences())
                    .map(|g| g.name.clone()),
            ),
        ));
        out.push((Setting::HealthSoak, format_duration(*soak)));
        out.push((Setting::HealthInterval, format_duration(*interval)));
        out.push((Setting::HealthFailureLimit, failure_limit.to_string()));
        out.push((
            Setting::HealthInconclusiveLimit,
            inconclusive_limit.to_string(),
        ));
        if pool {
            out.push((
                Setting::OnFailure,
                match on_failure {
                    OnFailure::Halt => "halt".to_string(),
                    OnFailure::Rollback => "rollback".to_string(),
                },
            ));
            return;
        }
        let off = || "off".to_string();
        let Some(s) = silence else {
            out.extend([
                (Setting::SilenceMatchers, off()),
                (Setting::SilenceNodeLabel, off()),
                (Setting::SilenceLease, off()),
                (Setting::SilenceMaxDuration, off()),
                (Setting::SilenceOnError, off()),
            ]);
            return;
        };
        let SilenceSummary {
            matchers,
            node_label,
            lease,
            max_duration,
            on_error,
        } = s;
        out.extend([
            (Setting::SilenceMatchers, list(matchers.iter().cloned())),
            (Setting::SilenceNodeLabel, node_label.clone()),
            (Setting::SilenceLease, format_duration(*lease)),
            (Setting::SilenceMaxDuration, format_duration(*max_duration)),
            (
                Setting::SilenceOnError,
                match on_error {
                    crate::desired::health::SilenceOnError::Halt => "halt".to_string(),
                    crate::desired::health::SilenceOnError::Proceed => "proceed".to_string(),
                },
            ),
        ]);
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

    /// The plan's settings of `backup` (`None`: off), in display order.
    fn settings_of(b: Option<&BackupSummary>, out: &mut Vec<(Setting, String)>) {
        let Some(b) = b else {
            out.extend([
                (Setting::BackupSchedule, "off".to_string()),
                (Setting::BackupRetention, "none".to_string()),
                (Setting::BackupDestination, "none".to_string()),
                (Setting::BackupRecipients, "[]".to_string()),
            ]);
            return;
        };
        let BackupSummary {
            schedule,
            time_zone,
            keep,
            max_age_secs,
            destination,
            recipients,
        } = b;
        out.extend([
            (Setting::BackupSchedule, format!("{schedule} ({time_zone})")),
            (
                Setting::BackupRetention,
                match max_age_secs {
                    Some(s) => format!(
                        "keep {keep}, maxAge {}",
                        format_duration(std::time::Duration::from_secs(*s))
                    ),
                    None => format!("keep {keep}"),
                },
            ),
            (Setting::BackupDestination, destination.clone()),
            (Setting::BackupRecipients, list(recipients.iter().cloned())),
        ]);
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
    /// What a Cluster that writes nothing but its Kubernetes version would keep: what a new
    /// or removed cluster's settings are compared with (issue #50).
    pub fn baseline(&self) -> ClusterSettings {
        let approvals = ApprovalSettings::default();
        ClusterSettings {
            kubernetes_version: self.kubernetes_version.clone(),
            rollout: (&RolloutSettings::default()).into(),
            approvals_required: approvals.required,
            approvals_control_plane: approvals.control_plane,
            maintenance_windows: Vec::new(),
            exclusions: Vec::new(),
            allow_downgrade: false,
            talos_releases: Vec::new(),
            kubernetes_support: Vec::new(),
            health: HealthSummary::default(),
            acknowledge: Vec::new(),
            promotion: None,
            removed_apis: Vec::new(),
            backup: None,
            hooks: Hooks::default(),
        }
    }

    /// The settings of `c`, as a record keeps them.
    pub fn of(c: &Cluster) -> ClusterSettings {
        // Every field of the model, no `..`: a field added to `Cluster` does not compile until
        // it is kept here (and so diffed and given a bar) or declared inert with its reason.
        let Cluster {
            name: _,               // inert: the record's key
            kubernetes_version: _, // kept for information; a version is a step, not a setting
            rollout: _,
            approvals: _,
            windows: _,
            exclusions: _,
            upgrade_policy,
            health: _,
            preflight,
            promotion: _,
            backup: _,
            hooks: _,
            hook_origins: _, // inert: where each hook is written, for located diagnostics
            pools: _,        // inert: each pool is a record of its own
            document: _,     // inert: kept verbatim beside the settings, diffed as text
        } = c;
        let crate::desired::model::UpgradePolicy {
            allow_downgrade: _,
            talos_releases: _,
            kubernetes_support: _,
            removed_apis: _,
        } = upgrade_policy;
        let crate::desired::model::PreflightSettings { acknowledge: _ } = preflight;
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

    /// Every setting with its value as text, in display order. No `..`: a field added to
    /// `ClusterSettings` does not compile until listed here or declared inert with its reason.
    pub fn settings(&self) -> Vec<(Setting, String)> {
        let ClusterSettings {
            // Inert: a version is an action (the plan's Kubernetes step), not a setting.
            kubernetes_version: _,
            rollout,
            approvals_required,
            approvals_control_plane,
            maintenance_windows,
            exclusions,
            allow_downgrade,
            talos_releases,
            kubernetes_support,
            health,
            acknowledge,
            promotion,
            removed_apis,
            backup,
            hooks,
        } = self;
        let mut out = rollout_settings(rollout);
        out.push((Setting::ApprovalsRequired, approvals_required.to_string()));
        out.push((
            Setting::ApprovalsControlPlane,
            approvals_control_plane.to_string(),
        ));
        out.push((
            Setting::MaintenanceWindows,
            list(maintenance_windows.iter().map(|w| {
                format!(
                    "{} for {} ({})",
                    w.start,
                    format_duration(std::time::Duration::from_secs(w.duration_secs)),
                    w.time_zone
                )
            })),
        ));
        out.push((
            Setting::Exclusions,
            list(exclusions.iter().map(|e| e.summary())),
        ));
        out.push((Setting::AllowDowngrade, allow_downgrade.to_string()));
        out.push((
            Setting::TalosReleases,
            list(talos_releases.iter().map(|r| r.to_string())),
        ));
        out.push((
            Setting::KubernetesSupport,
            list(kubernetes_support.iter().map(|s| {
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
        out.push((Setting::RemovedApis, list(removed_apis.iter().cloned())));
        health.settings(false, &mut out);
        out.push((Setting::Acknowledge, list(acknowledge.iter().cloned())));
        out.push((
            Setting::Promotion,
            promotion.as_ref().map_or_else(
                || "none".to_string(),
                |p| format!("after {} for {}", p.after, format_duration(p.soak)),
            ),
        ));
        BackupSummary::settings_of(backup.as_ref(), &mut out);
        hook_settings(
            hooks,
            &[HookPoint::BeforeJob, HookPoint::AfterJob],
            &mut out,
        );
        out
    }
}

impl PoolSettings {
    /// What a NodePool that writes nothing but its role and machines would keep: what a new
    /// or removed pool's settings are compared with (issue #50: a new document counts as each
    /// of its settings changing from these).
    pub fn baseline(&self) -> PoolSettings {
        PoolSettings {
            role: MachineRole::Worker,
            talos_version: self.talos_version.clone(),
            installer_image: self.installer_image.clone(),
            machines: Vec::new(),
            selector: BTreeMap::new(),
            after: Vec::new(),
            rollout: (&RolloutSettings::default()).into(),
            health: HealthSummary::default(),
            hooks: Hooks::default(),
        }
    }

    /// The settings of `p`, as a record keeps them.
    pub fn of(p: &NodePool) -> PoolSettings {
        // Every field of the model, no `..` (as `ClusterSettings::of`).
        let NodePool {
            name: _,    // inert: the record's key
            cluster: _, // inert: the record's key
            role: _,
            machines: _,
            selector: _,
            talos_version: _, // kept for information; a version is a step, not a setting
            installer_image: _,
            // Inert: whether `installerImage` was written; its effect is the image kept.
            installer_named: _,
            rollout: _,
            health: _,
            after: _,
            hooks: _,
            hook_origins: _, // inert: where each hook is written, for located diagnostics
            document: _,     // inert: kept verbatim beside the settings, diffed as text
        } = p;
        PoolSettings {
            role: role_of(p.role),
            talos_version: p.talos_version.value.clone(),
            installer_image: p.installer_image.value.to_string(),
            machines: p.machines.iter().map(|m| m.value.clone()).collect(),
            selector: p.selector.clone(),
            after: p.after.iter().map(|a| a.value.clone()).collect(),
            rollout: (&p.rollout).into(),
            // The sources and the silence are the cluster's, not kept here.
            health: HealthSummary {
                sources: HealthSources::default(),
                silence: None,
                ..HealthSummary::of(&p.health)
            },
            hooks: p.hooks.clone(),
        }
    }

    /// Every setting with its value as text, in display order (as
    /// [`ClusterSettings::settings`]).
    pub fn settings(&self) -> Vec<(Setting, String)> {
        let PoolSettings {
            role,
            // Inert: a version is an action (the plan's Talos step), not a setting.
            talos_version: _,
            installer_image,
            machines,
            selector,
            after,
            rollout,
            health,
            hooks,
        } = self;
        let mut out = vec![
            (
                Setting::Role,
                match role {
                    MachineRole::Controlplane => "controlplane".to_string(),
                    MachineRole::Worker => "worker".to_string(),
                },
            ),
            (Setting::Machines, list(machines.iter().cloned())),
            (
                Setting::Selector,
                list(selector.iter().map(|(k, v)| format!("{k}={v}"))),
            ),
            (Setting::After, list(after.iter().cloned())),
            (Setting::InstallerImage, installer_image.clone()),
        ];
        out.extend(rollout_settings(rollout));
        health.settings(true, &mut out);
        hook_settings(
            hooks,
            &[
                HookPoint::BeforeWave,
                HookPoint::BeforeNode,
                HookPoint::AfterNode,
                HookPoint::AfterWave,
            ],
            &mut out,
        );
        out
    }
}

/// The plan's fields of `hooks` at `points` (`hooks.beforeNode`), each hook as
/// [`crate::desired::hooks::Hook::one_line`] says it (its summary and, for a Job hook, every
/// container with its command, privileges, host access, service account, placement and
/// Secrets: issue #49) followed by the first 12 hex digits of the sha256 of all it does: a
/// change of a Job's environment, which the line does not show, is a settings change too
/// (the resource's diff shows the text).
fn hook_settings(hooks: &Hooks, points: &[HookPoint], out: &mut Vec<(Setting, String)>) {
    out.extend(points.iter().map(|p| {
        (
            hook_setting(*p),
            list(hooks.at(*p).iter().map(|h| {
                let json = serde_json::to_vec(h).unwrap_or_default();
                let digest = hex::encode(Sha256::digest(&json));
                format!("{} #{}", h.one_line(), &digest[..12])
            })),
        )
    }));
}

/// The setting of the hooks of `point`.
pub fn hook_setting(point: HookPoint) -> Setting {
    match point {
        HookPoint::BeforeJob => Setting::HooksBeforeJob,
        HookPoint::BeforeWave => Setting::HooksBeforeWave,
        HookPoint::BeforeNode => Setting::HooksBeforeNode,
        HookPoint::AfterNode => Setting::HooksAfterNode,
        HookPoint::AfterWave => Setting::HooksAfterWave,
        HookPoint::AfterJob => Setting::HooksAfterJob,
    }
}

/// Every rollout and drain setting, in display order. No `..`: a field added to
/// `RolloutSummary` or `DrainPolicy` does not compile until listed here.
fn rollout_settings(r: &RolloutSummary) -> Vec<(Setting, String)> {
    use std::time::Duration;
    let RolloutSummary {
        max_unavailable,
        drain_timeout_secs,
        health_timeout_secs,
        upgrade_attempts,
        drain,
        stage,
        stage_parallelism,
        taint_next_wave,
    } = r;
    let crate::desired::model::DrainPolicy {
        delete_empty_dir_data,
        evict_unmanaged_pods,
        skip_pods,
        volume_detach_timeout_secs,
    } = drain;
    vec![
        (Setting::MaxUnavailable, max_unavailable.to_string()),
        (
            Setting::DrainTimeout,
            format_duration(Duration::from_secs(*drain_timeout_secs)),
        ),
        (
            Setting::HealthTimeout,
            format_duration(Duration::from_secs(*health_timeout_secs)),
        ),
        (Setting::UpgradeAttempts, upgrade_attempts.to_string()),
        (
            Setting::Stage,
            match stage {
                Stage::InWindow => "inWindow".to_string(),
                Stage::Ahead => "ahead".to_string(),
            },
        ),
        (Setting::StageParallelism, stage_parallelism.to_string()),
        (Setting::TaintNextWave, taint_next_wave.to_string()),
        (
            Setting::DeleteEmptyDirData,
            delete_empty_dir_data.to_string(),
        ),
        (
            Setting::EvictUnmanagedPods,
            evict_unmanaged_pods.to_string(),
        ),
        (
            Setting::SkipPods,
            list(skip_pods.iter().map(|(k, v)| format!("{k}={v}"))),
        ),
        (
            Setting::WaitForVolumeDetach,
            volume_detach_timeout_secs.is_some().to_string(),
        ),
        (
            Setting::VolumeDetachTimeout,
            volume_detach_timeout_secs.map_or_else(
                || "none".to_string(),
                |s| format_duration(Duration::from_secs(s)),
            ),
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
    /// The settings of the same kind of document that writes nothing (see
    /// [`ClusterSettings::baseline`]), as text.
    pub fn baseline_settings(&self) -> Vec<(Setting, String)> {
        match &self.settings {
            Settings::Cluster(c) => c.baseline().settings(),
            Settings::Pool(p) => p.baseline().settings(),
        }
    }

    /// Whether this is a control-plane pool's record.
    pub fn is_control_plane_pool(&self) -> bool {
        matches!(&self.settings, Settings::Pool(p) if p.role == MachineRole::Controlplane)
    }

    /// Every setting with its value as text, for diffs and bars.
    pub fn settings(&self) -> Vec<(Setting, String)> {
        match &self.settings {
            Settings::Cluster(c) => c.settings(),
            Settings::Pool(p) => p.settings(),
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
