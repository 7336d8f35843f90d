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
