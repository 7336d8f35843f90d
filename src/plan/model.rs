//! What a plan says: immutable, bound to its basis, ordered into steps.
//!
//! These types are the contract between the planner (which builds them), the approval layer
//! (which signs `Plan::id`), the store (which keeps them) and the rollout executor (which turns
//! an approved plan's steps into jobs).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::applied::{AppliedResource, ResourceKey};
use super::catalog::Catalog;
use super::id::PlanId;
use crate::desired::Revision;
use crate::desired::model::{DrainPolicy, MinorLine};
use crate::inventory::MachineRole;
use crate::version::{KubeVersion, TalosVersion};

/// What a plan was computed from. A plan whose basis differs from the store's current basis
/// is stale and can never be approved or started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Basis {
    /// Content revision of the desired state (commit sha recorded alongside in git mode).
    pub desired: Revision,
    /// Observed generation of every cluster the desired state names (absent = never observed).
    pub observed: BTreeMap<String, u64>,
    /// Digest of the last-applied desired state ([`super::applied::LastApplied::digest`]): a
    /// plan computed against settings that have since been applied by another plan is stale
    /// too, so it can never be approved under an approval bar that is no longer in force.
    #[serde(default)]
    pub applied: String,
    /// The running rollout job of each cluster that has one (cluster → job id): a plan
    /// computed while a job runs plans nothing for that cluster, and becomes stale when the
    /// job ends.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub running: BTreeMap<String, String>,
    /// The newest rollout job of each cluster whose newest job halted (cluster → job id): the
    /// plan that continues from what the job left is a plan of its own, with approvals of its
    /// own, even when nothing else moved ([`crate::plan::compute::after_halts`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub halted: BTreeMap<String, String>,
}

impl Basis {
    /// The basis as far as plan identity goes: the git commit is recorded for people but is
    /// not part of it, so committing an approval marker (a new commit, same resource files)
    /// never makes the plan it approves stale.
    pub fn identity(&self) -> Basis {
        let mut b = self.clone();
        b.desired.commit = None;
        b
    }
}

/// One machine of a Talos rollout wave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineTarget {
    /// The Kubernetes node name.
    pub node: String,
    /// The machine id (the inventory's).
    pub id: String,
    /// The address its Talos API answers on.
    pub address: String,
    /// The version the machine runs before this hop.
    pub from: TalosVersion,
    /// This machine's installer image when it is not the step's [`TalosRollout::image`]: a pool
    /// that names no installer gets each node's own Image Factory installer on hops to Talos
    /// 1.14 and later, which differs between nodes of other platforms or schematics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// Talos OS rollout of one pool, one hop (one minor line) of its upgrade path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TalosRollout {
    /// The pool's name.
    pub pool: String,
    /// The pool's role.
    pub role: MachineRole,
    /// 1-based hop number and total hops of this pool's path.
    pub hop: u32,
    /// Total hops of this pool's path.
    pub hops: u32,
    /// The version this hop installs.
    pub to: TalosVersion,
    /// Installer image reference with tag, e.g. `factory.talos.dev/installer/<id>:v1.13.9`.
    pub image: String,
    /// Machines away at once.
    pub max_unavailable: u32,
    /// How long PodDisruptionBudgets may block a drain.
    #[serde(with = "secs")]
    pub drain_timeout: Duration,
    /// How long a node may take to come back healthy after its reboot.
    #[serde(with = "secs")]
    pub health_timeout: Duration,
    /// Upgrade calls per node before the job halts (`rollout.upgradeAttempts`). Plans made
    /// before the field existed allowed one definitive failure (they halted on it).
    #[serde(default = "one_attempt")]
    pub upgrade_attempts: u32,
    /// Which pods the drain evicts. Plans made before the field existed refused pods with
    /// emptyDir volumes and bare pods ([`DrainPolicy::legacy`]): a job keeps what was approved.
    #[serde(default = "DrainPolicy::legacy")]
    pub drain: DrainPolicy,
    /// Machines in order, grouped into waves that may be away together.
    pub waves: Vec<Vec<MachineTarget>>,
    /// The pool's effective health gates (issue #23); `None`: no gates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<super::health::HealthPolicy>,
    /// The silences of each node's expected alerts while it is drained and rebooted (issue
    /// #35); `None`: nothing is silenced. Not written when absent, so plans without one keep
    /// their ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence: Option<Box<super::health::SilencePolicy>>,
    /// Before each wave starts, taint the next wave's nodes `PreferNoSchedule` so pods evicted
    /// now avoid them (`rollout.taintNextWave`, issue #35). Written only when off, so plans
    /// made before the setting existed keep their ids (and read as on).
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub taint_next_wave: bool,
    /// The pool's blocking hooks around each node and wave (issue #35); `None`: none. Not
    /// written when absent, so plans without hooks keep their ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<Box<crate::desired::hooks::Hooks>>,
    /// `rollout.stage: ahead` (issue #36): the hop's nodes that can (Talos >= 1.13) install
    /// without a reboot as soon as the job reaches the step, windows or not; `None`: every node
    /// installs in the window. Not written when absent, so plans without it keep their ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<StageAhead>,
}

/// How a hop stages its installs ahead of the maintenance windows (`rollout.stage: ahead`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageAhead {
    /// Nodes installing at once (`rollout.stageParallelism`; control-plane steps: 1).
    pub parallelism: u32,
}

impl TalosRollout {
    /// The installer image `m` is upgraded with: its own when it has one, else the step's.
    pub fn image_for<'a>(&'a self, m: &'a MachineTarget) -> &'a str {
        m.image.as_deref().unwrap_or(&self.image)
    }

    /// Whether `m` installs ahead of the windows: the step stages (`rollout.stage: ahead`) and
    /// `m` runs a Talos that installs without rebooting (>= 1.13, the lifecycle path). The
    /// others of a staging step install in the window as before. (A node whose bootloader
    /// cannot report its next boot is found only when the job observes it: it too installs in
    /// the window.)
    pub fn stages(&self, m: &MachineTarget) -> bool {
        self.stage.is_some() && m.from.upgrades_through_lifecycle()
    }

    /// How many nodes install ahead at once: the plan's parallelism, 1 on the control plane.
    pub fn stage_parallelism(&self) -> usize {
        match &self.stage {
            None => 0,
            Some(_) if self.role == crate::inventory::MachineRole::Controlplane => 1,
            Some(s) => s.parallelism.max(1) as usize,
        }
    }
}

fn one_attempt() -> u32 {
    1
}

fn yes() -> bool {
    true
}

fn is_yes(b: &bool) -> bool {
    *b
}

/// Kubernetes rollout of a whole cluster (the upgrade-k8s sequence).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeRollout {
    /// The version the cluster runs.
    pub from: KubeVersion,
    /// The version it moves to (one minor at most).
    pub to: KubeVersion,
    /// Control-plane node names, in order (one at a time).
    pub control_plane: Vec<String>,
    /// Worker node names, in order (kubelet upgrades).
    pub workers: Vec<String>,
    /// How long a node may take to come back healthy.
    #[serde(with = "secs")]
    pub health_timeout: Duration,
    /// The Talos minors that support `to`, from the cluster's compatibility catalog (built-in
    /// tables plus `upgradePolicy.kubernetesSupport`), written `v1.13`. The executor's
    /// pre-check reads this list, so the planner and the executor apply one rule. `None` only
    /// in plans stored by a medea that did not record it: the built-in catalog then applies.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "minor_lines")]
    pub supported_talos: Option<Vec<MinorLine>>,
}

impl KubeRollout {
    /// Whether a node running Talos `talos` may run this rollout's target Kubernetes.
    pub fn talos_supports_target(&self, talos: &TalosVersion) -> bool {
        match &self.supported_talos {
            Some(minors) => minors.contains(&talos.minor_line()),
            None => Catalog::builtin()
                .window(talos.minor_line())
                .is_some_and(|w| w.contains(&self.to)),
        }
    }
}

/// One step of a cluster's plan. Steps run strictly one after another, so a Talos rollout and
/// a Kubernetes rollout of one cluster are never in the same wave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum Step {
    /// A Talos hop of one pool.
    Talos(TalosRollout),
    /// A Kubernetes upgrade of the cluster.
    Kubernetes(KubeRollout),
}

impl Step {
    /// Whether the step upgrades a control-plane node or Kubernetes.
    pub fn touches_control_plane(&self) -> bool {
        match self {
            Step::Talos(t) => t.role == MachineRole::Controlplane,
            Step::Kubernetes(_) => true,
        }
    }
}

/// An inert change: applied to the store on approval, acts on nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SettingsChange {
    /// `cluster` or `pool <name>`.
    pub resource: String,
    /// Dotted field path, e.g. `rollout.drainTimeout`.
    pub field: String,
    /// The value last applied.
    pub from: String,
    /// The value the plan applies.
    pub to: String,
}

/// Whether a cluster could be planned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ClusterStatus {
    /// Observed and planned.
    #[default]
    Planned,
    /// Named by the desired state but never observed: no steps, no settings (run `medea seed`).
    NotObserved,
    /// Applied before, gone from the desired state: medea stops managing it on approval.
    Removed,
    /// A rollout job of the cluster is running: nothing is planned for it until it ends.
    RollingOut,
}

/// A unified diff of one resource's YAML against its last applied version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceDiff {
    /// `cluster` or `pool <name>`.
    pub resource: String,
    /// The document's file, relative to the desired root.
    pub file: String,
    /// Unified diff text (`---`/`+++` header, `@@` hunks).
    pub diff: String,
}

/// Everything the plan does to one cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPlan {
    /// The cluster's name.
    pub cluster: String,
    /// In execution order.
    pub steps: Vec<Step>,
    /// Settings that change, field by field.
    pub settings: Vec<SettingsChange>,
    /// Pools with nothing to do.
    pub unchanged: Vec<String>,
    /// Whether the cluster can be planned, and why not.
    #[serde(default)]
    pub status: ClusterStatus,
    /// Facts the operator should read (unmanaged machines, gates off, ...), in a stable order.
    /// Typed ([`crate::plan::note::Note`]); a stored plan's bare-string notes read back as
    /// `Note::Legacy`.
    #[serde(default, with = "crate::plan::note::list")]
    pub notes: Vec<crate::plan::note::Note>,
    /// YAML diffs of the resources this plan changes.
    #[serde(default)]
    pub diffs: Vec<ResourceDiff>,
    /// Preflight findings (issue #22), in a stable order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preflight: Vec<super::preflight::Finding>,
    /// The cluster's health gates (issue #23): before the job, after it, and for steps
    /// without a pool of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<super::health::HealthPolicy>,
    /// The cluster's blocking hooks before and after the job (issue #35), when it has steps;
    /// `None`: none (not written, so plans without hooks keep their ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<crate::desired::hooks::Hooks>,
    /// The setting changes that need more than the ordinary bar (issue #50), each with the
    /// bar it needs ([`crate::plan::bar::bar_of_change`]): the typed reason of the plan's bar,
    /// part of its id. Not written when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raised_by: Vec<crate::plan::bar::BarRaise>,
}

impl ClusterPlan {
    /// Whether the cluster has a step or a settings change.
    pub fn has_changes(&self) -> bool {
        !self.steps.is_empty() || !self.settings.is_empty()
    }
}

/// What approving the plan writes as the new last-applied state (table `Desired`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Applies {
    /// Resources to record as applied.
    pub put: Vec<AppliedResource>,
    /// Resources to forget (removed from the desired state).
    pub delete: Vec<ResourceKey>,
}

/// An immutable plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// sha256 over the canonical encoding of `basis` and `clusters` (not `parent`).
    pub id: PlanId,
    /// The plan that was current before this one, if any.
    pub parent: Option<PlanId>,
    /// What it was computed from: it is stale once this changes.
    pub basis: Basis,
    /// Clusters by name order. Each section is shared (`Arc`) with the planner's memo and
    /// every holder of this plan, so a reused section is never copied.
    pub clusters: Vec<std::sync::Arc<ClusterPlan>>,
    /// Distinct signers needed: the highest requirement of any changed cluster, counting the
    /// settings in force before this plan when the plan changes them.
    pub approvals_required: u32,
    /// Version of the compatibility catalog the plan was computed with.
    #[serde(default)]
    pub catalog: String,
    /// The last-applied records approval writes.
    #[serde(default)]
    pub applies: Applies,
    /// Predicted durations per cluster with steps (issue #36): advice from the cluster's job
    /// history, **not** part of the id ([`Plan::canonical_id`] leaves it out), set by the
    /// application layer after the plan is computed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub estimates: Vec<super::estimate::Estimate>,
}

impl Plan {
    /// Whether any cluster has a step or a settings change.
    pub fn has_changes(&self) -> bool {
        self.clusters.iter().any(|c| c.has_changes())
    }

    /// sha256 over the canonical encoding of everything but `id` and `parent`.
    ///
    /// The encoding is serde_json of a dedicated struct whose maps are all `BTreeMap`s and
    /// whose sequences are built in a deterministic order, behind a domain tag.
    #[allow(
        clippy::expect_used,
        reason = "plain structs with string keys and no non-finite floats: serializing them to JSON cannot fail"
    )]
    pub fn canonical_id(&self) -> PlanId {
        use sha2::{Digest, Sha256};
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Canonical<'a> {
            domain: &'static str,
            catalog: &'a str,
            basis: &'a Basis,
            clusters: &'a [std::sync::Arc<ClusterPlan>],
            approvals_required: u32,
            applies: &'a Applies,
        }
        let basis = self.basis.identity();
        let bytes = serde_json::to_vec(&Canonical {
            domain: "medea-plan/v1",
            catalog: &self.catalog,
            basis: &basis,
            clusters: &self.clusters,
            approvals_required: self.approvals_required,
            applies: &self.applies,
        })
        .expect("plans serialize");
        PlanId::from_digest(Sha256::digest(&bytes).into())
    }

    /// Whether the plan no longer matches reality: its basis differs from `current`.
    pub fn is_stale(&self, current: &Basis) -> bool {
        self.basis.identity() != current.identity()
    }

    /// Distinct machines any step touches (a Kubernetes rollout touches every node).
    pub fn machines_touched(&self) -> usize {
        let mut seen = std::collections::BTreeSet::new();
        for c in &self.clusters {
            for s in &c.steps {
                match s {
                    Step::Talos(t) => {
                        for m in t.waves.iter().flatten() {
                            seen.insert((c.cluster.as_str(), m.node.as_str()));
                        }
                    }
                    Step::Kubernetes(k) => {
                        for n in k.control_plane.iter().chain(&k.workers) {
                            seen.insert((c.cluster.as_str(), n.as_str()));
                        }
                    }
                }
            }
        }
        seen.len()
    }
}

/// Minor lines as `["v1.12", "v1.13"]`.
mod minor_lines {
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    use crate::desired::model::{MinorLine, parse_minor_line};

    pub fn serialize<S: Serializer>(v: &Option<Vec<MinorLine>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(lines) => s.collect_seq(lines.iter().map(|(a, b)| format!("v{a}.{b}"))),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<MinorLine>>, D::Error> {
        let Some(lines) = Option::<Vec<String>>::deserialize(d)? else {
            return Ok(None);
        };
        lines
            .iter()
            .map(|l| parse_minor_line(l).map_err(D::Error::custom))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_secs(u64::deserialize(d)?))
    }
}
