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
//!    already-unavailable first, then by node name, and cut into waves (`ClusterCtx::waves`,
//!    in `talos`).
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
//!
//! Files by stage: membership `members`, paths, hops and waves `talos`, the Kubernetes
//! step and its placement `kube`, the notes for people `notes`; this file drives them per
//! cluster (a cluster's section is a function of its [`memo::SectionInputs`] alone) and holds
//! order (4), settings (6), the approval bar and the plan's basis. When a section is planned
//! again and when it is reused is `memo`'s, apart from the rules.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

mod installer;
mod kube;
mod members;
mod memo;
#[cfg(test)]
mod memo_tests;
mod notes;
mod talos;

use memo::{ClusterSection, SectionInputs};
pub use memo::{FanOut, MemoStats, PARALLEL_FROM, PlanMemo};

use crate::plan::note::{Note, machines_text};
use notes::{role_text, why_unavailable};

use crate::desired::model::{
    ApprovalSettings, Cluster, DEFAULT_FACTORY, NodePool, Origin, Role, schematic_of,
};
use crate::desired::{Desired, Diagnostic};
use crate::inventory::{Inventory, Machine, MachineRole, ObservedCluster};
use crate::plan::applied::{AppliedResource, LastApplied, ResourceKey, role_of};
use crate::plan::bar::{
    Bar, BarChange, BarRaise, PlanScope, QuorumPolicy, bar_of_change, required_quorum,
};
use crate::plan::catalog::{Catalog, PathError};
use crate::plan::health::HealthPolicy;
use crate::plan::id::PlanId;
use crate::plan::model::*;
use crate::plan::setting::Setting;
use crate::version::{KubeVersion, TalosVersion};

/// Diagnostic codes of plan errors (rendered like desired-state diagnostics).
pub mod codes {
    /// A Talos version older than what the machines run, without `allowDowngrade`.
    pub const DOWNGRADE: &str = "medea::plan::downgrade";
    /// No upgrade path between the running and the target Talos version.
    pub const TALOS_PATH: &str = "medea::plan::talos-path";
    /// A Kubernetes target more than one minor ahead.
    pub const KUBERNETES_SKEW: &str = "medea::plan::kubernetes-skew";
    /// A Kubernetes target older than what the cluster runs.
    pub const KUBERNETES_DOWNGRADE: &str = "medea::plan::kubernetes-downgrade";
    /// A Kubernetes target the Talos the machines will run does not support.
    pub const KUBERNETES_UNSUPPORTED: &str = "medea::plan::kubernetes-unsupported";
    /// A Talos minor the compatibility catalog does not know.
    pub const CATALOG: &str = "medea::plan::catalog";
    /// Kubelets further behind the control plane than Kubernetes allows.
    pub const KUBELET_SKEW: &str = "medea::plan::kubelet-skew";
    /// A pool names a machine the inventory does not have.
    pub const UNKNOWN_MACHINE: &str = "medea::plan::unknown-machine";
    /// A machine picked by two pools.
    pub const MACHINE_TWICE: &str = "medea::plan::machine-in-two-pools";
    /// A machine whose observed role is not its pool's.
    pub const ROLE_MISMATCH: &str = "medea::plan::role-mismatch";
    /// An installer without a schematic would strip the node's system extensions.
    pub const SCHEMATIC_DROPPED: &str = "medea::plan::schematic-dropped";
    /// More machines unavailable already than may be away at once: the upgrade cannot start.
    pub const UNAVAILABLE: &str = "medea::plan::unavailable";
    /// A fact the plan needs was not observed (a version, a platform, SecureBoot).
    pub const UNOBSERVED: &str = "medea::plan::unobserved";
    /// An installer repository that does not publish the hop's Talos version
    /// (`ghcr.io/siderolabs/installer` from 1.14).
    pub const INSTALLER_UNPUBLISHED: &str = "medea::plan::installer-unpublished";
    /// A SecureBoot machine and a non-SecureBoot installer, or the other way round.
    pub const SECURE_BOOT: &str = "medea::plan::secure-boot-installer";
}

/// The Image Factory schematic with no customization: dropping it loses nothing.
pub use crate::desired::model::EMPTY_SCHEMATIC;

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
        halted: BTreeMap::new(),
    }
}

/// `plan` made after the newest job of some clusters halted (cluster → job id, as
/// `ops::replan::halted_jobs` reads them; the same map goes into the basis that approval
/// compares with). A halt before the job's first command leaves the desired state, the
/// observations and the applied settings as they were, so without this the next plan would be
/// the halted job's own plan, consumed, which never starts again: the rollout could not be
/// continued without an unrelated edit. The basis names the jobs and the id covers them
/// (a digest of the id the plan would have had and the map), so the continuation is a plan of
/// its own that needs approvals of its own. With no halted job the plan is unchanged.
pub fn after_halts(mut plan: Plan, halted: &BTreeMap<String, String>) -> Plan {
    if halted.is_empty() {
        return plan;
    }
    use sha2::{Digest, Sha256};
    plan.basis.halted = halted.clone();
    let mut h = Sha256::new();
    h.update(b"medea-plan-after-halt-v1\0");
    h.update(plan.id.as_bytes());
    for (cluster, job) in halted {
        h.update(cluster.as_bytes());
        h.update(b"\0");
        h.update(job.as_bytes());
        h.update(b"\0");
    }
    plan.id = PlanId::from_digest(h.finalize().into());
    plan
}

/// What the plan of a cluster whose rollout job `job` is still running says: nothing is
/// planned for it (no steps, no settings, its last-applied state untouched), and why.
fn rolling_out(cluster: &str, job: &str) -> ClusterPlan {
    ClusterPlan {
        raised_by: Vec::new(),
        preflight: Vec::new(),
        health: None,
        hooks: None,
        cluster: cluster.to_string(),
        steps: Vec::new(),
        settings: Vec::new(),
        unchanged: Vec::new(),
        status: ClusterStatus::RollingOut,
        notes: vec![Note::RollingOut {
            job: job.to_string(),
            cluster: cluster.to_string(),
        }],
        diffs: Vec::new(),
    }
}

/// Everything a plan is computed from. [`PlanInputs::new`] gives a cold plan's inputs (no
/// parent, no running job, no preflight context); set the other fields as the call needs.
#[derive(Debug, Clone, Copy)]
pub struct PlanInputs<'a> {
    /// The desired state; it must be valid (no error diagnostics).
    pub desired: &'a Desired,
    /// The observed inventory.
    pub observed: &'a Inventory,
    /// The settings in force (the last-applied records).
    pub last_applied: &'a LastApplied,
    /// The plan this one follows, if any.
    pub parent: Option<PlanId>,
    /// The clusters with a running rollout job (cluster → job id): those get a
    /// [`ClusterStatus::RollingOut`] entry and nothing else, so a plan approved while a job
    /// runs can never start a second one or apply settings under it.
    pub running: &'a BTreeMap<String, String>,
    /// The preflight checks' inputs (the time, upstream clusters' job history): what the
    /// daemon and `medea plan` pass.
    pub preflight: &'a crate::plan::preflight::Context,
}

/// No running job.
static NO_JOBS: BTreeMap<String, String> = BTreeMap::new();

/// No preflight context (no time, no upstream job history).
static NO_PREFLIGHT: crate::plan::preflight::Context = crate::plan::preflight::Context {
    now: None,
    promotion: BTreeMap::new(),
};

impl<'a> PlanInputs<'a> {
    /// A cold plan's inputs: no parent, no running job, no preflight context.
    pub fn new(
        desired: &'a Desired,
        observed: &'a Inventory,
        last_applied: &'a LastApplied,
    ) -> PlanInputs<'a> {
        PlanInputs {
            desired,
            observed,
            last_applied,
            parent: None,
            running: &NO_JOBS,
            preflight: &NO_PREFLIGHT,
        }
    }
}

/// Compute the plan of a cold start: no running job, no preflight context ([`compute_memo`]
/// with [`PlanInputs::new`] and a one-off memo). `desired` must be valid (no error
/// diagnostics). On error, every problem found is returned, each pointing at the YAML key it
/// is about.
pub fn compute(
    desired: &Desired,
    observed: &Inventory,
    last_applied: &LastApplied,
    parent: Option<PlanId>,
) -> Result<Plan, Vec<Diagnostic>> {
    let inputs = PlanInputs {
        parent,
        ..PlanInputs::new(desired, observed, last_applied)
    };
    compute_memo(&inputs, &mut PlanMemo::one_off())
}

/// Compute the plan from `inputs`, reusing the sections of `memo` whose inputs are unchanged
/// and leaving in it the sections of this plan (a one-off memo, [`PlanMemo::one_off`],
/// reuses and keeps nothing). The plan is the same, byte for byte, whatever the memo holds.
/// On error, every problem found is returned, each pointing at the YAML key it is about.
pub fn compute_memo(inputs: &PlanInputs<'_>, memo: &mut PlanMemo) -> Result<Plan, Vec<Diagnostic>> {
    let mut clusters: BTreeMap<String, Arc<ClusterPlan>> = memo
        .plan_sections(inputs)
        .into_iter()
        .filter_map(|(name, plan)| plan.map(|p| (name, p)))
        .collect();
    let mut diags = Vec::new();
    let mut applies = Applies::default();
    let mut bar: u32 = 1;
    let mut catalogs = BTreeSet::new();
    for sec in memo.sections() {
        catalogs.insert(sec.catalog.clone());
        diags.extend(sec.diags.iter().cloned());
        bar = bar.max(sec.bar);
        applies.put.extend(sec.put.iter().cloned());
        applies.delete.extend(sec.delete.iter().cloned());
    }
    bar = bar.max(removed_clusters(inputs, &mut clusters, &mut applies));
    if !diags.is_empty() {
        diags.sort_by(|a, b| {
            a.origin
                .cmp(&b.origin)
                .then_with(|| a.message.cmp(&b.message))
        });
        diags.dedup();
        return Err(diags);
    }
    let catalog = catalogs.into_iter().collect::<Vec<_>>().join(",");
    Ok(assemble(inputs, memo, clusters, applies, bar, catalog))
}

/// The clusters applied before and gone from the desired state: each a
/// [`ClusterStatus::Removed`] entry whose resources approval deletes (or, while its job
/// runs, a [`ClusterStatus::RollingOut`] one). The bar removing them needs.
fn removed_clusters(
    inputs: &PlanInputs<'_>,
    clusters: &mut BTreeMap<String, Arc<ClusterPlan>>,
    applies: &mut Applies,
) -> u32 {
    let (desired, last_applied) = (inputs.desired, inputs.last_applied);
    let mut bar = 1;
    for gone in last_applied.cluster_names() {
        if desired.clusters.contains_key(&gone) {
            continue;
        }
        if let Some(job) = inputs.running.get(&gone) {
            clusters.insert(gone.clone(), Arc::new(rolling_out(&gone, job)));
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
            Arc::new(ClusterPlan {
                raised_by: Vec::new(),
                preflight: Vec::new(),
                health: None,
                hooks: None,
                cluster: gone.clone(),
                steps: Vec::new(),
                settings,
                unchanged: Vec::new(),
                status: ClusterStatus::Removed,
                notes: vec![Note::Removed {}],
                diffs,
            }),
        );
    }
    bar
}

/// The plan of `clusters`, `applies` (sorted here), `bar` and `catalog`, with its basis and
/// id (hashed from the sections' JSON the memo computed once).
fn assemble(
    inputs: &PlanInputs<'_>,
    memo: &mut PlanMemo,
    clusters: BTreeMap<String, Arc<ClusterPlan>>,
    mut applies: Applies,
    bar: u32,
    catalog: String,
) -> Plan {
    let desired = inputs.desired;
    // The canonical JSON of each put resource, in the order of `applies.put` (both sorted by
    // the same stable sort).
    let mut put_json: Vec<(String, &[u8])> = memo
        .sections()
        .filter(|sec| !sec.plan_json.is_empty())
        .flat_map(|sec| {
            sec.put
                .iter()
                .zip(&sec.put_json)
                .map(|(r, j)| (r.key.store_key(), j.as_slice()))
        })
        .collect();
    put_json.sort_by(|a, b| a.0.cmp(&b.0));
    applies.put.sort_by_key(|r| r.key.store_key());
    applies.delete.sort_by_key(|k| k.store_key());
    applies.delete.dedup();
    let mut plan = Plan {
        id: PlanId::from_digest([0; 32]),
        parent: inputs.parent,
        basis: basis_with(
            desired,
            inputs.observed,
            inputs.last_applied,
            inputs.running,
        ),
        clusters: clusters.into_values().collect(),
        approvals_required: bar,
        catalog,
        applies,
        estimates: Vec::new(),
    };
    if plan.catalog.is_empty() {
        plan.catalog = crate::plan::catalog::CATALOG_VERSION.to_string();
    }
    let cluster_json = |c: &ClusterPlan| -> Option<&[u8]> {
        memo.section(&c.cluster)
            .map(|sec| sec.plan_json.as_slice())
            .filter(|_| desired.clusters.contains_key(&c.cluster))
    };
    plan.id = canonical_id_from_parts(&plan, cluster_json, &put_json);
    memo.computed(plan.id);
    plan
}

/// One desired cluster's section of the plan: a function of its [`SectionInputs`] alone (it
/// receives nothing else, so the memo's key holds all it reads), with its JSON.
#[allow(
    clippy::expect_used,
    reason = "plain structs with string keys and no non-finite floats: serializing them to JSON cannot fail (as in Plan::canonical_id)"
)]
fn section(inputs: &SectionInputs<'_>) -> ClusterSection {
    let mut s = section_parts(inputs);
    if let Some(p) = &s.plan {
        s.plan_json = serde_json::to_vec(p).expect("plans serialize");
    }
    s.put_json = s
        .put
        .iter()
        .map(|r| serde_json::to_vec(r).expect("applied resources serialize"))
        .collect();
    s
}

/// The rules of one desired cluster's section: its plan (or why there is none), diagnostics,
/// approval bar, and what approval applies.
fn section_parts(inputs: &SectionInputs<'_>) -> ClusterSection {
    let (name, cluster) = (inputs.name, inputs.cluster);
    let catalog = Catalog::for_policy(&cluster.upgrade_policy);
    let mut out = ClusterSection {
        catalog: catalog.version(),
        plan: None,
        diags: Vec::new(),
        bar: 1,
        put: Vec::new(),
        delete: Vec::new(),
        plan_json: Vec::new(),
        put_json: Vec::new(),
        checked: false,
        preflight: (Vec::new(), Vec::new()),
    };
    if let Some(job) = inputs.running {
        out.plan = Some(Arc::new(rolling_out(name, job)));
        return out;
    }
    let obs = inputs
        .observed
        .filter(|o| !(o.machines.is_empty() && o.kubernetes_version.is_none()));
    let Some(obs) = obs else {
        out.plan = Some(Arc::new(ClusterPlan {
            raised_by: Vec::new(),
            preflight: Vec::new(),
            health: None,
            hooks: None,
            cluster: name.clone(),
            steps: Vec::new(),
            settings: Vec::new(),
            unchanged: Vec::new(),
            status: ClusterStatus::NotObserved,
            notes: vec![Note::NotObserved {}],
            diffs: Vec::new(),
        }));
        return out;
    };
    // Only this cluster's resources: the section depends on nothing else of the applied state.
    let last_applied = LastApplied {
        resources: inputs
            .applied
            .iter()
            .map(|r| (r.key.store_key(), (*r).clone()))
            .collect(),
    };
    let last_applied = &last_applied;
    let mut ctx = ClusterCtx {
        cluster,
        obs,
        catalog: &catalog,
        diags: Vec::new(),
    };
    let plan = ctx.plan(last_applied);
    out.diags = ctx.diags;
    let Some(mut plan) = plan else { return out };
    let in_force = policy(last_applied.approvals_in_force(name));
    let change = BarChange::between(&in_force, Some(&policy(cluster.approvals)));
    if plan.has_changes() || change != BarChange::Keeps {
        out.bar = out.bar.max(approval_bar(&mut plan, in_force, change));
    }
    // Approval makes this revision of every resource of the cluster the last applied one.
    out.put.push(AppliedResource::of_cluster(cluster));
    out.put
        .extend(cluster.pools.values().map(|p| AppliedResource::of_pool(p)));
    for res in &inputs.applied {
        if let ResourceKey::Pool { cluster: c, pool } = &res.key
            && c == name
            && !cluster.pools.contains_key(pool)
        {
            out.delete.push(res.key.clone());
        }
    }
    out.checked = true;
    out.plan = Some(Arc::new(plan));
    out
}

/// The approvals a cluster's changes need, from the plan's typed raises
/// ([`ClusterPlan::raised_by`], each setting's bar chosen in [`crate::plan::bar::bar_of`]):
/// the control-plane bar for a control-plane step or a setting that needs it, the highest in
/// force for a setting that needs it or a change of the approvals setting. Notes say why.
fn approval_bar(plan: &mut ClusterPlan, in_force: QuorumPolicy, change: BarChange) -> u32 {
    let cp_steps = plan.steps.iter().any(Step::touches_control_plane);
    let top = plan.raised_by.iter().map(|r| r.bar).max();
    let scope = PlanScope {
        // A setting that needs the highest bar raises `needs` below, not the scope: the
        // approvals setting's own rule (`required_quorum`) reads the scope of the steps.
        touches_control_plane_or_kubernetes: cp_steps
            || plan.raised_by.iter().any(|r| r.bar == Bar::ControlPlane),
    };
    let named = |pick: &dyn Fn(&BarRaise) -> bool| -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for r in plan.raised_by.iter().filter(|r| pick(r)) {
            let s = if r.whole_resource && r.resource == "cluster" && is_source(r.setting) {
                "the new cluster's health sources".to_string()
            } else if r.resource == "cluster" && !r.setting.is_hook() {
                r.setting.path().to_string()
            } else {
                format!("{} {}", r.resource, r.setting)
            };
            if !v.contains(&s) {
                v.push(s);
            }
        }
        v
    };
    let cp_named = named(&|r| r.bar == Bar::ControlPlane);
    let sources = named(&|r| r.bar == Bar::Highest && is_source(r.setting));
    let hooks = named(&|r| r.setting.is_hook());
    let other = named(&|r| {
        r.bar == Bar::Highest
            && !is_source(r.setting)
            && !r.setting.is_hook()
            && !is_approvals(r.setting)
    });
    if !cp_named.is_empty() && !cp_steps {
        // Said, so that the signer reads which settings set the bar.
        plan.notes
            .push(Note::ControlPlaneSettings { settings: cp_named });
    }
    let mut needs = required_quorum(&in_force, change, scope);
    if change != BarChange::Keeps {
        plan.notes.push(Note::ApprovalsChange {
            required: in_force.required,
            control_plane: in_force.control_plane,
            needs,
        });
    }
    if top == Some(Bar::Highest) {
        needs = needs.max(in_force.highest());
    }
    let (r, c) = (in_force.required, in_force.control_plane);
    if !sources.is_empty() {
        plan.notes.push(Note::SourcesChange {
            settings: sources,
            required: r,
            control_plane: c,
            needs,
        });
    }
    if !other.is_empty() {
        plan.notes.push(Note::HighestSettings {
            settings: other,
            required: r,
            control_plane: c,
            needs,
        });
    }
    if !hooks.is_empty() {
        plan.notes.push(Note::HooksChange {
            settings: hooks,
            required: r,
            control_plane: c,
            needs,
        });
    }
    needs
}

/// Where health data, credentials and backups go (issue #32, #37).
fn is_source(s: Setting) -> bool {
    matches!(
        s,
        Setting::HealthPrometheus
            | Setting::HealthAlertmanager
            | Setting::BackupDestination
            | Setting::BackupRecipients
    )
}

/// The approvals setting (said by [`APPROVALS_CHANGE_NOTE`]).
fn is_approvals(s: Setting) -> bool {
    matches!(
        s,
        Setting::ApprovalsRequired | Setting::ApprovalsControlPlane
    )
}

/// [`Plan::canonical_id`] from the sections' JSON computed once: the same bytes hashed (the
/// compact JSON of a struct is its fields' JSON joined in declaration order), without
/// serializing every cluster again. `cluster_json` gives a cluster's cached JSON (`None`:
/// serialize it here); `put_json` is the JSON of `plan.applies.put`, in its order.
#[allow(
    clippy::expect_used,
    reason = "plain structs with string keys and no non-finite floats: serializing them to JSON cannot fail (as in Plan::canonical_id)"
)]
fn canonical_id_from_parts<'a>(
    plan: &Plan,
    cluster_json: impl Fn(&ClusterPlan) -> Option<&'a [u8]>,
    put_json: &[(String, &[u8])],
) -> PlanId {
    use sha2::{Digest, Sha256};
    let json = |v: &dyn erased::Json| v.to_json();
    let mut h = Sha256::new();
    h.update(br#"{"domain":"medea-plan/v1","catalog":"#);
    h.update(json(&plan.catalog));
    h.update(br#","basis":"#);
    h.update(json(&plan.basis.identity()));
    h.update(br#","clusters":["#);
    for (i, c) in plan.clusters.iter().enumerate() {
        if i > 0 {
            h.update(b",");
        }
        match cluster_json(c) {
            Some(bytes) if !bytes.is_empty() => h.update(bytes),
            _ => h.update(json(c)),
        }
    }
    h.update(br#"],"approvalsRequired":"#);
    h.update(json(&plan.approvals_required));
    h.update(br#","applies":{"put":["#);
    if put_json.len() == plan.applies.put.len() {
        for (i, (_, j)) in put_json.iter().enumerate() {
            if i > 0 {
                h.update(b",");
            }
            h.update(j);
        }
    } else {
        for (i, r) in plan.applies.put.iter().enumerate() {
            if i > 0 {
                h.update(b",");
            }
            h.update(json(r));
        }
    }
    h.update(br#"],"delete":"#);
    h.update(json(&plan.applies.delete));
    h.update(b"}}");
    PlanId::from_digest(h.finalize().into())
}

mod erased {
    /// Any serializable value's compact JSON.
    pub trait Json {
        fn to_json(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Json for T {
        #[allow(
            clippy::expect_used,
            reason = "plain structs with string keys and no non-finite floats: serializing them to JSON cannot fail (as in Plan::canonical_id)"
        )]
        fn to_json(&self) -> Vec<u8> {
            serde_json::to_vec(self).expect("plan parts serialize")
        }
    }
}

/// A cluster's approvals setting as the quorum rule sees it.
pub use crate::plan::note::{
    APPROVALS_CHANGE_NOTE, CP_SETTINGS_NOTE, HIGHEST_SETTINGS_NOTE, HOOKS_CHANGE_NOTE,
    SOURCES_CHANGE_NOTE,
};

fn policy(a: ApprovalSettings) -> QuorumPolicy {
    QuorumPolicy {
        required: a.required,
        control_plane: a.control_plane,
    }
}

/// The raise of a change of `setting` of resource `key` ([`bar_of_change`]), if it needs more
/// than the ordinary bar.
fn raise(key: &ResourceKey, setting: Setting, cp_pool: bool, whole: bool) -> Option<BarRaise> {
    let bar = bar_of_change(setting, cp_pool);
    (bar > Bar::Ordinary).then(|| BarRaise {
        resource: key.label(),
        setting,
        bar,
        whole_resource: whole,
    })
}

/// The raises of a whole resource created or removed: each setting whose value differs
/// between `from` and `to` (one of them a document that writes nothing).
fn raises(
    res: &AppliedResource,
    from: Vec<(Setting, String)>,
    to: Vec<(Setting, String)>,
    whole: bool,
) -> Vec<BarRaise> {
    let cp = res.is_control_plane_pool();
    from.into_iter()
        .zip(to)
        .filter(|((_, was), (_, is))| was != is)
        .filter_map(|((setting, _), _)| raise(&res.key, setting, cp, whole))
        .collect()
}

fn removed(key: &ResourceKey) -> SettingsChange {
    SettingsChange {
        resource: key.label(),
        field: RESOURCE_FIELD.into(),
        from: "present".into(),
        to: "removed".into(),
    }
}

/// Notes for a resource that loses all its health gates or its promotion (issue #32): a
/// quiet line in a settings list is easy to miss.
fn removal_notes(notes: &mut Vec<Note>, old: &AppliedResource, new: &AppliedResource) {
    use crate::plan::applied::Settings;
    let gates = |s: &Settings| match s {
        Settings::Cluster(c) => c.health.gates.len(),
        Settings::Pool(p) => p.health.gates.len(),
    };
    if gates(&old.settings) > 0 && gates(&new.settings) == 0 {
        notes.push(Note::GatesRemoved {
            resource: new.key.label(),
        });
    }
    if let (Settings::Cluster(o), Settings::Cluster(n)) = (&old.settings, &new.settings)
        && let (Some(p), None) = (&o.promotion, &n.promotion)
    {
        notes.push(Note::PromotionRemoved {
            after: p.after.to_string(),
        });
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

    /// The pools `last_applied` has and the cluster no longer names: each is a settings change,
    /// a diff to nothing and, setting by setting, a change to a document that writes nothing
    /// (its hooks stop, a control-plane pool's nodes leave management).
    fn removed_pools(
        &self,
        last_applied: &LastApplied,
        settings: &mut Vec<SettingsChange>,
        diffs: &mut Vec<ResourceDiff>,
        raised_by: &mut Vec<BarRaise>,
    ) {
        for res in last_applied.resources.values() {
            if let ResourceKey::Pool { cluster, pool } = &res.key
                && cluster == self.name()
                && !self.cluster.pools.contains_key(pool)
            {
                settings.push(removed(&res.key));
                diffs.extend(diff_of(&res.key, &res.file, &res.document, ""));
                raised_by.extend(raises(res, res.settings(), res.baseline_settings(), true));
            }
        }
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
        let mut notes_extra = Vec::new();
        let mut raised_by = Vec::new();
        for (new, stepped) in &resources {
            let before = settings.len();
            match last_applied.get(&new.key) {
                None => {
                    settings.push(SettingsChange {
                        resource: new.key.label(),
                        field: RESOURCE_FIELD.into(),
                        from: "absent".into(),
                        to: "created".into(),
                    });
                    // A new document: each of its settings changes from a document that
                    // writes nothing (issue #50).
                    raised_by.extend(raises(new, new.baseline_settings(), new.settings(), true));
                }
                Some(old) => {
                    let cp = old.is_control_plane_pool() || new.is_control_plane_pool();
                    for ((setting, was), (_, is)) in old.settings().into_iter().zip(new.settings())
                    {
                        if was != is {
                            raised_by.extend(raise(&new.key, setting, cp, false));
                            settings.push(SettingsChange {
                                resource: new.key.label(),
                                field: setting.path().to_string(),
                                from: was,
                                to: is,
                            });
                        }
                    }
                }
            }
            let changed = *stepped || settings.len() > before;
            if changed && let ResourceKey::Pool { pool, .. } = &new.key {
                changed_pools.insert(pool.clone());
            }
            // Every document whose text differs from the last-applied one shows its diff
            // (issue #32): signers see all they sign, even a change medea has no field for.
            let old = last_applied
                .get(&new.key)
                .map_or("", |o| o.document.as_str());
            diffs.extend(diff_of(&new.key, &new.file, old, &new.document));
            if let Some(o) = last_applied.get(&new.key) {
                removal_notes(&mut notes_extra, o, new);
            }
        }
        self.removed_pools(last_applied, &mut settings, &mut diffs, &mut raised_by);
        let unchanged = self
            .cluster
            .pools
            .keys()
            .filter(|p| !changed_pools.contains(*p))
            .cloned()
            .collect();
        let mut notes = self.notes(&members, &steps);
        notes.extend(notes_extra);
        // Gates run around a job: a cluster with nothing to roll carries none.
        let health = (!steps.is_empty())
            .then(|| HealthPolicy::of(&self.cluster.health))
            .flatten();
        // Hooks too: a cluster with nothing to roll runs none.
        let hooks = if steps.is_empty() {
            None
        } else {
            self.cluster.hooks.clone().non_empty()
        };
        Some(ClusterPlan {
            raised_by,
            preflight: Vec::new(),
            health,
            hooks,
            cluster: self.name().to_string(),
            steps,
            settings,
            unchanged,
            status: ClusterStatus::Planned,
            notes,
            diffs,
        })
    }
}

/// Pools in execution order: `after:` dependencies first (topological), and among the pools
/// free to run, control-plane pools before worker pools, then by name. Validation guarantees
/// the graph is acyclic and never puts a control-plane pool after a worker pool.
pub fn pool_order(cluster: &Cluster) -> Vec<String> {
    use std::cmp::Reverse;
    use std::collections::{BinaryHeap, HashMap};
    // Kahn's topological sort with a heap of the pools free to run, keyed as the order wants:
    // O((pools + edges) log pools). (It picked the least free pool by scanning every pool
    // again for each one placed: quadratic, 8,000 pools took most of a minute; issue #49.)
    let key = |p: &NodePool| (p.role != Role::Controlplane, p.name.value.clone());
    let mut waiting_on: HashMap<&str, usize> = HashMap::with_capacity(cluster.pools.len());
    let mut unblocks: HashMap<&str, Vec<&NodePool>> = HashMap::new();
    let mut free = BinaryHeap::new();
    for p in cluster.pools.values() {
        // An `after` naming no pool of the cluster does not hold the pool back.
        let mut n = 0;
        for a in &p.after {
            if cluster.pools.contains_key(&a.value) {
                n += 1;
                unblocks.entry(a.value.as_str()).or_default().push(p);
            }
        }
        if n == 0 {
            free.push(Reverse(key(p)));
        } else {
            waiting_on.insert(p.name.value.as_str(), n);
        }
    }
    let mut out = Vec::with_capacity(cluster.pools.len());
    while let Some(Reverse((_, name))) = free.pop() {
        for &next in unblocks.get(name.as_str()).into_iter().flatten() {
            if let Some(n) = waiting_on.get_mut(next.name.value.as_str()) {
                *n -= 1;
                if *n == 0 {
                    waiting_on.remove(next.name.value.as_str());
                    free.push(Reverse(key(next)));
                }
            }
        }
        out.push(name);
    }
    // A cycle (refused by validation): the pools in it and after it, in name order.
    if !waiting_on.is_empty() {
        out.extend(
            cluster
                .pools
                .keys()
                .filter(|p| waiting_on.contains_key(p.as_str()))
                .cloned(),
        );
    }
    out
}
