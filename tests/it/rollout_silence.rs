//! Silences as a lease (issue #35 item 1), on the simulator through the real adapters with a
//! real Alertmanager (the Debian binary, started here on loopback) and medea's own probes
//! (`health::Probes`, as `medea serve` and `__rollout-run` use them):
//!
//! - the silence exists while the node is away (asked from Alertmanager while the node is held
//!   rebooting), covers the alerts its matchers select about that node and no other, and is
//!   expired once the node is back and uncordoned;
//! - an alert outside the silence still fails the gate and halts the job;
//! - a silence Alertmanager refuses halts before the cordon (`silence_refused`), or, with
//!   `onError: proceed`, the node goes on unsilenced;
//! - killed at every journal point and restarted, a job leaves at most one silence of the node
//!   at any time, whose end is within its lease, and never creates a second one.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use medea::health::Probes;
use medea::plan::Step;
use medea::plan::health::{
    Endpoint, Gate, GateCheck, HealthPolicy, HealthSources, OnFailure, SilenceOnError,
    SilencePolicy,
};
use medea::rollout::executor::ExecutorConfig;
use medea::rollout::fake::MemStore;
use medea::rollout::sequencer::{GatePoint, HaltCode};
use medea::rollout::{Executor, RunOutcome, SystemClock};
use medea::sim::kube::KubeSimConfig;
use medea::sim::talos::{Power, RebootTiming};
use medea::store::Store;
use serde_json::Value;

use crate::health_servers::{AlertmanagerServer, http};
use crate::rollout::{install, plan};
use crate::rollout_sim::{Sim, adapters};

const LEASE: Duration = Duration::from_secs(60);

fn am_endpoint(url: &str) -> Endpoint {
    Endpoint {
        url: url.to_string(),
        credential: None,
    }
}

fn silence_policy(url: &str, on_error: SilenceOnError) -> SilencePolicy {
    SilencePolicy {
        alertmanager: am_endpoint(url),
        matchers: vec![r#"alertname=~"NodeDown|TargetDown""#.into()],
        node_label: "instance".into(),
        lease: LEASE,
        max_duration: Duration::from_secs(600),
        on_error,
    }
}

fn alerts_gate(url: &str) -> HealthPolicy {
    HealthPolicy {
        sources: HealthSources {
            prometheus: None,
            alertmanager: Some(am_endpoint(url)),
        },
        gates: vec![Gate {
            name: "no-critical-alerts".into(),
            dry_run: false,
            consecutive_error_limit: medea::plan::health::DEFAULT_CONSECUTIVE_ERROR_LIMIT,
            on_inconclusive: Default::default(),
            check: GateCheck::Alerts {
                matchers: vec![r#"severity="critical""#.into()],
                ignore: vec![],
                skip_operator_silences: false,
            },
        }],
        soak: Duration::ZERO,
        interval: Duration::from_secs(1),
        failure_limit: 1,
        inconclusive_limit: 1,
        on_failure: OnFailure::Halt,
    }
}

fn config(dir: &Path) -> ExecutorConfig {
    let mut cfg = ExecutorConfig::new(true, dir.join("snapshots"));
    cfg.poll = Duration::from_millis(20);
    cfg.backoff_min = Duration::from_millis(20);
    cfg.backoff_max = Duration::from_millis(160);
    cfg.max_sleep = Duration::from_secs(1);
    cfg
}

/// Every silence Alertmanager holds.
async fn silences(am: &str) -> Vec<Value> {
    let (status, body) = http(&format!("{am}/api/v2/silences"), "GET", None, None)
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// medea's silences whose comment names `job`.
async fn medea_silences(am: &str, job: &str) -> Vec<Value> {
    silences(am)
        .await
        .into_iter()
        .filter(|s| s["createdBy"] == "medea" && s["comment"].as_str().unwrap().contains(job))
        .collect()
}

fn state(s: &Value) -> &str {
    s["status"]["state"].as_str().unwrap()
}

fn ends_at(s: &Value) -> jiff::Timestamp {
    s["endsAt"].as_str().unwrap().parse().unwrap()
}

/// Wait (on the node's progress, bounded by the job's own timeouts) until `node` is rebooting.
async fn until_rebooting(sim: &Sim, node: &str, run: &tokio::task::JoinHandle<RunOutcome>) {
    loop {
        assert!(!run.is_finished(), "the job ended before {node} rebooted");
        if sim.talos.node_state(node).unwrap().power == Power::Rebooting {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_silenced_while_away_and_an_alert_outside_the_silence_still_halts() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start_timed(
        dir.path(),
        1,
        2,
        KubeSimConfig::default(),
        crate::rollout::FROM,
        |t| t.reboot = RebootTiming::Manual,
    )
    .await;
    crate::fixtures::require_tool("prometheus-alertmanager");
    let am = AlertmanagerServer::start()
        .await
        .expect("prometheus-alertmanager is installed");
    let mut step = sim.step("workers", &[&["w-1"], &["w-2"]], 1, (30, 120));
    if let Step::Talos(t) = &mut step {
        t.health = Some(alerts_gate(&am.url));
        t.silence = Some(Box::new(silence_policy(&am.url, SilenceOnError::Halt)));
    }
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let obs = sim.observed();
    let job = install(store.as_ref(), &plan(&obs, vec![step], 21), &obs, &[]).unwrap();
    let (talos, kube) = adapters(&sim).await;
    let exec = Executor::new(store.clone(), talos, kube, SystemClock, config(dir.path()))
        .with_probe(Probes::new(HealthSources::default()));
    let id = job.clone();
    let run = tokio::spawn(async move { exec.run(&id).await.unwrap() });

    // while w-1 is away: one active silence of medea's, for w-1, within its lease
    until_rebooting(&sim, "w-1", &run).await;
    let now = jiff::Timestamp::now();
    let ours = medea_silences(&am.url, &job.to_string()).await;
    assert_eq!(ours.len(), 1, "{ours:#?}");
    let s = &ours[0];
    assert_eq!(state(s), "active", "{s:#}");
    let comment = s["comment"].as_str().unwrap();
    assert!(
        comment.contains("w-1") && comment.contains("medea"),
        "{comment}"
    );
    assert!(
        ends_at(s)
            <= now + jiff::SignedDuration::try_from(LEASE + Duration::from_secs(31)).unwrap(),
        "the lease (plus the drain timeout) bounds it: {s:#}"
    );
    let matchers = s["matchers"].as_array().unwrap();
    assert!(
        matchers.iter().any(|m| m["name"] == "instance"
            && m["value"] == "w-1(:[0-9]+)?"
            && m["isRegex"] == true)
    );
    assert!(matchers.iter().any(|m| m["name"] == "alertname"
        && m["value"] == "NodeDown|TargetDown"
        && m["isRegex"] == true));
    assert!(
        !sim.talos
            .node_state("w-2")
            .unwrap()
            .power
            .eq(&Power::Rebooting)
    );
    let sid = s["id"].as_str().unwrap().to_string();

    // the node's expected alert is silenced by it; one outside the matchers, or about
    // another node, is not
    let expected = [
        ("alertname", "NodeDown"),
        ("instance", "w-1:9100"),
        ("severity", "critical"),
    ];
    let outside = [
        ("alertname", "CephDown"),
        ("instance", "w-1:9100"),
        ("severity", "critical"),
    ];
    let other_node = [
        ("alertname", "NodeDown"),
        ("instance", "w-2:9100"),
        ("severity", "warning"),
    ];
    am.fire(&expected).await;
    am.fire(&outside).await;
    am.fire(&other_node).await;
    let (_, body) = http(&format!("{}/api/v2/alerts", am.url), "GET", None, None)
        .await
        .unwrap();
    let alerts: Vec<Value> = serde_json::from_str(&body).unwrap();
    let by_name = |name: &str, instance: &str| {
        alerts
            .iter()
            .find(|a| a["labels"]["alertname"] == name && a["labels"]["instance"] == instance)
            .unwrap_or_else(|| panic!("{name} {instance} in {alerts:#?}"))
            .clone()
    };
    let a = by_name("NodeDown", "w-1:9100");
    assert_eq!(a["status"]["silencedBy"], serde_json::json!([sid]), "{a:#}");
    for (n, i) in [("CephDown", "w-1:9100"), ("NodeDown", "w-2:9100")] {
        let a = by_name(n, i);
        assert_eq!(a["status"]["silencedBy"], serde_json::json!([]), "{a:#}");
    }

    // the node comes back, its own alert resolves; the one outside the silence stays
    am.resolve(&expected).await;
    sim.talos.complete_boot("w-1").unwrap();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the job ends within its timeouts")
        .unwrap();
    let RunOutcome::Halted { reason, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(reason.code(), HaltCode::GateFailed, "{reason}");
    let f = reason.gate_failure().unwrap();
    assert_eq!(f.point, GatePoint::AfterWave { step: 0, wave: 0 });
    assert_eq!(f.samples.len(), 1, "{f:?}");
    assert_eq!(f.samples[0].labels["alertname"], "CephDown");
    // w-1 back and uncordoned, its silence expired; w-2 never touched
    assert!(!sim.cordoned("w-1"));
    assert_eq!(
        sim.talos.node_state("w-1").unwrap().running.to_string(),
        crate::rollout::TO
    );
    let ours = medea_silences(&am.url, &job.to_string()).await;
    assert_eq!(ours.len(), 1, "never a second silence: {ours:#?}");
    assert_eq!(state(&ours[0]), "expired", "{:#}", ours[0]);
    assert_eq!(sim.upgrades("w-2"), 0);
    assert!(!sim.cordoned("w-2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_silence_halts_before_the_cordon_or_with_proceed_goes_on_unsilenced() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    // nothing listens here: Alertmanager cannot be asked
    let nowhere = format!("http://127.0.0.1:{}", crate::fixtures::free_port());
    for (salt, on_error) in [(31, SilenceOnError::Halt), (32, SilenceOnError::Proceed)] {
        let mut step = sim.step("workers", &[&["w-1"]], 1, (30, 60));
        if let Step::Talos(t) = &mut step {
            t.silence = Some(Box::new(silence_policy(&nowhere, on_error)));
        }
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let obs = sim.observed();
        let job = install(store.as_ref(), &plan(&obs, vec![step], salt), &obs, &[]).unwrap();
        let (talos, kube) = adapters(&sim).await;
        let exec = Executor::new(store.clone(), talos, kube, SystemClock, config(dir.path()))
            .with_probe(Probes::new(HealthSources::default()));
        let out = tokio::time::timeout(Duration::from_secs(60), exec.run(&job))
            .await
            .expect("within the job's timeouts")
            .unwrap();
        match on_error {
            SilenceOnError::Halt => {
                let RunOutcome::Halted { reason, node, .. } = &out else {
                    panic!("{out:?}")
                };
                assert_eq!(reason.code(), HaltCode::SilenceRefused, "{reason}");
                assert_eq!(node.as_deref(), Some("w-1"));
                assert!(reason.to_string().contains("not cordoned"), "{reason}");
                assert!(!sim.cordoned("w-1"), "nothing cordoned");
                assert_eq!(sim.upgrades("w-1"), 0);
            }
            SilenceOnError::Proceed => {
                assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
                assert_eq!(sim.upgrades("w-1"), 1);
                assert!(!sim.cordoned("w-1"));
            }
        }
    }
}

/// The crash harness over a silenced node: a child `medea __rollout-run --creds-dir …`
/// (medea's own probes, as `medea serve`'s) killed after (`MEDEA_CRASH_AT`) or before
/// (`MEDEA_CRASH_BEFORE`) journal write `n`, then restarted. After the kill, Alertmanager holds
/// at most one live silence of the node, ending within its lease (and the drain's timeout,
/// which a renewal before the drain covers); after the restart the node is upgraded once and
/// uncordoned, and the job made exactly one silence, expired.
fn crash_harness(var: &str) -> u64 {
    use std::os::unix::process::ExitStatusExt;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    crate::fixtures::require_tool("prometheus-alertmanager");
    let am = rt
        .block_on(AlertmanagerServer::start())
        .expect("prometheus-alertmanager is installed");
    let drain = Duration::from_secs(5);
    let bound = LEASE + drain + Duration::from_secs(5);
    for n in 1u64.. {
        let dir = crate::rollout::crash::scratch();
        let sim = rt.block_on(Sim::start(dir.path(), 1, 1, KubeSimConfig::default()));
        let mut step = sim.step("workers", &[&["w-1"]], 1, (drain.as_secs(), 60));
        if let Step::Talos(t) = &mut step {
            t.silence = Some(Box::new(silence_policy(&am.url, SilenceOnError::Halt)));
        }
        let store = medea::store::fjall::FjallStore::open(&dir.path().join("store")).unwrap();
        let obs = sim.observed();
        let salt = u8::try_from(n).expect("fewer than 256 journal points");
        let job = install(&store, &plan(&obs, vec![step], salt), &obs, &[])
            .unwrap()
            .to_string();
        drop(store);
        let child = || {
            let mut c = crate::cli::medea();
            c.arg("__rollout-run")
                .arg("--rollouts")
                .arg("--store")
                .arg(dir.path().join("store"))
                .arg("--creds-dir")
                .arg(&sim.creds)
                .arg("--cluster")
                .arg(crate::rollout::CLUSTER)
                .arg("--snapshots")
                .arg(dir.path().join("snapshots"))
                .arg("--poll-ms")
                .arg("10")
                .env_remove("MEDEA_CRASH_AT")
                .env_remove("MEDEA_CRASH_AFTER")
                .env_remove("MEDEA_CRASH_BEFORE");
            c
        };
        let first = child().env(var, n.to_string()).output().unwrap();
        let what = format!("{var}={n}");
        if first.status.success() {
            assert!(n > 1, "the rollout has journal points");
            // the silence's own journal points were among those crossed
            use medea::rollout::journal::{Entry, JournalEntry};
            use medea::rollout::sequencer::CommandOp;
            use medea::store::StoreExt;
            let store = medea::store::fjall::FjallStore::open(&dir.path().join("store")).unwrap();
            let entries = store.scan_records::<JournalEntry>("").unwrap();
            for op in [CommandOp::Silence, CommandOp::Unsilence] {
                assert!(
                    entries.iter().any(
                        |(_, e)| matches!(&e.entry, Entry::Intent { key, .. } if key.op == op)
                    ),
                    "{op} journaled"
                );
                assert!(
                    entries.iter().any(
                        |(_, e)| matches!(&e.entry, Entry::Result { key, .. } if key.op == op)
                    ),
                    "{op} journaled"
                );
            }
            eprintln!("{var}: {} journal points", n - 1);
            return n - 1;
        }
        assert_eq!(
            first.status.signal(),
            Some(6),
            "{what}: the child must die by abort: {}",
            String::from_utf8_lossy(&first.stderr)
        );
        let now = jiff::Timestamp::now();
        let live: Vec<Value> = rt
            .block_on(medea_silences(&am.url, &job))
            .into_iter()
            .filter(|s| state(s) != "expired")
            .collect();
        assert!(live.len() <= 1, "{what}: {live:#?}");
        for s in &live {
            assert!(
                ends_at(s) <= now + jiff::SignedDuration::try_from(bound).unwrap(),
                "{what}: a silence longer than its lease: {s:#}"
            );
        }
        let again = child().output().unwrap();
        assert!(
            again.status.success(),
            "{what}: the restarted child failed: {}\n{}",
            String::from_utf8_lossy(&again.stdout),
            String::from_utf8_lossy(&again.stderr)
        );
        assert_eq!(sim.upgrades("w-1"), 1, "{what}");
        assert!(!sim.cordoned("w-1"), "{what}");
        let ours = rt.block_on(medea_silences(&am.url, &job));
        assert_eq!(ours.len(), 1, "{what}: one silence, never two: {ours:#?}");
        assert_eq!(state(&ours[0]), "expired", "{what}: {:#}", ours[0]);
        drop(sim);
    }
    unreachable!()
}

#[test]
fn killed_after_every_journal_write_a_node_has_one_silence_within_its_lease() {
    let points = crash_harness("MEDEA_CRASH_AT");
    assert!(points >= 10, "{points}");
}

#[test]
fn killed_before_every_journal_write_a_node_has_one_silence_within_its_lease() {
    let points = crash_harness("MEDEA_CRASH_BEFORE");
    assert!(points >= 10, "{points}");
}
