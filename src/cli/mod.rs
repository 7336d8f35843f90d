//! The `medea` command line: clap commands and output formatting only.
//!
//! **Owns:** argument parsing, exit codes, rendering of diagnostics (miette) and tables.
//! **May depend on:** every other module; nothing depends on it.
//! Architecture Invariant: no domain decision is made here; commands call into the modules.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

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
    /// Print shell completions.
    #[command(
        after_help = "Examples:\n  medea completions bash > /etc/bash_completion.d/medea\n  medea completions zsh > \"${fpath[1]}/_medea\""
    )]
    Completions {
        /// The shell to generate completions for.
        shell: clap_complete::Shell,
    },
}

pub fn main() -> ExitCode {
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
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "medea", &mut std::io::stdout());
            Ok(exit::OK)
        }
    }
}
