//! The rollout journal and the job records in the store.
//!
//! Keys (all UTF-8):
//! - `Jobs/job/<job-id>`: the [`Job`], rewritten (compare-and-swap on its previous bytes) by
//!   every executor transaction;
//! - `Jobs/active/<cluster>`: [`ActiveJob`], present while a job of the cluster is running (at
//!   most one at a time);
//! - `Jobs/halt/<job-id>`: [`HaltRequest`], written by `medea rollout halt`;
//! - `Journal/<job-id>/<seq, 10 digits>`: [`JournalEntry`], append-only, one per transaction
//!   (sequence 0 is the creation);
//! - `Plans/consumed/<plan hex>`: [`PlanConsumed`], a plan that started jobs never starts again.
//!
//! Every executor write is one durable [`Txn`] holding the new job *and* its journal entry, so the
//! job state and the journal never disagree.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::machine::{Action, CommandKey, Job, JobId, Outcome, ts};
use crate::plan::PlanId;
use crate::store::record::encode;
use crate::store::{Check, Record, Table, Txn};

pub fn job_key(id: &JobId) -> String {
    format!("job/{id}")
}
pub fn active_key(cluster: &str) -> String {
    format!("active/{cluster}")
}
pub fn halt_key(id: &JobId) -> String {
    format!("halt/{id}")
}
pub fn entry_key(id: &JobId, seq: u64) -> String {
    format!("{id}/{seq:010}")
}
/// Prefix of every journal entry of a job (scan in sequence order).
pub fn entries_prefix(id: &JobId) -> String {
    format!("{id}/")
}
pub fn consumed_key(plan: &PlanId) -> String {
    format!("consumed/{}", plan.to_hex())
}

impl Record for Job {
    const TABLE: Table = Table::Jobs;
    const KIND: &'static str = "rollout-job";
    const SCHEMA: u32 = 1;
}

/// One journal entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalEntry {
    pub job: JobId,
    pub seq: u64,
    #[serde(with = "ts")]
    pub at: Timestamp,
    /// The job generation this entry moved the job to.
    pub generation: u64,
    pub entry: Entry,
    /// What changed with it (human readable).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Record for JournalEntry {
    const TABLE: Table = Table::Journal;
    const KIND: &'static str = "rollout-journal";
    const SCHEMA: u32 = 1;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum Entry {
    /// The job was born from an approved plan.
    Created { plan: PlanId },
    /// A command is about to be made (written and fsync'd before the call).
    Intent { key: CommandKey, action: Action },
    /// The outcome of a command.
    Result { key: CommandKey, outcome: Outcome },
    /// Progress from observations alone (checks passed, node back, step done, resolution).
    Progress,
    /// The job stopped on an operator's request.
    HaltRequested { by: String },
}

impl Entry {
    pub fn name(&self) -> &'static str {
        match self {
            Entry::Created { .. } => "created",
            Entry::Intent { .. } => "intent",
            Entry::Result { .. } => "result",
            Entry::Progress => "progress",
            Entry::HaltRequested { .. } => "halt-requested",
        }
    }
}

/// Marks the cluster's running job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveJob {
    pub job: JobId,
}

impl Record for ActiveJob {
    const TABLE: Table = Table::Jobs;
    const KIND: &'static str = "rollout-active";
    const SCHEMA: u32 = 1;
}

/// An operator's request to stop a job before its next mutating command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaltRequest {
    pub job: JobId,
    pub by: String,
    pub reason: Option<String>,
    #[serde(with = "ts")]
    pub at: Timestamp,
}

impl Record for HaltRequest {
    const TABLE: Table = Table::Jobs;
    const KIND: &'static str = "rollout-halt-request";
    const SCHEMA: u32 = 1;
}

/// A plan that started jobs: it can never start again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanConsumed {
    pub plan: PlanId,
    pub jobs: Vec<JobId>,
    #[serde(with = "ts")]
    pub at: Timestamp,
}

impl Record for PlanConsumed {
    const TABLE: Table = Table::Plans;
    const KIND: &'static str = "plan-consumed";
    const SCHEMA: u32 = 1;
}

/// The transaction that moves a job from `prev` (as stored) to `next` and appends `entry`:
/// compare-and-swap on the stored job, the job, the journal entry, and the cluster's active
/// marker removed when `next` is terminal. Returns the job as written (its `journal_seq`
/// advanced).
pub fn advance_txn(
    prev: &Job,
    next: &Job,
    entry: Entry,
    notes: Vec<String>,
    at: Timestamp,
) -> (Txn, Job) {
    let mut job = next.clone();
    job.journal_seq = prev.journal_seq + 1;
    let e = JournalEntry {
        job: job.id.clone(),
        seq: job.journal_seq,
        at,
        generation: job.generation,
        entry,
        notes,
    };
    let mut txn = Txn::new()
        .check(Check::Equals(Table::Jobs, job_key(&prev.id), encode(prev)))
        .put_record(job_key(&job.id), &job)
        .put_record(entry_key(&job.id, e.seq), &e);
    if job.state.is_terminal() {
        txn = txn.delete(Table::Jobs, active_key(&job.cluster));
    }
    (txn, job)
}
