//! A finished job's timings, read back from its journal (issue #36 item 3): the samples the
//! duration estimate ([`crate::plan::estimate`]) is built from. Pure: the job and its journal
//! entries come in.
//!
//! Every Talos sample is kept twice: by role, and by pool (issue #51 item 2), so a pool is
//! predicted from its own history where it has one.
//!
//! Per Talos node: from its first command of the step (its pull, or its cordon when the pull
//! was made ahead of its turn and so overlapped the wave before) to the result of its
//! uncordon; a node medea did not uncordon (cordoned before the job) or that was skipped gives
//! no sample. Phases: pull (intent → result), drain (cordon intent → drain result), install
//! (upgrade intent → result), reboot (reboot intent, or the legacy upgrade's result, → uncordon
//! intent). Per Talos wave: from its first cordon intent to the next wave's first cordon
//! intent (the last wave: to its last uncordon result), less the step's gate soak, when every
//! node of the wave was cordoned and uncordoned by the job; it holds the slowest node and the
//! executor's time between waves, which node samples miss. Per Kubernetes node: the step's
//! span (first intent to its last entry) divided by its nodes.
//!
//! A job's window time ([`window`]: its first cordon intent to its last uncordon result, the
//! time nodes were taken out of service) and its staging time ([`staging`]: installs ahead of
//! the windows, issue #36 item 1) are read from the same journal (`medea bench window`).

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use super::journal::{Entry, JournalEntry};
use super::sequencer::{CommandOp, Job, StepKind};
use crate::inventory::MachineRole;
use crate::plan::estimate::{JobSamples, PoolSamples};

fn span(a: Timestamp, b: Timestamp) -> Option<Duration> {
    Duration::try_from(b.duration_since(a)).ok()
}

/// The samples of `job` from its journal `entries` (any order).
pub fn samples(job: &Job, entries: &[JournalEntry]) -> JobSamples {
    // (step, node, op) → first intent, last result
    let mut intents: BTreeMap<(usize, Option<&str>, CommandOp), Timestamp> = BTreeMap::new();
    let mut results: BTreeMap<(usize, Option<&str>, CommandOp), Timestamp> = BTreeMap::new();
    let mut step_first: BTreeMap<usize, Timestamp> = BTreeMap::new();
    let mut step_last: BTreeMap<usize, Timestamp> = BTreeMap::new();
    for e in entries {
        let (key, is_intent) = match &e.entry {
            Entry::Intent { key, .. } => (key, true),
            Entry::Result { key, .. } => (key, false),
            _ => continue,
        };
        let k = (key.step, key.node.as_deref(), key.op);
        if is_intent {
            let t = intents.entry(k).or_insert(e.at);
            *t = (*t).min(e.at);
            let f = step_first.entry(key.step).or_insert(e.at);
            *f = (*f).min(e.at);
        } else {
            let t = results.entry(k).or_insert(e.at);
            *t = (*t).max(e.at);
        }
        let l = step_last.entry(key.step).or_insert(e.at);
        *l = (*l).max(e.at);
    }
    let mut out = JobSamples::default();
    let mut phase = |name: &str, d: Option<Duration>| {
        if let Some(d) = d {
            out.phases.entry(name.to_string()).or_default().push(d);
        }
    };
    let mut nodes: Vec<(MachineRole, Duration)> = Vec::new();
    // per pool (issue #51 item 2): (node samples, wave samples)
    let mut pools: BTreeMap<String, PoolSamples> = BTreeMap::new();
    for (si, step) in job.steps.iter().enumerate() {
        match &step.kind {
            StepKind::Talos(t) => {
                // wave → (first cordon intent, last uncordon result, every node done)
                let mut waves: BTreeMap<usize, (Option<Timestamp>, Option<Timestamp>, bool)> =
                    BTreeMap::new();
                for n in &t.nodes {
                    let node = Some(n.target.node.as_str());
                    let cordon = intents.get(&(si, node, CommandOp::Cordon)).copied();
                    let uncordon = results.get(&(si, node, CommandOp::Uncordon)).copied();
                    let w = waves.entry(n.wave).or_insert((None, None, true));
                    w.0 = match (w.0, cordon) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    w.1 = w.1.max(uncordon);
                    w.2 &= cordon.is_some() && uncordon.is_some();
                }
                let soak = t
                    .rollout
                    .health
                    .as_ref()
                    .or(job.health.as_ref())
                    .filter(|h| !h.gates.is_empty())
                    .map_or(Duration::ZERO, |h| h.soak);
                let starts: Vec<Option<Timestamp>> = waves.values().map(|v| v.0).collect();
                for (i, (start, end, complete)) in waves.values().enumerate() {
                    let next = starts.get(i + 1).copied().flatten();
                    let until = next.or(*end);
                    if let (true, Some(s), Some(e)) = (*complete, start, until)
                        && let Some(d) = span(*s, e)
                    {
                        let sample = d.saturating_sub(soak);
                        match t.rollout.role {
                            MachineRole::Controlplane => out.controlplane_wave.push(sample),
                            MachineRole::Worker => out.worker_wave.push(sample),
                        }
                        pools
                            .entry(t.rollout.pool.clone())
                            .or_default()
                            .wave
                            .push(sample);
                    }
                }
                for n in &t.nodes {
                    let node = Some(n.target.node.as_str());
                    let at = |op| intents.get(&(si, node, op)).copied();
                    let done = |op| results.get(&(si, node, op)).copied();
                    let start = at(CommandOp::Pull).or(at(CommandOp::Cordon));
                    if let (Some(s), Some(e)) = (start, done(CommandOp::Uncordon))
                        && let Some(d) = span(s, e)
                    {
                        nodes.push((t.rollout.role, d));
                        pools
                            .entry(t.rollout.pool.clone())
                            .or_default()
                            .node
                            .push(d);
                    }
                    if let (Some(s), Some(e)) = (at(CommandOp::Pull), done(CommandOp::Pull)) {
                        phase("pull", span(s, e));
                    }
                    if let (Some(s), Some(e)) = (at(CommandOp::Cordon), done(CommandOp::Drain)) {
                        phase("drain", span(s, e));
                    }
                    if let (Some(s), Some(e)) = (at(CommandOp::Upgrade), done(CommandOp::Upgrade)) {
                        phase("install", span(s, e));
                    }
                    let reboot = at(CommandOp::Reboot).or(done(CommandOp::Upgrade));
                    if let (Some(s), Some(e)) = (reboot, at(CommandOp::Uncordon)) {
                        phase("reboot", span(s, e));
                    }
                }
            }
            StepKind::Kubernetes(k) => {
                let n = (k.control_plane.len() + k.workers.len()) as u32;
                if let (Some(s), Some(e), true) = (step_first.get(&si), step_last.get(&si), n > 0)
                    && let Some(d) = span(*s, *e)
                {
                    out.kubernetes_node.push(d / n);
                }
            }
        }
    }
    out.pools = pools;
    for (role, d) in nodes {
        match role {
            MachineRole::Controlplane => out.controlplane_node.push(d),
            MachineRole::Worker => out.worker_node.push(d),
        }
    }
    out
}

/// The span from the earliest intent of `first` to the latest result of `last` among
/// `entries` (any order, any step): `None` without both, or when the result precedes the
/// intent.
fn op_span(entries: &[JournalEntry], first: CommandOp, last: CommandOp) -> Option<Duration> {
    let start = entries
        .iter()
        .filter(|e| matches!(&e.entry, Entry::Intent { key, .. } if key.op == first))
        .map(|e| e.at)
        .min()?;
    let end = entries
        .iter()
        .filter(|e| matches!(&e.entry, Entry::Result { key, .. } if key.op == last))
        .map(|e| e.at)
        .max()?;
    span(start, end)
}

/// The job's window time: from its first cordon intent to its last uncordon result, the time
/// during which medea had nodes out of service (what a maintenance window must hold). `None`
/// when the journal holds no cordon or no uncordon.
pub fn window(entries: &[JournalEntry]) -> Option<Duration> {
    op_span(entries, CommandOp::Cordon, CommandOp::Uncordon)
}

/// The job's staging time: from its first `stage` intent to its last `stage` result (pulls and
/// installs ahead of the windows, `rollout.stage: ahead`). `None` when nothing was staged.
pub fn staging(entries: &[JournalEntry]) -> Option<Duration> {
    op_span(entries, CommandOp::Stage, CommandOp::Stage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::JobId;
    use crate::rollout::sequencer::{Action, CommandKey, CommandOutcome};

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn entry(seq: u64, secs: i64, node: &str, op: CommandOp, intent: bool) -> JournalEntry {
        let job = JobId::parse("job-1").unwrap();
        let key = CommandKey {
            job: job.clone(),
            step: 0,
            node: Some(node.into()),
            op,
            attempt: 1,
        };
        let target = node.to_string();
        let entry = if intent {
            Entry::Intent {
                key,
                action: match op {
                    CommandOp::Cordon => Action::Cordon { node: target },
                    _ => Action::Uncordon { node: target },
                },
            }
        } else {
            Entry::Result {
                key,
                outcome: CommandOutcome::Done,
            }
        };
        JournalEntry {
            job,
            seq,
            at: at(secs),
            generation: seq,
            entry,
            notes: Vec::new(),
            delta: None,
        }
    }

    #[test]
    fn the_window_runs_from_the_first_cordon_intent_to_the_last_uncordon_result() {
        // out of order, as a store scan may return them; w-2's uncordon intent (at 40) and
        // w-1's cordon result (at 11) bound nothing
        let entries = vec![
            entry(5, 40, "w-2", CommandOp::Uncordon, true),
            entry(6, 45, "w-2", CommandOp::Uncordon, false),
            entry(1, 10, "w-1", CommandOp::Cordon, true),
            entry(2, 11, "w-1", CommandOp::Cordon, false),
            entry(3, 20, "w-1", CommandOp::Uncordon, true),
            entry(4, 21, "w-1", CommandOp::Uncordon, false),
            entry(7, 30, "w-2", CommandOp::Cordon, true),
        ];
        assert_eq!(window(&entries), Some(Duration::from_secs(35)));
        assert_eq!(staging(&entries), None, "nothing was staged");
    }

    #[test]
    fn no_window_without_both_a_cordon_and_an_uncordon() {
        let cordoned = vec![entry(1, 10, "w-1", CommandOp::Cordon, true)];
        assert_eq!(window(&cordoned), None);
        let uncordoned = vec![entry(1, 10, "w-1", CommandOp::Uncordon, false)];
        assert_eq!(window(&uncordoned), None);
        assert_eq!(window(&[]), None);
    }
}
