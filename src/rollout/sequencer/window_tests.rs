//! Decisions around the maintenance windows, driven through [`step`] as the executor drives it
//! (observe what a round asks for, decide again at the same instant), the clock a value: the
//! watch over staged nodes inside a window (issue #36) and the `beforeWave` hooks of a wave
//! that may not start yet (issue #35).

use super::*;
use crate::desired::exclusion::{Exclusion, ExclusionScope};
use crate::desired::hooks::{Hook, HookAction, Hooks};
use crate::plan::StageAhead;
use crate::version::TalosVersion;

const FROM: &str = "v1.13.2";
const TO: &str = "v1.13.9";
/// Saturday noon: outside the daily 02:00–03:00 UTC window.
const OUTSIDE: &str = "2026-12-05T12:00:00Z";
/// When the window opens next.
const OPENS: &str = "2026-12-06T02:00:00Z";
/// Inside it.
const INSIDE: &str = "2026-12-06T02:10:00Z";

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn v(s: &str) -> TalosVersion {
    TalosVersion::parse(s).unwrap()
}

fn later(at: Timestamp, secs: u64) -> Timestamp {
    add(at, Duration::from_secs(secs))
}

/// Workers `w1` and `w2`, a wave each, from [`FROM`] to [`TO`], in a cluster with a daily
/// 02:00–03:00 UTC window; staged (`rollout.stage: ahead`, both nodes staged in boot `<n>-1`)
/// or not; with the pool's `hooks`.
fn job(staged: bool, hooks: Option<Hooks>) -> Job {
    let target = |n: &str| MachineTarget {
        node: n.into(),
        id: format!("id-{n}"),
        address: format!("10.0.0.{}", &n[1..]),
        from: v(FROM),
        image: None,
    };
    let rollout = TalosRollout {
        pool: "workers".into(),
        role: MachineRole::Worker,
        hop: 1,
        hops: 1,
        to: v(TO),
        image: "factory.talos.dev/installer/x:v1.13.9".into(),
        max_unavailable: 1,
        drain_timeout: Duration::from_secs(600),
        health_timeout: Duration::from_secs(900),
        upgrade_attempts: 1,
        drain: DrainPolicy::default(),
        waves: vec![vec![target("w1")], vec![target("w2")]],
        health: None,
        silence: None,
        hooks: hooks.map(Box::new),
        stage: staged.then_some(StageAhead { parallelism: 2 }),
        taint_next_wave: false,
    };
    let plan = PlanId::from_digest([7; 32]);
    let mut j = Job {
        windows: vec![WindowSpec {
            start: "0 2 * * *".into(),
            duration_secs: 3600,
            time_zone: "UTC".into(),
        }],
        ..Job::one_talos_step(plan, t("2026-12-05T11:00:00Z"), StepState::Running, rollout)
    };
    if staged {
        for (i, n) in ["w1", "w2"].iter().enumerate() {
            node_mut(&mut j, 0, i).staging = Some(Staging::Staged {
                boot_id: format!("{n}-1"),
                at: t("2026-12-05T11:30:00Z"),
            });
        }
    }
    j
}

/// What the fake cluster shows: every Talos node and Kubernetes node by name.
#[derive(Clone)]
struct World {
    talos: BTreeMap<String, TalosNode>,
    kube: BTreeMap<String, KubeNode>,
}

impl World {
    /// `w1` and `w2` running [`FROM`] in boot `<n>-1`, ready, Ready; staged or not.
    fn new(staged: bool) -> World {
        let next_boot = if staged {
            NextBoot::Version(v(TO))
        } else {
            NextBoot::Same
        };
        let mut w = World {
            talos: BTreeMap::new(),
            kube: BTreeMap::new(),
        };
        for n in ["w1", "w2"] {
            w.talos.insert(
                n.into(),
                TalosNode {
                    version: v(FROM),
                    boot_id: format!("{n}-1"),
                    stage: MachineStage::Running,
                    ready: true,
                    next_boot: next_boot.clone(),
                    unhealthy_services: vec![],
                },
            );
            w.kube.insert(
                n.into(),
                KubeNode {
                    ready: true,
                    kubelet_version: None,
                    unschedulable: false,
                    taints: vec![],
                    cordoned_by: None,
                },
            );
        }
        w
    }

    /// Node `n` rebooted by someone else into its staged target, running and ready.
    fn rebooted_into_target(&mut self, n: &str) {
        let node = self.talos.get_mut(n).unwrap();
        node.version = v(TO);
        node.boot_id = format!("{n}-2");
        node.next_boot = NextBoot::Same;
    }

    fn observe(&self, needs: &Needs) -> Observations {
        let missing = || ObsError {
            transient: false,
            message: "no such node".into(),
        };
        assert!(
            needs.etcd.is_none() && needs.gates.is_none() && needs.images.is_empty(),
            "nothing of a worker step without gates asks for these: {needs:?}"
        );
        Observations {
            talos: needs
                .talos
                .iter()
                .map(|n| {
                    let seen = self.talos.get(&n.node).cloned().ok_or_else(missing);
                    (n.node.clone(), seen)
                })
                .collect(),
            kube: needs
                .kube
                .iter()
                .map(|n| (n.clone(), self.kube.get(n).cloned().ok_or_else(missing)))
                .collect(),
            volumes: needs
                .volumes
                .iter()
                .map(|n| (n.clone(), Ok(vec![])))
                .collect(),
            nodes: needs.nodes.then(|| Ok(self.kube.clone())),
            ..Default::default()
        }
    }
}

/// One decision at `now`, as the executor makes it: rounds of [`step`] until it asks for
/// nothing more. With everything the rounds asked to observe.
fn decide(job: &Job, world: &World, now: Timestamp) -> (Transition, Needs) {
    let mut obs = Observations::default();
    let mut asked = Needs::default();
    for _ in 0..32 {
        let tr = step(job, &obs, now);
        if tr.missing.is_empty() {
            return (tr, asked);
        }
        asked.talos.extend(tr.missing.talos.iter().cloned());
        asked.kube.extend(tr.missing.kube.iter().cloned());
        asked.nodes |= tr.missing.nodes;
        obs.merge(world.observe(&tr.missing));
    }
    panic!("the decision keeps asking for observations")
}

fn command(next: &Next) -> &Command {
    match next {
        Next::Run(c) => c,
        other => panic!("expected a command, got {other:?}"),
    }
}

/// The command made and its outcome recorded, as the executor does.
fn answer(j: &Job, cmd: &Command, outcome: CommandOutcome, now: Timestamp) -> Job {
    let intended = intend(j, cmd, now);
    complete(&intended, &cmd.key, &outcome, now).0
}

fn node<'a>(j: &'a Job, name: &str) -> &'a NodeProgress {
    let StepKind::Talos(ts) = &j.steps[0].kind else {
        panic!("a Talos step")
    };
    ts.nodes.iter().find(|n| n.target.node == name).unwrap()
}

fn observed(asked: &Needs, name: &str) -> bool {
    asked.talos.iter().any(|n| n.node == name)
}

/// Issue #36: inside a window, every decision of a staging step looks at the staged nodes that
/// have not started (`stage_ahead` → `watch_staged`, at the top of the step), not only at
/// their turn: `w2`, staged and waiting for the second wave, is read while `w1` is cordoned,
/// and once someone reboots it, the very next decision records it, verifies it and marks it
/// done, while `w1` is still being drained.
#[test]
fn inside_a_window_a_staged_node_rebooted_externally_is_seen_at_the_next_decision() {
    let mut world = World::new(true);
    let now = t(INSIDE);
    let (tr, asked) = decide(&job(true, None), &world, now);
    let cordon = command(&tr.next);
    assert!(
        matches!(&cordon.action, Action::Cordon { node } if node == "w1"),
        "{cordon:?}"
    );
    assert!(
        observed(&asked, "w2"),
        "w2 is read though its turn is not due: {asked:?}"
    );
    assert!(matches!(
        node(&tr.job, "w2").staging,
        Some(Staging::Staged { .. })
    ));
    let j = answer(&tr.job, cordon, CommandOutcome::Done, now);

    world.rebooted_into_target("w2");
    let seen = later(now, 60);
    let (tr, _) = decide(&j, &world, seen);
    let drain = command(&tr.next);
    assert!(
        matches!(&drain.action, Action::Drain { node, .. } if node == "w1"),
        "{drain:?}"
    );
    let w2 = node(&tr.job, "w2");
    assert!(
        matches!(&w2.staging, Some(Staging::RebootedExternally { staged_boot_id, at }) if staged_boot_id == "w2-1" && *at == seen),
        "{:?}",
        w2.staging
    );
    assert_eq!(
        w2.phase,
        NodePhase::Done,
        "verified on {TO}, never upgraded"
    );
    assert_eq!(node(&tr.job, "w1").phase, NodePhase::Cordoned);
    assert!(
        tr.notes
            .iter()
            .any(|n| n.contains("w2: rebooted outside medea")),
        "{:?}",
        tr.notes
    );
}

/// Issue #36, the exception: a decision that finds a command journaled without an outcome
/// resolves it first, and while that cannot be resolved yet it polls without deciding, so a
/// staged node is not watched then. Here `w1` (left to the window: it could not be observed
/// when staging) has an upgrade in flight whose reply was lost and is still installing; `w2`'s
/// reboot meanwhile is seen at the first decision after the upgrade is resolved.
#[test]
fn a_command_without_an_outcome_that_cannot_be_resolved_yet_holds_the_watch() {
    let mut world = World::new(true);
    let now = t(INSIDE);
    let mut j = job(true, None);
    {
        let w1 = node_mut(&mut j, 0, 0);
        w1.staging = Some(Staging::InWindow {
            why: "could not be observed when staging".into(),
        });
        w1.enter(NodePhase::Detached, now);
    }
    world.talos.get_mut("w1").unwrap().next_boot = NextBoot::Same;
    let (tr, _) = decide(&j, &world, now);
    let upgrade = command(&tr.next).clone();
    assert!(
        matches!(&upgrade.action, Action::Upgrade { node, .. } if node.node == "w1"),
        "{upgrade:?}"
    );
    // the call is made, its reply lost: still in flight, the node installing
    let j = intend(&tr.job, &upgrade, now);
    world.talos.get_mut("w1").unwrap().stage = MachineStage::Installing;
    world.rebooted_into_target("w2");
    let (tr, asked) = decide(&j, &world, later(now, 30));
    assert!(
        matches!(&tr.next, Next::Poll { why: PollWhy::Waiting, reason, .. } if reason.contains("w1")),
        "{:?}",
        tr.next
    );
    assert!(!observed(&asked, "w2"), "{asked:?}");
    assert!(matches!(
        node(&tr.job, "w2").staging,
        Some(Staging::Staged { .. })
    ));
    // the install is done (the target is w1's next boot): resolved, and the same decision
    // goes on, sees w2 and reboots w1
    let w1 = world.talos.get_mut("w1").unwrap();
    w1.stage = MachineStage::Running;
    w1.next_boot = NextBoot::Version(v(TO));
    let resolved = later(now, 90);
    let (tr, _) = decide(&tr.job, &world, resolved);
    let reboot = command(&tr.next);
    assert!(
        matches!(&reboot.action, Action::Reboot { node, .. } if node.node == "w1"),
        "{reboot:?}"
    );
    assert!(
        matches!(&node(&tr.job, "w2").staging, Some(Staging::RebootedExternally { at, .. }) if *at == resolved),
        "{:?}",
        node(&tr.job, "w2").staging
    );
    assert_eq!(node(&tr.job, "w2").phase, NodePhase::Done);
}

/// Issue #48 item 7: a node's services that were already unhealthy before its upgrade (an
/// extension service failing all along) do not hold it "not back" afterwards; the comparison
/// was recorded only at the node's checks, so a staged node rebooted outside medea before its
/// turn was compared with nothing, its old failing service held it and the job halted at the
/// health timeout. The comparison is recorded when the node is staged.
#[test]
fn a_staged_node_rebooted_externally_keeps_its_pre_upgrade_service_comparison() {
    let mut world = World::new(false);
    for n in ["w1", "w2"] {
        world.talos.get_mut(n).unwrap().unhealthy_services = vec!["ext-iscsid".into()];
    }
    let mut j = job(true, None);
    for i in 0..2 {
        node_mut(&mut j, 0, i).staging = None;
    }
    // outside the window: both installed ahead, then verified staged
    let now = t(OUTSIDE);
    let (tr, _) = decide(&j, &world, now);
    let stage = command(&tr.next).clone();
    let Action::Stage { nodes } = &stage.action else {
        panic!("{stage:?}")
    };
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    let results = vec![
        ("w1".to_string(), StageResult::Installed),
        ("w2".to_string(), StageResult::Installed),
    ];
    let j = answer(&tr.job, &stage, CommandOutcome::Staged { results }, now);
    for n in ["w1", "w2"] {
        world.talos.get_mut(n).unwrap().next_boot = NextBoot::Version(v(TO));
    }
    let (tr, _) = decide(&j, &world, later(now, 60));
    assert!(
        matches!(node(&tr.job, "w2").staging, Some(Staging::Staged { .. })),
        "{:?}",
        node(&tr.job, "w2").staging
    );
    // w2 rebooted by someone else into the target; its extension service still fails
    world.rebooted_into_target("w2");
    let (tr, _) = decide(&tr.job, &world, t(INSIDE));
    let w2 = node(&tr.job, "w2");
    assert!(
        matches!(&w2.staging, Some(Staging::RebootedExternally { .. })),
        "{:?}",
        w2.staging
    );
    assert_eq!(
        w2.phase,
        NodePhase::Done,
        "the service failed before the upgrade too: {:?}",
        tr.next
    );
    // a service that was healthy before still holds it
    world.talos.get_mut("w2").unwrap().unhealthy_services =
        vec!["ext-iscsid".into(), "kubelet".into()];
    let (held, _) = decide(&j_with_staged_reboot(&tr.job), &world, t(INSIDE));
    assert_ne!(node(&held.job, "w2").phase, NodePhase::Done);
}

/// `j` with node `w2` back to its state right after it was seen rebooted outside medea.
fn j_with_staged_reboot(j: &Job) -> Job {
    let mut j = j.clone();
    node_mut(&mut j, 0, 1).enter(NodePhase::Pending, t(INSIDE));
    j
}

fn hook(name: &str) -> Hook {
    Hook {
        name: name.into(),
        timeout: Duration::from_secs(60),
        idempotent: false,
        action: HookAction::Http {
            url: "https://hooks.example/medea".into(),
            credential: None,
        },
    }
}

fn before_wave(name: &str) -> Hooks {
    Hooks {
        before_wave: vec![hook(name)],
        ..Hooks::default()
    }
}

/// Issue #35: outside the maintenance windows a wave fires no `beforeWave` hook (and counts
/// no budget): the decision waits for the window. Inside it the hook runs first, then the
/// wave's first node moves.
#[test]
fn before_wave_hooks_wait_for_the_window_then_run_before_the_first_node() {
    let world = World::new(false);
    let j = job(false, Some(before_wave("noout")));
    let (tr, asked) = decide(&j, &world, t(OUTSIDE));
    assert!(
        matches!(&tr.next, Next::WaitUntil { at, reason } if *at == t(OPENS) && reason.contains("outside the maintenance windows")),
        "{:?}",
        tr.next
    );
    assert!(tr.job.hook_runs.is_empty(), "{:?}", tr.job.hook_runs);
    assert!(!asked.nodes, "no budget counted outside the window");
    assert!(talos_of(&tr.job, 0).budget.is_none());

    let now = t(INSIDE);
    let (tr, _) = decide(&tr.job, &world, now);
    let h = command(&tr.next);
    assert!(
        matches!(&h.action, Action::Hook { site, .. } if site == "0/beforeWave/wave-1/noout"),
        "{h:?}"
    );
    assert_eq!(node(&tr.job, "w1").phase, NodePhase::Pending);
    let report = CommandOutcome::Hook {
        report: HookReport {
            succeeded: true,
            detail: "HTTP 204".into(),
            exit_code: None,
            log_tail: None,
        },
    };
    let j = answer(&tr.job, h, report, now);
    let (tr, _) = decide(&j, &world, later(now, 5));
    let pull = command(&tr.next);
    assert!(
        matches!(&pull.action, Action::Pull { node, .. } if node.node == "w1"),
        "{pull:?}"
    );
}

/// Issue #35, with exclusions: a wave every member of which a maintenance exclusion holds
/// fires no `beforeWave` hook either; it waits until the exclusion ends (inside a window).
#[test]
fn before_wave_hooks_wait_for_an_exclusion_holding_the_whole_wave() {
    let world = World::new(false);
    let mut j = job(false, Some(before_wave("noout")));
    let until = t("2026-12-06T02:30:00Z");
    j.exclusions = vec![
        Exclusion::new(
            "freeze",
            t("2026-12-01T00:00:00Z"),
            until,
            ExclusionScope::NoUpgrades,
        )
        .unwrap(),
    ];
    let (tr, _) = decide(&j, &world, t(INSIDE));
    assert!(
        matches!(&tr.next, Next::WaitUntil { at, reason } if *at == until && reason.contains("`freeze`")),
        "{:?}",
        tr.next
    );
    assert!(tr.job.hook_runs.is_empty(), "{:?}", tr.job.hook_runs);
    let (tr, _) = decide(&tr.job, &world, until);
    assert!(
        matches!(&command(&tr.next).action, Action::Hook { site, .. } if site == "0/beforeWave/wave-1/noout"),
        "{:?}",
        tr.next
    );
}

/// Issue #35: a wave's budget is counted only once it may start. Outside the window, with the
/// next wave's `w2` NotReady (a budget of 0 for `w1`'s wave), the job waits for the window
/// however long that is; it used to count the budget at once and halt `pool_unavailable` after
/// the pool's health timeout, before the window opened.
#[test]
fn a_wave_without_budget_outside_the_window_waits_for_the_window_not_the_health_timeout() {
    let mut world = World::new(false);
    world.kube.get_mut("w2").unwrap().ready = false;
    let j = job(false, None);
    let (tr, asked) = decide(&j, &world, t(OUTSIDE));
    assert!(
        matches!(&tr.next, Next::WaitUntil { at, .. } if *at == t(OPENS)),
        "{:?}",
        tr.next
    );
    assert!(!asked.nodes);
    // past the pool's health timeout (15m), still before the window
    let (tr, _) = decide(&tr.job, &world, later(t(OUTSIDE), 3600));
    assert!(
        matches!(&tr.next, Next::WaitUntil { at, .. } if *at == t(OPENS)),
        "{:?}",
        tr.next
    );
    assert!(
        matches!(tr.job.state, JobState::Running),
        "{:?}",
        tr.job.state
    );
    // in the window the budget is counted: 0 slots, w2 named
    let (tr, asked) = decide(&tr.job, &world, t(INSIDE));
    assert!(asked.nodes);
    assert!(
        matches!(&tr.next, Next::Poll { reason, .. } if reason.contains("w2")),
        "{:?}",
        tr.next
    );
}

/// Issue #51: a job approved hours before its window has not started; its clock starts with
/// its first command inside the window. Time before that never counts against the prediction.
#[test]
fn a_job_waiting_for_its_first_window_has_not_started_its_clock() {
    let world = World::new(false);
    let j = job(false, None);
    let (tr, _) = decide(&j, &world, t(OUTSIDE));
    assert!(
        matches!(&tr.next, Next::WaitUntil { at, .. } if *at == t(OPENS)),
        "{:?}",
        tr.next
    );
    assert_eq!(tr.job.clock.at(t(OUTSIDE)), ClockReading::NotStarted);
    let predicted = crate::plan::estimate::Bounds {
        median_secs: 60,
        pessimistic_secs: 90,
    };
    // 14 hours after approval and far past a 90 s bound: not late, it has not started
    assert_eq!(tr.job.clock.overdue_in(predicted, t(OPENS)), None);
    let (tr, _) = decide(&tr.job, &world, t(INSIDE));
    let cmd = command(&tr.next).clone();
    let j = intend(&tr.job, &cmd, t(INSIDE));
    assert_eq!(j.clock.started_at, Some(t(INSIDE)));
    assert_eq!(
        j.clock.at(later(t(INSIDE), 60)),
        ClockReading::Running {
            active: Duration::from_secs(60)
        }
    );
}

/// Issue #51, with staging: the nodes were installed ahead at 11:30 (the clock started
/// then); waiting for the window from noon stands the clock still, and it runs again when the
/// first reboot is journaled inside the window. The wait is journaled as a change of the job
/// (the executor writes it), so a restart keeps it.
#[test]
fn a_staged_job_waiting_for_its_window_stands_its_clock_still() {
    let world = World::new(true);
    let mut j = job(true, None);
    j.clock.started_at = Some(t("2026-12-05T11:30:00Z"));
    let (tr, _) = decide(&j, &world, t(OUTSIDE));
    assert!(
        matches!(&tr.next, Next::WaitUntil { at, .. } if *at == t(OPENS)),
        "{:?}",
        tr.next
    );
    assert!(tr.changed(&j), "the pause is a change to journal");
    assert_eq!(
        tr.job.clock.at(t(OPENS)),
        ClockReading::Paused {
            active: Duration::from_secs(30 * 60),
            since: t(OUTSIDE)
        }
    );
    // a decision while still waiting changes nothing more
    let (again, _) = decide(&tr.job, &world, later(t(OUTSIDE), 3600));
    assert!(!again.changed(&tr.job));
    let (tr, _) = decide(&again.job, &world, t(INSIDE));
    // the first node's turn inside the window (its cordon, then its reboot)
    let first = command(&tr.next).clone();
    assert!(
        matches!(&first.action, Action::Cordon { node } if node == "w1"),
        "{first:?}"
    );
    let j = intend(&tr.job, &first, t(INSIDE));
    assert_eq!(j.clock.paused_since, None);
    assert_eq!(
        j.clock.at(later(t(INSIDE), 120)),
        ClockReading::Running {
            active: Duration::from_secs(30 * 60 + 120)
        }
    );
}

/// Issue #51: a soak or a drain retry is work; only the calendar stands the clock still.
#[test]
fn waiting_inside_the_window_keeps_the_clock_running() {
    let world = World::new(false);
    let mut j = job(false, None);
    j.clock.started_at = Some(t(OPENS));
    {
        let w1 = node_mut(&mut j, 0, 0);
        w1.enter(NodePhase::Cordoned, t(OPENS));
        w1.not_before = Some(later(t(INSIDE), 10));
        w1.blocked = Some("PodDisruptionBudget `db`".into());
        // the next wave's image is on its node already: nothing to pull ahead meanwhile
        node_mut(&mut j, 0, 1).pulled_ahead = Some(PullAhead::Pulled);
    }
    let (tr, _) = decide(&j, &world, t(INSIDE));
    assert!(
        matches!(&tr.next, Next::WaitUntil { reason, .. } if reason.contains("drain blocked")),
        "{:?}",
        tr.next
    );
    assert_eq!(tr.job.clock.paused_since, None);
}

/// Issue #51 (the staged-install-in-an-exclusion rule, issue #36): an install ahead is held by a
/// maintenance exclusion like an upgrade. Outside the window, with `rollout.stage: ahead` and
/// an exclusion holding upgrades until 14:00, nothing is staged: the job waits until the
/// exclusion ends (its clock standing still), then stages both nodes, still outside the window.
#[test]
fn an_exclusion_holds_the_install_ahead_like_an_upgrade() {
    let world = World::new(false);
    let mut j = job(true, None);
    for i in 0..2 {
        node_mut(&mut j, 0, i).staging = None;
    }
    let until = t("2026-12-05T14:00:00Z");
    j.exclusions = vec![
        Exclusion::new(
            "freeze",
            t("2026-12-01T00:00:00Z"),
            until,
            ExclusionScope::NoUpgrades,
        )
        .unwrap(),
    ];
    let (tr, _) = decide(&j, &world, t(OUTSIDE));
    assert!(
        matches!(&tr.next, Next::WaitUntil { at, reason } if *at == until && reason.contains("`freeze`")),
        "{:?}",
        tr.next
    );
    assert!(
        ["w1", "w2"]
            .iter()
            .all(|n| node(&tr.job, n).staging.is_none()),
        "nothing staged inside the exclusion"
    );
    let (tr, _) = decide(&tr.job, &world, until);
    let stage = command(&tr.next);
    assert!(
        matches!(&stage.action, Action::Stage { nodes, .. } if nodes.len() == 2),
        "{stage:?}"
    );
}
