//! Sequences: the order of a Talos rollout (control planes, waves, multi-hop, legacy nodes,
//! pull-ahead) and the upgrade method the journal records.

use super::*;

#[tokio::test(start_paused = true)]
async fn mixed_talos_rollout_succeeds_in_order() {
    let w = world(FakeCluster::new(&specs(3, 3, FROM, KUBE)), mixed_steps);
    let exec = w.executor();
    let mut events = exec.subscribe();
    let out = exec.run(&w.job).await.unwrap();
    assert_eq!(out, RunOutcome::Succeeded);
    let s = w.state();
    assert_rolled(&s, TO, 1);
    assert_eq!(s.snapshots, 1);
    let log = &s.log;
    // the snapshot precedes any change to a control-plane node
    let snap = position(log, "etcd-snapshot");
    assert_eq!(snap, 0, "{log:#?}");
    // per node: pull, cordon, drain, upgrade, reboot, uncordon
    let ops: Vec<String> = mutations_of(log, "cp-2")
        .iter()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert_eq!(
        ops,
        ["pull", "cordon", "drain", "upgrade", "reboot", "uncordon"]
    );
    // control plane strictly one at a time; the first worker wave away together
    assert_eq!(max_away(log, &["cp-1", "cp-2", "cp-3"]), 1);
    assert_eq!(max_away(log, &["w-1", "w-2", "w-3"]), 2);
    assert!(
        position(log, "uncordon cp-3") < position(log, "pull w-1"),
        "pools in plan order"
    );
    assert!(
        position(log, "uncordon w-2") < position(log, "pull w-3"),
        "waves in order"
    );
    // the job says so, and the snapshot file is there, private and checksummed
    let job = w.job();
    assert!(matches!(job.state, JobState::Succeeded { .. }));
    let snap = job.snapshot.clone().unwrap();
    let bytes = std::fs::read(&snap.path).unwrap();
    use sha2::Digest;
    assert_eq!(snap.sha256, hex::encode(sha2::Sha256::digest(&bytes)));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&snap.path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // nothing left active: a new job for the cluster could start
    assert_eq!(
        w.store
            .get(Table::Jobs, &format!("active/{CLUSTER}"))
            .unwrap(),
        None
    );
    // events carry pool and node
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    assert!(
        seen.iter()
            .any(|e: &RolloutEvent| e.op == Some(CommandOp::Upgrade)
                && e.node.as_deref() == Some("w-3")
                && e.pool.as_deref() == Some("workers")
                && matches!(e.state, EventState::Intended { attempt: 1 }))
    );
    assert!(matches!(seen.last().unwrap().state, EventState::Succeeded));
}

#[tokio::test(start_paused = true)]
async fn every_result_is_preceded_by_its_intent_in_the_journal() {
    let w = world(FakeCluster::new(&specs(1, 1, FROM, KUBE)), |f| {
        vec![talos_step(f, "all", &[&["cp-1"], &["w-1"]], TO, 1)]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let j = w.journal();
    assert!(matches!(j[0].entry, Entry::Created { .. }));
    for (i, e) in j.iter().enumerate() {
        assert_eq!(e.seq, i as u64, "sequence numbers are dense");
        if let Entry::Result { key, .. } = &e.entry {
            assert!(
                matches!(&j[i - 1].entry, Entry::Intent { key: k, .. } if k == key),
                "result {key} right after its intent"
            );
        }
    }
    let upgrades = j
        .iter()
        .filter(|e| matches!(&e.entry, Entry::Intent { key, .. } if key.op == CommandOp::Upgrade))
        .count();
    assert_eq!(upgrades, 2);
    assert_eq!(w.job().journal_seq, (j.len() - 1) as u64);
}

#[tokio::test(start_paused = true)]
async fn legacy_nodes_upgrade_through_the_legacy_rpc_and_reboot_by_themselves() {
    let w = world(FakeCluster::new(&specs(1, 1, "v1.12.4", "v1.32.3")), |f| {
        vec![talos_step(f, "all", &[&["cp-1"], &["w-1"]], "v1.13.9", 1)]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_rolled(&s, "v1.13.9", 0);
    let job = w.job();
    let intents: Vec<_> = w
        .journal()
        .into_iter()
        .filter_map(|e| match e.entry {
            Entry::Intent { action, .. } => Some(action),
            _ => None,
        })
        .collect();
    assert!(intents.iter().any(|a| matches!(
        a,
        medea::rollout::sequencer::Action::Upgrade {
            method: medea::rollout::ports::UpgradeMethod::Legacy,
            ..
        }
    )));
    assert!(matches!(job.state, JobState::Succeeded { .. }));
}

#[tokio::test(start_paused = true)]
async fn multi_hop_plans_run_hop_by_hop() {
    let w = world(FakeCluster::new(&specs(0, 2, "v1.13.2", KUBE)), |f| {
        let mut hop1 = talos_step(f, "workers", &[&["w-1"], &["w-2"]], "v1.13.9", 1);
        let mut hop2 = talos_step(f, "workers", &[&["w-1"], &["w-2"]], "v1.14.1", 1);
        if let (Step::Talos(a), Step::Talos(b)) = (&mut hop1, &mut hop2) {
            a.hops = 2;
            b.hop = 2;
            b.hops = 2;
            for t in b.waves.iter_mut().flatten() {
                t.from = tv("v1.13.9");
            }
        }
        vec![hop1, hop2]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    for n in s.nodes.values() {
        assert_eq!(n.version, tv("v1.14.1"));
        assert_eq!(n.counters.upgrade, 2, "one Upgrade per hop");
        assert_eq!(n.counters.reboot, 2);
    }
    let first_hop2 = position(
        &s.log,
        "upgrade w-1 factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.1",
    );
    let last_hop1 = position(
        &s.log,
        "upgrade w-2 factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.13.9",
    );
    assert!(last_hop1 < first_hop2, "{:#?}", s.log);
    assert_eq!(s.snapshots, 0, "workers only: no etcd snapshot");
}

/// A node already on the target is skipped, and not pulled ahead either while w-1 reboots:
/// it is never touched.
#[tokio::test(start_paused = true)]
async fn a_node_already_on_target_is_skipped() {
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE));
    fake.edit(|s| s.reboot_polls = 5);
    let w = world(fake, |f| {
        vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)]
    });
    w.fake
        .edit(|s| s.nodes.get_mut("w-2").unwrap().version = tv(TO));
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_eq!(s.nodes["w-2"].counters, Default::default(), "w-2 untouched");
    assert!(intent_ops(&w, "w-2").is_empty());
    // only its pacing taint, as the next wave, put and removed once it was skipped
    assert_eq!(
        ops_of(&w, "w-2", true),
        [CommandOp::Taint, CommandOp::Untaint]
    );
    assert!(s.nodes["w-2"].taints.is_empty());
    assert_eq!(s.nodes["w-1"].counters.upgrade, 1);
}

/// The commands of `node`'s journal intents, in order.
fn intent_ops(w: &World, node: &str) -> Vec<CommandOp> {
    ops_of(w, node, false)
}

/// The commands of `node`'s journal intents, in order: its lifecycle's, or (`pacing`) only
/// its pacing taint's (issue #35).
fn ops_of(w: &World, node: &str, pacing: bool) -> Vec<CommandOp> {
    w.journal()
        .into_iter()
        .filter_map(|e| match e.entry {
            Entry::Intent { key, .. }
                if key.node.as_deref() == Some(node)
                    && matches!(key.op, CommandOp::Taint | CommandOp::Untaint) == pacing =>
            {
                Some(key.op)
            }
            _ => None,
        })
        .collect()
}

fn pulled_ahead(job: &Job, node: &str) -> Option<medea::rollout::sequencer::PullAhead> {
    job.steps
        .iter()
        .find_map(|s| match &s.kind {
            medea::rollout::sequencer::StepKind::Talos(t) => {
                t.nodes.iter().find(|n| n.target.node == node)
            }
            _ => None,
        })
        .and_then(|n| n.pulled_ahead)
}

/// While a wave's nodes reboot, the next wave's nodes pull the image (once each: not again at
/// their turn); their disruption still waits until the wave before is back in service.
#[tokio::test(start_paused = true)]
async fn the_next_wave_pulls_its_image_while_the_wave_reboots() {
    use medea::rollout::sequencer::PullAhead;
    let fake = FakeCluster::new(&specs(0, 4, FROM, KUBE));
    fake.edit(|s| s.reboot_polls = 5);
    let w = world(fake, |f| {
        vec![talos_step(
            f,
            "workers",
            &[&["w-1", "w-2"], &["w-3", "w-4"]],
            TO,
            2,
        )]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_rolled(&s, TO, 1);
    let log = &s.log;
    for n in ["w-1", "w-2", "w-3", "w-4"] {
        assert_eq!(s.nodes[n].counters.pull, 1, "{n} pulled once: {log:#?}");
    }
    for n in ["w-3", "w-4"] {
        let pull = position(log, &format!("pull {n}"));
        assert!(
            position(log, "reboot w-2") < pull && pull < position(log, "uncordon w-1"),
            "{n} pulled while the first wave was away: {log:#?}"
        );
    }
    assert!(
        position(log, "uncordon w-2") < position(log, "cordon w-3"),
        "the second wave is disrupted only after the first is back: {log:#?}"
    );
    use CommandOp::*;
    assert_eq!(
        intent_ops(&w, "w-1"),
        [Pull, Cordon, Drain, Upgrade, Reboot, Uncordon]
    );
    assert_eq!(
        intent_ops(&w, "w-3"),
        [PullAhead, Cordon, Drain, Upgrade, Reboot, Uncordon]
    );
    let job = w.job();
    assert_eq!(pulled_ahead(&job, "w-1"), None);
    assert_eq!(pulled_ahead(&job, "w-3"), Some(PullAhead::Pulled));
    assert_eq!(pulled_ahead(&job, "w-4"), Some(PullAhead::Pulled));
}

/// A machine with its own installer (a pool without one, on Talos >= 1.14: each node's Image
/// Factory installer) is pulled, pulled ahead and upgraded with that image, the others with
/// the step's.
#[tokio::test(start_paused = true)]
async fn a_machine_with_its_own_installer_is_pulled_and_upgraded_with_it() {
    let fake = FakeCluster::new(&specs(0, 4, FROM, KUBE));
    fake.edit(|s| s.reboot_polls = 5);
    let own = format!("factory.talos.dev/aws-installer/abc:{TO}");
    let w = world(fake, |f| {
        let mut step = talos_step(f, "workers", &[&["w-1", "w-2"], &["w-3", "w-4"]], TO, 2);
        if let Step::Talos(t) = &mut step {
            for m in t.waves.iter_mut().flatten() {
                if m.node == "w-2" || m.node == "w-4" {
                    m.image = Some(own.clone());
                }
            }
        }
        vec![step]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_rolled(&s, TO, 1);
    let step_image = format!(
        "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:{TO}"
    );
    for (n, image) in [
        ("w-1", &step_image),
        ("w-2", &own),
        ("w-3", &step_image),
        ("w-4", &own),
    ] {
        for op in ["pull", "upgrade"] {
            let want = format!("{op} {n} {image}");
            assert!(s.log.contains(&want), "{want} missing: {:#?}", s.log);
        }
        assert!(
            s.log
                .iter()
                .filter(|l| l.starts_with(&format!("upgrade {n} "))
                    || l.starts_with(&format!("pull {n} ")))
                .all(|l| l.ends_with(image.as_str())),
            "{n} only with {image}: {:#?}",
            s.log
        );
    }
}

/// A pull ahead is best effort: its failure (here a lost reply) never halts the job, and the
/// node pulls again at its turn.
#[tokio::test(start_paused = true)]
async fn a_pull_ahead_that_fails_never_halts_and_the_node_pulls_at_its_turn() {
    use medea::rollout::sequencer::PullAhead;
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE)).with_fault(Fault::LostReply {
        node: "w-2".into(),
        op: "pull".into(),
    });
    fake.edit(|s| s.reboot_polls = 5);
    let w = world(fake, |f| {
        vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)]
    });
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let s = w.state();
    assert_rolled(&s, TO, 1);
    assert_eq!(s.nodes["w-2"].counters.pull, 2, "{:#?}", s.log);
    use CommandOp::*;
    assert_eq!(
        intent_ops(&w, "w-2"),
        [PullAhead, Pull, Cordon, Drain, Upgrade, Reboot, Uncordon]
    );
    assert_eq!(pulled_ahead(&w.job(), "w-2"), Some(PullAhead::Failed));
    assert!(
        w.journal().iter().any(|e| e
            .notes
            .iter()
            .any(|n| n.contains("w-2: the pull ahead of its turn failed"))),
        "the failure is on record"
    );
}

#[tokio::test(start_paused = true)]
async fn a_node_on_an_unexpected_version_halts_the_job() {
    let w = world(FakeCluster::new(&specs(0, 2, FROM, KUBE)), |f| {
        vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)]
    });
    w.fake
        .edit(|s| s.nodes.get_mut("w-1").unwrap().version = tv("v1.12.0"));
    let out = w.executor().run(&w.job).await.unwrap();
    assert!(
        matches!(&out, RunOutcome::Halted { reason, node: Some(n), .. } if reason.code() == HaltCode::UnexpectedVersion && reason.message().contains("plan expected v1.13.2") && n == "w-1"),
        "{out:?}"
    );
    assert!(w.state().log.is_empty());
}

#[test]
fn the_journaled_upgrade_method_is_the_rpc_the_talos_client_picks() {
    use medea::rollout::ports::UpgradeMethod;
    use medea::talos::UpgradeRpc;
    for v in [
        "v1.10.7",
        "v1.12.4",
        "v1.13.0-alpha.2",
        "v1.13.0-beta.1",
        "v1.13.0",
        "v1.13.9",
        "v1.14.0-rc.1",
        "v1.15.2",
        "v2.0.0",
    ] {
        let v = tv(v);
        let ours = UpgradeMethod::for_version(&v);
        let theirs = UpgradeRpc::for_running(&v);
        let same = matches!(
            (ours, theirs),
            (UpgradeMethod::Lifecycle, UpgradeRpc::Lifecycle)
                | (UpgradeMethod::Legacy, UpgradeRpc::Legacy)
        );
        assert!(same, "{v}: {ours:?} vs {theirs:?}");
    }
}
