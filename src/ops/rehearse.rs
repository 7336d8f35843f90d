//! Rehearsing a plan on a twin (issue #36 item 4), and storing what it found.
//!
//! [`rehearse`] runs one cluster's part of a plan on a simulated twin of the cluster, in this
//! process and with compressed time: the twin ([`twin::build`]) from the observed cluster and
//! its census, the plan compressed ([`compress::compress`]) and pointed at the twin, a
//! [`SimCluster`] on loopback, its credentials in a temporary directory (0700), a temporary
//! fjall store holding the twin's cluster record and the job created as the daemon creates it
//! ([`create_jobs_txn`]), and the [`Executor`] driving it through the real adapters. The run is
//! bounded by progress, not by a wall clock: when the job's journal has not moved for
//! [`Settings::stall_factor`] times the longest compressed wait of the plan, the run is
//! stopped and the report says it did not end ([`Outcome::NotRun`]). A twin that cannot
//! start, or a job that cannot be created on it, is also `NotRun` with why: never a pass.
//!
//! A rehearsal report is stored under [`rehearsal_key`]`(plan, cluster)` in the plans table,
//! beside the plan's record and never in it: storing one never changes the plan, its id or
//! the current-plan pointer (design/rehearsal.md, "Storage").

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;

use crate::desired::window::MaintenanceWindow;
use crate::inventory::census::Census;
use crate::inventory::{ObservedCluster, cluster_key};
use crate::plan::estimate::History;
use crate::plan::stored::{CURRENT_KEY, CurrentPlan};
use crate::plan::{ClusterPlan, Plan, PlanId, Step};
use crate::rehearsal::report::{Outcome, Rehearsal, ReportMeta, rehearsal_key};
use crate::rehearsal::{compress, twin};
use crate::rollout::journal::{JournalEntry, entries_prefix};
use crate::rollout::{
    Executor, ExecutorConfig, JobId, JobInputs, JobState, RunOutcome, SystemClock, create_jobs_txn,
};
use crate::sim::cluster::{SimCluster, SimClusterConfig};
use crate::store::fjall::FjallStore;
use crate::store::{Record, Store, StoreError, StoreExt, Txn};

/// How a rehearsal runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// How much faster than real time the twin runs (60: a real minute per second).
    pub compression: u32,
    /// The executor's poll interval on the twin (and the adapters' retry pace).
    pub poll: Duration,
    /// The run is stopped when the journal has not moved for this many times the longest
    /// compressed wait of the plan ([`stall_bound`]).
    pub stall_factor: u32,
    /// A bound of no progress to use instead of [`stall_bound`]'s (`None`: computed).
    pub stall_bound: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            compression: 60,
            poll: Duration::from_millis(20),
            stall_factor: 4,
            stall_bound: None,
        }
    }
}

/// The real (uncompressed) durations a twin's nodes take when the cluster has no history:
/// an installer pull, a node away after its reboot until Ready, a pod starting, a pod
/// terminating (design/rehearsal.md, "Timings").
pub const DEFAULT_PULL: Duration = Duration::from_secs(60);
/// See [`DEFAULT_PULL`].
pub const DEFAULT_REBOOT: Duration = Duration::from_secs(180);
/// See [`DEFAULT_PULL`].
pub const DEFAULT_POD_START: Duration = Duration::from_secs(10);
/// See [`DEFAULT_PULL`].
pub const DEFAULT_POD_TERMINATION: Duration = Duration::from_secs(5);

/// What one rehearsal reads: the plan (its id), the cluster's part of it, and what the store
/// knows of the cluster.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The whole plan (its id names the report).
    pub plan: &'a Plan,
    /// The cluster's part of it.
    pub cluster: &'a ClusterPlan,
    /// The cluster as observed (the plan's basis).
    pub observed: &'a ObservedCluster,
    /// Its stored census, if any (`None`: the twin has its nodes only).
    pub census: Option<&'a Census>,
    /// Its last successful jobs (the twin's timings; empty: the defaults).
    pub history: &'a History,
    /// Its maintenance windows (a node predicted longer than the longest is a blocker).
    pub windows: &'a [MaintenanceWindow],
}

/// The median of `samples`, if any.
fn median(mut samples: Vec<Duration>) -> Option<Duration> {
    samples.sort();
    samples.get(samples.len() / 2).copied()
}

/// The twin's timings (compressed) from the cluster's history, and where they came from.
pub fn timings(history: &History, compression: u32) -> (twin::TwinTiming, String) {
    let phase = |name: &str| {
        median(
            history
                .jobs
                .iter()
                .flat_map(|j| j.phases.get(name).into_iter().flatten().copied())
                .collect(),
        )
    };
    let pull = phase("pull");
    let reboot = phase("reboot");
    let from = if pull.is_some() || reboot.is_some() {
        format!("history of {} job(s)", history.jobs.len())
    } else {
        "defaults".to_string()
    };
    let c = |d: Duration| compress::divide(d, compression);
    (
        twin::TwinTiming {
            reboot: c(reboot.unwrap_or(DEFAULT_REBOOT)),
            image_pull: c(pull.unwrap_or(DEFAULT_PULL)),
            pod_start: c(DEFAULT_POD_START),
            pod_termination: c(DEFAULT_POD_TERMINATION),
        },
        from,
    )
}

/// The longest the executor may wait on the twin without writing to the journal: the longest
/// compressed timeout of `plan` (a drain, a health wait, a volume detach, a hook) or a node's
/// pull plus reboot, whichever is longer, times `factor`; at least a second.
pub fn stall_bound(plan: &ClusterPlan, timing: &twin::TwinTiming, factor: u32) -> Duration {
    let mut longest = timing.reboot + timing.image_pull + timing.pod_start;
    for step in &plan.steps {
        match step {
            Step::Talos(t) => {
                let detach = Duration::from_secs(t.drain.volume_detach_timeout_secs.unwrap_or(0));
                longest = longest.max(t.drain_timeout + detach).max(t.health_timeout);
                if let Some(h) = &t.hooks {
                    longest = longest.max(longest_hook(h));
                }
            }
            Step::Kubernetes(k) => longest = longest.max(k.health_timeout),
        }
    }
    if let Some(h) = &plan.hooks {
        longest = longest.max(longest_hook(h));
    }
    (longest * factor.max(1)).max(Duration::from_secs(1))
}

/// Everything allowed, in every namespace the Job hooks of `plan` name: the twin's policy.
fn twin_hook_policy(plan: &ClusterPlan) -> crate::desired::hook_policy::HookPolicy {
    use crate::desired::hooks::{HookAction, HookPoint};
    let mut sets: Vec<&crate::desired::hooks::Hooks> = plan.hooks.iter().collect();
    for s in &plan.steps {
        if let crate::plan::Step::Talos(t) = s
            && let Some(h) = &t.hooks
        {
            sets.push(h);
        }
    }
    let namespaces = sets.into_iter().flat_map(|h| {
        HookPoint::ALL.into_iter().flat_map(|p| {
            h.at(p).iter().filter_map(|h| match &h.action {
                HookAction::Job { namespace, .. } => Some(namespace.clone()),
                HookAction::Http { .. } => None,
            })
        })
    });
    crate::desired::hook_policy::HookPolicy::permissive(namespaces)
}

/// The longest timeout of any of `hooks`.
fn longest_hook(hooks: &crate::desired::hooks::Hooks) -> Duration {
    crate::desired::hooks::HookPoint::ALL
        .iter()
        .flat_map(|p| hooks.at(*p).iter().map(|h| h.timeout))
        .max()
        .unwrap_or(Duration::ZERO)
}

/// A report that says the twin did not run, and why.
fn not_run(meta: ReportMeta, reason: String) -> Rehearsal {
    Rehearsal {
        plan: meta.plan,
        cluster: meta.cluster,
        ran_at: meta.ran_at,
        census_gathered_at: meta.census_gathered_at,
        compression: meta.compression.max(1),
        timings: meta.timings,
        waves: Vec::new(),
        outcome: Outcome::NotRun { reason },
        blockers: Vec::new(),
        limits: meta.limits,
    }
}

/// Rehearse `input` on a twin (see the module). Never fails: whatever keeps the twin from
/// running the plan to its end is the report's [`Outcome::NotRun`] with why. Must run inside
/// a multi-threaded tokio runtime (the twin's servers run beside the executor).
pub async fn rehearse(input: Input<'_>, settings: &Settings) -> Rehearsal {
    let factor = settings.compression.max(1);
    let (timing, timings_from) = timings(input.history, factor);
    let built = twin::build(input.observed, input.census, timing);
    let compressed = compress::compress(input.cluster, factor, &built.addresses);
    let mut limits = built.limits.clone();
    limits.extend(compressed.limits.iter().cloned());
    if !input.observed.rollouts_enabled {
        limits.push(
            "rollouts are disabled for this cluster: the twin ran as if they were enabled"
                .to_string(),
        );
    }
    if !input.windows.is_empty() {
        limits.push(
            "the twin runs outside the maintenance windows: each node's predicted time is checked against the longest window instead"
                .to_string(),
        );
    }
    let meta = ReportMeta {
        plan: input.plan.id.to_hex(),
        cluster: input.cluster.cluster.clone(),
        ran_at: Timestamp::now().to_string(),
        census_gathered_at: input
            .census
            .map(|c| c.gathered_at.clone())
            .unwrap_or_default(),
        compression: factor,
        timings: timings_from,
        limits,
        longest_window: input.windows.iter().map(MaintenanceWindow::duration).max(),
        not_ended: None,
    };
    let bound = settings
        .stall_bound
        .unwrap_or_else(|| stall_bound(&compressed.plan, &timing, settings.stall_factor));
    // 0700: the twin's PKI and store land in it (issue #49 item 5).
    let dir = match crate::private_file::private_tempdir("medea-rehearsal-") {
        Ok(d) => d,
        Err(e) => {
            return not_run(
                meta,
                format!(
                    "cannot create the twin's temporary directory: {}",
                    crate::error_chain(&e)
                ),
            );
        }
    };
    let twin_observed = twin::observed_twin(input.observed, &built).with_rollouts_enabled(true);
    let sim = match SimCluster::start(
        built.scenario.clone(),
        SimClusterConfig {
            extra_objects: built.objects.clone(),
            platform: false,
            ..SimClusterConfig::default()
        },
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            return not_run(
                meta,
                format!("the twin could not start: {}", crate::error_chain(&e)),
            );
        }
    };
    let run = run_on_twin(
        &sim,
        dir.path(),
        &input,
        &compressed.plan,
        &twin_observed,
        &built,
        settings,
        bound,
    )
    .await;
    sim.shutdown().await;
    let report = match run {
        Ok((job, entries, not_ended)) => {
            crate::rehearsal::report::build(ReportMeta { not_ended, ..meta }, &job, &entries)
        }
        Err(reason) => not_run(meta, reason),
    };
    // `dir` (the twin's credentials, its store, its snapshots) is removed here.
    drop(dir);
    report
}

/// The twin's job, run until it ends or stalls: the job in its last state, its journal, and
/// why it did not end (`None`: it ended). `Err`: it could not run at all, with why.
#[allow(clippy::too_many_arguments)]
async fn run_on_twin(
    sim: &SimCluster,
    dir: &Path,
    input: &Input<'_>,
    plan: &ClusterPlan,
    observed: &ObservedCluster,
    built: &twin::Twin,
    settings: &Settings,
    bound: Duration,
) -> Result<(crate::rollout::Job, Vec<JournalEntry>, Option<String>), String> {
    let cluster = plan.cluster.as_str();
    let creds = dir.join("creds");
    crate::private_file::private_dir(&creds, crate::private_file::ExistingDir::Keep).map_err(
        |e| {
            format!(
                "cannot create the twin's credentials directory: {}",
                crate::error_chain(&e)
            )
        },
    )?;
    sim.write_creds(&creds.join(cluster)).map_err(|e| {
        format!(
            "cannot write the twin's credentials: {}",
            crate::error_chain(&e)
        )
    })?;
    settle(sim, built, bound, settings.poll).await?;
    let store = Arc::new(
        FjallStore::open(&dir.join("store"))
            .map_err(|e| format!("cannot open the twin's store: {}", crate::error_chain(&e)))?,
    );
    let mut twin_plan = input.plan.clone();
    twin_plan.clusters = vec![Arc::new(plan.clone())];
    twin_plan.basis.observed = [(cluster.to_string(), observed.generation)].into();
    twin_plan.estimates = Vec::new();
    let store_err = |e: StoreError| format!("the twin's store: {}", crate::error_chain(&e));
    store
        .commit(
            Txn::new()
                .put_record(CURRENT_KEY, &CurrentPlan { id: twin_plan.id })
                .put_record(cluster_key(cluster), observed),
        )
        .map_err(store_err)?;
    let no_windows: &[MaintenanceWindow] = &[];
    let inputs = JobInputs {
        global_rollouts: true,
        clusters: [(cluster.to_string(), observed)].into(),
        windows: [(cluster.to_string(), no_windows)].into(),
        exclusions: Default::default(),
        backup_recipients: Default::default(),
    };
    let created = create_jobs_txn(&twin_plan, &inputs, Timestamp::now()).map_err(|e| {
        format!(
            "the job could not be created on the twin: {}",
            crate::error_chain(&e)
        )
    })?;
    let Some(job) = created.jobs.first().map(|j| j.id.clone()) else {
        return Err("the plan has no steps for this cluster".to_string());
    };
    store.commit(created.txn).map_err(store_err)?;
    let tick = settings.poll.max(Duration::from_millis(1));
    let (talos, kube) = crate::ops::cluster_ports::paced(&creds, cluster, tick)
        .await
        .map_err(|e| format!("cannot reach the twin: {}", crate::error_chain(&e)))?;
    let mut cfg = ExecutorConfig::new(true, dir.join("snapshots"));
    // The twin is a simulator: its Job hooks run nowhere real, so the server's hook policy
    // (checked when the revision was loaded, and again by the real executor) is not applied
    cfg.hook_policy = twin_hook_policy(plan);
    cfg.poll = tick;
    cfg.backoff_min = tick;
    cfg.backoff_max = tick * 8;
    cfg.max_sleep = tick * 8;
    let store_dyn: Arc<dyn Store> = store.clone();
    let exec = Executor::new(store_dyn, talos, kube, SystemClock, cfg);
    let max_entries = max_journal_entries(plan);
    let ran = async {
        loop {
            match exec.run(&job).await {
                Ok(RunOutcome::Succeeded | RunOutcome::Halted { .. }) => return None,
                // A closed gate: run again (a gate that never opens is a stall).
                Ok(RunOutcome::Paused { .. }) => tokio::time::sleep(tick).await,
                Err(e) => {
                    return Some(format!(
                        "the executor stopped on the twin: {}",
                        crate::error_chain(&e)
                    ));
                }
            }
        }
    };
    let bound_is = match settings.stall_bound {
        Some(_) => "the bound set".to_string(),
        None => format!(
            "{}× the plan's longest compressed wait",
            settings.stall_factor.max(1)
        ),
    };
    let watched = stalled(store.as_ref(), &job, bound, tick, max_entries, &bound_is);
    let not_ended = tokio::select! {
        r = ran => r,
        why = watched => Some(why),
    };
    drop(exec);
    let entries: Vec<JournalEntry> = store
        .scan_records::<JournalEntry>(&entries_prefix(&job))
        .map_err(store_err)?
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    let job_state = crate::ops::jobs::load_job(store.as_ref(), &job)
        .map_err(store_err)?
        .ok_or_else(|| format!("the twin's job {job} is not in its store"))?;
    // A job that ended between the watch's verdict and here did end.
    let not_ended = not_ended.filter(|_| matches!(job_state.state, JobState::Running));
    Ok((job_state, entries, not_ended))
}

/// At most this many journal entries per node of the plan (plus a base), a bound on a run that
/// keeps writing without ending.
const ENTRIES_PER_NODE: usize = 200;

fn max_journal_entries(plan: &ClusterPlan) -> usize {
    let nodes: usize = plan
        .steps
        .iter()
        .map(|s| match s {
            Step::Talos(t) => t.waves.iter().map(Vec::len).sum(),
            Step::Kubernetes(k) => k.control_plane.len() + k.workers.len(),
        })
        .sum();
    1_000 + ENTRIES_PER_NODE * nodes
}

/// Resolves (with why) once job `id`'s journal has not moved for `bound`, or has more than
/// `max_entries` entries; pending while it moves.
async fn stalled(
    store: &dyn Store,
    id: &JobId,
    bound: Duration,
    tick: Duration,
    max_entries: usize,
    bound_is: &str,
) -> String {
    let prefix = entries_prefix(id);
    let mut last: Option<usize> = None;
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        let seen = match store.scan_keys(<JournalEntry as Record>::TABLE, &prefix) {
            Ok(keys) => keys.len(),
            Err(e) => {
                return format!("cannot read the twin's journal: {}", crate::error_chain(&e));
            }
        };
        if seen > max_entries {
            return format!(
                "the run on the twin did not end: its journal passed {max_entries} entries"
            );
        }
        if last != Some(seen) {
            last = Some(seen);
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= bound {
            return format!(
                "the run on the twin did not end: its journal did not move for {} ms ({bound_is})",
                bound.as_millis(),
            );
        }
    }
}

/// Wait until the twin's pods are Ready and every PodDisruptionBudget counts its pods (the
/// simulator's disruption controller has run), so the first drain meets the cluster as the
/// census saw it. Bounded by `bound` of no change.
async fn settle(
    sim: &SimCluster,
    built: &twin::Twin,
    bound: Duration,
    tick: Duration,
) -> Result<(), String> {
    let pdbs: Vec<(String, String)> = built
        .objects
        .iter()
        .filter(|o| o["kind"] == "PodDisruptionBudget")
        .filter_map(|o| {
            Some((
                o["metadata"]["namespace"].as_str()?.to_string(),
                o["metadata"]["name"].as_str()?.to_string(),
            ))
        })
        .collect();
    let mut last = None;
    let mut since = tokio::time::Instant::now();
    loop {
        let pods = sim.kube.pods();
        let unready: Vec<String> = pods
            .iter()
            .filter(|p| !p.terminating && !p.mirror && !p.ready && p.node.is_some())
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        let uncounted: Vec<String> = pdbs
            .iter()
            .filter(|(ns, name)| {
                let status = sim
                    .kube
                    .get("policy/v1", "PodDisruptionBudget", ns, name)
                    .and_then(|p| p.get("status").cloned());
                let n =
                    |s: &Option<serde_json::Value>, f: &str| s.as_ref().and_then(|s| s[f].as_i64());
                n(&status, "expectedPods").is_none()
                    || n(&status, "currentHealthy") != n(&status, "expectedPods")
            })
            .map(|(ns, name)| format!("{ns}/{name}"))
            .collect();
        if unready.is_empty() && uncounted.is_empty() {
            return Ok(());
        }
        let left = (unready.len(), uncounted.len());
        if last != Some(left) {
            last = Some(left);
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= bound {
            return Err(format!(
                "the twin did not settle (no progress for {} ms): pods not Ready: [{}]; PodDisruptionBudgets not counting their pods: [{}]",
                bound.as_millis(),
                unready.join(", "),
                uncounted.join(", ")
            ));
        }
        tokio::time::sleep(tick).await;
    }
}

/// The rehearsal of every cluster of `plan` with steps, planned from `inventory` (the
/// inventory the plan was computed from), each with the census and job history `store` holds
/// for it (none without a store) and its windows from `desired`; one after another.
pub async fn rehearse_plan(
    store: Option<&dyn Store>,
    plan: &Plan,
    inventory: &crate::inventory::Inventory,
    desired: &crate::desired::Desired,
    settings: &Settings,
) -> Result<Vec<Rehearsal>, StoreError> {
    let jobs = match store {
        Some(s) => crate::ops::jobs::load_jobs(s)?,
        None => Vec::new(),
    };
    let mut out = Vec::new();
    for cp in plan.clusters.iter().filter(|c| !c.steps.is_empty()) {
        let name = cp.cluster.as_str();
        let Some(observed) = inventory.clusters.get(name) else {
            let meta = ReportMeta {
                plan: plan.id.to_hex(),
                cluster: name.to_string(),
                ran_at: Timestamp::now().to_string(),
                census_gathered_at: String::new(),
                compression: settings.compression.max(1),
                timings: "defaults".to_string(),
                limits: Vec::new(),
                longest_window: None,
                not_ended: None,
            };
            out.push(not_run(
                meta,
                format!("cluster {name} is not in the inventory the plan was computed from"),
            ));
            continue;
        };
        let (census, history) = match store {
            Some(s) => (
                s.get_record::<Census>(&crate::inventory::census::census_key(name))?,
                crate::ops::estimate::history(
                    s,
                    &jobs,
                    name,
                    &mut crate::ops::estimate::SamplesCache::new(),
                )?,
            ),
            None => (None, History::default()),
        };
        let windows = desired
            .clusters
            .get(name)
            .map(|c| c.windows.as_slice())
            .unwrap_or(&[]);
        out.push(
            rehearse(
                Input {
                    plan,
                    cluster: cp,
                    observed,
                    census: census.as_ref(),
                    history: &history,
                    windows,
                },
                settings,
            )
            .await,
        );
    }
    Ok(out)
}

/// Whether `plan` is stored (its record is in the plans table): only then is a report stored
/// beside it.
pub fn plan_is_stored(store: &dyn Store, plan: &PlanId) -> Result<bool, StoreError> {
    Ok(store
        .get(
            crate::store::Table::Plans,
            &crate::plan::stored::plan_key(plan),
        )?
        .is_some())
}

/// Store `report` under [`rehearsal_key`]`(report.plan, report.cluster)`, replacing an
/// earlier rehearsal of the same plan and cluster. `report.plan` is the plan's full id
/// ([`PlanId::to_hex`]).
pub fn store_report(store: &dyn Store, report: &Rehearsal) -> Result<(), StoreError> {
    store.commit(Txn::new().put_record(rehearsal_key(&report.plan, &report.cluster), report))
}

/// [`store_report`] fenced on the leader's term the rehearsal started in (the daemon's
/// `RehearsePlan`): a replica deposed while its twin ran has the write refused by the store,
/// like every other write of a leader's work.
pub fn store_report_fenced(
    store: &dyn Store,
    report: &Rehearsal,
    fence: &crate::store::Fence,
) -> Result<(), StoreError> {
    store.commit(
        Txn::new()
            .put_record(rehearsal_key(&report.plan, &report.cluster), report)
            .fenced(fence),
    )
}

/// The stored rehearsal of `plan` for `cluster`, if one was stored.
pub fn load_report(
    store: &dyn Store,
    plan: &PlanId,
    cluster: &str,
) -> Result<Option<Rehearsal>, StoreError> {
    store.get_record(&rehearsal_key(&plan.to_hex(), cluster))
}

/// The most operations a plan save may carry with its collected rehearsals (etcd refuses
/// transactions of more than 128 by default).
pub const MAX_SAVE_OPS: usize = 120;

/// The deletes of stored rehearsals whose plan is not among `live` (it was collected, or
/// never stored), at most `budget` of them: what a plan save collects beside the plans it
/// collects (`ops::replan`). Reports left over converge away over the next saves.
pub fn orphan_deletes(
    rehearsal_keys: &[String],
    live: &std::collections::BTreeSet<PlanId>,
    budget: usize,
) -> Vec<crate::store::Op> {
    rehearsal_keys
        .iter()
        .filter(|k| {
            let plan = k
                .strip_prefix(REHEARSAL_PREFIX)
                .and_then(|rest| rest.split_once('/'))
                .and_then(|(hex, _)| PlanId::parse_full(hex).ok());
            plan.is_none_or(|id| !live.contains(&id))
        })
        .take(budget)
        .map(|k| crate::store::Op::Delete(<Rehearsal as Record>::TABLE, k.clone()))
        .collect()
}

/// The prefix of every stored rehearsal's key ([`rehearsal_key`]).
pub const REHEARSAL_PREFIX: &str = "rehearsal/";

/// The keys of every stored rehearsal.
pub fn report_keys(store: &dyn Store) -> Result<Vec<String>, StoreError> {
    store.scan_keys(<Rehearsal as Record>::TABLE, REHEARSAL_PREFIX)
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

    /// The daemon's reports are written under the term the rehearsal started in: the solo
    /// term commits, a term the store does not hold (a deposed leader's) writes nothing.
    #[test]
    fn a_fenced_report_is_refused_under_a_term_that_is_not_the_stores() {
        use crate::store::{Fence, StoreError};
        let store = MemStore::new();
        let plan = PlanId::from_digest([3; 32]);
        let r = report(&plan, "prod");
        let deposed = Fence::new("a", 7);
        let err = store_report_fenced(&store, &r, &deposed).unwrap_err();
        assert!(matches!(err, StoreError::Fenced { term: 7, .. }), "{err}");
        assert_eq!(load_report(&store, &plan, "prod").unwrap(), None);
        let solo = Fence::new("a", crate::store::leader::SOLO_TERM);
        store_report_fenced(&store, &r, &solo).unwrap();
        assert_eq!(load_report(&store, &plan, "prod").unwrap(), Some(r));
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
        assert!(
            report_keys(&store)
                .unwrap()
                .iter()
                .all(|k| k.starts_with(REHEARSAL_PREFIX)),
            "the prefix is rehearsal_key's"
        );
    }

    #[test]
    fn reports_of_plans_no_longer_stored_are_collected_within_the_budget() {
        let store = MemStore::new();
        let live = PlanId::from_digest([1; 32]);
        let gone = PlanId::from_digest([2; 32]);
        for (plan, cluster) in [(live, "prod"), (gone, "prod"), (gone, "staging")] {
            store_report(&store, &report(&plan, cluster)).unwrap();
        }
        let keys = report_keys(&store).unwrap();
        assert_eq!(keys.len(), 3);
        let deletes = |budget| {
            orphan_deletes(&keys, &[live].into(), budget)
                .into_iter()
                .map(|op| match op {
                    crate::store::Op::Delete(crate::store::Table::Plans, k) => k,
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            deletes(10),
            [
                rehearsal_key(&gone.to_hex(), "prod"),
                rehearsal_key(&gone.to_hex(), "staging")
            ]
        );
        assert_eq!(deletes(1).len(), 1, "bounded");
        assert!(deletes(0).is_empty());
        assert_eq!(
            orphan_deletes(&keys, &[live, gone].into(), 10),
            Vec::new(),
            "every plan still stored"
        );
    }
}
