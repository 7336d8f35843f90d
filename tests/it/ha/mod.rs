//! High availability on a real etcd: election, fencing, failover.
//!
//! In-process tests drive `EtcdStore::campaign` directly. Process tests run replicas as real
//! `medea __ha-probe` processes (journal an intent through the fenced path, re-check leadership,
//! act on an append-only "external system" file, resume by observing it) and kill -9 or
//! SIGSTOP the leader at chosen points; `medea serve` replicas show who leads in `get server`.
//!
//! This file holds the timings and the replica processes the subjects share; each subject is a
//! module: [`election`] (in process), [`replicas`] (`__ha-probe` processes), [`serve`] (who
//! leads) and [`serve_rollout`] (failover mid-rollout on the simulator).

mod election;
mod replicas;
mod serve;
mod serve_rollout;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use medea::store::{Fence, FencedStore, Role, Store, StoreError, Table, Txn};

use crate::etcd_harness::{Etcd, unique_prefix};

/// The lease TTL of the replicas in these tests: short, to keep failovers quick, and not
/// shorter, so that a loaded CI machine does not delay a renewal past the leader's deadline
/// (etcd's own minimum with default timing is 2s).
const TTL: Duration = Duration::from_secs(3);
/// Slack on top of the TTL for a takeover: etcd sweeps expired leases every 500ms, then the
/// follower's watch fires and it campaigns; the rest is room for a loaded CI machine.
const TAKEOVER_SLACK: Duration = Duration::from_secs(2);
/// Bound for waits that are not about timing (process start, etc.).
const PATIENCE: Duration = Duration::from_secs(60);

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn within<T>(d: Duration, what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(d, f)
        .await
        .unwrap_or_else(|_| panic!("timed out after {d:?} waiting for {what}"))
}

// ---------------------------------------------------------------------------------------------
// replica processes

struct Replica {
    name: String,
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    lines: mpsc::Receiver<(Instant, String)>,
    seen: Vec<String>,
}

impl Replica {
    fn probe(etcd: &Etcd, prefix: &str, name: &str, actions: &Path, extra: &[&str]) -> Replica {
        let mut cmd = crate::cli::medea();
        cmd.args([
            "__ha-probe",
            "--store",
            &etcd.url(prefix),
            "--replica",
            name,
        ])
        .arg("--leader-ttl")
        .arg(format!("{}s", TTL.as_secs()))
        .arg("--actions")
        .arg(actions)
        .args(extra);
        Replica::spawn(name, cmd, false)
    }

    /// Lines come from stdout (`probe`) or from the logs on stderr (`serve`).
    fn spawn(name: &str, mut cmd: Command, from_stderr: bool) -> Replica {
        cmd.stdin(Stdio::piped());
        if from_stderr {
            cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        } else {
            cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        let out: Box<dyn std::io::Read + Send> = if from_stderr {
            Box::new(child.stderr.take().unwrap())
        } else {
            Box::new(child.stdout.take().unwrap())
        };
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Replica {
            name: name.to_string(),
            child,
            stdin,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// The first line from now on that satisfies `pred`, and when it arrived.
    fn wait_for(
        &mut self,
        what: &str,
        within: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> (Instant, String) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((at, line)) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return (at, line);
                    }
                }
                Err(_) => panic!(
                    "replica {} did not print {what} within {within:?}; it printed:\n{}",
                    self.name,
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Let a `--wait-for-go` probe start stepping.
    fn go(&mut self) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("stdin");
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }

    /// Everything printed so far that was not consumed yet.
    fn drain(&mut self) -> Vec<String> {
        let mut fresh = Vec::new();
        while let Ok((_, l)) = self.lines.try_recv() {
            self.seen.push(l.clone());
            fresh.push(l);
        }
        fresh
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {}", self.name);
    }

    fn kill9(&mut self) -> Instant {
        self.child.kill().unwrap();
        let at = Instant::now();
        self.child.wait().unwrap();
        at
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn number_after(line: &str, word: &str) -> Option<u64> {
    line.strip_prefix(word)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The "external system" side effects: `(n, replica)` per action, in order.
fn actions(path: &Path) -> Vec<(u64, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut it = l.split(' ');
            (
                it.next().unwrap().parse().unwrap(),
                it.next().unwrap().to_string(),
            )
        })
        .collect()
}

/// Every step 1..=n acted exactly once.
fn assert_each_step_acted_once(path: &Path, n: u64) {
    let acts = actions(path);
    let mut counts = std::collections::BTreeMap::new();
    for (k, _) in &acts {
        *counts.entry(*k).or_insert(0) += 1;
    }
    for k in 1..=n {
        assert_eq!(counts.get(&k), Some(&1), "step {k} in {acts:?}");
    }
    assert!(counts.keys().all(|k| *k <= n), "{acts:?}");
}

fn get_server(addr: &str, state: &Path) -> serde_json::Value {
    let out = crate::cli::medea()
        .args(["get", "server", "-o", "json", "--addr", addr])
        .env("MEDEA_TOKEN", "ha-token")
        .env("MEDEA_CA", state.join("tls/ca.crt"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn addr_of(line: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .expect("addr= in the listening line")
        .to_string()
}

/// Whether the process is stopped (state `T` in /proc).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
        })
        .is_some_and(|st| st == "T" || st == "t")
}
