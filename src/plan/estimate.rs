//! Predicted duration of a cluster's rollout (issue #36 item 3): advice shown with every plan,
//! never part of its id.
//!
//! Pure: the history ([`History`], built by `rollout::history` from the journal of the
//! cluster's last successful jobs), the plan's steps, the windows and exclusions and the time
//! come in; an [`Estimate`] comes out.
//!
//! The model, per cluster: a Talos wave takes one node's time (its nodes run together, up to
//! `maxUnavailable`), plus the gates' soak when the step has gates; a pool takes the sum of its
//! waves over all its hops; the Kubernetes step takes one node's Kubernetes time per node (they
//! go one at a time); the job takes the sum. One node's time is the median of the history's
//! samples of that kind (control-plane or worker Talos node, Kubernetes node) for the median
//! bound, and for the pessimistic bound the largest sample plus a quarter, at least the median
//! plus a half. A kind without samples uses [`Defaults`], and the estimate says so.
//!
//! With maintenance windows or exclusions, the wall clock is walked from `now`: a wave (or a
//! Kubernetes node) starts only when a window is open and no exclusion holds its change, and
//! the estimate says how many window openings the job needs and when it is expected to end.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::desired::exclusion::{Change, Exclusion, free_from};
use crate::desired::window::{MaintenanceWindow, open_at};
use crate::inventory::MachineRole;
use crate::plan::model::{ClusterPlan, Step};

/// How many of a cluster's last successful jobs the history reads: bounds the cost of an
/// estimate (the journal of older jobs is never read).
pub const HISTORY_JOBS: usize = 5;

/// Durations of one job's work, as its journal recorded them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobSamples {
    /// Per control-plane Talos node: from its first command of the step (its pull, or its
    /// cordon when it was pulled ahead) to its uncordon.
    pub controlplane_node: Vec<Duration>,
    /// Per worker Talos node, measured the same way.
    pub worker_node: Vec<Duration>,
    /// Per control-plane Talos wave: from its first cordon to the next wave's first cordon
    /// (the last wave: to its last uncordon), less the step's gate soak. It holds what node
    /// samples miss: a wave lasts as long as its slowest node, and the executor's own time
    /// between waves.
    pub controlplane_wave: Vec<Duration>,
    /// Per worker Talos wave, measured the same way.
    pub worker_wave: Vec<Duration>,
    /// Per node of a Kubernetes step: the step's span divided by its nodes.
    pub kubernetes_node: Vec<Duration>,
    /// Per node phase (`pull`, `drain`, `install`, `reboot`), for the plan's detail line:
    /// pull intent → result, cordon intent → drain result, upgrade intent → result, reboot
    /// (or legacy upgrade) → uncordon.
    pub phases: std::collections::BTreeMap<String, Vec<Duration>>,
    /// Per pool (issue #51 item 2): its own node and wave samples, measured as above, so a
    /// slow pool is predicted from its own history rather than its role's.
    pub pools: std::collections::BTreeMap<String, PoolSamples>,
}

/// One pool's samples in one job (issue #51 item 2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSamples {
    /// Per Talos node of the pool (see [`JobSamples::worker_node`]).
    pub node: Vec<Duration>,
    /// Per Talos wave of the pool (see [`JobSamples::worker_wave`]).
    pub wave: Vec<Duration>,
}

/// The samples of a cluster's last jobs (at most [`HISTORY_JOBS`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// One entry per job, newest first.
    pub jobs: Vec<JobSamples>,
}

/// The documented defaults a kind without history falls back to (design/rollout.md,
/// "Predicted duration").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defaults {
    /// A control-plane Talos node: pull, etcd checks, drain, install, reboot, back.
    pub controlplane_node: Duration,
    /// A worker Talos node.
    pub worker_node: Duration,
    /// One node of the Kubernetes step.
    pub kubernetes_node: Duration,
}

/// The defaults: 10 minutes per control-plane node, 8 per worker, 3 per Kubernetes node
/// (a pull of the installer, a drain, an install and a bare-metal reboot; a static pod or
/// kubelet restart and its readiness).
pub const DEFAULTS: Defaults = Defaults {
    controlplane_node: Duration::from_secs(600),
    worker_node: Duration::from_secs(480),
    kubernetes_node: Duration::from_secs(180),
};

/// A duration, two ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bounds {
    /// The median prediction, in seconds.
    pub median_secs: u64,
    /// The pessimistic bound, in seconds.
    pub pessimistic_secs: u64,
}

impl Bounds {
    /// Whether a job `elapsed` long is past the pessimistic bound (the overdue event, the
    /// status line and the metric's alert all use this one rule).
    pub fn overdue(self, elapsed: Duration) -> bool {
        elapsed.as_secs() > self.pessimistic_secs
    }
    /// The status line comparing `elapsed` with these bounds: `elapsed 12m00s, predicted
    /// median 10m00s, pessimistic 15m00s` and, past the bound, `: past the pessimistic bound`.
    pub fn progress(self, elapsed: Duration) -> String {
        format!(
            "elapsed {}, predicted median {}, pessimistic {}{}",
            human(elapsed.as_secs()),
            human(self.median_secs),
            human(self.pessimistic_secs),
            if self.overdue(elapsed) {
                ": past the pessimistic bound"
            } else {
                ""
            }
        )
    }
}

/// Where a kind's node time came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    /// Samples of the pool's own nodes in the cluster's last jobs (issue #51 item 2).
    Pool,
    /// Samples of the cluster's last jobs: for a pool, of every pool of its role (its own
    /// history has none), labelled so in the plan.
    History,
    /// [`DEFAULTS`]: no job of the cluster recorded this kind of work.
    Default,
}

/// One pool's prediction (all its hops).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolEstimate {
    /// The pool.
    pub pool: String,
    /// Its waves, over all hops.
    pub waves: u32,
    /// How long they take, windows aside.
    #[serde(flatten)]
    pub bounds: Bounds,
    /// Where its node time came from.
    pub source: Source,
}

/// One cluster's prediction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Estimate {
    /// The cluster.
    pub cluster: String,
    /// Per pool, in plan order.
    pub pools: Vec<PoolEstimate>,
    /// The Kubernetes step, if the plan has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<PoolEstimate>,
    /// The whole job, windows aside.
    #[serde(flatten)]
    pub total: Bounds,
    /// How many successful jobs the history held (0: every figure is a default).
    pub history_jobs: u32,
    /// Per-node phase medians from the history (`pull`, `drain`, `install`, `reboot`), in
    /// seconds.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub phases: std::collections::BTreeMap<String, u64>,
    /// With windows or exclusions and a known time: the wall clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<Calendar>,
}

/// When the job is expected to end once windows and exclusions are counted, if started at
/// the time of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Calendar {
    /// Window openings the job needs (median bound); 0 without windows.
    pub windows: u32,
    /// Window openings at the pessimistic bound.
    pub windows_pessimistic: u32,
    /// The expected end (median bound).
    pub finish: String,
    /// The end at the pessimistic bound.
    pub finish_pessimistic: String,
    /// The walk gave up (no window ahead, or more than [`MAX_WALK`] waits): the finish is
    /// unknown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unbounded: bool,
}

/// The most waits the calendar walk makes before it gives up.
pub const MAX_WALK: usize = 10_000;

fn median(v: &[Duration]) -> Option<Duration> {
    let mut s = v.to_vec();
    s.sort();
    (!s.is_empty()).then(|| s[s.len() / 2])
}

/// Node-time bounds of samples: the median, and the largest sample plus a quarter (at least
/// the median plus a half); `None` without samples.
pub fn bounds_of(samples: &[Duration]) -> Option<Bounds> {
    span_of(samples).map(Span::bounds)
}

/// [`bounds_of`] before rounding: sums and products of spans round once, at the end, so a
/// pool of many short waves does not gather a rounding error per wave.
fn span_of(samples: &[Duration]) -> Option<Span> {
    let m = median(samples)?;
    let max = samples.iter().max().copied().unwrap_or(m);
    let pess = (max + max / 4).max(m + m / 2);
    Some(Span {
        median: m.max(Duration::from_secs(1)),
        pessimistic: pess.max(Duration::from_secs(1)),
    })
}

/// A duration, two ways, before rounding to [`Bounds`]' whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    median: Duration,
    pessimistic: Duration,
}

impl Span {
    const ZERO: Span = Span {
        median: Duration::ZERO,
        pessimistic: Duration::ZERO,
    };
    fn add(self, other: Span) -> Span {
        Span {
            median: self.median.saturating_add(other.median),
            pessimistic: self.pessimistic.saturating_add(other.pessimistic),
        }
    }
    fn times(self, n: u32) -> Span {
        Span {
            median: self.median.saturating_mul(n),
            pessimistic: self.pessimistic.saturating_mul(n),
        }
    }
    fn bounds(self) -> Bounds {
        Bounds {
            median_secs: nearest_secs(self.median),
            pessimistic_secs: nearest_secs(self.pessimistic),
        }
    }
}

/// `d` in whole seconds, rounded to the nearest: a node that takes 6.9 s counts 7, not 6
/// (truncating made every prediction of short steps run short by up to a second a wave).
fn nearest_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_millis() >= 500)
}

/// Default bounds: the default, and twice it.
fn default_span(d: Duration) -> Span {
    Span {
        median: d,
        pessimistic: d.saturating_mul(2),
    }
}

fn kind(history: &History, pick: fn(&JobSamples) -> &Vec<Duration>, d: Duration) -> (Span, Source) {
    match waves(history, pick) {
        Some(found) => found,
        None => (default_span(d), Source::Default),
    }
}

/// The span of one kind of samples from history alone; `None` without samples.
fn waves(history: &History, pick: fn(&JobSamples) -> &Vec<Duration>) -> Option<(Span, Source)> {
    let all: Vec<Duration> = history
        .jobs
        .iter()
        .flat_map(|j| pick(j).iter().copied())
        .collect();
    span_of(&all).map(|b| (b, Source::History))
}

/// A pool's span from its own history: its waves where it has wave samples, else its nodes;
/// `None` when no job recorded the pool.
fn pool_span(history: &History, pool: &str) -> Option<(Span, Source)> {
    let of = |pick: fn(&PoolSamples) -> &Vec<Duration>| -> Vec<Duration> {
        history
            .jobs
            .iter()
            .filter_map(|j| j.pools.get(pool))
            .flat_map(|p| pick(p).iter().copied())
            .collect()
    };
    span_of(&of(|p| &p.wave))
        .or_else(|| span_of(&of(|p| &p.node)))
        .map(|s| (s, Source::Pool))
}

/// One unit of work in time order: a wave or a Kubernetes node, its change (for exclusions)
/// and its bounds.
struct Unit {
    change: Change,
    bounds: Bounds,
}

/// The prediction of `plan` (one cluster's section) from `history`; with `now`, the wall
/// clock through `windows` and `exclusions`.
pub fn estimate(
    plan: &ClusterPlan,
    history: &History,
    defaults: &Defaults,
    windows: &[MaintenanceWindow],
    exclusions: &[Exclusion],
    now: Option<Timestamp>,
) -> Estimate {
    let cp = kind(
        history,
        |j| &j.controlplane_node,
        defaults.controlplane_node,
    );
    let worker = kind(history, |j| &j.worker_node, defaults.worker_node);
    // a wave is predicted from past waves where there are some, else from past nodes
    let cp_wave = waves(history, |j| &j.controlplane_wave);
    let worker_wave = waves(history, |j| &j.worker_wave);
    let kube = kind(history, |j| &j.kubernetes_node, defaults.kubernetes_node);
    // (pool, waves, span, source) in plan order; rounded once into `PoolEstimate`s below
    let mut pool_spans: Vec<(String, u32, Span, Source)> = Vec::new();
    let mut kubernetes = None;
    let mut units = Vec::new();
    for step in &plan.steps {
        match step {
            Step::Talos(t) => {
                let (node, source) = pool_span(history, &t.pool).unwrap_or_else(|| {
                    if t.role == MachineRole::Controlplane {
                        cp_wave.unwrap_or(cp)
                    } else {
                        worker_wave.unwrap_or(worker)
                    }
                });
                let soak = t
                    .health
                    .as_ref()
                    .or(plan.health.as_ref())
                    .filter(|h| !h.gates.is_empty())
                    .map_or(Duration::ZERO, |h| h.soak);
                let wave = node.add(Span {
                    median: soak,
                    pessimistic: soak,
                });
                for w in &t.waves {
                    let change = w
                        .iter()
                        .map(|m| Change::talos(&m.from, &t.to))
                        .min()
                        .unwrap_or(Change::Patch);
                    units.push(Unit {
                        change,
                        bounds: wave.bounds(),
                    });
                }
                let n = u32::try_from(t.waves.len()).unwrap_or(u32::MAX);
                match pool_spans.iter_mut().find(|p| p.0 == t.pool) {
                    Some(p) => {
                        p.1 = p.1.saturating_add(n);
                        p.2 = p.2.add(wave.times(n));
                    }
                    None => pool_spans.push((t.pool.clone(), n, wave.times(n), source)),
                }
            }
            Step::Kubernetes(k) => {
                let (node, source) = kube;
                let n = u32::try_from(k.control_plane.len() + k.workers.len()).unwrap_or(u32::MAX);
                let change = Change::kubernetes(&k.from, &k.to);
                for _ in 0..n {
                    units.push(Unit {
                        change,
                        bounds: node.bounds(),
                    });
                }
                kubernetes = Some((n, node.times(n), source));
            }
        }
    }
    let total = pool_spans
        .iter()
        .map(|p| p.2)
        .chain(kubernetes.map(|k| k.1))
        .fold(Span::ZERO, Span::add)
        .bounds();
    let pools: Vec<PoolEstimate> = pool_spans
        .into_iter()
        .map(|(pool, waves, span, source)| PoolEstimate {
            pool,
            waves,
            bounds: span.bounds(),
            source,
        })
        .collect();
    let kubernetes = kubernetes.map(|(waves, span, source)| PoolEstimate {
        pool: "kubernetes".into(),
        waves,
        bounds: span.bounds(),
        source,
    });
    let mut phases = std::collections::BTreeMap::new();
    let mut names: Vec<&String> = history.jobs.iter().flat_map(|j| j.phases.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let all: Vec<Duration> = history
            .jobs
            .iter()
            .flat_map(|j| j.phases.get(name).into_iter().flatten().copied())
            .collect();
        if let Some(m) = median(&all) {
            phases.insert(name.clone(), m.as_secs());
        }
    }
    let calendar = match now {
        Some(now) if !units.is_empty() && (!windows.is_empty() || !exclusions.is_empty()) => {
            let (fin, n, unb) = walk(&units, windows, exclusions, now, |b| b.median_secs);
            let (fin_p, n_p, unb_p) =
                walk(&units, windows, exclusions, now, |b| b.pessimistic_secs);
            Some(Calendar {
                windows: n,
                windows_pessimistic: n_p,
                finish: fin.to_string(),
                finish_pessimistic: fin_p.to_string(),
                unbounded: unb || unb_p,
            })
        }
        _ => None,
    };
    Estimate {
        cluster: plan.cluster.clone(),
        pools,
        kubernetes,
        total,
        history_jobs: u32::try_from(history.jobs.len()).unwrap_or(u32::MAX),
        phases,
        calendar,
    }
}

/// Walk `units` from `now`: each starts when a window is open and no exclusion holds its
/// change; returns the end, the window openings used, and whether the walk gave up.
fn walk(
    units: &[Unit],
    windows: &[MaintenanceWindow],
    exclusions: &[Exclusion],
    now: Timestamp,
    secs: fn(Bounds) -> u64,
) -> (Timestamp, u32, bool) {
    let mut t = now;
    let mut openings = 0u32;
    // The start of the window occurrence the last unit started in.
    let mut current: Option<Timestamp> = None;
    let mut steps = 0usize;
    for u in units {
        loop {
            steps += 1;
            if steps > MAX_WALK {
                return (t, openings, true);
            }
            let free = free_from(exclusions, u.change, t);
            if free > t {
                t = free;
                continue;
            }
            if !open_at(windows, t) {
                match windows.iter().filter_map(|w| w.next_start(t)).min() {
                    Some(next) => {
                        t = next;
                        continue;
                    }
                    None => return (t, openings, true),
                }
            }
            break;
        }
        if !windows.is_empty() {
            // Which occurrence is open: the latest start at or before t among open windows.
            let occurrence = windows
                .iter()
                .filter(|w| w.contains(t))
                .filter_map(|w| {
                    let d = SignedDuration::try_from(w.duration()).ok()?;
                    let probe = t.checked_sub(d).ok()?;
                    w.next_start(probe)
                })
                .min();
            if occurrence.is_none() || occurrence != current {
                openings += 1;
                current = occurrence;
            }
        }
        let d = SignedDuration::from_secs(i64::try_from(secs(u.bounds)).unwrap_or(i64::MAX));
        t = t.checked_add(d).unwrap_or(Timestamp::MAX);
    }
    (t, openings, false)
}

/// `1h05m`-style text of `secs` (hours and minutes; seconds under a minute).
pub fn human(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s:02}s"),
        (h, m) => format!("{h}h{m:02}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::model::{KubeRollout, MachineTarget, TalosRollout};
    use crate::version::{KubeVersion, TalosVersion};

    fn secs(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|s| Duration::from_secs(*s)).collect()
    }

    fn target(node: &str, from: &str) -> MachineTarget {
        MachineTarget {
            node: node.into(),
            id: node.into(),
            address: "10.0.0.1".into(),
            from: TalosVersion::parse(from).unwrap(),
            image: None,
        }
    }

    fn talos(pool: &str, role: MachineRole, from: &str, to: &str, waves: &[&[&str]]) -> Step {
        Step::Talos(TalosRollout {
            stage: None,
            pool: pool.into(),
            role,
            hop: 1,
            hops: 1,
            to: TalosVersion::parse(to).unwrap(),
            image: "ghcr.io/siderolabs/installer".into(),
            max_unavailable: 2,
            drain_timeout: Duration::from_secs(600),
            health_timeout: Duration::from_secs(900),
            upgrade_attempts: 2,
            drain: Default::default(),
            taint_next_wave: true,
            waves: waves
                .iter()
                .map(|w| w.iter().map(|n| target(n, from)).collect())
                .collect(),
            health: None,
            silence: None,
            hooks: None,
        })
    }

    fn plan(steps: Vec<Step>) -> ClusterPlan {
        ClusterPlan {
            raised_by: Vec::new(),
            cluster: "prod".into(),
            steps,
            settings: vec![],
            unchanged: vec![],
            status: Default::default(),
            notes: vec![],
            diffs: vec![],
            preflight: vec![],
            health: None,
            hooks: None,
        }
    }

    fn kube_step(n_cp: usize, n_w: usize) -> Step {
        Step::Kubernetes(KubeRollout {
            from: KubeVersion::parse("v1.34.2").unwrap(),
            to: KubeVersion::parse("v1.35.8").unwrap(),
            control_plane: (0..n_cp).map(|i| format!("cp-{i}")).collect(),
            workers: (0..n_w).map(|i| format!("w-{i}")).collect(),
            health_timeout: Duration::from_secs(900),
            supported_talos: None,
        })
    }

    #[test]
    fn bounds_are_the_median_and_the_largest_sample_plus_a_quarter() {
        let b = bounds_of(&secs(&[100, 120, 110, 200])).unwrap();
        assert_eq!(b.median_secs, 120);
        assert_eq!(b.pessimistic_secs, 250);
        // tight samples: at least the median plus a half
        let b = bounds_of(&secs(&[100, 100, 100])).unwrap();
        assert_eq!(b.pessimistic_secs, 150);
        assert_eq!(bounds_of(&[]), None);
        // sub-second parts round to the nearest second, never down
        let b = bounds_of(&[Duration::from_millis(6_900), Duration::from_millis(6_400)]).unwrap();
        assert_eq!(b.median_secs, 7);
        let b = bounds_of(&[Duration::from_millis(6_400)]).unwrap();
        assert_eq!(b.median_secs, 6);
        assert_eq!(b.pessimistic_secs, 10, "6.4 s plus a half is 9.6 s");
    }

    #[test]
    fn without_history_every_figure_is_a_labelled_default() {
        let p = plan(vec![
            talos(
                "controlplane",
                MachineRole::Controlplane,
                "v1.13.2",
                "v1.13.9",
                &[&["cp-1"], &["cp-2"], &["cp-3"]],
            ),
            talos(
                "workers",
                MachineRole::Worker,
                "v1.13.2",
                "v1.13.9",
                &[&["w-1", "w-2"], &["w-3"]],
            ),
            kube_step(3, 3),
        ]);
        let e = estimate(&p, &History::default(), &DEFAULTS, &[], &[], None);
        assert_eq!(e.history_jobs, 0);
        assert_eq!(e.pools[0].source, Source::Default);
        assert_eq!(e.pools[0].bounds.median_secs, 3 * 600);
        assert_eq!(e.pools[1].bounds.median_secs, 2 * 480);
        let k = e.kubernetes.as_ref().unwrap();
        assert_eq!(k.bounds.median_secs, 6 * 180);
        assert_eq!(e.total.median_secs, 1800 + 960 + 1080);
        assert_eq!(e.total.pessimistic_secs, 2 * (1800 + 960 + 1080));
        assert_eq!(e.calendar, None, "no windows, no calendar");
    }

    #[test]
    fn history_replaces_the_defaults_per_kind_and_hops_add_up_per_pool() {
        let h = History {
            jobs: vec![JobSamples {
                worker_node: secs(&[60, 70, 80]),
                ..Default::default()
            }],
        };
        let p = plan(vec![
            talos(
                "workers",
                MachineRole::Worker,
                "v1.12.4",
                "v1.13.10",
                &[&["w-1"], &["w-2"]],
            ),
            talos(
                "workers",
                MachineRole::Worker,
                "v1.13.10",
                "v1.14.6",
                &[&["w-1"], &["w-2"]],
            ),
            talos(
                "controlplane",
                MachineRole::Controlplane,
                "v1.13.2",
                "v1.13.9",
                &[&["cp-1"]],
            ),
        ]);
        let e = estimate(&p, &h, &DEFAULTS, &[], &[], None);
        assert_eq!(e.pools.len(), 2);
        assert_eq!(e.pools[0].pool, "workers");
        assert_eq!(e.pools[0].waves, 4);
        assert_eq!(e.pools[0].source, Source::History);
        assert_eq!(e.pools[0].bounds.median_secs, 4 * 70);
        assert_eq!(e.pools[0].bounds.pessimistic_secs, 4 * 105);
        assert_eq!(
            e.pools[1].source,
            Source::Default,
            "no control-plane samples"
        );
        assert_eq!(e.history_jobs, 1);

        // wave samples, where the history has them, replace node samples for the pool
        let h = History {
            jobs: vec![JobSamples {
                worker_node: secs(&[60, 70, 80]),
                worker_wave: secs(&[90, 100]),
                ..Default::default()
            }],
        };
        let e = estimate(&p, &h, &DEFAULTS, &[], &[], None);
        assert_eq!(e.pools[0].source, Source::History);
        assert_eq!(e.pools[0].bounds.median_secs, 4 * 100);
        assert_eq!(
            e.pools[1].source,
            Source::Default,
            "still no control-plane samples"
        );
    }

    /// Issue #51 item 2: a pool with history of its own is predicted from it (a slow GPU pool
    /// and a fast pool of the same role no longer share one median); a pool without any falls
    /// back to its role's samples, labelled.
    #[test]
    fn each_pool_is_predicted_from_its_own_history_and_its_role_as_the_fallback() {
        let mut pools = std::collections::BTreeMap::new();
        pools.insert(
            "gpu".to_string(),
            PoolSamples {
                node: secs(&[900, 1000]),
                wave: secs(&[1000, 1100]),
            },
        );
        pools.insert(
            "workers".to_string(),
            PoolSamples {
                node: secs(&[60, 70]),
                wave: secs(&[]),
            },
        );
        let h = History {
            jobs: vec![JobSamples {
                worker_node: secs(&[60, 70, 900, 1000]),
                worker_wave: secs(&[1000, 1100]),
                pools,
                ..Default::default()
            }],
        };
        let p = plan(vec![
            talos(
                "gpu",
                MachineRole::Worker,
                "v1.13.2",
                "v1.13.9",
                &[&["g-1"], &["g-2"]],
            ),
            talos(
                "workers",
                MachineRole::Worker,
                "v1.13.2",
                "v1.13.9",
                &[&["w-1"], &["w-2"]],
            ),
            talos(
                "batch",
                MachineRole::Worker,
                "v1.13.2",
                "v1.13.9",
                &[&["b-1"]],
            ),
        ]);
        let e = estimate(&p, &h, &DEFAULTS, &[], &[], None);
        assert_eq!(e.pools[0].source, Source::Pool);
        assert_eq!(e.pools[0].bounds.median_secs, 2 * 1100, "gpu: its waves");
        assert_eq!(e.pools[1].source, Source::Pool);
        assert_eq!(
            e.pools[1].bounds.median_secs,
            2 * 70,
            "workers: its nodes, not the gpu's"
        );
        assert_eq!(
            e.pools[2].source,
            Source::History,
            "batch: no history of its own"
        );
        assert_eq!(e.pools[2].bounds.median_secs, 1100, "the role's waves");
        let text = {
            let mut out = String::new();
            crate::plan::render::estimate_text_for_tests(&mut out, &e);
            out
        };
        assert!(
            text.contains("pool batch: 1 wave, median 18m20s, pessimistic 27m30s (from the history of its role's pools)"),
            "{text}"
        );
        assert!(text.contains("pool gpu: 2 waves, median 36m40s"), "{text}");
        assert!(
            !text.contains("pool gpu: 2 waves, median 36m40s, pessimistic 55m00s ("),
            "{text}"
        );
    }

    #[test]
    fn windows_and_exclusions_spread_the_job_over_openings() {
        use crate::desired::exclusion::ExclusionScope;
        // Daily window 02:00-03:00 UTC; each wave takes 40 minutes: one wave per opening.
        let w = MaintenanceWindow::new("0 2 * * *", Duration::from_secs(3600), "UTC").unwrap();
        let h = History {
            jobs: vec![JobSamples {
                worker_node: secs(&[2400]),
                ..Default::default()
            }],
        };
        let p = plan(vec![talos(
            "workers",
            MachineRole::Worker,
            "v1.13.10",
            "v1.14.6",
            &[&["w-1"], &["w-2"], &["w-3"]],
        )]);
        let now: Timestamp = "2026-12-02T12:00:00Z".parse().unwrap();
        let e = estimate(&p, &h, &DEFAULTS, std::slice::from_ref(&w), &[], Some(now));
        let c = e.calendar.unwrap();
        // 02:00 wave 1 (ends 02:40), 02:40 wave 2 starts inside (ends 03:20), wave 3 waits to
        // the next day.
        assert_eq!(c.windows, 2);
        assert_eq!(c.finish, "2026-12-04T02:40:00Z");
        // A noMinorUpgrades exclusion over the 3rd and 4th holds the minor hop two more days.
        let x = Exclusion::new(
            "freeze",
            "2026-12-03T00:00:00Z".parse().unwrap(),
            "2026-12-05T00:00:00Z".parse().unwrap(),
            ExclusionScope::NoMinorUpgrades,
        )
        .unwrap();
        let e = estimate(&p, &h, &DEFAULTS, &[w], &[x], Some(now));
        let c = e.calendar.unwrap();
        assert_eq!(c.finish, "2026-12-06T02:40:00Z");
        assert_eq!(c.windows, 2);
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(42), "42s");
        assert_eq!(human(125), "2m05s");
        assert_eq!(human(3 * 3600 + 5 * 60), "3h05m");
    }
}
