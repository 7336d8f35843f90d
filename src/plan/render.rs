//! Rendering plans: terraform-like text for people, a stable JSON form for programs.
//!
//! Pure functions of the plan: the same plan renders to the same bytes. Colour is an argument
//! (the CLI turns it off for `NO_COLOR` and when stdout is not a terminal).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::compute::RESOURCE_FIELD;
use super::health::{HealthPolicy, OnFailure};
use super::lifecycle::PlanState;
use super::model::*;
use crate::desired::model::format_duration;
use crate::version::TalosVersion;

mod hooks;

/// The namespace approval signatures use (`ssh-keygen -Y sign -n`).
pub const APPROVAL_NAMESPACE: &str = "medea-approve";

/// Version of the `-o json` document (`"format"` field).
pub const JSON_FORMAT: &str = "medea.plan/v1";

/// How a plan is rendered as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// ANSI colours.
    pub color: bool,
}

#[derive(Clone, Copy)]
enum Paint {
    Add,
    Change,
    Remove,
    Dim,
    Bold,
    Hunk,
}

fn paint(o: Options, p: Paint, text: &str) -> String {
    if !o.color {
        return text.to_string();
    }
    let code = match p {
        Paint::Add => "32",
        Paint::Change => "33",
        Paint::Remove => "31",
        Paint::Dim => "2",
        Paint::Bold => "1",
        Paint::Hunk => "36",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

/// Counts for the closing summary line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Steps: one per Talos hop of a pool, one per Kubernetes rollout.
    pub rollouts: usize,
    /// Distinct machines any step touches.
    pub machines: usize,
    /// Settings changes, field by field.
    pub settings_changes: usize,
}

/// The counts of `plan`'s closing summary line.
pub fn summary(plan: &Plan) -> Summary {
    Summary {
        rollouts: plan.clusters.iter().map(|c| c.steps.len()).sum(),
        machines: plan.machines_touched(),
        settings_changes: plan.clusters.iter().map(|c| c.settings.len()).sum(),
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The closing line: `Plan 1a2b3c4d5e6f: 2 rollouts (7 machines), 1 settings change. Approve
/// with: medea approve 1a2b3c4d5e6f`.
pub fn summary_line(plan: &Plan) -> String {
    summary_line_in(plan, None)
}

/// [`summary_line`] for a plan in `state`: once it left "pending" (approved, applied, running,
/// consumed …), it says so instead of offering the approve command.
fn summary_line_in(plan: &Plan, state: Option<PlanState>) -> String {
    let s = summary(plan);
    let short = plan.id.short();
    if !plan.has_changes() {
        return no_changes_line(plan);
    }
    let mut parts = Vec::new();
    if s.rollouts > 0 {
        parts.push(format!(
            "{} ({})",
            plural(s.rollouts, "rollout", "rollouts"),
            plural(s.machines, "machine", "machines")
        ));
    }
    if s.settings_changes > 0 {
        parts.push(plural(
            s.settings_changes,
            "settings change",
            "settings changes",
        ));
    }
    let mut line = format!("Plan {short}: {}", parts.join(", "));
    let blocking = super::preflight::blocking(plan).len();
    if blocking > 0 {
        let _ = write!(
            line,
            ". It cannot be approved: {} (see `preflight:` above); fix it and replan, or acknowledge it under `spec.preflight.acknowledge`",
            plural(
                blocking,
                "blocking preflight finding",
                "blocking preflight findings"
            )
        );
    }
    match state.and_then(PlanState::sentence) {
        Some(sentence) => {
            let _ = write!(line, ". This plan is {sentence}");
            if state == Some(PlanState::Running) {
                line.push_str(&follow_hint(plan));
            }
            line.push('.');
        }
        None if blocking == 0 => {
            let _ = write!(line, ". Approve with: medea approve {short}");
        }
        None => {}
    }
    line
}

/// How to follow a running plan's jobs: one `medea rollout status -w --cluster <name>` per
/// cluster it rolls out (issue #51: without `--cluster` the command fails on a server with
/// several clusters).
fn follow_hint(plan: &Plan) -> String {
    let cmds: Vec<String> = plan
        .clusters
        .iter()
        .filter(|c| !c.steps.is_empty())
        .map(|c| format!("`medea rollout status -w --cluster {}`", c.cluster))
        .collect();
    match cmds.len() {
        0 => String::new(),
        1 => format!(": follow it with {}", cmds[0]),
        _ => format!(": follow each cluster's job with {}", cmds.join(", ")),
    }
}

/// The closing line of a plan with nothing to do, saying why: every observed cluster matches,
/// or a running job holds its cluster's planning until it ends, or a cluster is not observed
/// yet (then nothing can be compared, so "they match" would be untrue).
fn no_changes_line(plan: &Plan) -> String {
    let short = plan.id.short();
    let mut why = Vec::new();
    for (cluster, job) in &plan.basis.running {
        why.push(format!(
            "job {job} is rolling out cluster {cluster}; what remains is planned when it ends (follow it: medea rollout status {job} -w)"
        ));
    }
    let unobserved: Vec<&str> = plan
        .clusters
        .iter()
        .filter(|c| c.status == ClusterStatus::NotObserved)
        .map(|c| c.cluster.as_str())
        .collect();
    if !unobserved.is_empty() {
        why.push(format!(
            "not observed yet, so nothing is compared: {} (seed it with `medea seed`, or check the server's --creds-dir)",
            unobserved.join(", ")
        ));
    }
    if why.is_empty() {
        return format!("Plan {short}: no changes. The observed clusters match the desired state.");
    }
    format!("Plan {short}: no changes to approve. {}.", why.join("; "))
}

/// The shell command that signs a plan without the API.
pub fn sign_command(plan: &Plan) -> String {
    format!(
        "echo {} | ssh-keygen -Y sign -f ~/.ssh/id_ed25519 -n {APPROVAL_NAMESPACE} > approvals/{}-<you>.sig",
        plan.id.to_hex(),
        plan.id.short()
    )
}

fn waves_text(waves: &[Vec<MachineTarget>]) -> String {
    let sizes: Vec<usize> = waves.iter().map(Vec::len).collect();
    let n = sizes.len();
    match sizes.first() {
        Some(first) if sizes.iter().all(|s| s == first) => {
            format!("{} of {first}", plural(n, "wave", "waves"))
        }
        _ => format!(
            "{} ({})",
            plural(n, "wave", "waves"),
            sizes
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn versions_text(vs: impl IntoIterator<Item = TalosVersion>) -> String {
    let set: std::collections::BTreeSet<TalosVersion> = vs.into_iter().collect();
    set.iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn machine_count(t: &TalosRollout) -> usize {
    t.waves.iter().map(Vec::len).sum()
}

/// A Talos hop's image, drain policy and upgrade bound, then its waves, at `indent`.
fn render_hop(out: &mut String, t: &TalosRollout, indent: &str) {
    // one line when every machine gets the step's image; else one per image, with its machines
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for m in t.waves.iter().flatten() {
        let image = t.image_for(m);
        match groups.iter_mut().find(|(i, _)| *i == image) {
            Some((_, nodes)) => nodes.push(&m.node),
            None => groups.push((image, vec![&m.node])),
        }
    }
    if groups.len() <= 1 {
        let _ = writeln!(out, "{indent}image {}", t.image);
    } else {
        for (image, nodes) in groups {
            let _ = writeln!(out, "{indent}image {image}: {}", nodes.join(", "));
        }
    }
    let _ = writeln!(
        out,
        "{indent}drain {} timeout {}; upgrade attempts {}; health timeout {}{}",
        t.drain.summary(),
        format_duration(t.drain_timeout),
        t.upgrade_attempts,
        format_duration(t.health_timeout),
        // the default (the next wave tainted PreferNoSchedule) is in every plan's README;
        // shown only when off, so plans made before the setting render as they did
        if t.taint_next_wave {
            ""
        } else {
            "; next wave not tainted (rollout.taintNextWave: false)"
        }
    );
    render_stage(out, t, indent);
    if let Some(h) = &t.health {
        render_health(out, h, indent, true);
    }
    if let Some(s) = &t.silence {
        let _ = writeln!(out, "{indent}silence: {}", s.summary());
        let _ = writeln!(
            out,
            "{indent}  in {}, created before each cordon, renewed while the node is away, expired once it is back",
            s.alertmanager.summary()
        );
    }
    if let Some(h) = &t.hooks {
        hooks::render_hooks(out, h, indent);
    }
    render_waves(out, t, indent);
    // who leads etcd is known only when the step runs (issue #48): the order is decided then
    if t.role == crate::inventory::MachineRole::Controlplane && machine_count(t) > 1 {
        let _ = writeln!(
            out,
            "{indent}the node leading etcd goes last, whatever its wave, and hands its leadership over before its reboot"
        );
    }
}

/// `rollout.stage: ahead` (issue #36): which nodes install ahead and which in the window, and
/// the warning a signer must not miss.
fn render_stage(out: &mut String, t: &TalosRollout, indent: &str) {
    if t.stage.is_none() {
        return;
    }
    let (staged, in_window): (Vec<&MachineTarget>, Vec<&MachineTarget>) =
        t.waves.iter().flatten().partition(|m| t.stages(m));
    let names = |ms: &[&MachineTarget]| {
        ms.iter()
            .map(|m| m.node.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !staged.is_empty() {
        let _ = writeln!(
            out,
            "{indent}stage ahead: {} installed without reboot as soon as the job reaches this step, windows or not ({} at a time); cordon, drain and reboot stay inside the windows",
            names(&staged),
            t.stage_parallelism()
        );
        let _ = writeln!(
            out,
            "{indent}  WARNING: any reboot of a staged node, planned or not (an operator, a power loss, a kernel panic), boots {}",
            t.to
        );
        let _ = writeln!(
            out,
            "{indent}  a node whose bootloader cannot report its next boot (GRUB) is not staged: it upgrades in the window as before"
        );
    }
    if !in_window.is_empty() {
        let _ = writeln!(
            out,
            "{indent}not staged (Talos < 1.13 installs only by rebooting): {} upgrade in the window as before",
            names(&in_window)
        );
    }
}

/// A health policy: its timing and failure policy on one line, then one line per gate.
fn render_health(out: &mut String, h: &HealthPolicy, indent: &str, talos: bool) {
    let failures = if h.failure_limit == 1 {
        "fails on the first failed evaluation".to_string()
    } else {
        format!(
            "fails after {} failed evaluations in a row",
            h.failure_limit
        )
    };
    let failures = if h.inconclusive_limit == 1 {
        format!("{failures}, halts on the first inconclusive one")
    } else {
        format!(
            "{failures}, halts after {} inconclusive evaluations",
            h.inconclusive_limit
        )
    };
    let soak = if h.soak.is_zero() {
        "no soak".to_string()
    } else {
        format!("soak {}", format_duration(h.soak))
    };
    let _ = writeln!(
        out,
        "{indent}health: {}, {soak}, every {}, {failures}",
        plural(h.gates.len(), "gate", "gates"),
        format_duration(h.interval),
    );
    let on_failure = match (talos, h.on_failure) {
        (true, OnFailure::Halt) => "on failure: halt before the next node",
        (true, OnFailure::Rollback) => {
            "on failure: roll the failing wave back to its previous Talos (one node at a time), then halt"
        }
        (false, _) => "on failure: halt (Kubernetes steps never roll back)",
    };
    let _ = writeln!(out, "{indent}  {on_failure}");
    for (what, source) in [
        ("prometheus", &h.sources.prometheus),
        ("alertmanager", &h.sources.alertmanager),
    ] {
        if let Some(e) = source {
            let _ = writeln!(out, "{indent}  source {what}: {}", e.summary());
        }
    }
    for g in &h.gates {
        let _ = writeln!(out, "{indent}  gate {}", g.summary());
    }
}

fn render_waves(out: &mut String, t: &TalosRollout, indent: &str) {
    for (i, w) in t.waves.iter().enumerate() {
        let nodes: Vec<&str> = w.iter().map(|m| m.node.as_str()).collect();
        let _ = writeln!(out, "{indent}wave {}: {}", i + 1, nodes.join(", "));
    }
}

/// The plan as text, byte-identical for the same plan.
pub fn text(plan: &Plan, o: Options) -> String {
    text_in(plan, o, None)
}

/// [`text`] for a plan in `state`: past `pending` it offers neither the approve nor the sign
/// command.
pub fn text_in_state(plan: &Plan, o: Options, state: PlanState) -> String {
    text_in(plan, o, Some(state))
}

fn text_in(plan: &Plan, o: Options, state: Option<PlanState>) -> String {
    let offer =
        state.is_none_or(PlanState::offers_approval) && super::preflight::blocking(plan).is_empty();
    let mut out = String::new();
    let observed: Vec<String> = plan
        .basis
        .observed
        .iter()
        .map(|(c, g)| format!("{c} generation {g}"))
        .collect();
    let _ = writeln!(out, "Desired:  {}", plan.basis.desired);
    let _ = writeln!(
        out,
        "Observed: {}",
        if observed.is_empty() {
            "nothing yet".to_string()
        } else {
            observed.join(", ")
        }
    );
    let _ = writeln!(out, "Catalog:  {}", plan.catalog);
    if let Some(p) = &plan.parent {
        let _ = writeln!(out, "Replaces: plan {}", p.short());
    }
    for (cluster, job) in &plan.basis.halted {
        let _ = writeln!(
            out,
            "After:    job {job} halted (cluster {cluster}): this plan continues from what it left"
        );
    }
    for c in &plan.clusters {
        out.push('\n');
        render_cluster(&mut out, c, o);
        if let Some(e) = plan.estimates.iter().find(|e| e.cluster == c.cluster) {
            render_estimate(&mut out, e);
        }
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "{}",
        paint(o, Paint::Bold, &summary_line_in(plan, state))
    );
    if plan.has_changes() && offer {
        let (why, rule) = bar_rule(plan);
        let _ = writeln!(
            out,
            "It needs {} from distinct signers: {why},",
            plural(plan.approvals_required as usize, "approval", "approvals"),
        );
        let _ = writeln!(out, "so {rule} applies.");
        if let Some(hint) = alone_hint(plan) {
            let _ = writeln!(out, "{hint}");
        }
        let _ = writeln!(out, "The full id, which approvals sign:");
        let _ = writeln!(out, "  {}", plan.id.to_hex());
        let _ = writeln!(out, "To sign without the API:");
        let _ = writeln!(out, "  {}", sign_command(plan));
    }
    out
}

/// [`render_estimate`], for the estimator's tests.
#[cfg(test)]
pub(crate) fn estimate_text_for_tests(out: &mut String, e: &super::estimate::Estimate) {
    render_estimate(out, e)
}

/// The predicted duration of a cluster's job (issue #36): advice, labelled as such.
fn render_estimate(out: &mut String, e: &super::estimate::Estimate) {
    use super::estimate::{Source, human};
    let from = match e.history_jobs {
        0 => "no job of this cluster recorded yet: documented defaults".to_string(),
        1 => "from the last job of this cluster".to_string(),
        n => format!("from the last {n} jobs of this cluster"),
    };
    let _ = writeln!(
        out,
        "  predicted duration ({from}; advice, not part of the plan id):"
    );
    let row = |out: &mut String,
               what: String,
               p: &super::estimate::PoolEstimate,
               unit: &str,
               pool: bool| {
        let _ = writeln!(
            out,
            "    {what}: {} {unit}{}, median {}, pessimistic {}{}",
            p.waves,
            if p.waves == 1 { "" } else { "s" },
            human(p.bounds.median_secs),
            human(p.bounds.pessimistic_secs),
            match p.source {
                Source::Default => " (default)",
                // issue #51 item 2: a pool without history of its own, from its role's
                Source::History if pool => " (from the history of its role's pools)",
                Source::History | Source::Pool => "",
            }
        );
    };
    for p in &e.pools {
        row(out, format!("pool {}", p.pool), p, "wave", true);
    }
    if let Some(k) = &e.kubernetes {
        row(out, "kubernetes".into(), k, "node", false);
    }
    let _ = writeln!(
        out,
        "    job: median {}, pessimistic {}",
        human(e.total.median_secs),
        human(e.total.pessimistic_secs)
    );
    if !e.phases.is_empty() {
        let phases: Vec<String> = e
            .phases
            .iter()
            .map(|(k, v)| format!("{k} {}", human(*v)))
            .collect();
        let _ = writeln!(out, "    per node (median): {}", phases.join(", "));
    }
    if let Some(c) = &e.calendar {
        if c.unbounded {
            let _ = writeln!(
                out,
                "    with the windows and exclusions: no end in sight (no window ahead, or too many waits)"
            );
        } else if c.windows_pessimistic == 0 {
            // No window: only exclusions shape the calendar.
            let _ = writeln!(
                out,
                "    with the exclusions, if started now: expected end {} (pessimistic {})",
                c.finish, c.finish_pessimistic
            );
        } else {
            let _ = writeln!(
                out,
                "    with the windows and exclusions, if started now: {} window opening{} ({} pessimistic), expected end {} (pessimistic {})",
                c.windows,
                if c.windows == 1 { "" } else { "s" },
                c.windows_pessimistic,
                c.finish,
                c.finish_pessimistic
            );
        }
    }
}

fn render_cluster(out: &mut String, c: &ClusterPlan, o: Options) {
    let title = match c.status {
        ClusterStatus::Planned => format!("cluster {}", c.cluster),
        ClusterStatus::NotObserved => format!("cluster {} (not observed)", c.cluster),
        ClusterStatus::Removed => format!("cluster {} (removed)", c.cluster),
        ClusterStatus::RollingOut => format!("cluster {} (rollout running)", c.cluster),
    };
    let _ = writeln!(out, "{}", paint(o, Paint::Bold, &title));
    if let Some(h) = &c.health {
        let _ = writeln!(out, "  before the job starts and after it ends:");
        render_health(out, h, "    ", false);
    }
    if let Some(h) = &c.hooks {
        hooks::render_hooks(out, h, "  ");
    }

    // First version each node runs, per pool, for the pool summary line.
    let mut first_from: BTreeMap<&str, BTreeMap<&str, TalosVersion>> = BTreeMap::new();
    for s in &c.steps {
        if let Step::Talos(t) = s {
            let e = first_from.entry(t.pool.as_str()).or_default();
            for m in t.waves.iter().flatten() {
                e.entry(m.node.as_str()).or_insert_with(|| m.from.clone());
            }
        }
    }
    let mut open_pool: Option<&str> = None;
    for s in &c.steps {
        match s {
            Step::Talos(t) if t.hops == 1 => {
                open_pool = None;
                let line = format!(
                    "~ pool {}: talos {} → {} ({}, {})",
                    t.pool,
                    versions_text(t.waves.iter().flatten().map(|m| m.from.clone())),
                    t.to,
                    plural(machine_count(t), "machine", "machines"),
                    waves_text(&t.waves)
                );
                let _ = writeln!(out, "  {}", paint(o, Paint::Change, &line));
                render_hop(out, t, "      ");
            }
            Step::Talos(t) => {
                if open_pool != Some(t.pool.as_str()) {
                    let froms = &first_from[t.pool.as_str()];
                    let line = if t.hop == 1 {
                        format!(
                            "~ pool {}: talos {} → {} ({}, {})",
                            t.pool,
                            versions_text(froms.values().cloned()),
                            final_target(c, &t.pool).unwrap_or_else(|| t.to.clone()),
                            plural(froms.len(), "machine", "machines"),
                            plural(t.hops as usize, "hop", "hops")
                        )
                    } else {
                        format!("~ pool {} (continued):", t.pool)
                    };
                    let _ = writeln!(out, "  {}", paint(o, Paint::Change, &line));
                    open_pool = Some(t.pool.as_str());
                }
                let _ = writeln!(
                    out,
                    "      hop {}/{}: {} → {} ({}, {})",
                    t.hop,
                    t.hops,
                    versions_text(t.waves.iter().flatten().map(|m| m.from.clone())),
                    t.to,
                    plural(machine_count(t), "machine", "machines"),
                    waves_text(&t.waves)
                );
                render_hop(out, t, "        ");
            }
            Step::Kubernetes(k) => {
                open_pool = None;
                let line = format!(
                    "~ kubernetes: {} → {} ({} one at a time, then the kubelets of {})",
                    k.from,
                    k.to,
                    plural(
                        k.control_plane.len(),
                        "control-plane node",
                        "control-plane nodes"
                    ),
                    plural(k.workers.len(), "worker", "workers")
                );
                let _ = writeln!(out, "  {}", paint(o, Paint::Change, &line));
                let _ = writeln!(
                    out,
                    "      health timeout {}",
                    format_duration(k.health_timeout)
                );
                if c.health.is_some() {
                    let _ = writeln!(
                        out,
                        "      gated by the cluster's health gates; Kubernetes steps never roll back"
                    );
                }
            }
        }
    }
    if !c.settings.is_empty() {
        let when = if c.steps.is_empty() {
            "written to the store on approval"
        } else {
            "written to the store when the job succeeds"
        };
        let _ = writeln!(out, "  settings ({when}):");
        for s in &c.settings {
            let (p, line) = if s.field == RESOURCE_FIELD && s.to == "created" {
                (
                    Paint::Add,
                    format!("+ {}: new resource, its settings take effect", s.resource),
                )
            } else if s.field == RESOURCE_FIELD {
                (
                    Paint::Remove,
                    format!("- {}: removed, medea stops managing it", s.resource),
                )
            } else {
                (
                    Paint::Change,
                    format!("~ {} {}: {} → {}", s.resource, s.field, s.from, s.to),
                )
            };
            let _ = writeln!(out, "    {}", paint(o, p, &line));
        }
    }
    if !c.unchanged.is_empty() && c.status == ClusterStatus::Planned {
        let pools: Vec<String> = c.unchanged.iter().map(|p| format!("pool {p}")).collect();
        let _ = writeln!(out, "  = unchanged: {}", pools.join(", "));
    }
    if c.status == ClusterStatus::Planned && !c.has_changes() {
        let _ = writeln!(out, "  = no changes");
    }
    if !c.preflight.is_empty() {
        let _ = writeln!(out, "  preflight:");
        for f in &c.preflight {
            let sev = match f.severity {
                super::preflight::Severity::Blocking => "blocking",
                super::preflight::Severity::Warning => "warning",
            };
            let ack = if f.acknowledged {
                " (acknowledged)"
            } else {
                ""
            };
            let p = match (f.severity, f.acknowledged) {
                (super::preflight::Severity::Blocking, false) => Paint::Remove,
                (super::preflight::Severity::Warning, false) => Paint::Change,
                _ => Paint::Dim,
            };
            let _ = writeln!(
                out,
                "    {}",
                paint(o, p, &format!("{sev} [{}]{ack}: {}", f.id, f.message))
            );
            for e in &f.evidence {
                let _ = writeln!(out, "      evidence: {e}");
            }
            let _ = writeln!(
                out,
                "      {}",
                paint(o, Paint::Dim, &format!("help: {}", f.help))
            );
        }
    }
    for n in &c.notes {
        let _ = writeln!(out, "  {}", paint(o, Paint::Dim, &format!("note: {n}")));
    }
    for d in &c.diffs {
        let _ = writeln!(out, "  diff of {} ({}):", d.resource, d.file);
        for line in d.diff.lines() {
            let p = if line.starts_with("+++") || line.starts_with("---") {
                Paint::Bold
            } else if line.starts_with('+') {
                Paint::Add
            } else if line.starts_with('-') {
                Paint::Remove
            } else if line.starts_with("@@") {
                Paint::Hunk
            } else {
                Paint::Dim
            };
            let _ = writeln!(out, "    {}", paint(o, p, line).trim_end());
        }
    }
}

fn final_target(c: &ClusterPlan, pool: &str) -> Option<TalosVersion> {
    c.steps.iter().rev().find_map(|s| match s {
        Step::Talos(t) if t.pool == pool => Some(t.to.clone()),
        _ => None,
    })
}

/// Why a plan needs the approvals it does, in words (issue #39: "Why 2 approvals?"). The bar
/// itself is computed by the planner (`plan::bar`); this names the rule that set it, from
/// what the plan shows: a change of the approvals setting or of where health data goes (the
/// notes say so), control-plane nodes or Kubernetes touched, or workers only.
pub fn bar_reason(plan: &Plan) -> String {
    let (why, rule) = bar_rule(plan);
    format!("{why} → {rule}")
}

/// For a plan that needs more than one signer, how one person comes to approve alone, said so
/// that it leads somewhere (issue #52 item 7): lowering a bar is itself a change of the
/// approvals setting, so it needs the bar in force; either that many signers approve the
/// lower bar once, or the cluster is seeded with the lower bar before its first applied
/// settings. `None` for a plan one signer approves.
pub fn alone_hint(plan: &Plan) -> Option<String> {
    (plan.approvals_required > 1).then(|| {
        format!(
            "To approve alone later: lowering a bar needs the bar in force, so {} signers approve `controlPlane: 1` (and `required: 1`) once; or, before the cluster's first settings are applied, run medea seed with `--approvals-control-plane 1`.",
            plan.approvals_required
        )
    })
}

/// [`bar_reason`] in its two parts: what the plan does, and the setting that applies. Read
/// from the plan's typed raises ([`ClusterPlan::raised_by`]), never from note text.
fn bar_rule(plan: &Plan) -> (String, &'static str) {
    use crate::plan::bar::Bar;
    let highest: Vec<String> = plan
        .clusters
        .iter()
        .filter_map(|c| {
            let mut set: Vec<&str> = Vec::new();
            for r in c.raised_by.iter().filter(|r| r.bar == Bar::Highest) {
                if !set.contains(&r.setting.path()) {
                    set.push(r.setting.path());
                }
            }
            (!set.is_empty()).then(|| format!("cluster {}: {}", c.cluster, set.join(", ")))
        })
        .collect();
    if !highest.is_empty() {
        let hooks = plan
            .clusters
            .iter()
            .any(|c| c.raised_by.iter().any(|r| r.setting.is_hook()));
        return (
            format!(
                "it changes settings that need the highest bar ({}){}",
                highest.join("; "),
                if hooks {
                    "; blocking hooks run actions of their own"
                } else {
                    ""
                }
            ),
            "the highest bar in force, max(approvals.required, approvals.controlPlane)",
        );
    }
    let names = |pick: &dyn Fn(&ClusterPlan) -> bool| -> String {
        plan.clusters
            .iter()
            .filter(|c| pick(c))
            .map(|c| c.cluster.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let cp = names(&|c| {
        c.steps.iter().any(Step::touches_control_plane)
            || c.raised_by.iter().any(|r| r.bar == Bar::ControlPlane)
    });
    if !cp.is_empty() {
        return (
            format!("it touches control-plane nodes, their settings or Kubernetes (cluster {cp})"),
            "approvals.controlPlane (default 2)",
        );
    }
    (
        "it touches worker nodes or settings only".to_string(),
        "approvals.required (default 1)",
    )
}

/// The approvals part of a server plan view as text: who counted, and every candidate that
/// did not, with its source, key, principal and reason. Empty when there is nothing to say.
pub fn approvals_text(view: &ApprovalsView) -> String {
    let mut out = String::new();
    let who = |c: &CandidateView| {
        let key = if c.fingerprint.is_empty() {
            "key not checked".to_string()
        } else {
            format!("key {}", c.fingerprint)
        };
        if c.principal.is_empty() {
            key
        } else {
            format!("{}, {key}", c.principal)
        }
    };
    if !view.counted.is_empty() {
        let _ = writeln!(out, "Approvals counted:");
        for c in &view.counted {
            let _ = writeln!(out, "  {} ({})", c.source, who(c));
        }
    }
    if !view.rejected.is_empty() {
        let _ = writeln!(out, "Not counted ({}):", view.rejected.len());
        for c in &view.rejected {
            let _ = writeln!(out, "  {} ({}): {}", c.source, who(c), c.reason);
        }
    }
    out
}

/// The `-o json` document (see `design/plan.md` for the schema).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonPlan<'a> {
    format: &'static str,
    id: String,
    short_id: String,
    parent: Option<String>,
    basis: &'a Basis,
    catalog: &'a str,
    approvals_required: u32,
    /// Why the plan needs `approvalsRequired` ([`bar_reason`]).
    approvals_reason: String,
    has_changes: bool,
    summary: Summary,
    clusters: &'a [std::sync::Arc<ClusterPlan>],
    approve_command: Option<String>,
    sign_command: Option<String>,
    /// What became of the plan (from the server, its wire string); absent offline.
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<PlanState>,
    /// Who approved and which candidates did not count, and why (from the server; absent
    /// offline, where `medea approvals` answers).
    #[serde(skip_serializing_if = "Option::is_none")]
    approvals: Option<&'a ApprovalsView>,
    /// Predicted durations (advice, not part of the id).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    estimates: &'a [super::estimate::Estimate],
    /// What each Job hook the plan lists runs and may reach, read from its pod spec (issue
    /// #49; derived from `clusters`, not part of the id).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    job_hooks: Vec<hooks::JobHookJson<'a>>,
}

/// One approval candidate as a plan view shows it: a signature that counts, or one that does
/// not and why (issue #39: rejected markers were visible only in the daemon's log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CandidateView {
    /// `marker:<path>` or `api`.
    pub source: String,
    /// The signing key's SHA256 fingerprint; empty when the signature could not be read.
    pub fingerprint: String,
    /// The allowed-signers principal of the key; empty when the key is not listed.
    pub principal: String,
    /// The outcome's stable code (`unknown-key`, `stale-plan`, `wrong-namespace`, …).
    pub code: String,
    /// Why it does not count (empty for one that counts).
    pub reason: String,
}

/// The approvals part of a plan view (server side): what counts and what does not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalsView {
    /// One line per key that counts.
    pub counted: Vec<CandidateView>,
    /// Every candidate that does not count, with why.
    pub rejected: Vec<CandidateView>,
}

/// The plan as pretty JSON with a trailing newline, stable across runs.
pub fn json(plan: &Plan) -> String {
    json_in(plan, None, None)
}

/// [`json`] with the plan's `state`; past `pending` the approve and sign commands are null.
pub fn json_in_state(plan: &Plan, state: PlanState) -> String {
    json_in(plan, Some(state), None)
}

/// [`json_in_state`] with the server's view of the plan's approvals (`approvals.counted[]`,
/// `approvals.rejected[]`).
pub fn json_with_approvals(plan: &Plan, state: PlanState, approvals: &ApprovalsView) -> String {
    json_in(plan, Some(state), Some(approvals))
}

#[allow(
    clippy::expect_used,
    reason = "plain structs with string keys and no non-finite floats: serializing them to JSON cannot fail"
)]
fn json_in(plan: &Plan, state: Option<PlanState>, approvals: Option<&ApprovalsView>) -> String {
    let changes = plan.has_changes()
        && state.is_none_or(PlanState::offers_approval)
        && super::preflight::blocking(plan).is_empty();
    let doc = JsonPlan {
        format: JSON_FORMAT,
        id: plan.id.to_hex(),
        short_id: plan.id.short(),
        parent: plan.parent.map(|p| p.to_hex()),
        basis: &plan.basis,
        catalog: &plan.catalog,
        approvals_required: plan.approvals_required,
        approvals_reason: bar_reason(plan),
        has_changes: plan.has_changes(),
        summary: summary(plan),
        clusters: &plan.clusters,
        approve_command: changes.then(|| format!("medea approve {}", plan.id.short())),
        sign_command: changes.then(|| sign_command(plan)),
        state,
        approvals,
        estimates: &plan.estimates,
        job_hooks: hooks::job_hooks(plan),
    };
    let mut s = serde_json::to_string_pretty(&doc).expect("plans serialize");
    s.push('\n');
    s
}
