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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::hooks::Hook;
    use crate::desired::model::DrainPolicy;
    use crate::inventory::MachineRole;
    use crate::plan::{ClusterStatus, KubeRollout, MachineTarget, TalosRollout};
    use crate::version::{KubeVersion, TalosVersion};

    fn hook(name: &str, action: HookAction) -> Hook {
        Hook {
            name: name.into(),
            timeout: Duration::from_secs(120),
            idempotent: true,
            action,
        }
    }

    fn http() -> HookAction {
        HookAction::Http {
            url: "https://hooks.example/notify".into(),
            credential: None,
        }
    }

    fn job() -> HookAction {
        HookAction::Job {
            namespace: "ops".into(),
            pod_spec: serde_json::json!({"containers": [{"name": "c", "image": "busybox"}]}),
            ttl_seconds_after_finished: crate::desired::hooks::DEFAULT_HOOK_JOB_TTL_SECS,
        }
    }

    /// Workers w-1, w-2 (one wave each) at real addresses, then a Kubernetes step.
    fn plan() -> ClusterPlan {
        let v = |s| TalosVersion::parse(s).unwrap();
        let target = |n: &str, a: &str| MachineTarget {
            node: n.into(),
            id: format!("id-{n}"),
            address: a.into(),
            from: v("v1.12.4"),
            image: None,
        };
        let hooks = Hooks {
            before_node: vec![hook("page", http()), hook("backup", job())],
            ..Hooks::default()
        };
        let talos = TalosRollout {
            pool: "workers".into(),
            role: MachineRole::Worker,
            hop: 1,
            hops: 1,
            to: v("v1.13.9"),
            image: "factory.talos.dev/installer/x:v1.13.9".into(),
            max_unavailable: 1,
            drain_timeout: Duration::from_secs(600),
            health_timeout: Duration::from_secs(900),
            upgrade_attempts: 1,
            drain: DrainPolicy {
                volume_detach_timeout_secs: Some(300),
                ..DrainPolicy::default()
            },
            taint_next_wave: true,
            waves: vec![
                vec![target("w-1", "10.0.0.11")],
                vec![target("w-2", "10.0.0.12")],
            ],
            health: None,
            silence: None,
            hooks: Some(Box::new(hooks)),
            stage: None,
        };
        let kube = KubeRollout {
            from: KubeVersion::parse("v1.33.5").unwrap(),
            to: KubeVersion::parse("v1.34.1").unwrap(),
            control_plane: vec!["cp-1".into()],
            workers: vec!["w-1".into(), "w-2".into()],
            health_timeout: Duration::from_secs(601),
            supported_talos: None,
        };
        ClusterPlan {
            raised_by: Vec::new(),
            cluster: "home".into(),
            steps: vec![Step::Talos(talos), Step::Kubernetes(kube)],
            settings: vec![],
            unchanged: vec![],
            status: ClusterStatus::Planned,
            notes: vec![],
            diffs: vec![],
            preflight: vec![],
            health: None,
            hooks: Some(Hooks {
                after_job: vec![hook("announce", http())],
                ..Hooks::default()
            }),
        }
    }

    fn twin_addresses() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("w-1".to_string(), "127.77.0.3".to_string()),
            ("w-2".to_string(), "127.77.0.4".to_string()),
        ])
    }

    #[test]
    fn every_wait_is_divided_and_every_target_points_at_the_twin() {
        let c = compress(&plan(), 60, &twin_addresses());
        let Step::Talos(t) = &c.plan.steps[0] else {
            panic!("the Talos step comes first: {:?}", c.plan.steps)
        };
        assert_eq!(t.drain_timeout, Duration::from_secs(10));
        assert_eq!(t.health_timeout, Duration::from_secs(15));
        assert_eq!(t.drain.volume_detach_timeout_secs, Some(5));
        let addresses: Vec<(&str, &str)> = t
            .waves
            .iter()
            .flatten()
            .map(|m| (m.node.as_str(), m.address.as_str()))
            .collect();
        assert_eq!(addresses, [("w-1", "127.77.0.3"), ("w-2", "127.77.0.4")]);
        // the Job hook stays, its timeout divided; the HTTP hooks are left out
        let hooks = t.hooks.as_deref().expect("the Job hook is kept");
        assert_eq!(hooks.before_node.len(), 1);
        assert_eq!(hooks.before_node[0].name, "backup");
        assert_eq!(hooks.before_node[0].timeout, Duration::from_secs(2));
        assert_eq!(c.plan.hooks, None, "the cluster's only hook was HTTP");
        let Step::Kubernetes(k) = &c.plan.steps[1] else {
            panic!("the Kubernetes step is second")
        };
        assert_eq!(
            k.health_timeout,
            Duration::from_secs(11),
            "601 s / 60, rounded up"
        );
        assert_eq!(
            c.limits,
            ["2 HTTP hook(s) are not called from the twin (they would notify real endpoints)"]
        );
        // nothing else changed
        let mut back = c.plan.clone();
        let original = plan();
        back.hooks = original.hooks.clone();
        back.steps = original.steps.clone();
        assert_eq!(back, original);
    }

    #[test]
    fn a_compressed_timeout_is_never_zero_and_a_node_without_a_twin_has_no_address() {
        let only_w1 = BTreeMap::from([("w-1".to_string(), "127.77.0.3".to_string())]);
        let c = compress(&plan(), 1_000_000, &only_w1);
        let Step::Talos(t) = &c.plan.steps[0] else {
            panic!("the Talos step comes first")
        };
        assert_eq!(t.drain_timeout, Duration::from_secs(1));
        assert_eq!(t.health_timeout, Duration::from_secs(1));
        assert_eq!(t.drain.volume_detach_timeout_secs, Some(1));
        assert_eq!(
            t.hooks.as_deref().unwrap().before_node[0].timeout,
            Duration::from_millis(1)
        );
        assert_eq!(t.waves[1][0].address, "", "never the observed 10.0.0.12");
        // a factor of zero reads as one: nothing is divided
        let same = compress(&plan(), 0, &twin_addresses());
        let Step::Talos(t) = &same.plan.steps[0] else {
            panic!("the Talos step comes first")
        };
        assert_eq!(t.drain_timeout, Duration::from_secs(600));
    }
}
