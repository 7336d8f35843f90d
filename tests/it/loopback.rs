//! Issue #38: the simulated cluster lives on loopback, and nothing needs another address.
//!
//! `tests/run` (as root, as CI is) runs the whole suite inside a network namespace that has
//! only `lo`, so any connection to another address fails at once; these tests check that the
//! namespace is really in force and that the README's main command finishes inside one.

use std::process::Command;

/// The network interfaces and routes this process sees (`/proc/self/net` is per network
/// namespace, unlike `/sys/class/net`). Reading them sends nothing anywhere.
fn interfaces_and_routes() -> (Vec<String>, usize) {
    let dev = std::fs::read_to_string("/proc/self/net/dev").unwrap();
    let interfaces = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(|i| i.trim().to_string())
        .collect();
    let routes = std::fs::read_to_string("/proc/self/net/route")
        .unwrap()
        .lines()
        .skip(1)
        .count();
    (interfaces, routes)
}

/// When `tests/run` says the suite runs in the loopback-only namespace, it does: `lo` is the
/// only interface and there is no IPv4 route off it, so no test could reach another host.
#[test]
fn the_suite_runs_where_only_loopback_exists_when_tests_run_says_so() {
    let (interfaces, routes) = interfaces_and_routes();
    match std::env::var("MEDEA_TEST_NETNS").as_deref() {
        Ok("loopback-only") => {
            assert_eq!(interfaces, ["lo"], "interfaces in the test namespace");
            assert_eq!(routes, 0, "IPv4 routes in the test namespace");
        }
        _ => crate::fixtures::skip(&format!(
            "not run by `tests/run` as root, so not in a loopback-only namespace (interfaces here: {interfaces:?})"
        )),
    }
}

/// `medea demo --approve`, started inside a fresh network namespace with only `lo` up,
/// finishes with every machine upgraded: the simulator, the server, the preflight refresh and
/// the rollout need nothing but loopback.
#[test]
fn medea_demo_approve_finishes_in_a_network_namespace_with_only_loopback() {
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    if !root {
        crate::fixtures::skip("creating a network namespace needs root (CI runs as root)");
        return;
    }
    let out = Command::new("unshare")
        .args(["--net", "--", "sh", "-c"])
        .arg("ip link set lo up && exec \"$@\"")
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_medea"))
        .args(["demo", "--approve"])
        .env("NO_COLOR", "1")
        .output()
        .expect("unshare (util-linux) runs");
    crate::cli::assert_demo_finished(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // the simulator's own addresses never turn into a finding: every apiserver answered
    assert!(!stdout.contains("partial-view"), "{stdout}");
    assert!(!stdout.contains("removed-api/unobserved"), "{stdout}");
}
