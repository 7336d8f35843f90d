//! Scheduled etcd backups in the desired state (issue #37): `spec.backup` of a Cluster, its
//! validation, and the pure schedule arithmetic the server's backup task asks ("is a backup
//! due, and for which slot?"). Pure: the current time is an argument.
//!
//! The schedule is read with the same rules as maintenance windows ([`super::window`]): a
//! 5-field cron expression in an IANA time zone (default `UTC`), jiff's bundled tzdb.
//! `destination` is a *name* the server maps to a place it owns (the built-in `local` is
//! `<state-dir>/backups/<cluster>/`); the desired state never names a path.

use std::str::FromStr as _;
use std::time::Duration;

use jiff::Timestamp;
use jiff::tz::TimeZone;

use super::diagnostic::{Diagnostic, codes};
use super::format::BackupSpec;
use super::parse::DocText;

/// `retention.keep` when the Cluster does not say.
pub const DEFAULT_KEEP: u32 = 7;
/// The destination a Cluster gets when it names none: `<state-dir>/backups/<cluster>/`.
pub const DEFAULT_DESTINATION: &str = "local";
/// Most recipients one backup may be encrypted to.
pub const MAX_RECIPIENTS: usize = 16;
/// The shortest time between two scheduled backups (issue #50): a full etcd snapshot each
/// time, and a schedule a committer could set to every minute.
pub const MIN_BACKUP_INTERVAL: Duration = Duration::from_secs(15 * 60);
/// Largest `retention.keep` accepted.
pub const MAX_KEEP: u32 = 1000;

/// A Cluster's validated `spec.backup`.
#[derive(Debug, Clone, PartialEq)]
pub struct BackupSettings {
    /// When backups are taken.
    pub schedule: BackupSchedule,
    /// Which backups are kept.
    pub retention: Retention,
    /// The destination's name (the server maps it to a place it owns).
    pub destination: String,
    /// The age recipients every backup is encrypted to (at least one, no duplicates).
    pub recipients: Vec<Recipient>,
}

/// `spec.backup.retention`: how many backups are kept and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// The newest `keep` backups are kept (at least 1).
    pub keep: u32,
    /// Backups older than this are deleted; `None`: no age limit.
    pub max_age: Option<Duration>,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            keep: DEFAULT_KEEP,
            max_age: None,
        }
    }
}

/// An age X25519 public key (`age1…`), checked by the age crate's own parser.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Recipient(String);

impl Recipient {
    /// Check `text` is an `age1…` X25519 recipient.
    pub fn parse(text: &str) -> Result<Recipient, String> {
        age::x25519::Recipient::from_str(text).map_err(|e| e.to_string())?;
        Ok(Recipient(text.to_string()))
    }
    /// The key as written (`age1…`).
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The key as the age crate uses it.
    #[allow(
        clippy::expect_used,
        reason = "a Recipient is only built by `parse`, which parsed the same text"
    )]
    pub fn to_age(&self) -> age::x25519::Recipient {
        age::x25519::Recipient::from_str(&self.0).expect("checked by Recipient::parse")
    }
}

/// Why a backup schedule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// Not a 5-field cron expression.
    #[error(
        "backup schedule `{input}` is not a 5-field cron expression (minute hour day-of-month month day-of-week, e.g. `0 3 * * *`): {reason}"
    )]
    Cron {
        /// The `schedule` as written.
        input: String,
        /// What the cron parser objected to.
        reason: String,
    },
    /// Not a known IANA time zone name.
    #[error("unknown time zone `{input}`: use an IANA name such as `Europe/Berlin` or `UTC`")]
    TimeZone {
        /// The `timeZone` as written.
        input: String,
    },
}

/// Why applied backup settings (a stored record) no longer check out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SummaryError {
    /// The schedule or its zone.
    #[error("the applied backup schedule is refused")]
    Schedule(#[source] ScheduleError),
    /// A recipient.
    #[error("the applied backup recipient `{recipient}` is not an age public key: {reason}")]
    Recipient {
        /// The key as stored.
        recipient: String,
        /// What the age parser objected to.
        reason: String,
    },
    /// No recipient at all.
    #[error("the applied backup settings name no recipient")]
    NoRecipient,
}

/// A backup schedule: a 5-field cron expression in an IANA time zone.
#[derive(Debug, Clone)]
pub struct BackupSchedule {
    cron: croner::Cron,
    text: String,
    zone: TimeZone,
    zone_name: String,
}

impl PartialEq for BackupSchedule {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text && self.zone_name == other.zone_name
    }
}

/// What the backup task should do now for one cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Take the backup of this slot (the latest scheduled time at or before now that has not
    /// been taken). Slots missed while no replica led collapse into this one.
    Now {
        /// The scheduled time the backup stands for.
        slot: Timestamp,
    },
    /// Nothing due; the next slot is at this time (`None`: the expression never fires again).
    Later {
        /// The next scheduled time strictly after now.
        next: Option<Timestamp>,
    },
}

impl BackupSchedule {
    /// Check and build a schedule: exactly 5 cron fields, a known IANA zone.
    pub fn new(expr: &str, zone: &str) -> Result<BackupSchedule, ScheduleError> {
        use super::window::{CronInZoneError, cron_in_zone};
        let (cron, tz) = cron_in_zone(expr, zone).map_err(|e| match e {
            CronInZoneError::Cron(reason) => ScheduleError::Cron {
                input: expr.to_string(),
                reason,
            },
            CronInZoneError::TimeZone => ScheduleError::TimeZone {
                input: zone.to_string(),
            },
        })?;
        Ok(BackupSchedule {
            cron,
            text: expr.to_string(),
            zone: tz,
            zone_name: zone.to_string(),
        })
    }

    /// The cron expression as written.
    pub fn expression(&self) -> &str {
        &self.text
    }
    /// The IANA zone the expression is read in.
    pub fn time_zone(&self) -> &str {
        &self.zone_name
    }

    /// The latest scheduled time at or before `now`, if any.
    pub fn latest_at_or_before(&self, now: Timestamp) -> Option<Timestamp> {
        let zoned = now.to_zoned(self.zone.clone());
        self.cron
            .find_previous_occurrence(&zoned, true)
            .ok()
            .map(|z| z.timestamp())
    }

    /// The shortest time between two slots over a week from a fixed Monday (issue #50): what
    /// the floor [`MIN_BACKUP_INTERVAL`] is checked against. `None`: fewer than two slots.
    pub fn shortest_gap(&self) -> Option<Duration> {
        // 2026-01-05T00:00:00Z, a Monday: a fixed start keeps validation pure.
        let start = Timestamp::from_second(1_767_571_200).ok()?;
        let end = start
            .checked_add(jiff::SignedDuration::from_hours(8 * 24))
            .ok()?;
        let mut prev = self.next_after(start)?;
        let mut best: Option<Duration> = None;
        for _ in 0..4096 {
            let Some(next) = self.next_after(prev) else {
                break;
            };
            if next > end {
                break;
            }
            let gap = Duration::try_from(next.duration_since(prev)).ok()?;
            best = Some(best.map_or(gap, |b| b.min(gap)));
            prev = next;
        }
        best
    }

    /// The next scheduled time strictly after `now`, if any.
    pub fn next_after(&self, now: Timestamp) -> Option<Timestamp> {
        let zoned = now.to_zoned(self.zone.clone());
        self.cron
            .find_next_occurrence(&zoned, false)
            .ok()
            .map(|z| z.timestamp())
    }

    /// Whether a backup is due at `now`, given the last slot already taken (`None`: none
    /// yet). A backup is due for the latest slot at or before `now` when that slot is newer
    /// than `last_taken`: however many slots passed while no replica ran the schedule, one
    /// backup stands for them all. A schedule with no taken slot is due at once for its latest
    /// slot (a cluster whose backups were just turned on has none).
    pub fn due(&self, last_taken: Option<Timestamp>, now: Timestamp) -> Due {
        match self.latest_at_or_before(now) {
            Some(slot) if last_taken.is_none_or(|t| slot > t) => Due::Now { slot },
            _ => Due::Later {
                next: self.next_after(now),
            },
        }
    }
}

fn err(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    at: &serde_saphyr::Location,
    msg: String,
    help: &str,
) {
    let d = Diagnostic::error(codes::BACKUP, doc.origin(at), msg);
    diags.push(if help.is_empty() {
        d
    } else {
        d.with_help(help)
    });
}

/// Validate `spec.backup`, reporting every bad value with its location. `None` when the block
/// is absent (backups off) or has an error.
pub fn backup_settings(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    spec: Option<&BackupSpec>,
) -> Option<BackupSettings> {
    let spec = spec?;
    let before = diags.len();
    let zone = spec.time_zone.as_ref().map_or("UTC", |z| z.value.as_str());
    let schedule = match BackupSchedule::new(&spec.schedule.value, zone) {
        Ok(s) => Some(s),
        Err(e) => {
            let at = match &e {
                ScheduleError::Cron { .. } => &spec.schedule,
                ScheduleError::TimeZone { .. } => spec.time_zone.as_ref().unwrap_or(&spec.schedule),
            };
            err(diags, doc, &at.referenced, e.to_string(), "");
            None
        }
    };
    if let Some(gap) = schedule.as_ref().and_then(BackupSchedule::shortest_gap)
        && gap < MIN_BACKUP_INTERVAL
    {
        err(
            diags,
            doc,
            &spec.schedule.referenced,
            format!(
                "backup schedule `{}` runs every {}, more often than every {}",
                spec.schedule.value,
                super::model::format_duration(gap),
                super::model::format_duration(MIN_BACKUP_INTERVAL)
            ),
            "each backup is a full etcd snapshot of every Secret; schedule at most every 15 minutes, e.g. `*/15 * * * *`",
        );
    }
    let mut retention = Retention::default();
    if let Some(r) = &spec.retention {
        if let Some(k) = &r.keep {
            if k.value == 0 || k.value > MAX_KEEP {
                err(
                    diags,
                    doc,
                    &k.referenced,
                    format!(
                        "`backup.retention.keep` is {}: it must be between 1 and {MAX_KEEP}",
                        k.value
                    ),
                    "medea always keeps the newest backup; `keep: 1` keeps only that one",
                );
            } else {
                retention.keep = k.value;
            }
        }
        if let Some(m) = &r.max_age {
            match crate::duration::Duration::parse_positive(&m.value) {
                Ok(d) => retention.max_age = Some(d.get()),
                Err(e) => err(
                    diags,
                    doc,
                    &m.referenced,
                    format!("`backup.retention.maxAge`: {e}"),
                    "write hours for days, e.g. `720h` for 30 days",
                ),
            }
        }
    }
    let destination = match &spec.destination {
        None => DEFAULT_DESTINATION.to_string(),
        Some(d) if super::validate::is_dns_label(&d.value) => d.value.clone(),
        Some(d) => {
            err(
                diags,
                doc,
                &d.referenced,
                format!(
                    "`backup.destination` `{}` is not a destination name",
                    d.value
                ),
                "a destination is named, never a path: the server maps the name to a place it owns (`local` is <state-dir>/backups/<cluster>/; see README, Backups)",
            );
            String::new()
        }
    };
    let mut recipients: Vec<Recipient> = Vec::new();
    if spec.recipients.is_empty() {
        err(
            diags,
            doc,
            &spec.schedule.referenced,
            "`backup.recipients` is empty: a backup holds every Secret of the cluster and is only written encrypted".into(),
            "list at least one age public key (`age-keygen -y key.txt` prints it: `age1…`); keep the private key off the medea host",
        );
    }
    if spec.recipients.len() > MAX_RECIPIENTS {
        err(
            diags,
            doc,
            &spec.recipients[MAX_RECIPIENTS].referenced,
            format!(
                "`backup.recipients` lists {} keys; at most {MAX_RECIPIENTS}",
                spec.recipients.len()
            ),
            "",
        );
    }
    for r in &spec.recipients {
        match Recipient::parse(r.value.trim()) {
            Ok(k) if recipients.contains(&k) => err(
                diags,
                doc,
                &r.referenced,
                format!("recipient `{}` is listed twice", r.value),
                "",
            ),
            Ok(k) => recipients.push(k),
            Err(reason) => err(
                diags,
                doc,
                &r.referenced,
                format!("`{}` is not an age public key: {reason}", r.value),
                "write an X25519 recipient as `age-keygen` prints it: `age1` and 58 more characters",
            ),
        }
    }
    if diags.len() > before {
        return None;
    }
    Some(BackupSettings {
        schedule: schedule?,
        retention,
        destination,
        recipients,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_missed_slot_is_due_once_and_then_waits_for_the_next() {
        // Daily 03:00 Europe/Berlin (02:00 UTC in winter).
        let s = BackupSchedule::new("0 3 * * *", "Europe/Berlin").unwrap();
        let now = ts("2026-12-05T10:00:00Z");
        // Nothing taken yet: the latest slot is due.
        assert_eq!(
            s.due(None, now),
            Due::Now {
                slot: ts("2026-12-05T02:00:00Z")
            }
        );
        // Three days down: one backup, for the latest slot, stands for all missed ones.
        assert_eq!(
            s.due(Some(ts("2026-12-02T02:00:00Z")), now),
            Due::Now {
                slot: ts("2026-12-05T02:00:00Z")
            }
        );
        // Taken: nothing due until tomorrow's slot.
        assert_eq!(
            s.due(Some(ts("2026-12-05T02:00:00Z")), now),
            Due::Later {
                next: Some(ts("2026-12-06T02:00:00Z"))
            }
        );
        // Exactly at the slot it is due.
        assert_eq!(
            s.due(Some(ts("2026-12-05T02:00:00Z")), ts("2026-12-06T02:00:00Z")),
            Due::Now {
                slot: ts("2026-12-06T02:00:00Z")
            }
        );
    }

    #[test]
    fn schedules_are_refused_with_the_reason() {
        assert!(matches!(
            BackupSchedule::new("0 3 * *", "UTC"),
            Err(ScheduleError::Cron { .. })
        ));
        assert!(matches!(
            BackupSchedule::new("61 3 * * *", "UTC"),
            Err(ScheduleError::Cron { .. })
        ));
        assert!(matches!(
            BackupSchedule::new("0 3 * * *", "Mars/Olympus"),
            Err(ScheduleError::TimeZone { .. })
        ));
    }

    /// Issue #50 item 4: more often than every 15 minutes is too often.
    #[test]
    fn the_shortest_gap_of_a_schedule_is_measured() {
        let gap = |e: &str| {
            BackupSchedule::new(e, "Europe/Berlin")
                .unwrap()
                .shortest_gap()
        };
        assert_eq!(gap("*/5 * * * *"), Some(Duration::from_secs(300)));
        assert_eq!(gap("*/15 * * * *"), Some(MIN_BACKUP_INTERVAL));
        assert_eq!(gap("0,1 3 * * *"), Some(Duration::from_secs(60)));
        assert_eq!(gap("0 3 * * *"), Some(Duration::from_secs(24 * 3600)));
    }

    #[test]
    fn recipients_are_age_x25519_public_keys() {
        let id = age::x25519::Identity::generate();
        let key = id.to_public().to_string();
        assert_eq!(Recipient::parse(&key).unwrap().as_str(), key);
        assert!(Recipient::parse("age1notakey").is_err());
        // A private key is not a recipient.
        use age::secrecy::ExposeSecret as _;
        assert!(Recipient::parse(id.to_string().expose_secret()).is_err());
        assert!(Recipient::parse("ssh-ed25519 AAAA").is_err());
    }
}
