//! etcd leadership in a control-plane step (issue #48 item 3): the member that leads etcd is
//! upgraded last among the control planes (omni#3115), and a control-plane node that leads etcd
//! hands its leadership over (`MachineService.EtcdForfeitLeadership`, as Omni 1.10 does before
//! it reboots a control plane) before the call that reboots it.
//!
//! Who leads is known only at run time, so both are decisions on observations (the etcd
//! health every control-plane decision reads, whose members report their leader): the plan
//! only says that the leader goes last.

use super::*;

/// How long a forfeit that failed while the node still led waits before it is asked again
/// (within the node's health timeout).
pub const FORFEIT_RETRY: Duration = Duration::from_secs(10);

/// The wave of step `si` to work on: [`current_wave`], except in a control-plane step whose
/// next wave has not started, where a wave whose node leads etcd waits for every other wave
/// that has not started (the leader goes last). A wave already started (or finished and not
/// soaked) always goes first, so one control plane is away at a time whatever the leader does
/// meanwhile. Without an answer about etcd (unreachable, no agreed leader) the plan's order
/// stands: the checks of the node that starts read etcd again and wait or halt as always.
pub(super) fn next_wave(
    j: &Job,
    si: usize,
    gated: bool,
    eyes: &Eyes,
    notes: &mut Vec<String>,
) -> Result<Option<(usize, bool)>, Flow> {
    let first = current_wave(j, si, gated);
    let ts = talos_of(j, si);
    let Some((w, _)) = first else {
        return Ok(None);
    };
    if !ts.control_plane() || !not_started(ts, w) {
        return Ok(first);
    }
    let due: Vec<usize> = due_waves(j, si, gated);
    if let Some(&started) = due.iter().find(|&&x| !not_started(ts, x)) {
        // a wave taken out of order earlier is under way: it finishes (and soaks) first
        return Ok(Some((started, wave_finished(ts, started))));
    }
    if due.len() < 2 {
        return Ok(first);
    }
    let leader = match eyes.etcd(&j.control_plane) {
        Seen::Missing => {
            return Err(Flow::Poll(
                PollWhy::Waiting,
                "observing etcd (who leads goes last)".into(),
            ));
        }
        Seen::Got(e) => e.leader.clone(),
        Seen::Transient(_) | Seen::Failed(_) => None,
    };
    let Some(leader) = leader else {
        return Ok(first);
    };
    let leads = |x: usize| {
        ts.nodes
            .iter()
            .any(|n| n.wave == x && n.target.node == leader)
    };
    if !leads(w) {
        return Ok(first);
    }
    // a leader that is cordoned already is away already: it goes first, as the plan ordered
    // the unavailable machines (and the quorum gate would hold every other node meanwhile)
    if let Seen::Got(nodes) = eyes.nodes()
        && nodes.get(&leader).is_some_and(|k| k.unschedulable)
    {
        return Ok(first);
    }
    match due.iter().copied().find(|&x| !leads(x)) {
        Some(other) => {
            notes.push(format!(
                "{leader}: leads etcd, so it is upgraded after the other control-plane nodes"
            ));
            Ok(Some((other, false)))
        }
        None => Ok(first),
    }
}

/// Every wave of step `si` that is not finished, or (`gated`) finished and not soaked, in
/// order ([`current_wave`] is the first of them).
fn due_waves(j: &Job, si: usize, gated: bool) -> Vec<usize> {
    let ts = talos_of(j, si);
    let waves = ts.nodes.iter().map(|n| n.wave + 1).max().unwrap_or(0);
    (0..waves)
        .filter(|&w| {
            let members = ts.nodes.iter().filter(|n| n.wave == w);
            let finished = members.clone().all(|n| n.phase.finished());
            let upgraded = members.clone().any(|n| n.phase == NodePhase::Done);
            let soaked =
                !gated || !upgraded || j.gates.passed(&GatePoint::AfterWave { step: si, wave: w });
            !finished || !soaked
        })
        .collect()
}

fn not_started(ts: &TalosStep, w: usize) -> bool {
    ts.nodes
        .iter()
        .filter(|n| n.wave == w)
        .all(|n| n.phase == NodePhase::Pending && n.rollback.is_none())
}

fn wave_finished(ts: &TalosStep, w: usize) -> bool {
    ts.nodes
        .iter()
        .filter(|n| n.wave == w)
        .all(|n| n.phase.finished())
}

/// Right before the call that reboots control-plane node `v` (its `Reboot`, or the legacy
/// `Upgrade` that reboots by itself): if it leads etcd, it hands its leadership over first.
/// `Ok` once another member leads (or the node answered a forfeit and nobody can say who
/// leads, or etcd has a single member: nobody to hand it to; Talos refuses "only one member"
/// and Omni skips a lone control plane); else the forfeit command, or its retry after a
/// failure. A failed forfeit never halts by itself: who leads is observed again, and a node
/// that no longer leads goes on. One that still leads at the node's health timeout halts
/// (`etcd_leadership_kept`): medea never reboots the leader after it refused to hand over,
/// as Omni never does (its pre-reboot hook's error aborts the upgrade, which is retried).
pub(super) fn before_reboot(
    j: &Job,
    v: &NodeView,
    eyes: &Eyes,
    notes: &mut Vec<String>,
) -> Result<(), Flow> {
    if !v.cp {
        return Ok(());
    }
    let e = need(
        eyes.etcd(&j.control_plane),
        "etcd",
        v.deadline,
        v.now,
        v.nd(),
    )?;
    if e.members.len() < 2 {
        return Ok(());
    }
    let n = &talos_of(j, v.si).nodes[v.i];
    let handover = n.handover.clone().unwrap_or_default();
    match e.leader.as_deref() {
        Some(l) if l != v.name => {
            if let Some(err) = &handover.last_error {
                notes.push(format!(
                    "{}: its forfeit of etcd leadership failed ({err}), but `{l}` leads etcd now: going on",
                    v.name
                ));
            }
            return Ok(());
        }
        None if handover.answered => return Ok(()),
        _ => {}
    }
    if let Some(at) = handover.not_before
        && at > v.now
    {
        return Err(Flow::Wait(
            at,
            format!(
                "{}: still leads etcd ({}); asking it to hand over again",
                v.name,
                handover
                    .last_error
                    .as_deref()
                    .unwrap_or("it answered, but kept the leadership")
            ),
        ));
    }
    if handover.calls > 0 && v.now >= v.deadline {
        return Err(halt_flow(
            HaltCode::LeadershipKept,
            format!(
                "`{}` still leads etcd {}s after it was to be rebooted ({} forfeit call(s); the last: {}); \
                 it was not rebooted: move the leadership (`talosctl -n {} etcd forfeit-leadership`) or find why it refuses",
                v.name,
                v.health_timeout.as_secs(),
                handover.calls,
                handover
                    .last_error
                    .as_deref()
                    .unwrap_or("answered, but it kept the leadership"),
                v.target.address
            ),
            v.nd(),
            Some(CommandOp::Forfeit),
        ));
    }
    Err(Flow::Run(Box::new(Command {
        key: key(j, v.si, v.nd(), CommandOp::Forfeit, handover.calls),
        action: Action::ForfeitLeadership {
            node: v.target.clone(),
        },
    })))
}

/// The outcome of a forfeit (`Done` or `Failed`; a transient one is resolved by observation,
/// [`resolve_forfeit`]): counted, and never a halt.
pub(super) fn forfeit_outcome(
    j: &mut Job,
    key: &CommandKey,
    outcome: &CommandOutcome,
    now: Timestamp,
    notes: &mut Vec<String>,
) {
    j.in_flight = None;
    let who = key.node.as_deref().unwrap_or("cluster");
    let Some(h) = handover_mut(j, key) else {
        return;
    };
    h.calls += 1;
    match outcome {
        CommandOutcome::Failed { error, .. } | CommandOutcome::Transient { error } => {
            h.answered = false;
            h.last_error = Some(error.clone());
            h.not_before = Some(add(now, FORFEIT_RETRY));
            notes.push(format!(
                "{who}: forfeiting etcd leadership failed ({error}); looking who leads before going on"
            ));
        }
        _ => {
            h.answered = true;
            h.last_error = None;
            // only read if the node still leads when next observed: not asked again at once
            h.not_before = Some(add(now, FORFEIT_RETRY));
            notes.push(format!("{who}: asked to hand etcd leadership over"));
        }
    }
}

/// A forfeit journaled without an outcome: done if the node no longer leads etcd, else asked
/// again (the next call's key counts this one).
pub(super) fn resolve_forfeit(j: &Job, node: &NodeTarget, eyes: &Eyes) -> Resolution {
    match eyes.etcd(&j.control_plane) {
        Seen::Missing => Resolution::Pending(PollWhy::Waiting, "observing etcd".into()),
        Seen::Got(e) if e.leader.as_deref().is_some_and(|l| l != node.node) => Resolution::Done {
            outcome: CommandOutcome::Done,
            rebooted: false,
        },
        // the node leads, or nobody can say: ask again (harmless: a member that does not
        // lead answers at once)
        Seen::Got(_) | Seen::Transient(_) | Seen::Failed(_) => Resolution::Reissue,
    }
}

/// The handover record of the key's node (created on first use).
pub(super) fn handover_mut<'a>(j: &'a mut Job, key: &CommandKey) -> Option<&'a mut Handover> {
    let node = key.node.as_deref()?;
    match j.steps.get_mut(key.step).map(|s| &mut s.kind) {
        Some(StepKind::Talos(t)) => {
            let n = t.nodes.iter_mut().find(|n| n.target.node == node)?;
            Some(
                Arc::make_mut(n)
                    .handover
                    .get_or_insert_with(Handover::default),
            )
        }
        _ => None,
    }
}
