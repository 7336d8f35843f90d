//! `medea bench`: fleet-scale benchmarks (design/performance.md). Build with `--release`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::exit;
use crate::bench::fleet::{self, FleetSpec};
use crate::bench::host::Host;
use crate::bench::{pipeline, server};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub scenario: Scenario,
}

#[derive(Debug, Clone, Args)]
pub struct FleetArgs {
    /// Clusters in the generated fleet.
    #[arg(long, default_value_t = 100)]
    pub clusters: usize,
    /// Machines per cluster (at least 4: three control planes and a canary).
    #[arg(long, default_value_t = 100)]
    pub machines: usize,
    /// Seed of the generator: the same seed gives the same fleet.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl FleetArgs {
    fn spec(&self) -> FleetSpec {
        FleetSpec {
            clusters: self.clusters,
            machines_per_cluster: self.machines,
            seed: self.seed,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// Write a generated desired-state repo (DIR/desired) and its inventory (DIR/inventory.json).
    Fleet {
        #[command(flatten)]
        fleet: FleetArgs,
        #[arg(long)]
        out: PathBuf,
    },
    /// load + validate + plan + render, against the parse floor measured in the same run.
    Plan {
        #[command(flatten)]
        fleet: FleetArgs,
        /// Rounds (each: floor and pipeline side by side).
        #[arg(long, default_value_t = 15)]
        rounds: usize,
    },
    /// A `medea serve` child holding the fleet: idle RSS/CPU, get machines, change → plan.
    Server {
        #[command(flatten)]
        fleet: FleetArgs,
        #[arg(long, default_value = "500ms", value_parser = parse_duration)]
        debounce: Duration,
        #[arg(long, default_value_t = 15)]
        changes: usize,
        #[arg(long, default_value_t = 30)]
        gets: usize,
        /// How long to watch the idle server.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        idle: Duration,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Some(ms) = s.strip_suffix("ms") {
        return ms
            .parse()
            .map(Duration::from_millis)
            .map_err(|_| format!("invalid duration `{s}`"));
    }
    crate::desired::validate::parse_duration(s)
}

fn tempdir() -> miette::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("medea-bench-")
        .tempdir()
        .map_err(|e| miette::miette!("cannot create a temporary directory: {e}"))
}

fn err(e: crate::bench::BenchError) -> miette::Report {
    miette::miette!("{}", crate::error_chain(&e))
}

pub fn run(args: BenchArgs) -> miette::Result<u8> {
    match args.scenario {
        Scenario::Fleet { fleet: f, out } => {
            let fleet = fleet::generate(f.spec());
            let w = fleet::write_repo(&fleet, &out)
                .map_err(|e| miette::miette!("cannot write the fleet to {}: {e}", out.display()))?;
            println!(
                "wrote {} clusters, {} machines: {} and {}",
                fleet.inventory.clusters.len(),
                fleet.machines(),
                w.desired.display(),
                w.inventory.display()
            );
            Ok(exit::OK)
        }
        Scenario::Plan { fleet: f, rounds } => {
            let host = Host::detect();
            let fleet = fleet::generate(f.spec());
            let dir = tempdir()?;
            let w = fleet::write_repo(&fleet, dir.path())
                .map_err(|e| miette::miette!("cannot write the fleet: {e}"))?;
            let r = pipeline::run(&w.desired, &fleet.inventory, rounds).map_err(err)?;
            println!("{host}");
            println!(
                "fleet: {} clusters x {} machines = {} machines, seed {}; {} files, {} KiB; plan: {} waves, {} KiB rendered",
                r.clusters,
                f.machines,
                r.machines,
                f.seed,
                r.files,
                r.bytes / 1024,
                r.waves,
                r.rendered_bytes / 1024
            );
            println!("parse floor (tree):   {}", r.floor.summary_ms());
            println!("parse floor (syntax): {}", r.syntax.summary_ms());
            println!("load + validate:      {}", r.load.summary_ms());
            println!("plan::compute:        {}", r.plan.summary_ms());
            println!("render::text:         {}", r.render.summary_ms());
            println!("total:                {}", r.total.summary_ms());
            println!("(render::json:        {})", r.json.summary_ms());
            println!(
                "ratio total / floor (median of per-round ratios): {:.3} (target <= 1.25); against the syntax-only floor: {:.3}",
                r.ratio(),
                r.ratio_syntax()
            );
            Ok(exit::OK)
        }
        Scenario::Server {
            fleet: f,
            debounce,
            changes,
            gets,
            idle,
        } => {
            let host = Host::detect();
            let exe = std::env::current_exe()
                .map_err(|e| miette::miette!("cannot find the medea binary: {e}"))?;
            let fleet = fleet::generate(f.spec());
            let dir = tempdir()?;
            let w = fleet::write_repo(&fleet, dir.path())
                .map_err(|e| miette::miette!("cannot write the fleet: {e}"))?;
            let o = server::ServerOptions {
                debounce,
                changes,
                gets,
                idle,
            };
            let r = server::run(&exe, &w.desired, &fleet.inventory, dir.path(), &o).map_err(err)?;
            println!("{host}");
            println!(
                "fleet: {} clusters x {} machines = {} machines, seed {}; server startup to API ready {:.0} ms",
                f.clusters, f.machines, r.machines, f.seed, r.startup_ms
            );
            let i = &r.idle;
            println!(
                "idle: RSS {:.1} MiB (peak {:.1} MiB), {} threads; over {:.1} s: {} CPU ticks ({} per s), {} wake-ups",
                i.rss_kib as f64 / 1024.0,
                i.hwm_kib as f64 / 1024.0,
                i.threads,
                i.seconds,
                i.cpu_ticks,
                i.clk_tck,
                i.wakeups
            );
            println!(
                "get machines ({} rows, {} KiB JSON):",
                r.get_rows,
                r.get_bytes / 1024
            );
            println!("  medea get machines -o json (process): {}", r.get_cli.summary_ms());
            println!("  RPC, fresh TLS connection:           {}", r.get_fresh.summary_ms());
            println!("  RPC, warm connection:                {}", r.get_warm.summary_ms());
            println!("file change (debounce {:.0} ms):", r.debounce_ms);
            println!("  -> desired state loaded: {}", r.change_to_loaded.summary_ms());
            println!("  -> new plan stored:      {}", r.change_to_plan.summary_ms());
            println!(
                "  overhead over the debounce (median): {:.1} ms (target <= 50 ms)",
                r.change_to_plan.median() - r.debounce_ms
            );
            println!(
                "RSS after the change and get rounds: {:.1} MiB",
                r.rss_after_kib as f64 / 1024.0
            );
            Ok(exit::OK)
        }
    }
}
