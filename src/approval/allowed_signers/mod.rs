//! The OpenSSH `allowed_signers` format (ssh-keygen(1), section ALLOWED SIGNERS), as git uses it.
//!
//! One signer a line: `principals [options] keytype base64-key [comment]`.
//! - `principals`: a comma-separated pattern list (`*`, `?`, `!` negation, as in ssh_config(5)
//!   PATTERNS); may be double-quoted.
//! - `options`: comma-separated, no spaces outside double quotes, keywords case-insensitive:
//!   `namespaces="<pattern-list>"`, `valid-after="<time>"`, `valid-before="<time>"`,
//!   `cert-authority`. Values must be double-quoted, as ssh-keygen requires.
//! - `<time>`: `YYYYMMDD`, `YYYYMMDDHHMM` or `YYYYMMDDHHMMSS`, optionally followed by `Z` or
//!   `UTC`. **medea reads every time as UTC**: ssh-keygen uses the host's time zone when the
//!   suffix is missing, but medea has no configured zone and a trust root must not depend on the
//!   host's `TZ`. Write the `Z` so both tools agree.
//! - Blank lines and lines whose first non-blank character is `#` are ignored.
//!
//! medea does not support `cert-authority` (certificate-based approvals): such a line is reported
//! and skipped. DSA keys and certificates as signer keys are refused too.
//!
//! Parsing is pure and total: [`parse`] never fails and never panics; it returns the signers from
//! the good lines and one [`SignersDiagnostic`] (1-based line and column) per bad line, in the
//! `(T, Vec<Error>)` manner. ssh-keygen skips bad lines as well; medea does not: a trust root is
//! used whole or not at all. [`parse_file`] is that policy (any diagnostic refuses the file,
//! every one listed as `path:line:col: message`), and [`read()`] (the module's one reader, its
//! only I/O) reads a file for it. `medea serve` (at start and on every reload), `medea approve
//! --allowed-signers` and `medea approvals` all read the trust root through [`read()`], so they
//! accept and refuse the same files with the same words (issue #34).

use std::fmt;
use std::path::Path;

mod read;
pub use read::{SignersFileError, read};

use jiff::Timestamp;
use ssh_key::{Algorithm, HashAlg, PublicKey, public::KeyData};

/// A parsed allowed_signers file: the usable entries, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedSigners {
    entries: Vec<SignerEntry>,
}

/// One usable allowed_signers line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignerEntry {
    line: usize,
    principals: String,
    namespaces: Option<String>,
    valid_after: Option<Timestamp>,
    valid_before: Option<Timestamp>,
    key: PublicKey,
}

/// A problem on one line of an allowed_signers file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignersDiagnostic {
    /// 1-based line number.
    pub line: usize,
    /// 1-based column (in characters) of the offending token, when known.
    pub column: Option<usize>,
    /// What is wrong with the line.
    pub message: String,
}

impl fmt::Display for SignersDiagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.column {
            Some(c) => write!(f, "line {}, column {}: {}", self.line, c, self.message),
            None => write!(f, "line {}: {}", self.line, self.message),
        }
    }
}

impl SignersDiagnostic {
    /// `path:line:col: message` (`path:line: message` without a column): the one way a
    /// diagnostic of an allowed_signers file is shown, by every command.
    pub fn located(&self, path: &Path) -> String {
        match self.column {
            Some(c) => format!("{}:{}:{c}: {}", path.display(), self.line, self.message),
            None => format!("{}:{}: {}", path.display(), self.line, self.message),
        }
    }
}

/// The most bytes an allowed_signers file may have (a line is a few hundred bytes: room for
/// thousands of signers); a larger file is refused before it is read whole.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// The trust root from the text of the allowed_signers file at `path` (named in messages
/// only): the signers when every line is good, else every bad line at once
/// ([`SignersFileError::Invalid`]). Pure; [`read()`] reads the file for it.
pub fn parse_file(path: &Path, text: &str) -> Result<AllowedSigners, SignersFileError> {
    let (signers, diagnostics) = parse(text);
    if diagnostics.is_empty() {
        Ok(signers)
    } else {
        Err(SignersFileError::Invalid {
            path: path.to_path_buf(),
            diagnostics,
        })
    }
}

/// Parse an allowed_signers file. Never fails: bad lines become diagnostics and are skipped.
pub fn parse(text: &str) -> (AllowedSigners, Vec<SignersDiagnostic>) {
    let mut entries = Vec::new();
    let mut diagnostics = Vec::new();
    for (idx, raw) in text.lines().enumerate() {
        let line_no = idx + 1;
        match parse_line(raw, line_no) {
            Ok(Some(entry)) => entries.push(entry),
            Ok(None) => {}
            Err((offset, message)) => diagnostics.push(SignersDiagnostic {
                line: line_no,
                column: offset.map(|o| column_of(raw, o)),
                message,
            }),
        }
    }
    (AllowedSigners { entries }, diagnostics)
}

impl AllowedSigners {
    /// The entries, in file order.
    pub fn entries(&self) -> &[SignerEntry] {
        &self.entries
    }
    /// Whether the file has no entry (nobody can approve).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// The entries whose key is exactly `key`, in file order.
    pub fn entries_for_key<'a>(
        &'a self,
        key: &'a KeyData,
    ) -> impl Iterator<Item = &'a SignerEntry> {
        self.entries.iter().filter(move |e| e.key.key_data() == key)
    }
}

impl SignerEntry {
    /// 1-based line of the allowed_signers file this entry came from.
    pub fn line(&self) -> usize {
        self.line
    }
    /// The principals pattern list, as written (without quotes).
    pub fn principals(&self) -> &str {
        &self.principals
    }
    /// The principals when every one is a literal (no `*`, `?` or `!`); `None` for patterns.
    /// medea counts approvals per person, so only literal principals can approve.
    pub fn literal_principals(&self) -> Option<Vec<&str>> {
        let list: Vec<&str> = self.principals.split(',').collect();
        if list.iter().any(|p| p.contains(['*', '?', '!'])) {
            None
        } else {
            Some(list)
        }
    }
    /// Whether `identity` matches the principals pattern list (ssh-keygen `-I` semantics).
    pub fn matches_principal(&self, identity: &str) -> bool {
        match_pattern_list(identity, &self.principals) == PatternMatch::Positive
    }
    /// The `namespaces=` pattern list, if the line restricts namespaces.
    pub fn namespaces(&self) -> Option<&str> {
        self.namespaces.as_deref()
    }
    /// Whether a signature in `namespace` may be made by this key (no `namespaces=`: any).
    pub fn allows_namespace(&self, namespace: &str) -> bool {
        match &self.namespaces {
            None => true,
            Some(list) => match_pattern_list(namespace, list) == PatternMatch::Positive,
        }
    }
    /// The `valid-after` bound, if the line has one.
    pub fn valid_after(&self) -> Option<Timestamp> {
        self.valid_after
    }
    /// The `valid-before` bound, if the line has one.
    pub fn valid_before(&self) -> Option<Timestamp> {
        self.valid_before
    }
    /// Where `at` falls in the validity window (both bounds inclusive, like ssh-keygen).
    pub fn validity_at(&self, at: Timestamp) -> Validity {
        if let Some(after) = self.valid_after
            && at < after
        {
            return Validity::NotYetValid { valid_after: after };
        }
        if let Some(before) = self.valid_before
            && at > before
        {
            return Validity::Expired {
                valid_before: before,
            };
        }
        Validity::Valid
    }
    /// The signer's public key.
    pub fn key(&self) -> &PublicKey {
        &self.key
    }
    /// `SHA256:...`, the fingerprint ssh-keygen prints.
    pub fn fingerprint(&self) -> String {
        self.key.fingerprint(HashAlg::Sha256).to_string()
    }
}

/// Where a timestamp falls in an entry's validity window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Inside the window (or the line sets no bounds).
    Valid,
    /// Before the line's `valid-after`.
    NotYetValid {
        /// The line's `valid-after`.
        valid_after: Timestamp,
    },
    /// After the line's `valid-before`.
    Expired {
        /// The line's `valid-before`.
        valid_before: Timestamp,
    },
}

/// Canonical allowed_signers line (times written as `YYYYMMDDHHMMSSZ`).
impl fmt::Display for SignerEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.principals.contains([' ', '\t']) || self.principals.starts_with('#') {
            write!(f, "\"{}\"", self.principals)?;
        } else {
            f.write_str(&self.principals)?;
        }
        let mut opts = Vec::new();
        if let Some(ns) = &self.namespaces {
            opts.push(format!("namespaces=\"{}\"", ns.replace('"', "\\\"")));
        }
        if let Some(t) = self.valid_after {
            opts.push(format!("valid-after=\"{}\"", format_time(t)));
        }
        if let Some(t) = self.valid_before {
            opts.push(format!("valid-before=\"{}\"", format_time(t)));
        }
        if !opts.is_empty() {
            write!(f, " {}", opts.join(","))?;
        }
        let key = self.key.to_openssh().map_err(|_| fmt::Error)?;
        write!(f, " {key}")
    }
}

/// Format a timestamp the way allowed_signers takes it: `YYYYMMDDHHMMSSZ`.
pub fn format_time(t: Timestamp) -> String {
    t.strftime("%Y%m%d%H%M%SZ").to_string()
}

/// Parse an allowed_signers time (`YYYYMMDD[Z]`, `YYYYMMDDHHMM[SS][Z]`, `UTC` suffix too).
/// Every time is read as UTC (see the module docs).
pub fn parse_time(input: &str) -> Result<Timestamp, String> {
    let bad = || {
        format!(
            "invalid time `{input}`: expected YYYYMMDD, YYYYMMDDHHMM or YYYYMMDDHHMMSS, optionally followed by Z"
        )
    };
    let mut s = input;
    // Byte checks, not `s[len - 1..]`: the last character may be multi-byte (found by fuzzing).
    if s.len() > 1 && s.as_bytes()[s.len() - 1].eq_ignore_ascii_case(&b'z') {
        s = &s[..s.len() - 1];
    } else if s.len() > 3
        && s.is_char_boundary(s.len() - 3)
        && s[s.len() - 3..].eq_ignore_ascii_case("utc")
    {
        s = &s[..s.len() - 3];
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) || !matches!(s.len(), 8 | 12 | 14) {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> i64 { s[r].parse::<i64>().unwrap_or(-1) };
    let (y, mo, d) = (num(0..4), num(4..6), num(6..8));
    let (h, mi, sec) = match s.len() {
        8 => (0, 0, 0),
        12 => (num(8..10), num(10..12), 0),
        _ => (num(8..10), num(10..12), num(12..14)),
    };
    let dt = jiff::civil::DateTime::new(
        i16::try_from(y).map_err(|_| bad())?,
        i8::try_from(mo).map_err(|_| bad())?,
        i8::try_from(d).map_err(|_| bad())?,
        i8::try_from(h).map_err(|_| bad())?,
        i8::try_from(mi).map_err(|_| bad())?,
        i8::try_from(sec).map_err(|_| bad())?,
        0,
    )
    .map_err(|_| bad())?;
    let ts = dt
        .to_zoned(jiff::tz::TimeZone::UTC)
        .map_err(|_| bad())?
        .timestamp();
    if ts <= Timestamp::UNIX_EPOCH {
        return Err(format!(
            "invalid time `{input}`: must be after 1970-01-01T00:00:00Z"
        ));
    }
    Ok(ts)
}

/// The result of matching a string against an OpenSSH pattern list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternMatch {
    /// Some positive pattern matched and no negated one did.
    Positive,
    /// A negated (`!pattern`) pattern matched: a definite no.
    Negative,
    /// Nothing matched.
    NoMatch,
}

/// OpenSSH `match_pattern_list` (case-sensitive): comma-separated patterns with `*` and `?`,
/// a leading `!` negates; a matching negated pattern wins.
pub fn match_pattern_list(s: &str, list: &str) -> PatternMatch {
    let mut positive = false;
    for pat in list.split(',') {
        let (negated, pat) = match pat.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, pat),
        };
        if match_pattern(s.as_bytes(), pat.as_bytes()) {
            if negated {
                return PatternMatch::Negative;
            }
            positive = true;
        }
    }
    if positive {
        PatternMatch::Positive
    } else {
        PatternMatch::NoMatch
    }
}

/// Glob match with `*` (any run) and `?` (any one byte); iterative, linear backtracking.
fn match_pattern(s: &[u8], p: &[u8]) -> bool {
    let (mut si, mut pi) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == s[si]) {
            si += 1;
            pi += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

type LineError = (Option<usize>, String);

fn column_of(line: &str, byte_offset: usize) -> usize {
    let mut off = byte_offset.min(line.len());
    while !line.is_char_boundary(off) {
        off -= 1;
    }
    line[..off].chars().count() + 1
}

fn is_blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn skip_blank(line: &str, mut i: usize) -> usize {
    let b = line.as_bytes();
    while i < b.len() && is_blank(b[i]) {
        i += 1;
    }
    i
}

/// The end of a whitespace-delimited token starting at `i`, honouring double quotes.
fn token_end(line: &str, start: usize) -> Result<usize, LineError> {
    let b = line.as_bytes();
    let mut i = start;
    let mut quoted = false;
    while i < b.len() {
        match b[i] {
            b'"' => quoted = !quoted,
            b'\\' if quoted && b.get(i + 1) == Some(&b'"') => i += 1,
            c if !quoted && is_blank(c) => break,
            _ => {}
        }
        i += 1;
    }
    if quoted {
        return Err((Some(start), "missing closing double quote".to_string()));
    }
    Ok(i)
}

fn parse_line(line: &str, line_no: usize) -> Result<Option<SignerEntry>, LineError> {
    let start = skip_blank(line, 0);
    if start == line.len() || line.as_bytes()[start] == b'#' {
        return Ok(None);
    }

    // principals (optionally quoted)
    let b = line.as_bytes();
    let (principals, after_principals) = if b[start] == b'"' {
        let close = line[start + 1..].find('"').map(|i| start + 1 + i).ok_or((
            Some(start),
            "missing closing double quote around the principals".to_string(),
        ))?;
        let end = close + 1;
        if end < b.len() && !is_blank(b[end]) {
            return Err((
                Some(end),
                "expected a space after the quoted principals".to_string(),
            ));
        }
        (&line[start + 1..close], end)
    } else {
        let end = start
            + line[start..]
                .find(|c: char| c.is_ascii_whitespace())
                .unwrap_or(line.len() - start);
        (&line[start..end], end)
    };
    if principals.is_empty() {
        return Err((Some(start), "the principals field is empty".to_string()));
    }
    if principals.split(',').any(str::is_empty) {
        return Err((
            Some(start),
            format!("principals `{principals}` contain an empty entry (check the commas)"),
        ));
    }

    let mut i = skip_blank(line, after_principals);
    if i == line.len() {
        return Err((
            Some(i),
            "missing key: expected `[options] keytype base64-key` after the principals".to_string(),
        ));
    }

    // options, when the next token does not look like a key type
    let mut opts = Options::default();
    let first_end = token_end(line, i)?;
    let first = &line[i..first_end];
    if looks_like_options(first) {
        opts = parse_options(line, i, first_end)?;
        i = skip_blank(line, first_end);
        if i == line.len() {
            return Err((
                Some(i),
                "missing key: expected `keytype base64-key` after the options".to_string(),
            ));
        }
    }
    if opts.cert_authority {
        return Err((
            Some(opts.cert_authority_at),
            "`cert-authority` is not supported by medea: list each signer's own public key instead of a certificate authority".to_string(),
        ));
    }

    // key: keytype, base64, optional comment
    let kt_end = i + line[i..]
        .find(|c: char| c.is_ascii_whitespace())
        .unwrap_or(line.len() - i);
    let keytype = &line[i..kt_end];
    let b64_start = skip_blank(line, kt_end);
    if b64_start == line.len() {
        return Err((
            Some(i),
            format!("missing base64 key data after key type `{keytype}`"),
        ));
    }
    let b64_end = b64_start
        + line[b64_start..]
            .find(|c: char| c.is_ascii_whitespace())
            .unwrap_or(line.len() - b64_start);
    let b64 = &line[b64_start..b64_end];
    if keytype.contains("-cert-v01@openssh.com") {
        return Err((
            Some(i),
            format!("key type `{keytype}` is a certificate; medea needs the plain public key"),
        ));
    }
    let key = PublicKey::from_openssh(&format!("{keytype} {b64}")).map_err(|_| {
        (
            Some(i),
            format!(
                "invalid public key `{keytype} {}`: not a valid OpenSSH public key",
                abbreviate(b64)
            ),
        )
    })?;
    if key.algorithm().as_str() != keytype {
        return Err((
            Some(i),
            format!(
                "key type `{keytype}` does not match the key data, which is a `{}` key",
                key.algorithm().as_str()
            ),
        ));
    }
    if matches!(key.algorithm(), Algorithm::Dsa) {
        return Err((
            Some(i),
            "DSA keys are not accepted for approvals: use an ed25519, ecdsa or rsa key".to_string(),
        ));
    }
    let comment = line[b64_end..].trim();
    let mut key = key;
    key.set_comment(comment);

    Ok(Some(SignerEntry {
        line: line_no,
        principals: principals.to_string(),
        namespaces: opts.namespaces,
        valid_after: opts.valid_after,
        valid_before: opts.valid_before,
        key,
    }))
}

fn abbreviate(s: &str) -> String {
    if s.chars().count() > 16 {
        format!("{}…", s.chars().take(16).collect::<String>())
    } else {
        s.to_string()
    }
}

fn looks_like_options(token: &str) -> bool {
    token.contains('=') || token.contains(',') || token.eq_ignore_ascii_case("cert-authority")
}

#[derive(Default)]
struct Options {
    cert_authority: bool,
    cert_authority_at: usize,
    namespaces: Option<String>,
    valid_after: Option<Timestamp>,
    valid_before: Option<Timestamp>,
}

fn starts_with_ci(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len()
        && s.is_char_boundary(prefix.len())
        && s[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// Parse `option[,option...]` in `line[start..end]` (sshsig.c `sshsigopt_parse`).
fn parse_options(line: &str, start: usize, end: usize) -> Result<Options, LineError> {
    let mut o = Options::default();
    let mut i = start;
    loop {
        let rest = &line[i..end];
        if starts_with_ci(rest, "cert-authority")
            && matches!(
                rest.as_bytes().get("cert-authority".len()),
                None | Some(b',')
            )
        {
            o.cert_authority = true;
            o.cert_authority_at = i;
            i += "cert-authority".len();
        } else if starts_with_ci(rest, "namespaces=") {
            if o.namespaces.is_some() {
                return Err((Some(i), "`namespaces` is given more than once".to_string()));
            }
            let (value, next) = dequote(line, i + "namespaces=".len(), end, "namespaces")?;
            o.namespaces = Some(value);
            i = next;
        } else if starts_with_ci(rest, "valid-after=") || starts_with_ci(rest, "valid-before=") {
            let after = starts_with_ci(rest, "valid-after=");
            let name = if after { "valid-after" } else { "valid-before" };
            let slot = if after {
                &mut o.valid_after
            } else {
                &mut o.valid_before
            };
            if slot.is_some() {
                return Err((Some(i), format!("`{name}` is given more than once")));
            }
            let value_at = i + name.len() + 1;
            let (value, next) = dequote(line, value_at, end, name)?;
            let t = parse_time(&value).map_err(|m| (Some(value_at), format!("`{name}`: {m}")))?;
            *slot = Some(t);
            i = next;
        } else {
            let name_len = rest.find([',', '=']).unwrap_or(rest.len());
            return Err((
                Some(i),
                format!(
                    "unknown option `{}` (supported: namespaces=\"...\", valid-after=\"...\", valid-before=\"...\")",
                    &rest[..name_len]
                ),
            ));
        }
        if i == end {
            break;
        }
        if line.as_bytes()[i] != b',' {
            return Err((
                Some(i),
                "expected `,` between options (no spaces outside quotes)".to_string(),
            ));
        }
        i += 1;
        if i == end {
            return Err((Some(i), "unexpected end of options after `,`".to_string()));
        }
    }
    if let (Some(a), Some(b)) = (o.valid_after, o.valid_before)
        && b <= a
    {
        return Err((
            Some(start),
            "`valid-before` must be later than `valid-after`".to_string(),
        ));
    }
    Ok(o)
}

/// A double-quoted option value starting at `i` (OpenSSH `opt_dequote`: `\"` is an escaped quote).
fn dequote(line: &str, i: usize, end: usize, name: &str) -> Result<(String, usize), LineError> {
    let b = line.as_bytes();
    if i >= end || b[i] != b'"' {
        return Err((
            Some(i),
            format!("the value of `{name}` must be in double quotes, e.g. {name}=\"...\""),
        ));
    }
    let mut out = Vec::new();
    let mut j = i + 1;
    while j < end && b[j] != b'"' {
        if b[j] == b'\\' && b.get(j + 1) == Some(&b'"') {
            j += 1;
        }
        out.push(b[j]);
        j += 1;
    }
    if j >= end {
        return Err((Some(i), format!("missing closing double quote in `{name}`")));
    }
    // `out` is a run of bytes copied from valid UTF-8 between ASCII quotes, so it is UTF-8.
    Ok((String::from_utf8_lossy(&out).into_owned(), j + 1))
}

#[cfg(test)]
mod tests;
