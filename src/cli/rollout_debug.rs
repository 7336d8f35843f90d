//! Hidden commands for the rollout crash harness: run every running job of a store against a
//! persistent fake cluster in a child process that the test kills at journal points.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::rollout::fake::FakeCluster;
use crate::rollout::{CrashPoints, Executor, ExecutorConfig, RunOutcome, SystemClock};
use crate::store::fjall::FjallStore;

#[derive(Debug, Args)]
pub struct RolloutRunArgs {
    /// The store directory holding the jobs.
    #[arg(long)]
    pub store: PathBuf,
    /// The persistent fake cluster (JSON state written by `FakeCluster::save`). The only
    /// cluster kind so far; a simulator endpoint is the next.
    #[arg(long)]
    pub fake_state: Option<PathBuf>,
    /// Where etcd snapshots go (default: `<store>/../snapshots`).
    #[arg(long)]
    pub snapshots: Option<PathBuf>,
    /// The global rollouts gate.
    #[arg(long)]
    pub rollouts: bool,
    /// Poll interval and backoff base, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub poll_ms: u64,
}

/// Run all running jobs to the end. Crash points come from `MEDEA_CRASH_AT` /
/// `MEDEA_CRASH_BEFORE`. Prints one `<job> <outcome>` line per job; exit 0 when all succeeded.
pub fn rollout_run(args: RolloutRunArgs) -> miette::Result<u8> {
    let Some(fake_state) = &args.fake_state else {
        return Err(miette::miette!(
            "no cluster to run against: pass --fake-state <file>"
        ));
    };
    let fake = FakeCluster::persistent(fake_state).map_err(|e| {
        miette::miette!(
            "cannot load the fake cluster `{}`: {e}",
            fake_state.display()
        )
    })?;
    let store = FjallStore::open(&args.store).map_err(|e| miette::miette!("{e}"))?;
    let snapshots = args.snapshots.unwrap_or_else(|| {
        args.store
            .parent()
            .map(|p| p.join("snapshots"))
            .unwrap_or_else(|| PathBuf::from("snapshots"))
    });
    let mut cfg = ExecutorConfig::new(args.rollouts, snapshots);
    let tick = Duration::from_millis(args.poll_ms);
    cfg.poll = tick;
    cfg.backoff_min = tick;
    cfg.backoff_max = tick * 8;
    cfg.crash = CrashPoints::from_env();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| miette::miette!("cannot start the runtime: {e}"))?;
    let exec = Arc::new(Executor::new(
        Arc::new(store),
        fake.talos(),
        fake.kube(),
        SystemClock,
        cfg,
    ));
    let results = rt
        .block_on(exec.resume_all())
        .map_err(|e| miette::miette!("{e}"))?;
    let mut all_ok = true;
    for (job, r) in results {
        match r {
            Ok(RunOutcome::Succeeded) => println!("{job} succeeded"),
            Ok(other) => {
                all_ok = false;
                println!("{job} {other:?}");
            }
            Err(e) => {
                all_ok = false;
                println!("{job} error: {e}");
            }
        }
    }
    Ok(if all_ok { 0 } else { 1 })
}
