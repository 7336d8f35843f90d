//! Plans as store records: their keys and the transactions that save or apply them.
//!
//! Layout (table `Plans`): `plan/<full-hex>` holds a [`Plan`]; `current` holds the
//! [`CurrentPlan`] pointer; `recent/…` orders stored plans for collection; `consumed/<full-hex>`
//! ([`consumed_key`]) marks an executed plan (the record, `rollout::journal::PlanConsumed`,
//! names its jobs, so it is declared with them). Table `Desired` holds the last-applied resources
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
    /// The current plan's id.
    pub id: PlanId,
}

impl Record for CurrentPlan {
    const TABLE: Table = Table::Plans;
    const KIND: &'static str = "current-plan";
    const SCHEMA: u32 = 1;
}

/// The key of the [`CurrentPlan`] record.
pub const CURRENT_KEY: &str = "current";

/// Prefix of the executed-plan markers (`rollout::journal::PlanConsumed`, written by the
/// transaction that creates a plan's jobs or applies its settings). They are never collected:
/// an approval of an executed plan must stay `Replayed` forever.
pub const CONSUMED_PREFIX: &str = "consumed/";

/// `consumed/<full-hex>`: the marker that `plan` was executed.
pub fn consumed_key(plan: &PlanId) -> String {
    format!("{CONSUMED_PREFIX}{}", plan.to_hex())
}

/// `plan/<full-hex>`.
pub fn plan_key(id: &PlanId) -> String {
    format!("plan/{}", id.to_hex())
}

/// How many of the most recently stored plans are kept (the current one included): superseded
/// plans beyond this window are collected when a new plan is stored ([`collect_ops`]). Executed plans stay
/// recognised through their `consumed/<hex>` markers, which are never collected.
pub const PLAN_WINDOW: usize = 64;

/// At most this many deletes ride on one plan save (etcd refuses transactions of more than
/// 128 operations by default); a store with more to collect converges over the next saves.
pub const MAX_COLLECT_PER_SAVE: usize = 96;

/// Prefix of the order index: `recent/<seq, 20 digits>/<full-hex>`, one key per stored plan
/// in the order they were stored (its value is empty).
pub const RECENT_PREFIX: &str = "recent/";

/// The order-index key of the plan stored `seq`-th.
pub fn recent_key(seq: u64, id: &PlanId) -> String {
    format!("{RECENT_PREFIX}{seq:020}/{}", id.to_hex())
}

/// The writes that collect superseded plans when `new` is stored after `previous`: given the
/// stored plan ids and the order index's keys (both from key-only scans), keep `previous`
/// and the newest [`PLAN_WINDOW`] plans (`new` and the newest index entries); delete every other
/// plan record and every index entry out of the window (at most [`MAX_COLLECT_PER_SAVE`]
/// deletes); and index `new`. A plan stored before the index existed has no entry, so it is
/// collected. Pure.
pub fn collect_ops(
    new: &PlanId,
    previous: Option<&PlanId>,
    stored: &[PlanId],
    recent: &[String],
) -> Vec<Op> {
    let mut entries: Vec<(u64, PlanId, &String)> = recent
        .iter()
        .filter_map(|k| {
            let (seq, hex) = k.strip_prefix(RECENT_PREFIX)?.split_once('/')?;
            Some((seq.parse().ok()?, PlanId::parse_full(hex).ok()?, k))
        })
        .collect();
    entries.sort_by_key(|(seq, _, _)| *seq);
    let next = entries.last().map_or(0, |(seq, _, _)| seq + 1);
    // The window after this save: the newest PLAN_WINDOW - 1 entries and `new`.
    let cut = entries.len().saturating_sub(PLAN_WINDOW.saturating_sub(1));
    let (out, window) = entries.split_at(cut);
    let mut keep: std::collections::BTreeSet<PlanId> =
        window.iter().map(|(_, id, _)| *id).collect();
    keep.insert(*new);
    keep.extend(previous);
    let mut ops: Vec<Op> = out
        .iter()
        .map(|(_, _, k)| Op::Delete(Table::Plans, (*k).clone()))
        .chain(
            stored
                .iter()
                .filter(|id| !keep.contains(id))
                .map(|id| Op::Delete(Table::Plans, plan_key(id))),
        )
        .take(MAX_COLLECT_PER_SAVE)
        .collect();
    ops.push(Op::Put(Table::Plans, recent_key(next, new), Vec::new()));
    ops
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn id(n: u32) -> PlanId {
        let mut b = [0u8; 32];
        b[28..].copy_from_slice(&n.to_be_bytes());
        PlanId::from_digest(b)
    }

    /// The Plans table's `plan/` and `recent/` keys, as a save would leave them.
    #[derive(Default)]
    struct Table_ {
        plans: BTreeSet<PlanId>,
        recent: BTreeSet<String>,
    }

    impl Table_ {
        fn save(&mut self, new: PlanId, previous: Option<PlanId>) -> usize {
            let stored: Vec<PlanId> = self.plans.iter().copied().collect();
            let recent: Vec<String> = self.recent.iter().cloned().collect();
            let ops = collect_ops(&new, previous.as_ref(), &stored, &recent);
            let n = ops.len();
            self.plans.insert(new);
            for op in ops {
                match op {
                    Op::Delete(Table::Plans, k) => {
                        if let Some(hex) = k.strip_prefix("plan/") {
                            assert!(self.plans.remove(&PlanId::parse_full(hex).unwrap()));
                        } else {
                            assert!(self.recent.remove(&k), "{k}");
                        }
                    }
                    Op::Put(Table::Plans, k, v) => {
                        assert!(v.is_empty());
                        self.recent.insert(k);
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            n
        }
    }

    /// Issue 32: superseded plans are collected; the newest PLAN_WINDOW stay.
    #[test]
    fn saving_plans_keeps_a_bounded_window_of_the_newest() {
        let mut t = Table_::default();
        let mut previous = None;
        for i in 0..(3 * PLAN_WINDOW as u32) {
            t.save(id(i), previous);
            previous = Some(id(i));
            assert!(t.plans.len() <= PLAN_WINDOW, "{}", t.plans.len());
            assert_eq!(t.recent.len(), t.plans.len());
        }
        let newest: BTreeSet<PlanId> = ((2 * PLAN_WINDOW as u32)..(3 * PLAN_WINDOW as u32))
            .map(id)
            .collect();
        assert_eq!(t.plans, newest);
    }

    /// A store from before the window (5,000 plans, no order index) converges, at most
    /// MAX_COLLECT_PER_SAVE deletes per save (one etcd transaction); the plan that was current
    /// is never collected by the save that supersedes it.
    #[test]
    fn an_old_store_converges_in_bounded_saves() {
        let mut t = Table_::default();
        t.plans = (0..5_000).map(id).collect();
        let mut previous = Some(id(4_999));
        let mut saves = 0;
        let mut n = 10_000;
        while t.plans.len() > PLAN_WINDOW {
            let ops = t.save(id(n), previous);
            assert!(ops <= MAX_COLLECT_PER_SAVE + 1, "{ops}");
            assert!(t.plans.contains(&previous.unwrap()));
            previous = Some(id(n));
            n += 1;
            saves += 1;
            assert!(saves < 100, "does not converge");
        }
        assert!(saves <= 5_000 / MAX_COLLECT_PER_SAVE + 2, "{saves}");
    }

    /// A plan id that comes back (the same inputs again) is indexed again and kept.
    #[test]
    fn a_plan_that_comes_back_is_kept() {
        let mut t = Table_::default();
        t.save(id(1), None);
        for i in 2..(PLAN_WINDOW as u32 + 5) {
            t.save(id(i), Some(id(i - 1)));
        }
        assert!(!t.plans.contains(&id(1)));
        let last = id(PLAN_WINDOW as u32 + 4);
        t.save(id(1), Some(last));
        assert!(t.plans.contains(&id(1)));
        assert!(t.plans.contains(&last));
    }
}
