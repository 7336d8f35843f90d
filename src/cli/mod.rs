//! The `medea` command line: clap commands and output formatting only.
//!
//! **Owns:** argument parsing, exit codes, rendering of diagnostics (miette) and tables.
//! **May depend on:** the `cli` row of design/architecture.md's code map (the outermost edge);
//! nothing depends on it.
//! Architecture Invariant: no domain decision is made here; commands call into the modules.

use miette::{IntoDiagnostic as _, WrapErr as _};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// `print!` for the CLI: a reader that went away (`medea schema | head -1`) ends the process
/// quietly, as SIGPIPE ends a C tool, instead of std's panic with a backtrace. See
/// [`stdout::write`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::stdout::write(format_args!($($arg)*)) };
}

/// `println!` for the CLI (see [`out!`]).
macro_rules! outln {
    () => { $crate::cli::stdout::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::cli::stdout::write(format_args!("{}\n", format_args!($($arg)*))) };
}

pub mod stdout;

pub mod approvals;
pub mod approve;
pub mod backup;
pub mod backup_restore;
pub mod bench;
pub mod client;
pub mod complete;
pub mod context;
pub mod debug;
pub mod demo;
pub mod desired;
pub mod doctor;
pub mod ha;
pub mod ha_debug;
pub mod hook_policy;
pub mod output;
pub mod plan;
pub mod report;
pub mod rollout;
pub mod rollout_debug;
pub mod seed;
pub mod server;
pub mod sim;
pub mod store;
pub mod talos;
pub mod upgrade;

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
#[command(name = "medea", version = crate::build_info::VERSION, long_version = crate::build_info::LONG_VERSION, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the simulator and the server in-process, show the plan; with --approve, run it.
    Demo(demo::DemoArgs),
    /// Check desired-state files: every error at once, with file:line:col.
    #[command(
        after_help = "Examples:\n  medea validate examples/\n  medea validate --git . --ref main\n\nExit status: 0 valid, 1 invalid (diagnostics on stderr)."
    )]
    Validate(desired::ValidateArgs),
    /// Compute, store and print the plan: what would change, with an id to approve.
    #[command(
        after_help = "Examples:\n  medea plan --desired examples/ --store /var/lib/medea\n  medea plan --desired . --git-ref main --store /var/lib/medea -o json\n  medea plan --desired examples/ --observed inventory.yaml\n\nExit status (like terraform plan -detailed-exitcode): 0 no changes, 1 error, 2 changes."
    )]
    Plan(plan::PlanArgs),
    /// Print (or write with --out) the JSON Schemas of the desired-state kinds.
    #[command(after_help = "Examples:\n  medea schema --out schemas/")]
    Schema(desired::SchemaArgs),
    /// Run the daemon: watch the desired state, serve the API, run approved rollouts.
    Serve(server::ServeArgs),
    /// Client contexts (like kubeconfig's): which server the client commands talk to.
    Config(context::ConfigArgs),
    /// Show clusters, node pools or machines from a running server.
    #[command(
        after_help = "Examples:\n  medea get clusters\n  medea get machines --cluster prod -o json"
    )]
    Get(server::GetArgs),
    /// Follow, list and halt rollout jobs.
    #[command(
        after_help = "Examples:\n  medea rollout status --cluster home -w\n  medea rollout list\n  medea rollout halt <job>"
    )]
    Rollout(rollout::RolloutArgs),
    /// Scheduled etcd backups: list, show, take one now, verify a copy.
    #[command(
        after_help = "Examples:\n  medea backup list --cluster prod\n  medea backup now --cluster prod\n  medea backup verify ./prod-20261205T030000Z.db.age -i key.txt"
    )]
    Backup(backup::BackupArgs),
    /// Per-cluster rollout gate.
    #[command(
        after_help = "Examples:\n  medea cluster enable-rollouts prod\n  medea cluster disable-rollouts prod"
    )]
    Cluster(server::ClusterArgs),
    /// (testing) Write store batches until killed.
    #[command(name = "__store-torture", hide = true)]
    StoreTorture(debug::TortureArgs),
    /// (testing) Run every running rollout job of a store against a persistent fake cluster.
    #[command(name = "__rollout-run", hide = true)]
    RolloutRun(rollout_debug::RolloutRunArgs),
    /// Write man pages (medea.1 and one per subcommand) generated from this CLI.
    #[command(after_help = "Examples:\n  medea man --out /usr/local/share/man/man1")]
    Man {
        /// Directory to write the pages into.
        #[arg(long, default_value = ".")]
        out: std::path::PathBuf,
    },
    /// (testing) Campaign on an etcd store and run fenced intent/act steps, printing each.
    #[command(name = "__ha-probe", hide = true)]
    HaProbe(ha_debug::ProbeArgs),
    /// Print shell completions.
    #[command(
        after_help = "Examples:\n  medea completions bash > /etc/bash_completion.d/medea\n  medea completions zsh > \"${fpath[1]}/_medea\"\n\nThese complete commands and flags. For the server's cluster, machine and job\nnames too, source the dynamic ones at shell start instead:\n  source <(COMPLETE=bash medea)"
    )]
    Completions {
        /// The shell to generate completions for.
        shell: clap_complete::Shell,
    },
    /// Set a Talos or Kubernetes version in the desired-state YAML (in place), then plan.
    Upgrade(upgrade::UpgradeArgs),
    /// Talos diagnostics over the machine API (talosctl-like): version, services, etcd, health.
    Talos(talos::TalosArgs),
    /// Run the simulator (Talos machine API + kube-apiserver) standalone until Ctrl-C.
    Sim(sim::SimArgs),
    /// List every approval marker's outcome against the current plan (offline).
    Approvals(approvals::ApprovalsArgs),
    /// Sign an approval of a plan (SSHSIG, namespace `medea-approve`).
    Approve(approve::ApproveArgs),
    /// Discover a running cluster, record it in the store and print matching desired-state YAML.
    Seed(seed::SeedArgs),
    /// Offline preflight: credentials, certificates, Talos API, kube-apiserver, RBAC, etcd, clock.
    Doctor(doctor::DoctorArgs),
    /// Fleet-scale benchmarks (build with --release; see design/performance.md).
    #[command(
        after_help = "Examples:\n  medea bench plan --clusters 100 --machines 100\n  medea bench server --clusters 1000 --machines 10\n  medea bench fleet --out /tmp/fleet"
    )]
    Bench(bench::BenchArgs),
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
    // Every TLS user in medea is on ring; make it the process default explicitly.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // `COMPLETE=bash medea …`: answer the shell's completion request (names from the server)
    // and exit; otherwise nothing happens here.
    clap_complete::CompleteEnv::with_factory(<Cli as clap::CommandFactory>::command).complete();
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
        Command::Demo(args) => demo::run(args),
        Command::Schema(args) => desired::schema(args),
        Command::Plan(args) => plan::plan(args),
        Command::StoreTorture(args) => debug::store_torture(args),
        Command::HaProbe(args) => ha_debug::probe(args),
        Command::RolloutRun(args) => rollout_debug::rollout_run(args),
        Command::Serve(args) => server::serve(args),
        Command::Config(args) => context::run(args),
        Command::Upgrade(args) => upgrade::upgrade(args),
        Command::Get(args) => server::get(args),
        Command::Cluster(args) => server::cluster(args),
        Command::Rollout(args) => rollout::run(args),
        Command::Backup(args) => backup::run(args),
        Command::Man { out } => {
            std::fs::create_dir_all(&out)
                .into_diagnostic()
                .wrap_err_with(|| format!("cannot create {}", out.display()))?;
            clap_mangen::generate_to(Cli::command(), &out)
                .into_diagnostic()
                .wrap_err_with(|| format!("cannot write man pages to {}", out.display()))?;
            outln!("wrote man pages to {}", out.display());
            Ok(exit::OK)
        }
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            let mut text = Vec::new();
            clap_complete::generate(shell, &mut cmd, "medea", &mut text);
            stdout::write_bytes(&text);
            Ok(exit::OK)
        }
        Command::Approve(args) => approve::run(args),
        Command::Approvals(args) => approvals::run(args),
        Command::Talos(args) => talos::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Seed(args) => seed::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Bench(args) => bench::run(args),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Dependencies' own log lines that repeat a failure medea already logs with context: the kube
/// client's HTTP trace layer logs every failed request at ERROR (`failed with error …`) beside
/// medea's WARN "Kubernetes API call failed; retrying" and its final ERROR, so one failure
/// read as several. Added unless `RUST_LOG` names the crate itself.
pub const QUIET_DEPENDENCIES: &[&str] = &["kube_client::client::builder=off"];

/// The log filter: `RUST_LOG` (default `info`) plus [`QUIET_DEPENDENCIES`].
#[allow(
    clippy::expect_used,
    reason = "the added directives are constant valid filter strings (log_filter is unit-tested)"
)]
pub fn log_filter(rust_log: Option<&str>) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    let given = rust_log.map(str::trim).filter(|s| !s.is_empty());
    let mut filter = given
        .and_then(|s| EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    if !given.is_some_and(|s| s.contains("kube_client")) {
        for d in QUIET_DEPENDENCIES {
            filter = filter.add_directive(d.parse().expect("a valid static directive"));
        }
    }
    filter
}

/// Logs go to stderr: human-readable (colours on a TTY) or one JSON object per line; the
/// level comes from `RUST_LOG` (default `info`).
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    let json = format == LogFormat::Json;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Log lines through `filter`, as `init_logging` would write them.
    fn logged(filter: tracing_subscriber::EnvFilter, emit: impl FnOnce()) -> String {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    fn a_failed_kube_call() {
        // What kube-client's trace layer logs for a refused connection, then medea's own lines.
        tracing::error!(target: "kube_client::client::builder", "failed with error client error (Connect)");
        tracing::warn!(target: "medea::k8s::client", "Kubernetes API call failed; retrying");
        tracing::error!(target: "medea::ops::refresh", "inventory refresh failed");
    }

    /// Every visible command, with its path (`medea get machines`).
    fn commands() -> Vec<(String, clap::Command)> {
        fn walk(path: String, cmd: &clap::Command, out: &mut Vec<(String, clap::Command)>) {
            out.push((path.clone(), cmd.clone()));
            for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
                walk(format!("{path} {}", sub.get_name()), sub, out);
            }
        }
        let mut out = Vec::new();
        let mut cli = Cli::command();
        cli.build();
        walk("medea".into(), &cli, &mut out);
        out
    }

    #[test]
    fn every_option_and_argument_has_help() {
        let mut missing = Vec::new();
        for (path, cmd) in commands() {
            for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
                let generated = matches!(arg.get_id().as_str(), "help" | "version");
                if !generated && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
        }
        assert!(missing.is_empty(), "options without help: {missing:#?}");
    }

    /// Examples in `--help` are commands to copy: none is longer than an 80-column terminal,
    /// where clap would wrap it mid-command (long ones continue with ` \`).
    #[test]
    fn help_examples_fit_an_80_column_terminal() {
        let mut long = Vec::new();
        for (path, cmd) in commands() {
            for text in [cmd.get_after_help(), cmd.get_after_long_help()]
                .into_iter()
                .flatten()
            {
                for line in text.to_string().lines() {
                    // Prose wraps at words; an indented line is a command to copy.
                    if line.starts_with(' ') && line.chars().count() > 78 {
                        long.push(format!("{path}: {line}"));
                    }
                }
            }
        }
        assert!(
            long.is_empty(),
            "help lines that wrap at 80 columns: {long:#?}"
        );
    }

    #[test]
    fn one_failure_is_one_warn_per_retry_and_one_error() {
        for rust_log in [None, Some("info"), Some("debug"), Some("medea=debug,info")] {
            let out = logged(log_filter(rust_log), a_failed_kube_call);
            assert!(!out.contains("failed with error"), "{rust_log:?}: {out}");
            assert_eq!(out.matches("ERROR").count(), 1, "{rust_log:?}: {out}");
            assert_eq!(out.matches("WARN").count(), 1, "{rust_log:?}: {out}");
        }
        // Asked for by name, the kube client's own lines are shown.
        let out = logged(
            log_filter(Some("info,kube_client=debug")),
            a_failed_kube_call,
        );
        assert!(out.contains("failed with error"), "{out}");
    }
}
