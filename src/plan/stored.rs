//! Plans in the store.
//!
//! Layout (table `Plans`): `plan/<full-hex>` holds a [`Plan`]; `current` holds the
//! [`CurrentPlan`] pointer. Table `Desired` holds the last-applied resources
//! ([`super::applied`]). Everything here is a pure function that builds transactions, plus
//! small loaders over the [`Store`] trait; no backend is named.

use serde::{Deserialize, Serialize};

use super::applied::LastApplied;
use super::id::PlanId;
use super::model::{Basis, Plan};
use crate::desired::Desired;
use crate::inventory::Inventory;
use crate::store::record::encode;
use crate::store::{Check, Op, Record, Store, StoreError, StoreExt, Table, Txn};

impl Record for Plan {
    const TABLE: Table = Table::Plans;
    const KIND: &'static str = "plan";
    const SCHEMA: u32 = 1;
}

/// Which plan is current: the newest one computed from the store's own basis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CurrentPlan {
    pub id: PlanId,
}

impl Record for CurrentPlan {
    const TABLE: Table = Table::Plans;
    const KIND: &'static str = "current-plan";
    const SCHEMA: u32 = 1;
}

pub const CURRENT_KEY: &str = "current";

/// `plan/<full-hex>`.
pub fn plan_key(id: &PlanId) -> String {
    format!("plan/{}", id.to_hex())
}

pub fn load_plan(store: &dyn Store, id: &PlanId) -> Result<Option<Plan>, StoreError> {
    store.get_record(&plan_key(id))
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

/// The basis a plan computed now would have: what approval compares a plan's basis with.
pub fn current_basis(store: &dyn Store, desired: &Desired) -> Result<Basis, StoreError> {
    let generations = crate::inventory::generations(store)?;
    let applied = LastApplied::load(store)?;
    let running = running_jobs(store)?;
    Ok(super::compute::basis_from_generations(
        desired,
        |name| generations.get(name).copied(),
        &applied,
        &running,
    ))
}

/// The running rollout job of each cluster that has one (cluster → job id), from the
/// `Jobs/active/<cluster>` markers.
pub fn running_jobs(
    store: &dyn Store,
) -> Result<std::collections::BTreeMap<String, String>, StoreError> {
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

/// Store `plan` and make it current, if the pointer still is `previous` (compare-and-swap:
/// a concurrent planner makes this fail with `StoreError::Conflict` and change nothing).
pub fn save_txn(plan: &Plan, previous: Option<&CurrentPlan>) -> Txn {
    let check = match previous {
        Some(p) => Check::Equals(Table::Plans, CURRENT_KEY.into(), encode(p)),
        None => Check::Absent(Table::Plans, CURRENT_KEY.into()),
    };
    Txn::new()
        .check(check)
        .put_record(plan_key(&plan.id), plan)
        .put_record(CURRENT_KEY, &CurrentPlan { id: plan.id })
}

/// The writes that apply a plan's settings: every last-applied record the plan carries is
/// put, every resource it removes is deleted (table `Desired`). Pure. The approval side adds
/// these ops to the transaction that marks the plan approved, so the settings and the
/// approval land together or not at all.
pub fn approval_writes(plan: &Plan) -> Vec<Op> {
    let mut ops: Vec<Op> = plan
        .applies
        .put
        .iter()
        .map(|r| Op::Put(Table::Desired, r.key.store_key(), encode(r)))
        .collect();
    ops.extend(
        plan.applies
            .delete
            .iter()
            .map(|k| Op::Delete(Table::Desired, k.store_key())),
    );
    ops
}

/// `txn` with [`approval_writes`] appended.
pub fn with_approval_writes(mut txn: Txn, plan: &Plan) -> Txn {
    for op in approval_writes(plan) {
        txn.push(op);
    }
    txn
}

/// What [`replan`] did.
#[derive(Debug, Clone)]
pub struct Replanned {
    pub plan: Plan,
    /// `true` when the plan is new and became current; `false` when it already was current.
    pub stored: bool,
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
    let inventory = Inventory::load(store)?;
    let applied = LastApplied::load(store)?;
    let running = running_jobs(store)?;
    let previous = current(store)?;
    let mut plan = super::compute::compute_with(
        desired,
        &inventory,
        &applied,
        previous.map(|p| p.id),
        &running,
    )
    .map_err(ReplanError::Refused)?;
    if let Some(p) = previous
        && p.id == plan.id
        && let Some(existing) = load_plan(store, &plan.id)?
    {
        // Same inputs as the current plan: it is the current plan.
        plan.parent = existing.parent;
        return Ok(Replanned {
            plan,
            stored: false,
        });
    }
    if plan.parent == Some(plan.id) {
        plan.parent = None; // a pointer to a plan record that is gone
    }
    store.commit(save_txn(&plan, previous.as_ref()))?;
    Ok(Replanned { plan, stored: true })
}
