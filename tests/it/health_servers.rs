//! Real Prometheus and Alertmanager servers for health-gate tests (issue #23), on loopback
//! ports, stopped on drop. Shared: the probe tests (`health_probes.rs`) and the rollout e2e.
//!
//! - [`Exporter`]: a tiny `/metrics` endpoint whose gauges a test sets and removes.
//! - [`PrometheusServer`]: Debian's `prometheus` (2.42 here) scraping one exporter every second,
//!   storage in a temporary directory.
//! - [`AlertmanagerServer`]: Debian's `prometheus-alertmanager` (0.25 here), gossip off
//!   (`--cluster.listen-address=`), with [`AlertmanagerServer::fire`] / [`AlertmanagerServer::resolve`]
//!   posting alerts through its v2 API and [`AlertmanagerServer::silence`].
//!
//! Each `start` returns `None` (after a "skipped" line) when the binary is missing outside CI,
//! and panics under CI, like the other tool fixtures.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::process::{Child, Command};

pub use crate::fixtures::free_port;

type Series = BTreeMap<(String, BTreeMap<String, String>), String>;

/// A Prometheus exporter serving the gauges a test sets, in the text exposition format.
pub struct Exporter {
    pub addr: SocketAddr,
    series: Arc<Mutex<Series>>,
    task: tokio::task::JoinHandle<()>,
}

impl Exporter {
    pub async fn start() -> Exporter {
        let series: Arc<Mutex<Series>> = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = series.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let shared = shared.clone();
                async move {
                    let text = render(&shared.lock().unwrap());
                    ([("content-type", "text/plain; version=0.0.4")], text)
                }
            }),
        );
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Exporter { addr, series, task }
    }

    /// Set gauge `name{labels}` to `value` (`"NaN"`, `"+Inf"` allowed).
    pub fn set(&self, name: &str, labels: &[(&str, &str)], value: &str) {
        self.series
            .lock()
            .unwrap()
            .insert(key(name, labels), value.to_string());
    }

    /// Stop exposing `name{labels}` (Prometheus marks it stale at the next scrape).
    pub fn remove(&self, name: &str, labels: &[(&str, &str)]) {
        self.series.lock().unwrap().remove(&key(name, labels));
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn key(name: &str, labels: &[(&str, &str)]) -> (String, BTreeMap<String, String>) {
    (
        name.to_string(),
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn render(series: &Series) -> String {
    let mut out = String::new();
    let mut typed = std::collections::BTreeSet::new();
    for ((name, labels), value) in series {
        if typed.insert(name.clone()) {
            out.push_str(&format!("# TYPE {name} gauge\n"));
        }
        let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        if l.is_empty() {
            out.push_str(&format!("{name} {value}\n"));
        } else {
            out.push_str(&format!("{name}{{{}}} {value}\n", l.join(",")));
        }
    }
    out
}

/// Wait until `GET url` answers 200, up to 30 s (a server starting under load).
async fn wait_ready(url: &str, child: &mut Child, log: &std::path::Path) {
    for _ in 0..300 {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{url}: the server exited ({status}) before it was ready:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if let Ok((200, _)) = http(url, "GET", None, None).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{url} not ready after 30 s:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// One plain-HTTP request to a loopback server: `(status, body)`.
pub async fn http(
    url: &str,
    method: &str,
    content_type: Option<&str>,
    body: Option<String>,
) -> Result<(u16, String), String> {
    use http_body_util::{BodyExt, Full};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<hyper::body::Bytes>>();
    let mut req = hyper::Request::builder().method(method).uri(url);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let req = req
        .body(Full::new(hyper::body::Bytes::from(
            body.unwrap_or_default(),
        )))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| medea::error_chain(&e))?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// A Prometheus server scraping one exporter every second.
pub struct PrometheusServer {
    /// `http://127.0.0.1:<port>`
    pub url: String,
    _child: Child,
    _dir: tempfile::TempDir,
}

impl PrometheusServer {
    /// Start Prometheus scraping `exporter` (job `exporter`, every 1 s).
    pub async fn start(exporter: SocketAddr) -> Option<PrometheusServer> {
        let bin = crate::fixtures::tool_or_skip("prometheus")?;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\nscrape_configs:\n  - job_name: exporter\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    static_configs: [ {{ targets: ['{exporter}'] }} ]\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let log = dir.path().join("prometheus.log");
        let mut child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg("--storage.tsdb.retention.time=1h")
            .arg("--log.level=warn")
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.path().join("prometheus.err")).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        wait_ready(
            &format!("{url}/-/ready"),
            &mut child,
            &dir.path().join("prometheus.err"),
        )
        .await;
        Some(PrometheusServer {
            url,
            _child: child,
            _dir: dir,
        })
    }

    /// The instant-query result of `query` (the raw JSON `data`), for waiting on scrapes.
    pub async fn query(&self, query: &str) -> serde_json::Value {
        let (status, body) = http(
            &format!("{}/api/v1/query", self.url),
            "POST",
            Some("application/x-www-form-urlencoded"),
            Some(format!("query={}", medea::health::http::encode(query))),
        )
        .await
        .unwrap();
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["data"].clone()
    }

    /// Wait (up to 20 s) until `query` returns a sample whose value is `value`: the exporter's
    /// latest state has been scraped.
    pub async fn wait_for_value(&self, query: &str, value: &str) {
        for _ in 0..200 {
            let data = self.query(query).await;
            if data["result"]
                .as_array()
                .is_some_and(|r| r.iter().any(|s| s["value"][1] == value))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("`{query}` never returned {value}");
    }

    /// Wait (up to 20 s) until `query` returns no sample.
    pub async fn wait_for_empty(&self, query: &str) {
        for _ in 0..200 {
            let data = self.query(query).await;
            if data["result"].as_array().is_some_and(|r| r.is_empty()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("`{query}` never became empty");
    }

    pub fn endpoint(&self) -> medea::plan::health::Endpoint {
        medea::plan::health::Endpoint {
            url: self.url.clone(),
            credential: None,
        }
    }
}

/// An Alertmanager with gossip off and a null receiver.
pub struct AlertmanagerServer {
    /// `http://127.0.0.1:<port>`
    pub url: String,
    _child: Child,
    _dir: tempfile::TempDir,
}

impl AlertmanagerServer {
    pub async fn start() -> Option<AlertmanagerServer> {
        let bin = crate::fixtures::tool_or_skip("prometheus-alertmanager")?;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("am.yml");
        std::fs::write(
            &config,
            "route: { receiver: 'null' }\nreceivers: [ { name: 'null' } ]\n",
        )
        .unwrap();
        let port = free_port();
        let log: PathBuf = dir.path().join("am.log");
        let mut child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--cluster.listen-address=")
            .arg("--log.level=warn")
            .stdout(std::fs::File::create(dir.path().join("am.out")).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        wait_ready(&format!("{url}/-/ready"), &mut child, &log).await;
        Some(AlertmanagerServer {
            url,
            _child: child,
            _dir: dir,
        })
    }

    async fn post_alert(&self, labels: &[(&str, &str)], ends_at: &str) {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        let body = serde_json::json!([{ "labels": labels, "endsAt": ends_at }]).to_string();
        let (status, text) = http(
            &format!("{}/api/v2/alerts", self.url),
            "POST",
            Some("application/json"),
            Some(body),
        )
        .await
        .unwrap();
        assert_eq!(status, 200, "{text}");
    }

    /// Fire an alert with these labels (it stays active for a day).
    pub async fn fire(&self, labels: &[(&str, &str)]) {
        self.post_alert(labels, "2999-01-01T00:00:00Z").await;
    }

    /// Resolve the alert with these labels (ends in the past: gone from the API at once).
    pub async fn resolve(&self, labels: &[(&str, &str)]) {
        self.post_alert(labels, "2000-01-01T00:00:00Z").await;
    }

    /// Silence alerts whose `name` label equals `value`; returns the silence id.
    pub async fn silence(&self, name: &str, value: &str) -> String {
        let body = serde_json::json!({
            "matchers": [{ "name": name, "value": value, "isRegex": false, "isEqual": true }],
            "startsAt": "2000-01-01T00:00:00Z",
            "endsAt": "2999-01-01T00:00:00Z",
            "createdBy": "medea tests",
            "comment": "test silence",
        })
        .to_string();
        let (status, text) = http(
            &format!("{}/api/v2/silences", self.url),
            "POST",
            Some("application/json"),
            Some(body),
        )
        .await
        .unwrap();
        assert_eq!(status, 200, "{text}");
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["silenceID"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub fn endpoint(&self) -> medea::plan::health::Endpoint {
        medea::plan::health::Endpoint {
            url: self.url.clone(),
            credential: None,
        }
    }
}
