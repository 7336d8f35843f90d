//! The approval use case: verifying approval candidates (marker files, recorded approvals, API
//! submissions) against the current plan, with bounded work per pass (issue #32).
//!
//! - The plans a candidate is checked against are the current plan and the plans its marker's
//!   file name names ([`crate::approval::ApprovalSource::named_plan`]), looked up in a
//!   [`PlanIndex`] read from the store's keys alone — never every stored plan.
//! - The signature stage ([`approval::verify::check_signature`], the expensive part) is kept in
//!   an [`ApprovalCache`] per (candidate digest, current plan, signers generation): an
//!   unchanged marker is not verified again on the next pass, and a reload that puts other
//!   signers in force (a new generation) verifies everything again. The time- and
//!   store-dependent part ([`approval::verify::judge`]: executed plans, validity windows at
//!   `now`) is evaluated on every pass.
//!
//! The daemon's reconcile pass and `medea approvals` both verify through [`verify_candidates`].
//!
//! A plan's **approval status** is computed once, by [`status`] (issue #34): recorded approvals
//! (verified again: a removed signer stops counting), the revision's markers and API
//! submissions, judged in that order; a marker or submission whose key's approval is already
//! recorded adds nothing; blocking preflight findings nobody acknowledged make nothing count;
//! distinct people are counted against the plan's bar (`approval::evaluate`). The reconcile
//! pass (`server::reconcile`), `medea approvals` ([`offline_status`]) and the API's plan view
//! call it and only present the result. A quorum becomes jobs in one place too: [`start_txn`]
//! (settings applied, jobs created, the plan consumed), which the reconcile pass commits with
//! the approval that reached quorum.

use std::collections::{BTreeSet, HashMap};

use jiff::Timestamp;
use sha2::{Digest, Sha256};

use crate::approval::verify::{SignatureCheck, check_signature, judge};
use crate::approval::{
    AllowedSigners, ApprovalRecord, ApprovalSource, Candidate, Outcome, QuorumStatus,
};
use crate::plan::{Plan, PlanId};
use crate::store::{Store, StoreError, StoreExt as _, Table};

/// The plans the store knows, from its keys alone: stored plans (`plan/<hex>`, at most
/// [`crate::plan::stored::PLAN_WINDOW`] + 1 once collected) and executed ones (`consumed/<hex>`,
/// kept forever so an old approval can never start anything).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanIndex {
    pub stored: BTreeSet<PlanId>,
    pub consumed: BTreeSet<PlanId>,
}

fn ids(keys: Vec<String>, prefix: &str) -> BTreeSet<PlanId> {
    keys.into_iter()
        .filter_map(|k| {
            k.strip_prefix(prefix)
                .and_then(|hex| PlanId::parse_full(hex).ok())
        })
        .collect()
}

impl PlanIndex {
    /// Two key-only scans of the `Plans` table; no plan record is read.
    pub fn load(store: &dyn Store) -> Result<PlanIndex, StoreError> {
        Ok(PlanIndex {
            stored: ids(store.scan_keys(Table::Plans, "plan/")?, "plan/"),
            consumed: ids(
                store.scan_keys(Table::Plans, "consumed/")?,
                crate::plan::stored::CONSUMED_PREFIX,
            ),
        })
    }

    /// The known plans (stored or executed) whose id starts with `prefix`, in id order.
    pub fn matching(&self, prefix: &crate::plan::PlanIdRef) -> Vec<PlanId> {
        let p = prefix.as_str();
        let mut low = [0u8; 32];
        // The smallest id with this prefix: the prefix's whole bytes, then zeros (an odd
        // last nibble is the high half of its byte).
        for (i, pair) in p.as_bytes().chunks(2).enumerate() {
            let nib = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
            low[i] = match pair {
                [h, l] => nib(*h) << 4 | nib(*l),
                [h] => nib(*h) << 4,
                _ => 0,
            };
        }
        let low = PlanId::from_digest(low);
        let mut out: Vec<PlanId> = self
            .stored
            .range(low..)
            .take_while(|id| prefix.matches(id))
            .chain(
                self.consumed
                    .range(low..)
                    .take_while(|id| prefix.matches(id)),
            )
            .copied()
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The plans a candidate is checked against, in order: the current plan, the plan an API
    /// submission names (when known), then the plans its marker's file name names.
    pub fn offered(&self, current: &PlanId, candidate: &Candidate) -> Vec<PlanId> {
        let mut out = vec![*current];
        if let Some(named) = candidate.named
            && named != *current
            && (self.stored.contains(&named) || self.consumed.contains(&named))
        {
            out.push(named);
        }
        if let Some(prefix) = candidate.source.named_plan() {
            let fresh: Vec<PlanId> = self
                .matching(&prefix)
                .into_iter()
                .filter(|id| !out.contains(id))
                .collect();
            out.extend(fresh);
        }
        out
    }

    /// Every known plan id (stored or executed), for resolving what an operator typed.
    pub fn known(&self) -> Vec<PlanId> {
        self.stored.union(&self.consumed).copied().collect()
    }
}

/// What a pass did, for tests, benchmarks and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassStats {
    pub candidates: usize,
    /// Candidates whose signature stage came from the cache.
    pub cached: usize,
    /// Signature verifications made (at most one per plan offered to a candidate not cached).
    pub signature_checks: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct CacheKey {
    /// sha256 over the candidate's source and signature bytes.
    digest: [u8; 32],
    current: PlanId,
    generation: u64,
}

/// The signature stage of each candidate of the last pass, per (candidate digest, current
/// plan, signers generation). Holds the last pass's candidates only (what the pass did not
/// use is dropped), so it is bounded by one revision's markers (`desired::source::limits`)
/// plus the recorded approvals of the current plan.
#[derive(Debug, Default)]
pub struct ApprovalCache {
    entries: HashMap<CacheKey, SignatureCheck>,
    /// What the last [`verify_candidates`] did.
    pub last: PassStats,
}

impl ApprovalCache {
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn digest(c: &Candidate) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"medea-approval-candidate-v1\0");
    match &c.source {
        ApprovalSource::Marker { path } => {
            h.update(b"marker\0");
            h.update((path.len() as u64).to_le_bytes());
            h.update(path.as_bytes());
        }
        ApprovalSource::Api => h.update(b"api\0"),
    }
    match &c.named {
        Some(p) => {
            h.update(b"named\0");
            h.update(p.as_bytes());
        }
        None => h.update(b"unnamed\0"),
    }
    h.update(c.armored.as_bytes());
    h.finalize().into()
}

/// The signers in force and their generation (`server::trust::TrustRoot::current_generation`;
/// a constant for a one-shot CLI run).
#[derive(Debug, Clone, Copy)]
pub struct Trust<'a> {
    pub signers: &'a AllowedSigners,
    pub generation: u64,
}

/// Verify `candidates` as approvals of `current`, in order: each one's signature stage from
/// `cache` or checked against [`PlanIndex::offered`], then judged at `now`. The cache keeps
/// this pass's candidates only.
pub fn verify_candidates(
    index: &PlanIndex,
    trust: Trust<'_>,
    current: &PlanId,
    candidates: &[Candidate],
    now: Timestamp,
    cache: &mut ApprovalCache,
) -> Vec<Outcome> {
    let mut stats = PassStats {
        candidates: candidates.len(),
        ..PassStats::default()
    };
    let mut used: HashMap<CacheKey, SignatureCheck> = HashMap::with_capacity(candidates.len());
    let consumed = |p: &PlanId| index.consumed.contains(p);
    let outcomes = candidates
        .iter()
        .map(|c| {
            let key = CacheKey {
                digest: digest(c),
                current: *current,
                generation: trust.generation,
            };
            let check = if let Some(hit) = used.get(&key) {
                stats.cached += 1;
                hit.clone()
            } else if let Some(hit) = cache.entries.remove(&key) {
                stats.cached += 1;
                used.insert(key, hit.clone());
                hit
            } else {
                let offered = index.offered(current, c);
                let (check, n) = check_signature(&c.armored, trust.signers, &offered);
                stats.signature_checks += n;
                used.insert(key, check.clone());
                check
            };
            judge(
                &check,
                c.source.clone(),
                trust.signers,
                current,
                &consumed,
                now,
            )
        })
        .collect();
    cache.entries = used;
    cache.last = stats;
    outcomes
}

/// Candidates of a revision: its marker files.
pub fn marker_candidates(loaded: &crate::desired::Loaded) -> Vec<Candidate> {
    loaded
        .markers
        .iter()
        .map(|m| Candidate {
            source: ApprovalSource::Marker {
                path: m.path.clone(),
            },
            armored: String::from_utf8_lossy(&m.contents).into_owned(),
            named: None,
        })
        .collect()
}

/// Where a judged candidate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// An approval recorded earlier (verified again).
    Recorded,
    /// A marker file of the revision.
    Marker,
    /// An API submission of this pass.
    Submitted,
}

/// One candidate's verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    pub origin: Origin,
    pub source: ApprovalSource,
    pub outcome: Outcome,
    /// A marker or submission approving with a key whose approval of this plan is already
    /// recorded: the record counts, this adds nothing.
    pub already_recorded: bool,
}

/// A plan's approval status: what [`status`] concluded.
#[derive(Debug, Clone)]
pub struct ApprovalStatus {
    /// Every candidate's verdict, in the order judged: recorded, markers, submissions.
    pub judged: Vec<Judged>,
    /// Why nothing counts: blocking preflight findings nobody acknowledged (issue #22).
    pub refusal: Option<String>,
    /// Approvals to record: markers and submissions that approve with a key not recorded yet
    /// (one per key). Empty when refused.
    pub new_records: Vec<ApprovalRecord>,
    /// Distinct people against the plan's bar.
    pub quorum: QuorumStatus,
}

/// The approval status of `plan`, the one place it is computed (see the module doc).
/// `recorded` are the plan's approval records, `markers` and `submitted` the revision's marker
/// candidates and this pass's API submissions; each is verified by [`verify_candidates`]
/// (bounded, cached in `cache`), then counted.
#[allow(
    clippy::too_many_arguments,
    reason = "the use case's inputs, each named; a struct would only rename them"
)]
pub fn status(
    index: &PlanIndex,
    trust: Trust<'_>,
    plan: &Plan,
    recorded: &[ApprovalRecord],
    markers: &[Candidate],
    submitted: &[Candidate],
    now: Timestamp,
    cache: &mut ApprovalCache,
) -> ApprovalStatus {
    let origins = std::iter::repeat_n(Origin::Recorded, recorded.len())
        .chain(std::iter::repeat_n(Origin::Marker, markers.len()))
        .chain(std::iter::repeat_n(Origin::Submitted, submitted.len()));
    let candidates: Vec<Candidate> = recorded
        .iter()
        .map(|r| Candidate {
            source: r.source.clone(),
            armored: r.signature.clone(),
            named: None,
        })
        .chain(markers.iter().cloned())
        .chain(submitted.iter().cloned())
        .collect();
    let outcomes = verify_candidates(index, trust, &plan.id, &candidates, now, cache);
    let mut judged = Vec::with_capacity(candidates.len());
    let mut approved = Vec::new();
    let mut new_records: Vec<ApprovalRecord> = Vec::new();
    for ((origin, c), outcome) in origins.zip(&candidates).zip(outcomes) {
        let mut already_recorded = false;
        if origin == Origin::Recorded {
            if let Some(a) = outcome.approved() {
                approved.push(a.clone());
            }
        } else {
            already_recorded = recorded.iter().any(
                |r| matches!(&outcome, Outcome::Approved(a) if a.fingerprint == r.fingerprint),
            );
            if let Outcome::Approved(a) = &outcome
                && !already_recorded
                && !new_records.iter().any(|r| r.fingerprint == a.fingerprint)
            {
                new_records.push(ApprovalRecord::new(a, &c.armored, now));
                approved.push(a.clone());
            }
        }
        judged.push(Judged {
            origin,
            source: c.source.clone(),
            outcome,
            already_recorded,
        });
    }
    let refusal = crate::plan::preflight::refusal(plan);
    if refusal.is_some() {
        approved.clear();
        new_records.clear();
    }
    ApprovalStatus {
        judged,
        refusal,
        new_records,
        quorum: crate::approval::evaluate(&plan.id, plan.approvals_required, approved),
    }
}

impl ApprovalStatus {
    /// What every plan view shows of this status (text, JSON `approvals.rejected[]`, the
    /// dashboard): each candidate that counts, and each that does not with its source, key,
    /// principal (from `signers` when the outcome names none) and reason. A candidate that
    /// approves but cannot count because blocking findings refuse the plan is listed as not
    /// counted, with that reason.
    pub fn view(&self, signers: &AllowedSigners) -> crate::plan::render::ApprovalsView {
        use crate::plan::render::{ApprovalsView, CandidateView};
        let principal = |o: &Outcome| -> String {
            if let Some(p) = o.principal() {
                return p.to_string();
            }
            let Some(fp) = o.fingerprint() else {
                return String::new();
            };
            signers
                .entries()
                .iter()
                .filter(|e| e.fingerprint() == fp)
                .map(|e| e.principals().to_string())
                .next()
                .unwrap_or_default()
        };
        let mut view = ApprovalsView::default();
        for j in &self.judged {
            let source = match &j.source {
                ApprovalSource::Marker { path } => format!("marker:{path}"),
                ApprovalSource::Api => "api".to_string(),
            };
            let mut line = CandidateView {
                source,
                fingerprint: j.outcome.fingerprint().unwrap_or_default().to_string(),
                principal: principal(&j.outcome),
                code: j.outcome.code().to_string(),
                reason: String::new(),
            };
            match (&j.outcome, &self.refusal) {
                (Outcome::Approved(_), None) => {
                    // One line per key: a marker whose key's approval is recorded adds nothing.
                    if !view
                        .counted
                        .iter()
                        .any(|c| c.fingerprint == line.fingerprint)
                    {
                        view.counted.push(line);
                    }
                }
                (Outcome::Approved(_), Some(why)) => {
                    line.code = "blocked".to_string();
                    line.reason = why.clone();
                    view.rejected.push(line);
                }
                (other, _) => {
                    line.reason = other.to_string();
                    view.rejected.push(line);
                }
            }
        }
        view
    }
}

/// The plan's recorded approvals (`<plan hex>/<fingerprint>` in the Approvals table).
pub fn recorded(store: &dyn Store, plan: &PlanId) -> Result<Vec<ApprovalRecord>, StoreError> {
    Ok(store
        .scan_records::<ApprovalRecord>(&crate::approval::record::approvals_prefix(plan))?
        .into_iter()
        .map(|(_, r)| r)
        .collect())
}

/// [`status`] as `medea approvals` computes it offline: the plan's recorded approvals and the
/// revision's markers, with the daemon's index, no cache and no submissions.
pub fn offline_status(
    store: &dyn Store,
    plan: &Plan,
    loaded: &crate::desired::Loaded,
    signers: &AllowedSigners,
    now: Timestamp,
) -> Result<ApprovalStatus, StoreError> {
    let index = PlanIndex::load(store)?;
    let recorded = recorded(store, &plan.id)?;
    Ok(status(
        &index,
        Trust {
            signers,
            generation: 0,
        },
        plan,
        &recorded,
        &marker_candidates(loaded),
        &[],
        now,
        &mut ApprovalCache::default(),
    ))
}

/// What a start is judged against: what the reconcile pass read once (issue #34), never read
/// again here. The start transaction's conditions make sure it still holds at commit.
#[derive(Debug, Clone, Copy)]
pub struct StartBasis<'a> {
    /// The applied state, running jobs and jobs the plan's basis came from.
    pub reads: &'a crate::ops::replan::PassReads,
    /// The observed clusters the gates are read from (and whose records job creation
    /// checks are unchanged).
    pub inventory: &'a crate::inventory::Inventory,
}

/// The checks and writes that start `plan`: its settings, its jobs, its consumed marker.
/// `Ok(None)` when there is nothing to start; `Err(gates)` when a gate keeps it waiting.
///
/// The one place a quorum becomes jobs (issue #34): the reconcile pass adds these to the
/// transaction that records the approval reaching quorum. It reads no store: the transaction
/// checks its basis instead — the consumed marker absent, the last-applied resources it writes
/// as `basis.reads` saw them ([`crate::ops::replan::PassReads::start_checks`]) and, for each
/// cluster with steps, the observed record as `basis.inventory` holds it and no running job
/// (`rollout::create_jobs_txn`); with the reconcile pass's current-plan pointer, a basis that
/// moved since the pass read it makes the commit a conflict that writes nothing.
pub fn start_txn(
    desired: &crate::desired::Desired,
    plan: &Plan,
    basis: StartBasis<'_>,
    global_rollouts: bool,
    now: Timestamp,
) -> Result<Option<(crate::store::Txn, Vec<String>)>, Vec<String>> {
    use crate::plan::stored::consumed_key;
    use crate::plan::stored::with_approval_writes;
    use crate::rollout::{JobInputs, RolloutError, create_jobs_txn};
    use crate::store::{Check, Txn};
    let basis_checks = |mut txn: Txn| {
        for c in basis.reads.start_checks(plan) {
            txn = txn.check(c);
        }
        txn
    };
    let has_steps = plan.clusters.iter().any(|c| !c.steps.is_empty());
    if !has_steps {
        // Settings only: apply them and consume the plan.
        let txn = with_approval_writes(
            basis_checks(Txn::new())
                .check(Check::Absent(Table::Plans, consumed_key(&plan.id)))
                .put_record(
                    consumed_key(&plan.id),
                    &crate::rollout::journal::PlanConsumed {
                        plan: plan.id,
                        at: now,
                        jobs: vec![],
                    },
                ),
            plan,
        );
        return Ok(Some((txn, vec![])));
    }
    let clusters: std::collections::BTreeMap<String, &crate::inventory::ObservedCluster> = basis
        .inventory
        .clusters
        .iter()
        .map(|(k, v)| (k.clone(), v.as_ref()))
        .collect();
    let windows: std::collections::BTreeMap<String, &[crate::desired::window::MaintenanceWindow]> =
        desired
            .clusters
            .iter()
            .map(|(k, c)| (k.clone(), c.windows.as_slice()))
            .collect();
    let exclusions: std::collections::BTreeMap<String, &[crate::desired::exclusion::Exclusion]> =
        desired
            .clusters
            .iter()
            .map(|(k, c)| (k.clone(), c.exclusions.as_slice()))
            .collect();
    // The cluster's backup recipients: the job's etcd snapshot is encrypted to them (#49).
    let backup_recipients: std::collections::BTreeMap<
        String,
        &[crate::desired::backup::Recipient],
    > = desired
        .clusters
        .iter()
        .filter_map(|(k, c)| {
            c.backup
                .as_ref()
                .map(|b| (k.clone(), b.recipients.as_slice()))
        })
        .collect();
    let inputs = JobInputs {
        global_rollouts,
        clusters,
        windows,
        exclusions,
        backup_recipients,
    };
    match create_jobs_txn(plan, &inputs, now) {
        Ok(created) => {
            let ids = created.jobs.iter().map(|j| j.id.to_string()).collect();
            Ok(Some((
                with_approval_writes(basis_checks(created.txn), plan),
                ids,
            )))
        }
        Err(e @ (RolloutError::RolloutsOff | RolloutError::ClusterDisabled { .. })) => {
            let msg = e.to_string();
            tracing::debug!(plan = %plan.id.short(), gate = %msg, "plan approved, waiting for a gate");
            Err(vec![msg])
        }
        Err(e) => {
            tracing::warn!(plan = %plan.id.short(), error = %crate::error_chain(&e), "plan approved but cannot start");
            Err(vec![e.to_string()])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::allowed_signers;
    use crate::store::Txn;
    use crate::store::mem::MemStore;
    use ssh_key::private::{Ed25519Keypair, KeypairData};
    use ssh_key::{HashAlg, LineEnding, PrivateKey};

    fn private(seed: u8) -> PrivateKey {
        PrivateKey::new(
            KeypairData::Ed25519(Ed25519Keypair::from_seed(&[seed; 32])),
            "",
        )
        .unwrap()
    }
    fn plan(n: u32) -> PlanId {
        let mut b = [0x5a; 32];
        b[..4].copy_from_slice(&n.to_be_bytes());
        PlanId::from_digest(b)
    }
    fn sign(seed: u8, p: &PlanId) -> String {
        private(seed)
            .sign(
                crate::approval::NAMESPACE,
                HashAlg::Sha512,
                &p.signed_message(),
            )
            .unwrap()
            .to_pem(LineEnding::LF)
            .unwrap()
    }
    fn signers(seeds: &[u8]) -> AllowedSigners {
        let text: String = seeds
            .iter()
            .map(|s| {
                format!(
                    "p{s}@example.com {}\n",
                    private(*s).public_key().to_openssh().unwrap()
                )
            })
            .collect();
        let (s, d) = allowed_signers::parse(&text);
        assert!(d.is_empty(), "{d:?}");
        s
    }
    fn marker(name_plan: &PlanId, who: &str, armored: String) -> Candidate {
        Candidate {
            source: ApprovalSource::Marker {
                path: format!("approvals/{}-{who}.sig", name_plan.short()),
            },
            armored,
            named: None,
        }
    }
    /// A store with `n` stored plans (`plan(1..=n)`), the first `consumed` of them executed.
    fn store_with(n: u32, consumed: u32) -> MemStore {
        let store = MemStore::new();
        let mut txn = Txn::new();
        for i in 1..=n {
            txn = txn.put(
                Table::Plans,
                crate::plan::stored::plan_key(&plan(i)),
                b"{}".to_vec(),
            );
            if i <= consumed {
                txn = txn.put_record(
                    crate::plan::stored::consumed_key(&plan(i)),
                    &crate::rollout::journal::PlanConsumed {
                        plan: plan(i),
                        at: "2026-01-01T00:00:00Z".parse().unwrap(),
                        jobs: vec![],
                    },
                );
            }
        }
        store.commit(txn).unwrap();
        store
    }

    /// Issue 32: with many stored plans, markers that sign none of them cost one signature
    /// check each (the current plan) plus one per plan their file name names, never one per
    /// stored plan; and unchanged markers cost nothing on the next pass. Before, every such
    /// marker was checked against every stored plan: 40 markers × 300 plans = 12,000 checks.
    #[test]
    fn a_pass_makes_o_markers_signature_checks_not_o_markers_times_plans() {
        let store = store_with(300, 20);
        let index = PlanIndex::load(&store).unwrap();
        assert_eq!(index.stored.len(), 300);
        assert_eq!(index.consumed.len(), 20);
        let trusted = signers(&[1, 2]);
        let trust = Trust {
            signers: &trusted,
            generation: 7,
        };
        let current = plan(300);
        let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
        let mut candidates = Vec::new();
        // 20 copied markers: a signature over an unknown message, named after stored plans.
        let unknown = PlanId::from_digest([0xee; 32]);
        for i in 0..20 {
            candidates.push(marker(&plan(100 + i), &format!("x{i}"), sign(1, &unknown)));
        }
        // 20 markers that name no plan at all.
        for i in 0..20 {
            candidates.push(Candidate {
                source: ApprovalSource::Marker {
                    path: format!("approvals/copy-{i}.sig"),
                },
                armored: sign(2, &unknown),
                named: None,
            });
        }
        // An old approval of an executed plan, under its own name: Replayed.
        candidates.push(marker(&plan(3), "p1", sign(1, &plan(3))));
        // An approval of a superseded plan, under its own name: StalePlan.
        candidates.push(marker(&plan(250), "p2", sign(2, &plan(250))));
        // The real approval of the current plan.
        candidates.push(marker(&current, "p1", sign(1, &current)));
        let mut cache = ApprovalCache::default();
        let outcomes = verify_candidates(&index, trust, &current, &candidates, now, &mut cache);
        assert_eq!(outcomes.len(), candidates.len());
        for o in &outcomes[..40] {
            assert_eq!(o.code(), "other-plan", "{o}");
        }
        assert!(
            matches!(&outcomes[40], Outcome::Replayed { plan: p, .. } if *p == plan(3)),
            "{}",
            outcomes[40]
        );
        assert!(
            matches!(&outcomes[41], Outcome::StalePlan { signed, .. } if *signed == plan(250)),
            "{}",
            outcomes[41]
        );
        assert!(outcomes[42].approved().is_some(), "{}", outcomes[42]);
        // 20 named: current + the named plan (2 each); 20 unnamed: current (1 each);
        // replayed and stale: current, then their plan (2 each); current: 1.
        assert_eq!(cache.last.signature_checks, 20 * 2 + 20 + 2 + 2 + 1);
        assert_eq!(cache.last.cached, 0);

        // The next pass with the same markers: nothing is verified again, same outcomes.
        let again = verify_candidates(&index, trust, &current, &candidates, now, &mut cache);
        assert_eq!(again, outcomes);
        assert_eq!(cache.last.signature_checks, 0);
        assert_eq!(cache.last.cached, candidates.len());
        assert_eq!(cache.len(), candidates.len());
    }

    /// A reload that puts other signers in force (a new generation) verifies again: a removed
    /// signer's cached check never counts.
    #[test]
    fn a_new_signers_generation_invalidates_the_cache() {
        let store = store_with(3, 0);
        let index = PlanIndex::load(&store).unwrap();
        let current = plan(3);
        let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
        let both = signers(&[1, 2]);
        let only_two = signers(&[2]);
        let candidates = vec![marker(&current, "p1", sign(1, &current))];
        let mut cache = ApprovalCache::default();
        let o = verify_candidates(
            &index,
            Trust {
                signers: &both,
                generation: 1,
            },
            &current,
            &candidates,
            now,
            &mut cache,
        );
        assert!(o[0].approved().is_some(), "{}", o[0]);
        let o = verify_candidates(
            &index,
            Trust {
                signers: &only_two,
                generation: 2,
            },
            &current,
            &candidates,
            now,
            &mut cache,
        );
        assert_eq!(o[0].code(), "unknown-key", "{}", o[0]);
        assert_eq!(cache.last.cached, 0);
        // Another current plan is another key too: the approval of the old one is stale.
        let next = plan(4);
        let o = verify_candidates(
            &index,
            Trust {
                signers: &both,
                generation: 3,
            },
            &next,
            &candidates,
            now,
            &mut cache,
        );
        assert!(
            matches!(&o[0], Outcome::StalePlan { signed, .. } if *signed == current),
            "{}",
            o[0]
        );
    }

    /// The judged part is evaluated on every pass: a plan executed since the signature stage
    /// was cached makes its approval `Replayed` at once.
    #[test]
    fn a_cached_check_is_judged_again_against_executed_plans() {
        let current = plan(2);
        let store = store_with(2, 0);
        let trusted = signers(&[1]);
        let trust = Trust {
            signers: &trusted,
            generation: 0,
        };
        let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
        let candidates = vec![marker(&current, "p1", sign(1, &current))];
        let mut cache = ApprovalCache::default();
        let index = PlanIndex::load(&store).unwrap();
        let o = verify_candidates(&index, trust, &current, &candidates, now, &mut cache);
        assert!(o[0].approved().is_some());
        store
            .commit(Txn::new().put_record(
                crate::plan::stored::consumed_key(&current),
                &crate::rollout::journal::PlanConsumed {
                    plan: current,
                    at: now,
                    jobs: vec![],
                },
            ))
            .unwrap();
        let index = PlanIndex::load(&store).unwrap();
        let o = verify_candidates(&index, trust, &current, &candidates, now, &mut cache);
        assert_eq!(cache.last.cached, 1);
        assert_eq!(o[0].code(), "replayed", "{}", o[0]);
    }

    /// An API submission names the plan it signs: when a refresh replaced that plan between
    /// the operator's `medea plan` and `medea approve`, the answer is "stale, approve the
    /// current plan" (what `medea approve` and the e2e test act on), not "another plan".
    /// A named plan the store never held is not tried (nothing to be stale against).
    #[test]
    fn an_api_submission_over_the_plan_just_replaced_is_stale() {
        let store = store_with(3, 0);
        let trusted = signers(&[1]);
        let trust = Trust {
            signers: &trusted,
            generation: 0,
        };
        let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
        let index = PlanIndex::load(&store).unwrap();
        let (old, current) = (plan(2), plan(3));
        let submitted = |named: Option<PlanId>| Candidate {
            source: ApprovalSource::Api,
            armored: sign(1, &old),
            named,
        };
        let mut cache = ApprovalCache::default();
        let o = verify_candidates(
            &index,
            trust,
            &current,
            &[submitted(Some(old))],
            now,
            &mut cache,
        );
        assert!(
            matches!(&o[0], Outcome::StalePlan { signed, current: c, .. } if *signed == old && *c == current),
            "{}",
            o[0]
        );
        assert_eq!(cache.last.signature_checks, 2);
        // Without the name (or naming a plan never stored) only the current plan is tried.
        for named in [None, Some(plan(9))] {
            let o = verify_candidates(
                &index,
                trust,
                &current,
                &[submitted(named)],
                now,
                &mut cache,
            );
            assert_eq!(o[0].code(), "other-plan", "{}", o[0]);
        }
    }

    /// Issue 32: collecting superseded plans never forgets an executed one. Plan 1 is executed,
    /// then `PLAN_WINDOW` + 10 newer plans are saved with the collector's writes (what
    /// `ops::replan` commits): plan 1's record goes, its `consumed/` key stays, so its old
    /// marker stays `Replayed`, and when the same inputs give plan 1 again (a revert), the
    /// marker still never counts: a consumed plan's approval never starts a job again.
    #[test]
    fn collected_plans_keep_their_consumed_ids() {
        use crate::plan::stored::{PLAN_WINDOW, RECENT_PREFIX, collect_ops, plan_key};
        let store = MemStore::new();
        let save = |new: PlanId, previous: Option<PlanId>| {
            let stored: Vec<PlanId> = PlanIndex::load(&store)
                .unwrap()
                .stored
                .into_iter()
                .collect();
            let recent = store.scan_keys(Table::Plans, RECENT_PREFIX).unwrap();
            let mut txn = Txn::new().put(Table::Plans, plan_key(&new), b"{}".to_vec());
            for op in collect_ops(&new, previous.as_ref(), &stored, &recent) {
                txn.push(op);
            }
            store.commit(txn).unwrap();
        };
        save(plan(1), None);
        store
            .commit(Txn::new().put_record(
                crate::plan::stored::consumed_key(&plan(1)),
                &crate::rollout::journal::PlanConsumed {
                    plan: plan(1),
                    at: "2026-01-01T00:00:00Z".parse().unwrap(),
                    jobs: vec![],
                },
            ))
            .unwrap();
        let newest = PLAN_WINDOW as u32 + 11;
        for i in 2..=newest {
            save(plan(i), Some(plan(i - 1)));
        }
        let index = PlanIndex::load(&store).unwrap();
        assert!(
            !index.stored.contains(&plan(1)),
            "plan 1's record is collected"
        );
        assert!(index.stored.len() <= PLAN_WINDOW, "{}", index.stored.len());
        assert_eq!(index.consumed, BTreeSet::from([plan(1)]));
        assert!(
            index.known().contains(&plan(1)),
            "an executed plan stays known (the API names it stale, not unknown)"
        );

        let trusted = signers(&[1]);
        let trust = Trust {
            signers: &trusted,
            generation: 0,
        };
        let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
        let old = vec![marker(&plan(1), "p1", sign(1, &plan(1)))];
        let mut cache = ApprovalCache::default();
        let o = verify_candidates(&index, trust, &plan(newest), &old, now, &mut cache);
        assert!(
            matches!(&o[0], Outcome::Replayed { plan: p, .. } if *p == plan(1)),
            "{}",
            o[0]
        );
        // The same inputs again: plan 1 is current once more, and its approval is a replay.
        save(plan(1), Some(plan(newest)));
        let index = PlanIndex::load(&store).unwrap();
        let o = verify_candidates(&index, trust, &plan(1), &old, now, &mut cache);
        assert_eq!(o[0].code(), "replayed", "{}", o[0]);
        assert!(o[0].approved().is_none());
    }

    #[test]
    fn matching_finds_stored_and_executed_plans_by_prefix() {
        let store = store_with(5, 2);
        let index = PlanIndex::load(&store).unwrap();
        let r = crate::plan::PlanIdRef::parse(&plan(2).short()).unwrap();
        assert_eq!(index.matching(&r), vec![plan(2)]);
        let odd = crate::plan::PlanIdRef::parse(&plan(4).to_hex()[..13]).unwrap();
        assert_eq!(index.matching(&odd), vec![plan(4)]);
        let none = crate::plan::PlanIdRef::parse("ffffffffffff").unwrap();
        assert!(index.matching(&none).is_empty());
        assert_eq!(index.known().len(), 5);
    }

    /// Issue #34: the start transaction reads no store; it checks its basis. A settings-only
    /// plan started from a pass that saw no applied state refuses (a conflict, nothing
    /// written) when a last-applied resource it writes appeared since; from the state as read
    /// it commits.
    #[test]
    fn the_start_transaction_checks_the_basis_the_pass_read() {
        use crate::plan::tests::{observed, one, worker_pool, workers};
        let d = one("v1.34.1", "", &[worker_pool(3, 1)]);
        let inventory = observed("v1.34.1", 1, workers(3, "v1.13.9"));
        let p = crate::plan::compute(&d, &inventory, &Default::default(), None).unwrap();
        assert!(p.has_changes() && p.clusters.iter().all(|c| c.steps.is_empty()));
        let reads = crate::ops::replan::PassReads::default();
        let start = || {
            start_txn(
                &d,
                &p,
                StartBasis {
                    reads: &reads,
                    inventory: &inventory,
                },
                false,
                Timestamp::now(),
            )
            .unwrap()
            .unwrap()
        };
        let (txn, jobs) = start();
        assert!(jobs.is_empty());
        for r in &p.applies.put {
            assert!(
                txn.checks.contains(&crate::store::Check::Absent(
                    Table::Desired,
                    r.key.store_key()
                )),
                "{:?}",
                txn.checks
            );
        }
        // A resource it writes appeared after the pass read the applied state.
        let store = MemStore::new();
        let first = &p.applies.put[0];
        store
            .commit(Txn::new().put_record(first.key.store_key(), first))
            .unwrap();
        let err = store.commit(start().0).unwrap_err();
        assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
        let consumed = crate::plan::stored::consumed_key(&p.id);
        assert!(store.get(Table::Plans, &consumed).unwrap().is_none());
        // From the state as read, it commits and consumes the plan.
        let store = MemStore::new();
        store.commit(start().0).unwrap();
        assert!(store.get(Table::Plans, &consumed).unwrap().is_some());
    }

    /// Issue #49: the job a quorum starts carries its cluster's backup recipients (its etcd
    /// snapshot is saved encrypted to them); a cluster without `spec.backup` gets none (a
    /// plaintext snapshot, as before).
    #[test]
    fn started_jobs_carry_the_clusters_backup_recipients() {
        use crate::plan::tests::{cp_pool, observed, one, three_cps};
        let key = age::x25519::Identity::generate().to_public().to_string();
        let backup = format!("  backup:\n    schedule: '0 3 * * *'\n    recipients: [{key}]\n");
        for (extra, want) in [(backup.as_str(), vec![key.clone()]), ("", vec![])] {
            let d = one("v1.34.1", extra, &[cp_pool("v1.13.9")]);
            let mut inventory = observed("v1.34.1", 4, three_cps("v1.12.11"));
            let c1 = inventory.clusters["c1"].with_rollouts_enabled(true);
            inventory
                .clusters
                .insert("c1".into(), std::sync::Arc::new(c1));
            let p = crate::plan::compute(&d, &inventory, &Default::default(), None).unwrap();
            let reads = crate::ops::replan::PassReads::default();
            let (txn, jobs) = start_txn(
                &d,
                &p,
                StartBasis {
                    reads: &reads,
                    inventory: &inventory,
                },
                true,
                Timestamp::now(),
            )
            .unwrap()
            .unwrap();
            assert_eq!(jobs.len(), 1, "{extra}");
            let job: crate::rollout::Job = txn
                .ops
                .iter()
                .find_map(|op| match op {
                    crate::store::Op::Put(Table::Jobs, k, v) if k.starts_with("job/") => {
                        crate::store::record::decode(k, v).ok()
                    }
                    _ => None,
                })
                .expect("the job is created");
            assert_eq!(job.snapshot_recipients, want, "{extra}");
        }
    }
}
