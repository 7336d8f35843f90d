//! The Talos OS step: a pool's nodes, wave by wave, through check, snapshot, pull, cordon,
//! drain, upgrade, reboot, back and uncordon.

use super::*;
use crate::plan::health::OnFailure;
use crate::version::TalosVersion;

pub(super) fn talos_step(
    j: &mut Job,
    si: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Flow {
    // a blocking hook is one long call: the silences of nodes away cover it first (issue #51)
    let flow = talos_step_flow(j, si, eyes, now, notes);
    cover_hook(j, si, flow, now)
}

fn talos_step_flow(
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
    // `rollout.stage: ahead`: the installs ahead of the windows come first, and staged nodes
    // that have not started are watched for a reboot by someone else (every decision)
    if let Some(f) = stage_ahead(j, si, eyes, now, notes) {
        return f;
    }
    let policy = step_policy(j, si);
    loop {
        // a node back and uncordoned: its silence expires before anything else (the soak
        // after its wave sees its alerts again)
        if let Some(f) = unsilence_finished(j, si) {
            return f;
        }
        // a node done: medea's pacing taint comes off it (issue #35)
        if let Some(f) = untaint_finished(j, si) {
            return f;
        }
        // then the hooks after each node back and each wave done (issue #35)
        if let Some(f) = after_hooks(j, si) {
            return f;
        }
        // a control-plane step: the node leading etcd goes last (issue #48)
        let (wave, finished) = match next_wave(j, si, policy.is_some(), eyes, notes) {
            Ok(Some(w)) => w,
            Ok(None) => return Flow::Done,
            Err(f) => return f,
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
        // before the wave starts: it may start at all (a window is open, an exclusion does not
        // hold every member), else nothing is done for it (issue #35: no gate evaluated, no
        // budget counted, no beforeWave hook fired hours before its nodes can move)
        if members
            .iter()
            .all(|&i| ts.nodes[i].phase == NodePhase::Pending)
            && let Err(f) = wave_may_start(j, si, &members, now)
        {
            return f;
        }
        let ts = talos_of(j, si);
        // before the wave starts: the pool's gates
        if let Some(p) = policy.as_ref()
            && members
                .iter()
                .all(|&i| ts.nodes[i].phase == NodePhase::Pending)
            && !j.gates.passed(&GatePoint::BeforeWave { step: si, wave })
        {
            let point = GatePoint::BeforeWave { step: si, wave };
            match gate_point(j, point, p, Duration::ZERO, eyes, now, notes).or_halt() {
                Flow::Done => {}
                f => return f,
            }
        }
        // pacing (issue #35): the wave's budget counts the pool's nodes already away (the
        // next wave's taints come before its first cordon, `talos_node`)
        if members
            .iter()
            .all(|&i| talos_of(j, si).nodes[i].phase == NodePhase::Pending)
            && let Err(f) = wave_budget(j, si, wave, eyes, now, notes)
        {
            return f;
        }
        // before the wave starts: the pool's beforeWave hooks (issue #35)
        let ts = talos_of(j, si);
        if members
            .iter()
            .all(|&i| ts.nodes[i].phase == NodePhase::Pending)
            && let Some(f) = before_wave_hook(j, si, wave)
        {
            return f;
        }
        // (staged nodes not started yet were watched for reboots at the top, by `stage_ahead`,
        // in this and every decision: waiting for a window or inside one)
        if let Some(f) = wave_turn(j, si, wave, members, eyes, now, notes) {
            return f;
        }
        // every node of the wave finished in this pass: soak it, then the next wave
    }
}

/// Whether a wave whose members (`members`, every one pending) have not started may start
/// now: a maintenance window is open and a maintenance exclusion does not hold every one of
/// them; otherwise the flow to return (the wait until the window opens or the earliest member
/// is free, or the window's halt). Each member passes the same gates again when it starts
/// ([`start`]); this one keeps the wave's gates, budget and `beforeWave` hooks from running
/// for a wave none of whose nodes may move.
fn wave_may_start(j: &Job, si: usize, members: &[usize], now: Timestamp) -> Result<(), Flow> {
    window_gate(j, now)?;
    let ts = talos_of(j, si);
    let mut earliest: Option<(Timestamp, String)> = None;
    for &i in members {
        let n = &ts.nodes[i];
        match exclusion_gate(j, Change::talos(&n.target.from, &ts.rollout.to), now) {
            Ok(()) => return Ok(()),
            Err(Flow::Wait(at, r)) => {
                if earliest.as_ref().is_none_or(|(e, _)| at < *e) {
                    earliest = Some((at, r));
                }
            }
            Err(f) => return Err(f),
        }
    }
    match earliest {
        Some((at, r)) => Err(Flow::Wait(at, r)),
        None => Ok(()),
    }
}

/// The first wave of step `si` that is not finished, or (`gated`: under a health policy) not
/// soaked after a node of it was upgraded; with whether all its nodes finished.
pub(super) fn current_wave(j: &Job, si: usize, gated: bool) -> Option<(usize, bool)> {
    let ts = talos_of(j, si);
    let waves = ts.nodes.iter().map(|n| n.wave + 1).max().unwrap_or(0);
    (0..waves).find_map(|w| {
        let members = ts.nodes.iter().filter(|n| n.wave == w);
        let finished = members.clone().all(|n| n.phase.finished());
        let upgraded = members.clone().any(|n| n.phase == NodePhase::Done);
        let soaked =
            !gated || !upgraded || j.gates.passed(&GatePoint::AfterWave { step: si, wave: w });
        (!finished || !soaked).then_some((w, finished))
    })
}

/// One pass over the unfinished `members` of `wave`: the command of the node furthest behind,
/// else (while the wave waits) a pull ahead for the next wave, else a poll or a wait; a halt
/// at once. `None`: every member finished in this pass.
fn wave_turn(
    j: &mut Job,
    si: usize,
    wave: usize,
    members: Vec<usize>,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Option<Flow> {
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
            h @ Flow::Halt { .. } => return Some(h),
            Flow::Done => {}
        }
    }
    // Lockstep inside a wave: the node furthest behind goes first, so the wave's nodes are
    // away together rather than one after another.
    if let Some((_, _, cmd)) = runs.into_iter().min_by_key(|(p, i, _)| (*p, *i)) {
        return Some(Flow::Run(cmd));
    }
    // The wave waits (its nodes rebooting, a drain held by a PodDisruptionBudget): the
    // next wave's pulls meanwhile, so that its nodes need not pull on their turn.
    if (!polls.is_empty() || !waits.is_empty())
        && let Some(f) = pull_ahead(j, si, wave, eyes, now)
    {
        return Some(f);
    }
    if let Some((w, r)) = polls
        .iter()
        .find(|(w, _)| *w == PollWhy::Unreachable)
        .or(polls.first())
        .cloned()
    {
        return Some(Flow::Poll(w, r));
    }
    waits
        .into_iter()
        .min_by_key(|(at, _)| *at)
        .map(|(at, r)| Flow::Wait(at, r))
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
/// - nodes not started yet, inside the maintenance windows and held by no exclusion, observed on the version the plan
///   expects (a node already on the target, or one that cannot be observed, is left alone); one
///   pull ahead per node (a failed one is not repeated: the node pulls at its turn);
/// - nodes not installed ahead (`rollout.stage: ahead`, issue #36): a staged node's image is
///   already installed, and its turn pulls nothing.
fn pull_ahead(j: &Job, si: usize, wave: usize, eyes: &Eyes, now: Timestamp) -> Option<Flow> {
    let ts = talos_of(j, si);
    if ts.control_plane() || step_policy(j, si).is_some() || window_gate(j, now).is_err() {
        return None;
    }
    let candidates = ts.nodes.iter().filter(|n| {
        n.wave == wave + 1
            && n.phase == NodePhase::Pending
            && n.pulled_ahead.is_none()
            && !n.staging.as_ref().is_some_and(Staging::staged)
            && exclusion_gate(j, Change::talos(&n.target.from, &ts.rollout.to), now).is_ok()
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

/// What a node's decision knows of it, read once per round of [`talos_node`].
pub(super) struct NodeView {
    /// Node `i` of Talos step `si`, decided at `now`.
    pub(super) si: usize,
    pub(super) i: usize,
    pub(super) now: Timestamp,
    pub(super) name: String,
    pub(super) target: NodeTarget,
    pub(super) cp: bool,
    /// `healthTimeout` from when the node entered its phase.
    pub(super) deadline: Timestamp,
    pub(super) health_timeout: Duration,
    pub(super) to: TalosVersion,
    pub(super) from: TalosVersion,
}

impl NodeView {
    pub(super) fn of(j: &Job, si: usize, i: usize, now: Timestamp) -> NodeView {
        let ts = talos_of(j, si);
        let n = &ts.nodes[i];
        NodeView {
            si,
            i,
            now,
            name: n.target.node.clone(),
            target: n.node_target(),
            cp: ts.control_plane(),
            deadline: add(n.since.unwrap_or(now), ts.rollout.health_timeout),
            health_timeout: ts.rollout.health_timeout,
            to: ts.rollout.to.clone(),
            from: n.target.from.clone(),
        }
    }
    pub(super) fn nd(&self) -> Option<&str> {
        Some(self.name.as_str())
    }
    /// The halt of a node that does not run the version the plan expects of it.
    pub(super) fn unexpected(&self, what: String, op: Option<CommandOp>) -> Flow {
        halt_flow(HaltCode::UnexpectedVersion, what, self.nd(), op)
    }
    /// The node's Talos observation, which must be there to go on ([`need`]).
    fn talos<'a>(&self, eyes: &Eyes<'a>) -> Result<&'a TalosNode, Flow> {
        need(
            eyes.talos(&self.target),
            &format!("node `{}`", self.name),
            self.deadline,
            self.now,
            self.nd(),
        )
    }
}

/// One node of a Talos step, phase by phase: each phase either moves the node on (the loop
/// looks at it again) or says what the step waits for.
pub(super) fn talos_node(
    j: &mut Job,
    si: usize,
    i: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Flow {
    loop {
        let v = NodeView::of(j, si, i, now);
        // while the node is away: its silence renewed before it lapses
        if !talos_of(j, si).nodes[i].phase.finished()
            && let Some(f) = silence_renewal(j, si, i, now)
        {
            return f;
        }
        let n = &talos_of(j, si).nodes[i];
        if n.phase == NodePhase::Pending
            && matches!(n.staging, Some(Staging::RebootedExternally { .. }))
        {
            // a staged node rebooted outside medea: verified, never upgraded again
            return verify_external(j, si, i, eyes, now, notes);
        }
        let moved = match talos_of(j, si).nodes[i].phase {
            NodePhase::Pending => start(j, &v, notes),
            NodePhase::Checking => check(j, &v, eyes, notes),
            NodePhase::Checked => pull(j, &v, notes),
            NodePhase::Pulled => {
                let ts = talos_of(j, si);
                let away = ts.nodes.iter().filter(|n| n.phase.away()).count();
                // the wave's budget: maxUnavailable less the pool's nodes already away
                if away >= slots(ts, ts.nodes[i].wave) {
                    return Flow::Poll(
                        PollWhy::Waiting,
                        format!("{}: waiting, {away} node(s) already away", v.name),
                    );
                }
                // before the wave's first cordon, the next wave's pacing taints (issue #35):
                // inside the window the node started in, before anything is evicted
                if let Some(f) = taint_next_wave(j, si, talos_of(j, si).nodes[i].wave) {
                    return f;
                }
                // the pool's beforeNode hooks, before the cordon (issue #35)
                if let Some(f) = before_node_hook(j, si, i) {
                    return f;
                }
                // its expected alerts silenced before the cordon (issue #35)
                if let Some(f) = silence_before_cordon(j, si, i, now) {
                    return f;
                }
                return cordon(j, si, i);
            }
            NodePhase::Cordoned => return drain(j, si, i, now, "drain"),
            NodePhase::Drained => volumes_detached(j, &v, eyes, notes),
            NodePhase::Detached => {
                // the legacy Upgrade reboots the node by itself: a leader hands over first
                if talos_of(j, si).nodes[i].method == Some(UpgradeMethod::Legacy)
                    && let Err(f) = before_reboot(j, &v, eyes, notes)
                {
                    return f;
                }
                upgrade(j, &v, eyes, notes)
            }
            NodePhase::Upgraded => {
                // a node leading etcd hands its leadership over before its reboot (issue #48)
                if let Err(f) = before_reboot(j, &v, eyes, notes) {
                    return f;
                }
                return reboot(j, &v);
            }
            NodePhase::Rebooting => match verify_back(j, &v, Direction::Upgrade, eyes) {
                Ok(()) => {
                    node_mut(j, si, i).enter(NodePhase::Back, now);
                    notes.push(format!("{}: back on {}, healthy and Ready", v.name, v.to));
                    Ok(())
                }
                Err(f) => Err(f),
            },
            NodePhase::Back => match left_cordoned(j, &v, eyes, notes) {
                Ok(true) => {
                    node_mut(j, si, i).enter(NodePhase::Done, now);
                    return Flow::Done;
                }
                Ok(false) => return uncordon(j, si, i),
                Err(f) => return f,
            },
            NodePhase::Done | NodePhase::Skipped => return Flow::Done,
        };
        if let Err(flow) = moved {
            return flow;
        }
    }
}

/// `Pending`: the node starts when the maintenance windows and exclusions allow.
fn start(j: &mut Job, v: &NodeView, notes: &mut Vec<String>) -> Result<(), Flow> {
    let (si, i, now) = (v.si, v.i, v.now);
    window_gate(j, now)?;
    exclusion_gate(j, Change::talos(&v.from, &v.to), now)?;
    node_mut(j, si, i).enter(NodePhase::Checking, now);
    notes.push(format!("{}: started", v.name));
    Ok(())
}

/// `Checking`: the node runs the plan's `from` (or already the target: skipped), its
/// Kubernetes node is there and, on the control plane, etcd is healthy; what the node was
/// before is recorded for "back" to compare with.
fn check(j: &mut Job, v: &NodeView, eyes: &Eyes, notes: &mut Vec<String>) -> Result<(), Flow> {
    let (si, i, now) = (v.si, v.i, v.now);
    let (name, nd) = (&v.name, v.nd());
    let t = v.talos(eyes)?;
    if noticed_at_turn(j, si, i, t, now, notes) {
        return Ok(());
    }
    if t.version == v.to {
        node_mut(j, si, i).enter(NodePhase::Skipped, now);
        notes.push(format!("{name}: already runs {}, skipped", v.to));
        return Err(Flow::Done);
    }
    if t.version != v.from {
        return Err(v.unexpected(
            format!(
                "node `{name}` runs {}, but the plan expected {}: something else changed it; plan again",
                t.version, v.from
            ),
            None,
        ));
    }
    let k = need(
        eyes.kube(name),
        &format!("Kubernetes node `{name}`"),
        v.deadline,
        now,
        nd,
    )?;
    if v.cp {
        etcd_healthy(j, v, eyes, &format!("node `{name}` could start"), None)?;
    }
    let method = UpgradeMethod::for_version(&t.version);
    let n = node_mut(j, si, i);
    n.was_cordoned = k.unschedulable;
    n.boot_id_before = Some(t.boot_id.clone());
    n.kubelet_before = k.kubelet_version.clone();
    n.services_unhealthy_before = t.unhealthy_services.clone();
    n.method = Some(method);
    n.enter(NodePhase::Checked, now);
    notes.push(format!(
        "{name}: checks passed (runs {}, {method:?} upgrade)",
        v.from
    ));
    Ok(())
}

/// On the control plane, etcd must be healthy before `before` (a poll until the health
/// timeout, then a halt).
pub(super) fn etcd_healthy(
    j: &Job,
    v: &NodeView,
    eyes: &Eyes,
    before: &str,
    op: Option<CommandOp>,
) -> Result<(), Flow> {
    let now = v.now;
    let via = j.control_plane.clone();
    let e = need(eyes.etcd(&via), "etcd", v.deadline, now, v.nd())?;
    let down = control_planes_away(j, v, eyes)?;
    etcd_verdict_with(e, &down).map_err(|why| {
        late(
            now,
            v.deadline,
            || Flow::Poll(PollWhy::Waiting, why.clone()),
            || {
                halt_flow(
                    HaltCode::EtcdUnhealthy,
                    format!("etcd did not become healthy before {before}: {why}"),
                    v.nd(),
                    op,
                )
            },
        )
    })
}

/// The control-plane nodes other than `v` that count as down in the quorum gate
/// ([`etcd_verdict_with`]): cordoned or draining in Kubernetes (`spec.unschedulable`, one list
/// of the Nodes), or held away by this job. A list that cannot be read counts nobody: the
/// etcd health itself still gates.
fn control_planes_away(j: &Job, v: &NodeView, eyes: &Eyes) -> Result<Vec<String>, Flow> {
    let mut down: BTreeSet<String> = BTreeSet::new();
    for s in &j.steps {
        if let StepKind::Talos(t) = &s.kind
            && t.control_plane()
        {
            down.extend(
                t.nodes
                    .iter()
                    .filter(|n| {
                        n.phase.away()
                            || n.rollback.is_some_and(|r| {
                                r != RollbackPhase::Done && r != RollbackPhase::Pending
                            })
                    })
                    .map(|n| n.target.node.clone()),
            );
        }
    }
    match eyes.nodes() {
        Seen::Missing => {
            return Err(Flow::Poll(
                PollWhy::Waiting,
                "observing the Nodes (a cordoned control plane counts as down)".into(),
            ));
        }
        Seen::Got(nodes) => down.extend(
            j.control_plane
                .iter()
                .filter(|cp| nodes.get(&cp.node).is_some_and(|k| k.unschedulable))
                .map(|cp| cp.node.clone()),
        ),
        Seen::Transient(_) | Seen::Failed(_) => {}
    }
    down.remove(&v.name);
    Ok(down.into_iter().collect())
}

/// `Checked`: the etcd snapshot first on the control plane, then the installer's pull (unless
/// it was pulled ahead).
fn pull(j: &mut Job, v: &NodeView, notes: &mut Vec<String>) -> Result<(), Flow> {
    let (si, i, now) = (v.si, v.i, v.now);
    if v.cp && j.snapshot.is_none() {
        let Some(via) = j.control_plane.first().cloned() else {
            return Err(halt_flow(
                HaltCode::NoSnapshotNode,
                "no control-plane node is known to take the etcd snapshot from".into(),
                None,
                Some(CommandOp::Snapshot),
            ));
        };
        return Err(Flow::Run(Box::new(snapshot_command(j, si, via))));
    }
    let ts = talos_of(j, si);
    let n = &ts.nodes[i];
    if n.staging.as_ref().is_some_and(Staging::staged) {
        node_mut(j, si, i).enter(NodePhase::Pulled, now);
        notes.push(format!("{}: installed ahead, no pull needed", v.name));
        return Ok(());
    }
    if n.pulled_ahead == Some(PullAhead::Pulled) {
        node_mut(j, si, i).enter(NodePhase::Pulled, now);
        notes.push(format!(
            "{}: image pulled ahead of its turn, no pull needed",
            v.name
        ));
        return Ok(());
    }
    Err(Flow::Run(Box::new(Command {
        key: key(j, si, v.nd(), CommandOp::Pull, n.attempt),
        action: Action::Pull {
            node: v.target.clone(),
            image: ts.rollout.image_for(&n.target).to_string(),
            namespace: ImageNamespace::System,
        },
    })))
}

/// `Drained`: under `drain.volumeDetachTimeout`, wait until no `VolumeAttachment` names the
/// node, so that no volume stays attached to a node that reboots (tuppr's
/// `waitForVolumeDetach`): polled until the timeout from the drain's end, then a halt naming
/// the attachments left. The phase and its start are journaled, so a restart resumes the wait
/// with the same deadline. Without the wait (`waitForVolumeDetach: false`, plans made before
/// it existed) the node goes straight on.
fn volumes_detached(
    j: &mut Job,
    v: &NodeView,
    eyes: &Eyes,
    notes: &mut Vec<String>,
) -> Result<(), Flow> {
    no_volume_attached(j, v, eyes, notes)?;
    node_mut(j, v.si, v.i).enter(NodePhase::Detached, v.now);
    Ok(())
}

/// The wait of [`volumes_detached`], shared with a rollback's drained node (a `Rollback` call
/// reboots the node too): `Ok` once no `VolumeAttachment` names the node (or the wait is off),
/// else a poll until `drain.volumeDetachTimeout` from the start of the node's current
/// (drained) phase, then the `volumes_attached` halt naming the attachments.
fn no_volume_attached(
    j: &Job,
    v: &NodeView,
    eyes: &Eyes,
    notes: &mut Vec<String>,
) -> Result<(), Flow> {
    let (si, i, now) = (v.si, v.i, v.now);
    let (name, nd) = (&v.name, v.nd());
    let ts = talos_of(j, si);
    let Some(timeout) = ts.rollout.drain.volume_detach_timeout() else {
        return Ok(());
    };
    let since = ts.nodes[i].since.unwrap_or(now);
    let deadline = add(since, timeout);
    let attached = need(
        eyes.volumes(name),
        &format!("the VolumeAttachments of node `{name}`"),
        deadline,
        now,
        nd,
    )?;
    // the attachments of the volumes of the pods the drain evicted (tuppr
    // `WaitForVolumeDetach`); all of the node's when those are not known
    let drained = ts.nodes[i].drain_volumes.as_ref();
    let attached: Vec<_> = attached
        .iter()
        .filter(|a| drained.is_none_or(|d| d.covers(a.persistent_volume.as_deref())))
        .collect();
    if attached.is_empty() {
        notes.push(match drained {
            Some(DrainVolumes::Known { volumes }) if volumes.is_empty() => format!(
                "{name}: no volume attached any more (the drain evicted no pod with a PersistentVolume)"
            ),
            Some(DrainVolumes::Known { volumes }) => format!(
                "{name}: no volume attached any more of the drained pods ({})",
                volumes.join(", ")
            ),
            _ => format!("{name}: no volume attached any more"),
        });
        return Ok(());
    }
    let list = attached
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    Err(late(
        now,
        deadline,
        || {
            Flow::Poll(
                PollWhy::Waiting,
                format!(
                    "{name}: waiting for {} volume(s) to detach: {list}",
                    attached.len()
                ),
            )
        },
        || {
            halt_flow(
                HaltCode::VolumesAttached,
                format!(
                    "volumes still attached to `{name}` {}s after its drain \
                     (drain.volumeDetachTimeout); it was not rebooted: {list}",
                    timeout.as_secs()
                ),
                nd,
                None,
            )
        },
    ))
}

/// `Detached`: the upgrade call, once the node still runs `from` and (on the control plane)
/// etcd is healthy; a call that left no trace is made again only within the health timeout.
fn upgrade(j: &mut Job, v: &NodeView, eyes: &Eyes, notes: &mut Vec<String>) -> Result<(), Flow> {
    let (si, i, now) = (v.si, v.i, v.now);
    let (name, nd) = (&v.name, v.nd());
    let t = v.talos(eyes)?;
    // installed ahead (`rollout.stage: ahead`): no second install, the reboot is next
    if let Some(done) = staged_install(j, v, t, eyes, notes) {
        return done;
    }
    if t.version != v.from {
        return Err(v.unexpected(
            format!(
                "node `{name}` runs {} before its upgrade, expected {}",
                t.version, v.from
            ),
            Some(CommandOp::Upgrade),
        ));
    }
    // boot entries as upstream keeps them: never an install over another default entry
    // (issue #48, `next_boot.rs`)
    let staged = match before_install(name, &talos_of(j, si).nodes[i], t, &v.from, &v.to) {
        BeforeInstall::Install => false,
        BeforeInstall::Staged => true,
        BeforeInstall::Refuse(code, why) => {
            return Err(halt_flow(code, why, nd, Some(CommandOp::Upgrade)));
        }
    };
    if v.cp {
        etcd_healthy(
            j,
            v,
            eyes,
            &format!("upgrading `{name}`"),
            Some(CommandOp::Upgrade),
        )?;
    }
    if staged {
        already_staged(j, v, t, notes);
        return Ok(());
    }
    let ts = talos_of(j, si);
    let n = &ts.nodes[i];
    // A call whose reply was lost and that the node shows no trace of is made again, but only
    // within the health timeout from the drain (definitive failures are bounded by
    // `upgradeAttempts` in `apply`); see design/rollout.md, "one Upgrade per node".
    if n.attempt > 0 && now >= v.deadline {
        return Err(halt_flow(
            HaltCode::UpgradeNotMade,
            format!(
                "upgrade of `{name}` to {} could not be made within {}s ({} call(s) left no trace): {}",
                v.to,
                v.health_timeout.as_secs(),
                n.attempt,
                n.last_error.as_deref().unwrap_or("no error was reported")
            ),
            nd,
            Some(CommandOp::Upgrade),
        ));
    }
    let boot = t.boot_id.clone();
    let method = n
        .method
        .unwrap_or_else(|| UpgradeMethod::for_version(&t.version));
    let cmd = Command {
        key: key(j, si, nd, CommandOp::Upgrade, n.attempt),
        action: Action::Upgrade {
            node: v.target.clone(),
            image: ts.rollout.image_for(&n.target).to_string(),
            method,
            boot_id_before: boot.clone(),
        },
    };
    node_mut(j, si, i).boot_id_before = Some(boot);
    Err(Flow::Run(Box::new(cmd)))
}

/// `Detached` for a node whose next boot is the target already (staged outside this job's
/// staging: `talosctl upgrade --stage`, a halted job, an install whose reply was lost and
/// that ended since): no second install, which would delete the entry it runs; the reboot is
/// next.
fn already_staged(j: &mut Job, v: &NodeView, t: &TalosNode, notes: &mut Vec<String>) {
    let n = node_mut(j, v.si, v.i);
    n.boot_id_before = Some(t.boot_id.clone());
    n.method = Some(n.method.unwrap_or(UpgradeMethod::Lifecycle));
    n.enter(NodePhase::Upgraded, v.now);
    notes.push(format!(
        "{}: its next boot is {} already: no install (it would delete the entry it runs), rebooting",
        v.name, v.to
    ));
}

/// `Upgraded`: the reboot into the new installation.
fn reboot(j: &Job, v: &NodeView) -> Flow {
    let (si, i) = (v.si, v.i);
    let n = &talos_of(j, si).nodes[i];
    let Some(boot) = n.boot_id_before.clone() else {
        return halt_flow(
            HaltCode::Inconsistent,
            format!(
                "node `{}` has no recorded boot id before its reboot",
                v.name
            ),
            v.nd(),
            Some(CommandOp::Reboot),
        );
    };
    Flow::Run(Box::new(Command {
        key: key(j, si, v.nd(), CommandOp::Reboot, n.attempt),
        action: Action::Reboot {
            node: v.target.clone(),
            boot_id_before: boot,
        },
    }))
}

/// Which way a node's Talos call took it: forward by an upgrade and its reboot, or back by a
/// rollback. The two come back through the same checks ([`verify_back`]); they differ in the
/// version expected, the words, and what a node that is not back halts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    Upgrade,
    Rollback,
}

impl Direction {
    /// The call the node comes back from, as the messages name it.
    fn call(self) -> &'static str {
        match self {
            Direction::Upgrade => "reboot",
            Direction::Rollback => "rollback",
        }
    }
    /// What the node is doing while it is not back, for a poll.
    fn doing(self) -> &'static str {
        match self {
            Direction::Upgrade => "rebooting",
            Direction::Rollback => "rolling back",
        }
    }
    /// The halt of a node that came back on `got` instead of the `expect`ed version: an
    /// upgrade reverted (the boot fell back), a rollback failed.
    fn wrong_version(self, j: &Job, name: &str, got: &TalosVersion, expect: &TalosVersion) -> Flow {
        match self {
            Direction::Upgrade => halt_flow(
                HaltCode::NodeReverted,
                format!(
                    "node reverted: `{name}` came back on {got} instead of {expect} (the boot fell back to the previous version)"
                ),
                Some(name),
                Some(CommandOp::Reboot),
            ),
            Direction::Rollback => rollback_failed(
                j,
                name,
                format!("it came back on {got} instead of its previous version {expect}"),
                Some(CommandOp::Rollback),
            ),
        }
    }
    /// The halt of a node that is not back (`code` for an upgrade; a rollback's failure halts
    /// as [`rollback_failed`], with the gate failure that started it).
    fn halt(self, j: &Job, name: &str, code: HaltCode, what: String) -> Flow {
        match self {
            Direction::Upgrade => halt_flow(code, what, Some(name), Some(CommandOp::Reboot)),
            Direction::Rollback => rollback_failed(j, name, what, Some(CommandOp::Rollback)),
        }
    }
}

/// Is node `i` back from its Talos call? Back = the boot id moved, the expected version runs,
/// MachineStatus stage `running` *and* ready (talosctl upgrade --wait: `MachineReadyEventFn`),
/// no service unhealthy that was healthy before, the Kubernetes node Ready and, after an
/// upgrade, reporting the kubelet it had. Until the health timeout a node on its way is polled
/// (`late`); then, or on a definitive failure, the job halts.
pub(super) fn verify_back(j: &Job, v: &NodeView, dir: Direction, eyes: &Eyes) -> Result<(), Flow> {
    let now = v.now;
    let n = &talos_of(j, v.si).nodes[v.i];
    let (name, secs, call) = (&v.name, v.health_timeout.as_secs(), dir.call());
    let expect = match dir {
        Direction::Upgrade => &v.to,
        Direction::Rollback => &v.from,
    };
    // not back yet: polled until the health timeout, then the halt
    let not_back = |halt: String, poll: String| {
        late(
            now,
            v.deadline,
            || Flow::Poll(PollWhy::Waiting, poll),
            || dir.halt(j, name, HaltCode::NodeNotBack, halt),
        )
    };
    let late = |what: String| {
        not_back(
            format!("node `{name}` {what} within {secs}s of its {call}"),
            format!("{name}: {what}"),
        )
    };
    let failed = |what: &str, m: &str| {
        dir.halt(
            j,
            name,
            HaltCode::ObservationFailed,
            reading_failed(what, m),
        )
    };
    let what = match dir {
        Direction::Upgrade => format!("node `{name}` after its reboot"),
        Direction::Rollback => format!("node `{name}`"),
    };
    let t = observed(
        eyes.talos(&v.target),
        &what,
        |m| {
            // A node down for its reboot does not answer, as expected: the poll says so and
            // keeps the transport error as its detail (issue #52); the halt at the deadline
            // names the error.
            not_back(
                format!("node `{name}` did not come back within {secs}s of its {call} ({m})"),
                with_detail(
                    &format!(
                        "{name}: {} (Talos API not answering yet, expected)",
                        dir.doing()
                    ),
                    m,
                ),
            )
        },
        |m| failed(&what, m),
    )?;
    if n.boot_id_before.as_deref().unwrap_or("") == t.boot_id {
        return Err(late("has not rebooted yet".into()));
    }
    if &t.version != expect {
        return Err(dir.wrong_version(j, name, &t.version, expect));
    }
    if t.stage != MachineStage::Running || !t.ready {
        return Err(late(format!(
            "is {} and {}, not running and ready yet",
            t.stage.name(),
            if t.ready { "ready" } else { "not ready" }
        )));
    }
    // a service that was already failing before the upgrade (say an extension service) does
    // not hold the node back; one that was healthy before does
    let newly = newly_unhealthy(&t.unhealthy_services, &n.services_unhealthy_before);
    if !newly.is_empty() {
        return Err(late(format!(
            "services not healthy yet: {}",
            newly.join(", ")
        )));
    }
    let kube_what = format!("Kubernetes node `{name}`");
    let k = observed(
        eyes.kube(name),
        &kube_what,
        // the kube-apiserver may be away while a control-plane node reboots
        |m| late(format!("Kubernetes API unreachable ({m})")),
        |m| failed(&kube_what, m),
    )?;
    if !k.ready {
        return Err(late("is not Ready".into()));
    }
    if dir == Direction::Upgrade
        && let Some(expected) = &n.kubelet_before
        && k.kubelet_version.as_ref() != Some(expected)
    {
        return Err(late(format!(
            "reports kubelet {}, expected {expected}",
            k.kubelet_version
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_else(|| "none".into())
        )));
    }
    Ok(())
}

// ---- The node cycle both paths share -------------------------------------------------------
//
// An upgrade (`talos_node`) and a rollback (`rollback_wave`) take a node through the same cycle:
// cordon → drain → the Talos call (Upgrade + Reboot, or Rollback) → back → uncordon. The
// Kubernetes ends of it are the same commands under the same journal keys, so they are made
// here once; the paths differ only in their phase enums and in the Talos call between.

/// Cordon node `i` of step `si`.
fn cordon(j: &Job, si: usize, i: usize) -> Flow {
    kube_node_command(j, si, i, CommandOp::Cordon, |node| Action::Cordon { node })
}

/// The Kubernetes command `op` (`action` of the node's name) on node `i` of step `si`.
fn kube_node_command(
    j: &Job,
    si: usize,
    i: usize,
    op: CommandOp,
    action: impl FnOnce(String) -> Action,
) -> Flow {
    let n = &talos_of(j, si).nodes[i];
    let name = n.target.node.clone();
    Flow::Run(Box::new(Command {
        key: key(j, si, Some(&name), op, n.attempt),
        action: action(name),
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

/// Whether node `v` stays cordoned at the end of its cycle, from its Node as observed now
/// (issue #48 item 5): medea lifts only a cordon that carries its own job's annotation
/// (`medea.dev/cordoned-by: <job id>`), whatever happened in between (a crash, a leader
/// change of medea's own HA, an operator's cordon on top of medea's). A node cordoned by anyone
/// else — before medea started it (`was_cordoned`), by talosctl (`talos.dev/client-cordoned`)
/// or by a plain `kubectl cordon` — stays cordoned, and a note (the job's events) names it.
/// A node nobody cordons any more needs nothing, unless medea's annotation is left on it (the
/// uncordon removes it).
fn left_cordoned(
    j: &Job,
    v: &NodeView,
    eyes: &Eyes,
    notes: &mut Vec<String>,
) -> Result<bool, Flow> {
    let n = &talos_of(j, v.si).nodes[v.i];
    let k = need(
        eyes.kube(&v.name),
        &format!("Kubernetes node `{}`", v.name),
        v.deadline,
        v.now,
        v.nd(),
    )?;
    if k.cordoned_by_job(j.id.as_str()) {
        return Ok(false);
    }
    if !k.unschedulable {
        return Ok(true);
    }
    notes.push(if n.was_cordoned {
        format!(
            "{}: left cordoned (it was cordoned before medea started it)",
            v.name
        )
    } else {
        format!(
            "{}: left cordoned: the cordon is not this job's (cordoned by {})",
            v.name,
            k.cordoned_by_text()
        )
    });
    Ok(true)
}

/// Uncordon node `i` of step `si`.
fn uncordon(j: &Job, si: usize, i: usize) -> Flow {
    kube_node_command(j, si, i, CommandOp::Uncordon, |node| Action::Uncordon {
        node,
    })
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
    let v = NodeView::of(j, si, i, now);
    let Some(phase) = talos_of(j, si).nodes[i].rollback else {
        unreachable!("picked above")
    };
    match phase {
        RollbackPhase::Pending => cordon(j, si, i),
        RollbackPhase::Cordoned => drain(j, si, i, now, "drain before rollback"),
        RollbackPhase::Drained => {
            // like an upgrade, a rollback reboots the node: its volumes detach first
            if let Err(f) = no_volume_attached(j, &v, eyes, notes) {
                return f;
            }
            // and a control plane leading etcd hands over first (issue #48)
            if let Err(f) = before_reboot(j, &v, eyes, notes) {
                return f;
            }
            rollback_call(j, &v, eyes)
        }
        RollbackPhase::Rebooting => {
            if let Err(f) = verify_back(j, &v, Direction::Rollback, eyes) {
                return f;
            }
            node_mut(j, si, i).enter_rollback(RollbackPhase::Back, now);
            notes.push(format!("{}: rolled back, runs {} again", v.name, v.from));
            rollback_wave(j, si, failure, eyes, now, notes)
        }
        RollbackPhase::Back => match left_cordoned(j, &v, eyes, notes) {
            Ok(true) => {
                node_mut(j, si, i).enter_rollback(RollbackPhase::Done, now);
                rollback_wave(j, si, failure, eyes, now, notes)
            }
            Ok(false) => uncordon(j, si, i),
            Err(f) => f,
        },
        RollbackPhase::Done => unreachable!("picked a node not done"),
    }
}

/// A rollback's `Drained`: the `Rollback` call, once the node still runs the version it was
/// upgraded to.
fn rollback_call(j: &mut Job, v: &NodeView, eyes: &Eyes) -> Flow {
    let (si, i) = (v.si, v.i);
    let (name, nd) = (&v.name, v.nd());
    let t = match v.talos(eyes) {
        Ok(t) => t,
        Err(f) => return f,
    };
    if t.version != v.to {
        return rollback_failed(
            j,
            name,
            format!(
                "it runs {} before its rollback, expected {}",
                t.version, v.to
            ),
            Some(CommandOp::Rollback),
        );
    }
    let n = &talos_of(j, si).nodes[i];
    let boot = t.boot_id.clone();
    let cmd = Command {
        key: key(j, si, nd, CommandOp::Rollback, n.attempt),
        action: Action::Rollback {
            node: v.target.clone(),
            to: v.from.clone(),
            boot_id_before: boot.clone(),
        },
    };
    node_mut(j, si, i).boot_id_before = Some(boot);
    Flow::Run(Box::new(cmd))
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
