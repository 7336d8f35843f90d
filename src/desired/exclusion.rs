//! Maintenance exclusions (`spec.maintenance.exclusions`): named spans of time in which some
//! version changes may not start, on top of the maintenance windows.
//!
//! The scopes are GKE's (`MaintenanceExclusionOptions.Scope`): `noUpgrades` holds every
//! change, `noMinorUpgrades` holds a change of minor line and lets patches through. A change
//! is judged per node and per version: a Talos hop `v1.13.10 → v1.14.6` is a minor change, a
//! hop `v1.14.5 → v1.14.6` (or a reinstall of the same version with another schematic) a
//! patch; the Kubernetes step is a minor change when its minor line moves.
//!
//! Pure: the current time is an argument.

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use serde::{Deserialize, Serialize};

use crate::version::{KubeVersion, TalosVersion};

/// What an exclusion holds (GKE's scopes).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum ExclusionScope {
    /// No change starts: patches and minor upgrades of Talos and Kubernetes alike (GKE's
    /// default scope, and medea's when `scope` is omitted).
    NoUpgrades,
    /// Changes of minor line do not start; patches (same minor line) still do.
    NoMinorUpgrades,
}

impl ExclusionScope {
    /// The scope as written in the YAML (`noUpgrades`, `noMinorUpgrades`).
    pub fn as_str(self) -> &'static str {
        match self {
            ExclusionScope::NoUpgrades => "noUpgrades",
            ExclusionScope::NoMinorUpgrades => "noMinorUpgrades",
        }
    }

    /// The scope named `text`, if it is one.
    pub fn parse(text: &str) -> Option<ExclusionScope> {
        match text {
            "noUpgrades" => Some(ExclusionScope::NoUpgrades),
            "noMinorUpgrades" => Some(ExclusionScope::NoMinorUpgrades),
            _ => None,
        }
    }

    /// Whether this scope holds `change`.
    pub fn covers(self, change: Change) -> bool {
        match self {
            ExclusionScope::NoUpgrades => true,
            ExclusionScope::NoMinorUpgrades => change == Change::Minor,
        }
    }
}

impl std::fmt::Display for ExclusionScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How big a version change is, as exclusion scopes weigh it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Change {
    /// The major or minor line moves (either way).
    Minor,
    /// Same minor line: a patch release, or the same version reinstalled.
    Patch,
}

impl Change {
    /// The change of a Talos hop `from → to`.
    pub fn talos(from: &TalosVersion, to: &TalosVersion) -> Change {
        Change::of(from.minor_line(), to.minor_line())
    }
    /// The change of a Kubernetes step `from → to`.
    pub fn kubernetes(from: &KubeVersion, to: &KubeVersion) -> Change {
        Change::of(from.minor_line(), to.minor_line())
    }
    fn of(from: (u64, u64), to: (u64, u64)) -> Change {
        if from == to {
            Change::Patch
        } else {
            Change::Minor
        }
    }
    /// `minor` or `patch`, for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Minor => "minor",
            Change::Patch => "patch",
        }
    }
}

/// Why an exclusion was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExclusionError {
    /// `from` or `to` is neither an RFC 3339 time nor a local date-time.
    #[error(
        "`{input}` is not a time: write RFC 3339 with an offset (`2026-12-20T00:00:00Z`, `2026-12-20T00:00:00+01:00`) or a local date-time (`2026-12-20T00:00`) read in `timeZone`"
    )]
    Time {
        /// The value as written.
        input: String,
    },
    /// The `timeZone` is not a known IANA zone name.
    #[error("unknown time zone `{input}`: use an IANA name such as `Europe/Berlin` or `UTC`")]
    TimeZone {
        /// The value as written.
        input: String,
    },
    /// `to` is not after `from`.
    #[error("the exclusion ends ({to}) before it begins ({from}): `to` must be after `from`")]
    Order {
        /// The start.
        from: Timestamp,
        /// The end.
        to: Timestamp,
    },
    /// The scope is not one medea knows.
    #[error("unknown exclusion scope `{input}`: use `noUpgrades` or `noMinorUpgrades`")]
    Scope {
        /// The value as written.
        input: String,
    },
}

/// The time zone named `zone` (IANA, bundled tzdb).
pub fn time_zone(zone: &str) -> Result<TimeZone, ExclusionError> {
    TimeZone::get(zone).map_err(|_| ExclusionError::TimeZone {
        input: zone.to_string(),
    })
}

/// `text` as an instant: RFC 3339 with an offset (`Z`, `+01:00`) as written, or a local
/// date-time without offset (`2026-12-20T00:00`, `2026-12-20 00:00:00`) read in `zone` (the
/// windows' rule: a wall-clock time in an IANA zone). A local time that a daylight-saving
/// change skips or repeats resolves as jiff's `compatible` rule does (the later instant of a
/// gap, the earlier of a fold).
pub fn parse_time(text: &str, zone: &TimeZone) -> Result<Timestamp, ExclusionError> {
    let err = || ExclusionError::Time {
        input: text.to_string(),
    };
    if let Ok(t) = text.parse::<Timestamp>() {
        return Ok(t);
    }
    let civil: DateTime = text.parse().map_err(|_| err())?;
    zone.to_ambiguous_zoned(civil)
        .compatible()
        .map(|z| z.timestamp())
        .map_err(|_| err())
}

/// One validated exclusion: no change its scope covers starts in `[from, to)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Exclusion {
    /// Its name, unique in the cluster (`year-end-freeze`).
    pub name: String,
    /// When it begins (inclusive).
    pub from: Timestamp,
    /// When it ends (exclusive): a held change may start from this instant.
    pub to: Timestamp,
    /// What it holds.
    pub scope: ExclusionScope,
}

impl Exclusion {
    /// An exclusion; `to` must be after `from`.
    pub fn new(
        name: impl Into<String>,
        from: Timestamp,
        to: Timestamp,
        scope: ExclusionScope,
    ) -> Result<Exclusion, ExclusionError> {
        if to <= from {
            return Err(ExclusionError::Order { from, to });
        }
        Ok(Exclusion {
            name: name.into(),
            from,
            to,
            scope,
        })
    }

    /// Whether `now` lies in `[from, to)`.
    pub fn in_force(&self, now: Timestamp) -> bool {
        self.from <= now && now < self.to
    }

    /// Whether it holds `change` at `now`.
    pub fn holds(&self, change: Change, now: Timestamp) -> bool {
        self.in_force(now) && self.scope.covers(change)
    }

    /// `` `name` from → to (scope) ``, as plans show it.
    pub fn summary(&self) -> String {
        format!(
            "`{}` {} → {} ({})",
            self.name, self.from, self.to, self.scope
        )
    }
}

/// The exclusion holding `change` at `now`, if any: of several, the one that ends last.
pub fn holding(exclusions: &[Exclusion], change: Change, now: Timestamp) -> Option<&Exclusion> {
    exclusions
        .iter()
        .filter(|e| e.holds(change, now))
        .max_by(|a, b| a.to.cmp(&b.to).then_with(|| b.name.cmp(&a.name)))
}

/// The earliest instant at or after `now` at which no exclusion holds `change`: `now` itself
/// when none holds it; otherwise the end of the holding ones, following exclusions that
/// overlap or touch (one beginning before or as another ends). Terminates: each round moves
/// past the end of at least one exclusion.
pub fn free_from(exclusions: &[Exclusion], change: Change, now: Timestamp) -> Timestamp {
    let mut t = now;
    while let Some(e) = holding(exclusions, change, t) {
        t = e.to;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }
    fn talos(s: &str) -> TalosVersion {
        TalosVersion::parse(s).unwrap()
    }
    fn kube(s: &str) -> KubeVersion {
        KubeVersion::parse(s).unwrap()
    }
    fn ex(name: &str, from: &str, to: &str, scope: ExclusionScope) -> Exclusion {
        Exclusion::new(name, ts(from), ts(to), scope).unwrap()
    }

    #[test]
    fn a_change_is_minor_when_the_minor_line_moves() {
        assert_eq!(
            Change::talos(&talos("v1.13.10"), &talos("v1.14.6")),
            Change::Minor
        );
        assert_eq!(
            Change::talos(&talos("v1.14.5"), &talos("v1.14.6")),
            Change::Patch
        );
        // A reinstall (schematic change) of the same version is a patch.
        assert_eq!(
            Change::talos(&talos("v1.14.6"), &talos("v1.14.6")),
            Change::Patch
        );
        // A downgrade across minors moves the minor line too.
        assert_eq!(
            Change::talos(&talos("v1.14.6"), &talos("v1.13.10")),
            Change::Minor
        );
        assert_eq!(
            Change::kubernetes(&kube("v1.34.2"), &kube("v1.35.8")),
            Change::Minor
        );
        assert_eq!(
            Change::kubernetes(&kube("v1.35.2"), &kube("v1.35.8")),
            Change::Patch
        );
    }

    #[test]
    fn no_minor_upgrades_lets_patches_through_and_no_upgrades_holds_everything() {
        use ExclusionScope::*;
        assert!(NoUpgrades.covers(Change::Minor));
        assert!(NoUpgrades.covers(Change::Patch));
        assert!(NoMinorUpgrades.covers(Change::Minor));
        assert!(!NoMinorUpgrades.covers(Change::Patch));

        let e = ex(
            "freeze",
            "2026-12-20T00:00:00Z",
            "2027-01-04T00:00:00Z",
            NoMinorUpgrades,
        );
        let inside = ts("2026-12-24T12:00:00Z");
        assert!(e.holds(Change::Minor, inside));
        assert!(!e.holds(Change::Patch, inside));
        assert!(
            e.holds(Change::Minor, ts("2026-12-20T00:00:00Z")),
            "from is inclusive"
        );
        assert!(
            !e.holds(Change::Minor, ts("2027-01-04T00:00:00Z")),
            "to is exclusive"
        );
        assert!(!e.holds(Change::Minor, ts("2026-12-19T23:59:59Z")));
    }

    #[test]
    fn free_from_follows_overlapping_and_touching_exclusions() {
        use ExclusionScope::*;
        let list = vec![
            ex(
                "a",
                "2026-12-20T00:00:00Z",
                "2026-12-22T00:00:00Z",
                NoUpgrades,
            ),
            // touches a's end
            ex(
                "b",
                "2026-12-22T00:00:00Z",
                "2026-12-23T00:00:00Z",
                NoMinorUpgrades,
            ),
            // overlaps b
            ex(
                "c",
                "2026-12-22T12:00:00Z",
                "2026-12-25T00:00:00Z",
                NoMinorUpgrades,
            ),
            // separate, later
            ex(
                "d",
                "2026-12-28T00:00:00Z",
                "2026-12-29T00:00:00Z",
                NoUpgrades,
            ),
        ];
        let now = ts("2026-12-21T00:00:00Z");
        assert_eq!(
            free_from(&list, Change::Minor, now),
            ts("2026-12-25T00:00:00Z")
        );
        // Patches are held by `a` only.
        assert_eq!(
            free_from(&list, Change::Patch, now),
            ts("2026-12-22T00:00:00Z")
        );
        // Outside every exclusion: free now.
        let later = ts("2026-12-26T00:00:00Z");
        assert_eq!(free_from(&list, Change::Minor, later), later);
        assert_eq!(
            holding(&list, Change::Minor, ts("2026-12-22T13:00:00Z")).map(|e| e.name.as_str()),
            Some("c"),
            "of two holding exclusions, the one that ends last"
        );
    }

    #[test]
    fn times_are_rfc3339_or_local_in_the_zone() {
        let berlin = time_zone("Europe/Berlin").unwrap();
        assert_eq!(
            parse_time("2026-12-20T00:00:00Z", &berlin).unwrap(),
            ts("2026-12-20T00:00:00Z")
        );
        assert_eq!(
            parse_time("2026-12-20T00:00:00+02:00", &berlin).unwrap(),
            ts("2026-12-19T22:00:00Z")
        );
        // Local: CET is UTC+1 in December.
        assert_eq!(
            parse_time("2026-12-20T00:00", &berlin).unwrap(),
            ts("2026-12-19T23:00:00Z")
        );
        assert!(matches!(
            parse_time("next tuesday", &berlin),
            Err(ExclusionError::Time { .. })
        ));
        assert!(matches!(
            time_zone("Mars/Olympus"),
            Err(ExclusionError::TimeZone { .. })
        ));
        assert!(matches!(
            Exclusion::new(
                "x",
                ts("2026-12-20T00:00:00Z"),
                ts("2026-12-20T00:00:00Z"),
                ExclusionScope::NoUpgrades
            ),
            Err(ExclusionError::Order { .. })
        ));
        assert_eq!(
            ExclusionScope::parse("noMinorUpgrades"),
            Some(ExclusionScope::NoMinorUpgrades)
        );
        assert_eq!(ExclusionScope::parse("noMinorOrNodeUpgrades"), None);
    }
}
