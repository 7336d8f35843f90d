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
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};

/// The prefix of every family's name.
const PREFIX: &str = "medea";

/// The registry and the name and type of every family registered in it (prometheus-client
/// prints no `# TYPE` line for a family without samples, and has no iterator).
struct Registering {
    registry: Registry,
    families: Vec<(String, MetricType)>,
}

impl Registering {
    fn register<M: Metric + TypedMetric>(&mut self, name: &str, help: &str, metric: M) {
        self.families.push((format!("{PREFIX}_{name}"), M::TYPE));
        self.registry.register(name, help, metric);
    }
}

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
    /// `pass`, `fail` or `inconclusive` (issue #35).
    pub verdict: String,
    /// `true` for a `dryRun` gate (shown and notified, never blocking; issue #51: the alert
    /// rules leave them out), else `false`.
    pub dry_run: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateNameLabels {
    pub cluster: String,
    pub gate: String,
    /// As [`GateLabels::dry_run`].
    pub dry_run: String,
}

/// `{cluster, bound}` of the predicted job duration (bound: `median` or `pessimistic`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BoundLabels {
    pub cluster: String,
    pub bound: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub cluster: String,
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HaltLabels {
    pub cluster: String,
    /// The halt reason's stable code (`drain_timeout`, `gate_failed`, …).
    pub code: String,
}

/// Per-cluster rollout state, set from the store's jobs on every rescan (`set_rollouts`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutGauges {
    /// Running jobs: cluster → start (Unix seconds).
    pub started: Vec<(String, i64)>,
    /// Running jobs: cluster → (seconds on the job's clock, whether it waits for a window or
    /// exclusion or has not started). Issue #51.
    pub clock: Vec<(String, (i64, bool))>,
    /// Running jobs' machine upgrades (one per machine and Talos hop): (cluster, pool) → (done, total).
    pub nodes: Vec<((String, String), (i64, i64))>,
    /// Each cluster whose newest job halted (1) or not (0).
    pub halted: Vec<(String, i64)>,
}

pub struct Metrics {
    pub registry: Registry,
    /// Every family's full name and type, whether or not it has samples yet.
    pub families: Vec<(String, MetricType)>,
    pub job_started: Family<ClusterLabels, Gauge>,
    /// The running job's clock (issue #51): seconds that count against its prediction.
    pub job_active: Family<ClusterLabels, Gauge>,
    /// 1 while the running job waits for a maintenance window or exclusion (or its first).
    pub job_waiting_window: Family<ClusterLabels, Gauge>,
    /// The running job's predicted duration (issue #36), per bound.
    pub job_predicted: Family<BoundLabels, Gauge>,
    pub job_nodes_done: Family<PoolLabels, Gauge>,
    pub job_nodes_total: Family<PoolLabels, Gauge>,
    pub cluster_halted: Family<ClusterLabels, Gauge>,
    pub halts: Family<HaltLabels, Counter>,
    pub plan_has_changes: Gauge,
    pub plan_approvals_missing: Gauge,
    pub reconcile_seconds: Histogram,
    pub refresh_failures: Counter,
    pub last_refresh: Gauge,
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
    /// Scheduled etcd backups (issue #37).
    pub backup: BackupMetrics,
}

/// The scheduled etcd backups' families (issue #37), per cluster.
pub struct BackupMetrics {
    pub last_success: Family<ClusterLabels, Gauge>,
    pub seconds: Family<ClusterLabels, Histogram>,
    pub size: Family<ClusterLabels, Gauge>,
    pub failures: Family<ClusterLabels, Counter>,
    pub interval: Family<ClusterLabels, Gauge>,
}

impl BackupMetrics {
    fn register(registry: &mut Registering) -> BackupMetrics {
        let last_success = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "backup_last_success_timestamp_seconds",
            "When the newest recorded etcd backup of a cluster was taken (Unix seconds)",
            last_success.clone(),
        );
        let seconds = Family::<ClusterLabels, Histogram>::new_with_constructor(seconds_histogram);
        registry.register(
            "backup_duration_seconds",
            "Time to stream, check, encrypt and write one etcd backup",
            seconds.clone(),
        );
        let size = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "backup_size_bytes",
            "Size of the newest recorded (encrypted) etcd backup of a cluster",
            size.clone(),
        );
        let failures = Family::<ClusterLabels, Counter>::default();
        registry.register(
            "backup_failures",
            "Scheduled or manual etcd backups that failed (nothing was recorded)",
            failures.clone(),
        );
        let interval = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "backup_interval_seconds",
            "The period of a cluster's backup schedule now (from its latest slot to the next)",
            interval.clone(),
        );
        BackupMetrics {
            interval,
            last_success,
            seconds,
            size,
            failures,
        }
    }
}

/// A backup of `cluster` taken at `taken_at` (Unix seconds), `size` bytes, in `took`.
pub fn backup_taken(cluster: &str, taken_at: i64, size: u64, took: Duration) {
    let l = ClusterLabels {
        cluster: cluster.into(),
    };
    let b = &global().backup;
    b.last_success.get_or_create(&l).set(taken_at);
    b.size
        .get_or_create(&l)
        .set(i64::try_from(size).unwrap_or(i64::MAX));
    b.seconds.get_or_create(&l).observe(took.as_secs_f64());
}

/// The state of `cluster`'s backups after a schedule pass (from the store, so it survives a
/// restart and a failover): its schedule's period and its newest backup.
pub fn backup_status(cluster: &str, interval_secs: Option<u64>, newest: Option<(i64, u64)>) {
    let l = ClusterLabels {
        cluster: cluster.into(),
    };
    let b = &global().backup;
    if let Some(i) = interval_secs {
        b.interval
            .get_or_create(&l)
            .set(i64::try_from(i).unwrap_or(i64::MAX));
    }
    if let Some((at, size)) = newest {
        b.last_success.get_or_create(&l).set(at);
        b.size
            .get_or_create(&l)
            .set(i64::try_from(size).unwrap_or(i64::MAX));
    }
}

/// A backup of `cluster` failed.
pub fn backup_failed(cluster: &str) {
    global()
        .backup
        .failures
        .get_or_create(&ClusterLabels {
            cluster: cluster.into(),
        })
        .inc();
}

fn seconds_histogram() -> Histogram {
    // 5 ms … ~45 min
    Histogram::new(exponential_buckets(0.005, 2.5, 16))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registering {
            registry: Registry::with_prefix(PREFIX),
            families: Vec::new(),
        };
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
            "1 while a rollout's health gate did not pass its last evaluation (failed or inconclusive); dry_run=\"true\" for a dryRun gate, which never blocks",
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
        let job_started = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "rollout_job_started_timestamp_seconds",
            "Start of each cluster's running rollout job (Unix seconds); absent when none runs",
            job_started.clone(),
        );
        let job_active = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "rollout_job_active_seconds",
            "Seconds of each cluster's running rollout job that count against its prediction: from its first command, less its waits for maintenance windows and exclusions (0 before its first command); absent when none runs",
            job_active.clone(),
        );
        let job_waiting_window = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "rollout_job_waiting_for_window",
            "1 while each cluster's running rollout job waits for a maintenance window or the end of an exclusion (its clock stands still), or for its first window; absent when none runs",
            job_waiting_window.clone(),
        );
        let job_predicted = Family::<BoundLabels, Gauge>::default();
        registry.register(
            "rollout_job_predicted_seconds",
            "Predicted duration of each cluster's running rollout job (bound: median or pessimistic; advice from the plan); absent when none runs or the plan predicted none",
            job_predicted.clone(),
        );
        let job_nodes_done = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "rollout_job_nodes_done",
            "Machine upgrades (a machine in one Talos hop) of the running job that are done, per pool",
            job_nodes_done.clone(),
        );
        let job_nodes_total = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "rollout_job_nodes",
            "Machine upgrades (a machine in one Talos hop) of the running job, per pool",
            job_nodes_total.clone(),
        );
        let cluster_halted = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "rollout_cluster_halted",
            "1 while a cluster's newest rollout job is halted (it never continues by itself)",
            cluster_halted.clone(),
        );
        let halts = Family::<HaltLabels, Counter>::default();
        registry.register(
            "rollout_halts",
            "Rollout jobs that halted, by cluster and reason code",
            halts.clone(),
        );
        let plan_has_changes = Gauge::default();
        registry.register(
            "plan_has_changes",
            "1 while the current plan has changes (something waits for approval or runs)",
            plan_has_changes.clone(),
        );
        let plan_approvals_missing = Gauge::default();
        registry.register(
            "plan_approvals_missing",
            "Approvals the current plan still needs (0 when approved or nothing to approve)",
            plan_approvals_missing.clone(),
        );
        let reconcile_seconds = seconds_histogram();
        registry.register(
            "reconcile_duration_seconds",
            "Time of one reconcile pass (plan, approvals, job start)",
            reconcile_seconds.clone(),
        );
        let refresh_failures = Counter::default();
        registry.register(
            "inventory_refresh_failures",
            "Inventory refresh passes that failed",
            refresh_failures.clone(),
        );
        let last_refresh = Gauge::default();
        registry.register(
            "inventory_last_refresh_timestamp_seconds",
            "End of the last successful inventory refresh (Unix seconds)",
            last_refresh.clone(),
        );
        let backup = BackupMetrics::register(&mut registry);
        Metrics {
            backup,
            registry: registry.registry,
            families: registry.families,
            job_started,
            job_active,
            job_waiting_window,
            job_predicted,
            job_nodes_done,
            job_nodes_total,
            cluster_halted,
            halts,
            plan_has_changes,
            plan_approvals_missing,
            reconcile_seconds,
            refresh_failures,
            last_refresh,
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

/// One health-gate evaluation of a rollout (issue #23): `verdict` is `pass`, `fail` or
/// `inconclusive` (issue #35); the failing gauge is 1 for anything but a pass. A dry-run
/// gate's series carry `dry_run="true"` (issue #51), which the alert rules leave out.
pub fn gate_evaluation(cluster: &str, gate: &str, verdict: &str, dry_run: bool) {
    let m = global();
    let pass = verdict == "pass";
    m.gate_evaluations
        .get_or_create(&GateLabels {
            cluster: cluster.to_string(),
            gate: gate.to_string(),
            verdict: verdict.to_string(),
            dry_run: dry_run.to_string(),
        })
        .inc();
    m.gate_failing
        .get_or_create(&GateNameLabels {
            cluster: cluster.to_string(),
            gate: gate.to_string(),
            dry_run: dry_run.to_string(),
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

/// The per-cluster rollout gauges, replaced as a whole (a cluster whose job ended loses its
/// series).
pub fn set_rollouts(g: &RolloutGauges) {
    let m = global();
    m.job_started.clear();
    m.job_active.clear();
    m.job_waiting_window.clear();
    m.job_nodes_done.clear();
    m.job_nodes_total.clear();
    for (cluster, at) in &g.started {
        m.job_started
            .get_or_create(&ClusterLabels {
                cluster: cluster.clone(),
            })
            .set(*at);
    }
    for (cluster, (active, waiting)) in &g.clock {
        let l = ClusterLabels {
            cluster: cluster.clone(),
        };
        m.job_active.get_or_create(&l).set(*active);
        m.job_waiting_window
            .get_or_create(&l)
            .set(i64::from(*waiting));
    }
    for ((cluster, pool), (done, total)) in &g.nodes {
        let l = PoolLabels {
            cluster: cluster.clone(),
            pool: pool.clone(),
        };
        m.job_nodes_done.get_or_create(&l).set(*done);
        m.job_nodes_total.get_or_create(&l).set(*total);
    }
    for (cluster, halted) in &g.halted {
        m.cluster_halted
            .get_or_create(&ClusterLabels {
                cluster: cluster.clone(),
            })
            .set(*halted);
    }
}

/// The running jobs' predicted durations, replaced as a whole: (cluster, median seconds,
/// pessimistic seconds).
pub fn set_job_predicted(jobs: &[(String, u64, u64)]) {
    let m = global();
    m.job_predicted.clear();
    for (cluster, median, pessimistic) in jobs {
        for (bound, v) in [("median", median), ("pessimistic", pessimistic)] {
            m.job_predicted
                .get_or_create(&BoundLabels {
                    cluster: cluster.clone(),
                    bound: bound.into(),
                })
                .set(i64::try_from(*v).unwrap_or(i64::MAX));
        }
    }
}

/// A rollout job halted.
pub fn halted(cluster: &str, code: &str) {
    global()
        .halts
        .get_or_create(&HaltLabels {
            cluster: cluster.into(),
            code: code.into(),
        })
        .inc();
}

/// The current plan after a reconcile pass of `d`.
pub fn plan_pass(d: Duration, has_changes: bool, approvals_missing: u32) {
    let m = global();
    m.reconcile_seconds.observe(d.as_secs_f64());
    m.plan_has_changes.set(i64::from(has_changes));
    m.plan_approvals_missing.set(i64::from(approvals_missing));
}

/// An inventory refresh pass ended (`ok`: without error) at `now`.
pub fn refresh_pass(ok: bool, now: jiff::Timestamp) {
    let m = global();
    if ok {
        m.last_refresh.set(now.as_second());
    } else {
        m.refresh_failures.inc();
    }
}

/// The name of every sample medea can export: each family with the suffixes its type gives
/// (`_total` for counters, `_bucket`/`_sum`/`_count` for histograms, `_created` for both).
/// What deploy/'s dashboard and alert rules may name.
pub fn sample_names() -> Vec<String> {
    let mut names = Vec::new();
    for (name, kind) in &global().families {
        let suffixes: &[&str] = match kind {
            MetricType::Counter => &["_total", "_created"],
            MetricType::Histogram => &["_bucket", "_sum", "_count", "_created"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    names
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

/// The `/metrics` route (the server serves it on `--metrics-listen`, under
/// `server::listen`'s limits).
pub fn router() -> axum::Router {
    use axum::routing::get;
    axum::Router::new().route(
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
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render() {
        observe_step("home", "workers", "upgrade", Duration::from_millis(20));
        observe_call("talos", "Version", Duration::from_millis(3), false);
        set_job_predicted(&[("home".into(), 600, 900)]);
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
        assert!(
            text.contains(
                "medea_rollout_job_predicted_seconds{cluster=\"home\",bound=\"pessimistic\"} 900"
            ),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
