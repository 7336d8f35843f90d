//! Standard output for the CLI's commands.
//!
//! `print!` panics when stdout is a pipe whose reader has gone (`medea schema | head -1`,
//! `medea get machines | head`): the user sees a panic and a backtrace hint where a C tool
//! would have been ended by SIGPIPE without a word. Every command writes through [`write`]
//! (the `out!`/`outln!` macros) instead: a closed pipe ends the process with status 141, the
//! status a shell reports for a process ended by SIGPIPE (128 + 13), so `set -o pipefail`
//! scripts see what they see for any other tool; any other write error is reported and ends
//! the process with status 1. Nothing is left half-done by that exit: commands write their
//! store records and files before they print.

use std::io::Write as _;

/// The status a shell reports for a process ended by SIGPIPE.
pub const BROKEN_PIPE_STATUS: i32 = 128 + 13;

/// Write formatted text to stdout (see the module docs for what a failed write does).
pub fn write(args: std::fmt::Arguments<'_>) {
    let result = std::io::stdout().lock().write_fmt(args);
    if let Err(e) = result {
        failed(e);
    }
}

/// Write bytes to stdout and flush them (see the module docs for what a failed write does).
pub fn write_bytes(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        failed(e);
    }
}

fn failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(BROKEN_PIPE_STATUS);
    }
    eprintln!("Error: cannot write to standard output: {e}");
    std::process::exit(1);
}
