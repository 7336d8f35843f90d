//! Resolution: a command journaled without an outcome (a crash, a lost reply) is resolved by
//! observing the node, never by repeating it blindly.

use super::*;
use crate::version::TalosVersion;

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

/// The resolution's observation policy, once: the value, or what to do without it. Missing:
/// poll (`observing …`); unreachable: poll with backoff (the outcome may still be seen);
/// a definitive failure: halt (`cannot read …`).
fn look<'a, T>(s: Seen<'a, T>, observing: &str, read: &str) -> Result<&'a T, Resolution> {
    s.decide(
        || Resolution::Pending(PollWhy::Waiting, format!("observing {observing}")),
        |m| Resolution::Pending(PollWhy::Unreachable, format!("cannot observe yet ({m})")),
        |m| {
            Resolution::Halt(HaltReason::new(
                HaltCode::ObservationFailed,
                format!("cannot read {read}: {m}"),
            ))
        },
    )
}

/// The node of a Talos command, as resolution reads it.
fn node_of<'a>(eyes: &Eyes<'a>, node: &NodeTarget) -> Result<&'a TalosNode, Resolution> {
    look(
        eyes.talos(node),
        &format!("`{}`", node.node),
        &format!("node `{}`", node.node),
    )
}

const DONE: Resolution = Resolution::Done {
    outcome: CommandOutcome::Done,
    rebooted: false,
};

/// Taken as done, the node having rebooted since.
const REBOOTED: Resolution = Resolution::Done {
    outcome: CommandOutcome::Done,
    rebooted: true,
};

pub(super) fn resolve(j: &Job, intent: &Intent, eyes: &Eyes) -> Resolution {
    match &intent.action {
        // a hook whose result was lost runs again only when it is idempotent (issue #35)
        Action::Hook { .. } => hook_resolution(intent),
        Action::Silence { .. } | Action::Unsilence { .. } => {
            // a silence whose reply was lost is found by its marker and renewed (never made
            // twice); expiring one that is already expired is not an error
            Resolution::Reissue
        }
        Action::Stage { nodes } => resolve_stage(j, intent, nodes, eyes),
        Action::ForfeitLeadership { node } => resolve_forfeit(j, node, eyes),
        Action::Pull { .. } | Action::Drain { .. } | Action::ApplyManifests { .. } => {
            // idempotent: doing it again is the same as doing it once
            Resolution::Reissue
        }
        Action::Snapshot { .. } => {
            match look(eyes.snapshot(), "the snapshot file", "the snapshot file") {
                Ok(Some(info)) => Resolution::Done {
                    outcome: CommandOutcome::Snapshot { info: info.clone() },
                    rebooted: false,
                },
                Ok(None) => Resolution::Reissue,
                Err(r) => r,
            }
        }
        Action::Taint { node, .. } | Action::Untaint { node, .. } => {
            // idempotent both ways: taken as done when the node shows it, else made again
            let add = matches!(intent.action, Action::Taint { .. });
            match look(
                eyes.kube(node),
                &format!("`{node}`"),
                &format!("Kubernetes node `{node}`"),
            ) {
                Ok(k) if carries(j, &k.taints) == add => DONE,
                Ok(_) => Resolution::Reissue,
                Err(r) => r,
            }
        }
        Action::Cordon { node } | Action::Uncordon { node } => {
            let cordon = matches!(intent.action, Action::Cordon { .. });
            match look(
                eyes.kube(node),
                &format!("`{node}`"),
                &format!("Kubernetes node `{node}`"),
            ) {
                // cordoned, by this job or by someone else (whose cordon the end of the
                // node's cycle leaves, naming it)
                Ok(k) if cordon && k.unschedulable => DONE,
                // nothing of this job's cordon is left (issue #48: a cordon that is not the
                // job's is never lifted, so it is no reason to call again)
                Ok(k) if !cordon && !k.cordoned_by_job(j.id.as_str()) => DONE,
                Ok(_) => Resolution::Reissue,
                Err(r) => r,
            }
        }
        Action::SetImage {
            node,
            component,
            image,
        } => match look(
            eyes.images(node),
            &format!("`{}`", node.node),
            &format!("the machine config of `{}`", node.node),
        ) {
            Ok(imgs) if imgs.get(component) == Some(image) => DONE,
            Ok(_) => Resolution::Reissue,
            Err(r) => r,
        },
        Action::Upgrade {
            node,
            boot_id_before,
            ..
        } => match j.steps.get(intent.key.step).map(|s| &s.kind) {
            Some(StepKind::Talos(t)) => match node_of(eyes, node) {
                Ok(seen) => {
                    let installing = progress_of(j, intent.key.step, &node.node)
                        .is_some_and(|n| installing_now(n, seen));
                    upgrade(&node.node, seen, boot_id_before, &t.rollout.to, installing)
                }
                Err(r) => r,
            },
            _ => Resolution::Halt(HaltReason::new(
                HaltCode::Inconsistent,
                "an upgrade intent outside a Talos step",
            )),
        },
        Action::Rollback {
            node,
            boot_id_before,
            to,
        } => match node_of(eyes, node) {
            Ok(seen) => rollback(&node.node, seen, boot_id_before, to),
            Err(r) => r,
        },
        Action::Reboot {
            node,
            boot_id_before,
        } => match node_of(eyes, node) {
            Ok(t) if &t.boot_id != boot_id_before || t.stage.in_transition() => DONE,
            Ok(_) => Resolution::Reissue,
            Err(r) => r,
        },
    }
}

/// An Upgrade to `to` of node `name` (seen as `t`), journaled at boot `boot_id_before`. It is
/// issued again only when the node proves the first call left no trace (nothing staged, same
/// boot) and did not say an install was running there (`installing`: it stays so until its
/// next boot changes, issue #48).
fn upgrade(
    name: &str,
    t: &TalosNode,
    boot_id_before: &str,
    to: &TalosVersion,
    installing: bool,
) -> Resolution {
    if t.boot_id != boot_id_before || &t.version == to {
        // it rebooted since: the legacy upgrade ran (or a reboot happened); the
        // post-reboot checks decide whether it took
        REBOOTED
    } else if t.next_boot == NextBoot::Version(to.clone()) {
        DONE
    } else if let NextBoot::Version(v) = &t.next_boot {
        Resolution::Halt(HaltReason::new(
            HaltCode::UnexpectedVersion,
            format!("node `{name}` has {v} staged for its next boot, not {to}"),
        ))
    } else if t.stage.in_transition() {
        Resolution::Pending(PollWhy::Waiting, format!("`{name}` is {:?}", t.stage))
    } else if installing {
        Resolution::Pending(PollWhy::Waiting, still_installing(name))
    } else if t.next_boot == NextBoot::Same {
        Resolution::Reissue
    } else {
        Resolution::Halt(HaltReason::new(
            HaltCode::OutcomeUnknown,
            format!(
                "cannot tell whether the upgrade of `{name}` ran (the node does not report its next boot); check the node and plan again"
            ),
        ))
    }
}

/// Why an open install is waited for rather than made again.
pub(super) fn still_installing(name: &str) -> String {
    format!(
        "`{name}` said an install is running on it; waiting for its next boot to change (never installed twice)"
    )
}

/// A second Rollback flips the A/B slot back: it is made again only when the node proves the
/// first left no trace (its next boot is still the running version). Otherwise it is taken as
/// made once the node rebooted (or is on its way), waited for while the flipped slot is
/// staged, and the job halts at the timeout.
fn rollback(name: &str, t: &TalosNode, boot_id_before: &str, to: &TalosVersion) -> Resolution {
    if t.boot_id != boot_id_before || t.stage.in_transition() {
        REBOOTED
    } else if t.next_boot == NextBoot::Same {
        Resolution::Reissue
    } else if t.next_boot == NextBoot::Version(to.clone()) {
        Resolution::Pending(
            PollWhy::Waiting,
            format!("`{name}` has {to} staged by the journaled rollback and has not rebooted yet"),
        )
    } else {
        Resolution::Pending(
            PollWhy::Waiting,
            format!(
                "cannot tell whether the journaled rollback of `{name}` was made (its next boot is unknown); it is never requested twice"
            ),
        )
    }
}
