//! Replanning: desired state + the store's observations, applied settings and running jobs →
//! the current plan, stored.
//!
//! The one planning path of the daemon (`server::reconcile`) and of offline `medea plan`; the
//! loaders here are the only place plans, the last-applied state and the running-job markers
//! are read for planning. The planning itself is [`crate::plan::compute_memo`] (pure); this
//! module does the store I/O around it.

use std::collections::BTreeMap;

use crate::desired::Desired;
use crate::inventory::Inventory;
use crate::plan::stored::{CURRENT_KEY, CurrentPlan, plan_key};
use crate::plan::{AppliedResource, Basis, LastApplied, Plan, PlanId, PlanInputs};
use crate::store::{Store, StoreError, StoreExt};

pub fn load_plan(store: &dyn Store, id: &PlanId) -> Result<Option<Plan>, StoreError> {
    store.get_record(&plan_key(id))
}

/// The `parent` of the stored plan `id`, reading only that field of the record (the rest is
/// skipped, not decoded: a plan of 10,000 machines is megabytes of JSON).
pub fn load_parent(store: &dyn Store, id: &PlanId) -> Result<Option<Option<PlanId>>, StoreError> {
    #[derive(serde::Deserialize)]
    struct ParentView {
        #[serde(default)]
        parent: Option<PlanId>,
    }
    let key = plan_key(id);
    match store.get(<Plan as crate::store::Record>::TABLE, &key)? {
        Some(bytes) => {
            crate::store::record::decode_view_or::<Plan, ParentView>(&key, &bytes, |p| ParentView {
                parent: p.parent,
            })
            .map(|v| Some(v.parent))
        }
        None => Ok(None),
    }
}

pub fn current(store: &dyn Store) -> Result<Option<CurrentPlan>, StoreError> {
    store.get_record(CURRENT_KEY)
}

/// Every stored plan, in key order.
pub fn all_plans(store: &dyn Store) -> Result<Vec<Plan>, StoreError> {
    Ok(store
        .scan_records::<Plan>("plan/")?
        .into_iter()
        .map(|(_, p)| p)
        .collect())
}

/// The ids of every stored plan, in key order, from a key-only scan (`plan/<hex>`): no plan
/// is read (a plan of 10,000 machines is megabytes of JSON). Superseded plans beyond
/// [`crate::plan::stored::PLAN_WINDOW`] are collected when a new plan is stored.
pub fn plan_ids(store: &dyn Store) -> Result<Vec<PlanId>, StoreError> {
    Ok(store
        .scan_keys(crate::store::Table::Plans, "plan/")?
        .into_iter()
        .filter_map(|k| {
            k.strip_prefix("plan/")
                .and_then(|hex| PlanId::parse_full(hex).ok())
        })
        .collect())
}

/// The last-applied desired state (table `Desired`): what approved plans put there.
pub fn load_applied(store: &dyn Store) -> Result<LastApplied, StoreError> {
    let mut rs = store.scan_records::<AppliedResource>("cluster/")?;
    rs.extend(store.scan_records::<AppliedResource>("pool/")?);
    Ok(LastApplied {
        resources: rs.into_iter().collect(),
    })
}

/// The basis a plan computed now would have: what approval compares a plan's basis with.
pub fn current_basis(store: &dyn Store, desired: &Desired) -> Result<Basis, StoreError> {
    PassReads::load(store)?.basis(store, desired)
}

/// What a reconcile pass reads from the store once (issue #34) to plan and to judge its plan's
/// basis: the last-applied state, the running jobs (the `Jobs/active/<cluster>` markers) and
/// every job (the halted ones, the promotion evidence). [`replan_cached`] plans from it and
/// hands it back in [`Replanned::reads`]; the pass starts a quorum's jobs from it
/// (`ops::approvals::start_txn`), and the start transaction's store conditions — not a second
/// read — make sure it still holds when the jobs are created.
#[derive(Debug, Clone, Default)]
pub struct PassReads {
    pub applied: LastApplied,
    /// cluster → its running job's id.
    pub running: BTreeMap<String, String>,
    /// Every job, replayed to its current state.
    pub jobs: Vec<crate::rollout::Job>,
}

impl PassReads {
    /// Read the last-applied state, the running-job markers and every job.
    pub fn load(store: &dyn Store) -> Result<PassReads, StoreError> {
        Ok(PassReads {
            applied: load_applied(store)?,
            running: running_jobs(store)?,
            jobs: crate::ops::jobs::load_jobs(store)?,
        })
    }

    /// The newest job of each cluster of `desired`, where it halted ([`halted_jobs`]).
    pub fn halted(&self, desired: &Desired) -> BTreeMap<String, String> {
        halted_of(&self.jobs, desired)
    }

    /// The basis a plan computed now from these reads would have, with the store's observed
    /// generations.
    pub fn basis(&self, store: &dyn Store, desired: &Desired) -> Result<Basis, StoreError> {
        let generations = crate::inventory::generations(store)?;
        let mut basis = crate::plan::basis_from_generations(
            desired,
            |name| generations.get(name).copied(),
            &self.applied,
            &self.running,
        );
        basis.halted = self.halted(desired);
        Ok(basis)
    }

    /// The store conditions under which what starting `plan` writes to the last-applied
    /// state (`plan::stored::approval_writes`) still lands on the state this pass read: each
    /// resource it puts or deletes holds the bytes read (or is still absent). With the current-plan pointer, the consumed marker and the
    /// job creation's own checks (each cluster's observed record as read, no running job),
    /// they make the start transaction fail with a conflict, writing nothing, when its basis
    /// moved since the pass read it.
    pub fn start_checks(&self, plan: &Plan) -> Vec<crate::store::Check> {
        use crate::store::{Check, Op, Table, record::encode};
        crate::plan::stored::approval_writes(plan)
            .into_iter()
            .filter_map(|op| match op {
                Op::Put(Table::Desired, key, _) | Op::Delete(Table::Desired, key) => Some(key),
                _ => None,
            })
            .map(|key| match self.applied.resources.get(&key) {
                Some(r) => Check::Equals(Table::Desired, key, encode(r)),
                None => Check::Absent(Table::Desired, key),
            })
            .collect()
    }
}

/// The newest job of each cluster of `desired`, where it halted (cluster → job id): what a
/// plan made now continues from ([`crate::plan::compute::after_halts`]).
pub fn halted_jobs(
    store: &dyn Store,
    desired: &Desired,
) -> Result<BTreeMap<String, String>, StoreError> {
    Ok(halted_of(&crate::ops::jobs::load_jobs(store)?, desired))
}

/// [`halted_jobs`] of jobs already read.
fn halted_of(jobs: &[crate::rollout::Job], desired: &Desired) -> BTreeMap<String, String> {
    let mut newest: BTreeMap<String, &crate::rollout::Job> = BTreeMap::new();
    for job in jobs {
        if !desired.clusters.contains_key(&job.cluster) {
            continue;
        }
        match newest.get(&job.cluster) {
            Some(n) if (n.created_at, &n.id) >= (job.created_at, &job.id) => {}
            _ => {
                newest.insert(job.cluster.clone(), job);
            }
        }
    }
    newest
        .into_iter()
        .filter(|(_, j)| matches!(j.state, crate::rollout::JobState::Halted { .. }))
        .map(|(c, j)| (c, j.id.to_string()))
        .collect()
}

/// The running rollout job of each cluster that has one (cluster → job id), from the
/// `Jobs/active/<cluster>` markers.
pub fn running_jobs(store: &dyn Store) -> Result<BTreeMap<String, String>, StoreError> {
    use crate::rollout::journal::ActiveJob;
    Ok(store
        .scan_records::<ActiveJob>("active/")?
        .into_iter()
        .filter_map(|(k, a)| {
            k.strip_prefix("active/")
                .map(|c| (c.to_string(), a.job.to_string()))
        })
        .collect())
}

/// What every successful rollout job of each cluster proved (`spec.promotion`'s evidence):
/// the Talos and Kubernetes versions its steps brought, and the end of the first such job.
pub fn promotion_evidence(
    store: &dyn Store,
    desired: &Desired,
) -> Result<BTreeMap<String, crate::plan::preflight::PromotionEvidence>, StoreError> {
    if !desired.clusters.values().any(|c| c.promotion.is_some()) {
        return Ok(BTreeMap::new());
    }
    Ok(promotion_evidence_of(
        &crate::ops::jobs::load_jobs(store)?,
        desired,
    ))
}

/// [`promotion_evidence`] of jobs already read.
fn promotion_evidence_of(
    jobs: &[crate::rollout::Job],
    desired: &Desired,
) -> BTreeMap<String, crate::plan::preflight::PromotionEvidence> {
    use crate::plan::preflight::PromotionEvidence;
    use crate::rollout::JobState;
    use crate::rollout::sequencer::StepKind;
    let upstream: std::collections::BTreeSet<&str> = desired
        .clusters
        .values()
        .filter_map(|c| c.promotion.as_ref().map(|p| p.after.value.as_str()))
        .collect();
    let mut out = BTreeMap::new();
    if upstream.is_empty() {
        return out;
    }
    for job in jobs {
        if !upstream.contains(job.cluster.as_str()) {
            continue;
        }
        let JobState::Succeeded { at } = &job.state else {
            continue;
        };
        let mut talos = Vec::new();
        let mut kube = Vec::new();
        for s in &job.steps {
            match &s.kind {
                StepKind::Talos(t) => talos.push(t.rollout.to.clone()),
                StepKind::Kubernetes(k) => kube.push(k.rollout.to.clone()),
            }
        }
        out.entry(job.cluster.clone())
            .or_insert_with(|| PromotionEvidence::new(job.cluster.clone()))
            .record(*at, &talos, &kube);
    }
    out
}

/// The preflight checks' inputs for planning `desired` now.
pub fn preflight_context(
    store: &dyn Store,
    desired: &Desired,
    now: jiff::Timestamp,
) -> Result<crate::plan::preflight::Context, StoreError> {
    Ok(crate::plan::preflight::Context {
        now: Some(now),
        promotion: promotion_evidence(store, desired)?,
    })
}

/// What [`replan`] did.
#[derive(Debug, Clone)]
pub struct Replanned {
    pub plan: Plan,
    /// `true` when the plan is new and became current; `false` when it already was current.
    pub stored: bool,
    /// What the plan was computed from: its basis is these reads' (and the inventory's), so
    /// the caller judges and starts it without reading them again.
    pub reads: PassReads,
    /// The inventory the plan was computed from (the start transaction's gates and checks).
    pub inventory: Inventory,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplanError {
    #[error("the desired state cannot be planned")]
    Refused(Vec<crate::desired::Diagnostic>),
    #[error("store error while planning")]
    Store(#[from] StoreError),
}

/// Compute the plan for `desired` against the store's inventory and applied state, and make
/// it current unless it already is. The one planning path of the daemon and `medea plan`.
pub fn replan(store: &dyn Store, desired: &Desired) -> Result<Replanned, ReplanError> {
    replan_at(store, desired, jiff::Timestamp::now())
}

/// [`replan`] at time `now` (the preflight checks' clock).
pub fn replan_at(
    store: &dyn Store,
    desired: &Desired,
    now: jiff::Timestamp,
) -> Result<Replanned, ReplanError> {
    replan_cached(store, desired, now, &mut ReplanCache::default())
}

/// The inventory kept decoded between planning passes: each cluster record is decoded again
/// only when its stored bytes changed (a new observation moves the generation and so the
/// bytes; the `rolloutsEnabled` gate changes the bytes alone).
#[derive(Debug, Default)]
pub struct InventoryCache {
    /// Store key → sha256 of the record's bytes (a digest nobody can make collide, so equal
    /// digests are equal bytes) and the cluster's name in `inventory`.
    records: BTreeMap<String, ([u8; 32], String)>,
    inventory: Inventory,
    /// Records decoded by the last [`InventoryCache::load`].
    pub decoded: usize,
}

impl InventoryCache {
    /// The store's inventory, decoding only the records whose bytes changed since the last
    /// call. Equal to [`Inventory::load`].
    pub fn load(&mut self, store: &dyn Store) -> Result<&Inventory, StoreError> {
        use sha2::{Digest, Sha256};
        let rows = store.scan(
            <crate::inventory::ObservedCluster as crate::store::record::Record>::TABLE,
            "cluster/",
        )?;
        let mut records = BTreeMap::new();
        let mut clusters = std::mem::take(&mut self.inventory.clusters);
        let mut fresh = BTreeMap::new();
        self.decoded = 0;
        for (key, bytes) in rows {
            let digest: [u8; 32] = Sha256::digest(&bytes).into();
            let kept = match self.records.remove(&key) {
                Some((d, name)) if d == digest => clusters.remove(&name).map(|c| (name, c)),
                _ => None,
            };
            let (name, cluster) = match kept {
                Some(k) => k,
                None => {
                    self.decoded += 1;
                    let c: crate::inventory::ObservedCluster =
                        crate::store::record::decode(&key, &bytes)?;
                    (c.name.clone(), std::sync::Arc::new(c))
                }
            };
            records.insert(key, (digest, name.clone()));
            fresh.insert(name, cluster);
        }
        self.records = records;
        self.inventory.clusters = fresh;
        Ok(&self.inventory)
    }
}

/// What the daemon keeps between planning passes: the decoded inventory and each cluster's
/// plan section ([`crate::plan::compute::PlanMemo`]). Planning with it gives the plan
/// planning without it gives, byte for byte.
#[derive(Debug)]
pub struct ReplanCache {
    pub inventory: InventoryCache,
    pub memo: crate::plan::compute::PlanMemo,
    /// Samples of finished jobs for the duration estimate (issue #36): each journal read once.
    pub samples: crate::ops::estimate::SamplesCache,
}

impl Default for ReplanCache {
    /// A memo that plans many changed sections (the first plan, a catalog change) on every
    /// core ([`super::fan_out`]).
    fn default() -> ReplanCache {
        ReplanCache {
            inventory: InventoryCache::default(),
            memo: crate::plan::compute::PlanMemo::default().fan_out(super::fan_out, super::lanes()),
            samples: Default::default(),
        }
    }
}

/// [`replan`] reusing `cache`.
pub fn replan_cached(
    store: &dyn Store,
    desired: &Desired,
    now: jiff::Timestamp,
    cache: &mut ReplanCache,
) -> Result<Replanned, ReplanError> {
    let reads = PassReads::load(store)?;
    let ctx = crate::plan::preflight::Context {
        now: Some(now),
        promotion: promotion_evidence_of(&reads.jobs, desired),
    };
    let previous = current(store)?;
    let halted = reads.halted(desired);
    let inventory = cache.inventory.load(store)?.clone();
    let inputs = PlanInputs {
        parent: previous.map(|p| p.id),
        running: &reads.running,
        preflight: &ctx,
        ..PlanInputs::new(desired, &inventory, &reads.applied)
    };
    let plan = crate::plan::compute_memo(&inputs, &mut cache.memo).map_err(ReplanError::Refused)?;
    let mut plan = crate::plan::compute::after_halts(plan, &halted);
    plan.estimates = crate::ops::estimate::estimates_cached(
        store,
        &reads.jobs,
        desired,
        &plan,
        now,
        &mut cache.samples,
    )?;
    if let Some(p) = previous
        && p.id == plan.id
        && let Some(parent) = load_parent(store, &plan.id)?
    {
        // Same inputs as the current plan: it is the current plan (only its parent is
        // read back; everything else is what was just computed, byte for byte).
        plan.parent = parent;
        return Ok(Replanned {
            plan,
            stored: false,
            reads,
            inventory,
        });
    }
    if plan.parent == Some(plan.id) {
        plan.parent = None; // a pointer to a plan record that is gone
    }
    let json = cache.memo.plan_json(&plan);
    let mut txn = crate::plan::stored::save_txn_json(&plan, &json, previous.as_ref());
    // Superseded plans are collected with the save (keys only are read; the same checks
    // guard both, so a concurrent planner makes both fail).
    let recent = store.scan_keys(
        crate::store::Table::Plans,
        crate::plan::stored::RECENT_PREFIX,
    )?;
    let stored_ids = plan_ids(store)?;
    let mut live: std::collections::BTreeSet<PlanId> = stored_ids.iter().copied().collect();
    live.insert(plan.id);
    for op in crate::plan::stored::collect_ops(
        &plan.id,
        previous.as_ref().map(|p| &p.id),
        &stored_ids,
        &recent,
    ) {
        if let crate::store::Op::Delete(crate::store::Table::Plans, key) = &op
            && let Some(id) = key
                .strip_prefix("plan/")
                .and_then(|hex| PlanId::parse_full(hex).ok())
        {
            live.remove(&id);
        }
        txn.push(op);
    }
    // Rehearsal reports of plans no longer stored go with them (design/rehearsal.md).
    let budget = crate::ops::rehearse::MAX_SAVE_OPS.saturating_sub(txn.ops.len());
    for op in crate::ops::rehearse::orphan_deletes(
        &crate::ops::rehearse::report_keys(store)?,
        &live,
        budget,
    ) {
        txn.push(op);
    }
    store.commit(txn)?;
    Ok(Replanned {
        plan,
        stored: true,
        reads,
        inventory,
    })
}

/// The plan `desired` would make now against the store's observations, applied settings,
/// running and halted jobs and current plan (its parent), as [`replan`] computes it — never
/// stored. What `PreviewPlan` answers: a preview of an edit the daemon does not plan (a work
/// tree in git mode), without taking the store from the daemon.
pub fn preview(store: &dyn Store, desired: &Desired) -> Result<Plan, ReplanError> {
    let now = jiff::Timestamp::now();
    let ctx = preflight_context(store, desired, now)?;
    let applied = load_applied(store)?;
    let running = running_jobs(store)?;
    let previous = current(store)?;
    let halted = halted_jobs(store, desired)?;
    let inventory = Inventory::load(store)?;
    let inputs = PlanInputs {
        parent: previous.map(|p| p.id),
        running: &running,
        preflight: &ctx,
        ..PlanInputs::new(desired, &inventory, &applied)
    };
    let plan = crate::plan::compute_memo(&inputs, &mut super::cold_plan_memo())
        .map_err(ReplanError::Refused)?;
    let mut plan = crate::plan::compute::after_halts(plan, &halted);
    let jobs = crate::ops::jobs::load_jobs(store)?;
    plan.estimates = crate::ops::estimate::estimates(store, &jobs, desired, &plan, now)?;
    Ok(plan)
}

/// What [`rehearse`] did with a plan against an inventory given by the caller.
#[derive(Debug, Clone)]
pub enum Rehearsed {
    /// No store: planned with no applied settings, no running jobs, no parent; not stored.
    NoStore(Plan),
    /// The inventory given is not the store's: this plan could never be approved, so it is
    /// not stored.
    Differs(Plan),
    /// The inventory given is the store's: planned and stored as [`replan`] does.
    Replanned(Replanned),
}

/// Plan against `inventory` (a file, not the store's observations) the way the daemon would:
/// with the store's applied settings, running jobs and current plan when there is a store.
/// Stored only when its basis is the store's own, through [`replan`].
pub fn rehearse(
    store: Option<&dyn Store>,
    desired: &Desired,
    inventory: &Inventory,
) -> Result<Rehearsed, ReplanError> {
    let now = jiff::Timestamp::now();
    let (applied, running, halted, previous, ctx) = match store {
        Some(s) => (
            load_applied(s)?,
            running_jobs(s)?,
            halted_jobs(s, desired)?,
            current(s)?,
            preflight_context(s, desired, now)?,
        ),
        None => (
            LastApplied::default(),
            BTreeMap::new(),
            BTreeMap::new(),
            None,
            crate::plan::preflight::Context {
                now: Some(now),
                ..Default::default()
            },
        ),
    };
    let inputs = PlanInputs {
        parent: previous.map(|p| p.id),
        running: &running,
        preflight: &ctx,
        ..PlanInputs::new(desired, inventory, &applied)
    };
    let plan = crate::plan::compute_memo(&inputs, &mut super::cold_plan_memo())
        .map_err(ReplanError::Refused)?;
    let mut plan = crate::plan::compute::after_halts(plan, &halted);
    plan.estimates = match store {
        Some(s) => {
            let jobs = crate::ops::jobs::load_jobs(s)?;
            crate::ops::estimate::estimates(s, &jobs, desired, &plan, now)?
        }
        None => crate::ops::estimate::estimates(
            &crate::store::mem::MemStore::new(),
            &[],
            desired,
            &plan,
            now,
        )?,
    };
    match store {
        None => Ok(Rehearsed::NoStore(plan)),
        Some(s) if plan.is_stale(&current_basis(s, desired)?) => Ok(Rehearsed::Differs(plan)),
        Some(s) => replan_at(s, desired, now).map(Rehearsed::Replanned),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_inventory_cache_decodes_only_changed_records_and_equals_a_full_load() {
        use crate::bench::fleet::{FleetSpec, generate};
        use crate::inventory::{Inventory, cluster_key};
        use crate::store::{Store, Table, Txn};
        let store = crate::store::mem::MemStore::new();
        let fleet = generate(FleetSpec {
            clusters: 3,
            machines_per_cluster: 5,
            seed: 1,
        });
        store.commit(fleet.inventory.save_txn()).unwrap();
        let mut cache = super::InventoryCache::default();
        assert_eq!(
            cache.load(&store).unwrap(),
            &Inventory::load(&store).unwrap()
        );
        assert_eq!(cache.decoded, 3);
        assert_eq!(
            cache.load(&store).unwrap(),
            &Inventory::load(&store).unwrap()
        );
        assert_eq!(cache.decoded, 0, "nothing changed, nothing decoded");
        // A new observation of one cluster, the gate of another (same generation), one gone.
        let c0 = &fleet.inventory.clusters["c0000"];
        let mut ms = c0.machines.clone();
        ms.values_mut().next().unwrap().ready = false;
        let c0 = c0.observe(c0.kubernetes_version.clone(), ms);
        let c1 = fleet.inventory.clusters["c0001"].with_rollouts_enabled(true);
        store
            .commit(
                Txn::new()
                    .put_record(cluster_key("c0000"), &c0)
                    .put_record(cluster_key("c0001"), &c1)
                    .delete(Table::Inventory, cluster_key("c0002")),
            )
            .unwrap();
        let full = Inventory::load(&store).unwrap();
        assert_eq!(cache.load(&store).unwrap(), &full);
        assert_eq!(cache.decoded, 2);
        assert!(full.clusters["c0001"].rollouts_enabled);
        assert!(!full.clusters.contains_key("c0002"));
    }

    #[test]
    fn a_cached_replan_stores_the_plan_a_fresh_one_would() {
        use crate::bench::fleet::{FleetSpec, generate};
        use crate::desired::source::{Snapshot, SourceFile};
        use crate::store::Store;
        let fleet = generate(FleetSpec {
            clusters: 3,
            machines_per_cluster: 5,
            seed: 2,
        });
        let load = |files: &std::collections::BTreeMap<String, String>| {
            crate::desired::parse_snapshot(Snapshot {
                files: files
                    .iter()
                    .map(|(p, t)| SourceFile {
                        path: p.clone(),
                        bytes: t.as_bytes().to_vec().into(),
                    })
                    .collect(),
                markers: Vec::new(),
                commit: None,
                refused: Vec::new(),
            })
            .desired
        };
        let cached = crate::store::mem::MemStore::new();
        let fresh = crate::store::mem::MemStore::new();
        for s in [&cached, &fresh] {
            s.commit(fleet.inventory.save_txn()).unwrap();
        }
        let mut cache = super::ReplanCache::default();
        let mut files = fleet.files.clone();
        for round in 0..3 {
            let d = load(&files);
            let a = super::replan_cached(&cached, &d, jiff::Timestamp::now(), &mut cache).unwrap();
            let b = super::replan(&fresh, &d).unwrap();
            assert_eq!(a.plan, b.plan, "round {round}");
            assert_eq!(a.stored, b.stored);
            assert_eq!(
                super::current(&cached).unwrap().map(|c| c.id),
                super::current(&fresh).unwrap().map(|c| c.id)
            );
            // The record stitched from the sections' JSON is the one `encode` writes.
            let key = crate::plan::stored::plan_key(&a.plan.id);
            let stored = cached.get(crate::store::Table::Plans, &key).unwrap();
            assert_eq!(stored, fresh.get(crate::store::Table::Plans, &key).unwrap());
            assert_eq!(stored, Some(crate::store::record::encode(&a.plan)));
            let text = files["c0001/cluster.yaml"].replace(
                &format!("drainTimeout: {}m", 10 + round),
                &format!("drainTimeout: {}m", 11 + round),
            );
            files.insert("c0001/cluster.yaml".into(), text);
        }
        assert_eq!(cache.memo.last_stats().reused, 2);
        let ids: Vec<_> = super::all_plans(&cached)
            .unwrap()
            .into_iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(ids.len(), 3, "one plan per round");
        assert_eq!(super::plan_ids(&cached).unwrap(), ids);
    }

    /// A plan save collects the rehearsal reports of plans no longer stored and keeps those
    /// of stored plans (design/rehearsal.md, "Storage").
    #[test]
    fn a_plan_save_collects_the_reports_of_plans_no_longer_stored() {
        use crate::plan::PlanId;
        use crate::plan::tests::{cp_pool, observed, one, three_cps};
        use crate::rehearsal::report::{Outcome, Rehearsal};
        use crate::store::Store as _;
        let store = crate::store::mem::MemStore::new();
        store
            .commit(observed("v1.34.1", 4, three_cps("v1.12.11")).save_txn())
            .unwrap();
        let first = super::replan(&store, &one("v1.34.1", "", &[cp_pool("v1.13.9")]))
            .unwrap()
            .plan;
        let report = |plan: &PlanId| Rehearsal {
            plan: plan.to_hex(),
            cluster: "c1".into(),
            ran_at: String::new(),
            census_gathered_at: String::new(),
            compression: 60,
            timings: "defaults".into(),
            waves: vec![],
            outcome: Outcome::Completed { total_secs: 1 },
            blockers: vec![],
            limits: vec![],
        };
        let never_stored = PlanId::from_digest([9; 32]);
        crate::ops::rehearse::store_report(&store, &report(&first.id)).unwrap();
        crate::ops::rehearse::store_report(&store, &report(&never_stored)).unwrap();
        let second = super::replan(&store, &one("v1.34.1", "", &[cp_pool("v1.13.10")])).unwrap();
        assert!(second.stored);
        assert_ne!(second.plan.id, first.id);
        assert!(
            crate::ops::rehearse::load_report(&store, &first.id, "c1")
                .unwrap()
                .is_some(),
            "the first plan is still stored (in the window), and so is its report"
        );
        assert_eq!(
            crate::ops::rehearse::load_report(&store, &never_stored, "c1").unwrap(),
            None
        );
    }

    #[test]
    fn replanning_while_a_job_runs_stores_a_rolling_out_plan_that_the_job_end_stales() {
        use crate::plan::ClusterStatus;
        use crate::plan::tests::{cp_pool, observed, one, three_cps};
        use crate::rollout::journal::{ActiveJob, active_key};
        use crate::store::{Store, Table, Txn};
        let store = crate::store::mem::MemStore::new();
        let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
        store
            .commit(observed("v1.34.1", 4, three_cps("v1.12.11")).save_txn())
            .unwrap();
        let idle = super::replan(&store, &d).unwrap().plan;
        assert!(idle.has_changes());
        let job = crate::rollout::JobId::for_plan(&idle.id, "c1");
        store
            .commit(Txn::new().put_record(active_key("c1"), &ActiveJob { job: job.clone() }))
            .unwrap();
        assert!(
            idle.is_stale(&super::current_basis(&store, &d).unwrap()),
            "a job starting stales the plan of the work it does"
        );
        let busy = super::replan(&store, &d).unwrap();
        assert!(busy.stored);
        assert_eq!(busy.plan.clusters[0].status, ClusterStatus::RollingOut);
        assert!(!busy.plan.has_changes());
        assert_eq!(busy.plan.basis.running["c1"], job.to_string());
        // The job ends: the busy plan is stale and the next one plans the cluster again.
        store
            .commit(Txn::new().delete(Table::Jobs, active_key("c1")))
            .unwrap();
        assert!(
            busy.plan
                .is_stale(&super::current_basis(&store, &d).unwrap())
        );
        let after = super::replan(&store, &d).unwrap().plan;
        assert_eq!(after.clusters[0].status, ClusterStatus::Planned);
        assert_eq!(after.id, idle.id);
    }

    #[test]
    fn promotion_evidence_is_what_succeeded_jobs_of_upstream_clusters_brought() {
        use crate::plan::tests::{cluster_doc, cp_pool, load, observed, one, three_cps};
        use crate::rollout::{JobInputs, JobState, create_jobs_txn};
        use crate::store::{Store, Txn};
        let ts = |s: &str| s.parse::<jiff::Timestamp>().unwrap();
        let store = crate::store::mem::MemStore::new();
        let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
        let c1 = observed("v1.34.1", 4, three_cps("v1.12.11")).clusters["c1"]
            .with_rollouts_enabled(true);
        store
            .commit(Txn::new().put_record(crate::inventory::cluster_key("c1"), &c1))
            .unwrap();
        let plan = super::replan(&store, &d).unwrap().plan;
        let none: &[crate::desired::window::MaintenanceWindow] = &[];
        let inputs = JobInputs {
            global_rollouts: true,
            clusters: [("c1".to_string(), &c1)].into(),
            windows: [("c1".to_string(), none)].into(),
            exclusions: Default::default(),
            backup_recipients: Default::default(),
        };
        let mut job = create_jobs_txn(&plan, &inputs, ts("2026-11-30T00:00:00Z"))
            .unwrap()
            .jobs
            .remove(0);
        let key = crate::rollout::journal::job_key(&job.id);
        store
            .commit(Txn::new().put_record(key.clone(), &job))
            .unwrap();
        // c2 rolls versions only after c1 proved them.
        let promoted = load(&[
            ("c1.yaml", cluster_doc("c1", "v1.34.1", "")),
            (
                "c2.yaml",
                cluster_doc(
                    "c2",
                    "v1.34.1",
                    "  promotion:\n    after: c1\n    soak: 1h\n",
                ),
            ),
            ("pools.yaml", cp_pool("v1.13.9")),
        ]);
        // A running job proves nothing.
        assert!(
            super::promotion_evidence(&store, &promoted)
                .unwrap()
                .is_empty()
        );
        job.state = JobState::Succeeded {
            at: ts("2026-12-01T00:00:00Z"),
        };
        store.commit(Txn::new().put_record(key, &job)).unwrap();
        let ev = super::promotion_evidence(&store, &promoted).unwrap();
        let talos = crate::version::TalosVersion::parse("v1.13.9").unwrap();
        assert_eq!(ev["c1"].talos[&talos], ts("2026-12-01T00:00:00Z"));
        assert!(ev["c1"].kubernetes.is_empty());
        // Nobody is promoted after c1: its history is not even read.
        assert!(super::promotion_evidence(&store, &d).unwrap().is_empty());
    }
}
