//! etcd leadership in a control-plane step (issue #48 item 3) and whose cordon medea lifts
//! (item 5), over the fakes: the leader goes last and hands over before its reboot; a failed
//! forfeit is judged by who leads afterwards; a cordoned control plane counts as down in the
//! quorum gate; a cordon that is not the job's stays.

use super::*;
use medea::rollout::ports::CORDONED_BY_ANNOTATION;

fn three_cps(leader: &str) -> FakeCluster {
    let fake = FakeCluster::new(&specs(3, 0, FROM, KUBE));
    fake.edit(|s| s.etcd_leader = Some(leader.to_string()));
    fake
}

fn cp_step(f: &FakeCluster) -> Vec<Step> {
    vec![talos_step(
        f,
        "control-plane",
        &[&["cp-1"], &["cp-2"], &["cp-3"]],
        TO,
        1,
    )]
}

/// The nodes in the order of their Reboot calls.
fn reboots(log: &[String]) -> Vec<String> {
    log.iter()
        .filter_map(|l| l.strip_prefix("reboot "))
        .map(str::to_string)
        .collect()
}

fn notes(w: &World) -> Vec<String> {
    w.journal().into_iter().flat_map(|e| e.notes).collect()
}

#[tokio::test(start_paused = true)]
async fn the_etcd_leader_goes_last_and_hands_over_before_its_reboot() {
    let w = world(three_cps("cp-1"), cp_step);
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_rolled(&s, TO, 1);
    // the plan said cp-1 first; it led etcd, so it went last
    assert_eq!(reboots(&s.log), ["cp-2", "cp-3", "cp-1"], "{:#?}", s.log);
    // only the leader was asked, once, right before its reboot; cp-2 leads now
    assert_eq!(s.forfeits, ["cp-1 -> cp-2"]);
    assert!(position(&s.log, "forfeit cp-1") < position(&s.log, "reboot cp-1"));
    assert!(position(&s.log, "upgrade cp-1") < position(&s.log, "forfeit cp-1"));
    assert_eq!(s.etcd_leader.as_deref(), Some("cp-2"));
    assert!(
        notes(&w)
            .iter()
            .any(|n| n.contains("cp-1: leads etcd, so it is upgraded after")),
        "{:#?}",
        notes(&w)
    );
}

/// Members that report no agreed leader (an election under way): the plan's order stands, and
/// each control plane is asked to forfeit before its reboot (a member that does not lead
/// answers at once), as Omni asks every control plane.
#[tokio::test(start_paused = true)]
async fn without_a_leader_reported_the_plan_order_stands_and_each_is_asked() {
    let w = world(FakeCluster::new(&specs(3, 0, FROM, KUBE)), cp_step);
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_eq!(reboots(&s.log), ["cp-1", "cp-2", "cp-3"]);
    assert_eq!(s.forfeits, ["cp-1", "cp-2", "cp-3"]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_forfeit_after_which_the_node_no_longer_leads_goes_on() {
    let fake = three_cps("cp-3").with_fault(Fault::ForfeitFails {
        node: "cp-3".into(),
        calls: 1,
        moved: true,
    });
    let w = world(fake, cp_step);
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_rolled(&s, TO, 1);
    // one call, failed; the leadership had moved all the same: no second call, no halt
    assert_eq!(s.forfeits, ["cp-3 failed"]);
    assert!(
        notes(&w).iter().any(
            |n| n.contains("cp-3: its forfeit of etcd leadership failed")
                && n.contains("`cp-1` leads etcd now")
        ),
        "{:#?}",
        notes(&w)
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_forfeit_while_the_node_still_leads_is_asked_again() {
    let fake = three_cps("cp-1").with_fault(Fault::ForfeitFails {
        node: "cp-1".into(),
        calls: 2,
        moved: false,
    });
    let w = world(fake, cp_step);
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_rolled(&s, TO, 1);
    assert_eq!(s.forfeits, ["cp-1 failed", "cp-1 failed", "cp-1 -> cp-2"]);
    // the leader was never rebooted before it handed over
    assert!(position(&s.log, "forfeit cp-1") < position(&s.log, "reboot cp-1"));
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_never_hands_over_halts_without_being_rebooted() {
    let fake = three_cps("cp-1").with_fault(Fault::ForfeitFails {
        node: "cp-1".into(),
        calls: u32::MAX,
        moved: false,
    });
    let w = world(fake, cp_step);
    let out = w.executor().run(&w.job).await.unwrap();
    let RunOutcome::Halted { reason, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!(reason.code(), HaltCode::LeadershipKept, "{reason}");
    assert!(
        reason.message().contains("`cp-1` still leads etcd"),
        "{reason}"
    );
    let s = w.state();
    assert_eq!(s.nodes["cp-1"].counters.reboot, 0, "{:#?}", s.log);
    assert!(s.forfeits.len() > 1, "asked again before halting");
}

/// A forfeit journaled without its result (a crash) is resolved by who leads: the call made
/// (cp-2 leads) is not made again; the call not made (cp-1 still leads) is made.
#[tokio::test(start_paused = true)]
async fn a_dangling_forfeit_is_resolved_by_who_leads() {
    for (trip, pred, calls) in [
        (
            Trip::AfterCommit,
            Box::new(is_intent(CommandOp::Forfeit)) as Pred,
            1,
        ),
        (
            Trip::InsteadOfCommit,
            Box::new(is_result(CommandOp::Forfeit)) as Pred,
            1,
        ),
    ] {
        let store = Arc::new(Tripwire::new());
        let w = world_in(three_cps("cp-1"), store.clone(), cp_step, &[]);
        store.arm(pred, trip, None);
        let e = w.executor().run(&w.job).await.unwrap_err();
        assert!(matches!(e, RolloutError::Store { .. }), "{trip:?}: {e}");
        assert_eq!(
            w.job().in_flight.map(|i| i.key.op),
            Some(CommandOp::Forfeit)
        );
        assert_eq!(
            w.executor().run(&w.job).await.unwrap(),
            RunOutcome::Succeeded,
            "{trip:?}"
        );
        let s = w.state();
        assert_rolled(&s, TO, 1);
        assert_eq!(s.forfeits.len(), calls, "{trip:?}: {:?}", s.forfeits);
        assert_eq!(s.etcd_leader.as_deref(), Some("cp-2"));
        assert!(
            notes(&w).iter().any(
                |n| n.contains("/forfeit-leadership/") && n.contains("resolved by observation")
            ),
            "{trip:?}"
        );
    }
}

/// cp-3 already runs the target (it is not in the step, so no wave budget counts it) and its
/// operator cordons it (talosctl 1.15 marks its cordons): taking cp-1 away too would leave one
/// member of three up. The quorum gate counts cp-3 as down, so cp-1 is never touched and the
/// job halts at its health timeout.
#[tokio::test(start_paused = true)]
async fn a_cordoned_control_plane_counts_as_down_in_the_quorum_gate() {
    let fake = FakeCluster::new(&specs(3, 0, FROM, KUBE));
    fake.edit(|s| s.nodes.get_mut("cp-3").unwrap().version = tv(TO));
    let w = world(fake, |f| {
        vec![talos_step(
            f,
            "control-plane",
            &[&["cp-1"], &["cp-2"]],
            TO,
            1,
        )]
    });
    w.fake.edit(|s| {
        let n = s.nodes.get_mut("cp-3").unwrap();
        n.cordoned = true;
        n.annotations
            .insert("talos.dev/client-cordoned".into(), "true".into());
    });
    let out = w.executor().run(&w.job).await.unwrap();
    let RunOutcome::Halted { reason, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!(reason.code(), HaltCode::EtcdUnhealthy, "{reason}");
    assert!(
        reason
            .message()
            .contains("`cp-3` is cordoned or draining (counted as down)"),
        "{reason}"
    );
    let s = w.state();
    assert_eq!(s.nodes["cp-1"].counters.cordon, 0, "{:#?}", s.log);
    assert_eq!(s.nodes["cp-1"].counters.upgrade, 0);
}

/// medea's cordon carries its job's annotation and its uncordon removes it: nothing of it is
/// left on any node.
#[tokio::test(start_paused = true)]
async fn every_cordon_carries_the_jobs_annotation_and_the_uncordon_removes_it() {
    let store = Arc::new(Tripwire::new());
    let w = world_in(
        FakeCluster::new(&specs(1, 1, FROM, KUBE)),
        store.clone(),
        |f| vec![talos_step(f, "w", &[&["w-1"]], TO, 1)],
        &[],
    );
    store.arm(is_result(CommandOp::Cordon), Trip::AfterCommit, None);
    assert!(w.executor().run(&w.job).await.is_err());
    let s = w.state();
    assert!(s.nodes["w-1"].cordoned);
    assert_eq!(
        s.nodes["w-1"].annotations.get(CORDONED_BY_ANNOTATION),
        Some(&w.job.to_string())
    );
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert!(!s.nodes["w-1"].cordoned);
    assert!(
        s.nodes["w-1"].annotations.is_empty(),
        "{:?}",
        s.nodes["w-1"].annotations
    );
}

/// medea died right after journaling w-1's cordon; meanwhile its operator cordoned it with
/// talosctl 1.15 (`talos.dev/client-cordoned`). The restarted medea finds it cordoned, but not
/// by its job: w-1 is upgraded and left cordoned, and the job's notes name who cordoned it.
#[tokio::test(start_paused = true)]
async fn a_cordon_someone_else_made_stays_after_a_crash() {
    let store = Arc::new(Tripwire::new());
    let w = world_in(
        FakeCluster::new(&specs(1, 2, FROM, KUBE)),
        store.clone(),
        // maxUnavailable 2: w-1, left cordoned by its operator, still leaves w-2 a slot
        |f| vec![talos_step(f, "w", &[&["w-1"], &["w-2"]], TO, 2)],
        &[],
    );
    store.arm(is_intent(CommandOp::Cordon), Trip::AfterCommit, None);
    assert!(w.executor().run(&w.job).await.is_err());
    w.fake.edit(|s| {
        let n = s.nodes.get_mut("w-1").unwrap();
        n.cordoned = true;
        n.annotations
            .insert("talos.dev/client-cordoned".into(), "true".into());
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_eq!(s.nodes["w-1"].version, tv(TO));
    assert!(s.nodes["w-1"].cordoned, "the operator's cordon stays");
    assert!(
        !s.nodes["w-1"]
            .annotations
            .contains_key(CORDONED_BY_ANNOTATION)
    );
    assert!(!s.nodes["w-2"].cordoned, "medea's own cordon is lifted");
    assert!(
        notes(&w)
            .iter()
            .any(|n| n.contains("w-1: left cordoned") && n.contains("talos.dev/client-cordoned")),
        "{:#?}",
        notes(&w)
    );
}
