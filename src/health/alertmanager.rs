//! Alerts gates: Alertmanager's `GET /api/v2/alerts?active=true&silenced=false&inhibited=false`
//! with one `filter=` per matcher (server-side), then, client-side, the matchers again (so a
//! proxy that drops the filter cannot make a gate pass), the `ignore` matchers, and the
//! alerts about a node medea is rebooting right now ([`about_rebooting_node`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::http;
use super::{MAX_SAMPLES, ProbeError};
use crate::desired::health::Matcher;
use crate::plan::health::Endpoint;
use crate::rollout::ports::{GateSample, GateVerdict};

/// The labels an alert may name its node by: `node`, `kubernetes_node`, `nodename`, and the
/// host part of `instance` (`host:port`, `[v6]:port`).
pub const NODE_LABELS: [&str; 4] = ["node", "instance", "kubernetes_node", "nodename"];

/// One alert of `GET /api/v2/alerts` (the fields a gate reads; `status.mutedBy`, required
/// from Alertmanager 0.27 on, is not needed).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub status: Option<AlertStatus>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AlertStatus {
    #[serde(default)]
    pub state: String,
}

/// Active, unsilenced, uninhibited alerts matching `matchers` (all of them).
pub async fn alerts(
    endpoint: &Endpoint,
    credentials: &http::Credentials,
    matchers: &[Matcher],
    timeout: Duration,
) -> Result<Vec<Alert>, ProbeError> {
    let mut path = String::from("/api/v2/alerts?active=true&silenced=false&inhibited=false");
    for m in matchers {
        path.push_str("&filter=");
        path.push_str(&http::encode(&m.to_filter()));
    }
    let answer = http::send(endpoint, credentials, &path, None, timeout).await?;
    let url = format!("{}/api/v2/alerts", endpoint.url);
    if answer.status != 200 {
        return Err(ProbeError::Status {
            url,
            status: answer.status,
            body: http::excerpt(&answer.body),
        });
    }
    serde_json::from_slice(&answer.body).map_err(|err| ProbeError::Json { url, err })
}

fn host_of(instance: &str) -> &str {
    if let Some(rest) = instance.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match instance.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => instance,
    }
}

/// Whether an alert is about one of `rebooting` (Kubernetes node names): one of
/// [`NODE_LABELS`] equals a node's name exactly (`instance` by its host part).
pub fn about_rebooting_node<'a>(
    labels: &BTreeMap<String, String>,
    rebooting: &'a [String],
) -> Option<&'a str> {
    rebooting
        .iter()
        .find(|n| {
            NODE_LABELS.iter().any(|l| match labels.get(*l) {
                Some(v) if *l == "instance" => host_of(v) == n.as_str(),
                Some(v) => v == *n,
                None => false,
            })
        })
        .map(String::as_str)
}

fn alert_text(labels: &BTreeMap<String, String>) -> String {
    let name = labels.get("alertname").cloned().unwrap_or_default();
    let rest: Vec<String> = labels
        .iter()
        .filter(|(k, _)| k.as_str() != "alertname")
        .map(|(k, v)| format!("{k}=\"{v}\""))
        .collect();
    format!("{name}{{{}}}", rest.join(", "))
}

/// Judge the alerts Alertmanager returned. Pure.
pub fn judge(
    alerts: &[Alert],
    matchers: &[Matcher],
    ignore: &[Matcher],
    rebooting: &[String],
) -> (GateVerdict, Vec<GateSample>, String) {
    let mut firing = Vec::new();
    let mut ignored = 0usize;
    let mut rebooting_hits = 0usize;
    for a in alerts {
        if !matchers.iter().all(|m| m.matches(&a.labels)) {
            continue;
        }
        if ignore.iter().any(|m| m.matches(&a.labels)) {
            ignored += 1;
            continue;
        }
        if about_rebooting_node(&a.labels, rebooting).is_some() {
            rebooting_hits += 1;
            continue;
        }
        firing.push(a);
    }
    firing.sort_by(|a, b| a.labels.cmp(&b.labels));
    let samples: Vec<GateSample> = firing
        .iter()
        .take(MAX_SAMPLES)
        .map(|a| GateSample {
            labels: a.labels.clone(),
            value: a
                .status
                .as_ref()
                .map_or_else(|| "active".to_string(), |s| s.state.clone()),
        })
        .collect();
    let mut skipped = Vec::new();
    if ignored > 0 {
        skipped.push(format!("{ignored} ignored"));
    }
    if rebooting_hits > 0 {
        skipped.push(format!("{rebooting_hits} about rebooting nodes"));
    }
    let skipped = if skipped.is_empty() {
        String::new()
    } else {
        format!(" ({})", skipped.join(", "))
    };
    match firing.first() {
        None => (
            GateVerdict::Pass,
            samples,
            format!("no matching alert is firing{skipped}"),
        ),
        Some(first) => (
            GateVerdict::Fail,
            samples,
            format!(
                "{} firing: {}{}{skipped}",
                if firing.len() == 1 {
                    "1 alert".to_string()
                } else {
                    format!("{} alerts", firing.len())
                },
                alert_text(&first.labels),
                if firing.len() > 1 { " and more" } else { "" }
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert(kv: &[(&str, &str)]) -> Alert {
        Alert {
            labels: kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            status: Some(AlertStatus {
                state: "active".into(),
            }),
        }
    }

    #[test]
    fn node_labels_and_instance_hosts() {
        let r = vec!["w-1".to_string()];
        for labels in [
            vec![("node", "w-1")],
            vec![("instance", "w-1:9100")],
            vec![("instance", "w-1")],
            vec![("kubernetes_node", "w-1")],
            vec![("nodename", "w-1")],
        ] {
            let a = alert(&labels);
            assert_eq!(
                about_rebooting_node(&a.labels, &r),
                Some("w-1"),
                "{labels:?}"
            );
        }
        for labels in [
            vec![("node", "w-10")],
            vec![("instance", "w-1.example.com:9100")],
            vec![("pod", "w-1")],
        ] {
            let a = alert(&labels);
            assert_eq!(about_rebooting_node(&a.labels, &r), None, "{labels:?}");
        }
        assert_eq!(host_of("[fd00::1]:9100"), "fd00::1");
        assert_eq!(host_of("fd00::1"), "fd00::1");
    }

    #[test]
    fn ignore_and_rebooting_nodes_are_not_counted() {
        let m = vec![Matcher::parse(r#"severity="critical""#).unwrap()];
        let ignore = vec![Matcher::parse(r#"alertname="KubeNodeUnreachable""#).unwrap()];
        let alerts = vec![
            alert(&[
                ("alertname", "KubeNodeUnreachable"),
                ("severity", "critical"),
            ]),
            alert(&[
                ("alertname", "NodeDown"),
                ("severity", "critical"),
                ("node", "w-1"),
            ]),
            alert(&[("alertname", "Minor"), ("severity", "warning")]),
        ];
        let (v, s, d) = judge(&alerts, &m, &ignore, &["w-1".to_string()]);
        assert_eq!(v, GateVerdict::Pass, "{d}");
        assert!(s.is_empty());
        assert_eq!(
            d,
            "no matching alert is firing (1 ignored, 1 about rebooting nodes)"
        );
        let (v, s, d) = judge(&alerts, &m, &ignore, &[]);
        assert_eq!(v, GateVerdict::Fail);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].value, "active");
        assert!(
            d.starts_with(r#"1 alert firing: NodeDown{node="w-1", severity="critical"}"#),
            "{d}"
        );
    }
}
