//! Timestamps on the wire (issue #50 item 6): jiff's own serde support replaced five
//! hand-written modules (`sequencer::ts`, `sequencer::ts_opt`, `preflight::opt_ts`,
//! `exclusion::ts`, `approval::record::rfc3339`). The stored journal, jobs, plans and approvals
//! keep their bytes: these are the strings those modules wrote and read.

use jiff::Timestamp;

use super::clock::JobClock;

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

#[test]
fn timestamps_serialize_as_the_old_modules_wrote_them() {
    // The old `serialize` was `collect_str(t)` (`Display`); whole seconds, fractions and
    // years before 1970 keep that text.
    for s in [
        "2025-06-01T12:00:00Z",
        "2025-06-01T12:00:00.5Z",
        "2025-06-01T12:00:00.123456789Z",
        "1969-12-31T23:59:59Z",
    ] {
        let json = serde_json::to_string(&t(s)).unwrap();
        assert_eq!(json, format!("\"{s}\""));
        assert_eq!(serde_json::from_str::<Timestamp>(&json).unwrap(), t(s));
    }
}

#[test]
fn old_timestamp_text_round_trips_byte_for_byte() {
    // A clock as the old `ts_opt` wrote it (absent when `None`), and read back the same.
    let old = r#"{"startedAt":"2025-06-01T12:00:00Z","pausedSince":"2025-06-01T13:30:00.25Z","pausedSecs":7}"#;
    let clock: JobClock = serde_json::from_str(old).unwrap();
    assert_eq!(clock.started_at, Some(t("2025-06-01T12:00:00Z")));
    assert_eq!(clock.paused_since, Some(t("2025-06-01T13:30:00.25Z")));
    assert_eq!(serde_json::to_string(&clock).unwrap(), old);
    let empty: JobClock = serde_json::from_str("{}").unwrap();
    assert_eq!(empty, JobClock::default());
    assert_eq!(serde_json::to_string(&empty).unwrap(), "{}");
}

#[test]
fn offsets_parse_as_the_old_from_str_did() {
    // The old `deserialize` was `String` then `FromStr`: an RFC 3339 offset is accepted and
    // normalized to UTC; a string that is not a timestamp is refused, never defaulted.
    let with_offset = "\"2025-06-01T14:00:00+02:00\"";
    assert_eq!(
        serde_json::from_str::<Timestamp>(with_offset).unwrap(),
        t("2025-06-01T12:00:00Z")
    );
    assert!(serde_json::from_str::<Timestamp>("\"yesterday\"").is_err());
    assert!(serde_json::from_str::<Timestamp>("12").is_err());
    assert_eq!(
        serde_json::from_str::<Option<Timestamp>>("null").unwrap(),
        None
    );
}
