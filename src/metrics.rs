//! Prometheus metrics (OpenMetrics text on `/metrics`).
//!
//! One process-wide registry with typed families; the daemon's parts record into it through
//! the small functions below, so call sites stay one line and label sets stay consistent.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    pub cluster: String,
    pub pool: String,
    pub step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// `talos` or `kubernetes`.
    pub api: String,
    pub method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateLabels {
    pub cluster: String,
    pub gate: String,
    /// `pass` or `fail`.
    pub verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateNameLabels {
    pub cluster: String,
    pub gate: String,
}

pub struct Metrics {
    pub registry: Registry,
    pub plans_computed: Counter,
    pub validation_failures: Counter,
    pub approvals: Family<OutcomeLabels, Counter>,
    pub jobs: Family<StateLabels, Gauge>,
    pub step_seconds: Family<StepLabels, Histogram>,
    pub call_seconds: Family<CallLabels, Histogram>,
    pub call_errors: Family<CallLabels, Counter>,
    pub reload_seconds: Histogram,
    pub gate_evaluations: Family<GateLabels, Counter>,
    pub gate_failing: Family<GateNameLabels, Gauge>,
    pub leader: Gauge,
    pub allowed_signers_reload_failed: Gauge,
}

fn seconds_histogram() -> Histogram {
    // 5 ms … ~45 min
    Histogram::new(exponential_buckets(0.005, 2.5, 16))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("medea");
        let plans_computed = Counter::default();
        registry.register(
            "plans_computed",
            "Plans computed from a new desired or observed basis",
            plans_computed.clone(),
        );
        let validation_failures = Counter::default();
        registry.register(
            "validation_failures",
            "Desired-state revisions rejected by validation",
            validation_failures.clone(),
        );
        let approvals = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "approvals",
            "Approval candidates by verification outcome",
            approvals.clone(),
        );
        let jobs = Family::<StateLabels, Gauge>::default();
        registry.register("rollout_jobs", "Rollout jobs by state", jobs.clone());
        let step_seconds = Family::<StepLabels, Histogram>::new_with_constructor(
            seconds_histogram as fn() -> Histogram,
        );
        registry.register(
            "rollout_step_duration_seconds",
            "Duration of per-node rollout steps",
            step_seconds.clone(),
        );
        let call_seconds = Family::<CallLabels, Histogram>::new_with_constructor(
            seconds_histogram as fn() -> Histogram,
        );
        registry.register(
            "api_call_duration_seconds",
            "Latency of Talos and Kubernetes API calls",
            call_seconds.clone(),
        );
        let call_errors = Family::<CallLabels, Counter>::default();
        registry.register(
            "api_call_errors",
            "Failed Talos and Kubernetes API calls",
            call_errors.clone(),
        );
        let reload_seconds = seconds_histogram();
        registry.register(
            "desired_reload_duration_seconds",
            "Time to load, validate and plan a desired-state revision",
            reload_seconds.clone(),
        );
        let gate_evaluations = Family::<GateLabels, Counter>::default();
        registry.register(
            "rollout_gate_evaluations",
            "Health-gate evaluations of rollouts by verdict",
            gate_evaluations.clone(),
        );
        let gate_failing = Family::<GateNameLabels, Gauge>::default();
        registry.register(
            "rollout_gate_failing",
            "1 while a rollout's health gate failed its last evaluation",
            gate_failing.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 when this replica leads (runs planning writes and the executor)",
            leader.clone(),
        );
        let allowed_signers_reload_failed = Gauge::default();
        registry.register(
            "allowed_signers_reload_failed",
            "1 while the allowed signers file cannot be reloaded (the last good file stays in force)",
            allowed_signers_reload_failed.clone(),
        );
        Metrics {
            registry,
            allowed_signers_reload_failed,
            plans_computed,
            validation_failures,
            approvals,
            jobs,
            step_seconds,
            call_seconds,
            call_errors,
            reload_seconds,
            gate_evaluations,
            gate_failing,
            leader,
        }
    }
}

pub fn global() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(Metrics::new)
}

pub fn observe_step(cluster: &str, pool: &str, step: &str, d: Duration) {
    global()
        .step_seconds
        .get_or_create(&StepLabels {
            cluster: cluster.into(),
            pool: pool.into(),
            step: step.into(),
        })
        .observe(d.as_secs_f64());
}

/// Run one client call and record its latency and success with [`observe_call`] (the port
/// adapters at the edge, `talos::adapter` and `k8s::adapter`, time every call through it).
pub(crate) async fn timed<T, E>(
    api: &'static str,
    method: &'static str,
    call: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let start = std::time::Instant::now();
    let r = call.await;
    observe_call(api, method, start.elapsed(), r.is_ok());
    r
}

/// One health-gate evaluation of a rollout (issue #23).
pub fn gate_evaluation(cluster: &str, gate: &str, pass: bool) {
    let m = global();
    m.gate_evaluations
        .get_or_create(&GateLabels {
            cluster: cluster.to_string(),
            gate: gate.to_string(),
            verdict: if pass { "pass" } else { "fail" }.to_string(),
        })
        .inc();
    m.gate_failing
        .get_or_create(&GateNameLabels {
            cluster: cluster.to_string(),
            gate: gate.to_string(),
        })
        .set(i64::from(!pass));
}

pub fn observe_call(api: &str, method: &str, d: Duration, ok: bool) {
    let l = CallLabels {
        api: api.into(),
        method: method.into(),
    };
    global()
        .call_seconds
        .get_or_create(&l)
        .observe(d.as_secs_f64());
    if !ok {
        global().call_errors.get_or_create(&l).inc();
    }
}

pub fn approval_outcome(outcome: &str) {
    global()
        .approvals
        .get_or_create(&OutcomeLabels {
            outcome: outcome.into(),
        })
        .inc();
}

pub fn set_jobs(state: &str, n: i64) {
    global()
        .jobs
        .get_or_create(&StateLabels {
            state: state.into(),
        })
        .set(n);
}

/// The OpenMetrics exposition of every metric.
#[allow(
    clippy::expect_used,
    reason = "encoding into a String (fmt::Write) cannot fail"
)]
pub fn render() -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &global().registry)
        .expect("encoding to a String cannot fail");
    out
}

/// Serve `/metrics` on `listen` until the future is dropped.
pub async fn serve(listener: tokio::net::TcpListener) -> std::io::Result<()> {
    use axum::routing::get;
    let app = axum::Router::new().route(
        "/metrics",
        get(|| async {
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                render(),
            )
        }),
    );
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render() {
        observe_step("home", "workers", "upgrade", Duration::from_millis(20));
        observe_call("talos", "Version", Duration::from_millis(3), false);
        approval_outcome("approved");
        let text = render();
        assert!(text.contains("medea_rollout_step_duration_seconds_count{cluster=\"home\",pool=\"workers\",step=\"upgrade\"}"), "{text}");
        assert!(
            text.contains("medea_api_call_errors_total{api=\"talos\",method=\"Version\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("medea_approvals_total{outcome=\"approved\"}"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
