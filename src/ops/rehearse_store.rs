//! Storing and loading rehearsal reports (issue #36 item 4), minimal, for the API and the
//! dashboard: branch run36 writes the same two functions in `ops::rehearse` with the runner;
//! the merge keeps theirs and removes this file.
//!
//! A report is stored under [`rehearsal_key`]`(plan, cluster)` in the plans table, beside the
//! plan's record and never in it: storing one never changes the plan, its id or the
//! current-plan pointer.

use crate::plan::PlanId;
use crate::rehearsal::report::{Rehearsal, rehearsal_key};
use crate::store::{Store, StoreError, StoreExt, Txn};

/// Store `report` under [`rehearsal_key`]`(report.plan, report.cluster)`, replacing an
/// earlier rehearsal of the same plan and cluster. `report.plan` is the plan's full id
/// ([`PlanId::to_hex`]).
pub fn store_report(store: &dyn Store, report: &Rehearsal) -> Result<(), StoreError> {
    store.commit(Txn::new().put_record(rehearsal_key(&report.plan, &report.cluster), report))
}

/// The stored rehearsal of `plan` for `cluster`, if one was stored.
pub fn load_report(
    store: &dyn Store,
    plan: &PlanId,
    cluster: &str,
) -> Result<Option<Rehearsal>, StoreError> {
    store.get_record(&rehearsal_key(&plan.to_hex(), cluster))
}
