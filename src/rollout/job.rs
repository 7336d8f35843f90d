//! Job creation: the pure function that turns an approved plan into the transaction creating
//! its jobs, so the approval layer can commit "approval reaching quorum + job creation" as one
//! atomic store transaction (append its own checks and puts to the returned [`Txn`]).

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::RolloutError;
use super::journal::{
    ActiveJob, Entry, JournalEntry, PlanConsumed, active_key, entry_key, job_key,
};
use super::ports::NodeTarget;
use super::sequencer::{
    Job, JobId, JobState, JobStep, KubeStep, StepKind, StepState, TalosStep, WindowSpec,
};
use crate::desired::backup::Recipient;
use crate::desired::exclusion::Exclusion;
use crate::desired::window::MaintenanceWindow;
use crate::inventory::{MachineRole, ObservedCluster, cluster_key};
use crate::plan::stored::{CURRENT_KEY, CurrentPlan, consumed_key};
use crate::plan::{Plan, Step};
use crate::store::record::encode;
use crate::store::{Check, Table, Txn};

/// What job creation reads besides the plan, all as the caller read it in the store (the
/// transaction re-checks it atomically).
#[derive(Debug, Clone)]
pub struct JobInputs<'a> {
    /// The server's `--rollouts` switch.
    pub global_rollouts: bool,
    /// The observed record of every cluster the plan changes, by name.
    pub clusters: BTreeMap<String, &'a ObservedCluster>,
    /// The maintenance windows of each cluster (from its desired state), by name.
    pub windows: BTreeMap<String, &'a [MaintenanceWindow]>,
    /// The maintenance exclusions of each cluster (from its desired state), by name; a
    /// cluster without an entry has none.
    pub exclusions: BTreeMap<String, &'a [Exclusion]>,
    /// The age recipients of each cluster's `spec.backup` (from its desired state), by name:
    /// the job's etcd snapshot is saved encrypted to them (issue #49). A cluster without an
    /// entry, or with none, gets a plaintext snapshot (0600 in a 0700 directory).
    pub backup_recipients: BTreeMap<String, &'a [Recipient]>,
}

/// The jobs of a plan and the transaction that creates them.
#[derive(Debug, Clone)]
pub struct Created {
    /// The transaction that creates the jobs and consumes the plan.
    pub txn: Txn,
    /// The jobs, one per cluster with steps.
    pub jobs: Vec<Job>,
}

/// Build the jobs of an approved `plan` (one per cluster with steps) and the durable
/// transaction that creates them. The transaction checks that:
/// - `plan` is still the current plan (`Plans/current` holds its [`CurrentPlan`] pointer),
/// - it was never started before (`Plans/consumed/<id>` absent; the transaction writes it),
/// - each cluster's observed record is exactly the one the gates were read from (so
///   `rolloutsEnabled` and the observed generation cannot change underneath),
/// - no other job of the cluster is running (`Jobs/active/<cluster>` absent).
///
/// Refuses (and builds nothing) when a gate is closed or the plan is stale.
pub fn create_jobs_txn(
    plan: &Plan,
    inputs: &JobInputs<'_>,
    now: Timestamp,
) -> Result<Created, RolloutError> {
    // Defense in depth: approval already refuses such a plan.
    if let Some(refusal) = crate::plan::preflight::refusal(plan) {
        return Err(RolloutError::BlockingFindings { refusal });
    }
    if !inputs.global_rollouts {
        return Err(RolloutError::RolloutsOff);
    }
    let mut txn = Txn::new()
        .check(Check::Equals(
            Table::Plans,
            CURRENT_KEY.into(),
            encode(&CurrentPlan { id: plan.id }),
        ))
        .check(Check::Absent(Table::Plans, consumed_key(&plan.id)));
    let mut jobs = Vec::new();
    for cp in plan.clusters.iter().filter(|c| !c.steps.is_empty()) {
        let name = &cp.cluster;
        let observed = *inputs
            .clusters
            .get(name)
            .ok_or_else(|| RolloutError::UnknownCluster {
                cluster: name.clone(),
            })?;
        if !observed.rollouts_enabled {
            return Err(RolloutError::ClusterDisabled {
                cluster: name.clone(),
            });
        }
        let expected = plan.basis.observed.get(name).copied();
        if expected != Some(observed.generation) {
            return Err(RolloutError::StalePlan {
                plan: plan.id,
                cluster: name.clone(),
                planned: expected,
                observed: observed.generation,
            });
        }
        let target = |node: &str| -> Result<NodeTarget, RolloutError> {
            observed
                .machines
                .get(node)
                .map(|m| NodeTarget {
                    node: m.node.clone(),
                    address: m.address.clone(),
                })
                .ok_or_else(|| RolloutError::UnknownMachine {
                    cluster: name.clone(),
                    node: node.to_string(),
                })
        };
        let control_plane: Vec<NodeTarget> = observed
            .machines
            .values()
            .filter(|m| m.role == MachineRole::Controlplane)
            .map(|m| NodeTarget {
                node: m.node.clone(),
                address: m.address.clone(),
            })
            .collect();
        let mut steps = Vec::new();
        for s in &cp.steps {
            let kind = match s {
                Step::Talos(t) => StepKind::Talos(TalosStep::new(t.clone())),
                Step::Kubernetes(k) => StepKind::Kubernetes(KubeStep::new(
                    k.clone(),
                    k.control_plane
                        .iter()
                        .map(|n| target(n))
                        .collect::<Result<_, _>>()?,
                    k.workers
                        .iter()
                        .map(|n| target(n))
                        .collect::<Result<_, _>>()?,
                )),
            };
            steps.push(JobStep {
                state: StepState::Pending,
                kind,
            });
        }
        let windows = inputs
            .windows
            .get(name)
            .map(|ws| ws.iter().map(WindowSpec::of).collect())
            .unwrap_or_default();
        let job = Job {
            id: JobId::for_plan(&plan.id, name),
            plan: plan.id,
            cluster: name.clone(),
            created_at: now,
            windows,
            exclusions: inputs
                .exclusions
                .get(name)
                .map(|e| e.to_vec())
                .unwrap_or_default(),
            predicted: plan
                .estimates
                .iter()
                .find(|e| &e.cluster == name)
                .map(|e| e.total),
            control_plane,
            steps,
            state: JobState::Running,
            generation: 1,
            snapshot: None,
            snapshot_attempts: 0,
            snapshot_recipients: inputs
                .backup_recipients
                .get(name)
                .map(|rs| rs.iter().map(|r| r.as_str().to_string()).collect())
                .unwrap_or_default(),
            in_flight: None,
            journal_seq: 0,
            health: cp.health.clone(),
            gates: Default::default(),
            applies: crate::plan::stored::job_applies(plan, name),
            hooks: cp.hooks.clone().map(std::sync::Arc::new),
            hook_runs: Default::default(),
            clock: Default::default(),
        };
        let entry = JournalEntry {
            job: job.id.clone(),
            seq: 0,
            at: now,
            generation: job.generation,
            entry: Entry::Created { plan: plan.id },
            notes: vec![format!("created from plan {}", plan.id.to_hex())],
            delta: None,
        };
        txn = txn
            .check(Check::Equals(
                Table::Inventory,
                cluster_key(name),
                encode(observed),
            ))
            .check(Check::Absent(Table::Jobs, active_key(name)))
            .check(Check::Absent(Table::Jobs, job_key(&job.id)))
            .put_record(job_key(&job.id), &job)
            .put_record(
                active_key(name),
                &ActiveJob {
                    job: job.id.clone(),
                },
            )
            .put_record(entry_key(&job.id, 0), &entry);
        jobs.push(job);
    }
    if jobs.is_empty() {
        return Err(RolloutError::NothingToRun { plan: plan.id });
    }
    txn = txn.put_record(
        consumed_key(&plan.id),
        &PlanConsumed {
            plan: plan.id,
            jobs: jobs.iter().map(|j| j.id.clone()).collect(),
            at: now,
        },
    );
    Ok(Created { txn, jobs })
}
