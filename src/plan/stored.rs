//! Plans as store records: their keys and the transactions that save or apply them.
//!
//! Layout (table `Plans`): `plan/<full-hex>` holds a [`Plan`]; `current` holds the
//! [`CurrentPlan`] pointer. Table `Desired` holds the last-applied resources
//! ([`super::applied`]). Everything here is pure: record declarations and functions that
//! build transaction values. Reading the store and committing is the application layer's
//! job (the application layer's replan use case, in `ops`).

use serde::{Deserialize, Serialize};

use super::id::PlanId;
use super::model::Plan;
use crate::store::record::encode;
use crate::store::{Check, Op, Record, Table, Txn};

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

/// [`save_txn`] with the plan's JSON given (`serde_json::to_vec(plan)`, byte for byte; the
/// daemon stitches it from the sections' JSON, `PlanMemo::plan_json`): the record written is
/// [`encode`]`(plan)`.
pub fn save_txn_json(plan: &Plan, json: &[u8], previous: Option<&CurrentPlan>) -> Txn {
    let check = match previous {
        Some(p) => Check::Equals(Table::Plans, CURRENT_KEY.into(), encode(p)),
        None => Check::Absent(Table::Plans, CURRENT_KEY.into()),
    };
    // The envelope `encode` writes around the data: `{"kind":…,"schema":…,"data":…}`.
    let mut value = Vec::with_capacity(json.len() + 48);
    value.extend_from_slice(br#"{"kind":""#);
    value.extend_from_slice(<Plan as Record>::KIND.as_bytes());
    value.extend_from_slice(br#"","schema":"#);
    value.extend_from_slice(<Plan as Record>::SCHEMA.to_string().as_bytes());
    value.extend_from_slice(br#","data":"#);
    value.extend_from_slice(json);
    value.push(b'}');
    Txn::new()
        .check(check)
        .put(Table::Plans, plan_key(&plan.id), value)
        .put_record(CURRENT_KEY, &CurrentPlan { id: plan.id })
}

/// The writes that apply a plan's settings on approval: the last-applied record of every
/// resource of a cluster without steps is put, every resource the plan removes is deleted
/// (table `Desired`). Pure. The approval side adds these ops to the transaction that marks
/// the plan approved, so the settings and the approval land together or not at all.
///
/// The records of a cluster with steps are not written here: its job carries them
/// ([`job_applies`]) and writes them with its success (issue #32), so a job that halts before
/// acting — or at all — leaves the next plan showing the same diff and settings changes.
pub fn approval_writes(plan: &Plan) -> Vec<Op> {
    let with_job: std::collections::BTreeSet<&str> = plan
        .clusters
        .iter()
        .filter(|c| !c.steps.is_empty())
        .map(|c| c.cluster.as_str())
        .collect();
    let mut ops: Vec<Op> = plan
        .applies
        .put
        .iter()
        .filter(|r| !with_job.contains(r.key.cluster_name()))
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

/// The last-applied records the job of `cluster` writes when it succeeds: the plan's records
/// of that cluster's resources, when the cluster has steps (else none: approval wrote them).
pub fn job_applies(plan: &Plan, cluster: &str) -> Vec<super::applied::AppliedResource> {
    let stepped = plan
        .clusters
        .iter()
        .any(|c| c.cluster == cluster && !c.steps.is_empty());
    if !stepped {
        return Vec::new();
    }
    plan.applies
        .put
        .iter()
        .filter(|r| r.key.cluster_name() == cluster)
        .cloned()
        .collect()
}

/// `txn` with [`approval_writes`] appended.
pub fn with_approval_writes(mut txn: Txn, plan: &Plan) -> Txn {
    for op in approval_writes(plan) {
        txn.push(op);
    }
    txn
}
