//! `medea bench`: a quick functional run of every scenario on a tiny fleet. Nothing here is
//! timed or asserts a speed; the numbers come from release builds (design/performance.md).

use crate::cli::medea;

fn run(args: &[&str]) -> String {
    let out = medea().arg("bench").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "medea bench {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `medea bench fleet` of `clusters` x `machines` into a temporary directory, then the
/// documented rehearsal `medea plan --desired DIR/desired --observed DIR/inventory.json`:
/// (what fleet printed, the plan process's output).
fn fleet_then_plan(clusters: &str, machines: &str) -> (String, std::process::Output) {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&[
        "fleet",
        "--clusters",
        clusters,
        "--machines",
        machines,
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    let plan = medea()
        .arg("plan")
        .arg("--desired")
        .arg(dir.path().join("desired"))
        .arg("--observed")
        .arg(dir.path().join("inventory.json"))
        .output()
        .unwrap();
    (out, plan)
}

#[test]
fn fleet_writes_a_repo_that_validates_and_plans() {
    let (out, plan) = fleet_then_plan("3", "12");
    assert!(out.contains("wrote 3 clusters, 36 machines"), "{out}");
    assert_eq!(
        plan.status.code(),
        Some(2),
        "a generated fleet has changes to plan:\n{}",
        String::from_utf8_lossy(&plan.stderr)
    );
}

/// The documented rehearsal at the fleet size the docs advertise: 100 clusters x 100 machines.
/// The inventory file is medea's own JSON, read without the hostile-input YAML budget that used
/// to refuse it ("budget breached: Nodes { nodes: 250001 }").
#[test]
fn a_fleet_of_ten_thousand_machines_plans_through_the_documented_command() {
    let (out, plan) = fleet_then_plan("100", "100");
    assert!(out.contains("wrote 100 clusters, 10000 machines"), "{out}");
    let stderr = String::from_utf8_lossy(&plan.stderr);
    assert_eq!(plan.status.code(), Some(2), "{stderr}");
    let text = String::from_utf8(plan.stdout).unwrap();
    let clusters = text.lines().filter(|l| l.starts_with("cluster c0")).count();
    assert_eq!(clusters, 100, "every cluster is planned");
}

#[test]
fn plan_reports_the_floor_the_stages_and_the_ratio() {
    let out = run(&[
        "plan",
        "--clusters",
        "2",
        "--machines",
        "8",
        "--rounds",
        "2",
    ]);
    for needle in [
        "host: ",
        "fleet: 2 clusters x 8 machines = 16 machines",
        "parse floor (tree):",
        "load + validate:",
        "plan::compute:",
        "render::text:",
        "ratio total / floor",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in:\n{out}");
    }
}

/// Python 3 with PyYAML built against libyaml (the reference of `bench plan-process`), or `None`
/// after a "skipped" line; under `CI` (as `tests/run` sets it, and installs python3-yaml) a
/// missing one fails.
fn python_with_libyaml() -> Option<&'static str> {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import yaml; yaml.CSafeLoader"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some("python3");
    }
    let why = "this test needs python3 with PyYAML built against libyaml: \
               `apt-get install python3-yaml`, or run the suite with `tests/run`";
    assert!(
        std::env::var_os("CI").is_none_or(|v| v.is_empty()),
        "{why} (CI is set, so this is a failure)"
    );
    eprintln!("skipped: {why}");
    None
}

/// `medea plan` as a process against libyaml over the same files: both ran, libyaml parsed the
/// desired documents of both clusters and the inventory, and the report carries both ratios.
#[test]
fn plan_process_runs_medea_plan_and_libyaml_side_by_side() {
    let Some(python) = python_with_libyaml() else {
        return;
    };
    let out = run(&[
        "plan-process",
        "--clusters",
        "2",
        "--machines",
        "8",
        "--rounds",
        "2",
        "--python",
        python,
    ]);
    for needle in [
        "host: ",
        "fleet: 2 clusters x 8 machines = 16 machines",
        "medea plan (process):   median",
        "(n=2)",
        "libyaml (process):",
        "libyaml (parse only):",
        "ratio medea plan / libyaml process",
        "medea plan peak RSS: ",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in:\n{out}");
    }
    // Every desired document and the inventory went through libyaml: more than the 4 files.
    let docs: usize = out
        .split("libyaml parsed ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no document count in:\n{out}"));
    assert!(docs > 4, "libyaml parsed only {docs} documents:\n{out}");
}

/// A reference interpreter that is not there is a clear error, not a number.
#[test]
fn plan_process_names_what_to_install_when_the_reference_is_missing() {
    let out = medea()
        .args([
            "bench",
            "plan-process",
            "--clusters",
            "1",
            "--machines",
            "4",
            "--rounds",
            "1",
            "--python",
            "/nonexistent/python3",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot start the libyaml reference (python3)"),
        "{err}"
    );
}

#[test]
fn rollout_rolls_every_node_once_and_reports_both_runs() {
    let out = run(&[
        "rollout",
        "--nodes",
        "7",
        "--delay-nodes",
        "4",
        "--delay",
        "20ms",
        "--max-unavailable",
        "2",
        "--runs",
        "1",
    ]);
    assert!(
        out.contains("every node upgraded exactly once: true"),
        "{out}"
    );
    assert!(
        out.contains("4 workers, maxUnavailable 2, 2 waves"),
        "{out}"
    );
    assert!(out.contains("wall / ideal: median"), "{out}");
}

#[test]
fn rollout_on_the_simulator_goes_through_the_real_adapters() {
    let out = run(&[
        "rollout",
        "--on",
        "sim",
        "--nodes",
        "5",
        "--delay-nodes",
        "3",
        "--delay",
        "30ms",
        "--max-unavailable",
        "2",
        "--runs",
        "1",
    ]);
    assert!(
        out.contains("engine overhead on the simulator via the real adapters: 5 nodes"),
        "{out}"
    );
    // the simulator's own counters: every node rebooted onto the target, one Upgrade each
    assert!(
        out.contains("every node upgraded exactly once: true"),
        "{out}"
    );
    assert!(
        out.contains("fixed delays on the simulator via the real adapters: 3 workers, maxUnavailable 2, 2 waves"),
        "{out}"
    );
}

#[test]
fn server_measures_a_real_serve_process() {
    let out = run(&[
        "server",
        "--clusters",
        "2",
        "--machines",
        "6",
        "--debounce",
        "50ms",
        "--changes",
        "2",
        "--gets",
        "2",
        "--idle",
        "300ms",
    ]);
    for needle in [
        "idle: RSS ",
        "get machines (12 rows",
        "RPC, fresh TLS connection:",
        "-> new plan stored:",
        "(n=2)",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in:\n{out}");
    }
}

/// Issue #49: `medea bench pools` plans one cluster of 500 pools (the first case; the others
/// are the same code with more pools) and prints its timings.
#[test]
fn pools_plans_a_cluster_of_500_pools() {
    let out = run(&["pools", "--cases", "1", "--rounds", "1"]);
    for needle in [
        "host: ",
        "1 cluster(s) x 500 pools (501 documents): load + validate median",
        "; plan median",
        "; total median",
    ] {
        assert!(
            out.contains(needle),
            "missing `{needle}` in:
{out}"
        );
    }
}

/// Issue 32: `medea bench approvals` seeds a store with stored and executed plans and a
/// checkout with markers none of which signs the current plan, then times reconcile passes
/// with an empty approval cache and with the cache of the pass before. The warm pass verifies
/// no signature; the cold one at most two per marker (the current plan and the plan its file
/// name names), never one per stored plan.
#[test]
fn approvals_times_a_cold_and_a_warm_reconcile_pass() {
    let out = run(&[
        "approvals",
        "--markers",
        "30",
        "--plans",
        "200",
        "--rounds",
        "2",
    ]);
    for needle in [
        "host: ",
        "store: 201 plan records (20 executed ids), 30 markers none of which signs the current plan",
        "reconcile pass, empty approval cache: median",
        "reconcile pass, markers unchanged:    median",
        "(0 signature checks; target",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in:\n{out}");
    }
    // 10 stale (own name: current + named), 10 copied (another plan's name: current +
    // named), 10 naming no plan (current only).
    assert!(
        out.contains("(50 signature checks; target"),
        "cold pass checks:\n{out}"
    );
    // The outcomes: the 20 copies sign none of the plans offered them; of the 10 under their
    // own plan's name, the 7 of executed plans (ids 0, 3, … 18 of the first 20) are replays,
    // the 3 others stale.
    assert!(
        out.contains("outcomes: 20 other-plan, 7 replayed, 3 stale-plan"),
        "{out}"
    );
}

#[test]
fn predict_compares_each_run_with_the_prediction_its_history_gives() {
    let out = run(&[
        "predict",
        "--workers",
        "3",
        "--max-unavailable",
        "2",
        "--delay",
        "1s",
        "--runs",
        "1",
    ]);
    assert!(
        out.contains("predicted against actual on the simulator: 3 workers, maxUnavailable 2"),
        "{out}"
    );
    // the one predicted run is predicted from the journal of the seeding run, not defaults
    assert!(out.contains("run 1: predicted median"), "{out}");
    assert!(out.contains("(history of 1 job(s))"), "{out}");
    assert!(out.contains("|error|: median"), "{out}");
}

/// Issue #36 item 6: `medea bench window` on a tiny pool. Both jobs succeed with every node on
/// the target, installed once and booted once (the scenario checks that from the simulator's
/// counters and fails otherwise). staged < unstaged holds by construction, not by timing luck:
/// both windows hold the same two waves of cordon, drain, reboot (200 ms away) and uncordon,
/// but only the unstaged one also holds each node's install (300 ms, sequential in its wave)
/// and the second wave's pull; the staged job made those before its first cordon.
#[test]
fn window_staged_is_shorter_than_unstaged_and_both_jobs_succeed() {
    let out = run(&[
        "window",
        "--workers",
        "2",
        "--max-unavailable",
        "1",
        "--pull",
        "100ms",
        "--install",
        "300ms",
        "--reboot",
        "200ms",
        "--runs",
        "1",
    ]);
    assert!(
        out.contains(
            "every job succeeded with every node on the target, installed once and booted once"
        ),
        "{out}"
    );
    let median = |prefix: &str| -> f64 {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{out}"));
        let rest = line.split("median ").nth(1).unwrap();
        rest.split(' ').next().unwrap().parse().unwrap()
    };
    let unstaged = median("unstaged (");
    let staged = median("staged (");
    assert!(
        staged < unstaged,
        "staged {staged} s, unstaged {unstaged} s:\n{out}"
    );
}

/// Issue #54 item 4: the regression check `tests/run` runs. Every row is a ratio of runs taken
/// side by side (or a count), checked against design/bench-ci-baseline.json for this machine class
/// with a factor that leaves room for a loaded machine: a check, not a timed test.
#[test]
fn ci_rows_stay_within_their_factor_of_the_recorded_baseline() {
    let out = medea()
        .args(["bench", "ci", "--rounds", "3", "--baseline"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/design/bench-ci-baseline.json"
        ))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "medea bench ci: a row regressed (or the run failed):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "plan_vs_parse_floor",
        "sim_vs_fakes_per_node",
        "fakes_per_node_vs_parse_floor",
        "commits_per_node",
    ] {
        assert!(stdout.contains(row), "{row} missing:\n{stdout}");
    }
}

/// A baseline the rows cannot meet makes `medea bench ci` fail, naming the row.
#[test]
fn ci_fails_when_a_row_exceeds_its_factor() {
    let dir = tempfile::tempdir().unwrap();
    let strict = dir.path().join("strict.json");
    let class = |p: &str| {
        format!(
            r#""{}-{{cpus}}cpu-{p}": {{"plan_vs_parse_floor": 0.001, "sim_vs_fakes_per_node": 0.001, "fakes_per_node_vs_parse_floor": 0.001, "commits_per_node": 0.001}}"#,
            std::env::consts::ARCH
        )
    };
    let cpus = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4);
    let text = format!(
        r#"{{"factors": {{"plan_vs_parse_floor": 1.0, "sim_vs_fakes_per_node": 1.0, "fakes_per_node_vs_parse_floor": 1.0, "commits_per_node": 1.0}},
            "classes": {{ {}, {} }} }}"#,
        class("debug"),
        class("release")
    )
    .replace("{cpus}", &cpus.to_string());
    std::fs::write(&strict, text).unwrap();
    let out = medea()
        .args(["bench", "ci", "--rounds", "1", "--nodes", "8", "--baseline"])
        .arg(&strict)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("REGRESSED"), "{stdout}");
}
