//! Property: whatever the order of crashes, lost replies and refusals, the machine never
//! upgrades or reboots a node twice and never takes more than allowed away.

use super::*;
use medea::error_chain;
use medea::rollout::ports::{PortError, SnapshotInfo};
use medea::rollout::sequencer::{
    self, Action, Command, CommandOutcome, Needs, Next, ObsError, Observations,
};
use proptest::prelude::*;

fn obs_err(e: PortError) -> ObsError {
    ObsError {
        transient: e.is_transient(),
        message: error_chain(&e),
    }
}

fn observe(fake: &FakeCluster, needs: &Needs, snap: &Option<SnapshotInfo>) -> Observations {
    let mut o = Observations::default();
    for t in &needs.talos {
        o.talos
            .insert(t.node.clone(), fake.talos_node(t).map_err(obs_err));
    }
    for k in &needs.kube {
        o.kube.insert(k.clone(), fake.kube_node(k).map_err(obs_err));
    }
    if let Some(via) = &needs.etcd {
        o.etcd = Some(fake.talos_etcd(via).map_err(obs_err));
    }
    for t in &needs.args {
        o.args
            .insert(t.node.clone(), fake.talos_args(t).map_err(obs_err));
    }
    for t in &needs.images {
        o.images
            .insert(t.node.clone(), fake.talos_images(t).map_err(obs_err));
    }
    for (n, c) in &needs.static_pods {
        o.static_pods.insert(
            (n.clone(), *c),
            fake.kube_static_pod(n, *c).map_err(obs_err),
        );
    }
    for (t, c) in &needs.config_versions {
        o.config_versions.insert(
            (t.node.clone(), *c),
            fake.talos_config_version(t, *c).map_err(obs_err),
        );
    }
    for n in &needs.volumes {
        o.volumes
            .insert(n.clone(), fake.kube_volume_attachments(n).map_err(obs_err));
    }
    if needs.nodes {
        o.nodes = Some(fake.kube_nodes().map_err(obs_err));
    }
    if needs.snapshot {
        o.snapshot = Some(Ok(snap.clone()));
    }
    o
}

fn fake_op(op: CommandOp) -> &'static str {
    match op {
        CommandOp::Snapshot => "etcd-snapshot",
        CommandOp::Pull | CommandOp::PullAhead => "pull",
        CommandOp::Cordon => "cordon",
        CommandOp::Drain => "drain",
        CommandOp::Upgrade => "upgrade",
        CommandOp::Reboot => "reboot",
        CommandOp::Uncordon => "uncordon",
        CommandOp::SetImage => "apply-configuration",
        CommandOp::ApplyManifests => "server-side-apply",
        CommandOp::Rollback => "rollback",
        CommandOp::Silence => "silence",
        CommandOp::Unsilence => "unsilence",
        CommandOp::Hook => "hook",
        CommandOp::Stage => "upgrade",
        CommandOp::Taint => "taint",
        CommandOp::Untaint => "untaint",
        CommandOp::Forfeit => "forfeit",
    }
}

fn execute(fake: &FakeCluster, cmd: &Command, snap: &mut Option<SnapshotInfo>) -> CommandOutcome {
    let r: Result<CommandOutcome, PortError> = match &cmd.action {
        Action::Snapshot { via } => fake.talos_snapshot(via).map(|bytes| {
            use sha2::Digest;
            let info = SnapshotInfo {
                path: "/snapshots/job.db".into(),
                size: bytes.len() as u64,
                sha256: hex::encode(sha2::Sha256::digest(&bytes)),
                encrypted: None,
            };
            *snap = Some(info.clone());
            CommandOutcome::Snapshot { info }
        }),
        Action::Pull { node, image, .. } => {
            fake.talos_pull(node, image).map(|()| CommandOutcome::Done)
        }
        Action::Cordon { node } => fake
            .kube_cordon(node, cmd.key.job.as_str(), true)
            .map(|()| CommandOutcome::Done),
        Action::Uncordon { node } => fake
            .kube_cordon(node, cmd.key.job.as_str(), false)
            .map(|()| CommandOutcome::Done),
        Action::ForfeitLeadership { node } => {
            fake.talos_forfeit(node).map(|_| CommandOutcome::Done)
        }
        Action::Drain { node, .. } => fake
            .kube_drain(node)
            .map(|result| CommandOutcome::Drain { result }),
        Action::Upgrade {
            node,
            image,
            method,
            ..
        } => fake
            .talos_upgrade(node, image, *method)
            .map(|()| CommandOutcome::Done),
        Action::Reboot { node, .. } => fake.talos_reboot(node).map(|()| CommandOutcome::Done),
        Action::Rollback { node, .. } => fake.talos_rollback(node).map(|()| CommandOutcome::Done),
        Action::SetImage {
            node,
            component,
            image,
        } => fake
            .talos_set_image(node, *component, image)
            .map(|()| CommandOutcome::Done),
        Action::ApplyManifests { via, legacy } => fake
            .talos_manifests(via)
            .and_then(|m| fake.kube_apply(&m, *legacy))
            .map(|()| CommandOutcome::Done),
        // the property model's plans silence nothing
        Action::Taint { node, taint } => fake
            .kube_taint(node, taint, true)
            .map(|()| CommandOutcome::Done),
        Action::Untaint { node, taint } => fake
            .kube_taint(node, taint, false)
            .map(|()| CommandOutcome::Done),
        Action::Silence { .. } | Action::Unsilence { .. } => {
            panic!("a plan without a silence policy made {cmd:?}")
        }
        // nor do they have hooks
        Action::Hook { .. } => panic!("a plan without hooks made {cmd:?}"),
        // nor do they stage
        Action::Stage { .. } => panic!("a plan without `rollout.stage: ahead` made {cmd:?}"),
    };
    match r {
        Ok(o) => o,
        Err(e) if e.is_transient() => CommandOutcome::Transient {
            error: error_chain(&e),
        },
        Err(e) => CommandOutcome::Failed {
            error: error_chain(&e),
            refusal: e.refusal(),
        },
    }
}

fn check_invariants(s: &FakeState, max: usize) {
    let away = |cp: bool| {
        s.nodes
            .values()
            .filter(|n| n.control_plane == cp && (n.cordoned || n.down()))
            .count()
    };
    assert!(
        away(true) <= 1,
        "control plane: {} away\n{:#?}",
        away(true),
        s.log
    );
    assert!(
        away(false) <= max,
        "workers: {} away, max {max}\n{:#?}",
        away(false),
        s.log
    );
    for (name, n) in &s.nodes {
        assert!(
            n.counters.upgrade <= 1,
            "{name} upgraded twice\n{:#?}",
            s.log
        );
        assert!(
            n.counters.reboot <= 1,
            "{name} rebooted twice\n{:#?}",
            s.log
        );
    }
}

#[allow(clippy::too_many_arguments)]
/// `next`, after checking that the journal's delta from `job` to `next` (through its JSON
/// encoding, as stored) rebuilds `next` exactly.
fn replayed(job: &Job, next: Job) -> Job {
    use medea::rollout::journal::JobDelta;
    let delta = JobDelta::between(job, &next).expect("a transition changes no plan-derived part");
    let delta: JobDelta = serde_json::from_slice(&serde_json::to_vec(&delta).unwrap()).unwrap();
    let mut rebuilt = job.clone();
    delta.apply(&mut rebuilt).unwrap();
    rebuilt.journal_seq = next.journal_seq;
    assert_eq!(rebuilt, next, "the delta rebuilds the transition");
    next
}

fn run(
    cps: usize,
    workers: usize,
    max: u32,
    reboot_polls: u32,
    with_kube: bool,
    oversized_waves: bool,
    chaos: Vec<u8>,
) {
    let fake = FakeCluster::new(&specs(cps, workers, FROM, KUBE));
    fake.edit(|s| s.reboot_polls = reboot_polls);
    let obs = observed(&fake);
    let cp_names: Vec<String> = (1..=cps).map(|i| format!("cp-{i}")).collect();
    let w_names: Vec<String> = (1..=workers).map(|i| format!("w-{i}")).collect();
    // oversized waves stand for a planner bug: the machine must still honour the limits
    let cp_waves: Vec<Vec<&str>> = if oversized_waves {
        vec![cp_names.iter().map(|n| n.as_str()).collect()]
    } else {
        cp_names.iter().map(|n| vec![n.as_str()]).collect()
    };
    let chunk = if oversized_waves {
        max as usize * 2
    } else {
        max as usize
    };
    let w_waves: Vec<Vec<&str>> = w_names
        .chunks(chunk)
        .map(|c| c.iter().map(|s| s.as_str()).collect())
        .collect();
    let mut steps = vec![talos_step(
        &fake,
        "cp",
        &cp_waves.iter().map(|w| w.as_slice()).collect::<Vec<_>>(),
        TO,
        1,
    )];
    if !w_waves.is_empty() {
        steps.push(talos_step(
            &fake,
            "w",
            &w_waves.iter().map(|w| w.as_slice()).collect::<Vec<_>>(),
            TO,
            max,
        ));
    }
    if with_kube {
        let c: Vec<&str> = cp_names.iter().map(|s| s.as_str()).collect();
        let w: Vec<&str> = w_names.iter().map(|s| s.as_str()).collect();
        steps.push(kube_step(&c, &w, KUBE, "v1.34.1"));
    }
    let p = plan(&obs, steps, 3);
    let none: &[MaintenanceWindow] = &[];
    let inputs = JobInputs {
        global_rollouts: true,
        clusters: [(CLUSTER.to_string(), &obs)].into(),
        windows: [(CLUSTER.to_string(), none)].into(),
        exclusions: Default::default(),
        backup_recipients: Default::default(),
    };
    let mut job = create_jobs_txn(&p, &inputs, t0()).unwrap().jobs.remove(0);
    let mut now = t0();
    let mut snap = None;
    // every cycle of the chaos has at least one clean call, so the world lets it progress
    let mut chaos = chaos.into_iter().chain([7]).cycle();
    for _ in 0..20_000 {
        let mut o = observe(&fake, &sequencer::needs(&job, now), &snap);
        let mut t = sequencer::step(&job, &o, now);
        for _ in 0..16 {
            if t.missing.is_empty() {
                break;
            }
            o.merge(observe(&fake, &t.missing, &snap));
            t = sequencer::step(&job, &o, now);
        }
        job = replayed(&job, t.job);
        match t.next {
            Next::Finished => break,
            Next::Run(cmd) => {
                job = replayed(&job, sequencer::intend(&job, &cmd, now));
                match chaos.next().unwrap() {
                    // crashed right after journaling the intent
                    0 => {}
                    // crashed after the call, before journaling its result
                    1 => {
                        execute(&fake, &cmd, &mut snap);
                    }
                    // the call took effect, the reply was lost
                    2 => {
                        let node = cmd.key.node.clone().unwrap_or_default();
                        let node = if cmd.key.op == CommandOp::Snapshot {
                            match &cmd.action {
                                Action::Snapshot { via } => via.node.clone(),
                                _ => node,
                            }
                        } else {
                            node
                        };
                        fake.edit(|s| {
                            s.faults.push(Fault::LostReply {
                                node,
                                op: fake_op(cmd.key.op).into(),
                            })
                        });
                        let out = execute(&fake, &cmd, &mut snap);
                        job = replayed(&job, sequencer::complete(&job, &cmd.key, &out, now).0);
                        fake.edit(|s| s.faults.retain(|f| !matches!(f, Fault::LostReply { .. })));
                    }
                    // the Talos API refused the call (UNAVAILABLE, no effect)
                    3 => {
                        fake.edit(|s| s.faults.push(Fault::TalosUnavailable { calls: 1 }));
                        let out = execute(&fake, &cmd, &mut snap);
                        job = replayed(&job, sequencer::complete(&job, &cmd.key, &out, now).0);
                        fake.edit(|s| {
                            s.faults
                                .retain(|f| !matches!(f, Fault::TalosUnavailable { .. }))
                        });
                    }
                    _ => {
                        let out = execute(&fake, &cmd, &mut snap);
                        job = replayed(&job, sequencer::complete(&job, &cmd.key, &out, now).0);
                    }
                }
                check_invariants(&fake.state(), max as usize);
            }
            Next::Poll { .. } => now = now.checked_add(Duration::from_secs(5)).unwrap(),
            Next::WaitUntil { at, .. } => now = at,
        }
        now = now.checked_add(Duration::from_secs(1)).unwrap();
    }
    assert!(
        matches!(job.state, JobState::Succeeded { .. }),
        "{:?}\n{:#?}",
        job.state,
        fake.state().log
    );
    let s = fake.state();
    assert_rolled(&s, TO, 1);
    assert!(s.snapshots >= 1);
    if with_kube {
        assert!(
            s.nodes
                .values()
                .all(|n| n.kubelet == KubeVersion::parse("v1.34.1").unwrap())
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn never_twice_never_too_many_away(
        cps in prop_oneof![Just(1usize), Just(3usize)],
        workers in 0usize..=4,
        max in 1u32..=3,
        reboot_polls in 0u32..3,
        with_kube in any::<bool>(),
        oversized_waves in any::<bool>(),
        chaos in proptest::collection::vec(0u8..8, 1..64),
    ) {
        run(cps, workers, max, reboot_polls, with_kube, oversized_waves, chaos);
    }
}
