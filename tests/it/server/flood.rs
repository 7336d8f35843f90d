//! The API listener under a flood of silent connections (issue #49): `medea serve` with a
//! 256-descriptor limit keeps answering and keeps its loops working.

use std::process::{Command, Output, Stdio};
use std::time::Instant;

use super::*;

/// `cmd`'s output if it ends within `limit`; else it is killed and `None` (a client stuck on
/// a server that never answers must fail the test, not hang it).
fn output_within(mut cmd: Command, limit: Duration) -> Option<Output> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `medea get server -o json` within `limit`, if it succeeded.
fn server_info(s: &crate::fixtures::serve::Serve, limit: Duration) -> Option<serde_json::Value> {
    let mut cmd = s.cli();
    cmd.args(["get", "server", "-o", "json"]);
    let out = output_within(cmd, limit)?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// One sample of `/metrics` (plain HTTP/1.1), if it answered within 5 s.
fn metric(addr: &str, name: &str) -> Option<f64> {
    use std::io::{Read as _, Write as _};
    let mut c = std::net::TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    c.read_to_string(&mut body).ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// 300 silent TCP connections to the API port of a `medea serve` limited to 256 file
/// descriptors, from ten loopback addresses (30 each: under the per-peer cap, far over the cap
/// in all). During the flood the API answers within seconds, the desired-state reload sees an
/// edit, the inventory refresh succeeds, and nothing runs out of descriptors. Before, the API
/// stopped answering for as long as the connections stayed open and the refresh and the reload
/// failed with "Too many open files".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_and_the_loops_hold_through_a_flood_of_silent_connections() {
    let s = crate::fixtures::serve::serve()
        .metrics()
        .nofile(256)
        .start();
    let metrics = s.metrics.clone().unwrap();
    let before = server_info(&s, Duration::from_secs(30)).expect("the server answers");
    let api: SocketAddr = s.addr.parse().unwrap();
    let flood_began = jiff::Timestamp::now().as_second() as f64;
    let mut flood = Vec::new();
    for i in 0..300 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(format!("127.0.0.{}:0", 1 + i % 10).parse().unwrap())
            .unwrap();
        // The kernel completes a connection in the listen backlog whether or not the server
        // accepts it; the deadline is for a full backlog.
        if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_secs(5), sock.connect(api)).await {
            flood.push(c);
        }
    }
    assert!(
        flood.len() >= 250,
        "only {} connections opened",
        flood.len()
    );
    // The API answers during the flood, within seconds.
    let started = Instant::now();
    let during = tokio::task::block_in_place(|| server_info(&s, Duration::from_secs(20)));
    assert!(
        during.is_some(),
        "the API did not answer within 20 s during the flood:\n{}",
        s.serve_log()
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the API took {:?} to answer during the flood",
        started.elapsed()
    );
    // The desired-state reload sees an edit.
    let cluster = s.desired.join("home/cluster.yaml");
    let text = std::fs::read_to_string(&cluster).unwrap();
    std::fs::write(&cluster, format!("{text}\n# edited during the flood\n")).unwrap();
    let revision = |v: &serde_json::Value| v["desiredRevision"].as_str().map(str::to_string);
    assert!(revision(&before).is_some(), "{before}");
    tokio::task::block_in_place(|| {
        crate::fixtures::wait("the reload of the edit", Duration::from_secs(60), || {
            server_info(&s, Duration::from_secs(20))
                .is_some_and(|v| revision(&v) != revision(&before))
        })
    });
    // The inventory refresh (every 2 s) succeeds after the flood began.
    tokio::task::block_in_place(|| {
        crate::fixtures::wait(
            "a refresh after the flood began",
            Duration::from_secs(60),
            || {
                metric(&metrics, "medea_inventory_last_refresh_timestamp_seconds")
                    .is_some_and(|t| t >= flood_began)
            },
        )
    });
    let log = s.serve_log();
    assert!(
        !log.contains("Too many open files"),
        "the daemon ran out of descriptors:\n{log}"
    );
    // The flood was still open all along (the caps closed some of it, not the client).
    drop(flood);
}
