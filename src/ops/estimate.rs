//! The predicted duration of a plan's jobs (issue #36 item 3): reads the journal of each
//! cluster's last successful jobs (at most [`crate::plan::estimate::HISTORY_JOBS`], so the
//! cost is bounded whatever the history), turns them into samples
//! ([`crate::rollout::history::samples`]) and asks the pure estimator. The estimate is advice
//! attached to the plan after it is computed: never part of its id.

use crate::desired::Desired;
use crate::plan::Plan;
use crate::plan::estimate::{DEFAULTS, Estimate, HISTORY_JOBS, History, estimate};
use crate::rollout::journal::{JournalEntry, entries_prefix};
use crate::rollout::{Job, JobState};
use crate::store::{Store, StoreError, StoreExt};

/// The history of `cluster`: its last [`HISTORY_JOBS`] successful jobs among `jobs`, newest
/// first, each read back from its journal.
pub fn history(store: &dyn Store, jobs: &[Job], cluster: &str) -> Result<History, StoreError> {
    let mut done: Vec<&Job> = jobs
        .iter()
        .filter(|j| j.cluster == cluster && matches!(j.state, JobState::Succeeded { .. }))
        .collect();
    done.sort_by_key(|j| std::cmp::Reverse(j.created_at));
    let mut out = History::default();
    for j in done.into_iter().take(HISTORY_JOBS) {
        let entries: Vec<JournalEntry> = store
            .scan_records::<JournalEntry>(&entries_prefix(&j.id))?
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        out.jobs.push(crate::rollout::history::samples(j, &entries));
    }
    Ok(out)
}

/// The estimates of every cluster of `plan` with steps, at time `now`.
pub fn estimates(
    store: &dyn Store,
    jobs: &[Job],
    desired: &Desired,
    plan: &Plan,
    now: jiff::Timestamp,
) -> Result<Vec<Estimate>, StoreError> {
    let mut out = Vec::new();
    for cp in plan.clusters.iter().filter(|c| !c.steps.is_empty()) {
        let h = history(store, jobs, &cp.cluster)?;
        let (windows, exclusions) = desired
            .clusters
            .get(&cp.cluster)
            .map(|c| (c.windows.as_slice(), c.exclusions.as_slice()))
            .unwrap_or_default();
        out.push(estimate(cp, &h, &DEFAULTS, windows, exclusions, Some(now)));
    }
    Ok(out)
}
