//! The application layer: medea's use cases, between the pure domain and the edges.
//!
//! **Owns:** the operations the daemon and the CLI share: replanning (desired state +
//! observations + running jobs → a stored plan; [`replan`], with the plan and last-applied
//! loaders), rendering desired-state diagnostics for the CLI and the API ([`report`]), loading
//! jobs from the journal, verifying approvals with bounded work per pass ([`approvals`]),
//! observing a cluster through the Talos and Kubernetes clients, and `medea doctor`'s checks
//! (scheduled etcd backups have their own module, `crate::backup`).
//! **May depend on:** the `ops` row of design/architecture.md's code map (the one list, checked
//! by `tests/it/architecture.rs`): the domain modules, the store and the clients behind the
//! domain's ports.
//! **Used by:** `server` and `cli`; never by the domain modules.
//!
//! The domain stays pure because this layer does its I/O: it reads the store, calls the
//! clients, and hands plain values to `plan::compute` and the rollout state machine.

pub mod approvals;
pub mod census;
pub mod cluster_ports;
pub mod doctor;
pub mod estimate;
pub mod jobs;
pub mod preflight;
pub mod refresh;
pub mod rehearse;
pub mod replan;
pub mod report;

/// The desired-state loader the CLI, the daemon and the benchmarks use: stage 1 (parsing)
/// split over [`lanes`] threads ([`fan_out`]). `desired` itself starts no thread; its result
/// is the same on one.
pub fn desired_loader() -> crate::desired::Loader {
    crate::desired::Loader::parallel(run_scoped, lanes())
}

/// Read and validate a revision with [`desired_loader`] (`desired::load`, parsed in parallel).
pub fn load_desired(
    source: &crate::desired::Source,
) -> Result<crate::desired::Loaded, crate::desired::SourceError> {
    desired_loader().load(source)
}

/// Run every job on a thread of its own (the first on the caller's); return when all have
/// run (a panic in one is resumed here, as it would be on one thread). The
/// [`crate::plan::compute::FanOut`] of the CLI, the daemon and the benches, and what
/// [`desired_loader`]'s parse runner is made of.
pub fn fan_out(jobs: Vec<Box<dyn FnOnce() + Send + '_>>) {
    let mut jobs = jobs.into_iter();
    let Some(first) = jobs.next() else {
        return;
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = jobs.map(|job| scope.spawn(job)).collect();
        first();
        for h in handles {
            if let Err(panic) = h.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

/// Threads to parse and plan on: one per core, at most
/// [`crate::desired::incremental::PARSE_THREADS`].
pub fn lanes() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(crate::desired::incremental::PARSE_THREADS)
}

/// A one-off planning memo that plans on [`lanes`] lanes ([`fan_out`]) when a plan has
/// many sections to plan: what a cold plan (`medea plan`, the benches) uses.
pub fn cold_plan_memo() -> crate::plan::compute::PlanMemo {
    crate::plan::compute::PlanMemo::one_off().fan_out(fan_out, lanes())
}

/// The loader's parse runner: every job through [`fan_out`], the results in the jobs' order.
fn run_scoped(
    jobs: Vec<crate::desired::incremental::ParseJob<'_>>,
) -> Vec<Vec<crate::desired::incremental::ParsedFile>> {
    use std::sync::Mutex;
    let slots: Vec<Mutex<Option<Vec<crate::desired::incremental::ParsedFile>>>> =
        jobs.iter().map(|_| Mutex::new(None)).collect();
    fan_out(
        jobs.into_iter()
            .zip(&slots)
            .map(|(job, slot)| {
                Box::new(move || {
                    let parsed = job();
                    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(parsed);
                }) as Box<dyn FnOnce() + Send + '_>
            })
            .collect(),
    );
    #[allow(
        clippy::expect_used,
        reason = "fan_out returns only after every job ran (a panic is resumed before this)"
    )]
    slots
        .into_iter()
        .map(|s| {
            s.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .expect("fan_out ran every parse job")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    /// The parse runner hands back each job's result in the jobs' order, whatever thread ran it.
    #[test]
    fn the_parse_runner_returns_results_in_job_order() {
        let jobs: Vec<crate::desired::incremental::ParseJob<'_>> = (0..5)
            .map(|i| {
                Box::new(move || {
                    // later jobs finish first
                    std::thread::sleep(std::time::Duration::from_millis(5 * (5 - i)));
                    Vec::with_capacity(i as usize)
                }) as crate::desired::incremental::ParseJob<'_>
            })
            .collect();
        let out = super::run_scoped(jobs);
        let caps: Vec<usize> = out.iter().map(Vec::capacity).collect();
        assert_eq!(caps.len(), 5);
        assert!(caps.iter().enumerate().all(|(i, c)| *c >= i), "{caps:?}");
        assert!(caps.windows(2).all(|w| w[0] <= w[1]), "{caps:?}");
    }

    /// A panic in a job reaches the caller with its own message, as on one thread.
    #[test]
    fn fan_out_resumes_a_jobs_panic() {
        let caught = std::panic::catch_unwind(|| {
            super::fan_out(vec![
                Box::new(|| {}),
                Box::new(|| panic!("lane two failed")),
            ])
        })
        .unwrap_err();
        assert_eq!(caught.downcast_ref::<&str>(), Some(&"lane two failed"));
    }
}
