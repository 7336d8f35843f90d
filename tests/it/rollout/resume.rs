//! Resuming: every kind of dangling intent is resolved by observation; `resume_all`.

use super::*;

/// A job that has every command kind: control plane + worker Talos rollout, then Kubernetes.
fn full_steps(f: &FakeCluster) -> Vec<Step> {
    vec![
        talos_step(f, "cp", &[&["cp-1"]], TO, 1),
        talos_step(f, "w", &[&["w-1"]], TO, 1),
        kube_step(&["cp-1"], &["w-1"], KUBE, "v1.34.1"),
    ]
}

fn assert_full(s: &FakeState) {
    assert_rolled(s, TO, 1);
    assert_eq!(s.snapshots, 1, "one snapshot");
    for n in s.nodes.values() {
        assert_eq!(n.kubelet, KubeVersion::parse("v1.34.1").unwrap());
    }
}

#[tokio::test(start_paused = true)]
async fn resumes_every_dangling_intent_by_observation() {
    let ops = [
        CommandOp::Snapshot,
        CommandOp::Pull,
        CommandOp::Cordon,
        CommandOp::Drain,
        CommandOp::Upgrade,
        CommandOp::Reboot,
        CommandOp::Uncordon,
        CommandOp::SetImage,
        CommandOp::ApplyManifests,
    ];
    for op in ops {
        // (a) died right after journaling the intent: the call was never made
        // (b) died after the call, before journaling its result
        for (trip, pred) in [
            (Trip::AfterCommit, Box::new(is_intent(op)) as Pred),
            (Trip::InsteadOfCommit, Box::new(is_result(op)) as Pred),
        ] {
            let fake = FakeCluster::new(&specs(1, 1, FROM, KUBE));
            let store = Arc::new(Tripwire::new());
            let w = world_in(fake, store.clone(), full_steps, &[]);
            store.arm(pred, trip, None);
            let e = w.executor().run(&w.job).await.unwrap_err();
            assert!(matches!(e, RolloutError::Store { .. }), "{op}: {e}");
            let dangling = w.job().in_flight.expect("an intent without a result");
            assert_eq!(dangling.key.op, op);
            // a new executor (a restarted medea) picks the job up
            let exec = w.executor();
            let running = exec.running_jobs().unwrap();
            assert_eq!(running.len(), 1);
            assert_eq!(
                exec.run(&w.job).await.unwrap(),
                RunOutcome::Succeeded,
                "{op} {trip:?}"
            );
            let s = w.state();
            assert_full(&s);
            let resolved = w.journal().iter().any(|e| {
                e.notes.iter().any(|n| {
                    n.contains(&format!("/{op}/")) && n.contains("resolved by observation")
                })
            });
            assert!(resolved, "{op} {trip:?}: resolved by observation");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn resume_all_runs_every_running_job() {
    let w = world(FakeCluster::new(&specs(3, 3, FROM, KUBE)), mixed_steps);
    let exec = Arc::new(w.executor());
    let results = exec.resume_all().await.unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, w.job);
    assert!(matches!(results[0].1, Ok(RunOutcome::Succeeded)));
    assert!(
        exec.resume_all().await.unwrap().is_empty(),
        "nothing left running"
    );
    assert!(exec.commits() > 0);
}
