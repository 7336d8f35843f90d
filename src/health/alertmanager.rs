//! Alerts gates: Alertmanager's `GET /api/v2/alerts?active=true&silenced=true&inhibited=false`
//! with one `filter=` per matcher (server-side), then, client-side, the matchers again (so a
//! proxy that drops the filter cannot make a gate pass), the `ignore` matchers, the alerts
//! muted by medea's OWN silences (by id, from each alert's `status.silencedBy`; an operator's
//! silence hides nothing unless the gate says `skipOperatorSilences`), and the alerts about a
//! node medea is rebooting right now ([`about_rebooting_node`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::http;
use super::{MAX_SAMPLES, ProbeError};
use crate::desired::health::Matcher;
use crate::plan::health::Endpoint;
use crate::rollout::ports::{
    GateSample, GateVerdict, SILENCE_CREATED_BY, SilenceRequest, Silenced,
};

/// The labels an alert may name its node by: `node`, `kubernetes_node`, `nodename`, and the
/// host part of `instance` (`host:port`, `[v6]:port`).
pub const NODE_LABELS: [&str; 4] = ["node", "instance", "kubernetes_node", "nodename"];

/// One alert of `GET /api/v2/alerts` (the fields a gate reads: `status.silencedBy` is
/// Alertmanager's `alertStatus` in api/v2/openapi.yaml, present in every version medea
/// supports; `mutedBy`, from 0.27 on, is not needed).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub status: Option<AlertStatus>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertStatus {
    #[serde(default)]
    pub state: String,
    /// The ids of the silences muting the alert (empty: none).
    #[serde(default)]
    pub silenced_by: Vec<String>,
}

/// Active, uninhibited alerts matching `matchers` (all of them), silenced or not: which
/// silences count is the gate's call ([`judge`]).
pub async fn alerts(
    endpoint: &Endpoint,
    credentials: &http::Credentials,
    matchers: &[Matcher],
    timeout: Duration,
) -> Result<Vec<Alert>, ProbeError> {
    let mut path = String::from("/api/v2/alerts?active=true&silenced=true&inhibited=false");
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

// ---------------------------------------------------------------------------------------
// Silences (issue #35 item 1), Alertmanager's API v2 (api/v2/openapi.yaml): `GET
// /api/v2/silences`, `GET /api/v2/silence/{silenceID}`, `POST /api/v2/silences` (a body with
// `id` updates that silence: in place when its matchers and `startsAt` are unchanged,
// silence/silence.go `canUpdate`; otherwise Alertmanager expires it and answers a new id),
// `DELETE /api/v2/silence/{silenceID}`.

/// One silence of `GET /api/v2/silences` (the fields medea reads).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Silence {
    pub id: String,
    #[serde(default)]
    pub created_by: String,
    #[serde(default)]
    pub comment: String,
    #[serde(default)]
    pub starts_at: String,
    #[serde(default)]
    pub ends_at: String,
    #[serde(default)]
    pub status: Option<AlertStatus>,
}

impl Silence {
    fn expired(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.state == "expired")
    }
}

/// Why a silence call failed, and whether it may have run.
#[derive(Debug)]
pub struct SilenceError {
    /// The call may have taken effect, or is worth trying again (no answer, HTTP 5xx).
    pub transient: bool,
    pub err: ProbeError,
}

fn classify(err: ProbeError) -> SilenceError {
    let transient = match &err {
        ProbeError::Http { err } => matches!(
            **err,
            http::HttpError::Request { .. }
                | http::HttpError::Timeout { .. }
                | http::HttpError::Body { .. }
        ),
        ProbeError::Status { status, .. } => *status >= 500 || *status == 429,
        _ => false,
    };
    SilenceError { transient, err }
}

fn rfc3339(t: jiff::Timestamp) -> String {
    format!("{:.0}", t)
}

async fn silences(
    endpoint: &Endpoint,
    credentials: &http::Credentials,
    timeout: Duration,
) -> Result<Vec<Silence>, ProbeError> {
    let answer = http::send(endpoint, credentials, "/api/v2/silences", None, timeout).await?;
    let url = format!("{}/api/v2/silences", endpoint.url);
    if answer.status != 200 {
        return Err(ProbeError::Status {
            url,
            status: answer.status,
            body: http::excerpt(&answer.body),
        });
    }
    serde_json::from_slice(&answer.body).map_err(|err| ProbeError::Json { url, err })
}

async fn silence_by_id(
    endpoint: &Endpoint,
    credentials: &http::Credentials,
    id: &str,
    timeout: Duration,
) -> Result<Option<Silence>, ProbeError> {
    let path = format!("/api/v2/silence/{}", http::encode(id));
    let answer = http::send(endpoint, credentials, &path, None, timeout).await?;
    let url = format!("{}{path}", endpoint.url);
    match answer.status {
        200 => serde_json::from_slice(&answer.body)
            .map(Some)
            .map_err(|err| ProbeError::Json { url, err }),
        404 => Ok(None),
        status => Err(ProbeError::Status {
            url,
            status,
            body: http::excerpt(&answer.body),
        }),
    }
}

async fn post_silence(
    endpoint: &Endpoint,
    credentials: &http::Credentials,
    body: serde_json::Value,
    timeout: Duration,
) -> Result<String, ProbeError> {
    let answer = http::exchange(
        endpoint,
        credentials,
        http::Request::Post {
            content_type: "application/json",
            body: body.to_string(),
        },
        "/api/v2/silences",
        timeout,
    )
    .await?;
    let url = format!("{}/api/v2/silences", endpoint.url);
    if answer.status != 200 {
        return Err(ProbeError::Status {
            url,
            status: answer.status,
            body: http::excerpt(&answer.body),
        });
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Posted {
        #[serde(rename = "silenceID")]
        silence_id: String,
    }
    serde_json::from_slice::<Posted>(&answer.body)
        .map(|p| p.silence_id)
        .map_err(|err| ProbeError::Json { url, err })
}

/// Create or renew the silence of `req`: the silence `req.id`, else the active `createdBy:
/// medea` silence whose comment holds `req.marker` (a create whose reply was lost), renewed
/// to `req.ends_at` with its own `startsAt`; a new one when there is neither (or it expired).
pub async fn silence(
    credentials: &http::Credentials,
    req: &SilenceRequest,
    now: jiff::Timestamp,
    timeout: Duration,
) -> Result<Silenced, SilenceError> {
    let endpoint = &req.alertmanager;
    let existing = match &req.id {
        Some(id) => silence_by_id(endpoint, credentials, id, timeout)
            .await
            .map_err(classify)?,
        None => silences(endpoint, credentials, timeout)
            .await
            .map_err(classify)?
            .into_iter()
            .find(|s| {
                s.created_by == SILENCE_CREATED_BY
                    && s.comment.contains(&req.marker)
                    && !s.expired()
            }),
    };
    let mut body = serde_json::json!({
        "matchers": req.matchers,
        "endsAt": rfc3339(req.ends_at),
        "createdBy": SILENCE_CREATED_BY,
        "comment": req.comment,
    });
    match existing.filter(|s| !s.expired()) {
        Some(s) => {
            body["id"] = serde_json::Value::String(s.id.clone());
            body["startsAt"] = serde_json::Value::String(s.starts_at.clone());
            let id = post_silence(endpoint, credentials, body, timeout)
                .await
                .map_err(classify)?;
            Ok(Silenced { id, created: false })
        }
        None => {
            body["startsAt"] = serde_json::Value::String(rfc3339(now));
            let id = post_silence(endpoint, credentials, body, timeout)
                .await
                .map_err(classify)?;
            Ok(Silenced { id, created: true })
        }
    }
}

/// Expire silence `id` now. Gone (404) or already expired: done.
pub async fn expire(
    endpoint: &Endpoint,
    credentials: &http::Credentials,
    id: &str,
    timeout: Duration,
) -> Result<(), SilenceError> {
    let path = format!("/api/v2/silence/{}", http::encode(id));
    let answer = http::exchange(endpoint, credentials, http::Request::Delete, &path, timeout)
        .await
        .map_err(|err| classify(ProbeError::Http { err: Box::new(err) }))?;
    match answer.status {
        200 | 404 => Ok(()),
        status => {
            // Alertmanager before 0.26 answers 500 "already expired" to a second DELETE
            if let Ok(Some(s)) = silence_by_id(endpoint, credentials, id, timeout).await
                && s.expired()
            {
                return Ok(());
            }
            Err(classify(ProbeError::Status {
                url: format!("{}{path}", endpoint.url),
                status,
                body: http::excerpt(&answer.body),
            }))
        }
    }
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

/// Which silences an alerts gate looks through: medea's own (by id) always, an operator's
/// only when the gate says `skipOperatorSilences`.
#[derive(Debug, Clone, Copy)]
pub struct SilenceRule<'a> {
    /// The ids of the silences medea made for this job.
    pub own: &'a [String],
    /// Skip alerts muted by any other silence too.
    pub skip_operator: bool,
}

/// How a silenced alert counts under `rule`: `Some(true)` muted by medea's own silence,
/// `Some(false)` muted by an operator's silence the gate skips, `None` counted.
fn muted(a: &Alert, rule: SilenceRule<'_>) -> Option<bool> {
    let by = a.status.as_ref().map_or(&[][..], |s| &s.silenced_by[..]);
    if by.is_empty() {
        return None;
    }
    if by.iter().any(|id| rule.own.contains(id)) {
        return Some(true);
    }
    rule.skip_operator.then_some(false)
}

/// Judge the alerts Alertmanager returned. Pure.
pub fn judge(
    alerts: &[Alert],
    matchers: &[Matcher],
    ignore: &[Matcher],
    silences: SilenceRule<'_>,
    rebooting: &[String],
) -> (GateVerdict, Vec<GateSample>, String) {
    let mut firing = Vec::new();
    let (mut ignored, mut own, mut operator) = (0usize, 0usize, 0usize);
    let mut rebooting_hits = 0usize;
    for a in alerts {
        if !matchers.iter().all(|m| m.matches(&a.labels)) {
            continue;
        }
        if ignore.iter().any(|m| m.matches(&a.labels)) {
            ignored += 1;
            continue;
        }
        match muted(a, silences) {
            Some(true) => {
                own += 1;
                continue;
            }
            Some(false) => {
                operator += 1;
                continue;
            }
            None => {}
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
    if own > 0 {
        skipped.push(format!("{own} under medea's silence"));
    }
    if operator > 0 {
        skipped.push(format!("{operator} under an operator's silence"));
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
                silenced_by: Vec::new(),
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
        let none = SilenceRule {
            own: &[],
            skip_operator: false,
        };
        let (v, s, d) = judge(&alerts, &m, &ignore, none, &["w-1".to_string()]);
        assert_eq!(v, GateVerdict::Pass, "{d}");
        assert!(s.is_empty());
        assert_eq!(
            d,
            "no matching alert is firing (1 ignored, 1 about rebooting nodes)"
        );
        let (v, s, d) = judge(&alerts, &m, &ignore, none, &[]);
        assert_eq!(v, GateVerdict::Fail);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].value, "active");
        assert!(
            d.starts_with(r#"1 alert firing: NodeDown{node="w-1", severity="critical"}"#),
            "{d}"
        );
    }

    #[test]
    fn only_medeas_own_silences_hide_an_alert_unless_the_gate_skips_operators() {
        let m = vec![Matcher::parse(r#"severity="critical""#).unwrap()];
        let silenced = |by: &str| {
            let mut a = alert(&[("alertname", "CephDown"), ("severity", "critical")]);
            if let Some(s) = a.status.as_mut() {
                s.state = "suppressed".into();
                s.silenced_by = vec![by.to_string()];
            }
            a
        };
        let own = vec!["medea-1".to_string()];
        let rule = SilenceRule {
            own: &own,
            skip_operator: false,
        };
        let (v, _, d) = judge(&[silenced("operator-9")], &m, &[], rule, &[]);
        assert_eq!(
            v,
            GateVerdict::Fail,
            "an operator's silence hides nothing: {d}"
        );
        let (v, _, d) = judge(&[silenced("medea-1")], &m, &[], rule, &[]);
        assert_eq!(v, GateVerdict::Pass, "{d}");
        assert_eq!(d, "no matching alert is firing (1 under medea's silence)");
        let skip = SilenceRule {
            own: &own,
            skip_operator: true,
        };
        let (v, _, d) = judge(&[silenced("operator-9")], &m, &[], skip, &[]);
        assert_eq!(v, GateVerdict::Pass, "{d}");
        assert_eq!(
            d,
            "no matching alert is firing (1 under an operator's silence)"
        );
    }
}
