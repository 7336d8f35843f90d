//! `compute`: desired state + observed inventory + last-applied state → an immutable plan.
//!
//! Pure: no I/O, no clock; every map is a `BTreeMap` and every list is built in a fixed order,
//! so the same inputs give the same plan, byte for byte. The algorithm, per observed cluster:
//!
//! 1. **Membership.** A pool's machines are its explicit `machines` plus every observed machine
//!    whose labels match its `selector`. A listed machine missing from the inventory, a machine
//!    claimed by two pools, or a machine whose observed role differs from its pool's role is an
//!    error.
//! 2. **Paths.** For every member, the hops from its running Talos version to the pool's target
//!    ([`Catalog::talos_path`]); a changed Image Factory schematic with an unchanged version is
//!    one hop to the same version. A member whose version is unknown is an error (medea cannot
//!    plan what it cannot see), and so is an unreachable member that needs a hop.
//! 3. **Hops and waves.** The pool's hops are the union of its members' paths, farthest minor
//!    first, the target last. Each hop is one [`Step::Talos`]; its machines are ordered
//!    already-unavailable first, then by node name, and cut into waves (see [`waves`]).
//! 4. **Order.** Pools run in `after:` order (topological), control-plane pools first among the
//!    pools that are free to run, then by name; all hops of a pool before the next pool.
//! 5. **Kubernetes.** At most one minor forward per plan; never backwards. The Kubernetes step
//!    goes at the latest position among the Talos steps (Talos first) at which every node
//!    supports the running Kubernetes at every step: each Talos hop's target must support the
//!    Kubernetes running then, and every node must support the target Kubernetes when the
//!    Kubernetes step runs. No such position is an error pointing at the YAML key.
//! 6. **Settings.** Inert fields (rollout parameters, approvals, windows, upgrade policy,
//!    membership, `after`) compared with the last-applied summaries; a resource never applied
//!    is one "created" change, one gone from the desired state one "removed" change.

use std::collections::{BTreeMap, BTreeSet};

use super::applied::{AppliedResource, LastApplied, ResourceKey, role_of};
use super::catalog::{Catalog, PathError};
use super::id::PlanId;
use super::model::*;
use super::bar::{BarChange, PlanScope, QuorumPolicy, required_quorum};
use crate::desired::model::{ApprovalSettings, Cluster, NodePool, Origin, Role, schematic_of};
use crate::desired::{Desired, Diagnostic};
use crate::inventory::{Inventory, Machine, MachineRole, ObservedCluster};
use crate::version::{KubeVersion, TalosVersion};

/// Diagnostic codes of plan errors (rendered like desired-state diagnostics).
pub mod codes {
    pub const DOWNGRADE: &str = "medea::plan::downgrade";
    pub const TALOS_PATH: &str = "medea::plan::talos-path";
    pub const KUBERNETES_SKEW: &str = "medea::plan::kubernetes-skew";
    pub const KUBERNETES_DOWNGRADE: &str = "medea::plan::kubernetes-downgrade";
    pub const KUBERNETES_UNSUPPORTED: &str = "medea::plan::kubernetes-unsupported";
    pub const CATALOG: &str = "medea::plan::catalog";
    pub const KUBELET_SKEW: &str = "medea::plan::kubelet-skew";
    pub const UNKNOWN_MACHINE: &str = "medea::plan::unknown-machine";
    pub const MACHINE_TWICE: &str = "medea::plan::machine-in-two-pools";
    pub const ROLE_MISMATCH: &str = "medea::plan::role-mismatch";
    pub const SCHEMATIC_DROPPED: &str = "medea::plan::schematic-dropped";
    pub const UNAVAILABLE: &str = "medea::plan::unavailable";
    pub const UNOBSERVED: &str = "medea::plan::unobserved";
}

/// The Image Factory schematic with no customization: dropping it loses nothing.
pub const EMPTY_SCHEMATIC: &str =
    "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

/// Settings-change field naming a whole resource (created or removed).
pub const RESOURCE_FIELD: &str = "resource";

/// The basis a plan computed from these inputs has: the desired revision, the observed
/// generation of every cluster involved (desired, or applied before and now removed), and the
/// digest of the last-applied state.
pub fn basis_of(desired: &Desired, observed: &Inventory, last_applied: &LastApplied) -> Basis {
    basis_with(desired, observed, last_applied, &BTreeMap::new())
}

/// [`basis_of`] with the running rollout job of each busy cluster (cluster → job id).
pub fn basis_with(
    desired: &Desired,
    observed: &Inventory,
    last_applied: &LastApplied,
    running: &BTreeMap<String, String>,
) -> Basis {
    basis_from_generations(
        desired,
        |name| observed.clusters.get(name).map(|c| c.generation),
        last_applied,
        running,
    )
}

/// [`basis_with`] from each observed cluster's generation alone (what the basis holds of the
/// inventory), so that a staleness check need not decode every machine.
pub fn basis_from_generations(
    desired: &Desired,
    generation: impl Fn(&str) -> Option<u64>,
    last_applied: &LastApplied,
    running: &BTreeMap<String, String>,
) -> Basis {
    let mut names: BTreeSet<String> = desired.clusters.keys().cloned().collect();
    names.extend(last_applied.cluster_names());
    Basis {
        desired: desired.revision.clone(),
        observed: names
            .iter()
            .filter_map(|n| generation(n).map(|g| (n.clone(), g)))
            .collect(),
        applied: last_applied.digest(),
        running: running
            .iter()
            .filter(|(c, _)| names.contains(*c))
            .map(|(c, j)| (c.clone(), j.clone()))
            .collect(),
    }
}

/// What the plan of a cluster whose rollout job `job` is still running says: nothing is
/// planned for it (no steps, no settings, its last-applied state untouched), and why.
fn rolling_out(cluster: &str, job: &str) -> ClusterPlan {
    ClusterPlan {
        cluster: cluster.to_string(),
        steps: Vec::new(),
        settings: Vec::new(),
        unchanged: Vec::new(),
        status: ClusterStatus::RollingOut,
        notes: vec![format!(
            "rollout job {job} is running: nothing is planned for this cluster until it ends (follow it with `medea rollout status --cluster {cluster} -w`); the next plan shows what is left"
        )],
        diffs: Vec::new(),
    }
}

/// Compute the plan. `desired` must be valid (no error diagnostics). On error, every problem
/// found is returned, each pointing at the YAML key it is about.
pub fn compute(
    desired: &Desired,
    observed: &Inventory,
    last_applied: &LastApplied,
    parent: Option<PlanId>,
) -> Result<Plan, Vec<Diagnostic>> {
    compute_with(desired, observed, last_applied, parent, &BTreeMap::new())
}

/// [`compute`] knowing which clusters have a running rollout job (cluster → job id): those
/// get a [`ClusterStatus::RollingOut`] entry and nothing else, so a plan approved while a job
/// runs can never start a second one or apply settings under it.
pub fn compute_with(
    desired: &Desired,
    observed: &Inventory,
    last_applied: &LastApplied,
    parent: Option<PlanId>,
    running: &BTreeMap<String, String>,
) -> Result<Plan, Vec<Diagnostic>> {
    let mut diags = Vec::new();
    let mut clusters: BTreeMap<String, ClusterPlan> = BTreeMap::new();
    let mut applies = Applies::default();
    let mut bar: u32 = 1;
    let mut catalogs = BTreeSet::new();

    for (name, cluster) in &desired.clusters {
        let catalog = Catalog::for_policy(&cluster.upgrade_policy);
        catalogs.insert(catalog.version());
        if let Some(job) = running.get(name) {
            clusters.insert(name.clone(), rolling_out(name, job));
            continue;
        }
        let obs = observed
            .clusters
            .get(name)
            .filter(|o| !(o.machines.is_empty() && o.kubernetes_version.is_none()));
        let Some(obs) = obs else {
            clusters.insert(
                name.clone(),
                ClusterPlan {
                    cluster: name.clone(),
                    steps: Vec::new(),
                    settings: Vec::new(),
                    unchanged: Vec::new(),
                    status: ClusterStatus::NotObserved,
                    notes: vec![
                        "not observed yet: run `medea seed` to observe it; nothing is planned for it"
                            .into(),
                    ],
                    diffs: Vec::new(),
                },
            );
            continue;
        };
        let mut ctx = ClusterCtx {
            cluster,
            obs,
            catalog: &catalog,
            diags: Vec::new(),
        };
        let plan = ctx.plan(last_applied);
        diags.append(&mut ctx.diags);
        let Some(mut plan) = plan else { continue };
        let in_force = policy(last_applied.approvals_in_force(name));
        let change = BarChange::between(&in_force, Some(&policy(cluster.approvals)));
        if plan.has_changes() || change != BarChange::Keeps {
            let scope = PlanScope {
                touches_control_plane_or_kubernetes: plan
                    .steps
                    .iter()
                    .any(Step::touches_control_plane),
            };
            let needs = required_quorum(&in_force, change, scope);
            if change != BarChange::Keeps {
                plan.notes.push(format!(
                    "this plan changes the approvals setting: it needs the highest bar in force, max(required {}, controlPlane {}), or the new bar if higher ({needs}); the new setting applies to later plans",
                    in_force.required, in_force.control_plane
                ));
            }
            bar = bar.max(needs);
        }
        // Approval makes this revision of every resource of the cluster the last applied one.
        applies.put.push(AppliedResource::of_cluster(cluster));
        applies
            .put
            .extend(cluster.pools.values().map(AppliedResource::of_pool));
        for res in last_applied.resources.values() {
            if let ResourceKey::Pool { cluster: c, pool } = &res.key
                && c == name
                && !cluster.pools.contains_key(pool)
            {
                applies.delete.push(res.key.clone());
            }
        }
        clusters.insert(name.clone(), plan);
    }

    // Clusters applied before and gone from the desired state.
    for gone in last_applied.cluster_names() {
        if desired.clusters.contains_key(&gone) {
            continue;
        }
        if let Some(job) = running.get(&gone) {
            clusters.insert(gone.clone(), rolling_out(&gone, job));
            continue;
        }
        let mut settings = Vec::new();
        let mut diffs = Vec::new();
        for res in last_applied.resources.values() {
            if res.key.cluster_name() != gone {
                continue;
            }
            settings.push(removed(&res.key));
            diffs.extend(diff_of(&res.key, &res.file, &res.document, ""));
            applies.delete.push(res.key.clone());
        }
        // Deleting or renaming a cluster removes its approvals setting: the highest bar in force.
        bar = bar.max(required_quorum(
            &policy(last_applied.approvals_in_force(&gone)),
            BarChange::Removes,
            PlanScope::default(),
        ));
        clusters.insert(
            gone.clone(),
            ClusterPlan {
                cluster: gone.clone(),
                steps: Vec::new(),
                settings,
                unchanged: Vec::new(),
                status: ClusterStatus::Removed,
                notes: vec![
                    "gone from the desired state: medea stops managing it on approval (nothing on the cluster changes)"
                        .into(),
                ],
                diffs,
            },
        );
    }

    if !diags.is_empty() {
        diags.sort_by(|a, b| {
            a.origin
                .cmp(&b.origin)
                .then_with(|| a.message.cmp(&b.message))
        });
        diags.dedup();
        return Err(diags);
    }
    applies.put.sort_by_key(|r| r.key.store_key());
    applies.delete.sort_by_key(|k| k.store_key());
    applies.delete.dedup();
    let mut plan = Plan {
        id: PlanId::from_digest([0; 32]),
        parent,
        basis: basis_with(desired, observed, last_applied, running),
        clusters: clusters.into_values().collect(),
        approvals_required: bar,
        catalog: catalogs.into_iter().collect::<Vec<_>>().join(","),
        applies,
    };
    if plan.catalog.is_empty() {
        plan.catalog = super::catalog::CATALOG_VERSION.to_string();
    }
    plan.id = plan.canonical_id();
    Ok(plan)
}

/// A cluster's approvals setting as the quorum rule sees it.
fn policy(a: ApprovalSettings) -> QuorumPolicy {
    QuorumPolicy {
        required: a.required,
        control_plane: a.control_plane,
    }
}

fn removed(key: &ResourceKey) -> SettingsChange {
    SettingsChange {
        resource: key.label(),
        field: RESOURCE_FIELD.into(),
        from: "present".into(),
        to: "removed".into(),
    }
}

fn diff_of(key: &ResourceKey, file: &str, old: &str, new: &str) -> Option<ResourceDiff> {
    if old == new {
        return None;
    }
    let old_name = if old.is_empty() {
        "/dev/null".to_string()
    } else {
        format!("a/{file} (last applied)")
    };
    let new_name = if new.is_empty() {
        "/dev/null".to_string()
    } else {
        format!("b/{file} (desired)")
    };
    let diff = similar::udiff::unified_diff(
        similar::Algorithm::Myers,
        old,
        new,
        3,
        Some((&old_name, &new_name)),
    );
    Some(ResourceDiff {
        resource: key.label(),
        file: file.to_string(),
        diff,
    })
}

/// How a machine came into a pool.
#[derive(Clone, Copy)]
struct Member<'a> {
    machine: &'a Machine,
    /// The `machines:` entry, when listed explicitly.
    listed: Option<&'a Origin>,
}

impl Member<'_> {
    /// Where a diagnostic about this member points: its `machines:` entry, or the pool name
    /// (for machines picked by the selector).
    fn origin(&self, pool: &NodePool) -> Origin {
        self.listed
            .cloned()
            .unwrap_or_else(|| pool.name.origin.clone())
    }
}

/// The work of one hop: its target and the machines that take it, with their version before.
struct Hop<'a> {
    to: TalosVersion,
    machines: Vec<(&'a Machine, TalosVersion)>,
}

/// Why the Kubernetes step cannot go at some position.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Violation {
    /// When the Kubernetes step runs, these nodes run a Talos that does not support the target.
    KubeStep {
        talos: TalosVersion,
        nodes: Vec<String>,
    },
    /// A Talos hop's target does not support the Kubernetes running at that point.
    Hop { step: usize, kube: KubeVersion },
    /// A Talos minor without a support window in the catalog.
    UnknownMinor {
        minor: (u64, u64),
        /// The Talos step that needs it, or `None` for the Kubernetes step.
        step: Option<usize>,
    },
    /// Nodes whose Talos version is unknown when the Kubernetes step needs it.
    UnknownNodes { nodes: Vec<String> },
}

struct ClusterCtx<'a> {
    cluster: &'a Cluster,
    obs: &'a ObservedCluster,
    catalog: &'a Catalog,
    diags: Vec<Diagnostic>,
}

impl<'a> ClusterCtx<'a> {
    fn name(&self) -> &str {
        &self.cluster.name.value
    }

    fn plan(&mut self, last_applied: &LastApplied) -> Option<ClusterPlan> {
        let members = self.members();
        let order = pool_order(self.cluster);
        let mut steps: Vec<TalosRollout> = Vec::new();
        for pool_name in &order {
            let pool = &self.cluster.pools[pool_name];
            let ms = members.get(pool_name).cloned().unwrap_or_default();
            steps.extend(self.pool_steps(pool, &ms));
        }
        let kube = self.kubernetes();
        if !self.diags.is_empty() {
            return None;
        }
        let (k_now, kstep) = kube?;
        let steps = self.place_kubernetes(steps, &k_now, kstep)?;

        // Settings and diffs.
        let mut settings = Vec::new();
        let mut diffs = Vec::new();
        let mut resources: Vec<(AppliedResource, bool)> = vec![(
            AppliedResource::of_cluster(self.cluster),
            steps.iter().any(|s| matches!(s, Step::Kubernetes(_))),
        )];
        for p in self.cluster.pools.values() {
            let stepped = steps
                .iter()
                .any(|s| matches!(s, Step::Talos(t) if t.pool == p.name.value));
            resources.push((AppliedResource::of_pool(p), stepped));
        }
        let mut changed_pools = BTreeSet::new();
        for (new, stepped) in &resources {
            let before = settings.len();
            match last_applied.get(&new.key) {
                None => settings.push(SettingsChange {
                    resource: new.key.label(),
                    field: RESOURCE_FIELD.into(),
                    from: "absent".into(),
                    to: "created".into(),
                }),
                Some(old) => {
                    for ((field, was), (_, now)) in old.fields().into_iter().zip(new.fields()) {
                        if was != now {
                            settings.push(SettingsChange {
                                resource: new.key.label(),
                                field: field.to_string(),
                                from: was,
                                to: now,
                            });
                        }
                    }
                }
            }
            let changed = *stepped || settings.len() > before;
            if changed {
                if let ResourceKey::Pool { pool, .. } = &new.key {
                    changed_pools.insert(pool.clone());
                }
                let old = last_applied
                    .get(&new.key)
                    .map_or("", |o| o.document.as_str());
                diffs.extend(diff_of(&new.key, &new.file, old, &new.document));
            }
        }
        for res in last_applied.resources.values() {
            if let ResourceKey::Pool { cluster, pool } = &res.key
                && cluster == self.name()
                && !self.cluster.pools.contains_key(pool)
            {
                settings.push(removed(&res.key));
                diffs.extend(diff_of(&res.key, &res.file, &res.document, ""));
            }
        }
        let unchanged = self
            .cluster
            .pools
            .keys()
            .filter(|p| !changed_pools.contains(*p))
            .cloned()
            .collect();
        let notes = self.notes(&members, &steps);
        Some(ClusterPlan {
            cluster: self.name().to_string(),
            steps,
            settings,
            unchanged,
            status: ClusterStatus::Planned,
            notes,
            diffs,
        })
    }

    /// Pool → members, reporting unknown machines, double claims and role mismatches.
    fn members(&mut self) -> BTreeMap<String, Vec<Member<'a>>> {
        let cluster = self.cluster;
        let obs = self.obs;
        // node → (pool, listed origin)
        let mut owner: BTreeMap<&str, (&str, Option<&Origin>)> = BTreeMap::new();
        let mut out: BTreeMap<String, Vec<Member<'a>>> = BTreeMap::new();
        for pool in cluster.pools.values() {
            for m in &pool.machines {
                let Some(machine) = obs.machines.get(&m.value) else {
                    let known: Vec<&str> = obs.machines.keys().map(String::as_str).collect();
                    self.diags.push(
                        Diagnostic::error(
                            codes::UNKNOWN_MACHINE,
                            m.origin.clone(),
                            format!(
                                "machine `{}` of node pool `{}` is not in the observed inventory of cluster `{}`",
                                m.value,
                                pool.name.value,
                                self.name()
                            ),
                        )
                        .with_label("not observed")
                        .with_help(if known.is_empty() {
                            "no machine of this cluster has been observed; check the node name or refresh the inventory".to_string()
                        } else {
                            format!(
                                "check the Kubernetes node name (`kubectl get nodes`); observed machines: {}",
                                known.join(", ")
                            )
                        }),
                    );
                    continue;
                };
                owner.insert(&machine.node, (&pool.name.value, Some(&m.origin)));
                out.entry(pool.name.value.clone())
                    .or_default()
                    .push(Member {
                        machine,
                        listed: Some(&m.origin),
                    });
            }
        }
        for pool in cluster.pools.values() {
            if pool.selector.is_empty() {
                continue;
            }
            for machine in obs.machines.values() {
                let matches = pool
                    .selector
                    .iter()
                    .all(|(k, v)| machine.labels.get(k).is_some_and(|l| l == v));
                if !matches {
                    continue;
                }
                match owner.get(machine.node.as_str()) {
                    Some((p, _)) if *p == pool.name.value => {}
                    Some((p, listed)) => {
                        let how = if listed.is_some() {
                            format!("is listed in node pool `{p}` and also matches")
                        } else {
                            format!("matches the selector of node pool `{p}` and also")
                        };
                        self.diags.push(
                            Diagnostic::error(
                                codes::MACHINE_TWICE,
                                pool.name.origin.clone(),
                                format!(
                                    "machine `{}` {how} the selector of node pool `{}`",
                                    machine.node, pool.name.value
                                ),
                            )
                            .with_label("selector matches a machine of another pool")
                            .with_help(
                                "a machine belongs to exactly one pool: narrow the selector or change the node's labels",
                            ),
                        );
                    }
                    None => {
                        owner.insert(&machine.node, (&pool.name.value, None));
                        out.entry(pool.name.value.clone())
                            .or_default()
                            .push(Member {
                                machine,
                                listed: None,
                            });
                    }
                }
            }
        }
        for (pool_name, ms) in &mut out {
            let pool = &cluster.pools[pool_name];
            ms.sort_by(|a, b| a.machine.node.cmp(&b.machine.node));
            for m in ms.iter() {
                let want = role_of(pool.role);
                if m.machine.role != want {
                    let origin = m.origin(pool);
                    self.diags.push(
                        Diagnostic::error(
                            codes::ROLE_MISMATCH,
                            origin,
                            format!(
                                "machine `{}` is a {} node, but node pool `{}` has role {}",
                                m.machine.node,
                                role_text(m.machine.role),
                                pool.name.value,
                                role_text(want)
                            ),
                        )
                        .with_help(format!(
                            "move `{}` to a {} pool",
                            m.machine.node,
                            role_text(m.machine.role)
                        )),
                    );
                }
            }
        }
        out
    }

    /// The Talos steps of one pool (one per hop), or none when the pool has errors.
    fn pool_steps(&mut self, pool: &'a NodePool, members: &[Member<'a>]) -> Vec<TalosRollout> {
        let target = &pool.talos_version.value;
        let want_schematic = pool.installer_image.schematic();
        let allow_downgrade = self.cluster.upgrade_policy.allow_downgrade;
        let mut paths: Vec<(&'a Machine, Vec<TalosVersion>)> = Vec::new();
        let mut downgrades = Vec::new();
        let mut dropped = Vec::new();
        let mut no_release: BTreeMap<(u64, u64), Vec<String>> = BTreeMap::new();
        let mut errors = false;
        for m in members {
            let machine = m.machine;
            let Some(running) = &machine.talos_version else {
                let origin = m.origin(pool);
                self.diags.push(
                    Diagnostic::error(
                        codes::UNOBSERVED,
                        origin,
                        format!(
                            "the running Talos version of machine `{}` is unknown (its Talos API did not answer at the last refresh)",
                            machine.node
                        ),
                    )
                    .with_help(format!(
                        "medea cannot plan what it cannot see: bring the node back and refresh the inventory, or take it out of node pool `{}`",
                        pool.name.value
                    )),
                );
                errors = true;
                continue;
            };
            let running_schematic = machine
                .schematic
                .as_deref()
                .or_else(|| machine.installer_image.as_deref().and_then(schematic_of));
            fn effective(s: Option<&str>) -> Option<&str> {
                s.filter(|s| *s != EMPTY_SCHEMATIC)
            }
            if let Some(s) = effective(running_schematic)
                && want_schematic.is_none()
            {
                dropped.push((machine.node.clone(), s.to_string()));
                errors = true;
                continue;
            }
            let reinstall = want_schematic.is_some()
                && effective(running_schematic) != effective(want_schematic);
            let mut path = match self.catalog.talos_path(running, target, allow_downgrade) {
                Ok(p) => p,
                Err(PathError::Downgrade) => {
                    downgrades.push((machine.node.clone(), running.clone()));
                    errors = true;
                    continue;
                }
                Err(PathError::Major) => {
                    self.diags.push(
                        Diagnostic::error(
                            codes::TALOS_PATH,
                            pool.talos_version.origin.clone(),
                            format!(
                                "machine `{}` runs Talos {running}; medea does not plan upgrades across major versions (to {target})",
                                machine.node
                            ),
                        )
                        .with_help("follow the Talos release notes for the major upgrade by hand"),
                    );
                    errors = true;
                    continue;
                }
                Err(PathError::NoRelease { minor }) => {
                    no_release
                        .entry(minor)
                        .or_default()
                        .push(format!("`{}` ({running})", machine.node));
                    errors = true;
                    continue;
                }
            };
            if path.is_empty() && reinstall {
                path.push(target.clone());
            }
            if !path.is_empty() && !machine.reachable {
                let origin = m.origin(pool);
                self.diags.push(
                    Diagnostic::error(
                        codes::UNOBSERVED,
                        origin,
                        format!(
                            "machine `{}` needs Talos {target} but its Talos API did not answer at the last refresh",
                            machine.node
                        ),
                    )
                    .with_help("medea cannot plan what it cannot see: bring the node back and refresh the inventory"),
                );
                errors = true;
                continue;
            }
            paths.push((machine, path));
        }
        if !downgrades.is_empty() {
            let list: Vec<String> = downgrades
                .iter()
                .map(|(n, v)| format!("`{n}` ({v})"))
                .collect();
            self.diags.push(
                Diagnostic::error(
                    codes::DOWNGRADE,
                    pool.talos_version.origin.clone(),
                    format!(
                        "downgrade refused: node pool `{}` asks for Talos {target}, older than what {} run{}",
                        pool.name.value,
                        list.join(", "),
                        if downgrades.len() == 1 { "s" } else { "" }
                    ),
                )
                .with_label("older than the running version")
                .with_help(format!(
                    "set `upgradePolicy.allowDowngrade: true` on cluster `{}` if you mean it, or set the version to the running one",
                    self.name()
                )),
            );
        }
        for (minor, machines) in no_release {
            self.diags.push(
                Diagnostic::error(
                    codes::TALOS_PATH,
                    pool.talos_version.origin.clone(),
                    format!(
                        "no stable Talos {}.{} release is known to stop at on the way from what {} run{} to {target}",
                        minor.0,
                        minor.1,
                        machines.join(", "),
                        if machines.len() == 1 { "s" } else { "" }
                    ),
                )
                .with_help(format!(
                    "Talos upgrades go one minor at a time; add the release to `upgradePolicy.talosReleases` of cluster `{}` (catalog {})",
                    self.name(),
                    self.catalog.version()
                )),
            );
        }
        for (node, schematic) in dropped {
            self.diags.push(
                Diagnostic::error(
                    codes::SCHEMATIC_DROPPED,
                    pool.installer_image.origin.clone(),
                    format!(
                        "installer image `{}` would drop Image Factory schematic {} that machine `{node}` runs",
                        pool.installer_image.value,
                        &schematic[..12.min(schematic.len())],
                    ),
                )
                .with_label("no schematic in this image")
                .with_help(format!(
                    "keep the machine's system extensions with `installerImage: factory.talos.dev/installer/{schematic}`"
                )),
            );
        }
        if errors {
            return Vec::new();
        }
        // Hop targets: farthest minor first, the target last.
        let mut targets: Vec<TalosVersion> = paths
            .iter()
            .flat_map(|(_, p)| p.iter().cloned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let dist = |v: &TalosVersion| v.minor().abs_diff(target.minor());
        targets.sort_by(|a, b| {
            (a == target)
                .cmp(&(b == target))
                .then(dist(b).cmp(&dist(a)))
                .then(a.cmp(b))
        });
        let hops: Vec<Hop<'a>> = targets
            .iter()
            .map(|to| Hop {
                to: to.clone(),
                machines: paths
                    .iter()
                    .filter_map(|(m, p)| {
                        let i = p.iter().position(|v| v == to)?;
                        let from = if i == 0 {
                            m.talos_version.clone().expect("checked above")
                        } else {
                            p[i - 1].clone()
                        };
                        Some((*m, from))
                    })
                    .collect(),
            })
            .collect();
        let total = hops.len() as u32;
        let mut steps = Vec::new();
        for (i, hop) in hops.into_iter().enumerate() {
            let Some(waves) = self.waves(pool, members, &hop) else {
                return Vec::new();
            };
            steps.push(TalosRollout {
                pool: pool.name.value.clone(),
                role: role_of(pool.role),
                hop: i as u32 + 1,
                hops: total,
                to: hop.to.clone(),
                image: pool.installer_image.value.reference(&hop.to),
                max_unavailable: pool.rollout.max_unavailable,
                drain_timeout: pool.rollout.drain_timeout,
                health_timeout: pool.rollout.health_timeout,
                upgrade_attempts: pool.rollout.upgrade_attempts,
                drain: DrainPolicy::from(&pool.rollout.drain),
                waves,
            });
        }
        steps
    }

    /// Cut a hop's machines into waves.
    ///
    /// `cap` is 1 for control-plane pools and `maxUnavailable` otherwise. Machines that are
    /// unavailable now (cordoned, NotReady or unreachable) and take the hop go first: they are
    /// away already. Unavailable machines that do not take the hop are assumed to stay away
    /// for the whole hop, so every wave holds at most `cap - away` machines; for control-plane
    /// pools "away" counts every control-plane node of the cluster (etcd quorum is
    /// cluster-wide). If nothing fits, the plan is refused and names the machines.
    fn waves(
        &mut self,
        pool: &NodePool,
        members: &[Member<'a>],
        hop: &Hop<'a>,
    ) -> Option<Vec<Vec<MachineTarget>>> {
        let cp = pool.role == Role::Controlplane;
        let cap = if cp {
            1
        } else {
            pool.rollout.max_unavailable.max(1)
        } as usize;
        let in_hop: BTreeSet<&str> = hop.machines.iter().map(|(m, _)| m.node.as_str()).collect();
        let scope: Vec<&Machine> = if cp {
            self.obs
                .machines
                .values()
                .filter(|m| m.role == MachineRole::Controlplane)
                .collect()
        } else {
            members.iter().map(|m| m.machine).collect()
        };
        let away_out: Vec<&Machine> = scope
            .iter()
            .copied()
            .filter(|m| m.unavailable() && !in_hop.contains(m.node.as_str()))
            .collect();
        let mut ordered: Vec<&(&Machine, TalosVersion)> = hop.machines.iter().collect();
        ordered.sort_by(|a, b| {
            (!a.0.unavailable())
                .cmp(&!b.0.unavailable())
                .then_with(|| a.0.node.cmp(&b.0.node))
        });
        let away_in = ordered.iter().filter(|(m, _)| m.unavailable()).count();
        if away_out.len() >= cap || away_out.len() + away_in > cap {
            let mut names: Vec<String> = away_out
                .iter()
                .copied()
                .chain(ordered.iter().map(|(m, _)| *m).filter(|m| m.unavailable()))
                .map(|m| format!("`{}` ({})", m.node, why_unavailable(m)))
                .collect();
            names.sort();
            let scope_text = if cp {
                format!("cluster `{}` has control-plane", self.name())
            } else {
                format!("node pool `{}` has", pool.name.value)
            };
            self.diags.push(
                Diagnostic::error(
                    codes::UNAVAILABLE,
                    pool.talos_version.origin.clone(),
                    format!(
                        "{scope_text} {} machine{} unavailable already ({}), and at most {cap} may be away at once: Talos {} cannot start",
                        names.len(),
                        if names.len() == 1 { "" } else { "s" },
                        names.join(", "),
                        hop.to
                    ),
                )
                .with_help(if cp {
                    "bring the control-plane nodes back (Ready, uncordoned, reachable) and refresh the inventory".to_string()
                } else {
                    "bring the machines back (Ready, uncordoned, reachable) and refresh, or raise `rollout.maxUnavailable`".to_string()
                }),
            );
            return None;
        }
        let size = cap - away_out.len();
        Some(
            ordered
                .chunks(size)
                .map(|chunk| {
                    chunk
                        .iter()
                        .map(|(m, from)| MachineTarget {
                            node: m.node.clone(),
                            id: m.id.clone(),
                            address: m.address.clone(),
                            from: from.clone(),
                        })
                        .collect()
                })
                .collect(),
        )
    }

    /// `(running Kubernetes, its rollout if the version changes)`, or `None` on error.
    fn kubernetes(&mut self) -> Option<(KubeVersion, Option<KubeRollout>)> {
        let key = &self.cluster.kubernetes_version;
        let target = &key.value;
        let Some(now) = self.obs.kubernetes_version.clone() else {
            self.diags.push(
                Diagnostic::error(
                    codes::UNOBSERVED,
                    key.origin.clone(),
                    format!(
                        "the Kubernetes version of cluster `{}` is unknown (its kube-apiserver did not answer at the last refresh)",
                        self.name()
                    ),
                )
                .with_help("medea cannot plan what it cannot see: refresh the inventory once the API server answers"),
            );
            return None;
        };
        let mut ok = true;
        if target < &now {
            self.diags.push(
                Diagnostic::error(
                    codes::KUBERNETES_DOWNGRADE,
                    key.origin.clone(),
                    format!("Kubernetes downgrade refused: cluster `{}` runs {now}, newer than {target}", self.name()),
                )
                .with_label("older than the running version")
                .with_help(format!(
                    "medea never moves Kubernetes backwards (the API server would be older than the kubelets and the stored objects); set the version to {now} or newer"
                )),
            );
            ok = false;
        } else if target.major() != now.major() || target.minor() > now.minor() + 1 {
            let next = format!("v{}.{}", now.major(), now.minor() + 1);
            self.diags.push(
                Diagnostic::error(
                    codes::KUBERNETES_SKEW,
                    key.origin.clone(),
                    format!(
                        "Kubernetes moves at most one minor per rollout: {now} → {target} skips {}",
                        skipped(&now, target)
                    ),
                )
                .with_label("more than one minor ahead")
                .with_help(format!(
                    "set the version to the newest {next}.x patch first, approve and roll that, then move on"
                )),
            );
            ok = false;
        }
        // kubelet ≤ kube-apiserver when the plan ends, and within the 3-minor skew policy.
        let end = if ok && target != &now { target } else { &now };
        let changing = ok && target != &now;
        for m in self.obs.machines.values() {
            let Some(kubelet) = &m.kubelet_version else {
                continue;
            };
            if kubelet > end {
                self.diags.push(
                    Diagnostic::error(
                        codes::KUBELET_SKEW,
                        key.origin.clone(),
                        format!(
                            "machine `{}` runs kubelet {kubelet}, newer than the kube-apiserver {end} this plan ends with",
                            m.node
                        ),
                    )
                    .with_help(format!(
                        "kubelet must never be newer than kube-apiserver: set the version to {kubelet} or newer"
                    )),
                );
                ok = false;
            } else if changing
                && kubelet.major() == end.major()
                && kubelet.minor() + 3 < end.minor()
            {
                self.diags.push(
                    Diagnostic::error(
                        codes::KUBELET_SKEW,
                        key.origin.clone(),
                        format!(
                            "machine `{}` runs kubelet {kubelet}, more than three minors older than Kubernetes {end}",
                            m.node
                        ),
                    )
                    .with_help("the Kubernetes skew policy allows kubelets at most three minors behind the API server; bring that node's kubelet up first"),
                );
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        if !changing {
            return Some((now, None));
        }
        let unreachable: Vec<&str> = self
            .obs
            .machines
            .values()
            .filter(|m| !m.reachable)
            .map(|m| m.node.as_str())
            .collect();
        if !unreachable.is_empty() {
            self.diags.push(
                Diagnostic::error(
                    codes::UNOBSERVED,
                    key.origin.clone(),
                    format!(
                        "a Kubernetes rollout updates every node, but {} did not answer at the last refresh",
                        unreachable.join(", ")
                    ),
                )
                .with_help("medea cannot plan what it cannot see: bring the nodes back and refresh the inventory"),
            );
            return None;
        }
        let by_role = |r: MachineRole| -> Vec<String> {
            self.obs
                .machines
                .values()
                .filter(|m| m.role == r)
                .map(|m| m.node.clone())
                .collect()
        };
        Some((
            now.clone(),
            Some(KubeRollout {
                from: now,
                to: target.clone(),
                control_plane: by_role(MachineRole::Controlplane),
                workers: by_role(MachineRole::Worker),
                health_timeout: self.cluster.rollout.health_timeout,
                supported_talos: Some(self.catalog.talos_minors_supporting(target)),
            }),
        ))
    }

    /// Insert the Kubernetes step at the latest position where every node stays inside its
    /// support window; check the Talos hops against the running Kubernetes either way.
    fn place_kubernetes(
        &mut self,
        talos: Vec<TalosRollout>,
        k_now: &KubeVersion,
        kstep: Option<KubeRollout>,
    ) -> Option<Vec<Step>> {
        let positions: Vec<Option<usize>> = match &kstep {
            None => vec![None],
            Some(_) => (0..=talos.len()).rev().map(Some).collect(),
        };
        let target = kstep.as_ref().map(|k| &k.to);
        let mut first_failure = None;
        for pos in positions {
            let v = self.violations(&talos, k_now, target, pos);
            if v.is_empty() {
                let mut steps: Vec<Step> = talos.into_iter().map(Step::Talos).collect();
                if let (Some(p), Some(k)) = (pos, kstep) {
                    steps.insert(p, Step::Kubernetes(k));
                }
                return Some(steps);
            }
            first_failure.get_or_insert(v);
        }
        let violations = first_failure.expect("at least one position was tried");
        let tried_all = kstep.is_some() && !talos.is_empty();
        for v in violations {
            let d = self.violation_diag(&talos, k_now, target, v, tried_all);
            self.diags.push(d);
        }
        None
    }

    /// Simulate the steps with the Kubernetes step at `pos` (`None`: no Kubernetes step).
    fn violations(
        &self,
        talos: &[TalosRollout],
        k_now: &KubeVersion,
        target: Option<&KubeVersion>,
        pos: Option<usize>,
    ) -> Vec<Violation> {
        let mut state: BTreeMap<&str, Option<TalosVersion>> = self
            .obs
            .machines
            .values()
            .map(|m| (m.node.as_str(), m.talos_version.clone()))
            .collect();
        let mut k = k_now.clone();
        let mut out = BTreeSet::new();
        for i in 0..=talos.len() {
            if pos == Some(i)
                && let Some(kt) = target
            {
                let mut unsupported: BTreeMap<TalosVersion, Vec<String>> = BTreeMap::new();
                let mut unknown = Vec::new();
                for (node, v) in &state {
                    let Some(v) = v else {
                        unknown.push(node.to_string());
                        continue;
                    };
                    match self.catalog.window(v.minor_line()) {
                        None => {
                            out.insert(Violation::UnknownMinor {
                                minor: v.minor_line(),
                                step: None,
                            });
                        }
                        Some(w) if !w.contains(kt) => unsupported
                            .entry(v.clone())
                            .or_default()
                            .push(node.to_string()),
                        Some(_) => {}
                    }
                }
                if !unknown.is_empty() {
                    out.insert(Violation::UnknownNodes { nodes: unknown });
                }
                for (talos, nodes) in unsupported {
                    out.insert(Violation::KubeStep { talos, nodes });
                }
                k = kt.clone();
            }
            let Some(step) = talos.get(i) else { break };
            match self.catalog.window(step.to.minor_line()) {
                None => {
                    out.insert(Violation::UnknownMinor {
                        minor: step.to.minor_line(),
                        step: Some(i),
                    });
                }
                Some(w) if !w.contains(&k) => {
                    out.insert(Violation::Hop {
                        step: i,
                        kube: k.clone(),
                    });
                }
                Some(_) => {}
            }
            for m in step.waves.iter().flatten() {
                state.insert(
                    self.obs
                        .machines
                        .get_key_value(&m.node)
                        .map(|(k, _)| k.as_str())
                        .expect("wave machines are observed"),
                    Some(step.to.clone()),
                );
            }
        }
        out.into_iter().collect()
    }

    fn violation_diag(
        &self,
        talos: &[TalosRollout],
        k_now: &KubeVersion,
        target: Option<&KubeVersion>,
        v: Violation,
        tried_all: bool,
    ) -> Diagnostic {
        let kube_key = &self.cluster.kubernetes_version;
        let moved = if tried_all {
            " (medea tried the Kubernetes rollout before, between and after the Talos steps; none keeps every node inside its support window)"
        } else {
            ""
        };
        match v {
            Violation::KubeStep { talos: tv, nodes } => {
                let kt = target.expect("only with a Kubernetes step");
                let w = self.catalog.window(tv.minor_line()).expect("known window");
                Diagnostic::error(
                    codes::KUBERNETES_UNSUPPORTED,
                    kube_key.origin.clone(),
                    format!(
                        "Kubernetes {kt} is not supported by Talos {tv}, which {} would run when the Kubernetes rollout starts",
                        machines_text(&nodes)
                    ),
                )
                .with_label("target Kubernetes version")
                .with_help(format!(
                    "Talos {}.{} supports {w}; upgrade those machines to a Talos release that supports Kubernetes {}.{}, or choose a Kubernetes version in that range{moved}",
                    tv.major(),
                    tv.minor(),
                    kt.major(),
                    kt.minor()
                ))
            }
            Violation::Hop { step, kube } => {
                let s = &talos[step];
                let pool = &self.cluster.pools[&s.pool];
                let w = self.catalog.window(s.to.minor_line()).expect("known window");
                let hint = if &kube == k_now {
                    "roll Kubernetes into that range first (its own plan), or stop the pool at an earlier Talos minor"
                } else {
                    "choose a Kubernetes version this Talos supports, or stop the pool at an earlier Talos minor"
                };
                Diagnostic::error(
                    codes::KUBERNETES_UNSUPPORTED,
                    pool.talos_version.origin.clone(),
                    format!(
                        "Talos {} (hop {}/{} of node pool `{}`) does not support Kubernetes {kube}, which cluster `{}` runs at that point",
                        s.to, s.hop, s.hops, s.pool, self.name()
                    ),
                )
                .with_help(format!(
                    "Talos {}.{} supports {w}; {hint}{moved}",
                    s.to.major(),
                    s.to.minor()
                ))
            }
            Violation::UnknownMinor { minor, step } => {
                let origin = match step {
                    Some(i) => self.cluster.pools[&talos[i].pool].talos_version.origin.clone(),
                    None => kube_key.origin.clone(),
                };
                Diagnostic::error(
                    codes::CATALOG,
                    origin,
                    format!(
                        "Talos {}.{} is not in medea's compatibility catalog ({}), so the Kubernetes versions it supports are unknown",
                        minor.0,
                        minor.1,
                        self.catalog.version()
                    ),
                )
                .with_help(format!(
                    "add `upgradePolicy.kubernetesSupport: [{{talos: v{}.{}, minKubernetes: v1.X, maxKubernetes: v1.Y}}]` to cluster `{}`, with the range from the Talos support matrix",
                    minor.0,
                    minor.1,
                    self.name()
                ))
            }
            Violation::UnknownNodes { nodes } => Diagnostic::error(
                codes::UNOBSERVED,
                kube_key.origin.clone(),
                format!(
                    "the Talos version of {} is unknown, so medea cannot check that {} Kubernetes {}",
                    machines_text(&nodes),
                    if nodes.len() == 1 { "it supports" } else { "they support" },
                    target.map(|t| t.to_string()).unwrap_or_default()
                ),
            )
            .with_help("medea cannot plan what it cannot see: bring the nodes back and refresh the inventory"),
        }
    }

    fn notes(&self, members: &BTreeMap<String, Vec<Member<'a>>>, steps: &[Step]) -> Vec<String> {
        let mut notes = Vec::new();
        // `rolloutsEnabled` is a gate, not part of what a plan does: it must not change the
        // plan's id (an approved plan waits for the gate; `medea approve` names closed gates).
        let _ = steps;
        let managed: BTreeSet<&str> = members
            .values()
            .flatten()
            .map(|m| m.machine.node.as_str())
            .collect();
        let unmanaged: Vec<&str> = self
            .obs
            .machines
            .keys()
            .map(String::as_str)
            .filter(|n| !managed.contains(n))
            .collect();
        if !unmanaged.is_empty() {
            notes.push(format!(
                "not in any pool (medea never upgrades their Talos): {}",
                unmanaged.join(", ")
            ));
        }
        for pool in self.cluster.pools.values() {
            if !members.contains_key(&pool.name.value) {
                notes.push(format!(
                    "node pool `{}` selects no observed machine",
                    pool.name.value
                ));
            }
        }
        let away: Vec<String> = self
            .obs
            .machines
            .values()
            .filter(|m| m.unavailable())
            .map(|m| format!("{} ({})", m.node, why_unavailable(m)))
            .collect();
        if !away.is_empty() {
            notes.push(format!(
                "unavailable now, counted against maxUnavailable: {}",
                away.join(", ")
            ));
        }
        let unknown_kubelet: Vec<&str> = self
            .obs
            .machines
            .values()
            .filter(|m| m.kubelet_version.is_none())
            .map(|m| m.node.as_str())
            .collect();
        if !unknown_kubelet.is_empty() {
            notes.push(format!(
                "kubelet version unknown (not checked against the API server): {}",
                unknown_kubelet.join(", ")
            ));
        }
        notes
    }
}

fn why_unavailable(m: &Machine) -> String {
    let mut why = Vec::new();
    if !m.reachable {
        why.push("unreachable");
    }
    if !m.ready {
        why.push("NotReady");
    }
    if m.cordoned {
        why.push("cordoned");
    }
    why.join(", ")
}

fn role_text(r: MachineRole) -> &'static str {
    match r {
        MachineRole::Controlplane => "control-plane",
        MachineRole::Worker => "worker",
    }
}

fn machines_text(nodes: &[String]) -> String {
    let quoted: Vec<String> = nodes.iter().map(|n| format!("`{n}`")).collect();
    format!(
        "machine{} {}",
        if nodes.len() == 1 { "" } else { "s" },
        quoted.join(", ")
    )
}

fn skipped(now: &KubeVersion, target: &KubeVersion) -> String {
    if target.major() != now.major() {
        return format!("a major version ({} → {})", now.major(), target.major());
    }
    let minors: Vec<String> = (now.minor() + 1..target.minor())
        .map(|m| format!("{}.{m}", now.major()))
        .collect();
    minors.join(", ")
}

/// Pools in execution order: `after:` dependencies first (topological), and among the pools
/// free to run, control-plane pools before worker pools, then by name. Validation guarantees
/// the graph is acyclic and never puts a control-plane pool after a worker pool.
pub fn pool_order(cluster: &Cluster) -> Vec<String> {
    let mut done: BTreeSet<&str> = BTreeSet::new();
    let mut out = Vec::new();
    while out.len() < cluster.pools.len() {
        let next = cluster
            .pools
            .values()
            .filter(|p| !done.contains(p.name.value.as_str()))
            .filter(|p| {
                p.after.iter().all(|a| {
                    done.contains(a.value.as_str()) || !cluster.pools.contains_key(&a.value)
                })
            })
            .min_by_key(|p| (p.role != Role::Controlplane, p.name.value.as_str()));
        match next {
            Some(p) => {
                done.insert(&p.name.value);
                out.push(p.name.value.clone());
            }
            None => {
                // A cycle (refused by validation); keep the rest in name order.
                for p in cluster.pools.keys() {
                    if !done.contains(p.as_str()) {
                        out.push(p.clone());
                    }
                }
                break;
            }
        }
    }
    out
}
