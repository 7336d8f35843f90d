//! The sequencer: the rollout's job/step state machine. Pure functions from (job, fresh
//! observations, now) to the next job state and the next command. No I/O, no clock, no
//! sleeping (see `design/rollout.md`). Named for what it does (it sequences a job's steps and
//! commands); "machine" means a node in this domain.
//!
//! **Owns:** the job record ([`model`]), commands and outcomes ([`command`]), what is observed
//! ([`observe`]), halt reasons ([`HaltReason`], [`HaltCode`]) and the decisions: driving a job
//! (`drive`), the Talos step per node (`talos_node`), blocking hooks (`hooks`), the
//! Kubernetes step (`kube`,
//! `kube_prechecks`), resolving a journaled command without an outcome (`resolve`) and applying
//! an outcome (`outcome`), with the observation policy they all read through (`policy`).
//! **May depend on:** `plan`, `inventory`, `desired::window`, `version`, `rollout::ports` (its
//! types only) and `rollout::removed`.
//!
//! Architecture Invariant: pure: no tokio, filesystem, network, store or clock
//! (`tests/it/architecture.rs`).
//!
//! The executor loop is:
//! 1. [`step`] with the observations of [`needs`] (and of [`Transition::missing`], until it is
//!    empty) returns the new job and a [`Next`]: run a command, poll, wait until a time, or stop;
//! 2. for [`Next::Run`], [`intend`] marks the command in flight; the executor journals that job
//!    (the intent), calls the port, and records the [`CommandOutcome`] with [`complete`];
//! 3. a job that still has a command in flight when [`step`] is called (a crash, or a transient
//!    outcome) gets it *resolved by observation*: the node is observed and the command is either
//!    taken as done, re-issued with the next attempt, waited for, or the job halts. An Upgrade is
//!    re-issued only when the node proves the first call left no trace.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::ports::{
    ANNOTATION_CONFIG_VERSION, Component, ComponentArgs, ComponentImages, DrainOutcome, EtcdHealth,
    ImageNamespace, KubeNode, MachineStage, NextBoot, NodeTaint, NodeTarget, SnapshotInfo,
    StaticPod, TalosNode, UpgradeMethod, VolumeAttachment,
};
use super::removed::{RemovedSetting, removed_settings};
use crate::desired::exclusion::{Change, free_from, holding};
use crate::desired::model::DrainPolicy;
use crate::desired::window::{MaintenanceWindow, open_at};
use crate::inventory::MachineRole;
use crate::plan::{KubeRollout, MachineTarget, PlanId, TalosRollout};
use crate::version::KubeVersion;

mod clock;
pub mod command;
mod drive;
pub mod gates;
mod halt;
mod hooks;
mod kube;
mod kube_prechecks;
mod leadership;
pub mod model;
mod next_boot;
pub mod observe;
mod outcome;
mod pacing;
pub mod pause;
mod policy;
mod progress;
mod resolve;
mod silence;
mod stage;
mod talos_node;

pub use clock::{ClockReading, JobClock};
pub use command::*;
pub use drive::*;
pub use gates::*;
pub use halt::{HaltCause, HaltCode, HaltReason};
use hooks::*;
pub use hooks::{HOOK_NOTE_LOG, hook_run_id};
pub use kube::*;
use kube_prechecks::*;
pub use leadership::FORFEIT_RETRY;
use leadership::*;
pub use model::*;
use next_boot::*;
pub use observe::*;
use outcome::*;
use pacing::*;
pub use pacing::{cleanup_pending, pacing_taint};
use policy::*;
pub use progress::{NODE_UPGRADES, NodeUpgrades};
use resolve::*;
use silence::*;
pub use silence::{SILENCE_RENEW_RETRY, silence_marker};
use stage::*;
pub use stage::{next_boot_text, staged_not_rebooted};
use talos_node::*;

/// How long a drain that came back blocked waits before it is tried again (within the drain
/// timeout).
pub const DRAIN_RETRY: Duration = Duration::from_secs(10);

/// Why the machine wants to look again later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollWhy {
    /// Something is in progress (a reboot, a pod restart): poll at the normal interval.
    Waiting,
    /// Something could not be reached: back off.
    Unreachable,
}

/// What the executor should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Check the gates, journal the intent ([`intend`]), call, [`complete`].
    Run(Command),
    /// Observe again after a while.
    Poll {
        /// What it waits for, as a kind.
        why: PollWhy,
        /// What it waits for, for a person.
        reason: String,
        /// What a person need not read to follow the job, kept for whoever looks closer (the
        /// transport error of a node that is down for its reboot, as expected: issue #52).
        detail: Option<String>,
    },
    /// Nothing may start before `at` (maintenance window).
    WaitUntil {
        /// When the window opens.
        at: Timestamp,
        /// Why, for a person.
        reason: String,
    },
    /// The job is terminal.
    Finished,
}

/// The result of [`step`].
#[derive(Debug, Clone)]
pub struct Transition {
    /// The new job; its generation moved iff anything changed.
    pub job: Job,
    /// What the executor does next.
    pub next: Next,
    /// What changed, for the journal and the events.
    pub notes: Vec<String>,
    /// Observations the decision wanted but did not get: observe them and call [`step`]
    /// again with the merged observations (same `now`).
    pub missing: Needs,
}

impl Transition {
    /// Whether the transition changed the job (its generation moved).
    pub fn changed(&self, before: &Job) -> bool {
        self.job.generation != before.generation
    }
}

/// What the next [`step`] needs observed (the first round).
pub fn needs(job: &Job, now: Timestamp) -> Needs {
    step(job, &Observations::default(), now).missing
}

/// Decide: resolve a dangling intent, advance every step and node the observations allow, and
/// pick the next command.
pub fn step(job: &Job, obs: &Observations, now: Timestamp) -> Transition {
    let eyes = Eyes {
        obs,
        missing: RefCell::new(Needs::default()),
    };
    let mut j = job.clone();
    let mut notes = Vec::new();
    let next = drive(&mut j, &eyes, now, &mut notes);
    clock::tick(&mut j, &next, now);
    bump(job, &mut j);
    Transition {
        job: j,
        next,
        notes,
        missing: eyes.missing.into_inner(),
    }
}

/// Mark `cmd` in flight: the job to journal, durably, before the call.
pub fn intend(job: &Job, cmd: &Command, now: Timestamp) -> Job {
    let mut j = job.clone();
    j.in_flight = Some(Intent {
        key: cmd.key.clone(),
        action: cmd.action.clone(),
        issued_at: now,
        last_error: None,
    });
    clock::start(&mut j, now);
    bump(job, &mut j);
    j
}

/// Record the outcome of the command in flight. A key that is not in flight changes nothing.
pub fn complete(
    job: &Job,
    key: &CommandKey,
    outcome: &CommandOutcome,
    now: Timestamp,
) -> (Job, Vec<String>) {
    let mut j = job.clone();
    let mut notes = Vec::new();
    match j.in_flight.clone() {
        // a terminal job still removes its pacing taints (`pacing::cleanup`)
        Some(intent)
            if &intent.key == key
                && (!j.state.is_terminal() || intent.key.op == CommandOp::Untaint) =>
        {
            apply(&mut j, &intent, outcome, false, now, &mut notes);
        }
        _ => notes.push(format!("ignored an outcome for {key}: not in flight")),
    }
    bump(job, &mut j);
    (j, notes)
}

/// Halt the job (operator request or executor decision). A terminal job is left as it is.
pub fn halt(job: &Job, reason: HaltReason, now: Timestamp) -> Job {
    let mut j = job.clone();
    if !j.state.is_terminal() {
        let (step, node, op) = match &j.in_flight {
            Some(i) => (Some(i.key.step), i.key.node.clone(), Some(i.key.op)),
            None => (current_step(&j), None, None),
        };
        j.state = JobState::Halted {
            reason,
            step,
            node,
            op,
            at: now,
        };
    }
    bump(job, &mut j);
    j
}

/// Index of the first step that is not done.
pub fn current_step(job: &Job) -> Option<usize> {
    job.steps.iter().position(|s| s.state != StepState::Done)
}

fn bump(before: &Job, after: &mut Job) {
    after.generation = before.generation;
    if after != before {
        after.generation = before.generation + 1;
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod timestamp_wire_tests;
#[cfg(test)]
mod window_tests;
