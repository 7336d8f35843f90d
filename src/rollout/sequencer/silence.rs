//! Silences as a lease (issue #35 item 1): while a node of a Talos step is drained and
//! rebooted, the alerts its step is expected to cause are silenced in the cluster's
//! Alertmanager by a short silence that medea keeps renewing, capped by `maxDuration`, and
//! expires once the node is back and uncordoned. A medea that dies leaves a silence that
//! lapses by itself within its lease.
//!
//! The decisions here are pure: when to create, renew or expire, and what an answer does to
//! the node. The executor journals each call as an intent first; a create whose reply was
//! lost is found again by the marker in its comment and renewed, never made twice.

use super::*;
use crate::plan::health::{SilenceOnError, SilencePolicy};

/// A renewal that failed is tried again after this long (the silence lapses at its end if
/// every renewal fails).
pub const SILENCE_RENEW_RETRY: Duration = Duration::from_secs(15);

fn policy(j: &Job, si: usize) -> Option<&SilencePolicy> {
    talos_of(j, si).rollout.silence.as_ref()
}

/// The marker of node `node`'s silence in step `si` of job `j` (in its comment).
pub fn silence_marker(j: &Job, si: usize, node: &str) -> String {
    format!("[medea:{}/{si}/{node}]", j.id)
}

fn comment(j: &Job, si: usize, node: &str) -> String {
    let ts = talos_of(j, si);
    format!(
        "medea job {} drains and reboots node {node} (pool {}, Talos {}): its expected alerts are silenced while it is away; the silence lapses unless medea renews it {}",
        j.id,
        ts.rollout.pool,
        ts.rollout.to,
        silence_marker(j, si, node)
    )
}

/// When node `i`'s silence should end if renewed at `now`: a lease from now, plus the drain
/// timeout while a drain (one long call, during which nothing is renewed) is next; never
/// past `maxDuration` from its start.
fn wanted_end(j: &Job, si: usize, i: usize, since: Timestamp, now: Timestamp) -> Option<Timestamp> {
    let p = policy(j, si)?;
    let ts = talos_of(j, si);
    let busy = if ts.nodes[i].phase == NodePhase::Cordoned {
        ts.rollout.drain_timeout
    } else {
        Duration::ZERO
    };
    Some(add(now, p.lease + busy).min(add(since, p.max_duration)))
}

fn silence_command(
    j: &Job,
    si: usize,
    i: usize,
    id: Option<String>,
    ends_at: Timestamp,
    attempt: u32,
) -> Flow {
    let Some(p) = policy(j, si) else {
        return Flow::Done;
    };
    let node = talos_of(j, si).nodes[i].target.node.clone();
    let matchers = match p.matchers_for(&node) {
        Ok(m) => m,
        Err(why) => {
            return halt_flow(
                HaltCode::Inconsistent,
                format!("the plan's silence of `{node}` cannot be made: {why}"),
                Some(&node),
                Some(CommandOp::Silence),
            );
        }
    };
    Flow::Run(Box::new(Command {
        key: key(j, si, Some(&node), CommandOp::Silence, attempt),
        action: Action::Silence {
            node: node.clone(),
            alertmanager: p.alertmanager.clone(),
            id,
            matchers,
            ends_at,
            comment: comment(j, si, &node),
            marker: silence_marker(j, si, &node),
        },
    }))
}

/// Before node `i` is cordoned: its silence, when the step has a policy and the node has
/// none yet.
pub(super) fn silence_before_cordon(j: &Job, si: usize, i: usize, now: Timestamp) -> Option<Flow> {
    let p = policy(j, si)?;
    if talos_of(j, si).nodes[i].silence.is_some() {
        return None;
    }
    let ends_at = add(now, p.lease.min(p.max_duration));
    Some(silence_command(j, si, i, None, ends_at, 0))
}

/// While node `i` is away: the renewal of its silence once less than half a lease is left of
/// what it needs (a lease from now, the drain's timeout before a drain), never past
/// `maxDuration`, and not before a failed renewal's retry time.
pub(super) fn silence_renewal(j: &Job, si: usize, i: usize, now: Timestamp) -> Option<Flow> {
    let p = policy(j, si)?;
    let Some(NodeSilence::Active {
        id,
        since,
        ends_at,
        renewals,
        retry_at,
    }) = talos_of(j, si).nodes[i].silence.clone()
    else {
        return None;
    };
    if retry_at.is_some_and(|r| now < r) {
        return None;
    }
    let target = wanted_end(j, si, i, since, now)?;
    let half = p.lease / 2;
    if add(ends_at, half) > target {
        return None;
    }
    Some(silence_command(j, si, i, Some(id), target, renewals + 1))
}

/// The expiry of the silence of a node of step `si` that finished (back and uncordoned, or
/// left cordoned as found).
pub(super) fn unsilence_finished(j: &Job, si: usize) -> Option<Flow> {
    let p = policy(j, si)?;
    let ts = talos_of(j, si);
    ts.nodes.iter().find_map(|n| match &n.silence {
        Some(NodeSilence::Active { id, renewals, .. }) if n.phase.finished() => {
            Some(Flow::Run(Box::new(Command {
                key: key(j, si, Some(&n.target.node), CommandOp::Unsilence, *renewals),
                action: Action::Unsilence {
                    node: n.target.node.clone(),
                    alertmanager: p.alertmanager.clone(),
                    id: id.clone(),
                },
            })))
        }
        _ => None,
    })
}

/// Apply the answer to a silence or unsilence command. Nothing stays in flight: a create
/// whose reply was lost is found by its marker when it is made again, and a silence medea
/// cannot renew or expire lapses by itself at its end.
pub(super) fn silence_outcome(
    j: &mut Job,
    intent: &Intent,
    outcome: &CommandOutcome,
    now: Timestamp,
    notes: &mut Vec<String>,
) {
    j.in_flight = None;
    let key = &intent.key;
    let Some(node) = key.node.clone() else {
        return;
    };
    let Some(StepKind::Talos(ts)) = j.steps.get(key.step).map(|s| &s.kind) else {
        return;
    };
    let Some(i) = ts.nodes.iter().position(|n| n.target.node == node) else {
        return;
    };
    let on_error = ts
        .rollout
        .silence
        .as_ref()
        .map(|p| p.on_error)
        .unwrap_or_default();
    let error = match outcome {
        CommandOutcome::Transient { error } | CommandOutcome::Failed { error } => {
            Some(error.clone())
        }
        _ => None,
    };
    let current = ts.nodes[i].silence.clone();
    match (&intent.action, error) {
        (Action::Silence { ends_at, .. }, None) => {
            let CommandOutcome::Silenced { id } = outcome else {
                notes.push(format!("{key}: unexpected answer {outcome:?}"));
                return;
            };
            let next = match current {
                Some(NodeSilence::Active {
                    since, renewals, ..
                }) => {
                    notes.push(format!("{node}: silence {id} renewed until {ends_at}"));
                    NodeSilence::Active {
                        id: id.clone(),
                        since,
                        ends_at: *ends_at,
                        renewals: renewals + 1,
                        retry_at: None,
                    }
                }
                _ => {
                    notes.push(format!(
                        "{node}: expected alerts silenced until {ends_at} (silence {id})"
                    ));
                    NodeSilence::Active {
                        id: id.clone(),
                        since: intent.issued_at,
                        ends_at: *ends_at,
                        renewals: 0,
                        retry_at: None,
                    }
                }
            };
            node_mut(j, key.step, i).silence = Some(next);
        }
        (Action::Silence { .. }, Some(error)) => match current {
            Some(NodeSilence::Active {
                id,
                since,
                ends_at,
                renewals,
                ..
            }) => {
                notes.push(format!(
                    "{node}: renewing silence {id} failed ({error}); it lapses at {ends_at} unless a later renewal succeeds"
                ));
                node_mut(j, key.step, i).silence = Some(NodeSilence::Active {
                    id,
                    since,
                    ends_at,
                    renewals,
                    retry_at: Some(add(now, SILENCE_RENEW_RETRY)),
                });
            }
            _ => match on_error {
                SilenceOnError::Halt => {
                    let reason = HaltReason::new(
                        HaltCode::SilenceRefused,
                        format!(
                            "Alertmanager did not silence the expected alerts of `{node}`: {error}; the node was not cordoned (health.silence.onError: halt)"
                        ),
                    );
                    notes.push(format!("halted: {reason}"));
                    j.state = JobState::Halted {
                        reason,
                        step: Some(key.step),
                        node: Some(node.clone()),
                        op: Some(CommandOp::Silence),
                        at: now,
                    };
                }
                SilenceOnError::Proceed => {
                    notes.push(format!(
                        "{node}: Alertmanager did not silence its expected alerts ({error}); it goes on unsilenced (health.silence.onError: proceed)"
                    ));
                    node_mut(j, key.step, i).silence = Some(NodeSilence::Ended {
                        id: None,
                        how: format!("refused: {error}; the node went on unsilenced"),
                    });
                }
            },
        },
        (Action::Unsilence { id, .. }, error) => {
            let ends_at = match &current {
                Some(NodeSilence::Active { ends_at, .. }) => Some(*ends_at),
                _ => None,
            };
            let how = match (error, ends_at) {
                (None, _) => {
                    notes.push(format!("{node}: silence {id} expired"));
                    "expired by medea once the node was back".to_string()
                }
                (Some(e), at) => {
                    let at = at.map_or_else(|| "its end".to_string(), |t| t.to_string());
                    notes.push(format!(
                        "{node}: expiring silence {id} failed ({e}); it lapses at {at}"
                    ));
                    format!("expiring failed ({e}); left to lapse at {at}")
                }
            };
            node_mut(j, key.step, i).silence = Some(NodeSilence::Ended {
                id: Some(id.clone()),
                how,
            });
        }
        _ => {}
    }
}
