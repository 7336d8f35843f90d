//! A finished job's timings, read back from its journal (issue #36 item 3): the samples the
//! duration estimate ([`crate::plan::estimate`]) is built from. Pure: the job and its journal
//! entries come in.
//!
//! Per Talos node: from its first command of the step (its pull, or its cordon when the pull
//! was made ahead of its turn and so overlapped the wave before) to the result of its
//! uncordon; a node medea did not uncordon (cordoned before the job) or that was skipped gives
//! no sample. Phases: pull (intent → result), drain (cordon intent → drain result), install
//! (upgrade intent → result), reboot (reboot intent, or the legacy upgrade's result, → uncordon
//! intent). Per Kubernetes node: the step's span (first intent to its last entry) divided by
//! its nodes.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use super::journal::{Entry, JournalEntry};
use super::sequencer::{CommandOp, Job, StepKind};
use crate::inventory::MachineRole;
use crate::plan::estimate::JobSamples;

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
    for (si, step) in job.steps.iter().enumerate() {
        match &step.kind {
            StepKind::Talos(t) => {
                for n in &t.nodes {
                    let node = Some(n.target.node.as_str());
                    let at = |op| intents.get(&(si, node, op)).copied();
                    let done = |op| results.get(&(si, node, op)).copied();
                    let start = at(CommandOp::Pull).or(at(CommandOp::Cordon));
                    if let (Some(s), Some(e)) = (start, done(CommandOp::Uncordon))
                        && let Some(d) = span(s, e)
                    {
                        nodes.push((t.rollout.role, d));
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
    for (role, d) in nodes {
        match role {
            MachineRole::Controlplane => out.controlplane_node.push(d),
            MachineRole::Worker => out.worker_node.push(d),
        }
    }
    out
}
