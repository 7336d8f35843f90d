//! Resolution: a command journaled without an outcome (a crash, a lost reply) is resolved by
//! observing the node, never by repeating it blindly.

use super::*;

pub(super) enum Resolution {
    /// The command took effect (`rebooted`: the node already rebooted since).
    Done {
        outcome: CommandOutcome,
        rebooted: bool,
    },
    /// It had no effect: issue it again (next attempt).
    Reissue,
    /// Cannot tell yet.
    Pending(PollWhy, String),
    Halt(HaltReason),
}

pub(super) fn resolve(j: &Job, intent: &Intent, eyes: &Eyes, now: Timestamp) -> Resolution {
    let _ = now;
    let done = Resolution::Done {
        outcome: CommandOutcome::Done,
        rebooted: false,
    };
    let away =
        |m: &str| Resolution::Pending(PollWhy::Unreachable, format!("cannot observe yet ({m})"));
    match &intent.action {
        Action::Pull { .. } | Action::Drain { .. } | Action::ApplyManifests { .. } => {
            // idempotent: doing it again is the same as doing it once
            Resolution::Reissue
        }
        Action::Snapshot { .. } => match eyes.snapshot() {
            Seen::Got(Some(info)) => Resolution::Done {
                outcome: CommandOutcome::Snapshot { info: info.clone() },
                rebooted: false,
            },
            Seen::Got(None) => Resolution::Reissue,
            Seen::Missing => {
                Resolution::Pending(PollWhy::Waiting, "observing the snapshot file".into())
            }
            Seen::Transient(m) => away(m),
            Seen::Failed(m) => Resolution::Halt(HaltReason::new(
                HaltCode::ObservationFailed,
                format!("cannot read the snapshot file: {m}"),
            )),
        },
        Action::Cordon { node } | Action::Uncordon { node } => {
            let want = matches!(intent.action, Action::Cordon { .. });
            match eyes.kube(node) {
                Seen::Got(k) if k.unschedulable == want => done,
                Seen::Got(_) => Resolution::Reissue,
                Seen::Missing => {
                    Resolution::Pending(PollWhy::Waiting, format!("observing `{node}`"))
                }
                Seen::Transient(m) => away(m),
                Seen::Failed(m) => Resolution::Halt(HaltReason::new(
                    HaltCode::ObservationFailed,
                    format!("cannot read Kubernetes node `{node}`: {m}"),
                )),
            }
        }
        Action::SetImage {
            node,
            component,
            image,
        } => match eyes.images(node) {
            Seen::Got(imgs) if imgs.get(component) == Some(image) => done,
            Seen::Got(_) => Resolution::Reissue,
            Seen::Missing => {
                Resolution::Pending(PollWhy::Waiting, format!("observing `{}`", node.node))
            }
            Seen::Transient(m) => away(m),
            Seen::Failed(m) => Resolution::Halt(HaltReason::new(
                HaltCode::ObservationFailed,
                format!("cannot read the machine config of `{}`: {m}", node.node),
            )),
        },
        Action::Upgrade {
            node,
            boot_id_before,
            ..
        } => {
            let to = match j.steps.get(intent.key.step).map(|s| &s.kind) {
                Some(StepKind::Talos(t)) => t.rollout.to.clone(),
                _ => {
                    return Resolution::Halt(HaltReason::new(
                        HaltCode::Inconsistent,
                        "an upgrade intent outside a Talos step",
                    ));
                }
            };
            match eyes.talos(node) {
                Seen::Got(t) => {
                    if &t.boot_id != boot_id_before || t.version == to {
                        // it rebooted since: the legacy upgrade ran (or a reboot happened); the
                        // post-reboot checks decide whether it took
                        Resolution::Done {
                            outcome: CommandOutcome::Done,
                            rebooted: true,
                        }
                    } else if t.next_boot == NextBoot::Version(to.clone()) {
                        done
                    } else if let NextBoot::Version(v) = &t.next_boot {
                        Resolution::Halt(HaltReason::new(
                            HaltCode::UnexpectedVersion,
                            format!(
                                "node `{}` has {v} staged for its next boot, not {to}",
                                node.node
                            ),
                        ))
                    } else if t.stage.in_transition() {
                        Resolution::Pending(
                            PollWhy::Waiting,
                            format!("`{}` is {:?}", node.node, t.stage),
                        )
                    } else if t.next_boot == NextBoot::Same {
                        Resolution::Reissue
                    } else {
                        Resolution::Halt(HaltReason::new(
                            HaltCode::OutcomeUnknown,
                            format!(
                                "cannot tell whether the upgrade of `{}` ran (the node does not report its next boot); check the node and plan again",
                                node.node
                            ),
                        ))
                    }
                }
                Seen::Missing => {
                    Resolution::Pending(PollWhy::Waiting, format!("observing `{}`", node.node))
                }
                Seen::Transient(m) => away(m),
                Seen::Failed(m) => Resolution::Halt(HaltReason::new(
                    HaltCode::ObservationFailed,
                    format!("cannot read node `{}`: {m}", node.node),
                )),
            }
        }
        // A second Rollback flips the A/B slot back: it is made again only when the node
        // proves the first left no trace (its next boot is still the running version).
        // Otherwise it is taken as made once the node rebooted (or is on its way), waited for
        // while the flipped slot is staged, and the job halts at the timeout.
        Action::Rollback {
            node,
            boot_id_before,
            to,
        } => match eyes.talos(node) {
            Seen::Got(t) if &t.boot_id != boot_id_before || t.stage.in_transition() => {
                Resolution::Done {
                    outcome: CommandOutcome::Done,
                    rebooted: true,
                }
            }
            Seen::Got(t) if t.next_boot == NextBoot::Same => Resolution::Reissue,
            Seen::Got(t) if t.next_boot == NextBoot::Version(to.clone()) => Resolution::Pending(
                PollWhy::Waiting,
                format!(
                    "`{}` has {to} staged by the journaled rollback and has not rebooted yet",
                    node.node
                ),
            ),
            Seen::Got(_) => Resolution::Pending(
                PollWhy::Waiting,
                format!(
                    "cannot tell whether the journaled rollback of `{}` was made (its next boot is unknown); it is never requested twice",
                    node.node
                ),
            ),
            Seen::Missing => {
                Resolution::Pending(PollWhy::Waiting, format!("observing `{}`", node.node))
            }
            Seen::Transient(m) => away(m),
            Seen::Failed(m) => Resolution::Halt(HaltReason::new(
                HaltCode::ObservationFailed,
                format!("cannot read node `{}`: {m}", node.node),
            )),
        },
        Action::Reboot {
            node,
            boot_id_before,
        } => match eyes.talos(node) {
            Seen::Got(t) if &t.boot_id != boot_id_before || t.stage.in_transition() => done,
            Seen::Got(_) => Resolution::Reissue,
            Seen::Missing => {
                Resolution::Pending(PollWhy::Waiting, format!("observing `{}`", node.node))
            }
            Seen::Transient(m) => away(m),
            Seen::Failed(m) => Resolution::Halt(HaltReason::new(
                HaltCode::ObservationFailed,
                format!("cannot read node `{}`: {m}", node.node),
            )),
        },
    }
}
