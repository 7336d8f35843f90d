//! The plan the twin runs (pure): a copy of one cluster's [`ClusterPlan`] with every duration
//! the executor waits on divided by the compression factor, and every machine's address
//! replaced by its twin's.
//!
//! Divided: each Talos hop's drain timeout, health timeout and volume-detach timeout, the
//! Kubernetes step's health timeout, and the timeouts of Job hooks. Fields a plan stores in
//! whole seconds (the drain, health and volume-detach timeouts) are rounded up to a whole
//! second, at least one, so a compressed timeout never reads as zero.
//!
//! Left out, because a rehearsal never calls anything outside the twin: health gates (their
//! sources are the real cluster's Prometheus and Alertmanager), alert silences
//! (Alertmanager), and HTTP hooks (they would notify real endpoints). Each is said in the
//! returned limits.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::desired::hooks::{HookAction, HookPoint, Hooks};
use crate::plan::{ClusterPlan, Step};

/// The compressed plan and what it left out (one line each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compressed {
    /// The plan the twin's job runs.
    pub plan: ClusterPlan,
    /// What the compression left out, one line each.
    pub limits: Vec<String>,
}

/// `d / factor` (a factor of zero reads as one).
pub fn divide(d: Duration, factor: u32) -> Duration {
    d / factor.max(1)
}

/// `d / factor` rounded up to a whole second, at least one: for the fields a plan stores in
/// whole seconds.
pub fn divide_secs(d: Duration, factor: u32) -> Duration {
    Duration::from_secs(divide_whole(d.as_secs(), factor))
}

fn divide_whole(secs: u64, factor: u32) -> u64 {
    secs.div_ceil(u64::from(factor.max(1))).max(1)
}

/// Compress `plan` by `factor` and point it at the twin (`addresses`: node → twin address).
/// A machine without a twin address keeps none (an empty address the twin's job cannot
/// dial); [`super::twin::build`] gives one to every node it models.
pub fn compress(
    plan: &ClusterPlan,
    factor: u32,
    addresses: &BTreeMap<String, String>,
) -> Compressed {
    let mut out = plan.clone();
    let mut limits = Vec::new();
    let mut gates = false;
    let mut silences = false;
    let mut http_hooks = 0usize;
    if out.health.take().is_some_and(|h| !h.gates.is_empty()) {
        gates = true;
    }
    if let Some(h) = out.hooks.take() {
        let (kept, dropped) = job_hooks_only(h, factor);
        http_hooks += dropped;
        out.hooks = kept.non_empty();
    }
    for step in &mut out.steps {
        match step {
            Step::Talos(t) => {
                t.drain_timeout = divide_secs(t.drain_timeout, factor);
                t.health_timeout = divide_secs(t.health_timeout, factor);
                t.drain.volume_detach_timeout_secs = t
                    .drain
                    .volume_detach_timeout_secs
                    .map(|s| divide_whole(s, factor));
                if t.health.take().is_some_and(|h| !h.gates.is_empty()) {
                    gates = true;
                }
                if t.silence.take().is_some() {
                    silences = true;
                }
                if let Some(h) = t.hooks.take() {
                    let (kept, dropped) = job_hooks_only(*h, factor);
                    http_hooks += dropped;
                    t.hooks = kept.non_empty().map(Box::new);
                }
                for m in t.waves.iter_mut().flatten() {
                    m.address = addresses.get(&m.node).cloned().unwrap_or_default();
                }
            }
            Step::Kubernetes(k) => {
                k.health_timeout = divide_secs(k.health_timeout, factor);
            }
        }
    }
    if gates {
        limits.push(
            "health gates are not evaluated on the twin (their sources are the real cluster's): the timeline leaves out their soaks"
                .to_string(),
        );
    }
    if silences {
        limits.push("alert silences are not set from the twin".to_string());
    }
    if http_hooks > 0 {
        limits.push(format!(
            "{http_hooks} HTTP hook(s) are not called from the twin (they would notify real endpoints)"
        ));
    }
    Compressed { plan: out, limits }
}

/// The Job hooks of `hooks` with their timeouts compressed, and how many HTTP hooks were
/// left out.
fn job_hooks_only(mut hooks: Hooks, factor: u32) -> (Hooks, usize) {
    let mut dropped = 0;
    for point in HookPoint::ALL {
        let list = hooks.at_mut(point);
        let before = list.len();
        list.retain(|h| !matches!(h.action, HookAction::Http { .. }));
        dropped += before - list.len();
        for h in list.iter_mut() {
            h.timeout = divide(h.timeout, factor).max(Duration::from_millis(1));
        }
    }
    (hooks, dropped)
}
