//! The dashboard's pages: server-rendered HTML (maud escapes every value), usable without
//! JavaScript; `app.js` only adds the live updates of a rollout page and the copy buttons.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use jiff::Timestamp;
use maud::{DOCTYPE, Markup, html};
use tonic::Request;

use super::session::View;
use super::{Ui, charts, to_login};
use crate::api::pb;
use crate::api::pb::medea_server::Medea as _;
use crate::plan::PlanState;
use crate::plan::render::APPROVAL_NAMESPACE;
use crate::rollout::journal::{Entry, JournalEntry};
use crate::rollout::sequencer::{Job, JobState, KubeTasks, StepKind, StepState, TaskState};

/// How many journal entries a rollout page shows (the newest).
const TIMELINE_ENTRIES: usize = 200;

fn page(title: &str, session: Option<&View>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { "medea · " (title) }
                link rel="stylesheet" href="/assets/style.css";
                script src="/assets/app.js" defer {}
            }
            body {
                header {
                    a.brand href="/" { "medea" }
                    @if let Some(s) = session {
                        nav {
                            a href="/" { "Overview" }
                            a href="/plan" { "Plan" }
                            a href="/rollouts" { "Rollouts" }
                            a href="/history" { "History" }
                            form.inline method="post" action="/logout" {
                                input type="hidden" name="csrf" value=(s.csrf);
                                button.link type="submit" { "Log out" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

fn respond(status: StatusCode, m: Markup) -> Response {
    (status, Html(m.into_string())).into_response()
}

/// A page with a heading and one sentence (errors, refusals).
pub fn message(status: StatusCode, title: &str, text: &str, session: Option<&View>) -> Response {
    respond(
        status,
        page(
            title,
            session,
            html! { h1 { (title) } p.msg { (text) } p { a href="/" { "Back to the overview" } } },
        ),
    )
}

pub fn login(status: StatusCode, error: Option<&str>) -> Response {
    respond(
        status,
        page(
            "log in",
            None,
            html! {
                h1 { "Log in" }
                @if let Some(e) = error { p.error role="alert" { (e) } }
                form.login method="post" action="/login" {
                    label for="token" { "API token" }
                    input #token type="password" name="token" autocomplete="off" required autofocus;
                    button type="submit" { "Log in" }
                }
                p.hint { "The bearer token of this server (" code { "--token-file" } ", default "
                    code { "<state-dir>/token" } "). It is exchanged for a session cookie and kept nowhere in the browser." }
            },
        ),
    )
}

fn internal(session: &View, what: &str, e: impl std::fmt::Display) -> Response {
    tracing::error!(error = %e, "dashboard: {what} failed");
    message(
        StatusCode::INTERNAL_SERVER_ERROR,
        "Error",
        &format!("Cannot read {what}; see the server log."),
        Some(session),
    )
}

fn ts(t: Timestamp) -> String {
    t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// An RFC 3339 time from the API as the pages print it: to the second ([`ts`]), without the
/// nanoseconds the server keeps (issue #52); anything else as it is.
fn ts_text(t: &str) -> String {
    t.parse::<Timestamp>()
        .map(ts)
        .unwrap_or_else(|_| t.to_string())
}

fn hms(t: Timestamp) -> String {
    t.strftime("%H:%M:%S").to_string()
}

/// `1h02m`, `3m05s`, `12s`.
pub fn elapsed(secs: i64) -> String {
    let s = secs.max(0);
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

fn since(t: Option<Timestamp>, now: Timestamp) -> String {
    t.map(|t| elapsed(now.as_second() - t.as_second()))
        .unwrap_or_default()
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

// ---------------------------------------------------------------------------------------------
// Overview

pub async fn overview(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    let Some(s) = ui.sessions.get(&headers) else {
        return to_login();
    };
    let api = ui.api();
    let (info, clusters, pools) = match tokio::try_join!(
        api.server_info(Request::new(pb::ServerInfoRequest {})),
        api.list_clusters(Request::new(pb::ListClustersRequest {})),
        api.list_node_pools(Request::new(pb::ListNodePoolsRequest {
            cluster: String::new()
        })),
    ) {
        Ok((i, c, p)) => (
            i.into_inner(),
            c.into_inner().clusters,
            p.into_inner().pools,
        ),
        Err(e) => return internal(&s, "the clusters", e.message()),
    };
    let store = ui.shared.store.as_ref();
    let jobs = match crate::server::rollouts::jobs(&ui.shared) {
        Ok(j) => j,
        Err(e) => return internal(&s, "the jobs", crate::error_chain(&e)),
    };
    let current = crate::ops::replan::current(store)
        .ok()
        .flatten()
        .and_then(|c| crate::ops::replan::load_plan(store, &c.id).ok().flatten());
    let plan_state = match &current {
        Some(_) => api
            .get_plan(Request::new(pb::GetPlanRequest { id: String::new() }))
            .await
            .ok()
            .and_then(|r| r.into_inner().plan)
            .map(|p| p.state),
        None => None,
    };
    let desired = ui.shared.desired();
    let now = Timestamp::now();
    let last_refresh = ui.shared.last_refresh();
    // What a glance should catch: every running job, and each cluster's latest job when it
    // halted (a halt stays until a newer job of the cluster replaces it).
    let mut job_clusters: Vec<&str> = Vec::new();
    for j in &jobs {
        if !job_clusters.contains(&j.cluster.as_str()) {
            job_clusters.push(&j.cluster);
        }
    }
    let now_jobs: Vec<&Job> = job_clusters
        .iter()
        .filter_map(|c| {
            let mine = || jobs.iter().filter(|j| j.cluster == *c);
            mine().find(|j| !j.state.is_terminal()).or_else(|| {
                mine()
                    .next()
                    .filter(|j| matches!(j.state, JobState::Halted { .. }))
            })
        })
        .collect();
    let body = html! {
        h1 { "Overview" }
        section #jobs.jobs {
            @for j in &now_jobs {
                @let (state, _) = job_state(j);
                @let (done, total) = done_of(j);
                div.job.(state) data-job=(j.id) {
                    p {
                        span.badge.(state) { (state) } " "
                        a href={ "/rollouts/" (j.id) } { (j.id) } " · cluster " (j.cluster) " "
                        (charts::mini_bar(done, total, &j.state)) " " (done) "/" (total) " " (crate::rollout::sequencer::NODE_UPGRADES)
                    }
                    p.(if matches!(j.state, JobState::Halted { .. }) { "error" } else { "hint" }) { (job_line(j, &ui.shared.waits, now)) }
                    @if matches!(j.state, JobState::Halted { .. }) {
                        p.hint { "The job stays halted: the next plan continues from what is left and needs new approvals (see " a href="/plan" { "Plan" } ")." }
                    }
                }
            }
            @if now_jobs.is_empty() { p.hint { "No rollout is running or halted. " a href="/rollouts" { "All rollouts" } } }
        }
        dl.facts {
            dt { "medea" } dd { (info.version) " (" (info.git_sha) ")" }
            dt { "--rollouts" } dd { span.badge.(if info.rollouts_gate { "ok" } else { "off" }) { (if info.rollouts_gate { "on" } else { "off" }) } }
            dt { "replica" } dd { (info.replica) @if info.leader { " (leader)" } @else { " (follower; leader: " (if info.leader_replica.is_empty() { "unknown" } else { info.leader_replica.as_str() }) ")" } }
            dt { "desired" } dd { (info.desired_source) " @ " code { (info.desired_revision) } }
            dt { "last refresh" } dd { @match last_refresh { Some(t) => (ts(t)), None => "not yet" } }
            @if !info.allowed_signers_problem.is_empty() {
                dt { "allowed signers" } dd.error { (info.allowed_signers_problem) }
            }
            dt { "plan" } dd {
                @match (&current, &plan_state) {
                    (Some(p), Some(state)) => { a href="/plan" { code { (p.id.short()) } } " " span.badge.(state) { (state) } }
                    _ => "none yet",
                }
            }
        }
        @for c in &clusters {
            @let dc = desired.as_ref().and_then(|d| d.desired.clusters.get(&c.name));
            @let latest = jobs.iter().find(|j| j.cluster == c.name);
            @let notes = current.as_ref().and_then(|p| p.clusters.iter().find(|cp| cp.cluster == c.name)).map_or(0, |cp| cp.notes.len());
            @let newest_backup = crate::backup::list(store, &c.name).ok().and_then(|mut v| v.pop());
            section.cluster {
                h2 { "cluster " (c.name) }
                dl.facts {
                    dt { "Kubernetes" } dd { (or_dash(&c.kubernetes_version)) " → desired " (or_dash(&c.desired_kubernetes_version)) }
                    dt { "machines" } dd { (c.machines_ready) "/" (c.machines) " Ready" @if !c.observed { " (never observed: run medea seed)" } }
                    dt { "rolloutsEnabled" } dd { span.badge.(if c.rollouts_enabled { "ok" } else { "off" }) { (c.rollouts_enabled) } }
                    dt { "maintenance window" } dd {
                        @match dc {
                            Some(dc) if dc.windows.is_empty() => "none (always open)",
                            Some(dc) => {
                                @if crate::desired::window::open_at(&dc.windows, now) { span.badge.ok { "open now" } } @else { span.badge.off { "closed" } }
                                @if let Some(next) = dc.windows.iter().filter_map(|w| w.next_start(now)).min() { " · next opens " (ts(next)) }
                            }
                            None => "-",
                        }
                    }
                    dt { "plan notes" } dd { (notes) }
                    dt { "latest job" } dd {
                        @match latest {
                            Some(j) => { a href={ "/rollouts/" (j.id) } { (j.id) } " " span.badge.(job_state(j).0) { (job_state(j).0) } }
                            None => "none",
                        }
                    }
                    dt { "newest backup" } dd {
                        @match &newest_backup {
                            Some(b) => { code { (b.file) } " · taken " (ts(b.taken_at)) " (" (since(Some(b.taken_at), now)) " ago) from " (b.member) @if let Some(rev) = b.revision { " · etcd revision " (rev) } }
                            None => "none (spec.backup turns scheduled etcd backups on)",
                        }
                    }
                }
                table {
                    thead { tr { th { "pool" } th { "role" } th { "machines" } th { "running Talos" } th { "desired Talos" } } }
                    tbody {
                        @for p in pools.iter().filter(|p| p.cluster == c.name) {
                            tr {
                                td { (p.name) } td { (p.role) } td { (p.machines) }
                                td { (p.running_talos_versions.join(", ")) }
                                td.(if p.running_talos_versions.iter().all(|v| *v == p.desired_talos_version) { "same" } else { "change" }) { (p.desired_talos_version) }
                            }
                        }
                    }
                }
            }
        }
        @if clusters.is_empty() { p { "No clusters yet: add one to the desired state and run " code { "medea seed" } "." } }
        (super::tasks::section(&ui.shared.tasks.list(), ts))
    };
    respond(StatusCode::OK, page("overview", Some(&s), body))
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

// ---------------------------------------------------------------------------------------------
// Plan

/// The CSS class of one line of a rendered plan (diff lines are coloured).
fn line_class(line: &str) -> &'static str {
    let t = line.trim_start();
    if t.starts_with("+++") || t.starts_with("---") {
        "meta"
    } else if t.starts_with('+') {
        "add"
    } else if t.starts_with('-') {
        "del"
    } else if t.starts_with("@@") {
        "hunk"
    } else if t.starts_with('~') {
        "chg"
    } else {
        ""
    }
}

pub async fn plan(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    let Some(s) = ui.sessions.get(&headers) else {
        return to_login();
    };
    let r = match ui
        .api()
        .get_plan(Request::new(pb::GetPlanRequest { id: String::new() }))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(e) => return internal(&s, "the plan", e.message()),
    };
    let body = html! {
        h1 { "Plan" }
        @for d in &r.diagnostics {
            pre.diag.(d.severity) { (d.rendered) }
        }
        @match &r.plan {
            None => p { "No plan yet." },
            Some(p) => {
                dl.facts {
                    dt { "id" } dd { code #plan-id { (p.id) } " " button.copy type="button" data-copy="plan-id" hidden { "copy" } }
                    dt { "state" } dd { span.badge.(p.state) { (p.state) } @if p.stale { " " span.badge.halted { "stale" } } }
                    dt { "approvals" } dd #approvals { (p.approvals.len()) " of " (p.approvals_required) " required" }
                    dt { "why" } dd #approvals-reason { (p.approvals_reason) }
                    @let estimates = serde_json::from_str::<crate::plan::Plan>(&p.json).map(|p| p.estimates).unwrap_or_default();
                    @if !estimates.is_empty() {
                        dt { "duration" } dd #plan-duration {
                            @for e in &estimates { div { (duration_prediction(e)) } }
                        }
                    }
                }
                @if PlanState::from_wire(&p.state) == Some(PlanState::Pending) {
                    h2 { "Approve" }
                    p { "Over the API, with your key:" }
                    pre.cmd { code #approve-cmd { "medea approve " (p.id) " --key ~/.ssh/id_ed25519" } }
                    button.copy type="button" data-copy="approve-cmd" hidden { "copy" }
                    p { "Or as a marker file in the desired-state repository:" }
                    pre.cmd { code #sign-cmd { "echo " (p.id) " | ssh-keygen -Y sign -f ~/.ssh/id_ed25519 -n " (APPROVAL_NAMESPACE) " > approvals/" (p.short_id) "-<you>.sig" } }
                    button.copy type="button" data-copy="sign-cmd" hidden { "copy" }
                }
                @if !p.approvals.is_empty() {
                    h2 { "Approvals received" }
                    table {
                        thead { tr { th { "principal" } th { "key fingerprint" } th { "source" } th { "at" } } }
                        tbody { @for a in &p.approvals { tr { td { (a.principal) } td { code { (a.fingerprint) } } td { (a.source) } td { (ts_text(&a.at)) } } } }
                    }
                }
                @if !p.rejected.is_empty() {
                    h2 { "Not counted" }
                    table #rejected {
                        thead { tr { th { "source" } th { "key fingerprint" } th { "principal" } th { "why" } } }
                        tbody { @for r in &p.rejected { tr { td { (r.source) } td { code { (r.fingerprint) } } td { (r.principal) } td.reason { (r.reason) } } } }
                    }
                }
                h2 { "What it does" }
                pre.plan { @for line in without_estimates(&p.rendered) { span.(line_class(line)) { (line) } "\n" } }
                @if p.has_changes || !p.rehearsals.is_empty() {
                    section #rehearsal-section {
                    h2 #rehearsals { "Rehearsal on a twin" }
                    p.hint { "Each cluster's plan run on a simulated twin of the observed cluster: "
                        strong { (crate::rehearsal::show::ADVICE) } ". What the real run meets may differ." }
                    @if p.rehearsing {
                        p #rehearsing { "A rehearsal of this plan is running; each cluster's report appears here as it is stored (without JavaScript, reload the page)." }
                    } @else if p.has_changes && matches!(PlanState::from_wire(&p.state), Some(PlanState::Pending | PlanState::Approved | PlanState::Blocked)) {
                        form.inline method="post" action="/plan/rehearse" {
                            input type="hidden" name="csrf" value=(s.csrf);
                            input type="hidden" name="plan" value=(p.id);
                            button #rehearse type="submit" { @if p.rehearsals.is_empty() { "Rehearse" } @else { "Rehearse again" } }
                        }
                    }
                    @for r in &p.rehearsals { (rehearsal_section(r)) }
                    }
                }
            }
        }
    };
    respond(StatusCode::OK, page("plan", Some(&s), body))
}

/// One cluster's predicted duration, the one figure the plan page shows (issue #52: the plan's
/// text had a figure per pool, the job's and the calendar's, beside the rehearsal's): the job's
/// median and pessimistic bound, what they come from (the cluster's history or the documented
/// defaults) and, with windows or exclusions, the expected end if started now.
fn duration_prediction(e: &crate::plan::estimate::Estimate) -> String {
    use crate::plan::estimate::human;
    let basis = match e.history_jobs {
        0 => "documented defaults (no job of this cluster recorded yet)".to_string(),
        1 => "the cluster's last job".to_string(),
        n => format!("the cluster's last {n} jobs"),
    };
    let calendar = match &e.calendar {
        Some(c) if c.unbounded => "; with the windows and exclusions: no end in sight".to_string(),
        Some(c) => format!(
            "; with the windows and exclusions, if started now, it ends {} (pessimistic {})",
            c.finish, c.finish_pessimistic
        ),
        None => String::new(),
    };
    format!(
        "cluster {}: median {}, pessimistic {}, from {basis}{calendar} (advice)",
        e.cluster,
        human(e.total.median_secs),
        human(e.total.pessimistic_secs)
    )
}

/// The plan's text without its `predicted duration` blocks (each ends at a blank line): the
/// page shows the prediction once, in its facts ([`duration_prediction`]).
fn without_estimates(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut skipping = false;
    for line in text.lines() {
        if line.starts_with("  predicted duration (") {
            skipping = true;
            continue;
        }
        if skipping && line.starts_with("    ") {
            continue;
        }
        skipping = false;
        out.push(line);
    }
    out
}

/// One cluster's stored rehearsal: outcome, blockers with their node, the timeline per wave,
/// the limits of the twin, when it ran and on which census.
fn rehearsal_section(r: &pb::Rehearsal) -> Markup {
    let (kind, summary) = r
        .outcome
        .as_ref()
        .map(|o| (o.kind.as_str(), o.summary.as_str()))
        .unwrap_or(("notRun", "no outcome recorded"));
    html! {
        section.rehearsal data-cluster=(r.cluster) {
            h3 { "cluster " (r.cluster) " " span.badge.(kind) { (kind) } }
            dl.facts {
                dt { "outcome" } dd.outcome { (summary) @if kind == "completed" { " — the twin's run at " (r.timings) " timings; the prediction is the plan's duration above" } }
                dt { "ran" } dd { (ts_text(&r.ran_at)) }
                dt { "census" } dd { @if r.census_gathered_at.is_empty() { "none (nodes only)" } @else { "gathered " (ts_text(&r.census_gathered_at)) } }
                dt { "time" } dd { "compressed " (r.compression) "×; timings: " (r.timings) }
                dt { "note" } dd { (r.advice) }
            }
            @if r.blockers.is_empty() {
                p { "No blocker met." }
            } @else {
                table.blockers {
                    thead { tr { th { "blocker" } th { "node" } th { "what" } } }
                    tbody { @for b in &r.blockers { tr { td.bad { (b.kind) } td { (or_dash(&b.node)) } td { (b.detail) } } } }
                }
            }
            @if !r.waves.is_empty() {
                table.waves {
                    thead { tr { th { "step" } th { "wave" } th { "nodes" } th { "starts" } th { "takes" } } }
                    tbody { @for w in &r.waves { tr {
                        td { (w.step) } td { (w.wave) } td { (w.nodes.join(", ")) }
                        td { "+" (elapsed(i64::try_from(w.start_seconds).unwrap_or(i64::MAX))) }
                        td { @match w.duration_seconds { Some(d) => (elapsed(i64::try_from(d).unwrap_or(i64::MAX))), None => "did not finish" } }
                    } } }
                }
            }
            @if !r.limits.is_empty() {
                p { "Limits of the twin:" }
                ul.limits { @for l in &r.limits { li { (l) } } }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rollout

fn job_state(job: &Job) -> (&'static str, Option<&str>) {
    match &job.state {
        JobState::Running => ("running", None),
        JobState::Halted { reason, .. } => ("halted", Some(reason.message())),
        JobState::Succeeded { .. } => ("succeeded", None),
    }
}

/// When a job ended, or `now` while it runs.
fn end_of(job: &Job, now: Timestamp) -> Timestamp {
    match &job.state {
        JobState::Halted { at, .. } | JobState::Succeeded { at } => *at,
        JobState::Running => now,
    }
}

/// A job's node upgrades done and in all, for the compact bars: the count `rollout list` and
/// the journal show (issue #52).
fn done_of(job: &Job) -> (usize, usize) {
    let n = job.node_upgrades();
    (n.done, n.total)
}

/// One line on where a job is: its halt reason, or its current step and the nodes under way.
/// [`job_summary`] with what the job waits for, as its executor last said (`rollout status`'s
/// `waiting:` line; only the replica running the job knows).
pub fn job_line(job: &Job, waits: &crate::server::rollouts::Waits, now: Timestamp) -> String {
    let summary = job_summary(job, now);
    match waits.get(job.id.as_str()) {
        Some(w) if !job.state.is_terminal() => format!(
            "{summary}; waiting: {} (for {})",
            w.reason,
            elapsed(now.as_second() - w.since.as_second())
        ),
        _ => summary,
    }
}

pub fn job_summary(job: &Job, now: Timestamp) -> String {
    if let Some(r) = job_state(job).1 {
        return r.to_string();
    }
    if let JobState::Succeeded { at } = &job.state {
        return format!(
            "finished in {}",
            elapsed(at.as_second() - job.created_at.as_second())
        );
    }
    let steps = job.steps.len();
    let Some(i) = job.steps.iter().position(|s| s.state != StepState::Done) else {
        return "all steps done; the last checks are under way".into();
    };
    let mut out = match &job.steps[i].kind {
        StepKind::Talos(t) => {
            let back = t.nodes.iter().filter(|n| n.phase.finished()).count();
            let busy: Vec<String> = t
                .nodes
                .iter()
                .filter(|n| {
                    !matches!(
                        charts::node_state(n, false),
                        charts::Shown::Waiting | charts::Shown::Back
                    )
                })
                .map(|n| {
                    format!(
                        "{} {}{}",
                        n.target.node,
                        charts::node_state(n, false),
                        n.since
                            .map(|s| format!(" {}", elapsed(now.as_second() - s.as_second())))
                            .unwrap_or_default()
                    )
                })
                .collect();
            let mut s = format!(
                "step {}/{steps}: pool {} → Talos {}, {back}/{} nodes back",
                i + 1,
                t.rollout.pool,
                t.rollout.to,
                t.nodes.len()
            );
            if !busy.is_empty() {
                s.push_str(&format!("; {}", busy.join(", ")));
            }
            for n in &t.nodes {
                if let Some(b) = &n.blocked {
                    s.push_str(&format!("; {} drain blocked: {b}", n.target.node));
                }
            }
            s
        }
        StepKind::Kubernetes(k) => {
            let tasks = k.tasks.list();
            let done = tasks.iter().filter(|t| t.state == TaskState::Done).count();
            match &k.tasks {
                KubeTasks::Unchecked => format!(
                    "step {}/{steps}: Kubernetes → {}, pre-checks",
                    i + 1,
                    k.rollout.to
                ),
                KubeTasks::Planned(_) => format!(
                    "step {}/{steps}: Kubernetes → {}, {done}/{} tasks done",
                    i + 1,
                    k.rollout.to,
                    tasks.len()
                ),
            }
        }
    };
    if let Some(run) = &job.gates.current {
        match run.soak_ends() {
            Some(t) if run.soak_secs > 0 => out.push_str(&format!(
                "; health gates: {}, soak ends {}",
                run.point,
                hms(t)
            )),
            Some(_) => out.push_str(&format!("; health gates: {}", run.point)),
            None => out.push_str(&format!(
                "; health gates: {}{}",
                run.point,
                crate::rollout::sequencer::holding_run(&job.gates)
            )),
        }
    }
    out
}

/// The states the pictures use, with what each means (the legend).
const LEGEND: [(charts::Shown, &str); 7] = [
    (charts::Shown::Waiting, "not started"),
    (charts::Shown::Preparing, "checks, image pull"),
    (charts::Shown::Draining, "cordoned, drained"),
    (charts::Shown::Rebooting, "upgrade, reboot, coming back"),
    (charts::Shown::Back, "on the target"),
    (charts::Shown::Halted, "stopped by the halt"),
    (charts::Shown::Rollback, "rolled back"),
];

fn legend() -> Markup {
    html! {
        ul.legend {
            @for (s, what) in LEGEND {
                li { svg.sw viewBox="0 0 10 10" aria-hidden="true" { rect class={ "s-" (s) } width="10" height="10" rx="2" {} } " " b { (s) } " " (what) }
            }
        }
    }
}

/// The part of a rollout page that live updates replace: state, halt reason, a progress bar
/// and a picture per step (nodes by wave, or the Kubernetes tasks by node), and the waves'
/// timeline. `timings` is the job's journal folded ([`charts::Timings`]).
pub fn live_section(
    job: &Job,
    timings: &charts::Timings,
    waits: &crate::server::rollouts::Waits,
    continued: Option<&Job>,
    now: Timestamp,
) -> Markup {
    let (state, reason) = job_state(job);
    let steps = job.steps.len();
    let end = end_of(job, now);
    // Elapsed times tick only while the job runs (a halted node's clock stopped with it).
    let ticking = (!job.state.is_terminal()).then_some(now);
    // A halted job's step and in-flight nodes say so: they stopped, they are not running.
    let halted = matches!(job.state, JobState::Halted { .. });
    html! {
        p.status {
            "state " span.badge.(state) #job-state { (state) }
            @if let JobState::Halted { node: Some(n), op, .. } = &job.state {
                " on " (n) @if let Some(o) = op { " (" (o.name()) ")" }
            }
            " · " (elapsed(end.as_second() - job.created_at.as_second())) @if !job.state.is_terminal() { " so far" }
        }
        @if let Some(p) = job.predicted {
            p.hint #job-duration { "duration: " (job.clock.at(end).progress(p)) " (the plan's prediction, advice)" }
        }
        @if let Some(r) = reason { p.error #halt-reason { "Halt reason: " (r) } }
        @if halted {
            p.hint #continued-by {
                "Continued by: "
                @match continued {
                    Some(next) => { a href={ "/rollouts/" (next.id) } { (next.id) } " " span.badge.(job_state(next).0) { (job_state(next).0) } " (its plan continues from what this job left)" }
                    None => { "no job yet; the next plan continues from what this job left (see " a href="/plan" { "Plan" } ")" }
                }
            }
        }
        @if !job.state.is_terminal() { p.hint #job-summary { (job_line(job, waits, now)) } }
        @if let Some(snap) = &job.snapshot {
            p.hint { "etcd snapshot saved before the control plane: " (snap.size) " bytes, sha256 " code { (snap.sha256.get(..12).unwrap_or(&snap.sha256)) } @if snap.encrypted.is_some() { ", encrypted to the backup recipients" } }
        }
        @let staged = crate::rollout::sequencer::staged_not_rebooted(job);
        @if !staged.is_empty() {
            section.staged #staged-not-rebooted {
                h3 { "Staged, not yet rebooted" }
                p.warn { "Any reboot of these nodes, planned or not, boots the new version." }
                ul {
                    @for (node, to) in &staged {
                        li { b { (node) } ": installed ahead; its next boot boots " (to) }
                    }
                }
            }
        }
        @for (i, step) in job.steps.iter().enumerate() {
            // a halted job never reaches its pending steps: they are not "pending" (issue #52)
            @let sstate = match step.state { StepState::Pending if halted => "not reached", StepState::Pending => "pending", StepState::Running if halted => "halted", StepState::Running => "running", StepState::Done => "done" };
            @let span = timings.step(i);
            @let took = span.start.map(|s| elapsed(span.end.unwrap_or(end).as_second() - s.as_second()));
            section.step data-step=(i + 1) {
                @match &step.kind {
                    StepKind::Talos(t) => {
                        @let from = t.nodes.first().map(|n| n.target.from.to_string()).unwrap_or_default();
                        h3 { "Step " (i + 1) "/" (steps) ": pool " (t.rollout.pool) ", Talos " (from) " → " (t.rollout.to) " " span.badge.(sstate) { (sstate) } }
                        @let states: Vec<charts::Shown> = t.nodes.iter().map(|n| charts::node_state(n, halted)).collect();
                        @let back = states.iter().filter(|s| **s == charts::Shown::Back).count();
                        (charts::progress_bar(&states, &format!("{back}/{} nodes back{}", t.nodes.len(), took.as_ref().map(|d| format!(" · {d}")).unwrap_or_default())))
                        (charts::node_grid(i, t, timings, job, ticking))
                        @let notes: Vec<_> = t.nodes.iter().filter(|n| n.blocked.is_some() || n.last_error.is_some()).collect();
                        @if !notes.is_empty() {
                            ul.nodenotes {
                                @for n in notes {
                                    @if let Some(b) = &n.blocked { li { b { (n.target.node) } " drain blocked: " (b) } }
                                    @if let Some(e) = &n.last_error { li.error { b { (n.target.node) } " " (e) } }
                                }
                            }
                        }
                    }
                    StepKind::Kubernetes(k) => {
                        h3 { "Step " (i + 1) "/" (steps) ": Kubernetes " (k.rollout.from) " → " (k.rollout.to) " " span.badge.(sstate) { (sstate) } }
                        @match &k.tasks {
                            KubeTasks::Unchecked => p.hint { @if step.state == StepState::Pending { "waiting for the steps before it" } @else { "pre-checks " (ticking.map(|now| since(k.since, now)).unwrap_or_default()) } },
                            KubeTasks::Planned(tasks) => {
                                @let states: Vec<charts::Shown> = tasks.iter().map(|t| charts::task_state(t.state, halted)).collect();
                                @let done = states.iter().filter(|s| **s == charts::Shown::Done).count();
                                (charts::progress_bar(&states, &format!("{done}/{} tasks done{}", tasks.len(), took.as_ref().map(|d| format!(" · {d}")).unwrap_or_default())))
                                (charts::task_matrix(k, job))
                            }
                        }
                    }
                }
            }
        }
        (legend())
        h2 { "Waves" }
        (charts::wave_timeline(job, timings, now))
    }
}

/// One timeline line of a journal entry.
pub fn timeline_entry(e: &JournalEntry) -> Markup {
    let what = match &e.entry {
        Entry::Created { plan } => format!("job created from plan {}", plan.short()),
        Entry::Intent { key, .. } => format!(
            "{} {} (attempt {})",
            key.node.as_deref().unwrap_or("cluster"),
            key.op.name(),
            key.attempt
        ),
        Entry::Result { key, outcome } => format!(
            "{} {}: {}",
            key.node.as_deref().unwrap_or("cluster"),
            key.op.name(),
            outcome_text(outcome)
        ),
        Entry::Progress => "progress".to_string(),
        Entry::HaltRequested { by } => format!("halt requested by {by}"),
        Entry::ResumeRequested { by } => format!("resumed by {by}"),
        Entry::Gates { point, evaluations } => format!(
            "health gates {point}: {}",
            evaluations
                .iter()
                .map(|e| format!("{} {}", e.gate, e.verdict_text()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    html! {
        li data-seq=(e.seq) {
            time { (hms(e.at)) } " "
            span.kind.(e.entry.name()) { (e.entry.name()) } " "
            (what)
            @for n in &e.notes { br; small { (n) } }
        }
    }
}

fn outcome_text(o: &crate::rollout::sequencer::CommandOutcome) -> String {
    use crate::rollout::sequencer::CommandOutcome;
    match o {
        CommandOutcome::Done => "done".into(),
        CommandOutcome::Failed { error, .. } => format!("failed: {error}"),
        CommandOutcome::Transient { error } => format!("unknown outcome: {error}"),
        CommandOutcome::Installing { error } => format!("an install is still running: {error}"),
        CommandOutcome::Snapshot { info } => format!("saved ({} bytes)", info.size),
        CommandOutcome::Silenced { id } => format!("silence {id}"),
        CommandOutcome::Hook { report } => format!(
            "hook {}{}: {}",
            if report.succeeded {
                "succeeded"
            } else {
                "failed"
            },
            report
                .exit_code
                .map_or_else(String::new, |c| format!(" (exit code {c})")),
            report.detail
        ),
        CommandOutcome::Staged { results } => results
            .iter()
            .map(|(node, r)| {
                use crate::rollout::sequencer::StageResult;
                match r {
                    StageResult::Installed => format!("{node}: installed"),
                    StageResult::NoEffect => format!("{node}: no effect"),
                    StageResult::Transient { error } => format!("{node}: unknown ({error})"),
                    StageResult::Installing { error } => {
                        format!("{node}: an install is still running ({error})")
                    }
                    StageResult::Failed { error } => format!("{node}: failed ({error})"),
                }
            })
            .collect::<Vec<_>>()
            .join("; "),
        CommandOutcome::Drain { result } => match result {
            crate::rollout::ports::DrainOutcome::Drained { .. } => "drained".into(),
            crate::rollout::ports::DrainOutcome::Blocked { pdb, pod, .. } => {
                format!("blocked: pod {pod} (PodDisruptionBudget {pdb})")
            }
        },
    }
}

/// A job's journal read once: the newest entries (oldest first, at most [`TIMELINE_ENTRIES`])
/// for the timeline, and every entry folded into the pictures' [`charts::Timings`].
pub fn journal_tail(
    store: &dyn crate::store::Store,
    job: &Job,
) -> Result<(Vec<JournalEntry>, charts::Timings), crate::store::StoreError> {
    use crate::store::StoreExt;
    let all: Vec<JournalEntry> = store
        .scan_records::<JournalEntry>(&crate::rollout::journal::entries_prefix(&job.id))?
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    let timings = charts::Timings::of(&all);
    let skip = all.len().saturating_sub(TIMELINE_ENTRIES);
    Ok((all.into_iter().skip(skip).collect(), timings))
}

/// The job that continued a halted `job` (none while it has not halted): the oldest newer job of its cluster whose plan was
/// made after this halt (its basis names this job as the cluster's halted one; issue #52).
pub fn continued_by(ui: &Ui, job: &Job) -> Option<Job> {
    if !matches!(job.state, JobState::Halted { .. }) {
        return None;
    }
    let store = ui.shared.store.as_ref();
    let jobs = crate::server::rollouts::jobs(&ui.shared).ok()?;
    jobs.into_iter()
        .rev()
        .filter(|j| j.cluster == job.cluster && j.created_at > job.created_at)
        .find(|j| {
            crate::ops::replan::load_plan(store, &j.plan)
                .ok()
                .flatten()
                .is_some_and(|p| p.basis.halted.get(&job.cluster) == Some(&job.id.to_string()))
        })
}

fn load_job(ui: &Ui, job: &str) -> Result<Option<Job>, crate::store::StoreError> {
    match crate::rollout::sequencer::JobId::parse(job) {
        Some(id) => crate::ops::jobs::load_job(ui.shared.store.as_ref(), &id),
        None => Ok(None),
    }
}

/// The job named in the path, or the page that says why there is none.
fn job_or_page(ui: &Ui, s: &View, job: &str) -> Result<Job, Response> {
    match load_job(ui, job) {
        Ok(Some(j)) => Ok(j),
        Ok(None) => Err(message(
            StatusCode::NOT_FOUND,
            "No such job",
            &format!("There is no rollout job `{job}`."),
            Some(s),
        )),
        Err(e) => Err(internal(s, "the job", crate::error_chain(&e))),
    }
}

pub async fn rollout(
    State(ui): State<Ui>,
    Path(job): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(s) = ui.sessions.get(&headers) else {
        return to_login();
    };
    let job = match job_or_page(&ui, &s, &job) {
        Ok(j) => j,
        Err(page) => return page,
    };
    let (entries, timings) = match journal_tail(ui.shared.store.as_ref(), &job) {
        Ok(e) => e,
        Err(e) => return internal(&s, "the journal", crate::error_chain(&e)),
    };
    let last = entries.last().map_or(0, |e| e.seq);
    let now = Timestamp::now();
    let continued = continued_by(&ui, &job);
    let body = html! {
        h1 { "Rollout " (job.id) }
        dl.facts {
            dt { "cluster" } dd { (job.cluster) }
            dt { "plan" } dd { code { (job.plan.short()) } }
            dt { "created" } dd { (ts(job.created_at)) }
        }
        @if !job.state.is_terminal() {
            p { a.button.danger href={ "/rollouts/" (job.id) "/halt" } { "Halt rollout…" } }
        }
        section #live data-events={ "/rollouts/" (job.id) "/events?after=" (last) } {
            (live_section(&job, &timings, &ui.shared.waits, continued.as_ref(), now))
        }
        p #live-note .hint {}
        details.journal {
            summary { "Journal" @if entries.len() == TIMELINE_ENTRIES { " (the newest " (TIMELINE_ENTRIES) " entries)" } }
            ol #timeline.timeline { @for e in &entries { (timeline_entry(e)) } }
        }
    };
    respond(
        StatusCode::OK,
        page(&format!("rollout {}", job.id), Some(&s), body),
    )
}

pub async fn halt_confirm(
    State(ui): State<Ui>,
    Path(job): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(s) = ui.sessions.get(&headers) else {
        return to_login();
    };
    let job = match job_or_page(&ui, &s, &job) {
        Ok(j) => j,
        Err(page) => return page,
    };
    if job.state.is_terminal() {
        return message(
            StatusCode::CONFLICT,
            "Already finished",
            &format!(
                "Rollout {} has already finished; there is nothing to halt.",
                job.id
            ),
            Some(&s),
        );
    }
    let body = html! {
        h1 { "Halt rollout " (job.id) "?" }
        p { "The job stops at the next safe point and never continues by itself: continuing needs a new plan and a new approval. A node in the middle of its upgrade is left where it is." }
        form.halt method="post" action={ "/rollouts/" (job.id) "/halt" } {
            input type="hidden" name="csrf" value=(s.csrf);
            label for="reason" { "Reason (shown in the job and the logs)" }
            input #reason type="text" name="reason" maxlength="500" placeholder="halted from the web dashboard";
            button.danger #confirm-halt type="submit" { "Halt rollout " (job.id) }
            " " a href={ "/rollouts/" (job.id) } { "Cancel" }
        }
    };
    respond(StatusCode::OK, page("halt", Some(&s), body))
}

// ---------------------------------------------------------------------------------------------
// Rollouts

/// Every job, newest first: state, progress, where it is (or why it halted), start, duration.
pub async fn rollouts(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    let Some(s) = ui.sessions.get(&headers) else {
        return to_login();
    };
    let jobs = match crate::server::rollouts::jobs(&ui.shared) {
        Ok(j) => j,
        Err(e) => return internal(&s, "the jobs", crate::error_chain(&e)),
    };
    let now = Timestamp::now();
    let body = html! {
        h1 { "Rollouts" }
        @if jobs.is_empty() {
            p { "No rollout jobs yet: a job starts when a plan has its approvals (see " a href="/plan" { "Plan" } ")." }
        } @else {
            table #rollouts.rollouts {
                thead { tr { th { "job" } th { "cluster" } th { "state" } th { "progress" } th { "where it is" } th { "started" } th { "duration" } } }
                tbody {
                    @for j in &jobs {
                        @let (state, _) = job_state(j);
                        @let (done, total) = done_of(j);
                        tr data-job=(j.id) {
                            td { a href={ "/rollouts/" (j.id) } { (j.id) } }
                            td { (j.cluster) }
                            td { span.badge.(state) { (state) } }
                            td.progress { (charts::mini_bar(done, total, &j.state)) " " (done) "/" (total) " " (crate::rollout::sequencer::NODE_UPGRADES) }
                            td.(if matches!(j.state, JobState::Halted { .. }) { "error" } else { "" }) { (job_line(j, &ui.shared.waits, now)) }
                            td { (ts(j.created_at)) }
                            td { (elapsed(end_of(j, now).as_second() - j.created_at.as_second())) @if !j.state.is_terminal() { " so far" } }
                        }
                    }
                }
            }
        }
    };
    respond(StatusCode::OK, page("rollouts", Some(&s), body))
}

// ---------------------------------------------------------------------------------------------
// History

#[derive(Debug, Default, serde::Deserialize)]
pub struct MachineFilter {
    #[serde(default)]
    cluster: String,
    #[serde(default)]
    pool: String,
    #[serde(default)]
    version: String,
    /// `yes`, `no` or empty.
    #[serde(default)]
    ready: String,
    #[serde(default)]
    cordoned: String,
}

impl MachineFilter {
    fn keeps(&self, m: &pb::Machine) -> bool {
        let flag = |want: &str, have: bool| match want {
            "yes" => have,
            "no" => !have,
            _ => true,
        };
        (self.cluster.is_empty() || m.cluster == self.cluster)
            && (self.pool.is_empty() || m.pool == self.pool)
            && (self.version.is_empty()
                || m.talos_version == self.version
                || m.kubelet_version == self.version)
            && flag(&self.ready, m.ready)
            && flag(&self.cordoned, m.cordoned)
    }
}

fn select(name: &str, current: &str, options: &[String]) -> Markup {
    html! {
        select #(name) name=(name) {
            option value="" selected[current.is_empty()] { "any" }
            @for o in options { option value=(o) selected[current == o] { (o) } }
        }
    }
}

pub async fn history(
    State(ui): State<Ui>,
    Query(f): Query<MachineFilter>,
    headers: HeaderMap,
) -> Response {
    let Some(s) = ui.sessions.get(&headers) else {
        return to_login();
    };
    let jobs = match crate::server::rollouts::jobs(&ui.shared) {
        Ok(j) => j,
        Err(e) => return internal(&s, "the jobs", crate::error_chain(&e)),
    };
    let machines = match ui
        .api()
        .list_machines(Request::new(pb::ListMachinesRequest {
            cluster: String::new(),
        }))
        .await
    {
        Ok(r) => r.into_inner().into_machines(),
        Err(e) => return internal(&s, "the machines", e.message()),
    };
    let distinct = |f: &dyn Fn(&pb::Machine) -> Vec<String>| {
        let mut v: Vec<String> = machines
            .iter()
            .flat_map(f)
            .filter(|x| !x.is_empty())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let clusters = distinct(&|m| vec![m.cluster.clone()]);
    let pools = distinct(&|m| vec![m.pool.clone()]);
    let versions = distinct(&|m| vec![m.talos_version.clone(), m.kubelet_version.clone()]);
    let yn = vec!["yes".to_string(), "no".to_string()];
    let shown: Vec<&pb::Machine> = machines.iter().filter(|m| f.keeps(m)).collect();
    let now = Timestamp::now();
    let body = html! {
        h1 { "History" }
        h2 { "Rollout jobs" }
        table {
            thead { tr { th { "job" } th { "cluster" } th { "outcome" } th { "started" } th { "duration" } th { "halt reason" } } }
            tbody {
                @for j in &jobs {
                    @let (state, reason) = job_state(j);
                    @let end = match &j.state { JobState::Halted { at, .. } | JobState::Succeeded { at } => *at, JobState::Running => now };
                    tr {
                        td { a href={ "/rollouts/" (j.id) } { (j.id) } }
                        td { (j.cluster) }
                        td { span.badge.(state) { (state) } }
                        td { (ts(j.created_at)) }
                        td { (elapsed(end.as_second() - j.created_at.as_second())) @if !j.state.is_terminal() { " so far" } }
                        td { (reason.unwrap_or("")) }
                    }
                }
            }
        }
        @if jobs.is_empty() { p { "No rollout jobs yet." } }
        h2 { "Machines" }
        form.filters method="get" action="/history" {
            label { "cluster " (select("cluster", &f.cluster, &clusters)) }
            label { "pool " (select("pool", &f.pool, &pools)) }
            label { "version " (select("version", &f.version, &versions)) }
            label { "Ready " (select("ready", &f.ready, &yn)) }
            label { "cordoned " (select("cordoned", &f.cordoned, &yn)) }
            button type="submit" { "Filter" }
        }
        p.hint { (shown.len()) " of " (machines.len()) " machines" }
        table #machines {
            thead { tr { th { "cluster" } th { "pool" } th { "node" } th { "role" } th { "Talos" } th { "kubelet" } th { "Ready" } th { "cordoned" } } }
            tbody {
                @for m in &shown {
                    tr {
                        td { (m.cluster) } td { (m.pool) } td { (m.node) } td { (m.role) }
                        td { (m.talos_version) } td { (m.kubelet_version) }
                        td.(if m.ready { "ok" } else { "bad" }) { (yes_no(m.ready)) }
                        td { (yes_no(m.cordoned)) }
                    }
                }
            }
        }
    };
    respond(StatusCode::OK, page("history", Some(&s), body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_reads_like_a_clock() {
        assert_eq!(elapsed(0), "0s");
        assert_eq!(elapsed(65), "1m05s");
        assert_eq!(elapsed(3725), "1h02m");
        assert_eq!(elapsed(-5), "0s");
    }

    #[test]
    fn diff_lines_are_coloured() {
        assert_eq!(line_class("    -    version: v1.34.1"), "del");
        assert_eq!(line_class("    +    version: v1.35.0"), "add");
        assert_eq!(line_class("    +++ b/home/cluster.yaml (desired)"), "meta");
        assert_eq!(line_class("  ~ pool workers: talos"), "chg");
        assert_eq!(line_class("cluster home"), "");
    }

    #[test]
    fn a_jobs_summary_says_where_it_is_or_why_it_halted() {
        use super::charts::tests::{at, set, talos_job};
        use crate::rollout::sequencer::{HaltCode, HaltReason, NodePhase};
        use std::sync::Arc;
        let mut job = talos_job();
        job.steps[0].state = StepState::Running;
        set(&mut job, 0, NodePhase::Done, 60);
        set(&mut job, 1, NodePhase::Drained, 90);
        if let StepKind::Talos(t) = &mut job.steps[0].kind {
            Arc::make_mut(&mut t.nodes[1]).blocked =
                Some("pod web-0 (PodDisruptionBudget web)".into());
        }
        assert_eq!(
            job_summary(&job, at(125)),
            "step 1/1: pool workers → Talos v1.13.9, 1/3 nodes back; w-2 draining 35s; \
             w-2 drain blocked: pod web-0 (PodDisruptionBudget web)"
        );
        assert_eq!(done_of(&job), (1, 3));
        // What the executor said it waits for comes after, with how long it has waited; an
        // acting job (its next intent) drops it.
        let waits = crate::server::rollouts::Waits::default();
        let event = |state| crate::rollout::executor::RolloutEvent {
            job: job.id.clone(),
            cluster: job.cluster.clone(),
            step: Some(0),
            pool: None,
            node: None,
            op: None,
            state,
            steps: 1,
            image: None,
        };
        use crate::rollout::executor::EventState;
        waits.observe(
            &event(EventState::Waiting {
                reason: "outside the maintenance windows; the next opens at 2026-12-06T02:00:00Z"
                    .into(),
                detail: None,
            }),
            at(100),
        );
        assert!(
            job_line(&job, &waits, at(125)).ends_with(
                "; waiting: outside the maintenance windows; the next opens at 2026-12-06T02:00:00Z (for 25s)"
            ),
            "{}",
            job_line(&job, &waits, at(125))
        );
        waits.observe(&event(EventState::Intended { attempt: 1 }), at(130));
        assert_eq!(job_line(&job, &waits, at(131)), job_summary(&job, at(131)));
        job.state = JobState::Halted {
            reason: HaltReason::new(HaltCode::DrainBlocked, "the drain of w-2 was refused"),
            step: Some(0),
            node: Some("w-2".into()),
            op: None,
            at: at(700),
        };
        assert_eq!(job_summary(&job, at(900)), "the drain of w-2 was refused");
        job.state = JobState::Succeeded { at: at(125) };
        assert_eq!(job_summary(&job, at(900)), "finished in 2m05s");
    }

    #[tokio::test]
    async fn values_are_escaped() {
        let m = message(StatusCode::OK, "<b>", "<script>alert(1)</script>", None);
        let body = axum::body::to_bytes(m.into_body(), 1 << 20).await.unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(!text.contains("<script>alert"), "{text}");
        assert!(
            text.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{text}"
        );
    }
}
