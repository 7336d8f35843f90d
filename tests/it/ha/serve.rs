//! `medea serve` replicas: who leads, shown by `get server`.

use super::*;

fn serve(etcd: &Etcd, prefix: &str, name: &str, state: &Path) -> Replica {
    let mut cmd = crate::cli::medea();
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--replica", name])
        .arg("--store")
        .arg(etcd.url(prefix))
        .arg("--leader-ttl")
        .arg(format!("{}s", TTL.as_secs()))
        .arg("--desired")
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples"))
        .arg("--state-dir")
        .arg(state)
        .env("MEDEA_TOKEN", "ha-token")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info");
    Replica::spawn(name, cmd, true)
}

#[test]
fn serve_replicas_elect_a_leader_and_get_server_shows_it() {
    let Some(etcd) = Etcd::shared() else { return };
    let prefix = unique_prefix("serve");
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = serve(etcd, &prefix, "a", da.path());
    let (_, listening) = a.wait_for("the API address", PATIENCE, |l| l.contains("API listening"));
    let addr_a = addr_of(&listening);
    a.wait_for("leading", PATIENCE, |l| {
        l.contains(" leading ") || l.ends_with(" leading")
    });
    let mut b = serve(etcd, &prefix, "b", db.path());
    let (_, listening) = b.wait_for("the API address", PATIENCE, |l| l.contains("API listening"));
    let addr_b = addr_of(&listening);
    b.wait_for("following a", PATIENCE, |l| {
        l.contains("following") && l.contains("leader=a")
    });

    let info = get_server(&addr_a, da.path());
    assert_eq!(info["replica"], "a");
    assert_eq!(info["leader"], true);
    assert_eq!(info["leaderReplica"], "a");
    let info = get_server(&addr_b, db.path());
    assert_eq!(info["replica"], "b");
    assert_eq!(info["leader"], false);
    assert_eq!(info["leaderReplica"], "a");

    // The table names the leader too.
    let out = crate::cli::medea()
        .args(["get", "server", "--addr", &addr_b])
        .env("MEDEA_TOKEN", "ha-token")
        .env("MEDEA_CA", db.path().join("tls/ca.crt"))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("REPLICA  LEADER  LEADING-REPLICA"),
        "{text}"
    );
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("b        no      a ")),
        "{text}"
    );

    let killed = a.kill9();
    let (took_over, _) = b.wait_for("leading", TTL + TAKEOVER_SLACK, |l| {
        l.contains(" leading ") || l.ends_with(" leading")
    });
    let took = took_over.saturating_duration_since(killed);
    eprintln!("serve: takeover {took:?} after the kill (lease TTL {TTL:?})");
    assert!(took <= TTL + TAKEOVER_SLACK, "takeover after {took:?}");
    let info = get_server(&addr_b, db.path());
    assert_eq!(info["leader"], true);
    assert_eq!(info["leaderReplica"], "b");

    // A graceful stop (SIGTERM) resigns: the leader key is released at once rather than
    // after the lease runs out.
    b.signal("-TERM");
    assert!(b.child.wait().unwrap().success());
    assert_eq!(etcd.store(&prefix).current_leader().unwrap(), None);
}
