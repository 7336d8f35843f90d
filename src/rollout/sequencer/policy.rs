//! The observation policy, once: what a decision does with an observation that is not a plain
//! value, and with anything it waits for until a deadline. Every decision reads its
//! observations through these helpers:
//!
//! - **missing**: poll; the observation is asked for and made at the next round
//!   ([`Seen::decide`], [`observed`]);
//! - **transient** (node rebooting, API away): what the caller's rule says; the common rule
//!   ([`need`]) polls with backoff until a deadline, then halts;
//! - **failed** (a definitive error): halt ([`read_failed`]);
//! - **late** (something on its way: a reboot, a pod restart, a drain): poll until the
//!   deadline, then halt ([`late`]).
//!
//! Two gatherings build on them: [`AskAll`] asks for every observation of a round before it
//! answers (a halt at once, else the first poll), and [`HealthCheck`] counts an unreadable
//! source as a failed check, never as a pass.

use super::*;

impl<'a, T> Seen<'a, T> {
    /// Not observed yet (asked for at the next round).
    pub(super) fn is_missing(&self) -> bool {
        matches!(self, Seen::Missing)
    }

    /// The value, or the caller's answer to its absence: `missing`, `transient` or `failed`.
    pub(super) fn decide<R>(
        self,
        missing: impl FnOnce() -> R,
        transient: impl FnOnce(&str) -> R,
        failed: impl FnOnce(&str) -> R,
    ) -> Result<&'a T, R> {
        match self {
            Seen::Got(t) => Ok(t),
            Seen::Missing => Err(missing()),
            Seen::Transient(m) => Err(transient(m)),
            Seen::Failed(m) => Err(failed(m)),
        }
    }
}

/// An observation of `what` a decision reads: missing is polled (`observing …`); a transient
/// error and a definitive failure give the flows the caller's rule gives ([`need`] is the
/// common rule; a node coming back treats a transient error as "not back yet").
pub(super) fn observed<'a, T>(
    s: Seen<'a, T>,
    what: &str,
    transient: impl FnOnce(&str) -> Flow,
    failed: impl FnOnce(&str) -> Flow,
) -> Result<&'a T, Flow> {
    s.decide(
        || Flow::Poll(PollWhy::Waiting, format!("observing {what}")),
        transient,
        failed,
    )
}

/// An observation that must be present to go on: unreachable is polled with backoff until
/// `deadline`, then halts; a definitive failure halts at once.
pub(super) fn need<'a, T>(
    s: Seen<'a, T>,
    what: &str,
    deadline: Timestamp,
    now: Timestamp,
    node: Option<&str>,
) -> Result<&'a T, Flow> {
    observed(
        s,
        what,
        |m| {
            late(
                now,
                deadline,
                || Flow::Poll(PollWhy::Unreachable, format!("{what} unreachable ({m})")),
                || {
                    halt_flow(
                        HaltCode::ObservationFailed,
                        format!("{what} stayed unreachable until the timeout ({m})"),
                        node,
                        None,
                    )
                },
            )
        },
        |m| read_failed(what, m, node, None),
    )
}

/// Something on its way: `poll` until `deadline`, then `halt`.
pub(super) fn late<R>(
    now: Timestamp,
    deadline: Timestamp,
    poll: impl FnOnce() -> R,
    halt: impl FnOnce() -> R,
) -> R {
    if now >= deadline { halt() } else { poll() }
}

/// The text of a definitive failure to read `what`.
pub(super) fn reading_failed(what: &str, m: &str) -> String {
    format!("reading {what} failed: {m}")
}

/// The halt for a definitive failure to read `what`.
pub(super) fn read_failed(what: &str, m: &str, node: Option<&str>, op: Option<CommandOp>) -> Flow {
    halt_flow(
        HaltCode::ObservationFailed,
        reading_failed(what, m),
        node,
        op,
    )
}

/// A round that asks for all its observations before it answers, so that one round observes
/// them all: a halt answers at once; otherwise the first poll, once everything was asked.
#[derive(Default)]
pub(super) struct AskAll {
    pending: Option<Flow>,
}

impl AskAll {
    /// The value of `r`, or `None` while the round waits for it; a halt is returned at once.
    pub(super) fn take<T>(&mut self, r: Result<T, Flow>) -> Result<Option<T>, Flow> {
        match r {
            Ok(t) => Ok(Some(t)),
            Err(f @ Flow::Halt { .. }) => Err(f),
            Err(f) => {
                self.pending.get_or_insert(f);
                Ok(None)
            }
        }
    }

    /// Everything asked: go on, or the first poll.
    pub(super) fn done(self) -> Result<(), Flow> {
        self.pending.map_or(Ok(()), Err)
    }
}

/// A health check over several sources: a missing observation is polled, and a source that
/// cannot be read (transient or failed) is a failed check, never a pass.
#[derive(Default)]
pub(super) struct HealthCheck {
    /// Some observation was missing: observe, then check again.
    pub(super) missing: bool,
    /// What is unhealthy, in words.
    pub(super) bad: Vec<String>,
}

impl HealthCheck {
    /// The value of `s`; a source that cannot be read is recorded as `unreadable` says.
    pub(super) fn read<'a, T>(
        &mut self,
        s: Seen<'a, T>,
        unreadable: impl Fn(&str) -> String,
    ) -> Option<&'a T> {
        match s.decide(|| None, |m| Some(unreadable(m)), |m| Some(unreadable(m))) {
            Ok(t) => Some(t),
            Err(None) => {
                self.missing = true;
                None
            }
            Err(Some(why)) => {
                self.bad.push(why);
                None
            }
        }
    }
}
