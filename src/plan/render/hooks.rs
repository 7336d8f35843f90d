//! How a plan lists blocking hooks (issue #49 item 6): under each hook's line, what a Job hook
//! runs and may reach, in the text; `jobHooks[]` in the JSON (derived from the plan's hooks,
//! not part of its id).

use std::fmt::Write as _;

use serde::Serialize;

use crate::plan::model::{Plan, Step};

/// One `hook <point>: <name> (...)` line per hook and, under a Job hook, what it runs and may
/// reach (issue #49: every container and init container with its command, privileges, host
/// namespaces and paths, service account, placement and Secrets).
pub(super) fn render_hooks(out: &mut String, h: &crate::desired::hooks::Hooks, indent: &str) {
    for l in h.lines() {
        let _ = writeln!(out, "{indent}hook {}", l.head);
        for d in &l.detail {
            let _ = writeln!(out, "{indent}    {d}");
        }
    }
}

/// One Job hook of a plan in its JSON (`jobHooks[]`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct JobHookJson<'a> {
    cluster: &'a str,
    /// The pool, for a pool's hook; absent for the cluster's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pool: Option<&'a str>,
    point: crate::desired::hooks::HookPoint,
    name: &'a str,
    job: crate::desired::hook_view::JobView,
}

/// Every Job hook the plan lists, once each (a pool in several hops lists its hooks once).
pub(super) fn job_hooks(plan: &Plan) -> Vec<JobHookJson<'_>> {
    use crate::desired::hooks::{HookAction, HookPoint, Hooks};
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for c in &plan.clusters {
        let mut sets: Vec<(Option<&str>, &Hooks)> = Vec::new();
        if let Some(h) = &c.hooks {
            sets.push((None, h));
        }
        for s in &c.steps {
            if let Step::Talos(t) = s
                && let Some(h) = &t.hooks
            {
                sets.push((Some(t.pool.as_str()), h));
            }
        }
        for (pool, hooks) in sets {
            if !seen.insert((c.cluster.as_str(), pool)) {
                continue;
            }
            for point in HookPoint::ALL {
                for h in hooks.at(point) {
                    if let HookAction::Job {
                        namespace,
                        pod_spec,
                        ..
                    } = &h.action
                    {
                        out.push(JobHookJson {
                            cluster: c.cluster.as_str(),
                            pool,
                            point,
                            name: h.name.as_str(),
                            job: crate::desired::hook_view::JobView::of(namespace, pod_spec),
                        });
                    }
                }
            }
        }
    }
    out
}
