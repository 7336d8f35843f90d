//! The `medea` command line: clap commands and output formatting only.
//!
//! **Owns:** argument parsing, exit codes, rendering of diagnostics (miette) and tables.
//! **May depend on:** every other module; nothing depends on it.
//! Architecture Invariant: no domain decision is made here; commands call into the modules.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

pub mod debug;
pub mod desired;
pub mod report;
pub mod rollout_debug;

/// Exit codes shared by every command (documented in README.md).
pub mod exit {
    /// Success, no changes (for `plan`).
    pub const OK: u8 = 0;
    /// An error: invalid input, unreachable service, refused operation.
    pub const ERROR: u8 = 1;
    /// `medea plan`: the plan has changes (terraform's `-detailed-exitcode`).
    pub const CHANGES: u8 = 2;
}

/// An external control plane for Talos Linux Kubernetes clusters.
#[derive(Debug, Parser)]
#[command(name = "medea", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check desired-state files: every error at once, with file:line:col.
    #[command(
        after_help = "Examples:\n  medea validate examples/\n  medea validate --git . --ref main\n\nExit status: 0 valid, 1 invalid (diagnostics on stderr)."
    )]
    Validate(desired::ValidateArgs),
    /// Print (or write with --out) the JSON Schemas of the desired-state kinds.
    #[command(after_help = "Examples:\n  medea schema --out schemas/")]
    Schema(desired::SchemaArgs),
    /// (testing) Write store batches until killed.
    #[command(name = "__store-torture", hide = true)]
    StoreTorture(debug::TortureArgs),
    /// (testing) Run every running rollout job of a store against a persistent fake cluster.
    #[command(name = "__rollout-run", hide = true)]
    RolloutRun(rollout_debug::RolloutRunArgs),
    /// Print shell completions.
    #[command(
        after_help = "Examples:\n  medea completions bash > /etc/bash_completion.d/medea\n  medea completions zsh > \"${fpath[1]}/_medea\""
    )]
    Completions {
        /// The shell to generate completions for.
        shell: clap_complete::Shell,
    },
}

/// Diagnostics wrap to the terminal on a TTY and never when piped (logs, CI, tests); colours
/// follow the terminal and `NO_COLOR`.
fn install_report_hook() {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    let color = tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = miette::set_hook(Box::new(move |_| {
        Box::new(
            miette::MietteHandlerOpts::new()
                .wrap_lines(tty)
                .color(color)
                .build(),
        )
    }));
}

pub fn main() -> ExitCode {
    install_report_hook();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(report) => {
            eprintln!("{report:?}");
            ExitCode::from(exit::ERROR)
        }
    }
}

pub fn run(cli: Cli) -> miette::Result<u8> {
    match cli.command {
        Command::Validate(args) => desired::validate(args),
        Command::Schema(args) => desired::schema(args),
        Command::StoreTorture(args) => debug::store_torture(args),
        Command::RolloutRun(args) => rollout_debug::rollout_run(args),
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "medea", &mut std::io::stdout());
            Ok(exit::OK)
        }
    }
}
