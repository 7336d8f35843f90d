//! The health probes (`medea::health::Probes`) against real servers: Debian's Prometheus
//! scraping a test exporter whose values the tests flip, Debian's Alertmanager fed through its
//! v2 API, and the simulator's kube-apiserver for workloads gates.

use std::time::Duration;

use medea::health::Probes;
use medea::plan::health::{Endpoint, Gate, GateCheck, HealthSources, WorkloadKind};
use medea::rollout::ports::{GateContext, GateVerdict, HealthProbe};

use crate::health_servers::{AlertmanagerServer, Exporter, PrometheusServer, free_port};

fn query(name: &str, q: &str) -> Gate {
    Gate {
        name: name.into(),
        dry_run: false,
        consecutive_error_limit: medea::plan::health::DEFAULT_CONSECUTIVE_ERROR_LIMIT,
        on_inconclusive: Default::default(),
        check: GateCheck::Query { query: q.into() },
    }
}

fn ctx(rebooting: &[&str]) -> GateContext {
    GateContext {
        cluster: "prod".into(),
        rebooting: rebooting.iter().map(|s| s.to_string()).collect(),
        own_silences: Vec::new(),
        sources: HealthSources::default(),
    }
}

fn prometheus_only(e: Endpoint) -> Probes {
    Probes::new(HealthSources {
        prometheus: Some(e),
        alertmanager: None,
    })
}

#[tokio::test]
async fn query_gates_follow_the_exporter_in_filter_and_bool_form() {
    let exporter = Exporter::start().await;
    exporter.set("ceph_health_status", &[("cluster", "ceph")], "0");
    let Some(prom) = PrometheusServer::start(exporter.addr).await else {
        return;
    };
    prom.wait_for_value("ceph_health_status", "0").await;
    let probes = prometheus_only(prom.endpoint());
    let filter = query("ceph-healthy", "ceph_health_status == 0");
    let boolean = query("ceph-healthy-bool", "(ceph_health_status == bool 0)");
    let absent = query("absent", "no_such_metric == 0");

    // Healthy: the filter keeps the 0-valued sample (passes); the bool form returns 1.
    let e = probes.evaluate(&filter, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Pass, "{}", e.detail);
    assert_eq!(e.gate, "ceph-healthy");
    assert_eq!(e.samples.len(), 1);
    assert_eq!(e.samples[0].value, "0");
    assert_eq!(e.samples[0].labels["cluster"], "ceph");
    let e = probes.evaluate(&boolean, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Pass, "{}", e.detail);
    assert_eq!(e.samples[0].value, "1");
    // A series that does not exist never passes.
    let e = probes.evaluate(&absent, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Fail);
    assert!(e.detail.contains("returned no sample"), "{}", e.detail);
    // The `bool` form of an absent series has no value to judge: inconclusive (issue #35).
    let e = probes
        .evaluate(&query("absent-bool", "no_such_metric == bool 0"), &ctx(&[]))
        .await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive, "{}", e.detail);
    assert!(e.detail.contains("absent"), "{}", e.detail);

    // Ceph goes unhealthy: the filter returns nothing, the bool form a 0.
    exporter.set("ceph_health_status", &[("cluster", "ceph")], "1");
    prom.wait_for_value("ceph_health_status", "1").await;
    let e = probes.evaluate(&filter, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Fail);
    assert!(e.samples.is_empty());
    let e = probes.evaluate(&boolean, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Fail);
    assert_eq!(e.samples[0].value, "0");
    assert!(e.detail.starts_with("1 of 1 samples fail"), "{}", e.detail);

    // And back.
    exporter.set("ceph_health_status", &[("cluster", "ceph")], "0");
    prom.wait_for_value("ceph_health_status", "0").await;
    let e = probes.evaluate(&filter, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Pass, "{}", e.detail);

    // A NaN sample is no value: inconclusive even in a filter that keeps it (issue #35).
    exporter.set("ingress_error_rate", &[], "NaN");
    prom.wait_for_value("ingress_error_rate", "NaN").await;
    let e = probes
        .evaluate(
            &query("nan", "ingress_error_rate >= 0 or ingress_error_rate"),
            &ctx(&[]),
        )
        .await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(e.detail.contains("is NaN"), "{}", e.detail);

    // A query Prometheus refuses (many-to-many matching) is inconclusive, with its error.
    exporter.set("dup", &[("a", "1")], "1");
    exporter.set("dup", &[("a", "2")], "1");
    prom.wait_for_value("dup", "1").await;
    let e = probes
        .evaluate(&query("refused", "dup == on() group_left dup"), &ctx(&[]))
        .await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(
        e.detail
            .contains("Prometheus answered HTTP 422 with error (execution)"),
        "{}",
        e.detail
    );

    // A credential's token never goes over plain http:// (issue #32): the gate fails, saying
    // so, and the token is never shown. (Over https, `trust::` shows it is sent.)
    let dir = tempfile::tempdir().unwrap();
    medea::private_file::write_private(
        &dir.path().join("prom/token"),
        b"s3cret-token\n",
        medea::private_file::ExistingDir::Keep,
    )
    .unwrap();
    let with_token = prometheus_only(Endpoint {
        credential: Some("prom".into()),
        ..prom.endpoint()
    })
    .with_credentials(medea::health::http::Credentials::Dir(
        dir.path().to_path_buf(),
    ));
    let e = with_token.evaluate(&filter, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(
        e.detail
            .contains("credential `prom` holds a bearer token and http://127.0.0.1:"),
        "{}",
        e.detail
    );
    assert!(
        e.detail.contains("medea never sends a token in clear"),
        "{}",
        e.detail
    );
    assert!(!format!("{e:?}").contains("s3cret"));
}

#[tokio::test]
async fn an_unreachable_or_broken_prometheus_is_an_inconclusive_evaluation_with_its_cause() {
    let gate = query("q", "up == 1");
    // Nothing listens.
    let port = free_port();
    let probes = prometheus_only(Endpoint {
        url: format!("http://127.0.0.1:{port}"),
        credential: None,
    });
    let e = probes.evaluate(&gate, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(
        e.detail.starts_with(&format!(
            "cannot ask the source: request to http://127.0.0.1:{port}/api/v1/query failed: "
        )),
        "{}",
        e.detail
    );
    assert!(e.detail.contains("Connection refused"), "{}", e.detail);

    // Something that is not Prometheus answers 404.
    let exporter = Exporter::start().await;
    let e = prometheus_only(Endpoint {
        url: format!("http://{}", exporter.addr),
        credential: None,
    })
    .evaluate(&gate, &ctx(&[]))
    .await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(e.detail.contains("answered HTTP 404"), "{}", e.detail);

    // A server that accepts and never answers: bounded by the probe's timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let e = prometheus_only(Endpoint {
        url: format!("http://{addr}"),
        credential: None,
    })
    .with_timeout(Duration::from_millis(300))
    .evaluate(&gate, &ctx(&[]))
    .await;
    hold.abort();
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(e.detail.contains("no answer from"), "{}", e.detail);

    // TLS with a credential whose CA is a link to /dev/zero: refused at once, never read.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("zero")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero/ca.pem")).unwrap();
    let started = std::time::Instant::now();
    let e = prometheus_only(Endpoint {
        url: format!("https://127.0.0.1:{port}"),
        credential: Some("zero".into()),
    })
    .with_credentials(medea::health::http::Credentials::Dir(
        dir.path().to_path_buf(),
    ))
    .evaluate(&gate, &ctx(&[]))
    .await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(
        e.detail.contains("cannot read credential `zero`"),
        "{}",
        e.detail
    );
    assert!(e.detail.contains("is a symbolic link"), "{}", e.detail);
    assert!(started.elapsed() < Duration::from_secs(2));

    // TLS against a plain-HTTP server: the handshake fails, the gate fails.
    let e = prometheus_only(Endpoint {
        url: format!("https://{}", exporter.addr),
        credential: None,
    })
    .evaluate(&gate, &ctx(&[]))
    .await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(
        e.detail.starts_with("cannot ask the source"),
        "{}",
        e.detail
    );

    // No Prometheus configured at all.
    let e = Probes::new(HealthSources::default())
        .evaluate(&gate, &ctx(&[]))
        .await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(
        e.detail.contains("no Prometheus configured"),
        "{}",
        e.detail
    );
}

#[tokio::test]
async fn alerts_gate_counts_matching_alerts_except_ignored_own_silenced_and_rebooting_ones() {
    let Some(am) = AlertmanagerServer::start().await else {
        return;
    };
    let probes = Probes::new(HealthSources {
        prometheus: None,
        alertmanager: Some(am.endpoint()),
    });
    let gate = Gate {
        name: "no-critical-alerts".into(),
        dry_run: false,
        consecutive_error_limit: medea::plan::health::DEFAULT_CONSECUTIVE_ERROR_LIMIT,
        on_inconclusive: Default::default(),
        check: GateCheck::Alerts {
            matchers: vec![r#"severity="critical""#.into()],
            ignore: vec![r#"alertname=~"KubeNodeUnreachable|Watchdog""#.into()],
            skip_operator_silences: false,
        },
    };
    let e = probes.evaluate(&gate, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Pass, "{}", e.detail);
    assert_eq!(e.detail, "no matching alert is firing");

    // Not matched (warning), ignored (KubeNodeUnreachable), about a node being rebooted.
    am.fire(&[("alertname", "DiskSlow"), ("severity", "warning")])
        .await;
    am.fire(&[
        ("alertname", "KubeNodeUnreachable"),
        ("severity", "critical"),
        ("node", "w-2"),
    ])
    .await;
    let node_down = [
        ("alertname", "NodeExporterDown"),
        ("severity", "critical"),
        ("instance", "w-1:9100"),
    ];
    am.fire(&node_down).await;
    let e = probes.evaluate(&gate, &ctx(&["w-1"])).await;
    assert_eq!(e.verdict, GateVerdict::Pass, "{}", e.detail);
    assert_eq!(
        e.detail,
        "no matching alert is firing (1 ignored, 1 about rebooting nodes)"
    );
    // The same alert while w-1 is not being rebooted fails the gate.
    let e = probes.evaluate(&gate, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Fail);
    assert_eq!(e.samples.len(), 1);
    assert_eq!(e.samples[0].labels["alertname"], "NodeExporterDown");
    assert_eq!(e.samples[0].value, "active");
    assert!(
        e.detail.starts_with(
            r#"1 alert firing: NodeExporterDown{instance="w-1:9100", severity="critical"}"#
        ),
        "{}",
        e.detail
    );

    // A critical alert elsewhere; then silenced (not counted), then resolved.
    let ceph = [("alertname", "CephHealthError"), ("severity", "critical")];
    am.resolve(&node_down).await;
    am.fire(&ceph).await;
    let e = probes.evaluate(&gate, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Fail);
    assert_eq!(e.samples[0].labels["alertname"], "CephHealthError");
    // An operator's silence (broad: every critical alert) hides nothing from the gate
    // (issue #51 item 3) unless the gate says `skipOperatorSilences`; medea's own does.
    let operators = am.silence("severity", "critical").await;
    let e = probes.evaluate(&gate, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Fail, "{}", e.detail);
    assert_eq!(e.samples[0].labels["alertname"], "CephHealthError");
    let mut skipping = gate.clone();
    if let GateCheck::Alerts {
        skip_operator_silences,
        ..
    } = &mut skipping.check
    {
        *skip_operator_silences = true;
    }
    let e = probes.evaluate(&skipping, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Pass, "{}", e.detail);
    assert_eq!(
        e.detail,
        "no matching alert is firing (1 ignored, 1 under an operator's silence)"
    );
    let mut own = ctx(&[]);
    own.own_silences = vec![operators];
    let e = probes.evaluate(&gate, &own).await;
    assert_eq!(e.verdict, GateVerdict::Pass, "{}", e.detail);
    assert_eq!(
        e.detail,
        "no matching alert is firing (1 ignored, 1 under medea's silence)"
    );

    // Regex matchers are anchored, server- and client-side alike.
    let regex_gate = Gate {
        name: "disk".into(),
        dry_run: false,
        consecutive_error_limit: medea::plan::health::DEFAULT_CONSECUTIVE_ERROR_LIMIT,
        on_inconclusive: Default::default(),
        check: GateCheck::Alerts {
            matchers: vec![r#"alertname=~"Disk""#.into()],
            ignore: vec![],
            skip_operator_silences: false,
        },
    };
    let e = probes.evaluate(&regex_gate, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Pass, "{}", e.detail);
    let regex_gate = Gate {
        name: "disk".into(),
        dry_run: false,
        consecutive_error_limit: medea::plan::health::DEFAULT_CONSECUTIVE_ERROR_LIMIT,
        on_inconclusive: Default::default(),
        check: GateCheck::Alerts {
            matchers: vec![r#"alertname=~"Disk.*""#.into()],
            ignore: vec![],
            skip_operator_silences: false,
        },
    };
    let e = probes.evaluate(&regex_gate, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Fail, "{}", e.detail);

    // doctor's check: the status endpoint answers.
    let checks = probes.check_sources().await;
    assert_eq!(checks.len(), 1);
    assert!(
        matches!(&checks[0].2, Ok(s) if s.starts_with("Alertmanager 0.")),
        "{:?}",
        checks[0].2
    );
}

#[tokio::test]
async fn an_unreachable_alertmanager_is_inconclusive() {
    let port = free_port();
    let probes = Probes::new(HealthSources {
        prometheus: None,
        alertmanager: Some(Endpoint {
            url: format!("http://127.0.0.1:{port}"),
            credential: None,
        }),
    });
    let gate = Gate {
        name: "alerts".into(),
        dry_run: false,
        consecutive_error_limit: medea::plan::health::DEFAULT_CONSECUTIVE_ERROR_LIMIT,
        on_inconclusive: Default::default(),
        check: GateCheck::Alerts {
            matchers: vec![],
            ignore: vec![],
            skip_operator_silences: false,
        },
    };
    let e = probes.evaluate(&gate, &ctx(&[])).await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(e.detail.contains("Connection refused"), "{}", e.detail);
    let checks = probes.check_sources().await;
    assert!(checks[0].2.is_err(), "{:?}", checks[0].2);
}

#[tokio::test]
async fn doctor_check_asks_prometheus_a_trivial_query() {
    let exporter = Exporter::start().await;
    let Some(prom) = PrometheusServer::start(exporter.addr).await else {
        return;
    };
    let checks = prometheus_only(prom.endpoint()).check_sources().await;
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0].0, "prometheus");
    assert!(
        matches!(&checks[0].2, Ok(s) if s == "answers `vector(1)`"),
        "{:?}",
        checks[0].2
    );
}

/// A Deployment the simulator cannot schedule (its nodeSelector matches no node) fails a
/// workloads gate naming it; the namespace's other workloads pass.
#[tokio::test]
async fn workloads_gate_on_the_simulator_names_the_unavailable_deployment() {
    use medea::k8s::{ApplyOptions, ClientOptions, KubeApi, KubeClient, Manifest};
    use medea::sim::kube::KubeSimConfig;
    let dir = tempfile::tempdir().unwrap();
    let sim = crate::rollout_sim::Sim::start(dir.path(), 1, 2, KubeSimConfig::default()).await;
    let kubeconfig = sim.creds.join(crate::rollout::CLUSTER).join("kubeconfig");
    let client = KubeClient::from_kubeconfig(&kubeconfig, ClientOptions::default())
        .await
        .unwrap();
    let deployment = |name: &str, selector: serde_json::Value| {
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"nodeSelector": selector, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
                }
            }
        })
    };
    let manifests = vec![
        Manifest::from_value(deployment("web", serde_json::json!({})), 0).unwrap(),
        Manifest::from_value(
            deployment(
                "stuck",
                serde_json::json!({"disk": "nvme-that-no-node-has"}),
            ),
            1,
        )
        .unwrap(),
    ];
    client
        .apply(
            &manifests,
            &ApplyOptions {
                field_manager: "medea-test".into(),
                force_conflicts: false,
                dry_run: false,
            },
        )
        .await
        .unwrap();
    let probes = Probes::new(HealthSources::default()).with_kube(std::sync::Arc::new(client));
    let gate = Gate {
        name: "workloads".into(),
        dry_run: false,
        consecutive_error_limit: medea::plan::health::DEFAULT_CONSECUTIVE_ERROR_LIMIT,
        on_inconclusive: Default::default(),
        check: GateCheck::Workloads {
            namespaces: vec!["default".into()],
            kinds: vec![WorkloadKind::Deployment, WorkloadKind::DaemonSet],
        },
    };
    // The simulator's controllers settle asynchronously: wait for `web` to be rolled out.
    let mut last = None;
    for _ in 0..100 {
        let e = probes.evaluate(&gate, &ctx(&[])).await;
        let web_bad = e.samples.iter().any(|s| s.labels["name"] == "web");
        if !web_bad {
            last = Some(e);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let e = last.expect("`web` rolls out on the simulator");
    assert_eq!(e.verdict, GateVerdict::Fail, "{}", e.detail);
    assert_eq!(e.samples.len(), 1, "{:?}", e.samples);
    assert_eq!(e.samples[0].labels["kind"], "Deployment");
    assert_eq!(e.samples[0].labels["name"], "stuck");
    assert!(
        e.samples[0].value.contains("0/2 available"),
        "{}",
        e.samples[0].value
    );
    assert!(
        e.detail
            .starts_with("1 of 2 workloads not rolled out: Deployment default/stuck"),
        "{}",
        e.detail
    );

    // Without a kube client a workloads gate cannot pass.
    let e = Probes::new(HealthSources::default())
        .evaluate(&gate, &ctx(&[]))
        .await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(
        e.detail.contains("needs the cluster's kubeconfig"),
        "{}",
        e.detail
    );
}

/// `medea doctor --store`: each Prometheus/Alertmanager the last-applied Cluster's `health`
/// block names is asked a trivial question; an unreachable one fails doctor with the cause and
/// the fix. (Sources only the desired state names are not asked: `trust::`.)
#[tokio::test]
async fn doctor_checks_the_health_sources_the_desired_state_names() {
    use crate::sim_cluster::{env, flat, medea, quick_default};
    let exporter = Exporter::start().await;
    let Some(prom) = PrometheusServer::start(exporter.addr).await else {
        return;
    };
    let e = env(quick_default()).await;
    let creds = e.dir.path().join("creds");
    e.sim.write_creds(&creds.join("home")).unwrap();
    let desired = e.dir.path().join("desired");
    std::fs::create_dir_all(&desired).unwrap();
    let dead = free_port();
    std::fs::write(
        desired.join("cluster.yaml"),
        format!(
            "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: home\nspec:\n  kubernetes:\n    version: v1.35.0\n  health:\n    prometheus: {{ url: \"{}\" }}\n    alertmanager: {{ url: \"http://127.0.0.1:{dead}\" }}\n",
            prom.url
        ),
    )
    .unwrap();
    // Applied: the last-applied state names both sources.
    let store = e.dir.path().join("store");
    {
        use medea::store::{Store as _, Txn};
        let loaded = medea::desired::load(&medea::desired::Source::Dir(desired.clone())).unwrap();
        let r = medea::plan::AppliedResource::of_cluster(&loaded.valid().unwrap().clusters["home"]);
        medea::store::fjall::FjallStore::open(&store)
            .unwrap()
            .commit(Txn::new().put_record(r.key.store_key(), &r))
            .unwrap();
    }
    let out = medea(&[
        "doctor",
        "--creds-dir",
        creds.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--desired",
        desired.to_str().unwrap(),
    ])
    .await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}{}", flat(&out.stderr));
    assert!(
        text.contains("ok    prometheus ")
            && text.contains(&format!("{}: answers `vector(1)`", prom.url)),
        "{text}"
    );
    assert!(
        text.contains("FAIL  alertmanager ") && text.contains("Connection refused"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "home http://127.0.0.1:{dead}: make http://127.0.0.1:{dead} reachable from medea"
        )),
        "{text}"
    );
}
