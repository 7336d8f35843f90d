//! The one duration type and its one grammar.
//!
//! **Owns:** [`Duration`], the only way a duration written by a person enters medea: desired-state
//! YAML (`drain.timeout`, `rollout.healthTimeout`, window `duration`), every CLI flag that takes a
//! duration (`--leader-ttl`, `--refresh-interval`, `talos health --wait-timeout`, `bench …`) and the
//! simulator's scenario files (`timing:`, fault delays).
//! **May depend on:** the `duration` row of design/architecture.md's code map: nothing (a
//! leaf).
//!
//! Architecture Invariant: a duration string is parsed once, at the edge, by [`Duration::parse`];
//! everything after that works on the typed value (or the `std::time::Duration` it converts to).
//!
//! The grammar is the one the desired-state schema documents (`10m`, `90s`, `1h30m`), with
//! milliseconds for the flags and scenario timings that need them (`500ms`):
//!
//! ```text
//! duration  = [ int "h" ] [ int "m" ] [ int "s" ] [ int "ms" ]   (at least one part)
//! int       = 1*DIGIT
//! ```
//!
//! Units appear at most once and largest first; no spaces, no signs, no fractions, no days.
//! [`Display`](std::fmt::Display) writes the same grammar (`1h30m`, `1s500ms`, `0s`), so
//! `parse(d.to_string()) == d` for every `d`.
//!
//! Compatibility: the simulator's scenario files and `medea talos health --wait-timeout` used to
//! be read by jiff's friendly parser, which also accepts `1m 30s` (documented in design/talos.md),
//! `1.5s`, `2 mins` and ISO 8601 `PT5M`. [`Duration::parse_lenient`] keeps accepting those forms
//! at those two edges only (it tries [`Duration::parse`] first); the desired-state YAML and every
//! other flag take the grammar above and nothing else.

use std::fmt;
use std::str::FromStr;

/// Why a duration was refused. The message names the input and shows the grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error(
        "invalid duration `{input}`: write hours, minutes, seconds and milliseconds like `10m`, `90s`, `1h30m` or `500ms`"
    )]
    Syntax { input: String },
    #[error("duration `{input}` is too long")]
    Overflow { input: String },
    #[error("duration `{input}` must be positive")]
    NotPositive { input: String },
}

/// A non-negative duration with millisecond precision, parsed from the grammar in the module docs.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(std::time::Duration);

const UNITS: [(&str, u64); 4] = [("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)];

impl Duration {
    pub const ZERO: Duration = Duration(std::time::Duration::ZERO);

    pub const fn from_secs(s: u64) -> Self {
        Duration(std::time::Duration::from_secs(s))
    }

    pub const fn from_millis(ms: u64) -> Self {
        Duration(std::time::Duration::from_millis(ms))
    }

    /// Parse the grammar of the module docs. Surrounding whitespace is ignored.
    pub fn parse(input: &str) -> Result<Self, DurationError> {
        let syntax = || DurationError::Syntax {
            input: input.to_string(),
        };
        let overflow = || DurationError::Overflow {
            input: input.to_string(),
        };
        let mut rest = input.trim();
        if rest.is_empty() {
            return Err(syntax());
        }
        let mut total: u64 = 0;
        // Index into UNITS of the next unit allowed (units go largest first, each at most once).
        let mut next_unit = 0;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return Err(syntax());
            }
            let (number, after) = rest.split_at(digits);
            let unit_len = after.bytes().take_while(u8::is_ascii_alphabetic).count();
            let (unit, after) = after.split_at(unit_len);
            let idx = UNITS
                .iter()
                .position(|(u, _)| *u == unit)
                .filter(|i| *i >= next_unit)
                .ok_or_else(syntax)?;
            let n: u64 = number.parse().map_err(|_| overflow())?;
            total = n
                .checked_mul(UNITS[idx].1)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(overflow)?;
            next_unit = idx + 1;
            rest = after;
        }
        Ok(Duration::from_millis(total))
    }

    /// [`Duration::parse`], then a duration that must not be zero (desired-state timeouts and
    /// windows).
    pub fn parse_positive(input: &str) -> Result<Self, DurationError> {
        let d = Self::parse(input)?;
        if d.0.is_zero() {
            return Err(DurationError::NotPositive {
                input: input.to_string(),
            });
        }
        Ok(d)
    }

    /// [`Duration::parse`], falling back to jiff's friendly and ISO 8601 forms (`1m 30s`, `1.5s`,
    /// `PT5M`) that the simulator's scenario files and `talos health --wait-timeout` accepted
    /// before there was one grammar. Sub-millisecond parts are dropped. Use nowhere else.
    pub fn parse_lenient(input: &str) -> Result<Self, DurationError> {
        match Self::parse(input) {
            Ok(d) => Ok(d),
            Err(strict) => {
                let Ok(d) = input.trim().parse::<jiff::SignedDuration>() else {
                    return Err(strict);
                };
                let d = std::time::Duration::try_from(d).map_err(|_| strict)?;
                let ms = u64::try_from(d.as_millis()).map_err(|_| DurationError::Overflow {
                    input: input.to_string(),
                })?;
                Ok(Duration::from_millis(ms))
            }
        }
    }

    /// The `std` value inner code works with.
    pub const fn get(self) -> std::time::Duration {
        self.0
    }

    pub fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

/// For clap's `value_parser`: a flag typed `std::time::Duration`, read with [`Duration::parse`].
pub fn parse_std(input: &str) -> Result<std::time::Duration, DurationError> {
    Duration::parse(input).map(Duration::get)
}

/// For clap's `value_parser` on the one flag that accepted jiff's forms: [`Duration::parse_lenient`].
pub fn parse_std_lenient(input: &str) -> Result<std::time::Duration, DurationError> {
    Duration::parse_lenient(input).map(Duration::get)
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        d.0
    }
}

impl From<std::time::Duration> for Duration {
    /// Sub-millisecond parts are dropped (the grammar has no unit below `ms`).
    fn from(d: std::time::Duration) -> Self {
        Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

impl FromStr for Duration {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for Duration {
    /// Largest units first, zero parts left out: `1h30m`, `90s` → `1m30s`, `1s500ms`, `0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ms = u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 {
            return f.write_str("0s");
        }
        for (unit, size) in UNITS {
            let n = ms / size;
            if n > 0 {
                write!(f, "{n}{unit}")?;
            }
            ms %= size;
        }
        Ok(())
    }
}

impl fmt::Debug for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Duration({self})")
    }
}

/// `"250ms"`, `"2s"` ⇄ `std::time::Duration` for serde: written in the grammar, read with
/// [`Duration::parse_lenient`] (the simulator's scenario files; see the module docs).
pub mod serde_lenient {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&super::Duration::from(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<std::time::Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::Duration::parse_lenient(&s)
            .map(super::Duration::get)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_documented_forms_parse() {
        let d = |s| Duration::parse(s).map(Duration::get);
        assert_eq!(d("10m"), Ok(std::time::Duration::from_secs(600)));
        assert_eq!(d("90s"), Ok(std::time::Duration::from_secs(90)));
        assert_eq!(d("1h30m"), Ok(std::time::Duration::from_secs(5400)));
        assert_eq!(d("4h"), Ok(std::time::Duration::from_secs(4 * 3600)));
        assert_eq!(d("500ms"), Ok(std::time::Duration::from_millis(500)));
        assert_eq!(
            d("1m30s250ms"),
            Ok(std::time::Duration::from_millis(90_250))
        );
        assert_eq!(d(" 20m "), Ok(std::time::Duration::from_secs(1200)));
        assert_eq!(d("0s"), Ok(std::time::Duration::ZERO));
        assert_eq!(d("0ms"), Ok(std::time::Duration::ZERO));
    }

    #[test]
    fn everything_else_is_refused_with_the_grammar_in_the_message() {
        for bad in [
            "",
            "10",
            "ten minutes",
            "-5m",
            "+5m",
            "1d",
            "1 h",
            "PT5M",
            "1m 30s",
            "30s1m",
            "1h1h",
            "1.5s",
            "1H",
            "5us",
            "h",
            "1hm",
        ] {
            let e = Duration::parse(bad).unwrap_err();
            assert!(
                matches!(&e, DurationError::Syntax { input } if input == bad),
                "{bad:?}: {e:?}"
            );
            assert!(e.to_string().contains("`1h30m`"), "{e}");
        }
        assert!(matches!(
            Duration::parse("99999999999999999999h"),
            Err(DurationError::Overflow { .. })
        ));
        assert!(matches!(
            Duration::parse("5124095576030432h"),
            Err(DurationError::Overflow { .. })
        ));
    }

    #[test]
    fn positive_refuses_zero() {
        assert!(matches!(
            Duration::parse_positive("0s"),
            Err(DurationError::NotPositive { .. })
        ));
        assert_eq!(
            Duration::parse_positive("0s").unwrap_err().to_string(),
            "duration `0s` must be positive"
        );
        assert_eq!(Duration::parse_positive("1s"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn lenient_keeps_the_jiff_forms_scenarios_used() {
        let d = |s| Duration::parse_lenient(s).map(Duration::get);
        assert_eq!(d("1m 30s"), Ok(std::time::Duration::from_secs(90)));
        assert_eq!(d("1.5s"), Ok(std::time::Duration::from_millis(1500)));
        assert_eq!(d("PT5M"), Ok(std::time::Duration::from_secs(300)));
        assert_eq!(d("250ms"), Ok(std::time::Duration::from_millis(250)));
        assert_eq!(d("2s"), Ok(std::time::Duration::from_secs(2)));
        assert!(matches!(
            Duration::parse_lenient("-2s"),
            Err(DurationError::Syntax { .. })
        ));
        assert!(matches!(
            Duration::parse_lenient("soon"),
            Err(DurationError::Syntax { .. })
        ));
    }

    // Moved from `desired::validate` (the desired-state fields: positive durations).
    #[test]
    fn durations() {
        let parse_duration = |s| super::Duration::parse_positive(s).map(super::Duration::get);
        use std::time::Duration;
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        for bad in ["10", "ten minutes", "-5m", "1d", "0s", "", "1 h", "PT5M"] {
            assert!(parse_duration(bad).is_err(), "{bad} should be refused");
        }
    }

    // Moved from `cli::ha` and `cli::talos` (flags).
    #[test]
    fn flag_durations() {
        use std::time::Duration;
        assert_eq!(parse_std("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_std("10s"), Ok(Duration::from_secs(10)));
        assert!(parse_std("ten").is_err());
        assert_eq!(parse_std_lenient("20m").unwrap(), Duration::from_secs(1200));
        assert!(parse_std_lenient("later").is_err());
    }

    #[test]
    fn display_is_compact() {
        assert_eq!(Duration::from_secs(90).to_string(), "1m30s");
        assert_eq!(Duration::from_secs(600).to_string(), "10m");
        assert_eq!(Duration::from_secs(5400).to_string(), "1h30m");
        assert_eq!(Duration::from_millis(1500).to_string(), "1s500ms");
        assert_eq!(Duration::ZERO.to_string(), "0s");
    }

    proptest! {
        #[test]
        fn display_round_trips(ms in 0u64..=u64::MAX / 2) {
            let d = Duration::from_millis(ms);
            prop_assert_eq!(Duration::parse(&d.to_string()), Ok(d));
        }

        #[test]
        fn parts_add_up(h in 0u64..10_000, m in 0u64..100, s in 0u64..100, ms in 0u64..5_000) {
            let text = format!("{h}h{m}m{s}s{ms}ms");
            let want = ((h * 60 + m) * 60 + s) * 1000 + ms;
            prop_assert_eq!(Duration::parse(&text), Ok(Duration::from_millis(want)));
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,24}") {
            let _ = Duration::parse(&s);
            let _ = Duration::parse_lenient(&s);
        }
    }
}
