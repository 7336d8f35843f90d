//! The application layer: medea's use cases, between the pure domain and the edges.
//!
//! **Owns:** the operations the daemon and the CLI share: replanning (desired state +
//! observations + running jobs → a stored plan; [`replan`], with the plan and last-applied
//! loaders), rendering desired-state diagnostics for the CLI and the API ([`report`]), loading
//! jobs from the journal, observing a cluster through the Talos and Kubernetes clients, and
//! `medea doctor`'s checks.
//! **May depend on:** the domain modules (`desired`, `plan`, `approval`, `rollout`), `store`,
//! and the clients behind the domain's ports (`talos`, `k8s`).
//! **Used by:** `server` and `cli`; never by the domain modules.
//!
//! The domain stays pure because this layer does its I/O: it reads the store, calls the
//! clients, and hands plain values to `plan::compute` and the rollout state machine.

pub mod cluster_ports;
pub mod doctor;
pub mod jobs;
pub mod preflight;
pub mod refresh;
pub mod replan;
pub mod report;

/// The desired-state loader the CLI, the daemon and the benchmarks use: stage 1 (parsing)
/// split over the CPUs (at most [`crate::desired::incremental::PARSE_THREADS`]) with
/// `std::thread::scope`. `desired` itself starts no thread; its result is the same on one.
pub fn desired_loader() -> crate::desired::Loader {
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(crate::desired::incremental::PARSE_THREADS);
    crate::desired::Loader::parallel(run_scoped, threads)
}

/// Read and validate a revision with [`desired_loader`] (`desired::load`, parsed in parallel).
pub fn load_desired(
    source: &crate::desired::Source,
) -> Result<crate::desired::Loaded, crate::desired::SourceError> {
    desired_loader().load(source)
}

/// Run every job on a thread of its own (the first on the caller's); return when all have
/// run (a panic in one is resumed here). The [`crate::plan::compute::FanOut`] of the CLI, the
/// daemon and the benches.
pub fn fan_out(jobs: Vec<Box<dyn FnOnce() + Send + '_>>) {
    let mut jobs = jobs.into_iter();
    let Some(first) = jobs.next() else {
        return;
    };
    std::thread::scope(|scope| {
        for job in jobs {
            scope.spawn(job);
        }
        first();
    });
}

/// Lanes to plan in: one per core, at most [`crate::desired::incremental::PARSE_THREADS`].
pub fn plan_lanes() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(crate::desired::incremental::PARSE_THREADS)
}

/// A one-off planning memo that plans on [`plan_lanes`] lanes ([`fan_out`]) when a plan has
/// many sections to plan: what a cold plan (`medea plan`, the benches) uses.
pub fn cold_plan_memo() -> crate::plan::compute::PlanMemo {
    crate::plan::compute::PlanMemo::one_off().fan_out(fan_out, plan_lanes())
}

/// Run every job on a thread of its own (the first on the caller's) and return the results
/// in the jobs' order.
fn run_scoped(
    jobs: Vec<crate::desired::incremental::ParseJob<'_>>,
) -> Vec<Vec<crate::desired::incremental::ParsedFile>> {
    let mut jobs = jobs.into_iter();
    let Some(first) = jobs.next() else {
        return Vec::new();
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = jobs.map(|job| scope.spawn(job)).collect();
        let mut out = vec![first()];
        for h in handles {
            match h.join() {
                Ok(parsed) => out.push(parsed),
                // A panic in a parse is a bug: surface it as it would on one thread.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}
