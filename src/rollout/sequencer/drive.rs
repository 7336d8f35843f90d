//! Driving a job: the step in progress, the gates every node start passes (maintenance window),
//! command keys, and the etcd verdict shared by the Talos and Kubernetes steps.

use super::*;

/// What one node, task or step wants.
pub(super) enum Flow {
    Run(Box<Command>),
    Poll(PollWhy, String),
    Wait(Timestamp, String),
    Halt {
        reason: HaltReason,
        node: Option<String>,
        op: Option<CommandOp>,
    },
    /// Nothing left to do here.
    Done,
}

/// Between a poll's reason and its detail, inside the sequencer ([`with_detail`]): a flow's
/// reason is one string on its way up, and [`Next::Poll`] carries the two apart.
const DETAIL: &str = "\n-- detail: ";

/// A poll's `reason` for a person, with a `detail` they need not read ([`Next::Poll`]).
pub(super) fn with_detail(reason: &str, detail: &str) -> String {
    format!("{reason}{DETAIL}{detail}")
}

/// A poll's reason and its detail, apart ([`with_detail`]).
fn split_detail(reason: &str) -> (&str, Option<&str>) {
    match reason.split_once(DETAIL) {
        Some((r, d)) => (r, Some(d)),
        None => (reason, None),
    }
}

pub(super) fn halt_flow(
    code: HaltCode,
    reason: String,
    node: Option<&str>,
    op: Option<CommandOp>,
) -> Flow {
    Flow::Halt {
        reason: HaltReason::new(code, reason),
        node: node.map(str::to_string),
        op,
    }
}

pub(super) fn add(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(d).unwrap_or(Timestamp::MAX)
}

pub(super) fn drive(j: &mut Job, eyes: &Eyes, now: Timestamp, notes: &mut Vec<String>) -> Next {
    if j.state.is_terminal() {
        // its pacing taints are removed once it is over (issue #35)
        return cleanup(j);
    }
    if let Some(intent) = j.in_flight.clone()
        && let Some(next) = settle(j, &intent, eyes, now, notes)
    {
        return next;
    }
    loop {
        let Some(si) = current_step(j) else {
            // the cluster's afterJob hooks (issue #35)
            if let Some(f) = job_hook(j, crate::desired::hooks::HookPoint::AfterJob)
                && let Some(next) = conclude(j, None, f, now, notes)
            {
                return next;
            }
            // the soak after the whole job
            if let Some(p) = job_policy(j)
                && !j.gates.passed(&GatePoint::AfterJob)
            {
                let flow = gate_point(j, GatePoint::AfterJob, &p, p.soak, eyes, now, notes);
                if let Some(next) = conclude(j, None, flow.or_halt(), now, notes) {
                    return next;
                }
            }
            j.state = JobState::Succeeded { at: now };
            notes.push("job succeeded".into());
            return Next::Finished;
        };
        // before the job touches anything: the cluster's gates
        if si == 0
            && j.steps[0].state == StepState::Pending
            && let Some(p) = job_policy(j)
            && !j.gates.passed(&GatePoint::BeforeJob)
        {
            let flow = gate_point(
                j,
                GatePoint::BeforeJob,
                &p,
                Duration::ZERO,
                eyes,
                now,
                notes,
            );
            if let Some(next) = conclude(j, None, flow.or_halt(), now, notes) {
                return next;
            }
        }
        // then its beforeJob hooks (issue #35)
        if si == 0
            && j.steps[0].state == StepState::Pending
            && let Some(f) = job_hook(j, crate::desired::hooks::HookPoint::BeforeJob)
            && let Some(next) = conclude(j, None, f, now, notes)
        {
            return next;
        }
        if j.steps[si].state == StepState::Pending {
            j.steps[si].state = StepState::Running;
            notes.push(format!("step {si} started"));
        }
        match run_step(j, si, eyes, now, notes) {
            Flow::Done => {
                j.steps[si].state = StepState::Done;
                notes.push(format!("step {si} done"));
            }
            other => {
                if let Some(next) = conclude(j, Some(si), other, now, notes) {
                    return next;
                }
            }
        }
    }
}

/// The command journaled without an outcome, resolved by observation ([`resolve`]): applied,
/// issued again, waited for until the step's timeout, or the halt. `None`: go on deciding.
fn settle(
    j: &mut Job,
    intent: &Intent,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Option<Next> {
    match resolve(j, intent, eyes) {
        Resolution::Done { outcome, rebooted } => {
            notes.push(format!(
                "{}: resolved by observation: it took effect",
                intent.key
            ));
            apply(j, intent, &outcome, rebooted, now, notes);
            j.state.is_terminal().then_some(Next::Finished)
        }
        Resolution::Reissue => {
            notes.push(format!(
                "{}: resolved by observation: no effect, issuing it again",
                intent.key
            ));
            j.in_flight = None;
            if intent.key.op == CommandOp::Upgrade {
                record_upgrade_error(
                    j,
                    &intent.key,
                    intent
                        .last_error
                        .clone()
                        .unwrap_or_else(|| "its outcome was lost".into()),
                    false,
                );
            }
            if intent.key.op == CommandOp::Drain {
                drain_outcome_lost(j, &intent.key);
            }
            bump_attempt(j, &intent.key);
            None
        }
        Resolution::Pending(why, reason) => {
            let deadline = add(intent.issued_at, step_timeout(j, intent.key.step));
            let unknown = format!(
                "could not determine the outcome of {} on {} before the timeout: {reason}",
                intent.key.op,
                intent.key.node.as_deref().unwrap_or("the cluster")
            );
            Some(late(
                now,
                deadline,
                || Next::Poll {
                    why,
                    reason,
                    detail: None,
                },
                || {
                    let reason = HaltReason::new(HaltCode::OutcomeUnknown, unknown);
                    notes.push(reason.to_string());
                    *j = halt(j, reason, now);
                    Next::Finished
                },
            ))
        }
        Resolution::Halt(reason) => {
            notes.push(reason.to_string());
            *j = halt(j, reason, now);
            Some(Next::Finished)
        }
    }
}

/// Step `si` itself, then (a Kubernetes step) the soak after it; a Talos step soaks after
/// each of its waves.
fn run_step(j: &mut Job, si: usize, eyes: &Eyes, now: Timestamp, notes: &mut Vec<String>) -> Flow {
    let flow = match j.steps[si].kind {
        StepKind::Talos(_) => talos_step(j, si, eyes, now, notes),
        StepKind::Kubernetes(_) => kube_step(j, si, eyes, now, notes),
    };
    if matches!(flow, Flow::Done)
        && matches!(j.steps[si].kind, StepKind::Kubernetes(_))
        && let Some(p) = step_policy(j, si)
        && !j.gates.passed(&GatePoint::AfterStep { step: si })
    {
        let point = GatePoint::AfterStep { step: si };
        return gate_point(j, point, &p, p.soak, eyes, now, notes).or_halt();
    }
    flow
}

/// The [`Next`] of a flow that is not [`Flow::Done`] (a halt is applied to the job here).
fn conclude(
    j: &mut Job,
    si: Option<usize>,
    flow: Flow,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Option<Next> {
    match flow {
        Flow::Done => None,
        Flow::Run(cmd) => Some(Next::Run(*cmd)),
        Flow::Poll(why, reason) => {
            let (reason, detail) = split_detail(&reason);
            Some(Next::Poll {
                why,
                reason: reason.to_string(),
                detail: detail.map(str::to_string),
            })
        }
        Flow::Wait(at, reason) => Some(Next::WaitUntil { at, reason }),
        Flow::Halt { reason, node, op } => {
            notes.push(format!("halted: {reason}"));
            j.state = JobState::Halted {
                reason,
                step: si,
                node,
                op,
                at: now,
            };
            Some(Next::Finished)
        }
    }
}

pub(super) fn step_timeout(j: &Job, si: usize) -> Duration {
    match j.steps.get(si).map(|s| &s.kind) {
        Some(StepKind::Talos(t)) => t.rollout.health_timeout,
        Some(StepKind::Kubernetes(k)) => k.rollout.health_timeout,
        None => Duration::from_secs(15 * 60),
    }
}

/// Whether a node may start now; otherwise the flow to return (wait for the window).
pub(super) fn window_gate(j: &Job, now: Timestamp) -> Result<(), Flow> {
    if j.windows.is_empty() {
        return Ok(());
    }
    let mut windows = Vec::new();
    for w in &j.windows {
        match MaintenanceWindow::new(&w.start, Duration::from_secs(w.duration_secs), &w.time_zone) {
            Ok(w) => windows.push(w),
            Err(e) => {
                return Err(halt_flow(
                    HaltCode::MaintenanceWindow,
                    format!("the job's maintenance window `{}` is invalid: {e}", w.start),
                    None,
                    None,
                ));
            }
        }
    }
    if open_at(&windows, now) {
        return Ok(());
    }
    match windows.iter().filter_map(|w| w.next_start(now)).min() {
        Some(at) => Err(Flow::Wait(
            at,
            format!("outside the maintenance windows; the next opens at {at}"),
        )),
        None => Err(halt_flow(
            HaltCode::MaintenanceWindow,
            "outside the maintenance windows, and none opens again".into(),
            None,
            None,
        )),
    }
}

/// Whether a node may start a change of size `change` now; otherwise the flow to return: wait
/// until no maintenance exclusion of the job holds it (following exclusions that overlap or
/// touch). A node already started finishes its step: exclusions, like windows, gate starts.
pub(super) fn exclusion_gate(j: &Job, change: Change, now: Timestamp) -> Result<(), Flow> {
    let Some(e) = holding(&j.exclusions, change, now) else {
        return Ok(());
    };
    let at = free_from(&j.exclusions, change, now);
    Err(Flow::Wait(
        at,
        format!(
            "inside maintenance exclusion `{}` ({}, until {}), which holds {} changes; the next may start at {at}",
            e.name,
            e.scope,
            e.to,
            change.as_str()
        ),
    ))
}

pub(super) fn key(
    j: &Job,
    si: usize,
    node: Option<&str>,
    op: CommandOp,
    attempt: u32,
) -> CommandKey {
    CommandKey {
        job: j.id.clone(),
        step: si,
        node: node.map(str::to_string),
        op,
        attempt: attempt + 1,
    }
}

pub(super) fn snapshot_command(j: &Job, si: usize, via: NodeTarget) -> Command {
    Command {
        key: key(j, si, None, CommandOp::Snapshot, j.snapshot_attempts),
        action: Action::Snapshot { via },
    }
}

/// etcd is healthy and losing one member keeps quorum ([`etcd_verdict_with`], nobody else
/// counted down).
pub fn etcd_verdict(h: &EtcdHealth) -> Result<(), String> {
    etcd_verdict_with(h, &[])
}

/// The quorum gate before a control-plane node is taken away, the one place its rule is
/// written: etcd reports members, no alarm, no learner, every member healthy, and taking one
/// member away — with the members in `down` (the other control-plane nodes that are cordoned
/// or draining: about to go, or held away by someone) counted as gone too — leaves a majority
/// of the members up. A single member is the exception: nothing can keep its quorum, and the
/// plan already says so.
pub fn etcd_verdict_with(h: &EtcdHealth, down: &[String]) -> Result<(), String> {
    if h.members.is_empty() {
        return Err("etcd reports no members".into());
    }
    if !h.alarms.is_empty() {
        return Err(format!("etcd alarms are active: {}", h.alarms.join(", ")));
    }
    if let Some(m) = h.members.iter().find(|m| m.learner) {
        return Err(format!("etcd member `{}` is still a learner", m.name));
    }
    if let Some(m) = h
        .members
        .iter()
        .find(|m| !m.healthy || !m.errors.is_empty())
    {
        let detail = if m.errors.is_empty() {
            "not answering".to_string()
        } else {
            m.errors.join("; ")
        };
        return Err(format!("etcd member `{}` is unhealthy: {detail}", m.name));
    }
    let n = h.members.len();
    if n == 1 {
        return Ok(());
    }
    let down: Vec<&String> = down
        .iter()
        .filter(|d| h.members.iter().any(|m| &m.name == *d))
        .collect();
    let left = n.saturating_sub(1 + down.len());
    let quorum = n / 2 + 1;
    if left >= quorum {
        return Ok(());
    }
    if down.is_empty() {
        return Err(format!(
            "etcd has {n} members: taking one away loses quorum (add a third control-plane node)"
        ));
    }
    let names = down
        .iter()
        .map(|d| format!("`{d}`"))
        .collect::<Vec<_>>()
        .join(", ");
    Err(format!(
        "etcd has {n} members and {names} {} cordoned or draining (counted as down): taking one \
         more away leaves {left} of {n}, short of quorum ({quorum})",
        if down.len() == 1 { "is" } else { "are" }
    ))
}

/// A drain whose outcome was lost runs again and sees only the pods left: the volumes of the
/// pods the lost one evicted are unknown, so every attachment on the node counts.
fn drain_outcome_lost(j: &mut Job, key: &CommandKey) {
    let Some(StepKind::Talos(t)) = j.steps.get_mut(key.step).map(|s| &mut s.kind) else {
        return;
    };
    if let Some(n) = t
        .nodes
        .iter_mut()
        .find(|n| Some(n.target.node.as_str()) == key.node.as_deref())
    {
        Arc::make_mut(n).drain_volumes = Some(DrainVolumes::Unknown);
    }
}
