//! Notifications: JSON webhooks (with a Slack-compatible `text` field) on plan and rollout
//! events, delivered from a bounded queue with retries. Never blocks the caller: when the queue
//! is full the event is dropped and counted.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use http_body_util::Full;
use hyper::body::Bytes;
use serde::Serialize;
use tokio::sync::mpsc;

/// Queue depth; beyond it events are dropped (and logged), never waited for.
pub const QUEUE: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventKind {
    #[serde(rename = "plan.ready")]
    PlanReady,
    #[serde(rename = "approval.received")]
    ApprovalReceived,
    #[serde(rename = "rollout.started")]
    RolloutStarted,
    #[serde(rename = "rollout.node_done")]
    NodeDone,
    #[serde(rename = "rollout.halted")]
    RolloutHalted,
    /// A health gate failed an evaluation (issue #23); `reason` says why.
    #[serde(rename = "rollout.gate_failed")]
    GateFailed,
    /// A health gate could not be evaluated: source unreachable, query error, no value
    /// (issue #35); `reason` says why.
    #[serde(rename = "rollout.gate_inconclusive")]
    GateInconclusive,
    /// A node installed ahead (`rollout.stage: ahead`) rebooted outside medea's step and so
    /// booted the target (issue #36).
    #[serde(rename = "rollout.node_rebooted_externally")]
    NodeRebootedExternally,
    /// A health gate with `onInconclusive: pause` could not tell: the job waits for
    /// `medea rollout resume` (issue #51 item 4).
    #[serde(rename = "rollout.paused")]
    RolloutPaused,
    #[serde(rename = "rollout.succeeded")]
    RolloutSucceeded,
    /// A running job passed the pessimistic bound of its predicted duration (issue #36).
    #[serde(rename = "rollout.overdue")]
    RolloutOverdue,
    /// A scheduled or manual etcd backup was taken and recorded (issue #37).
    #[serde(rename = "backup.taken")]
    BackupTaken,
    /// An etcd backup failed; nothing was recorded (issue #37). `reason` says why.
    #[serde(rename = "backup.failed")]
    BackupFailed,
}

/// The JSON body of a notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Notification {
    pub event: EventKind,
    /// One human-readable line; Slack and compatible receivers display it. Serialized with
    /// `&`, `<` and `>` escaped as Slack requires ([`slack_escape`]), so text a committer
    /// controls (a reason, a name) cannot become a mention or a link; the raw values are in the
    /// structured fields.
    #[serde(serialize_with = "serialize_slack_text")]
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The stable code of `reason` for a halt (`rollout.halted`), e.g. `upgrade_refused`.
    #[serde(rename = "haltCode", skip_serializing_if = "Option::is_none")]
    pub halt_code: Option<String>,
    /// RFC 3339.
    pub at: String,
}

/// `text` as Slack's message formatting wants it: `&` → `&amp;`, `<` → `&lt;`, `>` → `&gt;`
/// (<https://api.slack.com/reference/surfaces/formatting#escaping>). Nothing else is changed.
pub fn slack_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

fn serialize_slack_text<S: serde::Serializer>(text: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&slack_escape(text))
}

#[derive(Clone)]
pub struct Notifier {
    tx: Option<mpsc::Sender<Notification>>,
}

impl Notifier {
    /// A notifier that sends nowhere (no `--webhook` given).
    pub fn disabled() -> Notifier {
        Notifier { tx: None }
    }

    /// Start delivery to `urls` in a background task.
    #[allow(
        clippy::expect_used,
        reason = "notifications are plain structs with string keys: serializing them cannot fail"
    )]
    pub fn start(urls: Vec<String>) -> Notifier {
        if urls.is_empty() {
            return Notifier::disabled();
        }
        let (tx, mut rx) = mpsc::channel::<Notification>(QUEUE);
        tokio::spawn(async move {
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_native_roots()
                .map(|b| b.https_or_http().enable_http1().build());
            let https = match https {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "webhooks disabled: no TLS root certificates");
                    return;
                }
            };
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build::<_, Full<Bytes>>(https);
            while let Some(n) = rx.recv().await {
                let body = serde_json::to_vec(&n).expect("notifications serialize");
                for url in &urls {
                    let send = || async {
                        let req = hyper::Request::post(url.as_str())
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(body.clone())))
                            .map_err(|e| e.to_string())?;
                        let resp =
                            tokio::time::timeout(Duration::from_secs(10), client.request(req))
                                .await
                                .map_err(|_| "timed out".to_string())?
                                .map_err(|e| crate::error_chain(&e))?;
                        if resp.status().is_success() {
                            Ok(())
                        } else {
                            Err(format!("HTTP {}", resp.status()))
                        }
                    };
                    let result = send
                        .retry(
                            ExponentialBuilder::default()
                                .with_min_delay(Duration::from_millis(200))
                                .with_max_times(4),
                        )
                        .await;
                    if let Err(e) = result {
                        tracing::warn!(webhook = %redact_url(url), event = %serde_json::to_value(n.event).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(), error = %e, "webhook delivery failed");
                    }
                }
            }
        });
        Notifier { tx: Some(tx) }
    }

    /// Queue a notification; never waits.
    pub fn send(&self, n: Notification) {
        if let Some(tx) = &self.tx
            && let Err(e) = tx.try_send(n)
        {
            tracing::warn!(error = %e, "webhook queue full or closed: notification dropped");
        }
    }
}

/// Webhook URLs often carry a secret in the path (Slack), the query (`?token=`) or the
/// userinfo (`user:pass@`): log only scheme, host and port.
pub fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}/…")
        }
        None => "<invalid url>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_shape_and_redaction() {
        let n = Notification {
            event: EventKind::RolloutHalted,
            text: "rollout halted".into(),
            cluster: Some("prod".into()),
            plan: None,
            job: Some("j1".into()),
            node: Some("w-1".into()),
            reason: Some("node reverted".into()),
            halt_code: Some("node_reverted".into()),
            at: "2026-12-02T12:00:00Z".into(),
        };
        let v: serde_json::Value = serde_json::to_value(&n).unwrap();
        assert_eq!(v["event"], "rollout.halted");
        assert_eq!(v["text"], "rollout halted");
        assert_eq!(v["haltCode"], "node_reverted");
        assert!(v.get("plan").is_none());
        assert_eq!(
            redact_url("https://hooks.slack.com/services/T/B/SECRET"),
            "https://hooks.slack.com/…"
        );
        // Issue 19: userinfo and query strings never reach a log line.
        for url in [
            "https://user:SECRET@hooks.example.com/x",
            "https://user:SECRET@hooks.example.com",
            "https://hooks.example.com?token=SECRET",
            "https://hooks.example.com:8443?token=SECRET#SECRET",
            "https://hooks.example.com#SECRET",
            "https://a@b:SECRET@hooks.example.com/",
        ] {
            let r = redact_url(url);
            assert!(!r.contains("SECRET"), "{url} -> {r}");
            assert!(r.starts_with("https://hooks.example.com"), "{url} -> {r}");
        }
    }

    /// Issue 32: attacker text reached Slack unescaped (`<!channel>`, `<http://x|click>`).
    #[test]
    fn slack_text_is_escaped_and_structured_fields_stay_raw() {
        let n = Notification {
            event: EventKind::RolloutHalted,
            text: "halted: <!channel> & <https://evil.example|click here>".into(),
            cluster: Some("prod".into()),
            plan: None,
            job: None,
            node: None,
            reason: Some("<!channel> & <https://evil.example|click here>".into()),
            halt_code: None,
            at: "t".into(),
        };
        let v: serde_json::Value = serde_json::to_value(&n).unwrap();
        assert_eq!(
            v["text"],
            "halted: &lt;!channel&gt; &amp; &lt;https://evil.example|click here&gt;"
        );
        assert_eq!(
            v["reason"],
            "<!channel> & <https://evil.example|click here>"
        );
        assert_eq!(slack_escape("a → b"), "a → b");
    }

    #[tokio::test]
    async fn a_full_queue_drops_instead_of_blocking() {
        let (tx, _rx) = mpsc::channel(1);
        let n = Notifier { tx: Some(tx) };
        let ev = Notification {
            event: EventKind::PlanReady,
            text: "x".into(),
            cluster: None,
            plan: None,
            job: None,
            node: None,
            reason: None,
            halt_code: None,
            at: "t".into(),
        };
        n.send(ev.clone());
        n.send(ev); // would block on a bounded send; must return at once
    }
}
