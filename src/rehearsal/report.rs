//! What a rehearsal found: the predicted timeline per wave and the blockers, stored with the
//! plan under [`rehearsal_key`] and never part of its id.

use serde::{Deserialize, Serialize};

/// Where the rehearsal of `plan` (full id) for `cluster` is stored.
pub fn rehearsal_key(plan: &str, cluster: &str) -> String {
    format!("rehearsal/{plan}/{cluster}")
}

/// Stored in the plans table under [`rehearsal_key`], its own record beside the plan's:
/// writing it never touches the plan record (nor its id).
impl crate::store::Record for Rehearsal {
    const TABLE: crate::store::Table = crate::store::Table::Plans;
    const KIND: &'static str = "rehearsal";
    const SCHEMA: u32 = 1;
}

/// One rehearsal of one cluster's part of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rehearsal {
    /// The plan's full id.
    pub plan: String,
    /// The cluster rehearsed.
    pub cluster: String,
    /// When the rehearsal ran (RFC 3339 UTC).
    pub ran_at: String,
    /// When the census it used was gathered; empty when there was none (nodes only).
    pub census_gathered_at: String,
    /// How much faster than real time the twin ran (60: one real minute per second).
    pub compression: u32,
    /// Where the per-node timings came from: `history of N jobs` or `defaults`.
    pub timings: String,
    /// The predicted timeline, in real (uncompressed) seconds from the job's start.
    pub waves: Vec<RehearsedWave>,
    /// How the run on the twin ended.
    pub outcome: Outcome,
    /// Everything that would stop or slow the real run, in the order met.
    pub blockers: Vec<Blocker>,
    /// What the twin could not model for this cluster (a truncated census, sources that
    /// could not be read), one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<String>,
}

/// One wave as the twin ran it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RehearsedWave {
    /// The step's label as the plan shows it (`talos controlplane`, `kubernetes`).
    pub step: String,
    /// 1-based wave number within the step.
    pub wave: usize,
    /// The wave's nodes, in the plan's order.
    pub nodes: Vec<String>,
    /// Predicted start, seconds after the job starts (real time).
    pub start_secs: u64,
    /// Predicted duration in real seconds; `None` when the wave never finished on the twin.
    pub duration_secs: Option<u64>,
}

/// How the run on the twin ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Outcome {
    /// Every step finished; `total_secs` is the predicted real duration.
    Completed {
        /// The predicted real duration of the whole job, in seconds.
        total_secs: u64,
    },
    /// The job halted on the twin, as the real one is predicted to.
    Halted {
        /// The halt code (`drain_failed`, `pool_unavailable`, …).
        code: String,
        /// The node it halted at, when the halt names one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        /// The halt's reason, as the job records it.
        reason: String,
        /// When it halted, in real seconds after the job started.
        after_secs: u64,
    },
    /// The twin could not run the plan (it could not start, or the run did not end within
    /// its bound); the reason says why. Never read as a pass.
    NotRun {
        /// Why it did not run, one line.
        reason: String,
    },
}

/// Something that would block or slow the real run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Blocker {
    /// What kind of blocker it is.
    pub kind: BlockerKind,
    /// The node it was met at, when it is about one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// One line, naming the object (`PodDisruptionBudget shop/db allows no disruption`).
    pub detail: String,
}

/// The kinds of blockers a rehearsal reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BlockerKind {
    /// A PodDisruptionBudget allowed no eviction on a node until the drain timed out.
    Pdb,
    /// A pod without a controller under `evictUnmanagedPods: false`.
    UnmanagedPod,
    /// A pod with local storage (emptyDir) under `deleteEmptyDirData: false`.
    LocalStorage,
    /// A flag or API the target version removed.
    RemovedFlag,
    /// A node's predicted time does not fit in the maintenance window.
    WindowTooShort,
    /// Any other halt of the twin's run.
    Halt,
}

// ---------------------------------------------------------------------------------------
// Building a report from the twin's run (pure: the job and its journal come in)

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use crate::rollout::journal::{Entry, JournalEntry};
use crate::rollout::ports::DrainOutcome;
use crate::rollout::sequencer::{CommandOp, CommandOutcome, StepKind};
use crate::rollout::{HaltCode, Job, JobState};

/// What a report says beside what the run produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportMeta {
    /// The plan's full id.
    pub plan: String,
    /// The cluster.
    pub cluster: String,
    /// When the rehearsal ran (RFC 3339 UTC).
    pub ran_at: String,
    /// When the census was gathered; empty: none.
    pub census_gathered_at: String,
    /// The compression factor.
    pub compression: u32,
    /// Where the per-node timings came from.
    pub timings: String,
    /// What the twin could not model, one line each (the twin's and the compression's).
    pub limits: Vec<String>,
    /// The longest of the cluster's maintenance windows; `None`: no windows (any time).
    pub longest_window: Option<Duration>,
    /// Why the run did not end, when it did not (the job is still running).
    pub not_ended: Option<String>,
}

/// Twin time from `a` to `b`, scaled back to real whole seconds (`factor` times longer).
fn real_secs(a: Timestamp, b: Timestamp, factor: u32) -> u64 {
    let twin = Duration::try_from(b.duration_since(a)).unwrap_or(Duration::ZERO);
    let real = twin.as_secs_f64() * f64::from(factor.max(1));
    real.round() as u64
}

/// The label of a step as the plan shows it.
fn step_label(kind: &StepKind) -> String {
    match kind {
        StepKind::Talos(t) if t.rollout.hops > 1 => format!(
            "talos {} (hop {}/{})",
            t.rollout.pool, t.rollout.hop, t.rollout.hops
        ),
        StepKind::Talos(t) => format!("talos {}", t.rollout.pool),
        StepKind::Kubernetes(_) => "kubernetes".to_string(),
    }
}

/// The rehearsal of `job` (the twin's job, in its final state) from its journal `entries`.
pub fn build(meta: ReportMeta, job: &Job, entries: &[JournalEntry]) -> Rehearsal {
    let factor = meta.compression.max(1);
    let start = entries
        .iter()
        .find(|e| matches!(e.entry, Entry::Created { .. }))
        .map_or(job.created_at, |e| e.at);
    // (step, node, op) → first intent, last result; per step its first and last entry.
    let mut intents: BTreeMap<(usize, &str, CommandOp), Timestamp> = BTreeMap::new();
    let mut results: BTreeMap<(usize, &str, CommandOp), Timestamp> = BTreeMap::new();
    let mut step_span: BTreeMap<usize, (Timestamp, Timestamp)> = BTreeMap::new();
    // The last drain of each node a PodDisruptionBudget refused: (pdb, pod).
    let mut refused: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for e in entries {
        let (key, is_intent) = match &e.entry {
            Entry::Intent { key, .. } => (key, true),
            Entry::Result { key, outcome } => {
                if let (
                    Some(node),
                    CommandOutcome::Drain {
                        result: DrainOutcome::Blocked { pdb, pod, .. },
                    },
                ) = (key.node.as_deref(), outcome)
                {
                    refused.insert(node, (pdb.as_str(), pod.as_str()));
                }
                (key, false)
            }
            _ => continue,
        };
        let node = key.node.as_deref().unwrap_or("");
        let k = (key.step, node, key.op);
        if is_intent {
            let t = intents.entry(k).or_insert(e.at);
            *t = (*t).min(e.at);
        } else {
            let t = results.entry(k).or_insert(e.at);
            *t = (*t).max(e.at);
        }
        let s = step_span.entry(key.step).or_insert((e.at, e.at));
        s.0 = s.0.min(e.at);
        s.1 = s.1.max(e.at);
    }
    let mut waves = Vec::new();
    // Per node, its predicted time (real seconds): first command to its uncordon.
    let mut node_secs: Vec<(String, u64)> = Vec::new();
    for (si, step) in job.steps.iter().enumerate() {
        let label = step_label(&step.kind);
        match &step.kind {
            StepKind::Talos(t) => {
                let mut by_wave: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
                for n in &t.nodes {
                    by_wave.entry(n.wave).or_default().push(&n.target.node);
                }
                for (w, nodes) in by_wave {
                    let first = |node: &str| {
                        [CommandOp::Pull, CommandOp::Cordon, CommandOp::Upgrade]
                            .iter()
                            .filter_map(|op| intents.get(&(si, node, *op)).copied())
                            .min()
                    };
                    let done = |node: &str| results.get(&(si, node, CommandOp::Uncordon)).copied();
                    let Some(begin) = nodes.iter().filter_map(|n| first(n)).min() else {
                        continue; // never started
                    };
                    let all_done = nodes.iter().all(|n| done(n).is_some());
                    let end = nodes.iter().filter_map(|n| done(n)).max();
                    for n in &nodes {
                        if let (Some(a), Some(b)) = (first(n), done(n)) {
                            node_secs.push((n.to_string(), real_secs(a, b, factor)));
                        }
                    }
                    waves.push(RehearsedWave {
                        step: label.clone(),
                        wave: w + 1,
                        nodes: nodes.iter().map(|n| n.to_string()).collect(),
                        start_secs: real_secs(start, begin, factor),
                        duration_secs: end
                            .filter(|_| all_done)
                            .map(|e| real_secs(begin, e, factor)),
                    });
                }
            }
            StepKind::Kubernetes(k) => {
                let Some((a, b)) = step_span.get(&si).copied() else {
                    continue;
                };
                waves.push(RehearsedWave {
                    step: label,
                    wave: 1,
                    nodes: k
                        .control_plane
                        .iter()
                        .chain(&k.workers)
                        .map(|n| n.node.clone())
                        .collect(),
                    start_secs: real_secs(start, a, factor),
                    duration_secs: (step.state == crate::rollout::sequencer::StepState::Done)
                        .then(|| real_secs(a, b, factor)),
                });
            }
        }
    }
    let mut blockers = Vec::new();
    let outcome = match &job.state {
        JobState::Succeeded { at } => Outcome::Completed {
            total_secs: real_secs(start, *at, factor),
        },
        JobState::Halted {
            reason, node, at, ..
        } => {
            blockers.push(halt_blocker(reason, node, &refused));
            Outcome::Halted {
                code: reason.code().as_str().to_string(),
                node: node.clone(),
                reason: reason.message().to_string(),
                after_secs: real_secs(start, *at, factor),
            }
        }
        JobState::Running => Outcome::NotRun {
            reason: meta
                .not_ended
                .clone()
                .unwrap_or_else(|| "the run on the twin did not end".to_string()),
        },
    };
    if let Some(window) = meta.longest_window {
        for (node, secs) in &node_secs {
            if *secs > window.as_secs() {
                blockers.push(Blocker {
                    kind: BlockerKind::WindowTooShort,
                    node: Some(node.clone()),
                    detail: format!(
                        "node {node} is predicted to take {secs}s, longer than the longest maintenance window ({}s)",
                        window.as_secs()
                    ),
                });
            }
        }
    }
    Rehearsal {
        plan: meta.plan,
        cluster: meta.cluster,
        ran_at: meta.ran_at,
        census_gathered_at: meta.census_gathered_at,
        compression: factor,
        timings: meta.timings,
        waves,
        outcome,
        blockers,
        limits: meta.limits,
    }
}

/// The blocker a halt stands for, by its code and its typed cause ([`HaltCause`]), never by
/// its text.
fn halt_blocker(
    reason: &crate::rollout::sequencer::HaltReason,
    node: &Option<String>,
    refused: &BTreeMap<&str, (&str, &str)>,
) -> Blocker {
    use crate::rollout::ports::Refusal;
    use crate::rollout::sequencer::HaltCause;
    let (code, message) = (reason.code(), reason.message());
    let at = node.as_deref().and_then(|n| refused.get(n));
    let (kind, detail) = match (code, at, reason.cause()) {
        (HaltCode::DrainBlocked, Some((pdb, pod)), _) => (
            BlockerKind::Pdb,
            format!(
                "PodDisruptionBudget {pdb} allows no disruption: the eviction of {pod} was refused until the drain timed out"
            ),
        ),
        (
            _,
            _,
            Some(HaltCause::DrainRefused {
                refusal: Refusal::LocalStorage,
            }),
        ) => (BlockerKind::LocalStorage, message.to_string()),
        (
            _,
            _,
            Some(HaltCause::DrainRefused {
                refusal: Refusal::UnmanagedPods,
            }),
        ) => (BlockerKind::UnmanagedPod, message.to_string()),
        (HaltCode::PrecheckFailed, _, Some(HaltCause::RemovedSettings)) => {
            (BlockerKind::RemovedFlag, message.to_string())
        }
        _ => (BlockerKind::Halt, format!("{}: {message}", code.as_str())),
    };
    Blocker {
        kind,
        node: node.clone(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::model::DrainPolicy;
    use crate::inventory::MachineRole;
    use crate::plan::{MachineTarget, PlanId, TalosRollout};
    use crate::rollout::sequencer::{Action, CommandKey, StepState};
    use crate::rollout::{HaltReason, JobId};
    use crate::version::TalosVersion;

    const FACTOR: u32 = 60;

    /// Twin time: `s` seconds after the job was created.
    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    /// Workers w-1 and w-2 in wave 1, w-3 in wave 2, on the twin.
    fn job() -> Job {
        let v = |s| TalosVersion::parse(s).unwrap();
        let target = |n: &str, i: u8| MachineTarget {
            node: n.into(),
            id: format!("id-{n}"),
            address: format!("127.77.0.{i}"),
            from: v("v1.12.11"),
            image: None,
        };
        let rollout = TalosRollout {
            pool: "workers".into(),
            role: MachineRole::Worker,
            hop: 1,
            hops: 1,
            to: v("v1.13.0"),
            image: "factory.talos.dev/installer/x:v1.13.0".into(),
            max_unavailable: 2,
            drain_timeout: Duration::from_secs(10),
            health_timeout: Duration::from_secs(15),
            upgrade_attempts: 1,
            drain: DrainPolicy::default(),
            taint_next_wave: false,
            waves: vec![
                vec![target("w-1", 3), target("w-2", 4)],
                vec![target("w-3", 5)],
            ],
            health: None,
            silence: None,
            hooks: None,
            stage: None,
        };
        let plan = PlanId::from_digest([7; 32]);
        Job::one_talos_step(plan, at(0), StepState::Running, rollout)
    }

    struct Journal {
        job: JobId,
        entries: Vec<JournalEntry>,
    }

    impl Journal {
        fn new(job: &Job) -> Journal {
            let mut j = Journal {
                job: job.id.clone(),
                entries: Vec::new(),
            };
            j.push(
                0,
                Entry::Created {
                    plan: job.plan.clone(),
                },
            );
            j
        }
        fn push(&mut self, s: i64, entry: Entry) {
            self.entries.push(JournalEntry {
                job: self.job.clone(),
                seq: self.entries.len() as u64,
                at: at(s),
                generation: self.entries.len() as u64 + 1,
                entry,
                notes: Vec::new(),
                delta: None,
            });
        }
        fn key(&self, node: &str, op: CommandOp) -> CommandKey {
            CommandKey {
                job: self.job.clone(),
                step: 0,
                node: Some(node.into()),
                op,
                attempt: 1,
            }
        }
        fn intent(&mut self, s: i64, node: &str, op: CommandOp, action: Action) {
            let key = self.key(node, op);
            self.push(s, Entry::Intent { key, action });
        }
        fn result(&mut self, s: i64, node: &str, op: CommandOp, outcome: CommandOutcome) {
            let key = self.key(node, op);
            self.push(s, Entry::Result { key, outcome });
        }
        /// A node from its cordon (`from`) to its uncordon's result (`to`).
        fn node(&mut self, from: i64, to: i64, node: &str) {
            let cordon = Action::Cordon { node: node.into() };
            self.intent(from, node, CommandOp::Cordon, cordon);
            self.result(from, node, CommandOp::Cordon, CommandOutcome::Done);
            let uncordon = Action::Uncordon { node: node.into() };
            self.intent(to, node, CommandOp::Uncordon, uncordon);
            self.result(to, node, CommandOp::Uncordon, CommandOutcome::Done);
        }
    }

    fn meta(longest_window: Option<Duration>) -> ReportMeta {
        ReportMeta {
            plan: "plan-full-id".into(),
            cluster: "home".into(),
            ran_at: "2026-12-06T20:00:00Z".into(),
            census_gathered_at: "2026-12-06T19:55:00Z".into(),
            compression: FACTOR,
            timings: "defaults".into(),
            limits: vec!["2 HTTP hook(s) are not called from the twin".into()],
            longest_window,
            not_ended: None,
        }
    }

    #[test]
    fn a_drain_halted_by_a_budget_gives_the_timeline_in_real_seconds_and_a_pdb_blocker() {
        let mut j = job();
        let mut journal = Journal::new(&j);
        // wave 1: w-1 from 1 s to 11 s, w-2 from 2 s to 12 s (twin time)
        journal.node(1, 11, "w-1");
        journal.node(2, 12, "w-2");
        // wave 2: w-3's drain is refused by shop/db until its timeout
        let cordon = Action::Cordon { node: "w-3".into() };
        journal.intent(13, "w-3", CommandOp::Cordon, cordon);
        journal.result(13, "w-3", CommandOp::Cordon, CommandOutcome::Done);
        let drain = Action::Drain {
            node: "w-3".into(),
            timeout_secs: 10,
            policy: DrainPolicy::default(),
        };
        journal.intent(14, "w-3", CommandOp::Drain, drain);
        journal.result(
            24,
            "w-3",
            CommandOp::Drain,
            CommandOutcome::Drain {
                result: DrainOutcome::Blocked {
                    pdb: "shop/db".into(),
                    pod: "shop/db-0".into(),
                    volumes: None,
                },
            },
        );
        j.state = JobState::Halted {
            reason: HaltReason::new(
                HaltCode::DrainBlocked,
                "drain of w-3 blocked by PodDisruptionBudget shop/db",
            ),
            step: Some(0),
            node: Some("w-3".into()),
            op: Some(CommandOp::Drain),
            at: at(24),
        };
        let r = build(meta(None), &j, &journal.entries);
        assert_eq!(
            r.waves,
            [
                RehearsedWave {
                    step: "talos workers".into(),
                    wave: 1,
                    nodes: vec!["w-1".into(), "w-2".into()],
                    start_secs: 60,
                    duration_secs: Some(660),
                },
                RehearsedWave {
                    step: "talos workers".into(),
                    wave: 2,
                    nodes: vec!["w-3".into()],
                    start_secs: 780,
                    duration_secs: None,
                },
            ]
        );
        assert_eq!(
            r.outcome,
            Outcome::Halted {
                code: "drain_blocked".into(),
                node: Some("w-3".into()),
                reason: "drain of w-3 blocked by PodDisruptionBudget shop/db".into(),
                after_secs: 1440,
            }
        );
        assert_eq!(r.blockers.len(), 1, "{:?}", r.blockers);
        let b = &r.blockers[0];
        assert_eq!((b.kind, b.node.as_deref()), (BlockerKind::Pdb, Some("w-3")));
        assert!(
            b.detail.contains("PodDisruptionBudget shop/db") && b.detail.contains("shop/db-0"),
            "{}",
            b.detail
        );
        assert_eq!(
            (r.compression, r.plan.as_str(), r.cluster.as_str()),
            (60, "plan-full-id", "home")
        );
        assert_eq!(r.limits, ["2 HTTP hook(s) are not called from the twin"]);
    }

    #[test]
    fn a_completed_run_gives_its_total_and_a_node_longer_than_the_window_is_a_blocker() {
        let mut j = job();
        let mut journal = Journal::new(&j);
        journal.node(1, 11, "w-1");
        journal.node(2, 12, "w-2");
        journal.node(13, 15, "w-3");
        j.steps[0].state = StepState::Done;
        j.state = JobState::Succeeded { at: at(16) };
        // the longest window is 599 s: w-1 and w-2 take 600 s each (real), w-3 takes 120 s
        let r = build(meta(Some(Duration::from_secs(599))), &j, &journal.entries);
        assert_eq!(r.outcome, Outcome::Completed { total_secs: 960 });
        assert_eq!(
            r.waves
                .iter()
                .map(|w| (w.start_secs, w.duration_secs))
                .collect::<Vec<_>>(),
            [(60, Some(660)), (780, Some(120))]
        );
        let too_long: Vec<(BlockerKind, Option<&str>)> = r
            .blockers
            .iter()
            .map(|b| (b.kind, b.node.as_deref()))
            .collect();
        assert_eq!(
            too_long,
            [
                (BlockerKind::WindowTooShort, Some("w-1")),
                (BlockerKind::WindowTooShort, Some("w-2")),
            ]
        );
        assert!(
            r.blockers[0].detail.contains("600s"),
            "{}",
            r.blockers[0].detail
        );
    }

    #[test]
    fn a_run_that_did_not_end_is_never_read_as_a_pass() {
        let j = job();
        let mut journal = Journal::new(&j);
        journal.node(1, 11, "w-1");
        let mut m = meta(None);
        m.not_ended = Some("the twin's run did not end within 120 s".into());
        let r = build(m, &j, &journal.entries);
        assert_eq!(
            r.outcome,
            Outcome::NotRun {
                reason: "the twin's run did not end within 120 s".into()
            }
        );
        assert_eq!(r.waves.len(), 1, "wave 2 never started: {:?}", r.waves);
        assert_eq!(r.waves[0].duration_secs, None, "w-2 never finished");
        assert!(r.blockers.is_empty());
    }

    /// Issue 50 item 3: a halt's blocker comes from its typed cause, not its text. A halt
    /// worded like a drain refusal without the cause is a plain halt; a refusal or a removed
    /// setting whose wording changes keeps its kind.
    #[test]
    fn a_halt_is_classified_by_its_typed_cause_never_by_its_text() {
        use crate::rollout::ports::Refusal;
        use crate::rollout::sequencer::{HaltCause, HaltReason};
        let node = Some("w-1".to_string());
        let none = BTreeMap::new();
        let kind = |r: HaltReason| halt_blocker(&r, &node, &none).kind;
        // the old texts, no cause: nothing but a halt
        for text in [
            "drain on `w-1` failed: refusing to drain node `w-1`: pods a/b use emptyDir (node-local) storage that eviction would delete",
            "drain on `w-1` failed: refusing to drain node `w-1`: pods a/b have no controller and would not come back",
        ] {
            assert_eq!(
                kind(HaltReason::new(HaltCode::CommandFailed, text)),
                BlockerKind::Halt,
                "{text}"
            );
        }
        assert_eq!(
            kind(HaltReason::new(
                HaltCode::PrecheckFailed,
                "pre-check failed: Kubernetes v1.35.0 removed settings the machine configuration still sets"
            )),
            BlockerKind::Halt
        );
        // the causes, whatever the words
        let refused = |r: Refusal| {
            HaltReason::new(HaltCode::CommandFailed, "reworded")
                .with_cause(HaltCause::DrainRefused { refusal: r })
        };
        assert_eq!(
            kind(refused(Refusal::LocalStorage)),
            BlockerKind::LocalStorage
        );
        assert_eq!(
            kind(refused(Refusal::UnmanagedPods)),
            BlockerKind::UnmanagedPod
        );
        assert_eq!(
            kind(
                HaltReason::new(HaltCode::PrecheckFailed, "reworded")
                    .with_cause(HaltCause::RemovedSettings)
            ),
            BlockerKind::RemovedFlag
        );
        // and the cause is kept in the job record (JSON), absent when there is none
        let json = serde_json::to_value(refused(Refusal::LocalStorage)).expect("json");
        assert_eq!(
            json["cause"],
            serde_json::json!({"kind": "drainRefused", "refusal": "localStorage"})
        );
        let plain =
            serde_json::to_value(HaltReason::new(HaltCode::CommandFailed, "x")).expect("json");
        assert!(plain.get("cause").is_none(), "{plain}");
    }
}
