//! Fencing: an executor whose commit fence fails, or whose term ended after the intent, makes
//! no call.

use super::*;

struct LostLease;

impl medea::rollout::CommitFence for LostLease {
    fn checks(&self) -> Vec<medea::store::Check> {
        vec![medea::store::Check::Equals(
            Table::Meta,
            "leader".into(),
            b"me".to_vec(),
        )]
    }
}

#[tokio::test(start_paused = true)]
async fn a_fenced_executor_makes_no_call() {
    let w = world(FakeCluster::new(&specs(0, 1, FROM, KUBE)), |f| {
        vec![talos_step(f, "workers", &[&["w-1"]], TO, 1)]
    });
    w.store
        .commit(Txn::new().put(Table::Meta, "leader", b"someone-else".to_vec()))
        .unwrap();
    let exec = w.executor().with_fence(Arc::new(LostLease));
    let e = exec.run(&w.job).await.unwrap_err();
    assert!(matches!(e, RolloutError::Fenced { .. }), "{e}");
    assert!(
        w.state().log.is_empty(),
        "the intent could not be journaled, so nothing was called"
    );
    // with the lease, the same job runs
    w.store
        .commit(Txn::new().put(Table::Meta, "leader", b"me".to_vec()))
        .unwrap();
    let exec = w.executor().with_fence(Arc::new(LostLease));
    assert_eq!(exec.run(&w.job).await.unwrap(), RunOutcome::Succeeded);
}

/// A term that ends between the fenced intent write and the call (the leader was stopped in
/// between): the checks still pass at the write, `ensure` refuses afterwards.
struct TermEndsAfterTheIntent;

impl medea::rollout::CommitFence for TermEndsAfterTheIntent {
    fn checks(&self) -> Vec<medea::store::Check> {
        Vec::new()
    }
    fn ensure(&self, _intent_checks: &[medea::store::Check]) -> Result<(), StoreError> {
        Err(StoreError::Fenced {
            replica: "a".into(),
            term: 7,
        })
    }
}

#[tokio::test(start_paused = true)]
async fn an_intent_whose_term_ended_before_the_call_is_not_acted_on() {
    let w = world(FakeCluster::new(&specs(0, 1, FROM, KUBE)), |f| {
        vec![talos_step(f, "workers", &[&["w-1"]], TO, 1)]
    });
    let exec = w.executor().with_fence(Arc::new(TermEndsAfterTheIntent));
    let e = exec.run(&w.job).await.unwrap_err();
    assert!(matches!(e, RolloutError::Fenced { .. }), "{e}");
    assert!(w.state().log.is_empty(), "no call: {:?}", w.state().log);
    let last = w.journal().pop().unwrap();
    assert!(
        matches!(last.entry, Entry::Intent { .. }),
        "the intent was journaled, its outcome was not: {last:?}"
    );
    // The next leader resumes that intent and makes each call once.
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let log = w.state().log;
    for op in ["upgrade w-1", "reboot w-1"] {
        assert_eq!(
            log.iter().filter(|l| l.starts_with(op)).count(),
            1,
            "{op}: {log:?}"
        );
    }
}
