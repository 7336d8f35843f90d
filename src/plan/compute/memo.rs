//! The planner's section memo: each desired cluster's plan section is kept with the inputs it
//! was planned from and reused while they are unchanged. The rules that plan a section are in
//! the parent module ([`super::section`]); this module only decides when they run again.
//!
//! One struct, [`Inputs`], is both what a section receives ([`SectionInputs`], borrowed from
//! the planning call; `section` is given nothing else) and the memo's key ([`SectionKey`],
//! kept): a section cannot read an input the key lacks. A field added to [`Inputs`] has to be
//! kept and compared here (the destructurings below name every field), and the test
//! `every_input_is_in_the_key` perturbs each field and checks that the key no longer matches.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::{PlanInputs, section};
use crate::desired::Diagnostic;
use crate::desired::model::Cluster;
use crate::inventory::ObservedCluster;
use crate::plan::applied::{AppliedResource, ResourceKey};
use crate::plan::id::PlanId;
use crate::plan::model::*;

/// Every input of one desired cluster's plan section, in the form `N`, `C`, `O`, `R`, `A` holds
/// them: borrowed for the section ([`SectionInputs`]) or kept by the memo ([`SectionKey`]).
/// A planner change that makes a section read something more (another cluster's job history,
/// a new observation) adds it here as a field, and so to the key.
#[derive(Debug, Clone)]
pub(super) struct Inputs<N, C, O, R, A> {
    /// The cluster's name (its key in the desired state).
    pub(super) name: N,
    /// The validated Cluster and its pools (every field, source positions included).
    pub(super) cluster: C,
    /// The observed cluster record (compared whole, not only by generation).
    pub(super) observed: O,
    /// The running rollout job, if any.
    pub(super) running: R,
    /// The cluster's last-applied resources in key order (the cluster and its pools, gone
    /// ones included).
    pub(super) applied: A,
}

/// What a section receives: its inputs, borrowed from the planning call.
pub(super) type SectionInputs<'a> = Inputs<
    &'a String,
    &'a Cluster,
    Option<&'a Arc<ObservedCluster>>,
    Option<&'a String>,
    Vec<&'a AppliedResource>,
>;

/// A memoized section's inputs, kept. Nothing is copied that the memo can share: the observed
/// record is the inventory's own (`Arc`), and the desired `Cluster` stays in the desired state
/// the memo holds ([`PlanMemo::share_desired`]). Equal pointers are equal inputs; otherwise
/// the values are compared whole, so a match is always exact.
pub(super) type SectionKey =
    Inputs<String, KeptCluster, Option<Arc<ObservedCluster>>, Option<String>, Vec<AppliedResource>>;

/// Where a memoized section's desired `Cluster` is kept.
#[derive(Debug, Clone)]
pub(super) enum KeptCluster {
    /// In the desired state the memo holds ([`PlanMemo::desired`]), under the section's name.
    Shared,
    /// A copy: the planning call shared no desired state with the memo.
    Copy(Box<Cluster>),
}

impl SectionInputs<'_> {
    /// Whether `key` holds these inputs. `shared` is the memo's desired state's Cluster of
    /// this name, for a key kept as [`KeptCluster::Shared`].
    pub(super) fn is_kept_in(&self, key: &SectionKey, shared: Option<&Cluster>) -> bool {
        let Inputs {
            name,
            cluster,
            observed,
            running,
            applied,
        } = self;
        let same_cluster = match &key.cluster {
            KeptCluster::Copy(c) => **c == **cluster,
            KeptCluster::Shared => {
                shared.is_some_and(|c| std::ptr::eq(c, *cluster) || c == *cluster)
            }
        };
        let same_observed = match (observed, &key.observed) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || *a == b,
            _ => false,
        };
        **name == key.name
            && same_cluster
            && same_observed
            && *running == key.running.as_ref()
            && applied.len() == key.applied.len()
            && applied.iter().zip(&key.applied).all(|(a, b)| *a == b)
    }

    /// The key to keep; `shared`: the Cluster is in the desired state the memo keeps.
    pub(super) fn key(&self, shared: bool) -> SectionKey {
        // a struct literal names every field: an input added to `Inputs` is kept here
        Inputs {
            name: self.name.clone(),
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
pub(super) struct ClusterSection {
    pub(super) catalog: String,
    /// `None` when the cluster cannot be planned (`diags` says why). Shared with the plans
    /// that carry it (`Plan::clusters`): a reused section is never copied.
    pub(super) plan: Option<Arc<ClusterPlan>>,
    pub(super) diags: Vec<Diagnostic>,
    /// The approvals this cluster's changes need (1 when none).
    pub(super) bar: u32,
    pub(super) put: Vec<AppliedResource>,
    pub(super) delete: Vec<ResourceKey>,
    /// The canonical JSON of `plan` and of each of `put`, as the plan id hashes them
    /// ([`Plan::canonical_id`]), computed once per section.
    pub(super) plan_json: Vec<u8>,
    pub(super) put_json: Vec<Vec<u8>>,
    /// The preflight checks apply to this section's base ([`Self::base`]).
    pub(super) checked: bool,
    /// The findings and acknowledgement notes `plan` carries: `plan` is its base (the
    /// section before the preflight checks) with `preflight` set to the findings and the
    /// notes appended. The base is not kept (it would be a second copy of every section):
    /// it is `plan` with both undone.
    pub(super) preflight: (
        Vec<crate::plan::preflight::Finding>,
        Vec<crate::plan::note::Note>,
    ),
}

impl ClusterSection {
    /// Make `plan` the base section with these findings and notes, and its JSON.
    #[allow(
        clippy::expect_used,
        reason = "plain structs with string keys and no non-finite floats: serializing them to JSON cannot fail (as in Plan::canonical_id)"
    )]
    fn finish(
        &mut self,
        found: (
            Vec<crate::plan::preflight::Finding>,
            Vec<crate::plan::note::Note>,
        ),
    ) {
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

/// Per-cluster plan sections of earlier plans, reused while their inputs are unchanged
/// ([`SectionKey`]).
/// A plan computed with a memo is the plan computed without one ([`super::compute_memo`] with [`PlanMemo::one_off`]), byte for
/// byte: a section is a pure function of its inputs, and the whole-plan parts (the basis,
/// removed clusters, the bar, the id) are computed afresh every time.
#[derive(Debug)]
pub struct PlanMemo {
    /// Each section with its inputs (`None` in a one-off memo, which reuses nothing).
    sections: BTreeMap<String, (Option<SectionKey>, ClusterSection)>,
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
    /// What the last planning call reused and planned again.
    pub fn last_stats(&self) -> MemoStats {
        self.last
    }
    /// A memo for one plan only (what [`super::compute`] uses): nothing is kept, so nothing is
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
        use super::erased::Json as _;
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
        if !plan.estimates.is_empty() {
            out.extend_from_slice(br#","estimates":"#);
            out.extend(serde_json::to_vec(&plan.estimates).expect("estimates serialize"));
        }
        out.push(b'}');
        out
    }
}

/// What the memo gives a planning call: the plan of each desired cluster, in cluster order
/// (`None`: it cannot be planned; its diagnostics say why). The sections themselves stay in
/// the memo ([`PlanMemo::sections`]).
pub(super) type Planned = Vec<(String, Option<Arc<ClusterPlan>>)>;

impl PlanMemo {
    /// Every desired cluster's section for `inputs`: the memo's where its inputs are
    /// unchanged, planned afresh ([`section`]) otherwise, each checked by the preflight
    /// checks; the memo then holds this call's sections (and [`MemoStats`] what it did).
    pub(super) fn plan_sections(&mut self, inputs: &PlanInputs<'_>) -> Planned {
        let desired = inputs.desired;
        let mut stats = MemoStats::default();
        // The desired state the kept sections' shared inputs are in, and the one this call's
        // kept inputs will be in (when the caller shared it and it is the one planned).
        let previous = self.desired.take();
        let previous_desired = previous.as_ref().and_then(|l| l.valid());
        let next = self
            .next_desired
            .take()
            .filter(|l| self.keep && l.valid().is_some_and(|d| std::ptr::eq(d, desired)));
        // 1. Which sections are reused (inputs unchanged) and which are planned afresh.
        let mut applied_of = applied_by_cluster(inputs);
        let mut work = Vec::with_capacity(desired.clusters.len());
        for (name, cluster) in &desired.clusters {
            let cluster: &Cluster = cluster;
            let section_inputs = Inputs {
                name,
                cluster,
                observed: inputs.observed.clusters.get(name),
                running: inputs.running.get(name),
                applied: applied_of.remove(name.as_str()).unwrap_or_default(),
            };
            let shared = previous_desired
                .and_then(|d| d.clusters.get(name))
                .map(|c| &**c);
            let kept = match self.sections.remove(name) {
                Some((Some(old), sec)) if section_inputs.is_kept_in(&old, shared) => {
                    stats.reused += 1;
                    Some((Some(rekeep(old, cluster, next.is_some())), sec))
                }
                _ => {
                    stats.planned += 1;
                    None
                }
            };
            work.push(Work {
                inputs: section_inputs,
                kept,
            });
        }
        // 2. Plan the changed sections and run every section's preflight checks (each is a
        //    pure function of its own inputs).
        let (keep, shared) = (self.keep, next.is_some());
        let finish = |w: Work<'_>| w.finish(inputs.preflight, keep, shared);
        let finished = match self.fan_out {
            Some((fan_out, lanes)) if lanes > 1 && stats.planned >= PARALLEL_FROM => {
                in_lanes(work, &finish, fan_out, lanes)
            }
            _ => work.into_iter().map(finish).collect(),
        };
        // 3. Keep them, in cluster order. A one-off memo gives its sections' plans away; a
        //    kept one keeps them (the next plan reuses them) and shares them with the plan.
        let mut planned = Vec::with_capacity(finished.len());
        let mut sections = BTreeMap::new();
        for (name, mut entry) in desired.clusters.keys().zip(finished) {
            let plan = if self.keep {
                entry.1.plan.clone()
            } else {
                entry.1.plan.take()
            };
            planned.push((name.clone(), plan));
            sections.insert(name.clone(), entry);
        }
        self.sections = sections;
        self.last = stats;
        self.desired = next;
        drop(previous);
        planned
    }

    /// The plan with id `id` was computed from this call's sections ([`Self::plan_json`]).
    pub(super) fn computed(&mut self, id: PlanId) {
        self.last_id = self.keep.then_some(id);
    }

    /// This call's sections, by cluster name.
    pub(super) fn sections(&self) -> impl Iterator<Item = &ClusterSection> {
        self.sections.values().map(|(_, sec)| sec)
    }

    /// The kept section of cluster `name`.
    pub(super) fn section(&self, name: &str) -> Option<&ClusterSection> {
        self.sections.get(name).map(|(_, sec)| sec)
    }
}

/// Each cluster's last-applied resources, in key order.
fn applied_by_cluster<'a>(inputs: &PlanInputs<'a>) -> BTreeMap<&'a str, Vec<&'a AppliedResource>> {
    let mut applied_of: BTreeMap<&str, Vec<&AppliedResource>> = BTreeMap::new();
    for res in inputs.last_applied.resources.values() {
        applied_of
            .entry(res.key.cluster_name())
            .or_default()
            .push(res);
    }
    applied_of
}

/// A reused section's key, kept again: a copied Cluster stays a copy; a shared one moves to
/// the desired state this call shares (`shared`) when there is one (it is equal, so it is
/// there under the same name).
fn rekeep(old: SectionKey, cluster: &Cluster, shared: bool) -> SectionKey {
    match (old.cluster, shared) {
        (KeptCluster::Shared, false) => SectionKey {
            cluster: KeptCluster::Copy(Box::new(Cluster::clone(cluster))),
            ..old
        },
        (KeptCluster::Copy(_), true) => SectionKey {
            cluster: KeptCluster::Shared,
            ..old
        },
        (kept, _) => SectionKey {
            cluster: kept,
            ..old
        },
    }
}

type Done = (Option<SectionKey>, ClusterSection);

/// `finish` every work in `lanes` lanes run by `fan_out`, the results in the order of `work`.
/// Round-robin over the sections to plan, so every lane gets a share of the work.
fn in_lanes<'a>(
    work: Vec<Work<'a>>,
    finish: &(dyn Fn(Work<'a>) -> Done + Sync),
    fan_out: FanOut,
    lanes: usize,
) -> Vec<Done> {
    let count = work.len();
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
    let slots: std::sync::Mutex<Vec<Option<Done>>> =
        std::sync::Mutex::new((0..count).map(|_| None).collect());
    let jobs: Vec<Box<dyn FnOnce() + Send + '_>> = split
        .into_iter()
        .map(|lane| {
            let slots = &slots;
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

/// One desired cluster of a planning call: its inputs and, when they are unchanged, its
/// memoized section.
struct Work<'a> {
    inputs: SectionInputs<'a>,
    kept: Option<Done>,
}

impl Work<'_> {
    /// The section (the kept one, or planned afresh) with its preflight findings, and the
    /// key to keep for it (`keep`: the memo keeps sections; `shared`: the memo keeps the
    /// desired state this call plans).
    fn finish(self, preflight: &crate::plan::preflight::Context, keep: bool, shared: bool) -> Done {
        let mut entry = match self.kept {
            Some(kept) => kept,
            None => (keep.then(|| self.inputs.key(shared)), section(&self.inputs)),
        };
        // Preflight findings (issue #22) depend on inputs outside the memo key (the time,
        // upstream clusters' job history): checked on every pass over the memoized base
        // section, whose final JSON is rebuilt only when the findings change.
        if entry.1.checked
            && let Some(obs) = self.inputs.observed
            && let Some(base) = entry.1.base()
        {
            let cluster = self.inputs.cluster;
            let found =
                crate::plan::preflight::check(cluster, obs, &base, &preflight.for_cluster(cluster));
            if found != entry.1.preflight {
                entry.1.finish(found);
            }
        }
        entry
    }
}
