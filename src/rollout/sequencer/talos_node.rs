//! The Talos OS step: a pool's nodes, wave by wave, through check, snapshot, pull, cordon,
//! drain, upgrade, reboot, back and uncordon.

use super::*;
use crate::plan::health::OnFailure;

pub(super) fn talos_step(
    j: &mut Job,
    si: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Flow {
    // a failed gate with `onFailure: rollback`: roll the wave back, then halt
    if let Some(failure) = j.gates.failure.clone() {
        return rollback_wave(j, si, failure, eyes, now, notes);
    }
    let policy = step_policy(j, si);
    loop {
        let ts = talos_of(j, si);
        let waves = ts.nodes.iter().map(|n| n.wave + 1).max().unwrap_or(0);
        // the first wave that is not finished, or not soaked
        let mut current = None;
        for w in 0..waves {
            let members = ts.nodes.iter().filter(|n| n.wave == w);
            let finished = members.clone().all(|n| n.phase.finished());
            let upgraded = members.clone().any(|n| n.phase == NodePhase::Done);
            let soaked = policy.is_none()
                || !upgraded
                || j.gates.passed(&GatePoint::AfterWave { step: si, wave: w });
            if !finished || !soaked {
                current = Some((w, finished));
                break;
            }
        }
        let Some((wave, finished)) = current else {
            return Flow::Done;
        };
        if finished {
            // every node of the wave is done: the soak
            let Some(p) = policy.as_ref() else {
                unreachable!("a wave is unsoaked only under a policy")
            };
            let point = GatePoint::AfterWave { step: si, wave };
            match gate_point(j, point, p, p.soak, eyes, now, notes) {
                GateFlow::Passed => continue,
                GateFlow::Flow(f) => return f,
                GateFlow::Failed(f, OnFailure::Halt) => return gate_halt(f),
                GateFlow::Failed(f, OnFailure::Rollback) => {
                    return start_rollback(j, si, wave, f, eyes, now, notes);
                }
            }
        }
        let ts = talos_of(j, si);
        let members: Vec<usize> = (0..ts.nodes.len())
            .filter(|&i| ts.nodes[i].wave == wave && !ts.nodes[i].phase.finished())
            .collect();
        // before the wave starts: the pool's gates
        if let Some(p) = policy.as_ref()
            && members
                .iter()
                .all(|&i| ts.nodes[i].phase == NodePhase::Pending)
            && !j.gates.passed(&GatePoint::BeforeWave { step: si, wave })
        {
            let point = GatePoint::BeforeWave { step: si, wave };
            match gate_point(j, point, p, Duration::ZERO, eyes, now, notes) {
                GateFlow::Passed => {}
                GateFlow::Flow(f) => return f,
                GateFlow::Failed(f, _) => return gate_halt(f),
            }
        }
        let mut runs: Vec<(NodePhase, usize, Box<Command>)> = Vec::new();
        let mut polls: Vec<(PollWhy, String)> = Vec::new();
        let mut waits: Vec<(Timestamp, String)> = Vec::new();
        // Members in lockstep order. Every member medea is waiting on (rebooting, between
        // commands) is looked at in every decision: a failure there halts before anything else
        // happens. A member whose next move is a check before a command of its own
        // (`NodePhase::checked_at_its_turn`) is looked at only until a member has a command
        // (it goes first: it is further behind) or such a member needs an observation: its
        // checks are made, fresh, when its turn comes, and a wave of n nodes costs O(n) of
        // these observations instead of O(n²).
        let mut order = members;
        order.sort_by_key(|&i| (talos_of(j, si).nodes[i].phase, i));
        let mut turn_taken = false;
        for i in order {
            let at_turn = talos_of(j, si).nodes[i].phase.checked_at_its_turn();
            if at_turn && turn_taken {
                continue;
            }
            let asked = eyes.missing.borrow().count();
            let flow = talos_node(j, si, i, eyes, now, notes);
            // a command goes to the member furthest behind: no member after it can have one
            if matches!(flow, Flow::Run(_)) || (at_turn && eyes.missing.borrow().count() > asked) {
                turn_taken = true;
            }
            match flow {
                Flow::Run(cmd) => {
                    let phase = talos_of(j, si).nodes[i].phase;
                    runs.push((phase, i, cmd));
                }
                Flow::Poll(w, r) => polls.push((w, r)),
                Flow::Wait(at, r) => waits.push((at, r)),
                h @ Flow::Halt { .. } => return h,
                Flow::Done => {}
            }
        }
        // Lockstep inside a wave: the node furthest behind goes first, so the wave's nodes are
        // away together rather than one after another.
        if let Some((_, _, cmd)) = runs.into_iter().min_by_key(|(p, i, _)| (*p, *i)) {
            return Flow::Run(cmd);
        }
        // The wave waits (its nodes rebooting, a drain held by a PodDisruptionBudget): the
        // next wave's pulls meanwhile, so that its nodes need not pull on their turn.
        if (!polls.is_empty() || !waits.is_empty())
            && let Some(f) = pull_ahead(j, si, wave, eyes, now)
        {
            return f;
        }
        if let Some((w, r)) = polls
            .iter()
            .find(|(w, _)| *w == PollWhy::Unreachable)
            .or(polls.first())
            .cloned()
        {
            return Flow::Poll(w, r);
        }
        if let Some((at, r)) = waits.into_iter().min_by_key(|(at, _)| *at) {
            return Flow::Wait(at, r);
        }
        // every node of the wave finished in this pass: soak it, then the next wave
    }
}

/// While wave `wave` of step `si` waits, the pull of the next wave's first node whose image is
/// not pulled yet ([`CommandOp::PullAhead`]), so that the image is on the node when its turn
/// comes. A pull changes nothing the rollout's safety counts (the node keeps serving its
/// workloads, as during the pull at its turn) and its failure never halts the job.
///
/// Only where that cannot surprise anyone:
/// - worker steps: a control-plane step keeps its other nodes (and etcd's disks) quiet while one
///   of them is away;
/// - steps without health gates: with gates, nothing touches the next wave before the current
///   one passed them;
/// - nodes not started yet, inside the maintenance windows, observed on the version the plan
///   expects (a node already on the target, or one that cannot be observed, is left alone); one
///   pull ahead per node (a failed one is not repeated: the node pulls at its turn).
fn pull_ahead(j: &Job, si: usize, wave: usize, eyes: &Eyes, now: Timestamp) -> Option<Flow> {
    let ts = talos_of(j, si);
    if ts.control_plane() || step_policy(j, si).is_some() || window_gate(j, now).is_err() {
        return None;
    }
    let candidates = ts.nodes.iter().filter(|n| {
        n.wave == wave + 1 && n.phase == NodePhase::Pending && n.pulled_ahead.is_none()
    });
    let mut chosen = None;
    for n in candidates {
        match eyes.talos(&n.node_target()) {
            Seen::Got(t) if t.version == n.target.from => {
                chosen = Some(n);
                break;
            }
            // observed at the next round of this decision
            Seen::Missing => return None,
            Seen::Got(_) | Seen::Transient(_) | Seen::Failed(_) => {}
        }
    }
    let n = chosen?;
    Some(Flow::Run(Box::new(Command {
        key: key(j, si, Some(&n.target.node), CommandOp::PullAhead, n.attempt),
        action: Action::Pull {
            node: n.node_target(),
            image: ts.rollout.image_for(&n.target).to_string(),
            namespace: ImageNamespace::System,
        },
    })))
}

pub(super) fn talos_of(j: &Job, si: usize) -> &TalosStep {
    match &j.steps[si].kind {
        StepKind::Talos(t) => t,
        StepKind::Kubernetes(_) => unreachable!("step {si} is a Talos step"),
    }
}

/// Node `i` of Talos step `si`, for writing (copied first if another job shares it).
pub(super) fn node_mut(j: &mut Job, si: usize, i: usize) -> &mut NodeProgress {
    Arc::make_mut(&mut talos_mut(j, si).nodes[i])
}

pub(super) fn talos_mut(j: &mut Job, si: usize) -> &mut TalosStep {
    match &mut j.steps[si].kind {
        StepKind::Talos(t) => t,
        StepKind::Kubernetes(_) => unreachable!("step {si} is a Talos step"),
    }
}

pub(super) fn talos_node(
    j: &mut Job,
    si: usize,
    i: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Flow {
    loop {
        let ts = talos_of(j, si);
        let spec = &ts.rollout;
        let n = &ts.nodes[i];
        let name = n.target.node.clone();
        let target = n.node_target();
        let cp = ts.control_plane();
        let since = n.since.unwrap_or(now);
        let health_deadline = add(since, spec.health_timeout);
        let to = spec.to.clone();
        let from = n.target.from.clone();
        let nd = Some(name.as_str());
        match n.phase {
            NodePhase::Pending => {
                if let Err(flow) = window_gate(j, now) {
                    return flow;
                }
                node_mut(j, si, i).enter(NodePhase::Checking, now);
                notes.push(format!("{name}: started"));
            }
            NodePhase::Checking => {
                let t = match need(
                    eyes.talos(&target),
                    &format!("node `{name}`"),
                    health_deadline,
                    now,
                    nd,
                ) {
                    Ok(t) => t,
                    Err(f) => return f,
                };
                if t.version == to {
                    node_mut(j, si, i).enter(NodePhase::Skipped, now);
                    notes.push(format!("{name}: already runs {to}, skipped"));
                    return Flow::Done;
                }
                if t.version != from {
                    return halt_flow(
                        HaltCode::UnexpectedVersion,
                        format!(
                            "node `{name}` runs {}, but the plan expected {from}: something else changed it; plan again",
                            t.version
                        ),
                        nd,
                        None,
                    );
                }
                let k = match need(
                    eyes.kube(&name),
                    &format!("Kubernetes node `{name}`"),
                    health_deadline,
                    now,
                    nd,
                ) {
                    Ok(k) => k,
                    Err(f) => return f,
                };
                if cp {
                    let via = j.control_plane.clone();
                    let e = match need(eyes.etcd(&via), "etcd", health_deadline, now, nd) {
                        Ok(e) => e,
                        Err(f) => return f,
                    };
                    if let Err(why) = etcd_verdict(e) {
                        if now >= health_deadline {
                            return halt_flow(
                                HaltCode::EtcdUnhealthy,
                                format!(
                                    "etcd did not become healthy before node `{name}` could start: {why}"
                                ),
                                nd,
                                None,
                            );
                        }
                        return Flow::Poll(PollWhy::Waiting, why);
                    }
                }
                let method = UpgradeMethod::for_version(&t.version);
                let boot = t.boot_id.clone();
                let kubelet = k.kubelet_version.clone();
                let was_cordoned = k.unschedulable;
                let unhealthy_before = t.unhealthy_services.clone();
                let n = node_mut(j, si, i);
                n.was_cordoned = was_cordoned;
                n.boot_id_before = Some(boot);
                n.kubelet_before = kubelet;
                n.services_unhealthy_before = unhealthy_before;
                n.method = Some(method);
                n.enter(NodePhase::Checked, now);
                notes.push(format!(
                    "{name}: checks passed (runs {from}, {method:?} upgrade)"
                ));
            }
            NodePhase::Checked => {
                if cp && j.snapshot.is_none() {
                    let Some(via) = j.control_plane.first().cloned() else {
                        return halt_flow(
                            HaltCode::NoSnapshotNode,
                            "no control-plane node is known to take the etcd snapshot from".into(),
                            None,
                            Some(CommandOp::Snapshot),
                        );
                    };
                    return Flow::Run(Box::new(snapshot_command(j, si, via)));
                }
                if n.pulled_ahead == Some(PullAhead::Pulled) {
                    node_mut(j, si, i).enter(NodePhase::Pulled, now);
                    notes.push(format!(
                        "{name}: image pulled ahead of its turn, no pull needed"
                    ));
                    continue;
                }
                return Flow::Run(Box::new(Command {
                    key: key(j, si, nd, CommandOp::Pull, n.attempt),
                    action: Action::Pull {
                        node: target,
                        image: spec.image_for(&n.target).to_string(),
                        namespace: ImageNamespace::System,
                    },
                }));
            }
            NodePhase::Pulled => {
                let away = ts.nodes.iter().filter(|n| n.phase.away()).count();
                if away >= ts.capacity() {
                    return Flow::Poll(
                        PollWhy::Waiting,
                        format!("{name}: waiting, {away} node(s) already away"),
                    );
                }
                return cordon(j, si, i);
            }
            NodePhase::Cordoned => return drain(j, si, i, now, "drain"),
            NodePhase::Drained => {
                let t = match need(
                    eyes.talos(&target),
                    &format!("node `{name}`"),
                    health_deadline,
                    now,
                    nd,
                ) {
                    Ok(t) => t,
                    Err(f) => return f,
                };
                if t.version != from {
                    return halt_flow(
                        HaltCode::UnexpectedVersion,
                        format!(
                            "node `{name}` runs {} before its upgrade, expected {from}",
                            t.version
                        ),
                        nd,
                        Some(CommandOp::Upgrade),
                    );
                }
                if cp {
                    let via = j.control_plane.clone();
                    let e = match need(eyes.etcd(&via), "etcd", health_deadline, now, nd) {
                        Ok(e) => e,
                        Err(f) => return f,
                    };
                    if let Err(why) = etcd_verdict(e) {
                        if now >= health_deadline {
                            return halt_flow(
                                HaltCode::EtcdUnhealthy,
                                format!(
                                    "etcd did not become healthy before upgrading `{name}`: {why}"
                                ),
                                nd,
                                Some(CommandOp::Upgrade),
                            );
                        }
                        return Flow::Poll(PollWhy::Waiting, why);
                    }
                }
                // A call whose reply was lost and that the node shows no trace of is made
                // again, but only within the health timeout from the drain (definitive failures
                // are bounded by `upgradeAttempts` in `apply`); see design/rollout.md, "one
                // Upgrade per node".
                if n.attempt > 0 && now >= health_deadline {
                    return halt_flow(
                        HaltCode::UpgradeNotMade,
                        format!(
                            "upgrade of `{name}` to {to} could not be made within {}s ({} call(s) left no trace): {}",
                            spec.health_timeout.as_secs(),
                            n.attempt,
                            n.last_error.as_deref().unwrap_or("no error was reported")
                        ),
                        nd,
                        Some(CommandOp::Upgrade),
                    );
                }
                let boot = t.boot_id.clone();
                let method = n
                    .method
                    .unwrap_or_else(|| UpgradeMethod::for_version(&t.version));
                let cmd = Command {
                    key: key(j, si, nd, CommandOp::Upgrade, n.attempt),
                    action: Action::Upgrade {
                        node: target,
                        image: spec.image_for(&n.target).to_string(),
                        method,
                        boot_id_before: boot.clone(),
                    },
                };
                node_mut(j, si, i).boot_id_before = Some(boot);
                return Flow::Run(Box::new(cmd));
            }
            NodePhase::Upgraded => {
                let Some(boot) = n.boot_id_before.clone() else {
                    return halt_flow(
                        HaltCode::Inconsistent,
                        format!("node `{name}` has no recorded boot id before its reboot"),
                        nd,
                        Some(CommandOp::Reboot),
                    );
                };
                return Flow::Run(Box::new(Command {
                    key: key(j, si, nd, CommandOp::Reboot, n.attempt),
                    action: Action::Reboot {
                        node: target,
                        boot_id_before: boot,
                    },
                }));
            }
            NodePhase::Rebooting => {
                let what = format!("node `{name}` after its reboot");
                let t = match eyes.talos(&target) {
                    Seen::Got(t) => t,
                    Seen::Missing => {
                        return Flow::Poll(PollWhy::Waiting, format!("observing {what}"));
                    }
                    Seen::Transient(m) => {
                        if now >= health_deadline {
                            return halt_flow(
                                HaltCode::NodeNotBack,
                                format!(
                                    "node `{name}` did not come back within {}s of its reboot ({m})",
                                    spec.health_timeout.as_secs()
                                ),
                                nd,
                                Some(CommandOp::Reboot),
                            );
                        }
                        return Flow::Poll(PollWhy::Waiting, format!("{name}: rebooting ({m})"));
                    }
                    Seen::Failed(m) => {
                        return halt_flow(
                            HaltCode::ObservationFailed,
                            format!("reading {what} failed: {m}"),
                            nd,
                            Some(CommandOp::Reboot),
                        );
                    }
                };
                let before = n.boot_id_before.as_deref().unwrap_or("");
                let late = |what: String| {
                    if now >= health_deadline {
                        halt_flow(
                            HaltCode::NodeNotBack,
                            format!(
                                "node `{name}` {what} within {}s of its reboot",
                                spec.health_timeout.as_secs()
                            ),
                            nd,
                            Some(CommandOp::Reboot),
                        )
                    } else {
                        Flow::Poll(PollWhy::Waiting, format!("{name}: {what}"))
                    }
                };
                if t.boot_id == before {
                    return late("has not rebooted yet".into());
                }
                if t.version != to {
                    return halt_flow(
                        HaltCode::NodeReverted,
                        format!(
                            "node reverted: `{name}` came back on {} instead of {to} (the boot fell back to the previous version)",
                            t.version
                        ),
                        nd,
                        Some(CommandOp::Reboot),
                    );
                }
                // back = MachineStatus stage `running` *and* ready (talosctl upgrade --wait:
                // `MachineReadyEventFn`), the boot id changed (above) and the target version
                // runs (above); services and the Kubernetes node are checked as well
                if t.stage != MachineStage::Running || !t.ready {
                    return late(format!(
                        "is {} and {}, not running and ready yet",
                        t.stage.name(),
                        if t.ready { "ready" } else { "not ready" }
                    ));
                }
                // a service that was already failing before the upgrade (say an extension
                // service) does not hold the node back; one that was healthy before does
                let newly = newly_unhealthy(&t.unhealthy_services, &n.services_unhealthy_before);
                if !newly.is_empty() {
                    return late(format!("services not healthy yet: {}", newly.join(", ")));
                }
                let k = match eyes.kube(&name) {
                    Seen::Got(k) => k,
                    Seen::Missing => {
                        return Flow::Poll(
                            PollWhy::Waiting,
                            format!("observing Kubernetes node `{name}`"),
                        );
                    }
                    Seen::Transient(m) => {
                        // the kube-apiserver may be away while a control-plane node reboots
                        return late(format!("Kubernetes API unreachable ({m})"));
                    }
                    Seen::Failed(m) => {
                        return halt_flow(
                            HaltCode::ObservationFailed,
                            format!("reading Kubernetes node `{name}` failed: {m}"),
                            nd,
                            Some(CommandOp::Reboot),
                        );
                    }
                };
                if !k.ready {
                    return late("is not Ready".into());
                }
                if let Some(expected) = &n.kubelet_before
                    && k.kubelet_version.as_ref() != Some(expected)
                {
                    return late(format!(
                        "reports kubelet {}, expected {expected}",
                        k.kubelet_version
                            .as_ref()
                            .map(|v| v.to_string())
                            .unwrap_or_else(|| "none".into())
                    ));
                }
                node_mut(j, si, i).enter(NodePhase::Back, now);
                notes.push(format!("{name}: back on {to}, healthy and Ready"));
            }
            NodePhase::Back => {
                if left_cordoned(j, si, i, notes) {
                    node_mut(j, si, i).enter(NodePhase::Done, now);
                    return Flow::Done;
                }
                return uncordon(j, si, i);
            }
            NodePhase::Done | NodePhase::Skipped => return Flow::Done,
        }
    }
}

// ---- The node cycle both paths share -------------------------------------------------------
//
// An upgrade (`talos_node`) and a rollback (`rollback_wave`) take a node through the same cycle:
// cordon → drain → the Talos call (Upgrade + Reboot, or Rollback) → back → uncordon. The
// Kubernetes ends of it are the same commands under the same journal keys, so they are made
// here once; the paths differ only in their phase enums and in the Talos call between.

/// Cordon node `i` of step `si`.
fn cordon(j: &Job, si: usize, i: usize) -> Flow {
    let n = &talos_of(j, si).nodes[i];
    let name = n.target.node.clone();
    Flow::Run(Box::new(Command {
        key: key(j, si, Some(&name), CommandOp::Cordon, n.attempt),
        action: Action::Cordon { node: name },
    }))
}

/// Drain node `i` of step `si` (cordoned at `since`) within what is left of the step's
/// `drainTimeout`; while an earlier drain was refused, wait until its retry time. `what`
/// names the drain in that wait ("drain", "drain before rollback").
fn drain(j: &Job, si: usize, i: usize, now: Timestamp, what: &str) -> Flow {
    let ts = talos_of(j, si);
    let n = &ts.nodes[i];
    let name = n.target.node.clone();
    if let Some(nb) = n.not_before
        && nb > now
    {
        return Flow::Wait(
            nb,
            format!(
                "{name}: {what} blocked ({}), retrying",
                n.blocked.as_deref().unwrap_or("eviction refused")
            ),
        );
    }
    let left = add(n.since.unwrap_or(now), ts.rollout.drain_timeout).duration_since(now);
    Flow::Run(Box::new(Command {
        key: key(j, si, Some(&name), CommandOp::Drain, n.attempt),
        action: Action::Drain {
            node: name,
            timeout_secs: left.as_secs().max(1) as u64,
            policy: ts.rollout.drain.clone(),
        },
    }))
}

/// Whether node `i` of step `si` was cordoned before medea started it: then it stays as the
/// operator left it (no uncordon) and a note says so.
fn left_cordoned(j: &Job, si: usize, i: usize, notes: &mut Vec<String>) -> bool {
    let n = &talos_of(j, si).nodes[i];
    if n.was_cordoned {
        notes.push(format!(
            "{}: left cordoned (it was cordoned before medea started it)",
            n.target.node
        ));
    }
    n.was_cordoned
}

/// Uncordon node `i` of step `si`.
fn uncordon(j: &Job, si: usize, i: usize) -> Flow {
    let n = &talos_of(j, si).nodes[i];
    let name = n.target.node.clone();
    Flow::Run(Box::new(Command {
        key: key(j, si, Some(&name), CommandOp::Uncordon, n.attempt),
        action: Action::Uncordon { node: name },
    }))
}

/// A gate failed after `wave` with `onFailure: rollback`: mark the wave's upgraded nodes for
/// rollback and start with the first.
fn start_rollback(
    j: &mut Job,
    si: usize,
    wave: usize,
    failure: GateFailure,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Flow {
    let ts = talos_of(j, si);
    let nodes: Vec<usize> = (0..ts.nodes.len())
        .filter(|&i| ts.nodes[i].wave == wave && ts.nodes[i].phase == NodePhase::Done)
        .collect();
    if nodes.is_empty() {
        return gate_halt(failure);
    }
    notes.push(format!(
        "{failure}; rolling back wave {} of step {} (onFailure: rollback)",
        wave + 1,
        si + 1
    ));
    for i in nodes {
        node_mut(j, si, i).enter_rollback(RollbackPhase::Pending, now);
    }
    j.gates.failure = Some(failure.clone());
    rollback_wave(j, si, failure, eyes, now, notes)
}

/// The halt of a rollback that did not bring a node back on its previous version.
pub(super) fn rollback_failed(j: &Job, node: &str, what: String, op: Option<CommandOp>) -> Flow {
    let reason = match &j.gates.failure {
        Some(f) => HaltReason::gate_message(
            HaltCode::RollbackFailed,
            format!("rollback of `{node}` failed: {what} (after {f})"),
            f.clone(),
        ),
        None => HaltReason::new(
            HaltCode::RollbackFailed,
            format!("rollback of `{node}` failed: {what}"),
        ),
    };
    Flow::Halt {
        reason,
        node: Some(node.to_string()),
        op,
    }
}

/// Roll the failed wave's nodes back one at a time (cordon → drain → `Rollback` → back on the
/// previous version → uncordon), then halt with the gate failure.
fn rollback_wave(
    j: &mut Job,
    si: usize,
    failure: GateFailure,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Flow {
    let ts = talos_of(j, si);
    let Some(i) = ts
        .nodes
        .iter()
        .position(|n| matches!(n.rollback, Some(p) if p != RollbackPhase::Done))
    else {
        let mut failure = failure;
        failure.rolled_back = ts
            .nodes
            .iter()
            .filter(|n| n.rollback == Some(RollbackPhase::Done))
            .map(|n| n.target.node.clone())
            .collect();
        return gate_halt(failure);
    };
    loop {
        let ts = talos_of(j, si);
        let spec = &ts.rollout;
        let n = &ts.nodes[i];
        let name = n.target.node.clone();
        let target = n.node_target();
        let since = n.since.unwrap_or(now);
        let health_deadline = add(since, spec.health_timeout);
        let to = spec.to.clone();
        let from = n.target.from.clone();
        let nd = Some(name.as_str());
        let Some(phase) = n.rollback else {
            unreachable!("picked above")
        };
        match phase {
            RollbackPhase::Pending => return cordon(j, si, i),
            RollbackPhase::Cordoned => return drain(j, si, i, now, "drain before rollback"),
            RollbackPhase::Drained => {
                let t = match need(
                    eyes.talos(&target),
                    &format!("node `{name}`"),
                    health_deadline,
                    now,
                    nd,
                ) {
                    Ok(t) => t,
                    Err(f) => return f,
                };
                if t.version != to {
                    return rollback_failed(
                        j,
                        &name,
                        format!("it runs {} before its rollback, expected {to}", t.version),
                        Some(CommandOp::Rollback),
                    );
                }
                let boot = t.boot_id.clone();
                let cmd = Command {
                    key: key(j, si, nd, CommandOp::Rollback, n.attempt),
                    action: Action::Rollback {
                        node: target,
                        to: from,
                        boot_id_before: boot.clone(),
                    },
                };
                node_mut(j, si, i).boot_id_before = Some(boot);
                return Flow::Run(Box::new(cmd));
            }
            RollbackPhase::Rebooting => {
                let late = |what: String| {
                    if now >= health_deadline {
                        rollback_failed(
                            j,
                            &name,
                            format!(
                                "the node {what} within {}s of its rollback",
                                spec.health_timeout.as_secs()
                            ),
                            Some(CommandOp::Rollback),
                        )
                    } else {
                        Flow::Poll(PollWhy::Waiting, format!("{name}: rolling back: {what}"))
                    }
                };
                let t = match eyes.talos(&target) {
                    Seen::Got(t) => t,
                    Seen::Missing => {
                        return Flow::Poll(PollWhy::Waiting, format!("observing node `{name}`"));
                    }
                    Seen::Transient(m) => return late(format!("was not back ({m})")),
                    Seen::Failed(m) => {
                        return rollback_failed(
                            j,
                            &name,
                            format!("reading the node failed: {m}"),
                            Some(CommandOp::Rollback),
                        );
                    }
                };
                if Some(&t.boot_id) == n.boot_id_before.as_ref() {
                    return late("had not rebooted".into());
                }
                if t.version != from {
                    return rollback_failed(
                        j,
                        &name,
                        format!(
                            "it came back on {} instead of its previous version {from}",
                            t.version
                        ),
                        Some(CommandOp::Rollback),
                    );
                }
                if t.stage != MachineStage::Running || !t.ready {
                    return late(format!("was {}, not running and ready", t.stage.name()));
                }
                let newly = newly_unhealthy(&t.unhealthy_services, &n.services_unhealthy_before);
                if !newly.is_empty() {
                    return late(format!("had unhealthy services: {}", newly.join(", ")));
                }
                match eyes.kube(&name) {
                    Seen::Got(k) if k.ready => {}
                    Seen::Got(_) => return late("was not Ready".into()),
                    Seen::Missing => {
                        return Flow::Poll(
                            PollWhy::Waiting,
                            format!("observing Kubernetes node `{name}`"),
                        );
                    }
                    Seen::Transient(m) => return late(format!("had no Kubernetes API ({m})")),
                    Seen::Failed(m) => {
                        return rollback_failed(
                            j,
                            &name,
                            format!("reading its Kubernetes node failed: {m}"),
                            Some(CommandOp::Rollback),
                        );
                    }
                }
                node_mut(j, si, i).enter_rollback(RollbackPhase::Back, now);
                notes.push(format!("{name}: rolled back, runs {from} again"));
            }
            RollbackPhase::Back => {
                if left_cordoned(j, si, i, notes) {
                    node_mut(j, si, i).enter_rollback(RollbackPhase::Done, now);
                    return rollback_wave(j, si, failure, eyes, now, notes);
                }
                return uncordon(j, si, i);
            }
            RollbackPhase::Done => unreachable!("picked a node not done"),
        }
    }
}

/// The services unhealthy now that were not unhealthy before the node's upgrade.
fn newly_unhealthy<'a>(now: &'a [String], before: &[String]) -> Vec<&'a str> {
    now.iter()
        .filter(|s| !before.contains(s))
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
mod newly_unhealthy_tests {
    use super::newly_unhealthy;

    #[test]
    fn only_services_healthy_before_hold_a_node_back() {
        let before = vec!["ext-iscsi-tools".to_string()];
        let now = vec!["ext-iscsi-tools".to_string(), "kubelet".to_string()];
        assert_eq!(newly_unhealthy(&now, &before), ["kubelet"]);
        assert!(newly_unhealthy(&now[..1], &before).is_empty());
        assert_eq!(newly_unhealthy(&now, &[]), ["ext-iscsi-tools", "kubelet"]);
    }
}
