//! Maintenance windows: a cron start, a duration and an IANA time zone.
//!
//! Pure: the current time is an argument. The time zone database is compiled in (jiff's bundled
//! tzdb), so a window means the same on every host, including minimal containers.

use std::time::Duration;

use jiff::Timestamp;
use jiff::tz::TimeZone;

/// Longest window accepted: a week (a longer window is "always").
pub const MAX_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// Why a maintenance window (`start`, `duration`, `timeZone`) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// The `start` is not a valid 5-field cron expression.
    #[error(
        "window start `{input}` is not a 5-field cron expression (minute hour day-of-month month day-of-week, e.g. `0 2 * * 6`): {reason}"
    )]
    Cron {
        /// The `start` value as written.
        input: String,
        /// What the cron parser objected to.
        reason: String,
    },
    /// The `timeZone` is not a known IANA zone name.
    #[error("unknown time zone `{input}`: use an IANA name such as `Europe/Berlin` or `UTC`")]
    TimeZone {
        /// The `timeZone` value as written.
        input: String,
    },
    /// The duration is under one minute or over seven days.
    #[error("window duration must be between 1m and 7 days")]
    Duration,
}

/// A recurring maintenance window: a 5-field cron start, a duration, in an IANA time zone.
#[derive(Debug, Clone)]
pub struct MaintenanceWindow {
    cron: croner::Cron,
    start_text: String,
    duration: Duration,
    zone: TimeZone,
    zone_name: String,
}

impl PartialEq for MaintenanceWindow {
    fn eq(&self, other: &Self) -> bool {
        self.start_text == other.start_text
            && self.duration == other.duration
            && self.zone_name == other.zone_name
    }
}

/// What is wrong with a cron expression read in a time zone; the caller names the field.
pub(crate) enum CronInZoneError {
    /// Not 5 fields, or refused by the cron parser (the reason).
    Cron(String),
    /// Not a known IANA zone name.
    TimeZone,
}

/// A 5-field cron expression (minute hour day-of-month month day-of-week) read in an IANA time
/// zone: the one rule maintenance windows and backup schedules (`desired::backup`) follow.
pub(crate) fn cron_in_zone(
    expr: &str,
    zone: &str,
) -> Result<(croner::Cron, TimeZone), CronInZoneError> {
    let fields = expr.split_whitespace().count();
    if fields != 5 {
        return Err(CronInZoneError::Cron(format!("found {fields} fields")));
    }
    let cron: croner::Cron = expr
        .parse()
        .map_err(|e: croner::errors::CronError| CronInZoneError::Cron(e.to_string()))?;
    let tz = TimeZone::get(zone).map_err(|_| CronInZoneError::TimeZone)?;
    Ok((cron, tz))
}

impl MaintenanceWindow {
    /// Check and build a window; the cron expression must have exactly 5 fields and the
    /// duration lie between 1 minute and 7 days.
    pub fn new(
        start: &str,
        duration: Duration,
        zone: &str,
    ) -> Result<MaintenanceWindow, WindowError> {
        let (cron, tz) = cron_in_zone(start, zone).map_err(|e| match e {
            CronInZoneError::Cron(reason) => WindowError::Cron {
                input: start.to_string(),
                reason,
            },
            CronInZoneError::TimeZone => WindowError::TimeZone {
                input: zone.to_string(),
            },
        })?;
        if duration < Duration::from_secs(60) || duration > MAX_WINDOW {
            return Err(WindowError::Duration);
        }
        Ok(MaintenanceWindow {
            cron,
            start_text: start.to_string(),
            duration,
            zone: tz,
            zone_name: zone.to_string(),
        })
    }

    /// The cron start as written in the YAML, e.g. `0 2 * * 6`.
    pub fn start(&self) -> &str {
        &self.start_text
    }
    /// How long each occurrence stays open.
    pub fn duration(&self) -> Duration {
        self.duration
    }
    /// The IANA time zone name the cron start is read in, e.g. `Europe/Berlin`.
    pub fn time_zone(&self) -> &str {
        &self.zone_name
    }

    /// Whether `now` falls inside an occurrence of this window: the latest start at or before
    /// `now` is less than `duration` ago.
    pub fn contains(&self, now: Timestamp) -> bool {
        let zoned = now.to_zoned(self.zone.clone());
        match self.cron.find_previous_occurrence(&zoned, true) {
            Ok(start) => {
                let elapsed = now.duration_since(start.timestamp());
                !elapsed.is_negative() && elapsed.unsigned_abs() < self.duration
            }
            Err(_) => false,
        }
    }

    /// The next start strictly after `now`, if the expression ever fires again.
    pub fn next_start(&self, now: Timestamp) -> Option<Timestamp> {
        let zoned = now.to_zoned(self.zone.clone());
        self.cron
            .find_next_occurrence(&zoned, false)
            .ok()
            .map(|z| z.timestamp())
    }
}

/// Whether `now` is inside any of `windows`; no windows means always open.
pub fn open_at(windows: &[MaintenanceWindow], now: Timestamp) -> bool {
    windows.is_empty() || windows.iter().any(|w| w.contains(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn saturday_night_in_berlin() {
        // Saturdays 02:00 Europe/Berlin for 4h. 2026-12-05 is a Saturday (CET = UTC+1).
        let w = MaintenanceWindow::new("0 2 * * 6", Duration::from_secs(4 * 3600), "Europe/Berlin")
            .unwrap();
        assert!(
            !w.contains(ts("2026-12-05T00:59:00Z")),
            "01:59 local: before"
        );
        assert!(w.contains(ts("2026-12-05T01:00:00Z")), "02:00 local: opens");
        assert!(
            w.contains(ts("2026-12-05T04:59:59Z")),
            "05:59:59 local: inside"
        );
        assert!(
            !w.contains(ts("2026-12-05T05:00:00Z")),
            "06:00 local: closed"
        );
        assert!(!w.contains(ts("2026-12-06T02:00:00Z")), "Sunday: closed");
        assert_eq!(
            w.next_start(ts("2026-12-02T12:00:00Z")),
            Some(ts("2026-12-05T01:00:00Z"))
        );
        assert!(open_at(&[], ts("2026-12-02T12:00:00Z")));
        assert!(!open_at(&[w], ts("2026-12-02T12:00:00Z")));
    }

    #[test]
    fn refuses_bad_windows() {
        let h = Duration::from_secs(3600);
        assert!(matches!(
            MaintenanceWindow::new("0 2 * *", h, "UTC"),
            Err(WindowError::Cron { .. })
        ));
        assert!(matches!(
            MaintenanceWindow::new("0 25 * * *", h, "UTC"),
            Err(WindowError::Cron { .. })
        ));
        assert!(matches!(
            MaintenanceWindow::new("0 2 * * 6", h, "Mars/Olympus"),
            Err(WindowError::TimeZone { .. })
        ));
        assert!(matches!(
            MaintenanceWindow::new("0 2 * * 6", Duration::from_secs(30), "UTC"),
            Err(WindowError::Duration)
        ));
    }
}
