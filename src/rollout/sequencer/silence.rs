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
    talos_of(j, si).rollout.silence.as_deref()
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
            alertmanager: Box::new(p.alertmanager.clone()),
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
/// what it needs (a lease from now, plus the drain timeout while a drain — one long call during
/// which nothing is renewed — is next), never past `maxDuration`, and not before a failed
/// renewal's retry time.
pub(super) fn silence_renewal(j: &Job, si: usize, i: usize, now: Timestamp) -> Option<Flow> {
    let ts = talos_of(j, si);
    let busy = if ts.nodes[i].phase == NodePhase::Cordoned {
        ts.rollout.drain_timeout
    } else {
        Duration::ZERO
    };
    renewal_covering(j, si, i, now, busy)
}

/// Before `flow` runs a blocking hook in step `si` (one call that may take the hook's whole
/// timeout, during which nothing is renewed; issue #51): the renewal of the first silence of a
/// node still away that would lapse before the hook's timeout plus half a lease, to cover the
/// hook's timeout and a lease (never past `maxDuration`). Any other flow, or nothing to
/// renew: `flow`.
pub(super) fn cover_hook(j: &Job, si: usize, flow: Flow, now: Timestamp) -> Flow {
    let Flow::Run(cmd) = &flow else { return flow };
    let Action::Hook { hook, .. } = &cmd.action else {
        return flow;
    };
    let busy = hook.timeout;
    let renewal = (0..talos_of(j, si).nodes.len())
        .filter(|&i| !talos_of(j, si).nodes[i].phase.finished())
        .find_map(|i| renewal_covering(j, si, i, now, busy));
    renewal.unwrap_or(flow)
}

/// The one renewal rule: node `i`'s active silence is renewed at `now` when less than half a
/// lease is left of what it needs — a lease from now plus `busy` (a long call coming up) — to
/// that, never past `since + maxDuration`, and not before a failed renewal's retry time.
fn renewal_covering(j: &Job, si: usize, i: usize, now: Timestamp, busy: Duration) -> Option<Flow> {
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
    let target = add(now, p.lease + busy).min(add(since, p.max_duration));
    if add(ends_at, p.lease / 2) > target {
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
        CommandOutcome::Transient { error } | CommandOutcome::Failed { error, .. } => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::health::Endpoint;
    use crate::version::TalosVersion;

    const LEASE: Duration = Duration::from_secs(300);

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn job(on_error: SilenceOnError) -> Job {
        let v = |s| TalosVersion::parse(s).unwrap();
        let rollout = TalosRollout {
            stage: None,
            pool: "workers".into(),
            role: crate::inventory::MachineRole::Worker,
            hop: 1,
            hops: 1,
            to: v("v1.13.9"),
            image: "factory.talos.dev/installer/x:v1.13.9".into(),
            max_unavailable: 1,
            drain_timeout: Duration::from_secs(600),
            health_timeout: Duration::from_secs(900),
            upgrade_attempts: 1,
            drain: DrainPolicy::default(),
            taint_next_wave: true,
            waves: vec![vec![MachineTarget {
                node: "w.1".into(),
                id: "id-w1".into(),
                address: "10.0.0.21".into(),
                from: v("v1.12.4"),
                image: None,
            }]],
            health: None,
            silence: Some(Box::new(SilencePolicy {
                alertmanager: Endpoint {
                    url: "http://127.0.0.1:9093".into(),
                    credential: None,
                },
                matchers: vec![r#"alertname="NodeDown""#.into()],
                node_label: "instance".into(),
                lease: LEASE,
                max_duration: Duration::from_secs(3600),
                on_error,
            })),
            hooks: None,
        };
        let plan = PlanId::from_digest([9; 32]);
        Job::one_talos_step(plan, t("2026-12-06T00:00:00Z"), StepState::Running, rollout)
    }

    fn run(f: Option<Flow>) -> Command {
        match f {
            Some(Flow::Run(c)) => *c,
            _ => panic!("expected a command"),
        }
    }

    fn answer(j: &mut Job, cmd: &Command, outcome: CommandOutcome, now: Timestamp) {
        let intent = Intent {
            key: cmd.key.clone(),
            action: cmd.action.clone(),
            issued_at: now,
            last_error: None,
        };
        silence_outcome(j, &intent, &outcome, now, &mut Vec::new());
    }

    #[test]
    fn a_lease_is_made_renewed_at_half_capped_and_expired_once_done() {
        let mut j = job(SilenceOnError::Halt);
        let t0 = t("2026-12-06T01:00:00Z");
        let cmd = run(silence_before_cordon(&j, 0, 0, t0));
        let Action::Silence {
            id,
            matchers,
            ends_at,
            comment,
            marker,
            ..
        } = &cmd.action
        else {
            panic!("{cmd:?}")
        };
        assert_eq!(*id, None);
        assert_eq!(*ends_at, add(t0, LEASE));
        assert_eq!(matchers.len(), 2);
        assert_eq!(matchers[1].name, "instance");
        assert_eq!(matchers[1].value, r"w\.1(:[0-9]+)?");
        assert!(comment.contains("w.1") && comment.contains("medea") && comment.ends_with(marker));
        answer(
            &mut j,
            &cmd,
            CommandOutcome::Silenced { id: "s1".into() },
            t0,
        );
        assert!(silence_before_cordon(&j, 0, 0, t0).is_none(), "made once");

        // away (drained): no renewal while more than half a lease is left
        node_mut(&mut j, 0, 0).enter(NodePhase::Drained, t0);
        assert!(silence_renewal(&j, 0, 0, add(t0, LEASE / 2 - Duration::from_secs(1))).is_none());
        let t1 = add(t0, LEASE / 2);
        let cmd = run(silence_renewal(&j, 0, 0, t1));
        assert!(
            matches!(&cmd.action, Action::Silence { id: Some(id), ends_at, .. } if id == "s1" && *ends_at == add(t1, LEASE)),
            "{cmd:?}"
        );
        answer(
            &mut j,
            &cmd,
            CommandOutcome::Silenced { id: "s1".into() },
            t1,
        );

        // before a drain the lease covers the drain's timeout too
        node_mut(&mut j, 0, 0).enter(NodePhase::Cordoned, t1);
        let cmd = run(silence_renewal(&j, 0, 0, t1));
        assert!(
            matches!(&cmd.action, Action::Silence { ends_at, .. } if *ends_at == add(t1, LEASE + Duration::from_secs(600))),
            "{cmd:?}"
        );

        // never past maxDuration from the start: the last renewal stops there, then none
        node_mut(&mut j, 0, 0).enter(NodePhase::Rebooting, t1);
        let late = add(t0, Duration::from_secs(3600 - 200));
        let cmd = run(silence_renewal(&j, 0, 0, late));
        let cap = add(t0, Duration::from_secs(3600));
        assert!(
            matches!(&cmd.action, Action::Silence { ends_at, .. } if *ends_at == cap),
            "{cmd:?}"
        );
        answer(
            &mut j,
            &cmd,
            CommandOutcome::Silenced { id: "s2".into() },
            late,
        );
        assert!(silence_renewal(&j, 0, 0, add(late, Duration::from_secs(100))).is_none());
        assert!(
            silence_renewal(&j, 0, 0, cap).is_none(),
            "a stuck node pages again"
        );

        // a failed renewal keeps the lease and waits before trying again
        let mut k = job(SilenceOnError::Halt);
        node_mut(&mut k, 0, 0).silence = Some(NodeSilence::Active {
            id: "s9".into(),
            since: t0,
            ends_at: add(t0, LEASE),
            renewals: 0,
            retry_at: None,
        });
        node_mut(&mut k, 0, 0).enter(NodePhase::Rebooting, t0);
        let cmd = run(silence_renewal(&k, 0, 0, t1));
        answer(
            &mut k,
            &cmd,
            CommandOutcome::Transient {
                error: "connection refused".into(),
            },
            t1,
        );
        assert!(k.state == JobState::Running, "a renewal never halts");
        assert!(silence_renewal(&k, 0, 0, t1).is_none());
        assert!(silence_renewal(&k, 0, 0, add(t1, SILENCE_RENEW_RETRY)).is_some());

        // done: the silence (now s2, as Alertmanager answered) expires, once
        node_mut(&mut j, 0, 0).enter(NodePhase::Done, late);
        let cmd = run(unsilence_finished(&j, 0));
        assert!(
            matches!(&cmd.action, Action::Unsilence { id, .. } if id == "s2"),
            "{cmd:?}"
        );
        answer(&mut j, &cmd, CommandOutcome::Done, late);
        assert!(unsilence_finished(&j, 0).is_none());
        assert!(matches!(
            &talos_of(&j, 0).nodes[0].silence,
            Some(NodeSilence::Ended { id: Some(id), .. }) if id == "s2"
        ));
    }

    #[test]
    fn a_refused_silence_halts_or_with_proceed_goes_on_unsilenced() {
        let t0 = t("2026-12-06T01:00:00Z");
        for on_error in [SilenceOnError::Halt, SilenceOnError::Proceed] {
            let mut j = job(on_error);
            let cmd = run(silence_before_cordon(&j, 0, 0, t0));
            answer(
                &mut j,
                &cmd,
                CommandOutcome::Failed {
                    error: "HTTP 400".into(),
                    refusal: None,
                },
                t0,
            );
            match on_error {
                SilenceOnError::Halt => assert!(
                    matches!(&j.state, JobState::Halted { reason, op: Some(CommandOp::Silence), .. } if reason.code() == HaltCode::SilenceRefused),
                    "{:?}",
                    j.state
                ),
                SilenceOnError::Proceed => {
                    assert_eq!(j.state, JobState::Running);
                    assert!(silence_before_cordon(&j, 0, 0, t0).is_none(), "asked once");
                    assert!(unsilence_finished(&j, 0).is_none());
                }
            }
        }
    }

    /// Issue #51: a blocking hook is one long call; before it runs, a silence that would lapse
    /// during it is renewed to cover the hook's timeout and a lease (capped by maxDuration).
    #[test]
    fn a_silence_is_renewed_to_cover_a_long_hook() {
        use crate::desired::hooks::{Hook, HookAction, HookPoint};
        let mut j = job(SilenceOnError::Halt);
        let t0 = t("2026-12-06T01:00:00Z");
        node_mut(&mut j, 0, 0).silence = Some(NodeSilence::Active {
            id: "s1".into(),
            since: t0,
            ends_at: add(t0, LEASE),
            renewals: 0,
            retry_at: None,
        });
        node_mut(&mut j, 0, 0).enter(NodePhase::Rebooting, t0);
        let hook = |secs: u64| {
            Flow::Run(Box::new(Command {
                key: key(&j, 0, None, CommandOp::Hook, 1),
                action: Action::Hook {
                    point: HookPoint::AfterWave,
                    site: "0/afterWave/wave-1/ceph".into(),
                    run_id: "medea-hook-1".into(),
                    pool: Some("workers".into()),
                    node: None,
                    wave: Some(1),
                    hook: Box::new(Hook {
                        name: "ceph".into(),
                        timeout: Duration::from_secs(secs),
                        idempotent: false,
                        action: HookAction::Http {
                            url: "https://hooks.example/medea".into(),
                            credential: None,
                        },
                    }),
                },
            }))
        };
        // a 20-minute hook: renewed first, to cover it and a lease
        let f = cover_hook(&j, 0, hook(1200), t0);
        let Flow::Run(cmd) = f else {
            panic!("expected a command")
        };
        assert!(
            matches!(&cmd.action, Action::Silence { id: Some(id), ends_at, .. } if id == "s1" && *ends_at == add(t0, LEASE + Duration::from_secs(1200))),
            "{cmd:?}"
        );
        // never past maxDuration (1 h) from the silence's start
        let f = cover_hook(&j, 0, hook(7200), t0);
        let Flow::Run(cmd) = f else {
            panic!("expected a command")
        };
        assert!(
            matches!(&cmd.action, Action::Silence { ends_at, .. } if *ends_at == add(t0, Duration::from_secs(3600))),
            "{cmd:?}"
        );
        // a hook shorter than what is left of the lease runs at once
        let f = cover_hook(&j, 0, hook(10), t0);
        assert!(
            matches!(&f, Flow::Run(c) if matches!(c.action, Action::Hook { .. })),
            "the hook itself"
        );
        // any other command passes through
        let other = silence_before_cordon(&job(SilenceOnError::Halt), 0, 0, t0).unwrap();
        assert!(matches!(
            cover_hook(&j, 0, other, t0),
            Flow::Run(c) if matches!(c.action, Action::Silence { id: None, .. })
        ));
    }
}
