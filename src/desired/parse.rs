//! YAML text → raw documents with positions. Pure.
//!
//! Files are split into documents at `---`/`...` markers (a line starting with either marker is
//! always a document boundary in YAML, even inside block scalars), then each document is read
//! twice: a lenient `{apiVersion, kind}` header, then the concrete kind, strictly. Reading the
//! concrete struct directly (not an internally tagged enum) keeps serde-saphyr's positions.

use serde::de::DeserializeOwned;
use serde_saphyr::Location;

use super::diagnostic::{Diagnostic, codes};
use super::format::{ClusterDoc, Header, Identity, NodePoolDoc};
use super::model::Origin;

/// Largest file accepted; larger ones are refused with a diagnostic (YAML bombs, mistakes).
pub const MAX_FILE_BYTES: usize = 4 * 1024 * 1024;

/// Most YAML documents in one file; a file with more is refused whole.
pub const MAX_DOCUMENTS_PER_FILE: usize = 1_000;

/// One document of one file.
#[derive(Debug, Clone)]
pub struct DocText<'a> {
    /// Path of the file, relative to the desired-state root.
    pub file: &'a str,
    /// The document's text alone, without the `---` separators.
    pub text: &'a str,
    /// Byte offset of the document start inside the file.
    pub offset: usize,
    /// 0-based line of the document start inside the file.
    pub line: usize,
}

impl DocText<'_> {
    /// The absolute origin of a location reported inside this document.
    pub fn origin(&self, loc: &Location) -> Origin {
        let span = loc.span();
        // Syntax errors from the scanner carry line and column but no byte span: place them
        // by line and column, not at the document's first byte.
        let (offset, len) = match (span.byte_offset(), span.byte_len()) {
            (Some(o), Some(l)) => (o as usize, l as usize),
            _ => self.byte_at(loc.line() as usize, loc.column() as usize),
        };
        Origin {
            file: self.file.to_string(),
            line: self.line + (loc.line().max(1) as usize),
            column: loc.column().max(1) as usize,
            offset: self.offset + offset.min(self.text.len()),
            len: len.min(self.text.len().saturating_sub(offset)),
        }
    }
    /// The byte offset of 1-based `line` and `column` (in characters) inside this document,
    /// and the byte length of the character there (0 at a line's end or past the text).
    fn byte_at(&self, line: usize, column: usize) -> (usize, usize) {
        let mut start = 0;
        for l in self.text.split_inclusive('\n').take(line.saturating_sub(1)) {
            start += l.len();
        }
        let rest = &self.text[start.min(self.text.len())..];
        let this = rest.split('\n').next().unwrap_or("");
        match this.char_indices().nth(column.saturating_sub(1)) {
            Some((i, c)) => (start + i, c.len_utf8()),
            None => (start + this.len(), 0),
        }
    }

    /// The origin of the document itself (its first line).
    pub fn start(&self) -> Origin {
        let first = self
            .text
            .lines()
            .position(|l| {
                let t = l.trim();
                !t.is_empty() && !t.starts_with('#') && t != "---"
            })
            .unwrap_or(0);
        let off: usize = self.text.lines().take(first).map(|l| l.len() + 1).sum();
        let len = self.text[off.min(self.text.len())..]
            .lines()
            .next()
            .map_or(0, str::len);
        Origin {
            file: self.file.to_string(),
            line: self.line + first + 1,
            column: 1,
            offset: self.offset + off.min(self.text.len()),
            len,
        }
    }
}

fn is_marker(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r']))
}

/// Split a file into documents, skipping those that hold only comments and blank lines.
pub fn split_documents<'a>(file: &'a str, text: &'a str) -> Vec<DocText<'a>> {
    let mut docs = Vec::new();
    let mut start = 0usize;
    let mut start_line = 0usize;
    let mut pos = 0usize;
    let mut line_no = 0usize;
    let push = |from: usize, to: usize, line: usize, docs: &mut Vec<DocText<'a>>| {
        let chunk = &text[from..to];
        let meaningful = chunk.lines().any(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with('#') && !is_marker(l, "---") && !is_marker(l, "...")
        });
        if meaningful {
            docs.push(DocText {
                file,
                text: chunk,
                offset: from,
                line,
            });
        }
    };
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if is_marker(bare, "---") && pos > start {
            push(start, pos, start_line, &mut docs);
            start = pos;
            start_line = line_no;
        } else if is_marker(bare, "...") {
            push(start, pos, start_line, &mut docs);
            start = pos + line.len();
            start_line = line_no + 1;
        }
        pos += line.len();
        line_no += 1;
    }
    push(start, text.len(), start_line, &mut docs);
    docs
}

/// A successfully read document of a known kind.
#[derive(Debug)]
pub enum RawDoc<'a> {
    /// A `kind: Cluster` document and its text.
    Cluster(ClusterDoc, DocText<'a>),
    /// A `kind: NodePool` document and its text.
    NodePool(NodePoolDoc, DocText<'a>),
}

fn options() -> serde_saphyr::Options {
    serde_saphyr::options! { with_snippet: false }
}

/// serde-saphyr's message without its trailing position and developer hints.
fn clean_message(err: &serde_saphyr::Error) -> String {
    let mut msg = err.without_snippet().to_string();
    if let Some(i) = msg.rfind(" at line ") {
        msg.truncate(i);
    }
    msg.replace(", set DuplicateKeyPolicy in Options if acceptable", "")
}

fn yaml_error(doc: &DocText<'_>, err: &serde_saphyr::Error) -> Diagnostic {
    let msg = clean_message(err);
    let origin = err
        .location()
        .map(|l| doc.origin(&l))
        .unwrap_or_else(|| doc.start());
    let (code, help) = if msg.starts_with("unknown field") {
        (
            codes::UNKNOWN_FIELD,
            Some("check the spelling and indentation against the schema in schemas/".to_string()),
        )
    } else if msg.contains("missing field") {
        (codes::INVALID_VALUE, None)
    } else if msg.starts_with("unknown variant") || msg.starts_with("invalid") {
        (codes::INVALID_VALUE, None)
    } else {
        (codes::SYNTAX, None)
    };
    let mut d = Diagnostic::error(code, origin, msg);
    d.help = help;
    d
}

fn strict<T: DeserializeOwned>(doc: &DocText<'_>) -> Result<T, Diagnostic> {
    serde_saphyr::from_str_with_options::<T>(doc.text, options()).map_err(|e| yaml_error(doc, &e))
}

/// A document that could not be read strictly, as far as it can be identified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broken {
    /// A `kind: Cluster` document.
    Cluster {
        /// Its `metadata.name`.
        name: String,
    },
    /// A `kind: NodePool` document.
    NodePool {
        /// Its `metadata.name`.
        name: String,
        /// The cluster it names in `spec.cluster`.
        cluster: String,
    },
}

/// Identify a document leniently (kind, name, cluster), ignoring every other field.
pub fn identify(doc: &DocText<'_>) -> Option<Broken> {
    let id: Identity = serde_saphyr::from_str_with_options(doc.text, options()).ok()?;
    let name = id.metadata?.name?;
    match id.kind?.as_str() {
        "Cluster" => Some(Broken::Cluster { name }),
        "NodePool" => Some(Broken::NodePool {
            name,
            cluster: id.spec?.cluster?,
        }),
        _ => None,
    }
}

/// The value of a top-level `kind:` line, if the document spells its kind plainly.
fn plain_kind(text: &str) -> Option<&str> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix("kind:")?;
        let v = v.split('#').next().unwrap_or("").trim();
        (!v.is_empty()).then_some(v)
    })
}

/// Read one document: header first, then the concrete kind.
///
/// Fast path: a document with a plain top-level `kind: Cluster` or `kind: NodePool` line is
/// read strictly at once (one parse instead of two). Whenever that read fails, or its `kind`
/// is not the one the line suggested, the document goes through the full path below, so the
/// result and every diagnostic are exactly those of the full path.
pub fn read_document<'a>(doc: DocText<'a>) -> Result<RawDoc<'a>, Diagnostic> {
    match plain_kind(doc.text) {
        Some("Cluster") => {
            if let Ok(c) = serde_saphyr::from_str_with_options::<ClusterDoc>(doc.text, options())
                && c.kind.value == "Cluster"
            {
                return Ok(RawDoc::Cluster(c, doc));
            }
        }
        Some("NodePool") => {
            if let Ok(p) = serde_saphyr::from_str_with_options::<NodePoolDoc>(doc.text, options())
                && p.kind.value == "NodePool"
            {
                return Ok(RawDoc::NodePool(p, doc));
            }
        }
        _ => {}
    }
    read_document_slow(doc)
}

fn read_document_slow<'a>(doc: DocText<'a>) -> Result<RawDoc<'a>, Diagnostic> {
    let header: Header = serde_saphyr::from_str_with_options(doc.text, options())
        .map_err(|e| yaml_error(&doc, &e))?;
    let Some(kind) = header.kind else {
        return Err(Diagnostic::error(
            codes::KIND,
            doc.start(),
            "document has no `kind`",
        )
        .with_help("every document starts with `apiVersion: medea/v1alpha1` and `kind: Cluster` or `kind: NodePool`"));
    };
    if header.api_version.is_none() {
        return Err(Diagnostic::error(
            codes::API_VERSION,
            doc.start(),
            "document has no `apiVersion`",
        )
        .with_help("add `apiVersion: medea/v1alpha1`"));
    }
    match kind.value.as_str() {
        "Cluster" => Ok(RawDoc::Cluster(strict(&doc)?, doc)),
        "NodePool" => Ok(RawDoc::NodePool(strict(&doc)?, doc)),
        other => Err(Diagnostic::error(
            codes::KIND,
            doc.origin(&kind.referenced),
            format!("unknown kind `{other}`"),
        )
        .with_help("medea/v1alpha1 knows the kinds `Cluster` and `NodePool`")),
    }
}

/// Most unknown fields read past in one document; past them, the rest of it is not checked.
pub const MAX_UNKNOWN_FIELDS: usize = 32;

/// What [`read_past_unknown_fields`] adds to an unknown field it could not read past.
const NOT_CHECKED: &str =
    "the rest of this document was not checked (its values are checked once this field is fixed)";

/// Read one document as [`read_document`] does, but read past unknown fields (issue #52 item
/// 5): each unknown field is reported, then the document is read again without it (its key
/// and value blanked out, so every other byte keeps its position), so its other errors are
/// reported in the same run. Returns the document when everything but its unknown fields reads,
/// and every diagnostic found on the way; when an unknown field cannot be read past, its
/// diagnostic says the rest of the document was not checked.
pub fn read_past_unknown_fields<'a>(doc: DocText<'a>) -> (Option<RawDoc<'a>>, Vec<Diagnostic>) {
    let mut diags = Vec::new();
    let mut text = doc.text.to_string();
    for _ in 0..=MAX_UNKNOWN_FIELDS {
        let attempt = DocText {
            text: &text,
            ..doc.clone()
        };
        let err = match read_document(attempt) {
            Ok(RawDoc::Cluster(c, _)) => return (Some(RawDoc::Cluster(c, doc)), diags),
            Ok(RawDoc::NodePool(p, _)) => return (Some(RawDoc::NodePool(p, doc)), diags),
            Err(e) => e,
        };
        let at = err.origin.offset.checked_sub(doc.offset);
        let blanked = match at {
            Some(at) if err.code == codes::UNKNOWN_FIELD && diags.len() < MAX_UNKNOWN_FIELDS => {
                blank_field(&text, at)
            }
            _ => None,
        };
        match blanked {
            Some(b) => {
                diags.push(err);
                text = b;
            }
            None => {
                let err = if err.code == codes::UNKNOWN_FIELD {
                    let help = err.help.clone().unwrap_or_default();
                    err.with_help(format!("{help}; {NOT_CHECKED}"))
                } else {
                    err
                };
                diags.push(err);
                return (None, diags);
            }
        }
    }
    (None, diags)
}

/// `text` with the mapping entry whose key starts at byte `at` blanked out: its key and value
/// become spaces (line breaks stay), so every other byte keeps its offset, line and column.
/// In a flow mapping (`{a: 1, colour: blue}`) the entry ends at the next `,`, `}` or `]` at
/// its own depth (a following comma is blanked with it); in a block mapping it is the key's
/// line and the lines below indented deeper (or a sequence at the key's own indentation).
/// `None` when `at` is not the start of a key or nothing would change.
fn blank_field(text: &str, at: usize) -> Option<String> {
    if at >= text.len() || !text.is_char_boundary(at) {
        return None;
    }
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let before = text[line_start..at].trim_end();
    let flow = before.ends_with('{') || before.ends_with(',');
    let end = if flow {
        flow_entry_end(text, at)?
    } else {
        if !before.trim_start_matches(['-', ' ']).is_empty() {
            return None;
        }
        block_entry_end(text, at, at - line_start)
    };
    if end <= at {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..at]);
    out.extend(text[at..end].bytes().map(|b| {
        if b == b'\n' || b == b'\r' {
            b as char
        } else {
            ' '
        }
    }));
    out.push_str(&text[end..]);
    Some(out)
}

/// Where a flow-mapping entry starting at `at` ends (after its comma, or at the bracket that
/// closes its mapping); quotes and nested brackets are skipped.
fn flow_entry_end(text: &str, at: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut chars = text[at..].char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match (quote, c) {
            (Some('\''), '\'') if chars.peek().is_some_and(|(_, n)| *n == '\'') => {
                chars.next();
            }
            (Some('"'), '\\') => {
                chars.next();
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '{' | '[') => depth += 1,
            (None, '}' | ']') if depth == 0 => return Some(at + i),
            (None, '}' | ']') => depth -= 1,
            (None, ',') if depth == 0 => return Some(at + i + 1),
            (None, _) => {}
        }
    }
    None
}

/// Where a block-mapping entry whose key is at `column` (bytes from its line's start) ends:
/// after its line and every following line that is blank or indented deeper, or a sequence
/// item at the key's own indentation (YAML lets a key's sequence sit there).
fn block_entry_end(text: &str, at: usize, column: usize) -> usize {
    let mut end = text[at..].find('\n').map_or(text.len(), |i| at + i + 1);
    let mut last_content = end;
    while end < text.len() {
        let line = text[end..].split_inclusive('\n').next().unwrap_or("");
        let body = line.trim_end_matches(['\n', '\r']);
        let trimmed = body.trim_start_matches(' ');
        let indent = body.len() - trimmed.len();
        let continues = trimmed.is_empty()
            || indent > column
            || (indent == column && (trimmed == "-" || trimmed.starts_with("- ")));
        if !continues {
            break;
        }
        end += line.len();
        if !trimmed.is_empty() {
            last_content = end;
        }
    }
    // trailing blank lines stay (they separate what follows)
    last_content
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_multi_document_files_and_keeps_positions() {
        let text = "# header comment\n---\na: 1\n---\n# only a comment\n---\nb: 2\n...\n";
        let docs = split_documents("f.yaml", text);
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].text, "---\na: 1\n");
        assert_eq!(docs[0].line, 1);
        assert_eq!(docs[1].text, "---\nb: 2\n");
        assert_eq!(docs[1].line, 5);
        assert_eq!(&text[docs[1].offset..docs[1].offset + 3], "---");
        assert_eq!(docs[1].start().line, 7);
    }

    #[test]
    fn a_dash_line_inside_a_value_is_not_a_marker() {
        let docs = split_documents("f.yaml", "a: |\n  ---x\n  text\n----\nb: 1\n");
        assert_eq!(docs.len(), 1);
    }

    #[test]
    fn unknown_field_is_located_absolutely() {
        let text = "---\napiVersion: medea/v1alpha1\nkind: Cluster\n---\napiVersion: medea/v1alpha1\nkind: Cluster\nmetadata: {name: x}\nspec:\n  kubernetes: {version: v1.34.1}\n  bogus: 1\n";
        let docs = split_documents("c.yaml", text);
        let err = read_document(docs[1].clone()).unwrap_err();
        assert_eq!(err.code, codes::UNKNOWN_FIELD);
        assert!(
            err.message.starts_with("unknown field `bogus`"),
            "{}",
            err.message
        );
        assert_eq!((err.origin.line, err.origin.column), (10, 3));
        assert_eq!(&text[err.origin.offset..err.origin.offset + 5], "bogus");
    }

    #[test]
    fn unknown_kind_and_missing_header() {
        let d = split_documents("f.yaml", "apiVersion: medea/v1alpha1\nkind: Pool\n");
        let e = read_document(d[0].clone()).unwrap_err();
        assert_eq!(e.code, codes::KIND);
        assert_eq!(e.message, "unknown kind `Pool`");
        assert_eq!((e.origin.line, e.origin.column), (2, 7));
        let d = split_documents("f.yaml", "# c\nfoo: 1\n");
        let e = read_document(d[0].clone()).unwrap_err();
        assert_eq!(e.message, "document has no `kind`");
        assert_eq!(e.origin.line, 2);
    }

    /// Issue #39: a syntax error is shown where the parser found it (line, column and the byte
    /// the caret points at), not at the document's first byte. One case per error class.
    #[test]
    fn syntax_errors_are_located_where_the_parser_found_them() {
        let head = "# comment\n---\napiVersion: medea/v1alpha1\nkind: Cluster\n";
        let cases = [
            // (what follows the header, message starts with, line, column, text at the caret)
            (
                "metadata:\n  name: \"home\nspec: {}\n",
                "unclosed quote",
                6,
                9,
                "\"",
            ),
            (
                "metadata: {name: home}\nspec:\n  x: [a, b\n  y: 1\n",
                "",
                8,
                4,
                ":",
            ),
            (
                "metadata: {name: home}\nspec:\n\tkubernetes: {}\n",
                "tabs disallowed",
                7,
                2,
                "k",
            ),
            (
                "metadata:\n  name: home\n   other: 1\n",
                "mapping values are not allowed",
                7,
                9,
                ":",
            ),
            (
                "metadata: {name: home}\nmetadata: {name: x}\n",
                "duplicate mapping key",
                6,
                1,
                "m",
            ),
        ];
        for (body, starts, line, column, at) in cases {
            let text = format!("{head}{body}");
            let docs = split_documents("c.yaml", &text);
            let e = read_document(docs[0].clone()).unwrap_err();
            assert!(e.message.starts_with(starts), "{body:?}: {}", e.message);
            assert_eq!(
                (e.origin.line, e.origin.column),
                (line, column),
                "{body:?}: {}",
                e.message
            );
            assert_eq!(
                &text[e.origin.offset..e.origin.offset + at.len()],
                at,
                "{body:?}: {}",
                e.message
            );
            assert!(e.origin.offset > 0, "{body:?}");
        }
    }

    #[test]
    fn a_line_and_column_map_to_their_byte_even_after_multibyte_text() {
        let docs = split_documents("f.yaml", "a: \"é\"\nbé: [1\n");
        let d = &docs[0];
        assert_eq!(d.byte_at(2, 2), (5 + 3 + 1, 2)); // `é` of `bé`
        assert_eq!(d.byte_at(2, 99), (d.text.len() - 1, 0)); // past the line's end
        assert_eq!(d.byte_at(9, 1).1, 0); // past the text
    }
    /// Issue #52 item 5: an unknown field no longer hides the document's other errors; every
    /// other byte keeps its position.
    #[test]
    fn reading_past_unknown_fields_keeps_the_other_errors_and_positions() {
        let head = "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata: {name: x}\n";
        let text = format!("{head}spec: {{colour: blue, kubernetes: {{version: v1.34.1}}}}\n");
        let docs = split_documents("c.yaml", &text);
        let (doc, diags) = read_past_unknown_fields(docs[0].clone());
        assert_eq!(diags.len(), 1, "{diags:?}");
        assert!(
            diags[0].message.starts_with("unknown field `colour`"),
            "{diags:?}"
        );
        let Some(RawDoc::Cluster(c, d)) = doc else {
            panic!("the rest of the document reads")
        };
        assert_eq!(d.text, text, "the document keeps its own text");
        let v = &c.spec.kubernetes.version;
        assert_eq!(
            &text[v.referenced.span().byte_offset().unwrap() as usize..][..7],
            "v1.34.1"
        );
        // block style, two unknown fields, one with a nested value
        let text = format!(
            "{head}spec:\n  colour:\n    shade: blue\n  kubernetes: {{version: v1.34.1}}\n  size: 3\n"
        );
        let docs = split_documents("c.yaml", &text);
        let (doc, diags) = read_past_unknown_fields(docs[0].clone());
        let msgs: Vec<&str> = diags.iter().map(|d| d.message.as_str()).collect();
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert!(msgs[0].starts_with("unknown field `colour`"), "{msgs:?}");
        assert!(msgs[1].starts_with("unknown field `size`"), "{msgs:?}");
        assert!(matches!(doc, Some(RawDoc::Cluster(..))), "{doc:?}");
        // an error that is not an unknown field is reported beside it
        let text = format!("{head}spec: {{colour: blue, kubernetes: [1, 2]}}\n");
        let docs = split_documents("c.yaml", &text);
        let (doc, diags) = read_past_unknown_fields(docs[0].clone());
        assert!(doc.is_none());
        assert_eq!(diags.len(), 2, "{diags:?}");
        assert_eq!(diags[0].code, codes::UNKNOWN_FIELD);
        assert_ne!(diags[1].code, codes::UNKNOWN_FIELD, "{diags:?}");
    }

    #[test]
    fn blanking_a_field_keeps_every_other_byte_in_place() {
        let t = "spec: {a: 1, colour: {x: [1, \"}\"]}, b: 2}\n";
        let b = blank_field(t, t.find("colour").unwrap()).unwrap();
        assert_eq!(b.len(), t.len());
        assert_eq!(b, format!("spec: {{a: 1,{}b: 2}}\n", " ".repeat(24)));
        let t = "spec: {a: 1, colour: blue}\n";
        let b = blank_field(t, t.find("colour").unwrap()).unwrap();
        assert_eq!(b, "spec: {a: 1,             }\n");
        let t = "spec:\n  colour:\n  - a\n  - b\n\n  size: 3\n";
        let b = blank_field(t, t.find("colour").unwrap()).unwrap();
        assert_eq!(b, "spec:\n         \n     \n     \n\n  size: 3\n");
        assert_eq!(blank_field("a: 1\n", 3), None, "not a key");
    }
}
