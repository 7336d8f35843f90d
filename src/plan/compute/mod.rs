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
//! cluster and holds order (4), settings (6), the approval bar and the plan's basis.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

mod kube;
mod members;
#[cfg(test)]
mod memo_tests;
mod notes;
mod talos;

use notes::{machines_text, role_text, why_unavailable};

use crate::desired::model::{ApprovalSettings, Cluster, NodePool, Origin, Role, schematic_of};
use crate::desired::{Desired, Diagnostic};
use crate::inventory::{Inventory, Machine, MachineRole, ObservedCluster};
use crate::plan::applied::{AppliedResource, LastApplied, ResourceKey, role_of};
use crate::plan::bar::{BarChange, PlanScope, QuorumPolicy, required_quorum};
use crate::plan::catalog::{Catalog, PathError};
use crate::plan::health::HealthPolicy;
use crate::plan::id::PlanId;
use crate::plan::model::*;
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
    /// A fact the plan needs was not observed (a version, a platform).
    pub const UNOBSERVED: &str = "medea::plan::unobserved";
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
        preflight: Vec::new(),
        health: None,
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
    compute_in(
        desired,
        observed,
        last_applied,
        parent,
        running,
        &crate::plan::preflight::Context::default(),
    )
}

/// [`compute_with`] with the preflight checks' inputs (the time, upstream clusters' job
/// history): what the daemon and `medea plan` call.
pub fn compute_in(
    desired: &Desired,
    observed: &Inventory,
    last_applied: &LastApplied,
    parent: Option<PlanId>,
    running: &BTreeMap<String, String>,
    preflight: &crate::plan::preflight::Context,
) -> Result<Plan, Vec<Diagnostic>> {
    compute_memo(
        desired,
        observed,
        last_applied,
        parent,
        running,
        preflight,
        &mut PlanMemo::one_off(),
    )
}

/// Every input of one desired cluster's plan section ([`section`]): the section is a pure
/// function of these, so a section computed from equal inputs is reused ([`PlanMemo`]).
/// A planner change that makes a cluster's section read something more (another cluster's job
/// history, a new observation) adds that input here as a field; the derived `PartialEq` then
/// invalidates on it.
///
/// Nothing is copied that the memo can share: the observed record is the inventory's own
/// (`Arc`), and the desired `Cluster` stays in the desired state the memo holds
/// ([`PlanMemo::share_desired`]). Equal pointers are equal inputs; otherwise the values are
/// compared whole, so a match is always exact.
#[derive(Debug, Clone)]
pub struct SectionInputs {
    /// The validated Cluster and its pools (every field, source positions included).
    cluster: KeptCluster,
    /// The observed cluster record (compared whole, not only by generation).
    observed: Option<Arc<ObservedCluster>>,
    /// The running rollout job, if any.
    running: Option<String>,
    /// The cluster's last-applied resources (the cluster and its pools, gone ones included).
    applied: Vec<AppliedResource>,
}

/// Where a memoized section's desired `Cluster` is kept.
#[derive(Debug, Clone)]
enum KeptCluster {
    /// In the desired state the memo holds ([`PlanMemo::desired`]), under the section's name.
    Shared,
    /// A copy: the planning call shared no desired state with the memo.
    Copy(Box<Cluster>),
}

/// The inputs as borrowed from a planning call, compared with a memoized [`SectionInputs`]
/// without copying them.
struct InputsRef<'a> {
    cluster: &'a Cluster,
    observed: Option<&'a Arc<ObservedCluster>>,
    running: Option<&'a String>,
    applied: Vec<&'a AppliedResource>,
}

impl InputsRef<'_> {
    /// Whether `m` holds these inputs. `shared` is the memo's desired state's Cluster of
    /// this name, for inputs kept as [`KeptCluster::Shared`].
    fn matches(&self, m: &SectionInputs, shared: Option<&Cluster>) -> bool {
        let cluster = match &m.cluster {
            KeptCluster::Copy(c) => **c == *self.cluster,
            KeptCluster::Shared => {
                shared.is_some_and(|c| std::ptr::eq(c, self.cluster) || *c == *self.cluster)
            }
        };
        let observed = match (self.observed, &m.observed) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
            _ => false,
        };
        cluster
            && observed
            && self.running == m.running.as_ref()
            && self.applied.len() == m.applied.len()
            && self.applied.iter().zip(&m.applied).all(|(a, b)| *a == b)
    }
    /// The inputs to keep; `shared`: the Cluster is in the desired state the memo keeps.
    fn to_owned(&self, shared: bool) -> SectionInputs {
        SectionInputs {
            cluster: if shared {
                KeptCluster::Shared
            } else {
                KeptCluster::Copy(Box::new(self.cluster.clone()))
            },
            observed: self.observed.cloned(),
            running: self.running.cloned(),
            applied: self.applied.iter().map(|a| (*a).clone()).collect(),
        }
    }
}

/// Everything one desired cluster contributes to a plan: its entry, its diagnostics, its
/// approval bar, its catalog and what approval applies for it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSection {
    catalog: String,
    /// `None` when the cluster cannot be planned (`diags` says why). Shared with the plans
    /// that carry it (`Plan::clusters`): a reused section is never copied.
    plan: Option<Arc<ClusterPlan>>,
    diags: Vec<Diagnostic>,
    /// The approvals this cluster's changes need (1 when none).
    bar: u32,
    put: Vec<AppliedResource>,
    delete: Vec<ResourceKey>,
    /// The canonical JSON of `plan` and of each of `put`, as the plan id hashes them
    /// ([`Plan::canonical_id`]), computed once per section.
    plan_json: Vec<u8>,
    put_json: Vec<Vec<u8>>,
    /// The preflight checks apply to this section's base ([`Self::base`]).
    checked: bool,
    /// The findings and acknowledgement notes `plan` carries: `plan` is its base (the
    /// section before the preflight checks) with `preflight` set to the findings and the
    /// notes appended. The base is not kept (it would be a second copy of every section):
    /// it is `plan` with both undone.
    preflight: (Vec<crate::plan::preflight::Finding>, Vec<String>),
}

impl ClusterSection {
    /// Make `plan` the base section with these findings and notes, and its JSON.
    #[allow(
        clippy::expect_used,
        reason = "plain structs with string keys and no non-finite floats: serializing them to JSON cannot fail (as in Plan::canonical_id)"
    )]
    fn finish(&mut self, found: (Vec<crate::plan::preflight::Finding>, Vec<String>)) {
        let Some(base) = self.base() else {
            return;
        };
        let mut plan = base.into_owned();
        plan.preflight = found.0.clone();
        plan.notes.extend(found.1.iter().cloned());
        self.plan_json = serde_json::to_vec(&plan).expect("plans serialize");
        self.plan = Some(Arc::new(plan));
        self.preflight = found;
    }

    /// The section before the preflight checks: `plan` itself while it carries no findings
    /// and no notes of them (the usual case, no copy), else `plan` with them undone (the
    /// base's `preflight` is always empty, and the notes were appended at its end).
    fn base(&self) -> Option<Cow<'_, ClusterPlan>> {
        let plan = self.plan.as_deref()?;
        if self.preflight.0.is_empty() && self.preflight.1.is_empty() {
            return Some(Cow::Borrowed(plan));
        }
        let mut base = plan.clone();
        base.preflight = Vec::new();
        base.notes
            .truncate(base.notes.len().saturating_sub(self.preflight.1.len()));
        Some(Cow::Owned(base))
    }
}

/// Per-cluster plan sections of earlier plans, reused while their [`SectionInputs`] are equal.
/// A plan computed with a memo is the plan computed without one (`compute_with`), byte for
/// byte: a section is a pure function of its inputs, and the whole-plan parts (the basis,
/// removed clusters, the bar, the id) are computed afresh every time.
#[derive(Debug)]
pub struct PlanMemo {
    /// Each section with its inputs (`None` in a one-off memo, which reuses nothing).
    sections: BTreeMap<String, (Option<SectionInputs>, ClusterSection)>,
    last: MemoStats,
    /// Whether sections are kept for the next call. A one-off memo (a cold plan) neither
    /// copies the inputs nor clones the sections into the plan: it moves them.
    keep: bool,
    /// The id of the plan the last call computed (its sections are the ones kept).
    last_id: Option<PlanId>,
    /// The desired state the kept sections' [`KeptCluster::Shared`] inputs are in (the one
    /// the last call planned, when the caller shared it).
    desired: Option<Arc<crate::desired::Loaded>>,
    /// The desired state the next call plans, if the caller shares it ([`Self::share_desired`]).
    next_desired: Option<Arc<crate::desired::Loaded>>,
    /// Where the changed sections are planned when there are enough of them
    /// ([`Self::fan_out`]); `None`: on the calling thread.
    fan_out: Option<(FanOut, usize)>,
}

/// Runs every job, possibly each on a thread of its own, and returns when all have run (a
/// panic in one is resumed). `src/plan` starts no thread itself: the caller passes one in
/// (`ops::fan_out`).
pub type FanOut = for<'a> fn(Vec<Box<dyn FnOnce() + Send + 'a>>);

/// Sections are planned through the [`FanOut`] from this many changed sections on (below it,
/// a thread costs more than it saves: one changed file is one or two sections).
pub const PARALLEL_FROM: usize = 16;

impl Default for PlanMemo {
    fn default() -> PlanMemo {
        PlanMemo {
            sections: BTreeMap::new(),
            last: MemoStats::default(),
            keep: true,
            last_id: None,
            desired: None,
            next_desired: None,
            fan_out: None,
        }
    }
}

/// What the last planning call with a [`PlanMemo`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoStats {
    /// Clusters planned afresh.
    pub planned: usize,
    /// Clusters whose previous section was reused.
    pub reused: usize,
}

impl PlanMemo {
    /// What the last planning call reused and planned afresh.
    pub fn last_stats(&self) -> MemoStats {
        self.last
    }
    /// A memo for one plan only (what [`compute_in`] uses): nothing is kept, so nothing is
    /// copied for later.
    pub fn one_off() -> PlanMemo {
        PlanMemo {
            keep: false,
            ..PlanMemo::default()
        }
    }
    /// Plan the changed sections in `lanes` lanes run by `fan_out` whenever there are at
    /// least [`PARALLEL_FROM`] of them (with `lanes` ≤ 1, or fewer sections, on the calling
    /// thread). The plan is the same bytes whatever the lanes: each section is a pure function
    /// of its own inputs and the sections are merged in cluster order.
    pub fn fan_out(mut self, fan_out: FanOut, lanes: usize) -> PlanMemo {
        self.fan_out = Some((fan_out, lanes));
        self
    }
    /// Whether this memo keeps sections for the next call.
    pub fn keeps(&self) -> bool {
        self.keep
    }

    /// The next call plans `loaded`'s desired state (the `desired` it is given is
    /// `loaded.valid()`): the memo then keeps `loaded` (an `Arc` the caller holds anyway)
    /// instead of a copy of every cluster's desired `Cluster`, and compares a cluster whose
    /// revision did not change by pointer. Ignored when the call plans another desired state.
    pub fn share_desired(&mut self, loaded: Arc<crate::desired::Loaded>) {
        self.next_desired = Some(loaded);
    }

    /// The JSON of `plan` (`serde_json::to_vec(plan)`, byte for byte), its clusters' JSON
    /// taken from the sections serialized once when they were planned instead of serializing
    /// every cluster again: for storing the plan. Only for the plan the last call computed
    /// (checked by id, which hashes every cluster); any other plan is serialized whole.
    #[allow(
        clippy::expect_used,
        reason = "plain structs with string keys and no non-finite floats: serializing them to JSON cannot fail (as in Plan::canonical_id)"
    )]
    pub fn plan_json(&self, plan: &Plan) -> Vec<u8> {
        use erased::Json as _;
        if self.last_id != Some(plan.id) {
            return serde_json::to_vec(plan).expect("plans serialize");
        }
        let mut out = Vec::with_capacity(
            self.sections
                .values()
                .map(|(_, s)| s.plan_json.len())
                .sum::<usize>()
                + 4096,
        );
        out.extend_from_slice(br#"{"id":"#);
        out.extend(plan.id.to_json());
        out.extend_from_slice(br#","parent":"#);
        out.extend(plan.parent.to_json());
        out.extend_from_slice(br#","basis":"#);
        out.extend(plan.basis.to_json());
        out.extend_from_slice(br#","clusters":["#);
        for (i, c) in plan.clusters.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match self.sections.get(&c.cluster) {
                Some((_, sec))
                    if !sec.plan_json.is_empty()
                        && sec
                            .plan
                            .as_ref()
                            .is_some_and(|p| Arc::ptr_eq(p, c) || p == c) =>
                {
                    out.extend_from_slice(&sec.plan_json)
                }
                _ => out.extend(c.to_json()),
            }
        }
        out.extend_from_slice(br#"],"approvalsRequired":"#);
        out.extend(plan.approvals_required.to_json());
        out.extend_from_slice(br#","catalog":"#);
        out.extend(plan.catalog.to_json());
        out.extend_from_slice(br#","applies":"#);
        out.extend(plan.applies.to_json());
        out.push(b'}');
        out
    }
}

/// One desired cluster of a planning call: its inputs and, when they are unchanged, its
/// memoized section.
struct Work<'a> {
    name: &'a String,
    cluster: &'a Cluster,
    inputs: InputsRef<'a>,
    kept: Option<(Option<SectionInputs>, ClusterSection)>,
}

impl Work<'_> {
    /// The section (the kept one, or planned afresh) with its preflight findings, and the
    /// inputs to keep for it (`keep`: the memo keeps sections; `shared`: the memo keeps the
    /// desired state this call plans).
    fn finish(
        self,
        last_applied: &LastApplied,
        preflight: &crate::plan::preflight::Context,
        keep: bool,
        shared: bool,
    ) -> (Option<SectionInputs>, ClusterSection) {
        let mut entry = match self.kept {
            Some(kept) => kept,
            None => (
                keep.then(|| self.inputs.to_owned(shared)),
                section(self.name, self.cluster, &self.inputs, last_applied),
            ),
        };
        // Preflight findings (issue #22) depend on inputs outside the memo key (the time,
        // upstream clusters' job history): checked on every pass over the memoized base
        // section, whose final JSON is rebuilt only when the findings change.
        if entry.1.checked
            && let Some(obs) = self.inputs.observed
            && let Some(base) = entry.1.base()
        {
            let found = crate::plan::preflight::check(
                self.cluster,
                obs,
                &base,
                &preflight.for_cluster(self.cluster),
            );
            if found != entry.1.preflight {
                entry.1.finish(found);
            }
        }
        entry
    }
}

/// [`compute_with`], reusing the sections of `memo` whose inputs are unchanged and leaving
/// in it the sections of this plan.
pub fn compute_memo(
    desired: &Desired,
    observed: &Inventory,
    last_applied: &LastApplied,
    parent: Option<PlanId>,
    running: &BTreeMap<String, String>,
    preflight: &crate::plan::preflight::Context,
    memo: &mut PlanMemo,
) -> Result<Plan, Vec<Diagnostic>> {
    let mut diags = Vec::new();
    let mut clusters: BTreeMap<String, Arc<ClusterPlan>> = BTreeMap::new();
    let mut applies = Applies::default();
    let mut bar: u32 = 1;
    let mut catalogs = BTreeSet::new();

    // Each cluster's last-applied resources, in key order.
    let mut applied_of: BTreeMap<&str, Vec<&AppliedResource>> = BTreeMap::new();
    for res in last_applied.resources.values() {
        applied_of
            .entry(res.key.cluster_name())
            .or_default()
            .push(res);
    }
    let mut stats = MemoStats::default();
    let mut sections = BTreeMap::new();
    // The desired state the kept sections' shared inputs are in, and the one this call's
    // kept inputs will be in (when the caller shared it and it is the one planned).
    let previous = memo.desired.take();
    let previous_desired = previous.as_ref().and_then(|l| l.valid());
    let next = memo
        .next_desired
        .take()
        .filter(|l| memo.keep && l.valid().is_some_and(|d| std::ptr::eq(d, desired)));
    // 1. Which sections are reused (inputs unchanged) and which are planned afresh.
    let mut work = Vec::with_capacity(desired.clusters.len());
    for (name, cluster) in &desired.clusters {
        let inputs = InputsRef {
            cluster,
            observed: observed.clusters.get(name),
            running: running.get(name),
            applied: applied_of.remove(name.as_str()).unwrap_or_default(),
        };
        let kept = match memo.sections.remove(name) {
            Some((Some(old), sec))
                if inputs.matches(
                    &old,
                    previous_desired
                        .and_then(|d| d.clusters.get(name))
                        .map(|c| &**c),
                ) =>
            {
                stats.reused += 1;
                // Kept again: a copied Cluster stays a copy; a shared one moves to `next`
                // when there is one (it is equal, so it is in `next` under the same name).
                let old = match (old.cluster, &next) {
                    (KeptCluster::Shared, None) => SectionInputs {
                        cluster: KeptCluster::Copy(Box::new(Cluster::clone(cluster))),
                        ..old
                    },
                    (KeptCluster::Copy(_), Some(_)) => SectionInputs {
                        cluster: KeptCluster::Shared,
                        ..old
                    },
                    (kept, _) => SectionInputs {
                        cluster: kept,
                        ..old
                    },
                };
                Some((Some(old), sec))
            }
            _ => {
                stats.planned += 1;
                None
            }
        };
        work.push(Work {
            name,
            cluster,
            inputs,
            kept,
        });
    }
    // 2. Plan the changed sections and run every section's preflight checks (each is a
    //    pure function of its own inputs).
    let shared = next.is_some();
    let keep = memo.keep;
    let finish = |w: Work<'_>| w.finish(last_applied, preflight, keep, shared);
    let finished: Vec<(Option<SectionInputs>, ClusterSection)> = match memo.fan_out {
        Some((fan_out, lanes)) if lanes > 1 && stats.planned >= PARALLEL_FROM => {
            // Round-robin over the sections to plan, so every lane gets a share of the work;
            // results go back to their cluster's slot.
            let mut split: Vec<Vec<(usize, Work<'_>)>> = (0..lanes).map(|_| Vec::new()).collect();
            let mut next_lane = 0;
            for (i, w) in work.into_iter().enumerate() {
                let lane = if w.kept.is_none() {
                    next_lane = (next_lane + 1) % lanes;
                    next_lane
                } else {
                    i % lanes
                };
                split[lane].push((i, w));
            }
            type Done = (Option<SectionInputs>, ClusterSection);
            let slots: std::sync::Mutex<Vec<Option<Done>>> =
                std::sync::Mutex::new((0..desired.clusters.len()).map(|_| None).collect());
            let jobs: Vec<Box<dyn FnOnce() + Send + '_>> = split
                .into_iter()
                .map(|lane| {
                    let (finish, slots) = (&finish, &slots);
                    Box::new(move || {
                        let done: Vec<(usize, Done)> =
                            lane.into_iter().map(|(i, w)| (i, finish(w))).collect();
                        let mut slots = slots.lock().unwrap_or_else(|p| p.into_inner());
                        for (i, d) in done {
                            slots[i] = Some(d);
                        }
                    }) as Box<dyn FnOnce() + Send + '_>
                })
                .collect();
            fan_out(jobs);
            let slots = slots.into_inner().unwrap_or_else(|p| p.into_inner());
            #[allow(
                clippy::expect_used,
                reason = "a FanOut that returns with a job not run breaks its contract; a plan missing a section must never be stored"
            )]
            slots
                .into_iter()
                .map(|d| d.expect("a FanOut runs every job it is given before it returns"))
                .collect()
        }
        _ => work.into_iter().map(finish).collect(),
    };
    // 3. Merge, in cluster order.
    for ((name, _), mut entry) in desired.clusters.iter().zip(finished) {
        let sec = &mut entry.1;
        catalogs.insert(sec.catalog.clone());
        diags.extend(sec.diags.iter().cloned());
        bar = bar.max(sec.bar);
        applies.put.extend(sec.put.iter().cloned());
        applies.delete.extend(sec.delete.iter().cloned());
        // A one-off memo gives its sections away; a kept one keeps them (the next plan
        // reuses them) and shares them with the plan.
        let plan = if memo.keep {
            sec.plan.clone()
        } else {
            sec.plan.take()
        };
        if let Some(plan) = plan {
            clusters.insert(name.clone(), plan);
        }
        sections.insert(name.clone(), entry);
    }
    memo.sections = sections;
    memo.last = stats;
    memo.desired = next;
    drop(previous);

    // Clusters applied before and gone from the desired state.
    for gone in last_applied.cluster_names() {
        if desired.clusters.contains_key(&gone) {
            continue;
        }
        if let Some(job) = running.get(&gone) {
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
                preflight: Vec::new(), health: None,
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
            }),
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
    // The canonical JSON of each put resource, in the order of `applies.put` (both sorted by
    // the same stable sort).
    let mut put_json: Vec<(String, &[u8])> = memo
        .sections
        .values()
        .filter(|(_, sec)| !sec.plan_json.is_empty())
        .flat_map(|(_, sec)| {
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
        parent,
        basis: basis_with(desired, observed, last_applied, running),
        clusters: clusters.into_values().collect(),
        approvals_required: bar,
        catalog: catalogs.into_iter().collect::<Vec<_>>().join(","),
        applies,
    };
    if plan.catalog.is_empty() {
        plan.catalog = crate::plan::catalog::CATALOG_VERSION.to_string();
    }
    let cluster_json = |c: &ClusterPlan| -> Option<&[u8]> {
        memo.sections
            .get(&c.cluster)
            .map(|(_, sec)| sec.plan_json.as_slice())
            .filter(|_| desired.clusters.contains_key(&c.cluster))
    };
    plan.id = canonical_id_from_parts(&plan, cluster_json, &put_json);
    memo.last_id = memo.keep.then_some(plan.id);
    Ok(plan)
}

/// One desired cluster's section of the plan: a pure function of its [`SectionInputs`] (it
/// reads the last-applied state only through `inputs.applied`).
#[allow(
    clippy::expect_used,
    reason = "plain structs with string keys and no non-finite floats: serializing them to JSON cannot fail (as in Plan::canonical_id)"
)]
fn section(
    name: &String,
    cluster: &Cluster,
    inputs: &InputsRef<'_>,
    all_applied: &LastApplied,
) -> ClusterSection {
    let mut s = section_parts(name, cluster, inputs, all_applied);
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

fn section_parts(
    name: &String,
    cluster: &Cluster,
    inputs: &InputsRef<'_>,
    all_applied: &LastApplied,
) -> ClusterSection {
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
            preflight: Vec::new(),
            health: None,
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
        }));
        return out;
    };
    // Only this cluster's resources: the section depends on nothing else of the applied state.
    let own;
    let last_applied = if inputs.applied.len() == all_applied.resources.len() {
        all_applied
    } else {
        own = LastApplied {
            resources: inputs
                .applied
                .iter()
                .map(|r| (r.key.store_key(), (*r).clone()))
                .collect(),
        };
        &own
    };
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
        // Settings of a control-plane pool act on control-plane nodes: the control-plane bar.
        let cp_settings = plan.settings.iter().any(|s| {
            cluster.pools.values().any(|p| {
                p.role == Role::Controlplane
                    && s.resource == ResourceKey::pool(name, &p.name.value).label()
            })
        });
        let cp_steps = plan.steps.iter().any(Step::touches_control_plane);
        let scope = PlanScope {
            touches_control_plane_or_kubernetes: cp_settings || cp_steps,
        };
        if cp_settings && !cp_steps {
            // Said, so that the bar's reason (`render::bar_reason`) names the rule that set it.
            plan.notes.push(CP_SETTINGS_NOTE.to_string());
        }
        let mut needs = required_quorum(&in_force, change, scope);
        if change != BarChange::Keeps {
            plan.notes.push(format!(
                "this plan changes the approvals setting: it needs the highest bar in force, max(required {}, controlPlane {}), or the new bar if higher ({needs}); the new setting applies to later plans",
                in_force.required, in_force.control_plane
            ));
        }
        // Where health data and credentials go (issue #32): as a change of `approvals`.
        let moved: Vec<&str> = plan
            .settings
            .iter()
            .filter(|s| {
                s.resource == "cluster"
                    && (crate::plan::applied::SOURCE_FIELDS.contains(&s.field.as_str())
                        || (s.field == RESOURCE_FIELD
                            && !crate::plan::health::HealthSources::of(&cluster.health).is_empty()))
            })
            .map(|s| s.field.as_str())
            .collect();
        if !moved.is_empty() {
            needs = needs.max(in_force.highest());
            plan.notes.push(format!(
                "this plan changes where health data and credentials go ({}): it needs the highest bar in force, max(required {}, controlPlane {}) ({needs})",
                if moved.contains(&RESOURCE_FIELD) {
                    "the new cluster's health sources".to_string()
                } else {
                    moved.join(", ")
                },
                in_force.required,
                in_force.control_plane
            ));
        }
        out.bar = out.bar.max(needs);
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
/// The note of a plan whose control-plane bar comes from settings of a control-plane pool
/// (no control-plane step).
pub const CP_SETTINGS_NOTE: &str = "settings of a control-plane pool act on control-plane nodes: the control-plane approval bar applies";

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

/// Notes for a resource that loses all its health gates or its promotion (issue #32): a
/// quiet line in a settings list is easy to miss.
fn removal_notes(notes: &mut Vec<String>, old: &AppliedResource, new: &AppliedResource) {
    use crate::plan::applied::Settings;
    let gates = |s: &Settings| match s {
        Settings::Cluster(c) => c.health.gates.len(),
        Settings::Pool(p) => p.health.gates.len(),
    };
    if gates(&old.settings) > 0 && gates(&new.settings) == 0 {
        notes.push(format!(
            "this plan removes every health gate of the {}: its rollouts will no longer wait for any gate",
            new.key.label()
        ));
    }
    if let (Settings::Cluster(o), Settings::Cluster(n)) = (&old.settings, &new.settings)
        && let (Some(p), None) = (&o.promotion, &n.promotion)
    {
        notes.push(format!(
            "this plan removes the promotion after cluster {}: versions no longer wait for it to run them first",
            p.after
        ));
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
        let mut notes = self.notes(&members, &steps);
        notes.extend(notes_extra);
        // Gates run around a job: a cluster with nothing to roll carries none.
        let health = (!steps.is_empty())
            .then(|| HealthPolicy::of(&self.cluster.health))
            .flatten();
        Some(ClusterPlan {
            preflight: Vec::new(),
            health,
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
