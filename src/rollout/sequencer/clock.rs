//! The job's clock (issue #51): what counts against the plan's predicted duration. The
//! prediction leaves maintenance windows and exclusions out ("windows aside", `plan::estimate`),
//! so the clock does too: it starts at the job's first command (a job approved on Monday for a
//! Saturday window has not started on Tuesday) and stands still while the job waits for a
//! window to open or an exclusion to end. Waiting for a node, a drain or a soak is work and
//! counts. The overdue event, the status line and the metrics' alerts all read [`JobClock`].

use super::*;

/// When the job's work began and how long it has stood still since, waiting for the calendar.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobClock {
    /// When the job journaled its first command; `None` before (the clock has not started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// Since when the job waits for a maintenance window or exclusion (the clock stands still).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_since: Option<Timestamp>,
    /// Seconds it stood still after it started, in waits that ended.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub paused_secs: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Where the clock stands at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockReading {
    /// No command yet: the job waits for its first window (or has not been driven yet).
    NotStarted,
    /// It runs: `active` counts against the prediction.
    Running {
        /// Time worked so far.
        active: Duration,
    },
    /// It stands still since `since`: the job waits for a window or an exclusion.
    Paused {
        /// Time worked so far (up to `since`).
        active: Duration,
        /// Since when it waits.
        since: Timestamp,
    },
}

impl ClockReading {
    /// The time worked so far (zero before the first command).
    pub fn active(self) -> Duration {
        match self {
            ClockReading::NotStarted => Duration::ZERO,
            ClockReading::Running { active } | ClockReading::Paused { active, .. } => active,
        }
    }
    /// Whether the clock runs (a paused or not-started job is never late).
    pub fn running(self) -> bool {
        matches!(self, ClockReading::Running { .. })
    }

    /// The status line's text against `bounds` (the CLI and the dashboard say it alike):
    /// `elapsed 12m00s, predicted median 10m00s, pessimistic 15m00s`, past the bound
    /// `…: past the pessimistic bound`, and while the job waits for the calendar, that it
    /// waits and that the clock stands still.
    pub fn progress(self, bounds: crate::plan::estimate::Bounds) -> String {
        match self {
            ClockReading::NotStarted => format!(
                "not started (the clock starts with the first command; waiting for a maintenance window does not count), predicted median {}, pessimistic {}",
                crate::plan::estimate::human(bounds.median_secs),
                crate::plan::estimate::human(bounds.pessimistic_secs)
            ),
            ClockReading::Running { active } => bounds.progress(active),
            ClockReading::Paused { active, since } => format!(
                "{}; waiting for a maintenance window or exclusion since {since}: the clock stands still",
                bounds.progress(active)
            ),
        }
    }

    /// The reading the API carries (`active_seconds`, `started_at`, `paused_since`): no start,
    /// not started; a pause time, paused.
    pub fn from_wire(
        active_secs: u64,
        started: bool,
        paused_since: Option<Timestamp>,
    ) -> ClockReading {
        let active = Duration::from_secs(active_secs);
        match (started, paused_since) {
            (false, _) => ClockReading::NotStarted,
            (true, Some(since)) => ClockReading::Paused { active, since },
            (true, None) => ClockReading::Running { active },
        }
    }
}

fn secs_between(from: Timestamp, to: Timestamp) -> u64 {
    Duration::try_from(to.duration_since(from))
        .unwrap_or_default()
        .as_secs()
}

impl JobClock {
    /// The reading at `now` (for a job that ended: at its end).
    pub fn at(&self, now: Timestamp) -> ClockReading {
        let Some(start) = self.started_at else {
            return ClockReading::NotStarted;
        };
        let until = self.paused_since.unwrap_or(now);
        let active = Duration::from_secs(
            secs_between(start, until.max(start)).saturating_sub(self.paused_secs),
        );
        match self.paused_since {
            Some(since) => ClockReading::Paused { active, since },
            None => ClockReading::Running { active },
        }
    }

    /// How long until a job with this clock passes `bounds`' pessimistic bound, counted at
    /// `now`: `Some(0)` when it has, `None` while the clock does not run (the answer can only
    /// change when the job changes).
    pub fn overdue_in(
        &self,
        bounds: crate::plan::estimate::Bounds,
        now: Timestamp,
    ) -> Option<Duration> {
        let ClockReading::Running { active } = self.at(now) else {
            return None;
        };
        Some(if bounds.overdue(active) {
            Duration::ZERO
        } else {
            Duration::from_secs(bounds.pessimistic_secs + 1).saturating_sub(active)
        })
    }
}

/// The clock of a job about to journal a command at `now`: started, if it was not.
pub(super) fn start(j: &mut Job, now: Timestamp) {
    if j.clock.started_at.is_none() {
        j.clock.started_at = Some(now);
    }
    resume(j, now);
}

fn resume(j: &mut Job, now: Timestamp) {
    if let Some(since) = j.clock.paused_since.take() {
        j.clock.paused_secs = j.clock.paused_secs.saturating_add(secs_between(since, now));
    }
}

/// After a decision at `now`: a started job whose next move is to wait for the calendar stands
/// still from now; any other move lets its clock run again.
pub(super) fn tick(j: &mut Job, next: &Next, now: Timestamp) {
    if j.clock.started_at.is_none() || j.state.is_terminal() {
        return resume(j, now);
    }
    match next {
        Next::WaitUntil { at, .. } if calendar_wait(j, *at, now) => {
            if j.clock.paused_since.is_none() {
                j.clock.paused_since = Some(now);
            }
        }
        _ => resume(j, now),
    }
}

/// Whether a wait until `at` is the calendar's: the maintenance windows are closed at `now`
/// and the next opens at `at`, or an exclusion holds a change at `now` and frees it at `at`.
/// (A soak or a drain retry that happens to end at that same second counts as the calendar's:
/// the job could not start a node before it anyway.)
fn calendar_wait(j: &Job, at: Timestamp, now: Timestamp) -> bool {
    if let Err(Flow::Wait(open, _)) = window_gate(j, now)
        && open == at
    {
        return true;
    }
    [Change::Patch, Change::Minor]
        .into_iter()
        .any(|c| holding(&j.exclusions, c, now).is_some() && free_from(&j.exclusions, c, now) == at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_clock_that_never_started_reads_not_started_and_is_never_overdue() {
        let c = JobClock::default();
        let b = crate::plan::estimate::Bounds {
            median_secs: 60,
            pessimistic_secs: 90,
        };
        assert_eq!(c.at(t("2026-12-07T00:00:00Z")), ClockReading::NotStarted);
        assert_eq!(c.overdue_in(b, t("2030-01-01T00:00:00Z")), None);
    }

    #[test]
    fn paused_time_does_not_count_and_a_paused_clock_is_never_overdue() {
        let c = JobClock {
            started_at: Some(t("2026-12-07T00:00:00Z")),
            paused_since: Some(t("2026-12-07T00:10:00Z")),
            paused_secs: 0,
        };
        let b = crate::plan::estimate::Bounds {
            median_secs: 300,
            pessimistic_secs: 450,
        };
        let r = c.at(t("2026-12-09T00:00:00Z"));
        assert_eq!(
            r,
            ClockReading::Paused {
                active: Duration::from_secs(600),
                since: t("2026-12-07T00:10:00Z")
            }
        );
        assert_eq!(c.overdue_in(b, t("2026-12-09T00:00:00Z")), None);
        let resumed = JobClock {
            paused_since: None,
            paused_secs: 2 * 86_400 - 600,
            ..c
        };
        // two days later, 10 minutes worked before the wait and 1 minute after
        assert_eq!(
            resumed.at(t("2026-12-09T00:01:00Z")),
            ClockReading::Running {
                active: Duration::from_secs(660)
            }
        );
        assert_eq!(
            resumed.overdue_in(b, t("2026-12-09T00:01:00Z")),
            Some(Duration::ZERO)
        );
    }
}
