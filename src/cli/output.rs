//! Output formats shared by every read command: aligned tables, JSON, YAML.

use clap::ValueEnum;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Format {
    /// An aligned table.
    #[default]
    Table,
    /// The table with more columns (kubectl's `-o wide`).
    Wide,
    /// JSON, pretty-printed.
    Json,
    /// YAML.
    Yaml,
}

/// An RFC 3339 time as lists print it: to the second, in UTC (`2026-12-03T12:00:00Z`), without
/// the nanoseconds the server keeps (issue #52); anything else as it is. `-o json` keeps the
/// server's full value.
pub fn when(t: &str) -> String {
    match t.parse::<jiff::Timestamp>() {
        Ok(ts) => ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Err(_) => t.to_string(),
    }
}

/// Render rows as an aligned table with a header.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let n = cells.len();
        for (i, c) in cells.into_iter().enumerate() {
            if i + 1 == n {
                out.push_str(&c);
            } else {
                out.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        out.push('\n');
    };
    line(header.iter().map(|h| h.to_string()).collect(), &mut out);
    for r in rows {
        line(r.clone(), &mut out);
    }
    out
}

#[allow(
    clippy::expect_used,
    reason = "CLI output types are plain structs with string keys: serializing them cannot fail"
)]
pub fn json<T: Serialize>(v: &T) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("output serializes");
    s.push('\n');
    s
}

#[allow(
    clippy::expect_used,
    reason = "CLI output types are plain structs with string keys: serializing them cannot fail"
)]
pub fn yaml<T: Serialize>(v: &T) -> String {
    serde_saphyr::to_string(v).expect("output serializes")
}

pub fn yes_no(b: bool) -> String {
    if b { "yes".into() } else { "no".into() }
}

#[cfg(test)]
mod tests {

    /// Issue #52 item 6: lists print times to the second, never with nanoseconds.
    #[test]
    fn times_are_printed_to_the_second() {
        use super::when;
        assert_eq!(
            when("2026-12-07T19:03:31.123456789Z"),
            "2026-12-07T19:03:31Z"
        );
        assert_eq!(when("2026-12-07T20:03:31+01:00"), "2026-12-07T19:03:31Z");
        assert_eq!(when(""), "");
        assert_eq!(when("-"), "-");
    }

    #[test]
    fn tables_align() {
        let t = super::table(
            &["NAME", "V"],
            &[
                vec!["a".into(), "1".into()],
                vec!["long".into(), "2".into()],
            ],
        );
        assert_eq!(t, "NAME  V\na     1\nlong  2\n");
    }
}
