//! Health gates (issue #23): where a job checks them ([`GatePoint`]), the soak state of the
//! point being checked ([`GateRun`]), the bounded evidence it keeps ([`GateRecord`]) and the
//! decision at one point ([`gate_point`]). Pure: the evaluations arrive as observations
//! ([`Observations::gates`]) and time as `now`.
//!
//! At a point, every gate is evaluated every `interval`. An evaluation passes, fails (the
//! check said no) or is inconclusive (it could not tell: the source unreachable, an error, no
//! value; issue #35). A passing evaluation starts (or continues) the gate's passing streak and
//! clears its counts; a failing one ends the streak and counts a failure, an inconclusive one
//! ends the streak and counts an inconclusive evaluation (neither clears the other's count:
//! only a pass does). The point passes at the first evaluation where every blocking gate has
//! passed continuously for `soak` (zero outside the soaks: the first evaluation where all
//! pass); it fails when a blocking gate reaches `failureLimit` failures (with the policy's
//! `onFailure`) or `inconclusiveLimit` inconclusive evaluations (a halt, never a rollback: the
//! job halts with `gate_inconclusive`). A `dryRun` gate is evaluated, counted and recorded
//! like the others but never holds the point, fails it or halts the job.

pub use super::pause::GatePause;
use super::*;
use crate::plan::health::{HealthPolicy, OnFailure, OnInconclusive};
use crate::rollout::ports::{GateContext, GateEvaluation, GateSample, GateVerdict};

/// Failed evaluations kept in a job's evidence beside the latest of each gate.
pub const MAX_FAILED_RECORDS: usize = 16;

/// Where the gates of a job are checked.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "at")]
pub enum GatePoint {
    /// Before the job touches anything (the cluster's gates, no soak).
    BeforeJob,
    /// Before a wave of a Talos step starts (the pool's gates, no soak).
    BeforeWave {
        /// The Talos step.
        step: usize,
        /// The wave (0-based).
        wave: usize,
    },
    /// The soak after a wave (the pool's gates and soak); the last wave's is the pool's soak.
    AfterWave {
        /// The Talos step.
        step: usize,
        /// The wave (0-based).
        wave: usize,
    },
    /// The soak after a Kubernetes step (the cluster's gates and soak).
    AfterStep {
        /// The Kubernetes step.
        step: usize,
    },
    /// The soak after the whole job (the cluster's gates and soak), before it succeeds.
    AfterJob,
}

impl fmt::Display for GatePoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GatePoint::BeforeJob => f.write_str("before the job"),
            GatePoint::BeforeWave { step, wave } => {
                write!(f, "before wave {} of step {}", wave + 1, step + 1)
            }
            GatePoint::AfterWave { step, wave } => {
                write!(f, "soak after wave {} of step {}", wave + 1, step + 1)
            }
            GatePoint::AfterStep { step } => write!(f, "soak after step {}", step + 1),
            GatePoint::AfterJob => f.write_str("soak after the job"),
        }
    }
}

impl GatePoint {
    /// A short machine name: `before-job`, `before-wave:<step>:<wave>`, `after-wave:…`,
    /// `after-step:<step>`, `after-job` (1-based, for crash points and metrics).
    pub fn name(&self) -> String {
        match self {
            GatePoint::BeforeJob => "before-job".into(),
            GatePoint::BeforeWave { step, wave } => {
                format!("before-wave:{}:{}", step + 1, wave + 1)
            }
            GatePoint::AfterWave { step, wave } => format!("after-wave:{}:{}", step + 1, wave + 1),
            GatePoint::AfterStep { step } => format!("after-step:{}", step + 1),
            GatePoint::AfterJob => "after-job".into(),
        }
    }
}

/// One gate's streak at the point being checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateStreak {
    /// The gate's name.
    pub gate: String,
    /// Since when it has passed every evaluation (`None`: its last evaluation failed, or
    /// none was made yet).
    pub passing_since: Option<Timestamp>,
    /// Failed evaluations since the gate last passed.
    pub consecutive_failures: u32,
    /// Inconclusive evaluations without data since the gate last passed (issue #35).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inconclusive: u32,
    /// Evaluations in a row whose source could not be asked (issue #51 item 4: reset by any
    /// evaluation that reached its source, as Argo Rollouts' consecutive errors).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub consecutive_errors: u32,
    /// A `dryRun` gate: its streak never holds the soak.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The point whose gates are being checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateRun {
    /// The point.
    pub point: GatePoint,
    /// When checking it began.
    pub started: Timestamp,
    /// How long every gate must pass continuously here.
    pub soak_secs: u64,
    /// The next evaluation is due then.
    pub next_at: Timestamp,
    /// Each gate's streak.
    pub streaks: Vec<GateStreak>,
}

impl GateRun {
    /// When the soak ends if every blocking gate keeps passing (`None`: some blocking gate is
    /// failing or inconclusive now). `dryRun` gates never hold it.
    pub fn soak_ends(&self) -> Option<Timestamp> {
        let mut latest = self.started;
        for s in self.streaks.iter().filter(|s| !s.dry_run) {
            latest = latest.max(s.passing_since?);
        }
        Some(add(latest, Duration::from_secs(self.soak_secs)))
    }
}

/// One evaluation kept as evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateRecord {
    /// Where it was evaluated.
    pub point: GatePoint,
    /// When.
    pub at: Timestamp,
    /// The verdict and its evidence.
    #[serde(flatten)]
    pub evaluation: GateEvaluation,
}

/// A failed gate: what the halt reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateFailure {
    /// Where it failed.
    pub point: GatePoint,
    /// The gate's name.
    pub gate: String,
    /// Failed evaluations since the gate last passed (the policy's `failureLimit`), or, when
    /// [`Self::inconclusive`], inconclusive ones (its `inconclusiveLimit`).
    pub failures: u32,
    /// The gate could not be evaluated `inconclusiveLimit` times (issue #35): the job halts
    /// with `gate_inconclusive`, never rolls back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inconclusive: bool,
    /// Why, as the probe said.
    pub detail: String,
    /// The samples of the last evaluation.
    pub samples: Vec<GateSample>,
    /// Nodes rolled back to their previous version before the halt (`onFailure: rollback`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rolled_back: Vec<String>,
}

impl fmt::Display for GateFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.inconclusive {
            write!(
                f,
                "health gate `{}` could not be evaluated {} ({} inconclusive evaluation(s) since it last passed): {}",
                self.gate, self.point, self.failures, self.detail
            )?;
        } else {
            write!(
                f,
                "health gate `{}` failed {} ({} consecutive failed evaluation(s)): {}",
                self.gate, self.point, self.failures, self.detail
            )?;
        }
        if !self.samples.is_empty() {
            f.write_str("; last samples: ")?;
            for (i, s) in self.samples.iter().take(5).enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                let labels: Vec<String> = s
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{v}\""))
                    .collect();
                write!(f, "{{{}}} {}", labels.join(","), s.value)?;
            }
            if self.samples.len() > 5 {
                write!(f, " (+{} more)", self.samples.len() - 5)?;
            }
        }
        if !self.rolled_back.is_empty() {
            write!(
                f,
                "; rolled back to their previous version: {}",
                self.rolled_back.join(", ")
            )?;
        }
        Ok(())
    }
}

/// The gates of a job: points passed, the point being checked, evidence, and a failure whose
/// rollback is under way.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateProgress {
    /// Points whose gates passed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passed: Vec<GatePoint>,
    /// The point being checked, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<GateRun>,
    /// The latest evaluation of each gate, and the last [`MAX_FAILED_RECORDS`] failed or
    /// inconclusive ones, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<GateRecord>,
    /// A gate failed with `onFailure: rollback`: the wave's nodes are being rolled back; the
    /// job halts with this once they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<GateFailure>,
    /// A gate with `onInconclusive: pause` reached its `inconclusiveLimit` (issue #51 item
    /// 4): the job waits at that point for `medea rollout resume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<GatePause>,
}

impl GateProgress {
    /// Whether no gate was ever checked.
    pub fn is_empty(&self) -> bool {
        self == &GateProgress::default()
    }
    /// Whether the gates of `p` passed.
    pub fn passed(&self, p: &GatePoint) -> bool {
        self.passed.contains(p)
    }

    /// Keep `rec`: it replaces the gate's latest passing record; failed and inconclusive ones
    /// are kept up to [`MAX_FAILED_RECORDS`].
    fn record(&mut self, rec: GateRecord) {
        let gate = rec.evaluation.gate.clone();
        // the previous latest of this gate goes, unless it is a kept failure
        if let Some(i) = self
            .evidence
            .iter()
            .rposition(|r| r.evaluation.gate == gate && r.evaluation.verdict == GateVerdict::Pass)
        {
            self.evidence.remove(i);
        }
        self.evidence.push(rec);
        let failed = self
            .evidence
            .iter()
            .filter(|r| r.evaluation.verdict != GateVerdict::Pass)
            .count();
        if failed > MAX_FAILED_RECORDS {
            // drop the oldest failure that is not some gate's latest evaluation
            let latest: BTreeSet<usize> = {
                let mut seen = BTreeSet::new();
                let mut idx = BTreeSet::new();
                for (i, r) in self.evidence.iter().enumerate().rev() {
                    if seen.insert(r.evaluation.gate.clone()) {
                        idx.insert(i);
                    }
                }
                idx
            };
            if let Some(i) = self.evidence.iter().enumerate().position(|(i, r)| {
                r.evaluation.verdict != GateVerdict::Pass && !latest.contains(&i)
            }) {
                self.evidence.remove(i);
            }
        }
    }
}

/// What a job asks the probe to evaluate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateAsk {
    /// Where.
    pub point: GatePoint,
    /// The gates to evaluate.
    pub gates: Vec<crate::plan::health::Gate>,
    /// What the probe may ignore right now.
    pub ctx: GateContext,
}

/// The outcome of a gate point.
pub(super) enum GateFlow {
    /// Every gate passed (for the soak); go on.
    Passed,
    /// Wait, poll, or halt.
    Flow(Flow),
    /// A gate failed: the policy says what happens (always a halt for an inconclusive gate).
    Failed(GateFailure, OnFailure),
}

impl GateFlow {
    /// The flow of a gate point where a failed gate halts (no rollback there): passed is
    /// [`Flow::Done`].
    pub(super) fn or_halt(self) -> Flow {
        match self {
            GateFlow::Passed => Flow::Done,
            GateFlow::Flow(f) => f,
            GateFlow::Failed(f, _) => gate_halt(f),
        }
    }
}

/// The health policy that applies to step `si`: its pool's, else the cluster's.
pub(super) fn step_policy(j: &Job, si: usize) -> Option<HealthPolicy> {
    let own = match j.steps.get(si).map(|s| &s.kind) {
        Some(StepKind::Talos(t)) => t.rollout.health.clone(),
        _ => None,
    };
    own.or_else(|| j.health.clone())
        .filter(|p| !p.gates.is_empty())
}

/// Every node of every Talos step of `j`.
fn talos_nodes(j: &Job) -> impl Iterator<Item = &NodeProgress> {
    j.steps
        .iter()
        .filter_map(|s| match &s.kind {
            StepKind::Talos(t) => Some(t),
            _ => None,
        })
        .flat_map(|t| t.nodes.iter().map(|n| &**n))
}

/// The nodes of `j` medea is rebooting right now: installed and about to reboot, rebooting
/// and not back yet (or rebooting into their previous version in a rollback). Alerts about
/// them are expected; `alerts` gates do not count them.
pub fn rebooting_nodes(j: &Job) -> Vec<String> {
    let mut out: Vec<String> = talos_nodes(j)
        .filter(|n| {
            matches!(n.phase, NodePhase::Upgraded | NodePhase::Rebooting)
                || n.rollback == Some(RollbackPhase::Rebooting)
        })
        .map(|n| n.target.node.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The ids of the Alertmanager silences medea made in `j` (active or over: an expired
/// silence mutes nothing, so listing it is harmless).
pub fn own_silences(j: &Job) -> Vec<String> {
    let mut out: Vec<String> = talos_nodes(j)
        .filter_map(|n| match &n.silence {
            Some(NodeSilence::Active { id, .. }) => Some(id.clone()),
            Some(NodeSilence::Ended { id, .. }) => id.clone(),
            None => None,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The cluster's policy, when it has gates.
pub(super) fn job_policy(j: &Job) -> Option<HealthPolicy> {
    j.health.clone().filter(|p| !p.gates.is_empty())
}

/// Check the gates of `policy` at `point` (soaking `soak`): start the run, wait for the next
/// evaluation, ask for it, fold it in.
pub(super) fn gate_point(
    j: &mut Job,
    point: GatePoint,
    policy: &HealthPolicy,
    soak: Duration,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> GateFlow {
    if let Some(p) = &j.gates.paused {
        return GateFlow::Flow(Flow::Poll(PollWhy::Waiting, p.waiting(&j.id)));
    }
    if j.gates.current.as_ref().map(|r| &r.point) != Some(&point) {
        j.gates.current = Some(start_run(&point, policy, soak, now, notes));
    }
    let Some(mut run) = j.gates.current.clone() else {
        unreachable!("set above")
    };
    if now < run.next_at {
        return GateFlow::Flow(next_evaluation(&run, &point, now));
    }
    let ask = GateAsk {
        point: point.clone(),
        gates: policy.gates.clone(),
        ctx: GateContext {
            cluster: j.cluster.clone(),
            rebooting: rebooting_nodes(j),
            own_silences: own_silences(j),
            sources: policy.sources.clone(),
        },
    };
    let Some(evals) = eyes.gates(ask) else {
        return GateFlow::Flow(Flow::Poll(
            PollWhy::Waiting,
            format!("evaluating the health gates {point}"),
        ));
    };
    if let Some((f, pause)) = fold(j, &mut run, &point, policy, evals, now, notes) {
        j.gates.current = None;
        if pause {
            let p = GatePause::new(&f, now);
            notes.push(p.note(&j.id));
            let waiting = p.waiting(&j.id);
            j.gates.paused = Some(p);
            return GateFlow::Flow(Flow::Poll(PollWhy::Waiting, waiting));
        }
        // not knowing is no reason to undo a wave: an inconclusive gate halts
        let on = if f.inconclusive {
            OnFailure::Halt
        } else {
            policy.on_failure
        };
        return GateFlow::Failed(f, on);
    }
    match run.soak_ends() {
        Some(end) if end <= now => {
            j.gates.current = None;
            j.gates.passed.push(point.clone());
            notes.push(format!("health gates passed {point}"));
            GateFlow::Passed
        }
        end => {
            run.next_at = add(now, policy.interval.max(Duration::from_secs(1)));
            // never evaluate past the end of the soak needlessly late
            if let Some(end) = end
                && end > now
                && end < run.next_at
            {
                run.next_at = end;
            }
            let at = run.next_at;
            j.gates.current = Some(run);
            GateFlow::Flow(Flow::Wait(
                at,
                format!("health gates {point}: soaking, next evaluation at {at}"),
            ))
        }
    }
}

/// What holds a soak, for the status line (the CLI and the dashboard say it alike): the
/// blocking gates whose latest verdict at the point is not a pass — `, gate `ceph` is
/// failing`, `, gate `prom-up` is inconclusive (medea could not tell)`, `, gates `a` (fail),
/// `b` (inconclusive)` — or, when none is known, `, a gate has not passed yet`. `evidence` is
/// the point's evaluations, oldest first, as (gate, verdict, dry run); the latest of each gate
/// counts and dry-run gates never hold a soak.
pub fn holding_phrase<'a>(
    evidence: impl DoubleEndedIterator<Item = (&'a str, GateVerdict, bool)>,
) -> String {
    let mut latest: Vec<(&str, GateVerdict)> = Vec::new();
    for (gate, verdict, dry_run) in evidence.rev() {
        if !dry_run && !latest.iter().any(|(g, _)| *g == gate) {
            latest.push((gate, verdict));
        }
    }
    latest.reverse();
    latest.retain(|(_, v)| *v != GateVerdict::Pass);
    match latest.as_slice() {
        [] => ", a gate has not passed yet".into(),
        [(g, GateVerdict::Inconclusive)] => {
            format!(", gate `{g}` is inconclusive (medea could not tell)")
        }
        [(g, _)] => format!(", gate `{g}` is failing"),
        many => format!(
            ", gates {}",
            many.iter()
                .map(|(g, v)| format!("`{g}` ({v})"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// [`holding_phrase`] of `progress`'s current run, from its evidence.
pub fn holding_run(progress: &GateProgress) -> String {
    let point = progress.current.as_ref().map(|r| &r.point);
    holding_phrase(
        progress
            .evidence
            .iter()
            .filter(|r| Some(&r.point) == point)
            .map(|r| {
                (
                    r.evaluation.gate.as_str(),
                    r.evaluation.verdict,
                    r.evaluation.dry_run,
                )
            }),
    )
}

/// A new run of the gates at `point`: every streak empty, the first evaluation now.
fn start_run(
    point: &GatePoint,
    policy: &HealthPolicy,
    soak: Duration,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> GateRun {
    notes.push(format!(
        "health gates: checking {point} ({} gate(s){})",
        policy.gates.len(),
        if soak.is_zero() {
            String::new()
        } else {
            format!(", soak {}s", soak.as_secs())
        }
    ));
    GateRun {
        point: point.clone(),
        started: now,
        soak_secs: soak.as_secs(),
        next_at: now,
        streaks: policy
            .gates
            .iter()
            .map(|g| GateStreak {
                gate: g.name.clone(),
                passing_since: None,
                consecutive_failures: 0,
                inconclusive: 0,
                consecutive_errors: 0,
                dry_run: g.dry_run,
            })
            .collect(),
    }
}

/// The wait until `run`'s next evaluation, saying what is left.
fn next_evaluation(run: &GateRun, point: &GatePoint, now: Timestamp) -> Flow {
    let left = match run.soak_ends() {
        Some(end) if end > now => format!(
            "{}s of the soak left",
            Duration::try_from(end.duration_since(now))
                .unwrap_or_default()
                .as_secs()
        ),
        _ => "a gate is failing or inconclusive".into(),
    };
    Flow::Wait(
        run.next_at,
        format!(
            "health gates {point}: next evaluation at {} ({left})",
            run.next_at
        ),
    )
}

/// Fold the evaluations `evals` into `run`'s streaks and the job's evidence (a gate without
/// one is inconclusive: the probe returned none); the first blocking gate that reached the
/// policy's failure or inconclusive limit, if any. `dryRun` gates are counted and recorded,
/// never returned.
fn fold(
    j: &mut Job,
    run: &mut GateRun,
    point: &GatePoint,
    policy: &HealthPolicy,
    evals: &[GateEvaluation],
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Option<(GateFailure, bool)> {
    let limit = policy.failure_limit.max(1);
    let inconclusive_limit = policy.inconclusive_limit.max(1);
    let mut failure: Option<(GateFailure, bool)> = None;
    for (g, streak) in policy.gates.iter().zip(run.streaks.iter_mut()) {
        let mut eval = evals
            .iter()
            .find(|e| e.gate == g.name)
            .cloned()
            .unwrap_or_else(|| GateEvaluation {
                gate: g.name.clone(),
                verdict: GateVerdict::Inconclusive,
                samples: Vec::new(),
                detail: "the probe returned no evaluation for this gate".into(),
                dry_run: g.dry_run,
                error: true,
            });
        // the approved plan says whether the gate blocks, whatever the probe set
        eval.dry_run = g.dry_run;
        streak.dry_run = g.dry_run;
        let shadow = if g.dry_run { " (dry run)" } else { "" };
        // (count, inconclusive, pause): what a limit reached here does
        let reached = match eval.verdict {
            GateVerdict::Pass => {
                streak.passing_since.get_or_insert(now);
                streak.consecutive_failures = 0;
                streak.inconclusive = 0;
                streak.consecutive_errors = 0;
                None
            }
            GateVerdict::Fail => {
                streak.passing_since = None;
                streak.consecutive_errors = 0;
                streak.consecutive_failures += 1;
                notes.push(format!(
                    "health gate `{}`{shadow} failed {point} ({} of {limit}): {}",
                    g.name, streak.consecutive_failures, eval.detail
                ));
                (streak.consecutive_failures >= limit).then_some((
                    streak.consecutive_failures,
                    false,
                    false,
                ))
            }
            // the source could not be asked: a run of these halts (never pauses), and one
            // that reached its source ends the run
            GateVerdict::Inconclusive if eval.error => {
                streak.passing_since = None;
                streak.consecutive_errors += 1;
                let errors = g.consecutive_error_limit.max(1);
                notes.push(format!(
                    "health gate `{}`{shadow} could not ask its source {point} ({} of {errors} in a row): {}",
                    g.name, streak.consecutive_errors, eval.detail
                ));
                (streak.consecutive_errors >= errors).then_some((
                    streak.consecutive_errors,
                    true,
                    false,
                ))
            }
            GateVerdict::Inconclusive => {
                streak.passing_since = None;
                streak.consecutive_errors = 0;
                streak.inconclusive += 1;
                notes.push(format!(
                    "health gate `{}`{shadow} was inconclusive {point} ({} of {inconclusive_limit}): {}",
                    g.name, streak.inconclusive, eval.detail
                ));
                (streak.inconclusive >= inconclusive_limit).then_some((
                    streak.inconclusive,
                    true,
                    g.on_inconclusive == OnInconclusive::Pause,
                ))
            }
        };
        if let Some((count, inconclusive, pause)) = reached
            && !g.dry_run
            && failure.as_ref().is_none_or(|(_, p)| *p && !pause)
        {
            // a halt wins over a pause of another gate in the same evaluation
            failure = Some((
                GateFailure {
                    point: point.clone(),
                    gate: g.name.clone(),
                    failures: count,
                    inconclusive,
                    detail: eval.detail.clone(),
                    samples: eval.samples.clone(),
                    rolled_back: Vec::new(),
                },
                pause,
            ));
        }
        j.gates.record(GateRecord {
            point: point.clone(),
            at: now,
            evaluation: eval,
        });
    }
    failure
}

/// Halt for a gate failure (no rollback, or the rollback is over).
pub(super) fn gate_halt(failure: GateFailure) -> Flow {
    let code = if failure.inconclusive {
        HaltCode::GateInconclusive
    } else if failure.rolled_back.is_empty() {
        HaltCode::GateFailed
    } else {
        HaltCode::RolledBack
    };
    Flow::Halt {
        reason: HaltReason::gate(code, failure),
        node: None,
        op: None,
    }
}
