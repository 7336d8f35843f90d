//! What the client retries, and how.
//!
//! Only `UNAVAILABLE` is ever retried, with exponential backoff (`backon`), and never when the
//! cause is a TLS failure (a bad CA or certificate does not heal by waiting).
//!
//! - **Read-only calls** (Version, ServiceList, Etcd*, Read, COSI Get/List, HealthCheck, the
//!   opening of EtcdSnapshot) and **idempotent ones** (ImageService.Pull of the same reference):
//!   retried on any `UNAVAILABLE` that arrives before the first reply message.
//! - **Mutating calls** (LifecycleService.Upgrade, MachineService.Upgrade, Reboot,
//!   ApplyConfiguration): retried *only* when the channel failed to connect (`tonic::ConnectError`
//!   in the error chain), i.e. the request provably never left this process. Any other failure
//!   that leaves the outcome open (`UNAVAILABLE` from the server or a dropped connection, a
//!   timeout, a transport-made `UNKNOWN`/`INTERNAL`, a broken stream) is reported as
//!   [`TalosError::Indeterminate`](super::TalosError::Indeterminate): the caller must re-observe
//!   the node before deciding to call again. An `UNKNOWN` or `INTERNAL` the *server* answered
//!   (decoded from the trailers, no transport cause, not a relayed transport message; see
//!   [`answered_failure`]) proves the handler ran and failed: it is
//!   [`TalosError::Refused`](super::TalosError::Refused), definitive.

use std::error::Error as StdError;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};
use tonic::{Code, Status};

/// Backoff for retried calls. Delays double from `min_delay` up to `max_delay`; `max_attempts`
/// counts the first try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub min_delay: Duration,
    pub max_delay: Duration,
    pub max_attempts: usize,
}

impl Default for RetryPolicy {
    /// 6 attempts over about 8 s (0.25, 0.5, 1, 2, 4 s between them).
    fn default() -> Self {
        RetryPolicy {
            min_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(5),
            max_attempts: 6,
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retries.
    pub fn none() -> RetryPolicy {
        RetryPolicy {
            min_delay: Duration::ZERO,
            max_delay: Duration::ZERO,
            max_attempts: 1,
        }
    }

    fn builder(&self) -> ExponentialBuilder {
        ExponentialBuilder::new()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_max_times(self.max_attempts.saturating_sub(1))
    }
}

/// Whether a call changes the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    ReadOnly,
    Mutating,
}

/// The failure of one attempt.
#[derive(Debug)]
pub(crate) enum Attempt {
    Status(Status),
    /// The client-side deadline passed.
    Timeout(Duration),
}

/// `true` if the chain of `err` holds an error satisfying `pred` (looking inside `io::Error`s,
/// whose `source()` skips the wrapped error).
fn chain_has(
    err: &(dyn StdError + 'static),
    pred: &dyn Fn(&(dyn StdError + 'static)) -> bool,
) -> bool {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if pred(e) {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && chain_has(inner, pred)
        {
            return true;
        }
        cur = e.source();
    }
    false
}

/// The channel could not connect: the request was never sent.
pub(crate) fn is_connect_error(status: &Status) -> bool {
    status.code() == Code::Unavailable
        && status
            .source()
            .is_some_and(|s| chain_has(s, &|e| e.is::<tonic::ConnectError>()))
}

/// The failure is a TLS error (certificate, handshake): retrying will not help.
pub(crate) fn is_tls_error(status: &Status) -> bool {
    status
        .source()
        .is_some_and(|s| chain_has(s, &|e| e.is::<rustls::Error>()))
}

/// Messages of transport failures that a proxy (apid's one-to-one proxy to the target node)
/// relays as a status of its own: the call's fate is open, whatever the code says. grpc-go's
/// wording (`google.golang.org/grpc/internal/transport`, `stream.go`).
const RELAYED_TRANSPORT_FAILURES: &[&str] = &[
    "transport is closing",
    "error reading from server",
    "stream terminated by rst_stream",
    "connection reset",
    "connection refused",
    "broken pipe",
    "unexpected eof",
    "client connection is closing",
];

/// The server answered with a failure of the handler itself: `UNKNOWN` (a plain Go error
/// returned by machined, e.g. "error validating installer image", "upgrade failed") or
/// `INTERNAL` (the installer failed), decoded from the response trailers rather than made up by
/// this client's transport (a transport failure carries its cause as the status' `source`).
/// Such an answer proves the call ran and failed: it is definitive, not a lost reply.
pub(crate) fn answered_failure(status: &Status) -> bool {
    if !matches!(status.code(), Code::Unknown | Code::Internal) || status.source().is_some() {
        return false;
    }
    let msg = status.message().to_ascii_lowercase();
    !msg.is_empty() && !RELAYED_TRANSPORT_FAILURES.iter().any(|t| msg.contains(t))
}

/// Whether one failed attempt may be retried (see the module doc).
pub(crate) fn retryable(kind: CallKind, attempt: &Attempt) -> bool {
    match attempt {
        Attempt::Timeout(_) => false,
        Attempt::Status(s) => {
            if s.code() != Code::Unavailable || is_tls_error(s) {
                return false;
            }
            match kind {
                CallKind::ReadOnly => true,
                CallKind::Mutating => is_connect_error(s),
            }
        }
    }
}

/// A mutating call's error code that proves the server refused before acting.
pub(crate) fn refused_before_acting(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
            | Code::NotFound
            | Code::AlreadyExists
            | Code::OutOfRange
            | Code::ResourceExhausted
    )
}

/// Run `attempt` until it succeeds, fails in a way that is not retryable, or the policy runs
/// out. The closure gets the attempt number (0-based).
pub(crate) async fn run<T, F, Fut>(
    policy: &RetryPolicy,
    kind: CallKind,
    mut attempt: F,
) -> Result<T, Attempt>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T, Attempt>>,
{
    let n = AtomicUsize::new(0);
    let op = || attempt(n.fetch_add(1, Ordering::Relaxed));
    op.retry(policy.builder())
        .sleep(tokio::time::sleep)
        .when(|a: &Attempt| retryable(kind, a))
        .notify(|a: &Attempt, delay: Duration| {
            let what = match a {
                Attempt::Status(s) => s.message().to_string(),
                Attempt::Timeout(d) => format!("timeout after {d:?}"),
            };
            tracing::debug!(error = %what, ?delay, "Talos API unavailable, retrying");
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn connect_refused() -> Status {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        Status::from_error(Box::new(tonic::ConnectError(Box::new(io))))
    }

    fn tls_failure() -> Status {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        Status::from_error(Box::new(tonic::ConnectError(Box::new(io))))
    }

    #[test]
    fn only_a_failure_the_server_answered_is_definitive() {
        // machined's own answers: the call ran and failed
        assert!(answered_failure(&Status::internal(
            "failed to run installer: disk full"
        )));
        assert!(answered_failure(&Status::unknown(
            "error validating installer image \"x\": manifest unknown"
        )));
        // made up by the transport (a cause is attached): the fate of the call is open
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(!answered_failure(&Status::from_error(Box::new(reset))));
        // a transport failure relayed by apid's proxy as a status of its own
        assert!(!answered_failure(&Status::unknown(
            "error reading from server: EOF"
        )));
        assert!(!answered_failure(&Status::internal(
            "stream terminated by RST_STREAM with error code: INTERNAL_ERROR"
        )));
        // other codes are not "ran and failed" answers here
        assert!(!answered_failure(&Status::unavailable("node is rebooting")));
        assert!(!answered_failure(&Status::internal("")));
    }

    #[test]
    fn classifies_failures() {
        let server_unavailable = Attempt::Status(Status::unavailable("node is rebooting"));
        let connect = Attempt::Status(connect_refused());
        let tls = Attempt::Status(tls_failure());
        let invalid = Attempt::Status(Status::invalid_argument("bad"));
        let timeout = Attempt::Timeout(Duration::from_secs(1));

        assert!(retryable(CallKind::ReadOnly, &server_unavailable));
        assert!(retryable(CallKind::ReadOnly, &connect));
        assert!(!retryable(CallKind::ReadOnly, &tls));
        assert!(!retryable(CallKind::ReadOnly, &invalid));
        assert!(!retryable(CallKind::ReadOnly, &timeout));

        assert!(!retryable(CallKind::Mutating, &server_unavailable));
        assert!(retryable(CallKind::Mutating, &connect));
        assert!(!retryable(CallKind::Mutating, &tls));
        assert!(!retryable(CallKind::Mutating, &timeout));

        let Attempt::Status(c) = &connect else {
            unreachable!()
        };
        assert_eq!(c.code(), Code::Unavailable);
        assert!(is_connect_error(c));
        let Attempt::Status(t) = &tls else {
            unreachable!()
        };
        assert!(is_tls_error(t));
    }

    fn assert_between(elapsed: Duration, want_ms: u64) {
        let want = Duration::from_millis(want_ms);
        assert!(
            elapsed >= want && elapsed < want + Duration::from_millis(10),
            "slept {elapsed:?}, want {want:?}"
        );
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(300),
            max_attempts: 5,
        }
    }

    async fn failing_then_ok(
        kind: CallKind,
        failures: usize,
        make: fn() -> Status,
    ) -> (Result<usize, Attempt>, usize) {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let res = run(&policy(), kind, move |i| {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                if i < failures {
                    Err(Attempt::Status(make()))
                } else {
                    Ok(i)
                }
            }
        })
        .await;
        (res, calls.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn read_only_calls_back_off_exponentially_on_unavailable() {
        let start = tokio::time::Instant::now();
        let (res, calls) =
            failing_then_ok(CallKind::ReadOnly, 3, || Status::unavailable("down")).await;
        assert_eq!(res.unwrap(), 3);
        assert_eq!(calls, 4);
        // 100 ms, 200 ms, then capped at 300 ms (the timer wheel may add a tick).
        assert_between(start.elapsed(), 600);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_at_max_attempts() {
        let start = tokio::time::Instant::now();
        let (res, calls) =
            failing_then_ok(CallKind::ReadOnly, 100, || Status::unavailable("down")).await;
        assert!(matches!(res, Err(Attempt::Status(s)) if s.code() == Code::Unavailable));
        assert_eq!(calls, 5);
        assert_between(start.elapsed(), 100 + 200 + 300 + 300);
    }

    #[tokio::test(start_paused = true)]
    async fn mutating_calls_retry_only_connect_failures() {
        let (res, calls) = failing_then_ok(CallKind::Mutating, 1, || {
            Status::unavailable("apid lost the node")
        })
        .await;
        assert!(matches!(res, Err(Attempt::Status(_))));
        assert_eq!(
            calls, 1,
            "a server-side UNAVAILABLE must not be retried for a mutating call"
        );

        let (res, calls) = failing_then_ok(CallKind::Mutating, 2, connect_refused).await;
        assert_eq!(res.unwrap(), 2);
        assert_eq!(calls, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn other_codes_are_not_retried() {
        let (res, calls) =
            failing_then_ok(CallKind::ReadOnly, 1, || Status::internal("boom")).await;
        assert!(matches!(res, Err(Attempt::Status(s)) if s.code() == Code::Internal));
        assert_eq!(calls, 1);
    }
}
