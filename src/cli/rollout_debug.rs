//! Hidden commands for the rollout crash harness: run the running jobs of a store in a child
//! process that the test kills at journal points, either against a persistent fake cluster
//! (`--fake-state`) or against a real API (a simulator) through the real adapters
//! (`--creds-dir` + `--cluster`).

use miette::{IntoDiagnostic as _, WrapErr as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

#[cfg(feature = "fakes")]
use crate::rollout::fake::FakeCluster;
use crate::rollout::ports::{HealthProbe, KubePort, TalosPort};
use crate::rollout::{
    CrashPoints, Executor, ExecutorConfig, JobId, RolloutError, RunOutcome, SystemClock,
};

#[derive(Debug, Args)]
pub struct RolloutRunArgs {
    /// The store directory holding the jobs.
    #[arg(long)]
    pub store: PathBuf,
    /// The persistent fake cluster (JSON state written by `FakeCluster::save`).
    #[arg(long)]
    pub fake_state: Option<PathBuf>,
    /// Cluster credentials as <creds-dir>/<cluster>/{talosconfig,kubeconfig}: run the jobs of
    /// `--cluster` through the real Talos and Kubernetes adapters (e.g. against `medea sim`).
    #[arg(long)]
    pub creds_dir: Option<PathBuf>,
    /// The cluster whose jobs run (with `--creds-dir`).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Where etcd snapshots go (default: `<store>/../snapshots`).
    #[arg(long)]
    pub snapshots: Option<PathBuf>,
    /// The global rollouts gate.
    #[arg(long)]
    pub rollouts: bool,
    /// Poll interval and backoff base, in milliseconds (also the adapters' retry base).
    #[arg(long, default_value_t = 0)]
    pub poll_ms: u64,
}

enum Target {
    Fake(PathBuf),
    Creds { dir: PathBuf, cluster: String },
}

/// Run the running jobs to the end. Crash points come from `MEDEA_CRASH_AT` /
/// `MEDEA_CRASH_BEFORE`. Prints one `<job> <outcome>` line per job; exit 0 when all succeeded.
pub fn rollout_run(args: RolloutRunArgs) -> miette::Result<u8> {
    let target = match (&args.fake_state, &args.creds_dir, &args.cluster) {
        (Some(f), None, None) => Target::Fake(f.clone()),
        (None, Some(dir), Some(cluster)) => Target::Creds {
            dir: dir.clone(),
            cluster: cluster.clone(),
        },
        (None, None, None) => {
            return Err(miette::miette!(
                "no cluster to run against: pass --fake-state <file>, or --creds-dir <dir> with --cluster <name>"
            ));
        }
        _ => {
            return Err(miette::miette!(
                "pass either --fake-state <file> or --creds-dir <dir> with --cluster <name> (both --creds-dir and --cluster, and not with --fake-state)"
            ));
        }
    };
    let snapshots = args.snapshots.clone().unwrap_or_else(|| {
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
        .into_diagnostic()
        .wrap_err("cannot start the runtime")?;
    match target {
        #[cfg(feature = "fakes")]
        Target::Fake(path) => {
            let fake = FakeCluster::persistent(&path)
                .into_diagnostic()
                .wrap_err_with(|| format!("cannot load the fake cluster `{}`", path.display()))?;
            let probe = crate::rollout::fake::FakeProbe(fake.clone());
            drive(&rt, &args, cfg, fake.talos(), fake.kube(), probe, None)
        }
        #[cfg(not(feature = "fakes"))]
        Target::Fake(path) => Err(miette::miette!(
            "cannot load the fake cluster `{}`: --fake-state needs a medea built with the `fakes` feature (cargo build --features fakes)",
            path.display()
        )),
        Target::Creds { dir, cluster } => {
            // the adapters are built (credentials read) before the store is touched
            let (talos, kube, probe) = rt
                .block_on(async {
                    let (talos, kube) =
                        crate::ops::cluster_ports::paced(&dir, &cluster, tick).await?;
                    // the same probes as `medea serve`: each gate uses the approved plan's
                    // Prometheus/Alertmanager sources, workloads gates this cluster's kubeconfig
                    let probe = crate::ops::cluster_ports::health_probes(
                        &dir,
                        &cluster,
                        crate::plan::health::HealthSources::default(),
                    )
                    .await?;
                    Ok::<_, crate::ops::cluster_ports::AdapterError>((talos, kube, probe))
                })
                .map_err(miette::Report::from_err)?;
            drive(&rt, &args, cfg, talos, kube, probe, Some(&cluster))
        }
    }
}

fn drive<T: TalosPort + 'static, K: KubePort + 'static, H: HealthProbe + 'static>(
    rt: &tokio::runtime::Runtime,
    args: &RolloutRunArgs,
    cfg: ExecutorConfig,
    talos: T,
    kube: K,
    probe: H,
    cluster: Option<&str>,
) -> miette::Result<u8> {
    let store = super::store::open_dir(&args.store, "run it again")?;
    let exec =
        Arc::new(Executor::new(Arc::new(store), talos, kube, SystemClock, cfg).with_probe(probe));
    let results: Vec<(JobId, Result<RunOutcome, RolloutError>)> = rt
        .block_on(async {
            match cluster {
                None => exec.resume_all().await,
                // adapters talk to one cluster: run that cluster's jobs only
                Some(c) => {
                    let mut out = Vec::new();
                    for job in exec.running_jobs()? {
                        if job.cluster == c {
                            let r = exec.run(&job.id).await;
                            out.push((job.id, r));
                        }
                    }
                    Ok(out)
                }
            }
        })
        .into_diagnostic()?;
    let mut all_ok = true;
    for (job, r) in results {
        match r {
            Ok(RunOutcome::Succeeded) => outln!("{job} succeeded"),
            Ok(other) => {
                all_ok = false;
                outln!("{job} {other:?}");
            }
            Err(e) => {
                all_ok = false;
                outln!("{job} error: {e}");
            }
        }
    }
    Ok(if all_ok { 0 } else { 1 })
}
