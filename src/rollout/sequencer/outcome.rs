//! Applying a command's outcome to the job: phases advance, attempts are counted, failures halt.

use super::*;

pub(super) fn bump_attempt(j: &mut Job, key: &CommandKey) {
    if matches!(
        key.op,
        CommandOp::Silence | CommandOp::Unsilence | CommandOp::Taint | CommandOp::Untaint
    ) {
        // counted by the node's silence (its renewals), not the phase's command; a taint
        // call is idempotent and keeps its key
        return;
    }
    if key.op == CommandOp::Snapshot {
        j.snapshot_attempts += 1;
        return;
    }
    if key.op == CommandOp::Forfeit {
        // counted by the node's handover record: the next call's key follows it
        if let Some(h) = handover_mut(j, key) {
            h.calls += 1;
        }
        return;
    }
    if key.op == CommandOp::Hook {
        // counted by the hook's record
        return hook_attempted(j);
    }
    let Some(node) = key.node.as_deref() else {
        if let Some(StepKind::Kubernetes(k)) = j.steps.get_mut(key.step).map(|s| &mut s.kind)
            && let Some(t) = k
                .tasks
                .list_mut()
                .iter_mut()
                .find(|t| t.op == KubeOp::Manifests)
        {
            t.attempt += 1;
        }
        return;
    };
    match j.steps.get_mut(key.step).map(|s| &mut s.kind) {
        Some(StepKind::Talos(t)) => {
            if let Some(n) = t.nodes.iter_mut().find(|n| n.target.node == node) {
                Arc::make_mut(n).attempt += 1;
            }
        }
        Some(StepKind::Kubernetes(k)) => {
            if let Some(t) = current_task_mut(k) {
                t.attempt += 1;
            }
        }
        None => {}
    }
}

/// Remember why an Upgrade attempt of the key's node did not take (and count it when the node
/// answered it with a failure).
pub(super) fn record_upgrade_error(j: &mut Job, key: &CommandKey, error: String, definitive: bool) {
    let Some(node) = key.node.as_deref() else {
        return;
    };
    if let Some(StepKind::Talos(t)) = j.steps.get_mut(key.step).map(|s| &mut s.kind)
        && let Some(n) = t.nodes.iter_mut().find(|n| n.target.node == node)
    {
        let n = Arc::make_mut(n);
        n.last_error = Some(error);
        if definitive {
            n.upgrade_failures += 1;
        }
    }
}

pub(super) fn current_task_mut(k: &mut KubeStep) -> Option<&mut KubeTask> {
    k.tasks
        .list_mut()
        .iter_mut()
        .find(|t| t.state != TaskState::Done)
}

/// Apply `outcome` of the command of `intent` to the job: a transient one is observed later,
/// a failure is retried within its bound or halts, a success moves the node, task or
/// snapshot on (`rebooted`: resolution saw the node reboot already).
pub(super) fn apply(
    j: &mut Job,
    intent: &Intent,
    outcome: &CommandOutcome,
    rebooted: bool,
    now: Timestamp,
    notes: &mut Vec<String>,
) {
    let key = &intent.key;
    if key.op == CommandOp::PullAhead {
        return pulled_ahead(j, key, outcome, notes);
    }
    if matches!(key.op, CommandOp::Silence | CommandOp::Unsilence) {
        return silence_outcome(j, intent, outcome, now, notes);
    }
    if key.op == CommandOp::Hook {
        return hook_outcome(j, intent, outcome, now, notes);
    }
    if key.op == CommandOp::Stage {
        return staged_outcome(j, intent, outcome, now, notes);
    }
    if matches!(key.op, CommandOp::Taint | CommandOp::Untaint) {
        return pacing_outcome(j, intent, outcome, notes);
    }
    if key.op == CommandOp::Forfeit && !matches!(outcome, CommandOutcome::Transient { .. }) {
        // never a halt: who leads is observed before the reboot (issue #48)
        return forfeit_outcome(j, key, outcome, now, notes);
    }
    match outcome {
        CommandOutcome::Transient { error } => {
            if let Some(i) = j.in_flight.as_mut() {
                i.last_error = Some(error.clone());
            }
            notes.push(format!("{key}: outcome unknown ({error}); will observe"));
            return;
        }
        CommandOutcome::Installing { error } => {
            if let Some(i) = j.in_flight.as_mut() {
                i.last_error = Some(error.clone());
            }
            if let Action::Upgrade { boot_id_before, .. } = &intent.action {
                mark_installing(j, key.step, key.node.as_deref(), boot_id_before, notes);
            }
            notes.push(format!(
                "{key}: an install is already running on the node; waiting for its next boot to change"
            ));
            return;
        }
        CommandOutcome::Failed { error, refusal } => {
            return failed(j, key, (error, *refusal), now, notes);
        }
        _ => {}
    }
    j.in_flight = None;
    if let CommandOutcome::Snapshot { info } = outcome {
        let encrypted = match &info.encrypted {
            Some(e) => format!(
                ", encrypted to {} age recipient{}",
                e.recipients.len(),
                if e.recipients.len() == 1 { "" } else { "s" }
            ),
            None => String::new(),
        };
        notes.push(format!(
            "etcd snapshot saved: {} ({} bytes, sha256 {}{encrypted})",
            info.path.display(),
            info.size,
            info.sha256
        ));
        j.snapshot = Some(info.clone());
        return;
    }
    if key.op == CommandOp::Snapshot {
        // a snapshot command that came back without its file: take it again
        j.snapshot_attempts += 1;
        return;
    }
    let Some(step) = j.steps.get_mut(key.step) else {
        return;
    };
    match &mut step.kind {
        StepKind::Talos(ts) => {
            if let Err(reason) = talos_done(ts, intent, outcome, rebooted, now, notes) {
                notes.push(format!("halted: {reason}"));
                j.state = JobState::Halted {
                    reason,
                    step: Some(key.step),
                    node: key.node.clone(),
                    op: Some(key.op),
                    at: now,
                };
            }
        }
        StepKind::Kubernetes(k) => kube_done(k, key, now, notes),
    }
}

/// A pull ahead of its turn: best effort, whatever came back: never retried in flight, never
/// a halt.
fn pulled_ahead(j: &mut Job, key: &CommandKey, outcome: &CommandOutcome, notes: &mut Vec<String>) {
    let who = key.node.as_deref().unwrap_or("cluster");
    j.in_flight = None;
    let result = match outcome {
        CommandOutcome::Transient { error } | CommandOutcome::Failed { error, .. } => {
            notes.push(format!(
                "{who}: the pull ahead of its turn failed ({error}); it pulls at its turn"
            ));
            PullAhead::Failed
        }
        _ => {
            notes.push(format!("{who}: image pulled ahead of its turn"));
            PullAhead::Pulled
        }
    };
    if let Some(StepKind::Talos(ts)) = j.steps.get_mut(key.step).map(|s| &mut s.kind)
        && let Some(n) = ts
            .nodes
            .iter_mut()
            .find(|n| Some(n.target.node.as_str()) == key.node.as_deref())
    {
        Arc::make_mut(n).pulled_ahead = Some(result);
    }
}

/// The node answered the command with a failure. A definitive Upgrade failure (the node ran
/// it and said it failed) may be tried again, within the pool's bound; anything else halts.
/// Nothing is in flight once it answered.
fn failed(
    j: &mut Job,
    key: &CommandKey,
    (error, refusal): (&str, Option<crate::rollout::ports::Refusal>),
    now: Timestamp,
    notes: &mut Vec<String>,
) {
    let who = key.node.as_deref().unwrap_or("cluster");
    let (bound, failures) = match j.steps.get(key.step).map(|s| &s.kind) {
        Some(StepKind::Talos(t)) if key.op == CommandOp::Upgrade => {
            let failures = t
                .nodes
                .iter()
                .find(|n| Some(n.target.node.as_str()) == key.node.as_deref())
                .map(|n| n.upgrade_failures)
                .unwrap_or(0);
            (t.rollout.upgrade_attempts.max(1), failures + 1)
        }
        _ => (1, 1),
    };
    if key.op == CommandOp::Upgrade {
        record_upgrade_error(j, key, error.to_string(), true);
    }
    if failures < bound {
        notes.push(format!(
            "{key}: the node answered failure {failures} of {bound} ({error}); trying again"
        ));
        j.in_flight = None;
        bump_attempt(j, key);
        return;
    }
    let code = match key.op {
        CommandOp::Upgrade => HaltCode::UpgradeRefused,
        CommandOp::Rollback => HaltCode::RollbackFailed,
        _ => HaltCode::CommandFailed,
    };
    let message = if bound > 1 {
        format!(
            "{} on `{who}` failed {bound} times (rollout.upgradeAttempts); the last: {error}",
            key.op
        )
    } else {
        format!("{} on `{who}` failed: {error}", key.op)
    };
    let reason = match &j.gates.failure {
        // a command of a rollback: the gate failure that started it stays on record
        Some(f) => HaltReason::gate_message(
            if code == HaltCode::CommandFailed {
                HaltCode::RollbackFailed
            } else {
                code
            },
            format!("{message} (rolling back after {f})"),
            f.clone(),
        ),
        None => HaltReason::new(code, message),
    };
    let reason = match refusal {
        Some(refusal) => reason.with_cause(HaltCause::DrainRefused { refusal }),
        None => reason,
    };
    notes.push(format!("halted: {reason}"));
    *j = halt(j, reason, now);
    j.in_flight = None;
}

/// A Talos step's command took effect: its node enters the next phase (of its rollback, when
/// it is rolling back). A drain refused past the drain timeout is the halt returned.
fn talos_done(
    ts: &mut TalosStep,
    intent: &Intent,
    outcome: &CommandOutcome,
    rebooted: bool,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<(), HaltReason> {
    let key = &intent.key;
    let who = key.node.as_deref().unwrap_or("cluster");
    let drain_timeout = ts.rollout.drain_timeout;
    let Some(n) = ts
        .nodes
        .iter_mut()
        .find(|n| Some(n.target.node.as_str()) == key.node.as_deref())
    else {
        return Ok(());
    };
    let n = Arc::make_mut(n);
    let blocked = match outcome {
        CommandOutcome::Drain {
            result: DrainOutcome::Blocked { pdb, pod, .. },
        } => Some(format!(
            "eviction of `{pod}` refused by PodDisruptionBudget `{pdb}`"
        )),
        _ => None,
    };
    // the volumes of the pods each drain evicted, from the node's cordon on (issue #48)
    match (key.op, outcome) {
        (CommandOp::Cordon, _) => {
            n.drain_volumes = Some(DrainVolumes::Known {
                volumes: Vec::new(),
            });
        }
        (
            CommandOp::Drain,
            CommandOutcome::Drain {
                result: DrainOutcome::Drained { volumes } | DrainOutcome::Blocked { volumes, .. },
            },
        ) => {
            if let Some(v) = n.drain_volumes.as_mut() {
                v.add(volumes.as_deref());
            }
        }
        (CommandOp::Drain, _) => n.drain_volumes = Some(DrainVolumes::Unknown),
        _ => {}
    }
    if n.rollback.is_some() {
        let next = match key.op {
            CommandOp::Cordon => Some(RollbackPhase::Cordoned),
            CommandOp::Drain if blocked.is_none() => Some(RollbackPhase::Drained),
            CommandOp::Rollback => Some(RollbackPhase::Rebooting),
            CommandOp::Uncordon => Some(RollbackPhase::Done),
            _ => None,
        };
        if let Some(p) = next {
            n.enter_rollback(p, now);
            notes.push(format!("{who}: {} done (rollback)", key.op));
            return Ok(());
        }
    }
    match (key.op, blocked) {
        (CommandOp::Pull, _) => n.enter(NodePhase::Pulled, now),
        (CommandOp::Cordon, _) => n.enter(NodePhase::Cordoned, now),
        (CommandOp::Drain, Some(why)) => {
            return drain_blocked(n, who, why, drain_timeout, now, notes);
        }
        (CommandOp::Drain, None) => n.enter(NodePhase::Drained, now),
        (CommandOp::Upgrade, _) => {
            let legacy = matches!(
                intent.action,
                Action::Upgrade {
                    method: UpgradeMethod::Legacy,
                    ..
                }
            );
            if rebooted || legacy {
                n.enter(NodePhase::Rebooting, now);
            } else {
                n.enter(NodePhase::Upgraded, now);
            }
        }
        (CommandOp::Reboot, _) => n.enter(NodePhase::Rebooting, now),
        (CommandOp::Uncordon, _) => n.enter(NodePhase::Done, now),
        _ => {}
    }
    notes.push(format!("{who}: {} done", key.op));
    Ok(())
}

/// A drain a PodDisruptionBudget refused (`why`): tried again after [`DRAIN_RETRY`] within the
/// drain timeout (from when the node was cordoned); past it, the halt. medea never forces an
/// eviction.
fn drain_blocked(
    n: &mut NodeProgress,
    who: &str,
    why: String,
    drain_timeout: Duration,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<(), HaltReason> {
    let deadline = add(n.since.unwrap_or(now), drain_timeout);
    if now >= deadline {
        return Err(HaltReason::new(
            HaltCode::DrainBlocked,
            format!(
                "drain of `{who}` timed out after {}s: {why}; medea never forces evictions",
                drain_timeout.as_secs()
            ),
        ));
    }
    n.attempt += 1;
    n.blocked = Some(why.clone());
    n.not_before = Some(add(now, DRAIN_RETRY).min(deadline));
    notes.push(format!("{who}: drain blocked: {why}"));
    Ok(())
}

/// A Kubernetes step's command took effect: its task is done (a control-plane component or
/// kubelet patch is `Applied`: verified next).
fn kube_done(k: &mut KubeStep, key: &CommandKey, now: Timestamp, notes: &mut Vec<String>) {
    let who = key.node.as_deref().unwrap_or("cluster");
    let Some(t) = current_task_mut(k) else {
        return;
    };
    match (key.op, t.op) {
        (CommandOp::Pull, KubeOp::Pull) | (CommandOp::ApplyManifests, KubeOp::Manifests) => {
            t.state = TaskState::Done;
        }
        (CommandOp::SetImage, KubeOp::Patch) => {
            t.state = if t.component == Some(Component::Proxy) {
                TaskState::Done
            } else {
                TaskState::Applied
            };
        }
        _ => return,
    }
    t.since = Some(now);
    t.attempt = 0;
    notes.push(format!("{who}: {} done", key.op));
}
