//! `medea bench`: fleet-scale benchmarks (design/performance.md). Build with `--release`.

use miette::{IntoDiagnostic as _, WrapErr as _};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::exit;
use crate::bench::fleet::{self, FleetSpec};
use crate::bench::host::Host;
use crate::bench::{pipeline, process, rollout, server};

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
        /// Directory to write the repo and the inventory into.
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
    /// `medea plan` as a whole process against libyaml (PyYAML's CSafeLoader) parsing the same
    /// files and the inventory, alternated round by round; and `medea plan`'s peak RSS.
    PlanProcess {
        #[command(flatten)]
        fleet: FleetArgs,
        /// Rounds (each: medea and libyaml side by side).
        #[arg(long, default_value_t = 10)]
        rounds: usize,
        /// Python 3 with PyYAML built against libyaml (Debian: python3-yaml).
        #[arg(long, default_value = "python3")]
        python: PathBuf,
    },
    /// A `medea serve` child holding the fleet: idle RSS/CPU, get machines, change → plan.
    Server {
        #[command(flatten)]
        fleet: FleetArgs,
        /// The server's --debounce (subtracted from change → plan).
        #[arg(long, default_value = "500ms", value_parser = crate::duration::parse_std)]
        debounce: Duration,
        /// Desired-state changes to time (change → plan).
        #[arg(long, default_value_t = 15)]
        changes: usize,
        /// `get machines` calls to time.
        #[arg(long, default_value_t = 30)]
        gets: usize,
        /// How long to watch the idle server.
        #[arg(long, default_value = "10s", value_parser = crate::duration::parse_std)]
        idle: Duration,
        /// Run `medea serve` under this command (split on whitespace), e.g. a profiler:
        /// `--wrap "heaptrack -o /tmp/serve"`. RSS and CPU are then the wrapper's.
        #[arg(long)]
        wrap: Option<String>,
    },
    /// Planning clusters with many node pools (issue #49): 500 pools in one cluster, the most
    /// pools a cluster may have, and the most documents a revision may have.
    Pools {
        /// Rounds of each case.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Run only the first N cases (500 pools; then 1,000; then 20,000 documents).
        #[arg(long, default_value_t = 3)]
        cases: usize,
    },
    /// One reconcile pass with many approval markers and many stored plans (issue #32): a
    /// pass with an empty approval cache and one after a pass with the same markers.
    Approvals {
        /// Marker files in the desired state's approvals/ (none signs the current plan). The
        /// default is the most a revision can hold beside the fleet's 2 resource files (a
        /// revision holds at most 2,000 files).
        #[arg(long, default_value_t = 1998)]
        markers: usize,
        /// Plan records in the store besides the current one.
        #[arg(long, default_value_t = 5000)]
        plans: usize,
        /// Rounds (each: a cold and a warm pass).
        #[arg(long, default_value_t = 9)]
        rounds: usize,
    },
    /// The rollout engine with a durable fjall journal, on the in-memory fakes (the engine
    /// alone) or on the simulator through the real adapters: overhead per node with zero
    /// delays, and wall time against the ideal with fixed per-node delays.
    Rollout {
        /// What the engine drives: `fakes` (the engine alone) or `sim` (the simulator over
        /// gRPC/mTLS and HTTPS through the real adapters; its kube side reconciles only what
        /// each change touched).
        #[arg(long, value_enum, default_value_t = rollout::Backend::Fakes)]
        on: rollout::Backend,
        /// Nodes of the zero-delay run (3 control planes, the rest workers).
        #[arg(long, default_value_t = 1000)]
        nodes: usize,
        /// Nodes of the fixed-delay run (all workers).
        #[arg(long, default_value_t = 200)]
        delay_nodes: usize,
        /// How long each node is away after its reboot in the fixed-delay run.
        #[arg(long, default_value = "1s", value_parser = crate::duration::parse_std)]
        delay: Duration,
        /// maxUnavailable of the worker pools.
        #[arg(long, default_value_t = 10)]
        max_unavailable: u32,
        /// Executor poll interval of the fixed-delay run.
        #[arg(long, default_value = "5ms", value_parser = crate::duration::parse_std)]
        poll: Duration,
        /// Repetitions of each run.
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// The regression check `tests/run` runs (issue #54): ratios measured side by side on a
    /// small fleet, each against `baseline × factor` recorded in design/bench-ci-baseline.json for
    /// this machine class. Exit 1 when a row regressed. Needs the `fakes` feature.
    Ci {
        /// Rounds (each: every row side by side).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Nodes of the zero-delay rollouts (3 control planes, the rest workers).
        #[arg(long, default_value_t = 40)]
        nodes: usize,
        /// Check against this baseline file instead of the one built in.
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// Print this machine's medians as a baseline class entry (JSON) instead of failing.
        #[arg(long)]
        record: bool,
    },
    /// Issue #36: a plan's predicted duration against the rollout it predicts, on the
    /// simulator with fixed per-node delays; each run is predicted from the journals of the
    /// runs before it, as the daemon predicts a plan.
    Predict {
        /// Workers rolled (one worker pool).
        #[arg(long, default_value_t = 100)]
        workers: usize,
        /// How long each node is away after its reboot.
        #[arg(long, default_value = "5s", value_parser = crate::duration::parse_std)]
        delay: Duration,
        /// maxUnavailable of the pool.
        #[arg(long, default_value_t = 10)]
        max_unavailable: u32,
        /// Executor poll interval.
        #[arg(long, default_value = "5ms", value_parser = crate::duration::parse_std)]
        poll: Duration,
        /// Predicted runs (after one run that only seeds the history).
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Issue #36: a pool's window time (first cordon to last uncordon, from the job's journal)
    /// staged (`rollout.stage: ahead`: pull + install before the first cordon) against
    /// unstaged (pull, install and reboot inside the window), side by side on the simulator
    /// with fixed pull, install and reboot delays.
    Window {
        /// Workers rolled (one worker pool).
        #[arg(long, default_value_t = 20)]
        workers: usize,
        /// maxUnavailable of the pool.
        #[arg(long, default_value_t = 5)]
        max_unavailable: u32,
        /// How long each image pull takes (the simulator's `timing.imagePull`).
        #[arg(long, default_value = "2s", value_parser = crate::duration::parse_std)]
        pull: Duration,
        /// How long each install takes (the simulator's `timing.install`).
        #[arg(long, default_value = "3s", value_parser = crate::duration::parse_std)]
        install: Duration,
        /// How long each node is away after its reboot (the simulator's `timing.reboot`).
        #[arg(long, default_value = "5s", value_parser = crate::duration::parse_std)]
        reboot: Duration,
        /// `rollout.stageParallelism` of the staged pool (nodes installing at once).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=10))]
        stage_parallelism: u32,
        /// Executor poll interval.
        #[arg(long, default_value = "5ms", value_parser = crate::duration::parse_std)]
        poll: Duration,
        /// Rounds (each: an unstaged and a staged job, side by side).
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
}

fn tempdir() -> miette::Result<tempfile::TempDir> {
    crate::private_file::private_tempdir("medea-bench-")
        .into_diagnostic()
        .wrap_err("cannot create a temporary directory")
}

/// A generated fleet written to a fresh temporary directory (kept alive by the returned guard).
fn fleet_on_disk(
    f: &FleetArgs,
) -> miette::Result<(fleet::Fleet, tempfile::TempDir, fleet::Written)> {
    let fleet = fleet::generate(f.spec());
    let dir = tempdir()?;
    let w = fleet::write_repo(&fleet, dir.path())
        .into_diagnostic()
        .wrap_err("cannot write the fleet")?;
    Ok((fleet, dir, w))
}

/// This very binary: the scenarios that measure a `medea` process run it.
fn this_binary() -> miette::Result<PathBuf> {
    std::env::current_exe()
        .into_diagnostic()
        .wrap_err("cannot find the medea binary")
}

/// Millisecond samples of long runs, in seconds.
fn seconds(s: &crate::bench::stats::Samples) -> String {
    format!(
        "median {:.2} s, min {:.2} s, max {:.2} s (n={})",
        s.median() / 1e3,
        s.min() / 1e3,
        s.max() / 1e3,
        s.len()
    )
}

fn err(e: crate::bench::BenchError) -> miette::Report {
    miette::Report::from_err(e)
}

pub fn run(args: BenchArgs) -> miette::Result<u8> {
    match args.scenario {
        Scenario::Fleet { fleet: f, out } => {
            let fleet = fleet::generate(f.spec());
            let w = fleet::write_repo(&fleet, &out)
                .into_diagnostic()
                .wrap_err_with(|| format!("cannot write the fleet to {}", out.display()))?;
            outln!(
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
            let (fleet, _dir, w) = fleet_on_disk(&f)?;
            let r = pipeline::run(&w.desired, &fleet.inventory, rounds).map_err(err)?;
            outln!("{host}");
            outln!(
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
            outln!("parse floor (tree):   {}", r.floor.summary_ms());
            outln!("parse floor (syntax): {}", r.syntax.summary_ms());
            outln!("load + validate:      {}", r.load.summary_ms());
            outln!("  (parse on 1 thread: {})", r.load_single.summary_ms());
            outln!("plan::compute:        {}", r.plan.summary_ms());
            outln!("  (plan on 1 thread:  {})", r.plan_single.summary_ms());
            outln!("render::text:         {}", r.render.summary_ms());
            outln!("total:                {}", r.total.summary_ms());
            outln!("(render::json:        {})", r.json.summary_ms());
            outln!(
                "ratio total / floor (median of per-round ratios): {:.3} (target <= 1.5); against the syntax-only floor: {:.3}",
                r.ratio(),
                r.ratio_syntax()
            );
            outln!(
                "  with the load and the plan on 1 thread (total {}): {:.3}",
                r.total_single.summary_ms(),
                r.ratio_single()
            );
            // One file changed, with the daemon's caches (a separate run over the same repo).
            let i = crate::bench::incremental::run(&w.desired, &fleet.inventory, rounds)
                .map_err(err)?;
            outln!(
                "one file changed, incremental ({} file parsed, {} cluster validated again, {} cluster planned):",
                i.parsed,
                i.revalidated,
                i.planned
            );
            outln!("  load + validate:    {}", i.load.summary_ms());
            outln!("  plan (memo):        {}", i.plan.summary_ms());
            outln!("  render::text:       {}", i.render.summary_ms());
            outln!("  total:              {}", i.total.summary_ms());
            outln!("  same work cold:     {}", i.cold.summary_ms());
            outln!(
                "  ratio incremental / cold (median of per-round ratios): {:.3}",
                i.ratio()
            );
            Ok(exit::OK)
        }
        Scenario::Pools { rounds, cases } => {
            outln!("{}", Host::detect());
            for (clusters, pools) in crate::bench::pools::cases().into_iter().take(cases) {
                let c = crate::bench::pools::run(clusters, pools, rounds).map_err(err)?;
                outln!(
                    "{} cluster(s) x {} pools ({} documents): load + validate {}; plan {}; total {}",
                    c.clusters,
                    c.pools_per_cluster,
                    c.documents,
                    c.report.load.summary_ms(),
                    c.report.plan.summary_ms(),
                    c.report.total.summary_ms()
                );
            }
            Ok(exit::OK)
        }
        Scenario::Approvals {
            markers,
            plans,
            rounds,
        } => {
            let host = Host::detect();
            let dir = tempdir()?;
            let r =
                crate::bench::approvals::run(dir.path(), markers, plans, rounds).map_err(err)?;
            outln!("{host}");
            outln!(
                "store: {} plan records ({} executed ids), {} markers none of which signs the current plan; outcomes: {}",
                r.plans,
                r.consumed,
                r.markers,
                r.outcomes
                    .iter()
                    .map(|(k, v)| format!("{v} {k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            outln!(
                "reconcile pass, empty approval cache: {} ({} signature checks; target <= 1000 ms)",
                r.cold.summary_ms(),
                r.cold_checks
            );
            outln!(
                "reconcile pass, markers unchanged:    {} ({} signature checks; target <= 100 ms)",
                r.warm.summary_ms(),
                r.warm_checks
            );
            Ok(exit::OK)
        }
        Scenario::PlanProcess {
            fleet: f,
            rounds,
            python,
        } => {
            let host = Host::detect();
            let medea = this_binary()?;
            let (fleet, _dir, w) = fleet_on_disk(&f)?;
            let o = process::ProcessOptions {
                medea,
                python,
                rounds,
            };
            let r = process::run(&o, &w.desired, &w.inventory).map_err(err)?;
            outln!("{host}");
            outln!(
                "fleet: {} clusters x {} machines = {} machines, seed {}; libyaml parsed {} documents",
                fleet.inventory.clusters.len(),
                f.machines,
                fleet.machines(),
                f.seed,
                r.documents
            );
            outln!("medea plan (process):   {}", r.plan.summary_ms());
            outln!("libyaml (process):      {}", r.python.summary_ms());
            outln!("libyaml (parse only):   {}", r.parse.summary_ms());
            outln!(
                "ratio medea plan / libyaml process (median of per-round ratios): {:.3} (target <= 0.5); against the parse alone: {:.3}",
                r.ratio_process.median(),
                r.ratio_parse.median()
            );
            match r.plan_peak_rss_kib {
                Some(kib) => outln!(
                    "medea plan peak RSS: {:.1} MiB ({kib} KiB, GNU time)",
                    kib as f64 / 1024.0
                ),
                None => {
                    outln!("medea plan peak RSS: not measured (/usr/bin/time is not GNU time)")
                }
            }
            Ok(exit::OK)
        }
        Scenario::Server {
            fleet: f,
            debounce,
            changes,
            gets,
            idle,
            wrap,
        } => {
            let host = Host::detect();
            let exe = this_binary()?;
            let (fleet, dir, w) = fleet_on_disk(&f)?;
            let o = server::ServerOptions {
                debounce,
                changes,
                gets,
                idle,
                wrap: wrap
                    .as_deref()
                    .map(|w| w.split_whitespace().map(str::to_string).collect())
                    .unwrap_or_default(),
            };
            let r = server::run(&exe, &w.desired, &fleet.inventory, dir.path(), &o).map_err(err)?;
            outln!("{host}");
            outln!(
                "fleet: {} clusters x {} machines = {} machines, seed {}; server startup to API ready {:.0} ms",
                f.clusters,
                f.machines,
                r.machines,
                f.seed,
                r.startup_ms
            );
            let i = &r.idle;
            outln!(
                "idle: RSS {:.1} MiB (peak {:.1} MiB), {} threads; over {:.1} s: {} CPU ticks ({} per s), {} wake-ups",
                i.rss_kib as f64 / 1024.0,
                i.hwm_kib as f64 / 1024.0,
                i.threads,
                i.seconds,
                i.cpu_ticks,
                i.clk_tck,
                i.wakeups
            );
            outln!(
                "get machines ({} rows, {} KiB JSON):",
                r.get_rows,
                r.get_bytes / 1024
            );
            outln!(
                "  medea get machines -o json (process): {}",
                r.get_cli.summary_ms()
            );
            outln!(
                "  RPC, fresh TLS connection:           {}",
                r.get_fresh.summary_ms()
            );
            outln!(
                "  RPC, warm connection:                {}",
                r.get_warm.summary_ms()
            );
            outln!("file change (debounce {:.0} ms):", r.debounce_ms);
            outln!(
                "  -> desired state loaded: {}",
                r.change_to_loaded.summary_ms()
            );
            outln!(
                "  -> new plan stored:      {}",
                r.change_to_plan.summary_ms()
            );
            outln!(
                "  overhead over the debounce (median): {:.1} ms (target <= 20 ms)",
                r.change_to_plan.median() - r.debounce_ms
            );
            outln!(
                "RSS after the change and get rounds: {:.1} MiB",
                r.rss_after_kib as f64 / 1024.0
            );
            Ok(exit::OK)
        }
        Scenario::Predict {
            workers,
            delay,
            max_unavailable,
            poll,
            runs,
        } => {
            let host = Host::detect();
            outln!("{host}");
            let dir = tempdir()?;
            let rows = rollout::prediction(dir.path(), workers, max_unavailable, delay, poll, runs)
                .map_err(err)?;
            outln!(
                "predicted against actual on the simulator: {workers} workers, maxUnavailable {max_unavailable}, {} ms away per node after reboot, poll {} ms; each run predicted from the journals of the runs before it (one seeding run first)",
                delay.as_millis(),
                poll.as_millis()
            );
            let mut errors = crate::bench::stats::Samples::new();
            for (i, r) in rows.iter().enumerate() {
                outln!(
                    "  run {}: predicted median {} s, pessimistic {} s (history of {} job(s)); actual {:.1} s; error {:+.1} %{}",
                    i + 1,
                    r.predicted.total.median_secs,
                    r.predicted.total.pessimistic_secs,
                    r.predicted.history_jobs,
                    r.actual_ms / 1e3,
                    r.error() * 100.0,
                    if r.within_pessimistic() {
                        ""
                    } else {
                        "; PAST the pessimistic bound"
                    }
                );
                errors.push_value(r.error().abs() * 100.0);
            }
            outln!(
                "  |error|: median {:.1} %, max {:.1} % (n={}; target <= 15 %)",
                errors.median(),
                errors.max(),
                errors.len()
            );
            Ok(exit::OK)
        }
        Scenario::Window {
            workers,
            max_unavailable,
            pull,
            install,
            reboot,
            stage_parallelism,
            poll,
            runs,
        } => {
            let host = Host::detect();
            outln!("{host}");
            let dir = tempdir()?;
            let delays = rollout::SimDelays {
                pull,
                install,
                reboot,
            };
            let r = rollout::window(
                dir.path(),
                workers,
                max_unavailable,
                delays,
                stage_parallelism,
                poll,
                runs,
            )
            .map_err(err)?;
            outln!(
                "window time (first cordon -> last uncordon, from the job's journal) on the simulator via the real adapters: {workers} workers, maxUnavailable {max_unavailable}, {} waves; pull {} ms, install {} ms, reboot {} ms per node; poll {} ms; every job succeeded with every node on the target, installed once and booted once",
                r.waves,
                pull.as_millis(),
                install.as_millis(),
                reboot.as_millis(),
                poll.as_millis()
            );
            outln!(
                "  unstaged (pull, install, reboot in the window): {}",
                seconds(&r.unstaged_ms())
            );
            outln!(
                "  staged (stageParallelism {stage_parallelism}, reboot only in the window): {}",
                seconds(&r.staged_ms())
            );
            outln!(
                "  staging ahead, outside the window: {}",
                seconds(&r.staging_ms())
            );
            outln!(
                "  staged / unstaged: {:.3} (medians; per round: median {:.3}, n={}); window time saved: {:.1} %",
                r.ratio(),
                r.ratio_per_round().median(),
                r.ratio_per_round().len(),
                (1.0 - r.ratio()) * 100.0
            );
            Ok(exit::OK)
        }
        Scenario::Ci {
            rounds,
            nodes,
            baseline,
            record,
        } => ci(rounds, nodes, baseline, record),
        Scenario::Rollout {
            on,
            nodes,
            delay_nodes,
            delay,
            max_unavailable,
            poll,
            runs,
        } => {
            let host = Host::detect();
            outln!("{host}");
            let mut per_node = crate::bench::stats::Samples::new();
            let mut last = None;
            for _ in 0..runs {
                let dir = tempdir()?;
                let r = rollout::run(
                    dir.path(),
                    on,
                    3.min(nodes),
                    nodes.saturating_sub(3),
                    max_unavailable,
                    Duration::ZERO,
                    Duration::ZERO,
                )
                .map_err(err)?;
                per_node.push_value(r.per_node_ms);
                last = Some(r);
            }
            if let Some(r) = &last {
                outln!(
                    "engine overhead on the {on}: {} nodes (3 control planes + {} workers, maxUnavailable {}), {} waves, zero delays, durable fjall journal ({} commits per run), every node upgraded exactly once: {}",
                    r.nodes,
                    r.nodes.saturating_sub(3),
                    max_unavailable,
                    r.waves,
                    r.commits,
                    r.max_upgrades_per_node == 1 && r.upgrades as usize == r.nodes
                );
                outln!(
                    "  per node: median {:.2} ms, min {:.2}, max {:.2} (n={}); whole rollout median {:.0} ms (target <= {} ms per node)",
                    per_node.median(),
                    per_node.min(),
                    per_node.max(),
                    per_node.len(),
                    per_node.median() * r.nodes as f64,
                    on.per_node_target_ms()
                );
            }
            let mut ratio = crate::bench::stats::Samples::new();
            let mut last = None;
            for _ in 0..runs {
                let dir = tempdir()?;
                let r = rollout::run(dir.path(), on, 0, delay_nodes, max_unavailable, delay, poll)
                    .map_err(err)?;
                ratio.push_value(r.ratio_to_ideal());
                last = Some(r);
            }
            if let Some(r) = &last {
                outln!(
                    "fixed delays on the {on}: {} workers, maxUnavailable {}, {} waves, {} ms away per node after reboot, poll {} ms: ideal {:.0} ms",
                    r.nodes,
                    max_unavailable,
                    r.waves,
                    delay.as_millis(),
                    poll.as_millis(),
                    r.ideal_ms
                );
                outln!(
                    "  wall / ideal: median {:.4}, min {:.4}, max {:.4} (n={}); last wall {:.0} ms (target <= {:.2})",
                    ratio.median(),
                    ratio.min(),
                    ratio.max(),
                    ratio.len(),
                    r.wall_ms,
                    on.ratio_target()
                );
            }
            Ok(exit::OK)
        }
    }
}

fn ci(rounds: usize, nodes: usize, baseline: Option<PathBuf>, record: bool) -> miette::Result<u8> {
    use crate::bench::ci;
    let host = Host::detect();
    outln!("{host}");
    let text = match &baseline {
        Some(p) => std::fs::read_to_string(p)
            .into_diagnostic()
            .wrap_err_with(|| format!("cannot read the baseline {}", p.display()))?,
        None => ci::BASELINE.to_string(),
    };
    let base = ci::Baseline::parse(&text).map_err(err)?;
    let class = ci::machine_class(host.nproc);
    let dir = tempdir()?;
    let size = ci::CiSize {
        nodes: nodes.max(4),
        rounds: rounds.max(1),
        ..ci::CiSize::default()
    };
    let started = std::time::Instant::now();
    let measured = ci::measure(dir.path(), size).map_err(err)?;
    let rows: Vec<(String, f64, usize)> = measured
        .iter()
        .map(|m| (m.row.to_string(), m.samples.median(), m.samples.len()))
        .collect();
    if record {
        let entry: std::collections::BTreeMap<&str, f64> = rows
            .iter()
            .map(|(r, v, _)| (r.as_str(), (v * 1000.0).round() / 1000.0))
            .collect();
        let json = serde_json::to_string_pretty(&serde_json::json!({ class.as_str(): entry }))
            .into_diagnostic()?;
        outln!("{json}");
        return Ok(exit::OK);
    }
    for m in &measured {
        let all: Vec<String> = (0..m.samples.len())
            .map(|i| format!("{:.3}", m.samples.value(i)))
            .collect();
        outln!("  {} per round: {}", m.row, all.join(" "));
    }
    let verdicts = ci::check(&base, &class, &rows);
    let used = base.for_class(&class);
    outln!(
        "machine class {class}; baseline {}; {} rounds, fleet {} x {}, {} nodes; {:.1} s",
        match &used {
            Some((c, _, w)) if *w > 1.0 =>
                format!("of {c} (none recorded for this class: factors x{w})"),
            Some((c, _, _)) => c.clone(),
            None => "none for this build profile (rows reported, not checked)".into(),
        },
        size.rounds,
        size.clusters,
        size.machines,
        size.nodes,
        started.elapsed().as_secs_f64()
    );
    for v in &verdicts {
        outln!(
            "  {:<32} median {:>8.3} (n={})  baseline {}  limit {}  {}",
            v.row,
            v.median,
            v.n,
            v.baseline.map_or("-".into(), |b| format!("{b:.3}")),
            v.limit.map_or("-".into(), |l| format!("{l:.3}")),
            if v.passed { "ok" } else { "REGRESSED" }
        );
    }
    if verdicts.iter().all(|v| v.passed) {
        Ok(exit::OK)
    } else {
        eprintln!(
            "medea bench ci: a row regressed beyond its factor (design/bench-ci-baseline.json; design/performance.md \"The regression check\")"
        );
        Ok(exit::ERROR)
    }
}
