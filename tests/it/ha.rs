//! High availability on a real etcd: election, fencing, failover.
//!
//! In-process tests drive `EtcdStore::campaign` directly. Process tests run replicas as real
//! `medea __ha-probe` processes (journal an intent through the fenced path, re-check leadership,
//! act on an append-only "external system" file, resume by observing it) and kill -9 or
//! SIGSTOP the leader at chosen points; `medea serve` replicas show who leads in `get server`.

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

// ---- in-process ----

#[test]
fn of_two_campaigners_exactly_one_leads_and_the_other_names_it() {
    let Some(etcd) = Etcd::shared() else { return };
    let prefix = unique_prefix("two");
    let (sa, sb) = (etcd.store(&prefix), etcd.store(&prefix));
    let a = sa.campaign("a", TTL);
    let b = sb.campaign("b", TTL);
    let rt = rt();
    rt.block_on(async {
        let winner = within(PATIENCE, "a leader", async {
            tokio::select! {
                f = a.leading() => f,
                f = b.leading() => f,
            }
        })
        .await;
        let (leader, follower) = if winner.replica() == "a" {
            (&a, &b)
        } else {
            (&b, &a)
        };
        within(PATIENCE, "the follower to learn the leader", async {
            while follower.leader_replica().as_deref() != Some(winner.replica()) {
                follower.changed().await;
            }
        })
        .await;
        assert!(leader.is_leader());
        assert!(!follower.is_leader());
        assert_eq!(
            sa.current_leader().unwrap(),
            Some((winner.replica().to_string(), winner.term()))
        );
        // The follower's fenced writes are refused before reaching etcd.
        let err = follower.check().unwrap_err();
        assert!(
            matches!(&err, StoreError::NotLeader { leader: Some(l), .. } if l == winner.replica()),
            "{err}"
        );
    });
}

#[test]
fn a_deposed_leaders_fence_is_refused_and_a_follower_cannot_write() {
    let Some(etcd) = Etcd::shared() else { return };
    let prefix = unique_prefix("deposed");
    let sa: std::sync::Arc<dyn Store> = std::sync::Arc::new(etcd.store(&prefix));
    let sb = etcd.store(&prefix);
    let rt = rt();
    let a = etcd.store(&prefix).campaign("a", TTL);
    let old = rt.block_on(within(PATIENCE, "a to lead", a.leading()));
    sa.commit(
        Txn::new()
            .fenced(&old)
            .put(Table::Jobs, "j", b"by a".to_vec()),
    )
    .unwrap();
    rt.block_on(within(PATIENCE, "a to resign", a.resign()));
    let b = sb.campaign("b", TTL);
    let new = rt.block_on(within(PATIENCE, "b to lead", b.leading()));
    assert_ne!(old.term(), new.term());

    // a wakes up with its old fence: etcd refuses, nothing changes.
    let err = sa
        .commit(
            Txn::new()
                .fenced(&old)
                .put(Table::Jobs, "j", b"by a, late".to_vec()),
        )
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Fenced { replica, term } if replica == "a" && *term == old.term()),
        "{err}"
    );
    // A forged fence with b's term but a's name is refused too (the value is compared).
    let err = sa
        .commit(Txn::new().fenced(&Fence::new("a", new.term())).put(
            Table::Jobs,
            "j",
            b"forged".to_vec(),
        ))
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    assert_eq!(sa.get(Table::Jobs, "j").unwrap(), Some(b"by a".to_vec()));

    // Through FencedStore: a (resigned, following) writes nothing; b's writes land.
    let fa = FencedStore::new(sa.clone(), a.clone());
    let err = fa
        .commit(Txn::new().put(Table::Jobs, "j", b"x".to_vec()))
        .unwrap_err();
    assert!(matches!(err, StoreError::NotLeader { .. }), "{err}");
    let fb = FencedStore::new(sa.clone(), b.clone());
    fb.commit(Txn::new().put(Table::Jobs, "j", b"by b".to_vec()))
        .unwrap();
    assert_eq!(sa.get(Table::Jobs, "j").unwrap(), Some(b"by b".to_vec()));
}

#[test]
fn resigning_hands_over_without_waiting_for_the_lease() {
    let Some(etcd) = Etcd::shared() else { return };
    let prefix = unique_prefix("resign");
    let long = Duration::from_secs(30);
    let a = etcd.store(&prefix).campaign("a", long);
    let rt = rt();
    rt.block_on(within(PATIENCE, "a to lead", a.leading()));
    let b = etcd.store(&prefix).campaign("b", long);
    rt.block_on(async {
        within(PATIENCE, "b to follow a", async {
            while b.leader_replica().as_deref() != Some("a") {
                b.changed().await;
            }
        })
        .await;
        let t0 = Instant::now();
        a.resign().await;
        within(Duration::from_secs(10), "b to take over", b.leading()).await;
        assert!(t0.elapsed() < long / 3, "{:?}", t0.elapsed());
        assert!(matches!(a.role(), Role::Follower { .. }));
    });
}

/// etcd frozen (as if partitioned away): the leader stops leading by its own deadline, before
/// the lease could have expired on the server, and no later than the TTL.
#[test]
fn a_leader_cut_off_from_etcd_stops_leading_within_the_ttl() {
    let Some(etcd) = Etcd::start() else { return };
    let prefix = unique_prefix("cutoff");
    let store = etcd.store(&prefix);
    let a = store.campaign("a", TTL);
    let rt = rt();
    let fence = rt.block_on(within(PATIENCE, "a to lead", a.leading()));
    etcd.freeze();
    let t0 = Instant::now();
    rt.block_on(within(
        TTL + Duration::from_secs(2),
        "a to step down",
        a.lost(&fence),
    ));
    let took = t0.elapsed();
    assert!(
        took <= TTL,
        "stepped down after {took:?}, lease TTL {TTL:?}"
    );
    assert!(!a.is_leader());
    assert!(matches!(a.ensure(&fence), Err(StoreError::Fenced { .. })));
    etcd.thaw();
    // Back in contact, it (the only candidate) leads again, in a new term.
    let again = rt.block_on(within(PATIENCE, "a to lead again", a.leading()));
    assert_ne!(again.term(), fence.term());
}

/// An operator deletes the leader key: the leader notices on its next renewal tick.
#[test]
fn a_leader_whose_key_is_deleted_steps_down() {
    let Some(etcd) = Etcd::shared() else { return };
    let prefix = unique_prefix("deleted");
    let a = etcd.store(&prefix).campaign("a", TTL);
    let rt = rt();
    let fence = rt.block_on(within(PATIENCE, "a to lead", a.leading()));
    etcd.raw().delete(format!("{prefix}/leader"));
    rt.block_on(async {
        within(TTL, "a to notice", a.lost(&fence)).await;
        let again = within(PATIENCE, "a new term", a.leading()).await;
        assert_ne!(again.term(), fence.term());
    });
}

// ---- replica processes ----

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

enum KillPoint {
    /// Right after winning, before any intent.
    JustElected,
    /// After this many steps were journaled and acted on.
    AfterActing(u64),
    /// After journaling this intent, before re-checking leadership and acting on it.
    BetweenIntentAndAction(u64),
}

fn failover(point: KillPoint, label: &str) {
    let Some(etcd) = Etcd::shared() else { return };
    let prefix = unique_prefix(label);
    let dir = tempfile::tempdir().unwrap();
    let acts: PathBuf = dir.path().join("actions");
    // Enough steps at a slow enough pace that the kill lands mid-run.
    const STEPS: u64 = 20;
    let steps = STEPS.to_string();
    let stop = match point {
        KillPoint::BetweenIntentAndAction(n) => Some(n.to_string()),
        _ => None,
    };
    let mut a_args = vec!["--steps", &steps, "--wait-for-go", "--interval", "100ms"];
    if let Some(n) = &stop {
        a_args.extend(["--stop-after-intent", n.as_str()]);
    }
    let mut a = Replica::probe(etcd, &prefix, "a", &acts, &a_args);
    a.wait_for("leading", PATIENCE, |l| l.starts_with("leading"));
    a.wait_for("ready", PATIENCE, |l| l == "ready");
    let mut b = Replica::probe(etcd, &prefix, "b", &acts, &["--steps", &steps]);
    b.wait_for("following a", PATIENCE, |l| l == "following a");

    let killed_at = match point {
        KillPoint::JustElected => a.kill9(),
        KillPoint::AfterActing(n) => {
            a.go();
            a.wait_for(&format!("acted {n}"), PATIENCE, |l| {
                number_after(l, "acted ") == Some(n)
            });
            a.kill9()
        }
        KillPoint::BetweenIntentAndAction(n) => {
            a.go();
            a.wait_for("stopping after the intent", PATIENCE, |l| {
                l.starts_with("stopping after intent")
            });
            let at = a.kill9();
            assert!(
                !actions(&acts).iter().any(|(k, _)| *k == n),
                "the stopped leader acted on {n}"
            );
            at
        }
    };
    a.drain();
    assert!(
        !a.seen.iter().any(|l| l == "finished"),
        "a finished before it was killed: {:?}",
        a.seen
    );
    let (took_over, _) = b.wait_for("leading", TTL + TAKEOVER_SLACK, |l| {
        l.starts_with("leading")
    });
    let took = took_over.saturating_duration_since(killed_at);
    eprintln!("{label}: takeover {took:?} after the kill (lease TTL {TTL:?})");
    assert!(took <= TTL + TAKEOVER_SLACK, "takeover after {took:?}");
    if let KillPoint::BetweenIntentAndAction(n) = point {
        b.wait_for("the resume", PATIENCE, |l| l == format!("resume {n}"));
    }
    b.wait_for("finished", PATIENCE, |l| l == "finished");
    assert!(b.child.wait().unwrap().success());
    assert_each_step_acted_once(&acts, STEPS);
    if let KillPoint::BetweenIntentAndAction(n) = point {
        let acts = actions(&acts);
        assert!(acts.contains(&(n, "b".to_string())), "{acts:?}");
    }
}

#[test]
fn a_leader_killed_just_after_winning_is_replaced_within_the_ttl() {
    failover(KillPoint::JustElected, "kill-elected");
}

#[test]
fn a_leader_killed_mid_run_is_replaced_and_every_step_acts_once() {
    failover(KillPoint::AfterActing(3), "kill-mid");
}

#[test]
fn a_leader_killed_between_intent_and_action_is_resumed_by_the_new_leader() {
    failover(KillPoint::BetweenIntentAndAction(4), "kill-intent");
}

/// The old leader is frozen (SIGSTOP) between journaling an intent and acting on it; the
/// follower takes over, resumes that intent and goes on. Resumed (SIGCONT), the old leader
/// performs no write and no action: its re-check refuses, and so would etcd.
#[test]
fn a_frozen_leader_resumed_after_failover_neither_writes_nor_acts() {
    let Some(etcd) = Etcd::shared() else { return };
    let prefix = unique_prefix("sigstop");
    let dir = tempfile::tempdir().unwrap();
    let acts = dir.path().join("actions");
    let mut a = Replica::probe(
        etcd,
        &prefix,
        "a",
        &acts,
        &["--stop-after-intent", "3", "--wait-for-go"],
    );
    a.wait_for("ready", PATIENCE, |l| l == "ready");
    let mut b = Replica::probe(etcd, &prefix, "b", &acts, &[]);
    b.wait_for("following a", PATIENCE, |l| l == "following a");
    a.go();
    let (stopped_at, _) = a.wait_for("stopping after intent 3", PATIENCE, |l| {
        l == "stopping after intent 3"
    });
    let (took_over, _) = b.wait_for("leading", TTL + TAKEOVER_SLACK, |l| {
        l.starts_with("leading")
    });
    let took = took_over.saturating_duration_since(stopped_at);
    eprintln!("sigstop: takeover {took:?} after the stop (lease TTL {TTL:?})");
    assert!(took <= TTL + TAKEOVER_SLACK, "takeover after {took:?}");
    b.wait_for("resume 3", PATIENCE, |l| l == "resume 3");
    b.wait_for("acted 5", PATIENCE, |l| {
        number_after(l, "acted ") == Some(5)
    });

    a.signal("-CONT");
    a.wait_for("the refused action", PATIENCE, |l| {
        l.starts_with("refused action 3:")
    });
    a.wait_for("following b", PATIENCE, |l| l == "following b");
    // b goes on undisturbed.
    b.wait_for("acted 8", PATIENCE, |l| {
        number_after(l, "acted ") == Some(8)
    });
    b.kill9();
    a.kill9();
    a.drain();
    let after_stop: Vec<&String> = a
        .seen
        .iter()
        .skip_while(|l| *l != "stopping after intent 3")
        .collect();
    assert!(
        !after_stop
            .iter()
            .any(|l| l.starts_with("intent ") || l.starts_with("acted ")),
        "the resumed old leader wrote or acted: {after_stop:?}"
    );
    let acted = actions(&acts);
    assert!(acted.contains(&(3, "b".to_string())), "{acted:?}");
    assert!(
        acted
            .iter()
            .filter(|(_, who)| who == "a")
            .all(|(k, _)| *k < 3),
        "{acted:?}"
    );
    let last = acted.iter().map(|(k, _)| *k).max().unwrap();
    // b was killed at an arbitrary point: its last intent may lack its action.
    let store = etcd.store(&prefix);
    let counter: u64 =
        String::from_utf8(store.get(Table::Journal, "probe/counter").unwrap().unwrap())
            .unwrap()
            .parse()
            .unwrap();
    assert!(
        counter == last || counter == last + 1,
        "counter {counter}, last action {last}"
    );
    assert_each_step_acted_once(&acts, last);
    // Intent 3 was journaled by a; every later one by b.
    for (k, v) in store.scan(Table::Journal, "probe/intent/").unwrap() {
        let n: u64 = k.rsplit('/').next().unwrap().parse().unwrap();
        let who = String::from_utf8(v).unwrap();
        if n <= 3 {
            assert!(who.starts_with("a "), "{k}: {who}");
        } else {
            assert!(who.starts_with("b "), "{k}: {who}");
        }
    }
}

// ---- medea serve replicas ----

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

fn addr_of(line: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .expect("addr= in the listening line")
        .to_string()
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

// ---- `medea serve --rollouts` replicas driving a rollout on the simulator ----

/// A simulated 3 control-plane + 3 worker cluster served from this process (so its per-node
/// counters can be read), seeded into etcd with `medea seed --store etcd://…`, a desired-state
/// directory one Talos patch ahead (the seeded YAML with the version bumped) and two approvers.
struct SimFleet {
    // dropped before the runtime that serves it
    sim: crate::rollout_sim::Sim,
    _rt: tokio::runtime::Runtime,
    etcd: &'static Etcd,
    prefix: String,
    creds: PathBuf,
    desired: PathBuf,
    signers: PathBuf,
    /// The approvers' private keys, in [`APPROVERS`] order.
    keys: Vec<PathBuf>,
    dir: tempfile::TempDir,
}

const APPROVERS: [&str; 2] = ["alice", "bob"];

impl SimFleet {
    fn start(etcd: &'static Etcd, label: &str) -> SimFleet {
        use crate::rollout::{CLUSTER, FROM, TO};
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let sim = rt.block_on(crate::rollout_sim::Sim::start(
            dir.path(),
            3,
            3,
            medea::sim::kube::KubeSimConfig::default(),
        ));
        let prefix = unique_prefix(label);
        let creds = dir.path().join("medea-creds");
        // Seed the shared store the way an operator would.
        let out = crate::cli::medea()
            .args(["seed", "--cluster", CLUSTER, "--talosconfig"])
            .arg(sim.creds.join(CLUSTER).join("talosconfig"))
            .arg("--kubeconfig")
            .arg(sim.creds.join(CLUSTER).join("kubeconfig"))
            .arg("--store")
            .arg(etcd.url(&prefix))
            .arg("--creds-dir")
            .arg(&creds)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "seed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let yaml = String::from_utf8(out.stdout).unwrap();
        assert!(yaml.contains(&format!("version: {FROM}")), "{yaml}");
        let desired = dir.path().join("desired");
        std::fs::create_dir_all(&desired).unwrap();
        // One patch ahead.
        let yaml = yaml.replace(&format!("version: {FROM}"), &format!("version: {TO}"));
        std::fs::write(desired.join(format!("{CLUSTER}.yaml")), yaml).unwrap();
        // Two approvers: the default policy a first plan is held to wants two distinct
        // signers for a control plane.
        let mut keys = Vec::new();
        let mut signers = String::new();
        for who in APPROVERS {
            let key = dir.path().join(who);
            assert!(
                crate::fixtures::tool("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-C", who, "-f"])
                    .arg(&key)
                    .status()
                    .unwrap()
                    .success()
            );
            signers.push_str(&format!(
                "{who}@example.com {}\n",
                std::fs::read_to_string(key.with_extension("pub"))
                    .unwrap()
                    .trim()
            ));
            keys.push(key);
        }
        let signers_file = dir.path().join("allowed_signers");
        std::fs::write(&signers_file, signers).unwrap();
        SimFleet {
            sim,
            _rt: rt,
            etcd,
            prefix,
            creds,
            desired,
            signers: signers_file,
            keys,
            dir,
        }
    }

    /// `medea serve --rollouts` as replica `name` on the shared store, quick timings; `env`
    /// sets crash or stop points.
    fn serve(&self, name: &str, env: &[(&str, &str)]) -> ServeReplica {
        let state = self.dir.path().join(format!("state-{name}"));
        let mut cmd = crate::cli::medea();
        cmd.args([
            "serve",
            "--rollouts",
            "--listen",
            "127.0.0.1:0",
            "--replica",
            name,
        ])
        .arg("--store")
        .arg(self.etcd.url(&self.prefix))
        .arg("--leader-ttl")
        .arg(format!("{}s", TTL.as_secs()))
        .arg("--desired")
        .arg(&self.desired)
        .arg("--creds-dir")
        .arg(&self.creds)
        .arg("--allowed-signers")
        .arg(&self.signers)
        .args(["--job-poll", "100ms", "--debounce", "100ms"])
        .args(["--refresh-interval", "2s"])
        .arg("--state-dir")
        .arg(&state)
        .env("MEDEA_TOKEN", "ha-token")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .env_remove("MEDEA_CRASH_AT")
        .env_remove("MEDEA_CRASH_AFTER")
        .env_remove("MEDEA_CRASH_BEFORE")
        .env_remove("MEDEA_STOP_AT");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut r = Replica::spawn(name, cmd, true);
        let (_, listening) =
            r.wait_for("the API address", PATIENCE, |l| l.contains("API listening"));
        ServeReplica {
            addr: addr_of(&listening),
            r,
            state,
        }
    }

    fn store(&self) -> medea::store::etcd::EtcdStore {
        self.etcd.store(&self.prefix)
    }

    /// The one job in the store, once there is one.
    fn job(&self) -> Option<medea::rollout::sequencer::Job> {
        use medea::store::StoreExt;
        let jobs = self
            .store()
            .scan_records::<medea::rollout::sequencer::Job>("job/")
            .unwrap();
        assert!(jobs.len() <= 1, "{} jobs", jobs.len());
        jobs.into_iter().next().map(|(_, j)| j)
    }

    /// The job record and its journal, as stored.
    fn job_and_journal(&self) -> Vec<(String, Vec<u8>)> {
        let store = self.store();
        let mut all = store.scan(Table::Jobs, "").unwrap();
        all.extend(store.scan(Table::Journal, "").unwrap());
        all
    }

    /// Per node: (version running, cordoned, Upgrade calls, Reboot calls); and etcd snapshots.
    fn counters(&self) -> (Vec<(String, String, bool, u64, u64)>, u64) {
        let nodes = self
            .sim
            .names
            .iter()
            .map(|n| {
                (
                    n.clone(),
                    self.sim.talos.node_state(n).unwrap().running.to_string(),
                    self.sim.cordoned(n),
                    self.sim.upgrades(n),
                    self.sim.reboots(n),
                )
            })
            .collect();
        (nodes, self.sim.snapshots())
    }

    fn total_upgrades(&self) -> u64 {
        self.sim.names.iter().map(|n| self.sim.upgrades(n)).sum()
    }

    /// Plan (computed by the leader at `via`), enable rollouts, approve with a signed marker.
    fn approve_the_plan(&self, via: &ServeReplica) {
        let deadline = Instant::now() + PATIENCE;
        let plan = loop {
            let out = via.cli().args(["plan", "-o", "json"]).output().unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            if v["hasChanges"] == true {
                break v;
            }
            assert!(
                Instant::now() < deadline,
                "no plan: {v} {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let out = via
            .cli()
            .args(["cluster", "enable-rollouts", crate::rollout::CLUSTER])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "enable-rollouts: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for (who, key) in APPROVERS.iter().zip(&self.keys) {
            let out = crate::cli::medea()
                .arg("approve")
                .arg(plan["id"].as_str().unwrap())
                .arg("--key")
                .arg(key)
                .args(["--principal", &format!("{who}@example.com")])
                .args(["--write-marker", "--desired"])
                .arg(&self.desired)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "approve: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Wait for the job to succeed (any halt fails the test).
    fn wait_succeeded(&self, within: Duration) {
        use medea::rollout::sequencer::JobState;
        let deadline = Instant::now() + within;
        loop {
            if let Some(job) = self.job() {
                match &job.state {
                    JobState::Succeeded { .. } => return,
                    JobState::Halted { reason, .. } => panic!("the job halted: {reason}"),
                    JobState::Running => {}
                }
            }
            assert!(
                Instant::now() < deadline,
                "the job did not succeed within {within:?}: {:?}",
                self.job().map(|j| j.state)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every node on the target, exactly one Upgrade and one Reboot each, nobody cordoned,
    /// one etcd snapshot.
    fn assert_rolled_out_exactly_once(&self, label: &str) {
        let (nodes, snapshots) = self.counters();
        for (n, running, cordoned, upgrades, reboots) in &nodes {
            assert_eq!(
                running,
                crate::rollout::TO,
                "{label}: {n} runs {running}: {nodes:?}"
            );
            assert!(!cordoned, "{label}: {n} is cordoned: {nodes:?}");
            assert_eq!(*upgrades, 1, "{label}: {n} upgrades: {nodes:?}");
            assert_eq!(*reboots, 1, "{label}: {n} reboots: {nodes:?}");
        }
        assert_eq!(snapshots, 1, "{label}: etcd snapshots");
    }
}

struct ServeReplica {
    r: Replica,
    addr: String,
    state: PathBuf,
}

impl ServeReplica {
    fn cli(&self) -> Command {
        let mut c = crate::cli::medea();
        c.env("MEDEA_ADDR", &self.addr)
            .env("MEDEA_TOKEN", "ha-token")
            .env("MEDEA_CA", self.state.join("tls/ca.crt"));
        c
    }

    fn wait_leading(&mut self, within: Duration) -> Instant {
        self.r
            .wait_for("leading", within, |l| {
                l.contains(" leading ") || l.ends_with(" leading")
            })
            .0
    }

    /// Wait for the process to exit by itself; when it did (polled every 10ms). The patience
    /// runs from the replica's last sign of progress (a line printed), so a loaded machine that
    /// makes it slow does not fail the test while it is still working; `10 × within` in all
    /// caps a replica that keeps printing without ever exiting.
    fn wait_exit(&mut self, within: Duration) -> (Instant, std::process::ExitStatus) {
        let cap = Instant::now() + within * 10;
        let mut deadline = Instant::now() + within;
        loop {
            if let Some(st) = self.r.child.try_wait().unwrap() {
                return (Instant::now(), st);
            }
            while let Ok((_, line)) = self.r.lines.try_recv() {
                self.r.seen.push(line);
                deadline = Instant::now() + within;
            }
            let now = Instant::now();
            if now > deadline || now > cap {
                self.r.drain();
                panic!(
                    "replica {} did not exit within {within:?} of its last line (or {:?} in all); it printed:\n{}",
                    self.r.name,
                    within * 10,
                    self.r.seen.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Where replica a stops leading mid-rollout.
#[derive(Debug, Clone, Copy)]
enum LeaderLoss {
    /// `MEDEA_CRASH_AT=<entry>`: aborts right after journaling it.
    CrashAt(&'static str),
    /// `MEDEA_CRASH_BEFORE=<entry>`: aborts right before journaling it (the call was made).
    CrashBefore(&'static str),
    /// kill -9 once the simulator has seen this many Upgrade calls.
    Kill9AfterUpgrades(u64),
}

/// One failover on the simulator: a leads and starts the rollout, loses leadership at
/// `loss`, b takes over and finishes. Returns the takeover time.
fn serve_failover(loss: LeaderLoss, label: &str) -> Duration {
    let etcd = Etcd::shared().expect("checked by the caller");
    let fleet = SimFleet::start(etcd, label);
    let env: Vec<(&str, &str)> = match loss {
        LeaderLoss::CrashAt(e) => vec![("MEDEA_CRASH_AT", e)],
        LeaderLoss::CrashBefore(e) => vec![("MEDEA_CRASH_BEFORE", e)],
        LeaderLoss::Kill9AfterUpgrades(_) => vec![],
    };
    let mut a = fleet.serve("a", &env);
    a.wait_leading(PATIENCE);
    let mut b = fleet.serve("b", &[]);
    b.r.wait_for("following a", PATIENCE, |l| {
        l.contains("following") && l.contains("leader=a")
    });
    fleet.approve_the_plan(&a);
    let lost_at = match loss {
        LeaderLoss::CrashAt(e) | LeaderLoss::CrashBefore(e) => {
            use std::os::unix::process::ExitStatusExt;
            let (at, status) = a.wait_exit(PATIENCE);
            a.r.drain();
            assert_eq!(
                status.signal(),
                Some(6),
                "{label}: a must die by abort at {e}: {status:?}\n{}",
                a.r.seen.join("\n")
            );
            assert!(
                a.r.seen
                    .iter()
                    .any(|l| l.contains("crash point") && l.contains(&format!("({e})"))),
                "{label}: {}",
                a.r.seen.join("\n")
            );
            at
        }
        LeaderLoss::Kill9AfterUpgrades(n) => {
            let deadline = Instant::now() + PATIENCE;
            while fleet.total_upgrades() < n {
                assert!(Instant::now() < deadline, "{label}: {n} upgrades");
                std::thread::sleep(Duration::from_millis(10));
            }
            a.r.kill9()
        }
    };
    assert!(
        !matches!(
            fleet.job().map(|j| j.state),
            Some(medea::rollout::sequencer::JobState::Succeeded { .. })
        ),
        "{label}: the job finished before a was lost"
    );
    let took = b
        .wait_leading(TTL + TAKEOVER_SLACK)
        .saturating_duration_since(lost_at);
    eprintln!("{label}: takeover {took:?} after the leader was lost (lease TTL {TTL:?})");
    assert!(
        took <= TTL + TAKEOVER_SLACK,
        "{label}: takeover after {took:?}"
    );
    fleet.wait_succeeded(PATIENCE);
    fleet.assert_rolled_out_exactly_once(label);
    took
}

/// Two `medea serve --rollouts` replicas on real etcd upgrade a simulated 3 + 3 cluster (Talos,
/// one hop), started as an operator would: `medea seed --store etcd://…`, a desired-state
/// directory, the leader's plan, `medea cluster enable-rollouts`, signed markers from
/// `medea approve --write-marker`. The leader is lost mid-rollout at several points, each run
/// on its own simulator and key prefix, in parallel: right after an Upgrade intent (call not
/// made), right before a Reboot result (call made, outcome not journaled), right before a
/// worker's Upgrade result, and a plain kill -9. Each time the follower takes over within the
/// lease TTL plus slack and finishes: job Succeeded, every node on the target, exactly one
/// Upgrade and one Reboot per node (simulator counters), nobody cordoned, one etcd snapshot.
#[test]
fn serve_replicas_fail_over_mid_rollout_and_every_node_upgrades_exactly_once() {
    if Etcd::shared().is_none() {
        return;
    }
    let points = [
        (
            LeaderLoss::CrashAt("intent:upgrade:cp-2"),
            "after-upgrade-intent",
        ),
        (
            LeaderLoss::CrashBefore("result:reboot:cp-3"),
            "before-reboot-result",
        ),
        (
            LeaderLoss::CrashBefore("result:upgrade:w-2"),
            "worker-before-upgrade-result",
        ),
        (LeaderLoss::Kill9AfterUpgrades(2), "kill9"),
    ];
    let results: Vec<(String, Result<Duration, String>)> = std::thread::scope(|s| {
        let runs: Vec<_> = points
            .iter()
            .map(|&(loss, label)| (label, s.spawn(move || serve_failover(loss, label))))
            .collect();
        runs.into_iter()
            .map(|(label, h)| {
                let r = h.join().map_err(|e| {
                    e.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                });
                (label.to_string(), r)
            })
            .collect()
    });
    let failures: Vec<String> = results
        .iter()
        .filter_map(|(l, r)| r.as_ref().err().map(|e| format!("{l}: {e}")))
        .collect();
    for (l, r) in &results {
        if let Ok(t) = r {
            eprintln!("serve failover {l}: takeover {t:?}");
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
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

/// The leader freezes itself (`MEDEA_STOP_AT`: SIGSTOP, as a VM stall would) right after
/// journaling w-1's Upgrade intent, before making the call. The follower takes over within
/// the lease TTL plus slack, resumes that intent and finishes the rollout. Resumed (SIGCONT),
/// the old leader refuses the call it was about to make (its term is over), writes nothing
/// (the job and its journal in etcd are unchanged), acts on nothing (simulator counters
/// unchanged: still one Upgrade and one Reboot per node) and reports that b leads.
#[test]
fn a_frozen_serve_leader_resumed_after_the_rollout_finished_neither_writes_nor_acts() {
    let Some(etcd) = Etcd::shared() else { return };
    let fleet = SimFleet::start(etcd, "serve-sigstop");
    let mut a = fleet.serve("a", &[("MEDEA_STOP_AT", "intent:upgrade:w-1")]);
    a.wait_leading(PATIENCE);
    let mut b = fleet.serve("b", &[]);
    b.r.wait_for("following a", PATIENCE, |l| {
        l.contains("following") && l.contains("leader=a")
    });
    fleet.approve_the_plan(&a);
    let (stopped_at, _) = a.r.wait_for("the stop point", PATIENCE, |l| {
        l.contains("stop point") && l.contains("(intent:upgrade:w-1)")
    });
    let pid = a.r.child.id();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !is_stopped(pid) {
        assert!(Instant::now() < deadline, "a did not stop");
        std::thread::sleep(Duration::from_millis(10));
    }
    a.r.drain();
    assert_eq!(
        fleet.sim.upgrades("w-1"),
        0,
        "a stopped before the call:\n{}",
        a.r.seen.join("\n")
    );
    let took = b
        .wait_leading(TTL + TAKEOVER_SLACK)
        .saturating_duration_since(stopped_at);
    eprintln!("serve-sigstop: takeover {took:?} after the stop (lease TTL {TTL:?})");
    assert!(took <= TTL + TAKEOVER_SLACK, "takeover after {took:?}");
    fleet.wait_succeeded(PATIENCE);
    fleet.assert_rolled_out_exactly_once("sigstop, before SIGCONT");
    let (stored, counted) = (fleet.job_and_journal(), fleet.counters());

    a.r.signal("-CONT");
    a.r.wait_for("the refused call", PATIENCE, |l| {
        l.contains("job stopped") && l.contains("term")
    });
    // Give it time to do anything it still would.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        fleet.job_and_journal() == stored,
        "the resumed old leader wrote to the job or its journal"
    );
    assert_eq!(fleet.counters(), counted, "the resumed old leader acted");
    fleet.assert_rolled_out_exactly_once("sigstop, after SIGCONT");
    a.r.drain();
    assert!(
        a.r.seen
            .iter()
            .any(|l| l.contains("following") && l.contains("leader=b")),
        "the resumed old leader follows b"
    );
    let info = get_server(&a.addr, &a.state);
    assert_eq!(info["leader"], false, "{info}");
    assert_eq!(info["leaderReplica"], "b", "{info}");
    a.r.drain();
    assert!(
        !a.r.seen
            .iter()
            .skip_while(|l| !l.contains("stop point"))
            .any(|l| l.contains("rollout step") && l.contains("Done")),
        "the resumed old leader completed a step:\n{}",
        a.r.seen.join("\n")
    );
}
