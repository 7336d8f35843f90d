//! Loading rollout jobs from the store: a job's checkpoint (`Jobs/job/<id>`) with its journal
//! folded in ([`crate::rollout::journal::replay`]). Used by the daemon, the API and the CLI;
//! the executor reads its own job the same way.

use crate::rollout::journal::{JournalEntry, job_key, replay};
use crate::rollout::{Job, JobId};
use crate::store::{Store, StoreError, StoreExt};

/// The current state of job `id`: its checkpoint, then the delta of every journal entry after
/// it, in order. `None` when there is no such job.
pub fn load_job(store: &dyn Store, id: &JobId) -> Result<Option<Job>, StoreError> {
    match store.get_record::<Job>(&job_key(id))? {
        Some(mut job) => {
            replay(&mut job, |key| store.get_record::<JournalEntry>(key))?;
            Ok(Some(job))
        }
        None => Ok(None),
    }
}

/// Every job in the store, current (see [`load_job`]), in key order.
pub fn load_jobs(store: &dyn Store) -> Result<Vec<Job>, StoreError> {
    let mut jobs = Vec::new();
    for (_, mut job) in store.scan_records::<Job>("job/")? {
        replay(&mut job, |key| store.get_record::<JournalEntry>(key))?;
        jobs.push(job);
    }
    Ok(jobs)
}
