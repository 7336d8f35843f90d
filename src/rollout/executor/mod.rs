//! The executor: runs jobs through the ports, journaling every step.
//!
//! Per iteration: check for a halt request; [`sequencer::step`] on fresh observations; for a
//! command, re-check the gates (global `--rollouts`, the cluster's `rolloutsEnabled`, halt),
//! journal the intent durably, call the port, journal the outcome durably; otherwise persist
//! whatever changed and sleep (poll interval, exponential backoff after transient failures, or
//! until a maintenance window opens). Every store write goes through [`Executor::commit`], the
//! single place where fencing checks are added and where the crash harness aborts.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;
use tokio::sync::broadcast;

use super::RolloutError;
use super::journal::{self, Entry, HaltRequest, ResumeRequest, halt_key, resume_key};
use super::ports::{
    GateEvaluation, HealthProbe, HookRequest, ImageNamespace, KubePort, NoProbe, PortError,
    SilenceRequest, TalosPort, UpgradeMethod,
};
use super::sequencer::{
    self, Action, Command, CommandOp, CommandOutcome, GatePoint, HaltCode, HaltReason, Job, JobId,
    JobState, Needs, Next, ObsError, Observations, PollWhy, StageResult, Transition,
};
use crate::Locked as _;
use crate::error_chain;
use crate::store::{Check, Store, StoreError, StoreExt, Table, Txn};

mod config;
mod events;
pub mod snapshot;

pub use config::*;
pub use events::*;

/// Runs jobs against the Talos (`T`) and Kubernetes (`K`) ports: journal the intent, act, journal the outcome.
pub struct Executor<T, K, C = SystemClock, H = NoProbe> {
    store: Arc<dyn Store>,
    talos: T,
    kube: K,
    clock: C,
    /// Evaluates the health gates (issue #23); [`NoProbe`] fails every gate.
    probe: H,
    cfg: ExecutorConfig,
    fence: Arc<dyn CommitFence>,
    events: broadcast::Sender<RolloutEvent>,
    commits: AtomicU64,
    /// Cluster record bytes → its `rolloutsEnabled`, see [`Executor::closed_gate`].
    gates: std::sync::Mutex<std::collections::HashMap<String, (Vec<u8>, bool)>>,
}

/// How long the manifests sync waits for Deployments and DaemonSets to roll out: the
/// Kubernetes step's health timeout.
fn manifests_wait(job: &Job, step: usize) -> Duration {
    match job.steps.get(step).map(|s| &s.kind) {
        Some(crate::rollout::sequencer::StepKind::Kubernetes(k)) => k.rollout.health_timeout,
        _ => Duration::from_secs(5 * 60),
    }
}

fn obs_err(e: PortError) -> ObsError {
    ObsError {
        transient: e.is_transient(),
        message: error_chain(&e),
    }
}

fn store_err(job: &JobId) -> impl FnOnce(StoreError) -> RolloutError + '_ {
    move |err| RolloutError::Store {
        job: job.to_string(),
        err,
    }
}

impl<T: TalosPort, K: KubePort, C: Clock> Executor<T, K, C, NoProbe> {
    /// An executor without a health probe: a job with health gates fails them (see
    /// [`Executor::with_probe`]).
    pub fn new(
        store: Arc<dyn Store>,
        talos: T,
        kube: K,
        clock: C,
        cfg: ExecutorConfig,
    ) -> Executor<T, K, C, NoProbe> {
        let (events, _) = broadcast::channel(1024);
        Executor {
            store,
            talos,
            kube,
            clock,
            probe: NoProbe,
            cfg,
            fence: Arc::new(NoFence),
            events,
            commits: AtomicU64::new(0),
            gates: Default::default(),
        }
    }
}

impl<T: TalosPort, K: KubePort, C: Clock, H: HealthProbe> Executor<T, K, C, H> {
    /// The same executor evaluating health gates with `probe`.
    pub fn with_probe<P: HealthProbe>(self, probe: P) -> Executor<T, K, C, P> {
        Executor {
            store: self.store,
            talos: self.talos,
            kube: self.kube,
            clock: self.clock,
            probe,
            cfg: self.cfg,
            fence: self.fence,
            events: self.events,
            commits: self.commits,
            gates: self.gates,
        }
    }

    /// The health probe gates are evaluated with.
    pub fn probe(&self) -> &H {
        &self.probe
    }

    /// Adds `fence`'s preconditions to every commit (the HA leader lease).
    pub fn with_fence(mut self, fence: Arc<dyn CommitFence>) -> Self {
        self.fence = fence;
        self
    }

    /// Step events of every job this executor runs.
    pub fn subscribe(&self) -> broadcast::Receiver<RolloutEvent> {
        self.events.subscribe()
    }

    /// The Talos port.
    pub fn talos(&self) -> &T {
        &self.talos
    }
    /// The Kubernetes port.
    pub fn kube(&self) -> &K {
        &self.kube
    }

    /// Store commits made so far (journal points).
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::SeqCst)
    }

    /// Jobs that are not terminal, and terminal jobs that still have pacing taints to remove,
    /// by id.
    pub fn running_jobs(&self) -> Result<Vec<Job>, RolloutError> {
        let jobs = read_jobs(self.store.as_ref()).map_err(|err| RolloutError::Store {
            job: "*".into(),
            err,
        })?;
        Ok(jobs
            .into_iter()
            .filter(|j| !j.state.is_terminal() || sequencer::cleanup_pending(j))
            .collect())
    }

    /// Reload every running job and run them (clusters concurrently) until each succeeds, halts
    /// or pauses on a closed gate.
    pub async fn resume_all(
        self: &Arc<Self>,
    ) -> Result<Vec<(JobId, Result<RunOutcome, RolloutError>)>, RolloutError>
    where
        T: 'static,
        K: 'static,
        C: 'static,
        H: 'static,
    {
        let mut set = tokio::task::JoinSet::new();
        for job in self.running_jobs()? {
            let me = self.clone();
            set.spawn(async move {
                let r = me.run(&job.id).await;
                (job.id, r)
            });
        }
        let mut out = Vec::new();
        while let Some(r) = set.join_next().await {
            match r {
                Ok(pair) => out.push(pair),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => {}
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn load(&self, id: &JobId) -> Result<Job, RolloutError> {
        read_job(self.store.as_ref(), id)
            .map_err(store_err(id))?
            .ok_or_else(|| RolloutError::UnknownJob {
                job: id.to_string(),
            })
    }

    /// Drive one job until it succeeds, halts, or a gate closes.
    pub async fn run(&self, id: &JobId) -> Result<RunOutcome, RolloutError> {
        let mut job = self.load(id)?;
        let mut transient: u32 = 0;
        let mut last_wait: Option<String> = None;
        loop {
            // a job that is over still removes the pacing taints it left (issue #35): the
            // sequencer gives their removals, under the same gates as any mutating call
            let cleanup = sequencer::cleanup_pending(&job);
            match &job.state {
                JobState::Succeeded { .. } if !cleanup => return Ok(RunOutcome::Succeeded),
                JobState::Halted {
                    reason, step, node, ..
                } if !cleanup => {
                    return Ok(RunOutcome::Halted {
                        reason: reason.clone(),
                        step: *step,
                        node: node.clone(),
                    });
                }
                _ => {}
            }
            if !self.cfg.rollouts {
                self.emit(
                    &job,
                    None,
                    EventState::Paused {
                        gate: Gate::GlobalRollouts,
                    },
                );
                return Ok(RunOutcome::Paused {
                    gate: Gate::GlobalRollouts,
                });
            }
            if !cleanup && let Some(h) = self.halt_request(&job)? {
                job = self.honour_halt(&job, h)?;
                continue;
            }
            if let Some(r) = self.resume_request(&job)? {
                job = self.honour_resume(&job, r)?;
            }
            let was_paused = job.gates.paused.is_some();
            let now = self.clock.now();
            let (mut t, evaluated) = self.decide(&job, now).await;
            if !evaluated.is_empty() {
                // the evidence first, in its own entry (a crash point of its own)
                for (point, evals) in &evaluated {
                    for e in evals {
                        self.emit(
                            &job,
                            None,
                            EventState::GateEvaluated {
                                point: point.clone(),
                                evaluation: e.clone(),
                            },
                        );
                    }
                }
                if t.changed(&job) {
                    let (point, evaluations) = evaluated
                        .into_iter()
                        .reduce(|mut a, b| {
                            a.0 = b.0;
                            a.1.extend(b.1);
                            a
                        })
                        .unwrap_or((GatePoint::BeforeJob, Vec::new()));
                    let notes = std::mem::take(&mut t.notes);
                    job = self.persist(
                        &job,
                        &t.job,
                        Entry::Gates { point, evaluations },
                        notes.clone(),
                    )?;
                    self.emit_notes(&job, &notes);
                    self.emit_terminal(&job);
                    t.job.journal_seq = job.journal_seq;
                    if let (false, Some(p)) = (was_paused, &job.gates.paused) {
                        self.emit(
                            &job,
                            None,
                            EventState::Paused {
                                gate: Gate::Inconclusive {
                                    gate: p.gate.clone(),
                                    point: p.point.to_string(),
                                },
                            },
                        );
                    }
                }
            }
            match t.next.clone() {
                Next::Finished => {
                    let changed = t.changed(&job);
                    job = self.progress(&job, t)?;
                    if !changed && !job.state.is_terminal() {
                        // cannot happen (Finished means terminal); never spin
                        self.sleep(self.cfg.poll).await;
                    }
                }
                Next::Run(cmd) => {
                    // the gates, before every mutating command
                    if let Some(gate) = self.closed_gate(&job)? {
                        job = self.progress(&job, t)?;
                        self.emit(&job, Some(&cmd), EventState::Paused { gate: gate.clone() });
                        return Ok(RunOutcome::Paused { gate });
                    }
                    if !cleanup && let Some(h) = self.halt_request(&job)? {
                        job = self.progress(&job, t)?;
                        job = self.honour_halt(&job, h)?;
                        continue;
                    }
                    last_wait = None;
                    let outcome;
                    (job, outcome) = self.run_command(&job, t, cmd).await?;
                    // a staged batch with a node whose call was lost (a transport error, an
                    // install already in progress) backs off too: its resolution may issue
                    // the node again at once, and without the pause that loops as fast as the
                    // journal can write (issue #36)
                    let staged_transient = matches!(&outcome, CommandOutcome::Staged { results }
                        if results.iter().any(|(_, r)| matches!(r, StageResult::Transient { .. }
                            | StageResult::Installing { .. })));
                    match outcome {
                        CommandOutcome::Transient { .. } | CommandOutcome::Installing { .. } => {
                            transient += 1;
                            self.sleep(self.backoff(transient)).await;
                        }
                        _ if staged_transient => {
                            transient += 1;
                            self.sleep(self.backoff(transient)).await;
                        }
                        _ => transient = 0,
                    }
                }
                Next::Poll {
                    why,
                    reason,
                    detail,
                } => {
                    job = self.progress(&job, t)?;
                    if last_wait.as_deref() != Some(reason.as_str()) {
                        self.emit(
                            &job,
                            None,
                            EventState::Waiting {
                                reason: reason.clone(),
                                detail,
                            },
                        );
                        last_wait = Some(reason);
                    }
                    let d = match why {
                        PollWhy::Waiting => {
                            transient = 0;
                            self.cfg.poll
                        }
                        PollWhy::Unreachable => {
                            transient += 1;
                            self.backoff(transient)
                        }
                    };
                    self.sleep(d).await;
                }
                Next::WaitUntil { at, reason } => {
                    job = self.progress(&job, t)?;
                    if last_wait.as_deref() != Some(reason.as_str()) {
                        self.emit(
                            &job,
                            None,
                            EventState::Waiting {
                                reason: reason.clone(),
                                detail: None,
                            },
                        );
                        last_wait = Some(reason);
                    }
                    let left = at.duration_since(self.clock.now());
                    let d = Duration::try_from(left).unwrap_or(Duration::ZERO);
                    self.sleep(d.min(self.cfg.max_sleep)).await;
                }
            }
        }
    }

    /// Journal the intent, make the call, journal the outcome.
    async fn run_command(
        &self,
        job: &Job,
        t: Transition,
        cmd: Command,
    ) -> Result<(Job, CommandOutcome), RolloutError> {
        let now = self.clock.now();
        let intended = sequencer::intend(&t.job, &cmd, now);
        let (job, checks) = self.persist_fenced(
            job,
            &intended,
            Entry::Intent {
                key: cmd.key.clone(),
                action: cmd.action.clone(),
            },
            t.notes.clone(),
        )?;
        self.emit_notes(&job, &t.notes);
        self.emit(
            &job,
            Some(&cmd),
            EventState::Intended {
                attempt: cmd.key.attempt,
            },
        );
        // The intent's term must still be this replica's, now: a replica stopped between the
        // intent and here (SIGSTOP, VM stall) may have been replaced by a leader that already
        // resumed this intent. Nothing that can wait runs between this and the call.
        if let Err(err) = self.fence.ensure(&checks) {
            return Err(RolloutError::Fenced {
                job: job.id.to_string(),
                err,
            });
        }
        let outcome = self.execute(&job, &cmd).await;
        let (next, notes) = sequencer::complete(&job, &cmd.key, &outcome, self.clock.now());
        let job = self.persist(
            &job,
            &next,
            Entry::Result {
                key: cmd.key.clone(),
                outcome: outcome.clone(),
            },
            notes,
        )?;
        let state = match &outcome {
            CommandOutcome::Transient { error } | CommandOutcome::Installing { error } => {
                EventState::Unknown {
                    error: error.clone(),
                }
            }
            // a job already over (removing its pacing taints) does not halt again
            _ if intended.state.is_terminal() => EventState::Done,
            _ => match &job.state {
                JobState::Halted { reason, .. } => EventState::Halted {
                    reason: reason.clone(),
                },
                _ => EventState::Done,
            },
        };
        self.emit(&job, Some(&cmd), state);
        Ok((job, outcome))
    }

    /// Persist a transition that made no call (if it changed anything).
    fn progress(&self, job: &Job, t: Transition) -> Result<Job, RolloutError> {
        if !t.changed(job) {
            return Ok(job.clone());
        }
        let next = self.persist(job, &t.job, Entry::Progress, t.notes.clone())?;
        self.emit_notes(&next, &t.notes);
        self.emit_terminal(&next);
        Ok(next)
    }

    fn honour_halt(&self, job: &Job, h: HaltRequest) -> Result<Job, RolloutError> {
        let reason = HaltReason::new(
            HaltCode::OperatorRequest,
            match &h.reason {
                Some(r) => format!("halted by {}: {r}", h.by),
                None => format!("halted by {}", h.by),
            },
        );
        let next = sequencer::halt(job, reason.clone(), self.clock.now());
        let next = self.persist(
            job,
            &next,
            Entry::HaltRequested { by: h.by.clone() },
            vec![reason.to_string()],
        )?;
        self.emit_terminal(&next);
        Ok(next)
    }

    /// Observe what the machine asks for, round after round, until it has all it wants. Also
    /// returns the health-gate evaluations made for it, by point.
    async fn decide(
        &self,
        job: &Job,
        now: Timestamp,
    ) -> (Transition, Vec<(GatePoint, Vec<GateEvaluation>)>) {
        let mut obs = Observations::default();
        let mut t = sequencer::step(job, &obs, now);
        for _ in 0..16 {
            if t.missing.is_empty() {
                break;
            }
            let more = self.observe(job, &t.missing).await;
            obs.merge(more);
            t = sequencer::step(job, &obs, now);
        }
        (t, obs.gates.into_iter().collect())
    }

    async fn observe(&self, job: &Job, needs: &Needs) -> Observations {
        let mut obs = Observations::default();
        // Node observations are read-only and independent: all at once, so that a wave whose
        // nodes are away (each observation waiting out its client's retries) costs one
        // observation's time, not one per node.
        let talos =
            futures::future::join_all(needs.talos.iter().map(|t| async move {
                (t.node.clone(), self.talos.node(t).await.map_err(obs_err))
            }));
        let kube = futures::future::join_all(
            needs
                .kube
                .iter()
                .map(|k| async move { (k.clone(), self.kube.node(k).await.map_err(obs_err)) }),
        );
        let (talos, kube) = futures::future::join(talos, kube).await;
        obs.talos.extend(talos);
        obs.kube.extend(kube);
        if let Some(via) = &needs.etcd {
            obs.etcd = Some(self.talos.etcd(via).await.map_err(obs_err));
        }
        for t in &needs.images {
            obs.images.insert(
                t.node.clone(),
                self.talos.component_images(t).await.map_err(obs_err),
            );
        }
        for t in &needs.args {
            obs.args.insert(
                t.node.clone(),
                self.talos.component_args(t).await.map_err(obs_err),
            );
        }
        for (node, c) in &needs.static_pods {
            obs.static_pods.insert(
                (node.clone(), *c),
                self.kube.static_pod(node, *c).await.map_err(obs_err),
            );
        }
        for (t, c) in &needs.config_versions {
            obs.config_versions.insert(
                (t.node.clone(), *c),
                self.talos
                    .component_config_version(t, *c)
                    .await
                    .map_err(obs_err),
            );
        }
        if needs.nodes {
            obs.nodes = Some(self.kube.nodes().await.map_err(obs_err));
        }
        for node in &needs.volumes {
            obs.volumes.insert(
                node.clone(),
                self.kube.volume_attachments(node).await.map_err(obs_err),
            );
        }
        if let Some(ask) = &needs.gates {
            let evals = futures::future::join_all(
                ask.gates.iter().map(|g| self.probe.evaluate(g, &ask.ctx)),
            )
            .await;
            obs.gates.insert(ask.point.clone(), evals);
        }
        if needs.snapshot {
            let path = self.snapshot_path(job);
            let seen = if job.snapshot_recipients.is_empty() {
                snapshot::plaintext_on_disk(&path)
                    .await
                    .map_err(|e| error_chain(&e))
            } else {
                snapshot::encrypted_on_disk(&path)
                    .await
                    .map_err(|e| error_chain(&e))
            };
            obs.snapshot = Some(seen.map_err(|message| ObsError {
                transient: false,
                message,
            }));
        }
        obs
    }

    /// The file the job's etcd snapshot is saved to: `<job>.db.age` when the job has backup
    /// recipients (issue #49), else `<job>.db`.
    pub fn snapshot_path(&self, job: &Job) -> PathBuf {
        snapshot::snapshot_path(&self.cfg.snapshot_dir, job)
    }

    async fn execute(&self, job: &Job, cmd: &Command) -> CommandOutcome {
        let r: Result<CommandOutcome, PortError> = match &cmd.action {
            Action::Snapshot { via } if job.snapshot_recipients.is_empty() => self
                .talos
                .etcd_snapshot(via, &self.snapshot_path(job))
                .await
                .map(|info| CommandOutcome::Snapshot { info }),
            Action::Snapshot { via } => snapshot::take_encrypted(
                &self.snapshot_path(job),
                &job.snapshot_recipients,
                &via.node,
                |tx| self.talos.etcd_snapshot_stream(via, tx),
            )
            .await
            .map(|info| CommandOutcome::Snapshot { info }),
            Action::Pull {
                node,
                image,
                namespace,
            } => self
                .talos
                .pull_image(node, image, *namespace)
                .await
                .map(|()| CommandOutcome::Done),
            Action::Cordon { node } => self
                .kube
                .cordon(node, cmd.key.job.as_str())
                .await
                .map(|()| CommandOutcome::Done),
            Action::Drain {
                node,
                timeout_secs,
                policy,
            } => self
                .kube
                .drain(node, Duration::from_secs(*timeout_secs), policy)
                .await
                .map(|result| CommandOutcome::Drain { result }),
            Action::Upgrade {
                node,
                image,
                method,
                ..
            } => self
                .talos
                .upgrade(node, image, *method)
                .await
                .map(|()| CommandOutcome::Done),
            Action::ForfeitLeadership { node } => self
                .talos
                .etcd_forfeit_leadership(node)
                .await
                .map(|_| CommandOutcome::Done),
            Action::Reboot { node, .. } => {
                self.talos.reboot(node).await.map(|()| CommandOutcome::Done)
            }
            Action::Rollback { node, .. } => self
                .talos
                .rollback(node)
                .await
                .map(|()| CommandOutcome::Done),
            Action::Uncordon { node } => self
                .kube
                .uncordon(node, cmd.key.job.as_str())
                .await
                .map(|()| CommandOutcome::Done),
            Action::Taint { node, taint } => self
                .kube
                .taint(node, taint)
                .await
                .map(|()| CommandOutcome::Done),
            Action::Untaint { node, taint } => self
                .kube
                .untaint(node, taint)
                .await
                .map(|()| CommandOutcome::Done),
            Action::SetImage {
                node,
                component,
                image,
            } => self
                .talos
                .set_component_image(node, *component, image)
                .await
                .map(|()| CommandOutcome::Done),
            Action::Silence {
                alertmanager,
                id,
                matchers,
                ends_at,
                comment,
                marker,
                ..
            } => self
                .probe
                .silence(&SilenceRequest {
                    alertmanager: alertmanager.as_ref().clone(),
                    id: id.clone(),
                    matchers: matchers.clone(),
                    ends_at: *ends_at,
                    comment: comment.clone(),
                    marker: marker.clone(),
                })
                .await
                .map(|s| CommandOutcome::Silenced { id: s.id }),
            Action::Unsilence {
                alertmanager, id, ..
            } => self
                .probe
                .expire_silence(alertmanager, id)
                .await
                .map(|()| CommandOutcome::Done),
            Action::Hook {
                point,
                run_id,
                pool,
                node,
                wave,
                hook,
                ..
            } => {
                let req = HookRequest {
                    cluster: job.cluster.clone(),
                    job: job.id.to_string(),
                    run_id: run_id.clone(),
                    point: *point,
                    pool: pool.clone(),
                    node: node.clone(),
                    wave: *wave,
                    attempt: cmd.key.attempt,
                    hook: hook.as_ref().clone(),
                };
                let refused = self.cfg.hook_policy.refusals(hook);
                let report = match &hook.action {
                    crate::desired::hooks::HookAction::Http { .. } => {
                        self.probe.run_http_hook(&req).await
                    }
                    // defence in depth (issue #49): the server refuses such a revision when
                    // it loads it; a plan made elsewhere or under another policy stops here,
                    // before anything is created
                    crate::desired::hooks::HookAction::Job { .. } if !refused.is_empty() => {
                        crate::rollout::ports::HookReport::failed(policy_refusal(&refused))
                    }
                    crate::desired::hooks::HookAction::Job { .. } => {
                        self.kube.run_job_hook(&req).await
                    }
                };
                Ok(CommandOutcome::Hook { report })
            }
            Action::Stage { nodes } => {
                // the batch's nodes at once: each pulls its installer, then installs it without
                // a reboot; one node's failure never stops another's call
                let results = futures::future::join_all(nodes.iter().map(|s| async move {
                    let r = async {
                        self.talos
                            .pull_image(&s.node, &s.image, ImageNamespace::System)
                            .await?;
                        self.talos
                            .upgrade(&s.node, &s.image, UpgradeMethod::Lifecycle)
                            .await
                    }
                    .await;
                    let result = match r {
                        Ok(()) => StageResult::Installed,
                        // another install is running there: the batch's earlier call (issue #48)
                        Err(e) if e.is_busy() => StageResult::Installing {
                            error: error_chain(&e),
                        },
                        Err(e) if e.is_transient() => StageResult::Transient {
                            error: error_chain(&e),
                        },
                        Err(e) => StageResult::Failed {
                            error: error_chain(&e),
                        },
                    };
                    (s.node.node.clone(), result)
                }))
                .await;
                Ok(CommandOutcome::Staged { results })
            }
            Action::ApplyManifests { via, legacy } => {
                match self.talos.bootstrap_manifests(via).await {
                    Ok(m) => self
                        .kube
                        .apply_manifests(&m, *legacy, manifests_wait(job, cmd.key.step))
                        .await
                        .map(|()| CommandOutcome::Done),
                    Err(e) => Err(e),
                }
            }
        };
        match r {
            Ok(o) => o,
            // an install refused because an earlier one still runs there (issue #48)
            Err(e) if e.is_busy() => CommandOutcome::Installing {
                error: error_chain(&e),
            },
            Err(e) if e.is_transient() => CommandOutcome::Transient {
                error: error_chain(&e),
            },
            Err(e) => CommandOutcome::Failed {
                error: error_chain(&e),
                refusal: e.refusal(),
            },
        }
    }

    fn closed_gate(&self, job: &Job) -> Result<Option<Gate>, RolloutError> {
        if !self.cfg.rollouts {
            return Ok(Some(Gate::GlobalRollouts));
        }
        let key = crate::inventory::cluster_key(&job.cluster);
        let bytes = self
            .store
            .get(Table::Inventory, &key)
            .map_err(store_err(&job.id))?;
        let enabled = match bytes {
            None => false,
            Some(bytes) => {
                // The record is read before every mutating command; its decision is reused
                // while its bytes are unchanged (one comparison instead of a parse of every
                // machine of the cluster).
                let mut gates = self.gates.locked();
                match gates.get(&key) {
                    Some((seen, enabled)) if *seen == bytes => *enabled,
                    _ => {
                        let enabled = crate::inventory::rollouts_enabled(&key, &bytes)
                            .map_err(store_err(&job.id))?;
                        gates.insert(key, (bytes, enabled));
                        enabled
                    }
                }
            }
        };
        if !enabled {
            return Ok(Some(Gate::ClusterDisabled {
                cluster: job.cluster.clone(),
            }));
        }
        Ok(None)
    }

    fn resume_request(&self, job: &Job) -> Result<Option<ResumeRequest>, RolloutError> {
        self.store
            .get_record::<ResumeRequest>(&resume_key(&job.id))
            .map_err(store_err(&job.id))
    }

    /// A person's `resume`: a job paused by an inconclusive gate goes on (journaled, durable)
    /// and the request is deleted; a request for a job that is not paused is only deleted. A
    /// crash between the two finds the job resumed and deletes the request then.
    fn honour_resume(&self, job: &Job, r: ResumeRequest) -> Result<Job, RolloutError> {
        let next = match sequencer::pause::resume(job, &r.by, self.clock.now()) {
            Some((next, note)) => {
                let next = self.persist(
                    job,
                    &next,
                    Entry::ResumeRequested { by: r.by.clone() },
                    vec![note.clone()],
                )?;
                self.emit_notes(&next, &[note]);
                next
            }
            None => job.clone(),
        };
        self.store
            .commit(Txn::new().delete(Table::Jobs, resume_key(&job.id)))
            .map_err(store_err(&job.id))?;
        Ok(next)
    }

    fn halt_request(&self, job: &Job) -> Result<Option<HaltRequest>, RolloutError> {
        self.store
            .get_record::<HaltRequest>(&halt_key(&job.id))
            .map_err(store_err(&job.id))
    }

    fn persist(
        &self,
        prev: &Job,
        next: &Job,
        entry: Entry,
        notes: Vec<String>,
    ) -> Result<Job, RolloutError> {
        self.persist_fenced(prev, next, entry, notes)
            .map(|(job, _)| job)
    }

    /// [`Executor::persist`], also returning the fence checks the entry was committed under.
    fn persist_fenced(
        &self,
        prev: &Job,
        next: &Job,
        entry: Entry,
        notes: Vec<String>,
    ) -> Result<(Job, Vec<Check>), RolloutError> {
        let point = entry_point(&entry);
        let (txn, job) = journal::advance_txn(prev, next, entry, notes, self.clock.now());
        let checks = self.commit(&job.id, txn, &point)?;
        self.emit_external_reboots(prev, &job);
        Ok((job, checks))
    }

    /// A staged node that `next` records as rebooted outside medea and `prev` did not: its event
    /// (the server sends the `rollout.node_rebooted_externally` webhook for it).
    fn emit_external_reboots(&self, prev: &Job, next: &Job) {
        use sequencer::{Staging, StepKind};
        for (si, (a, b)) in prev.steps.iter().zip(&next.steps).enumerate() {
            let (StepKind::Talos(a), StepKind::Talos(b)) = (&a.kind, &b.kind) else {
                continue;
            };
            for (na, nb) in a.nodes.iter().zip(&b.nodes) {
                if Arc::ptr_eq(na, nb) {
                    continue;
                }
                let was = matches!(na.staging, Some(Staging::RebootedExternally { .. }));
                if let Some(Staging::RebootedExternally { at, .. }) = &nb.staging
                    && !was
                {
                    let _ = self.events.send(RolloutEvent {
                        job: next.id.clone(),
                        cluster: next.cluster.clone(),
                        step: Some(si),
                        pool: Some(b.rollout.pool.clone()),
                        node: Some(nb.target.node.clone()),
                        op: None,
                        state: EventState::RebootedExternally {
                            at: *at,
                            boots: b.rollout.to.to_string(),
                        },
                        steps: next.steps.len(),
                        image: None,
                    });
                }
            }
        }
    }

    /// The one place executor transactions are committed: fencing checks are added here (and
    /// returned), and the crash harness aborts here. `point` names the entry ([`entry_point`]).
    fn commit(&self, job: &JobId, mut txn: Txn, point: &str) -> Result<Vec<Check>, RolloutError> {
        let n = self.commits.fetch_add(1, Ordering::SeqCst) + 1;
        let crash = &self.cfg.crash;
        let named = |want: &Option<String>| want.as_deref() == Some(point);
        if crash.before == Some(n) || named(&crash.before_entry) {
            eprintln!(
                "medea: crash point: aborting before journal write {n} ({})",
                point
            );
            std::process::abort();
        }
        let checks = self.fence.checks();
        for c in &checks {
            txn = txn.check(c.clone());
        }
        match self.store.commit(txn) {
            Ok(()) => {}
            Err(err @ StoreError::Conflict { .. }) => {
                return Err(RolloutError::Fenced {
                    job: job.to_string(),
                    err,
                });
            }
            Err(err) => {
                return Err(RolloutError::Store {
                    job: job.to_string(),
                    err,
                });
            }
        }
        if crash.after == Some(n) || named(&crash.after_entry) {
            eprintln!(
                "medea: crash point: aborting after journal write {n} ({})",
                point
            );
            std::process::abort();
        }
        if named(&crash.stop_after_entry) {
            eprintln!(
                "medea: stop point: stopping after journal write {n} ({})",
                point
            );
            // The whole process stops, its election task included, until SIGCONT. The stop
            // can take effect a little after `kill` returns: this thread waits (blocking, it
            // is a test hook) so that it cannot get to the next step before it.
            let _ = std::process::Command::new("kill")
                .arg("-STOP")
                .arg(std::process::id().to_string())
                .status();
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(checks)
    }

    fn backoff(&self, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1).min(20))
            .unwrap_or(u32::MAX);
        self.cfg
            .backoff_min
            .saturating_mul(factor)
            .min(self.cfg.backoff_max)
    }

    async fn sleep(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    fn emit(&self, job: &Job, cmd: Option<&Command>, state: EventState) {
        let step = cmd
            .map(|c| c.key.step)
            .or_else(|| sequencer::current_step(job));
        let _ = self.events.send(RolloutEvent {
            job: job.id.clone(),
            cluster: job.cluster.clone(),
            step,
            pool: step
                .and_then(|s| job.steps.get(s))
                .and_then(|s| s.pool())
                .map(str::to_string),
            node: cmd.and_then(|c| c.key.node.clone()),
            op: cmd.map(|c| c.key.op),
            state,
            steps: job.steps.len(),
            image: cmd.and_then(|c| c.action.image().map(str::to_string)),
        });
    }

    fn emit_notes(&self, job: &Job, notes: &[String]) {
        for n in notes {
            self.emit(job, None, EventState::Progress { note: n.clone() });
        }
    }

    fn emit_terminal(&self, job: &Job) {
        match &job.state {
            JobState::Halted { reason, .. } => self.emit(
                job,
                None,
                EventState::Halted {
                    reason: reason.clone(),
                },
            ),
            JobState::Succeeded { .. } => self.emit(job, None, EventState::Succeeded),
            JobState::Running => {}
        }
    }
}

/// The executor's own reads of jobs: the checkpoint with the journal folded in
/// ([`journal::replay`]). `ops::jobs` reads them the same way for everyone else.
fn read_job(store: &dyn Store, id: &JobId) -> Result<Option<Job>, StoreError> {
    let Some(mut job) = store.get_record::<Job>(&journal::job_key(id))? else {
        return Ok(None);
    };
    journal::replay(&mut job, |key| store.get_record(key))?;
    Ok(Some(job))
}

/// Every job in the store, current, in key order (see [`read_job`]).
fn read_jobs(store: &dyn Store) -> Result<Vec<Job>, StoreError> {
    let mut jobs = Vec::new();
    for (_, mut job) in store.scan_records::<Job>("job/")? {
        journal::replay(&mut job, |key| store.get_record(key))?;
        jobs.push(job);
    }
    Ok(jobs)
}

/// The stored job `job`, refused when unknown or already finished (a halt or a resume
/// request has nothing to act on then).
fn unfinished_job(store: &dyn Store, job: &JobId) -> Result<Job, RolloutError> {
    let current = read_job(store, job)
        .map_err(store_err(job))?
        .ok_or_else(|| RolloutError::UnknownJob {
            job: job.to_string(),
        })?;
    if current.state.is_terminal() {
        return Err(RolloutError::AlreadyFinished {
            job: job.to_string(),
        });
    }
    Ok(current)
}

/// Ask a running job to stop before its next mutating command (`medea rollout halt`).
pub fn request_halt(
    store: &dyn Store,
    job: &JobId,
    by: &str,
    reason: Option<&str>,
    now: Timestamp,
) -> Result<(), RolloutError> {
    unfinished_job(store, job)?;
    store
        .commit(Txn::new().put_record(
            halt_key(job),
            &HaltRequest {
                job: job.clone(),
                by: by.to_string(),
                reason: reason.map(str::to_string),
                at: now,
            },
        ))
        .map_err(store_err(job))
}

/// Ask the executor of `job` to resume it (`medea rollout resume`): refused unless the job
/// is running and paused by an inconclusive gate (issue #51 item 4).
pub fn request_resume(
    store: &dyn Store,
    job: &JobId,
    by: &str,
    now: Timestamp,
) -> Result<(), RolloutError> {
    let current = unfinished_job(store, job)?;
    if current.gates.paused.is_none() {
        return Err(RolloutError::NotPaused {
            job: job.to_string(),
        });
    }
    store
        .commit(Txn::new().put_record(
            resume_key(job),
            &ResumeRequest {
                job: job.clone(),
                by: by.to_string(),
                at: now,
            },
        ))
        .map_err(store_err(job))
}

/// The failed hook's detail when the server's Job-hook policy refuses what it asks for: each
/// refusal and the `medea serve` flag that would allow it.
fn policy_refusal(refused: &[crate::desired::hook_policy::Refusal]) -> String {
    let what: Vec<String> = refused
        .iter()
        .map(|r| format!("{r} (allowed by `medea serve {}`)", r.allow))
        .collect();
    format!(
        "refused by this server's Job hook policy before the Job was created: {}",
        what.join("; ")
    )
}
