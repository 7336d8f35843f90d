//! Rendering desired-state diagnostics as miette reports with source snippets, for the CLI
//! (printed to stderr) and the API (as plain text in `GetPlan`'s diagnostics). Pure: it
//! builds reports and strings; printing is the caller's.

use std::fmt;

use miette::{Diagnostic as MietteDiagnostic, LabeledSpan, NamedSource, Report, SourceSpan};

use crate::desired::{Diagnostic, Loaded, Severity};

/// A desired-state diagnostic, adapted to miette.
#[derive(Debug)]
pub struct Rendered {
    diag: Diagnostic,
    source: NamedSource<String>,
}

impl fmt::Display for Rendered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.diag.message)
    }
}

impl std::error::Error for Rendered {}

impl MietteDiagnostic for Rendered {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.diag.code))
    }
    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.diag.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }
    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.diag
            .help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }
    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        Some(&self.source)
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let o = &self.diag.origin;
        let span = SourceSpan::new(o.offset.into(), o.len.max(1));
        Some(Box::new(std::iter::once(LabeledSpan::new_with_span(
            Some(self.diag.label.clone()),
            span,
        ))))
    }
}

/// Turn a diagnostic into a report, with its file's text when it is known.
pub fn report(diag: &Diagnostic, loaded: &Loaded, display_root: &str) -> Report {
    let text = loaded
        .sources
        .get(&diag.origin.file)
        .map(|t| t.to_string())
        .unwrap_or_default();
    let name = if display_root.is_empty() || display_root == "." {
        diag.origin.file.clone()
    } else {
        format!(
            "{}/{}",
            display_root.trim_end_matches('/'),
            diag.origin.file
        )
    };
    let mut diag = diag.clone();
    // A span past the end of the text (files we could not decode) would not render.
    if diag.origin.offset + diag.origin.len > text.len() {
        diag.origin.offset = 0;
        diag.origin.len = 0;
    }
    Report::new(Rendered {
        diag,
        source: NamedSource::new(name, text).with_language("yaml"),
    })
}

/// The report as plain text (no colours, no wrapping), for the API and logs.
pub fn render_plain(diag: &Diagnostic, loaded: &Loaded) -> String {
    let mut out = String::new();
    let handler =
        miette::GraphicalReportHandler::new_themed(miette::GraphicalTheme::unicode_nocolor())
            .with_width(usize::MAX / 4);
    let r = report(diag, loaded, "");
    let _ = handler.render_report(&mut out, r.as_ref());
    out
}
