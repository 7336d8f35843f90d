//! Operating medea, end to end with real processes (`medea sim`, `medea seed`,
//! `medea serve --rollouts` on a git checkout): `/metrics` scraped while a simulated rollout runs,
//! the webhooks of a rollout that halts on an installer failure (the first delivery answered 500
//! to see the retry), and JSON logs at debug/trace level that carry the step fields and no
//! secret.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::fixtures::serve::{Clock, Serve};
use crate::fixtures::{git, sign, wait};

const TOKEN: &str = "ops-e2e-bearer-7c41d9f0a2b8e6";
/// The webhook URL's path stands for a Slack-style secret: it must never be logged.
const HOOK_PATH: &str = "/services/T0/B0/hook-path-secret-93b1";

/// A running simulator + seeded store + daemon (`fixtures::serve`) on a git checkout, with the
/// metrics listener, JSON logs at `debug,medea=trace` (seed and serve) and a quicker clock.
struct Run {
    s: Serve,
    metrics: String,
}

impl Run {
    /// `talos`: the nodes' Talos version; `faults`: the scenario's `faults:` value (YAML);
    /// `webhook`: a URL for `--webhook`.
    fn start(talos: &str, faults: &str, webhook: Option<&str>) -> Run {
        let mut b = crate::fixtures::serve::serve()
            .clock(Clock {
                reboot: "300ms",
                image_pull: "30ms",
                pod_start: "200ms",
                pod_termination: "50ms",
            })
            .talos(talos)
            .faults(faults)
            .git()
            .metrics()
            .json_logs()
            .env("RUST_LOG", "debug,medea=trace")
            .token(TOKEN)
            .job_poll("150ms");
        if let Some(url) = webhook {
            b = b.webhook(url);
        }
        let s = b.start();
        Run {
            metrics: s.metrics.clone().expect("started with a metrics listener"),
            s,
        }
    }

    /// Wait for the server's plan, enable rollouts, commit alice's and bob's markers; returns
    /// the plan's full id.
    fn approve(&self) -> String {
        let mut plan = serde_json::Value::Null;
        wait("the first plan", Duration::from_secs(20), || {
            plan = self.s.plan_json();
            plan["id"].is_string()
        });
        assert_eq!(plan["hasChanges"], true, "{plan}");
        let id = plan["id"].as_str().unwrap().to_string();
        let short = plan["shortId"].as_str().unwrap().to_string();
        self.s.enable_rollouts();
        self.commit_markers(&id, &short);
        id
    }

    /// Commit alice's and bob's markers for plan `id` (short id `short`).
    fn commit_markers(&self, id: &str, short: &str) {
        std::fs::create_dir_all(self.s.desired.join("approvals")).unwrap();
        for who in ["alice", "bob"] {
            std::fs::write(
                self.s.desired.join(format!("approvals/{short}-{who}.sig")),
                sign(&self.s.key(who), &id),
            )
            .unwrap();
        }
        git(&self.s.desired, &["add", "approvals"]);
        git(
            &self.s.desired,
            &["commit", "-qm", &format!("approve plan {short}")],
        );
    }

    /// The newest job of cluster `home`, if any.
    fn job(&self) -> serde_json::Value {
        self.s.jobs()[0].clone()
    }

    fn serve_log(&self) -> String {
        self.s.serve_log()
    }

    fn dump(&self) -> String {
        let l = self.serve_log();
        let tail: Vec<&str> = l.lines().rev().take(40).collect();
        format!("serve.log, newest first:\n{}", tail.join("\n"))
    }
}

// ---- OpenMetrics -------------------------------------------------------------------------

#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// `GET /metrics` over plain HTTP/1.1; the parsed samples.
fn scrape(addr: &str) -> Vec<Sample> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(!head.contains("chunked"), "{head}");
    parse_openmetrics(body)
}

fn parse_openmetrics(text: &str) -> Vec<Sample> {
    assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with `# EOF`");
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("`series value`");
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("a number: {line}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), BTreeMap::new()),
            Some((name, rest)) => {
                let inner = rest.strip_suffix('}').expect("closing brace");
                let mut labels = BTreeMap::new();
                for pair in inner.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once("=\"").expect("k=\"v\"");
                    labels.insert(k.to_string(), v.trim_end_matches('"').to_string());
                }
                (name.to_string(), labels)
            }
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

/// Sum of the samples named `name` whose labels include every `(key, value)` of `with`.
fn total(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| {
            s.name == name
                && with
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

const STEP_COUNT: &str = "medea_rollout_step_duration_seconds_count";

#[test]
fn metrics_move_while_a_simulated_rollout_runs() {
    let started = Instant::now();
    let run = Run::start("v1.12.11", "[]", None);
    let before = scrape(&run.metrics);
    assert_eq!(total(&before, STEP_COUNT, &[]), 0.0, "no step ran yet");
    assert!(total(&before, "medea_plans_computed_total", &[]) >= 1.0);
    assert_eq!(total(&before, "medea_leader", &[]), 1.0);
    assert!(total(&before, "medea_desired_reload_duration_seconds_count", &[]) >= 1.0);
    // The plan waits for its approvals (a control-plane change: two people).
    assert_eq!(total(&before, "medea_plan_has_changes", &[]), 1.0);
    assert_eq!(total(&before, "medea_plan_approvals_missing", &[]), 2.0);
    assert!(total(&before, "medea_reconcile_duration_seconds_count", &[]) >= 1.0);
    assert_eq!(total(&before, "medea_rollout_cluster_halted", &[]), 0.0);
    wait(
        "an inventory refresh to be recorded",
        Duration::from_secs(60),
        || {
            total(
                &scrape(&run.metrics),
                "medea_inventory_last_refresh_timestamp_seconds",
                &[],
            ) > 1.7e9
        },
    );
    let id = run.approve();

    // Scrape while the job runs, until it succeeded.
    let mut running_counts = Vec::new();
    let mut running_gauge_seen = false;
    // Per pool: the machines of the running job and the most seen done.
    let mut nodes_seen: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let mut started_seen = false;
    let mut clock_seen = false;
    // examples/home: two Talos hops per node (v1.13.10, v1.14.6), then Kubernetes
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let job = run.job();
        let samples = scrape(&run.metrics);
        let state = job["state"].as_str().unwrap_or("").to_string();
        assert_ne!(state, "halted", "{job}\n{}", run.dump());
        if state == "succeeded" {
            break;
        }
        if state == "running" {
            // The job was running before and (below) after this scrape.
            let count = total(&samples, STEP_COUNT, &[]);
            if run.job()["state"] == "running" {
                running_counts.push(count);
                running_gauge_seen |=
                    total(&samples, "medea_rollout_jobs", &[("state", "running")]) == 1.0;
                started_seen |= total(
                    &samples,
                    "medea_rollout_job_started_timestamp_seconds",
                    &[("cluster", "home")],
                ) > 1.7e9;
                // issue #51: the job's clock, running (no window holds it)
                clock_seen |= samples
                    .iter()
                    .any(|s| s.name == "medea_rollout_job_active_seconds")
                    && total(
                        &samples,
                        "medea_rollout_job_waiting_for_window",
                        &[("cluster", "home")],
                    ) == 0.0;
                for pool in ["controlplane", "workers"] {
                    let with = [("cluster", "home"), ("pool", pool)];
                    let all = total(&samples, "medea_rollout_job_nodes", &with);
                    let done = total(&samples, "medea_rollout_job_nodes_done", &with);
                    assert!(done <= all, "{pool}: {done} of {all}");
                    let e = nodes_seen.entry(pool.to_string()).or_default();
                    e.0 = e.0.max(all);
                    e.1 = e.1.max(done);
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "the rollout did not finish in 150s\n{}",
            run.dump()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        running_counts.windows(2).all(|w| w[0] <= w[1]),
        "{running_counts:?}"
    );
    assert!(
        running_counts.windows(2).any(|w| w[0] < w[1]),
        "the step histograms moved between two scrapes of a running job: {running_counts:?}"
    );
    assert!(
        running_counts.first().is_some_and(|c| *c < 48.0),
        "the first scrape of the running job saw the rollout's first steps, not its end: {running_counts:?}"
    );
    assert!(
        running_gauge_seen,
        "medea_rollout_jobs{{state=\"running\"}} was 1 while the job ran"
    );
    assert!(
        started_seen,
        "medea_rollout_job_started_timestamp_seconds{{cluster=\"home\"}} while the job ran"
    );
    assert!(
        clock_seen,
        "medea_rollout_job_active_seconds and medea_rollout_job_waiting_for_window 0 while the job ran"
    );
    // Two Talos hops: each lists the pool's three machines, so six machine upgrades a pool.
    for pool in ["controlplane", "workers"] {
        let (all, done) = nodes_seen.get(pool).copied().unwrap_or_default();
        assert_eq!(all, 6.0, "{pool}: {nodes_seen:?}");
        assert!(done >= 1.0, "{pool}: machines done moved: {nodes_seen:?}");
    }
    let job = run.job();
    assert_eq!(job["planId"], id.as_str(), "{job}");

    // The end: every node of every pool went through every per-node step once per hop (two).
    let mut end = Vec::new();
    wait("the job gauges to settle", Duration::from_secs(10), || {
        end = scrape(&run.metrics);
        total(&end, "medea_rollout_jobs", &[("state", "succeeded")]) == 1.0
            && total(&end, "medea_rollout_jobs", &[("state", "running")]) == 0.0
    });
    for pool in ["controlplane", "workers"] {
        for step in ["pull", "cordon", "drain", "upgrade", "uncordon"] {
            let with = [("cluster", "home"), ("pool", pool), ("step", step)];
            assert_eq!(
                total(&end, STEP_COUNT, &with),
                6.0,
                "{pool}/{step}: one observation per node and hop: {:?}",
                end.iter()
                    .filter(|s| s.name == STEP_COUNT)
                    .collect::<Vec<_>>()
            );
            // every observation lands in the +Inf bucket and took some time
            assert_eq!(
                total(
                    &end,
                    "medea_rollout_step_duration_seconds_bucket",
                    &[with[0], with[1], with[2], ("le", "+Inf")]
                ),
                6.0
            );
            assert!(total(&end, "medea_rollout_step_duration_seconds_sum", &with) > 0.0);
        }
    }
    // Buckets are cumulative: each `le` holds at least the observations of the one below.
    for pool in ["controlplane", "workers"] {
        let mut buckets: Vec<(f64, f64)> = end
            .iter()
            .filter(|s| {
                s.name == "medea_rollout_step_duration_seconds_bucket"
                    && s.labels["pool"] == pool
                    && s.labels["step"] == "drain"
            })
            .map(|s| {
                let le = s.labels["le"].as_str();
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                (le, s.value)
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(buckets.len() > 10, "{buckets:?}");
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{buckets:?}");
    }
    // Kubernetes' per-node image changes.
    assert!(
        total(&end, STEP_COUNT, &[("step", "set-image")]) >= 3.0,
        "{:?}",
        end.iter()
            .filter(|s| s.name == STEP_COUNT)
            .collect::<Vec<_>>()
    );
    assert!(total(&end, "medea_plans_computed_total", &[]) >= 1.0);
    assert!(total(&end, "medea_approvals_total", &[("outcome", "approved")]) >= 2.0);
    // No running job: its series are gone; the cluster did not halt.
    for name in [
        "medea_rollout_job_started_timestamp_seconds",
        "medea_rollout_job_nodes",
    ] {
        assert!(
            !end.iter().any(|s| s.name == name),
            "{name} after the job: {:?}",
            end.iter().filter(|s| s.name == name).collect::<Vec<_>>()
        );
    }
    assert_eq!(
        total(&end, "medea_rollout_cluster_halted", &[("cluster", "home")]),
        0.0
    );
    assert_eq!(total(&end, "medea_rollout_halts_total", &[]), 0.0);
    wait(
        "the plan after the job to have no changes",
        Duration::from_secs(60),
        || {
            let now = scrape(&run.metrics);
            total(&now, "medea_plan_has_changes", &[]) == 0.0
                && total(&now, "medea_plan_approvals_missing", &[]) == 0.0
        },
    );
    for (api, method) in [
        ("talos", "LegacyUpgrade"),
        ("talos", "Version"),
        ("kubernetes", "Cordon"),
        ("kubernetes", "Drain"),
        ("kubernetes", "GetNode"),
    ] {
        let with = [("api", api), ("method", method)];
        let n = total(&end, "medea_api_call_duration_seconds_count", &with);
        assert!(
            n >= 1.0,
            "{api} {method} calls are timed: {:?}",
            end.iter()
                .filter(|s| s.name == "medea_api_call_duration_seconds_count")
                .collect::<Vec<_>>()
        );
        assert!(total(&end, "medea_api_call_duration_seconds_sum", &with) > 0.0);
    }
    assert_eq!(
        total(
            &end,
            "medea_api_call_duration_seconds_count",
            &[("api", "talos"), ("method", "LegacyUpgrade")]
        ),
        6.0,
        "one upgrade per node (MachineService.Upgrade: the nodes run Talos 1.12)"
    );

    // JSON logs: one object per line, rollout steps with their fields.
    let log = run.serve_log();
    let mut step_nodes = BTreeSet::new();
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("a JSON log line ({e}): {line}"));
        let f = &v["fields"];
        if f["message"] == "rollout step" {
            for k in ["job", "cluster", "pool", "node", "step"] {
                assert!(f[k].is_string(), "`{k}` in {line}");
            }
            assert_eq!(f["cluster"], "home");
            assert_eq!(f["job"], job["jobId"]);
            // The state by name, its text apart: no Rust Debug in the log (#39).
            let state = f["state"].as_str().unwrap_or_default();
            assert!(
                !state.is_empty() && state.chars().all(|c| c.is_ascii_lowercase()),
                "state {state:?} in {line}"
            );
            assert!(f["detail"].is_string(), "`detail` in {line}");
            if f["step"] == "upgrade" {
                step_nodes.insert((
                    f["pool"].as_str().unwrap().to_string(),
                    f["node"].as_str().unwrap().to_string(),
                ));
            }
        }
    }
    let want: BTreeSet<(String, String)> = [
        ("controlplane", "cp-1"),
        ("controlplane", "cp-2"),
        ("controlplane", "cp-3"),
        ("workers", "w-1"),
        ("workers", "w-2"),
        ("workers", "w-3"),
    ]
    .into_iter()
    .map(|(p, n)| (p.to_string(), n.to_string()))
    .collect();
    assert_eq!(step_nodes, want);
    assert_no_secret_logged(&run);
    eprintln!("metrics e2e: {:?}", started.elapsed());
}

// ---- Webhooks ----------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Delivery {
    answered: u16,
    path: String,
    content_type: String,
    body: serde_json::Value,
}

/// A webhook receiver: answers the first POST 500, every later one 200.
fn receiver() -> (String, Arc<Mutex<Vec<Delivery>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}{HOOK_PATH}", listener.local_addr().unwrap());
    let got: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let log = got.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
            let mut r = BufReader::new(conn);
            let mut request = String::new();
            if r.read_line(&mut request).is_err() {
                continue;
            }
            let mut headers = BTreeMap::new();
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                }
            }
            let len: usize = headers
                .get("content-length")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; len];
            if r.read_exact(&mut body).is_err() {
                continue;
            }
            let mut got = log.lock().unwrap();
            let answered = if got.is_empty() { 500 } else { 200 };
            let mut parts = request.split_whitespace();
            assert_eq!(parts.next(), Some("POST"), "{request}");
            got.push(Delivery {
                answered,
                path: parts.next().unwrap_or_default().to_string(),
                content_type: headers.get("content-type").cloned().unwrap_or_default(),
                body: serde_json::from_slice(&body).unwrap_or_else(|e| {
                    panic!("a JSON body ({e}): {}", String::from_utf8_lossy(&body))
                }),
            });
            drop(got);
            let mut conn = r.into_inner();
            let _ = write!(
                conn,
                "HTTP/1.1 {answered} {}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                if answered == 200 {
                    "OK"
                } else {
                    "Internal Server Error"
                }
            );
        }
    });
    (url, got)
}

#[test]
fn webhooks_announce_a_halted_rollout_in_order_after_a_retry() {
    let started = Instant::now();
    let (url, got) = receiver();
    // Nodes on Talos 1.13 upgrade through LifecycleService.Upgrade; the second worker's
    // installer exits 1 on every call: the job halts there (after `rollout.upgradeAttempts`,
    // 2, calls), after w-1 is done.
    let faults = r#"[{ node: w-2, on: { call: { method: upgrade, nth: 1 } }, effect: { upgradeExit: { code: 1, message: "disk full on /dev/sda" } } }, { node: w-2, on: { call: { method: upgrade, nth: 2 } }, effect: { upgradeExit: { code: 1, message: "disk full on /dev/sda" } } }]"#;
    let run = Run::start("v1.13.0", faults, Some(&url));
    let id = run.approve();
    let mut job = serde_json::Value::Null;
    wait("the rollout to halt", Duration::from_secs(60), || {
        job = run.job();
        assert_ne!(job["state"], "succeeded", "{job}");
        job["state"] == "halted"
    });
    // The halt in the metrics the alert rules read (deploy/prometheus/medea-rules.yml).
    wait("the halt in /metrics", Duration::from_secs(20), || {
        let m = scrape(&run.metrics);
        total(&m, "medea_rollout_cluster_halted", &[("cluster", "home")]) == 1.0
            && total(&m, "medea_rollout_halts_total", &[("cluster", "home")]) == 1.0
    });
    let m = scrape(&run.metrics);
    let halts: Vec<&Sample> = m
        .iter()
        .filter(|s| s.name == "medea_rollout_halts_total" && s.value > 0.0)
        .collect();
    assert_eq!(halts.len(), 1, "{halts:?}");
    assert!(
        !halts[0].labels["code"].is_empty(),
        "the halt's code is a label: {halts:?}"
    );
    assert!(
        !m.iter()
            .any(|s| s.name == "medea_rollout_job_started_timestamp_seconds"),
        "a halted job is not running"
    );
    let halted = |d: &Delivery| d.answered == 200 && d.body["event"] == "rollout.halted";
    wait("the halted notification", Duration::from_secs(20), || {
        got.lock().unwrap().iter().any(halted)
    });
    let got = got.lock().unwrap().clone();
    for d in &got {
        assert_eq!(d.path, HOOK_PATH);
        assert_eq!(d.content_type, "application/json");
        let text = d.body["text"].as_str().unwrap_or_default();
        assert!(text.starts_with("medea: "), "Slack `text`: {}", d.body);
        let at = d.body["at"].as_str().unwrap_or_default();
        assert!(
            at.parse::<jiff::Timestamp>().is_ok(),
            "RFC 3339 `at`: {}",
            d.body
        );
    }
    // The first delivery was refused and retried with the same body.
    assert_eq!(got[0].answered, 500);
    assert_eq!(got[1].answered, 200);
    assert_eq!(got[0].body, got[1].body, "the retry resends the event");
    let accepted: Vec<&serde_json::Value> = got
        .iter()
        .filter(|d| d.answered == 200)
        .map(|d| &d.body)
        .collect();
    let kinds: Vec<&str> = accepted
        .iter()
        .map(|b| b["event"].as_str().unwrap())
        .collect();
    let first = |k: &str| {
        kinds
            .iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("no `{k}` among {kinds:?}"))
    };
    // the plan.ready of the plan that was approved: the refresh may have announced an earlier
    // one first (the preflight observations move while the scenario's pods start)
    let approved_plan = accepted
        .iter()
        .position(|b| b["event"] == "plan.ready" && b["plan"] == id.as_str())
        .unwrap_or_else(|| panic!("no plan.ready for {id} among {kinds:?}"));
    let (plan, approval, start, halt) = (
        approved_plan,
        first("approval.received"),
        first("rollout.started"),
        first("rollout.halted"),
    );
    assert!(
        plan < approval && approval < start && start < halt,
        "in order: {kinds:?}"
    );
    // Halted is the job's last word; after it only the follow-up plan (the remaining work, a
    // new plan to approve: a halted job never resumes by itself) may be announced.
    assert!(
        kinds[halt + 1..].iter().all(|k| *k == "plan.ready"),
        "halted is the last rollout event: {kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| k.starts_with("rollout.")).last(),
        Some(&"rollout.halted"),
        "{kinds:?}"
    );
    assert_eq!(kinds[0], "plan.ready");
    assert_eq!(accepted[plan]["plan"], id.as_str());
    let approvers: BTreeSet<&str> = accepted
        .iter()
        .filter(|b| b["event"] == "approval.received")
        .map(|b| {
            assert_eq!(b["plan"], id.as_str());
            b["text"].as_str().unwrap()
        })
        .collect();
    assert!(
        approvers.iter().any(|t| t.contains("alice@example.com"))
            && approvers.iter().any(|t| t.contains("bob@example.com")),
        "{approvers:?}"
    );
    let s = accepted[start];
    assert_eq!(s["job"], job["jobId"]);
    assert_eq!(s["cluster"], "home");
    assert_eq!(s["plan"], id.as_str());
    // The nodes before the faulty one were announced done, between start and halt.
    let done: Vec<&str> = accepted[start..halt]
        .iter()
        .filter(|b| b["event"] == "rollout.node_done")
        .map(|b| b["node"].as_str().unwrap())
        .collect();
    assert!(done.contains(&"w-1"), "{kinds:?} {done:?}");
    assert!(!done.contains(&"w-2"), "{done:?}");
    let h = accepted[halt];
    assert_eq!(h["job"], job["jobId"], "{h}");
    assert_eq!(h["cluster"], "home");
    assert_eq!(h["plan"], id.as_str());
    assert_eq!(h["node"], "w-2", "{h}");
    let reason = h["reason"].as_str().unwrap();
    assert!(reason.contains("disk full on /dev/sda"), "{reason}");
    assert_eq!(job["haltReason"].as_str(), Some(reason), "{job}");
    assert_eq!(h["haltCode"], "upgrade_refused", "{h}");
    assert_eq!(job["haltCode"], "upgrade_refused", "{job}");
    let text = h["text"].as_str().unwrap();
    assert!(
        text.contains("HALTED") && text.contains("w-2") && text.contains(reason),
        "{text}"
    );
    assert_no_secret_logged(&run);
    eprintln!("webhook e2e: {:?}", started.elapsed());
}

// ---- Secrets -----------------------------------------------------------------------------

/// Every secret the run handled, none of which may appear in a log.
fn secrets(run: &Run) -> Vec<(String, String)> {
    let mut out = vec![
        ("API bearer token".to_string(), TOKEN.to_string()),
        ("webhook URL path".into(), "hook-path-secret-93b1".into()),
    ];
    fn pem(out: &mut Vec<(String, String)>, what: &str, pem_text: &str) {
        for line in pem_text.lines() {
            let line = line.trim();
            if !line.starts_with("-----") && line.len() >= 16 {
                out.push((format!("{what} (PEM body line)"), line.to_string()));
            }
        }
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let talosconfig = std::fs::read_to_string(run.s.dir.join("sim/talosconfig")).unwrap();
    let kubeconfig = std::fs::read_to_string(run.s.dir.join("sim/kubeconfig")).unwrap();
    let mut embedded = Vec::new();
    for (file, text, fields) in [
        ("talosconfig", &talosconfig, &["ca:", "crt:", "key:"][..]),
        (
            "kubeconfig",
            &kubeconfig,
            &[
                "certificate-authority-data:",
                "client-certificate-data:",
                "client-key-data:",
            ][..],
        ),
    ] {
        for line in text.lines() {
            let line = line.trim();
            for f in fields {
                if let Some(v) = line.strip_prefix(f) {
                    let v = v.trim().trim_matches('"');
                    embedded.push((format!("{file} {f} (base64)"), v.to_string()));
                    let decoded = String::from_utf8(b64.decode(v).unwrap()).unwrap();
                    pem(&mut out, &format!("{file} {f}"), &decoded);
                }
            }
        }
    }
    assert!(
        embedded
            .iter()
            .any(|(w, _)| w == "talosconfig key: (base64)"),
        "the talosconfig has a client key: {talosconfig}"
    );
    let kube_token = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:"))
        .expect("the simulator's kubeconfig has a bearer token")
        .trim()
        .to_string();
    out.push(("kubeconfig token".into(), kube_token));
    for (w, v) in embedded {
        out.push((w, v));
    }
    for who in ["alice", "bob"] {
        pem(
            &mut out,
            &format!("{who}'s ssh private key"),
            &std::fs::read_to_string(run.s.dir.join(who)).unwrap(),
        );
    }
    // The server's generated TLS keys.
    for e in std::fs::read_dir(run.s.state.join("tls")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "key") {
            pem(
                &mut out,
                &format!("server TLS key {}", p.display()),
                &std::fs::read_to_string(&p).unwrap(),
            );
        }
    }
    out
}

fn assert_no_secret_logged(run: &Run) {
    let secrets = secrets(run);
    assert!(secrets.len() > 10, "{secrets:?}");
    let mut logs: Vec<(PathBuf, String)> = Vec::new();
    for f in ["serve.log", "seed.log"] {
        let p = run.s.dir.join(f);
        logs.push((p.clone(), std::fs::read_to_string(&p).unwrap()));
    }
    let serve = &logs[0].1;
    // RUST_LOG really reached debug, medea's and its libraries' (TLS handshakes, HTTP/2
    // frames, kube requests): the check looks at verbose output.
    for target in ["medea::", "h2::", "rustls::", "kube_client::"] {
        assert!(
            serve.lines().any(|l| l.contains("\"level\":\"DEBUG\"")
                && l.contains(&format!("\"target\":\"{target}"))),
            "debug logs of {target} in serve.log"
        );
    }
    for (path, text) in &logs {
        for (what, secret) in &secrets {
            assert!(
                !text.contains(secret.as_str()),
                "{what} appears in {}",
                path.display()
            );
        }
        for marker in ["PRIVATE KEY", "-----BEGIN"] {
            assert!(
                !text.contains(marker),
                "`{marker}` appears in {}",
                path.display()
            );
        }
    }
}

/// An approved plan whose cluster has rollouts off is said to wait at INFO once, not on every
/// reconcile pass (each inventory refresh starts one).
#[test]
fn an_approved_plan_waiting_for_a_gate_is_logged_once_not_on_every_pass() {
    let run = Run::start("v1.12.11", "[]", None);
    let mut plan = serde_json::Value::Null;
    wait("the first plan", Duration::from_secs(20), || {
        plan = run.s.plan_json();
        plan["id"].is_string()
    });
    run.commit_markers(
        plan["id"].as_str().unwrap(),
        plan["shortId"].as_str().unwrap(),
    );
    let waiting = |log: &str| {
        log.lines()
            .filter(|l| l.contains("plan approved, waiting for a gate") && l.contains("\"INFO\""))
            .count()
    };
    wait(
        "the plan to wait for its gate",
        Duration::from_secs(60),
        || waiting(&run.serve_log()) >= 1,
    );
    // a pass runs on every change: three new commits that leave the plan as it is
    let passes = |m: &[Sample]| total(m, "medea_reconcile_duration_seconds_count", &[]);
    for k in 0..3 {
        let before = passes(&scrape(&run.metrics));
        git(
            &run.s.desired,
            &[
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                &format!("unrelated {k}"),
            ],
        );
        wait("a reconcile pass", Duration::from_secs(120), || {
            passes(&scrape(&run.metrics)) > before
        });
    }
    assert_eq!(
        run.s.plan_json()["id"],
        plan["id"],
        "the commits change nothing"
    );
    assert_eq!(waiting(&run.serve_log()), 1, "{}", run.dump());
    assert_eq!(
        run.s.jobs(),
        serde_json::json!([]),
        "rollouts are off: no job"
    );
}

#[test]
fn the_openmetrics_parser_reads_labels_and_values() {
    let s = parse_openmetrics(
        "# TYPE medea_x counter\nmedea_x_total{a=\"1\",b=\"two\"} 3\nmedea_y 0.5\n# EOF\n",
    );
    assert_eq!(total(&s, "medea_x_total", &[("b", "two")]), 3.0);
    assert_eq!(total(&s, "medea_x_total", &[("b", "one")]), 0.0);
    assert_eq!(total(&s, "medea_y", &[]), 0.5);
}

/// #39 items 5 and 6, end to end: a job outside its maintenance window says what it waits for;
/// following it replays its journal from its start before following; the halt's output names a
/// command that runs as printed; a halted job's status and the next plan say what follows.
#[test]
fn a_waiting_job_says_why_following_it_starts_at_its_start_and_a_halt_says_what_follows() {
    use std::process::Stdio;
    // A window that opens half a day from now.
    let hour = (jiff::Timestamp::now()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .hour()
        + 12)
        % 24;
    let s = crate::fixtures::serve::serve()
        .desired_edit(
            "home/cluster.yaml",
            "spec:\n",
            &format!(
                "spec:\n  maintenanceWindows:\n    - {{ start: \"0 {hour} * * *\", duration: 1h, timeZone: UTC }}\n"
            ),
        )
        .start();
    let mut plan = serde_json::Value::Null;
    wait("the first plan", Duration::from_secs(30), || {
        plan = s.plan_json();
        plan["hasChanges"] == true
    });
    let (id, short) = (
        plan["id"].as_str().unwrap().to_string(),
        plan["shortId"].as_str().unwrap().to_string(),
    );
    s.enable_rollouts();
    std::fs::create_dir_all(s.desired.join("approvals")).unwrap();
    for who in ["alice", "bob"] {
        std::fs::write(
            s.desired.join(format!("approvals/{short}-{who}.sig")),
            sign(&s.key(who), &id),
        )
        .unwrap();
    }
    // What it waits for, in `rollout status` (the only cluster: no --cluster needed).
    let mut status = String::new();
    wait(
        "the job to say it waits for its window",
        Duration::from_secs(60),
        || {
            let out = s.cli().args(["rollout", "status"]).output().unwrap();
            status = String::from_utf8_lossy(&out.stdout).into_owned();
            status.contains("waiting: outside the maintenance windows; the next opens at")
        },
    );
    assert!(status.contains("(since "), "{status}");
    let job = s.jobs()[0]["jobId"].as_str().unwrap().to_string();

    // Following it starts at its start: the journal's lines, then what it waits for.
    let mut child = s
        .cli()
        .args(["rollout", "status", &job, "-w"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        let waiting = line.contains("waiting: outside the maintenance windows");
        lines.push(line);
        if waiting {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        lines[0].contains(&format!("home  job created from plan {short}")),
        "{lines:#?}"
    );
    assert!(
        lines.last().unwrap().contains("waiting: outside"),
        "{lines:#?}"
    );

    // The halt names the command that follows the job to its stop; it runs as printed.
    let out = s
        .cli()
        .args(["rollout", "halt", &job, "--reason", "the window is too far"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let follow = said
        .lines()
        .find_map(|l| l.strip_prefix("Follow it to its stop: "))
        .unwrap_or_else(|| panic!("no follow command in {said}"));
    let args: Vec<&str> = follow.split_whitespace().collect();
    assert_eq!(args[0], "medea", "{follow}");
    let out = s.cli().args(&args[1..]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "a halted job: {text}");
    assert!(
        text.contains("HALTED: ") && text.contains("the window is too far"),
        "{text}"
    );
    assert!(
        text.contains("next: a halted job never continues by itself"),
        "{text}"
    );
    // Issue #52 item 1: the follower waits for the plan after the halt and prints that one,
    // never the plan computed while the job ran ("job … is rolling out").
    assert!(!text.contains("is rolling out"), "{text}");
    assert!(
        text.contains("The server's current plan continues from what is left")
            && text.contains("needs 2 approvals (has 0)"),
        "{text}"
    );
    // The next plan says which job halted and that it continues from what is left.
    let mut stderr = String::new();
    wait(
        "the next plan to name the halted job",
        Duration::from_secs(30),
        || {
            let out = s.cli().args(["plan"]).output().unwrap();
            stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            // the halted job is named at once; the plan after it once the refresh the halt
            // kicked is in (no plan from the observation taken mid-job)
            stderr.contains(&format!(
                "job {job} of cluster home halted (operator_request)"
            )) && !stderr.contains("(stale)")
        },
    );
    assert!(
        stderr.contains("this plan continues from what it left"),
        "{stderr}"
    );
    let out = s.cli().args(["rollout", "status", &job]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("The server's current plan continues from what is left")
            && text.contains("needs 2 approvals (has 0)")
            && text.contains("Approve with: medea approve"),
        "{text}"
    );
    // The job halted before its first command, so nothing else moved: the continuation is a
    // plan of its own all the same (not the consumed one), and approving it starts a new job.
    let next = s.plan_json();
    let (next_id, next_short) = (
        next["id"].as_str().unwrap().to_string(),
        next["shortId"].as_str().unwrap().to_string(),
    );
    assert_ne!(next_id, id, "{next}");
    assert_eq!(next["basis"]["halted"]["home"], job.as_str(), "{next}");
    for who in ["alice", "bob"] {
        std::fs::write(
            s.desired.join(format!("approvals/{next_short}-{who}.sig")),
            sign(&s.key(who), &next_id),
        )
        .unwrap();
    }
    wait(
        "the continuation to start a job",
        Duration::from_secs(60),
        || s.jobs()[0]["planId"] == next_id.as_str(),
    );
}
