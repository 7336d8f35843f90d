//! `medea bench approvals`: one reconcile pass ([`crate::server::reconcile::reconcile`]) over a
//! fjall store holding thousands of stored plans, with a desired state carrying thousands of
//! approval markers that do not sign the current plan (issue #32: a committer's copies).
//!
//! The store is seeded with a small fleet's inventory, its current plan (the first pass stores
//! it), `plans` more plan records under random ids (a store from before plans were collected;
//! their values are what listing them would have to read) and `plans / 10` executed-plan
//! markers. The markers are signed by allowed keys: a third over stored plans under their own
//! names (stale), a third over stored plans under another stored plan's name (copied), a third
//! over unknown messages under names that name no plan. Each round runs a pass with an empty
//! approval cache (cold: every marker verified) and one with the cache of the pass before
//! (warm: the markers unchanged), alternating which goes first. No marker approves the
//! current plan, so the passes change nothing and every round sees the same store.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use ssh_key::private::{Ed25519Keypair, KeypairData};
use ssh_key::{HashAlg, LineEnding, PrivateKey};

use super::BenchError;
use super::stats::Samples;
use crate::Locked as _;
use crate::desired::Source;
use crate::plan::PlanId;
use crate::store::fjall::FjallStore;
use crate::store::{Store, Table, Txn};

/// Timings of every round, in milliseconds, and what the passes did.
#[derive(Debug, Clone, Default)]
pub struct ApprovalsReport {
    pub markers: usize,
    /// Plan records in the store (the current one included).
    pub plans: usize,
    pub consumed: usize,
    /// A pass with an empty approval cache.
    pub cold: Samples,
    /// A pass after a pass with the same markers.
    pub warm: Samples,
    /// Signature verifications of the last cold and warm pass.
    pub cold_checks: usize,
    pub warm_checks: usize,
    /// Outcomes of the last pass, by code.
    pub outcomes: std::collections::BTreeMap<String, usize>,
}

fn store_err(e: crate::store::StoreError) -> BenchError {
    BenchError::Store(Box::new(e))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
    move |err| BenchError::Io {
        path: path.to_path_buf(),
        err,
    }
}

fn key(seed: u64) -> Result<PrivateKey, BenchError> {
    let mut s = [0u8; 32];
    s[..8].copy_from_slice(&seed.to_le_bytes());
    s[8] = 0x5a;
    PrivateKey::new(KeypairData::Ed25519(Ed25519Keypair::from_seed(&s)), "").map_err(|e| {
        BenchError::Invalid {
            what: format!("cannot make a signing key: {e}"),
        }
    })
}

fn sign(k: &PrivateKey, plan: &PlanId) -> Result<String, BenchError> {
    let invalid = |what: &str| BenchError::Invalid {
        what: format!("cannot sign a marker: {what}"),
    };
    k.sign(
        crate::approval::NAMESPACE,
        HashAlg::Sha512,
        &plan.signed_message(),
    )
    .map_err(|e| invalid(&e.to_string()))?
    .to_pem(LineEnding::LF)
    .map_err(|e| invalid(&e.to_string()))
}

/// A deterministic pseudo-random plan id.
fn id(n: u64) -> PlanId {
    use sha2::{Digest, Sha256};
    PlanId::from_digest(Sha256::digest(format!("bench-plan-{n}")).into())
}

/// Seed the store and the repo at `work`, then run `rounds` rounds.
pub fn run(
    work: &Path,
    markers: usize,
    plans: usize,
    rounds: usize,
) -> Result<ApprovalsReport, BenchError> {
    let fleet = super::fleet::generate(super::fleet::FleetSpec {
        clusters: 1,
        machines_per_cluster: 4,
        seed: 1,
    });
    let written = super::fleet::write_repo(&fleet, work).map_err(io(work))?;
    let store = Arc::new(FjallStore::open(&work.join("store")).map_err(store_err)?);
    fleet.inventory.save(store.as_ref()).map_err(store_err)?;
    let signers_path = work.join("allowed_signers");
    let keys: Vec<PrivateKey> = (1..=3).map(key).collect::<Result<_, _>>()?;
    let mut text = String::new();
    for (i, k) in keys.iter().enumerate() {
        let line = k
            .public_key()
            .to_openssh()
            .map_err(|e| BenchError::Invalid {
                what: format!("cannot write a public key: {e}"),
            })?;
        text.push_str(&format!("signer{i}@example.com {line}\n"));
    }
    std::fs::write(&signers_path, text).map_err(io(&signers_path))?;
    let source = Source::Dir(written.desired.clone());
    let mut shared =
        crate::server::Shared::new(store.clone(), source.clone(), false, "bench".into());
    shared.trust =
        crate::server::trust::TrustRoot::open(Some(signers_path), &source).map_err(|e| {
            BenchError::Invalid {
                what: format!("allowed signers: {}", crate::error_chain(&e)),
            }
        })?;
    // A revision holds at most `MAX_FILES` resource and marker files; more markers would make
    // the revision an error (no plan, nothing verified), not a slower pass.
    let resources = fleet.files.len();
    let most = crate::desired::source::limits::MAX_FILES.saturating_sub(resources);
    if markers > most {
        return Err(BenchError::Invalid {
            what: format!(
                "{markers} markers and the fleet's {resources} resource files exceed the {} files a revision may hold (desired::source::limits::MAX_FILES): at most {most} markers",
                crate::desired::source::limits::MAX_FILES
            ),
        });
    }
    let reload = |shared: &crate::server::Shared| -> Result<(), BenchError> {
        let loaded =
            crate::ops::load_desired(&source).map_err(|e| BenchError::Desired(Box::new(e)))?;
        if let Some(d) = loaded.errors().next() {
            return Err(BenchError::Invalid {
                what: format!("the generated desired state has errors: {d}"),
            });
        }
        shared.set_desired(loaded);
        Ok(())
    };
    let pass = |shared: &crate::server::Shared| -> Result<
        crate::server::reconcile::PassResult,
        BenchError,
    > {
        crate::server::reconcile::reconcile(shared, &[], jiff::Timestamp::now()).map_err(|e| {
            BenchError::Server {
                what: crate::error_chain(&e),
            }
        })
    };
    reload(&shared)?;
    let first = pass(&shared)?;
    let current = first
        .plan
        .map(|p| p.id)
        .ok_or_else(|| BenchError::Invalid {
            what: "the fleet gave no plan".into(),
        })?;
    // The stored plans and the executed ones (a store from before plans were collected).
    let value = store
        .get(Table::Plans, &crate::plan::stored::plan_key(&current))
        .map_err(store_err)?
        .unwrap_or_default();
    let consumed = plans / 10;
    let mut txn = Txn::new().buffered();
    for n in 0..plans as u64 {
        txn = txn.put(
            Table::Plans,
            crate::plan::stored::plan_key(&id(n)),
            value.clone(),
        );
        if (n as usize) < consumed {
            txn = txn.put(
                Table::Plans,
                crate::plan::stored::consumed_key(&id(n)),
                b"{}".to_vec(),
            );
        }
        if txn.ops.len() >= 512 {
            store
                .commit(std::mem::take(&mut txn).buffered())
                .map_err(store_err)?;
        }
    }
    store.commit(txn).map_err(store_err)?;
    // The markers.
    let dir = written.desired.join("approvals");
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    for m in 0..markers as u64 {
        let k = &keys[(m % 3) as usize];
        let (signed, named) = match m % 3 {
            0 => (id(m % plans as u64), id(m % plans as u64).short()),
            1 => (id(m % plans as u64), id((m + 1) % plans as u64).short()),
            _ => (id(1_000_000 + m), format!("copy{m}")),
        };
        let path = dir.join(format!("{named}-m{m}.sig"));
        std::fs::write(&path, sign(k, &signed)?).map_err(io(&path))?;
    }
    reload(&shared)?;
    let mut r = ApprovalsReport {
        markers,
        plans: crate::ops::replan::plan_ids(store.as_ref())
            .map_err(store_err)?
            .len(),
        consumed,
        ..ApprovalsReport::default()
    };
    let checks =
        |shared: &crate::server::Shared| shared.approval_cache.locked().last.signature_checks;
    let cold = |r: &mut ApprovalsReport| -> Result<(), BenchError> {
        *shared.approval_cache.locked() = Default::default();
        let t = Instant::now();
        let state = pass(&shared)?;
        r.cold.push(t.elapsed());
        r.cold_checks = checks(&shared);
        if state.plan.map(|p| p.id) != Some(current) {
            return Err(BenchError::Invalid {
                what: "the current plan changed during the benchmark".into(),
            });
        }
        Ok(())
    };
    let warm = |r: &mut ApprovalsReport| -> Result<(), BenchError> {
        let t = Instant::now();
        let state = pass(&shared)?;
        r.warm.push(t.elapsed());
        r.warm_checks = checks(&shared);
        r.outcomes.clear();
        for (_, o) in &state.outcomes {
            let kind = if o.contains("already executed") {
                "replayed"
            } else if o.contains("stale") {
                "stale-plan"
            } else if o.starts_with("does not sign") {
                "other-plan"
            } else if o.starts_with("approved") {
                "approved"
            } else {
                "other"
            };
            *r.outcomes.entry(kind.to_string()).or_default() += 1;
        }
        Ok(())
    };
    // A warm pass needs the cache of the pass before it (cold or warm): the first round
    // starts cold, then the order alternates.
    for i in 0..rounds {
        if i % 2 == 0 {
            cold(&mut r)?;
            warm(&mut r)?;
        } else {
            warm(&mut r)?;
            cold(&mut r)?;
        }
    }
    Ok(r)
}
