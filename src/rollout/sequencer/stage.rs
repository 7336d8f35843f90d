//! Installs ahead of the maintenance windows (`rollout.stage: ahead`, issue #36): when the job
//! reaches a staging Talos step, every node that can (Talos >= 1.13, a bootloader that reports
//! its next boot) pulls its installer and installs it without a reboot, a batch of at most the
//! step's stage parallelism at a time, windows or not (exclusions hold it like an upgrade).
//! A node is *staged* once medea has seen its default boot entry name the target. Inside a
//! window a staged node is cordoned, drained and rebooted as before, without a second install.
//!
//! A staged node rebooted by anyone else boots the target: medea notices the new boot id (in
//! every decision of the step until the node starts, windows or not; then at its turn), records it,
//! verifies the node like one of its own reboots (target version, running and ready, services,
//! Kubernetes Ready) within the health timeout, and marks it done without installing again;
//! a node that does not come back right halts the job, naming it.
//!
//! At most once: a batch is one journaled command ([`Action::Stage`]); an install whose outcome
//! was lost is resolved per node by observation ([`resolve_stage`]): its next boot is the
//! target → installed; its next boot is still what it runs, same boot → no effect, installed
//! again later; anything else waits or halts. Only nodes whose next boot can be read are
//! staged, so the resolution never has to guess.

use super::*;

/// The staging of step `si` before its windowed node cycle: `Some` while something of it is
/// left to do (a batch to install, an install to verify, a staged node seen rebooted to
/// verify), `None` once every node is staged or left to the window.
pub(super) fn stage_ahead(
    j: &mut Job,
    si: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Option<Flow> {
    let ts = talos_of(j, si);
    ts.rollout.stage.as_ref()?;
    // a staged node seen rebooted outside medea: recorded, then verified
    if let Some(f) = watch_staged(j, si, eyes, now, notes) {
        return Some(f);
    }
    let ts = talos_of(j, si);
    let to = ts.rollout.to.clone();
    let undecided: Vec<usize> = (0..ts.nodes.len())
        .filter(|&i| {
            let n = &ts.nodes[i];
            n.phase == NodePhase::Pending
                && matches!(n.staging, None | Some(Staging::Installed { .. }))
        })
        .collect();
    if undecided.is_empty() {
        return None;
    }
    // on the control plane the etcd snapshot comes before any change, a staged install too
    if ts.control_plane() && j.snapshot.is_none() {
        let Some(via) = j.control_plane.first().cloned() else {
            return Some(halt_flow(
                HaltCode::NoSnapshotNode,
                "no control-plane node is known to take the etcd snapshot from".into(),
                None,
                Some(CommandOp::Snapshot),
            ));
        };
        return Some(Flow::Run(Box::new(snapshot_command(j, si, via))));
    }
    let mut batch: Vec<StageNode> = Vec::new();
    let mut polls: Vec<(PollWhy, String)> = Vec::new();
    let mut waits: Vec<(Timestamp, String)> = Vec::new();
    let parallelism = talos_of(j, si).rollout.stage_parallelism().max(1);
    for i in undecided {
        let n = talos_of(j, si).nodes[i].clone();
        let name = n.target.node.clone();
        let target = n.node_target();
        if let Some(Staging::Installed { boot_id }) = &n.staging {
            // installed: verified before it counts as staged
            match eyes.talos(&target) {
                Seen::Missing => polls.push((PollWhy::Waiting, format!("observing `{name}`"))),
                Seen::Transient(m) => {
                    polls.push((PollWhy::Unreachable, format!("{name}: unreachable ({m})")));
                }
                Seen::Failed(m) => {
                    return Some(read_failed(
                        &format!("node `{name}`"),
                        m,
                        Some(&name),
                        Some(CommandOp::Stage),
                    ));
                }
                Seen::Got(t) if &t.boot_id != boot_id => {
                    let staged_boot_id = boot_id.clone();
                    rebooted_externally(j, si, i, staged_boot_id, now, notes);
                    return Some(Flow::Poll(
                        PollWhy::Waiting,
                        format!("{name}: rebooted outside medea after its install"),
                    ));
                }
                Seen::Got(t) if t.next_boot == NextBoot::Version(to.clone()) => {
                    node_mut(j, si, i).staging = Some(Staging::Staged {
                        boot_id: boot_id.clone(),
                        at: now,
                    });
                    notes.push(format!(
                        "{name}: staged: its default boot entry is {to}; it runs {} until its reboot",
                        t.version
                    ));
                }
                Seen::Got(t) => {
                    return Some(halt_flow(
                        HaltCode::UnexpectedVersion,
                        format!(
                            "the install ahead on `{name}` came back done, but its next boot is {} instead of {to}; check the node and plan again",
                            next_boot_text(&t.next_boot)
                        ),
                        Some(&name),
                        Some(CommandOp::Stage),
                    ));
                }
            }
            continue;
        }
        if batch.len() >= parallelism {
            continue;
        }
        let ts = talos_of(j, si);
        if !ts.rollout.stages(&n.target) {
            node_mut(j, si, i).staging = Some(Staging::InWindow {
                why: format!(
                    "runs {} (Talos < 1.13 installs only by rebooting)",
                    n.target.from
                ),
            });
            notes.push(format!(
                "{name}: not staged (runs {}, below Talos 1.13): upgrades in the window",
                n.target.from
            ));
            continue;
        }
        if let Err(f) = exclusion_gate(j, Change::talos(&n.target.from, &to), now) {
            match f {
                Flow::Wait(at, r) => waits.push((at, r)),
                f => return Some(f),
            }
            continue;
        }
        let t = match eyes.talos(&target) {
            Seen::Missing => {
                polls.push((PollWhy::Waiting, format!("observing `{name}`")));
                continue;
            }
            Seen::Transient(m) | Seen::Failed(m) => {
                let why = format!("could not be observed when staging ({m})");
                notes.push(format!("{name}: not staged, {why}: upgrades in the window"));
                node_mut(j, si, i).staging = Some(Staging::InWindow { why });
                continue;
            }
            Seen::Got(t) => t,
        };
        if t.version == to {
            node_mut(j, si, i).staging = Some(Staging::InWindow {
                why: format!("already runs {to}"),
            });
            notes.push(format!("{name}: already runs {to}, nothing to stage"));
            continue;
        }
        if t.version != n.target.from {
            return Some(halt_flow(
                HaltCode::UnexpectedVersion,
                format!(
                    "node `{name}` runs {}, but the plan expected {}: something else changed it; plan again",
                    t.version, n.target.from
                ),
                Some(&name),
                Some(CommandOp::Stage),
            ));
        }
        match &t.next_boot {
            NextBoot::Unknown => {
                let why = "its bootloader does not report its next boot (GRUB): an install \
                           ahead could not be verified"
                    .to_string();
                notes.push(format!("{name}: not staged, {why}; upgrades in the window"));
                node_mut(j, si, i).staging = Some(Staging::InWindow { why });
                continue;
            }
            NextBoot::Version(v) if *v == to => {
                // staged already (a batch whose result was lost, then resolved)
                node_mut(j, si, i).staging = Some(Staging::Staged {
                    boot_id: t.boot_id.clone(),
                    at: now,
                });
                notes.push(format!("{name}: staged: its default boot entry is {to}"));
                continue;
            }
            NextBoot::Version(v) => {
                return Some(halt_flow(
                    HaltCode::UnexpectedVersion,
                    format!(
                        "node `{name}` has {v} staged for its next boot, not {to}: something else installed it, and an install now would delete the entry it runs; roll its boot entry back (`talosctl rollback`) or reboot it, then plan again"
                    ),
                    Some(&name),
                    Some(CommandOp::Stage),
                ));
            }
            NextBoot::Same => {}
        }
        if t.stage != MachineStage::Running {
            polls.push((
                PollWhy::Waiting,
                format!("{name}: is {}, staged once it runs", t.stage.name()),
            ));
            continue;
        }
        let image = ts.rollout.image_for(&n.target).to_string();
        // the pre-upgrade service comparison: a staged node may reboot into the target
        // outside medea before its turn's checks record it (`verify_external`)
        node_mut(j, si, i).services_unhealthy_before = t.unhealthy_services.clone();
        batch.push(StageNode {
            node: target,
            image,
            boot_id_before: t.boot_id.clone(),
        });
    }
    if !batch.is_empty() {
        let ts = talos_of(j, si);
        return Some(Flow::Run(Box::new(Command {
            key: key(j, si, None, CommandOp::Stage, ts.stage_batches),
            action: Action::Stage { nodes: batch },
        })));
    }
    if let Some((w, r)) = polls
        .iter()
        .find(|(w, _)| *w == PollWhy::Unreachable)
        .or(polls.first())
        .cloned()
    {
        return Some(Flow::Poll(w, r));
    }
    if let Some((at, r)) = waits.into_iter().min_by_key(|(at, _)| *at) {
        return Some(Flow::Wait(at, format!("staging: {r}")));
    }
    // decided in this pass: go on deciding (the node cycle, or the next round of staging)
    let left = talos_of(j, si).nodes.iter().any(|n| {
        n.phase == NodePhase::Pending && matches!(n.staging, None | Some(Staging::Installed { .. }))
    });
    left.then(|| stage_ahead(j, si, eyes, now, notes)).flatten()
}

/// Staged nodes that have not started their window cycle: one seen rebooted (a new boot id) is
/// recorded and verified ([`verify_external`]). Called by [`stage_ahead`] at the top of every
/// decision of the step — while it stages, while it waits outside the windows and inside a
/// window alike — so each costs a Talos read per such node. A node that has started is looked
/// at by its own phases instead ([`noticed_at_turn`] at its checks, [`staged_install`]).
fn watch_staged(
    j: &mut Job,
    si: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Option<Flow> {
    let ts = talos_of(j, si);
    ts.rollout.stage.as_ref()?;
    let watched: Vec<usize> = (0..ts.nodes.len())
        .filter(|&i| {
            let n = &ts.nodes[i];
            n.phase == NodePhase::Pending
                && matches!(
                    n.staging,
                    Some(Staging::Staged { .. } | Staging::RebootedExternally { .. })
                )
        })
        .collect();
    let mut polls: Vec<(PollWhy, String)> = Vec::new();
    for i in watched {
        let n = talos_of(j, si).nodes[i].clone();
        if let Some(Staging::Staged { boot_id, .. }) = &n.staging {
            match eyes.talos(&n.node_target()) {
                // an unreachable staged node: its turn (or the next look) tells
                Seen::Missing => {
                    polls.push((PollWhy::Waiting, format!("observing `{}`", n.target.node)));
                    continue;
                }
                Seen::Transient(_) | Seen::Failed(_) => continue,
                Seen::Got(t) if &t.boot_id == boot_id && !t.stage.in_transition() => continue,
                Seen::Got(_) => {
                    rebooted_externally(j, si, i, boot_id.clone(), now, notes);
                }
            }
        }
        match verify_external(j, si, i, eyes, now, notes) {
            Flow::Done => {}
            f @ (Flow::Halt { .. } | Flow::Run(_)) => return Some(f),
            Flow::Poll(w, r) => polls.push((w, r)),
            Flow::Wait(at, r) => return Some(Flow::Wait(at, r)),
        }
    }
    polls
        .iter()
        .find(|(w, _)| *w == PollWhy::Unreachable)
        .or(polls.first())
        .cloned()
        .map(|(w, r)| Flow::Poll(w, r))
}

/// Record that staged node `i` rebooted outside medea's step (the event and webhook
/// `rollout.node_rebooted_externally` come from this record).
fn rebooted_externally(
    j: &mut Job,
    si: usize,
    i: usize,
    staged_boot_id: String,
    now: Timestamp,
    notes: &mut Vec<String>,
) {
    let to = talos_of(j, si).rollout.to.clone();
    let n = node_mut(j, si, i);
    notes.push(format!(
        "{}: rebooted outside medea after its install ahead (new boot id): it boots {to}; verifying it, it is not upgraded again",
        n.target.node
    ));
    n.staging = Some(Staging::RebootedExternally {
        staged_boot_id: staged_boot_id.clone(),
        at: now,
    });
    n.boot_id_before = Some(staged_boot_id);
    // not cordoned by medea: never uncordoned by it
    n.enter(NodePhase::Pending, now);
}

/// A staged node that rebooted outside medea: back on the target, running and ready, services
/// healthy, Kubernetes Ready within the health timeout from when medea saw it → done, without
/// another install; otherwise the halt names it.
pub(super) fn verify_external(
    j: &mut Job,
    si: usize,
    i: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Flow {
    let v = NodeView::of(j, si, i, now);
    match verify_back(j, &v, Direction::Upgrade, eyes) {
        Ok(()) => {
            node_mut(j, si, i).enter(NodePhase::Done, now);
            notes.push(format!(
                "{}: rebooted outside medea onto {}, healthy and Ready: done, not upgraded again",
                v.name, v.to
            ));
            Flow::Done
        }
        Err(Flow::Halt { reason, node, op }) => Flow::Halt {
            reason: HaltReason::new(
                reason.code(),
                format!(
                    "staged node `{}` was rebooted outside medea: {reason}",
                    v.name
                ),
            ),
            node,
            op,
        },
        Err(f) => f,
    }
}

/// At a staged node's turn in the window (its checks): a boot id other than the one it was
/// staged in means it rebooted outside medea; it goes to [`verify_external`] instead of its
/// cordon. `true` when that is the case.
pub(super) fn noticed_at_turn(
    j: &mut Job,
    si: usize,
    i: usize,
    t: &TalosNode,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> bool {
    match &talos_of(j, si).nodes[i].staging {
        Some(Staging::Staged { boot_id, .. }) if &t.boot_id != boot_id => {
            let boot_id = boot_id.clone();
            rebooted_externally(j, si, i, boot_id, now, notes);
            true
        }
        _ => false,
    }
}

/// `Detached` for a staged node: its install is already the default boot entry, so there is
/// no second install: verified (still its old version, same boot, next boot the target, etcd
/// healthy on the control plane), then `Upgraded` and the reboot. A node that rebooted since
/// its staging (while medea drained it) goes to `Rebooting`, verified like medea's own reboot.
/// `None`: the node was not staged.
pub(super) fn staged_install(
    j: &mut Job,
    v: &NodeView,
    t: &TalosNode,
    eyes: &Eyes,
    notes: &mut Vec<String>,
) -> Option<Result<(), Flow>> {
    let (si, i, now) = (v.si, v.i, v.now);
    let Some(Staging::Staged { boot_id, .. }) = talos_of(j, si).nodes[i].staging.clone() else {
        return None;
    };
    let name = &v.name;
    if t.boot_id != boot_id {
        notes.push(format!(
            "{name}: rebooted outside medea after its install ahead, while cordoned: verifying it on {}",
            v.to
        ));
        let n = node_mut(j, si, i);
        n.boot_id_before = Some(boot_id);
        n.enter(NodePhase::Rebooting, now);
        return Some(Ok(()));
    }
    if t.version != v.from {
        return Some(Err(v.unexpected(
            format!(
                "node `{name}` runs {} before its reboot, expected {}",
                t.version, v.from
            ),
            Some(CommandOp::Reboot),
        )));
    }
    if v.cp
        && let Err(f) = etcd_healthy(
            j,
            v,
            eyes,
            &format!("rebooting `{name}`"),
            Some(CommandOp::Reboot),
        )
    {
        return Some(Err(f));
    }
    if t.next_boot != NextBoot::Version(v.to.clone()) {
        return Some(Err(halt_flow(
            HaltCode::UnexpectedVersion,
            format!(
                "node `{name}` was staged for {}, but its next boot is now {}: something changed it since; plan again",
                v.to,
                next_boot_text(&t.next_boot)
            ),
            v.nd(),
            Some(CommandOp::Reboot),
        )));
    }
    let n = node_mut(j, si, i);
    n.boot_id_before = Some(t.boot_id.clone());
    n.method = Some(UpgradeMethod::Lifecycle);
    n.enter(NodePhase::Upgraded, now);
    notes.push(format!(
        "{name}: installed ahead, its next boot is {}: no install in the window, rebooting",
        v.to
    ));
    Some(Ok(()))
}

/// The node's next boot, in words.
pub fn next_boot_text(b: &NextBoot) -> String {
    match b {
        NextBoot::Same => "its running version".into(),
        NextBoot::Version(v) => v.to_string(),
        NextBoot::Unknown => "unknown".into(),
    }
}

/// A `Stage` batch journaled without an outcome (a crash, a lost reply), resolved node by node
/// from fresh observations: the next boot names the target → installed; still the running
/// version with the same boot id → no effect (installed again by a later batch); a reboot
/// since → taken as installed (verification finds out); installing or rebooting → wait;
/// anything else → halt. Never an install on a guess.
pub(super) fn resolve_stage(
    j: &Job,
    intent: &Intent,
    nodes: &[StageNode],
    eyes: &Eyes,
) -> Resolution {
    let Some(StepKind::Talos(ts)) = j.steps.get(intent.key.step).map(|s| &s.kind) else {
        return Resolution::Halt(HaltReason::new(
            HaltCode::Inconsistent,
            "an install-ahead intent outside a Talos step",
        ));
    };
    let to = &ts.rollout.to;
    let mut results = Vec::new();
    let mut pending = None;
    for s in nodes {
        let name = &s.node.node;
        let t = match eyes.talos(&s.node) {
            Seen::Got(t) => t,
            Seen::Missing => {
                pending.get_or_insert((PollWhy::Waiting, format!("observing `{name}`")));
                continue;
            }
            Seen::Transient(m) => {
                pending.get_or_insert((
                    PollWhy::Unreachable,
                    format!("cannot observe `{name}` yet ({m})"),
                ));
                continue;
            }
            Seen::Failed(m) => {
                return Resolution::Halt(HaltReason::new(
                    HaltCode::ObservationFailed,
                    format!("cannot read node `{name}`: {m}"),
                ));
            }
        };
        let result = if t.boot_id != s.boot_id_before
            || &t.version == to
            || t.next_boot == NextBoot::Version(to.clone())
        {
            StageResult::Installed
        } else if t.stage.in_transition() {
            pending.get_or_insert((PollWhy::Waiting, format!("`{name}` is {:?}", t.stage)));
            continue;
        } else if progress_of(j, intent.key.step, name).is_some_and(|n| installing_now(n, t)) {
            // it said an install is running there: never installed again in this boot
            pending.get_or_insert((PollWhy::Waiting, still_installing(name)));
            continue;
        } else if t.next_boot == NextBoot::Same {
            StageResult::NoEffect
        } else if let NextBoot::Version(v) = &t.next_boot {
            return Resolution::Halt(HaltReason::new(
                HaltCode::UnexpectedVersion,
                format!("node `{name}` has {v} staged for its next boot, not {to}"),
            ));
        } else {
            return Resolution::Halt(HaltReason::new(
                HaltCode::OutcomeUnknown,
                format!(
                    "cannot tell whether the install ahead on `{name}` ran (the node does not report its next boot); check the node and plan again"
                ),
            ));
        };
        results.push((name.clone(), result));
    }
    if let Some((w, r)) = pending {
        return Resolution::Pending(w, r);
    }
    Resolution::Done {
        outcome: CommandOutcome::Staged { results },
        rebooted: false,
    }
}

/// The outcome of a `Stage` batch: installed nodes are verified at the next decision, a node
/// without effect is installed again by a later batch, a failure the node answered counts
/// against `rollout.upgradeAttempts` (the bound halts, naming it); an open outcome keeps the
/// batch in flight to be resolved by observation.
pub(super) fn staged_outcome(
    j: &mut Job,
    intent: &Intent,
    outcome: &CommandOutcome,
    now: Timestamp,
    notes: &mut Vec<String>,
) {
    let key = &intent.key;
    let results = match outcome {
        CommandOutcome::Staged { results } => results,
        CommandOutcome::Transient { error } | CommandOutcome::Installing { error } => {
            if let Some(i) = j.in_flight.as_mut() {
                i.last_error = Some(error.clone());
            }
            notes.push(format!("{key}: outcome unknown ({error}); will observe"));
            return;
        }
        other => {
            let error = match other {
                CommandOutcome::Failed { error, .. } => error.clone(),
                o => format!("unexpected outcome {o:?}"),
            };
            let reason = HaltReason::new(
                HaltCode::CommandFailed,
                format!("install ahead failed: {error}"),
            );
            notes.push(format!("halted: {reason}"));
            *j = halt(j, reason, now);
            return;
        }
    };
    // a node busy with an earlier install of the batch stays *installing* (issue #48)
    if let Action::Stage { nodes } = &intent.action {
        for (name, r) in results {
            if matches!(r, StageResult::Installing { .. })
                && let Some(s) = nodes.iter().find(|s| &s.node.node == name)
            {
                mark_installing(j, key.step, Some(name), &s.boot_id_before, notes);
            }
        }
    }
    if let Some((node, StageResult::Transient { error } | StageResult::Installing { error })) =
        results.iter().find(|(_, r)| {
            matches!(
                r,
                StageResult::Transient { .. } | StageResult::Installing { .. }
            )
        })
    {
        if let Some(i) = j.in_flight.as_mut() {
            i.last_error = Some(format!("{node}: {error}"));
        }
        notes.push(format!(
            "{key}: the install ahead on `{node}` has an unknown outcome ({error}); observing every node of the batch"
        ));
        return;
    }
    j.in_flight = None;
    let Some(StepKind::Talos(ts)) = j.steps.get_mut(key.step).map(|s| &mut s.kind) else {
        return;
    };
    ts.stage_batches += 1;
    let bound = ts.rollout.upgrade_attempts.max(1);
    let Action::Stage { nodes } = &intent.action else {
        return;
    };
    let halt_with = apply_stage_results(ts, nodes, results, bound, notes);
    if let Some((node, message)) = halt_with {
        let reason = HaltReason::new(HaltCode::UpgradeRefused, message);
        notes.push(format!("halted: {reason}"));
        j.state = JobState::Halted {
            reason,
            step: Some(key.step),
            node: Some(node),
            op: Some(CommandOp::Stage),
            at: now,
        };
    }
}

/// Record each node's answer to a `Stage` batch on the step's nodes; the first node whose
/// failures reach `bound` (`rollout.upgradeAttempts`) is returned with the halt message.
fn apply_stage_results(
    ts: &mut TalosStep,
    nodes: &[StageNode],
    results: &[(String, StageResult)],
    bound: u32,
    notes: &mut Vec<String>,
) -> Option<(String, String)> {
    let mut halt_with = None;
    for (name, result) in results {
        let Some(s) = nodes.iter().find(|s| &s.node.node == name) else {
            continue;
        };
        let Some(n) = ts.nodes.iter_mut().find(|n| &n.target.node == name) else {
            continue;
        };
        let n = Arc::make_mut(n);
        match result {
            StageResult::Installed => {
                n.staging = Some(Staging::Installed {
                    boot_id: s.boot_id_before.clone(),
                });
                notes.push(format!(
                    "{name}: installed ahead, without reboot; verifying its next boot"
                ));
            }
            StageResult::NoEffect => {
                notes.push(format!(
                    "{name}: the install ahead left no trace; it is installed again"
                ));
            }
            StageResult::Transient { .. } | StageResult::Installing { .. } => {}
            StageResult::Failed { error } => {
                n.upgrade_failures += 1;
                n.last_error = Some(error.clone());
                if n.upgrade_failures >= bound {
                    halt_with.get_or_insert((
                        name.clone(),
                        if bound > 1 {
                            format!(
                                "install ahead on `{name}` failed {bound} times (rollout.upgradeAttempts); the last: {error}"
                            )
                        } else {
                            format!("install ahead on `{name}` failed: {error}")
                        },
                    ));
                } else {
                    notes.push(format!(
                        "{name}: the node answered failure {} of {bound} to its install ahead ({error}); trying again",
                        n.upgrade_failures
                    ));
                }
            }
        }
    }
    halt_with
}

/// What a halted (or running) job's staged nodes will do: each node installed ahead that has
/// not rebooted into the target, with the version its next boot brings (for `rollout status`).
pub fn staged_not_rebooted(job: &Job) -> Vec<(String, crate::version::TalosVersion)> {
    let mut out = Vec::new();
    for s in &job.steps {
        if let StepKind::Talos(t) = &s.kind {
            for n in &t.nodes {
                let waiting = matches!(
                    n.phase,
                    NodePhase::Pending
                        | NodePhase::Checking
                        | NodePhase::Checked
                        | NodePhase::Pulled
                        | NodePhase::Cordoned
                        | NodePhase::Drained
                        | NodePhase::Detached
                        | NodePhase::Upgraded
                );
                if waiting && n.staging.as_ref().is_some_and(Staging::staged) {
                    out.push((n.target.node.clone(), t.rollout.to.clone()));
                }
            }
        }
    }
    out
}
