//! Shell completion from the server's names (#39 item 7).

use super::*;

/// #39 item 7: the shell asks `medea` for completions (`COMPLETE=fish medea -- medea …`, the
/// clap_complete protocol the `source <(COMPLETE=bash medea)` line uses) and the names come from
/// the server the client reaches; with no server, nothing is offered and the shell does not wait.
#[test]
fn shell_completion_offers_the_servers_cluster_machine_and_pool_names() {
    let s = start(examples(), vec![home_inventory()]);
    let complete = |words: &[&str]| -> Vec<String> {
        let out = s
            .cli()
            .env("COMPLETE", "fish")
            .arg("--")
            .args(words)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.split('\t').next().unwrap_or_default().to_string())
            // With nothing typed yet the shell is offered the flags too.
            .filter(|w| !w.starts_with('-'))
            .collect()
    };
    let machines = complete(&["medea", "get", "machine", ""]);
    for n in ["cp-1", "cp-2", "cp-3", "w-1", "w-2", "w-3"] {
        assert!(machines.contains(&n.to_string()), "{n}: {machines:?}");
    }
    assert_eq!(
        complete(&["medea", "get", "machine", "w-"]),
        ["w-1", "w-2", "w-3"]
    );
    assert_eq!(
        complete(&["medea", "rollout", "status", "--cluster", "h"]),
        ["home"]
    );
    // The examples name two clusters; the server knows both.
    assert_eq!(
        complete(&["medea", "cluster", "enable-rollouts", ""]),
        ["home", "prod"]
    );
    let pools = complete(&["medea", "get", "machines", "--pool", ""]);
    assert!(pools.contains(&"workers".to_string()), "{pools:?}");
    // No server at the address: nothing offered, promptly, and no error text for the shell.
    let out = crate::cli::medea()
        .env("COMPLETE", "fish")
        .env("MEDEA_ADDR", "127.0.0.1:9")
        .env("MEDEA_STATE_DIR", "/nonexistent/medea-tests/state")
        .args(["--", "medea", "get", "machine", ""])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let offered = String::from_utf8_lossy(&out.stdout);
    assert!(offered.lines().all(|l| l.starts_with('-')), "{offered}");
    assert!(out.stderr.is_empty(), "{out:?}");
}
