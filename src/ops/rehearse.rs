//! Rehearsing a plan on a twin (issue #36 item 4), and storing what it found.
//!
//! A rehearsal report is stored under [`rehearsal_key`]`(plan, cluster)` in the plans table,
//! beside the plan's record and never in it: storing one never changes the plan, its id or
//! the current-plan pointer (design/rehearsal.md, "Storage").

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rehearsal::report::{Blocker, BlockerKind, Outcome, RehearsedWave};
    use crate::store::mem::MemStore;

    fn report(plan: &PlanId, cluster: &str) -> Rehearsal {
        Rehearsal {
            plan: plan.to_hex(),
            cluster: cluster.into(),
            ran_at: "2026-01-01T00:00:00Z".into(),
            census_gathered_at: String::new(),
            compression: 60,
            timings: "defaults".into(),
            waves: vec![RehearsedWave {
                step: "talos workers".into(),
                wave: 1,
                nodes: vec!["w-1".into()],
                start_secs: 0,
                duration_secs: None,
            }],
            outcome: Outcome::Halted {
                code: "drain_blocked".into(),
                node: Some("w-1".into()),
                reason: "blocked".into(),
                after_secs: 60,
            },
            blockers: vec![Blocker {
                kind: BlockerKind::Pdb,
                node: Some("w-1".into()),
                detail: "PodDisruptionBudget shop/db allows no disruption".into(),
            }],
            limits: vec!["nodes only".into()],
        }
    }

    #[test]
    fn a_stored_report_loads_back_per_plan_and_cluster() {
        let store = MemStore::new();
        let a = PlanId::from_digest([1; 32]);
        let b = PlanId::from_digest([2; 32]);
        assert_eq!(load_report(&store, &a, "prod").unwrap(), None);
        let r = report(&a, "prod");
        store_report(&store, &r).unwrap();
        assert_eq!(load_report(&store, &a, "prod").unwrap(), Some(r.clone()));
        assert_eq!(load_report(&store, &a, "staging").unwrap(), None);
        assert_eq!(load_report(&store, &b, "prod").unwrap(), None);
        // A second rehearsal of the same plan and cluster replaces the first.
        let again = Rehearsal {
            outcome: Outcome::Completed { total_secs: 5 },
            blockers: vec![],
            ..r
        };
        store_report(&store, &again).unwrap();
        assert_eq!(load_report(&store, &a, "prod").unwrap(), Some(again));
    }
}
