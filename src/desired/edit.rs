//! In-place edits of one scalar, located by the loader's spans: every other byte of the file
//! (comments, order, layout, quoting style) is kept.

use super::model::Origin;

/// Why an in-place edit of a desired-state file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    #[error(
        "the value at {file}:{line}:{column} is not where the loader saw it; re-run after saving the file"
    )]
    /// The file changed since it was loaded: the value is no longer at the recorded position.
    Moved {
        /// Path of the file, relative to the desired-state root.
        file: String,
        /// 1-based line the value was loaded from.
        line: usize,
        /// 1-based column the value was loaded from.
        column: usize,
    },
}

/// Replace the scalar at `at` in `text` with `value`, keeping its quotes if it had any.
/// `expected` is the scalar's current (unquoted) value, checked before editing.
pub fn replace_scalar(
    text: &str,
    at: &Origin,
    expected: &str,
    value: &str,
) -> Result<String, EditError> {
    let moved = || EditError::Moved {
        file: at.file.clone(),
        line: at.line,
        column: at.column,
    };
    let rest = text.get(at.offset..).ok_or_else(moved)?;
    let (start, end) = match rest.chars().next() {
        Some(q @ ('"' | '\'')) => {
            let close = rest[1..].find(q).ok_or_else(moved)?;
            (at.offset + 1, at.offset + 1 + close)
        }
        _ => {
            let len = rest
                .find(|c: char| c.is_whitespace() || c == ',' || c == '}' || c == ']' || c == '#')
                .unwrap_or(rest.len());
            (at.offset, at.offset + len)
        }
    };
    if &text[start..end] != expected {
        return Err(moved());
    }
    let mut out = String::with_capacity(text.len() + value.len());
    out.push_str(&text[..start]);
    out.push_str(value);
    out.push_str(&text[end..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str, needle: &str) -> Origin {
        let offset = text.find(needle).unwrap();
        Origin {
            file: "f.yaml".into(),
            line: 1,
            column: 1,
            offset,
            len: needle.len(),
        }
    }

    #[test]
    fn keeps_everything_but_the_scalar() {
        let t = "talos:\n  version: v1.12.4   # pinned\n  other: x\n";
        let out = replace_scalar(t, &at(t, "v1.12.4"), "v1.12.4", "v1.13.9").unwrap();
        assert_eq!(out, "talos:\n  version: v1.13.9   # pinned\n  other: x\n");
        let t = "talos: {version: \"v1.12.4\", x: 1}\n";
        let out = replace_scalar(t, &at(t, "\"v1.12.4\""), "v1.12.4", "v1.13.9").unwrap();
        assert_eq!(out, "talos: {version: \"v1.13.9\", x: 1}\n");
        let t = "version: 'v1.12.4'\n";
        assert_eq!(
            replace_scalar(t, &at(t, "'"), "v1.12.4", "v1.13.9").unwrap(),
            "version: 'v1.13.9'\n"
        );
    }

    #[test]
    fn refuses_when_the_file_changed() {
        let t = "version: v1.12.4\n";
        let mut o = at(t, "v1.12.4");
        o.offset = 2;
        assert!(replace_scalar(t, &o, "v1.12.4", "v1.13.9").is_err());
    }
}
