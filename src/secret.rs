//! [`Secret`]: key material, tokens and config bodies as a type that cannot be logged.
//!
//! `Debug` and `Display` print `<redacted>` and there is no `Serialize`, so a secret inside a
//! struct that is logged, returned or serialized by mistake either prints nothing of itself or
//! does not compile. The one way in is [`Secret::expose`], whose call sites are few and
//! greppable.

use std::fmt;

/// A secret value: `Debug` and `Display` print `<redacted>`, and there is no `Serialize`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    pub fn new(value: T) -> Secret<T> {
        Secret(value)
    }
    /// The secret itself. Callers must not log or print it.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A file holding a secret (an access key, a token, a password) that could not be parsed: the
/// error names the file, the line and column and what kind of mistake it is, and never a byte
/// of the file. Parsers quote what they could not read (serde-saphyr's message repeats the
/// scalar, its snippet the lines around it), so their error is dropped here, not kept as the
/// source: a secret in it would reach every log line, webhook and API answer that prints the
/// chain. Every reader of a secret-bearing file routes its parse errors through this type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{}`{}: {problem}; the file holds a secret, so its content is not repeated here", path.display(), at(*line, *column))]
pub struct SecretFileError {
    /// The file.
    pub path: std::path::PathBuf,
    /// 1-based line of the mistake, when the parser knows it.
    pub line: Option<u64>,
    /// 1-based column of the mistake, when the parser knows it.
    pub column: Option<u64>,
    /// What is wrong, in words that quote nothing from the file (the names of the keys the
    /// file may hold come from the reader, never from the file).
    pub problem: String,
}

fn at(line: Option<u64>, column: Option<u64>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" line {l}, column {c}"),
        (Some(l), None) => format!(" line {l}"),
        _ => String::new(),
    }
}

/// Parse the YAML of secret file `path` (`bytes`) as a `T`; `what` names the file's kind (`S3
/// credentials file`) and `keys` the keys it may hold, for the message. On error: a
/// [`SecretFileError`], with nothing of the file in it.
pub fn parse_yaml<T: for<'de> serde::Deserialize<'de>>(
    path: &std::path::Path,
    bytes: &[u8],
    what: &str,
    keys: &[&str],
) -> Result<T, SecretFileError> {
    let refused = |line, column, problem: String| SecretFileError {
        path: path.to_path_buf(),
        line,
        column,
        problem: format!("not a valid {what}: {problem}"),
    };
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Err(refused(None, None, "not UTF-8 text".into()));
    };
    serde_saphyr::from_str(text).map_err(|err: serde_saphyr::Error| {
        let at = err.location();
        let (line, column) = (at.map(|l| l.line()), at.map(|l| l.column()));
        refused(line, column, yaml_problem(err.without_snippet(), keys))
    })
}

/// What a YAML error is about, in words that quote nothing from the input: only the variant
/// and the names the reader declared (`keys`, a missing field's name, which is the reader's
/// own `&'static str`).
fn yaml_problem(err: &serde_saphyr::Error, keys: &[&str]) -> String {
    use serde_saphyr::Error as E;
    let expected = || {
        let list: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
        format!("write `key: value` lines with the keys {}", list.join(", "))
    };
    match err {
        E::SerdeMissingField { field, .. } => format!("the key `{field}` is missing"),
        E::SerdeUnknownField { .. } => format!("a key it does not know; {}", expected()),
        E::SerdeInvalidType { .. } | E::SerdeInvalidValue { .. } | E::Unexpected { .. } => {
            format!(
                "a value of the wrong kind (a key without `: `?); {}",
                expected()
            )
        }
        E::DuplicateMappingKey { .. } => "a key is given twice".into(),
        E::Eof { .. } => format!("it is empty or ends early; {}", expected()),
        _ => format!("it is not the YAML expected; {}", expected()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_do_not_print() {
        let s = Secret::new("hunter2".to_string());
        assert_eq!(format!("{s:?} {s}"), "<redacted> <redacted>");
        assert_eq!(s.expose(), "hunter2");
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Holder {
            token: Secret<String>,
        }
        let h = Holder { token: s };
        assert_eq!(format!("{h:?}"), "Holder { token: <redacted> }");
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct Creds {
        access_key_id: String,
        secret_access_key: String,
    }

    /// Each kind of typo next to a secret: the error names the file and the line, and holds
    /// nothing of the file, whatever is printed of it (Display, Debug, the source chain).
    #[test]
    fn secret_file_errors_name_the_file_and_line_and_never_the_content() {
        const MARKER: &str = "MARKERSECRET0123456789";
        let path = std::path::Path::new("/creds/prod/credentials");
        let keys = ["accessKeyId", "secretAccessKey"];
        let typos = [
            // The colon forgotten: the two lines are one scalar.
            (
                format!("accessKeyId: AKIA\nsecretAccessKey {MARKER}\n"),
                None,
            ),
            // A key misspelled.
            (
                format!("accessKeyId: AKIA\nsecretAccesKey: {MARKER}\n"),
                Some(2),
            ),
            // The secret pasted as a key.
            (format!("accessKeyId: AKIA\n{MARKER}: x\n"), Some(2)),
            // A list where a string belongs.
            (
                format!("accessKeyId: AKIA\nsecretAccessKey: [{MARKER}]\n"),
                Some(2),
            ),
            // An unclosed quote.
            (
                format!("accessKeyId: AKIA\nsecretAccessKey: \"{MARKER}\n"),
                None,
            ),
            // A key missing.
            (format!("secretAccessKey: {MARKER}\n"), None),
            // Bad indentation.
            (
                format!("accessKeyId: AKIA\n  secretAccessKey: {MARKER}\n  x: y\n"),
                None,
            ),
        ];
        for (text, line) in typos {
            let e = parse_yaml::<Creds>(path, text.as_bytes(), "S3 credentials file", &keys)
                .unwrap_err();
            let shown = format!("{e} {e:?} {}", crate::error_chain(&e));
            assert!(!shown.contains(MARKER), "{text:?} -> {shown}");
            assert!(!shown.contains("AKIA"), "{text:?} -> {shown}");
            assert!(shown.contains("/creds/prod/credentials"), "{shown}");
            assert!(std::error::Error::source(&e).is_none());
            if let Some(l) = line {
                assert_eq!(e.line, Some(l), "{text:?} -> {shown}");
                assert!(shown.contains(&format!("line {l}")), "{shown}");
            }
        }
        let e = parse_yaml::<Creds>(path, b"\xff\xfe", "S3 credentials file", &keys).unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
        let e = parse_yaml::<Creds>(path, b"secretAccessKey: x\n", "S3 credentials file", &keys)
            .unwrap_err();
        assert!(e.to_string().contains("`accessKeyId` is missing"), "{e}");
    }
}
