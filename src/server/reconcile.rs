//! The reconcile pass: after any change (desired revision, observation, approval, gate), plan;
//! verify approvals of the current plan; when it reaches quorum, apply its settings and create
//! its jobs — all in one store transaction. The approval status and the start transaction are
//! the use case's (`ops::approvals::status`, `ops::approvals::start_txn`); this pass gathers
//! their inputs, commits, logs and notifies. It reads the last-applied state, the running jobs
//! and the jobs once (`ops::replan::PassReads`, from the replan or, on a follower, read once):
//! the plan's basis is judged and its start built from those reads, and the start
//! transaction's conditions, not a second read, catch whatever moved since.
//!
//! Architecture Invariant: the transaction that records the approval reaching quorum is the
//! one that creates the jobs and marks the plan consumed; it re-checks that the plan is still
//! current and never consumed, so a stale or replayed plan can never start.

use jiff::Timestamp;

use super::Shared;
use crate::Locked as _;
use crate::approval::record::approval_key;
use crate::approval::{ApprovalSource, Candidate, QuorumStatus};
use crate::ops::approvals;
use crate::ops::replan::{self as stored, ReplanError};
use crate::plan::Plan;
use crate::plan::stored::{CURRENT_KEY, CurrentPlan, consumed_key};
use crate::store::record::encode;
use crate::store::{Check, StoreError, Table, Txn};

/// Everything a reconcile pass concluded about the current plan.
#[derive(Debug, Clone, Default)]
pub struct PassResult {
    pub plan: Option<Plan>,
    /// Planning errors of the current desired revision (validation errors live on `Loaded`).
    pub diagnostics: Vec<crate::desired::Diagnostic>,
    /// Outcome per approval candidate (markers and recorded approvals).
    pub outcomes: Vec<(ApprovalSource, String)>,
    /// What the plan views show of the approvals: who counts, what does not and why.
    pub approvals: crate::plan::render::ApprovalsView,
    pub quorum: Option<QuorumStatus>,
    pub consumed: bool,
    /// Why an approved plan has not started (closed gates), for operators.
    pub waiting: Vec<String>,
    /// Jobs created by this pass.
    pub started: Vec<String>,
    /// The verification outcome of each `extra` candidate (an API submission), in order:
    /// whether it counts, and the outcome's text. Empty when no plan could be verified against.
    pub submitted: Vec<(bool, String)>,
    /// The pass's transaction met a store conflict (the plan or a record moved underneath it):
    /// nothing was written, so an API submission must be verified again.
    pub conflict: bool,
    /// This pass consumed the plan (applied its settings, created its jobs): the next plan
    /// must be computed at once.
    pub applied: bool,
}

impl PassResult {
    /// The pass's duration and the current plan's state as metrics (what deploy/'s
    /// dashboard shows and its alert rules read).
    pub fn record_metrics(&self, took: std::time::Duration) {
        let has_changes = self.plan.as_ref().is_some_and(Plan::has_changes) && !self.consumed;
        let missing = match &self.quorum {
            Some(q) if has_changes => q.required.saturating_sub(q.count()),
            _ => 0,
        };
        crate::metrics::plan_pass(took, has_changes, missing);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("store error during reconcile")]
    Store(#[from] StoreError),
}

/// Verify `extra` candidates (an API submission) plus the revision's markers plus every
/// recorded approval of the current plan; record the new ones; and, at quorum, create jobs.
pub fn reconcile(
    shared: &Shared,
    extra: &[Candidate],
    now: Timestamp,
) -> Result<PassResult, ReconcileError> {
    let store = shared.store.as_ref();
    let mut state = PassResult::default();
    let Some(loaded) = shared.desired() else {
        return Ok(state);
    };
    let Some(desired) = loaded.valid() else {
        return Ok(state);
    };
    let leader = shared.leadership.is_leader();
    // The plan this pass just computed, if any: it is the current plan (the commit made it
    // so, or it already was: same id, its parent read back), so it is not read back and
    // decoded again; its sections are shared with the planner's memo. With it come the
    // store reads it was computed from (applied state, running jobs, every job, inventory),
    // which the pass does not read again.
    let mut fresh: Option<stored::Replanned> = None;
    // 1. Plan (leader only: followers read the leader's plan).
    if leader {
        let replanned = {
            let mut cache = shared.replan_cache.locked();
            // The memo keeps this revision (held by `shared` anyway) instead of copies.
            cache.memo.share_desired(loaded.clone());
            stored::replan_cached(store, desired, now, &mut cache)
        };
        match replanned {
            Ok(r) => {
                if r.stored {
                    announce_new_plan(shared, &r.plan, now);
                }
                fresh = Some(r);
            }
            Err(ReplanError::Refused(diags)) => {
                for d in &diags {
                    tracing::warn!(diagnostic = %d, "desired state cannot be planned; nothing changes");
                }
                state.diagnostics = diags;
                return Ok(state);
            }
            Err(ReplanError::Store(e)) if e.is_leadership_lost() => return Ok(state),
            Err(ReplanError::Store(e)) => return Err(e.into()),
        }
    }
    // The plan and what the pass read once (issue #34): a fresh plan's basis is its reads'
    // by construction; a follower reads the store once and judges the leader's plan by it.
    // Whatever moves after these reads, the start transaction's conditions catch.
    let (plan, reads, inventory) = match fresh {
        Some(r) => (r.plan, r.reads, r.inventory),
        None => {
            let Some(CurrentPlan { id }) = stored::current(store)? else {
                return Ok(state);
            };
            let Some(plan) = stored::load_plan(store, &id)? else {
                return Ok(state);
            };
            let reads = stored::PassReads::load(store)?;
            if plan.is_stale(&reads.basis(store, desired)?) {
                // A follower (or a race): the leader will replan.
                state.plan = Some(plan);
                return Ok(state);
            }
            let inventory = crate::inventory::Inventory::load(store)?;
            (plan, reads, inventory)
        }
    };
    state.consumed = store.get(Table::Plans, &consumed_key(&plan.id))?.is_some();

    // 2. Verify approvals: recorded ones again (revocation), markers, and `extra`; each
    // against the current plan and the plans its marker's name names, the signature stage
    // cached per (candidate, plan, signers generation) (`ops::approvals`).
    let (signers, generation) = shared.trust.current_generation();
    let index = approvals::PlanIndex::load(store)?;
    let recorded = approvals::recorded(store, &plan.id)?;
    let markers = approvals::marker_candidates(&loaded);
    let status = {
        let mut cache = shared.approval_cache.locked();
        let status = approvals::status(
            &index,
            approvals::Trust {
                signers: &signers,
                generation,
            },
            &plan,
            &recorded,
            &markers,
            extra,
            now,
            &mut cache,
        );
        tracing::debug!(plan = %plan.id.short(), candidates = cache.last.candidates, cached = cache.last.cached, signature_checks = cache.last.signature_checks, "approvals verified");
        status
    };
    present_verdicts(&mut state, &plan, &status);
    // What the plan views show; a candidate that does not count is logged at WARN once (not
    // on every pass while its marker stays as it is).
    state.approvals = status.view(&signers);
    {
        let mut warned = shared.warned_rejections.locked();
        for r in newly_rejected(&mut warned, &state.approvals.rejected) {
            tracing::warn!(plan = %plan.id.short(), source = %r.source, fingerprint = %r.fingerprint, principal = %r.principal, code = %r.code, reason = %r.reason, "approval does not count");
        }
    }
    let new_records = status.new_records;
    let quorum = status.quorum;
    state.quorum = Some(quorum.clone());

    // 3. Record new approvals; at quorum, in the same transaction, apply and start.
    let pointer = Check::Equals(
        Table::Plans,
        CURRENT_KEY.into(),
        encode(&CurrentPlan { id: plan.id }),
    );
    let mut txn = Txn::new().check(pointer);
    for r in &new_records {
        txn = txn.put_record(approval_key(&r.plan, &r.fingerprint), r);
        announce_approval(shared, &plan, r, &quorum, now);
    }
    let mut start = false;
    if quorum.reached() && !state.consumed && plan.has_changes() {
        match approvals::start_txn(
            desired,
            &plan,
            approvals::StartBasis {
                reads: &reads,
                inventory: &inventory,
            },
            shared.rollouts_gate,
            now,
        ) {
            Ok(Some((ops, jobs))) => {
                for c in ops.checks {
                    txn = txn.check(c);
                }
                for op in ops.ops {
                    txn.push(op);
                }
                state.started = jobs;
                start = true;
            }
            Ok(None) => {}
            Err(waiting) => {
                // Logged when what the plan waits for changes, not on every pass.
                if !shared.last_pass_waited_for(&plan.id, &waiting) {
                    tracing::info!(plan = %plan.id.short(), gates = %waiting.join("; "), "plan approved, waiting for a gate");
                }
                state.waiting = waiting
            }
        }
    }
    if new_records.is_empty() && !start {
        state.plan = Some(plan);
        return Ok(state);
    }
    if leader && let Some(f) = shared.leadership.fence() {
        txn = txn.fenced(&f);
    }
    match store.commit(txn) {
        Ok(()) => {
            if start {
                state.consumed = true;
                state.applied = true;
                tracing::info!(plan = %plan.id.short(), jobs = %state.started.join(", "), "plan reached quorum: settings applied, jobs created");
            }
        }
        Err(StoreError::Conflict { .. }) => {
            // The plan moved on (new revision or observation): nothing was written.
            state.started.clear();
            state.conflict = true;
        }
        Err(e) => return Err(e.into()),
    }
    state.plan = Some(plan);
    Ok(state)
}

/// A new plan became current: count it, log it (its text at debug), and tell the webhooks
/// when it has changes.
fn announce_new_plan(shared: &Shared, plan: &Plan, now: Timestamp) {
    crate::metrics::global().plans_computed.inc();
    tracing::info!(plan = %plan.id.short(), changes = plan.has_changes(), summary = %crate::plan::render::summary_line(plan), "new plan");
    tracing::debug!(plan = %plan.id.short(), "plan {}\n{}", plan.id.short(), crate::plan::render::text(plan, crate::plan::render::Options { color: false }));
    if plan.has_changes() {
        shared.notifier.send(crate::webhook::Notification {
            event: crate::webhook::EventKind::PlanReady,
            text: format!("medea: {}", crate::plan::render::summary_line(plan)),
            cluster: None,
            plan: Some(plan.id.to_hex()),
            job: None,
            node: None,
            reason: None,
            halt_code: None,
            at: now.to_string(),
        });
    }
}

/// Present the verdicts of [`approvals::status`] in the pass's result: every recorded one,
/// and each marker or submission whose key's approval is not recorded already; submissions
/// answer in order. Blocking preflight findings nobody acknowledged (issue #22) make the plan
/// unapprovable: no approval is recorded or counted and nothing starts; every candidate is
/// answered with why, naming the findings and how to acknowledge them.
fn present_verdicts(state: &mut PassResult, _plan: &Plan, status: &approvals::ApprovalStatus) {
    for j in &status.judged {
        if j.origin != approvals::Origin::Recorded {
            if j.origin == approvals::Origin::Submitted {
                state
                    .submitted
                    .push((j.outcome.approved().is_some(), j.outcome.to_string()));
            }
            crate::metrics::approval_outcome(j.outcome.code());
            if j.already_recorded {
                continue;
            }
        }
        state
            .outcomes
            .push((j.source.clone(), j.outcome.to_string()));
    }
    if let Some(why) = &status.refusal {
        for s in &mut state.submitted {
            *s = (false, why.clone());
        }
        for (_, o) in &mut state.outcomes {
            *o = format!("does not count: {why}");
        }
        state.waiting = vec![why.clone()];
    }
}

/// A new approval is recorded (in the pass's transaction): log it and tell the webhooks, with
/// the count against the bar.
fn announce_approval(
    shared: &Shared,
    plan: &Plan,
    r: &crate::approval::ApprovalRecord,
    quorum: &QuorumStatus,
    now: Timestamp,
) {
    tracing::info!(plan = %plan.id.short(), principal = %r.principal, fingerprint = %r.fingerprint, source = %r.source, "approval recorded");
    shared.notifier.send(crate::webhook::Notification {
        event: crate::webhook::EventKind::ApprovalReceived,
        text: format!(
            "medea: plan {} approved by {} ({}/{})",
            plan.id.short(),
            r.principal,
            quorum.count(),
            quorum.required
        ),
        cluster: None,
        plan: Some(plan.id.to_hex()),
        job: None,
        node: None,
        reason: None,
        halt_code: None,
        at: now.to_string(),
    });
}

/// The rejected candidates of this pass not logged before, remembering this pass's (so one
/// that goes away and comes back is logged again). A candidate is known by its source, key and
/// outcome code, not by the plan: a leftover marker of an older plan is logged once, not again
/// with every new plan (issue #52; marker files name their plan, so the source tells markers of
/// two plans apart).
fn newly_rejected<'a>(
    warned: &mut std::collections::BTreeSet<String>,
    rejected: &'a [crate::plan::render::CandidateView],
) -> Vec<&'a crate::plan::render::CandidateView> {
    let key = |r: &crate::plan::render::CandidateView| {
        format!("{}\0{}\0{}", r.source, r.fingerprint, r.code)
    };
    let new = rejected
        .iter()
        .filter(|r| !warned.contains(&key(r)))
        .collect();
    *warned = rejected.iter().map(key).collect();
    new
}

#[cfg(test)]
mod warn_tests {
    use super::*;

    /// Issue #52 item 6: a leftover approval marker is logged once, not on every plan.
    #[test]
    fn a_leftover_marker_is_warned_once_across_plans() {
        let leftover = crate::plan::render::CandidateView {
            source: "marker:approvals/0123456789ab-alice.sig".into(),
            fingerprint: "SHA256:abc".into(),
            principal: "alice".into(),
            code: "other-plan".into(),
            reason: "signed for plan 0123456789ab, not the current plan".into(),
        };
        let mut warned = Default::default();
        let pass = [leftover.clone()];
        assert_eq!(newly_rejected(&mut warned, &pass).len(), 1);
        // the next pass, and the next plan's pass: the same marker, not logged again
        assert!(newly_rejected(&mut warned, &pass).is_empty());
        assert!(newly_rejected(&mut warned, &pass).is_empty());
        // gone, then back: logged again
        assert!(newly_rejected(&mut warned, &[]).is_empty());
        assert_eq!(newly_rejected(&mut warned, &pass).len(), 1);
    }
}
