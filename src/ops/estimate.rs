//! The predicted duration of a plan's jobs (issue #36 item 3): reads the journal of each
//! cluster's last successful jobs (at most [`crate::plan::estimate::HISTORY_JOBS`], so the
//! cost is bounded whatever the history), turns them into samples
//! ([`crate::rollout::history::samples`]) and asks the pure estimator. The estimate is advice
//! attached to the plan after it is computed: never part of its id.

use crate::desired::Desired;
use crate::plan::Plan;
use crate::plan::estimate::{DEFAULTS, Estimate, HISTORY_JOBS, History, JobSamples, estimate};
use crate::rollout::journal::{JournalEntry, entries_prefix};
use crate::rollout::{Job, JobState};
use crate::store::{Store, StoreError, StoreExt};

/// The samples of finished jobs already read, by job id: a successful job's journal never
/// changes, so the daemon reads each one once ([`crate::ops::replan::ReplanCache`]).
pub type SamplesCache = std::collections::BTreeMap<crate::rollout::JobId, JobSamples>;

/// The history of `cluster`: its last [`HISTORY_JOBS`] successful jobs among `jobs`, newest
/// first, each read back from its journal (or taken from `cache`).
pub fn history(
    store: &dyn Store,
    jobs: &[Job],
    cluster: &str,
    cache: &mut SamplesCache,
) -> Result<History, StoreError> {
    let mut done: Vec<&Job> = jobs
        .iter()
        .filter(|j| j.cluster == cluster && matches!(j.state, JobState::Succeeded { .. }))
        .collect();
    done.sort_by_key(|j| std::cmp::Reverse(j.created_at));
    let mut out = History::default();
    for j in done.into_iter().take(HISTORY_JOBS) {
        if let Some(s) = cache.get(&j.id) {
            out.jobs.push(s.clone());
            continue;
        }
        let entries: Vec<JournalEntry> = store
            .scan_records::<JournalEntry>(&entries_prefix(&j.id))?
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        let s = crate::rollout::history::samples(j, &entries);
        cache.insert(j.id.clone(), s.clone());
        out.jobs.push(s);
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
    estimates_cached(store, jobs, desired, plan, now, &mut SamplesCache::new())
}

/// [`estimates`] reusing (and filling) `cache`; jobs no longer among `jobs` leave it.
pub fn estimates_cached(
    store: &dyn Store,
    jobs: &[Job],
    desired: &Desired,
    plan: &Plan,
    now: jiff::Timestamp,
    cache: &mut SamplesCache,
) -> Result<Vec<Estimate>, StoreError> {
    cache.retain(|id, _| jobs.iter().any(|j| &j.id == id));
    let mut out = Vec::new();
    for cp in plan.clusters.iter().filter(|c| !c.steps.is_empty()) {
        let h = history(store, jobs, &cp.cluster, cache)?;
        let (windows, exclusions) = desired
            .clusters
            .get(&cp.cluster)
            .map(|c| (c.windows.as_slice(), c.exclusions.as_slice()))
            .unwrap_or_default();
        out.push(estimate(cp, &h, &DEFAULTS, windows, exclusions, Some(now)));
    }
    Ok(out)
}
