//! Blocking hooks (issue #35 item 2), on the simulator through the real adapters and medea's
//! own probes (`health::Probes`, as `medea serve` and `__rollout-run` use them), against an
//! HTTP(S) receiver started here on loopback:
//!
//! - every point runs in order around the nodes and waves (`beforeJob`, `beforeWave`,
//!   `beforeNode` before the cordon, `afterNode` after the uncordon, `afterWave`,
//!   `afterJob`), each event naming the job, pool, node, wave, point and attempt; the
//!   credential's token arrives as a bearer header over https and is in no journal entry;
//! - a hook that never answers 2xx is retried until its timeout, then halts `hook_failed`
//!   naming it and its point; after an `afterNode` hook the node is left uncordoned;
//! - Job hooks run as `batch/v1` Jobs on the simulator's Job controller, with medea's
//!   environment; a Job whose pod exits non-zero halts with its exit code and log tail
//!   journaled;
//! - the crash harness: killed before or after every journal write and restarted, a hook that
//!   is not idempotent never runs twice (the job halts `hook_interrupted` when its result was
//!   lost), an idempotent one runs once more.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use medea::desired::hook_policy::HookPolicy;
use medea::desired::hooks::{Hook, HookAction, Hooks};
use medea::health::Probes;
use medea::health::http::Credentials;
use medea::plan::Step;
use medea::plan::health::HealthSources;
use medea::rollout::executor::ExecutorConfig;
use medea::rollout::fake::MemStore;
use medea::rollout::journal::{Entry, JournalEntry};
use medea::rollout::sequencer::{Action, CommandOp, HaltCode};
use medea::rollout::{Executor, RunOutcome, SystemClock};
use medea::sim::kube::KubeSimConfig;
use medea::store::{Store, StoreExt};
use serde_json::Value;

use crate::rollout::{install, plan};
use crate::rollout_sim::{Sim, adapters};

const TOKEN: &str = "hook-s3cret-token-8d2f";

/// What a receiver got: each request's head (lowercased) and its JSON body.
#[derive(Debug, Clone)]
struct Got {
    head: String,
    event: Value,
}

type Answer = Arc<dyn Fn(&Value) -> u16 + Send + Sync>;

/// A hook receiver on loopback: records every request and answers the status `answer`
/// gives for its event. Over TLS with its own CA (returned as PEM) when `tls`.
struct Receiver {
    url: String,
    ca_pem: Option<String>,
    got: Arc<Mutex<Vec<Got>>>,
}

impl Receiver {
    fn events(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }
    /// `point hook node` of every request, in order.
    fn calls(&self) -> Vec<String> {
        self.events()
            .iter()
            .map(|g| {
                format!(
                    "{} {} {}",
                    g.event["point"].as_str().unwrap(),
                    g.event["hook"].as_str().unwrap(),
                    g.event["node"]
                        .as_str()
                        .map(str::to_string)
                        .or_else(|| g.event["wave"].as_u64().map(|w| format!("wave-{w}")))
                        .unwrap_or_else(|| "job".into())
                )
            })
            .collect()
    }
    fn count(&self, hook: &str) -> usize {
        self.events()
            .iter()
            .filter(|g| g.event["hook"] == hook)
            .count()
    }
}

fn complete(buf: &[u8]) -> Option<(String, Vec<u8>)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    (buf.len() >= end + 4 + len).then(|| (head, buf[end + 4..end + 4 + len].to_vec()))
}

async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    answer: Answer,
    got: Arc<Mutex<Vec<Got>>>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head, body) = loop {
        let n = match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        if let Some(r) = complete(&buf) {
            break r;
        }
    };
    let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let status = answer(&event);
    got.lock().unwrap().push(Got { head, event });
    let reply = format!("HTTP/1.1 {status} X\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
    let _ = s.write_all(reply.as_bytes()).await;
    let _ = s.shutdown().await;
}

async fn receiver(tls: bool, answer: Answer) -> Receiver {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got: Arc<Mutex<Vec<Got>>> = Arc::default();
    let shared = got.clone();
    if !tls {
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(serve(tcp, answer.clone(), shared.clone()));
            }
        });
        return Receiver {
            url: format!("http://{addr}/medea/hook"),
            ca_pem: None,
            got,
        };
    }
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let ca_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name.push(DnType::CommonName, "hook CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &rcgen::Issuer::new(ca, ca_key))
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, answer, shared) = (acceptor.clone(), answer.clone(), shared.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    serve(tls, answer, shared).await;
                }
            });
        }
    });
    Receiver {
        url: format!("https://{addr}/medea/hook"),
        ca_pem: Some(ca_pem),
        got,
    }
}

fn http_hook(
    name: &str,
    url: &str,
    credential: Option<&str>,
    timeout: Duration,
    idem: bool,
) -> Hook {
    Hook {
        name: name.into(),
        timeout,
        idempotent: idem,
        action: HookAction::Http {
            url: url.into(),
            credential: credential.map(str::to_string),
        },
    }
}

fn config(dir: &Path) -> ExecutorConfig {
    let mut cfg = ExecutorConfig::new(true, dir.join("snapshots"));
    cfg.poll = Duration::from_millis(20);
    cfg.backoff_min = Duration::from_millis(20);
    cfg.backoff_max = Duration::from_millis(160);
    cfg.max_sleep = Duration::from_secs(1);
    // the server's Job-hook policy (issue #49): this file's Job hooks run in `default`
    cfg.hook_policy = HookPolicy {
        namespaces: ["default".to_string()].into(),
        ..HookPolicy::default()
    };
    cfg
}

/// The journal of every job in `store`, in write order.
fn journal(store: &dyn Store) -> Vec<JournalEntry> {
    let mut all: Vec<JournalEntry> = store
        .scan_records::<JournalEntry>("")
        .unwrap()
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    all.sort_by_key(|e| e.seq);
    all
}

/// Index of the first entry that is an intent (`result: false`) or a result of `op` on
/// `node`, with `hook` when it is a hook.
fn position(
    j: &[JournalEntry],
    result: bool,
    op: CommandOp,
    node: &str,
    hook: Option<&str>,
) -> usize {
    j.iter()
        .position(|e| match &e.entry {
            Entry::Intent { key, action } if !result => {
                key.op == op
                    && key.node.as_deref() == Some(node)
                    && hook.is_none_or(
                        |h| matches!(action, Action::Hook { hook, .. } if hook.name == h),
                    )
            }
            Entry::Result { key, .. } if result => {
                key.op == op && key.node.as_deref() == Some(node) && hook.is_none()
            }
            _ => false,
        })
        .unwrap_or_else(|| {
            panic!(
                "no {op} {} of {node} in the journal",
                if result { "result" } else { "intent" }
            )
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_run_at_their_points_in_order_with_the_token_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    let rx = receiver(true, Arc::new(|_| 200)).await;
    // the server's credential for the hooks: <creds>/<cluster>/hooks/ops/{token,ca.pem}
    let hooks_dir = sim.creds.join(crate::rollout::CLUSTER).join("hooks");
    medea::private_file::write_private(
        &hooks_dir.join("ops").join("token"),
        TOKEN.as_bytes(),
        medea::private_file::ExistingDir::Keep,
    )
    .unwrap();
    std::fs::write(
        hooks_dir.join("ops").join("ca.pem"),
        rx.ca_pem.as_ref().unwrap(),
    )
    .unwrap();
    let t = Duration::from_secs(30);
    let h = |name: &str| http_hook(name, &rx.url, Some("ops"), t, false);
    let mut step = sim.step("workers", &[&["w-1"], &["w-2"]], 1, (30, 120));
    if let Step::Talos(s) = &mut step {
        s.hooks = Some(Box::new(Hooks {
            before_wave: vec![h("wave-in")],
            before_node: vec![h("noout"), h("notify")],
            after_node: vec![h("unset-noout")],
            after_wave: vec![h("wave-out")],
            ..Hooks::default()
        }));
    }
    let mut p = plan(&sim.observed(), vec![step], 41);
    Arc::make_mut(&mut p.clusters[0]).hooks = Some(Hooks {
        before_job: vec![h("job-in")],
        after_job: vec![h("job-out")],
        ..Hooks::default()
    });
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let obs = sim.observed();
    let job = install(store.as_ref(), &p, &obs, &[]).unwrap();
    let (talos, kube) = adapters(&sim).await;
    let exec = Executor::new(store.clone(), talos, kube, SystemClock, config(dir.path()))
        .with_probe(
            Probes::new(HealthSources::default())
                .with_hook_credentials(Credentials::Dir(hooks_dir)),
        );
    let out = tokio::time::timeout(Duration::from_secs(120), exec.run(&job))
        .await
        .expect("the job ends within its timeouts")
        .unwrap();
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    assert_eq!(
        rx.calls(),
        [
            "beforeJob job-in job",
            "beforeWave wave-in wave-1",
            "beforeNode noout w-1",
            "beforeNode notify w-1",
            "afterNode unset-noout w-1",
            "afterWave wave-out wave-1",
            "beforeWave wave-in wave-2",
            "beforeNode noout w-2",
            "beforeNode notify w-2",
            "afterNode unset-noout w-2",
            "afterWave wave-out wave-2",
            "afterJob job-out job",
        ]
    );
    for g in rx.events() {
        assert!(
            g.head.contains(&format!(
                "authorization: bearer {}\r\n",
                TOKEN.to_ascii_lowercase()
            )),
            "the token arrives as a bearer header: {}",
            g.head
        );
        assert!(g.head.starts_with("post /medea/hook "), "{}", g.head);
        assert_eq!(g.event["jobId"], job.to_string());
        assert_eq!(g.event["cluster"], crate::rollout::CLUSTER);
        assert_eq!(g.event["attempt"], 1);
        assert!(
            g.event["runId"]
                .as_str()
                .unwrap()
                .starts_with("medea-hook-")
        );
    }
    let e = &rx.events()[2].event;
    assert_eq!(
        (e["pool"].as_str(), e["wave"].as_u64()),
        (Some("workers"), Some(1))
    );
    // the journal: the node's hooks before its cordon, after its uncordon
    let j = journal(store.as_ref());
    for node in ["w-1", "w-2"] {
        let before = position(&j, true, CommandOp::Hook, node, None);
        assert!(
            position(&j, false, CommandOp::Hook, node, Some("notify"))
                < position(&j, false, CommandOp::Cordon, node, None),
            "{node}: beforeNode hooks before the cordon"
        );
        assert!(before < position(&j, false, CommandOp::Cordon, node, None));
        assert!(
            position(&j, true, CommandOp::Uncordon, node, None)
                < position(&j, false, CommandOp::Hook, node, Some("unset-noout")),
            "{node}: afterNode hooks after the uncordon"
        );
    }
    // the token is never journaled
    let text = serde_json::to_string(&j).unwrap();
    assert!(!text.contains(TOKEN));
    assert!(text.contains("unset-noout"), "hooks are journaled by name");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_after_node_hook_halts_naming_it_and_leaves_the_node_uncordoned() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    let rx = receiver(
        false,
        Arc::new(|e: &Value| if e["hook"] == "unset-noout" { 503 } else { 200 }),
    )
    .await;
    let mut step = sim.step("workers", &[&["w-1"], &["w-2"]], 1, (30, 120));
    if let Step::Talos(s) = &mut step {
        s.hooks = Some(Box::new(Hooks {
            before_node: vec![http_hook(
                "noout",
                &rx.url,
                None,
                Duration::from_secs(30),
                false,
            )],
            after_node: vec![http_hook(
                "unset-noout",
                &rx.url,
                None,
                Duration::from_secs(3),
                true,
            )],
            ..Hooks::default()
        }));
    }
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let obs = sim.observed();
    let job = install(store.as_ref(), &plan(&obs, vec![step], 42), &obs, &[]).unwrap();
    let (talos, kube) = adapters(&sim).await;
    let exec = Executor::new(store.clone(), talos, kube, SystemClock, config(dir.path()))
        .with_probe(Probes::new(HealthSources::default()));
    let out = tokio::time::timeout(Duration::from_secs(120), exec.run(&job))
        .await
        .expect("the job ends within its timeouts")
        .unwrap();
    let RunOutcome::Halted { reason, node, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(reason.code(), HaltCode::HookFailed, "{reason}");
    assert_eq!(node.as_deref(), Some("w-1"));
    let text = reason.to_string();
    for part in ["`unset-noout`", "afterNode", "w-1", "HTTP 503", "stays"] {
        assert!(text.contains(part), "{part} in {text}");
    }
    assert!(
        rx.count("unset-noout") >= 2,
        "retried until its timeout: {:?}",
        rx.calls()
    );
    // w-1 is upgraded, back and uncordoned; w-2 was never touched
    assert_eq!(sim.upgrades("w-1"), 1);
    assert!(!sim.cordoned("w-1"));
    assert_eq!(sim.upgrades("w-2"), 0);
    assert!(!sim.cordoned("w-2"));
    assert_eq!(rx.count("noout"), 1);
}

/// The crash harness over hooks: a child `medea __rollout-run --creds-dir …` killed after
/// (`MEDEA_CRASH_AT`) or before (`MEDEA_CRASH_BEFORE`) journal write `n`, then restarted. A
/// `beforeNode` hook that is not idempotent runs at most once in all; when the crash lost its
/// result, the restarted job halts `hook_interrupted` naming it. An `afterNode` hook that is
/// idempotent runs once more only when the crash lost its result. Returns the journal points.
fn crash_harness(var: &str) -> u64 {
    use medea::rollout::sequencer::JobState;
    use std::os::unix::process::ExitStatusExt;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut interrupted = 0;
    let mut rerun = 0;
    for n in 1u64.. {
        let rx = rt.block_on(receiver(false, Arc::new(|_| 200)));
        let dir = crate::rollout::crash::scratch();
        let sim = rt.block_on(Sim::start(dir.path(), 1, 1, KubeSimConfig::default()));
        let mut step = sim.step("workers", &[&["w-1"]], 1, (5, 60));
        if let Step::Talos(s) = &mut step {
            s.hooks = Some(Box::new(Hooks {
                before_node: vec![http_hook(
                    "noout",
                    &rx.url,
                    None,
                    Duration::from_secs(20),
                    false,
                )],
                after_node: vec![http_hook(
                    "unset-noout",
                    &rx.url,
                    None,
                    Duration::from_secs(20),
                    true,
                )],
                ..Hooks::default()
            }));
        }
        let store = medea::store::fjall::FjallStore::open(&dir.path().join("store")).unwrap();
        let obs = sim.observed();
        let salt = u8::try_from(n).expect("fewer than 256 journal points");
        let job = install(&store, &plan(&obs, vec![step], salt), &obs, &[]).unwrap();
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
        let read_job = || {
            let store = medea::store::fjall::FjallStore::open(&dir.path().join("store")).unwrap();
            let mut j: medea::rollout::sequencer::Job = store
                .get_record(&medea::rollout::journal::job_key(&job))
                .unwrap()
                .unwrap();
            medea::rollout::journal::replay(&mut j, |key| store.get_record(key)).unwrap();
            j
        };
        let first = child().env(var, n.to_string()).output().unwrap();
        let what = format!("{var}={n}");
        if first.status.success() {
            assert!(n > 1, "the rollout has journal points");
            assert_eq!(
                (rx.count("noout"), rx.count("unset-noout")),
                (1, 1),
                "{what}"
            );
            assert!(
                interrupted > 0,
                "{var}: some crash lost a non-idempotent hook's result"
            );
            assert!(
                rerun > 0,
                "{var}: some crash lost an idempotent hook's result"
            );
            eprintln!("{var}: {} journal points", n - 1);
            return n - 1;
        }
        assert_eq!(
            first.status.signal(),
            Some(6),
            "{what}: the child must die by abort: {}",
            String::from_utf8_lossy(&first.stderr)
        );
        let crashed = read_job();
        let in_flight = crashed.in_flight.as_ref().and_then(|i| match &i.action {
            Action::Hook { hook, .. } => Some(hook.name.clone()),
            _ => None,
        });
        let before = (rx.count("noout"), rx.count("unset-noout"));
        let again = child().output().unwrap();
        let after = (rx.count("noout"), rx.count("unset-noout"));
        let j = read_job();
        for out in [&first, &again] {
            let logs = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!logs.contains("authorization"), "{what}: {logs}");
        }
        assert!(
            after.0 <= 1,
            "{what}: a non-idempotent hook never runs twice"
        );
        match in_flight.as_deref() {
            Some("noout") => {
                interrupted += 1;
                let JobState::Halted { reason, node, .. } = &j.state else {
                    panic!("{what}: {:?}", j.state)
                };
                assert_eq!(reason.code(), HaltCode::HookInterrupted, "{what}: {reason}");
                assert_eq!(node.as_deref(), Some("w-1"));
                assert!(reason.to_string().contains("`noout`"), "{reason}");
                assert_eq!(after.0, before.0, "{what}: not run again");
                assert_eq!(sim.upgrades("w-1"), 0, "{what}: nothing after the hook");
                assert!(!sim.cordoned("w-1"), "{what}");
            }
            Some("unset-noout") => {
                rerun += 1;
                assert!(
                    matches!(j.state, JobState::Succeeded { .. }),
                    "{what}: {:?}",
                    j.state
                );
                assert_eq!(
                    after.1,
                    before.1 + 1,
                    "{what}: an idempotent hook runs once more"
                );
                assert!(after.1 <= 2, "{what}");
                assert_eq!(
                    j.hook_runs.values().map(|r| r.attempts).max(),
                    Some(2),
                    "{what}"
                );
                assert_eq!(sim.upgrades("w-1"), 1, "{what}");
            }
            _ => {
                assert!(
                    again.status.success(),
                    "{what}: the restarted child failed: {:?} {}{}",
                    j.state,
                    String::from_utf8_lossy(&again.stdout),
                    String::from_utf8_lossy(&again.stderr)
                );
                assert!(
                    matches!(j.state, JobState::Succeeded { .. }),
                    "{what}: {:?}",
                    j.state
                );
                assert_eq!(after, (1, 1), "{what}: each hook ran once");
                assert_eq!(sim.upgrades("w-1"), 1, "{what}");
                assert!(!sim.cordoned("w-1"), "{what}");
            }
        }
        drop(sim);
    }
    unreachable!()
}

#[test]
fn killed_after_every_journal_write_a_hook_never_runs_twice_unless_idempotent() {
    let points = crash_harness("MEDEA_CRASH_AT");
    assert!(points >= 10, "{points}");
}

#[test]
fn killed_before_every_journal_write_a_hook_never_runs_twice_unless_idempotent() {
    let points = crash_harness("MEDEA_CRASH_BEFORE");
    assert!(points >= 10, "{points}");
}

/// A digest-pinned image (the server's hook policy refuses tags; the simulator pulls nothing).
const PINNED_CEPH: &str = "docker.io/rook/ceph:v1.17.5@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn job_hook(name: &str) -> Hook {
    Hook {
        name: name.into(),
        timeout: Duration::from_secs(30),
        idempotent: false,
        action: HookAction::Job {
            namespace: "default".into(),
            pod_spec: serde_json::json!({
                "containers": [{
                    "name": "ceph",
                    "image": PINNED_CEPH,
                    "command": ["ceph", "osd", "set", "noout"],
                    "env": [{"name": "CEPH_ARGS", "value": "--id admin"}],
                }]
            }),
            ttl_seconds_after_finished: medea::desired::hooks::DEFAULT_HOOK_JOB_TTL_SECS,
        },
    }
}

/// The hook results of a journal: (hook name, report).
fn hook_results(j: &[JournalEntry]) -> Vec<(String, medea::rollout::sequencer::HookReport)> {
    let mut names = std::collections::BTreeMap::new();
    let mut out = Vec::new();
    for e in j {
        match &e.entry {
            Entry::Intent {
                key,
                action: Action::Hook { hook, .. },
            } => {
                names.insert(key.clone(), hook.name.clone());
            }
            Entry::Result {
                key,
                outcome: medea::rollout::sequencer::CommandOutcome::Hook { report },
            } => out.push((names[key].clone(), report.clone())),
            _ => {}
        }
    }
    out
}

/// Job hooks on the simulator's Job controller (kubernetes `job_controller.go`, as `sim35`
/// models it): `beforeNode` and `afterNode` Jobs run to `Complete` around the node, in the
/// cluster, with medea's environment; their exit code and log tail are journaled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_hooks_run_as_kubernetes_jobs_around_each_node() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    let mut step = sim.step("workers", &[&["w-1"]], 1, (30, 60));
    if let Step::Talos(s) = &mut step {
        s.hooks = Some(Box::new(Hooks {
            before_node: vec![job_hook("ceph-noout")],
            after_node: vec![job_hook("ceph-unset-noout")],
            ..Hooks::default()
        }));
    }
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let obs = sim.observed();
    let job = install(store.as_ref(), &plan(&obs, vec![step], 44), &obs, &[]).unwrap();
    let (talos, kube) = adapters(&sim).await;
    let exec = Executor::new(store.clone(), talos, kube, SystemClock, config(dir.path()))
        .with_probe(Probes::new(HealthSources::default()));
    let out = tokio::time::timeout(Duration::from_secs(120), exec.run(&job))
        .await
        .expect("the job ends within its timeouts")
        .unwrap();
    assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
    let j = journal(store.as_ref());
    let results = hook_results(&j);
    assert_eq!(
        results.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["ceph-noout", "ceph-unset-noout"]
    );
    for ((name, r), point) in results.iter().zip(["beforeNode", "afterNode"]) {
        assert!(r.succeeded, "{name}: {r:?}");
        assert_eq!(r.exit_code, Some(0), "{name}: {r:?}");
        assert!(r.detail.contains("complete"), "{name}: {r:?}");
        let log = r.log_tail.as_deref().unwrap_or_default();
        for env in [
            "MEDEA_NODE=w-1".to_string(),
            format!("MEDEA_HOOK_POINT={point}"),
            format!("MEDEA_JOB_ID={job}"),
            "CEPH_ARGS=--id admin".to_string(),
        ] {
            assert!(log.contains(&env), "{name}: {env} in {log}");
        }
    }
    assert!(
        position(&j, false, CommandOp::Hook, "w-1", Some("ceph-noout"))
            < position(&j, false, CommandOp::Cordon, "w-1", None)
    );
    assert!(
        position(&j, true, CommandOp::Uncordon, "w-1", None)
            < position(&j, false, CommandOp::Hook, "w-1", Some("ceph-unset-noout"))
    );
    // the log tail is in the journal's notes, for `rollout status` and the dashboard
    assert!(
        j.iter()
            .flat_map(|e| &e.notes)
            .any(|n| n.contains("`ceph-noout`")
                && n.contains("log tail")
                && n.contains("MEDEA_NODE=w-1")),
        "{:#?}",
        j.iter().flat_map(|e| &e.notes).collect::<Vec<_>>()
    );
    assert_eq!(sim.upgrades("w-1"), 1);
    assert!(!sim.cordoned("w-1"));
}

/// A Job hook whose pod exits 3 (the simulator's `JobPodExit` fault on the hook's Job name)
/// fails its Job (`backoffLimit: 0`): the job halts `hook_failed` before the cordon, naming
/// the hook, its point and the exit code, with the pod's log tail journaled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_job_hook_halts_with_its_log_tail_journaled() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    let mut step = sim.step("workers", &[&["w-1"]], 1, (30, 60));
    if let Step::Talos(s) = &mut step {
        s.hooks = Some(Box::new(Hooks {
            before_node: vec![job_hook("ceph-noout")],
            ..Hooks::default()
        }));
    }
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let obs = sim.observed();
    let job = install(store.as_ref(), &plan(&obs, vec![step], 45), &obs, &[]).unwrap();
    sim.kube.inject(medea::sim::kube::KubeFault::JobPodExit {
        namespace: "default".into(),
        job_prefix: medea::rollout::sequencer::hook_run_id(&job, "0/beforeNode/w-1/ceph-noout"),
        exit_code: 3,
    });
    let (talos, kube) = adapters(&sim).await;
    let exec = Executor::new(store.clone(), talos, kube, SystemClock, config(dir.path()))
        .with_probe(Probes::new(HealthSources::default()));
    let out = tokio::time::timeout(Duration::from_secs(60), exec.run(&job))
        .await
        .expect("the job ends within its timeouts")
        .unwrap();
    let RunOutcome::Halted { reason, node, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(reason.code(), HaltCode::HookFailed, "{reason}");
    assert_eq!(node.as_deref(), Some("w-1"));
    let text = reason.to_string();
    for part in ["`ceph-noout`", "beforeNode", "exit code 3", "failed"] {
        assert!(text.contains(part), "{part} in {text}");
    }
    let j = journal(store.as_ref());
    let results = hook_results(&j);
    assert_eq!(results.len(), 1);
    let r = &results[0].1;
    assert_eq!((r.succeeded, r.exit_code), (false, Some(3)), "{r:?}");
    assert!(
        r.log_tail
            .as_deref()
            .unwrap_or_default()
            .contains("exited with code 3"),
        "{r:?}"
    );
    assert!(!sim.cordoned("w-1"), "nothing was cordoned");
    assert_eq!(sim.upgrades("w-1"), 0);
}

/// An attempt made again (an idempotent Job hook after a restart) finds the Job the first
/// attempt created, by its name, and reports it: the cluster holds one Job and one pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_hook_run_again_finds_the_same_job() {
    use k8s_openapi::api::batch::v1::Job as KubeJob;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, ListParams};
    use medea::rollout::ports::{HookRequest, KubePort as _};
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
    let (_, kube) = adapters(&sim).await;
    let req = HookRequest {
        cluster: crate::rollout::CLUSTER.into(),
        job: "abc123-prod".into(),
        run_id: "medea-hook-00112233aabbccdd".into(),
        point: medea::desired::hooks::HookPoint::AfterNode,
        pool: Some("workers".into()),
        node: Some("w-1".into()),
        wave: Some(1),
        attempt: 1,
        hook: Hook {
            idempotent: true,
            ..job_hook("ceph-unset-noout")
        },
    };
    let first = kube.run_job_hook(&req).await;
    assert!(first.succeeded, "{first:?}");
    let again = kube
        .run_job_hook(&HookRequest {
            attempt: 2,
            ..req.clone()
        })
        .await;
    assert!(again.succeeded, "{again:?}");
    assert_eq!(again.exit_code, Some(0));
    let kubeconfig = sim.creds.join(crate::rollout::CLUSTER).join("kubeconfig");
    let client =
        kube::Client::try_from(medea::k8s::kubeconfig::load(&kubeconfig).await.unwrap()).unwrap();
    let jobs: Api<KubeJob> = Api::namespaced(client.clone(), "default");
    let listed = jobs
        .list(&ListParams::default().labels("medea.dev/hook=ceph-unset-noout"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1, "one Job, never two");
    let j = &listed.items[0];
    assert_eq!(
        j.metadata.name.as_deref(),
        Some("medea-hook-00112233aabbccdd")
    );
    let labels = j.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("medea.dev/job").map(String::as_str),
        Some("abc123-prod")
    );
    assert_eq!(
        labels.get("medea.dev/hook-point").map(String::as_str),
        Some("afterNode")
    );
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let listed = pods
        .list(&ListParams::default().labels("job-name=medea-hook-00112233aabbccdd"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1, "one pod: the Job ran once");
}

/// The server's Job-hook policy is checked again right before the Job is created (issue #49
/// item 6, defence in depth): a plan carrying a privileged Job hook (made offline, or before
/// the server's policy changed) halts `hook_failed` naming the refusal and the flag that
/// would allow it, and the cluster holds no Job; under a policy that allows privileged
/// containers the same hook runs. Before, the Job was created with medea's credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_hook_the_server_policy_refuses_halts_before_any_job_is_created() {
    use k8s_openapi::api::batch::v1::Job as KubeJob;
    use kube::api::{Api, ListParams};
    let privileged = || {
        let mut h = job_hook("ceph-noout");
        if let HookAction::Job { pod_spec, .. } = &mut h.action {
            pod_spec["containers"][0]["securityContext"] = serde_json::json!({"privileged": true});
        }
        h
    };
    for allow in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let sim = Sim::start(dir.path(), 1, 1, KubeSimConfig::default()).await;
        let mut step = sim.step("workers", &[&["w-1"]], 1, (30, 60));
        if let Step::Talos(s) = &mut step {
            s.hooks = Some(Box::new(Hooks {
                before_node: vec![privileged()],
                ..Hooks::default()
            }));
        }
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let obs = sim.observed();
        let job = install(store.as_ref(), &plan(&obs, vec![step], 46), &obs, &[]).unwrap();
        let (talos, kube) = adapters(&sim).await;
        let mut cfg = config(dir.path());
        cfg.hook_policy.allow_privileged = allow;
        let exec = Executor::new(store.clone(), talos, kube, SystemClock, cfg)
            .with_probe(Probes::new(HealthSources::default()));
        let out = tokio::time::timeout(Duration::from_secs(120), exec.run(&job))
            .await
            .expect("the job ends within its timeouts")
            .unwrap();
        let kubeconfig = sim.creds.join(crate::rollout::CLUSTER).join("kubeconfig");
        let client =
            kube::Client::try_from(medea::k8s::kubeconfig::load(&kubeconfig).await.unwrap())
                .unwrap();
        let jobs: Api<KubeJob> = Api::namespaced(client, "default");
        let listed = jobs
            .list(&ListParams::default().labels("medea.dev/hook=ceph-noout"))
            .await
            .unwrap();
        if allow {
            assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
            assert_eq!(listed.items.len(), 1, "the allowed hook ran as a Job");
            assert_eq!(sim.upgrades("w-1"), 1);
            continue;
        }
        let RunOutcome::Halted { reason, node, .. } = &out else {
            panic!("{out:?}")
        };
        assert_eq!(reason.code(), HaltCode::HookFailed, "{reason}");
        assert_eq!(node.as_deref(), Some("w-1"));
        let results = hook_results(&journal(store.as_ref()));
        assert_eq!(results.len(), 1, "{results:?}");
        let detail = &results[0].1.detail;
        for part in [
            "refused by this server's Job hook policy",
            "container `ceph` is privileged",
            "containers[0].securityContext.privileged",
            "--hook-allow-privileged",
        ] {
            assert!(detail.contains(part), "{part} in {detail}");
        }
        assert!(
            listed.items.is_empty(),
            "no Job was created: {:?}",
            listed.items
        );
        assert!(!sim.cordoned("w-1"), "nothing was cordoned");
        assert_eq!(sim.upgrades("w-1"), 0);
    }
}
