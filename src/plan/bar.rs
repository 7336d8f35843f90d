//! The approval bar: how many distinct people must approve a plan (the anti-self-lowering rule).
//!
//! The quorum a plan needs is the one **in force before it** (from the last-applied state; the
//! defaults for a cluster never applied). A plan that changes a cluster's approvals setting in
//! any way (or deletes or renames the cluster) needs the highest bar in force,
//! `max(required, controlPlane)`, and the new bar if that is higher ([`required_quorum`]).
//! Whoever can commit YAML cannot lower the bar and approve the lowering themselves, and whoever
//! clears the ordinary bar cannot lower the control-plane one. A plan always needs at least one
//! approval.
//!
//! The planner computes the bar into each plan (`Plan::approvals_required`, part of its id);
//! `approval::quorum` counts verified approvals against it. One rule, one place: here, so the
//! planner needs nothing from `approval`.

use serde::{Deserialize, Serialize};

use crate::plan::setting::Setting;

/// A cluster's approvals setting: approvals needed for ordinary (worker-only Talos) plans, and
/// for plans that touch control-plane nodes or Kubernetes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuorumPolicy {
    /// Approvals from distinct people every plan needs.
    pub required: u32,
    /// Approvals a plan touching control-plane nodes or Kubernetes needs.
    pub control_plane: u32,
}

impl QuorumPolicy {
    /// Used when a cluster sets nothing: one approval, two for control-plane/Kubernetes plans.
    pub const DEFAULT: QuorumPolicy = QuorumPolicy {
        required: 1,
        control_plane: 2,
    };

    /// The same requirement for every plan (a cluster's explicit `approvals: n`).
    pub fn uniform(n: u32) -> QuorumPolicy {
        QuorumPolicy {
            required: n,
            control_plane: n,
        }
    }

    /// The approvals this policy demands for a plan of `scope` (never less than 1; a
    /// control-plane plan never needs fewer than an ordinary one).
    pub fn for_scope(&self, scope: PlanScope) -> u32 {
        let n = if scope.touches_control_plane_or_kubernetes {
            self.required.max(self.control_plane)
        } else {
            self.required
        };
        n.max(1)
    }
}

impl Default for QuorumPolicy {
    fn default() -> Self {
        QuorumPolicy::DEFAULT
    }
}

/// What a plan touches, as far as quorum is concerned (the planner fills this in).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanScope {
    /// Whether the plan upgrades a control-plane node or Kubernetes.
    pub touches_control_plane_or_kubernetes: bool,
}

/// What a plan does to one cluster's approvals setting, compared with the one in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarChange {
    /// The plan leaves the setting as it is (the desired setting equals the one in force).
    Keeps,
    /// The plan installs a different setting (lower, higher, or the defaults because the
    /// `approvals` block was deleted).
    Sets(QuorumPolicy),
    /// The plan stops managing the cluster (deleted or renamed): its setting goes away.
    Removes,
}

impl BarChange {
    /// Compare the setting a plan would install (`None`: the cluster is gone) with the one in
    /// force.
    pub fn between(in_force: &QuorumPolicy, proposed: Option<&QuorumPolicy>) -> BarChange {
        match proposed {
            None => BarChange::Removes,
            Some(p) if p == in_force => BarChange::Keeps,
            Some(p) => BarChange::Sets(*p),
        }
    }
}

impl QuorumPolicy {
    /// The highest bar of this policy: `max(required, controlPlane)` (at least 1).
    pub fn highest(&self) -> u32 {
        self.required.max(self.control_plane).max(1)
    }
}

/// One cluster's part in a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterQuorum {
    /// The cluster's name.
    pub cluster: String,
    /// The policy in force before this plan (from the store, never from the plan's YAML; the
    /// defaults for a cluster never applied).
    pub in_force: QuorumPolicy,
    /// What the plan does to the approvals setting.
    pub change: BarChange,
    /// What the plan does in the cluster.
    pub scope: PlanScope,
}

/// The approvals one cluster's part of a plan needs. The one rule, used for every plan:
///
/// - a plan that keeps the setting needs the bar in force for its scope;
/// - **a plan that changes the setting in any way** (lowers or raises `required` or
///   `controlPlane`, deletes the `approvals` block, deletes or renames the cluster) needs the
///   highest bar in force, `max(required, controlPlane)`, whatever else it touches (settings-only
///   or not), and the proposed bar for its scope if that is higher still.
///
/// So whoever can clear the ordinary bar can never lower the control-plane bar, and a lower
/// setting only ever applies to the plans after the one that installs it.
pub fn required_quorum(in_force: &QuorumPolicy, change: BarChange, scope: PlanScope) -> u32 {
    let old = in_force.for_scope(scope);
    match change {
        BarChange::Keeps => old,
        BarChange::Sets(new) => old.max(in_force.highest()).max(new.for_scope(scope)),
        BarChange::Removes => old.max(in_force.highest()),
    }
}

/// The approvals a whole plan needs: the strictest of its clusters (at least 1).
pub fn required_for_plan(clusters: &[ClusterQuorum]) -> u32 {
    clusters
        .iter()
        .map(|c| required_quorum(&c.in_force, c.change, c.scope))
        .max()
        .unwrap_or(1)
        .max(1)
}

/// The approval bar a setting's change needs (issue #50 item 2), lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Bar {
    /// `approvals.required`.
    Ordinary,
    /// `approvals.controlPlane` (never below `approvals.required`).
    ControlPlane,
    /// The highest bar in force, `max(approvals.required, approvals.controlPlane)`.
    Highest,
}

impl Bar {
    /// How plans and the README name the bar.
    pub fn label(self) -> &'static str {
        match self {
            Bar::Ordinary => "ordinary (approvals.required)",
            Bar::ControlPlane => "control plane (approvals.controlPlane)",
            Bar::Highest => "highest in force (max of both)",
        }
    }
}

/// The bar a change of `setting` needs, before the pool rule ([`bar_of_change`]). The one
/// place bars are chosen: an exhaustive `match`, so a new [`Setting`] does not compile until
/// its bar is chosen here.
///
/// - where secrets, health data, backups or alert silences go or what they cover, and
///   anything that runs actions of its own (hooks), or the bar itself: [`Bar::Highest`];
/// - what decides which Kubernetes the control plane may run (support table, removed APIs):
///   [`Bar::ControlPlane`];
/// - the rest: [`Bar::Ordinary`] (a control-plane pool's settings are raised by
///   [`bar_of_change`]).
pub const fn bar_of(setting: Setting) -> Bar {
    use Setting as S;
    match setting {
        S::ApprovalsRequired
        | S::ApprovalsControlPlane
        | S::HealthPrometheus
        | S::HealthAlertmanager
        | S::SilenceMatchers
        | S::SilenceNodeLabel
        | S::SilenceLease
        | S::SilenceMaxDuration
        | S::SilenceOnError
        | S::BackupSchedule
        | S::BackupRetention
        | S::BackupDestination
        | S::BackupRecipients
        | S::GatesSkippingOperatorSilences
        | S::HooksBeforeJob
        | S::HooksAfterJob
        | S::HooksBeforeWave
        | S::HooksBeforeNode
        | S::HooksAfterNode
        | S::HooksAfterWave => Bar::Highest,
        S::KubernetesSupport | S::RemovedApis => Bar::ControlPlane,
        S::Role
        | S::Machines
        | S::Selector
        | S::After
        | S::InstallerImage
        | S::MaxUnavailable
        | S::DrainTimeout
        | S::HealthTimeout
        | S::UpgradeAttempts
        | S::Stage
        | S::StageParallelism
        | S::TaintNextWave
        | S::DeleteEmptyDirData
        | S::EvictUnmanagedPods
        | S::SkipPods
        | S::WaitForVolumeDetach
        | S::VolumeDetachTimeout
        | S::MaintenanceWindows
        | S::Exclusions
        | S::TalosReleases
        | S::HealthGates
        | S::HealthSoak
        | S::HealthInterval
        | S::HealthFailureLimit
        | S::HealthInconclusiveLimit
        | S::OnFailure
        | S::AllowDowngrade
        | S::Acknowledge
        | S::Promotion => Bar::Ordinary,
    }
}

/// The bar a change of `setting` of a resource needs: [`bar_of`], and at least the
/// control-plane bar when the resource is (or was) a control-plane pool, whose settings act
/// on control-plane nodes.
pub fn bar_of_change(setting: Setting, control_plane_pool: bool) -> Bar {
    let bar = bar_of(setting);
    if control_plane_pool {
        bar.max(Bar::ControlPlane)
    } else {
        bar
    }
}

/// One setting change that needs more than the ordinary bar, as the plan records it (typed:
/// renderers name the settings that raised the bar from these, never from note text).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BarRaise {
    /// `cluster` or `pool <name>`.
    pub resource: String,
    /// The setting that changes.
    pub setting: Setting,
    /// The bar it needs.
    pub bar: Bar,
    /// Whether the resource is new (or removed) in this plan: its settings count as changing
    /// from a document that writes nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole_resource: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every setting has a bar (the `match` in [`bar_of`] is exhaustive, so this cannot fail
    /// to compile-check), and the bars of the settings issue #50 names are the ones it says.
    #[test]
    fn every_setting_has_its_bar_and_the_trust_settings_need_the_highest() {
        use Setting as S;
        for s in [
            S::HealthPrometheus,
            S::HealthAlertmanager,
            S::SilenceMatchers,
            S::SilenceNodeLabel,
            S::SilenceLease,
            S::SilenceMaxDuration,
            S::SilenceOnError,
            S::BackupSchedule,
            S::BackupRetention,
            S::BackupDestination,
            S::BackupRecipients,
            S::HooksBeforeJob,
            S::HooksAfterNode,
            S::ApprovalsRequired,
            S::ApprovalsControlPlane,
        ] {
            assert_eq!(bar_of(s), Bar::Highest, "{s}");
        }
        assert_eq!(bar_of(S::KubernetesSupport), Bar::ControlPlane);
        for s in [
            S::TaintNextWave,
            S::WaitForVolumeDetach,
            S::VolumeDetachTimeout,
        ] {
            assert_eq!(bar_of(s), Bar::Ordinary, "{s}");
            assert_eq!(bar_of_change(s, true), Bar::ControlPlane, "{s}");
        }
        for s in Setting::ALL {
            assert!(bar_of_change(s, true) >= Bar::ControlPlane, "{s}");
        }
    }

    #[test]
    fn policy_and_anti_self_lowering() {
        let worker = PlanScope::default();
        let cp = PlanScope {
            touches_control_plane_or_kubernetes: true,
        };
        assert_eq!(QuorumPolicy::DEFAULT.for_scope(worker), 1);
        assert_eq!(QuorumPolicy::DEFAULT.for_scope(cp), 2);
        assert_eq!(QuorumPolicy::uniform(0).for_scope(worker), 1, "never zero");
        assert_eq!(
            QuorumPolicy {
                required: 3,
                control_plane: 1
            }
            .for_scope(cp),
            3
        );
        let set = |p: QuorumPolicy| BarChange::Sets(p);
        // lowering 3 -> 1 still needs 3; raising 1 -> 2 needs 2
        assert_eq!(
            required_quorum(
                &QuorumPolicy::uniform(3),
                set(QuorumPolicy::uniform(1)),
                worker
            ),
            3
        );
        assert_eq!(
            required_quorum(
                &QuorumPolicy::uniform(1),
                set(QuorumPolicy::uniform(2)),
                worker
            ),
            2
        );
        assert_eq!(
            required_quorum(&QuorumPolicy::uniform(2), BarChange::Keeps, worker),
            2
        );
        // The hole of issue 19: {1, 2} in force, a settings-only plan lowering controlPlane to 1
        // needs the control-plane bar (2), not the ordinary one.
        let in_force = QuorumPolicy {
            required: 1,
            control_plane: 2,
        };
        let lowered_cp = QuorumPolicy::uniform(1);
        assert_eq!(required_quorum(&in_force, set(lowered_cp), worker), 2);
        assert_eq!(required_quorum(&in_force, set(lowered_cp), cp), 2);
        // lowering `required` only
        let strict = QuorumPolicy {
            required: 2,
            control_plane: 3,
        };
        let lowered_req = QuorumPolicy {
            required: 1,
            control_plane: 3,
        };
        assert_eq!(required_quorum(&strict, set(lowered_req), worker), 3);
        // deleting the block falls back to the defaults: a change like any other
        assert_eq!(
            required_quorum(&strict, set(QuorumPolicy::DEFAULT), worker),
            3
        );
        // deleting or renaming the cluster
        assert_eq!(required_quorum(&strict, BarChange::Removes, worker), 3);
        assert_eq!(BarChange::between(&strict, Some(&strict)), BarChange::Keeps);
        assert_eq!(BarChange::between(&strict, None), BarChange::Removes);
        let clusters = vec![
            ClusterQuorum {
                cluster: "a".into(),
                in_force: QuorumPolicy::uniform(1),
                change: BarChange::Keeps,
                scope: worker,
            },
            ClusterQuorum {
                cluster: "b".into(),
                in_force: QuorumPolicy::DEFAULT,
                change: set(QuorumPolicy::uniform(1)),
                scope: worker,
            },
        ];
        assert_eq!(required_for_plan(&clusters), 2);
        assert_eq!(required_for_plan(&[]), 1);
    }
}
