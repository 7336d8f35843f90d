//! Rehearsals started over the API (`RehearsePlan`) or the dashboard's **Rehearse** button
//! (issue #36 item 4): the current plan run on a simulated twin of each of its changed
//! clusters, in this process and in the background ([`crate::ops::rehearse::rehearse_plan`]),
//! each report stored beside the plan ([`crate::ops::rehearse::store_report`]), where the plan
//! view shows it.
//!
//! Only the leader rehearses (as only it takes a manual backup): the twin runs in its
//! process. A plan already being rehearsed by this replica is not rehearsed twice: a second
//! request answers that it runs. A rehearsal never touches a real cluster (the twin listens
//! on loopback, its nodes have loopback addresses) and never changes the plan or its id.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use super::Shared;
use crate::Locked as _;
use crate::plan::{PlanId, PlanIdRef};

/// The plans this replica is rehearsing now.
#[derive(Debug, Default)]
pub struct Running(Mutex<BTreeSet<PlanId>>);

impl Running {
    /// Whether `plan` is being rehearsed by this replica.
    pub fn contains(&self, plan: &PlanId) -> bool {
        self.0.locked().contains(plan)
    }

    /// Mark `plan` as being rehearsed, unless it already is; the claim unmarks it when dropped
    /// (when the rehearsal ends, however it ends).
    fn claim(self: &Arc<Self>, plan: PlanId, max: usize) -> Result<Claim, Refused> {
        let mut running = self.0.locked();
        if running.contains(&plan) {
            return Err(Refused::AlreadyRunning);
        }
        if running.len() >= max {
            return Err(Refused::Busy);
        }
        running.insert(plan);
        Ok(Claim {
            running: self.clone(),
            plan,
        })
    }
}

/// Why a plan could not be marked as being rehearsed.
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    /// It already is.
    AlreadyRunning,
    /// As many rehearsals as allowed run already (issue #49).
    Busy,
}

/// A plan marked as being rehearsed, until dropped.
struct Claim {
    running: Arc<Running>,
    plan: PlanId,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.running.0.locked().remove(&self.plan);
    }
}

/// What a request to rehearse did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// A rehearsal of these clusters of the plan started in the background.
    Started {
        /// The plan's full id.
        plan: PlanId,
        /// The clusters it rehearses (those with steps), in the plan's order.
        clusters: Vec<String>,
    },
    /// This replica is rehearsing the plan already; nothing more was started.
    AlreadyRunning {
        /// The plan's full id.
        plan: PlanId,
    },
}

/// The highest compression a request may ask for (as `medea plan --rehearse-compression`).
pub const MAX_COMPRESSION: u32 = 100_000;

/// Why a rehearsal was not started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("this replica does not lead; ask the leader ({leader})")]
    NotLeader { leader: String },
    #[error("`{given}` is not a plan id")]
    BadId {
        given: String,
        #[source]
        err: crate::plan::id::PlanIdError,
    },
    #[error("the server has no plan yet")]
    NoPlan,
    #[error("compression {0} is out of range: 1 to {MAX_COMPRESSION}, or 0 for the default")]
    Compression(u32),
    #[error("no plan `{0}`")]
    UnknownPlan(String),
    #[error("plan id `{0}` is ambiguous; type more characters")]
    Ambiguous(String),
    #[error(
        "plan {plan} is not the current plan ({current}): only the current plan is rehearsed, on the cluster as observed now"
    )]
    NotCurrent { plan: String, current: String },
    #[error(
        "plan {0} is stale (the desired state or an observation moved since it was computed): rehearse the plan the server computes next"
    )]
    Stale(String),
    #[error("plan {0} has been executed: a rehearsal is for a plan before its rollout")]
    Executed(String),
    #[error("plan {0} has no steps: there is nothing to rehearse")]
    NothingToRehearse(String),
    #[error(
        "the desired state has errors: the windows a rehearsal checks against cannot be read; fix it first"
    )]
    DesiredInvalid,
    #[error("cannot read the plan or the inventory from the store")]
    Store(#[source] crate::store::StoreError),
    #[error(
        "{running} rehearsals are running on this server, as many as it allows at once; try again when one has ended"
    )]
    Busy { running: usize },
}

/// Start rehearsing, `compression` times faster than real time (0: the default), the plan
/// `given` names (empty: the current plan; else a full id or a prefix of at least 12 hex
/// characters, which must name the current plan) in the background, unless this replica
/// already rehearses it. Returns at once; the reports are stored when the run of every
/// cluster has ended.
pub fn start(shared: &Arc<Shared>, given: &str, compression: u32) -> Result<Started, StartError> {
    let mut settings = crate::ops::rehearse::Settings::default();
    match compression {
        0 => {}
        1..=MAX_COMPRESSION => settings.compression = compression,
        _ => return Err(StartError::Compression(compression)),
    }
    let Some(fence) = shared.leadership.fence() else {
        return Err(StartError::NotLeader {
            leader: shared
                .leadership
                .leader_replica()
                .unwrap_or_else(|| "none right now".into()),
        });
    };
    let store = shared.store.as_ref();
    let current = crate::ops::replan::current(store)
        .map_err(StartError::Store)?
        .map(|c| c.id);
    let id = if given.is_empty() {
        current.ok_or(StartError::NoPlan)?
    } else {
        let want = PlanIdRef::parse(given).map_err(|err| StartError::BadId {
            given: given.to_string(),
            err,
        })?;
        let ids = crate::ops::replan::plan_ids(store).map_err(StartError::Store)?;
        let mut matching: Vec<PlanId> = ids.into_iter().filter(|id| want.matches(id)).collect();
        match (matching.pop(), matching.is_empty()) {
            (Some(id), true) => id,
            (Some(_), false) => return Err(StartError::Ambiguous(given.to_string())),
            (None, _) => return Err(StartError::UnknownPlan(given.to_string())),
        }
    };
    if current != Some(id) {
        return Err(StartError::NotCurrent {
            plan: id.short(),
            current: current.map_or_else(|| "none".to_string(), |c| c.short()),
        });
    }
    if store
        .get(
            crate::store::Table::Plans,
            &crate::plan::stored::consumed_key(&id),
        )
        .map_err(StartError::Store)?
        .is_some()
    {
        return Err(StartError::Executed(id.short()));
    }
    let plan = crate::ops::replan::load_plan(store, &id)
        .map_err(StartError::Store)?
        .ok_or_else(|| StartError::UnknownPlan(given.to_string()))?;
    let clusters: Vec<String> = plan
        .clusters
        .iter()
        .filter(|c| !c.steps.is_empty())
        .map(|c| c.cluster.clone())
        .collect();
    if clusters.is_empty() {
        return Err(StartError::NothingToRehearse(id.short()));
    }
    let desired = shared
        .desired()
        .and_then(|l| l.valid().cloned())
        .ok_or(StartError::DesiredInvalid)?;
    // The twin is built from the inventory as stored now: only a plan computed from it (its
    // basis still current) is rehearsed, never an older plan against newer observations.
    let basis = crate::ops::replan::current_basis(store, &desired).map_err(StartError::Store)?;
    if plan.is_stale(&basis) {
        return Err(StartError::Stale(id.short()));
    }
    let inventory = crate::inventory::Inventory::load(store).map_err(StartError::Store)?;
    let max = shared.request_limits.max_rehearsals;
    let claim = match shared.rehearsing.claim(id, max) {
        Ok(c) => c,
        Err(Refused::AlreadyRunning) => return Ok(Started::AlreadyRunning { plan: id }),
        Err(Refused::Busy) => return Err(StartError::Busy { running: max }),
    };
    let shared = shared.clone();
    tracing::info!(plan = %id.short(), clusters = ?clusters, "rehearsal started");
    let deadline = shared.request_limits.rehearsal_deadline;
    tokio::spawn(async move {
        let _claim = claim;
        let store = shared.store.as_ref();
        let run = crate::ops::rehearse::rehearse_plan(
            Some(store),
            &plan,
            &inventory,
            &desired,
            &settings,
        );
        // Past its deadline the run is dropped (its twin with it) and stores nothing.
        let Ok(result) = tokio::time::timeout(deadline, run).await else {
            tracing::warn!(
                plan = %plan.id.short(),
                deadline_s = deadline.as_secs(),
                "rehearsal stopped at its deadline; no report stored"
            );
            return;
        };
        match result {
            Ok(reports) => {
                for r in &reports {
                    match crate::ops::rehearse::store_report_fenced(store, r, &fence) {
                        Ok(()) => tracing::info!(
                            plan = %plan.id.short(),
                            cluster = %r.cluster,
                            outcome = %crate::rehearsal::show::outcome_line(&r.outcome),
                            blockers = r.blockers.len(),
                            "rehearsal stored"
                        ),
                        Err(e) => tracing::warn!(
                            plan = %plan.id.short(),
                            cluster = %r.cluster,
                            error = %crate::error_chain(&e),
                            "rehearsal ran but its report could not be stored"
                        ),
                    }
                }
            }
            Err(e) => tracing::warn!(
                plan = %plan.id.short(),
                error = %crate::error_chain(&e),
                "rehearsal failed"
            ),
        }
    });
    Ok(Started::Started { plan: id, clusters })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At most `max` plans are rehearsed at once (issue #49); the same plan is never
    /// rehearsed twice; an ended rehearsal frees its place.
    #[test]
    fn rehearsals_at_once_are_capped() {
        let running = Arc::new(Running::default());
        let id = |b: u8| PlanId::from_digest([b; 32]);
        let a = running.claim(id(1), 2).unwrap();
        assert!(matches!(
            running.claim(id(1), 2),
            Err(Refused::AlreadyRunning)
        ));
        let _b = running.claim(id(2), 2).unwrap();
        assert!(matches!(running.claim(id(3), 2), Err(Refused::Busy)));
        drop(a);
        assert!(running.claim(id(3), 2).is_ok());
    }
}
