//! `medea serve --rollouts` replicas driving a rollout on the simulator: the leader is lost
//! mid-rollout (crash points, kill -9, a freeze) and every node still upgrades exactly once.

use super::*;

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

/// How long a wait on the rollout tolerates nothing moving: no line from the replica, no write
/// to the job or its journal, no call reaching (or refused by) a simulated node, no request to
/// the simulated kube-apiserver. A loaded machine makes the rollout slow, not still: a wait
/// fails on a stall, not on a fixed wall-clock patience (issue #34 item 8).
const STALL: Duration = Duration::from_secs(60);
/// A wait that keeps moving without reaching its goal still ends: a six-node rollout that is
/// still polling after this long is stuck in a loop, not slow.
const CAP: Duration = Duration::from_secs(600);
/// How often a wait reads the progress (a scan of the job and its journal in etcd).
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// What moves while a rollout makes progress; a wait compares two of them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Progress {
    /// The job record and its journal entries, and their total size.
    journal: (usize, usize),
    /// Calls that reached or were refused by a simulated node, and boots, over all nodes.
    talos: u64,
    /// Requests to the simulated kube-apiserver.
    kube: u64,
}

/// A wait that passes while something moved within [`STALL`] and [`CAP`] has not passed.
struct Watch {
    started: Instant,
    moved: Instant,
    read: Instant,
    last: Progress,
}

impl Watch {
    fn new(fleet: &SimFleet) -> Watch {
        let now = Instant::now();
        Watch {
            started: now,
            moved: now,
            read: now,
            last: fleet.progress(),
        }
    }

    /// `Err` saying what stalled once nothing moved for [`STALL`], or the wait passed
    /// [`CAP`]; `printed` says whether the replica printed a line since the last check.
    fn check(&mut self, fleet: &SimFleet, printed: bool) -> Result<(), String> {
        let now = Instant::now();
        if printed {
            self.moved = now;
        }
        if now.duration_since(self.read) >= PROGRESS_EVERY {
            self.read = now;
            let p = fleet.progress();
            if p != self.last {
                self.last = p;
                self.moved = now;
            }
        }
        if now.duration_since(self.moved) > STALL {
            return Err(format!(
                "nothing moved for {STALL:?} (last progress {:?})",
                self.last
            ));
        }
        if now.duration_since(self.started) > CAP {
            return Err(format!(
                "still not done after {CAP:?} of progress (last progress {:?})",
                self.last
            ));
        }
        Ok(())
    }
}

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

    /// What has moved so far (see [`Progress`]).
    fn progress(&self) -> Progress {
        let stored = self.job_and_journal();
        let talos = self
            .sim
            .names
            .iter()
            .filter_map(|n| self.sim.talos.counters(n))
            .map(|c| c.calls.values().sum::<u64>() + c.refused.values().sum::<u64>() + c.boots)
            .sum();
        Progress {
            journal: (stored.len(), stored.iter().map(|(_, v)| v.len()).sum()),
            talos,
            kube: self.sim.kube.counters().requests,
        }
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

    /// Wait for the job to succeed (any halt fails the test), as long as the rollout moves.
    fn wait_succeeded(&self) {
        use medea::rollout::sequencer::JobState;
        let mut watch = Watch::new(self);
        loop {
            if let Some(job) = self.job() {
                match &job.state {
                    JobState::Succeeded { .. } => return,
                    JobState::Halted { reason, .. } => panic!("the job halted: {reason}"),
                    JobState::Running => {}
                }
            }
            let moving = watch.check(self, false);
            assert!(
                moving.is_ok(),
                "the job did not succeed: {}: {:?}",
                moving.unwrap_err(),
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

    /// Wait for the process to exit by itself; when it did (polled every 10ms). The wait lasts
    /// as long as something moves (a line printed, the journal, the simulator: [`Watch`]), so a
    /// loaded machine that makes the replica slow does not fail the test while it is working.
    fn wait_exit(&mut self, fleet: &SimFleet) -> (Instant, std::process::ExitStatus) {
        let mut watch = Watch::new(fleet);
        loop {
            if let Some(st) = self.r.child.try_wait().unwrap() {
                return (Instant::now(), st);
            }
            let mut printed = false;
            while let Ok((_, line)) = self.r.lines.try_recv() {
                self.r.seen.push(line);
                printed = true;
            }
            if let Err(why) = watch.check(fleet, printed) {
                self.r.drain();
                panic!(
                    "replica {} did not exit: {why}; it printed:\n{}",
                    self.r.name,
                    self.r.seen.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The first line from now on that satisfies `pred`, and when it arrived; waits as long
    /// as something moves ([`Watch`]).
    fn wait_line(
        &mut self,
        fleet: &SimFleet,
        what: &str,
        pred: impl Fn(&str) -> bool,
    ) -> (Instant, String) {
        let mut watch = Watch::new(fleet);
        loop {
            let mut printed = false;
            while let Ok((at, line)) = self.r.lines.try_recv() {
                self.r.seen.push(line.clone());
                if pred(&line) {
                    return (at, line);
                }
                printed = true;
            }
            if let Err(why) = watch.check(fleet, printed) {
                panic!(
                    "replica {} did not print {what}: {why}; it printed:\n{}",
                    self.r.name,
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
            let (at, status) = a.wait_exit(&fleet);
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
            let mut watch = Watch::new(&fleet);
            while fleet.total_upgrades() < n {
                let moving = watch.check(&fleet, false);
                assert!(
                    moving.is_ok(),
                    "{label}: {n} upgrades: {}",
                    moving.unwrap_err()
                );
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
    fleet.wait_succeeded();
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
    let (stopped_at, _) = a.wait_line(&fleet, "the stop point", |l| {
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
    fleet.wait_succeeded();
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
