//! Rollout jobs on the API (list, watch, halt) and the executor host that runs them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use super::Shared;
use crate::Locked as _;
use crate::api::pb;
use crate::health::Probes;
use crate::rollout::executor::{
    EventState, Executor, ExecutorConfig, RolloutEvent, RunOutcome, SystemClock,
};
use crate::rollout::journal::{Entry, JournalEntry};
use crate::rollout::ports::{HealthProbe, KubePort, TalosPort};
use crate::rollout::sequencer::{
    CommandOutcome, Job, JobState, NodePhase, NodeProgress, RollbackPhase, StepKind, StepState,
    TaskState,
};
use crate::store::StoreError;

/// Where the executor gets a cluster's ports (the trait and the real factory are the
/// application layer's, `ops::cluster_ports`).
pub use crate::ops::cluster_ports::{CredsPorts, PortFactory};

/// Every job in the store, newest first.
pub fn jobs(shared: &Shared) -> Result<Vec<Job>, StoreError> {
    let mut jobs: Vec<Job> = crate::ops::jobs::load_jobs(shared.store.as_ref())?;
    jobs.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    Ok(jobs)
}

/// The serde name of a phase (`cordoned`, `volume-detach`): what the API has always said.
fn serde_name(p: impl serde::Serialize) -> String {
    serde_json::to_value(p)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A node's state as the API shows it (`NodeProgress.state`), a value before it is text: the
/// server decides it from the job's typed phases, and the wire keeps the strings API clients
/// have always seen (the phases' serde names, lowercase; issue #50 item 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeState {
    /// In its Talos phase (`pending`, `cordoned`, `rebooting`, `done`, …).
    Phase(NodePhase),
    /// Installed ahead, not rebooted yet: any reboot boots `boots` (`cordoned, staged: any
    /// reboot boots v1.11.3`).
    Staged {
        /// Its Talos phase.
        phase: NodePhase,
        /// The version its next boot runs.
        boots: String,
    },
    /// Being rolled back (`rolling-back:cordoned`).
    RollingBack(RollbackPhase),
    /// Rolled back (`rolled-back`).
    RolledBack,
    /// A node of a Kubernetes step: `done` when every task is, else `<done>/<total> tasks`.
    Tasks {
        /// Tasks done.
        done: usize,
        /// Its tasks.
        total: usize,
    },
}

impl NodeState {
    /// The state of a node of a Talos step that goes to `to`.
    pub fn of(n: &NodeProgress, to: &str) -> NodeState {
        match n.rollback {
            // installed ahead, not rebooted yet: what its next boot does
            None if n.staging.as_ref().is_some_and(|s| s.staged())
                && !matches!(
                    n.phase,
                    NodePhase::Rebooting | NodePhase::Back | NodePhase::Done
                ) =>
            {
                NodeState::Staged {
                    phase: n.phase,
                    boots: to.to_string(),
                }
            }
            None => NodeState::Phase(n.phase),
            Some(RollbackPhase::Done) => NodeState::RolledBack,
            Some(p) => NodeState::RollingBack(p),
        }
    }
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeState::Phase(p) => f.write_str(&serde_name(p)),
            NodeState::Staged { phase, boots } => {
                write!(f, "{}, staged: any reboot boots {boots}", serde_name(phase))
            }
            NodeState::RollingBack(p) => write!(f, "rolling-back:{}", serde_name(p)),
            NodeState::RolledBack => f.write_str("rolled-back"),
            NodeState::Tasks { done, total } if done == total => f.write_str("done"),
            NodeState::Tasks { done, total } => write!(f, "{done}/{total} tasks"),
        }
    }
}

/// What each running job waits for, as its executor last said (the `waiting` events carry it,
/// the journal does not): kept from the events this replica's executors send, dropped when the
/// job acts again or ends.
#[derive(Default)]
pub struct Waits(Mutex<BTreeMap<String, Wait>>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    pub reason: String,
    /// What a person need not read (the transport error of a node down for its reboot).
    pub detail: Option<String>,
    pub since: jiff::Timestamp,
}

impl Waits {
    /// Take note of an event of a job.
    pub fn observe(&self, e: &RolloutEvent, now: jiff::Timestamp) {
        let mut map = self.0.locked();
        let job = e.job.to_string();
        let (reason, detail) = match &e.state {
            EventState::Waiting { reason, detail } => (reason.clone(), detail.clone()),
            EventState::Paused { gate } => (format!("paused: {gate}"), None),
            // Acting again, or ended: no longer waiting.
            EventState::Intended { .. } | EventState::Halted { .. } | EventState::Succeeded => {
                map.remove(&job);
                return;
            }
            // Notes and gate evaluations come while it waits, too.
            _ => return,
        };
        // the same wait keeps its start; its detail is the latest
        let since = match map.get(&job) {
            Some(w) if w.reason == reason => w.since,
            _ => now,
        };
        map.insert(
            job,
            Wait {
                reason,
                detail,
                since,
            },
        );
    }

    #[allow(clippy::expect_used, reason = "as in observe")]
    pub fn get(&self, job: &str) -> Option<Wait> {
        self.0.locked().get(job).cloned()
    }
}

/// The API view of a job, with what it waits for when this replica knows.
pub fn rollout_view(job: &Job, waits: &Waits) -> pb::Rollout {
    let mut r = rollout_pb(job);
    if !job.state.is_terminal()
        && let Some(w) = waits.get(&r.job_id)
    {
        r.waiting_for = w.reason;
        r.waiting_detail = w.detail.unwrap_or_default();
        r.waiting_since = w.since.to_string();
    }
    r
}

/// The API view of a job.
pub fn rollout_pb(job: &Job) -> pb::Rollout {
    let (state, halt_reason, halt_code) = match &job.state {
        JobState::Running => ("running", String::new(), String::new()),
        JobState::Halted { reason, .. } => (
            "halted",
            reason.to_string(),
            reason.code().as_str().to_string(),
        ),
        JobState::Succeeded { .. } => ("succeeded", String::new(), String::new()),
    };
    let mut nodes = Vec::new();
    let mut current_step = String::new();
    for (i, step) in job.steps.iter().enumerate() {
        let label = match &step.kind {
            StepKind::Talos(t) => format!(
                "talos {} → {} (pool {})",
                t.nodes
                    .first()
                    .map(|n| n.target.from.to_string())
                    .unwrap_or_default(),
                t.rollout.to,
                t.rollout.pool
            ),
            StepKind::Kubernetes(k) => format!("kubernetes {} → {}", k.rollout.from, k.rollout.to),
        };
        if step.state == StepState::Running && current_step.is_empty() {
            current_step = format!("step {}: {label}", i + 1);
        }
        match &step.kind {
            StepKind::Talos(t) => {
                for n in &t.nodes {
                    nodes.push(pb::NodeProgress {
                        node: n.target.node.clone(),
                        pool: t.rollout.pool.clone(),
                        step: format!("{}", i + 1),
                        state: NodeState::of(n, &t.rollout.to.to_string()).to_string(),
                    });
                }
            }
            StepKind::Kubernetes(k) => {
                let mut per_node: BTreeMap<String, (usize, usize)> = BTreeMap::new();
                for t in k.tasks.list() {
                    let e = per_node.entry(t.node.node.clone()).or_default();
                    e.1 += 1;
                    if t.state == TaskState::Done {
                        e.0 += 1;
                    }
                }
                for (node, (done, total)) in per_node {
                    nodes.push(pb::NodeProgress {
                        node,
                        pool: String::new(),
                        step: format!("{}", i + 1),
                        state: NodeState::Tasks { done, total }.to_string(),
                    });
                }
            }
        }
    }
    // one count everywhere (issue #52): node upgrades, the rows above
    let upgrades = job.node_upgrades();
    let (gate_point, soak_ends_at) = match &job.gates.current {
        Some(run) if !job.state.is_terminal() => (
            run.point.to_string(),
            run.soak_ends().map(|t| t.to_string()).unwrap_or_default(),
        ),
        _ => (String::new(), String::new()),
    };
    let gates = job
        .gates
        .evidence
        .iter()
        .map(|r| pb::GateResult {
            gate: r.evaluation.gate.clone(),
            point: r.point.to_string(),
            verdict: r.evaluation.verdict.as_str().into(),
            dry_run: r.evaluation.dry_run,
            detail: r.evaluation.detail.clone(),
            at: r.at.to_string(),
            samples: r
                .evaluation
                .samples
                .iter()
                .map(|s| pb::GateSample {
                    labels: s.labels.clone().into_iter().collect(),
                    value: s.value.clone(),
                })
                .collect(),
        })
        .collect();
    pb::Rollout {
        gate_point,
        soak_ends_at,
        gates,
        job_id: job.id.to_string(),
        plan_id: job.plan.to_hex(),
        cluster: job.cluster.clone(),
        state: state.into(),
        halt_reason,
        halt_code,
        nodes_total: upgrades.total as u32,
        nodes_done: upgrades.done as u32,
        current_step,
        created_at: job.created_at.to_string(),
        nodes,
        waiting_for: String::new(),
        waiting_since: String::new(),
        waiting_detail: String::new(),
        predicted_median_seconds: job.predicted.map_or(0, |p| p.median_secs),
        predicted_pessimistic_seconds: job.predicted.map_or(0, |p| p.pessimistic_secs),
        ended_at: match &job.state {
            JobState::Succeeded { at } | JobState::Halted { at, .. } => at.to_string(),
            JobState::Running => String::new(),
        },
        active_seconds: job.clock.at(clock_end(job)).active().as_secs(),
        started_at: job
            .clock
            .started_at
            .map(|t| t.to_string())
            .unwrap_or_default(),
        paused_since: match job.clock.at(clock_end(job)) {
            crate::rollout::sequencer::ClockReading::Paused { since, .. } => since.to_string(),
            _ => String::new(),
        },
    }
}

/// Where a job's clock is read: its end, or now while it runs.
fn clock_end(job: &Job) -> jiff::Timestamp {
    match &job.state {
        JobState::Succeeded { at } | JobState::Halted { at, .. } => *at,
        JobState::Running => jiff::Timestamp::now(),
    }
}

pub fn event_pb(e: &RolloutEvent) -> pb::RolloutEvent {
    let (state, message) = (e.state.name().to_string(), e.state.message());
    pb::RolloutEvent {
        job_id: e.job.to_string(),
        cluster: e.cluster.clone(),
        pool: e.pool.clone().unwrap_or_default(),
        node: e.node.clone().unwrap_or_default(),
        step: e.op.map(|o| o.name().to_string()).unwrap_or_default(),
        state,
        message,
        at: jiff::Timestamp::now().to_string(),
        step_number: e.step.map_or(0, |s| s as u32 + 1),
        steps_total: e.steps as u32,
        image: e.image.clone().unwrap_or_default(),
        detail: e.state.detail().unwrap_or_default().to_string(),
        halt_code: match &e.state {
            EventState::Halted { reason } => reason.code().as_str().to_string(),
            _ => String::new(),
        },
    }
}

/// A job's journal told again as the events its executor sent, each at the time it was
/// journaled (`rollout status -w` shows them before following, like `kubectl logs -f`). Notes
/// go out where the executor sends them (before an intent, with a progress), so a replayed line
/// reads like the live one; a finished job ends with its terminal event. What the job waits for
/// is not journaled: [`Waits`] has it.
pub fn journal_events(job: &Job, entries: &[JournalEntry]) -> Vec<pb::RolloutEvent> {
    // The step of events without a command key: the one the journal was last in.
    let current = std::cell::Cell::new(None::<usize>);
    let event = |step: Option<usize>,
                 node: Option<String>,
                 op: Option<crate::rollout::sequencer::CommandOp>,
                 image: Option<String>,
                 state: EventState,
                 at: jiff::Timestamp| {
        if step.is_some() {
            current.set(step);
        }
        let step = step.or(current.get());
        let mut e = event_pb(&RolloutEvent {
            job: job.id.clone(),
            cluster: job.cluster.clone(),
            step,
            pool: step
                .and_then(|s| job.steps.get(s))
                .and_then(|s| s.pool())
                .map(str::to_string),
            node,
            op,
            state,
            steps: job.steps.len(),
            image,
        });
        e.at = at.to_string();
        e
    };
    let notes = |e: &JournalEntry, out: &mut Vec<pb::RolloutEvent>| {
        for n in &e.notes {
            // `step <index> started` (0-based) moves the replay into that step.
            if let Some(i) = n
                .strip_prefix("step ")
                .and_then(|r| r.strip_suffix(" started"))
                .and_then(|i| i.parse::<usize>().ok())
            {
                current.set(Some(i));
            }
            out.push(event(
                None,
                None,
                None,
                None,
                EventState::Progress { note: n.clone() },
                e.at,
            ));
        }
    };
    let mut out = Vec::new();
    for e in entries {
        match &e.entry {
            Entry::Created { plan } => out.push(event(
                None,
                None,
                None,
                None,
                EventState::Progress {
                    note: format!("job created from plan {}", plan.short()),
                },
                e.at,
            )),
            Entry::Intent { key, action } => {
                notes(e, &mut out);
                out.push(event(
                    Some(key.step),
                    key.node.clone(),
                    Some(key.op),
                    action.image().map(str::to_string),
                    EventState::Intended {
                        attempt: key.attempt,
                    },
                    e.at,
                ));
            }
            Entry::Result { key, outcome } => {
                let state = match outcome {
                    CommandOutcome::Transient { error } | CommandOutcome::Installing { error } => {
                        EventState::Unknown {
                            error: error.clone(),
                        }
                    }
                    CommandOutcome::Failed { error, .. } => {
                        // The executor sends no event of its own for a definitive failure (the
                        // retry or the halt follows); the journal has it.
                        let mut ev = event(
                            Some(key.step),
                            key.node.clone(),
                            Some(key.op),
                            None,
                            EventState::Done,
                            e.at,
                        );
                        ev.state = "failed".into();
                        ev.message = error.clone();
                        out.push(ev);
                        continue;
                    }
                    CommandOutcome::Drain {
                        result: crate::rollout::ports::DrainOutcome::Blocked { pdb, pod, .. },
                    } => EventState::Waiting {
                        reason: format!(
                            "drain blocked: pod {pod} (PodDisruptionBudget {pdb}), retrying"
                        ),
                        detail: None,
                    },
                    _ => EventState::Done,
                };
                out.push(event(
                    Some(key.step),
                    key.node.clone(),
                    Some(key.op),
                    None,
                    state,
                    e.at,
                ));
            }
            Entry::Progress => notes(e, &mut out),
            Entry::HaltRequested { by } => out.push(event(
                None,
                None,
                None,
                None,
                EventState::Progress {
                    note: format!("halt requested by {by}"),
                },
                e.at,
            )),
            Entry::ResumeRequested { by } => out.push(event(
                None,
                None,
                None,
                None,
                EventState::Progress {
                    note: format!("resumed by {by}"),
                },
                e.at,
            )),
            Entry::Gates { point, evaluations } => {
                for evaluation in evaluations {
                    out.push(event(
                        None,
                        None,
                        None,
                        None,
                        EventState::GateEvaluated {
                            point: point.clone(),
                            evaluation: evaluation.clone(),
                        },
                        e.at,
                    ));
                }
            }
        }
    }
    match &job.state {
        JobState::Halted { reason, at, .. } => out.push(event(
            None,
            None,
            None,
            None,
            EventState::Halted {
                reason: reason.clone(),
            },
            *at,
        )),
        JobState::Succeeded { at } => {
            out.push(event(None, None, None, None, EventState::Succeeded, *at))
        }
        JobState::Running => {}
    }
    out
}

/// A job and its journal, oldest entry first.
pub fn job_and_journal(
    shared: &Shared,
    id: &crate::rollout::sequencer::JobId,
) -> Result<Option<(Job, Vec<JournalEntry>)>, StoreError> {
    use crate::store::StoreExt;
    let Some(job) = crate::ops::jobs::load_job(shared.store.as_ref(), id)? else {
        return Ok(None);
    };
    let entries = shared
        .store
        .scan_records::<JournalEntry>(&crate::rollout::journal::entries_prefix(id))?
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    Ok(Some((job, entries)))
}

/// Runs every running job, one task per job, each with an executor for its cluster. Woken by
/// the change counter (approval reached quorum, gate opened, halt requested).
pub async fn executor_loop<F: PortFactory>(
    shared: Arc<Shared>,
    factory: Arc<F>,
    cfg: ExecutorConfig,
) {
    let running: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let mut changes = shared.subscribe_changes();
    let rescan = rescan_interval(cfg.poll);
    let executors: Arc<
        tokio::sync::Mutex<BTreeMap<String, Arc<Executor<F::Talos, F::Kube, SystemClock, Probes>>>>,
    > = Arc::default();
    let task = shared.tasks.register(
        "executor",
        "lists the running jobs and runs each (leader, rollouts gate on)",
    );
    loop {
        if shared.rollouts_gate && shared.leadership.is_leader() {
            task.started();
            let listed = jobs(&shared);
            task.finished(listed.as_ref().err().map(|e| crate::error_chain(e)));
            match listed {
                Ok(all) => {
                    set_job_gauges(&all);
                    // a job that is over but left pacing taints runs again to remove them
                    let active: Vec<Job> = all
                        .into_iter()
                        .filter(|j| {
                            !j.state.is_terminal() || crate::rollout::sequencer::cleanup_pending(j)
                        })
                        .collect();
                    for job in active {
                        let id = job.id.to_string();
                        if !running.locked().insert(id.clone()) {
                            continue;
                        }
                        let (shared, factory, cfg, running, executors) = (
                            shared.clone(),
                            factory.clone(),
                            cfg.clone(),
                            running.clone(),
                            executors.clone(),
                        );
                        tokio::spawn(async move {
                            let exec = {
                                let mut map = executors.lock().await;
                                match map.get(&job.cluster) {
                                    Some(e) => Some(e.clone()),
                                    None => match ports_and_probe(&*factory, &job.cluster).await {
                                        Ok((t, k, probe)) => {
                                            let e = Arc::new(
                                                Executor::new(
                                                    shared.store.clone(),
                                                    t,
                                                    k,
                                                    SystemClock,
                                                    cfg.clone(),
                                                )
                                                .with_probe(probe)
                                                .with_fence(Arc::new(LeaderFence(
                                                    shared.leadership.clone(),
                                                ))),
                                            );
                                            forward_events(&shared, &e);
                                            map.insert(job.cluster.clone(), e.clone());
                                            Some(e)
                                        }
                                        Err(e) => {
                                            // The log line is the edge: the whole chain, flattened.
                                            tracing::warn!(cluster = %job.cluster, job = %job.id, error = %crate::error_chain(&e), "cannot reach the cluster; the job waits");
                                            None
                                        }
                                    },
                                }
                            };
                            if let Some(exec) = &exec
                                && job.state.is_terminal()
                            {
                                // only its pacing taints to remove: no start, no second report
                                if let Err(e) = exec.run(&job.id).await {
                                    tracing::warn!(job = %job.id, error = %crate::error_chain(&e), "removing the job's pacing taints stopped");
                                }
                            } else if let Some(exec) = exec {
                                notify_start(&shared, &job);
                                let run = exec.run(&job.id);
                                tokio::pin!(run);
                                let result = run_watching_overdue(&shared, &job, run).await;
                                match result {
                                    Ok(outcome) => report(&shared, &job, &outcome),
                                    Err(e) => {
                                        tracing::warn!(job = %job.id, error = %crate::error_chain(&e), "job stopped")
                                    }
                                }
                            }
                            running.locked().remove(&id);
                        });
                    }
                }
                Err(e) => tracing::warn!(error = %crate::error_chain(&e), "cannot list jobs"),
            }
        }
        // A job created by another replica (a follower's reconcile recording the approval
        // that reached quorum) bumps nothing here: list again now and then, too.
        task.next_run_in(rescan);
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(rescan) => {}
        }
    }
}

/// A cluster's ports and health probes.
async fn ports_and_probe<F: PortFactory>(
    factory: &F,
    cluster: &str,
) -> Result<(F::Talos, F::Kube, Probes), crate::ops::cluster_ports::AdapterError> {
    let (t, k) = factory.ports(cluster).await?;
    let probe = factory.probe(cluster).await?;
    Ok((t, k, probe))
}

/// How often the leader lists jobs without a local change: from the job poll interval, at
/// least 1s and at most 10s.
fn rescan_interval(poll: std::time::Duration) -> std::time::Duration {
    poll.clamp(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(10),
    )
}

/// `medea_rollout_jobs{state}`: every job in the store by state (each state always present).
fn set_job_gauges(all: &[Job]) {
    for (name, n) in job_counts(all) {
        crate::metrics::set_jobs(name, n);
    }
    crate::metrics::set_rollouts(&rollout_gauges(all));
    crate::metrics::set_job_predicted(
        &all.iter()
            .filter(|j| j.state == JobState::Running)
            .filter_map(|j| {
                j.predicted
                    .map(|p| (j.cluster.clone(), p.median_secs, p.pessimistic_secs))
            })
            .collect::<Vec<_>>(),
    );
}

/// Per cluster: the running job's start and machines done per pool, and whether the newest
/// job halted (what deploy/'s dashboard and alert rules read).
fn rollout_gauges(all: &[Job]) -> crate::metrics::RolloutGauges {
    use crate::rollout::sequencer::StepKind;
    let mut g = crate::metrics::RolloutGauges::default();
    let mut newest: BTreeMap<&str, &Job> = BTreeMap::new();
    for j in all {
        let e = newest.entry(j.cluster.as_str()).or_insert(j);
        if j.created_at > e.created_at {
            *e = j;
        }
        if j.state != JobState::Running {
            continue;
        }
        g.started
            .push((j.cluster.clone(), j.created_at.as_second()));
        let reading = j.clock.at(jiff::Timestamp::now());
        g.clock.push((
            j.cluster.clone(),
            (
                i64::try_from(reading.active().as_secs()).unwrap_or(i64::MAX),
                !reading.running(),
            ),
        ));
        let mut pools: BTreeMap<String, (i64, i64)> = BTreeMap::new();
        for step in &j.steps {
            if let StepKind::Talos(t) = &step.kind {
                let e = pools.entry(t.rollout.pool.clone()).or_default();
                for n in &t.nodes {
                    e.1 += 1;
                    e.0 += i64::from(n.phase.finished());
                }
            }
        }
        g.nodes.extend(
            pools
                .into_iter()
                .map(|(pool, c)| ((j.cluster.clone(), pool), c)),
        );
    }
    g.halted = newest
        .into_iter()
        .map(|(c, j)| {
            (
                c.to_string(),
                i64::from(matches!(j.state, JobState::Halted { .. })),
            )
        })
        .collect();
    g
}

fn job_counts(all: &[Job]) -> [(&'static str, i64); 3] {
    let mut counts = [("running", 0), ("halted", 0), ("succeeded", 0)];
    for j in all {
        let i = match j.state {
            JobState::Running => 0,
            JobState::Halted { .. } => 1,
            JobState::Succeeded { .. } => 2,
        };
        counts[i].1 += 1;
    }
    counts
}

/// Forward an executor's events to the server's broadcast (watch API), logs, metrics, webhooks.
fn forward_events<T: TalosPort + 'static, K: KubePort + 'static, H: HealthProbe>(
    shared: &Arc<Shared>,
    exec: &Arc<Executor<T, K, SystemClock, H>>,
) {
    let mut rx = exec.subscribe();
    let shared = shared.clone();
    tokio::spawn(async move {
        let mut started: BTreeMap<(String, String), std::time::Instant> = BTreeMap::new();
        while let Some(e) = next_event(&mut rx).await {
            if let EventState::GateEvaluated { point, evaluation } = &e.state {
                use crate::rollout::ports::GateVerdict;
                crate::metrics::gate_evaluation(
                    &e.cluster,
                    &evaluation.gate,
                    evaluation.verdict.as_str(),
                    evaluation.dry_run,
                );
                let kind = match evaluation.verdict {
                    GateVerdict::Pass => None,
                    GateVerdict::Fail => Some((crate::webhook::EventKind::GateFailed, "failed")),
                    GateVerdict::Inconclusive => Some((
                        crate::webhook::EventKind::GateInconclusive,
                        "could not be evaluated",
                    )),
                };
                if let Some((kind, what)) = kind {
                    shared.notifier.send(note(
                        kind,
                        &e,
                        format!(
                            "medea: health gate `{}`{} {what} {point} ({}, job {})",
                            evaluation.gate,
                            if evaluation.dry_run {
                                " (dry run: not blocking)"
                            } else {
                                ""
                            },
                            e.cluster,
                            e.job
                        ),
                        Some(evaluation.detail.clone()),
                    ));
                }
            }
            if let EventState::Paused {
                gate: crate::rollout::executor::Gate::Inconclusive { gate, point },
            } = &e.state
            {
                tracing::warn!(job = %e.job, cluster = %e.cluster, gate = %gate, point = %point, "job paused by an inconclusive health gate");
                shared.notifier.send(note(
                    crate::webhook::EventKind::RolloutPaused,
                    &e,
                    format!(
                        "medea: rollout {} of cluster {} PAUSED: health gate `{gate}` could not tell {point}; `medea rollout resume {}` continues",
                        e.job, e.cluster, e.job
                    ),
                    None,
                ));
            }
            if let EventState::RebootedExternally { boots, .. } = &e.state {
                tracing::warn!(job = %e.job, cluster = %e.cluster, node = e.node.as_deref().unwrap_or("-"), boots = %boots, "a staged node rebooted outside medea");
                shared.notifier.send(note(
                    crate::webhook::EventKind::NodeRebootedExternally,
                    &e,
                    format!(
                        "medea: staged node {} rebooted outside medea and booted {boots} ({}, job {}); medea verifies it and does not upgrade it again",
                        e.node.as_deref().unwrap_or("-"),
                        e.cluster,
                        e.job
                    ),
                    None,
                ));
            }
            let op = e.op.map(|o| o.name()).unwrap_or("-");
            tracing::info!(job = %e.job, cluster = %e.cluster, pool = e.pool.as_deref().unwrap_or("-"), node = e.node.as_deref().unwrap_or("-"), step = op, state = e.state.name(), detail = %e.state.message(), "rollout step");
            shared.waits.observe(&e, jiff::Timestamp::now());
            if let (Some(node), Some(o)) = (&e.node, e.op) {
                let key = (node.clone(), o.name().to_string());
                match &e.state {
                    EventState::Intended { .. } => {
                        started.insert(key, std::time::Instant::now());
                    }
                    EventState::Done => {
                        if let Some(t) = started.remove(&key) {
                            // a pull made ahead of the node's turn is its pull step
                            let step = match o {
                                crate::rollout::sequencer::CommandOp::PullAhead => "pull",
                                o => o.name(),
                            };
                            crate::metrics::observe_step(
                                &e.cluster,
                                e.pool.as_deref().unwrap_or(""),
                                step,
                                t.elapsed(),
                            );
                        }
                        if o == crate::rollout::sequencer::CommandOp::Uncordon {
                            shared.refresh_kick.notify_one();
                            shared.notifier.send(note(
                                crate::webhook::EventKind::NodeDone,
                                &e,
                                format!(
                                    "medea: {} upgraded and back in service ({})",
                                    node, e.cluster
                                ),
                                None,
                            ));
                        }
                    }
                    _ => {}
                }
            }
            let _ = shared.events.send(e);
        }
    });
}

/// The next event; a receiver that fell behind skips what it missed (logged) instead of
/// stopping, so logs, metrics and webhooks go on. `None` once the executor is gone.
async fn next_event<T: Clone>(rx: &mut tokio::sync::broadcast::Receiver<T>) -> Option<T> {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match rx.recv().await {
            Ok(e) => return Some(e),
            Err(RecvError::Lagged(n)) => {
                tracing::warn!(
                    missed = n,
                    "rollout events came faster than they were forwarded; some were skipped"
                )
            }
            Err(RecvError::Closed) => return None,
        }
    }
}

fn note(
    kind: crate::webhook::EventKind,
    e: &RolloutEvent,
    text: String,
    reason: Option<String>,
) -> crate::webhook::Notification {
    crate::webhook::Notification {
        event: kind,
        text,
        cluster: Some(e.cluster.clone()),
        plan: None,
        job: Some(e.job.to_string()),
        node: e.node.clone(),
        reason,
        halt_code: None,
        at: jiff::Timestamp::now().to_string(),
    }
}

/// How long until `job` passes the pessimistic bound of its predicted duration, counted by its
/// clock (issue #51: from its first command, less its waits for windows and exclusions), if the
/// plan predicted one; `Some(0)` when it already has; `None` while the clock stands still.
fn overdue_in(job: &Job, now: jiff::Timestamp) -> Option<std::time::Duration> {
    job.clock.overdue_in(job.predicted?, now)
}

/// How often a job whose clock stands still (waiting for its window) is read again for the
/// overdue event: its clock runs again only when the job changes, and the executor writes that.
const OVERDUE_RECHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// Run a job (`run`) and send its overdue event once, when its clock passes the pessimistic
/// bound of its prediction: re-read from the store whenever the last reading's time is up, so
/// time spent waiting for a window never counts.
async fn run_watching_overdue<R>(shared: &Shared, job: &Job, run: R) -> R::Output
where
    R: std::future::Future,
{
    tokio::pin!(run);
    if job.predicted.is_none() {
        return run.await;
    }
    let mut current = job.clone();
    loop {
        let wait = overdue_in(&current, jiff::Timestamp::now()).unwrap_or(OVERDUE_RECHECK);
        tokio::select! {
            r = &mut run => return r,
            _ = tokio::time::sleep(wait.max(std::time::Duration::from_millis(100))) => {}
        }
        if let Ok(Some(j)) = crate::ops::jobs::load_job(&*shared.store, &job.id) {
            current = j;
        }
        if current.state == JobState::Running
            && overdue_in(&current, jiff::Timestamp::now()) == Some(std::time::Duration::ZERO)
        {
            notify_overdue(shared, &current);
            return run.await;
        }
    }
}

/// The job runs past the pessimistic bound of its predicted duration (issue #36): a webhook
/// event and a log line (the status says so too: `duration: … past the pessimistic bound`).
fn notify_overdue(shared: &Shared, job: &Job) {
    let Some(p) = job.predicted else { return };
    let text = format!(
        "medea: rollout {} of cluster {} runs past its predicted duration (pessimistic {}; median {})",
        job.id,
        job.cluster,
        crate::plan::estimate::human(p.pessimistic_secs),
        crate::plan::estimate::human(p.median_secs)
    );
    tracing::warn!(job = %job.id, cluster = %job.cluster, pessimistic_secs = p.pessimistic_secs, "rollout past its predicted duration");
    shared.notifier.send(crate::webhook::Notification {
        event: crate::webhook::EventKind::RolloutOverdue,
        text,
        cluster: Some(job.cluster.clone()),
        plan: Some(job.plan.to_hex()),
        job: Some(job.id.to_string()),
        node: None,
        reason: None,
        halt_code: None,
        at: jiff::Timestamp::now().to_string(),
    });
}

fn notify_start(shared: &Shared, job: &Job) {
    shared.notifier.send(crate::webhook::Notification {
        event: crate::webhook::EventKind::RolloutStarted,
        text: format!(
            "medea: rollout {} of cluster {} started (plan {})",
            job.id,
            job.cluster,
            job.plan.short()
        ),
        cluster: Some(job.cluster.clone()),
        plan: Some(job.plan.to_hex()),
        job: Some(job.id.to_string()),
        node: None,
        reason: None,
        halt_code: None,
        at: jiff::Timestamp::now().to_string(),
    });
}

fn report(shared: &Shared, job: &Job, outcome: &RunOutcome) {
    let (kind, text, reason, node) = match outcome {
        RunOutcome::Succeeded => (
            crate::webhook::EventKind::RolloutSucceeded,
            format!(
                "medea: rollout {} of cluster {} succeeded",
                job.id, job.cluster
            ),
            None,
            None,
        ),
        RunOutcome::Halted { reason, node, .. } => (
            crate::webhook::EventKind::RolloutHalted,
            format!(
                "medea: rollout {} of cluster {} HALTED{}: {reason}",
                job.id,
                job.cluster,
                node.as_ref()
                    .map(|n| format!(" on {n}"))
                    .unwrap_or_default()
            ),
            Some(reason),
            node.clone(),
        ),
        RunOutcome::Paused { gate } => {
            tracing::info!(job = %job.id, gate = %gate, "job paused on a closed gate; it continues when the gate opens");
            return;
        }
    };
    match outcome {
        RunOutcome::Halted { reason, step, node } => {
            crate::metrics::halted(&job.cluster, reason.code().as_str());
            tracing::info!(job = %job.id, cluster = %job.cluster, outcome = "halted", halt_code = reason.code().as_str(), reason = %reason, step = step.map(|s| s + 1), node = node.as_deref().unwrap_or(""), "job finished")
        }
        _ => {
            tracing::info!(job = %job.id, cluster = %job.cluster, outcome = "succeeded", "job finished")
        }
    }
    shared.notifier.send(crate::webhook::Notification {
        event: kind,
        text,
        cluster: Some(job.cluster.clone()),
        plan: Some(job.plan.to_hex()),
        job: Some(job.id.to_string()),
        node,
        halt_code: reason.map(|r| r.code().as_str().to_string()),
        reason: reason.map(|r| r.to_string()),
        at: jiff::Timestamp::now().to_string(),
    });
    // The cluster changed under the job: observe it again, and plan once that observation
    // (started after this end) is in (`AfterJob`), never from the one taken mid-job.
    shared.after_job.job_ended();
    shared.refresh_kick.notify_one();
}

/// The executor's fence: every journal write carries this replica's leadership check.
struct LeaderFence(crate::store::Leadership);

impl crate::rollout::executor::CommitFence for LeaderFence {
    fn checks(&self) -> Vec<crate::store::Check> {
        match self.0.check() {
            Ok(c) => vec![c],
            // Not leading: a check that can never hold, so nothing is written or done.
            Err(_) => vec![crate::store::Check::Leader(
                crate::store::leader::Fence::new(self.0.replica().to_string(), -1),
            )],
        }
    }

    fn ensure(&self, intent_checks: &[crate::store::Check]) -> Result<(), StoreError> {
        for c in intent_checks {
            if let crate::store::Check::Leader(fence) = c {
                self.0.ensure(fence)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod forward_tests {
    #[tokio::test]
    async fn a_lagging_forwarder_skips_and_goes_on() {
        let (tx, mut rx) = tokio::sync::broadcast::channel(2);
        for i in 0..5 {
            tx.send(i).unwrap();
        }
        // 0..2 were overwritten: the forwarder resumes with the oldest kept event
        assert_eq!(super::next_event(&mut rx).await, Some(3));
        assert_eq!(super::next_event(&mut rx).await, Some(4));
        drop(tx);
        assert_eq!(super::next_event(&mut rx).await, None);
    }

    /// Issue #36: the overdue event fires one second past the pessimistic bound; at once for a
    /// job already past it. Issue #51: counted from the job's first command, not its creation,
    /// and never while it has not started.
    #[test]
    fn overdue_counts_from_the_jobs_first_command_to_its_pessimistic_bound() {
        use std::time::Duration;
        let t0: jiff::Timestamp = "2026-12-03T12:00:00Z".parse().unwrap();
        let at = |s: i64| t0.checked_add(jiff::SignedDuration::from_secs(s)).unwrap();
        let p = crate::plan::estimate::Bounds {
            median_secs: 600,
            pessimistic_secs: 900,
        };
        let target = serde_json::json!({"node": "w-1", "id": "id-w-1", "address": "10.0.0.1", "from": "v1.12.4"});
        let rollout: crate::plan::TalosRollout = serde_json::from_value(serde_json::json!({
            "pool": "workers", "role": "worker", "hop": 1, "hops": 1, "to": "v1.13.9",
            "image": "factory.talos.dev/installer/x:v1.13.9", "maxUnavailable": 1,
            "drainTimeout": 300, "healthTimeout": 600, "waves": [[target]],
        }))
        .unwrap();
        let mut job = crate::rollout::sequencer::Job::one_talos_step(
            crate::plan::PlanId::parse_full(&"ab".repeat(32)).unwrap(),
            at(-86_400),
            crate::rollout::sequencer::StepState::Pending,
            rollout,
        );
        job.predicted = Some(p);
        // created a day ago, nothing done yet: not late, and no timer runs
        assert_eq!(super::overdue_in(&job, at(100)), None);
        job.clock.started_at = Some(t0);
        assert_eq!(
            super::overdue_in(&job, at(100)),
            Some(Duration::from_secs(801))
        );
        assert_eq!(super::overdue_in(&job, at(901)), Some(Duration::ZERO));
    }
}

#[cfg(test)]
mod node_state_tests {
    use super::{NodePhase, NodeState, RollbackPhase};

    /// API clients keep the strings they have always seen: every state the server decides as
    /// a value is written as the text `rollout_pb` wrote by hand before (issue #50 item 3).
    #[test]
    fn node_states_keep_their_wire_strings() {
        let cases = [
            (NodeState::Phase(NodePhase::Pending), "pending"),
            (NodeState::Phase(NodePhase::Cordoned), "cordoned"),
            (NodeState::Phase(NodePhase::Detached), "detached"),
            (NodeState::Phase(NodePhase::Done), "done"),
            (
                NodeState::Staged {
                    phase: NodePhase::Cordoned,
                    boots: "v1.11.3".into(),
                },
                "cordoned, staged: any reboot boots v1.11.3",
            ),
            (
                NodeState::RollingBack(RollbackPhase::Cordoned),
                "rolling-back:cordoned",
            ),
            (NodeState::RolledBack, "rolled-back"),
            (NodeState::Tasks { done: 3, total: 3 }, "done"),
            (NodeState::Tasks { done: 1, total: 3 }, "1/3 tasks"),
        ];
        for (state, want) in cases {
            assert_eq!(state.to_string(), want, "{state:?}");
        }
    }
}
