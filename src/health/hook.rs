//! HTTP hooks (issue #35 item 2): `POST` of a rollout's hook event to the URL the approved
//! plan names, through the health sources' HTTP client ([`super::http`]: the same bounds, the
//! credential named in the plan and read from the server's own files at the moment of the
//! request, never logged), retried with backoff until a 2xx answer or the hook's timeout.

use std::time::Duration;

use super::http;
use crate::desired::hooks::HookAction;
use crate::plan::health::Endpoint;
use crate::rollout::ports::{HookReport, HookRequest};

/// First pause between two requests of a hook; doubled after each, up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest pause between two requests of a hook.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Whether an error of the client is worth another request (the receiver did not answer);
/// a credential medea cannot use fails at once, naming the file.
fn retryable(e: &http::HttpError) -> bool {
    matches!(
        e,
        http::HttpError::Request { .. }
            | http::HttpError::Timeout { .. }
            | http::HttpError::Body { .. }
    )
}

/// Run the HTTP hook of `req` to its end: each request bounded by `request_timeout` (and the
/// time left), paused between requests by a backoff from [`FIRST_BACKOFF`] to
/// [`MAX_BACKOFF`], for at most the hook's timeout.
pub async fn call(
    credentials: &http::Credentials,
    req: &HookRequest,
    request_timeout: Duration,
) -> HookReport {
    let HookAction::Http { url, credential } = &req.hook.action else {
        return HookReport::failed("not an HTTP hook");
    };
    let endpoint = Endpoint {
        url: url.clone(),
        credential: credential.clone(),
    };
    let body = req.event().to_string();
    let timeout = req.hook.timeout;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = FIRST_BACKOFF;
    let mut requests = 0u32;
    let mut last = String::from("no request was made");
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        requests += 1;
        let answer = http::exchange(
            &endpoint,
            credentials,
            http::Request::Post {
                content_type: "application/json",
                body: body.clone(),
            },
            "",
            request_timeout.min(left),
        )
        .await;
        match answer {
            Ok(a) if (200..300).contains(&a.status) => {
                tracing::info!(cluster = %req.cluster, job = %req.job, hook = %req.hook.name, point = %req.point, status = a.status, requests, "hook answered");
                return HookReport {
                    succeeded: true,
                    detail: format!("{url} answered HTTP {} (request {requests})", a.status),
                    exit_code: None,
                    log_tail: None,
                };
            }
            Ok(a) => {
                last = format!(
                    "{url} answered HTTP {}: {}",
                    a.status,
                    http::excerpt(&a.body)
                );
            }
            Err(e) if retryable(&e) => last = crate::error_chain(&e),
            Err(e) => {
                return HookReport::failed(format!(
                    "cannot call {url}: {}",
                    crate::error_chain(&e)
                ));
            }
        }
        tracing::warn!(cluster = %req.cluster, job = %req.job, hook = %req.hook.name, point = %req.point, requests, detail = %last, "hook not answered with 2xx; retrying");
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(MAX_BACKOFF);
    }
    HookReport::failed(format!(
        "no 2xx answer within {} ({requests} request(s)); last: {last}",
        crate::desired::model::format_duration(timeout)
    ))
}
