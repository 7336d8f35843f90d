//! Job creation and the gates: the global and per-cluster switches, halt requests, maintenance
//! windows.

use super::*;

#[test]
fn job_creation_checks_the_gates_and_the_plan() {
    let fake = FakeCluster::new(&specs(1, 1, FROM, KUBE));
    let obs = observed(&fake);
    let p = plan(&obs, mixed_steps_small(&fake), 7);
    let store = MemStore::new();
    let none: &[MaintenanceWindow] = &[];
    fn inputs<'a>(
        global: bool,
        c: &'a ObservedCluster,
        none: &'a [MaintenanceWindow],
    ) -> JobInputs<'a> {
        JobInputs {
            global_rollouts: global,
            clusters: [(CLUSTER.to_string(), c)].into(),
            windows: [(CLUSTER.to_string(), none)].into(),
            exclusions: Default::default(),
            backup_recipients: Default::default(),
        }
    }
    // global gate off
    let e = create_jobs_txn(&p, &inputs(false, &obs, none), t0()).unwrap_err();
    assert!(matches!(e, RolloutError::RolloutsOff), "{e}");
    assert!(e.to_string().contains("--rollouts"));
    // cluster disabled
    let off = obs.with_rollouts_enabled(false);
    let e = create_jobs_txn(&p, &inputs(true, &off, none), t0()).unwrap_err();
    assert!(matches!(e, RolloutError::ClusterDisabled { .. }), "{e}");
    // observed generation moved since planning
    let mut moved = obs.clone();
    moved.generation += 1;
    let e = create_jobs_txn(&p, &inputs(true, &moved, none), t0()).unwrap_err();
    assert!(matches!(e, RolloutError::StalePlan { .. }), "{e}");
    assert!(e.to_string().contains("medea plan"), "{e}");
    // a blocking preflight finding nobody acknowledged: never started, whatever the gates
    // (defense in depth: approval refuses such a plan first)
    let mut blocked = p.clone();
    std::sync::Arc::make_mut(&mut blocked.clusters[0])
        .preflight
        .push(medea::plan::preflight::Finding {
            id: "etcd/alarm/NOSPACE/1".into(),
            check: "etcd".into(),
            severity: medea::plan::preflight::Severity::Blocking,
            message: "etcd alarm NOSPACE is active on member 1".into(),
            evidence: vec![],
            help: String::new(),
            acknowledged: false,
            until: None,
        });
    let e = create_jobs_txn(&blocked, &inputs(true, &obs, none), t0()).unwrap_err();
    assert!(matches!(e, RolloutError::BlockingFindings { .. }), "{e}");
    assert!(e.to_string().contains("[etcd/alarm/NOSPACE/1]"), "{e}");
    assert!(e.to_string().contains("spec.preflight.acknowledge"), "{e}");
    std::sync::Arc::make_mut(&mut blocked.clusters[0]).preflight[0].acknowledged = true;
    assert!(create_jobs_txn(&blocked, &inputs(true, &obs, none), t0()).is_ok());

    // not the current plan: the transaction refuses atomically
    store
        .commit(Txn::new().put_record(
            CURRENT_KEY,
            &CurrentPlan {
                id: PlanId::from_digest([0xee; 32]),
            },
        ))
        .unwrap();
    store
        .commit(Txn::new().put_record(cluster_key(CLUSTER), &obs))
        .unwrap();
    let c = create_jobs_txn(&p, &inputs(true, &obs, none), t0()).unwrap();
    assert!(matches!(
        store.commit(c.txn.clone()),
        Err(StoreError::Conflict { .. })
    ));
    assert!(
        store.scan(Table::Jobs, "").unwrap().is_empty(),
        "nothing created"
    );

    // current: created once; the same plan never starts again
    store
        .commit(Txn::new().put_record(CURRENT_KEY, &CurrentPlan { id: p.id }))
        .unwrap();
    store.commit(c.txn.clone()).unwrap();
    assert!(matches!(
        store.commit(c.txn.clone()),
        Err(StoreError::Conflict { .. })
    ));
    let job = medea::ops::jobs::load_job(&store, &c.jobs[0].id)
        .unwrap()
        .unwrap();
    assert_eq!(job.plan, p.id);
    assert!(matches!(job.state, JobState::Running));

    // a second plan for the same cluster cannot start while the first job runs
    let p2 = plan(&obs, mixed_steps_small(&fake), 8);
    store
        .commit(Txn::new().put_record(CURRENT_KEY, &CurrentPlan { id: p2.id }))
        .unwrap();
    let c2 = create_jobs_txn(&p2, &inputs(true, &obs, none), t0()).unwrap();
    assert!(matches!(
        store.commit(c2.txn),
        Err(StoreError::Conflict { key, .. }) if key == format!("active/{CLUSTER}")
    ));
}

fn mixed_steps_small(f: &FakeCluster) -> Vec<Step> {
    vec![talos_step(f, "all", &[&["cp-1"], &["w-1"]], TO, 1)]
}

#[tokio::test(start_paused = true)]
async fn global_gate_off_means_no_mutating_call_at_all() {
    let w = world(FakeCluster::new(&specs(3, 3, FROM, KUBE)), mixed_steps);
    let mut cfg = w.config();
    cfg.rollouts = false;
    let out = w.executor_with(cfg).run(&w.job).await.unwrap();
    assert_eq!(
        out,
        RunOutcome::Paused {
            gate: Gate::GlobalRollouts
        }
    );
    assert!(w.state().log.is_empty());
    assert_eq!(w.state().snapshots, 0);
    assert!(
        matches!(w.job().state, JobState::Running),
        "paused, not halted"
    );
}

#[tokio::test(start_paused = true)]
async fn cluster_disabled_means_no_mutating_call_at_all() {
    let w = world(FakeCluster::new(&specs(3, 3, FROM, KUBE)), mixed_steps);
    let off = observed(&w.fake).with_rollouts_enabled(false);
    w.store
        .commit(Txn::new().put_record(cluster_key(CLUSTER), &off))
        .unwrap();
    let out = w.executor().run(&w.job).await.unwrap();
    assert_eq!(
        out,
        RunOutcome::Paused {
            gate: Gate::ClusterDisabled {
                cluster: CLUSTER.into()
            }
        }
    );
    assert!(w.state().log.is_empty());
    assert_eq!(w.state().snapshots, 0);
}

#[tokio::test(start_paused = true)]
async fn disabling_the_cluster_mid_job_stops_before_the_next_mutating_command() {
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE));
    let store = Arc::new(Tripwire::new());
    let w = world_in(
        fake,
        store.clone(),
        |f| vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)],
        &[],
    );
    let off = observed(&w.fake).with_rollouts_enabled(false);
    store.arm(
        is_result(CommandOp::Cordon),
        Trip::AlsoCommit,
        Some(Txn::new().put_record(cluster_key(CLUSTER), &off)),
    );
    let out = w.executor().run(&w.job).await.unwrap();
    assert!(
        matches!(
            out,
            RunOutcome::Paused {
                gate: Gate::ClusterDisabled { .. }
            }
        ),
        "{out:?}"
    );
    assert_eq!(
        w.state().log,
        [
            "pull w-1 factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.13.9",
            "cordon w-1"
        ]
    );
    assert!(
        w.job().in_flight.is_none(),
        "no intent was journaled past the gate"
    );
    // re-enabled: the same job continues (a gate pauses, it does not halt)
    let on = observed(&w.fake);
    let mut on = on.with_rollouts_enabled(true);
    on.generation = off.generation;
    w.store
        .commit(Txn::new().put_record(cluster_key(CLUSTER), &on))
        .unwrap();
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    assert_rolled(&w.state(), TO, 1);
}

#[tokio::test(start_paused = true)]
async fn a_halt_request_stops_before_the_next_mutating_command_and_for_good() {
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE));
    let store = Arc::new(Tripwire::new());
    let w = world_in(
        fake,
        store.clone(),
        |f| vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)],
        &[],
    );
    let halt = Txn::new().put_record(
        medea::rollout::journal::halt_key(&w.job),
        &medea::rollout::journal::HaltRequest {
            job: w.job.clone(),
            by: "alice@example.com".into(),
            reason: Some("pager went off".into()),
            at: t0(),
        },
    );
    store.arm(is_result(CommandOp::Drain), Trip::AlsoCommit, Some(halt));
    let out = w.executor().run(&w.job).await.unwrap();
    assert!(
        matches!(&out, RunOutcome::Halted { reason, .. } if reason.code() == HaltCode::OperatorRequest && reason.message().contains("alice@example.com") && reason.message().contains("pager went off")),
        "{out:?}"
    );
    let log = w.state().log;
    assert_eq!(log.last().unwrap(), "drain w-1", "{log:#?}");
    // the pacing taint of the next wave's w-2 (issue #35) was removed once the job halted
    assert_eq!(w.state().pacing_log, ["taint w-2", "untaint w-2"]);
    assert!(w.state().nodes["w-2"].taints.is_empty());
    assert_eq!(w.state().nodes["w-1"].counters.upgrade, 0);
    let job = w.job();
    assert!(matches!(&job.state, JobState::Halted { step: Some(0), .. }));
    assert!(
        w.journal()
            .iter()
            .any(|e| matches!(e.entry, Entry::HaltRequested { .. }))
    );
    // a halted job never resumes by itself
    assert!(matches!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Halted { .. }
    ));
    assert_eq!(w.state().log, log);
    assert!(w.executor().running_jobs().unwrap().is_empty());
    // and cannot be halted twice
    let e = request_halt(w.store.as_ref(), &w.job, "bob", None, t0()).unwrap_err();
    assert!(matches!(e, RolloutError::AlreadyFinished { .. }), "{e}");
}

#[tokio::test(start_paused = true)]
async fn request_halt_refuses_unknown_jobs_and_records_running_ones() {
    let w = world(FakeCluster::new(&specs(0, 1, FROM, KUBE)), |f| {
        vec![talos_step(f, "workers", &[&["w-1"]], TO, 1)]
    });
    let e = request_halt(
        w.store.as_ref(),
        &JobId::parse("nope").unwrap(),
        "bob",
        None,
        t0(),
    )
    .unwrap_err();
    assert!(matches!(e, RolloutError::UnknownJob { .. }), "{e}");
    request_halt(w.store.as_ref(), &w.job, "bob", None, t0()).unwrap();
    let out = w.executor().run(&w.job).await.unwrap();
    assert!(
        matches!(&out, RunOutcome::Halted { reason, .. } if reason.code() == HaltCode::OperatorRequest && reason.message() == "halted by bob"),
        "{out:?}"
    );
    assert!(w.state().log.is_empty(), "halted before the first command");
}

#[tokio::test(start_paused = true)]
async fn maintenance_windows_gate_the_start_of_each_node() {
    // t0 is Wednesday 2026-12-02 12:00 UTC; the window opens daily at 02:00 for 1 minute.
    let window = MaintenanceWindow::new("0 2 * * *", Duration::from_secs(60), "UTC").unwrap();
    let fake = FakeCluster::new(&specs(0, 2, FROM, KUBE));
    fake.edit(|s| s.reboot_polls = 30); // each node takes minutes to come back
    let w = world_in(
        fake,
        Arc::new(MemStore::new()),
        |f| vec![talos_step(f, "workers", &[&["w-1"], &["w-2"]], TO, 1)],
        &[window],
    );
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let first_intent = |node: &str, ahead: bool| {
        w.journal()
            .into_iter()
            // its own lifecycle's intents (the pacing taint it gets as the next wave aside)
            .find(|e| matches!(&e.entry, Entry::Intent { key, .. } if key.node.as_deref() == Some(node) && (key.op == CommandOp::PullAhead) == ahead && !matches!(key.op, CommandOp::Taint | CommandOp::Untaint)))
            .unwrap()
            .at
    };
    let thursday: Timestamp = "2026-12-03T02:00:00Z".parse().unwrap();
    let friday: Timestamp = "2026-12-04T02:00:00Z".parse().unwrap();
    let w1 = first_intent("w-1", false);
    let w2 = first_intent("w-2", false);
    // w-2's image was pulled while w-1 rebooted: inside Thursday's window as well
    let w2_pull = first_intent("w-2", true);
    assert!(
        w2_pull >= thursday && w2_pull < thursday.checked_add(Duration::from_secs(60)).unwrap(),
        "w-2 pulled ahead at {w2_pull}"
    );
    assert!(
        w1 >= thursday && w1 < thursday.checked_add(Duration::from_secs(60)).unwrap(),
        "w-1 started at {w1}"
    );
    assert!(
        w2 >= friday && w2 < friday.checked_add(Duration::from_secs(60)).unwrap(),
        "w-2 started at {w2}: the window had closed"
    );
    // w-2's pacing taint came with w-1's turn, inside Thursday's window too
    let taint = w
        .journal()
        .into_iter()
        .find(|e| matches!(&e.entry, Entry::Intent { key, .. } if key.node.as_deref() == Some("w-2") && key.op == CommandOp::Taint))
        .unwrap()
        .at;
    assert!(
        taint >= thursday && taint < thursday.checked_add(Duration::from_secs(60)).unwrap(),
        "w-2 tainted at {taint}"
    );
    assert_rolled(&w.state(), TO, 1);
}

/// Issue #36: a `noMinorUpgrades` exclusion in force lets a patch hop start at once and holds
/// a minor hop until the exclusion ends; the held node then starts by itself (the executor
/// waits until the end, no replan, no poke).
#[tokio::test(start_paused = true)]
async fn a_maintenance_exclusion_holds_a_minor_hop_until_it_ends_and_lets_a_patch_through() {
    use medea::desired::exclusion::{Exclusion, ExclusionScope};
    const MINOR: &str = "v1.14.1";
    let end = t0().checked_add(Duration::from_secs(2 * 3600)).unwrap();
    let freeze = Exclusion::new(
        "freeze",
        t0().checked_sub(Duration::from_secs(3600)).unwrap(),
        end,
        ExclusionScope::NoMinorUpgrades,
    )
    .unwrap();
    let w = world_with(
        FakeCluster::new(&specs(0, 2, FROM, KUBE)),
        Arc::new(MemStore::new()),
        |f| {
            vec![
                talos_step(f, "patch", &[&["w-1"]], TO, 1),
                talos_step(f, "minor", &[&["w-2"]], MINOR, 1),
            ]
        },
        &[],
        &[freeze],
    );
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let first_intent = |node: &str| {
        w.journal()
            .into_iter()
            .find(|e| matches!(&e.entry, Entry::Intent { key, .. } if key.node.as_deref() == Some(node)))
            .unwrap()
            .at
    };
    let (w1, w2) = (first_intent("w-1"), first_intent("w-2"));
    assert!(w1 < end, "the patch hop started inside the exclusion: {w1}");
    assert!(
        w2 >= end && w2 < end.checked_add(Duration::from_secs(60)).unwrap(),
        "the minor hop started when the exclusion ended ({end}), not before and not long after: {w2}"
    );
    let s = w.state();
    assert_eq!(s.nodes["w-1"].version.to_string(), TO);
    assert_eq!(s.nodes["w-2"].version.to_string(), MINOR);
}

#[tokio::test(start_paused = true)]
async fn a_halt_request_is_noticed_while_waiting_for_a_window() {
    let window = MaintenanceWindow::new("0 2 * * 6", Duration::from_secs(3600), "UTC").unwrap();
    let w = world_in(
        FakeCluster::new(&specs(0, 1, FROM, KUBE)),
        Arc::new(MemStore::new()),
        |f| vec![talos_step(f, "workers", &[&["w-1"]], TO, 1)],
        &[window],
    );
    let exec = w.executor();
    let job = w.job.clone();
    let task = tokio::spawn(async move { exec.run(&job).await });
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!task.is_finished(), "waiting for Saturday");
    request_halt(
        w.store.as_ref(),
        &w.job,
        "carol",
        Some("change freeze"),
        t0(),
    )
    .unwrap();
    let out = task.await.unwrap().unwrap();
    assert!(
        matches!(&out, RunOutcome::Halted { reason, .. } if reason.code() == HaltCode::OperatorRequest && reason.message().contains("change freeze")),
        "{out:?}"
    );
    assert!(w.state().log.is_empty());
}
