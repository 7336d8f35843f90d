//! Printing desired-state diagnostics to stderr (the rendering is [`crate::ops::report`]).

use crate::desired::Loaded;
pub use crate::ops::report::{Rendered, render_plain, report};

/// Print every diagnostic to stderr, then a one-line summary. Returns the error count.
pub fn print_diagnostics(loaded: &Loaded, display_root: &str) -> usize {
    for d in &loaded.diagnostics {
        eprintln!("{:?}", report(d, loaded, display_root));
    }
    let errors = loaded.errors().count();
    let warnings = loaded.diagnostics.len() - errors;
    if errors > 0 || warnings > 0 {
        eprintln!(
            "{errors} error{}, {warnings} warning{} in {display_root}",
            if errors == 1 { "" } else { "s" },
            if warnings == 1 { "" } else { "s" }
        );
    }
    errors
}
