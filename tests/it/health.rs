//! Health gates in the desired state and the plan (issue #23): validation with located
//! diagnostics, effective per-pool policies, and how plans show them. The probes against real
//! Prometheus/Alertmanager servers are in `health_probes.rs`.
//!
//! Snapshots: `EXPECTORATE=overwrite cargo test --all-features --test it health::` and review.

use std::path::{Path, PathBuf};

use medea::desired::{self, Source, diagnostic::codes};
use medea::plan::health::{GateCheck, OnFailure, WorkloadKind};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

const CLUSTER: &str = "apiVersion: medea/v1alpha1
kind: Cluster
metadata:
  name: c1
spec:
  kubernetes:
    version: v1.35.0
";

fn pool(name: &str, machines: &str, extra: &str) -> String {
    format!(
        "apiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: {name}\nspec:\n  cluster: c1\n  role: worker\n  machines: [{machines}]\n  talos:\n    version: v1.13.9\n{extra}"
    )
}

const HEALTH: &str = r#"  health:
    prometheus: { url: "http://127.0.0.1:9090/" }
    alertmanager: { url: "https://alertmanager.monitoring:9093", credential: alertmanager }
    gates:
      - name: ingress-errors
        query: 'sum(rate(nginx_ingress_controller_requests{status=~"5.."}[2m])) < 1'
      - name: ceph-healthy
        query: 'ceph_health_status == 0'
      - name: no-critical-alerts
        alerts: { matchers: ['severity="critical"'], ignore: ['alertname="KubeNodeUnreachable"'] }
      - name: workloads
        workloads: { namespaces: [default, ingress], kinds: [Deployment, StatefulSet, DaemonSet] }
    soak: 5m
    interval: 30s
    failureLimit: 2
    silence:
      matchers: ['alertname=~"KubeNodeNotReady|KubeNodeUnreachable|TargetDown"']
      nodeLabel: instance
      lease: 3m
"#;

fn load(dir: &Path) -> desired::Loaded {
    desired::load(&Source::Dir(dir.to_path_buf())).unwrap()
}

#[test]
fn the_issue_example_validates_and_pools_override_it() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write(d, "c.yaml", &format!("{CLUSTER}{HEALTH}"));
    write(
        d,
        "p.yaml",
        &format!(
            "{}---\n{}---\n{}",
            pool("inherits", "w-1", ""),
            pool(
                "overrides",
                "w-2",
                "  onFailure: rollback\n  health:\n    gates:\n      - name: ceph\n        query: 'ceph_health_status == bool 0'\n    soak: 10m\n"
            ),
            pool("ungated", "w-3", "  health:\n    gates: []\n"),
        ),
    );
    let loaded = load(d);
    assert!(!loaded.has_errors(), "{:#?}", loaded.diagnostics);
    let c = &loaded.valid().unwrap().clusters["c1"];
    assert_eq!(c.health.gates.len(), 4);
    assert_eq!(c.health.soak.as_secs(), 300);
    assert_eq!(c.health.failure_limit, 2);
    assert_eq!(
        c.health.prometheus.as_ref().unwrap().url,
        "http://127.0.0.1:9090",
        "the trailing slash is dropped"
    );
    assert_eq!(c.pools["inherits"].health, c.health);

    let p = medea::plan::health::HealthPolicy::of(&c.pools["overrides"].health).unwrap();
    assert_eq!(p.gates.len(), 1);
    assert!(matches!(&p.gates[0].check, GateCheck::Query { query } if query.contains("bool")));
    assert_eq!(p.soak.as_secs(), 600, "the pool's soak");
    assert_eq!(p.interval.as_secs(), 30, "the cluster's interval");
    assert_eq!(p.failure_limit, 2, "the cluster's failure limit");
    assert_eq!(p.on_failure, OnFailure::Rollback);
    assert_eq!(
        p.sources
            .alertmanager
            .as_ref()
            .unwrap()
            .credential
            .as_deref(),
        Some("alertmanager"),
        "the sources are the cluster's"
    );
    assert!(
        medea::plan::health::HealthPolicy::of(&c.pools["ungated"].health).is_none(),
        "`gates: []` turns gates off for a pool"
    );
    let cp = medea::plan::health::HealthPolicy::of(&c.health).unwrap();
    assert_eq!(cp.on_failure, OnFailure::Halt);
    assert!(matches!(
        &cp.gates[3].check,
        GateCheck::Workloads { kinds, .. } if kinds == &[WorkloadKind::Deployment, WorkloadKind::StatefulSet, WorkloadKind::DaemonSet]
    ));
}

/// Every problem of a health block is reported at once, each at its own line and column.
#[test]
fn health_errors_are_located() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let cluster = format!(
        "{CLUSTER}{}",
        r#"  health:
    prometheus: { url: "prometheus:9090", caFile: certs/ca.pem }
    alertmanager: { url: "http://am:9093", bearerTokenFile: /etc/medea/token, credential: am }
    gates:
      - name: up
        query: 'up'
      - name: broken
        query: 'sum(rate(x[2m]) <'
      - name: up
        query: 'up == 1'
      - name: two
        query: 'up == 1'
        workloads: { namespaces: [default] }
      - name: none
      - name: alerts
        alerts: { matchers: ['severity=critical'], ignore: ['alertname=~"(x"'] }
      - name: Bad_Name
        workloads: { namespaces: [default, default], kinds: [] }
      - name: scalar
        query: '1 < bool 2'
    interval: 10m
    soak: 5m
    failureLimit: 0
    inconclusiveLimit: 0
"#
    );
    write(d, "c.yaml", &cluster);
    write(
        d,
        "p.yaml",
        &format!(
            "{}---\n{}",
            pool(
                "p1",
                "w-1",
                "  onFailure: rollback\n  health:\n    gates: []\n    soak: 1m\n"
            ),
            pool("p2", "w-2", "  onFailure: sideways\n"),
        ),
    );
    let loaded = load(d);
    let got: Vec<(String, usize, usize, &str, &str)> = loaded
        .diagnostics
        .iter()
        .map(|x| {
            (
                x.origin.file.clone(),
                x.origin.line,
                x.origin.column,
                x.code,
                x.message.as_str(),
            )
        })
        .collect();
    let has = |line: usize, code: &str, needle: &str| {
        assert!(
            got.iter().any(|(f, l, _, c, m)| f == "c.yaml"
                && *l == line
                && *c == code
                && m.contains(needle)),
            "no {code} at c.yaml:{line} containing {needle:?} in {got:#?}"
        );
    };
    has(9, codes::HEALTH, "is not an http:// or https:// URL");
    // Issue 32: a path to a secret is no longer accepted; the error says what to write.
    has(
        9,
        codes::HEALTH,
        "`health.prometheus.caFile` is no longer accepted: the repository may not choose which file medea reads or sends",
    );
    has(
        10,
        codes::HEALTH,
        "`health.alertmanager.bearerTokenFile` is no longer accepted",
    );
    let help = loaded
        .diagnostics
        .iter()
        .find(|x| x.message.contains("bearerTokenFile"))
        .and_then(|x| x.help.clone())
        .unwrap_or_default();
    assert!(
        help.contains("write `credential: <name>` instead")
            && help.contains("as `token`, in `<creds-dir>/<cluster>/health/<name>/`"),
        "{help}"
    );
    // An error, no longer a warning: a credential over plain http.
    has(
        10,
        codes::HEALTH,
        "`health.alertmanager.credential` is set but the URL is plain http://",
    );
    has(
        13,
        codes::HEALTH,
        "top-level expression is a series selector",
    );
    has(15, codes::HEALTH, "does not parse");
    has(16, codes::HEALTH, "gate `up` is defined twice");
    has(20, codes::HEALTH, "has 2 checks (query, workloads)");
    has(21, codes::HEALTH, "gate `none` has no check");
    has(23, codes::HEALTH, "the value must be double-quoted");
    has(23, codes::HEALTH, "regular expression does not compile");
    has(
        24,
        codes::HEALTH,
        "gate name `Bad_Name` is not a valid name",
    );
    has(25, codes::HEALTH, "namespace `default` is listed twice");
    has(25, codes::HEALTH, "checks no kind");
    has(27, codes::HEALTH, "returns a scalar");
    has(28, codes::HEALTH, "longer than `health.soak`");
    has(
        30,
        codes::HEALTH,
        "`health.failureLimit` must be at least 1",
    );
    has(
        31,
        codes::HEALTH,
        "`health.inconclusiveLimit` must be at least 1",
    );
    // The pool: soak without gates; an onFailure that is not halt or rollback.
    assert!(got.iter().any(|(f, _, _, c, m)| f == "p.yaml"
        && *c == codes::HEALTH
        && m.contains("`health.soak` is 1m but there are no gates")));
    assert!(got.iter().any(|(f, _, _, c, m)| f == "p.yaml"
        && *c == codes::INVALID_VALUE
        && m.contains("sideways")));
    assert!(loaded.valid().is_none());

    // And as `medea validate` prints them.
    let out = crate::cli::medea()
        .env("NO_COLOR", "1")
        .args(["validate", "."])
        .current_dir(d)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = format!(
        "$ medea validate .\n--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .replace(&d.to_string_lossy().into_owned(), "<dir>");
    expectorate::assert_contents("tests/it/snapshots/validate-health-errors.txt", &text);
}

/// `health.silence` (issue #35): each mistake located, with what to write instead.
#[test]
fn silence_settings_are_checked_and_located() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write(
        d,
        "c.yaml",
        &format!(
            "{CLUSTER}  health:\n    silence:\n      matchers: ['instance=\"x\"', 'severity=warning']\n      nodeLabel: 'not a label'\n      lease: 30s\n      maxDuration: 10s\n"
        ),
    );
    write(d, "p.yaml", &pool("p1", "w-1", ""));
    let loaded = load(d);
    let msgs: Vec<(usize, &str)> = loaded
        .errors()
        .map(|x| (x.origin.line, x.message.as_str()))
        .collect();
    let has = |line: usize, needle: &str| {
        assert!(
            msgs.iter().any(|(l, m)| *l == line && m.contains(needle)),
            "no {needle:?} at line {line} in {msgs:#?}"
        );
    };
    has(10, "`health.silence` needs an Alertmanager");
    has(10, "`health.silence.matchers`: matcher `severity=warning`");
    has(11, "nodeLabel` `not a label` is not a label name");
    has(12, "`health.silence.lease` is 30s, shorter than 1m");
    has(
        13,
        "`health.silence.maxDuration` (10s) is shorter than its lease",
    );
    assert!(loaded.valid().is_none());

    // the node's own label among the matchers: medea adds that one itself
    write(
        d,
        "c.yaml",
        &format!(
            "{CLUSTER}  health:\n    alertmanager: {{ url: \"http://127.0.0.1:9093\" }}\n    silence:\n      matchers: ['node=\"w-1\"']\n      nodeLabel: node\n"
        ),
    );
    let loaded = load(d);
    let msgs: Vec<&str> = loaded.errors().map(|x| x.message.as_str()).collect();
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    assert!(
        msgs[0].contains("matches on `node`, the node label"),
        "{msgs:#?}"
    );

    // valid: the defaults fill in
    write(
        d,
        "c.yaml",
        &format!(
            "{CLUSTER}  health:\n    alertmanager: {{ url: \"http://127.0.0.1:9093\" }}\n    silence:\n      matchers: ['alertname=\"NodeDown\"']\n      nodeLabel: node\n"
        ),
    );
    let loaded = load(d);
    let errors: Vec<&str> = loaded.errors().map(|x| x.message.as_str()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn gates_that_need_a_missing_source_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write(d, "c.yaml", CLUSTER);
    write(
        d,
        "p.yaml",
        &pool(
            "p1",
            "w-1",
            "  health:\n    gates:\n      - name: q\n        query: 'up == 1'\n      - name: a\n        alerts: {}\n      - name: w\n        workloads: { namespaces: [kube-system] }\n",
        ),
    );
    let loaded = load(d);
    let msgs: Vec<&str> = loaded.errors().map(|x| x.message.as_str()).collect();
    assert_eq!(msgs.len(), 2, "{msgs:#?}");
    assert!(
        msgs[0].contains("query gate `q` needs a Prometheus"),
        "{msgs:#?}"
    );
    assert!(
        msgs[1].contains("alerts gate `a` needs an Alertmanager"),
        "{msgs:#?}"
    );
}

/// `examples/home` with health gates on the cluster and a rollback pool, planned against a
/// fixed inventory: the plan shows each pool's gates, soak and failure policy.
#[test]
fn plan_shows_gates_soak_and_failure_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let home = d.join("desired/home");
    std::fs::create_dir_all(&home).unwrap();
    let cluster = std::fs::read_to_string(root().join("examples/home/cluster.yaml")).unwrap();
    std::fs::write(home.join("cluster.yaml"), format!("{cluster}{HEALTH}")).unwrap();
    let pools = std::fs::read_to_string(root().join("examples/home/pools.yaml")).unwrap();
    let pools = pools.replacen(
        "  role: worker\n",
        "  role: worker\n  onFailure: rollback\n  health:\n    gates:\n      - name: ceph-healthy\n        query: 'ceph_health_status == bool 0'\n    soak: 2m\n",
        1,
    );
    std::fs::write(home.join("pools.yaml"), pools).unwrap();
    let m = |node: &str, host: u8, role: &str| {
        format!(
            "      - {{ node: {node}, id: home-{node}, address: 10.0.1.{host}, role: {role}, talosVersion: v1.12.4, installerImage: \"ghcr.io/siderolabs/installer:v1.12.4\", kubeletVersion: v1.34.1 }}\n"
        )
    };
    let inventory = format!(
        "clusters:\n  - name: home\n    kubernetesVersion: v1.34.1\n    generation: 4\n    machines:\n{}{}{}{}{}{}",
        m("cp-1", 11, "controlplane"),
        m("cp-2", 12, "controlplane"),
        m("cp-3", 13, "controlplane"),
        m("w-1", 21, "worker"),
        m("w-2", 22, "worker"),
        m("w-3", 23, "worker"),
    );
    std::fs::write(d.join("inventory.yaml"), inventory).unwrap();
    for (format, file) in [
        ("text", "tests/it/snapshots/plan-health.txt"),
        ("json", "tests/it/snapshots/plan-health.json"),
    ] {
        let out = crate::cli::medea()
            .env("NO_COLOR", "1")
            .env_remove("MEDEA_STORE")
            .env_remove("MEDEA_DESIRED")
            .args([
                "plan",
                "-o",
                format,
                "--observed",
                "inventory.yaml",
                "desired",
            ])
            .current_dir(d)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if format == "text" {
            assert!(stdout.contains("gate ceph-healthy: query `ceph_health_status == bool 0`"));
            assert!(stdout.contains("roll the failing wave back"));
            assert!(stdout.contains("Kubernetes steps never roll back"));
        } else {
            let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            let c = &v["clusters"][0];
            assert_eq!(c["health"]["gates"].as_array().unwrap().len(), 4);
            assert_eq!(c["health"]["failureLimit"], 2);
            let workers = c["steps"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["type"] == "talos" && s["pool"] == "workers")
                .expect("a workers step");
            assert_eq!(workers["health"]["onFailure"], "rollback");
            assert_eq!(workers["health"]["soak"], "2m");
        }
        expectorate::assert_contents(
            file,
            &format!(
                "$ medea plan -o {format} --observed inventory.yaml desired\n--- stdout\n{stdout}--- stderr\n{}",
                String::from_utf8_lossy(&out.stderr)
            ),
        );
    }
}

/// Issue #51 items 3 and 4: a gate's `skipOperatorSilences`, `consecutiveErrorLimit` and
/// `onInconclusive` reach the plan's gate (and its summary, so a change is a settings change);
/// a zero error limit is refused where it is written.
#[test]
fn gate_error_limit_pause_and_operator_silences_reach_the_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let cluster = format!(
        "{CLUSTER}{}",
        r#"  health:
    prometheus: { url: "http://127.0.0.1:9090" }
    alertmanager: { url: "http://127.0.0.1:9093" }
    gates:
      - name: ceph
        query: 'ceph_health_status == 0'
        consecutiveErrorLimit: 6
        onInconclusive: pause
      - name: alerts
        alerts: { matchers: ['severity="critical"'], skipOperatorSilences: true }
"#
    );
    write(d, "c.yaml", &cluster);
    write(d, "p.yaml", &pool("p1", "w-1", ""));
    let loaded = load(d);
    assert!(!loaded.has_errors(), "{:#?}", loaded.diagnostics);
    let c = &loaded.valid().unwrap().clusters["c1"];
    let p = medea::plan::health::HealthPolicy::of(&c.health).unwrap();
    assert_eq!(p.gates[0].consecutive_error_limit, 6);
    assert_eq!(
        p.gates[0].on_inconclusive,
        medea::plan::health::OnInconclusive::Pause
    );
    assert_eq!(
        p.gates[0].summary(),
        "ceph: query `ceph_health_status == 0`, halts after 6 consecutive errors, pauses when inconclusive"
    );
    assert!(matches!(
        &p.gates[1].check,
        GateCheck::Alerts {
            skip_operator_silences: true,
            ..
        }
    ));
    assert_eq!(
        p.gates[1].summary(),
        r#"alerts: alerts severity="critical", skipping operators' silences"#
    );
    // the defaults are not written: plans made before keep their ids
    let json = serde_json::to_value(&p.gates[1]).unwrap();
    assert!(json.get("consecutiveErrorLimit").is_none(), "{json}");
    assert!(json.get("onInconclusive").is_none(), "{json}");
    assert_eq!(
        json["check"]["alerts"]["skipOperatorSilences"], true,
        "{json}"
    );

    let bad = cluster.replace("consecutiveErrorLimit: 6", "consecutiveErrorLimit: 0");
    write(d, "c.yaml", &bad);
    let loaded = load(d);
    assert!(
        loaded.diagnostics.iter().any(|x| x.origin.file == "c.yaml"
            && x.origin.line == 14
            && x.code == codes::HEALTH
            && x.message == "gate `ceph`: `consecutiveErrorLimit` must be at least 1"),
        "{:#?}",
        loaded.diagnostics
    );
    assert!(loaded.valid().is_none());
}
